"""Tuning on validation and refitting per seed: the same procedure for every predictor.

Each predictor lists its own candidates (:meth:`lenpred.predictors.Predictor.param_grid`); the tuner fits every
candidate on train with the first seed, keeps the lowest validation MAE (predictions clipped to each request's
``max_new_tokens``, as in the test scores), then refits the choice with every other seed.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lenpred.torch_state import torch_threads  # also imported from here by studies and scripts


@dataclass
class TuningContext:
    """What ``param_grid`` may read.

    Attributes:
        layers: hidden-state indices every pooled head searches (resolved, 0..L).
        trail_layers: TRAIL's layer sweep.
        lambda1_grid, alpha_grid: ESTP's extra search.
        pooled_settings: constructor arguments shared by the pooled heads (``pool_span``, ``semantic_divisor``,
            ``head``).
        proxy_settings: constructor arguments of the text proxies (encoder, epochs, max_length, precision).
        values: what the input providers measured (e.g. ``tokens_per_word``).
        chosen: hyper-parameters already chosen, by method (for ``tune_after``).
    """

    layers: tuple[int, ...]
    trail_layers: tuple[int, ...]
    lambda1_grid: tuple[float, ...]
    alpha_grid: tuple[float, ...]
    pooled_settings: dict[str, Any]
    proxy_settings: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    chosen: dict[str, dict] = field(default_factory=dict)


@dataclass
class MethodRun:
    """One method's tuning and test predictions.

    Attributes:
        predictions: one ``(n_test,)`` float64 array per seed, tokens, clipped to each request's cap.
        chosen: the hyper-parameters picked on validation (with ``val_mae``; ``None`` for one candidate).
        sweep: every candidate with its validation MAE.
        fitted: the predictor fitted with the first seed (what gets saved).
        fit_s: wall time of tuning + refits, seconds.
        diagnostics: ``fitted.diagnostics(test requests)``.
    """

    predictions: list[np.ndarray]
    chosen: dict
    sweep: list[dict]
    fitted: Any
    fit_s: float
    diagnostics: dict


def takes_seed(method: str) -> bool:
    """Whether the registered predictor is learned with a seed (its constructor takes ``seed``)."""
    from lenpred.predictors import PREDICTORS

    return "seed" in inspect.signature(PREDICTORS[method]).parameters


def fit_order(methods: tuple[str, ...]) -> list[str]:
    """Methods in an order where each one's ``tune_after`` predictors come first (stable otherwise), so a choice a
    later method reads is made once (:func:`tune_dependencies` makes it anyway when it is missing)."""
    from lenpred.predictors import PREDICTORS

    return sorted(methods, key=lambda m: bool(set(PREDICTORS[m].tune_after) & set(methods)))


def fit_predictor(method: str, params: dict, requests: list, y: np.ndarray, censored: np.ndarray, seed: int | None):
    """Build and fit one predictor (capped samples passed as censored where the predictor supports it)."""
    from lenpred.predictors import PREDICTORS, make_predictor

    predictor = make_predictor(method, **params, **({} if seed is None or not takes_seed(method) else {"seed": seed}))
    kwargs = {"censored": censored} if PREDICTORS[method].supports_censoring else {}
    return predictor.fit(requests, y, **kwargs)


def clipped_predict(predictor, requests: list) -> np.ndarray:
    """``predictor.predict(requests)`` clipped to ``[0, max_new_tokens]`` of each request (a response cannot be
    longer than its cap, and the cap is known when the request arrives)."""
    from lenpred.predictors import max_new_tokens

    return np.clip(predictor.predict(requests), 0, max_new_tokens(requests))


def fit_with_validation(method: str, candidates: list[dict], data, seed: int) -> tuple[Any, dict, list[dict]]:
    """Fit every candidate on train with ``seed`` and keep the lowest validation MAE; a single candidate is fitted
    without looking at validation (``val_mae`` ``None``). Returns ``(fitted predictor, chosen params, sweep)``."""
    train, val = data.index["train"], data.index["validation"]
    train_req, val_req = data.rows("train"), data.rows("validation")
    from tqdm.auto import tqdm

    sweep, best, best_mae = [], None, np.inf
    for params in tqdm(candidates, desc=f"{method} on validation", unit="candidate", leave=False,
                       disable=len(candidates) < 2):
        predictor = fit_predictor(method, params, train_req, data.y[train], data.censored[train], seed)
        val_mae = float(np.mean(np.abs(clipped_predict(predictor, val_req) - data.y[val]))) \
            if len(candidates) > 1 else None
        sweep.append({**params, "val_mae": val_mae})
        if best is None or (val_mae is not None and val_mae < best_mae):
            best, best_mae, chosen = predictor, val_mae if val_mae is not None else np.inf, sweep[-1]
    return best, chosen, sweep


def tune_dependencies(method: str, data, ctx: TuningContext, seed: int) -> None:
    """Put in ``ctx.chosen`` the validation choice of every predictor ``method``'s ``param_grid`` reads
    (``tune_after``, e.g. ESTP's pooling for ``ltr``), tuning one not chosen yet now with ``seed`` — the choice its
    own :func:`tune_and_refit` with the same first seed makes. So a method's grid never depends on which methods ran
    before it, or whether they ran at all."""
    from lenpred.predictors import PREDICTORS

    for dep in PREDICTORS[method].tune_after:
        if dep not in ctx.chosen:
            tune_dependencies(dep, data, ctx, seed)
            with torch_threads(1):
                _, ctx.chosen[dep], _ = fit_with_validation(dep, PREDICTORS[dep].param_grid(ctx), data, seed)


def tune_and_refit(method: str, data, ctx: TuningContext, seeds: tuple[int, ...]) -> MethodRun:
    """Tune ``method`` on validation with ``seeds[0]``, refit with the other seeds, predict test (clipped).

    The choices its grid reads are made first if this run has not made them (:func:`tune_dependencies`). Runs on
    one torch thread (small heads: faster on a busy machine, and the same numbers in any process); the text proxies
    fix their own thread count inside ``fit`` / ``predict``."""
    from lenpred.predictors import PREDICTORS

    t = time.perf_counter()
    tune_dependencies(method, data, ctx, seeds[0])
    cls = PREDICTORS[method]
    test_req = data.rows("test")
    train = data.index["train"]
    with torch_threads(1):
        best, chosen, sweep = fit_with_validation(method, cls.param_grid(ctx), data, seeds[0])
        fitted = [best]
        if takes_seed(method):
            params = {k: v for k, v in chosen.items() if k != "val_mae"}
            fitted += [fit_predictor(method, params, data.rows("train"), data.y[train], data.censored[train], s)
                       for s in seeds[1:]]
        predictions = [clipped_predict(p, test_req) for p in fitted]
        diagnostics = best.diagnostics(test_req)
    ctx.chosen[method] = chosen
    return MethodRun(predictions, chosen, sweep, best, time.perf_counter() - t, diagnostics)
