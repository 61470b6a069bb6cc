"""The decode-knee study's pure parts (:mod:`lenpred.studies.decode_knee`): the knee and the half-saturation point,
hand-worked and on the committed measurement; the config's file names and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lenpred.errors import LenpredError
from lenpred.studies.decode_knee import DecodeKneeConfig, half_saturation, knee

ROOT = Path(__file__).resolve().parents[2]


def test_knee_is_the_smallest_batch_reaching_the_share_of_the_best():
    rows = [{"decoding_requests": b, "throughput_tok_s": t} for b, t in ((1, 10.0), (4, 70.0), (8, 80.0), (16, 100.0))]
    assert knee(rows, 0.8) == 8  # 80 >= 0.8 * 100, 70 is not
    assert knee(rows, 0.7) == 4 and knee(rows, 1.0) == 16


def test_half_saturation_is_d0_over_d1():
    assert half_saturation({"d0": 0.06, "d1": 0.002}) == pytest.approx(30.0)
    assert half_saturation({"d0": 0.06, "d1": 0.0}) is None


def test_committed_knee_reads_back():
    rep = json.loads((ROOT / "results" / "scripts" / "serving" / "decode_knee.json").read_text())
    assert knee(rep["rows"], 0.8) == rep["knee"] == 48
    assert half_saturation(rep["cost_model"]) == rep["half_saturation_B"]


def test_config_paths_and_refusals():
    assert DecodeKneeConfig(out="o").path("decode_knee", "png") == Path("o/decode_knee.png")
    sampled = DecodeKneeConfig(out="o", sampling="recorded")
    assert sampled.path("cost_vllm_1core") == Path("o/cost_vllm_1core_sampled.json")
    with pytest.raises(LenpredError, match="unknown sampling 'nucleus'; valid: greedy, recorded"):
        DecodeKneeConfig(sampling="nucleus")
