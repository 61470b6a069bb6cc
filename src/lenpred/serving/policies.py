"""Scheduling policies, one small registered class each (:func:`register`, :func:`make_policy`), and
length-bucketed static batching.

A policy ranks requests by a key (lower runs first), as vLLM's priority queue does. Registered policies:

* ``fcfs``: arrival time (ties: request id).
* ``random``: a seeded random number per request (a control without length information).
* ``sjf``: the predictor's static prediction (shortest-job-first; SSJF, Qiu et al. 2024); ``oracle`` = true length.
* ``srpt``: shortest predicted *remaining* length first with TRAIL's limited preemption (Shahout et al. 2024,
  "Don't Stop Me Now"): a running request may be preempted by a better-ranked waiting one only while it has
  generated fewer than ``c × its first prediction`` tokens (``c = 0.8``). The remaining estimate comes from a
  ``remaining(request, generated) -> tokens`` callable: default the countdown ``max(pred − generated, 0)``;
  :func:`progressive_remaining` plugs in re-predictions made at decode steps (issue 12's progressive predictor).

Each takes optional **aging** (starvation guard, vllm-ltr's rule, Fu et al. 2024): a waiting request that has
sat for ``aging_steps`` scheduler steps (200 in vllm-ltr) since it arrived or was last preempted is promoted
ahead of every non-promoted request; promoted requests run among themselves in arrival order. ``sjf`` also takes the
**delay-dependent priority** ``aging_tokens_per_s`` (Kleinrock 1964; :class:`SJF`): a static key that a client or a
proxy can send as vLLM's ``priority``, so stock vLLM applies it.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields
from typing import Callable, ClassVar

import numpy as np

from lenpred.errors import LenpredError
from lenpred.registry import registrar

TRAIL_PREEMPT_FRACTION = 0.8  # TRAIL's c: preemptible while generated < c × first prediction
VLLM_LTR_AGING_STEPS = 200  # vllm-ltr's starvation threshold in scheduler steps

Remaining = Callable[[object, int], float]


def countdown_remaining(predictor: str) -> Remaining:
    """``remaining(request, generated) = max(pred − generated, 0)`` with ``pred`` the static prediction."""
    def remaining(request, generated: int) -> float:
        return max(request.predictions[predictor] - generated, 0.0)
    return remaining


def progressive_remaining(estimates: dict[int, dict[int, float]], fallback: Remaining,
                          steps: tuple[int, ...] = (0, 8, 16, 24, 32, 40, 48, 56, 64, 128, 256, 512),
                          key: Callable[[object], int] = lambda r: r.request_id) -> Remaining:
    """A remaining-length estimate from re-predictions made at decode steps (the progressive predictor's hook).

    Args:
        estimates: ``{key(request): {decode step: predicted *total* output length in tokens}}`` for the steps the
            predictor was run at (e.g. issue 12's ``results/progressive/`` at 0, 8, …, 64, 128, 256, 512).
        fallback: used for requests without estimates.
        steps: the decode steps re-predictions exist at (the simulator stops at each to re-rank).
        key: a request's key in ``estimates``: its ``request_id`` (default) or, for estimates per test sample,
            ``lambda r: r.table_row``.

    Returns:
        ``remaining(request, generated) = max(latest estimate at a step <= generated − generated, 0)``.
    """
    def remaining(request, generated: int) -> float:
        by_step = estimates.get(key(request))
        if not by_step:
            return fallback(request, generated)
        known = [s for s in by_step if s <= generated]
        total = by_step[max(known)] if known else by_step[min(by_step)]
        return max(total - generated, 0.0)
    remaining.update_steps = tuple(steps)  # the simulator re-ranks when a running request reaches one
    return remaining


POLICIES: dict[str, type["Policy"]] = {}
"""Registered policy classes by name, in registration order (:func:`register`)."""


register = registrar(POLICIES, "policy")
"""Class decorator adding a :class:`Policy` subclass to :data:`POLICIES` under ``name`` (its ``name``)."""


@dataclass
class Policy:
    """A ranking of requests (lower key first), optionally preemptive and with aging. One registered subclass per
    policy implements :meth:`key`; build them by name with :func:`make_policy`.

    Class attributes:
        name: registry name (set by :func:`register`).
        reads_prediction: the key reads ``request.predictions[predictor]`` (so a spec needs ``name:predictor``).
        preemptive: a better-ranked waiting request may displace a running one (see :meth:`preemptible`).
        remaining: remaining-length estimate (only :class:`SRPT` has one; the simulator reads its
            ``update_steps``).

    Attributes:
        predictor: the prediction the key reads (``oracle`` = true length); ``None`` for fcfs / random.
        aging_steps: vllm-ltr starvation threshold in scheduler steps; ``None`` disables aging (applied by the
            simulator, not by :meth:`key`).
    """

    name: ClassVar[str] = ""
    reads_prediction: ClassVar[bool] = False
    preemptive: ClassVar[bool] = False
    remaining = None

    predictor: str | None = None
    aging_steps: int | None = None

    @property
    def label(self) -> str:
        """``name`` or ``name:predictor``, with ``+aging`` when on (table rows)."""
        base = self.name if self.predictor is None else f"{self.name}:{self.predictor}"
        return base + (f"+aging{self.aging_steps}" if self.aging_steps else "")

    def key(self, request, generated: int = 0) -> tuple:
        """Sort key of a request that has generated ``generated`` tokens: the policy's rank, then arrival time and
        request id (ties)."""
        raise NotImplementedError

    def preemptible(self, request, generated: int) -> bool:
        """Whether a running request may be displaced now (never, unless the policy is preemptive)."""
        return False


def arrival_order(request) -> tuple:
    """``(arrival_time_s, request_id)``: the tie-break of every policy, here and in :mod:`lenpred.serving.parked`."""
    return (request.arrival_time_s, request.request_id)


@register("fcfs")
@dataclass
class FCFS(Policy):
    """First come, first served: arrival time (ties: request id)."""

    def key(self, request, generated: int = 0) -> tuple:
        return arrival_order(request)


@register("random")
@dataclass
class Random(Policy):
    """A seeded random number per request (a control without length information); the same request keeps its
    number for the policy's lifetime.

    Attributes:
        seed: with the request id, seeds each request's number (``np.random.default_rng([seed, request_id])``).
    """

    seed: int = 0
    _random_keys: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def key(self, request, generated: int = 0) -> tuple:
        if request.request_id not in self._random_keys:
            rng = np.random.default_rng([self.seed, request.request_id])
            self._random_keys[request.request_id] = float(rng.random())
        return (self._random_keys[request.request_id], *arrival_order(request))


@register("sjf")
@dataclass
class SJF(Policy):
    """Shortest job first by the predictor's static prediction (SSJF, Qiu et al. 2024); ``oracle`` = true length.

    Attributes:
        aging_tokens_per_s: delay-dependent priority (Kleinrock 1964): each second a request has waited counts as
            this many tokens off its prediction. Every waiting request ages at the same rate, so the order at any
            moment is the static key ``prediction + aging_tokens_per_s × arrival_time_s``, a number a client or
            proxy can send as vLLM's ``priority`` at arrival (``lenpred serve --aging-tokens-per-s``). 0: none.
    """

    reads_prediction: ClassVar[bool] = True
    predictor: str | None = "oracle"
    aging_tokens_per_s: float = 0.0

    def __post_init__(self):
        check_aging_rate(self.aging_tokens_per_s)

    @property
    def label(self) -> str:
        """:attr:`Policy.label`, with ``+age<k>/s`` when the delay-dependent priority is on."""
        return super().label + (f"+age{self.aging_tokens_per_s:g}/s" if self.aging_tokens_per_s else "")

    def key(self, request, generated: int = 0) -> tuple:
        return (aged_priority(request.predictions[self.predictor], request.arrival_time_s, self.aging_tokens_per_s),
                *arrival_order(request))


MAX_AGING_TOKENS_PER_S = 1e6
"""The largest aging rate accepted: ``rate × seconds`` must stay a 64-bit integer when it is sent as vLLM's
``priority`` (vLLM serialises requests to its engine process with 64-bit integers)."""


def check_aging_rate(aging_tokens_per_s: float) -> None:
    """Nothing; raises :class:`LenpredError` unless ``aging_tokens_per_s`` is a real number (:class:`numbers.Real`,
    numpy's included; not a bool or a string) with ``0 <= aging_tokens_per_s <= MAX_AGING_TOKENS_PER_S`` (0 is off)."""
    real = isinstance(aging_tokens_per_s, numbers.Real) and not isinstance(aging_tokens_per_s, bool)
    if not real or not 0 <= aging_tokens_per_s <= MAX_AGING_TOKENS_PER_S:  # nan fails every comparison
        raise LenpredError(f"aging must be a number >= 0 tokens per second of waiting (0: no starvation guard) and "
                           f"at most {MAX_AGING_TOKENS_PER_S:g}, got {aging_tokens_per_s!r}")


def aged_priority(prediction: float, arrival_s: float, aging_tokens_per_s: float) -> float:
    """``prediction + aging_tokens_per_s × arrival_s``: the static priority (lower first) under which requests that
    wait gain ``aging_tokens_per_s`` tokens of rank per second (:class:`SJF`).

    Args:
        prediction: tokens (or any length signal). arrival_s: seconds on a clock shared by every request.

    Raises:
        LenpredError: an aging rate outside ``[0, MAX_AGING_TOKENS_PER_S]`` or not a number (:func:`check_aging_rate`).
    """
    check_aging_rate(aging_tokens_per_s)
    return prediction + aging_tokens_per_s * arrival_s


@register("srpt")
@dataclass
class SRPT(Policy):
    """Shortest predicted remaining length first with TRAIL's limited preemption (Shahout et al. 2024).

    Attributes:
        remaining: ``remaining(request, generated) -> tokens``; ``None``: :func:`countdown_remaining` of the
            predictor.
        preempt_fraction: TRAIL's ``c``: preemptible while ``generated < c × first prediction``.
    """

    reads_prediction: ClassVar[bool] = True
    preemptive: ClassVar[bool] = True
    predictor: str | None = "oracle"
    remaining: Remaining | None = None
    preempt_fraction: float = TRAIL_PREEMPT_FRACTION

    def __post_init__(self):
        if self.remaining is None:
            self.remaining = countdown_remaining(self.predictor)

    def key(self, request, generated: int = 0) -> tuple:
        return (self.remaining(request, generated), *arrival_order(request))

    def preemptible(self, request, generated: int) -> bool:
        """TRAIL's limited preemption: ``generated < c × first prediction``."""
        return generated < self.preempt_fraction * request.predictions[self.predictor]


def make_policy(spec: str, aging_steps: int | None = None, seed: int = 0, **kw) -> Policy:
    """A registered policy from ``name`` or ``name:predictor`` (e.g. ``sjf:estp``, ``srpt:oracle``).

    Args:
        spec: ``name`` for policies that read no prediction, else ``name:predictor``.
        aging_steps: vllm-ltr starvation threshold (>= 1 for length policies), ``None``: no aging.
        seed: the seed of policies that have one (``random``).
        **kw: further fields of the policy class (``remaining``, ``preempt_fraction`` for ``srpt``); names the
            class does not have are ignored.

    Raises:
        LenpredError: unknown name (lists the valid ones), a length policy without a predictor, a predictor on
            fcfs / random, or aging steps below 1.
    """
    name, _, predictor = spec.partition(":")
    if name not in POLICIES:
        raise LenpredError(f"unknown policy '{name}'; valid policies: {', '.join(POLICIES)}")
    cls = POLICIES[name]
    if not cls.reads_prediction:
        if predictor:
            raise LenpredError(f"policy {name} reads no prediction: write '{name}', not '{spec}'")
        return _build(cls, aging_steps=aging_steps, seed=seed)
    if not predictor:
        raise LenpredError(f"policy {name} needs a predictor: write '{name}:<predictor>' (e.g. {name}:estp or "
                           f"{name}:oracle)")
    if aging_steps is not None and aging_steps < 1:
        raise LenpredError(f"aging steps must be >= 1 (vllm-ltr uses {VLLM_LTR_AGING_STEPS}), got {aging_steps}")
    return _build(cls, predictor=predictor, aging_steps=aging_steps, **kw)


def _build(cls: type[Policy], **kw) -> Policy:
    """``cls`` with the keyword arguments that are its init fields (the others are ignored)."""
    names = {f.name for f in fields(cls) if f.init}
    return cls(**{k: v for k, v in kw.items() if k in names})


def static_batches(requests: list, batch_size: int, policy: Policy) -> list[list]:
    """Length-bucketed static batching (Sequence-Scheduling, Zheng et al. 2023): order requests by the policy's
    key at admission (sjf: predicted length; fcfs: arrival) and cut into consecutive batches of ``batch_size``
    (the last may be smaller). Batches run in that order.

    Raises:
        LenpredError: ``batch_size < 1``, or a preemptive policy (a static batch cannot preempt).
    """
    if batch_size < 1:
        raise LenpredError(f"batch size must be >= 1, got {batch_size}")
    if policy.preemptive:
        raise LenpredError(f"{policy.label} preempts, which static batches cannot: use fcfs, random or sjf")
    ordered = sorted(requests, key=lambda r: policy.key(r, 0))
    return [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]


def padding_ratio(batches: list[list[int]]) -> float:
    """Padding ratio of static batches (Sequence-Scheduling's definition): ``1 − Σᵢ Lᵢ / Σᵢ max_{j ∈ batch(i)} Lⱼ``,
    the share of generated slots that are padding.

    Args:
        batches: the true output lengths (tokens) of each batch's members.

    Raises:
        LenpredError: no tokens at all.
    """
    useful = sum(sum(b) for b in batches)
    slots = sum(len(b) * max(b) for b in batches if b)
    if slots == 0:
        raise LenpredError("padding ratio of an empty workload: give at least one request with output tokens")
    return 1.0 - useful / slots
