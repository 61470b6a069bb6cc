"""How much ESTP's test MAE depends on which near-tied candidate wins on validation.

Usage: python scripts/estp_selection_spread.py [--bench benchmarks/smollm2-forelen]
       [--out results/scripts/estp_selection_spread.json] [--within 2.0]

Fits ESTP (seed 0, the demo's head settings) for every candidate of the demo's grid (layers 15 / 22 / final,
lambda1 in 0.25..2, alpha in 0.5..4) on the train split and scores validation and test MAE (predictions clipped to
each request's cap). Prints the candidates whose validation MAE is within ``--within`` tokens of the best, with
their test MAE, the test-MAE range among them, the paired prompt-clustered 95 % interval between the worst and
the best of them on test, and the Spearman correlation of validation and test MAE over all candidates. Then the two
selection rules side by side: the lowest validation MAE (the old rule) and the tuner's one-standard-error rule
(:func:`lenpred.tuning.one_se_choice`, the simplest candidate within one SE of the best), each with its pick's test
MAE and its stability: the share of 1,000 bootstrap resamples of the validation requests in which the rule picks
the same candidate (a stand-in for the float noise of a re-extraction, which moves validation errors the same way).
Reads the signal cache of `lenpred evaluate` / `lenpred demo`.
"""

from __future__ import annotations

import argparse



def main() -> None:
    from scipy.stats import spearmanr
    from tqdm.auto import tqdm

    from lenpred.metrics import clustered_bootstrap
    from lenpred.dataset import load_dataset
    from lenpred.torch_state import torch_threads
    from lenpred.predictors import PREDICTORS
    from lenpred.tuning import TuningSettings, fit_and_score, one_se_choice, tuning_context
    from lenpred.io import write_json

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--bench", default="benchmarks/smollm2-forelen")
    ap.add_argument("--out", default="results/scripts/estp_selection_spread.json")
    ap.add_argument("--within", type=float, default=2.0, help="validation-MAE margin of a near tie (tokens)")
    args = ap.parse_args()
    cfg = TuningSettings()  # the tuner's defaults, as `lenpred evaluate` uses them
    data = load_dataset(args.bench, {"signals"}).data
    pid = data.cols["prompt_id"][data.index["test"]]
    layers = data.requests[0].signals.layers  # the extracted hidden-state indices (15, 22, final)
    grid = PREDICTORS["estp"].param_grid(tuning_context(cfg, layers, max(layers), {}))  # the tuner's, simplest first
    rows, errors, val_errors = [], {}, []
    with torch_threads(1):
        for candidate in tqdm(grid, desc="estp candidates", unit="fit"):
            params = {k: candidate[k] for k in ("layer", "lambda1", "alpha")}
            scored = fit_and_score("estp", candidate, data, 0)
            val_mae, err = scored.val_mae, scored.test_abs_err
            errors[tuple(params.values())] = err
            val_errors.append(scored.val_abs_err)
            rows.append({**params, "val_mae": val_mae, "test_mae": float(err.mean())})
    rules = _rules(rows, val_errors, one_se_choice)
    rows = sorted(rows, key=lambda r: r["val_mae"])
    near = [r for r in rows if r["val_mae"] <= rows[0]["val_mae"] + args.within]
    best, worst = min(near, key=lambda r: r["test_mae"]), max(near, key=lambda r: r["test_mae"])
    key = lambda r: (r["layer"], r["lambda1"], r["alpha"])  # noqa: E731
    diff = clustered_bootstrap(errors[key(worst)] - errors[key(best)], pid)
    rho = float(spearmanr([r["val_mae"] for r in rows], [r["test_mae"] for r in rows]).statistic)
    report = {"within_tokens": args.within, "candidates": rows, "near_ties": len(near),
              "near_tie_test_mae_range": [best["test_mae"], worst["test_mae"]],
              "worst_minus_best_near_tie_test": list(diff), "spearman_val_test": rho, "rules": rules}
    for r in near:
        print(f"layer {r['layer']:>2}, lambda1 {r['lambda1']:<4}, alpha {r['alpha']:<3}: validation "
              f"{r['val_mae']:.1f}, test {r['test_mae']:.1f}")
    print(f"{len(near)} candidates within {args.within} tokens of the best validation MAE; their test MAE spans "
          f"{best['test_mae']:.1f}–{worst['test_mae']:.1f} (worst − best, paired: {diff[0]:+.1f} "
          f"[{diff[1]:+.1f}, {diff[2]:+.1f}]); Spearman(validation, test) over all {len(rows)}: {rho:.2f}")
    for name, r in rules.items():
        print(f"{name}: layer {r['layer']}, lambda1 {r['lambda1']}, alpha {r['alpha']}: validation "
              f"{r['val_mae']:.1f}, test {r['test_mae']:.1f}; the same pick in {r['stability']:.0%} of "
              f"{r['resamples']} validation resamples")
    write_json(args.out, report)


def _rules(rows: list[dict], val_errors: list, one_se_choice, resamples: int = 1000) -> dict:
    """Each selection rule's pick (row of ``rows``, grid order) and the share of validation bootstrap resamples in
    which it picks the same candidate."""
    import numpy as np

    rules = {"lowest validation MAE": lambda errs: int(np.argmin([e.mean() for e in errs])),
             "one standard error": one_se_choice}
    rng = np.random.default_rng(0)
    n = len(val_errors[0])
    draws = [rng.integers(0, n, n) for _ in range(resamples)]
    out = {}
    for name, rule in rules.items():
        pick = rule(val_errors)
        same = np.mean([rule([e[idx] for e in val_errors]) == pick for idx in draws])
        out[name] = {**rows[pick], "stability": float(same), "resamples": resamples}
    return out


if __name__ == "__main__":
    main()
