"""``lenpred evaluate`` / ``lenpred demo``: records → input providers → tune on validation → refit per seed →
score → report. Each step is one function of its own module (:mod:`lenpred.dataset`, :mod:`lenpred.inputs`,
:mod:`lenpred.tuning`, :mod:`lenpred.metrics`, :mod:`.evaluate_report`); no method is special-cased here.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from lenpred.errors import LenpredError
from lenpred.io import atomic_path, write_json
from lenpred.studies import DEFAULT_BENCH
from lenpred.studies.evaluate_report import render_terminal_table, report_paths, save_report
from lenpred.studies.resume import load_resumable
from lenpred.tuning_settings import TuningSettings

# torch / scipy modules (dataset, tuning, predictors, metrics, heads, signals) are imported inside the functions:
# the CLI imports this module (and its config) at start-up.

logger = logging.getLogger(__name__)

FLOORS = ("scenario_median", "scenario_prompt_length")
ALL_METHODS = (*FLOORS, "global_median", "prompt_length", "ssjf_reg", "ssjf_mc", "s3", "pia", "trail", "ltr", "mean",
               "last", "max", "entropy_only", "semantic_only", "egtp", "estp")
DEMO_METHODS = (*FLOORS, "mean", "last", "egtp", "estp")
DEMO_DEFAULTS = {"out": "runs/demo", "methods": DEMO_METHODS, "seeds": (0,)}
"""How ``lenpred demo``'s :class:`EvalConfig` differs from ``lenpred evaluate``'s (a few methods, one seed). Its
output goes to ``runs/demo`` (not tracked), so a user's run never rewrites the committed reference run
``results/demo`` (``lenpred demo --out results/demo`` regenerates that)."""
EXTERNAL_BASELINES = ("ssjf_reg", "ssjf_mc", "s3", "pia", "trail", "ltr")
RESUME_IGNORE = ("out", "cache", "methods", "threads", "bootstrap_resamples")
"""Settings a finished method does not depend on: a rerun that changes only these resumes (more methods, more
resamples, another thread count: results do not depend on it)."""


@dataclass
class EvalConfig:
    """Settings of ``lenpred evaluate`` / ``lenpred demo``.

    Attributes:
        model: backbone (alias, ``.gguf`` file, directory, package or hub id; :func:`lenpred.backbone.resolve_model`);
            ``None``: the model the benchmark was sampled from (its ``bench.json``). A model of another revision than
            the benchmark's is refused.
        bench: benchmark directory (built by ``lenpred bench build``).
        data_dir: prompt data sets (``None``: ``$LENPRED_DATA_DIR`` or ``../shared/datasets``).
        out: where results.json / results.md / results.png go.
        cache: signal cache directory (``None``: under ``$LENPRED_CACHE``).
        layers: hidden-state indices extracted in full; every pooled head searches all of them on validation.
            ``None``: :func:`lenpred.signals.default_layers` of the model's depth (15, 22, 30 on SmolLM2).
        methods: predictors to run, by registry name, in table order.
        seeds: seeds of the learned predictors; hyper-parameters are chosen with the first.
        lambda1_grid, alpha_grid: ESTP's extra search (lambda2 fixed at 1: only the ratio and alpha matter up to the
            softmax scale, which alpha already covers).
        trail_layers: TRAIL's layer sweep (``None``: every index 1..L).
        pool_span: ``after_prefix`` (default) pools over everything after the template's fixed prefix — the users'
            content and the template's suffix (the assistant header), whose hidden states depend on the content;
            ``content`` over the users' content only; ``all`` over the whole prompt. Chosen on validation: 8 of 8
            heads were better with ``after_prefix`` (``scripts/pool_span_choice.py``).
        semantic_divisor: ESTP's ``N``: ``n`` (the paper) or ``causal`` (``n - j``).
        epochs: head training epochs (pooled heads, TRAIL).
        binning: soft-label bin placement (``log`` or ``quantile``, :func:`lenpred.heads.length_bin_edges`).
        proxy_encoder: the SSJF / S3 text encoder (``minilm``: the packaged all-MiniLM-L6-v2; or a local directory).
        proxy_epochs, proxy_max_length: fine-tuning epochs of the SSJF / S3 text encoders (whole encoder, bf16
            autocast) and the encoder tokens kept per prompt (the rest is cut): set for this CPU's budget.
        threads: torch threads for the backbone (``None``: torch default). The small heads always train on one
            thread (faster on a loaded 2-core machine; 20-70x with contention) and the text proxies on their own
            fixed count, so results do not depend on it.
        bootstrap_resamples: prompt-clustered bootstrap resamples for the 95 % intervals.
    """

    model: str | None = None
    bench: str = DEFAULT_BENCH
    data_dir: str | None = None
    out: str = "results/evaluate"
    cache: str | None = None
    layers: tuple[int, ...] | None = None
    methods: tuple[str, ...] = ALL_METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    # the tuner's settings: their defaults are TuningSettings' (one copy); listed here for the CLI and results.json
    lambda1_grid: tuple[float, ...] = TuningSettings.lambda1_grid
    alpha_grid: tuple[float, ...] = TuningSettings.alpha_grid
    trail_layers: tuple[int, ...] | None = TuningSettings.trail_layers
    pool_span: str = TuningSettings.pool_span
    semantic_divisor: str = TuningSettings.semantic_divisor
    epochs: int = TuningSettings.epochs
    binning: str = TuningSettings.binning
    proxy_encoder: str = TuningSettings.proxy_encoder
    proxy_epochs: int = TuningSettings.proxy_epochs
    proxy_max_length: int = TuningSettings.proxy_max_length
    threads: int | None = None
    bootstrap_resamples: int = 2000

    def __post_init__(self):
        from lenpred.tuning import check_run_settings  # deferred: torch; the CLI imports this module at start-up

        check_run_settings(self.methods, self.seeds, self.threads)
        tuning_settings(self)  # checks the tuning fields
        if self.bootstrap_resamples < 100:
            raise LenpredError("--bootstrap-resamples must be >= 100")


def check_output_paths(cfg: EvalConfig) -> None:
    """Refuse, before any work, output and cache paths that are (or lie under) files, or result files that are
    directories."""
    out_dir = Path(cfg.out)
    for option, path in (("--out", out_dir), ("--cache", Path(cfg.cache) if cfg.cache else None)):
        if path is not None and any(p.exists() and not p.is_dir() for p in (path, *path.parents)):
            raise LenpredError(f"{option} {path} is (or lies under) a file: pass a directory")
    for path in report_paths(out_dir).values():
        if path.is_dir():
            raise LenpredError(f"{path} is a directory, where the results file goes: remove it or pass another --out")
    for name, what in (("predictors", "the fitted predictors"), ("checkpoint", "an unfinished run's methods")):
        if (out_dir / name).is_file():
            raise LenpredError(f"{out_dir / name} is a file, where {what} go: remove it or pass another --out")


def tuning_settings(cfg: EvalConfig):
    """The tuner's :class:`~lenpred.tuning.TuningSettings` of a config (its fields of the same names)."""
    return TuningSettings(**{f.name: getattr(cfg, f.name) for f in fields(TuningSettings)})


def tuning_context(cfg: EvalConfig, layers: tuple[int, ...], num_layers: int, values: dict):
    """The :class:`~lenpred.tuning.TuningContext` of a config (:func:`lenpred.tuning.tuning_context`)."""
    from lenpred import tuning

    return tuning.tuning_context(tuning_settings(cfg), layers, num_layers, values)


@dataclass
class PreparedRun:
    """A benchmark ready to tune on (:func:`prepare_run`): the model, its records as requests with their inputs
    provided, the resolved layers, the tuning context, the records table and the providers' seconds."""

    backbone: object
    data: object
    layers: tuple[int, ...]
    ctx: object
    table: object
    timing: dict


def prepare_run(cfg: EvalConfig, needs: set[str], backbone=None) -> PreparedRun:
    """Records (checked before the model loads) → backbone → requests → the inputs ``needs`` names → tuning context.

    :func:`lenpred.dataset.load_dataset` with the config's settings, plus the config's tuning context. The model is
    ``cfg.model`` or the benchmark's own (:func:`lenpred.bench.records.benchmark_model`), and must be the revision the
    benchmark was sampled from.

    Raises:
        LenpredError: a broken benchmark, a model of another revision than the benchmark's, bad layers, or any
            input provider's error.
    """
    from lenpred.dataset import load_dataset

    ds = load_dataset(cfg.bench, needs, model=cfg.model, backbone=backbone, data_dir=cfg.data_dir, cache=cfg.cache,
                      layers=cfg.layers, trail_layers=cfg.trail_layers, threads=cfg.threads)
    ctx = tuning_context(cfg, ds.layers, ds.backbone.num_layers, ds.values)
    return PreparedRun(ds.backbone, ds.data, ds.layers, ctx, ds.table, ds.timing)


@dataclass
class EvalReport:
    """What :func:`run_evaluate` returns; :meth:`to_dict` is the content of ``results.json`` (key for key).

    Attributes:
        results: ``{method: {group: metrics}}``; groups are the scenarios and ``overall``, metrics those of
            :func:`lenpred.metrics.score_methods` (MAE in tokens with its 95 % interval, paired differences, ...).
        scores: the rest of ``score_methods``' output, in its order (``best_external``, ``oracle_floor``, ...).
        config: the resolved :class:`EvalConfig` (``model`` and ``layers`` resolved), as ``asdict`` gives it.
        model_revision: the backbone's revision (its content hash for local files).
        overhead: signal extraction vs plain prefill (``None`` when no method reads the signals).
        tuning: per method ``{"chosen", "num_candidates", "sweep", "diagnostics"}`` (the validation search).
        timing_s: wall seconds of the whole run, the input providers and each method's fit.
        values: the tuning context's values (label bins, caps, ...).
        num_samples: samples per split.
        dropped_duplicates: duplicate records left out of the splits.
        benchmark_complete: ``False`` while the benchmark still has shards to sample.
        censored_test_share: share of test responses stopped by their cap.
        paths: the files written (``{"json", "md", "png"}``); not part of the JSON.
    """

    results: dict
    scores: dict
    config: dict
    model_revision: str | None
    overhead: dict | None
    tuning: dict
    timing_s: dict
    values: dict
    num_samples: dict
    dropped_duplicates: int
    benchmark_complete: bool
    censored_test_share: float
    paths: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The ``results.json`` content: ``results``, then the other scores, then the run's settings and timings."""
        return {"results": self.results, **self.scores, "config": self.config, "model_revision": self.model_revision,
                "overhead": self.overhead, "tuning": self.tuning, "timing_s": self.timing_s, "values": self.values,
                "num_samples": self.num_samples, "dropped_duplicates": self.dropped_duplicates,
                "benchmark_complete": self.benchmark_complete, "censored_test_share": self.censored_test_share}


def run_evaluate(cfg: EvalConfig) -> EvalReport:
    """Run the evaluation and write ``cfg.out`` (``results.json`` / ``.md`` / ``.png`` and the fitted predictors);
    :func:`render_evaluate` prints the report. Progress goes to the ``lenpred`` logger.

    Resumable: each finished method is kept in :func:`checkpoint_dir` until the report is written, and a rerun with
    the same settings (those in :data:`RESUME_IGNORE` may differ) on the same benchmark starts at the first
    unfinished method.

    Raises:
        LenpredError: an output path that cannot be written, a checkpoint made with other settings or on another
            benchmark (refused before any work, naming what differs), a broken benchmark or any input provider's
            error.
    """
    from lenpred.metrics import score_methods
    from lenpred.predictors import PREDICTORS

    check_output_paths(cfg)
    record = load_resumable(checkpoint_dir(cfg) / "runs.json", asdict(cfg), ignore=RESUME_IGNORE,
                            fingerprint={"benchmark": _benchmark_fingerprint(cfg.bench)})  # refused before any work
    t_start = time.perf_counter()
    logger.info("loading %s and %s …", cfg.model or "the benchmark model", cfg.bench)
    needs = {i for m in cfg.methods for i in PREDICTORS[m]().reads().inputs}
    run = prepare_run(cfg, needs)
    backbone, data, layers, ctx = run.backbone, run.data, run.layers, run.ctx
    if not data.complete:
        logger.warning("warning: %s is incomplete; finish it with `lenpred bench build` before quoting these numbers",
                       cfg.bench)
    runs = _method_runs(cfg, data, ctx, record)
    test = data.index["test"]
    scores = score_methods({m: runs[m].predictions for m in cfg.methods}, data.y[test], data.cols["scenario"][test],
                           data.cols["prompt_id"][test], data.censored[test], "scenario_median", EXTERNAL_BASELINES,
                           cfg.bootstrap_resamples)
    overhead = _overhead(backbone, data, layers) if "signals" in needs else None
    resolved = {"model": cfg.model or backbone.model_id, "layers": list(layers) if cfg.layers is None else cfg.layers}
    report = EvalReport(
        results=scores["results"], scores={k: v for k, v in scores.items() if k != "results"},
        config={**asdict(cfg), **resolved}, model_revision=backbone.revision, overhead=overhead,
        tuning={m: {"chosen": r.chosen, "num_candidates": len(r.sweep), "sweep": r.sweep,
                    "diagnostics": r.diagnostics} for m, r in runs.items()},
        timing_s={"wall": time.perf_counter() - t_start, **run.timing, "fit": {m: r.fit_s for m, r in runs.items()}},
        values=ctx.values, num_samples={s: len(i) for s, i in data.index.items()},
        dropped_duplicates=data.dropped_duplicates, benchmark_complete=data.complete,
        censored_test_share=float(data.censored[test].mean()))
    report.paths = _save(report, {m: r.fitted for m, r in runs.items()}, Path(cfg.out))
    shutil.rmtree(checkpoint_dir(cfg))  # every finished method is in the report and predictors/ now
    return report


def checkpoint_dir(cfg: EvalConfig) -> Path:
    """Where an unfinished run keeps its finished methods: ``<out>/checkpoint`` (``runs.json`` and one
    ``<method>.safetensors`` per method); removed once the report is written."""
    return Path(cfg.out) / "checkpoint"


def _benchmark_fingerprint(bench: str) -> dict:
    """The benchmark's plan and model revision (:func:`lenpred.bench.records.benchmark_key`) and its shard count
    (a benchmark still being sampled gains shards, and so records)."""
    from lenpred.bench.records import benchmark_key, shard_files

    return {**benchmark_key(bench), "shards": len(shard_files(Path(bench)))}


def _method_runs(cfg: EvalConfig, data, ctx, record: dict) -> dict:
    """Tune and refit every method of ``cfg`` (:func:`lenpred.tuning.tune_and_refit`), in
    :func:`lenpred.tuning.fit_order`, with a progress bar; returns ``{method: MethodRun}``.

    A method finished by an earlier run with the same settings (``record``, from
    :func:`lenpred.studies.resume.load_resumable`) is read back from :func:`checkpoint_dir` instead of refit; each
    method finished here is written there at once (its fitted predictor, then ``runs.json``), so an interrupted run
    resumes at the method it stopped in, with the same predictions (JSON keeps float64 exactly)."""
    import numpy as np
    from tqdm.auto import tqdm

    from lenpred.predictors import PREDICTORS, Predictor
    from lenpred.tuning import MethodRun, fit_order, tune_and_refit, tune_dependencies

    ckpt, runs = checkpoint_dir(cfg), {}
    with tqdm(fit_order(cfg.methods), desc="train + tune on validation", unit="method") as bar:
        for method in bar:
            stored = record["runs"].get(method)
            if stored is not None:
                bar.set_postfix(method=method, resumed=True)
                runs[method] = MethodRun([np.asarray(p, dtype=np.float64) for p in stored["predictions"]],
                                         stored["chosen"], stored["sweep"],
                                         Predictor.load(ckpt / f"{method}.safetensors"), stored["fit_s"],
                                         stored["diagnostics"])
                ctx.chosen[method] = runs[method].chosen  # the choice a later method's grid reads (ltr: ESTP's)
                continue
            tune_dependencies(method, data, ctx, cfg.seeds[0])
            bar.set_postfix(method=method, candidates=len(PREDICTORS[method].param_grid(ctx)))
            run = runs[method] = tune_and_refit(method, data, ctx, cfg.seeds)
            run.fitted.save(ckpt / f"{method}.safetensors")
            record["runs"][method] = {"predictions": [p.tolist() for p in run.predictions], "chosen": run.chosen,
                                      "sweep": run.sweep, "fit_s": run.fit_s, "diagnostics": run.diagnostics}
            write_json(ckpt / "runs.json", record)
    return runs


def _overhead(backbone, data, layers) -> dict:
    """Signal extraction vs plain prefill on the first 8 test prompts (:func:`lenpred.inputs.cache.measure_overhead`)."""
    from lenpred.inputs.cache import measure_overhead

    prompts = list(dict.fromkeys(data.cols["prompt_id"][data.index["test"]]))[:8]
    return measure_overhead(backbone, [data.by_prompt[p].token_ids for p in prompts], layers)


def _save(report: EvalReport, fitted: dict, out_dir: Path) -> dict[str, Path]:
    """Write the fitted predictors (``out_dir/predictors``, replaced whole once every method has run) and the
    report (:func:`lenpred.studies.evaluate_report.save_report`); returns the report's paths."""
    with atomic_path(out_dir / "predictors") as tmp:
        for method, predictor in fitted.items():
            predictor.save(tmp / f"{method}.safetensors")
    content = report.to_dict()
    return save_report(content["results"], {k: v for k, v in content.items() if k != "results"}, out_dir)


def render_evaluate(report: EvalReport, console, title: str = "output-length prediction, test split") -> None:
    """Print the report on ``console`` (a ``rich`` console): the MAE and floor-difference tables in a form that
    fits an 80-100 column terminal (:func:`lenpred.studies.evaluate_report.render_terminal_table`), the oracle
    floor, pooling weights, signal overhead and where every table went (the Markdown file holds them all)."""
    n_seeds = len(report.config["seeds"])
    seed_note = f"± std over {n_seeds} head seeds" if n_seeds > 1 else f"seed {report.config['seeds'][0]}"
    captions = {"mae": f"MAE in tokens ({seed_note}) and its 95 % prompt-bootstrap interval",
                "diff": "paired MAE differences to the per-scenario median floor (method − floor, 95 % CI; * = "
                        "excludes 0)"}
    has_diff = any(g.get("diff_floor") is not None for per in report.results.values() for g in per.values())
    for kind in ("mae", "diff") if has_diff else ("mae",):
        console.print(render_terminal_table(report.results, title=f"{title}: {captions[kind]}", kind=kind))
    best = report.scores.get("best_external") or {}
    if best:
        console.print("best external baseline per group (its paired differences: the Markdown file): "
                      + ", ".join(f"{g} {m}" for g, m in best.items()))
    console.print("oracle floor (leave-one-out per-prompt median, prompts with several samples): " + ", ".join(
        f"{g} {f['mae']:.1f} vs per-scenario median {f.get('floor_method_mae', float('nan')):.1f} "
        f"({f['num_prompts']} prompts)" for g, f in report.scores["oracle_floor"].items()))
    weights = {m: t["diagnostics"]["top_token_weight"] for m, t in report.tuning.items()
               if "top_token_weight" in t["diagnostics"]}
    if weights:
        console.print("median weight on the heaviest token: " + ", ".join(f"{m} {w:.3f}" for m, w in weights.items()))
    if report.overhead:
        o = report.overhead
        console.print(f"signal extraction vs plain prefill (batch of {o['batch_size']} test prompts, "
                      f"{o['num_prompt_tokens']} tokens): {o['signals_tok_s']:.0f} vs {o['plain_tok_s']:.0f} prompt "
                      f"tok/s (ratio {o['ratio']:.2f})")
    paths = report.paths
    console.print(f"wall time {report.timing_s['wall']:.0f} s; wrote {paths['json']}, {paths['md']} (every table: "
                  f"RMSE, Kendall tau, ±25 %, gap closed, uncapped MAE, tuning) and {paths['png']}")
