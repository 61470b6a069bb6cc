"""The kill -9 study of the traffic log (:mod:`lenpred.studies.traffic_log_faults`): the read-back check and the
summary table on hand-made values, and two real kills of a writer process (about 2 s)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lenpred.studies.traffic_log_faults import (TrafficLogFaultsConfig, TrafficLogFaultsReport, check_log,
                                                render_markdown, run, summary_rows)


def _log(ids, feature=None):
    ids = np.asarray(ids)
    feats = np.repeat(ids[:, None] % 2048, 3, 1) if feature is None else feature
    return SimpleNamespace(num_records=len(ids), columns={"num_output_tokens": ids, "finish_time_s": ids.astype(float)},
                           features=feats)


def test_check_log():
    assert check_log(_log([0, 1, 2]), 3) is None
    assert check_log(_log([0, 2]), 0) == "rows are not 0..n-1"
    assert check_log(_log([0, 1], np.zeros((2, 3))), 0) == "features differ from the rows' ids"
    assert check_log(_log([0, 1]), 5) == "2 rows, fewer than the 5 of earlier reads"


def _trial(kind, lost, rate, since):
    return {"kind": kind, "lost": lost, "rows_per_s": rate, "since_rotation": since, "torn_lines": 0,
            "consistent": True, "recovered_by_this_writer": 4, "expected_recovered": 4}


def test_summary_rows_and_markdown():
    trials = [_trial("random", 1, 2900.0, 10), _trial("rotation", 0, 2500.0, 2), _trial("random", 0, 3000.0, 30)]
    rows = summary_rows(trials)
    assert rows[0] == ["random", 2, "2,900", 20, 1, "0.50", "0: 1, 1: 1", 0, "2/2", "2/2"]
    assert rows[2][:6] == ["all", 3, "2,500", 10, 1, "0.33"]
    md = render_markdown(TrafficLogFaultsReport({}, trials, {"rows": 9, "recovered": 3, "ok": True}))
    assert md.splitlines()[2].startswith("| random | 2 | 2,900 |")
    assert md.endswith("final: 9 rows, last journals recovered: 3 rows, every part verified, no journal left: True")


def test_two_kills_lose_at_most_the_row_in_flight(tmp_path):
    rep = run(TrafficLogFaultsConfig(kills=2, out=str(tmp_path)))
    assert (tmp_path / "faults.json").exists() and rep.final["ok"]
    assert [t["kind"] for t in rep.trials] == ["random", "rotation"]
    assert all(t["consistent"] and t["lost"] <= 1 for t in rep.trials)
