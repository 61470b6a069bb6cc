"""Traffic log: one row per finished request (the predictor's input features, its prediction, what happened), as
rotating parquet parts with a SHA-256 sidecar each, plus a journal of the part being filled — never prompt or
response text.

Why: every finished request is a free training example (``lenpred train --traffic``) and a calibration point for
the online interval (:mod:`lenpred.online.adaptive`). The features are the pooled hidden state the predictor read
(for the shipped predictor the final prompt token's layer-15 state): hidden states are **sensitive data** — a
prompt's text can be partly recovered from them (embedding inversion) — so the log is off unless a serving path
is given a directory, and it should be stored and deleted like the prompts themselves.

On-disk layout of a log directory::

    part-00000001.parquet         rows of finished requests, in finish order (pyarrow, zstd)
    part-00000001.parquet.sha256  "<hex sha256>  part-00000001.parquet" (``sha256sum -c`` reads it)
    ...
    part-00000007.open            the journal of the part being filled (Arrow IPC stream, one batch per append)

One declaration: the columns (:data:`COLUMNS`), the parquet / journal schema and the row type
(:class:`TrafficRecord`) all derive from :class:`TrafficRecord`'s fields.

Durability, by **time**: the log's thread appends every recorded row to the journal as soon as it wakes (it is woken
by each :meth:`TrafficLogWriter.record`; at the latest after :data:`JOURNAL_INTERVAL_S`), so a row is in the
operating system's hands within that bound and survives the process being killed (vLLM force-kills its engine
process on Ctrl-C; the journal is not fsynced, so a power cut can lose it). Parts are fsynced. A part is written to
a temporary, fsynced and renamed; its sidecar is renamed into place *before* the part, so a part without a sidecar
never comes from a crash (the reader refuses it as unverifiable) and a sidecar without its part is the part that was
being written (skipped, reported). Then the part's journal is deleted. A journal whose part exists is stale (killed
between the two steps) and is ignored. A journal without its part was **not closed**: :func:`read_traffic_log`
reads its complete batches and reports it in ``unclosed``; the next writer on the directory turns it into its part
(verified, same number) and reports that in ``recovered``. A batch torn by the kill is dropped and counted.

Rotation: a new part every ``max_records_per_part`` rows, ``max_part_bytes`` of features, or ``max_part_age_s``
seconds after its first row (the background thread writes, so :meth:`TrafficLogWriter.record` never writes to disk
on the caller's thread); when the log's parts exceed ``max_total_bytes`` the oldest are deleted.

One log, one predictor: every part stores the writer's ``metadata`` (:func:`predictor_metadata`: model, revision,
method, layers, prompt rule) and the features' dtype and width. A writer refuses to append to a directory whose
newest part has other values, and the reader refuses a log whose parts disagree.
"""

from __future__ import annotations

import logging
import os
import re
import fcntl
import threading
import time
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from lenpred.errors import LenpredError
from lenpred.io import atomic_path, file_sha256

logger = logging.getLogger(__name__)

LOG_FORMAT = "lenpred-traffic-log/1"
FEATURE_DTYPES = ("float16", "float32")
JOURNAL_INTERVAL_S = 0.5
"""The most seconds a recorded row waits before the log's thread appends it to the journal."""
_PART = re.compile(r"^part-(\d{8})\.parquet$")
_JOURNAL = re.compile(r"^part-(\d{8})\.open$")
_SIDECAR = ".sha256"


def _column(arrow: str, doc: str, default: Any = MISSING) -> Any:
    return field(default=default, metadata={"arrow": arrow, "doc": doc})


@dataclass(frozen=True, kw_only=True)
class TrafficRecord:
    """One finished request as a traffic-log row: the only declaration of the log's columns (each field's ``arrow``
    metadata is its stored type; fields defaulting to ``None`` are nullable).

    Raises:
        LenpredError: a required column given as ``None`` or a negative length (checked here); the writer checks the
            features (:meth:`TrafficLogWriter.record`).
    """

    finish_time_s: float = _column("float64", "wall-clock time the request finished, seconds since the epoch")
    arrival_time_s: float = _column("float64", "wall-clock arrival time, seconds since the epoch")
    first_token_time_s: float | None = _column("float64", "wall-clock time of the first output token", None)
    num_prompt_tokens: int | None = _column("int32", "the chat-formatted prompt's length, tokens", None)
    num_output_tokens: int = _column("int32", "tokens generated (EOS excluded); a lower bound when capped")
    finish_reason: str = _column("string", '"stop", "length" (hit max_new_tokens) or the engine\'s other reasons')
    max_new_tokens: int | None = _column("int32", "the request's cap (None: uncapped)", None)
    expected: float = _column("float32", "the expected length served, tokens")
    low: float = _column("float32", "the interval's lower end served (after its margin), tokens")
    high: float = _column("float32", "the interval's upper end served (after its margin), tokens")
    low_raw: float | None = _column("float32", "the head's lower quantile before the margin, tokens", None)
    high_raw: float | None = _column("float32", "the head's upper quantile before the margin, tokens", None)
    prompt_sha256: str | None = _column("string", "hex SHA-256 of the prompt (groups samples of one prompt)", None)
    group: str | None = _column("string", "route / client tag (the Mondrian group of lenpred.online.adaptive)", None)
    features: np.ndarray = field(metadata={"doc": "(d,) the predictor's input (pooled hidden state), any float "
                                                  "dtype; stored as the log's features_dtype, d fixed per log"})

    def __post_init__(self):
        missing = [f.name for f in _COLUMN_FIELDS if f.default is MISSING and getattr(self, f.name) is None]
        if missing:
            raise LenpredError(f"traffic-log record without {', '.join(missing)}: these columns are required")
        if self.num_output_tokens < 0:
            raise LenpredError(f"num_output_tokens must be >= 0, got {self.num_output_tokens}")

    def values(self) -> tuple:
        """The row's :data:`COLUMNS` values, converted to their stored Python types (``None`` kept)."""
        return tuple(None if (v := getattr(self, f.name)) is None else _PYTHON_TYPE[f.metadata["arrow"]](v)
                     for f in _COLUMN_FIELDS)


_PYTHON_TYPE = {"float64": float, "float32": float, "int32": int, "string": str}
"""Stored arrow type -> the Python type a row's value is converted to."""
_COLUMN_FIELDS = tuple(f for f in fields(TrafficRecord) if f.name != "features")
COLUMNS = tuple(f.name for f in _COLUMN_FIELDS)
"""The log's scalar columns, in stored order (``features`` is stored after them as a fixed-size list)."""


def arrow_schema(features_dtype: str, feature_dim: int, metadata: dict[str, str]):
    """The ``pyarrow.Schema`` of a part and of a journal: :data:`COLUMNS` typed from :class:`TrafficRecord`, then
    ``features`` (fixed-size list of ``feature_dim`` ``features_dtype``), with the log's metadata."""
    import pyarrow as pa

    cols = [pa.field(f.name, getattr(pa, f.metadata["arrow"])()) for f in _COLUMN_FIELDS]
    feats = pa.field("features", pa.list_(pa.from_numpy_dtype(np.dtype(features_dtype)), feature_dim))
    meta = {"format": LOG_FORMAT, "features_dtype": features_dtype, "feature_dim": str(feature_dim),
            **{str(k): str(v) for k, v in metadata.items()}}
    return pa.schema(cols + [feats], metadata=meta)


@dataclass
class TrafficLogConfig:
    """Settings of a :class:`TrafficLogWriter`.

    Attributes:
        directory: the log directory (created if missing; a writer resumes the part numbering of what is there).
        features_dtype: ``"float16"`` (default: half the bytes; the shipped head's predictions from float16 features
            differ by well under a token) or ``"float32"``.
        max_records_per_part: rows per part.
        max_part_bytes: a part is also cut when its buffered features reach this many bytes.
        max_part_age_s: seconds after a part's first row at which it is cut even if small (rows are in the journal
            long before: :data:`JOURNAL_INTERVAL_S`).
        max_total_bytes: the oldest parts are deleted while the log holds more (parquet + sidecars); ``None``: no bound.
        compression: parquet codec.
        metadata: strings stored in every part's schema metadata (e.g. the predictor's model revision and layer); a
            writer refuses a directory whose newest part holds other values for these keys.
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


def _journal_path(directory: Path, seq: int) -> Path:
    return directory / f"part-{seq:08d}.open"


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


def _list_journals(directory: Path) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _JOURNAL.match(p.name)))


def read_journal(path: str | Path):
    """``(table, torn)``: the complete batches of a journal as a ``pyarrow.Table`` (``None`` when not even its
    schema was written) and whether a torn last batch (a kill mid-append) was dropped."""
    import pyarrow as pa

    batches, schema, torn = [], None, False
    with pa.OSFile(str(path), "rb") as f:
        try:
            reader = pa.ipc.open_stream(f)
            schema = reader.schema
            while True:
                batches.append(reader.read_next_batch())
        except StopIteration:
            pass
        except (pa.ArrowInvalid, OSError, EOFError):
            torn = True
    return (None if schema is None else pa.Table.from_batches(batches, schema=schema)), torn


class _Buffer:
    """Rows of one part-to-be (the last buffer is open, the others are sealed and wait for their part)."""

    def __init__(self):
        self.rows: list[tuple] = []
        self.features: list[np.ndarray] = []
        self.first_at: float | None = None
        self.journaled = 0  # rows already appended to the journal


class TrafficLogWriter:
    """Append finished requests to a traffic log; thread-safe (call :meth:`record` from any thread or an event loop).

    Use as a context manager, or call :meth:`close` (writes what is buffered as a part). See the module docstring for
    the layout, durability (rows reach the journal within :data:`JOURNAL_INTERVAL_S`), rotation and the one-predictor
    rule.

    Attributes:
        recovered: ``[(part, rows)]``: journals a killed writer left unclosed, turned into their parts at start-up
            (also logged as a warning).
        num_records_written: rows written as parts by this writer.

    Raises:
        LenpredError: ``directory`` is a file; bad settings (:class:`TrafficLogConfig`); another writer holds the
            directory (one writer per directory: an ``flock`` on ``.writer.lock``); the directory's newest part was
            written for another predictor (other ``metadata`` or ``features_dtype``).
    """

    def __init__(self, config: TrafficLogConfig):
        self.config = config
        self.directory = Path(config.directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise LenpredError(f"traffic log {self.directory} is a file: pass a directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._dir_lock = open(self.directory / ".writer.lock", "w")  # noqa: SIM115 - held for the writer's life
        try:
            fcntl.flock(self._dir_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._dir_lock.close()
            raise LenpredError(f"traffic log {self.directory} is open in another writer (another process or engine): "
                               "give each writer its own directory") from None
        for tmp in self.directory.glob(".*.tmp"):  # a killed writer's temporaries
            _remove_tree(tmp)
        self.num_records_written = 0
        try:
            self.recovered = self._recover_journals()
            parts = list_parts(self.directory)
            self._feature_dim = self._check_same_predictor(parts[-1][1]) if parts else None
        except BaseException:
            self._dir_lock.close()
            raise
        self._next_seq = (parts[-1][0] + 1) if parts else 1
        self._dtype = np.dtype(config.features_dtype)
        self._buffers = [_Buffer()]
        self._journal = None  # (pyarrow file, IPC stream writer, path) of the oldest unwritten buffer
        self._lock = threading.Lock()  # guards the buffers
        self._write_lock = threading.Lock()  # one thread writes to disk at a time
        self._wake, self._stop = threading.Event(), threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lenpred-traffic-log", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the serving paths call these

    def record(self, record: TrafficRecord) -> None:
        """Buffer one finished request (microseconds; the log's own thread appends it to the journal within
        :data:`JOURNAL_INTERVAL_S` and writes the parts).

        Raises:
            LenpredError: features of another width than the log's, non-finite features, or the log's background
                writer failed (its error is re-raised here).
        """
        if self._stop.is_set():
            raise LenpredError(f"traffic log {self.directory} is closed: record before close(), or open a new writer")
        if self._error is not None:
            raise LenpredError(f"traffic log {self.directory}: writing failed ({self._error}); fix the cause "
                               "(disk full? permissions?) and restart the writer") from self._error
        with np.errstate(over="ignore"):  # float16 overflow -> inf, refused just below
            f = np.asarray(record.features, dtype=self._dtype).reshape(-1)
        if not np.isfinite(f).all():
            raise LenpredError("traffic-log features hold non-finite values (float16 overflows above 65504: use "
                               "features_dtype='float32')")
        row = record.values()
        with self._lock:
            if self._feature_dim is None:
                self._feature_dim = len(f)
            elif len(f) != self._feature_dim:
                raise LenpredError(f"traffic-log features have {len(f)} values, this log's have {self._feature_dim}: "
                                   "one log holds one predictor's features; use another directory")
            buf = self._buffers[-1]
            buf.rows.append(row)
            buf.features.append(f)
            if buf.first_at is None:
                buf.first_at = time.monotonic()
            if (len(buf.rows) >= self.config.max_records_per_part
                    or len(buf.rows) * f.nbytes >= self.config.max_part_bytes):
                self._buffers.append(_Buffer())  # sealed: it becomes one part
        self._wake.set()

    def flush(self) -> Path | None:
        """Write every buffered row as parts now (on the calling thread). Returns the last part's path, or ``None``
        if nothing was buffered."""
        with self._write_lock:
            with self._lock:
                if self._buffers[-1].rows:
                    self._buffers.append(_Buffer())
            return self._write_sealed()

    def close(self) -> None:
        """Stop the background thread and write what is buffered."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self.flush()
        self._dir_lock.close()  # releases the directory's lock

    def __enter__(self) -> "TrafficLogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _run(self) -> None:
        """Background thread: on each wake write the sealed or old-enough parts, then journal the open rows."""
        while not self._stop.is_set():
            self._wake.wait(JOURNAL_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                with self._write_lock:
                    with self._lock:
                        head = self._buffers[-1]
                        if head.rows and time.monotonic() - head.first_at >= self.config.max_part_age_s:
                            self._buffers.append(_Buffer())
                    self._write_sealed()
                    self._append_journal()
            except BaseException as exc:  # reported on the next record()
                self._error = exc
                return

    def _write_sealed(self) -> Path | None:
        """Write each sealed buffer as its part, oldest first (holding ``_write_lock``)."""
        path = None
        while True:
            with self._lock:
                if len(self._buffers) == 1:
                    return path
                buf, dim = self._buffers[0], self._feature_dim
            if buf.rows:
                path = self._write_part(_rows_table(buf.rows, np.stack(buf.features), dim, self.config),
                                        len(buf.rows))
            with self._lock:
                self._buffers.pop(0)

    def _append_journal(self) -> None:
        """Append the open buffer's rows not yet journaled (holding ``_write_lock``; no sealed buffer is left)."""
        with self._lock:
            buf, dim = self._buffers[0], self._feature_dim
            rows, feats = buf.rows[buf.journaled:], buf.features[buf.journaled:len(buf.rows)]
        if not rows:
            return
        table = _rows_table(rows, np.stack(feats), dim, self.config)
        if self._journal is None:
            import pyarrow as pa

            path = _journal_path(self.directory, self._next_seq)
            sink = pa.OSFile(str(path), "wb")
            self._journal = (sink, pa.ipc.new_stream(sink, table.schema), path)
        sink, writer, _ = self._journal
        writer.write_table(table)
        sink.flush()  # in the kernel's hands: survives this process being killed
        with self._lock:
            buf.journaled += len(rows)

    def _write_part(self, table, num_rows: int) -> Path:
        """One part + sidecar (parquet to a temporary, fsync; sidecar renamed into place; then the part), then its
        journal is deleted and the size bound enforced."""
        seq = self._next_seq
        path = _write_verified_part(self.directory, seq, table, self.config.compression)
        if self._journal is not None:
            sink, writer, _ = self._journal
            writer.close()
            sink.close()
            self._journal = None
        _journal_path(self.directory, seq).unlink(missing_ok=True)
        self._next_seq = seq + 1
        self.num_records_written += num_rows
        self._enforce_bound()
        return path

    def _recover_journals(self) -> list[tuple[Path, int]]:
        """Turn each journal without its part into that part (verified); delete stale and empty journals."""
        recovered = []
        for seq, journal in _list_journals(self.directory):
            part = _part_path(self.directory, seq)
            if part.exists():  # killed between writing the part and deleting its journal
                journal.unlink()
                continue
            table, torn = read_journal(journal)
            if table is not None and table.num_rows:
                _write_verified_part(self.directory, seq, table, self.config.compression)
                recovered.append((part, table.num_rows))
                logger.warning("traffic log %s: %s was not closed (the writer was killed); its %d rows are now %s%s",
                               self.directory, journal.name, table.num_rows, part.name,
                               " (a torn last batch was dropped)" if torn else "")
            journal.unlink()
        return recovered

    def _check_same_predictor(self, newest: Path) -> int:
        """The log's feature width; refuses a log whose newest part another predictor wrote."""
        import pyarrow.parquet as pq

        stored = {k.decode(): v.decode() for k, v in (pq.read_schema(newest).metadata or {}).items()}
        mine = {"features_dtype": self.config.features_dtype, **{str(k): str(v) for k, v in self.config.metadata.items()}}
        keys = sorted((set(stored) | set(mine)) - {"format", "feature_dim"})
        for key in keys:
            if stored.get(key) != mine.get(key):
                raise LenpredError(f"traffic log {self.directory} holds another predictor's rows ({newest.name}: "
                                   f"{key}={stored.get(key)!r}, this writer: {key}={mine.get(key)!r}); one log holds "
                                   "one predictor's features: pass another directory or move the old log away")
        return int(stored["feature_dim"])

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


def _rows_table(rows: list[tuple], features: np.ndarray, dim: int, config: TrafficLogConfig) -> Any:
    """Rows (:meth:`TrafficRecord.values`) and their ``(n, dim)`` features as a table of :func:`arrow_schema`."""
    import pyarrow as pa

    schema = arrow_schema(config.features_dtype, dim, config.metadata)
    cols = [pa.array(list(col), type=schema.field(name).type) for name, col in zip(COLUMNS, zip(*rows))]
    flat = pa.array(np.ascontiguousarray(features, dtype=config.features_dtype).reshape(-1))
    return pa.Table.from_arrays(cols + [pa.FixedSizeListArray.from_arrays(flat, dim)], schema=schema)


def _write_verified_part(directory: Path, seq: int, table, compression: str) -> Path:
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _part_path(directory, seq)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression)
    blob = sink.getvalue().to_pybytes()
    with atomic_path(_sidecar(path)) as tmp:
        _fsync_write(tmp, f"{hashlib.sha256(blob).hexdigest()}  {path.name}\n".encode())
    with atomic_path(path) as tmp:
        _fsync_write(tmp, blob)
    _fsync_dir(directory)
    return path


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
        unclosed: journals read whose part was never written (a writer still running, or killed: the next writer on
            the directory turns them into parts); their rows are included.
        torn_batches: journal batches dropped because a kill tore them.
        skipped: sidecars whose part is missing (the part being written when a writer was killed, or one deleted by
            rotation mid-way): nothing to read.
        metadata: the log's schema metadata (format, features_dtype, feature_dim, what the writer added), the same
            in every part.
    """

    columns: dict[str, np.ndarray]
    features: np.ndarray
    parts: list[Path]
    unclosed: list[Path]
    torn_batches: int
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


def _read_part(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    verify_part(path)
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise LenpredError(f"{path} passes its checksum but is not readable parquet ({exc}): delete it") from None


def read_traffic_log(directory: str | Path) -> TrafficLog:
    """Load every part of a log directory, each verified against its sidecar, and every unclosed journal's
    complete batches, in part order.

    Raises:
        LenpredError: not a directory; nothing to read; a part that fails :func:`verify_part` or is not a
            traffic-log part; two parts (or a part and a journal) whose metadata differ (another predictor, feature
            width or dtype): each message names the files and the key.
    """
    import pyarrow as pa

    directory = Path(directory)
    if not directory.is_dir():
        raise LenpredError(f"traffic log {directory} is not a directory: pass the directory a TrafficLogWriter wrote")
    parts = list_parts(directory)
    have = {seq for seq, _ in parts}
    journals = [(seq, p) for seq, p in _list_journals(directory) if seq not in have]  # stale ones have their part
    skipped = sorted(p for p in directory.glob(f"part-*.parquet{_SIDECAR}") if not p.with_suffix("").exists())
    if not parts and not journals:
        raise LenpredError(f"traffic log {directory} holds no parts (part-*.parquet): log some traffic first")
    tables, first, unclosed, torn_batches = [], None, [], 0
    for _, path in sorted(parts + journals):
        if path.suffix == ".open":
            t, torn = read_journal(path)
            torn_batches += torn
            if t is None:
                continue
            unclosed.append(path)
        else:
            t = _read_part(path)
        meta = {k.decode(): v.decode() for k, v in (t.schema.metadata or {}).items()}
        if meta.get("format") != LOG_FORMAT:
            raise LenpredError(f"{path} is not a {LOG_FORMAT} part (format {meta.get('format')!r}): move it out of "
                               "the log")
        if first is None:
            first = (path, meta)
        for key in sorted(set(meta) | set(first[1])):
            if meta.get(key) != first[1].get(key):
                raise LenpredError(f"{path} has {key}={meta.get(key)!r}, {first[0].name} has "
                                   f"{key}={first[1].get(key)!r}: one log holds one predictor's features; split the "
                                   "directory")
        tables.append(t.replace_schema_metadata(None))
    if first is None:
        raise LenpredError(f"traffic log {directory} holds no rows (only empty journals of killed writers): log some "
                           "traffic first")
    meta0 = first[1]
    table = pa.concat_tables(tables)
    dim = int(meta0["feature_dim"])
    flat = table.column("features").combine_chunks().values.to_numpy(zero_copy_only=False)
    columns = {}
    for name in COLUMNS:
        col = table.column(name)
        columns[name] = (np.asarray(col.to_pylist(), dtype=object) if pa.types.is_string(col.type)
                         else col.to_numpy().astype(np.float64))
    return TrafficLog(columns, flat.astype(np.float32).reshape(-1, dim), [p for _, p in parts], unclosed,
                      torn_batches, skipped, meta0)


def predictor_metadata(predictor) -> dict[str, str]:
    """What a log written for ``predictor`` (a :class:`lenpred.pipeline.LengthPredictor`) records in every part, so
    that ``lenpred train --traffic`` refuses a log whose features another predictor read: model id and revision,
    method, layers (JSON) and prompt rule."""
    import json

    c = predictor.config_
    return {"model_id": str(c.model_id), "model_revision": str(c.model_revision), "method": str(c.method),
            "layers": json.dumps(c.layers), "template_rule": str(c.template_rule)}
