"""Traffic log: round trip, rotation, size bound, checksums, the journal, one predictor per log, kill -9 of a writer
mid-part and after its last row, reads beside a live writer, a flipped journal bit, full disks and bad paths (the
kill -9 numbers at 3,000 rows/s come from scripts/traffic_log_faults.py, not from a timed test)."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord, list_parts, read_traffic_log


def _log(writer, i, **kw):
    writer.record(TrafficRecord(features=np.full(4, i, np.float32), expected=10.0 + i, low=5.0, high=20.0,
                                num_output_tokens=i, finish_reason="length" if i % 2 else "stop", max_new_tokens=64,
                                arrival_time_s=100.0 + i, first_token_time_s=100.5 + i, finish_time_s=101.0 + i, **kw))


def _row(features, n=1, t=0.0):
    return TrafficRecord(features=features, expected=1.0, low=0.0, high=2.0, num_output_tokens=n,
                         finish_reason="stop", arrival_time_s=0.0, finish_time_s=t)


def _wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_round_trip_and_count_rotation(tmp_path):
    with TrafficLogWriter(TrafficLogConfig(tmp_path, max_records_per_part=3)) as w:
        for i in range(7):
            _log(w, i, low_raw=6.0, high_raw=19.0, prompt_sha256="ab" * 32 if i == 0 else None, group="chat")
    assert [p.name for _, p in list_parts(tmp_path)] == ["part-00000001.parquet", "part-00000002.parquet",
                                                         "part-00000003.parquet"]
    log = read_traffic_log(tmp_path)
    assert log.num_records == 7 and log.features.dtype == np.float32
    np.testing.assert_array_equal(log.features[:, 0], np.arange(7))
    np.testing.assert_array_equal(log.columns["num_output_tokens"], np.arange(7))
    np.testing.assert_array_equal(log.censored, [False, True, False, True, False, True, False])
    assert log.columns["finish_time_s"][6] == 107.0 and log.columns["low_raw"][0] == 6.0
    assert log.columns["prompt_sha256"][0] == "ab" * 32 and log.columns["prompt_sha256"][1] is None
    assert log.metadata["features_dtype"] == "float16" and log.metadata["feature_dim"] == "4"


def test_float16_rounding_and_float32_option(tmp_path):
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "h")) as w:
        _log(w, 0)
        w.record(_row(np.array([0.1, 1000.3, -2.0, 3.0])))
    # float16 keeps 11 significant bits: 0.1 -> 0.0999755859375, 1000.3 -> 1000.5
    np.testing.assert_array_equal(read_traffic_log(tmp_path / "h").features[1], [0.0999755859375, 1000.5, -2, 3])
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "f", features_dtype="float32")) as w:
        w.record(_row(np.array([0.1, 1000.3, -2.0, 3.0])))
    np.testing.assert_array_equal(read_traffic_log(tmp_path / "f").features[0], np.float32([0.1, 1000.3, -2, 3]))


def test_bad_rows_refused(tmp_path):
    with TrafficLogWriter(TrafficLogConfig(tmp_path)) as w:
        _log(w, 1)
        with pytest.raises(LenpredError, match="have 4"):
            w.record(_row(np.zeros(5)))
        with pytest.raises(LenpredError, match="float32"):
            w.record(_row(np.full(4, 1e6)))
        with pytest.raises(LenpredError, match="without finish_reason"):
            w.record(TrafficRecord(features=np.zeros(4), expected=1.0, low=0, high=2, num_output_tokens=1,
                                   finish_reason=None, arrival_time_s=0, finish_time_s=1))
        with pytest.raises(LenpredError, match=">= 0"):
            _row(np.zeros(4), n=-1)
    with pytest.raises(LenpredError, match="features_dtype"):
        TrafficLogConfig(tmp_path, features_dtype="int8")


def test_size_bound_drops_oldest_parts(tmp_path):
    with TrafficLogWriter(TrafficLogConfig(tmp_path, max_records_per_part=2)) as w:
        for i in range(6):
            _log(w, i)
        w.flush()
        one_part = sum(p.stat().st_size for p in tmp_path.iterdir()) / 3
        w.config.max_total_bytes = int(2.5 * one_part)  # room for two parts of these sizes
        for i in range(6, 8):
            _log(w, i)
    log = read_traffic_log(tmp_path)
    assert [p.name for p in log.parts] == ["part-00000003.parquet", "part-00000004.parquet"]
    np.testing.assert_array_equal(log.columns["num_output_tokens"], [4, 5, 6, 7])


def test_time_flush_without_close(tmp_path):
    w = TrafficLogWriter(TrafficLogConfig(tmp_path, max_part_age_s=0.05))
    _log(w, 3)
    deadline = time.monotonic() + 10
    while not list_parts(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert read_traffic_log(tmp_path).num_records == 1
    w.close()


def test_a_sidecar_without_its_part_is_the_part_being_written_and_is_skipped(tmp_path):
    with TrafficLogWriter(TrafficLogConfig(tmp_path)) as w:
        _log(w, 0)
    (tmp_path / "part-00000002.parquet.sha256").write_text("00  part-00000002.parquet\n")  # killed between renames
    log = read_traffic_log(tmp_path)
    assert log.num_records == 1 and [p.name for p in log.skipped] == ["part-00000002.parquet.sha256"]


def test_corrupt_and_unverifiable_parts_refused(tmp_path):
    with TrafficLogWriter(TrafficLogConfig(tmp_path, max_records_per_part=2)) as w:
        for i in range(4):
            _log(w, i)
    first = tmp_path / "part-00000001.parquet"
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(LenpredError, match="part-00000001.parquet fails its SHA-256"):
        read_traffic_log(tmp_path)
    first.unlink()
    (tmp_path / "part-00000001.parquet.sha256").unlink()
    (tmp_path / "part-00000002.parquet.sha256").unlink()
    with pytest.raises(LenpredError, match="no checksum sidecar"):
        read_traffic_log(tmp_path)
    with pytest.raises(LenpredError, match="not a directory"):
        read_traffic_log(tmp_path / "nothing")


_KILLED_WRITER = textwrap.dedent("""
    import sys, numpy as np
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord
    w = TrafficLogWriter(TrafficLogConfig(sys.argv[1], max_records_per_part=50, max_part_age_s=3600))
    i = 0
    while True:  # killed from outside; parts are cut on the background thread
        w.record(TrafficRecord(features=np.full(8, i % 1000, np.float32), expected=1.0, low=0.0, high=2.0,
                               num_output_tokens=i, finish_reason="stop", arrival_time_s=0.0, finish_time_s=float(i)))
        i += 1
""")


def test_kill_9_mid_part_keeps_every_completed_part(tmp_path):
    """A writer killed with SIGKILL while it logs leaves only complete parts, each verified against its sidecar, and
    the open part's journal; the rows read back are consecutive; a new writer turns the journal into its part and
    resumes the numbering."""
    log_dir = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(log_dir)])
    try:
        _wait_for(lambda: log_dir.exists() and len(list_parts(log_dir)) >= 5, timeout_s=60)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    log = read_traffic_log(log_dir)
    n = log.num_records
    assert n >= 250 and log.torn_batches <= 1
    np.testing.assert_array_equal(log.columns["num_output_tokens"], np.arange(n))
    np.testing.assert_array_equal(log.features[:, 0], np.arange(n) % 1000)
    with TrafficLogWriter(TrafficLogConfig(log_dir)) as w:
        assert sum(rows for _, rows in w.recovered) == n - 50 * len(log.parts)
        w.record(_row(np.zeros(8)))
    after = read_traffic_log(log_dir)
    assert not after.unclosed and not list(log_dir.glob("*.open")) and not list(log_dir.glob(".*.tmp"))
    assert after.num_records == n + 1
    np.testing.assert_array_equal(after.columns["num_output_tokens"][:n], np.arange(n))


_KILLED_AFTER_LAST_ROW = textwrap.dedent("""
    import sys, time, numpy as np
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord
    w = TrafficLogWriter(TrafficLogConfig(sys.argv[1]))
    for i in range(100):
        w.record(TrafficRecord(features=np.full(6, i, np.float32), expected=1.0, low=0.0, high=2.0,
                               num_output_tokens=i, finish_reason="stop", arrival_time_s=0.0, finish_time_s=float(i)))
    print("recorded", flush=True)
    time.sleep(3600)  # never closed: killed from outside, as vLLM force-kills its engine on Ctrl-C
""")


def test_rows_survive_a_force_kill_after_the_last_row(tmp_path):
    """record() journals the row before it returns, so SIGKILL right after the last one loses none; the reader
    reports the unclosed journal; the next writer recovers it."""
    log_dir = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_AFTER_LAST_ROW, str(log_dir)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "recorded"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    log = read_traffic_log(log_dir)
    assert log.num_records == 100 and log.parts == [] and [p.name for p in log.unclosed] == ["part-00000001.open"]
    np.testing.assert_array_equal(log.columns["num_output_tokens"], np.arange(100))
    with TrafficLogWriter(TrafficLogConfig(log_dir)) as w:
        assert [(p.name, rows) for p, rows in w.recovered] == [("part-00000001.parquet", 100)]
    log = read_traffic_log(log_dir)
    assert log.num_records == 100 and [p.name for p in log.parts] == ["part-00000001.parquet"] and not log.unclosed


def test_journal_stale_and_torn(tmp_path):
    """A journal whose part exists (killed between the part's rename and the journal's delete) is not read twice;
    a torn last batch is dropped and counted."""
    w = TrafficLogWriter(TrafficLogConfig(tmp_path))
    for i in range(3):
        _log(w, i)
        _wait_for(lambda: (tmp_path / "part-00000001.open").exists()
                  and read_traffic_log(tmp_path).num_records == i + 1)
    journal = (tmp_path / "part-00000001.open").read_bytes()
    w.close()
    assert not (tmp_path / "part-00000001.open").exists()
    (tmp_path / "part-00000001.open").write_bytes(journal)  # as if killed before the delete
    assert read_traffic_log(tmp_path).num_records == 3
    with TrafficLogWriter(TrafficLogConfig(tmp_path)) as w2:
        assert w2.recovered == [] and not (tmp_path / "part-00000001.open").exists()
    (tmp_path / "part-00000002.open").write_bytes(journal[:-20])  # the last of three batches torn
    log = read_traffic_log(tmp_path)
    assert log.num_records == 5 and log.torn_batches == 1
    np.testing.assert_array_equal(log.columns["num_output_tokens"], [0, 1, 2, 0, 1])


def test_one_log_one_predictor(tmp_path):
    """A writer refuses a directory another predictor wrote; the reader refuses parts whose metadata differ."""
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "a", metadata={"model_revision": "r1"})) as w:
        _log(w, 0)
    with pytest.raises(LenpredError, match="model_revision='r1', this writer: model_revision='r2'"):
        TrafficLogWriter(TrafficLogConfig(tmp_path / "a", metadata={"model_revision": "r2"}))
    with pytest.raises(LenpredError, match="features_dtype"):
        TrafficLogWriter(TrafficLogConfig(tmp_path / "a", features_dtype="float32", metadata={"model_revision": "r1"}))
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "a", metadata={"model_revision": "r1"})) as w:
        _log(w, 1)  # the same predictor appends
        with pytest.raises(LenpredError, match="have 4"):
            w.record(_row(np.zeros(3)))  # the width is the log's, even for a fresh writer
    assert read_traffic_log(tmp_path / "a").num_records == 2
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "b", metadata={"model_revision": "r2"})) as w:
        _log(w, 2)
    for name in ("part-00000001.parquet", "part-00000001.parquet.sha256"):
        (tmp_path / "b" / name).rename(tmp_path / "a" / name.replace("00000001", "00000003"))
    (tmp_path / "a" / "part-00000003.parquet.sha256").write_text(
        (tmp_path / "a" / "part-00000003.parquet.sha256").read_text().replace("00000001", "00000003"))
    with pytest.raises(LenpredError, match="part-00000003.parquet has model_revision='r2'"):
        read_traffic_log(tmp_path / "a")


def test_one_writer_per_directory_closed_writers_and_empty_journals(tmp_path):
    """A second live writer on a directory is refused (two would number parts alike and lose rows); a closed
    writer refuses rows; a log of nothing but an empty journal (a kill before its schema) is 'no rows', not a crash."""
    w = TrafficLogWriter(TrafficLogConfig(tmp_path / "a"))
    with pytest.raises(LenpredError, match="open in another writer"):
        TrafficLogWriter(TrafficLogConfig(tmp_path / "a"))
    _log(w, 0)
    w.close()
    with pytest.raises(LenpredError, match="is closed"):
        _log(w, 1)
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "a")) as again:  # the lock went with close()
        _log(again, 2)
    assert read_traffic_log(tmp_path / "a").num_records == 2
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "part-00000001.open").write_bytes(b"")
    with pytest.raises(LenpredError, match="holds no rows"):
        read_traffic_log(tmp_path / "b")


_LIVE_WRITER = textwrap.dedent("""
    import sys, time, numpy as np
    from pathlib import Path
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord
    log_dir, stop, rate = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    w = TrafficLogWriter(TrafficLogConfig(log_dir, max_records_per_part=8, max_total_bytes=8 * 6000))
    t0, i = time.monotonic(), 0
    while not stop.exists() and time.monotonic() < t0 + 60:  # paced; a part every 8 rows, the oldest deleted
        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        w.record(TrafficRecord(features=np.full(8, i % 2048, np.float32), expected=1.0, low=0.0, high=2.0,
                               num_output_tokens=i, finish_reason="stop", arrival_time_s=0.0, finish_time_s=float(i)))
        i += 1
    rows_per_s = i / (time.monotonic() - t0)
    w.close()
    print(i, rows_per_s, flush=True)
""")


def _contiguous(log) -> str | None:
    """What breaks a snapshot's consistency (rows are consecutive ids, each with its id's features), or None."""
    ids = log.columns["num_output_tokens"]
    if log.num_records and not np.array_equal(ids, np.arange(ids[0], ids[0] + log.num_records)):
        return f"ids not consecutive: {ids[:3]}..{ids[-3:]}"
    if not np.array_equal(log.features[:, 0], ids % 2048):
        return "features differ from their rows' ids"
    return None


@pytest.fixture()
def fast_dir(tmp_path):
    """A directory in memory (/dev/shm) where there is one: a part's three fsyncs cost nothing there, so a writer
    cutting a part every few rows keeps up; renames and deletes behave as on disk."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm) as d:
        yield Path(d)


def test_reads_beside_a_writer_rotating_every_few_rows(fast_dir):
    """200 reads while another process records at 1,000 rows/s, cuts a part every 8 rows and deletes the oldest
    parts: no read raises, each returns consecutive rows with their own features (closed parts plus the journals'
    complete rows), and the reads did run beside the writer (rows grew, journals were open, parts were deleted)."""
    log_dir, stop = fast_dir / "log", fast_dir / "stop"
    proc = subprocess.Popen([sys.executable, "-c", _LIVE_WRITER, str(log_dir), str(stop), "1000"],
                            stdout=subprocess.PIPE, text=True)
    failures, last_ids, saw_unclosed, saw_dropped = [], [], 0, 0
    try:
        _wait_for(lambda: log_dir.exists() and list_parts(log_dir), timeout_s=60)
        for _ in range(200):
            try:
                log = read_traffic_log(log_dir)
            except Exception as exc:  # noqa: BLE001 - any failure counts
                failures.append(repr(exc))
                continue
            if (problem := _contiguous(log)) is not None:
                failures.append(problem)
            last_ids.append(int(log.columns["num_output_tokens"][-1]))
            saw_unclosed += bool(log.unclosed)
            saw_dropped += bool(log.dropped) or log.columns["num_output_tokens"][0] > 0
    finally:
        stop.touch()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    recorded, rows_per_s = out.split()
    assert failures == []
    assert last_ids == sorted(last_ids) and last_ids[-1] - last_ids[0] >= 100  # the writer was live throughout
    assert saw_unclosed > 0 and saw_dropped > 0
    final = read_traffic_log(log_dir)
    assert _contiguous(final) is None and not final.unclosed
    assert final.columns["num_output_tokens"][-1] == int(recorded) - 1
    print(f"200 reads beside a writer at {float(rows_per_s):.0f} rows/s: 0 failures")


def test_a_flipped_bit_in_the_journal_is_detected_never_read_or_promoted(tmp_path):
    """Each journal line carries the SHA-256 of its JSON: a bit flipped anywhere in a journal either makes the
    journal refused with one line naming it, or (the very last newline only) drops the last row as torn; it never
    reads back a changed value, and a writer never turns a corrupt journal into a part."""
    w = TrafficLogWriter(TrafficLogConfig(tmp_path / "live"))
    for i in range(3):
        _log(w, i)
    journal = (tmp_path / "live" / "part-00000001.open").read_bytes()  # record() journaled every row already
    w.close()
    original = read_traffic_log(tmp_path / "live")
    bad = tmp_path / "bad"
    bad.mkdir()
    outcomes = {"refused": 0, "last row torn": 0}
    for pos in range(len(journal)):
        flipped = bytearray(journal)
        flipped[pos] ^= 0x01
        (bad / "part-00000001.open").write_bytes(bytes(flipped))
        try:
            log = read_traffic_log(bad)
        except LenpredError as exc:
            assert "part-00000001.open: line" in str(exc) and "fails its SHA-256" in str(exc) and "\n" not in str(exc)
            outcomes["refused"] += 1
            continue
        assert log.torn_batches == 1 and log.num_records == 2, pos  # only the last newline: its line reads torn
        np.testing.assert_array_equal(log.features, original.features[:2])
        assert all(np.array_equal(log.columns[k][:2], original.columns[k][:2]) for k in ("expected", "low", "high"))
        outcomes["last row torn"] += 1
    assert outcomes == {"refused": len(journal) - 1, "last row torn": 1}
    flipped = bytearray(journal)
    flipped[journal.index(b'"expected":10.0') + len(b'"expected":1')] ^= 0x01  # 10.0 -> 11.0, the case
    (bad / "part-00000001.open").write_bytes(bytes(flipped))
    with pytest.raises(LenpredError, match="line 2 .after 0 rows. fails its SHA-256 checksum"):
        TrafficLogWriter(TrafficLogConfig(bad))
    assert not list_parts(bad) and (bad / "part-00000001.open").exists()  # kept for inspection, not promoted


def _full_disk_for(monkeypatch, suffix: str):
    """Make every write of a file whose name ends with ``suffix`` fail as on a full disk."""
    import errno

    from lenpred.online import traffic_files

    real = traffic_files.fsync_write

    def fsync_write(path, data):
        if path.name.endswith(suffix):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(traffic_files, "fsync_write", fsync_write)


def test_a_failed_close_releases_the_lock_and_loses_nothing(tmp_path, monkeypatch):
    """close() on a full disk: one LenpredError line naming the directory and the fix; no sidecar left without its
    part; the rows stay in the journal; a new writer in the same process starts and recovers them."""
    w = TrafficLogWriter(TrafficLogConfig(tmp_path))
    for i in range(5):
        _log(w, i)
    _full_disk_for(monkeypatch, ".parquet")
    with pytest.raises(LenpredError) as err:
        w.close()
    msg = str(err.value)
    assert f"traffic log {tmp_path}: closing failed (No space left on device" in msg and "free disk space" in msg
    assert "\n" not in msg
    assert not list(tmp_path.glob("*.sha256")) and not list_parts(tmp_path) and not list(tmp_path.glob(".*.tmp"))
    monkeypatch.undo()  # space freed
    with TrafficLogWriter(TrafficLogConfig(tmp_path)) as again:  # the lock went with the failed close()
        assert [(p.name, rows) for p, rows in again.recovered] == [("part-00000001.parquet", 5)]
    np.testing.assert_array_equal(read_traffic_log(tmp_path).columns["num_output_tokens"], np.arange(5))


def test_a_failed_part_write_in_the_background_is_one_line_and_close_retries(tmp_path, monkeypatch):
    """A part the writer's thread cannot write (full disk) makes the next record() raise one LenpredError line; the
    rows stay journaled; once space is back, close() writes them all."""
    w = TrafficLogWriter(TrafficLogConfig(tmp_path, max_records_per_part=2))
    _full_disk_for(monkeypatch, ".parquet")
    for i in range(2):
        _log(w, i)
    _wait_for(lambda: w._error is not None)
    with pytest.raises(LenpredError, match="writing a part failed .No space left on device.*free disk space"):
        _log(w, 2)
    assert read_traffic_log(tmp_path).num_records == 2  # the journal holds them
    monkeypatch.undo()
    w.close()
    log = read_traffic_log(tmp_path)
    np.testing.assert_array_equal(log.columns["num_output_tokens"], [0, 1])
    assert not log.unclosed


def test_a_failed_journal_write_keeps_the_row_and_rewrites_the_journal(tmp_path, monkeypatch):
    """A journal write that fails (full disk) raises one LenpredError line; the row is kept and journaled with the
    next one (the journal rewritten from its start), so a kill after that loses nothing."""
    import errno

    from lenpred.online.traffic_files import JournalWriter

    w = TrafficLogWriter(TrafficLogConfig(tmp_path))
    _log(w, 0)
    real = JournalWriter._write

    def short_write_then_full(self, data):
        real(self, data[:10])  # part of the line reaches the file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(JournalWriter, "_write", short_write_then_full)
    with pytest.raises(LenpredError, match="journaling a row failed .No space left.*free disk space; the row is kept"):
        _log(w, 1)
    monkeypatch.undo()
    _log(w, 2)
    np.testing.assert_array_equal(read_traffic_log(tmp_path).columns["num_output_tokens"], [0, 1, 2])  # journal only
    w.close()
    np.testing.assert_array_equal(read_traffic_log(tmp_path).columns["num_output_tokens"], [0, 1, 2])


def _one_line_error(make, *needles):
    with pytest.raises(LenpredError) as err:
        make()
    msg = str(err.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    return msg


def test_bad_paths_are_one_line_errors(tmp_path):
    """A log path under a file, under /proc or /sys, a file itself, or an immutable directory: one LenpredError line
    naming the path and the fix, for the writer and the reader."""
    (tmp_path / "file").write_text("")
    _one_line_error(lambda: TrafficLogWriter(TrafficLogConfig(tmp_path / "file" / "log")),
                    str(tmp_path / "file" / "log"), "a component of the path is a file")
    _one_line_error(lambda: TrafficLogWriter(TrafficLogConfig(tmp_path / "file")), "is a file: pass a directory")
    _one_line_error(lambda: read_traffic_log(tmp_path / "file" / "log"), "is not a directory")
    for system in ("/proc", "/sys"):
        if Path(system).is_dir():
            _one_line_error(lambda: TrafficLogWriter(TrafficLogConfig(f"{system}/lenpred-log")),
                            f"traffic log {system}/lenpred-log: creating the log directory failed")
    locked = tmp_path / "immutable"
    locked.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available to make a directory immutable")
        undo = ["chattr", "-i", str(locked)]
    else:
        locked.chmod(0o555)
        undo = ["chmod", "755", str(locked)]
    try:
        _one_line_error(lambda: TrafficLogWriter(TrafficLogConfig(locked)), str(locked), "chattr -i")
    finally:
        subprocess.run(undo, check=True)


def test_a_corrupt_newest_part_and_a_part_replaced_by_a_directory(tmp_path):
    """A writer checks the newest part's checksum before reading its schema; an entry named like a part that is a
    directory is named, for writer and reader alike."""
    with TrafficLogWriter(TrafficLogConfig(tmp_path, max_records_per_part=2)) as w:
        for i in range(4):
            _log(w, i)
    newest = tmp_path / "part-00000002.parquet"
    good = newest.read_bytes()
    newest.write_bytes(good[:-12] + bytes(12))  # the footer overwritten
    for make in (lambda: TrafficLogWriter(TrafficLogConfig(tmp_path)), lambda: read_traffic_log(tmp_path)):
        _one_line_error(make, str(newest), "fails its SHA-256 checksum", "delete it and its sidecar")
    newest.write_bytes(good)
    first = tmp_path / "part-00000001.parquet"
    first.unlink()
    first.mkdir()
    for make in (lambda: TrafficLogWriter(TrafficLogConfig(tmp_path)), lambda: read_traffic_log(tmp_path)):
        _one_line_error(make, str(first), "is a directory where the traffic log keeps a file: move it out")


def test_a_row_captured_with_no_head_reads_back_with_nan_predictions(tmp_path):
    """Capture with no head (lenpred.online.capture) logs the state and the outcome, no prediction: the
    prediction columns read back as NaN, the rest as written."""
    with TrafficLogWriter(TrafficLogConfig(tmp_path, features_dtype="float32", metadata={"head": "none"})) as w:
        w.record(TrafficRecord(features=np.array([1.0, 2.0, 3.0, 4.0]), num_output_tokens=7, finish_reason="stop",
                               arrival_time_s=10.0, finish_time_s=12.5))
    log = read_traffic_log(tmp_path)
    c = log.columns
    assert np.isnan(c["expected"][0]) and np.isnan(c["low"][0]) and np.isnan(c["high"][0])
    assert c["num_output_tokens"][0] == 7 and c["finish_time_s"][0] == 12.5 and log.metadata["head"] == "none"
    np.testing.assert_array_equal(log.features[0], [1, 2, 3, 4])


def test_token_ids_sha256_hashes_little_endian_int32():
    import hashlib

    from lenpred.online.traffic_log import token_ids_sha256

    assert token_ids_sha256([1, 258]) == hashlib.sha256(b"\x01\x00\x00\x00\x02\x01\x00\x00").hexdigest()
    assert token_ids_sha256(None) is None
