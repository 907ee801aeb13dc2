"""What `crossover app` hands to the page script: the spec and where results and server views live.

The CLI passes these as arguments after `streamlit run page.py --`; the page parses them with the
same parser, so the command line and the page can never disagree about a flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crossover.errors import UserError
from crossover.netutil import check_http_url

DEFAULT_PORT = 8501
DEFAULT_RESULTS = "results"


@dataclass(frozen=True)
class AppConfig:
    spec_path: Path
    results_dir: Path
    exporter_url: str | None = None
    prometheus_url: str | None = None
    follow: Path | None = None  # a sweep folder another process writes, shown as its levels finish


def check_url(value: str | None, flag: str) -> str | None:
    """A plain http(s)://host[:port] URL, or a one-line UserError naming the flag."""
    if value is None or not value.strip():
        return None
    try:
        return check_http_url(value)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


def add_page_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `crossover app` and the page script."""
    parser.add_argument("spec", help="fleet spec (YAML)")
    parser.add_argument("--results", default=DEFAULT_RESULTS,
                        help=f"folder of sweep runs; past ones can be opened (default {DEFAULT_RESULTS})")
    parser.add_argument("--exporter", default=None,
                        help="URL of `crossover exporter` for the server-side view (e.g. http://127.0.0.1:9400)")
    parser.add_argument("--prometheus", default=None,
                        help="URL of a Prometheus that scrapes the fleet, used for the server-side view")
    parser.add_argument("--follow", default=None, metavar="RUN_DIR",
                        help="open this sweep folder (one that `crossover sweep` or `crossover demo` is "
                        "writing) and redraw it as each level finishes")


def config_from_args(args: argparse.Namespace) -> AppConfig:
    return AppConfig(
        spec_path=Path(args.spec),
        results_dir=Path(args.results),
        exporter_url=check_url(args.exporter, "--exporter"),
        prometheus_url=check_url(args.prometheus, "--prometheus"),
        follow=Path(args.follow) if args.follow else None,
    )


class _RaisingParser(argparse.ArgumentParser):
    """argparse exits the process on a bad flag; inside Streamlit that would kill the server."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"app arguments: {message}")


def parse_page_args(argv: Sequence[str]) -> AppConfig:
    parser = _RaisingParser(prog="crossover app", add_help=False)
    add_page_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))
