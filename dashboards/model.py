"""Spec + rules model -> plain-data dashboards (rows of panels of queries).

Every query reads a recording rule named by crossover.rules.model, so a rename there renames the
panels too and the two cannot drift; the few raw-series queries read catalog names under rate().
Rendering to Grafana JSON (grafanalib) lives in render.py; the lint in lint.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from crossover import catalog, slo
from crossover.rules import model as m
from crossover.rules.buckets import request_slo_buckets
from crossover.rules.model import RuleSet
from crossover.rules.names import (
    BUDGET_REMAINING_NAME,
    FAILURES_COUNTED_NAME,
    KV_BYTES,
    KV_FAILURES,
    KV_TIME,
    REPLICA_LEVEL,
    ROLE_LEVEL,
    attainment_name,
    failed_requests_name,
    gauge_sum_name,
    goodput_requests_name,
    goodput_tokens_name,
    histogram_rate_name,
    interactivity_name,
    joint_attainment_name,
    kv_bandwidth_name,
    kv_usage_name,
    per_gpu_name,
    quantile_name,
    rate_name,
    requests_source_name,
    sli_error_name,
)
from crossover.spec import REQUEST_SOURCES

DATASOURCE_UID = "crossover-prometheus"  # the provisioned datasource's fixed uid
WINDOW = "${window}"
TOPOLOGY_FILTER = 'topology=~"${topology}"'
MODEL_FILTER = 'model_name=~"${model}"'
FILTERS = f"{TOPOLOGY_FILTER},{MODEL_FILTER}"
RATE_INTERVAL = "$__rate_interval"
SLO_TITLES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    right_axis: bool = False  # on the panel's right axis (another quantity, with its own scale)


@dataclass(frozen=True)
class Line:
    """A horizontal threshold line drawn on a panel (an SLO, a burn-rate alert threshold)."""

    value: float
    color: str = "red"


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "stat"
    lines: tuple[Line, ...] = ()
    right_lines: tuple[Line, ...] = ()  # threshold lines on the right axis' queries' scale
    right_label: str = ""  # the right axis' title
    min: float | None = None
    max: float | None = None
    width: int = 12
    height: int = 8
    # Which topologies must show a series in the live test: all of them, or the disaggregated ones.
    scope: str = "all"  # "all", "pd" or "any"


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class DashboardModel:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    windows: tuple[str, ...]
    tags: tuple[str, ...] = field(default=("vllm", "crossover"))

    @property
    def panels(self) -> tuple[Panel, ...]:
        return tuple(p for r in self.rows for p in r.panels)


def _sel(name: str) -> str:
    return f"{name}{{{FILTERS}}}"


def _per_topology(name: str, legend: str = "{{topology}}") -> Query:
    return Query(_sel(name), legend)


# A topology's request figures name their source in the legend: "decode-side: excludes the prefill"
# for a P/D topology without entrypoint metrics (docs/routers.md).
SOURCE_LEGEND = "{{topology}} ({{source}})"


def _requests(name: str, legend: str = SOURCE_LEGEND) -> Query:
    """A per-topology request figure joined with where it comes from (rules' requests source)."""
    decode = REQUEST_SOURCES["decode"]
    joined = f"{_sel(name)}\n* on (topology) group_left (source)\n{requests_source_name()}"
    return Query(f'label_replace(\n{joined},\n"source", "{decode}", "source", "decode")', legend)


def _latency_panel(rules: RuleSet, metric: catalog.Metric, kind: str, title: str, what: str) -> Panel:
    threshold = next((b for b in rules.slo_buckets if b.slo == kind), None)
    lines = (Line(threshold.le),) if threshold else ()
    note = ""
    if threshold:
        spec_ms = threshold.threshold_ms
        how = "" if threshold.exact else f", the stricter neighbour of the spec's {spec_ms:g} ms"
        note = (f" The red line is the {SLO_TITLES[kind]} SLO as the rules count it "
                f"({threshold.le * 1000:g} ms bucket{how}).")
    return Panel(
        title=title,
        description=f"{what} per topology as its users see it, p50 and p99 from the topology's histogram "
                    f"buckets (histogram_quantile over sum by (le) of the rate over $window): a P/D "
                    f"topology's from its entrypoint, or decode-side (excludes the prefill) without "
                    f"one, as the legend says.{note}",
        unit="s",
        queries=(_requests(quantile_name(metric, 0.5, WINDOW), f"{SOURCE_LEGEND} p50"),
                 _requests(quantile_name(metric, 0.99, WINDOW), f"{SOURCE_LEGEND} p99")),
        lines=lines, min=0)


def _failed_per_topology() -> Panel:
    return Panel(
        title="Failed requests/s by reason",
        description="Requests the topology should have served and did not, per second: error (engine "
                    "error), abort (engine-side cancel), rejected (admission queue limit, 503), unfinished "
                    "(answered but never finished by the engine: a client that cut its stream, a 5xx "
                    "before the engine). Bad input (4xx) is not counted.",
        unit="reqps", queries=(_per_topology(failed_requests_name(WINDOW), "{{topology}} {{reason}}"),),
        min=0, scope="any")


def _failed_per_instance() -> Panel:
    """The same reasons per instance, from the rules' per-replica recordings."""
    return Panel(
        title="Failed requests/s per instance",
        description="Failed requests per second of each instance by reason, counted as on the panel per "
                    "topology (unfinished over the longest window there too).",
        unit="reqps",
        queries=(Query(_sel(failed_requests_name(WINDOW, REPLICA_LEVEL)),
                       "{{topology}} {{replica}} {{reason}}"),),
        min=0, scope="any")


def _uid(stem: str, kind: str) -> str:
    return f"xo-{stem}-{kind}"[:40]


def _goodput_panels(rules: RuleSet) -> tuple[Panel, ...]:
    objective = rules.spec.slos.objective
    slo_queries = tuple(_requests(attainment_name(b.slo, WINDOW), f"{SOURCE_LEGEND} {b.slo}")
                        for b in rules.slo_buckets)
    request_slos = request_slo_buckets(rules.slo_buckets)
    goodput_rows: list[Panel] = [Panel(
        title="Attainment per SLO",
        description="Share of all requests the topology should have served that were served within each "
                    "SLO (crossover.slo): the histogram's share within the threshold times the share "
                    "served, so failed requests (errors, rejections, cut streams) count as missed. "
                    f"The red line is the objective ({objective:g}).",
        unit="percentunit", queries=slo_queries, lines=(Line(objective),), min=0, max=1),
        _failed_per_topology(), _failed_per_instance(),
        Panel(title="Failures counted",
              description="1: every instance exposes finished_reason, so attainment counts failed requests; "
                          "0: an instance does not (vLLM before finished_reason): its attainment is the "
                          "histogram share alone and failures go unseen (docs/slo.md).",
              unit="short", kind="stat", min=0, max=1,
              queries=(Query(f"{FAILURES_COUNTED_NAME}{{{TOPOLOGY_FILTER}}}", "{{topology}}"),),
              width=6, height=4)]
    if request_slos:
        goodput_rows.insert(0, Panel(
            title="Attainment (every SLO met)",
            description="Share of requests served meeting every per-request SLO at once, failed requests "
                        "counted as missed. Server-side histograms only bound it: lower = max(0, sum of "
                        "shares - (n-1)), upper = min of shares. "
                        f"The red line is the objective ({objective:g}).",
            unit="percentunit",
            queries=(_requests(joint_attainment_name("lower", WINDOW), f"{SOURCE_LEGEND} lower bound"),
                     _requests(joint_attainment_name("upper", WINDOW), f"{SOURCE_LEGEND} upper bound")),
            lines=(Line(objective),), min=0, max=1))
        goodput_rows += [
            Panel(title="Goodput requests/s",
                  description="Requests per second served within every SLO (lower bound): every request "
                              "the topology should have served per second times the joint lower bound.",
                  unit="reqps", queries=(_per_topology(goodput_requests_name(WINDOW)),), min=0),
            Panel(title="Goodput tokens/s",
                  description="Output tokens/s of the topology times its lower-bound goodput ratio: tokens "
                              "certainly served within every SLO (a conservative figure).",
                  unit="short", queries=(_requests(goodput_tokens_name(WINDOW)),), min=0),
            Panel(title="Goodput tokens/s per GPU",
                  description="Goodput tokens/s divided by the topology's GPUs (from the spec): the figure "
                              "that decides the crossover between topologies of equal GPU count.",
                  unit="short", queries=(_requests(goodput_tokens_name(WINDOW, per_gpu=True)),), min=0),
        ]
    return tuple(goodput_rows)


def _pareto_panel(rules: RuleSet) -> Panel:
    """The Pareto view's two quantities from live traffic, per topology on one panel: the fleet's
    output tokens/s per GPU (left) against one user's, interactivity (right)."""
    tpot = next((b for b in rules.slo_buckets if b.slo == "tpot"), None)
    floor = (Line(slo.interactivity(tpot.le)),) if tpot else ()
    note = (f" The red line is the TPOT SLO's interactivity floor: {slo.interactivity(tpot.le):g} tokens/s "
            f"per user (1 / the {tpot.le * 1000:g} ms bucket the rules count it at)." if tpot else "")
    quantile = slo.percentile_label(slo.INTERACTIVITY_QUANTILE)
    return Panel(
        title="Throughput per GPU against interactivity",
        description="The trade a topology makes as load rises: output tokens/s per GPU (left axis) "
                    "against interactivity, one user's output tokens/s (right axis: 1 / the "
                    f"topology's {quantile} TPOT over $window). Under more load the first rises and "
                    "the second falls; past the knee the first gains little while users keep slowing "
                    "down (docs/sweep.md, `crossover analyze --plot` draws the same trade across "
                    f"a sweep's levels).{note}",
        unit="short",
        queries=(_per_topology(per_gpu_name(catalog.GENERATION_TOKENS, WINDOW), "{{topology}} per GPU"),
                 Query(_sel(interactivity_name(WINDOW)), "{{topology}} per user", right_axis=True)),
        right_lines=floor, right_label="output tokens/s per user", min=0)


def _throughput_panels(rules: RuleSet) -> tuple[Panel, ...]:
    return (
        Panel(title="Output tokens/s",
              description="Generated tokens per second, summed over the topology's instances (a P/D "
                          "topology's decode role: its prefill role's one token per request is no output).",
              unit="short", queries=(_per_topology(rate_name(catalog.GENERATION_TOKENS, WINDOW)),), min=0),
        Panel(title="Output tokens/s per GPU",
              description="Generated tokens per second divided by the topology's GPU count.",
              unit="short", queries=(_per_topology(per_gpu_name(catalog.GENERATION_TOKENS, WINDOW)),),
              min=0),
        _pareto_panel(rules),
        Panel(title="Finished requests/s",
              description="Requests finished per second (every finished_reason), per topology, each request "
                          "once: a P/D topology's from its entrypoint, else decode-side.",
              unit="reqps", queries=(_requests(rate_name(catalog.REQUEST_SUCCESS, WINDOW)),), min=0),
        Panel(title="Output tokens/s per instance",
              description="Generated tokens per second of each instance, from the raw counter over "
                          "$__rate_interval: shows an unbalanced or idle replica inside a topology.",
              unit="short",
              queries=(Query(f"sum by (topology, replica) (rate({catalog.GENERATION_TOKENS.promql_name}"
                             f"{{{rules.config.selector},{FILTERS}}}[{RATE_INTERVAL}]))",
                             "{{topology}} {{replica}}"),), min=0),
    )


def _latency_panels(rules: RuleSet) -> tuple[Panel, ...]:
    return (
        _latency_panel(rules, catalog.TTFT, "ttft", "Time to first token", "Time to first token"),
        _latency_panel(rules, catalog.TPOT, "tpot", "Time per output token (per request)",
                       "Per-request time per output token (decode time / (tokens - 1))"),
        _latency_panel(rules, catalog.ITL, "itl", "Inter-token latency",
                       "Inter-token latency (per engine step)"),
        _latency_panel(rules, catalog.E2E_LATENCY, "e2el", "End-to-end request latency",
                       "End-to-end request latency"),
    )


def _load_panels(rules: RuleSet) -> tuple[Panel, ...]:
    up = f"up{{{rules.config.selector},{TOPOLOGY_FILTER}}}"
    return (
        Panel(title="Running and waiting requests",
              description="Requests in the running batch and in the waiting queue, summed per topology.",
              unit="short",
              queries=(_per_topology(gauge_sum_name(catalog.NUM_REQUESTS_RUNNING), "{{topology}} running"),
                       _per_topology(gauge_sum_name(catalog.NUM_REQUESTS_WAITING), "{{topology}} waiting")),
              min=0),
        Panel(title="KV-cache usage",
              description="KV-cache usage of the fullest instance of each topology (1 = full; preemptions "
                          "follow). Instances of a topology have equal pools.",
              unit="percentunit", queries=(_per_topology(kv_usage_name("max")),), min=0, max=1),
        Panel(title="Preemptions/s",
              description="Requests preempted per second (KV cache exhausted), per topology.",
              unit="short", queries=(_per_topology(rate_name(catalog.NUM_PREEMPTIONS, WINDOW)),), min=0),
        Panel(title="Targets up",
              description="Instances of each topology that Prometheus scrapes successfully, out of those "
                          "in the spec.",
              unit="short", queries=(Query(f"sum by (topology) ({up})", "{{topology}}"),), min=0),
    )


def overlay_dashboard(rules: RuleSet, stem: str) -> DashboardModel:
    return DashboardModel(
        uid=_uid(stem, "overlay"),
        title=f"vLLM crossover: topology overlay ({stem})",
        description="Every topology of the fleet spec on the same panels, so the crossover between one big "
                    "tensor-parallel replica, several small ones and P/D disaggregation shows at a glance.",
        rows=(Row("Goodput", _goodput_panels(rules)), Row("Throughput", _throughput_panels(rules)),
              Row("Latency", _latency_panels(rules)), Row("Load", _load_panels(rules))),
        windows=rules.dashboard_windows)


def _alert_windows(rules: RuleSet) -> tuple[str, ...]:
    """The burn-rate windows, shortest first."""
    seconds = {t.long_s: t.long for t in rules.tiers} | {t.short_s: t.short for t in rules.tiers}
    return tuple(seconds[s] for s in sorted(seconds))


def slo_dashboard(rules: RuleSet, stem: str) -> DashboardModel:
    budget = rules.error_budget
    sli = tuple(
        Panel(title=f"{SLO_TITLES[b.slo]} SLI per window",
              description=f"Share of {'engine iterations' if b.slo == 'itl' else 'requests'} within the "
                          f"{SLO_TITLES[b.slo]} SLO ({b.le * 1000:g} ms) over each alerting window, per "
                          f"topology. The red line is the objective ({rules.spec.slos.objective:g}).",
              unit="percentunit",
              queries=tuple(Query(f'1 - {sli_error_name(w)}{{slo="{b.slo}",{FILTERS}}}',
                                  f"{{{{topology}}}} {w}") for w in _alert_windows(rules)),
              lines=(Line(rules.spec.slos.objective),), min=0, max=1)
        for b in rules.slo_buckets)
    burn = tuple(
        Panel(title=f"Burn rate {t.long}/{t.short} ({t.severity})",
              description=f"Error ratio over {t.long} and {t.short} divided by the error budget "
                          f"({budget:g}), per topology and SLO. The alert fires when both exceed the red "
                          f"line ({t.factor:g}x: {t.budget_share * 100:g}% of the budget in {t.long}).",
              unit="short",
              queries=(Query(f"{sli_error_name(t.long)}{{{FILTERS}}} / {budget!r}",
                             f"{{{{topology}}}} {{{{slo}}}} {t.long}"),
                       Query(f"{sli_error_name(t.short)}{{{FILTERS}}} / {budget!r}",
                             f"{{{{topology}}}} {{{{slo}}}} {t.short}")),
              lines=(Line(t.factor),), min=0)
        for t in rules.tiers)
    budget_panels = (
        Panel(title="Error budget remaining",
              description=f"1 - (error ratio over the {rules.period} period) / (1 - objective), per topology "
                          "and SLO. Below 0 the budget is spent.",
              unit="percentunit",
              queries=(Query(f"{BUDGET_REMAINING_NAME}{{{FILTERS}}}", "{{topology}} {{slo}}"),),
              lines=(Line(0.0),)),
        Panel(title="Firing crossover alerts",
              description="Alerts of the generated rules firing now (0 when none); their start and end are "
                          "also drawn as annotations on every panel.",
              unit="short", kind="stat", scope="any",
              queries=(Query('count(ALERTS{alertstate="firing",alertname=~"Vllm.+",' + TOPOLOGY_FILTER
                             + "}) or vector(0)", "firing"),)),
    )
    return DashboardModel(
        uid=_uid(stem, "slo"),
        title=f"vLLM crossover: goodput SLO ({stem})",
        description="Goodput SLIs per alerting window, burn rates against the multi-window alert thresholds, "
                    "and the error budget left over the SLO period.",
        rows=(Row("SLI per window", sli), Row("Burn rates", burn), Row("Error budget", budget_panels)),
        windows=rules.dashboard_windows)


def _on_role(name: str, role: str) -> Query:
    return Query(f'{name}{{{FILTERS},role="{role}"}}', f"{{{{topology}}}} {role} p99")


def _kv_transfer_panels(rules: RuleSet) -> tuple[Panel, ...]:
    xfer = KV_TIME
    return (
        Panel(title="KV-transfer time", scope="pd",
              description="KV-cache transfer duration p50 and p99 per P/D topology, from whichever connector "
                          "(NIXL or Mooncake) the decode instances expose; pooled over TP ranks.",
              unit="s", queries=(_per_topology(quantile_name(xfer, 0.5, WINDOW), "{{topology}} p50"),
                                 _per_topology(quantile_name(xfer, 0.99, WINDOW), "{{topology}} p99")),
              lines=(Line(rules.config.kv_transfer_p99_ms / 1000.0),), min=0),
        Panel(title="KV bytes/s", scope="pd",
              description="Bytes of KV cache moved per second from prefill to decode instances.",
              unit="Bps", queries=(_per_topology(histogram_rate_name(KV_BYTES, "sum", WINDOW)),),
              min=0),
        Panel(title="Per-transfer bandwidth", scope="pd",
              description="Bytes moved divided by the time transfers took (sum of bytes over sum of transfer "
                          "seconds): the link speed a transfer sees.",
              unit="Bps", queries=(_per_topology(kv_bandwidth_name(WINDOW)),), min=0),
        Panel(title="KV transfers and failures/s", scope="pd",
              description="KV transfers per second and failed transfers per second (NIXL or Mooncake).",
              unit="ops",
              queries=(_per_topology(histogram_rate_name(xfer, "count", WINDOW), "{{topology}} transfers"),
                       _per_topology(rate_name(KV_FAILURES, WINDOW),
                                     "{{topology}} failed")),
              min=0),
    )


def _stage_panels(rules: RuleSet) -> tuple[Panel, ...]:
    """What a P/D request's user waited for, beside its three stages: prefill, KV transfer, decode."""
    itl_slo = next((b for b in rules.slo_buckets if b.slo == "itl"), None)
    ttft_slo = next((b for b in rules.slo_buckets if b.slo == "ttft"), None)
    return (
        Panel(title="What users waited for: TTFT p99", scope="pd", width=6,
              description="p99 time to first token per topology as its users see it: from the entrypoint "
                          "(prefill + KV transfer + first decode step), or decode-side without one.",
              unit="s",
              queries=(_requests(quantile_name(catalog.TTFT, 0.99, WINDOW), f"{SOURCE_LEGEND} p99"),),
              lines=(Line(ttft_slo.le),) if ttft_slo else (), min=0),
        Panel(title="Prefill: TTFT p99 on the prefill role", scope="pd", width=6,
              description="p99 time to first token on the prefill instances: the prefill itself (and its "
                          "queue), the first stage of a P/D request.",
              unit="s",
              queries=(_on_role(quantile_name(catalog.TTFT, 0.99, WINDOW, ROLE_LEVEL), "prefill"),),
              min=0),
        Panel(title="KV transfer: time p99", scope="pd", width=6,
              description="p99 KV-cache transfer time, prefill to decode (NIXL or Mooncake): the second "
                          "stage.",
              unit="s",
              queries=(_per_topology(quantile_name(KV_TIME, 0.99, WINDOW), "{{topology}} p99"),),
              lines=(Line(rules.config.kv_transfer_p99_ms / 1000.0),), min=0),
        Panel(title="Decode: ITL p99 on the decode role", scope="pd", width=6,
              description="p99 inter-token latency on the decode instances: the third stage, free of "
                          "prefill chunks.",
              unit="s",
              queries=(_on_role(quantile_name(catalog.ITL, 0.99, WINDOW, ROLE_LEVEL), "decode"),),
              lines=(Line(itl_slo.le),) if itl_slo else (), min=0),
    )


def _decode_panels(rules: RuleSet) -> tuple[Panel, ...]:
    itl_slo = next((b for b in rules.slo_buckets if b.slo == "itl"), None)
    return (
        Panel(title="Decode ITL p99: P/D next to colocated",
              description="p99 inter-token latency of every topology: with 8K-token prompts, prefill chunks "
                          "stall colocated decode steps; a P/D decode instance never runs a prefill.",
              unit="s",
              queries=(_requests(quantile_name(catalog.ITL, 0.99, WINDOW), f"{SOURCE_LEGEND} p99"),),
              lines=(Line(itl_slo.le),) if itl_slo else (), min=0),
        Panel(title="Queue depth: prefill vs decode",
              description="Waiting requests per role (prefill, decode, colocated) of each topology.",
              unit="short",
              queries=(Query(_sel(gauge_sum_name(catalog.NUM_REQUESTS_WAITING, ROLE_LEVEL)),
                             "{{topology}} {{role}}"),), min=0),
    )


def _per_role_panels(rules: RuleSet) -> tuple[Panel, ...]:
    request_slos = request_slo_buckets(rules.slo_buckets)
    twice = ("A P/D request is one request on the prefill instance (max_tokens 1), one on the decode "
             "instance and one at the entrypoint; the overlay counts it once (entrypoint, else decode-side), "
             "here each role shows its own.")
    per_role: list[Panel] = [
        Panel(title="Finished requests/s per role", scope="pd",
              description=f"Requests finished per second on each role of each topology. {twice}",
              unit="reqps",
              queries=(Query(_sel(rate_name(catalog.REQUEST_SUCCESS, WINDOW, ROLE_LEVEL)),
                             "{{topology}} {{role}}"),), min=0),
        Panel(title="TTFT p99 per role", scope="pd",
              description="p99 time to first token per role. On the decode role it covers the wait for the "
                          "KV transfer, on the prefill role the prefill itself; a user sees about their "
                          f"sum. {twice}",
              unit="s",
              queries=(Query(_sel(quantile_name(catalog.TTFT, 0.99, WINDOW, ROLE_LEVEL)),
                             "{{topology}} {{role}}"),), min=0),
        Panel(title="End-to-end latency p99 per role", scope="pd",
              description=f"p99 end-to-end request latency per role. {twice}",
              unit="s",
              queries=(Query(_sel(quantile_name(catalog.E2E_LATENCY, 0.99, WINDOW, ROLE_LEVEL)),
                             "{{topology}} {{role}}"),), min=0),
    ]
    if request_slos:
        per_role.append(Panel(
            title="Attainment per role and SLO", scope="pd",
            description="Share of requests within each per-request SLO on each role (rate of the SLO "
                        f"bucket over the rate of the count, summed per role first). {twice}",
            unit="percentunit",
            queries=tuple(Query(_sel(attainment_name(b.slo, WINDOW, ROLE_LEVEL)),
                                f"{{{{topology}}}} {{{{role}}}} {b.slo}") for b in request_slos),
            lines=(Line(rules.spec.slos.objective),), min=0, max=1))
    return tuple(per_role)


def pd_dashboard(rules: RuleSet, stem: str) -> DashboardModel | None:
    if not m.disaggregated_topologies(rules.spec):
        return None
    return DashboardModel(
        uid=_uid(stem, "pd"),
        title=f"vLLM crossover: P/D disaggregation ({stem})",
        description="KV-cache transfers between prefill and decode instances and what they buy: decode "
                    "inter-token latency beside the colocated topology's.",
        rows=(Row("Prefill, KV transfer and decode side by side", _stage_panels(rules)),
              Row("KV transfer", _kv_transfer_panels(rules)), Row("Decode", _decode_panels(rules)),
              Row("Per role", _per_role_panels(rules))),
        windows=rules.dashboard_windows)


def dashboards(rules: RuleSet, stem: str) -> tuple[DashboardModel, ...]:
    pd = pd_dashboard(rules, stem)
    return (overlay_dashboard(rules, stem), slo_dashboard(rules, stem), *((pd,) if pd else ()))
