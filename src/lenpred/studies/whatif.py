"""``lenpred whatif --traffic LOG``: would length-aware scheduling help *this* traffic? Replays a traffic log's own
arrivals, prompt and output lengths and served predictions through the simulator, at the log's concurrency bound and
at others, under stock FCFS, prompt-length priority, lenpred (the plug-in's parked SRPT on the served predictions)
and the recorded length (an unattainable oracle), and ends with one sentence: turn it on or not, and why.

The engine's cost comes from a calibration file (a :class:`lenpred.serving.cost_model.CostModel` JSON measured on the
serving machine) or from the log's own timings (:func:`cost_from_log`), and the report says which. Where the log's
engine settings name an order the replay has (the plug-in's parked SRPT, or ``observe``: stock FCFS), the cost's step
times are scaled so that order, replayed at the log's bound, takes the log's own mean JCT (:func:`fit_replay_pace`):
an engine's pace drifts over hours, and near capacity a few percent of pace moves the queue a lot. Intervals are
paired over the same requests, clustered by consecutive blocks of arrivals (:func:`lenpred.studies.paired.compare`):
a burst and its neighbours share a fate.
"""

from __future__ import annotations

import dataclasses
import logging
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError
from lenpred.io import write_json
from lenpred.serving.cost_model import PACE_BOUNDS, CostModel
from lenpred.serving.parked import SchedulerConfig
from lenpred.serving.policies import make_policy
from lenpred.serving.simulator import SimConfig, simulate, simulate_parked
from lenpred.studies.paired import compare
from lenpred.studies.workload import WorkloadRequest

logger = logging.getLogger(__name__)

MODES = ("stock FCFS", "prompt-length priority", "lenpred", "recorded length")
"""The orders compared: vLLM's default; ``--scheduling-policy priority`` by prompt tokens (free, prediction-free);
the plug-in's design (parked SRPT, D decode slots, a window of D, shortest prompt first) on the predictions the log
served; the same design on each request's recorded length."""
MIN_REQUESTS = 20
WORTH_IT = 0.02
"""The smallest mean-JCT cut (its interval's lower end) worth turning scheduling on for (``--worth-it``)."""
PROBES = 16
"""Times per request at which :func:`cost_from_log` counts the requests generating beside it."""
TAIL_LIMIT = 1.1
"""The largest p99 JCT ratio to stock called "the tail unchanged"."""
MISMATCH = 1.25
"""The largest ratio (either way) of the served order's replayed mean JCT to the log's own for which whatif gives a
verdict: beyond it the cost does not time the engine that served the log."""


@dataclass
class WhatifConfig:
    """Settings of :func:`run_whatif`.

    Attributes:
        traffic: a traffic-log directory (:mod:`lenpred.online.traffic_log`; the plug-in's ``traffic_log`` or
            ``lenpred serve --traffic-log``). The plug-in records its engine's settings beside the log, which give
            the bound it served at (:func:`served_bound`); under a scheduling policy a parked request's wait counts
            as decode time in the fitted cost, so a measured ``cost_model`` is the better choice there; a
            non-streaming proxy's log has no first-token times (:func:`streamed`): give ``cost_model`` and
            ``decode_slots``.
        cost_model: a cost-model JSON measured on the serving machine (``None``: fitted from the log's timings).
        decode_slots: concurrency bounds D to replay at, the log's own added where it says it (engine settings
            beside it naming a parked policy's ``decode_slots``, or streamed rows under ``observe``), else the first
            standing in for it (``None``: the log's own bound, half and double it).
        aging_tokens_per_s: the starvation guard of the lenpred order (tokens of rank per second waited,
            :class:`lenpred.serving.parked.SchedulerConfig`), >= 0; ``None``: the engine's own, recorded beside the
            log (``engine.json``), else 0 (no guard).
        max_wait_s: the lenpred order's age threshold (s, >= 0: a request that long past its arrival runs in arrival
            order ahead of the rest, :class:`lenpred.serving.parked.SchedulerConfig`); ``inf``: off; ``None``: the
            engine's own, else off.
        out: where ``whatif.json``, ``whatif.md`` and ``whatif.png`` go.
        fit_pace: scale the cost's step times to the log's own mean JCT (:func:`fit_replay_pace`) where the order
            it was served in is known and replayed; ``False``: the cost as given.
        clusters: consecutive-arrival blocks the bootstrap resamples (>= 2).
        bootstrap_resamples: paired bootstrap resamples.
        since, until: replay only the requests that arrived in ``[since, until]``: each an ISO 8601 time (UTC unless
            it names an offset, e.g. ``2026-12-06T10:00``) or seconds since the epoch; ``None``: from the log's start
            / to its end.
        worth_it: the smallest mean-JCT cut, as a fraction, that the verdict turns scheduling on for: its interval's
            lower end must reach it (0 <= worth_it < 1).
    """

    traffic: str
    cost_model: str | None = None
    decode_slots: tuple[int, ...] | None = None
    aging_tokens_per_s: float | None = None
    max_wait_s: float | None = None
    fit_pace: bool = True
    out: str = "results/whatif"
    clusters: int = 10
    bootstrap_resamples: int = 2000
    since: str | None = None
    until: str | None = None
    worth_it: float = WORTH_IT

    def __post_init__(self):
        since, until = epoch_s(self.since, "--since"), epoch_s(self.until, "--until")  # refused before the log is read
        if since is not None and until is not None and until < since:
            raise LenpredError(f"--until {self.until} is before --since {self.since}: give a window that ends after it "
                               "starts")
        if not 0 <= self.worth_it < 1:
            raise LenpredError(f"--worth-it must be a fraction in [0, 1) (0.02: a 2 % cut), got {self.worth_it}")
        if self.decode_slots is not None and (not self.decode_slots or min(self.decode_slots) < 1):
            shown = ",".join(str(d) for d in self.decode_slots)
            raise LenpredError(f"--decode-slots must be integers >= 1, got '{shown}': give bounds such as 8,16,32")
        if self.aging_tokens_per_s is not None and not self.aging_tokens_per_s >= 0:
            raise LenpredError(f"--aging-tokens-per-s must be >= 0 (0: no guard), got {self.aging_tokens_per_s}")
        if self.max_wait_s is not None and not self.max_wait_s >= 0:
            raise LenpredError(f"--max-wait-s must be >= 0 seconds (inf: no age threshold), got {self.max_wait_s}")
        if self.clusters < 2:
            raise LenpredError(f"--clusters must be >= 2 (the bootstrap resamples them), got {self.clusters}")
        if self.bootstrap_resamples < 100:
            raise LenpredError(f"--bootstrap-resamples must be >= 100 for a 95 % interval, got "
                               f"{self.bootstrap_resamples}")
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise LenpredError(f"--out {self.out} is a file: give a directory (it is created if missing)")


def epoch_s(value: str | float | None, flag: str = "--since") -> float | None:
    """A time given to ``flag`` (:attr:`WhatifConfig.since` / ``until``) as seconds since the epoch: an ISO 8601 time
    (:meth:`datetime.datetime.fromisoformat`, UTC unless it names an offset; tried first, so ``20261206`` is a
    date), else a number of seconds; ``None`` as it is.

    Raises:
        LenpredError: neither, or a time that is not finite or outside the years 1-9999.
    """
    from datetime import datetime, timezone

    if value is None:
        return None
    try:
        at = datetime.fromisoformat(str(value))
        return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()
    except ValueError:
        pass
    try:
        seconds = float(value)
        datetime.fromtimestamp(seconds, timezone.utc)  # in range: the header can print it
    except (ValueError, OverflowError, OSError):
        raise LenpredError(f"{flag} {value!r} is neither an ISO 8601 time (2026-12-06T10:00, UTC unless it names an "
                           "offset) nor a finite number of seconds since the epoch") from None
    return seconds


@dataclass
class LoggedTraffic:
    """What the replay reads of a traffic log, rows in arrival order; times in seconds from the first arrival.

    Attributes:
        arrival_s, first_token_s, finish_s: ``(n,)`` float64.
        num_prompt_tokens, num_output_tokens: ``(n,)`` int64.
        expected: ``(n,)`` float64, the predicted length served, tokens.
        num_outside: rows of the log that arrived outside ``[since, until]`` (:meth:`read`), not replayed.
        num_in_flight: of those, the rows that arrived before ``since`` and finished after it: work the engine was
            doing when the window opened, which the replay leaves out.
        start_epoch_s: the first replayed arrival, seconds since the epoch (the times above count from it).
    """

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    expected: np.ndarray
    num_outside: int = 0
    num_in_flight: int = 0
    start_epoch_s: float = 0.0

    @classmethod
    def read(cls, directory: str | Path, since: float | None = None, until: float | None = None) -> "LoggedTraffic":
        """Read a traffic log (:func:`lenpred.online.traffic_log.read_traffic_log`), only its rows that arrived in
        ``[since, until]`` (seconds since the epoch; ``None``: no bound on that side).

        Raises:
            LenpredError: rows without a time, prompt length or prediction, or times out of order (anywhere in the
                log), or fewer than :data:`MIN_REQUESTS` rows in the window.
        """
        from lenpred.online.traffic_log import read_traffic_log

        from lenpred.online.capture import is_headless

        log = read_traffic_log(directory)
        if is_headless(log.metadata):
            raise LenpredError(f"traffic log {directory} was captured with no head (predictor none): it holds no "
                               "predictions to replay; train a head on it (`lenpred train --traffic`), serve with it "
                               "in observe, and replay that log")
        c = log.columns
        for name in ("arrival_time_s", "first_token_time_s", "finish_time_s", "num_prompt_tokens", "expected"):
            if not np.isfinite(c[name]).all():
                raise LenpredError(f"traffic log {directory} has rows without {name}: whatif replays logs that record "
                                   "it (the plug-in's and lenpred serve's do); a damaged one cannot be replayed")
        if (c["first_token_time_s"] < c["arrival_time_s"]).any() or (c["finish_time_s"] < c["first_token_time_s"]).any():
            raise LenpredError(f"traffic log {directory} has a first token before its arrival or after its finish: "
                               "its clocks disagree; replay a log from one machine")
        arrival = c["arrival_time_s"]
        keep = np.ones(len(arrival), dtype=bool)
        if since is not None:
            keep &= arrival >= since
        if until is not None:
            keep &= arrival <= until
        in_flight = int(((arrival < since) & (c["finish_time_s"] > since)).sum()) if since is not None else 0
        c = {k: v[keep] for k, v in c.items()}
        n, windowed = len(c["arrival_time_s"]), since is not None or until is not None
        if n < MIN_REQUESTS:
            raise LenpredError(f"traffic log {directory} holds {n} requests" + (
                f" in the --since / --until window ({len(arrival) - n} outside it)" if windowed else "")
                + f"; a replay needs at least {MIN_REQUESTS}: log longer"
                + (", or widen the window" if windowed else ""))
        order = np.argsort(c["arrival_time_s"], kind="stable")
        t0 = c["arrival_time_s"][order[0]]
        return cls(c["arrival_time_s"][order] - t0, c["first_token_time_s"][order] - t0, c["finish_time_s"][order] - t0,
                   c["num_prompt_tokens"][order].astype(np.int64), c["num_output_tokens"][order].astype(np.int64),
                   c["expected"][order].astype(np.float64), len(arrival) - n, in_flight, float(t0))


def busy_counts(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``(len(at),)`` how many intervals ``[starts_i, ends_i)`` contain each time in ``at``."""
    s, e = np.sort(starts), np.sort(ends)
    return np.searchsorted(s, at, side="right") - np.searchsorted(e, at, side="right")


def observed_bound(traffic: LoggedTraffic) -> int:
    """The most requests the log shows generating at once (between first token and finish): the engine's
    concurrency bound as served (at least 1). Under parked decoding a parked request counts as generating, so a
    log recorded with a scheduling policy on shows ``decode_slots + prefill_ahead``: record with ``observe``, or pass
    ``--decode-slots``."""
    return max(int(busy_counts(traffic.first_token_s, traffic.finish_s, traffic.first_token_s).max()), 1)


def cost_from_log(traffic: LoggedTraffic) -> CostModel:
    """A cost model fitted to the log's own timings: the decode step ``d0 + d1·B`` from each request's time per
    output token after its first, ``(finish − first token) / (n − 1)``, against the mean number of requests
    generating beside it (B, itself included, sampled at :data:`PROBES` evenly spaced times of its decode); the
    prefill ``p0 + p1·P`` from the time to first token of requests that arrived to an idle engine (nothing generating
    or waiting). Non-negative least squares; with fewer than 3 idle arrivals the prefill is ``p0`` = their median TTFT
    (or ``d0``), ``p1`` = 0. It reads the engine's order as served: a log recorded under parked decoding counts a
    parked request as generating (:func:`streamed`).

    Raises:
        LenpredError: fewer than 3 requests with 2 or more output tokens, or first tokens logged at the finish (a
            non-streamed response: :func:`streamed`): nothing to fit the decode step on.
    """
    n = traffic.num_output_tokens
    multi = n >= 2
    if multi.sum() < 3:
        raise LenpredError("the traffic log has fewer than 3 requests of 2+ output tokens: pass a measured "
                           "--cost-model instead")
    if not streamed(traffic):
        raise LenpredError("the traffic log's first tokens came with the finish (non-streamed responses): its timings "
                           "say nothing of the engine's steps; pass a measured --cost-model and --decode-slots")
    first, finish = traffic.first_token_s[multi], traffic.finish_s[multi]
    per_token = (finish - first) / (n[multi] - 1)
    probes = first + (finish - first) * (np.arange(PROBES)[:, None] + 0.5) / PROBES
    batch = np.mean([busy_counts(traffic.first_token_s, traffic.finish_s, p) for p in probes], axis=0)
    d1, d0 = _line(batch, per_token)
    in_system = busy_counts(traffic.arrival_s, traffic.finish_s, traffic.arrival_s)  # itself included
    idle = in_system == 1
    ttft = traffic.first_token_s[idle] - traffic.arrival_s[idle]
    if idle.sum() >= 3 and np.ptp(traffic.num_prompt_tokens[idle]) > 0:
        p1, p0 = _line(traffic.num_prompt_tokens[idle].astype(np.float64), ttft)
    else:
        p0, p1 = (float(np.median(ttft)) if len(ttft) else d0), 0.0
    coefficients = {"p0": p0, "p1": p1, "p2": 0.0, "d0": d0, "d1": d1, "d2": 0.0}
    return CostModel("fitted to a traffic log", coefficients,
                     fit_stats={"num_decode_requests": int(multi.sum()), "num_idle_arrivals": int(idle.sum())})


def served_bound(engine: dict | None, traffic: LoggedTraffic) -> tuple[int, str, bool]:
    """``(D, where it came from, parked)``: the concurrency bound the log was served at, and whether a scheduling
    policy parked requests while it was. The most requests the rows show generating at once (:func:`observed_bound`:
    what ran together, the KV cache's limit included) unless the plug-in's engine settings beside the log (``engine``,
    :func:`lenpred.online.traffic_log.read_engine_settings`; ``None``: none recorded) name a parked policy: a parked
    request looks like a running one in the rows, so its ``decode_slots`` (at most ``max_num_seqs``) is the bound."""
    from lenpred.online.traffic_log import ENGINE_FILE

    if engine is None:
        return observed_bound(traffic), ("the most requests the log shows generating at once; no engine settings "
                                         "beside it: if a scheduling policy served it, parked requests count too, "
                                         "so pass --decode-slots"), False
    if engine["policy"] == "observe":
        return observed_bound(traffic), "the most requests the log shows generating at once", False
    bound = min(int(engine["decode_slots"]), int(engine["max_num_seqs"]))
    return bound, f"the plug-in's decode_slots under policy {engine['policy']} ({ENGINE_FILE})", True


GUARDS = {"aging_tokens_per_s": ("--aging-tokens-per-s", 0.0), "max_wait_s": ("--max-wait-s", None)}
"""The lenpred order's starvation guards a replay sets: ``setting -> (its flag, its value when off)``."""


def served_guard(engine: dict | None, given: float | None,
                 setting: str = "aging_tokens_per_s") -> tuple[float | None, str]:
    """``(value, where it came from)`` of one of the lenpred order's starvation guards (:data:`GUARDS`): ``given``
    (its flag), else the value the plug-in recorded beside the log (``engine``, its engine settings;
    :func:`lenpred.online.traffic_log.read_engine_settings`), else off (0 tokens/s for ``aging_tokens_per_s``,
    ``None`` for ``max_wait_s``).

    Raises:
        LenpredError: the recorded value is not a number >= 0.
    """
    from lenpred.online.traffic_log import ENGINE_FILE

    flag, off = GUARDS[setting]
    if given is not None:
        return float(given), flag
    if engine is not None and engine.get(setting) not in (None, off):
        value = engine[setting]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise LenpredError(f"the {ENGINE_FILE} beside the log holds {setting} = {value!r}, not a number >= 0: "
                               f"delete the file (the engine rewrites it) or pass {flag}")
        return float(value), f"the plug-in's own ({ENGINE_FILE})"
    return off, "none"


def streamed(traffic: LoggedTraffic) -> bool:
    """Whether the log's first-token times are real: the median request of 2+ tokens spent at least 1 % of its time
    after its first token (a proxy logging non-streamed responses records the first token at the finish)."""
    multi = traffic.num_output_tokens >= 2
    jct = traffic.finish_s[multi] - traffic.arrival_s[multi]
    after = traffic.finish_s[multi] - traffic.first_token_s[multi]
    return bool(multi.any() and np.median(after / np.maximum(jct, 1e-9)) >= 0.01)


def check_cost(cost: CostModel, source: str) -> CostModel:
    """``cost`` if it can time a replay: no negative coefficient, and a decode step that takes time.

    Raises:
        LenpredError: naming ``source`` and the fix.
    """
    c = cost.coefficients
    if min(c.values()) < 0 or c["d0"] + c["d1"] <= 0:
        raise LenpredError(f"the cost model from {source} has a negative coefficient or a decode step of 0 s "
                           f"({', '.join(f'{k}={v:g}' for k, v in c.items())}): pass a cost model measured on the "
                           "serving machine (--cost-model, scripts/decode_knee.py)")
    return cost


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(slope, intercept)`` of ``y ≈ intercept + slope·x`` by non-negative least squares (``scipy.optimize.nnls``,
    as :meth:`lenpred.serving.cost_model.CostModel.fit`)."""
    from scipy.optimize import nnls

    (slope, intercept), _ = nnls(np.stack([x, np.ones_like(x)], axis=1), y)
    return float(slope), float(intercept)


def workload(traffic: LoggedTraffic) -> list[WorkloadRequest]:
    """The log's requests as simulator requests, at their logged arrival times: predictions ``served`` (what the log
    served), ``oracle`` (the recorded length) and ``prompt_len``."""
    return [WorkloadRequest(i, [], int(n), max(int(n), 1), "traffic", f"r{i}",
                            {"served": float(e), "oracle": float(n), "prompt_len": float(p)},
                            num_prompt_tokens=int(p), arrival_time_s=float(a))
            for i, (a, p, n, e) in enumerate(zip(traffic.arrival_s, traffic.num_prompt_tokens,
                                                 traffic.num_output_tokens, traffic.expected))]


def replay_order(requests: list[WorkloadRequest], cost, decode_slots: int, order: str,
                 aging_tokens_per_s: float = 0.0, max_wait_s: float | None = None) -> np.ndarray:
    """``(n,)`` JCT in seconds, by request id, of one of :data:`MODES` at ``decode_slots`` (stock and prompt-length
    priority run ``decode_slots`` sequences; the plug-in's design admits ``decode_slots`` more into its window;
    lenpred with its starvation guards, ``aging_tokens_per_s`` and ``max_wait_s``, the recorded length without
    one).

    Raises:
        LenpredError: an order not in :data:`MODES`.
    """
    if order not in MODES:
        raise LenpredError(f"unknown order {order!r}: one of {', '.join(MODES)}")
    stock = SimConfig(max_num_seqs=decode_slots, max_num_batched_tokens=8192, arrival="given")
    parked = dataclasses.replace(stock, max_num_seqs=2 * decode_slots)
    design = SchedulerConfig(decode_slots=decode_slots, prefill_ahead=decode_slots)
    if order == "stock FCFS":
        timings = simulate(requests, make_policy("fcfs"), cost, stock)[1]
    elif order == "prompt-length priority":
        timings = simulate(requests, make_policy("sjf:prompt_len"), cost, stock)[1]
    elif order == "lenpred":
        guarded = dataclasses.replace(design, aging_tokens_per_s=aging_tokens_per_s, max_wait_s=max_wait_s)
        timings = simulate_parked(requests, guarded, cost, parked, predictor="served")[1]
    else:
        timings = simulate_parked(requests, design, cost, parked, predictor="oracle")[1]
    return np.array([t.jct_s for t in sorted(timings, key=lambda t: t.request_id)])


def replay(requests: list[WorkloadRequest], cost, decode_slots: int, aging_tokens_per_s: float = 0.0,
           max_wait_s: float | None = None) -> dict[str, np.ndarray]:
    """``{mode: (n,) JCT in seconds}`` of each of :data:`MODES` at ``decode_slots`` (:func:`replay_order`)."""
    return {m: replay_order(requests, cost, decode_slots, m, aging_tokens_per_s, max_wait_s) for m in MODES}


DESIGN_DEFAULTS = {k: getattr(SchedulerConfig(), k) for k in ("admit_by", "max_idle_s", "switch_margin_tokens")}
"""The plug-in's settings the replayed lenpred order assumes beside policy ``srpt`` and a window of D (the
:class:`lenpred.serving.parked.SchedulerConfig` defaults); a log whose engine settings lack one was served at its
default."""


def replayed_served_order(engine: dict | None, traffic: LoggedTraffic) -> tuple[str | None, str]:
    """``(order, why)``: the order of :data:`MODES` the log was served in, as its engine settings (``engine``,
    :func:`lenpred.online.traffic_log.read_engine_settings`) tell it: ``stock FCFS`` under policy ``observe`` (at the
    bound its streamed rows show), ``lenpred`` under the plug-in's design (policy ``srpt``, a window of
    ``decode_slots`` within ``max_num_seqs``, :data:`DESIGN_DEFAULTS`); ``None`` and the reason otherwise (no settings
    beside the log: ``lenpred serve``'s vLLM priority order or an older plug-in; another policy or setting;
    ``observe`` rows that were not streamed)."""
    from lenpred.online.traffic_log import ENGINE_FILE

    if engine is None:
        return None, (f"no {ENGINE_FILE} beside the log says which order served it (lenpred serve's priority order "
                      "or an older plug-in)")
    if engine["policy"] == "observe":
        if not streamed(traffic):
            return None, ("its rows were not streamed, so the bound it was served at under policy observe cannot be "
                          "read from them")
        return "stock FCFS", f"policy observe ({ENGINE_FILE})"
    other = {k: engine[k] for k, v in DESIGN_DEFAULTS.items() if engine.get(k, v) != v}
    if (engine["policy"] != "srpt" or engine["prefill_ahead"] != engine["decode_slots"]
            or engine["decode_slots"] > engine["max_num_seqs"] or other):
        shown = ", ".join(f"{k} {engine[k]}" for k in ("policy", "decode_slots", "prefill_ahead", "max_num_seqs",
                                                         *other))
        return None, f"{shown} ({ENGINE_FILE}) is not an order the replay has"
    return "lenpred", f"the plug-in's design ({ENGINE_FILE})"


def fit_guards(engine: dict | None, aging_tokens_per_s: float, max_wait_s: float | None) -> tuple:
    """``(aging_tokens_per_s, max_wait_s)`` to fit the pace with: the order as it was served, so each guard the
    engine settings beside the log (``engine``) record (:func:`served_guard` without a flag), whatever the replay asks
    about; one they do not record (an engine from before it was) is the replay's, ``aging_tokens_per_s`` /
    ``max_wait_s``."""
    return tuple(served_guard(engine, None, k)[0] if k in (engine or {}) else v
                 for k, v in (("aging_tokens_per_s", aging_tokens_per_s), ("max_wait_s", max_wait_s)))


def fit_replay_pace(requests: list[WorkloadRequest], cost: CostModel, decode_slots: int, order: str,
                    logged_mean_jct_s: float, aging_tokens_per_s: float = 0.0,
                    max_wait_s: float | None = None) -> float | None:
    """The pace scale of ``cost`` (:func:`lenpred.serving.cost_model.fit_pace`) at which ``order``, replayed at
    ``decode_slots`` (:func:`replay_order`), takes the log's own mean JCT ``logged_mean_jct_s`` (s): the engine's
    pace while it served the log, against the cost model's. ``None``: no scale in
    :data:`lenpred.serving.cost_model.PACE_BOUNDS` matches."""
    from lenpred.serving.cost_model import fit_pace

    return fit_pace(cost, lambda c: float(replay_order(requests, c, decode_slots, order, aging_tokens_per_s,
                                                       max_wait_s).mean()), logged_mean_jct_s)


def compare_modes(jct: dict[str, np.ndarray], clusters: int, n_resamples: int) -> dict[str, dict]:
    """Per mode: mean and p99 JCT (s) and, against stock FCFS, the paired mean-JCT cut and p99 ratio with 95 %
    intervals over ``clusters`` consecutive blocks of arrivals."""
    ref = np.array_split(jct["stock FCFS"], clusters)  # requests are in arrival order: blocks of consecutive ones
    out = {}
    for mode, x in jct.items():
        cell = {"mean_jct_s": float(x.mean()), "p99_jct_s": float(np.percentile(x, 99))}
        if mode != "stock FCFS":
            blocks = np.array_split(x, clusters)
            cell["jct_cut_vs_stock"] = compare("mean_cut", ref, blocks, n_resamples)
            cell["p99_ratio_vs_stock"] = compare("p99_ratio", ref, blocks, n_resamples)
        out[mode] = cell
    return out


VERDICTS = ("turn it on", "turn it on only if the tail may grow", "leave it off", "leave it off for now", "no verdict")
"""The verdict's kinds (``report["verdict_kind"]``), the sentence's opening words in order of :func:`verdict`'s rules;
the last where the cost does not time the engine (:data:`MISMATCH`)."""


def verdict_kind(cells: dict[str, dict], worth_it: float = WORTH_IT) -> str:
    """Which of :data:`VERDICTS` (but the last) :func:`verdict` gives: on where lenpred's cut has its interval's lower
    end at ``worth_it`` or more (without the tail if its p99 ratio exceeds :data:`TAIL_LIMIT`); else off, for good
    where the interval lies wholly under ``worth_it`` while the recorded length reaches it, for now otherwise."""
    cut, p99 = cells["lenpred"]["jct_cut_vs_stock"], cells["lenpred"]["p99_ratio_vs_stock"][0]
    if cut[1] >= worth_it:
        return VERDICTS[0] if p99 <= TAIL_LIMIT else VERDICTS[1]
    return VERDICTS[2] if cut[2] < worth_it <= cells["recorded length"]["jct_cut_vs_stock"][0] else VERDICTS[3]


def verdict(cells: dict[str, dict], decode_slots: int, worth_it: float = WORTH_IT) -> str:
    """One sentence: turn lenpred on or not at ``decode_slots``, and why (:func:`verdict_kind`, with ``worth_it`` and
    :data:`TAIL_LIMIT`): the gain's interval, the tail, the free prompt-length priority and the recorded length's
    gain (what any order could get) decide the reason given. Where lenpred is left off while its p99 ratio's interval
    lies wholly above :data:`TAIL_LIMIT`, the sentence says that too and names the age threshold that bounds it."""
    ours, oracle, free = cells["lenpred"], cells["recorded length"], cells["prompt-length priority"]
    cut, p99 = ours["jct_cut_vs_stock"], ours["p99_ratio_vs_stock"]
    head = f"at D = {decode_slots} lenpred cuts mean JCT by {cut[0]:+.1%} [{cut[1]:+.1%}, {cut[2]:+.1%}]"
    vs_free = f"prompt-length priority, free, {free['jct_cut_vs_stock'][0]:+.1%}"
    best, kind = oracle["jct_cut_vs_stock"][0], verdict_kind(cells, worth_it)
    bar = f"{100 * worth_it:g}%"
    tail = (f" Its tail grows too: p99 {p99[0]:.2f}x [{p99[1]:.2f}, {p99[2]:.2f}] stock's; an age threshold "
            "(--max-wait-s S) bounds the wait of the longest requests." if p99[1] > TAIL_LIMIT else
            f" Its p99 is {p99[0]:.2f}x [{p99[1]:.2f}, {p99[2]:.2f}] stock's.")
    if kind == VERDICTS[0]:
        return (f"Turn it on: {head} with p99 {p99[0]:.2f}x stock's ({vs_free}): requests wait here, and the shorter "
                "ones finish sooner.")
    if kind == VERDICTS[1]:
        return (f"Turn it on only if the tail may grow: {head}, but p99 is {p99[0]:.2f}x stock's ({vs_free}): the "
                "longest requests wait behind shorter ones that keep arriving; a starvation guard (max_wait_s, the age "
                "threshold, or aging_tokens_per_s) trades gain for tail.")
    if kind == VERDICTS[2]:
        return (f"Leave it off: {head}, reliably under {bar} where the recorded length gains {best:+.1%}; "
                "logging more traffic will not change that at this bound." + tail)
    if best < worth_it:
        why = (f"even the recorded length gains {best:+.1%}: requests rarely wait for a slot at this bound, so no order "
               "can help much")
    else:
        why = (f"there is a queue to reorder (the recorded length gains {best:+.1%}), but lenpred's interval is too "
               f"wide to promise {bar}: log more traffic and ask again")
    return f"Leave it off for now: {head}, the interval's lower end under {bar}; {why}." + tail


def run_whatif(cfg: WhatifConfig) -> dict:
    """Replay the log (module docstring) and write ``whatif.json``, ``whatif.md`` and ``whatif.png`` under
    ``cfg.out``; returns the report (``verdict`` is the sentence at the log's own bound).

    Raises:
        LenpredError: an unreadable or too small log (:meth:`LoggedTraffic.read`), an unreadable cost model.
    """
    since, until = epoch_s(cfg.since, "--since"), epoch_s(cfg.until, "--until")
    traffic = LoggedTraffic.read(cfg.traffic, since, until)
    from lenpred.online.traffic_log import read_engine_settings

    try:
        engine = read_engine_settings(cfg.traffic)  # read once: every helper below takes it
        own, bound_source, parked = served_bound(engine, traffic)
        order, order_source = replayed_served_order(engine, traffic)
        unsaid = ("its rows were not streamed" if not streamed(traffic) else
                  f"no engine settings beside it; its rows show up to {own} generating at once, parked requests "
                  "included if a scheduling policy served it")
    except LenpredError:  # an unreadable engine.json: replayed only with every setting it would give given
        if not cfg.decode_slots or cfg.aging_tokens_per_s is None or cfg.max_wait_s is None:
            raise
        engine, own, parked, unsaid = None, None, False, "the engine settings beside it are unreadable"
        order, order_source = None, "the engine settings beside the log are unreadable"
    # the bound is known where the engine settings say it (a parked policy's decode_slots) or its streamed rows do
    # under policy observe; else the first of --decode-slots stands in for it
    given = bool(cfg.decode_slots) and not (parked or order == "stock FCFS")
    if given:
        own, bound_source = cfg.decode_slots[0], f"the first of --decode-slots: the log does not say its own ({unsaid})"
    if cfg.cost_model is not None:
        cost, source = CostModel.load(cfg.cost_model), f"the calibration file {cfg.cost_model}"
    else:
        cost, source = cost_from_log(traffic), "the log's own timings (cost_from_log)"
        if parked:
            source += (", approximate: the log was served with parked decoding, where a parked request's wait counts "
                       "as decode time; a --cost-model measured on the serving machine is better")
    cost = check_cost(cost, source)
    if cfg.decode_slots is None and not streamed(traffic):
        raise LenpredError("the traffic log's first tokens came with the finish (non-streamed responses), so its "
                           "concurrency bound cannot be read from it: pass --decode-slots")
    # the log's own bound is always replayed: the verdict speaks of it
    bounds = tuple(sorted({*cfg.decode_slots, own})) if cfg.decode_slots else tuple(sorted({max(own // 2, 1), own,
                                                                                            2 * own}))
    aging, aging_source = served_guard(engine, cfg.aging_tokens_per_s)
    wait, wait_source = served_guard(engine, cfg.max_wait_s, "max_wait_s")
    wait = None if wait == float("inf") else wait  # off, as given
    requests = workload(traffic)
    if cfg.clusters > len(requests) // 2:
        raise LenpredError(f"--clusters {cfg.clusters} is more than half the log's {len(requests)} requests: blocks of "
                           "one or two requests make the interval falsely tight; give at most "
                           f"{len(requests) // 2} (default 10)")
    logged = float(np.mean(traffic.finish_s - traffic.arrival_s))
    pace, pace_source = None, "not fitted (--no-fit-pace)"
    # the guards the served order ran with (engine.json's), read once for the pace fit and the fidelity replay
    served_guards = fit_guards(engine, aging, wait) if order is not None else None
    if cfg.fit_pace and order is None:
        pace_source = f"not fitted: {order_source}"
    elif cfg.fit_pace:
        pace = fit_replay_pace(requests, cost, own, order, logged, *served_guards)
        pace_source = (f"fitted so that the replayed {order} at D = {own} takes the log's mean JCT ({order} is the "
                       f"order it was served in: {order_source}), so that row of the D = {own} table matches the log "
                       "by construction; every order is replayed at that pace, so a slowdown the served order itself "
                       "caused the engine is not counted against it" if pace is not None else
                       f"not fitted: no scale in {PACE_BOUNDS[0]:g}-{PACE_BOUNDS[1]:g}x gives the replayed {order} "
                       "the log's mean JCT")
        if pace is not None:
            cost = cost.with_pace(pace)
    replayed = None  # the served order replayed at its bound, against the log's own mean JCT
    if order is not None:
        replayed = float(replay_order(requests, cost, own, order, *served_guards).mean())
    results = {}
    for d in bounds:
        logger.info("whatif: replaying %d requests at D = %d", len(requests), d)
        results[d] = compare_modes(replay(requests, cost, d, aging, wait), cfg.clusters, cfg.bootstrap_resamples)
    kind, said = verdict_kind(results[own], cfg.worth_it), verdict(results[own], own, cfg.worth_it)
    if replayed is not None and not 1 / MISMATCH <= replayed / logged <= MISMATCH:
        kind = VERDICTS[-1]
        said = (f"No verdict: the replayed {order} at D = {own}, the order the log was served in, takes "
                f"{replayed:.1f} s on average where the log took {logged:.1f} s ({replayed / logged:.2f}x): the cost "
                "does not time this engine; pass a --cost-model measured on the serving machine "
                "(scripts/decode_knee.py).")
    settings = dataclasses.asdict(cfg)
    if settings["max_wait_s"] == float("inf"):
        settings["max_wait_s"] = "inf"  # JSON has no infinity
    report = {"traffic": str(cfg.traffic), "num_requests": len(requests),
              "window": {"since_epoch_s": since, "until_epoch_s": until, "num_outside": traffic.num_outside,
                         "num_in_flight": traffic.num_in_flight},
              "observed_bound": own, "bound_source": bound_source,
              "bound_given": given, "served_order": order or "unknown", "served_order_source": order_source,
              "logged_mean_jct_s": logged,
              "cost_source": source, "pace_scale": pace, "pace_source": pace_source,
              "cost_coefficients": cost.coefficients,
              "aging_tokens_per_s": aging, "aging_source": aging_source,
              "max_wait_s": wait, "max_wait_source": wait_source,
              "duration_s": float(traffic.finish_s.max()), "first_arrival_epoch_s": traffic.start_epoch_s, "results": {str(d): r for d, r in results.items()},
              "replayed_served_mean_jct_s": replayed, "verdict_at": own, "verdict_kind": kind, "verdict": said,
              "settings": settings}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "whatif.json", report)
    (out / "whatif.md").write_text(render_whatif(report))
    plot_whatif(report, out / "whatif.png")
    return report


def guard_text(report: dict) -> str:
    """The lenpred order's starvation guards as the report's header says them: each guard on, with where its value
    came from; each one a flag or the plug-in's settings turned off; or that none is on and how to set one."""
    aging, wait = report.get("aging_tokens_per_s", 0.0), report.get("max_wait_s")
    aging_source, wait_source = report.get("aging_source", "none"), report.get("max_wait_source", "none")
    on = ([f"aging at {aging:g} tokens/s ({aging_source})"] if aging else []) + (
        [f"the age threshold at {wait:g} s ({wait_source})"] if wait is not None else [])
    off = ([f"no aging ({aging_source} 0)"] if not aging and aging_source != "none" else []) + (
        [f"no age threshold ({wait_source} inf)"] if wait is None and wait_source != "none" else [])
    if on:
        return "; ".join(on + off)
    return "none (" + "".join(f"{o}; " for o in off) + "--max-wait-s S or --aging-tokens-per-s R sets one)"


def fidelity(report: dict) -> str:
    """The header's pointer to the replay's fidelity: the order the log was served in, replayed at its own bound
    (``report["observed_bound"]``), against the log's mean JCT, or why that order is unknown; nothing where the replay
    is fitted to it (:func:`pace_text` says so)."""
    if report.get("pace_scale") is not None:
        return ""
    if report["replayed_served_mean_jct_s"] is None:
        return f" (the order it was served in is unknown: {report['served_order_source']})"
    return (f" against {report['replayed_served_mean_jct_s']:.1f} s for the replayed {report['served_order']} at that "
            "D, the order it was served in: the replay's fidelity")


def pace_text(report: dict) -> str:
    """The header's words on the cost's pace (:func:`fit_replay_pace`): the scale and how it was fitted, or why not."""
    pace, source = report.get("pace_scale"), report.get("pace_source")
    if pace is not None:
        return (f", its step times x{pace:.3f} (the engine ran {'slower' if pace > 1 else 'faster'} than the cost "
                f"model by that factor), {source}")
    if report.get("served_order") == "unknown" and report.get("settings", {}).get("fit_pace", True):
        return " (pace not fitted: the order it was served in is unknown)"  # the fidelity note says why
    return f" (pace {source})" if source else ""


def verdict_bound_text(report: dict) -> str:
    """Which bound the verdict below the tables speaks of: the log's own (always replayed, beside any
    ``--decode-slots``), the one given where the log's own is unknown; or, with no verdict, the bound whose replay did
    not match."""
    own, asked = report["observed_bound"], report.get("settings", {}).get("decode_slots")
    if report.get("verdict_kind") == VERDICTS[-1]:
        return f"none: the served order replayed at D = {own}, the log's own bound, does not match the log"
    if report.get("bound_given"):
        return f"speaks of D = {own}, the first bound given (the log's own is unknown)"
    added = " (replayed beside --decode-slots, which did not name it)" if asked and own not in asked else ""
    return f"speaks of D = {own}, the log's own bound{added}"


def utc(epoch_s: float) -> str:
    """Seconds since the epoch as an ISO 8601 UTC time to the second (``2026-12-06T10:00:00+00:00``)."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds")


def window_text(report: dict) -> str:
    """The header's words on ``--since`` / ``--until``: the window replayed, how many rows fell outside it and how many
    of them were still running when it opened."""
    w = report.get("window") or {}
    if w.get("since_epoch_s") is None and w.get("until_epoch_s") is None:
        return ""
    span = " ".join(([f"from {utc(w['since_epoch_s'])}"] if w.get("since_epoch_s") is not None else [])
                    + ([f"to {utc(w['until_epoch_s'])}"] if w.get("until_epoch_s") is not None else []))
    flight = (f", {w['num_in_flight']} of them still running when it opened (their work is not in the replay)"
              if w.get("num_in_flight") else "")
    return f", those arriving {span} ({w['num_outside']} rows outside the window not replayed{flight})"


def idle_note(cells: dict[str, dict], d: str) -> list[str]:
    """A line under a table where every order gives stock's mean JCT to the millisecond: requests barely wait for a
    slot at that bound, so no order changes anything (an all-zero table is not a failure)."""
    stock = cells["stock FCFS"]["mean_jct_s"]
    if all(abs(c["mean_jct_s"] - stock) < 1e-3 for c in cells.values()):
        return [f"Every order gives stock's mean JCT at D = {d} (to the millisecond): requests barely wait for a slot "
                "at this bound, so no order changes anything.", ""]
    return []


TERMS = ("Terms: D is the concurrency bound (requests decoding at once); JCT, job completion time (arrival to last "
         "token); stock FCFS, vLLM's default first-come-first-served order; prompt-length priority, vLLM's priority "
         "queue with the shortest prompt first (no prediction); lenpred, the plug-in's order (shortest predicted "
         "remaining first, extra requests parked) on the predictions the log served; recorded length, the same order "
         "on each request's actual output length: an oracle no scheduler has, the most an order could gain. A "
         "positive cut means a shorter mean JCT than stock's; a p99 / stock above 1, a longer tail. whatif.png draws "
         "both against D.")
"""The glossary closing ``whatif.md``."""


def render_whatif(report: dict) -> str:
    """The report as Markdown: a header (one line per setting: the log, the cost, the guards, the verdict's bound,
    the intervals), one table per concurrency bound, then the verdict."""
    pct = lambda t: f"{t[0]:+.1%} [{t[1]:+.1%}, {t[2]:+.1%}]"  # noqa: E731
    settings = report.get("settings", {})
    lines = [f"# What if: {report['num_requests']} logged requests over {report['duration_s']:.0f} s"
             + window_text(report), "",
             "- The log: " + (f"its first replayed arrival at {utc(report['first_arrival_epoch_s'])}; "
                              if "first_arrival_epoch_s" in report else "")
             + f"served at D = {report['observed_bound']} ({report['bound_source']}); its mean JCT as "
             f"served {report['logged_mean_jct_s']:.1f} s" + fidelity(report) + ".",
             f"- The engine's cost: from {report['cost_source']}" + pace_text(report)
             + ". The KV cache is not a bound in the replay.",
             f"- lenpred's starvation guards: {guard_text(report)}.",
             f"- The verdict (below): {verdict_bound_text(report)}.",
             f"- The bar: a cut whose interval's lower end is at least {100 * settings.get('worth_it', WORTH_IT):g}% "
             "turns it on (--worth-it).",
             "- Intervals: 95 %, paired, clustered by consecutive arrivals"
             + (f" ({settings['clusters']} blocks, {settings['bootstrap_resamples']} resamples)."
                if "clusters" in settings else "."), ""]
    for d, cells in report["results"].items():
        lines += [f"## D = {d}", "", "| order | mean JCT s | mean-JCT cut vs stock | p99 JCT s | p99 / stock |",
                  "|---|---:|---:|---:|---:|"]
        for mode, c in cells.items():
            cut = pct(c["jct_cut_vs_stock"]) if "jct_cut_vs_stock" in c else "–"
            ratio = (f"{c['p99_ratio_vs_stock'][0]:.2f} [{c['p99_ratio_vs_stock'][1]:.2f}, "
                     f"{c['p99_ratio_vs_stock'][2]:.2f}]") if "p99_ratio_vs_stock" in c else "–"
            lines.append(f"| {mode} | {c['mean_jct_s']:.1f} | {cut} | {c['p99_jct_s']:.1f} | {ratio} |")
        lines += [""] + idle_note(cells, d)
    return "\n".join(lines + [report["verdict"], "", TERMS, ""])


def plot_whatif(report: dict, path: Path) -> None:
    """Mean-JCT cut and p99 ratio vs stock, per order, against the concurrency bound (95 % intervals)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bounds = [int(d) for d in report["results"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for mode in MODES[1:]:
        for ax, key, scale in ((axes[0], "jct_cut_vs_stock", 100), (axes[1], "p99_ratio_vs_stock", 1)):
            est = np.array([report["results"][str(d)][mode][key] for d in bounds]) * scale
            ax.errorbar(bounds, est[:, 0], yerr=[est[:, 0] - est[:, 1], est[:, 2] - est[:, 0]], marker="o",
                        capsize=3, label=mode)
    axes[0].axhline(0, color="grey", lw=0.8)
    axes[1].axhline(1, color="grey", lw=0.8)
    axes[0].set(xlabel="concurrency bound D", ylabel="mean-JCT cut vs stock FCFS (%)", xscale="log")
    axes[1].set(xlabel="concurrency bound D", ylabel="p99 JCT / stock's", xscale="log")
    for ax in axes:
        ax.axvline(report["observed_bound"], color="grey", ls=":", lw=0.8)
        ax.set_xticks(bounds, [str(d) for d in bounds])
        ax.minorticks_off()
    axes[0].legend(fontsize=8)
    fig.suptitle(textwrap.fill(report["verdict"], 150), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
