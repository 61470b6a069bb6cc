"""The traffic-replay study's pure helpers, by hand."""

import numpy as np
import pytest

from lenpred.studies.traffic import later_part, paired_tau_bootstrap, rolling_coverage, shifted_order


def test_shifted_order_keeps_prompts_together_and_sends_the_late_group_last():
    ids = np.array(["a", "a", "b", "b", "c", "c"])
    order = shifted_order(ids, np.array([0, 0, 0, 0, 1, 1], bool), late_start=0.99, spread=0.0, seed=0)
    assert sorted(order.tolist()) == list(range(6))
    assert ids[order].tolist()[-2:] == ["c", "c"]  # c's popularity time lies in [0.99, 1)
    arranged = ids[order].tolist()
    assert all(arranged[i] == arranged[i + 1] for i in (0, 2, 4))  # spread 0: a prompt's samples arrive together


def test_later_part_and_rolling_coverage():
    ids = np.array(["a", "b", "a", "c", "b", "d"])
    earlier, later = later_part(ids, new_prompts_only=False)
    assert earlier.tolist() == [True, True, True, False, False, False] and later.tolist() == [False] * 3 + [True] * 3
    _, later = later_part(ids, new_prompts_only=True)  # b arrived in the first half: dropped from the later part
    assert later.tolist() == [False, False, False, True, False, True]
    np.testing.assert_allclose(rolling_coverage(np.array([1, 0, 1, 1]), 2), [1, 0.5, 0.5, 1])


def test_paired_tau_bootstrap_of_a_perfect_and_a_reversed_ranking():
    y = np.arange(6.0)
    r = paired_tau_bootstrap(y, y, -y, np.array(list("aabbcc")), n_resamples=50)
    assert r["tau_a"] == pytest.approx(1.0) and r["tau_b"] == pytest.approx(-1.0)
    assert r["diff"] == pytest.approx([2.0, 2.0, 2.0])  # every resample ranks perfectly (ties: tau-b)
