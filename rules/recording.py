"""The recording rules: from vLLM's raw series to per-topology rates, quantiles, request outcomes,
SLO attainment and goodput (crossover.slo), per replica and per P/D role, the long SLI windows and
the KV-transfer figures. Every name comes from names.py, every raw read from raw_series.py.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from crossover import catalog, slo
from crossover.catalog import Metric
from crossover.rules.buckets import SloBucket, request_slo_buckets
from crossover.rules.names import (
    BUDGET_REMAINING_NAME,
    FAILURES_COUNTED_NAME,
    GPUS_NAME,
    KV_BYTES,
    KV_FAILURES,
    KV_HISTOGRAMS,
    KV_TIME,
    OBJECTIVE_NAME,
    REPLICA_BY,
    REPLICA_LEVEL,
    ROLE_BY,
    ROLE_LEVEL,
    TOPOLOGY_BY,
    KvFamily,
    api_requests_name,
    attainment_name,
    failed_requests_name,
    finished_by_reason_name,
    gauge_sum_name,
    good_requests_name,
    goodput_requests_name,
    goodput_tokens_name,
    histogram_rate_name,
    interactivity_name,
    joint_attainment_name,
    kv_bandwidth_name,
    kv_usage_name,
    mean_name,
    per_gpu_name,
    quantile_name,
    rate_name,
    requests_name,
    requests_source_name,
    sli_error_name,
)
from crossover.rules.raw_series import (
    ENTRYPOINT_MATCHER,
    NOT_ENTRYPOINT,
    USER_SOURCES,
    RawSeries,
    label_list,
    promql_string,
)
from crossover.spec import FleetSpec, Topology, format_duration, parse_duration

# Histograms whose quantiles and means are recorded per topology.
LATENCY_HISTOGRAMS: tuple[Metric, ...] = (catalog.TTFT, catalog.TPOT, catalog.ITL, catalog.E2E_LATENCY)
# The requests counter is recorded once, by finished_reason, with the other outcome families
# (RecordingRules.outcome_rates); its sum per topology is built on that recording.
RATE_COUNTERS: tuple[Metric, ...] = (catalog.GENERATION_TOKENS, catalog.PROMPT_TOKENS,
                                     catalog.NUM_PREEMPTIONS)
GAUGES_SUMMED: tuple[Metric, ...] = (catalog.NUM_REQUESTS_RUNNING, catalog.NUM_REQUESTS_WAITING)
# A P/D request is one request on the prefill instance (max_tokens 1) and one on the decode instance,
# so topology-level request figures of a P/D topology count it twice and mix two populations; these
# are also recorded per role (level topology_role) for fleets with a P/D topology.
ROLE_COUNTERS: tuple[Metric, ...] = (catalog.GENERATION_TOKENS,)
ROLE_HISTOGRAMS: tuple[Metric, ...] = (catalog.TTFT, catalog.TPOT, catalog.ITL, catalog.E2E_LATENCY)


@dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RecordingRules:
    """Builds the recording rules of one spec; model.build_rules puts them in their groups."""

    spec: FleetSpec
    raw: RawSeries
    buckets: tuple[SloBucket, ...]  # the SLOs' buckets (buckets.slo_buckets)
    period_s: float  # the (possibly scaled) SLO period
    budget: float  # the error budget, 1 - objective (model.error_budget)

    def requests_source(self) -> RecordingRule:
        """Which source summed_rate picks per topology, for dashboards to show beside its figures."""
        exposed = {"entrypoint": self.raw.entrypoint_request_series()}
        branches = []
        for source, role in USER_SOURCES:
            series = exposed.get(source, self.raw.sel("up", role))
            branches.append(f'label_replace(group by (topology) ({series}), "source", "{source}", "", "")')
        return RecordingRule(requests_source_name(), "\nor on (topology)\n".join(branches))

    def failures_counted(self) -> RecordingRule:
        """1 per topology when every vLLM target exposes finished_reason, so failed requests count;
        0 when one does not (older vLLM: its attainment is the histogram share alone, docs/slo.md)."""
        success = self.raw.sel(catalog.REQUEST_SUCCESS.promql_name, f'{NOT_ENTRYPOINT},finished_reason=~".+"')
        up = self.raw.vllm_up()
        counted = f"group by (topology, instance) ({success})"
        return RecordingRule(FAILURES_COUNTED_NAME,
                             f"min by (topology) (\n  {counted}\n  or on (topology, instance)\n"
                             f"  0 * group by (topology, instance) ({up} == 1)\n)")

    def gpus(self, topology: Topology) -> RecordingRule:
        """A listed topology's GPUs from the spec; a selector topology's follow its discovered pods
        (pods discovered x TP; a pod's own tp_label is not a number PromQL can read, docs/kubernetes.md)."""
        if not topology.discovered:
            return RecordingRule(GPUS_NAME, f"vector({topology.gpus})", (("topology", topology.name),))
        up = self.raw.sel("up", f'topology="{topology.name}",{NOT_ENTRYPOINT}')
        return RecordingRule(GPUS_NAME, f"count by (topology) ({up}) * {topology.tensor_parallel_size}")

    def topology_rules(self, windows: tuple[str, ...],
                       dashboard_windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        rules: list[RecordingRule] = [self.gpus(t) for t in self.spec.topologies]
        rules.append(self.requests_source())
        rules.append(self.failures_counted())
        for metric in GAUGES_SUMMED:
            rules.append(RecordingRule(gauge_sum_name(metric), f"sum by ({label_list(TOPOLOGY_BY)}) "
                                       f"({self.raw.sel(metric.promql_name)})"))
            rules.append(RecordingRule(gauge_sum_name(metric, ROLE_LEVEL), f"sum by ({label_list(ROLE_BY)}) "
                                       f"({self.raw.sel(metric.promql_name)})"))
        kv = self.raw.sel(catalog.KV_CACHE_USAGE.promql_name)
        # Instances of one topology have equal KV pools, so the mean of their usage is the pool's usage.
        rules.append(RecordingRule(kv_usage_name("max"), f"max by ({label_list(TOPOLOGY_BY)}) ({kv})"))
        rules.append(RecordingRule(kv_usage_name("avg"), f"avg by ({label_list(TOPOLOGY_BY)}) ({kv})"))
        # Raw series are read over the shortest window only; the longer ones average its recordings.
        base = windows[0]
        for window in windows:
            source = None if window == base else base
            for metric in RATE_COUNTERS:
                raw = self.raw.summed_rate(metric, window)
                rules.append(RecordingRule(rate_name(metric, window), self.averaged(
                    functools.partial(rate_name, metric), window, source, raw)))
            rules.append(RecordingRule(
                per_gpu_name(catalog.GENERATION_TOKENS, window),
                f"{rate_name(catalog.GENERATION_TOKENS, window)} / on (topology) group_left {GPUS_NAME}"))
            for metric in LATENCY_HISTOGRAMS:
                rules.extend(self.histogram_rules(metric, window, quantiles=window in dashboard_windows,
                                                  source=source))
            if window in dashboard_windows:
                # slo.interactivity = 1 / TPOT; PromQL's 1 / 0 is +Inf as slo's is (one-token answers)
                tpot = quantile_name(catalog.TPOT, slo.INTERACTIVITY_QUANTILE, window)
                rules.append(RecordingRule(interactivity_name(window), f"1 / {tpot}"))
            rules.extend(self.outcome_rates(window, source=source))
        return tuple(rules)

    @staticmethod
    def averaged(name_at: Callable[[str], str], window: str, source: str | None, raw: str) -> str:
        """The raw expression, or with a source window the average of its recording (`name_at`
        that window) over `window`: a rate over a window is the average of a shorter one's rates."""
        return raw if source is None else f"avg_over_time({name_at(source)}[{window}])"

    def histogram_rules(self, metric: Metric | KvFamily, window: str, quantiles: bool = True,
                        source: str | None = None) -> list[RecordingRule]:
        bucket = histogram_rate_name(metric, "bucket", window)
        count = histogram_rate_name(metric, "count", window)
        total = histogram_rate_name(metric, "sum", window)

        def part(name: str, suffix: str, by: tuple[str, ...] = TOPOLOGY_BY) -> str:
            raw = self.raw.summed_rate(metric, window, by, suffix)
            return self.averaged(lambda w: histogram_rate_name(metric, name, w), window, source, raw)

        rules = [
            RecordingRule(bucket, part("bucket", "_bucket", (*TOPOLOGY_BY, "le"))),
            RecordingRule(count, part("count", "_count")),
            RecordingRule(total, part("sum", "_sum")),
        ]
        if not quantiles:
            return rules
        for quantile in slo.QUANTILES:
            rules.append(RecordingRule(quantile_name(metric, quantile, window),
                                       f"histogram_quantile({quantile}, {bucket})"))
        rules.append(RecordingRule(mean_name(metric, window), f"{total} / {count}"))
        return rules

    def fleet_requests(self, window: str, served: str, by: tuple[str, ...] = TOPOLOGY_BY) -> str:
        """The API server's requests the fleet should have served (slo.is_fleet_request). The
        counter has no model label: one spec serves one model, so it is added here. `served`: the
        recorded finished-requests rate of the same window and labels."""
        handlers = promql_string("|".join(re.escape(h) for h in slo.SERVING_HANDLERS))
        fleet = f"handler=~{handlers},status!={promql_string(slo.CLIENT_ERROR_STATUS)}"
        summed = self.raw.summed_rate(catalog.HTTP_REQUESTS, window,
                                      tuple(label for label in by if label != "model_name"), extra=fleet)
        # vLLM creates the HTTP series at a handler's first response but the finished-reason series
        # at start: a 0 while the first is absent keeps the long windows' averages (avg_over_time of
        # these recordings) over the same samples, or a new series would look like lost requests.
        named = f'label_replace({summed}, "model_name", {promql_string(self.spec.model.name)}, "", "")'
        return f"{named} or on ({', '.join(by)}) (0 * {served})"

    def outcome_rates(self, window: str, level: str = "topology", by: tuple[str, ...] = TOPOLOGY_BY,
                      source: str | None = None, summed_from: str | None = None) -> list[RecordingRule]:
        """The raw rates of the outcome families (slo.OUTCOME_FAMILIES), each recorded once: read
        from the raw series, or with a source window averaged from its recordings, or with
        `summed_from` summed from that finer level's recordings of the same window."""
        by_reason = finished_by_reason_name(window, level)
        rejected = rate_name(catalog.ADMISSION_REJECTIONS, window, level)
        served = rate_name(catalog.REQUEST_SUCCESS, window, level)
        api = api_requests_name(window, level)
        if summed_from is None:
            raw_finished = self.routed_as_served(
                self.raw.summed_rate(catalog.REQUEST_SUCCESS, window, (*by, "finished_reason")), window, by)
            raw_rejected = self.raw.summed_rate(catalog.ADMISSION_REJECTIONS, window, by)
            raw_api = self.fleet_requests(window, served, by)
        else:
            def summed(finer: str, labels: tuple[str, ...] = by) -> str:
                return f"sum by ({label_list(labels)}) ({finer})"

            raw_finished = summed(finished_by_reason_name(window, summed_from), (*by, "finished_reason"))
            raw_rejected = summed(rate_name(catalog.ADMISSION_REJECTIONS, window, summed_from))
            raw_api = summed(api_requests_name(window, summed_from))
        return [
            RecordingRule(by_reason, self.averaged(lambda w: finished_by_reason_name(w, level), window,
                                                   source, raw_finished)),
            RecordingRule(served, f"sum without (finished_reason) ({by_reason})"),
            RecordingRule(rejected, self.averaged(lambda w: rate_name(catalog.ADMISSION_REJECTIONS, w, level),
                                                  window, source, raw_rejected)),
            RecordingRule(api, self.averaged(lambda w: api_requests_name(w, level), window, source, raw_api)),
        ]

    def routed_as_served(self, finished: str, window: str, by: tuple[str, ...]) -> str:
        """Requests by finished_reason, a router's routed requests (slo.ROUTED_REASON: llm-d's
        request_total, failed ones included, as the scrape config relabels it) turned into vLLM's
        shape: its failed reasons as they are, the rest served (finished_reason "stop"), as
        slo.outcomes counts them. Unchanged for a fleet whose spec names no such router."""
        if not any(t.entrypoint.dialect is not None and catalog.DIALECTS[t.entrypoint.dialect].requests
                   is not None for t in self.spec.topologies):
            return finished
        name, on = catalog.REQUEST_SUCCESS.promql_name, f"on ({label_list(by)})"
        failed = f"finished_reason=~{promql_string('|'.join(slo.FAILED_REASONS))}"

        def entry(matcher: str, labels: tuple[str, ...] = by) -> str:
            series = self.raw.sel(name, matcher, first=ENTRYPOINT_MATCHER)
            return f"sum by ({label_list(labels)}) (rate({series}[{window}]))"

        routed = entry(f'finished_reason="{slo.ROUTED_REASON}"')
        served = f"{routed} - {on} ({entry(failed)} or 0 * {routed})"
        return (f"(\n  {finished}\n  unless {on} {routed}\n)\n"
                f"or ({entry(failed, (*by, 'finished_reason'))} and {on} {routed})\n"
                f'or label_replace({served}, "finished_reason", "stop", "", "")')

    def counted(self, window: str, level: str, by: tuple[str, ...]) -> str:
        """Requests the engine finished plus those rejected at admission (none without the family)."""
        finished = rate_name(catalog.REQUEST_SUCCESS, window, level)
        rejected = rate_name(catalog.ADMISSION_REJECTIONS, window, level)
        return f"({finished} + on ({label_list(by)}) ({rejected} or 0 * {finished}))"

    def unfinished_rule(self, window: str, level: str = "topology",
                        by: tuple[str, ...] = TOPOLOGY_BY) -> RecordingRule:
        """The API server's requests the engine never finished nor rejected (slo.UNFINISHED_REASON),
        over the longest raw window: the HTTP counter moves at the end of a response, a little after
        the engine's, and over a short window that gap alone would show healthy requests as unfinished.
        Absent without the HTTP family (none counted then)."""
        return RecordingRule(requests_name("unfinished", window, level),
                             f"clamp_min({api_requests_name(window, level)} - on ({label_list(by)}) "
                             f"{self.counted(window, level, by)}, 0)")

    def outcome_rules(self, window: str, unfinished_window: str, level: str = "topology",
                      by: tuple[str, ...] = TOPOLOGY_BY) -> list[RecordingRule]:
        """slo.outcomes on the recorded rates: all requests are the finished, the rejected and the
        unfinished ones. A target without finished_reason counts every request as served (the
        fallback); one without the HTTP or admission family counts none there."""
        on = f"on ({label_list(by)})"
        failed = f"finished_reason=~{promql_string('|'.join(slo.FAILED_REASONS))}"
        by_reason = finished_by_reason_name(window, level)
        finished = rate_name(catalog.REQUEST_SUCCESS, window, level)
        counted = self.counted(window, level, by)
        unfinished = requests_name("unfinished", unfinished_window, level)
        return [
            RecordingRule(requests_name("all", window, level),
                          f"{counted}\n+ {on} ({unfinished} or 0 * {finished})"),
            RecordingRule(requests_name("served", window, level),
                          f"sum without (finished_reason) ({by_reason}{{{failed.replace('=~', '!~')}}})"
                          f"\nor {on} 0 * {finished}"),
            RecordingRule(requests_name("failed_finished", window, level),
                          f"sum without (finished_reason) ({by_reason}{{{failed}}})\nor {on} 0 * {finished}"),
        ]

    def good_requests(self, bucket: SloBucket, window: str, level: str = "topology",
                      by: tuple[str, ...] = TOPOLOGY_BY) -> str:
        """Requests per second served within one SLO (slo.attainment x all requests), from the
        recorded bucket rates; 0, never NaN, so that long windows can average it."""
        on = f"on ({label_list(by)})"
        within = f"sum by ({label_list(by)}) ({histogram_rate_name(bucket.metric, 'bucket', window, level)}" \
                 f"{{{bucket.le_matcher}}})"
        if bucket.slo in slo.OBSERVES_FAILED:
            return f"clamp_min(\n  {within}\n  - {on} {requests_name('failed_finished', window, level)},\n0)"
        count = histogram_rate_name(bucket.metric, "count", window, level)
        return (f"{within}\n/ {on} ({count} > 0)\n* {on} {requests_name('served', window, level)}"
                f"\nor {on} 0 * {requests_name('all', window, level)}")

    def slo_rules(self, window: str, unfinished_window: str, level: str = "topology",
                  by: tuple[str, ...] = TOPOLOGY_BY,
                  kinds: tuple[str, ...] | None = None) -> list[RecordingRule]:
        """Outcomes, good requests and attainment per SLO over one window read from raw rates."""
        rules = self.outcome_rules(window, unfinished_window, level, by)
        every = requests_name("all", window, level)
        for bucket in self.buckets:
            if kinds is not None and bucket.slo not in kinds:
                continue
            good = good_requests_name(bucket.slo, window, level)
            rules.append(RecordingRule(good, self.good_requests(bucket, window, level, by)))
            rules.append(RecordingRule(attainment_name(bucket.slo, window, level),
                                       f"{good} / on ({label_list(by)}) {every}"))
        return rules

    def replica_rules(self, windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        """The outcome families per replica, and its failed requests by reason as the topology's
        are counted (failed_requests), for the dashboards' per-instance view. As per topology, raw
        series are read over the shortest window only; the longer ones average its recordings."""
        rules: list[RecordingRule] = []
        base = min(windows, key=parse_duration)
        for window in windows:
            rules.extend(self.outcome_rates(window, REPLICA_LEVEL, REPLICA_BY,
                                             source=None if window == base else base))
        longest = max(windows, key=parse_duration)
        rules.append(self.unfinished_rule(longest, REPLICA_LEVEL, REPLICA_BY))
        rules.extend(self.failed_requests(window, longest, REPLICA_LEVEL) for window in windows)
        return tuple(rules)

    def role_rules(self, windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        """Request figures per P/D role: the decode side is what users see after the first token
        (its TTFT covers the KV-transfer wait), the prefill side the prefill work."""
        level = ROLE_LEVEL
        rules: list[RecordingRule] = []
        for window in windows:
            rules.extend(self.outcome_rates(window, level, ROLE_BY, summed_from=REPLICA_LEVEL))
        longest = max(windows, key=parse_duration)
        rules.append(self.unfinished_rule(longest, level, ROLE_BY))
        for window in windows:
            for metric in ROLE_COUNTERS:
                rules.append(RecordingRule(rate_name(metric, window, level),
                                           self.raw.summed_rate(metric, window, ROLE_BY)))
            for metric in ROLE_HISTOGRAMS:
                bucket = histogram_rate_name(metric, "bucket", window, level)
                rules.append(RecordingRule(bucket, self.raw.summed_rate(metric, window, (*ROLE_BY, "le"),
                                                                        "_bucket")))
                count = self.raw.summed_rate(metric, window, ROLE_BY, "_count")
                rules.append(RecordingRule(histogram_rate_name(metric, "count", window, level), count))
                for quantile in slo.QUANTILES:
                    rules.append(RecordingRule(quantile_name(metric, quantile, window, level),
                                               f"histogram_quantile({quantile}, {bucket})"))
            rules.extend(self.slo_rules(window, longest, level, ROLE_BY, slo.PER_REQUEST_SLOS))
        return tuple(rules)

    def goodput_rules(self, raw_windows: tuple[str, ...],
                      dashboard_windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        rules: list[RecordingRule] = []
        request_slos = request_slo_buckets(self.buckets)
        rules.append(self.unfinished_rule(raw_windows[-1]))
        for window in raw_windows:
            rules.extend(self.slo_rules(window, raw_windows[-1]))
            rules.extend(self.sli_errors(window))
        for window in dashboard_windows:
            rules.append(self.failed_requests(window, raw_windows[-1]))
            if request_slos:
                names = [attainment_name(b.slo, window) for b in request_slos]
                # Frechet bounds on "every SLO met" from the per-SLO shares.
                lower = " + ".join(names)
                rules.append(RecordingRule(joint_attainment_name("lower", window),
                                           f"clamp_min({lower} - {len(names) - 1}, 0)"))
                upper = " or ".join(f'label_replace({n}, "slo", "{b.slo}", "", "")'
                                    for n, b in zip(names, request_slos, strict=True))
                rules.append(RecordingRule(joint_attainment_name("upper", window),
                                           f"min without (slo) ({upper})"))
                rules.append(RecordingRule(
                    goodput_requests_name(window),
                    f"{requests_name('all', window)} * {joint_attainment_name('lower', window)}"))
                rules.append(RecordingRule(
                    goodput_tokens_name(window),
                    f"{rate_name(catalog.GENERATION_TOKENS, window)}"
                    f" * {joint_attainment_name('lower', window)}"))
                rules.append(RecordingRule(
                    goodput_tokens_name(window, per_gpu=True),
                    f"{goodput_tokens_name(window)} / on (topology) group_left {GPUS_NAME}"))
        for bucket in self.buckets:
            labels = (("slo", bucket.slo),)
            rules.append(RecordingRule(OBJECTIVE_NAME, f"vector({self.spec.slos.objective!r})", labels))
        return tuple(rules)

    def sli_errors(self, window: str) -> list[RecordingRule]:
        return [RecordingRule(sli_error_name(window), f"1 - {attainment_name(b.slo, window)}",
                              (("slo", b.slo),)) for b in self.buckets]

    def long_window_rules(self, raw_windows: tuple[str, ...],
                          long_windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        """Each longer SLI window from the recordings of a window at most a twentieth as long (so it
        reaches at most 5% further back), the longest such: good and all requests are rates, and
        the average of a short window's rates over the long window is the long window's rate."""
        rules: list[RecordingRule] = []
        recorded = [parse_duration(w) for w in raw_windows]
        on = f"on ({label_list(TOPOLOGY_BY)})"
        for window in long_windows:
            seconds = parse_duration(window)
            source = format_duration(max([w for w in recorded if w <= seconds / 20] or [min(recorded)]))
            every = requests_name("all", window)
            rules.append(RecordingRule(every, f"avg_over_time({requests_name('all', source)}[{window}])"))
            for bucket in self.buckets:
                good = good_requests_name(bucket.slo, window)
                rules.append(RecordingRule(
                    good, f"avg_over_time({good_requests_name(bucket.slo, source)}[{window}])"))
                rules.append(RecordingRule(attainment_name(bucket.slo, window), f"{good} / {on} {every}"))
            rules.extend(self.sli_errors(window))
            recorded.append(seconds)
        period = format_duration(self.period_s)
        rules.append(RecordingRule(
            BUDGET_REMAINING_NAME,
            f"1 - {sli_error_name(period)} / {self.budget!r}"))
        return tuple(rules)

    def failed_requests(self, window: str, unfinished_window: str, level: str = "topology") -> RecordingRule:
        """Failed requests/s by reason (slo.FAILURE_REASONS): abort and error (finished_reason),
        rejected (admission), unfinished (over the longest raw window), from the recordings."""
        failed = promql_string("|".join(slo.FAILED_REASONS))
        by_reason = f"{finished_by_reason_name(window, level)}{{finished_reason=~{failed}}}"
        rejected = rate_name(catalog.ADMISSION_REJECTIONS, window, level)
        unfinished = requests_name("unfinished", unfinished_window, level)
        relabelled = f'label_replace({by_reason}, "reason", "$1", "finished_reason", "(.*)")'
        return RecordingRule(failed_requests_name(window, level), (
            f"sum without (finished_reason) ({relabelled})\n"
            f'or\nlabel_replace({rejected}, "reason", {promql_string(slo.REJECTED_REASON)}, "", "")\n'
            f'or\nlabel_replace({unfinished}, "reason", {promql_string(slo.UNFINISHED_REASON)}, "", "")'))

    def kv_rules(self, windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        rules: list[RecordingRule] = []
        for window in windows:
            for family in KV_HISTOGRAMS:
                rules.extend(self.histogram_rules(family, window))
            rules.append(RecordingRule(rate_name(KV_FAILURES, window),
                                       self.raw.summed_rate(KV_FAILURES, window)))
            rules.append(RecordingRule(
                kv_bandwidth_name(window),
                f"{histogram_rate_name(KV_BYTES, 'sum', window)}\n/\n"
                f"{histogram_rate_name(KV_TIME, 'sum', window)}"))
        return tuple(rules)
