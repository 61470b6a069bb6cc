"""A load generator for any OpenAI-compatible server (``vllm serve`` directly, or ``lenpred serve`` in front of it):
replays streaming chat completions at planned send times (e.g. Poisson arrivals) and records, per request, the
planned and the actual send time, the first frame that carries generated output, the stream's end, what the server
reported (usage, finish reason, the ``lenpred serve`` headers) and how the request ended.

How it measures (the rules :func:`summarize_replay` relies on):

* **Natural EOS by default.** ``ignore_eos`` (a vLLM extra that forces every request to run to ``max_tokens``) is
  only an option, and a run that uses it is labelled ``forced lengths (diagnostic)`` (:func:`run_label`).
* **Latency runs from the planned send time** (``arrival_s``), not from the actual send (``sent_s``): a load
  generator that falls behind its schedule must not hide the delay (coordinated omission). The achieved rate is
  reported next to the planned one.
* **TTFT** is the first frame that carries generated output: ``delta.content``, ``delta.reasoning_content`` /
  ``delta.reasoning`` (reasoning parsers) or ``delta.tool_calls`` (chat), or ``text`` (completions). An empty
  role-only first frame is not a token.
* **Stalls.** Every frame with generated output is timed: the gaps between consecutive ones (time between tokens,
  TBT; vLLM streams one frame per engine step, so a frame may carry more than one token when the client lags) are
  kept per request, and its **longest stall** is the largest gap (``max_gap_s``): a request that got its first token
  and then waited (parked, preempted) shows it there, not in TTFT.
* ``completion_tokens`` / ``prompt_tokens`` come from the usage chunk (``stream_options: {"include_usage": true}``
  is always sent).
* **Every request ends with an outcome** (:data:`OUTCOMES`): ``ok``; ``no_content`` (a 200 stream that ended
  without one generated frame); ``http_error`` (a non-200 status); ``failed`` (connection refused, a stream that
  broke or ended without ``data: [DONE]``, an error event in the stream, a read timeout); ``cancelled`` (the client
  gave up after ``LoadRequest.cancel_after_s``, as an SDK timeout does). Only ``ok`` requests enter the latency
  statistics; the others are counted apart. One request's failure never loses another's result.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

OUTCOMES = ("ok", "no_content", "http_error", "failed", "cancelled")
NATURAL_EOS, FORCED_LENGTHS = "natural EOS", "forced lengths (diagnostic)"
# response headers of `lenpred serve` (see lenpred.serving.proxy.app), read when present
_HEADERS = {"expected": ("x-lenpred-expected", float), "priority": ("x-lenpred-priority", int),
            "predict_ms": ("x-lenpred-predict-ms", float), "pool_wait_ms": ("x-lenpred-pool-wait-ms", float),
            "skipped": ("x-lenpred-skipped", str)}
_OUTPUT_DELTA_KEYS = ("content", "reasoning_content", "reasoning", "tool_calls")


@dataclass
class LoadRequest:
    """One request to replay.

    Attributes:
        request_id: the workload request.
        messages: OpenAI chat messages.
        max_tokens: generation cap in tokens (with natural EOS the request may stop earlier; with ``ignore_eos`` it
            runs to exactly this many).
        arrival_s: planned send time, seconds after the replay starts.
        priority: sent as vLLM's ``priority`` field; ``None``: not sent (``lenpred serve`` then sets it).
        prediction_cap: sent as the ``x-lenpred-cap`` header (the cap ``lenpred serve`` clips its prediction to,
            instead of ``max_tokens``); ``None``: not sent.
        extra_body: fields added to this request's body after the run-wide ones (e.g. ``seed``, ``temperature``,
            ``top_p``); they may override anything but ``stream``.
        cancel_after_s: the client gives up this many seconds after sending (closing the connection, as an SDK
            timeout does); ``None``: it waits for the end.
    """

    request_id: int
    messages: list[dict]
    max_tokens: int
    arrival_s: float
    priority: int | None = None
    prediction_cap: int | None = None
    extra_body: dict = field(default_factory=dict)
    cancel_after_s: float | None = None


@dataclass
class LoadResult:
    """What the client saw of one request (seconds since the replay started).

    Attributes:
        request_id: the workload request.
        arrival_s: the planned send time (latency is measured from it).
        sent_s: when the request was actually sent (``≥ arrival_s``; the difference is the generator's own lag).
        status: HTTP status (``None`` when no response came).
        outcome: one of :data:`OUTCOMES`.
        first_token_s: the first frame with generated output; ``None`` if none came.
        finish_s: the stream's end, or when the request failed or was given up.
        num_chunks: frames that carried generated output (one per token on vLLM).
        prompt_tokens, completion_tokens: the server's usage report (``None`` if it sent none).
        finish_reason: the last ``finish_reason`` the stream reported (``stop``, ``length``, ...), or ``None``.
        expected, priority, predict_ms, pool_wait_ms, skipped: the ``x-lenpred-expected`` / ``-priority`` /
            ``-predict-ms`` / ``-pool-wait-ms`` / ``-skipped`` response headers (``None`` if absent).
        error: why it was not ``ok`` (the error body's first 300 characters for an HTTP error).
        gaps_s: seconds between consecutive frames with generated output (``num_chunks − 1`` values).
    """

    request_id: int
    arrival_s: float
    sent_s: float
    status: int | None
    outcome: str
    first_token_s: float | None
    finish_s: float
    num_chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    expected: float | None = None
    priority: int | None = None
    predict_ms: float | None = None
    pool_wait_ms: float | None = None
    skipped: str | None = None
    error: str | None = None
    gaps_s: list[float] = field(default_factory=list)

    @property
    def max_gap_s(self) -> float | None:
        """The request's longest stall: the largest gap between two of its output frames, seconds (``None`` with
        fewer than two frames)."""
        return max(self.gaps_s) if self.gaps_s else None

    @property
    def jct_s(self) -> float:
        """Job completion time from the planned send time, seconds."""
        return self.finish_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        """Time to the first generated frame from the planned send time, seconds; ``None`` without one."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


def run_label(ignore_eos: bool) -> str:
    """How a run's lengths came about, for every table that reports it: :data:`NATURAL_EOS` or
    :data:`FORCED_LENGTHS`."""
    return FORCED_LENGTHS if ignore_eos else NATURAL_EOS


def request_body(req: LoadRequest, model: str, extra: dict | None = None, ignore_eos: bool = False) -> dict:
    """The streaming chat-completions body: ``model``, ``messages``, ``max_tokens``, usage in the last chunk, then
    the run-wide ``extra`` fields, then the request's own ``extra_body``, ``priority`` when the request carries one,
    and ``ignore_eos: true`` only when asked (a diagnostic: see :func:`run_label`)."""
    body = {"model": model, "messages": req.messages, "max_tokens": req.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {}), **req.extra_body}
    body["stream"] = True  # the measurement needs the stream
    if ignore_eos:
        body["ignore_eos"] = True
    if req.priority is not None:
        body["priority"] = int(req.priority)
    return body


def parse_sse_line(line: str) -> dict | None:
    """A chunk from one SSE line: ``data: {...}`` → the JSON object; ``data: [DONE]``, comments and blank lines →
    ``None``.

    Raises:
        ValueError: a ``data:`` line that is not JSON.
    """
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]" or not payload:
        return None
    return json.loads(payload)


def carries_output(choice: dict) -> bool:
    """Whether a streamed choice holds generated output: chat ``delta`` content, reasoning content or tool calls,
    or a completions ``text``. A role-only or empty delta does not."""
    delta = choice.get("delta") or {}
    return any(bool(delta.get(k)) for k in _OUTPUT_DELTA_KEYS) or bool(choice.get("text"))


class _Stream:
    """What one response stream has shown so far (kept when the stream breaks)."""

    def __init__(self):
        self.first, self.chunks, self.usage, self.finish_reason, self.done = None, 0, {}, None, False
        self.last, self.gaps = None, []

    def feed(self, line: str, now: float) -> str | None:
        """Read one SSE line; returns an error message for an error event, else ``None``."""
        if line.strip() == "data: [DONE]":
            self.done = True
            return None
        chunk = parse_sse_line(line)
        if chunk is None:
            return None
        if chunk.get("error"):
            return f"error event in the stream: {json.dumps(chunk['error'])[:300]}"
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if carries_output(choice):
                self.chunks += 1
                self.first = now if self.first is None else self.first
                if self.last is not None:
                    self.gaps.append(now - self.last)
                self.last = now
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return None


async def _one(client, url: str, req: LoadRequest, model: str, t0: float, extra: dict | None,
               ignore_eos: bool) -> LoadResult:
    import httpx

    await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.perf_counter()))
    sent = time.perf_counter() - t0
    stream, status, headers = _Stream(), None, {}
    outcome, error = "failed", None
    cap_header = {"x-lenpred-cap": str(req.prediction_cap)} if req.prediction_cap is not None else None
    body = request_body(req, model, extra, ignore_eos)
    try:
        async with asyncio.timeout(req.cancel_after_s):
            async with client.stream("POST", url, json=body, headers=cap_header) as resp:
                status, headers = resp.status_code, resp.headers
                if status != 200:
                    outcome = "http_error"
                    error = (await resp.aread()).decode(errors="replace")[:300]
                else:
                    async for line in resp.aiter_lines():
                        error = stream.feed(line, time.perf_counter() - t0)
                        if error:
                            break
                    if error is None and not stream.done:
                        error = "the stream ended without data: [DONE]"
                    outcome = "failed" if error else ("ok" if stream.first is not None else "no_content")
                    error = error or (None if outcome == "ok" else "a 200 stream without generated output")
    except TimeoutError:
        outcome, error = "cancelled", f"the client gave up after {req.cancel_after_s:g} s"
    except (httpx.HTTPError, ValueError, OSError) as exc:  # connection errors, broken streams, a non-JSON frame
        outcome, error = "failed", f"{type(exc).__name__}: {exc}"[:300]
    read = {k: _header(headers, name, kind) for k, (name, kind) in _HEADERS.items()}
    return LoadResult(req.request_id, req.arrival_s, sent, status, outcome, stream.first, time.perf_counter() - t0,
                      stream.chunks, stream.usage.get("prompt_tokens"), stream.usage.get("completion_tokens"),
                      stream.finish_reason, error=error, gaps_s=stream.gaps, **read)


def _header(headers, name: str, kind):
    value = headers.get(name) if headers else None
    try:
        return kind(value) if value else None
    except ValueError:
        return None


async def replay(base_url: str, requests: list[LoadRequest], model: str, timeout_s: float = 600.0,
                 extra_body: dict | None = None, ignore_eos: bool = False,
                 path: str = "/v1/chat/completions") -> list[LoadResult]:
    """Send every request at its planned time (concurrently) to ``<base_url><path>``; results in request order.

    Args:
        base_url: server root (a trailing ``/v1``, as in an OpenAI client's base URL, is dropped).
        requests: what to send and when.
        model: the ``model`` field.
        timeout_s: read timeout between two frames (a stream silent for longer is ``failed``).
        extra_body: fields added to every body (e.g. ``{"temperature": 0.0}``); a request's ``extra_body`` wins.
        ignore_eos: send ``ignore_eos: true`` (forced lengths, a diagnostic).
        path: the chat-completions path.

    The connection pool holds one connection per request (plus slack), so no request waits on the client's pool.
    """
    import httpx

    limits = httpx.Limits(max_connections=len(requests) + 4, max_keepalive_connections=len(requests) + 4)
    root = base_url.rstrip("/")
    root = root[:-3] if root.endswith("/v1") else root
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0), limits=limits) as client:
        t0 = time.perf_counter()
        return list(await asyncio.gather(*(_one(client, root + path, r, model, t0, extra_body, ignore_eos)
                                           for r in requests)))


def run_replay(base_url: str, requests: list[LoadRequest], model: str, timeout_s: float = 600.0,
               extra_body: dict | None = None, ignore_eos: bool = False) -> list[dict]:
    """:func:`replay` from synchronous code; results as dicts (JSON-able) with ``jct_s``, ``ttft_s`` and
    ``max_gap_s`` added."""
    results = asyncio.run(replay(base_url, requests, model, timeout_s, extra_body, ignore_eos))
    return [asdict(r) | {"jct_s": r.jct_s, "ttft_s": r.ttft_s, "max_gap_s": r.max_gap_s} for r in results]


def _rate_per_s(times: list[float]) -> float | None:
    """Events per second over a span: ``(n − 1) / (last − first)`` (the Poisson-rate estimate from inter-arrival
    gaps); ``None`` for fewer than two events or a zero span."""
    if len(times) < 2 or max(times) == min(times):
        return None
    return (len(times) - 1) / (max(times) - min(times))


def _stats(values: list[float], prefix: str) -> dict[str, float | None]:
    """``mean / p50 / p90 / p99`` of ``values`` under ``<prefix>_...`` keys (``None`` when empty)."""
    x = np.asarray(values, dtype=np.float64)
    if not x.size:
        return {f"{k}_{prefix}": None for k in ("mean", "p50", "p90", "p99")}
    return {f"mean_{prefix}": float(x.mean()), **{f"p{q}_{prefix}": float(np.percentile(x, q)) for q in (50, 90, 99)}}


def summarize_replay(results: list[LoadResult | dict], ignore_eos: bool = False) -> dict:
    """One replay's summary: the run label, request counts by outcome, planned and achieved send rates (req/s) and
    the generator's send lag, then over ``ok`` requests only: JCT and TTFT (s, from the planned send time; mean,
    p50, p90, p99), output tokens (usage), throughput (output tokens / (last finish − first planned send), tok/s),
    finish-reason counts, JCT per output token (s/token, mean over requests), time between tokens (``tbt_s``:
    every gap of every request pooled) and the longest stall per request (``max_gap_s``), and the proxy's
    prediction latency (``predict_ms``) when its header was there. Rows without ``gaps_s`` (older records) count as
    having no gaps.

    Never raises on failed or empty runs: statistics without data are ``None``.
    """
    rows = [r if isinstance(r, dict) else asdict(r) for r in results]
    counts = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
    ok = [r for r in rows if r["outcome"] == "ok"]
    lag = [r["sent_s"] - r["arrival_s"] for r in rows]
    tokens = [r["completion_tokens"] for r in ok if r["completion_tokens"] is not None]
    span = (max(r["finish_s"] for r in ok) - min(r["arrival_s"] for r in ok)) if ok else 0.0
    reasons: dict[str, int] = {}
    for r in ok:
        reasons[str(r["finish_reason"])] = reasons.get(str(r["finish_reason"]), 0) + 1
    out = {"label": run_label(ignore_eos), "num_requests": len(rows), "outcomes": counts,
           "planned_rate_per_s": _rate_per_s([r["arrival_s"] for r in rows]),
           "achieved_rate_per_s": _rate_per_s([r["sent_s"] for r in rows]),
           "max_send_lag_s": max(lag) if lag else None,
           "p99_send_lag_s": float(np.percentile(lag, 99)) if lag else None,
           "num_output_tokens": int(sum(tokens)), "num_missing_usage": len(ok) - len(tokens),
           "throughput_tok_s": sum(tokens) / span if span > 0 and tokens else None, "finish_reasons": reasons}
    out |= _stats([r["finish_s"] - r["arrival_s"] for r in ok], "jct_s")
    out |= _stats([r["first_token_s"] - r["arrival_s"] for r in ok], "ttft_s")
    out |= _stats([g for r in ok for g in r.get("gaps_s") or ()], "tbt_s")
    out |= _stats([max(r["gaps_s"]) for r in ok if r.get("gaps_s")], "max_gap_s")
    out |= _stats([(r["finish_s"] - r["arrival_s"]) / r["completion_tokens"] for r in ok
                   if r["completion_tokens"]], "jct_per_token_s")
    predict_ms = [r["predict_ms"] for r in rows if r.get("predict_ms") is not None and math.isfinite(r["predict_ms"])]
    return out | _stats(predict_ms, "predict_ms")
