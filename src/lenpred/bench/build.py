"""Build a benchmark: sample the plan shard by shard, resumable after a kill at any point.

Layout of a benchmark directory::

    bench.json                  config, plan fingerprint, model id + revision, skipped counts
    shards/shard-00000.parquet  one row per sampled response (schema: :data:`RECORD_SCHEMA`)

A shard is written atomically (temp file + rename) with the plan fingerprint and its index in the
parquet metadata, so a rerun skips exactly the finished shards and a shard from another plan is
detected instead of mixed in.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lenpred.bench.plan import BenchConfig, PlannedPrompt, make_plan, plan_fingerprint
from lenpred.engines import SampleRequest, make_engine
from lenpred.errors import LenpredError
from lenpred.io import atomic_path, write_json

RECORD_SCHEMA = pa.schema([
    ("scenario", pa.string()),
    ("source", pa.string()),
    ("prompt_id", pa.string()),
    ("split", pa.string()),
    ("sample_index", pa.int32()),
    ("seed", pa.int64()),
    ("num_prompt_tokens", pa.int32()),
    ("response_token_ids", pa.list_(pa.int32())),
    ("num_output_tokens", pa.int32()),   # EOS excluded
    ("finish_reason", pa.string()),      # "stop" | "length" (censored at max_new_tokens)
    ("temperature", pa.float32()),
    ("top_p", pa.float32()),
    ("max_new_tokens", pa.int32()),
    ("model_id", pa.string()),
    ("model_revision", pa.string()),
    ("engine", pa.string()),
])
_META_KEY = b"lenpred"


def shard_path(bench_dir: Path, index: int) -> Path:
    return bench_dir / "shards" / f"shard-{index:05d}.parquet"


def read_shard_meta(path: Path) -> dict:
    """The lenpred metadata of a shard file.

    Raises:
        LenpredError: the file is not a readable lenpred shard.
    """
    try:
        meta = pq.read_schema(path).metadata or {}
        return json.loads(meta[_META_KEY])
    except (OSError, KeyError, ValueError, pa.ArrowInvalid) as exc:
        raise LenpredError(f"{path} is not a readable lenpred shard ({type(exc).__name__}); delete it and rerun "
                           "`lenpred bench build` to re-sample it") from None


def _shard_table(prompts: list[PlannedPrompt], results, model_id: str, revision: str, engine: str) -> pa.Table:
    rows = {name: [] for name in RECORD_SCHEMA.names}
    it = iter(results)
    for p in prompts:
        for k, seed in enumerate(p.seeds):
            r = next(it)
            for key, val in (("scenario", p.scenario), ("source", p.source), ("prompt_id", p.prompt_id),
                             ("split", p.split), ("sample_index", k), ("seed", seed),
                             ("num_prompt_tokens", p.num_prompt_tokens),
                             ("response_token_ids", list(r.response_token_ids)),
                             ("num_output_tokens", r.num_output_tokens), ("finish_reason", r.finish_reason),
                             ("temperature", p.temperature), ("top_p", 1.0), ("max_new_tokens", p.max_new_tokens),
                             ("model_id", model_id), ("model_revision", revision), ("engine", engine)):
                rows[key].append(val)
    return pa.Table.from_pydict(rows, schema=RECORD_SCHEMA)


def _check_manifest(bench_dir: Path, manifest: dict) -> None:
    path = bench_dir / "bench.json"
    if not path.exists():
        return
    old = json.loads(path.read_text())
    for key in ("plan_fingerprint", "model_revision", "shard_size"):
        if old.get(key) != manifest.get(key):
            raise LenpredError(
                f"{bench_dir} holds a benchmark with another {key} ({old.get(key)} vs {manifest.get(key)}): "
                "use another --out directory, or delete it to rebuild")


def build_benchmark(config: BenchConfig, out_dir: str | Path, engine: str = "auto", data_dir=None,
                    max_shards: int | None = None, engine_kwargs: dict | None = None) -> Path:
    """Sample every shard of the plan that is not on disk yet.

    Args:
        config: what to sample.
        out_dir: benchmark directory (created; reused to resume).
        engine: ``"auto"`` (vLLM if installed), ``"vllm"`` or ``"transformers"``.
        data_dir: prompt data directory (default ``$LENPRED_DATA_DIR`` or ``../shared/datasets``).
        max_shards: stop after sampling this many new shards (for time-boxed sessions).

    Returns:
        ``out_dir``.

    Raises:
        LenpredError: the directory holds another plan or model, a shard is corrupt, or input is bad.
    """
    from tqdm.auto import tqdm

    from lenpred.backbone import eos_token_ids, resolve_model

    out = Path(out_dir)
    model_dir, revision = resolve_model(config.model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    plan, skipped = make_plan(config, tokenizer, data_dir)
    fingerprint = plan_fingerprint(plan)
    manifest = {"config": config.to_dict(), "plan_fingerprint": fingerprint, "model_id": config.model,
                "model_revision": revision, "shard_size": config.shard_size, "num_prompts": len(plan),
                "num_requests": sum(len(p.seeds) for p in plan), "skipped_long_prompts": skipped}
    _check_manifest(out, manifest)
    write_json(out / "bench.json", manifest)

    shards = [plan[i:i + config.shard_size] for i in range(0, len(plan), config.shard_size)]
    todo = []
    for i in range(len(shards)):
        path = shard_path(out, i)
        if path.exists():
            meta = read_shard_meta(path)
            if meta.get("plan_fingerprint") != fingerprint or meta.get("shard_index") != i:
                raise LenpredError(f"{path} belongs to another plan; delete it (or the directory) and rerun")
        else:
            todo.append(i)
    if max_shards is not None:
        todo = todo[:max_shards]
    if not todo:
        return out

    eos = eos_token_ids(model_dir, tokenizer)
    sampler = make_engine(engine, str(model_dir), eos, **(engine_kwargs or {}))
    done_prompts = sum(len(s) for i, s in enumerate(shards) if i not in set(todo))
    bar = tqdm(total=len(plan), initial=done_prompts, unit="prompt", desc=f"bench build ({sampler.name})")
    tokens, t0 = 0, time.perf_counter()
    for i in todo:
        prompts = shards[i]
        requests = [SampleRequest(p.prompt_token_ids, s, p.temperature, p.max_new_tokens) for p in prompts
                    for s in p.seeds]
        results = sampler.generate(requests)
        table = _shard_table(prompts, results, config.model, revision, sampler.name)
        meta = {"plan_fingerprint": fingerprint, "shard_index": i, "num_rows": table.num_rows}
        table = table.replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
        with atomic_path(shard_path(out, i)) as tmp:
            pq.write_table(table, tmp)
        tokens += sum(r.num_output_tokens for r in results)
        bar.set_postfix(out_tok_s=f"{tokens / (time.perf_counter() - t0):.1f}", shard=i)
        bar.update(len(prompts))
    bar.close()
    return out


def load_records(bench_dir: str | Path) -> pa.Table:
    """All records of a benchmark directory as one table (shards in order), checked against ``bench.json``.

    Raises:
        LenpredError: no benchmark there, or a shard from another plan / unreadable.
    """
    bench_dir = Path(bench_dir)
    manifest_path = bench_dir / "bench.json"
    if not manifest_path.is_file():
        raise LenpredError(f"{bench_dir} holds no benchmark (bench.json missing): build one with "
                           "`lenpred bench build --out DIR`")
    fingerprint = json.loads(manifest_path.read_text())["plan_fingerprint"]
    tables = []
    for path in sorted((bench_dir / "shards").glob("shard-*.parquet")):
        meta = read_shard_meta(path)
        if meta.get("plan_fingerprint") != fingerprint:
            raise LenpredError(f"{path} belongs to another plan than {manifest_path}; delete it and rebuild")
        table = pq.read_table(path)
        if table.num_rows != meta.get("num_rows"):
            raise LenpredError(f"{path} has {table.num_rows} rows, its metadata says {meta.get('num_rows')}: "
                               "delete it and rerun `lenpred bench build`")
        tables.append(table.replace_schema_metadata(None))
    if not tables:
        raise LenpredError(f"{bench_dir} has no finished shards yet: run `lenpred bench build --out {bench_dir}`")
    return pa.concat_tables(tables)
