"""Traffic log: round trip, rotation, size bound, checksums, the journal, one predictor per log, and kill -9 of a
writer mid-part and after its last row."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.online.traffic_log import (JOURNAL_INTERVAL_S, TrafficLogConfig, TrafficLogWriter, TrafficRecord,
                                        list_parts, read_traffic_log)


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
        with pytest.raises(LenpredError, match="without expected"):
            w.record(TrafficRecord(features=np.zeros(4), expected=None, low=0, high=2, num_output_tokens=1,
                                   finish_reason="stop", arrival_time_s=0, finish_time_s=1))
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
    """The bound is time: every recorded row is in the journal within JOURNAL_INTERVAL_S (plus scheduling slack),
    so SIGKILL right after loses none; the reader reports the unclosed journal; the next writer recovers it."""
    log_dir = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_AFTER_LAST_ROW, str(log_dir)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "recorded"
        time.sleep(JOURNAL_INTERVAL_S + 1.0)
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
