"""Users' own prompt files: the one reader of the prompt formats, and their settings in a benchmark.

Formats (the same for ``lenpred predict --file`` and ``lenpred bench build --prompts``), one prompt per line:

* plain text: the line is one user turn (kept as written; blank lines are skipped);
* JSON Lines: a line starting with ``{`` is a JSON object with ``prompt`` (a string, one user turn) or
  ``messages`` (OpenAI-style ``[{"role": ..., "content": ...}, ...]``); other keys are ignored.

A benchmark built from a file stores no prompt text: its records hold the prompt id ``"<name>:<line>"``
(``<line>`` is the 1-based line number in the file) and :func:`prompt_sha256` of the prompt's messages; its
``bench.json`` records each file's absolute path and SHA-256 so that :func:`prompt_messages`
re-reads the text and detects a changed or missing file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from lenpred.bench.sources import SOURCES, load_prompts
from lenpred.errors import LenpredError

Messages = list[dict[str, str]]
_NAME = re.compile(r"[\w.-]+")


def parse_prompt_lines(lines: list[str], where: str) -> list[tuple[int, str | list]]:
    """Prompts from the lines of a prompt file, as ``[(line number (1-based), prompt)]`` with blank lines skipped.

    A prompt is the raw line (plain text) or the ``messages`` / ``prompt`` value of a JSON line, unchecked (see
    :func:`prompt_to_messages` for the checks a benchmark applies).

    Raises:
        LenpredError: a line starting with ``{`` is not a JSON object with ``prompt`` or ``messages`` (names
            ``where`` and the line).
    """
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
                out.append((n, record["messages"] if "messages" in record else record["prompt"]))
            except (ValueError, KeyError, TypeError):
                raise LenpredError(f"line {n} of {where} is not a JSON object with 'prompt' or 'messages'") from None
        else:
            out.append((n, line))
    return out


def prompt_to_messages(prompt: Any, where: str, line: int) -> Messages:
    """Check one prompt of a file and turn it into ``[{"role", "content"}]`` messages (other message keys dropped).

    Raises:
        LenpredError: not a non-blank string or a non-empty list of messages with string ``role`` and string
            ``content`` (one of them non-blank: an empty system turn is kept), or text that is not valid Unicode
            (e.g. a lone surrogate escape ``\\ud83d`` in the JSON); the message names the file and the line.
    """
    at = f"line {line} of {where}"
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise LenpredError(f"{at}: 'prompt' must be a string and 'messages' a non-empty list of "
                           "{'role', 'content'} objects; fix or delete the line")
    messages = []
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise LenpredError(f"{at}: every message needs string 'role' and 'content', got {m!r:.60}; fix or "
                               "delete the line")
        try:
            m["content"].encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LenpredError(f"{at}: text is not valid Unicode ({exc.reason} at character {exc.start}, e.g. a lone "
                               "surrogate escape like \\ud83d); fix or delete the line") from None
        messages.append({"role": m["role"], "content": m["content"]})
    if not any(m["content"].strip() for m in messages):  # a blank turn (an empty system prompt) next to text is fine
        raise LenpredError(f"{at}: empty prompt (blank 'content'); fill or delete the line")
    return messages


def prompt_sha256(messages: Messages) -> str:
    """Hex SHA-256 of a prompt's content: the UTF-8 bytes of ``json.dumps([[role, content], ...])`` (no spaces,
    non-ASCII kept). What a benchmark record keeps instead of the text."""
    blob = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PromptFileContents:
    """A prompt file as read, checked and hashed.

    Attributes:
        path: absolute path.
        sha256: hex SHA-256 of the file's bytes.
        prompts: ``{line number (1-based): messages}`` in file order.
    """

    path: str
    sha256: str
    prompts: dict[int, Messages]


def _decode_lines(data: bytes, where: str) -> list[str]:
    lines = data.split(b"\n")
    try:
        return [line.decode("utf-8").rstrip("\r") for line in lines]
    except UnicodeDecodeError:
        for n, line in enumerate(lines, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise LenpredError(f"line {n} of {where} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
                                   "save the file as UTF-8, or fix or delete the line") from None
        raise


@lru_cache(maxsize=16)
def _read_cached(path: str, size: int, mtime_ns: int) -> PromptFileContents:
    data = Path(path).read_bytes()
    lines = _decode_lines(data[3:] if data.startswith(b"\xef\xbb\xbf") else data, path)  # a BOM is not text
    prompts = {n: prompt_to_messages(p, path, n) for n, p in parse_prompt_lines(lines, path)}
    if not prompts:
        raise LenpredError(f"{path} holds no prompts: give one prompt per line (text, or JSONL with 'prompt' or "
                           "'messages')")
    return PromptFileContents(path, hashlib.sha256(data).hexdigest(), prompts)


def read_prompt_file(path: str | os.PathLike) -> PromptFileContents:
    """Read and check every prompt of a file (cached while the file's size and modification time stay the same).

    Raises:
        LenpredError: the file is missing or unreadable, not UTF-8, holds no prompts, or a line is bad JSON, has
            no ``prompt`` / ``messages``, or is empty (the message names the file and the line).
    """
    p = Path(path).expanduser().resolve()
    try:
        st = p.stat()
    except OSError as exc:
        raise LenpredError(f"prompt file {p} cannot be read ({type(exc).__name__}): pass an existing text or JSONL "
                           "file") from None
    if not p.is_file():
        raise LenpredError(f"prompt file {p} is not a file: pass a text or JSONL file")
    return _read_cached(str(p), st.st_size, st.st_mtime_ns)


@dataclass
class PromptFileConfig:
    """One user prompt file of a benchmark and how its prompts are sampled.

    Attributes:
        path: the file (text lines or JSONL, see the module docstring); stored absolute.
        name: prefix of its prompt ids (``"<name>:<line>"``) and its ``source`` in the records; letters, digits,
            ``_``, ``.``, ``-``. Default: the file name without its extension.
        scenario: free workload name reported per group (``chat``, ``support``, ...); default: ``name``.
        samples_per_prompt: responses per train prompt.
        eval_samples_per_prompt: responses per validation / test prompt; default: ``samples_per_prompt``.
        temperature: sampling temperature, in (0, 2].
        top_p: nucleus mass kept, in (0, 1]; 1.0 = off.
        max_new_tokens: generation cap; capped responses are recorded as ``finish_reason="length"``.
        num_prompts: use only this many prompts (a seeded random subset, in plan order); ``None``: all.
    """

    path: str
    name: str = ""
    scenario: str = ""
    samples_per_prompt: int = 1
    eval_samples_per_prompt: int | None = None
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 512
    num_prompts: int | None = None

    def __post_init__(self):
        self.path = str(Path(self.path).expanduser().resolve())
        self.name = self.name or re.sub(r"[^\w.-]", "_", Path(self.path).stem)
        self.scenario = self.scenario or self.name
        if self.eval_samples_per_prompt is None:
            self.eval_samples_per_prompt = self.samples_per_prompt
        for what, value in (("name", self.name), ("scenario", self.scenario)):
            if not _NAME.fullmatch(value):
                raise LenpredError(f"prompt file {self.path}: {what} '{value}' may hold only letters, digits, '_', "
                                   f"'.' and '-'; pass another {what}")
        if self.name in SOURCES:
            raise LenpredError(f"prompt file name '{self.name}' is a registered source; pass another name "
                               "(e.g. rename the file)")
        if self.samples_per_prompt < 1 or self.eval_samples_per_prompt < 1:
            raise LenpredError(f"prompt file {self.path}: samples per prompt must be >= 1")
        if not 0 < self.temperature <= 2 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise LenpredError(f"prompt file {self.path}: temperature must be in (0, 2], top_p in (0, 1] and "
                               "max_new_tokens >= 1")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise LenpredError(f"prompt file {self.path}: num_prompts must be >= 1 (or unset: all prompts)")


_SPEC_KEYS = {"file": "path", "name": "name", "scenario": "scenario", "samples": "samples_per_prompt",
              "eval_samples": "eval_samples_per_prompt", "temperature": "temperature", "top_p": "top_p",
              "max_new_tokens": "max_new_tokens", "num_prompts": "num_prompts"}


def load_prompt_spec(path: str | os.PathLike) -> list[PromptFileConfig]:
    """Prompt files and their settings from a TOML spec: one ``[[prompts]]`` table per file with ``file`` (relative
    to the spec's directory) and optional ``name``, ``scenario``, ``samples``, ``eval_samples``, ``temperature``,
    ``top_p``, ``max_new_tokens``, ``num_prompts`` (see :class:`PromptFileConfig`).

    Raises:
        LenpredError: the spec is unreadable or not TOML, has no ``[[prompts]]`` tables, a table lacks ``file`` or
            has an unknown key (the message lists the valid ones), or a setting is invalid.
    """
    import tomllib

    path = Path(path)
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise LenpredError(f"cannot read the spec {path} ({type(exc).__name__}: {exc}); write it as TOML with one "
                           "[[prompts]] table per file") from None
    tables = spec.get("prompts")
    unknown_top = sorted(set(spec) - {"prompts"})
    if not isinstance(tables, list) or not tables or unknown_top:
        raise LenpredError(f"{path} needs one [[prompts]] table per file (and nothing else"
                           f"{', found ' + ', '.join(unknown_top) if unknown_top else ''})")
    out = []
    for i, table in enumerate(tables, 1):
        bad = sorted(set(table) - set(_SPEC_KEYS))
        if bad or "file" not in table:
            raise LenpredError(f"[[prompts]] table {i} of {path}: " + (f"unknown keys {bad}" if bad else "no 'file'")
                               + f"; valid keys: {', '.join(_SPEC_KEYS)}")
        kwargs = {_SPEC_KEYS[k]: v for k, v in table.items()}
        try:
            kwargs["path"] = str(path.parent / Path(kwargs["path"]).expanduser())
            out.append(PromptFileConfig(**kwargs))
        except TypeError as exc:
            raise LenpredError(f"[[prompts]] table {i} of {path}: {exc}") from None
    return out


def check_distinct(files: list[PromptFileConfig]) -> None:
    """Raise if two prompt files share a name (their ids would collide)."""
    names = [f.name for f in files]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise LenpredError(f"two prompt files are both named {dup}: give each a distinct name (spec: name = ...)")


def manifest_entry(cfg: PromptFileConfig) -> dict[str, Any]:
    """What ``bench.json`` records of a prompt file: its settings, absolute path and SHA-256 (never its text)."""
    return {**asdict(cfg), "sha256": read_prompt_file(cfg.path).sha256}


# ---------------------------------------------------------------- resolving ids back to text

def resolve_prompt_file(name: str, entry: dict[str, str], data_dir: str | os.PathLike | None) -> PromptFileContents:
    """The prompt file a benchmark was built from, checked against its recorded SHA-256.

    Looks at the recorded path, then (if the file moved) at ``data_dir / <file name>`` when ``data_dir`` is given.

    Raises:
        LenpredError: the file is missing, or its bytes differ from the ones the benchmark was built from.
    """
    recorded = Path(entry["path"])
    candidates = [recorded] + ([Path(data_dir).expanduser() / recorded.name] if data_dir is not None else [])
    for path in candidates:
        if path.is_file():
            contents = read_prompt_file(path)
            if contents.sha256 != entry["sha256"]:
                raise LenpredError(f"prompt file {path} (prompts '{name}' of the benchmark) changed since the "
                                   f"benchmark was built (SHA-256 {contents.sha256[:12]} vs {entry['sha256'][:12]}): "
                                   "restore it, or rebuild the benchmark into a new --out directory")
            return contents
    raise LenpredError(f"prompt file {recorded} (prompts '{name}' of the benchmark) is missing: put it back, or pass "
                       "--data-dir with the directory that now holds it")


def prompt_messages(prompt_id: str, data_dir: str | os.PathLike | None = None,
                    prompt_files: list[dict] | None = None) -> Messages:
    """Re-read one prompt's messages by id: ``"<source>:<index>"`` from a registered source's file, or
    ``"<name>:<line>"`` from a user prompt file of a benchmark.

    A user prompt file is found through ``prompt_files`` (its benchmark's ``bench.json["prompt_files"]``); its bytes
    must match the SHA-256 recorded at build time. ``data_dir``: the registered sources' directory, and where a moved prompt file is looked for.

    Raises:
        LenpredError: malformed id, unknown source, an id the source does not hold, or a user prompt file that is
            missing or changed (the message names the file).
    """
    name, _, index = prompt_id.rpartition(":")
    entry = {e["name"]: e for e in prompt_files or []}.get(name)
    if entry is not None:
        contents = resolve_prompt_file(name, entry, data_dir)
        line = int(index) if index.isdigit() else -1
        if line not in contents.prompts:
            raise LenpredError(f"prompt id '{prompt_id}' names no prompt of {contents.path} (no prompt on line "
                               f"{index}): the benchmark does not belong to this file")
        return [dict(m) for m in contents.prompts[line]]
    if name not in SOURCES:
        raise LenpredError(f"prompt id '{prompt_id}' names neither a registered source nor one of the prompt files "
                           "given (prompt_files= from its benchmark's bench.json); valid sources: "
                           f"{', '.join(SOURCES)}")
    prompts = load_prompts(name, data_dir)
    if prompt_id not in prompts:
        raise LenpredError(f"prompt id '{prompt_id}' is not in source '{name}' (it has {len(prompts)} prompts): "
                           "the data directory holds another version of the file")
    return prompts[prompt_id]
