"""Decode-time hidden states by teacher forcing: one forward pass over prompt + stored response.

Progressive predictors (PLP, TRAIL's refresh) read the hidden state of the *current token* at decode step ``t``:
the state the model computes when it consumes its ``t``-th generated token (``t = 0``: the last prompt token, the
prefill's final position). With the prompt ``p_1 .. p_n`` and the response ``r_1 .. r_T`` (EOS excluded) that is
sequence position ``n - 1 + t`` of ``p + r``. A causal decoder computes the same state whether the tokens arrive
one by one with a KV cache or all at once, so a single forward pass over ``p + r[:t_max]`` gives every step's state
(:func:`incremental_decode_states` checks this on real requests).

A state is kept at the steps of :data:`DECODE_STEPS` below the response length (``t < T``: the request is still
running): every 8 tokens up to 64 (TRAIL refreshes every 8), then 128 (PLP's doubling schedule, cut at 128 for
compute: teacher forcing the ForeLen benchmark to step 128 is ~0.7 M tokens of prefill on 2 CPU cores).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lenpred.backbone import cache_dir
from lenpred.errors import LenpredError
from lenpred.inputs.cache import read_part, token_batches, write_part
from lenpred.io import stable_hash, write_json
from lenpred.prompts import TEMPLATE_RULE
from lenpred.steps import DECODE_STEPS
from lenpred.torch_state import with_backbone_threads

DECODE_CACHE_FORMAT = 1


def steps_before(length: int, steps: tuple[int, ...] = DECODE_STEPS) -> np.ndarray:
    """The decode steps ``t`` in ``steps`` with ``t < length`` (the request is still running), ``(m,)`` int64."""
    return np.asarray([t for t in steps if t < length], dtype=np.int64)


@with_backbone_threads
@torch.inference_mode()
def teacher_forced_states(backbone, sequences: list[tuple[list[int], list[int]]], steps: list[np.ndarray],
                          layers: tuple[int, ...]) -> list[torch.Tensor]:
    """Hidden states at decode steps for a batch, from one forward pass (right padding, causal mask).

    Args:
        backbone: a :class:`lenpred.backbone.Backbone`.
        sequences: ``(prompt_token_ids, response_token_ids)`` pairs; the response needs at least ``max(steps)``
            tokens.
        steps: per sequence, the decode steps ``t`` to keep (``(m_i,)`` ints, each ``< len(response)`` or 0).
        layers: hidden-state indices (0 = embeddings, ``L`` = final-norm output of the last layer).

    Returns:
        Per sequence a float32 tensor ``(m_i, len(layers), d)``: the state at position ``n - 1 + t`` for each step.

    Raises:
        LenpredError: a step beyond the response, or a sequence longer than the context window.
    """
    model = backbone.model
    rows = []
    for (prompt, response), ts in zip(sequences, steps):
        last = int(max(ts)) if len(ts) else 0
        if last > len(response) or (len(ts) and min(ts) < 0):
            raise LenpredError(f"decode step {last} is beyond a {len(response)}-token response")
        ids = list(prompt) + list(response[:last])
        if len(ids) > backbone.context_window:
            raise LenpredError(f"prompt + response is {len(ids)} tokens, over the {backbone.context_window}-token "
                               "context window")
        rows.append(ids)
    n = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), n), backbone.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for b, ids in enumerate(rows):
        input_ids[b, :len(ids)] = torch.tensor(ids)
        mask[b, :len(ids)] = 1
    out = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True, use_cache=False,
                logits_to_keep=1)
    hidden = torch.stack([out.hidden_states[l] for l in layers], dim=2)  # (B, n, layers, d)
    result = []
    for b, ((prompt, _), ts) in enumerate(zip(sequences, steps)):
        positions = torch.as_tensor(len(prompt) - 1 + np.asarray(ts, dtype=np.int64))
        result.append(hidden[b, positions].float().clone())
    return result


@with_backbone_threads
@torch.inference_mode()
def teacher_forced_shared_prompt(backbone, prompt: list[int], responses: list[list[int]], steps: list[np.ndarray],
                                 layers: tuple[int, ...]) -> list[torch.Tensor]:
    """:func:`teacher_forced_states` for several responses to one prompt: the prompt is prefilled once and its KV
    cache repeated over the responses (as a serving engine shares a prefix), then the responses run as one batch
    (right padding). Same output: per response ``(m_i, len(layers), d)`` float32 at positions ``n - 1 + t``."""
    model = backbone.model
    lasts = [int(max(ts)) if len(ts) else 0 for ts in steps]
    if any(l > len(r) for l, r in zip(lasts, responses)):
        raise LenpredError("a decode step is beyond its response")
    if len(prompt) + max(lasts) > backbone.context_window:
        raise LenpredError(f"prompt + response is {len(prompt) + max(lasts)} tokens, over the "
                           f"{backbone.context_window}-token context window")
    out = model(input_ids=torch.tensor([prompt]), use_cache=True, output_hidden_states=True, logits_to_keep=1)
    first = torch.stack([out.hidden_states[l][0, -1] for l in layers]).float()  # step 0: (layers, d)
    m = max(lasts)
    if m == 0:
        return [first[None].expand(len(ts), -1, -1).clone() for ts in steps]
    cache = out.cache
    cache.batch_repeat_interleave(len(responses))
    input_ids = torch.full((len(responses), m), backbone.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(responses), len(prompt) + m, dtype=torch.long)
    mask[:, :len(prompt)] = 1
    for b, (r, l) in enumerate(zip(responses, lasts)):
        input_ids[b, :l] = torch.tensor(r[:l])
        mask[b, len(prompt):len(prompt) + l] = 1
    position_ids = torch.arange(len(prompt), len(prompt) + m)[None].expand(len(responses), -1)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, cache=cache,
                use_cache=True, output_hidden_states=True, logits_to_keep=1)
    hidden = torch.stack([out.hidden_states[l] for l in layers], dim=2)  # (B, m, layers, d)
    result = []
    for b, ts in enumerate(steps):
        rows = [first if t == 0 else hidden[b, int(t) - 1].float() for t in ts]
        result.append(torch.stack(rows).clone() if rows else first[:0].clone())
    return result


@with_backbone_threads
@torch.inference_mode()
def incremental_decode_states(backbone, prompt: list[int], response: list[int], steps: np.ndarray,
                              layers: tuple[int, ...]) -> torch.Tensor:
    """The same states as :func:`teacher_forced_states` from a real incremental decode: a prefill of the prompt,
    then one token at a time through the KV cache (``past_key_values``), as a serving engine runs. ``(m, layers, d)``
    float32; the reference that checks teacher forcing."""
    model = backbone.model
    out = model(input_ids=torch.tensor([prompt]), use_cache=True, output_hidden_states=True, logits_to_keep=1)
    states = {0: torch.stack([out.hidden_states[l][0, -1] for l in layers])}
    past = out.cache
    for t in range(1, int(max(steps)) + 1):
        out = model(input_ids=torch.tensor([[response[t - 1]]]), cache=past, use_cache=True,
                    output_hidden_states=True, logits_to_keep=1)
        past = out.cache
        if t in set(int(s) for s in steps):
            states[t] = torch.stack([out.hidden_states[l][0, -1] for l in layers])
    return torch.stack([states[int(t)] for t in steps]).float()


@dataclass
class DecodeStates:
    """Decode-step states of every sample of a benchmark.

    Attributes:
        sample_ids: ``(N,)`` ids (``<prompt_id>#<sample_index>``).
        steps: per sample ``(m_i,)`` int64 decode steps (those of :data:`DECODE_STEPS` below its length).
        states: per sample ``(m_i, len(layers), d)`` float32.
        layers: hidden-state indices held.
    """

    sample_ids: list[str]
    steps: list[np.ndarray]
    states: list[torch.Tensor]
    layers: tuple[int, ...]

    def layer(self, index: int) -> list[torch.Tensor]:
        """Per sample ``(m_i, d)``: the states at hidden-state index ``index``.

        Raises:
            LenpredError: the layer was not extracted."""
        if index not in self.layers:
            raise LenpredError(f"decode states hold layers {list(self.layers)}, not {index}: re-extract with it")
        k = self.layers.index(index)
        return [s[:, k] for s in self.states]


def decode_cache_key(backbone, layers: tuple[int, ...], steps: tuple[int, ...]) -> dict:
    """What a decode-state cache holds: format, model revision, layers, step schedule, prompt rule."""
    return {"format": DECODE_CACHE_FORMAT, "kind": "decode_states", "model_revision": backbone.revision,
            "layers": list(layers), "steps": list(steps), "template_rule": TEMPLATE_RULE}


def extract_decode_states(backbone, samples: dict[str, tuple[list[int], list[int]]], layers: tuple[int, ...],
                          cache: str | Path, steps: tuple[int, ...] = DECODE_STEPS, part_size: int = 64,
                          max_batch_tokens: int = 8192, progress: bool = True) -> DecodeStates:
    """Decode-step states of every sample, from the cache where present, teacher-forcing (and caching) the rest.

    The cache works like the prompt-signal cache (:mod:`lenpred.inputs.cache`): safetensors parts of ``part_size``
    samples named by a hash of their ids and token ids, written atomically (a killed run resumes at the first
    missing part), each with a SHA-256 and the key (model revision, layers, steps, prompt rule) checked on read.

    Args:
        backbone: the loaded model.
        samples: ``{sample_id: (prompt_token_ids, response_token_ids)}`` in a stable order.
        layers: hidden-state indices to keep.
        cache: cache directory.
        steps: the step schedule.
        max_batch_tokens: padded tokens per forward pass.

    Returns:
        :class:`DecodeStates` in the order of ``samples``.

    Raises:
        LenpredError: the directory caches another model / layers / steps, or a part is unreadable or corrupt.
    """
    from tqdm.auto import tqdm

    cache = Path(cache)
    key = decode_cache_key(backbone, tuple(layers), tuple(steps))
    meta = cache / "cache.json"
    if meta.exists() and json.loads(meta.read_text()) != key:
        raise LenpredError(f"{cache} caches decode states of another model / layers / steps: delete it or pass "
                           "another cache directory")
    write_json(meta, key)
    ids = list(samples)
    sched = {s: steps_before(len(samples[s][1]), steps) for s in ids}
    need = {s: len(samples[s][0]) + (int(sched[s].max()) if len(sched[s]) else 0) for s in ids}
    out_steps, out_states = [], []
    t0, done_tokens = time.perf_counter(), 0
    with tqdm(total=sum(need.values()), unit="tok", desc="decode states", disable=not progress) as bar:
        for start in range(0, len(ids), part_size):
            part = ids[start:start + part_size]
            trunc = [[s, samples[s][0], samples[s][1][:int(sched[s].max()) if len(sched[s]) else 0]] for s in part]
            path = cache / f"part-{stable_hash(trunc)}.safetensors"
            if not path.exists():
                tensors = {}
                groups: dict[tuple, list[int]] = {}  # samples of one prompt share its prefill
                for i, s in enumerate(part):
                    groups.setdefault(tuple(samples[s][0]), []).append(i)
                single = [g[0] for g in groups.values() if len(g) == 1]
                jobs = [[single[j] for j in b] for b in token_batches([need[part[i]] for i in single], max_batch_tokens)]
                jobs += [g for g in groups.values() if len(g) > 1]
                for batch in jobs:
                    if len(batch) > 1 and len({tuple(samples[part[i]][0]) for i in batch}) == 1:
                        got = teacher_forced_shared_prompt(backbone, samples[part[batch[0]]][0],
                                                           [samples[part[i]][1] for i in batch],
                                                           [sched[part[i]] for i in batch], tuple(layers))
                    else:
                        got = teacher_forced_states(backbone, [samples[part[i]] for i in batch],
                                                    [sched[part[i]] for i in batch], tuple(layers))
                    for i, st in zip(batch, got):
                        tensors[f"{i}.states"] = st
                        tensors[f"{i}.steps"] = torch.from_numpy(sched[part[i]])
                    n = sum(need[part[i]] for i in batch)
                    done_tokens += n
                    bar.update(n)
                    bar.set_postfix(tok_s=f"{done_tokens / (time.perf_counter() - t0):.0f}")
                write_part(path, part, tensors, key)
            else:
                bar.update(sum(need[s] for s in part))
            tensors = read_part(path, part, key)
            for i, s in enumerate(part):
                got = tensors[f"{i}.steps"].numpy()
                if not np.array_equal(got, sched[s]):
                    raise LenpredError(f"{path} holds other steps for {s}: delete it and rerun to re-extract")
                out_steps.append(got)
                out_states.append(tensors[f"{i}.states"])
    return DecodeStates(ids, out_steps, out_states, tuple(layers))


def decode_cache_path(backbone, bench: str | Path, layers: tuple[int, ...], steps: tuple[int, ...] = DECODE_STEPS) -> Path:
    """Default decode-state cache of a benchmark: ``$LENPRED_CACHE/decode_states/<bench>-<revision>-<hash>``, beside
    the prompt signals, keyed by the layers, steps and format."""
    name = f"{Path(bench).name}-{backbone.revision}-{stable_hash([list(layers), list(steps), DECODE_CACHE_FORMAT], 8)}"
    return cache_dir() / "decode_states" / name


def benchmark_decode_states(backbone, data, layers: tuple[int, ...], cache: str | Path | None = None,
                            bench: str | Path = "", steps: tuple[int, ...] = DECODE_STEPS,
                            progress: bool = True) -> DecodeStates:
    """Decode-step states of every kept sample of an :class:`lenpred.dataset.EvalData`, in its row order
    (sample id ``<prompt_id>#<sample_index>``), through :func:`extract_decode_states`."""
    samples = {f"{pid}#{k}": (data.by_prompt[pid].token_ids, list(resp))
               for pid, k, resp in zip(data.cols["prompt_id"], data.cols["sample_index"], data.responses)}
    cache = Path(cache) if cache else decode_cache_path(backbone, bench, layers, steps)
    return extract_decode_states(backbone, samples, tuple(layers), cache, steps, progress=progress)
