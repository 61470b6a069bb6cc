"""``lenpred progressive``: remaining-length MAE vs decode step for PLP, TRAIL-progressive and static baselines.

Rows are (rollout, decode step ``t``) with ``t < T``. Every method predicts the *observed* remaining length
``min(T, cap) - t`` and is clipped to ``[0, cap - t]``. Two populations per step: every rollout still running at
``t`` (``running``), and the fixed set of rollouts longer than the last step shown (``fixed``: the same rollouts at
every step, so a falling curve is not just the short ones leaving). Errors are averaged per sample (RL: every
rollout counts); intervals are the prompt-clustered bootstrap of the static tables
(:func:`lenpred.metrics.clustered_bootstrap`).

Methods:
    plp: :class:`lenpred.predictors.progressive.PLPHead` (prompt representation chosen on validation).
    trail_progressive: :class:`lenpred.predictors.progressive.TrailProgressive` (layer chosen on validation).
    static_minus_t: the best static predictor (``last``, layer 15, as ``lenpred evaluate`` chose) minus ``t``.
    static_conditional: the same head's bin distribution conditioned on ``T > t``: ``E[min(T, cap) - t | T > t]``
        (uses no decode state: what knowing the request is still running is worth).
    countdown: PLP's own step-0 estimate minus ``t`` (the first estimate, never refreshed).
    oracle_minus_t: the static oracle floor — the median length of the prompt's *other* samples — minus ``t``.
    oracle_conditional: the median of the prompt's other samples longer than ``t``, minus ``t`` (the oracle minus t
        where none is longer).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lenpred.intervals import conditional_remaining
from lenpred.io import atomic_path, write_json, write_parquet_checked
from lenpred.steps import DECODE_STEPS
from lenpred.studies import DEFAULT_BENCH, report_dict
from lenpred.tables import markdown_table

# torch / scipy modules (dataset, decode states, predictors, metrics, tuning) are imported inside the functions: the
# CLI imports this module (and its config) at start-up.
if TYPE_CHECKING:
    from lenpred.predictors.progressive import ProgressiveRows

logger = logging.getLogger(__name__)

PLP_LAYERS = (30, 20)  # the paper's final layer first; 20 was TRAIL's pick on validation
TRAIL_LAYERS = (10, 15, 20, 25)
DECODE_LAYERS = (10, 15, 20, 25, 30)
PROMPT_CANDIDATES = (("last", 15), ("egtp", 15))  # the best static pooler and EGTP, at lenpred evaluate's layer
METHODS = ("plp", "trail_progressive", "static_minus_t", "static_conditional", "countdown", "oracle_minus_t",
           "oracle_conditional")
OVERALL = "overall"  # the group of every scenario's rows, after the benchmark's own scenarios


@dataclass
class ProgressiveConfig:
    """Settings of ``lenpred progressive`` (see the module docstring); ``head``: PLP / TRAIL head overrides."""

    model: str | None = None  # None: the model the benchmark was sampled from (bench.json)
    bench: str = DEFAULT_BENCH
    out: str = "results/progressive"
    data_dir: str | None = None
    cache: str | None = None
    decode_cache: str | None = None
    threads: int | None = 2
    seed: int = 0
    steps: tuple[int, ...] = DECODE_STEPS
    head: dict = field(default_factory=dict)  # PLP / TRAIL head overrides (e.g. {"epochs": 2} in tests)
    plp_layers: tuple[int, ...] = PLP_LAYERS
    trail_layers: tuple[int, ...] = TRAIL_LAYERS
    prompt_candidates: tuple = PROMPT_CANDIDATES
    static: tuple = ("last", 15)  # the best static predictor of lenpred evaluate (pooler, layer)
    signal_layers: tuple[int, ...] | None = None  # the prompt-signal cache of lenpred evaluate (default_layers)
    paired_scenario: str = "rl"  # paired differences on this scenario's rollouts (ForeLen's RL rollouts, the PLP
    # setting); "overall", or a name the benchmark does not have: every test rollout


def build_rows(data, decode, prompt_features: np.ndarray, plp_layer: int, trail_layers: tuple[int, ...],
               samples: np.ndarray) -> ProgressiveRows:
    """Rows of the rollouts ``samples`` (row indices of ``data``): one per (rollout, step held in ``decode``)."""
    from lenpred.predictors.progressive import ProgressiveRows

    final = decode.layer(plp_layer)
    trail = {l: decode.layer(l) for l in trail_layers}
    idx = [i for i in samples for _ in range(len(decode.steps[i]))]
    idx = np.asarray(idx, dtype=np.int64)
    cat = lambda xs: np.concatenate([xs[i].numpy() for i in samples]) if len(samples) else np.zeros((0, 1), np.float32)
    caps = data.cols["max_new_tokens"].astype(np.float64)
    return ProgressiveRows(idx, np.concatenate([decode.steps[i] for i in samples]).astype(np.int64),
                           prompt_features[idx], cat(final), {l: cat(v) for l, v in trail.items()}, data.y[idx],
                           data.censored[idx], caps[idx])


def oracle_remaining(y: np.ndarray, prompt_ids: np.ndarray, rows_sample: np.ndarray, steps: np.ndarray,
                     conditional: bool) -> np.ndarray:
    """Leave-one-out prompt median minus ``t`` per row (NaN for single-sample prompts); ``conditional``: the median
    of the other samples longer than ``t`` (the unconditional value where none is)."""
    y = np.asarray(y, np.float64)
    by_prompt: dict = {}
    for i, p in enumerate(prompt_ids):
        by_prompt.setdefault(p, []).append(i)
    out = np.full(len(rows_sample), np.nan)
    for r, (i, t) in enumerate(zip(rows_sample, steps)):
        others = y[[j for j in by_prompt[prompt_ids[i]] if j != i]]
        if not len(others):
            continue
        value = np.median(others) - t
        if conditional and (others > t).any():
            value = np.median(others[others > t]) - t
        out[r] = value
    return out


def curve_table(preds: dict[str, np.ndarray], rows: ProgressiveRows, scenarios: np.ndarray, prompt_ids: np.ndarray,
                steps: tuple[int, ...], fixed_after: int, n_resamples: int = 2000) -> list[dict]:
    """MAE (with a prompt-clustered 95 % interval) of each method per population, scenario and step; one dict per
    cell: ``population, scenario, step, method, mae, low, high, n``."""
    from lenpred.metrics import clustered_bootstrap

    observed = rows.observed_remaining
    long_enough = rows.length > fixed_after
    out = []
    for population, pop_mask in (("running", np.ones(len(observed), bool)), ("fixed", long_enough)):
        for scenario in [*benchmark_scenarios(scenarios), OVERALL]:
            sc = np.ones(len(observed), bool) if scenario == OVERALL else scenarios[rows.sample] == scenario
            for t in steps:
                m = pop_mask & sc & (rows.step == t)
                for name, p in preds.items():
                    ok = m & np.isfinite(p)
                    if ok.sum() < 2:
                        continue
                    mae, lo, hi = clustered_bootstrap(np.abs(p[ok] - observed[ok]), prompt_ids[rows.sample[ok]],
                                                      n_resamples)
                    out.append({"population": population, "scenario": scenario, "step": int(t), "method": name,
                                "mae": mae, "low": lo, "high": hi, "n": int(ok.sum())})
    return out


def benchmark_scenarios(scenarios: np.ndarray) -> list[str]:
    """The scenario names of a benchmark's samples (``(n,)`` str, the records' ``scenario`` column), sorted, as the
    benchmark card lists them; never a fixed list (a user's benchmark has its own names)."""
    return sorted({str(s) for s in scenarios.tolist()})


def report_scenarios(report: dict) -> list[str]:
    """The scenarios a report's curves cover, in their order, without :data:`OVERALL`."""
    return [s for s in dict.fromkeys(c["scenario"] for c in report["curves"]) if s != OVERALL]


def paired_difference(a: np.ndarray, b: np.ndarray, rows: ProgressiveRows, mask: np.ndarray,
                      prompt_ids: np.ndarray) -> dict:
    """Paired MAE difference ``a - b`` (tokens, 95 % prompt-clustered interval) over the rows in ``mask``."""
    from lenpred.metrics import clustered_bootstrap

    observed = rows.observed_remaining
    m = mask & np.isfinite(a) & np.isfinite(b)
    d, lo, hi = clustered_bootstrap(np.abs(a[m] - observed[m]) - np.abs(b[m] - observed[m]), prompt_ids[rows.sample[m]])
    return {"diff": d, "low": lo, "high": hi, "n": int(m.sum())}


def _val_mae(pred: np.ndarray, rows: ProgressiveRows) -> float:
    return float(np.average(np.abs(pred - rows.observed_remaining), weights=rows.rollout_weights()))


def clip_remaining(pred: np.ndarray, rows: ProgressiveRows) -> np.ndarray:
    """Clip remaining-length predictions to ``[0, cap - t]``."""
    return np.clip(pred, 0.0, rows.cap - rows.step)


ESTIMATES_FILE = "test_estimates.parquet"
EXPORTED_METHODS = ("plp", "trail_progressive", "static_conditional")


def export_test_estimates(path: str | Path, rows: ProgressiveRows, data, preds: dict[str, np.ndarray],
                          model_revision: str, methods: tuple[str, ...] = EXPORTED_METHODS) -> None:
    """Write the test split's remaining-length estimates at every decode step held, for schedulers that re-rank
    running requests (``lenpred schedule simulate``'s ``srpt:<method>`` rows read them).

    One row per (test rollout, step ``t < T``): ``prompt_id``, ``sample_index`` (the rollout; with ``prompt_id`` the
    key the scheduling workload joins on), ``step``, ``output_len`` (``T``, tokens), ``cap`` and, per method, the
    predicted remaining length in tokens (float64, clipped to ``[0, cap − t]``). Parquet with a ``.sha256``
    sidecar (:func:`lenpred.io.write_parquet_checked`); the schema metadata holds the model revision.
    """
    import json

    import pyarrow as pa

    cols = {"prompt_id": data.cols["prompt_id"][rows.sample].astype(str).tolist(),
            "sample_index": data.cols["sample_index"][rows.sample].astype(np.int64),
            "step": rows.step.astype(np.int64), "output_len": data.y[rows.sample].astype(np.int64),
            "cap": rows.cap.astype(np.float64)}
    cols |= {m: np.asarray(preds[m], dtype=np.float64) for m in methods}
    table = pa.table(cols).replace_schema_metadata({"model_revision": model_revision, "methods": json.dumps(methods)})
    write_parquet_checked(table, path)


@dataclass
class ProgressiveReport:
    """What :func:`run_progressive` returns; :meth:`to_dict` is the content of ``results.json`` (key for key).

    Attributes:
        config: the :class:`ProgressiveConfig` (tuples as lists).
        model_revision: the backbone's revision.
        steps: the decode steps ``t`` scored (tokens generated).
        plp: the PLP prompt representation and decode layer chosen on validation, with the sweep's validation MAEs.
        trail_progressive: TRAIL-progressive's layer and bin width chosen on validation, with the sweep.
        curves: one cell per (population, scenario, step, method): remaining-length MAE (tokens) with its 95 %
            prompt-clustered interval and ``n``.
        paired: ``{"rl/step<t>/<a>-<b>": {"diff", "low", "high"}}`` paired MAE differences (tokens).
        update_cost_us: PLP's per-step update cost (µs; ``batch1_us``, ``batch64_us``).
        timing_s: decode-state extraction and total seconds.
        num_rows: (rollout, step) rows per split.
    """

    config: dict
    model_revision: str | None
    steps: list
    plp: dict
    trail_progressive: dict
    curves: list
    paired: dict
    update_cost_us: dict
    timing_s: dict
    num_rows: dict

    def to_dict(self) -> dict:
        """The ``results.json`` content, in its key order."""
        return report_dict(self)


def _choose_plp(cfg: ProgressiveConfig, data, decode, requests: list, split: dict) -> tuple[dict, dict]:
    """The best PLP sweep entry (``model``, ``features``, ``prompt``, ``plp_layer``) and the report's ``plp`` block."""
    from lenpred.predictors import make_predictor
    from lenpred.predictors.progressive import PLPHead

    sweep = []
    for pooler, layer in cfg.prompt_candidates:
        feats = make_predictor(pooler, layer=layer).features(requests)
        for plp_layer in cfg.plp_layers:
            tr, va = (build_rows(data, decode, feats, plp_layer, (), split[s]) for s in ("train", "validation"))
            plp = PLPHead(cfg.head, cfg.seed).fit(tr)
            mae = _val_mae(clip_remaining(plp.predict(va.prompt_features, va.plp_state, va.step, va.cap), va), va)
            sweep.append({"prompt": f"{pooler}@{layer}", "plp_layer": plp_layer, "val_mae": mae, "model": plp,
                          "features": feats})
            logger.info("PLP prompt %s@%s, decode layer %s: validation remaining MAE %.1f", pooler, layer,
                        plp_layer, mae)
    best = min(sweep, key=lambda s: s["val_mae"])
    return best, {"prompt": best["prompt"], "plp_layer": best["plp_layer"],
                  "sweep": [{k: s[k] for k in ("prompt", "plp_layer", "val_mae")} for s in sweep]}


def _choose_trail(cfg: ProgressiveConfig, tr: ProgressiveRows, va: ProgressiveRows):
    """The TRAIL-progressive model with the lowest validation MAE and the report's ``trail_progressive`` block."""
    from lenpred.predictors.progressive import TrailProgressive

    trail_sweep = []
    for layer in cfg.trail_layers:
        model = TrailProgressive(layer, cfg.head, cfg.seed).fit(tr)
        mae = _val_mae(clip_remaining(model.predict_sequence(va), va), va)
        trail_sweep.append({"layer": layer, "val_mae": mae, "model": model})
        logger.info("TRAIL-progressive layer %s: validation remaining MAE %.1f", layer, mae)
    trail = min(trail_sweep, key=lambda s: s["val_mae"])["model"]
    return trail, {"layer": trail.layer, "width": trail.width_,
                   "sweep": [{k: s[k] for k in ("layer", "val_mae")} for s in trail_sweep]}


def _test_predictions(cfg: ProgressiveConfig, data, requests: list, split: dict, plp, trail,
                      te: ProgressiveRows) -> dict[str, np.ndarray]:
    """Every method's remaining-length predictions on the test rows (:data:`METHODS` order), clipped to the cap."""
    from lenpred.predictors import make_predictor

    prompt_ids = data.cols["prompt_id"]
    # the static best predictor (lenpred evaluate's choice) and its distribution
    static = make_predictor(cfg.static[0], layer=cfg.static[1], seed=cfg.seed)
    static.fit([requests[i] for i in split["train"]], data.y[split["train"]], data.censored[split["train"]])
    probs, values = static.predict_distribution([requests[i] for i in te.sample])
    static_pred = (probs * values).sum(axis=1)  # = static.predict(...): E[min(c_j, cap)] from the same pass
    plp_pred = plp.predict(te.prompt_features, te.plp_state, te.step, te.cap)
    first = {i: p for i, t, p in zip(te.sample, te.step, plp_pred) if t == 0}  # PLP's estimate at the prefill
    preds = {
        "plp": plp_pred,
        "trail_progressive": trail.predict_sequence(te),
        "static_minus_t": static_pred - te.step,
        "static_conditional": conditional_remaining(probs, values, te.step.astype(np.float64)),
        "countdown": np.array([first[i] for i in te.sample]) - te.step,
        "oracle_minus_t": oracle_remaining(data.y, prompt_ids, te.sample, te.step, False),
        "oracle_conditional": oracle_remaining(data.y, prompt_ids, te.sample, te.step, True),
    }
    return {k: clip_remaining(v, te) for k, v in preds.items()}


def _paired_block(cfg: ProgressiveConfig, preds: dict[str, np.ndarray], te: ProgressiveRows, scenarios: np.ndarray,
                  prompt_ids: np.ndarray) -> dict:
    """The report's ``paired`` block: ``{"<scenario>/step<t>/<a>-<b>": paired_difference(...)}``."""
    paired = cfg.paired_scenario if cfg.paired_scenario in benchmark_scenarios(scenarios) else OVERALL
    in_paired = np.ones(len(te.step), bool) if paired == OVERALL else scenarios[te.sample] == paired
    out = {}
    for t in (0, 32, 128):
        at = in_paired & (te.step == t)
        for a, b in (("plp", "oracle_minus_t"), ("plp", "oracle_conditional"), ("plp", "trail_progressive"),
                     ("plp", "static_conditional")):
            if at.sum() > 1:
                out[f"{paired}/step{t}/{a}-{b}"] = paired_difference(preds[a], preds[b], te, at, prompt_ids)
    return out


def _load_decode_states(cfg: ProgressiveConfig):
    """The loaded benchmark run (``data``, ``backbone``), its decode states and the seconds they took."""
    from lenpred.dataset import load_dataset
    from lenpred.inputs.decode_states import benchmark_decode_states
    from lenpred.torch_state import torch_threads
    from lenpred.tuning import check_run_settings

    t0 = time.perf_counter()
    check_run_settings((cfg.static[0],), threads=cfg.threads)
    run = load_dataset(cfg.bench, {"signals"}, model=cfg.model, data_dir=cfg.data_dir, cache=cfg.cache,
                       layers=cfg.signal_layers, threads=cfg.threads)
    with torch_threads(cfg.threads):
        decode = benchmark_decode_states(run.backbone, run.data, tuple(sorted({*cfg.plp_layers, *cfg.trail_layers})),
                                         cfg.decode_cache, cfg.bench, cfg.steps)
    return run, decode, time.perf_counter() - t0


def run_progressive(cfg: ProgressiveConfig) -> ProgressiveReport:
    """Extract (or read) the decode states, fit PLP and TRAIL-progressive (choices on validation), score every
    method on the test split, and write ``results.json``, ``results.md`` and ``curves.png`` under ``cfg.out``;
    :func:`render_progressive` prints the report. Progress goes to the ``lenpred`` logger."""
    from lenpred.online.progressive import save_plp, update_cost
    from lenpred.torch_state import torch_threads

    t0 = time.perf_counter()
    run, decode, t_extract = _load_decode_states(cfg)
    data, backbone = run.data, run.backbone
    requests, prompt_ids = data.requests, data.cols["prompt_id"]
    scenarios = data.cols["scenario"]
    split = {s: data.index[s] for s in ("train", "validation", "test")}
    report = {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()},
              "model_revision": backbone.revision, "steps": list(cfg.steps)}
    with torch_threads(1):
        best, report["plp"] = _choose_plp(cfg, data, decode, requests, split)  # the prompt representation
        plp, plp_layer = best["model"], best["plp_layer"]
        tr, va, te = (build_rows(data, decode, best["features"], plp_layer, cfg.trail_layers, split[s])
                      for s in ("train", "validation", "test"))
        trail, report["trail_progressive"] = _choose_trail(cfg, tr, va)  # the layer
        preds = _test_predictions(cfg, data, requests, split, plp, trail, te)
    report["curves"] = curve_table(preds, te, scenarios, prompt_ids, cfg.steps, max(cfg.steps))
    report["paired"] = _paired_block(cfg, preds, te, scenarios, prompt_ids)
    report["update_cost_us"] = update_cost(plp, te.prompt_features, te.plp_state, te.step, te.cap)

    save_plp(plp, Path(cfg.out) / "plp.safetensors", {"prompt": best["prompt"], "plp_layer": plp_layer,
                                                      "model_revision": backbone.revision, "steps": list(cfg.steps)})
    export_test_estimates(Path(cfg.out) / ESTIMATES_FILE, te, data, preds, backbone.revision)
    report["timing_s"] = {"decode_states": t_extract, "total": time.perf_counter() - t0}
    report["num_rows"] = {"train": len(tr.step), "validation": len(va.step), "test": len(te.step)}
    out = Path(cfg.out)
    write_json(out / "results.json", report)
    _write_markdown(report, out / "results.md")
    _plot(report, out / "curves.png")
    return ProgressiveReport(**report)


def _cell(report: dict, population: str, scenario: str, step: int, method: str) -> dict | None:
    for c in report["curves"]:
        if (c["population"], c["scenario"], c["step"], c["method"]) == (population, scenario, step, method):
            return c
    return None


def _fmt(c: dict | None) -> str:
    if c is None:
        return "—"
    return f"{c['mae']:.1f} [{c['low']:.1f}, {c['high']:.1f}]" if c["low"] is not None else f"{c['mae']:.1f}"


def _paired_label(report: dict) -> str:
    """The paired differences' scenario as the report's heading names it (``rl`` -> ``RL``)."""
    first = next(iter(report["paired"]), None)
    scenario = first.split("/", 1)[0] if first else report["config"].get("paired_scenario", OVERALL)
    return "every scenario" if scenario == OVERALL else scenario.upper()


def _write_markdown(report: dict, path: Path) -> None:
    steps = [0, 32, 64, 128]
    lines = ["# Progressive remaining-length prediction (test split)", "",
             f"PLP prompt representation: {report['plp']['prompt']}, decode-state layer {report['plp']['plp_layer']}; "
             f"TRAIL-progressive layer "
             f"{report['trail_progressive']['layer']} (bin width {report['trail_progressive']['width']:.0f} tokens). "
             "MAE of the observed remaining length `min(T, cap) - t` in tokens, 95 % prompt-clustered bootstrap "
             "interval.", ""]
    for population, title in (("running", "every rollout still running at t"),
                              (f"fixed", f"the fixed set of rollouts longer than {max(report['steps'])} tokens")):
        for scenario in [*report_scenarios(report), OVERALL]:
            rows = [[m, *(_fmt(_cell(report, population, scenario, t, m)) for t in steps)] for m in METHODS]
            n = [_cell(report, population, scenario, t, "plp") for t in steps]
            rows.append(["rollouts", *(str(c["n"]) if c else "—" for c in n)])
            lines += [f"## {scenario}: {title}", "", markdown_table(["method", *(f"t = {t}" for t in steps)], rows), ""]
    rows = [[k, f"{v['diff']:+.1f} [{v['low']:+.1f}, {v['high']:+.1f}]", v["n"]] for k, v in report["paired"].items()]
    lines += [f"## Paired differences ({_paired_label(report)}, every rollout running at t)", "",
              markdown_table(["comparison", "Δ MAE [95 % CI]", "n"], rows)]
    c = report["update_cost_us"]
    lines += ["", f"PLP update cost (one torch thread, this run's machine load): {c['batch1_us']:.0f} µs for one "
                  f"request, {c['batch64_us']:.0f} µs for 64 ({c['batch64_per_request_us']:.1f} µs per request); "
                  "`python scripts/plp_update_cost.py` measures it alone.", ""]
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines))


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = report_scenarios(report)
    fig, axes = plt.subplots(2, len(names), figsize=(5 * len(names), 8), sharex=True, squeeze=False)
    for r, population in enumerate(("running", "fixed")):
        for c, scenario in enumerate(names):
            ax = axes[r, c]
            for m in METHODS:
                cells = sorted((x for x in report["curves"] if (x["population"], x["scenario"], x["method"])
                                == (population, scenario, m)), key=lambda x: x["step"])
                if not cells:
                    continue
                s = [x["step"] for x in cells]
                line, = ax.plot(s, [x["mae"] for x in cells], marker="o", ms=3, label=m)
                if all(x["low"] is not None for x in cells):
                    ax.fill_between(s, [x["low"] for x in cells], [x["high"] for x in cells], alpha=0.12,
                                    color=line.get_color())
            ax.set_title(f"{scenario} — {'running at t' if population == 'running' else 'fixed: T > ' + str(max(report['steps']))}")
            ax.set_xlabel("decode step t (tokens generated)")
            ax.set_ylabel("remaining-length MAE (tokens)")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def render_progressive(report: ProgressiveReport, console) -> None:
    """Print the report on ``console`` (``rich``): per scenario the remaining-length MAE of every method at
    t = 0, 32, 64, 128 over the rollouts still running, the paired differences and PLP's update cost."""
    from rich.table import Table

    report = report.to_dict()
    steps = [0, 32, 64, 128]
    for scenario in [*report_scenarios(report), OVERALL]:
        table = Table(title=f"remaining-length MAE, {scenario}, rollouts running at t (tokens, 95 % CI)")
        table.add_column("method")
        for t in steps:
            table.add_column(f"t={t}", justify="right")
        for m in METHODS:
            table.add_row(m, *(_fmt(_cell(report, "running", scenario, t, m)) for t in steps))
        console.print(table)
    for k, v in report["paired"].items():
        console.print(f"{k}: {v['diff']:+.1f} [{v['low']:+.1f}, {v['high']:+.1f}]")
    c = report["update_cost_us"]
    console.print(f"PLP update: {c['batch1_us']:.0f} µs single, {c['batch64_us']:.0f} µs for 64 requests")
