"""The demo's Prometheus and Alertmanager configuration, built from what `crossover rules` generated.

Plain data in and out: the generated files are read as YAML, the demo's own addresses (free
loopback ports) are filled in, and the result is a dict the demo writes as prometheus.yml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from crossover.spec import FleetSpec

EXPORTER_JOB = "crossover-exporter"


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def find_generated(rules_dir: Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """Scrape configs and rule files among the files `crossover rules` wrote.

    Classified by content, not by name, so a renamed file still lands in the right place:
    a file with `scrape_configs` contributes its jobs; a plain rule file (`groups` at the top, not
    a Kubernetes resource, not a promtool unit test) is loaded as a rule file.
    """
    scrape_configs: list[dict[str, Any]] = []
    rule_files: list[Path] = []
    for path in sorted(rules_dir.rglob("*")):
        if path.suffix not in (".yml", ".yaml") or not path.is_file():
            continue
        data = _load_yaml(path)
        if not isinstance(data, dict):
            continue
        if isinstance(data.get("scrape_configs"), list):
            scrape_configs.extend(job for job in data["scrape_configs"] if isinstance(job, dict))
        elif isinstance(data.get("groups"), list) and "kind" not in data and "tests" not in data:
            rule_files.append(path.resolve())
    return scrape_configs, rule_files


def fallback_scrape_configs(spec: FleetSpec) -> list[dict[str, Any]]:
    """Used when `crossover rules` is not available: every instance with its topology labels."""
    groups = []
    for topology in spec.topologies:
        for instance in topology.instances:
            parts = urlsplit(instance.url)
            groups.append({"targets": [f"{parts.hostname}:{parts.port}"],
                           "labels": {"topology": topology.name, "vllm_instance": instance.name,
                                      "role": instance.role.value, "gpus": str(topology.gpus_per_instance)}})
    return [{"job_name": "vllm", "scrape_interval": spec.scrape.interval,
             "scrape_timeout": spec.scrape.timeout, "static_configs": groups}]


def scraped_targets(jobs: list[dict[str, Any]]) -> set[str]:
    """Every host:port of the static configs of some scrape jobs."""
    return {target for job in jobs for group in job.get("static_configs", []) or []
            for target in group.get("targets", []) or []}


def prometheus_config(spec: FleetSpec, scrape_configs: list[dict[str, Any]], rule_files: list[Path], *,
                      exporter: str | None, alertmanager: str | None) -> dict[str, Any]:
    """prometheus.yml for the demo. exporter and alertmanager are host:port or None when absent."""
    jobs = [dict(job) for job in scrape_configs]
    if exporter and exporter not in scraped_targets(jobs):
        jobs.append({"job_name": EXPORTER_JOB, "static_configs": [{"targets": [exporter]}]})
    config: dict[str, Any] = {
        "global": {"scrape_interval": spec.scrape.interval, "scrape_timeout": spec.scrape.timeout,
                   "evaluation_interval": spec.scrape.interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": jobs,
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config

