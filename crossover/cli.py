"""The one `crossover` command; each subcommand lives in its own module and is imported lazily
so `crossover --help` and `crossover validate` stay fast and need none of the heavy libraries."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import typing
from collections.abc import Collection, Sequence

from crossover import __version__
from crossover.errors import UserError

# subcommand -> (module with add_arguments(parser) and run(args) -> int, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "init": ("crossover.starter", "write a starter fleet spec from a shipped example"),
    "validate": ("crossover.validate", "check a fleet spec and print its topologies"),
    "sim": ("crossover.sim.cli", "serve a simulated vLLM fleet from a spec"),
    "exporter": ("crossover.exporter.cli", "scrape the fleet and serve per-topology goodput"),
    "sweep": ("crossover.loadgen.cli", "drive synthetic traffic and find the crossover"),
    "analyze": ("crossover.loadgen.analysis.analyze",
                "find the crossover in vllm bench, GuideLLM, AIPerf or inference-perf results"),
    "rules": ("crossover.rules.cli", "generate Prometheus scrape config, recording rules and alerts"),
    "dashboards": ("crossover.dashboards.cli", "generate Grafana dashboards"),
    "capacity": ("crossover.capacity.cli", "rank every layout a GPU budget allows by goodput per GPU"),
    "app": ("crossover.app.cli", "start the Streamlit app"),
    "pdproxy": ("crossover.pdproxy.cli", "serve a topology's P/D entrypoint in front of vLLM servers"),
    "demo": ("crossover.demo.cli", "run the whole stack on the simulator"),
}


class OneLineErrorParser(argparse.ArgumentParser):
    """A usage mistake is one line naming the command and the problem, as every other bad input is;
    the usage block stays behind --help (a subcommand's can run to a dozen lines)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; `commands` limits which subcommands' modules are imported (None: all).

    The others still appear in --help (from SUBCOMMANDS) but take no arguments: main() imports
    only the module of the command being run, so `--help` and `validate` skip numpy and aiohttp.
    """
    parser = OneLineErrorParser(
        prog="crossover",
        description="Find where one vLLM topology overtakes another on goodput: simulate, scrape, "
        "sweep, alert and chart a fleet described by one spec file.",
    )
    parser.add_argument("--version", action="version", version=f"crossover {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        subparser.set_defaults(_parser=subparser)
        if commands is not None and name not in commands:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            subparser.set_defaults(_missing=module_name)
            continue
        module.add_arguments(subparser)
        subparser.set_defaults(_run=module.run)
    return parser


def console_main() -> int:
    """Entry point of the `crossover` script and `python -m crossover`."""
    # A closed pipe (`crossover ... | head`) is not an error worth a traceback. Only a whole
    # process may choose that: main() also runs inside test processes, which must not die of it.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()


def requested_command(argv: Sequence[str]) -> list[str]:
    """The subcommand named on the command line, if any (the top level has no option taking a value)."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return [first] if first in SUBCOMMANDS else []


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(requested_command(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse would blame the top-level parser and print its usage; the subcommand's is the one
        # that lists the options the user meant.
        subparser = getattr(args, "_parser", parser)
        subparser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"crossover {args.command}: not available in this build", file=sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        print(f"crossover {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"crossover {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(console_main())
