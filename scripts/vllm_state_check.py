"""How close the plug-in's captured states and predictions are to transformers' and ``LengthPredictor.predict``:
real test-split prompts through ``vllm.LLM`` with the plug-in (chunked prefill of 64-token chunks on, prefix caching
on, each prompt sent twice so the second hits the cache), states logged, compared with the hidden state transformers
computes for the same token ids. Output: ``results/scripts/serving/state_check.json``::

    flock /tmp/lenpred-cpu.lock .venv-vllm/bin/python scripts/vllm_state_check.py --num-prompts 24
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--out", default="results/scripts/serving/state_check.json")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    import torch
    from vllm import LLM, SamplingParams

    from lenpred import LengthPredictor
    from lenpred.backbone import load_backbone
    from lenpred.io import write_json
    from lenpred.studies.workload import draw_workload, load_workload_table
    from lenpred.serving.vllm.config import EngineConfig

    backbone = load_backbone()
    reqs = draw_workload(load_workload_table(rebuild=False), args.num_prompts, seed=7)
    ids = [list(r.prompt_token_ids) for r in reqs]
    log = Path(tempfile.mkdtemp()) / "requests.jsonl"
    cfg = EngineConfig(policy="observe", log_path=str(log), log_states=True)
    llm = LLM(model=str(backbone.model_dir), dtype="float32", enforce_eager=True, max_model_len=4096,
              enable_chunked_prefill=True, max_num_batched_tokens=64, enable_prefix_caching=True,
              kv_cache_memory_bytes=1 << 30, max_num_seqs=8, seed=0, generation_config="vllm",
              worker_cls="lenpred.serving.vllm.worker.LenpredCPUWorker",
              scheduler_cls="lenpred.serving.vllm.scheduler.LenpredScheduler",
              additional_config=json.loads(cfg.to_json()))
    params = [SamplingParams(max_tokens=2, temperature=0.0) for _ in ids]
    runs = [llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False) for _ in range(2)]
    cached = [int(o.num_cached_tokens or 0) for o in runs[1]]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    layer = 15
    with torch.no_grad():
        want = {len(i): backbone.model(torch.tensor([i]), output_hidden_states=True).hidden_states[layer][0, -1].numpy()
                for i in ids}
    abs_err, rel_err = [], []
    for line in lines:
        got, ref = np.array(line["state"], np.float32), want[line["num_prompt_tokens"]]
        abs_err.append(float(np.abs(got - ref).max()))
        rel_err.append(float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
    head = LengthPredictor.from_pretrained(load_model=False)  # the same head on transformers' states
    pred_err = []
    for line in lines[: len(ids)]:
        p = head.predict_states(want[line["num_prompt_tokens"]][None], [line["num_prompt_tokens"]], [line["max_tokens"]])
        pred_err.append(abs(p[0].expected - line["expected"]))
    report = {"num_prompts": len(ids), "num_states": len(lines), "prompt_tokens": [len(i) for i in ids],
              "chunked_prompts (> 64 tokens)": int(sum(len(i) > 64 for i in ids)),
              "second_run_cached_tokens": cached, "max_abs_diff": max(abs_err), "median_abs_diff": float(np.median(abs_err)),
              "max_rel_l2": max(rel_err), "median_rel_l2": float(np.median(rel_err)),
              "max_expected_diff_tokens": max(pred_err)}
    write_json(args.out, report)
    print(json.dumps({k: v for k, v in report.items() if k not in ("prompt_tokens", "second_run_cached_tokens")},
                     indent=1))


if __name__ == "__main__":
    main()
