"""``lenpred serve``: an OpenAI-compatible proxy in front of ``vllm serve --scheduling-policy priority`` that
predicts each request's output length and forwards it with vLLM's ``priority`` field (lower runs first), so stock
vLLM schedules shortest-predicted-job-first.

What it does to each request (Starlette app, httpx ``AsyncClient`` to the upstream):

* ``POST /v1/chat/completions`` and ``POST /v1/completions``: the JSON body's prompt (``messages`` through the same
  chat-template path as :meth:`lenpred.LengthPredictor.predict`; a completions ``prompt`` string is read as one
  user turn, a list of strings by the longest prediction) is predicted with ``max_tokens`` (or
  ``max_completion_tokens``) as the cap, and the body is forwarded with ``priority = int(round(expected))``, or
  with the starvation guard ``aging_tokens_per_s`` = k > 0, ``int(round(expected + k × t))`` with ``t`` the request's
  arrival in seconds since the fixed :data:`~lenpred.serving.proxy.state.AGING_EPOCH_S` (delay-dependent priority: a
  request that has waited W seconds in the engine's queue outranks one predicted k·W tokens shorter that came later).
  A request header ``x-lenpred-cap: N`` replaces that cap for the prediction only (it is not forwarded): for
  benchmarks that force each generation's length with ``max_tokens``, where clipping the prediction to
  ``max_tokens`` would hand it the true length. A cap that does not fit the predictor's context window next to the
  prompt is applied after an uncapped prediction.
  The prediction is returned in the headers ``x-lenpred-expected`` (tokens, 0.1), ``x-lenpred-priority`` and
  ``x-lenpred-predict-ms`` (what the prediction added to the request's latency: tokenising, waiting for a batch and
  the batch itself). A body that already holds a non-null ``priority`` keeps it (the client decides; the prediction
  is still reported; a null one counts as not given, since vLLM refuses it). A prompt the proxy cannot read (token-id
  prompts, no prompt, one too long for the predictor's model) is forwarded with ``x-lenpred-skipped: <reason>``; the
  upstream then answers as it would.
* **The cap.** A missing or null ``max_tokens`` (and ``max_completion_tokens``) is filled with one default
  (``default_max_tokens``, the same for every policy), forwarded, and reported in ``x-lenpred-default-max-tokens``;
  a cap that is not a positive integer is refused with 400 (before any prediction).
* **Request ids.** Every attempt goes upstream with its own ``X-Request-Id`` (and body ``request_id`` when the body
  has one): the client's id (header or body) plus a random suffix, or ``lenpred-<uuid>``. Both ids come back in
  ``x-lenpred-upstream-request-id`` / ``x-lenpred-client-request-id``, so logs can be joined (vLLM versions before its
  random-suffix change crash on duplicate ids; a client's retry reuses its id).
* **Disconnects.** A client that goes away aborts the upstream work at every stage: while its prompt is predicted
  (dropped from the batch queue; never sent), while the upstream has not answered yet (non-streaming requests: the
  upstream connection is closed, which vLLM reads as an abort) and mid-stream. Each is counted by stage.
* **Connections.** At most ``max_connections`` upstream connections (default 1024, above vLLM's default concurrency);
  the time a request waits for one is returned in ``x-lenpred-pool-wait-ms`` and recorded as a metric.
* Refused with 400 and an OpenAI-style error body: a body that is not a JSON object, a bad cap, and ``n`` (or
  ``best_of``) > 1, as a number or a numeric string (vLLM's priority scheduling with several samples per request has
  crashed its engine).
* ``GET /health``: the proxy's own state (200 while its prediction worker runs, else 503; JSON with the queue and
  connection counts); ``GET /metrics``: Prometheus metrics (:mod:`lenpred.serving.proxy.metrics`). The upstream's own
  ``/health`` and ``/metrics`` are on its port.
* Every other path and method (``/v1/models``, ...) is forwarded as is.
* **When a predicted-path request ends** (answered, upstream error, unreachable, client gone), the
  ``on_finished`` hooks get a :class:`~lenpred.serving.proxy.state.FinishedRequest`: ids, prediction, observed
  tokens, finish reason, caps, times.
* **Learning from served traffic** (``serve(traffic_log=..., adaptive_interval=...)``, off by default): the
  prediction service also serves each single-prompt request's interval, from the features its head read in the
  same pass, in ``x-lenpred-low`` / ``x-lenpred-high`` (adaptive online with ``adaptive_interval``, per the
  ``group_header`` value when given), and :func:`traffic_hook` feeds each answered request's observed
  ``usage.completion_tokens`` to :class:`lenpred.online.learning.OnlineLearning` (the traffic log's row, the
  adaptive margin's update). A stream logs only when its client asked for the usage
  (``stream_options.include_usage``); the proxy never changes what the client receives.
* Responses are streamed back chunk by chunk (SSE passes through as the upstream writes it) with the upstream's
  status code, headers and body unchanged, errors included.

The handlers are module-level functions over one :class:`~lenpred.serving.proxy.state.ProxyState`
(``app.state.proxy``: upstream client, prediction service and batcher, metrics, settings, hooks); forwarding is
:mod:`lenpred.serving.proxy.upstream`.

Predictions run off the request path's critical section (:mod:`lenpred.serving.proxy.batching`): each request
tokenises in its own thread, then one worker predicts queued requests in micro-batches, with the truncated forward
(:mod:`lenpred.truncated`) for predictors that read one layer's hidden states.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
import math
import time
import uuid
from typing import Any, Callable

from lenpred.errors import LenpredError
from lenpred.serving.policies import aged_priority, check_aging_rate
from lenpred.serving.proxy.state import (AGING_EPOCH_S, CAP_HEADER, CLIENT_ID_HEADER, DEFAULT_MAX_TOKENS_HEADER,
                                         EXPECTED_HEADER, HIGH_HEADER, LOW_HEADER, PREDICT_MS_HEADER, PRIORITY_HEADER,
                                         SKIPPED_HEADER, UPSTREAM_ID_HEADER, FinishedHook, FinishedRequest,
                                         ProxiedRequest, ProxyState)
from lenpred.serving.proxy.upstream import ClientGone, ClientWatch, error_response, forward, gone_response
from lenpred.torch_state import torch_threads

PREDICTED_PATHS = ("/v1/chat/completions", "/v1/completions")

Predict = Callable[[list, int | None], float]
"""``predict(prompts, max_tokens) -> expected output tokens``: ``prompts`` is a list of prompts, each a string (one
user turn) or an OpenAI message list; the request's priority comes from the largest prediction."""


def _text_content(content: Any) -> Any:
    """A message's text: a string as is; OpenAI content parts (``[{"type": "text", "text": ...}, ...]``) joined
    as vLLM's chat endpoint joins them for a template that reads ``content`` as a string (vLLM 0.32,
    ``renderers/chat_utils.py`` ``_parse_chat_message_content_parts``: the non-empty texts joined by ``"\\n"``);
    anything else returned unchanged (the prompt check then refuses it)."""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        texts = [p.get("text") for p in content if p.get("type") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(t for t in texts if t)
    return content


def request_prompts(path: str, body: dict) -> tuple[list | None, str | None]:
    """The prompts to predict from a request body, or ``(None, reason)`` when the proxy cannot read one.

    Returns:
        ``([messages], None)`` for chat completions, ``([str, ...], None)`` for completions.
    """
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None, "no messages"
        out = []
        for m in messages:
            if not isinstance(m, dict):
                return None, "a message is not an object"
            out.append({"role": m.get("role"), "content": _text_content(m.get("content"))})
        return [out], None
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt], None
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt), None
    return None, "prompt is not text (token ids or missing)"


def client_cap(body: dict) -> tuple[str | None, int | None]:
    """The client's generation cap as ``(field, tokens)``: ``max_completion_tokens`` when it is not null, else
    ``max_tokens``; ``(None, None)`` when both are missing or null. Numbers are read as the upstream reads them
    (``50``, ``50.0``, ``"50"``).

    Raises:
        ValueError: the field is there but not a positive whole number.
    """
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        cap = _lax_int(value)
        if cap is None or cap < 1:
            raise ValueError(f"{name} = {json.dumps(value)[:40]} is not a positive whole number of tokens")
        return name, cap
    return None, None


def _header_cap(header: str) -> int:
    """The ``x-lenpred-cap`` header's tokens.

    Raises:
        ValueError: not a positive integer.
    """
    if not header.strip().isdigit() or int(header) < 1:
        raise ValueError(f"{CAP_HEADER} header '{header}' is not a positive integer (tokens)")
    return int(header)


def _lax_number(value: Any) -> float | None:
    """A finite number as the upstream's validation reads one (pydantic's lax mode: ``2``, ``2.0``, ``"2"``), or
    ``None`` (booleans, non-numeric strings, other types, inf / nan)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _lax_int(value: Any) -> int | None:
    """:func:`_lax_number` when it is a whole number, else ``None``."""
    number = _lax_number(value)
    return int(number) if number is not None and number == int(number) else None


def _samples(body: dict) -> float:
    """The most samples ``n`` / ``best_of`` ask for, read as the upstream reads them (:func:`_lax_number`); 1 when
    neither is a number."""
    return max([1.0, *(n for n in (_lax_number(body.get(k)) for k in ("n", "best_of")) if n is not None)])


def upstream_root(upstream: str) -> str:
    """The server root the request paths are appended to: a trailing ``/`` and ``/v1`` (an OpenAI client's base
    URL) dropped, since the paths carry ``/v1``."""
    root = upstream.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


def _upstream_ids(request_headers, body: dict | None) -> tuple[str, str | None]:
    """``(upstream id, client id)``: a fresh id for this attempt, from the client's ``X-Request-Id`` header or body
    ``request_id`` (kept as the prefix, so logs join) plus a random suffix."""
    client_id = request_headers.get("x-request-id")
    if client_id is None and body is not None and isinstance(body.get("request_id"), str):
        client_id = body["request_id"]
    suffix = uuid.uuid4().hex
    return (f"{client_id[:100]}-{suffix[:16]}" if client_id else f"lenpred-{suffix}"), client_id


def _refuse(state: ProxyState, path: str, message: str, param: str | None = None):
    state.count(path, "refused")
    return error_response(400, message, param)


def parse_predicted(state: ProxyState, path: str, raw: bytes, request_headers) -> ProxiedRequest | Any:
    """Read a predicted-path request: its JSON body, the generation cap (the default filled in when missing), the
    prediction's cap (``x-lenpred-cap``) and the ids; or a 400 response (counted as ``refused``) for a body that is
    not a JSON object, ``n`` / ``best_of`` > 1, or a bad cap.

    Args:
        state: the proxy's state (default cap, metrics).
        path: the request path.
        raw: the request body.
        request_headers: the client's headers (a mapping with ``get``, case-insensitive as Starlette's).
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return _refuse(state, path, f"request body is not valid JSON ({exc}): send a JSON object with 'messages' "
                                    "(chat) or 'prompt' (completions)")
    if not isinstance(body, dict):
        return _refuse(state, path, f"request body is a JSON {type(body).__name__}, not an object: send a JSON "
                                    "object with 'messages' (chat) or 'prompt' (completions)")
    if _samples(body) > 1:
        return _refuse(state, path, f"n / best_of = {_samples(body):g}: lenpred serve forwards a priority, and vLLM's "
                                    "priority scheduling with more than one sample per request has crashed its "
                                    "engine; send n = 1 requests (several requests for several samples)", param="n")
    try:
        _, cap = client_cap(body)
    except ValueError as exc:
        return _refuse(state, path, f"{exc}: send a whole number of tokens >= 1, or leave it out (lenpred serve then "
                                    f"sends max_tokens = {state.default_max_tokens})", param="max_tokens")
    headers = {"content-type": "application/json"}
    if cap is None:
        cap = body["max_tokens"] = state.default_max_tokens
        headers[DEFAULT_MAX_TOKENS_HEADER] = str(state.default_max_tokens)
        state.metrics.default_max_tokens.inc()
    try:
        predict_cap = cap if request_headers.get(CAP_HEADER) is None else _header_cap(request_headers[CAP_HEADER])
    except ValueError as exc:
        return _refuse(state, path, f"{exc}: send the cap the prediction is clipped to, or leave the header out")
    upstream_id, client_id = _upstream_ids(request_headers, body)
    headers[UPSTREAM_ID_HEADER] = upstream_id
    if client_id is not None:
        headers[CLIENT_ID_HEADER] = client_id.encode("ascii", "replace").decode()[:200]
    if "request_id" in body:
        body["request_id"] = upstream_id
    if "priority" in body and body["priority"] is None:  # null = not given (vLLM's `priority: int` refuses null)
        del body["priority"]
    group = request_headers.get(state.group_header) if state.group_header else None
    return ProxiedRequest(path, body, headers, cap, predict_cap, upstream_id, client_id, time.time(), group=group)


async def predict_priority(state: ProxyState, req: ProxiedRequest, watch: ClientWatch) -> str | None:
    """Predict ``req``'s prompts and set its ``priority`` (unless the client sent one) and the prediction headers.

    Returns:
        Why the prompt was skipped (``None``: predicted).

    Raises:
        ClientGone: the client left while it was predicted.
    """
    from starlette.concurrency import run_in_threadpool

    prompts, skipped = request_prompts(req.path, req.body)
    if prompts is None:
        return skipped
    started = time.perf_counter()
    try:
        prepared = await watch.race(run_in_threadpool(state.service.prepare, prompts, req.prediction_cap_tokens,
                                                      req.group))
        expected = await watch.race(state.batcher.predict(prepared))
    except LenpredError as exc:
        return f"cannot predict: {exc}"
    elapsed_s = time.perf_counter() - started
    state.metrics.prediction_s.observe(elapsed_s)
    req.headers[PREDICT_MS_HEADER] = f"{1e3 * elapsed_s:.1f}"
    if not math.isfinite(expected):
        return "prediction is not finite"
    req.expected = expected
    state.metrics.predicted.observe(expected)
    if "priority" not in req.body:
        arrival_s = req.received_at_s - AGING_EPOCH_S
        req.body["priority"] = int(round(aged_priority(expected, arrival_s, state.aging_tokens_per_s)))
    req.headers |= {EXPECTED_HEADER: f"{expected:.1f}", PRIORITY_HEADER: str(req.body["priority"])}
    req.served = prepared.served
    if req.served is not None:
        req.headers |= {LOW_HEADER: f"{req.served.low:.1f}", HIGH_HEADER: f"{req.served.high:.1f}"}
    return None


def encode_body(req: ProxiedRequest, raw: bytes, skipped: str | None) -> bytes:
    """The body to forward: ``req.body`` as JSON, or the client's bytes when it holds a number JSON cannot carry
    (e.g. ``1e400`` parsed as inf; the prediction headers are then dropped). Sets ``x-lenpred-skipped``."""
    try:
        encoded = json.dumps(req.body, allow_nan=False).encode()
    except ValueError:
        skipped = "the body holds a number JSON cannot carry (inf or nan)"
        req.headers = {k: v for k, v in req.headers.items() if k not in (EXPECTED_HEADER, PRIORITY_HEADER, LOW_HEADER,
                                                                          HIGH_HEADER, DEFAULT_MAX_TOKENS_HEADER)}
        encoded, req.expected, req.served = raw, None, None
    if skipped is not None:
        req.headers[SKIPPED_HEADER] = skipped.encode("ascii", "replace").decode()[:200].replace("\n", " ")
    return encoded


async def predicted_endpoint(request):
    """``POST /v1/chat/completions`` and ``/v1/completions``: read, predict, set the priority, forward."""
    state: ProxyState = request.app.state.proxy
    raw = await request.body()
    req = parse_predicted(state, request.url.path, raw, request.headers)
    if not isinstance(req, ProxiedRequest):
        return req  # refused
    watch = ClientWatch(request.receive)
    try:
        skipped = await predict_priority(state, req, watch)
    except ClientGone:
        return gone_response(state, watch, req, "predicting")
    encoded = encode_body(req, raw, skipped)
    return await forward(state, request, encoded, req.headers, watch, req)


async def passthrough_endpoint(request):
    """Every other path and method: forwarded as is (with a fresh upstream request id)."""
    state: ProxyState = request.app.state.proxy
    body = await request.body()
    upstream_id, _ = _upstream_ids(request.headers, None)
    return await forward(state, request, body, {UPSTREAM_ID_HEADER: upstream_id}, ClientWatch(request.receive))


async def health_endpoint(request):
    """``GET /health``: 200 while the prediction worker runs (else 503), with the queue and connection counts."""
    from starlette.responses import JSONResponse

    state: ProxyState = request.app.state.proxy
    ok = state.batcher.running
    return JSONResponse({"status": "ok" if ok else "prediction worker stopped",
                         "prediction_queue": state.batcher.queued,
                         "upstream_in_flight": int(state.metrics.value("lenpred_proxy_upstream_in_flight")),
                         "max_connections": state.max_connections, "upstream": state.upstream},
                        status_code=200 if ok else 503)


async def metrics_endpoint(request):
    """``GET /metrics``: the proxy's Prometheus metrics."""
    from starlette.responses import Response

    body, content_type = request.app.state.proxy.metrics.render()
    return Response(body, media_type=content_type)


@contextlib.asynccontextmanager
async def _lifespan(app):
    """Make the upstream client when none was given (closed at shutdown) and run the prediction worker."""
    import httpx

    state: ProxyState = app.state.proxy
    own = state.client is None
    if own:
        limits = httpx.Limits(max_connections=state.max_connections, max_keepalive_connections=state.max_connections)
        state.client = httpx.AsyncClient(timeout=httpx.Timeout(state.timeout_s, connect=10.0), limits=limits)
    await state.batcher.start()
    try:
        yield
    finally:
        await state.batcher.stop()
        if own:
            await state.client.aclose()


def create_app(upstream: str, predict, client=None, timeout_s: float | None = None, max_connections: int = 1024,
               default_max_tokens: int = 1024, batch=None, metrics=None, on_finished: tuple[FinishedHook, ...] = (),
               group_header: str | None = None, aging_tokens_per_s: float = 0.0):
    """The proxy as a Starlette app.

    Args:
        upstream: base URL of the OpenAI-compatible server, e.g. ``http://127.0.0.1:8000`` (paths are appended; a
            trailing ``/v1``, as in an OpenAI client's base URL, is dropped since the paths carry it).
        predict: a :class:`lenpred.serving.proxy.batching.PredictionService` (``LengthPredictorService`` over a loaded
            ``LengthPredictor``), or a plain :data:`Predict` function (a stub in tests; one call per request).
        client: an ``httpx.AsyncClient`` to send with (tests pass one with a mock transport); default: one made
            at start-up with ``max_connections`` connections and closed at shutdown.
        timeout_s: upstream read timeout (``None``: none; generations can be long).
        max_connections: upstream connections at most; more concurrent requests wait (recorded). Keep it above the
            upstream's concurrency (vLLM's ``--max-num-seqs``, 256 or 1024 by default, plus its queue).
        default_max_tokens: the cap sent when the client gives none (tokens).
        batch: :class:`lenpred.serving.proxy.batching.BatchConfig` (default: its defaults).
        metrics: a :class:`lenpred.serving.proxy.metrics.ProxyMetrics` (default: a new one); also ``app.state.metrics``.
        on_finished: :data:`FinishedHook` functions called when a predicted-path request ends (also
            ``app.state.proxy.on_finished``, where more can be appended before serving).
        group_header: request header whose value is the request's group key, passed to the service's ``prepare``
            (an adaptive interval per route or client); ``None``: no groups.
        aging_tokens_per_s: the starvation guard (:class:`ProxyState`); 0: off.

    Returns:
        The app; its state is ``app.state.proxy`` (:class:`ProxyState`), with ``app.state.metrics`` and
        ``app.state.batcher`` as shortcuts.

    Raises:
        LenpredError: ``max_connections`` or ``default_max_tokens`` below 1, or ``aging_tokens_per_s`` negative,
            not finite or above :data:`lenpred.serving.policies.MAX_AGING_TOKENS_PER_S`.
    """
    from starlette.applications import Starlette
    from starlette.routing import Route

    from lenpred.serving.proxy.batching import FunctionService, PredictionBatcher
    from lenpred.serving.proxy.metrics import ProxyMetrics

    _check_limits(max_connections, default_max_tokens, aging_tokens_per_s)
    metrics = metrics or ProxyMetrics()
    service = predict if hasattr(predict, "predict_batch") else FunctionService(predict)
    state = ProxyState(upstream_root(upstream), service, PredictionBatcher(service, batch, metrics), metrics,
                       max_connections, default_max_tokens, timeout_s, client, list(on_finished), group_header,
                       aging_tokens_per_s)
    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    routes = [Route(p, predicted_endpoint, methods=["POST"]) for p in PREDICTED_PATHS]
    routes += [Route("/health", health_endpoint, methods=["GET"]), Route("/metrics", metrics_endpoint, methods=["GET"])]
    routes.append(Route("/{path:path}", passthrough_endpoint, methods=methods))
    app = Starlette(routes=routes, lifespan=_lifespan)
    app.state.proxy, app.state.metrics, app.state.batcher = state, metrics, state.batcher
    return app


def traffic_hook(online) -> FinishedHook:
    """The ``on_finished`` hook that teaches ``online`` (a :class:`lenpred.online.learning.OnlineLearning`) from
    each answered request: its served prediction and the request's outcome (``num_output_tokens`` from
    ``usage.completion_tokens``, finish reason, times). Requests without a served prediction (several prompts,
    skipped, online learning off), without a usage, or not answered (upstream error, client gone) teach nothing:
    their length is unknown. The traffic log journals the row with one unsynced write (about 0.1 ms) and writes its
    parts on its own thread, so the hook does not block the event loop for long."""

    def hook(r: FinishedRequest) -> None:
        if r.served is None or r.num_output_tokens is None or r.outcome != "forwarded":
            return
        online.finished(r.served, r)

    return hook


def _check_limits(max_connections: int, default_max_tokens: int, aging_tokens_per_s: float) -> None:
    """Nothing; raises :class:`LenpredError` for a connection or token limit below 1 or an aging rate outside
    :func:`lenpred.serving.policies.check_aging_rate`'s range."""
    if max_connections < 1 or default_max_tokens < 1:
        raise LenpredError(f"--max-connections and --default-max-tokens must be >= 1, got {max_connections} and "
                           f"{default_max_tokens}")
    try:
        check_aging_rate(aging_tokens_per_s)
    except LenpredError as exc:
        raise LenpredError(f"--aging-tokens-per-s: {exc}") from None


def _check_serve_args(upstream: str, port: int, max_connections: int, default_max_tokens: int,
                      traffic_log: str | None, adaptive_interval: str | None, aging_tokens_per_s: float) -> None:
    """Nothing; raises :class:`LenpredError` for the first of :func:`serve`'s arguments that is not valid."""
    import urllib.parse

    parts = urllib.parse.urlsplit(upstream)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LenpredError(f"--upstream must be an http(s) URL with a host, such as http://127.0.0.1:8000, got "
                           f"'{upstream}'")
    if traffic_log is not None and any(p.exists() and not p.is_dir() for p in (Path(traffic_log),
                                                                                *Path(traffic_log).parents)):
        raise LenpredError(f"--traffic-log {traffic_log} is (or lies under) a file: pass a directory")
    if not 0 <= port <= 65535:
        raise LenpredError(f"--port must be in 0..65535, got {port}")
    _check_limits(max_connections, default_max_tokens, aging_tokens_per_s)
    from lenpred.online.adaptive import METHODS

    if adaptive_interval is not None and adaptive_interval not in METHODS:
        raise LenpredError(f"unknown --adaptive-interval '{adaptive_interval}'; valid: {', '.join(METHODS)}")


def _check_port_free(host: str, port: int) -> None:
    """Nothing; raises :class:`LenpredError` when ``host:port`` cannot be bound the way uvicorn binds it."""
    import errno
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:  # socket.gaierror (unknown host) included
            if exc.errno == errno.EADDRINUSE:
                raise LenpredError(f"port {port} on {host} is already in use (another server listens there): pass a "
                                   "free one with --port, or stop that server") from None
            raise LenpredError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): pass another --port or "
                               "--host") from None


def _online_learning(model, traffic_log: str | None, adaptive_interval: str | None):
    """The :class:`lenpred.online.learning.OnlineLearning` of ``serve``'s traffic options (``None``: both off)."""
    if not (traffic_log or adaptive_interval):
        return None
    from lenpred.online.adaptive import AdaptiveConfig
    from lenpred.online.learning import OnlineLearning
    from lenpred.online.traffic_log import TrafficLogConfig

    return OnlineLearning(model, log=TrafficLogConfig(traffic_log) if traffic_log else None,
                          adaptive=AdaptiveConfig(method=adaptive_interval) if adaptive_interval else None)


def _check_serve_extra() -> None:
    """Raise :class:`LenpredError` naming the modules of pyproject's ``serve`` extra (read from the installed
    package's metadata) that cannot be imported, and the install command."""
    import importlib.util
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    wanted = [Requirement(r) for r in requires("lenpred") or ()]
    modules = [r.name.replace("-", "_") for r in wanted if r.marker and r.marker.evaluate({"extra": "serve"})]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise LenpredError(f"lenpred serve needs the serve extra ({', '.join(missing)} not installed): "
                           "pip install -e '.[serve]' from the repository root")


def serve(upstream: str, host: str = "127.0.0.1", port: int = 8001, predictor: str | None = None,
          threads: int | None = 1, timeout_s: float | None = None, max_connections: int = 1024,
          default_max_tokens: int = 1024, batch=None, truncated: bool = True, traffic_log: str | None = None,
          adaptive_interval: str | None = None, group_header: str | None = None, aging_tokens_per_s: float = 0.0,
          on_ready=None) -> None:
    """Load the predictor and run the proxy with uvicorn until interrupted (the ``lenpred serve`` command).

    ``max_connections``, ``default_max_tokens``, ``batch``, ``group_header``, ``aging_tokens_per_s``: see
    :func:`create_app`;
    ``truncated``: the truncated forward for hidden-state-only predictors (:mod:`lenpred.truncated`; off: the full
    prefill). ``traffic_log`` (a directory: :mod:`lenpred.online.traffic_log`) and ``adaptive_interval`` (``aci``
    or ``rolling``: :mod:`lenpred.online.adaptive`) switch on learning from served traffic (a pooled-head
    predictor only); the log is flushed when the server stops. ``on_ready(message)`` is called once the predictor
    is loaded, before uvicorn starts (``None``: the message is logged at INFO).

    ``host:port`` is checked first, bound once the way uvicorn binds it (IPv6 when ``host`` holds a colon,
    ``SO_REUSEADDR``) and closed, so a port in use fails at once, before the predictor loads.

    Raises:
        LenpredError: the ``serve`` extra is not installed, ``upstream`` is not an http(s) URL, ``host:port``
            cannot be bound (in use, not permitted, unknown host), or the predictor cannot be loaded.
    """
    _check_serve_extra()
    import uvicorn

    from lenpred.pipeline import LengthPredictor

    _check_serve_args(upstream, port, max_connections, default_max_tokens, traffic_log, adaptive_interval,
                      aging_tokens_per_s)
    _check_port_free(host, port)
    from lenpred.serving.proxy.batching import LengthPredictorService
    from lenpred.truncated import truncated_plan

    model = LengthPredictor.from_pretrained(predictor, threads=threads)
    plan = truncated_plan(model.predictor_.reads(), model.backbone_.num_layers) if truncated else None
    how = f"truncated forward to layer {plan.layer} of {plan.num_layers}" if plan else "full prefill"
    message = (f"lenpred serve: {model.method} predictor loaded ({how}); listening on http://{host}:{port}, "
               f"forwarding to {upstream_root(upstream)} with a priority per request (Ctrl-C stops)")
    (on_ready or logging.getLogger(__name__).info)(message)
    online = _online_learning(model, traffic_log, adaptive_interval)
    service = LengthPredictorService(model, truncated, online=online)
    service.warm_up()
    app = create_app(upstream, service, timeout_s=timeout_s, max_connections=max_connections,
                     default_max_tokens=default_max_tokens, batch=batch, group_header=group_header,
                     aging_tokens_per_s=aging_tokens_per_s, on_finished=() if online is None else (traffic_hook(online),))
    try:  # uvicorn's own connection cap stays off (limit_concurrency=None): queueing is the engine's job
        with torch_threads(threads):  # the process's count while it serves; restored when the server stops
            uvicorn.run(app, host=host, port=port, log_level="warning", backlog=4096)
    finally:
        if online is not None:
            online.close()
