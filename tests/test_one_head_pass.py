"""One head pass per request on every predict path (issue 29): the head's forward is counted with a hook, and the
one-pass numbers are checked against the former two-pass formulas (``predict`` for the expectation, then
``predict_distribution`` for the quantiles), to the bit."""

import numpy as np
import pytest
from conftest import TINY_PROMPTS, fit_tiny_predictor

from lenpred.errors import LenpredError
from lenpred.intervals import distribution_quantiles, widened_interval
from lenpred.online.adaptive import AdaptiveConfig
from lenpred.online.learning import OnlineLearning
from lenpred.prediction import raw_quantiles


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
    requests = lp.prepare(TINY_PROMPTS, max_new_tokens)
    lp.attach_states(requests)
    return requests


def _states(lp):
    requests = _with_signals(lp)
    return lp.predictor_.features(requests), [r.num_prompt_tokens for r in requests]


PATHS = {
    "predict": lambda lp: lp.predict(TINY_PROMPTS, 16),
    "predict uncapped": lambda lp: lp.predict(TINY_PROMPTS),
    "predict_prepared truncated": lambda lp: lp.predict_prepared(lp.prepare(TINY_PROMPTS, 16)),
    "predict_prepared full": lambda lp: lp.predict_prepared(lp.prepare(TINY_PROMPTS, 16), truncated=False),
    "predict_states": lambda lp: lp.predict_states(*_states(lp), [16, None, 5]),
    "raw_quantiles": lambda lp: raw_quantiles(lp.predictor_, _with_signals(lp), lp.coverage),
    "OnlineLearning.predict": lambda lp: OnlineLearning(lp).predict(_states(lp)[0], max_new_tokens=16),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_predict_path_runs_the_head_once(last, one_torch_thread, path):
    with HeadCalls(last) as rows:
        out = PATHS[path](last)
    assert rows == [3]  # one forward over the three requests
    assert len(out) == (6 if path == "raw_quantiles" else 3)


def test_a_pooling_predictor_runs_the_head_once_too(tiny_backbone, one_torch_thread):
    egtp = fit_tiny_predictor(tiny_backbone, "egtp", 1)  # entropy weights: the full prefill path
    with HeadCalls(egtp) as rows:
        egtp.predict(TINY_PROMPTS, 16)
    assert rows == [3]


def test_one_pass_gives_the_two_pass_numbers_to_the_bit(last, one_torch_thread):
    requests = _with_signals(last)
    caps = np.full(3, 16.0)
    want_expected = np.clip(last.predictor_.predict(requests), 0, caps)
    probs, values = last.predictor_.predict_distribution(requests)
    tail = (1 - last.coverage) / 2  # 0.09999999999999998 for 0.8, as the former raw_quantiles computed it
    q = distribution_quantiles(probs, values, (tail, 0.5, 1 - tail))
    want_low, want_high = widened_interval(q[:, 0], q[:, 2], last.margin_, caps)
    got = last.predict(TINY_PROMPTS, 16)
    assert [p.expected for p in got] == want_expected.tolist()
    assert [p.median for p in got] == np.minimum(q[:, 1], 16).tolist()
    assert [p.low for p in got] == want_low.tolist() and [p.high for p in got] == want_high.tolist()
    assert [p.low_raw for p in got] == q[:, 0].tolist() and [p.bin_probs for p in got] == probs.tolist()
    assert "low_raw" not in got[0].to_dict(True)  # the CLI's output is unchanged


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
    again = online.predict(X, max_new_tokens=16)  # the features-only path: one more pass, the same numbers
    assert [(a.low_raw, a.high_raw, a.expected) for a in again] == [(s.low_raw, s.high_raw, s.expected) for s in served]
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
