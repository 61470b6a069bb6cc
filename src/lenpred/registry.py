"""The one registry helper: :func:`registrar` makes the ``register(name)`` decorator of every registry in lenpred
(predictors, input providers, scheduling policies, parked policies), so each refuses a name registered twice
(lm-evaluation-harness's ``lm_eval/api/registry.py`` does the same)."""

from __future__ import annotations

from typing import Any, Callable

from lenpred.errors import LenpredError


def registrar(registry: dict[str, Any], kind: str, name_attr: str | None = "name") -> Callable:
    """A ``register(name)`` decorator for ``registry``: it adds the decorated class or function under ``name`` and,
    with ``name_attr``, sets that attribute of it to ``name``.

    Args:
        registry: the dict of registered objects by name (filled in registration order; an entry may be pre-set to
            ``None`` as a placeholder that a registration fills).
        kind: what is registered, for the error message (``"policy"``, ``"predictor"``, ...).
        name_attr: the attribute that records the registered name on the object (``None``: none).

    The decorator raises :class:`LenpredError` when ``name`` already holds an object (a second one would silently
    replace the first), naming both.
    """
    def register(name: str):
        def wrap(obj):
            if registry.get(name) is not None:
                raise LenpredError(f"{kind} name '{name}' is already registered by {registry[name].__qualname__}: "
                                   f"register {obj.__qualname__} under another name")
            if name_attr is not None:
                setattr(obj, name_attr, name)
            registry[name] = obj
            return obj
        return wrap
    return register
