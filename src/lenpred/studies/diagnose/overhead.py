"""What the prefill signals cost: wall time and peak memory of a serving prefill vs prefill + signals (+ pooling +
head), per batch size and prompt length, as ratios measured in one process.

Variants of one left-padded batch of ``B`` prompts of ``n`` tokens (random token ids: the cost does not depend on
the content), all from :mod:`lenpred.signals`:

* ``plain``: :func:`~lenpred.signals.plain_prefill` — SDPA, logits at the last position only (what a server runs);
* ``entropy_full``: :func:`~lenpred.signals.extract_signals` without attention — hidden states kept, the output head
  at every position and the full-vocabulary entropy (EGTP's signals);
* ``signals_full``: the same plus eager attention in the last layer for the semantic score (ESTP's signals);
* ``entropy_pruned`` / ``signals_pruned``: the same with the pruned output head (``entropy_vocab``,
  :mod:`lenpred.studies.diagnose.entropy`);
* ``pool_head``: pooling + the soft-label head on the extracted signals (timed separately: it does not touch the
  model), added to the signal variants for the end-to-end ratios.

Each variant is warmed up once, then run ``repeats`` times in interleaved rounds; the fastest run counts (the least
disturbed by other processes). Peak memory is the largest resident-set size sampled every 2 ms during the fastest
variant's runs, minus the resident size just before the call (MiB; CPU RSS includes allocator reuse, so it is a
coarse figure).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from lenpred.predictors import Request
from lenpred.signals import extract_signals, plain_prefill

VARIANTS = ("plain", "entropy_full", "signals_full", "entropy_pruned", "signals_pruned")


class PeakRSS:
    """Context manager sampling this process's resident set size in a thread; ``.peak_mib`` = peak minus the size on
    entry (MiB)."""

    def __init__(self, interval_s: float = 0.002):
        import psutil

        self.proc, self.interval_s, self.peak_mib = psutil.Process(), interval_s, 0.0

    def __enter__(self):
        self.base = self.peak = self.proc.memory_info().rss
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval_s)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        self.peak_mib = (self.peak - self.base) / 2**20
        return False


def variant_functions(backbone, layers: tuple[int, ...], vocab: torch.Tensor) -> dict:
    """``{variant: fn(batch_token_ids)}`` for :data:`VARIANTS` (see the module docstring)."""
    return {"plain": lambda ids: plain_prefill(backbone, ids),
            "entropy_full": lambda ids: extract_signals(backbone, ids, layers, semantic=False),
            "signals_full": lambda ids: extract_signals(backbone, ids, layers, semantic=True),
            "entropy_pruned": lambda ids: extract_signals(backbone, ids, layers, semantic=False, entropy_vocab=vocab),
            "signals_pruned": lambda ids: extract_signals(backbone, ids, layers, semantic=True, entropy_vocab=vocab)}


def pool_head_seconds(predictors: dict, signals: list, repeats: int = 3) -> dict:
    """Fastest wall time (s) of ``predictor.predict`` on requests carrying ``signals`` (pooling over the whole prompt
    + the head), per predictor name."""
    reqs = [Request(f"p{i}", [0] * len(s.token_entropy), signals=s, content_span=None) for i, s in enumerate(signals)]
    out = {}
    with torch.inference_mode():
        for name, p in predictors.items():
            p.predict(reqs)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                p.predict(reqs)
                times.append(time.perf_counter() - t)
            out[name] = min(times)
    return out


def measure_case(functions: dict, batch_token_ids: list[list[int]], repeats: int) -> dict:
    """``{variant: {"seconds", "peak_mib"}}`` for one batch (warm-up, then ``repeats`` interleaved rounds)."""
    times = {v: [] for v in functions}
    peaks = {v: 0.0 for v in functions}
    for fn in functions.values():
        fn(batch_token_ids)
    for _ in range(repeats):
        for v, fn in functions.items():
            with PeakRSS() as mem:
                t = time.perf_counter()
                fn(batch_token_ids)
                times[v].append(time.perf_counter() - t)
            peaks[v] = max(peaks[v], mem.peak_mib)
    return {v: {"seconds": min(times[v]), "peak_mib": peaks[v]} for v in functions}


def overhead_grid(backbone, predictors: dict, vocab: torch.Tensor, layers: tuple[int, ...] = (15, 22, 30),
                  batch_sizes=(1, 8, 32), lengths=(128, 512, 2048), max_batch_tokens: int = 16384,
                  repeats: int = 3, seed: int = 0) -> dict:
    """Measure every (batch size, length) case with ``B * n <= max_batch_tokens`` (larger ones are skipped and
    listed); returns ``{"cases": [...], "skipped": [...], "vocab_size", "pruned_k", "threads", "repeats"}``. Each
    case holds the variants' seconds and peak MiB, ``pool_head`` seconds per predictor, and ``ratio`` (time /
    plain) per variant and for the end-to-end pipelines ``egtp_full`` (entropy_full + egtp head), ``estp_full``
    (signals_full + estp head), ``egtp_pruned``, ``estp_pruned``."""
    from tqdm.auto import tqdm

    functions = variant_functions(backbone, layers, vocab)
    V = backbone.model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(seed)
    todo = [(b, n) for b in batch_sizes for n in lengths]
    cases, skipped = [], [(b, n) for b, n in todo if b * n > max_batch_tokens]
    for b, n in tqdm([c for c in todo if c not in skipped], desc="overhead cases", unit="case"):
        ids = torch.randint(min(100, V // 2), V, (b, n), generator=gen).tolist()  # skip special ids
        var = measure_case(functions, ids, repeats)
        sig = {"full": functions["signals_full"](ids), "pruned": functions["signals_pruned"](ids)}
        ph = pool_head_seconds(predictors, sig["full"], repeats)
        plain = var["plain"]["seconds"]
        ratio = {v: r["seconds"] / plain for v, r in var.items()}
        for kind in ("full", "pruned"):
            if "egtp" in ph:
                ratio[f"egtp_{kind}"] = (var[f"entropy_{kind}"]["seconds"] + ph["egtp"]) / plain
            if "estp" in ph:
                ratio[f"estp_{kind}"] = (var[f"signals_{kind}"]["seconds"] + ph["estp"]) / plain
        cases.append({"batch_size": b, "prompt_tokens": n, "variants": var, "pool_head_s": ph, "ratio": ratio,
                      "plain_tok_s": b * n / plain})
    return {"cases": cases, "skipped": [{"batch_size": b, "prompt_tokens": n} for b, n in skipped],
            "max_batch_tokens": max_batch_tokens, "vocab_size": V, "pruned_k": int(vocab.numel()),
            "threads": torch.get_num_threads(), "repeats": repeats}


def breakdown(case: dict) -> dict:
    """Extra seconds of each part of one case, from the variants: ``lm_head_entropy`` (entropy_full - plain),
    ``last_layer_eager_attention`` (signals_full - entropy_full), ``pruned_lm_head_entropy`` (entropy_pruned -
    plain), ``pool_head`` per predictor; and each as a share of the plain prefill."""
    v, plain = case["variants"], case["variants"]["plain"]["seconds"]
    parts = {"lm_head_entropy": v["entropy_full"]["seconds"] - plain,
             "last_layer_eager_attention": v["signals_full"]["seconds"] - v["entropy_full"]["seconds"],
             "pruned_lm_head_entropy": v["entropy_pruned"]["seconds"] - plain,
             **{f"pool_head_{k}": s for k, s in case["pool_head_s"].items()}}
    return {k: {"seconds": s, "share_of_plain": s / plain} for k, s in parts.items()}

