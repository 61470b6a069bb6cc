"""The measured cost model (lenpred.serving.cost_model): the fit recovers known coefficients; save / load."""

import pytest

from lenpred.errors import LenpredError
from lenpred.serving.cost_model import CostModel, run_features


def test_cost_model_fit_recovers_coefficients(tmp_path):
    true = {"p0": 0.02, "p1": 1e-4, "p2": 1e-7, "d0": 0.01, "d1": 2e-3, "d2": 1e-6}
    model = CostModel("x", true)
    measurements = [{"batch_size": B, "prompt_tokens": [P] * B, "num_new_tokens": L,
                     "wall_s": model.generate_time_s([P] * B, L)}
                    for B in (1, 2, 4, 8) for P in (16, 128, 512) for L in (1, 8, 32)]
    fitted = CostModel.fit(measurements, engine="x", hardware={"cpu_model": "test"})
    for k, v in true.items():
        assert fitted.coefficients[k] == pytest.approx(v, rel=1e-4)
    assert fitted.fit_stats["loo_max_rel_error"] < 1e-6
    fitted.save(tmp_path / "c.json")
    again = CostModel.load(tmp_path / "c.json")
    assert again.coefficients == fitted.coefficients and again.hardware == {"cpu_model": "test"}
    # one run = prefill + (L − 1) decode steps at context Σ P + k
    B, P, L = 2, 10, 3
    direct = model.prefill_time_s([P] * B) + sum(model.decode_step_time_s(B, B * (P + k)) for k in (1, 2))
    assert model.generate_time_s([P] * B, L) == pytest.approx(direct)
    assert run_features(B, [P] * B, L)[5] == B * (P + 1) + B * (P + 2)
    with pytest.raises(LenpredError, match="missing.json does not exist"):
        CostModel.load(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(LenpredError, match="not a lenpred cost model"):
        CostModel.load(tmp_path / "junk.json")


def test_with_pace_scales_every_step_time():
    base = CostModel("vllm", {"p0": 0.1, "p1": 0.001, "p2": 0.0, "d0": 0.05, "d1": 0.01, "d2": 1e-6})
    slow = base.with_pace(1.25)
    # prefill 0.1 + 0.001·200 = 0.3 s; decode of 16 at 1,000 context tokens 0.05 + 0.16 + 0.001 = 0.211 s: × 1.25
    assert slow.prefill_time_s([200]) == pytest.approx(1.25 * 0.3)
    assert slow.decode_step_time_s(16, 1000) == pytest.approx(1.25 * base.decode_step_time_s(16, 1000))
    assert base.decode_step_time_s(16, 1000) == pytest.approx(0.211)
    assert slow.with_pace(0.8).settings["pace_scale"] == pytest.approx(1.0)  # the scales multiply, in the record
    for bad in (0.0, -1.0, float("inf"), float("nan"), "1.1", None, True):
        with pytest.raises(LenpredError, match="finite number > 0"):
            base.with_pace(bad)
    # an overhead already in d1 scales with the pace, and so does its record: d1 = (0.01 + 0.002) × 1.5
    served = base.with_streaming_overhead(0.002).with_pace(1.5)
    assert served.coefficients["d1"] == pytest.approx(0.018)
    assert served.settings["streaming_overhead_s_per_token"] == pytest.approx(0.003)


def test_streaming_overhead_adds_to_the_per_sequence_decode_cost():
    base = CostModel("vllm", {"p0": 0.1, "p1": 0.0, "p2": 0.0, "d0": 0.05, "d1": 0.01, "d2": 0.0})
    served = base.with_streaming_overhead(0.003)
    # a step of 16 sequences: 0.05 + 16·(0.01 + 0.003); the prefill and the original are unchanged
    assert served.decode_step_time_s(16, 0) == pytest.approx(0.05 + 16 * 0.013)
    assert base.decode_step_time_s(16, 0) == pytest.approx(0.05 + 16 * 0.01)
    assert served.prefill_time_s([100]) == base.prefill_time_s([100])
    assert served.settings["streaming_overhead_s_per_token"] == 0.003
    twice = served.with_streaming_overhead(0.001)  # the two add up, in d1 and in the record
    assert twice.coefficients["d1"] == pytest.approx(0.014)
    assert twice.settings["streaming_overhead_s_per_token"] == pytest.approx(0.004)
    for bad in (-0.001, float("inf"), float("nan"), "0.001", None):
        with pytest.raises(LenpredError, match="finite number >= 0"):
            base.with_streaming_overhead(bad)
