import math

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.intervals import conformal_margin, distribution_quantiles, interval_coverage


def test_distribution_quantiles_hand_values():
    # two bins at 10 and 30 with p = [1/2, 1/2]: mid-CDF points 1/4 -> 10, 3/4 -> 30; the median interpolates to 20
    q = distribution_quantiles(np.array([[0.5, 0.5]]), np.array([[10.0, 30.0]]), (0.1, 0.5, 0.75, 0.9))
    np.testing.assert_allclose(q, [[10.0, 20.0, 30.0, 30.0]])
    # all mass on one bin: every quantile is that bin's value
    q = distribution_quantiles(np.array([[0.0, 1.0, 0.0]]), np.array([[1.0, 5.0, 9.0]]), (0.1, 0.9))
    np.testing.assert_allclose(q, [[5.0, 5.0]])


def test_conformal_margin_hand_value():
    # y inside, 3 below low by 2, 5 above high by 5 ... scores: -1, 2, 5, -3 ; n = 4, coverage 0.6 -> k = ceil(3) = 3
    low, high = np.array([0.0, 5.0, 0.0, 0.0]), np.array([10.0, 10.0, 10.0, 10.0])
    y = np.array([9.0, 3.0, 15.0, 3.0])
    assert conformal_margin(low, high, y, 0.6) == 2.0  # sorted scores -3, -1, 2, 5 -> the 3rd
    assert conformal_margin(low, high, y, 0.8) == 5.0  # k = ceil(5 * 0.8) = 4
    with pytest.raises(LenpredError, match="too few for 90% coverage: need at least 9"):
        conformal_margin(low, high, y, 0.9)
    assert interval_coverage(low, high, y) == 0.5


def test_too_few_calibration_samples_degrade_with_a_warning(caplog):
    low, high = np.array([0.0, 5.0, 0.0, 0.0]), np.array([10.0, 10.0, 10.0, 10.0])
    y = np.array([9.0, 3.0, 15.0, 3.0])  # scores -1, 2, 5, -3: 4 samples, 90 % needs 9
    with caplog.at_level("WARNING", logger="lenpred.intervals"):
        assert conformal_margin(low, high, y, 0.9, strict=False) == 5.0  # the largest score
    assert "4 calibration samples are too few for 90 % coverage (need at least 9)" in caplog.text
    assert "guarantee 80 %" in caplog.text  # n / (n + 1)
    assert conformal_margin(low[:1], high[:1], y[:1], 0.8, strict=False) == -1.0  # one sample: its own score
    with pytest.raises(LenpredError, match="validation split is empty; 80% coverage needs at least 4"):
        conformal_margin(low[:0], high[:0], y[:0], 0.8, strict=False)


def test_conformal_interval_reaches_its_coverage_on_exchangeable_data():
    rng = np.random.default_rng(0)
    y = rng.exponential(100, 4000)
    pred = np.full_like(y, 70.0)
    m = conformal_margin(pred[:2000], pred[:2000], y[:2000], 0.8)
    assert interval_coverage(pred[2000:] - m, pred[2000:] + m, y[2000:]) == pytest.approx(0.8, abs=0.02)


def test_widened_interval_applies_the_margin_then_the_floor_and_the_cap():
    from lenpred.intervals import widened_interval

    assert widened_interval(10, 20, 5, cap=22) == (5, 22) and widened_interval(10, 20, 15) == (0, 35)
    lo, hi = widened_interval(np.float32([3, 30]), np.float32([8, 90]), 4.5, np.array([100.0, 60.0]))
    assert lo.tolist() == [0.0, 25.5] and hi.tolist() == [12.5, 60.0] and lo.dtype == np.float32


def test_widened_interval_is_never_inverted():
    """A negative margin narrows the interval; ends that would cross meet at the raw midpoint, and a floor above the
    cap (or a top below 0) is clipped into [0, cap]; where nothing crosses the formula is kept."""
    from lenpred.intervals import widened_interval

    assert widened_interval(10, 20, -4) == (14, 16)  # narrowed, not crossed: the formula
    assert widened_interval(10, 20, -8) == (15, 15)  # 18 > 12: crossed, both at the midpoint
    assert widened_interval(10, 20, -math.inf) == (15, 15)  # ACI's empty set: (inf, -inf) before
    assert widened_interval(10, 20, math.inf, cap=50) == (0, 50)
    assert widened_interval(10, 20, -3, cap=12) == (12, 12)  # low 13 above the cap 12
    assert widened_interval(-5, -2, 0) == (0, 0)  # high -2 below the floor
    lo, hi = widened_interval(np.float32([3, 30, 10]), np.float32([8, 90, 11]), -math.inf, np.array([100.0, 60.0, 5]))
    assert lo.tolist() == [5.5, 60.0, 5.0] and hi.tolist() == [5.5, 60.0, 5.0] and lo.dtype == np.float32
    rng = np.random.default_rng(0)
    low = rng.uniform(0, 100, 1000)
    for margin in (-200.0, -30.0, -1.0, 0.0, 30.0, -math.inf, math.inf):
        lo, hi = widened_interval(low, low + rng.uniform(0, 50, 1000), margin, rng.uniform(1, 120, 1000))
        assert (lo <= hi).all() and (lo >= 0).all(), margin
