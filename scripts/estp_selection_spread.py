"""How much ESTP's test MAE depends on which near-tied candidate wins on validation.

Usage: python scripts/estp_selection_spread.py [--bench benchmarks/smollm2-forelen]
       [--out results/scripts/estp_selection_spread.json] [--within 2.0]

Fits ESTP (seed 0, the demo's head settings) for every candidate of the demo's grid (layers 15 / 22 / final,
lambda1 in 0.25..2, alpha in 0.5..4) on the train split and scores validation and test MAE (predictions clipped to
each request's cap). Prints the candidates whose validation MAE is within ``--within`` tokens of the best, with
their test MAE, the test-MAE range among them, the paired prompt-clustered 95 % interval between the worst and
the best of them on test, and the Spearman correlation of validation and test MAE over all candidates. Reads the
signal cache of `lenpred evaluate` / `lenpred demo`.
"""

from __future__ import annotations

import argparse
import itertools
import json



def main() -> None:
    from scipy.stats import spearmanr
    from tqdm.auto import tqdm

    from lenpred.metrics import clustered_bootstrap
    from lenpred.dataset import load_dataset
    from lenpred.torch_state import torch_threads
    from lenpred.tuning import TuningSettings, fit_and_score
    from lenpred.io import write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="benchmarks/smollm2-forelen")
    ap.add_argument("--out", default="results/scripts/estp_selection_spread.json")
    ap.add_argument("--within", type=float, default=2.0, help="validation-MAE margin of a near tie (tokens)")
    args = ap.parse_args()
    cfg = TuningSettings()  # the tuner's defaults, as `lenpred evaluate` uses them
    data = load_dataset(args.bench, {"signals"}).data
    pid = data.cols["prompt_id"][data.index["test"]]
    layers = data.requests[0].signals.layers  # the extracted hidden-state indices (15, 22, final)
    grid = list(itertools.product(layers, cfg.lambda1_grid, cfg.alpha_grid))
    shared = {"pool_span": cfg.pool_span, "semantic_divisor": cfg.semantic_divisor,
              "head": {"epochs": cfg.epochs, "binning": cfg.binning}}  # what the demo's tuning passes
    rows, errors = [], {}
    with torch_threads(1):
        for layer, lam, alpha in tqdm(grid, desc="estp candidates", unit="fit"):
            params = {"layer": layer, "lambda1": lam, "alpha": alpha}
            scored = fit_and_score("estp", {**params, **shared}, data, 0)
            val_mae, err = scored.val_mae, scored.test_abs_err
            errors[(layer, lam, alpha)] = err
            rows.append({**params, "val_mae": val_mae, "test_mae": float(err.mean())})
    rows.sort(key=lambda r: r["val_mae"])
    near = [r for r in rows if r["val_mae"] <= rows[0]["val_mae"] + args.within]
    best, worst = min(near, key=lambda r: r["test_mae"]), max(near, key=lambda r: r["test_mae"])
    key = lambda r: (r["layer"], r["lambda1"], r["alpha"])  # noqa: E731
    diff = clustered_bootstrap(errors[key(worst)] - errors[key(best)], pid)
    rho = float(spearmanr([r["val_mae"] for r in rows], [r["test_mae"] for r in rows]).statistic)
    report = {"within_tokens": args.within, "candidates": rows, "near_ties": len(near),
              "near_tie_test_mae_range": [best["test_mae"], worst["test_mae"]],
              "worst_minus_best_near_tie_test": list(diff), "spearman_val_test": rho}
    for r in near:
        print(f"layer {r['layer']:>2}, lambda1 {r['lambda1']:<4}, alpha {r['alpha']:<3}: validation "
              f"{r['val_mae']:.1f}, test {r['test_mae']:.1f}")
    print(f"{len(near)} candidates within {args.within} tokens of the best validation MAE; their test MAE spans "
          f"{best['test_mae']:.1f}–{worst['test_mae']:.1f} (worst − best, paired: {diff[0]:+.1f} "
          f"[{diff[1]:+.1f}, {diff[2]:+.1f}]); Spearman(validation, test) over all {len(rows)}: {rho:.2f}")
    write_json(args.out, report)


if __name__ == "__main__":
    main()
