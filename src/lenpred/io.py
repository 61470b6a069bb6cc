"""Atomic file writes and content hashes shared by every artifact (benchmark shards, caches, heads)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from lenpred.errors import LenpredError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    Works for files and directories. On an exception the temporary is removed, so a killed or
    failed write never leaves a half-written ``path`` behind (rename is atomic on POSIX).

    Raises:
        LenpredError: ``path`` exists as a directory where a file was written, or the other way round.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    target = tmp / path.name
    try:
        yield target
        if path.exists() and path.is_dir() != target.is_dir():
            kind = "a directory" if path.is_dir() else "a file"
            raise LenpredError(f"{path} exists as {kind}, where lenpred writes a "
                               f"{'directory' if target.is_dir() else 'file'}: remove it or choose another path")
        if path.is_dir() and target.is_dir():
            shutil.rmtree(path)
        os.replace(target, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON (key order kept), atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def stable_hash(obj: Any, length: int = 16) -> str:
    """Hex SHA-256 prefix of the canonical JSON of ``obj`` (sorted keys), for config/plan fingerprints."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def file_sha256(path: str | os.PathLike, chunk_bytes: int = 1 << 22) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def write_parquet_checked(table, path: str | os.PathLike) -> str:
    """Write a ``pyarrow.Table`` as parquet, atomically, with a sidecar ``<path>.sha256`` holding the file's
    SHA-256 (``sha256sum`` format); returns the digest."""
    import pyarrow.parquet as pq

    path = Path(path)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    digest = file_sha256(path)
    with atomic_path(path.with_suffix(path.suffix + ".sha256")) as tmp:
        tmp.write_text(f"{digest}  {path.name}\n")
    return digest


def read_parquet_checked(path: str | os.PathLike):
    """The ``pyarrow.Table`` written by :func:`write_parquet_checked`, or ``None`` when the file or its sidecar
    is missing or the checksum does not match the bytes (a corrupt or hand-edited file is not used)."""
    import pyarrow.parquet as pq

    path = Path(path)
    sidecar = path.with_suffix(path.suffix + ".sha256")
    if not (path.exists() and sidecar.exists()):
        return None
    if sidecar.read_text().split()[0] != file_sha256(path):
        return None
    return pq.read_table(path)
