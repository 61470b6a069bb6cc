"""Unit tests of lenpred.pooling with hand-worked values.

The shared toy prompt (n = 3 tokens, d = 2):

    h = [[1, 0],
         [0, 2],
         [3, 1]]

* entropies H = [0, ln 4, ln 16] (evenly spaced, so zscore(H) = [-c, 0, c]);
* semantic scores S = [3, 2, 1] (zscore(S) = [c, 0, -c]);

where c = 1 / sqrt(2/3) = sqrt(3/2): a centred, evenly spaced triple [-a, 0, a] has population
std a * sqrt(2/3). Choosing the temperature ALPHA = c / ln 2 turns a z-scored triple into
[-ln 2, 0, ln 2], whose softmax is [1/2, 1, 2] / 3.5 = [1, 2, 4] / 7.
"""

import math

import pytest
import torch

from lenpred.errors import LenpredError
from lenpred.pooling import POOLERS, Pooler, egtp_weights, estp_weights, weighted_pool, zscore

C = math.sqrt(1.5)
ALPHA = C / math.log(2)
LN2 = math.log(2)

H_STATES = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]])
ENTROPY = torch.tensor([0.0, 2 * LN2, 4 * LN2])
SEMANTIC = torch.tensor([3.0, 2.0, 1.0])


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ---------------------------------------------------------------- zscore


def test_zscore_hand_values():
    # x = [1, 2, 3]: mean 2, population variance (1 + 0 + 1) / 3 = 2/3 -> z = [-1, 0, 1] / sqrt(2/3)
    close(zscore(torch.tensor([1.0, 2.0, 3.0])), [-C, 0.0, C])


def test_zscore_uses_population_std():
    # x = [0, 4]: mean 2, population std 2 (sample std would be 2*sqrt(2)) -> [-1, 1]
    close(zscore(torch.tensor([0.0, 4.0])), [-1.0, 1.0])


def test_zscore_single_token_is_zero():
    out = zscore(torch.tensor([7.5]))
    assert out.shape == (1,)
    assert out.item() == 0.0


def test_zscore_constant_prompt_is_zero_not_nan():
    # std 0 -> (x - mean) / eps = 0 / eps = 0
    close(zscore(torch.tensor([2.0, 2.0, 2.0])), [0.0, 0.0, 0.0])


def test_zscore_is_shift_and_scale_invariant():
    x = torch.tensor([0.3, -1.2, 4.0, 2.2])
    close(zscore(10 * x + 5), zscore(x))


# ---------------------------------------------------------------- EGTP weights


def test_egtp_weights_hand_values():
    # H = [0, ln 3]: exp -> [1, 3], normalised -> [1/4, 3/4]
    close(egtp_weights(torch.tensor([0.0, math.log(3)])), [0.25, 0.75])


def test_egtp_weights_toy_prompt():
    # H = [0, ln 4, ln 16]: exp -> [1, 4, 16] / 21
    close(egtp_weights(ENTROPY), [1 / 21, 4 / 21, 16 / 21])


def test_egtp_weights_use_raw_entropy_not_zscore():
    # doubling every entropy squares the exp ratios: [0, ln 2] -> [1, 2]/3 ; [0, 2 ln 2] -> [1, 4]/5
    close(egtp_weights(torch.tensor([0.0, LN2])), [1 / 3, 2 / 3])
    close(egtp_weights(torch.tensor([0.0, 2 * LN2])), [1 / 5, 4 / 5])


# ---------------------------------------------------------------- ESTP weights


def test_estp_weights_terms_cancel_to_uniform():
    # lambda1 * [c, 0, -c] + lambda2 * [-c, 0, c] = 0 when lambda1 = lambda2 -> uniform
    close(estp_weights(ENTROPY, SEMANTIC, 1.0, 1.0, 1.0), [1 / 3] * 3)


def test_estp_weights_hand_worked_with_temperature():
    # lambda1=2, lambda2=1: T = 2[c,0,-c] + [-c,0,c] = [c, 0, -c]; / ALPHA -> [ln2, 0, -ln2]
    # exp -> [2, 1, 1/2] -> [4, 2, 1] / 7
    close(estp_weights(ENTROPY, SEMANTIC, 2.0, 1.0, ALPHA), [4 / 7, 2 / 7, 1 / 7])
    # lambda1=0, lambda2=1 (entropy term only): [-c,0,c] / ALPHA -> [1, 2, 4] / 7
    close(estp_weights(ENTROPY, SEMANTIC, 0.0, 1.0, ALPHA), [1 / 7, 2 / 7, 4 / 7])


def test_estp_weights_alpha_one_hand_value():
    # lambda1=0, lambda2=1, alpha=1 with H = [0, 4] (n=2): zscore -> [-1, 1]
    # softmax([-1, 1]) = [1, e^2] / (1 + e^2)
    e2 = math.exp(2)
    close(estp_weights(torch.tensor([0.0, 4.0]), torch.tensor([5.0, 5.0]), 0.0, 1.0, 1.0),
          [1 / (1 + e2), e2 / (1 + e2)])


def test_estp_alpha_scaling():
    # softmax(T / alpha): scaling both lambdas and alpha by k leaves the weights unchanged
    H = torch.tensor([0.1, 2.0, 0.7, 1.3])
    S = torch.tensor([0.5, 0.05, 0.2, 0.25])
    a = estp_weights(H, S, 0.4, 1.5, 0.8)
    b = estp_weights(H, S, 0.4 * 3, 1.5 * 3, 0.8 * 3)
    close(a, b)
    # doubling alpha is the square root of the unnormalised weights: w(2a) ∝ sqrt(w(a))
    w2 = estp_weights(H, S, 0.4, 1.5, 1.6)
    close(w2, a.sqrt() / a.sqrt().sum())
    # a very large temperature tends to uniform (mean pooling)
    close(estp_weights(H, S, 1.0, 1.0, 1e6), [0.25] * 4)


@pytest.mark.parametrize("alpha", [0.0, -1.0])
def test_estp_alpha_must_be_positive(alpha):
    with pytest.raises(LenpredError, match="alpha"):
        estp_weights(ENTROPY, SEMANTIC, 1.0, 1.0, alpha)


def test_estp_weights_sum_to_one():
    w = estp_weights(torch.tensor([0.3, 1.0, 2.5, 0.0, 4.0]), torch.tensor([0.9, 0.1, 0.1, 0.4, 0.2]), 0.7, 1.3, 0.5)
    assert w.shape == (5,)
    assert bool((w > 0).all())
    assert abs(w.sum().item() - 1.0) < 1e-6


# ---------------------------------------------------------------- weighted_pool


def test_weighted_pool_hand_value():
    # 0.25*[1,0] + 0.25*[0,2] + 0.5*[3,1] = [0.25 + 1.5, 0.5 + 0.5] = [1.75, 1.0]
    close(weighted_pool(H_STATES, torch.tensor([0.25, 0.25, 0.5])), [1.75, 1.0])


def test_weighted_pool_one_hot_selects_row_and_keeps_dtype():
    out = weighted_pool(H_STATES, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))
    assert out.dtype == torch.float32
    close(out, [0.0, 2.0])


# ---------------------------------------------------------------- registered poolers

# expected pooled vectors on the toy prompt, each worked by hand:
EXPECTED = {
    # column means: [(1+0+3)/3, (0+2+1)/3]
    "mean": ({}, [4 / 3, 1.0]),
    # last row
    "last": ({}, [3.0, 1.0]),
    # column maxima
    "max": ({}, [3.0, 2.0]),
    # weights [1, 4, 16]/21: [(1 + 0 + 48)/21, (0 + 8 + 16)/21] = [49/21, 24/21]
    "egtp": ({}, [49 / 21, 24 / 21]),
    # lambda1=2, lambda2=1, alpha=ALPHA -> weights [4, 2, 1]/7: [(4 + 0 + 3)/7, (0 + 4 + 1)/7] = [1, 5/7]
    "estp": ({"lambda1": 2.0, "lambda2": 1.0, "alpha": ALPHA}, [1.0, 5 / 7]),
    # zscore(H)/ALPHA -> weights [1, 2, 4]/7: [(1 + 0 + 12)/7, (0 + 4 + 4)/7] = [13/7, 8/7]
    "entropy_only": ({"alpha": ALPHA}, [13 / 7, 8 / 7]),
    # zscore(S)/ALPHA -> weights [4, 2, 1]/7 -> [1, 5/7]
    "semantic_only": ({"alpha": ALPHA}, [1.0, 5 / 7]),
}


def test_expected_covers_every_registered_pooler():
    assert set(EXPECTED) == set(POOLERS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_registered_pooler_hand_values(name):
    params, expected = EXPECTED[name]
    z = Pooler(name, **params)(H_STATES, ENTROPY, SEMANTIC)
    assert z.shape == (2,)
    close(z, expected)


def test_estp_equal_lambdas_is_mean_pooling():
    # the two z-scored terms cancel (see test_estp_weights_terms_cancel_to_uniform)
    close(Pooler("estp")(H_STATES, ENTROPY, SEMANTIC), [4 / 3, 1.0])


def test_entropy_only_ignores_semantic_score_and_works_without_it():
    a = Pooler("entropy_only", alpha=ALPHA)(H_STATES, ENTROPY, None)
    b = Pooler("entropy_only", alpha=ALPHA)(H_STATES, ENTROPY, torch.tensor([100.0, -5.0, 0.0]))
    close(a, [13 / 7, 8 / 7])
    close(b, [13 / 7, 8 / 7])


def test_needs_semantic_score_flag():
    assert {n for n in POOLERS if Pooler(n).needs_semantic_score} == {"estp", "semantic_only"}


@pytest.mark.parametrize("name", ["estp", "semantic_only"])
def test_semantic_pooler_without_semantic_score_raises(name):
    with pytest.raises(LenpredError, match="semantic_score"):
        Pooler(name)(H_STATES, ENTROPY, None)


def test_unknown_pooler_lists_valid_names():
    with pytest.raises(LenpredError) as err:
        Pooler("median")
    msg = str(err.value)
    assert "median" in msg
    for name in POOLERS:
        assert name in msg
