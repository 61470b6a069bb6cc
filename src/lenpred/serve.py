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
  prompt is applied after an uncapped prediction (:func:`predictor_fn`).
  The prediction is returned in the headers ``x-lenpred-expected`` (tokens, 0.1), ``x-lenpred-priority`` and
  ``x-lenpred-predict-ms`` (what the prediction added to the request's latency, queueing for the model included).
  A body that already holds ``priority`` keeps it (the client decides; the prediction is still reported).
  A prompt the proxy cannot read (token-id prompts, no prompt, one too long for the predictor's model) is
  forwarded unchanged with ``x-lenpred-skipped: <reason>``; the upstream then answers as it would.
* Refused with 400 and an OpenAI-style error body: a body that is not a JSON object, and ``n`` (or ``best_of``)
  > 1, as a number or a numeric string (vLLM's priority scheduling with several samples per request has crashed
  its engine).
* Every other path and method (``/v1/models``, ``/health``, ...) is forwarded as is.
* Responses are streamed back chunk by chunk (SSE passes through as the upstream writes it) with the upstream's
  status code, headers and body unchanged, errors included.

Predictions run one at a time in a worker thread (the model is one torch module), so they do not block the event
loop that streams other responses.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any, Callable

from lenpred.errors import ContextWindowError, LenpredError

PREDICTED_PATHS = ("/v1/chat/completions", "/v1/completions")
EXPECTED_HEADER, PRIORITY_HEADER, SKIPPED_HEADER = "x-lenpred-expected", "x-lenpred-priority", "x-lenpred-skipped"
PREDICT_MS_HEADER = "x-lenpred-predict-ms"  # wall time of the prediction (waiting for the predictor included)
CAP_HEADER = "x-lenpred-cap"  # request header: the prediction's cap instead of max_tokens (not forwarded)
# hop-by-hop headers (RFC 9110 §7.6.1) and those httpx / uvicorn recompute
_DROP_REQUEST = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te",
                 "proxy-connection", "accept-encoding", CAP_HEADER}
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


def _cap(body: dict, header: str | None = None) -> int | None:
    """The prediction's cap: the ``x-lenpred-cap`` header when given, else the body's ``max_completion_tokens`` /
    ``max_tokens``; ``None`` when neither is a positive integer.

    Raises:
        ValueError: the header is not a positive integer.
    """
    if header is not None:
        if not header.strip().isdigit() or int(header) < 1:
            raise ValueError(f"{CAP_HEADER} header '{header}' is not a positive integer (tokens)")
        return int(header)
    cap = body.get("max_completion_tokens")
    cap = body.get("max_tokens") if cap is None else cap  # an explicit null falls back to max_tokens
    cap = _lax_int(cap)
    return cap if cap is not None and cap > 0 else None


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


def create_app(upstream: str, predict: Predict, client=None, timeout_s: float | None = None):
    """The proxy as a Starlette app.

    Args:
        upstream: base URL of the OpenAI-compatible server, e.g. ``http://127.0.0.1:8000`` (paths are appended; a
            trailing ``/v1``, as in an OpenAI client's base URL, is dropped since the paths carry it).
        predict: see :data:`Predict` (:func:`predictor_fn` over a ``LengthPredictor``; a stub in tests).
        client: an ``httpx.AsyncClient`` to send with (tests pass one with a mock transport); default: one made
            at start-up and closed at shutdown.
        timeout_s: upstream read timeout (``None``: none; generations can be long).
    """
    import contextlib

    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    upstream = upstream_root(upstream)
    state: dict[str, Any] = {"client": client}
    lock = asyncio.Lock()  # one prediction at a time: the backbone is one torch module

    @contextlib.asynccontextmanager
    async def lifespan(app):
        own = state["client"] is None
        if own:
            state["client"] = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0))
        try:
            yield
        finally:
            if own:
                await state["client"].aclose()

    async def forward(request, body: bytes, extra_headers: dict[str, str]):
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST]
        if extra_headers.get("content-type"):
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"] + [
                ("content-type", extra_headers["content-type"])]
        url = upstream + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        req = state["client"].build_request(request.method, url, headers=headers, content=body)
        try:
            resp = await state["client"].send(req, stream=True)
        except httpx.HTTPError as exc:
            return _error(502, f"upstream {upstream} unreachable ({type(exc).__name__}: {exc}): start it or fix "
                               "--upstream")
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}
        out_headers.update({k: v for k, v in extra_headers.items() if k.startswith("x-lenpred")})
        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=out_headers,
                                 background=BackgroundTask(resp.aclose))

    async def predicted(request):
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, f"request body is not valid JSON ({exc}): send a JSON object with "
                               "'messages' (chat) or 'prompt' (completions)")
        if not isinstance(body, dict):
            return _error(400, f"request body is a JSON {type(body).__name__}, not an object: send a JSON object "
                               "with 'messages' (chat) or 'prompt' (completions)")
        if _samples(body) > 1:
            return _error(400, f"n / best_of = {_samples(body):g}: lenpred serve forwards a priority, and vLLM's "
                               "priority scheduling with more than one sample per request has crashed its engine; "
                               "send n = 1 requests (several requests for several samples)", param="n")
        try:
            cap = _cap(body, request.headers.get(CAP_HEADER))
        except ValueError as exc:
            return _error(400, f"{exc}: send the cap the prediction is clipped to, or leave the header out")
        prompts, skipped = request_prompts(request.url.path, body)
        headers = {"content-type": "application/json"}
        if prompts is not None:
            started = time.perf_counter()
            try:
                async with lock:
                    expected = await run_in_threadpool(predict, prompts, cap)
            except LenpredError as exc:
                skipped = f"cannot predict: {exc}"
            else:
                headers[PREDICT_MS_HEADER] = f"{1e3 * (time.perf_counter() - started):.1f}"
                if not math.isfinite(expected):
                    skipped = "prediction is not finite"
                else:
                    if "priority" not in body:
                        body["priority"] = int(round(expected))
                    headers |= {EXPECTED_HEADER: f"{expected:.1f}", PRIORITY_HEADER: str(body["priority"])}
        if skipped is None:
            try:
                encoded = json.dumps(body, allow_nan=False).encode()
            except ValueError:  # e.g. 1e400 parsed as inf: forward the client's bytes instead of invalid JSON
                skipped = "the body holds a number JSON cannot carry (inf or nan)"
                headers = {k: v for k, v in headers.items() if k not in (EXPECTED_HEADER, PRIORITY_HEADER)}
            else:
                return await forward(request, encoded, headers)
        headers[SKIPPED_HEADER] = skipped.encode("ascii", "replace").decode()[:200].replace("\n", " ")
        return await forward(request, raw, headers)

    async def passthrough(request):
        return await forward(request, await request.body(), {})

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    routes = [Route(p, predicted, methods=["POST"]) for p in PREDICTED_PATHS]
    routes.append(Route("/{path:path}", passthrough, methods=methods))
    return Starlette(routes=routes, lifespan=lifespan)


def serve(upstream: str, host: str = "127.0.0.1", port: int = 8001, predictor: str | None = None,
          threads: int | None = 1, timeout_s: float | None = None) -> None:
    """Load the predictor and run the proxy with uvicorn until interrupted (the ``lenpred serve`` command).

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
    model = LengthPredictor.from_pretrained(predictor, threads=threads)
    print(f"lenpred serve: {model.method} predictor loaded; listening on http://{host}:{port}, forwarding to "
          f"{upstream_root(upstream)} with a priority per request (Ctrl-C stops)", flush=True)
    uvicorn.run(create_app(upstream, predictor_fn(model), timeout_s=timeout_s), host=host, port=port,
                log_level="warning")
