"""The replayed stream's inputs: a benchmark's prompts with the shipped predictor's signals (layer-15 states only).

The shipped predictor (``last@15``) reads one vector per prompt, the final prompt token's hidden state at index 15.
:func:`stream_signals` extracts the signals of just that layer (no attention), through the one signal cache
(:func:`lenpred.inputs.cache.extract_cached`: content-addressed parts, so prompt subsets share one directory, a killed
run resumes and a run over more prompts reuses every part already there).
"""

from __future__ import annotations

from pathlib import Path

from lenpred.backbone import load_backbone
from lenpred.inputs.prefill import signal_cache_path

# torch modules (dataset, inputs.cache) are imported inside the functions.

STREAM_LAYERS = (15,)  # the shipped predictor's layer; its config.json says so (checked in stream_signals)


def stream_signals(data, backbone, cache: str | Path | None, prompt_ids: list[str], bench: str | Path,
                   progress: bool = True) -> None:
    """Set ``Request.signals`` (layer :data:`STREAM_LAYERS`, no attention) of ``prompt_ids`` in ``data.by_prompt``.

    Args:
        data: :class:`lenpred.dataset.EvalData`.
        backbone: the loaded model.
        cache: signal-cache directory (``None``: the benchmark's default one for these layers, under
            ``$LENPRED_CACHE/signals``).
        prompt_ids: which prompts (their order fixes the cache parts: keep it stable).
        bench: the benchmark directory (names the default cache).
    """
    from lenpred.inputs.cache import extract_cached

    cache = Path(cache) if cache else signal_cache_path(backbone, bench, STREAM_LAYERS)
    signals = extract_cached(backbone, {p: data.by_prompt[p].token_ids for p in prompt_ids}, STREAM_LAYERS, cache,
                             semantic=False, progress=progress)
    for p, s in signals.items():
        data.by_prompt[p].signals = s


def split_prompt_ids(data, split: str) -> list[str]:
    """The distinct prompt ids of ``split`` in first-appearance order (a stable order for the cache parts)."""
    seen: dict[str, None] = {}
    for p in data.cols["prompt_id"][data.index[split]]:
        seen.setdefault(str(p), None)
    return list(seen)


def prefetch(bench: str, split: str, chunk: int, num_chunks: int, data_dir: str | None = None,
             cache: str | None = None) -> None:
    """Extract chunk ``chunk`` of ``num_chunks`` of ``split``'s prompts into the signal cache (a background job runs
    this chunk by chunk, each under the CPU lock, so no hold is long; rerunning a chunk reads it back)."""
    from lenpred.dataset import load_eval_data

    backbone = load_backbone()
    data = load_eval_data(bench, backbone.tokenizer, data_dir)
    ids = split_prompt_ids(data, split)
    size = -(-len(ids) // num_chunks)
    # chunks are whole cache parts (32 prompts), so a chunk's parts are the parts the full list would make
    size = -(-size // 32) * 32
    stream_signals(data, backbone, cache, ids[chunk * size:(chunk + 1) * size], bench)
