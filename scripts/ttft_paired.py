"""Paired difference of mean TTFT between two in-engine modes of `scripts/vllm_in_engine.py`'s runs (the same
requests, arrival times and sampling in both): requests are paired by draw and request id, and a bootstrap over the
paired requests gives the 95 % interval. Reads `results/scripts/serving/in_engine_runs.json`; writes
`results/scripts/serving/ttft_paired.json`.

    python scripts/ttft_paired.py --a parked_sjf --b fcfs --rate 0.8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="results/scripts/serving/in_engine_runs.json")
    ap.add_argument("--a", default="parked_sjf")
    ap.add_argument("--b", default="fcfs")
    ap.add_argument("--rate", default="0.8")
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--out", default="results/scripts/serving/ttft_paired.json")
    args = ap.parse_args()
    runs = json.loads(Path(args.runs).read_text())["runs"]
    draws = sorted({k.rsplit("/", 1)[1] for k in runs if k.startswith(f"{args.a}/{args.rate}/")}
                   & {k.rsplit("/", 1)[1] for k in runs if k.startswith(f"{args.b}/{args.rate}/")})
    diffs, a_all, b_all = [], [], []
    for d in draws:
        ttft = {m: {r["request_id"]: r["first_token_s"] - r["arrival_s"] for r in runs[f"{m}/{args.rate}/{d}"]["results"]
                    if r["outcome"] == "ok" and r["first_token_s"] is not None} for m in (args.a, args.b)}
        for rid in sorted(ttft[args.a].keys() & ttft[args.b].keys()):
            a_all.append(ttft[args.a][rid]); b_all.append(ttft[args.b][rid])
            diffs.append(ttft[args.a][rid] - ttft[args.b][rid])
    diffs = np.asarray(diffs)
    rng = np.random.default_rng(0)
    boot = diffs[rng.integers(0, len(diffs), (args.resamples, len(diffs)))].mean(axis=1)
    out = {"a": args.a, "b": args.b, "rate_per_s": float(args.rate), "draws": draws, "num_pairs": len(diffs),
           "mean_ttft_s": {args.a: float(np.mean(a_all)), args.b: float(np.mean(b_all))},
           "diff_s": float(diffs.mean()), "ci95_s": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))]}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
