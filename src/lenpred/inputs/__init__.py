"""Input providers: one per input a predictor may read (``Predictor.inputs``).

A provider fills the :class:`lenpred.predictors.Request` field of its name for the prompts that need it and returns
values the tuner may pass on (e.g. PiA's tokens-per-word ratio). ``text`` and ``scenario`` come with the prompt
itself (no provider). Adding an input is one registered function.
"""

from __future__ import annotations

from typing import Any, Callable

from lenpred.errors import LenpredError

PROVIDERS: dict[str, Callable[..., dict[str, Any]] | None] = {"text": None, "scenario": None}


def register_provider(name: str):
    """Function decorator adding a provider ``fn(backbone, data, settings) -> values`` under ``name``."""
    def wrap(fn):
        PROVIDERS[name] = fn
        return fn
    return wrap


def provide_inputs(needs: set[str], backbone, data, settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """Run the provider of every needed input; returns ``(values, seconds per input)``.

    Args:
        needs: input names (union of the chosen predictors' ``inputs``).
        backbone: the serving model.
        data: a :class:`lenpred.dataset.EvalData`.
        settings: provider settings (``layers``, ``cache``, ``bench``).

    Raises:
        LenpredError: an input no provider produces.
    """
    import time

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


from lenpred.inputs import self_report, signals  # noqa: E402,F401  (registration side effect)
