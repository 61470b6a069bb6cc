"""The traffic log's files: part and journal names, verified parquet parts, checksummed journals, and the one-line
error for an operating-system failure (:mod:`lenpred.online.traffic_log` holds the schema, the writer and the reader).

A part is parquet with a SHA-256 sidecar (``sha256sum -c`` reads it). A journal is JSON lines, each line
``<hex SHA-256 of its JSON> <JSON>``: a header (the log's schema metadata), then one line per row, each written in
one ``write`` (:class:`JournalWriter`), so a flipped bit is detected, not read back.

Reading a journal tells three endings apart: every line complete; a **torn** tail (bytes after the last newline: a
writer killed or out of space mid-write, or one still writing, seen by a reader beside it; dropped and counted);
and **corruption** (a complete line that fails its checksum: :class:`lenpred.errors.LenpredError`). Only a flipped
bit in the very last newline reads as a torn line instead of a corrupt one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from pathlib import Path

from lenpred.errors import LenpredError
from lenpred.io import atomic_path

_PART = re.compile(r"^part-(\d{8})\.parquet$")
_JOURNAL = re.compile(r"^part-(\d{8})\.open$")
SIDECAR = ".sha256"


def part_path(directory: Path, seq: int) -> Path:
    """``directory/part-<seq, 8 digits>.parquet``."""
    return directory / f"part-{seq:08d}.parquet"


def journal_path(directory: Path, seq: int) -> Path:
    """``directory/part-<seq, 8 digits>.open``: the journal of part ``seq`` while it is being filled."""
    return directory / f"part-{seq:08d}.open"


def sidecar_path(part: Path) -> Path:
    """The part's checksum sidecar, ``<part>.sha256``."""
    return part.with_name(part.name + SIDECAR)


# ---------------------------------------------------------------------------------------------- errors


_FIXES = {
    errno.ENOSPC: "free disk space",
    errno.EDQUOT: "free space or raise the disk quota",
    errno.EFBIG: "the file-size limit is too small (ulimit -f): raise it",
    errno.EACCES: "make the directory writable (chmod, chattr -i, a read-write mount) or pass another one",
    errno.EPERM: "make the directory writable (chmod, chattr -i, a read-write mount) or pass another one",
    errno.EROFS: "the file system is read-only: pass a directory on a writable one",
    errno.ENOTDIR: "a component of the path is a file: pass a path made of directories",
    errno.ENOENT: "its parent cannot hold a new directory (e.g. under /proc): pass a directory on a normal disk",
    errno.EISDIR: "a directory stands where the log keeps a file: move it out of the log",
}


def os_error(directory: Path, doing: str, exc: OSError, then: str = "") -> LenpredError:
    """The one-line :class:`LenpredError` for an ``OSError`` met while ``doing`` something to the log in
    ``directory``: the operating system's reason, the file, the fix for that ``errno``, then ``then`` (what became
    of the rows)."""
    where = f" on {exc.filename}" if exc.filename else ""
    fix = _FIXES.get(exc.errno, "fix the cause and retry")
    reason = " ".join(str(exc.strerror or exc).split())
    return LenpredError(f"traffic log {directory}: {doing} failed ({reason}{where}): {fix}{then}")


# ---------------------------------------------------------------------------------------------- listing


def _listed(directory: Path, pattern: re.Pattern) -> list[tuple[int, Path]]:
    out = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if (m := pattern.match(entry.name)) is None:
                continue
            if entry.is_dir(follow_symlinks=False):  # the directory entry's type: no race with a concurrent delete
                raise LenpredError(f"{entry.path} is a directory where the traffic log keeps a file: move it out of "
                                   "the log")
            out.append((int(m.group(1)), Path(entry.path)))
    return sorted(out)


def list_parts(directory: str | Path) -> list[tuple[int, Path]]:
    """``[(seq, path)]`` of the parquet parts in ``directory``, oldest first (by part number).

    Raises:
        LenpredError: an entry named like a part is a directory.
        OSError: the directory cannot be listed (callers turn it into :func:`os_error`).
    """
    return _listed(Path(directory), _PART)


def list_journals(directory: str | Path) -> list[tuple[int, Path]]:
    """``[(seq, path)]`` of the journals (``part-N.open``) in ``directory``, oldest first; raises as
    :func:`list_parts`."""
    return _listed(Path(directory), _JOURNAL)


# ---------------------------------------------------------------------------------------------- parts


def fsync_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it."""
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


def write_verified_part(directory: Path, seq: int, table, compression: str) -> Path:
    """Write ``table`` (a ``pyarrow.Table``) as part ``seq`` with its sidecar: each to a temporary, fsynced and
    renamed, the sidecar first (a part is never visible without it), then the directory fsynced.

    Raises:
        OSError: the write failed (disk full, permissions); the sidecar just renamed is removed again, so a failed
            write leaves neither file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = part_path(directory, seq)
    side = sidecar_path(path)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression)
    blob = sink.getvalue().to_pybytes()
    try:
        with atomic_path(side) as tmp:
            fsync_write(tmp, f"{hashlib.sha256(blob).hexdigest()}  {path.name}\n".encode())
        with atomic_path(path) as tmp:
            fsync_write(tmp, blob)
        _fsync_dir(directory)
    except OSError:
        if not path.exists():
            side.unlink(missing_ok=True)
        raise
    return path


def read_part(path: Path):
    """A part as a ``pyarrow.Table``, its bytes read once and checked against its sidecar before parsing.

    Raises:
        LenpredError: no sidecar (a crash never leaves a part without one: the part was not written by the traffic
            log, or its sidecar was deleted), an unreadable sidecar, a SHA-256 mismatch (the part is corrupted), or
            bytes that pass the checksum but are not parquet. Each message names the file and the fix.
        FileNotFoundError: the part itself is gone (a writer's size bound deleted it meanwhile).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    side = sidecar_path(path)
    try:
        digest, name = side.read_text().split()
    except FileNotFoundError:
        if not path.exists():
            raise
        raise LenpredError(f"{path} has no checksum sidecar {side.name} (a crash never leaves a part without one): it "
                           "was not written by lenpred's traffic log or the sidecar was deleted; delete the part or "
                           "move it out of the log") from None
    except (OSError, UnicodeDecodeError, ValueError):
        raise LenpredError(f"{side} is unreadable (expected '<sha256>  {path.name}'): delete {path.name} and its "
                           "sidecar") from None
    blob = path.read_bytes()
    if name != path.name or digest != hashlib.sha256(blob).hexdigest():
        raise LenpredError(f"{path} fails its SHA-256 checksum ({side.name}): the part is corrupted; delete it and its "
                           "sidecar (the log's other parts stay usable)")
    try:
        return pq.ParquetFile(pa.BufferReader(blob)).read(use_threads=False)  # a third of read_table's cost
    except (OSError, pa.ArrowException) as exc:
        raise LenpredError(f"{path} passes its checksum but is not readable parquet ({exc}): delete it") from None


# ---------------------------------------------------------------------------------------------- journals


def journal_line(payload: dict) -> bytes:
    """One journal line: ``<hex SHA-256 of the JSON> <JSON of payload>\\n`` (compact JSON; floats round-trip
    exactly, infinities as ``Infinity``)."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    return hashlib.sha256(body).hexdigest().encode() + b" " + body + b"\n"


class JournalWriter:
    """Appends lines (:func:`journal_line`) to a journal file, its first line ``header``. Each line reaches the file
    in one ``write`` before :meth:`append` returns, so it survives the process being killed; the journal is not
    fsynced (a power cut can lose it). After a failed write, close it and start a new one (the file may end in a
    partial line)."""

    def __init__(self, path: Path, header: dict):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self._write(journal_line(header))
        except BaseException:
            self.close()
            raise

    def append(self, payload: dict) -> None:
        """Write one line for ``payload`` (a JSON-serialisable dict)."""
        self._write(journal_line(payload))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a short write (a nearly full disk) goes on where it stopped, or raises
            view = view[os.write(self._fd, view):]

    def close(self) -> None:
        """Close the file (idempotent; never raises: nothing is buffered)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError:
                pass


def read_journal(path: str | Path) -> tuple[dict | None, list[dict], bool]:
    """``(header, payloads, torn)``: a journal's verified header (``None`` when not even it is complete), the
    payloads of its complete lines after it, and whether a torn last line was dropped (module docstring). The file
    is read once, so a writer appending meanwhile yields a snapshot.

    Raises:
        LenpredError: a complete line fails its checksum or is not ``<sha256> <JSON object>``: the journal is
            corrupted (the message names it, the line and the rows before it).
        FileNotFoundError: the journal is gone (its part was written meanwhile).
    """
    lines = Path(path).read_bytes().split(b"\n")
    torn = lines.pop() != b""  # the bytes after the last newline: a line cut short
    decoded = [_decode_line(path, i, line) for i, line in enumerate(lines)]
    return (decoded[0] if decoded else None), decoded[1:], torn


def _decode_line(path, index: int, line: bytes) -> dict:
    digest, _, body = line.partition(b" ")
    try:
        if hashlib.sha256(body).hexdigest().encode() != digest:
            raise ValueError("checksum")
        payload = json.loads(body)
        if not isinstance(payload, dict):
            raise ValueError("not an object")
    except ValueError:
        raise LenpredError(f"{path}: line {index + 1} (after {max(index - 1, 0)} rows) fails its SHA-256 checksum: "
                           "the journal is corrupted and is not used; move it out of the log (the log's parts stay "
                           "usable)") from None
    return payload
