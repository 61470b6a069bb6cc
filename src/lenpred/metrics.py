"""Metrics and reports: length-prediction errors per scenario, the oracle floor, seeds, tables, JSON, PNG.

* Errors in tokens: MAE, RMSE (scikit-learn); Kendall tau-b between predicted and true lengths (scipy;
  what a shortest-job-first scheduler needs); ``within_25``: share of samples with
  ``|y_hat - y| <= 0.25 * y``.
* One-to-many: with several samples per prompt, ``mae_prompt_mean`` compares each prompt's prediction
  with the mean of its own samples (EGTP paper, RL scenario).
* **Oracle floor**: sampled lengths are random, so a prompt-only predictor cannot beat the
  leave-one-out median of a prompt's other samples. Over prompts with >= 2 samples we report that
  floor's MAE and, for each method, the share of the gap between the global-median predictor and the
  floor that it closes: ``(MAE_median - MAE_method) / (MAE_median - MAE_floor)`` on the same samples.

Capped responses (``finish_reason == "length"``) count at their capped length: that is what the
serving system observed. Undefined values (tau of a constant prediction) are ``None`` in JSON.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau
from sklearn.metrics import mean_absolute_error, root_mean_squared_error

from lenpred.io import atomic_path, write_json

METRICS = ("mae", "rmse", "kendall_tau", "within_25")


def _none_if_nan(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def length_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float | int | None]:
    """Errors of one group of samples: ``mae``, ``rmse`` (tokens), ``kendall_tau`` (tau-b; ``None`` when a side is
    constant or there is one sample), ``within_25`` (share in [0, 1]) and ``n``."""
    y_true, y_pred = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    tau = None
    if len(y_true) > 1 and np.ptp(y_true) > 0 and np.ptp(y_pred) > 0:
        tau = _none_if_nan(kendalltau(y_pred, y_true).statistic)
    return {"mae": float(mean_absolute_error(y_true, y_pred)), "rmse": float(root_mean_squared_error(y_true, y_pred)),
            "kendall_tau": tau, "within_25": float(np.mean(np.abs(y_pred - y_true) <= 0.25 * y_true)),
            "n": int(len(y_true))}


def prompt_mean_mae(y_true: np.ndarray, y_pred: np.ndarray, prompt_ids: np.ndarray) -> float:
    """MAE against each prompt's mean sampled length: ``mean_p |mean(y_hat_p) - mean(y_p)|`` over prompts (tokens)."""
    ids, inverse = np.unique(np.asarray(prompt_ids), return_inverse=True)
    counts = np.bincount(inverse)
    mean_true = np.bincount(inverse, weights=y_true) / counts
    mean_pred = np.bincount(inverse, weights=y_pred) / counts
    return float(np.mean(np.abs(mean_pred - mean_true)))


def metrics_by_scenario(y_true: np.ndarray, y_pred: np.ndarray, scenarios: np.ndarray,
                        prompt_ids: np.ndarray | None = None) -> dict[str, dict]:
    """:func:`length_metrics` per scenario (sorted) plus ``"overall"``; with ``prompt_ids`` also ``mae_prompt_mean``."""
    y_true, y_pred, scenarios = (np.asarray(a) for a in (y_true, y_pred, scenarios))
    y_true, y_pred = y_true.astype(np.float64), y_pred.astype(np.float64)
    groups = {s: scenarios == s for s in sorted(set(scenarios.tolist()))}
    groups["overall"] = np.ones(len(y_true), dtype=bool)
    out = {}
    for g, m in groups.items():
        out[g] = length_metrics(y_true[m], y_pred[m])
        if prompt_ids is not None:
            out[g]["mae_prompt_mean"] = prompt_mean_mae(y_true[m], y_pred[m], np.asarray(prompt_ids)[m])
    return out


def leave_one_out_median(y: np.ndarray, prompt_ids: np.ndarray) -> np.ndarray:
    """For each sample, the median of its prompt's *other* samples ``(n,)`` float64; NaN for single-sample prompts."""
    y, prompt_ids = np.asarray(y, dtype=np.float64), np.asarray(prompt_ids)
    out = np.full(len(y), np.nan)
    for pid in np.unique(prompt_ids):
        idx = np.flatnonzero(prompt_ids == pid)
        for k, i in enumerate(idx):
            if len(idx) > 1:
                out[i] = np.median(y[np.delete(idx, k)])
    return out


def oracle_floor(y: np.ndarray, prompt_ids: np.ndarray, scenarios: np.ndarray) -> dict[str, dict]:
    """MAE of the leave-one-out per-prompt median over samples of prompts with >= 2 samples, per scenario and
    ``"overall"``: ``{group: {"mae", "n", "num_prompts"}}`` (groups without such prompts are left out)."""
    loo = leave_one_out_median(y, prompt_ids)
    multi = ~np.isnan(loo)
    scenarios, prompt_ids = np.asarray(scenarios), np.asarray(prompt_ids)
    out = {}
    for g in [*sorted(set(scenarios[multi].tolist())), "overall"]:
        m = multi & ((scenarios == g) if g != "overall" else True)
        if m.any():
            out[g] = {"mae": float(np.mean(np.abs(np.asarray(y, dtype=np.float64)[m] - loo[m]))), "n": int(m.sum()),
                      "num_prompts": int(len(np.unique(prompt_ids[m])))}
    return out


def gap_closed(mae_method: float, mae_reference: float, mae_floor: float) -> float | None:
    """Share of the gap from the reference (global median) to the oracle floor that a method closes:
    ``(ref - method) / (ref - floor)``; 1 = reaches the floor, 0 = no better than the median, < 0 worse.
    ``None`` when the floor is not below the reference."""
    if mae_reference - mae_floor <= 0:
        return None
    return float((mae_reference - mae_method) / (mae_reference - mae_floor))


def aggregate_seeds(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """Mean over seeds of every metric per group, with ``<metric>_std`` (population std; 0 for one run) and
    ``seeds`` (how many). ``None`` values (undefined tau) are skipped; all-``None`` stays ``None``."""
    out = {}
    for g in runs[0]:
        agg = {}
        for key, first in runs[0][g].items():
            if key == "n":
                agg["n"] = first
                continue
            vals = [r[g][key] for r in runs if r[g][key] is not None]
            agg[key] = float(np.mean(vals)) if vals else None
            agg[f"{key}_std"] = float(np.std(vals)) if vals else None
        agg["seeds"] = len(runs)
        out[g] = agg
    return out


def _fmt(value: float | None, std: float | None = None, digits: int = 1) -> str:
    if value is None:
        return "–"
    text = f"{value:.{digits}f}"
    return text + (f" ± {std:.{digits}f}" if std else "")


def table_rows(results: dict[str, dict[str, dict]], detail: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and rows shared by the rich and Markdown tables.

    Main table: MAE (± std over seeds) and RMSE per group. ``detail``: Kendall tau, within-25 % and, where
    present, the gap closed to the oracle floor and the MAE against per-prompt means.
    """
    groups = list(next(iter(results.values())))
    header, rows = ["method"], []
    first = next(iter(results.values()))
    for g in groups:
        if not detail:
            header += [f"{g} MAE", f"{g} RMSE"]
        else:
            header += [f"{g} tau", f"{g} ±25%"]
            header += [f"{g} gap closed"] if "gap_closed" in first[g] else []
            header += [f"{g} MAE vs prompt mean"] if g == "rl" and "mae_prompt_mean" in first[g] else []
    for method, per in results.items():
        row = [method]
        for g in groups:
            r = per[g]
            if not detail:
                row += [_fmt(r["mae"], r.get("mae_std")), _fmt(r["rmse"], r.get("rmse_std"))]
            else:
                row += [_fmt(r.get("kendall_tau"), r.get("kendall_tau_std"), 3),
                        _fmt(r["within_25"], r.get("within_25_std"), 3)]
                row += [_fmt(r.get("gap_closed"), None, 2)] if "gap_closed" in first[g] else []
                row += [_fmt(r["mae_prompt_mean"], r.get("mae_prompt_mean_std"))] \
                    if g == "rl" and "mae_prompt_mean" in first[g] else []
        rows.append(row)
    return header, rows


def render_table(results: dict[str, dict[str, dict]], title: str = "output-length prediction, test split",
                 detail: bool = False):
    """A rich ``Table`` of :func:`table_rows`; column headers carry the sample count of each group."""
    from rich.table import Table

    header, rows = table_rows(results, detail)
    first = next(iter(results.values()))
    table = Table(title=title)
    table.add_column(header[0])
    for h in header[1:]:
        g = h.split(" ")[0]
        table.add_column(h + (f"\n(n={first[g]['n']})" if h.endswith((" MAE", " tau")) else ""), justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(results: dict[str, dict[str, dict]], detail: bool = False) -> str:
    """The same table as Markdown (for the README)."""
    header, rows = table_rows(results, detail)
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def plot_mae(results: dict[str, dict[str, dict]], path: str | Path, title: str = "MAE (tokens), test split",
             floor: dict[str, dict] | None = None) -> None:
    """Grouped bar chart of MAE (error bars = std over seeds): groups = scenarios + overall, one bar per method,
    the oracle floor as a dashed line per group when given; saved as PNG atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(results)
    groups = list(results[methods[0]])
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(1.6 + 2.2 * len(groups), 4.6))
    x = np.arange(len(groups))
    for k, m in enumerate(methods):
        ax.bar(x + (k - (len(methods) - 1) / 2) * width, [results[m][g]["mae"] for g in groups], width, label=m,
               yerr=[results[m][g].get("mae_std") or 0 for g in groups], capsize=1.5)
    floor_groups = [(i, g) for i, g in enumerate(groups) if floor and g in floor]
    for k, (i, g) in enumerate(floor_groups):
        ax.hlines(floor[g]["mae"], i - 0.42, i + 0.42, colors="black", linestyles="dashed",
                  label="oracle floor (multi-sample prompts)" if k == 0 else None)
    ax.set_xticks(x, groups)
    ax.set_ylabel("MAE (tokens)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncols=min(len(methods) + 1, 6), loc="upper center", bbox_to_anchor=(0.5, -0.1),
              frameon=False)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def report_paths(out_dir: str | Path, stem: str = "results") -> dict[str, Path]:
    """The files :func:`save_report` writes: ``{"json", "png", "md"}`` → ``out_dir/<stem>.<key>``."""
    return {key: Path(out_dir) / f"{stem}.{key}" for key in ("json", "png", "md")}


def save_report(results: dict, extra: dict, out_dir: str | Path, stem: str = "results") -> dict[str, Path]:
    """Write ``<stem>.json`` (results + ``extra``: config, timings, tuning), ``<stem>.png`` and ``<stem>.md``
    (both tables; the oracle floor from ``extra["oracle_floor"]`` when present)."""
    paths = report_paths(out_dir, stem)
    write_json(paths["json"], {"results": results, **extra})
    plot_mae(results, paths["png"], floor=extra.get("oracle_floor"))
    with atomic_path(paths["md"]) as tmp:
        tmp.write_text(markdown_table(results) + "\n\n" + markdown_table(results, detail=True) + "\n")
    return paths
