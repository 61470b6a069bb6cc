"""Metrics and reports: MAE / RMSE in tokens per scenario and overall, as a table, JSON and a PNG chart.

Capped responses (``finish_reason == "length"``) count at their capped length: that is what the
serving system observed. Metrics come from scikit-learn.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.metrics import mean_absolute_error, root_mean_squared_error

from lenpred.io import atomic_path, write_json


def length_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """``{"mae": ..., "rmse": ..., "n": ...}`` in tokens for one group of samples."""
    return {"mae": float(mean_absolute_error(y_true, y_pred)), "rmse": float(root_mean_squared_error(y_true, y_pred)),
            "n": int(len(y_true))}


def metrics_by_scenario(y_true: np.ndarray, y_pred: np.ndarray, scenarios: np.ndarray) -> dict[str, dict]:
    """Metrics per scenario (sorted) plus ``"overall"`` over all samples."""
    y_true, y_pred, scenarios = map(np.asarray, (y_true, y_pred, scenarios))
    out = {s: length_metrics(y_true[scenarios == s], y_pred[scenarios == s]) for s in sorted(set(scenarios))}
    out["overall"] = length_metrics(y_true, y_pred)
    return out


def render_table(results: dict[str, dict[str, dict]], title: str = "output-length prediction, test split"):
    """A rich ``Table``: rows = methods, columns = MAE / RMSE per scenario and overall (tokens)."""
    from rich.table import Table

    groups = list(next(iter(results.values())))
    table = Table(title=title)
    table.add_column("method")
    for g in groups:
        n = next(iter(results.values()))[g]["n"]
        table.add_column(f"{g} MAE\n(n={n})", justify="right")
        table.add_column(f"{g} RMSE", justify="right")
    for method, per_group in results.items():
        table.add_row(method, *[f"{per_group[g][m]:.1f}" for g in groups for m in ("mae", "rmse")])
    return table


def markdown_table(results: dict[str, dict[str, dict]]) -> str:
    """The same table as Markdown (for the README)."""
    groups = list(next(iter(results.values())))
    head = "| method | " + " | ".join(f"{g} MAE | {g} RMSE" for g in groups) + " |"
    sep = "|---|" + "---:|" * (2 * len(groups))
    rows = ["| " + m + " | " + " | ".join(f"{r[g]['mae']:.1f} | {r[g]['rmse']:.1f}" for g in groups) + " |"
            for m, r in results.items()]
    return "\n".join([head, sep, *rows])


def plot_mae(results: dict[str, dict[str, dict]], path: str | Path, title: str = "MAE (tokens), test split") -> None:
    """Grouped bar chart of MAE: groups = scenarios + overall, one bar per method; saved as PNG atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(results)
    groups = list(results[methods[0]])
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(1.6 + 1.8 * len(groups), 4.4))
    x = np.arange(len(groups))
    for k, m in enumerate(methods):
        ax.bar(x + (k - (len(methods) - 1) / 2) * width, [results[m][g]["mae"] for g in groups], width, label=m)
    ax.set_xticks(x, groups)
    ax.set_ylabel("MAE (tokens)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncols=min(len(methods), 6), loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def save_report(results: dict, extra: dict, out_dir: str | Path, stem: str = "results") -> dict[str, Path]:
    """Write ``<stem>.json`` (results + ``extra``: config, timings, tuning) and ``<stem>.png``."""
    out_dir = Path(out_dir)
    paths = {"json": out_dir / f"{stem}.json", "png": out_dir / f"{stem}.png"}
    write_json(paths["json"], {"results": results, **extra})
    plot_mae(results, paths["png"])
    return paths
