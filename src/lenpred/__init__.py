"""lenpred: predict how many tokens an LLM will generate from its own prefill signals.

The public face: :class:`LengthPredictor` (train, save, load, predict), :class:`LengthPrediction` (one request's
prediction with its interval), :func:`load_backbone` (the serving model) and :class:`LenpredError`. Heavy modules
(torch, transformers) load on first use, so bad input is reported before they import.
"""

from lenpred.errors import LenpredError
from lenpred.version import __version__  # noqa: F401  (lenpred.__version__)

__all__ = ["LengthPredictor", "LengthPrediction", "load_backbone", "LenpredError"]


def __getattr__(name: str):
    if name in ("LengthPredictor", "LengthPrediction"):
        from lenpred import pipeline

        return getattr(pipeline, name)
    if name == "load_backbone":
        from lenpred.backbone import load_backbone

        return load_backbone
    raise AttributeError(f"module 'lenpred' has no attribute {name!r}")
