"""Shared fixtures: a tiny random Llama with a word-level tokenizer and a chat template, saved to disk.

Everything is built in memory (no hub access); the real default model appears only in tests marked
``slow``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORDS = ("hello world what is the sum of two and three write a long poem about sea please answer "
         "step by think solve problem python function code tell me story short").split()
CHAT_TEMPLATE = ("{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
                 "{% if add_generation_prompt %}<s> assistant {% endif %}")


def make_tiny_model_dir(path: Path, seed: int = 0) -> Path:
    """Save a 2-layer random Llama (hidden 32, 4 heads, 2 KV heads) and its tokenizer to ``path``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", "<s>", "</s>", "user", "assistant", "system", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=2, eos_token_id=3, pad_token_id=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def make_tiny_encoder_dir(path: Path, seed: int = 0) -> Path:
    """Save a random BERT (hidden 32, 2 layers, 2 heads, 64 positions) and a WordPiece tokenizer to ``path``
    (a stand-in for the packaged MiniLM proxy encoder)."""
    import torch
    from transformers import BertConfig, BertModel

    path.mkdir(parents=True, exist_ok=True)
    # a vocab.txt + tokenizer_config.json is what AutoTokenizer needs for WordPiece (any transformers version)
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                            "do_lower_case": True, "model_max_length": 64}))
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    BertModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matrices: one intra-op thread is far faster than two on a busy 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory) -> Path:
    return make_tiny_encoder_dir(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_backbone(tiny_model_dir):
    from lenpred.backbone import load_backbone

    return load_backbone(str(tiny_model_dir))


def make_tiny_data_dir(path: Path) -> Path:
    """A data directory with four small sources in the real files' formats."""
    rows = {
        "vicuna_bench/question.jsonl": [{"question_id": i, "category": "c", "turns": [f"write a poem about sea {i}"]}
                                        for i in range(4)],
        "gsm8k/test.jsonl": [{"question": f"what is the sum of two and three {i}", "answer": "5"} for i in range(4)],
        "mbpp/mbpp.jsonl": [{"text": f"write a python function {i}", "test_list": ["assert f() == 1"], "task_id": i}
                            for i in range(4)],
        "oasst/en_100_text.jsonl": [f"tell me a short story {i}" for i in range(4)],
    }
    for rel, records in rows.items():
        p = path / rel
        p.parent.mkdir(parents=True)
        p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture()
def tiny_data_dir(tmp_path) -> Path:
    return make_tiny_data_dir(tmp_path)
