"""``lenpred serve``: an OpenAI-compatible proxy in front of ``vllm serve --scheduling-policy priority`` that
predicts each request's output length and forwards it with vLLM's ``priority`` field (lower runs first), so stock
vLLM schedules shortest-predicted-job-first.

What it does to each request (Starlette app, httpx ``AsyncClient`` to the upstream):

* ``POST /v1/chat/completions`` and ``POST /v1/completions``: the JSON body's prompt (``messages`` through the same
  chat-template path as :meth:`lenpred.LengthPredictor.predict`; a completions ``prompt`` string is read as one
  user turn, a list of strings by the longest prediction) is predicted with ``max_tokens`` (or
  ``max_completion_tokens``) as the cap, and the body is forwarded with ``priority = int(round(expected))``.
  A request header ``x-lenpred-cap: N`` replaces that cap for the prediction only (it is not forwarded): for
  benchmarks that force each generation's length with ``max_tokens``, where clipping the prediction to
  ``max_tokens`` would hand it the true length. A cap that does not fit the predictor's context window next to the
  prompt is applied after an uncapped prediction.
  The prediction is returned in the headers ``x-lenpred-expected`` (tokens, 0.1), ``x-lenpred-priority`` and
  ``x-lenpred-predict-ms`` (what the prediction added to the request's latency: tokenising, waiting for a batch and
  the batch itself). A body that already holds ``priority`` keeps it (the client decides; the prediction is still
  reported). A prompt the proxy cannot read (token-id prompts, no prompt, one too long for the predictor's model)
  is forwarded with ``x-lenpred-skipped: <reason>``; the upstream then answers as it would.
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
* Responses are streamed back chunk by chunk (SSE passes through as the upstream writes it) with the upstream's
  status code, headers and body unchanged, errors included.

Predictions run off the request path's critical section (:mod:`lenpred.serving.proxy.batching`): each request tokenises in
its own thread, then one worker predicts queued requests in micro-batches, with the truncated forward
(:mod:`lenpred.truncated`) for predictors that read one layer's hidden states.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from typing import Any, Callable

from lenpred.errors import ContextWindowError, LenpredError
from lenpred.torch_state import torch_threads

PREDICTED_PATHS = ("/v1/chat/completions", "/v1/completions")
EXPECTED_HEADER, PRIORITY_HEADER, SKIPPED_HEADER = "x-lenpred-expected", "x-lenpred-priority", "x-lenpred-skipped"
PREDICT_MS_HEADER = "x-lenpred-predict-ms"  # wall time of the prediction (waiting for the predictor included)
CAP_HEADER = "x-lenpred-cap"  # request header: the prediction's cap instead of max_tokens (not forwarded)
POOL_WAIT_HEADER = "x-lenpred-pool-wait-ms"  # time waited for an upstream connection
DEFAULT_MAX_TOKENS_HEADER = "x-lenpred-default-max-tokens"  # the cap the proxy filled in (absent: the client's)
UPSTREAM_ID_HEADER, CLIENT_ID_HEADER = "x-lenpred-upstream-request-id", "x-lenpred-client-request-id"
# hop-by-hop headers (RFC 9110 §7.6.1) and those httpx / uvicorn recompute
_DROP_REQUEST = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te",
                 "proxy-connection", "accept-encoding", CAP_HEADER, "x-request-id"}
_DROP_RESPONSE = {"content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "server", "date"}

Predict = Callable[[list, int | None], float]
"""``predict(prompts, max_tokens) -> expected output tokens``: ``prompts`` is a list of prompts, each a string (one
user turn) or an OpenAI message list; the request's priority comes from the largest prediction."""


def predictor_fn(predictor) -> Predict:
    """A :data:`Predict` over a loaded :class:`lenpred.LengthPredictor` (its ``expected`` field: the expected
    observed length, clipped to the cap).

    A cap that does not fit the predictor's context window next to the prompt (clients often send a large
    ``max_tokens`` to an upstream with a longer window) is not an error: the prediction is made uncapped and then
    clipped to the cap."""
    def predict(prompts: list, max_tokens: int | None) -> float:
        try:
            return max(p.expected for p in predictor.predict(prompts, max_tokens))
        except ContextWindowError:
            if max_tokens is None:
                raise
        return min(max(p.expected for p in predictor.predict(prompts, None)), float(max_tokens))
    return predict


def _error(status: int, message: str, param: str | None = None):
    """An OpenAI-style error response (``{"error": {"message", "type", "param", "code"}}``); ``type`` is
    ``invalid_request_error`` for 4xx and ``server_error`` for 5xx."""
    from starlette.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


def _text_content(content: Any) -> Any:
    """A message's text: a string as is; OpenAI content parts (``[{"type": "text", "text": ...}, ...]``) joined;
    anything else returned unchanged (the prompt check then refuses it)."""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        texts = [p.get("text") for p in content if p.get("type") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(texts)
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
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is None:
            continue
        cap = _lax_int(value)
        if cap is None or cap < 1:
            raise ValueError(f"{field} = {json.dumps(value)[:40]} is not a positive whole number of tokens")
        return field, cap
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


class _ClientGone(Exception):
    """The client disconnected while the proxy waited on something for it."""


class _ClientWatch:
    """Watches one request's ASGI ``receive`` channel for ``http.disconnect`` (after the body was read) and races
    the proxy's awaits against it (:meth:`race`)."""

    def __init__(self, receive):
        self._task = asyncio.ensure_future(self._wait(receive))

    @staticmethod
    async def _wait(receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def race(self, awaitable):
        """The awaitable's result, or :class:`_ClientGone` (the awaitable cancelled) when the client leaves first;
        a result that is ready when both are wins."""
        work = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait({work, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                work.cancel()
        if work.done() and not work.cancelled():
            return work.result()
        raise _ClientGone

    def close(self) -> None:
        self._task.cancel()


class _Tail:
    """The last ``limit`` bytes of a response body, to read the usage from at its end."""

    def __init__(self, limit: int = 1 << 20):
        self.data, self.limit, self.truncated = bytearray(), limit, False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.limit:
            del self.data[:len(self.data) - self.limit]
            self.truncated = True

    def completion_tokens(self, content_type: str) -> int | None:
        """``usage.completion_tokens`` of a JSON body, or of the last SSE event that carries a usage; ``None``."""
        try:
            if content_type.startswith("text/event-stream"):
                for line in reversed(bytes(self.data).split(b"\n")):
                    if line.startswith(b"data:") and b'"usage"' in line:
                        usage = json.loads(line[5:]).get("usage") or {}
                        if usage.get("completion_tokens") is not None:
                            return int(usage["completion_tokens"])
            elif content_type.startswith("application/json") and not self.truncated:
                usage = json.loads(bytes(self.data)).get("usage") or {}
                return None if usage.get("completion_tokens") is None else int(usage["completion_tokens"])
        except (ValueError, TypeError, AttributeError):
            pass
        return None


def _upstream_ids(request, body: dict | None) -> tuple[str, str | None]:
    """``(upstream id, client id)``: a fresh id for this attempt, from the client's ``X-Request-Id`` header or body
    ``request_id`` (kept as the prefix, so logs join) plus a random suffix."""
    client_id = request.headers.get("x-request-id")
    if client_id is None and body is not None and isinstance(body.get("request_id"), str):
        client_id = body["request_id"]
    suffix = uuid.uuid4().hex
    return (f"{client_id[:100]}-{suffix[:16]}" if client_id else f"lenpred-{suffix}"), client_id


def create_app(upstream: str, predict, client=None, timeout_s: float | None = None, max_connections: int = 1024,
               default_max_tokens: int = 1024, batch=None, metrics=None):
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

    Raises:
        LenpredError: ``max_connections`` or ``default_max_tokens`` below 1.
    """
    import contextlib

    import httpx
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from lenpred.serving.proxy.batching import FunctionService, PredictionBatcher
    from lenpred.serving.proxy.metrics import ProxyMetrics

    if max_connections < 1 or default_max_tokens < 1:
        raise LenpredError(f"--max-connections and --default-max-tokens must be >= 1, got {max_connections} and "
                           f"{default_max_tokens}")
    upstream = upstream_root(upstream)
    metrics = metrics or ProxyMetrics()
    service = predict if hasattr(predict, "predict_batch") else FunctionService(predict)
    batcher = PredictionBatcher(service, batch, metrics)
    state: dict[str, Any] = {"client": client}
    pool = asyncio.Semaphore(max_connections)  # == the httpx pool's size: waits happen here, where they are timed

    class _Body(StreamingResponse):
        """Streams without Starlette's own disconnect listener: :class:`_ClientWatch` does that (and aborts the
        upstream request)."""

        async def __call__(self, scope, receive, send):
            await self.stream_response(send)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        own = state["client"] is None
        if own:
            limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
            state["client"] = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits)
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()
            if own:
                await state["client"].aclose()

    def finish(path: str | None, outcome: str) -> None:
        if path is not None:
            metrics.requests.labels(path, outcome).inc()

    async def forward(request, body: bytes, extra_headers: dict[str, str], watch: _ClientWatch, path=None,
                      expected: float | None = None):
        """Send upstream (one pooled connection, the client watched) and stream the answer back."""
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST]
        if extra_headers.get("content-type"):
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"] + [
                ("content-type", extra_headers["content-type"])]
        if extra_headers.get(UPSTREAM_ID_HEADER):
            headers.append(("x-request-id", extra_headers[UPSTREAM_ID_HEADER]))
        url = upstream + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        req = state["client"].build_request(request.method, url, headers=headers, content=body)
        waited = time.perf_counter()
        try:
            await watch.race(pool.acquire())
        except _ClientGone:
            return gone(watch, path, "waiting_upstream")
        wait_s = time.perf_counter() - waited
        metrics.pool_wait_s.observe(wait_s)
        metrics.in_flight.inc()
        released = False

        def release(*_):
            nonlocal released
            if not released:
                released = True
                pool.release()
                metrics.in_flight.dec()

        try:
            resp = await watch.race(state["client"].send(req, stream=True))
        except _ClientGone:
            release()
            return gone(watch, path, "waiting_upstream")
        except httpx.HTTPError as exc:
            release()
            watch.close()
            finish(path, "unreachable")
            return _error(502, f"upstream {upstream} unreachable ({type(exc).__name__}: {exc}): start it or fix "
                               "--upstream")
        except BaseException:
            release()
            watch.close()
            raise
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}
        out_headers.update({k: v for k, v in extra_headers.items() if k.startswith("x-lenpred")})
        out_headers[POOL_WAIT_HEADER] = f"{1e3 * wait_s:.1f}"
        content_type = resp.headers.get("content-type", "")

        async def stream():
            tail, complete = _Tail(), False
            try:
                chunks = resp.aiter_raw()
                while True:
                    try:
                        chunk = await watch.race(chunks.__anext__())
                    except StopAsyncIteration:
                        break
                    tail.add(chunk)
                    yield chunk
                complete = True
            except _ClientGone:
                metrics.cancellations.labels("streaming").inc()
                finish(path, "cancelled")
            except httpx.HTTPError:  # the upstream broke mid-body: break the client's stream too (not a clean end)
                finish(path, "upstream_error")
                raise
            finally:
                watch.close()
                closing = asyncio.ensure_future(resp.aclose())
                closing.add_done_callback(release)
                with contextlib.suppress(BaseException):
                    await asyncio.shield(closing)
            if complete:
                finish(path, "forwarded" if resp.status_code < 400 else "upstream_error")
                observed = tail.completion_tokens(content_type) if path is not None else None
                if observed is not None:
                    metrics.observed.observe(observed)
                    if expected is not None:
                        metrics.abs_error.observe(abs(expected - observed))

        return _Body(stream(), status_code=resp.status_code, headers=out_headers)

    def gone(watch: _ClientWatch, path: str | None, stage: str):
        watch.close()
        metrics.cancellations.labels(stage).inc()
        finish(path, "cancelled")
        return Response(status_code=499)  # nobody reads it (nginx's "client closed request")

    def refuse(path: str, message: str, param: str | None = None):
        finish(path, "refused")
        return _error(400, message, param)

    async def predicted(request):
        path = request.url.path
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return refuse(path, f"request body is not valid JSON ({exc}): send a JSON object with 'messages' (chat) "
                                "or 'prompt' (completions)")
        if not isinstance(body, dict):
            return refuse(path, f"request body is a JSON {type(body).__name__}, not an object: send a JSON object "
                                "with 'messages' (chat) or 'prompt' (completions)")
        if _samples(body) > 1:
            return refuse(path, f"n / best_of = {_samples(body):g}: lenpred serve forwards a priority, and vLLM's "
                                "priority scheduling with more than one sample per request has crashed its engine; "
                                "send n = 1 requests (several requests for several samples)", param="n")
        try:
            field, cap = client_cap(body)
        except ValueError as exc:
            return refuse(path, f"{exc}: send a whole number of tokens >= 1, or leave it out (lenpred serve then "
                                f"sends max_tokens = {default_max_tokens})", param="max_tokens")
        headers = {"content-type": "application/json"}
        if cap is None:
            cap = body["max_tokens"] = default_max_tokens
            headers[DEFAULT_MAX_TOKENS_HEADER] = str(default_max_tokens)
            metrics.default_max_tokens.inc()
        try:
            predict_cap = cap if request.headers.get(CAP_HEADER) is None else _header_cap(request.headers[CAP_HEADER])
        except ValueError as exc:
            return refuse(path, f"{exc}: send the cap the prediction is clipped to, or leave the header out")
        upstream_id, client_id = _upstream_ids(request, body)
        headers[UPSTREAM_ID_HEADER] = upstream_id
        if client_id is not None:
            headers[CLIENT_ID_HEADER] = client_id.encode("ascii", "replace").decode()[:200]
        if "request_id" in body:
            body["request_id"] = upstream_id
        watch = _ClientWatch(request.receive)
        prompts, skipped = request_prompts(path, body)
        expected = None
        if prompts is not None:
            started = time.perf_counter()
            try:
                prepared = await watch.race(run_in_threadpool(service.prepare, prompts, predict_cap))
                expected = await watch.race(batcher.predict(prepared))
            except _ClientGone:
                return gone(watch, path, "predicting")
            except LenpredError as exc:
                skipped = f"cannot predict: {exc}"
            else:
                elapsed_s = time.perf_counter() - started
                metrics.prediction_s.observe(elapsed_s)
                headers[PREDICT_MS_HEADER] = f"{1e3 * elapsed_s:.1f}"
                if not math.isfinite(expected):
                    skipped, expected = "prediction is not finite", None
                else:
                    metrics.predicted.observe(expected)
                    if "priority" not in body:
                        body["priority"] = int(round(expected))
                    headers |= {EXPECTED_HEADER: f"{expected:.1f}", PRIORITY_HEADER: str(body["priority"])}
        try:
            encoded = json.dumps(body, allow_nan=False).encode()
        except ValueError:  # e.g. 1e400 parsed as inf: forward the client's bytes instead of invalid JSON
            skipped = "the body holds a number JSON cannot carry (inf or nan)"
            headers = {k: v for k, v in headers.items() if k not in (EXPECTED_HEADER, PRIORITY_HEADER,
                                                                      DEFAULT_MAX_TOKENS_HEADER)}
            encoded, expected = raw, None
        if skipped is not None:
            headers[SKIPPED_HEADER] = skipped.encode("ascii", "replace").decode()[:200].replace("\n", " ")
        return await forward(request, encoded, headers, watch, path, expected)

    async def passthrough(request):
        body = await request.body()
        upstream_id, _ = _upstream_ids(request, None)
        return await forward(request, body, {UPSTREAM_ID_HEADER: upstream_id}, _ClientWatch(request.receive))

    async def health(request):
        ok = batcher.running
        return JSONResponse({"status": "ok" if ok else "prediction worker stopped", "prediction_queue": batcher.queued,
                             "upstream_in_flight": int(metrics.value("lenpred_proxy_upstream_in_flight")),
                             "max_connections": max_connections, "upstream": upstream}, status_code=200 if ok else 503)

    async def metrics_endpoint(request):
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    routes = [Route(p, predicted, methods=["POST"]) for p in PREDICTED_PATHS]
    routes += [Route("/health", health, methods=["GET"]), Route("/metrics", metrics_endpoint, methods=["GET"])]
    routes.append(Route("/{path:path}", passthrough, methods=methods))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.metrics, app.state.batcher = metrics, batcher
    return app


def serve(upstream: str, host: str = "127.0.0.1", port: int = 8001, predictor: str | None = None,
          threads: int | None = 1, timeout_s: float | None = None, max_connections: int = 1024,
          default_max_tokens: int = 1024, batch=None, truncated: bool = True) -> None:
    """Load the predictor and run the proxy with uvicorn until interrupted (the ``lenpred serve`` command).

    ``max_connections``, ``default_max_tokens``, ``batch``: see :func:`create_app`; ``truncated``: the truncated
    forward for hidden-state-only predictors (:mod:`lenpred.truncated`; off: the full prefill).

    ``host:port`` is checked first, bound once the way uvicorn binds it (IPv6 when ``host`` holds a colon,
    ``SO_REUSEADDR``) and closed, so a port in use fails at once, before the predictor loads.

    Raises:
        LenpredError: ``upstream`` is not an http(s) URL, ``host:port`` cannot be bound (in use, not permitted,
            unknown host), or the predictor cannot be loaded.
    """
    import errno
    import socket

    import uvicorn

    from lenpred.pipeline import LengthPredictor

    if not upstream.startswith(("http://", "https://")):
        raise LenpredError(f"--upstream must be an http(s) URL such as http://127.0.0.1:8000, got '{upstream}'")
    if not 0 <= port <= 65535:
        raise LenpredError(f"--port must be in 0..65535, got {port}")
    if max_connections < 1 or default_max_tokens < 1:
        raise LenpredError(f"--max-connections and --default-max-tokens must be >= 1, got {max_connections} and "
                           f"{default_max_tokens}")
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
    from lenpred.serving.proxy.batching import LengthPredictorService
    from lenpred.truncated import truncated_plan

    model = LengthPredictor.from_pretrained(predictor, threads=threads)
    plan = truncated_plan(model) if truncated else None
    how = f"truncated forward to layer {plan.layer} of {plan.num_layers}" if plan else "full prefill"
    print(f"lenpred serve: {model.method} predictor loaded ({how}); listening on http://{host}:{port}, forwarding to "
          f"{upstream_root(upstream)} with a priority per request (Ctrl-C stops)", flush=True)
    service = LengthPredictorService(model, truncated)
    service.warm_up()
    app = create_app(upstream, service, timeout_s=timeout_s,
                     max_connections=max_connections, default_max_tokens=default_max_tokens, batch=batch)
    # uvicorn's own connection cap stays off (limit_concurrency=None): queueing is the engine's job
    with torch_threads(threads):  # the process's count while it serves; restored when the server stops
        uvicorn.run(app, host=host, port=port, log_level="warning", backlog=4096)
