"""The last prediction stage (lenpred.prediction): one head pass per request on every predict path (issue 29; the
head's forward is counted with a hook), and the numbers every path serves checked against a hand-worked
distribution: the tiny predictor's head is set to give the same bin probabilities for any input."""

import numpy as np
import pytest
from conftest import TINY_PROMPTS, attach_full_prefill, fit_tiny_predictor

from lenpred.errors import LenpredError
from lenpred.online.adaptive import AdaptiveConfig
from lenpred.online.learning import OnlineLearning


class HeadCalls:
    """Rows of every forward call of ``lp``'s head module while in the ``with`` block."""

    def __init__(self, lp):
        self.module, self.rows = lp.predictor_.head_.module_, []

    def __enter__(self):
        self.handle = self.module.register_forward_hook(lambda m, inputs, out: self.rows.append(len(inputs[0])))
        return self.rows

    def __exit__(self, *exc):
        self.handle.remove()


@pytest.fixture(scope="module")
def last(tiny_backbone):
    return fit_tiny_predictor(tiny_backbone, "last", 1)  # engine_layer 1: predict_states works


def _with_signals(lp, max_new_tokens=16):
    return attach_full_prefill(lp.backbone_, lp.prepare(TINY_PROMPTS, max_new_tokens), 1)


def _states(lp):
    requests = _with_signals(lp)
    return lp.predictor_.features(requests), [r.num_prompt_tokens for r in requests]


PATHS = {
    "predict": lambda lp: lp.predict(TINY_PROMPTS, 16),
    "predict uncapped": lambda lp: lp.predict(TINY_PROMPTS),
    "predict full prefill": lambda lp: lp.predict(TINY_PROMPTS, 16, truncated=False),
    "predict prepared": lambda lp: lp.predict(lp.prepare(TINY_PROMPTS, 16)),
    "predict with features": lambda lp: lp.predict(TINY_PROMPTS, 16, return_features=True)[0],
    "predict_states": lambda lp: lp.predict_states(*_states(lp), [16, None, 5]),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_predict_path_runs_the_head_once(last, one_torch_thread, path):
    with HeadCalls(last) as rows:
        out = PATHS[path](last)
    assert rows == [3] and len(out) == 3  # one forward over the three requests


def test_a_pooling_predictor_runs_the_head_once_too(tiny_backbone, one_torch_thread):
    egtp = fit_tiny_predictor(tiny_backbone, "egtp", 1)  # entropy weights: the full prefill path
    with HeadCalls(egtp) as rows:
        egtp.predict(TINY_PROMPTS, 16)
    assert rows == [3]


@pytest.fixture(scope="module")
def fixed(tiny_backbone):
    """The tiny ``last@1`` predictor with its head set by hand: the last linear layer's weights are zero and its bias
    ``log p``, so every request gets ``p = (0.1, 0.2, 0.3, 0.4)`` over bin centres ``(10, 20, 30, 80)`` tokens; margin
    1.5 tokens, coverage 0.8."""
    import torch

    lp = fit_tiny_predictor(tiny_backbone, "last", 1)
    head = lp.predictor_.head_
    final = head.module_.net[-1]
    with torch.no_grad():
        final.weight.zero_()
        final.bias.copy_(torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4])))
    head.centres_ = np.array([10.0, 20.0, 30.0, 80.0])
    return lp


# Hand-worked, p = (.1, .2, .3, .4): the quantile of level q interpolates the bin values at the mid-CDF points
# F - p/2 = (.05, .2, .45, .8), clamped beyond them (lenpred.intervals.distribution_quantiles); the interval is
# [low_raw - 1.5, high_raw + 1.5] clipped to [0, cap].
#   cap 40: values (10, 20, 30, 40); expected 1 + 4 + 9 + 16 = 30; median (q .5) 30 + 10 * .05/.35;
#           low_raw (q .1) 10 + 10 * .05/.15; high_raw (q .9, past .8) 40, + 1.5 clipped to 40
#   no cap: values (10, 20, 30, 80); expected 1 + 4 + 9 + 32 = 46; median 30 + 50 * .05/.35; high_raw 80
#   cap 5:  every value 5: expected, median and the raw quantiles 5; low 3.5
HAND = {40: (30.0, 30 + 10 / 7, 10 + 10 / 3 - 1.5, 40.0, 10 + 10 / 3, 40.0),
        None: (46.0, 30 + 50 / 7, 10 + 10 / 3 - 1.5, 81.5, 10 + 10 / 3, 80.0),
        5: (5.0, 5.0, 3.5, 5.0, 5.0, 5.0)}


def _numbers(p):
    return (p.expected, p.median, p.low, p.high, p.low_raw, p.high_raw)


@pytest.mark.parametrize("cap", [40, None, 5])
def test_predict_serves_the_hand_worked_distribution(fixed, one_torch_thread, cap):
    for path in (lambda: fixed.predict(TINY_PROMPTS, cap), lambda: fixed.predict(TINY_PROMPTS, cap, truncated=False),
                 lambda: fixed.predict(fixed.prepare(TINY_PROMPTS, cap))):
        got = path()
        for p in got:
            assert _numbers(p) == pytest.approx(HAND[cap], abs=1e-5) and p.max_new_tokens == cap
            assert p.bin_probs == pytest.approx([0.1, 0.2, 0.3, 0.4], abs=1e-6)
    assert "low_raw" not in got[0].to_dict(True)  # the CLI's output is unchanged


def test_predict_states_serves_the_hand_worked_distribution(fixed, one_torch_thread):
    X, lengths = _states(fixed)
    got = fixed.predict_states(X, lengths, [40, None, 5])
    for p, cap in zip(got, (40, None, 5)):
        assert _numbers(p) == pytest.approx(HAND[cap], abs=1e-5) and p.max_new_tokens == cap


def test_head_quantiles_of_a_bare_head_are_the_same_numbers(fixed, one_torch_thread):
    from lenpred.prediction import head_quantiles

    X, _ = _states(fixed)
    expected, low_raw, high_raw = head_quantiles(fixed.predictor_.head_, X, np.array([40.0, np.inf, 5.0]), 0.8)
    want = [HAND[c] for c in (40, None, 5)]
    assert expected.tolist() == pytest.approx([w[0] for w in want], abs=1e-5)
    assert low_raw.tolist() == pytest.approx([w[4] for w in want], abs=1e-5)
    assert high_raw.tolist() == pytest.approx([w[5] for w in want], abs=1e-5)


@pytest.mark.parametrize("adaptive", [None, "aci", "rolling"])
def test_predict_states_then_online_learning_runs_the_head_once(last, one_torch_thread, adaptive):
    """The plug-in's sequence: predict_states for the new requests, then OnlineLearning.serve per request with the
    prediction it made (scheduler.py); nothing runs the head again."""
    X, lengths = _states(last)
    online = OnlineLearning(last, adaptive=None if adaptive is None else AdaptiveConfig(method=adaptive))
    with HeadCalls(last) as rows:
        preds = last.predict_states(X, lengths, [16, 16, 16])
        served = [online.serve(X[i], [p])[0] for i, p in enumerate(preds)]
    assert rows == [3]
    for s, p in zip(served, preds):  # fixed margin (or the adaptive one's initial = the fixed one)
        assert (s.low, s.high, s.expected) == (p.low, p.high, p.expected)
        assert (s.low_raw, s.high_raw, s.num_prompt_tokens, s.max_new_tokens) == (p.low_raw, p.high_raw,
                                                                                  p.num_prompt_tokens, 16)
    np.testing.assert_array_equal(np.stack([s.features for s in served]), X)


def test_serve_refuses_predictions_that_do_not_match_the_rows(last, one_torch_thread):
    X, lengths = _states(last)
    preds = last.predict_states(X, lengths, [16, 16, 16])
    with pytest.raises(LenpredError, match="one LengthPrediction with low_raw / high_raw per feature row, got 2"):
        OnlineLearning(last).serve(X, preds[:2])


def test_the_proxy_with_online_learning_runs_the_head_once(last, one_torch_thread, monkeypatch):
    """``lenpred serve``'s batch path (``LengthPredictorService`` with traffic learning on): the served interval
    reuses the batch's head pass instead of a second one per request, and the features it logs are the ones the
    head read (pooled once); a cap too long for the window is served as the cap (the prediction is made uncapped,
    then clipped)."""
    from lenpred.serving.proxy.batching import LengthPredictorService

    service = LengthPredictorService(last, tokenizers=1, online=OnlineLearning(last))
    items = [service.prepare([p], 16) for p in TINY_PROMPTS]
    pooled, features = [], last.predictor_.features
    monkeypatch.setattr(last.predictor_, "features", lambda requests: pooled.append(len(requests)) or features(requests))
    with HeadCalls(last) as rows:
        values = service.predict_batch(items)
    assert rows == [3] and pooled == [3]
    want = last.predict(TINY_PROMPTS, 16)  # the full forward: the truncated one agrees to float32 rounding
    assert values == pytest.approx([p.expected for p in want], rel=1e-5)
    assert [v for i in items for v in (i.served.low, i.served.high)] == \
        pytest.approx([v for p in want for v in (p.low, p.high)], rel=1e-5)
    assert [i.served.max_new_tokens for i in items] == [16, 16, 16]
