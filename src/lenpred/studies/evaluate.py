"""``lenpred evaluate`` / ``lenpred demo``: records → input providers → tune on validation → refit per seed →
score → report. Each step is one function of its own module (:mod:`.data`, :mod:`lenpred.inputs`, :mod:`.tune`,
:mod:`.metrics`, :mod:`.report`); no method is special-cased here.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lenpred.errors import LenpredError

FLOORS = ("scenario_median", "scenario_prompt_length")
ALL_METHODS = (*FLOORS, "global_median", "prompt_length", "ssjf_reg", "ssjf_mc", "s3", "pia", "trail", "ltr", "mean",
               "last", "max", "entropy_only", "semantic_only", "egtp", "estp")
DEMO_METHODS = (*FLOORS, "mean", "last", "egtp", "estp")
EXTERNAL_BASELINES = ("ssjf_reg", "ssjf_mc", "s3", "pia", "trail", "ltr")


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
    bench: str = "benchmarks/smollm2-forelen"
    data_dir: str | None = None
    out: str = "results/evaluate"
    cache: str | None = None
    layers: tuple[int, ...] | None = None
    methods: tuple[str, ...] = ALL_METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    lambda1_grid: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    alpha_grid: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    trail_layers: tuple[int, ...] | None = None
    pool_span: str = "after_prefix"
    semantic_divisor: str = "n"
    epochs: int = 150
    binning: str = "log"
    proxy_encoder: str = "minilm"
    proxy_epochs: int = 2
    proxy_max_length: int = 128
    threads: int | None = None
    bootstrap_resamples: int = 2000

    def __post_init__(self):
        from lenpred.heads import BINNINGS
        from lenpred.predictors import PREDICTORS
        from lenpred.predictors.pooled import POOL_SPANS
        from lenpred.signals import SEMANTIC_DIVISORS

        unknown = [m for m in self.methods if m not in PREDICTORS]
        if unknown:
            raise LenpredError(f"unknown methods {unknown}; valid: {', '.join(sorted(PREDICTORS))}")
        checks = [(not self.methods, "no methods given: pass --methods with at least one predictor"),
                  (not self.seeds, "no seeds given: pass --seeds like 0,1,2"),
                  (any(not 0 <= s < 2**32 for s in self.seeds),
                   f"seeds must lie in 0..{2**32 - 1} (the range numpy and torch accept), got {list(self.seeds)}"),
                  (self.epochs < 1, f"--epochs must be >= 1, got {self.epochs}"),
                  (self.proxy_epochs < 1, f"--proxy-epochs must be >= 1, got {self.proxy_epochs}"),
                  (self.threads is not None and self.threads < 1, f"--threads must be >= 1, got {self.threads}"),
                  (self.pool_span not in POOL_SPANS, f"--pool-span must be one of {', '.join(POOL_SPANS)}"),
                  (self.semantic_divisor not in SEMANTIC_DIVISORS,
                   f"--semantic-divisor must be one of {', '.join(SEMANTIC_DIVISORS)}"),
                  (self.binning not in BINNINGS, f"--binning must be one of {', '.join(BINNINGS)}"),
                  (self.bootstrap_resamples < 100, "--bootstrap-resamples must be >= 100")]
        for failed, message in checks:
            if failed:
                raise LenpredError(message)


def check_output_paths(cfg: EvalConfig) -> None:
    """Refuse, before any work, output and cache paths that are (or lie under) files, or result files that are
    directories."""
    from lenpred.studies.evaluate_report import report_paths

    out_dir = Path(cfg.out)
    for option, path in (("--out", out_dir), ("--cache", Path(cfg.cache) if cfg.cache else None)):
        if path is not None and any(p.exists() and not p.is_dir() for p in (path, *path.parents)):
            raise LenpredError(f"{option} {path} is (or lies under) a file: pass a directory")
    for path in report_paths(out_dir).values():
        if path.is_dir():
            raise LenpredError(f"{path} is a directory, where the results file goes: remove it or pass another --out")
    if (out_dir / "predictors").is_file():
        raise LenpredError(f"{out_dir / 'predictors'} is a file, where the fitted predictors go: remove it or pass "
                           "another --out")


def _check_layers(cfg: EvalConfig, num_layers: int) -> tuple[int, ...]:
    from lenpred.signals import default_layers, resolve_layers

    if cfg.layers is None:
        return default_layers(num_layers)
    if any(not -num_layers - 1 <= l <= num_layers for l in cfg.layers):
        raise LenpredError(f"--layers must lie in -{num_layers + 1}..{num_layers} for this model ({num_layers} "
                           f"layers), got {list(cfg.layers)}")
    if cfg.trail_layers is not None and any(not 1 <= l <= num_layers for l in cfg.trail_layers):
        raise LenpredError(f"--trail-layers must lie in 1..{num_layers} for this model, got {list(cfg.trail_layers)}")
    return resolve_layers(cfg.layers, num_layers)


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): there bf16 autocast halves the text
    proxies' fine-tuning time; without it (e.g. an AVX2-only CPU) bf16 is ~15x *slower* than float32 (measured:
    40 vs 2.4 s per SSJF step, `scripts/proxy_fit_time.py`)."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return "BF16" in capability or "AMX" in capability


def tuning_context(cfg: EvalConfig, layers: tuple[int, ...], num_layers: int, values: dict):
    """The :class:`~lenpred.tuning.TuningContext` of a config."""
    from lenpred.tuning import TuningContext

    return TuningContext(
        layers=layers, trail_layers=cfg.trail_layers or tuple(range(1, num_layers + 1)),
        lambda1_grid=cfg.lambda1_grid, alpha_grid=cfg.alpha_grid,
        pooled_settings={"pool_span": cfg.pool_span, "semantic_divisor": cfg.semantic_divisor,
                         "head": {"epochs": cfg.epochs, "binning": cfg.binning}},
        proxy_settings={"encoder": cfg.proxy_encoder, "epochs": cfg.proxy_epochs, "max_length": cfg.proxy_max_length,
                        "precision": "bfloat16" if native_bf16() else "float32"},
        values=values)


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

    The one loading path of ``lenpred evaluate``, ``LengthPredictor.fit`` and the choice scripts. The model is
    ``cfg.model`` or the benchmark's own (:func:`lenpred.bench.build.benchmark_model`), and must be the revision the
    benchmark was sampled from.

    Raises:
        LenpredError: a broken benchmark, a model of another revision than the benchmark's, bad layers, or any
            input provider's error.
    """
    from lenpred.backbone import load_backbone
    from lenpred.bench.build import benchmark_model, check_benchmark_model, load_records
    from lenpred.dataset import load_eval_data
    from lenpred.inputs import provide_inputs

    table = load_records(cfg.bench)  # a missing or broken benchmark fails before the model loads
    backbone = backbone or load_backbone(benchmark_model(cfg.bench, cfg.model), num_threads=cfg.threads)
    check_benchmark_model(cfg.bench, backbone.model_id, backbone.revision)
    layers = _check_layers(cfg, backbone.num_layers)
    data = load_eval_data(cfg.bench, backbone.tokenizer, cfg.data_dir, table)
    values, timing = provide_inputs(needs, backbone, data, {"layers": layers, "cache": cfg.cache, "bench": cfg.bench})
    return PreparedRun(backbone, data, layers, tuning_context(cfg, layers, backbone.num_layers, values), table, timing)


def run_evaluate(cfg: EvalConfig, console=None, title: str = "output-length prediction, test split") -> dict:
    """Run the evaluation; returns the report dict (also written to ``cfg.out``)."""
    from rich.console import Console
    from tqdm.auto import tqdm

    from lenpred.metrics import score_methods
    from lenpred.tuning import fit_order, tune_and_refit, tune_dependencies
    from lenpred.predictors import PREDICTORS

    console = console or Console(width=max(Console().width, 160))
    check_output_paths(cfg)
    t_start = time.perf_counter()
    console.print(f"loading {cfg.model or 'the benchmark model'} and {cfg.bench} …")
    needs = {i for m in cfg.methods for i in PREDICTORS[m].inputs}
    run = prepare_run(cfg, needs)
    backbone, data, layers, ctx = run.backbone, run.data, run.layers, run.ctx
    if not data.complete:
        console.print(f"[yellow]warning: {cfg.bench} is incomplete; finish it with `lenpred bench build` before "
                      "quoting these numbers[/yellow]")
    runs = {}
    with tqdm(fit_order(cfg.methods), desc="train + tune on validation", unit="method") as bar:
        for method in bar:
            tune_dependencies(method, data, ctx, cfg.seeds[0])  # the choices its grid reads (ltr: ESTP's)
            bar.set_postfix(method=method, candidates=len(PREDICTORS[method].param_grid(ctx)))
            runs[method] = tune_and_refit(method, data, ctx, cfg.seeds)
    test = data.index["test"]
    scores = score_methods({m: runs[m].predictions for m in cfg.methods}, data.y[test], data.cols["scenario"][test],
                           data.cols["prompt_id"][test], data.censored[test], "scenario_median", EXTERNAL_BASELINES,
                           cfg.bootstrap_resamples)
    overhead = _overhead(backbone, data, layers) if "signals" in needs else None
    resolved = {"model": cfg.model or backbone.model_id, "layers": list(layers) if cfg.layers is None else cfg.layers}
    report = {**scores, "config": {**asdict(cfg), **resolved}, "model_revision": backbone.revision, "overhead": overhead,
              "tuning": {m: {"chosen": r.chosen, "num_candidates": len(r.sweep), "sweep": r.sweep,
                             "diagnostics": r.diagnostics} for m, r in runs.items()},
              "timing_s": {"wall": time.perf_counter() - t_start, **run.timing,
                           "fit": {m: r.fit_s for m, r in runs.items()}},
              "values": ctx.values, "num_samples": {s: len(i) for s, i in data.index.items()},
              "dropped_duplicates": data.dropped_duplicates, "benchmark_complete": data.complete,
              "censored_test_share": float(data.censored[test].mean())}
    _print_and_save(report, {m: r.fitted for m, r in runs.items()}, cfg, console, title)
    return report


def _overhead(backbone, data, layers) -> dict:
    """Signal extraction vs plain prefill on the first 8 test prompts (:func:`lenpred.inputs.cache.measure_overhead`)."""
    from lenpred.inputs.cache import measure_overhead

    prompts = list(dict.fromkeys(data.cols["prompt_id"][data.index["test"]]))[:8]
    return measure_overhead(backbone, [data.by_prompt[p].token_ids for p in prompts], layers)


def _print_and_save(report: dict, fitted: dict, cfg: EvalConfig, console, title: str) -> None:
    from lenpred.studies.evaluate_report import TABLES, render_table, save_report
    from lenpred.io import atomic_path

    results = report["results"]
    seed_note = f"± std over {len(cfg.seeds)} head seeds" if len(cfg.seeds) > 1 else f"seed {cfg.seeds[0]}"
    captions = {"mae": f"MAE in tokens ({seed_note}) and its 95 % prompt-bootstrap interval",
                "diff": "paired MAE differences (method − reference, 95 % CI; * = excludes 0): floor = per-scenario "
                        "median; best ext. = best external baseline of the group: "
                        + ", ".join(f"{g} {m}" for g, m in report["best_external"].items()),
                "detail": "RMSE, Kendall tau, within ±25 %, gap closed to the oracle floor, MAE of uncapped "
                          "responses, share of capped responses predicted below their cap"}
    for kind in TABLES:
        console.print(render_table(results, title=f"{title}: {captions[kind]}", kind=kind))
    console.print("oracle floor (leave-one-out per-prompt median, prompts with several samples): " + ", ".join(
        f"{g} {f['mae']:.1f} vs per-scenario median {f.get('floor_method_mae', float('nan')):.1f} "
        f"({f['num_prompts']} prompts)" for g, f in report["oracle_floor"].items()))
    weights = {m: t["diagnostics"]["top_token_weight"] for m, t in report["tuning"].items()
               if "top_token_weight" in t["diagnostics"]}
    if weights:
        console.print("median weight on the heaviest token: " + ", ".join(f"{m} {w:.3f}" for m, w in weights.items()))
    if report["overhead"]:
        o = report["overhead"]
        console.print(f"signal extraction vs plain prefill (batch of {o['batch_size']} test prompts, "
                      f"{o['num_prompt_tokens']} tokens): {o['signals_tok_s']:.0f} vs {o['plain_tok_s']:.0f} prompt "
                      f"tok/s (ratio {o['ratio']:.2f})")
    out_dir = Path(cfg.out)
    with atomic_path(out_dir / "predictors") as tmp:  # once every method has run; replaces the old folder whole
        for method, predictor in fitted.items():
            predictor.save(tmp / f"{method}.safetensors")
    paths = save_report(results, {k: v for k, v in report.items() if k != "results"}, out_dir)
    console.print(f"wall time {report['timing_s']['wall']:.0f} s; wrote {paths['json']}, {paths['md']} and "
                  f"{paths['png']}")
