"""An Alertmanager webhook receiver that prints each alert as one JSON line.

The example receiver of the demo and of the compose stack (`python -m crossover.demo.webhook`):
it shows what a page or ticket from the goodput burn-rate alerts carries, so that wiring it to a
real incident tool is a matter of changing one URL in alertmanager.yml.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from aiohttp import web


def alert_lines(notification: dict[str, Any]) -> list[str]:
    """One compact JSON line per alert of an Alertmanager webhook notification (version 4)."""
    lines = []
    for alert in notification.get("alerts", []):
        labels = alert.get("labels", {})
        lines.append(json.dumps({
            "status": alert.get("status", notification.get("status")),
            "alertname": labels.get("alertname"),
            "severity": labels.get("severity"),
            "labels": labels,
            "summary": alert.get("annotations", {}).get("summary"),
            "startsAt": alert.get("startsAt"),
        }, sort_keys=True))
    return lines


def make_app(log_path: Path | None) -> web.Application:
    async def alerts(request: web.Request) -> web.Response:
        try:
            notification = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.Response(status=400, text="want an Alertmanager webhook JSON body\n")
        if not isinstance(notification, dict):
            return web.Response(status=400, text="want a JSON object\n")
        lines = alert_lines(notification)
        for line in lines:
            print(line, flush=True)
        if log_path is not None and lines:
            with log_path.open("a") as out:
                out.write("".join(line + "\n" for line in lines))
        return web.Response(text="ok\n")

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_post("/alerts", alerts)
    app.router.add_get("/health", health)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crossover.demo.webhook",
                                     description="print Alertmanager notifications as JSON lines")
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9099)
    parser.add_argument("--log", type=Path, default=None, help="also append the lines to this file")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        print(f"webhook: --port must be between 1 and 65535, got {args.port}", file=sys.stderr)
        return 2
    def listening(*_args: object, **_kwargs: object) -> None:
        # run_app calls this once the socket listens: only then is the announcement true.
        print(f"alert webhook on http://{args.bind}:{args.port}/alerts", flush=True)

    try:
        web.run_app(make_app(args.log), host=args.bind, port=args.port, print=listening, handle_signals=True)
    except OSError as exc:
        print(f"webhook: cannot listen on {args.bind}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
