"""The truncated prefill (forward stopped at the predictor's layer, no LM head) gives the full path's hidden states
and predictions, so LengthPredictor.predict takes it for hidden-state-only predictors: on the tiny model, and (slow)
on the shipped predictor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lenpred.pipeline import LengthPredictor
from lenpred.signals import extract_signals
from lenpred.predictors import Reads
from lenpred.truncated import PrefixCache, TruncatedPlan, truncated_hidden_states, truncated_plan

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
def test_predict_takes_the_truncated_forward_with_the_full_prefills_predictions(tiny_backbone, one_torch_thread,
                                                                                 method, layer, monkeypatch):
    import lenpred.truncated as forward

    lp = _fitted(tiny_backbone, method, layer)
    assert truncated_plan(lp.predictor_.reads(), 2) == TruncatedPlan(layer, 2)
    want = lp.predict(PROMPTS, 16, truncated=False)
    monkeypatch.setattr(forward, "attach_signals", None)  # predict must not run the full prefill now
    for cache in (None, PrefixCache()):
        got = lp.predict(PROMPTS, 16, prefix_cache=cache)
        for w, g in zip(want, got):
            assert (g.expected, g.median, g.low, g.high) == pytest.approx((w.expected, w.median, w.low, w.high),
                                                                          abs=1e-4)
            assert g.num_prompt_tokens == w.num_prompt_tokens


@pytest.mark.parametrize("reads,plan", [
    (Reads(1, last_token=True), TruncatedPlan(1, 2)),
    (Reads(2), TruncatedPlan(2, 2)),  # L: the final norm is applied
    (Reads(1, semantic_score=True), None),  # attention: the full prefill
    (Reads(1, token_entropy=True), None),  # entropy: the LM head over every position
    (Reads(-1), None),  # counted from the end: the full path resolves it
    (Reads(0), None),  # the embeddings (some models scale them inside the forward)
    (Reads(3), None),  # past the model's depth
    (Reads(), None),  # no hidden states (text, prompt length)
])
def test_the_plan_follows_what_the_predictor_reads(reads, plan):
    assert truncated_plan(reads, 2) == plan


def test_an_entropy_predictor_runs_the_full_prefill(tiny_backbone, one_torch_thread):
    egtp = _fitted(tiny_backbone, "egtp", 1)  # entropy weights: the LM head is needed
    assert egtp.predictor_.reads() == Reads(1, token_entropy=True, features=True)
    got = egtp.predict(PROMPTS, 16)
    assert [g.expected for g in got] == [w.expected for w in egtp.predict(PROMPTS, 16, truncated=False)]


@pytest.mark.slow
def test_shipped_predictor_predict_equals_the_full_prefill():
    lp = LengthPredictor.from_pretrained(threads=1)
    assert truncated_plan(lp.predictor_.reads(), lp.backbone_.num_layers) == TruncatedPlan(15, 30)
    prompts = ["What is the capital of France?", "Write a long story about a dragon who learns to sing.",
               [{"role": "user", "content": "Solve 12 * 7 step by step."}]]
    fields = lambda out: [v for p in out for v in (p.expected, p.median, p.low, p.high)]  # noqa: E731
    want = fields(lp.predict(prompts, 256, truncated=False))
    cache = PrefixCache()
    for got in (lp.predict(prompts, 256), lp.predict(prompts, 256, prefix_cache=cache)):  # SmolLM2's system prompt
        assert fields(got) == pytest.approx(want, abs=1e-3)
    assert len(cache._entries) == 1


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
    from lenpred.online.learning import OnlineLearning
    from lenpred.serving.proxy.batching import LengthPredictorService

    lp = _fitted(tiny_backbone, "last", 2)
    service = LengthPredictorService(lp, tokenizers=1, online=OnlineLearning(lp))
    items = [service.prepare(PROMPTS[:2], 16)] + [service.prepare([p], 16, group="a") for p in PROMPTS]
    values = service.predict_batch(items)  # the two-prompt request first: the rows of the others shift by two
    want, features = lp.predict(PROMPTS, 16, truncated=False, return_features=True)
    assert values[1:] == pytest.approx([p.expected for p in want], abs=1e-4)
    for item, p, f in zip(items[1:], want, features):
        s = item.served
        assert (s.expected, s.low, s.high) == pytest.approx((p.expected, p.low, p.high), abs=1e-3)
        assert s.max_new_tokens == 16 and s.group == "a" and s.num_prompt_tokens == item.num_tokens
        np.testing.assert_allclose(s.features, f, rtol=0, atol=1e-5)
    assert items[0].served is None
