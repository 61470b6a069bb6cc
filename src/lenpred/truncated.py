"""The truncated prefill for predictors that read only hidden states (``last``, ``mean``, ``max`` pooling at one
layer, like the shipped ``last@15``): the forward pass stops after the decoder layer that produces the state the
predictor reads. No later layers, no LM head, no token entropy, no attention weights, and one layer's states kept.

Hidden-state index ``l`` means what transformers' ``output_hidden_states[l]`` means: ``0`` the embeddings, ``1..L−1``
the output of decoder layer ``l − 1`` (the residual stream), ``L`` the final-norm output of the last layer. The
truncated pass captures decoder layer ``l − 1``'s output with a forward hook and stops the forward there (the hook
raises; nothing after it runs), applying the final norm for ``l = L``. ``l = 0`` is not supported (some models scale
their embeddings inside the forward): :func:`truncated_plan` returns ``None`` and the full path runs.

Cost on SmolLM2-135M (30 layers) for ``last@15``: layers 0–14 of 30 and no 49k-vocabulary head, against the full
path's 30 layers and the head over every prompt position (for the entropy): measured by ``scripts/proxy_latency.py``.
The predictions equal :meth:`lenpred.LengthPredictor.predict`'s (tested on the tiny model and, marked ``slow``, on
the shipped predictor).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HIDDEN_ONLY_POOLERS = ("last", "mean", "max")
"""Poolers that read hidden states only (no entropy, no semantic score)."""


@dataclass(frozen=True)
class TruncatedPlan:
    """What the truncated pass computes for one predictor.

    Attributes:
        layer: hidden-state index the predictor reads (``1..L``).
        num_layers: the model's decoder layers ``L`` (the pass runs ``layer`` of them, or ``L`` plus the norm).
    """

    layer: int
    num_layers: int


class _Stop(Exception):
    """Raised by the capture hook to end the forward pass after the layer that is needed."""


def truncated_plan(predictor) -> TruncatedPlan | None:
    """The plan for a loaded :class:`lenpred.LengthPredictor`, or ``None`` when its predictor reads more than one
    positive layer's hidden states (entropy- or attention-weighted poolers, TRAIL, text proxies, the embeddings)."""
    from lenpred.predictors.pooled import PooledHeadPredictor

    inner = getattr(predictor, "predictor_", None)
    if not isinstance(inner, PooledHeadPredictor) or inner.pooler_name not in HIDDEN_ONLY_POOLERS:
        return None
    if predictor.config_.get("semantic") or len(predictor.config_.get("layers", [])) != 1:
        return None
    num_layers = predictor.backbone_.num_layers
    layer = int(predictor.config_["layers"][0])
    if not 1 <= layer <= num_layers or inner.layer not in (layer, layer - num_layers - 1):
        return None
    return TruncatedPlan(layer, num_layers)


@torch.inference_mode()
def truncated_hidden_states(backbone, batch_token_ids: list[list[int]], layer: int) -> list[torch.Tensor]:
    """Hidden states at index ``layer`` of each prompt, from a forward that stops there.

    Args:
        backbone: a :class:`lenpred.backbone.Backbone` whose model has ``get_decoder()`` with ``layers`` (and
            ``norm`` for ``layer = L``), as transformers' decoder-only LMs do.
        batch_token_ids: chat-formatted prompts (token ids), any lengths; left-padded together as
            :func:`lenpred.signals.extract_signals` pads them (so the states match its, per prompt).
        layer: hidden-state index ``1..L``.

    Returns:
        One ``(n_i, d)`` float32 tensor per prompt (its own tokens, no padding), in input order.

    Raises:
        LenpredError: ``layer`` outside ``1..L``, or a prompt that does not fit the context window.
    """
    from lenpred.errors import LenpredError
    from lenpred.prompts import check_fits
    from lenpred.signals import left_pad

    decoder, num_layers = backbone.model.get_decoder(), backbone.num_layers
    if not 1 <= layer <= num_layers:
        raise LenpredError(f"the truncated pass reads hidden-state index 1..{num_layers}, got {layer}")
    for ids in batch_token_ids:
        check_fits(len(ids), 0, backbone.context_window)
    input_ids, mask = left_pad(batch_token_ids, backbone.tokenizer.pad_token_id)
    captured: dict[str, torch.Tensor] = {}

    def capture(module, args, output):
        captured["h"] = output[0] if isinstance(output, tuple) else output
        raise _Stop

    handle = decoder.layers[layer - 1].register_forward_hook(capture)
    try:
        decoder(input_ids=input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    hidden = captured["h"]  # (B, n, d)
    if layer == num_layers:
        hidden = decoder.norm(hidden)
    hidden = hidden.float()
    n = hidden.shape[1]
    return [hidden[b, n - len(ids):] for b, ids in enumerate(batch_token_ids)]


def attach_truncated_signals(backbone, requests: list, plan: TruncatedPlan, batch_tokens: int = 4096) -> None:
    """Set each request's ``signals`` to a :class:`lenpred.signals.PromptSignals` holding only ``plan.layer``'s
    states (``(1, n, d)``, views into the batch output) and zero entropies (the poolers of
    :data:`HIDDEN_ONLY_POOLERS` ignore them), prompts grouped by length into batches of at most ``batch_tokens``
    padded tokens."""
    from lenpred.features import _batches
    from lenpred.signals import PromptSignals

    for batch in _batches([r.num_prompt_tokens for r in requests], batch_tokens):
        states = truncated_hidden_states(backbone, [requests[i].token_ids for i in batch], plan.layer)
        for i, h in zip(batch, states):
            requests[i].signals = PromptSignals(h[None], torch.zeros(h.shape[0]), None, (plan.layer,))
