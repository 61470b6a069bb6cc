"""The real-engine benchmarks' shared pieces that need no engine (:mod:`lenpred.studies.engine_bench`): rotation,
pairing, the priority a client sends, the command lines and the per-mode latency cell."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from lenpred.studies.engine_bench import (PORT, complete_draws, latency_cell, mode_draws, paired, rotated, row_priority,
                                          run_key, servers, vllm_command)


def _result(i: int, jct: float, outcome: str = "ok") -> dict:
    return {"request_id": i, "outcome": outcome, "jct_s": jct, "ttft_s": jct / 10, "finish_reason": "stop",
            "completion_tokens": 10}


def _run(results: list[dict], tok_s: float = 100.0) -> dict:
    return {"results": results, "summary": {"throughput_tok_s": tok_s}, "preemptions": 1.0, "loadavg_1m_before": 0.5}


def test_rotated():
    assert rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert rotated({"x": 1, "y": 2}, 1) == ["y", "x"]
    assert rotated([], 3) == []


def test_paired_keeps_requests_ok_under_every_mode_and_complete_draws():
    store = {"runs": {run_key(0, "stock", "b"): _run([_result(0, 4.0), _result(1, 6.0), _result(2, 8.0)]),
                      run_key(0, "fast", "b"): _run([_result(0, 2.0), _result(1, 3.0, "failed"), _result(2, 5.0)]),
                      run_key(1, "stock", "b"): _run([_result(0, 1.0)])}}
    jct = paired(store, [0], "b", ["stock", "fast"])
    assert [v.tolist() for v in jct["stock"]] == [[4.0, 8.0]] and [v.tolist() for v in jct["fast"]] == [[2.0, 5.0]]
    # "fast" ran in one draw of two: the draws stock (the reference) has are kept, "fast" is paired on its own
    assert mode_draws(store, "b", ("stock", "fast", "other"), 2) == {"stock": [0, 1], "fast": [0]}
    assert complete_draws(store, "b", ("stock", "fast", "other"), 2) == (["stock"], [0, 1])
    store["runs"][run_key(1, "fast", "b")] = _run([_result(0, 0.5)])
    store["runs"][run_key(1, "other", "b")] = _run([_result(0, 0.7)])
    assert complete_draws(store, "b", ("stock", "fast", "other"), 2) == (["stock", "fast"], [0, 1])
    del store["runs"][run_key(1, "stock", "b")]  # the reference's draws decide: a draw stock has not run yet waits
    assert complete_draws(store, "b", ("stock", "fast", "other"), 2) == (["stock", "fast"], [0])
    assert complete_draws({"runs": {}}, "b", ("stock",), 2) == ([], [])


def test_latency_cell():
    runs = [_run([_result(0, 2.0), _result(1, 4.0), _result(2, 9.0, "cancelled")], 100.0),
            _run([_result(0, 6.0)], 50.0)]
    c = latency_cell(runs)  # ok: 2, 4, 6 s
    assert (c["num_ok"], c["num_requests"]) == (3, 4)
    assert c["mean_jct_s"] == 4.0 and c["p50_jct_s"] == 4.0 and np.isclose(c["mean_ttft_s"], 0.4)
    assert c["throughput_tok_s"] == 75.0 and c["preemptions"] == 2.0 and c["capped_share"] == 0.0


def test_row_priority():
    row = {"oracle": 37, "prompt_oracle": 12.6, "request": SimpleNamespace(num_prompt_tokens=211)}
    assert [row_priority(row, k) for k in (None, "oracle", "prompt_oracle", "prompt_tokens")] == [None, 37, 13, 211]


def test_commands_stay_on_loopback_and_the_proxy_sits_in_front(tmp_path):
    cmd = vllm_command("/m", 16, 597_519_360, 2422, ["--scheduling-policy", "priority"])
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    flag = lambda name: cmd[cmd.index(name) + 1]  # noqa: E731
    assert (flag("--host"), flag("--port"), flag("--max-num-seqs"), flag("--kv-cache-memory-bytes"),
            flag("--max-model-len"), flag("--scheduling-policy")) == ("127.0.0.1", str(PORT), "16", "597519360",
                                                                      "2422", "priority")
    spec = servers(cmd, tmp_path / "v.log", {0}, tmp_path / "p.log", {1})
    assert spec.url == f"http://127.0.0.1:{PORT + 1}" and spec.cpus == [{0}, {1}]
    assert spec.commands[1][-6:] == ["--upstream", f"http://127.0.0.1:{PORT}", "--port", str(PORT + 1), "--threads",
                                     "1"]
    alone = servers(cmd, tmp_path / "v.log", None)
    assert alone.url == f"http://127.0.0.1:{PORT}" and len(alone.commands) == 1
    assert flag("--max-num-batched-tokens") == "8192"


def test_load_sampler_summarises_its_samples_and_none_before_the_first():
    from lenpred.studies.engine_bench import LoadSampler

    with LoadSampler(every_s=60.0) as idle:
        pass
    assert idle.summary() == {"mean": None, "max": None, "samples": 0}
    with LoadSampler(every_s=0.01) as s:
        time.sleep(0.2)
    assert s.samples and all(x >= 0 for x in s.samples)  # sampled while the block ran
    s.samples = [1.0, 3.0, 2.0]  # the summary of known samples
    assert s.summary() == {"mean": 2.0, "max": 3.0, "samples": 3}


def test_the_engines_own_counters_parse_and_difference_by_hand():
    from lenpred.studies.engine_bench import parse_counters, server_side

    text = "\n".join([
        "# HELP vllm:e2e_request_latency_seconds ...",
        'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 30.0',
        'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 3.0',
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0"} 1.0',  # not a counter it reads
        'vllm:inter_token_latency_seconds_sum{engine="0"} 2.0',
        'vllm:inter_token_latency_seconds_count{engine="0"} 20.0',
        'vllm:num_preemptions_total{engine="0"} 1.0', 'vllm:num_preemptions_total{engine="1"} 2.0',
        'vllm:iteration_tokens_total_sum{engine="0"} 100.0', 'vllm:iteration_tokens_total_count{engine="0"} 10.0'])
    before = parse_counters(text)
    assert before["vllm:num_preemptions_total"] == 3.0 and before["vllm:e2e_request_latency_seconds_count"] == 3.0
    after = {**before, "vllm:e2e_request_latency_seconds_sum": 70.0, "vllm:e2e_request_latency_seconds_count": 5.0,
             "vllm:inter_token_latency_seconds_sum": 5.0, "vllm:inter_token_latency_seconds_count": 50.0,
             "vllm:iteration_tokens_total_sum": 164.0, "vllm:iteration_tokens_total_count": 14.0}
    # 4 steps computed 64 tokens between the reads
    assert server_side(before, after) == {"preemptions": 0.0, "requests": 2.0, "mean_e2e_s": 20.0, "mean_itl_s": 0.1,
                                          "steps": 4.0, "tokens_per_step": 16.0}
    assert server_side(before, before)["mean_e2e_s"] is None and server_side(before, before)["tokens_per_step"] is None


def test_the_plugin_counters_are_read_from_its_scheduler_log(tmp_path):
    from lenpred.io import write_json
    from lenpred.studies.engine_bench import plugin_counters

    log = tmp_path / "plugin.jsonl"
    assert plugin_counters(None) == {} and plugin_counters(log) == {}  # no plug-in; not written yet
    write_json(f"{log}.scheduler.json", {"steps": 512, "policy_s": 0.5, "head_s": 0.25, "predicted": 7,
                                         "kv_parked": 3})
    assert plugin_counters(log) == {"steps": 512.0, "policy_s": 0.5, "head_s": 0.25, "parked_request_steps": 0.0,
                                    "predicted": 7.0}


def test_the_speed_probe_is_the_median_time_per_token_after_the_first():
    from lenpred.studies.engine_bench import PROBE_REQUESTS, PROBE_TOKENS, probe_summary

    ok = lambda jct, ttft, n: {"outcome": "ok", "jct_s": jct, "ttft_s": ttft, "completion_tokens": n}  # noqa: E731
    rows = [ok(7.3, 1.0, 64), ok(8.56, 2.5, 64), ok(5.0, 0.5, 46), ok(2.0, 2.0, 1),  # 0.1, ~0.0962, 0.1, too short
            {"outcome": "error", "jct_s": None, "ttft_s": None, "completion_tokens": None}]
    got = probe_summary(rows)
    assert got["tpot_s"] == pytest.approx(0.1) and (got["requests"], got["tokens"]) == (PROBE_REQUESTS, PROBE_TOKENS)
    assert probe_summary(rows[3:])["tpot_s"] is None
