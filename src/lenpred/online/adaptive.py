"""Online-adaptive prediction intervals: keep the interval's coverage at its nominal level on drifting traffic,
from the requests that finished — with no extra model pass.

The predictor's interval is conformalized quantile regression (:mod:`lenpred.intervals`): the head's own
``(1-c)/2`` and ``(1+c)/2`` quantiles ``[low_raw, high_raw]`` widened by a margin ``m`` calibrated offline. Here
the margin is re-estimated online from finished requests' conformity scores
``E = max(low_raw - y, y - high_raw)`` (Romano et al. 2019), in one of two ways:

* ``"rolling"``: split-conformal over the last ``window`` finished requests: ``m`` is the
  ``ceil((n + 1) c) / n`` empirical quantile of their scores (:func:`conformal_quantile`).
* ``"aci"``: adaptive conformal inference (Gibbs & Candès, "Adaptive Conformal Inference Under Distribution
  Shift", NeurIPS 2021): the miscoverage level moves with each outcome,
  ``alpha_{t+1} = alpha_t + gamma (alpha - err_t)`` (their eq. 2; ``err_t = 1`` when request t fell outside its
  interval), and ``m_t`` is the ``1 - alpha_t`` quantile of the window's scores (``alpha_t <= 0``: an unbounded
  interval, as in the paper). Its long-run miscoverage is within ``(max(alpha_1, 1 - alpha_1) + gamma) /
  (gamma T)`` of ``alpha`` over any T requests, whatever the traffic (their Prop. 4.1).

Mondrian (per-group) calibration (Vovk et al. 2005): with a group key (a route or client tag), every group keeps
its own window and ``alpha_t``, and a group with fewer than ``min_group_size`` scores uses the pooled state.

A capped request's observed length is its cap; coverage is of what the serving system observed, as in the
predictor's card. The served interval ``[max(low_raw - m, 0), min(high_raw + m, cap)]`` covers ``y`` exactly when
``E <= m`` (``y`` lies in ``[0, cap]``), so clipping never changes a coverage event. The one exception: a negative
margin that empties the interval (its ends cross, or its floor passes the cap) is served as a single point
(:func:`lenpred.intervals.widened_interval` never returns ``low > high``), which may still equal ``y``; the ACI
step and :meth:`AdaptiveInterval.update`'s answer follow the score (``E <= m``: not covered).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from lenpred.errors import LenpredError
from lenpred.intervals import widened_interval

METHODS = ("aci", "rolling")


# ---------------------------------------------------------------------------------------------- pure functions


def conformity_score(low_raw: float, high_raw: float, y: float) -> float:
    """CQR score ``max(low_raw - y, y - high_raw)`` in tokens (negative inside the raw interval)."""
    return max(low_raw - y, y - high_raw)


def conformal_quantile(sorted_scores: list[float] | np.ndarray, level: float) -> float:
    """Finite-sample conformal quantile: the ``k = ceil((n + 1) level)``-th smallest score (1-based).

    Args:
        sorted_scores: ``(n,)`` scores in non-decreasing order.
        level: target coverage of the margin; ``level <= 0`` gives ``-inf`` (an empty widening), a ``k > n`` gives
            ``+inf`` (too few scores for the level: unbounded, as in split conformal).
    """
    n = len(sorted_scores)
    if level <= 0:
        return -math.inf
    k = math.ceil((n + 1) * level - 1e-12)
    return math.inf if k > n else float(sorted_scores[k - 1])


def min_window(coverage: float) -> int:
    """The fewest scores whose conformal quantile at ``coverage`` is finite: the smallest ``n`` with
    ``ceil((n + 1) coverage) <= n`` (:func:`conformal_quantile`'s rule), i.e. ``n >= coverage / (1 - coverage)``
    (0.8 -> 4, 0.9 -> 9, 0.95 -> 19). A window of fewer scores serves ``(0, inf)`` forever."""
    n = max(1, math.floor(coverage / (1 - coverage)) - 1)
    while math.ceil((n + 1) * coverage - 1e-12) > n:
        n += 1
    return n


def aci_update(alpha_t: float, err_t: int | bool, alpha: float, gamma: float) -> float:
    """One ACI step (Gibbs & Candès 2021, eq. 2): ``alpha_t + gamma * (alpha - err_t)``."""
    return alpha_t + gamma * (alpha - float(err_t))


# ---------------------------------------------------------------------------------------------- state


@dataclass
class AdaptiveConfig:
    """Settings of :class:`AdaptiveInterval`.

    Attributes:
        coverage: nominal share of requests inside the interval (``1 - alpha``).
        method: ``"aci"`` or ``"rolling"`` (module docstring).
        window: finished requests whose scores set the margin (per group); older ones are forgotten. At least
            :func:`min_window` of ``coverage`` (fewer can never give a finite margin) and at least ``min_scores``.
        gamma: ACI step size (0.005 in Gibbs & Candès' experiments; larger adapts faster and oscillates more).
        initial_margin: tokens, used until ``min_scores`` requests have finished; ``None``: the predictor's offline
            margin where :class:`lenpred.online.learning.OnlineLearning` builds the interval, 0 elsewhere. An
            explicit 0 is kept.
        min_scores: scores needed before the window's quantile replaces ``initial_margin``.
        min_group_size: a group's own state is used once it holds this many scores (Mondrian); below, the pooled one.
    """

    coverage: float = 0.8
    method: str = "aci"
    window: int = 500
    gamma: float = 0.005
    initial_margin: float | None = None
    min_scores: int = 20
    min_group_size: int = 50

    def __post_init__(self):
        if not 0 < self.coverage < 1:
            raise LenpredError(f"adaptive interval coverage must lie in (0, 1), got {self.coverage}")
        if self.method not in METHODS:
            raise LenpredError(f"unknown adaptive interval method '{self.method}'; valid: {', '.join(METHODS)}")
        if self.window < 1 or self.gamma < 0 or self.min_scores < 1 or self.min_group_size < 1:
            raise LenpredError("adaptive interval window, min_scores and min_group_size must be >= 1 and gamma >= 0")
        if self.window < (smallest := min_window(self.coverage)):
            raise LenpredError(f"adaptive interval window {self.window} cannot reach coverage {self.coverage} (its "
                               f"conformal quantile needs ceil((n + 1) * coverage) <= n scores, so it would serve "
                               f"(0, inf) forever): pass window >= {smallest}")
        if self.min_scores > self.window:
            raise LenpredError(f"adaptive interval min_scores {self.min_scores} exceeds window {self.window} (the "
                               f"window never holds that many, so initial_margin would serve forever): pass "
                               f"min_scores <= window")


class _Calibration:
    """One window of scores (a sorted copy for O(log n) quantiles) and one ACI level."""

    def __init__(self, window: int, alpha: float):
        self.scores: deque[float] = deque()
        self.sorted: list[float] = []
        self.window, self.alpha_t = window, alpha

    def push(self, score: float) -> None:
        self.scores.append(score)
        bisect.insort(self.sorted, score)
        if len(self.scores) > self.window:
            old = self.scores.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]


class AdaptiveInterval:
    """Online margin for the predictor's interval, pooled or per group (see the module docstring).

    The serving path calls :meth:`interval` when a request's prediction is made and :meth:`update` when it
    finishes; both take the head's raw quantiles (``LengthPrediction.low_raw`` / ``high_raw``, from
    :meth:`lenpred.prediction.HeadOutput.quantiles`; the traffic log stores them as ``low_raw`` / ``high_raw``). Not
    thread-safe: call it from one thread (the event loop or the scheduler), as the scheduler does.
    """

    def __init__(self, config: AdaptiveConfig | None = None):
        self.config = config or AdaptiveConfig()
        self.alpha = 1 - self.config.coverage
        self.initial_margin = 0.0 if self.config.initial_margin is None else self.config.initial_margin
        self.pooled = _Calibration(self.config.window, self.alpha)
        self.groups: dict[str, _Calibration] = {}

    def _state(self, group: str | None) -> _Calibration:
        g = self.groups.get(group) if group is not None else None
        return g if g is not None and len(g.scores) >= self.config.min_group_size else self.pooled

    def margin(self, group: str | None = None) -> float:
        """The current margin in tokens for ``group`` (``+inf``: unbounded, ``-inf``: ACI asks for an empty set)."""
        s = self._state(group)
        if len(s.scores) < self.config.min_scores:
            return self.initial_margin
        level = (1 - s.alpha_t) if self.config.method == "aci" else self.config.coverage
        return conformal_quantile(s.sorted, level)

    def interval(self, low_raw: float, high_raw: float, group: str | None = None,
                 cap: float | None = None) -> tuple[float, float]:
        """The adapted ``(low, high)`` in tokens for a new request (:func:`lenpred.intervals.widened_interval` with :meth:`margin`)."""
        return widened_interval(low_raw, high_raw, self.margin(group), cap)

    def update(self, low_raw: float, high_raw: float, num_output_tokens: float, group: str | None = None) -> bool:
        """Record a finished request: its score joins the pooled window and its group's; ACI levels step.

        ``err_t`` is judged against the interval each state would have served (the margin before this update).
        Returns whether the interval the request was served (same rule as :meth:`interval`) covered it.
        """
        y = float(num_output_tokens)
        score = conformity_score(low_raw, high_raw, y)
        served = self.margin(group)
        states = [self.pooled]
        if group is not None:
            states.append(self.groups.setdefault(group, _Calibration(self.config.window, self.alpha)))
        for s in states:
            if self.config.method == "aci":
                own = (self.initial_margin if len(s.scores) < self.config.min_scores
                       else conformal_quantile(s.sorted, 1 - s.alpha_t))
                s.alpha_t = aci_update(s.alpha_t, score > own, self.alpha, self.config.gamma)
            s.push(score)
        return score <= served


def replay_intervals(low_raw: np.ndarray, high_raw: np.ndarray, y: np.ndarray, caps: np.ndarray | None = None,
                     groups: np.ndarray | None = None, config: AdaptiveConfig | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Serve a stream in order: each request gets the current interval, then its outcome updates the state.

    Args:
        low_raw, high_raw, y: ``(n,)`` tokens, in arrival (= finish, for a replay) order.
        caps: ``(n,)`` each request's ``max_new_tokens`` (NaN or ``None``: uncapped).
        groups: ``(n,)`` group keys, or ``None`` (pooled only).

    Returns:
        ``(low, high)``, each ``(n,)`` float64: the interval each request was served.
    """
    state = AdaptiveInterval(config)
    n = len(y)
    low, high = np.empty(n), np.empty(n)
    for t in range(n):
        g = None if groups is None else groups[t]
        cap = None if caps is None or np.isnan(caps[t]) else float(caps[t])
        low[t], high[t] = state.interval(float(low_raw[t]), float(high_raw[t]), g, cap)
        state.update(float(low_raw[t]), float(high_raw[t]), float(y[t]), g)
    return low, high
