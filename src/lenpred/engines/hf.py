"""transformers sampling engine: one request at a time with its own seed (exact, CPU-friendly fallback)."""

from __future__ import annotations

from lenpred.engines import SampleRequest, SampleResult, strip_eos


class TransformersEngine:
    """Ancestral sampling with ``model.generate``, seeding torch per request.

    Requests run one by one: no padding waste, and each result depends only on its own seed
    (batched ``generate`` cannot take per-request seeds). On 2 CPU cores this is several times
    slower than vLLM; use it for small builds and tests.
    """

    name = "transformers"

    def __init__(self, model_dir: str, eos_token_ids: tuple[int, ...], model=None):
        import torch
        from transformers import AutoModelForCausalLM

        self.eos_token_ids = tuple(eos_token_ids)
        self.model = model if model is not None else AutoModelForCausalLM.from_pretrained(model_dir,
                                                                                         dtype=torch.float32)
        self.model.eval()

    def generate(self, requests: list[SampleRequest]) -> list[SampleResult]:
        import torch
        from transformers import set_seed

        results = []
        for req in requests:
            set_seed(req.seed)
            ids = torch.tensor([req.prompt_token_ids])
            with torch.inference_mode():
                out = self.model.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=req.temperature,
                    top_p=1.0, top_k=0, max_new_tokens=req.max_new_tokens, eos_token_id=list(self.eos_token_ids),
                    pad_token_id=self.eos_token_ids[0])
            new = out[0, ids.shape[1]:].tolist()
            cut = next((i + 1 for i, t in enumerate(new) if t in self.eos_token_ids), len(new))
            token_ids, reason = strip_eos(new[:cut], self.eos_token_ids)
            results.append(SampleResult(token_ids, reason))
        return results
