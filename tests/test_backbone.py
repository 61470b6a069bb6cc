import json

import pytest

from lenpred.backbone import (DEFAULT_MODEL, _conversion_is_complete, cache_dir, chat_token_ids, load_backbone,
                              resolve_model)
from lenpred.errors import LenpredError


def test_chat_template_applied(tiny_backbone):
    tok = tiny_backbone.tokenizer
    ids = chat_token_ids(tok, [{"role": "user", "content": "hello world"}])
    # template: "<s> user hello world </s> <s> assistant "
    assert tok.convert_ids_to_tokens(ids) == ["<s>", "user", "hello", "world", "</s>", "<s>", "assistant"]


def test_base_model_without_template_joins_turns(tiny_backbone):
    class NoTemplate:
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [len(w) for w in text.split()]}

    assert chat_token_ids(NoTemplate(), [{"role": "user", "content": "ab cde"}]) == [2, 3]


def test_empty_prompt_is_refused(tiny_backbone):
    with pytest.raises(LenpredError, match="empty prompt"):
        chat_token_ids(tiny_backbone.tokenizer, [{"role": "user", "content": "   "}])


def test_unknown_model_one_line_error():
    with pytest.raises(LenpredError, match="unknown model 'no-such-org/no-such-model'") as info:
        resolve_model("no-such-org/no-such-model")
    assert "\n" not in str(info.value)


def test_directory_without_config(tmp_path):
    with pytest.raises(LenpredError, match="no config.json"):
        load_backbone(str(tmp_path))


def test_local_directory_loads_and_revision_is_stable(tiny_model_dir):
    a = resolve_model(str(tiny_model_dir))
    b = resolve_model(str(tiny_model_dir))
    assert a == b and len(a[1]) == 16
    bb = load_backbone(str(tiny_model_dir))
    assert bb.num_layers == 2 and bb.context_window == 64 and bb.tokenizer.padding_side == "left"


def test_partial_conversion_cache_is_detected(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert not _conversion_is_complete(tmp_path, "abc")  # no marker: a killed conversion
    (tmp_path / "lenpred-conversion.json").write_text(json.dumps({"gguf_sha256": "abc",
                                                                  "files": ["config.json", "model.safetensors"]}))
    assert not _conversion_is_complete(tmp_path, "abc")  # a listed file is missing
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert _conversion_is_complete(tmp_path, "abc")
    assert not _conversion_is_complete(tmp_path, "def")  # another GGUF: stale


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("LENPRED_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


@pytest.mark.slow
def test_default_model_from_packaged_gguf():
    bb = load_backbone(DEFAULT_MODEL)
    assert bb.num_layers == 30 and bb.model.config.hidden_size == 576
    assert (bb.model_dir / "lenpred-conversion.json").is_file()
    assert resolve_model(DEFAULT_MODEL) == (bb.model_dir, bb.revision)  # cached: same directory, same revision
    ids = chat_token_ids(bb.tokenizer, [{"role": "user", "content": "Hi"}])
    text = bb.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def test_shared_prefix_length(tiny_backbone):
    from lenpred.backbone import shared_prefix_length

    # template "<s> user {content} </s> <s> assistant": every prompt starts with "<s> user"
    assert shared_prefix_length(tiny_backbone.tokenizer) == 2


def test_eos_token_ids_merges_generation_config(tiny_backbone, tmp_path):
    import shutil

    from lenpred.backbone import eos_token_ids

    assert eos_token_ids(tiny_backbone.model_dir, tiny_backbone.tokenizer) == (3,)
    d = tmp_path / "m"
    shutil.copytree(tiny_backbone.model_dir, d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 7]}))
    assert eos_token_ids(d, tiny_backbone.tokenizer) == (3, 7)
