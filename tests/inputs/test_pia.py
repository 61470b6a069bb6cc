"""Tests of lenpred.inputs.pia (PiA self-reports: prompt, generation cache, parser, calibration) and the ``pia`` predictor."""

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

import lenpred.inputs.pia as pia
from lenpred.prompts import chat_token_ids
from lenpred.errors import LenpredError
from lenpred.inputs.pia import (PIA_INSTRUCTION, ask_self_reports, parse_word_count, self_report_messages,
                         tokens_per_word)
from lenpred.predictors import Predictor, Request, make_predictor

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# short prompts: the tiny model's context window is 64 tokens, the PiA question ~35 of them
PROMPTS = {f"p:{i}": [{"role": "user", "content": t}] for i, t in enumerate(
    ["write a poem", "what is the sum of two and three", "hello", "tell me a short story about sea please",
     "python code"])}


@pytest.fixture(scope="module")
def varied_backbone(tiny_backbone):
    """The tiny backbone with N(0, 1) weights: its default 0.02-std init greedily repeats one token for every
    prompt, which would make batch-vs-single comparisons vacuous; these weights give varied answers that
    sometimes stop at EOS. The output rows of the other control tokens (<unk>, <pad>, <s>: they end a turn too,
    ``eos_token_ids``) are zeroed, so greedy answers do not all stop at their first token."""
    model = copy.deepcopy(tiny_backbone.model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g))
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untie from the embedding
        model.lm_head.weight[:3] = 0.0
    return dataclasses.replace(tiny_backbone, model=model, revision="varied-0")


# ---------------------------------------------------------------------------------------------------- prompt

def test_self_report_messages_appends_to_last_user_message_only():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first  "},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "write a poem"}]
    out = self_report_messages(msgs)
    assert out[3]["content"] == "write a poem\n\n" + PIA_INSTRUCTION
    assert out[:3] == msgs[:3]
    assert msgs[3]["content"] == "write a poem"  # input untouched
    assert "number of words" in PIA_INSTRUCTION and "first line" in PIA_INSTRUCTION


def test_self_report_messages_without_user_message_raises():
    with pytest.raises(LenpredError, match="user message"):
        self_report_messages([{"role": "system", "content": "hi"}])


# ---------------------------------------------------------------------------------------------------- parser

@pytest.mark.parametrize("text, words", [
    ("150", 150.0),
    ("150 words", 150.0),
    ("About 1,200 words.", 1200.0),
    ("Estimated length: 80", 80.0),
    ("100-150 words", 125.0),           # range: midpoint (100 + 150) / 2
    ("100 to 150", 125.0),
    ("100–150\nHere is", 125.0),        # en dash
    ("~200", 200.0),
    ("2.5k words", 2500.0),
    ("150\nThe sum of two and three is 5.", 150.0),  # only the first line counts
    ("\n\n  60 words\nA poem", 60.0),   # first non-blank line
    ("1. 150 words", 150.0),            # a number followed by "words" beats an earlier bare one
    ("I will write one paragraph of about 50 words", 50.0),
    ("- 90 words", 90.0),               # a list bullet, not a minus sign
    ("fifty", 50.0),
    ("two hundred", 200.0),
    ("a hundred words", 100.0),
    ("twenty-five words", 25.0),
    ("two hundred and fifty", 250.0),   # 2 * 100 + 50
    ("one hundred to two hundred words", 150.0),
    ("about a thousand words", 1000.0),
    ("a 100-word poem", 100.0),
    ("Estimated number of words in my response: 150", 150.0),  # after a length word, in a long line
    ("About 80.", 80.0),                # a short line (<= 3 words) is a bare estimate
    ("Sure! Here is a long essay about the sea with 300 words in it", 300.0),
    # first line without an estimate: lines starting within the first 40 characters of the answer
    ("Sure!\nHere is my 300 word answer", 300.0),
    ("Sure!\n150\nHere it is", 150.0),
])
def test_parse_word_count(text, words):
    assert parse_word_count(text) == words


@pytest.mark.parametrize("text", [
    None, "", "   \n ", "Sure! Here is a poem about the sea.", "0", "zero words", "-5 words",
    "30000 words",                      # absurd: above MAX_WORDS = 20,000
    "Estimated number of words: 1,000,000",
    "someone wrote an essay",           # "one" inside a word, "an" without a scale: no number
    "Sure! " + "x" * 40 + "\n300 words",  # a line starting beyond the 40-character fallback window
    "1920s", "2.5km",                   # numbers inside longer tokens
    # real first lines of SmolLM2-135M-Instruct under the PiA question: numbers from the answer, not estimates
    "US states get their names from the state of California, which is the 3",
    "The 1920s were a time of great innovation and creativity,",
    "Janet’s ducks lay 16 eggs per day. She eats three",
    "Step 1: Identify the information given in the instruction.\n- James decides",
])
def test_parse_word_count_returns_none(text):
    assert parse_word_count(text) is None


# ---------------------------------------------------------------------------------------------------- calibration

def test_tokens_per_word_hand_worked(tiny_backbone):
    tok = tiny_backbone.tokenizer
    ids = lambda *words: [tok.convert_tokens_to_ids(w) for w in words]  # noqa: E731
    # "hello world <unk>" decodes to "hello world" (special token dropped): 3 tokens, 2 words;
    # "sea please": 2 tokens, 2 words -> (3 + 2) / (2 + 2) = 1.25
    assert tokens_per_word(tok, [ids("hello", "world", "<unk>"), ids("sea", "please")]) == 1.25


def test_tokens_per_word_without_words_raises(tiny_backbone):
    with pytest.raises(LenpredError, match="no words"):
        tokens_per_word(tiny_backbone.tokenizer, [[0], []])


# ---------------------------------------------------------------------------------------------------- generation

def test_one_answer_per_prompt_deterministic(tiny_backbone, tmp_path):
    a = ask_self_reports(tiny_backbone, PROMPTS, tmp_path / "a.json", progress=False)
    b = ask_self_reports(tiny_backbone, PROMPTS, tmp_path / "b.json", progress=False)
    assert list(a) == list(PROMPTS) and all(isinstance(t, str) and t for t in a.values())
    assert a == b


def test_batched_answers_equal_one_at_a_time(varied_backbone, tmp_path):
    batched = ask_self_reports(varied_backbone, PROMPTS, tmp_path / "all.json", batch_size=5, progress=False)
    assert len(set(batched.values())) == len(PROMPTS)  # varied: the comparison below means something
    for pid, msgs in PROMPTS.items():
        single = ask_self_reports(varied_backbone, {pid: msgs}, tmp_path / f"{pid}.json", batch_size=1, progress=False)
        assert single[pid] == batched[pid]
    # the greedy continuation equals a manual argmax loop over full forward passes of the unpadded prompt
    ids = chat_token_ids(varied_backbone.tokenizer, self_report_messages(PROMPTS["p:1"]))
    seq = torch.tensor([ids])
    for _ in range(16):
        with torch.no_grad():
            nxt = int(varied_backbone.model(seq).logits[0, -1].argmax())
        if nxt == varied_backbone.tokenizer.eos_token_id:
            break
        seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    expected = varied_backbone.tokenizer.decode(seq[0, len(ids):].tolist(), skip_special_tokens=True)
    assert batched["p:1"] == expected


def test_generate_gets_mask_eos_and_answers_are_cut_at_eos(tiny_backbone, tmp_path, monkeypatch):
    tok = tiny_backbone.tokenizer
    seen = {}

    def fake_generate(input_ids, attention_mask, **kwargs):
        seen.update(kwargs, input_ids=input_ids, attention_mask=attention_mask)
        new = torch.tensor([[tok.convert_tokens_to_ids(w) for w in ("sea", "</s>", "poem")]] * input_ids.shape[0])
        return torch.cat([input_ids, new], dim=1)

    monkeypatch.setattr(tiny_backbone.model, "generate", fake_generate)
    out = ask_self_reports(tiny_backbone, {"a": PROMPTS["p:0"], "b": PROMPTS["p:1"]}, tmp_path / "c.json",
                           progress=False)
    assert out == {"a": "sea", "b": "sea"}  # text after the first EOS is dropped
    config = seen["generation_config"]  # complete: the model's generation_config.json adds nothing
    assert config.do_sample is False and config.eos_token_id == [0, 1, 2, 3] and config.pad_token_id == tok.pad_token_id
    # left padding: the shorter prompt (p:0, 43 tokens) has 5 masked pad tokens on the left of the 48-token p:1
    mask = seen["attention_mask"]
    assert mask.shape[1] == 48 and sorted(mask.sum(1).tolist()) == [43, 48]
    assert mask[mask.sum(1).argmin(), :5].sum() == 0


def test_cache_resumes_without_calling_the_model(tiny_backbone, tmp_path, monkeypatch):
    cache = tmp_path / "pia.json"
    first = ask_self_reports(tiny_backbone, PROMPTS, cache, batch_size=2, progress=False)
    stored = json.loads(cache.read_text())
    assert stored["key"]["model_revision"] == tiny_backbone.revision and stored["key"]["max_new_tokens"] == 16
    assert {p: a["text"] for p, a in stored["answers"].items()} == first

    def fail(*args, **kwargs):
        raise AssertionError("cached prompts must not be generated again")

    monkeypatch.setattr(tiny_backbone.model, "generate", fail)
    assert ask_self_reports(tiny_backbone, PROMPTS, cache, batch_size=2, progress=False) == first


def test_killed_run_resumes_at_the_first_missing_batch(tiny_backbone, tmp_path, monkeypatch):
    cache = tmp_path / "pia.json"
    real = pia._generate_batch
    calls = []

    def dies_on_second_batch(backbone, batch, *args):
        calls.append(len(batch))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(backbone, batch, *args)

    monkeypatch.setattr(pia, "_generate_batch", dies_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        ask_self_reports(tiny_backbone, PROMPTS, cache, batch_size=2, progress=False)
    assert len(json.loads(cache.read_text())["answers"]) == 2  # the first batch was written
    calls.clear()
    monkeypatch.setattr(pia, "_generate_batch", lambda *a: calls.append(len(a[1])) or real(*a))
    resumed = ask_self_reports(tiny_backbone, PROMPTS, cache, batch_size=2, progress=False)
    assert calls == [2, 1]  # only the 3 missing prompts
    assert resumed == ask_self_reports(tiny_backbone, PROMPTS, tmp_path / "fresh.json", progress=False)


def test_changed_prompt_under_the_same_id_is_asked_again(tiny_backbone, tmp_path, monkeypatch):
    cache = tmp_path / "pia.json"
    ask_self_reports(tiny_backbone, PROMPTS, cache, progress=False)
    calls = []
    real = pia._generate_batch
    monkeypatch.setattr(pia, "_generate_batch", lambda *a: calls.append(a[1]) or real(*a))
    changed = dict(PROMPTS, **{"p:2": [{"role": "user", "content": "hello world"}]})
    ask_self_reports(tiny_backbone, changed, cache, progress=False)
    assert len(calls) == 1 and len(calls[0]) == 1


def test_cache_for_another_setting_is_refused(tiny_backbone, tmp_path):
    cache = tmp_path / "pia.json"
    ask_self_reports(tiny_backbone, PROMPTS, cache, progress=False)
    with pytest.raises(LenpredError, match="max_new_tokens.*delete it or pass another cache path"):
        ask_self_reports(tiny_backbone, PROMPTS, cache, max_new_tokens=8, progress=False)
    with pytest.raises(LenpredError, match="model_revision"):
        ask_self_reports(dataclasses.replace(tiny_backbone, revision="other"), PROMPTS, cache, progress=False)
    with pytest.raises(LenpredError, match="instruction_sha256"):
        ask_self_reports(tiny_backbone, PROMPTS, cache, progress=False, instruction="How long will it be?")


@pytest.mark.parametrize("damage", [
    lambda text: text[: len(text) // 2],                       # truncated JSON
    lambda text: "",                                           # empty file
    lambda text: json.dumps({"answers": {}}),                  # valid JSON, not a PiA cache
    lambda text: text.replace('"text"', '"txt"'),              # malformed answers
    lambda text: json.dumps({**json.loads(text), "key": "x"}),  # key not a mapping
])
def test_corrupt_cache_is_reported(tiny_backbone, tmp_path, damage):
    cache = tmp_path / "pia.json"
    ask_self_reports(tiny_backbone, PROMPTS, cache, progress=False)
    cache.write_text(damage(cache.read_text()))
    with pytest.raises(LenpredError, match="corrupt.*delete it and rerun"):
        ask_self_reports(tiny_backbone, PROMPTS, cache, progress=False)


def test_prompt_that_does_not_fit_the_context_window_raises(tiny_backbone, tmp_path):
    long = {"x": [{"role": "user", "content": " ".join(["sea"] * 20)}]}  # 20 + 35 + 5 = 60 > 64 - 16
    with pytest.raises(LenpredError, match="context window of 64"):
        ask_self_reports(tiny_backbone, long, tmp_path / "c.json", progress=False)
    assert not (tmp_path / "c.json").exists()
    # skip_too_long: the long prompt gets an empty (unparseable) answer, the short one is asked
    got = ask_self_reports(tiny_backbone, {**long, "y": [{"role": "user", "content": "sea"}]}, tmp_path / "c.json",
                           progress=False, skip_too_long=True)
    assert got["x"] == "" and list(got) == ["x", "y"]
    assert list(json.loads((tmp_path / "c.json").read_text())["answers"]) == ["y"]


# ---------------------------------------------------------------------------------------------------- predictor

def _requests(reports):
    return [Request(f"r/{i}", [1, 2, 3], self_report=r) for i, r in enumerate(reports)]


def test_predictor_words_times_ratio_and_fallback_counts():
    # training median of [10, 20, 40] = 20
    model = make_predictor("pia", tokens_per_word=2.0).fit(_requests([None] * 3), np.array([40.0, 10.0, 20.0]))
    reqs = _requests(["150 words", "Sure, here it is", None, "100-150 words", "0 words"])
    # 150 * 2 = 300; no number -> 20; missing -> 20; midpoint 125 * 2 = 250; zero -> 20
    np.testing.assert_array_equal(model.predict(reqs), [300.0, 20.0, 20.0, 250.0, 20.0])
    assert (model.num_predicted_, model.num_unparsed_, model.unparsed_share_) == (5, 3, 0.6)
    # counts refer to the last call only; samples sharing one Request are parsed once but counted per row
    shared = _requests(["80"])[0]
    np.testing.assert_array_equal(model.predict([shared, shared]), [160.0, 160.0])
    assert (model.num_predicted_, model.num_unparsed_, model.unparsed_share_) == (2, 0, 0.0)


def test_predictor_default_ratio_is_1_3():
    model = make_predictor("pia").fit(_requests([None]), np.array([7.0]))
    assert model.params == {"tokens_per_word": 1.3}
    np.testing.assert_allclose(model.predict(_requests(["100 words"])), [130.0])


def test_predictor_without_self_reports_names_the_fix():
    model = make_predictor("pia").fit(_requests([None] * 2), np.array([1.0, 2.0]))
    with pytest.raises(LenpredError, match="ask_self_reports"):
        model.predict(_requests([None] * 2))


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1.3"])
def test_predictor_rejects_bad_ratio(bad):
    with pytest.raises(LenpredError, match="tokens_per_word"):
        make_predictor("pia", tokens_per_word=bad)


def test_predict_before_fit_raises():
    with pytest.raises(LenpredError, match="not fitted"):
        make_predictor("pia").predict(_requests(["5"]))


def test_predictor_save_load_round_trip(tmp_path):
    model = make_predictor("pia", tokens_per_word=1.7).fit(_requests([None] * 4), np.array([3.0, 9.0, 11.0, 50.0]))
    test = _requests(["40 words", "no idea", "about 1,000 words"])
    before = model.predict(test)
    np.testing.assert_allclose(before, [68.0, 10.0, 1700.0])  # 40 * 1.7; median (9 + 11) / 2; 1000 * 1.7
    model.save(tmp_path / "pia.safetensors")
    loaded = Predictor.load(tmp_path / "pia.safetensors")
    assert type(loaded) is type(model) and loaded.params == {"tokens_per_word": 1.7}
    np.testing.assert_array_equal(loaded.predict(test), before)
    assert loaded.num_unparsed_ == 1
