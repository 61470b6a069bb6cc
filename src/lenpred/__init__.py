"""lenpred: predict how many tokens an LLM will generate from its own prefill signals."""

from lenpred.errors import LenpredError

__all__ = ["LenpredError"]
__version__ = "0.1.0"
