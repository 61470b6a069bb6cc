"""Pooled-representation predictors: a pooler over one layer's token hidden states + the soft-label head.

``egtp`` and ``estp`` are the two papers' methods; ``mean``, ``last``, ``max``, ``entropy_only`` and
``semantic_only`` are the same head over other poolers (ablations / baselines).
"""

from __future__ import annotations

import numpy as np
import torch

from lenpred.errors import LenpredError
from lenpred.heads import HeadConfig, SoftLabelRegressor, head_from_tensors, head_tensors
from lenpred.pooling import POOLER_KINDS, POOLERS, Pooler
from lenpred.predictors.registry import Predictor, Reads, distinct_requests, max_new_tokens, register
from lenpred.signals import TokenSpan


def pool_features(spans: list[TokenSpan], pooler: Pooler, layer: int) -> np.ndarray:
    """Pooled features ``(n, d)`` float32: ``pooler`` applied to each span's ``layer`` hidden states."""
    return torch.stack([pooler(s.layer(layer), s.token_entropy, s.semantic_score) for s in spans]).numpy()


POOL_SPANS = ("content", "after_prefix", "all")


def request_spans(requests: list, pool_span: str = "after_prefix", semantic_divisor: str = "n") -> list[TokenSpan]:
    """What a pooler reads for each request: its signals over the users' content (``pool_span="content"``,
    ``Request.content_span``: the template's fixed text before and after it is skipped), over everything after the
    template's fixed prefix (``"after_prefix"``: the content and the template's suffix, whose hidden states — unlike
    the prefix's — depend on the content), or over the whole prompt (``"all"``), with the semantic score averaged
    over ``semantic_divisor`` queries.

    Raises:
        LenpredError: a request carries no signals, or an unknown ``pool_span``.
    """
    if pool_span not in POOL_SPANS:
        raise LenpredError(f"unknown pool_span '{pool_span}'; valid: {', '.join(POOL_SPANS)}")
    if any(r.signals is None for r in requests):
        raise LenpredError("this predictor needs prefill signals: extract them (lenpred.inputs.cache.extract_cached) "
                           "and set Request.signals")
    def bounds(r) -> tuple[int, int | None]:
        if pool_span == "all" or r.content_span is None:
            return 0, None
        return (r.content_span[0], r.content_span[1] if pool_span == "content" else None)

    return [r.signals.span(*bounds(r), semantic_divisor=semantic_divisor) for r in requests]


class PooledHeadPredictor(Predictor):
    """``pooler`` over hidden-state index ``layer``, then :class:`SoftLabelRegressor` (censoring-aware).

    Args:
        layer: hidden-state index (0 = embeddings, L = final-norm output of the last layer; negative from the end).
        lambda1, lambda2, alpha: ESTP weights and temperature (ignored by poolers that do not use them).
        seed: head initialisation / batch order.
        pool_span: ``"after_prefix"`` (default: the users' content and the template's suffix), ``"content"`` (the
            users' content only) or ``"all"`` (the whole prompt); see :func:`request_spans`.
        semantic_divisor: ``"n"`` (ESTP paper, default) or ``"causal"`` (``n - j``): see
            :func:`lenpred.signals.semantic_score`.
        head: :class:`HeadConfig` fields as a dict (JSON-able so ``save``/``load`` round-trip).
    """

    pooler_name = "mean"
    supports_censoring = True
    gives_distribution = True  # its head gives a length distribution (ltr: a ranking score; reads().features)
    searches_weights = False  # lambda1 x alpha on top of the layer grid (PoolerKind.searches_weights: ESTP)

    @classmethod
    def param_grid(cls, ctx) -> list[dict]:
        """Every pooled head searches the same layer grid (``ctx.layers``); ESTP also ``lambda1`` x ``alpha``.

        Simplest first (the tuner keeps the first candidate within one standard error of the best,
        :func:`lenpred.tuning.one_se_choice`): the shallowest layer (the cheapest forward: a truncated prefill stops
        there), then the smallest semantic weight ``lambda1``, then the largest temperature ``alpha`` (the flattest
        weights, nearest mean pooling)."""
        lambdas, alphas = (ctx.lambda1_grid, ctx.alpha_grid) if cls.searches_weights else ((1.0,), (1.0,))
        return [{"layer": l, "lambda1": a, "alpha": b, **ctx.pooled_settings}
                for l in sorted(ctx.layers) for a in sorted(lambdas) for b in sorted(alphas, reverse=True)]

    def __init__(self, layer: int = -1, lambda1: float = 1.0, lambda2: float = 1.0, alpha: float = 1.0,
                 seed: int = 0, pool_span: str = "after_prefix", semantic_divisor: str = "n", head: dict | None = None):
        super().__init__(layer=layer, lambda1=lambda1, lambda2=lambda2, alpha=alpha, seed=seed,
                         pool_span=pool_span, semantic_divisor=semantic_divisor, head=head or {})
        self.pooler = Pooler(self.pooler_name, lambda1, lambda2, alpha)
        self.layer = layer

    def reads(self) -> Reads:
        """Hidden states at ``layer``, plus entropy and attention where the pooler weighs by them; ``last`` pooling
        over a span that ends at the prompt's end reads the last prompt token's state alone."""
        kind = POOLER_KINDS[self.pooler_name]
        return Reads(self.layer, kind.reads_entropy, kind.needs_semantic_score,
                     last_token=self.pooler_name == "last" and self.params["pool_span"] != "content",
                     features=self.gives_distribution)

    @property
    def n_features_in_(self) -> int:
        """The pooled features' width ``d`` (the serving model's hidden size), read off the fitted head.

        Raises:
            AttributeError: not fitted (``hasattr`` answers ``False``, as scikit-learn's fitted attributes)."""
        return self.head_.n_features_in_

    def spans(self, requests: list) -> list[TokenSpan]:
        """The span each request is pooled over (see :func:`request_spans`)."""
        return request_spans(requests, self.params["pool_span"], self.params["semantic_divisor"])

    def features(self, requests: list) -> np.ndarray:
        """Pooled features ``(n, d)`` float32 of the requests' signals (what the head sees), pooled once per
        distinct request object."""
        unique, owner = distinct_requests(requests)
        spans = self.spans(unique)
        layer = self.layer if self.layer >= 0 else spans[0].layers[-1] + 1 + self.layer
        return pool_features(spans, self.pooler, layer)[owner]

    def pooling_weights(self, requests: list) -> list[torch.Tensor] | None:
        """Each request's ``pooling_weights`` ``(m,)`` over its span, or ``None`` for a non-weighted pooler."""
        spans = self.spans(requests)
        weights = [self.pooler.weights(s.token_entropy, s.semantic_score) for s in spans]
        return None if weights and weights[0] is None else weights

    def diagnostics(self, requests: list) -> dict:
        """``top_token_weight``: median over the distinct requests of the largest pooling weight (1.0 = the pooler
        looks at one token); ``top_token_is_last``: share of requests whose heaviest token is the span's last."""
        unique, _ = distinct_requests(requests)
        weights = self.pooling_weights(unique)
        if weights is None:
            return {}
        top = np.array([float(w.max()) for w in weights])
        last = np.array([int(torch.argmax(w)) == len(w) - 1 for w in weights])
        return {"top_token_weight": float(np.median(top)), "top_token_weight_p90": float(np.quantile(top, 0.9)),
                "top_token_is_last": float(last.mean())}

    def fit(self, requests, y, censored=None):
        self.head_ = SoftLabelRegressor(HeadConfig(**self.params["head"]), self.params["seed"])
        _, groups = distinct_requests(requests)  # samples of one prompt share a Request: one weighted row
        self.head_.fit(self.features(requests), y, groups, censored, max_new_tokens(requests))
        return self

    def predict(self, requests):
        return self.head_.predict(self.features(requests), max_new_tokens(requests))

    def predict_distribution(self, requests) -> tuple[np.ndarray, np.ndarray]:
        """``(probs, values)``, both ``(n, K)`` float64: each request's bin probabilities and the length each bin
        stands for, ``min(c_j, max_new_tokens)`` in tokens (non-decreasing along K)."""
        return self.distribution_from_features(self.features(requests), max_new_tokens(requests))

    def distribution_from_features(self, features: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`predict_distribution` from already pooled ``features`` ``(n, d)`` and caps ``(n,)``."""
        return self.head_.distribution(np.asarray(features, np.float32), np.asarray(caps, np.float64))

    def _get_state(self):
        return head_tensors(self.head_)

    def _set_state(self, tensors, info):
        self.head_ = head_from_tensors(tensors, info)


for _name in POOLERS:
    register(_name)(type(f"{_name.title().replace('_', '')}Predictor", (PooledHeadPredictor,),
                         {"pooler_name": _name, "searches_weights": POOLER_KINDS[_name].searches_weights,
                          "__doc__": f"Soft-label head over '{_name}'-pooled hidden states."}))
