"""Online progressive prediction: the per-request state a serving loop holds, and the batched update.

A scheduler calls :func:`start_states` once per request after its prefill (the prompt representation and the
last prompt token's state at PLP's layer come from the prefill signals) and :func:`update_batch` every ``k``
decode steps with the current token's state at that layer for each running request. Each call returns the expected
remaining tokens. Cost: one forward of the small PLP head (``lenpred progressive`` measures it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lenpred.errors import LenpredError
from lenpred.heads import head_from_tensors, head_tensors
from lenpred.io import atomic_path
from lenpred.predictors.progressive import PLPHead


@dataclass
class RequestState:
    """What a serving loop keeps per running request.

    Attributes:
        prompt_features: ``(d_p,)`` float32, the prompt representation (fixed after the prefill).
        max_new_tokens: the request's cap in tokens (``inf``: none).
        remaining: the latest estimate of the remaining tokens.
        step: tokens generated when ``remaining`` was estimated.
    """

    prompt_features: np.ndarray
    max_new_tokens: float
    remaining: float
    step: int = 0

    @property
    def expected_total(self) -> float:
        """``step + remaining``: the expected observed output length in tokens."""
        return self.step + self.remaining


def update_batch(plp: PLPHead, states: list[RequestState], steps: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """Re-estimate the remaining length of ``B`` running requests in one head forward.

    Args:
        plp: a fitted :class:`PLPHead`.
        states: the requests' :class:`RequestState` (updated in place).
        steps: ``(B,)`` tokens each has generated.
        hidden: ``(B, d)`` float32, hidden state at PLP's layer of each request's current token (the state the engine
            computed when it consumed the ``step``-th generated token; the last prompt token at step 0).

    Returns:
        ``(B,)`` float64 expected remaining tokens, in ``[0, max_new_tokens - step]``.

    Raises:
        LenpredError: shapes disagree (also a hidden size other than the head's), non-finite states, or a step
            past the cap.
    """
    steps = np.asarray(steps, dtype=np.int64)
    hidden = np.asarray(hidden, dtype=np.float32)
    if hidden.ndim != 2 or len(hidden) != len(states) or steps.shape != (len(states),):
        raise LenpredError(f"update_batch needs {len(states)} states, steps ({len(states)},) and hidden "
                           f"({len(states)}, d); got steps {steps.shape}, hidden {hidden.shape}")
    width = plp.head_.n_features_in_ - len(states[0].prompt_features) - 1 if states else hidden.shape[1]
    if hidden.shape[1] != width:
        raise LenpredError(f"hidden states have {hidden.shape[1]} features, this PLP head reads {width}: pass the "
                           "current token's hidden state at the head's layer (progressive_info_['plp_layer'])")
    if not np.isfinite(hidden).all():
        raise LenpredError("hidden states hold NaN or inf: pass the engine's finite hidden states")
    caps = np.array([s.max_new_tokens for s in states], dtype=np.float64)
    if (steps < 0).any() or (steps > caps).any():
        raise LenpredError("a step is negative or past the request's max_new_tokens")
    prompt = np.stack([s.prompt_features for s in states])
    remaining = np.clip(plp.predict(prompt, hidden, steps, caps), 0.0, caps - steps)
    for s, t, r in zip(states, steps, remaining):
        s.step, s.remaining = int(t), float(r)
    return remaining


def start_states(plp: PLPHead, prompt_features: np.ndarray, plp_states: np.ndarray,
                 caps: np.ndarray) -> list[RequestState]:
    """The states of ``B`` requests after their prefill (step 0): ``prompt_features`` ``(B, d_p)``, ``plp_states``
    ``(B, d)`` (each last prompt token's state at PLP's layer), ``caps`` ``(B,)`` (``inf``: none)."""
    states = [RequestState(np.asarray(f, np.float32), float(c), 0.0) for f, c in zip(prompt_features, caps)]
    update_batch(plp, states, np.zeros(len(states), np.int64), plp_states)
    return states


def save_plp(plp: PLPHead, path: str | Path, info: dict) -> None:
    """Write a fitted PLP head (safetensors; ``info`` — e.g. the prompt representation and layers — in its
    metadata), atomically."""
    from safetensors.torch import save_file

    tensors, state = head_tensors(plp.head_)
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
                  metadata={"kind": "plp", "head": json.dumps(state), "info": json.dumps(info)})


def load_plp(path: str | Path, prompt: str | None = None, model_revision: str | None = None) -> tuple[PLPHead, dict]:
    """Read :func:`save_plp`'s file: ``(head, info)``; with ``prompt`` (``method@layer``) and ``model_revision``, the
    head must read that prompt representation of that model (what ``LengthPredictor.attach_progressive`` asks).

    Raises:
        LenpredError: unreadable, not a PLP head, or trained on another prompt representation or model revision."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path))
        if meta.get("kind") != "plp":
            raise KeyError("kind")
        state, info = json.loads(meta["head"]), json.loads(meta["info"])
    except (OSError, KeyError, ValueError, RuntimeError, SafetensorError) as exc:
        raise LenpredError(f"{path} is not a readable PLP head ({type(exc).__name__}); rerun `lenpred progressive`") from None
    if prompt is not None and (info.get("prompt") != prompt or info.get("model_revision") != model_revision):
        raise LenpredError(f"{path} reads prompt representation {info.get('prompt')} of model revision "
                           f"{info.get('model_revision')}, this predictor is {prompt} on {model_revision}: "
                           "train the PLP head on this predictor's representation (`lenpred progressive`)")
    plp = PLPHead(state["config"], state["seed"])
    plp.head_ = head_from_tensors(tensors, state)
    return plp, info


def update_cost(plp: PLPHead, prompt_features: np.ndarray, hidden: np.ndarray, steps: np.ndarray, caps: np.ndarray,
                batch_sizes: tuple[int, ...] = (1, 8, 64), repeats: int = 200) -> dict:
    """Wall-clock cost of :func:`update_batch` for running batches of ``batch_sizes`` requests: the median over
    ``repeats`` calls after a warm-up, in microseconds per call and per request (``{"batch<B>_us": ...,
    "batch<B>_per_request_us": ...}``). Rows of the inputs (``(n, d_p)``, ``(n, d)``, ``(n,)``, ``(n,)``) are
    reused cyclically. Measure on an idle machine with the thread count a serving loop would give it."""
    out = {}
    for b in batch_sizes:
        idx = np.arange(b) % len(steps)
        states = [RequestState(prompt_features[i], float(caps[i]), 0.0) for i in idx]
        update_batch(plp, states, steps[idx], hidden[idx])
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            update_batch(plp, states, steps[idx], hidden[idx])
            times.append(time.perf_counter() - t)
        us = float(np.median(times) * 1e6)
        out[f"batch{b}_us"], out[f"batch{b}_per_request_us"] = us, us / b
    return out
