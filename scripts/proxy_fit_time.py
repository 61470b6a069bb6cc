"""Wall time of fitting / predicting the text-proxy baselines (ssjf_reg, ssjf_mc, s3) on the packaged MiniLM.

Usage: python scripts/proxy_fit_time.py [--methods ssjf_reg] [--num-prompts 1000 --words 100 --epochs 2
        --samples 1 --precision float32 --train-layers K --threads N --data-dir ../shared/datasets]

Prompts are ``--words``-word windows of real English text (the alpaca_eval reference outputs), so the
WordPiece token counts are realistic (~1.3 tokens per word); lengths are random. Prints one JSON line per
method: fit and predict seconds, steps, distinct prompts, mean tokens per prompt, torch threads.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from lenpred.predictors import Request, make_predictor


def prompts(data_dir: Path, n: int, words: int) -> list[str]:
    rows = json.loads((data_dir / "alpaca_eval" / "model_outputs_gpt4_1106_preview.json").read_text())
    stream = " ".join(r["output"] for r in rows).split()
    if len(stream) < n * words:
        raise SystemExit(f"only {len(stream)} words of text; lower --num-prompts or --words")
    return [" ".join(stream[i * words:(i + 1) * words]) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", nargs="+", default=["ssjf_reg"])
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--words", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--train-layers", type=int, default=None, help="fine-tune only the top k layers (default: all)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--samples", type=int, default=1, help="samples (lengths) per prompt, sharing one Request")
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get("LENPRED_DATA_DIR", "../shared/datasets")))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = prompts(args.data_dir, args.num_prompts, args.words)
    rng = np.random.default_rng(0)
    unique = [Request(f"bench/{i}", [], text=t) for i, t in enumerate(texts)]
    requests = [r for r in unique for _ in range(args.samples)]
    y = rng.integers(5, 1024, size=len(requests)).astype(np.float64)
    for name in args.methods:
        model = make_predictor(name, epochs=args.epochs, precision=args.precision,
                               train_layers=args.train_layers)
        t0 = time.perf_counter()
        model.fit(requests, y)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.predict(unique)
        predict_s = time.perf_counter() - t0
        tokens = [len(x) for x in model.encoder_.tokenize(texts, model.params["max_length"])]
        print(json.dumps({"method": name, "fit_s": round(fit_s, 1), "predict_s": round(predict_s, 1),
                          "prompts": len(unique), "samples": len(requests), "epochs": args.epochs,
                          "precision": args.precision, "train_layers": args.train_layers,
                          "steps": args.epochs * -(-len(unique) // model.params["batch_size"]),
                          "mean_tokens": round(float(np.mean(tokens)), 1), "torch_threads": torch.get_num_threads(),
                          "load_avg_1min": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
