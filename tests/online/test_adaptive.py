"""Adaptive intervals: hand-worked values of the pure functions and of short streams."""

import math

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.online.adaptive import (AdaptiveConfig, AdaptiveInterval, aci_update, conformal_quantile,
                                      conformity_score, min_window, replay_intervals)


def test_pure_functions():
    assert conformity_score(10, 20, 25) == 5 and conformity_score(10, 20, 4) == 6 and conformity_score(10, 20, 15) == -5
    # k = ceil((n + 1) level): n = 4 -> level 0.5: k = 3; 0.8: k = 4; 0.81: k = 5 > n -> inf
    assert conformal_quantile([-3, 0, 5, 10], 0.5) == 5
    assert conformal_quantile([-3, 0, 5, 10], 0.8) == 10
    assert conformal_quantile([-3, 0, 5, 10], 0.81) == math.inf
    assert conformal_quantile([-3, 0, 5, 10], 0.0) == -math.inf
    assert aci_update(0.2, True, 0.2, 0.01) == pytest.approx(0.192)
    assert aci_update(0.2, False, 0.2, 0.01) == pytest.approx(0.202)


def test_rolling_window_by_hand():
    s = AdaptiveInterval(AdaptiveConfig(coverage=0.5, method="rolling", window=3, min_scores=2, initial_margin=1))
    assert s.update(10, 20, 25) is False  # score 5 > initial margin 1
    assert s.margin() == 1  # one score < min_scores
    assert s.update(10, 20, 12) is True  # score -2; scores [-2, 5]: k = ceil(3 * 0.5) = 2 -> 5
    assert s.margin() == 5
    assert s.update(10, 20, 30) is False  # score 10 > 5; [-2, 5, 10] -> k = 2 -> 5
    assert s.margin() == 5
    s.update(10, 20, 10)  # score 0; window 3 drops the first (5): [-2, 0, 10] -> 0
    assert s.margin() == 0 and s.interval(10, 20, cap=15) == (10, 15)


def test_aci_by_hand():
    """alpha = 0.2, gamma = 0.1, min_scores = 1, initial margin 0 (worked step by step in the comments)."""
    s = AdaptiveInterval(AdaptiveConfig(coverage=0.8, method="aci", gamma=0.1, min_scores=1, window=10))
    s.update(10, 20, 25)  # score 5 > 0: err 1 -> alpha 0.2 + 0.1 (0.2 - 1) = 0.12
    assert s.pooled.alpha_t == pytest.approx(0.12)
    assert s.margin() == math.inf  # level 0.88, n = 1: k = ceil(2 * 0.88) = 2 > 1
    for y, alpha in ((15, 0.14), (18, 0.16), (20, 0.18), (20, 0.20)):  # inside an unbounded interval: err 0
        s.update(10, 20, y)
        assert s.pooled.alpha_t == pytest.approx(alpha)
    assert s.margin() == 5  # scores [-5, -2, 0, 0, 5], level 0.8: k = ceil(6 * 0.8) = 5
    assert s.update(10, 20, 30) is False  # score 10 > 5: err 1 -> alpha 0.12
    assert s.pooled.alpha_t == pytest.approx(0.12) and s.margin() == math.inf  # k = ceil(7 * 0.88) = 7 > 6


def test_mondrian_groups():
    s = AdaptiveInterval(AdaptiveConfig(coverage=0.5, method="rolling", min_scores=1, min_group_size=2))
    s.update(0, 0, 100, "a")
    assert s.margin("a") == 100  # group a has 1 < 2 scores: pooled [100], k = 1
    s.update(0, 0, 100, "a")
    for _ in range(3):
        s.update(0, 0, 1, "b")
    assert s.margin() == 1  # pooled [1, 1, 1, 100, 100]: k = ceil(6 * 0.5) = 3
    assert s.margin("a") == 100 and s.margin("b") == 1 and s.margin("unseen") == 1


def test_replay_matches_the_wrapper_and_bad_settings():
    low_raw, high_raw, y = np.array([10.0, 10, 10, 10]), np.array([20.0, 20, 20, 20]), np.array([25.0, 12, 30, 10])
    cfg = AdaptiveConfig(coverage=0.5, method="rolling", window=3, min_scores=2, initial_margin=1)
    low, high = replay_intervals(low_raw, high_raw, y, np.array([np.nan, np.nan, 22, np.nan]), config=cfg)
    np.testing.assert_array_equal(low, [9, 9, 5, 5])
    np.testing.assert_array_equal(high, [21, 21, 22, 25])
    with pytest.raises(LenpredError, match="valid: aci, rolling"):
        AdaptiveConfig(method="pid")
    with pytest.raises(LenpredError, match="coverage"):
        AdaptiveConfig(coverage=1.0)


def test_an_aci_margin_of_minus_infinity_serves_a_point_not_an_inverted_interval():
    """alpha_t >= 1 makes ACI ask for an empty set (margin -inf): the served interval is the raw midpoint (clipped to
    the cap), never low > high; a replay whose large gamma drives alpha_t past 1 serves no inverted interval."""
    s = AdaptiveInterval(AdaptiveConfig(method="aci", min_scores=1))
    s.update(10, 20, 15)
    s.pooled.alpha_t = 1.2
    assert s.margin() == -math.inf
    assert s.interval(10, 20) == (15, 15) and s.interval(10, 20, cap=12) == (12, 12)
    rng = np.random.default_rng(1)
    low_raw = rng.uniform(0, 50, 400)
    high_raw = low_raw + rng.uniform(0, 40, 400)
    y = rng.uniform(0, 60, 400)  # covered far more often than 50 %: alpha_t climbs
    cfg = AdaptiveConfig(coverage=0.5, method="aci", gamma=0.5, window=50, min_scores=5)
    low, high = replay_intervals(low_raw, high_raw, y, np.full(400, 64.0), config=cfg)
    assert (low <= high).all() and (high <= 64).all()
    assert (low == high).any()  # the -inf margin was reached


def test_a_window_that_cannot_reach_the_coverage_is_refused_with_the_smallest_that_can():
    """ceil((n + 1) c) <= n first holds at n = 4 for c = 0.8 (ceil(4.0) = 4; n = 3: ceil(3.2) = 4 > 3), n = 9 for 0.9
    (n = 8: ceil(8.1) = 9 > 8), n = 19 for 0.95, n = 1 for 0.5; one score fewer gives +inf forever."""
    assert [min_window(c) for c in (0.5, 0.8, 0.9, 0.95)] == [1, 4, 9, 19]
    assert conformal_quantile([0.0] * 8, 0.9) == math.inf and conformal_quantile([0.0] * 9, 0.9) == 0.0
    with pytest.raises(LenpredError, match=r"window 5 cannot reach coverage 0.9 .*pass window >= 9"):
        AdaptiveConfig(coverage=0.9, window=5)
    with pytest.raises(LenpredError, match="min_scores 30 exceeds window 20"):
        AdaptiveConfig(window=20, min_scores=30)
    s = AdaptiveInterval(AdaptiveConfig(coverage=0.9, method="rolling", window=9, min_scores=9))
    for y in range(12):
        s.update(10, 20, 15 + y % 3)  # scores -5, -4, -3
    assert s.margin() == -3  # the 9 newest scores, k = ceil(10 * 0.9) = 9: the largest, finite


def test_an_explicit_initial_margin_of_zero_is_kept():
    """initial_margin=0 serves the raw quantiles until min_scores outcomes (None, the default, also serves 0 here;
    OnlineLearning replaces only None by the predictor's margin: tests/online/test_traffic_refit.py)."""
    s = AdaptiveInterval(AdaptiveConfig(initial_margin=0.0, min_scores=5))
    assert s.margin() == 0.0 and s.interval(10, 20) == (10, 20)
    assert AdaptiveInterval(AdaptiveConfig(initial_margin=7.0)).interval(10, 20) == (3, 27)
