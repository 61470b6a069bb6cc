"""Registry of prompt sources: one entry per public data set in the data directory.

Each source reads its file(s) from the data directory (default ``../shared/datasets``, overridable
with ``--data-dir`` or ``$LENPRED_DATA_DIR``), maps a record to chat messages, and gives it a
stable prompt id ``"<source>:<index>"`` so that a benchmark stores only ids and re-reads the text.
Scenario assignment follows the ForeLen layout (Xie et al., ICLR 2026; README): ``longseq``, ``reasoning``, ``rl``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from lenpred.errors import LenpredError

SCENARIOS = ("longseq", "reasoning", "rl")

COT_INSTRUCTION = "Solve the following problem. Think step by step, then state the final answer."
RL_MATH_INSTRUCTION = "Solve the problem step by step. Put the final answer in \\boxed{}."


def default_data_dir() -> Path:
    """``$LENPRED_DATA_DIR`` if set, else ``../shared/datasets`` relative to the working directory."""
    return Path(os.environ.get("LENPRED_DATA_DIR", "../shared/datasets")).expanduser()


Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Source:
    """One prompt source.

    Attributes:
        name: registry key, also the prefix of its prompt ids.
        scenario: ``longseq``, ``reasoning`` or ``rl``.
        files: paths relative to the data directory, read in order and concatenated.
        to_messages: maps one raw record to chat messages (``None`` drops an unusable record).
        hub_id: the Hugging Face data set with the same prompts, for users with network access.
    """

    name: str
    scenario: str
    files: tuple[str, ...]
    to_messages: Callable[[Any], Messages | None]
    hub_id: str = ""


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text.strip()}]


def _read_records(path: Path) -> list[Any]:
    """Read a JSON array, a JSON object with an ``examples`` list, or JSON Lines."""
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("[") or (stripped.startswith("{") and '"examples"' in text[:2000]):
        try:
            obj = json.loads(text)
            return obj["examples"] if isinstance(obj, dict) else obj
        except json.JSONDecodeError:
            pass  # JSON Lines whose first record happens to start with '['/'{'
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise LenpredError(f"malformed JSON in {path} line {lineno}: {exc.msg}; restore the file "
                                   "from its source (see PROVENANCE.md)") from None
    return records


def _alpaca(r: dict) -> Messages:
    return _user(r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else ""))


def _self_instruct(r: dict) -> Messages:
    inst = (r.get("instances") or [{}])[0].get("input", "")
    return _user(r["instruction"] + (f"\n\n{inst}" if inst else ""))


def _sharegpt(r: dict) -> Messages | None:
    turns = [t["value"] for t in r.get("conversations", []) if t.get("from") == "human" and t.get("value", "").strip()]
    return _user(turns[0]) if turns else None


def _aqua(r: dict) -> Messages:
    return _user(f"{COT_INSTRUCTION}\n\n{r['question']}\nOptions: {' '.join(r['options'])}")


def _mbpp(r: dict) -> Messages:
    tests = "\n".join(r["test_list"])
    return _user(f"Write a Python function for this task: {r['text']}\nYour code should pass these tests:\n{tests}")


def _humaneval(r: dict) -> Messages:
    return _user(f"Complete the following Python function.\n```python\n{r['prompt']}```")


_MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                  "prealgebra", "precalculus")

SOURCES: dict[str, Source] = {s.name: s for s in [
    # --- long-sequence / open-ended instruction following
    Source("longbench_write", "longseq", ("longbench_write/longbench_write_en.jsonl",),
           lambda r: _user(r["prompt"]), "THUDM/LongWriter"),
    Source("ifeval", "longseq", ("ifeval/input_data.jsonl",), lambda r: _user(r["prompt"]), "google/IFEval"),
    Source("mt_bench", "longseq", ("mt_bench/question.jsonl",), lambda r: _user(r["turns"][0]),
           "lmsys/mt_bench_human_judgments"),
    Source("vicuna_bench", "longseq", ("vicuna_bench/question.jsonl",), lambda r: _user(r["turns"][0])),
    Source("self_instruct", "longseq", ("self_instruct_user_oriented/user_oriented_instructions.jsonl",),
           _self_instruct, "yizhongw/self_instruct"),
    Source("alpaca_eval", "longseq", ("alpaca_eval/model_outputs_text_davinci_003.json",), _alpaca,
           "tatsu-lab/alpaca_eval"),
    Source("alpaca_demo", "longseq", ("alpaca_demo/alpaca_en_demo.json",), _alpaca, "tatsu-lab/alpaca"),
    Source("sharegpt", "longseq", ("sharegpt/ShareGPT_V3_filtered_500.json",), _sharegpt,
           "anon8231489123/ShareGPT_Vicuna_unfiltered"),
    Source("oasst", "longseq", ("oasst/en_100_text.jsonl",), lambda r: _user(r if isinstance(r, str) else r["prompt"]),
           "OpenAssistant/oasst1"),
    # --- reasoning / chain of thought (held-out test splits of the math sets)
    Source("gsm8k", "reasoning", ("gsm8k/test.jsonl",), lambda r: _user(f"{COT_INSTRUCTION}\n\n{r['question']}"),
           "openai/gsm8k"),
    Source("math", "reasoning", tuple(f"math/test/{s}.jsonl" for s in _MATH_SUBJECTS),
           lambda r: _user(f"{COT_INSTRUCTION}\n\n{r['problem']}"), "hendrycks/competition_math"),
    Source("math500", "reasoning", ("math500/test.jsonl",), lambda r: _user(f"{COT_INSTRUCTION}\n\n{r['problem']}"),
           "HuggingFaceH4/MATH-500"),
    Source("aqua", "reasoning", ("aqua/test.json",), _aqua, "deepmind/aqua_rat"),
    Source("strategyqa", "reasoning", ("strategyqa/task.json",),
           lambda r: _user(f"{COT_INSTRUCTION} Answer yes or no.\n\n{r['input']}"), "ChilleD/StrategyQA"),
    # --- RL rollouts (training splits, as a policy would see them)
    Source("gsm8k_train", "rl", ("gsm8k/train.jsonl",), lambda r: _user(f"{RL_MATH_INSTRUCTION}\n\n{r['question']}"),
           "openai/gsm8k"),
    Source("math_train", "rl", tuple(f"math/train/{s}.jsonl" for s in _MATH_SUBJECTS),
           lambda r: _user(f"{RL_MATH_INSTRUCTION}\n\n{r['problem']}"), "hendrycks/competition_math"),
    Source("mbpp", "rl", ("mbpp/mbpp.jsonl",), _mbpp, "google-research-datasets/mbpp"),
    Source("humaneval", "rl", ("humaneval/HumanEval.jsonl",), _humaneval, "openai/openai_humaneval"),
]}


def get_source(name: str) -> Source:
    """Look up a source by name.

    Raises:
        LenpredError: unknown name (the message lists the valid ones).
    """
    try:
        return SOURCES[name]
    except KeyError:
        raise LenpredError(f"unknown source '{name}'; valid sources: {', '.join(SOURCES)}") from None


def _file_stamps(name: str, data_dir: str) -> tuple:
    """(path, size, mtime) of a source's files: part of the cache key, so an edited file is re-read."""
    stamps = []
    for rel in get_source(name).files:
        path = Path(data_dir) / rel
        st = path.stat() if path.is_file() else None
        stamps.append((rel, st.st_size if st else -1, st.st_mtime_ns if st else -1))
    return tuple(stamps)


@lru_cache(maxsize=64)
def _load_cached(name: str, data_dir: str, stamps: tuple) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    src = get_source(name)
    out = []
    index = 0
    for rel in src.files:
        path = Path(data_dir) / rel
        if not path.is_file():
            raise LenpredError(f"source '{name}' needs {path}, which is missing: point --data-dir (or "
                               f"$LENPRED_DATA_DIR) at a copy of the prompt data sets")
        for n, record in enumerate(_read_records(path)):
            try:
                messages = src.to_messages(record)
            except (KeyError, TypeError, IndexError) as exc:
                raise LenpredError(f"record {n} of {path} lacks field {exc}; the file does not match source "
                                   f"'{name}' — restore it from its source (PROVENANCE.md)") from None
            if messages is not None:
                _check_text(messages, path, n, f"{name}:{index}")
                out.append((f"{name}:{index}", tuple((m["role"], m["content"]) for m in messages)))
            index += 1
    return tuple(out)


def _check_text(messages: Messages, path: Path, record: int, prompt_id: str) -> None:
    """Raise if a record's text cannot be encoded (a lone surrogate escape such as ``\\ud83d`` in the JSON).

    Raises:
        LenpredError: naming the file, the record (0-based, in file order), its prompt id and the character.
    """
    for m in messages:
        try:
            m["content"].encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LenpredError(f"record {record} of {path} (prompt id {prompt_id}) has text that is not valid Unicode "
                               f"({exc.reason} at character {exc.start}, "
                               "e.g. a lone surrogate escape like \\ud83d): fix or delete that "
                               "record, or restore the file from its source (PROVENANCE.md)") from None


def load_prompts(name: str, data_dir: str | os.PathLike | None = None) -> dict[str, Messages]:
    """All prompts of a source, as ``{prompt_id: messages}`` in file order.

    Records that cannot form a prompt (e.g. a ShareGPT conversation without a human turn) are skipped;
    indices still count them, so ids are stable.

    Raises:
        LenpredError: a file is missing or malformed, or a record's text is not valid Unicode (the message
            names the file and the record: the whole build stops rather than silently changing the plan).
    """
    root = str(Path(data_dir or default_data_dir()).resolve())
    return {pid: [{"role": r, "content": c} for r, c in msgs]
            for pid, msgs in _load_cached(name, root, _file_stamps(name, root))}
