"""Traffic log: round trip, rotation, size bound, checksums, and kill -9 of a writer mid-part."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, list_parts, read_traffic_log


def _log(writer, i, **kw):
    writer.record(np.full(4, i, np.float32), expected=10.0 + i, low=5.0, high=20.0, num_output_tokens=i,
                  finish_reason="length" if i % 2 else "stop", max_new_tokens=64, arrival_time_s=100.0 + i,
                  first_token_time_s=100.5 + i, finish_time_s=101.0 + i, **kw)


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
        w.record(np.array([0.1, 1000.3, -2.0, 3.0]), 1, 0, 2, 1, "stop", None, 0, None, 1)
    # float16 keeps 11 significant bits: 0.1 -> 0.0999755859375, 1000.3 -> 1000.5
    np.testing.assert_array_equal(read_traffic_log(tmp_path / "h").features[1], [0.0999755859375, 1000.5, -2, 3])
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "f", features_dtype="float32")) as w:
        w.record(np.array([0.1, 1000.3, -2.0, 3.0]), 1, 0, 2, 1, "stop", None, 0, None, 1)
    np.testing.assert_array_equal(read_traffic_log(tmp_path / "f").features[0], np.float32([0.1, 1000.3, -2, 3]))


def test_bad_rows_refused(tmp_path):
    with TrafficLogWriter(TrafficLogConfig(tmp_path)) as w:
        _log(w, 1)
        with pytest.raises(LenpredError, match="have 4"):
            w.record(np.zeros(5), 1, 0, 2, 1, "stop", None, 0, None, 1)
        with pytest.raises(LenpredError, match="float32"):
            w.record(np.full(4, 1e6), 1, 0, 2, 1, "stop", None, 0, None, 1)
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
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter
    w = TrafficLogWriter(TrafficLogConfig(sys.argv[1], max_records_per_part=50, max_part_age_s=3600))
    i = 0
    while True:  # killed from outside; parts are cut on the background thread
        w.record(np.full(8, i % 1000, np.float32), 1.0, 0.0, 2.0, i, "stop", None, 0.0, None, float(i))
        i += 1
""")


def test_kill_9_mid_part_keeps_every_completed_part(tmp_path):
    """A writer killed with SIGKILL while it logs loses at most the rows not yet in a part; every part left is
    complete, verified against its sidecar, and holds consecutive rows; a new writer resumes the numbering."""
    log_dir = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(log_dir)])
    try:
        deadline = time.monotonic() + 60
        while (not log_dir.exists() or len(list_parts(log_dir)) < 5) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    log = read_traffic_log(log_dir)
    n = log.num_records
    assert n >= 250 and n % 50 == 0  # whole parts only
    np.testing.assert_array_equal(log.columns["num_output_tokens"], np.arange(n))
    np.testing.assert_array_equal(log.features[:, 0], np.arange(n) % 1000)
    last = list_parts(log_dir)[-1][0]
    with TrafficLogWriter(TrafficLogConfig(log_dir)) as w:
        w.record(np.zeros(8), 1.0, 0.0, 2.0, 1, "stop", None, 0.0, None, 1.0)
    assert list_parts(log_dir)[-1][0] == last + 1 and not list(log_dir.glob(".*.tmp"))
    assert read_traffic_log(log_dir).num_records == n + 1
