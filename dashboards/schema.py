"""Grafana's own dashboard schema: make grafanalib's JSON clean against it, and check it there.

Grafana publishes the classic dashboard model its frontend is built on as the npm package
`@grafana/schema` (`Dashboard` in dist/types/raw/dashboard/x/types.gen.d.ts, each panel plugin's
`Options` and `FieldConfig` in dist/types/raw/composable/<type>/panelcfg/x/types.gen.d.ts). The
package's versions are Grafana's own (13.2.3 is published with Grafana 13.2.3).

- `clean()` is one pass over a whole dashboard after grafanalib: it drops what grafanalib writes
  and the schema lacks (nulls, legacy fields), moves the Prometheus annotation to the form Grafana's
  Prometheus datasource writes, and sets the current `schemaVersion` so Grafana runs no migration.
- `validate()` refuses, with one line naming the dashboard, panel and field, what would make a file
  Grafana rejects (non-finite numbers, an empty or inverted axis range, a grid position off the
  24-column grid, thresholds out of order); it needs nothing but Python, so generation always runs it.
- `check()` type-checks the JSON with TypeScript (`tsc --strict`) against the `Dashboard` type and the
  panel plugins' types of each pinned package: excess properties, missing required fields, nulls and
  enum strings are all errors there. It needs node and the packages (`python -m
  crossover.dashboards.schema install`, run by `make test` through scripts/install-grafana-schema).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossover.errors import UserError

# The compose stack's Grafana (compose/docker-compose.yml, compose/.env.example) and the last 12.x
# release, for Grafana 12 installs (kube-prometheus-stack pins its own Grafana). Both are checked.
COMPOSE_GRAFANA_VERSION = "13.2.3"
SCHEMA_PACKAGE_VERSIONS = ("12.4.11", COMPOSE_GRAFANA_VERSION)
TYPESCRIPT_VERSION = "5.9.3"
# The dashboard schema version of @grafana/schema 13.2.3 (`defaultDashboard.schemaVersion` in
# dist/esm/raw/dashboard/x/types.gen.mjs). Grafana's DashboardMigrator.ts calls 42 the final version of
# the v1 dashboard model; a dashboard at it is loaded without migration. tests/dashboards checks it
# against the installed package.
SCHEMA_VERSION = 42
GRID_COLUMNS = 24
# Grafana 12.2+/13 serve dashboards as Kubernetes-style resources; V1 wraps the classic model as its
# `spec` (dist/types/schema/dashboard/v1beta1/dashboard_object_gen.d.ts of @grafana/schema 12.4.11 and
# 13.2.3: apiVersion, kind, metadata, spec, status). V2 (v2beta1/v2) is a different model, not generated.
V1_API_VERSION = "dashboard.grafana.app/v1beta1"
V1_KIND = "Dashboard"

# grafanalib 0.7.1 writes these and no version of the schema has them (Grafana's migrations drop or
# rewrite them on load): dashboard-level ones from the pre-5.0 row layout, panel-level ones from
# the old graph panel, threshold-step ones from the old graph panel's thresholds, target-level ones
# from the old Prometheus query editor.
LEGACY_DASHBOARD_FIELDS = frozenset({"__inputs", "hideControls", "rows", "sharedCrosshair", "style"})
LEGACY_PANEL_FIELDS = frozenset({"editable", "error", "height", "minSpan", "span"})
LEGACY_THRESHOLD_STEP_FIELDS = frozenset({"index", "line", "op", "yaxis"})
LEGACY_TARGET_FIELDS = frozenset({"intervalFactor", "metric", "query", "step", "target"})
LEGACY_TIMEPICKER_FIELDS = frozenset({"time_options"})
# Options a panel plugin's schema requires and grafanalib leaves out, filled with the plugin's own
# defaults (`defaultOptions` of dist/esm/raw/composable/<type>/panelcfg/x/*_types.gen.mjs in
# @grafana/schema 13.2.3), which is what Grafana would fill in on load.
PANEL_OPTION_DEFAULTS: dict[str, dict[str, Any]] = {
    "stat": {"colorMode": "value", "graphMode": "area", "justifyMode": "auto",
             "percentChangeColorMode": "standard", "showPercentChange": False, "textMode": "auto",
             "wideLayout": True},
}
# The Prometheus annotation as Grafana's Prometheus datasource keeps it
# (packages/grafana-prometheus/src/annotations.ts, `prepareAnnotation`): the query in `target`
# (`expr`, `interval` from the legacy `step`, refId "Anno"); `titleFormat`, `tagKeys`, `textFormat`
# and `useValueForTime` stay at the annotation's root, where `processEvents` reads them.
PROMETHEUS_ANNOTATION_REF_ID = "Anno"


def cache_dir(version: str) -> Path:
    """Where the npm packages for one schema version live: outside the repository and the package."""
    root = os.environ.get("CROSSOVER_GRAFANA_SCHEMA_CACHE") or str(Path.home() / ".cache" / "vllm-crossover")
    return Path(root) / f"grafana-schema-{version}"


# --- clean -------------------------------------------------------------------------------------


def _drop_nulls(value: Any) -> Any:
    """grafanalib writes null for every unset option; the schema has them optional (absent) instead.
    The one null the schema wants, the base threshold step's, is put back by _clean_steps."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value if v is not None]
    return value


def _clean_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, step in enumerate(steps):
        step = {k: v for k, v in step.items() if k not in LEGACY_THRESHOLD_STEP_FIELDS}
        # The base step's value is null in Grafana's model (-Infinity); the schema types it number|null.
        if i == 0:
            step["value"] = None
        out.append(step)
    return out


def _clean_panel(panel: dict[str, Any]) -> dict[str, Any]:
    panel = {k: v for k, v in _drop_nulls(panel).items() if k not in LEGACY_PANEL_FIELDS}
    if panel.get("type") == "row":
        # A row carries no queries or field config of its own; the schema's RowPanel has neither.
        panel = {k: v for k, v in panel.items()
                 if k in {"collapsed", "datasource", "gridPos", "id", "panels", "repeat", "title", "type"}}
        panel["panels"] = [_clean_panel(p) for p in panel.get("panels", [])]
        return panel
    panel["targets"] = [{k: v for k, v in t.items() if k not in LEGACY_TARGET_FIELDS}
                        for t in panel.get("targets", [])]
    options = {**PANEL_OPTION_DEFAULTS.get(panel.get("type", ""), {}), **panel.get("options", {})}
    if isinstance(options.get("legend"), dict):
        # Every plugin's legend (VizLegendOptions) requires showLegend; grafanalib omits it (shown).
        options["legend"] = {"showLegend": True, **options["legend"]}
    if options:
        panel["options"] = options
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    thresholds = defaults.get("thresholds")
    if thresholds and thresholds.get("steps"):
        thresholds["steps"] = _clean_steps(thresholds["steps"])
    return panel


def _clean_annotation(annotation: dict[str, Any]) -> dict[str, Any]:
    annotation = dict(annotation)
    if "expr" in annotation:
        target = {"expr": annotation.pop("expr"), "refId": PROMETHEUS_ANNOTATION_REF_ID}
        if "step" in annotation:
            target["interval"] = annotation.pop("step")
        annotation["target"] = target
    return annotation


def _clean_variable(variable: dict[str, Any]) -> dict[str, Any]:
    # `definition` is what Grafana's query editor shows, a copy of the query the schema does not type.
    return {k: v for k, v in variable.items() if k != "definition"}


def clean(dashboard: dict[str, Any]) -> dict[str, Any]:
    """The dashboard as the schema has it; works on any panel type, so new panels are cleaned too."""
    data = {k: v for k, v in dashboard.items() if k not in LEGACY_DASHBOARD_FIELDS}
    panels = data.pop("panels", [])
    data = _drop_nulls(data)
    data["panels"] = [_clean_panel(p) for p in panels]
    annotations = data.get("annotations", {}).get("list", [])
    data["annotations"] = {"list": [_clean_annotation(a) for a in annotations]}
    data["templating"] = {"list": [_clean_variable(v) for v in data.get("templating", {}).get("list", [])]}
    if isinstance(data.get("timepicker"), dict):
        data["timepicker"] = {k: v for k, v in data["timepicker"].items()
                              if k not in LEGACY_TIMEPICKER_FIELDS}
    data["schemaVersion"] = SCHEMA_VERSION
    return data


def resource_v1(dashboard: dict[str, Any]) -> dict[str, Any]:
    """The dashboard as a V1 resource: `metadata.name` is its uid, `spec` the classic model as is.
    The namespace is left to the client (`default` is Grafana's first organization)."""
    return {"apiVersion": V1_API_VERSION, "kind": V1_KIND, "metadata": {"name": dashboard["uid"]},
            "spec": dashboard}


# --- validate (pure Python, always run at generation) ------------------------------------------


def _numbers(value: Any, path: str) -> Iterable[tuple[str, float]]:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield path, float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{path}[{i}]")


def _panel_problems(panel: dict[str, Any]) -> list[str]:
    problems = [f"{path}: {value} is not a finite number (JSON has no NaN or Infinity)"
                for path, value in _numbers(panel, "") if not math.isfinite(value)]
    grid = panel.get("gridPos", {})
    x, w, h = grid.get("x", 0), grid.get("w", 0), grid.get("h", 0)
    if not 1 <= w <= GRID_COLUMNS or x < 0 or x + w > GRID_COLUMNS:
        problems.append(f"gridPos: x={x}, w={w} is outside the {GRID_COLUMNS}-column grid")
    if h < 1:
        problems.append(f"gridPos.h: {h} is not a positive height")
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    low, high = defaults.get("min"), defaults.get("max")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low >= high:
        problems.append(f"fieldConfig.defaults.min/max: min {low} is not below max {high}")
    steps = defaults.get("thresholds", {}).get("steps", [])
    values = [s.get("value") for s in steps[1:]]
    if any(not isinstance(v, (int, float)) for v in values):
        problems.append("fieldConfig.defaults.thresholds.steps: a step after the base has no number")
    elif values != sorted(values):
        problems.append(f"fieldConfig.defaults.thresholds.steps: values {values} are not ascending")
    return problems


def validate(dashboard: dict[str, Any], name: str) -> None:
    """Raise UserError, one line naming the dashboard, panel and field, for what Grafana would reject."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            continue
        problems = _panel_problems(panel)
        if problems:
            where = f"panel {panel.get('title')!r} (id {panel.get('id')})"
            raise UserError(f"dashboard {name}: {where}: {problems[0]}")


# --- check (TypeScript against the published types) --------------------------------------------


class SchemaToolMissing(Exception):
    """node, npm or the pinned packages are not there (`make test` installs them)."""


@dataclass(frozen=True)
class Problem:
    dashboard: str  # the file (or name) of the dashboard
    where: str  # "panel 'Title' (id 3)" or "dashboard"
    message: str  # tsc's message

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.where}: {self.message}"


def install(version: str, *, quiet: bool = False) -> Path:
    """npm-install @grafana/schema==version and TypeScript into cache_dir(version); a no-op when there."""
    root = cache_dir(version)
    if _installed(root, version):
        return root
    npm = shutil.which("npm")
    if npm is None:
        raise SchemaToolMissing("npm is not installed (scripts/install-system-deps installs it)")
    root.mkdir(parents=True, exist_ok=True)
    manifest = {"name": f"crossover-grafana-schema-{version}", "private": True,
                "dependencies": {"@grafana/schema": version, "typescript": TYPESCRIPT_VERSION}}
    (root / "package.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    # --ignore-scripts: nothing of the packages runs at install; only tsc runs, on our files.
    command = [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--save-exact"]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not _installed(root, version):
        raise SchemaToolMissing(f"npm install in {root} failed: {result.stderr.strip()[-500:]}")
    if not quiet:
        print(f"@grafana/schema {version} and typescript {TYPESCRIPT_VERSION} ready in {root}")
    return root


def _installed(root: Path, version: str) -> bool:
    try:
        schema = json.loads((root / "node_modules/@grafana/schema/package.json").read_text(encoding="utf-8"))
        ts = json.loads((root / "node_modules/typescript/package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(schema.get("version") == version and ts.get("version") == TYPESCRIPT_VERSION)


def package_root(version: str) -> Path:
    root = cache_dir(version)
    if not _installed(root, version):
        raise SchemaToolMissing(f"@grafana/schema {version} is not installed in {root} "
                                f"(run scripts/install-grafana-schema)")
    if shutil.which("node") is None:
        raise SchemaToolMissing("node is not installed (scripts/install-system-deps installs it)")
    return root


def package_schema_version(version: str) -> int:
    """`defaultDashboard.schemaVersion` of the installed package: the version Grafana migrates to."""
    source = package_root(version) / "node_modules/@grafana/schema/dist/esm/raw/dashboard/x/types.gen.mjs"
    match = re.search(r"schemaVersion:\s*(\d+)", source.read_text(encoding="utf-8"))
    if match is None:
        raise SchemaToolMissing(f"no defaultDashboard.schemaVersion in {source}")
    return int(match.group(1))


@dataclass(frozen=True)
class PanelTypes:
    module: str  # the package's export path of the plugin's types
    has_field_config: bool  # whether the plugin has its own `FieldConfig` (fieldConfig.defaults.custom)


def _panel_modules(root: Path) -> dict[str, PanelTypes]:
    """Panel type -> its plugin's types (Options, maybe FieldConfig), as the package exports them."""
    package = root / "node_modules/@grafana/schema"
    exports = json.loads((package / "package.json").read_text(encoding="utf-8"))["exports"]
    pattern = re.compile(r"^\./(dist/esm/raw/composable/([a-z0-9]+)/panelcfg/x/\w+_types\.gen)$")
    modules = {}
    for key, target in exports.items():
        match = pattern.match(key)
        if match and isinstance(target, dict) and "types" in target:
            declarations = (package / target["types"]).read_text(encoding="utf-8")
            modules[match.group(2)] = PanelTypes(f"@grafana/schema/{match.group(1)}",
                                                 "export interface FieldConfig " in declarations)
    return modules


# TypeScript's string enums (`BigValueJustifyMode.Auto`) accept no string, while JSON has nothing
# else: `JsonOf<T>` turns each string enum into the union of its values ("auto" | "center"), and
# leaves every other type (numeric enums take their numbers already) as the schema has it.
# The classic `AnnotationQuery` types `target` for the built-in Grafana datasource only (limit,
# matchAny, tags, type); a Prometheus annotation is checked as Grafana's Prometheus datasource
# writes it (PROMETHEUS_ANNOTATION_REF_ID above), every other field as the schema has it.
_PRELUDE = """\
import type { AnnotationQuery, Dashboard, Panel, RowPanel } from '@grafana/schema';
type JsonOf<T> = T extends string ? `${T}`
  : T extends Array<infer U> ? Array<JsonOf<U>>
  : T extends object ? { [K in keyof T]: JsonOf<T[K]> }
  : T;
type PrometheusAnnotation = Omit<AnnotationQuery, 'target'> & {
  target: { expr: string; refId: string; interval?: string };
  titleFormat?: string; tagKeys?: string; textFormat?: string; useValueForTime?: boolean;
};
type CheckedDashboard = JsonOf<Omit<Dashboard, 'annotations'> & {
  annotations?: { list?: Array<AnnotationQuery | PrometheusAnnotation> };
}>;
"""


def _literal(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


def typescript_source(dashboard: dict[str, Any], modules: dict[str, PanelTypes],
                      v1_types: str = "") -> tuple[str, list[tuple[int, str]]]:
    """A .ts file assigning the dashboard (classic, or a V1 resource around it) to the schema's types,
    and (first line, what) for each part, so that tsc's line numbers name the panel."""
    lines = _PRELUDE.splitlines()
    parts: list[tuple[int, str]] = []
    imports: list[str] = []

    def add(what: str, text: str) -> None:
        parts.append((len(lines) + 1, what))
        lines.extend(text.splitlines())

    def with_refs(value: dict[str, Any], key: str, refs: list[str]) -> str:
        """The object's literal with `key` set to the named constants (checked on their own lines)."""
        body = _literal({k: v for k, v in value.items() if k != key}).rstrip()
        listed = f'"{key}": [{", ".join(refs)}]'
        return f"{{\n  {listed}\n}}" if body == "{}" else f"{body[:-1].rstrip()},\n  {listed}\n}}"

    counter = iter(range(1 << 30))

    def panel_const(panel: dict[str, Any]) -> str:
        i = next(counter)
        kind = panel.get("type")
        where = f"panel {panel.get('title')!r} (id {panel.get('id')})"
        if kind == "row":
            refs = [panel_const(p) for p in panel.get("panels", [])]
            add(where, f"const panel{i}: JsonOf<RowPanel> = {with_refs(panel, 'panels', refs)};")
            return f"panel{i}"
        add(where, f"const panel{i}: JsonOf<Panel> = {_literal(panel)};")
        if kind not in modules:
            add(where, f"// no plugin schema for panel type {kind!r}\n"
                       f"const unknown{i}: never = {_literal(kind)};")
            return f"panel{i}"
        alias = f"P{i}"
        imports.append(f"import type * as {alias} from '{modules[kind].module}';")
        add(f"{where} options",
            f"const options{i}: JsonOf<{alias}.Options> = {_literal(panel.get('options', {}))};")
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
        # A plugin without a FieldConfig of its own takes no custom field options at all.
        custom_type = (f"JsonOf<{alias}.FieldConfig>" if modules[kind].has_field_config
                       else "Record<string, never>")
        add(f"{where} fieldConfig.defaults.custom", f"const custom{i}: {custom_type} = {_literal(custom)};")
        return f"panel{i}"

    resource = dashboard.get("apiVersion") == V1_API_VERSION and dashboard.get("kind") == V1_KIND
    spec = dashboard.get("spec", {}) if resource else dashboard
    refs = [panel_const(p) for p in spec.get("panels", [])]
    add("dashboard", f"const dashboard: CheckedDashboard = {with_refs(spec, 'panels', refs)};")
    if resource:
        imports.append(f"import type * as V1 from '{v1_types}';")
        # What a client sends: the package's resource type with what the server sets (namespace from
        # the URL, status) optional and the classic model as spec; _v1Keys fails if the package's
        # resource gains a field this does not know.
        add("V1 resource", f"""type V1Resource = {{
  apiVersion: '{V1_API_VERSION}'; kind: '{V1_KIND}';
  metadata: Omit<V1.Metadata, 'namespace'> & {{ namespace?: string }};
  spec: CheckedDashboard; status?: V1.Dashboard['status'];
}};
const _v1Keys: Exclude<keyof V1.Dashboard, keyof V1Resource> extends never ? true : never = true;""")
        wrapper = {k: v for k, v in dashboard.items() if k != "spec"}
        add("V1 resource", f"export const resource: V1Resource = {with_refs(wrapper, 'spec', [])};"
            .replace('"spec": []', '"spec": dashboard'))
    # The imports go first; shift every recorded line by their count.
    shift = len(imports)
    return "\n".join(imports + lines) + "\n", [(start + shift, what) for start, what in parts]


_TSC_LINE = re.compile(r"^(?P<file>[^(]+)\((?P<line>\d+),(?P<col>\d+)\): error (?P<msg>.*)$")


def check(dashboards: dict[str, dict[str, Any]], version: str) -> list[Problem]:
    """Type-check each dashboard (name -> JSON) against @grafana/schema==version; [] when all pass."""
    root = package_root(version)
    modules = _panel_modules(root)
    # By file path: the package exports no index for v1beta1 (only for v2 and v2beta1).
    v1_types = str(root / "node_modules/@grafana/schema/dist/types/schema/dashboard/v1beta1"
                   / "dashboard_object_gen")
    work = Path(tempfile.mkdtemp(prefix="check-", dir=root))
    try:
        files: dict[str, tuple[str, list[tuple[int, str]]]] = {}
        for i, (name, dashboard) in enumerate(sorted(dashboards.items())):
            source, parts = typescript_source(dashboard, modules, v1_types)
            path = work / f"d{i}.ts"
            path.write_text(source, encoding="utf-8")
            files[path.name] = (name, parts)
        command = ["node", str(root / "node_modules/typescript/bin/tsc"), "--noEmit", "--strict",
                   "--target", "es2022", "--module", "esnext", "--moduleResolution", "bundler",
                   "--skipLibCheck", "--pretty", "false", *sorted(str(work / f) for f in files)]
        result = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    problems: list[Problem] = []
    for line in result.stdout.splitlines():
        match = _TSC_LINE.match(line)
        if match is None:
            if problems and line.startswith(" "):  # tsc's continuation lines of one message
                last = problems[-1]
                problems[-1] = Problem(last.dashboard, last.where, f"{last.message} {line.strip()}")
            continue
        name, parts = files.get(Path(match["file"]).name, (match["file"], []))
        at = int(match["line"])
        where = next((what for start, what in reversed(parts) if start <= at), "dashboard")
        problems.append(Problem(name, where, match["msg"]))
    if result.returncode != 0 and not problems:
        output = (result.stdout + result.stderr).strip()[-500:]
        raise SchemaToolMissing(f"tsc failed without a diagnostic: {output}")
    return problems


# --- command line --------------------------------------------------------------------------------


def _committed(repo: Path) -> list[Path]:
    return sorted((repo / "dashboards" / "generated").glob("*/*.json"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m crossover.dashboards.schema",
                                     description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="npm-install every pinned @grafana/schema and TypeScript into the cache")
    check_parser = sub.add_parser("check", help="type-check dashboard JSON files against every pinned schema")
    check_parser.add_argument("files", nargs="*", type=Path,
                              help="dashboard JSON files (default: this checkout's dashboards/generated)")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            for version in SCHEMA_PACKAGE_VERSIONS:
                install(version)
            return 0
        files = args.files or _committed(Path.cwd())
        if not files:
            raise UserError("no dashboard JSON files to check")
        dashboards = {}
        for path in files:
            try:
                dashboards[str(path)] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise UserError(f"{path}: {exc}") from None
        failed = False
        for version in SCHEMA_PACKAGE_VERSIONS:
            problems = check(dashboards, version)
            for problem in problems:
                print(f"@grafana/schema {version}: {problem}", file=sys.stderr)
            failed = failed or bool(problems)
            print(f"@grafana/schema {version}: {len(dashboards)} dashboards, {len(problems)} errors")
        return 1 if failed else 0
    except (UserError, SchemaToolMissing) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
