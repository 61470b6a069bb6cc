"""The ``lenpred serve`` proxy against a small local upstream (Starlette under uvicorn on free loopback ports) with
a stub predictor: priority set from the prediction, bodies and SSE streams passed through, upstream errors passed
back unchanged, bad requests refused."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
starlette = pytest.importorskip("starlette")

from starlette.applications import Starlette  # noqa: E402
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from lenpred.errors import LenpredError  # noqa: E402
from lenpred.serving.proxy.app import create_app, request_prompts  # noqa: E402
from conftest import LoopbackServer, free_port  # noqa: E402





class Upstream:
    """Records what it received; answers like an OpenAI server (or with an error when asked)."""

    def __init__(self):
        self.received: list[dict] = []
        self.headers: list[dict] = []  # request headers of every chat / completions call
        self.release = threading.Event()  # the stream's second chunk waits for it

    async def chat(self, request):
        body = await request.json()
        self.received.append(body)
        self.headers.append(dict(request.headers))
        if body.get("model") == "missing":
            return JSONResponse({"object": "error", "message": "The model `missing` does not exist."}, status_code=404)
        if body.get("stream"):
            async def events():
                yield b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
                while not self.release.is_set():  # the client must see chunk 1 before chunk 2 is written
                    await _sleep(0.01)
                yield b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n'
                yield b"data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse({"echo": body}, headers={"x-upstream": "yes"})

    async def models(self, request):
        return JSONResponse({"data": [{"id": "m"}], "query": request.url.query})

    async def teapot(self, request):
        return PlainTextResponse("short and stout", status_code=418)

    def app(self):
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                 Route("/v1/completions", self.chat, methods=["POST"]),
                                 Route("/v1/models", self.models), Route("/teapot", self.teapot)])


async def _sleep(s):
    import asyncio

    await asyncio.sleep(s)


class StubPredictor:
    """Predicts 10 tokens per word of the last message, capped at max_tokens; records its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, max_tokens):
        self.calls.append((prompts, max_tokens))
        words = [len((p if isinstance(p, str) else p[-1]["content"]).split()) for p in prompts]
        if any(w > 50 for w in words):
            raise LenpredError("prompt 0 does not fit the context window")
        value = 10.0 * max(words) + 0.4
        return min(value, max_tokens) if max_tokens else value


@pytest.fixture()
def stack():
    up, predictor = Upstream(), StubPredictor()
    with LoopbackServer(up.app()) as up_url, LoopbackServer(create_app(up_url, predictor)) as proxy_url:
        with httpx.Client(base_url=proxy_url, timeout=10) as client:
            yield client, up, predictor


def wait_for_cancellation(metrics, stage: str, tries: int) -> None:
    """Poll ``lenpred_proxy_cancellations_total{stage}`` every 10 ms until it reads 1 (at most ``tries`` times); the
    caller asserts the value afterwards."""
    for _ in range(tries):
        if metrics.value("lenpred_proxy_cancellations_total", stage=stage) == 1:
            return
        time.sleep(0.01)


def test_priority_is_the_rounded_prediction_and_the_body_passes_through(stack):
    client, up, predictor = stack
    body = {"model": "m", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 100,
            "temperature": 0.5, "ignore_eos": True}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    sent = up.received[-1]
    assert sent == {**body, "priority": 30}  # 10·3 + 0.4 rounds to 30; every other field unchanged
    assert r.json() == {"echo": sent}
    assert r.headers["x-lenpred-expected"] == "30.4" and r.headers["x-lenpred-priority"] == "30"
    assert float(r.headers["x-lenpred-predict-ms"]) >= 0
    assert r.headers["x-upstream"] == "yes"
    assert predictor.calls[-1] == ([[{"role": "user", "content": "one two three"}]], 100)


def test_the_starvation_guard_adds_the_aging_rate_times_the_arrival_time():
    from lenpred.serving.proxy.state import AGING_EPOCH_S

    up = Upstream()
    with LoopbackServer(up.app()) as up_url, LoopbackServer(create_app(up_url, StubPredictor(),
                                                                        aging_tokens_per_s=2.0)) as proxy_url:
        with httpx.Client(base_url=proxy_url, timeout=10) as client:
            before = time.time()
            r = client.post("/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": "one two three"}], "max_tokens": 100})
            after = time.time()
    assert r.status_code == 200 and r.headers["x-lenpred-expected"] == "30.4"
    # priority = round(30.4 + 2 tokens/s × (arrival − the fixed epoch)), the arrival between before and after
    sent = up.received[-1]["priority"]
    assert round(30.4 + 2 * (before - AGING_EPOCH_S)) <= sent <= round(30.4 + 2 * (after - AGING_EPOCH_S))
    assert r.headers["x-lenpred-priority"] == str(sent)
    for bad in (-1.0, float("inf"), float("nan"), 2e6):
        with pytest.raises(LenpredError,
                           match=r"aging-tokens-per-s: the starvation guard.s rate \(aging_tokens_per_s\) must be"):
            create_app("http://unused", StubPredictor(), aging_tokens_per_s=bad)


def test_cap_clips_and_completions_take_the_longest_prompt(stack):
    client, up, predictor = stack
    r = client.post("/v1/completions", json={"model": "m", "prompt": ["a b", "a b c d e"], "max_tokens": 42})
    assert r.status_code == 200 and up.received[-1]["priority"] == 42  # min(50.4, 42)
    assert predictor.calls[-1] == (["a b", "a b c d e"], 42)
    # content parts are joined into the message text as vLLM joins them (empty parts dropped, the rest one per
    # line); max_completion_tokens is the cap too
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [
        {"type": "text", "text": "x y "}, {"type": "text", "text": ""}, {"type": "text", "text": "z"}]}],
        "max_completion_tokens": 7})
    assert predictor.calls[-1] == ([[{"role": "user", "content": "x y \nz"}]], 7)
    assert up.received[-1]["priority"] == 7
    # an explicit null max_completion_tokens falls back to max_tokens
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a b c"}],
                                              "max_completion_tokens": None, "max_tokens": 16})
    assert predictor.calls[-1][1] == 16 and up.received[-1]["priority"] == 16


def test_cap_header_replaces_max_tokens_for_the_prediction_and_is_not_forwarded(stack):
    client, up, predictor = stack
    body = {"model": "m", "messages": [{"role": "user", "content": "a b c d e f"}], "max_tokens": 5}
    r = client.post("/v1/chat/completions", json=body, headers={"x-lenpred-cap": "1000"})
    assert r.status_code == 200 and predictor.calls[-1][1] == 1000
    assert up.received[-1] == {**body, "priority": 60}  # 60.4, not clipped to max_tokens = 5; max_tokens unchanged
    assert "x-lenpred-cap" not in up.headers[-1]
    for bad in ("0", "-4", "many"):
        r = client.post("/v1/chat/completions", json=body, headers={"x-lenpred-cap": bad})
        assert r.status_code == 400 and "x-lenpred-cap" in r.json()["error"]["message"]


def test_a_client_priority_is_kept(stack):
    client, up, _ = stack
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a b"}], "priority": 0})
    assert up.received[-1]["priority"] == 0
    assert r.headers["x-lenpred-expected"] == "20.4" and r.headers["x-lenpred-priority"] == "0"


def test_a_null_client_priority_is_replaced_by_the_prediction(stack):
    # vLLM's `priority: int` refuses null with a 400, so null counts as "not given" (dropped), as an absent key
    client, up, _ = stack
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a b"}], "priority": None})
    assert r.status_code == 200 and up.received[-1]["priority"] == 20
    assert r.headers["x-lenpred-priority"] == "20"
    r = client.post("/v1/completions", json={"prompt": [1, 2], "priority": None})  # skipped: dropped, not null
    assert "token ids" in r.headers["x-lenpred-skipped"] and "priority" not in up.received[-1]


def test_streaming_is_passed_chunk_by_chunk(stack):
    client, up, _ = stack
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = r.iter_raw()
        first = next(chunks)  # arrives while the upstream still holds chunk 2: nothing is buffered
        assert first == b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        up.release.set()
        rest = b"".join(chunks)
    assert rest == b'data: {"choices":[{"delta":{"content":"b"}}]}\n\ndata: [DONE]\n\n'
    assert up.received[-1]["priority"] == 10


def test_upstream_errors_are_passed_back_unchanged(stack):
    client, up, _ = stack
    r = client.post("/v1/chat/completions", json={"model": "missing", "messages": [{"role": "user", "content": "q"}]})
    assert r.status_code == 404
    assert r.json() == {"object": "error", "message": "The model `missing` does not exist."}
    r = client.get("/teapot")
    assert r.status_code == 418 and r.text == "short and stout"


def test_other_paths_are_forwarded_as_is(stack):
    client, up, predictor = stack
    n = len(predictor.calls)
    r = client.get("/v1/models?limit=1")
    assert r.status_code == 200 and r.json() == {"data": [{"id": "m"}], "query": "limit=1"}
    assert len(predictor.calls) == n and "x-lenpred-expected" not in r.headers


def test_bad_json_and_several_samples_are_refused_with_400(stack):
    client, up, _ = stack
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json=[1, 2])
    assert r.status_code == 400 and "JSON list, not an object" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}], "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "n = 1" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "invalid_request_error"
    for n in (2.0, "2", " 3 "):  # what the upstream's validation reads as several samples
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}], "best_of": n})
        assert r.status_code == 400, n
    assert up.received == []  # none of them reached the upstream
    for n in (1, 1.0, "1", "many", True, None):  # one sample, or left to the upstream to refuse
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}], "n": n})
        assert r.status_code == 200 and up.received[-1]["n"] == n


def test_unreadable_prompts_are_forwarded_unchanged_and_say_why(stack):
    client, up, _ = stack
    r = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 5})
    assert r.status_code == 200 and up.received[-1] == {"prompt": [1, 2, 3], "max_tokens": 5}
    assert "token ids" in r.headers["x-lenpred-skipped"] and "x-lenpred-expected" not in r.headers
    r = client.post("/v1/completions", json={"prompt": " ".join(["w"] * 60)})  # the predictor refuses it
    assert "priority" not in up.received[-1] and "context window" in r.headers["x-lenpred-skipped"]


def test_unreachable_upstream_is_a_502():
    app = create_app(f"http://127.0.0.1:{free_port()}", StubPredictor())
    with LoopbackServer(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        r = client.get("/v1/models")
    assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "server_error"


def test_openai_base_url_with_v1_is_not_doubled():
    up = Upstream()
    with LoopbackServer(up.app()) as up_url, LoopbackServer(create_app(up_url + "/v1/", StubPredictor())) as url:
        with httpx.Client(base_url=url, timeout=10) as client:
            r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a b"}]})
    assert r.status_code == 200 and up.received[-1]["priority"] == 20


def test_cap_beyond_the_context_window_predicts_uncapped_then_clips():
    """A client's max_tokens larger than the predictor's window next to the prompt: predict without a cap, then
    clip to it (not skipped)."""
    from types import SimpleNamespace

    from lenpred.errors import ContextWindowError
    from lenpred.serving.proxy.batching import LengthPredictorService

    class Window:  # a LengthPredictor stand-in: window 100 tokens, prompt = 10 tokens, predicts 9000 uncapped
        backbone_ = SimpleNamespace(tokenizer="tok")
        calls = []

        def prepare(self, prompts, cap, tokenizer=None):
            self.calls.append(cap)
            if cap is not None and 10 + cap > 100:
                raise ContextWindowError("prompt 0 ... exceeds the model's context window of 100")
            return [SimpleNamespace(num_prompt_tokens=10, cap=cap) for _ in prompts]

        def predict(self, requests, **options):
            return [SimpleNamespace(expected=min(9000.0, r.cap) if r.cap else 9000.0) for r in requests]

    w = Window()
    service = LengthPredictorService(w, tokenizers=1)
    for cap, want in ((50, 50.0), (8192, 8192.0), (None, 9000.0)):
        assert service.predict_batch([service.prepare(["q"], cap)]) == [want]
    assert w.calls == [50, 8192, None, None]  # 8192 did not fit: predicted uncapped (9000), clipped to 8192


def test_request_prompts():
    assert request_prompts("/v1/chat/completions", {"messages": []}) == (None, "no messages")
    assert request_prompts("/v1/completions", {"prompt": "hi"}) == (["hi"], None)
    assert request_prompts("/v1/completions", {})[0] is None
    msgs, _ = request_prompts("/v1/chat/completions", {"messages": [{"role": "user", "content": "q", "name": "x"}]})
    assert msgs == [[{"role": "user", "content": "q"}]]
    assert json.loads(json.dumps(msgs))  # plain JSON-able lists and dicts


def test_port_in_use_is_a_one_line_error_before_the_predictor_loads(monkeypatch):
    from typer.testing import CliRunner

    from lenpred.cli import app
    from lenpred.pipeline import LengthPredictor

    loads = []

    def fake_load(*args, **kwargs):  # the port check must come first: reaching this means it did not
        loads.append(args)
        raise LenpredError("predictor load reached")

    monkeypatch.setattr(LengthPredictor, "from_pretrained", fake_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = CliRunner().invoke(app, ["serve", "--upstream", "http://127.0.0.1:9", "--port", str(port)])
        assert r.exit_code == 2, r.output
        errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert errors == [f"error: port {port} on 127.0.0.1 is already in use (another server listens there): pass "
                          "a free one with --port, or stop that server"], r.stderr
    assert loads == []
    free = free_port()  # a free port passes the check and goes on to load the predictor
    r = CliRunner().invoke(app, ["serve", "--upstream", "http://127.0.0.1:9", "--port", str(free)])
    assert r.exit_code == 2 and "error: predictor load reached" in r.stderr and len(loads) == 1
    r = CliRunner().invoke(app, ["serve", "--upstream", "http://127.0.0.1:9", "--port", "70000"])
    assert r.exit_code == 2 and "error: --port must be in 0..65535, got 70000" in r.stderr and len(loads) == 1
    r = CliRunner().invoke(app, ["serve", "--upstream", "http://127.0.0.1:9", "--port", str(free),
                                 "--adaptive-interval", "kalman"])
    assert r.exit_code == 2 and len(loads) == 1, r.stderr
    assert "error: unknown --adaptive-interval 'kalman'; valid: aci, rolling" in r.stderr
    r = CliRunner().invoke(app, ["serve", "--upstream", "http://", "--port", str(free)])
    assert r.exit_code == 2 and len(loads) == 1 and "--upstream must be an http(s) URL with a host" in r.stderr
    r = CliRunner().invoke(app, ["serve", "--upstream", "http://127.0.0.1:9", "--port", str(free), "--traffic-log",
                                 __file__])
    assert r.exit_code == 2 and len(loads) == 1, r.stderr
    assert f"error: --traffic-log {__file__} is (or lies under) a file: pass a directory" in r.stderr


def test_cap_and_non_finite_numbers_are_read_as_the_upstream_reads_them(stack):
    client, up, predictor = stack
    msgs = [{"role": "user", "content": "one two three four five six"}]  # the stub predicts 60.4
    for cap in (50, 50.0, "50"):
        r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": cap})
        assert predictor.calls[-1][1] == 50 and r.headers["x-lenpred-priority"] == "50", cap
    n = len(up.received)
    for cap in (50.5, "fifty", True, -3, 0):  # not a positive whole number: one clear 400, nothing predicted or sent
        calls = len(predictor.calls)
        r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": cap})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"], cap
        assert r.json()["error"]["param"] == "max_tokens" and len(predictor.calls) == calls
    assert len(up.received) == n
    raw = b'{"messages": [{"role": "user", "content": "a"}], "temperature": 1e400}'
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    # forwarded as the client's bytes, unprioritised (this stub upstream then fails to echo inf: its 500 comes back)
    assert "inf or nan" in r.headers["x-lenpred-skipped"] and "x-lenpred-priority" not in r.headers
    assert up.received[-1]["temperature"] == float("inf") and "priority" not in up.received[-1]


# ------------------------------------------------------------------ disconnects, pool, ids, default cap, metrics


class Watching(Upstream):
    """An upstream that also records disconnects: ``slow`` bodies (non-streaming) wait until the client leaves;
    streams whose client leaves before the end set ``stream_aborted``; ``hold`` streams stay open until
    ``hold_count`` streams are open at once."""

    def __init__(self, hold_count: int = 0):
        super().__init__()
        self.disconnected_at = threading.Event()
        self.stream_aborted = threading.Event()
        self.open_streams = self.max_open = 0
        self.hold_count = hold_count

    async def chat(self, request):
        import asyncio

        body = await request.json()
        if body.get("model") == "slow":
            self.received.append(body)
            self.headers.append(dict(request.headers))
            for _ in range(1000):
                if await request.is_disconnected():
                    self.disconnected_at.set()
                    return JSONResponse({})
                await asyncio.sleep(0.01)
            return JSONResponse({"late": True})
        if body.get("model") == "hold":
            self.received.append(body)
            self.open_streams += 1
            self.max_open = max(self.max_open, self.open_streams)

            async def held():
                try:
                    yield b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
                    for _ in range(2000):  # until every stream is open at once (or 20 s)
                        if self.max_open >= self.hold_count:
                            break
                        await asyncio.sleep(0.01)
                    yield b"data: [DONE]\n\n"
                finally:
                    self.open_streams -= 1
            return StreamingResponse(held(), media_type="text/event-stream")
        if body.get("stream"):
            self.received.append(body)

            async def events():
                done = False
                try:
                    yield b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
                    while not self.release.is_set():
                        await asyncio.sleep(0.01)
                    yield b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}\n\n'
                    yield b"data: [DONE]\n\n"
                    done = True
                finally:
                    if not done:
                        self.stream_aborted.set()
            return StreamingResponse(events(), media_type="text/event-stream")
        self.received.append(body)
        self.headers.append(dict(request.headers))
        return JSONResponse({"echo": body, "usage": {"completion_tokens": 12}})


class BlockingPredictor(StubPredictor):
    """The stub, blocked until ``go`` is set (a prediction in progress when the client leaves)."""

    def __init__(self):
        super().__init__()
        self.go, self.started = threading.Event(), threading.Event()

    def __call__(self, prompts, max_tokens):
        self.started.set()
        self.go.wait(20)
        return super().__call__(prompts, max_tokens)


def test_a_non_streaming_client_that_leaves_aborts_the_upstream_request_within_1_s():
    up = Watching()
    with LoopbackServer(up.app()) as up_url:
        app = create_app(up_url, StubPredictor())
        with LoopbackServer(app) as url:
            with httpx.Client(base_url=url, timeout=0.5) as client, pytest.raises(httpx.ReadTimeout):
                client.post("/v1/chat/completions", json={"model": "slow", "messages": [{"role": "user",
                                                                                          "content": "a"}]})
            assert up.disconnected_at.wait(1.0)  # the upstream saw the client go within 1 s
            m = app.state.metrics
            wait_for_cancellation(m, "waiting_upstream", 100)
            assert m.value("lenpred_proxy_cancellations_total", stage="waiting_upstream") == 1
            assert m.value("lenpred_proxy_requests_total", path="/v1/chat/completions", outcome="cancelled") == 1


def test_a_client_that_leaves_while_predicted_is_never_sent_upstream():
    up, predictor = Watching(), BlockingPredictor()
    with LoopbackServer(up.app()) as up_url:
        app = create_app(up_url, predictor)
        with LoopbackServer(app) as url:
            with httpx.Client(base_url=url, timeout=0.5) as client, pytest.raises(httpx.ReadTimeout):
                client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a b"}]})
            assert predictor.started.is_set()
            m = app.state.metrics
            wait_for_cancellation(m, "predicting", 200)
            predictor.go.set()
            assert m.value("lenpred_proxy_cancellations_total", stage="predicting") == 1
            with httpx.Client(base_url=url, timeout=10) as client:  # the worker goes on with the next request
                assert client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}]}
                                   ).status_code == 200
    assert len(up.received) == 1 and up.received[0]["messages"][0]["content"] == "a"


def test_a_streaming_client_that_leaves_aborts_the_stream():
    up = Watching()
    with LoopbackServer(up.app()) as up_url:
        app = create_app(up_url, StubPredictor())
        with LoopbackServer(app) as url, httpx.Client(base_url=url, timeout=10) as client:
            body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                next(r.iter_raw())
            assert up.stream_aborted.wait(5)
            m = app.state.metrics
            wait_for_cancellation(m, "streaming", 100)
            assert m.value("lenpred_proxy_cancellations_total", stage="streaming") == 1
            assert m.value("lenpred_proxy_upstream_in_flight") == 0  # the connection went back


def test_150_concurrent_streams_all_reach_the_upstream_without_a_pool_wait():
    import asyncio

    up = Watching(hold_count=150)
    with LoopbackServer(up.app()) as up_url, LoopbackServer(create_app(up_url, StubPredictor())) as url:
        async def one(client):
            body = {"model": "hold", "messages": [{"role": "user", "content": "a"}], "stream": True}
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                text = b"".join([c async for c in r.aiter_raw()])
                return r.status_code, r.headers["x-lenpred-pool-wait-ms"], text

        async def run():
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                return await asyncio.gather(*(one(client) for _ in range(150)))

        results = asyncio.run(run())
    assert up.max_open == 150  # all 150 were open upstream at once: none waited for a connection
    assert all(status == 200 and text.endswith(b"data: [DONE]\n\n") for status, _, text in results)


def test_a_pool_wait_is_recorded():
    up = Upstream()
    up.release.set()
    with LoopbackServer(up.app()) as up_url:
        app = create_app(up_url, StubPredictor(), max_connections=1)
        with LoopbackServer(app) as url, httpx.Client(base_url=url, timeout=10) as client:
            body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
            up.release.clear()
            with client.stream("POST", "/v1/chat/completions", json=body) as first:  # holds the one connection
                chunks = first.iter_raw()
                next(chunks)
                threading.Timer(0.2, up.release.set).start()  # the first stream ends 0.2 s later
                with httpx.Client(base_url=url, timeout=10) as other:
                    r = other.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}]})
                b"".join(chunks)
            assert float(r.headers["x-lenpred-pool-wait-ms"]) > 0
            assert app.state.metrics.value("lenpred_proxy_pool_wait_seconds_count") == 2
            assert app.state.metrics.value("lenpred_proxy_pool_wait_seconds_sum") > 0


def test_every_attempt_gets_its_own_upstream_id_and_the_client_id_is_kept():
    up = Watching()
    with LoopbackServer(up.app()) as up_url, LoopbackServer(create_app(up_url, StubPredictor())) as url:
        with httpx.Client(base_url=url, timeout=10) as client:
            body = {"messages": [{"role": "user", "content": "a"}], "request_id": "req-7"}
            rs = [client.post("/v1/chat/completions", json=body, headers={"x-request-id": "req-7"}) for _ in range(2)]
            plain = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}]})
    ids = [h["x-request-id"] for h in up.headers]
    assert len(set(ids)) == 3 and all(i.startswith("req-7-") for i in ids[:2]) and ids[2].startswith("lenpred-")
    assert [b.get("request_id") for b in up.received] == [ids[0], ids[1], None]  # body id replaced too
    assert [r.headers["x-lenpred-upstream-request-id"] for r in rs] == ids[:2]
    assert all(r.headers["x-lenpred-client-request-id"] == "req-7" for r in rs)
    assert "x-lenpred-client-request-id" not in plain.headers


def test_a_missing_or_null_cap_gets_the_default_forwarded_and_recorded():
    up, predictor = Watching(), StubPredictor()
    with LoopbackServer(up.app()) as up_url:
        app = create_app(up_url, predictor, default_max_tokens=24)
        with LoopbackServer(app) as url, httpx.Client(base_url=url, timeout=10) as client:
            msgs = [{"role": "user", "content": "one two three"}]
            for extra in ({}, {"max_tokens": None}, {"max_tokens": None, "max_completion_tokens": None}):
                r = client.post("/v1/chat/completions", json={"messages": msgs, **extra})
                assert up.received[-1]["max_tokens"] == 24 and predictor.calls[-1][1] == 24
                assert r.headers["x-lenpred-default-max-tokens"] == "24" and up.received[-1]["priority"] == 24
            r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 100})
            assert "x-lenpred-default-max-tokens" not in r.headers and up.received[-1]["max_tokens"] == 100
            assert app.state.metrics.value("lenpred_proxy_default_max_tokens_total") == 3


def test_health_and_metrics_count_outcomes_predictions_and_observed_tokens():
    up = Watching()
    up.release.set()
    with LoopbackServer(up.app()) as up_url:
        app = create_app(up_url, StubPredictor())
        with LoopbackServer(app) as url, httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/health").json()["status"] == "ok"
            msgs = [{"role": "user", "content": "one two"}]  # the stub predicts 20.4
            client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 64})  # usage: 12 tokens
            with client.stream("POST", "/v1/chat/completions", json={"messages": msgs, "stream": True}) as r:
                r.read()  # usage chunk: 7 tokens
            client.post("/v1/chat/completions", json={"messages": msgs, "n": 3})
            text = client.get("/metrics").text
    m = app.state.metrics
    assert m.value("lenpred_proxy_requests_total", path="/v1/chat/completions", outcome="forwarded") == 2
    assert m.value("lenpred_proxy_requests_total", path="/v1/chat/completions", outcome="refused") == 1
    assert m.value("lenpred_proxy_predicted_output_tokens_sum") == pytest.approx(40.8)
    assert m.value("lenpred_proxy_observed_output_tokens_sum") == 19
    assert m.value("lenpred_proxy_prediction_abs_error_tokens_sum") == pytest.approx(8.4 + 13.4)
    assert m.value("lenpred_proxy_prediction_batch_size_count") == 2
    assert m.value("lenpred_proxy_prediction_seconds_count") == 2
    assert "lenpred_proxy_pool_wait_seconds_bucket" in text and "# TYPE lenpred_proxy_requests_total counter" in text


def test_queued_requests_are_predicted_together_in_one_batch():
    """While one batch runs, the requests that arrive queue up and form the next batch (one call)."""
    import asyncio

    from lenpred.serving.proxy.batching import BatchConfig, FunctionService, PredictionBatcher

    class Recording(FunctionService):
        def __init__(self):
            super().__init__(lambda prompts, cap: float(len(prompts[0])))
            self.batches, self.go = [], threading.Event()

        def predict_batch(self, items):
            self.batches.append(len(items))
            self.go.wait(10)
            return super().predict_batch(items)

    async def run():
        service = Recording()
        batcher = PredictionBatcher(service, BatchConfig(window_ms=0, max_batch_tokens=10))
        await batcher.start()
        first = asyncio.ensure_future(batcher.predict(service.prepare(["a"], None)))
        while not service.batches:
            await asyncio.sleep(0.001)
        waiting = [asyncio.ensure_future(batcher.predict(service.prepare(["x" * k], None))) for k in (2, 3, 4)]
        dropped = asyncio.ensure_future(batcher.predict(service.prepare(["zz"], None)))
        await asyncio.sleep(0.01)
        dropped.cancel()  # its client left before its batch started: not predicted
        service.go.set()
        values = [await first] + [await w for w in waiting]
        await batcher.stop()
        return service.batches, values

    batches, values = asyncio.run(run())
    assert batches == [1, 3] and values == [1.0, 2.0, 3.0, 4.0]


def test_serve_without_the_serve_extra_names_the_install(monkeypatch):
    import importlib.util

    from typer.testing import CliRunner

    from lenpred.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    r = CliRunner().invoke(app, ["serve", "--upstream", "notaurl"])
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == ["error: lenpred serve needs the serve extra (uvicorn not installed): "
                                     "pip install -e '.[serve]' from the repository root"]
