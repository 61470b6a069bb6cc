"""Unit tests of lenpred.heads: bins, soft labels, the combined loss and the soft-label regressor."""

import math

import numpy as np
import pytest
import torch

from lenpred.errors import LenpredError
from lenpred.heads import (DistributionHead, HeadConfig, SoftLabelRegressor, assign_bins, bin_centres,
                           length_bin_edges, soft_label_loss, soft_labels)

# lengths 0..8: numpy's linear quantile sits at position q * (9 - 1) = 8q, so the 1/4, 2/4, 3/4
# quantiles are exactly the values at positions 2, 4, 6: 2, 4 and 6.
NINE = np.arange(9, dtype=float)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------- bins


def test_quantile_edges_are_equal_mass_and_reach_the_longest_length():
    edges = length_bin_edges(NINE, num_bins=4, binning="quantile")
    # quartiles 2, 4, 6, then the longest length 8 as its own edge: the top bin [8, inf) holds only 8
    np.testing.assert_array_equal(edges, [-np.inf, 2.0, 4.0, 6.0, 8.0, np.inf])


def test_quantile_edges_use_uncapped_lengths_and_put_the_cap_on_an_edge():
    # 2 uncapped lengths and 7 capped at 256 (the old equal-mass bins had one edge, 256: K = 2)
    lengths, censored = np.array([10, 20] + [256] * 7), np.array([False] * 2 + [True] * 7)
    edges = length_bin_edges(lengths, 4, "quantile", caps=[256] * 7, censored=censored)
    # quartiles of [10, 20]: 12.5, 15, 17.5 -> whole tokens 13, 15, 18; the cap 256 (= the longest)
    np.testing.assert_array_equal(edges, [-np.inf, 13.0, 15.0, 18.0, 256.0, np.inf])
    # centres: 10 | empty -> mid 14 | empty -> mid 16.5 | 20 | 256
    np.testing.assert_allclose(bin_centres(lengths, edges), [10.0, 14.0, 16.5, 20.0, 256.0])


def test_log_edges_snap_caps_and_end_at_the_longest_length():
    lengths = np.array([1, 3, 40, 300, 512, 700, 1024])
    edges = length_bin_edges(lengths, 20, "log", caps=[512, 1024])
    assert 512.0 in edges and edges[-2] == 1024.0 and np.all(np.diff(edges) > 0)
    # log-spaced from the shortest length 1: each bin spans about the ratio 1024^(1/19) = 1.44 (more at the
    # bottom, where whole-token edges merge: 1.44, 2.07 -> 2, 3; length 1 sits in the first bin (-inf, 2))
    ratios = edges[2:-1] / edges[1:-2]
    assert np.all(ratios[5:] < 1.8) and edges[1] == 2.0
    with pytest.raises(LenpredError, match="unknown binning 'equal'; valid: log, quantile"):
        length_bin_edges(lengths, 20, "equal")


@pytest.mark.parametrize("lengths, k", [([5.0], 4), ([], 4), ([1.0, 2.0, 3.0], 1)])
def test_length_bin_edges_rejects_bad_input(lengths, k):
    with pytest.raises(LenpredError):
        length_bin_edges(np.array(lengths), num_bins=k)


def test_assign_bins_boundaries_are_left_closed():
    edges = np.array([-np.inf, 2.0, 4.0, 6.0, np.inf])
    # bin j is [edges[j], edges[j+1]): an edge value belongs to the bin above it
    got = assign_bins(np.array([-100.0, 0.0, 1.999, 2.0, 3.5, 4.0, 5.999, 6.0, 1e9]), edges)
    np.testing.assert_array_equal(got, [0, 0, 0, 1, 1, 2, 2, 3, 3])


def test_bin_centres_are_bin_means():
    edges = length_bin_edges(NINE, num_bins=4, binning="quantile")
    # bins: {0,1} -> 0.5, {2,3} -> 2.5, {4,5} -> 4.5, {6,7} -> 6.5, {8} -> 8
    np.testing.assert_allclose(bin_centres(NINE, edges), [0.5, 2.5, 4.5, 6.5, 8.0])


def test_bin_centres_empty_bin_takes_mid_of_finite_edges():
    edges = np.array([-np.inf, 2.0, 4.0, 6.0, np.inf])
    # lengths {0, 1} in bin 0, nothing in bins 1 and 2, {7, 9} in bin 3
    np.testing.assert_allclose(bin_centres(np.array([0.0, 1.0, 7.0, 9.0]), edges), [0.5, 3.0, 5.0, 8.0])


# ---------------------------------------------------------------- soft labels


def test_soft_labels_hand_row_k3_b0():
    q = soft_labels(torch.tensor([0]), 3, tau=1.0)
    # q ∝ [e^0, e^-1, e^-2]
    raw = np.array([1.0, math.exp(-1), math.exp(-2)])
    np.testing.assert_allclose(q.numpy()[0], raw / raw.sum(), atol=1e-6)


def test_soft_labels_middle_bin_and_tau():
    q = soft_labels(torch.tensor([1, 2]), 3, tau=2.0)
    # b=1: [e^-1/2, 1, e^-1/2]; b=2: [e^-1, e^-1/2, 1]
    r1 = np.array([math.exp(-0.5), 1.0, math.exp(-0.5)])
    r2 = np.array([math.exp(-1), math.exp(-0.5), 1.0])
    np.testing.assert_allclose(q.numpy(), [r1 / r1.sum(), r2 / r2.sum()], atol=1e-6)
    assert q.dtype == torch.float32


def test_soft_labels_rows_sum_to_one_and_peak_at_true_bin():
    bins = torch.tensor([0, 4, 9, 13, 19])
    q = soft_labels(bins, 20, tau=0.5)
    assert q.shape == (5, 20)
    np.testing.assert_allclose(q.sum(1).numpy(), np.ones(5), atol=1e-6)
    np.testing.assert_array_equal(q.argmax(1).numpy(), bins.numpy())


# ---------------------------------------------------------------- loss


def _loss_inputs():
    # zero logits over K=2 -> p = [1/2, 1/2]; q = [1, 0] -> CE = -log(1/2) = ln 2
    # centres [0, 10] -> y_hat = 5; y = 1, scale 2 -> ((5 - 1) / 2)^2 = 4
    return torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.tensor([1.0]), torch.tensor([0.0, 10.0])


def test_soft_label_loss_lam1_is_cross_entropy():
    logits, q, y, centres = _loss_inputs()
    assert soft_label_loss(logits, q, y, centres, 2.0, lam=1.0).item() == pytest.approx(math.log(2), abs=1e-6)


def test_soft_label_loss_lam0_is_scaled_mse():
    logits, q, y, centres = _loss_inputs()
    assert soft_label_loss(logits, q, y, centres, 2.0, lam=0.0).item() == pytest.approx(4.0, abs=1e-5)


def test_soft_label_loss_mixture_and_batch_mean():
    logits, q, y, centres = _loss_inputs()
    # lam = 0.25: 0.25 ln 2 + 0.75 * 4
    got = soft_label_loss(logits, q, y, centres, 2.0, lam=0.25).item()
    assert got == pytest.approx(0.25 * math.log(2) + 3.0, abs=1e-5)
    # second row: logits [0, ln 3] -> p = [1/4, 3/4], y_hat = 7.5; q = [0.5, 0.5]
    #   CE = -(0.5 ln(1/4) + 0.5 ln(3/4)) = 0.5 (ln 4 + ln 4 - ln 3) ; MSE: y = 7.5 -> 0
    logits2 = torch.tensor([[0.0, 0.0], [0.0, math.log(3)]])
    q2 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    y2 = torch.tensor([1.0, 7.5])
    ce = (math.log(2) + 0.5 * (2 * math.log(4) - math.log(3))) / 2
    mse = (4.0 + 0.0) / 2
    got2 = soft_label_loss(logits2, q2, y2, centres, 2.0, lam=0.5).item()
    assert got2 == pytest.approx(0.5 * ce + 0.5 * mse, abs=1e-5)


def test_censored_row_loss_hand_value():
    # p = [1/2, 1/2]; a capped sample (cap 5) whose cap falls in bin 1: CE term -log p_1 = ln 2
    # capped centres min([0, 10], 5) = [0, 5] -> y_hat = 2.5; y = cap = 5, scale 2.5 -> ((2.5 - 5) / 2.5)^2 = 1
    got = soft_label_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([5.0]), torch.tensor([0.0, 10.0]), 2.5,
                          lam=0.5, caps=torch.tensor([5.0]), censored_share=torch.tensor([1.0]),
                          above_cap=torch.tensor([[0.0, 1.0]]))
    assert got.item() == pytest.approx(0.5 * math.log(2) + 0.5 * 1.0, abs=1e-6)


def test_head_reaches_the_longest_training_length_and_respects_caps():
    # 150 short-form samples (capped at 512, 40 % of them hit it) and 50 long-form ones capped at 1024 (on ForeLen
    # the old pooled equal-mass bins had their top centre at 579: no prediction could reach a long answer)
    rng = np.random.default_rng(0)
    short, long_ = 150, 50
    X = np.concatenate([rng.normal(-1, 0.3, (short, 16)), rng.normal(3, 0.3, (long_, 16))]).astype(np.float32)
    y_short = np.where(rng.random(short) < 0.4, 512.0, rng.integers(20, 500, short))
    y = np.concatenate([y_short, np.full(long_, 1024.0)])
    caps = np.concatenate([np.full(short, 512.0), np.full(long_, 1024.0)])
    head = SoftLabelRegressor(HeadConfig(epochs=200, num_bins=20), seed=0).fit(X, y, censored=y == caps, caps=caps)
    assert head.centres_.max() == 1024.0
    x_long = rng.normal(3, 0.3, (5, 16)).astype(np.float32)
    assert head.predict(x_long, np.full(5, 1024.0)).min() > 950
    # the same features under a 300-token cap: never above the cap
    assert head.predict(x_long, np.full(5, 300.0)).max() <= 300.0


def test_distribution_head_shapes():
    head = DistributionHead(8, 5)
    assert head(torch.zeros(3, 8)).shape == (3, 5)
    # Linear(d, d/2) -> LayerNorm -> ReLU -> Dropout -> Linear(d/2, K)
    assert head.net[0].out_features == 4 and head.net[-1].in_features == 4


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("kw", [{"lam": 1.5}, {"lam": -0.1}, {"tau": 0.0}, {"num_bins": 1}, {"epochs": 0}])
def test_head_config_validation(kw):
    with pytest.raises(LenpredError):
        HeadConfig(**kw)


# ---------------------------------------------------------------- regressor


def _clusters(n_per: int, seed: int):
    """Two well separated clusters in 32-d: features near +2 -> 5..15 tokens, near -2 -> 180..220 tokens."""
    rng = np.random.default_rng(seed)
    Xa = rng.normal(2.0, 0.3, size=(n_per, 32))
    Xb = rng.normal(-2.0, 0.3, size=(n_per, 32))
    ya = rng.integers(5, 16, size=n_per)
    yb = rng.integers(180, 221, size=n_per)
    return np.vstack([Xa, Xb]).astype(np.float32), np.concatenate([ya, yb]).astype(float)


@pytest.fixture(scope="module")
def fitted():
    X, y = _clusters(20, seed=0)
    return SoftLabelRegressor(HeadConfig(epochs=60, batch_size=8), seed=0).fit(X, y), y


def test_regressor_learns_separable_toy(fitted):
    head, y_train = fitted
    median = float(np.median(y_train))  # ~100: half the data at ~10, half at ~200
    assert 15 < median < 180
    X, y = _clusters(10, seed=1)  # fresh points from the same clusters
    pred = head.predict(X)
    assert pred.shape == (20,)
    # every prediction is on its cluster's side of the median and closer to the truth than the median
    err = np.abs(pred - y)
    assert np.all(err < np.abs(median - y))
    assert np.all(pred[:10] < median) and np.all(pred[10:] > median)
    # and the mean error is far below the constant predictor's (~90 tokens)
    assert err.mean() < np.abs(median - y).mean() / 3


def test_soft_label_loss_weights_rows():
    # rows from the mixture test: row losses (lam = 0.5) 0.5 ln2 + 2 and 0.25 (2 ln4 - ln3); weights 3 and 1
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3)]])
    q, y, centres = torch.tensor([[1.0, 0.0], [0.5, 0.5]]), torch.tensor([1.0, 7.5]), torch.tensor([0.0, 10.0])
    r0, r1 = 0.5 * math.log(2) + 2.0, 0.25 * (2 * math.log(4) - math.log(3))
    got = soft_label_loss(logits, q, y, centres, 2.0, lam=0.5, weights=torch.tensor([3.0, 1.0])).item()
    assert got == pytest.approx((3 * r0 + r1) / 4, abs=1e-5)


def test_groups_of_one_sample_change_nothing():
    X, y = _clusters(6, seed=4)
    cfg = HeadConfig(epochs=5, batch_size=4)
    plain = SoftLabelRegressor(cfg, seed=1).fit(X, y).predict(X)
    grouped = SoftLabelRegressor(cfg, seed=1).fit(X, y, groups=np.arange(len(y))).predict(X)
    np.testing.assert_array_equal(plain, grouped)


def test_grouped_samples_train_on_their_mean_label():
    # one prompt, samples in the lowest and highest bins, tau -> 0 and lam = 1: the best fit puts half the
    # probability on each, so the prediction is the mean of the two bin centres
    X = np.ones((4, 3), dtype=np.float32)
    y = np.array([10.0, 10.0, 30.0, 30.0])
    cfg = HeadConfig(num_bins=2, tau=1e-3, lam=1.0, epochs=300, batch_size=4, lr=1e-2, weight_decay=0.0, dropout=0.0)
    head = SoftLabelRegressor(cfg, seed=0).fit(X, y, groups=np.zeros(4, dtype=int))
    np.testing.assert_allclose(head.predict_proba(X[:1])[0], [0.5, 0.5], atol=0.02)
    assert head.predict(X[:1])[0] == pytest.approx(20.0, abs=0.5)
    with pytest.raises(LenpredError, match="groups"):
        SoftLabelRegressor(cfg).fit(X, y, groups=np.zeros(3))


def test_regressor_predictions_are_expectations_over_centres(fitted):
    head, _ = fitted
    X, _ = _clusters(3, seed=2)
    p = head.predict_proba(X)
    assert p.shape == (6, len(head.centres_))
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-6)  # float32 softmax
    np.testing.assert_allclose(head.predict(X), p @ head.centres_)
    # expectations of the bin centres stay within the range of the training lengths
    pred = head.predict(X)
    assert np.all(pred >= 5) and np.all(pred <= 220)


def test_regressor_state_round_trip(fitted):
    head, _ = fitted
    X, _ = _clusters(5, seed=3)
    clone = SoftLabelRegressor.from_state(head.state())
    np.testing.assert_array_equal(clone.predict(X), head.predict(X))
    np.testing.assert_array_equal(clone.edges_, head.edges_)
    assert clone.config == head.config
    assert head.n_features_in_ == clone.n_features_in_ == 32  # the toy clusters' width, fitted and restored


def test_regressor_fit_is_seeded():
    X, y = _clusters(6, seed=4)
    cfg = HeadConfig(epochs=3, num_bins=4)
    a = SoftLabelRegressor(cfg, seed=7).fit(X, y).predict(X)
    b = SoftLabelRegressor(cfg, seed=7).fit(X, y).predict(X)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("X, y", [
    (np.zeros(4), np.zeros(4)),            # X not 2-D
    (np.zeros((4, 3)), np.zeros(5)),       # lengths disagree
    (np.zeros((4, 3)), np.zeros((4, 1))),  # y not 1-D
])
def test_regressor_rejects_bad_shapes(X, y):
    with pytest.raises(LenpredError):
        SoftLabelRegressor(HeadConfig(epochs=1)).fit(X, y)


def test_regressor_rejects_single_sample():
    with pytest.raises(LenpredError):
        SoftLabelRegressor(HeadConfig(epochs=1)).fit(np.zeros((1, 3)), np.array([5.0]))


def test_predict_before_fit_raises():
    with pytest.raises(LenpredError, match="before fit"):
        SoftLabelRegressor().predict(np.zeros((2, 3)))


def test_warm_start_keeps_bins_and_scaling_and_continues_training():
    from lenpred.heads import HeadConfig, SoftLabelRegressor

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)).astype(np.float32), rng.integers(1, 100, 40).astype(float)
    head = SoftLabelRegressor(HeadConfig(num_bins=4, epochs=2), seed=0, warm_start=True).fit(X, y)
    edges, mean, w0 = head.edges_.copy(), head.mean_.copy(), head.module_.net[0].weight.detach().clone()
    head.fit(X[:10] + 5, y[:10] * 3)  # other data: bins and scaling stay, the weights move
    np.testing.assert_array_equal(head.edges_, edges)
    np.testing.assert_array_equal(head.mean_, mean)
    assert not torch.equal(head.module_.net[0].weight, w0)
