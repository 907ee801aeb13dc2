"""Router dialects (crossover.catalog.DIALECTS, docs/routers.md): an entrypoint read in llm-d's or
production-stack's names gives the figures vLLM's names give for the same traffic; a router's
series are never summed with the engines'; the spec's dialect field and the bucket warning."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import yaml

from crossover import catalog, slo
from crossover.exporter import dialect
from crossover.exporter.derive import Derived, derive
from crossover.exporter.parse import ParsedSeries, Parser
from crossover.exporter.window import History
from crossover.exposition import Hist
from crossover.pdproxy.proxy import ERROR, EntrypointMetrics
from crossover.spec import ENTRYPOINT_ROLE, FleetSpec, SpecError, Target, load_spec, slo_warnings
from tests.helpers import SPECS, bucket_width

ENTRY = Target("pd1p1d", "pd1p1d-entrypoint", ENTRYPOINT_ROLE, "http://127.0.0.1:1/metrics", 0)
SERVED, FAILED, BAD_INPUT = 60, 3, 2
TTFT_THRESHOLD_S = 1.0  # a boundary of vLLM's TTFT buckets and of llm-d's


def _traffic(metrics: EntrypointMetrics, served: int = SERVED, failed: int = FAILED,
             bad_input: int = BAD_INPUT, seed: int = 7) -> None:
    """The same requests through an entrypoint of any dialect: streamed answers of a few tokens,
    instances failing some, clients sending bad input a few times."""
    rng = random.Random(seed)
    for _ in range(served):
        metrics.arrived()
        metrics.on_http("/v1/completions", "POST", 200)
        first = rng.uniform(0.05, 3.0)
        tokens = [first + 0.03 * i + rng.uniform(0.0, 0.02) for i in range(rng.randint(2, 20))]
        metrics.finished("length", 0.0, tokens[-1] + 0.001, tokens)
    for _ in range(failed):
        metrics.arrived()
        metrics.on_http("/v1/completions", "POST", 502)
        metrics.finished(ERROR, 0.0, rng.uniform(0.01, 0.2), [])
    for _ in range(bad_input):
        metrics.on_http("/v1/completions", "POST", 400)
        metrics.refused(400)


def go_exposition(metrics: EntrypointMetrics) -> str:
    """llm-d's families as its router's client_golang writes them (label names sorted, `le` last,
    whole numbers without a decimal point, no `_created`), from the catalog's declarations."""
    base = {"fairness_id": catalog.LLMD_DEFAULT_FAIRNESS_ID, "model_name": "m", "priority": "0",
            "target_model_name": "m"}

    def number(value: float) -> str:
        return str(int(value)) if value == int(value) else repr(value)

    def labels(extra: dict[str, str], le: str | None = None) -> str:
        text = ",".join(f'{k}="{v}"' for k, v in sorted({**base, **extra}.items()))
        return "{" + text + (f',le="{le}"' if le is not None else "") + "}"

    lines: list[str] = []

    def histogram(metric: catalog.Metric, series: list[tuple[dict[str, str], Hist]]) -> None:
        lines.extend([f"# HELP {metric.name} [ALPHA] {metric.help}", f"# TYPE {metric.name} histogram"])
        for extra, hist in series:
            assert hist.bounds == metric.buckets
            cumulative = 0
            for bound, count in zip((*metric.buckets, math.inf), hist.counts, strict=True):
                cumulative += count
                le = "+Inf" if bound == math.inf else number(bound)
                lines.append(f"{metric.name}_bucket{labels(extra, le)} {cumulative}")
            lines.append(f"{metric.name}_sum{labels(extra)} {number(hist.total)}")
            lines.append(f"{metric.name}_count{labels(extra)} {cumulative}")

    def counter(metric: catalog.Metric, series: list[tuple[dict[str, str], float]]) -> None:
        name = metric.name + "_total"
        lines.extend([f"# HELP {name} [ALPHA] {metric.help}", f"# TYPE {name} counter"])
        lines.extend(f"{name}{labels(extra)} {number(value)}" for extra, value in series)

    counter(catalog.LLMD_REQUESTS, [({}, metrics.routed)])
    counter(catalog.LLMD_ERRORS, [({"error_code": code}, n) for code, n in metrics.errors.items()])
    histogram(catalog.LLMD_DURATION, [({}, metrics.e2e)])
    histogram(catalog.LLMD_TTFT, [({"streaming": "true"}, metrics.ttft),
                                  ({"streaming": "false"}, metrics.ttft_unstreamed)])
    histogram(catalog.LLMD_TPOT, [({}, metrics.tpot)])
    histogram(catalog.LLMD_ITL, [({}, metrics.itl)])
    return "\n".join(lines) + "\n"


def _figures(before: str, after: str, target: Target = ENTRY) -> Derived:
    """The figures of one target scraped twice, one second apart, read in its dialect."""
    parser = Parser()
    history = History(keep_seconds=10.0)
    for when, text in ((0.0, before), (1.0, after)):
        series, refused = dialect.read(target, parser.parse(text))
        assert refused is None
        history.add(when, series)
    return derive([history.window(1.0, 1.0)], gpus=0, slos_seconds={"ttft": TTFT_THRESHOLD_S},
                  window_seconds=1.0)


def _rendered(name: str, go: bool = False) -> tuple[str, str]:
    """Two scrapes of an entrypoint around the traffic. A router's error series appear with its
    first error (client_golang, prometheus_client alike): one of each before the first scrape, so
    that the window sees them grow, as it would on a router that has run a while."""
    metrics = EntrypointMetrics("m", name)
    _traffic(metrics, served=1, failed=1, bad_input=1, seed=1)
    empty = go_exposition(metrics) if go else metrics.render().decode()
    _traffic(metrics)
    return empty, go_exposition(metrics) if go else metrics.render().decode()


@pytest.mark.parametrize(("name", "go"), [("llm-d", True), ("llm-d", False)])
def test_llmd_gives_what_vllm_gives_for_the_same_traffic(name: str, go: bool) -> None:
    vllm = _figures(*_rendered("vllm"))
    llmd = _figures(*_rendered(name, go))
    # Requests and failures: each request once, bad input nowhere.
    assert vllm.requests_per_second == pytest.approx(SERVED + FAILED)
    assert llmd.requests_per_second == pytest.approx(SERVED + FAILED)
    assert llmd.failed_requests_per_second == {"error": pytest.approx(FAILED)}
    assert vllm.failed_requests_per_second.get("error") == pytest.approx(FAILED)
    assert llmd.failures_counted is True
    assert llmd.requests_per_second_by_reason == {"stop": pytest.approx(SERVED),
                                                  "error": pytest.approx(FAILED)}
    # Every latency kind, on each one's own buckets: the same observations and means; quantiles
    # within the coarser bucket set's resolution.
    for kind, vllm_metric in slo.SLO_HISTOGRAMS.items():
        mine, theirs = llmd.latency[kind], vllm.latency[kind]
        assert mine.observations == theirs.observations, kind
        assert mine.mean == pytest.approx(theirs.mean), kind
        llmd_metric = catalog.LLMD_DIALECT.histogram_for(vllm_metric)
        assert llmd_metric is not None
        for q in ("0.5", "0.99"):
            value = theirs.quantiles[q]
            resolution = max(bucket_width(value, vllm_metric.buckets),
                             bucket_width(value, llmd_metric.buckets))
            assert abs(mine.quantiles[q] - value) < resolution, (kind, q, mine, theirs)
    # Attainment at a threshold on both bucket sets: exactly the same.
    assert llmd.attainment["ttft"].ratio == pytest.approx(vllm.attainment["ttft"].ratio)
    assert llmd.attainment["ttft"].exact and vllm.attainment["ttft"].exact


def test_deprecated_names_beside_the_current_ones_are_read_once() -> None:
    before, after = _rendered("llm-d")
    assert catalog.LLMD_LEGACY_REQUESTS.sample_names[0] in after
    assert dialect.detect(k[0] for k in Parser().parse(after).keys) is catalog.LLMD_DIALECT
    assert _figures(before, after).requests_per_second == pytest.approx(SERVED + FAILED)


def test_the_deprecated_names_alone_give_requests_and_e2e() -> None:
    figures = _figures(*_rendered("llm-d-legacy"))
    assert figures.requests_per_second == pytest.approx(SERVED + FAILED)
    assert figures.failed_requests_per_second == {"error": pytest.approx(FAILED)}
    assert figures.latency["e2el"].observations == SERVED + FAILED
    assert "ttft" not in figures.latency and "itl" not in figures.latency


def test_production_stack_as_the_entrypoint_gives_requests_and_e2e() -> None:
    figures = _figures(*_rendered("production-stack"))
    assert figures.requests_per_second == pytest.approx(SERVED + FAILED)
    assert figures.failed_requests_per_second == {"error": pytest.approx(FAILED)}
    assert figures.latency["e2el"].observations == SERVED + FAILED
    assert "ttft" not in figures.latency


def test_production_stack_router_series_on_an_instance_are_refused() -> None:
    _, after = _rendered("production-stack")
    instance = Target("tp2", "tp2-0", "colocated", "http://127.0.0.1:2/metrics", 2)
    _, refused = dialect.read(instance, Parser().parse(after))
    assert refused is not None and "\n" not in refused
    assert "production-stack" in refused and "http://127.0.0.1:2/metrics" in refused
    assert "entrypoint" in refused
    # an engine's own families are not refused
    _, vllm_after = _rendered("vllm")
    assert dialect.read(instance, Parser().parse(vllm_after))[1] is None


def test_a_routers_extra_labels_are_summed_never_multiplied() -> None:
    ttft = catalog.LLMD_TTFT.name
    lines = [f"# TYPE {ttft} histogram"]
    for priority, fairness, count in (("0", "a", 3), ("1", "a", 4), ("0", "b", 5)):
        head = f'fairness_id="{fairness}",model_name="m",priority="{priority}",streaming="true"'
        lines += [f'{ttft}_bucket{{{head},target_model_name="m",le="1"}} {count}',
                  f'{ttft}_bucket{{{head},target_model_name="m",le="+Inf"}} {count}',
                  f'{ttft}_sum{{{head},target_model_name="m"}} {count * 0.5}',
                  f'{ttft}_count{{{head},target_model_name="m"}} {count}']
    series = dialect.translate(Parser().parse("\n".join(lines) + "\n"), catalog.LLMD_DIALECT)
    counts = {k: v for k, v in series.as_dict().items() if k[0] == catalog.TTFT.name + "_count"}
    assert list(counts.values()) == [12.0]
    assert dict(next(iter(counts))[1]) == {"model_name": "m"}


def test_vllm_priority_label_is_summed_on_engine_histograms() -> None:
    """vLLM under --scheduling-policy priority puts a bucketed `priority` label ("0", ">1", ...) on
    its finished-request families (checked against source only, docs/real-vllm.md)."""
    ttft = catalog.TTFT.name
    body = f"# TYPE {ttft} histogram\n" + "".join(
        f'{ttft}_bucket{{engine="0",le="+Inf",model_name="m",priority="{p}"}} {n}\n'
        f'{ttft}_count{{engine="0",model_name="m",priority="{p}"}} {n}\n'
        f'{ttft}_sum{{engine="0",model_name="m",priority="{p}"}} {n}\n' for p, n in (("0", 2), (">1", 5)))
    empty = body.replace(" 2\n", " 0\n").replace(" 5\n", " 0\n")
    instance = Target("tp2", "tp2-0", "colocated", "http://127.0.0.1:2/metrics", 2)
    assert _figures(empty, body, instance).latency["ttft"].observations == 7


def test_an_entrypoint_serving_no_known_dialect_is_left_as_it_is() -> None:
    text = "# TYPE envoy_cluster_upstream_rq counter\nenvoy_cluster_upstream_rq_total 3\n"
    series = Parser().parse(text)
    assert dialect.read(ENTRY, series) == (series, None)
    assert dialect.served_families(text) == "1 families: envoy_cluster_upstream_rq"
    assert dialect.served_families("# nothing\n") == "no metric families"
    assert dialect.translate(ParsedSeries((), []), catalog.LLMD_DIALECT).keys == ()


def _pd_spec(**entrypoint: str) -> dict[str, object]:
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    for topology in data["topologies"]:
        if topology["name"] == "pd1p1d":
            topology["entrypoint"].update(entrypoint)
    return data


def test_an_unknown_dialect_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown dialect 'envoy'") as info:
        FleetSpec.model_validate(_pd_spec(dialect="envoy"))
    assert all(name in str(info.value) for name in catalog.DIALECTS)


def test_the_spec_error_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_pd_spec(dialect="envoy")))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "entrypoint.dialect" in message and "llm-d" in message and "\n" not in message


def test_the_bucket_warning_uses_the_dialects_buckets() -> None:
    data = _pd_spec()
    data["slos"] = {"ttft_ms": 250, "tpot_ms": 100}  # both boundaries of vLLM's buckets
    assert slo_warnings(FleetSpec.model_validate(data)) == []
    data = _pd_spec(dialect="llm-d")
    data["slos"] = {"ttft_ms": 250, "tpot_ms": 100}
    warnings = slo_warnings(FleetSpec.model_validate(data))
    assert len(warnings) == 1, warnings  # 100 ms is one of llm-d's TPOT boundaries, 250 ms no TTFT one
    assert catalog.LLMD_TTFT.name in warnings[0] and "dialect llm-d" in warnings[0]
    assert "200 ms and 400 ms" in warnings[0]


@pytest.mark.parametrize(("entrypoint", "message"), [
    ({"metrics_url": "http://epp:9090/metrics", "selector": {"app": "epp"}},
     "give metrics_url (a fixed address) or selector"),
    ({"metrics_url": None, "selector": {}}, "selector: give at least one pod label"),
    ({"metrics_url": None, "dialect": "llm-d"}, "dialect needs metrics_url or selector"),
])
def test_a_router_found_on_kubernetes_is_one_target(tmp_path: Path, entrypoint: dict[str, object],
                                                     message: str) -> None:
    """A router's pods (entrypoint.selector) replace its fixed address, never add to it: both would
    scrape it twice and count each request twice."""
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    for topology in data["topologies"]:
        if topology["name"] == "pd1p1d":
            topology["entrypoint"].update(entrypoint)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert "entrypoint" in str(info.value) and message in str(info.value) and "\n" not in str(info.value)
