"""PiA — "Perception in Advance": the serving model states its own answer length before answering.

Source: Zheng, Z., Ren, X., Xue, F., Luo, Y., Jiang, X., You, Y. (2023), *Response Length Perception
and Sequence Scheduling: An LLM-Empowered LLM Inference Pipeline* (NeurIPS 2023, arXiv:2305.13144).
Their PiA prompt appends to the user's instruction a request to print the estimated number of
words of the response on the first line and then answer on a new line; the first line is parsed as
the length estimate. We use the prompting (zero-shot) form: the model is not fine-tuned on length
perception, as the paper's Vicuna was.

Pipeline:

* :func:`self_report_messages` appends :data:`PIA_INSTRUCTION` to the last user message;
* :func:`ask_self_reports` decodes greedily (deterministic) a few tokens per prompt in left-padded
  batches and caches the answers in a resumable JSON file;
* :func:`parse_word_count` turns an answer into a number of words (or ``None``);
* :func:`tokens_per_word` converts words to tokens with the ratio measured on the model's own
  training responses (the predictor ``pia`` in :mod:`lenpred.predictors.pia` multiplies the two).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from pathlib import Path
from typing import Any

from lenpred.backbone import eos_token_ids
from lenpred.engines.hf import without_model_defaults
from lenpred.errors import LenpredError
from lenpred.io import stable_hash, write_json
from lenpred.prompts import chat_token_ids, check_fits
from lenpred.torch_state import with_backbone_threads

PIA_INSTRUCTION = (
    "Before responding to the instruction above, predict the length of your response. Write the estimated "
    "number of words in your response on the first line, then start a new line and respond to the instruction."
)
"""Appended to the last user message; close to Zheng et al. (2023)'s wording: "Before responding to the
above instruction, you have to predict the length of your response. Print the estimated number of words
in your response in the first line. Then change to a new line to respond to the instruction." (35 words)."""

MAX_WORDS = 20_000.0
"""Parsed estimates above this many words are treated as unparseable (no chat answer is that long)."""

_CACHE_FORMAT = "lenpred-pia-cache/1"


def instruction_hash(instruction: str = PIA_INSTRUCTION) -> str:
    """First 16 hex digits of the SHA-256 of the instruction text (part of the cache key)."""
    return hashlib.sha256(instruction.encode()).hexdigest()[:16]


def self_report_messages(messages: list[dict[str, str]], instruction: str = PIA_INSTRUCTION) -> list[dict[str, str]]:
    """The chat ``messages`` with the PiA instruction appended to the last user message.

    The instruction follows the user's text after a blank line; earlier turns and the input list are
    left unchanged (a new list of new dicts is returned).

    Args:
        messages: chat messages (``{"role", "content"}`` dicts), as from
            :func:`lenpred.bench.sources.load_prompts`.
        instruction: the length question (default :data:`PIA_INSTRUCTION`).

    Raises:
        LenpredError: no message has role ``"user"``.
    """
    out = [dict(m) for m in messages]
    last_user = next((i for i in range(len(out) - 1, -1, -1) if out[i].get("role") == "user"), None)
    if last_user is None:
        raise LenpredError("PiA needs a user message to append its length question to; the prompt has none "
                           f"(roles: {[m.get('role') for m in messages]})")
    out[last_user]["content"] = f"{str(out[last_user].get('content', '')).rstrip()}\n\n{instruction}"
    return out


# ----------------------------------------------------------------------------------------------------------------
# generation with a resumable cache


def _read_cache(path: Path, key: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Answers stored in ``path`` (``{}`` when absent) after checking integrity and key."""
    if not path.exists():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(obj, dict) or obj.get("format") != _CACHE_FORMAT:
            raise ValueError("not a lenpred PiA cache")
        answers = obj["answers"]
        if not isinstance(answers, dict) or not all(
                isinstance(a, dict) and isinstance(a.get("text"), str) and isinstance(a.get("prompt_hash"), str)
                for a in answers.values()):
            raise ValueError("malformed answers")
        stored_key = obj["key"]
        if not isinstance(stored_key, dict):
            raise ValueError("malformed key")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise LenpredError(f"PiA cache {path} is corrupt or truncated ({type(exc).__name__}: {exc}): delete it and "
                           "rerun to regenerate the self-reports") from None
    if stored_key != key:
        diff = ", ".join(f"{k}: {stored_key.get(k)!r} != {v!r}" for k, v in key.items() if stored_key.get(k) != v)
        raise LenpredError(f"PiA cache {path} holds self-reports for another setting ({diff or stored_key}): "
                           "delete it or pass another cache path")
    return answers


@with_backbone_threads
def _generate_batch(backbone, batch_token_ids: list[list[int]], max_new_tokens: int,
                    eos: tuple[int, ...], pad_token_id: int) -> list[str]:
    """Greedy continuation of one left-padded batch, decoded up to (excluding) the first EOS."""
    import torch

    from lenpred.signals import left_pad

    from transformers import GenerationConfig

    input_ids, mask = left_pad(batch_token_ids, pad_token_id)
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                              eos_token_id=list(eos) if eos else None, pad_token_id=pad_token_id)
    with torch.inference_mode(), without_model_defaults(backbone.model):
        # generate() derives position ids from the attention mask (cumsum - 1), so left padding does not
        # shift positions; padded keys are masked in every step. Plain greedy: the model's
        # generation_config.json (e.g. a repetition penalty) is not applied.
        out = backbone.model.generate(input_ids, attention_mask=mask, generation_config=config)
    texts = []
    for row in out[:, input_ids.shape[1]:].tolist():
        cut = next((i for i, t in enumerate(row) if t in eos), len(row))
        texts.append(backbone.tokenizer.decode(row[:cut], skip_special_tokens=True))
    return texts


def ask_self_reports(backbone, prompts: dict[str, list[dict[str, str]]], cache: str | Path,
                     max_new_tokens: int = 16, batch_size: int = 16, progress: bool = True,
                     instruction: str = PIA_INSTRUCTION, skip_too_long: bool = False) -> dict[str, str]:
    """Ask the serving model, for every prompt, how many words its answer will have (PiA).

    Each prompt gets :func:`self_report_messages`, is chat-formatted with
    :func:`lenpred.prompts.chat_token_ids`, and is continued by greedy decoding (``do_sample=False``:
    deterministic) with ``model.generate`` on left-padded batches of prompts of similar length, stopping
    at the model's EOS ids (:func:`lenpred.backbone.eos_token_ids`). Greedy answers do not depend on the
    batch-mates (left padding is masked and position ids come from the attention mask), up to float
    rounding.

    Cache: a JSON file keyed by the model revision (``backbone.revision``), the instruction's hash and
    ``max_new_tokens``; it holds ``{prompt_id: {"prompt_hash", "text"}}`` and is rewritten atomically
    (:func:`lenpred.io.write_json`) after every batch, so a killed run resumes where it stopped. A prompt
    whose chat token ids changed since it was cached (another data version) is asked again.

    Args:
        backbone: a loaded :class:`lenpred.backbone.Backbone`.
        prompts: ``{prompt_id: chat messages}`` (the user's prompt, without the PiA question).
        cache: path of the JSON cache file (created with its parent directories).
        max_new_tokens: tokens generated per prompt; the estimate is on the first line, so 16 is plenty.
        batch_size: prompts per ``generate`` call.
        progress: show a tqdm bar (prompts done / total, ETA).
        instruction: the length question (default :data:`PIA_INSTRUCTION`).
        skip_too_long: give prompts that do not fit the context window with the question an empty answer
            (an unparseable self-report, so PiA falls back and counts it) instead of raising.

    Returns:
        ``{prompt_id: generated text}`` in the order of ``prompts`` (EOS and special tokens removed).

    Raises:
        LenpredError: the cache file is corrupt or was written for another model revision / instruction /
            ``max_new_tokens``; a prompt has no user message or blank content; a prompt plus
            ``max_new_tokens`` does not fit the context window (unless ``skip_too_long``);
            ``max_new_tokens`` or ``batch_size`` < 1.
    """
    from tqdm.auto import tqdm

    if max_new_tokens < 1 or batch_size < 1:
        raise LenpredError(f"max_new_tokens and batch_size must be >= 1 (got {max_new_tokens}, {batch_size})")
    cache = Path(cache)
    key = {"model_revision": backbone.revision, "instruction_sha256": instruction_hash(instruction),
           "max_new_tokens": int(max_new_tokens), "decoding": "greedy"}
    answers = _read_cache(cache, key)

    token_ids = {pid: chat_token_ids(backbone.tokenizer, self_report_messages(msgs, instruction))
                 for pid, msgs in prompts.items()}
    for pid, ids in list(token_ids.items()):
        try:
            check_fits(len(ids), max_new_tokens, backbone.context_window, what=f"prompt {pid} with the PiA question")
        except LenpredError:
            if not skip_too_long:
                raise
            del token_ids[pid]
    hashes = {pid: stable_hash(ids) for pid, ids in token_ids.items()}
    todo = [pid for pid in token_ids if answers.get(pid, {}).get("prompt_hash") != hashes[pid]]
    todo.sort(key=lambda pid: len(token_ids[pid]))  # similar lengths per batch: little padding

    eos = tuple(eos_token_ids(backbone.model_dir, backbone.tokenizer))
    pad = backbone.tokenizer.pad_token_id
    pad = pad if pad is not None else (eos[0] if eos else 0)
    t0 = time.perf_counter()
    with tqdm(total=len(token_ids), initial=len(token_ids) - len(todo), unit="prompt", desc="PiA self-reports",
              disable=not progress) as bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            texts = _generate_batch(backbone, [token_ids[p] for p in batch], max_new_tokens, eos, pad)
            for pid, text in zip(batch, texts):
                answers[pid] = {"prompt_hash": hashes[pid], "text": text}
            write_json(cache, {"format": _CACHE_FORMAT, "key": key, "answers": answers})
            bar.update(len(batch))
            bar.set_postfix(s_per_prompt=f"{(time.perf_counter() - t0) / (start + len(batch)):.2f}")
    return {pid: answers[pid]["text"] if pid in token_ids else "" for pid in prompts}


# ----------------------------------------------------------------------------------------------------------------
# parsing


_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALES = {"hundred": 100, "thousand": 1000}
_NUMBER_WORD = re.compile(r"[A-Za-z]+")


def _words_to_digits(text: str) -> str:
    """Replace runs of English number words by digits: "two hundred and fifty" -> "250", "a hundred" -> "100".

    Handles units, teens, tens (also hyphenated, "twenty-five"), "hundred", "thousand", a leading
    "a"/"an" before a scale and "and" inside a run. Anything else is left as it is.
    """
    tokens = list(_NUMBER_WORD.finditer(text))
    out, pos, i = [], 0, 0
    while i < len(tokens):
        j, total, current, seen = i, 0, 0, False
        end = None
        while j < len(tokens):
            w = tokens[j].group().lower()
            gap = text[tokens[j - 1].end():tokens[j].start()] if j > i else ""
            if j > i and gap.strip() not in ("", "-"):
                break
            nxt = tokens[j + 1].group().lower() if j + 1 < len(tokens) else ""
            if w in _UNITS:
                current += _UNITS[w]
            elif w in _TENS:
                current += _TENS[w]
            elif w in _SCALES:
                if not seen:
                    break
                if _SCALES[w] == 100:
                    current = max(current, 1) * 100
                else:
                    total, current = (total + max(current, 1)) * 1000, 0
            elif w in ("a", "an") and not seen and nxt in _SCALES:
                current = 1
            elif w == "and" and seen and (nxt in _UNITS or nxt in _TENS):
                pass
            else:
                break
            seen = True
            end = tokens[j].end()
            j += 1
        if end is not None and (total or current or any(tokens[k].group().lower() == "zero" for k in range(i, j))):
            out.append(text[pos:tokens[i].start()])
            out.append(str(total + current))
            pos, i = end, j
        else:
            i += 1
    out.append(text[pos:])
    return "".join(out)


_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_CANDIDATE = re.compile(  # a number or range, optionally "k" and "word(s)"; not part of a longer token ("1920s")
    rf"(?<![\w.,\-])(?P<neg>-)?(?P<a>{_NUM})(?P<ak>[kK])?"
    rf"(?:\s*(?:-|–|—|to)\s*(?P<b>{_NUM})(?P<bk>[kK])?)?"
    rf"(?:(?P<words>\s*-?words?\b)|(?!\w|[.,]\d))")
_LENGTH_WORD = re.compile(r"\b(?:words?|length|long|estimat\w*|count)\b", re.IGNORECASE)
_SHORT_LINE_WORDS = 3
"""A line of at most this many words may be a bare estimate ("150", "~200", "100 to 150", "About 80.")."""


def _number(digits: str, k: str | None) -> float:
    return float(digits.replace(",", "")) * (1000.0 if k else 1.0)


def _line_estimate(line: str) -> float | None:
    """The length estimate stated in one line, or ``None`` when the line does not state one.

    A number (or a range's midpoint) counts as an estimate when it is followed by "word(s)", or comes after a
    length word ("Estimated length: 80", "Word count: 150"), or stands in a short line (at most
    :data:`_SHORT_LINE_WORDS` words: "150", "~200"). Numbers inside ordinary answer text ("Janet's ducks lay
    16 eggs per day", "Step 1: ...", "The 1920s were ...") are not estimates: the model did not answer the
    question, and reading them would turn the answer's content into a length.
    """
    text = _words_to_digits(line)
    candidates = []
    for m in _CANDIDATE.finditer(text):
        value = _number(m["a"], m["ak"])
        if m["b"] is not None:
            value = (value + _number(m["b"], m["bk"])) / 2
        value = -value if m["neg"] else value
        candidates.append((value, m["words"] is not None, _LENGTH_WORD.search(text[:m.start()]) is not None))
    if not candidates:
        return None
    for value, followed_by_words, _ in candidates:
        if followed_by_words:
            return value
    for value, _, after_length_word in candidates:
        if after_length_word:
            return value
    return candidates[0][0] if len(text.split()) <= _SHORT_LINE_WORDS else None


def parse_word_count(text: str | None, fallback_chars: int = 40) -> float | None:
    """Parse a PiA self-report into the number of words the model expects to write.

    Reads the first non-blank line (the PiA format puts the estimate there); when it states no estimate,
    falls back to the other lines that begin within the first ``fallback_chars`` characters of the answer
    ("Sure!\\nHere is my 300 word answer"). A number counts as an estimate when it is followed by
    "word(s)", follows a length word ("length", "words", "estimate", "count", "long") or stands in a line of
    at most three words; the first number followed by "word(s)" wins. Numbers in ordinary answer text are not
    read ("Step 1: ...", "Janet's ducks lay 16 eggs" -> ``None``): with SmolLM2-135M every number found
    by a looser "first number" rule was such a false positive. Understood forms (hand-checked in tests):
    ``"150"``, ``"150 words"``, ``"About 1,200 words."``, ``"Estimated length: 80"``, ``"~200"``,
    ``"2.5k words"`` (2500), ranges ``"100-150 words"`` / ``"100 to 150"`` / ``"100–150"`` (midpoint 125)
    and simple English number words (``"fifty"``, ``"two hundred"``, ``"a hundred"``, ``"twenty-five"``).

    Args:
        text: the model's answer (``None`` allowed: no answer).
        fallback_chars: lines starting within this many characters of the answer are searched when the
            first line states no estimate.

    Returns:
        Words (float, > 0), or ``None`` when nothing parses or the number is zero, negative or above
        :data:`MAX_WORDS` (absurd).
    """
    if not text or not text.strip():
        return None
    value, offset = None, 0
    for line in text.strip().splitlines(keepends=True):
        if offset >= fallback_chars and offset > 0:
            break
        offset += len(line)
        if line.strip():
            value = _line_estimate(line)
            if value is not None:
                break
    if value is None or not math.isfinite(value) or value <= 0 or value > MAX_WORDS:
        return None
    return value


# ----------------------------------------------------------------------------------------------------------------
# calibration


def tokens_per_word(tokenizer: Any, response_token_ids: list[list[int]]) -> float:
    """Tokens per whitespace-separated word of the model's own responses (e.g. its training responses).

    ``sum(len(ids)) / sum(len(decode(ids, skip_special_tokens=True).split()))`` over all responses, so
    long responses weigh more (a ratio of totals, not a mean of ratios). PiA estimates are in words; this
    ratio turns them into the tokens lenpred predicts.

    Args:
        tokenizer: the serving model's tokenizer.
        response_token_ids: generated token ids per response (EOS excluded, as stored in benchmark records).

    Returns:
        Tokens per word (float).

    Raises:
        LenpredError: the responses hold no word at all.
    """
    num_tokens = sum(len(ids) for ids in response_token_ids)
    num_words = sum(len(tokenizer.decode(list(ids), skip_special_tokens=True).split()) for ids in response_token_ids)
    if num_words == 0:
        raise LenpredError(f"cannot measure tokens per word: the {len(response_token_ids)} responses hold no words "
                           "(pass the training responses' token ids)")
    return num_tokens / num_words
