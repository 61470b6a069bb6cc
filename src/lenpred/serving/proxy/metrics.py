"""Prometheus metrics of ``lenpred serve`` (``GET /metrics``), one :class:`ProxyMetrics` per app on its own
``prometheus_client.CollectorRegistry`` (no process-global state: two apps in one process count apart).

Names follow Prometheus conventions (``_total`` counters, ``_seconds`` / ``_tokens`` units):

* ``lenpred_proxy_requests_total{path, outcome}``: predicted-path requests by how they ended: ``forwarded`` (an
  upstream 2xx whose body reached the client), ``upstream_error`` (the upstream answered 4xx / 5xx),
  ``unreachable`` (502: no connection), ``refused`` (the proxy's own 400), ``cancelled`` (the client went away).
* ``lenpred_proxy_cancellations_total{stage}``: client disconnects by stage: ``predicting`` (the request never
  reached the upstream), ``waiting_upstream`` (sent, no response headers yet: non-streaming requests), ``streaming``
  (mid-body). In every stage the upstream request is aborted (its connection closed).
* ``lenpred_proxy_prediction_seconds``: per request, submit to result (queueing for the predictor included);
  ``lenpred_proxy_prediction_batch_seconds``: one batch's forward + head; ``lenpred_proxy_prediction_batch_size``:
  requests per batch; ``lenpred_proxy_prediction_queue``: requests waiting for the predictor now.
* ``lenpred_proxy_pool_wait_seconds``: time a request waited for an upstream connection (0 unless more than
  ``max_connections`` are in flight); ``lenpred_proxy_upstream_in_flight``: connections held now.
* ``lenpred_proxy_predicted_output_tokens`` / ``lenpred_proxy_observed_output_tokens``: the prediction and the
  usage's ``completion_tokens`` (final usage chunk of a stream, or the JSON body), with
  ``lenpred_proxy_prediction_abs_error_tokens`` = ``|predicted − observed|`` for requests that have both.
* ``lenpred_proxy_default_max_tokens_total``: requests whose missing / null ``max_tokens`` the proxy filled.
"""

from __future__ import annotations

from lenpred.errors import LenpredError

OUTCOMES = ("forwarded", "upstream_error", "unreachable", "refused", "cancelled")
STAGES = ("predicting", "waiting_upstream", "streaming")
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, float("inf"))
_SECOND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   float("inf"))


class ProxyMetrics:
    """The proxy's counters and histograms on a private registry (see the module docstring for the names).

    Raises:
        LenpredError: ``prometheus_client`` is not installed (the ``serve`` extra).
    """

    def __init__(self):
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError:
            raise LenpredError("lenpred serve needs prometheus_client: pip install 'lenpred[serve]'") from None
        self.registry = r = CollectorRegistry()
        self.requests = Counter("lenpred_proxy_requests", "Predicted-path requests by outcome",
                                ["path", "outcome"], registry=r)
        self.cancellations = Counter("lenpred_proxy_cancellations", "Client disconnects (upstream work aborted)",
                                     ["stage"], registry=r)
        self.prediction_s = Histogram("lenpred_proxy_prediction_seconds", "Prediction latency per request, "
                                      "queueing included", buckets=_SECOND_BUCKETS, registry=r)
        self.batch_s = Histogram("lenpred_proxy_prediction_batch_seconds", "Forward + head time of one batch",
                                 buckets=_SECOND_BUCKETS, registry=r)
        self.batch_size = Histogram("lenpred_proxy_prediction_batch_size", "Requests per prediction batch",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, float("inf")), registry=r)
        self.queue = Gauge("lenpred_proxy_prediction_queue", "Requests waiting for the predictor", registry=r)
        self.pool_wait_s = Histogram("lenpred_proxy_pool_wait_seconds", "Wait for an upstream connection",
                                     buckets=_SECOND_BUCKETS, registry=r)
        self.in_flight = Gauge("lenpred_proxy_upstream_in_flight", "Upstream connections held", registry=r)
        self.predicted = Histogram("lenpred_proxy_predicted_output_tokens", "Predicted output tokens",
                                   buckets=_TOKEN_BUCKETS, registry=r)
        self.observed = Histogram("lenpred_proxy_observed_output_tokens", "Observed completion tokens (usage)",
                                  buckets=_TOKEN_BUCKETS, registry=r)
        self.abs_error = Histogram("lenpred_proxy_prediction_abs_error_tokens", "|predicted - observed| tokens",
                                   buckets=_TOKEN_BUCKETS, registry=r)
        self.default_max_tokens = Counter("lenpred_proxy_default_max_tokens", "Requests given the default "
                                          "max_tokens", registry=r)
        for outcome in OUTCOMES:  # every series exists from the start (a rate over 0 is 0, not absent)
            for path in ("/v1/chat/completions", "/v1/completions"):
                self.requests.labels(path, outcome)
        for stage in STAGES:
            self.cancellations.labels(stage)

    def render(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the text exposition format."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def value(self, name: str, **labels) -> float:
        """A sample's current value (``name`` as exposed, e.g. ``lenpred_proxy_cancellations_total``); 0 when the
        series does not exist. For tests and ``/health``."""
        got = self.registry.get_sample_value(name, labels or None)
        return 0.0 if got is None else got
