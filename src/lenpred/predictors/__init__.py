"""Length predictors: estimators over per-prompt prefill signals, registered by name.

Every predictor follows the scikit-learn contract on a list of :class:`lenpred.signals.PromptSignals`
(one per sample; samples of the same prompt repeat its signals) and true lengths ``y`` in tokens:
``fit(signals, y) -> self``, ``predict(signals) -> (n,) float64 tokens``, ``save(path)`` and
``load(path)`` round-trip exactly. Adding one is one registered class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from lenpred.errors import LenpredError
from lenpred.io import atomic_path

PREDICTORS: dict[str, Callable[..., "Predictor"]] = {}


def register(name: str):
    """Class decorator adding a predictor to :data:`PREDICTORS` under ``name``."""
    def wrap(cls):
        PREDICTORS[name] = cls
        cls.registry_name = name
        return cls
    return wrap


def make_predictor(name: str, **params: Any) -> "Predictor":
    """Build a registered predictor.

    Raises:
        LenpredError: unknown name (the message lists the valid ones).
    """
    if name not in PREDICTORS:
        raise LenpredError(f"unknown predictor '{name}'; valid predictors: {', '.join(sorted(PREDICTORS))}")
    return PREDICTORS[name](**params)


class Predictor:
    """Base class: subclasses implement ``fit``/``predict`` and ``_get_state``/``_set_state``.

    ``params`` (constructor arguments) are JSON-able; the fitted state is a dict of numpy arrays /
    tensors, stored with safetensors (no pickle) next to a JSON header.
    """

    registry_name = "base"

    def __init__(self, **params: Any):
        self.params = params

    def fit(self, signals: list, y: np.ndarray) -> "Predictor":
        raise NotImplementedError

    def predict(self, signals: list) -> np.ndarray:
        raise NotImplementedError

    def _get_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        raise NotImplementedError

    def _set_state(self, tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> None:
        raise NotImplementedError

    def save(self, path: str | Path) -> None:
        """Write the fitted predictor to ``path`` (a safetensors file with a JSON header), atomically."""
        tensors, info = self._get_state()
        header = {"predictor": self.registry_name, "params": json.dumps(self.params), "info": json.dumps(info)}
        with atomic_path(path) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=header)

    @staticmethod
    def load(path: str | Path) -> "Predictor":
        """Read a predictor written by :meth:`save`.

        Raises:
            LenpredError: the file is missing, unreadable, or not a lenpred predictor.
        """
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
            tensors = load_file(str(path))
            name, params, info = header["predictor"], json.loads(header["params"]), json.loads(header["info"])
        except (OSError, KeyError, ValueError, RuntimeError, SafetensorError) as exc:
            raise LenpredError(f"{path} is not a readable lenpred predictor ({type(exc).__name__}); retrain it") from None
        predictor = make_predictor(name, **params)
        predictor._set_state(tensors, info)
        return predictor


def num_prompt_tokens(signals: list) -> np.ndarray:
    """``(n,)`` float64 prompt lengths in tokens, read off the signals."""
    return np.array([len(s.token_entropy) for s in signals], dtype=np.float64)


from lenpred.predictors import pooled, trivial  # noqa: E402,F401  (registration side effect)
