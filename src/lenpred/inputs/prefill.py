"""The ``signals`` input: the serving model's prefill signals (hidden states, entropy, attention received) of every
prompt, from the benchmark's cache (:func:`provide_signals`) or a fresh full prefill (:func:`attach_signals`). Named
apart from :mod:`lenpred.signals`, which computes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lenpred.backbone import cache_dir
from lenpred.inputs.registry import register_provider
from lenpred.io import stable_hash


def signal_cache_path(backbone, bench: str | Path, layers: tuple[int, ...]) -> Path:
    """Default cache directory of a benchmark's signals: under ``$LENPRED_CACHE/signals``, keyed by the benchmark
    name, the model revision, the layers and the cache format (a new format never mixes with an old one)."""
    from lenpred.inputs.cache import CACHE_FORMAT

    return cache_dir() / "signals" / f"{Path(bench).name}-{backbone.revision}-{stable_hash([layers, CACHE_FORMAT], 8)}"


@register_provider("signals")
def provide_signals(backbone, data, settings: dict[str, Any]) -> dict[str, Any]:
    """Extract (or read from the cache) the signals of every prompt at ``settings["layers"]`` and set
    ``Request.signals``. Returns no values."""
    from lenpred.inputs.cache import extract_cached

    layers = settings["layers"]
    cache = Path(settings["cache"]) if settings.get("cache") else signal_cache_path(backbone, settings["bench"], layers)
    signals = extract_cached(backbone, {p: r.token_ids for p, r in data.by_prompt.items()}, layers, cache)
    for p, r in data.by_prompt.items():
        r.signals = signals[p]
    return {}


def attach_signals(backbone, requests: list, layers: tuple[int, ...], semantic: bool, batch_tokens: int = 4096,
                   progress: bool = False) -> None:
    """Set each :class:`lenpred.predictors.Request`'s ``signals`` from the full prefill (no cache): hidden states at
    ``layers``, token entropy, and the last layer's attention when ``semantic``, prompts grouped by length into
    batches of at most ``batch_tokens`` padded tokens (:func:`lenpred.signals.extract_signals`)."""
    from tqdm.auto import tqdm

    from lenpred.inputs.cache import token_batches
    from lenpred.signals import extract_signals

    batches = token_batches([r.num_prompt_tokens for r in requests], batch_tokens)
    for batch in tqdm(batches, desc="prefill signals", unit="batch", disable=not progress):
        signals = extract_signals(backbone, [requests[i].token_ids for i in batch], layers, semantic)
        for i, s in zip(batch, signals):
            requests[i].signals = s
