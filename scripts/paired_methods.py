"""Paired test-MAE differences between saved predictors that `lenpred evaluate`'s tables do not pair.

Usage: python scripts/paired_methods.py [--bench benchmarks/smollm2-forelen] [--predictors results/evaluate/predictors]
       [--pairs last-trail,last-ssjf_reg,...] [--out results/scripts/paired_methods.json]

`lenpred evaluate` pairs every method with the per-scenario median and with the best external baseline only. This
script loads the seed-0 predictors that run saved (``<predictors>/<method>.safetensors``, git-ignored: run
`lenpred evaluate` first), predicts the test split the way evaluate scores it (clipped to each request's cap,
:func:`lenpred.tuning.clipped_predict`), and prints, per scenario and overall, each pair's paired MAE difference
(a - b, tokens) with its prompt-clustered 95 % bootstrap interval (:func:`lenpred.metrics.clustered_bootstrap`, 2,000
resamples, the tables' seed). Seed 0 only: the tables average three seeds, so a method's MAE here can differ from
theirs by about its seed standard deviation. Reads the signal cache and PiA cache of `lenpred evaluate`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_PAIRS = "last-trail,last-ssjf_reg,last-estp,estp-egtp,estp-trail,entropy_only-egtp"


def main() -> None:
    import numpy as np

    from lenpred.dataset import load_dataset
    from lenpred.errors import LenpredError
    from lenpred.io import write_json
    from lenpred.metrics import clustered_bootstrap
    from lenpred.predictors import PREDICTORS, Predictor
    from lenpred.torch_state import torch_threads
    from lenpred.tuning import clipped_predict

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--bench", default="benchmarks/smollm2-forelen")
    ap.add_argument("--predictors", default="results/evaluate/predictors")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS, help="comma-separated a-b method pairs")
    ap.add_argument("--out", default="results/scripts/paired_methods.json")
    args = ap.parse_args()
    pairs = [tuple(p.split("-")) for p in args.pairs.split(",")]
    methods = sorted({m for pair in pairs for m in pair})
    unknown = [m for m in methods if m not in PREDICTORS]
    missing = [m for m in methods if not (Path(args.predictors) / f"{m}.safetensors").exists()]
    if unknown or missing:
        raise LenpredError(f"unknown methods {unknown} / no saved predictor for {missing} in {args.predictors}: run "
                           "`lenpred evaluate` (it saves them) or pass other --pairs")
    data = load_dataset(args.bench, {i for m in methods for i in PREDICTORS[m]().reads().inputs}).data
    test = data.index["test"]
    y, pid, scenario = data.y[test], data.cols["prompt_id"][test], data.cols["scenario"][test]
    with torch_threads(1):
        errors = {m: np.abs(clipped_predict(Predictor.load(Path(args.predictors) / f"{m}.safetensors"),
                                            data.rows("test")) - y) for m in methods}
    groups = {**{g: scenario == g for g in sorted(set(scenario))}, "overall": np.ones(len(y), bool)}
    out = {"predictors": args.predictors, "seed": 0, "n_test": int(len(y)),
           "mae": {m: {g: float(e[mask].mean()) for g, mask in groups.items()} for m, e in errors.items()},
           "pairs": {}}
    for a, b in pairs:
        out["pairs"][f"{a} - {b}"] = {g: list(clustered_bootstrap(errors[a][mask] - errors[b][mask], pid[mask]))
                                      for g, mask in groups.items()}
    print("| pair (a − b) | " + " | ".join(groups) + " |")
    print("|---|" + "---:|" * len(groups))
    for name, per in out["pairs"].items():
        print(f"| {name} | " + " | ".join(f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]" for d, lo, hi in per.values()) + " |")
    print(json.dumps(out["mae"]))
    write_json(args.out, out)


if __name__ == "__main__":
    main()
