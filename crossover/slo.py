"""Goodput and SLO attainment: the one definition the exporter, rules, alerts, dashboards, sweep,
simulator and app all read (docs/slo.md).

Vocabulary, one word per idea in every output:
- SLO kinds: ttft, tpot, itl, e2el; a threshold per kind in the spec (`slos.<kind>_ms`).
- A request is *good* when the fleet served it (finished with stop, length or repetition) and it
  met every SLO given. Requests the fleet should have served and did not (server errors,
  admission rejections and, by choice, aborts, including a client cutting a stream) are never
  good; requests refused as bad input (HTTP 4xx) are not the fleet's to serve and count nowhere.
- *Attainment* = good / all requests the fleet should have served (a ratio, per SLO or joint).
- *Goodput* = good requests per second (`goodput_requests_per_second`) or their generated tokens
  per second (`goodput_tokens_per_second`).

Server side, histograms give each SLO's share of observations within the threshold and
the requests counter by finished_reason with the admission rejections counter give the share
of requests served; attainment per SLO is their product. Several SLOs together get Fréchet bounds
(only per-SLO shares are known); clients that see every request count the joint share exactly.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from crossover import catalog
from crossover.catalog import Metric

# --- SLO kinds ----------------------------------------------------------------------------------
SLO_KINDS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
# The histogram each SLO kind reads (also the latency families reported with quantiles).
SLO_HISTOGRAMS: dict[str, Metric] = {
    "ttft": catalog.TTFT,
    "tpot": catalog.TPOT,
    "itl": catalog.ITL,
    "e2el": catalog.E2E_LATENCY,
}
# SLOs judged once per request. ITL is observed once per engine iteration (per token), a different
# population, so it cannot enter a per-request joint bound (`vllm bench serve --goodput` also takes
# only ttft, tpot and e2el); a client judges it per request as "every inter-token gap met it".
PER_REQUEST_SLOS: tuple[str, ...] = ("ttft", "tpot", "e2el")
# The quantiles every output reports (exporter series, recording rules, sweep columns).
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
# The tail quantile that tables, crossings and server-side columns show of each kind (p99).
TAIL_QUANTILE = 0.99
# The kinds whose tail latency headlines, charts and crossings compare (e2el is in the tables only).
TAIL_KINDS: tuple[str, ...] = ("ttft", "tpot", "itl")


# --- thresholds and histogram buckets -------------------------------------------------------------
# A histogram's share within a threshold is exact only when the threshold is one of its bucket
# boundaries. Every part decides that here, on the buckets it is given: the spec's warning and the
# rules' choice of bucket on vLLM's defaults (crossover.catalog), the exporter's `attainment_exact` on
# the bounds a target exposes, a router on its own. The tolerance is relative only: bounds are in
# whatever unit their family counts (seconds here, bytes or a router's own elsewhere), and an
# absolute one (say 1e-12) would widen the match only for bounds under 1e-3 of that unit.
BOUNDARY_REL_TOL = 1e-9


def boundary_index(value: float, bounds: Sequence[float]) -> int | None:
    """The index of the bucket boundary `value` lies on, or None between boundaries. `bounds`: the
    ascending upper bounds in value's unit; a +Inf bound may close them and is never matched. Only
    the two boundaries around `value` are compared, the one at or above it first."""
    index = bisect.bisect_left(bounds, value)
    for near in (index, index - 1):
        if 0 <= near < len(bounds) and math.isclose(bounds[near], value, rel_tol=BOUNDARY_REL_TOL,
                                                    abs_tol=0.0):
            return near
    return None


def bucket_neighbours(value: float, bounds: Sequence[float]) -> tuple[float | None, float | None]:
    """The bucket boundaries just below and at or above `value` (None beyond either end)."""
    index = bisect.bisect_left(bounds, value)
    below = bounds[index - 1] if index > 0 else None
    above = bounds[index] if index < len(bounds) else None
    return below, above


def not_a_boundary(threshold_ms: float, family: str, bounds_s: Sequence[float]) -> str:
    """The one sentence for a threshold off the buckets of a family (bounds in seconds), e.g. "2000
    ms is not a bucket boundary of <TTFT's family> (neighbours 1000 ms and 2500 ms)"; the caller says
    before it where the threshold comes from and after it what follows."""
    below, above = bucket_neighbours(threshold_ms / 1000.0, bounds_s)
    near = " and ".join(f"{b * 1000:g} ms" for b in (below, above) if b is not None)
    return f"{threshold_ms:g} ms is not a bucket boundary of {family} (neighbours {near})"


def quantile_label(q: float) -> str:
    """The `quantile` label value and JSON key: 0.5 -> "0.5", 0.99 -> "0.99"."""
    return f"{q:g}"


def percentile_label(q: float) -> str:
    """The short name of a quantile in column and rule names: 0.99 -> "p99"."""
    return f"p{round(q * 100):d}"


def percentile_column(kind: str, q: float) -> str:
    """The results column of a latency kind's quantile, in ms: ("ttft", 0.99) -> "ttft_p99_ms"."""
    return f"{kind}_{percentile_label(q)}_ms"


# --- request outcomes, server side -------------------------------------------------------------
# What vLLM 0.32 counts (measured on the real CPU server, docs/slo.md):
#   served request          2xx, finished_reason stop/length/repetition, every latency histogram
#   bad input (400, 404)    4xx only
#   client cuts a stream    2xx, no finished_reason, TTFT and ITL of the tokens sent, no e2e/TPOT
#   admission rejection     5xx (503) and the admission counter
#   engine error            5xx (or an error event in a 2xx stream) and finished_reason error
# So the API server's request counter, 4xx left out, is every request the fleet should have served;
# served ones are those finished with any reason but a failed one; the rest failed.
SERVING_HANDLERS: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")
CLIENT_ERROR_STATUS = "4xx"  # the status class of requests refused as bad input (not counted)
# finished_reason values of requests the engine finished without serving them: an engine error and
# an engine-side abort (a cancel; a client going away is counted under no reason at all).
FAILED_REASONS: tuple[str, ...] = ("abort", "error")
# The `reason` of failed_requests_per_second for admission rejections (one value whatever queue
# limit rejected the request: the limit is in the admission counter's own `reason`).
REJECTED_REASON = "rejected"
# Requests answered but never finished by the engine: the client went away mid-stream (counted as
# not good by choice: the server cannot tell a user giving up on a slow stream from one who lost
# interest, and an SLO that forgives the first hides the failure it exists to catch), or a 5xx
# before the engine saw the request.
UNFINISHED_REASON = "unfinished"
FAILURE_REASONS: tuple[str, ...] = (*FAILED_REASONS, REJECTED_REASON, UNFINISHED_REASON)
# A router that counts the requests it routed and its failures apart (llm-d's request_total and
# request_error_total by error_code) is read into catalog.REQUEST_SUCCESS under ROUTED_REASON (every
# request it sent on, failed ones included) and the failed reasons, its refusals before routing into
# catalog.ADMISSION_REJECTIONS, so that the one `outcomes` below judges it too: served = routed -
# failed. A request still in flight at a window's end counts as served in it (a router has no
# served-requests counter of its own); over windows of several scrape intervals that is noise.
ROUTED_REASON = "routed"
# The families the failure-aware definition reads; a target lacking finished_reason falls back to
# the histogram share alone (flagged by FAILURES_COUNTED 0); one lacking the HTTP counter counts no
# unfinished request, one lacking the admission counter no rejection.
OUTCOME_FAMILIES: tuple[Metric, ...] = (catalog.REQUEST_SUCCESS, catalog.ADMISSION_REJECTIONS,
                                        catalog.HTTP_REQUESTS)


def is_fleet_request(handler: str, status: str) -> bool:
    """An HTTP counter series that counts requests the fleet should have served."""
    return handler in SERVING_HANDLERS and status != CLIENT_ERROR_STATUS


@dataclass(frozen=True)
class Outcomes:
    """Requests (or requests per second) by outcome over a window."""

    served: float  # finished with any reason but FAILED_REASONS
    failed: dict[str, float]  # FAILURE_REASONS -> count; only reasons the target lets us see
    counted: bool  # False: the target exposes no finished_reason (the histogram-only fallback)

    @property
    def failed_total(self) -> float:
        return math.fsum(self.failed.values())

    @property
    def failed_finished(self) -> float:
        """Failed requests the engine finished (abort, error): those its e2e histogram observed."""
        return math.fsum(v for r, v in self.failed.items() if r in FAILED_REASONS)

    @property
    def total(self) -> float:
        """Every request the fleet should have served."""
        return self.served + self.failed_total

    @property
    def served_share(self) -> float:
        """served / total; 1 in the fallback (nothing known to have failed); NaN with no requests."""
        if not self.counted:
            return 1.0
        total = self.total
        return self.served / total if total > 0 else math.nan


def outcomes(by_finished_reason: Mapping[str, float], rejections: float | None,
             requests: float | None) -> Outcomes:
    """Outcomes from catalog.REQUEST_SUCCESS by finished_reason, catalog.ADMISSION_REJECTIONS and
    the fleet's requests in catalog.HTTP_REQUESTS (is_fleet_request); None: the family is absent.
    A router's routed requests (ROUTED_REASON) hold its failed ones; HTTP_REQUESTS is then not read."""
    if ROUTED_REASON in by_finished_reason:
        failed = {r: by_finished_reason[r] for r in FAILED_REASONS if r in by_finished_reason}
        served = max(0.0, by_finished_reason[ROUTED_REASON] - math.fsum(failed.values()))
        if rejections is not None:
            failed[REJECTED_REASON] = rejections
        return Outcomes(served, failed, counted=True)
    # Whatever is not a failure was served (a reason a later vLLM adds counts as served).
    served = math.fsum(v for r, v in by_finished_reason.items() if r not in FAILED_REASONS)
    failed = {r: by_finished_reason[r] for r in FAILED_REASONS if r in by_finished_reason}
    if rejections is not None:
        failed[REJECTED_REASON] = rejections
    if requests is not None:
        # The counters move at slightly different moments (end of response, end of engine work):
        # never a negative remainder.
        failed[UNFINISHED_REASON] = max(0.0, requests - served - math.fsum(failed.values()))
    return Outcomes(served, failed, counted=bool(by_finished_reason))


# --- attainment and goodput ------------------------------------------------------------------
# SLO kinds whose histogram vLLM observes once per finished request, failed ones included (an engine
# error or an abort is observed with its short e2e latency and a TPOT of 0). Their good requests are
# bounded below by the observations within the threshold minus every failed one; the other kinds
# (TTFT: only requests that reached a first token; ITL: per token) take the share within times the
# share served.
OBSERVES_FAILED: tuple[str, ...] = ("tpot", "e2el")


def attainment(kind: str, within_share: float, observed: float, outcomes: Outcomes) -> float:
    """Share of all requests the fleet should have served that were served within one SLO.

    within_share: the histogram's share of observations within the threshold; observed: its
    observations, in the unit of `outcomes` (requests, or requests per second). Without the failure
    families (outcomes.counted False) it is the histogram share alone; 0 when requests came and
    none was served; NaN without requests."""
    if not outcomes.counted:
        return within_share
    total = outcomes.total
    if not total > 0:
        return math.nan
    if outcomes.served == 0:
        return 0.0
    if kind in OBSERVES_FAILED:
        # Conservative: the failed observations are taken to lie within the threshold.
        return max(0.0, within_share * observed - outcomes.failed_finished) / total
    return within_share * outcomes.served / total


def joint_bounds(attainments: Iterable[float]) -> tuple[float, float]:
    """Fréchet bounds on the share meeting every SLO, knowing only each SLO's share:
    max(0, sum(a_i) - (n - 1)) <= joint <= min(a_i). NaN bounds if any share is NaN or none given."""
    values = list(attainments)
    if not values or any(math.isnan(v) for v in values):
        return math.nan, math.nan
    lower = max(0.0, math.fsum(values) - (len(values) - 1))
    return lower, min(values)


def joint_slos(slos: Iterable[str]) -> tuple[str, ...]:
    """The SLOs given that enter the joint bounds, in PER_REQUEST_SLOS order."""
    given = set(slos)
    return tuple(s for s in PER_REQUEST_SLOS if s in given)


def goodput(rate: float, joint_attainment: float) -> float:
    """Goodput from a rate of all requests (or of all generated tokens) and the joint attainment
    (a bound when the attainment is). Tokens of failed requests are in vLLM's counter too, so the
    share of all requests applies to tokens as well."""
    return rate * joint_attainment


# --- request outcomes, client side ------------------------------------------------------------
# 4xx answers that are the fleet's failure, not the client's: a timeout, and a rejection asking to
# retry (429 from a gateway's queue limit; vLLM's own admission control answers 503).
FLEET_4XX: tuple[int, ...] = (408, 429)


def is_client_error(status: int) -> bool:
    """A request refused as bad input (HTTP 4xx): not the fleet's to serve, counted nowhere."""
    return 400 <= status < 500 and status not in FLEET_4XX


def is_good(ok: bool, values_s: Mapping[str, float], thresholds_s: Mapping[str, float]) -> bool:
    """One request, client side: served, and every SLO given met (value <= threshold). The sweep
    applies the same test to whole columns (crossover.loadgen.analysis.summary.mark_requests)."""
    return ok and all(values_s[kind] <= threshold for kind, threshold in thresholds_s.items())


# --- names in every output -----------------------------------------------------------------------
ATTAINMENT = "attainment"  # good / all requests: sweep column, exporter series, rule stem
GOODPUT = "goodput"  # good work per second; the unit follows in every name
GOODPUT_REQUESTS = f"{GOODPUT}_requests_per_second"  # good requests per second
GOODPUT_TOKENS = f"{GOODPUT}_tokens_per_second"  # generated tokens of good requests per second
FAILED_REQUESTS = "failed_requests_per_second"  # by reason: abort, error, rejected
FAILURES_COUNTED = "failures_counted"  # 1: the failure families were read; 0: histogram-only fallback


def tpot(decode_s: float, output_tokens: int) -> float:
    """Per-request TPOT as vLLM and `vllm bench serve` count it: the decode time (e2e - TTFT) over
    the tokens after the first, 0 for a one-token answer."""
    return decode_s / (output_tokens - 1) if output_tokens > 1 else 0.0


# --- throughput against interactivity (the Pareto view) ---------------------------------------
INTERACTIVITY = "interactivity_tokens_per_second"  # one user's decode rate: output tokens/s per user
THROUGHPUT_PER_GPU = "output_tokens_per_second_per_gpu"  # the fleet side of the same trade
# The TPOT quantile interactivity is taken of, wherever it is drawn or recorded: the median, one
# typical user (the tail is the SLOs' to judge, through attainment).
INTERACTIVITY_QUANTILE = 0.5


def interactivity(tpot_s: float) -> float:
    """Output tokens per second one user sees while decoding: 1 / TPOT (inf for a zero TPOT, so a
    one-token answer never looks slow; NaN stays NaN)."""
    return float("inf") if tpot_s == 0 else 1.0 / tpot_s


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indexes of the points (throughput per GPU, interactivity) that no other point beats on both
    axes, in rising throughput: the front a layout or a load level trades along. NaN points are
    never on it; of equal points the first is."""
    ranked = sorted((i for i, (x, y) in enumerate(points) if x == x and y == y),
                    key=lambda i: (-points[i][0], -points[i][1], i))
    front: list[int] = []
    best_y = float("-inf")
    for i in ranked:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return front[::-1]


# The knee of one topology's curve across load levels: the last level worth its step. Past it a
# step up in load buys less than KNEE_GAIN more output tokens/s per GPU while every user decodes
# slower; a tenth is where a planner's choice of level stops mattering next to run-to-run noise
# (docs/slo.md).
KNEE_GAIN = 0.10


def knee(points: Sequence[tuple[float, float]]) -> int | None:
    """Index of the knee in `points` (throughput per GPU, interactivity), given in rising load: the
    first level whose next step gains less than KNEE_GAIN of its throughput per GPU while
    interactivity falls. None when every step gains more (the curve has not bent in the range) or
    fewer than two finite points."""
    finite = [i for i, (x, y) in enumerate(points) if math.isfinite(x) and math.isfinite(y)]
    for here, after in itertools.pairwise(finite):
        (x0, y0), (x1, y1) = points[here], points[after]
        if y1 < y0 and x1 < x0 * (1.0 + KNEE_GAIN):
            return here
    return None


def attainment_column(slo: str | None = None) -> str:
    """`attainment` (every SLO met) or `attainment_<slo>`."""
    return ATTAINMENT if slo is None else f"{ATTAINMENT}_{slo}"

