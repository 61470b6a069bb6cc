"""The on-disk form of a benchmark, and reading it back checked: the record schema, the shard files and
``bench.json`` (:mod:`lenpred.bench.build` writes them; the layout is described there)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lenpred.errors import LenpredError

_LEGACY_FIELDS = [
    ("scenario", pa.string()),
    ("source", pa.string()),
    ("prompt_id", pa.string()),
    ("split", pa.string()),
    ("sample_index", pa.int32()),
    ("seed", pa.int64()),
    ("num_prompt_tokens", pa.int32()),
    ("response_token_ids", pa.list_(pa.int32())),
    ("num_output_tokens", pa.int32()),   # stop token excluded
    ("finish_reason", pa.string()),      # "stop" | "length" (censored at max_new_tokens)
    ("temperature", pa.float32()),
    ("top_p", pa.float32()),
    ("max_new_tokens", pa.int32()),
    ("model_id", pa.string()),
    ("model_revision", pa.string()),
    ("engine", pa.string()),
]
NULLABLE_FIELDS = [
    ("stop_token_id", pa.int32()),       # the token that ended the turn; null: "length", or not recorded
    ("top_k", pa.int32()),               # 0 = off; null: not recorded (shards written before these columns)
    ("min_p", pa.float32()),             # 0.0 = off; null: not recorded
    ("repetition_penalty", pa.float32()),  # 1.0 = off; null: not recorded
    ("prompt_sha256", pa.string()),      # hex SHA-256 of the prompt's messages (user_prompts.prompt_sha256), never
                                         # the text; null: not recorded
]
RECORD_SCHEMA = pa.schema(_LEGACY_FIELDS + NULLABLE_FIELDS)
"""One row per sampled response. The last five columns came later: shards written before them (e.g.
``benchmarks/smollm2-first`` and ``smollm2-forelen``, sampled by vLLM with top-k, min-p and repetition penalty off
and stopping at ``<|im_end|>`` only) are read with those columns null."""
LEGACY_SCHEMA = pa.schema(_LEGACY_FIELDS)
_OLDER_SCHEMAS = (LEGACY_SCHEMA, pa.schema(_LEGACY_FIELDS + NULLABLE_FIELDS[:4]))
"""Schemas shards were written with before :data:`RECORD_SCHEMA`: read with the missing columns null."""
META_KEY = b"lenpred"
_SHARD_NAME = re.compile(r"shard-(\d{5,})\.parquet")
_MANIFEST_KEYS = ("plan_fingerprint", "model_id", "model_revision", "shard_size")
RESAMPLE_HINT = "delete it and rerun `lenpred bench build` with the same arguments to re-sample it"


def shard_path(bench_dir: Path, index: int) -> Path:
    return bench_dir / "shards" / f"shard-{index:05d}.parquet"


def shard_files(bench_dir: Path) -> dict[int, Path]:
    """The shard files of a benchmark directory by index.

    Raises:
        LenpredError: a file that looks like a shard but is not named ``shard-NNNNN.parquet``.
    """
    files = {}
    for path in sorted((bench_dir / "shards").glob("shard-*.parquet")):
        m = _SHARD_NAME.fullmatch(path.name)
        if m is None:
            raise LenpredError(f"{path} is not a shard name this benchmark writes (shard-NNNNN.parquet): "
                               "move it out of the shards directory")
        files[int(m.group(1))] = path
    return dict(sorted(files.items()))


def read_manifest(bench_dir: str | Path) -> dict:
    """The parsed ``bench.json`` of a benchmark directory.

    Raises:
        LenpredError: no such directory, no ``bench.json`` (the message says whether shards are there), or a file
            that is unreadable, not JSON, or lacks the keys the builder writes.
    """
    bench_dir = Path(bench_dir)
    path = bench_dir / "bench.json"
    if not bench_dir.is_dir():
        what = "not a directory" if bench_dir.exists() else "no such directory"
        raise LenpredError(f"{bench_dir} holds no benchmark ({what}): build one with "
                           "`lenpred bench build --out DIR`, or pass the directory you built")
    if not path.exists():
        if shard_files(bench_dir):
            raise LenpredError(f"{bench_dir} holds no benchmark manifest (bench.json missing, shards present): rerun "
                               f"`lenpred bench build --out {bench_dir}` with the arguments it was built with to "
                               "rewrite it (finished shards are checked against the plan and kept)")
        raise LenpredError(f"{bench_dir} holds no benchmark (bench.json missing): build one with "
                           "`lenpred bench build --out DIR`")
    fix = ("delete it and rerun `lenpred bench build` with the same arguments to rewrite it (finished shards "
           "are checked against the plan and kept)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LenpredError(f"{path} is not a readable benchmark manifest ({type(exc).__name__}); {fix}") from None
    missing = [k for k in _MANIFEST_KEYS if k not in manifest] if isinstance(manifest, dict) else list(_MANIFEST_KEYS)
    if missing:
        raise LenpredError(f"{path} is not a benchmark manifest (missing {', '.join(missing)}); {fix}")
    return manifest


def benchmark_key(bench_dir: str | Path) -> dict[str, str]:
    """What identifies the responses a benchmark holds: its plan's fingerprint and the model revision they were
    sampled from (``bench.json``), ``{"plan": ..., "revision": ...}``; a run resumed or a table reused on another
    benchmark is refused by comparing it.

    Raises:
        LenpredError: ``bench.json`` is unreadable (see :func:`read_manifest`)."""
    manifest = read_manifest(bench_dir)
    return {"plan": manifest["plan_fingerprint"], "revision": manifest["model_revision"]}


def benchmark_model(bench_dir: str | Path, model: str | None = None) -> str:
    """The model to read a benchmark with: ``model`` when given, else the one ``bench.json`` records (``model_id``,
    the name it was built with: alias, path, package or hub id). Pair it with :func:`check_benchmark_model` once the
    model is loaded.

    Raises:
        LenpredError: ``bench.json`` is unreadable (see :func:`read_manifest`)."""
    return model if model is not None else str(read_manifest(bench_dir)["model_id"])


def check_benchmark_model(bench_dir: str | Path, model_id: str, revision: str) -> None:
    """Refuse a model whose revision is not the one the benchmark was sampled from: its prefill signals would not
    belong to the recorded responses (a model with the same tokenizer would otherwise train silently).

    Raises:
        LenpredError: one line naming both models and revisions."""
    manifest = read_manifest(bench_dir)
    if manifest["model_revision"] != revision:
        raise LenpredError(f"{bench_dir} was sampled from {manifest['model_id']} revision {manifest['model_revision']}, "
                           f"but the model given is {model_id} revision {revision}: drop --model to use the "
                           "benchmark's model, or build a benchmark with this one (`lenpred bench build --model ...`)")


def read_shard_meta(path: Path) -> dict:
    """The lenpred metadata of a shard file (read from the footer only).

    Raises:
        LenpredError: the file is not a readable lenpred shard.
    """
    try:
        meta = json.loads((pq.read_schema(path).metadata or {})[META_KEY])
    except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
        raise LenpredError(f"{path} is not a readable lenpred shard ({type(exc).__name__}); {RESAMPLE_HINT}") from None
    if not isinstance(meta, dict):
        raise LenpredError(f"{path} is not a readable lenpred shard (bad metadata); {RESAMPLE_HINT}")
    return meta


def read_shard(path: Path) -> tuple[pa.Table, dict]:
    """Read one shard in full and check it: page checksums, schema, no nulls outside :data:`NULLABLE_FIELDS`,
    row count, lengths. A shard without the nullable columns (written before them) gets them as nulls.

    Returns:
        ``(table without schema metadata, lenpred metadata)``.

    Raises:
        LenpredError: the file is corrupt or not a lenpred shard; the message names it and the fix.
    """
    meta = read_shard_meta(path)
    bad = f"{path} is not a readable lenpred shard"
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as exc:
        raise LenpredError(f"{bad} (corrupt data: {type(exc).__name__}); {RESAMPLE_HINT}") from None
    table = table.replace_schema_metadata(None)
    if any(table.schema.equals(older) for older in _OLDER_SCHEMAS):
        for name, dtype in NULLABLE_FIELDS[table.num_columns - len(_LEGACY_FIELDS):]:
            table = table.append_column(pa.field(name, dtype), pa.nulls(table.num_rows, dtype))
    if not table.schema.equals(RECORD_SCHEMA):
        raise LenpredError(f"{bad} (its columns differ from the record schema); {RESAMPLE_HINT}")
    if table.num_rows != meta.get("num_rows"):
        raise LenpredError(f"{path} has {table.num_rows} rows, its metadata says {meta.get('num_rows')}: "
                           f"{RESAMPLE_HINT}")
    lengths_agree = pc.all(pc.equal(pc.list_value_length(table.column("response_token_ids")),
                                    table.column("num_output_tokens")), min_count=0).as_py()
    required = [table.column(name) for name, _ in _LEGACY_FIELDS]
    if any(col.null_count for col in required) or not lengths_agree:
        raise LenpredError(f"{bad} (null values or lengths that disagree with the token ids); {RESAMPLE_HINT}")
    return table, meta


def load_records(bench_dir: str | Path) -> pa.Table:
    """All records of a benchmark directory as one table (shards in order), checked against ``bench.json``.

    A benchmark built from prompt files lists them in ``bench.json["prompt_files"]``: pass that list to
    :func:`lenpred.bench.user_prompts.prompt_messages` to re-read their text by prompt id.

    Raises:
        LenpredError: no benchmark there, ``bench.json`` unreadable, or a shard from another plan / corrupt.
    """
    bench_dir = Path(bench_dir)
    manifest = read_manifest(bench_dir)
    fingerprint = manifest["plan_fingerprint"]
    tables = []
    for i, path in shard_files(bench_dir).items():
        table, meta = read_shard(path)
        if meta.get("plan_fingerprint") != fingerprint or meta.get("shard_index") != i:
            raise LenpredError(f"{path} belongs to another plan than {bench_dir / 'bench.json'}; delete it and rebuild")
        tables.append(table)
    if not tables:
        raise LenpredError(f"{bench_dir} has no finished shards yet: run `lenpred bench build --out {bench_dir}` "
                           "with the arguments it was started with")
    return pa.concat_tables(tables)
