"""The sampling engines' contract: request and result records, the engine protocol, the vLLM engine's options and
the length / stop rules both engines apply (:mod:`lenpred.engines` describes them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

from lenpred.errors import LenpredError
from lenpred.prompts import check_fits


@dataclass(frozen=True)
class SampleRequest:
    """One sampling request.

    Attributes:
        prompt_token_ids: chat-formatted prompt, ending with the assistant cue.
        seed: per-request sampling seed (never shared: a shared seed makes every sample of a prompt
            identical in vLLM).
        temperature: softmax temperature (> 0).
        max_new_tokens: generation cap; hitting it gives ``finish_reason == "length"``.
        top_p: nucleus mass kept; 1.0 = off.
        top_k: most likely tokens kept; 0 = off.
        min_p: tokens below ``min_p`` x the top probability dropped; 0.0 = off.
        repetition_penalty: CTRL-style penalty on tokens already in prompt or output; 1.0 = off.
        The defaults are pure ancestral sampling, what every benchmark of this project uses.
    """

    prompt_token_ids: tuple[int, ...]
    seed: int
    temperature: float
    max_new_tokens: int
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def sampling_params(self) -> dict[str, float | int]:
        """The effective sampling parameters as stored in benchmark records (:data:`SAMPLING_FIELDS`)."""
        d = asdict(self)
        return {k: d[k] for k in SAMPLING_FIELDS}


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")
"""Every parameter that decides what a sampler draws; both engines apply these and nothing else."""


@dataclass(frozen=True)
class SampleResult:
    """What the model generated for one request.

    Attributes:
        response_token_ids: generated ids, stop token excluded.
        finish_reason: ``"stop"`` (a stop token was emitted) or ``"length"`` (hit ``max_new_tokens``; censored).
        stop_token_id: the stop token that ended the response (``None`` when ``finish_reason == "length"``).
    """

    response_token_ids: tuple[int, ...]
    finish_reason: str
    stop_token_id: int | None = None

    @property
    def num_output_tokens(self) -> int:
        """Output length in tokens, stop token excluded."""
        return len(self.response_token_ids)


class Engine(Protocol):
    """A sampling engine: ``generate`` returns one result per request, in order.

    Attributes:
        name: engine name stored in the records.
        context_window: most tokens (prompt + output) one sequence may hold.
    """

    name: str
    context_window: int

    def generate(self, requests: list[SampleRequest]) -> list[SampleResult]: ...


ENGINES = ("transformers", "vllm")


@dataclass
class VLLMOptions:
    """How much of the machine the vLLM engine takes, and how it is laid out (ignored by ``transformers``).

    Attributes:
        kv_cache_space_gib: KV-cache size in GiB, reserved at start-up (``kv_cache_memory_bytes``; on the CPU
            build the same as ``VLLM_CPU_KVCACHE_SPACE``). Setting it skips vLLM's start-up check that
            ``gpu_memory_utilization`` x total memory is free, which refuses to start on a machine where other
            work holds memory. 2 GiB holds ~46k tokens of SmolLM2-135M (fp32, 30 layers x 3 KV heads x 64 x 2 x
            4 bytes = 45 KiB per token): dozens of concurrent sequences. ``None``: vLLM sizes it from
            ``gpu_memory_utilization`` (or ``$VLLM_CPU_KVCACHE_SPACE`` if set).
        gpu_memory_utilization: share of the device's memory vLLM may take (on the CPU build: of the host's
            memory, despite the name); ``None`` = vLLM's default (0.9 GPU, 0.92 CPU).
        cpu_threads_bind: ``VLLM_CPU_OMP_THREADS_BIND`` of the CPU build: ``"auto"`` (vLLM's default: one
            thread per core, bound), ``"nobind"`` (let the OS place threads: better when other work shares the
            cores) or a core list such as ``"0-1"``; ``None`` keeps the environment's value.
        cpu_reserved_cores: ``VLLM_CPU_NUM_OF_RESERVED_CPU``: cores kept for vLLM's scheduler process
            instead of model threads; ``None`` = the environment's value, else 0 (on 2 cores, 0 gave 211 vs
            128 output tok/s).
        max_model_len: tokens per sequence (prompt + output); ``None`` = the model's context window.
        enforce_eager: skip torch.compile (start-up 30 s instead of ~2 min; ~4 % slower decoding on CPU).
        dtype: weight dtype; float32 on CPUs without AVX-512 BF16 (bf16 is slower there).
        max_num_seqs: most sequences decoded together.
    """

    kv_cache_space_gib: float | None = 2.0
    gpu_memory_utilization: float | None = None
    cpu_threads_bind: str | None = None
    cpu_reserved_cores: int | None = None
    max_model_len: int | None = None
    enforce_eager: bool = True
    dtype: str = "float32"
    max_num_seqs: int = 128

    def __post_init__(self):
        if self.kv_cache_space_gib is not None and not self.kv_cache_space_gib > 0:
            raise LenpredError(f"kv_cache_space_gib (--kv-cache-space-gib) must be > 0, got {self.kv_cache_space_gib}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise LenpredError("gpu_memory_utilization (--gpu-memory-utilization) must be in (0, 1], got "
                               f"{self.gpu_memory_utilization}")
        if self.cpu_reserved_cores is not None and self.cpu_reserved_cores < 0:
            raise LenpredError(f"cpu_reserved_cores (--cpu-reserved-cores) must be >= 0, got {self.cpu_reserved_cores}")
        if self.cpu_threads_bind is not None and not self.cpu_threads_bind.strip():
            raise LenpredError("cpu_threads_bind (--cpu-threads-bind) must be 'auto', 'nobind' or a core list "
                               "such as '0-1'")
        if (self.max_model_len is not None and self.max_model_len < 1) or self.max_num_seqs < 1:
            raise LenpredError("max_model_len and max_num_seqs must be >= 1")


def model_context_window(model_dir: str) -> int:
    """Context window of the model in ``model_dir``, in tokens: ``max_position_embeddings`` of its config
    (2048 when the config has none, as :attr:`lenpred.backbone.Backbone.context_window`).

    Raises:
        LenpredError: the directory holds no readable model config.
    """
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as exc:
        raise LenpredError(f"cannot read the model config in {model_dir} ({type(exc).__name__}): point --model at a "
                           "directory written by save_pretrained") from None
    return int(getattr(config, "max_position_embeddings", None) or 2048)


def check_requests(requests: list[SampleRequest], context_window: int) -> None:
    """The one length rule for every request of a batch, before anything is generated.

    Raises:
        LenpredError: an empty prompt, or a prompt whose ``num_prompt_tokens + max_new_tokens`` exceeds
            ``context_window`` (the message names the request's index and the numbers).
    """
    for i, r in enumerate(requests):
        check_fits(len(r.prompt_token_ids), r.max_new_tokens, context_window, what=f"prompt (request {i})")


def cut_at_stop(token_ids: list[int], stop_token_ids: tuple[int, ...]) -> SampleResult:
    """The response up to its first stop token (excluded), the finish reason and which token stopped it.

    A response ends with ``"stop"`` iff it contains a stop token; otherwise it hit the cap (``"length"``).
    """
    stops = set(stop_token_ids)
    for i, t in enumerate(token_ids):
        if t in stops:
            return SampleResult(tuple(int(x) for x in token_ids[:i]), "stop", int(t))
    return SampleResult(tuple(int(x) for x in token_ids), "length", None)
