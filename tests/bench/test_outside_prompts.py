"""The prompt set from outside the benchmark: parsing the HH-RLHF transcripts, the filters, the seeded order, and the
refusals (changed or missing file), on a small synthetic file; the real file, where present, against the 16 sources."""

import dataclasses
import gzip
import hashlib
import json

import pytest

from lenpred.bench import outside_prompts as op
from lenpred.bench.outside_prompts import PROVENANCE, first_human_turn, load_outside_prompts
from lenpred.bench.sources import SOURCES, default_data_dir, load_prompts
from lenpred.errors import LenpredError

NAME = PROVENANCE.name
LONG_OK, LONG_BAD = "y" * 2000, "x" * 2001


def _chat(*turns: str) -> str:
    return "".join(f"\n\n{'Human' if i % 2 == 0 else 'Assistant'}: {t}" for i, t in enumerate(turns))


ROWS = [  # (chosen transcript, or None for a blank line)
    _chat("  Plan a trip to Rome.  ", "Sure.", "Cheaper please", "OK."),  # 0: kept, first turn only, stripped
    _chat("   ", "Hm?"),  # 1: empty first turn: dropped
    _chat("Plan a trip to Rome.", "Again."),  # 2: exact duplicate of row 0: dropped
    _chat(LONG_BAD, "Too long."),  # 3: 2,001 characters: dropped
    _chat(LONG_OK, "Fine."),  # 4: exactly 2,000 characters: kept
    None,  # 5: blank line: skipped
    "\n\nAssistant: Hello, how can I help?",  # 6: no human turn first: dropped
    *[_chat(f"Name a fruit number {i}", "Apple.") for i in range(5)],  # 7..11: kept
]
KEPT = {"Plan a trip to Rome.": 0, LONG_OK: 4, **{f"Name a fruit number {i}": 7 + i for i in range(5)}}


def write_set(root, rows=ROWS) -> str:
    """Write ``rows`` as ``root/<NAME>/test.jsonl.gz``; return the file's SHA-256."""
    lines = ["" if r is None else json.dumps({"chosen": r, "rejected": r + " (worse)"}) for r in rows]
    (root / NAME).mkdir(parents=True, exist_ok=True)
    path = root / NAME / PROVENANCE.file
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8"), mtime=0))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_first_human_turn():
    assert first_human_turn(_chat("  What is 2+2? ", "4.", "And 3+3?", "6.")) == "What is 2+2?"
    assert first_human_turn("\n\nHuman: line one\nline two\n\nAssistant: ok") == "line one\nline two"
    assert first_human_turn("\n\nAssistant: I speak first") == ""
    assert first_human_turn("\n\nHuman: no answer yet") == "no answer yet"


def test_parsing_dedup_and_length_filter(tmp_path):
    sha = write_set(tmp_path)
    prompts = load_outside_prompts(root=tmp_path, sha256=sha)
    assert {p.text: p.source_row for p in prompts} == KEPT
    assert len(prompts) == 7
    for p in prompts:
        assert p.prompt_id == hashlib.sha256(p.text.encode()).hexdigest()[:16]
    assert max(len(p.text) for p in prompts) == 2000


def test_order_is_seeded_and_deterministic(tmp_path):
    sha = write_set(tmp_path)
    order = [p.text for p in load_outside_prompts(root=tmp_path, sha256=sha, seed=3)]
    assert order == sorted(KEPT, key=lambda t: hashlib.sha256(f"3:{t}".encode()).hexdigest())
    assert [p.text for p in load_outside_prompts(root=tmp_path, sha256=sha, seed=3)] == order
    assert [p.text for p in load_outside_prompts(root=tmp_path, sha256=sha, seed=4)] != order
    assert [p.text for p in load_outside_prompts(root=tmp_path, sha256=sha, seed=3, limit=3)] == order[:3]
    assert load_outside_prompts(root=tmp_path, sha256=sha, limit=0) == []
    assert len(load_outside_prompts(root=tmp_path, sha256=sha, limit=50)) == 7


def test_env_var_gives_the_default_root(tmp_path, monkeypatch):
    sha = write_set(tmp_path)
    monkeypatch.setenv("LENPRED_PROMPT_SETS", str(tmp_path))
    assert len(load_outside_prompts(sha256=sha)) == 7


def test_excluded_ids_are_dropped(tmp_path, monkeypatch):
    sha = write_set(tmp_path)
    drop = hashlib.sha256(b"Name a fruit number 2").hexdigest()[:16]
    monkeypatch.setitem(op.OUTSIDE_SETS, NAME, dataclasses.replace(PROVENANCE, exclude=frozenset({drop})))
    texts = {p.text for p in load_outside_prompts(root=tmp_path, sha256=sha)}
    assert texts == set(KEPT) - {"Name a fruit number 2"}


def test_recorded_exclusions_are_129_prompt_ids():
    assert len(op.IN_ALPACA_EVAL) == 129 and PROVENANCE.exclude is op.IN_ALPACA_EVAL
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in op.IN_ALPACA_EVAL)


def test_a_changed_file_is_refused(tmp_path):
    sha = write_set(tmp_path)
    path = tmp_path / NAME / "test.jsonl.gz"
    with pytest.raises(LenpredError) as err:  # the recorded checksum: the synthetic file is not the real one
        load_outside_prompts(root=tmp_path)
    msg = str(err.value)
    assert f"{path} has SHA-256 {sha}, expected {PROVENANCE.sha256}" in msg
    assert PROVENANCE.url in msg and "save it unchanged" in msg
    with pytest.raises(LenpredError, match=f"expected {'0' * 64}: the file is changed or truncated"):
        load_outside_prompts(root=tmp_path, sha256="0" * 64)


def test_a_missing_file_names_the_path_and_the_source(tmp_path):
    with pytest.raises(LenpredError) as err:
        load_outside_prompts(root=tmp_path)
    msg = str(err.value)
    assert f"needs {tmp_path / NAME / 'test.jsonl.gz'}, which is missing" in msg
    assert PROVENANCE.url in msg and "anthropics/hh-rlhf" in msg and "354e5c3cb896" in msg
    assert "LENPRED_PROMPT_SETS" in msg


def test_bad_arguments_and_a_malformed_line(tmp_path):
    with pytest.raises(LenpredError, match="unknown prompt set 'nope'; valid sets: hh_rlhf_helpful_base_test"):
        load_outside_prompts("nope", root=tmp_path)
    with pytest.raises(LenpredError, match="limit must be >= 0, got -1"):
        load_outside_prompts(root=tmp_path, limit=-1)
    (tmp_path / NAME).mkdir()
    path = tmp_path / NAME / "test.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"chosen": "\\n\\nHuman: ok"}\n{"rejected": "x"}\n'))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(LenpredError, match=r"line 2 of .* is not a JSON object with a string 'chosen'"):
        load_outside_prompts(root=tmp_path, sha256=sha)
    path.write_bytes(b"plain text")
    with pytest.raises(LenpredError, match="is not gzip-compressed UTF-8 JSON Lines"):
        load_outside_prompts(root=tmp_path, sha256=hashlib.sha256(b"plain text").hexdigest())


def test_the_real_set_shares_no_prompt_with_the_benchmark_sources():
    """Needs the real file (``$LENPRED_PROMPT_SETS``) and the 16 sources (``../shared/datasets``); skips without."""
    root = op.default_prompt_sets_dir()
    if not (root / NAME / PROVENANCE.file).is_file() or not default_data_dir().is_dir():
        pytest.skip("the real prompt set or the benchmark's data directory is absent")
    prompts = load_outside_prompts()
    assert len(prompts) == 2078 and len({p.text for p in prompts}) == 2078
    sources = {m["content"].strip() for s in SOURCES for msgs in load_prompts(s).values() for m in msgs}
    assert not {p.text for p in prompts} & sources
    alpaca = load_prompts("alpaca_eval")
    ids = {hashlib.sha256(m[0]["content"].encode()).hexdigest()[:16] for m in alpaca.values()}
    assert op.IN_ALPACA_EVAL <= ids
