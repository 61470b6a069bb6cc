"""One prompt preparation for every path (benchmark builder, both sampling engines, signal extraction,
evaluation and prediction): chat template, the special-token rule, the user-content span, and limits.

Rules (the same everywhere, so a fix in one place reaches all of them):

* **Template**: the tokenizer's chat template with ``add_generation_prompt=True``; a base model without
  one (e.g. gemma-3-270m) gets BOS + the turns joined by blank lines + a blank line.
* **Special-token rule**: text a user typed never becomes a control token. The rendered prompt is cut
  into the template's own text (tokenised normally, so ``<|im_start|>`` there *is* the control token)
  and each message's content (tokenised with ``split_special_tokens=True``, so a typed ``<|im_end|>``
  is the ordinary characters ``<``, ``|``, ``im``, ...). For content without special-token text the
  ids equal those of tokenising the whole rendered string (checked on all 1,520 ForeLen prompts).
* **Content span**: ``[content_start, content_end)`` are the token positions from the first message's
  content to the end of the last message's content, for *this* request: the template's fixed text
  before it (default system prompt, role header) and after it (end of turn, assistant header) is the
  same for every request, so poolers skip it (a custom system prompt is user content and is kept).
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
        if not m["content"].strip():
            raise LenpredError("empty prompt: every message needs non-blank 'content'; drop or fill the record")
        try:
            m["content"].encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LenpredError(f"message content is not valid Unicode text ({exc.reason} at character {exc.start}, "
                               "e.g. a lone surrogate escape): fix or drop the record") from None
    return messages


def _segments(tokenizer: Any, messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
    """The rendered prompt cut into ``(text, is_content)`` pieces, in order."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        rendered = (tokenizer.bos_token or "") + "\n\n".join(m["content"] for m in messages) + "\n\n"
    pieces, pos = [], 0
    for m in messages:
        at = rendered.find(m["content"], pos)
        if at < 0:
            raise LenpredError("the chat template changes the message text (e.g. strips it), so the user's content "
                               "cannot be located in the prompt; strip the messages before predicting")
        pieces += [(rendered[pos:at], False), (m["content"], True)]
        pos = at + len(m["content"])
    return [p for p in pieces + [(rendered[pos:], False)] if p[0]]


def prepare_prompt(tokenizer: Any, messages: str | list[dict[str, str]]) -> PreparedPrompt:
    """Token ids and content span of one request (see the module docstring for the rules).

    Args:
        tokenizer: the serving model's (fast) tokenizer.
        messages: a plain string (one user turn) or OpenAI-style ``[{"role", "content"}, ...]``.

    Raises:
        LenpredError: no messages, blank or non-string content, text that is not valid Unicode, or a template
            that rewrites the content.
    """
    messages = _check_messages(messages)
    ids: list[int] = []
    start = end = None
    for text, is_content in _segments(tokenizer, messages):
        if is_content and start is None:
            start = len(ids)
        ids += tokenizer(text, add_special_tokens=False, split_special_tokens=is_content)["input_ids"]
        if is_content:
            end = len(ids)
    return PreparedPrompt(tuple(int(i) for i in ids), start, end)


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
        if max_new_tokens == 0:
            raise ContextWindowError(f"{what} of {num_prompt_tokens} tokens exceeds the model's context window of "
                                     f"{context_window}: shorten it (bench: max_prompt_tokens)")
        raise ContextWindowError(f"{what} of {num_prompt_tokens} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
                           f"context window of {context_window}: shorten it, lower max_new_tokens, or leave it out "
                           "(bench: max_prompt_tokens)")


def prompt_text(messages: list[dict[str, str]]) -> str:
    """The user-visible prompt: the messages' contents joined by blank lines (what text-only proxies read)."""
    return "\n\n".join(m["content"] for m in messages)


def normalise_text(text: str) -> str:
    """Lower-cased, whitespace-collapsed text: two prompts are duplicates when these are equal."""
    return " ".join(text.lower().split())
