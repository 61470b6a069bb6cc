"""Sampling throughput of the engines on the same requests (output tokens/s), as one JSON report.

Usage: python scripts/engine_throughput.py --config vllm-eager [--num-requests 64 --max-new-tokens 128
        --out results/scripts/engines.json]

One engine per process (a vLLM engine holds its worker process until exit); each run adds its entry
to the JSON report.

Requests are the first ``num-requests`` of the ``first`` preset's plan (real prompts, per-request
seeds, each scenario's temperature). Engine start-up is excluded; the timed part is ``generate``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from lenpred.backbone import DEFAULT_MODEL, eos_token_ids, resolve_model
from lenpred.bench.plan import make_plan, preset
from lenpred.engines import SampleRequest, VLLMOptions, make_engine
from lenpred.io import write_json

CONFIGS = {  # name -> (engine, VLLMOptions fields, environment)
    "vllm-eager": ("vllm", {"enforce_eager": True}, {}),
    # vLLM reserves one core for its scheduler process by default: on 2 cores the model gets one
    "vllm-eager-allcores": ("vllm", {"enforce_eager": True}, {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}),
    "vllm-compile": ("vllm", {"enforce_eager": False}, {}),
    "transformers": ("transformers", {}, {}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--config", choices=sorted(CONFIGS), required=True)
    ap.add_argument("--out", default="results/scripts/engines.json")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    model_dir, revision = resolve_model(DEFAULT_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    plan, _ = make_plan(preset("first", DEFAULT_MODEL), tokenizer)
    requests = [SampleRequest(p.prompt_token_ids, s, p.temperature, args.max_new_tokens)
                for p in plan for s in p.seeds][:args.num_requests]
    eos = eos_token_ids(model_dir, tokenizer)
    report = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    report = report if report.get("num_requests") == len(requests) else {"engines": {}}
    report.update({"model": DEFAULT_MODEL, "revision": revision, "num_requests": len(requests),
              "max_new_tokens": args.max_new_tokens,
                   "num_prompt_tokens": sum(len(r.prompt_token_ids) for r in requests)})
    engine_name, kwargs, env = CONFIGS[args.config]
    os.environ.update(env)
    t = time.perf_counter()
    engine = make_engine(engine_name, str(model_dir), eos, VLLMOptions(**kwargs))
    startup = time.perf_counter() - t
    t = time.perf_counter()
    results = engine.generate(requests)
    wall = time.perf_counter() - t
    out_tokens = sum(r.num_output_tokens for r in results)
    report["engines"][args.config] = {"startup_s": startup, "generate_s": wall, "output_tokens": out_tokens,
                                      "output_tok_s": out_tokens / wall, "torch_threads": torch.get_num_threads(),
                                      "env": env}
    write_json(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":  # vLLM spawns an engine process
    main()
