"""LTR baseline: learning to rank output lengths with a listwise (ListMLE) loss.

Source: Fu et al., "Efficient LLM Scheduling by Learning to Rank" (NeurIPS 2024), which trains a
scorer whose order matches the order of the true output lengths (what a shortest-job-first scheduler
needs) with ListMLE (Xia et al., "Listwise Approach to Learning to Rank", ICML 2008):
for a list sorted by true length, longest first, ``L = -sum_i [s_i - log sum_{j >= i} exp(s_j)]``.

Here the scorer is the EGTP head's MLP trunk with one output over the same pooled features as ESTP
(pooler ``estp``; layer / lambda1 / alpha as chosen for ESTP). A score is not a length: predictions in
tokens come from **quantile mapping** — a test score's rank among the training scores gives a quantile,
and the prediction is the training length at that quantile.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lenpred.errors import LenpredError
from lenpred.predictors.registry import register
from lenpred.predictors.pooled import PooledHeadPredictor
from lenpred.torch_state import torch_seed


def list_mle_loss(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """ListMLE loss of one list, a scalar: ``scores`` ``(m,)`` (higher = longer), ``lengths`` ``(m,)`` tokens.

    ``-sum_i [s_(i) - logsumexp_{j >= i} s_(j)]`` with ``(i)`` the order of decreasing true length
    (ties keep their input order; shuffle lists to break them at random).
    """
    order = torch.argsort(lengths, descending=True, stable=True)
    s = scores[order]
    tail_lse = torch.logcumsumexp(s.flip(0), dim=0).flip(0)  # logsumexp over j >= i
    return (tail_lse - s).sum()


def quantile_map(scores: np.ndarray, train_scores: np.ndarray, train_lengths: np.ndarray) -> np.ndarray:
    """Scores -> tokens: a score's mid-rank quantile among ``train_scores``, read off ``train_lengths``.

    ``q = (#{train < s} + #{train <= s}) / (2 n)``; prediction ``= quantile(train_lengths, q)`` (linear
    interpolation, numpy's default). Monotone in the score, so the ranking is kept. Returns ``(m,)`` float64.
    """
    train_scores = np.sort(np.asarray(train_scores, dtype=np.float64))
    lo = np.searchsorted(train_scores, scores, side="left")
    hi = np.searchsorted(train_scores, scores, side="right")
    q = (lo + hi) / (2 * len(train_scores))
    return np.quantile(np.asarray(train_lengths, dtype=np.float64), q)


class _Scorer(nn.Module):
    """``Linear(d, d/2) -> LayerNorm -> ReLU -> Dropout(0.1) -> Linear(d/2, 1)``: ``(B, d)`` -> ``(B,)``."""

    def __init__(self, in_dim: int, dropout: float = 0.1):
        super().__init__()
        hidden = max(in_dim // 2, 1)
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.LayerNorm(hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


@register("ltr")
class ListwiseRankingPredictor(PooledHeadPredictor):
    """ListMLE-trained scorer over ESTP-pooled features, mapped to tokens by training quantiles.

    ``head`` keys used: ``epochs`` (passes over the training set; default 60), ``lr`` (1e-3),
    ``weight_decay`` (1e-2), ``list_size`` (samples per list, 32).
    """

    pooler_name = "estp"
    supports_censoring = False  # ListMLE ranks observed lengths; capped ones rank at their cap
    tune_after = ("estp",)
    gives_distribution = False  # a ranking score, not a length distribution

    @classmethod
    def param_grid(cls, ctx) -> list[dict]:
        """One candidate: ESTP's pooled features as chosen for ESTP on validation (layer, lambda1, alpha), whatever
        else the run fits (:func:`lenpred.tuning.tune_dependencies` tunes ESTP first when it has not been).

        Raises:
            LenpredError: ``ctx.chosen`` has no ESTP choice (call ``tune_dependencies("ltr", ...)`` first).
        """
        settings = {k: v for k, v in ctx.pooled_settings.items() if k != "head"}
        estp = ctx.chosen.get("estp")
        if not estp:
            raise LenpredError("ltr pools as ESTP chose on validation, and no ESTP choice is made yet: tune it first "
                               "(lenpred.tuning.tune_dependencies)")
        return [{k: estp[k] for k in ("layer", "lambda1", "alpha")} | settings]

    @property
    def n_features_in_(self) -> int:
        """The pooled features' width ``d`` the fitted scorer reads.

        Raises:
            AttributeError: not fitted."""
        return len(self.mean_)

    def distribution_from_features(self, features, caps):
        """Not available: a ranking score is not a length distribution (``reads().features`` is false).

        Raises:
            NotImplementedError: always."""
        raise NotImplementedError("predictor 'ltr' gives a ranking score, not a length distribution")

    def _head(self) -> dict:
        return {"epochs": 60, "lr": 1e-3, "weight_decay": 1e-2, "list_size": 32, **self.params["head"]}

    def scores(self, requests: list) -> np.ndarray:
        """Ranking scores ``(n,)`` float64 (higher = longer predicted output)."""
        X = torch.from_numpy((self.features(requests) - self.mean_) / self.std_)
        with torch.no_grad():
            return self.module_(X).double().numpy()

    def fit(self, requests, y):
        cfg = self._head()
        X, y = self.features(requests), np.asarray(y, dtype=np.float64)
        with torch_seed(self.params["seed"]):  # _Scorer's init draws from the global generator; the caller's is kept
            gen = torch.Generator().manual_seed(self.params["seed"])
            self.mean_, self.std_ = X.mean(0), X.std(0) + 1e-6
            Xt, yt = torch.from_numpy((X - self.mean_) / self.std_), torch.from_numpy(y)
            self.module_ = _Scorer(X.shape[1])
            opt = torch.optim.AdamW(self.module_.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
            self.module_.train()
            for _ in range(cfg["epochs"]):
                order = torch.randperm(len(Xt), generator=gen)
                for s in range(0, len(order), cfg["list_size"]):
                    idx = order[s:s + cfg["list_size"]]
                    if len(idx) < 2:
                        continue
                    loss = list_mle_loss(self.module_(Xt[idx]), yt[idx]) / len(idx)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            self.module_.eval()
        self.train_scores_ = np.sort(self.scores(requests))
        self.train_lengths_ = np.sort(y)
        return self

    def predict(self, requests):
        return quantile_map(self.scores(requests), self.train_scores_, self.train_lengths_)

    def _get_state(self):
        tensors = {f"module.{k}": v.clone() for k, v in self.module_.state_dict().items()}
        for key in ("mean_", "std_", "train_scores_", "train_lengths_"):
            tensors[key] = torch.from_numpy(np.asarray(getattr(self, key)))
        return tensors, {"in_dim": self.n_features_in_}

    def _set_state(self, tensors, info):
        self.module_ = _Scorer(info["in_dim"])
        self.module_.load_state_dict({k[len("module."):]: v for k, v in tensors.items() if k.startswith("module.")})
        self.module_.eval()
        for key in ("mean_", "std_", "train_scores_", "train_lengths_"):
            setattr(self, key, tensors[key].numpy())
