"""Which rows of an engine step to keep, and the forward hooks that keep them (no model pass of lenpred's own): pure
torch, engine-independent; the engine's side of each rule (where the step's row offsets and a layer's residual
stream come from, how a scheduler output reads) is the worker adapter's, :mod:`lenpred.serving.vllm.worker`.

An engine flattens a step's requests into one token batch, request ``k``'s rows starting at ``row_starts[k]``
(cumulative offsets, ``(num_reqs + 1,)``, like FlashAttention's ``cu_seqlens``), so its last row is
``row_starts[k + 1] − 1`` (:func:`last_rows`).

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
    step's request ids in the forward's order; the worker adapter says where the engine keeps them).

    The row count must equal ``len(req_ids)``: a step whose hooks saw another batch (a runner that reorders or pads
    requests, a forward that never called the hooks) is refused whole rather than matched wrongly, and every target
    is reported missing.

    Args:
        targets: :func:`capture_plan` of the step.
        states: the hooks' output (:meth:`LayerCapture.take`); empty when they captured nothing.
        req_ids: the step's request ids in row order.
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


def last_rows(row_starts: torch.Tensor, num_reqs: int) -> torch.Tensor:
    """``(num_reqs,)`` int64: each request's last row in the flattened batch, ``row_starts[1:] − 1``.

    Args:
        row_starts: ``(>= num_reqs + 1,)`` integer tensor of cumulative row offsets (request ``k`` holds rows
            ``row_starts[k]`` to ``row_starts[k + 1] − 1``).
    """
    return row_starts[1:num_reqs + 1].to(torch.long) - 1


def output_rows(output: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``(len(rows), d)``: rows ``rows`` of a layer that returns its ``(num_rows, d)`` output tensor as it is (the
    default of :class:`LayerCapture`; an engine whose layers return something else passes its own reader)."""
    return output.index_select(0, rows.to(output.device))


class LayerCapture:
    """Forward hooks that keep every request's last-row residual-stream state at chosen hidden-state indices.

    Args:
        layers: the model's decoder layers (``module.register_forward_hook`` is all that is used).
        indices: hidden-state indices ``1..L`` to capture (``i`` hooks decoder layer ``i − 1``; 0, the embeddings,
            is not hooked; ``L`` is the last layer's residual stream *before* the final norm, which transformers'
            ``hidden_states[L]`` applies: predictors on the last index are refused by the plug-in).
        row_starts: a callable returning the running forward's cumulative row offsets (:func:`last_rows`), or
            ``None`` for a forward that has none (dummy and profiling runs: nothing is kept).
        stream_rows: ``stream_rows(layer_output, rows) -> (len(rows), d)`` tensor: the residual stream at ``rows``
            from what a hooked layer returns (default :func:`output_rows`, a layer returning the stream itself).

    After a forward, :attr:`states` maps each index to a ``(num_reqs, hidden_size)`` float32 tensor (cleared by
    :meth:`take`). Cost: what ``stream_rows`` does with ``num_reqs`` rows per hooked layer (an ``index_select``, and
    an add where the stream is two tensors).

    Raises:
        LenpredError: an index outside ``1..len(layers)``.
    """

    def __init__(self, layers, indices: tuple[int, ...], row_starts, stream_rows=output_rows):
        bad = [i for i in indices if not 1 <= i <= len(layers)]
        if bad:
            raise LenpredError(f"hidden-state index {bad[0]} cannot be captured from a {len(layers)}-layer model: "
                               f"use 1..{len(layers)}")
        self.indices = tuple(sorted(set(indices)))
        self.states: dict[int, torch.Tensor] = {}
        self.num_calls = 0  # forwards that captured something (a counter the tests read)
        self.hook_s = 0.0  # wall time spent inside the hooks (the capture's cost in the forward)
        self._row_starts, self._stream_rows = row_starts, stream_rows
        self._handles = [layers[i - 1].register_forward_hook(self._hook(i)) for i in self.indices]

    def _hook(self, index: int):
        def hook(module, args, output):
            t0 = time.perf_counter()
            starts = self._row_starts()
            if starts is None:
                return
            rows = last_rows(starts, int(starts.numel()) - 1)
            self.states[index] = self._stream_rows(output, rows).float()
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
