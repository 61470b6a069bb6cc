"""The truncated prefill for predictors that read only hidden states (``last``, ``mean``, ``max`` pooling at one
layer, like the shipped ``last@15``): the forward pass stops after the decoder layer that produces the state the
predictor reads. No later layers, no LM head, no token entropy, no attention weights, and one layer's states kept.

Hidden-state index ``l`` means what transformers' ``output_hidden_states[l]`` means: ``0`` the embeddings, ``1..L−1``
the output of decoder layer ``l − 1`` (the residual stream), ``L`` the final-norm output of the last layer. The
truncated pass captures decoder layer ``l − 1``'s output with a forward hook and stops the forward there (the hook
raises; nothing after it runs), applying the final norm for ``l = L``. ``l = 0`` is not supported (some models scale
their embeddings inside the forward): :func:`truncated_plan` returns ``None`` and the full path runs.

The chat template's fixed prefix (SmolLM2's default system prompt and the user header: most of a short chat
prompt) is the same for every request: :class:`PrefixCache` computes its keys and values once, and each batch then
runs only the rest of its prompts after it (right-padded, positions continuing from the prefix).

Cost on SmolLM2-135M (30 layers) for ``last@15``: layers 0–14 of 30 and no 49k-vocabulary head, against the full
path's 30 layers and the head over every prompt position (for the entropy): measured by ``scripts/proxy_latency.py``.
:meth:`lenpred.LengthPredictor.predict` takes this pass whenever the predictor reads one layer's hidden states only;
its predictions equal the full prefill's to float32 rounding (tested on the tiny model and, marked ``slow``, on the
shipped predictor).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lenpred.errors import LenpredError
from lenpred.inputs.cache import token_batches
from lenpred.inputs.prefill import attach_signals
from lenpred.predictors.registry import Reads
from lenpred.prompts import check_fits
from lenpred.signals import PromptSignals, left_pad
from lenpred.torch_state import with_backbone_threads

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


def truncated_plan(reads: Reads, num_layers: int) -> TruncatedPlan | None:
    """The plan for a predictor that reads ``reads`` (:meth:`lenpred.predictors.Predictor.reads`) of a model with
    ``num_layers`` decoder layers, or ``None`` when it reads more than one positive layer's hidden states (entropy-
    or attention-weighted poolers, text proxies, the embeddings, a layer counted from the end): the full prefill
    then runs. ``last``, ``mean``, ``max`` pooling and TRAIL run truncated."""
    if not reads.hidden_states_only or not 1 <= reads.layer <= num_layers:
        return None
    return TruncatedPlan(int(reads.layer), num_layers)


def _forward_until(decoder, layer: int, **inputs) -> torch.Tensor:
    """Run ``decoder`` on ``inputs`` and return decoder layer ``layer − 1``'s output ``(B, n, d)``; nothing after it
    runs (the capture hook raises)."""
    captured: dict[str, torch.Tensor] = {}

    def capture(module, args, output):
        captured["h"] = output[0] if isinstance(output, tuple) else output
        raise _Stop

    handle = decoder.layers[layer - 1].register_forward_hook(capture)
    try:
        decoder(**inputs)
    except _Stop:
        pass
    finally:
        handle.remove()
    return captured["h"]


def _cache_inputs(decoder, cache, positions: torch.Tensor) -> dict:
    """The cache keyword arguments of this transformers version: ``cache`` (5.x) or ``past_key_values`` with
    ``cache_position`` (4.x)."""
    import inspect

    params = inspect.signature(decoder.forward).parameters
    if "cache" in params:
        return {"cache": cache}
    return {"past_key_values": cache} | ({"cache_position": positions} if "cache_position" in params else {})


def supports_prefix_cache(model) -> bool:
    """Whether the shared-prefix KV cache is safe: every layer attends to the full context (no sliding windows,
    which transformers caches differently per layer)."""
    cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    types = getattr(cfg, "layer_types", None)
    return not getattr(cfg, "sliding_window", None) and (types is None or set(types) <= {"full_attention"})


class PrefixCache:
    """Keys and values (layers ``0..layer−1``) and the hidden states at ``layer`` of token prefixes every request
    shares (the chat template's fixed prefix: system prompt and role header), computed once per prefix; the few
    most recent prefixes are kept."""

    def __init__(self, max_entries: int = 4):
        import collections

        self.max_entries = max_entries
        self._entries: collections.OrderedDict = collections.OrderedDict()

    def get(self, decoder, prefix: tuple[int, ...], layer: int) -> tuple[list, torch.Tensor]:
        """``([(keys, values) per layer, each (1, kv_heads, P, head_dim)], hidden (P, d) before any final norm)``."""
        from transformers import DynamicCache

        key = (prefix, layer)
        if key not in self._entries:
            cache = DynamicCache()
            ids = torch.tensor([prefix])
            positions = torch.arange(len(prefix))
            hidden = _forward_until(decoder, layer, input_ids=ids, position_ids=positions[None], use_cache=True,
                                    **_cache_inputs(decoder, cache, positions))
            self._entries[key] = ([(l.keys, l.values) for l in cache.layers[:layer]], hidden[0])
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return self._entries[key]


@with_backbone_threads
@torch.inference_mode()
def truncated_hidden_states(backbone, batch_token_ids: list[list[int]], layer: int, prefix_len: int = 0,
                            prefix_cache: PrefixCache | None = None) -> list[torch.Tensor]:
    """Hidden states at index ``layer`` of each prompt, from a forward that stops there.

    Args:
        backbone: a :class:`lenpred.backbone.Backbone` whose model has ``get_decoder()`` with ``layers`` (and
            ``norm`` for ``layer = L``), as transformers' decoder-only LMs do.
        batch_token_ids: chat-formatted prompts (token ids), any lengths; left-padded together as
            :func:`lenpred.signals.extract_signals` pads them (so the states match its, per prompt).
        layer: hidden-state index ``1..L``.
        prefix_len, prefix_cache: when every prompt starts with the same ``prefix_len`` tokens (and has at least one
            more) and the model supports it (:func:`supports_prefix_cache`), the prefix's keys and values come from
            ``prefix_cache`` and only the rest of each prompt is computed (right-padded after the cached prefix,
            positions continuing from it). Causal attention makes the prefix's states independent of what follows,
            so the result is the same up to float rounding (tested to 1e-5).

    Returns:
        One ``(n_i, d)`` float32 tensor per prompt (its own tokens, no padding), in input order.

    Raises:
        LenpredError: ``layer`` outside ``1..L``, or a prompt that does not fit the context window.
    """
    decoder, num_layers = backbone.model.get_decoder(), backbone.num_layers
    if not 1 <= layer <= num_layers:
        raise LenpredError(f"the truncated pass reads hidden-state index 1..{num_layers}, got {layer}")
    for ids in batch_token_ids:
        check_fits(len(ids), 0, backbone.context_window)
    prefix = tuple(batch_token_ids[0][:prefix_len])
    if (prefix_cache is not None and prefix_len > 0 and supports_prefix_cache(backbone.model)
            and all(len(ids) > prefix_len and tuple(ids[:prefix_len]) == prefix for ids in batch_token_ids)):
        states = _after_prefix(backbone, decoder, batch_token_ids, layer, prefix, prefix_cache)
    else:
        input_ids, mask = left_pad(batch_token_ids, backbone.tokenizer.pad_token_id)
        hidden = _forward_until(decoder, layer, input_ids=input_ids, attention_mask=mask,
                                position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=False)  # (B, n, d)
        n = hidden.shape[1]
        states = [hidden[b, n - len(ids):] for b, ids in enumerate(batch_token_ids)]
    if layer == num_layers:
        states = [decoder.norm(h) for h in states]
    return [h.float() for h in states]


def _after_prefix(backbone, decoder, batch_token_ids, layer: int, prefix: tuple[int, ...],
                  prefix_cache: PrefixCache) -> list[torch.Tensor]:
    """:func:`truncated_hidden_states` with the shared prefix's keys and values from the cache (before any norm)."""
    from transformers import DynamicCache

    kv, prefix_hidden = prefix_cache.get(decoder, prefix, layer)
    P, B = len(prefix), len(batch_token_ids)
    rest = [ids[P:] for ids in batch_token_ids]
    m = max(len(r) for r in rest)
    input_ids = torch.full((B, m), backbone.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(B, P + m, dtype=torch.long)
    mask[:, :P] = 1
    for b, r in enumerate(rest):  # right padding: a prompt's own tokens never see the pads after them
        input_ids[b, :len(r)] = torch.tensor(r)
        mask[b, P:P + len(r)] = 1
    cache = DynamicCache(ddp_cache_data=[(k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1)) for k, v in kv])
    positions = P + torch.arange(m)
    hidden = _forward_until(decoder, layer, input_ids=input_ids, attention_mask=mask, use_cache=True,
                            position_ids=positions[None].expand(B, -1),
                            **_cache_inputs(decoder, cache, positions))  # (B, m, d)
    return [torch.cat([prefix_hidden, hidden[b, :len(r)]]) for b, r in enumerate(rest)]


def attach_truncated_signals(backbone, requests: list, plan: TruncatedPlan, batch_tokens: int = 4096,
                             prefix_cache: PrefixCache | None = None, progress: bool = False) -> None:
    """Set each request's ``signals`` to a :class:`lenpred.signals.PromptSignals` holding only ``plan.layer``'s
    states (``(1, n, d)``) and zero entropies (which such a predictor ignores), prompts
    grouped by length into batches of at most ``batch_tokens`` padded tokens (what a hidden-states-only predictor,
    :attr:`lenpred.predictors.Reads.hidden_states_only`, reads). With ``prefix_cache``, the template's
    fixed prefix (the tokens before the users' content, ``Request.content_span``) is computed once and reused;
    ``progress``: a bar, as the full prefill's (:func:`lenpred.inputs.prefill.attach_signals`)."""
    from tqdm.auto import tqdm

    batches = token_batches([r.num_prompt_tokens for r in requests], batch_tokens)
    for batch in tqdm(batches, desc="prefill signals", unit="batch", disable=not progress):
        spans = [requests[i].content_span for i in batch]
        prefix_len = min(s[0] for s in spans) if all(s is not None for s in spans) else 0
        states = truncated_hidden_states(backbone, [requests[i].token_ids for i in batch], plan.layer, prefix_len,
                                         prefix_cache)
        for i, h in zip(batch, states):
            requests[i].signals = PromptSignals(h[None], torch.zeros(h.shape[0]), None, (plan.layer,))


def attach_prefill_signals(backbone, requests: list, reads: Reads, batch_tokens: int = 4096, truncated: bool = True,
                           prefix_cache: PrefixCache | None = None, progress: bool = False) -> None:
    """Set each request's ``signals`` by the cheapest forward that gives what a predictor ``reads``
    (:meth:`lenpred.predictors.Predictor.reads`): this module's truncated prefill when it reads one positive layer's
    hidden states only (:func:`truncated_plan`; ``truncated=False`` turns it off), else the full prefill at its layer
    (the last when it reads entropy or attention alone), with the last layer's attention when it reads the semantic
    score (:func:`lenpred.inputs.prefill.attach_signals`); nothing for a predictor that reads no prefill signal.
    ``batch_tokens``, ``prefix_cache``, ``progress``: as :func:`attach_truncated_signals`."""
    if "signals" not in reads.inputs:
        return
    plan = truncated_plan(reads, backbone.num_layers) if truncated else None
    if plan is not None:
        attach_truncated_signals(backbone, requests, plan, batch_tokens, prefix_cache, progress)
    else:
        layers = (reads.layer,) if reads.layer is not None else (backbone.num_layers,)
        attach_signals(backbone, requests, layers, reads.semantic_score, batch_tokens, progress)
