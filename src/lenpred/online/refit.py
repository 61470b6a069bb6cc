"""Refit a pooled-head predictor on logged traffic (features-level kernels of ``LengthPredictor.from_traffic``).

The traffic log (:mod:`lenpred.online.traffic_log`) holds exactly what the head reads (the pooled state), so a
refit needs no model pass. A stream is split **in time** — train on the earliest requests, calibrate the
interval on the next ones, score the latest ones — never at random: a random split of a stream puts tomorrow's
traffic in today's training set. Censoring is as in training (:class:`lenpred.heads.SoftLabelRegressor`): a
request that hit its cap (``finish_reason == "length"``) is a lower bound at its cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lenpred.errors import LenpredError
from lenpred.prediction import head_quantiles

# torch (heads) is imported inside the functions that train: splitting and reading a traffic log need numpy only.


@dataclass
class TrafficRows:
    """Training rows for a head, one per finished request (or benchmark sample).

    Attributes:
        X: ``(n, d)`` float32 pooled features.
        y: ``(n,)`` float64 observed output tokens (a lower bound where ``censored``).
        censored: ``(n,)`` bool, the request hit its cap.
        caps: ``(n,)`` float64 ``max_new_tokens`` (``inf``: uncapped).
        groups: ``(n,)`` str: rows of one prompt share a group (its SHA-256 or benchmark prompt id); unique
            otherwise.
        source: ``(n,)`` str, where the row comes from (``"traffic"`` or ``"bench"``).
    """

    X: np.ndarray
    y: np.ndarray
    censored: np.ndarray
    caps: np.ndarray
    groups: np.ndarray
    source: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def take(self, idx: np.ndarray) -> "TrafficRows":
        return TrafficRows(self.X[idx], self.y[idx], self.censored[idx], self.caps[idx], self.groups[idx],
                           self.source[idx])

    @staticmethod
    def concat(parts: list["TrafficRows"]) -> "TrafficRows":
        return TrafficRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                             ("X", "y", "censored", "caps", "groups", "source")))


def rows_from_log(log) -> TrafficRows:
    """A :class:`lenpred.online.traffic_log.TrafficLog` as training rows, in finish-time order (stable).

    A capped request without a logged cap is taken as capped at its observed length."""
    c = log.columns
    order = np.argsort(c["finish_time_s"], kind="stable")
    y = c["num_output_tokens"][order]
    censored = log.censored[order]
    caps = c["max_new_tokens"][order]
    caps = np.where(np.isnan(caps), np.where(censored, y, np.inf), caps)
    sha = c["prompt_sha256"][order]
    groups = np.array([s if s is not None else f"row{i}" for i, s in zip(order, sha)], dtype=object)
    return TrafficRows(log.features[order], y.astype(np.float64), censored, caps.astype(np.float64), groups,
                       np.full(len(y), "traffic", dtype=object))


def time_split(n: int, calibration_share: float, test_share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row indices ``(train, calibration, test)`` of a time-ordered stream of ``n`` rows: the earliest
    ``1 - calibration_share - test_share``, the next ``calibration_share``, the latest ``test_share``
    (counts rounded down for calibration and test).

    Raises:
        LenpredError: shares outside [0, 1) or summing to >= 1, or an empty train part.
    """
    if not (0 <= calibration_share < 1 and 0 <= test_share < 1 and calibration_share + test_share < 1):
        raise LenpredError(f"calibration and test shares must lie in [0, 1) and sum below 1, got "
                           f"{calibration_share} and {test_share}")
    n_test, n_cal = int(n * test_share), int(n * calibration_share)
    n_train = n - n_test - n_cal
    if n_train < 2:
        raise LenpredError(f"{n} logged requests leave {n_train} for training: log more traffic or lower the shares")
    idx = np.arange(n)
    return idx[:n_train], idx[n_train:n_train + n_cal], idx[n_train + n_cal:]


def fit_head(rows: TrafficRows, head_params: dict, seed: int = 0):
    """A :class:`lenpred.heads.SoftLabelRegressor` fitted on ``rows`` (censoring-aware; rows of one group trained
    as one weighted row), with the hyper-parameters ``head_params`` (a :class:`lenpred.heads.HeadConfig` dict)."""
    from lenpred.heads import HeadConfig, SoftLabelRegressor

    _, groups = np.unique(rows.groups.astype(str), return_inverse=True)
    return SoftLabelRegressor(HeadConfig(**head_params), seed).fit(rows.X, rows.y, groups, rows.censored, rows.caps)


def finetune_head(base_head, rows: TrafficRows, epochs: int, lr: float, seed: int = 0):
    """A copy of the fitted ``base_head`` trained further on ``rows`` for ``epochs`` at learning rate ``lr``
    (:class:`lenpred.heads.SoftLabelRegressor` with ``warm_start``: the base's bins and feature scaling are kept)."""
    from dataclasses import replace

    from lenpred.heads import SoftLabelRegressor

    head = SoftLabelRegressor.from_state(base_head.state())
    head.config, head.seed, head.warm_start = replace(head.config, epochs=epochs, lr=lr), seed, True
    _, groups = np.unique(rows.groups.astype(str), return_inverse=True)
    return head.fit(rows.X, rows.y, groups, rows.censored, rows.caps)


FINETUNE_GRID = ((10, 1e-4), (30, 1e-4), (30, 3e-4), (100, 1e-4))  # (epochs, lr), chosen in time order (below)


def choose_finetune(base_head, rows: TrafficRows, coverage: float, share: float = 0.2, seed: int = 0,
                    grid=FINETUNE_GRID) -> tuple[int, float, list[dict]]:
    """Pick fine-tuning ``(epochs, lr)`` on the stream itself, in time order: fine-tune on the earliest
    ``1 - share`` of ``rows``, score MAE on the latest ``share``; also scores the base head itself (``epochs`` 0).
    Returns ``(epochs, lr, sweep)``; ``(0, 0.0)`` when no candidate beats the base head there."""
    n_val = max(1, int(len(rows) * share))
    fit_rows, val = rows.take(np.arange(len(rows) - n_val)), rows.take(np.arange(len(rows) - n_val, len(rows)))
    def mae(h) -> float:
        return float(np.mean(np.abs(head_quantiles(h, val.X, val.caps, coverage)[0] - val.y)))

    sweep = [{"epochs": 0, "lr": 0.0, "val_mae": mae(base_head)}]
    for epochs, lr in grid:
        sweep.append({"epochs": epochs, "lr": lr, "val_mae": mae(finetune_head(base_head, fit_rows, epochs, lr, seed))})
    best = min(sweep, key=lambda r: r["val_mae"])
    return best["epochs"], best["lr"], sweep
