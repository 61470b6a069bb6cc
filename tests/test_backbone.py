import json

import pytest

from lenpred.backbone import DEFAULT_MODEL, _conversion_is_complete, cache_dir, load_backbone, resolve_model
from lenpred.errors import LenpredError


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


def test_eos_token_ids_merges_generation_config(tiny_backbone, tmp_path):
    import shutil

    from lenpred.backbone import eos_token_ids

    assert eos_token_ids(tiny_backbone.model_dir, tiny_backbone.tokenizer) == (0, 1, 2, 3)
    d = tmp_path / "m"
    shutil.copytree(tiny_backbone.model_dir, d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 7]}))
    assert eos_token_ids(d, tiny_backbone.tokenizer) == (0, 1, 2, 3, 7)
