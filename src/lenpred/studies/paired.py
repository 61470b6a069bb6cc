"""The one paired comparison every serving study reports: a statistic of a mode against a reference (and, for a
gain share, an oracle) on the same requests, with a two-stage bootstrap interval over requests clustered by draw
(:func:`lenpred.metrics.paired_cluster_bootstrap`).

Each statistic is named once here (:data:`STATISTICS`); studies call :func:`compare` (requests clustered by draw)
or :func:`compare_draws` (one value per draw, e.g. each draw's mean JCT) and never write a bootstrap expression
themselves.
"""

from __future__ import annotations

import numpy as np

from lenpred.errors import LenpredError

Samples = list  # per draw, a (n_d,) array of one mode's values, aligned request by request with the other modes'


def _p99(x: np.ndarray) -> float:
    return float(np.percentile(x, 99))


STATISTICS = {
    "mean_cut": lambda v: 1 - v["mode"].mean() / v["ref"].mean(),
    "p99_ratio": lambda v: _p99(v["mode"]) / _p99(v["ref"]),
    "mean_diff": lambda v: v["mode"].mean() - v["ref"].mean(),
    "oracle_share": lambda v: (v["ref"].mean() - v["mode"].mean()) / (v["ref"].mean() - v["oracle"].mean()),
}
"""Statistics of ``{"ref", "mode"[, "oracle"]}`` pooled arrays:

* ``mean_cut``: ``1 − mean(mode) / mean(ref)`` (a mean-JCT cut; positive: the mode is faster);
* ``p99_ratio``: ``p99(mode) / p99(ref)``;
* ``mean_diff``: ``mean(mode) − mean(ref)`` (in the values' unit, e.g. seconds of TTFT);
* ``oracle_share``: ``(mean(ref) − mean(mode)) / (mean(ref) − mean(oracle))``, the share of the oracle's gain over
  the reference that the mode recovers (nan when the oracle gains nothing).
"""


def compare(statistic: str, ref: Samples, mode: Samples, n_resamples: int, oracle: Samples | None = None,
            seed: int = 0) -> tuple[float, float, float]:
    """``(estimate, low, high)`` of :data:`STATISTICS` ``[statistic]`` with a 95 % two-stage paired bootstrap
    interval (draws, then requests within a draw; the same resampled indices for every array).

    Args:
        statistic: a name in :data:`STATISTICS`.
        ref, mode, oracle: per draw, ``(n_d,)`` float arrays aligned request by request (e.g. JCT in seconds);
            ``oracle`` only for ``oracle_share``.
        n_resamples: bootstrap resamples.
        seed: the bootstrap's seed.

    Raises:
        LenpredError: an unknown statistic (the message lists the valid ones), ``oracle_share`` without an oracle,
            or arrays that are not paired (:func:`lenpred.metrics.paired_cluster_bootstrap`).
    """
    from lenpred.metrics import paired_cluster_bootstrap  # scipy: loaded when a comparison runs

    if statistic not in STATISTICS:
        raise LenpredError(f"unknown paired statistic '{statistic}'; valid: {', '.join(STATISTICS)}")
    if (statistic == "oracle_share") != (oracle is not None):
        raise LenpredError("pass oracle= exactly for the 'oracle_share' statistic")
    samples = {"ref": ref, "mode": mode, **({} if oracle is None else {"oracle": oracle})}
    with np.errstate(all="ignore"):  # a share of a zero oracle gain is nan (no queue: every order is equal)
        return paired_cluster_bootstrap(samples, STATISTICS[statistic], n_resamples, seed)


def draw_bootstrap(per_draw: dict[str, np.ndarray], stat, n_resamples: int = 2000, seed: int = 0,
                   confidence: float = 0.95) -> tuple[float, float, float]:
    """Paired percentile bootstrap over workload draws: every resample picks the same draws for every entry, and
    ``stat(resampled per_draw) -> float``. Returns ``(estimate, low, high)``.

    Args:
        per_draw: ``{name: (n_draws,) values}``, aligned by draw.
    """
    n = len(next(iter(per_draw.values())))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_resamples, n))
    values = np.array([stat({k: v[i] for k, v in per_draw.items()}) for i in idx])
    alpha = (1 - confidence) / 2
    return float(stat(per_draw)), float(np.nanquantile(values, alpha)), float(np.nanquantile(values, 1 - alpha))


def compare_draws(statistic: str, ref: np.ndarray, mode: np.ndarray, n_resamples: int,
                  oracle: np.ndarray | None = None) -> tuple[float, float, float]:
    """:data:`STATISTICS` ``[statistic]`` of per-draw values (``(n_draws,)`` arrays aligned by draw, e.g. each draw's
    mean JCT) with a paired bootstrap over draws (:func:`draw_bootstrap`).

    Raises:
        LenpredError: an unknown statistic, or ``oracle`` given or missing against ``oracle_share``.
    """
    if statistic not in STATISTICS:
        raise LenpredError(f"unknown paired statistic '{statistic}'; valid: {', '.join(STATISTICS)}")
    if (statistic == "oracle_share") != (oracle is not None):
        raise LenpredError("pass oracle= exactly for the 'oracle_share' statistic")
    per_draw = {"ref": np.asarray(ref), "mode": np.asarray(mode), **({} if oracle is None else {"oracle": oracle})}
    stat = STATISTICS[statistic]
    return draw_bootstrap(per_draw, lambda v: float(stat(v)), n_resamples)


def draw_mean(values, n_resamples: int) -> tuple[float, float, float]:
    """The mean of per-draw values with a percentile bootstrap interval over draws (:func:`draw_bootstrap`)."""
    return draw_bootstrap({"x": np.asarray(values, dtype=np.float64)}, lambda v: float(np.mean(v["x"])), n_resamples)
