"""Public arrival traces (lenpred.serving.traces): reading, checksums, slices stretched to a rate; the trace arrival
pattern of the queue studies."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.serving.traces import TRACES, interarrival_cv, load_trace, trace_slice
from lenpred.studies.queue_regime import parse_pattern

ROWS = ["2023-11-16 18:17:03.5000000,10,1", "2023-11-16 18:17:04.0000000,10,1", "2023-11-16 18:17:04.0000000,10,1",
        "2023-11-16 18:17:06.5000000,10,1", "2023-11-16 18:17:10.5000000,10,1"]


def write_trace(folder: Path, rows=ROWS, sums: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / TRACES["code"]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    if sums:
        (folder / "SHA256SUMS").write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    return path


def test_a_trace_reads_as_seconds_from_its_first_arrival(tmp_path):
    write_trace(tmp_path / "t")
    np.testing.assert_allclose(load_trace("code", tmp_path / "t"), [0.0, 0.5, 0.5, 3.0, 7.0])


def test_a_changed_or_missing_trace_and_an_unknown_name_are_refused(tmp_path):
    path = write_trace(tmp_path / "t")
    path.write_text(path.read_text().replace("10.5", "11.5"))  # a new modification time: read again
    with pytest.raises(LenpredError, match="does not match .*SHA256SUMS: the file changed"):
        load_trace("code", tmp_path / "t")
    with pytest.raises(LenpredError, match="not found: put the Azure LLM inference trace 2023 there"):
        load_trace("code", tmp_path / "nowhere")
    with pytest.raises(LenpredError, match="unknown trace 'chat'; valid: code, conv"):
        load_trace("chat", tmp_path / "t")


def test_a_slice_keeps_the_gaps_shape_and_is_stretched_to_the_rate():
    times = np.array([0.0, 0.5, 0.5, 3.0, 7.0])
    # 5 consecutive arrivals span 7 s: at 2 req/s the 4 gaps must span 2 s, a factor 2/7
    np.testing.assert_allclose(trace_slice(times, 5, 2.0, seed=0), np.array([0.0, 0.5, 0.5, 3.0, 7.0]) * 2 / 7)
    # 3 of them from an offset drawn by the seed: (n - 1) / span is the rate whatever the offset
    for seed in range(5):
        part = trace_slice(times, 3, 0.5, seed)
        assert part[0] == 0 and (len(part) - 1) / part[-1] == pytest.approx(0.5)
    with pytest.raises(LenpredError, match="2 <= n <= 5"):
        trace_slice(times, 6, 1.0, 0)
    with pytest.raises(LenpredError, match="spans 0 s"):
        trace_slice(np.array([0.0, 0.0, 0.0]), 2, 1.0, 0)
    # CV of gaps 0.5, 0, 2.5, 4 (mean 1.75, sd 1.6202): 0.9258
    assert interarrival_cv(times) == pytest.approx(np.std([0.5, 0, 2.5, 4]) / 1.75)


def test_the_trace_pattern_draws_its_arrivals_from_the_trace(tmp_path, monkeypatch):
    write_trace(tmp_path / "t")
    monkeypatch.setenv("LENPRED_TRACE_DIR", str(tmp_path / "t"))
    p = parse_pattern("tracecodex1.1")
    assert (p.trace, p.load, p.cv, p.depth) == ("code", 1.1, None, None)
    times = p.arrival_times(5, capacity_req_s=2.0, seed=0)  # 1.1 × 2 req/s: 4 gaps over 4 / 2.2 s
    np.testing.assert_allclose(times, np.array([0.0, 0.5, 0.5, 3.0, 7.0]) * (4 / 2.2) / 7)
    assert p.num_requests(16, 2.0, 100.0) == parse_pattern("gamma1x1.1").num_requests(16, 2.0, 100.0)
    with pytest.raises(LenpredError, match=r"trace<code\|conv>x<load>"):
        parse_pattern("tracechatx1.1")


def test_the_shipped_azure_code_trace_is_bursty():
    try:
        times = load_trace("code")
    except LenpredError as exc:
        pytest.skip(f"no trace directory here: {exc}")
    assert len(times) == 8819 and interarrival_cv(times) == pytest.approx(13.15, abs=0.01)
