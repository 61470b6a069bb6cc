"""The input-provider registry: :data:`PROVIDERS`, :func:`register_provider` and :func:`provide_inputs`
(:mod:`lenpred.inputs` describes the providers)."""

from __future__ import annotations

import time
from typing import Any, Callable

from lenpred.errors import LenpredError
from lenpred.registry import registrar

PROVIDERS: dict[str, Callable[..., dict[str, Any]] | None] = {"text": None, "scenario": None}


register_provider = registrar(PROVIDERS, "input provider", name_attr=None)
"""Function decorator adding a provider ``fn(backbone, data, settings) -> values`` under ``name``; a name that
already has a provider is a :class:`LenpredError`."""


def provide_inputs(needs: set[str], backbone, data, settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """Run the provider of every needed input; returns ``(values, seconds per input)``.

    Args:
        needs: input names (:func:`lenpred.predictors.required_inputs` of the chosen predictors).
        backbone: the serving model.
        data: a :class:`lenpred.dataset.EvalData`.
        settings: provider settings (``layers``, ``cache``, ``bench``).

    Raises:
        LenpredError: an input no provider produces.
    """
    unknown = sorted(needs - set(PROVIDERS))
    if unknown:
        raise LenpredError(f"no provider for inputs {unknown}; known inputs: {', '.join(sorted(PROVIDERS))}")
    values, seconds = {}, {}
    for name in sorted(needs):
        if PROVIDERS[name] is None:
            continue
        t = time.perf_counter()
        values.update(PROVIDERS[name](backbone, data, settings))
        seconds[name] = time.perf_counter() - t
    return values, seconds
