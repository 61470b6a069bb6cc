"""The ``lenpred serve`` handlers and helpers one by one (no server where none is needed), and the
``on_finished`` hook's plumbing end to end (a local upstream that reports usage and a finish reason)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from lenpred.outcome import RequestOutcome  # noqa: E402
from lenpred.serving.proxy.app import create_app, encode_body, health_endpoint, parse_predicted  # noqa: E402
from lenpred.serving.proxy.metrics import ProxyMetrics  # noqa: E402
from lenpred.serving.proxy.state import ProxiedRequest, ProxyState  # noqa: E402
from lenpred.serving.proxy.upstream import ResponseTail  # noqa: E402
from conftest import LoopbackServer  # noqa: E402


def _state(**kw) -> ProxyState:
    batcher = SimpleNamespace(running=False, queued=3)
    return ProxyState("http://up:1", None, batcher, ProxyMetrics(), max_connections=7, default_max_tokens=24, **kw)


def test_health_alone_reports_a_stopped_worker_with_503():
    state = _state()
    request = Request({"type": "http", "method": "GET", "path": "/health", "headers": [],
                       "app": SimpleNamespace(state=SimpleNamespace(proxy=state))})
    response = asyncio.run(health_endpoint(request))
    assert response.status_code == 503
    assert json.loads(response.body) == {"status": "prediction worker stopped", "prediction_queue": 3,
                                         "upstream_in_flight": 0, "max_connections": 7, "upstream": "http://up:1"}


def test_parse_predicted_fills_the_cap_takes_the_header_cap_and_rewrites_the_request_id():
    state = _state()
    raw = json.dumps({"messages": [{"role": "user", "content": "a"}], "request_id": "mine"}).encode()
    req = parse_predicted(state, "/v1/chat/completions", raw, {"x-lenpred-cap": "300"})
    assert isinstance(req, ProxiedRequest)
    assert req.max_tokens == 24 and req.body["max_tokens"] == 24 and req.prediction_cap_tokens == 300
    assert req.headers["x-lenpred-default-max-tokens"] == "24"
    assert req.client_id == "mine" and req.upstream_id.startswith("mine-") and req.body["request_id"] == req.upstream_id
    assert state.metrics.value("lenpred_proxy_default_max_tokens_total") == 1
    refused = parse_predicted(state, "/v1/completions", b'{"prompt": "a", "max_tokens": 0}', {})
    assert refused.status_code == 400 and json.loads(refused.body)["error"]["param"] == "max_tokens"
    assert state.metrics.value("lenpred_proxy_requests_total", path="/v1/completions", outcome="refused") == 1


def test_encode_body_forwards_the_clients_bytes_when_json_cannot_carry_a_number():
    raw = b'{"prompt": "a", "temperature": 1e400}'
    req = ProxiedRequest("/v1/completions", json.loads(raw), {"x-lenpred-expected": "3.0", "x-lenpred-priority": "3"},
                         16, 16, "u", None, 0.0, expected=3.0)
    assert encode_body(req, raw, None) == raw and req.expected is None
    assert req.headers == {"x-lenpred-skipped": "the body holds a number JSON cannot carry (inf or nan)"}
    ok = ProxiedRequest("/v1/completions", {"prompt": "a"}, {}, 16, 16, "u", None, 0.0)
    assert encode_body(ok, b"", "no messages") == b'{"prompt": "a"}'
    assert ok.headers["x-lenpred-skipped"] == "no messages"


def test_tail_reads_the_last_finish_reason():
    sse = ResponseTail()
    sse.add(b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n'
            b'data: {"choices":[{"delta":{},"finish_reason":"length"}]}\n\ndata: [DONE]\n\n')
    assert sse.finish_reason("text/event-stream") == "length"
    body = ResponseTail()
    body.add(b'{"choices":[{"finish_reason":"stop"}],"usage":{"completion_tokens":4}}')
    assert body.finish_reason("application/json") == "stop" and body.completion_tokens("application/json") == 4
    assert ResponseTail().finish_reason("application/json") is None





async def _chat(request):
    body = await request.json()
    if body.get("stream"):
        async def events():
            yield b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n'
            yield b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'
            yield b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
        return StreamingResponse(events(), media_type="text/event-stream")
    return JSONResponse({"choices": [{"finish_reason": "length"}], "usage": {"completion_tokens": body["max_tokens"]}})


def test_on_finished_hooks_get_the_request_outcome_id_prediction_and_cap():
    records = []

    def broken(record):
        raise RuntimeError("a hook bug")

    upstream = Starlette(routes=[Route("/v1/chat/completions", _chat, methods=["POST"])])
    predict = lambda prompts, cap: 30.4  # noqa: E731
    with LoopbackServer(upstream) as up_url:
        app = create_app(up_url, predict, on_finished=(broken, records.append))
        with LoopbackServer(app) as url, httpx.Client(base_url=url, timeout=10) as client:
            t0 = time.time()
            r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}],
                                                         "max_tokens": 9}, headers={"x-request-id": "c1"})
            s = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "b"}],
                                                         "stream": True}, headers={"x-lenpred-cap": "64"})
            client.get("/health")  # not a predicted path: no record
            for _ in range(100):
                if len(records) == 2:
                    break
                time.sleep(0.01)
    assert r.status_code == 200 and s.status_code == 200  # the broken hook did not break the responses
    plain, stream = records
    assert (plain.request_id, plain.client_request_id) == (r.headers["x-lenpred-upstream-request-id"], "c1")
    assert isinstance(plain, RequestOutcome)  # the per-request record shared with the plug-in and the traffic log
    assert (plain.outcome, plain.expected_tokens, plain.num_output_tokens, plain.finish_reason) == (
        "forwarded", 30.4, 9, "length")
    assert (plain.max_new_tokens, plain.prediction_cap_tokens, plain.path) == (9, 9, "/v1/chat/completions")
    assert t0 <= plain.arrival_time_s <= plain.first_token_time_s <= plain.finish_time_s <= time.time()
    assert plain.jct_s == plain.finish_time_s - plain.arrival_time_s
    assert (stream.num_output_tokens, stream.finish_reason, stream.max_new_tokens, stream.prediction_cap_tokens) == (
        2, "stop", 1024, 64)
    assert stream.client_request_id is None and stream.request_id.startswith("lenpred-")


async def _usage_chat(request):
    """Answers ``hello`` prompts with 7 tokens (stop), others at the cap (length); streams carry no usage."""
    body = await request.json()
    if body.get("stream"):
        async def events():
            yield b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
        return StreamingResponse(events(), media_type="text/event-stream")
    text = json.dumps(body.get("messages") or body.get("prompt"))
    n, reason = (7, "stop") if "hello" in text else (body["max_tokens"], "length")
    return JSONResponse({"choices": [{"finish_reason": reason}], "usage": {"completion_tokens": n}})


def test_lenpred_serve_logs_answered_requests_with_the_interval_it_served(tiny_backbone, one_torch_thread, tmp_path):
    """Issue 21 in the proxy: each answered single-prompt request with a usage becomes one traffic-log row holding
    the features its head read, the prediction and interval served (also in the response headers), the observed
    length, the finish reason, the cap and its group header; a stream without usage and a two-prompt request
    teach nothing."""
    from conftest import TINY_PROMPTS, fit_tiny_predictor

    from lenpred.online.learning import OnlineLearning
    from lenpred.serving.proxy.app import traffic_hook
    from lenpred.serving.proxy.batching import LengthPredictorService
    from lenpred.online.traffic_log import TrafficLogConfig, read_traffic_log

    lp = fit_tiny_predictor(tiny_backbone, "last", 2)
    lp.config_ = dataclasses.replace(lp.config_, model_revision="r0")  # what the log's metadata records
    online = OnlineLearning(lp, log=TrafficLogConfig(str(tmp_path / "log")))
    calls, hook = [], traffic_hook(online)
    upstream = Starlette(routes=[Route(p, _usage_chat, methods=["POST"]) for p in ("/v1/chat/completions",
                                                                                  "/v1/completions")])
    chat = [[{"role": "user", "content": TINY_PROMPTS[0]}], TINY_PROMPTS[2]]
    with LoopbackServer(upstream) as up_url:
        app = create_app(up_url, LengthPredictorService(lp, tokenizers=1, online=online), group_header="x-tenant",
                         on_finished=(lambda r: (hook(r), calls.append(r)),))
        with LoopbackServer(app) as url, httpx.Client(base_url=url, timeout=30) as client:
            answers = [client.post("/v1/chat/completions", json={"messages": chat[0], "max_tokens": 16},
                                   headers={"x-tenant": "a"}),
                       client.post("/v1/chat/completions", json={"messages": chat[1], "max_tokens": 16})]
            client.post("/v1/chat/completions", json={"messages": chat[0], "max_tokens": 16, "stream": True})
            client.post("/v1/completions", json={"prompt": ["hello world", "write a poem"], "max_tokens": 16})
            for _ in range(200):
                if len(calls) == 4:
                    break
                time.sleep(0.01)
    online.close()
    log = read_traffic_log(tmp_path / "log")
    want = lp.predict(chat, 16)
    assert log.num_records == 2 and [a.status_code for a in answers] == [200, 200]
    c = log.columns
    assert list(c["num_output_tokens"]) == [7, 16] and list(c["finish_reason"]) == ["stop", "length"]
    assert list(log.censored) == [False, True] and list(c["max_new_tokens"]) == [16, 16]
    assert list(c["group"]) == ["a", None]
    for i, (a, p) in enumerate(zip(answers, want)):
        assert (c["expected"][i], c["low"][i], c["high"][i]) == pytest.approx((p.expected, p.low, p.high), abs=1e-3)
        assert (float(a.headers["x-lenpred-low"]), float(a.headers["x-lenpred-high"])) == pytest.approx(
            (p.low, p.high), abs=0.051)
        assert c["arrival_time_s"][i] <= c["first_token_time_s"][i] <= c["finish_time_s"][i]
    np.testing.assert_allclose(log.features, lp.predict(chat, 16, return_features=True)[1], rtol=0,
                               atol=2e-3)  # float16 rows
