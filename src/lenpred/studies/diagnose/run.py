"""``lenpred diagnose``: misalignment, attribution, ablations, cheaper entropy and overhead on the committed
benchmark. Each section writes ``<out>/<section>.json`` (atomically) and the report is re-rendered from every section
JSON present, so sections can be run (or re-run) one at a time.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from lenpred.dataset import load_dataset
from lenpred.errors import LenpredError
from lenpred.io import atomic_path, write_json
from lenpred.metrics import clustered_bootstrap
from lenpred.pooling import Pooler
from lenpred.predictors import Predictor
from lenpred.predictors.pooled import request_spans
from lenpred.studies.diagnose.ablation import run_ablations
from lenpred.studies.diagnose.attribution import correlations, gradient_attribution, pooled_span
from lenpred.studies.diagnose.config import DiagnoseConfig
from lenpred.studies.diagnose.entropy import (entropy_agreement, frequent_vocabulary, pruned_entropy,
                                              verify_cached_entropy, with_entropy)
from lenpred.studies.diagnose.misalignment import (TokenWeightTally, misalignment_shares, top_token_share,
                                                   within_prompt_percentile)
from lenpred.studies.diagnose.overhead import breakdown, overhead_grid
from lenpred.studies.diagnose.report import write_report
from lenpred.torch_state import torch_threads, with_backbone_threads
from lenpred.tuning import TuningSettings, check_run_settings, fit_and_score, tuning_context

logger = logging.getLogger(__name__)

SINK_ALPHAS = (0.25, 0.5, 1.0, 2.0, 4.0)


def _chosen(cfg: DiagnoseConfig) -> dict:
    path = Path(cfg.evaluate) / "results.json"
    if not path.is_file():
        raise LenpredError(f"{path} is missing: run `lenpred evaluate` first (diagnose reads its chosen settings)")
    r = json.loads(path.read_text())
    return {m: r["tuning"][m]["chosen"] for m in ("estp", "egtp", "entropy_only", "semantic_only", "mean")
            if m in r["tuning"]} | {"_config": r["config"]}


def _scenario_ci(values: np.ndarray, scenarios: np.ndarray, ids: np.ndarray, n_resamples: int) -> dict:
    """Mean of per-prompt values per scenario and overall, with a prompt bootstrap 95 % interval."""
    out = {}
    for g in [*sorted(set(scenarios.tolist())), "overall"]:
        m = np.ones(len(values), bool) if g == "overall" else scenarios == g
        est, lo, hi = clustered_bootstrap(values[m], ids[m], n_resamples)
        out[g] = {"mean": est, "ci": [lo, hi], "num_prompts": int(m.sum())}
    return out


def _token_strings(tokenizer):
    memo = {}

    def decode(ids):
        out = []
        for t in ids:
            if t not in memo:
                memo[t] = repr(tokenizer.decode([t]))[1:-1]
            out.append(memo[t])
        return out
    return decode


def misalignment_section(data, tokenizer, chosen: dict, n_resamples: int) -> tuple[dict, dict]:
    """Misalignment shares, semantic-score concentration, pooling-weight concentration and the EGTP-vs-ESTP token
    tally over every distinct prompt (spans of >= 5 tokens). Returns ``(json, arrays for the figure)``."""
    from collections import Counter

    settings = chosen["estp"]
    pool_span, divisor = settings["pool_span"], settings["semantic_divisor"]
    poolers = {"egtp": Pooler("egtp"), "estp": Pooler("estp", settings["lambda1"], 1.0, settings["alpha"]),
               "entropy_only": Pooler("entropy_only", alpha=chosen.get("entropy_only", {}).get("alpha", 1.0)),
               "semantic_only": Pooler("semantic_only", alpha=chosen.get("semantic_only", {}).get("alpha", 1.0))}
    decode = _token_strings(tokenizer)
    tally, top_sem = TokenWeightTally(), Counter()
    rows, pct = [], {"entropy": [], "semantic": [], "scenario": []}
    for pid, req in data.by_prompt.items():
        span = request_spans([req], pool_span, divisor)[0]
        H, S = span.token_entropy, span.semantic_score
        m = H.numel()
        if m < 5:
            continue
        start = len(req.token_ids) - m if pool_span == "after_prefix" else 0
        strings = decode(req.token_ids[start:start + m]) if pool_span == "after_prefix" else None
        shares = misalignment_shares(H, S)
        w = {k: p.weights(H, S) for k, p in poolers.items()}
        row = {"prompt_id": pid, "scenario": req.scenario, "m": m, **shares,
               "semantic_top_share": top_token_share(S),
               **{f"top_weight_{k}": float(v.max()) for k, v in w.items()}}
        if strings is not None:
            top_sem[strings[int(torch.argmax(S))]] += 1
            tally.add(strings, w["egtp"], w["estp"])
        for a in SINK_ALPHAS:  # how concentrated semantic-only pooling gets as its temperature falls
            row[f"semantic_only_top_weight_alpha{a:g}"] = float(Pooler("semantic_only", alpha=a).weights(H, S).max())
        rows.append(row)
        pct["entropy"].append(within_prompt_percentile(H))
        pct["semantic"].append(within_prompt_percentile(S))
        pct["scenario"].append(np.full(m, req.scenario, dtype=object))
    sc = np.array([r["scenario"] for r in rows])
    ids = np.array([r["prompt_id"] for r in rows])
    col = lambda k: np.array([r[k] for r in rows], dtype=np.float64)
    keys = ("high_entropy_low_semantic", "high_semantic_low_entropy", "chance", "semantic_top_share",
            *(f"top_weight_{k}" for k in poolers))
    out = {"pool_span": pool_span, "semantic_divisor": divisor, "num_prompts": len(rows),
           "estp_params": {"lambda1": settings["lambda1"], "lambda2": 1.0, "alpha": settings["alpha"]},
           "stats": {k: _scenario_ci(col(k), sc, ids, n_resamples) for k in keys},
           "median_top_weight": {k: float(np.median(col(f"top_weight_{k}"))) for k in poolers},
           "semantic_top_share_median": float(np.median(col("semantic_top_share"))),
           "semantic_only_top_weight_by_alpha": {
               f"{a:g}": {"median": float(np.median(col(f"semantic_only_top_weight_alpha{a:g}"))),
                          "p90": float(np.quantile(col(f"semantic_only_top_weight_alpha{a:g}"), 0.9))}
               for a in SINK_ALPHAS},
           "top_semantic_tokens": [{"token": t, "prompts": c, "share": c / len(rows)}
                                   for t, c in top_sem.most_common(10)],
           "egtp_vs_estp_tokens": tally.table()}
    figure = {k: np.concatenate(v) for k, v in pct.items()}
    return out, figure


@with_backbone_threads
def attribution_section(backbone, data, evaluate_dir: str, per_scenario: int, n_resamples: int) -> dict:
    """Gradient attribution of the evaluate run's mean-pooling head on up to ``per_scenario`` test prompts per
    scenario (first in test order); correlations with entropy and semantic score."""
    from tqdm.auto import tqdm

    predictor = Predictor.load(Path(evaluate_dir) / "predictors" / "mean.safetensors")
    test_ids = list(dict.fromkeys(data.cols["prompt_id"][data.index["test"]]))
    picked, counts = [], {}
    for pid in test_ids:
        s = data.by_prompt[pid].scenario
        if counts.get(s, 0) < per_scenario:
            picked.append(pid)
            counts[s] = counts.get(s, 0) + 1
    tokens = {"H": [], "S": [], "G": [], "scenario": []}
    per_prompt = []
    for pid in tqdm(picked, desc="gradient attribution", unit="prompt"):
        req = data.by_prompt[pid]
        start, end = pooled_span(req, predictor.params["pool_span"], len(req.token_ids))
        span = req.signals.span(start, end, predictor.params["semantic_divisor"])
        G = gradient_attribution(backbone, predictor, req).numpy()
        H, S = span.token_entropy.numpy(), span.semantic_score.numpy()
        for k, v in (("H", H), ("S", S), ("G", G)):
            tokens[k].append(v)
        tokens["scenario"].append(np.full(len(G), req.scenario, dtype=object))
        per_prompt.append({"prompt_id": pid, "scenario": req.scenario,
                           "HG": correlations(H, G)["spearman"], "SG": correlations(S, G)["spearman"],
                           "HS": correlations(H, S)["spearman"]})
    cat = {k: np.concatenate(v) for k, v in tokens.items()}
    pooled = {}
    for g in [*sorted(set(cat["scenario"].tolist())), "overall"]:
        m = np.ones(len(cat["G"]), bool) if g == "overall" else cat["scenario"] == g
        pooled[g] = {pair: correlations(cat[pair[0]][m], cat[pair[1]][m]) for pair in ("HG", "SG", "HS")}
    within = {}
    for pair in ("HG", "SG", "HS"):
        vals = np.array([p[pair] for p in per_prompt if p[pair] is not None], dtype=np.float64)
        sc = np.array([p["scenario"] for p in per_prompt if p[pair] is not None])
        ids = np.array([p["prompt_id"] for p in per_prompt if p[pair] is not None])
        within[pair] = _scenario_ci(vals, sc, ids, n_resamples)
    return {"head": "mean", "head_layer": predictor.layer, "importance": "||d y_hat / d e_i||_2 (input embeddings)",
            "num_prompts": counts, "pooled": pooled, "within_prompt_spearman": within}


class swapped_entropy:
    """Context manager: every request's ``signals.token_entropy`` replaced by ``entropies[prompt_id]``, restored on
    exit."""

    def __init__(self, data, entropies: dict):
        self.data, self.entropies = data, entropies

    def __enter__(self):
        self.saved = {p: r.signals for p, r in self.data.by_prompt.items()}
        for p, r in self.data.by_prompt.items():
            r.signals = with_entropy(r.signals, self.entropies[p])
        return self

    def __exit__(self, *exc):
        for p, r in self.data.by_prompt.items():
            r.signals = self.saved[p]
        return False


def train_vocabulary(data, k: int, vocab_size: int) -> torch.Tensor:
    """The pruned head's vocabulary: the ``k`` ids most frequent in the train split's prompts and responses."""
    train = data.index["train"]
    prompts = {p: data.by_prompt[p].token_ids for p in data.cols["prompt_id"][train]}
    return frequent_vocabulary([*prompts.values(), *data.responses[train]], k, vocab_size)


@with_backbone_threads
def entropy_section(backbone, data, chosen: dict, ks: tuple[int, ...], seeds: tuple[int, ...],
                    n_resamples: int, final_layer: int) -> dict:
    """Verify the cached entropy from the cached final states (100 prompts), compute pruned entropies offline for
    every ``k`` and score EGTP and ESTP (their chosen settings) with each, paired with full entropy, per seed."""
    from tqdm.auto import tqdm

    W = backbone.model.get_output_embeddings().weight.detach()
    V = W.shape[0]
    prompts = list(data.by_prompt)
    check = verify_cached_entropy([data.by_prompt[p].signals for p in prompts[:100]], W, final_layer)
    test_ids = data.cols["prompt_id"][data.index["test"]]
    methods = {m: {k: v for k, v in chosen[m].items() if k != "val_mae"} for m in ("egtp", "estp") if m in chosen}

    def score() -> dict:
        out = {}
        with torch_threads(1):
            for m, params in methods.items():
                errs, vals = [], []
                for s in seeds:
                    scored = fit_and_score(m, params, data, s)
                    vals.append(scored.val_mae)
                    errs.append(scored.test_abs_err)
                out[m] = {"val_mae": float(np.mean(vals)), "errors": np.mean(errs, axis=0),
                          "test_mae_seeds": [float(e.mean()) for e in errs]}
        return out

    full = score()
    variants = {"full": {"k": V, **{m: {"val_mae": r["val_mae"], "test_mae": float(r["errors"].mean()),
                                        "test_mae_seeds": r["test_mae_seeds"]} for m, r in full.items()}}}
    for k in tqdm(ks, desc="pruned entropies", unit="k"):
        vocab = train_vocabulary(data, k, V)
        ent = {p: pruned_entropy(data.by_prompt[p].signals.layer(final_layer), W, vocab) for p in prompts}
        agree = entropy_agreement(torch.cat([data.by_prompt[p].signals.token_entropy for p in prompts]).numpy(),
                                  torch.cat([ent[p] for p in prompts]).numpy())
        with swapped_entropy(data, ent):
            res = score()
        variants[f"top{k}"] = {"k": k, "agreement": agree, **{
            m: {"val_mae": r["val_mae"], "test_mae": float(r["errors"].mean()), "test_mae_seeds": r["test_mae_seeds"],
                "diff_full": list(clustered_bootstrap(r["errors"] - full[m]["errors"], test_ids, n_resamples))}
            for m, r in res.items()}}
    return {"verification": check, "vocabulary": "the k ids most frequent in the train split's prompts and responses",
            "seeds": list(seeds), "methods": methods, "variants": variants}


@with_backbone_threads
def overhead_section(backbone, data, evaluate_dir: str, k: int, max_batch_tokens: int, repeats: int,
                     batch_sizes=(1, 8, 32), lengths=(128, 512, 2048), layers=(15, 22, 30)) -> dict:
    """:func:`lenpred.studies.diagnose.overhead.overhead_grid` with the evaluate run's EGTP and ESTP heads and the pruned
    vocabulary of size ``k``, extracting hidden states at ``layers`` (the evaluate run's)."""
    predictors = {m: Predictor.load(Path(evaluate_dir) / "predictors" / f"{m}.safetensors") for m in ("egtp", "estp")}
    vocab = train_vocabulary(data, k, backbone.model.get_output_embeddings().weight.shape[0])
    result = overhead_grid(backbone, predictors, vocab, layers, batch_sizes, lengths, max_batch_tokens, repeats)
    for case in result["cases"]:
        case["breakdown"] = breakdown(case)
    return result


@dataclass
class DiagnoseReport:
    """What :func:`run_diagnose` returns.

    Attributes:
        sections: ``{section: its result}`` for every section present in ``out`` (computed now or earlier): the
            content of ``diagnose.json`` (:meth:`to_dict`), rendered into ``REPORT.md``.
        report_md: the ``REPORT.md`` written.
    """

    sections: dict
    report_md: Path

    def to_dict(self) -> dict:
        """The ``diagnose.json`` content: one key per section present."""
        return self.sections


def render_diagnose(report: DiagnoseReport, console) -> None:
    """Print where the report went and which sections it holds on ``console`` (``rich``)."""
    console.print(f"wrote {report.report_md} ({', '.join(report.sections) or 'no sections'})")


def run_diagnose(cfg: DiagnoseConfig) -> DiagnoseReport:
    """Compute the requested sections, write their JSONs (and the resolved config of the run that computed them,
    ``config.json``), then REPORT.md + PNGs + diagnose.json from every section present
    (:func:`lenpred.studies.diagnose.report.write_report`). Progress goes to the ``lenpred`` logger.

    Raises:
        LenpredError: ``cfg.out`` lies under a file, ``cfg.evaluate`` holds no ``lenpred evaluate`` results, or any
            loading error of the benchmark.
    """
    out = Path(cfg.out)
    if any(p.exists() and not p.is_dir() for p in (out, *out.parents)):
        raise LenpredError(f"--out {out} is (or lies under) a file: pass a directory")
    chosen = _chosen(cfg)
    figures = {}
    if cfg.sections:
        ev = chosen["_config"]  # the evaluate run's settings: same layers, span, divisor, epochs and bins
        check_run_settings(("estp",), threads=cfg.threads)
        settings = TuningSettings(epochs=ev["epochs"], binning=ev["binning"], pool_span=ev["pool_span"],
                                  semantic_divisor=ev["semantic_divisor"])
        needs = {"signals"} if set(cfg.sections) - {"overhead"} else set()
        run = load_dataset(cfg.bench, needs, model=cfg.model, data_dir=cfg.data_dir, cache=cfg.cache,
                           layers=tuple(ev["layers"]), threads=cfg.threads)
        final = run.backbone.num_layers
        for section in cfg.sections:
            logger.info("diagnose: %s …", section)
            if section == "misalignment":
                result, figures["misalignment"] = misalignment_section(run.data, run.backbone.tokenizer, chosen,
                                                                       cfg.bootstrap_resamples)
            elif section == "attribution":
                result = attribution_section(run.backbone, run.data, cfg.evaluate, cfg.attribution_prompts,
                                             cfg.bootstrap_resamples)
            elif section == "ablation":
                ctx = tuning_context(settings, run.layers, run.backbone.num_layers, run.values)
                result = run_ablations(run.data, ctx.pooled_settings, run.layers, chosen["estp"]["layer"],
                                       cfg.seeds, n_resamples=cfg.bootstrap_resamples)
            elif section == "entropy":
                result = entropy_section(run.backbone, run.data, chosen, cfg.pruned_ks, cfg.seeds,
                                         cfg.bootstrap_resamples, final)
            else:
                result = overhead_section(run.backbone, run.data, cfg.evaluate, cfg.overhead_k, cfg.max_batch_tokens,
                                          cfg.overhead_repeats, cfg.overhead_batch_sizes, cfg.overhead_lengths, run.layers)
            write_json(out / f"{section}.json", result)
            if section == "misalignment":
                fig = figures["misalignment"]
                with atomic_path(out / "misalignment_percentiles.npz") as tmp, open(tmp, "wb") as f:
                    np.savez_compressed(f, entropy=fig["entropy"].astype(np.float32),
                                        semantic=fig["semantic"].astype(np.float32),
                                        scenario=fig["scenario"].astype(str))
        write_json(out / "config.json", {**asdict(cfg), "model_revision": run.backbone.revision})
    return DiagnoseReport(write_report(out), out / "REPORT.md")
