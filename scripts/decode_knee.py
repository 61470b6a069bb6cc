"""The decode-slot knee: engine throughput (output tok/s) and step time of the real vLLM engine against the number of
requests decoding together, on the serving benchmark's core layout (the engine pinned to one core).

For each batch size B: B requests of ``--prompt-tokens`` tokens are added to ``vllm.LLM``'s engine and stepped until
all are prefilled, then ``--steps`` decode steps are timed one by one (``ignore_eos`` with a large cap, so B stays
constant). Throughput is ``B / median step time``. ``--sampling greedy`` decodes greedily (the committed
``cost_vllm_1core.json``); ``--sampling recorded`` samples as the benchmark's requests do (temperature 0.7, top_p 1,
a seed per request: vLLM then draws each request's noise with its own generator, a per-sequence cost greedy decoding
does not pay) and writes ``*_sampled`` files. Prefill-only requests (``max_tokens=1``) at several prompt lengths
and batch sizes are timed as well, and :class:`lenpred.serving.cost_model.CostModel` is fitted to both (the cost
model of this machine, for the serving benchmark's simulator). Two readings of the knee are reported: the
smallest B whose throughput reaches ``--knee-share`` (default 0.8) of the largest measured, and the fitted
half-saturation point ``d0 / d1`` of the step-time model ``d0 + d1·B + d2·C`` (throughput ``B / step`` is half its
ceiling ``1 / d1`` there). Parking below the knee throws away throughput; above it, parking gains little.

Output: ``results/scripts/serving/decode_knee.{json,png}`` and ``cost_vllm_1core.json``::

    .venv-vllm/bin/python scripts/decode_knee.py            # ~3 min on one core
    .venv-vllm/bin/python scripts/decode_knee.py --sampling recorded   # the serving benchmarks' sampling
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def _distinct_prompt(tag: int, n: int) -> dict:
    """Token ids no other request shares (no prefix-cache hits)."""
    return {"prompt_token_ids": [(100 + 7 * tag + 13 * j) % 40000 + 10 for j in range(n)]}


def sampling_params(sampling: str, max_tokens: int, seed: int):
    """vLLM ``SamplingParams``: greedy, or as recorded (temperature 0.7, top_p 1, a per-request ``seed``)."""
    from vllm import SamplingParams

    if sampling == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    return SamplingParams(temperature=0.7, top_p=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True,
                          detokenize=False)


def measure(llm, batch_sizes: list[int], prompt_tokens: int, steps: int,
            sampling: str = "greedy") -> tuple[list[dict], list[dict]]:
    """Per batch size: the median decode step (s) and throughput; and every timed decode step as a cost-model
    measurement (``kind="decode"``, batch size, context tokens, wall seconds)."""
    engine = llm.llm_engine
    rows, points = [], []
    for b in batch_sizes:
        for i in range(b):
            engine.add_request(f"knee-{b}-{i}", _distinct_prompt(1000 * b + i, prompt_tokens),
                               sampling_params(sampling, steps + 8, 1000 * b + i))
        started: set[str] = set()
        while len(started) < b:  # until every request has its first token (prefill done)
            started |= {o.request_id for o in engine.step() if o.outputs and o.outputs[0].token_ids}
        times = []
        for k in range(steps):
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
            points.append({"kind": "decode", "batch_size": b, "context_tokens": b * (prompt_tokens + 1 + k),
                           "wall_s": times[-1]})
        while engine.has_unfinished_requests():
            engine.step()
        step = statistics.median(times)
        rows.append({"decoding_requests": b, "median_step_s": step,
                     "p90_step_s": sorted(times)[int(0.9 * len(times))], "throughput_tok_s": b / step})
        print(f"B={b:3d}: step {step * 1e3:6.1f} ms, {b / step:6.1f} tok/s", flush=True)
    return rows, points


def measure_prefill(llm, shapes: list[tuple[int, int]], repeats: int = 3) -> list[dict]:
    """Prefill-only runs (``max_tokens=1``): B prompts of P tokens, wall seconds until all finished; cost-model
    measurements with ``num_new_tokens=1``."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    points = []
    for n, (b, p) in enumerate(s for s in shapes for _ in range(repeats)):
        t = time.perf_counter()
        for i in range(b):
            engine.add_request(f"prefill-{n}-{i}", _distinct_prompt(100000 + 100 * n + i, p), params)
        while engine.has_unfinished_requests():
            engine.step()
        points.append({"batch_size": b, "prompt_tokens": [p] * b, "num_new_tokens": 1,
                       "wall_s": time.perf_counter() - t})
    for b, p in shapes:
        w = [m["wall_s"] for m in points if m["batch_size"] == b and m["prompt_tokens"][0] == p]
        print(f"prefill {b} x {p} tokens: {statistics.median(w):.3f} s", flush=True)
    return points


def knee(rows: list[dict], share: float) -> int:
    """The smallest batch size whose throughput reaches ``share`` of the largest measured."""
    best = max(r["throughput_tok_s"] for r in rows)
    return min(r["decoding_requests"] for r in rows if r["throughput_tok_s"] >= share * best)


def plot(rows: list[dict], k: int, half: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = [r["decoding_requests"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(b, [r["throughput_tok_s"] for r in rows], "o-", label="throughput (tok/s)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests decoding together")
    ax.set_ylabel("output tok/s")
    ax2 = ax.twinx()
    ax2.plot(b, [1e3 * r["median_step_s"] for r in rows], "s--", color="C1", label="step time (ms)")
    ax2.set_ylabel("median decode step (ms)")
    ax.axvline(k, color="grey", ls=":", label=f"80 % of the best: {k}")
    if half:
        ax.axvline(half, color="C2", ls="-.", label=f"half-saturation d0/d1: {half:.0f}")
    fig.legend(loc="upper left", bbox_to_anchor=(0.12, 0.88), fontsize=8)
    ax.set_title("vLLM (CPU, 1 core) decode throughput vs batch")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,24,32,48,64")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--knee-share", type=float, default=0.8)
    ap.add_argument("--cpus", default="0")
    ap.add_argument("--sampling", choices=("greedy", "recorded"), default="greedy")
    ap.add_argument("--out", default="results/scripts/serving")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the stored JSON")
    args = ap.parse_args()
    suffix = "" if args.sampling == "greedy" else "_sampled"
    if args.plot_only:
        rep = json.loads((Path(args.out) / f"decode_knee{suffix}.json").read_text())
        plot(rep["rows"], rep["knee"], rep["half_saturation_B"], Path(args.out) / f"decode_knee{suffix}.png")
        return
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from lenpred.backbone import resolve_model
    from lenpred.io import write_json
    from lenpred.serving.supervisor import parse_cpu_set

    os.sched_setaffinity(0, parse_cpu_set(args.cpus, "--cpus"))  # the engine process inherits it
    from vllm import LLM

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    model_dir = str(resolve_model()[0])
    llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, enable_chunked_prefill=False,
              enable_prefix_caching=False, max_model_len=4096, max_num_batched_tokens=max(8192, max(sizes) * 160),
              max_num_seqs=max(sizes), kv_cache_memory_bytes=2 << 30, generation_config="vllm", seed=0)
    measure(llm, [1], args.prompt_tokens, 4, args.sampling)  # warm-up
    rows, decode_points = measure(llm, sizes, args.prompt_tokens, args.steps, args.sampling)
    prefill_points = measure_prefill(llm, [(1, 32), (1, 64), (1, 128), (1, 256), (1, 512), (1, 1024), (4, 128),
                                           (8, 128), (16, 128)])
    k = knee(rows, args.knee_share)
    out = Path(args.out)
    import vllm

    from lenpred.serving.cost_model import CostModel, hardware_description

    cost = CostModel.fit(decode_points + prefill_points, engine="vllm",
                         hardware=hardware_description({"vllm": vllm.__version__}), fused_prefill=True,
                         settings={"source": "scripts/decode_knee.py", "cpus": args.cpus, "dtype": "float32",
                                   "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"], "enable_chunked_prefill": False,
                                   "sampling": args.sampling})
    cost.save(out / f"cost_vllm_1core{suffix}.json")
    c = cost.coefficients
    write_json(out / f"decode_knee{suffix}.json", {
        "settings": vars(args), "vllm": vllm.__version__, "rows": rows, "knee": k,
        "rule": f"smallest B with >= {args.knee_share} of the best measured throughput",
        "half_saturation_B": c["d0"] / c["d1"] if c["d1"] > 0 else None,
        "saturation_tok_s": 1 / c["d1"] if c["d1"] > 0 else None, "cost_model": c, "fit_stats": cost.fit_stats,
        "prefill": prefill_points})
    print(f"cost model: {c}, fit {cost.fit_stats}")
    plot(rows, k, c["d0"] / c["d1"] if c["d1"] > 0 else None, out / f"decode_knee{suffix}.png")
    print(f"knee: {k} decoding requests ({out / f'decode_knee{suffix}.json'}, {out / f'decode_knee{suffix}.png'})")


if __name__ == "__main__":
    main()
