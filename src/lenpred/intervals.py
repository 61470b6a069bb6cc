"""Prediction intervals for output lengths: quantiles of a bin distribution, and split-conformal calibration.

* :func:`distribution_quantiles`: quantiles of the soft-label head's distribution over (capped) bin centres, with
  the CDF interpolated linearly between the bins' mid-CDF points (a smooth version of the discrete quantile).
* :func:`conformal_margin`: conformalized quantile regression (Romano et al., "Conformalized Quantile Regression",
  NeurIPS 2019): on a calibration set, ``E_i = max(low_i - y_i, y_i - high_i)``; the margin is the
  ``ceil((n + 1) * coverage) / n`` empirical quantile of ``E``, and ``[low - margin, high + margin]`` covers a new
  exchangeable sample with probability ``>= coverage``. A point predictor is the special case ``low = high``.
  Samples of one prompt are not exchangeable with each other; the coverage on test is reported, not assumed.
* :func:`widened_interval`: the served interval, the one place the margin and the cap are applied (never inverted).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from lenpred.errors import LenpredError

logger = logging.getLogger(__name__)


def distribution_quantiles(probs: np.ndarray, values: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """Quantiles of per-request distributions over bin values.

    Args:
        probs: ``(n, K)`` bin probabilities (rows sum to 1).
        values: ``(n, K)`` the length each bin stands for, tokens, non-decreasing along K (bin centres, capped at
            the request's ``max_new_tokens``).
        qs: quantile levels in ``(0, 1)``.

    Returns:
        ``(n, len(qs))`` float64 tokens: ``interp(q, F_j - p_j / 2, values_j)`` over the bins with mass, ``F`` the
        CDF, clamped to the first and last of them.
    """
    probs, values = np.asarray(probs, np.float64), np.asarray(values, np.float64)
    out = np.zeros((len(probs), len(qs)))
    for i, (p, v) in enumerate(zip(probs, values)):
        keep = p > 1e-12
        out[i] = np.interp(qs, (np.cumsum(p) - p / 2)[keep], v[keep])
    return out


def conformal_margin(low: np.ndarray, high: np.ndarray, y: np.ndarray, coverage: float,
                     strict: bool = True) -> float:
    """CQR margin in tokens (see the module docstring): ``(n,)`` arrays -> float.

    The ``k = ceil((n + 1) * coverage)``-th smallest score needs ``k <= n``, i.e. ``n >= coverage / (1 - coverage)``
    calibration samples (4 for 80 %, 9 for 90 %). With fewer and ``strict=False`` the largest score is used (the
    widest margin the sample can justify; its guarantee is ``n / (n + 1)`` instead of ``coverage``) and a warning
    says so: what a tiny benchmark (``lenpred bench build --preset tiny``) gets.

    Raises:
        LenpredError: ``coverage`` outside (0, 1); no calibration samples; too few for ``coverage`` with
            ``strict=True`` (the message says how many are needed).
    """
    if not 0 < coverage < 1:
        raise LenpredError(f"interval coverage must lie in (0, 1), got {coverage}")
    scores = np.maximum(np.asarray(low, np.float64) - y, np.asarray(y, np.float64) - high)
    n = len(scores)
    k = math.ceil((n + 1) * coverage)
    need = math.ceil(coverage / (1 - coverage) - 1e-9)
    if n == 0:
        raise LenpredError(f"no calibration samples for the interval: the validation split is empty; {coverage:.0%} "
                           f"coverage needs at least {need} (sample a larger benchmark)")
    if k > n:
        if strict:
            raise LenpredError(f"{n} calibration samples are too few for {coverage:.0%} coverage: need at least "
                               f"{need}")
        logger.warning("lenpred: %d calibration samples are too few for %.0f %% coverage (need at least %d): the "
                       "interval uses the widest margin they give (guarantee %.0f %%); sample a larger benchmark or "
                       "lower --coverage", n, 100 * coverage, need, 100 * n / (n + 1))
        k = n
    return float(np.sort(scores)[k - 1])


def widened_interval(low, high, margin: float, cap=None):
    """The served interval in tokens: ``[max(low - margin, 0), min(high + margin, cap)]`` (CQR's widening, Romano et
    al. 2019, clipped to what the request can generate), never inverted. Every predict path, the online interval
    and the traffic replay call this one rule.

    A negative margin (the online interval reaches one; ACI's is ``-inf`` when it asks for an empty set, see
    :func:`lenpred.online.adaptive.conformal_quantile`) narrows the interval; where its ends would cross
    (``low - margin > high + margin``) both sit at the raw interval's midpoint ``(low + high) / 2``, the point the
    narrowing converges to. The floor and the cap then clip both ends to ``[0, cap]``, so ``low <= high`` always
    (for ``cap >= 0``). Where nothing crosses, the result is the formula's, to the bit.

    Args:
        low, high: the head's quantiles, scalars or ``(n,)`` arrays (NumPy's promotion rules set the result dtype:
            float32 quantiles with a float margin stay float32).
        margin: the conformal margin, tokens (fixed or online-adapted; ``-inf`` and ``+inf`` allowed).
        cap: the request's ``max_new_tokens``, scalar or ``(n,)``; ``None``: uncapped.

    Returns:
        ``(low, high)``: Python floats for scalar input, else arrays.
    """
    low, high = np.asarray(low), np.asarray(high)
    lo, hi = low - margin, high + margin
    crossed = lo > hi  # a negative margin larger than half the raw width
    if np.any(crossed):
        mid = (low + high) / 2
        lo, hi = np.where(crossed, mid, lo), np.where(crossed, mid, hi)
    cap = np.inf if cap is None else cap
    lo, hi = np.maximum(lo, 0.0), np.minimum(hi, cap)
    lo, hi = np.minimum(lo, cap).astype(lo.dtype), np.maximum(hi, 0.0)  # a floor above the cap / a top below 0
    return (float(lo), float(hi)) if lo.ndim == 0 else (lo, hi)


def interval_coverage(low: np.ndarray, high: np.ndarray, y: np.ndarray) -> float:
    """Share of ``y`` inside ``[low, high]`` (inclusive)."""
    y = np.asarray(y, np.float64)
    return float(np.mean((np.asarray(low) <= y) & (y <= np.asarray(high))))


def conditional_remaining(probs: np.ndarray, values: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """``E[V - t | V > t]`` from a bin distribution: ``probs`` and ``values`` ``(n, K)`` (values capped at the
    request's cap), ``steps`` ``(n,)``; 0 where no bin lies above ``t``. ``(n,)`` float64 tokens."""
    above = values > steps[:, None]
    mass = (probs * above).sum(axis=1)
    excess = (probs * above * (values - steps[:, None])).sum(axis=1)
    return np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), 0.0)
