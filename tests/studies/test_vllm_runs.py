"""Pure parts of the vLLM real runs (no vLLM needed): priorities and their contract, cost-model measurements from
engine steps, the load generator's request bodies and SSE parsing, and the server lifecycle (killed on exit)."""

from __future__ import annotations

import os
import socket
import sys

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.serving.cost_model import CostModel
from lenpred.serving.loadgen import LoadRequest, parse_sse_line, request_body
from lenpred.serving.supervisor import ServerGroup, check_ports_free, parse_cpu_set
from lenpred.studies.vllm_offline import StepRecord, check_priorities, cost_measurements, priorities_for, step_time_s
from lenpred.studies.vllm_serve import (VLLMServeConfig, load_requests, pin_load_generator, proxy_command,
                                        vllm_serve_command)
from lenpred.studies.workload import WorkloadRequest
from conftest import free_port  # noqa: E402


def _req(i, out_len, preds, prompt=10):
    return WorkloadRequest(i, [1] * prompt, out_len, 256, "longseq", f"p{i}", {**preds, "oracle": float(out_len)},
                           num_prompt_tokens=prompt)


def test_priorities_are_rounded_predictions_fcfs_is_all_zero():
    reqs = [_req(0, 50, {"estp": 12.6}), _req(1, 7, {"estp": 3.4}), _req(2, 0, {"estp": 0.5})]
    assert priorities_for(reqs, "fcfs") == [0, 0, 0]
    assert priorities_for(reqs, "sjf:estp") == [13, 3, 0]  # Python rounds half to even: 0.5 -> 0
    assert priorities_for(reqs, "sjf:oracle") == [50, 7, 0]
    assert all(type(p) is int for p in priorities_for(reqs, "sjf:estp"))
    with pytest.raises(LenpredError, match="cannot be run by vLLM's priority field"):
        priorities_for(reqs, "srpt:estp")
    with pytest.raises(LenpredError, match="valid policies: fcfs, random, sjf, srpt"):
        priorities_for(reqs, "lifo")


def test_check_priorities_enforces_vllms_contract():
    assert check_priorities(np.array([3, 1]), 2) == [3, 1] and type(check_priorities(np.array([3]), 1)[0]) is int
    with pytest.raises(LenpredError, match="one per prompt"):
        check_priorities([1, 2], 3)
    with pytest.raises(LenpredError, match="not an integer"):
        check_priorities([1.0, 2], 2)
    with pytest.raises(LenpredError, match="not an integer"):
        check_priorities([True], 1)


def test_cost_measurements_keep_pure_steps_only():
    steps = [StepRecord(0.5, prefill_prompt_tokens=[100, 20]),
             StepRecord(0.05, decode_context_tokens=[101, 21]),
             StepRecord(0.3, prefill_prompt_tokens=[40], decode_context_tokens=[102])]  # mixed: left out
    assert cost_measurements(steps) == [
        {"batch_size": 2, "prompt_tokens": [100, 20], "num_new_tokens": 1, "wall_s": 0.5},
        {"kind": "decode", "batch_size": 2, "context_tokens": 122.0, "wall_s": 0.05}]


def test_step_time_is_the_fused_cost_model():
    cost = CostModel("vllm", {"p0": 0.01, "p1": 1e-4, "p2": 1e-7, "d0": 0.02, "d1": 0.001, "d2": 1e-5},
                     fused_prefill=True)
    # pure prefill: p0 + p1·(100 + 20) + p2·(100² + 20²)
    assert step_time_s(cost, StepRecord(0, [100, 20])) == pytest.approx(0.01 + 0.012 + 1e-7 * 10400)
    # pure decode: d0 + d1·2 + d2·(101 + 21)
    assert step_time_s(cost, StepRecord(0, [], [101, 21])) == pytest.approx(0.02 + 0.002 + 1e-5 * 122)
    # mixed: the decode step + the prefill's token terms, no second p0
    assert step_time_s(cost, StepRecord(0, [40], [102])) == pytest.approx(0.02 + 0.001 + 1e-5 * 102 + 0.004 + 1.6e-4)


def test_cost_model_recovers_known_coefficients_from_steps():
    true = {"p0": 0.01, "p1": 2e-4, "p2": 0.0, "d0": 0.03, "d1": 0.002, "d2": 1e-5}
    cost = CostModel("vllm", true, fused_prefill=True)
    rng = np.random.default_rng(0)
    steps = [StepRecord(0, list(rng.integers(20, 900, size=b))) for b in (1, 2, 3, 4, 2, 1, 4)]
    steps += [StepRecord(0, [], list(rng.integers(50, 1500, size=b))) for b in (1, 2, 3, 4) * 4]
    for s in steps:
        s.wall_s = step_time_s(cost, s)
    fitted = CostModel.fit(cost_measurements(steps), engine="vllm", fused_prefill=True)
    for k in ("p0", "p1", "d0", "d1", "d2"):
        assert fitted.coefficients[k] == pytest.approx(true[k], rel=1e-3, abs=1e-9)


def test_load_requests_per_mode_and_bodies():
    reqs = [_req(0, 0, {}), _req(1, 40, {})]
    messages = {"p0": [{"role": "user", "content": "a"}], "p1": [{"role": "user", "content": "b"}]}
    fcfs = load_requests(reqs, "fcfs", [0.0, 1.5], messages)
    assert [(r.priority, r.max_tokens, r.arrival_s) for r in fcfs] == [(0, 1, 0.0), (0, 40, 1.5)]
    assert [r.priority for r in load_requests(reqs, "predicted", [0, 0], messages)] == [None, None]
    assert [r.priority for r in load_requests(reqs, "oracle", [0, 0], messages)] == [0, 40]
    # the proxy's prediction is clipped to the request's benchmark cap (256), not to max_tokens = the true length
    assert [r.prediction_cap for r in fcfs] == [256, 256]
    with pytest.raises(LenpredError, match="unknown mode"):
        load_requests(reqs, "sjf", [0, 0], messages)
    body = request_body(LoadRequest(1, messages["p1"], 40, 0.0, 7), "m", ignore_eos=True)
    assert body["priority"] == 7 and body["ignore_eos"] is True and body["max_tokens"] == 40 and body["stream"]
    assert "priority" not in request_body(LoadRequest(1, messages["p1"], 40, 0.0, None), "m")
    # natural EOS: the benchmark cap (or the run's) as max_tokens, no cap header, a per-request seed when sampling
    natural = load_requests(reqs, "predicted", [0, 0], messages, ignore_eos=False, seed=3)
    assert [(r.max_tokens, r.prediction_cap, r.extra_body) for r in natural] == [
        (256, None, {"seed": 3_000_000}), (256, None, {"seed": 3_000_001})]
    assert [r.max_tokens for r in load_requests(reqs, "fcfs", [0, 0], messages, False, 64)] == [64, 64]
    assert "ignore_eos" not in request_body(natural[0], "m")


def test_parse_sse_line():
    assert parse_sse_line('data: {"choices": []}') == {"choices": []}
    assert parse_sse_line("data: [DONE]") is None and parse_sse_line("") is None and parse_sse_line(": ping") is None


def test_commands_bind_loopback_with_priority_scheduling():
    cfg = VLLMServeConfig(port=9001, proxy_port=9002, max_num_seqs=3)
    cmd = vllm_serve_command("/m", cfg)
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    pairs = dict(zip(cmd[3::1], cmd[4::1]))
    assert pairs["--host"] == "127.0.0.1" and pairs["--scheduling-policy"] == "priority"
    assert pairs["--port"] == "9001" and pairs["--max-num-seqs"] == "3"
    proxy = proxy_command(cfg)
    assert proxy[proxy.index("--upstream") + 1] == "http://127.0.0.1:9001" and proxy[proxy.index("--port") + 1] == "9002"




def test_servers_are_killed_on_exit_even_after_an_error(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    servers = ServerGroup([cmd], [f"http://127.0.0.1:{port}/"], [tmp_path / "log"], timeout_s=30)
    with pytest.raises(RuntimeError):
        with servers:
            proc = servers.procs[0]
            assert proc.poll() is None  # it answered and runs
            raise RuntimeError("the run failed")
    assert proc.poll() is not None  # killed by __exit__


def test_cpu_sets_parse_and_pin_the_server(tmp_path):
    have = sorted(os.sched_getaffinity(0))
    assert parse_cpu_set(None) is None and parse_cpu_set(f"{have[0]}") == {have[0]}
    assert parse_cpu_set(",".join(map(str, have))) == set(have) and parse_cpu_set(f"{have[0]}-{have[0]}") == {have[0]}
    for bad in ("x", "1-a", "", f"{max(have) + 1}"):
        with pytest.raises(LenpredError):
            parse_cpu_set(bad, "vllm_cpus")
    with pytest.raises(LenpredError, match="--proxy-cpus 'x' is not a CPU list"):
        VLLMServeConfig(proxy_cpus="x")
    with pytest.raises(LenpredError, match="the range 3-1 is empty"):
        parse_cpu_set("3-1", "--vllm-cpus")
    with pytest.raises(LenpredError, match="--draws must be >= 2"):
        VLLMServeConfig(draws=1)
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with ServerGroup([cmd], [f"http://127.0.0.1:{port}/"], [tmp_path / "log"], timeout_s=30, cpus=[{have[-1]}]) as s:
        assert os.sched_getaffinity(s.procs[0].pid) == {have[-1]}


def test_a_server_that_exits_is_reported(tmp_path):
    cmd = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with pytest.raises(LenpredError, match=r"exited \(3\)"):
        with ServerGroup([cmd], [f"http://127.0.0.1:{free_port()}/"], [tmp_path / "log"], timeout_s=30):
            pass


def test_replay_records_stream_timing_usage_and_headers():
    import threading
    import time

    uvicorn = pytest.importorskip("uvicorn")
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from lenpred.serving.loadgen import run_replay

    seen, caps = [], []

    async def chat(request):
        body = await request.json()
        seen.append(body)
        caps.append(request.headers.get("x-lenpred-cap"))

        async def events():  # one chunk per token, like vLLM, then usage and [DONE]
            yield b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
            for _ in range(body["max_tokens"]):
                yield b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
            yield b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % body["max_tokens"]
            yield b"data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"x-lenpred-expected": "12.5", "x-lenpred-priority": "13",
                                          "x-lenpred-predict-ms": "4.0"})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]),
                                           host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        reqs = [LoadRequest(0, [{"role": "user", "content": "a"}], 3, 0.0, None),
                LoadRequest(1, [{"role": "user", "content": "b"}], 2, 0.2, 0, prediction_cap=512)]
        res = run_replay(f"http://127.0.0.1:{port}", reqs, "m")
    finally:
        server.should_exit = True
        thread.join(10)
    assert [r["num_chunks"] for r in res] == [3, 2]  # the empty role chunk is not a token
    assert [r["completion_tokens"] for r in res] == [3, 2] and res[0]["prompt_tokens"] == 5
    assert res[0]["expected"] == 12.5 and res[0]["priority"] == 13 and res[0]["predict_ms"] == 4.0
    assert res[1]["arrival_s"] >= 0.2  # sent at its arrival time
    assert all(r["arrival_s"] <= r["first_token_s"] <= r["finish_s"] for r in res)
    assert sorted(b.get("priority", -1) for b in seen) == [-1, 0]
    assert sorted(caps, key=str) == ["512", None]  # the cap header only when the request has one


def test_schedule_report_re_renders_the_committed_vllm_reports(tmp_path):
    """`lenpred schedule report` rebuilds run 2's and run 3's Markdown from their JSON exactly as the runs wrote it."""
    import shutil
    from pathlib import Path

    from typer.testing import CliRunner

    from lenpred.cli import app

    committed = Path(__file__).resolve().parents[2] / "results" / "scheduling"
    for name in ("vllm_offline.json", "vllm_serve.json"):
        shutil.copy(committed / name, tmp_path / name)
    r = CliRunner().invoke(app, ["schedule", "report", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    for name in ("vllm_offline", "vllm_serve"):
        assert (tmp_path / f"{name}.md").read_text() == (committed / f"{name}.md").read_text()
        assert (tmp_path / f"{name}_jct_cdf.png").stat().st_size > 0
    assert "Real run 3" in r.output


def test_run3_pins_the_load_generator_after_reading_both_cpu_sets():
    """The vLLM CPU set is read before this process is pinned to the proxy's (pinning first made it unusable)."""
    have = sorted(os.sched_getaffinity(0))
    if len(have) < 2:
        pytest.skip("needs two CPUs")
    try:
        cpus = pin_load_generator(VLLMServeConfig(vllm_cpus=str(have[0]), proxy_cpus=str(have[-1])))
        assert cpus == [{have[0]}, {have[-1]}] and os.sched_getaffinity(0) == {have[-1]}
    finally:
        os.sched_setaffinity(0, set(have))
    assert pin_load_generator(VLLMServeConfig()) == [None, None] and os.sched_getaffinity(0) == set(have)


def test_serve_report_natural_eos_labels_pairs_and_counts():
    """Run 3's report from stored replays (no servers): JCT / TTFT from the planned time over `ok` requests, paired
    cuts vs FCFS, outcome counts, the natural-EOS label in the Markdown."""
    from lenpred.studies.vllm_serve import _serve_report, serve_markdown

    reqs = [_req(0, 30, {}), _req(1, 10, {})]

    def row(i, finish, first, outcome="ok", tokens=20, expected=None):
        return {"request_id": i, "arrival_s": float(i), "sent_s": float(i), "status": 200, "outcome": outcome,
                "first_token_s": first, "finish_s": finish, "prompt_tokens": 10, "completion_tokens": tokens,
                "finish_reason": "stop", "expected": expected, "predict_ms": 5.0}

    # JCT per mode: fcfs (4, 6) → 5; predicted (2, 4) → 3; oracle (2, 2) → 2, the same in both draws
    modes = {"fcfs": [row(0, 4.0, 2.0), row(1, 7.0, 3.0)],
             "predicted": [row(0, 2.0, 1.0, expected=25.0), row(1, 5.0, 2.0, expected=14.0)],
             "oracle": [row(0, 2.0, 1.0), row(1, 3.0, 2.0), ]}
    partial = {"runs": {f"{d}/{m}": rows for d in (0, 1) for m, rows in modes.items()}}
    partial["runs"]["1/oracle"] = modes["oracle"] + []
    cfg = VLLMServeConfig(draws=2, bootstrap_resamples=50)
    report = _serve_report(cfg, partial, [reqs, reqs], 0.5)
    assert report["rows"]["fcfs"]["mean_jct_s"][0] == 5.0 and report["rows"]["oracle"]["mean_jct_s"][0] == 2.0
    assert report["jct_reduction_vs_fcfs"]["predicted"][0] == pytest.approx(1 - 3 / 5)
    assert report["ttft_reduction_vs_fcfs"]["predicted"][0] == pytest.approx(1 - 1.0 / 2.0)  # TTFT (1, 1) vs (2, 2)
    assert report["gain_share_predicted"][0] == pytest.approx(2 / 3)
    c = report["checks"]
    assert c["proxy_mae_tokens"] == pytest.approx((5 + 4) / 2)  # vs the benchmark's 30 and 10
    assert c["proxy_mae_observed_tokens"] == pytest.approx((5 + 6) / 2)  # vs the 20 tokens generated here
    assert c["outcomes"]["ok"] == 12 and c["achieved_rate_per_s"] == 1.0 and c["predict_ms_p99"] == 5.0
    md = serve_markdown(report)
    assert md.startswith("# Real run 3, natural EOS:") and "TTFT cut vs FCFS" in md and "planned send time" in md
    # a no-content request is counted and kept out of the latency statistics
    partial["runs"]["0/fcfs"] = [row(0, 4.0, 2.0), row(1, 9.0, None, "no_content", 0)]
    report = _serve_report(cfg, partial, [reqs, reqs], 0.5)
    assert report["runs"]["fcfs"][0]["mean_jct_s"] == 4.0 and report["checks"]["outcomes"]["no_content"] == 1


def test_a_busy_port_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LenpredError, match=f"127.0.0.1:{port} is in use"):
            check_ports_free(free_port(), port)
        cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
        group = ServerGroup([cmd], [f"http://127.0.0.1:{port}/"], [tmp_path / "log"], timeout_s=5, ports=(port,))
        with pytest.raises(LenpredError, match="is in use"):
            group.__enter__()
        assert group.procs == [] and not (tmp_path / "log").exists()  # nothing was started
    check_ports_free(port)  # free again once closed
