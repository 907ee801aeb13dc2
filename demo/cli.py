"""`crossover demo`: the whole stack on one machine, from one command.

Starts, each on a loopback port, the simulated fleet of a spec (unless its instances are real
servers), the exporter, Prometheus with the generated scrape config and rules, Alertmanager with
a webhook that prints alerts, and the Streamlit app; runs a sweep, prints the URLs and where the
results are, and keeps everything up until Ctrl-C. `--headless` runs only the fleet and the sweep,
prints the per-level table and the crossover sentence, and exits: the same job for a terminal or CI.

Every part is started through its own `crossover` subcommand as a child process (one process
group each, see demo/procs.py), so the demo depends on the parts' command lines, not their insides;
a binary missing from this machine (Prometheus, Alertmanager) is skipped with a note. The Prometheus
config and rules are what `crossover rules` writes, generated in process with the demo's ports.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from crossover.demo.procs import Supervisor, crossover_command, http_ok, tail, terminate_as_interrupt
from crossover.errors import UserError
from crossover.loadgen.plan import LengthDist, parse_levels
from crossover.netutil import free_port, port_free, spec_on_free_ports
from crossover.outdir import write_into
from crossover.rules.alertmanager import alertmanager_config
from crossover.rules.generate import SCRAPE_FILE, Format, outputs
from crossover.rules.model import build_rules
from crossover.rules.prom import alertmanager_binary, prometheus_binary
from crossover.rules.render import scrape_config_yaml
from crossover.spec import FleetSpec, load_spec
from crossover.starter import DEFAULT_EXAMPLE, example_spec

# Doubling levels bracket the crossover wherever it falls (the seed's is ~6 at these lengths), and 8
# rounds per level keep a busy laptop's hiccups from flipping a level; about two minutes in all.
DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64"
DEFAULT_ROUNDS = 8.0
# Preferred ports for the UIs (the usual ones, so bookmarks work); a free port when taken.
PREFERRED_PORTS = {"exporter": 9400, "prometheus": 9090, "alertmanager": 9093, "app": 8501}
READY_TIMEOUT_S = 60.0
ALERTS_LOG = "alerts.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", default=None,
                        help=f"fleet spec (default: the shipped example {DEFAULT_EXAMPLE}, TP=4x1 vs TP=2x2; "
                        "`crossover init` writes it to a file to edit)")
    parser.add_argument("--headless", action="store_true",
                        help="only the fleet and the sweep: print the table and the crossover, then exit")
    fleet = parser.add_mutually_exclusive_group()
    fleet.add_argument("--no-sim", dest="simulate", action="store_false", default=None,
                       help="the spec's instances are real servers already running: do not simulate")
    fleet.add_argument("--sim", dest="simulate", action="store_true",
                       help="always simulate the fleet, on free loopback ports")
    parser.add_argument("--out", default=None,
                        help="results folder (default results/demo-<UTC time>)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", default=None,
                      help=f"closed-loop sweep levels (default {DEFAULT_CONCURRENCY})")
    load.add_argument("--rate", default=None,
                      help="open-loop sweep levels in requests/s instead, e.g. 0.4,1,2 (the P/D seed's way)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per level (instead of --rounds)")
    parser.add_argument("--rounds", type=float, default=DEFAULT_ROUNDS,
                        help=f"closed loop: rounds x concurrency requests per level ({DEFAULT_ROUNDS:g})")
    parser.add_argument("--input-len", default=None, help="prompt tokens (the sweep's forms and default)")
    parser.add_argument("--output-len", default=None, help="output tokens (the sweep's forms and default)")
    parser.add_argument("--free-ports", action="store_true",
                        help="pick free ports for the UIs instead of the usual 9400, 9090, 9093, 8501")
    parser.add_argument("--no-app", action="store_true", help="do not start the Streamlit app")
    parser.add_argument("--no-prometheus", action="store_true",
                        help="do not start Prometheus and Alertmanager even when installed")
    parser.add_argument("--no-sweep", action="store_true",
                        help="start the stack and wait, without a sweep (use the app to run one)")


# ---- planning: plain decisions from the arguments and the machine ------------------------------


def pick_port(name: str, usual: bool = True) -> int:
    preferred = PREFERRED_PORTS.get(name) if usual else None
    return preferred if preferred is not None and port_free(preferred) else free_port()


def default_out_dir() -> Path:
    return Path("results") / f"demo-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def prepare_out(out: Path) -> Path:
    """The results folder, created; a file in its place or no permission is the user's mistake."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out: cannot create {out}: {exc.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"--out: cannot write into {out}: permission denied")
    return out.resolve()


def instance_urls(spec: FleetSpec) -> list[tuple[str, str]]:
    return [(i.name, i.url) for t in spec.topologies for i in t.instances]


def decide_simulation(spec: FleetSpec, simulate: bool | None) -> bool:
    """--sim / --no-sim win; otherwise simulate unless every instance of the spec already answers.

    A spec whose instances all answer /health is a real fleet (say cpu-real-vllm.yaml with its
    servers up), so it is used as it is. Some answering and some not is ambiguous: say so.
    """
    if simulate is not None:
        return simulate
    answering = [name for name, url in instance_urls(spec) if http_ok(url + "/health", timeout=3.0)]
    if not answering:
        return True
    silent = [name for name, _ in instance_urls(spec) if name not in answering]
    if silent:
        raise UserError(f"instances {answering} answer but {silent} do not: start them and pass --no-sim, "
                        "or pass --sim to simulate the whole fleet on free ports")
    return False


def check_real_fleet(spec: FleetSpec) -> None:
    silent = [f"{name} ({url})" for name, url in instance_urls(spec) if not http_ok(url + "/health", 5.0)]
    if silent:
        raise UserError(f"--no-sim: no answer at /health from {', '.join(silent)}; start the servers "
                        "first, or drop --no-sim to simulate the fleet")


def write_spec(spec: FleetSpec, path: Path) -> Path:
    """The spec the children read: the user's spec with the ports the demo chose."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    load_spec(path)  # what is written must read back, or every child would fail later
    return path


def sweep_levels(args: argparse.Namespace) -> tuple[str, str]:
    """(sweep flag, levels) from --rate or --concurrency, refused before anything starts if bad
    (the sweep would refuse them too, but only after the fleet is up)."""
    option, text = ("--rate", args.rate) if args.rate else ("--concurrency", args.concurrency or
                                                           DEFAULT_CONCURRENCY)
    parse_levels(text, option)
    return option, text


def check_lengths(args: argparse.Namespace) -> None:
    """--input-len / --output-len refused before the fleet starts, in the sweep's own words."""
    for option, text in (("--input-len", args.input_len), ("--output-len", args.output_len)):
        if text is not None:
            LengthDist.parse(text, option)  # its UserError names the option


def sweep_command(args: argparse.Namespace, spec_path: Path, out: Path, headless: bool) -> list[str]:
    option, levels = sweep_levels(args)
    command = crossover_command("sweep", str(spec_path), option, levels, "--out", str(out))
    if args.requests is not None:
        command += ["--requests", str(args.requests)]
    if option == "--concurrency" and args.requests is None:
        command += ["--rounds", f"{args.rounds:g}"]
    if args.input_len is not None:
        command += ["--input-len", args.input_len]
    if args.output_len is not None:
        command += ["--output-len", args.output_len]
    if headless:
        command.append("--no-progress")
    return command


def sim_command(spec_path: Path) -> list[str]:
    return crossover_command("sim", str(spec_path))


def pdproxy_command(spec_path: Path, topology: str) -> list[str]:
    return crossover_command("pdproxy", str(spec_path), "--topology", topology)


def exporter_command(spec_path: Path, port: int) -> list[str]:
    return crossover_command("exporter", str(spec_path), "--port", str(port), "--bind", "127.0.0.1")


def app_command(spec_path: Path, port: int, results: Path, exporter: str | None,
                prometheus: str | None, follow: Path | None = None) -> list[str]:
    command = crossover_command("app", str(spec_path), "--port", str(port), "--address", "127.0.0.1",
                                "--results", str(results))
    command += ["--exporter", exporter] if exporter else []
    command += ["--follow", str(follow)] if follow else []
    return command + (["--prometheus", prometheus] if prometheus else [])


def tcp_open(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=1.0):
            return True
    except OSError:
        return False


# ---- running ---------------------------------------------------------------------------------


@dataclass
class Stack:
    """What is up and where; printed for the user at start and used to wire parts together."""

    out: Path
    spec_path: Path
    simulated: bool
    usual_ports: bool = True
    urls: dict[str, str] = field(default_factory=dict)  # part -> base URL, as other parts are given it
    rules_dir: Path | None = None  # where the rules Prometheus loads were written
    notes: list[str] = field(default_factory=list)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def start_fleet(sup: Supervisor, stack: Stack, spec: FleetSpec) -> None:
    if not stack.simulated:
        check_real_fleet(spec)
        stack.notes.append("fleet: real servers, not simulated")
        start_entrypoints(sup, stack, spec)
        return
    child = sup.start("sim", sim_command(stack.spec_path))
    urls = [url for _, url in instance_urls(spec)]
    entrypoints = [t.entrypoint.url for t in spec.topologies if t.entrypoint.url]
    sup.wait_ready(child, lambda: all(http_ok(u + "/health", 1.0) for u in urls)
                   and all(tcp_open(u) for u in entrypoints), READY_TIMEOUT_S)


def start_entrypoints(sup: Supervisor, stack: Stack, spec: FleetSpec) -> None:
    """A real fleet's entrypoint that nothing serves yet gets `crossover pdproxy` (the simulator
    serves its own); one that answers is the user's and is left alone."""
    for topology in spec.topologies:
        url = topology.entrypoint.url
        if url is None or tcp_open(url):
            continue
        child = sup.start(f"pdproxy-{topology.name}", pdproxy_command(stack.spec_path, topology.name))
        sup.wait_ready(child, functools.partial(tcp_open, url), READY_TIMEOUT_S)
        stack.urls[f"entrypoint {topology.name}"] = url


def start_exporter(sup: Supervisor, stack: Stack) -> None:
    port = pick_port("exporter", stack.usual_ports)
    child = sup.start("exporter", exporter_command(stack.spec_path, port))
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, lambda: http_ok(url + "/metrics"), READY_TIMEOUT_S)
    stack.urls["exporter"] = url


def write_prometheus_config(stack: Stack, spec: FleetSpec, alertmanager: str | None) -> Path:
    """What `crossover rules --exporter-target --alertmanager` writes, into OUT/rules; returns the
    prometheus.yml. A spec the rules refuse is still scraped, without rules."""
    exporter = urlsplit(stack.urls["exporter"]).netloc if "exporter" in stack.urls else None
    out = stack.out / "rules"
    source = str(stack.spec_path)
    try:
        rules = build_rules(spec, source=source)
    except UserError as exc:
        stack.notes.append(f"rules: {exc}; Prometheus scrapes without rules")
        files = {SCRAPE_FILE: scrape_config_yaml(spec, source, [], exporter, alertmanager)}
    else:
        stack.rules_dir = out
        stack.notes.extend(f"rules: {warning}" for warning in rules.warnings)
        files = outputs(spec, rules, Format.PLAIN, source, stack.spec_path.stem, exporter, alertmanager)
    write_into(out, files)
    return out / SCRAPE_FILE


def start_alerting(sup: Supervisor, stack: Stack) -> str | None:
    """Alertmanager with the webhook receiver; returns Alertmanager's host:port, or None."""
    try:
        binary = alertmanager_binary()
    except UserError as exc:
        stack.notes.append(f"alertmanager: {exc}, skipped")
        return None
    hook_port = free_port()
    alerts_log = stack.out / ALERTS_LOG
    hook = sup.start("alert-webhook", [sys.executable, "-m", "crossover.demo.webhook", "--port",
                                       str(hook_port), "--log", str(alerts_log)])
    sup.wait_ready(hook, lambda: http_ok(f"http://127.0.0.1:{hook_port}/health"), READY_TIMEOUT_S)
    folder = stack.out / "alertmanager"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "alertmanager.yml"
    config.write_text(yaml.safe_dump(alertmanager_config(f"http://127.0.0.1:{hook_port}/alerts"),
                                     sort_keys=False))
    port = pick_port("alertmanager", stack.usual_ports)
    # No cluster: its gossip port would listen on every interface and collide between demos.
    child = sup.start("alertmanager", [binary, f"--config.file={config}", f"--storage.path={folder / 'data'}",
                                       f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="])
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, lambda: http_ok(url + "/-/ready"), READY_TIMEOUT_S)
    stack.urls["alertmanager"] = url
    return f"127.0.0.1:{port}"


def start_prometheus(sup: Supervisor, stack: Stack, spec: FleetSpec) -> None:
    try:
        binary = prometheus_binary()
    except UserError as exc:
        stack.notes.append(f"prometheus: {exc}, skipped")
        return
    alertmanager = start_alerting(sup, stack)
    config = write_prometheus_config(stack, spec, alertmanager)
    folder = stack.out / "prometheus"
    promtool = shutil.which("promtool")
    if promtool:
        check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True,
                               timeout=60, stdin=subprocess.DEVNULL)
        if check.returncode != 0:
            raise UserError(f"promtool rejects the demo's {config}: {check.stdout.strip()[-300:]} "
                            f"{check.stderr.strip()[-300:]}")
    port = pick_port("prometheus", stack.usual_ports)
    child = sup.start("prometheus", [binary, f"--config.file={config}",
                                     f"--storage.tsdb.path={folder / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{port}"])
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, lambda: http_ok(url + "/-/ready"), READY_TIMEOUT_S)
    stack.urls["prometheus"] = url


def start_app(sup: Supervisor, stack: Stack, follow: Path | None) -> None:
    port = pick_port("app", stack.usual_ports)
    exporter, prometheus = stack.urls.get("exporter"), stack.urls.get("prometheus")
    # The results folder is the demo's own: the app opens the demo's sweep (OUT/sweep) and redraws it
    # level by level (--follow), and writes the runs started from it beside it.
    child = sup.start("app", app_command(stack.spec_path, port, stack.out, exporter, prometheus, follow))
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, lambda: http_ok(url + "/_stcore/health"), 120.0)
    stack.urls["app"] = url


def shown_url(stack: Stack, name: str) -> str:
    """A part's URL as the user reads it: where to look, and where its output lands."""
    url = stack.urls[name]
    if name == "exporter":
        return url + "/metrics"
    if name == "alertmanager":
        return f"{url}  (alerts also land in {stack.out / ALERTS_LOG})"
    if name == "prometheus":
        return f"{url}  (rules from {stack.rules_dir})" if stack.rules_dir else f"{url}  (no rules)"
    return url


def print_stack(stack: Stack, spec: FleetSpec, spec_source: str) -> None:
    fleet = "simulated on loopback" if stack.simulated else "real servers"
    say(f"crossover demo: {spec_source} ({fleet}); results and logs in {stack.out}/")
    if stack.simulated:
        say(f"  {'simulator':<13}" + ", ".join(f"{name} {url}" for name, url in instance_urls(spec)))
    for name in stack.urls:
        say(f"  {name:<13}{shown_url(stack, name)}")
    for note in stack.notes:
        say(f"  note: {note}")


def run_sweep(sup: Supervisor, stack: Stack, args: argparse.Namespace) -> int:
    out = stack.out / "sweep"
    option, levels = sweep_levels(args)
    say(f"crossover demo: sweeping {option.removeprefix('--')} {levels}; results in {out}/")
    # Piped output (CI, a log file): give rich a width that fits the table instead of 80 columns.
    env = {} if sys.stdout.isatty() else {"COLUMNS": "160"}
    child = sup.start("sweep", sweep_command(args, stack.spec_path, out, args.headless), env=env,
                      passthrough=True, interrupt_first=True)
    code = child.process.wait()
    if code != 0:
        say(f"crossover demo: the sweep exited with status {code}; see above")
    return code


def wait_for_interrupt(sup: Supervisor) -> int:
    """Keep the stack up until Ctrl-C; a part that dies ends the demo with its log's last lines."""
    while True:
        crashed = [c for c in sup.crashed() if c.name != "sweep"]
        if crashed:
            child = crashed[0]
            say(f"crossover demo: {child.name} exited with status {child.process.returncode}; "
                f"its log {child.log_path} ends:\n{tail(child.log_path)}")
            return 1
        time.sleep(1.0)


def run(args: argparse.Namespace) -> int:
    if args.spec:
        if not Path(args.spec).exists():
            raise UserError(f"--spec: {args.spec} does not exist")
        spec, spec_source = load_spec(args.spec), args.spec
    else:
        spec, spec_source = example_spec(), f"the example {DEFAULT_EXAMPLE}"
    if args.requests is not None and args.requests < 1:
        raise UserError(f"--requests: must be at least 1, got {args.requests}")
    if not args.rounds > 0:
        raise UserError(f"--rounds: must be positive, got {args.rounds:g}")
    sweep_levels(args)
    check_lengths(args)
    simulated = decide_simulation(spec, args.simulate)
    if simulated:
        spec = spec_on_free_ports(spec)
    out = prepare_out(Path(args.out) if args.out else default_out_dir())
    stack = Stack(out=out, spec_path=write_spec(spec, out / "spec.yaml"), simulated=simulated,
                  usual_ports=not args.free_ports)

    with terminate_as_interrupt(), Supervisor(stack.out / "logs") as sup:
        try:
            start_fleet(sup, stack, spec)
            if not args.headless:
                start_exporter(sup, stack)
                if args.no_prometheus:
                    stack.notes.append("prometheus and alertmanager: off (--no-prometheus)")
                else:
                    start_prometheus(sup, stack, spec)
                if args.no_app:
                    stack.notes.append("app: off (--no-app)")
                else:
                    start_app(sup, stack, None if args.no_sweep else stack.out / "sweep")
            print_stack(stack, spec, spec_source)
            code = 0 if args.no_sweep else run_sweep(sup, stack, args)
            summary = stack.out / "sweep" / "crossover.json"
            if summary.exists():
                say(f"crossover demo: crossover written to {summary}")
            if args.headless:
                return code
            if "app" in stack.urls and summary.exists():
                say(f"crossover demo: the app ({stack.urls['app']}) shows this sweep; start another from "
                    "its sidebar")
            say("crossover demo: everything keeps running; press Ctrl-C to stop it all")
            return wait_for_interrupt(sup)
        except KeyboardInterrupt:
            say("crossover demo: stopping everything...")
            sup.stop_all()
            say("crossover demo: stopped")
            return 130
