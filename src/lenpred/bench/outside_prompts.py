"""A prompt set from outside the benchmark, for checks on prompts that none of its 16 sources holds.

The set is the first human turn of each conversation in Anthropic's HH-RLHF helpful-base test split (Bai et al.,
*Training a Helpful and Harmless Assistant with RLHF*, 2022; MIT licence): 2,354 English chats of crowdworkers with an
assistant (the red-team and harmless parts are not used). AlpacaEval, the benchmark's source ``alpaca_eval``, took 129
of these prompts; they are dropped (:data:`IN_ALPACA_EVAL`). The text is never committed: the original file lies
unchanged under ``$LENPRED_PROMPT_SETS/<name>/`` (default ``~/.cache/lenpred/prompt_sets``) and its SHA-256 is checked
before it is read (docs/data.md, "A prompt set from outside the benchmark").
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from lenpred.errors import LenpredError

MAX_CHARS = 2000
"""Prompts longer than this many characters are dropped."""

IN_ALPACA_EVAL = frozenset("""
    00829ae550ec24c0 00cb4d4f01596bd1 025db33e1c412ba8 04bf142bcfcdbcd6 08a2161485c148f6 0e301991220acdd3
    130f2b8b449c2a59 165a2a02b55fa5ec 1a6e8a73cf68be90 1ad01e22babb1133 1b28a4cd852bbb9f 1d24ad4a03bc56b8
    25eaed00b82b5487 25ed7a45427b9327 28d9cc422010c974 2d97fceb7f63c368 2fbcc1d357b02def 2fe753a97de62992
    2fea41aab2f43270 30b4ceed92339c06 32d998a94a94ab95 36703d1a0df7a6cf 3802273adee87ec2 39a7cbee050a296c
    3c04b22c4f49eb02 3d9f9bdb7ed304f9 3dbdd62889e3f140 3e525a5d4211b90a 3f3f6f50822042c0 41730f7b4a11b695
    4430fd2227ecb2c0 450317a768f82d8a 460fd743d654c974 4848cfed4c1de75d 4956959ebf0642cb 49b18a0d6a31c7b9
    4dd9df0d3d6f82a5 51bb34232df0a3a6 5431a1f3f99957d3 5686c35d0c73a252 589bab7a25d1feac 5d62e1af44ae508d
    65cb5c1064184eb0 67033cddb2016fbd 68b189e2f794c569 68de3b363cf8f668 6bf7078877137a46 6cc1e9dcf387b687
    6ee2edea2e3da616 70cef83412282d50 72c4c24efcd6e806 7357c00751dfab25 756a8bfcdf9e0aee 767e6e33fdf34a42
    7843353c41ac2701 7c7543b879715d27 8132c1251ebc597d 815ee0d8d162cc54 875e58cd179d5915 887bb54cd1eae293
    8ae9d6ae702cdbf1 8ca91d0132d9177b 917f873474fde2e8 942026182166e104 95e3b7090a1d40bc 961f3d594e195272
    987f667ef5f13f31 9ab2207d57b5e26e a2941d4f0abfa006 a2cbacf609c1c6d3 a40abf0ba6c887aa a44c5209b57588a8
    a4fc9895c38dd99f a5323aac238a990e a54bf03a204cf226 a681d3ea015c21ec a9d961c2c7b508dd ab3964690fbe5247
    ac58664175980af8 ad3898f37ffe6cf8 ad45ffd4b271410c ae634a30bfcaf67c af1386c944a54cee b0ebeb460429aea6
    b10dbec95fd1d8a4 b4a848ec412a60ac b506a51e530705f3 b5de563376996fc8 b5e398299e36392d b9b91135479b9784
    bb873b6a7a8ce18d bcf8b287d98482cd c010e44484dcc65b c04565cdac0e2947 c362d74a59fd80f9 c62114aa64a35fa3
    c69636c8a3861d17 c73d8151a42027fa c9ecdbb66c253876 cb41d0f41f2f4e94 cd6eaa23a3595d19 d07276ff0d15c1d9
    d2dcf6d55750079c d4e70437d0ba270a d70b3c3e7ae7824e d780a2d1051da0a7 d834174a7931c4c3 dab439a12805514a
    db87dd8f5e00ff92 dd637ddcb022dbcf df5624a3e1736139 e1c440e9ad541e1f e3e1bee62f35cdc5 e4fdd651a7525f52
    e7c444898784c773 ea1c5dcdb6639c52 ee0fd0144c262795 ef7b14c422f799b0 f0aa9c85c9cd3bff f3bf5e5a4486f679
    f638998963471b74 f6aeef2c5e393911 f8175708913feebb f90ca5248abdd217 f925e8e05e90f068 fa002925a07c798b
    fb25675fecc41c7e fce84dd8902a93af ffeb07713f4f5483
""".split())
"""Prompt ids of the 129 prompts of the set that AlpacaEval (``dataset == "helpful_base"``) holds verbatim."""


@dataclass(frozen=True)
class OutsideSet:
    """A set's file: ``path`` of ``repo`` at ``commit``, saved as ``<name>/<file>``; ``url`` serves its bytes,
    ``mirror_url`` the same bytes from a copy; prompts whose id is in ``exclude`` are dropped."""

    name: str
    file: str
    sha256: str
    repo: str
    commit: str
    path: str
    licence: str
    url: str
    mirror_url: str
    exclude: frozenset[str] = frozenset()


PROVENANCE = OutsideSet(
    name="hh_rlhf_helpful_base_test", file="test.jsonl.gz",
    sha256="8be3fc1a13b27901631696f2be6f184c799f1baeaf145f53ac5db24960adc37b",  # = the Git LFS pointer's oid
    repo="anthropics/hh-rlhf", commit="354e5c3cb8960630860dd5774a6ac2a58313bf4d", path="helpful-base/test.jsonl.gz",
    licence="MIT",  # a Git LFS file: raw.githubusercontent.com serves only its pointer
    url="https://media.githubusercontent.com/media/anthropics/hh-rlhf/354e5c3cb8960630860dd5774a6ac2a58313bf4d/"
        "helpful-base/test.jsonl.gz",
    mirror_url="https://raw.githubusercontent.com/DaehanKim/EasyRLHF/fc5016dd339f495d5f180dec18909a70b3d0f180/"
               "data/helpful-base/test.jsonl.gz",
    exclude=IN_ALPACA_EVAL)
OUTSIDE_SETS = {PROVENANCE.name: PROVENANCE}


@dataclass(frozen=True)
class OutsidePrompt:
    """One prompt: ``prompt_id`` (first 16 hex digits of the SHA-256 of ``text``), ``text`` (one user turn, stripped)
    and ``source_row`` (0-based line of its record in the file)."""

    prompt_id: str
    text: str
    source_row: int


def default_prompt_sets_dir() -> Path:
    """``$LENPRED_PROMPT_SETS`` if set, else ``~/.cache/lenpred/prompt_sets``."""
    return Path(os.environ.get("LENPRED_PROMPT_SETS", "~/.cache/lenpred/prompt_sets")).expanduser()


def first_human_turn(transcript: str) -> str:
    """The first ``Human:`` turn of an HH-RLHF transcript (``"\\n\\nHuman: ...\\n\\nAssistant: ..."``), stripped;
    ``""`` when the transcript does not start with a human turn."""
    text = transcript.lstrip()
    if not text.startswith("Human:"):
        return ""
    return text[len("Human:"):].split("\n\nAssistant:", 1)[0].split("\n\nHuman:", 1)[0].strip()


def load_outside_prompts(name: str = PROVENANCE.name, root: str | Path | None = None, limit: int | None = None,
                         seed: int = 0, sha256: str | None = None) -> list[OutsidePrompt]:
    """The set's prompts: first human turns, without empty ones, exact duplicates (the first row is kept), ones over
    :data:`MAX_CHARS` characters or excluded ones, ordered by the SHA-256 of ``"<seed>:<text>"`` (a fixed order per
    seed, independent of Python's random module), then cut to ``limit``.

    Args:
        root: the folder holding ``<name>/``; default :func:`default_prompt_sets_dir`.
        sha256: the checksum the file must have; default the one recorded in :data:`OUTSIDE_SETS`.

    Returns:
        ``min(limit, n)`` :class:`OutsidePrompt`, n = 2,078 for the recorded file.

    Raises:
        LenpredError: an unknown ``name``; a negative ``limit``; the file is missing, has another SHA-256, is not
            gzip'd UTF-8, or has a line that is not a JSON object with a string ``chosen`` (names the path and fix).
    """
    if name not in OUTSIDE_SETS:
        raise LenpredError(f"unknown prompt set '{name}'; valid sets: {', '.join(OUTSIDE_SETS)}")
    if limit is not None and limit < 0:
        raise LenpredError(f"limit must be >= 0, got {limit}")
    src = OUTSIDE_SETS[name]
    path = (default_prompt_sets_dir() if root is None else Path(root).expanduser()) / name / src.file
    fix = (f"download {src.url} (the file {src.path} of {src.repo} at commit {src.commit[:12]}, {src.licence}) "
           f"and save it unchanged as {path}, or set LENPRED_PROMPT_SETS to the folder that holds {name}/")
    if not path.is_file():
        raise LenpredError(f"prompt set '{name}' needs {path}, which is missing: {fix}")
    data = path.read_bytes()
    want, got = sha256 or src.sha256, hashlib.sha256(data).hexdigest()
    if got != want:
        raise LenpredError(f"{path} has SHA-256 {got}, expected {want}: the file is changed or truncated; {fix}")
    try:
        lines = gzip.decompress(data).decode("utf-8").split("\n")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise LenpredError(f"{path} is not gzip-compressed UTF-8 JSON Lines ({exc}); {fix}") from None
    prompts, seen = [], set()
    for row, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            text = first_human_turn(json.loads(line)["chosen"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise LenpredError(f"line {row + 1} of {path} is not a JSON object with a string 'chosen'; {fix}") from None
        pid = hashlib.sha256(text.encode()).hexdigest()[:16]
        if text and text not in seen and len(text) <= MAX_CHARS and pid not in src.exclude:
            seen.add(text)
            prompts.append(OutsidePrompt(pid, text, row))
    prompts.sort(key=lambda p: hashlib.sha256(f"{seed}:{p.text}".encode()).hexdigest())
    return prompts if limit is None else prompts[:limit]
