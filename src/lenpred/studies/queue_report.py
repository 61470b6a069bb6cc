"""The report of the engine's queue benchmark (:mod:`lenpred.studies.queue_bench`), as numbers: per arrival pattern
and mode the latency cell, the paired comparisons with stock and the oracles (:func:`lenpred.studies.paired.compare`,
requests clustered by draw), the best lenpred mode against every other mode, the length thirds, issue 38's checks,
the simulator on the same runs (with the streaming overhead it fits on stock's bursts) and the regime map.

:func:`report` takes only the store ``runs.json`` holds; :mod:`lenpred.studies.queue_render` writes it out.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np

from lenpred.studies.engine_bench import complete_draws, latency_cell, mode_draws, paired, pooled, run_key
from lenpred.studies.paired import compare
from lenpred.studies.queue_regime import (LENGTH_CLASSES, LENPRED_MODES, QUEUE_MODES, STANDARD_PATTERNS,
                                          length_classes, parse_pattern, parse_patterns)
from lenpred.studies.queue_sim import run_parked

logger = logging.getLogger(__name__)

MAP_MODES = ("priority_prompt_len", "priority_lenpred", "plugin", "priority_oracle")
"""The regime map's modes: the free baseline, both lenpred paths and the recorded-length oracle."""


def mixed_machine_draws(store: dict, pattern: str, draws: list[int]) -> list[int]:
    """The draws of ``pattern`` among ``draws`` whose runs recorded more than one
    :func:`~lenpred.studies.queue_bench.machine` (runs recorded
    before the field existed are not counted)."""
    def machines(d: int) -> set[str]:
        runs = (store["runs"].get(run_key(d, m, pattern)) for m in QUEUE_MODES)
        return {json.dumps(rec["machine"], sort_keys=True) for rec in runs if rec and rec.get("machine")}

    return [d for d in draws if len(machines(d)) > 1]


SITTING_H = 1.5
"""Runs of one draw that finished further apart than this (hours) are not one sitting
(:func:`draws_apart_from_stock`)."""


def draws_apart_from_stock(store: dict, pattern: str, draws: list[int], modes) -> dict[str, list[int]]:
    """Per mode of ``modes`` other than stock, the draws among ``draws`` whose run finished more than
    :data:`SITTING_H` hours from the same draw's stock run (``finished`` in ``runs.json``, or ``started`` where a
    record written before ``finished`` existed holds the finish time there; runs without either are not counted):
    the engine's pace drifts by up to a fifth over hours, so such a pair compares paces as well as orders (read the
    simulator's cut at one pace instead). Modes with none are left out."""
    from datetime import datetime

    def finished(d: int, m: str):
        rec = store["runs"].get(run_key(d, m, pattern)) or {}
        when = rec.get("finished") or rec.get("started")
        return datetime.fromisoformat(when) if when else None

    out = {}
    for m in modes:
        apart = [d for d in draws if m != "stock" and finished(d, m) and finished(d, "stock")
                 and abs((finished(d, m) - finished(d, "stock")).total_seconds()) > 3600 * SITTING_H]
        if apart:
            out[m] = apart
    return out


def versus_stock(cells: dict, jct: dict, runs: dict, n: int) -> None:
    """Adds to each non-stock cell: the paired mean-JCT cut vs stock, its share of both oracles' gains, the p99 JCT
    ratio (paired bootstrap) and the throughput ratio to stock (mean over draws of the per-draw ratio)."""
    for m, c in cells.items():
        if m == "stock":
            continue
        c["jct_cut_vs_stock"] = compare("mean_cut", jct["stock"], jct[m], n)
        c["p99_jct_ratio_vs_stock"] = compare("p99_ratio", jct["stock"], jct[m], n)
        tok_s = lambda run: run["summary"]["throughput_tok_s"]  # noqa: E731
        c["throughput_ratio_vs_stock"] = float(np.mean([tok_s(b) / tok_s(a) for a, b in zip(runs["stock"], runs[m])]))
        for oracle in ("priority_prompt_oracle", "priority_oracle"):
            if oracle in cells and m != oracle:
                c[f"share_of_{oracle}"] = compare("oracle_share", jct["stock"], jct[m], n, oracle=jct[oracle])


def best_lenpred(cells: dict, jct: dict, n: int, exclude=()) -> dict | None:
    """The lenpred mode (:data:`~lenpred.studies.queue_regime.LENPRED_MODES`, not in ``exclude``: modes with a run
    apart from its stock run, :func:`draws_apart_from_stock`) with the lowest paired mean JCT (chosen on the same runs
    it is scored on) and ``jct_cut_vs``: its paired mean-JCT cut against every other non-stock mode
    (``1 - mean(best) / mean(other)``; negative where the other mode is faster; paired bootstrap)."""
    ours = [m for m in LENPRED_MODES if m in cells and m not in exclude]
    if not ours:
        return None
    best = min(ours, key=lambda m: float(np.mean(np.concatenate(jct[m]))))
    return {"mode": best, "jct_cut_vs": {m: compare("mean_cut", jct[m], jct[best], n)
                                         for m in cells if m not in ("stock", best)}}


def by_length_class(store: dict, done: list[int], pattern: str, modes: list[str], jct: dict, n: int) -> dict:
    """Per mode, the mean JCT (s) of the short / medium / long thirds of the recorded length (paired requests, classes
    over every draw's requests together) and each non-stock mode's paired mean-JCT cut vs stock per third
    (``jct_cut_vs_stock``: mode -> class -> (estimate, low, high); a class with no request is left out); the
    classes' upper bounds in tokens."""
    recorded = paired(store, done, pattern, modes, "recorded_output_tokens")[modes[0]]
    flat = np.concatenate(recorded)
    classes = length_classes(flat)
    per_draw = np.split(classes, np.cumsum([len(r) for r in recorded])[:-1])
    present = [(k, name) for k, name in enumerate(LENGTH_CLASSES) if (classes == k).any()]
    third = lambda mode, k: [j[c == k] for j, c in zip(jct[mode], per_draw)]  # noqa: E731
    out = {"upper_tokens": [float(flat[classes == k].max()) if (classes == k).any() else None
                            for k in range(len(LENGTH_CLASSES))], "modes": {}, "jct_cut_vs_stock": {}}
    for m in modes:
        x = np.concatenate(jct[m])
        out["modes"][m] = {name: float(x[classes == k].mean()) if (classes == k).any() else None
                           for k, name in enumerate(LENGTH_CLASSES)}
        if m != "stock":
            out["jct_cut_vs_stock"][m] = {name: compare("mean_cut", third("stock", k), third(m, k), n)
                                          for k, name in present}
    return out


def acceptance(cells: dict, best: dict | None, draws: int, pattern: str = "") -> dict | None:
    """The acceptance checks for the best lenpred mode; ``None`` for a check whose reference mode did not run.

    Issue 38's (bursts and Gamma arrivals): mean-JCT cut vs stock >= 12 % with an interval above 0, >= 0.8 of the
    prompt oracle's gain, an interval above 0 against prompt-length priority, p99 JCT <= 1.1x stock, throughput
    within 3 %, >= 5 draws. Issue 49's (a trace pattern, ``trace<name>x<load>``): a cut >= 10 % above capacity
    (load > 1) or >= 6 % below it, with an interval above 0; an interval above 0 against prompt-length priority;
    p99 JCT <= 1.05x stock; throughput within 3 %; >= 5 draws.
    """
    if best is None:
        return None
    c = cells[best["mode"]]
    cut, share = c["jct_cut_vs_stock"], c.get("share_of_priority_prompt_oracle")
    vs = best["jct_cut_vs"].get("priority_prompt_len")
    beats = None if vs is None else bool(vs[1] > 0)
    throughput = bool(abs(c["throughput_ratio_vs_stock"] - 1) <= 0.03)
    if pattern.startswith("trace"):
        floor = 0.10 if parse_pattern(pattern).load > 1 else 0.06
        checks = {f"cut_ge_{floor:.0%}_interval_above_0".replace("%", "pct"): bool(cut[0] >= floor and cut[1] > 0),
                  "beats_prompt_len_interval_above_0": beats,
                  "p99_jct_le_1.05x_stock": bool(c["p99_jct_ratio_vs_stock"][0] <= 1.05),
                  "throughput_within_3pct": throughput, "at_least_5_draws": draws >= 5}
        issue = 49
    else:
        checks = {"cut_ge_12pct_interval_above_0": bool(cut[0] >= 0.12 and cut[1] > 0),
                  "prompt_oracle_share_ge_0.8": None if share is None else bool(share[0] >= 0.8),
                  "beats_prompt_len_interval_above_0": beats,
                  "p99_jct_le_1.1x_stock": bool(c["p99_jct_ratio_vs_stock"][0] <= 1.1),
                  "throughput_within_3pct": throughput, "at_least_5_draws": draws >= 5}
        issue = 38
    return {"mode": best["mode"], "issue": issue, **checks, "all": all(v is True for v in checks.values())}


def stock_capacity(store: dict, pattern: str, draws: list[int]) -> list[float]:
    """Per draw of a burst pattern, stock FCFS's capacity at D on the machine that ran it: requests / makespan (the
    last finish after the burst's send, s), in requests/s: the ``--capacity-req-s`` of the sustained and trace
    patterns there."""
    out = []
    for d in draws:
        results = store["runs"][run_key(d, "stock", pattern)]["results"]
        out.append(len(results) / max(r["finish_s"] for r in results))
    return out


def pattern_report(store: dict, pattern: str, num_draws: int, n: int) -> dict | None:
    """One pattern's section of the report (``None`` before any draw has every mode's run)."""
    modes, done = complete_draws(store, pattern, QUEUE_MODES, num_draws)
    if not done:
        return None
    settings = [store["runs"][run_key(d, modes[0], pattern)]["settings"] for d in done]
    first = settings[0]
    cells, jct = paired_cells(store, pattern, done, modes, n)
    out = {"num_requests": first["num_requests"], "rate_req_s": first["rate_req_s"], "draws": done, "modes": cells,
           # per draw: each slice may be stretched to the capacity measured before its own sitting
           "num_requests_per_draw": [st["num_requests"] for st in settings],
           "rate_req_s_per_draw": [st["rate_req_s"] for st in settings],
           "mixed_machine_draws": mixed_machine_draws(store, pattern, done),
           "draws_apart_from_stock": draws_apart_from_stock(store, pattern, done, modes)}
    if first["rate_req_s"] is None and "stock" in modes:  # a burst: stock's capacity at D on this machine
        out["stock_capacity_req_s"] = stock_capacity(store, pattern, done)
    if jct is None:
        return out
    out["best_lenpred"] = best_lenpred(out["modes"], jct, n, exclude=out["draws_apart_from_stock"])
    out["acceptance"] = acceptance(out["modes"], out["best_lenpred"], len(done), pattern)
    if out["acceptance"] is not None:
        out["acceptance"]["left_out_runs_apart"] = sorted(out["draws_apart_from_stock"])
    out["length_classes"] = by_length_class(store, done, pattern, modes, jct, n)
    out["jct_pooled"] = {m: pooled(jct[m]) for m in modes}
    best = out["best_lenpred"]["mode"] if out["best_lenpred"] else None
    out["fewer_draws"] = fewer_draws(store, pattern, modes, num_draws, n, best)
    out["pace_ms"] = run_paces(store, pattern, num_draws)
    return out


def run_paces(store: dict, pattern: str, num_draws: int) -> dict[str, dict[str, dict]]:
    """Per mode and draw (as a string), the engine's pace: ``tpot_ms``, the run's
    :func:`~lenpred.studies.engine_bench.median_tpot_s` in ms (under stock FCFS and prompt-length priority nothing is
    parked, so on the same slice it is the engine's pace; under the plug-in it includes parked waits), and
    ``probe_ms``, the speed probe's just before the run (:func:`~lenpred.studies.engine_bench.speed_probe`; ``None``
    for runs from before it was recorded); and where the run recorded the engine's steps
    (:func:`~lenpred.studies.engine_bench.server_side`): ``steps``, ``tokens_per_step``, ``wall_ms_per_step`` (the
    run's wall time over its steps: the time per step where the engine is busy throughout, as in a burst) and, under
    the plug-in, ``plugin_ms_per_step`` (its policy and head seconds over its own steps,
    :func:`~lenpred.studies.engine_bench.plugin_counters`)."""
    from lenpred.studies.engine_bench import median_tpot_s

    ms = lambda s: None if s is None else 1000 * s  # noqa: E731
    out: dict[str, dict[str, dict]] = {}
    for m, ds in mode_draws(store, pattern, QUEUE_MODES, num_draws).items():
        for d in ds:
            rec = store["runs"][run_key(d, m, pattern)]
            pace = {"tpot_ms": ms(median_tpot_s(rec["results"])),
                    "probe_ms": ms((rec.get("speed_probe") or {}).get("tpot_s"))}
            steps = (rec.get("server") or {}).get("steps")
            if steps:
                plugin = rec.get("plugin_counters") or {}
                pace |= {"steps": steps, "tokens_per_step": rec["server"]["tokens_per_step"],
                         "wall_ms_per_step": ms(rec["wall_s"] / steps),
                         "plugin_ms_per_step": ms((plugin["policy_s"] + plugin["head_s"]) / plugin["steps"])
                         if plugin.get("steps") else None}
            out.setdefault(m, {})[str(d)] = pace
    return out


def paired_cells(store: dict, pattern: str, draws: list[int], modes: list[str], n: int) -> tuple[dict, dict | None]:
    """``(cells, jct)``: each mode's :func:`latency_cell` over ``draws`` and, with stock among ``modes``, its paired
    comparison with stock (:func:`versus_stock`) and the paired JCTs (:func:`paired`; ``None`` without stock)."""
    runs = {m: [store["runs"][run_key(d, m, pattern)] for d in draws] for m in modes}
    cells = {m: latency_cell(runs[m]) for m in modes}
    if "stock" not in modes:
        return cells, None
    jct = paired(store, draws, pattern, modes)
    versus_stock(cells, jct, runs, n)
    return cells, jct


def fewer_draws(store: dict, pattern: str, modes: list[str], num_draws: int, n: int,
                best: str | None = None) -> dict:
    """Each mode run in fewer draws than ``modes`` (those :func:`complete_draws` pairs): paired with stock, and with
    each oracle that ran in all its draws, on the draws it has (its own ``draws``); same cells as the main table,
    plus ``best_lenpred_cut``: the mean-JCT cut of the best lenpred mode ``best`` (one of ``modes``, so it ran in
    every such draw) against it on those draws (positive: the lenpred mode is faster)."""
    out = {}
    for m, ds in mode_draws(store, pattern, QUEUE_MODES, num_draws).items():
        ds = [d for d in ds if run_key(d, "stock", pattern) in store["runs"]]
        if m in modes or not ds:
            continue
        group = ["stock", m] + [o for o in ("priority_prompt_oracle", "priority_oracle") if o != m and all(
            run_key(d, o, pattern) in store["runs"] for d in ds)] + ([best] if best else [])
        cells, jct = paired_cells(store, pattern, ds, group, n)
        out[m] = {"draws": ds, **cells[m],
                  "draws_apart_from_stock": draws_apart_from_stock(store, pattern, ds, [m]).get(m, [])}
        if best:
            out[m]["best_lenpred_cut"] = compare("mean_cut", jct[m], jct[best], n)
    return out


def simulated_mean_jct(rec: dict, regime_: dict, cost, seed: int) -> float:
    """The simulator's mean JCT (s) of one run's requests (:func:`simulated_summary`)."""
    return simulated_summary(rec, regime_, cost, seed)["mean_jct_s"]


def simulated_summary(rec: dict, regime_: dict, cost, seed: int) -> dict:
    """The simulator's latency summary (:func:`lenpred.serving.metrics.summarize`'s keys, s) of one run's requests
    (:func:`simulated_run`)."""
    return simulated_run(rec, regime_, cost, seed)[0]


def simulated_run(rec: dict, regime_: dict, cost, seed: int) -> tuple[dict, list]:
    """``(summary, per-request timings)``: the simulator's latency summary (:func:`lenpred.serving.metrics.summarize`'s
    keys, s) and :class:`~lenpred.serving.metrics.RequestTiming` list of one run's requests:
    the same arrivals (planned times; the pattern's seed), the output and prompt tokens the engine reported, the
    mode's mechanism (stock FCFS; the priority queue by the priority sent, behind
    :class:`~lenpred.serving.simulator.PredictionCost` for the proxy; parked decoding with the plug-in's settings, its
    starvation guard included, and the engine's own predictions from its log), the same D and KV cache in 128-token
    blocks. PLP's refreshed estimates are not modelled (``plugin_plp`` is simulated on its static predictions)."""
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import PredictionCost, SimConfig, simulate
    from lenpred.studies.workload import WorkloadRequest

    st = rec["settings"]
    engine = {int(re.search(r"-q(\d+)-", x["request_id"]).group(1)): x["expected"] for x in rec["plugin_log"]}
    pattern = parse_patterns(st["pattern"])[0]  # a trace replays its planned send times
    reqs = [WorkloadRequest(r["request_id"], [], max(int(r["completion_tokens"] or 1), 1), 0, "", str(r["request_id"]),
                            {"sent": float(r["priority_sent"] if r["priority_sent"] is not None
                                           else r["priority"] or 0),
                             "engine": float(engine.get(r["request_id"], 1e9))},
                            num_prompt_tokens=int(r["prompt_tokens"] or 1),
                            arrival_time_s=float(r["arrival_s"]) if pattern.trace else 0.0)
            for r in rec["results"] if r["outcome"] == "ok"]
    arrival = "all" if st["rate_req_s"] is None else "given" if pattern.trace else "gamma"  # a trace: its planned times
    cfg = SimConfig(max_num_seqs=st["max_num_seqs"], max_num_batched_tokens=8192,
                    arrival=arrival, rate_per_s=st["rate_req_s"] or 1.0,
                    cv=pattern.cv or 1.0, seed=seed,
                    kv_cache_tokens=st["kv_cache_bytes"] // regime_["kv_bytes_per_token"], block_size=128)
    if st["plugin"] is not None:
        pl = st["plugin"]
        return run_parked(reqs, cost, cfg, policy=pl["policy"], predictor="engine", decode_slots=pl["decode_slots"],
                          max_idle_s=pl["max_idle_s"], prefill_ahead=pl["prefill_ahead"],
                          admit_by=pl.get("admit_by", "arrival"),
                          aging_tokens_per_s=pl.get("aging_tokens_per_s", 0.0), max_wait_s=pl.get("max_wait_s"))
    policy = make_policy("fcfs") if st["scheduling_policy"] == "fcfs" else make_policy("sjf:sent")
    return simulate(reqs, policy, cost, cfg, PredictionCost() if st["proxy"] else None)


def fit_streaming_overhead(store: dict, regime_: dict, cost) -> dict:
    """The serving overhead per streamed token (s) that the bare-engine cost model lacks
    (:meth:`~lenpred.serving.cost_model.CostModel.with_streaming_overhead`), fitted on stock's burst runs only
    (least squares of log simulated / measured mean JCT, ``scipy.optimize.minimize_scalar`` on [0, 20 ms]); every
    other run validates it. No stock burst run: 0.

    Returns:
        ``s_per_token`` and ``fitted_on`` (the run keys).
    """
    from scipy.optimize import minimize_scalar

    keys = sorted(k for k in store["runs"] if k.split("/")[1] == "stock" and parse_pattern(k.split("/")[2]).depth)
    if not keys:
        return {"s_per_token": 0.0, "fitted_on": []}
    real = np.array([ok_jct(store["runs"][k]).mean() for k in keys])

    def loss(s: float) -> float:
        c = cost.with_streaming_overhead(s)
        sim = np.array([simulated_mean_jct(store["runs"][k], regime_, c, 0) for k in keys])
        return float(np.sum(np.log(sim / real) ** 2))

    fit = minimize_scalar(loss, bounds=(0.0, 0.02), method="bounded", options={"xatol": 1e-5})
    return {"s_per_token": float(fit.x), "fitted_on": keys}


def fit_run_pace(rec: dict, regime_: dict, cost, seed: int) -> float | None:
    """The engine's pace during one run, against ``cost``'s (:func:`lenpred.serving.cost_model.fit_pace` on
    :func:`simulated_mean_jct` of the run, its own mode simulated). Fitted to a stock run, the other modes of the
    same slice, simulated at that pace, test the simulator's orders at the engine's pace of that sitting rather than
    the cost model's, which a fixed cost model cannot follow across hours; fitted to another mode's run, it holds the
    machine's pace of that run and whatever the mode costs the engine that the simulator does not model, so two
    runs of one draw at different paces compare the machine as well as the modes. ``None``: no scale in the bounds
    matches (the run is not the simulator's kind of run)."""
    from lenpred.serving.cost_model import fit_pace

    return fit_pace(cost, lambda c: simulated_mean_jct(rec, regime_, c, seed), float(ok_jct(rec).mean()))


def pace_elasticity(rec: dict, regime_: dict, cost, seed: int, pace: float, step: float = 0.02) -> float:
    """How much the engine's drift moves one run: the elasticity d ln(mean JCT) / d ln(pace) of the run's simulated
    mean JCT (:func:`simulated_mean_jct`) at the cost model scaled to ``pace``, a central difference over
    ``pace · (1 ± step)``: a 1 % slower engine lengthens the simulated mean JCT by about this many percent. 1 where
    the schedule does not depend on the arrival times (nothing queues, or a burst at t = 0: every time scales with
    the pace); more where requests arrive over time and a slower engine raises the load.

    Args:
        rec: one run's record (``runs.json``).
        regime_: the store's regime.
        cost: the cost model (:class:`~lenpred.serving.cost_model.CostModel`).
        seed: the draw's seed.
        pace: the scale of ``cost``'s step times (:func:`fit_run_pace`), > 0.
        step: the relative half-width of the difference, in (0, 1).

    Returns:
        The elasticity, dimensionless (``nan`` or ``inf`` where a simulated mean JCT is 0).

    Raises:
        LenpredError: ``pace · (1 − step)`` not > 0 (:meth:`~lenpred.serving.cost_model.CostModel.with_pace`).
    """
    lo, hi = (simulated_mean_jct(rec, regime_, cost.with_pace(pace * (1 + s)), seed) for s in (-step, step))
    return float(np.log(hi / lo) / np.log((1 + step) / (1 - step)))


def add_simulated(rep: dict, store: dict, cost_model: str) -> None:
    """Per pattern and mode: the simulator's mean JCT on the same runs and its ratio to the measured one (issue 38's
    validation: within 10 %), on the bare-engine cost model plus the streaming overhead fitted on stock's burst runs
    (:func:`fit_streaming_overhead`); ``offline_over_measured``: the same ratio without it;
    ``simulated_p99_over_measured``: the mean over draws of the simulated p99 JCT over the measured (the tail);
    ``simulated_cut_vs_stock``: the simulator's mean-JCT cut vs stock on the same draws, a yardstick at one fixed
    engine pace (the measured cut pairs runs whose pace may differ), and ``simulated_p99_ratio_vs_stock``, its p99
    JCT over stock's, each pooled over the draws' requests (as the measured ``p99_jct_ratio_vs_stock``), with
    ``simulated_cut_vs_stock_per_draw`` and
    ``simulated_p99_ratio_vs_stock_per_draw`` per draw beside ``measured_cut_vs_stock_per_draw``;
    ``simulated_over_measured_at_stock_pace``: the mean over draws of the simulated mean JCT over the measured with
    the cost model at the pace of the same draw's stock run (:func:`fit_run_pace`, stored per draw as the
    pattern's ``stock_pace_scale``, with the mean JCT's elasticity to it as ``stock_pace_elasticity``,
    :func:`pace_elasticity`), for the modes other than stock, and each of their runs' own pace
    (``pace_scale_per_draw``, :func:`fit_run_pace`; ``None`` where none matches)."""
    from lenpred.serving.cost_model import PACE_BOUNDS, CostModel

    offline = CostModel.load(cost_model)
    fit = fit_streaming_overhead(store, rep["regime"], offline)
    served = offline.with_streaming_overhead(fit["s_per_token"])
    seed = store["config"]["seed"]
    for pattern, p in rep["patterns"].items():
        cells = mode_cells(p)
        memo: dict[tuple[str, str, int], tuple[dict, list]] = {}

        def sim_run(name: str, mode: str, d: int) -> tuple[dict, list]:
            if (name, mode, d) not in memo:
                memo[(name, mode, d)] = simulated_run(store["runs"][run_key(d, mode, pattern)], rep["regime"],
                                                      served if name == "served" else offline, seed + d)
            return memo[(name, mode, d)]

        def sim_of(name: str, mode: str, d: int) -> dict:
            return sim_run(name, mode, d)[0]

        stock_draws = sorted({d for _, _, ds in cells for d in ds if run_key(d, "stock", pattern) in store["runs"]})
        paces = {d: fit_run_pace(store["runs"][run_key(d, "stock", pattern)], rep["regime"], served, seed + d)
                 for d in stock_draws}
        p["stock_pace_scale"] = {str(d): f for d, f in paces.items()}
        p["stock_pace_elasticity"] = {str(d): None if f is None else pace_elasticity(
            store["runs"][run_key(d, "stock", pattern)], rep["regime"], served, seed + d, f) for d, f in paces.items()}
        for d in (d for d, f in paces.items() if f is None):
            logger.warning("%s draw %d: no pace scale in %s matches stock's measured mean JCT: the simulator at "
                           "stock's pace leaves this draw out", pattern, d, PACE_BOUNDS)

        def pooled_p99(mode: str, draws) -> float:
            return float(np.percentile([t.jct_s for d in draws for t in sim_run("served", mode, d)[1]], 99))

        for mode, cell, draws in cells:
            jct = [ok_jct(store["runs"][run_key(d, mode, pattern)]) for d in draws]
            sim = {name: [sim_of(name, mode, d) for d in draws] for name in ("served", "offline")}
            mean = {name: np.mean([x["mean_jct_s"] for x in xs]) for name, xs in sim.items()}
            real = np.mean([x.mean() for x in jct])
            cell["simulated_mean_jct_s"] = float(mean["served"])
            cell["simulated_over_measured"] = float(mean["served"] / real)
            cell["offline_over_measured"] = float(mean["offline"] / real)
            cell["simulated_p99_over_measured"] = float(np.mean([x["p99_jct_s"] / np.percentile(j, 99)
                                                                 for x, j in zip(sim["served"], jct)]))
            if mode == "stock":
                continue
            cell["pace_scale_per_draw"] = {str(d): fit_run_pace(store["runs"][run_key(d, mode, pattern)],
                                                                rep["regime"], served, seed + d) for d in draws}
            if not all(run_key(d, "stock", pattern) in store["runs"] for d in draws):
                continue
            at_pace = [simulated_mean_jct(store["runs"][run_key(d, mode, pattern)], rep["regime"],
                                          served.with_pace(paces[d]), seed + d) / j.mean()
                       for d, j in zip(draws, jct) if paces[d] is not None]
            cell["simulated_over_measured_at_stock_pace"] = float(np.mean(at_pace)) if at_pace else None
            stock = [sim_of("served", "stock", d) for d in draws]
            stock_jct = [ok_jct(store["runs"][run_key(d, "stock", pattern)]) for d in draws]
            cell["simulated_cut_vs_stock"] = float(1 - sum(x["mean_jct_s"] for x in sim["served"])
                                                   / sum(x["mean_jct_s"] for x in stock))
            cell["simulated_p99_ratio_vs_stock"] = pooled_p99(mode, draws) / pooled_p99("stock", draws)
            cell["simulated_cut_vs_stock_per_draw"] = [float(1 - x["mean_jct_s"] / y["mean_jct_s"])
                                                       for x, y in zip(sim["served"], stock)]
            cell["simulated_p99_ratio_vs_stock_per_draw"] = [float(x["p99_jct_s"] / y["p99_jct_s"])
                                                             for x, y in zip(sim["served"], stock)]
            cell["measured_cut_vs_stock_per_draw"] = [float(1 - x.mean() / y.mean()) for x, y in zip(jct, stock_jct)]
    rep["simulator_cost_model"] = cost_model
    rep["simulator_streaming_overhead"] = fit


def guard_frontier(store: dict, rep: dict, pattern: str, max_waits: list[float | None], mode: str = "plugin",
                   policy: str | None = None) -> dict:
    """A plug-in mode's mean-vs-tail frontier under the age threshold on the engine's own slices: each draw's ``mode``
    run re-simulated (:func:`simulated_run`: its arrivals, prompt and output tokens, the engine's own predictions)
    with ``max_wait_s`` = T, against the same draw's ``stock`` run simulated alike, both on the report's cost model
    (``simulator_cost_model``, plus its streaming overhead) at the pace of that draw's stock run
    (``stock_pace_scale``, :func:`fit_run_pace`). The first point is the run as it ran; beside it the measured cut
    and p99 ratio, the check that the simulator reproduces the run before its thresholds are believed.

    Per point: ``cut`` = 1 − Σ_d mean JCT / Σ_d stock's mean JCT (the draws' means summed, as the report's
    ``simulated_cut_vs_stock``), ``p99_ratio`` = the p99 JCT of all the draws' requests pooled over stock's, and both
    per draw. A draw without a ``mode`` run or a fitted pace is left out (``left_out_draws``, logged).

    Args:
        store: ``runs.json``; rep: its report (:func:`report` with :func:`add_simulated`).
        max_waits: the thresholds T, s (each ≥ 0 and finite; ``None``: no threshold), in the order given.
        mode: a plug-in mode of the store (``plugin``, ``plugin_wait``, ...).
        policy: the decode-slot policy of the re-simulated points (e.g. ``sjf``, non-preemptive; ``None``: the
            run's own); the first point stays the run as it ran.

    Raises:
        LenpredError: a report without the simulator (no ``simulator_cost_model`` or pace), a pattern it lacks, a
            mode that is not a plug-in mode of the store, an unknown policy, a threshold that is negative or not
            finite, or no draw with a ``mode`` run and a stock run at a fitted pace.
    """
    from lenpred.errors import LenpredError
    from lenpred.serving.cost_model import CostModel
    from lenpred.serving.policies import POLICIES

    if "simulator_cost_model" not in rep or "patterns" not in rep:
        raise LenpredError("the report has no simulator results: run queue_benchmark.py --report-only --out <store> "
                           "--sim-cost-model <cost model> first")
    simulated = [k for k, v in rep["patterns"].items() if "stock_pace_scale" in v]
    if pattern not in simulated:
        raise LenpredError(f"the report has no simulated pattern {pattern!r}; it has: {', '.join(simulated) or 'none'}")
    if policy is not None and policy not in POLICIES:
        raise LenpredError(f"policy {policy!r} is unknown; valid: {', '.join(POLICIES)}")
    if any(t is not None and not 0 <= t < np.inf for t in max_waits):
        raise LenpredError(f"thresholds must be finite seconds >= 0 (None: no threshold), got {max_waits}")
    modes = {k.split("/")[1] for k, r in store["runs"].items()
             if k.endswith(f"/{pattern}") and r["settings"].get("plugin") is not None}
    if mode not in modes:
        raise LenpredError(f"{pattern}: no {mode!r} runs with the plug-in in the store; its plug-in modes: "
                           f"{', '.join(sorted(modes)) or 'none'}")
    paces = {int(d): f for d, f in rep["patterns"][pattern]["stock_pace_scale"].items()}
    draws = [d for d in sorted(paces) if paces[d] is not None and run_key(d, mode, pattern) in store["runs"]]
    left_out = sorted(set(paces) - set(draws))
    if not draws:
        raise LenpredError(f"{pattern}: no draw has a {mode} run and a stock run at a fitted pace")
    if left_out:
        logger.warning("%s: draws %s left out (no %s run, or no pace fitted to stock's)", pattern, left_out, mode)
    cost_model = rep["simulator_cost_model"]
    served = CostModel.load(cost_model).with_streaming_overhead(rep["simulator_streaming_overhead"]["s_per_token"])
    seed = store["config"]["seed"]

    def jcts(run_mode: str, d: int, plugin: dict | None = None) -> np.ndarray:
        rec = store["runs"][run_key(d, run_mode, pattern)]
        if plugin is not None:
            rec = {**rec, "settings": {**rec["settings"], "plugin": {**rec["settings"]["plugin"], **plugin}}}
        return np.array([t.jct_s for t in simulated_run(rec, rep["regime"], served.with_pace(paces[d]), seed + d)[1]])

    def versus_stock(runs: list[np.ndarray], base: list[np.ndarray]) -> dict:
        return {"cut": float(1 - sum(x.mean() for x in runs) / sum(x.mean() for x in base)),
                "p99_ratio": float(np.percentile(np.concatenate(runs), 99) / np.percentile(np.concatenate(base), 99)),
                "cut_per_draw": [float(1 - x.mean() / y.mean()) for x, y in zip(runs, base)],
                "p99_ratio_per_draw": [float(np.percentile(x, 99) / np.percentile(y, 99)) for x, y in zip(runs, base)]}

    stock = [jcts("stock", d) for d in draws]
    ran = store["runs"][run_key(draws[0], mode, pattern)]["settings"]["plugin"]
    own = {} if policy is None else {"policy": policy}
    points = [{"label": f"{mode} as run", "as_run": True, "max_wait_s": ran.get("max_wait_s"),
               **versus_stock([jcts(mode, d) for d in draws], stock)}]
    for t in max_waits:
        runs = [jcts(mode, d, {**own, "max_wait_s": None if t is None else float(t)}) for d in draws]
        points.append({"label": "no threshold" if t is None else f"T = {t:g} s", "as_run": False,
                       "max_wait_s": None if t is None else float(t), **versus_stock(runs, stock)})
    measured = versus_stock(*[[ok_jct(store["runs"][run_key(d, m, pattern)]) for d in draws] for m in (mode, "stock")])
    return {"pattern": pattern, "mode": mode, "draws": draws, "left_out_draws": left_out,
            "stock_pace_scale": [paces[d] for d in draws], "policy_as_run": ran["policy"],
            "policy": policy or ran["policy"], "max_waits": list(max_waits), "cost_model": cost_model,
            "streaming_overhead_s_per_token": rep["simulator_streaming_overhead"]["s_per_token"],
            "measured": measured, "points": points}


def mode_cells(p: dict) -> list[tuple[str, dict, list[int]]]:
    """``(mode, cell, draws)`` of one pattern's report: the modes paired on every draw, then those run on fewer
    (``fewer_draws``, each paired on its own draws)."""
    return ([(m, c, p["draws"]) for m, c in p["modes"].items()]
            + [(m, c, c["draws"]) for m, c in p.get("fewer_draws", {}).items()])


def ok_jct(rec: dict) -> np.ndarray:
    """``(n,)`` JCT, s, of a run's requests that finished (outcome ``ok``), in the record's order."""
    return np.array([r["jct_s"] for r in rec["results"] if r["outcome"] == "ok"])


WHATIF_MODES = ("plugin", "plugin_guard", "plugin_wait")
"""The modes whose runs :func:`add_whatif` replays (the plug-in keeps a traffic log), in the rows' order."""


WINDOW_MATCH_S = 1.0
"""The most a run's arrival in its traffic log may stray from its send time (relative to the run's first) for
:func:`run_window` to take that block of the log as the run (seen: up to 0.33 s)."""


def run_window(log: str | Path, rec: dict) -> tuple[float, float]:
    """``(since, until)``, seconds since the epoch: a run's first and last arrival in its traffic log, for ``lenpred
    whatif --since / --until``. The log also holds what the benchmark sent the same server before the run (2 warm-up
    requests, the speed probe's 4) and, in a store of several patterns, the other patterns' runs on that server; the
    run is the block of ``len(rec["results"])`` consecutive arrivals whose times from the block's first match the run's
    send times from its first (``sent_s``) within :data:`WINDOW_MATCH_S`, the best such block.

    Raises:
        LenpredError: no block of the log matches (the log is not this run's: rerun the run).
    """
    from lenpred.errors import LenpredError
    from lenpred.online.traffic_log import read_traffic_log

    arrival = np.sort(read_traffic_log(log).columns["arrival_time_s"])
    sent = np.sort([r["sent_s"] for r in rec["results"]])
    n = len(sent)
    if n == 0 or len(arrival) < n:
        raise LenpredError(f"traffic log {log} holds {len(arrival)} requests, fewer than the run's {n}: it is not this "
                           "run's log; rerun the run")
    offsets = sent - sent[0]
    stray = [float(np.abs(arrival[k:k + n] - arrival[k] - offsets).max()) for k in range(len(arrival) - n + 1)]
    k = int(np.argmin(stray))
    if stray[k] > WINDOW_MATCH_S:
        raise LenpredError(f"traffic log {log}: no {n} consecutive arrivals match the run's send times within "
                           f"{WINDOW_MATCH_S:g} s (best {stray[k]:.2f} s): it is not this run's log; rerun the run")
    return float(arrival[k]), float(arrival[k + n - 1])


def add_whatif(rep: dict, store: dict, out: Path, cost_model: str, n_resamples: int) -> None:
    """Per pattern, per draw whose plug-in run (:data:`WHATIF_MODES`) left its traffic log on disk
    (``settings["traffic_log"]``) beside a stock run: ``lenpred whatif`` on that log (at the run's D and starvation
    guard, on ``cost_model`` at the pace whatif fits to the log, :func:`lenpred.studies.whatif.fit_replay_pace`;
    written under ``<out>/whatif/<draw>-<mode>-<pattern>``) against the draw's measured cut vs stock (issue 49:
    within 5 points) and p99 ratio; stored as the pattern's ``whatif`` rows, by mode then draw (each with the window
    it replayed, ``since`` / ``until`` in seconds since the epoch), each with that pace
    (``pace_scale``, ``None`` where the log does not say the order it was served in) beside the stock run's
    (``stock_pace_scale``, :func:`fit_run_pace`): the measured cut pairs two runs, each at its own pace. Each log is
    replayed over its run's own arrivals (:func:`run_window`); a log no block of which matches its run, or a run
    whose plug-in ran a policy other than ``srpt`` (whatif's lenpred order), gets no row (a warning says why)."""
    from lenpred.errors import LenpredError
    from lenpred.studies.whatif import WhatifConfig, run_whatif

    D = rep["regime"]["decode_bound"]
    for pattern, p in rep["patterns"].items():
        rows = []
        ours = sorted((WHATIF_MODES.index(m), int(d), m) for d, m, pat in (k.split("/") for k in store["runs"])
                      if pat == pattern and m in WHATIF_MODES)
        for _, d, mode in ours:
            rec, stock = store["runs"][run_key(d, mode, pattern)], store["runs"].get(run_key(d, "stock", pattern))
            log, plugin = rec["settings"].get("traffic_log"), rec["settings"].get("plugin") or {}
            if stock is None or not log or not Path(log).is_dir():
                continue
            if plugin.get("policy", "srpt") != "srpt":  # whatif's lenpred row replays SRPT: no prediction of this run
                logger.warning("no whatif row for %s: its plug-in ran policy %s, whatif replays lenpred's srpt",
                               run_key(d, mode, pattern), plugin["policy"])
                continue
            try:
                since, until = run_window(log, rec)
            except LenpredError as exc:  # one run's log: the rest of the report stands
                logger.warning("no whatif row for %s: %s", run_key(d, mode, pattern), exc)
                continue
            whatif = run_whatif(WhatifConfig(traffic=log, cost_model=cost_model, decode_slots=(D,),
                                             aging_tokens_per_s=plugin.get("aging_tokens_per_s", 0.0),
                                             max_wait_s=plugin.get("max_wait_s"),
                                             out=str(out / "whatif" / f"{d}-{mode}-{pattern}"),
                                             bootstrap_resamples=n_resamples, since=str(since), until=str(until)))
            w = whatif["results"][str(D)]["lenpred"]
            ours, theirs = ok_jct(rec), ok_jct(stock)
            measured = 1 - ours.mean() / theirs.mean()
            rows.append({"draw": d, "mode": mode, "traffic_log": log, "since": since, "until": until,
                         "pace_scale": whatif["pace_scale"],
                         "stock_pace_scale": p.get("stock_pace_scale", {}).get(str(d)),
                         "predicted_cut": w["jct_cut_vs_stock"][0],
                         "measured_cut": float(measured), "error_pp": 100 * (w["jct_cut_vs_stock"][0] - measured),
                         "predicted_p99_ratio": w["p99_ratio_vs_stock"][0],
                         "measured_p99_ratio": float(np.percentile(ours, 99) / np.percentile(theirs, 99))})
        if rows:
            p["whatif"] = rows


def report(store: dict, n_resamples: int = 2000, sim_cost_model: str | None = None) -> dict:
    """The report of every pattern in ``store`` (standard patterns first), with the settings and the regime; with
    ``sim_cost_model`` the simulator on the same runs (:func:`add_simulated`); the regime map of the burst patterns.

    Args:
        store: what :func:`lenpred.studies.queue_bench.run` wrote (``runs.json``).
        n_resamples: bootstrap resamples of every paired interval.
        sim_cost_model: the bare engine's cost model (a path); ``None``: no simulator columns.
    """
    num_draws = 1 + max((int(k.split("/")[0]) for k in store["runs"]), default=-1)
    names = {k.split("/")[2] for k in store["runs"]}
    order = [p for p in STANDARD_PATTERNS if p in names] + sorted(names - set(STANDARD_PATTERNS))
    clip = store["config"].get("max_tokens")
    label = "natural EOS" + (f", caps clipped to {clip} tokens (diagnostic)" if clip else "")
    sections = {p: pattern_report(store, p, num_draws, n_resamples) for p in order}
    rep = {"settings": store["config"], "regime": store["regime"], "label": label,
           "patterns": {p: s for p, s in sections.items() if s is not None}}
    if sim_cost_model is not None:
        add_simulated(rep, store, sim_cost_model)
    rep["regime_map"] = regime_map(rep)
    return rep


def regime_map(rep: dict) -> dict:
    """Issue 38's regime map from the burst patterns run (``burst<k>``: N = k·D at once): per depth k and mode of
    :data:`MAP_MODES` that ran, the measured mean-JCT cut vs stock (paired interval, on the mode's draws) and the
    simulator's cut on the same runs (1 − simulated mean JCT / simulated stock's); depths ascending."""
    out = {}
    for name, p in rep["patterns"].items():
        depth = parse_patterns(name)[0].depth
        if depth is None or "jct_pooled" not in p:
            continue
        cells = {**p["modes"], **p.get("fewer_draws", {})}
        sim_stock = cells["stock"].get("simulated_mean_jct_s")
        out[depth] = {m: {"measured_cut": cells[m]["jct_cut_vs_stock"],
                          "simulated_cut": None if sim_stock is None
                          else 1 - cells[m]["simulated_mean_jct_s"] / sim_stock,
                          "draws": cells[m].get("draws", p["draws"])}
                      for m in MAP_MODES if m in cells}
    return dict(sorted(out.items()))
