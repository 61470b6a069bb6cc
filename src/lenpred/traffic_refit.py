"""Refit a served predictor's head on its logged traffic (what :meth:`lenpred.pipeline.LengthPredictor.from_traffic`
runs): check the log against the base predictor, split it in time, train (or fine-tune) the head, calibrate the
interval on the next requests and score the latest ones beside the base. The features-level kernels live in
:mod:`lenpred.online.refit`; no model pass over the log (it holds the head's input features).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError
from lenpred.inputs.prefill import signal_cache_path
from lenpred.intervals import conformal_margin, interval_coverage, widened_interval
from lenpred.online.refit import TrafficRows, choose_finetune, finetune_head, fit_head, rows_from_log, time_split
from lenpred.prediction import head_quantiles
from lenpred.online.traffic_log import read_traffic_log
from lenpred.predictor_config import PredictorConfig, TrainingBenchmark, TrainingTraffic
from lenpred.version import __version__


@dataclass
class TrafficRefit:
    """What a refit on traffic learned.

    Attributes:
        predictor: the fitted :class:`lenpred.predictors.Predictor` (the base's class and hyper-parameters).
        margin: the interval's conformal margin, tokens, calibrated on the logged calibration requests.
        config: its :class:`lenpred.predictor_config.PredictorConfig`.
        card: its card on the latest logged requests (:func:`traffic_card`).
    """

    predictor: object
    margin: float
    config: PredictorConfig
    card: dict


def refit_on_traffic(base, log: str | Path, bench: str | Path | None = None, base_name: str | None = None,
                     calibration_share: float = 0.1, test_share: float = 0.2, finetune: bool = False,
                     data_dir: str | None = None, cache: str | None = None, incumbent=None,
                     traffic_log=None) -> TrafficRefit:
    """Refit ``base`` (a loaded :class:`lenpred.pipeline.LengthPredictor` with a pooled head) on the traffic log
    ``log``, optionally mixed with ``bench``'s train split; ``base_name`` is how the card names the base
    (``None``: the shipped predictor). ``incumbent``: the predictor now in service (the one the result would
    replace), scored beside it on the card (``incumbent_mae``, ``mae_minus_incumbent``). ``traffic_log``: ``log``
    already read (:func:`lenpred.online.traffic_log.read_traffic_log`), so it is not read again.

    The log is split in time (:func:`lenpred.online.refit.time_split`): the head is trained on the earliest
    requests (plus ``bench``'s train split), its interval calibrated on the next ``calibration_share`` and its
    card scored on the latest ``test_share``, beside ``base`` on the same requests. Censoring as in training.
    With ``finetune``, ``base``'s head is trained further instead of refitted from scratch (epochs and learning
    rate chosen on the training part's latest 20 %, :func:`lenpred.online.refit.choose_finetune`). ``base``'s
    method, layer, model, coverage and head hyper-parameters are kept. A log captured with no head trains its
    first head with :func:`first_head_on_traffic` instead.

    Raises:
        LenpredError: an unreadable or corrupt log (:func:`lenpred.online.traffic_log.read_traffic_log`), a log
            written for another model revision / layer / feature width than ``base`` or ``incumbent``
            (:func:`check_log_matches`), a ``base`` that is not a pooled-head predictor, too few requests for the
            shares or the coverage.
    """
    if not base.predictor_.reads().features:
        raise LenpredError(f"the base predictor's method '{base.method}' is not a pooled head: refit on traffic "
                           "needs one (last, mean, egtp, estp, ...)")
    traffic_log = traffic_log or read_traffic_log(log)
    check_log_matches(traffic_log, base, log)
    rows = rows_from_log(traffic_log)
    train, cal, test = time_split(len(rows), calibration_share, test_share)
    parts, bench_info = [rows.take(train)], None
    if bench is not None:
        bench_rows, bench_info = bench_train_rows(base, bench, data_dir, cache)
        parts.append(bench_rows)
    fit_rows = TrafficRows.concat(parts)
    params = base.predictor_.params
    predictor = type(base.predictor_)(**params)
    how = {"refit_of": str(base_name or "shipped predictor")}
    if finetune:
        epochs, lr, _ = choose_finetune(base.predictor_.head_, fit_rows, base.coverage, seed=params["seed"])
        head = base.predictor_.head_
        predictor.head_ = finetune_head(head, fit_rows, epochs, lr, params["seed"]) if epochs else head
        how |= {"finetuned": {"epochs": epochs, "lr": lr}}
    else:
        predictor.head_ = fit_head(fit_rows, params["head"], params["seed"])
    margin = _calibrated_margin(predictor.head_, rows, cal, base.coverage)
    config = dataclasses.replace(base.config_, chosen_on_validation=how, coverage=base.coverage, interval_margin=margin,
                                 training_benchmark=bench_info, training_traffic=_training_traffic(
                                     traffic_log, log, train, cal, test), lenpred_version=__version__)
    card = traffic_card(predictor.head_, rows.take(test), margin, base.coverage,
                        {"base": base.predictor_.head_, **_incumbent_head(incumbent, traffic_log, log)})
    return TrafficRefit(predictor, margin, config, card)


def first_head_on_traffic(log: str | Path, head: dict, coverage: float = 0.8, calibration_share: float = 0.1,
                          test_share: float = 0.2, seed: int = 0, incumbent=None, traffic_log=None) -> TrafficRefit:
    """The first head of a model lenpred has none for, trained on a log captured with no head
    (:mod:`lenpred.online.capture`) alone: the log's pooling (``last``) and layer, a fresh
    :class:`lenpred.heads.SoftLabelRegressor` with the hyper-parameters ``head`` (a
    :class:`lenpred.heads.HeadConfig` dict) trained on the earliest requests, its interval calibrated to
    ``coverage`` on the next ``calibration_share`` and its card scored on the latest ``test_share`` (beside
    ``incumbent``, a head already trained on such a log, when given). Model id, revision and prompt rule are the
    log's. ``traffic_log``: ``log`` already read (not read again).

    Raises:
        LenpredError: an unreadable or corrupt log, a log that holds a predictor's traffic (refit it with its
            ``--base``), too few requests for the shares or the coverage.
    """
    from lenpred.online.capture import is_headless
    from lenpred.predictors import make_predictor

    traffic_log = traffic_log or read_traffic_log(log)
    meta = traffic_log.metadata
    if not is_headless(meta):
        raise LenpredError(f"traffic log {log} was served by a predictor ({meta.get('method')} at layers "
                           f"{meta.get('layers')}), not captured with no head: refit that predictor (--base DIR)")
    layer = int(json.loads(meta["layers"])[0])
    rows = rows_from_log(traffic_log)
    train, cal, test = time_split(len(rows), calibration_share, test_share)
    predictor = make_predictor(meta["method"], layer=layer, seed=seed, head=dict(head))
    predictor.head_ = fit_head(rows.take(train), predictor.params["head"], seed)
    margin = _calibrated_margin(predictor.head_, rows, cal, coverage)
    config = PredictorConfig(method=meta["method"], params=predictor.params,
                             chosen_on_validation={"first_head_of": "a traffic log captured with no head"},
                             model_id=meta["model_id"], model_revision=meta["model_revision"], layers=[layer],
                             semantic=False, template_rule=meta["template_rule"], coverage=coverage,
                             interval_margin=margin, training_benchmark=None,
                             training_traffic=_training_traffic(traffic_log, log, train, cal, test),
                             lenpred_version=__version__)
    card = traffic_card(predictor.head_, rows.take(test), margin, coverage, _incumbent_head(incumbent, traffic_log, log))
    return TrafficRefit(predictor, margin, config, card)


def _training_traffic(traffic_log, log, train, cal, test) -> TrainingTraffic:
    c = traffic_log.columns
    return TrainingTraffic(log=str(log), num_records=traffic_log.num_records, parts=len(traffic_log.parts),
                           features_dtype=traffic_log.metadata["features_dtype"],
                           first_finish_time_s=float(np.nanmin(c["finish_time_s"])),
                           last_finish_time_s=float(np.nanmax(c["finish_time_s"])),
                           num_train=len(train), num_calibration=len(cal), num_test=len(test))


def _incumbent_head(incumbent, traffic_log, log) -> dict:
    """``{"incumbent": its head}`` when given (checked against the log), else ``{}``."""
    if incumbent is None:
        return {}
    check_log_matches(traffic_log, incumbent, log, "the predictor in service (--out)")
    return {"incumbent": incumbent.predictor_.head_}


def _calibrated_margin(head, rows: TrafficRows, cal: np.ndarray, coverage: float) -> float:
    """The conformal margin of ``head`` on the calibration rows ``cal``.

    Raises:
        LenpredError: fewer calibration rows than ``coverage`` needs (the message gives the log size that does)."""
    import math

    need = math.ceil(coverage / (1 - coverage) - 1e-9)
    if len(cal) < need:
        share = len(cal) / max(len(rows), 1)
        enough = f"at least {math.ceil(need / share)} requests at this --calibration-share" if share else "more"
        raise LenpredError(f"the log's {len(rows)} requests leave {len(cal)} to calibrate the {coverage:.0%} interval "
                           f"on, which needs at least {need}: log {enough}")
    _, low, high = head_quantiles(head, rows.X[cal], rows.caps[cal], coverage)
    return conformal_margin(low, high, rows.y[cal], coverage)


def check_log_matches(traffic_log, base, path, who: str = "the base predictor") -> None:
    """A log's features must be what ``base`` reads: same width, and (when the writer recorded them) the same model
    revision, method (the pooling) and layers.

    Raises:
        LenpredError: another width, model revision, method or layers (the message names both values)."""
    meta, width = traffic_log.metadata, base.predictor_.n_features_in_
    if int(meta["feature_dim"]) != width:
        raise LenpredError(f"traffic log {path} holds {meta['feature_dim']}-wide features, {who} reads "
                           f"{width}: log the base predictor's features, or pass the --base it was served with")
    for key, mine in (("model_revision", base.config_.model_revision), ("method", base.method),
                      ("layers", json.dumps(base.config_.layers))):
        if key in meta and meta[key] != str(mine):
            raise LenpredError(f"traffic log {path} was written for {key} {meta[key]}, {who} has {mine}: "
                               "pass the --base predictor that served the logged traffic")


def bench_train_rows(base, bench, data_dir, cache) -> tuple[TrafficRows, TrainingBenchmark]:
    """``(TrafficRows, info)``: ``bench``'s train split pooled as ``base`` pools (signals from the signal cache)."""
    from lenpred.bench.records import read_manifest
    from lenpred.dataset import load_eval_data
    from lenpred.inputs.cache import extract_cached

    layers = tuple(base.config_.layers)
    data = load_eval_data(bench, base.backbone_.tokenizer, data_dir)
    train = data.index["train"]
    ids = list(dict.fromkeys(data.cols["prompt_id"][train].tolist()))
    cache = Path(cache) if cache else signal_cache_path(base.backbone_, bench, layers)
    signals = extract_cached(base.backbone_, {p: data.by_prompt[p].token_ids for p in ids}, layers, cache,
                             semantic=base.config_.semantic)
    for p in ids:
        data.by_prompt[p].signals = signals[p]
    requests = data.rows("train")
    rows = TrafficRows(base.predictor_.features(requests), data.y[train], data.censored[train],
                       data.cols["max_new_tokens"][train].astype(np.float64), data.cols["prompt_id"][train].astype(object),
                       np.full(len(train), "bench", dtype=object))
    info = TrainingBenchmark(Path(bench).name, read_manifest(bench)["plan_fingerprint"], len(train),
                             data.dropped_duplicates, split="train")
    return rows, info


def traffic_card(head, test: TrafficRows, margin: float, coverage: float, compare: dict | None = None) -> dict:
    """The card of a head trained on traffic, on the latest logged requests: MAE with a 95 % interval clustered by
    prompt (SHA-256 where logged), interval coverage and width, and per head of ``compare`` (``{"base": head,
    "incumbent": head}``) its MAE (``<name>_mae``) and the paired MAE difference to it (``mae_minus_<name>``:
    mean, low, high); ``{}`` with fewer than 2 test requests."""
    from lenpred.metrics import clustered_bootstrap

    if len(test) < 2:
        return {}
    groups = test.groups.astype(str)
    expected, low, high = head_quantiles(head, test.X, test.caps, coverage)
    low, high = widened_interval(low, high, margin, test.caps)
    err = np.abs(expected - test.y)
    mae, lo, hi = clustered_bootstrap(err, groups)
    card = {"n": len(test), "mae": mae, "mae_ci": [lo, hi], "interval_coverage": interval_coverage(low, high, test.y),
            "mean_interval_width": float(np.mean(high - low))}
    for name, other in (compare or {}).items():
        other_err = np.abs(head_quantiles(other, test.X, test.caps, coverage)[0] - test.y)
        card |= {f"{name}_mae": float(other_err.mean()),
                 f"mae_minus_{name}": list(clustered_bootstrap(err - other_err, groups))}
    return {"latest traffic": card}
