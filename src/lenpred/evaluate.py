"""One evaluation of every length predictor on a stored benchmark (``lenpred evaluate``; ``lenpred demo`` is the
same pipeline with a smaller method set on the first data set).

Steps (each with a progress bar where it takes more than a few seconds):

1. load the backbone and the benchmark records; re-read each prompt from its source file and check its
   token count against the record (a changed data directory is detected, not used);
2. compute what the chosen predictors read (their ``inputs``): prefill signals for every unique prompt
   (cached, resumable), the model's self-reported lengths for test prompts (PiA; cached);
3. for each method, pick hyper-parameters on the validation split with the first seed (layer; ESTP's
   lambda1 / alpha; TRAIL's layer from every hidden-state index; LTR reuses ESTP's pooled features),
   refit on train with every seed, predict test;
4. metrics per scenario and overall (MAE, RMSE, Kendall tau, within 25 %, MAE against per-prompt means),
   mean ± std over seeds, the oracle floor and the share of the gap each method closes; tables printed,
   saved as JSON, Markdown and PNG; the prefill overhead of signal extraction vs plain prefill.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError

ALL_METHODS = ("global_median", "prompt_length", "ssjf_reg", "ssjf_mc", "s3", "pia", "trail", "ltr", "mean", "last",
               "max", "entropy_only", "semantic_only", "egtp", "estp")
DEMO_METHODS = ("global_median", "prompt_length", "mean", "last", "egtp", "estp")
EXTERNAL_BASELINES = ("ssjf_reg", "ssjf_mc", "s3", "pia", "trail", "ltr")


@dataclass
class EvalConfig:
    """Settings of ``lenpred evaluate`` / ``lenpred demo``.

    Attributes:
        model: backbone (default: the packaged SmolLM2-135M-Instruct).
        bench: benchmark directory (built by ``lenpred bench build``).
        data_dir: prompt data sets (``None``: ``$LENPRED_DATA_DIR`` or ``../shared/datasets``).
        out: where results.json / results.md / results.png go.
        cache: signal cache directory (``None``: under ``$LENPRED_CACHE``).
        layers: hidden-state indices extracted in full and searched on validation (0..L; -1 = last).
        methods: predictors to run, by registry name, in table order.
        seeds: seeds of the learned predictors; hyper-parameters are chosen with the first.
        lambda1_grid, alpha_grid: ESTP search grid (lambda2 fixed at 1: only the ratio and alpha matter
            up to the softmax scale, which alpha already covers).
        trail_layers: TRAIL's layer sweep (``None``: every index 1..L).
        skip_shared_prefix: pool only over the tokens after the prefix every prompt shares (the chat
            template's system prompt and role header; see :func:`lenpred.backbone.shared_prefix_length`).
            It lowered ESTP's validation MAE from ~156 to ~127 tokens on smollm2-first (the attention sink
            at token 0 otherwise takes ~90 % of ESTP's weight).
        epochs: head training epochs (pooled heads, TRAIL).
        proxy_encoder: the SSJF / S3 text encoder (``minilm``: the packaged all-MiniLM-L6-v2; or a local directory).
        proxy_epochs, proxy_max_length: fine-tuning epochs of the SSJF / S3 text encoders (whole encoder, bf16
            autocast) and the encoder tokens kept per prompt (the rest is cut): set for this CPU's budget.
        threads: torch threads for the backbone and the proxy encoders (``None``: torch default). The small
            heads always train on one thread (faster on a loaded 2-core machine; 20-70x with contention).
    """

    model: str = "smollm2-135m-instruct"
    bench: str = "benchmarks/smollm2-forelen"
    data_dir: str | None = None
    out: str = "results/evaluate"
    cache: str | None = None
    layers: tuple[int, ...] = (15, 22, -1)
    methods: tuple[str, ...] = ALL_METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    lambda1_grid: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    alpha_grid: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    trail_layers: tuple[int, ...] | None = None
    skip_shared_prefix: bool = True
    epochs: int = 150
    proxy_encoder: str = "minilm"
    proxy_epochs: int = 2
    proxy_max_length: int = 128
    threads: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        from lenpred.predictors import PREDICTORS

        unknown = [m for m in self.methods if m not in PREDICTORS]
        if unknown:
            raise LenpredError(f"unknown methods {unknown}; valid: {', '.join(sorted(PREDICTORS))}")
        if not self.methods:
            raise LenpredError("no methods given: pass --methods with at least one predictor")
        if not self.seeds:
            raise LenpredError("no seeds given: pass --seeds like 0,1,2")
        bad_seeds = [s for s in self.seeds if not 0 <= s < 2**32]
        if bad_seeds:
            raise LenpredError(f"seeds must lie in 0..{2**32 - 1} (the range numpy and torch accept), got {bad_seeds}")
        if self.epochs < 1:
            raise LenpredError(f"--epochs must be >= 1, got {self.epochs}")
        if self.proxy_epochs < 1:
            raise LenpredError(f"--proxy-epochs must be >= 1, got {self.proxy_epochs}")
        if self.threads is not None and self.threads < 1:
            raise LenpredError(f"--threads must be >= 1, got {self.threads}")


def prompt_text(messages: list[dict[str, str]]) -> str:
    """The user-visible prompt: the messages' contents joined by blank lines (what text-only proxies read)."""
    return "\n\n".join(m["content"] for m in messages)


def load_samples(table, tokenizer, data_dir=None) -> tuple[dict, dict, dict]:
    """Benchmark records (a table from ``load_records``) as column arrays, ``{prompt_id: Request}`` whose token ids
    and text are re-read from the sources, and ``{prompt_id: chat messages}``.

    Raises:
        LenpredError: a prompt's re-tokenised length differs from the stored ``num_prompt_tokens``
            (the data directory or chat template is not the one the benchmark was built with).
    """
    from lenpred.backbone import chat_token_ids
    from lenpred.bench.sources import prompt_messages
    from lenpred.predictors import Request

    cols = {c: np.asarray(table.column(c).to_pylist()) for c in
            ("scenario", "prompt_id", "split", "num_output_tokens", "num_prompt_tokens", "finish_reason")}
    requests, messages = {}, {}
    for pid, n in dict(zip(cols["prompt_id"], cols["num_prompt_tokens"])).items():
        messages[pid] = prompt_messages(pid, data_dir)
        ids = chat_token_ids(tokenizer, messages[pid])
        if len(ids) != n:
            raise LenpredError(f"prompt {pid} has {len(ids)} tokens now but {n} in the benchmark: the data directory or "
                               "the model's chat template differs from the one the benchmark was built with")
        requests[pid] = Request(pid, ids, prompt_text(messages[pid]))
    return cols, requests, messages


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run a block with ``n`` torch intra-op threads (``None``: unchanged), restoring the previous count."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _candidates(method: str, cfg: EvalConfig, layers: tuple[int, ...], num_layers: int, skip: int,
                chosen: dict[str, dict]) -> list[dict]:
    """Constructor arguments to try on validation for ``method`` (the seed is added by the caller)."""
    from lenpred.predictors import PREDICTORS
    from lenpred.predictors.ltr import ListwiseRankingPredictor
    from lenpred.predictors.pooled import PooledHeadPredictor
    from lenpred.predictors.proxy import ProxyPredictor
    from lenpred.predictors.trail import TrailPredictor

    cls = PREDICTORS[method]
    head = {"head": {"epochs": cfg.epochs}}
    if issubclass(cls, TrailPredictor):
        sweep = cfg.trail_layers or tuple(range(1, num_layers + 1))
        return [{"layer": l, **head} for l in sweep]
    if issubclass(cls, ListwiseRankingPredictor):  # ESTP's pooled features: its chosen layer / lambda1 / alpha
        estp = chosen.get("estp", {"layer": layers[-1], "lambda1": 1.0, "alpha": 1.0})
        return [{k: estp[k] for k in ("layer", "lambda1", "alpha")} | {"skip_prefix_tokens": skip}]
    if issubclass(cls, PooledHeadPredictor):
        lambdas = cfg.lambda1_grid if cls.pooler_name == "estp" else (1.0,)
        alphas = cfg.alpha_grid if cls.pooler_name in ("estp", "entropy_only", "semantic_only") else (1.0,)
        return [{"layer": l, "lambda1": a, "alpha": b, "skip_prefix_tokens": skip, **head}
                for l, a, b in itertools.product(layers, lambdas, alphas)]
    if issubclass(cls, ProxyPredictor):  # CPU budget: prompts cut at 128 encoder tokens, bf16 autocast
        return [{"encoder": cfg.proxy_encoder, "epochs": cfg.proxy_epochs, "max_length": cfg.proxy_max_length,
                 "precision": "bfloat16"}]
    return [{}]


def _mae(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y)))


def takes_seed(method: str) -> bool:
    """Whether the registered predictor is learned with a seed (its constructor takes ``seed``)."""
    import inspect

    from lenpred.predictors import PREDICTORS

    return "seed" in inspect.signature(PREDICTORS[method]).parameters


def fit_with_validation(method: str, candidates: list[dict], requests: list, y: np.ndarray, train: np.ndarray,
                        val: np.ndarray, seed: int, extra: dict | None = None) -> tuple[object, dict, list[dict]]:
    """Fit every candidate on train (with ``seed`` where the predictor takes one) and keep the lowest validation MAE.

    A single candidate is fitted without looking at validation (its ``val_mae`` is ``None``).
    Returns ``(fitted predictor, chosen params, sweep)``; ``sweep`` lists each candidate's validation MAE.
    """
    from lenpred.predictors import make_predictor

    train_req, val_req = [requests[i] for i in train], [requests[i] for i in val]
    seeded = {"seed": seed} if takes_seed(method) else {}
    sweep = []
    for params in candidates:
        pred = make_predictor(method, **params, **(extra or {}), **seeded).fit(train_req, y[train])
        val_mae = _mae(pred.predict(val_req), y[val]) if len(candidates) > 1 else None
        sweep.append({**params, "val_mae": val_mae, "_predictor": pred})
    best = min(sweep, key=lambda r: r["val_mae"] or 0.0)
    chosen = {k: v for k, v in best.items() if not k.startswith("_")}
    return best["_predictor"], chosen, [{k: v for k, v in r.items() if not k.startswith("_")} for r in sweep]


def _fit_order(methods: tuple[str, ...]) -> list[str]:
    """LTR reuses ESTP's choice, so ESTP is fitted first when both run."""
    return sorted(methods, key=lambda m: m == "ltr")


def run_evaluate(cfg: EvalConfig, console=None, title: str = "output-length prediction, test split") -> dict:
    """Run the evaluation; returns the report dict (also written to ``cfg.out``)."""
    import torch
    from rich.console import Console
    from tqdm.auto import tqdm

    from lenpred.backbone import cache_dir, load_backbone, shared_prefix_length
    from lenpred.bench.build import load_records, read_manifest
    from lenpred.features import CACHE_FORMAT, extract_cached, measure_overhead
    from lenpred.io import atomic_path, stable_hash
    from lenpred.metrics import (aggregate_seeds, gap_closed, metrics_by_scenario, oracle_floor, render_table,
                                 report_paths, save_report)
    from lenpred.predictors import PREDICTORS
    from lenpred.signals import resolve_layers

    console = console or Console(width=max(Console().width, 160))
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
    t_start = time.perf_counter()
    table = load_records(cfg.bench)
    planned = read_manifest(Path(cfg.bench))["num_requests"]
    if table.num_rows < planned:
        console.print(f"[yellow]warning: {cfg.bench} is incomplete ({table.num_rows} of {planned} planned responses); "
                      "finish it with `lenpred bench build` before quoting these numbers[/yellow]")
    backbone = load_backbone(cfg.model, num_threads=cfg.threads)
    if any(not -backbone.num_layers - 1 <= l <= backbone.num_layers for l in cfg.layers):
        raise LenpredError(f"--layers must lie in -{backbone.num_layers + 1}..{backbone.num_layers} for this model "
                           f"({backbone.num_layers} layers), got {list(cfg.layers)}")
    if cfg.trail_layers is not None and any(not 1 <= l <= backbone.num_layers for l in cfg.trail_layers):
        raise LenpredError(f"--trail-layers must lie in 1..{backbone.num_layers} for this model, got "
                           f"{list(cfg.trail_layers)}")
    cols, by_prompt, messages = load_samples(table, backbone.tokenizer, cfg.data_dir)
    y = cols["num_output_tokens"].astype(np.float64)
    train, val, test = (np.flatnonzero(cols["split"] == s) for s in ("train", "validation", "test"))
    if min(len(train), len(val), len(test)) == 0:
        raise LenpredError(f"{cfg.bench} needs samples in train, validation and test (have {len(train)}, {len(val)}, "
                           f"{len(test)}): build more shards with `lenpred bench build`")
    needs = {i for m in cfg.methods for i in PREDICTORS[m].inputs}
    timing = {}

    layers = resolve_layers(cfg.layers, backbone.num_layers)
    if "signals" in needs:
        cache = Path(cfg.cache) if cfg.cache else cache_dir() / "signals" / (
            f"{Path(cfg.bench).name}-{backbone.revision}-{stable_hash([layers, CACHE_FORMAT], 8)}")
        t = time.perf_counter()
        signals = extract_cached(backbone, {p: r.token_ids for p, r in by_prompt.items()}, layers, cache)
        timing["signal_extraction"] = time.perf_counter() - t
        for p, r in by_prompt.items():
            r.signals = signals[p]
    tokens_per_word = None
    if "self_report" in needs:
        from lenpred.pia import ask_self_reports, tokens_per_word as measure_tpw

        t = time.perf_counter()
        test_ids = list(dict.fromkeys(cols["prompt_id"][test]))
        reports = ask_self_reports(backbone, {p: messages[p] for p in test_ids},
                                   cache_dir() / "self_reports" / f"{Path(cfg.bench).name}-{backbone.revision}.json",
                                   skip_too_long=True)
        for p, text in reports.items():
            by_prompt[p].self_report = text
        responses = table.column("response_token_ids").to_pylist()
        tokens_per_word = measure_tpw(backbone.tokenizer, [responses[i] for i in train])
        timing["self_reports"] = time.perf_counter() - t

    skip = shared_prefix_length(backbone.tokenizer) if cfg.skip_shared_prefix else 0
    requests = [by_prompt[p] for p in cols["prompt_id"]]
    train_req, test_req = [requests[i] for i in train], [requests[i] for i in test]
    runs, tuning, chosen, fit_s, predictions, saved = {}, {}, {}, {}, {}, {}
    for method in tqdm(_fit_order(cfg.methods), desc="train + tune on validation", unit="method"):
        t = time.perf_counter()
        extra = {"tokens_per_word": tokens_per_word} if method == "pia" else {}
        cands = _candidates(method, cfg, layers, backbone.num_layers, skip, chosen)
        threads = cfg.threads if "text" in PREDICTORS[method].inputs else 1
        with torch_threads(threads):
            best, chosen[method], sweep = fit_with_validation(method, cands, requests, y, train, val, cfg.seeds[0], extra)
            fitted = [best]
            if takes_seed(method):
                params = {k: v for k, v in chosen[method].items() if k != "val_mae"}
                fitted += [PREDICTORS[method](**params, **extra, seed=s).fit(train_req, y[train]) for s in cfg.seeds[1:]]
            preds = [p.predict(test_req) for p in fitted]
        predictions[method] = preds
        runs[method] = [metrics_by_scenario(y[test], p, cols["scenario"][test], cols["prompt_id"][test])
                        for p in preds]
        tuning[method] = {"chosen": chosen[method], "sweep": sweep}
        if method == "pia":  # no length stated (or prompt too long to ask: empty answer) -> median
            tuning[method]["unparsed"] = {"count": best.num_unparsed_, "of": best.num_predicted_,
                                          "empty_answers": sum(not r.self_report for r in test_req)}
        fit_s[method] = time.perf_counter() - t
        saved[method] = best

    # oracle floor over test prompts with several samples; gap closed relative to the global median there
    y_test, scen_test, pid_test = y[test], cols["scenario"][test], cols["prompt_id"][test]
    floor = oracle_floor(y_test, pid_test, scen_test)
    ids, counts = np.unique(pid_test, return_counts=True)
    multi = np.isin(pid_test, ids[counts > 1])
    in_floor = {g: multi & ((scen_test == g) if g != "overall" else True) for g in floor}
    for g, f in floor.items():
        f["global_median_mae"] = _mae(np.full(in_floor[g].sum(), np.median(y[train])), y_test[in_floor[g]])
    results = {}
    for method in cfg.methods:
        results[method] = aggregate_seeds(runs[method])
        for g, f in floor.items():
            gaps = [gap_closed(_mae(p[in_floor[g]], y_test[in_floor[g]]), f["global_median_mae"], f["mae"])
                    for p in predictions[method]]
            results[method][g]["gap_closed"] = None if None in gaps else float(np.mean(gaps))

    overhead = None
    if "signals" in needs:
        test_prompts = list(dict.fromkeys(cols["prompt_id"][test]))[:8]
        overhead = measure_overhead(backbone, [by_prompt[p].token_ids for p in test_prompts], layers)
    wall_s = time.perf_counter() - t_start
    seed_note = f"± std over {len(cfg.seeds)} seeds" if len(cfg.seeds) > 1 else f"seed {cfg.seeds[0]}"
    console.print(render_table(results, title=f"{title}: MAE / RMSE (tokens; {seed_note})"))
    console.print(render_table(results, title=f"{title}: ranking, accuracy, oracle gap", detail=True))
    console.print("oracle floor (leave-one-out per-prompt median, prompts with several samples): " + ", ".join(
        f"{g} {f['mae']:.1f} vs global median {f['global_median_mae']:.1f} ({f['num_prompts']} prompts)"
        for g, f in floor.items()))
    if overhead:
        console.print(f"signal extraction vs plain prefill (batch of {overhead['batch_size']} test prompts, "
                      f"{overhead['num_prompt_tokens']} tokens): {overhead['signals_tok_s']:.0f} vs "
                      f"{overhead['plain_tok_s']:.0f} prompt tok/s (ratio {overhead['ratio']:.2f})")
    best_external = {g: min((results[m][g]["mae"], m) for m in cfg.methods if m in EXTERNAL_BASELINES)
                     for g in results[cfg.methods[0]]} if set(EXTERNAL_BASELINES) & set(cfg.methods) else {}
    ratios = {m: {g: results[m][g]["mae"] / best_external[g][0] for g in best_external}
              for m in ("egtp", "estp") if m in cfg.methods and best_external}
    extra = {"config": asdict(cfg), "model_revision": backbone.revision, "skipped_prefix_tokens": skip,
             "oracle_floor": floor, "best_external_baseline": {g: {"method": m, "mae": v} for g, (v, m) in
                                                               best_external.items()},
             "mae_ratio_to_best_external": ratios, "overhead": overhead, "tuning": tuning,
             "timing_s": {"wall": wall_s, **timing, "fit": fit_s}, "torch_threads": torch.get_num_threads(),
             "tokens_per_word": tokens_per_word,
             "num_samples": {"train": len(train), "validation": len(val), "test": len(test)},
             "benchmark_complete": table.num_rows >= planned,
             "censored_test_share": float(np.mean(cols["finish_reason"][test] == "length"))}
    with atomic_path(out_dir / "predictors") as tmp:  # once every method has run; replaces the old folder whole
        for method, predictor in saved.items():
            predictor.save(tmp / f"{method}.safetensors")
    paths = save_report(results, extra, out_dir)
    console.print(f"wall time {wall_s:.0f} s; wrote {paths['json']}, {paths['md']} and {paths['png']}")
    return {"results": results, **extra}
