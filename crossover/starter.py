"""The example specs shipped in the package, and `crossover init [PATH] [--example NAME]`, which
writes one as a starter spec with comments.

The examples are compose/specs/*.yaml in the repository, installed as the package data
`crossover.examples`: read through importlib.resources, they are there in a wheel as in a checkout.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

from crossover.errors import UserError
from crossover.spec import FleetSpec, parse_spec

EXAMPLES_PACKAGE = "crossover.examples"
DEFAULT_EXAMPLE = "seed-70b-h100"
DEFAULT_PATH = "fleet.yaml"

# Printed above the example: what each part of a spec is for and what to run next.
GUIDE = """\
# A vllm-crossover fleet spec, written by `crossover init` from the example {name!r}.
# Every crossover command reads it; its parts:
#   model        the served model; its shape drives the simulator and the KV-cache figures
#   hardware     one GPU of the fleet (or one CPU core for a CPU fleet) and how they are linked
#   topologies   the layouts to compare on the same GPUs: each has its instances (name + URL of a
#                vLLM server, role colocated / prefill / decode) and where traffic enters
#                (balance: round_robin | least_outstanding over the instances, or url: a proxy)
#   slos         latency thresholds in ms (ttft_ms, tpot_ms, itl_ms, e2el_ms: any subset) and the
#                objective over the period: goodput is the share of requests within all of them
#   scrape       how often the exporter reads each instance's /metrics, and its windows
#   simulator    options of the embedded simulator only (ignored for a real fleet)
# Next: check it (validate), simulate the fleet and find its crossover (demo), generate Prometheus
# scrape config, recording rules and alerts (rules) and Grafana dashboards (dashboards):
#   crossover validate {path}
#   crossover demo --spec {path}
#   crossover rules {path} --out rules/
#   crossover dashboards {path} --out dashboards/
# Point the instance URLs at your vLLM servers to watch a real fleet: crossover exporter {path}

"""


def example_names() -> list[str]:
    """The shipped examples, by name (file name without .yaml)."""
    files = resources.files(EXAMPLES_PACKAGE).iterdir()
    return sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml"))


def example_text(name: str) -> str:
    if name not in example_names():
        raise UserError(f"--example: no example named {name!r} (have {', '.join(example_names())})")
    return (resources.files(EXAMPLES_PACKAGE) / f"{name}.yaml").read_text(encoding="utf-8")


def example_spec(name: str = DEFAULT_EXAMPLE) -> FleetSpec:
    """An example, loaded: what `crossover demo` runs when given no spec."""
    import yaml

    return parse_spec(yaml.safe_load(example_text(name)), f"example {name}")


def starter_text(name: str, path: str) -> str:
    return GUIDE.format(name=name, path=path) + example_text(name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", nargs="?", default=DEFAULT_PATH,
                        help=f"where to write the spec (default {DEFAULT_PATH})")
    parser.add_argument("--example", default=DEFAULT_EXAMPLE, metavar="NAME",
                        help=f"which example to start from (default {DEFAULT_EXAMPLE}, the seed's TP=4x1 vs "
                        "TP=2x2; pd-8k-prompts: colocated vs prefill/decode; cpu-real-vllm: real vLLM "
                        "CPU servers; `crossover init --list` shows all)")
    parser.add_argument("--list", action="store_true", help="list the examples and exit")
    parser.add_argument("--force", action="store_true", help="overwrite PATH if it exists")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name in example_names():
            print(name)
        return 0
    text = starter_text(args.example, args.path)
    path = Path(args.path)
    if path.is_dir():
        raise UserError(f"{path}: is a folder; give the spec's file name (for example {path / DEFAULT_PATH})")
    if path.exists() and not args.force:
        raise UserError(f"{path}: exists already; pass --force to overwrite it")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror})") from None
    print(f"wrote {path} (example {args.example}); next: crossover validate {path}")
    return 0
