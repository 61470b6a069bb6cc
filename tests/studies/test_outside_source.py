"""The outside-source study's stream (lenpred.studies.outside_source.load_stream) on a hand-made log: each request
joined to its prompt's serving order, a re-served prompt keeping its latest samples, the prompt oracle as the other
sample's length."""

import numpy as np
import pyarrow as pa
import pytest

from lenpred.errors import LenpredError
from lenpred.io import write_parquet_checked
from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord
from lenpred.studies.outside_source import _other_samples_mean, load_stream


def _record(sha: str, y: int, t: float) -> TrafficRecord:
    return TrafficRecord(features=np.full(4, t, np.float32), expected=50.0, low=10.0, high=90.0, low_raw=20.0,
                         high_raw=80.0, num_output_tokens=y, finish_reason="stop", max_new_tokens=1024,
                         num_prompt_tokens=30, arrival_time_s=t, first_token_time_s=t + 0.1, finish_time_s=t + 1,
                         prompt_sha256=sha)


def test_the_stream_joins_prompts_halves_and_prompt_oracles(tmp_path):
    samples = [{"order": o, "prompt_id": f"p{o}", "sample": k, "prompt_sha256": f"h{o}"} for o in range(4)
               for k in range(2)]
    write_parquet_checked(pa.Table.from_pylist(samples), tmp_path / "samples.parquet")
    # prompt h1 was served twice (a chunk cut short, then served again): its latest two samples count
    served = [("h0", 10, 0), ("h0", 30, 1), ("h1", 999, 2), ("h1", 5, 3), ("h1", 7, 4), ("h2", 40, 5), ("h2", 60, 6),
              ("h3", 1, 7), ("h3", 3, 8)]
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "traffic", features_dtype="float32")) as w:
        for sha, y, t in served:
            w.record(_record(sha, y, float(t)))
    s = load_stream(tmp_path)
    assert s["y"].tolist() == [10, 30, 5, 7, 40, 60, 1, 3]  # finish order, h1's first try dropped
    assert s["later"].tolist() == [False] * 4 + [True] * 4  # prompts 2 and 3 (serving order) are the later half
    assert s["prompt_oracle"].tolist() == [30, 10, 7, 5, 60, 40, 3, 1]  # the other sample's length
    write_parquet_checked(pa.Table.from_pylist(samples[:6]), tmp_path / "samples.parquet")  # h3 not listed yet
    s = load_stream(tmp_path)
    assert s["y"].tolist() == [10, 30, 5, 7, 40, 60] and s["unlisted"][0] == 2
    write_parquet_checked(pa.Table.from_pylist([{"order": 0, "prompt_id": "x", "sample": 0, "prompt_sha256": "hx"},
                                                {"order": 0, "prompt_id": "x", "sample": 1, "prompt_sha256": "hx"}]),
                          tmp_path / "samples.parquet")
    with pytest.raises(LenpredError, match="a log from another run"):
        load_stream(tmp_path)


def test_other_samples_mean_by_hand():
    got = _other_samples_mean(np.array(["a", "a", "a", "b"]), np.array([1.0, 2.0, 6.0, 5.0]))
    assert got[:3].tolist() == [4.0, 3.5, 1.5] and np.isnan(got[3])
