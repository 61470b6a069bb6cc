"""Reports of an evaluation: tables (rich, Markdown), the MAE bar chart (PNG) and the JSON file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lenpred import tables
from lenpred.io import atomic_path, write_json


def _fmt(value: float | None, std: float | None = None, digits: int = 1) -> str:
    if value is None:
        return "–"
    text = f"{value:.{digits}f}"
    return text + (f" ± {std:.{digits}f}" if std else "")


def _fmt_ci(ci: list | None) -> str:
    """``[low, high]`` -> ``"[low, high]"``."""
    return "–" if ci is None else f"[{ci[0]:.1f}, {ci[1]:.1f}]"


def _fmt_diff(diff: list | None) -> str:
    """``[estimate, low, high]`` -> ``"-12.3 [-20.1, -4.0]*"``; ``*`` marks an interval that excludes 0."""
    if diff is None:
        return "–"
    d, lo, hi = diff
    return f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]" + ("*" if lo > 0 or hi < 0 else "")


TABLES: dict[str, list[tuple[str, str]]] = {
    "mae": [("mae", "MAE"), ("mae_ci", "95% CI")],
    "diff": [("diff_floor", "Δ floor"), ("diff_best_external", "Δ best ext.")],
    "detail": [("rmse", "RMSE"), ("kendall_tau", "tau"), ("within_25", "±25%"), ("gap_closed", "gap closed"),
               ("mae_uncapped", "MAE uncapped"), ("capped_below_cap", "capped < cap")],
}
"""The report's tables: kind -> ``(metric key, column label)`` per group. ``mae``: MAE (± std over head seeds) and
its 95 % prompt-bootstrap interval; ``diff``: paired differences to the per-scenario median floor and to the best
external baseline of each group; ``detail``: the rest."""


def _cell(key: str, r: dict) -> str:
    if key == "mae_ci":
        return _fmt_ci(r.get(key))
    if key.startswith("diff_"):
        return _fmt_diff(r.get(key))
    digits = 3 if key in ("kendall_tau", "within_25", "capped_below_cap") else 2 if key == "gap_closed" else 1
    return _fmt(r.get(key), r.get(f"{key}_std") if key != "gap_closed" else None, digits)


def table_rows(results: dict[str, dict[str, dict]], kind: str = "mae") -> tuple[list[str], list[list[str]]]:
    """Header and rows shared by the rich and Markdown tables of one :data:`TABLES` kind (a metric absent from every
    method's results in every group is left out)."""
    groups = list(next(iter(results.values())))
    keys = [(key, label) for key, label in TABLES[kind]
            if any(per[g].get(key) is not None for per in results.values() for g in groups)]
    columns = [(g, key, label) for g in groups for key, label in keys]
    header = ["method"] + [f"{g} {label}" for g, _, label in columns]
    rows = [[method] + [_cell(key, per[g]) for g, key, _ in columns] for method, per in results.items()]
    return header, rows


def render_table(results: dict[str, dict[str, dict]], title: str = "output-length prediction, test split",
                 kind: str = "mae"):
    """A rich ``Table`` of :func:`table_rows`; the first column of each group carries its sample count."""
    from rich.table import Table

    header, rows = table_rows(results, kind)
    first = next(iter(results.values()))
    table = Table(title=title)
    table.add_column(header[0], no_wrap=True)
    seen = set()
    for h in header[1:]:
        g = h.split(" ")[0]
        table.add_column(h + (f"\n(n={first[g]['n']})" if g not in seen else ""), justify="right")
        seen.add(g)
    for row in rows:
        table.add_row(*row)
    return table


TERMINAL_TABLES = ("mae", "diff")
"""The kinds printed on the terminal, by :func:`render_terminal_table`; every kind goes to the Markdown file."""


def _terminal_cell(kind: str, r: dict) -> str:
    """One group's cell of a terminal table: the value over its interval (two lines, so six methods x four groups
    fit 100 columns): ``mae``: MAE (± std over seeds) over its 95 % CI; ``diff``: the paired difference to the
    per-scenario floor over its CI (``*`` = excludes 0)."""
    if kind == "mae":
        return f"{_cell('mae', r)}\n{_fmt_ci(r.get('mae_ci'))}"
    return _fmt_diff(r.get("diff_floor")).replace(" [", "\n[", 1)


def render_terminal_table(results: dict[str, dict[str, dict]], title: str, kind: str = "mae"):
    """A rich ``Table`` of one :data:`TERMINAL_TABLES` kind that fits an 80-100 column terminal: one column per
    group (its sample count in the MAE table's header), each cell the value over its interval (:func:`_terminal_cell`). The
    numbers are those of :func:`markdown_table` (same formatting); the other metrics are left to the Markdown file.

    Raises:
        ValueError: ``kind`` is not one of :data:`TERMINAL_TABLES`.
    """
    from rich import box
    from rich.table import Table

    if kind not in TERMINAL_TABLES:
        raise ValueError(f"kind must be one of {', '.join(TERMINAL_TABLES)}, got {kind!r}")
    groups = list(next(iter(results.values())))
    first = next(iter(results.values()))
    label = {"mae": "MAE [95% CI]", "diff": "Δ floor [CI]"}[kind]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("method", no_wrap=True)
    for g in groups:
        count = f" (n={first[g]['n']})" if kind == "mae" else ""  # the counts once, in the MAE table
        table.add_column(f"{g}{count}\n{label}", justify="right", no_wrap=True)
    for method, per in results.items():
        table.add_row(method, *(_terminal_cell(kind, per[g]) for g in groups))
    return table


def markdown_table(results: dict[str, dict[str, dict]], kind: str = "mae") -> str:
    """The same table as Markdown (for the README)."""
    header, rows = table_rows(results, kind)
    return tables.markdown_table(header, rows, "l" + "r" * (len(header) - 1))


def plot_mae(results: dict[str, dict[str, dict]], path: str | Path, title: str = "MAE (tokens), test split",
             floor: dict[str, dict] | None = None) -> None:
    """Grouped bar chart of MAE (error bars = the 95 % prompt-bootstrap interval where present, else the std over
    seeds): groups = scenarios + overall, one bar per method,
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
        mae = np.array([results[m][g]["mae"] for g in groups])
        ci = [results[m][g].get("mae_ci") for g in groups]
        yerr = (np.array([[v - c[0] if c else 0 for v, c in zip(mae, ci)], [c[1] - v if c else 0 for v, c in zip(mae, ci)]])
                if any(ci) else [results[m][g].get("mae_std") or 0 for g in groups])
        ax.bar(x + (k - (len(methods) - 1) / 2) * width, mae, width, label=m, yerr=yerr, capsize=1.5)
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
    """Write ``<stem>.json`` (results + ``extra``: config, timings, tuning), ``<stem>.png`` (the oracle floor from
    ``extra["oracle_floor"]`` when present) and ``<stem>.md`` (every table of :data:`TABLES`)."""
    paths = report_paths(out_dir, stem)
    write_json(paths["json"], {"results": results, **extra})
    plot_mae(results, paths["png"], floor=extra.get("oracle_floor"))
    parts = [markdown_table(results, kind) for kind in TABLES]
    if extra.get("tuning"):
        parts.append(tuning_markdown(extra["tuning"]))
    with atomic_path(paths["md"]) as tmp:
        tmp.write_text("\n\n".join(parts) + "\n")
    return paths


def tuning_markdown(tuning: dict[str, dict]) -> str:
    """Per method: candidates searched on validation, the choice, and how its pooling weights spread (median and
    p90 over test prompts of the heaviest token's weight; share of prompts whose heaviest token is the span's last) —
    so a pooler that collapses onto one token shows it."""
    rows = []
    for method, t in tuning.items():
        chosen = {k: v for k, v in t["chosen"].items() if k in ("layer", "lambda1", "alpha")}
        d = t.get("diagnostics", {})
        rows.append([method, t.get("num_candidates", len(t.get("sweep", []))),
                     ", ".join(f"{k} {v}" for k, v in chosen.items()) or "–",
                     *(_fmt(d.get(k), None, 3) for k in ("top_token_weight", "top_token_weight_p90", "top_token_is_last"))])
    return tables.markdown_table(["method", "candidates", "chosen on validation", "top-token weight (median)", "(p90)",
                                  "heaviest = last"], rows, "lrlrrr")
