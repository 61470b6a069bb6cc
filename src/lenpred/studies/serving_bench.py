"""The in-engine scheduler on real traffic (``scripts/serving_benchmark.py``): ``vllm serve`` on one core, every
mode on the same draws of test-split requests (:mod:`lenpred.studies.serving_bench_runs`), reported per arrival
pattern and mode, paired with stock vLLM.

Report (``report.json``, ``report.md``, ``jct_cdf_<pattern>.png``): per pattern and mode mean / p50 / p90 / p99
JCT, mean TTFT, p99 time between tokens, mean and p99 longest stall, JCT per output token, throughput, preemptions,
the capped share; paired against ``stock`` (:func:`lenpred.studies.paired.compare`: two-stage bootstrap intervals
over requests clustered by draw); each mode's share of both oracles' gains; the parked orders against
``parked_fcfs`` and ``parked_srpt`` against ``parked_sjf``; and the simulator on the same draws with the cost model
measured there (:mod:`lenpred.studies.serving_bench_sim`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lenpred.io import write_json
from lenpred.studies import report_dict
from lenpred.studies.engine_bench import complete_draws, cpu_lock, fmt_ci, latency_cell, paired, pct, pooled, run_key
from lenpred.studies.paired import compare
from lenpred.studies.serving_bench_runs import (MODES, PATTERNS, ServingBenchConfig, draw_rows, open_store,
                                                run_engines)
from lenpred.studies.serving_bench_sim import simulated, slot_sweep
from lenpred.tables import markdown_table

ORACLES = ("oracle_sjf", "prompt_oracle_sjf")
"""The modes ranked by a length no predictor has: the recorded one, the prompt's other samples' mean."""


@dataclass
class ServingBenchReport:
    """The serving benchmark's report; :meth:`to_dict` is ``report.json``."""

    settings: dict
    """The :class:`~lenpred.studies.serving_bench_runs.ServingBenchConfig` it was written with (``asdict``)."""
    capacity: dict
    """:func:`lenpred.studies.serving_bench_runs.capacity`: requests/s and what it was computed from."""
    label: str
    """What the requests' lengths are (``natural EOS``)."""
    patterns: dict
    """Per pattern with finished runs: ``rate_req_s`` (``None``: all at once), ``modes`` (per mode its cell: latency
    in s, paired ``(estimate, low, high)`` comparisons, the simulator's mean JCT) and ``jct_pooled`` (per mode every
    paired request's JCT, s)."""
    simulated_slot_sweep: dict
    """:func:`lenpred.studies.serving_bench_sim.slot_sweep`."""

    def to_dict(self) -> dict:
        return report_dict(self)


def ranking_signal(mode: str, runs: list[dict], rows_per_draw: list[list[dict]]) -> list[tuple[float, float]]:
    """``(what the mode ranked by, the length generated)`` per finished request: the recorded length or the prompt
    oracle for the oracle modes, else the engine's own prediction from the plug-in log (empty without one)."""
    if mode in ORACLES:
        key = "oracle" if mode == "oracle_sjf" else "prompt_oracle"
        return [(float(rows[r["request_id"]][key]), float(r["completion_tokens"])) for run, rows in
                zip(runs, rows_per_draw) for r in run["results"] if r["outcome"] == "ok" and r["completion_tokens"]]
    return [(float(x["expected"]), float(x["num_output_tokens"])) for run in runs for x in run["plugin_log"]]


def _after(cell: dict, key: str, extra: dict) -> dict:
    """``cell`` with ``extra`` inserted right after ``key`` (the committed report's column order)."""
    out = {}
    for k, v in cell.items():
        out[k] = v
        if k == key:
            out.update(extra)
    return out


def mode_cell(cfg: ServingBenchConfig, m: str, runs: list[dict], rows_per_draw, jct, ttft, stall, modes) -> dict:
    """One mode's cell of a pattern: :func:`lenpred.studies.engine_bench.latency_cell`, stalls, time between tokens,
    JCT per token, its ranking signal's accuracy and, against ``stock``, paired cuts and both oracles' gain shares."""
    n = cfg.bootstrap_resamples
    res = [r for run in runs for r in run["results"] if r["outcome"] == "ok"]
    gaps = np.array([r["max_gap_s"] for r in res if r["max_gap_s"] is not None])
    c = _after(latency_cell(runs), "mean_ttft_s", {
        "p99_tbt_s": float(np.mean([run["summary"]["p99_tbt_s"] for run in runs])),
        "mean_longest_stall_s": float(gaps.mean()), "p99_longest_stall_s": float(np.percentile(gaps, 99)),
        "mean_jct_per_token_s": float(np.mean([r["jct_s"] / r["completion_tokens"] for r in res
                                               if r["completion_tokens"]]))})
    signal = ranking_signal(m, runs, rows_per_draw)
    if signal:
        from scipy.stats import kendalltau

        pred, true = np.array(signal).T
        c["prediction_mae_tokens"] = float(np.mean(np.abs(pred - true)))
        c["prediction_kendall_tau"] = float(kendalltau(pred, true).statistic)
    if m != "stock":
        c["jct_cut_vs_stock"] = compare("mean_cut", jct["stock"], jct[m], n)
        c["ttft_diff_vs_stock_s"] = compare("mean_diff", ttft["stock"], ttft[m], n)
        c["longest_stall_diff_vs_stock_s"] = compare("mean_diff", [np.nan_to_num(v) for v in stall["stock"]],
                                                     [np.nan_to_num(v) for v in stall[m]], n)
        for oracle in ORACLES:
            if oracle in modes and m != oracle:
                c[f"share_of_{oracle}"] = compare("oracle_share", jct["stock"], jct[m], n, oracle=jct[oracle])
    return c


def pattern_report(cfg: ServingBenchConfig, store: dict, draws, pattern: str, sim: dict) -> dict | None:
    """One pattern's part of :attr:`ServingBenchReport.patterns` (``None``: stock has no finished draw)."""
    n, cap = cfg.bootstrap_resamples, store["capacity"]["capacity_req_s"]
    modes, done = complete_draws(store, pattern, MODES, len(draws))
    if not done or "stock" not in modes:
        return None
    jct, ttft, stall = (paired(store, done, pattern, modes, k) for k in ("jct_s", "ttft_s", "max_gap_s"))
    cells = {}
    for m in modes:
        runs = [store["runs"][run_key(d, m, pattern)] for d in done]
        cells[m] = {"draws": done, **mode_cell(cfg, m, runs, [draws[d] for d in done], jct, ttft, stall, modes)}
        sims = sim.get(pattern, {}).get(m)
        if sims and len(sims) == len(done):
            measured = [float(np.mean([r["jct_s"] for r in run["results"] if r["outcome"] == "ok"])) for run in runs]
            cells[m]["simulated_mean_jct_s"] = float(np.mean(sims))
            cells[m]["simulated_over_measured"] = float(np.mean(sims) / np.mean(measured))
    if {"parked_sjf", "parked_srpt"} <= set(modes):
        cells["parked_srpt"]["jct_cut_vs_parked_sjf"] = compare("mean_cut", jct["parked_sjf"], jct["parked_srpt"], n)
    for m in ("parked_sjf", "parked_srpt", *ORACLES):  # ordering alone, the same slots
        if {m, "parked_fcfs"} <= set(modes):
            cells[m]["jct_cut_vs_parked_fcfs"] = compare("mean_cut", jct["parked_fcfs"], jct[m], n)
    share = PATTERNS[pattern]
    return {"rate_req_s": None if share is None else share * cap, "modes": cells,
            "jct_pooled": {m: pooled(jct[m]) for m in modes}}


def build_report(cfg: ServingBenchConfig, store: dict, draws: list[list[dict]]) -> ServingBenchReport:
    """The report of the finished runs in ``store`` (:func:`lenpred.studies.serving_bench_runs.open_store`) on
    ``draws`` (their rows, :func:`lenpred.studies.serving_bench_runs.draw_rows`)."""
    cap = store["capacity"]["capacity_req_s"]
    sim = simulated(cfg, store, draws, cap)
    rep = ServingBenchReport(store["config"], store["capacity"], "natural EOS", {}, slot_sweep(cfg, draws, cap))
    for pattern in PATTERNS:
        part = pattern_report(cfg, store, draws, pattern, sim)
        if part is not None:
            rep.patterns[pattern] = part
    return rep


def _pattern_markdown(pattern: str, p: dict) -> list[str]:
    sec, sh = (lambda x: f"{x:+.2f}"), (lambda x: f"{x:.2f}")
    rate = "all at once" if p["rate_req_s"] is None else f"Poisson {p['rate_req_s']:.3f} req/s"
    cells = p["modes"]
    lines = [f"## {pattern} ({rate}; draws {next(iter(cells.values()))['draws']})", ""]
    rows = [[m, f"{x['mean_jct_s']:.1f}", f"{x['p50_jct_s']:.1f}", f"{x['p90_jct_s']:.1f}", f"{x['p99_jct_s']:.1f}",
             f"{x['mean_ttft_s']:.2f}", f"{x['p99_tbt_s']:.2f}", f"{x['mean_longest_stall_s']:.2f}",
             f"{x['p99_longest_stall_s']:.2f}", f"{1e3 * x['mean_jct_per_token_s']:.0f}",
             f"{x['throughput_tok_s']:.0f}", f"{x['preemptions']:.0f}", f"{x['capped_share']:.0%}"]
            for m, x in cells.items()]
    lines += [markdown_table(["mode", "mean JCT s", "p50", "p90", "p99", "mean TTFT s", "p99 TBT s",
                              "mean longest stall s", "p99 longest stall s", "JCT/token ms", "tok/s",
                              "preemptions", "capped"], rows), ""]
    rows = [[m, fmt_ci(x["jct_cut_vs_stock"], pct), fmt_ci(x["ttft_diff_vs_stock_s"], sec),
             fmt_ci(x["longest_stall_diff_vs_stock_s"], sec),
             *(fmt_ci(x[f"share_of_{o}"], sh) if f"share_of_{o}" in x else "–" for o in ORACLES),
             f"{x['simulated_mean_jct_s']:.1f} ({x['simulated_over_measured']:.2f})"
             if "simulated_mean_jct_s" in x else "–",
             f"{x['prediction_mae_tokens']:.0f} / {x['prediction_kendall_tau']:.2f}"
             if "prediction_mae_tokens" in x else "–"]
            for m, x in cells.items() if m != "stock"]
    lines += [markdown_table(["mode", "mean JCT cut vs stock", "Δ mean TTFT s", "Δ mean longest stall s",
                              "share of oracle gain", "share of prompt-oracle gain", "sim. mean JCT s (sim/real)",
                              "ranked by: MAE / Kendall tau"], rows), ""]
    ordering = [f"{m} {fmt_ci(x['jct_cut_vs_parked_fcfs'], pct)}" for m, x in cells.items()
                if "jct_cut_vs_parked_fcfs" in x]
    if ordering:
        lines += ["Ordering alone (mean JCT cut vs parked_fcfs, the same decode slots): " + "; ".join(ordering) + ".",
                  ""]
    if "jct_cut_vs_parked_sjf" in cells.get("parked_srpt", {}):
        cut = fmt_ci(cells["parked_srpt"]["jct_cut_vs_parked_sjf"], pct)
        lines += [f"parked_srpt vs parked_sjf, mean JCT cut: {cut}", ""]
    return lines


def render_markdown(rep: ServingBenchReport) -> str:
    """``report.md``: capacity and settings, per pattern the latency table, the paired comparisons and the
    orderings, and the simulator's regime map."""
    c = rep.capacity
    lines = [f"# lenpred inside vLLM: `vllm serve` on one core, {rep.label}", "",
             f"Capacity {c['capacity_req_s']:.3f} req/s (mean prompt {c['mean_prompt_tokens']} tokens, mean output "
             f"{c['mean_output_tokens']} tokens, {c['throughput_tok_s']} tok/s at {c['at_decoding_requests']} "
             "decoding). Settings: " + f"`{json.dumps(rep.settings)}`", ""]
    for pattern, p in rep.patterns.items():
        lines += _pattern_markdown(pattern, p)
    sweep = rep.simulated_slot_sweep
    slots = sorted({int(k.split("/")[1]) for v in sweep.values() for k in v})
    lines += ["## The simulator's regime map (cost model measured here, recorded lengths)", "",
              "Mean-JCT cut vs stock vLLM of parked SJF by the recorded length (oracle) / by the shipped head "
              "(`last`), per decode-slot count:", "",
              markdown_table(["workload"] + [f"{k} slots" for k in slots],
                             [[name] + [f"{v[f'oracle/{k}']:+.1%} / {v[f'last/{k}']:+.1%}" for k in slots]
                              for name, v in sweep.items()]), ""]
    lines += ["Intervals: 95 %, two-stage paired bootstrap over requests clustered by draw. Shares of an oracle's "
              "gain are unstable when that gain is near 0.", ""]
    return "\n".join(lines)


def save_report(rep: ServingBenchReport, out: str | Path) -> None:
    """``out/report.json``, ``out/report.md`` and a JCT CDF per pattern (``jct_cdf_<pattern>.png``)."""
    from lenpred.studies.scheduling_report import plot_jct_cdf

    out = Path(out)
    write_json(out / "report.json", rep.to_dict())
    (out / "report.md").write_text(render_markdown(rep))
    for pattern, p in rep.patterns.items():
        plot_jct_cdf(p["jct_pooled"], out / f"jct_cdf_{pattern}.png",
                     f"JCT per request, {pattern} (vllm serve, 1 core)")


def run(cfg: ServingBenchConfig) -> ServingBenchReport:
    """The runs not yet finished (under the machine-wide CPU lock; none with ``cfg.report_only``), then the report,
    written to ``cfg.out`` (:func:`save_report`).

    Raises:
        LenpredError: ``cfg.out`` holds runs made with other settings."""
    if cfg.report_only:
        store, draws = open_store(cfg), draw_rows(cfg)[1]
    else:
        with cpu_lock():
            store, draws = run_engines(cfg)
    rep = build_report(cfg, store, draws)
    save_report(rep, cfg.out)
    return rep
