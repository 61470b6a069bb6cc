"""One prompt preparation: template, the engine's tokenisation, content span, special-token rule, bad text, limits."""

import itertools
import re

import pytest

from conftest import AWKWARD_PROMPTS, whitespace_bpe_tokenizer
from lenpred.errors import LenpredError
from lenpred.prompts import chat_token_ids, check_fits, prepare_prompt


def test_chat_template_applied_and_content_span(tiny_backbone):
    tok = tiny_backbone.tokenizer
    p = prepare_prompt(tok, [{"role": "user", "content": "hello world"}])
    # template: "<s> user hello world </s> <s> assistant "
    assert tok.convert_ids_to_tokens(list(p.token_ids)) == ["<s>", "user", "hello", "world", "</s>", "<s>", "assistant"]
    assert (p.content_start, p.content_end) == (2, 4)  # "hello world": the template's text on both sides is skipped
    assert chat_token_ids(tok, "hello world") == list(p.token_ids)  # a plain string is one user turn


def test_span_covers_a_custom_system_prompt(tiny_backbone):
    tok = tiny_backbone.tokenizer
    p = prepare_prompt(tok, [{"role": "system", "content": "please answer"}, {"role": "user", "content": "what is code"}])
    toks = tok.convert_ids_to_tokens(list(p.token_ids))
    # "<s> system please answer </s> <s> user what is code </s> <s> assistant"
    assert toks[p.content_start:p.content_end] == ["please", "answer", "</s>", "<s>", "user", "what", "is", "code"]


def test_base_model_without_template_joins_turns():
    class NoTemplate:
        chat_template = None
        bos_token = ""

        def __call__(self, text, add_special_tokens=True, split_special_tokens=False, return_offsets_mapping=False):
            words = list(re.finditer(r"\S+", text))
            return {"input_ids": [len(w[0]) for w in words], "offset_mapping": [w.span() for w in words]}

    p = prepare_prompt(NoTemplate(), [{"role": "user", "content": "ab cde"}])
    assert p.token_ids == (2, 3) and (p.content_start, p.content_end) == (0, 2)


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user", "content": "   "}], "empty prompt"),
    ([], "non-empty"),
    ([{"role": "user", "content": 5}], "string 'role' and 'content'"),
    ([{"role": "user", "content": "hi \ud83d there"}], "not valid Unicode.*surrogate"),
])
def test_bad_messages_get_one_line_errors(tiny_backbone, messages, match):
    with pytest.raises(LenpredError, match=match) as info:
        prepare_prompt(tiny_backbone.tokenizer, messages)
    assert "\n" not in str(info.value)


def test_check_fits_one_rule():
    check_fits(8180, 12, 8192)  # exactly the window: fine
    with pytest.raises(LenpredError, match="8188 tokens \\+ max_new_tokens 12 exceeds .* 8192"):
        check_fits(8188, 12, 8192)
    with pytest.raises(LenpredError, match="empty prompt"):
        check_fits(0, 12, 8192)


@pytest.mark.slow
def test_real_template_custom_system_prompt_and_typed_control_tokens():
    from lenpred.backbone import load_backbone

    tok = load_backbone().tokenizer
    # a custom short system prompt: the span starts at its content, not at a fixed 24-token offset
    p = prepare_prompt(tok, [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "What is the capital of France?"}])
    assert tok.decode(list(p.token_ids[p.content_start:p.content_end])) == \
        "Be brief.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
    # skipped: "<|im_start|>system\n" before, "<|im_end|>\n<|im_start|>assistant\n" after; 24 tokens in all, every
    # one of which the old fixed 24-token skip threw away
    assert p.content_start == 3 and p.num_prompt_tokens - p.content_end == 6 and p.num_prompt_tokens == 24
    # the default system prompt is template text: skipped
    d = prepare_prompt(tok, "What is the capital of France?")
    assert d.content_start == 24 and tok.decode(list(d.token_ids[d.content_start:d.content_end])) == \
        "What is the capital of France?"
    # typed control-token text stays ordinary text
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    q = prepare_prompt(tok, "<|im_end|> hi")
    content = q.token_ids[q.content_start:q.content_end]
    assert im_end not in content and tok.decode(list(content)) == "<|im_end|> hi"
    assert list(q.token_ids).count(im_end) == 2  # the template's own: end of system turn, end of user turn


# ================================================================ the engine's ids (issue #28 item 7)


def engine_token_ids(tok, messages) -> list[int]:
    """What vLLM 0.32's OpenAI chat endpoint feeds the model for ``messages`` (``vllm/renderers``: the HF template
    rendered with ``tokenize=False`` and ``add_generation_prompt=True``, then the string tokenised whole with the
    request's default ``add_special_tokens=False``)."""
    messages = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(rendered, add_special_tokens=False)["input_ids"]


def check_engine_ids_and_span(tok, messages):
    """``prepare_prompt``'s ids are the engine's, and its span starts at the token holding the first content
    character (a whitespace run straddling the template's "\\n" and the content counts as content) and ends with
    the token holding the last one."""
    p = prepare_prompt(tok, messages)
    assert list(p.token_ids) == engine_token_ids(tok, messages)
    messages = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
    rendered, pos, chars = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), 0, []
    for m in messages:
        pos = rendered.index(m["content"], pos) + len(m["content"])
        chars += [(pos - len(m["content"]), pos)] if m["content"] else []
    first, last = len(rendered[:chars[0][0]].encode()), len(rendered[:chars[-1][1]].encode())  # in bytes
    upto = list(itertools.accumulate((len(b) for b in token_bytes(tok, p.token_ids)), initial=0))  # bytes of k tokens
    assert upto[-1] == len(rendered.encode())
    assert upto[p.content_start] <= first < upto[p.content_start + 1]
    assert upto[p.content_end - 1] < last <= upto[p.content_end]


def token_bytes(tok, ids) -> list[bytes]:
    """The bytes each token of a byte-level BPE tokenizer stands for (a multi-byte character may span tokens)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    return [t.encode() if i in special else bytes(byte_of[c] for c in t)
            for i, t in zip(ids, tok.convert_ids_to_tokens(list(ids)))]


@pytest.mark.parametrize("name", list(AWKWARD_PROMPTS))
def test_prompt_ids_are_the_engines_for_awkward_prompts(name):
    tok = whitespace_bpe_tokenizer()
    check_engine_ids_and_span(tok, AWKWARD_PROMPTS[name])


def test_leading_spaces_count_the_engines_tokens():
    """The bug: the template's "\\n" and the content's leading spaces are one token in the engine, two when the
    content was tokenised apart from the template."""
    tok = whitespace_bpe_tokenizer()
    p = prepare_prompt(tok, "    def f")
    toks = tok.convert_ids_to_tokens(list(p.token_ids))
    assert toks == ["<|im_start|>", "u", "s", "e", "r", "ĊĠĠĠ", "Ġ", "d", "e", "f", "Ġ", "f", "<|im_end|>", "Ċ",
                    "<|im_start|>", "a", "s", "s", "i", "s", "t", "a", "n", "t", "Ċ"]
    assert (p.content_start, p.content_end) == (5, 12)  # the straddling "\n   " is content


def test_typed_control_text_is_the_one_difference_from_the_engine():
    """The special-token rule keeps a typed <|im_end|> as characters; vLLM's chat endpoint makes it the control
    token, so these prompts alone count other tokens than the engine does."""
    tok = whitespace_bpe_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    p = prepare_prompt(tok, "a <|im_end|> b")
    assert im_end not in p.token_ids[p.content_start:p.content_end]
    assert list(p.token_ids) != engine_token_ids(tok, "a <|im_end|> b")
    assert engine_token_ids(tok, "a <|im_end|> b").count(im_end) == 2


def test_a_blank_turn_next_to_text_is_kept_and_an_all_blank_prompt_refused():
    tok = whitespace_bpe_tokenizer()
    p = prepare_prompt(tok, [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}])
    assert tok.decode(list(p.token_ids)) == "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" \
                                            "<|im_start|>assistant\n"
    assert tok.decode(list(p.token_ids[p.content_start:p.content_end])) == "hi"  # the empty turn holds no content
    with pytest.raises(LenpredError, match="empty prompt"):
        prepare_prompt(tok, [{"role": "system", "content": ""}, {"role": "user", "content": " \n"}])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(AWKWARD_PROMPTS))
def test_real_tokenizer_prompt_ids_are_the_engines(name, real_tokenizer):
    check_engine_ids_and_span(real_tokenizer, AWKWARD_PROMPTS[name])


@pytest.fixture(scope="module")
def real_tokenizer():
    from transformers import AutoTokenizer

    from lenpred.backbone import resolve_model

    return AutoTokenizer.from_pretrained(str(resolve_model()[0]))
