"""The simulator on the serving benchmark's draws (:mod:`lenpred.studies.serving_bench_runs`), with the cost model
measured on the benchmark's machine: each finished run replayed (its arrivals, the lengths it generated, the
engine's own predictions), and the regime map of parked SJF over decode-slot counts."""

from __future__ import annotations

import copy

import numpy as np

from lenpred.serving.cost_model import CostModel
from lenpred.serving.policies import make_policy
from lenpred.serving.parked import SchedulerConfig
from lenpred.serving.simulator import SimConfig, simulate, simulate_parked
from lenpred.studies.engine_bench import run_key
from lenpred.studies.serving_bench_runs import PATTERNS, ServingBenchConfig
from lenpred.studies.workload import draw_workload, load_workload_table

SIM_PLAN = {"stock": None, "observe": None, "proxy_priority": None, "parked_fcfs": ("fcfs", None),
            "parked_sjf": ("sjf", "engine"), "parked_srpt": ("srpt", "engine"), "oracle_sjf": ("sjf", "oracle"),
            "prompt_oracle_sjf": ("sjf", "prompt_oracle")}
"""Mode -> ``(parked policy, the prediction it ranks by)`` in the simulator; ``None``: vLLM's FCFS."""


def parked_summary(requests: list, policy: str, predictor: str | None, cfg: ServingBenchConfig, cost,
                   sim: SimConfig, decode_slots: int | None = None) -> dict:
    """The summary of one parked simulation (:func:`lenpred.serving.simulator.simulate_parked`) with the
    benchmark's starvation guard, no prefill-ahead bound and ``decode_slots`` (``None``: ``cfg.decode_slots``):
    the serving benchmark's only call of the parked simulator."""
    parked = SchedulerConfig(policy=policy, decode_slots=cfg.decode_slots if decode_slots is None else decode_slots,
                             max_idle_s=cfg.max_idle_s, prefill_ahead=None, admit_by="arrival")
    return simulate_parked(requests, parked, cost, sim, predictor=predictor)[0]


def sim_config(cfg: ServingBenchConfig, share: float | None, capacity_req_s: float, d: int) -> SimConfig:
    """The simulated engine of draw ``d``: ``max_num_seqs``, 8,192 batched tokens, all at once (``share`` None) or
    Poisson at ``share`` x the capacity, seeded as the real run's arrivals."""
    return SimConfig(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=8192,
                     arrival="all" if share is None else "poisson", rate_per_s=(share or 1.0) * capacity_req_s,
                     seed=cfg.seed + d)


def _replayed(rows: list[dict], rec: dict, log: list[dict]) -> list:
    """``rows``' requests with the lengths ``rec``'s run generated and the predictions ``engine`` (from the plug-in
    ``log``; the cap without one), ``oracle`` and ``prompt_oracle``."""
    gen = {r["request_id"]: r["completion_tokens"] or 1 for r in rec["results"]}
    pred = {int(x["request_id"].split("q")[-1].split("-")[0]): x["expected"] for x in log}
    reqs = []
    for i, row in enumerate(rows):
        r = copy.copy(row["request"])
        r.output_len = int(gen.get(r.request_id, row["oracle"]))
        r.predictions = {"engine": pred.get(i, float(row["max_tokens"])), "oracle": float(row["oracle"]),
                         "prompt_oracle": row["prompt_oracle"]}
        reqs.append(r)
    return reqs


def simulated(cfg: ServingBenchConfig, store: dict, draws: list[list[dict]],
              capacity_req_s: float) -> dict[str, dict[str, list[float]]]:
    """Mean JCT (s) the simulator gives each finished run, per pattern, mode and draw: the run's arrivals and the
    output lengths it generated, the engine's own predictions (the mode's plug-in log; ``parked_sjf``'s for modes
    without one), the cost model ``cfg.cost_model``."""
    cost = CostModel.load(cfg.cost_model)
    out: dict[str, dict[str, list[float]]] = {}
    for pattern, share in PATTERNS.items():
        for d, rows in enumerate(draws):
            for mode, how in SIM_PLAN.items():
                rec = store["runs"].get(run_key(d, mode, pattern))
                sjf = store["runs"].get(run_key(d, "parked_sjf", pattern))
                if rec is None or sjf is None:
                    continue
                reqs = _replayed(rows, rec, rec["plugin_log"] or sjf["plugin_log"])
                sim = sim_config(cfg, share, capacity_req_s, d)
                if how is None:
                    s = simulate(reqs, make_policy("fcfs"), cost, sim)[0]
                else:
                    s = parked_summary(reqs, how[0], how[1], cfg, cost, sim)
                out.setdefault(pattern, {}).setdefault(mode, []).append(s["mean_jct_s"])
    return out


def slot_sweep(cfg: ServingBenchConfig, draws: list[list[dict]], capacity_req_s: float, slots=(8, 16, 24, 32, 48),
               deep: int = 128) -> dict[str, dict[str, float]]:
    """The simulator's regime map: mean-JCT cut vs FCFS of parked SJF by the recorded length (``oracle``) and by
    the shipped head's offline prediction (``last``, the workload table's), as ``{workload: {"<pred>/<slots>":
    cut}}``, on the benchmark's draws and patterns (recorded lengths, clipped to the caps) plus a burst of ``deep``
    requests; mean over draws. Clips the draws' requests' ``output_len`` in place."""
    cost = CostModel.load(cfg.cost_model)
    table = load_workload_table(token_ids=False, rebuild=False)
    cases = {pattern: (share, [[r["request"] for r in rows] for rows in draws]) for pattern, share in PATTERNS.items()}
    cases[f"burst of {deep}"] = (None, [draw_workload(table, deep, cfg.seed + d) for d in range(len(draws))])
    out = {}
    for name, (share, reqs_per_draw) in cases.items():
        cells: dict[str, list[float]] = {}
        for d, reqs in enumerate(reqs_per_draw):
            for r in reqs:
                r.output_len = min(r.output_len, r.max_new_tokens, cfg.max_tokens or r.max_new_tokens)
            sim = sim_config(cfg, share, capacity_req_s, d)
            base = simulate(reqs, make_policy("fcfs"), cost, sim)[0]["mean_jct_s"]
            for k in slots:
                for pred in ("oracle", "last"):
                    s = parked_summary(reqs, "sjf", pred, cfg, cost, sim, decode_slots=k)
                    cells.setdefault(f"{pred}/{k}", []).append(1 - s["mean_jct_s"] / base)
        out[name] = {key: float(np.mean(v)) for key, v in cells.items()}
    return out
