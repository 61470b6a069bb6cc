"""Prefill signals of the serving model: hidden states, next-token entropy, semantic score.

One forward pass per batch gives, for every prompt token ``i``:

* ``hidden_states[l, i]`` at the requested layers (``l = 0`` is the embedding output, ``l = L`` the
  final-norm output, as in transformers' ``output_hidden_states``);
* ``token_entropy[i] = -sum_v p_i(v) log p_i(v)`` in nats, ``p_i = softmax(logits_i)``;
* ``last_token_states[l]``: the hidden state of the last prompt token at **every** index ``l = 0..L``
  (what TRAIL's layer sweep needs; ``(L + 1) x d`` per prompt, so cheap to keep);
* ``attention_received[j] = sum_i mean_heads A_ij``: the attention token ``j`` receives in the **last**
  layer, summed over the prompt's query tokens; ESTP's ``semantic_score`` divides it by ``n`` (the paper's
  ``S_j = (1/N) sum_i A_ij`` with ``N = n``; default) or, as a named option, by ``n - j`` (the queries that can
  see ``j`` under the causal mask). The ``n - j`` variant hands the last prompt token a single
  self-attention value: on ForeLen it took a median 95 % of ESTP's weight, so it is not the default.

Cost control: attention weights exist only in eager attention; we register an attention function
(transformers' ``AttentionInterface``) that runs SDPA in every layer but the last and eager in the
last, so the extra cost is one layer's ``(B, heads, n, n)`` softmax (a model that soft-caps attention logits,
Gemma 2, runs eager in every layer: SDPA cannot soft-cap). Logits are never materialised
for the whole batch: entropy is computed from the final hidden states in chunks through
``lm_head`` (a 262k-token vocabulary would need gigabytes otherwise).

Batching: prompts are left-padded; ``position_ids`` come from the attention mask, and padded keys
are masked, so a prompt's signals do not depend on its batch-mates (tested to 1e-4).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch

from lenpred.errors import LenpredError
from lenpred.prompts import check_fits
from lenpred.torch_state import with_backbone_threads

_ATTN_NAME = "lenpred_last_layer_eager"


SEMANTIC_DIVISORS = ("n", "causal")
"""How ``semantic_score`` averages the attention a token receives: over all ``n`` queries (ESTP paper) or over the
``n - j`` queries that can attend to token ``j`` (``"causal"``)."""


def semantic_score(attention_received: torch.Tensor, divisor: str = "n") -> torch.Tensor:
    """ESTP semantic score of one prompt, ``(n,)`` -> ``(n,)``: ``S_j = attention_received_j / N``.

    ``divisor="n"``: ``N = n`` as Ren et al. (2026) state it; ``"causal"``: ``N = n - j`` (``j = 0..n-1``).

    Raises:
        LenpredError: unknown divisor.
    """
    if divisor not in SEMANTIC_DIVISORS:
        raise LenpredError(f"unknown semantic-score divisor '{divisor}'; valid: {', '.join(SEMANTIC_DIVISORS)}")
    n = attention_received.shape[0]
    if divisor == "n":
        return attention_received / n
    return attention_received / torch.arange(n, 0, -1, dtype=attention_received.dtype)


@dataclass
class TokenSpan:
    """What a pooler reads for the ``m`` tokens of a prompt it pools over (see :meth:`PromptSignals.span`).

    Attributes:
        hidden_states: ``(num_layers_requested, m, d)`` float32, in the order of ``layers``.
        token_entropy: ``(m,)`` float32, nats.
        semantic_score: ``(m,)`` float32 (computed over the *whole* prompt's queries, then cut), or ``None``.
        layers: the hidden-state indices held.
    """

    hidden_states: torch.Tensor
    token_entropy: torch.Tensor
    semantic_score: torch.Tensor | None
    layers: tuple[int, ...]

    def layer(self, index: int) -> torch.Tensor:
        """Hidden states ``(m, d)`` of hidden-state index ``index``.

        Raises:
            LenpredError: the layer was not extracted.
        """
        if index not in self.layers:
            raise LenpredError(f"layer {index} was not extracted (have {list(self.layers)}); re-extract with it")
        return self.hidden_states[self.layers.index(index)]


@dataclass
class PromptSignals:
    """Prefill signals of one prompt of ``n`` tokens.

    Attributes:
        hidden_states: ``(num_layers_requested, n, d)`` float32, in the order of ``layers``.
        token_entropy: ``(n,)`` float32, nats.
        attention_received: ``(n,)`` float32, ``sum_i mean_heads A_ij`` of the last layer (each entry in
            ``[0, n - j]``; the entries sum to ``n``), or ``None`` when attention was not requested.
        layers: the hidden-state indices held (0 = embeddings, L = last layer).
        last_token_states: ``(L + 1, d)`` float32, the last token's hidden state at every index, or ``None``.
    """

    hidden_states: torch.Tensor
    token_entropy: torch.Tensor
    attention_received: torch.Tensor | None
    layers: tuple[int, ...]
    last_token_states: torch.Tensor | None = None

    def semantic_score(self, divisor: str = "n") -> torch.Tensor | None:
        """``(n,)`` ESTP semantic score (:func:`semantic_score`), or ``None`` without attention."""
        return None if self.attention_received is None else semantic_score(self.attention_received, divisor)

    def span(self, start: int = 0, end: int | None = None, semantic_divisor: str = "n") -> TokenSpan:
        """The signals of tokens ``start..end-1`` (the user's content, see :mod:`lenpred.prompts`).

        The semantic score is computed over the whole prompt first (every query counts), then cut. An empty or
        out-of-range span falls back to the last token, so a pooler always sees at least one token.
        """
        n = len(self.token_entropy)
        start, end = max(start, 0), n if end is None else min(end, n)
        if start >= end:
            start, end = n - 1, n
        S = self.semantic_score(semantic_divisor)
        return TokenSpan(self.hidden_states[:, start:end], self.token_entropy[start:end],
                         None if S is None else S[start:end], self.layers)

    def layer(self, index: int) -> torch.Tensor:
        """Hidden states ``(n, d)`` of hidden-state index ``index`` (see :meth:`TokenSpan.layer`)."""
        return TokenSpan(self.hidden_states, self.token_entropy, None, self.layers).layer(index)

    def last_token_state(self, index: int) -> torch.Tensor:
        """The last prompt token's hidden state ``(d,)`` float32 at index ``index``: from ``last_token_states`` (the
        full prefill keeps every index) or, when only some layers are held (the truncated forward,
        :mod:`lenpred.truncated`), from ``hidden_states``.

        Raises:
            LenpredError: neither holds ``index``.
        """
        if self.last_token_states is not None:
            return self.last_token_states[index]
        if index in self.layers:
            return self.layer(index)[-1]
        raise LenpredError(f"layer {index}'s last-token state is not in these signals (layers {list(self.layers)}, "
                           "no last_token_states): re-extract them (lenpred.inputs.cache.extract_cached)")


def token_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of ``softmax(logits)`` over the last axis: ``(..., V)`` -> ``(...)``.

    ``H = logsumexp(x) - sum_v softmax(x)_v x_v``, which is ``-sum p log p`` without forming ``log p``.
    """
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    return log_z - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def attention_received_from_attention(attentions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Attention each token receives, from one layer's attention of a left-padded batch.

    Args:
        attentions: ``(B, heads, n, n)`` attention probabilities (rows = queries).
        attention_mask: ``(B, n)`` 1 for real tokens, 0 for left padding.

    Returns:
        ``(B, n)``: ``sum_{i valid} mean_heads A_ij`` for real ``j``, 0 at padded positions (ESTP's semantic
        score before dividing by ``N``; see :func:`semantic_score`).
    """
    mask = attention_mask.to(attentions.dtype)
    received = (attentions.mean(dim=1) * mask[:, :, None]).sum(dim=1)  # (B, n): column sums over valid queries
    return received * mask


@functools.cache
def _register_attention() -> None:
    """Register the SDPA-except-last-layer attention and its (eager-format) mask under :data:`_ATTN_NAME`, once per
    process (a lenpred-only name in transformers' registries: no other model's attention changes). A model uses it
    only inside :func:`extract_signals` (``set_attn_implementation``, then the previous implementation again)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def attention(module, query, key, value, attention_mask, **kwargs):
        capture = getattr(module, "_lenpred_capture", False)
        if not capture and kwargs.get("softcap") is None:  # SDPA cannot soft-cap logits (Gemma 2): eager does
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            raise LenpredError(f"{type(module).__name__} has no eager attention: semantic_score needs a model "
                               "whose modeling file defines eager_attention_forward")
        out, weights = eager(module, query, key, value, attention_mask, **kwargs)
        if capture:
            module._lenpred_weights = weights
        return out, weights

    AttentionInterface.register(_ATTN_NAME, attention)
    AttentionMaskInterface.register(_ATTN_NAME, eager_mask)


def _attention_modules(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj")]


def _output_logits(model, hidden: torch.Tensor, vocab_head: tuple | None = None) -> torch.Tensor:
    """Output logits ``(m, V)`` of final-norm states ``(m, d)``; with ``vocab_head = (weight (k, d), bias (k,) or
    None)`` only those rows (a pruned output head, :mod:`lenpred.studies.diagnose.entropy`): ``(m, k)``."""
    if vocab_head is None:
        logits = model.get_output_embeddings()(hidden)
    else:
        logits = torch.nn.functional.linear(hidden, *vocab_head)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # Gemma 2/3: tanh soft-capping of the output logits
        logits = torch.tanh(logits / cap) * cap
    return logits


def default_layers(num_layers: int) -> tuple[int, ...]:
    """Hidden-state indices extracted when none are given: half, three quarters and all of the depth,
    ``(L // 2, 3 * L // 4, L)`` (distinct, sorted). SmolLM2's 30 layers give ``(15, 22, 30)``, the layers the
    shipped predictor and the committed results were chosen from; Gemma 3 270M's 18 give ``(9, 13, 18)``.
    (TRAIL and the signal-probing literature find the length signal in middle-to-late layers; the final layer is
    what EGTP / ESTP pool.)"""
    return tuple(sorted({num_layers // 2, 3 * num_layers // 4, num_layers}))


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


@with_backbone_threads
@torch.inference_mode()
def extract_signals(backbone, batch_token_ids: list[list[int]], layers: list[int] | tuple[int, ...],
                    semantic: bool = True, entropy_chunk_tokens: int = 512,
                    entropy_vocab: torch.Tensor | None = None) -> list[PromptSignals]:
    """Prefill one batch and return each prompt's signals.

    Args:
        backbone: a :class:`lenpred.backbone.Backbone`.
        batch_token_ids: chat-formatted prompts (lists of token ids), any lengths.
        layers: hidden-state indices to keep (0..L; negative counts from the end).
        semantic: also compute ``attention_received`` (eager attention in the last layer only).
        entropy_chunk_tokens: positions per ``lm_head`` chunk when computing entropy.
        entropy_vocab: ``(k,)`` int64 token ids: compute the entropy of the output softmax renormalised over these
            ids only (a pruned output head costing ``k / V`` of the full one; see
            :mod:`lenpred.studies.diagnose.entropy`); ``None`` (default): the full vocabulary.

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
        check_fits(len(ids), 0, backbone.context_window)
    input_ids, mask = left_pad(batch_token_ids, backbone.tokenizer.pad_token_id)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)

    attn_modules = _attention_modules(model) if semantic else []
    last = max(attn_modules, key=lambda m: m.layer_idx) if attn_modules else None
    previous = model.config._attn_implementation  # read only: it is set through set_attn_implementation
    if semantic:
        if last is None:
            raise LenpredError(f"cannot find attention layers in {type(model).__name__} for semantic_score")
        _register_attention()
        model.set_attn_implementation(_ATTN_NAME)
        last._lenpred_capture = True
    try:
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                    output_hidden_states=True, use_cache=False, logits_to_keep=1)
        weights = last._lenpred_weights if semantic else None
    finally:
        if semantic:
            model.set_attn_implementation(previous)
        if last is not None:
            last._lenpred_capture = False
            last.__dict__.pop("_lenpred_weights", None)

    final = out.hidden_states[-1]  # (B, n, d), final-norm output
    vocab_head = None
    if entropy_vocab is not None:
        head = model.get_output_embeddings()
        if entropy_vocab.numel() == 0 or int(entropy_vocab.min()) < 0 or int(entropy_vocab.max()) >= head.weight.shape[0]:
            raise LenpredError(f"entropy_vocab ids must lie in 0..{head.weight.shape[0] - 1}")
        vocab_head = (head.weight[entropy_vocab], None if head.bias is None else head.bias[entropy_vocab])
    B, n, _ = final.shape
    entropy = torch.empty(B, n)
    flat = final.reshape(B * n, -1)
    for s in range(0, B * n, entropy_chunk_tokens):
        entropy.view(-1)[s:s + entropy_chunk_tokens] = token_entropy_from_logits(
            _output_logits(model, flat[s:s + entropy_chunk_tokens], vocab_head))
    received = attention_received_from_attention(weights.float(), mask) if semantic else None
    stacked = torch.stack([out.hidden_states[l] for l in layers], dim=1).float()  # (B, layers, n, d)
    last_states = torch.stack([h[:, -1] for h in out.hidden_states], dim=1).float()  # (B, L + 1, d)

    results = []
    for b, ids in enumerate(batch_token_ids):
        k = n - len(ids)
        results.append(PromptSignals(
            hidden_states=stacked[b, :, k:].clone(), token_entropy=entropy[b, k:].clone(),
            attention_received=received[b, k:].clone() if semantic else None, layers=layers,
            last_token_states=last_states[b].clone()))
    return results


@with_backbone_threads
@torch.inference_mode()
def plain_prefill(backbone, batch_token_ids: list[list[int]]) -> None:
    """Plain serving prefill of the same batch (SDPA, last-position logits only): the cost reference."""
    input_ids, mask = left_pad(batch_token_ids, backbone.tokenizer.pad_token_id)
    backbone.model(input_ids=input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                   use_cache=False, logits_to_keep=1)
