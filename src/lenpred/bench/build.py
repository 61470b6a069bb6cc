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
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lenpred.bench.plan import BenchConfig, PlannedPrompt, make_plan, plan_fingerprint
from lenpred.bench.user_prompts import manifest_entry, read_prompt_file
from lenpred.engines import SampleRequest, VLLMOptions, make_engine
from lenpred.errors import LenpredError
from lenpred.io import atomic_path, write_json

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
_META_KEY = b"lenpred"
_SHARD_NAME = re.compile(r"shard-(\d{5,})\.parquet")
_MANIFEST_KEYS = ("plan_fingerprint", "model_id", "model_revision", "shard_size")
_RESAMPLE = "delete it and rerun `lenpred bench build` with the same arguments to re-sample it"


def shard_path(bench_dir: Path, index: int) -> Path:
    return bench_dir / "shards" / f"shard-{index:05d}.parquet"


def _shard_files(bench_dir: Path) -> dict[int, Path]:
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
        LenpredError: the file is unreadable, not JSON, or lacks the keys the builder writes.
    """
    path = Path(bench_dir) / "bench.json"
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
        meta = json.loads((pq.read_schema(path).metadata or {})[_META_KEY])
    except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
        raise LenpredError(f"{path} is not a readable lenpred shard ({type(exc).__name__}); {_RESAMPLE}") from None
    if not isinstance(meta, dict):
        raise LenpredError(f"{path} is not a readable lenpred shard (bad metadata); {_RESAMPLE}")
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
        raise LenpredError(f"{bad} (corrupt data: {type(exc).__name__}); {_RESAMPLE}") from None
    table = table.replace_schema_metadata(None)
    if any(table.schema.equals(older) for older in _OLDER_SCHEMAS):
        for name, dtype in NULLABLE_FIELDS[table.num_columns - len(_LEGACY_FIELDS):]:
            table = table.append_column(pa.field(name, dtype), pa.nulls(table.num_rows, dtype))
    if not table.schema.equals(RECORD_SCHEMA):
        raise LenpredError(f"{bad} (its columns differ from the record schema); {_RESAMPLE}")
    if table.num_rows != meta.get("num_rows"):
        raise LenpredError(f"{path} has {table.num_rows} rows, its metadata says {meta.get('num_rows')}: {_RESAMPLE}")
    lengths_agree = pc.all(pc.equal(pc.list_value_length(table.column("response_token_ids")),
                                    table.column("num_output_tokens")), min_count=0).as_py()
    required = [table.column(name) for name, _ in _LEGACY_FIELDS]
    if any(col.null_count for col in required) or not lengths_agree:
        raise LenpredError(f"{bad} (null values or lengths that disagree with the token ids); {_RESAMPLE}")
    return table, meta


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
        raise LenpredError(f"{path} does not hold the prompts and seeds the plan assigns to shard {index}; {_RESAMPLE}")


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
    from lenpred.backbone import eos_token_ids, recorded_model_name, resolve_model
    from lenpred.engines import model_context_window

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
    existing = _shard_files(out)
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
    if _shard_files(out):
        from lenpred.bench.card import warn_if_capped

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

    this_run, done, total = progress_counts(shards, todo, set(_shard_files(out)))
    tokens, t0 = 0, time.perf_counter()
    desc = f"bench build ({sampler.name})" + (f", {done}/{total} prompts done before" if done else "")
    with tqdm(total=this_run, initial=0, unit="prompt", desc=desc) as bar:
        for i in todo:
            prompts = shards[i]
            requests = _requests(prompts)
            results = sampler.generate(requests)
            table = _shard_table(prompts, requests, results, model_id, revision, sampler.name)
            meta = {"plan_fingerprint": fingerprint, "shard_index": i, "num_rows": table.num_rows}
            table = table.replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
            with atomic_path(shard_path(out, i)) as tmp:
                pq.write_table(table, tmp, write_page_checksum=True)
            tokens += sum(r.num_output_tokens for r in results)
            bar.set_postfix(out_tok_s=f"{tokens / (time.perf_counter() - t0):.1f}", shard=i)
            bar.update(len(prompts))


def load_records(bench_dir: str | Path) -> pa.Table:
    """All records of a benchmark directory as one table (shards in order), checked against ``bench.json``.

    A benchmark built from prompt files lists them in ``bench.json["prompt_files"]``: pass that list to
    :func:`lenpred.bench.sources.prompt_messages` to re-read their text by prompt id.

    Raises:
        LenpredError: no benchmark there, ``bench.json`` unreadable, or a shard from another plan / corrupt.
    """
    bench_dir = Path(bench_dir)
    manifest_path = bench_dir / "bench.json"
    if not bench_dir.is_dir():
        what = "not a directory" if bench_dir.exists() else "no such directory"
        raise LenpredError(f"{bench_dir} holds no benchmark ({what}): build one with "
                           "`lenpred bench build --out DIR`, or pass the directory you built")
    if not manifest_path.exists():
        if _shard_files(bench_dir):
            raise LenpredError(f"{bench_dir} holds no benchmark manifest (bench.json missing, shards present): rerun "
                               f"`lenpred bench build --out {bench_dir}` with the arguments it was built with to "
                               "rewrite it (finished shards are checked against the plan and kept)")
        raise LenpredError(f"{bench_dir} holds no benchmark (bench.json missing): build one with "
                           "`lenpred bench build --out DIR`")
    manifest = read_manifest(bench_dir)
    fingerprint = manifest["plan_fingerprint"]
    tables = []
    for i, path in _shard_files(bench_dir).items():
        table, meta = read_shard(path)
        if meta.get("plan_fingerprint") != fingerprint or meta.get("shard_index") != i:
            raise LenpredError(f"{path} belongs to another plan than {manifest_path}; delete it and rebuild")
        tables.append(table)
    if not tables:
        raise LenpredError(f"{bench_dir} has no finished shards yet: run `lenpred bench build --out {bench_dir}` "
                           "with the arguments it was started with")
    return pa.concat_tables(tables)
