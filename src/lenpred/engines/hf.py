"""transformers sampling engine: one request at a time with its own seed (exact, CPU-friendly fallback)."""

from __future__ import annotations

from contextlib import contextmanager

from lenpred.engines.base import SampleRequest, SampleResult, check_requests, cut_at_stop


class TransformersEngine:
    """Ancestral sampling with ``model.generate``, seeding torch per request.

    Requests run one by one: no padding waste, and each result depends only on its own seed
    (batched ``generate`` cannot take per-request seeds). On 2 CPU cores this is several times
    slower than vLLM; use it for small builds and tests.

    ``generate`` fills every generation setting its caller leaves unset from the model's
    ``generation_config.json`` (e.g. ``repetition_penalty``, ``top_k``); this engine applies only the
    request's parameters (:data:`lenpred.engines.SAMPLING_FIELDS`) on top of the library's neutral defaults,
    as the vLLM engine does.

    Args:
        model_dir: model directory (read when ``model`` is not given).
        stop_token_ids: every token that ends the assistant's turn; generation stops at the first one.
        model: an already loaded causal LM (its ``generation_config`` is left as it is).
    """

    name = "transformers"

    def __init__(self, model_dir: str, stop_token_ids: tuple[int, ...], model=None):
        import torch
        from transformers import AutoModelForCausalLM

        self.stop_token_ids = tuple(stop_token_ids)
        self.model = model if model is not None else AutoModelForCausalLM.from_pretrained(model_dir,
                                                                                         dtype=torch.float32)
        self.model.eval()
        self.context_window = int(getattr(self.model.config, "max_position_embeddings", None) or 2048)

    def _generation_config(self, req: SampleRequest):
        """A complete generation config from the request alone (``top_k=0`` and ``min_p=None`` switch those off)."""
        from transformers import GenerationConfig

        return GenerationConfig(do_sample=True, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                                min_p=req.min_p or None, repetition_penalty=req.repetition_penalty,
                                max_new_tokens=req.max_new_tokens, eos_token_id=list(self.stop_token_ids),
                                pad_token_id=self.stop_token_ids[0])

    def generate(self, requests: list[SampleRequest]) -> list[SampleResult]:
        """One result per request, in order.

        Raises:
            LenpredError: an empty prompt or one that does not fit the context window with its
                ``max_new_tokens`` (checked for all requests before any is generated).
        """
        import torch
        from transformers import set_seed

        check_requests(requests, self.context_window)
        results = []
        with without_model_defaults(self.model):
            for req in requests:
                set_seed(req.seed)
                ids = torch.tensor([req.prompt_token_ids])
                with torch.inference_mode():
                    out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                              generation_config=self._generation_config(req))
                results.append(cut_at_stop(out[0, ids.shape[1]:].tolist(), self.stop_token_ids))
        return results


@contextmanager
def without_model_defaults(model):
    """Run ``model.generate`` with the library's neutral generation defaults instead of the model's
    ``generation_config.json`` (which ``generate`` uses for every field its caller leaves unset); restored after."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield model
    finally:
        model.generation_config = saved
