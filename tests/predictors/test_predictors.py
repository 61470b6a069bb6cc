"""Unit tests of lenpred.predictors on small fake prefill signals (no model is loaded)."""

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from lenpred.errors import LenpredError
from lenpred.pooling import POOLERS
from lenpred.predictors import PREDICTORS, Predictor, Reads, Request, make_predictor, num_prompt_tokens, required_inputs
from lenpred.signals import PromptSignals

LAYERS = (0, 2)
D = 6


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fake_signals(n: int, seed: int, layers=LAYERS) -> Request:
    """A request of ``n`` tokens carrying random prefill signals."""
    g = torch.Generator().manual_seed(seed)
    signals = PromptSignals(hidden_states=torch.randn(len(layers), n, D, generator=g),
                            token_entropy=torch.rand(n, generator=g) * 3,
                            attention_received=torch.rand(n, generator=g),
                            layers=layers, last_token_states=torch.randn(3, D, generator=g))
    return Request(f"fake/{seed}", list(range(n)), signals=signals, self_report=f"{10 * n} words",  # pia reads it
                   scenario="ab"[seed % 2])


@pytest.fixture(scope="module")
def train_set():
    signals = [fake_signals(2 + i % 5, seed=i) for i in range(12)]
    y = np.array([5.0, 40.0, 12.0, 90.0, 33.0, 7.0, 61.0, 18.0, 25.0, 150.0, 3.0, 48.0])
    return signals, y


def test_num_prompt_tokens():
    np.testing.assert_array_equal(num_prompt_tokens([fake_signals(3, 0), fake_signals(7, 1)]), [3.0, 7.0])


def test_registry_holds_floors_and_every_pooler():
    assert {"global_median", "prompt_length"} | set(POOLERS) <= set(PREDICTORS)


def test_global_median_predicts_training_median():
    sig = [fake_signals(3, i) for i in range(4)]
    # even count: median of [1, 2, 3, 10] = (2 + 3) / 2 = 2.5
    model = make_predictor("global_median").fit(sig, np.array([10.0, 1.0, 3.0, 2.0]))
    np.testing.assert_array_equal(model.predict([fake_signals(9, 9)] * 3), [2.5, 2.5, 2.5])
    # odd count: median of [1, 5, 100] = 5
    model = make_predictor("global_median").fit(sig[:3], np.array([100.0, 1.0, 5.0]))
    np.testing.assert_array_equal(model.predict(sig), [5.0] * 4)


def test_prompt_length_fits_exact_line():
    # prompts of n = 2..6 tokens with y = 3 n + 5 -> [11, 14, 17, 20, 23]
    sig = [fake_signals(n, n) for n in range(2, 7)]
    model = make_predictor("prompt_length").fit(sig, np.array([11.0, 14.0, 17.0, 20.0, 23.0]))
    # n = 10 -> 35, n = 1 -> 8
    np.testing.assert_allclose(model.predict([fake_signals(10, 0), fake_signals(1, 1)]), [35.0, 8.0], atol=1e-9)


def test_prompt_length_clips_at_zero():
    # y = 30 - 10 n on n = 1..3 -> [20, 10, 0]; n = 10 would give -70 -> clipped to 0; n = 2 -> 10
    sig = [fake_signals(n, n) for n in (1, 2, 3)]
    model = make_predictor("prompt_length").fit(sig, np.array([20.0, 10.0, 0.0]))
    np.testing.assert_allclose(model.predict([fake_signals(10, 0), fake_signals(2, 0)]), [0.0, 10.0], atol=1e-9)


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_save_load_round_trip(name, train_set, tmp_path):
    if make_predictor(name).reads().text:
        pytest.skip("text-proxy predictors need a text encoder: round trip in tests/predictors/test_text_proxies.py")
    signals, y = train_set
    params = {"head": {"epochs": 3, "num_bins": 4}} if make_predictor(name).reads().layer is not None else {}
    model = make_predictor(name, **params).fit(signals, y)
    test = [fake_signals(3 + i, seed=100 + i) for i in range(4)]
    before = model.predict(test)
    assert before.shape == (4,)
    assert np.all(np.isfinite(before))
    path = tmp_path / "model.safetensors"
    model.save(path)
    loaded = Predictor.load(path)
    assert type(loaded) is type(model)
    assert loaded.params == model.params
    np.testing.assert_array_equal(loaded.predict(test), before)
    # the feature width, fitted and loaded: the fake signals' D for a predictor of hidden states, else none
    assert model.n_features_in_ == loaded.n_features_in_ == (D if model.reads().layer is not None else None)


def test_load_names_the_loader_of_a_saved_predictor_directory(tmp_path):
    # a LengthPredictor directory (the shipped one's layout) is not one head's file: the message says what loads it
    (tmp_path / "predictor.safetensors").write_bytes(b"")
    with pytest.raises(LenpredError, match="is a directory: .* loads with lenpred.LengthPredictor.from_pretrained"):
        Predictor.load(tmp_path)
    with pytest.raises(LenpredError, match="is not a readable lenpred predictor .SafetensorError"):
        Predictor.load(tmp_path / "predictor.safetensors")  # an empty file: not a predictor


def test_pooled_predictor_predictions_lie_within_training_range(train_set):
    # expected value over bin centres (means of training lengths) stays within [min y, max y]
    signals, y = train_set
    pred = make_predictor("egtp", head={"epochs": 3}).fit(signals, y).predict(signals)
    assert np.all(pred >= y.min()) and np.all(pred <= y.max())


def test_pooled_predictor_layer_selection(train_set):
    signals, y = train_set
    # layer=-1 means the last held index (2), layer=0 the embeddings; features differ accordingly
    last = make_predictor("mean", layer=-1)
    first = make_predictor("mean", layer=0)
    torch.testing.assert_close(torch.from_numpy(last.features(signals[:1]))[0], signals[0].signals.hidden_states[1].mean(0))
    torch.testing.assert_close(torch.from_numpy(first.features(signals[:1]))[0],
                               signals[0].signals.hidden_states[0].mean(0))
    with pytest.raises(LenpredError, match="layer 1"):
        make_predictor("mean", layer=1).features(signals[:1])


def test_make_predictor_unknown_name_lists_valid_ones():
    with pytest.raises(LenpredError) as err:
        make_predictor("oracle")
    assert "oracle" in str(err.value)
    assert "global_median" in str(err.value) and "egtp" in str(err.value)


def test_load_garbage_file_raises(tmp_path):
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(LenpredError, match="garbage.safetensors"):
        Predictor.load(path)


def test_scenario_floors_hand_values():
    sig = [fake_signals(n, seed) for seed, n in enumerate((2, 3, 4, 5, 6, 7))]  # scenarios a b a b a b by seed
    y = np.array([10.0, 100.0, 20.0, 300.0, 60.0, 200.0])
    # medians: b (seeds 0, 2, 4): 10, 20, 60 -> 20; a (seeds 1, 3, 5): 100, 300, 200 -> 200
    median = make_predictor("scenario_median").fit(sig, y)
    np.testing.assert_array_equal(median.predict(sig[:2]), [20.0, 200.0])
    unseen = Request("u/0", [1, 2], scenario="c")
    np.testing.assert_array_equal(median.predict([unseen]), [np.median(y)])  # unknown scenario: pooled median
    # per-scenario lines: b has n = 2, 4, 6 -> y = 10, 20, 60 (slope 12.5, intercept -20 by least squares)
    line = make_predictor("scenario_prompt_length").fit(sig, y)
    np.testing.assert_allclose(line.predict([fake_signals(8, 10)]), [12.5 * 8 - 20 + 0.0], atol=1e-9)
    with pytest.raises(LenpredError, match="needs Request.scenario"):
        median.predict([Request("x", [1])])


def test_load_missing_file_raises(tmp_path):
    with pytest.raises(LenpredError):
        Predictor.load(tmp_path / "absent.safetensors")


def test_load_foreign_safetensors_raises(tmp_path):
    # a valid safetensors file without lenpred's header
    path = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(LenpredError):
        Predictor.load(path)


def test_content_span_pools_only_the_users_content():
    from lenpred.predictors import make_predictor
    from lenpred.signals import PromptSignals

    h = torch.tensor([[[100.0, 100.0], [1.0, 2.0], [3.0, 6.0], [50.0, 50.0]]])  # (1 layer, n=4, d=2)
    s = Request("p/0", [0, 1, 2, 3], signals=PromptSignals(h, torch.zeros(4), torch.ones(4), (1,)), content_span=(1, 3))
    # mean over the content tokens 1..2 only (template text before and after skipped): [(1+3)/2, (2+6)/2]
    assert make_predictor("mean", layer=1, pool_span="content").features([s]).tolist() == [[2.0, 4.0]]
    assert make_predictor("mean", layer=1, pool_span="all").features([s])[0].tolist() == pytest.approx([154 / 4, 158 / 4])
    # after the prefix: content + the template's suffix token
    assert make_predictor("mean", layer=1).features([s])[0].tolist() == pytest.approx([54 / 3, 58 / 3])
    with pytest.raises(LenpredError, match="unknown pool_span 'middle'; valid: content, after_prefix, all"):
        make_predictor("mean", layer=1, pool_span="middle").features([s])


def test_features_pool_each_shared_request_once():
    # two samples of one prompt share a Request: pooled once, the row repeated
    r0, r1 = fake_signals(4, 0), fake_signals(5, 1)
    p = make_predictor("mean", layer=0)
    feats = p.features([r0, r1, r0])
    np.testing.assert_array_equal(feats[0], feats[2])
    torch.testing.assert_close(torch.from_numpy(feats[1]), r1.signals.hidden_states[0].mean(0))


def test_pooled_predictor_without_signals_names_the_fix():
    with pytest.raises(LenpredError, match="prefill signals"):
        make_predictor("egtp").fit([Request("p/0", [1, 2, 3])] * 2, np.array([1.0, 2.0]))


def test_reads_names_the_inputs_a_loader_provides():
    assert Reads().inputs == ()  # token ids only: the floors
    assert Reads(1).inputs == ("signals",) and Reads(token_entropy=True).inputs == ("signals",)
    assert Reads(text=True, scenario=True).inputs == ("text", "scenario")
    assert Reads(2, self_report=True).inputs == ("signals", "self_report")
    assert required_inputs(("last", "ssjf_reg", "pia", "scenario_median", "global_median")) == {
        "signals", "text", "self_report", "scenario"}
    assert required_inputs(("global_median", "prompt_length")) == set()
    with pytest.raises(LenpredError, match="unknown predictor 'oracle'; valid predictors: .*egtp"):
        required_inputs(("oracle",))


def test_head_pass_calls_the_declared_head_methods(train_set):
    from lenpred.prediction import head_pass

    signals, y = train_set
    caps = np.full(len(signals), np.inf)  # the fake requests carry no cap
    last = make_predictor("last", layer=2, head={"epochs": 3, "num_bins": 4}).fit(signals, y)
    X = last.features(signals)
    assert X.shape == (len(signals), D) and last.n_features_in_ == D
    by_requests, by_features = head_pass(last, caps, signals), head_pass(last, caps, features=X)
    np.testing.assert_array_equal(by_requests.expected, by_features.expected)
    np.testing.assert_allclose(by_requests.expected, np.clip(last.predict(signals), 0, caps))
    assert by_requests.probs.shape == (len(signals), len(last.head_.centres_))
    median = make_predictor("global_median").fit(signals, y)  # a point predictor: predict, never features
    # sorted y: 3 5 7 12 18 25 | 33 40 48 61 90 150 -> median (25 + 33) / 2 = 29
    np.testing.assert_array_equal(head_pass(median, caps, signals).expected, np.full(len(signals), 29.0))
    with pytest.raises(LenpredError, match="'global_median' has no feature head"):
        head_pass(median, caps, features=X)
    with pytest.raises(NotImplementedError, match=r"'global_median' \(GlobalMedian\) reads no feature vector"):
        median.features(signals)
    ltr = make_predictor("ltr", layer=2, head={"epochs": 2})
    assert not ltr.reads().features and not hasattr(ltr, "n_features_in_")  # fitted attribute: absent before fit
    with pytest.raises(NotImplementedError, match="'ltr' gives a ranking score"):
        ltr.distribution_from_features(X, caps)


def test_every_registered_predictor_implements_the_abstract_methods():
    assert all(not cls.__abstractmethods__ for cls in PREDICTORS.values())
    with pytest.raises(TypeError, match="abstract"):
        Predictor()
