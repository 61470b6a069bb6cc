"""Soft-label distribution head (EGTP / ESTP / PLP): length bins, soft labels, MLP, combined loss.

Sources: Xie et al., "Predicting LLM Output Length via Entropy-Guided Representations" (ICLR 2026),
Sec. "soft-label distribution": K bins, soft label ``q_j ∝ exp(-|j - b| / tau)`` around the true bin
``b``, head ``Linear(d, d/2) -> LayerNorm -> ReLU -> Dropout(0.1) -> Linear(d/2, K)``, prediction
``y_hat = sum_j softmax(logits)_j c_j`` and loss ``lambda * CE(q, p) + (1 - lambda) * MSE``.

Choices the paper leaves open (documented here):

* Bin edges (:func:`length_bin_edges`) reach the **largest** training length, so no head has a ceiling below
  the largest ``max_new_tokens``: ``log`` (default; K log-spaced edges from 1 to the largest length, each
  generation cap snapped onto an edge) or ``quantile`` (equal-mass over uncapped lengths, plus every cap and
  the largest length as edges). The bin centre ``c_j`` is the mean training length inside bin ``j``. (Equal-mass
  bins over all scenarios pooled had their top bin at ``[512, inf)``, centre 579: no long answer was reachable.)
* **Censoring**: a response that hit ``max_new_tokens`` (``finish_reason == "length"``) is only known to be
  ``>= cap``. Its label is the bins at or above the cap's bin, scored as a censored likelihood
  ``-log sum_{j >= b(cap)} p_j`` (no penalty for how the mass spreads above the cap). Since a request's cap
  is known when it arrives, every prediction is the expected *observed* length
  ``y_hat = sum_j p_j min(c_j, cap)``, so it never exceeds the cap and the MSE term of a capped sample is
  ``(y_hat - cap)^2``.
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
from lenpred.torch_state import torch_seed


BINNINGS = ("log", "quantile", "width")


def length_bin_edges(lengths: np.ndarray, num_bins: int = 20, binning: str = "log", caps: np.ndarray = (),
                     censored: np.ndarray | None = None) -> np.ndarray:
    """Bin edges from training lengths: ``(K + 1,)`` float64, strictly increasing, ``edges[0] = -inf``,
    ``edges[-1] = +inf``; the largest training length and every cap are interior edges, so the top bin holds only
    the largest length (no ceiling below it) and a capped length sits at the bottom of its own bin.

    Args:
        lengths: ``(n,)`` training lengths in tokens (capped ones at their cap).
        num_bins: K before merging duplicate edges (K can shrink).
        binning: ``"log"`` — log-spaced from the shortest (at least 1) to the largest length; ``"quantile"`` —
            equal-mass quantiles of the uncapped lengths; ``"width"`` — K equal-width bins from 0 to the largest
            length (TRAIL's binning), caps *not* added as edges (a censored label then also credits the part of the
            cap's bin below the cap).
        caps: generation caps (``max_new_tokens``) of the capped training samples.
        censored: ``(n,)`` bool, which lengths are capped (only ``quantile`` reads it).

    Raises:
        LenpredError: fewer than 2 lengths, ``num_bins < 2`` or an unknown binning.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    if lengths.size < 2 or num_bins < 2:
        raise LenpredError(f"need >= 2 training lengths and >= 2 bins, got {lengths.size} and {num_bins}")
    if binning not in BINNINGS:
        raise LenpredError(f"unknown binning '{binning}'; valid: {', '.join(BINNINGS)}")
    top = max(float(lengths.max()), 2.0)
    caps = np.unique(np.asarray(caps, dtype=np.float64))
    if binning == "log":
        inner = np.geomspace(max(float(lengths.min()), 1.0), top, num_bins)[1:]  # K - 1 edges, the last the largest
        for c in caps:  # snap the nearest edge onto each cap (in log distance)
            inner[np.argmin(np.abs(np.log(inner) - np.log(max(c, 1.0))))] = c
    elif binning == "width":
        return np.concatenate([[-np.inf], np.unique(np.ceil(np.linspace(0, top, num_bins + 1)[1:])), [np.inf]])
    else:
        free = lengths if censored is None else lengths[~np.asarray(censored, dtype=bool)]
        inner = np.quantile(free if free.size else lengths, np.arange(1, num_bins) / num_bins)
    # lengths are whole tokens: an edge e and ceil(e) put every length in the same bin, and whole edges merge
    inner = np.unique(np.concatenate([np.ceil(inner), caps, [top]]))
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


def capped_centres(centres: torch.Tensor, caps: torch.Tensor) -> torch.Tensor:
    """``min(c_j, cap_i)``: ``(K,)`` and ``(B,)`` -> ``(B, K)``; what bin ``j`` means for a request capped at ``cap_i``."""
    return torch.minimum(centres[None, :], caps[:, None])


def soft_label_loss(logits: torch.Tensor, q: torch.Tensor, y: torch.Tensor, centres: torch.Tensor,
                    length_scale: float, lam: float = 0.95, weights: torch.Tensor | None = None,
                    caps: torch.Tensor | None = None, censored_share: torch.Tensor | None = None,
                    above_cap: torch.Tensor | None = None) -> torch.Tensor:
    """Soft-label loss, averaged over rows (weighted by ``weights`` ``(B,)`` when given), a scalar:

    ``lam * (CE(q, p) - s * log sum_j above_cap_j p_j) + (1 - lam) * ((y_hat - y) / length_scale)^2``

    with ``p = softmax(logits)``, ``y_hat = sum_j p_j min(c_j, cap)`` in tokens. Without censoring
    (``censored_share`` ``None``) it is EGTP's ``lam * CE + (1 - lam) * MSE``.

    Args:
        logits: ``(B, K)``; q: ``(B, K)`` soft labels of the uncapped samples, scaled to sum to ``1 - s``;
        y: ``(B,)`` mean observed length (tokens; capped samples count at their cap).
        caps: ``(B,)`` generation caps (``inf``: none). censored_share: ``(B,)`` ``s``, share of a row's samples
            that hit the cap. above_cap: ``(B, K)`` 1 for bins at or above the cap's bin.
    """
    log_p = torch.log_softmax(logits, dim=1)
    ce = -(q * log_p).sum(dim=1)
    if censored_share is not None:
        log_above = torch.logsumexp(log_p.masked_fill(above_cap == 0, float("-inf")), dim=1)
        ce = ce - censored_share * torch.where(censored_share > 0, log_above, torch.zeros_like(log_above))
    values = centres[None, :] if caps is None else capped_centres(centres, caps)
    y_hat = (log_p.exp() * values).sum(dim=1)
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
        binning: how bin edges are placed (:func:`length_bin_edges`): ``log`` (default, chosen on ForeLen's
            validation split, see README) or ``quantile``.
    """

    num_bins: int = 20
    tau: float = 1.0
    lam: float = 0.95
    lr: float = 1e-3
    weight_decay: float = 1e-2
    epochs: int = 150
    batch_size: int = 64
    dropout: float = 0.1
    binning: str = "log"

    def __post_init__(self):
        if not 0 <= self.lam <= 1 or self.tau <= 0 or self.num_bins < 2 or self.epochs < 1:
            raise LenpredError("HeadConfig needs 0 <= lam <= 1, tau > 0, num_bins >= 2, epochs >= 1")
        if self.binning not in BINNINGS:
            raise LenpredError(f"unknown binning '{self.binning}'; valid: {', '.join(BINNINGS)}")


class SoftLabelRegressor:
    """Estimator: pooled features ``(n, d)`` float -> predicted output length ``(n,)`` in tokens.

    scikit-learn style: ``__init__`` stores hyper-parameters, ``fit`` learns ``n_features_in_`` (the width ``d``),
    ``edges_``, ``centres_``, ``mean_``, ``std_``, ``length_scale_`` and ``module_`` and returns ``self``; ``seed``
    fixes the initialisation and batch order.
    """

    def __init__(self, config: HeadConfig | None = None, seed: int = 0, warm_start: bool = False):
        self.config = config or HeadConfig()
        self.seed = seed
        self.warm_start = warm_start  # scikit-learn's meaning: a second fit continues from the fitted state

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None, censored: np.ndarray | None = None,
            caps: np.ndarray | None = None, sample_weight: np.ndarray | None = None) -> "SoftLabelRegressor":
        """Train on features ``X`` ``(n, d)`` and observed lengths ``y`` ``(n,)`` (tokens).

        ``groups`` ``(n,)`` (optional): rows with the same group id are samples of one prompt and share their
        features (and cap). They are trained as one row weighted by the number of samples, with the mean soft label
        of the uncapped samples, the share of capped ones and the mean length — the same objective up to a
        constant (CE is linear in ``q``, and ``mean_s (y_hat - y_s)^2 = (y_hat - mean_s y_s)^2 + var_s y``).
        ``censored`` ``(n,)`` bool marks samples that hit their cap, ``caps`` ``(n,)`` each sample's
        ``max_new_tokens`` (``inf``: none); see the module docstring for how they enter the loss.
        ``sample_weight`` ``(n,)`` (optional, > 0): each sample's weight in the loss (PLP: ``1 / steps`` of its
        rollout, so every rollout weighs the same); a group's row weighs the sum of its samples' weights.
        With ``warm_start`` and a fitted head, training continues from its weights, keeping its bins and feature
        scaling (fine-tuning on new data, e.g. logged traffic; ``config.epochs`` / ``lr`` set the schedule).

        Raises:
            LenpredError: shapes disagree, fewer than 2 samples, or a capped sample without a finite cap.
        """
        X, y = np.asarray(X, dtype=np.float32), np.asarray(y, dtype=np.float64)
        n = len(y)
        censored = np.zeros(n, bool) if censored is None else np.asarray(censored, dtype=bool)
        caps = np.full(n, np.inf) if caps is None else np.asarray(caps, dtype=np.float64)
        if X.ndim != 2 or y.shape != (X.shape[0],) or any(a is not None and len(a) != n for a in (groups, censored, caps)):
            raise LenpredError(f"fit needs X (n, d) and y, groups, censored, caps (n,), got {X.shape}, {y.shape}, "
                               f"{None if groups is None else np.shape(groups)}, {censored.shape}, {caps.shape}")
        w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if w.shape != (n,) or not (w > 0).all():
            raise LenpredError(f"sample_weight must be (n,) = ({n},) and > 0, got shape {w.shape}")
        if not np.isfinite(caps[censored]).all():
            raise LenpredError("a capped sample (censored) needs its finite max_new_tokens")
        with torch_seed(self.seed):  # nn.Linear init and dropout draw from the global generator; the caller's is kept
            return self._train(X, y, groups, censored, caps, w)

    def _train(self, X: np.ndarray, y: np.ndarray, groups, censored: np.ndarray, caps: np.ndarray,
               w: np.ndarray) -> "SoftLabelRegressor":
        """:meth:`fit` on validated arrays (``w``: the sample weights), run under :func:`torch_seed`."""
        n = len(y)
        cfg = self.config
        gen = torch.Generator().manual_seed(self.seed)
        if not (self.warm_start and hasattr(self, "module_")):
            self.edges_ = length_bin_edges(y, cfg.num_bins, cfg.binning, caps[censored], censored)
            self.centres_ = bin_centres(y, self.edges_)
            self.n_features_in_ = X.shape[1]
            self.mean_, self.std_ = X.mean(0), X.std(0) + 1e-6
            self.length_scale_ = float(y.std() + 1e-6)
            self.module_ = DistributionHead(X.shape[1], len(self.centres_), cfg.dropout)
        elif X.shape[1] != self.n_features_in_:
            raise LenpredError(f"warm start: X has {X.shape[1]} features, the fitted head reads {self.n_features_in_}")
        K = len(self.centres_)
        q = soft_labels(torch.from_numpy(assign_bins(y, self.edges_)), K, cfg.tau)
        q[torch.from_numpy(censored)] = 0.0  # a capped sample's label is the censored term, not a bin
        _, first, inverse = np.unique(np.arange(n) if groups is None else np.asarray(groups),
                                      return_index=True, return_inverse=True)
        counts = np.bincount(inverse, weights=w)  # a row's total weight; its labels are weighted means
        inv = torch.from_numpy(inverse)
        Xt = torch.from_numpy((X[first] - self.mean_) / self.std_)
        yt = torch.from_numpy(np.bincount(inverse, weights=w * y) / counts).float()
        q = (torch.zeros(len(first), K, dtype=torch.float64).index_add_(0, inv, q.double() * torch.from_numpy(w)[:, None])
             / torch.from_numpy(counts)[:, None]).float()
        share = torch.from_numpy(np.bincount(inverse, weights=w * censored) / counts).float()
        row_caps = torch.from_numpy(caps[first]).float()
        cap_bins = torch.from_numpy(assign_bins(np.minimum(caps[first], 1e12), self.edges_))
        above = (torch.arange(K)[None, :] >= cap_bins[:, None]).float()
        weights = torch.from_numpy(counts).float()
        centres = torch.from_numpy(self.centres_).float()
        opt = torch.optim.AdamW(self.module_.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.module_.train()
        for _ in range(cfg.epochs):
            order = torch.randperm(len(Xt), generator=gen)
            for s in range(0, len(Xt), cfg.batch_size):
                idx = order[s:s + cfg.batch_size]
                loss = soft_label_loss(self.module_(Xt[idx]), q[idx], yt[idx], centres, self.length_scale_, cfg.lam,
                                       weights[idx], row_caps[idx], share[idx], above[idx])
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

    def distribution(self, X: np.ndarray, caps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(probs, values)``, both ``(n, K)`` float64: the bin probabilities of features ``X`` ``(n, d)`` and the
        length each bin stands for, ``min(c_j, cap)`` tokens (``caps`` ``(n,)``, each request's
        ``max_new_tokens``, ``inf`` or ``None``: uncapped). The one place a head's output becomes lengths."""
        p = self.predict_proba(X)
        values = np.broadcast_to(self.centres_[None, :], p.shape) if caps is None else np.minimum(
            self.centres_[None, :], np.asarray(caps, np.float64)[:, None])
        return p, values

    def predict(self, X: np.ndarray, caps: np.ndarray | None = None) -> np.ndarray:
        """Expected observed length ``sum_j p_j min(c_j, cap)`` in tokens, ``(n,)`` float64 (see
        :meth:`distribution`)."""
        p, values = self.distribution(X, caps)
        return (p * values).sum(axis=1)

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
        head.length_scale_, head.n_features_in_ = float(state["length_scale"]), len(head.mean_)
        head.module_ = DistributionHead(head.n_features_in_, len(head.centres_), head.config.dropout)
        head.module_.load_state_dict(state["module"])
        head.module_.eval()
        return head


def head_tensors(head: SoftLabelRegressor) -> tuple[dict[str, torch.Tensor], dict]:
    """A fitted head as ``(tensors, info)``: the module's weights and the bin / scaling arrays as tensors (for
    safetensors), the config and scalars as a JSON-able dict. Inverse: :func:`head_from_tensors`."""
    state = head.state()
    tensors = {f"module.{k}": v for k, v in state.pop("module").items()}
    for key in ("edges", "centres", "mean", "std"):
        tensors[key] = torch.from_numpy(np.asarray(state.pop(key)))
    return tensors, state


def head_from_tensors(tensors: dict[str, torch.Tensor], info: dict) -> SoftLabelRegressor:
    """Rebuild the head written by :func:`head_tensors`."""
    state = dict(info)
    state["module"] = {k[len("module."):]: v for k, v in tensors.items() if k.startswith("module.")}
    for key in ("edges", "centres", "mean", "std"):
        state[key] = tensors[key].numpy()
    return SoftLabelRegressor.from_state(state)
