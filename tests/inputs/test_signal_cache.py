import pytest
import torch

import lenpred.inputs.cache as features
from lenpred.errors import LenpredError
from lenpred.inputs.cache import token_batches, extract_cached, measure_overhead, tensors_sha256
from lenpred.signals import extract_signals

PROMPTS = {"a:0": [2, 10, 11, 3], "a:1": [2, 12, 13, 14, 15, 3], "b:0": [2, 16, 3], "b:1": [2, 17, 18, 19, 3],
           "c:0": [2, 20, 21, 22, 23, 24, 25, 3]}


def test_batches_sorted_by_length_under_token_budget():
    # lengths 5, 1, 3, 2 with budget 6 padded tokens: sorted order 1(1), 3(2), 2(3), 0(5)
    # [1, 3] -> 2 * 2 = 4 tokens; adding 2 (len 3) -> 3 * 3 = 9 > 6 -> new batch; [2] then [0]
    assert token_batches([5, 1, 3, 2], 6) == [[1, 3], [2], [0]]


def test_cache_round_trip_and_resume(tiny_backbone, tmp_path, monkeypatch):
    first = extract_cached(tiny_backbone, PROMPTS, (1, 2), tmp_path / "c", part_size=2, progress=False)
    assert len(list((tmp_path / "c").glob("part-*.safetensors"))) == 3  # 5 prompts / 2 per part
    for pid, ids in PROMPTS.items():
        ref = extract_signals(tiny_backbone, [ids], (1, 2))[0]
        torch.testing.assert_close(first[pid].hidden_states, ref.hidden_states, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(first[pid].attention_received, ref.attention_received, atol=1e-5, rtol=1e-4)

    def fail(*args, **kwargs):
        raise AssertionError("cached prompts must not be extracted again")

    monkeypatch.setattr(features, "extract_signals", fail)
    again = extract_cached(tiny_backbone, PROMPTS, (1, 2), tmp_path / "c", part_size=2, progress=False)
    for pid in PROMPTS:
        assert torch.equal(again[pid].token_entropy, first[pid].token_entropy)


def test_grown_prompt_set_reuses_unchanged_parts(tiny_backbone, tmp_path, monkeypatch):
    few = dict(list(PROMPTS.items())[:4])
    extract_cached(tiny_backbone, few, (2,), tmp_path / "c", part_size=2, progress=False)
    calls = []
    real = features.extract_signals
    monkeypatch.setattr(features, "extract_signals", lambda bb, batch, *a, **k: calls.append(batch) or real(bb, batch, *a, **k))
    extract_cached(tiny_backbone, PROMPTS, (2,), tmp_path / "c", part_size=2, progress=False)
    assert calls == [[PROMPTS["c:0"]]]  # only the new prompt's part is extracted


def test_corrupt_part_and_other_layers_are_refused(tiny_backbone, tmp_path):
    extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "c", part_size=2, progress=False)
    with pytest.raises(LenpredError, match="another model / layers"):
        extract_cached(tiny_backbone, PROMPTS, (2,), tmp_path / "c", part_size=2, progress=False)
    part = sorted((tmp_path / "c").glob("part-*.safetensors"))[0]
    part.write_bytes(part.read_bytes()[:50])
    with pytest.raises(LenpredError, match="unreadable"):
        extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "c", part_size=2, progress=False)


def test_measure_overhead_reports_consistent_numbers(tiny_backbone):
    o = measure_overhead(tiny_backbone, list(PROMPTS.values()), (2,), repeats=1)
    n = sum(map(len, PROMPTS.values()))
    assert o["num_prompt_tokens"] == n and o["batch_size"] == 5
    assert o["ratio"] == pytest.approx(o["signals_tok_s"] / o["plain_tok_s"])


def test_cached_last_token_states_match_every_layer(tiny_backbone, tmp_path):
    # the last token's state at every hidden-state index 0..L, whatever subset of layers is kept in full
    got = extract_cached(tiny_backbone, PROMPTS, (2,), tmp_path / "c", part_size=2, progress=False)
    ids = PROMPTS["c:0"]
    ref = extract_signals(tiny_backbone, [ids], (0, 1, 2))[0]
    assert got["c:0"].last_token_states.shape == (3, 32)
    torch.testing.assert_close(got["c:0"].last_token_states, ref.hidden_states[:, -1], atol=1e-4, rtol=1e-4)


def test_non_finite_part_and_truncated_key_are_refused(tiny_backbone, tmp_path):
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open

    extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "c", part_size=2, progress=False)
    part = sorted((tmp_path / "c").glob("part-*.safetensors"))[0]
    with safe_open(str(part), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(part))
    tensors["0.token_entropy"][0] = float("nan")
    save_file(tensors, str(part), metadata=meta)
    with pytest.raises(LenpredError, match="fails its SHA-256 checksum"):  # edited without updating the checksum
        extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "c", part_size=2, progress=False)
    save_file(tensors, str(part), metadata=meta | {"sha256": tensors_sha256(tensors)})
    with pytest.raises(LenpredError, match="non-finite values in 0.token_entropy"):
        extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "c", part_size=2, progress=False)
    (tmp_path / "c" / "cache.json").write_text('{"format": 4, "model_')
    with pytest.raises(LenpredError, match="cache.json is unreadable"):
        extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "c", part_size=2, progress=False)
    with pytest.raises(LenpredError, match="is a file"):
        extract_cached(tiny_backbone, PROMPTS, (1,), part, part_size=2, progress=False)


def test_part_with_overwritten_bytes_fails_its_checksum(tiny_backbone, tmp_path):
    # a page of the data area overwritten with 'A' bytes (finite float32s) used to be read back silently
    got = extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "c", part_size=2, progress=False)
    part = sorted((tmp_path / "c").glob("part-*.safetensors"))[0]
    raw = bytearray(part.read_bytes())
    raw[-64:] = b"A" * 64
    part.write_bytes(bytes(raw))
    with pytest.raises(LenpredError, match=f"{part.name} fails its SHA-256 checksum"):
        extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "c", part_size=2, progress=False)
    part.unlink()  # the fix the message names: delete it and rerun -> re-extracted, same values
    again = extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "c", part_size=2, progress=False)
    for pid in PROMPTS:
        torch.testing.assert_close(again[pid].hidden_states, got[pid].hidden_states)


def test_part_from_a_cache_of_other_layers_is_refused(tiny_backbone, tmp_path):
    # a part extracted for layers (1,) copied into the cache of layers (2,) has the same name (prompt hash):
    # it used to be read, and layer(2) returned layer-1 data
    extract_cached(tiny_backbone, PROMPTS, (1,), tmp_path / "l1", part_size=2, progress=False)
    extract_cached(tiny_backbone, PROMPTS, (2,), tmp_path / "l2", part_size=2, progress=False)
    src = sorted((tmp_path / "l1").glob("part-*.safetensors"))[0]
    (tmp_path / "l2" / src.name).write_bytes(src.read_bytes())
    with pytest.raises(LenpredError, match=f"{src.name} was extracted with other layers \\(layers=\\[1\\] instead of "
                                           "layers=\\[2\\]\\)"):
        extract_cached(tiny_backbone, PROMPTS, (2,), tmp_path / "l2", part_size=2, progress=False)
