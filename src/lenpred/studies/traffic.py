"""Study: learn from the traffic a predictor serves — a replayed stream whose mix drifts away from the training
benchmark, served by the shipped predictor, logged (:mod:`lenpred.online.traffic_log`), with the fixed vs the
online-adaptive interval (:mod:`lenpred.online.adaptive`) and a head refitted on the stream's earlier part
(:mod:`lenpred.online.refit`) scored on its later part.

The stream: the benchmark's **test** split (the shipped head never trained or calibrated on it), every sample a
request, in an order where one scenario (or source) arrives late: each prompt draws a popularity time ``c_p``
(``U(late_start, 1)`` for the late group, ``U(0, 1)`` otherwise) and each of its samples arrives at
``c_p + spread * (u - 1/2)``. Two streams:

* ``recurring``: ``spread > 0``, so a prompt's samples recur over time (RL rollouts, retried or popular prompts):
  what a refit can learn includes the prompts it has already seen;
* ``new-prompts``: ``spread = 0`` and the later part holds only prompts never seen in the earlier part: what a
  refit learns about *new* prompts of the shifted mix.

Everything is computed from cached layer-15 signals (:mod:`lenpred.studies.traffic_data`); no model pass per
request beyond the one prefill the signal cache holds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from lenpred.backbone import cache_dir
from lenpred.errors import LenpredError
from lenpred.io import atomic_path, write_json
from lenpred.pipeline import LengthPredictor
from lenpred.traffic_refit import bench_train_rows
from lenpred.intervals import widened_interval
from lenpred.online.adaptive import AdaptiveConfig, replay_intervals
from lenpred.online.refit import TrafficRows, choose_finetune, finetune_head, fit_head, rows_from_log
from lenpred.prediction import head_quantiles
from lenpred.online.traffic_log import (TrafficLogConfig, TrafficLogWriter, TrafficRecord, predictor_metadata,
                                        read_traffic_log)
from lenpred.studies import DEFAULT_BENCH, report_dict
from lenpred.studies.scheduling_report import markdown
from lenpred.studies.traffic_data import split_prompt_ids, stream_signals

# torch / scipy modules (dataset, metrics) are imported inside the functions, so the study's config imports
# without them.
logger = logging.getLogger(__name__)


@dataclass
class TrafficReplayConfig:
    """Settings of :func:`run_traffic_replay`.

    Attributes:
        bench: benchmark directory; its test split is the stream.
        predictor: saved predictor serving the stream (``None``: the shipped one).
        data_dir, cache: prompt data directory and signal-cache directory (``None``: defaults).
        out: where results go (``results.json``, ``results.md``, ``coverage.png``).
        log_dir: where the replayed traffic log is written (replaced each run; ``None``: under ``$LENPRED_CACHE``).
        late: the scenarios or sources (comma-separated) whose prompts arrive late (the shift).
        late_start: the late group's popularity times are ``U(late_start, 1)``.
        spread: how far apart one prompt's samples arrive in the ``recurring`` stream (share of the stream).
        adaptive_window, gamma: :class:`lenpred.online.adaptive.AdaptiveConfig` settings (gamma for ACI).
        refit_sizes: logged requests (the stream's first n) the learning curve refits on.
        mix_bench: also refit on the logged requests plus the benchmark's train split (the shipped head's own
            training data; needs its layer-15 signals, extracted once into the cache).
        bootstrap_resamples: prompt-clustered bootstrap resamples.
        seed: stream order and head seed.
    """

    bench: str = DEFAULT_BENCH
    predictor: str | None = None
    data_dir: str | None = None
    cache: str | None = None
    out: str = "results/traffic"
    log_dir: str | None = None
    late: str = "longseq"
    late_start: float = 0.5
    spread: float = 0.5
    adaptive_window: int = 300
    gamma: float = 0.01
    refit_sizes: tuple[int, ...] = (100, 200, 400, 788)
    mix_bench: bool = True
    bootstrap_resamples: int = 2000
    seed: int = 0
    streams: tuple[str, ...] = field(default=("recurring", "new-prompts"))

    def __post_init__(self):
        if not 0 <= self.late_start < 1 or self.spread < 0:
            raise LenpredError("late_start must lie in [0, 1) and spread be >= 0")


# ----------------------------------------------------------------------------------------------- pure helpers


def shifted_order(prompt_ids: np.ndarray, late: np.ndarray, late_start: float, spread: float,
                  seed: int) -> np.ndarray:
    """Arrival order ``(n,)`` int64 of samples: prompt popularity ``c_p`` ``U(late_start, 1)`` where ``late`` else
    ``U(0, 1)``; sample arrival ``c_p + spread (u - 1/2)``; ties (``spread = 0``) keep a prompt's samples together."""
    rng = np.random.default_rng(seed)
    ids, inverse = np.unique(prompt_ids, return_inverse=True)
    late_p = np.zeros(len(ids), bool)
    late_p[inverse[late]] = True
    c = np.where(late_p, rng.uniform(late_start, 1, len(ids)), rng.uniform(0, 1, len(ids)))
    arrival = c[inverse] + spread * (rng.uniform(0, 1, len(prompt_ids)) - 0.5)
    return np.lexsort((np.arange(len(prompt_ids)), inverse, arrival))


def later_part(prompt_ids: np.ndarray, new_prompts_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks ``(earlier, later)`` over a stream in arrival order: the second half; with
    ``new_prompts_only`` the later part keeps only samples whose prompt never arrived in the earlier half."""
    n = len(prompt_ids)
    later = np.arange(n) >= n // 2
    if new_prompts_only:
        later &= ~np.isin(prompt_ids, prompt_ids[~later])
    return ~later & (np.arange(n) < n // 2), later


def rolling_coverage(covered: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean of ``covered`` over the last ``window`` requests ``(n,)`` (shorter at the start)."""
    c = np.cumsum(np.asarray(covered, np.float64))
    idx = np.arange(len(c))
    start = np.maximum(idx - window, -1)
    return (c - np.where(start >= 0, c[np.maximum(start, 0)], 0.0)) / (idx - start)


def paired_tau_bootstrap(y: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray, clusters: np.ndarray,
                         n_resamples: int = 1000, seed: int = 0) -> dict:
    """Kendall tau-b of two predictors on the same samples and the 95 % interval of ``tau_a - tau_b`` from a
    bootstrap over clusters (prompts; percentile method). Returns ``{"tau_a", "tau_b", "diff": [est, lo, hi]}``."""
    from scipy.stats import kendalltau

    ids, inverse = np.unique(clusters, return_inverse=True)
    members = [np.flatnonzero(inverse == k) for k in range(len(ids))]
    rng = np.random.default_rng(seed)
    def tau(p: np.ndarray, idx: np.ndarray) -> float:
        return kendalltau(p[idx], y[idx]).statistic

    diffs = []
    for _ in range(n_resamples):
        idx = np.concatenate([members[k] for k in rng.integers(0, len(ids), len(ids))])
        diffs.append(tau(pred_a, idx) - tau(pred_b, idx))
    all_idx = np.arange(len(y))
    ta, tb = tau(pred_a, all_idx), tau(pred_b, all_idx)
    lo, hi = np.nanpercentile(diffs, [2.5, 97.5])
    return {"tau_a": float(ta), "tau_b": float(tb), "diff": [float(ta - tb), float(lo), float(hi)]}


# ----------------------------------------------------------------------------------------------- the study


@dataclass
class TrafficReport:
    """What :func:`run_traffic_replay` returns; :meth:`to_dict` is the content of ``results.json`` (key for key).

    Attributes:
        config: the :class:`TrafficReplayConfig`, as ``asdict`` gives it.
        shipped_margin: the served predictor's calibrated interval margin.
        num_requests: test requests in each stream.
        late_share: share of the stream whose prompts arrive late (the shift).
        streams: per stream (``recurring``, ``new-prompts``): interval coverage over time (fixed, ACI, rolling,
            per-scenario ACI) and the shipped vs refitted heads' MAE on the later part.
        timing_s: wall seconds of the run.
    """

    config: dict
    shipped_margin: float
    num_requests: int
    late_share: float
    streams: dict
    timing_s: float

    def to_dict(self) -> dict:
        """The ``results.json`` content, in its key order."""
        return report_dict(self)


def run_traffic_replay(cfg: TrafficReplayConfig) -> TrafficReport:
    """Run the study; writes ``results.json``, ``results.md`` and ``coverage.png`` under ``cfg.out`` and returns
    the :class:`TrafficReport` (:func:`render_traffic` prints its Markdown). Progress goes to the ``lenpred``
    logger.

    Raises:
        LenpredError: a served predictor that reads other signals than layer 15's, or a ``late`` name that no test
            sample has.
    """
    from lenpred.dataset import load_eval_data

    t0 = time.perf_counter()
    shipped = LengthPredictor.from_pretrained(cfg.predictor)
    if shipped.config_.layers != [15] or shipped.config_.semantic:
        raise LenpredError("the traffic replay reads cached layer-15 signals without attention: serve it with a "
                           "predictor that reads layer 15 only (the shipped one does)")
    data = load_eval_data(cfg.bench, shipped.backbone_.tokenizer, cfg.data_dir)
    test = data.index["test"]
    stream_signals(data, shipped.backbone_, cfg.cache, split_prompt_ids(data, "test"), cfg.bench)
    requests = data.rows("test")
    head = shipped.predictor_.head_
    X = shipped.predictor_.features(requests)
    caps = data.cols["max_new_tokens"][test].astype(np.float64)
    expected, low_raw, high_raw = head_quantiles(head, X, caps, shipped.coverage)
    cols = {"X": X, "y": data.y[test], "censored": data.censored[test], "caps": caps, "expected": expected,
            "low_raw": low_raw, "high_raw": high_raw, "prompt_id": data.cols["prompt_id"][test].astype(str),
            "scenario": data.cols["scenario"][test].astype(str)}
    cols["source"] = np.array([p.split(":")[0] for p in cols["prompt_id"]])  # prompt ids are <source>:<index>
    names = {n.strip() for n in cfg.late.split(",")}
    unknown = names - set(cols["scenario"]) - set(cols["source"])
    if unknown:
        raise LenpredError(f"no test sample is of scenario or source {', '.join(sorted(unknown))}: pick from "
                           f"{', '.join(sorted(set(cols['scenario']) | set(cols['source'])))}")
    late = np.isin(cols["scenario"], list(names)) | np.isin(cols["source"], list(names))
    bench_rows = _bench_rows_or_none(shipped, cfg) if cfg.mix_bench else None
    report = {"config": asdict(cfg), "shipped_margin": shipped.margin_, "num_requests": int(len(test)),
              "late_share": float(late.mean()), "streams": {}}
    for name in cfg.streams:
        spread = cfg.spread if name == "recurring" else 0.0
        order = shifted_order(cols["prompt_id"], late, cfg.late_start, spread, cfg.seed)
        stream = {k: v[order] for k, v in cols.items()}
        logger.info("stream '%s': %d requests …", name, len(order))
        report["streams"][name] = _serve_stream(stream, shipped, head, bench_rows, cfg, name, late[order])
    report["timing_s"] = time.perf_counter() - t0
    _save(report, cfg)
    return TrafficReport(**report)


def render_traffic(report: TrafficReport, console) -> None:
    """Print the report's Markdown (:func:`render_markdown`, the same text as ``results.md``) on ``console``."""
    console.print(render_markdown(report.to_dict()))


def _bench_rows_or_none(shipped, cfg):
    rows, _ = bench_train_rows(shipped, cfg.bench, cfg.data_dir, cfg.cache)
    return rows


def _serve_stream(s: dict, shipped, head, bench_rows, cfg: TrafficReplayConfig, name: str, late: np.ndarray) -> dict:
    """Log the stream, replay the intervals, refit on the earlier part, score the later part."""
    log, log_stats = _write_log(s, shipped, cfg, name)
    n = len(s["y"])
    earlier, later = later_part(s["prompt_id"], new_prompts_only=(name == "new-prompts"))
    intervals = {"fixed": widened_interval(s["low_raw"], s["high_raw"], shipped.margin_, s["caps"])}
    for method in ("aci", "rolling"):
        for mondrian in (False, True):
            acfg = AdaptiveConfig(coverage=shipped.coverage, method=method, window=cfg.adaptive_window,
                                  gamma=cfg.gamma, initial_margin=shipped.margin_)
            key = method + ("+scenario" if mondrian else "")
            intervals[key] = replay_intervals(s["low_raw"], s["high_raw"], s["y"], s["caps"],
                                              s["scenario"] if mondrian else None, acfg)
    half = np.arange(n) >= n // 2
    coverage = {}
    for key, (lo, hi) in intervals.items():
        covered = (lo <= s["y"]) & (s["y"] <= hi)
        coverage[key] = {"first_half": float(covered[~half].mean()), "last_half": float(covered[half].mean()),
                         "last_half_late_group": float(covered[half & late].mean()),
                         "mean_width_last_half": float(np.mean(np.minimum(hi, s["caps"])[half] - lo[half])),
                         "rolling": rolling_coverage(covered, 200)[::4].round(4).tolist()}
    refits = _refits(log, s, shipped, head, bench_rows, earlier, later, cfg)
    return {"num_requests": n, "num_earlier": int(earlier.sum()), "num_later": int(later.sum()),
            "late_share_first_half": float(late[~half].mean()), "late_share_last_half": float(late[half].mean()),
            "coverage": coverage, "log": log_stats, **refits}


def _write_log(s: dict, shipped, cfg: TrafficReplayConfig, name: str):
    """Write the stream as a traffic log (what a serving path would have written) and read it back."""
    import hashlib
    import shutil

    directory = Path(cfg.log_dir or cache_dir() / "traffic-replay") / name
    shutil.rmtree(directory, ignore_errors=True)
    t, n = 1.7e9, len(s["y"])
    with TrafficLogWriter(TrafficLogConfig(directory, max_records_per_part=512,
                                           metadata=predictor_metadata(shipped))) as w:
        for i in range(n):
            low, high = widened_interval(s["low_raw"][i], s["high_raw"][i], shipped.margin_, s["caps"][i])
            w.record(TrafficRecord(
                features=s["X"][i], expected=s["expected"][i], low=low, high=high, num_output_tokens=int(s["y"][i]),
                finish_reason="length" if s["censored"][i] else "stop", max_new_tokens=int(s["caps"][i]),
                arrival_time_s=t + i, first_token_time_s=t + i + 0.05, finish_time_s=t + i + 1 + s["y"][i] / 50,
                low_raw=s["low_raw"][i], high_raw=s["high_raw"][i],
                prompt_sha256=hashlib.sha256(s["prompt_id"][i].encode()).hexdigest(), group=s["scenario"][i]))
    log = read_traffic_log(directory)
    size = sum(p.stat().st_size for p in directory.iterdir())
    return log, {"dir": str(directory), "parts": len(log.parts), "bytes": size, "bytes_per_request": size / n,
                 "features_dtype": log.metadata["features_dtype"],
                 "max_abs_expected_diff_float16_tokens": float(np.max(np.abs(
                     shipped.predictor_.head_.predict(log.features, s["caps"]) - s["expected"])))}


def _refits(log, s: dict, shipped, head, bench_rows, earlier, later, cfg: TrafficReplayConfig) -> dict:
    """Shipped vs heads refitted on the earlier part (from the log; with and without the benchmark's train split),
    on the later part: MAE and Kendall tau with paired prompt-clustered intervals; and the learning curve."""
    from lenpred.metrics import clustered_bootstrap

    rows = rows_from_log(log)  # in finish order = the stream's order here
    params = shipped.predictor_.params
    y, caps, pid = s["y"][later], s["caps"][later], s["prompt_id"][later]
    ship_pred = s["expected"][later]
    ship_err = np.abs(ship_pred - y)

    def score(fit_rows: TrafficRows, finetune: bool = False) -> tuple[dict, np.ndarray]:
        t = time.perf_counter()
        extra = {}
        if finetune:  # epochs / lr chosen on the fit rows' own latest 20 %, in time order
            epochs, lr, sweep = choose_finetune(head, fit_rows, shipped.coverage, seed=params["seed"])
            new = finetune_head(head, fit_rows, epochs, lr, params["seed"]) if epochs else head
            extra = {"chosen": {"epochs": epochs, "lr": lr}, "sweep": sweep}
        else:
            new = fit_head(fit_rows, params["head"], params["seed"])
        fit_s = time.perf_counter() - t
        pred = head_quantiles(new, s["X"][later], caps, shipped.coverage)[0]
        err = np.abs(pred - y)
        return {"n_train": len(fit_rows), "fit_s": fit_s, "mae": clustered_bootstrap(err, pid, cfg.bootstrap_resamples),
                "mae_minus_shipped": clustered_bootstrap(err - ship_err, pid, cfg.bootstrap_resamples), **extra}, pred

    out = {"shipped": {"mae": clustered_bootstrap(ship_err, pid, cfg.bootstrap_resamples)}}
    idx_earlier = np.flatnonzero(earlier)
    variants = [("refit_traffic", [rows.take(idx_earlier)], False), ("finetune_traffic", [rows.take(idx_earlier)], True)]
    if bench_rows is not None:
        variants.append(("refit_traffic+bench", [rows.take(idx_earlier), bench_rows], False))
    for key, parts, finetune in variants:
        out[key], pred = score(TrafficRows.concat(parts), finetune)
        out[key]["kendall_tau"] = paired_tau_bootstrap(y, pred, ship_pred, pid, min(cfg.bootstrap_resamples, 1000),
                                                       cfg.seed)
    curve = []
    for size in cfg.refit_sizes:
        first = idx_earlier[:size]
        for key, parts, finetune in (("traffic", [rows.take(first)], False), ("finetune", [rows.take(first)], True),
                                     ("traffic+bench", [rows.take(first), bench_rows], False)):
            if bench_rows is None and key == "traffic+bench":
                continue
            r, _ = score(TrafficRows.concat(parts), finetune)
            curve.append({"logged_requests": int(len(first)), "data": key, **r})
    out["learning_curve"] = curve
    beats = {}
    for key in sorted({c["data"] for c in curve}):
        ok = [c["logged_requests"] for c in curve if c["data"] == key and c["mae_minus_shipped"][2] < 0]
        beats[key] = ok[0] if ok else None
    out["first_size_that_beats_shipped"] = beats
    return out


# ----------------------------------------------------------------------------------------------- report


def _fmt(ci, digits=1) -> str:
    est, lo, hi = ci
    return f"{est:.{digits}f}" if lo is None else f"{est:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def render_markdown(report: dict) -> str:
    cfg = report["config"]
    lines = [f"# Learning from served traffic: replayed `{Path(cfg['bench']).name}` test split, "
             f"'{cfg['late']}' arriving late", "",
             f"{report['num_requests']} requests; shipped predictor's fixed margin {report['shipped_margin']:.1f} "
             f"tokens; adaptive window {cfg['adaptive_window']}, ACI gamma {cfg['gamma']}.", ""]
    for name, st in report["streams"].items():
        lines += [f"## Stream `{name}`", "",
                  f"'{cfg['late']}' share: {st['late_share_first_half']:.2f} in the first half, "
                  f"{st['late_share_last_half']:.2f} in the last; earlier part {st['num_earlier']}, later part "
                  f"{st['num_later']} requests. Log: {st['log']['bytes_per_request']:.0f} bytes per request "
                  f"({st['log']['features_dtype']} features; float16 moves the expected length by at most "
                  f"{st['log']['max_abs_expected_diff_float16_tokens']:.3f} tokens).", "",
                  "Interval coverage (nominal 0.80):", ""]
        rows = [[k, f"{c['first_half']:.3f}", f"{c['last_half']:.3f}", f"{c['last_half_late_group']:.3f}",
                 f"{c['mean_width_last_half']:.0f}"] for k, c in st["coverage"].items()]
        lines += [markdown(["interval", "first half", "last half", f"last half, {cfg['late']}", "mean width (last half)"],
                           rows), "On the later part:", ""]
        rows = [["shipped", _fmt(st["shipped"]["mae"]), "–", f"{st['refit_traffic']['kendall_tau']['tau_b']:.3f}", "–"]]
        for key in [k for k in ("refit_traffic", "finetune_traffic", "refit_traffic+bench") if k in st]:
            r = st[key]
            how = f", {r['chosen']['epochs']} epochs at lr {r['chosen']['lr']:g}" if "chosen" in r else ""
            rows.append([f"{key} ({r['n_train']} rows{how})", _fmt(r["mae"]), _fmt(r["mae_minus_shipped"]),
                         f"{r['kendall_tau']['tau_a']:.3f}", _fmt(r["kendall_tau"]["diff"], 3)])
        lines += [markdown(["head", "MAE [95% CI]", "Δ MAE vs shipped", "Kendall tau", "Δ tau vs shipped"], rows),
                  "Learning curve (refit on the stream's first n logged requests, scored on the later part):", ""]
        rows = [[str(c["logged_requests"]), c["data"], _fmt(c["mae"]), _fmt(c["mae_minus_shipped"]),
                 f"{c['fit_s']:.1f}"] for c in st["learning_curve"]]
        lines += [markdown(["logged requests", "data", "MAE", "Δ MAE vs shipped", "fit s"], rows),
                  f"First size whose interval excludes 0 in the refit's favour: {st['first_size_that_beats_shipped']}",
                  ""]
    return "\n".join(lines)


def _save(report: dict, cfg: TrafficReplayConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", report)
    md = render_markdown(report)
    with atomic_path(out / "results.md") as tmp:
        tmp.write_text(md)
    fig, axes = plt.subplots(1, len(report["streams"]), figsize=(6 * len(report["streams"]), 4), squeeze=False)
    for ax, (name, st) in zip(axes[0], report["streams"].items()):
        for key in ("fixed", "aci", "rolling", "aci+scenario"):
            r = st["coverage"][key]["rolling"]
            ax.plot(np.arange(len(r)) * 4, r, label=key, lw=1.2)
        ax.axhline(0.8, color="k", ls="--", lw=0.8)
        ax.axvline(st["num_requests"] // 2, color="grey", ls=":", lw=0.8)
        ax.set(title=f"stream '{name}': coverage, last 200 requests", xlabel="request (arrival order)",
               ylabel="coverage", ylim=(0.5, 1.0))
        ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    with atomic_path(out / "coverage.png") as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
