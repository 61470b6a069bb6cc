"""Build a benchmark: sample the plan shard by shard, resumable after a kill at any point.

Layout of a benchmark directory::

    bench.json                  config, plan fingerprint, model id + revision, skipped counts
    shards/shard-00000.parquet  one row per sampled response (schema: :data:`RECORD_SCHEMA`)

A shard is written atomically (temp file + rename) with the plan fingerprint and its index in the
parquet metadata, so a rerun skips exactly the finished shards and a shard from another plan is
detected instead of mixed in. Shards carry parquet page checksums; every existing shard is read in
full and checked (checksums, schema, row count, the plan's prompt ids and seeds) before a rerun
trusts it, so a corrupt file stops the build with the file's name instead of a pyarrow traceback.
``bench.json`` is written only once the engine has started: a failed start leaves nothing behind.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lenpred.backbone import eos_token_ids, recorded_model_name, resolve_model
from lenpred.bench.card import warn_if_capped
from lenpred.bench.plan import BenchConfig, PlannedPrompt, make_plan, plan_fingerprint
from lenpred.bench.user_prompts import manifest_entry, read_prompt_file
from lenpred.engines import SampleRequest, VLLMOptions, make_engine, model_context_window
from lenpred.errors import LenpredError
from lenpred.io import atomic_path, write_json
from lenpred.bench.records import (LEGACY_SCHEMA, META_KEY, NULLABLE_FIELDS, RECORD_SCHEMA,  # noqa: F401  (re-exported)
                                   RESAMPLE_HINT, benchmark_model, check_benchmark_model, load_records, read_manifest,
                                   read_shard, read_shard_meta, shard_files, shard_path)

def _shard_table(prompts: list[PlannedPrompt], requests: list[SampleRequest], results, model_id: str, revision: str,
                 engine: str) -> pa.Table:
    rows = {name: [] for name in RECORD_SCHEMA.names}
    it = zip(requests, results)
    for p in prompts:
        for k, seed in enumerate(p.seeds):
            req, r = next(it)
            for key, val in (("scenario", p.scenario), ("source", p.source), ("prompt_id", p.prompt_id),
                             ("split", p.split), ("sample_index", k), ("seed", seed),
                             ("num_prompt_tokens", p.num_prompt_tokens),
                             ("response_token_ids", list(r.response_token_ids)),
                             ("num_output_tokens", r.num_output_tokens), ("finish_reason", r.finish_reason),
                             ("stop_token_id", r.stop_token_id), ("prompt_sha256", p.prompt_sha256 or None),
                             *req.sampling_params().items(),
                             ("model_id", model_id), ("model_revision", revision), ("engine", engine)):
                rows[key].append(val)
    return pa.Table.from_pydict(rows, schema=RECORD_SCHEMA)


def _requests(prompts: list[PlannedPrompt]) -> list[SampleRequest]:
    """The sampling requests of a shard, in record order: pure ancestral sampling (top-k, min-p and repetition
    penalty off; top-p off unless a prompt file sets it), the same in both engines."""
    return [SampleRequest(p.prompt_token_ids, s, p.temperature, p.max_new_tokens, top_p=p.top_p)
            for p in prompts for s in p.seeds]


def _check_manifest(bench_dir: Path, manifest: dict) -> None:
    path = bench_dir / "bench.json"
    if not path.exists():
        return
    old = read_manifest(bench_dir)
    for key in ("plan_fingerprint", "model_revision", "shard_size", "stop_token_ids"):
        if key == "stop_token_ids" and key not in old:
            continue  # written before stop tokens were recorded: its shards say so (stop_token_id null)
        if old.get(key) != manifest.get(key):
            raise LenpredError(
                f"{bench_dir} holds a benchmark with another {key} ({old.get(key)} vs {manifest.get(key)}): "
                "use another --out directory, or delete it to rebuild")


def _check_out_dir(out: Path) -> None:
    for path in (out, out / "shards"):
        if path.exists() and not path.is_dir():
            raise LenpredError(f"{path} exists and is not a directory: pass a new or benchmark directory as --out "
                               "(or move the file away)")


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return text if len(text) <= limit else text[:limit] + "..."


def _check_shard(path: Path, index: int, prompts: list[PlannedPrompt], fingerprint: str) -> None:
    """Raise if an existing shard file is corrupt or is not shard ``index`` of this plan."""
    table, meta = read_shard(path)
    if meta.get("plan_fingerprint") != fingerprint or meta.get("shard_index") != index:
        raise LenpredError(f"{path} belongs to another plan; delete it (or the directory) and rerun")
    expected = [(p.prompt_id, k, seed) for p in prompts for k, seed in enumerate(p.seeds)]
    got = list(zip(*(table.column(c).to_pylist() for c in ("prompt_id", "sample_index", "seed"))))
    if got != expected:
        raise LenpredError(f"{path} does not hold the prompts and seeds the plan assigns to shard {index}; "
                           f"{RESAMPLE_HINT}")


def build_benchmark(config: BenchConfig, out_dir: str | Path, engine: str = "auto", data_dir=None,
                    max_shards: int | None = None, vllm_options: VLLMOptions | None = None) -> Path:
    """Sample every shard of the plan that is not on disk yet.

    Existing shards are checked first (a corrupt one stops the build, naming the file); ``bench.json``
    is written only after the engine started, so a failed start leaves no half-made directory, and an
    existing one is left as it is.

    Args:
        config: what to sample; its prompt limits are checked against the model's context window up front
            (:func:`lenpred.bench.plan.prompt_limits`).
        out_dir: benchmark directory (created; reused to resume).
        engine: ``"auto"`` (vLLM if installed), ``"vllm"`` or ``"transformers"``.
        data_dir: prompt data directory (default ``$LENPRED_DATA_DIR`` or ``../shared/datasets``).
        max_shards: stop after sampling this many new shards (for time-boxed sessions); ``0`` only
            checks the directory and writes ``bench.json``.
        vllm_options: memory and thread settings of the vLLM engine.

    Returns:
        ``out_dir``. A scenario whose responses almost all hit ``max_new_tokens`` is warned about (a log line,
        :func:`lenpred.bench.card.warn_if_capped`).

    Raises:
        LenpredError: the directory holds another plan or model, a shard or ``bench.json`` is corrupt,
            the engine cannot load the model or refuses to start, a data file holds bad text (the message
            names the file and record), or the limits do not fit the model's context window.
    """
    out = Path(out_dir)
    if max_shards is not None and max_shards < 0:
        raise LenpredError(f"--max-shards must be >= 0, got {max_shards}")
    _check_out_dir(out)
    for f in config.prompt_files:  # a bad prompt file fails before the model loads
        read_prompt_file(f.path)
    model_dir, revision = resolve_model(config.model)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise LenpredError(f"cannot load the tokenizer of model '{config.model}' from {model_dir} "
                           f"({type(exc).__name__}: {_first_line(exc)}): point --model at a directory with "
                           "tokenizer files (save_pretrained), or a cached hub id") from None
    plan, skipped = make_plan(config, tokenizer, data_dir, context_window=model_context_window(str(model_dir)))
    fingerprint = plan_fingerprint(plan)
    stop_ids = eos_token_ids(model_dir, tokenizer)
    manifest = {"config": config.to_dict(), "plan_fingerprint": fingerprint,
                "model_id": recorded_model_name(config.model),
                "model_revision": revision, "shard_size": config.shard_size, "num_prompts": len(plan),
                "num_requests": sum(len(p.seeds) for p in plan), "skipped_long_prompts": skipped,
                "stop_token_ids": list(stop_ids)}
    if config.prompt_files:  # path + SHA-256 of each file: how prompt ids resolve back to text (never the text)
        manifest["prompt_files"] = [manifest_entry(f) for f in config.prompt_files]
    _check_manifest(out, manifest)

    shards = [plan[i:i + config.shard_size] for i in range(0, len(plan), config.shard_size)]
    existing = shard_files(out)
    for i, path in existing.items():
        if i >= len(shards):
            raise LenpredError(f"{path} belongs to another plan (this plan has {len(shards)} shards); "
                               "delete it (or the directory) and rerun")
        _check_shard(path, i, shards[i], fingerprint)
    todo = [i for i in range(len(shards)) if i not in existing]
    if max_shards is not None:
        todo = todo[:max_shards]

    sampler = None
    if todo:
        try:
            sampler = make_engine(engine, str(model_dir), stop_ids, vllm_options)
        except LenpredError:
            raise
        except (OSError, ValueError) as exc:
            raise LenpredError(f"engine '{engine}' cannot load model '{config.model}' from {model_dir} "
                               f"({type(exc).__name__}: {_first_line(exc)}): point --model at a complete model "
                               "directory (config, weights, tokenizer) or a cached hub id") from None
    if not (out / "bench.json").exists():  # only now: a failed engine start leaves no half-made directory
        write_json(out / "bench.json", manifest)
    if sampler is not None:
        _sample_shards(sampler, shards, todo, out, fingerprint, config.model, revision)
    if shard_files(out):
        warn_if_capped(out)  # a model that never stops makes a benchmark of caps: say so now
    return out


def progress_counts(shards: list[list[PlannedPrompt]], todo: list[int], on_disk: set[int]) -> tuple[int, int, int]:
    """``(prompts this run samples, prompts already on disk, prompts in the plan)``: the progress bar counts this
    run's work (the shards in ``todo``) against this run's plan and says how much was done before."""
    return (sum(len(shards[i]) for i in todo), sum(len(s) for i, s in enumerate(shards) if i in on_disk),
            sum(len(s) for s in shards))


def _sample_shards(sampler, shards: list[list[PlannedPrompt]], todo: list[int], out: Path, fingerprint: str,
                   model_id: str, revision: str) -> None:
    """Sample and write the shards in ``todo``, one atomic file each, with a progress bar of this run's prompts."""
    from tqdm.auto import tqdm

    this_run, done, total = progress_counts(shards, todo, set(shard_files(out)))
    tokens, t0 = 0, time.perf_counter()
    desc = f"bench build ({sampler.name})" + (f", {done}/{total} prompts done before" if done else "")
    with tqdm(total=this_run, initial=0, unit="prompt", desc=desc) as bar:
        for i in todo:
            prompts = shards[i]
            requests = _requests(prompts)
            results = sampler.generate(requests)
            table = _shard_table(prompts, requests, results, model_id, revision, sampler.name)
            meta = {"plan_fingerprint": fingerprint, "shard_index": i, "num_rows": table.num_rows}
            table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
            with atomic_path(shard_path(out, i)) as tmp:
                pq.write_table(table, tmp, write_page_checksum=True)
            tokens += sum(r.num_output_tokens for r in results)
            bar.set_postfix(out_tok_s=f"{tokens / (time.perf_counter() - t0):.1f}", shard=i)
            bar.update(len(prompts))
