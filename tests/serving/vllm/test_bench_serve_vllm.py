"""The real ``vllm bench serve`` runs the command the comparison builds (:func:`bench_command`) against a small local
OpenAI-style upstream, and its detailed result reads as a run: each line's cap arrives as the request's cap, the
prompt as the one user message (one text part), the run-wide sampling in every body, and the requests in the dataset's order."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
pytest.importorskip("uvicorn")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from starlette.applications import Starlette  # noqa: E402
from starlette.responses import StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from conftest import LoopbackServer  # noqa: E402
from lenpred.studies.bench_serve import (BenchServeConfig, bench_command, dataset_items, read_bench_result,  # noqa: E402
                                         write_dataset)


def _frame(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_vllm_bench_serve_sends_each_cap_in_order_and_reads_back(tmp_path):
    from lenpred.backbone import resolve_model

    received = []

    async def chat(request):
        body = await request.json()
        received.append(body)
        n = body["max_completion_tokens"]

        async def events():
            for _ in range(n):
                yield _frame({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]})
            yield _frame({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            yield _frame({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
            yield b"data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    with LoopbackServer(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])) as url:
        rows = [{"request": SimpleNamespace(prompt_id=f"p{i}"), "max_tokens": 3 + i} for i in range(4)]
        messages = {f"p{i}": [{"role": "user", "content": f"question {i}"}] for i in range(4)}
        dataset = write_dataset(dataset_items(rows, messages), tmp_path / "d.jsonl")
        cfg = BenchServeConfig(capacity_req_s=20.0, load=1.0, temperature=0.7)
        result = tmp_path / "out" / "r.json"
        cmd = bench_command(cfg, url, "m", str(resolve_model()[0]), dataset, 4, result)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    rec = read_bench_result(result, 4)
    assert [r["completion_tokens"] for r in rec["results"]] == [3, 4, 5, 6]  # the dataset's order, each line's cap
    assert all(r["outcome"] == "ok" for r in rec["results"]) and rec["results"][0]["arrival_s"] == 0.0
    assert len(received) == 4  # no test request before the run (--ready-check-timeout-sec 0)
    timed = received
    # one user message holding one text part (vLLM's server joins a message's text parts: the same prompt)
    assert [b["messages"] for b in timed] == [[{"role": "user", "content": [{"type": "text", "text": f"question {i}"}]}]
                                              for i in range(4)]
    assert all(b["temperature"] == 0.7 and b["top_p"] == 1.0 and b["seed"] == 0 and "ignore_eos" not in b
               for b in timed)
