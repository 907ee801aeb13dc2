"""The fast exposition parser against prometheus_client's parser: same samples, on the real vLLM
payloads and on generated ones (hypothesis), plus aliases and broken payloads."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from crossover import catalog
from crossover.exporter.parse import ParseError, Parser, parse_all, wanted_names
from tests.helpers import FIXTURES

REAL_PAYLOADS = sorted(FIXTURES.glob("vllm-*.prom"))


def _key(value: float) -> object:
    return "nan" if math.isnan(value) else value


def reference(text: str, wanted: set[str] | None = None) -> list[tuple[str, tuple, object]]:
    """Samples as prometheus_client reads them, optionally only the wanted names."""
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if wanted is None or sample.name in wanted:
                out.append((sample.name, tuple(sorted(sample.labels.items())), _key(sample.value)))
    return out


def mine(samples: list[tuple[str, tuple, float]]) -> list[tuple[str, tuple, object]]:
    return [(name, labels, _key(value)) for name, labels, value in samples]


def test_real_payloads_exist():
    assert len(REAL_PAYLOADS) >= 3, "captured real vLLM payloads are missing from tests/fixtures"


@pytest.mark.parametrize("path", REAL_PAYLOADS, ids=lambda p: p.name)
def test_real_vllm_payloads_match_prometheus_client(path):
    text = path.read_text()
    parser = Parser()
    wanted = set(parser.wanted)
    got = mine(parser.samples(text))
    assert got == reference(text, wanted)
    assert len(got) > 80  # the histograms the derivation reads are all there
    assert mine(parse_all(text)) == reference(text)


def test_current_names_map_to_themselves_and_counters_carry_total():
    series = Parser().series(REAL_PAYLOADS[0].read_text())
    names = {name for name, _ in series}
    assert catalog.GENERATION_TOKENS.name + "_total" in names
    assert catalog.TTFT.name + "_bucket" in names
    assert catalog.KV_CACHE_USAGE.name in names


LEGACY = f"""# HELP {catalog.KV_CACHE_USAGE.aliases[0]} old name
# TYPE {catalog.KV_CACHE_USAGE.aliases[0]} gauge
{catalog.KV_CACHE_USAGE.aliases[0]}{{engine="0",model_name="m"}} 0.25
# TYPE {catalog.ITL.aliases[0]} histogram
{catalog.ITL.aliases[0]}_bucket{{engine="0",le="0.01",model_name="m"}} 1.0
{catalog.ITL.aliases[0]}_bucket{{engine="0",le="+Inf",model_name="m"}} 3.0
{catalog.ITL.aliases[0]}_count{{engine="0",model_name="m"}} 3.0
{catalog.ITL.aliases[0]}_sum{{engine="0",model_name="m"}} 0.5
"""


def test_legacy_names_map_through_the_aliases():
    series = Parser().series(LEGACY)
    labels = (("engine", "0"), ("model_name", "m"))
    assert series[(catalog.KV_CACHE_USAGE.name, labels)] == 0.25
    assert series[(catalog.ITL.name + "_count", labels)] == 3.0
    inf_bucket = (("engine", "0"), ("le", "+Inf"), ("model_name", "m"))
    assert series[(catalog.ITL.name + "_bucket", inf_bucket)] == 3.0


def test_current_name_wins_when_both_are_exposed():
    both = LEGACY + f'{catalog.KV_CACHE_USAGE.name}{{engine="0",model_name="m"}} 0.5\n'
    series = Parser().series(both)
    kv = [v for (name, _), v in series.items() if name == catalog.KV_CACHE_USAGE.name]
    assert kv == [0.5]


RUNNING = catalog.NUM_REQUESTS_RUNNING.name
WAITING = catalog.NUM_REQUESTS_WAITING.name
TRICKY = r"""# HELP RUNNING with } and { in help
# TYPE RUNNING gauge
RUNNING{model_name="a\"b}c",engine="0"} 3 1700000000000
RUNNING{ engine = "1" , model_name="x\\y\nz", } NaN
# TYPE PREEMPTIONS_total counter
PREEMPTIONS_total{model_name="m",engine="0"} +Inf
PREEMPTIONS_created{model_name="m",engine="0"} 1.7e9
# TYPE WAITING gauge
WAITING -Inf
""".replace("RUNNING", RUNNING).replace("WAITING", WAITING)
TRICKY = TRICKY.replace("PREEMPTIONS", catalog.NUM_PREEMPTIONS.name)


def test_escapes_order_spacing_special_values_and_timestamps():
    parser = Parser()
    got = mine(parser.samples(TRICKY))
    assert got == reference(TRICKY, set(parser.wanted))
    assert (RUNNING, (("engine", "0"), ("model_name", 'a"b}c')), 3.0) in got
    assert (RUNNING, (("engine", "1"), ("model_name", "x\\y\nz")), "nan") in got
    assert (WAITING, (), -math.inf) in got


OPENMETRICS = """# TYPE GENERATION counter
# HELP GENERATION Number of generation tokens processed.
GENERATION_total{engine="0",model_name="m"} 42.0 1700000000.123
GENERATION_created{engine="0",model_name="m"} 1.7e9
# TYPE TTFT histogram
TTFT_bucket{engine="0",le="0.1",model_name="m"} 1.0 # {trace_id="a"} 0.05 1.7e9
TTFT_bucket{engine="0",le="+Inf",model_name="m"} 2.0
TTFT_count{engine="0",model_name="m"} 2.0
TTFT_sum{engine="0",model_name="m"} 0.3
# EOF
""".replace("GENERATION", catalog.GENERATION_TOKENS.name).replace("TTFT", catalog.TTFT.name)


def test_openmetrics_with_exemplars_created_and_eof():
    series = Parser().series(OPENMETRICS)
    labels = (("engine", "0"), ("model_name", "m"))
    assert series[(catalog.GENERATION_TOKENS.name + "_total", labels)] == 42.0
    assert series[(catalog.TTFT.name + "_bucket",
                   (("engine", "0"), ("le", "0.1"), ("model_name", "m")))] == 1.0
    assert len(series) == 5


@pytest.mark.parametrize("broken", [
    # a line of a family the exporter does not read, inserted half-way (the simulator's fault)
    'vllm_simulator_fault{engine="0",model_name= 1.0 garbage',
    # a wanted family with a bad value, and with an unterminated label set
    RUNNING + '{engine="0"} one',
    RUNNING + '{engine="0" 1',
])
def test_broken_lines_fail_the_payload(broken):
    text = REAL_PAYLOADS[0].read_text()
    lines = text.split("\n")
    lines.insert(len(lines) // 2, broken)
    with pytest.raises(ParseError):
        Parser().samples("\n".join(lines))


def test_truncated_inside_a_wanted_line_fails():
    text = REAL_PAYLOADS[0].read_text()
    cut = text.index(catalog.TTFT.name + "_bucket{") + 30
    with pytest.raises(ParseError):
        Parser().samples(text[:cut])


def test_empty_payload_has_no_samples():
    assert Parser().samples("") == []
    assert Parser().samples("# only a comment\n\n") == []


# --- property test: generated payloads ------------------------------------------------------------------
WANTED = sorted(wanted_names())
LABEL_NAMES = ["engine", "model_name", "le", "finished_reason", "a", "_b", "zz"]
label_values = st.text(alphabet=st.sampled_from([*'ab {}=,#"\\\n\t:.', "é"]), max_size=8)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**6), max_value=10**12).map(float),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float, style: int) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value) if style % 2 else f"{value:.17g}"


@st.composite
def sample_lines(draw, name: str) -> str:
    names = draw(st.lists(st.sampled_from(LABEL_NAMES), unique=True, max_size=4))
    pairs = [f'{label}{draw(st.sampled_from(["=", " = "]))}"{_escape(draw(label_values))}"'
             for label in names]
    separator = draw(st.sampled_from([",", ", "]))
    trailing = draw(st.sampled_from(["", ","])) if pairs else ""
    label_text = "{" + separator.join(pairs) + trailing + "}" if pairs or draw(st.booleans()) else ""
    value = _format_value(draw(values), draw(st.integers(0, 1)))
    timestamp = draw(st.sampled_from(["", " 1700000000000", " -5"]))
    return f"{name}{label_text} {value}{timestamp}"


FAMILY_BASES = sorted({name for metric in catalog.CATALOG.metrics for name in metric.all_names}
                      | {catalog.TTFT.name[:9], RUNNING + "_extra", "python_gc", "x"})


@st.composite
def payloads(draw) -> str:
    """Valid text-format payloads as exporters write them: each family one group, counters typed
    with their `_total` name, histograms with `_bucket`/`_count`/`_sum`, optional HELP/TYPE lines
    and `_created` samples, comments, any label order and spacing, special values, timestamps."""
    bases = draw(st.lists(st.one_of(st.sampled_from(FAMILY_BASES),
                                    st.from_regex(r"[a-z_][a-z0-9_:]{0,10}", fullmatch=True)),
                          unique=True, max_size=6))
    lines: list[str] = []
    seen: set[str] = set()
    for base in bases:
        metric = catalog.CATALOG.lookup(base)
        kinds = ["gauge", "counter", "untyped", "histogram"]
        # A catalog family mostly keeps its real type, so that wanted samples are common.
        kind = metric.type.value if metric and draw(st.integers(0, 4)) else draw(st.sampled_from(kinds))
        names = {"counter": [base + "_total", base + "_created"],
                 "histogram": [base + "_bucket", base + "_count", base + "_sum", base + "_created"]
                 }.get(kind, [base])
        if seen & set(names) or any(n in seen for n in (base, base + "_total")):
            continue
        seen.update(names)
        seen.add(base)
        typed = base + "_total" if kind == "counter" else base
        if draw(st.booleans()):
            lines.append(f"# HELP {typed} some help {{with}} braces")
        if draw(st.integers(0, 4)):
            lines.append(f"# TYPE {typed} {kind}")
        for _ in range(draw(st.integers(0, 5))):
            lines.append(draw(sample_lines(draw(st.sampled_from(names)))))
            if draw(st.integers(0, 9)) == 0:
                lines.append("# a comment")
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


def series_reference(parser: Parser, samples: list[tuple[str, tuple, float]]) -> dict:
    """What `Parser.series` must give: samples keyed by current name, the current name winning
    per family where a payload exposes both (the straightforward per-sample resolution)."""
    best: dict[str, int] = {}
    for name, _labels, _value in samples:
        entry = parser.wanted[name]
        best[entry.family] = min(best.get(entry.family, entry.alias_rank), entry.alias_rank)
    out = {}
    for name, labels, value in samples:
        entry = parser.wanted[name]
        if entry.alias_rank == best[entry.family]:
            out[(entry.canonical, labels)] = _key(value)
    return out


SHARED_PARSER = Parser()  # its caches carry over from payload to payload, as in the exporter


def _prometheus_client_reads(text: str) -> list | None:
    try:
        return reference(text)
    except Exception:
        return None


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads())
def test_same_samples_as_prometheus_client(text):
    expected_all = _prometheus_client_reads(text)
    if expected_all is None:
        # prometheus_client rejects it (e.g. a value it cannot read in a family it checks): our
        # parser must either reject it too or return only what it could read; nothing to compare.
        return
    parser = Parser()
    wanted = set(parser.wanted)
    assert mine(parser.samples(text)) == [s for s in expected_all if s[0] in wanted]
    assert mine(parse_all(text)) == expected_all
    # The scrape path (per-block caches, no per-sample tuples) agrees with the samples.
    expected_series = series_reference(parser, parser.samples(text))
    for reader in (parser, SHARED_PARSER):
        assert {k: _key(v) for k, v in reader.series(text).items()} == expected_series


@pytest.mark.parametrize("path", REAL_PAYLOADS, ids=lambda p: p.name)
def test_series_match_the_samples_on_real_payloads(path):
    text = path.read_text()
    parser = Parser()
    for _ in range(2):  # cold and warm caches
        parsed = parser.parse(text)
        assert len(parsed.keys) == len(set(parsed.keys))
        expected = series_reference(parser, parser.samples(text))
        assert {k: _key(v) for k, v in parsed.as_dict().items()} == expected


def test_series_of_a_payload_with_a_broken_unread_line_in_a_later_block_is_refused():
    # The line counts are checked over all unread blocks at once: an odd block is found again.
    text = REAL_PAYLOADS[0].read_text()
    lines = text.split("\n")
    lines.insert(len(lines) - 3, 'vllm_simulator_fault{engine="0"} 1.0 garbage garbage')
    with pytest.raises(ParseError):
        Parser().parse("\n".join(lines))


def test_cached_block_shapes_follow_values_timestamps_and_mixed_families():
    """The scrape path caches each wanted block's shape by its sample heads: the same heads with
    new values, with timestamps (float() refuses them), with a bad `_created` value (not read) or
    with lines of two wanted families in one block must read as the per-sample path does."""
    parser = Parser()
    run = catalog.NUM_REQUESTS_RUNNING.name
    wait = catalog.NUM_REQUESTS_WAITING.name
    ttft = catalog.TTFT.name
    block = (f'# TYPE {ttft} histogram\n'
             f'{ttft}_bucket{{le="0.1"}} {{a}}\n{ttft}_bucket{{le="+Inf"}} {{b}}\n'
             f'{ttft}_count {{b}}\n{ttft}_sum 0.5\n{ttft}_created {{c}}\n'
             f'# TYPE {run} gauge\n{run} 3\n{wait} {{w}}\n')
    for a, b, c, w in [("1", "2", "1.7e9", "4"), ("5", "9", "1.7e9", "0"),
                       ("6 1700000000", "10 1700000000", "1.7e9", "1"), ("7", "11", "oops", "2")]:
        text = block.replace("{a}", a).replace("{b}", b).replace("{c}", c).replace("{w}", w)
        got = {k: _key(v) for k, v in parser.series(text).items()}
        assert got == series_reference(parser, parser.samples(text))
        assert got[(ttft + "_bucket", (("le", "+Inf"),))] == float(b.split()[0])
        assert got[(wait, ())] == float(w)
    with pytest.raises(ParseError):
        parser.parse(block.replace("{a}", "1").replace("{b}", "x").replace("{c}", "1").replace("{w}", "1"))
