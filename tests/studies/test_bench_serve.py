"""The `vllm bench serve` comparison's parts: the dataset lines, the command, reading a detailed result, the client's
requests and the paired report (hand-worked numbers)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.studies.bench_serve import (BenchServeConfig, bench_command, client_requests, dataset_items, markdown,
                                         read_bench_result, report)


def _rows(n=3):
    return [{"request": SimpleNamespace(prompt_id=f"p{i}"), "max_tokens": 512 * (1 + i % 2)} for i in range(n)]


def test_capacity_is_required_and_the_pattern_is_the_queue_benchmarks():
    from lenpred.studies.bench_serve import run

    with pytest.raises(LenpredError, match="--capacity-req-s"):
        BenchServeConfig()
    for mode in ("priority_prompt_len", "priority_lenpred"):  # a priority the benchmark cannot send: refused first
        with pytest.raises(LenpredError, match=f"{mode} need a per-request priority"):
            run(BenchServeConfig(capacity_req_s=0.3, modes=f"stock,{mode}"))
    cfg = BenchServeConfig(capacity_req_s=0.331, cv=2.0, load=0.9)
    assert cfg.pattern == "gamma2x0.9"
    assert cfg.queue_config().patterns == "gamma2x0.9" and cfg.queue_config().draws == 1


def test_dataset_lines_are_the_user_message_and_the_cap():
    messages = {f"p{i}": [{"role": "user", "content": f"q{i}"}] for i in range(3)}
    assert dataset_items(_rows(), messages) == [{"prompt": "q0", "output_tokens": 512},
                                                {"prompt": "q1", "output_tokens": 1024},
                                                {"prompt": "q2", "output_tokens": 512}]
    messages["p1"] = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]
    with pytest.raises(LenpredError, match="p1 has 2 message"):
        dataset_items(_rows(), messages)


def test_command_takes_each_cap_keeps_order_and_sets_burstiness(tmp_path):
    cfg = BenchServeConfig(capacity_req_s=0.2, cv=2.0, load=1.5, seed=7, temperature=0.5)
    cmd = bench_command(cfg, "http://127.0.0.1:1", "m", "/tok", tmp_path / "d.jsonl", 10, tmp_path / "r" / "x.json")
    arg = lambda flag: cmd[cmd.index(flag) + 1]  # noqa: E731
    assert arg("--custom-output-len") == "-1" and "--skip-chat-template" in cmd and "--disable-shuffle" in cmd
    assert float(arg("--request-rate")) == pytest.approx(0.3) and float(arg("--burstiness")) == 0.25
    assert arg("--seed") == "7" and arg("--temperature") == "0.5" and json.loads(arg("--extra-body")) == {"seed": 0}
    assert arg("--result-dir") == str(tmp_path / "r") and arg("--result-filename") == "x.json"
    assert "--ignore-eos" not in cmd and "--save-detailed" in cmd and "e2el" in arg("--percentile-metrics")


def test_a_detailed_result_reads_as_a_run_and_others_are_refused(tmp_path):
    res = {"input_lens": [5, 6, 7], "output_lens": [10, 0, 0], "ttfts": [0.1, 0.0, 0.0], "latencies": [2.0, 0.0, 0.0],
           "start_times": [100.5, 101.25, 102.0], "errors": ["", "boom", ""], "duration": 3.0, "mean_e2el_ms": 2000.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(res))
    rec = read_bench_result(path, 3)
    assert [r["arrival_s"] for r in rec["results"]] == [0.0, 0.75, 1.5]
    # an error text, or no latency with an empty one (vLLM's record of a non-200 with no reason): not ok
    assert [r["outcome"] for r in rec["results"]] == ["ok", "error", "error"] and rec["results"][0]["jct_s"] == 2.0
    assert rec["summary"]["mean_e2el_ms"] == 2000.0 and rec["summary"]["p99_e2el_ms"] is None
    with pytest.raises(LenpredError, match="holds 3 requests, the draw 4"):
        read_bench_result(path, 4)
    path.write_text(json.dumps({k: v for k, v in res.items() if k != "start_times"}))
    with pytest.raises(LenpredError, match="--save-detailed"):
        read_bench_result(path, 3)


def test_client_requests_replay_the_send_times_with_the_run_wide_sampling():
    cfg = BenchServeConfig(capacity_req_s=0.3, temperature=0.7)
    messages = {f"p{i}": [{"role": "user", "content": f"q{i}"}] for i in range(3)}
    reqs = client_requests(_rows(), messages, [0.0, 0.75, 2.5], cfg, "stock-client-")
    assert [r.arrival_s for r in reqs] == [0.0, 0.75, 2.5] and [r.max_tokens for r in reqs] == [512, 1024, 512]
    assert reqs[1].extra_body == {"seed": 0, "temperature": 0.7, "top_p": 1.0, "request_id": "stock-client-q1"}


def _run(jcts, outcomes=None, tokens=10):
    outcomes = outcomes or ["ok"] * len(jcts)
    return {"settings": {"traffic_log": None}, "summary": {"max_send_lag_s": 0.004},
            "results": [{"request_id": i, "jct_s": j, "outcome": o, "completion_tokens": tokens}
                        for i, (j, o) in enumerate(zip(jcts, outcomes))]}


def test_report_pairs_the_requests_ok_everywhere_by_hand():
    store = {"runs": {"0/stock/vllm_bench": _run([10.0, 20.0, 30.0, 99.0]),
                      "0/stock/client": _run([11.0, 21.0, 28.0, 1.0], ["ok", "ok", "ok", "error"]),
                      "0/plugin/vllm_bench": _run([5.0, 10.0, 30.0, 7.0], tokens=12),
                      "0/plugin/client": _run([6.0, 9.0, 30.0, 7.0])}}
    store["runs"]["0/stock/vllm_bench"]["server"] = {"preemptions": 0.0, "requests": 4.0, "mean_e2e_s": 39.75,
                                                     "mean_itl_s": 0.105}  # what the engine itself measured
    rep = report(store, n_resamples=200)
    assert rep["num_paired"] == 3  # request 3 failed under one client: left out everywhere
    s, p = rep["modes"]["stock"], rep["modes"]["plugin"]
    assert s["vllm_bench_mean_jct_s"] == 20.0 and s["client_mean_jct_s"] == 20.0
    assert s["client_vs_bench"][0] == pytest.approx(0.0)
    assert p["client_vs_bench"][0] == pytest.approx(1 - 15.0 / 15.0)
    assert p["vllm_bench_mean_output_tokens"] == 12.0
    cut = rep["vs_stock"]["plugin"]["vllm_bench"]["mean_cut"]
    assert cut[0] == pytest.approx(1 - 15.0 / 20.0) and cut[1] <= cut[0] <= cut[2]
    assert rep["vs_stock"]["plugin"]["client"]["p99_ratio"][0] == pytest.approx(
        np.percentile([6, 9, 30], 99) / np.percentile([11, 21, 28], 99))
    from dataclasses import asdict

    text = markdown(rep, asdict(BenchServeConfig(capacity_req_s=0.331)))
    assert text.startswith("# `vllm bench serve` and the project's client: gamma1x1.1 at 0.3641 req/s")
    assert "| stock | 20.0 | 20.0 | +0.0%" in text and "| plugin | vllm_bench | +25.0%" in text
    assert "at most 4 ms (stock), 4 ms (plugin)" in text
    assert "The engine's own mean end-to-end latency per run (its mean inter-token latency): stock vllm_bench 39.8 s " \
           "(105 ms)." in text
    del store["runs"]["0/plugin/client"]
    with pytest.raises(LenpredError, match="plugin/client"):
        report(store)


def test_same_prompts_compares_each_runs_window_of_the_traffic_log(tmp_path):
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord
    from lenpred.studies.bench_serve import same_prompts

    # by arrival (Unix s): a warm-up at 5, the benchmark's 3 in [10, 20], another server start's warm-up at 25, the
    # client's 3 in [30, 40] in another order
    rows = [(5, "w"), (11, "a"), (12, "b"), (13, "a"), (25, "w"), (31, "b"), (32, "a"), (33, "a")]
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "log")) as w:
        for t, h in reversed(rows):  # written in finish order, not arrival order
            w.record(TrafficRecord(features=np.zeros(2, np.float32), num_output_tokens=1, finish_reason="stop",
                                   arrival_time_s=float(t), finish_time_s=100.0 - t, prompt_sha256=h))
    run = lambda a, b: {"unix_start_s": a, "unix_end_s": b, "results": [{}] * 3}  # noqa: E731
    assert same_prompts(tmp_path / "log", run(10, 20), run(30, 40)) == {"rows": [3, 3], "same": True}
    assert same_prompts(tmp_path / "log", run(10, 20), run(24, 40))["same"] is False  # the warm-up fell inside
    assert same_prompts(tmp_path / "log", run(10, 12.5), run(30, 40)) == {"rows": [2, 3], "same": False}
