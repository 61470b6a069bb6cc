import math

import pytest
import torch

from lenpred.errors import LenpredError
from lenpred.signals import (attention_received_from_attention, extract_signals, left_pad, semantic_score,
                             token_entropy_from_logits)


def test_token_entropy_hand_values():
    # uniform over 4 -> ln 4; one-hot-ish (logit gap 1000) -> 0; [0, ln 3] -> p = [1/4, 3/4]
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1000.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -1e9, -1e9]])
    h = token_entropy_from_logits(logits)
    expected_third = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623
    assert h.tolist() == pytest.approx([math.log(4), 0.0, expected_third], abs=1e-5)


def test_attention_received_hand_values_with_left_padding():
    # one head, row b=0 has one pad token in front (n=3 padded, 2 real tokens)
    A = torch.zeros(1, 1, 3, 3)
    A[0, 0, 0] = torch.tensor([1.0, 0.0, 0.0])   # pad query: must be ignored
    A[0, 0, 1] = torch.tensor([0.0, 1.0, 0.0])   # token 1 attends to itself
    A[0, 0, 2] = torch.tensor([0.0, 0.6, 0.4])   # token 2 attends 0.6 to token 1, 0.4 to itself
    received = attention_received_from_attention(A, torch.tensor([[0, 1, 1]]))
    assert received[0].tolist() == pytest.approx([0.0, 1.6, 0.4])  # pad position -> 0
    real = received[0, 1:]
    # the paper's S_j = (1/n) sum_i A_ij with n = 2; the causal variant divides by n - j = 2, 1
    assert semantic_score(real, "n").tolist() == pytest.approx([0.8, 0.2])
    assert semantic_score(real, "causal").tolist() == pytest.approx([0.8, 0.4])
    with pytest.raises(LenpredError, match="valid: n, causal"):
        semantic_score(real, "sqrt")


def test_attention_received_averages_heads():
    A = torch.zeros(1, 2, 2, 2)
    A[0, 0] = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    A[0, 1] = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # head mean: [[1,0],[0.5,0.5]] -> column sums 1.5, 0.5
    assert attention_received_from_attention(A, torch.ones(1, 2))[0].tolist() == pytest.approx([1.5, 0.5])


def test_last_token_gets_little_weight_under_the_paper_divisor():
    # every query attends uniformly to what it can see: the n - j divisor gives every token the same score
    # ... except that the last token's score is a single self-attention value (1/n), while S_j = received / n
    # grows for early tokens: the last token is the *least* semantic one, not the most
    n = 6
    A = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]
    received = attention_received_from_attention(A[None, None], torch.ones(1, n))[0]
    assert torch.argmax(semantic_score(received, "n")) == 0 and torch.argmin(semantic_score(received, "n")) == n - 1
    causal = semantic_score(received, "causal")
    assert causal[-1] == pytest.approx(1 / n) and causal[0] == pytest.approx(float(received[0]) / n)


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=1)
    assert ids.tolist() == [[5, 6, 7], [1, 1, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_signals_match_full_eager_reference(tiny_backbone):
    from transformers import AutoModelForCausalLM

    ids = [2, 10, 11, 12, 13, 14, 3]
    s = extract_signals(tiny_backbone, [ids], layers=(0, 1, 2))[0]
    ref = AutoModelForCausalLM.from_pretrained(tiny_backbone.model_dir, attn_implementation="eager")
    with torch.no_grad():
        out = ref(torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
    assert s.hidden_states.shape == (3, len(ids), 32)
    for k in range(3):
        torch.testing.assert_close(s.hidden_states[k], out.hidden_states[k][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s.token_entropy, token_entropy_from_logits(out.logits[0]), atol=1e-5, rtol=1e-5)
    A = out.attentions[-1][0].mean(0)  # (n, n)
    n = len(ids)
    torch.testing.assert_close(s.attention_received, A.sum(0), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(s.semantic_score("n"), A.sum(0) / n, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(s.semantic_score("causal"), A.sum(0) / torch.arange(n, 0, -1), atol=1e-6, rtol=1e-5)
    assert tiny_backbone.model.config._attn_implementation == "sdpa"  # restored after extraction


def test_signals_do_not_depend_on_batch_mates(tiny_backbone):
    prompts = [[2, 10, 11, 3], [2, 12, 13, 14, 15, 16, 17, 3], [2, 18, 3]]
    batch = extract_signals(tiny_backbone, prompts, layers=(1, 2))
    for p, b in zip(prompts, batch):
        alone = extract_signals(tiny_backbone, [p], layers=(1, 2))[0]
        assert b.hidden_states.shape[1] == len(p)
        torch.testing.assert_close(b.hidden_states, alone.hidden_states, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.token_entropy, alone.token_entropy, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.attention_received, alone.attention_received, atol=1e-4, rtol=1e-4)


def test_bad_inputs(tiny_backbone):
    with pytest.raises(LenpredError, match="empty prompt"):
        extract_signals(tiny_backbone, [[]], layers=(1,))
    with pytest.raises(LenpredError, match="context window"):
        extract_signals(tiny_backbone, [[2] * 65], layers=(1,))
    with pytest.raises(LenpredError, match="layers must be in"):
        extract_signals(tiny_backbone, [[2, 3]], layers=(5,))
    s = extract_signals(tiny_backbone, [[2, 3]], layers=(-1,), semantic=False)[0]
    assert s.attention_received is None and s.semantic_score() is None and s.layers == (2,)
    with pytest.raises(LenpredError, match="not extracted"):
        s.layer(1)


@pytest.mark.slow
def test_real_model_batch_independence_and_overhead():
    from lenpred.backbone import load_backbone
    from lenpred.prompts import chat_token_ids
    from lenpred.inputs.cache import measure_overhead

    bb = load_backbone()
    texts = ["Hi", "Write a long poem about the sea, the sky and the birds that fly over both.", "What is 2+2?"]
    prompts = [chat_token_ids(bb.tokenizer, [{"role": "user", "content": t}]) for t in texts]
    batch = extract_signals(bb, prompts, layers=(15, -1))
    for p, b in zip(prompts, batch):
        alone = extract_signals(bb, [p], layers=(15, -1))[0]
        torch.testing.assert_close(b.hidden_states, alone.hidden_states, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.token_entropy, alone.token_entropy, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.attention_received, alone.attention_received, atol=1e-4, rtol=1e-4)
    # entropies are in nats, between 0 and ln(vocab)
    assert all(0 <= float(s.token_entropy.min()) and float(s.token_entropy.max()) <= math.log(49152) for s in batch)
    o = measure_overhead(bb, prompts, (15, -1), repeats=1)
    assert o["num_prompt_tokens"] == sum(map(len, prompts)) and o["ratio"] > 0


def test_span_cuts_after_scoring_the_whole_prompt():
    from lenpred.signals import PromptSignals

    received = torch.tensor([3.0, 1.0, 1.0, 0.5, 0.25, 0.25])  # sums to n = 6
    s = PromptSignals(torch.arange(12.0).reshape(1, 6, 2), torch.arange(6.0), received, (3,))
    d = s.span(4, 6)
    assert d.token_entropy.tolist() == [4.0, 5.0]
    assert d.semantic_score.tolist() == pytest.approx([0.25 / 6, 0.25 / 6])  # divided by the whole prompt's n
    assert s.span(4, 6, "causal").semantic_score.tolist() == pytest.approx([0.25 / 2, 0.25 / 1])
    assert d.layer(3).tolist() == [[8.0, 9.0], [10.0, 11.0]]
    assert s.span(10, 12).token_entropy.tolist() == [5.0]  # never empty: falls back to the last token
    assert s.span(3, 3).token_entropy.tolist() == [5.0]
