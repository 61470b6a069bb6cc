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


BYTE_LEVEL_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Ids 256, 257, 258 after the 256 byte symbols of :func:`byte_level_tokenizer`."""
CHATML_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_level_tokenizer(chat_template: bool):
    """A byte-level BPE tokenizer without merges: byte ``b`` is token ``b``, then :data:`BYTE_LEVEL_SPECIALS`
    (BOS = pad = ``<|endoftext|>``, EOS = ``<|im_end|>``); what every model family's tokenizer class in transformers
    5 reads back unchanged (Qwen2's rebuilds a word-level vocabulary wrongly)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {bytes_to_unicode()[b]: b for b in range(256)} | {t: 256 + i for i, t in enumerate(BYTE_LEVEL_SPECIALS)}
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"])
    if chat_template:
        fast.chat_template = CHATML_TEMPLATE
    return fast


ARCHITECTURES = ("qwen2", "gemma3", "gemma2")
"""Tiny random models of other families than the default Llama (:func:`make_tiny_arch_dir`)."""


def whitespace_bpe_tokenizer():
    """:func:`byte_level_tokenizer` (with the chat template) plus GPT-2-style merges of whitespace runs: ``"\\n"``
    followed by up to three spaces, and runs of up to three spaces, are one token each. BPE merges inside a
    pre-token, and the byte-level pre-tokenizer keeps ``"\\n   "`` of ``"\\n    def"`` together, so tokenising a
    rendered prompt whole or in pieces cut at the content gives different ids, as SmolLM2's tokenizer does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    merges = [("Ċ", "Ġ"), ("ĊĠ", "Ġ"), ("ĊĠĠ", "Ġ"), ("Ġ", "Ġ"), ("ĠĠ", "Ġ")]
    vocab = {bytes_to_unicode()[b]: b for b in range(256)}
    vocab |= {a + b: 256 + i for i, (a, b) in enumerate(merges)}
    vocab |= {t: len(vocab) + i for i, t in enumerate(BYTE_LEVEL_SPECIALS)}
    tok = Tokenizer(models.BPE(vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML_TEMPLATE
    return fast


AWKWARD_PROMPTS = {
    "four leading spaces": "    def area(r):\n        return 3.14 * r * r\nWhat does this function do?",
    "leading newlines and tab": "\n\n\tIndented after two blank lines: explain tabs.",
    "trailing whitespace": "Explain recursion in one paragraph.   \n\n",
    "empty system turn": [{"role": "system", "content": ""}, {"role": "user", "content": "Name three rivers."}],
    "blank system turn, padded user": [{"role": "system", "content": "   "},
                                       {"role": "user", "content": "  Name three rivers.  "}],
    "multi-turn whitespace": [{"role": "user", "content": "  hi"}, {"role": "assistant", "content": " hello \n"},
                              {"role": "user", "content": "\n    and now a poem?"}],
    "combining marks": "Cafe\u0301 na\u0308ive re\u0301sume\u0301: which accents are these?",
    "emoji with joiners": "\U0001F468\u200d\U0001F469\u200d\U0001F467 family, \U0001F44D\U0001F3FD and \u2764\ufe0f: "
                          "describe them",
    "non-breaking and wide spaces": "\u00a0\u00a0Non-breaking\u00a0spaces\u2003em space\u3000ideographic space",
    "CJK": "请用中文回答：天空为什么是蓝色的？",
    "right-to-left": "\u202bمرحبا بالعالم\u202c and \u05e9\u05dc\u05d5\u05dd: translate both",
    "BOM and zero-width space": "\ufeffA byte-order mark first, then zero\u200bwidth\u200bspaces.",
}
"""Prompts whose tokens the engine and ``lenpred predict`` once counted differently (issue #28 item 7) or that
sit where the two could differ: whitespace at the content's edges, empty system turns, unusual Unicode."""


def make_tiny_arch_dir(path: Path, arch: str, seed: int = 0) -> Path:
    """Save a 2-layer random model of another family (hidden 32, 4 heads, 2 KV heads, head_dim 8, 256 positions) and
    a :func:`byte_level_tokenizer` to ``path``:

    * ``qwen2``: biases in q/k/v, untied output head, the chat template;
    * ``gemma3``: no chat template (the base-model prompt rule), a sliding window of 4 tokens on layer 0 (full
      attention on layer 1), tied and sqrt(d)-scaled embeddings, q/k norms;
    * ``gemma2``: soft-capping of the attention logits (10) and of the final logits (5, strong enough to change the
      entropy), sliding window 4, the chat template.
    """
    import torch
    from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, Qwen2Config,
                              Qwen2ForCausalLM)

    fast = byte_level_tokenizer(chat_template=arch != "gemma3")
    common = dict(vocab_size=256 + len(BYTE_LEVEL_SPECIALS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=256,
                  eos_token_id=258, pad_token_id=256)
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False))
    elif arch == "gemma3":
        model = Gemma3ForCausalLM(Gemma3TextConfig(**common, head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
                                                   layer_types=["sliding_attention", "full_attention"]))
    elif arch == "gemma2":
        model = Gemma2ForCausalLM(Gemma2Config(**common, head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
                                               attn_logit_softcapping=10.0, final_logit_softcapping=5.0))
    else:
        raise ValueError(f"unknown tiny architecture {arch}; valid: {', '.join(ARCHITECTURES)}")
    with torch.no_grad():  # random init is near zero: scale up so entropy and attention are far from uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def gguf_tensor_names(num_layers: int) -> dict[str, str]:
    """HF Llama weight names -> llama.cpp's GGUF tensor names."""
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    for i in range(num_layers):
        for hf, gg in (("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
                       ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
                       ("post_attention_layernorm", "ffn_norm"), ("mlp.gate_proj", "ffn_gate"),
                       ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")):
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    return names


def write_tiny_gguf(path: Path, seed: int = 0):
    """Write a 2-layer random Llama as an F32 GGUF file with a byte-level BPE vocabulary (the 256 byte symbols, no
    merges, then three control tokens), the way llama.cpp's converter lays it out (q / k rows permuted for its rope
    layout), the vocabulary of :func:`byte_level_tokenizer`. Returns ``(path, model)``: the HF model whose weights the file holds, to compare against.
    """
    import gguf
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = [bytes_to_unicode()[b] for b in range(256)] + list(BYTE_LEVEL_SPECIALS)
    n_head, n_kv, d = 4, 2, 32
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=d, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=n_head, num_key_value_heads=n_kv, max_position_embeddings=256,
                         bos_token_id=256, eos_token_id=258, tie_word_embeddings=False, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(config).eval()

    def permute(w, heads):  # llama.cpp convert_hf_to_gguf.LlamaModel.permute
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(d)
    writer.add_block_count(2)
    writer.add_feed_forward_length(64)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_dimension_count(d // n_head)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"] if getattr(config, "rope_parameters", None)
                              else config.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * len(BYTE_LEVEL_SPECIALS))
    writer.add_token_scores([0.0] * len(tokens))  # no merges: transformers derives none from single bytes
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(258)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    for hf, gg in gguf_tensor_names(2).items():
        w = sd[hf]
        if hf.endswith("q_proj.weight"):
            w = permute(w, n_head)
        elif hf.endswith("k_proj.weight"):
            w = permute(w, n_kv)
        writer.add_tensor(gg, np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, model


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


TINY_PROMPTS = ["hello world", "write a long poem about sea please", [{"role": "user", "content": "what is two"},
                                                                  {"role": "assistant", "content": "sum"},
                                                                  {"role": "user", "content": "solve problem python"}]]


def attach_full_prefill(backbone, requests: list, layer: int) -> list:
    """Set each request's signals from the full prefill at ``layer`` (entropy included, no attention)."""
    from lenpred.signals import extract_signals

    for r, s in zip(requests, extract_signals(backbone, [r.token_ids for r in requests], (layer,), semantic=False)):
        r.signals = s
    return requests


def fit_tiny_predictor(backbone, method: str, layer: int):
    """A :class:`lenpred.pipeline.LengthPredictor` on the tiny model, its head fitted (3 epochs, 4 bins) on the full path's features
    of TINY_PROMPTS; margin 1.5 tokens (its config_ made up: no benchmark, prompt rule "t")."""
    import numpy as np

    from lenpred.pipeline import LengthPredictor
    from lenpred.predictors import make_predictor

    from lenpred.predictor_config import PredictorConfig

    lp = LengthPredictor(method, "tiny", layers=(layer,))
    lp.backbone_, lp.margin_, lp.card_ = backbone, 1.5, {}
    lp.config_ = PredictorConfig(method=method, params={}, chosen_on_validation={}, model_id="tiny",
                                 model_revision=backbone.revision, layers=[layer], semantic=False, template_rule="t",
                                 coverage=lp.coverage, interval_margin=1.5, training_benchmark=None)
    lp.predictor_ = make_predictor(method, layer=layer, head={"epochs": 3, "num_bins": 4})
    train = lp.prepare(TINY_PROMPTS * 4, 16)
    attach_full_prefill(backbone, train, layer)
    lp.predictor_.fit(train, np.arange(len(train), dtype=np.float64) + 1.0)
    return lp


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


@pytest.fixture(scope="session")
def tiny_bench(tiny_model_dir, tmp_path_factory):
    """A `tiny`-preset benchmark sampled from the tiny Llama with transformers: ``(bench dir, data dir, root)``."""
    from typer.testing import CliRunner

    from lenpred.cli import app

    root = tmp_path_factory.mktemp("pipeline")
    data = make_tiny_data_dir(root / "data")
    r = CliRunner().invoke(app, ["bench", "build", "--out", str(root / "bench"), "--preset", "tiny", "--model",
                            str(tiny_model_dir), "--engine", "transformers", "--data-dir", str(data), "--seed", "5"])
    assert r.exit_code == 0, r.output
    return root / "bench", data, root


def free_port() -> int:
    """A TCP port free on the loopback address right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackServer:
    """An ASGI app under uvicorn in a daemon thread on a free loopback port; ``with`` gives its base URL."""

    def __init__(self, app):
        import threading

        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                   lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        import time

        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return f"http://127.0.0.1:{self.port}"
            time.sleep(0.01)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
