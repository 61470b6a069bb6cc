"""What a fitted :class:`lenpred.pipeline.LengthPredictor` was trained with (:class:`PredictorConfig`, its ``config_``)
and the one reader and writer of a saved predictor's ``config.json`` (:meth:`PredictorConfig.to_json`,
:meth:`PredictorConfig.from_json`).

The file is a JSON object: the config's fields at the top level (``training_traffic`` only for a traffic refit),
then ``settings`` (the ``LengthPredictor.__init__`` arguments, whatever its signature holds: they are not listed
here) and ``card`` (the test card, :mod:`lenpred.predictor_card`). Every predictor saved so far has this format, the
shipped one included, so nothing is converted on load; a key this module does not know, or a missing one, is an
error that names it. :func:`read_config` reads a saved directory's file and refuses another prompt rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from lenpred.backbone import recorded_model_name
from lenpred.errors import LenpredError
from lenpred.prompts import TEMPLATE_RULE
from lenpred.version import __version__

CONFIG_FILE = "config.json"
SETTINGS_KEY, CARD_KEY = "settings", "card"
TIME_SPLIT = "time-ordered: train earliest, calibrate next, score latest"


def checked_fields(cls, data: Any, where: str) -> dict[str, Any]:
    """``data`` (a JSON object) as keyword arguments of the dataclass ``cls``.

    Raises:
        LenpredError: ``data`` is not an object, holds keys ``cls`` has no field for, or lacks a field without a
            default (the message lists them and the valid keys).
    """
    if not isinstance(data, dict):
        raise LenpredError(f"{where} must be a JSON object, got {type(data).__name__}: retrain with `lenpred train`")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(names))
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in data]
    if unknown:
        raise LenpredError(f"{where} holds unknown key(s) {', '.join(unknown)} (valid: {', '.join(names)}): written "
                           "by another lenpred version or edited by hand; remove them or retrain with `lenpred train`")
    if missing:
        raise LenpredError(f"{where} lacks key(s) {', '.join(missing)}: it was not written by "
                           "LengthPredictor.save_pretrained; retrain it with `lenpred train`")
    return data


@dataclass(frozen=True)
class TrainingBenchmark:
    """The benchmark a predictor was trained on (or whose train split a traffic refit mixed in).

    Attributes:
        name: its directory name.
        plan_fingerprint: its sampling plan's fingerprint (``bench.json``), what makes two benchmarks the same.
        num_records: samples read (a traffic refit: train-split samples mixed in).
        dropped_duplicates: samples dropped per split because their prompt is in another split.
        split: ``"train"`` for a traffic refit's mixed-in split; ``None`` (not written) for a benchmark fit, which
            uses all three splits.
    """

    name: str
    plan_fingerprint: str
    num_records: int
    dropped_duplicates: dict[str, int]
    split: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not (k == "split" and v is None)}


@dataclass(frozen=True, kw_only=True)
class TrainingTraffic:
    """The traffic log a refit was trained on (:meth:`lenpred.pipeline.LengthPredictor.from_traffic`).

    Attributes:
        log: the log directory as given.
        num_records: finished requests read; parts: its Parquet parts; features_dtype: how its features are stored.
        first_finish_time_s, last_finish_time_s: the first and last finish times, seconds since the epoch.
        num_train, num_calibration, num_test: requests per part of the time split
            (:func:`lenpred.online.refit.time_split`).
        split: how the log was split (:data:`TIME_SPLIT`).
    """

    log: str
    num_records: int
    parts: int
    features_dtype: str
    first_finish_time_s: float
    last_finish_time_s: float
    num_train: int
    num_calibration: int
    num_test: int
    split: str = TIME_SPLIT


@dataclass(frozen=True, kw_only=True)
class PredictorConfig:
    """What a fitted predictor was trained with: ``LengthPredictor.config_``, the top level of ``config.json``
    (keyword arguments only).

    Attributes:
        method: the registered predictor (``last``, ``estp``, ``trail``, ...).
        params: its constructor arguments as fitted (layer, pooling weights, seed, head hyper-parameters).
        chosen_on_validation: what the tuner chose on validation, with its ``val_mae``; a traffic refit: ``refit_of``
            (the base predictor) and, when fine-tuned, ``finetuned`` (``{"epochs", "lr"}``).
        model_id: the serving model as recorded (:func:`lenpred.backbone.recorded_model_name`).
        model_revision: the model's content revision; any other is refused (its signals differ).
        layers: hidden-state layers the predictor reads (``[]``: it reads none).
        semantic: whether it reads last-layer attention (ESTP's semantic score).
        template_rule: the prompt rule it was trained with (:data:`lenpred.prompts.TEMPLATE_RULE`); another is refused.
        coverage: nominal share of responses inside ``[low, high]``, in (0, 1).
        interval_margin: the split-conformal margin, tokens (:func:`lenpred.intervals.conformal_margin`).
        training_benchmark: the benchmark it was trained on, ``None`` for a refit on traffic alone.
        training_traffic: the traffic log of a refit, ``None`` (not written) otherwise.
        lenpred_version: the lenpred that trained it.

    Raises:
        LenpredError: ``coverage`` outside (0, 1).
    """

    method: str
    params: dict[str, Any]
    chosen_on_validation: dict[str, Any]
    model_id: str
    model_revision: str
    layers: list[int]
    semantic: bool
    template_rule: str
    coverage: float
    interval_margin: float
    training_benchmark: TrainingBenchmark | None
    training_traffic: TrainingTraffic | None = None
    lenpred_version: str = __version__

    def __post_init__(self):
        if not 0 < self.coverage < 1:
            raise LenpredError(f"interval coverage must lie in (0, 1), got {self.coverage}")

    @classmethod
    def from_fit(cls, method: str, predictor, chosen: dict[str, Any], backbone, coverage: float, margin: float,
                 benchmark: TrainingBenchmark) -> "PredictorConfig":
        """The config of ``predictor`` (a fitted :class:`lenpred.predictors.Predictor` of the registered ``method``,
        its hyper-parameters ``chosen`` on validation; what it reads from :meth:`~lenpred.predictors.Predictor.reads`)
        fitted on ``benchmark`` with the serving ``backbone`` (:class:`lenpred.backbone.Backbone`), its interval
        calibrated to ``coverage`` with ``margin`` tokens, under this version's prompt rule."""
        reads = predictor.reads()
        return cls(method=method, params=predictor.params, chosen_on_validation=chosen,
                   model_id=recorded_model_name(backbone.model_id), model_revision=backbone.revision,
                   layers=[] if reads.layer is None else [int(reads.layer)], semantic=reads.semantic_score,
                   template_rule=TEMPLATE_RULE, coverage=coverage, interval_margin=margin,
                   training_benchmark=benchmark)

    def to_json(self, settings: dict[str, Any], card: dict[str, Any]) -> str:
        """The text of ``config.json``: the fields in their order (``training_traffic`` left out when ``None``), then
        ``settings`` and ``card``; indented by 2, ending in a newline."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "training_traffic" and value is None:
                continue
            out[f.name] = (value.to_dict() if isinstance(value, TrainingBenchmark)
                           else asdict(value) if isinstance(value, TrainingTraffic) else value)
        return json.dumps({**out, SETTINGS_KEY: settings, CARD_KEY: card}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = CONFIG_FILE) -> tuple["PredictorConfig", dict[str, Any], dict]:
        """Parse :meth:`to_json`'s text: ``(config, settings, card)`` (``card`` ``{}`` when absent).

        Raises:
            LenpredError: not JSON, not an object, no ``settings``, an unknown key or a missing one, at the top level
                or in ``training_benchmark`` / ``training_traffic`` (the message names the key and the fix).
        """
        try:
            data = json.loads(text)
            settings = data[SETTINGS_KEY]
        except (ValueError, KeyError, TypeError) as exc:
            raise LenpredError(f"{where} is not a saved LengthPredictor's config ({type(exc).__name__}: no readable "
                               f"{SETTINGS_KEY}); train one with `lenpred train`") from None
        kwargs = checked_fields(cls, {k: v for k, v in data.items() if k not in (SETTINGS_KEY, CARD_KEY)}, where)
        for key, section in (("training_benchmark", TrainingBenchmark), ("training_traffic", TrainingTraffic)):
            if kwargs.get(key) is not None:
                kwargs[key] = section(**checked_fields(section, kwargs[key], f"{where} ({key})"))
        kwargs["coverage"], kwargs["interval_margin"] = float(kwargs["coverage"]), float(kwargs["interval_margin"])
        return cls(**kwargs), settings, data.get(CARD_KEY) or {}


def read_config(path: Path) -> tuple[PredictorConfig, dict[str, Any], dict]:
    """``(config, settings, card)`` of the saved predictor directory ``path`` (:meth:`PredictorConfig.from_json`).

    Raises:
        LenpredError: no readable ``config.json``, a malformed one, or a predictor trained with another prompt
            rule than this lenpred's :data:`lenpred.prompts.TEMPLATE_RULE`.
    """
    try:
        text = (path / CONFIG_FILE).read_text()
    except OSError as exc:
        raise LenpredError(f"{path} is not a saved LengthPredictor ({type(exc).__name__}: no readable "
                           f"{CONFIG_FILE}); train one with `lenpred train`") from None
    config, settings, card = PredictorConfig.from_json(text, str(path / CONFIG_FILE))
    if config.template_rule != TEMPLATE_RULE:
        raise LenpredError(f"{path} was trained with prompt rule {config.template_rule!r}, this lenpred uses "
                           f"{TEMPLATE_RULE!r}: retrain it with `lenpred train`")
    return config, settings, card


def checked_settings(settings: Any, names: list[str], where: str) -> dict[str, Any]:
    """``config.json``'s ``settings`` as keyword arguments of an ``__init__`` taking ``names`` (``layers`` as a
    tuple); a missing setting takes the ``__init__`` default.

    Raises:
        LenpredError: not an object, or a setting ``__init__`` does not take (the message lists the valid ones).
    """
    unknown = sorted(set(settings) - set(names)) if isinstance(settings, dict) else None
    if unknown is None or unknown:
        raise LenpredError(f"{where} has settings {unknown if unknown else settings!r} that LengthPredictor does not "
                           f"take (valid: {', '.join(names)}): written by another lenpred version; retrain with "
                           "`lenpred train`")
    return {k: tuple(v) if k == "layers" and v is not None else v for k, v in settings.items()}
