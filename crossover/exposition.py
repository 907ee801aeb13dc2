"""vLLM's exposition of its own families: a cheap histogram accumulator and the prometheus_client
family built from it, as vLLM's prometheus_client writes it (`_total`, `_created`, `+Inf`).

Shared by everything in the project that serves vLLM-compatible metrics: the simulator's instances
and the P/D proxy's entrypoint metrics. Names, types, labels and buckets come from the catalog.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client.metrics_core import Metric as PromFamily

from crossover import catalog, slo
from crossover.catalog import MetricType

# The API paths vLLM's HTTP instrumentation counts that we serve: the serving handlers and the model
# list (it leaves out /metrics, /health and the like). Stray paths are not counted: a client's typos
# must not add series.
COUNTED_HANDLERS = frozenset({*slo.SERVING_HANDLERS, "/v1/models"})


class Hist:
    """A classic histogram's state: per-bucket counts (not cumulative), sum, creation time."""

    __slots__ = ("bounds", "counts", "created", "total")

    def __init__(self, bounds: tuple[float, ...], created: float) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.created = created

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)


def http_key(handler: str, method: str, status: int) -> tuple[str, str, str]:
    """The label values of catalog.HTTP_REQUESTS for one answered request, as vLLM's API server
    (prometheus-fastapi-instrumentator) counts it: the status as its class ("2xx", "5xx")."""
    return handler, method, f"{status // 100}xx"


def http_counter(on_http: Callable[[str, str, int], None]) -> Middleware:
    """An aiohttp middleware that calls on_http(handler, method, status) once per request of
    COUNTED_HANDLERS, as vLLM's API server counts http_requests_total: the status answered, an
    exception's status (500 if it is not an HTTP one), and 2xx for a client that went away, streamed
    or not (a stream counts once its headers are out, however it ends; measured on vLLM 0.32)."""

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in COUNTED_HANDLERS:
            return await handler(request)
        status = 200  # stays so when the client leaves: the handler is cancelled, not failed
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except Exception:
            status = 500
            raise
        finally:
            on_http(request.path, request.method, status)

    return count


def family(metric: catalog.Metric, name: str, labels: dict[str, str], created: float,
           value: object) -> PromFamily:
    """One family as vLLM's prometheus_client writes it: a Hist for a histogram; for a counter or
    gauge a number, or a dict from the value of the catalog's extra label (a tuple: of its extra
    labels) to a number. Labels the catalog does not give the family are left out (the API
    server's families have no engine label)."""
    out = PromFamily(name, metric.help, metric.type.value)
    labels = {k: v for k, v in labels.items() if k in metric.labels}
    if metric.type is MetricType.HISTOGRAM:
        assert isinstance(value, Hist)
        cumulative = 0
        for bound, count in zip((*value.bounds, float("inf")), value.counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            out.add_sample(name + "_bucket", {**labels, "le": le}, float(cumulative))
        out.add_sample(name + "_count", labels, float(cumulative))
        out.add_sample(name + "_sum", labels, value.total)
        out.add_sample(name + "_created", labels, value.created)
        return out
    per_label = value if isinstance(value, dict) else {None: value}
    extra = metric.labels[len(labels):]
    for label_value, number in per_label.items():
        sample_labels = dict(labels)
        if isinstance(label_value, tuple):
            sample_labels.update(zip(extra, label_value, strict=True))
        elif extra and label_value is not None:
            sample_labels[extra[0]] = label_value
        if metric.type is MetricType.COUNTER:
            out.add_sample(name + "_total", sample_labels, float(number))  # type: ignore[arg-type]
            out.add_sample(name + "_created", sample_labels, created)
        else:
            out.add_sample(name, sample_labels, float(number))  # type: ignore[arg-type]
    return out
