"""Pooled-representation predictors: a pooler over one layer's token hidden states + the soft-label head.

``egtp`` and ``estp`` are the two papers' methods; ``mean``, ``last``, ``max``, ``entropy_only`` and
``semantic_only`` are the same head over other poolers (ablations / baselines).
"""

from __future__ import annotations

import numpy as np
import torch

from lenpred.errors import LenpredError
from lenpred.heads import HeadConfig, SoftLabelRegressor
from lenpred.pooling import POOLERS, Pooler
from lenpred.predictors import Predictor, distinct_requests, register
from lenpred.signals import PromptSignals


def pool_features(signals: list[PromptSignals], pooler: Pooler, layer: int) -> np.ndarray:
    """Pooled features ``(n, d)`` float32: ``pooler`` applied to each prompt's ``layer`` hidden states."""
    return torch.stack([pooler(s.layer(layer), s.token_entropy, s.semantic_score) for s in signals]).numpy()


def request_signals(requests: list, skip_prefix_tokens: int = 0) -> list[PromptSignals]:
    """Each request's signals, without the first ``skip_prefix_tokens`` tokens.

    Raises:
        LenpredError: a request carries no signals.
    """
    if any(r.signals is None for r in requests):
        raise LenpredError("this predictor needs prefill signals: extract them (lenpred.features.extract_cached) "
                           "and set Request.signals")
    return [r.signals.drop_prefix(skip_prefix_tokens) if skip_prefix_tokens else r.signals for r in requests]


class PooledHeadPredictor(Predictor):
    """``pooler`` over hidden-state index ``layer``, then :class:`SoftLabelRegressor`.

    Args:
        layer: hidden-state index (0 = embeddings, L = final-norm output of the last layer).
        lambda1, lambda2, alpha: ESTP weights and temperature (ignored by poolers that do not use them).
        seed: head initialisation / batch order.
        skip_prefix_tokens: pool only over tokens from this index on (the prefix every chat prompt shares;
            see :func:`lenpred.backbone.shared_prefix_length`); 0 pools the whole prompt.
        head: :class:`HeadConfig` fields as a dict (JSON-able so ``save``/``load`` round-trip).
    """

    pooler_name = "mean"
    inputs = ("signals",)

    def __init__(self, layer: int = -1, lambda1: float = 1.0, lambda2: float = 1.0, alpha: float = 1.0,
                 seed: int = 0, skip_prefix_tokens: int = 0, head: dict | None = None):
        super().__init__(layer=layer, lambda1=lambda1, lambda2=lambda2, alpha=alpha, seed=seed,
                         skip_prefix_tokens=skip_prefix_tokens, head=head or {})
        self.pooler = Pooler(self.pooler_name, lambda1, lambda2, alpha)
        self.layer = layer

    def features(self, requests: list) -> np.ndarray:
        """Pooled features ``(n, d)`` float32 of the requests' signals (what the head sees), pooled once per
        distinct request object."""
        unique, owner = distinct_requests(requests)
        signals = request_signals(unique, self.params["skip_prefix_tokens"])
        layer = self.layer if self.layer >= 0 else signals[0].layers[-1] + 1 + self.layer
        return pool_features(signals, self.pooler, layer)[owner]

    def fit(self, requests, y):
        self.head_ = SoftLabelRegressor(HeadConfig(**self.params["head"]), self.params["seed"])
        _, groups = distinct_requests(requests)  # samples of one prompt share a Request: one weighted row
        self.head_.fit(self.features(requests), y, groups)
        return self

    def predict(self, requests):
        return self.head_.predict(self.features(requests))

    def _get_state(self):
        state = self.head_.state()
        tensors = {f"module.{k}": v for k, v in state.pop("module").items()}
        for key in ("edges", "centres", "mean", "std"):
            tensors[key] = torch.from_numpy(np.asarray(state.pop(key)))
        return tensors, state

    def _set_state(self, tensors, info):
        state = dict(info)
        state["module"] = {k[len("module."):]: v for k, v in tensors.items() if k.startswith("module.")}
        for key in ("edges", "centres", "mean", "std"):
            state[key] = tensors[key].numpy()
        self.head_ = SoftLabelRegressor.from_state(state)


for _name in POOLERS:
    register(_name)(type(f"{_name.title().replace('_', '')}Predictor", (PooledHeadPredictor,),
                         {"pooler_name": _name, "__doc__": f"Soft-label head over '{_name}'-pooled hidden states."}))
