"""A load generator for an OpenAI-compatible server: replays requests at given arrival times (e.g. Poisson) with
streaming chat completions and records, per request, when it was sent, when its first token and its last chunk
arrived, and what the server reported (tokens, the ``lenpred serve`` prediction headers)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass


@dataclass
class LoadRequest:
    """One request to replay.

    Attributes:
        request_id: the workload request.
        messages: OpenAI chat messages.
        max_tokens: generation cap (the run forces exactly this many tokens with ``ignore_eos``).
        arrival_s: seconds after the replay starts at which it is sent.
        priority: sent as vLLM's ``priority`` field; ``None``: not sent (``lenpred serve`` then sets it).
        prediction_cap: sent as the ``x-lenpred-cap`` header (the cap ``lenpred serve`` clips its prediction to,
            instead of ``max_tokens``); ``None``: not sent.
    """

    request_id: int
    messages: list[dict]
    max_tokens: int
    arrival_s: float
    priority: int | None = None
    prediction_cap: int | None = None


@dataclass
class LoadResult:
    """What the client saw of one request (seconds since the replay started).

    Attributes:
        status: HTTP status (200 when it streamed).
        first_token_s: first chunk with generated text; ``None`` if none came.
        finish_s: the stream's end (``data: [DONE]``) or the error response's end.
        num_chunks: content chunks received (one per generated token on vLLM).
        prompt_tokens, completion_tokens: the server's usage report (``None`` if it sent none).
        expected, priority, predict_ms: ``x-lenpred-expected`` / ``-priority`` / ``-predict-ms`` response headers
            (``None`` if absent).
        error: the error body's first 300 characters for a non-200 status.
    """

    request_id: int
    arrival_s: float
    status: int
    first_token_s: float | None
    finish_s: float
    num_chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    expected: float | None = None
    priority: int | None = None
    predict_ms: float | None = None
    error: str | None = None

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.arrival_s


def request_body(req: LoadRequest, model: str, extra: dict | None = None) -> dict:
    """The streaming chat-completions body: greedy, exactly ``max_tokens`` tokens (``ignore_eos``, a vLLM extra),
    usage in the last chunk, and ``priority`` when the request carries one."""
    body = {"model": model, "messages": req.messages, "max_tokens": req.max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    if req.priority is not None:
        body["priority"] = int(req.priority)
    return body


def parse_sse_line(line: str) -> dict | None:
    """A chunk from one SSE line: ``data: {...}`` → the JSON object; ``data: [DONE]``, comments and blank lines →
    ``None``."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]" or not payload:
        return None
    return json.loads(payload)


async def _one(client, url: str, req: LoadRequest, model: str, t0: float) -> LoadResult:
    await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.perf_counter()))
    sent = time.perf_counter() - t0
    first, chunks, usage = None, 0, {}
    cap_header = {"x-lenpred-cap": str(req.prediction_cap)} if req.prediction_cap is not None else None
    async with client.stream("POST", url, json=request_body(req, model), headers=cap_header) as resp:
        headers = resp.headers
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")[:300]
            return LoadResult(req.request_id, sent, resp.status_code, None, time.perf_counter() - t0, error=text)
        async for line in resp.aiter_lines():
            chunk = parse_sse_line(line)
            if chunk is None:
                continue
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - t0
    header = lambda name, kind: kind(headers[name]) if headers.get(name) else None  # noqa: E731
    return LoadResult(req.request_id, sent, 200, first, time.perf_counter() - t0, chunks,
                      usage.get("prompt_tokens"), usage.get("completion_tokens"), header("x-lenpred-expected", float),
                      header("x-lenpred-priority", int), header("x-lenpred-predict-ms", float))


async def replay(base_url: str, requests: list[LoadRequest], model: str, timeout_s: float = 600.0) -> list[LoadResult]:
    """Send every request at its arrival time (concurrently) to ``<base_url>/v1/chat/completions``; results in
    request order."""
    import httpx

    limits = httpx.Limits(max_connections=len(requests) + 4, max_keepalive_connections=len(requests) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0), limits=limits) as client:
        t0 = time.perf_counter()
        url = base_url.rstrip("/") + "/v1/chat/completions"
        return list(await asyncio.gather(*(_one(client, url, r, model, t0) for r in requests)))


def run_replay(base_url: str, requests: list[LoadRequest], model: str, timeout_s: float = 600.0) -> list[dict]:
    """:func:`replay` from synchronous code; results as dicts (JSON-able) with ``jct_s`` added."""
    return [asdict(r) | {"jct_s": r.jct_s} for r in asyncio.run(replay(base_url, requests, model, timeout_s))]
