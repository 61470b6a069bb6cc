"""``LengthPredictor``: the serving model + the inputs its predictor reads + the fitted predictor + a calibrated
interval — trained once on a benchmark, saved, loaded, and called on new prompts.

A saved predictor is a directory (transformers style)::

    config.json             what it was trained with: model id and revision, layers, prompt rule, method and
                            hyper-parameters, interval calibration, training benchmark and its fingerprint, lenpred
                            version, and its test card (MAE per scenario with 95 % intervals, interval coverage)
    predictor.safetensors   the fitted head (:meth:`lenpred.predictors.Predictor.save`)
    CARD.md                 the same card for people

Loading it with another model revision or another prompt rule is an error that says so; so is predicting from
signals of other layers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from lenpred.backbone import load_backbone, recorded_model_name
from lenpred.errors import LenpredError
from lenpred.inputs.signals import signal_cache_path
from lenpred.intervals import conformal_margin, distribution_quantiles, interval_coverage, widened_interval
from lenpred.io import atomic_path
from lenpred.prompts import TEMPLATE_RULE, check_fits, prepare_prompt, prompt_text
from lenpred.online.refit import (TrafficRows, choose_finetune, finetune_head, fit_head, head_quantiles, rows_from_log,
                                   time_split)
from lenpred.online.traffic_log import read_traffic_log
from lenpred.tables import markdown_table
from lenpred.version import __version__

# The modules that import torch (predictors, tuning, dataset, truncated, inputs.cache, online.progressive) and
# scipy (metrics) are imported inside the methods: `import lenpred` and `LengthPredictor(...)` stay light, and bad
# input is reported before they load.

CONFIG_FILE, WEIGHTS_FILE, CARD_FILE = "config.json", "predictor.safetensors", "CARD.md"
PROGRESSIVE_FILE = "plp.safetensors"  # optional: the PLP head (lenpred progressive) for start / update
DEFAULT_PREDICTOR = Path(__file__).parent / "default_predictor"
"""The predictor that ships with the package: a soft-label head on SmolLM2-135M-Instruct's final prompt-token state
(layer 15, `last` pooling after the template prefix), trained on ForeLen; chosen on validation (see README)."""


@dataclass
class LengthPrediction:
    """Predicted output length of one request, in tokens (EOS excluded).

    Attributes:
        num_prompt_tokens: the chat-formatted prompt's length.
        expected: expected observed length, ``sum_j p_j min(c_j, cap)`` (what MAE is measured on).
        median: the distribution's median (interpolated between bins).
        low, high: the interval, calibrated on the validation split to hold ``coverage`` of responses (split
            conformal; see :mod:`lenpred.intervals`), clipped to ``[0, max_new_tokens]``.
        coverage: the nominal share of responses inside ``[low, high]``.
        max_new_tokens: the request's cap (``None``: uncapped).
        bin_values: ``(K,)`` the length each bin stands for (capped), or ``None`` for a point predictor.
        bin_probs: ``(K,)`` bin probabilities summing to 1, or ``None``.
    """

    num_prompt_tokens: int
    expected: float
    median: float
    low: float
    high: float
    coverage: float
    max_new_tokens: int | None = None
    bin_values: list[float] | None = None
    bin_probs: list[float] | None = None

    def to_dict(self, distribution: bool = False) -> dict[str, Any]:
        """JSON-able fields, rounded to 0.1 token (the bin distribution only with ``distribution``)."""
        out = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in asdict(self).items()
               if not k.startswith("bin_")}
        if distribution and self.bin_probs is not None:
            out |= {"bin_values": [round(v, 1) for v in self.bin_values], "bin_probs": [round(p, 4) for p in self.bin_probs]}
        return out


def raw_quantiles(predictor, requests: list, coverage: float, features: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(expected, median, low, high, probs, values)`` before calibration, tokens, ``(n,)`` each (``probs`` and
    ``values`` ``(n, K)``, ``None`` for a point predictor, whose median, low and high are its prediction).
    ``features`` ``(n, d)``: the predictor's input already computed (an engine's captured states), so the requests
    only give their caps."""
    from lenpred.tuning import clipped_predict
    from lenpred.predictors import max_new_tokens

    caps = max_new_tokens(requests)
    if features is None:
        expected = clipped_predict(predictor, requests)
    else:
        expected = np.clip(predictor.predict_features(features, caps), 0, caps)
    distribution = getattr(predictor, "predict_distribution", None)
    if distribution is None:
        return expected, expected, expected, expected, None, None
    probs, values = distribution(requests) if features is None else predictor.distribution_from_features(features, caps)
    tail = (1 - coverage) / 2
    q = distribution_quantiles(probs, values, (tail, 0.5, 1 - tail))
    return expected, q[:, 1], q[:, 0], q[:, 2], probs, values


class LengthPredictor:
    """Predict how many tokens the serving model will generate for a prompt, from its own prefill signals.

    scikit-learn style: ``__init__`` stores settings; :meth:`fit` tunes the method on a benchmark's validation split,
    calibrates the interval there and scores the test split (``card_``); :meth:`predict` takes prompts.

    Args:
        method: a registered predictor (``estp``, ``egtp``, ``mean``, ``trail``, ``scenario_median``, ...).
        model: the serving model: default alias, ``.gguf`` file, directory holding one, installed package shipping
            one, model directory or hub id (:func:`lenpred.backbone.resolve_model`); ``None``: the model the training
            benchmark was sampled from (its ``bench.json``).
        layers: hidden-state layers searched on validation (-1 = last); ``None``: half, three quarters and all of the
            model's depth (:func:`lenpred.signals.default_layers`; 15, 22, 30 on SmolLM2).
        coverage: nominal share of responses inside ``[low, high]``. A validation split too small for it (fewer
            than ``coverage / (1 - coverage)`` samples) gets the widest calibrated margin and a warning
            (:func:`lenpred.intervals.conformal_margin`).
        seed, epochs, binning, pool_span, semantic_divisor: see :class:`lenpred.studies.evaluate.EvalConfig`.
    """

    def __init__(self, method: str = "estp", model: str | None = None,
                 layers: tuple[int, ...] | None = None, coverage: float = 0.8, seed: int = 0, epochs: int = 150,
                 binning: str = "log", pool_span: str = "after_prefix", semantic_divisor: str = "n"):
        self.method, self.model, self.coverage = method, model, coverage
        self.layers = None if layers is None else tuple(layers)
        self.seed, self.epochs, self.binning = seed, epochs, binning
        self.pool_span, self.semantic_divisor = pool_span, semantic_divisor

    # ------------------------------------------------------------------ training

    def fit(self, bench: str | Path, data_dir: str | None = None, cache: str | None = None, backbone=None,
            threads: int | None = None) -> "LengthPredictor":
        """Tune on ``bench``'s validation split, refit, calibrate the interval on validation, score test.

        Raises:
            LenpredError: unknown method, a predictor that reads the model's self-report (PiA cannot predict new
                prompts without generating), bad settings, or any benchmark / data error.
        """
        from lenpred.bench.records import read_manifest
        from lenpred.dataset import load_dataset
        from lenpred.tuning import TuningSettings, check_run_settings, tune_and_refit, tuning_context
        from lenpred.predictors import PREDICTORS

        check_run_settings((self.method,), (self.seed,), threads)
        settings = TuningSettings(epochs=self.epochs, binning=self.binning, pool_span=self.pool_span,
                                  semantic_divisor=self.semantic_divisor)
        if "self_report" in PREDICTORS[self.method].inputs:
            raise LenpredError(f"'{self.method}' reads the model's own self-report, which needs a generation per "
                               "prompt: it cannot be a LengthPredictor; pick a method that reads signals or text")
        prepared = load_dataset(str(bench), set(PREDICTORS[self.method].inputs), model=self.model, backbone=backbone,
                                data_dir=data_dir, cache=cache, layers=self.layers, threads=threads)
        self.backbone_, data = prepared.backbone, prepared.data
        ctx = tuning_context(settings, prepared.layers, prepared.backbone.num_layers, prepared.values)
        run = tune_and_refit(self.method, data, ctx, (self.seed,))
        self.predictor_ = run.fitted
        _, _, low, high, _, _ = raw_quantiles(self.predictor_, data.rows("validation"), self.coverage)
        self.margin_ = conformal_margin(low, high, data.y[data.index["validation"]], self.coverage, strict=False)
        manifest = read_manifest(bench)
        self.config_ = {
            "method": self.method, "params": self.predictor_.params, "chosen_on_validation": run.chosen,
            "model_id": recorded_model_name(self.backbone_.model_id), "model_revision": self.backbone_.revision,
            "layers": self._layers_read(), "semantic": self._needs_attention(), "template_rule": _template_rule(),
            "coverage": self.coverage, "interval_margin": self.margin_, "training_benchmark": {
                "name": Path(bench).name, "plan_fingerprint": manifest["plan_fingerprint"],
                "num_records": prepared.table.num_rows, "dropped_duplicates": data.dropped_duplicates},
            "lenpred_version": _version()}
        self.card_ = self._test_card(data)
        return self

    def fit_traffic(self, log: str | Path, bench: str | Path | None = None, base: str | Path | None = None,
                    calibration_share: float = 0.1, test_share: float = 0.2, finetune: bool = False,
                    data_dir: str | None = None, cache: str | None = None, backbone=None,
                    threads: int | None = None) -> "LengthPredictor":
        """Refit ``base``'s head on logged traffic (:mod:`lenpred.online.traffic_log`), optionally mixed with a
        benchmark's train split; no model pass over the log (it holds the head's input features).

        The log is split in time (:func:`lenpred.online.refit.time_split`): the head is trained on the earliest
        requests (plus ``bench``'s train split), its interval calibrated on the next ``calibration_share`` and its
        card scored on the latest ``test_share``, beside ``base`` on the same requests. Censoring as in training.
        With ``finetune``, ``base``'s head is trained further instead of refitted from scratch (epochs and learning
        rate chosen on the training part's latest 20 %, :func:`lenpred.online.refit.choose_finetune`).
        ``base``'s method, layer, model and head hyper-parameters are kept (default: the shipped predictor); the
        settings given to ``__init__`` are replaced by ``base``'s.

        Raises:
            LenpredError: an unreadable or corrupt log (:func:`lenpred.online.traffic_log.read_traffic_log`), a log
                written for another model revision / layer / feature width than ``base``, a ``base`` that is not a
                pooled-head predictor, too few requests for the shares or the coverage.
        """
        base_p = LengthPredictor.from_pretrained(base, backbone=backbone, threads=threads)
        if not hasattr(base_p.predictor_, "head_") or not hasattr(base_p.predictor_, "features"):
            raise LenpredError(f"the base predictor's method '{base_p.method}' is not a pooled head: refit on traffic "
                               "needs one (last, mean, egtp, estp, ...)")
        traffic_log = read_traffic_log(log)
        _check_log_matches(traffic_log, base_p, log)
        rows = rows_from_log(traffic_log)
        train, cal, test = time_split(len(rows), calibration_share, test_share)
        parts = [rows.take(train)]
        bench_info = None
        if bench is not None:
            bench_rows, bench_info = bench_train_rows(base_p, bench, data_dir, cache)
            parts.append(bench_rows)
        fit_rows = TrafficRows.concat(parts)
        self.__dict__.update({k: v for k, v in base_p.__dict__.items() if not k.endswith("_")})  # base's settings
        self.backbone_ = base_p.backbone_
        params = base_p.predictor_.params
        self.predictor_ = type(base_p.predictor_)(**params)
        how = {"refit_of": str(base or "shipped predictor")}
        if finetune:
            epochs, lr, _ = choose_finetune(base_p.predictor_.head_, fit_rows, self.coverage, seed=params["seed"])
            head = base_p.predictor_.head_
            self.predictor_.head_ = finetune_head(head, fit_rows, epochs, lr, params["seed"]) if epochs else head
            how |= {"finetuned": {"epochs": epochs, "lr": lr}}
        else:
            self.predictor_.head_ = fit_head(fit_rows, params["head"], params["seed"])
        _, low, high = head_quantiles(self.predictor_.head_, rows.X[cal], rows.caps[cal], self.coverage)
        try:
            self.margin_ = conformal_margin(low, high, rows.y[cal], self.coverage)
        except LenpredError as exc:
            raise LenpredError(f"{exc} (the log's {len(rows)} requests give {len(cal)} to calibrate on): log more "
                               "requests or raise --calibration-share") from None
        c = traffic_log.columns
        self.config_ = {**{k: v for k, v in base_p.config_.items() if k in ("method", "params", "model_id",
                                                                           "model_revision", "layers", "semantic",
                                                                           "template_rule")},
                        "chosen_on_validation": how,
                        "coverage": self.coverage, "interval_margin": self.margin_,
                        "training_benchmark": bench_info,
                        "training_traffic": {
                            "log": str(log), "num_records": len(rows), "parts": len(traffic_log.parts),
                            "features_dtype": traffic_log.metadata["features_dtype"],
                            "first_finish_time_s": float(np.nanmin(c["finish_time_s"])),
                            "last_finish_time_s": float(np.nanmax(c["finish_time_s"])),
                            "num_train": len(train), "num_calibration": len(cal), "num_test": len(test),
                            "split": "time-ordered: train earliest, calibrate next, score latest"},
                        "lenpred_version": _version()}
        self.card_ = _traffic_card(self.predictor_.head_, base_p, rows.take(test), self.margin_, self.coverage)
        return self

    def _layers_read(self) -> list[int]:
        layer = self.predictor_.params.get("layer")
        return [] if layer is None else [int(layer)]

    def _needs_attention(self) -> bool:
        pooler = getattr(self.predictor_, "pooler", None)
        return bool(pooler is not None and pooler.needs_semantic_score)

    def _test_card(self, data) -> dict:
        """MAE per scenario with 95 % prompt-bootstrap intervals and interval coverage on the test split."""
        from lenpred.metrics import clustered_bootstrap

        test = data.index["test"]
        preds = self._predict_requests(data.rows("test"))
        y, scen, pid = data.y[test], data.cols["scenario"][test], data.cols["prompt_id"][test]
        expected, lows, highs = (np.array([getattr(p, k) for p in preds]) for k in ("expected", "low", "high"))
        card = {}
        for g in [*sorted(set(scen.tolist())), "overall"]:
            m = (scen == g) if g != "overall" else np.ones(len(y), bool)
            mae, lo, hi = clustered_bootstrap(np.abs(expected[m] - y[m]), pid[m])
            low, high = lows[m], highs[m]
            card[g] = {"n": int(m.sum()), "mae": mae, "mae_ci": [lo, hi],
                       "interval_coverage": interval_coverage(low, high, y[m]),
                       "mean_interval_width": float(np.mean(high - low))}
        return card

    # ------------------------------------------------------------------ prediction

    def predict(self, prompts: Iterable[str | list[dict[str, str]]], max_new_tokens: int | None = None,
                scenario: str | None = None, batch_tokens: int = 4096, progress: bool = False) -> list[LengthPrediction]:
        """Predict each prompt's output length.

        Args:
            prompts: plain strings (one user turn) or OpenAI-style message lists.
            max_new_tokens: the requests' generation cap (clips predictions and intervals); ``None``: uncapped.
            scenario: the workload name, for predictors that read it (the per-scenario floors).
            batch_tokens: padded prompt tokens per prefill batch.
            progress: show a progress bar.

        Raises:
            LenpredError: not fitted / loaded, a bad prompt, or a prompt that does not fit the context window.
        """
        requests = self._requests(prompts, max_new_tokens, scenario)
        if "signals" in self.predictor_.inputs:
            self._attach_signals(requests, batch_tokens, progress)
        return self._predict_requests(requests)

    def prepare(self, prompts: Iterable[str | list[dict[str, str]]], max_new_tokens: int | None = None,
                scenario: str | None = None, tokenizer=None) -> list:
        """Tokenise prompts into :class:`lenpred.predictors.Request` objects for :meth:`predict_prepared` (what
        :meth:`predict` does first), without touching the model: a server runs it in the request's own thread.

        Args:
            tokenizer: a copy of the backbone's tokenizer to use (``None``: the backbone's). A fast tokenizer is
                not safe to share between threads (``split_special_tokens`` is set on it per call), so concurrent
                callers pass one copy per thread.

        Raises:
            LenpredError: not fitted / loaded, a bad prompt, or a prompt that does not fit the context window.
        """
        return self._requests(prompts, max_new_tokens, scenario, tokenizer)

    def predict_prepared(self, requests: list, batch_tokens: int = 4096, truncated: bool = True,
                         prefix_cache=None) -> list[LengthPrediction]:
        """Predict :meth:`prepare`'s requests in one go; with ``truncated`` a predictor that reads one layer's hidden
        states only runs the truncated forward (:mod:`lenpred.truncated`: no later layers, no LM head), which gives
        :meth:`predict`'s predictions. Other predictors run :meth:`predict`'s path. ``prefix_cache`` (a
        :class:`lenpred.truncated.PrefixCache`, truncated path only): the template's fixed prefix is computed once.

        Raises:
            LenpredError: as :meth:`predict`.
        """
        from lenpred.truncated import attach_truncated_signals, truncated_plan

        plan = truncated_plan(self) if truncated else None
        if plan is not None:
            attach_truncated_signals(self.backbone_, requests, plan, batch_tokens, prefix_cache)
        elif "signals" in self.predictor_.inputs:
            self._attach_signals(requests, batch_tokens, False)
        return self._predict_requests(requests)

    def _requests(self, prompts, max_new_tokens: int | None, scenario: str | None, tokenizer=None) -> list:
        """Prompts -> :class:`lenpred.predictors.Request` through the one prompt path (:mod:`lenpred.prompts`)."""
        from lenpred.predictors import Request

        if not hasattr(self, "predictor_"):
            raise LenpredError("this LengthPredictor is not fitted: call fit(bench) or LengthPredictor.from_pretrained")
        tok, window = tokenizer or self.backbone_.tokenizer, self.backbone_.context_window
        requests = []
        for i, p in enumerate(prompts):
            try:
                prepared = prepare_prompt(tok, p)
            except LenpredError as exc:
                raise LenpredError(f"prompt {i} (counting from 0): {exc}") from None
            check_fits(prepared.num_prompt_tokens, max_new_tokens or 0, window, what=f"prompt {i}")
            messages = [{"role": "user", "content": p}] if isinstance(p, str) else p
            requests.append(Request(str(i), list(prepared.token_ids), prompt_text(messages),
                                    content_span=(prepared.content_start, prepared.content_end),
                                    max_new_tokens=max_new_tokens, scenario=scenario))
        return requests

    # ------------------------------------------------------------------ progressive (online) prediction

    def attach_progressive(self, path: str | Path) -> "LengthPredictor":
        """Add a PLP head written by ``lenpred progressive`` (``plp.safetensors``); it must read this predictor's
        prompt representation (same method and layer) and this model.

        Raises:
            LenpredError: unreadable, or trained on another prompt representation or model revision."""
        from lenpred.online.progressive import load_plp

        plp, info = load_plp(path)
        mine = f"{self.method}@{self.predictor_.params.get('layer')}"
        if info.get("prompt") != mine or info.get("model_revision") != self.config_["model_revision"]:
            raise LenpredError(f"{path} reads prompt representation {info.get('prompt')} of model revision "
                               f"{info.get('model_revision')}, this predictor is {mine} on "
                               f"{self.config_['model_revision']}: "
                               "train the PLP head on this predictor's representation (`lenpred progressive`)")
        self.progressive_, self.progressive_info_ = plp, info
        return self

    def start(self, prompts: Iterable[str | list[dict[str, str]]], max_new_tokens: int | None = None) -> list:
        """Prefill each prompt and return its online state (:class:`lenpred.online.progressive.RequestState`) with
        the first remaining-length estimate (PLP at decode step 0, from the prefill's signals).

        Raises:
            LenpredError: no progressive head attached, or a bad prompt."""
        from lenpred.online.progressive import start_states

        if not hasattr(self, "progressive_"):
            raise LenpredError("this LengthPredictor has no progressive head: attach_progressive('plp.safetensors') "
                               "from a `lenpred progressive` run")
        requests = self._requests(prompts, max_new_tokens, None)
        self._attach_signals(requests, 4096, False)
        final = self.progressive_info_["plp_layer"]
        states = np.stack([r.signals.last_token_states[final].numpy() for r in requests])
        caps = np.full(len(requests), np.inf if max_new_tokens is None else float(max_new_tokens))
        return start_states(self.progressive_, self.predictor_.features(requests), states, caps)

    def update(self, states: list, steps, hidden_states) -> np.ndarray:
        """Re-estimate the remaining tokens of running requests: ``steps`` ``(B,)`` tokens generated, ``hidden_states``
        ``(B, d)`` each current token's hidden state at the layer in ``progressive_info_['plp_layer']``. ``(B,)`` float64 (see
        :func:`lenpred.online.progressive.update_batch`)."""
        from lenpred.online.progressive import update_batch

        if not hasattr(self, "progressive_"):
            raise LenpredError("this LengthPredictor has no progressive head: attach_progressive(...) first")
        return update_batch(self.progressive_, states, steps, hidden_states)

    def _attach_signals(self, requests: list, batch_tokens: int, progress: bool) -> None:
        from tqdm.auto import tqdm

        from lenpred.inputs.cache import token_batches
        from lenpred.signals import extract_signals

        layers = tuple(self.config_["layers"]) or (self.backbone_.num_layers,)
        batches = token_batches([r.num_prompt_tokens for r in requests], batch_tokens)
        for batch in tqdm(batches, desc="prefill signals", unit="batch", disable=not progress):
            signals = extract_signals(self.backbone_, [requests[i].token_ids for i in batch], layers,
                                      self.config_["semantic"])
            for i, s in zip(batch, signals):
                requests[i].signals = s

    @property
    def engine_layer(self) -> int | None:
        """The hidden-state index (0 = embeddings, ``L`` = the final norm's output) whose **last prompt token**
        state is this predictor's whole input, so that a serving engine can capture it during its own prefill
        (:meth:`predict_states`); ``None`` when the predictor reads more (pooling over tokens, entropy, attention,
        text). Today: ``last`` pooling over a span that ends at the prompt's end, and ``trail``."""
        if not hasattr(self, "predictor_"):
            raise LenpredError("this LengthPredictor is not fitted: call fit(bench) or LengthPredictor.from_pretrained")
        params = self.predictor_.params
        last = self.method == "last" and params.get("pool_span") != "content"
        if not (last or self.method == "trail") or params.get("layer") is None:
            return None
        return int(params["layer"])

    def predict_states(self, states: np.ndarray, num_prompt_tokens, max_new_tokens) -> list[LengthPrediction]:
        """Predict from the last prompt token's hidden states an engine captured in its own prefill: no model pass.

        Args:
            states: ``(n, d)`` float32, each request's residual-stream state at :attr:`engine_layer` at its final
                prompt token (HF ``output_hidden_states[engine_layer][:, -1]``).
            num_prompt_tokens: ``(n,)`` prompt lengths (reported only).
            max_new_tokens: ``(n,)`` caps in tokens (``None``: uncapped).

        Raises:
            LenpredError: the predictor reads more than that state (:attr:`engine_layer` is ``None``), or the
                states' shape is not ``(n, d)`` with the head's ``d``.
        """
        from lenpred.predictors import Request

        if self.engine_layer is None:
            raise LenpredError(f"predictor '{self.method}' reads more than one last-token state: an engine cannot "
                               "feed it from its prefill; use a `last` or `trail` predictor")
        states = np.asarray(states, np.float32)
        width = len(self.predictor_.head_.mean_)
        if states.ndim != 2 or states.shape[1] != width or len(states) != len(max_new_tokens):
            raise LenpredError(f"predict_states needs ({len(max_new_tokens)}, {width}) states, got {states.shape}")
        requests = [Request(str(i), [0] * int(n), max_new_tokens=cap)
                    for i, (n, cap) in enumerate(zip(num_prompt_tokens, max_new_tokens))]
        return self._predict_requests(requests, states)

    def _predict_requests(self, requests: list, features: np.ndarray | None = None) -> list[LengthPrediction]:
        for r in requests:  # signals of other layers than the predictor was trained on: refused
            if r.signals is not None and not set(self.config_["layers"]) <= set(r.signals.layers):
                raise LenpredError(f"signals hold layers {list(r.signals.layers)} but this predictor reads layers "
                                   f"{self.config_['layers']}: extract them at its layers")
        expected, median, low, high, probs, values = raw_quantiles(self.predictor_, requests, self.coverage, features)
        out = []
        for i, r in enumerate(requests):
            cap = np.inf if r.max_new_tokens is None else r.max_new_tokens
            out.append(LengthPrediction(
                r.num_prompt_tokens, float(expected[i]), float(min(median[i], cap)),
                *widened_interval(low[i], high[i], self.margin_, cap), self.coverage,
                r.max_new_tokens, None if probs is None else values[i].tolist(),
                None if probs is None else probs[i].tolist()))
        return out

    # ------------------------------------------------------------------ persistence

    def save_pretrained(self, path: str | Path) -> Path:
        """Write ``config.json``, ``predictor.safetensors`` and ``CARD.md`` into the directory ``path``, atomically
        (an existing directory is replaced whole). Returns the path."""
        if not hasattr(self, "predictor_"):
            raise LenpredError("nothing to save: fit the LengthPredictor first")
        with atomic_path(path) as tmp:
            tmp.mkdir()
            self.predictor_.save(tmp / WEIGHTS_FILE)
            settings = {k: getattr(self, k) for k in ("method", "model", "layers", "coverage", "seed", "epochs",
                                                       "binning", "pool_span", "semantic_divisor")}
            (tmp / CONFIG_FILE).write_text(json.dumps({**self.config_, "settings": settings, "card": self.card_},
                                                      indent=2) + "\n")
            (tmp / CARD_FILE).write_text(render_card(self.config_, self.card_))
            if hasattr(self, "progressive_"):
                from lenpred.online.progressive import save_plp

                save_plp(self.progressive_, tmp / PROGRESSIVE_FILE, self.progressive_info_)
        return Path(path)

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, backbone=None, threads: int | None = None,
                        load_model: bool = True) -> "LengthPredictor":
        """Load a directory written by :meth:`save_pretrained` (default: the predictor that ships with lenpred).

        Args:
            backbone: an already loaded :class:`lenpred.backbone.Backbone` (default: load the model the predictor was
                trained with).
            load_model: ``False`` loads the head alone (no backbone, no tokenizer): for an engine that feeds it its
                own states (:meth:`predict_states`); check the served model with :meth:`check_model_revision`.

        Raises:
            LenpredError: the directory is not a saved predictor, or the model / prompt rule differs from training.
        """
        from lenpred.predictors import Predictor

        path = Path(path) if path is not None else DEFAULT_PREDICTOR
        try:
            config = json.loads((path / CONFIG_FILE).read_text())
            settings = config["settings"]
        except (OSError, ValueError, KeyError) as exc:
            raise LenpredError(f"{path} is not a saved LengthPredictor ({type(exc).__name__}: no readable "
                               f"{CONFIG_FILE}); train one with `lenpred train`") from None
        if config.get("template_rule") != _template_rule():
            raise LenpredError(f"{path} was trained with prompt rule {config.get('template_rule')!r}, this lenpred uses "
                               f"{_template_rule()!r}: retrain it with `lenpred train`")
        self = cls(**{k: tuple(v) if k == "layers" and v is not None else v for k, v in settings.items()})
        self.config_ = {k: v for k, v in config.items() if k not in ("settings", "card")}
        if load_model or backbone is not None:
            self.backbone_ = backbone or load_backbone(config["model_id"], num_threads=threads)
            self.check_model_revision(self.backbone_.revision, self.backbone_.model_id, path)
        self.predictor_ = Predictor.load(path / WEIGHTS_FILE)
        if self.predictor_.registry_name != config["method"]:
            raise LenpredError(f"{path / WEIGHTS_FILE} holds '{self.predictor_.registry_name}', config.json says "
                               f"'{config['method']}': the directory is mixed up; retrain it")
        self.margin_, self.card_ = float(config["interval_margin"]), config.get("card", {})
        if (path / PROGRESSIVE_FILE).exists():
            self.attach_progressive(path / PROGRESSIVE_FILE)
        return self

    def check_model_revision(self, revision: str, model: str = "", where: str | Path = "this predictor") -> None:
        """Refuse a model other than the one this predictor was trained on.

        Raises:
            LenpredError: ``revision`` differs from the recorded ``model_revision`` (the message names both)."""
        if revision != self.config_["model_revision"]:
            raise LenpredError(f"{where} was trained on {self.config_['model_id']} revision "
                               f"{self.config_['model_revision']}, but the model given is {model} revision {revision}: its "
                               "signals differ; retrain with `lenpred train --model ...`")


def _check_log_matches(traffic_log, base: "LengthPredictor", path) -> None:
    """A log's features must be what ``base`` reads: same width, and (when the writer recorded them) the same model
    revision, method and layers."""
    meta, width = traffic_log.metadata, len(base.predictor_.head_.mean_)
    if int(meta["feature_dim"]) != width:
        raise LenpredError(f"traffic log {path} holds {meta['feature_dim']}-wide features, the base predictor reads "
                           f"{width}: log the base predictor's features, or pass the --base it was served with")
    for key, mine in (("model_revision", base.config_["model_revision"]), ("method", base.method),
                      ("layers", json.dumps(base.config_["layers"]))):
        if key in meta and meta[key] != str(mine):
            raise LenpredError(f"traffic log {path} was written for {key} {meta[key]}, the base predictor has {mine}: "
                               "pass the --base predictor that served the logged traffic")


def bench_train_rows(base: "LengthPredictor", bench, data_dir, cache):
    """``(TrafficRows, info)``: ``bench``'s train split pooled as ``base`` pools (signals from the signal cache)."""
    from lenpred.bench.records import read_manifest
    from lenpred.dataset import load_eval_data
    from lenpred.inputs.cache import extract_cached

    layers = tuple(base.config_["layers"])
    data = load_eval_data(bench, base.backbone_.tokenizer, data_dir)
    train = data.index["train"]
    ids = list(dict.fromkeys(data.cols["prompt_id"][train].tolist()))
    cache = Path(cache) if cache else signal_cache_path(base.backbone_, bench, layers)
    signals = extract_cached(base.backbone_, {p: data.by_prompt[p].token_ids for p in ids}, layers, cache,
                             semantic=base.config_["semantic"])
    for p in ids:
        data.by_prompt[p].signals = signals[p]
    requests = data.rows("train")
    rows = TrafficRows(base.predictor_.features(requests), data.y[train], data.censored[train],
                       data.cols["max_new_tokens"][train].astype(np.float64), data.cols["prompt_id"][train].astype(object),
                       np.full(len(train), "bench", dtype=object))
    info = {"name": Path(bench).name, "plan_fingerprint": read_manifest(bench)["plan_fingerprint"],
            "num_records": len(train), "split": "train", "dropped_duplicates": data.dropped_duplicates}
    return rows, info


def _traffic_card(head, base: "LengthPredictor", test, margin: float, coverage: float) -> dict:
    """The card of a traffic refit, on the latest logged requests: MAE with a 95 % interval clustered by prompt
    (SHA-256 where logged), interval coverage and width, and the paired MAE difference to ``base``."""
    from lenpred.metrics import clustered_bootstrap

    if len(test) < 2:
        return {}
    expected, low, high = head_quantiles(head, test.X, test.caps, coverage)
    base_expected = head_quantiles(base.predictor_.head_, test.X, test.caps, coverage)[0]
    low, high = widened_interval(low, high, margin, test.caps)
    err, base_err = np.abs(expected - test.y), np.abs(base_expected - test.y)
    mae, lo, hi = clustered_bootstrap(err, test.groups.astype(str))
    diff = clustered_bootstrap(err - base_err, test.groups.astype(str))
    return {"latest traffic": {"n": len(test), "mae": mae, "mae_ci": [lo, hi],
                               "interval_coverage": interval_coverage(low, high, test.y),
                               "mean_interval_width": float(np.mean(high - low)),
                               "base_mae": float(base_err.mean()), "mae_minus_base": list(diff)}}


def render_card(config: dict, card: dict) -> str:
    """The Markdown card of a saved predictor: what it is, how it was trained, its test scores."""
    lines = [f"# lenpred predictor: {config['method']} on {config['model_id']}", "",
             f"* model revision `{config['model_revision']}`, layers {config['layers']}, prompt rule "
             f"`{config['template_rule']}`, lenpred {config['lenpred_version']}", *_data_lines(config), ""]
    rows = [[g, c["n"], f"{c['mae']:.1f}",
             "–" if c["mae_ci"][0] is None else f"[{c['mae_ci'][0]:.1f}, {c['mae_ci'][1]:.1f}]",
             f"{c['interval_coverage']:.3f}", f"{c['mean_interval_width']:.0f}"] for g, c in card.items()]
    lines.append(markdown_table(["test group", "samples", "MAE (tokens)", "95 % CI", "interval coverage",
                                 "mean interval width"], rows, "lrrrrr"))
    for g, c in card.items():
        if "base_mae" in c:
            d = c["mae_minus_base"]
            ci = "" if d[1] is None else f" [{d[1]:+.1f}, {d[2]:+.1f}]"
            lines.append(f"\nOn the {g} ({c['n']} requests) the predictor it was refitted from has MAE "
                         f"{c['base_mae']:.1f}: difference {d[0]:+.1f}{ci} tokens (paired, prompt-clustered 95 % interval).")
    return "\n".join(lines) + "\n"


def _data_lines(config: dict) -> list[str]:
    """The card's lines on where a predictor's training data came from: a benchmark, logged traffic, or both."""
    bench, traffic = config.get("training_benchmark"), config.get("training_traffic")
    lines = []
    if bench is not None:
        what = f"`{bench['name']}` (plan `{bench['plan_fingerprint']}`, {bench['num_records']} records"
        if traffic is None:
            lines.append(f"* trained on {what}; duplicates across splits dropped: {bench['dropped_duplicates']}), "
                         f"hyper-parameters chosen on its validation split: "
                         f"`{json.dumps({k: v for k, v in config['chosen_on_validation'].items()})}`")
        else:
            lines.append(f"* mixed into training: benchmark {what} of its {bench.get('split', 'train')} split)")
    if traffic is not None:
        lines.append(f"* trained on logged traffic `{traffic['log']}`: {traffic['num_records']} finished requests "
                     f"({traffic['parts']} part{'' if traffic['parts'] == 1 else 's'}, {traffic['features_dtype']} features), split in time: the earliest "
                     f"{traffic['num_train']} train, the next {traffic['num_calibration']} calibrate the interval, the "
                     f"latest {traffic['num_test']} are scored below; "
                     + (f"fine-tuned from {config['chosen_on_validation'].get('refit_of')} "
                        f"({json.dumps(config['chosen_on_validation']['finetuned'])}, chosen on the training part's "
                        "latest 20 %)" if "finetuned" in config["chosen_on_validation"] else
                        f"hyper-parameters of {config['chosen_on_validation'].get('refit_of')}"))
    where = "the logged calibration requests" if traffic is not None else "validation"
    lines.append(f"* interval: nominal {config['coverage']:.0%} coverage, split-conformal margin "
                 f"{config['interval_margin']:.1f} tokens (calibrated on {where})")
    return lines


def _template_rule() -> str:
    return TEMPLATE_RULE


def _version() -> str:
    return __version__
