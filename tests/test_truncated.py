"""The truncated prefill (forward stopped at the predictor's layer, no LM head) gives the full path's hidden states
and LengthPredictor.predict's predictions: on the tiny model, and (slow) on the shipped predictor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lenpred.pipeline import LengthPredictor
from lenpred.signals import extract_signals
from lenpred.truncated import PrefixCache, truncated_hidden_states, truncated_plan

from conftest import TINY_PROMPTS, fit_tiny_predictor

PROMPTS = TINY_PROMPTS
_fitted = fit_tiny_predictor


@pytest.mark.parametrize("layer", [1, 2])
def test_truncated_states_equal_the_full_forward(tiny_backbone, one_torch_thread, layer):
    ids = [r.token_ids for r in _fitted(tiny_backbone, "last", layer).prepare(PROMPTS)]
    full = extract_signals(tiny_backbone, ids, [layer], semantic=False)
    cut = truncated_hidden_states(tiny_backbone, ids, layer)
    for f, c, i in zip(full, cut, ids):
        assert c.shape == (len(i), 32) and c.dtype == torch.float32
        torch.testing.assert_close(c, f.layer(layer), rtol=0, atol=1e-6)


@pytest.mark.parametrize("layer", [1, 2])
def test_the_shared_prefix_from_the_cache_gives_the_same_states(tiny_backbone, one_torch_thread, layer):
    requests = _fitted(tiny_backbone, "last", layer).prepare(PROMPTS)
    ids = [r.token_ids for r in requests]
    prefix_len = min(r.content_span[0] for r in requests)
    assert prefix_len == 2 and all(i[:2] == ids[0][:2] for i in ids)  # "<s> user" opens every tiny prompt
    cache = PrefixCache()
    plain = truncated_hidden_states(tiny_backbone, ids, layer)
    for _ in range(2):  # computed, then read from the cache
        cached = truncated_hidden_states(tiny_backbone, ids, layer, prefix_len, cache)
        for p, c in zip(plain, cached):
            torch.testing.assert_close(c, p, rtol=0, atol=1e-5)
    assert len(cache._entries) == 1
    other = truncated_hidden_states(tiny_backbone, [ids[0], [5] + ids[1]], layer, prefix_len, cache)  # no shared prefix
    torch.testing.assert_close(other[0], plain[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("method,layer", [("last", 1), ("mean", 2), ("max", 1), ("trail", 1), ("trail", 2)])
def test_truncated_predictions_equal_predict(tiny_backbone, one_torch_thread, method, layer):
    lp = _fitted(tiny_backbone, method, layer)
    assert truncated_plan(lp).layer == layer
    want = lp.predict(PROMPTS, 16)
    for cache in (None, PrefixCache()):
        got = lp.predict_prepared(lp.prepare(PROMPTS, 16), prefix_cache=cache)
        for w, g in zip(want, got):
            assert g.expected == pytest.approx(w.expected, abs=1e-4) and g.high == pytest.approx(w.high, abs=1e-4)
            assert g.num_prompt_tokens == w.num_prompt_tokens


def test_plan_is_none_for_predictors_that_read_more(tiny_backbone, one_torch_thread):
    lp = _fitted(tiny_backbone, "last", 1)
    lp.config_ = {"layers": [1], "semantic": True}
    assert truncated_plan(lp) is None
    egtp = _fitted(tiny_backbone, "egtp", 1)  # entropy weights: the LM head is needed
    assert truncated_plan(egtp) is None
    got = egtp.predict_prepared(egtp.prepare(PROMPTS, 16))  # the full path then runs
    assert [g.expected for g in got] == pytest.approx([w.expected for w in egtp.predict(PROMPTS, 16)])


@pytest.mark.slow
def test_shipped_predictor_truncated_equals_predict():
    lp = LengthPredictor.from_pretrained(threads=1)
    plan = truncated_plan(lp)
    assert plan is not None and (plan.layer, plan.num_layers) == (15, 30)
    prompts = ["What is the capital of France?", "Write a long story about a dragon who learns to sing.",
               [{"role": "user", "content": "Solve 12 * 7 step by step."}]]
    want = [w.expected for w in lp.predict(prompts, 256)]
    assert [g.expected for g in lp.predict_prepared(lp.prepare(prompts, 256))] == pytest.approx(want, abs=1e-3)
    cache = PrefixCache()
    got = lp.predict_prepared(lp.prepare(prompts, 256), prefix_cache=cache)  # SmolLM2's system prompt, cached
    assert [g.expected for g in got] == pytest.approx(want, abs=1e-3) and len(cache._entries) == 1


def test_the_proxy_service_tokenises_concurrently_like_serially(tiny_backbone, one_torch_thread):
    """Copies of the tokenizer from a pool (a fast tokenizer is not safe to share: split_special_tokens is set on it
    per call); more threads than copies; the batch gives predict's values."""
    from concurrent.futures import ThreadPoolExecutor

    from lenpred.serving.proxy.batching import LengthPredictorService

    lp = _fitted(tiny_backbone, "last", 2)
    service = LengthPredictorService(lp, tokenizers=2)
    prompts = PROMPTS * 8
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda p: service.prepare([p], 16), prompts))
    assert [g.payload[0][0].token_ids for g in got] == [r.token_ids for r in lp.prepare(prompts, 16)]
    want = [p.expected for p in lp.predict(PROMPTS, 16)]
    assert service.predict_batch(got[:3]) == pytest.approx(want, abs=1e-4)


def test_the_proxy_service_serves_the_interval_and_features_of_the_same_pass(tiny_backbone, one_torch_thread):
    """With online learning on, each single-prompt request carries its ServedPrediction: predict's expected value
    and interval (fixed margin), and the features the head read (what the traffic log stores); a request of several
    prompts carries none."""
    from lenpred.online.learning import OnlineLearning, prompt_features
    from lenpred.serving.proxy.batching import LengthPredictorService

    lp = _fitted(tiny_backbone, "last", 2)
    service = LengthPredictorService(lp, tokenizers=1, online=OnlineLearning(lp))
    items = [service.prepare(PROMPTS[:2], 16)] + [service.prepare([p], 16, group="a") for p in PROMPTS]
    values = service.predict_batch(items)  # the two-prompt request first: the rows of the others shift by two
    want = lp.predict(PROMPTS, 16)
    assert values[1:] == pytest.approx([p.expected for p in want], abs=1e-4)
    for item, p, f in zip(items[1:], want, prompt_features(lp, PROMPTS, 16)):
        s = item.served
        assert (s.expected, s.low, s.high) == pytest.approx((p.expected, p.low, p.high), abs=1e-3)
        assert s.max_new_tokens == 16 and s.group == "a" and s.num_prompt_tokens == item.num_tokens
        np.testing.assert_allclose(s.features, f, rtol=0, atol=1e-5)
    assert items[0].served is None
