"""Ablations of ESTP on the committed benchmark: which signal, the lambda1/lambda2 x alpha grid, the layer, the bins,
the soft-label width and the CE/MSE mix — each choice on validation, each reported number on test with a paired,
prompt-clustered bootstrap against entropy-only pooling.

Every candidate is one registered pooled predictor (``entropy_only``, ``semantic_only``, ``estp``) fitted with
:func:`lenpred.tuning.fit_and_score` on train (one torch thread, as ``lenpred evaluate``), scored on
validation and test with predictions clipped to each request's cap.
ESTP's ``lambda2`` is fixed at 1 and ``lambda1`` varies (only the ratio and ``alpha`` matter: the softmax is scale
free up to ``alpha``); ``lambda1 / lambda2 = 0`` is entropy-only and ``inf`` semantic-only.
"""

from __future__ import annotations

import math

import numpy as np

# torch / scipy modules (tuning, metrics) are imported inside the functions, so `candidate` imports without them.

RATIOS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, math.inf)
ALPHAS = (0.5, 1.0, 2.0, 4.0)


def candidate(ratio: float, alpha: float, layer: int, settings: dict, head: dict | None = None) -> tuple[str, dict]:
    """``(method, params)`` of one grid point: ``ratio = lambda1 / lambda2`` (0: entropy-only, inf: semantic-only)."""
    h = {**settings.get("head", {}), **(head or {})}
    base = {"layer": layer, "alpha": alpha, "pool_span": settings["pool_span"],
            "semantic_divisor": settings["semantic_divisor"], "head": h}
    if ratio == 0:
        return "entropy_only", base
    if math.isinf(ratio):
        return "semantic_only", base
    return "estp", {**base, "lambda1": ratio, "lambda2": 1.0}


def _fit(data, method: str, params: dict, seed: int) -> dict:
    """``{"val_mae", "test_abs_err"}`` of one candidate fitted with :func:`lenpred.tuning.fit_and_score`."""
    from lenpred.tuning import fit_and_score

    scored = fit_and_score(method, params, data, seed)
    return {"val_mae": scored.val_mae, "test_abs_err": scored.test_abs_err}


def _best_of_grid(grid: list[dict]) -> dict:
    """The grid rows with the lowest validation MAE: ``{"entropy_only", "semantic_only", "joint"}``."""
    return {"entropy_only": min((x for x in grid if x["ratio"] == 0), key=lambda x: x["val_mae"]),
            "semantic_only": min((x for x in grid if math.isinf(x["ratio"])), key=lambda x: x["val_mae"]),
            "joint": min((x for x in grid if 0 < x["ratio"] < math.inf), key=lambda x: x["val_mae"])}


def _one_at_a_time(layers: tuple[int, ...], grid_layer: int, bins, taus, lams) -> list[tuple[str, dict, dict | None]]:
    """The one-at-a-time ablations as ``(group, label, head overrides)``: other layers, bins, tau, lam."""
    extra = [("layer", {"layer": l}, None) for l in layers if l != grid_layer]
    extra += [("num_bins", {"num_bins": k}, {"num_bins": k}) for k in bins]
    extra += [("tau", {"tau": t}, {"tau": t}) for t in taus]
    extra += [("lam", {"lam": v}, {"lam": v}) for v in lams]
    return extra


def _fit_candidates(data, settings: dict, layers: tuple[int, ...], grid_layer: int, seeds, ratios, alphas, bins, taus,
                    lams, progress: bool) -> tuple[list[dict], dict, dict]:
    """The fitted rows (grid, then one-at-a-time), the best grid points and their test errors per seed."""
    from tqdm.auto import tqdm

    from lenpred.torch_state import torch_threads

    grid_points = [(r, a) for r in ratios for a in alphas]
    bar = tqdm(total=len(grid_points) + 3 * (len(seeds) - 1) + (len(layers) - 1) + len(bins) + len(taus) + len(lams),
               desc="ablation fits", unit="fit", disable=not progress)
    rows = []
    with torch_threads(1):
        for r, a in grid_points:
            method, params = candidate(r, a, grid_layer, settings)
            rows.append({"group": "grid", "ratio": r, "alpha": a, "layer": grid_layer, "method": method,
                         "seed": seeds[0], **_fit(data, method, params, seeds[0])})
            bar.update()
        best = _best_of_grid([x for x in rows if x["group"] == "grid"])
        seed_errors = {k: [b["test_abs_err"]] for k, b in best.items()}
        for k, b in best.items():
            method, params = candidate(b["ratio"], b["alpha"], grid_layer, settings)
            for s in seeds[1:]:
                seed_errors[k].append(_fit(data, method, params, s)["test_abs_err"])
                bar.update()
        j = best["joint"]
        for group, label, head in _one_at_a_time(layers, grid_layer, bins, taus, lams):
            layer = label.get("layer", grid_layer)
            method, params = candidate(j["ratio"], j["alpha"], layer, settings, head)
            rows.append({"group": group, **label, "ratio": j["ratio"], "alpha": j["alpha"], "layer": layer,
                         "method": method, "seed": seeds[0], **_fit(data, method, params, seeds[0])})
            bar.update()
    bar.close()
    return rows, best, seed_errors


def _headline(best: dict, seed_errors: dict, grid_layer: int, test_ids: np.ndarray, n_resamples: int) -> dict:
    """Per best grid point (entropy-only, semantic-only, joint): its seed-averaged test MAE, interval and the paired
    difference against entropy-only."""
    from lenpred.metrics import clustered_bootstrap

    headline = {}
    ref_mean = np.mean(seed_errors["entropy_only"], axis=0)
    for k, errs in seed_errors.items():
        e = np.mean(errs, axis=0)
        headline[k] = {"ratio": best[k]["ratio"], "alpha": best[k]["alpha"], "layer": grid_layer,
                       "val_mae": best[k]["val_mae"], "test_mae": float(e.mean()),
                       "test_mae_ci": list(clustered_bootstrap(e, test_ids, n_resamples)[1:]),
                       "test_mae_seeds": [float(x.mean()) for x in errs],
                       "diff_entropy_only": None if k == "entropy_only" else
                       list(clustered_bootstrap(e - ref_mean, test_ids, n_resamples))}
    return headline


def run_ablations(data, settings: dict, layers: tuple[int, ...], grid_layer: int, seeds=(0, 1, 2),
                  ratios=RATIOS, alphas=ALPHAS, bins=(10, 40), taus=(0.5, 2.0), lams=(0.5, 0.8, 1.0),
                  n_resamples: int = 2000, progress: bool = True) -> dict:
    """Fit the grid and the one-at-a-time ablations; returns a JSON-able dict.

    Steps: (1) ``ratios x alphas`` at ``grid_layer`` (validation MAE, seed ``seeds[0]``); (2) the best entropy-only
    (lowest validation MAE over alpha), best semantic-only and best joint point refitted with every seed; (3) at the
    best joint point: every other layer of ``layers``, ``num_bins`` in ``bins``, ``tau`` in ``taus``, ``lam`` in
    ``lams`` (seed ``seeds[0]``). Every fitted candidate is also scored on test; ``test_diff_entropy_only`` is the
    paired, prompt-clustered difference of absolute errors (candidate - best entropy-only, same seed; negative =
    better) ``[estimate, low, high]``.
    """
    from lenpred.metrics import clustered_bootstrap

    test_ids = data.cols["prompt_id"][data.index["test"]]
    rows, best, seed_errors = _fit_candidates(data, settings, layers, grid_layer, seeds, ratios, alphas, bins, taus,
                                              lams, progress)
    ref = best["entropy_only"]["test_abs_err"]
    for x in rows:
        x["test_mae"] = float(x["test_abs_err"].mean())
        x["test_diff_entropy_only"] = list(clustered_bootstrap(x["test_abs_err"] - ref, test_ids, n_resamples))
    headline = _headline(best, seed_errors, grid_layer, test_ids, n_resamples)
    for x in rows:
        del x["test_abs_err"]
        x["ratio"] = None if math.isinf(x["ratio"]) else x["ratio"]  # JSON: inf -> null (= semantic-only)
    for h in headline.values():
        h["ratio"] = None if math.isinf(h["ratio"]) else h["ratio"]
    return {"rows": rows, "headline": headline, "seeds": list(seeds), "grid_layer": grid_layer,
            "ratios": [None if math.isinf(r) else r for r in ratios], "alphas": list(alphas),
            "note": f"layers {list(layers)} are the cached ones; a sweep over more layers needs a new extraction"}
