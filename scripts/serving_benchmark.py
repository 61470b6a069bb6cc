"""The in-engine scheduler on real traffic: ``vllm serve`` on one core, every mode on the same draws of test-split
requests, natural EOS, three arrival patterns, stall-aware latency, paired with stock vLLM.

Workload (per draw ``d``, seed ``--seed + d``): ``--num-requests`` requests drawn from the committed benchmark's test
split, every scenario mixed, each sent as a streaming chat request with its recorded sampling settings (seed,
temperature, top_p) and its recorded cap as ``max_tokens`` (1,024 for long-sequence prompts, 512 for reasoning and
RL prompts; ``--max-tokens`` clips further); nothing forces a length. Arrival patterns: ``burst`` (all at ``t = 0``:
a deep queue) and Poisson at 0.7 and 0.9 of the capacity measured by ``scripts/decode_knee.py`` (requests/s =
1 / (prefill of the mean prompt + mean output tokens / throughput at ``--max-num-seqs`` decoding)).

Modes (:data:`MODES`), all with the same engine flags (``--max-num-seqs``, KV cache, no chunked prefill):

* ``stock``: ``vllm serve`` with no plug-in flags (the reference);
* ``observe``: the plug-in capturing and predicting, stock scheduling (its overhead);
* ``parked_fcfs`` / ``parked_sjf`` / ``parked_srpt``: prefill on arrival, ``--decode-slots`` decoding, by arrival,
  by the engine's own prediction, by PLP's re-estimated remaining length;
* ``oracle_sjf``: parked SJF by the request's recorded length (sent as ``priority``, ``rank_by: priority``);
  ``prompt_oracle_sjf``: by the mean recorded length of the prompt's other test samples (the scenario's median when
  it has none): the best any prompt-only predictor can do;
* ``proxy_priority``: ``lenpred serve`` (on the client's core) in front of ``--scheduling-policy priority``.

Controls: vLLM on ``--vllm-cpus``, this client (and the proxy) on ``--client-cpus``; the whole benchmark holds
``/tmp/lenpred-cpu.lock`` (``flock``), and each run records the 1-minute load average before it; within each draw the
modes run in an order rotated by the draw (one server per mode and draw, all patterns on it), so drift hits every
mode alike. Each run is written when it finishes (``runs.json``); a restart skips finished runs, and settings that
differ from the stored ones are refused.

Report (``results/scripts/serving/benchmark/``: ``report.json``, ``report.md``, ``jct_cdf_<pattern>.png``): per pattern and
mode mean / p50 / p90 / p99 JCT, mean TTFT, p99 time between tokens, mean and p99 longest stall, JCT per output
token, throughput, preemptions, the capped share; paired against ``stock`` with two-stage bootstrap intervals over
requests clustered by draw (:func:`lenpred.metrics.paired_cluster_bootstrap`); each mode's share of both oracles'
gains; ``parked_srpt`` against ``parked_sjf``; and the simulator on the same draws with the cost model measured here
(predicted / measured mean JCT).

One draw, as a newcomer would (about 80 minutes on 2 cores: 8 modes x 3 patterns; a fresh ``--out``, since the
committed ``runs.json`` already holds draws 0-3 and a restart only adds what is missing; the prompts are re-read from
``../shared/datasets``, elsewhere set ``LENPRED_DATA_DIR``)::

    .venv-vllm/bin/python scripts/serving_benchmark.py --draws 1 --out /tmp/bench
    .venv-vllm/bin/python scripts/decode_knee.py --out /tmp/knee   # optional: this machine's own knee and cost model
                                                                  # (then pass --knee and --cost-model)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from lenpred.studies.engine_bench import (complete_draws, cpu_lock, engine_env, fmt_ci, gain_share, latency_cell,
                                          mean_cut, paired, pct, pooled, run_key)

MODES = ("stock", "observe", "parked_fcfs", "parked_sjf", "parked_srpt", "oracle_sjf", "prompt_oracle_sjf",
         "proxy_priority")
PATTERNS = {"burst": None, "poisson0.7": 0.7, "poisson0.9": 0.9}
"""Arrival pattern -> share of the measured capacity (``None``: all at once)."""
PRIORITY = {"oracle_sjf": "oracle", "prompt_oracle_sjf": "prompt_oracle"}
"""Modes whose client sends ``priority`` -> what it sends (:func:`lenpred.studies.engine_bench.row_priority`)."""
RESUME_IGNORES = ("draws", "modes", "out", "bootstrap_resamples", "report_only")


# ---------------------------------------------------------------------------------------------------- workload

def workload(args) -> tuple[list[list[dict]], dict]:
    """Per draw, ``--num-requests`` rows of :class:`lenpred.studies.engine_bench.EngineWorkload` (seed ``--seed`` +
    draw); and the chat messages by prompt id (read from the data sets, never stored)."""
    from lenpred.studies.engine_bench import EngineWorkload

    source = EngineWorkload(args.max_tokens)
    draws = [source.draw(args.num_requests, args.seed + d) for d in range(args.draws)]
    return draws, source.messages(draws)


def capacity(args) -> dict:
    """Requests/s the engine serves at ``--max-num-seqs`` decoding: 1 / (prefill of the test split's mean prompt +
    its mean output tokens / the knee's throughput at the largest measured batch <= ``--max-num-seqs``)."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.engine_bench import split_stats
    from lenpred.studies.workload import load_workload_table

    knee = json.loads(Path(args.knee).read_text())
    cost = CostModel.load(args.cost_model)
    row = max((r for r in knee["rows"] if r["decoding_requests"] <= args.max_num_seqs),
              key=lambda r: r["decoding_requests"])
    stats = split_stats(load_workload_table(token_ids=False, rebuild=False), args.max_tokens)
    prompt, out = stats["mean_prompt_tokens"], stats["mean_output_tokens"]
    seconds = cost.prefill_time_s([prompt]) + out / row["throughput_tok_s"]
    return {"capacity_req_s": round(1.0 / seconds, 4), "mean_prompt_tokens": round(prompt, 1),
            "mean_output_tokens": round(out, 1), "throughput_tok_s": round(row["throughput_tok_s"], 2),
            "at_decoding_requests": row["decoding_requests"]}


def arrivals(args, pattern: str, d: int, cap: float) -> np.ndarray:
    from lenpred.serving.simulator import arrival_times

    share = PATTERNS[pattern]
    if share is None:
        return np.zeros(args.num_requests)
    return arrival_times(args.num_requests, "poisson", share * cap, seed=args.seed + d)


# ---------------------------------------------------------------------------------------------------- servers

def mode_servers(model_dir: str, mode: str, args, log_dir: Path, client_cpus, vllm_cpus):
    """``(servers, plug-in log path)`` of one mode (:func:`lenpred.studies.engine_bench.servers`)."""
    from lenpred.serving.vllm.config import EngineConfig
    from lenpred.studies.engine_bench import plugin_args, servers, vllm_command

    extra, plugin_log = [], None
    if mode == "proxy_priority":
        extra = ["--scheduling-policy", "priority"]
    elif mode != "stock":
        policy = {"observe": "observe", "parked_fcfs": "fcfs", "parked_srpt": "srpt"}.get(mode, "sjf")
        plugin_log = log_dir / f"{mode}.jsonl"
        cfg = EngineConfig(policy=policy, decode_slots=args.decode_slots, max_idle_s=args.max_idle_s,
                           rank_by="priority" if "oracle" in mode else "prediction", log_path=str(plugin_log))
        extra = plugin_args(cfg)
    cmd = vllm_command(model_dir, args.max_num_seqs, int(args.kv_cache_gib * 2**30), 4096, extra)
    proxy_log = log_dir / "proxy.log" if mode == "proxy_priority" else None
    return servers(cmd, log_dir / f"{mode}.log", vllm_cpus, proxy_log, client_cpus), plugin_log


def run(args) -> tuple[dict, list]:
    from lenpred.backbone import resolve_model
    from lenpred.serving.loadgen import run_replay
    from lenpred.studies.engine_bench import MODEL_NAME, load_requests, one_run, pin_cores, run_grid
    from lenpred.studies.resume import load_resumable

    out = Path(args.out)
    path = out / "runs.json"
    cap = capacity(args)
    store = load_resumable(path, dict(vars(args)), ignore=RESUME_IGNORES, fingerprint={"capacity": cap})
    draws, messages = workload(args)
    model_dir = str(resolve_model()[0])
    vllm_cpus, client_cpus = pin_cores(args.vllm_cpus, args.client_cpus)
    logs: dict[str, Path | None] = {}

    def servers_for(d, mode):
        spec, logs[mode] = mode_servers(model_dir, mode, args, out / "logs", client_cpus, vllm_cpus)
        return spec

    def warm(d, mode, url):
        run_replay(url, load_requests(draws[d][:2], messages, [0, 0], f"warm-{d}-{mode}-", PRIORITY.get(mode)),
                   MODEL_NAME)

    def run_one(d, mode, pattern, url):
        tag = f"{d}-{mode}-{pattern}-"
        reqs = load_requests(draws[d], messages, arrivals(args, pattern, d, cap["capacity_req_s"]), tag,
                             PRIORITY.get(mode))
        return one_run(url, reqs, tag, logs[mode])

    def line(rec):
        s = rec["summary"]
        return (f"{s['outcomes']['ok']}/{s['num_requests']} ok, mean JCT {s['mean_jct_s']:.1f} s, "
                f"TTFT {s['mean_ttft_s']:.2f} s, p99 stall {s['p99_max_gap_s']:.2f} s, "
                f"{s['throughput_tok_s']:.0f} tok/s, {rec['preemptions']:.0f} preemptions, {rec['wall_s']:.0f} s")

    modes = [m for m in args.modes.split(",") if m]
    run_grid(store, path, args.draws, MODES, modes, list(PATTERNS), servers_for, warm, run_one, line)
    return store, draws


# ---------------------------------------------------------------------------------------------------- report

def simulated(args, store: dict, draws, cap: float) -> dict[str, dict[str, list[float]]]:
    """The simulator on the same draws: each mode's run's arrivals and the output lengths it generated, the engine's
    own predictions (the mode's plug-in log; ``parked_sjf``'s for modes without one), the cost model measured here;
    mean JCT per pattern, mode and draw."""
    import copy

    from lenpred.serving.cost_model import CostModel
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import ParkedConfig, SimConfig, simulate, simulate_parked

    cost = CostModel.load(args.cost_model)
    plan = {"stock": None, "observe": None, "proxy_priority": None, "parked_fcfs": ("fcfs", None),
            "parked_sjf": ("sjf", "engine"), "parked_srpt": ("srpt", "engine"), "oracle_sjf": ("sjf", "oracle"),
            "prompt_oracle_sjf": ("sjf", "prompt_oracle")}
    out: dict[str, dict[str, list[float]]] = {}
    for pattern, share in PATTERNS.items():
        for d, rows in enumerate(draws):
            for mode, how in plan.items():
                rec = store["runs"].get(run_key(d, mode, pattern))
                sjf = store["runs"].get(run_key(d, "parked_sjf", pattern))
                if rec is None or sjf is None:
                    continue
                gen = {r["request_id"]: r["completion_tokens"] or 1 for r in rec["results"]}
                log = rec["plugin_log"] or sjf["plugin_log"]
                pred = {int(x["request_id"].split("q")[-1].split("-")[0]): x["expected"] for x in log}
                reqs = []
                for i, row in enumerate(rows):
                    r = copy.copy(row["request"])
                    r.output_len = int(gen.get(r.request_id, row["oracle"]))
                    r.predictions = {"engine": pred.get(i, float(row["max_tokens"])), "oracle": float(row["oracle"]),
                                     "prompt_oracle": row["prompt_oracle"]}
                    reqs.append(r)
                cfg = SimConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=8192,
                                arrival="all" if share is None else "poisson", rate_per_s=(share or 1.0) * cap,
                                seed=args.seed + d)
                if how is None:
                    s = simulate(reqs, make_policy("fcfs"), cost, cfg)[0]
                else:
                    s = simulate_parked(reqs, ParkedConfig(how[0], how[1], args.decode_slots, args.max_idle_s,
                                                        prefill_ahead=None), cost,
                                        cfg)[0]
                out.setdefault(pattern, {}).setdefault(mode, []).append(s["mean_jct_s"])
    return out


def slot_sweep(args, draws, cap: float, slots=(8, 16, 24, 32, 48), deep: int = 128) -> dict:
    """The simulator's regime map on the cost model measured here: mean-JCT cut vs stock of parked SJF by the
    recorded length (``oracle``) and by the shipped head's offline prediction (``last``, the workload table's) for
    each decode-slot count, on the benchmark's draws and patterns (recorded lengths), plus a deeper burst of
    ``deep`` requests; mean over draws."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import ParkedConfig, SimConfig, simulate, simulate_parked
    from lenpred.studies.workload import draw_workload, load_workload_table

    cost = CostModel.load(args.cost_model)
    table = load_workload_table(token_ids=False, rebuild=False)
    cases = {pattern: (share, [[r["request"] for r in rows] for rows in draws]) for pattern, share in PATTERNS.items()}
    cases[f"burst of {deep}"] = (None, [draw_workload(table, deep, args.seed + d) for d in range(len(draws))])
    out = {}
    for name, (share, reqs_per_draw) in cases.items():
        cells: dict[str, list[float]] = {}
        for d, reqs in enumerate(reqs_per_draw):
            for r in reqs:
                r.output_len = min(r.output_len, r.max_new_tokens, args.max_tokens or r.max_new_tokens)
            cfg = SimConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=8192, arrival="all" if share is None else "poisson",
                            rate_per_s=(share or 1.0) * cap, seed=args.seed + d)
            base = simulate(reqs, make_policy("fcfs"), cost, cfg)[0]["mean_jct_s"]
            for k in slots:
                for pred in ("oracle", "last"):
                    s = simulate_parked(reqs, ParkedConfig("sjf", pred, k, args.max_idle_s, prefill_ahead=None), cost, cfg)[0]
                    cells.setdefault(f"{pred}/{k}", []).append(1 - s["mean_jct_s"] / base)
        out[name] = {key: float(np.mean(v)) for key, v in cells.items()}
    return out


def ranking_signal(mode: str, runs: list[dict], rows_per_draw: list[list[dict]]) -> list[tuple[float, float]]:
    """``(what the mode ranked by, the length generated)`` per finished request: the recorded length or the prompt
    oracle for the oracle modes, else the engine's own prediction from the plug-in log (empty without one)."""
    if mode in ("oracle_sjf", "prompt_oracle_sjf"):
        key = "oracle" if mode == "oracle_sjf" else "prompt_oracle"
        return [(float(rows[r["request_id"]][key]), float(r["completion_tokens"])) for run, rows in
                zip(runs, rows_per_draw) for r in run["results"] if r["outcome"] == "ok" and r["completion_tokens"]]
    return [(float(x["expected"]), float(x["num_output_tokens"])) for run in runs for x in run["plugin_log"]]


def report(args, store: dict, draws) -> dict:
    from lenpred.metrics import paired_cluster_bootstrap as boot

    cap = store["capacity"]["capacity_req_s"]
    sim = simulated(args, store, draws, cap)
    rep = {"settings": store["config"], "capacity": store["capacity"], "label": "natural EOS", "patterns": {},
           "simulated_slot_sweep": slot_sweep(args, draws, cap)}
    n = args.bootstrap_resamples
    for pattern, share in PATTERNS.items():
        modes, done = complete_draws(store, pattern, MODES, len(draws))
        if not done or "stock" not in modes:
            continue
        jct, ttft, stall = (paired(store, done, pattern, modes, k) for k in ("jct_s", "ttft_s", "max_gap_s"))
        cells = {}
        for m in modes:
            runs = [store["runs"][run_key(d, m, pattern)] for d in done]
            cells[m] = {"draws": done, **mode_cell(args, m, runs, [draws[d] for d in done], jct, ttft, stall, modes)}
            sims = sim.get(pattern, {}).get(m)
            if sims and len(sims) == len(done):
                cells[m]["simulated_mean_jct_s"] = float(np.mean(sims))
                per_draw = [float(np.mean(store_jct)) for store_jct in
                            ([r["jct_s"] for r in store["runs"][run_key(d, m, pattern)]["results"]
                              if r["outcome"] == "ok"] for d in done)]
                cells[m]["simulated_over_measured"] = float(np.mean(sims) / np.mean(per_draw))
        if {"parked_sjf", "parked_srpt"} <= set(modes):
            cells["parked_srpt"]["jct_cut_vs_parked_sjf"] = boot({"a": jct["parked_sjf"], "b": jct["parked_srpt"]},
                                                                 mean_cut("a", "b"), n)
        for m in ("parked_sjf", "parked_srpt", "oracle_sjf", "prompt_oracle_sjf"):  # ordering alone, same slots
            if {m, "parked_fcfs"} <= set(modes):
                cells[m]["jct_cut_vs_parked_fcfs"] = boot({"a": jct["parked_fcfs"], "b": jct[m]}, mean_cut("a", "b"),
                                                          n)
        rep["patterns"][pattern] = {"rate_req_s": None if share is None else share * cap, "modes": cells,
                                    "jct_pooled": {m: pooled(jct[m]) for m in modes}}
    return rep


def mode_cell(args, m: str, runs: list[dict], rows_per_draw, jct, ttft, stall, modes) -> dict:
    """One mode's cell of a pattern: :func:`lenpred.studies.engine_bench.latency_cell`, stalls, time between tokens,
    JCT per token, its ranking signal's accuracy and, against ``stock``, paired cuts and both oracles' gain shares."""
    from lenpred.metrics import paired_cluster_bootstrap as boot

    n = args.bootstrap_resamples
    res = [r for run in runs for r in run["results"] if r["outcome"] == "ok"]
    gaps = np.array([r["max_gap_s"] for r in res if r["max_gap_s"] is not None])
    c = {**latency_cell(runs),
         "p99_tbt_s": float(np.mean([run["summary"]["p99_tbt_s"] for run in runs])),
         "mean_longest_stall_s": float(gaps.mean()), "p99_longest_stall_s": float(np.percentile(gaps, 99)),
         "mean_jct_per_token_s": float(np.mean([r["jct_s"] / r["completion_tokens"] for r in res
                                                if r["completion_tokens"]]))}
    signal = ranking_signal(m, runs, rows_per_draw)
    if signal:
        from scipy.stats import kendalltau

        pred, true = np.array(signal).T
        c["prediction_mae_tokens"] = float(np.mean(np.abs(pred - true)))
        c["prediction_kendall_tau"] = float(kendalltau(pred, true).statistic)
    if m != "stock":
        c["jct_cut_vs_stock"] = boot({"a": jct["stock"], "b": jct[m]}, mean_cut("a", "b"), n)
        c["ttft_diff_vs_stock_s"] = boot({"a": ttft["stock"], "b": ttft[m]}, lambda v: v["b"].mean() - v["a"].mean(), n)
        stalls = {"a": [np.nan_to_num(v) for v in stall["stock"]], "b": [np.nan_to_num(v) for v in stall[m]]}
        c["longest_stall_diff_vs_stock_s"] = boot(stalls, lambda v: v["b"].mean() - v["a"].mean(), n)
        for oracle in ("oracle_sjf", "prompt_oracle_sjf"):
            if oracle in modes and m != oracle:
                c[f"share_of_{oracle}"] = boot({"a": jct["stock"], "b": jct[m], "o": jct[oracle]},
                                               gain_share("a", "b", "o"), n)
    return c


def markdown(rep: dict) -> str:
    from lenpred.tables import markdown_table

    sec = lambda x: f"{x:+.2f}"  # noqa: E731
    sh = lambda x: f"{x:.2f}"  # noqa: E731
    c = rep["capacity"]
    lines = [f"# lenpred inside vLLM: `vllm serve` on one core, {rep['label']}", "",
             f"Capacity {c['capacity_req_s']:.3f} req/s (mean prompt {c['mean_prompt_tokens']} tokens, mean output "
             f"{c['mean_output_tokens']} tokens, {c['throughput_tok_s']} tok/s at {c['at_decoding_requests']} "
             "decoding). Settings: " + f"`{json.dumps(rep['settings'])}`", ""]
    for pattern, p in rep["patterns"].items():
        rate = "all at once" if p["rate_req_s"] is None else f"Poisson {p['rate_req_s']:.3f} req/s"
        cells = p["modes"]
        draws = next(iter(cells.values()))["draws"]
        lines += [f"## {pattern} ({rate}; draws {draws})", ""]
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
                 fmt_ci(x["share_of_oracle_sjf"], sh) if "share_of_oracle_sjf" in x else "–",
                 fmt_ci(x["share_of_prompt_oracle_sjf"], sh) if "share_of_prompt_oracle_sjf" in x else "–",
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
            lines += [f"parked_srpt vs parked_sjf, mean JCT cut: {fmt_ci(cells['parked_srpt']['jct_cut_vs_parked_sjf'], pct)}",
                      ""]
    sweep = rep["simulated_slot_sweep"]
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


def save_report(args, store: dict, draws) -> None:
    from lenpred.io import write_json
    from lenpred.studies.scheduling_report import plot_jct_cdf

    out = Path(args.out)
    rep = report(args, store, draws)
    write_json(out / "report.json", rep)
    (out / "report.md").write_text(markdown(rep))
    import matplotlib

    matplotlib.use("Agg")
    for pattern, p in rep["patterns"].items():
        plot_jct_cdf(p["jct_pooled"], out / f"jct_cdf_{pattern}.png", f"JCT per request, {pattern} (vllm serve, 1 core)")
    print(markdown(rep))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=None, help="clip every recorded cap to this (default: none)")
    ap.add_argument("--decode-slots", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--kv-cache-gib", type=float, default=2.0)
    ap.add_argument("--max-idle-s", type=float, default=60.0)
    ap.add_argument("--vllm-cpus", default="0")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--knee", default="results/scripts/serving/decode_knee.json")
    ap.add_argument("--cost-model", default="results/scripts/serving/cost_vllm_1core.json")
    ap.add_argument("--bootstrap-resamples", type=int, default=2000)
    ap.add_argument("--report-only", action="store_true", help="write the report from the finished runs")
    ap.add_argument("--out", default="results/scripts/serving/benchmark")
    args = ap.parse_args()
    engine_env()
    if args.report_only:
        from lenpred.studies.resume import load_resumable

        store = load_resumable(Path(args.out) / "runs.json", vars(args),
                               ignore=RESUME_IGNORES, fingerprint={"capacity": capacity(args)})
        save_report(args, store, workload(args)[0])
        return
    with cpu_lock():
        store, draws = run(args)
    save_report(args, store, draws)

if __name__ == "__main__":
    from lenpred.serving.supervisor import exit_on_sigterm

    exit_on_sigterm()
    main()
