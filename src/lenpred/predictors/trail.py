"""TRAIL baseline: an MLP classifier over one intermediate layer's last-prompt-token hidden state.

Source: Shahout et al., "Don't Stop Me Now: Embedding Based Scheduling for LLMs" (TRAIL, ICLR 2025):
the serving model's own intermediate-layer embedding feeds a small MLP that classifies the output
length into bins; the expected value over bin centres is the prediction. (TRAIL's re-prediction every
few decode steps with Bayesian smoothing belongs to progressive prediction, not this prompt-only
baseline.) Here the MLP is the same two-layer head as EGTP's, trained with **hard** labels (one-hot
bins, pure cross-entropy: ``lam = 1``), K = 10 equal-mass bins (plus the caps and the largest length as edges,
like every head here, so it has no ceiling) and the same censored likelihood for capped samples; the layer is
chosen on validation from every hidden-state index (``PromptSignals.last_token_states`` holds them all).
"""

from __future__ import annotations

import numpy as np

from lenpred.errors import LenpredError
from lenpred.predictors.registry import Reads, register, unique_map
from lenpred.predictors.pooled import PooledHeadPredictor

TRAIL_HEAD = {"lam": 1.0, "tau": 1e-3, "num_bins": 10, "binning": "quantile"}  # tau -> 0: soft labels become one-hot


@register("trail")
class TrailPredictor(PooledHeadPredictor):
    """MLP over hidden-state index ``layer`` of the last prompt token (0 = embeddings, L = final norm)."""

    pooler_name = "last"

    @classmethod
    def param_grid(cls, ctx) -> list[dict]:
        """TRAIL's own layer sweep: ``ctx.trail_layers`` (default every index 1..L), shallowest (cheapest) first."""
        return [{"layer": l, "head": ctx.pooled_settings["head"]} for l in sorted(ctx.trail_layers)]

    def diagnostics(self, requests: list) -> dict:
        return {}

    def reads(self) -> Reads:
        """The last prompt token's state at ``layer``, nothing else."""
        return Reads(self.layer, last_token=True, features=True)

    def __init__(self, layer: int = -1, seed: int = 0, head: dict | None = None, **pooled):
        super().__init__(layer=layer, seed=seed, head={**TRAIL_HEAD, **(head or {})}, **pooled)

    def features(self, requests: list) -> np.ndarray:
        """``(n, d)`` float32: each request's last-token hidden state at index ``layer``
        (:meth:`lenpred.signals.PromptSignals.last_token_state`: the full or the truncated forward's signals).

        Raises:
            LenpredError: a request without signals, or whose signals do not hold ``layer``.
        """
        if any(r.signals is None for r in requests):
            raise LenpredError("TRAIL needs prefill signals: extract them (lenpred.inputs.cache.extract_cached) "
                               "and set Request.signals")
        return np.stack(unique_map(requests, lambda r: r.signals.last_token_state(self.layer).numpy()))
