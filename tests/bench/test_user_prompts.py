"""Benchmarks from users' own prompt files: reading and checking the formats, planning, building, resolving ids back
to text, and the whole path `bench build --prompts` -> `demo` on the tiny model."""

import hashlib
import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from lenpred.bench.plan import BenchConfig, make_plan, plan_fingerprint, preset
from lenpred.bench.user_prompts import prompt_messages
from lenpred.bench.user_prompts import (PromptFileConfig, load_prompt_spec, parse_prompt_lines, prompt_sha256,
                                        read_prompt_file)
from lenpred.cli import app
from lenpred.errors import LenpredError

runner = CliRunner()
ADJ = ["long", "short"]
TOPIC = ["sea", "python function", "story", "problem", "poem", "code"]


def _chat_lines() -> list[str]:
    """18 distinct plain-text prompts in the tiny model's vocabulary, a blank line, and a duplicate of line 1."""
    lines = [f"write a {a} {t} about {w}" for a in ADJ for t in TOPIC for w in ("sea", "code")][:18]
    return lines[:9] + [""] + lines[9:] + ["  WRITE a long   sea about sea "]  # last: same normalised text as line 1


def _task_lines() -> list[str]:
    """8 JSONL prompts: strings and OpenAI-style messages."""
    out = [json.dumps({"prompt": f"solve problem {w} step by step", "id": i}) for i, w in enumerate(TOPIC[:4])]
    out += [json.dumps({"messages": [{"role": "system", "content": "answer short"},
                                     {"role": "user", "content": f"tell me {w} {v}"}]})
            for w in ("story", "code") for v in ("please", "hello")]
    return out


def write_prompt_files(tmp_path):
    chat, tasks = tmp_path / "chat.txt", tmp_path / "tasks.jsonl"
    chat.write_text("\n".join(_chat_lines()) + "\n")
    tasks.write_text("\n".join(_task_lines()) + "\n")
    return chat, tasks


def _one_line_error(result, fragment: str):
    assert result.exit_code == 2, result.output
    lines = [l for l in result.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1 and fragment in lines[0], result.stderr


# ================================================================ reading the formats


def test_formats_line_numbers_and_messages(tmp_path):
    chat, tasks = write_prompt_files(tmp_path)
    c = read_prompt_file(chat)
    assert list(c.prompts)[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 11]  # line 10 is blank: skipped, numbers kept
    assert c.prompts[1] == [{"role": "user", "content": "write a long sea about sea"}]
    assert c.sha256 == hashlib.sha256(chat.read_bytes()).hexdigest() and c.path == str(chat.resolve())
    t = read_prompt_file(tasks)
    assert t.prompts[1] == [{"role": "user", "content": "solve problem sea step by step"}]
    assert t.prompts[5] == [{"role": "system", "content": "answer short"},
                            {"role": "user", "content": "tell me story please"}]


def test_a_blank_turn_next_to_text_is_kept_as_the_engine_keeps_it(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "  hi "}]}\n')
    assert read_prompt_file(path).prompts[1] == [{"role": "system", "content": ""}, {"role": "user", "content": "  hi "}]


def test_prompt_sha256_hand_worked():
    msgs = [{"role": "user", "content": "héllo"}]
    blob = '[["user","héllo"]]'.encode("utf-8")
    assert prompt_sha256(msgs) == hashlib.sha256(blob).hexdigest()
    assert prompt_sha256(msgs) != prompt_sha256([{"role": "system", "content": "héllo"}])


@pytest.mark.parametrize("content, fragment", [
    (b'hello\n{"prompt": "a", \n', "line 2 of"),                      # bad JSON
    (b'hello\n\n{"text": "a"}\n', "line 3 of"),                        # no prompt / messages
    (b'{"prompt": "   "}\n', "line 1 of"),                             # empty
    (b'{"messages": [{"role": "system", "content": ""}, {"role": "user", "content": " "}]}\n', "line 1 of"),  # all blank
    (b'hello\n{"messages": []}\n', "line 2 of"),                       # empty messages
    (b'{"messages": [{"role": "user"}]}\n', "line 1 of"),             # message without content
    (b'{"prompt": 5}\n', "line 1 of"),                                 # not a string
    (b'ok\n{"prompt": "smile \\ud83d"}\n', "line 2 of"),               # lone surrogate escape
    (b"ok\nfine\ncaf\xe9\n", "line 3 of"),                             # not UTF-8
    (b"\n  \n", "holds no prompts"),
])
def test_bad_records_name_the_file_and_line(tmp_path, content, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(LenpredError, match=fragment) as err:
        read_prompt_file(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(LenpredError, match="nope.txt cannot be read"):
        read_prompt_file(tmp_path / "nope.txt")


def test_predict_reader_keeps_its_behaviour(tmp_path):
    from lenpred.cli import _read_prompts

    chat, tasks = write_prompt_files(tmp_path)
    assert _read_prompts([], str(chat)) == [l for l in _chat_lines() if l.strip()]
    assert _read_prompts([], str(tasks))[4][1]["content"] == "tell me story please"
    assert parse_prompt_lines(["", "x", '{"prompt": "y"}'], "f") == [(2, "x"), (3, "y")]
    (tmp_path / "bad.jsonl").write_text('{"text": 1}\n')
    with pytest.raises(LenpredError, match="line 1 of .*bad.jsonl is not a JSON object with 'prompt' or 'messages'"):
        _read_prompts([], str(tmp_path / "bad.jsonl"))


# ================================================================ config and spec


def test_prompt_file_config_defaults_and_checks(tmp_path):
    f = PromptFileConfig(str(tmp_path / "my traffic.v2.jsonl"), samples_per_prompt=3)
    assert f.name == "my_traffic.v2" and f.scenario == "my_traffic.v2" and f.eval_samples_per_prompt == 3
    assert f.path == str((tmp_path / "my traffic.v2.jsonl").resolve())
    with pytest.raises(LenpredError, match="'gsm8k' is a registered source"):
        PromptFileConfig(str(tmp_path / "gsm8k.jsonl"))
    with pytest.raises(LenpredError, match="scenario 'a b'"):
        PromptFileConfig(str(tmp_path / "x.txt"), scenario="a b")
    for bad in ({"temperature": 0}, {"top_p": 1.5}, {"max_new_tokens": 0}, {"samples_per_prompt": 0},
                {"num_prompts": 0}):
        with pytest.raises(LenpredError, match="x.txt"):
            PromptFileConfig(str(tmp_path / "x.txt"), **bad)
    with pytest.raises(LenpredError, match="both named"):
        BenchConfig("m", {}, prompt_files=[PromptFileConfig(str(tmp_path / "a" / "x.txt")),
                                           PromptFileConfig(str(tmp_path / "b" / "x.txt"))])
    with pytest.raises(LenpredError, match="or a prompt file"):
        BenchConfig("m", {})


def test_spec_file(tmp_path):
    chat, tasks = write_prompt_files(tmp_path)
    (tmp_path / "spec").mkdir()
    spec = tmp_path / "spec" / "bench.toml"
    spec.write_text('[[prompts]]\nfile = "../chat.txt"\nscenario = "chat"\nsamples = 2\neval_samples = 3\n'
                    'temperature = 0.9\ntop_p = 0.95\nmax_new_tokens = 8\n\n'
                    '[[prompts]]\nfile = "../tasks.jsonl"\nnum_prompts = 4\n')
    a, b = load_prompt_spec(spec)
    assert (a.path, a.scenario, a.samples_per_prompt, a.eval_samples_per_prompt, a.temperature, a.top_p,
            a.max_new_tokens) == (str(chat.resolve()), "chat", 2, 3, 0.9, 0.95, 8)
    assert (b.path, b.name, b.scenario, b.num_prompts, b.samples_per_prompt) == (str(tasks.resolve()), "tasks",
                                                                                 "tasks", 4, 1)
    cfg = BenchConfig("m", {}, prompt_files=[a, b])
    assert BenchConfig(**cfg.to_dict()) == cfg
    spec.write_text('[[prompts]]\nfile = "x"\ntemp = 1\n')
    with pytest.raises(LenpredError, match=r"unknown keys \['temp'\]; valid keys: file, name"):
        load_prompt_spec(spec)
    spec.write_text('seed = 1\n')
    with pytest.raises(LenpredError, match=r"\[\[prompts\]\] table per file"):
        load_prompt_spec(spec)
    spec.write_text('[[prompts]\n')
    with pytest.raises(LenpredError, match="TOML"):
        load_prompt_spec(spec)


# ================================================================ plan


def _file_config(tmp_path, model="m", write=True, **kw) -> BenchConfig:
    chat, tasks = write_prompt_files(tmp_path) if write else (tmp_path / "chat.txt", tmp_path / "tasks.jsonl")
    return BenchConfig(model, {}, seed=kw.pop("seed", 0), max_prompt_tokens=None, shard_size=4, prompt_files=[
        PromptFileConfig(str(chat), scenario="chat", samples_per_prompt=1, eval_samples_per_prompt=2,
                         max_new_tokens=8, **kw),
        PromptFileConfig(str(tasks), samples_per_prompt=2, temperature=1.0, top_p=0.9, max_new_tokens=8)])


def test_plan_of_prompt_files(tiny_backbone, tmp_path):
    from lenpred.prompts import chat_token_ids

    tok = tiny_backbone.tokenizer
    cfg = _file_config(tmp_path)
    plan, skipped = make_plan(cfg, tok, context_window=64)
    assert skipped == {"chat": 0, "tasks": 0}
    assert len(plan) == 19 + 8 and len({p.prompt_id for p in plan}) == len(plan)
    assert [p.scenario for p in plan[:4]] == ["chat", "tasks", "chat", "tasks"]  # scenarios interleaved
    chat = read_prompt_file(tmp_path / "chat.txt").prompts
    for p in plan:
        name, _, line = p.prompt_id.partition(":")
        assert name == p.source and p.from_file
        messages = read_prompt_file(tmp_path / ("chat.txt" if name == "chat" else "tasks.jsonl")).prompts[int(line)]
        assert p.prompt_token_ids == tuple(chat_token_ids(tok, messages)) and p.prompt_sha256 == prompt_sha256(messages)
        assert len(p.seeds) == ((1 if p.split == "train" else 2) if name == "chat" else 2)
        assert (p.temperature, p.top_p) == ((0.7, 1.0) if name == "chat" else (1.0, 0.9))
    # the duplicate (same normalised text as line 1) shares line 1's split
    by_id = {p.prompt_id: p for p in plan}
    assert chat[20][0]["content"] != chat[1][0]["content"] and by_id["chat:20"].split == by_id["chat:1"].split
    assert {p.split for p in plan} == {"train", "validation", "test"}
    # deterministic; the seed and top-p change the plan
    assert plan_fingerprint(make_plan(cfg, tok, context_window=64)[0]) == plan_fingerprint(plan)
    assert plan_fingerprint(make_plan(_file_config(tmp_path, seed=1), tok, context_window=64)[0]) != \
        plan_fingerprint(plan)
    cfg.prompt_files[0].top_p = 0.5
    assert plan_fingerprint(make_plan(cfg, tok, context_window=64)[0]) != plan_fingerprint(plan)


def test_plan_subset_long_prompts_and_limits(tiny_backbone, tmp_path):
    tok = tiny_backbone.tokenizer
    chat, _ = write_prompt_files(tmp_path)
    plan, _ = make_plan(BenchConfig("m", {}, max_prompt_tokens=None, prompt_files=[
        PromptFileConfig(str(chat), num_prompts=5, max_new_tokens=8)]), tok, context_window=64)
    assert len(plan) == 5
    # a prompt longer than the window allows with max_new_tokens is left out and counted
    with chat.open("a") as f:
        f.write("write " * 60 + "\n")
    plan, skipped = make_plan(BenchConfig("m", {}, max_prompt_tokens=None, prompt_files=[
        PromptFileConfig(str(chat), max_new_tokens=8)]), tok, context_window=64)
    assert skipped == {"chat": 1} and len(plan) == 19
    with pytest.raises(LenpredError, match="num_prompts is 30"):
        make_plan(BenchConfig("m", {}, max_prompt_tokens=None, prompt_files=[
            PromptFileConfig(str(chat), num_prompts=30, max_new_tokens=8)]), tok, context_window=64)
    with pytest.raises(LenpredError, match="prompt file 'chat'"):
        make_plan(BenchConfig("m", {}, max_prompt_tokens=None, prompt_files=[
            PromptFileConfig(str(chat), max_new_tokens=64)]), tok, context_window=64)


def test_preset_plans_keep_their_fingerprints(tiny_backbone, tiny_data_dir):
    """Registered sources hash exactly the fields they hashed before prompt files existed (the committed benchmarks'
    fingerprints depend on it)."""
    plan, _ = make_plan(preset("tiny", "m"), tiny_backbone.tokenizer, tiny_data_dir, context_window=64)
    h = hashlib.sha256()
    for p in plan:
        h.update(repr((p.prompt_id, p.split, p.prompt_token_ids, p.seeds, p.temperature, p.max_new_tokens)).encode())
    assert plan_fingerprint(plan) == h.hexdigest()[:16] and not any(p.from_file for p in plan)
    assert "prompt_files" not in preset("tiny", "m").to_dict()


# ================================================================ build and resolve


def _build(tiny_model_dir, tmp_path, out, write=True, **kw):
    from lenpred.bench.build import build_benchmark

    return build_benchmark(_file_config(tmp_path, str(tiny_model_dir), write), out, engine="transformers", **kw)


def test_build_records_hold_hash_not_text_and_ids_resolve(tiny_model_dir, tmp_path):
    from lenpred.bench.build import load_records

    out = _build(tiny_model_dir, tmp_path, tmp_path / "bench", max_shards=2)
    _build(tiny_model_dir, tmp_path, tmp_path / "bench")  # resumed
    one_go = _build(tiny_model_dir, tmp_path, tmp_path / "bench2")
    t = load_records(out)
    assert t.to_pylist() == load_records(one_go).to_pylist()  # resuming gives the records of one run
    manifest = json.loads((out / "bench.json").read_text())
    assert [(e["name"], e["sha256"]) for e in manifest["prompt_files"]] == [
        ("chat", hashlib.sha256((tmp_path / "chat.txt").read_bytes()).hexdigest()),
        ("tasks", hashlib.sha256((tmp_path / "tasks.jsonl").read_bytes()).hexdigest())]
    rows = t.to_pylist()
    assert {r["scenario"] for r in rows} == {"chat", "tasks"} and all(r["top_p"] == pytest.approx(0.9) for r in rows
                                                                      if r["source"] == "tasks")
    texts = {m["content"] for f in ("chat.txt", "tasks.jsonl")
             for msgs in read_prompt_file(tmp_path / f).prompts.values() for m in msgs}
    for r in rows:
        messages = prompt_messages(r["prompt_id"], prompt_files=manifest["prompt_files"])  # through bench.json
        assert r["prompt_sha256"] == prompt_sha256(messages)
        assert not any(isinstance(v, str) and any(x in v for x in texts) for v in r.values())
    raw = (out / "bench.json").read_bytes() + b"".join(p.read_bytes() for p in (out / "shards").iterdir())
    assert not any(x.encode() in raw for x in texts if len(x) > 12)


def test_changed_moved_and_missing_prompt_files(tiny_model_dir, tmp_path):
    from lenpred.bench.build import load_records, read_manifest

    out = _build(tiny_model_dir, tmp_path, tmp_path / "bench")
    entries = read_manifest(out)["prompt_files"]
    chat = tmp_path / "chat.txt"
    assert prompt_messages("chat:2", prompt_files=entries)[0]["content"] == _chat_lines()[1]
    with pytest.raises(LenpredError, match="no prompt on line 10"):
        prompt_messages("chat:10", prompt_files=entries)  # the blank line
    # moved: found again through data_dir, checked by its SHA-256
    (tmp_path / "moved").mkdir()
    chat.rename(tmp_path / "moved" / "chat.txt")
    with pytest.raises(LenpredError, match=f"prompt file {chat} .*is missing: put it back, or pass --data-dir"):
        prompt_messages("chat:2", prompt_files=entries)
    assert prompt_messages("chat:2", tmp_path / "moved", prompt_files=entries)[0]["content"] == _chat_lines()[1]
    (tmp_path / "moved" / "chat.txt").rename(chat)
    # changed: one line naming the file
    chat.write_text(chat.read_text().replace("write a long", "write a short", 1))
    load_records(out)
    with pytest.raises(LenpredError, match=f"prompt file {chat} .*changed since the benchmark was built"):
        prompt_messages("chat:1", prompt_files=entries)
    # a rebuild into the same directory is refused (another plan)
    with pytest.raises(LenpredError, match="another plan_fingerprint"):
        _build(tiny_model_dir, tmp_path, out, write=False)


def test_older_shards_without_the_hash_column_still_load(tiny_model_dir, tiny_data_dir, tmp_path):
    from lenpred.bench.build import NULLABLE_FIELDS, build_benchmark, load_records, shard_path

    out = build_benchmark(preset("tiny", str(tiny_model_dir)), tmp_path / "b", engine="transformers",
                          data_dir=tiny_data_dir, max_shards=1)
    path = shard_path(out, 0)
    t = pq.read_table(path)
    assert t.column("prompt_sha256").null_count == 0  # registered sources get the hash too
    meta = t.schema.metadata
    pq.write_table(t.drop_columns([NULLABLE_FIELDS[-1][0]]).replace_schema_metadata(meta), path)
    assert load_records(out).column("prompt_sha256").null_count == t.num_rows


# ================================================================ CLI, end to end


def test_cli_build_card_and_demo_on_own_prompts(tiny_model_dir, tmp_path):
    """`bench build --prompts` -> `bench card` -> `demo`, all on the tiny model; nothing reads ../shared/datasets."""
    chat, tasks = write_prompt_files(tmp_path)
    bench = tmp_path / "bench"
    build = ["bench", "build", "--out", str(bench), "--prompts", str(chat), "--prompts", str(tasks), "--model",
             str(tiny_model_dir), "--engine", "transformers", "--samples", "1", "--eval-samples", "2",
             "--temperature", "0.9", "--top-p", "0.95", "--max-new-tokens", "8", "--seed", "2"]
    r = runner.invoke(app, build)
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, build).exit_code == 0  # resuming a finished build is a no-op
    r = runner.invoke(app, ["bench", "card", str(bench)])
    assert r.exit_code == 0, r.output
    assert "| chat | all |" in r.output and "| tasks | all |" in r.output and "## Prompt files" in r.output
    assert "write a long" not in (bench / "CARD.md").read_text()
    out = tmp_path / "out"
    r = runner.invoke(app, ["demo", "--bench", str(bench), "--model", str(tiny_model_dir), "--layers", "1,-1",
                            "--epochs", "2", "--methods", "scenario_median,mean,estp", "--out", str(out),
                            "--cache", str(tmp_path / "cache"), "--data-dir", str(tmp_path / "no-datasets")])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "results.json").read_text())
    assert list(report["results"]) == ["scenario_median", "mean", "estp"]
    assert {"chat", "tasks", "overall"} <= set(report["results"]["estp"])
    assert report["dropped_duplicates"] == {"train": 0, "validation": 0, "test": 0}  # duplicates share a split
    from lenpred.bench.build import load_records

    t = load_records(bench)
    assert set(t.column("scenario").to_pylist()) == {"chat", "tasks"}
    assert all(len(h) == 64 for h in t.column("prompt_sha256").to_pylist())
    assert t.column("top_p").to_pylist() == pytest.approx([0.95] * t.num_rows)


def test_cli_rejects_mixed_options(tmp_path):
    chat, _ = write_prompt_files(tmp_path)
    _one_line_error(runner.invoke(app, ["bench", "build", "--out", str(tmp_path / "b"), "--preset", "tiny",
                                        "--prompts", str(chat)]), "give --preset or your own --prompts")
    _one_line_error(runner.invoke(app, ["bench", "build", "--out", str(tmp_path / "b"), "--temperature", "1.0"]),
                    "--temperature set the sampling of --prompts files")
    spec = tmp_path / "s.toml"
    spec.write_text(f'[[prompts]]\nfile = "{chat.name}"\n')
    _one_line_error(runner.invoke(app, ["bench", "build", "--out", str(tmp_path / "b"), "--spec", str(spec),
                                        "--samples", "2"]), "--samples apply to --prompts files")
    (tmp_path / "bad.txt").write_text("ok\n{oops\n")
    _one_line_error(runner.invoke(app, ["bench", "build", "--out", str(tmp_path / "b"), "--prompts",
                                        str(tmp_path / "bad.txt"), "--model", "no-org/no-model"]),
                    "line 2 of")
    assert not (tmp_path / "b").exists()
