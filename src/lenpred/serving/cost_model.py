"""A measured cost model of one engine on one machine: prefill time and decode-step time, fitted by least squares.

Form (the same for every engine; each term's coefficient is fitted, none assumed)::

    prefill_time_s(T, S)      = p0 + p1·T + p2·S          T = prompt tokens in the forward (padded: B·P_max),
                                                          S = Σ over rows of P² (attention's quadratic part)
    decode_step_time_s(B, C)  = d0 + d1·B + d2·C          B = sequences in the batch, C = Σ context tokens

The decode form is the one vLLM-style simulators use (Vidur, Agrawal et al. 2024; a decode step reads every
weight once — d0 — plus per-sequence work — d1 — plus KV-cache reads proportional to the context — d2).

Interface kept stable for every engine (transformers here, vLLM in part B)::

    model = CostModel.fit(measurements, engine="transformers", hardware=hardware_description())
    model.save("results/scheduling/cost_transformers.json"); CostModel.load(path)

``measurements`` is a list of dicts, one timed run each, with keys ``batch_size`` (B), ``prompt_tokens`` (list of
each row's prompt length as the forward saw it: padded rows count at the padded length), ``num_new_tokens`` (L,
tokens generated per row: 1 = prefill only; the run is 1 prefill + L − 1 decode steps at growing context) and
``wall_s``. For measurements of single steps, pass ``num_new_tokens`` 1 (prefill) or give ``kind="decode"`` with
``context_tokens`` (C) and ``batch_size`` (one decode step).
"""

from __future__ import annotations

import json
import math
import numbers
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError
from lenpred.io import write_json

COEFFICIENTS = ("p0", "p1", "p2", "d0", "d1", "d2")
PACE_BOUNDS = (0.5, 2.0)
"""The pace scales :func:`fit_pace` searches (the engine at half to twice a cost model's step times)."""


def hardware_description(engine_versions: dict[str, str] | None = None) -> dict:
    """CPU model, core count, torch threads, OS and library versions (what the cost model was measured on)."""
    import os

    import torch
    import transformers

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu_model": cpu, "cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, **(engine_versions or {})}


def run_features(batch_size: int, prompt_tokens: list[int], num_new_tokens: int) -> np.ndarray:
    """``(6,)`` regressors of one generate run under the model form (module docstring): the run is one prefill
    of every row's prompt and ``L − 1`` decode steps; at decode step ``k`` (1..L−1) row ``i`` attends over
    ``P_i + k`` tokens."""
    B, L = batch_size, num_new_tokens
    P = np.asarray(prompt_tokens, dtype=np.float64)
    steps = L - 1
    context = steps * P.sum() + B * steps * (steps + 1) / 2  # Σ_k Σ_i (P_i + k)
    return np.array([1.0, P.sum(), (P ** 2).sum(), steps, steps * B, context])


def decode_features(batch_size: int, context_tokens: float) -> np.ndarray:
    """``(6,)`` regressors of one decode step."""
    return np.array([0.0, 0.0, 0.0, 1.0, batch_size, context_tokens])


def _design(measurements: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    rows, y = [], []
    for m in measurements:
        if m.get("kind") == "decode":
            rows.append(decode_features(m["batch_size"], m["context_tokens"]))
        else:
            if len(m["prompt_tokens"]) != m["batch_size"]:
                raise LenpredError(f"measurement has batch_size {m['batch_size']} but {len(m['prompt_tokens'])} "
                                   "prompt lengths: give one per row")
            rows.append(run_features(m["batch_size"], m["prompt_tokens"], m["num_new_tokens"]))
        y.append(m["wall_s"])
    return np.array(rows), np.array(y)


@dataclass
class CostModel:
    """Fitted prefill / decode-step times of one engine on one machine (seconds).

    Attributes:
        engine: ``transformers`` or ``vllm`` (or another engine's name).
        coefficients: ``{p0, p1, p2, d0, d1, d2}`` in seconds, seconds/token, seconds/token², seconds/step,
            seconds/sequence, seconds/context-token (module docstring).
        hardware: :func:`hardware_description` of the machine it was measured on.
        fit_stats: relative errors of the fit (in-sample and leave-one-out), number of measurements.
        fused_prefill: the engine runs prefill inside the decode step (vLLM): a step's time is the decode step's
            plus ``p1·T + p2·S`` without a second ``p0``. ``False`` (transformers): separate forwards.
        settings: how it was measured (grid, repeats).
    """

    engine: str
    coefficients: dict[str, float]
    hardware: dict = field(default_factory=dict)
    fit_stats: dict = field(default_factory=dict)
    fused_prefill: bool = False
    settings: dict = field(default_factory=dict)

    @classmethod
    def fit(cls, measurements: list[dict], engine: str, hardware: dict | None = None, fused_prefill: bool = False,
            settings: dict | None = None, relative: bool = True) -> "CostModel":
        """Non-negative least squares (``scipy.optimize.nnls``) of the model form on the measurements; with
        ``relative`` each run is weighted by ``1 / wall_s`` so short and long runs count alike in relative error.

        Raises:
            LenpredError: fewer measurements than coefficients.
        """
        from scipy.optimize import nnls

        X, y = _design(measurements)
        if len(y) < len(COEFFICIENTS):
            raise LenpredError(f"{len(y)} measurements cannot fit {len(COEFFICIENTS)} coefficients: measure at least "
                               f"{len(COEFFICIENTS)} (batch size, prompt length, new tokens) points")
        w = 1.0 / y if relative else np.ones_like(y)
        coef, _ = nnls(X * w[:, None], y * w)
        loo = []
        for i in range(len(y)):  # leave-one-out relative error: how well it predicts an unseen run
            keep = np.arange(len(y)) != i
            c, _ = nnls(X[keep] * w[keep, None], y[keep] * w[keep])
            loo.append(abs(X[i] @ c - y[i]) / y[i])
        rel = np.abs(X @ coef - y) / y
        stats = {"num_measurements": int(len(y)), "mean_rel_error": float(rel.mean()),
                 "max_rel_error": float(rel.max()), "loo_mean_rel_error": float(np.mean(loo)),
                 "loo_max_rel_error": float(np.max(loo))}
        return cls(engine, dict(zip(COEFFICIENTS, map(float, coef))), hardware or {}, stats, fused_prefill,
                   settings or {})

    def prefill_time_s(self, prompt_tokens: list[int] | np.ndarray) -> float:
        """Seconds of one prefill forward over rows of these prompt lengths (padded rows at the padded length)."""
        c, P = self.coefficients, np.asarray(prompt_tokens, dtype=np.float64)
        return c["p0"] + c["p1"] * P.sum() + c["p2"] * (P ** 2).sum()

    def decode_step_time_s(self, batch_size: int, context_tokens: float) -> float:
        """Seconds of one decode step of ``batch_size`` sequences holding ``context_tokens`` in total."""
        c = self.coefficients
        return c["d0"] + c["d1"] * batch_size + c["d2"] * context_tokens

    def decode_steps_time_s(self, batch_size: int, context_tokens: float, num_steps: int) -> float:
        """Seconds of ``num_steps`` consecutive decode steps of a fixed batch whose total context grows by
        ``batch_size`` per step, starting at ``context_tokens`` (closed form of the sum)."""
        c, k = self.coefficients, num_steps
        return k * (c["d0"] + c["d1"] * batch_size) + c["d2"] * (k * context_tokens + batch_size * k * (k - 1) / 2)

    def generate_time_s(self, prompt_tokens: list[int], num_new_tokens: int) -> float:
        """Seconds of one static batch: prefill + ``L − 1`` decode steps (``run_features`` · coefficients)."""
        feats = run_features(len(prompt_tokens), prompt_tokens, num_new_tokens)
        return float(feats @ np.array([self.coefficients[k] for k in COEFFICIENTS]))

    def with_streaming_overhead(self, s_per_token: float) -> "CostModel":
        """A copy whose decode step costs ``s_per_token`` seconds more per sequence (``d1 + s_per_token``): the work
        an OpenAI-compatible server does for every token it streams (detokenize, one SSE chunk per token) when its
        process shares the engine's core, which a cost model measured on the bare engine (``vllm.LLM``) lacks.

        ``settings["streaming_overhead_s_per_token"]`` holds the total added (applied twice, the two add up).

        Raises:
            LenpredError: an overhead that is negative or not a finite number.
        """
        if (isinstance(s_per_token, bool) or not isinstance(s_per_token, numbers.Real)
                or not 0 <= s_per_token < math.inf):
            raise LenpredError(f"streaming overhead must be a finite number >= 0 s per token, got {s_per_token!r}")
        total = self.settings.get("streaming_overhead_s_per_token", 0.0) + s_per_token
        settings = {**self.settings, "streaming_overhead_s_per_token": total}
        return CostModel(self.engine, {**self.coefficients, "d1": self.coefficients["d1"] + s_per_token},
                         self.hardware, self.fit_stats, self.fused_prefill, settings)

    def with_pace(self, scale: float) -> "CostModel":
        """A copy of the same engine ``scale`` times slower: every step time (prefill and decode, each coefficient)
        times ``scale``. The engine's pace drifts over hours (a run's own pace against the one the model was measured
        at); near capacity a small drift moves queueing a lot, so the simulator calibrated on one measured run at its
        pace predicts the other runs of that sitting better than at the model's (:func:`lenpred.studies.queue_report.
        fit_run_pace`). ``settings["pace_scale"]`` holds the product of the scales applied; a streaming overhead
        already added (:meth:`with_streaming_overhead`, part of ``d1``) scales with it, and so does its record.

        Raises:
            LenpredError: a scale that is not a finite number > 0 (a string included).
        """
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < math.inf:
            raise LenpredError(f"pace scale must be a finite number > 0, got {scale!r}")
        settings = {**self.settings, "pace_scale": self.settings.get("pace_scale", 1.0) * scale}
        if "streaming_overhead_s_per_token" in settings:
            settings["streaming_overhead_s_per_token"] *= scale
        return CostModel(self.engine, {k: v * scale for k, v in self.coefficients.items()}, self.hardware,
                         self.fit_stats, self.fused_prefill, settings)

    def save(self, path: str | Path) -> None:
        """Write as JSON (atomically)."""
        write_json(path, asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        """Read a JSON written by :meth:`save`.

        Raises:
            LenpredError: missing, not a cost model, or a coefficient missing or not a finite number.
        """
        if not Path(path).is_file():
            raise LenpredError(f"cost model {path} does not exist: give the JSON a calibration wrote "
                               "(`lenpred schedule calibrate`, or scripts/decode_knee.py for vLLM)")
        try:
            data = json.loads(Path(path).read_text())
            missing = set(COEFFICIENTS) - set(data["coefficients"])
            if missing:
                raise KeyError(f"coefficients lack {', '.join(sorted(missing))}")
            bad = [k for k in COEFFICIENTS if isinstance(data["coefficients"][k], bool)
                   or not isinstance(data["coefficients"][k], numbers.Real) or not math.isfinite(data["coefficients"][k])]
            if bad:
                raise ValueError(f"coefficients {', '.join(bad)} are not finite numbers")
            return cls(**data)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LenpredError(f"{path} is not a lenpred cost model ({exc}): run `lenpred schedule calibrate` (or "
                               "scripts/decode_knee.py for vLLM)") from None


def fit_pace(cost: CostModel, mean_jct_s, measured_s: float) -> float | None:
    """The engine's pace during one measured run, against ``cost``'s: the scale ``f`` (:meth:`CostModel.with_pace`)
    at which ``mean_jct_s(cost.with_pace(f))``, a simulation of that run, equals its measured mean JCT
    ``measured_s`` (seconds); ``scipy.optimize.brentq`` on the log of their ratio in :data:`PACE_BOUNDS`, to 0.001.
    Near capacity a pace 10 % off moves the mean JCT by 30-40 %, so a replay calibrated this way follows the engine of
    that hour rather than the one the model was measured on. ``None``: no scale in the bounds matches.

    Args:
        cost: the cost model to scale.
        mean_jct_s: ``CostModel -> float``, the simulated mean JCT (s) of the run under a cost model.
        measured_s: the run's measured mean JCT, s (not > 0 and finite: ``None``).
    """
    from scipy.optimize import brentq

    if not 0 < measured_s < math.inf:  # nothing a pace can match (a log whose requests all took 0 s)
        return None

    def gap(f: float) -> float:
        return float(np.log(mean_jct_s(cost.with_pace(f)) / measured_s))

    try:
        return float(brentq(gap, *PACE_BOUNDS, xtol=1e-3))
    except ValueError:  # the same sign at both bounds: no scale in them matches
        return None
