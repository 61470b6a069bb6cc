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
    with pytest.raises(LenpredError, match="not a lenpred cost model"):
        CostModel.load(tmp_path / "missing.json")
