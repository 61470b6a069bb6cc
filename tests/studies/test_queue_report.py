"""``scripts/queue_benchmark.py --report-only`` on a hand-made ``runs.json``: which draws pair which modes, the cuts
against stock, a mode run in fewer draws paired on its own, and the regime map (no engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = {"policy": "srpt", "plp": False, "decode_slots": 2, "prefill_ahead": 2, "admit_by": "prompt_len",
          "max_idle_s": None}


def _run(mode: str, pattern: str, jcts: list[float], boot_id: str = "boot-a") -> dict:
    plugin = PLUGIN if mode == "plugin" else None
    settings = {"mode": mode, "pattern": pattern, "num_requests": len(jcts), "rate_req_s": None, "max_num_seqs": 2,
                "kv_cache_bytes": 46080 * 4096, "scheduling_policy": "fcfs" if mode == "stock" else "priority",
                "priority": None, "proxy": None, "plugin": plugin}
    results = [{"request_id": i, "outcome": "ok", "jct_s": j, "finish_s": j, "ttft_s": j / 2, "finish_reason": "stop",
                "completion_tokens": 10 * (i + 1), "prompt_tokens": 20, "priority": None,
                "priority_sent": float(10 * (i + 1)), "recorded_output_tokens": 10 * (i + 1)}
               for i, j in enumerate(jcts)]
    log = [{"request_id": f"x-q{i}-y", "expected": 10.0 * (i + 1)} for i in range(len(jcts))] if plugin else []
    return {"settings": settings, "results": results, "summary": {"throughput_tok_s": 50.0}, "preemptions": 0.0,
            "loadavg_1m_before": 0.1, "plugin_log": log, "machine": {"hostname": "h", "boot_id": boot_id}}


def _one_slot_run(mode: str, jcts: list[float]) -> dict:
    """A trace slice's run at one decode slot (stock: ``max_num_seqs`` 1): a 40-token request at t = 0, then 11 of 4
    tokens every 2 s, the plug-in's predictions exact; ``jcts`` the measured JCT per request, s."""
    rec = _run(mode, "tracecodex1.1", jcts)
    rec["settings"].update(rate_req_s=0.5, max_num_seqs=1 if mode == "stock" else 2)
    if mode == "plugin":
        rec["settings"]["plugin"] = {**PLUGIN, "decode_slots": 1, "prefill_ahead": 1}
    for i, r in enumerate(rec["results"]):
        r.update(arrival_s=2.0 * i, completion_tokens=40 if i == 0 else 4)
    for i, log in enumerate(rec["plugin_log"]):
        log["expected"] = 40.0 if i == 0 else 4.0
    return rec


@pytest.fixture
def report(tmp_path: Path) -> dict:
    runs = {}
    for pattern in ("burst4", "burst8"):
        runs[f"0/stock/{pattern}"] = _run("stock", pattern, [10.0, 20.0, 30.0])
        runs[f"0/plugin/{pattern}"] = _run("plugin", pattern, [5.0, 10.0, 15.0])
        runs[f"1/stock/{pattern}"] = _run("stock", pattern, [10.0, 10.0, 10.0])
        other = "boot-b" if pattern == "burst8" else "boot-a"  # burst8's draw 1: its plug-in run on another machine
        runs[f"1/plugin/{pattern}"] = _run("plugin", pattern, [10.0, 10.0, 10.0], other)
        runs[f"0/priority_oracle/{pattern}"] = _run("priority_oracle", pattern, [4.0, 8.0, 12.0])  # draw 0 only
    runs["0/priority_prompt_len/burst4"] = _run("priority_prompt_len", "burst4", [6.0, 12.0, 18.0])
    runs["1/priority_prompt_len/burst4"] = _run("priority_prompt_len", "burst4", [10.0, 10.0, 10.0])
    regime = {"decode_bound": 2, "kv_cache_bytes": 46080 * 4096, "kv_bytes_per_token": 46080, "kv_floor_applied": False,
              "kv_dtype": "float32", "max_model_len": 2422, "plugin": PLUGIN,
              "capacity": {"capacity_req_s": 0.2, "how": "given (--capacity-req-s)", "cost_model": None}}
    (tmp_path / "runs.json").write_text(json.dumps({"config": {"seed": 100, "max_tokens": None}, "regime": regime,
                                                    "runs": runs}))
    subprocess.run([sys.executable, str(ROOT / "scripts" / "queue_benchmark.py"), "--report-only", "--out",
                    str(tmp_path), "--bootstrap-resamples", "50", "--sim-cost-model",
                    str(ROOT / "results/scripts/serving/cost_vllm_1core_sampled.json")],
                   check=True, cwd=ROOT, capture_output=True, text=True)
    assert (tmp_path / "regime_map.png").stat().st_size > 0 and (tmp_path / "report.md").exists()
    return json.loads((tmp_path / "report.json").read_text())


def test_modes_in_fewer_draws_are_paired_on_their_own(report, tmp_path: Path):
    p = report["patterns"]["burst8"]
    # stock and the plug-in ran in both draws: paired over both, the oracle's single draw does not cut them down
    assert p["draws"] == [0, 1] and list(p["modes"]) == ["stock", "plugin"]
    assert p["stock_capacity_req_s"] == [3 / 30.0, 3 / 10.0]  # each burst's requests / its makespan
    # pooled over both draws: 1 - (30 + 30) / (60 + 30)
    assert p["modes"]["plugin"]["jct_cut_vs_stock"][0] == pytest.approx(1 / 3)
    oracle = p["fewer_draws"]["priority_oracle"]
    assert oracle["draws"] == [0] and oracle["jct_cut_vs_stock"][0] == pytest.approx(1 - 8 / 20)
    assert oracle["best_lenpred_cut"][0] == pytest.approx(1 - 10 / 8)  # the plug-in's draw 0 (mean 10) vs 8
    md = (tmp_path / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| priority_oracle | [0] |"))
    assert "the best lenpred mode (plugin;" in md and row.endswith("| -25.0% [-25.0%, -25.0%] |")
    assert oracle["p99_jct_ratio_vs_stock"][0] == pytest.approx(
        (8 + 0.98 * 4) / (20 + 0.98 * 10))  # numpy's linear percentile of (4, 8, 12) over (10, 20, 30)


def test_the_pace_per_run_is_its_median_time_per_token_and_its_speed_probe():
    from lenpred.studies.queue_report import run_paces

    runs = {"0/stock/burst8": _run("stock", "burst8", [1.0, 2.0, 3.0]) | {"speed_probe": {"tpot_s": 0.05}},
            "1/plugin/burst8": _run("plugin", "burst8", [1.0]),  # recorded before the probe existed
            "0/plugin/burst4": _run("plugin", "burst4", [1.0]) | {"speed_probe": {"tpot_s": 0.07}}}
    for r, ttft in zip(runs["0/stock/burst8"]["results"], (0.1, 0.1, 0.1)):  # 10, 20, 30 tokens
        r["ttft_s"] = ttft
    # (1 - 0.1) / 9 = 0.1, (2 - 0.1) / 19 = 0.1, (3 - 0.1) / 29 = 0.1 s; _run's plug-in run: (1 - 0.5) / 9
    got = run_paces({"runs": runs}, "burst8", 2)
    assert list(got) == ["stock", "plugin"] and got["stock"]["0"]["tpot_ms"] == pytest.approx(100.0)
    assert got["stock"]["0"]["probe_ms"] == pytest.approx(50.0) and got["plugin"]["1"]["probe_ms"] is None
    assert got["plugin"]["1"]["tpot_ms"] == pytest.approx(1000 * 0.5 / 9)
    assert "steps" not in got["stock"]["0"]  # recorded before the engine's steps were


def test_the_steps_per_run_give_the_time_per_step_and_the_plugins_share():
    from lenpred.studies.queue_report import run_paces

    runs = {"0/stock/burst8": _run("stock", "burst8", [1.0]) | {"wall_s": 100.0,
                                                                  "server": {"steps": 1000.0, "tokens_per_step": 15.5}},
            "0/plugin/burst8": _run("plugin", "burst8", [1.0]) | {
                "wall_s": 105.0, "server": {"steps": 1000.0, "tokens_per_step": 15.5},
                "plugin_counters": {"steps": 768.0, "policy_s": 0.5, "head_s": 0.268}}}
    got = run_paces({"runs": runs}, "burst8", 1)
    assert got["stock"]["0"]["wall_ms_per_step"] == pytest.approx(100.0)  # 100 s over 1000 steps
    assert got["stock"]["0"]["plugin_ms_per_step"] is None
    assert got["plugin"]["0"]["wall_ms_per_step"] == pytest.approx(105.0)
    assert got["plugin"]["0"]["plugin_ms_per_step"] == pytest.approx(1.0)  # 0.768 s over 768 steps


def test_regime_map_orders_depths_and_matches_the_cells(report):
    rmap = report["regime_map"]
    assert list(rmap) == ["4", "8"]  # N / D ascending (JSON keys)
    cell = rmap["8"]["plugin"]
    assert cell["measured_cut"] == report["patterns"]["burst8"]["modes"]["plugin"]["jct_cut_vs_stock"]
    sim = report["patterns"]["burst8"]["modes"]
    assert cell["simulated_cut"] == pytest.approx(1 - sim["plugin"]["simulated_mean_jct_s"]
                                                  / sim["stock"]["simulated_mean_jct_s"])
    # the same yardstick on the cell: both modes ran in both draws, so the ratio of sums is the ratio of means
    assert sim["plugin"]["simulated_cut_vs_stock"] == pytest.approx(cell["simulated_cut"])
    assert "simulated_cut_vs_stock" not in sim["stock"]
    assert len(sim["plugin"]["simulated_p99_ratio_vs_stock_per_draw"]) == 2  # one per draw
    # these hand-made runs take 1-3 s per token, ten times the cost model's pace: no pace scale in 0.5-2 matches stock
    assert report["patterns"]["burst8"]["stock_pace_scale"] == {"0": None, "1": None}
    assert report["patterns"]["burst8"]["stock_pace_elasticity"] == {"0": None, "1": None}
    assert sim["plugin"]["simulated_over_measured_at_stock_pace"] is None
    assert sim["plugin"]["pace_scale_per_draw"] == {"0": None, "1": None} and "pace_scale_per_draw" not in sim["stock"]
    # measured per draw: 1 - 10 / 20 (5, 10, 15 against 10, 20, 30) and 1 - 10 / 10
    assert sim["plugin"]["measured_cut_vs_stock_per_draw"] == pytest.approx([0.5, 0.0])
    per_draw = sim["plugin"]["simulated_cut_vs_stock_per_draw"]
    assert min(per_draw) <= sim["plugin"]["simulated_cut_vs_stock"] <= max(per_draw)  # the pooled cut lies between
    assert rmap["8"]["priority_oracle"]["draws"] == [0] and "priority_lenpred" not in rmap["8"]


def test_the_simulated_tail_is_over_the_measured_p99_of_the_same_run(report):
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_report import simulated_summary

    # the oracle ran in draw 0 only (JCTs 4, 8, 12 s: numpy's p99 = 8 + 0.98 * 4)
    cost = CostModel.load(ROOT / report["simulator_cost_model"]).with_streaming_overhead(
        report["simulator_streaming_overhead"]["s_per_token"])
    sim = simulated_summary(_run("priority_oracle", "burst8", [4.0, 8.0, 12.0]), report["regime"], cost, seed=100)
    cell = report["patterns"]["burst8"]["fewer_draws"]["priority_oracle"]
    assert cell["simulated_p99_over_measured"] == pytest.approx(sim["p99_jct_s"] / (8 + 0.98 * 4))


def test_length_thirds_and_the_best_mode_against_the_others_are_paired(report):
    classes = report["patterns"]["burst8"]["length_classes"]
    # recorded lengths (10, 20, 30) in both draws: thirds = request 0 / 1 / 2 of each draw (stable ranks)
    assert classes["upper_tokens"] == [10.0, 20.0, 30.0]
    cut = classes["jct_cut_vs_stock"]["plugin"]
    assert cut["short"][0] == pytest.approx(1 - (5 + 10) / (10 + 10))
    assert cut["medium"][0] == pytest.approx(1 - (10 + 10) / (20 + 10))
    assert cut["long"][0] == pytest.approx(1 - (15 + 10) / (30 + 10))
    assert "stock" not in classes["jct_cut_vs_stock"]
    best = report["patterns"]["burst4"]["best_lenpred"]
    # the plug-in (5, 10, 15 | 10, 10, 10) against prompt-length priority (6, 12, 18 | 10, 10, 10)
    assert best["mode"] == "plugin" and list(best["jct_cut_vs"]) == ["priority_prompt_len"]
    assert best["jct_cut_vs"]["priority_prompt_len"][0] == pytest.approx(1 - 60 / 66)
    assert report["patterns"]["burst4"]["acceptance"]["beats_prompt_len_interval_above_0"] is not None


def test_a_draw_run_on_two_machines_is_flagged(report, tmp_path: Path):
    # draw 1's plug-in run of burst8 recorded another boot id than its stock run; burst4's draws each ran on one
    assert report["patterns"]["burst8"]["mixed_machine_draws"] == [1]
    assert report["patterns"]["burst4"]["mixed_machine_draws"] == []
    md = (tmp_path / "report.md").read_text()
    assert md.count("ran on more than one machine") == 1


def test_a_trace_run_is_simulated_on_its_own_planned_send_times():
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_report import simulated_mean_jct

    # two stock requests of 3 tokens planned 100 s apart, one decode slot, 1 s per forward: neither waits, each takes
    # 3 s (prefill + 2 decode steps); were the times drawn from a seed instead, the second could queue behind the first
    rec = _run("stock", "tracecodex1.1", [3.0, 3.0])
    rec["settings"].update(rate_req_s=0.01, max_num_seqs=1)
    for r, t in zip(rec["results"], (0.0, 100.0)):
        r.update(arrival_s=t, completion_tokens=3)
    unit = CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=True)
    assert simulated_mean_jct(rec, {"kv_bytes_per_token": 46080}, unit, seed=0) == pytest.approx(3.0)


def test_stock_pace_is_the_scale_that_makes_the_simulated_run_the_measured_one():
    """``fit_run_pace`` on the trace case above (two lone 3-token requests, 3 s each at the unit cost): nothing
    queues, so the simulated mean JCT is 3·f and a run measured at 3.6 s is the engine at f = 1.2; one measured at
    10 s would need f = 3.3, outside the bounds searched (0.5-2): no pace. ``with_pace`` scales every step."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_report import fit_run_pace, pace_elasticity, simulated_mean_jct

    unit = CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=True)
    regime = {"kv_bytes_per_token": 46080}

    def measured(jct: float) -> dict:
        rec = _run("stock", "tracecodex1.1", [jct, jct])
        rec["settings"].update(rate_req_s=0.01, max_num_seqs=1)
        for r, t in zip(rec["results"], (0.0, 100.0)):
            r.update(arrival_s=t, completion_tokens=3)
        return rec

    f = fit_run_pace(measured(3.6), regime, unit, seed=0)
    assert f == pytest.approx(1.2, abs=2e-3)
    assert pace_elasticity(measured(3.6), regime, unit, seed=0, pace=f) == pytest.approx(1.0)  # 3·f: nothing waits
    assert simulated_mean_jct(measured(3.6), regime, unit.with_pace(1.2), seed=0) == pytest.approx(3.6)
    assert fit_run_pace(measured(10.0), regime, unit, seed=0) is None
    assert fit_run_pace(measured(1.2), regime, unit, seed=0) is None  # f = 0.4: below the bounds


def test_a_plugin_runs_own_pace_is_fitted_with_its_own_mechanism():
    """``fit_run_pace`` on a plug-in run (FCFS order, one decode slot, a 40-token request then 11 of 4 tokens every
    2 s) measured at the simulated mean JCT of 1.3x the unit cost: its own mode simulated, the fit returns 1.3; the
    report renders it beside stock's, mode by draw."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_render import run_paces_markdown
    from lenpred.studies.queue_report import fit_run_pace, pace_elasticity, simulated_mean_jct

    unit = CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=True)
    regime = {"kv_bytes_per_token": 46080}
    rec = _run("plugin", "tracecodex1.1", [1.0] * 12)
    rec["settings"].update(rate_req_s=0.5, plugin={**PLUGIN, "policy": "fcfs", "decode_slots": 1, "prefill_ahead": 1})
    for i, (r, log) in enumerate(zip(rec["results"], rec["plugin_log"])):
        r.update(arrival_s=2.0 * i, completion_tokens=40 if i == 0 else 4)
        log["expected"] = float(r["completion_tokens"])
    target = simulated_mean_jct(rec, regime, unit.with_pace(1.3), seed=0)
    for r in rec["results"]:
        r["jct_s"] = target
    assert target > 1.3 * 8 and fit_run_pace(rec, regime, unit, seed=0) == pytest.approx(1.3, abs=2e-3)
    assert pace_elasticity(rec, regime, unit, seed=0, pace=1.3) > 1.0  # the short ones wait behind the long one
    md = run_paces_markdown({"0": 1.2, "1": None}, {"plugin": {"0": 1.3, "1": 0.95}})
    assert md[2].splitlines() == ["| mode | draw 0 | draw 1 |", "|---|---|---|", "| stock | 1.200 | – |",
                                  "| plugin | 1.300 | 0.950 |"]


def test_a_guarded_plugin_run_is_simulated_with_its_guard():
    """``plugin_guard``'s record carries ``aging_tokens_per_s``: the simulator ages the waiting requests' rank by it.
    One decode slot, a 40-token request at t = 0 and 11 of 4 tokens every 2 s: unguarded, each short one overtakes
    the long one; aged, the long one's rank falls below theirs while it waits, so shorts wait behind it and the mean
    JCT rises; aged without bound, rank is arrival order: the plug-in's FCFS."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_report import simulated_mean_jct

    unit = CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=True)

    def mean_jct(aging: float, policy: str = "srpt") -> float:
        rec = _run("plugin", "tracecodex1.1", [1.0] * 12)
        rec["settings"].update(rate_req_s=0.5, plugin={**PLUGIN, "policy": policy, "decode_slots": 1,
                                                        "prefill_ahead": 1, "aging_tokens_per_s": aging})
        for i, (r, log) in enumerate(zip(rec["results"], rec["plugin_log"])):
            r.update(arrival_s=2.0 * i, completion_tokens=40 if i == 0 else 4)
            log["expected"] = float(r["completion_tokens"])
        return simulated_mean_jct(rec, {"kv_bytes_per_token": 46080}, unit, seed=0)

    assert mean_jct(0.0) < mean_jct(1.0) < mean_jct(4.0) < mean_jct(1e4)
    assert mean_jct(1e4) == pytest.approx(mean_jct(0.0, policy="fcfs"))


def test_whatif_on_each_plugin_runs_own_traffic_log_beside_the_measured_cut(tmp_path: Path):
    """``add_whatif``: one row per draw whose plug-in run kept its traffic log, the measured cut and p99 ratio
    worked by hand from the runs, the prediction what ``lenpred whatif`` says of that log from the run's first arrival
    (the benchmark's warm-up requests, logged before it, are not replayed); a draw whose log is gone, or whose plug-in
    ran FCFS, gets no row."""
    import numpy as np

    import shutil

    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord, write_engine_settings
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_render import whatif_markdown
    from lenpred.studies.queue_report import add_whatif
    from lenpred.studies.whatif import WhatifConfig, run_whatif

    rng = np.random.default_rng(3)
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "log")) as w:
        for _ in range(2):  # the two warm-up requests, done long before the run (the run has no speed probe)
            w.record(TrafficRecord(features=np.zeros(4), expected=9.0, low=0, high=1, num_output_tokens=9,
                                   finish_reason="stop", arrival_time_s=900.0, first_token_time_s=900.5,
                                   finish_time_s=901.0, num_prompt_tokens=20))
        for i in range(40):  # a burst of 40, served 4 at a time
            n, first = int(rng.integers(5, 300)), 0.5 + (i // 4) * 3.0
            w.record(TrafficRecord(features=np.zeros(4), expected=float(n), low=0, high=1, num_output_tokens=n,
                                   finish_reason="stop", arrival_time_s=1000.0, first_token_time_s=1000.0 + first,
                                   finish_time_s=1000.0 + first + 0.1 * n, num_prompt_tokens=20))
    cost = tmp_path / "cost.json"
    CostModel("40 ms a step", {"p0": 0.04, "p1": 0.0, "p2": 0.0, "d0": 0.04, "d1": 0.0, "d2": 0.0},
              fused_prefill=True).save(cost)  # about the log's pace: a scale in 0.5-2 matches its mean JCT
    run = lambda jct, log=None: {"settings": {"traffic_log": log},  # noqa: E731
                                 "results": [{"jct_s": x, "outcome": "ok", "sent_s": 0.0} for x in jct for _ in range(20)]}
    guarded = run([9.0, 27.0], str(tmp_path / "log"))
    guarded["settings"]["plugin"] = {"aging_tokens_per_s": 4.0}
    # draw 1's log is the same rows with the plug-in's engine settings beside them (the order it served): fitted
    shutil.copytree(tmp_path / "log", tmp_path / "served")
    write_engine_settings(tmp_path / "served", {"policy": "srpt", "decode_slots": 4, "prefill_ahead": 4,
                                                "max_num_seqs": 8})
    store = {"runs": {"0/stock/burst8": run([10.0, 30.0]), "0/plugin_guard/burst8": guarded,
                      "0/plugin/burst8": run([8.0, 24.0], str(tmp_path / "log")),
                      "1/stock/burst8": run([10.0, 10.0]), "1/plugin/burst8": run([5.0, 5.0], str(tmp_path / "served")),
                      "2/stock/burst8": run([10.0]), "2/plugin/burst8": run([5.0], str(tmp_path / "gone")),
                      "3/stock/burst8": run([10.0]), "3/plugin/burst8": run([5.0], str(tmp_path / "log"))}}
    store["runs"]["3/plugin/burst8"]["settings"]["plugin"] = {"policy": "fcfs"}  # not an order whatif replays
    rep = {"regime": {"decode_bound": 4}, "patterns": {"burst8": {"stock_pace_scale": {"0": 0.9, "1": 1.1}}}}
    add_whatif(rep, store, tmp_path / "out", str(cost), 200)
    row, fitted, guard_row = rep["patterns"]["burst8"]["whatif"]  # by mode (the plug-in first), then draw
    want = {a: run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), cost_model=str(cost), decode_slots=(4,),
                                       aging_tokens_per_s=a, out=str(tmp_path / "again"), bootstrap_resamples=200,
                                       since="1000", until="1000")
                          )["results"]["4"]["lenpred"] for a in (0.0, 4.0)}
    assert (row["mode"], row["draw"]) == ("plugin", 0) and row["measured_cut"] == pytest.approx(0.2)  # 1 - 40/50
    assert row["measured_p99_ratio"] == pytest.approx(0.8) and row["predicted_cut"] == want[0.0]["jct_cut_vs_stock"][0]
    assert row["error_pp"] == pytest.approx(100 * (want[0.0]["jct_cut_vs_stock"][0] - 0.2))
    assert (row["since"], row["until"]) == (1000.0, 1000.0)  # the window replayed: every arrival of the log at 1000 s
    # beside it the paces: the stock run's of its own draw, and none fitted to a log without its engine settings
    assert (row["pace_scale"], row["stock_pace_scale"]) == (None, 0.9)
    served = run_whatif(WhatifConfig(traffic=str(tmp_path / "served"), cost_model=str(cost), decode_slots=(4,),
                                     out=str(tmp_path / "again"), bootstrap_resamples=200, since="1000", until="1000"))
    assert served["pace_scale"] is not None and (fitted["draw"], fitted["measured_cut"]) == (1, pytest.approx(0.5))
    assert (fitted["pace_scale"], fitted["stock_pace_scale"]) == (served["pace_scale"], 1.1)
    assert fitted["predicted_cut"] == served["results"]["4"]["lenpred"]["jct_cut_vs_stock"][0]
    # the guarded run is replayed with its own guard
    assert guard_row["mode"] == "plugin_guard" and guard_row["measured_cut"] == pytest.approx(0.1)  # 1 - 45/50
    assert guard_row["predicted_cut"] == want[4.0]["jct_cut_vs_stock"][0]
    replayed = json.loads((tmp_path / "out" / "whatif" / "0-plugin-burst8" / "whatif.json").read_text())
    assert replayed["num_requests"] == 40 and replayed["window"] == {"since_epoch_s": 1000.0, "until_epoch_s": 1000.0,
                                                                     "num_outside": 2, "num_in_flight": 0}
    assert json.loads((tmp_path / "out" / "whatif" / "0-plugin_guard-burst8" / "whatif.json").read_text()
                      )["aging_tokens_per_s"] == 4.0
    table = "\n".join(whatif_markdown(rep["patterns"]["burst8"]["whatif"]))
    assert f"| plugin | 1 | {fitted['predicted_cut']:+.1%} | +50.0% |" in table
    assert table.count("| – / 0.900 |") == 2 and f"| {fitted['pace_scale']:.3f} / 1.100 |" in table


def test_acceptance_checks_issue_49s_thresholds_on_a_trace_and_38s_elsewhere():
    from lenpred.studies.queue_report import acceptance

    cell = {"jct_cut_vs_stock": (0.08, 0.01, 0.15), "p99_jct_ratio_vs_stock": (1.04, 0.9, 1.2),
            "throughput_ratio_vs_stock": 1.02}
    best = {"mode": "plugin", "jct_cut_vs": {"priority_prompt_len": (0.03, 0.005, 0.06)}}
    below = acceptance({"plugin": cell}, best, 5, "tracecodex0.9")  # 8 % >= 6 % below capacity
    assert below == {"mode": "plugin", "issue": 49, "cut_ge_6pct_interval_above_0": True,
                     "beats_prompt_len_interval_above_0": True, "p99_jct_le_1.05x_stock": True,
                     "throughput_within_3pct": True, "at_least_5_draws": True, "all": True}
    above = acceptance({"plugin": cell}, best, 5, "tracecodex1.1")  # 8 % < 10 % above capacity
    assert above["cut_ge_10pct_interval_above_0"] is False and above["all"] is False
    gamma = acceptance({"plugin": {**cell, "p99_jct_ratio_vs_stock": (1.08, 1.0, 1.2)}}, best, 4, "gamma1x1.1")
    assert gamma["issue"] == 38 and gamma["p99_jct_le_1.1x_stock"] is True
    assert gamma["cut_ge_12pct_interval_above_0"] is False
    assert gamma["prompt_oracle_share_ge_0.8"] is None and gamma["at_least_5_draws"] is False


def test_stock_capacity_is_requests_over_the_bursts_makespan():
    from lenpred.studies.queue_report import stock_capacity

    store = {"runs": {"0/stock/burst8": {"results": [{"finish_s": 10.0}, {"finish_s": 40.0}]},
                      "1/stock/burst8": {"results": [{"finish_s": 5.0}, {"finish_s": 20.0}, {"finish_s": 30.0}]}}}
    assert stock_capacity(store, "burst8", [0, 1]) == [2 / 40.0, 3 / 30.0]


def test_the_simulated_p99_ratio_pools_the_draws_requests(report):
    import numpy as np

    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_report import simulated_run

    cost = CostModel.load(ROOT / report["simulator_cost_model"]).with_streaming_overhead(
        report["simulator_streaming_overhead"]["s_per_token"])
    jct = {m: [t.jct_s for d, js in enumerate(([10.0, 20.0, 30.0], [10.0, 10.0, 10.0]) if m == "stock" else
                                                ([5.0, 10.0, 15.0], [10.0, 10.0, 10.0]))
               for t in simulated_run(_run(m, "burst4", js), report["regime"], cost, seed=100 + d)[1]]
           for m in ("stock", "plugin")}
    assert len(jct["stock"]) == 6  # three requests in each of the two draws
    cell = report["patterns"]["burst4"]["modes"]["plugin"]
    assert cell["simulated_p99_ratio_vs_stock"] == pytest.approx(
        np.percentile(jct["plugin"], 99) / np.percentile(jct["stock"], 99))


def test_a_run_hours_from_its_stock_run_is_flagged():
    from lenpred.studies.queue_report import draws_apart_from_stock

    def at(mode, hhmm):
        return _run(mode, "burst8", [1.0]) | {"started": f"2026-12-05T{hhmm}:00"}

    runs = {"0/stock/burst8": at("stock", "01:00"), "0/plugin/burst8": at("plugin", "02:29"),  # 1 h 29 min: a sitting
            "1/stock/burst8": at("stock", "09:00"), "1/plugin/burst8": at("plugin", "07:20"),  # 1 h 40 min before
            "2/stock/burst8": at("stock", "01:00"), "2/plugin/burst8": _run("plugin", "burst8", [1.0]),  # no time
            "3/stock/burst8": at("stock", "01:00") | {"finished": "2026-12-05T01:15:00"},
            "3/plugin/burst8": at("plugin", "02:40") | {"finished": "2026-12-05T02:55:00"}}  # finished 1 h 40 apart
    got = draws_apart_from_stock({"runs": runs}, "burst8", [0, 1, 2, 3], ["stock", "plugin"])
    assert got == {"plugin": [1, 3]}
    assert draws_apart_from_stock({"runs": runs}, "burst8", [0, 2], ["stock", "plugin"]) == {}


def test_the_best_mode_is_chosen_among_modes_run_beside_stock():
    import numpy as np

    from lenpred.studies.queue_report import best_lenpred

    cells = {"stock": {}, "plugin": {}, "plugin_guard": {}}
    jct = {"stock": [np.array([10.0, 20.0])], "plugin": [np.array([8.0, 16.0])],
           "plugin_guard": [np.array([5.0, 10.0])]}  # fastest, but its runs started hours from stock's
    assert best_lenpred(cells, jct, 20)["mode"] == "plugin_guard"
    best = best_lenpred(cells, jct, 20, exclude={"plugin_guard": [0]})
    assert best["mode"] == "plugin" and best["jct_cut_vs"]["plugin_guard"][0] == pytest.approx(1 - 12 / 7.5)


def test_the_header_names_each_modes_own_guard_and_the_table_the_simulator_at_stocks_pace():
    from lenpred.studies.queue_render import mode_guards, sim_over_measured

    rep = {"patterns": {"tracecodex1.1": {"modes": {"stock": {}, "plugin_guard": {}},
                                          "fewer_draws": {"plugin_wait": {}, "plugin": {}}}}}
    assert mode_guards(rep) == "; plugin_guard: aging_tokens_per_s 4; plugin_wait: max_wait_s 200 s"
    assert mode_guards({"patterns": {"burst8": {"modes": {"stock": {}, "plugin": {}}}}}) == ""
    assert sim_over_measured({"simulated_over_measured": 1.234, "simulated_over_measured_at_stock_pace": 0.987}) == \
        "1.23 (0.99)"
    assert sim_over_measured({"simulated_over_measured": 1.05}) == "1.05"  # stock: its own pace is the fit
    assert sim_over_measured({}) == "–"


def test_a_rerun_logs_its_traffic_afresh(tmp_path: Path):
    """An earlier attempt's traffic log (a superseded run of the same draw and mode) moves aside before the rerun's
    server starts: the writer appends to an existing directory, and whatif would replay both runs as one."""
    from lenpred.studies.queue_bench import fresh_traffic_dir, log_in_use

    log = tmp_path / "traffic" / "0-plugin"
    assert fresh_traffic_dir(log) is None
    for n in (1, 2):
        log.mkdir(parents=True)
        (log / "part-00000001.parquet").write_text(f"attempt {n}")
        assert fresh_traffic_dir(log) == tmp_path / "traffic" / "superseded" / f"0-plugin-{n}"
        assert not log.exists()
    assert (tmp_path / "traffic/superseded/0-plugin-2/part-00000001.parquet").read_text() == "attempt 2"
    # a finished run of the same draw and mode (any pattern) still needs its log: it is not moved then
    store = {"runs": {"0/plugin/burst8": {}, "1/stock/burst8": {}}}
    assert log_in_use(store, 0, "plugin") and not log_in_use(store, 1, "plugin")
    assert not log_in_use(store, 0, "plugin_wait") and not log_in_use(store, 10, "plugin")


def test_guard_frontier_resimulates_the_plugin_run_under_each_age_threshold(tmp_path: Path, caplog):
    """``guard_frontier`` on one slice (one decode slot, a 40-token request at t = 0, then 11 of 4 tokens every 2 s,
    the unit cost at stock's pace 1): the first point is the plug-in as it ran (the shorts overtake the long one);
    T = 0 makes every request overdue at once, so it runs in arrival order, the plug-in's FCFS; no threshold changes
    nothing. The measured point is worked from the runs' JCTs: 1 − mean(2, 4, ...) / mean(4, 8, ...) = 0.5.
    ``scripts/guard_frontier.py`` writes the same from the store and refuses bad thresholds in one line."""
    import numpy as np

    from lenpred.errors import LenpredError
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_render import frontier_markdown, plot_frontier
    from lenpred.studies.queue_report import guard_frontier, simulated_run

    unit = CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=True)
    unit.save(tmp_path / "cost.json")
    runs = {}
    for mode in ("stock", "plugin"):
        runs[f"0/{mode}/tracecodex1.1"] = _one_slot_run(mode, [2.0 * (i + 1) * (2 if mode == "stock" else 1)
                                                               for i in range(12)])
    runs["1/stock/tracecodex1.1"] = runs["0/stock/tracecodex1.1"]  # draw 1: no plug-in run, left out
    store = {"config": {"seed": 0}, "runs": runs}
    regime = {"kv_bytes_per_token": 46080}
    rep = {"regime": regime, "simulator_streaming_overhead": {"s_per_token": 0.0},
           "simulator_cost_model": str(tmp_path / "cost.json"),
           "patterns": {"tracecodex1.1": {"draws": [0], "stock_pace_scale": {"0": 1.0, "1": 1.0}}}}
    fr = guard_frontier(store, rep, "tracecodex1.1", [0.0, None])
    as_run, t0, never = fr["points"]
    assert [p["max_wait_s"] for p in fr["points"]] == [None, 0.0, None] and fr["draws"] == [0]
    assert fr["left_out_draws"] == [1] and "draws [1] left out" in caplog.text

    def sim(rec: dict) -> np.ndarray:
        return np.array([t.jct_s for t in simulated_run(rec, regime, unit, seed=0)[1]])

    stock = sim(runs["0/stock/tracecodex1.1"])
    fcfs = dict(runs["0/plugin/tracecodex1.1"])
    fcfs["settings"] = {**fcfs["settings"], "plugin": {**fcfs["settings"]["plugin"], "policy": "fcfs"}}
    assert t0["cut"] == pytest.approx(1 - sim(fcfs).mean() / stock.mean())
    assert t0["p99_ratio"] == pytest.approx(np.percentile(sim(fcfs), 99) / np.percentile(stock, 99))
    assert as_run["cut"] == pytest.approx(1 - sim(runs["0/plugin/tracecodex1.1"]).mean() / stock.mean())
    assert never["cut"] == pytest.approx(as_run["cut"]) and as_run["cut"] > t0["cut"]
    assert as_run["cut_per_draw"] == [pytest.approx(as_run["cut"])]
    as_fcfs = guard_frontier(store, rep, "tracecodex1.1", [None], policy="fcfs")
    assert (as_fcfs["policy"], as_fcfs["policy_as_run"], fr["policy"]) == ("fcfs", "srpt", "srpt")
    assert as_fcfs["points"][1]["cut"] == pytest.approx(t0["cut"])  # FCFS without a threshold: arrival order again
    assert fr["measured"]["cut"] == pytest.approx(0.5)  # every plug-in JCT half stock's
    assert fr["measured"]["p99_ratio"] == pytest.approx(0.5)
    md = frontier_markdown(fr)
    assert "Measured on the engine: plugin +50.0%, p99 0.500x" in md and "(left out: draws [1])" in md
    assert f"| T = 0 s | {t0['cut']:+.1%} | {t0['p99_ratio']:.3f} |" in md and "| no threshold |" in md
    plot_frontier(fr, tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    for bad, msg in ((dict(pattern="burst8"), "no simulated pattern 'burst8'; it has: tracecodex1.1"),
                     (dict(mode="plugin_wait"), "no 'plugin_wait' runs with the plug-in in the store; its plug-in "
                                                "modes: plugin"),
                     (dict(policy="lifo"), "policy 'lifo' is unknown"),
                     (dict(max_waits=[float("inf")]), "thresholds must be finite seconds >= 0")):
        with pytest.raises(LenpredError, match=msg):
            guard_frontier(store, rep, **{"pattern": "tracecodex1.1", "max_waits": [0.0], **bad})
    with pytest.raises(LenpredError, match="the report has no simulator results"):
        guard_frontier(store, {}, "tracecodex1.1", [0.0])
    rep["patterns"]["tracecodex1.1"]["stock_pace_scale"] = {"0": None}
    with pytest.raises(LenpredError, match="no draw has a plugin run and a stock run at a fitted pace"):
        guard_frontier(store, rep, "tracecodex1.1", [0.0])

    rep["patterns"]["tracecodex1.1"]["stock_pace_scale"] = {"0": 1.0}
    (tmp_path / "runs.json").write_text(json.dumps(store))
    (tmp_path / "report.json").write_text(json.dumps(rep))
    script = [sys.executable, str(ROOT / "scripts" / "guard_frontier.py"), "--store", str(tmp_path), "--pattern",
              "tracecodex1.1"]
    bad = subprocess.run(script + ["--max-waits", "-5"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --max-waits takes seconds >= 0 or none")
    subprocess.run(script + ["--max-waits", "none,0,0"], check=True, capture_output=True)
    written = json.loads((tmp_path / "guard_frontier_tracecodex1.1.json").read_text())
    assert written["max_waits"] == [0.0, None]  # sorted, once each, none last
    assert [p["cut"] for p in written["points"]] == pytest.approx([as_run["cut"], t0["cut"], never["cut"]])
    assert written["command"].endswith("--max-waits none,0,0")


def test_the_header_gives_each_draws_rate_where_slices_ran_at_their_own_sittings_capacity(report):
    from lenpred.studies.queue_render import markdown, pattern_markdown
    from lenpred.studies.queue_report import pattern_report

    # two slices of a trace stretched to 0.9x the capacity of their own sittings: 0.2979 and 0.2007 req/s
    runs = {}
    for d, rate, n in ((0, 0.2979, 4), (1, 0.2007, 3)):
        for mode, jcts in (("stock", [10.0, 20.0, 30.0, 40.0]), ("plugin", [5.0, 10.0, 15.0, 40.0])):
            run = _run(mode, "tracecodex0.9", jcts[:n])
            run["settings"] |= {"rate_req_s": rate}
            runs[f"{d}/{mode}/tracecodex0.9"] = run
    p = pattern_report({"runs": runs}, "tracecodex0.9", 2, 50)
    assert (p["rate_req_s_per_draw"], p["num_requests_per_draw"]) == ([0.2979, 0.2007], [4, 3])
    assert pattern_markdown("tracecodex0.9", p)[0] == (
        "## tracecodex0.9 (3–4 requests per draw, a trace slice's arrivals at 0.9× the capacity measured in each "
        "draw's own sitting: draw 0 0.2979, draw 1 0.2007 req/s; draws [0, 1])")
    # one rate (to the 4 decimals printed): one figure; and the store's capacity line says whose it is
    one = p | {"rate_req_s_per_draw": [0.29791, 0.29788]}
    assert pattern_markdown("tracecodex0.9", one)[0].endswith("a trace slice's arrivals at 0.298 req/s; draws [0, 1])")
    mixed = report | {"patterns": {"tracecodex0.9": p}}
    assert "(given (--capacity-req-s); the latest sitting's: the draws of a pattern below ran at their own" in (
        markdown(mixed))
    assert "the latest sitting's" not in markdown(report | {"patterns": {"tracecodex0.9": one}})
    assert report["patterns"]["burst4"]["rate_req_s_per_draw"] == [None, None]


def test_a_runs_window_in_its_log_is_the_block_matching_its_send_times(tmp_path: Path):
    """``run_window``: in a log holding 2 warm-up requests, a 4-request speed probe and two patterns' runs (3 requests
    each), each run is the block of arrivals whose spacing matches its send times; a log without such a block is
    refused, and ``add_whatif`` then leaves that run without a row instead of failing the report."""
    import numpy as np

    from lenpred.errors import LenpredError
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord
    from lenpred.studies.queue_report import add_whatif, run_window

    def log(name, arrivals):  # recorded in finish order, each done 0.5 s after it arrives (the writer's order)
        with TrafficLogWriter(TrafficLogConfig(tmp_path / name)) as w:
            for a in arrivals[::-1]:
                w.record(TrafficRecord(features=np.zeros(2), expected=5.0, num_output_tokens=5, finish_reason="stop",
                                       arrival_time_s=a, first_token_time_s=a, finish_time_s=a + 0.5,
                                       num_prompt_tokens=9))
        return tmp_path / name

    run = lambda *sent: {"results": [{"sent_s": x} for x in sent]}  # noqa: E731
    path = log("two", [10.0, 10.0, 12.0, 12.0, 12.0, 12.0, 20.0, 20.6, 22.0, 40.0, 45.0, 46.2])
    assert run_window(path, run(0.0, 0.5, 2.1)) == (20.0, 22.0)  # the run at 20 s (strays 0.1 s)
    assert run_window(path, run(0.01, 5.0, 6.0)) == (40.0, 46.2)  # the second pattern's, at 40 s
    with pytest.raises(LenpredError, match="no 3 consecutive arrivals match the run's send times within 1 s"):
        run_window(path, run(0.0, 9.0, 30.0))
    with pytest.raises(LenpredError, match="holds 12 requests, fewer than the run's 13"):
        run_window(path, run(*range(13)))
    store = {"runs": {"0/stock/burst8": {"results": [{"jct_s": 1.0, "outcome": "ok"}]},
                      "0/plugin/burst8": run(0.0, 9.0, 30.0) | {"settings": {"traffic_log": str(path)}}}}
    rep = {"regime": {"decode_bound": 4}, "patterns": {"burst8": {}}}
    add_whatif(rep, store, tmp_path / "out", "unused.json", 200)  # the run's log does not match it: no row
    assert "whatif" not in rep["patterns"]["burst8"]


def test_the_report_stores_each_runs_own_pace_and_stocks_elasticity(tmp_path: Path):
    """``report`` with the simulator on one trace slice (one decode slot, a 40-token request at t = 0 and 11 of 4
    tokens every 2 s, the unit cost saved as the cost model) whose stock run took the simulated mean JCT at 1.2x the
    unit cost and the plug-in's at 0.9x: each run's stored pace is its own (1.2 and 0.9, to the fit's 0.001), stock's
    elasticity is :func:`pace_elasticity` at 1.2 (> 1: the shorts queue), and the report renders both."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_render import pattern_markdown
    from lenpred.studies.queue_report import pace_elasticity, report, simulated_mean_jct

    unit = CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=True)
    unit.save(tmp_path / "cost.json")
    regime = {"decode_bound": 1, "kv_cache_bytes": 46080 * 4096, "kv_bytes_per_token": 46080,
              "kv_floor_applied": False, "kv_dtype": "float32", "max_model_len": 2422, "plugin": PLUGIN,
              "capacity": {"capacity_req_s": 0.2, "how": "given (--capacity-req-s)", "cost_model": None}}
    runs = {}
    for mode, pace in (("stock", 1.2), ("plugin", 0.9)):
        rec = _one_slot_run(mode, [1.0] * 12)
        target = simulated_mean_jct(rec, regime, unit.with_pace(pace), seed=100)
        for r in rec["results"]:
            r["jct_s"] = target
        runs[f"0/{mode}/tracecodex1.1"] = rec
    rep = report({"config": {"seed": 100, "max_tokens": None}, "regime": regime, "runs": runs}, n_resamples=50,
                 sim_cost_model=str(tmp_path / "cost.json"))
    p = rep["patterns"]["tracecodex1.1"]
    assert p["stock_pace_scale"]["0"] == pytest.approx(1.2, abs=2e-3)
    assert p["modes"]["plugin"]["pace_scale_per_draw"]["0"] == pytest.approx(0.9, abs=2e-3)
    want = pace_elasticity(runs["0/stock/tracecodex1.1"], regime, unit, 100, p["stock_pace_scale"]["0"])
    assert p["stock_pace_elasticity"]["0"] == pytest.approx(want) and want > 1.0
    md = "\n".join(pattern_markdown("tracecodex1.1", p))
    assert f"draw 0 ({want:.1f})" in md and "| plugin | 0.900 |" in md
