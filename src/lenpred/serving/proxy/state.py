"""What the ``lenpred serve`` handlers share: the proxy's header names, one request on its way through
(:class:`ProxiedRequest`), what the ``on_finished`` hooks receive when it ends (:class:`FinishedRequest`), and the
app state (:class:`ProxyState`, ``app.state.proxy``)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from lenpred.outcome import RequestOutcome

_log = logging.getLogger("lenpred.serving.proxy")

AGING_EPOCH_S = 1767225600.0
"""The starvation guard's clock origin, Unix seconds (2026-01-01 00:00 UTC): fixed, so every proxy replica and
restart ages requests on one clock, and small enough that ``rate × seconds`` stays a modest integer."""
EXPECTED_HEADER, PRIORITY_HEADER, SKIPPED_HEADER = "x-lenpred-expected", "x-lenpred-priority", "x-lenpred-skipped"
PREDICT_MS_HEADER = "x-lenpred-predict-ms"  # wall time of the prediction (waiting for the predictor included)
CAP_HEADER = "x-lenpred-cap"  # request header: the prediction's cap instead of max_tokens (not forwarded)
POOL_WAIT_HEADER = "x-lenpred-pool-wait-ms"  # time waited for an upstream connection
DEFAULT_MAX_TOKENS_HEADER = "x-lenpred-default-max-tokens"  # the cap the proxy filled in (absent: the client's)
UPSTREAM_ID_HEADER, CLIENT_ID_HEADER = "x-lenpred-upstream-request-id", "x-lenpred-client-request-id"
LOW_HEADER, HIGH_HEADER = "x-lenpred-low", "x-lenpred-high"  # the served interval (online learning on)


@dataclass(kw_only=True)
class FinishedRequest(RequestOutcome):
    """What the proxy knows about one predicted-path request when it ends (the ``on_finished`` hooks' argument): the
    shared per-request record (:class:`lenpred.outcome.RequestOutcome`) and the proxy's own fields.

    Attributes:
        request_id: the id sent upstream (``X-Request-Id``; also the response's ``x-lenpred-upstream-request-id``).
        num_output_tokens: ``usage.completion_tokens`` of the upstream's answer; ``None`` when it carried no usage
            (a stream without ``stream_options.include_usage``) or did not complete.
        finish_reason: the answer's last ``finish_reason`` (``stop``, ``length``, ...); ``None`` when absent.
        max_new_tokens: the generation cap sent upstream (``max_tokens``: the client's, or the proxy's default).
        arrival_time_s, first_token_time_s, finish_time_s: Unix times (``time.time()``, seconds) of the request's
            arrival, the upstream's first body chunk (``None``: none arrived) and the end.
        num_prompt_tokens: ``None`` (the proxy does not count an upstream's prompt tokens).
        client_request_id: the client's own id, ``None`` when it sent none.
        path: ``/v1/chat/completions`` or ``/v1/completions``.
        outcome: ``forwarded``, ``upstream_error``, ``unreachable`` or ``cancelled`` (the ``requests`` metric's label).
        expected_tokens: the prediction (expected output tokens, clipped to ``prediction_cap_tokens``); ``None``
            when the prompt was skipped or the client left while it was predicted.
        prediction_cap_tokens: the cap the prediction was clipped to (``max_new_tokens`` unless ``x-lenpred-cap``).
        served: the :class:`lenpred.online.learning.ServedPrediction` (interval served, features the head read)
            when the service learns from its traffic and the request had one prompt; else ``None``.
    """

    client_request_id: str | None
    path: str
    outcome: str
    expected_tokens: float | None
    prediction_cap_tokens: int
    served: Any = None


FinishedHook = Callable[[FinishedRequest], None]
"""Called on the event loop when a predicted-path request ends: it must not block (hand slow work to a queue or a
thread). An exception it raises is logged and does not affect the response."""


@dataclass
class ProxiedRequest:
    """One predicted-path request on its way through the proxy.

    Attributes:
        path: the request path.
        body: the parsed JSON body, as it will be forwarded (``max_tokens``, ``priority``, ``request_id`` set here).
        headers: headers for the upstream (``content-type``) and the client (``x-lenpred-*``).
        max_tokens: the generation cap forwarded (tokens).
        prediction_cap_tokens: the cap of the prediction (tokens).
        upstream_id, client_id: see :class:`FinishedRequest`.
        received_at_s: Unix time of its arrival.
        expected: the prediction in tokens, once made (``None``: none).
        first_chunk_at_s: Unix time of the upstream's first body chunk.
        group: the request's Mondrian group key for an adaptive interval (the ``group_header`` value), or ``None``.
        served: see :class:`FinishedRequest`.
    """

    path: str
    body: dict
    headers: dict[str, str]
    max_tokens: int
    prediction_cap_tokens: int
    upstream_id: str
    client_id: str | None
    received_at_s: float
    expected: float | None = None
    first_chunk_at_s: float | None = None
    group: str | None = None
    served: Any = None


@dataclass
class ProxyState:
    """Everything the proxy's handlers share (``app.state.proxy``).

    Attributes:
        upstream: the upstream's root URL (:func:`lenpred.serving.proxy.app.upstream_root`).
        service: the prediction service (``prepare`` runs in a thread per request).
        batcher: the micro-batching prediction worker.
        metrics: the proxy's Prometheus metrics.
        max_connections: upstream connections at most (``pool`` and the httpx pool have this size).
        default_max_tokens: the cap filled in when the client sends none (tokens).
        timeout_s: upstream read timeout in seconds (``None``: none).
        client: the ``httpx.AsyncClient``; ``None`` until the lifespan makes one (then it also closes it).
        on_finished: hooks called with a :class:`FinishedRequest` when a predicted-path request ends.
        group_header: request header whose value is the request's group key (adaptive interval per route or
            client, Mondrian-style); ``None``: no groups.
        aging_tokens_per_s: the starvation guard: a request's priority is its prediction plus this many tokens per
            second of its arrival time on the shared clock :data:`AGING_EPOCH_S`
            (:func:`lenpred.serving.policies.aged_priority`), so one that waits in the engine's queue outranks a
            request predicted this much shorter per second it has waited. The clock is wall time, not the proxy's
            uptime, so proxy replicas in front of one engine and a restarted proxy rank alike. A client's own
            ``priority`` is kept as sent, and with the guard on it is compared with numbers of about
            ``aging_tokens_per_s × 3·10⁷`` (it then runs first). 0: off.
        pool: the connection semaphore (waits for a connection happen, and are timed, here).
    """

    upstream: str
    service: Any
    batcher: Any
    metrics: Any
    max_connections: int
    default_max_tokens: int
    timeout_s: float | None = None
    client: Any = None
    on_finished: list[FinishedHook] = field(default_factory=list)
    group_header: str | None = None
    aging_tokens_per_s: float = 0.0
    pool: asyncio.Semaphore = field(init=False)

    def __post_init__(self):
        self.pool = asyncio.Semaphore(self.max_connections)

    def count(self, path: str | None, outcome: str) -> None:
        """Count a predicted-path request's outcome (passthrough requests, ``path=None``, are not counted)."""
        if path is not None:
            self.metrics.requests.labels(path, outcome).inc()

    def finished(self, req: ProxiedRequest | None, outcome: str, observed_tokens: int | None = None,
                 finish_reason: str | None = None) -> None:
        """Call the ``on_finished`` hooks for ``req`` (nothing for passthrough requests, ``req=None``)."""
        if req is None or not self.on_finished:
            return
        record = FinishedRequest(
            request_id=req.upstream_id, num_output_tokens=observed_tokens, finish_reason=finish_reason,
            max_new_tokens=req.max_tokens, arrival_time_s=req.received_at_s, first_token_time_s=req.first_chunk_at_s,
            finish_time_s=time.time(), client_request_id=req.client_id, path=req.path, outcome=outcome,
            expected_tokens=req.expected, prediction_cap_tokens=req.prediction_cap_tokens, served=req.served)
        for hook in self.on_finished:
            try:
                hook(record)
            except Exception:  # noqa: BLE001 - a hook never breaks a response
                _log.exception("lenpred serve: an on_finished hook failed for request %s", req.upstream_id)
