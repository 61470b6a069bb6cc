"""TRAIL (last-token MLP at one layer) and LTR (ListMLE ranking + quantile mapping), on small known cases."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from lenpred.errors import LenpredError
from lenpred.predictors import Request, make_predictor
from lenpred.predictors.ltr import list_mle_loss, quantile_map
from lenpred.signals import PromptSignals

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_list_mle_two_items_hand_worked():
    # equal scores: -(0 - log(e^0 + e^0)) - (0 - 0) = log 2
    assert list_mle_loss(torch.zeros(2), torch.tensor([10.0, 5.0])).item() == pytest.approx(math.log(2))
    # lengths [5, 10] -> item 1 (score 0) ranks first: log(e^0 + e^1) - 0 + (1 - 1) = log(1 + e)
    assert list_mle_loss(torch.tensor([1.0, 0.0]), torch.tensor([5.0, 10.0])).item() == pytest.approx(
        math.log(1 + math.e))
    # right order with a big margin -> loss near 0
    assert list_mle_loss(torch.tensor([0.0, 20.0]), torch.tensor([5.0, 10.0])).item() < 1e-6


def test_quantile_map_hand_worked():
    train_scores, train_lengths = np.array([4.0, 1.0, 3.0, 2.0]), np.array([40.0, 10.0, 30.0, 20.0])
    # 2.5: 2 below, 2 at-or-below -> q = 4/8 = 0.5 -> median of 10..40 = 25
    # 2.0: 1 below, 2 at-or-below -> q = 3/8 -> 10 + 0.375 * 3 * 10 = 21.25; 0 -> q = 0 -> 10; 9 -> q = 1 -> 40
    np.testing.assert_allclose(quantile_map(np.array([2.5, 2.0, 0.0, 9.0]), train_scores, train_lengths),
                               [25.0, 21.25, 10.0, 40.0])


def _requests(lengths, seed=0, d=8, n_layers=3):
    """Requests whose hidden states carry log(length) in dimension 0 (plus noise elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, y in enumerate(lengths):
        h = torch.randn(1, 5, d, generator=g)
        h[..., 0] = math.log(y)
        last = torch.randn(n_layers, d, generator=g)
        last[1, 0] = math.log(y)  # layer 1 of the last token knows the length; layers 0 and 2 do not
        out.append(Request(f"r/{seed}/{k}", list(range(5)),
                           signals=PromptSignals(h, torch.rand(5, generator=g), torch.rand(5, generator=g) / 5, (2,),
                                                 last)))
    return out


def test_ltr_learns_the_order_and_maps_to_training_lengths():
    rng = np.random.default_rng(0)
    y_train, y_test = rng.uniform(5, 500, 64), rng.uniform(5, 500, 20)
    model = make_predictor("ltr", layer=2, head={"epochs": 200}).fit(_requests(y_train), y_train)
    pred = model.predict(_requests(y_test, seed=1))
    assert kendalltau(pred, y_test).statistic > 0.8
    assert pred.min() >= y_train.min() and pred.max() <= y_train.max()  # quantile mapping stays in range


def test_trail_reads_the_chosen_layer_of_the_last_token():
    rng = np.random.default_rng(1)
    y_train, y_test = rng.uniform(5, 500, 256), rng.uniform(5, 500, 40)
    train, test = _requests(y_train), _requests(y_test, seed=1)
    informed = make_predictor("trail", layer=1, head={"epochs": 300}).fit(train, y_train)
    np.testing.assert_array_equal(informed.features(test[:1])[0], test[0].signals.last_token_states[1].numpy())
    blind = make_predictor("trail", layer=2, head={"epochs": 300}).fit(train, y_train)
    mae = lambda m: np.abs(m.predict(test) - y_test).mean()  # noqa: E731
    assert mae(informed) < 0.6 * mae(blind)


def test_trail_without_last_token_states_names_the_fix():
    r = _requests([10.0, 20.0])
    for x in r:
        x.signals.last_token_states = None
    with pytest.raises(LenpredError, match="last_token_states"):
        make_predictor("trail", layer=1).fit(r, np.array([10.0, 20.0]))
