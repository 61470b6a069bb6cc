"""kill -9 of a fast traffic-log writer (``scripts/traffic_log_faults.py``): rows lost per kill, at random moments
and around rotations, what the reader reads back and what the next writer recovers.

A writer process (:func:`child`) records rows at ``rate`` rows/s (paced; float16 features of the shipped predictor's
width, :data:`DIM`) into one log directory. Before each ``record()`` call it publishes how many rows it has handed to
the log (a shared 8-byte counter), so a row whose ``record()`` had begun when the kill came counts as recorded
(conservative: lost includes the row in flight). :func:`run` kills it with SIGKILL: half the kills at a random
moment, half just after a part filled (the filling row recorded, the part being written: 0-15 ms later). After each
kill the log is read (every part checked against its SHA-256, every journal batch against its checksum); its rows
must be exactly rows 0..n-1, ids and features (:func:`check_log`); lost = recorded - n. The next kill's writer opens
the same directory, must recover exactly the rows the reader found in journals, and continues at row n.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError
from lenpred.io import write_json
from lenpred.studies import report_dict
from lenpred.tables import markdown_table

COUNTER = struct.Struct("<qdq")
"""The shared counter: rows handed to ``record()``, the writer's start time (0: not started), rows it recovered."""
DIM = 576
"""Feature width of the recorded rows (the shipped predictor's)."""


@dataclass
class TrafficLogFaultsConfig:
    """Settings of the kill -9 test."""

    kills: int = 24
    """Writers killed, alternately at a random moment and just after a part filled."""
    rate: float = 3000.0
    """Rows per second the writer records."""
    rows_per_part: int = 64
    """The log's ``max_records_per_part`` (a rotation every this many rows)."""
    seed: int = 0
    """Seed of the kill moments."""
    out: str = "results/scripts/traffic"
    """Directory of ``faults.json``."""

    def __post_init__(self):
        if self.kills < 1 or self.rate <= 0 or self.rows_per_part < 1:
            raise LenpredError("kills and rows_per_part must be >= 1 and rate > 0")


@dataclass
class TrafficLogFaultsReport:
    """``faults.json``."""

    config: dict
    """The settings (``kills``, ``rate_rows_per_s``, ``rows_per_part``, ``seed``) and the rows' ``feature_dim`` and
    ``features_dtype``."""
    trials: list
    """Per kill: its kind, the writer's first row, rows recorded, the paced rate, rows since the last rotation, rows
    read back and lost, rows this writer recovered (and the journal rows expected), unclosed journals, torn lines,
    whether the read was consistent (else the ``problem``)."""
    final: dict
    """After the last kill: ``rows``, the rows a last writer ``recovered`` and whether everything was ``ok``."""

    def to_dict(self) -> dict:
        return report_dict(self)


def _record(i: int):
    from lenpred.online.traffic_log import TrafficRecord

    return TrafficRecord(features=np.full(DIM, i % 2048, np.float32), expected=100.0, low=20.0, high=300.0,
                         num_output_tokens=i, finish_reason="stop", max_new_tokens=512, arrival_time_s=float(i),
                         finish_time_s=float(i))


def child(directory: str, counter: str, start: int, rate: float, rows_per_part: int) -> None:
    """The writer process: recover the log, record row ``start`` (its first call imports what the log needs), then
    rows ``start + 1, ...`` at ``rate`` until killed; the start time published is the first row's."""
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter

    with open(counter, "r+b") as f:
        shared = mmap.mmap(f.fileno(), COUNTER.size)
    w = TrafficLogWriter(TrafficLogConfig(directory, max_records_per_part=rows_per_part, max_part_age_s=3600,
                                          max_total_bytes=None))
    recovered = sum(rows for _, rows in w.recovered)
    i = start
    shared[:] = COUNTER.pack(i + 1, 0.0, recovered)
    w.record(_record(i))
    t0 = time.time()
    shared[:] = COUNTER.pack(i + 1, t0, recovered)
    while True:
        i += 1
        wait = t0 + (i - start) / rate - time.time()
        if wait > 0:
            time.sleep(wait)
        record = _record(i)
        shared[:] = COUNTER.pack(i + 1, t0, recovered)
        w.record(record)


def check_log(log, n_expected_min: int) -> str | None:
    """What is wrong with a log read back, or ``None``: rows must be 0..n-1 with their ids' features and finish
    times, and at least ``n_expected_min`` of them."""
    n = log.num_records
    if not np.array_equal(log.columns["num_output_tokens"], np.arange(n)):
        return "rows are not 0..n-1"
    if not np.array_equal(log.features, np.repeat((np.arange(n) % 2048)[:, None], log.features.shape[1], 1)):
        return "features differ from the rows' ids"
    if not np.array_equal(log.columns["finish_time_s"], np.arange(n)):
        return "finish times differ from the rows' ids"
    return None if n >= n_expected_min else f"{n} rows, fewer than the {n_expected_min} of earlier reads"


def _kill_at(proc, shared: mmap.mmap, kind: str, rate: float, rows_per_part: int, rng) -> tuple[int, float, int]:
    """Wait for the writer's first row, kill it (random moment or just after a part filled); returns
    ``(recorded, seconds from the first row to the kill, rows the writer recovered)``."""
    while (state := COUNTER.unpack(shared[:]))[1] == 0:
        if proc.poll() is not None:
            raise LenpredError(f"the writer exited with {proc.returncode} before recording")
        time.sleep(0.005)
    _, t0, recovered = state
    if kind == "random":
        delay = rng.uniform(0.1, 0.6)
    else:  # the row that fills part m is row m * rows_per_part - 1 of this writer; its part is written right after
        delay = (int(rng.integers(2, 6)) * rows_per_part - 1) / rate + rng.uniform(0.0, 0.015)
    time.sleep(max(0.0, t0 + delay - time.time()))
    os.kill(proc.pid, signal.SIGKILL)
    killed_s = time.time() - t0
    proc.wait()
    return COUNTER.unpack(shared[:])[0], killed_s, recovered


def _rows_in_parts(log) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in log.parts)


def _start_writer(log_dir: Path, counter: Path, start: int, cfg: TrafficLogFaultsConfig):
    """A fresh counter and a :func:`child` process writing from row ``start``: ``(process, shared counter)``."""
    counter.write_bytes(bytes(COUNTER.size))
    with open(counter, "r+b") as f:
        shared = mmap.mmap(f.fileno(), COUNTER.size)
    code = (f"from lenpred.studies.traffic_log_faults import child; "
            f"child({str(log_dir)!r}, {str(counter)!r}, {start}, {cfg.rate!r}, {cfg.rows_per_part})")
    return subprocess.Popen([sys.executable, "-c", code]), shared


def _trials(log_dir: Path, counter: Path, cfg: TrafficLogFaultsConfig) -> tuple[list[dict], int, int]:
    """Every kill's trial record; then the rows read back and the rows in journals after the last kill."""
    from lenpred.online.traffic_log import read_traffic_log

    rng = np.random.default_rng(cfg.seed)
    trials, n, journal_rows = [], 0, 0
    for k in range(cfg.kills):
        kind = "random" if k % 2 == 0 else "rotation"
        proc, shared = _start_writer(log_dir, counter, n, cfg)
        recorded, killed_s, recovered = _kill_at(proc, shared, kind, cfg.rate, cfg.rows_per_part, rng)
        log = read_traffic_log(log_dir)
        problem = check_log(log, n)
        trials.append({"kill": k + 1, "kind": kind, "start_row": n, "recorded": recorded,
                       "rows_per_s": (recorded - n - 1) / killed_s,
                       "since_rotation": (recorded - n) % cfg.rows_per_part,
                       "read_back": log.num_records, "lost": recorded - log.num_records,
                       "recovered_by_this_writer": recovered, "expected_recovered": journal_rows,
                       "unclosed_journals": len(log.unclosed), "torn_lines": log.torn_batches,
                       "consistent": problem is None, "problem": problem})
        n, journal_rows = log.num_records, log.num_records - _rows_in_parts(log)
    return trials, n, journal_rows


def run(cfg: TrafficLogFaultsConfig) -> TrafficLogFaultsReport:
    """Kill ``cfg.kills`` writers of one log (in a temporary directory), then open it once more and read it; the
    report is written to ``cfg.out/faults.json``."""
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, read_traffic_log

    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "log"
        trials, n, journal_rows = _trials(log_dir, Path(tmp) / "counter", cfg)
        with TrafficLogWriter(TrafficLogConfig(log_dir, max_total_bytes=None)) as w:
            final_recovered = sum(rows for _, rows in w.recovered)
        final = read_traffic_log(log_dir)
        final_ok = (check_log(final, n) is None and final.num_records == n and not final.unclosed
                    and final_recovered == journal_rows)
    report = TrafficLogFaultsReport(
        {"kills": cfg.kills, "rate_rows_per_s": cfg.rate, "rows_per_part": cfg.rows_per_part, "seed": cfg.seed,
         "feature_dim": DIM, "features_dtype": "float16"},
        trials, {"rows": n, "recovered": final_recovered, "ok": bool(final_ok)})
    write_json(Path(cfg.out) / "faults.json", report.to_dict())
    return report


def summary_rows(trials: list[dict]) -> list[list]:
    """One table row per kind of kill (and all): rate, rows lost per kill, torn lines, consistency, recovery."""
    rows = []
    for kind in ("random", "rotation", "all"):
        t = [x for x in trials if kind in ("all", x["kind"])]
        lost = [x["lost"] for x in t]
        rows.append([kind, len(t), f"{min(x['rows_per_s'] for x in t):,.0f}",
                     int(np.median([x["since_rotation"] for x in t])), max(lost), f"{np.mean(lost):.2f}",
                     ", ".join(f"{v}: {lost.count(v)}" for v in sorted(set(lost))),
                     sum(x["torn_lines"] for x in t), f"{sum(x['consistent'] for x in t)}/{len(t)}",
                     f"{sum(x['recovered_by_this_writer'] == x['expected_recovered'] for x in t)}/{len(t)}"])
    return rows


def render_markdown(report: TrafficLogFaultsReport) -> str:
    """The table per kind of kill (:func:`summary_rows`) and the final read's line."""
    f = report.final
    return (markdown_table(["kills at", "kills", "min rows/s", "rows since a part filled (median)", "max lost",
                            "mean lost", "lost: kills", "torn lines", "reads consistent", "next writer recovered all"],
                           summary_rows(report.trials), "lrrrrrlrrr")
            + f"\nfinal: {f['rows']} rows, last journals recovered: {f['recovered']} rows, every part verified, "
            f"no journal left: {f['ok']}")
