"""Check that teacher-forced decode states equal a real incremental decode (KV cache) on the default model.

For a few benchmark rollouts (seeded draw, one per scenario and more), compare the hidden states that
`lenpred progressive` reads (one forward pass over prompt + response, `teacher_forced_states` and the shared-prefix
variant) with those of a token-by-token decode through the KV cache (`incremental_decode_states`), at every decode
step of the schedule and every cached layer. Prints and writes `results/scripts/progressive/teacher_forcing_check.json`.

    python scripts/decode_state_check.py [--n 6] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from lenpred.backbone import load_backbone
from lenpred.bench.records import load_records
from lenpred.dataset import load_eval_data
from lenpred.io import write_json
from lenpred.inputs.decode_states import (incremental_decode_states, steps_before, teacher_forced_shared_prompt,
                                               teacher_forced_states)
from lenpred.studies.progressive import DECODE_LAYERS


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--bench", default="benchmarks/smollm2-forelen")
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/scripts/progressive/teacher_forcing_check.json")
    args = ap.parse_args()
    backbone = load_backbone(num_threads=2)
    data = load_eval_data(args.bench, backbone.tokenizer, None, load_records(args.bench))
    rng = np.random.default_rng(args.seed)
    rows = []
    for i in rng.choice(len(data.y), args.n, replace=False):
        prompt, response = data.requests[i].token_ids, list(data.responses[i])
        steps = steps_before(len(response))
        ref = incremental_decode_states(backbone, prompt, response, steps, DECODE_LAYERS)
        batched = teacher_forced_states(backbone, [(prompt, response)], [steps], DECODE_LAYERS)[0]
        shared = teacher_forced_shared_prompt(backbone, prompt, [response], [steps], DECODE_LAYERS)[0]
        for name, got in (("teacher_forced", batched), ("shared_prefix", shared)):
            rel = ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
            rows.append({"sample": f"{data.cols['prompt_id'][i]}#{data.cols['sample_index'][i]}",
                         "scenario": str(data.cols["scenario"][i]), "num_prompt_tokens": len(prompt),
                         "steps": steps.tolist(), "path": name, "max_abs_diff": (got - ref).abs().max().item(),
                         "max_relative_norm_diff": rel, "allclose_fp32": bool(torch.allclose(got, ref, rtol=1e-4,
                                                                                             atol=1e-3))})
            print(json.dumps(rows[-1]))
    summary = {"layers": list(DECODE_LAYERS), "model_revision": backbone.revision, "rows": rows,
               "max_relative_norm_diff": max(r["max_relative_norm_diff"] for r in rows),
               "all_allclose": all(r["allclose_fp32"] for r in rows)}
    write_json(Path(args.out), summary)
    print(f"max relative difference {summary['max_relative_norm_diff']:.2e}; all close: {summary['all_allclose']}")


if __name__ == "__main__":
    main()
