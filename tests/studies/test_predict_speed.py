"""The predict-speed study's pure parts (:mod:`lenpred.studies.predict_speed`): summaries, pairing, alternation and
the prediction check on hand-worked values; the committed JSON read back unchanged and rendered."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lenpred.errors import LenpredError
from lenpred.studies.predict_speed import PredictSpeedReport, check_same, paired, render_markdown, run_pairs, summary

ROOT = Path(__file__).resolve().parents[2]


def test_summary_and_paired():
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert summary([4.0, 1.0, 2.0, 3.0])["median"] == 2.5
    p = paired([10.0, 30.0], [5.0, 10.0])
    assert p["ratio_before_over_after"] == {"median": 2.5, "min": 2.0, "max": 3.0, "n": 2}


def test_run_pairs_alternates_who_goes_first():
    order = []
    sides = (SimpleNamespace(name="before"), SimpleNamespace(name="after"))

    def measure(side):
        order.append(side.name)
        return len(order), [float(len(order))]
    (b, a), (bo, ao) = run_pairs(sides, 3, measure)
    assert order == ["before", "after", "after", "before", "before", "after"]
    assert b == [1, 4, 5] and a == [2, 3, 6] and bo == [[1.0], [4.0], [5.0]]


def test_check_same():
    assert check_same([[1.0, 2.0]], [[1.05, 2.0]], "x") == pytest.approx(0.05)
    with pytest.raises(LenpredError, match="x: before and after predict differently"):
        check_same([[1.0]], [[1.2]], "x")


def test_committed_report_reads_back_and_renders():
    stored = json.loads((ROOT / "results" / "scripts" / "predict_speed" / "predict_speed.json").read_text())
    report = PredictSpeedReport.from_dict(stored)
    assert report.to_dict() == stored and list(report.to_dict()) == list(stored)
    md = render_markdown(report)
    row = "| warm in process | vicuna_32 | 7 | 10811 (7663–14085) | 2925 (2498–4722) | 3.00 (2.70–4.33) | 0.00 |"
    assert row in md
