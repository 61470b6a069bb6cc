"""Token poolers: turn one prompt's per-token hidden states into one feature vector.

Every pooler is a pure function ``(hidden_states, token_entropy, semantic_score) -> z`` with
``hidden_states`` of shape ``(n, d)`` (float32), ``token_entropy`` and ``semantic_score`` of shape
``(n,)`` and ``z`` of shape ``(d,)``. Weighted poolers compute ``z = sum_i w_i h_i`` from
``pooling_weights`` ``w`` of shape ``(n,)`` that sum to 1.

Sources: EGTP — Xie et al., "Predicting LLM Output Length via Entropy-Guided Representations"
(ICLR 2026): ``w = softmax(H)``. ESTP — Ren et al., "When Entropy Is Not Enough" (2026):
``T = lambda1 * S~ + lambda2 * H~``, ``w = softmax(T / alpha)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from lenpred.errors import LenpredError


def zscore(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Per-prompt standard score ``(x - mean) / (std + eps)`` (population std); ``(n,)`` -> ``(n,)``.

    ESTP's common scale for the semantic score and the entropy (the paper leaves the scale open;
    we z-score within each prompt so lambda1 and lambda2 weigh comparable units). A prompt of one
    token maps to 0.
    """
    if x.numel() < 2:
        return torch.zeros_like(x)
    return (x - x.mean()) / (x.std(unbiased=False) + eps)


def egtp_weights(token_entropy: torch.Tensor) -> torch.Tensor:
    """EGTP pooling weights ``w_i = softmax_i(H_i)`` with ``H_i`` in nats; ``(n,)`` -> ``(n,)``."""
    return torch.softmax(token_entropy, dim=0)


def estp_weights(token_entropy: torch.Tensor, semantic_score: torch.Tensor, lambda1: float = 1.0,
                 lambda2: float = 1.0, alpha: float = 1.0) -> torch.Tensor:
    """ESTP pooling weights ``e_i = softmax_i((lambda1 * zscore(S)_i + lambda2 * zscore(H)_i) / alpha)``.

    Args:
        token_entropy: ``(n,)`` next-token entropy in nats.
        semantic_score: ``(n,)`` attention received (see :func:`lenpred.signals.semantic_score`).
        lambda1: weight of the semantic term; lambda2: weight of the entropy term.
        alpha: softmax temperature (> 0); large alpha tends to mean pooling.

    Raises:
        LenpredError: ``alpha <= 0``.
    """
    if alpha <= 0:
        raise LenpredError(f"ESTP temperature alpha must be > 0, got {alpha}")
    t = lambda1 * zscore(semantic_score) + lambda2 * zscore(token_entropy)
    return torch.softmax(t / alpha, dim=0)


def weighted_pool(hidden_states: torch.Tensor, pooling_weights: torch.Tensor) -> torch.Tensor:
    """``z = sum_i w_i h_i``: ``(n, d)`` and ``(n,)`` -> ``(d,)``."""
    return pooling_weights.to(hidden_states.dtype) @ hidden_states


@dataclass(frozen=True)
class PoolerKind:
    """What one named pooler computes and which signals it reads (one entry of :data:`POOLER_KINDS`).

    Attributes:
        weights: ``fn(pooler, token_entropy (n,), semantic_score (n,) | None) -> pooling_weights (n,)`` summing to
            1, or ``None`` for a pooler that is not a weighted sum (max).
        pool: ``fn(pooler, hidden_states (n, d), token_entropy, semantic_score) -> (d,)``; ``None``: the weighted
            sum of ``weights`` (:func:`weighted_pool`).
        reads_entropy: the features depend on ``token_entropy``.
        needs_semantic_score: the features depend on ``semantic_score`` (attention, which costs an eager last
            layer).
        searches_weights: tuning searches ``lambda1`` x ``alpha`` on top of the layer grid (ESTP's extra search).
    """

    weights: Callable[..., torch.Tensor] | None
    pool: Callable[..., torch.Tensor] | None = None
    reads_entropy: bool = True
    needs_semantic_score: bool = False
    searches_weights: bool = False


POOLER_KINDS: dict[str, PoolerKind] = {
    "egtp": PoolerKind(lambda p, H, S: egtp_weights(H)),
    "estp": PoolerKind(lambda p, H, S: estp_weights(H, S, p.lambda1, p.lambda2, p.alpha), needs_semantic_score=True,
                       searches_weights=True),
    "entropy_only": PoolerKind(lambda p, H, S: estp_weights(H, H if S is None else S, 0.0, 1.0, p.alpha)),
    "semantic_only": PoolerKind(lambda p, H, S: estp_weights(H, S, 1.0, 0.0, p.alpha), needs_semantic_score=True),
    "mean": PoolerKind(lambda p, H, S: torch.full_like(H, 1.0 / H.numel()), lambda p, h, H, S: h.mean(dim=0),
                       reads_entropy=False),
    "last": PoolerKind(lambda p, H, S: torch.nn.functional.one_hot(torch.tensor(H.numel() - 1), H.numel()).to(H.dtype),
                       lambda p, h, H, S: h[-1], reads_entropy=False),
    "max": PoolerKind(None, lambda p, h, H, S: h.max(dim=0).values, reads_entropy=False),
}
"""Registry of poolers: name -> :class:`PoolerKind` (a new pooler is one entry). mean and last are computed directly
(exact, and cheaper than their weighted sum)."""

POOLING_WEIGHTS: dict[str, Callable[..., torch.Tensor]] = {
    name: kind.weights for name, kind in POOLER_KINDS.items() if kind.weights is not None}
"""Weighted poolers: name -> ``fn(pooler, token_entropy, semantic_score) -> pooling_weights (n,)`` summing to 1.

``entropy_only`` / ``semantic_only`` are the ESTP ablations (one term, z-scored, temperature alpha); ``egtp`` uses
raw entropies with temperature 1 as in the EGTP paper."""


@dataclass(frozen=True)
class Pooler:
    """A named pooler with its hyper-parameters (``lambda1``, ``lambda2``, ``alpha`` for ESTP).

    Call it on one prompt's signals: ``pooler(hidden_states, token_entropy, semantic_score) -> (d,)``.
    """

    name: str
    lambda1: float = 1.0
    lambda2: float = 1.0
    alpha: float = 1.0

    def __post_init__(self):
        if self.name not in POOLERS:
            raise LenpredError(f"unknown pooler '{self.name}'; valid poolers: {', '.join(POOLERS)}")

    @property
    def kind(self) -> PoolerKind:
        """What this pooler computes and reads (:data:`POOLER_KINDS`)."""
        return POOLER_KINDS[self.name]

    @property
    def needs_semantic_score(self) -> bool:
        """Whether the pooler reads attention (which costs an eager last layer)."""
        return self.kind.needs_semantic_score

    def _check(self, semantic_score):
        if self.needs_semantic_score and semantic_score is None:
            raise LenpredError(f"pooler '{self.name}' needs semantic_score: extract signals with attention")

    def weights(self, token_entropy: torch.Tensor, semantic_score: torch.Tensor | None = None) -> torch.Tensor | None:
        """``pooling_weights`` ``(n,)`` summing to 1, or ``None`` for a pooler that is not a weighted sum (max)."""
        self._check(semantic_score)
        fn = POOLING_WEIGHTS.get(self.name)
        return None if fn is None else fn(self, token_entropy, semantic_score)

    def __call__(self, hidden_states: torch.Tensor, token_entropy: torch.Tensor,
                 semantic_score: torch.Tensor | None = None) -> torch.Tensor:
        self._check(semantic_score)
        return POOLERS[self.name](self, hidden_states, token_entropy, semantic_score)


POOLERS: dict[str, Callable[..., torch.Tensor]] = {
    **{name: (lambda name: lambda p, h, H, S: weighted_pool(h, POOLING_WEIGHTS[name](p, H, S)))(name)
       for name, kind in POOLER_KINDS.items() if kind.pool is None},
    **{name: kind.pool for name, kind in POOLER_KINDS.items() if kind.pool is not None},
}
"""Registry of poolers: name -> ``fn(pooler, hidden_states, token_entropy, semantic_score) -> (d,)``; the weighted
ones are ``weighted_pool`` of :data:`POOLING_WEIGHTS` (mean and last are computed directly: exact, and cheaper)."""
