"""One prompt preparation for every path (benchmark builder, both sampling engines, signal extraction,
evaluation, prediction and the ``lenpred serve`` proxy): chat template, tokenisation, the special-token rule, the
user-content span, and limits.

Rules (the same everywhere, so a fix in one place reaches all of them):

* **Template**: the tokenizer's chat template with ``add_generation_prompt=True``; a base model without
  one (e.g. gemma-3-270m) gets BOS + the turns joined by blank lines + a blank line.
* **Tokenisation**: the rendered prompt is tokenised as one string with ``add_special_tokens=False``, which is
  what vLLM's OpenAI chat endpoint does (vLLM 0.32, ``vllm/renderers``: ``safe_apply_chat_template(...,
  tokenize=False)``, then ``tokenizer(prompt, add_special_tokens=False)``, the request's default), so a prompt's
  ids here are the ids whose prefill state the in-engine plug-in reads. Tokenising the template's text and each
  message's content separately gives other ids where they meet: BPE merges whitespace across the boundary
  (``"\n"`` + ``"    def"`` is ``"\n   "``, ``" def"`` as one string but ``"\n"``, ``"   "``, ``" def"`` in pieces).
* **Special-token rule**: text a user typed never becomes a control token. Where a message's content holds
  special-token text (a typed ``<|im_end|>``), the rendered prompt is cut into the template's own text (tokenised
  normally, so ``<|im_start|>`` there *is* the control token) and each message's content (tokenised with
  ``split_special_tokens=True``: the ordinary characters ``<``, ``|``, ``im``, ...). vLLM's chat endpoint has no
  such rule (the typed text becomes the control token there), so only these prompts count other tokens than the
  engine does.
* **Content span**: ``[content_start, content_end)`` are the token positions from the first message's
  content to the end of the last message's content, for *this* request: the template's fixed text
  before it (default system prompt, role header) and after it (end of turn, assistant header) is the
  same for every request, so poolers skip it (a custom system prompt is user content and is kept). A token that
  straddles the boundary (``"\n   "`` above) counts as content; empty messages (``""``) hold no content.
* **Limits**: ``num_prompt_tokens + max_new_tokens <= context_window`` (:func:`check_fits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lenpred.errors import ContextWindowError, LenpredError

TEMPLATE_RULE = "chat-template+split-special-content+content-span/v1"
"""Name of the rule above; stored with every signal cache, benchmark and saved predictor."""


@dataclass(frozen=True)
class PreparedPrompt:
    """A chat-formatted prompt as the serving model sees it.

    Attributes:
        token_ids: the prompt's token ids (``num_prompt_tokens`` long), ending with the assistant cue.
        content_start, content_end: token positions ``[start, end)`` of the users' content (first message's
            content to the end of the last message's content); ``0 <= start < end <= num_prompt_tokens``.
    """

    token_ids: tuple[int, ...]
    content_start: int
    content_end: int

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.token_ids)


def _check_messages(messages: Any) -> list[dict[str, str]]:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, list) or not messages:
        raise LenpredError("a prompt is a non-empty string or a non-empty list of {'role', 'content'} messages")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
            raise LenpredError(f"a chat message needs string 'role' and 'content', got {m!r:.80}")
        try:
            m["content"].encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LenpredError(f"message content is not valid Unicode text ({exc.reason} at character {exc.start}, "
                               "e.g. a lone surrogate escape): fix or drop the record") from None
    if not any(m["content"].strip() for m in messages):  # a blank turn (an empty system prompt) next to text is fine
        raise LenpredError("empty prompt: every message has blank 'content'; drop or fill the record")
    return messages


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The prompt text: the chat template's rendering, as vLLM's chat endpoint renders it, or the base-model rule."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return (tokenizer.bos_token or "") + "\n\n".join(m["content"] for m in messages) + "\n\n"


def _content_chars(rendered: str, messages: list[dict[str, str]]) -> list[tuple[int, int]]:
    """Each message's ``[start, end)`` character range in ``rendered``, in order."""
    ranges, pos = [], 0
    for m in messages:
        at = rendered.find(m["content"], pos)
        if at < 0:
            raise LenpredError("the chat template changes the message text (e.g. strips it), so the user's content "
                               "cannot be located in the prompt; strip the messages before predicting")
        pos = at + len(m["content"])
        ranges.append((at, pos))
    return ranges


def _split_special(tokenizer: Any, rendered: str, chars: list[tuple[int, int]]) -> PreparedPrompt:
    """The special-token rule's ids: template text tokenised normally, each content with ``split_special_tokens``."""
    cuts = [0, *(c for r in chars for c in r), len(rendered)]
    ids: list[int] = []
    start = end = None
    for k in range(len(cuts) - 1):
        text, is_content = rendered[cuts[k]:cuts[k + 1]], k % 2 == 1
        if not text:
            continue
        if is_content and start is None:
            start = len(ids)
        ids += tokenizer(text, add_special_tokens=False, split_special_tokens=is_content)["input_ids"]
        if is_content:
            end = len(ids)
    return PreparedPrompt(tuple(int(i) for i in ids), start, end)


def prepare_prompt(tokenizer: Any, messages: str | list[dict[str, str]]) -> PreparedPrompt:
    """Token ids and content span of one request (see the module docstring for the rules): the ids vLLM's OpenAI
    chat endpoint computes for the same ``messages`` (the chat template rendered to text, the text tokenised in one
    call with ``add_special_tokens=False``), except for content holding special-token text (the special-token rule).

    Args:
        tokenizer: the serving model's fast tokenizer (it must return ``offset_mapping``).
        messages: a plain string (one user turn) or OpenAI-style ``[{"role", "content"}, ...]``; a message may be
            empty (e.g. an empty system prompt) when another one has text; content is never stripped.

    Returns:
        A :class:`PreparedPrompt`: ``token_ids`` (ints, ``num_prompt_tokens`` long) and the content span in tokens.

    Raises:
        LenpredError: no messages, non-string role or content, only blank content, text that is not valid Unicode,
            or a template that rewrites the content.
    """
    messages = _check_messages(messages)
    rendered = _render(tokenizer, messages)
    chars = [r for r in _content_chars(rendered, messages) if r[0] < r[1]]
    enc = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = [int(i) for i in enc["input_ids"]], [tuple(o) for o in enc["offset_mapping"]]
    special = {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    if any(a < ce and cs < b for i, (a, b) in zip(ids, offsets) if i in special for cs, ce in chars):
        return _split_special(tokenizer, rendered, chars)  # typed control-token text: the special-token rule
    first, last = chars[0][0], chars[-1][1]
    start = next((k for k, (_, b) in enumerate(offsets) if b > first), len(ids))  # a straddling token is content
    end = sum(1 for a, _ in offsets if a < last)
    if start >= end:
        raise LenpredError("the tokenizer gives the messages' content no tokens (its normaliser drops every "
                           "character): give the prompt visible text")
    return PreparedPrompt(tuple(ids), start, end)


def chat_token_ids(tokenizer: Any, messages: str | list[dict[str, str]]) -> list[int]:
    """``prepare_prompt(tokenizer, messages).token_ids`` as a list: what every engine feeds the model."""
    return list(prepare_prompt(tokenizer, messages).token_ids)


def check_fits(num_prompt_tokens: int, max_new_tokens: int, context_window: int, what: str = "prompt") -> None:
    """The one length rule: a prompt plus the tokens it may generate must fit the model's context window.

    Raises:
        LenpredError: ``num_prompt_tokens == 0`` or ``max_new_tokens < 0``.
        ContextWindowError: ``num_prompt_tokens + max_new_tokens > context_window`` (the message names the numbers
            and the fix).
    """
    if num_prompt_tokens <= 0:
        raise LenpredError(f"empty {what}: it has no tokens; drop the record or give it text")
    if max_new_tokens < 0:
        raise LenpredError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if num_prompt_tokens + max_new_tokens > context_window:
        hint = "(a benchmark build skips such prompts: max_prompt_tokens)"
        if max_new_tokens == 0:
            raise ContextWindowError(f"{what} of {num_prompt_tokens} tokens exceeds the model's context window of "
                                     f"{context_window}: shorten it {hint}")
        raise ContextWindowError(f"{what} of {num_prompt_tokens} tokens + max_new_tokens {max_new_tokens} exceeds the "
                                 f"model's context window of {context_window}: shorten it, lower max_new_tokens, or "
                                 f"leave it out {hint}")


def prompt_text(messages: list[dict[str, str]]) -> str:
    """The user-visible prompt: the messages' contents joined by blank lines (what text-only proxies read)."""
    return "\n\n".join(m["content"] for m in messages)


def normalise_text(text: str) -> str:
    """Lower-cased, whitespace-collapsed text: two prompts are duplicates when these are equal."""
    return " ".join(text.lower().split())
