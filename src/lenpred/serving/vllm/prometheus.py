"""The plug-in's counters in vLLM's ``/metrics``.

vLLM serves ``/metrics`` from its API-server process, which never sees the scheduler's objects (they live in the
engine-core process). vLLM's own way across processes is Prometheus' multiprocess mode: when
``PROMETHEUS_MULTIPROC_DIR`` is set for ``vllm serve``, its ``/metrics`` collects every process's metrics from that
directory (``vllm.v1.metrics.prometheus.get_prometheus_registry``). So start vLLM with that variable pointing at a
fresh empty directory, and the scheduler's counters appear as ``lenpred_<name>_total`` (each exactly once: one
engine-core process writes them). Without it they stay in ``<log_path>.scheduler.json`` and the scheduler logs
that once.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm.lenpred.metrics")

COUNTERS = {
    "predicted": "requests predicted from their own prefill state",
    "missing_states": "requests prefilled without a captured state (left unpredicted: an error)",
    "parked_request_steps": "request-steps parked (kept KV blocks, no token)",
    "promoted": "parked requests promoted by the starvation guard",
    "kv_parked": "decoders parked for lack of free KV blocks",
    "kv_preempted": "parked requests preempted (recomputed) to make KV room for the decoders",
    "released": "parked requests released because a step scheduled nothing",
    "recomputed_tokens": "computed tokens thrown away by the plug-in's preemptions",
    "plp_updates": "PLP remaining-length re-estimates",
    "head_s": "seconds spent applying the predictor's head",
    "policy_s": "seconds spent choosing decoders",
    "steps": "scheduler steps",
}
"""The scheduler's ``lenpred_counters`` keys exported, with their help text."""


def metric_name(key: str) -> str:
    """``lenpred_<key>`` (``*_s`` keys become ``*_seconds``); ``prometheus_client`` adds the counters' ``_total``."""
    return f"lenpred_{key[:-2] + '_seconds' if key.endswith('_s') else key}"


class PluginMetrics:
    """Mirror of the scheduler's counters as Prometheus counters (``prometheus_client``, multiprocess mode).

    ``enabled`` is false unless ``PROMETHEUS_MULTIPROC_DIR`` names a directory (see the module docstring);
    :meth:`update` then does nothing.
    """

    def __init__(self):
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self.enabled = bool(directory) and os.path.isdir(directory)
        self._last: dict[str, float] = {}
        if not self.enabled:
            logger.info("lenpred: counters go to the scheduler log only; start vllm serve with "
                        "PROMETHEUS_MULTIPROC_DIR=<empty dir> to see them in /metrics")
            return
        from prometheus_client import Counter

        # registry=None: in multiprocess mode the values live in the directory, whoever collects them
        self._counters = {k: Counter(metric_name(k), doc, registry=None) for k, doc in COUNTERS.items()}

    def update(self, counters: dict) -> None:
        """Add to each Prometheus counter what ``counters`` (the scheduler's running totals) gained since the last
        call."""
        if not self.enabled:
            return
        for key, metric in self._counters.items():
            value = float(counters.get(key, 0))
            delta = value - self._last.get(key, 0.0)
            if delta > 0:
                metric.inc(delta)
            self._last[key] = value
