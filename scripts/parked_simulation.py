"""Parked decoding in the simulator: can prefill-on-arrival + parked decode, re-ranked with what decoding reveals,
beat SJF by the prompt oracle? Stock continuous batching (FCFS, SJF by prediction at admission — which an engine
cannot do, since the prediction exists only after the prefill) vs parked FCFS / SJF / SRPT driven by the shipped
head, PLP, TRAIL-progressive and the static head conditioned on the tokens generated, vs parked SJF by the prompt
oracle (mean length of the prompt's other test samples) and by the recorded length.

Committed workload table and progressive estimates, the transformers cost model of ``lenpred schedule simulate``
(same settings: 200 requests per draw, ``max_num_seqs`` 8 = the decode slots, token budget 2048), all-at-once and
Poisson arrivals at 0.9 × the FCFS throughput. Shares of the oracle's gain are paired bootstraps over draws.
Output: ``results/scripts/serving/parked_simulation.{json,md}``::

    python scripts/parked_simulation.py --draws 10
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np


def prompt_oracle(table) -> np.ndarray:
    """Per row: the mean output length of the *other* test samples of its prompt (its own if it has none)."""
    pids = np.asarray(table.column("prompt_id").to_pylist())
    y = np.asarray(table.column("output_len").to_pylist(), dtype=np.float64)
    out = np.empty_like(y)
    for p in np.unique(pids):
        idx = np.flatnonzero(pids == p)
        total = y[idx].sum()
        out[idx] = (total - y[idx]) / (len(idx) - 1) if len(idx) > 1 else y[idx]
    return out


def main() -> None:
    from lenpred.io import write_json
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.simulate import draw_bootstrap
    from lenpred.serving.policies import countdown_remaining, make_policy, progressive_remaining
    from lenpred.serving.simulator import ParkedConfig, SimConfig, simulate, simulate_parked
    from lenpred.studies.workload import draw_workload, load_workload_table, progressive_estimates

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--decode-slots", type=int, default=8)
    ap.add_argument("--max-idle-s", type=float, default=None)
    ap.add_argument("--cost-model", default="results/scheduling/cost_transformers.json")
    ap.add_argument("--prefill-scale", type=float, default=1.0,
                    help="multiply the cost model's prefill coefficients (p0, p1, p2): < 1 models an engine whose "
                         "prefill is cheaper relative to decode (a GPU), where prefill on arrival costs less")
    ap.add_argument("--max-tokens", type=int, default=None, help="clip every cap (and recorded length) to this")
    ap.add_argument("--prefill-ahead", type=int, default=None, help="parked policies' prefill-ahead bound")
    ap.add_argument("--out", default="results/scripts/serving/parked_simulation")
    args = ap.parse_args()
    cost = CostModel.load(args.cost_model)
    for k in ("p0", "p1", "p2"):
        cost.coefficients[k] *= args.prefill_scale
    table = load_workload_table(token_ids=False, rebuild=False)
    progressive = progressive_estimates("results/progressive/test_estimates.parquet", table)
    steps = tuple(sorted({t for est in progressive.values() for by in est.values() for t in by}))
    oracle_p = prompt_oracle(table)
    stock = SimConfig(max_num_seqs=args.decode_slots, max_num_batched_tokens=2048)
    def clip(r) -> None:
        if args.max_tokens is not None:
            r.max_new_tokens = min(r.max_new_tokens, args.max_tokens)
            r.output_len = min(r.output_len, args.max_tokens)
            r.predictions = {k: min(v, args.max_tokens) for k, v in r.predictions.items()}

    first = draw_workload(table, args.num_requests, 0)
    for r in first:
        clip(r)
    rate = 0.9 * args.num_requests / simulate(first, make_policy("fcfs"), cost, stock)[0]["makespan_s"]
    rows: dict[str, list[float]] = {}
    for d in range(args.draws):
        reqs = draw_workload(table, args.num_requests, d)
        for r in reqs:
            clip(r)
            r.predictions["prompt_oracle"] = float(min(oracle_p[r.table_row], r.max_new_tokens))
            r.predictions |= {m: min(est[r.table_row][0], r.max_new_tokens)  # step-0 estimates
                              for m, est in progressive.items()}
        for arrival in ("all", "poisson"):
            cfg = dataclasses.replace(stock, arrival=arrival, rate_per_s=rate, seed=d)
            parked_cfg = dataclasses.replace(cfg, max_num_seqs=10_000)
            runs = {"fcfs": simulate(reqs, make_policy("fcfs"), cost, cfg)[0],
                    "sjf:last (admission, not reachable in-engine)": simulate(reqs, make_policy("sjf:last"), cost, cfg)[0],
                    "sjf:oracle (admission)": simulate(reqs, make_policy("sjf:oracle"), cost, cfg)[0]}
            parked = {"parked_fcfs": ("fcfs", None, None), "parked_sjf:last": ("sjf", "last", None),
                      "parked_srpt:last (countdown)": ("srpt", "last", None),
                      "parked_sjf:prompt_oracle": ("sjf", "prompt_oracle", None),
                      "parked_sjf:oracle": ("sjf", "oracle", None)}
            for m in progressive:
                parked[f"parked_srpt:{m}"] = ("srpt", m, progressive_remaining(
                    progressive[m], countdown_remaining("last"), steps=steps, key=lambda r: r.table_row))
            for name, (policy, pred, remaining) in parked.items():
                pc = ParkedConfig(policy, pred, args.decode_slots, args.max_idle_s, prefill_ahead=args.prefill_ahead)
                runs[name] = simulate_parked(reqs, pc, cost, parked_cfg, remaining)[0]
            for name, s in runs.items():
                rows.setdefault(f"{arrival}/{name}", []).append(s["mean_jct_s"])
        print(f"draw {d} done", flush=True)
    report = {"settings": vars(args), "rate_per_s": rate, "per_draw_mean_jct_s": rows, "rows": {}}
    for key, jct in rows.items():
        arrival = key.split("/", 1)[0]
        base, orc, porc = (np.array(rows[f"{arrival}/{k}"]) for k in ("fcfs", "parked_sjf:oracle",
                                                                      "parked_sjf:prompt_oracle"))
        x = np.array(jct)
        cell = {"mean_jct_s": draw_bootstrap({"x": x}, lambda v: float(v["x"].mean()))}
        cell["jct_cut_vs_fcfs"] = draw_bootstrap({"f": base, "x": x}, lambda v: 1 - v["x"].mean() / v["f"].mean())
        for label, o in (("oracle", orc), ("prompt_oracle", porc)):
            cell[f"share_of_{label}"] = draw_bootstrap(
                {"f": base, "x": x, "o": o}, lambda v: (v["f"].mean() - v["x"].mean()) / (v["f"].mean() - v["o"].mean()))
        cell["minus_prompt_oracle_s"] = draw_bootstrap({"x": x, "o": porc}, lambda v: v["x"].mean() - v["o"].mean())
        report["rows"][key] = cell
    write_json(args.out + ".json", report)
    text = markdown(report)
    open(args.out + ".md", "w").write(text)
    print(text, end="")


def markdown(report: dict) -> str:
    """The report as Markdown: settings, then one row per arrivals / policy (draw mean [95 % bootstrap interval])."""
    from lenpred.tables import markdown_table

    f = lambda t, p=1: f"{t[0]:.{p}f} [{t[1]:.{p}f}, {t[2]:.{p}f}]"  # noqa: E731
    rows = [[key, f(c["mean_jct_s"]), f(c["jct_cut_vs_fcfs"], 3), f(c["share_of_oracle"], 2),
             f(c["share_of_prompt_oracle"], 2), f(c["minus_prompt_oracle_s"])] for key, c in report["rows"].items()]
    lines = ["# Parked decoding in the simulator", "",
             f"settings: {report['settings']}; Poisson rate {report['rate_per_s']:.4f} req/s", "",
             markdown_table(["arrivals / policy", "mean JCT s", "cut vs FCFS", "share of parked oracle",
                             "share of prompt oracle", "minus prompt oracle (s)"], rows)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
