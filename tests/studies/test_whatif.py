"""lenpred whatif: the replay of a traffic log through the simulator, hand-worked, and end to end on a real log."""

import json

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.online.traffic_log import read_engine_settings
from lenpred.serving.cost_model import CostModel
from lenpred.studies.whatif import (TERMS, LoggedTraffic, WhatifConfig, busy_counts, compare_modes, cost_from_log,
                                    fit_replay_pace, observed_bound, replay, replay_order, replayed_served_order,
                                    run_whatif, verdict, workload)

UNIT = CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=True)


def traffic(arrival, first, finish, prompt, output, expected) -> LoggedTraffic:
    f = lambda x, t=np.float64: np.asarray(x, dtype=t)  # noqa: E731
    return LoggedTraffic(f(arrival), f(first), f(finish), f(prompt, np.int64), f(output, np.int64), f(expected))


def test_busy_counts_and_the_observed_bound():
    # generating intervals [1, 4), [2, 3), [2.5, 6): at 2.5 all three, at 4 only the last
    t = traffic([0, 0, 0], [1, 2, 2.5], [4, 3, 6], [5, 5, 5], [3, 3, 3], [1, 1, 1])
    assert busy_counts(t.first_token_s, t.finish_s, np.array([0.5, 2.5, 3.0, 4.0, 6.0])).tolist() == [0, 3, 2, 1, 0]
    assert observed_bound(t) == 3


def test_replay_hand_worked_three_requests_one_slot():
    # three requests at t = 0, one slot, every forward 1 s. Outputs 4, 1, 2 tokens; prompts 10, 30, 20; served
    # predictions 5, 1, 3. Stock FCFS: r0 ends at 4, r1 at 5, r2 at 7. Prompt-length priority: r0 4, r2 6, r1 7.
    # lenpred (window 1, shortest prompt first): r0 and r2 prefilled at 1; SRPT on the served 5 - 1 vs 3 - 1: r2
    # decodes, ends at 2; r1 is prefilled beside r0's decode (3, its one token); r0 ends at 5. The recorded length
    # orders alike.
    t = traffic([0, 0, 0], [0, 0, 0], [1, 1, 1], [10, 30, 20], [4, 1, 2], [5, 1, 3])
    jct = replay(workload(t), UNIT, 1)
    assert {m: x.tolist() for m, x in jct.items()} == {
        "stock FCFS": [4, 5, 7], "prompt-length priority": [4, 7, 6], "lenpred": [5, 3, 2], "recorded length": [5, 3, 2]}
    cells = compare_modes(jct, clusters=3, n_resamples=200)
    assert cells["lenpred"]["jct_cut_vs_stock"][0] == pytest.approx(1 - 10 / 16)  # mean 10/3 s against 16/3 s
    assert cells["prompt-length priority"]["jct_cut_vs_stock"][0] == pytest.approx(1 - 17 / 16)
    said = verdict(cells, 1)  # 3 requests: the interval over three one-request blocks reaches below 2 %
    assert said.startswith("Leave it off for now: at D = 1 lenpred cuts mean JCT by +37.5%")
    assert said.endswith("there is a queue to reorder (the recorded length gains +37.5%), but lenpred's interval is "
                         f"too wide to promise 2%: log more traffic and ask again. Its p99 is "
                         f"{cells['lenpred']['p99_ratio_vs_stock'][0]:.2f}x [{cells['lenpred']['p99_ratio_vs_stock'][1]:.2f}, "
                         f"{cells['lenpred']['p99_ratio_vs_stock'][2]:.2f}] stock's.")


def test_verdict_names_the_regime():
    cell = lambda cut, p99: {"jct_cut_vs_stock": cut, "p99_ratio_vs_stock": (p99, p99, p99)}  # noqa: E731
    oracle, free = cell((0.2, 0.1, 0.3), 1.0), cell((0.03, -0.01, 0.07), 1.0)
    assert verdict({"lenpred": cell((0.12, 0.05, 0.2), 1.02), "recorded length": oracle,
                    "prompt-length priority": free}, 16).startswith(
        "Turn it on: at D = 16 lenpred cuts mean JCT by +12.0% [+5.0%, +20.0%] with p99 1.02x stock's "
        "(prompt-length priority, free, +3.0%)")
    assert "only if the tail may grow" in verdict({"lenpred": cell((0.12, 0.05, 0.2), 1.3), "recorded length": oracle,
                                                   "prompt-length priority": free}, 16)
    below = verdict({"lenpred": cell((-0.021, -0.036, -0.011), 1.0), "recorded length": oracle,
                     "prompt-length priority": free}, 16)  # a tight interval below 2 %: more traffic will not help
    assert below == ("Leave it off: at D = 16 lenpred cuts mean JCT by -2.1% [-3.6%, -1.1%], reliably under 2% where "
                     "the recorded length gains +20.0%; logging more traffic will not change that at this bound. Its p99 is 1.00x "
                     "[1.00, 1.00] stock's.")
    off = verdict({"lenpred": cell((0.01, -0.02, 0.04), 1.0), "recorded length": cell((0.015, 0, 0.03), 1.0),
                   "prompt-length priority": free}, 8)
    assert off.startswith("Leave it off for now") and "even the recorded length gains +1.5%: requests rarely wait" in off


def test_cost_from_log_recovers_a_simulated_engines_decode_step():
    # a log made by the simulator itself at d0 = 0.05 s, d1 = 0.01 s per sequence (no prefill cost to confound):
    # the fit reads the decode step back from per-request times per token and the concurrency beside them
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import SimConfig, simulate

    truth = CostModel("truth", {"p0": 0.0, "p1": 0.0, "p2": 0.0, "d0": 0.05, "d1": 0.01, "d2": 0.0},
                      fused_prefill=True)
    rng = np.random.default_rng(0)
    n = 200
    t = traffic(np.sort(rng.uniform(0, 1500, n)),  # load from idle to the bound: B varies
                np.zeros(n), np.zeros(n), rng.integers(10, 50, n),
                rng.integers(2, 200, n), np.ones(n))
    _, timings = simulate(workload(t), make_policy("fcfs"), truth, SimConfig(max_num_seqs=8, arrival="given"))
    t.first_token_s = np.array([x.first_token_time_s for x in timings])
    t.finish_s = np.array([x.finish_time_s for x in timings])
    fitted = cost_from_log(t).coefficients
    assert fitted["d0"] == pytest.approx(0.05, rel=0.05) and fitted["d1"] == pytest.approx(0.01, rel=0.05)


def test_run_whatif_on_a_written_traffic_log(tmp_path):
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord

    rng = np.random.default_rng(1)
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "log")) as w:
        for i in range(40):  # a burst of 40 requests, served 4 at a time by a 0.1 s/step engine
            n = int(rng.integers(5, 300))
            first = 0.5 + (i // 4) * 3.0
            w.record(TrafficRecord(features=np.zeros(4), expected=float(n * rng.uniform(0.5, 1.5)), low=0, high=1,
                                   num_output_tokens=n, finish_reason="stop", arrival_time_s=1000.0,
                                   first_token_time_s=1000.0 + first, finish_time_s=1000.0 + first + 0.1 * n,
                                   num_prompt_tokens=int(rng.integers(10, 100))))
    cost = tmp_path / "cost.json"
    UNIT.save(cost)
    report = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), cost_model=str(cost), decode_slots=(4, 8),
                                     out=str(tmp_path / "out"), clusters=4, bootstrap_resamples=200))
    assert report["num_requests"] == 40 and report["cost_source"].startswith("the calibration file")
    # no engine settings beside the log say its bound (its rows show 23 generating at once, parked ones included if
    # a policy served it): the first bound given stands in for it, and the verdict speaks of it
    assert (report["observed_bound"], report["bound_given"], list(report["results"])) == (4, True, ["4", "8"])
    assert report["bound_source"] == ("the first of --decode-slots: the log does not say its own (no engine settings "
                                      "beside it; its rows show up to 23 generating at once, parked requests included "
                                      "if a scheduling policy served it)")
    saved = json.loads((tmp_path / "out" / "whatif.json").read_text())
    assert saved["verdict"] == report["verdict"] and (tmp_path / "out" / "whatif.png").stat().st_size > 0
    md = (tmp_path / "out" / "whatif.md").read_text()
    assert "## D = 4" in md and md.rstrip().endswith(TERMS) and f"\n{report['verdict']}\n\n{TERMS}" in md
    assert "- The verdict (below): speaks of D = 4, the first bound given (the log's own is unknown)." in md
    # a burst of 40 behind 4 slots queues: the recorded length gains; at 23 slots of 40 the sentence is a decision
    assert report["results"]["4"]["recorded length"]["jct_cut_vs_stock"][0] > 0
    assert "Every order gives stock's mean JCT at D = 4" not in md  # requests wait there: no note under its table
    assert report["verdict"].split(":")[0].lower() == report["verdict_kind"] != "no verdict"
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "small")) as w:
        for i in range(5):
            w.record(TrafficRecord(features=np.zeros(4), expected=1.0, low=0, high=1, num_output_tokens=3,
                                   finish_reason="stop", arrival_time_s=1.0, first_token_time_s=2.0,
                                   finish_time_s=3.0, num_prompt_tokens=10))
    with pytest.raises(LenpredError, match="holds 5 requests; a replay needs at least 20: log longer"):
        LoggedTraffic.read(tmp_path / "small")


def test_the_whatif_command_prints_the_tables_and_the_verdict(tmp_path):
    from typer.testing import CliRunner

    from lenpred.cli import app
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord

    with TrafficLogWriter(TrafficLogConfig(tmp_path / "log")) as w:
        for i in range(24):  # one request every 2 s, each 20 tokens at 0.05 s/token: nothing ever waits
            w.record(TrafficRecord(features=np.zeros(4), expected=20.0, low=0, high=1, num_output_tokens=20,
                                   finish_reason="stop", arrival_time_s=2.0 * i, first_token_time_s=2.0 * i + 0.1,
                                   finish_time_s=2.0 * i + 0.1 + 19 * 0.05, num_prompt_tokens=30 + i))
    result = CliRunner().invoke(app, ["whatif", "--traffic", str(tmp_path / "log"), "--out", str(tmp_path / "out"),
                                      "--bootstrap-resamples", "100", "--clusters", "4"])
    assert result.exit_code == 0, result.output
    assert "the log's own timings (cost_from_log)" in result.output  # no calibration file given: says so
    assert "## D = 1" in result.output and "## D = 2" in result.output  # its own bound (1), and double
    assert "Leave it off for now" in result.output and "requests rarely wait" in result.output  # nothing queues


def test_logs_and_cost_models_that_cannot_time_a_replay_are_refused(tmp_path):
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord

    with TrafficLogWriter(TrafficLogConfig(tmp_path / "unstreamed")) as w:
        for i in range(24):  # a non-streaming proxy: the first body chunk is the whole answer, at the finish
            w.record(TrafficRecord(features=np.zeros(4), expected=20.0, low=0, high=1, num_output_tokens=20,
                                   finish_reason="stop", arrival_time_s=2.0 * i, first_token_time_s=2.0 * i + 1.5,
                                   finish_time_s=2.0 * i + 1.5, num_prompt_tokens=30))
    log = str(tmp_path / "unstreamed")
    with pytest.raises(LenpredError, match="non-streamed responses.*pass a measured --cost-model and --decode-slots"):
        run_whatif(WhatifConfig(traffic=log, out=str(tmp_path / "o"), bootstrap_resamples=100))
    zero = tmp_path / "zero.json"
    CostModel("zero", {k: 0.0 for k in UNIT.coefficients}).save(zero)
    with pytest.raises(LenpredError, match="decode step of 0 s"):
        run_whatif(WhatifConfig(traffic=log, cost_model=str(zero), decode_slots=(4,), out=str(tmp_path / "o")))
    cost = tmp_path / "unit.json"
    UNIT.save(cost)
    with pytest.raises(LenpredError, match="pass --decode-slots"):
        run_whatif(WhatifConfig(traffic=log, cost_model=str(cost), out=str(tmp_path / "o")))
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "headless", metadata={"head": "none"})) as w:
        for i in range(24):  # captured with no head (lenpred.online.capture): no prediction to replay
            w.record(TrafficRecord(features=np.zeros(4), num_output_tokens=20, finish_reason="stop",
                                   arrival_time_s=2.0 * i, first_token_time_s=2.0 * i + 0.5,
                                   finish_time_s=2.0 * i + 1.5, num_prompt_tokens=30))
    with pytest.raises(LenpredError, match="captured with no head.*train a head on it"):
        run_whatif(WhatifConfig(traffic=str(tmp_path / "headless"), out=str(tmp_path / "o")))
    for coefficients, msg in (({**UNIT.coefficients, "d1": "0.004"}, "coefficients d1 are not finite numbers"),
                              ({**UNIT.coefficients, "d1": float("nan")}, "coefficients d1 are not finite numbers"),
                              ({k: v for k, v in UNIT.coefficients.items() if k != "d1"}, "coefficients lack d1")):
        (tmp_path / "bad.json").write_text(json.dumps({"engine": "x", "coefficients": coefficients}))
        with pytest.raises(LenpredError, match=msg):
            CostModel.load(tmp_path / "bad.json")
    with pytest.raises(LenpredError, match="cost model .*nowhere.json does not exist"):
        CostModel.load(tmp_path / "nowhere.json")
    streamed_log = tmp_path / "streamed"
    with TrafficLogWriter(TrafficLogConfig(streamed_log)) as w:
        for i in range(24):
            w.record(TrafficRecord(features=np.zeros(4), expected=20.0, low=0, high=1, num_output_tokens=20,
                                   finish_reason="stop", arrival_time_s=2.0 * i, first_token_time_s=2.0 * i + 0.5,
                                   finish_time_s=2.0 * i + 1.5, num_prompt_tokens=30))
    with pytest.raises(LenpredError, match="--clusters 13 is more than half the log's 24 requests"):
        run_whatif(WhatifConfig(traffic=str(streamed_log), cost_model=str(cost), out=str(tmp_path / "o"), clusters=13))
    from lenpred.online.traffic_log import write_engine_settings
    for bad in ({"decode_slots": 0}, {"max_num_seqs": -4}, {"prefill_ahead": -1}):
        write_engine_settings(streamed_log, {"policy": "srpt", "decode_slots": 2, "prefill_ahead": 2,
                                             "max_num_seqs": 4, **bad})
        with pytest.raises(LenpredError, match="engine.json is not the engine settings .* integers >= 1"):
            run_whatif(WhatifConfig(traffic=str(streamed_log), cost_model=str(cost), out=str(tmp_path / "o")))
    (tmp_path / "file").write_text("")
    for bad, msg in (({"out": str(tmp_path / "file")}, "is a file: give a directory"),
                     ({"bootstrap_resamples": 0}, "must be >= 100"), ({"decode_slots": (0,)}, "got '0'")):
        with pytest.raises(LenpredError, match=msg):
            WhatifConfig(traffic=log, **bad)


def test_the_bound_comes_from_the_engine_settings_beside_the_log(tmp_path):
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord, write_engine_settings
    from lenpred.studies.whatif import served_bound

    with TrafficLogWriter(TrafficLogConfig(tmp_path / "log")) as w:
        for i in range(24):  # 3 at a time generating in the rows: parked requests look like running ones
            w.record(TrafficRecord(features=np.zeros(4), expected=20.0, low=0, high=1, num_output_tokens=20,
                                   finish_reason="stop", arrival_time_s=float(i // 3), first_token_time_s=i // 3 + 0.1,
                                   finish_time_s=i // 3 + 0.9, num_prompt_tokens=30))
    traffic = LoggedTraffic.read(tmp_path / "log")
    rows = (3, "the most requests the log shows generating at once", False)
    bound, source, parked = served_bound(read_engine_settings(tmp_path / "log"), traffic)  # no settings: maybe parked, so it says so
    assert (bound, parked) == (3, False) and source.startswith(rows[1]) and source.endswith("pass --decode-slots")
    write_engine_settings(tmp_path / "log", {"policy": "srpt", "decode_slots": 2, "prefill_ahead": 2,
                                             "max_num_seqs": 4})
    bound, source, parked = served_bound(read_engine_settings(tmp_path / "log"), traffic)
    assert (bound, parked) == (2, True) and "decode_slots under policy srpt" in source
    report = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "o"), clusters=4,
                                     bootstrap_resamples=100, fit_pace=False))
    assert report["observed_bound"] == 2 and list(report["results"]) == ["1", "2", "4"]
    assert "approximate: the log was served with parked decoding" in report["cost_source"]
    # its fidelity is read against the order it was served in: the replayed lenpred, not stock FCFS
    assert report["served_order"] == "lenpred"
    assert (report["pace_scale"], report["pace_source"]) == (None, "not fitted (--no-fit-pace)")
    text = (tmp_path / "o" / "whatif.md").read_text()  # the served order replayed beside the log's own mean JCT
    assert f"against {report['replayed_served_mean_jct_s']:.1f} s for the replayed lenpred at that D" in text
    # the cost fitted to this tiny log does not time it: no verdict, and the numbers that say why
    ratio = report["replayed_served_mean_jct_s"] / report["logged_mean_jct_s"]
    assert (ratio > 1.25 or ratio < 0.8) and report["verdict"].startswith("No verdict: the replayed lenpred at D = 2")
    one = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "o1"), decode_slots=(2,),
                                  clusters=4, bootstrap_resamples=100, fit_pace=False))  # the served bound still read
    assert (one["observed_bound"], one["served_order"], list(one["results"])) == (2, "lenpred", ["2"])
    other = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "o4"), decode_slots=(4,),
                                    clusters=4, bootstrap_resamples=100, fit_pace=False))  # not replayed: say so
    assert list(other["results"]) == ["2", "4"]  # the log's own bound, 2, is always replayed beside those asked
    assert other["verdict"].startswith("No verdict") and ("- The verdict (below): none: the served order replayed at "
                                                          "D = 2, the log's own bound, does not match the log.") in (
        tmp_path / "o4" / "whatif.md").read_text()
    assert other["replayed_served_mean_jct_s"] == pytest.approx(one["replayed_served_mean_jct_s"])
    # under observe nothing is parked: the rows show what ran together (a max_num_seqs of 256 would queue nothing)
    write_engine_settings(tmp_path / "log", {"policy": "observe", "decode_slots": 2, "prefill_ahead": 2,
                                             "max_num_seqs": 256})
    assert served_bound(read_engine_settings(tmp_path / "log"), traffic) == rows
    (tmp_path / "log" / "engine.json").write_text('{"policy": "srpt", "decode_slots": null}')
    with pytest.raises(LenpredError, match="engine.json is not the engine settings lenpred writes"):
        served_bound(read_engine_settings(tmp_path / "log"), traffic)
    given = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "o"), decode_slots=(2,),
                                    aging_tokens_per_s=0.0, max_wait_s=float("inf"), clusters=4,
                                    bootstrap_resamples=100))
    assert list(given["results"]) == ["2"]  # every setting given (inf: no age threshold): the file is not read
    # the unreadable file's bound and order: the given bound, the order unknown (no fidelity claimed)
    assert (given["observed_bound"], given["served_order"]) == (2, "unknown")
    assert "the order it was served in is unknown" in (tmp_path / "o" / "whatif.md").read_text()
    text = (tmp_path / "o" / "whatif.md").read_text()  # the guard turned off by --max-wait-s inf is named as off
    assert given["max_wait_s"] is None and "the age threshold at" not in text
    assert ("- lenpred's starvation guards: none (no aging (--aging-tokens-per-s 0); no age threshold (--max-wait-s "
            "inf); --max-wait-s S or --aging-tokens-per-s R sets one)." in text)
    # the bound is the one given: the log's own is unknown (its engine settings are unreadable)
    assert "- The verdict (below): speaks of D = 2, the first bound given (the log's own is unknown)." in text
    with pytest.raises(LenpredError, match="engine.json is not the engine settings"):  # the guard still reads it
        run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "o"), decode_slots=(2,),
                                clusters=4, bootstrap_resamples=100))


def test_the_lenpred_order_runs_with_the_engines_starvation_guard(tmp_path):
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord, write_engine_settings
    from lenpred.studies.whatif import served_guard

    # one slot, a 40-token request at t = 0 and 4-token ones every 2 s: unguarded each short one overtakes the long
    # one; aged by its wait, the long one keeps its slot and the short ones wait (lenpred's mean JCT rises); the
    # recorded length (an oracle, unguarded) and the prediction-free orders do not change
    t = traffic(2.0 * np.arange(12), 2.0 * np.arange(12), 2.0 * np.arange(12) + 1, [10] * 12, [40] + [4] * 11,
                [40.0] + [4.0] * 11)
    runs = {a: replay(workload(t), UNIT, 1, a) for a in (0.0, 1.0, 4.0)}
    assert runs[0.0]["lenpred"].mean() < runs[1.0]["lenpred"].mean() < runs[4.0]["lenpred"].mean()
    for mode in ("stock FCFS", "prompt-length priority", "recorded length"):
        assert runs[4.0][mode].tolist() == runs[0.0][mode].tolist()
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "log")) as w:
        for i in range(24):
            w.record(TrafficRecord(features=np.zeros(4), expected=20.0, low=0, high=1, num_output_tokens=20,
                                   finish_reason="stop", arrival_time_s=float(i), first_token_time_s=i + 0.1,
                                   finish_time_s=i + 0.9, num_prompt_tokens=30))
    assert served_guard(read_engine_settings(tmp_path / "log"), None) == (0.0, "none")  # no engine settings: no guard
    write_engine_settings(tmp_path / "log", {"policy": "srpt", "decode_slots": 2, "prefill_ahead": 2,
                                             "max_num_seqs": 4, "aging_tokens_per_s": 4.0})
    assert served_guard(read_engine_settings(tmp_path / "log"), None) == (4.0, "the plug-in's own (engine.json)")
    assert served_guard(read_engine_settings(tmp_path / "log"), 1.0) == (1.0, "--aging-tokens-per-s")
    report = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "o"), decode_slots=(2,),
                                     clusters=4, bootstrap_resamples=100))
    assert report["aging_tokens_per_s"] == 4.0
    assert "guards: aging at 4 tokens/s (the plug-in's own (engine.json))." in (tmp_path / "o" / "whatif.md").read_text()
    # a guard on beside one a flag turned off: both named
    run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "o2"), decode_slots=(2,),
                            max_wait_s=float("inf"), clusters=4, bootstrap_resamples=100))
    assert ("guards: aging at 4 tokens/s (the plug-in's own (engine.json)); no age threshold (--max-wait-s inf)."
            in (tmp_path / "o2" / "whatif.md").read_text())
    with pytest.raises(LenpredError, match="--aging-tokens-per-s must be >= 0"):
        WhatifConfig(traffic="x", aging_tokens_per_s=-1.0)


def test_the_lenpred_order_runs_with_the_engines_age_threshold(tmp_path):
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord, write_engine_settings
    from lenpred.studies.whatif import served_guard

    # one slot, 1 s per step, a 40-token request at t = 0 and 4-token ones every 2 s. Unguarded every short one
    # overtakes the long one (done at 73 s). With a 10 s threshold only the two that came before it fell overdue
    # (at 2 s and 4 s: 4 s and 6 s each) do; from t = 10 s it decodes to the end (46 s), then the rest, overdue by
    # then, in arrival order (the one that arrived at 6 s done at 49 s, 43 s after its arrival, ...)
    t = traffic(2.0 * np.arange(12), 2.0 * np.arange(12), 2.0 * np.arange(12) + 1, [10] * 12, [40] + [4] * 11,
                [40.0] + [4.0] * 11)
    unguarded = replay(workload(t), UNIT, 1)["lenpred"]
    assert unguarded.tolist() == [73.0] + [4.0 + 2 * k for k in range(11)]
    assert replay(workload(t), UNIT, 1, max_wait_s=10.0)["lenpred"].tolist() == [46.0, 4.0, 6.0] + [
        43.0 + k for k in range(9)]
    assert replay(workload(t), UNIT, 1, max_wait_s=1e9)["lenpred"].tolist() == unguarded.tolist()
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "log")) as w:
        for i in range(24):
            w.record(TrafficRecord(features=np.zeros(4), expected=20.0, low=0, high=1, num_output_tokens=20,
                                   finish_reason="stop", arrival_time_s=float(i), first_token_time_s=i + 0.1,
                                   finish_time_s=i + 0.9, num_prompt_tokens=30))
    assert served_guard(read_engine_settings(tmp_path / "log"), None, "max_wait_s") == (None, "none")
    write_engine_settings(tmp_path / "log", {"policy": "srpt", "decode_slots": 2, "prefill_ahead": 2,
                                             "max_num_seqs": 4, "aging_tokens_per_s": 0.0, "max_wait_s": 10.0})
    assert served_guard(read_engine_settings(tmp_path / "log"), None, "max_wait_s") == (10.0, "the plug-in's own (engine.json)")
    assert served_guard(read_engine_settings(tmp_path / "log"), 30.0, "max_wait_s") == (30.0, "--max-wait-s")
    report = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "o"), decode_slots=(2,),
                                     clusters=4, bootstrap_resamples=100))
    assert (report["max_wait_s"], report["aging_tokens_per_s"]) == (10.0, 0.0)
    text = (tmp_path / "o" / "whatif.md").read_text()
    assert "age threshold at 10 s (the plug-in's own (engine.json))" in text and "starvation guard at" not in text
    with pytest.raises(LenpredError, match="--max-wait-s must be >= 0 seconds .inf: no age threshold."):
        WhatifConfig(traffic=str(tmp_path / "log"), max_wait_s=-1.0)
    # a threshold beyond any wait is off, in every form (no overflow in the simulator's step count)
    assert replay(workload(t), UNIT, 1, max_wait_s=float("inf"))["lenpred"].tolist() == unguarded.tolist()
    assert replay(workload(t), UNIT, 1, max_wait_s=1e308)["lenpred"].tolist() == unguarded.tolist()
    off = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "off"), decode_slots=(2,),
                                  max_wait_s=float("inf"), clusters=4, bootstrap_resamples=100))
    assert off["max_wait_s"] is None and json.loads((tmp_path / "off" / "whatif.json").read_text(),
                                                    parse_constant=lambda c: 1 / 0)["settings"]["max_wait_s"] == "inf"
    for bad in ("abc", -5, [200], True):  # a hand-edited engine.json is refused, naming the file and the fix
        write_engine_settings(tmp_path / "log", {"policy": "srpt", "decode_slots": 2, "prefill_ahead": 2,
                                                 "max_num_seqs": 4, "max_wait_s": bad})
        with pytest.raises(LenpredError, match=r"the engine.json beside the log holds max_wait_s = .*pass --max-wait-s"):
            served_guard(read_engine_settings(tmp_path / "log"), None, "max_wait_s")


def paced_log(tmp_path, name: str, max_wait_s=None, pace: float = 1.25, streamed: bool = True):
    """A log served by the plug-in's design at D = 2 (with the age threshold ``max_wait_s``) on an engine ``pace``
    times slower than :data:`UNIT` says: its rows, written to ``tmp_path / name``, and its traffic."""
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord

    rng = np.random.default_rng(3)
    n = 60
    arrival = np.sort(rng.uniform(0, 900, n))  # queues now and then at D = 2: the pace moves the mean JCT
    output, prompt = rng.integers(2, 40, n), rng.integers(5, 60, n)
    t = traffic(arrival, arrival, arrival, prompt, output, output * rng.uniform(0.5, 1.5, n))
    served = replay_order(workload(t), UNIT.with_pace(pace), 2, "lenpred", max_wait_s=max_wait_s)
    with TrafficLogWriter(TrafficLogConfig(tmp_path / name)) as w:
        for i in range(n):  # first tokens half-way (streamed) or at the finish (not)
            finish = float(arrival[i] + served[i])
            w.record(TrafficRecord(features=np.zeros(4), expected=float(t.expected[i]), low=0, high=1,
                                   num_output_tokens=int(output[i]), finish_reason="stop",
                                   arrival_time_s=float(arrival[i]),
                                   first_token_time_s=float(arrival[i] + served[i] / 2) if streamed else finish,
                                   finish_time_s=finish, num_prompt_tokens=int(prompt[i])))
    return str(tmp_path / name), t


def test_the_replay_is_fitted_to_the_pace_the_log_was_served_at(tmp_path):
    # a log served by the plug-in's design on an engine 1.25x slower than the cost model says (every step x1.25):
    # the replay of that order at the log's bound, on the cost model scaled by the fitted pace, takes the log's mean
    # JCT, and the pace comes back as 1.25; the counterfactual orders are then replayed at that pace
    from lenpred.online.traffic_log import write_engine_settings
    from lenpred.serving.cost_model import fit_pace

    log, t = paced_log(tmp_path, "log")
    served = replay_order(workload(t), UNIT.with_pace(1.25), 2, "lenpred")
    stock = replay_order(workload(t), UNIT.with_pace(1.25), 2, "stock FCFS")
    assert fit_replay_pace(workload(t), UNIT, 2, "lenpred", float(served.mean())) == pytest.approx(1.25, abs=0.01)
    assert fit_replay_pace(workload(t), UNIT, 2, "stock FCFS", float(stock.mean())) == pytest.approx(1.25, abs=0.01)
    # a mean JCT no pace in [0.5, 2] gives (shorter than the fastest replay can be), or none at all: no scale
    assert fit_replay_pace(workload(t), UNIT, 2, "lenpred", 0.1) is None
    assert fit_pace(UNIT, lambda c: 1.0, 0.0) is None
    with pytest.raises(LenpredError, match="unknown order 'srpt'"):
        replay_order(workload(t), UNIT, 2, "srpt")
    cost = tmp_path / "cost.json"
    UNIT.save(cost)
    traffic_ = LoggedTraffic.read(log)
    assert replayed_served_order(read_engine_settings(log), traffic_)[0] is None  # no engine settings: the order is not known
    unfitted = run_whatif(WhatifConfig(traffic=log, cost_model=str(cost), decode_slots=(2,), out=str(tmp_path / "a"),
                                       clusters=4, bootstrap_resamples=100))
    assert unfitted["pace_scale"] is None and "not fitted: no engine.json" in unfitted["pace_source"]
    assert unfitted["served_order"] == "unknown"
    text = (tmp_path / "a" / "whatif.md").read_text()  # the reason once, in the fidelity note
    assert "the order it was served in is unknown: no engine.json" in text and text.count("no engine.json") == 1
    assert "(pace not fitted: the order it was served in is unknown)" in text
    write_engine_settings(log, {"policy": "srpt", "decode_slots": 2, "prefill_ahead": 2, "max_num_seqs": 4})
    assert replayed_served_order(read_engine_settings(log), traffic_) == ("lenpred", "the plug-in's design (engine.json)")
    report = run_whatif(WhatifConfig(traffic=log, cost_model=str(cost), out=str(tmp_path / "b"), clusters=4,
                                     bootstrap_resamples=100))
    assert report["pace_scale"] == pytest.approx(1.25, abs=0.01)
    assert report["results"]["2"]["lenpred"]["mean_jct_s"] == pytest.approx(served.mean(), rel=0.01)
    assert report["results"]["2"]["stock FCFS"]["mean_jct_s"] == pytest.approx(stock.mean(), rel=0.01)
    assert report["cost_coefficients"]["d0"] == pytest.approx(report["pace_scale"])  # the scaled cost is stored
    text = (tmp_path / "b" / "whatif.md").read_text()
    assert (f"its step times x{report['pace_scale']:.3f} (the engine ran slower than the cost model by that factor), "
            "fitted so that the replayed lenpred at D = 2 takes the log's mean JCT") in text
    assert ("so that row of the D = 2 table matches the log by construction; every order is replayed at that pace, so "
            "a slowdown the served order itself caused the engine is not counted against it") in text
    assert "compare the replayed" not in text  # fitted to the served order: no separate fidelity claim
    # the bounds asked about leave out the served one: the pace is still fitted at the served bound
    four = run_whatif(WhatifConfig(traffic=log, cost_model=str(cost), decode_slots=(4,), out=str(tmp_path / "c"),
                                   clusters=4, bootstrap_resamples=100))
    assert list(four["results"]) == ["2", "4"] and four["pace_scale"] == pytest.approx(report["pace_scale"])
    assert ("- The verdict (below): speaks of D = 2, the log's own bound (replayed beside --decode-slots, which did not "
            "name it).") in (tmp_path / "c" / "whatif.md").read_text()
    two = run_whatif(WhatifConfig(traffic=log, cost_model=str(cost), decode_slots=(2, 4), out=str(tmp_path / "d"),
                                  clusters=4, bootstrap_resamples=100))  # asked: said plainly
    assert "- The verdict (below): speaks of D = 2, the log's own bound.\n" in (tmp_path / "d" / "whatif.md").read_text()
    for settings, why in (({"policy": "sjf"}, "policy sjf, decode_slots 2, prefill_ahead 2, max_num_seqs 4"),
                          ({"prefill_ahead": 8}, "policy srpt, decode_slots 2, prefill_ahead 8, max_num_seqs 4"),
                          ({"admit_by": "arrival"},
                           "policy srpt, decode_slots 2, prefill_ahead 2, max_num_seqs 4, admit_by arrival"),
                          ({"max_num_seqs": 1}, "policy srpt, decode_slots 2, prefill_ahead 2, max_num_seqs 1")):
        write_engine_settings(log, {"policy": "srpt", "decode_slots": 2, "prefill_ahead": 2, "max_num_seqs": 4,
                                    **settings})
        assert replayed_served_order(read_engine_settings(log), traffic_) == (None, f"{why} (engine.json) is not an order the replay has")
    # the header names the order as unknown, not as the one replayed
    other = run_whatif(WhatifConfig(traffic=log, cost_model=str(cost), decode_slots=(1,), out=str(tmp_path / "d"),
                                    clusters=4, bootstrap_resamples=100))
    assert other["pace_scale"] is None and other["served_order"] == "unknown"
    assert "compare the replayed lenpred" not in (tmp_path / "d" / "whatif.md").read_text()
    write_engine_settings(log, {"policy": "observe", "decode_slots": 2, "prefill_ahead": 2, "max_num_seqs": 4})
    assert replayed_served_order(read_engine_settings(log), traffic_) == ("stock FCFS", "policy observe (engine.json)")


def test_the_pace_is_fitted_with_the_guards_that_served_the_log(tmp_path):
    # served with a 10 s age threshold at pace 1.25; asked about no threshold (inf): the fit replays the order as it
    # was served (its 10 s), so the pace is still 1.25, and the lenpred row is the unguarded order at that pace. A fit
    # with the asked-about order would give about 1.28 (the unguarded order is faster on the mean)
    from lenpred.online.traffic_log import write_engine_settings

    log, t = paced_log(tmp_path, "log", max_wait_s=10.0)
    write_engine_settings(log, {"policy": "srpt", "decode_slots": 2, "prefill_ahead": 2, "max_num_seqs": 4,
                                "max_wait_s": 10.0})
    cost = tmp_path / "cost.json"
    UNIT.save(cost)
    report = run_whatif(WhatifConfig(traffic=log, cost_model=str(cost), decode_slots=(2,), max_wait_s=float("inf"),
                                     out=str(tmp_path / "o"), clusters=4, bootstrap_resamples=100))
    assert report["max_wait_s"] is None and report["pace_scale"] == pytest.approx(1.25, abs=0.01)
    unguarded = replay_order(workload(t), UNIT.with_pace(report["pace_scale"]), 2, "lenpred")
    assert report["results"]["2"]["lenpred"]["mean_jct_s"] == pytest.approx(unguarded.mean())
    # settings from an engine that did not record its guards: the fit takes the ones the replay is given
    write_engine_settings(log, {"policy": "srpt", "decode_slots": 2, "prefill_ahead": 2, "max_num_seqs": 4})
    given = run_whatif(WhatifConfig(traffic=log, cost_model=str(cost), decode_slots=(2,), max_wait_s=10.0,
                                    out=str(tmp_path / "g"), clusters=4, bootstrap_resamples=100))
    assert given["pace_scale"] == pytest.approx(1.25, abs=0.01)
    # policy observe with rows that were not streamed: the bound cannot be read from them, nothing is fitted
    flat, _ = paced_log(tmp_path, "flat", streamed=False)
    write_engine_settings(flat, {"policy": "observe", "decode_slots": 2, "prefill_ahead": 2, "max_num_seqs": 4})
    order, why = replayed_served_order(read_engine_settings(flat), LoggedTraffic.read(flat))
    assert order is None and why.startswith("its rows were not streamed")
    none = run_whatif(WhatifConfig(traffic=flat, cost_model=str(cost), decode_slots=(2,), out=str(tmp_path / "f"),
                                   clusters=4, bootstrap_resamples=100))
    assert none["pace_scale"] is None and "its rows were not streamed" in none["pace_source"]


def test_the_verdict_names_a_growing_tail_and_takes_the_threshold_it_is_given():
    from lenpred.studies.whatif import verdict_kind

    cell = lambda cut, p99: {"jct_cut_vs_stock": cut, "p99_ratio_vs_stock": p99}  # noqa: E731
    cells = {"lenpred": cell((0.03, -0.01, 0.07), (2.06, 1.27, 2.74)), "recorded length": cell((0.2, 0.1, 0.3), None),
             "prompt-length priority": cell((0.01, 0, 0.02), None)}
    said = verdict(cells, 8)  # off for now (-1 % < 2 %), and the tail's interval lies wholly above 1.1
    assert verdict_kind(cells) == "leave it off for now" and said.startswith("Leave it off for now")
    assert ", the interval's lower end under 2%;" in said
    assert said.endswith(" Its tail grows too: p99 2.06x [1.27, 2.74] stock's; an age threshold (--max-wait-s S) "
                         "bounds the wait of the longest requests.")
    cells["lenpred"]["p99_ratio_vs_stock"] = (1.5, 1.05, 2.0)  # the interval reaches 1.1: nothing said of the tail
    assert "tail" not in verdict(cells, 8)
    # a lower threshold turns it on: -2 % is the interval's lower end, the tail 1.5x
    cells["lenpred"]["jct_cut_vs_stock"] = (0.03, -0.02, 0.07)
    assert verdict_kind(cells, worth_it=-0.0) == "leave it off for now"
    cells["lenpred"]["jct_cut_vs_stock"] = (0.03, 0.005, 0.07)
    assert verdict_kind(cells) == "leave it off for now"
    assert verdict_kind(cells, worth_it=0.005) == "turn it on only if the tail may grow"
    assert verdict(cells, 8, worth_it=0.005).startswith("Turn it on only if the tail may grow")
    for bad in (2.0, -0.01):
        with pytest.raises(LenpredError, match="--worth-it must be a fraction in"):
            WhatifConfig(traffic="x", worth_it=bad)
    # wholly under a 0.5 % bar while the recorded length reaches it: off for good, the bar and the tail said as given
    cells["lenpred"] = cell((0.001, -0.003, 0.004), (1.3, 1.2, 1.4))
    said = verdict(cells, 8, worth_it=0.005)
    assert said.startswith("Leave it off: at D = 8 lenpred cuts mean JCT by +0.1% [-0.3%, +0.4%], reliably under 0.5% "
                           "where the recorded length gains +20.0%;")
    assert said.endswith("Its tail grows too: p99 1.30x [1.20, 1.40] stock's; an age threshold (--max-wait-s S) bounds "
                         "the wait of the longest requests.")


def test_a_window_of_the_log_is_replayed_from_since_to_until(tmp_path, monkeypatch):
    import time

    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord
    from lenpred.studies.whatif import epoch_s, render_whatif

    assert epoch_s("1796530247.5") == 1796530247.5 and epoch_s(None) is None
    monkeypatch.setenv("TZ", "America/New_York")  # a naive ISO time is UTC, whatever the machine's zone
    time.tzset()
    try:
        assert epoch_s("1970-01-01T00:01:40") == 100.0 and epoch_s("1970-01-01T01:01:40+01:00") == 100.0
        assert epoch_s("19700102") == 86400.0  # a basic ISO date, not 19,700,102 s
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    for bad in ("yesterday", "nan", "inf", "-inf", "-1e20"):
        with pytest.raises(LenpredError, match=f"--since '{bad}' is neither an ISO 8601 time .* nor a finite number"):
            WhatifConfig(traffic="x", since=bad)
    with pytest.raises(LenpredError, match="--until 5 is before --since 10: give a window that ends after it starts"):
        WhatifConfig(traffic="x", since="10", until="5")
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "log")) as w:
        for i in range(30):  # one request every 2 s from t = 100 s, each done 1 s after it arrives (1.5 s: i = 4)
            w.record(TrafficRecord(features=np.zeros(4), expected=20.0, num_output_tokens=20, finish_reason="stop",
                                   arrival_time_s=100.0 + 2 * i, first_token_time_s=100.1 + 2 * i,
                                   finish_time_s=101.0 + 2 * i + 0.5 * (i == 4), num_prompt_tokens=30 + i))
    # rows from t = 109 s (i = 5) on: times from there; the one arrived at 108 s still ran at 109 s
    t = LoggedTraffic.read(tmp_path / "log", since=109.0)
    assert (len(t.arrival_s), t.num_outside, t.num_in_flight, t.arrival_s[0], t.num_prompt_tokens[0]) == (25, 5, 1, 0.0,
                                                                                                          35)
    t = LoggedTraffic.read(tmp_path / "log", since=110.0, until=150.0)  # both ends in: i = 5..25
    assert (len(t.arrival_s), t.num_outside, t.num_in_flight) == (21, 9, 0)
    with pytest.raises(LenpredError, match="has rows without arrival_time_s"):  # damaged, not "outside the window"
        with TrafficLogWriter(TrafficLogConfig(tmp_path / "nan")) as w:
            for i in range(25):
                w.record(TrafficRecord(features=np.zeros(4), expected=20.0, num_output_tokens=20, finish_reason="stop",
                                       arrival_time_s=float("nan") if i == 3 else float(i), first_token_time_s=i + 0.1,
                                       finish_time_s=i + 1.0, num_prompt_tokens=30))
        LoggedTraffic.read(tmp_path / "nan", since=0.0)
    with pytest.raises(LenpredError, match=r"holds 10 requests in the --since / --until window \(20 outside it\); a "
                                           "replay needs at least 20: log longer, or widen the window"):
        LoggedTraffic.read(tmp_path / "log", since=140.0)
    report = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), out=str(tmp_path / "o"), clusters=4,
                                     bootstrap_resamples=100, since="1970-01-01T00:01:49"))
    assert report["num_requests"] == 25 and report["window"] == {"since_epoch_s": 109.0, "until_epoch_s": None,
                                                                 "num_outside": 5, "num_in_flight": 1}
    text = render_whatif(report)
    assert text.startswith("# What if: 25 logged requests over 49 s, those arriving from 1970-01-01T00:01:49+00:00 (5 "
                           "rows outside the window not replayed, 1 of them still running when it opened (their work "
                           "is not in the replay))\n")
    assert "- The log: its first replayed arrival at 1970-01-01T00:01:50+00:00; served at D = " in text
    assert "- The bar: a cut whose interval's lower end is at least 2% turns it on (--worth-it).\n" in text
    # a request every 2 s, each done in about 1 s: no order changes anything at any bound, and the tables say so
    assert text.count("Every order gives stock's mean JCT at D = ") == len(report["results"]) > 0


def test_a_table_says_when_nothing_waits():
    from lenpred.studies.whatif import idle_note

    cells = {m: {"mean_jct_s": 10.0} for m in ("stock FCFS", "lenpred")}
    assert idle_note(cells, "32")[0].startswith("Every order gives stock's mean JCT at D = 32 (to the millisecond)")
    cells["lenpred"]["mean_jct_s"] = 10.002  # 2 ms apart: something moved
    assert idle_note(cells, "32") == []


def test_a_log_that_does_not_say_its_bound_takes_the_first_given(tmp_path):
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord, write_engine_settings

    with TrafficLogWriter(TrafficLogConfig(tmp_path / "log")) as w:
        for i in range(24):  # not streamed: each first token logged at its finish
            w.record(TrafficRecord(features=np.zeros(4), expected=20.0, num_output_tokens=20, finish_reason="stop",
                                   arrival_time_s=0.0, first_token_time_s=2.0 + i, finish_time_s=2.0 + i,
                                   num_prompt_tokens=30 + i))
    write_engine_settings(tmp_path / "log", {"policy": "observe", "decode_slots": 2, "prefill_ahead": 2,
                                             "max_num_seqs": 4})
    cost = tmp_path / "cost.json"
    UNIT.save(cost)
    report = run_whatif(WhatifConfig(traffic=str(tmp_path / "log"), cost_model=str(cost), decode_slots=(4, 8),
                                     out=str(tmp_path / "o"), clusters=4, bootstrap_resamples=100))
    assert (report["observed_bound"], report["verdict_at"], list(report["results"])) == (4, 4, ["4", "8"])
    assert report["bound_source"].endswith("(its rows were not streamed)")
