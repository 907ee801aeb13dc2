"""`crossover app SPEC`: check the arguments, then run `streamlit run` on the page script.

The spec is validated here first so that a bad spec is one line on the terminal (exit 2) rather
than a page that cannot start; the page re-reads it and shows any later problem with st.error.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from crossover.app.config import DEFAULT_PORT, add_page_arguments, config_from_args
from crossover.errors import UserError
from crossover.spec import load_spec

PAGE_SCRIPT = Path(__file__).resolve().parent / "page.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_page_arguments(parser)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})")
    parser.add_argument("--address", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1, loopback only)")


def streamlit_command(args: argparse.Namespace) -> list[str]:
    """The `streamlit run` command line, with the page's own arguments after `--`."""
    page_args = [str(Path(args.spec).resolve()), "--results", str(Path(args.results).resolve())]
    if args.exporter:
        page_args += ["--exporter", args.exporter]
    if args.prometheus:
        page_args += ["--prometheus", args.prometheus]
    if args.follow:
        page_args += ["--follow", str(Path(args.follow).resolve())]
    return [
        sys.executable, "-m", "streamlit", "run", str(PAGE_SCRIPT),
        "--server.port", str(args.port),
        "--server.address", args.address,
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
        "--client.toolbarMode", "minimal",
        "--", *page_args,
    ]


def check_port_free(address: str, port: int) -> None:
    """A UserError when the page could not listen there: Streamlit itself would only log
    "Port N is not available" with a timestamp and exit 1."""
    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            probe.bind((address, port))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UserError(f"--address {address} --port {port}: cannot listen there ({reason})") from None


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UserError(f"--port: must be between 1 and 65535, got {args.port}")
    config = config_from_args(args)
    load_spec(config.spec_path)
    try:
        config.results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--results {config.results_dir}: cannot create the folder "
                        f"({exc.strerror or exc})") from None
    check_port_free(args.address, args.port)
    print(f"crossover app: http://{args.address}:{args.port}  (spec {config.spec_path}, "
          f"results in {config.results_dir})", file=sys.stderr, flush=True)
    os.environ["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    command = streamlit_command(args)
    sys.stdout.flush()
    sys.stderr.flush()
    # Become the Streamlit server rather than wait on it: Ctrl-C and SIGTERM then reach the server
    # itself and no orphan is left behind when whoever started `crossover app` stops it.
    os.execv(command[0], command)
    return 0  # not reached
