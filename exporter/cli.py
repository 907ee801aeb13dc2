"""`crossover exporter SPEC`: scrape the fleet and serve per-topology goodput on /metrics."""

from __future__ import annotations

import argparse
import asyncio
import logging

from crossover.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="fleet spec (YAML)")
    parser.add_argument("--port", type=int, default=9400, help="port to serve /metrics on (default 9400)")
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--file-sd", action="append", default=[], metavar="PATH",
                        help="Prometheus file_sd JSON with more targets (labels topology, role, instance); "
                        "re-read when it changes; may be given several times")
    parser.add_argument("--prometheus-sd", metavar="URL",
                        help="take the spec's Kubernetes pods from this Prometheus's target discovery "
                        "(/api/v1/targets, re-read every 15 s); default the spec's kubernetes.prometheus_url")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    from crossover.eventloop import loop_factory
    from crossover.exporter.service import Exporter, serve, tune_gc
    from crossover.spec import load_spec

    if not 0 < args.port < 65536:
        raise UserError(f"--port must be 1-65535, got {args.port}")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from crossover.netutil import check_http_url

    if args.prometheus_sd is not None:
        try:
            args.prometheus_sd = check_http_url(args.prometheus_sd)
        except ValueError as exc:
            raise UserError(f"--prometheus-sd: {exc}") from None
    spec = load_spec(args.spec)
    exporter = Exporter(spec, spec_path=args.spec, file_sd_paths=args.file_sd,
                        prometheus_sd_url=args.prometheus_sd)
    tune_gc()

    async def main() -> None:
        await serve(exporter, args.bind, args.port, asyncio.Event())

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main())
    return 0
