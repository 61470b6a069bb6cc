"""The first-head study's parts (lenpred.studies.first_head) on hand-made rows: the stream is logged as the plug-in
logs with no head, and the scores are paired with the shipped head's."""

import json

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.online.capture import HeadlessCapture
from lenpred.online.traffic_log import read_traffic_log
from lenpred.studies.first_head import FirstHeadConfig, log_stream, score


def test_the_stream_is_logged_as_the_plugin_logs_with_no_head(tmp_path):
    rng = np.random.default_rng(0)
    rows = {"X": rng.normal(size=(6, 4)).astype(np.float32), "y": np.array([3.0, 9, 16, 1, 16, 5]),
            "censored": np.array([False, False, True, False, True, False]), "caps": np.full(6, 16.0),
            "prompt_tokens": np.arange(10, 16)}
    capture = HeadlessCapture("m", "rev", 15, 4, "rule")
    log = read_traffic_log(log_stream(rows, 5, capture, tmp_path / "first-5"))  # the first 5 of 6
    assert log.num_records == 5 and log.metadata["head"] == "none" and json.loads(log.metadata["layers"]) == [15]
    assert log.columns["num_output_tokens"].tolist() == [3, 9, 16, 1, 16]
    assert log.censored.tolist() == [False, False, True, False, True]  # a censored request finished by length
    assert log.columns["num_prompt_tokens"].tolist() == [10, 11, 12, 13, 14]
    assert np.isnan(log.columns["expected"]).all() and log.columns["finish_time_s"].tolist() == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(log.features, rows["X"][:5], atol=2e-3)  # float16, as the engine stores them


def test_scores_are_paired_with_the_shipped_head():
    y = np.array([10.0, 20, 30, 40, 50, 60])
    test = {"y": y, "prompt_id": np.array(["a", "a", "b", "b", "c", "c"])}
    out = score({"shipped": y + 2, "first_250": y - 1}, test, 200)
    assert out["shipped"]["mae"][0] == pytest.approx(2) and out["first_250"]["mae"][0] == pytest.approx(1)
    assert out["first_250"]["mae_minus_shipped"] == pytest.approx([-1, -1, -1])  # every error 1 token smaller
    assert out["first_250"]["kendall_tau"] == pytest.approx(1) and out["first_250"]["tau_minus_shipped"][0] == 0
    pooled = score({"shipped": y + 2, "a": y - 1, "b": y + 3}, test, 200, {"first_250": ["a", "b"]})["first_250"]
    assert pooled["mae"][0] == pytest.approx(2) and pooled["per_stream"]["mae"] == pytest.approx([1, 3])
    assert pooled["mae_minus_shipped"] == pytest.approx([0, 0, 0])  # the orders' mean error equals the shipped one


def test_config_refuses_sizes_too_small_to_calibrate():
    assert FirstHeadConfig(sizes=(500, 250, 500)).sizes == (250, 500)
    with pytest.raises(LenpredError, match="--sizes must be >= 40"):
        FirstHeadConfig(sizes=(20,))


def test_burst_cells_pool_the_orders_heads_by_hand():
    from lenpred.studies.first_head import burst_cells

    a = lambda *v: np.array(v, float)  # noqa: E731
    jct = {"stock": [a(2, 2), a(4, 4)], "shipped": [a(1, 1), a(2, 2)], "x@0": [a(1.5, 1.5), a(3, 3)],
           "x@1": [a(2, 2), a(4, 4)]}
    out = burst_cells(jct, {"shipped": ["shipped"], "x": ["x@0", "x@1"]}, 200)
    assert out["shipped"]["jct_cut_vs_stock"][0] == pytest.approx(0.5)
    assert out["x"]["mean_jct_s"] == pytest.approx(2.625) and out["x"]["jct_cut_vs_stock"][0] == pytest.approx(0.125)
    assert out["x"]["share_of_shipped"][0] == pytest.approx(0.25)  # (3 - 2.625) / (3 - 1.5)
