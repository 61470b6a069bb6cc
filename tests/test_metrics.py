"""Unit tests of lenpred.metrics and .report: hand-computed metrics, censoring, bootstrap, tables, files."""

import json
import math

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.metrics import (aggregate_seeds, censored_metrics, clustered_bootstrap, gap_closed, leave_one_out_median,
                             length_metrics, metrics_by_scenario, oracle_floor, paired_cluster_bootstrap,
                             prompt_mean_mae, score_methods)
from lenpred.studies.evaluate_report import markdown_table, plot_mae, render_table, save_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_length_metrics_hand_values():
    # errors |0-3| = 3, |10-6| = 4 -> MAE 3.5, RMSE sqrt((9 + 16) / 2) = sqrt(12.5)
    m = length_metrics(np.array([0.0, 10.0]), np.array([3.0, 6.0]))
    assert m["mae"] == pytest.approx(3.5)
    assert m["rmse"] == pytest.approx(math.sqrt(12.5))
    assert m["n"] == 2
    assert isinstance(m["mae"], float) and isinstance(m["n"], int)
    # two samples in the same order -> tau 1; within 25 %: |3 - 0| > 0, |6 - 10| = 4 > 2.5 -> 0
    assert m["kendall_tau"] == pytest.approx(1.0) and m["within_25"] == 0.0


def test_length_metrics_perfect_and_constant_offset():
    y = np.array([1.0, 5.0, 9.0])
    assert length_metrics(y, y) == {"mae": 0.0, "rmse": 0.0, "kendall_tau": 1.0, "within_25": 1.0, "n": 3}
    # every prediction off by 2 -> MAE = RMSE = 2
    m = length_metrics(y, y - 2)
    assert m["mae"] == pytest.approx(2.0) and m["rmse"] == pytest.approx(2.0)


# group "b": y [0, 10], pred [3, 6] -> errors 3, 4: MAE 3.5, RMSE sqrt(12.5)
# group "a": y [5, 5], pred [5, 9]  -> errors 0, 4: MAE 2, RMSE sqrt(16 / 2) = sqrt(8)
# overall: errors 3, 4, 0, 4 -> MAE 11/4 = 2.75, RMSE sqrt((9 + 16 + 0 + 16) / 4) = sqrt(10.25)
Y = np.array([0.0, 10.0, 5.0, 5.0])
PRED = np.array([3.0, 6.0, 5.0, 9.0])
SCEN = np.array(["b", "b", "a", "a"])


def test_metrics_by_scenario_groups_and_overall():
    out = metrics_by_scenario(Y, PRED, SCEN)
    assert list(out) == ["a", "b", "overall"]  # sorted scenarios, then overall
    assert out["a"]["mae"] == pytest.approx(2.0) and out["a"]["rmse"] == pytest.approx(math.sqrt(8))
    assert out["b"]["mae"] == pytest.approx(3.5) and out["b"]["rmse"] == pytest.approx(math.sqrt(12.5))
    assert out["overall"]["mae"] == pytest.approx(2.75)
    assert out["overall"]["rmse"] == pytest.approx(math.sqrt(10.25))
    assert [out[k]["n"] for k in ("a", "b", "overall")] == [2, 2, 4]


def test_metrics_by_scenario_accepts_lists():
    out = metrics_by_scenario(list(Y), list(PRED), list(SCEN))
    assert out["b"]["mae"] == pytest.approx(3.5)


def _results():
    per = metrics_by_scenario(Y, PRED, SCEN)
    zero = metrics_by_scenario(Y, Y, SCEN)
    return {"median": per, "oracle": zero}


def test_markdown_table_contents():
    md = markdown_table(_results()).splitlines()
    assert md[0] == "| method | a MAE | b MAE | overall MAE |"  # no interval computed: its columns are left out
    assert md[1] == "|---|" + "---:|" * 3
    # 2.0, 3.5, 2.75, one decimal
    assert md[2] == "| median | 2.0 | 3.5 | 2.8 |"
    assert md[3] == "| oracle | 0.0 | 0.0 | 0.0 |"
    assert len(md) == 4
    detail = markdown_table(_results(), "detail").splitlines()
    # sqrt(8) = 2.83, sqrt(12.5) = 3.54, sqrt(10.25) = 3.20
    assert detail[0].startswith("| method | a RMSE | a tau | a ±25% |") and detail[2].startswith("| median | 2.8 |")


def test_markdown_detail_table_and_seed_std():
    runs = [_results()["median"], metrics_by_scenario(Y, PRED + 2, SCEN)]
    agg = {"m": aggregate_seeds(runs)}
    # group a: MAE 2.0 (seed 1) and errors |5-7|, |5-11| -> 4.0 (seed 2): mean 3.0 ± 1.0
    assert markdown_table(agg).splitlines()[2].startswith("| m | 3.0 ± 1.0 |")
    detail = markdown_table(agg, "detail").splitlines()
    assert detail[0] == ("| method | a RMSE | a tau | a ±25% | b RMSE | b tau | b ±25% | overall RMSE | overall tau | "
                         "overall ±25% |")
    # a: y constant -> tau undefined "–"; within 25 %: seed 1 errors 0, 4 (limit 1.25) -> 0.5; seed 2: 0 -> mean 0.25
    assert detail[2].split(" | ")[2:4] == ["–", "0.250 ± 0.250"]


def test_render_table_shape():
    table = render_table(_results(), kind="detail")
    assert len(table.columns) == 1 + 3 * 3
    assert table.row_count == 2
    assert "(n=2)" in str(table.columns[1].header) and "(n=4)" in str(table.columns[7].header)


def test_prompt_mean_mae_hand_worked():
    # prompt p: samples 10, 30 (mean 20), predictions 25, 25 -> 5; prompt q: sample 7, prediction 4 -> 3; mean 4
    assert prompt_mean_mae(np.array([10.0, 30.0, 7.0]), np.array([25.0, 25.0, 4.0]),
                           np.array(["p", "p", "q"])) == pytest.approx(4.0)


def test_leave_one_out_median_and_oracle_floor():
    y = np.array([10.0, 20.0, 60.0, 5.0, 100.0, 300.0])
    pid = np.array(["p", "p", "p", "q", "r", "r"])
    scen = np.array(["rl", "rl", "rl", "rl", "longseq", "longseq"])
    # p: others of 10 -> [20, 60] median 40; of 20 -> [10, 60] -> 35; of 60 -> [10, 20] -> 15; q alone -> NaN
    # r: 100 <-> 300
    loo = leave_one_out_median(y, pid)
    np.testing.assert_allclose(loo, [40.0, 35.0, 15.0, np.nan, 300.0, 100.0])
    floor = oracle_floor(y, pid, scen)
    # rl errors 30, 15, 45 -> 30 on 3 samples of 1 prompt; longseq errors 200, 200 -> 200
    assert floor["rl"] == {"mae": pytest.approx(30.0), "n": 3, "num_prompts": 1}
    assert floor["longseq"]["mae"] == pytest.approx(200.0)
    assert floor["overall"] == {"mae": pytest.approx((30 * 3 + 400) / 5), "n": 5, "num_prompts": 2}


def test_gap_closed():
    # reference 100, floor 60: a method at 80 closes half the gap, at 110 it is negative
    assert gap_closed(80.0, 100.0, 60.0) == pytest.approx(0.5)
    assert gap_closed(110.0, 100.0, 60.0) == pytest.approx(-0.25)
    assert gap_closed(80.0, 60.0, 60.0) is None


def test_metrics_by_scenario_with_prompt_ids_adds_prompt_mean_mae():
    out = metrics_by_scenario(Y, PRED, SCEN, prompt_ids=np.array(["x", "x", "y", "z"]))
    # b: one prompt x, mean y 5, mean prediction 4.5 -> 0.5
    assert out["b"]["mae_prompt_mean"] == pytest.approx(0.5)


def test_plot_mae_writes_png(tmp_path):
    path = tmp_path / "sub" / "mae.png"
    plot_mae(_results(), path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    # atomic write: nothing but the PNG in its folder
    assert [p.name for p in path.parent.iterdir()] == ["mae.png"]


def test_save_report_writes_json_and_png(tmp_path):
    results = _results()
    paths = save_report(results, {"config": {"seed": 3}, "timing_s": 1.5}, tmp_path, stem="run1")
    assert paths == {"json": tmp_path / "run1.json", "png": tmp_path / "run1.png", "md": tmp_path / "run1.md"}
    data = json.loads(paths["json"].read_text())
    assert data["config"] == {"seed": 3} and data["timing_s"] == 1.5
    assert data["results"]["median"]["overall"]["mae"] == pytest.approx(2.75)
    assert data["results"]["oracle"]["a"]["rmse"] == 0.0
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1.json", "run1.md", "run1.png"]
    assert paths["md"].read_text().splitlines()[2] == "| median | 2.0 | 3.5 | 2.8 |"


def test_censored_metrics_hand_values():
    # capped: y = cap = 512 (pred 500 -> below; 512 -> not below); uncapped errors |100-90| = 10, |20-30| = 10
    m = censored_metrics(np.array([512.0, 512.0, 100.0, 20.0]), np.array([500.0, 512.0, 90.0, 30.0]),
                         np.array([True, True, False, False]))
    assert m == {"mae_uncapped": pytest.approx(10.0), "capped_below_cap": 0.5}
    assert censored_metrics(np.array([5.0]), np.array([4.0]), np.array([False]))["capped_below_cap"] is None


def test_clustered_bootstrap_resamples_prompts_not_samples():
    # prompt p: samples with errors 10, 10, 10, 10; prompt q: one sample with error 0
    errors, pid = np.array([10.0, 10.0, 10.0, 10.0, 0.0]), np.array(["p"] * 4 + ["q"])
    est, lo, hi = clustered_bootstrap(errors, pid, n_resamples=500, seed=0)
    assert est == pytest.approx(8.0)  # 40 / 5
    # resamples are {p, p} -> 10, {q, q} -> 0 and {p, q} -> 8 (each sample of p comes along with p)
    assert lo == pytest.approx(0.0) and hi == pytest.approx(10.0)
    # all errors equal: a zero-width interval
    assert clustered_bootstrap(np.full(6, 3.0), np.arange(6), 200)[1:] == pytest.approx((3.0, 3.0))


def test_score_methods_pairs_differences_and_marks_the_reference():
    rng = np.random.default_rng(0)
    y = rng.integers(10, 200, 40).astype(float)
    scen, pid = np.array(["a"] * 20 + ["b"] * 20), np.repeat(np.arange(20), 2).astype(str)
    preds = {"scenario_median": [np.full(40, 100.0)], "ext1": [y + 30], "ext2": [y - 5], "mine": [y + 1, y - 1]}
    s = score_methods(preds, y, scen, pid, np.zeros(40, bool), externals=("ext1", "ext2"), n_resamples=300)
    assert s["best_external"] == {"a": "ext2", "b": "ext2", "overall": "ext2"}
    r = s["results"]["mine"]["overall"]
    assert r["mae"] == pytest.approx(1.0)
    # mine errors are 1 everywhere, ext2's 5: the paired difference is exactly -4 in every resample
    assert r["diff_best_external"] == pytest.approx([-4.0, -4.0, -4.0])
    assert s["results"]["ext2"]["overall"]["diff_best_external"] is None  # the reference itself
    assert s["results"]["scenario_median"]["overall"]["diff_floor"] is None
    lo, hi = s["results"]["scenario_median"]["overall"]["mae_ci"]
    assert lo <= s["results"]["scenario_median"]["overall"]["mae"] <= hi
    md = markdown_table(s["results"], "diff").splitlines()
    assert "-4.0 [-4.0, -4.0]*" in md[[l.split(" | ")[0] for l in md].index("| mine")]


def test_paired_cluster_bootstrap_keeps_requests_paired():
    cut = lambda v: 1 - v["p"].mean() / v["f"].mean()  # noqa: E731
    f = [np.array([1.0, 5.0, 20.0]), np.array([2.0, 9.0])]
    # halving every request's JCT is a 50 % cut in every resample: pairing leaves no spread
    assert paired_cluster_bootstrap({"f": f, "p": [x / 2 for x in f]}, cut, n_resamples=200) == (0.5, 0.5, 0.5)
    # one request 10 s faster out of 5: the estimate is the pooled one, 1 - 27/37; resamples spread around it
    p = [np.array([1.0, 5.0, 10.0]), np.array([2.0, 9.0])]
    est, lo, hi = paired_cluster_bootstrap({"f": f, "p": p}, cut, n_resamples=500, seed=1)
    assert est == pytest.approx(1 - 27 / 37) and 0.0 <= lo < est < hi <= 1 - 10 / 20
    # the same seed gives the same interval; unpaired request counts are refused
    assert paired_cluster_bootstrap({"f": f, "p": p}, cut, n_resamples=500, seed=1) == (est, lo, hi)
    with pytest.raises(LenpredError, match="pair the requests"):
        paired_cluster_bootstrap({"f": f, "p": [np.array([1.0]), p[1]]}, cut)
