"""The load generator against a small local OpenAI-style upstream (Starlette under uvicorn on a free loopback port)
whose behaviour each request picks by its first message: normal, reasoning first, tool call, no content, an HTTP
error, a stream that breaks, a stream without ``[DONE]``, an error event, a slow answer the client gives up on."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from starlette.applications import Starlette  # noqa: E402
from starlette.responses import JSONResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from conftest import free_port  # noqa: E402
from lenpred.serving.loadgen import (FORCED_LENGTHS, NATURAL_EOS, LoadRequest, LoadResult,  # noqa: E402
                                        carries_output, request_body, run_replay, summarize_replay)


def _frame(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _delta(**delta) -> bytes:
    return _frame({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


class Upstream:
    """Streams by the first message's content; records every body it received."""

    def __init__(self):
        self.received: list[dict] = []

    async def chat(self, request):
        body = await request.json()
        self.received.append(body)
        kind = body["messages"][0]["content"]
        if kind == "http_error":
            return JSONResponse({"object": "error", "message": "bad"}, status_code=400)

        async def events():
            yield _delta(role="assistant", content="")  # role-only frame: not a token
            if kind == "slow":
                await asyncio.sleep(5)
            if kind == "reasoning":
                await asyncio.sleep(0.05)
                yield _delta(reasoning_content="think")
                await asyncio.sleep(0.3)
            if kind == "tool":
                yield _delta(tool_calls=[{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}])
            if kind == "error_event":
                yield _frame({"error": {"message": "engine died", "code": 500}})
                return
            if kind not in ("empty", "tool"):
                for k in range(body["max_tokens"]):
                    if kind == "stall" and k == 1:
                        await asyncio.sleep(0.4)  # one token, then a pause (a parked request)
                    yield _delta(content="x")
            if kind == "break":
                raise RuntimeError("upstream broke mid-stream")
            yield _frame({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            n = 0 if kind == "empty" else body["max_tokens"]
            yield _frame({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}})
            if kind != "no_done":
                yield b"data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream", headers={"x-lenpred-predict-ms": "3.5"})




@pytest.fixture(scope="module")
def upstream():
    up = Upstream()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/chat/completions", up.chat,
                                                                   methods=["POST"])]),
                                           host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", up
    server.should_exit = True
    thread.join(10)


def _req(i: int, kind: str, arrival_s: float = 0.0, **kw) -> LoadRequest:
    return LoadRequest(i, [{"role": "user", "content": kind}], 3, arrival_s, **kw)


def test_every_outcome_is_recorded_and_one_failure_loses_nothing(upstream):
    url, up = upstream
    kinds = ["normal", "reasoning", "tool", "empty", "http_error", "break", "no_done", "error_event", "slow"]
    reqs = [_req(i, k, cancel_after_s=0.5 if k == "slow" else None) for i, k in enumerate(kinds)]
    res = {r["request_id"]: r for r in run_replay(url + "/v1", reqs, "m")}
    outcome = {kinds[i]: r["outcome"] for i, r in res.items()}
    assert outcome == {"normal": "ok", "reasoning": "ok", "tool": "ok", "empty": "no_content",
                       "http_error": "http_error", "break": "failed", "no_done": "failed", "error_event": "failed",
                       "slow": "cancelled"}
    normal, reasoning, tool = res[0], res[1], res[2]
    assert normal["num_chunks"] == 3 and normal["completion_tokens"] == 3 and normal["prompt_tokens"] == 7
    assert normal["finish_reason"] == "stop" and normal["predict_ms"] == 3.5 and normal["error"] is None
    # TTFT is the reasoning frame (≥ 0.05 s), not the content that came 0.3 s later
    assert 0.05 <= reasoning["ttft_s"] < reasoning["jct_s"] - 0.25 and reasoning["num_chunks"] == 4
    assert tool["first_token_s"] is not None and tool["num_chunks"] == 1
    assert res[3]["first_token_s"] is None and res[3]["ttft_s"] is None and res[3]["completion_tokens"] == 0
    assert res[4]["status"] == 400 and '"bad"' in res[4]["error"]
    assert res[5]["num_chunks"] == 3 and res[5]["status"] == 200  # what came before the break is kept
    assert "[DONE]" in res[6]["error"] and "engine died" in res[7]["error"]
    assert "gave up after 0.5 s" in res[8]["error"] and 0.5 <= res[8]["finish_s"] < 3
    summary = summarize_replay(list(res.values()))  # no TypeError on None TTFTs
    assert summary["outcomes"] == {"ok": 3, "no_content": 1, "http_error": 1, "failed": 3, "cancelled": 1}
    assert summary["label"] == NATURAL_EOS and summary["num_output_tokens"] == 3 + 3 + 3
    assert summary["mean_jct_s"] == pytest.approx(sum(res[i]["jct_s"] for i in range(3)) / 3)
    assert summary["finish_reasons"] == {"stop": 3}


def test_a_stall_after_the_first_token_is_the_longest_gap(upstream):
    url, _ = upstream
    stall, normal = run_replay(url, [_req(0, "stall"), _req(1, "normal")], "m")
    assert stall["num_chunks"] == 3 and len(stall["gaps_s"]) == 2
    # the upstream sleeps 0.4 s between tokens 1 and 2 (its event loop's clock; the client's reads it as 0.39997 s
    # at times): a gap well above a normal one's, where the sleep is
    assert 0.35 <= stall["max_gap_s"] < 1.5 and stall["max_gap_s"] == stall["gaps_s"][0]
    assert stall["ttft_s"] < 0.3  # a short TTFT hides the stall
    assert normal["max_gap_s"] < 0.2


def test_bodies_natural_eos_by_default_and_extra_fields_pass_through(upstream):
    url, up = upstream
    n = len(up.received)
    reqs = [_req(0, "normal", extra_body={"seed": 11, "temperature": 0.7}), _req(1, "normal", 0.2, priority=4)]
    res = run_replay(url, reqs, "m", extra_body={"temperature": 0.0, "top_p": 0.9})
    sent = sorted(up.received[n:], key=lambda b: b.get("seed", 0), reverse=True)
    assert sent[0] == {"model": "m", "messages": reqs[0].messages, "max_tokens": 3, "stream": True,
                       "stream_options": {"include_usage": True}, "temperature": 0.7, "top_p": 0.9, "seed": 11}
    assert sent[1]["priority"] == 4 and sent[1]["temperature"] == 0.0 and "ignore_eos" not in sent[1]
    assert res[1]["arrival_s"] == 0.2 and res[1]["sent_s"] >= 0.2  # planned time stored as planned
    run_replay(url, [_req(0, "normal")], "m", ignore_eos=True)
    assert up.received[-1]["ignore_eos"] is True


def test_request_body_keeps_the_stream_and_usage():
    body = request_body(_req(0, "q", extra_body={"stream": False, "max_tokens": 9}), "m", ignore_eos=True)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 9 and body["ignore_eos"] is True


def test_carries_output():
    assert not carries_output({"delta": {"role": "assistant", "content": ""}})
    assert not carries_output({"delta": {"tool_calls": []}, "finish_reason": "stop"})
    assert carries_output({"delta": {"reasoning": "r"}}) and carries_output({"text": "t"})


def test_summary_measures_latency_from_the_planned_time_and_reports_the_achieved_rate():
    def res(i, planned, sent, first, finish, outcome="ok", tokens=10):
        return LoadResult(i, planned, sent, 200, outcome, first, finish, completion_tokens=tokens,
                          finish_reason="length" if tokens == 10 else "stop", predict_ms=2.0 * (i + 1))

    rows = [res(0, 0.0, 0.5, 1.0, 2.0), res(1, 1.0, 1.0, 1.5, 4.0, tokens=5), res(2, 2.0, 2.5, None, 3.0, "failed")]
    s = summarize_replay(rows, ignore_eos=True)
    assert s["label"] == FORCED_LENGTHS
    assert s["mean_jct_s"] == 2.5 and s["p50_jct_s"] == 2.5  # (2 − 0) and (4 − 1): from the planned time
    assert s["mean_ttft_s"] == 0.75  # (1.0 − 0) and (1.5 − 1)
    assert s["planned_rate_per_s"] == 1.0 and s["achieved_rate_per_s"] == 1.0  # (3 − 1) / (2.5 − 0.5)
    assert s["max_send_lag_s"] == 0.5 and s["outcomes"]["failed"] == 1
    assert s["num_output_tokens"] == 15 and s["throughput_tok_s"] == 15 / 4.0
    assert s["finish_reasons"] == {"length": 1, "stop": 1} and s["mean_predict_ms"] == 4.0
    rows[0].gaps_s, rows[1].gaps_s = [0.1, 0.3], [0.5]
    s = summarize_replay(rows)
    assert s["mean_tbt_s"] == pytest.approx(0.3) and s["p50_tbt_s"] == pytest.approx(0.3)  # 0.1, 0.3, 0.5 pooled
    assert s["mean_max_gap_s"] == pytest.approx(0.4)  # per request: 0.3 and 0.5
    assert s["mean_jct_per_token_s"] == pytest.approx((2.0 / 10 + 3.0 / 5) / 2)
    empty = summarize_replay([res(0, 0.0, 0.0, None, 1.0, "cancelled")])
    assert empty["mean_jct_s"] is None and empty["throughput_tok_s"] is None and empty["achieved_rate_per_s"] is None


def test_the_speed_probe_forces_its_length_on_the_first_rows(upstream):
    from types import SimpleNamespace

    from lenpred.studies.engine_bench import PROBE_REQUESTS, PROBE_TOKENS, speed_probe

    url, up = upstream
    rows = [{"request": SimpleNamespace(request_id=i, prompt_id=f"p{i}"), "seed": i, "temperature": 0.0,
             "top_p": 1.0, "max_tokens": 7} for i in range(6)]
    n = len(up.received)
    got = speed_probe(url, rows, {f"p{i}": [{"role": "user", "content": "normal"}] for i in range(6)}, "probe-")
    sent = up.received[n:]
    assert sorted(b["request_id"] for b in sent) == [f"probe-q{i}" for i in range(PROBE_REQUESTS)]
    assert {b["max_tokens"] for b in sent} == {PROBE_TOKENS} and all(b["ignore_eos"] for b in sent)
    assert got["tpot_s"] is not None and 0 <= got["tpot_s"] < 0.05  # the fake streams without pauses
