"""Cost of one PLP update (the online call a serving loop makes every k decode steps), on the shipped head.

Times `lenpred.online.progressive.update_batch` for 1 and for 64 running requests (one torch thread, median of
`--repeats` calls after a warm-up) with the shipped predictor's PLP head and representative inputs, and writes
`results/scripts/progressive/update_cost.json`. Run it on an idle machine (the numbers are wall-clock microseconds).

    python scripts/plp_update_cost.py [--repeats 2000]
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np
import torch

from lenpred.io import write_json
from lenpred.pipeline import DEFAULT_PREDICTOR, PROGRESSIVE_FILE
from lenpred.online.progressive import load_plp, update_cost


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--out", default="results/scripts/progressive/update_cost.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    plp, info = load_plp(Path(DEFAULT_PREDICTOR) / PROGRESSIVE_FILE)
    d_in, d = plp.head_.n_features_in_, 576
    rng = np.random.default_rng(0)
    n = 64
    cost = update_cost(plp, rng.normal(size=(n, d_in - d - 1)).astype(np.float32),
                       rng.normal(size=(n, d)).astype(np.float32), np.full(n, 32), np.full(n, 512.0),
                       repeats=args.repeats)
    out = {"plp": info, "threads": 1, "processor": platform.processor() or platform.machine(),
           "torch": torch.__version__, **cost}
    for b in (1, 8, 64):
        print(f"batch {b:3d}: {cost[f'batch{b}_us']:8.1f} µs per update call, "
              f"{cost[f'batch{b}_per_request_us']:7.1f} µs per request")
    write_json(args.out, out)


if __name__ == "__main__":
    main()
