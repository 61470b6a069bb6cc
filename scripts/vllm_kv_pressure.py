"""Parked requests under KV pressure on the real engine: a burst of 128 test-split requests against a 64 MiB KV cache
with 4 decode slots (parked SJF), natural EOS with each request's recorded cap clipped to ``--max-tokens``; every
request must finish. Then a prompt longer than the engine can hold must be refused within 5 s. Reports the plug-in's
releases, KV preemptions and recomputed tokens (its scheduler counters). Output:
``results/scripts/serving/kv_pressure.json``::

    flock /tmp/lenpred-cpu.lock taskset -c 0 .venv-vllm/bin/python scripts/vllm_kv_pressure.py
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--num-requests", type=int, default=128)
    ap.add_argument("--kv-cache-mib", type=int, default=64)
    ap.add_argument("--decode-slots", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--out", default="results/scripts/serving/kv_pressure.json")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM, SamplingParams

    from lenpred.backbone import resolve_model
    from lenpred.io import write_json
    from lenpred.serving.vllm.config import EngineConfig
    from lenpred.studies.workload import draw_workload, load_workload_table

    reqs = draw_workload(load_workload_table(rebuild=False), args.num_requests, seed=11)
    log = Path(tempfile.mkdtemp()) / "requests.jsonl"
    cfg = EngineConfig(policy="sjf", decode_slots=args.decode_slots, log_path=str(log))
    llm = LLM(model=str(resolve_model()[0]), dtype="float32", enforce_eager=True, max_model_len=args.max_model_len,
              enable_chunked_prefill=False, max_num_batched_tokens=args.max_model_len, enable_prefix_caching=False,
              kv_cache_memory_bytes=args.kv_cache_mib << 20, max_num_seqs=args.num_requests, seed=0,
              generation_config="vllm", worker_cls="lenpred.serving.vllm.worker.LenpredCPUWorker",
              scheduler_cls="lenpred.serving.vllm.scheduler.LenpredScheduler",
              additional_config=json.loads(cfg.to_json()))
    prompts = [{"prompt_token_ids": list(r.prompt_token_ids)[:args.max_model_len - args.max_tokens]} for r in reqs]
    params = [SamplingParams(max_tokens=min(r.max_new_tokens, args.max_tokens), temperature=0.7, seed=k)
              for k, r in enumerate(reqs)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=True)
    burst_s = time.perf_counter() - t0
    finished = sum(o.outputs[0].finish_reason in ("stop", "length") for o in outs)
    t1 = time.perf_counter()
    try:
        llm.generate([{"prompt_token_ids": [100] * (args.max_model_len + 100)}], SamplingParams(max_tokens=4),
                     use_tqdm=False)
        refusal = None
    except Exception as exc:  # vLLM refuses the request before it reaches the scheduler
        refusal = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    refusal_s = time.perf_counter() - t1
    del llm  # the scheduler writes its final counters at shutdown
    time.sleep(2)
    counters = json.loads(Path(f"{log}.scheduler.json").read_text())
    result = {"settings": vars(args), "num_finished": finished, "num_requests": len(outs), "burst_s": burst_s,
              "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
              "num_preemptions_vllm": sum(json.loads(x)["num_preemptions"] for x in log.read_text().splitlines()),
              "scheduler_counters": counters, "too_long_prompt_error": refusal, "too_long_prompt_error_s": refusal_s}
    write_json(Path(args.out), result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
