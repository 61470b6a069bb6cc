"""Which rows of a vLLM step to keep, and the forward hooks that keep them (no model pass of lenpred's own).

vLLM flattens a step's requests into one token batch. The residual stream after decoder layer ``i`` is the sum of
the two tensors the layer returns, ``hidden + residual`` (vLLM's fused add-RMSNorm defers the addition to the next
layer; its own aux-hidden-state capture sums them the same way). That sum at decoder layer ``L − 1`` (0-based) is
transformers' ``output_hidden_states[L]``. Request ``k``'s last row in the step is ``query_start_loc[k + 1] − 1``
(:func:`last_rows`), in input-batch order, which is the order of ``ModelRunnerOutput.req_ids``.

Only the worker knows which of those rows matter (:func:`capture_plan`): a request's **last prompt token** (the
step that completes its prefill: chunked prefill and prefix-cache hits included) and, for PLP, the decode step that
consumes its ``t``-th generated token for ``t`` in the PLP schedule.

The hooks run in eager mode only: CUDA graphs and ``torch.compile`` trace the model once and never call a Python
hook again, so the plug-in refuses to start without ``--enforce-eager`` (vLLM's aux-hidden-state path would be the
way to lift that on GPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from lenpred.errors import LenpredError


@dataclass(frozen=True)
class ScheduledRequest:
    """One request of a step, as the worker sees it in the scheduler output.

    Attributes:
        request_id: the engine's id.
        num_computed_tokens: tokens whose KV existed before this step (prefix-cache hits included).
        num_scheduled_tokens: tokens this step computes for it.
        num_prompt_tokens: its prompt length.
    """

    request_id: str
    num_computed_tokens: int
    num_scheduled_tokens: int
    num_prompt_tokens: int


@dataclass(frozen=True)
class CaptureTarget:
    """What to keep of one request's last row this step: ``step`` 0 = the last prompt token (the prefill state),
    ``step`` t >= 1 = the state of the decode step that consumed its t-th generated token (PLP)."""

    request_id: str
    step: int


def capture_plan(scheduled: list[ScheduledRequest], plp_steps: tuple[int, ...] = ()) -> list[CaptureTarget]:
    """The requests whose last row this step holds a state lenpred reads.

    A step completes a prefill when ``num_computed_tokens < num_prompt_tokens <= num_computed_tokens +
    num_scheduled_tokens`` (its final prompt token is computed now; a prefix-cache hit starts with
    ``num_computed_tokens > 0``). A decode step's input is generated token ``t = num_computed_tokens −
    num_prompt_tokens + 1``; it is kept when ``t`` is in ``plp_steps`` (steps >= 1; step 0 is the prefill).

    Returns:
        targets in the order of ``scheduled``.
    """
    steps = {s for s in plp_steps if s >= 1}
    out = []
    for r in scheduled:
        before, after, prompt = r.num_computed_tokens, r.num_computed_tokens + r.num_scheduled_tokens, r.num_prompt_tokens
        if before < prompt <= after:
            out.append(CaptureTarget(r.request_id, 0))
        elif before >= prompt and r.num_scheduled_tokens == 1 and before - prompt + 1 in steps:
            out.append(CaptureTarget(r.request_id, before - prompt + 1))
    return out


@dataclass
class StepStates:
    """One step's captured states matched to its requests (:func:`collect_states`).

    Attributes:
        states: ``{request_id: {"step": int, "states": {hidden-state index: (d,) float32 ndarray}}}``, what rides to
            the scheduler.
        missing: planned targets that got no state (their request has no row, or the whole step was refused).
        error: why the step's rows were refused (``None``: they were not).
    """

    states: dict
    missing: list[str]
    error: str | None = None


def collect_states(targets: list[CaptureTarget], states: dict[int, torch.Tensor], req_ids: list[str]) -> StepStates:
    """Match the hooks' rows to requests: row ``k`` of each ``(num_rows, d)`` tensor belongs to ``req_ids[k]`` (the
    model runner output's order, which is the forward's input-batch order on every vLLM model runner).

    The row count must equal ``len(req_ids)``: a step whose hooks saw another batch (a runner that reorders or pads
    requests, a forward that never called the hooks) is refused whole rather than matched wrongly, and every target
    is reported missing.

    Args:
        targets: :func:`capture_plan` of the step.
        states: the hooks' output (:meth:`LayerCapture.take`); empty when they captured nothing.
        req_ids: the step's request ids in row order (``ModelRunnerOutput.req_ids``).
    """
    if not targets:
        return StepStates({}, [])
    num_rows = len(next(iter(states.values()))) if states else 0
    if num_rows != len(req_ids):
        why = ("the hooks captured nothing (compiled or graph-captured model? no forward context?)" if not states
               else f"the hooks captured {num_rows} rows for the output's {len(req_ids)} requests")
        return StepStates({}, [t.request_id for t in targets], why)
    order = {rid: k for k, rid in enumerate(req_ids)}
    out, missing = {}, []
    for t in targets:
        row = order.get(t.request_id)
        if row is None:
            missing.append(t.request_id)
            continue
        out[t.request_id] = {"step": t.step, "states": {i: s[row].numpy().astype(np.float32) for i, s in states.items()}}
    return StepStates(out, missing)


def scheduled_requests(scheduler_output, prompt_lengths: dict[str, int]) -> list[ScheduledRequest]:
    """The step's requests with their computed / scheduled / prompt token counts, from vLLM's ``SchedulerOutput``
    (new requests carry their prompt; cached ones are looked up in ``prompt_lengths``, filled as they arrive).

    Finished ids are forgotten first, as vLLM's model runner does: an id aborted and resubmitted between two steps is
    in both ``finished_req_ids`` and ``scheduled_new_reqs`` of one output, and its new prompt length must stay."""
    for rid in scheduler_output.finished_req_ids:
        prompt_lengths.pop(rid, None)
    out = []
    for new in scheduler_output.scheduled_new_reqs:
        n = len(new.prompt_token_ids) if new.prompt_token_ids is not None else int(new.prompt_embeds.shape[0])
        prompt_lengths[new.req_id] = n
        out.append(ScheduledRequest(new.req_id, new.num_computed_tokens,
                                    scheduler_output.num_scheduled_tokens[new.req_id], n))
    cached = scheduler_output.scheduled_cached_reqs
    for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
        if rid in prompt_lengths:
            out.append(ScheduledRequest(rid, computed, scheduler_output.num_scheduled_tokens[rid], prompt_lengths[rid]))
    return out


def last_rows(query_start_loc: torch.Tensor, num_reqs: int) -> torch.Tensor:
    """``(num_reqs,)`` int64: each request's last row in the flattened batch, ``query_start_loc[1:] − 1``."""
    return query_start_loc[1:num_reqs + 1].to(torch.long) - 1


def _query_start_loc() -> torch.Tensor | None:
    """``query_start_loc`` of the running forward (any attention layer's metadata holds it); ``None`` in dummy and
    profiling runs that build no metadata."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):  # micro-batches: not used on this path
        metadata = metadata[0] if metadata else None
    if not metadata:
        return None
    first = next(iter(metadata.values())) if isinstance(metadata, dict) else metadata
    return getattr(first, "query_start_loc", None)


class LayerCapture:
    """Forward hooks that keep every request's last-row residual-stream state at chosen hidden-state indices.

    Args:
        layers: the model's decoder layers (``model.model.layers``).
        indices: hidden-state indices ``1..L`` to capture (``i`` hooks decoder layer ``i − 1``; 0, the embeddings,
            is not hooked; ``L`` is the last layer's residual stream *before* the final norm, which transformers'
            ``hidden_states[L]`` applies: predictors on the last index are refused by the plug-in).
        query_start_loc: a callable returning the running forward's ``query_start_loc`` (default: vLLM's forward
            context).

    After a forward, :attr:`states` maps each index to a ``(num_reqs, hidden_size)`` float32 tensor (cleared by
    :meth:`take`). Cost: one ``index_select`` and one add of ``num_reqs`` rows per hooked layer.
    """

    def __init__(self, layers, indices: tuple[int, ...], query_start_loc=None):
        bad = [i for i in indices if not 1 <= i <= len(layers)]
        if bad:
            raise LenpredError(f"hidden-state index {bad[0]} cannot be captured from a {len(layers)}-layer model: "
                               f"use 1..{len(layers)}")
        self.indices = tuple(sorted(set(indices)))
        self.states: dict[int, torch.Tensor] = {}
        self.num_calls = 0  # forwards that captured something (a counter the tests read)
        self.hook_s = 0.0  # wall time spent inside the hooks (the capture's cost in the forward)
        self._query_start_loc = query_start_loc or _query_start_loc  # injectable: tests run without vLLM
        self._handles = [layers[i - 1].register_forward_hook(self._hook(i)) for i in self.indices]

    def _hook(self, index: int):
        def hook(module, args, output):
            t0 = time.perf_counter()
            qsl = self._query_start_loc()
            if qsl is None:
                return
            hidden, residual = output if isinstance(output, tuple) else (output, None)
            num_reqs = int(qsl.numel()) - 1
            rows = last_rows(qsl, num_reqs).to(hidden.device)
            state = hidden.index_select(0, rows)
            if residual is not None:
                state = state + residual.index_select(0, rows)
            self.states[index] = state.float()
            if index == self.indices[0]:
                self.num_calls += 1
            self.hook_s += time.perf_counter() - t0
        return hook

    def take(self) -> dict[int, torch.Tensor]:
        """The last forward's states (and forget them)."""
        states, self.states = self.states, {}
        return states

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def decoder_layers(model) -> list:
    """The decoder layers of a vLLM causal LM (``model.model.layers``: Llama, Qwen2, Mistral, Gemma, …).

    Raises:
        LenpredError: the model has no such list (the message names the model class)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise LenpredError(f"{type(model).__name__} has no model.layers: the lenpred plug-in supports decoder-only "
                           "models laid out like Llama (Llama, Qwen2, Mistral, Gemma)")
    return list(layers)
