"""The decode-slot knee (``scripts/decode_knee.py``): the real vLLM engine's throughput (output tok/s) and step time
against the number of requests decoding together, the engine pinned to the serving benchmark's core; and the cost
model of this machine fitted to the same steps.

For each batch size B: B requests of ``prompt_tokens`` tokens are added to ``vllm.LLM``'s engine and stepped until
all are prefilled, then ``steps`` decode steps are timed one by one (``ignore_eos`` with a large cap, so B stays
constant). Throughput is ``B / median step time``. ``sampling="greedy"`` decodes greedily (the committed
``cost_vllm_1core.json``); ``"recorded"`` samples as the benchmark's requests do (temperature 0.7, top_p 1, a seed
per request: vLLM then draws each request's noise with its own generator, a per-sequence cost greedy decoding does
not pay) and writes ``*_sampled`` files. Prefill-only requests (``max_tokens=1``) at several prompt lengths and batch
sizes are timed as well, and :class:`lenpred.serving.cost_model.CostModel` is fitted to both. Two readings of the
knee: the smallest B whose throughput reaches ``knee_share`` of the largest measured (:func:`knee`), and the fitted
half-saturation point ``d0 / d1`` of the step-time model ``d0 + d1·B + d2·C`` (:func:`half_saturation`; throughput
``B / step`` is half its ceiling ``1 / d1`` there). Parking below the knee throws away throughput; above it, parking
gains little.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lenpred.errors import LenpredError
from lenpred.io import write_json
from lenpred.studies import report_dict

PREFILL_SHAPES = ((1, 32), (1, 64), (1, 128), (1, 256), (1, 512), (1, 1024), (4, 128), (8, 128), (16, 128))
"""``(batch size, prompt tokens)`` of the timed prefill-only runs."""
SAMPLINGS = ("greedy", "recorded")


@dataclass
class DecodeKneeConfig:
    """Settings of the decode-knee measurement."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
    """Requests decoding together, each measured once."""
    prompt_tokens: int = 128
    """Prompt tokens of every decoding request."""
    steps: int = 48
    """Timed decode steps per batch size."""
    knee_share: float = 0.8
    """The knee: the smallest batch reaching this share of the best measured throughput."""
    cpus: str = "0"
    """CPU ids this process (and the engine it starts) is pinned to."""
    sampling: str = "greedy"
    """``greedy`` or ``recorded`` (temperature 0.7, a seed per request; files get a ``_sampled`` suffix)."""
    out: str = "results/scripts/serving"
    """Directory of ``decode_knee{suffix}.json``, ``.png`` and ``cost_vllm_1core{suffix}.json``."""

    def __post_init__(self):
        if self.sampling not in SAMPLINGS:
            raise LenpredError(f"unknown sampling '{self.sampling}'; valid: {', '.join(SAMPLINGS)}")
        if not self.batch_sizes or min(self.batch_sizes) < 1 or not 0 < self.knee_share <= 1:
            raise LenpredError("batch_sizes must be >= 1 and knee_share in (0, 1]")

    def path(self, stem: str, ext: str = "json") -> Path:
        """``out/<stem><suffix>.<ext>``, the suffix ``_sampled`` for recorded sampling."""
        return Path(self.out) / f"{stem}{'' if self.sampling == 'greedy' else '_sampled'}.{ext}"


@dataclass
class DecodeKneeReport:
    """``decode_knee{suffix}.json``."""

    settings: dict
    """The config it was measured with (``asdict``)."""
    vllm: str
    """vLLM's version."""
    rows: list
    """Per batch size: ``decoding_requests``, ``median_step_s``, ``p90_step_s``, ``throughput_tok_s``."""
    knee: int
    """:func:`knee` of ``rows``."""
    rule: str
    """The knee's rule in words."""
    half_saturation_B: float | None
    """:func:`half_saturation` of the fitted cost model (requests)."""
    saturation_tok_s: float | None
    """The fitted ceiling ``1 / d1`` (tok/s; ``None`` when ``d1 <= 0``)."""
    cost_model: dict
    """The fitted coefficients (:attr:`lenpred.serving.cost_model.CostModel.coefficients`)."""
    fit_stats: dict
    """The fit's statistics."""
    prefill: list
    """The prefill-only measurements (cost-model points)."""

    def to_dict(self) -> dict:
        return report_dict(self)


def knee(rows: list[dict], share: float) -> int:
    """The smallest batch size whose throughput reaches ``share`` of the largest measured."""
    best = max(r["throughput_tok_s"] for r in rows)
    return min(r["decoding_requests"] for r in rows if r["throughput_tok_s"] >= share * best)


def half_saturation(coefficients: dict) -> float | None:
    """``d0 / d1`` of the step-time model ``d0 + d1·B + d2·C``: the batch at half the ceiling ``1 / d1`` (``None``
    when ``d1 <= 0``: no ceiling)."""
    return coefficients["d0"] / coefficients["d1"] if coefficients["d1"] > 0 else None


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


def measure(llm, batch_sizes, prompt_tokens: int, steps: int, sampling: str = "greedy") -> tuple[list, list]:
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


def measure_prefill(llm, shapes=PREFILL_SHAPES, repeats: int = 3) -> list[dict]:
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


def plot(rows: list[dict], k: int, half: float | None, path: Path) -> None:
    """Throughput and median step time against the batch size, the knee and the half-saturation point marked."""
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


def replot(cfg: DecodeKneeConfig) -> Path:
    """Redraw ``decode_knee{suffix}.png`` from the stored JSON; returns its path."""
    rep = json.loads(cfg.path("decode_knee").read_text())
    plot(rep["rows"], rep["knee"], rep["half_saturation_B"], cfg.path("decode_knee", "png"))
    return cfg.path("decode_knee", "png")


def _engine(cfg: DecodeKneeConfig):
    """``vllm.LLM`` on the shipped model, float32, eager, no chunked prefill or prefix caching, 2 GiB of KV cache,
    room for the largest batch."""
    from vllm import LLM

    from lenpred.backbone import resolve_model

    top = max(cfg.batch_sizes)
    return LLM(model=str(resolve_model()[0]), dtype="float32", enforce_eager=True, enable_chunked_prefill=False,
               enable_prefix_caching=False, max_model_len=4096, max_num_batched_tokens=max(8192, top * 160),
               max_num_seqs=top, kv_cache_memory_bytes=2 << 30, generation_config="vllm", seed=0)


def run(cfg: DecodeKneeConfig) -> DecodeKneeReport:
    """Measure, fit and write ``cost_vllm_1core{suffix}.json``, ``decode_knee{suffix}.json`` and ``.png``. Pins this
    process to ``cfg.cpus`` and sets the engine's environment (:func:`lenpred.studies.engine_bench.engine_env`)."""
    import vllm

    from lenpred.serving.cost_model import CostModel, hardware_description
    from lenpred.serving.supervisor import parse_cpu_set
    from lenpred.studies.engine_bench import engine_env

    engine_env()
    os.sched_setaffinity(0, parse_cpu_set(cfg.cpus, "--cpus"))  # the engine process inherits it
    llm = _engine(cfg)
    measure(llm, [1], cfg.prompt_tokens, 4, cfg.sampling)  # warm-up
    rows, decode_points = measure(llm, cfg.batch_sizes, cfg.prompt_tokens, cfg.steps, cfg.sampling)
    prefill_points = measure_prefill(llm)
    cost = CostModel.fit(decode_points + prefill_points, engine="vllm",
                         hardware=hardware_description({"vllm": vllm.__version__}), fused_prefill=True,
                         settings={"source": "scripts/decode_knee.py", "cpus": cfg.cpus, "dtype": "float32",
                                   "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"], "enable_chunked_prefill": False,
                                   "sampling": cfg.sampling})
    cost.save(cfg.path("cost_vllm_1core"))
    c = cost.coefficients
    print(f"cost model: {c}, fit {cost.fit_stats}")
    rep = DecodeKneeReport(asdict(cfg), vllm.__version__, rows, knee(rows, cfg.knee_share),
                           f"smallest B with >= {cfg.knee_share} of the best measured throughput", half_saturation(c),
                           1 / c["d1"] if c["d1"] > 0 else None, c, cost.fit_stats, prefill_points)
    write_json(cfg.path("decode_knee"), rep.to_dict())
    plot(rows, rep.knee, rep.half_saturation_B, cfg.path("decode_knee", "png"))
    return rep
