"""The SSE parser: any split of the byte stream gives the same events; garbage is counted, not fatal."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossover.loadgen.traffic.sse import SSEOverflow, SSEParser

STREAM = (b'data: {"a": 1}\n\n: keep-alive comment\n\ndata: {"b": 2}\n\n'
          b"event: message\nid: 7\ndata: line one\ndata: line two\n\n"
          b"junk without colon\n\ndata:[DONE]\n\n")
EXPECTED = [b'{"a": 1}', b'{"b": 2}', b"line one\nline two", b"[DONE]"]


def _parse_in_pieces(stream: bytes, cuts: list[int]) -> tuple[list[bytes], int]:
    parser = SSEParser()
    events: list[bytes] = []
    last = 0
    for cut in sorted(set(cuts)):
        events += parser.feed(stream[last:cut])
        last = cut
    events += parser.feed(stream[last:])
    events += parser.finish()
    return events, parser.garbage


def test_whole_stream() -> None:
    events, garbage = _parse_in_pieces(STREAM, [])
    assert events == EXPECTED
    assert garbage == 1  # the line without a colon


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12), st.booleans())
def test_any_split_and_line_ending_gives_the_same_events(cuts: list[int], crlf: bool) -> None:
    stream = STREAM.replace(b"\n", b"\r\n") if crlf else STREAM
    cuts = [min(c * (2 if crlf else 1), len(stream)) for c in cuts]
    events, garbage = _parse_in_pieces(stream, cuts)
    assert events == EXPECTED
    assert garbage == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(sorted({0, *(i + 2 for i in range(len(STREAM)) if STREAM[i:i + 2] == b"\n\n"),
                                          len(STREAM)})) | st.integers(0, len(STREAM)), max_size=12),
       st.booleans())
def test_cuts_on_event_boundaries_give_the_same_events(cuts: list[int], crlf: bool) -> None:
    # many pieces are then one whole event, the common read that feed takes in one step
    stream = STREAM.replace(b"\n", b"\r\n") if crlf else STREAM
    cuts = [min(c * (2 if crlf else 1), len(stream)) for c in cuts]
    events, garbage = _parse_in_pieces(stream, cuts)
    assert events == EXPECTED
    assert garbage == 1


def test_one_whole_event_after_a_pending_part_joins_it() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: half") == []
    assert parser.feed(b'data: {"a": 1}\n\n') == [b'halfdata: {"a": 1}']  # one line, not a fresh event
    assert parser.feed(b"data: x\r\n\r\n") == [b"x"]  # CRLF line ends: the full path


def test_every_single_byte_split() -> None:
    events, _ = _parse_in_pieces(STREAM, list(range(len(STREAM))))
    assert events == EXPECTED


def test_last_event_without_blank_line_counts_at_finish() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"x": 1}') == []
    assert parser.finish() == [b'{"x": 1}']


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_raise(noise: bytes) -> None:
    parser = SSEParser()
    parser.feed(noise)
    parser.finish()


def test_endless_event_is_an_error_not_a_memory_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("crossover.loadgen.traffic.sse.MAX_PENDING_BYTES", 1000)
    parser = SSEParser()
    with pytest.raises(SSEOverflow):
        for _ in range(20):
            parser.feed(b"data: " + b"x" * 100)
