"""The queue-share study (lenpred.studies.queue_share): stock's mean TTFT / mean JCT per slice beside the plug-in's
paired cut, binned, from the simulator and from engine stores."""

import json

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.studies.queue_share import (QueueShareConfig, binned, engine_slices, markdown, queue_share, slice_row,
                                         spearman)


def test_the_queue_share_is_mean_ttft_over_mean_jct():
    assert queue_share(np.array([1.0, 3.0]), np.array([4.0, 6.0])) == pytest.approx(2 / 5)
    with pytest.raises(LenpredError, match="at least one request with a positive mean JCT"):
        queue_share(np.array([]), np.array([]))
    with pytest.raises(LenpredError, match="positive mean JCT"):
        queue_share(np.array([0.0]), np.array([0.0]))


def test_a_slice_row_gives_the_paired_cut_and_the_p99_ratio():
    row = slice_row("simulator", "code", 0.9, 3, {"stock": np.array([10.0, 20.0]), "plugin": np.array([5.0, 20.0])},
                    np.array([2.0, 4.0]))
    assert row["queue_share"] == pytest.approx(3 / 15) and row["stock_mean_jct_s"] == 15.0
    assert row["cut_vs_stock"] == {"plugin": pytest.approx(1 - 25 / 30)}
    # numpy's linear p99: 5 + 0.99 × 15 over 10 + 0.99 × 10
    assert row["p99_ratio_vs_stock"]["plugin"] == pytest.approx(19.85 / 19.9)


def _row(share: float, stock, plugin) -> tuple[dict, dict]:
    stock, plugin = np.array(stock, dtype=float), np.array(plugin, dtype=float)
    row = slice_row("s", "code", 1.0, 0, {"stock": stock, "plugin": plugin}, share * stock)
    return row, {"stock": stock, "plugin": plugin}


def test_only_the_plugins_design_counts_as_the_plugin():
    from lenpred.studies.queue_regime import plugin_settings
    from lenpred.studies.queue_share import is_design

    assert is_design(plugin_settings(16)) and is_design({})  # an old record without settings: the design
    for other in ({"policy": "fcfs"}, {"admit_by": "arrival"}, {"prefill_ahead": 4}, {"max_wait_s": 200.0},
                  {"aging_tokens_per_s": 4.0}, {"plp": True}):
        assert not is_design(plugin_settings(16, other)), other


def test_slices_pool_into_their_share_bins_the_last_one_closed():
    pairs = [_row(0.05, [10, 10], [9, 9]), _row(0.15, [10, 30], [5, 25]), _row(0.15, [20, 20], [20, 20]),
             _row(1.0, [10, 10], [10, 10])]
    rows, jcts = [p[0] for p in pairs], [p[1] for p in pairs]
    bins = binned(rows, jcts, (0.0, 0.1, 0.2, 0.5, 1.0), n_resamples=200)
    assert [b["num_slices"] for b in bins] == [1, 2, 0, 1]
    # the second bin pools its two slices request by request: 1 − (5 + 25 + 20 + 20) / (10 + 30 + 20 + 20)
    assert bins[1]["cut_vs_stock"]["plugin"][0] == pytest.approx(1 - 70 / 80)
    assert bins[0]["cut_vs_stock"]["plugin"][0] == pytest.approx(0.1)
    assert bins[2]["cut_vs_stock"]["plugin"] is None and bins[2]["p99_ratio_vs_stock"]["plugin"] is None
    # the pooled p99: numpy's linear p99 of (9, 9) over that of (10, 10)
    assert bins[0]["p99_ratio_vs_stock"]["plugin"][0] == pytest.approx(0.9)
    # ranks of the share (1, 2.5, 2.5, 4) against those of the cuts 0.1, 0.25, 0, 0 (3, 4, 1.5, 1.5): -2.25 / 4.5
    assert spearman(rows, "plugin") == pytest.approx(-0.5)
    assert spearman(rows[:2], "plugin") is None
    for r, load in zip(rows, (0.6, 0.9, 1.1, 1.2)):  # by the nominal load instead: ranks 1..4 against 3, 4, 1.5, 1.5
        r["load"] = load
    assert spearman(rows, "plugin", "load") == pytest.approx(-3.5 / (5 ** 0.5 * 4.5 ** 0.5))


def _result(rid: int, jct: float, ttft: float, outcome: str = "ok") -> dict:
    return {"request_id": rid, "jct_s": jct, "ttft_s": ttft, "outcome": outcome}


def test_engine_slices_pair_stock_and_the_plugin_on_trace_patterns_only(tmp_path):
    def run(results, when="2026-12-06T10:00:00", machine=None):
        return {"results": results, "settings": {"rate_req_s": 0.2}, "started": when, "finished": when,
                **({"machine": {"boot_id": machine}} if machine else {})}

    stock = run([_result(0, 10.0, 4.0), _result(1, 30.0, 6.0), _result(2, 50.0, 40.0, "cancelled")],
                machine="2729868e-xx")
    plugin = run([_result(0, 5.0, 1.0), _result(1, 30.0, 2.0), _result(2, 1.0, 0.5)])
    store = {"config": {"seed": 100},
             "runs": {"1/stock/tracecodex0.9": stock, "1/plugin/tracecodex0.9": plugin,
                      "0/stock/burst8": stock, "0/plugin/burst8": plugin,  # not a trace: left out
                      "2/plugin/tracecodex0.9": plugin,  # no stock run: left out
                      "3/stock/tracecodex0.9": stock, "3/plugin_guard/tracecodex0.9": plugin,  # not the design
                      "4/stock/tracecodex0.9": stock,  # its plug-in run 2 hours later: apart from stock, left out
                      "4/plugin/tracecodex0.9": run(plugin["results"], when="2026-12-06T12:00:00"),
                      "5/stock/tracecodex0.9": stock,  # the plug-in with an FCFS order: not the design, left out
                      "5/plugin/tracecodex0.9": {**plugin, "settings": {"rate_req_s": 0.2, "plugin": {
                          "policy": "fcfs", "admit_by": "arrival", "decode_slots": 16, "prefill_ahead": 16}}}}}
    for name, st in (("code_x0.9", store),
                     ("code_x0.9_repeat", {"config": {"seed": 101},  # its draw 0 is code_x0.9's slice 1 again
                                           "runs": {"0/stock/tracecodex0.9": stock,
                                                    "0/plugin/tracecodex0.9": plugin}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "runs.json").write_text(json.dumps(st))
    rows, jcts = engine_slices(tmp_path)
    assert len(rows) == 1
    row = rows[0]
    assert (row["source"], row["trace"], row["load"], row["draw"], row["boot_id"]) == (
        "code_x0.9", "code", 0.9, 1, "2729868e-xx")
    # request 2 is not ok under stock: out of both sides
    assert row["num_requests"] == 2 and row["queue_share"] == pytest.approx(10 / 40)
    assert row["cut_vs_stock"]["plugin"] == pytest.approx(1 - 35 / 40)
    np.testing.assert_allclose(jcts[0]["plugin"], [5.0, 30.0])
    assert row["day"] == "2026-12-06"  # the day the stock run started
    assert engine_slices("") == ([], [])  # the simulator only
    with pytest.raises(LenpredError, match="no engine stores"):  # a wrong path, or one store instead of the folder
        engine_slices(tmp_path / "code_x0.9")
    for bad in ("{", "[]", '{"runs": {"1/plugin/tracecodex0.9": {}, "1/stock/tracecodex0.9": {}}}'):
        (tmp_path / "code_x0.9" / "runs.json").write_text(bad)
        with pytest.raises(LenpredError, match="code_x0.9/runs.json is not a queue benchmark's store"):
            engine_slices(tmp_path)


def test_a_slice_with_a_damaged_ttft_is_refused():
    row, jct = _row(0.5, [10, 10], [9, 9])
    row["queue_share"] = float("nan")
    with pytest.raises(LenpredError, match="queue share outside"):
        binned([row], [jct], (0.0, 1.0), n_resamples=10)


@pytest.mark.parametrize("bad, msg", [({"share_bins": (0.1, 1.0)}, "ascend from 0 to 1"),
                                      ({"share_bins": (0.0, 0.5, 0.5, 1.0)}, "ascend from 0 to 1"),
                                      ({"traces": ("chat",)}, "unknown trace chat"),
                                      ({"loads": (0.0,)}, r"loads must be in \(0, 10\)"),
                                      ({"draws": 0}, "draws must be >= 1"),
                                      ({"seed": -1}, "seed must be >= 0"),
                                      ({"bootstrap_resamples": 0}, "bootstrap resamples must be >= 100")])
def test_bad_settings_are_refused(bad, msg):
    with pytest.raises(LenpredError, match=msg):
        QueueShareConfig(**bad)


def test_a_small_simulated_study_runs_end_to_end(tmp_path, monkeypatch):
    from lenpred.serving.traces import TRACES
    from lenpred.studies.queue_share import run, save

    rows = [f"2023-11-16 18:{17 + k // 60:02d}:{k % 60:02d}.{(k * 37) % 10}000000,10,1" for k in range(0, 120, 3)]
    (tmp_path / "t").mkdir()  # 40 arrivals, 3 s apart plus a tenth or so
    (tmp_path / "t" / TRACES["code"]).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    monkeypatch.setenv("LENPRED_TRACE_DIR", str(tmp_path / "t"))
    cfg = QueueShareConfig(traces=("code",), loads=(1.0,), draws=2, window_s=40.0, engine_stores="",
                           bootstrap_resamples=100, out=str(tmp_path / "out" / "share"))
    rep = run(cfg)
    slices = rep["simulator"]["slices"]
    assert len(slices) == 2 and rep["engine"]["slices"] == []
    n = int(round(rep["capacity_req_s"] * 40.0))
    assert all(s["num_requests"] == n for s in slices)
    assert all(0 < s["queue_share"] < 1 and set(s["cut_vs_stock"]) == {"priority:prompt_len", "plugin"}
               for s in slices)
    assert sum(b["num_slices"] for b in rep["simulator"]["bins"]) == 2
    save(rep, cfg.out)
    assert json.loads((tmp_path / "out" / "share.json").read_text())["design_mode"] == "plugin:srpt:W16:prompt_len"
    assert (tmp_path / "out" / "share.png").stat().st_size > 0
    assert "The plug-in's gain against stock's queue share" in markdown(rep)
