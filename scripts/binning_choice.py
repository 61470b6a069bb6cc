"""Which soft-label bin placement to use: validation MAE of pooled heads with log-spaced vs equal-mass bins.

Usage: python scripts/binning_choice.py [--bench benchmarks/smollm2-forelen] [--out results/scripts/binning_choice.json]

Fits the mean-pooled head and ESTP (lambda1 = alpha = 1) at every layer of the evaluation grid, with each binning,
on the train split (seed 0) and prints the validation MAE per scenario (predictions clipped to each request's cap,
as in `lenpred evaluate`). Reads the signal cache `lenpred evaluate` fills (extracts it when missing).
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main() -> None:
    from lenpred.dataset import load_dataset
    from lenpred.torch_state import torch_threads
    from lenpred.tuning import fit_and_score
    from lenpred.io import write_json

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--bench", default="benchmarks/smollm2-forelen")
    ap.add_argument("--out", default="results/scripts/binning_choice.json")
    args = ap.parse_args()
    run = load_dataset(args.bench, {"signals"})
    data, layers = run.data, run.layers
    val = data.index["validation"]
    scen = data.cols["scenario"][val]
    rows = []
    with torch_threads(1):
        for method in ("mean", "estp"):
            for layer in layers:
                for binning in ("log", "quantile"):
                    scored = fit_and_score(method, {"layer": layer, "head": {"binning": binning}}, data, 0, test=False)
                    p, err = scored.predictor, scored.val_abs_err
                    row = {"method": method, "layer": int(layer), "binning": binning, "num_bins": len(p.head_.centres_),
                           "top_centre": float(p.head_.centres_.max()), "overall": float(err.mean()),
                           **{s: float(err[scen == s].mean()) for s in sorted(set(scen.tolist()))}}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    for binning in ("log", "quantile"):
        mean = np.mean([r["overall"] for r in rows if r["binning"] == binning])
        print(f"{binning}: mean validation MAE over the {len(rows) // 2} heads {mean:.1f}")
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
