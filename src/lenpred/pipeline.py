"""``LengthPredictor``: the serving model + the inputs its predictor reads + the fitted predictor + a calibrated
interval — trained once on a benchmark, saved, loaded, and called on new prompts.

A saved predictor is a directory (transformers style)::

    config.json             what it was trained with (:class:`lenpred.predictor_config.PredictorConfig`: model id and
                            revision, layers, prompt rule, method and hyper-parameters, interval calibration, training
                            benchmark and its fingerprint, lenpred version), its settings and its test card (MAE per
                            scenario with 95 % intervals, interval coverage)
    predictor.safetensors   the fitted head (:meth:`lenpred.predictors.Predictor.save`)
    CARD.md                 the same card for people
    plp.safetensors         optional: the progressive (PLP) head, loaded on first use (:meth:`LengthPredictor.start`)

Two ways in, scikit-learn style: :meth:`LengthPredictor.predict` takes prompts (or :meth:`~LengthPredictor.prepare`'s
tokenised requests) and runs the cheapest forward that feeds the predictor — the truncated prefill
(:mod:`lenpred.truncated`) when it reads one layer's hidden states only (the shipped ``last@15``), the full prefill
when it reads entropy or attention (:meth:`lenpred.predictors.Predictor.reads` says which); and
:meth:`LengthPredictor.predict_states` takes the states an engine captured in its own prefill (no model pass). Both
end in ONE head pass -> distribution -> expected / median / interval (:mod:`lenpred.prediction`). PLP re-estimates
during decoding: :meth:`~LengthPredictor.start`, :meth:`~LengthPredictor.update` (:mod:`lenpred.predictor_progressive`).

Loading it with another model revision or another prompt rule is an error that says so.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Iterable

import numpy as np

from lenpred.backbone import load_backbone
from lenpred.errors import LenpredError
from lenpred.intervals import conformal_margin
from lenpred.io import atomic_path
from lenpred.prediction import HeadOutput, LengthPrediction, head_pass, length_predictions
from lenpred.predictor_card import card_from_test_split, render_card
from lenpred.predictor_config import CONFIG_FILE, PredictorConfig, TrainingBenchmark, checked_settings, read_config
from lenpred.predictor_progressive import PROGRESSIVE_FILE, ProgressiveMixin

__all__ = ["CONFIG_FILE", "DEFAULT_PREDICTOR", "PROGRESSIVE_FILE", "LengthPrediction", "LengthPredictor",
           "render_card"]

# The modules that import torch (predictors, tuning, dataset, truncated, inputs.cache, online.progressive) and
# scipy (metrics) are imported inside the methods: `import lenpred` and `LengthPredictor(...)` stay light, and bad
# input is reported before they load.

WEIGHTS_FILE, CARD_FILE = "predictor.safetensors", "CARD.md"
DEFAULT_PREDICTOR = Path(__file__).parent / "default_predictor"
"""The predictor that ships with the package: a soft-label head on SmolLM2-135M-Instruct's final prompt-token state
(layer 15, `last` pooling after the template prefix), trained on ForeLen; chosen on validation (see README)."""


class LengthPredictor(ProgressiveMixin):
    """Predict how many tokens the serving model will generate for a prompt, from its own prefill signals.

    scikit-learn style: ``__init__`` stores settings (:meth:`get_params`); :meth:`fit` loads a benchmark and
    :meth:`fit_dataset` tunes the method on its validation split, calibrates the interval there and scores the test
    split (``card_``); :meth:`from_traffic` refits a served predictor on its logged traffic; :meth:`predict` takes
    prompts.

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

    Fitted attributes: ``predictor_`` (the fitted :class:`lenpred.predictors.Predictor`; its ``n_features_in_`` is
    the width of the states :meth:`predict_states` takes), ``margin_`` (the interval margin, tokens), ``config_``
    (:class:`lenpred.predictor_config.PredictorConfig`), ``card_`` (the test card), ``backbone_`` (the model; absent
    when loaded with ``load_model=False``); ``progressive_`` with a PLP head (:class:`ProgressiveMixin`).
    """

    def __init__(self, method: str = "estp", model: str | None = None,
                 layers: tuple[int, ...] | None = None, coverage: float = 0.8, seed: int = 0, epochs: int = 150,
                 binning: str = "log", pool_span: str = "after_prefix", semantic_divisor: str = "n"):
        self.method, self.model, self.coverage = method, model, coverage
        self.layers = None if layers is None else tuple(layers)
        self.seed, self.epochs, self.binning = seed, epochs, binning
        self.pool_span, self.semantic_divisor = pool_span, semantic_divisor

    @classmethod
    def param_names(cls) -> list[str]:
        """The ``__init__`` arguments, read from its signature (saved as ``config.json``'s ``settings``)."""
        return [name for name in inspect.signature(cls.__init__).parameters if name != "self"]

    def get_params(self) -> dict:
        """The settings given to ``__init__`` as stored (scikit-learn's ``get_params``)."""
        return {name: getattr(self, name) for name in self.param_names()}

    # ------------------------------------------------------------------ training

    def fit(self, bench: str | Path, data_dir: str | None = None, cache: str | None = None, backbone=None,
            threads: int | None = None) -> "LengthPredictor":
        """Load ``bench`` with the serving model and the inputs the method reads (all the I/O:
        :func:`lenpred.dataset.load_dataset`), then :meth:`fit_dataset` on it.

        Raises:
            LenpredError: as :meth:`fit_dataset` (checked before anything loads), or any benchmark / data error.
        """
        from lenpred.dataset import load_dataset
        from lenpred.predictors import required_inputs

        self._checked_settings(threads)  # before the model loads
        dataset = load_dataset(str(bench), required_inputs((self.method,)), model=self.model, backbone=backbone,
                               data_dir=data_dir, cache=cache, layers=self.layers, threads=threads)
        return self.fit_dataset(dataset)

    def fit_dataset(self, dataset) -> "LengthPredictor":
        """Tune on ``dataset``'s validation split, refit, calibrate the interval on validation, score test; no file is
        read and no model loaded here (scikit-learn's ``fit``).

        Args:
            dataset: a :class:`lenpred.dataset.Dataset` holding the inputs the method reads
                (:func:`lenpred.predictors.required_inputs`), as :func:`lenpred.dataset.load_dataset` gives.

        Raises:
            LenpredError: unknown method, a predictor that reads the model's self-report (PiA cannot predict new
                prompts without generating), bad settings, or inputs missing from ``dataset``.
        """
        from lenpred.tuning import tune_and_refit, tuning_context

        data, settings = dataset.data, self._checked_settings()
        ctx = tuning_context(settings, dataset.layers, dataset.backbone.num_layers, dataset.values)
        run = tune_and_refit(self.method, data, ctx, (self.seed,))
        self.backbone_, self.predictor_ = dataset.backbone, run.fitted
        _, low, high = self._head_pass(data.rows("validation")).quantiles(self.coverage)
        self.margin_ = conformal_margin(low, high, data.y[data.index["validation"]], self.coverage, strict=False)
        benchmark = TrainingBenchmark(dataset.bench_name, dataset.plan_fingerprint, dataset.table.num_rows,
                                      data.dropped_duplicates)
        self.config_ = PredictorConfig.from_fit(self.method, self.predictor_, run.chosen, self.backbone_, self.coverage,
                                                self.margin_, benchmark)
        rows, test = data.rows("test"), data.index["test"]  # signals from the benchmark's cache: no forward here
        self.card_ = card_from_test_split(self._predictions(rows, self._head_pass(rows)), data.y[test],
                                          data.cols["scenario"][test], data.cols["prompt_id"][test])
        return self

    def _checked_settings(self, threads: int | None = None):
        """The tuner's settings (:class:`lenpred.tuning.TuningSettings`), after refusing an unknown method, bad seed,
        threads or settings, and a predictor that reads the model's self-report."""
        from lenpred.predictors import make_predictor
        from lenpred.tuning import TuningSettings, check_run_settings

        check_run_settings((self.method,), (self.seed,), threads)
        settings = TuningSettings(epochs=self.epochs, binning=self.binning, pool_span=self.pool_span,
                                  semantic_divisor=self.semantic_divisor)
        if make_predictor(self.method).reads().self_report:
            raise LenpredError(f"'{self.method}' reads the model's own self-report, which needs a generation per "
                               "prompt: it cannot be a LengthPredictor; pick a method that reads signals or text")
        return settings

    @classmethod
    def from_traffic(cls, log: str | Path, bench: str | Path | None = None, base: str | Path | None = None,
                     calibration_share: float = 0.1, test_share: float = 0.2, finetune: bool = False,
                     data_dir: str | None = None, cache: str | None = None, backbone=None,
                     threads: int | None = None, incumbent: str | Path | None = None) -> "LengthPredictor":
        """A predictor whose head is ``base``'s refitted on the traffic log ``log`` (:mod:`lenpred.online.traffic_log`;
        no model pass: it holds the head's input), optionally mixed with ``bench``'s train split; ``base``'s
        settings, method, layer, model and head hyper-parameters are kept (default: the shipped predictor). The log is
        split in time (train earliest, calibrate the next ``calibration_share``, score the latest ``test_share``);
        ``finetune`` trains ``base``'s head further instead. Details: :func:`lenpred.traffic_refit.refit_on_traffic`.

        A log captured with no head (:mod:`lenpred.online.capture`; the plug-in's ``predictor: "none"``) and no
        ``base`` gives the model's first head, from the log alone: its pooling and layer, this class's default
        settings (coverage 0.8, the shipped head's hyper-parameters), no backbone loaded
        (:func:`lenpred.traffic_refit.first_head_on_traffic`). ``incumbent``: a saved predictor now in service,
        scored beside the new head on the card (what ``lenpred train --traffic`` compares before saving over it).

        Raises:
            LenpredError: an unreadable or corrupt log, a log written for another model revision / layer / feature
                width than ``base`` (or ``incumbent``), a ``base`` that is not a pooled head, ``bench`` or
                ``finetune`` with a log captured with no head and no ``base``, too few requests for the shares or
                coverage.
        """
        from lenpred.online.capture import is_headless
        from lenpred.online.traffic_log import read_traffic_log
        from lenpred.traffic_refit import first_head_on_traffic, refit_on_traffic

        inc = None if incumbent is None else cls.from_pretrained(incumbent, load_model=False)
        traffic_log = read_traffic_log(log)  # read once: which kind of log, then the refit
        if base is None and is_headless(traffic_log.metadata):
            if bench is not None or finetune:
                raise LenpredError(f"traffic log {log} was captured with no head: its first head trains on the log "
                                   "alone (no --bench, no --finetune); to mix in a benchmark of this model, pass a "
                                   "--base predictor trained on it")
            self = cls()
            refit = first_head_on_traffic(log, {"epochs": self.epochs, "binning": self.binning}, self.coverage,
                                          calibration_share, test_share, self.seed, inc, traffic_log)
            self.method, self.model = refit.config.method, refit.config.model_id
            self.layers = tuple(refit.config.layers)
        else:
            # the model is loaded only to pool a benchmark's train split; the log holds the head's input
            base_p = cls.from_pretrained(base, backbone=backbone, threads=threads,
                                         load_model=bench is not None or backbone is not None)
            refit = refit_on_traffic(base_p, log, bench, None if base is None else str(base), calibration_share,
                                     test_share, finetune, data_dir, cache, inc, traffic_log)
            self = cls(**base_p.get_params())
            if hasattr(base_p, "backbone_"):
                self.backbone_ = base_p.backbone_
        self.predictor_, self.margin_ = refit.predictor, refit.margin
        self.config_, self.card_ = refit.config, refit.card
        return self

    # ------------------------------------------------------------------ prompts in

    def prepare(self, prompts: Iterable[str | list[dict[str, str]]], max_new_tokens: int | None = None,
                scenario: str | None = None, tokenizer=None) -> list:
        """Tokenise prompts into :class:`lenpred.predictors.Request` objects for :meth:`predict` (what it does first),
        without touching the model: a server runs it in the request's own thread.

        Args:
            tokenizer: a copy of the backbone's tokenizer to use (``None``: the backbone's). A fast tokenizer is
                not safe to share between threads (``split_special_tokens`` is set on it per call), so concurrent
                callers pass one copy per thread.

        Raises:
            LenpredError: not fitted / loaded, a bad prompt, or a prompt that does not fit the context window.
        """
        from lenpred.predictors.registry import prompt_requests

        self._check_fitted()
        return prompt_requests(tokenizer or self.backbone_.tokenizer, self.backbone_.context_window, prompts,
                               max_new_tokens, scenario)

    def _check_fitted(self) -> None:
        if not hasattr(self, "predictor_"):
            raise LenpredError("this LengthPredictor is not fitted: call fit(bench) or LengthPredictor.from_pretrained")

    def predict(self, prompts: Iterable[str | list[dict[str, str]]] | list, max_new_tokens: int | None = None,
                scenario: str | None = None, batch_tokens: int = 4096, progress: bool = False, *,
                truncated: bool = True, prefix_cache=None, return_features: bool = False):
        """Predict each prompt's output length: tokenise (:meth:`prepare`), run the cheapest forward that gives the
        predictor's input, then one head pass (:mod:`lenpred.prediction`).

        The forward: a predictor that reads one layer's hidden states only (``last``, ``mean``, ``max``, TRAIL; the
        shipped ``last@15``) gets the truncated prefill, which stops after that layer (:mod:`lenpred.truncated`: no
        later layers, no LM head; equal to the full prefill's predictions to float32 rounding); one that reads
        entropy or attention (EGTP, ESTP, ...) the full prefill at its layer (:func:`lenpred.signals.extract_signals`);
        a text or prompt-length predictor none.

        Args:
            prompts: plain strings (one user turn) or OpenAI-style message lists; or the requests :meth:`prepare`
                returned (their own caps and scenario apply: leave ``max_new_tokens`` and ``scenario`` unset).
            max_new_tokens: the requests' generation cap (clips predictions and intervals); ``None``: uncapped.
            scenario: the workload name, for predictors that read it (the per-scenario floors).
            batch_tokens: padded prompt tokens per prefill batch.
            progress: show a progress bar.
            truncated: ``False`` runs the full prefill whatever the predictor reads.
            prefix_cache: a :class:`lenpred.truncated.PrefixCache` computing the chat template's fixed prefix once
                across calls (truncated forward only; a server keeps one).
            return_features: also return the head's input ``(n, d)`` float32 (a pooled-head predictor only), as
                scikit-learn's ``return_std``: what a traffic log stores.

        Returns:
            One :class:`LengthPrediction` per prompt, in order; with ``return_features``, ``(predictions, features)``.

        Raises:
            LenpredError: not fitted / loaded, a bad prompt, a prompt that does not fit the context window, caps given
                beside prepared requests, or ``return_features`` for a predictor whose head reads no features.
        """
        from lenpred.predictors import Request

        prompts = list(prompts)
        if prompts and all(isinstance(p, Request) for p in prompts):
            if max_new_tokens is not None or scenario is not None:
                raise LenpredError("prepared requests carry their own max_new_tokens and scenario: pass them to "
                                   "prepare(), not predict()")
            requests = prompts
        else:
            requests = self.prepare(prompts, max_new_tokens, scenario)
        if return_features and not self.predictor_.reads().features:
            raise LenpredError(f"predictor '{self.method}' has no feature head: return_features needs a pooled head "
                               "(last, mean, egtp, estp, trail, ...)")
        self._attach_states(requests, batch_tokens, truncated, prefix_cache, progress)
        features = self.predictor_.features(requests) if return_features else None
        predictions = self._predictions(requests, self._head_pass(requests, features))
        return (predictions, features) if return_features else predictions

    def _attach_states(self, requests: list, batch_tokens: int = 4096, truncated: bool = True, prefix_cache=None,
                       progress: bool = False) -> None:
        """Set the requests' ``signals`` by the cheapest forward that gives what the predictor reads (see
        :meth:`predict`: :func:`lenpred.truncated.attach_prefill_signals`)."""
        from lenpred.truncated import attach_prefill_signals

        attach_prefill_signals(self.backbone_, requests, self.predictor_.reads(), batch_tokens, truncated,
                               prefix_cache, progress)

    def _head_pass(self, requests: list, features: np.ndarray | None = None) -> HeadOutput:
        """One head pass over requests whose signals are attached (or over their ``features``)."""
        from lenpred.predictors import max_new_tokens

        return head_pass(self.predictor_, max_new_tokens(requests), requests, features)

    def _predictions(self, requests: list, out: HeadOutput) -> list[LengthPrediction]:
        return self._postprocess(out, [r.num_prompt_tokens for r in requests], [r.max_new_tokens for r in requests])

    # ------------------------------------------------------------------ engine states in

    @property
    def engine_layer(self) -> int | None:
        """The hidden-state index (0 = embeddings, ``L`` = the final norm's output) whose **last prompt token**
        state is this predictor's whole input, so that a serving engine can capture it during its own prefill
        (:meth:`predict_states`); ``None`` when the predictor reads more (pooling over tokens, entropy, attention,
        text): :attr:`lenpred.predictors.Reads.last_token`. Today: ``last`` pooling over a span that ends at
        the prompt's end, and ``trail``."""
        self._check_fitted()
        reads = self.predictor_.reads()
        return int(reads.layer) if reads.last_token and reads.layer is not None else None

    def predict_states(self, states: np.ndarray, num_prompt_tokens, max_new_tokens) -> list[LengthPrediction]:
        """Predict from the last prompt token's hidden states an engine captured in its own prefill: no model pass,
        the head only. Each prediction carries the head's raw quantiles (``low_raw`` / ``high_raw``), so online
        learning reuses this pass (:meth:`lenpred.online.learning.OnlineLearning.serve`).

        Args:
            states: ``(n, d)`` float32, each request's residual-stream state at :attr:`engine_layer` at its final
                prompt token (HF ``output_hidden_states[engine_layer][:, -1]``).
            num_prompt_tokens: ``(n,)`` prompt lengths (reported only).
            max_new_tokens: ``(n,)`` caps in tokens (``None``: uncapped).

        Raises:
            LenpredError: the predictor reads more than that state (:attr:`engine_layer` is ``None``), or the
                states' shape is not ``(n, d)`` with the head's ``d``.
        """
        if self.engine_layer is None:
            raise LenpredError(f"predictor '{self.method}' reads more than one last-token state: an engine cannot "
                               "feed it from its prefill; use a `last` or `trail` predictor")
        states = np.asarray(states, np.float32)
        width = self.predictor_.n_features_in_
        if states.ndim != 2 or states.shape[1] != width or len(states) != len(max_new_tokens):
            raise LenpredError(f"predict_states needs ({len(max_new_tokens)}, {width}) states, got {states.shape}")
        caps = np.array([np.inf if c is None else c for c in max_new_tokens], dtype=np.float64)
        return self._postprocess(head_pass(self.predictor_, caps, features=states), num_prompt_tokens, max_new_tokens)

    def _postprocess(self, out: HeadOutput, num_prompt_tokens, max_new_tokens) -> list[LengthPrediction]:
        """The head's output -> distribution -> expected / median / calibrated interval, one per request."""
        return length_predictions(out, self.coverage, self.margin_, num_prompt_tokens, max_new_tokens)

    # ------------------------------------------------------------------ persistence

    def save_pretrained(self, path: str | Path) -> Path:
        """Write ``config.json`` (:meth:`lenpred.predictor_config.PredictorConfig.to_json`), ``predictor.safetensors``
        and ``CARD.md`` into the directory ``path``, atomically (an existing directory is replaced whole). Returns
        the path."""
        if not hasattr(self, "predictor_"):
            raise LenpredError("nothing to save: fit the LengthPredictor first")
        with atomic_path(path) as tmp:
            tmp.mkdir()
            self.predictor_.save(tmp / WEIGHTS_FILE)
            (tmp / CONFIG_FILE).write_text(self.config_.to_json(self.get_params(), self.card_))
            (tmp / CARD_FILE).write_text(render_card(self.config_, self.card_))
            self._save_progressive(tmp)
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
            LenpredError: the directory is not a saved predictor (unreadable ``config.json``, an unknown or missing
                key or setting), or the model / prompt rule differs from training.
        """
        from lenpred.predictors import Predictor

        path = Path(path) if path is not None else DEFAULT_PREDICTOR
        config, settings, card = read_config(path)
        self = cls(**checked_settings(settings, cls.param_names(), str(path / CONFIG_FILE)))
        self.config_ = config
        if load_model or backbone is not None:
            self.backbone_ = backbone or load_backbone(config.model_id, num_threads=threads)
            self.check_model_revision(self.backbone_.revision, self.backbone_.model_id, path)
        self.predictor_ = Predictor.load(path / WEIGHTS_FILE)
        if self.predictor_.registry_name != config.method:
            raise LenpredError(f"{path / WEIGHTS_FILE} holds '{self.predictor_.registry_name}', config.json says "
                               f"'{config.method}': the directory is mixed up; retrain it")
        self.margin_, self.card_ = config.interval_margin, card
        self._find_progressive(path)
        return self

    def check_model_revision(self, revision: str, model: str = "", where: str | Path = "this predictor") -> None:
        """Refuse a model other than the one this predictor was trained on.

        Raises:
            LenpredError: ``revision`` differs from the recorded ``model_revision`` (the message names both)."""
        if revision != self.config_.model_revision:
            raise LenpredError(f"{where} was trained on {self.config_.model_id} revision "
                               f"{self.config_.model_revision}, but the model given is {model} revision {revision}: its "
                               "signals differ; retrain with `lenpred train --model ...`")
