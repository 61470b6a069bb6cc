"""kill -9 of a fast traffic-log writer: rows lost per kill, at random moments and around rotations, what the reader
reads back and what the next writer recovers.

    python scripts/traffic_log_faults.py [--kills 24] [--rate 3000] [--rows-per-part 64] [--out DIR]

A writer process records rows at ``--rate`` rows/s (paced; float16 features of the shipped predictor's width, 576)
into one log directory. Before each ``record()`` call it publishes how many rows it has handed to the log (a shared
8-byte counter), so a row whose ``record()`` had begun when the kill came counts as recorded (conservative: lost
includes the row in flight). This script kills it with SIGKILL: half the kills at a random moment, half just after a
part filled (the filling row recorded, the part being written: 0-15 ms later). After each kill the log is read (every
part checked against its SHA-256, every journal batch against its checksum); its rows must be exactly rows 0..n-1,
ids and features; lost = recorded - n. The next kill's writer opens the same directory, must recover exactly the
rows the reader found in journals, and continues at row n. Writes ``DIR/faults.json`` (default
``results/scripts/traffic``) and prints a table.
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_COUNTER = struct.Struct("<qdq")  # rows handed to record(), writer's start time (0: not started), rows recovered
DIM = 576


def _record(i: int):
    from lenpred.online.traffic_log import TrafficRecord

    return TrafficRecord(features=np.full(DIM, i % 2048, np.float32), expected=100.0, low=20.0, high=300.0,
                         num_output_tokens=i, finish_reason="stop", max_new_tokens=512, arrival_time_s=float(i),
                         finish_time_s=float(i))


def child(directory: str, counter: str, start: int, rate: float, rows_per_part: int) -> None:
    """The writer: recover the log, record row ``start`` (its first call imports what the log needs), then rows
    ``start + 1, ...`` at ``rate`` until killed; the start time published is the first row's."""
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter

    with open(counter, "r+b") as f:
        shared = mmap.mmap(f.fileno(), _COUNTER.size)
    w = TrafficLogWriter(TrafficLogConfig(directory, max_records_per_part=rows_per_part, max_part_age_s=3600,
                                          max_total_bytes=None))
    recovered = sum(rows for _, rows in w.recovered)
    i = start
    shared[:] = _COUNTER.pack(i + 1, 0.0, recovered)
    w.record(_record(i))
    t0 = time.time()
    shared[:] = _COUNTER.pack(i + 1, t0, recovered)
    while True:
        i += 1
        wait = t0 + (i - start) / rate - time.time()
        if wait > 0:
            time.sleep(wait)
        record = _record(i)
        shared[:] = _COUNTER.pack(i + 1, t0, recovered)
        w.record(record)


def _check(log, n_expected_min: int) -> str | None:
    """What is wrong with a log read back, or ``None``: rows must be 0..n-1 with their ids' features."""
    n = log.num_records
    ids = log.columns["num_output_tokens"]
    if not np.array_equal(ids, np.arange(n)):
        return "rows are not 0..n-1"
    if not np.array_equal(log.features, np.repeat((np.arange(n) % 2048)[:, None], log.features.shape[1], 1)):
        return "features differ from the rows' ids"
    if not np.array_equal(log.columns["finish_time_s"], np.arange(n)):
        return "finish times differ from the rows' ids"
    return None if n >= n_expected_min else f"{n} rows, fewer than the {n_expected_min} of earlier reads"


def _kill_at(proc, shared: mmap.mmap, kind: str, rate: float, rows_per_part: int, rng) -> tuple[int, float, int]:
    """Wait for the writer's first row, kill it (random moment or just after a part filled); returns
    ``(recorded, seconds from the first row to the kill, rows the writer recovered)``."""
    while (state := _COUNTER.unpack(shared[:]))[1] == 0:
        if proc.poll() is not None:
            raise SystemExit(f"the writer exited with {proc.returncode} before recording")
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
    return _COUNTER.unpack(shared[:])[0], killed_s, recovered


def run(kills: int, rate: float, rows_per_part: int, seed: int) -> dict:
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, read_traffic_log

    rng = np.random.default_rng(seed)
    trials, n, journal_rows = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        log_dir, counter = Path(tmp) / "log", Path(tmp) / "counter"
        for k in range(kills):
            kind = "random" if k % 2 == 0 else "rotation"
            counter.write_bytes(bytes(_COUNTER.size))
            with open(counter, "r+b") as f:
                shared = mmap.mmap(f.fileno(), _COUNTER.size)
            proc = subprocess.Popen([sys.executable, __file__, "--child", str(log_dir), str(counter), str(n),
                                     str(rate), str(rows_per_part)])
            recorded, killed_s, recovered = _kill_at(proc, shared, kind, rate, rows_per_part, rng)
            log = read_traffic_log(log_dir)
            problem = _check(log, n)
            in_journals = log.num_records - _rows_in_parts(log)
            trials.append({"kill": k + 1, "kind": kind, "start_row": n, "recorded": recorded,
                           "rows_per_s": (recorded - n - 1) / killed_s, "since_rotation": (recorded - n) % rows_per_part,
                           "read_back": log.num_records, "lost": recorded - log.num_records,
                           "recovered_by_this_writer": recovered, "expected_recovered": journal_rows,
                           "unclosed_journals": len(log.unclosed), "torn_lines": log.torn_batches,
                           "consistent": problem is None, "problem": problem})
            n, journal_rows = log.num_records, in_journals
        with TrafficLogWriter(TrafficLogConfig(log_dir, max_total_bytes=None)) as w:
            final_recovered = sum(rows for _, rows in w.recovered)
        final = read_traffic_log(log_dir)
        final_ok = (_check(final, n) is None and final.num_records == n and not final.unclosed
                    and final_recovered == journal_rows)
    return {"config": {"kills": kills, "rate_rows_per_s": rate, "rows_per_part": rows_per_part, "seed": seed,
                       "feature_dim": DIM, "features_dtype": "float16"},
            "trials": trials, "final": {"rows": n, "recovered": final_recovered, "ok": bool(final_ok)}}


def _rows_in_parts(log) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in log.parts)


def summary(result: dict) -> list[list]:
    """One table row per kind of kill (and all): rate, rows lost per kill, torn lines, consistency, recovery."""
    rows = []
    for kind in ("random", "rotation", "all"):
        t = [x for x in result["trials"] if kind in ("all", x["kind"])]
        lost = [x["lost"] for x in t]
        rows.append([kind, len(t), f"{min(x['rows_per_s'] for x in t):,.0f}",
                     int(np.median([x["since_rotation"] for x in t])), max(lost), f"{np.mean(lost):.2f}",
                     ", ".join(f"{v}: {lost.count(v)}" for v in sorted(set(lost))),
                     sum(x["torn_lines"] for x in t), f"{sum(x['consistent'] for x in t)}/{len(t)}",
                     f"{sum(x['recovered_by_this_writer'] == x['expected_recovered'] for x in t)}/{len(t)}"])
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, directory, counter, start, rate, rows_per_part = sys.argv
        child(directory, counter, int(start), float(rate), int(rows_per_part))
        return
    from lenpred.io import write_json
    from lenpred.tables import markdown_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=24)
    ap.add_argument("--rate", type=float, default=3000.0, help="rows per second the writer records")
    ap.add_argument("--rows-per-part", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/scripts/traffic")
    args = ap.parse_args()
    result = run(args.kills, args.rate, args.rows_per_part, args.seed)
    write_json(Path(args.out) / "faults.json", result)
    print(markdown_table(["kills at", "kills", "min rows/s", "rows since a part filled (median)", "max lost",
                          "mean lost", "lost: kills", "torn lines", "reads consistent", "next writer recovered all"],
                         summary(result), "lrrrrrlrrr"))
    f = result["final"]
    print(f"final: {f['rows']} rows, last journals recovered: {f['recovered']} rows, every part verified, "
          f"no journal left: {f['ok']}")


if __name__ == "__main__":
    main()
