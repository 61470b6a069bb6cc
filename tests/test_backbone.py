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


def _fake_cache(src, dst, checksums: bool):
    """A converted-model cache directory as convert_gguf writes it (``checksums=False``: as an older lenpred did)."""
    import shutil

    from lenpred.io import file_sha256

    shutil.copytree(src, dst)
    files = sorted(p.name for p in dst.iterdir())
    marker = {"gguf_sha256": "abc", "files": files}
    if checksums:
        marker["sha256"] = {f: file_sha256(dst / f) for f in files}
    (dst / "lenpred-conversion.json").write_text(json.dumps(marker))
    return dst


def test_conversion_checksum_catches_corrupt_and_truncated_weights(tiny_model_dir, tmp_path):
    from lenpred.backbone import check_conversion

    d = _fake_cache(tiny_model_dir, tmp_path / "m", checksums=True)
    assert check_conversion(d, "abc") is None
    weights = d / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit-pattern in a tensor, same size: only the checksum sees it
    weights.write_bytes(bytes(data))
    assert "model.safetensors that does not match its SHA-256" in check_conversion(d, "abc")
    weights.write_bytes(bytes(data[: len(data) // 2]))
    assert "does not match its SHA-256" in check_conversion(d, "abc")
    weights.unlink()
    assert check_conversion(d, "abc") == "is incomplete or stale"


def test_old_cache_without_checksums_is_checked_once_then_gets_them(tiny_model_dir, tmp_path):
    from lenpred.backbone import check_conversion, safetensors_problem
    from lenpred.io import file_sha256

    d = _fake_cache(tiny_model_dir, tmp_path / "m", checksums=False)
    assert check_conversion(d, "abc") is None  # accepted: the weights file is whole
    marker = json.loads((d / "lenpred-conversion.json").read_text())
    assert marker["sha256"]["model.safetensors"] == file_sha256(d / "model.safetensors")
    assert set(marker["sha256"]) == set(marker["files"])

    old = _fake_cache(tiny_model_dir, tmp_path / "old", checksums=False)
    weights = old / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])  # truncated: refused, and no checksum is blessed
    assert "model.safetensors that is truncated or padded" in check_conversion(old, "abc")
    assert "sha256" not in json.loads((old / "lenpred-conversion.json").read_text())
    weights.write_bytes(b"\x01")
    assert safetensors_problem(weights) == "shorter than a safetensors header"


def test_corrupt_converted_model_is_converted_again(tiny_model_dir, tmp_path, monkeypatch, caplog):
    """convert_gguf end to end with the GGUF loading swapped for the tiny model: a corrupt cache is rebuilt with a
    log line, an intact one is reused without converting."""
    import transformers

    from lenpred import backbone
    from lenpred.io import file_sha256

    monkeypatch.setenv("LENPRED_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"not really a gguf")
    monkeypatch.setattr(backbone, "packaged_gguf_path", lambda alias: gguf)
    load_model, load_tok = transformers.AutoModelForCausalLM.from_pretrained, transformers.AutoTokenizer.from_pretrained
    conversions = []

    def fake_model(*args, **kwargs):
        conversions.append(kwargs.get("gguf_file"))
        return load_model(tiny_model_dir)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: load_tok(tiny_model_dir))

    out, revision = backbone.convert_gguf()
    assert conversions == ["fake.gguf"] and revision == file_sha256(gguf)[:16]
    marker = json.loads((out / "lenpred-conversion.json").read_text())
    assert marker["sha256"]["model.safetensors"] == file_sha256(out / "model.safetensors")
    assert backbone.convert_gguf() == (out, revision) and len(conversions) == 1  # intact: reused

    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with caplog.at_level("WARNING", logger="lenpred.backbone"):
        assert backbone.convert_gguf() == (out, revision)
    assert len(conversions) == 2
    assert any("does not match its SHA-256" in r.getMessage() and "converting fake.gguf again" in r.getMessage()
               for r in caplog.records)
    assert backbone.check_conversion(out, file_sha256(gguf)) is None
    assert load_backbone(str(out)).num_layers == 2
    # named by its path (what the plug-in records with no head), the converted directory keeps the GGUF's revision
    assert backbone.resolve_model(str(out)) == (out.resolve(), revision) == (out.resolve(),
                                                                            backbone.local_model_revision(out))


def test_truncated_weights_in_a_model_directory_are_a_one_line_error(tiny_model_dir, tmp_path):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(LenpredError, match="could not load a causal LM from") as info:
        load_backbone(str(d))
    assert "\n" not in str(info.value)
