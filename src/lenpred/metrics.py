"""Metrics (pure math): length-prediction errors per scenario, censoring, the oracle floor, seeds, bootstrap intervals.

* Errors in tokens: MAE, RMSE (scikit-learn); Kendall tau-b between predicted and true lengths (scipy;
  what a shortest-job-first scheduler needs); ``within_25``: share of samples with
  ``|y_hat - y| <= 0.25 * y``.
* One-to-many: with several samples per prompt, ``mae_prompt_mean`` compares each prompt's prediction
  with the mean of its own samples (EGTP paper, RL scenario).
* **Oracle floor**: sampled lengths are random, so a prompt-only predictor cannot beat the
  leave-one-out median of a prompt's other samples. Over prompts with >= 2 samples we report that
  floor's MAE and, for each method, the share of the gap between the global-median predictor and the
  floor that it closes: ``(MAE_median - MAE_method) / (MAE_median - MAE_floor)`` on the same samples.

* **Capped responses** (``finish_reason == "length"``) are right-censored: their true length is only known to be
  ``>= max_new_tokens``. Every prediction is clipped to the request's cap (known when it arrives), the main MAE
  counts a capped response at its cap (what the serving system observed), and the tables add the MAE over
  uncapped responses and, for capped ones, the share predicted below the cap.
* **Uncertainty over test prompts**: :func:`clustered_bootstrap` resamples *prompts* (all samples of a prompt
  together, since they share the prediction), paired across methods (the same resamples for every method), with
  ``scipy.stats.bootstrap`` (percentile intervals, fixed seed). The ``±`` in the tables is the spread over head
  seeds, which is much smaller than the spread over test prompts.

Undefined values (tau of a constant prediction) are ``None`` in JSON.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.stats import kendalltau
from sklearn.metrics import mean_absolute_error, root_mean_squared_error


METRICS = ("mae", "rmse", "kendall_tau", "within_25")


def _none_if_nan(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def length_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float | int | None]:
    """Errors of one group of samples: ``mae``, ``rmse`` (tokens), ``kendall_tau`` (tau-b; ``None`` when a side is
    constant or there is one sample), ``within_25`` (share in [0, 1]) and ``n``."""
    y_true, y_pred = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    tau = None
    if len(y_true) > 1 and np.ptp(y_true) > 0 and np.ptp(y_pred) > 0:
        tau = _none_if_nan(kendalltau(y_pred, y_true).statistic)
    return {"mae": float(mean_absolute_error(y_true, y_pred)), "rmse": float(root_mean_squared_error(y_true, y_pred)),
            "kendall_tau": tau, "within_25": float(np.mean(np.abs(y_pred - y_true) <= 0.25 * y_true)),
            "n": int(len(y_true))}


def prompt_mean_mae(y_true: np.ndarray, y_pred: np.ndarray, prompt_ids: np.ndarray) -> float:
    """MAE against each prompt's mean sampled length: ``mean_p |mean(y_hat_p) - mean(y_p)|`` over prompts (tokens)."""
    ids, inverse = np.unique(np.asarray(prompt_ids), return_inverse=True)
    counts = np.bincount(inverse)
    mean_true = np.bincount(inverse, weights=y_true) / counts
    mean_pred = np.bincount(inverse, weights=y_pred) / counts
    return float(np.mean(np.abs(mean_pred - mean_true)))


def censored_metrics(y_true: np.ndarray, y_pred: np.ndarray, censored: np.ndarray) -> dict[str, float | None]:
    """``mae_uncapped``: MAE over responses that ended by themselves; ``capped_below_cap``: share of capped responses
    (true length ``>= y_true``, their cap) predicted more than half a token below the cap. ``None`` where a group is
    empty."""
    y_true, y_pred, censored = (np.asarray(a, dtype=np.float64) for a in (y_true, y_pred, censored))
    c = censored.astype(bool)
    return {"mae_uncapped": float(np.mean(np.abs(y_pred[~c] - y_true[~c]))) if (~c).any() else None,
            "capped_below_cap": float(np.mean(y_pred[c] < y_true[c] - 0.5)) if c.any() else None}


def metrics_by_scenario(y_true: np.ndarray, y_pred: np.ndarray, scenarios: np.ndarray,
                        prompt_ids: np.ndarray | None = None, censored: np.ndarray | None = None) -> dict[str, dict]:
    """:func:`length_metrics` per scenario (sorted) plus ``"overall"``; with ``prompt_ids`` also ``mae_prompt_mean``,
    with ``censored`` also :func:`censored_metrics`."""
    y_true, y_pred, scenarios = (np.asarray(a) for a in (y_true, y_pred, scenarios))
    y_true, y_pred = y_true.astype(np.float64), y_pred.astype(np.float64)
    groups = {s: scenarios == s for s in sorted(set(scenarios.tolist()))}
    groups["overall"] = np.ones(len(y_true), dtype=bool)
    out = {}
    for g, m in groups.items():
        out[g] = length_metrics(y_true[m], y_pred[m])
        if prompt_ids is not None:
            out[g]["mae_prompt_mean"] = prompt_mean_mae(y_true[m], y_pred[m], np.asarray(prompt_ids)[m])
        if censored is not None:
            out[g].update(censored_metrics(y_true[m], y_pred[m], np.asarray(censored)[m]))
    return out


def clustered_bootstrap(abs_errors: np.ndarray, prompt_ids: np.ndarray, n_resamples: int = 2000, seed: int = 0,
                        confidence: float = 0.95) -> tuple[float, float | None, float | None]:
    """Prompt-clustered bootstrap of a mean absolute error (or of a paired difference of two).

    Args:
        abs_errors: ``(n,)`` per-sample values in tokens: ``|y_hat - y|`` for one method's MAE, or
            ``|y_hat_a - y| - |y_hat_b - y|`` for the difference of two methods on the same samples.
        prompt_ids: ``(n,)`` the cluster of each sample; prompts are resampled with replacement, each bringing all
            its samples, and the statistic is ``sum(values) / count`` over the resampled samples.
        n_resamples, seed, confidence: ``scipy.stats.bootstrap`` settings (percentile method). The same seed and
            the same prompts give the same resamples, so intervals of different methods are paired.

    Returns:
        ``(estimate, low, high)`` in tokens; ``low`` and ``high`` are ``None`` with fewer than 2 prompts.
    """
    from scipy.stats import bootstrap

    ids, inverse = np.unique(np.asarray(prompt_ids), return_inverse=True)
    sums = np.bincount(inverse, weights=np.asarray(abs_errors, dtype=np.float64))
    counts = np.bincount(inverse).astype(np.float64)
    if len(ids) < 2:
        return float(sums.sum() / counts.sum()), None, None

    def ratio(idx, axis=-1):
        idx = idx.astype(np.int64)
        return sums[idx].sum(axis=axis) / counts[idx].sum(axis=axis)

    res = bootstrap((np.arange(len(ids)),), ratio, n_resamples=n_resamples, confidence_level=confidence,
                    method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return float(sums.sum() / counts.sum()), float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_cluster_bootstrap(samples: dict[str, list[np.ndarray]], stat, n_resamples: int = 2000, seed: int = 0,
                             confidence: float = 0.95) -> tuple[float, float, float]:
    """Two-stage paired bootstrap of a statistic over requests clustered by workload draw (serving runs).

    Each resample draws clusters (draws) with replacement, then, inside each drawn cluster, requests with
    replacement; the *same* indices are used for every entry of ``samples``, so a mode and its reference stay paired
    request by request (Davison & Hinkley 1997, §3.8, the two-stage cluster bootstrap). With one cluster it
    reduces to a paired bootstrap over that draw's requests.

    Args:
        samples: ``{name: [values of cluster 0, values of cluster 1, ...]}``; every name has the same number of
            clusters and, per cluster, ``(n_c,)`` arrays of equal length aligned by request (e.g. JCT in seconds of
            request i under each mode).
        stat: ``stat({name: (n,) pooled values}) -> float``, e.g. ``lambda v: 1 - v["p"].mean() / v["f"].mean()``.
        n_resamples, seed, confidence: bootstrap settings (percentile interval).

    Returns:
        ``(estimate on the data as given, low, high)``.

    Raises:
        LenpredError: no clusters, or clusters whose lengths differ between names.
    """
    from lenpred.errors import LenpredError

    names = list(samples)
    k = len(samples[names[0]]) if names else 0
    if k == 0 or any(len(samples[n]) != k for n in names):
        raise LenpredError("paired_cluster_bootstrap needs the same number (>= 1) of clusters for every name")
    sizes = [len(samples[names[0]][c]) for c in range(k)]
    if any(len(samples[n][c]) != sizes[c] for n in names for c in range(k)):
        raise LenpredError("paired_cluster_bootstrap: a cluster holds different request counts for two names; pair "
                           "the requests first (drop a request from every name when one lost it)")
    arrays = {n: [np.asarray(v, dtype=np.float64) for v in samples[n]] for n in names}
    pooled = lambda picks: {n: np.concatenate([arrays[n][c][i] for c, i in picks]) for n in names}  # noqa: E731
    estimate = float(stat(pooled([(c, np.arange(sizes[c])) for c in range(k)])))
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_resamples):
        picks = [(c, rng.integers(0, sizes[c], sizes[c])) for c in rng.integers(0, k, k)]
        values.append(stat(pooled(picks)))
    alpha = (1 - confidence) / 2
    return estimate, float(np.nanquantile(values, alpha)), float(np.nanquantile(values, 1 - alpha))


def leave_one_out_median(y: np.ndarray, prompt_ids: np.ndarray) -> np.ndarray:
    """For each sample, the median of its prompt's *other* samples ``(n,)`` float64; NaN for single-sample prompts."""
    y, prompt_ids = np.asarray(y, dtype=np.float64), np.asarray(prompt_ids)
    out = np.full(len(y), np.nan)
    for pid in np.unique(prompt_ids):
        idx = np.flatnonzero(prompt_ids == pid)
        for k, i in enumerate(idx):
            if len(idx) > 1:
                out[i] = np.median(y[np.delete(idx, k)])
    return out


def oracle_floor(y: np.ndarray, prompt_ids: np.ndarray, scenarios: np.ndarray) -> dict[str, dict]:
    """MAE of the leave-one-out per-prompt median over samples of prompts with >= 2 samples, per scenario and
    ``"overall"``: ``{group: {"mae", "n", "num_prompts"}}`` (groups without such prompts are left out)."""
    loo = leave_one_out_median(y, prompt_ids)
    multi = ~np.isnan(loo)
    scenarios, prompt_ids = np.asarray(scenarios), np.asarray(prompt_ids)
    out = {}
    for g in [*sorted(set(scenarios[multi].tolist())), "overall"]:
        m = multi & ((scenarios == g) if g != "overall" else True)
        if m.any():
            out[g] = {"mae": float(np.mean(np.abs(np.asarray(y, dtype=np.float64)[m] - loo[m]))), "n": int(m.sum()),
                      "num_prompts": int(len(np.unique(prompt_ids[m])))}
    return out


def gap_closed(mae_method: float, mae_reference: float, mae_floor: float) -> float | None:
    """Share of the gap from the reference (global median) to the oracle floor that a method closes:
    ``(ref - method) / (ref - floor)``; 1 = reaches the floor, 0 = no better than the median, < 0 worse.
    ``None`` when the floor is not below the reference."""
    if mae_reference - mae_floor <= 0:
        return None
    return float((mae_reference - mae_method) / (mae_reference - mae_floor))


def aggregate_seeds(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """Mean over seeds of every metric per group, with ``<metric>_std`` (population std; 0 for one run) and
    ``seeds`` (how many). ``None`` values (undefined tau) are skipped; all-``None`` stays ``None``."""
    out = {}
    for g in runs[0]:
        agg = {}
        for key, first in runs[0][g].items():
            if key == "n":
                agg["n"] = first
                continue
            vals = [r[g][key] for r in runs if r[g][key] is not None]
            agg[key] = float(np.mean(vals)) if vals else None
            agg[f"{key}_std"] = float(np.std(vals)) if vals else None
        agg["seeds"] = len(runs)
        out[g] = agg
    return out


def score_methods(predictions: dict[str, list[np.ndarray]], y: np.ndarray, scenarios: np.ndarray,
                  prompt_ids: np.ndarray, censored: np.ndarray, floor_method: str | None = "scenario_median",
                  externals: tuple[str, ...] = (), n_resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Every test score of every method, on the same samples.

    Args:
        predictions: ``{method: [(n,) predictions in tokens, one per seed]}``.
        y, scenarios, prompt_ids, censored: ``(n,)`` true (observed) lengths, scenario, prompt id, capped flag.
        floor_method: the floor differences and "gap closed" are measured from (per-scenario median).
        externals: the external baselines; per group the one with the lowest MAE is "best external".
        n_resamples, seed: :func:`clustered_bootstrap` settings.

    Returns:
        ``{"results": {method: {group: metrics}}, "best_external": {group: method}, "oracle_floor": {...}}``.
        Per group the metrics are :func:`metrics_by_scenario`'s (mean over seeds, ``_std`` over seeds) plus
        ``mae_ci`` ``[low, high]``, ``diff_floor`` / ``diff_best_external`` ``[estimate, low, high]`` (paired,
        prompt-clustered, on the seed-mean absolute error; ``None`` for the reference itself) and ``gap_closed``.
    """
    y, scenarios, prompt_ids = np.asarray(y, np.float64), np.asarray(scenarios), np.asarray(prompt_ids)
    results = {m: aggregate_seeds([metrics_by_scenario(y, p, scenarios, prompt_ids, censored) for p in preds])
               for m, preds in predictions.items()}
    errors = {m: np.mean([np.abs(p - y) for p in preds], axis=0) for m, preds in predictions.items()}
    groups = {g: (scenarios == g) if g != "overall" else np.ones(len(y), bool) for g in next(iter(results.values()))}
    present = [m for m in externals if m in predictions]
    best_external = {g: min(present, key=lambda m: results[m][g]["mae"]) for g in groups} if present else {}
    floor = oracle_floor(y, prompt_ids, scenarios)
    in_floor = {g: ~np.isnan(leave_one_out_median(y, prompt_ids)) & groups[g] for g in floor}
    for m in predictions:
        for g, mask in groups.items():
            r = results[m][g]
            _, lo, hi = clustered_bootstrap(errors[m][mask], prompt_ids[mask], n_resamples, seed)
            r["mae_ci"] = None if lo is None else [lo, hi]
            for key, ref in (("diff_floor", floor_method), ("diff_best_external", best_external.get(g))):
                diff = None if ref is None or ref == m or ref not in errors else clustered_bootstrap(
                    errors[m][mask] - errors[ref][mask], prompt_ids[mask], n_resamples, seed)
                r[key] = None if diff is None or diff[1] is None else list(diff)
            if g in floor and floor_method in errors:
                f = in_floor[g]
                r["gap_closed"] = gap_closed(errors[m][f].mean(), errors[floor_method][f].mean(), floor[g]["mae"])
    for g, f in floor.items():
        if floor_method in errors:
            f["floor_method_mae"] = float(errors[floor_method][in_floor[g]].mean())
    return {"results": results, "best_external": best_external, "oracle_floor": floor}
