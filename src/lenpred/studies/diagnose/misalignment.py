"""Where entropy and the semantic score disagree (ESTP's motivating measurement), and how EGTP and ESTP weigh tokens.

Ren et al. (2026), "When Entropy Is Not Enough", argue that entropy measures uncertainty, not importance: more than
20 % of the tokens in a prompt's top 40 % by entropy fall in the bottom half by semantic score, and a similar share
the other way round. :func:`misalignment_shares` measures both on one prompt; under independence of the two rankings
each share is about one half (``floor(m / 2) / m``), so the number is only informative next to that chance level.

Pure functions over one prompt's span (``token_entropy`` ``(m,)`` nats, ``semantic_score`` ``(m,)``, see
:meth:`lenpred.signals.PromptSignals.span`) plus aggregation helpers; no prompt text is stored, only decoded token
strings in aggregate counts.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch

from lenpred.errors import LenpredError


def top_fraction(values: torch.Tensor, fraction: float) -> torch.Tensor:
    """Boolean mask ``(m,)`` of the ``ceil(fraction * m)`` largest values (ties broken towards the earlier token).

    Raises:
        LenpredError: ``fraction`` not in ``(0, 1]`` or an empty input.
    """
    if not 0 < fraction <= 1 or values.numel() == 0:
        raise LenpredError(f"top_fraction needs a non-empty input and 0 < fraction <= 1, got {values.numel()} "
                           f"values and {fraction}")
    m = values.numel()
    k = math.ceil(fraction * m - 1e-9)
    order = torch.from_numpy(np.argsort(-values.double().numpy(), kind="stable"))  # descending, stable
    mask = torch.zeros(m, dtype=torch.bool)
    mask[order[:k]] = True
    return mask


def bottom_half(values: torch.Tensor) -> torch.Tensor:
    """Boolean mask ``(m,)`` of the ``floor(m / 2)`` smallest values (ties broken towards the later token)."""
    m = values.numel()
    return ~top_fraction(values, (m - m // 2) / m) if m > 1 else torch.zeros(m, dtype=torch.bool)


def misalignment_shares(token_entropy: torch.Tensor, semantic_score: torch.Tensor, top: float = 0.4) -> dict:
    """ESTP's misalignment of one prompt's span.

    Returns:
        ``high_entropy_low_semantic``: share of the top-``top`` tokens by entropy that lie in the bottom half by
        semantic score; ``high_semantic_low_entropy``: share of the top-``top`` tokens by semantic score that lie in
        the bottom half by entropy; ``chance``: ``floor(m / 2) / m``, the expected share if the two rankings were
        independent (a random subset lands in the bottom half at that rate). All in ``[0, 1]``.

    Raises:
        LenpredError: shapes differ or fewer than 2 tokens.
    """
    if token_entropy.shape != semantic_score.shape or token_entropy.ndim != 1 or token_entropy.numel() < 2:
        raise LenpredError(f"misalignment needs two (m,) vectors with m >= 2, got {tuple(token_entropy.shape)} and "
                           f"{tuple(semantic_score.shape)}")
    m = token_entropy.numel()
    top_h, top_s = top_fraction(token_entropy, top), top_fraction(semantic_score, top)
    low_h, low_s = bottom_half(token_entropy), bottom_half(semantic_score)
    return {"high_entropy_low_semantic": float((top_h & low_s).sum() / top_h.sum()),
            "high_semantic_low_entropy": float((top_s & low_h).sum() / top_s.sum()),
            "chance": (m // 2) / m}


def within_prompt_percentile(values: torch.Tensor) -> np.ndarray:
    """Rank percentile of each token within its prompt, ``(m,)`` float64 in ``[0, 1]`` (average ranks for ties;
    a single token maps to 0.5)."""
    from scipy.stats import rankdata

    m = values.numel()
    return np.full(m, 0.5) if m < 2 else (rankdata(values.double().numpy()) - 1) / (m - 1)


def top_token_share(values: torch.Tensor) -> float:
    """``max_i v_i / sum_i v_i`` of non-negative values ``(m,)``: how much of the span's mass one token holds."""
    total = float(values.sum())
    return float(values.max()) / total if total > 0 else float("nan")


class TokenWeightTally:
    """Aggregate, by decoded token string, how much pooling weight two poolers give (no prompt text kept).

    ``add(strings, w_a, w_b)`` adds one prompt: ``strings`` its ``m`` decoded tokens, ``w_a`` / ``w_b`` ``(m,)``
    pooling weights (each sums to 1). :meth:`table` returns the strings whose weight under ``a`` most exceeds
    (``over``) and most falls short of (``under``) their weight under ``b``, as the mean over prompts of the weight
    difference they account for (``mass_per_prompt``, in weight units: 0.01 = one percent of a prompt's pooling
    weight on average), with their occurrence count.
    """

    def __init__(self):
        self.diff = defaultdict(float)
        self.count = defaultdict(int)
        self.num_prompts = 0

    def add(self, strings: list[str], w_a: torch.Tensor, w_b: torch.Tensor) -> None:
        if len(strings) != w_a.numel() or w_a.shape != w_b.shape:
            raise LenpredError(f"token strings ({len(strings)}) and weights ({tuple(w_a.shape)}, "
                               f"{tuple(w_b.shape)}) differ in length")
        for s, d in zip(strings, (w_a - w_b).tolist()):
            self.diff[s] += d
            self.count[s] += 1
        self.num_prompts += 1

    def table(self, top: int = 15, min_count: int = 20) -> dict[str, list[dict]]:
        rows = [{"token": s, "mass_per_prompt": self.diff[s] / max(self.num_prompts, 1), "count": self.count[s]}
                for s in self.diff if self.count[s] >= min_count]
        rows.sort(key=lambda r: r["mass_per_prompt"])
        return {"over": rows[::-1][:top], "under": rows[:top]}
