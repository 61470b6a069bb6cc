"""Unit tests of lenpred.bench.plan, lenpred.bench.sources and lenpred.io on small fake data files.

``sources.load_prompts`` is cached by (source name, resolved data directory), so every test writes its
own data into its own ``tmp_path``.
"""

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from lenpred.bench.plan import (BenchConfig, ScenarioConfig, assign_split, make_plan, plan_fingerprint, preset,
                                sample_seed)
from lenpred.bench.sources import COT_INSTRUCTION, SOURCES, get_source, load_prompts
from lenpred.bench.user_prompts import prompt_messages
from lenpred.errors import LenpredError
from lenpred.io import atomic_path, file_sha256, stable_hash, write_json

LONG_QUESTION = " ".join(["word"] * 40)  # 40 words -> 41 tokens with BOS: over max_prompt_tokens=30


def write_jsonl(root: Path, rel: str, records) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_json_file(root: Path, rel: str, obj) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def make_data(root: Path, long_vicuna: bool = False) -> Path:
    """vicuna_bench (3 prompts), sharegpt (6 records, 4 usable: ids 0, 3, 4, 5), gsm8k (3 prompts)."""
    write_jsonl(root, "vicuna_bench/question.jsonl", [
        {"question_id": 1, "category": "knowledge", "turns": ["What is the capital of France?", "And of Spain?"]},
        {"question_id": 2, "category": "generic", "turns": ["  Name three colours \n"]},
        {"question_id": 3, "category": "writing", "turns": [LONG_QUESTION if long_vicuna else "Write a limerick"]},
    ])
    write_json_file(root, "sharegpt/ShareGPT_V3_filtered_500.json", [
        {"id": "a", "conversations": [{"from": "human", "value": "Tell me a joke"}, {"from": "gpt", "value": "No."},
                                      {"from": "human", "value": "another one"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "I start, no human turn"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "   "}, {"from": "gpt", "value": "blank human"}]},
        {"id": "d", "conversations": [{"from": "human", "value": "Explain gravity briefly"}]},
        {"id": "e", "conversations": [{"from": "human", "value": "Describe a sunny day"}]},
        {"id": "f", "conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "Write a haiku"}]},
    ])
    write_jsonl(root, "gsm8k/test.jsonl", [
        {"question": "What is 2 plus 3?", "answer": "#### 5"},
        {"question": "What is 4 times 4?", "answer": "#### 16"},
        {"question": "What is 9 minus 7?", "answer": "#### 2"},
    ])
    return root


class WordTokenizer:
    """One id per whitespace-separated word (10 + its length), plus BOS = 1; no chat template."""

    chat_template = None
    eos_token_id = 2
    bos_token = "<s>"

    def __call__(self, text, add_special_tokens=True, split_special_tokens=False, return_offsets_mapping=False):
        words = list(re.finditer(r"\S+" if split_special_tokens else r"<s>|(?:(?!<s>)\S)+", text))  # BOS is a token
        out = {"input_ids": ([1] if add_special_tokens else [])
               + [1 if w[0] == self.bos_token and not split_special_tokens else 10 + len(w[0]) for w in words]}
        if return_offsets_mapping:
            out["offset_mapping"] = [w.span() for w in words]
        return out


def config(longseq: int, reasoning: int, **kw) -> BenchConfig:
    return BenchConfig("fake-model", {
        "longseq": ScenarioConfig(["vicuna_bench", "sharegpt"], longseq, samples_per_prompt=1,
                                  eval_samples_per_prompt=3, temperature=0.7, max_new_tokens=64),
        "reasoning": ScenarioConfig(["gsm8k"], reasoning, eval_samples_per_prompt=2, temperature=0.5,
                                    max_new_tokens=32)}, **kw)


# ================================================================ splits and seeds


def test_assign_split_deterministic_and_matches_fractions():
    ids = [f"src:{i}" for i in range(2000)]
    splits = [assign_split(pid, 0, (0.7, 0.1, 0.2)) for pid in ids]
    assert splits == [assign_split(pid, 0, (0.7, 0.1, 0.2)) for pid in ids]
    counts = Counter(splits)
    assert set(counts) == {"train", "validation", "test"}
    # binomial std at n=2000 is at most ~1 %; allow 3.5 %
    assert abs(counts["train"] / 2000 - 0.7) < 0.035
    assert abs(counts["validation"] / 2000 - 0.1) < 0.035
    assert abs(counts["test"] / 2000 - 0.2) < 0.035


def test_assign_split_depends_on_seed_and_degenerate_fractions():
    ids = [f"src:{i}" for i in range(200)]
    a = [assign_split(pid, 0, (0.5, 0.25, 0.25)) for pid in ids]
    b = [assign_split(pid, 1, (0.5, 0.25, 0.25)) for pid in ids]
    assert a != b
    assert {assign_split(pid, 3, (1.0, 0.0, 0.0)) for pid in ids} == {"train"}
    assert {assign_split(pid, 3, (0.0, 0.0, 1.0)) for pid in ids} == {"test"}
    assert {assign_split(pid, 3, (0.0, 1.0, 0.0)) for pid in ids} == {"validation"}


def test_assign_split_is_monotone_in_train_fraction():
    # growing the train share only moves prompts into train (the hash u is compared to thresholds)
    ids = [f"src:{i}" for i in range(300)]
    small = {pid for pid in ids if assign_split(pid, 0, (0.3, 0.2, 0.5)) == "train"}
    large = {pid for pid in ids if assign_split(pid, 0, (0.6, 0.2, 0.2)) == "train"}
    assert small < large


def test_sample_seed_distinct_stable_and_in_range():
    seeds = [sample_seed("gsm8k:7", s, 0) for s in range(100)]
    assert len(set(seeds)) == 100
    assert seeds == [sample_seed("gsm8k:7", s, 0) for s in range(100)]
    assert all(0 <= s < 2**31 for s in seeds)
    assert sample_seed("gsm8k:7", 0, 0) != sample_seed("gsm8k:8", 0, 0)
    assert sample_seed("gsm8k:7", 0, 0) != sample_seed("gsm8k:7", 0, 1)


# ================================================================ config validation


def test_bench_config_rejects_unknown_scenario():
    with pytest.raises(LenpredError, match="bogus") as err:
        BenchConfig("m", {"bogus": ScenarioConfig(["gsm8k"], 1)})
    assert "longseq" in str(err.value)


@pytest.mark.parametrize("fractions", [(0.5, 0.5, 0.5), (0.7, 0.1, 0.1), (0.5, 0.5)])
def test_bench_config_rejects_bad_fractions(fractions):
    with pytest.raises(LenpredError, match="split_fractions"):
        BenchConfig("m", {"rl": ScenarioConfig(["mbpp"], 1)}, split_fractions=fractions)


def test_scenario_config_rejects_unknown_source():
    with pytest.raises(LenpredError, match="no_such_set") as err:
        ScenarioConfig(["gsm8k", "no_such_set"], 5)
    assert "gsm8k" in str(err.value)  # lists the valid sources


@pytest.mark.parametrize("kw", [{"num_prompts": 0}, {"samples_per_prompt": 0}, {"eval_samples_per_prompt": 0},
                                {"temperature": 0.0}, {"temperature": 2.5}, {"max_new_tokens": 0}])
def test_scenario_config_rejects_bad_numbers(kw):
    args = {"sources": ["gsm8k"], "num_prompts": 3, **kw}
    with pytest.raises(LenpredError):
        ScenarioConfig(**args)


def test_bench_config_accepts_dicts_and_round_trips():
    cfg = BenchConfig("m", {"rl": {"sources": ["mbpp"], "num_prompts": 2, "samples_per_prompt": 4}},
                      split_fractions=[0.6, 0.2, 0.2])
    assert isinstance(cfg.scenarios["rl"], ScenarioConfig)
    assert cfg.split_fractions == (0.6, 0.2, 0.2)
    d = cfg.to_dict()
    assert d["scenarios"]["rl"]["samples_per_prompt"] == 4
    assert BenchConfig(**d) == cfg


def test_presets():
    tiny = preset("tiny", "m")
    assert set(tiny.scenarios) == {"longseq", "reasoning", "rl"}
    assert all(s.num_prompts == 3 for s in tiny.scenarios.values())
    forelen = preset("forelen", "m")
    assert sum(s.num_prompts for s in forelen.scenarios.values()) >= 1500
    with pytest.raises(LenpredError, match="tiny"):
        preset("huge", "m")


# ================================================================ sources


def test_load_prompts_vicuna_first_turn_stripped(tmp_path):
    make_data(tmp_path)
    assert load_prompts("vicuna_bench", tmp_path) == {
        "vicuna_bench:0": [{"role": "user", "content": "What is the capital of France?"}],
        "vicuna_bench:1": [{"role": "user", "content": "Name three colours"}],
        "vicuna_bench:2": [{"role": "user", "content": "Write a limerick"}],
    }


def test_load_prompts_gsm8k_adds_cot_instruction(tmp_path):
    make_data(tmp_path)
    prompts = load_prompts("gsm8k", tmp_path)
    assert list(prompts) == ["gsm8k:0", "gsm8k:1", "gsm8k:2"]
    assert COT_INSTRUCTION.startswith("Solve the following problem.")
    assert prompts["gsm8k:1"] == [{"role": "user", "content": COT_INSTRUCTION + "\n\nWhat is 4 times 4?"}]


def test_sharegpt_skipped_records_keep_stable_ids(tmp_path):
    make_data(tmp_path)
    prompts = load_prompts("sharegpt", tmp_path)
    # record 1 has no human turn and record 2 only a blank one: skipped, but they still count
    assert list(prompts) == ["sharegpt:0", "sharegpt:3", "sharegpt:4", "sharegpt:5"]
    assert prompts["sharegpt:0"][0]["content"] == "Tell me a joke"  # the first human turn
    assert prompts["sharegpt:5"][0]["content"] == "Write a haiku"  # a human turn after a gpt one


def test_prompt_messages_round_trip(tmp_path):
    make_data(tmp_path)
    for name in ("vicuna_bench", "sharegpt", "gsm8k"):
        for pid, messages in load_prompts(name, tmp_path).items():
            assert prompt_messages(pid, tmp_path) == messages
    with pytest.raises(LenpredError, match="sharegpt:1"):
        prompt_messages("sharegpt:1", tmp_path)  # a skipped record has no prompt
    with pytest.raises(LenpredError, match="nosuch"):
        prompt_messages("nosuch:0", tmp_path)


def test_other_formats_json_array_examples_object_and_strings(tmp_path):
    write_json_file(tmp_path, "alpaca_demo/alpaca_en_demo.json", [
        {"instruction": "Translate to English", "input": "Hola", "output": "Hello"},
        {"instruction": "Say hi", "input": "", "output": "hi"}])
    write_json_file(tmp_path, "strategyqa/task.json", {"name": "strategyqa", "examples": [
        {"input": "Is the sky blue?", "target": "yes"}]})
    write_jsonl(tmp_path, "oasst/en_100_text.jsonl", ["Tell me a story", "Why is the sea salty?"])
    assert load_prompts("alpaca_demo", tmp_path) == {
        "alpaca_demo:0": [{"role": "user", "content": "Translate to English\n\nHola"}],
        "alpaca_demo:1": [{"role": "user", "content": "Say hi"}]}
    assert load_prompts("strategyqa", tmp_path) == {
        "strategyqa:0": [{"role": "user", "content": f"{COT_INSTRUCTION} Answer yes or no.\n\nIs the sky blue?"}]}
    assert load_prompts("oasst", tmp_path)["oasst:1"] == [{"role": "user", "content": "Why is the sea salty?"}]


def test_multi_file_source_numbers_across_files(tmp_path):
    subjects = ["algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                "prealgebra", "precalculus"]
    assert get_source("math").files == tuple(f"math/test/{s}.jsonl" for s in subjects)
    # algebra holds 2 problems, the rest 1 each: ids 0..7 in file order
    write_jsonl(tmp_path, "math/test/algebra.jsonl", [{"problem": "A1"}, {"problem": "A2"}])
    for s in subjects[1:]:
        write_jsonl(tmp_path, f"math/test/{s}.jsonl", [{"problem": s}])
    prompts = load_prompts("math", tmp_path)
    assert list(prompts) == [f"math:{i}" for i in range(8)]
    assert prompts["math:1"][0]["content"].endswith("\n\nA2")
    assert prompts["math:2"][0]["content"].endswith("\n\ncounting_and_probability")
    assert prompts["math:7"][0]["content"].endswith("\n\nprecalculus")


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(LenpredError) as err:
        load_prompts("gsm8k", tmp_path)
    assert str(tmp_path.resolve() / "gsm8k" / "test.jsonl") in str(err.value)


def test_malformed_json_line_names_the_line(tmp_path):
    path = tmp_path / "gsm8k" / "test.jsonl"
    path.parent.mkdir(parents=True)
    # line 1 good, line 2 blank (skipped but counted), line 3 broken
    path.write_text('{"question": "q1", "answer": "1"}\n\n{"question": "q2", "answer": \n')
    with pytest.raises(LenpredError, match="line 3") as err:
        load_prompts("gsm8k", tmp_path)
    assert "test.jsonl" in str(err.value)


def test_record_missing_field_raises(tmp_path):
    write_jsonl(tmp_path, "gsm8k/test.jsonl", [{"question": "q1"}, {"prompt": "wrong field"}])
    with pytest.raises(LenpredError, match="record 1"):
        load_prompts("gsm8k", tmp_path)


def test_get_source_unknown_lists_valid():
    with pytest.raises(LenpredError, match="gsm8k"):
        get_source("not_a_source")
    assert get_source("gsm8k") is SOURCES["gsm8k"]


def test_every_source_scenario_is_valid():
    assert {s.scenario for s in SOURCES.values()} == {"longseq", "reasoning", "rl"}


# ================================================================ make_plan


def test_plan_interleaves_sources_and_scenarios(tmp_path):
    make_data(tmp_path)
    # all 3 vicuna + 4 usable sharegpt prompts; 2 gsm8k
    plan, skipped = make_plan(config(7, 2), WordTokenizer(), tmp_path)
    assert skipped == {"longseq": 0, "reasoning": 0}
    # scenarios alternate while both have prompts: L R L R L L L L L
    assert [p.scenario for p in plan] == ["longseq", "reasoning"] * 2 + ["longseq"] * 5
    longseq = [p for p in plan if p.scenario == "longseq"]
    # sources alternate (vicuna, sharegpt) until vicuna's 3 prompts run out
    assert [p.source for p in longseq] == ["vicuna_bench", "sharegpt"] * 3 + ["sharegpt"]
    assert {p.prompt_id for p in longseq} == set(load_prompts("vicuna_bench", tmp_path)) | set(
        load_prompts("sharegpt", tmp_path))


def test_plan_records_tokens_split_and_seeds(tmp_path):
    make_data(tmp_path)
    cfg = config(5, 3, seed=4)
    plan, _ = make_plan(cfg, WordTokenizer(), tmp_path)
    by_id = {p.prompt_id: p for p in plan}
    # 5 longseq prompts from candidates v s v s v s s hold all 3 vicuna prompts
    # "What is the capital of France?\n\n": BOS + 6 words (What, is, the, capital, of, France?)
    p = by_id["vicuna_bench:0"]
    assert p.num_prompt_tokens == 7
    assert p.prompt_token_ids == (1, 14, 12, 13, 17, 12, 17)
    # gsm8k: BOS + 13 instruction words + 5 question words (What, is, 2, plus, 3?) = 19
    assert by_id["gsm8k:0"].num_prompt_tokens == 19
    for p in plan:
        assert p.num_prompt_tokens == len(p.prompt_token_ids)
        assert p.split == assign_split(p.prompt_id, 4, cfg.split_fractions)
        is_train = p.split == "train"
        if p.scenario == "longseq":
            assert len(p.seeds) == (1 if is_train else 3)
            assert (p.temperature, p.max_new_tokens) == (0.7, 64)
        else:
            assert len(p.seeds) == (1 if is_train else 2)
            assert (p.temperature, p.max_new_tokens) == (0.5, 32)
        assert p.seeds == tuple(sample_seed(p.prompt_id, s, 4) for s in range(len(p.seeds)))


def test_smaller_plan_is_a_prefix_of_larger(tmp_path):
    make_data(tmp_path)
    small, _ = make_plan(config(2, 2), WordTokenizer(), tmp_path)
    large, _ = make_plan(config(4, 3), WordTokenizer(), tmp_path)
    for scenario in ("longseq", "reasoning"):
        s = [p for p in small if p.scenario == scenario]
        big = [p for p in large if p.scenario == scenario]
        assert len(s) == 2
        assert big[:2] == s
    # scenarios alternate, so the whole small plan is a prefix of the large one
    assert large[:len(small)] == small
    assert plan_fingerprint(small) == plan_fingerprint(large[:len(small)])
    assert plan_fingerprint(small) != plan_fingerprint(large)


def test_plan_is_deterministic(tmp_path):
    make_data(tmp_path)
    a, _ = make_plan(config(4, 2), WordTokenizer(), tmp_path)
    b, _ = make_plan(config(4, 2), WordTokenizer(), tmp_path)
    assert a == b


def test_long_prompts_are_skipped_and_counted(tmp_path):
    make_data(tmp_path, long_vicuna=True)
    # candidates: v s v s v s s; the long vicuna prompt (41 tokens) lies before the last sharegpt one,
    # so asking for every usable prompt (2 vicuna + 4 sharegpt) must pass over it
    plan, skipped = make_plan(config(6, 1, max_prompt_tokens=30), WordTokenizer(), tmp_path)
    assert skipped == {"longseq": 1, "reasoning": 0}
    ids = {p.prompt_id for p in plan}
    assert "vicuna_bench:2" not in ids
    assert {"vicuna_bench:0", "vicuna_bench:1", "sharegpt:0", "sharegpt:3", "sharegpt:4", "sharegpt:5"} <= ids
    assert all(p.num_prompt_tokens <= 30 for p in plan)


def test_asking_for_more_prompts_than_exist_raises(tmp_path):
    make_data(tmp_path, long_vicuna=True)
    with pytest.raises(LenpredError, match="longseq"):
        make_plan(config(7, 1, max_prompt_tokens=30), WordTokenizer(), tmp_path)  # only 6 usable
    with pytest.raises(LenpredError, match="reasoning"):
        make_plan(config(1, 4), WordTokenizer(), tmp_path)  # gsm8k holds 3


# ================================================================ io


def test_atomic_path_leaves_nothing_when_body_raises(tmp_path):
    target = tmp_path / "out" / "data.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half written")
            raise RuntimeError("killed")
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # the temporary folder is gone too


def test_atomic_path_keeps_old_file_when_body_raises(tmp_path):
    target = tmp_path / "data.txt"
    target.write_text("old")
    with pytest.raises(ValueError):
        with atomic_path(target) as tmp:
            tmp.write_text("new")
            raise ValueError
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["data.txt"]


def test_atomic_path_replaces_file_and_directory(tmp_path):
    target = tmp_path / "data.txt"
    target.write_text("old")
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"
    folder = tmp_path / "shard"
    (folder).mkdir()
    (folder / "stale").write_text("x")
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        (tmp / "fresh").write_text("y")
    assert sorted(p.name for p in folder.iterdir()) == ["fresh"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.txt", "shard"]


def test_atomic_path_refuses_file_onto_directory_and_back(tmp_path):
    (tmp_path / "results.json").mkdir()
    with pytest.raises(LenpredError, match="results.json exists as a directory, where lenpred writes a file"):
        with atomic_path(tmp_path / "results.json") as tmp:
            tmp.write_text("{}")
    (tmp_path / "predictors").write_text("x")
    with pytest.raises(LenpredError, match="predictors exists as a file, where lenpred writes a directory"):
        with atomic_path(tmp_path / "predictors") as tmp:
            tmp.mkdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictors", "results.json"]  # no temporaries left
    assert (tmp_path / "predictors").read_text() == "x"


def test_write_json_round_trip(tmp_path):
    path = tmp_path / "a" / "b.json"
    write_json(path, {"b": [1, 2.5], "a": "x"})
    assert json.loads(path.read_text()) == {"a": "x", "b": [1, 2.5]}


def test_stable_hash_order_independent_and_sensitive():
    assert stable_hash({"a": 1, "b": {"x": 2, "y": 3}}) == stable_hash({"b": {"y": 3, "x": 2}, "a": 1})
    assert stable_hash({"a": 1, "b": 2}) != stable_hash({"a": 1, "b": 3})
    assert len(stable_hash({"a": 1})) == 16 and len(stable_hash({"a": 1}, length=8)) == 8
    # it is the SHA-256 of the canonical JSON
    assert stable_hash({"b": 1, "a": [1, 2]}, 64) == hashlib.sha256(b'{"a":[1,2],"b":1}').hexdigest()


def test_file_sha256_known_value(tmp_path):
    path = tmp_path / "abc"
    path.write_bytes(b"abc")
    # FIPS 180-2 test vector
    assert file_sha256(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert file_sha256(path, chunk_bytes=1) == file_sha256(path)
