"""The one loader: a stored benchmark's records + the serving model + the inputs the predictors read -> a
:class:`Dataset` (requests, labels, caps, clean splits). ``LengthPredictor.fit``, the studies and the scripts load
through :func:`load_dataset`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lenpred.backbone import load_backbone
from lenpred.bench.records import benchmark_model, check_benchmark_model, load_records, read_manifest
from lenpred.bench.user_prompts import prompt_messages
from lenpred.errors import LenpredError
from lenpred.inputs import provide_inputs
from lenpred.predictors import Request
from lenpred.prompts import normalise_text, prepare_prompt, prompt_text
from lenpred.signals import default_layers, resolve_layers

SPLITS = ("train", "validation", "test")


def cross_split_duplicates(prompt_ids: np.ndarray, splits: np.ndarray, texts: dict[str, str]) -> np.ndarray:
    """``(n,)`` bool: samples to drop because their prompt's normalised text already occurs in an earlier split
    (train < validation < test). Train is never dropped; within one split duplicates are kept.

    (Data sets overlap: MATH-500 is a subset of MATH; AlpacaEval contains Vicuna and Self-Instruct prompts. The
    benchmark splits hash the prompt id, so the same text can land in two splits.)
    """
    seen: set[str] = set()
    drop = np.zeros(len(prompt_ids), dtype=bool)
    for split in SPLITS:
        in_split = splits == split
        norm = np.array([normalise_text(texts[p]) for p in prompt_ids[in_split]], dtype=object)
        drop[np.flatnonzero(in_split)] = [t in seen for t in norm]
        seen |= set(norm.tolist())
    return drop


@dataclass
class EvalData:
    """A benchmark ready to evaluate.

    Attributes:
        cols: record columns as arrays (``scenario``, ``prompt_id``, ``split``, ``num_output_tokens``, ...), one row
            per kept sample.
        by_prompt: ``{prompt_id: Request}`` (token ids, content span, text, cap, scenario; inputs filled later).
        messages: ``{prompt_id: chat messages}`` re-read from the data directory.
        responses: ``(n,)`` response token ids per kept sample (object array).
        y: ``(n,)`` float64 observed output lengths in tokens (EOS excluded; capped ones at their cap).
        censored: ``(n,)`` bool, the response hit ``max_new_tokens``.
        index: ``{split: (m,) int64}`` row indices of train / validation / test.
        dropped_duplicates: ``{split: samples dropped}`` by :func:`cross_split_duplicates`.
        complete: whether every planned response of the benchmark is present.
    """

    cols: dict[str, np.ndarray]
    by_prompt: dict[str, Any]
    messages: dict[str, list[dict[str, str]]]
    responses: np.ndarray
    y: np.ndarray
    censored: np.ndarray
    index: dict[str, np.ndarray]
    dropped_duplicates: dict[str, int]
    complete: bool

    @property
    def requests(self) -> list:
        """One request per sample (samples of a prompt share the object)."""
        return [self.by_prompt[p] for p in self.cols["prompt_id"]]

    def rows(self, split: str) -> list:
        return [self.by_prompt[p] for p in self.cols["prompt_id"][self.index[split]]]


def load_eval_data(bench: str | Path, tokenizer: Any, data_dir: str | None = None, table: Any = None) -> EvalData:
    """Load a benchmark's records, re-read every prompt from its source and prepare it (:mod:`lenpred.prompts`),
    and drop validation / test samples whose prompt text already occurs in an earlier split. ``table``: the records
    if already loaded (:func:`lenpred.bench.records.load_records`).

    Raises:
        LenpredError: a prompt's re-tokenised length differs from the stored ``num_prompt_tokens`` (the data
            directory or chat template is not the one the benchmark was built with), or a split is empty.
    """
    table = load_records(bench) if table is None else table
    manifest = read_manifest(Path(bench))
    complete, prompt_files = table.num_rows >= manifest["num_requests"], manifest.get("prompt_files")
    names = ("scenario", "prompt_id", "split", "sample_index", "num_output_tokens", "num_prompt_tokens",
             "finish_reason", "max_new_tokens")
    cols = {c: np.asarray(table.column(c).to_pylist()) for c in names}
    by_prompt, messages = {}, {}
    first = dict(zip(cols["prompt_id"], zip(cols["num_prompt_tokens"], cols["scenario"], cols["max_new_tokens"])))
    for pid, (n, scenario, cap) in first.items():
        messages[pid] = prompt_messages(pid, data_dir, prompt_files)
        prepared = prepare_prompt(tokenizer, messages[pid])
        if prepared.num_prompt_tokens != n:
            raise LenpredError(f"prompt {pid} has {prepared.num_prompt_tokens} tokens now but {n} in the benchmark: the "
                               "data directory or the model's chat template differs from the one the benchmark was "
                               "built with")
        by_prompt[pid] = Request(pid, list(prepared.token_ids), prompt_text(messages[pid]),
                                 content_span=(prepared.content_start, prepared.content_end), max_new_tokens=int(cap),
                                 scenario=str(scenario))
    drop = cross_split_duplicates(cols["prompt_id"], cols["split"], {p: r.text for p, r in by_prompt.items()})
    dropped = {s: int((drop & (cols["split"] == s)).sum()) for s in SPLITS}
    keep = ~drop
    cols = {c: v[keep] for c, v in cols.items()}
    responses = np.empty(table.num_rows, dtype=object)
    for i, ids in enumerate(table.column("response_token_ids").to_pylist()):
        responses[i] = ids
    responses = responses[keep]
    index = {s: np.flatnonzero(cols["split"] == s) for s in SPLITS}
    if min(len(i) for i in index.values()) == 0:
        raise LenpredError(f"{bench} needs samples in train, validation and test (have "
                           f"{', '.join(str(len(i)) for i in index.values())}): build more shards with "
                           "`lenpred bench build`")
    return EvalData(cols, by_prompt, messages, responses, cols["num_output_tokens"].astype(np.float64),
                    cols["finish_reason"] == "length", index, dropped, complete)


def check_layers(layers: tuple[int, ...] | None, trail_layers: tuple[int, ...] | None,
                 num_layers: int) -> tuple[int, ...]:
    """The hidden-state indices to extract for a model of ``num_layers`` layers: ``layers`` resolved to 0..L
    (:func:`lenpred.signals.resolve_layers`), or :func:`lenpred.signals.default_layers` when ``None``.

    Raises:
        LenpredError: a layer outside -(L+1)..L, or a TRAIL layer outside 1..L.
    """
    if layers is None:
        return default_layers(num_layers)
    if any(not -num_layers - 1 <= l <= num_layers for l in layers):
        raise LenpredError(f"--layers must lie in -{num_layers + 1}..{num_layers} for this model ({num_layers} "
                           f"layers), got {list(layers)}")
    if trail_layers is not None and any(not 1 <= l <= num_layers for l in trail_layers):
        raise LenpredError(f"--trail-layers must lie in 1..{num_layers} for this model, got {list(trail_layers)}")
    return resolve_layers(layers, num_layers)


@dataclass
class Dataset:
    """A benchmark loaded with the serving model and the inputs its predictors read (:func:`load_dataset`).

    Attributes:
        backbone: the serving model (:class:`lenpred.backbone.Backbone`).
        data: the records as requests with their inputs filled (:class:`EvalData`).
        layers: the hidden-state indices extracted (resolved, 0..L).
        values: what the input providers measured (e.g. PiA's ``tokens_per_word``), for the tuning context.
        table: the benchmark's records (a ``pyarrow.Table``, all rows, duplicates included).
        timing: seconds each input provider took, by input name.
        bench_name: the benchmark's directory name.
        plan_fingerprint: its sampling plan's fingerprint (``bench.json``), what makes two benchmarks the same.
    """

    backbone: Any
    data: EvalData
    layers: tuple[int, ...]
    values: dict[str, Any]
    table: Any
    timing: dict[str, float]
    bench_name: str
    plan_fingerprint: str


def load_dataset(bench: str | Path, needs: set[str], model: str | None = None, backbone=None,
                 data_dir: str | None = None, cache: str | None = None, layers: tuple[int, ...] | None = None,
                 trail_layers: tuple[int, ...] | None = None, threads: int | None = None) -> Dataset:
    """Records (checked before the model loads) -> backbone -> requests -> the inputs ``needs`` names.

    Args:
        bench: benchmark directory (built by ``lenpred bench build``).
        needs: input names to provide (:func:`lenpred.predictors.required_inputs` of the predictors).
        model: the serving model (:func:`lenpred.backbone.resolve_model`); ``None``: the benchmark's own
            (:func:`lenpred.bench.records.benchmark_model`). Ignored when ``backbone`` is given.
        backbone: an already loaded serving model.
        data_dir: prompt data sets (``None``: the default data directory).
        cache: signal cache directory (``None``: under ``$LENPRED_CACHE``).
        layers, trail_layers: as :func:`check_layers`.
        threads: torch threads of the backbone when it is loaded here (``None``: torch default).

    Raises:
        LenpredError: a broken benchmark, a model of another revision than the benchmark's, bad layers, or any
            input provider's error.
    """
    table = load_records(bench)  # a missing or broken benchmark fails before the model loads
    backbone = backbone or load_backbone(benchmark_model(bench, model), num_threads=threads)
    check_benchmark_model(bench, backbone.model_id, backbone.revision)
    layers = check_layers(layers, trail_layers, backbone.num_layers)
    data = load_eval_data(bench, backbone.tokenizer, data_dir, table)
    values, timing = provide_inputs(needs, backbone, data, {"layers": layers, "cache": cache, "bench": bench})
    return Dataset(backbone, data, layers, values, table, timing, Path(bench).name,
                   read_manifest(bench)["plan_fingerprint"])
