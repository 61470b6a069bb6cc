"""Tuning on validation and refitting per seed: the same procedure for every predictor.

Each predictor lists its own candidates, simplest first (:meth:`lenpred.predictors.Predictor.param_grid`); the
tuner fits every candidate on train with the first seed, scores validation MAE (predictions clipped to each
request's ``max_new_tokens``, as in the test scores) and keeps the **simplest candidate within one standard error of
the best** (:func:`one_se_choice`), then refits the choice with every other seed. The lowest validation MAE alone
flipped between near-tied candidates under float noise (ESTP: test MAE 177 vs 199–201 on the same signals
re-extracted, ``scripts/estp_selection_spread.py``); the one-standard-error rule does not chase such ties.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from lenpred.errors import LenpredError, raise_first
from lenpred.predictors import PREDICTORS, make_predictor, max_new_tokens

from lenpred.torch_state import torch_threads
from lenpred.tuning_settings import TuningSettings  # noqa: F401 (re-exported: the tuner's settings)


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


def check_run_settings(methods: tuple[str, ...], seeds: tuple[int, ...] = (0,), threads: int | None = None) -> None:
    """The checks of a run's methods, seeds and backbone threads (those of
    :class:`lenpred.studies.evaluate.EvalConfig`, with its messages).

    Raises:
        LenpredError: an unknown or no method, no seed or one outside 0..2**32 - 1, or ``threads`` < 1.
    """
    unknown = [m for m in methods if m not in PREDICTORS]
    if unknown:
        raise LenpredError(f"unknown methods {unknown}; valid: {', '.join(sorted(PREDICTORS))}")
    checks = [(not methods, "no methods given: pass --methods with at least one predictor"),
              (not seeds, "no seeds given: pass --seeds like 0,1,2"),
              (any(not 0 <= s < 2**32 for s in seeds),
               f"seeds must lie in 0..{2**32 - 1} (the range numpy and torch accept), got {list(seeds)}"),
              (threads is not None and threads < 1, f"--threads must be >= 1, got {threads}")]
    raise_first(checks)


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): there bf16 autocast halves the text
    proxies' fine-tuning time; without it (e.g. an AVX2-only CPU) bf16 is ~15x *slower* than float32 (measured:
    40 vs 2.4 s per SSJF step, `scripts/proxy_fit_time.py`)."""
    capability = torch.backends.cpu.get_cpu_capability()
    return "BF16" in capability or "AMX" in capability


def tuning_context(settings: TuningSettings, layers: tuple[int, ...], num_layers: int,
                   values: dict[str, Any]) -> "TuningContext":
    """The :class:`TuningContext` of ``settings`` for a model of ``num_layers`` layers: ``layers`` (resolved) are
    searched by every pooled head, TRAIL sweeps ``settings.trail_layers`` or every index 1..L, and ``values`` are
    the input providers' measurements (:attr:`lenpred.dataset.Dataset.values`)."""
    return TuningContext(
        layers=layers, trail_layers=settings.trail_layers or tuple(range(1, num_layers + 1)),
        lambda1_grid=settings.lambda1_grid, alpha_grid=settings.alpha_grid,
        pooled_settings={"pool_span": settings.pool_span, "semantic_divisor": settings.semantic_divisor,
                         "head": {"epochs": settings.epochs, "binning": settings.binning}},
        proxy_settings={"encoder": settings.proxy_encoder, "epochs": settings.proxy_epochs,
                        "max_length": settings.proxy_max_length,
                        "precision": "bfloat16" if native_bf16() else "float32"},
        values=values)


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
    return "seed" in inspect.signature(PREDICTORS[method]).parameters


def fit_order(methods: tuple[str, ...]) -> list[str]:
    """Methods in an order where each one's ``tune_after`` predictors come first (stable otherwise), so a choice a
    later method reads is made once (:func:`tune_dependencies` makes it anyway when it is missing)."""
    return sorted(methods, key=lambda m: bool(set(PREDICTORS[m].tune_after) & set(methods)))


def fit_predictor(method: str, params: dict, requests: list, y: np.ndarray, censored: np.ndarray, seed: int | None):
    """Build and fit one predictor (capped samples passed as censored where the predictor supports it)."""
    predictor = make_predictor(method, **params, **({} if seed is None or not takes_seed(method) else {"seed": seed}))
    kwargs = {"censored": censored} if PREDICTORS[method].supports_censoring else {}
    return predictor.fit(requests, y, **kwargs)


def clipped_predict(predictor, requests: list) -> np.ndarray:
    """``predictor.predict(requests)`` clipped to ``[0, max_new_tokens]`` of each request (a response cannot be
    longer than its cap, and the cap is known when the request arrives)."""
    return np.clip(predictor.predict(requests), 0, max_new_tokens(requests))


@dataclass
class FitScore:
    """One predictor fitted on train and scored (:func:`fit_and_score`).

    Attributes:
        predictor: the fitted predictor.
        val_abs_err: ``(n_validation,)`` float64 absolute errors in tokens on the validation split (predictions
            clipped to each request's cap).
        test_abs_err: ``(n_test,)`` float64 absolute errors in tokens on the test split, or ``None`` when not scored.
    """

    predictor: Any
    val_abs_err: np.ndarray
    test_abs_err: np.ndarray | None

    @property
    def val_mae(self) -> float:
        """Validation MAE in tokens."""
        return float(np.mean(self.val_abs_err))


def fit_and_score(method: str, params: dict, data, seed: int | None, test: bool = True) -> FitScore:
    """The one fit-on-train / score-on-validation step: build ``method`` with ``params`` (and ``seed``), fit it on
    ``data``'s train split (:func:`fit_predictor`, capped samples censored where supported) and score its clipped
    predictions (:func:`clipped_predict`) on validation and, with ``test``, on test.

    Args:
        data: a :class:`lenpred.dataset.EvalData` with its inputs provided.
    """
    train, val = data.index["train"], data.index["validation"]
    predictor = fit_predictor(method, params, data.rows("train"), data.y[train], data.censored[train], seed)
    val_abs_err = np.abs(clipped_predict(predictor, data.rows("validation")) - data.y[val])
    test_abs_err = np.abs(clipped_predict(predictor, data.rows("test")) - data.y[data.index["test"]]) if test else None
    return FitScore(predictor, val_abs_err, test_abs_err)


def one_se_choice(val_abs_errs: list[np.ndarray]) -> int:
    """The one-standard-error rule (Breiman et al. 1984, *Classification and Regression Trees* §3.4.3; Hastie,
    Tibshirani & Friedman, *The Elements of Statistical Learning* §7.10): the first candidate, in the grid's
    simplest-first order, whose validation MAE is at most the best MAE plus the standard error of the best's mean
    absolute error, ``std(|err_best|, ddof=1) / sqrt(n)``.

    Args:
        val_abs_errs: per candidate, ``(n,)`` float64 absolute validation errors in tokens (the same requests).

    Returns:
        the chosen candidate's index.

    Raises:
        LenpredError: no candidates, or fewer than 2 validation requests (no standard error).
    """
    if not val_abs_errs or len(val_abs_errs[0]) < 2:
        raise LenpredError("the one-standard-error choice needs candidates scored on >= 2 validation requests")
    maes = np.array([float(np.mean(e)) for e in val_abs_errs])
    best = int(np.argmin(maes))
    se = float(np.std(val_abs_errs[best], ddof=1) / np.sqrt(len(val_abs_errs[best])))
    return int(np.flatnonzero(maes <= maes[best] + se)[0])


def fit_with_validation(method: str, candidates: list[dict], data, seed: int) -> tuple[Any, dict, list[dict]]:
    """Fit every candidate on train with ``seed`` and keep :func:`one_se_choice`'s; a single candidate is fitted
    without looking at validation (``val_mae`` ``None``). Returns ``(fitted predictor, chosen params, sweep)``; each
    sweep row is a candidate's params with its ``val_mae``."""
    if len(candidates) == 1:
        train = data.index["train"]
        predictor = fit_predictor(method, candidates[0], data.rows("train"), data.y[train], data.censored[train], seed)
        sweep = [{**candidates[0], "val_mae": None}]
        return predictor, sweep[0], sweep
    fitted = [fit_and_score(method, params, data, seed, test=False)
              for params in tqdm(candidates, desc=f"{method} on validation", unit="candidate", leave=False)]
    sweep = [{**params, "val_mae": f.val_mae} for params, f in zip(candidates, fitted)]
    pick = one_se_choice([f.val_abs_err for f in fitted])
    return fitted[pick].predictor, sweep[pick], sweep


def tune_dependencies(method: str, data, ctx: TuningContext, seed: int) -> None:
    """Put in ``ctx.chosen`` the validation choice of every predictor ``method``'s ``param_grid`` reads
    (``tune_after``, e.g. ESTP's pooling for ``ltr``), tuning one not chosen yet now with ``seed`` — the choice its
    own :func:`tune_and_refit` with the same first seed makes. So a method's grid never depends on which methods ran
    before it, or whether they ran at all."""
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
