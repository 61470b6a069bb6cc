"""Soft-label distribution head (EGTP / ESTP / PLP): length bins, soft labels, MLP, combined loss.

Sources: Xie et al., "Predicting LLM Output Length via Entropy-Guided Representations" (ICLR 2026),
Sec. "soft-label distribution": K bins, soft label ``q_j ∝ exp(-|j - b| / tau)`` around the true bin
``b``, head ``Linear(d, d/2) -> LayerNorm -> ReLU -> Dropout(0.1) -> Linear(d/2, K)``, prediction
``y_hat = sum_j softmax(logits)_j c_j`` and loss ``lambda * CE(q, p) + (1 - lambda) * MSE``.

Choices the paper leaves open (documented here):

* Bin edges are **equal-mass** quantiles of the training lengths (duplicate edges — e.g. many
  responses capped at the same ``max_new_tokens`` — are merged, so K can come out smaller), and the
  bin centre ``c_j`` is the mean training length inside bin ``j``.
* The MSE term is on lengths divided by the training-length standard deviation, so with
  ``lambda = 0.95`` neither term swamps the other.
* Inputs are standardised with the training mean / std of every feature (hidden states carry a
  few "massive activation" dimensions in the thousands).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from lenpred.errors import LenpredError


def length_bin_edges(lengths: np.ndarray, num_bins: int = 20) -> np.ndarray:
    """Equal-mass bin edges from training lengths: ``(K + 1,)`` float64, strictly increasing.

    The first edge is ``-inf`` and the last ``+inf`` so every length falls in a bin; interior edges are
    the ``j / K`` quantiles, de-duplicated (so ``K`` may shrink when lengths tie).

    Raises:
        LenpredError: fewer than 2 lengths, or ``num_bins < 2``.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    if lengths.size < 2 or num_bins < 2:
        raise LenpredError(f"need >= 2 training lengths and >= 2 bins, got {lengths.size} and {num_bins}")
    inner = np.unique(np.quantile(lengths, np.arange(1, num_bins) / num_bins))
    return np.concatenate([[-np.inf], inner, [np.inf]])


def assign_bins(lengths: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index of each length, ``(n,)`` int64 in ``0..K-1``; bin ``j`` is ``[edges[j], edges[j+1])``."""
    return np.searchsorted(edges, np.asarray(lengths, dtype=np.float64), side="right") - 1


def bin_centres(lengths: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Mean training length in each bin, ``(K,)`` float64 (empty bins take the mid of their finite edges)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    bins = assign_bins(lengths, edges)
    centres = np.empty(len(edges) - 1)
    for j in range(len(centres)):
        inside = lengths[bins == j]
        lo, hi = max(edges[j], lengths.min()), min(edges[j + 1], lengths.max())
        centres[j] = inside.mean() if inside.size else (lo + hi) / 2
    return centres


def soft_labels(bins: torch.Tensor, num_bins: int, tau: float = 1.0) -> torch.Tensor:
    """Soft labels ``q_j ∝ exp(-|j - b| / tau)``: ``(n,)`` int64 -> ``(n, K)`` float32 rows summing to 1."""
    j = torch.arange(num_bins, dtype=torch.float32)
    logits = -(j[None, :] - bins[:, None].float()).abs() / tau
    return torch.softmax(logits, dim=1)


class DistributionHead(nn.Module):
    """``Linear(d, d/2) -> LayerNorm -> ReLU -> Dropout(0.1) -> Linear(d/2, K)``: ``(B, d)`` -> ``(B, K)`` logits."""

    def __init__(self, in_dim: int, num_bins: int, dropout: float = 0.1):
        super().__init__()
        hidden = max(in_dim // 2, 1)
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.LayerNorm(hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, num_bins))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def soft_label_loss(logits: torch.Tensor, q: torch.Tensor, y: torch.Tensor, centres: torch.Tensor,
                    length_scale: float, lam: float = 0.95, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``lam * CE(q, softmax(logits)) + (1 - lam) * ((y_hat - y) / length_scale)^2``, averaged over rows, a scalar.

    ``y_hat = softmax(logits) @ centres`` in tokens; ``y`` ``(B,)`` true lengths in tokens; ``weights`` ``(B,)``
    (optional) makes it a weighted mean over rows.
    """
    log_p = torch.log_softmax(logits, dim=1)
    ce = -(q * log_p).sum(dim=1)
    y_hat = log_p.exp() @ centres
    mse = ((y_hat - y) / length_scale) ** 2
    per_row = lam * ce + (1 - lam) * mse
    return per_row.mean() if weights is None else (per_row * weights).sum() / weights.sum()


@dataclass
class HeadConfig:
    """Hyper-parameters of the soft-label head.

    Attributes:
        num_bins: K length bins (20 in EGTP).
        tau: soft-label temperature in bins (1.0: a neighbour bin gets e^-1 of the true bin's mass).
        lam: CE weight in the loss (0.95 in EGTP); the rest goes to the scaled MSE.
        lr, weight_decay, epochs, batch_size: AdamW training schedule; small data, so many epochs.
        dropout: dropout between the layers (0.1 in EGTP).
    """

    num_bins: int = 20
    tau: float = 1.0
    lam: float = 0.95
    lr: float = 1e-3
    weight_decay: float = 1e-2
    epochs: int = 150
    batch_size: int = 64
    dropout: float = 0.1

    def __post_init__(self):
        if not 0 <= self.lam <= 1 or self.tau <= 0 or self.num_bins < 2 or self.epochs < 1:
            raise LenpredError("HeadConfig needs 0 <= lam <= 1, tau > 0, num_bins >= 2, epochs >= 1")


class SoftLabelRegressor:
    """Estimator: pooled features ``(n, d)`` float -> predicted output length ``(n,)`` in tokens.

    scikit-learn style: ``__init__`` stores hyper-parameters, ``fit`` learns ``edges_``, ``centres_``,
    ``mean_``, ``std_``, ``length_scale_`` and ``module_`` and returns ``self``; ``seed`` fixes the
    initialisation and batch order.
    """

    def __init__(self, config: HeadConfig | None = None, seed: int = 0):
        self.config = config or HeadConfig()
        self.seed = seed

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> "SoftLabelRegressor":
        """Train on features ``X`` ``(n, d)`` and lengths ``y`` ``(n,)`` (tokens).

        ``groups`` ``(n,)`` (optional): rows with the same group id are samples of one prompt and share their
        features. They are trained as one row with the mean soft label, the mean length and a weight equal to
        the number of samples — the same objective up to a constant (CE is linear in ``q``, and
        ``mean_s (y_hat - y_s)^2 = (y_hat - mean_s y_s)^2 + var_s y``) in fewer steps.

        Raises:
            LenpredError: shapes disagree or there are fewer than 2 samples.
        """
        X, y = np.asarray(X, dtype=np.float32), np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or y.shape != (X.shape[0],) or (groups is not None and len(groups) != len(y)):
            raise LenpredError(f"fit needs X (n, d), y (n,) and groups (n,), got {X.shape}, {y.shape} and "
                               f"{None if groups is None else np.shape(groups)}")
        cfg = self.config
        gen = torch.Generator().manual_seed(self.seed)
        torch.manual_seed(self.seed)  # nn.Linear init draws from the global generator
        self.edges_ = length_bin_edges(y, cfg.num_bins)
        self.centres_ = bin_centres(y, self.edges_)
        self.mean_, self.std_ = X.mean(0), X.std(0) + 1e-6
        self.length_scale_ = float(y.std() + 1e-6)
        K = len(self.centres_)
        self.module_ = DistributionHead(X.shape[1], K, cfg.dropout)
        q = soft_labels(torch.from_numpy(assign_bins(y, self.edges_)), K, cfg.tau)
        _, first, inverse = np.unique(np.arange(len(y)) if groups is None else np.asarray(groups),
                                      return_index=True, return_inverse=True)
        counts = np.bincount(inverse)
        Xt = torch.from_numpy((X[first] - self.mean_) / self.std_)
        yt = torch.from_numpy(np.bincount(inverse, weights=y) / counts).float()
        q = torch.zeros(len(first), K).index_add_(0, torch.from_numpy(inverse), q) / torch.from_numpy(counts)[:, None]
        weights = torch.from_numpy(counts).float()
        centres = torch.from_numpy(self.centres_).float()
        opt = torch.optim.AdamW(self.module_.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.module_.train()
        for _ in range(cfg.epochs):
            order = torch.randperm(len(Xt), generator=gen)
            for s in range(0, len(Xt), cfg.batch_size):
                idx = order[s:s + cfg.batch_size]
                loss = soft_label_loss(self.module_(Xt[idx]), q[idx], yt[idx], centres, self.length_scale_, cfg.lam,
                                       weights[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        self.module_.eval()
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Bin probabilities ``(n, K)`` float64."""
        if not hasattr(self, "module_"):
            raise LenpredError("predict called before fit (or load)")
        Xt = torch.from_numpy((np.asarray(X, dtype=np.float32) - self.mean_) / self.std_)
        with torch.no_grad():
            return torch.softmax(self.module_(Xt), dim=1).double().numpy()

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Expected length ``sum_j p_j c_j`` in tokens, ``(n,)`` float64."""
        return self.predict_proba(X) @ self.centres_

    def state(self) -> dict:
        """Everything needed to rebuild the fitted head (tensors + JSON-able config)."""
        return {"config": asdict(self.config), "seed": self.seed, "edges": self.edges_, "centres": self.centres_,
                "mean": self.mean_, "std": self.std_, "length_scale": self.length_scale_,
                "module": {k: v.clone() for k, v in self.module_.state_dict().items()}}

    @classmethod
    def from_state(cls, state: dict) -> "SoftLabelRegressor":
        head = cls(HeadConfig(**state["config"]), state["seed"])
        head.edges_, head.centres_ = np.asarray(state["edges"]), np.asarray(state["centres"])
        head.mean_, head.std_ = np.asarray(state["mean"], np.float32), np.asarray(state["std"], np.float32)
        head.length_scale_ = float(state["length_scale"])
        head.module_ = DistributionHead(len(head.mean_), len(head.centres_), head.config.dropout)
        head.module_.load_state_dict(state["module"])
        head.module_.eval()
        return head
