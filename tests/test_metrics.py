"""Unit tests of lenpred.evaluate: hand-computed metrics, grouping, the Markdown table and the report files."""

import json
import math

import numpy as np
import pytest

from lenpred.evaluate import length_metrics, markdown_table, metrics_by_scenario, plot_mae, render_table, save_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_length_metrics_hand_values():
    # errors |0-3| = 3, |10-6| = 4 -> MAE 3.5, RMSE sqrt((9 + 16) / 2) = sqrt(12.5)
    m = length_metrics(np.array([0.0, 10.0]), np.array([3.0, 6.0]))
    assert m["mae"] == pytest.approx(3.5)
    assert m["rmse"] == pytest.approx(math.sqrt(12.5))
    assert m["n"] == 2
    assert isinstance(m["mae"], float) and isinstance(m["n"], int)


def test_length_metrics_perfect_and_constant_offset():
    y = np.array([1.0, 5.0, 9.0])
    assert length_metrics(y, y) == {"mae": 0.0, "rmse": 0.0, "n": 3}
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
    assert md[0] == "| method | a MAE | a RMSE | b MAE | b RMSE | overall MAE | overall RMSE |"
    assert md[1] == "|---|" + "---:|" * 6
    # 2.0, sqrt(8) = 2.83, 3.5, sqrt(12.5) = 3.54, 2.75, sqrt(10.25) = 3.20, one decimal
    assert md[2] == "| median | 2.0 | 2.8 | 3.5 | 3.5 | 2.8 | 3.2 |"
    assert md[3] == "| oracle | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 |"
    assert len(md) == 4


def test_render_table_shape():
    table = render_table(_results())
    assert len(table.columns) == 1 + 2 * 3
    assert table.row_count == 2
    assert "(n=2)" in str(table.columns[1].header) and "(n=4)" in str(table.columns[5].header)


def test_plot_mae_writes_png(tmp_path):
    path = tmp_path / "sub" / "mae.png"
    plot_mae(_results(), path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    # atomic write: nothing but the PNG in its folder
    assert [p.name for p in path.parent.iterdir()] == ["mae.png"]


def test_save_report_writes_json_and_png(tmp_path):
    results = _results()
    paths = save_report(results, {"config": {"seed": 3}, "timing_s": 1.5}, tmp_path, stem="run1")
    assert paths == {"json": tmp_path / "run1.json", "png": tmp_path / "run1.png"}
    data = json.loads(paths["json"].read_text())
    assert data["config"] == {"seed": 3} and data["timing_s"] == 1.5
    assert data["results"]["median"]["overall"]["mae"] == pytest.approx(2.75)
    assert data["results"]["oracle"]["a"]["rmse"] == 0.0
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1.json", "run1.png"]
