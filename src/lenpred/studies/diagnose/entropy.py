"""Cheaper next-token entropy: a pruned output vocabulary, scored offline from cached final hidden states.

The full entropy ``H_i = -sum_{v in V} p_i(v) log p_i(v)`` needs logits for the whole vocabulary (``|V|`` = 49 152
for SmolLM2) at every prompt position: on this model the output head is ~20 % of a prefill's FLOPs. A **pruned
output head** keeps only the ``k`` rows of the output embedding for a fixed vocabulary ``V_k`` (the ``k`` token ids
most frequent in the training split's prompts and responses) and takes the entropy of the softmax renormalised over
``V_k``:

``H^k_i = logsumexp_{v in V_k} x_iv - sum_{v in V_k} softmax_k(x_i)_v x_iv``, with ``x_i = W_{V_k} h_i``,

which costs ``k / |V|`` of the full head and equals ``H_i`` when ``V_k = V``. (The papers do not discuss the
cost; pruned output vocabularies are the usual trick of vocabulary-trimmed or "shortlist" softmax layers, e.g.
L'Hostis et al. 2016, "Vocabulary Selection Strategies for Neural Machine Translation".)

Because the cache's last hidden-state index is the final-norm output (what the output head reads), any entropy
variant can be computed from the cache without re-running the model (:func:`verify_cached_entropy` checks it).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np
import torch

from lenpred.errors import LenpredError
from lenpred.signals import token_entropy_from_logits


def frequent_vocabulary(token_lists: Iterable[Sequence[int]], k: int, vocab_size: int) -> torch.Tensor:
    """The ``k`` token ids most frequent in ``token_lists`` (ties by smaller id), padded with the smallest unseen ids
    when fewer than ``k`` ids occur: ``(k,)`` int64, sorted ascending.

    Raises:
        LenpredError: ``k`` not in ``1..vocab_size``.
    """
    if not 1 <= k <= vocab_size:
        raise LenpredError(f"pruned vocabulary size k must be in 1..{vocab_size}, got {k}")
    counts = Counter()
    for ids in token_lists:
        counts.update(int(t) for t in ids)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:k]
    if len(ranked) < k:
        seen = set(ranked)
        ranked += [t for t in range(vocab_size) if t not in seen][:k - len(ranked)]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def pruned_entropy(final_hidden: torch.Tensor, output_weight: torch.Tensor, vocab: torch.Tensor | None = None,
                   chunk: int = 1024) -> torch.Tensor:
    """Entropy in nats of the output softmax restricted to ``vocab``: ``(n, d)`` final-norm states -> ``(n,)``.

    Args:
        final_hidden: ``(n, d)`` final-norm hidden states (the input of the output head).
        output_weight: ``(V, d)`` output-embedding matrix (``lm_head.weight``; no bias in the models supported).
        vocab: ``(k,)`` int64 token ids of the pruned head, or ``None`` for the full vocabulary.
        chunk: rows per matmul (bounds memory at ``chunk x k`` floats).

    Raises:
        LenpredError: shapes disagree or an id lies outside ``0..V-1``.
    """
    if final_hidden.ndim != 2 or output_weight.ndim != 2 or final_hidden.shape[1] != output_weight.shape[1]:
        raise LenpredError(f"pruned_entropy needs (n, d) states and a (V, d) output weight, got "
                           f"{tuple(final_hidden.shape)} and {tuple(output_weight.shape)}")
    W = output_weight
    if vocab is not None:
        if vocab.numel() == 0 or int(vocab.min()) < 0 or int(vocab.max()) >= W.shape[0]:
            raise LenpredError(f"pruned vocabulary ids must lie in 0..{W.shape[0] - 1}")
        W = W[vocab]
    W = W.float()
    out = torch.empty(final_hidden.shape[0])
    with torch.no_grad():
        for s in range(0, final_hidden.shape[0], chunk):
            out[s:s + chunk] = token_entropy_from_logits(final_hidden[s:s + chunk].float() @ W.T)
    return out


def verify_cached_entropy(signals: Sequence, output_weight: torch.Tensor, final_layer: int) -> dict:
    """Recompute the full-vocabulary entropy from each prompt's cached ``final_layer`` hidden states and compare it
    with the cached ``token_entropy``: ``{"num_prompts", "num_tokens", "max_abs_diff", "mean_abs_diff"}`` (nats).

    A small difference means the cache's last layer is the output head's input, so entropy variants can be scored
    offline. (Softcapped models, e.g. Gemma 2, would differ: their logits pass through ``tanh`` first.)
    """
    diffs = [(pruned_entropy(s.layer(final_layer), output_weight) - s.token_entropy).abs() for s in signals]
    allv = torch.cat(diffs) if diffs else torch.zeros(0)
    return {"num_prompts": len(diffs), "num_tokens": int(allv.numel()),
            "max_abs_diff": float(allv.max()) if allv.numel() else None,
            "mean_abs_diff": float(allv.mean()) if allv.numel() else None}


def with_entropy(signals, token_entropy: torch.Tensor):
    """A copy of a :class:`lenpred.signals.PromptSignals` with ``token_entropy`` replaced (tensors shared)."""
    from dataclasses import replace

    if token_entropy.shape != signals.token_entropy.shape:
        raise LenpredError(f"replacement entropy has shape {tuple(token_entropy.shape)}, the prompt "
                           f"{tuple(signals.token_entropy.shape)}")
    return replace(signals, token_entropy=token_entropy)


def entropy_agreement(full: np.ndarray, approx: np.ndarray) -> dict:
    """Pearson and Spearman correlation of approximate vs full entropies over all tokens (``(N,)`` each)."""
    from scipy.stats import pearsonr, spearmanr

    return {"pearson": float(pearsonr(full, approx).statistic), "spearman": float(spearmanr(full, approx).statistic),
            "mean_abs_diff": float(np.mean(np.abs(np.asarray(full) - np.asarray(approx))))}
