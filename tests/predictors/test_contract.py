"""The predictor contract, scikit-learn's ``check_estimator`` idea: every registered predictor, fitted as a
LengthPredictor on the tiny model's benchmark, predicts, saves, loads and predicts the same; what it declares it
reads (``Predictor.reads``) is what its config records, what the loader provides, what the forward computes and
what an engine may feed it; a feature head implements what ``head_pass`` calls (``features``,
``distribution_from_features``) and sets ``n_features_in_`` to the tiny model's hidden size.

A new registered predictor runs through this suite with no edit here."""

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.pipeline import LengthPredictor
from lenpred.predictors import PREDICTORS, make_predictor
from lenpred.truncated import attach_prefill_signals

PROMPTS = ["write a long poem about sea", [{"role": "system", "content": "please answer"},
                                          {"role": "user", "content": "what is the sum of two and three"}]]
CAP = 20
TINY_HIDDEN_SIZE = 32  # the tiny Llama's hidden size (conftest.make_tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_text_encoder(tiny_encoder_dir):
    return str(tiny_encoder_dir)


def _scenario(lp: LengthPredictor) -> str | None:
    """A scenario of the training benchmark for the predictors that read it (the per-scenario floors)."""
    return min(g for g in lp.card_ if g != "overall") if lp.predictor_.reads().scenario else None


def _fit(method: str, tiny_bench, tiny_model_dir, encoder: str, monkeypatch) -> LengthPredictor:
    """``method`` fitted on the tiny benchmark (2 epochs; text proxies fine-tune the tiny encoder for 1 epoch)."""
    import functools

    import lenpred.tuning

    monkeypatch.setattr(lenpred.tuning, "TuningSettings", functools.partial(
        lenpred.tuning.TuningSettings, proxy_encoder=encoder, proxy_epochs=1))
    bench, data, root = tiny_bench
    return LengthPredictor(method, str(tiny_model_dir), layers=(1, -1), coverage=0.5, epochs=2).fit(
        bench, data_dir=str(data), cache=str(root / "cache"))


@pytest.mark.parametrize("method", sorted(PREDICTORS))
def test_every_registered_predictor_keeps_the_contract(method, tiny_bench, tiny_model_dir, tiny_text_encoder, tmp_path,
                                                       monkeypatch, one_torch_thread):
    assert not PREDICTORS[method].__abstractmethods__  # fit, predict, _get_state, _set_state all implemented
    if make_predictor(method).reads().self_report:  # PiA must generate per prompt: refused, with the reason
        with pytest.raises(LenpredError, match="self-report"):
            _fit(method, tiny_bench, tiny_model_dir, tiny_text_encoder, monkeypatch)
        return
    lp = _fit(method, tiny_bench, tiny_model_dir, tiny_text_encoder, monkeypatch)
    before = lp.predict(PROMPTS, CAP, _scenario(lp))
    for p in before:
        assert 0 <= p.low <= p.high <= CAP and 0 <= p.expected <= CAP and p.max_new_tokens == CAP
    loaded = LengthPredictor.from_pretrained(lp.save_pretrained(tmp_path / "p"), backbone=lp.backbone_)
    assert loaded.predictor_.reads() == lp.predictor_.reads() and loaded.config_ == lp.config_
    assert loaded.predictor_.n_features_in_ == lp.predictor_.n_features_in_
    assert [p.to_dict(True) for p in loaded.predict(PROMPTS, CAP, _scenario(lp))] == [p.to_dict(True) for p in before]
    _check_reads(lp, method)
    _check_head(lp)


def _check_reads(lp: LengthPredictor, method: str) -> None:
    """What the predictor declares it reads is what its config records, what its forward computes (the cheapest
    forward predicts as the full prefill does) and what an engine may feed it."""
    reads = lp.predictor_.reads()
    assert lp.config_.layers == ([] if reads.layer is None else [reads.layer])
    assert lp.config_.semantic == reads.semantic_score
    assert reads.inputs == make_predictor(method).reads().inputs  # what a loader asks of it, before fitting
    assert ("signals" in reads.inputs) == (reads.layer is not None)
    cheapest, full = lp.predict(PROMPTS, CAP, _scenario(lp)), lp.predict(PROMPTS, CAP, _scenario(lp), truncated=False)
    assert [p.expected for p in cheapest] == pytest.approx([p.expected for p in full], abs=1e-4)
    if reads.last_token:  # an engine's captured last-token state gives the same predictions (the vLLM plug-in)
        predictions, features = lp.predict(PROMPTS, CAP, _scenario(lp), return_features=True)
        states = lp.predict_states(features, [p.num_prompt_tokens for p in predictions], [CAP] * len(PROMPTS))
        assert [p.to_dict(True) for p in states] == [p.to_dict(True) for p in predictions]
    else:
        assert lp.engine_layer is None
        with pytest.raises(LenpredError, match="reads more than one last-token state"):
            lp.predict_states([[0.0]], [1], [CAP])
    if not reads.features:
        with pytest.raises(LenpredError, match="has no feature head"):
            lp.predict(PROMPTS, CAP, _scenario(lp), return_features=True)


def _check_head(lp: LengthPredictor) -> None:
    """A predictor that reads hidden states reads ``n_features_in_``-wide features (the tiny model's hidden size); a
    feature head maps them to a length distribution; the others say by name that they do not."""
    predictor, reads = lp.predictor_, lp.predictor_.reads()
    requests = lp.prepare(PROMPTS, CAP)
    attach_prefill_signals(lp.backbone_, requests, reads)
    if reads.layer is not None:  # pooled heads, TRAIL, the ranking score
        assert predictor.n_features_in_ == TINY_HIDDEN_SIZE
        assert predictor.features(requests).shape == (len(PROMPTS), TINY_HIDDEN_SIZE)
    else:
        assert predictor.n_features_in_ is None
        with pytest.raises(NotImplementedError, match=f"'{predictor.registry_name}' \\({type(predictor).__name__}\\)"):
            predictor.features(requests)
    if not reads.features:
        with pytest.raises(NotImplementedError, match=f"'{predictor.registry_name}'"):
            predictor.distribution_from_features(np.zeros((1, TINY_HIDDEN_SIZE), np.float32), np.array([CAP]))
        return
    probs, values = predictor.distribution_from_features(predictor.features(requests), np.array([CAP, np.inf]))
    assert probs.shape == values.shape and probs.shape[0] == len(PROMPTS)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    assert values[0].max() <= CAP and (np.diff(values, axis=1) >= 0).all()
    if lp.engine_layer is not None:  # an engine's states must be n_features_in_ wide
        with pytest.raises(LenpredError, match=f"needs \\(1, {TINY_HIDDEN_SIZE}\\) states"):
            lp.predict_states(np.zeros((1, TINY_HIDDEN_SIZE + 1), np.float32), [1], [CAP])
