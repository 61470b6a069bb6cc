"""Prefill signals of the serving model: hidden states, next-token entropy, semantic score.

One forward pass per batch gives, for every prompt token ``i``:

* ``hidden_states[l, i]`` at the requested layers (``l = 0`` is the embedding output, ``l = L`` the
  final-norm output, as in transformers' ``output_hidden_states``);
* ``token_entropy[i] = -sum_v p_i(v) log p_i(v)`` in nats, ``p_i = softmax(logits_i)``;
* ``last_token_states[l]``: the hidden state of the last prompt token at **every** index ``l = 0..L``
  (what TRAIL's layer sweep needs; ``(L + 1) x d`` per prompt, so cheap to keep);
* ``semantic_score[j]`` (ESTP): attention that token ``j`` receives in the **last** layer, averaged
  over heads and over the ``n - j`` query tokens that can attend to it under the causal mask
  (``i >= j``). We divide by ``n - j`` rather than ``n`` so early tokens are not favoured merely for
  having more possible attenders.

Cost control: attention weights exist only in eager attention; we register an attention function
(transformers' ``AttentionInterface``) that runs SDPA in every layer but the last and eager in the
last, so the extra cost is one layer's ``(B, heads, n, n)`` softmax. Logits are never materialised
for the whole batch: entropy is computed from the final hidden states in chunks through
``lm_head`` (a 262k-token vocabulary would need gigabytes otherwise).

Batching: prompts are left-padded; ``position_ids`` come from the attention mask, and padded keys
are masked, so a prompt's signals do not depend on its batch-mates (tested to 1e-4).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from lenpred.errors import LenpredError

_ATTN_NAME = "lenpred_last_layer_eager"


@dataclass
class PromptSignals:
    """Prefill signals of one prompt of ``n`` tokens.

    Attributes:
        hidden_states: ``(num_layers_requested, n, d)`` float32, in the order of ``layers``.
        token_entropy: ``(n,)`` float32, nats.
        semantic_score: ``(n,)`` float32, or ``None`` when attention was not requested.
        layers: the hidden-state indices held (0 = embeddings, L = last layer).
        last_token_states: ``(L + 1, d)`` float32, the last token's hidden state at every index, or ``None``.
    """

    hidden_states: torch.Tensor
    token_entropy: torch.Tensor
    semantic_score: torch.Tensor | None
    layers: tuple[int, ...]
    last_token_states: torch.Tensor | None = None

    def drop_prefix(self, num_tokens: int) -> "PromptSignals":
        """The signals of tokens ``num_tokens..n-1`` (views, no copy); at least the last token is kept."""
        k = min(num_tokens, len(self.token_entropy) - 1)
        return PromptSignals(self.hidden_states[:, k:], self.token_entropy[k:],
                             None if self.semantic_score is None else self.semantic_score[k:], self.layers,
                             self.last_token_states)

    def layer(self, index: int) -> torch.Tensor:
        """Hidden states ``(n, d)`` of hidden-state index ``index``.

        Raises:
            LenpredError: the layer was not extracted.
        """
        if index not in self.layers:
            raise LenpredError(f"layer {index} was not extracted (have {list(self.layers)}); re-extract with it")
        return self.hidden_states[self.layers.index(index)]


def token_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of ``softmax(logits)`` over the last axis: ``(..., V)`` -> ``(...)``.

    ``H = logsumexp(x) - sum_v softmax(x)_v x_v``, which is ``-sum p log p`` without forming ``log p``.
    """
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    return log_z - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def semantic_score_from_attention(attentions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """ESTP semantic score from one layer's attention of a left-padded batch.

    Args:
        attentions: ``(B, heads, n, n)`` attention probabilities (rows = queries).
        attention_mask: ``(B, n)`` 1 for real tokens, 0 for left padding.

    Returns:
        ``(B, n)``: ``S_j = (1 / (n - j)) * sum_{i >= j, i valid} mean_heads A_ij`` for real ``j``,
        0 at padded positions. Under left padding the valid queries that can attend to ``j`` are
        exactly ``i = j .. n-1``, so ``n - j`` counts them.
    """
    _, _, n, _ = attentions.shape
    q_valid = attention_mask.to(attentions.dtype)[:, :, None]  # (B, n, 1)
    received = (attentions.mean(dim=1) * q_valid).sum(dim=1)  # (B, n): column sums over valid queries
    num_attenders = torch.arange(n, 0, -1, dtype=attentions.dtype, device=attentions.device)  # n - j
    return received / num_attenders * attention_mask.to(attentions.dtype)


def _register_attention() -> None:
    """Register the SDPA-except-last-layer attention and its (eager-format) mask once per process."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def attention(module, query, key, value, attention_mask, **kwargs):
        capture = getattr(module, "_lenpred_capture", False)
        if not capture:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            raise LenpredError(f"{type(module).__name__} has no eager attention: semantic_score needs a model "
                               "whose modeling file defines eager_attention_forward")
        out, weights = eager(module, query, key, value, attention_mask, **kwargs)
        module._lenpred_weights = weights
        return out, weights

    AttentionInterface.register(_ATTN_NAME, attention)
    AttentionMaskInterface.register(_ATTN_NAME, eager_mask)


def _attention_modules(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj")]


def _output_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    logits = model.get_output_embeddings()(hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # Gemma 2/3: tanh soft-capping of the output logits
        logits = torch.tanh(logits / cap) * cap
    return logits


def resolve_layers(layers, num_layers: int) -> tuple[int, ...]:
    """Hidden-state indices with negatives counted from the end (-1 -> ``num_layers``), sorted, unique."""
    return tuple(sorted({l + num_layers + 1 if l < 0 else l for l in layers}))


def left_pad(batch_token_ids: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists to ``(input_ids, attention_mask)``, both ``(B, n_max)`` int64."""
    n = max(len(ids) for ids in batch_token_ids)
    input_ids = torch.full((len(batch_token_ids), n), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for b, ids in enumerate(batch_token_ids):
        input_ids[b, n - len(ids):] = torch.tensor(ids)
        mask[b, n - len(ids):] = 1
    return input_ids, mask


@torch.inference_mode()
def extract_signals(backbone, batch_token_ids: list[list[int]], layers: list[int] | tuple[int, ...],
                    semantic: bool = True, entropy_chunk_tokens: int = 512) -> list[PromptSignals]:
    """Prefill one batch and return each prompt's signals.

    Args:
        backbone: a :class:`lenpred.backbone.Backbone`.
        batch_token_ids: chat-formatted prompts (lists of token ids), any lengths.
        layers: hidden-state indices to keep (0..L; negative counts from the end).
        semantic: also compute ``semantic_score`` (eager attention in the last layer only).
        entropy_chunk_tokens: positions per ``lm_head`` chunk when computing entropy.

    Returns:
        One :class:`PromptSignals` per prompt, in input order, without padding.

    Raises:
        LenpredError: an empty prompt, a prompt longer than the context window, or a bad layer index.
    """
    model, num_layers = backbone.model, backbone.num_layers
    layers = tuple(l + num_layers + 1 if l < 0 else l for l in layers)  # keeps the caller's order
    if any(not 0 <= l <= num_layers for l in layers):
        raise LenpredError(f"layers must be in 0..{num_layers} (or negative from the end), got {list(layers)}")
    for ids in batch_token_ids:
        if len(ids) == 0:
            raise LenpredError("empty prompt: it has no tokens; drop the record or give it text")
        if len(ids) > backbone.context_window:
            raise LenpredError(f"prompt of {len(ids)} tokens exceeds the context window of {backbone.context_window}"
                               f"; truncate it or leave it out (bench: max_prompt_tokens)")
    input_ids, mask = left_pad(batch_token_ids, backbone.tokenizer.pad_token_id)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)

    attn_modules = _attention_modules(model) if semantic else []
    last = max(attn_modules, key=lambda m: m.layer_idx) if attn_modules else None
    previous = model.config._attn_implementation
    if semantic:
        if last is None:
            raise LenpredError(f"cannot find attention layers in {type(model).__name__} for semantic_score")
        _register_attention()
        model.config._attn_implementation = _ATTN_NAME
        last._lenpred_capture = True
    try:
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                    output_hidden_states=True, use_cache=False, logits_to_keep=1)
        weights = last._lenpred_weights if semantic else None
    finally:
        model.config._attn_implementation = previous
        if last is not None:
            last._lenpred_capture = False
            last.__dict__.pop("_lenpred_weights", None)

    final = out.hidden_states[-1]  # (B, n, d), final-norm output
    B, n, _ = final.shape
    entropy = torch.empty(B, n)
    flat = final.reshape(B * n, -1)
    for s in range(0, B * n, entropy_chunk_tokens):
        entropy.view(-1)[s:s + entropy_chunk_tokens] = token_entropy_from_logits(
            _output_logits(model, flat[s:s + entropy_chunk_tokens]))
    semantic_scores = semantic_score_from_attention(weights.float(), mask) if semantic else None
    stacked = torch.stack([out.hidden_states[l] for l in layers], dim=1).float()  # (B, layers, n, d)
    last_states = torch.stack([h[:, -1] for h in out.hidden_states], dim=1).float()  # (B, L + 1, d)

    results = []
    for b, ids in enumerate(batch_token_ids):
        k = n - len(ids)
        results.append(PromptSignals(
            hidden_states=stacked[b, :, k:].clone(), token_entropy=entropy[b, k:].clone(),
            semantic_score=semantic_scores[b, k:].clone() if semantic else None, layers=layers,
            last_token_states=last_states[b].clone()))
    return results


@torch.inference_mode()
def plain_prefill(backbone, batch_token_ids: list[list[int]]) -> None:
    """Plain serving prefill of the same batch (SDPA, last-position logits only): the cost reference."""
    input_ids, mask = left_pad(batch_token_ids, backbone.tokenizer.pad_token_id)
    backbone.model(input_ids=input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                   use_cache=False, logits_to_keep=1)
