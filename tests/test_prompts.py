"""One prompt preparation: template, content span, special-token rule, bad text, limits."""

import pytest

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

        def __call__(self, text, add_special_tokens=True, split_special_tokens=False):
            return {"input_ids": [len(w) for w in text.split()]}

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
