"""Signal cache: extract prefill signals for many prompts once, resumably, and read them back.

A cache directory holds ``part-<hash>.safetensors`` files of up to ``part_size`` prompts each, named
by a hash of their prompt ids and token ids (written atomically, so a killed run resumes at the
first missing part, and a grown benchmark reuses every part whose prompts did not change), and
``cache.json`` with the key: format version, model revision, layers, whether attention was taken and the
prompt-preparation rule (:data:`lenpred.prompts.TEMPLATE_RULE`). Every part carries the same key in its own
metadata, so a part copied from another cache (other model or layers) is refused on read, as is a directory
whose key differs; a part that is unreadable, fails its SHA-256 checksum (stored in the part's metadata, over
every tensor's bytes) or holds non-finite values is reported, never used.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lenpred.errors import LenpredError
from lenpred.io import atomic_path, stable_hash, write_json
from lenpred.prompts import TEMPLATE_RULE
from lenpred.signals import PromptSignals, extract_signals, plain_prefill

CACHE_FORMAT = 4  # 2: every layer's last-token state; 3: SHA-256 per part; 4: attention_received + key per part


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """Hex SHA-256 over ``name`` and raw bytes of every tensor, in sorted name order (a cache part's checksum)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode() + b"\0")
        if tensors[name].numel():  # an empty tensor has no bytes (and may not be viewed as bytes)
            h.update(tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def token_batches(lengths: list[int], max_batch_tokens: int) -> list[list[int]]:
    """Group indices (sorted by length, so little padding) into batches of at most ``max_batch_tokens`` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, cur = [], []
    for i in order:
        if cur and lengths[i] * (len(cur) + 1) > max_batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def extract_cached(backbone, prompts: dict[str, list[int]], layers: tuple[int, ...], cache: str | Path,
                   semantic: bool = True, part_size: int = 32, max_batch_tokens: int = 4096,
                   progress: bool = True) -> dict[str, PromptSignals]:
    """Signals of every prompt, from the cache where present, extracting (and caching) the rest.

    Args:
        backbone: the loaded model.
        prompts: ``{prompt_id: chat token ids}``; order fixes the parts, so keep it stable.
        layers: hidden-state indices to keep.
        cache: cache directory.
        semantic: also take the last layer's attention (ESTP's semantic score).
        part_size: prompts per cache file (the unit of resuming).
        max_batch_tokens: padded tokens per forward pass.

    Returns:
        ``{prompt_id: PromptSignals}``.

    Raises:
        LenpredError: the directory caches another model, layer set or prompt set; a part is unreadable.
    """
    from tqdm.auto import tqdm

    cache = Path(cache)
    ids = list(prompts)
    if cache.exists() and not cache.is_dir():
        raise LenpredError(f"signal cache {cache} is a file, not a directory: pass another --cache directory")
    key = cache_key(backbone, layers, semantic)
    meta_path = cache / "cache.json"
    if meta_path.exists():
        try:
            stored = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            raise LenpredError(f"{meta_path} is unreadable (truncated?): delete {cache} and rerun to re-extract") from None
        if stored != key:
            raise LenpredError(f"{cache} caches signals for another model / layers / cache format: delete it or use "
                               "another --cache directory")
    write_json(meta_path, key)
    parts = [ids[i:i + part_size] for i in range(0, len(ids), part_size)]
    out: dict[str, PromptSignals] = {}
    total_tokens = sum(len(prompts[p]) for p in ids)
    t0, extracted = time.perf_counter(), 0
    with tqdm(total=total_tokens, unit="tok", desc="prefill signals", disable=not progress) as bar:
        for part in parts:
            path = cache / f"part-{stable_hash([[pid, prompts[pid]] for pid in part])}.safetensors"
            if not path.exists():
                signals = {}
                token_lists = [prompts[p] for p in part]
                for batch in token_batches([len(t) for t in token_lists], max_batch_tokens):
                    for i, s in zip(batch, extract_signals(backbone, [token_lists[i] for i in batch], layers, semantic)):
                        signals[part[i]] = s
                    done = sum(len(token_lists[i]) for i in batch)  # the bar moves per batch, not per part
                    extracted += done
                    bar.update(done)
                    bar.set_postfix(tok_s=f"{extracted / (time.perf_counter() - t0):.0f}")
                _write_part(path, part, signals, key)
            else:
                bar.update(sum(len(prompts[p]) for p in part))
            out.update(_read_part(path, part, key))
    return out


def cache_key(backbone, layers: tuple[int, ...], semantic: bool = True) -> dict:
    """What a signal cache (and each of its parts) holds: format, model revision, layers, attention, prompt rule."""
    return {"format": CACHE_FORMAT, "model_revision": backbone.revision, "layers": list(layers), "semantic": semantic,
            "template_rule": TEMPLATE_RULE}


def write_part(path: Path, ids: list[str], tensors: dict[str, torch.Tensor], key: dict) -> None:
    """Write one cache part atomically: ``tensors`` plus, in the safetensors metadata, the ids it holds, the
    cache ``key`` and a SHA-256 over every tensor (:func:`tensors_sha256`), all checked by :func:`read_part`."""
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"prompt_ids": json.dumps(ids), "sha256": tensors_sha256(tensors),
                                               "key": json.dumps(key, sort_keys=True)})


def read_part(path: Path, ids: list[str], key: dict) -> dict[str, torch.Tensor]:
    """The tensors of a part written by :func:`write_part`.

    Raises:
        LenpredError: unreadable, written under another key (model revision, layers, format, ...: the message
            names what differs), holding other ids, failing its checksum, or holding non-finite values. Each message
            says to delete the part and rerun.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            stored, checksum, part_key = json.loads(meta["prompt_ids"]), meta["sha256"], json.loads(meta["key"])
        tensors = load_file(str(path))
    except (OSError, KeyError, ValueError, RuntimeError, SafetensorError) as exc:
        raise LenpredError(f"{path} is unreadable ({type(exc).__name__}): delete it and rerun to re-extract") from None
    if part_key != key:
        diff = sorted(k for k in key.keys() | part_key.keys() if key.get(k) != part_key.get(k))
        raise LenpredError(f"{path} was extracted with other {', '.join(diff)} ({', '.join(f'{k}={part_key.get(k)}' for k in diff)}"
                           f" instead of {', '.join(f'{k}={key.get(k)}' for k in diff)}): delete it and rerun to re-extract")
    if stored != ids:
        raise LenpredError(f"{path} holds other prompts than expected: delete the cache directory and rerun")
    if tensors_sha256(tensors) != checksum:
        raise LenpredError(f"{path} fails its SHA-256 checksum (corrupted on disk): delete it and rerun to re-extract")
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise LenpredError(f"{path} holds non-finite values in {bad[0]}: delete it and rerun to re-extract")
    return tensors


def _write_part(path: Path, part: list[str], signals: dict[str, PromptSignals], key: dict) -> None:
    tensors = {}
    for i, pid in enumerate(part):
        s = signals[pid]
        tensors[f"{i}.hidden_states"] = s.hidden_states
        tensors[f"{i}.token_entropy"] = s.token_entropy
        tensors[f"{i}.last_token_states"] = s.last_token_states
        if s.attention_received is not None:
            tensors[f"{i}.attention_received"] = s.attention_received
    write_part(path, part, tensors, key)


def _read_part(path: Path, part: list[str], key: dict) -> dict[str, PromptSignals]:
    tensors = read_part(path, part, key)
    try:
        return {pid: PromptSignals(tensors[f"{i}.hidden_states"], tensors[f"{i}.token_entropy"],
                                   tensors.get(f"{i}.attention_received"), tuple(key["layers"]),
                                   tensors[f"{i}.last_token_states"])
                for i, pid in enumerate(part)}
    except KeyError as exc:
        raise LenpredError(f"{path} lacks {exc}: delete it and rerun to re-extract") from None


def measure_overhead(backbone, token_lists: list[list[int]], layers: tuple[int, ...], repeats: int = 2) -> dict:
    """Prefill throughput (prompt tokens/s) of signal extraction vs plain prefill on the same batch.

    Runs each ``repeats`` times after a warm-up and keeps the fastest. Returns a dict with
    ``num_prompt_tokens``, ``plain_tok_s``, ``signals_tok_s`` and ``ratio`` (signals / plain; 1 = free).
    """
    n_tokens = sum(len(t) for t in token_lists)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    with torch.inference_mode():
        plain = best(lambda: plain_prefill(backbone, token_lists))
        full = best(lambda: extract_signals(backbone, token_lists, layers, semantic=True))
    return {"num_prompt_tokens": n_tokens, "batch_size": len(token_lists), "plain_tok_s": n_tokens / plain,
            "signals_tok_s": n_tokens / full, "ratio": plain / full}
