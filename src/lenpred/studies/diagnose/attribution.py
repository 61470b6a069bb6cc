"""Attribution check (EGTP's grounding of entropy weighting): does a token's entropy, or its semantic score, track
how much the trained predictor's output depends on it?

EGTP (Xie et al., ICLR 2026) report Pearson r = 0.451 between token entropy and gradient-attribution importance.
Here the importance of token ``i`` is ``G_i = ||d y_hat / d e_i||_2``: the gradient of a trained length predictor's
output ``y_hat`` (tokens) with respect to token ``i``'s **input embedding** ``e_i``, back-propagated through the
backbone up to the head's layer. We use the **mean-pooling** head (:class:`lenpred.predictors.pooled`): its pooling
weights are uniform, so ``G`` is not the pooling weights themselves; for EGTP / ESTP heads the gradient at the pooled
layer is ``w_i * dy/dz``, so correlating it with ``H`` or ``S`` would be correlating the weights with their own
inputs.
"""

from __future__ import annotations

import numpy as np
import torch

from lenpred.errors import LenpredError
from lenpred.predictors import max_new_tokens
from lenpred.predictors.pooled import PooledHeadPredictor


def correlations(x: np.ndarray, y: np.ndarray) -> dict:
    """Pearson and Spearman correlation of two ``(N,)`` samples (``scipy.stats``); ``None`` when either is constant
    or ``N < 3``.

    Raises:
        LenpredError: lengths differ.
    """
    from scipy.stats import pearsonr, spearmanr

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape:
        raise LenpredError(f"correlation needs two samples of one length, got {x.shape} and {y.shape}")
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"pearson": None, "spearman": None, "n": int(len(x))}
    return {"pearson": float(pearsonr(x, y).statistic), "spearman": float(spearmanr(x, y).statistic),
            "n": int(len(x))}


def gradient_attribution(backbone, predictor, request) -> torch.Tensor:
    """``||d y_hat / d e_i||_2`` for every token of ``request``'s pooled span: ``(m,)`` float32.

    Args:
        backbone: the :class:`lenpred.backbone.Backbone` whose signals the predictor was trained on.
        predictor: a fitted :class:`lenpred.predictors.pooled.PooledHeadPredictor` (mean pooling recommended, see the
            module docstring).
        request: a :class:`lenpred.predictors.Request` with ``token_ids`` and ``content_span``.

    Raises:
        LenpredError: the predictor is not a pooled head.
    """
    if not isinstance(predictor, PooledHeadPredictor):
        raise LenpredError(f"gradient attribution needs a pooled-head predictor, got {type(predictor).__name__}")
    model, head = backbone.model, predictor.head_
    layer = predictor.layer if predictor.layer >= 0 else backbone.num_layers + 1 + predictor.layer
    n = len(request.token_ids)
    start, end = pooled_span(request, predictor.params["pool_span"], n)
    ids = torch.tensor([request.token_ids])
    with torch.enable_grad():
        emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        out = model(inputs_embeds=emb, position_ids=torch.arange(n)[None], output_hidden_states=True,
                    use_cache=False, logits_to_keep=1)
        h = out.hidden_states[layer][0, start:end].float()  # (m, d)
        token_entropy = torch.zeros(end - start)  # unused by the mean pooler; others read the cached values
        S = request.signals.span(start, end, predictor.params["semantic_divisor"]).semantic_score \
            if predictor.pooler.needs_semantic_score else None
        if request.signals is not None:
            token_entropy = request.signals.span(start, end).token_entropy
        z = predictor.pooler(h, token_entropy, S)
        x = (z - torch.from_numpy(head.mean_)) / torch.from_numpy(head.std_)
        p = torch.softmax(head.module_(x[None]), dim=1)[0]
        cap = float(max_new_tokens([request])[0])
        y_hat = (p * torch.clamp(torch.from_numpy(head.centres_).float(), max=cap)).sum()
        (grad,) = torch.autograd.grad(y_hat, emb)
    return grad[0, start:end].norm(dim=-1).detach()


def pooled_span(request, pool_span: str, n: int) -> tuple[int, int]:
    """``[start, end)`` of the pooled span, as :func:`lenpred.predictors.pooled.request_spans` and
    :meth:`lenpred.signals.PromptSignals.span` compute it."""
    if pool_span == "all" or request.content_span is None:
        start, end = 0, n
    else:
        start, end = request.content_span[0], request.content_span[1] if pool_span == "content" else n
    start, end = max(start, 0), min(end, n)
    return (n - 1, n) if start >= end else (start, end)
