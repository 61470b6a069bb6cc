import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lenpred.bench.build import build_benchmark, load_records, shard_path
from lenpred.bench.plan import BenchConfig, ScenarioConfig
from lenpred.errors import LenpredError


def tiny_config(model: str, max_new_tokens: int = 6) -> BenchConfig:
    return BenchConfig(model, {
        "longseq": ScenarioConfig(["vicuna_bench", "oasst"], 4, eval_samples_per_prompt=2,
                                  max_new_tokens=max_new_tokens),
        "reasoning": ScenarioConfig(["gsm8k"], 3, max_new_tokens=max_new_tokens),
        "rl": ScenarioConfig(["mbpp"], 3, samples_per_prompt=2, eval_samples_per_prompt=2, temperature=1.0,
                             max_new_tokens=max_new_tokens)}, shard_size=2, seed=3,
        max_prompt_tokens=None)  # the tiny model's window is 64 tokens


def _rows(bench_dir):
    t = load_records(bench_dir)
    return [(r["prompt_id"], r["sample_index"], r["seed"], tuple(r["response_token_ids"]), r["finish_reason"])
            for r in t.to_pylist()]


def test_build_records_and_schema(tiny_model_dir, tiny_data_dir, tmp_path):
    cfg = tiny_config(str(tiny_model_dir))
    out = build_benchmark(cfg, tmp_path / "b", engine="transformers", data_dir=tiny_data_dir)
    t = load_records(out)
    rows = t.to_pylist()
    # 10 prompts; samples: train prompts get samples_per_prompt, others eval_samples_per_prompt
    assert len({r["prompt_id"] for r in rows}) == 10
    for r in rows:
        cfg_s = cfg.scenarios[r["scenario"]]
        assert r["num_output_tokens"] == len(r["response_token_ids"]) <= cfg_s.max_new_tokens
        assert r["finish_reason"] == ("length" if r["num_output_tokens"] == cfg_s.max_new_tokens else "stop")
        assert 3 not in r["response_token_ids"]  # EOS (id 3) excluded
        assert r["engine"] == "transformers" and r["model_revision"]
    per_prompt = {}
    for r in rows:
        per_prompt.setdefault(r["prompt_id"], []).append(r["sample_index"])
    for pid, idx in per_prompt.items():
        assert sorted(idx) == list(range(len(idx)))
    rl = [r for r in rows if r["scenario"] == "rl"]
    assert len(rl) == 6 and len({r["seed"] for r in rl}) == 6  # per-request seeds, never shared
    # splits are by prompt: no prompt in two splits
    splits = {}
    for r in rows:
        splits.setdefault(r["prompt_id"], set()).add(r["split"])
    assert all(len(s) == 1 for s in splits.values())


def test_resume_after_partial_build_gives_identical_records(tiny_model_dir, tiny_data_dir, tmp_path):
    cfg = tiny_config(str(tiny_model_dir))
    full = build_benchmark(cfg, tmp_path / "full", engine="transformers", data_dir=tiny_data_dir)
    part = build_benchmark(cfg, tmp_path / "part", engine="transformers", data_dir=tiny_data_dir, max_shards=2)
    assert len(list((part / "shards").glob("*.parquet"))) == 2
    build_benchmark(cfg, part, engine="transformers", data_dir=tiny_data_dir)
    assert _rows(part) == _rows(full)


def test_kill_mid_build_then_resume(tiny_model_dir, tiny_data_dir, tmp_path):
    """SIGKILL a build after its first shard lands; the rerun fills exactly the gaps."""
    cfg = tiny_config(str(tiny_model_dir), max_new_tokens=24)
    reference = build_benchmark(cfg, tmp_path / "ref", engine="transformers", data_dir=tiny_data_dir)
    out = tmp_path / "killed"
    code = ("import sys; sys.path.insert(0, {tests!r}); from test_bench import tiny_config; "
            "from lenpred.bench.build import build_benchmark; "
            "build_benchmark(tiny_config({model!r}, 24), {out!r}, engine='transformers', data_dir={data!r})"
            ).format(tests=os.path.dirname(__file__), model=str(tiny_model_dir), out=str(out), data=str(tiny_data_dir))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not shard_path(out, 0).exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(p.name for p in (out / "shards").glob("*.parquet"))
    assert done and len(done) < 5, "the kill should land mid-build"
    build_benchmark(cfg, out, engine="transformers", data_dir=tiny_data_dir)
    assert _rows(out) == _rows(reference)


def test_other_plan_in_directory_is_refused(tiny_model_dir, tiny_data_dir, tmp_path):
    cfg = tiny_config(str(tiny_model_dir))
    out = build_benchmark(cfg, tmp_path / "b", engine="transformers", data_dir=tiny_data_dir, max_shards=1)
    other = tiny_config(str(tiny_model_dir))
    other.seed = 4
    with pytest.raises(LenpredError, match="another plan_fingerprint"):
        build_benchmark(other, out, engine="transformers", data_dir=tiny_data_dir)


def test_corrupt_shard_is_detected(tiny_model_dir, tiny_data_dir, tmp_path):
    cfg = tiny_config(str(tiny_model_dir))
    out = build_benchmark(cfg, tmp_path / "b", engine="transformers", data_dir=tiny_data_dir, max_shards=1)
    shard_path(out, 0).write_bytes(b"not parquet")
    with pytest.raises(LenpredError, match="not a readable lenpred shard"):
        load_records(out)
    with pytest.raises(LenpredError, match="not a readable lenpred shard"):
        build_benchmark(cfg, out, engine="transformers", data_dir=tiny_data_dir)


def test_missing_source_file(tiny_model_dir, tiny_data_dir, tmp_path):
    (tiny_data_dir / "gsm8k" / "test.jsonl").unlink()
    with pytest.raises(LenpredError, match="gsm8k/test.jsonl, which is missing"):
        build_benchmark(tiny_config(str(tiny_model_dir)), tmp_path / "b", engine="transformers",
                        data_dir=tiny_data_dir)
    assert not (tmp_path / "b").exists()  # nothing half-written


def test_unknown_engine(tiny_model_dir, tiny_data_dir, tmp_path):
    with pytest.raises(LenpredError, match="unknown engine 'tgi'"):
        build_benchmark(tiny_config(str(tiny_model_dir)), tmp_path / "b", engine="tgi", data_dir=tiny_data_dir)


@pytest.mark.slow
def test_real_model_slice_of_20_prompts(tmp_path):
    """Issue 3's CI check: the default model, transformers engine, 20 real prompts, resumable."""
    from lenpred.bench.sources import default_data_dir

    if not default_data_dir().is_dir():
        pytest.skip(f"no prompt data sets at {default_data_dir()} (set LENPRED_DATA_DIR)")
    cfg = BenchConfig("smollm2-135m-instruct", {
        "longseq": ScenarioConfig(["vicuna_bench", "mt_bench"], 7, max_new_tokens=8),
        "reasoning": ScenarioConfig(["gsm8k", "aqua"], 7, max_new_tokens=8),
        "rl": ScenarioConfig(["mbpp", "gsm8k_train"], 6, samples_per_prompt=2, eval_samples_per_prompt=2,
                             temperature=1.0, max_new_tokens=8)}, shard_size=5)
    out = build_benchmark(cfg, tmp_path / "b", engine="transformers", max_shards=2)
    build_benchmark(cfg, out, engine="transformers")
    t = load_records(out)
    assert t.num_rows == 26 and len(set(t.column("prompt_id").to_pylist())) == 20
    assert set(t.column("scenario").to_pylist()) == {"longseq", "reasoning", "rl"}
    meta = pq.read_schema(shard_path(out, 0)).metadata
    assert b"plan_fingerprint" in meta[b"lenpred"]


def test_card_counts_and_spread(tiny_model_dir, tiny_data_dir, tmp_path):
    from lenpred.bench.card import _spread, write_card

    # hand-worked spread: prompt a has lengths 2 and 6 (std 2, max/min 3), b has 4 and 4 (std 0, ratio 1),
    # c has one sample (ignored) -> mean std 1.0, median ratio 2.0, 2 multi-sample prompts
    assert _spread(["a", "a", "b", "b", "c"], [2, 6, 4, 4, 9]) == (1.0, 2.0, 2)
    assert _spread(["a", "b"], [2, 6]) == (None, None, 0)
    out = build_benchmark(tiny_config(str(tiny_model_dir)), tmp_path / "b", engine="transformers",
                          data_dir=tiny_data_dir)
    paths = write_card(out)
    rows = json.loads(paths["json"].read_text())
    records = load_records(out).to_pylist()
    rl_all = next(r for r in rows if r["scenario"] == "rl" and r["split"] == "all")
    assert rl_all["prompts"] == 3 and rl_all["responses"] == 6
    lengths = [r["num_output_tokens"] for r in records if r["scenario"] == "rl"]
    assert rl_all["max"] == max(lengths) and rl_all["mean"] == pytest.approx(sum(lengths) / 6)
    assert paths["png"].read_bytes()[:4] == b"\x89PNG" and "| rl | all | 3 | 6 |" in paths["md"].read_text()
    assert "Incomplete" not in paths["md"].read_text()
    part = build_benchmark(tiny_config(str(tiny_model_dir)), tmp_path / "part", engine="transformers",
                           data_dir=tiny_data_dir, max_shards=1)
    planned = json.loads((part / "bench.json").read_text())["num_requests"]
    got = load_records(part).num_rows
    assert got < planned and f"Incomplete: {got} of {planned} planned responses" in write_card(part)["md"].read_text()


# --- bad input: one-line LenpredError naming the file and the fix; nothing lost or half-written ---------------

RESAMPLE_FIX = "delete it and rerun `lenpred bench build` with the same arguments to re-sample it"


def _corrupt_in_page(path, column="response_token_ids", garbage=False):
    """Flip one bit of a column chunk's page data (or write 16 garbage bytes into it); the footer stays valid."""
    md = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(md.column(j) for j in range(md.num_columns) if md.column(j).path_in_schema.startswith(column))
    start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o is not None)
    data = bytearray(path.read_bytes())
    if garbage:
        mid = start + chunk.total_compressed_size // 2
        data[mid:mid + 16] = b"\xff" * 16
    else:  # the chunk's last bytes are page data (headers come first), which the page checksum covers
        data[start + chunk.total_compressed_size - 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncated", "garbage_in_page", "bit_flip_in_page"])
def test_corrupt_shard_names_file_and_fix_everywhere(tiny_model_dir, tiny_data_dir, tmp_path, damage):
    from lenpred.bench.card import write_card

    cfg = tiny_config(str(tiny_model_dir))
    reference = build_benchmark(cfg, tmp_path / "ref", engine="transformers", data_dir=tiny_data_dir)
    out = build_benchmark(cfg, tmp_path / "b", engine="transformers", data_dir=tiny_data_dir, max_shards=2)
    card = write_card(out)["md"].read_text()
    shard = shard_path(out, 1)
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-20])
    else:
        _corrupt_in_page(shard, garbage=damage == "garbage_in_page")
    before = {p.name: p.read_bytes() for p in (out / "shards").iterdir()}
    message = f"{shard} is not a readable lenpred shard"
    for call in (lambda: load_records(out), lambda: write_card(out),
                 lambda: build_benchmark(cfg, out, engine="transformers", data_dir=tiny_data_dir)):
        with pytest.raises(LenpredError, match="not a readable lenpred shard") as err:
            call()
        assert str(err.value).startswith(message) and RESAMPLE_FIX in str(err.value) and "\n" not in str(err.value)
    # nothing lost or half-written: the shards and the old card are untouched, the resume sampled nothing
    assert {p.name: p.read_bytes() for p in (out / "shards").iterdir()} == before
    assert (out / "CARD.md").read_text() == card
    shard.unlink()  # the fix the message names
    build_benchmark(cfg, out, engine="transformers", data_dir=tiny_data_dir)
    assert _rows(out) == _rows(reference)


@pytest.mark.parametrize("text", ['{"config": {"model": "x"', "", "[1, 2]", '{"model_id": "m"}', "\udcff"])
def test_corrupt_manifest_names_file_and_fix(tiny_model_dir, tiny_data_dir, tmp_path, text):
    from lenpred.bench.card import write_card

    cfg = tiny_config(str(tiny_model_dir))
    reference = build_benchmark(cfg, tmp_path / "ref", engine="transformers", data_dir=tiny_data_dir)
    out = build_benchmark(cfg, tmp_path / "b", engine="transformers", data_dir=tiny_data_dir, max_shards=2)
    manifest = out / "bench.json"
    manifest.write_bytes(text.encode("utf-8", "surrogateescape"))
    shards = {p.name: p.read_bytes() for p in (out / "shards").iterdir()}
    for call in (lambda: load_records(out), lambda: write_card(out),
                 lambda: build_benchmark(cfg, out, engine="transformers", data_dir=tiny_data_dir)):
        with pytest.raises(LenpredError, match="benchmark manifest") as err:
            call()
        msg = str(err.value)
        assert msg.startswith(f"{manifest} is not a") and "rerun `lenpred bench build` with the same arguments" in msg
    assert {p.name: p.read_bytes() for p in (out / "shards").iterdir()} == shards  # nothing sampled or lost
    assert not (out / "CARD.md").exists()
    manifest.unlink()  # the fix the message names: the finished shards are checked against the plan and kept
    with pytest.raises(LenpredError, match="bench.json missing, shards present"):
        load_records(out)
    build_benchmark(cfg, out, engine="transformers", data_dir=tiny_data_dir)
    assert _rows(out) == _rows(reference)
    assert all((out / "shards" / name).read_bytes() == data for name, data in shards.items())


def test_out_is_a_regular_file(tiny_model_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "b"
    out.write_text("my notes\n")
    with pytest.raises(LenpredError, match=f"{out} exists and is not a directory"):
        build_benchmark(tiny_config(str(tiny_model_dir)), out, engine="transformers", data_dir=tiny_data_dir)
    assert out.read_text() == "my notes\n"
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "shards").write_text("x")
    with pytest.raises(LenpredError, match="shards exists and is not a directory"):
        build_benchmark(tiny_config(str(tiny_model_dir)), tmp_path / "c", engine="transformers",
                        data_dir=tiny_data_dir)
    assert os.listdir(tmp_path / "c") == ["shards"]


@pytest.mark.parametrize("precreate", [False, True])
def test_failed_engine_start_leaves_nothing_behind(tiny_model_dir, tiny_data_dir, tmp_path, precreate):
    import shutil

    out = tmp_path / "b"
    if precreate:
        out.mkdir()
    with pytest.raises(LenpredError, match="unknown engine 'tgi'"):
        build_benchmark(tiny_config(str(tiny_model_dir)), out, engine="tgi", data_dir=tiny_data_dir)
    assert os.listdir(out) == [] if precreate else not out.exists()
    # a model directory without weights: the tokenizer and plan work, the engine cannot start
    no_weights = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, no_weights)
    for p in no_weights.glob("*.safetensors"):
        p.unlink()
    with pytest.raises(LenpredError, match="engine 'transformers' cannot load model") as err:
        build_benchmark(tiny_config(str(no_weights)), out, engine="transformers", data_dir=tiny_data_dir)
    assert "\n" not in str(err.value)
    assert os.listdir(out) == [] if precreate else not out.exists()


def test_model_without_tokenizer(tiny_model_dir, tiny_data_dir, tmp_path):
    only_config = tmp_path / "only-config"
    only_config.mkdir()
    (only_config / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(LenpredError, match="cannot load the tokenizer of model") as err:
        build_benchmark(tiny_config(str(only_config)), tmp_path / "b", engine="transformers", data_dir=tiny_data_dir)
    assert "\n" not in str(err.value) and not (tmp_path / "b").exists()


def test_negative_max_shards(tiny_model_dir, tiny_data_dir, tmp_path):
    with pytest.raises(LenpredError, match="--max-shards must be >= 0"):
        build_benchmark(tiny_config(str(tiny_model_dir)), tmp_path / "b", engine="transformers",
                        data_dir=tiny_data_dir, max_shards=-1)
    assert not (tmp_path / "b").exists()


def test_benchmark_directory_problems(tiny_model_dir, tiny_data_dir, tmp_path):
    from lenpred.bench.card import write_card

    cfg = tiny_config(str(tiny_model_dir))
    for missing in (tmp_path / "none", tmp_path / "a-file"):
        if missing.name == "a-file":
            missing.write_text("x")
        for call in (load_records, write_card):
            with pytest.raises(LenpredError, match="holds no benchmark"):
                call(missing)
    out = build_benchmark(cfg, tmp_path / "b", engine="transformers", data_dir=tiny_data_dir, max_shards=0)
    assert (out / "bench.json").is_file() and not (out / "shards").exists()  # max_shards=0: only the manifest
    for call in (load_records, write_card):
        with pytest.raises(LenpredError, match="has no finished shards yet"):
            call(out)
    assert not (out / "CARD.md").exists()
    build_benchmark(cfg, out, engine="transformers", data_dir=tiny_data_dir, max_shards=2)
    # a stray copy of a shard would double its records
    stray = out / "shards" / "shard-00000 (1).parquet"
    stray.write_bytes(shard_path(out, 0).read_bytes())
    with pytest.raises(LenpredError, match=r"is not a shard name this benchmark writes"):
        load_records(out)
    with pytest.raises(LenpredError, match=r"is not a shard name this benchmark writes"):
        build_benchmark(cfg, out, engine="transformers", data_dir=tiny_data_dir)
    stray.unlink()
    # shard 1's file under shard 0's name: same plan, wrong place
    saved = shard_path(out, 0).read_bytes()
    shard_path(out, 0).write_bytes(shard_path(out, 1).read_bytes())
    for call in (lambda: load_records(out), lambda: build_benchmark(cfg, out, engine="transformers",
                                                                    data_dir=tiny_data_dir)):
        with pytest.raises(LenpredError, match="belongs to another plan"):
            call()
    shard_path(out, 0).write_bytes(saved)
    # a parquet file with lenpred metadata but other columns
    import pyarrow as pa

    meta = pq.read_schema(shard_path(out, 1)).metadata
    pq.write_table(pa.table({"x": [1, 2]}).replace_schema_metadata(meta), shard_path(out, 1))
    for call in (lambda: load_records(out), lambda: build_benchmark(cfg, out, engine="transformers",
                                                                    data_dir=tiny_data_dir)):
        with pytest.raises(LenpredError, match="its columns differ from the record schema"):
            call()


# --- issue 11: stop tokens and sampling parameters in the records, legacy shards, limits, bad text, progress ------

REPO = str(Path(__file__).resolve().parents[2])


class CannedEngine:
    """Answers every request with the same tokens: fast, and any stop token can be made to appear."""

    name = "canned"
    context_window = 64

    def __init__(self, result):
        self.result = result
        self.requests = []

    def generate(self, requests):
        self.requests += requests
        return [self.result for _ in requests]


def test_records_hold_stop_token_and_every_sampling_param(tiny_model_dir, tiny_data_dir, tmp_path):
    out = build_benchmark(tiny_config(str(tiny_model_dir)), tmp_path / "b", engine="transformers",
                          data_dir=tiny_data_dir)
    rows = load_records(out).to_pylist()
    assert {(r["top_k"], r["min_p"], r["repetition_penalty"], r["top_p"]) for r in rows} == {(0, 0.0, 1.0, 1.0)}
    for r in rows:
        assert (r["stop_token_id"] in (0, 1, 2, 3)) if r["finish_reason"] == "stop" else r["stop_token_id"] is None
    assert json.loads((out / "bench.json").read_text())["stop_token_ids"] == [0, 1, 2, 3]


def test_stop_token_of_the_engine_lands_in_the_record(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    import lenpred.bench.build as build
    from lenpred.engines import SampleResult

    monkeypatch.setattr(build, "make_engine", lambda *a, **k: CannedEngine(SampleResult((7, 8), "stop", 2)))
    out = build_benchmark(tiny_config(str(tiny_model_dir)), tmp_path / "b", engine="transformers",
                          data_dir=tiny_data_dir)
    assert set(load_records(out).column("stop_token_id").to_pylist()) == {2}


def _downgrade_to_legacy(path):
    """Rewrite a shard the way the builder wrote it before issue 11 (no stop token, top-k, min-p, penalty)."""
    from lenpred.bench.build import LEGACY_SCHEMA

    t = pq.read_table(path)
    meta = t.schema.metadata
    t = t.select(LEGACY_SCHEMA.names).replace_schema_metadata(meta)
    pq.write_table(t, path, write_page_checksum=True)


def test_legacy_shards_load_with_nulls_and_resume(tiny_model_dir, tiny_data_dir, tmp_path):
    cfg = tiny_config(str(tiny_model_dir))
    full = build_benchmark(cfg, tmp_path / "full", engine="transformers", data_dir=tiny_data_dir)
    out = build_benchmark(cfg, tmp_path / "old", engine="transformers", data_dir=tiny_data_dir, max_shards=2)
    manifest = json.loads((out / "bench.json").read_text())
    del manifest["stop_token_ids"]
    (out / "bench.json").write_text(json.dumps(manifest))
    for i in (0, 1):
        _downgrade_to_legacy(shard_path(out, i))
    legacy = [shard_path(out, i).read_bytes() for i in (0, 1)]
    build_benchmark(cfg, out, engine="transformers", data_dir=tiny_data_dir)  # resume accepts the old shards
    assert [shard_path(out, i).read_bytes() for i in (0, 1)] == legacy  # ... and leaves them as they are
    assert json.loads((out / "bench.json").read_text()) == manifest  # the old manifest is not rewritten
    rows = load_records(out).to_pylist()
    n_old = sum(pq.read_metadata(shard_path(out, i)).num_rows for i in (0, 1))
    assert all(r["stop_token_id"] is None and r["top_k"] is None for r in rows[:n_old])
    assert all(r["top_k"] == 0 for r in rows[n_old:])
    assert _rows(out) == _rows(full)


@pytest.mark.parametrize("name", ["smollm2-first", "smollm2-forelen"])
def test_committed_benchmarks_still_load(name):
    t = load_records(os.path.join(REPO, "benchmarks", name))
    manifest = json.loads(open(os.path.join(REPO, "benchmarks", name, "bench.json")).read())
    assert t.num_rows == manifest["num_requests"] and t.column("stop_token_id").null_count == t.num_rows


def test_max_prompt_tokens_is_checked_against_the_window(tiny_model_dir, tiny_data_dir, tmp_path):
    from lenpred.bench.plan import prompt_limits

    big = tiny_config(str(tiny_model_dir))
    big.max_prompt_tokens = 100000
    with pytest.raises(LenpredError) as e:
        build_benchmark(big, tmp_path / "b", engine="transformers", data_dir=tiny_data_dir)
    assert str(e.value).startswith("bench max_prompt_tokens (scenario 'longseq') of 100000 tokens + max_new_tokens "
                                   "6 exceeds the model's context window of 64")
    assert not (tmp_path / "b").exists()
    forelen = BenchConfig("m", {"longseq": ScenarioConfig(["oasst"], 1, max_new_tokens=1024),
                                "rl": ScenarioConfig(["mbpp"], 1, max_new_tokens=512)})
    assert prompt_limits(forelen, 8192) == {"longseq": 2048, "rl": 2048}
    forelen.max_prompt_tokens = None
    assert prompt_limits(forelen, 8192) == {"longseq": 7168, "rl": 7680}
    forelen.max_prompt_tokens = 7680
    with pytest.raises(LenpredError, match="7680 tokens \\+ max_new_tokens 1024 exceeds the model's context window"):
        prompt_limits(forelen, 8192)
    with pytest.raises(LenpredError, match="max_prompt_tokens must be >= 1"):
        BenchConfig("m", {"rl": ScenarioConfig(["mbpp"], 1)}, max_prompt_tokens=0)


def test_lone_surrogate_names_the_file_and_record(tiny_model_dir, tiny_data_dir, tmp_path):
    from typer.testing import CliRunner

    from lenpred.cli import app

    path = tiny_data_dir / "vicuna_bench" / "question.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = json.dumps({"question_id": 2, "category": "c", "turns": ["write a poem \ud83d about sea"]})
    assert "\\ud83d" in lines[2]  # the JSON escape the issue found in a data file
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LenpredError) as e:
        build_benchmark(tiny_config(str(tiny_model_dir)), tmp_path / "b", engine="transformers",
                        data_dir=tiny_data_dir)
    assert str(e.value).startswith(f"record 2 of {path} (prompt id vicuna_bench:2) has text that is not valid "
                                   "Unicode (surrogates not allowed at character 13")
    r = CliRunner().invoke(app, ["bench", "build", "--out", str(tmp_path / "b"), "--preset", "tiny", "--model",
                                 str(tiny_model_dir), "--engine", "transformers", "--data-dir", str(tiny_data_dir)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and f"error: record 2 of {path}" in r.stderr, r.stderr
    assert not (tmp_path / "b").exists()


def test_progress_bar_counts_this_runs_work(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    import tqdm.auto

    import lenpred.bench.build as build
    from lenpred.bench.build import progress_counts
    from lenpred.engines import SampleResult

    bars = []

    class Bar:
        def __init__(self, **kw):
            self.kw, self.n = kw, kw.get("initial", 0)
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            self.n += n

        def set_postfix(self, **kw):
            pass

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    monkeypatch.setattr(build, "make_engine", lambda *a, **k: CannedEngine(SampleResult((7,), "stop", 3)))
    cfg = tiny_config(str(tiny_model_dir))  # 10 prompts in 5 shards of 2
    for _ in range(3):
        build_benchmark(cfg, tmp_path / "b", engine="transformers", data_dir=tiny_data_dir, max_shards=2)
    assert [(b.kw["total"], b.kw["initial"], b.n) for b in bars] == [(4, 0, 4), (4, 0, 4), (2, 0, 2)]
    assert [b.kw["desc"] for b in bars] == ["bench build (canned)", "bench build (canned), 4/10 prompts done before",
                                            "bench build (canned), 8/10 prompts done before"]
    shards = [[None] * 2] * 4 + [[None]]
    assert progress_counts(shards, [2, 3], {0, 1}) == (4, 4, 9)  # the resume: 4 this run, 4 before, 9


def test_cli_passes_vllm_memory_and_thread_options(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import lenpred.bench.build as build
    from lenpred.cli import app
    from lenpred.engines import SampleResult, VLLMOptions

    seen = []

    def fake_make_engine(name, model_dir, stop_ids, options):
        seen.append((name, stop_ids, options))
        return CannedEngine(SampleResult((7,), "length"))

    monkeypatch.setattr(build, "make_engine", fake_make_engine)
    args = ["bench", "build", "--out", str(tmp_path / "b"), "--preset", "tiny", "--model", str(tiny_model_dir),
            "--engine", "vllm", "--data-dir", str(tiny_data_dir), "--max-shards", "1"]
    r = CliRunner().invoke(app, [*args, "--kv-cache-space-gib", "0.5", "--gpu-memory-utilization", "0.3",
                                 "--cpu-threads-bind", "nobind", "--cpu-reserved-cores", "1"])
    assert r.exit_code == 0, r.output
    assert seen[0] == ("vllm", (0, 1, 2, 3), VLLMOptions(kv_cache_space_gib=0.5, gpu_memory_utilization=0.3,
                                                         cpu_threads_bind="nobind", cpu_reserved_cores=1))
    r = CliRunner().invoke(app, [*args, "--kv-cache-space-gib", "0"])
    assert seen[1][2] == VLLMOptions(kv_cache_space_gib=None)  # 0: let vLLM size the cache
    r = CliRunner().invoke(app, [*args, "--gpu-memory-utilization", "2"])
    assert r.exit_code == 2 and "error: gpu_memory_utilization (--gpu-memory-utilization) must be in (0, 1]" in r.stderr


def test_capped_scenarios_are_named():
    from lenpred.bench.card import capped_warnings

    rows = [{"scenario": "longseq", "split": "all", "truncated": 0.95, "responses": 20},
            {"scenario": "longseq", "split": "train", "truncated": 1.0, "responses": 5},  # per split: not read
            {"scenario": "rl", "split": "all", "truncated": 0.75, "responses": 40}]
    (message,) = capped_warnings(rows)
    assert message.startswith("scenario 'longseq': 95 % of its 20 responses hit max_new_tokens: the model rarely stops")
    assert capped_warnings(rows, share=0.7)[1].startswith("scenario 'rl': 75 %")
