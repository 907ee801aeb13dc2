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

import math
from collections.abc import Iterable, Mapping
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


def quantile_label(q: float) -> str:
    """The `quantile` label value and JSON key: 0.5 -> "0.5", 0.99 -> "0.99"."""
    return f"{q:g}"


def percentile_label(q: float) -> str:
    """The short name of a quantile in column and rule names: 0.99 -> "p99"."""
    return f"p{round(q * 100):d}"


# --- request outcomes, server side -------------------------------------------------------------
# finished_reason values of the requests counter (catalog.REQUEST_SUCCESS) for requests the fleet served.
SERVED_REASONS: tuple[str, ...] = ("stop", "length", "repetition")
# finished_reason values of requests the fleet should have served and did not: an engine error,
# and an abort (the client went away, or an engine-side cancel). Aborts count as failures by choice:
# the server cannot tell a user giving up on a slow stream from one who lost interest, and an SLO
# that forgives the first hides the failure it exists to catch.
FAILED_REASONS: tuple[str, ...] = ("abort", "error")
# The `reason` of failed_requests_per_second for admission rejections (one value whatever queue
# limit rejected the request: the limit is in the admission counter's own `reason`).
REJECTED_REASON = "rejected"
FAILURE_REASONS: tuple[str, ...] = (*FAILED_REASONS, REJECTED_REASON)
# The families the failure-aware definition reads; where a target lacks them (vLLM before they
# existed) attainment falls back to the histogram share alone, flagged by FAILURES_COUNTED.
OUTCOME_FAMILIES: tuple[Metric, ...] = (catalog.REQUEST_SUCCESS, catalog.ADMISSION_REJECTIONS)


@dataclass(frozen=True)
class Outcomes:
    """Requests (or requests per second) by outcome over a window."""

    served: float  # finished with a SERVED_REASONS reason
    failed: dict[str, float]  # FAILURE_REASONS -> count; only reasons the target exposes
    counted: bool  # False: the target exposes no finished_reason (the histogram-only fallback)

    @property
    def failed_total(self) -> float:
        return math.fsum(self.failed.values())

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


def outcomes(by_finished_reason: Mapping[str, float], rejections: float | None) -> Outcomes:
    """Outcomes from catalog.REQUEST_SUCCESS by finished_reason and catalog.ADMISSION_REJECTIONS (None:
    the family is absent, counted as no rejection)."""
    # Whatever is not a failure was served (a reason a later vLLM adds counts as served).
    served = math.fsum(v for r, v in by_finished_reason.items() if r not in FAILED_REASONS)
    failed = {r: by_finished_reason[r] for r in FAILED_REASONS if r in by_finished_reason}
    if rejections is not None:
        failed[REJECTED_REASON] = rejections
    return Outcomes(served, failed, counted=bool(by_finished_reason))


# --- attainment and goodput ------------------------------------------------------------------
def attainment(within_share: float, served_share: float) -> float:
    """Share of all requests that were served and met one SLO: the histogram's share within the
    threshold (of the requests it observed: served ones) times the share served. 0 when nothing was
    served, whatever the histogram holds."""
    if served_share == 0:
        return 0.0
    return within_share * served_share


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


def is_good(ok: bool, values_s: Mapping[str, float], thresholds_s: Mapping[str, float]) -> bool:
    """One request, client side: served, and every SLO given met (value <= threshold)."""
    return ok and all(values_s[slo] <= threshold for slo, threshold in thresholds_s.items())


# --- names in every output -----------------------------------------------------------------------
ATTAINMENT = "attainment"  # good / all requests: sweep column, exporter series, rule stem
GOODPUT = "goodput"  # good work per second; the unit follows in every name
GOODPUT_REQUESTS = f"{GOODPUT}_requests_per_second"  # good requests per second
GOODPUT_TOKENS = f"{GOODPUT}_tokens_per_second"  # generated tokens of good requests per second
FAILED_REQUESTS = "failed_requests_per_second"  # by reason: abort, error, rejected
FAILURES_COUNTED = "failures_counted"  # 1: the failure families were read; 0: histogram-only fallback


def attainment_column(slo: str | None = None) -> str:
    """`attainment` (every SLO met) or `attainment_<slo>`."""
    return ATTAINMENT if slo is None else f"{ATTAINMENT}_{slo}"

