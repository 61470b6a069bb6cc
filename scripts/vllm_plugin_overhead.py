"""Throughput cost of the lenpred vLLM plug-in: stock vLLM vs the plug-in capturing and predicting (policy
``observe``: stock scheduling), the same batch on both engines, interleaved repeats in one process.

Both engines live in this process (each spawns its own engine core; the idle one waits, after ``--pause-s``: an
engine that just finished keeps polling for a few seconds and would slow the other on a shared core), in ABBA order,
so the machine's state drifts equally for both. Every request runs exactly ``--max-tokens`` tokens (``ignore_eos``: equal work is what an
overhead ratio needs; a diagnostic, not a scheduling result), greedy. Output: ``results/scripts/serving/overhead.json``.

Run alone, pinned to one core (the settings of the project's vLLM cost model)::

    flock /tmp/lenpred-cpu.lock env OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind taskset -c 0 \\
        .venv-vllm/bin/python scripts/vllm_plugin_overhead.py
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def engine(model_dir: str, plugin: bool, max_num_seqs: int):
    from vllm import LLM

    from lenpred.serving.vllm.config import EngineConfig

    extra = dict(worker_cls="lenpred.serving.vllm.worker.LenpredCPUWorker",
                 scheduler_cls="lenpred.serving.vllm.scheduler.LenpredScheduler",
                 additional_config=json.loads(EngineConfig(policy="observe").to_json())) if plugin else {}
    return LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=4096, max_num_batched_tokens=4096,
               enable_chunked_prefill=False, enable_prefix_caching=False, kv_cache_memory_bytes=1 << 30,
               max_num_seqs=max_num_seqs, seed=0, generation_config="vllm", **extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--pause-s", type=float, default=10.0)
    ap.add_argument("--out", default="results/scripts/serving/overhead.json")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import SamplingParams

    from lenpred.backbone import resolve_model
    from lenpred.studies.workload import draw_workload, load_workload_table

    model_dir, _ = resolve_model()
    table = load_workload_table(rebuild=False)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in draw_workload(table, args.num_requests, seed=0)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    engines = {"stock": engine(str(model_dir), False, args.max_num_seqs),
               "plugin": engine(str(model_dir), True, args.max_num_seqs)}
    for llm in engines.values():  # warm-up
        llm.generate(prompts[:2], params, use_tqdm=False)
    walls: dict[str, list[float]] = {k: [] for k in engines}
    for rep in range(args.repeats):
        for name in (engines if rep % 2 == 0 else reversed(list(engines))):  # ABBA order
            time.sleep(args.pause_s)  # an engine that just finished polls for a while: let it go idle first
            t = time.perf_counter()
            outs = engines[name].generate(prompts, params, use_tqdm=False)
            walls[name].append(time.perf_counter() - t)
            assert all(len(o.outputs[0].token_ids) == args.max_tokens for o in outs)
            if name == "plugin":
                assert all(o.kv_transfer_params and "lenpred" in o.kv_transfer_params for o in outs)
        print(rep, {k: round(v[-1], 2) for k, v in walls.items()}, flush=True)
    med = {k: float(np.median(v)) for k, v in walls.items()}
    ratios = [p / s for p, s in zip(walls["plugin"], walls["stock"])]
    tokens = args.num_requests * args.max_tokens
    report = {"settings": vars(args), "threads": {k: os.environ.get(k) for k in
                                                  ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")},
              "affinity": sorted(os.sched_getaffinity(0)), "wall_s": walls, "median_wall_s": med,
              "throughput_tok_s": {k: tokens / v for k, v in med.items()},
              "ratio_of_medians": med["plugin"] / med["stock"], "paired_ratios": ratios,
              "median_paired_ratio": float(np.median(ratios))}
    from lenpred.io import write_json

    write_json(args.out, report)
    print(json.dumps({k: report[k] for k in ("median_wall_s", "throughput_tok_s", "ratio_of_medians",
                                             "median_paired_ratio")}, indent=1))


if __name__ == "__main__":
    from lenpred.serving.supervisor import exit_on_sigterm

    exit_on_sigterm()
    main()
