"""No call leaves torch's global state changed: thread count, global generator, the model's attention choice."""

import numpy as np
import pytest
import torch

from lenpred.torch_state import torch_seed, torch_threads, with_threads_of


@pytest.fixture()
def caller_threads():
    """Run the test with 2 torch threads (a count the calls below would change), then put the original back."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


def test_torch_threads_sets_then_restores(caller_threads):
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == caller_threads
    with torch_threads(None):
        assert torch.get_num_threads() == caller_threads
    with pytest.raises(RuntimeError, match="boom"), torch_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == caller_threads
    with pytest.raises(ValueError, match="got -1"), torch_threads(-1):
        pass


def test_with_threads_of_reads_the_first_arguments_field(caller_threads):
    class Cfg:
        threads = 1

    seen = with_threads_of("threads")(lambda cfg: torch.get_num_threads())(Cfg())
    assert seen == 1 and torch.get_num_threads() == caller_threads


def test_torch_seed_draws_manual_seeds_stream_and_restores_the_generator():
    torch.manual_seed(5)
    expected = torch.rand(4)  # the CPU stream torch.manual_seed(5) starts
    torch.manual_seed(99)
    state = torch.random.get_rng_state()
    with torch_seed(5):
        inside = torch.rand(4)
    assert torch.equal(inside, expected)
    assert torch.equal(torch.random.get_rng_state(), state)


def _xy():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 6)).astype(np.float32), rng.integers(1, 300, 40).astype(float)


def test_head_fit_leaves_the_global_generator_and_is_independent_of_it():
    from lenpred.heads import HeadConfig, SoftLabelRegressor

    X, y = _xy()
    preds = []
    for caller_seed in (1, 2):
        torch.manual_seed(caller_seed)
        state = torch.random.get_rng_state()
        head = SoftLabelRegressor(HeadConfig(epochs=3, num_bins=5), seed=7).fit(X, y)
        assert torch.equal(torch.random.get_rng_state(), state)
        preds.append(head.predict(X))
    np.testing.assert_array_equal(preds[0], preds[1])


def test_ltr_fit_leaves_the_global_generator():
    from lenpred.predictors import make_predictor
    from test_tuning import _data

    data = _data()
    train = data.index["train"]
    state = torch.random.get_rng_state()
    make_predictor("ltr", layer=1, pool_span="content", head={"epochs": 2}).fit(data.rows("train"), data.y[train])
    assert torch.equal(torch.random.get_rng_state(), state)


def test_load_backbone_leaves_the_thread_count_and_extraction_uses_its_own(tiny_model_dir, caller_threads,
                                                                           monkeypatch):
    from lenpred import signals
    from lenpred.backbone import load_backbone

    backbone = load_backbone(str(tiny_model_dir), num_threads=1)
    assert torch.get_num_threads() == caller_threads and backbone.num_threads == 1
    seen = []
    real_forward = type(backbone.model).forward

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(type(backbone.model), "forward", spy)
    signals.extract_signals(backbone, [[1, 5, 9, 12]], [-1], semantic=False)
    assert seen == [1] and torch.get_num_threads() == caller_threads


def test_extract_signals_leaves_the_attention_implementation_and_generator(tiny_backbone):
    from lenpred.signals import extract_signals

    config = tiny_backbone.model.config
    before, state = config._attn_implementation, torch.random.get_rng_state()
    layers = [m for m in tiny_backbone.model.modules() if hasattr(m, "layer_idx")]
    out = extract_signals(tiny_backbone, [[1, 5, 9, 12, 3], [4, 4, 8]], [-1], semantic=True)
    assert out[0].attention_received is not None and float(out[0].attention_received.sum()) == pytest.approx(5, 1e-4)
    assert config._attn_implementation == before == "sdpa"
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not any(hasattr(m, "_lenpred_capture") and m._lenpred_capture for m in layers)
    assert not any("_lenpred_weights" in m.__dict__ for m in layers)
