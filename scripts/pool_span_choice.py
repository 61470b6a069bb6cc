"""What a pooler should read: the users' content only, or everything after the template's fixed prefix (content +
the template suffix, i.e. the assistant header, whose hidden states depend on the content).

Usage: python scripts/pool_span_choice.py [--bench benchmarks/smollm2-forelen] [--out results/scripts/pool_span_choice.json]

Fits mean / last / entropy_only / ESTP (lambda1 = alpha = 1) heads at layers 15 and 22 with each span on the train
split (seed 0) and prints validation and test MAE (predictions clipped to each request's cap), plus the paired
prompt-clustered 95 % interval of the test difference after_prefix - content. Reads the signal cache of
`lenpred evaluate`.
"""

from __future__ import annotations

import argparse
import json



def main() -> None:
    from lenpred.metrics import clustered_bootstrap
    from lenpred.dataset import load_dataset
    from lenpred.torch_state import torch_threads
    from lenpred.tuning import fit_and_score
    from lenpred.io import write_json

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--bench", default="benchmarks/smollm2-forelen")
    ap.add_argument("--out", default="results/scripts/pool_span_choice.json")
    args = ap.parse_args()
    data = load_dataset(args.bench, {"signals"}).data
    pid = data.cols["prompt_id"][data.index["test"]]
    rows = []
    with torch_threads(1):
        for method in ("mean", "last", "entropy_only", "estp"):
            for layer in (15, 22):
                err = {}
                for span in ("content", "after_prefix"):
                    scored = fit_and_score(method, {"layer": layer, "pool_span": span}, data, 0)
                    val_mae, err[span] = scored.val_mae, scored.test_abs_err
                    rows.append({"method": method, "layer": layer, "pool_span": span, "val_mae": val_mae,
                                 "test_mae": float(err[span].mean())})
                    print(json.dumps(rows[-1]), flush=True)
                d, lo, hi = clustered_bootstrap(err["after_prefix"] - err["content"], pid)
                rows.append({"method": method, "layer": layer, "test_diff_after_prefix_minus_content": [d, lo, hi]})
                print(json.dumps(rows[-1]), flush=True)
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
