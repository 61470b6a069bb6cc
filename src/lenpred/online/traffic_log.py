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
    part-00000007.open            the journal of a part not written yet (JSON lines, a header then one line per
                                  row, each with its SHA-256); a full part's journal and the next one's can coexist

One declaration: the columns (:data:`COLUMNS`), the parquet / journal schema and the row type
(:class:`TrafficRecord`) all derive from :class:`TrafficRecord`'s fields. The file formats (verified parts,
checksummed journals) live in :mod:`lenpred.online.traffic_files`.

Durability: :meth:`TrafficLogWriter.record` appends the row to its part's journal before it returns (one ``write``,
no fsync), so a process killed at any moment, around rotations included, loses at most the row being recorded
(``scripts/traffic_log_faults.py`` measures it) — vLLM force-kills its engine process on Ctrl-C; a power cut can
lose the journal. The writer's thread writes the parts, so no caller waits for a part's fsync. A part is written to
a temporary, fsynced and renamed; its sidecar is renamed into place *before* the part, so a part without a sidecar
never comes from a crash (the reader refuses it as unverifiable) and a sidecar without its part is the part that was
being written (skipped, reported). Then the part's journal is deleted. A journal whose part exists is stale (killed
between the two steps) and is ignored. A journal without its part was **not closed**: :func:`read_traffic_log`
reads its complete, checksum-verified rows and reports it in ``unclosed``; the next writer on the directory turns
it into its part (verified, same number) and reports that in ``recovered``. A line torn by the kill is dropped and
counted; a line that fails its checksum is an error, never read or turned into a part.

Reading beside a running writer (``lenpred train --traffic`` while the server logs) gives a consistent snapshot:
the closed parts plus each journal's complete rows, whatever the writer rotates or deletes meanwhile
(:func:`read_traffic_log`).

Rotation: a new part every ``max_records_per_part`` rows, ``max_part_bytes`` of features, or ``max_part_age_s``
seconds after its first row (the writer's thread writes the parts; :meth:`TrafficLogWriter.record` only appends to
the journal); when the log's parts exceed ``max_total_bytes`` the oldest are deleted.

One log, one predictor: every part stores the writer's ``metadata`` (:func:`predictor_metadata`: model, revision,
method, layers, prompt rule) and the features' dtype and width. A writer refuses to append to a directory whose
newest part has other values, and the reader refuses a log whose parts disagree.
"""

from __future__ import annotations

import base64
import fcntl
import functools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from lenpred.errors import LenpredError
from lenpred.online.traffic_files import (SIDECAR, JournalWriter, journal_path, list_journals, list_parts, os_error,
                                          part_path, read_journal, read_part, sidecar_path, write_verified_part)

logger = logging.getLogger(__name__)

LOG_FORMAT = "lenpred-traffic-log/1"
FEATURE_DTYPES = ("float16", "float32")


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
    expected: float | None = _column("float32", "the expected length served, tokens (None: captured with no head, "
                                     "lenpred.online.capture)", None)
    low: float | None = _column("float32", "the interval's lower end served (after its margin), tokens", None)
    high: float | None = _column("float32", "the interval's upper end served (after its margin), tokens", None)
    low_raw: float | None = _column("float32", "the head's lower quantile before the margin, tokens", None)
    high_raw: float | None = _column("float32", "the head's upper quantile before the margin, tokens", None)
    prompt_sha256: str | None = _column("string", "hex SHA-256 of the prompt (groups samples of one prompt; the "
                                        "plug-in hashes its token ids: token_ids_sha256)", None)
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
    """The ``pyarrow.Schema`` of a part (and of a journal's rows read back): :data:`COLUMNS` typed from
    :class:`TrafficRecord`, then
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
        max_part_age_s: seconds after a part's first row at which it is cut even if small (its rows are in the
            journal from the start).
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


class _Buffer:
    """Rows of part ``seq``-to-be: the newest buffer is open, older ones are sealed and wait for their part. Its
    journal (``part-<seq>.open``) holds its first ``journaled`` rows."""

    def __init__(self, seq: int):
        self.seq = seq
        self.rows: list[tuple] = []
        self.features: list[np.ndarray] = []
        self.first_at: float | None = None
        self.sealed = False
        self.journal: JournalWriter | None = None
        self.journaled = 0

    @property
    def ready(self) -> bool:
        """Sealed, every row journaled and the journal closed: the part can be written."""
        return self.sealed and self.journal is None and self.journaled == len(self.rows)


class TrafficLogWriter:
    """Append finished requests to a traffic log; thread-safe (call :meth:`record` from any thread or an event loop).

    Use as a context manager, or call :meth:`close` (writes what is buffered as parts). :meth:`record` appends the
    row to its part's journal before it returns (tens of microseconds, no fsync), so a process killed at any moment
    loses at most the row being recorded; a thread of the writer's own writes each full part (parquet, fsync) and
    deletes its journal, so no caller waits for a part. See the module docstring for the layout, durability,
    rotation and the one-predictor rule.

    Attributes:
        recovered: ``[(part, rows)]``: journals a killed writer left unclosed, turned into their parts at start-up
            (also logged as a warning).
        num_records_written: rows written as parts by this writer.

    Raises:
        LenpredError: ``directory`` is a file, or cannot be created or written (a path under a file, under
            ``/proc``, an immutable or read-only directory: the message names the path and the fix); bad settings
            (:class:`TrafficLogConfig`); another writer holds the directory (one writer per directory: an ``flock``
            on ``.writer.lock``); an entry named like a part or a journal is a directory; the newest part fails its
            checksum or another predictor wrote it (other ``metadata`` or ``features_dtype``); a journal left by a
            killed writer fails its checksum (:func:`lenpred.online.traffic_files.read_journal`).
    """

    def __init__(self, config: TrafficLogConfig):
        self.config = config
        self.directory = Path(config.directory)
        self._dir_lock = _lock_directory(self.directory)
        self.num_records_written = 0
        try:
            self.recovered = self._recover_journals()
            parts = list_parts(self.directory)
            dim = self._check_same_predictor(parts[-1][1]) if parts else None
            self._part_bytes = deque((p, _part_size(p)) for _, p in parts)  # oldest first, for the size bound
        except OSError as exc:
            self._dir_lock.close()
            raise os_error(self.directory, "opening", exc) from None
        except BaseException:
            self._dir_lock.close()
            raise
        self._dtype = np.dtype(config.features_dtype)
        self._encoder = None if dim is None else _RowEncoder(arrow_schema(config.features_dtype, dim, config.metadata))
        self._buffers = [_Buffer((parts[-1][0] + 1) if parts else 1)]
        self._last_part: Path | None = None
        self._lock = threading.Lock()  # guards the buffers and the journals
        self._changed = threading.Condition(self._lock)  # a buffer became ready or was written
        self._stop = threading.Event()
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._part_loop, name="lenpred-traffic-log", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the serving paths call these

    def record(self, record: TrafficRecord) -> None:
        """Append one finished request to the journal (tens of microseconds on the calling thread; the writer's
        thread writes the parts).

        Raises:
            LenpredError: the writer is closed; features of another width than the log's, non-finite features; the
                journal append failed (the reason and the fix, e.g. a full disk: the row stays in memory and is
                journaled with the next row, or written as a part by :meth:`close`); or writing a part failed.
        """
        if self._closed:
            raise LenpredError(f"traffic log {self.directory} is closed: record before close(), or open a new writer")
        self._raise_error()
        with np.errstate(over="ignore"):  # float16 overflow -> inf, refused just below
            f = np.asarray(record.features, dtype=self._dtype).reshape(1, -1)
        if not np.isfinite(f).all():
            raise LenpredError("traffic-log features hold non-finite values (float16 overflows above 65504: use "
                               "features_dtype='float32')")
        row = record.values()
        with self._lock:
            if self._encoder is None:
                self._encoder = _RowEncoder(arrow_schema(self.config.features_dtype, f.shape[1], self.config.metadata))
            elif f.shape[1] != self._encoder.feature_dim:
                raise LenpredError(f"traffic-log features have {f.shape[1]} values, this log's have "
                                   f"{self._encoder.feature_dim}: one log holds one predictor's features; use another "
                                   "directory")
            buf = self._buffers[-1]
            buf.rows.append(row)
            buf.features.append(f[0])
            if buf.first_at is None:
                buf.first_at = time.monotonic()
            full = (len(buf.rows) >= self.config.max_records_per_part
                    or len(buf.rows) * f.nbytes >= self.config.max_part_bytes)
            try:
                if full:
                    self._seal_head()
                self._journal_pending()
            except OSError as exc:
                raise os_error(self.directory, "journaling a row", exc,
                               "; the row is kept in memory and journaled with the next one") from None

    def flush(self) -> Path | None:
        """Write every row recorded so far as parts (the writer's thread writes them; this waits). Returns the newest
        part this writer wrote, or ``None`` if it wrote none.

        Raises:
            LenpredError: the writer is closed, or a disk write failed (as :meth:`record`).
        """
        with self._changed:
            if self._closed:
                raise LenpredError(f"traffic log {self.directory} is closed: nothing to flush")
            try:
                if self._buffers[-1].rows:
                    self._seal_head()
                self._journal_pending()
            except OSError as exc:
                raise os_error(self.directory, "flushing", exc) from None
            head = self._buffers[-1].seq
            self._changed.notify_all()
            while self._buffers[0].seq < head and self._error is None:
                self._changed.wait()
        self._raise_error()
        return self._last_part

    def close(self) -> None:
        """Stop the writer's thread, then on the calling thread write every buffered row as parts. The directory's
        lock is released even when this fails, so a new writer can start in this process.

        Raises:
            LenpredError: a disk write failed (a full disk, an immutable directory: the reason and the fix); the rows
                already journaled stay in their journals, and the next writer on the directory turns them into parts.
        """
        if self._closed:
            return
        self._closed = True
        try:
            with self._changed:
                self._stop.set()
                self._changed.notify_all()
            self._thread.join()
            with self._lock:
                try:
                    if self._buffers[-1].rows:
                        self._seal_head()
                except OSError:
                    pass  # its journal could not be completed; the parts below hold the rows, and report failures
            while len(self._buffers) > 1:
                self._write_part(self._buffers[0])
        except OSError as exc:
            raise os_error(self.directory, "closing", exc, "; the rows stay in the journals (part-*.open), which the "
                           "next writer on the directory turns into parts") from None
        finally:
            self._dir_lock.close()  # releases the directory's lock

    def __enter__(self) -> "TrafficLogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _part_loop(self) -> None:
        """The writer's thread: write each ready buffer as its part, oldest first; seal the open buffer once it is
        ``max_part_age_s`` old. It stops on an error, kept for :meth:`record` / :meth:`flush` (:meth:`close` retries
        what is left)."""
        check_s = min(self.config.max_part_age_s, 1.0)
        try:
            while True:
                with self._changed:
                    while not self._stop.is_set() and not self._buffers[0].ready:
                        head = self._buffers[-1]
                        if head.rows and time.monotonic() - head.first_at >= self.config.max_part_age_s:
                            self._seal_head()
                        else:
                            self._changed.wait(check_s)
                    if self._stop.is_set():
                        return
                    buf = self._buffers[0]
                self._write_part(buf)
        except BaseException as exc:
            with self._changed:
                self._error = exc
                self._changed.notify_all()

    def _seal_head(self) -> None:
        """Seal the open buffer (its journal closed once complete) and open the next (holding ``_lock``)."""
        head = self._buffers[-1]
        head.sealed = True
        self._buffers.append(_Buffer(head.seq + 1))
        self._journal(head)

    def _journal_pending(self) -> None:
        """Journal the rows every buffer's journal lacks (usually the one just recorded; after a failed write, the
        journal rewritten from its first row); holding ``_lock``."""
        for buf in self._buffers:
            if not buf.ready:
                self._journal(buf)

    def _journal(self, buf: _Buffer) -> None:
        """Append ``buf``'s rows its journal lacks; close the journal of a sealed buffer (then ready, and the
        writer's thread is told). After a failed write the journal is dropped, to be rewritten from its start."""
        try:
            for row, f in zip(buf.rows[buf.journaled:], buf.features[buf.journaled:]):
                if buf.journal is None:
                    buf.journal = JournalWriter(journal_path(self.directory, buf.seq),
                                                {"metadata": _metadata(self._encoder.schema)})
                buf.journal.append({**dict(zip(COLUMNS, row)), "features": base64.b64encode(f.tobytes()).decode()})
                buf.journaled += 1
        except BaseException:
            if buf.journal is not None:
                buf.journal.close()
            buf.journal, buf.journaled = None, 0
            raise
        if buf.sealed and buf.journal is not None:
            buf.journal.close()
            buf.journal = None
            self._changed.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            exc = self._error
            raise (os_error(self.directory, "writing a part", exc) if isinstance(exc, OSError) else
                   LenpredError(f"traffic log {self.directory}: writing a part failed ({exc}); fix the cause and "
                                "restart the writer")) from exc

    def _write_part(self, buf: _Buffer) -> None:
        """Write the oldest buffer as its part, delete its journal, drop the buffer, then enforce the size bound."""
        import pyarrow as pa

        table = pa.Table.from_batches([self._encoder.batch(buf.rows, np.stack(buf.features))])
        self._last_part = write_verified_part(self.directory, buf.seq, table, self.config.compression)
        self._part_bytes.append((self._last_part, _part_size(self._last_part)))
        with self._changed:
            if buf.journal is not None:  # close() after a failed journal write
                buf.journal.close()
                buf.journal = None
            journal_path(self.directory, buf.seq).unlink(missing_ok=True)
            self._buffers.pop(0)
            self.num_records_written += len(buf.rows)
            self._changed.notify_all()
        self._enforce_bound()

    def _recover_journals(self) -> list[tuple[Path, int]]:
        """Turn each journal without its part into that part (verified); delete stale and empty journals."""
        recovered = []
        for seq, journal in list_journals(self.directory):
            part = part_path(self.directory, seq)
            if part.exists():  # killed between writing the part and deleting its journal
                journal.unlink()
                continue
            table, torn = _journal_table(journal)
            if table is not None and table.num_rows:
                write_verified_part(self.directory, seq, table, self.config.compression)
                recovered.append((part, table.num_rows))
                logger.warning("traffic log %s: %s was not closed (the writer was killed); its %d rows are now %s%s",
                               self.directory, journal.name, table.num_rows, part.name,
                               " (a torn last line was dropped)" if torn else "")
            journal.unlink()
        return recovered

    def _check_same_predictor(self, newest: Path) -> int:
        """The log's feature width; refuses a log whose newest part fails its checksum or another predictor wrote."""
        stored = _metadata(read_part(newest).schema)
        mine = {"features_dtype": self.config.features_dtype, **{str(k): str(v) for k, v in self.config.metadata.items()}}
        keys = sorted((set(stored) | set(mine)) - {"format", "feature_dim"})
        for key in keys:
            if stored.get(key) != mine.get(key):
                raise LenpredError(f"traffic log {self.directory} holds another predictor's rows ({newest.name}: "
                                   f"{key}={stored.get(key)!r}, this writer: {key}={mine.get(key)!r}); one log holds "
                                   "one predictor's features: pass another directory or move the old log away")
        return int(stored["feature_dim"])

    def _enforce_bound(self) -> None:
        """Delete the oldest parts (part first, then its sidecar) while the log's parts and sidecars take more than
        ``max_total_bytes`` (sizes kept as the parts are written: no directory scan per part)."""
        bound = self.config.max_total_bytes
        if bound is None:
            return
        total = sum(size for _, size in self._part_bytes)
        while total > bound and len(self._part_bytes) > 1:  # the newest part always stays
            p, size = self._part_bytes.popleft()
            p.unlink(missing_ok=True)
            sidecar_path(p).unlink(missing_ok=True)
            total -= size


def _part_size(part: Path) -> int:
    """Bytes of a part and its sidecar."""
    side = sidecar_path(part)
    return part.stat().st_size + (side.stat().st_size if side.exists() else 0)


class _RowEncoder:
    """Rows (:meth:`TrafficRecord.values`) and their features -> ``pyarrow.RecordBatch`` of ``schema``
    (:func:`arrow_schema`), the scalar columns through one struct array (one conversion, not one per column)."""

    def __init__(self, schema):
        import pyarrow as pa

        self.schema = schema
        self.feature_dim = schema.field("features").type.list_size
        self.dtype = np.dtype(schema.field("features").type.value_type.to_pandas_dtype())
        self._row_type = pa.struct([schema.field(name) for name in COLUMNS])

    def batch(self, rows: list[tuple], features: np.ndarray):
        """``features``: ``(len(rows), feature_dim)`` in the log's dtype."""
        import pyarrow as pa

        scalars = pa.array(rows, type=self._row_type).flatten()
        feats = pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), self.feature_dim)
        return pa.RecordBatch.from_arrays(scalars + [feats], schema=self.schema)


def _lock_directory(directory: Path):
    """Create ``directory`` if needed, check that files can be made in it, and take its writer lock (the open lock
    file, held for the writer's life). Raises as :class:`TrafficLogWriter` does."""
    import tempfile

    try:
        if directory.exists() and not directory.is_dir():
            raise LenpredError(f"traffic log {directory} is a file: pass a directory")
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", suffix=".tmp", dir=directory)  # an immutable directory fails
        os.close(fd)
        os.unlink(probe)
        lock = open(directory / ".writer.lock", "a")  # noqa: SIM115 - held for the writer's life
    except OSError as exc:
        raise os_error(directory, "creating the log directory", exc) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise LenpredError(f"traffic log {directory} is open in another writer (another process or engine): give "
                           "each writer its own directory") from None
    for tmp in directory.glob(".*.tmp"):  # a killed writer's temporaries
        _remove_tree(tmp)
    return lock


def _journal_table(path: Path) -> tuple[Any, bool]:
    """``(table, torn)``: a journal's complete, checksum-verified rows as a ``pyarrow.Table`` of the log's schema
    (``None`` when not even its header is complete), and whether a torn last line was dropped.

    Raises:
        LenpredError: a corrupted journal (:func:`lenpred.online.traffic_files.read_journal`), or one whose lines
            are not traffic-log rows.
        FileNotFoundError: the journal is gone (its part was written meanwhile).
    """
    import pyarrow as pa

    header, payloads, torn = read_journal(path)
    if header is None:
        return None, torn
    try:
        encoder = _journal_encoder(tuple(sorted((str(k), str(v)) for k, v in header["metadata"].items())))
        rows = [tuple(p.get(name) for name in COLUMNS) for p in payloads]
        feats = np.zeros((len(payloads), encoder.feature_dim), encoder.dtype)
        for i, p in enumerate(payloads):  # a width other than the header's raises
            feats[i] = np.frombuffer(base64.b64decode(p["features"]), encoder.dtype)
        return pa.Table.from_batches([encoder.batch(rows, feats)]), torn
    except (KeyError, TypeError, ValueError, AttributeError, pa.ArrowException) as exc:
        raise LenpredError(f"{path} passes its checksums but does not hold traffic-log rows ({exc!r}): move it out "
                           "of the log") from None


@functools.lru_cache(maxsize=8)
def _journal_encoder(metadata: tuple[tuple[str, str], ...]) -> _RowEncoder:
    """The encoder of the schema a journal header's metadata describes (cached: one read parses many journals of
    one log; a pure function of the metadata)."""
    meta = dict(metadata)
    return _RowEncoder(arrow_schema(meta["features_dtype"], int(meta["feature_dim"]), {}).with_metadata(meta))


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _metadata(schema) -> dict[str, str]:
    """A ``pyarrow.Schema``'s metadata as strings."""
    return {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}


# ---------------------------------------------------------------------------------------------------------- reading


@dataclass
class TrafficLog:
    """A traffic log read back (:func:`read_traffic_log`): a consistent snapshot, even beside a running writer.

    Attributes:
        columns: ``{name: (n,) array}`` for every name in :data:`COLUMNS`, rows ordered by part then finish order;
            numeric columns as float64 (NaN for nulls), string ones as object arrays (``None`` for nulls).
        features: ``(n, d)`` float32 (upcast from the stored dtype).
        parts: the verified parts read, oldest first.
        unclosed: journals read whose part was not written yet (a writer still running, or killed: the next writer
            on the directory turns them into parts); their complete, checksum-verified rows are included.
        torn_batches: journals whose torn last line was dropped (a writer killed or out of space mid-write, or one
            writing while this read ran).
        skipped: sidecars whose part is missing (the part being written, or one deleted by the size bound mid-way):
            nothing to read.
        metadata: the log's schema metadata (format, features_dtype, feature_dim, what the writer added), the same
            in every part.
        dropped: parts the writer's size bound deleted while this read ran; the parts read before them (older)
            are left out too, so the rows stay contiguous.
    """

    columns: dict[str, np.ndarray]
    features: np.ndarray
    parts: list[Path]
    unclosed: list[Path]
    torn_batches: int
    skipped: list[Path]
    metadata: dict[str, str]
    dropped: list[Path] = field(default_factory=list)

    @property
    def num_records(self) -> int:
        return len(self.features)

    @property
    def censored(self) -> np.ndarray:
        """``(n,)`` bool: the response hit its cap (``finish_reason == "length"``): its length is a lower bound."""
        return self.columns["finish_reason"] == "length"


_READ_TRIES = 5
"""Reads of a log in a row whose every listed part its writer's size bound deleted, before one gives up."""


@dataclass
class _Snapshot:
    """What :func:`_read_snapshot` read: ``(path, table)`` per part or journal, in part order."""

    tables: list[tuple[Path, Any]] = field(default_factory=list)
    parts: list[Path] = field(default_factory=list)
    unclosed: list[Path] = field(default_factory=list)
    torn_batches: int = 0
    dropped: list[Path] = field(default_factory=list)


def read_traffic_log(directory: str | Path) -> TrafficLog:
    """Load every part of a log directory, each verified against its sidecar, and every unclosed journal's
    complete, checksum-verified rows, in part order. Safe beside a running writer: the result is a snapshot
    (closed parts plus each journal's complete rows), whatever the writer rotates or deletes meanwhile.

    Raises:
        LenpredError: not a directory, or one that cannot be read; nothing to read; a part that fails
            :func:`lenpred.online.traffic_files.read_part` or is not a traffic-log part; a corrupted journal
            (:func:`lenpred.online.traffic_files.read_journal`); an entry named like a part or a journal that is a
            directory; two parts (or a part and a journal) whose metadata differ (another predictor, feature width
            or dtype): each message names the files and the key.
    """
    import pyarrow as pa

    directory = Path(directory)
    if not directory.is_dir():
        raise LenpredError(f"traffic log {directory} is not a directory: pass the directory a TrafficLogWriter wrote")
    try:
        for _ in range(_READ_TRIES):  # again while the size bound deleted every part listed before it was read
            snap = _read_snapshot(directory)
            if snap.tables or not snap.dropped:
                break
        skipped = sorted(p for p in directory.glob(f"part-*.parquet{SIDECAR}") if not p.with_suffix("").exists())
    except OSError as exc:
        raise os_error(directory, "reading", exc) from None
    if not snap.tables:
        raise LenpredError(f"traffic log {directory} holds no rows " + (
            f"(its writer's size bound deleted every part before it could be read, {_READ_TRIES} times): raise "
            "max_total_bytes" if snap.dropped else "(only empty journals of killed writers): log some traffic first"))
    meta = _same_metadata(snap.tables)
    for path, t in snap.tables:  # a part checksummed after an edit: its own sidecar cannot tell
        missing = [name for name in (*COLUMNS, "features") if name not in t.column_names]
        if missing:
            raise LenpredError(f"traffic-log part {path} lacks the column(s) {', '.join(missing)}: it was not "
                               "written by lenpred's traffic log; remove it from the log directory")
    table = pa.concat_tables([t.replace_schema_metadata(None) for _, t in snap.tables])
    flat = table.column("features").combine_chunks().values.to_numpy(zero_copy_only=False)
    columns = {}
    for name in COLUMNS:
        col = table.column(name)
        columns[name] = (np.asarray(col.to_pylist(), dtype=object) if pa.types.is_string(col.type)
                         else col.to_numpy().astype(np.float64))
    return TrafficLog(columns, flat.astype(np.float32).reshape(-1, int(meta["feature_dim"])), snap.parts,
                      snap.unclosed, snap.torn_batches, skipped, meta, snap.dropped)


def _read_snapshot(directory: Path) -> _Snapshot:
    """Read each part and unclosed journal once. The journals are listed before the parts, so every row is in a
    listed journal or a listed part. A journal gone when opened was written as its part meanwhile: that part is read
    instead. A part gone was deleted by the size bound, which deletes the oldest first: it and everything read
    before it are dropped, so the rows stay contiguous."""
    journals = list_journals(directory)
    parts = list_parts(directory)
    have = {seq for seq, _ in parts}
    entries = sorted(parts + [(seq, p) for seq, p in journals if seq not in have])
    if not entries:
        raise LenpredError(f"traffic log {directory} holds no parts (part-*.parquet): log some traffic first")
    snap = _Snapshot()
    for seq, path in entries:
        if path.suffix == ".open":
            try:
                table, torn = _journal_table(path)
            except FileNotFoundError:
                path = part_path(directory, seq)
            else:
                snap.torn_batches += torn
                if table is not None and table.num_rows:
                    snap.tables.append((path, table))
                    snap.unclosed.append(path)
                continue
        try:
            snap.tables.append((path, read_part(path)))
            snap.parts.append(path)
        except FileNotFoundError:
            snap = _Snapshot(torn_batches=snap.torn_batches, dropped=snap.dropped + snap.parts + [path])
    return snap


def _same_metadata(tables: list[tuple[Path, Any]]) -> dict[str, str]:
    """The schema metadata every part and journal shares.

    Raises:
        LenpredError: a table that is not a traffic-log part, or two whose metadata differ (names both files)."""
    first_path, first = tables[0][0], _metadata(tables[0][1].schema)
    for path, table in tables:
        meta = _metadata(table.schema)
        if meta.get("format") != LOG_FORMAT:
            raise LenpredError(f"{path} is not a {LOG_FORMAT} part (format {meta.get('format')!r}): move it out of "
                               "the log")
        for key in sorted(set(meta) | set(first)):
            if meta.get(key) != first.get(key):
                raise LenpredError(f"{path} has {key}={meta.get(key)!r}, {first_path.name} has "
                                   f"{key}={first.get(key)!r}: one log holds one predictor's features; split the "
                                   "directory")
    return first


ENGINE_FILE = "engine.json"
"""Beside a log's parts: the settings of the latest engine that started writing it (:func:`write_engine_settings`)."""
ENGINE_KEYS = {"policy", "decode_slots", "prefill_ahead", "max_num_seqs"}
"""What :func:`write_engine_settings` records (and :func:`read_engine_settings` requires)."""


def write_engine_settings(directory: str | Path, settings: dict) -> None:
    """Record, beside the parts of the traffic log in ``directory``, how the engine writing it serves (the plug-in's
    ``policy``, ``decode_slots``, ``prefill_ahead``, ``admit_by``, ``max_idle_s``, ``switch_margin_tokens``, its
    starvation guards ``aging_tokens_per_s`` and ``max_wait_s``, and vLLM's ``max_num_seqs``): what a
    replay of the log needs and the rows cannot show (under a parked policy a parked request looks like a running
    one). Written atomically at each engine start, so it holds the latest engine's settings; the parts' reader
    ignores it."""
    from lenpred.io import write_json

    write_json(Path(directory) / ENGINE_FILE, settings)


def read_engine_settings(directory: str | Path) -> dict | None:
    """The settings :func:`write_engine_settings` recorded in ``directory``; ``None`` when none were (a log written
    by ``lenpred serve``, or by a plug-in from before they were recorded).

    Raises:
        LenpredError: the file is there but not a JSON object with :data:`ENGINE_KEYS` and integer bounds (names the
            file and the fix).
    """
    import json

    path = Path(directory) / ENGINE_FILE
    if not path.exists():
        return None
    try:
        settings = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LenpredError(f"{path} cannot be read ({exc}): delete it (the engine rewrites it when it starts) or "
                           "pass what it holds yourself (lenpred whatif --decode-slots, --aging-tokens-per-s, "
                           "--max-wait-s)") from exc
    missing = ENGINE_KEYS - set(settings) if isinstance(settings, dict) else ENGINE_KEYS
    bounds_ok = not missing and all(isinstance(settings[k], int) and settings[k] >= 1
                                    for k in ("decode_slots", "max_num_seqs"))
    window = None if missing else settings["prefill_ahead"]
    if not bounds_ok or not (window is None or isinstance(window, int) and window >= 0):
        raise LenpredError(f"{path} is not the engine settings lenpred writes (needs {', '.join(sorted(ENGINE_KEYS))}"
                           ", the bounds as integers >= 1 and the window >= 0): delete it (the engine rewrites it) or "
                           "pass what it holds yourself (lenpred whatif --decode-slots, --aging-tokens-per-s, "
                           "--max-wait-s)")
    return settings


def token_ids_sha256(token_ids) -> str | None:
    """Hex SHA-256 of a prompt's token ids as little-endian int32 (the vLLM plug-in's ``prompt_sha256``: samples of
    one prompt share it, so a refit trains them as one weighted row and its intervals cluster by prompt); ``None``
    for ``None`` (a prompt given as embeddings)."""
    import hashlib

    if token_ids is None:
        return None
    return hashlib.sha256(np.asarray(token_ids, dtype="<i4").tobytes()).hexdigest()


def predictor_metadata(predictor) -> dict[str, str]:
    """What a log written for ``predictor`` (a :class:`lenpred.pipeline.LengthPredictor`) records in every part, so
    that ``lenpred train --traffic`` refuses a log whose features another predictor read: model id and revision,
    method, layers (JSON) and prompt rule."""
    import json

    c = predictor.config_
    return {"model_id": str(c.model_id), "model_revision": str(c.model_revision), "method": str(c.method),
            "layers": json.dumps(c.layers), "template_rule": str(c.template_rule)}
