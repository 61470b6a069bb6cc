"""Forwarding one request to the upstream for ``lenpred serve``: a pooled connection (the wait timed), the race
against the client leaving (:class:`ClientWatch`), the body relayed chunk by chunk, and what its tail says (usage,
finish reason: :class:`ResponseTail`) for the metrics and the ``on_finished`` hooks."""

from __future__ import annotations

import asyncio
import functools
import json
import time

from lenpred.serving.proxy.state import (CAP_HEADER, POOL_WAIT_HEADER, UPSTREAM_ID_HEADER, ProxiedRequest,
                                         ProxyState)

# hop-by-hop headers (RFC 9110 §7.6.1) and those httpx / uvicorn recompute
_DROP_REQUEST = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te",
                 "proxy-connection", "accept-encoding", CAP_HEADER, "x-request-id"}
_DROP_RESPONSE = {"content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "server", "date"}


def error_response(status: int, message: str, param: str | None = None):
    """An OpenAI-style error response (``{"error": {"message", "type", "param", "code"}}``); ``type`` is
    ``invalid_request_error`` for 4xx and ``server_error`` for 5xx."""
    from starlette.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


class ClientGone(Exception):
    """The client disconnected while the proxy waited on something for it."""


class ClientWatch:
    """Watches one request's ASGI ``receive`` channel for ``http.disconnect`` (after the body was read) and races
    the proxy's awaits against it (:meth:`race`)."""

    def __init__(self, receive):
        self._task = asyncio.ensure_future(self._wait(receive))

    @staticmethod
    async def _wait(receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def race(self, awaitable):
        """The awaitable's result, or :class:`ClientGone` (the awaitable cancelled) when the client leaves first;
        a result that is ready when both are wins."""
        work = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait({work, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                work.cancel()
        if work.done() and not work.cancelled():
            return work.result()
        raise ClientGone

    def close(self) -> None:
        self._task.cancel()


class ResponseTail:
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

    def finish_reason(self, content_type: str) -> str | None:
        """The last non-null ``choices[*].finish_reason`` of a JSON body or of the SSE events kept; ``None``."""
        try:
            if content_type.startswith("text/event-stream"):
                for line in reversed(bytes(self.data).split(b"\n")):
                    if line.startswith(b"data:") and b'"finish_reason"' in line:
                        reasons = [c.get("finish_reason") for c in json.loads(line[5:]).get("choices") or []]
                        reasons = [r for r in reasons if r is not None]
                        if reasons:
                            return str(reasons[-1])
            elif content_type.startswith("application/json") and not self.truncated:
                reasons = [c.get("finish_reason") for c in json.loads(bytes(self.data)).get("choices") or []]
                reasons = [r for r in reasons if r is not None]
                return str(reasons[-1]) if reasons else None
        except (ValueError, TypeError, AttributeError):
            pass
        return None


@functools.cache
def _body_class():
    """A ``StreamingResponse`` without Starlette's own disconnect listener: :class:`ClientWatch` does that (and
    aborts the upstream request). Made once, on first use (Starlette is the ``serve`` extra)."""
    from starlette.responses import StreamingResponse

    class _Body(StreamingResponse):
        async def __call__(self, scope, receive, send):
            await self.stream_response(send)

    return _Body


def gone_response(state: ProxyState, watch: ClientWatch, req: ProxiedRequest | None, stage: str):
    """The client left at ``stage``: stop watching, count it, and answer 499 (nobody reads it; nginx's "client
    closed request")."""
    from starlette.responses import Response

    watch.close()
    state.metrics.cancellations.labels(stage).inc()
    state.count(req.path if req else None, "cancelled")
    state.finished(req, "cancelled")
    return Response(status_code=499)


def _upstream_headers(request_headers, extra_headers: dict[str, str]) -> list[tuple[str, str]]:
    """The client's headers without hop-by-hop ones and the proxy's own, with the proxy's ``content-type`` and
    upstream ``x-request-id`` when given."""
    headers = [(k, v) for k, v in request_headers.items() if k.lower() not in _DROP_REQUEST]
    if extra_headers.get("content-type"):
        headers = [(k, v) for k, v in headers if k.lower() != "content-type"] + [
            ("content-type", extra_headers["content-type"])]
    if extra_headers.get(UPSTREAM_ID_HEADER):
        headers.append(("x-request-id", extra_headers[UPSTREAM_ID_HEADER]))
    return headers


async def forward(state: ProxyState, request, body: bytes, extra_headers: dict[str, str], watch: ClientWatch,
                  req: ProxiedRequest | None = None):
    """Send upstream (one pooled connection, the client watched) and stream the answer back with the upstream's
    status and headers plus the ``x-lenpred-*`` ones; a 502 when the upstream cannot be reached."""
    import httpx

    url = state.upstream + request.url.path + (f"?{request.url.query}" if request.url.query else "")
    upstream_req = state.client.build_request(request.method, url, headers=_upstream_headers(request.headers,
                                                                                             extra_headers),
                                              content=body)
    path = req.path if req else None
    waited = time.perf_counter()
    try:
        await watch.race(state.pool.acquire())
    except ClientGone:
        return gone_response(state, watch, req, "waiting_upstream")
    wait_s = time.perf_counter() - waited
    state.metrics.pool_wait_s.observe(wait_s)
    state.metrics.in_flight.inc()
    release = _Release(state)
    try:
        resp = await watch.race(state.client.send(upstream_req, stream=True))
    except ClientGone:
        release()
        return gone_response(state, watch, req, "waiting_upstream")
    except httpx.HTTPError as exc:
        release()
        watch.close()
        state.count(path, "unreachable")
        state.finished(req, "unreachable")
        return error_response(502, f"upstream {state.upstream} unreachable ({type(exc).__name__}: {exc}): start it "
                                   "or fix --upstream")
    except BaseException:
        release()
        watch.close()
        raise
    out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}
    out_headers.update({k: v for k, v in extra_headers.items() if k.startswith("x-lenpred")})
    out_headers[POOL_WAIT_HEADER] = f"{1e3 * wait_s:.1f}"
    return _body_class()(relay(state, resp, watch, release, req), status_code=resp.status_code, headers=out_headers)


class _Release:
    """Gives one upstream connection back (pool slot and in-flight gauge) exactly once; callable as a done
    callback."""

    def __init__(self, state: ProxyState):
        self.state, self.done = state, False

    def __call__(self, *_):
        if not self.done:
            self.done = True
            self.state.pool.release()
            self.state.metrics.in_flight.dec()


async def relay(state: ProxyState, resp, watch: ClientWatch, release: _Release, req: ProxiedRequest | None):
    """The upstream body chunk by chunk, raced against the client leaving; at the end the connection goes back (once
    the upstream response is closed) and a predicted-path request is counted, its observed tokens recorded and the
    ``on_finished`` hooks called."""
    import contextlib

    import httpx

    path = req.path if req else None
    tail, complete = ResponseTail(), False
    try:
        chunks = resp.aiter_raw()
        while True:
            try:
                chunk = await watch.race(chunks.__anext__())
            except StopAsyncIteration:
                break
            if req is not None and req.first_chunk_at_s is None:
                req.first_chunk_at_s = time.time()
            tail.add(chunk)
            yield chunk
        complete = True
    except ClientGone:
        state.metrics.cancellations.labels("streaming").inc()
        state.count(path, "cancelled")
        state.finished(req, "cancelled")
    except httpx.HTTPError:  # the upstream broke mid-body: break the client's stream too (not a clean end)
        state.count(path, "upstream_error")
        state.finished(req, "upstream_error")
        raise
    finally:
        watch.close()
        closing = asyncio.ensure_future(resp.aclose())
        closing.add_done_callback(release)
        with contextlib.suppress(BaseException):
            await asyncio.shield(closing)
    if complete:
        _record_answer(state, req, resp, tail)


def _record_answer(state: ProxyState, req: ProxiedRequest | None, resp, tail: ResponseTail) -> None:
    """A complete upstream answer: its outcome, observed tokens and prediction error (metrics), then the hooks."""
    path = req.path if req else None
    outcome = "forwarded" if resp.status_code < 400 else "upstream_error"
    state.count(path, outcome)
    content_type = resp.headers.get("content-type", "")
    observed = tail.completion_tokens(content_type) if path is not None else None
    if observed is not None:
        state.metrics.observed.observe(observed)
        if req.expected is not None:
            state.metrics.abs_error.observe(abs(req.expected - observed))
    if req is not None and state.on_finished:
        state.finished(req, outcome, observed, tail.finish_reason(content_type))
