"""Cost of one PLP update (the online call a serving loop makes every k decode steps), on the shipped head.

Times `lenpred.progressive.online.update_batch` for 1 and for 64 running requests (one torch thread, median of
`--repeats` calls after a warm-up) with the shipped predictor's PLP head and representative inputs, and writes
`results/progressive/update_cost.json`. Run it on an idle machine (the numbers are wall-clock microseconds).

    python scripts/plp_update_cost.py [--repeats 2000]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
import torch

from lenpred.io import write_json
from lenpred.pipeline import DEFAULT_PREDICTOR, PROGRESSIVE_FILE
from lenpred.progressive.online import RequestState, load_plp, update_batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--out", default="results/progressive/update_cost.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    plp, info = load_plp(Path(DEFAULT_PREDICTOR) / PROGRESSIVE_FILE)
    d_in = len(plp.head_.mean_)
    d = 576
    rng = np.random.default_rng(0)
    out = {"plp": info, "threads": 1, "processor": platform.processor() or platform.machine(),
           "torch": torch.__version__}
    for batch in (1, 8, 64):
        states = [RequestState(rng.normal(size=d_in - d - 1).astype(np.float32), 512.0, 0.0) for _ in range(batch)]
        hidden = rng.normal(size=(batch, d)).astype(np.float32)
        steps = np.full(batch, 32)
        update_batch(plp, states, steps, hidden)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            update_batch(plp, states, steps, hidden)
            times.append(time.perf_counter() - t)
        us = float(np.median(times) * 1e6)
        out[f"batch{batch}_us"] = us
        out[f"batch{batch}_per_request_us"] = us / batch
        print(f"batch {batch:3d}: {us:8.1f} µs per update call, {us / batch:7.1f} µs per request")
    write_json(args.out, out)


if __name__ == "__main__":
    main()
