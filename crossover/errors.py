"""Errors meant for the user: the CLI prints their one-line message and exits 2, no traceback."""


class UserError(Exception):
    """A mistake in what the user gave (a file, a flag, a URL); the message is one line."""

    exit_code = 2
