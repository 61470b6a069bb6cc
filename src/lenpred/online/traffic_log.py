"""Traffic log: one row per finished request (the predictor's input features, its prediction, what happened), as
rotating parquet parts with a SHA-256 sidecar each — never prompt or response text.

Why: every finished request is a free training example (``lenpred train --traffic``) and a calibration point for
the online interval (:mod:`lenpred.online.adaptive`). The features are the pooled hidden state the predictor read
(for the shipped predictor the final prompt token's layer-15 state): hidden states are **sensitive data** — a
prompt's text can be partly recovered from them (embedding inversion) — so the log is off unless a serving path
is given a directory, and it should be stored and deleted like the prompts themselves.

On-disk layout of a log directory::

    part-00000001.parquet         rows of finished requests, in finish order (pyarrow, zstd)
    part-00000001.parquet.sha256  "<hex sha256>  part-00000001.parquet" (``sha256sum -c`` reads it)
    ...

Crash safety (kill -9 at any moment): a part is written to a temporary file, fsynced and renamed; its sidecar is
renamed into place *before* the part, so a part without a sidecar never comes from a crash (the reader refuses it
as unverifiable) and a sidecar without its part is the part that was being written (skipped, reported). Leftover
temporaries are ignored and cleaned up when a writer starts. At most the rows not yet flushed are lost.

Rotation: a new part every ``max_records_per_part`` rows, ``max_part_bytes`` of features, or ``max_part_age_s``
seconds after its first row (a background thread flushes, so :meth:`TrafficLogWriter.record` never writes to disk
on the caller's thread); when the log's parts exceed ``max_total_bytes`` the oldest are deleted.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lenpred.errors import LenpredError
from lenpred.io import atomic_path, file_sha256

LOG_FORMAT = "lenpred-traffic-log/1"
FEATURE_DTYPES = ("float16", "float32")
_PART = re.compile(r"^part-(\d{8})\.parquet$")
_SIDECAR = ".sha256"
COLUMNS = ("finish_time_s", "arrival_time_s", "first_token_time_s", "num_prompt_tokens", "num_output_tokens",
           "finish_reason", "max_new_tokens", "expected", "low", "high", "low_raw", "high_raw", "prompt_sha256",
           "group")


@dataclass
class TrafficLogConfig:
    """Settings of a :class:`TrafficLogWriter`.

    Attributes:
        directory: the log directory (created if missing; a writer resumes the part numbering of what is there).
        features_dtype: ``"float16"`` (default: half the bytes; the shipped head's predictions from float16 features
            differ by well under a token) or ``"float32"``.
        max_records_per_part: rows per part (the unit lost to a kill -9 is at most one part's worth of rows).
        max_part_bytes: a part is also cut when its buffered features reach this many bytes.
        max_part_age_s: seconds after a part's first row at which it is flushed even if small (an idle server's rows
            reach disk within this time).
        max_total_bytes: the oldest parts are deleted while the log holds more (parquet + sidecars); ``None``: no bound.
        compression: parquet codec.
        metadata: strings stored in every part's schema metadata (e.g. the predictor's model revision and layer).
    """

    directory: str | Path
    features_dtype: str = "float16"
    max_records_per_part: int = 4096
    max_part_bytes: int = 32 << 20
    max_part_age_s: float = 60.0
    max_total_bytes: int | None = 1 << 30
    compression: str = "zstd"
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.features_dtype not in FEATURE_DTYPES:
            raise LenpredError(f"unknown traffic-log features_dtype '{self.features_dtype}'; valid: "
                               f"{', '.join(FEATURE_DTYPES)}")
        if self.max_records_per_part < 1 or self.max_part_bytes < 1 or self.max_part_age_s <= 0:
            raise LenpredError("traffic-log max_records_per_part, max_part_bytes and max_part_age_s must be positive")
        if self.max_total_bytes is not None and self.max_total_bytes < 1:
            raise LenpredError("traffic-log max_total_bytes must be positive, or None for no bound")


def _part_path(directory: Path, seq: int) -> Path:
    return directory / f"part-{seq:08d}.parquet"


def _sidecar(part: Path) -> Path:
    return part.with_name(part.name + _SIDECAR)


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_parts(directory: str | Path) -> list[tuple[int, Path]]:
    """``[(seq, path)]`` of the parquet parts in ``directory``, oldest first (by part number)."""
    directory = Path(directory)
    out = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _PART.match(p.name))]
    return sorted(out)


class TrafficLogWriter:
    """Append finished requests to a traffic log; thread-safe (call :meth:`record` from any thread or an event loop).

    Use as a context manager, or call :meth:`close` (flushes what is buffered). See the module docstring for the
    layout, the crash-safety rule and rotation.

    Raises:
        LenpredError: ``directory`` is a file; bad settings (:class:`TrafficLogConfig`).
    """

    def __init__(self, config: TrafficLogConfig):
        self.config = config
        self.directory = Path(config.directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise LenpredError(f"traffic log {self.directory} is a file: pass a directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        for tmp in self.directory.glob(".*.tmp"):  # a killed writer's temporaries
            _remove_tree(tmp)
        parts = list_parts(self.directory)
        self._next_seq = (parts[-1][0] + 1) if parts else 1
        self._dtype = np.dtype(config.features_dtype)
        self._rows: list[tuple] = []
        self._features: list[np.ndarray] = []
        self._feature_dim: int | None = None
        self._first_row_at: float | None = None
        self._lock = threading.Lock()  # guards the buffer
        self._write_lock = threading.Lock()  # one part written at a time
        self._wake, self._stop = threading.Event(), threading.Event()
        self._error: BaseException | None = None
        self.num_records_written = 0
        self._thread = threading.Thread(target=self._run, name="lenpred-traffic-log", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the serving paths call these

    def record(self, features, expected: float, low: float, high: float, num_output_tokens: int, finish_reason: str,
               max_new_tokens: int | None, arrival_time_s: float, first_token_time_s: float | None,
               finish_time_s: float, *, low_raw: float | None = None, high_raw: float | None = None,
               num_prompt_tokens: int | None = None, prompt_sha256: str | None = None,
               group: str | None = None) -> None:
        """Buffer one finished request (microseconds; the disk write happens on the log's own thread).

        Args:
            features: ``(d,)`` the predictor's input (pooled hidden state), any float dtype; stored as
                ``features_dtype``. ``d`` is fixed by the first row.
            expected, low, high: the prediction served, tokens (``low``/``high`` the interval after its margin).
            num_output_tokens: tokens generated (EOS excluded); with ``finish_reason == "length"`` a lower bound.
            finish_reason: ``"stop"``, ``"length"`` (hit ``max_new_tokens``) or the engine's other reasons.
            max_new_tokens: the request's cap (``None``: uncapped).
            arrival_time_s, first_token_time_s, finish_time_s: wall-clock times, seconds since the epoch.
            low_raw, high_raw: the head's interval before the conformal margin (what an adaptive margin needs).
            num_prompt_tokens: the chat-formatted prompt's length.
            prompt_sha256: hex SHA-256 of the prompt (to group samples of one prompt; optional).
            group: a route / client tag (the Mondrian group of :mod:`lenpred.online.adaptive`; optional).

        Raises:
            LenpredError: features of another width than the log's, non-finite features, a negative length, or the
                log's background writer failed (its error is re-raised here).
        """
        if self._error is not None:
            raise LenpredError(f"traffic log {self.directory}: writing a part failed ({self._error}); fix the cause "
                               "(disk full? permissions?) and restart the writer") from self._error
        with np.errstate(over="ignore"):  # float16 overflow -> inf, refused just below
            f = np.asarray(features, dtype=self._dtype).reshape(-1)
        if not np.isfinite(f).all():
            raise LenpredError("traffic-log features hold non-finite values (float16 overflows above 65504: use "
                               "features_dtype='float32')")
        if num_output_tokens < 0:
            raise LenpredError(f"num_output_tokens must be >= 0, got {num_output_tokens}")
        row = (float(finish_time_s), float(arrival_time_s), _opt_float(first_token_time_s),
               _opt_int(num_prompt_tokens), int(num_output_tokens), str(finish_reason), _opt_int(max_new_tokens),
               float(expected), float(low), float(high), _opt_float(low_raw), _opt_float(high_raw), prompt_sha256,
               group)
        with self._lock:
            if self._feature_dim is None:
                self._feature_dim = len(f)
            elif len(f) != self._feature_dim:
                raise LenpredError(f"traffic-log features have {len(f)} values, this log's have {self._feature_dim}: "
                                   "one log holds one predictor's features; use another directory")
            self._rows.append(row)
            self._features.append(f)
            if self._first_row_at is None:
                self._first_row_at = time.monotonic()
            full = (len(self._rows) >= self.config.max_records_per_part
                    or len(self._rows) * f.nbytes >= self.config.max_part_bytes)
        if full:
            self._wake.set()

    def flush(self) -> Path | None:
        """Write the buffered rows now (on the calling thread), as parts of at most ``max_records_per_part`` rows.
        Returns the last part's path, or ``None`` if nothing was buffered."""
        with self._write_lock:
            with self._lock:
                rows, feats, dim = self._rows, self._features, self._feature_dim
                self._rows, self._features, self._first_row_at = [], [], None
            if not rows:
                return None
            step = self.config.max_records_per_part
            for i in range(0, len(rows), step):  # rows that piled up while a part was written: several parts
                path = self._write_part(rows[i:i + step], np.stack(feats[i:i + step]), dim)
            self._enforce_bound()
            return path

    def close(self) -> None:
        """Stop the background thread and flush what is buffered."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self.flush()

    def __enter__(self) -> "TrafficLogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _run(self) -> None:
        """Background thread: flush when a part is full or old enough."""
        poll = min(1.0, self.config.max_part_age_s / 4)
        while not self._stop.is_set():
            self._wake.wait(poll)
            self._wake.clear()
            with self._lock:
                n, first = len(self._rows), self._first_row_at
            due = n and (n >= self.config.max_records_per_part or first is not None
                         and time.monotonic() - first >= self.config.max_part_age_s
                         or n * self._dtype.itemsize * (self._feature_dim or 0) >= self.config.max_part_bytes)
            if due and not self._stop.is_set():
                try:
                    self.flush()
                except BaseException as exc:  # reported on the next record(); the thread keeps no rows
                    self._error = exc
                    return

    def _write_part(self, rows: list[tuple], features: np.ndarray, dim: int) -> Path:
        """One part + sidecar: parquet to a temporary, fsync; sidecar renamed into place; then the part."""
        import hashlib

        import pyarrow as pa
        import pyarrow.parquet as pq

        table = _rows_table(rows, features, dim, self.config, pa)
        seq = self._next_seq
        path = _part_path(self.directory, seq)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression=self.config.compression)
        blob = sink.getvalue().to_pybytes()
        with atomic_path(_sidecar(path)) as tmp:
            _fsync_write(tmp, f"{hashlib.sha256(blob).hexdigest()}  {path.name}\n".encode())
        with atomic_path(path) as tmp:
            _fsync_write(tmp, blob)
        _fsync_dir(self.directory)
        self._next_seq = seq + 1
        self.num_records_written += len(rows)
        return path

    def _enforce_bound(self) -> None:
        """Delete the oldest parts (part first, then its sidecar) while the log is over ``max_total_bytes``."""
        bound = self.config.max_total_bytes
        if bound is None:
            return
        parts = list_parts(self.directory)
        sizes = [p.stat().st_size + (_sidecar(p).stat().st_size if _sidecar(p).exists() else 0) for _, p in parts]
        total = sum(sizes)
        for (_, p), size in zip(parts[:-1], sizes):  # the newest part always stays
            if total <= bound:
                break
            p.unlink(missing_ok=True)
            _sidecar(p).unlink(missing_ok=True)
            total -= size


def _rows_table(rows: list[tuple], features: np.ndarray, dim: int, config: TrafficLogConfig, pa) -> Any:
    cols = list(zip(*rows))
    types = (pa.float64(), pa.float64(), pa.float64(), pa.int32(), pa.int32(), pa.string(), pa.int32(),
             pa.float32(), pa.float32(), pa.float32(), pa.float32(), pa.float32(), pa.string(), pa.string())
    arrays = {name: pa.array(list(col), type=t) for name, col, t in zip(COLUMNS, cols, types)}
    flat = pa.array(np.ascontiguousarray(features, dtype=config.features_dtype).reshape(-1))
    arrays["features"] = pa.FixedSizeListArray.from_arrays(flat, dim)
    meta = {"format": LOG_FORMAT, "features_dtype": config.features_dtype, "feature_dim": str(dim),
            **{str(k): str(v) for k, v in config.metadata.items()}}
    return pa.table(arrays).replace_schema_metadata(meta)


def _opt_float(x) -> float | None:
    return None if x is None else float(x)


def _opt_int(x) -> int | None:
    return None if x is None else int(x)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------- reading


@dataclass
class TrafficLog:
    """A traffic log read back (:func:`read_traffic_log`).

    Attributes:
        columns: ``{name: (n,) array}`` for every name in :data:`COLUMNS`, rows ordered by part then finish order;
            numeric columns as float64 (NaN for nulls), string ones as object arrays (``None`` for nulls).
        features: ``(n, d)`` float32 (upcast from the stored dtype).
        parts: the verified parts read, oldest first.
        skipped: sidecars whose part is missing (the part being written when a writer was killed, or one deleted by
            rotation mid-way): nothing to read.
        metadata: the first part's schema metadata (format, features_dtype, feature_dim, what the writer added).
    """

    columns: dict[str, np.ndarray]
    features: np.ndarray
    parts: list[Path]
    skipped: list[Path]
    metadata: dict[str, str]

    @property
    def num_records(self) -> int:
        return len(self.features)

    @property
    def censored(self) -> np.ndarray:
        """``(n,)`` bool: the response hit its cap (``finish_reason == "length"``): its length is a lower bound."""
        return self.columns["finish_reason"] == "length"


def verify_part(path: Path) -> None:
    """Check a part against its sidecar.

    Raises:
        LenpredError: no sidecar (a crash never leaves one missing: the part was not written by
            :class:`TrafficLogWriter`, or its sidecar was deleted), an unreadable sidecar, or a SHA-256 mismatch
            (the part is corrupted). Each message names the file and what to do.
    """
    side = _sidecar(path)
    if not side.exists():
        raise LenpredError(f"{path} has no checksum sidecar {side.name} (a crash never leaves a part without one): it "
                           "was not written by lenpred's traffic log or the sidecar was deleted; delete the part or "
                           "move it out of the log")
    try:
        digest, name = side.read_text().split()
    except (OSError, ValueError):
        raise LenpredError(f"{side} is unreadable (expected '<sha256>  {path.name}'): delete {path.name} and its "
                           "sidecar") from None
    if name != path.name or digest != file_sha256(path):
        raise LenpredError(f"{path} fails its SHA-256 checksum ({side.name}): the part is corrupted; delete it and its "
                           "sidecar (the log's other parts stay usable)")


def read_traffic_log(directory: str | Path) -> TrafficLog:
    """Load every part of a log directory, each verified against its sidecar.

    Raises:
        LenpredError: not a directory; no parts; a part that fails :func:`verify_part`, is not a traffic-log part
            or holds features of another width / dtype than the first part.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = Path(directory)
    if not directory.is_dir():
        raise LenpredError(f"traffic log {directory} is not a directory: pass the directory a TrafficLogWriter wrote")
    parts = [p for _, p in list_parts(directory)]
    skipped = sorted(p for p in directory.glob(f"part-*.parquet{_SIDECAR}") if not p.with_suffix("").exists())
    if not parts:
        raise LenpredError(f"traffic log {directory} holds no parts (part-*.parquet): log some traffic first")
    tables, meta0 = [], None
    for p in parts:
        verify_part(p)
        try:
            t = pq.read_table(p)
        except (OSError, pa.ArrowException) as exc:
            raise LenpredError(f"{p} passes its checksum but is not readable parquet ({exc}): delete it") from None
        meta = {k.decode(): v.decode() for k, v in (t.schema.metadata or {}).items()}
        if meta.get("format") != LOG_FORMAT:
            raise LenpredError(f"{p} is not a {LOG_FORMAT} part (format {meta.get('format')!r}): move it out of the log")
        meta0 = meta0 or meta
        if (meta["feature_dim"], meta["features_dtype"]) != (meta0["feature_dim"], meta0["features_dtype"]):
            raise LenpredError(f"{p} holds {meta['feature_dim']} {meta['features_dtype']} features, {parts[0]} holds "
                               f"{meta0['feature_dim']} {meta0['features_dtype']}: one log holds one predictor's "
                               "features; split the directory")
        tables.append(t)
    table = pa.concat_tables(tables)
    dim = int(meta0["feature_dim"])
    flat = table.column("features").combine_chunks().values.to_numpy(zero_copy_only=False)
    columns = {}
    for name in COLUMNS:
        col = table.column(name)
        columns[name] = (np.asarray(col.to_pylist(), dtype=object) if pa.types.is_string(col.type)
                         else col.to_numpy().astype(np.float64))
    return TrafficLog(columns, flat.astype(np.float32).reshape(-1, dim), parts, skipped, meta0)


def predictor_metadata(predictor) -> dict[str, str]:
    """What a log written for ``predictor`` (a :class:`lenpred.pipeline.LengthPredictor`) records in every part, so
    that ``lenpred train --traffic`` refuses a log whose features another predictor read: model id and revision,
    method, layers (JSON) and prompt rule."""
    import json

    c = predictor.config_
    return {"model_id": str(c["model_id"]), "model_revision": str(c["model_revision"]), "method": str(c["method"]),
            "layers": json.dumps(c["layers"]), "template_rule": str(c["template_rule"])}
