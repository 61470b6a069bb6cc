"""Scheduling workloads (lenpred.studies.workload): seeded draws, the prediction table, progressive estimates."""

import pyarrow as pa
import pytest

from lenpred.errors import LenpredError
from lenpred.studies.workload import draw_workload


def test_progressive_estimates_join_on_prompt_and_sample(tmp_path):
    import json

    from lenpred.io import write_parquet_checked
    from lenpred.studies.workload import progressive_estimates

    table = pa.table({"prompt_id": ["a", "a", "b"], "sample_index": [0, 1, 0]})
    est = pa.table({"prompt_id": ["b", "a", "a", "a", "zz"], "sample_index": [0, 1, 1, 0, 0], "step": [0, 0, 8, 0, 0],
                    "plp": [5.0, 30.0, 4.0, 7.0, 1.0]}).replace_schema_metadata({"methods": json.dumps(["plp"])})
    path = tmp_path / "e.parquet"
    write_parquet_checked(est, path)
    # totals = step + remaining; rows of other benchmarks' prompts (zz) are ignored
    assert progressive_estimates(path, table) == {"plp": {0: {0: 7.0}, 1: {0: 30.0, 8: 12.0}, 2: {0: 5.0}}}
    with pytest.raises(LenpredError, match="no step-0 estimate"):
        progressive_estimates(path, pa.table({"prompt_id": ["a", "c"], "sample_index": [0, 0]}))
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    with pytest.raises(LenpredError, match="checksum"):
        progressive_estimates(path, table)


def test_draw_workload_seeded_and_mixed():
    n = 30
    table = pa.table({"prompt_id": [f"p{i // 2}" for i in range(n)], "scenario": ["rl", "longseq", "reasoning"] * 10,
                      "num_prompt_tokens": list(range(n)), "output_len": [10 * i for i in range(n)],
                      "max_new_tokens": [1000] * n, "pred_estp": [5.0 * i for i in range(n)]})
    a, b = draw_workload(table, 6, seed=1), draw_workload(table, 6, seed=1)
    assert [r.prompt_id for r in a] == [r.prompt_id for r in b]
    assert [r.request_id for r in a] == list(range(6))
    for r in a:
        i = r.num_prompt_tokens  # row index in this table
        assert r.output_len == 10 * i and r.predictions == {"estp": 5.0 * i, "oracle": 10.0 * i}
        assert r.priority("estp") == round(5.0 * i) and r.table_row == i
    mixed = draw_workload(table, 6, seed=0, scenario_mix={"rl": 2, "longseq": 1})
    assert sorted(r.scenario for r in mixed) == ["longseq", "longseq", "rl", "rl", "rl", "rl"]
    capped = draw_workload(table, 5, seed=0, max_output_len=50)
    assert all(r.output_len <= 50 for r in capped)
    with pytest.raises(LenpredError, match="eligible"):
        draw_workload(table, 7, seed=0, max_output_len=50)


def test_workload_table_without_predictor_files(tmp_path, caplog):
    """A fresh clone has the committed table but not the git-ignored predictor files: the table is used when its
    checksum holds and it was built from this benchmark; otherwise the error names the fix."""
    import json

    from lenpred.io import file_sha256, stable_hash, write_parquet_checked
    from lenpred.studies.workload import load_workload_table

    bench = tmp_path / "bench"
    bench.mkdir()
    def manifest(plan):
        (bench / "bench.json").write_text(json.dumps({"plan_fingerprint": plan, "model_revision": "r1", "model_id": "m",
                                                     "shard_size": 8}))

    manifest("abc")
    bench_fp = stable_hash({"plan": "abc", "revision": "r1"})
    table = pa.table({"output_len": [3, 5], "pred_estp": [2.0, 6.0]})
    path = tmp_path / "t.parquet"
    write_parquet_checked(table.replace_schema_metadata({"fingerprint": "x", "bench_fingerprint": bench_fp}), path)
    kw = dict(bench=bench, predictors_dir=tmp_path / "none", token_ids=False, rebuild=False)
    assert load_workload_table(path, predictors=("estp",), **kw).column("pred_estp").to_pylist() == [2.0, 6.0]
    assert "1 predictor file(s) missing" in caplog.text and caplog.records[-1].levelname == "WARNING"
    with pytest.raises(LenpredError, match="no predictions of egtp"):
        load_workload_table(path, predictors=("estp", "egtp"), **kw)
    manifest("abd")
    with pytest.raises(LenpredError, match="another benchmark"):
        load_workload_table(path, predictors=("estp",), **kw)
    # with the predictor file present, the full fingerprint (benchmark + file bytes) decides
    manifest("abc")
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "estp.safetensors").write_bytes(b"weights")
    with pytest.raises(LenpredError, match="stale"):
        load_workload_table(path, predictors=("estp",), **kw)
    full = stable_hash({"plan": "abc", "revision": "r1", "files": {"estp": file_sha256(tmp_path / "none" /
                                                                                        "estp.safetensors")}})
    write_parquet_checked(table.replace_schema_metadata({"fingerprint": full, "bench_fingerprint": bench_fp}), path)
    assert load_workload_table(path, predictors=("estp",), **kw).num_rows == 2
    path.write_bytes(path.read_bytes()[:-1] + b"\0")  # corrupt: the checksum no longer holds
    with pytest.raises(LenpredError, match="corrupt"):
        load_workload_table(path, predictors=("estp",), **kw)
