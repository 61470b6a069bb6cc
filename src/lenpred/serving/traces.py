"""Public arrival traces, replayed as arrival times: the Azure LLM inference trace 2023 (Patel et al., "Splitwise",
ISCA 2024; CC-BY-4.0): per-request timestamps of two services, ``code`` (very bursty: inter-arrival CV 13) and
``conv`` (close to Poisson: CV 1.1). Only the timestamps are used: the traces hold no prompts, and their token
counts do not fit a small model, so prompts come from a benchmark's test split.

The files are read from a local directory (``../shared/traces`` by default, ``LENPRED_TRACE_DIR`` or an argument),
checked against its ``SHA256SUMS`` when present; nothing is downloaded.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError
from lenpred.io import file_sha256

TRACES = {"code": "AzureLLMInferenceTrace_code.csv", "conv": "AzureLLMInferenceTrace_conv.csv"}
"""Trace name -> its file (Azure/AzurePublicDataset, ``data/``)."""
DEFAULT_TRACE_DIR = "../shared/traces"


def trace_dir(directory: str | Path | None = None) -> Path:
    """``directory``, else ``$LENPRED_TRACE_DIR``, else :data:`DEFAULT_TRACE_DIR` (relative to the working
    directory)."""
    return Path(directory or os.environ.get("LENPRED_TRACE_DIR") or DEFAULT_TRACE_DIR)


def load_trace(name: str, directory: str | Path | None = None) -> np.ndarray:
    """``(n,)`` float64 arrival times in seconds from the trace's first request, sorted (read once per file).

    Raises:
        LenpredError: an unknown trace (the message lists them), a missing file (names the directory and the
            override), or a file whose SHA-256 differs from the directory's ``SHA256SUMS``.
    """
    if name not in TRACES:
        raise LenpredError(f"unknown trace '{name}'; valid: {', '.join(TRACES)}")
    path = trace_dir(directory) / TRACES[name]
    if not path.is_file():
        raise LenpredError(f"trace file {path} not found: put the Azure LLM inference trace 2023 there, or point "
                           "LENPRED_TRACE_DIR at the directory that holds it")
    return _read_trace(str(path.resolve()), path.stat().st_mtime_ns).copy()


@functools.lru_cache(maxsize=8)
def _read_trace(path: str, mtime_ns: int) -> np.ndarray:
    """The file's arrival times (cached per path and modification time), checked against ``SHA256SUMS`` beside it."""
    import pyarrow.csv as pc

    file = Path(path)
    sums = file.parent / "SHA256SUMS"
    if sums.is_file():
        want = {line.split()[1]: line.split()[0] for line in sums.read_text().splitlines() if len(line.split()) == 2}
        if file.name in want and file_sha256(file) != want[file.name]:
            raise LenpredError(f"{file} does not match {sums}: the file changed; restore it from its repository")
    table = pc.read_csv(file)
    if "TIMESTAMP" not in table.column_names:
        raise LenpredError(f"{file} has no TIMESTAMP column: it is not an Azure LLM inference trace file")
    stamps = table.column("TIMESTAMP").to_numpy().astype("datetime64[ns]")
    return np.sort((stamps - stamps.min()) / np.timedelta64(1, "s")).astype(np.float64)


def trace_slice(times: np.ndarray, n: int, rate_req_s: float, seed: int) -> np.ndarray:
    """``(n,)`` arrival times in seconds: ``n`` consecutive arrivals of ``times`` from a random offset
    (``np.random.default_rng(seed)``), shifted to start at 0 and stretched so their mean rate ``(n − 1) / span`` is
    ``rate_req_s``: the trace's burst structure at the load a run asks for.

    Raises:
        LenpredError: ``n < 2``, more requests than the trace holds, a rate <= 0, or a slice whose arrivals all
            fall at one instant.
    """
    if n < 2 or n > len(times) or rate_req_s <= 0:
        raise LenpredError(f"a trace slice needs 2 <= n <= {len(times)} requests and a rate > 0, got n={n}, "
                           f"rate={rate_req_s}")
    start = int(np.random.default_rng(seed).integers(0, len(times) - n + 1))
    part = times[start:start + n] - times[start]
    if part[-1] <= 0:
        raise LenpredError(f"the trace slice at offset {start} spans 0 s: draw another seed")
    return part * ((n - 1) / rate_req_s / part[-1])


def interarrival_cv(times: np.ndarray) -> float:
    """The coefficient of variation of the gaps between consecutive arrivals (1 for a Poisson process)."""
    gaps = np.diff(np.sort(times))
    return float(gaps.std() / gaps.mean())
