"""Progressive remaining-length predictors: PLP and TRAIL's refreshed classifier with Bayesian smoothing.

Both predict the *remaining* length ``R_t = T - t`` of a request that has generated ``t`` tokens and is still
running (``t < T``), from the hidden state of its current token at decode step ``t``
(:mod:`lenpred.inputs.decode_states`).

* **PLP** (progressive length prediction; Xie et al., *Predicting LLM Output Length via Entropy-Guided
  Representations*, ICLR 2026): the soft-label distribution head (:class:`lenpred.heads.SoftLabelRegressor`) on
  ``[prompt representation, one layer's state of the current token, log(1 + t)]``. The paper concatenates the
  prompt's pooled representation with the decode-time (final-layer) states; a fixed-size input keeps the current
  token's state only, plus the step count a serving loop knows. The layer (final or intermediate) and the prompt
  representation are chosen on validation (``lenpred progressive``). Bins over the training split's remaining lengths; every
  rollout weighs the same in the loss (each of its ``m`` steps weighs ``1 / m``); a capped rollout is censored at
  every step (``R_t >= cap - t``).
* **TRAIL progressive** (Shahout et al., *Don't Stop Me Now: Embedding Based Scheduling for LLMs*, ICLR 2025): an
  MLP classifier (hard labels) over ``K`` equal-width remaining-length bins on one intermediate layer's state of
  the current token, re-run every 8 tokens; between refreshes the belief counts down. Its bin distribution is
  smoothed over refreshes: the prior at a refresh is the previous posterior moved down the bins — in each token a
  request in bin ``j`` moves to bin ``j - 1`` with probability ``1 / width`` (:func:`transition_prior`) — and the
  posterior is ``∝ prior × current classifier estimate`` (:func:`bayes_update`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lenpred.errors import LenpredError
from lenpred.heads import HeadConfig, SoftLabelRegressor

PLP_HEAD = {"epochs": 30}  # ~10 rows per rollout: 30 epochs are about twice the static heads' gradient steps
TRAIL_PROGRESSIVE_HEAD = {"lam": 1.0, "tau": 1e-3, "num_bins": 10, "binning": "width", "epochs": 30}


def step_feature(steps: np.ndarray) -> np.ndarray:
    """``log(1 + t)`` as a ``(n, 1)`` float32 column (the decode step a serving loop knows)."""
    return np.log1p(np.asarray(steps, dtype=np.float32))[:, None]


def remaining_targets(lengths: np.ndarray, censored: np.ndarray, caps: np.ndarray, steps: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row ``(remaining, censored, remaining_cap)``: ``min(T, cap) - t``, whether the rollout hit its cap, and
    ``cap - t`` (``inf`` stays ``inf``), all ``(n,)``.

    Raises:
        LenpredError: a row with ``t >= T`` (the request had already finished)."""
    lengths, steps = np.asarray(lengths, np.float64), np.asarray(steps, np.float64)
    if (steps >= lengths).any():
        raise LenpredError("a progressive row needs t < T (the request is still running)")
    return lengths - steps, np.asarray(censored, bool), np.asarray(caps, np.float64) - steps


@dataclass
class ProgressiveRows:
    """Training / evaluation rows, one per (rollout, decode step) with ``t < T``.

    Attributes:
        sample: ``(n,)`` int64 index of the rollout (row of the evaluation data).
        step: ``(n,)`` int64 decode step ``t``.
        prompt_features: ``(n, d_p)`` float32, the prompt representation of the rollout's prompt.
        plp_state: ``(n, d)`` float32, the current token's state at PLP's layer.
        trail_states: ``{layer: (n, d)}`` float32, intermediate-layer states of the current token.
        length: ``(n,)`` observed length of the rollout (capped ones at their cap).
        censored: ``(n,)`` bool; cap: ``(n,)`` the rollout's ``max_new_tokens``.
    """

    sample: np.ndarray
    step: np.ndarray
    prompt_features: np.ndarray
    plp_state: np.ndarray
    trail_states: dict
    length: np.ndarray
    censored: np.ndarray
    cap: np.ndarray

    @property
    def observed_remaining(self) -> np.ndarray:
        """``(n,)`` the remaining length each row can be scored against: ``min(T, cap) - t`` (tokens)."""
        return np.minimum(self.length, self.cap) - self.step

    def rollout_weights(self) -> np.ndarray:
        """``1 / (rows of the row's rollout)``: every rollout weighs the same whatever its length."""
        _, inverse, counts = np.unique(self.sample, return_inverse=True, return_counts=True)
        return 1.0 / counts[inverse]


class PLPHead:
    """PLP: :class:`SoftLabelRegressor` on ``[prompt features, current-token state, log(1 + t)]`` -> remaining tokens."""

    def __init__(self, head: dict | None = None, seed: int = 0):
        self.config = HeadConfig(**{**PLP_HEAD, **(head or {})})
        self.seed = seed

    @staticmethod
    def inputs(prompt_features: np.ndarray, plp_state: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The head's input ``(n, d_p + d + 1)`` float32."""
        return np.concatenate([prompt_features, plp_state, step_feature(steps)], axis=1).astype(np.float32)

    def fit(self, rows: ProgressiveRows) -> "PLPHead":
        remaining, censored, rem_cap = remaining_targets(rows.length, rows.censored, rows.cap, rows.step)
        self.head_ = SoftLabelRegressor(self.config, self.seed).fit(
            self.inputs(rows.prompt_features, rows.plp_state, rows.step), remaining, None, censored, rem_cap,
            sample_weight=rows.rollout_weights())
        return self

    def predict(self, prompt_features: np.ndarray, plp_state: np.ndarray, steps: np.ndarray,
                caps: np.ndarray) -> np.ndarray:
        """Expected observed remaining length ``sum_j p_j min(c_j, cap - t)`` in tokens, ``(n,)`` float64."""
        x = self.inputs(prompt_features, plp_state, steps)
        return self.head_.predict(x, np.asarray(caps, np.float64) - np.asarray(steps, np.float64))


def transition_prior(posterior: np.ndarray, width: float, tokens: int) -> np.ndarray:
    """TRAIL's prior after ``tokens`` more tokens: each token moves a request from bin ``j`` to ``j - 1`` with
    probability ``1 / width`` (bin 0 keeps its mass: the request is still running). ``posterior`` ``(n, K)`` ->
    ``(n, K)`` float64, rows summing to 1.

    Source: Shahout et al. (TRAIL), Sec. 3: "a request moves to the next lower bin with probability 1/bin-size per
    generated token". Applied exactly, one token at a time (``tokens`` matrix-vector steps)."""
    p = np.asarray(posterior, np.float64).copy()
    move = 1.0 / width
    for _ in range(int(tokens)):
        down = p[:, 1:] * move
        p[:, 1:] -= down
        p[:, :-1] += down
    return p


def bayes_update(prior: np.ndarray, estimate: np.ndarray) -> np.ndarray:
    """Posterior ``∝ prior × estimate`` per row, ``(n, K)`` float64 (falls back to ``estimate`` where the product
    vanishes)."""
    post = np.asarray(prior, np.float64) * np.asarray(estimate, np.float64)
    total = post.sum(axis=1, keepdims=True)
    return np.where(total > 0, post / np.where(total > 0, total, 1.0), estimate)


class TrailProgressive:
    """TRAIL's progressive baseline: a hard-label MLP over equal-width remaining-length bins on layer ``layer``'s
    current-token state, refreshed at each step given, smoothed with :func:`transition_prior` and
    :func:`bayes_update`."""

    def __init__(self, layer: int, head: dict | None = None, seed: int = 0):
        self.layer = layer
        self.config = HeadConfig(**{**TRAIL_PROGRESSIVE_HEAD, **(head or {})})
        self.seed = seed

    def fit(self, rows: ProgressiveRows) -> "TrailProgressive":
        remaining, censored, rem_cap = remaining_targets(rows.length, rows.censored, rows.cap, rows.step)
        self.head_ = SoftLabelRegressor(self.config, self.seed).fit(
            rows.trail_states[self.layer], remaining, None, censored, rem_cap, sample_weight=rows.rollout_weights())
        finite = self.head_.edges_[np.isfinite(self.head_.edges_)]
        self.width_ = float(finite[1] - finite[0]) if len(finite) > 1 else float(finite[0])
        return self

    def predict_sequence(self, rows: ProgressiveRows) -> np.ndarray:
        """Smoothed expected remaining length at every row, ``(n,)`` float64: rows of one rollout are taken in step
        order, the first refresh's posterior is the classifier's estimate, each later one the posterior of the
        prior moved down by the tokens since the last refresh."""
        probs = self.head_.predict_proba(rows.trail_states[self.layer])
        out = np.empty(len(rows.step))
        centres = self.head_.centres_
        for s in np.unique(rows.sample):
            idx = np.flatnonzero(rows.sample == s)
            idx = idx[np.argsort(rows.step[idx])]
            post, last = None, 0
            for i in idx:
                est = probs[i:i + 1]
                post = est if post is None else bayes_update(transition_prior(post, self.width_, rows.step[i] - last), est)
                last = rows.step[i]
                out[i] = float((post[0] * np.minimum(centres, rows.cap[i] - rows.step[i])).sum())
        return out
