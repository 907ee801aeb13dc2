"""A fast parser for the Prometheus text format (0.0.4) and OpenMetrics that keeps only the samples
the exporter reads.

Why hand-written: prometheus_client's parser builds every family of a 50 KB vLLM payload (about
14 ms); a scrape cycle over 1,000 targets has about 1 ms per target in all. This parser splits the
payload into `# TYPE` blocks and skips, at C speed, blocks whose family the exporter does not read;
it parses and validates every line of the families it reads, and every line of a block that does
not look like one family (so an inserted broken line fails the scrape as it would in Prometheus).
Lines of families it does not read are checked for their name only: one count of family-name lines
per block, and the line and comment totals once per payload (numpy), a block that disagrees being
found again block by block. `Parser.parse`, the scrape path, reads wanted blocks straight into key
and value lists through a cache of sample heads (`name{labels}`), with no per-sample tuple.

Values, label escapes (\\\\, \\", \\n), any label order, spacing, comments, NaN/+Inf/-Inf,
timestamps, OpenMetrics `# EOF`, `_created` lines and exemplars are handled. A property test
(tests/exporter/test_exporter_parse.py) checks it against prometheus_client on generated payloads.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from crossover import catalog

Labels = tuple[tuple[str, str], ...]  # sorted by label name
SeriesKey = tuple[str, Labels]  # (canonical sample name, labels)


class ParseError(ValueError):
    """A payload that is not valid exposition text; the message names the line."""


class ParsedSeries(NamedTuple):
    """The wanted series of one payload as parallel sequences (what the history stores).

    Keys are (current sample name, labels), legacy names mapped, the current name winning where
    both are exposed; key objects are shared between payloads of the same layout. A payload that
    repeats a series (invalid exposition) may hold it twice here: `unique()` resolves it as a dict
    would (first position, last value)."""

    keys: tuple[SeriesKey, ...]
    values: list[float]

    def unique(self) -> ParsedSeries:
        if len(set(self.keys)) == len(self.keys):
            return self
        merged = dict(zip(self.keys, self.values, strict=True))
        return ParsedSeries(tuple(merged), list(merged.values()))

    def as_dict(self) -> dict[SeriesKey, float]:
        return dict(zip(self.keys, self.values, strict=True))


# Families the derivation reads. Everything else on /metrics is skipped while parsing.
DERIVED_FAMILIES: tuple[catalog.Metric, ...] = (
    catalog.NUM_REQUESTS_RUNNING, catalog.NUM_REQUESTS_WAITING, catalog.KV_CACHE_USAGE,
    catalog.NUM_PREEMPTIONS, catalog.PROMPT_TOKENS, catalog.GENERATION_TOKENS, catalog.REQUEST_SUCCESS,
    catalog.TTFT, catalog.TPOT, catalog.ITL, catalog.E2E_LATENCY, catalog.REQUEST_NUM_PREEMPTIONS,
    *(metric for connector in catalog.KV_CONNECTORS.values()
      for metric in (connector.xfer_time, connector.bytes, connector.failed_transfers)),
)


# The families of every router dialect but vLLM's (crossover.catalog.DIALECTS): kept so that
# crossover.exporter.dialect can read an entrypoint in its dialect and recognise a router's series.
ROUTER_FAMILIES: tuple[catalog.Metric, ...] = tuple(dict.fromkeys(
    metric for dialect in catalog.DIALECTS.values() if dialect is not catalog.VLLM_DIALECT
    for metric in dialect.families))


def _sample_suffixes(metric: catalog.Metric) -> tuple[str, ...]:
    if metric.type is catalog.MetricType.COUNTER:
        return ("_total",)
    if metric.type is catalog.MetricType.HISTOGRAM:
        return ("_bucket", "_sum", "_count")
    return ("",)


@dataclass(frozen=True)
class WantedName:
    """How one exposed sample name maps onto the catalog."""

    canonical: str  # the current sample name (aliases mapped)
    family: str  # the catalog family name (current)
    alias_rank: int  # 0 for the current name, 1.. for older aliases


def wanted_names(families: Iterable[catalog.Metric] = (*DERIVED_FAMILIES, *ROUTER_FAMILIES)
                 ) -> dict[str, WantedName]:
    """Every sample name (current and legacy) of the given families, mapped to its current name."""
    out: dict[str, WantedName] = {}
    for metric in families:
        for rank, name in enumerate(metric.all_names):
            for suffix in _sample_suffixes(metric):
                out[name + suffix] = WantedName(metric.name + suffix, metric.name, rank)
    return out


# --- line grammar (the strict path) ---------------------------------------------------------------
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\\n]|\\.)*"[ \t]*'
_LINE_RE = re.compile(
    rf"({_NAME})[ \t]*(?:\{{((?:{_LABEL},)*(?:{_LABEL})?)\}})?[ \t]*(\S+)(?:[ \t]+([^ \t#]\S*))?"
    r"[ \t]*(?:#.*)?")
_LABEL_RE = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(?:,|$)')
# One sample line of a wanted block: its head (name and label text without any "}"), then blank
# and the rest.
_BLOCK_LINE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}\n]*\})?)([ \t][^\n]*)$", re.MULTILINE)
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
# A wanted block's shape: how to pick the kept lines' values (None: all lines), and per run of one
# (family, alias rank) group: the group, its keys, and its slice of the kept values.
_Shape = tuple[Callable[[Sequence[Any]], Sequence[Any]] | None,
               tuple[tuple[tuple[str, int], tuple[SeriesKey, ...], int, int], ...]]


def _split_head(head: str) -> tuple[str, str]:
    """`name{labels}` -> (name, label text); `name` -> (name, "")."""
    brace = head.find("{")
    return (head, "") if brace == -1 else (head[:brace], head[brace + 1:-1])
_NAME_RE = re.compile(_NAME)
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


def _parse_labels(text: str) -> Labels | None:
    """A label set `a="x",b="y"` (without braces) as sorted pairs; None if it is not one."""
    pairs: dict[str, str] = {}
    pos = 0
    end = len(text)
    while pos < end:
        match = _LABEL_RE.match(text, pos)
        if match is None:
            return None if text[pos:].strip(" \t") else tuple(sorted(pairs.items()))
        name = match.group(1)
        if name in pairs:
            return None
        pairs[name] = _unescape(match.group(2))
        pos = match.end()
    return tuple(sorted(pairs.items()))


def _sample_lines(text: str) -> int:
    """text.count("\n") - text.count("\n#"): the lines not starting with "#" when each line is
    preceded by "\n". With numpy on the UTF-8 bytes (neither byte occurs inside a multi-byte
    character), several times faster than the two str.count passes."""
    data = np.frombuffer(text.encode(), dtype=np.uint8)
    starts = np.flatnonzero(data == 10) + 1
    starts = starts[starts < len(data)]
    return len(starts) + (text[-1] == "\n") - int(np.count_nonzero(data[starts] == 35))


def _value(name: str, label_text: str, rest: str) -> float:
    """The value of a sample line's rest (` value [timestamp] [# exemplar]`); ParseError if bad."""
    fields = rest.split()
    try:
        value = float(fields[0])
        if len(fields) > 1 and fields[1] != "#":
            float(fields[1])  # a timestamp; samples are stamped with the scrape time instead
            if len(fields) > 2 and fields[2] != "#":
                raise ValueError("trailing text")
    except (ValueError, IndexError):
        raise ParseError(f"bad sample line: {name}{{{label_text}}}{rest[:80]!r}") from None
    return value


def strict_line(line: str) -> tuple[str, Labels, float]:
    """One sample line through the full grammar: (name, labels, value) or ParseError."""
    match = _LINE_RE.fullmatch(line.rstrip("\r"))
    if match is None:
        raise ParseError(f"bad sample line: {line[:120]!r}")
    labels = _parse_labels(match.group(2) or "")
    if labels is None:
        raise ParseError(f"bad label set: {line[:120]!r}")
    try:
        value = float(match.group(3))
        if match.group(4) is not None:
            float(match.group(4))
    except ValueError:
        raise ParseError(f"bad sample value: {line[:120]!r}") from None
    return match.group(1), labels, value


class _SeriesSink:
    """Collects the samples of one payload for `Parser.parse`, grouped by (catalog family, alias
    rank) so that aliases are resolved per group rather than per sample."""

    __slots__ = ("groups", "parser")

    def __init__(self, parser: Parser) -> None:
        self.parser = parser
        # (family, alias rank) -> ([keys], [values]), in order of first appearance
        self.groups: dict[tuple[str, int], tuple[list[SeriesKey], list[float]]] = {}

    def append(self, sample: tuple[str, Labels, float]) -> None:
        """A sample from the line-by-line path."""
        name, labels, value = sample
        entry = self.parser.wanted[name]
        group = self.parser._group(entry)
        keys, values = self.groups.get(group) or self.groups.setdefault(group, ([], []))
        keys.append((entry.canonical, labels))
        values.append(value)

    def result(self) -> ParsedSeries:
        groups = self.groups
        if not groups:
            return ParsedSeries((), [])
        best: dict[str, int] = {}
        for family, rank in groups:
            if rank < best.get(family, rank + 1):
                best[family] = rank
        if len(groups) == 1:
            keys, values = next(iter(groups.values()))
            return ParsedSeries(tuple(keys), values)
        all_keys: list[SeriesKey] = []
        all_values: list[float] = []
        for (family, rank), (keys, values) in groups.items():
            if best[family] == rank:
                all_keys.extend(keys)
                all_values.extend(values)
        return ParsedSeries(tuple(all_keys), all_values)


class Parser:
    """Parses payloads for a fixed set of wanted sample names; reusable across targets and cycles
    (it caches parsed label sets and sample heads, which repeat from scrape to scrape)."""

    _CACHE_LIMIT = 200_000
    _SHAPE_LIMIT = 16_384

    def __init__(self, wanted: Mapping[str, WantedName] | None = None) -> None:
        self.wanted: Mapping[str, WantedName] = wanted_names() if wanted is None else wanted
        self._labels: dict[str, Labels] = {}
        # "# TYPE" line text -> (the block may hold a wanted sample, "\n" + family name, family)
        self._blocks: dict[str, tuple[bool, str, str]] = {}
        # sample head `name{labels}` -> (series key, (family, alias rank)) for wanted names
        self._heads: dict[str, tuple[SeriesKey, tuple[str, int]]] = {}
        self._groups: dict[tuple[str, int], tuple[str, int]] = {}
        # (family, the block's sample heads in order) -> the block's shape
        self._shapes: dict[tuple[str, tuple[str, ...]], _Shape] = {}

    # -- public ---------------------------------------------------------------------------------------
    def samples(self, text: str) -> list[tuple[str, Labels, float]]:
        """(exposed sample name, labels, value) for every wanted sample, in payload order."""
        out: list[tuple[str, Labels, float]] = []
        if not self._scan(text, out, False):
            out.clear()
            self._scan(text, out, True)
        return out

    def parse(self, text: str) -> ParsedSeries:
        """Wanted samples as (current sample name, labels) keys and values; legacy names are mapped
        through the catalog's aliases, and where a target exposes both names the current one wins.
        The scrape path's parser: no per-sample tuples beyond the keys, which are cached."""
        sink = _SeriesSink(self)
        if not self._scan(text, sink, False):
            sink = _SeriesSink(self)
            self._scan(text, sink, True)
        return sink.result()

    def series(self, text: str) -> dict[SeriesKey, float]:
        """`parse` as a dict keyed by (current sample name, labels)."""
        return self.parse(text).as_dict()

    # -- scanning --------------------------------------------------------------------------------------
    def _group(self, entry: WantedName) -> tuple[str, int]:
        key = (entry.family, entry.alias_rank)
        return self._groups.setdefault(key, key)

    def _block_plan(self, header: str) -> tuple[bool, str, str]:
        """For a `# TYPE` line's text: (may hold a wanted sample: some wanted name starts with the
        family name, "\\n" + family, family)."""
        plan = self._blocks.get(header)
        if plan is None:
            family = header.strip(" \t").partition(" ")[0]
            if not _NAME_RE.fullmatch(family):
                family = ""  # not a metric name (e.g. "#x", whose lines would count as comments too)
            wanted = bool(family) and any(name.startswith(family) for name in self.wanted)
            plan = (wanted, "\n" + family, family)
            if len(self._blocks) >= self._CACHE_LIMIT:
                self._blocks.clear()
            self._blocks[header] = plan
        return plan

    def _scan(self, text: str, out: list[tuple[str, Labels, float]] | _SeriesSink, careful: bool) -> bool:
        """Walk the payload block by block. Blocks of unread families are checked by counting
        lines: each of their lines must be a comment or start with the family's name. Unless
        `careful`, only the family-name lines are counted per block, and the line and comment counts
        are checked once over all such blocks (each block has at least as many lines as family lines
        plus comments, so the sums agree only when every block does); False when they disagree,
        having added samples: the caller starts again, carefully, to find the odd block."""
        # Every line is preceded by "\n" and the last one ends without it, so that str.count
        # of "\n" counts lines exactly.
        text = "\n" + text.rstrip("\n")
        if text == "\n":
            return True
        pieces = text.split("\n# TYPE ")
        preamble = pieces[0]
        if len(pieces) == 1:
            self._lines(preamble, 0, len(preamble), None, out)
            return True
        # Lines minus comment lines outside the unread blocks (a "# TYPE" line counts in both).
        checked = 0
        if preamble:
            self._lines(preamble, 0, len(preamble), None, out)
            checked += preamble.count("\n") - preamble.count("\n#")
        family_lines = 0
        plans = self._blocks
        for index in range(1, len(pieces)):
            piece = pieces[index]  # the "# TYPE" line's text, then the block's lines, each after "\n"
            line_end = piece.find("\n")
            header = piece if line_end == -1 else piece[:line_end]
            plan = plans.get(header) or self._block_plan(header)
            if plan[0]:
                block = "" if line_end == -1 else piece[line_end:]
                if isinstance(out, _SeriesSink):
                    lines = self._block_series(block, plan[2], out)
                else:
                    lines = self._block(block, plan[2], out)
                if lines is None:
                    self._lines(block, 0, len(block), plan[2], out)
                    lines = block.count("\n") - block.count("\n#")
                checked += lines
            elif not plan[2]:
                block = "" if line_end == -1 else piece[line_end:]
                self._lines(block, 0, len(block), None, out)
                checked += block.count("\n") - block.count("\n#")
            elif careful:
                if piece.count("\n") != piece.count(plan[1]) + piece.count("\n#"):
                    # A line that is neither a comment nor of this family: check every line.
                    self._lines(piece, line_end, len(piece), None, out)
            else:
                family_lines += piece.count(plan[1])
        return careful or _sample_lines(text) - checked == family_lines

    def _block(self, block: str, family: str, out: list[tuple[str, Labels, float]]) -> int | None:
        """A wanted family's block in one regex pass (the common case): its sample line count, or
        None, having added nothing, when any line needs the line-by-line path (odd spacing, a quoted
        "}", a line of another family, blank lines)."""
        matches = _BLOCK_LINE_RE.findall(block)
        lines = block.count("\n") - block.count("\n#")
        if len(matches) != lines:
            return None
        wanted = self.wanted
        cache = self._labels
        found: list[tuple[str, Labels, float]] = []
        for head, rest in matches:
            name, label_text = _split_head(head)
            if name not in wanted:
                if name.startswith(family):
                    continue  # e.g. `_created` lines of a wanted histogram
                return None
            labels = cache.get(label_text)
            if labels is None:
                labels = _parse_labels(label_text)
                if labels is None:
                    return None
                if len(cache) >= self._CACHE_LIMIT:
                    cache.clear()
                cache[label_text] = labels
            found.append((name, labels, _value(name, label_text, rest)))
        out.extend(found)
        return lines

    def _block_series(self, block: str, family: str, sink: _SeriesSink) -> int | None:
        """`_block` for `parse`, without a Python step per sample in the common case: the block's
        sample heads (`name{labels}`, in order) name a cached shape (which lines are kept, their
        keys), and the values are read by one `map(float, ...)`. A value that float() refuses
        (a timestamp, an exemplar, a bad value) takes the per-sample path."""
        matches = _BLOCK_LINE_RE.findall(block)
        lines = block.count("\n") - block.count("\n#")
        if len(matches) != lines:
            return None
        shape_key = (family, tuple(map(_FIRST, matches)))
        shape = self._shapes.get(shape_key)
        if shape is None:
            shape = self._shape(family, matches)
            if shape is None:
                return None
            if len(self._shapes) >= self._SHAPE_LIMIT:
                self._shapes.clear()
            self._shapes[shape_key] = shape
        pick, segments = shape
        if not segments:
            return lines
        try:
            read = list(map(float, map(_SECOND, matches)))
            values: Sequence[float] = read if pick is None else pick(read)
        except ValueError:
            kept = [matches[i] for i in range(len(matches))] if pick is None else pick(matches)
            values = [_value(*_split_head(head), rest) for head, rest in kept]
        groups = sink.groups
        for group, keys, start, end in segments:
            pair = groups.get(group)
            if pair is None:
                pair = groups[group] = ([], [])
            pair[0].extend(keys)
            pair[1].extend(values if len(segments) == 1 else values[start:end])
        return lines

    def _shape(self, family: str, matches: list[tuple[str, str]]) -> _Shape | None:
        """Which lines of a wanted block are kept and under which keys and (family, alias rank)
        groups; None when a line needs the line-by-line path."""
        heads = self._heads
        wanted = self.wanted
        kept: list[int] = []
        segments: list[tuple[tuple[str, int], tuple[SeriesKey, ...], int, int]] = []
        current: tuple[str, int] | None = None
        keys: list[SeriesKey] = []
        start = 0
        for index, (head, _rest) in enumerate(matches):
            hit = heads.get(head)
            if hit is None:
                name, label_text = _split_head(head)
                entry = wanted.get(name)
                if entry is None:
                    if name.startswith(family):
                        continue  # e.g. `_created` lines of a wanted histogram
                    return None
                labels = self._labels.get(label_text)
                if labels is None:
                    labels = _parse_labels(label_text)
                    if labels is None:
                        return None
                hit = ((entry.canonical, labels), self._group(entry))
                if len(heads) >= self._CACHE_LIMIT:
                    heads.clear()
                heads[head] = hit
            if hit[1] is not current:
                if current is not None:
                    segments.append((current, tuple(keys), start, len(kept)))
                current, keys, start = hit[1], [], len(kept)
            kept.append(index)
            keys.append(hit[0])
        if current is not None:
            segments.append((current, tuple(keys), start, len(kept)))
        pick: Callable[[Sequence[Any]], Sequence[Any]] | None = None
        if len(kept) == 1:
            only = kept[0]
            pick = lambda items: (items[only],)  # noqa: E731
        elif 1 < len(kept) < len(matches):
            pick = operator.itemgetter(*kept)
        return pick, tuple(segments)

    def _lines(self, text: str, start: int, end: int, family: str | None,
               out: list[tuple[str, Labels, float]] | _SeriesSink) -> None:
        """Parse text[start:end] line by line. Wanted lines are parsed and validated; within a
        family's block, lines of that family the exporter does not read (`_created`) are skipped;
        any other line goes through the full grammar."""
        wanted = self.wanted
        cache = self._labels
        append = out.append
        for line in text[start:end].split("\n"):
            if not line or line[0] == "#":
                continue
            brace = line.find("{")
            name = line[:brace] if brace != -1 else line.split(None, 1)[0]
            if name not in wanted:
                if family is not None and name.startswith(family) and " " not in name and "\t" not in name:
                    continue
                self._strict(line, out)
                continue
            if brace == -1:
                labels: Labels = ()
                label_text = ""
                rest = line[len(name):]
            else:
                close = line.find("}", brace)
                if close == -1:
                    append(strict_line(line))
                    continue
                label_text = line[brace + 1:close]
                cached = cache.get(label_text)
                if cached is None:
                    cached = _parse_labels(label_text)
                    if cached is None:  # a quoted "}" or a broken label set: the full grammar decides
                        append(strict_line(line))
                        continue
                    if len(cache) >= self._CACHE_LIMIT:
                        cache.clear()
                    cache[label_text] = cached
                labels = cached
                rest = line[close + 1:]
            if not rest or rest[0] not in " \t" or rest.isspace():
                append(strict_line(line))
                continue
            append((name, labels, _value(name, label_text, rest)))

    def _strict(self, line: str, out: list[tuple[str, Labels, float]] | _SeriesSink) -> None:
        if not line.strip(" \t\r"):
            return
        if line.lstrip(" \t").startswith("#"):
            return
        name, labels, value = strict_line(line.lstrip(" \t"))
        if name in self.wanted:
            out.append((name, labels, value))


def parse_all(text: str) -> list[tuple[str, Labels, float]]:
    """Every sample of a payload (no filtering), for tests and tools; slower than Parser."""
    out: list[tuple[str, Labels, float]] = []
    for line in text.split("\n"):
        stripped = line.strip(" \t\r")
        if not stripped or stripped.startswith("#"):
            continue
        out.append(strict_line(stripped))
    return out
