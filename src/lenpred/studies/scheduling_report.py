"""Scheduling reports: one table per setting (rows = policy × predictor, columns = metrics) as rich and Markdown,
PNGs (JCT CDF per policy, padding-ratio bars), and the JSON they come from."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lenpred.io import atomic_path, write_json
from lenpred.tables import markdown_table

COLUMNS = (("throughput_tok_s", "tok/s", 1), ("mean_jct_s", "mean JCT s", 1), ("p50_jct_s", "p50 JCT", 1),
           ("p90_jct_s", "p90 JCT", 1), ("p99_jct_s", "p99 JCT", 1), ("mean_ttft_s", "mean TTFT s", 1),
           ("mean_normalised_latency_s_per_tok", "s/token", 3), ("num_preemptions", "preempt.", 1),
           ("padding_ratio", "padding", 3))


def interval_cell(value, digits: int) -> str:
    """A table cell: ``[estimate, low, high]`` → ``"12.3 [10.1, 14.0]"``; a number → itself with ``digits``
    decimals; ``None`` → ``"–"``."""
    if value is None:
        return "–"
    if isinstance(value, (list, tuple)):
        est, lo, hi = value
        return f"{est:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{value:.{digits}f}"


def simulation_tables(report: dict) -> dict[str, tuple[list[str], list[list[str]]]]:
    """``{setting: (header, rows)}`` from :func:`lenpred.studies.simulate.run_simulation`'s report; a row's
    cells are draw means with 95 % bootstrap intervals over draws, plus the oracle-gain share for length policies."""
    rows_by_setting: dict[str, list] = {}
    summary = report["summary"]
    for key, row in summary["rows"].items():
        setting, policy = key.rsplit("/", 1)
        cols = [(m, label, d) for m, label, d in COLUMNS if m in row]
        cells = [policy] + [interval_cell(row.get(m), d) for m, _, d in cols]
        cells.append(interval_cell(summary["gain_share"].get(key), 2) if key in summary["gain_share"] else "–")
        rows_by_setting.setdefault(setting, [["policy", *(label for _, label, _ in cols), "oracle-gain share"]])
        rows_by_setting[setting].append(cells)
    return {s: (r[0], r[1:]) for s, r in rows_by_setting.items()}


def static_real_table(report: dict) -> tuple[list[str], list[list[str]]]:
    """Real run 1: measured vs simulated wall time per grouping."""
    header = ["grouping", "wall s (measured)", "wall s (simulated)", "Δ sim", "mean JCT s", "mean JCT sim",
              "Δ sim", "tok/s", "padding"]
    rows = [[g, f"{r['wall_s']:.1f}", f"{r['sim_wall_s']:.1f}", f"{100 * r['sim_wall_rel_error']:+.1f} %",
             f"{r['mean_jct_s']:.1f}", f"{r['sim_mean_jct_s']:.1f}", f"{100 * r['sim_mean_jct_rel_error']:+.1f} %",
             f"{r['throughput_tok_s']:.1f}", f"{r['padding_ratio']:.3f}"] for g, r in report["runs"].items()]
    return header, rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A scheduling table as Markdown (:func:`lenpred.tables.markdown_table`, every column ``---``) ending in a
    newline."""
    return markdown_table(header, rows) + "\n"


def render(header: list[str], rows: list[list[str]], title: str):
    """A ``rich`` table."""
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="left" if h in ("policy", "grouping") else "right")
    for r in rows:
        table.add_row(*r)
    return table


def plot_jct_cdf(jct: dict[str, list[float]], path: str | Path, title: str) -> None:
    """Empirical CDF of per-request JCT, one line per policy row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label, values in jct.items():
        x = np.sort(values)
        ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=label, lw=1.2)
    ax.set(xlabel="job completion time (s)", ylabel="share of requests", title=title)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    _save(fig, path)


def plot_padding(padding: dict[str, list[float]], path: str | Path, title: str) -> None:
    """Bars of the padding ratio per grouping with their 95 % interval (``[estimate, low, high]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(padding)
    est = np.array([padding[n][0] for n in names])
    err = np.array([[padding[n][0] - padding[n][1], padding[n][2] - padding[n][0]] for n in names]).T
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(names, est, yerr=err, capsize=3, color="tab:blue", alpha=0.8)
    ax.set(ylabel="padding ratio (1 − Σ L / Σ batch max)", title=title)
    ax.tick_params(axis="x", rotation=30)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def _save(fig, path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def save_simulation_report(report: dict, out_dir: str | Path, console=None) -> dict[str, Path]:
    """Write ``simulation.json``, ``simulation.md``, ``sim_jct_cdf_<setting>.png`` and ``sim_padding.png``."""
    out_dir = Path(out_dir)
    paths = {"json": out_dir / "simulation.json", "md": out_dir / "simulation.md",
             "padding_png": out_dir / "sim_padding.png"}
    write_json(paths["json"], report)
    cfg = report["config"]
    parts = [f"# Simulator: {cfg['num_requests']} requests × {cfg['draws']} workload draws (seeds {cfg['seed']}.."
             f"{cfg['seed'] + cfg['draws'] - 1}), cost model {cfg['cost_model']}, max_num_seqs "
             f"{cfg['max_num_seqs']}, token budget {cfg['max_num_batched_tokens']}, Poisson/Gamma rate "
             f"{report['arrival_rate_per_s']:.3f} req/s (load {cfg['load']}), gamma CV {cfg['cv']}\n",
             "Cells: mean over draws [95 % bootstrap interval over draws]. Oracle-gain share: (JCT_fcfs − JCT_policy) /"
             " (JCT_fcfs − JCT_oracle of the same policy), paired bootstrap over draws.\n"]
    for setting, (header, rows) in simulation_tables(report).items():
        parts += [f"\n## {setting}\n", markdown(header, rows)]
        if console is not None:
            console.print(render(header, rows, f"simulator, {setting}"))
        jct = {k.rsplit("/", 1)[1]: v for k, v in report["jct_draw0"].items()
               if k.startswith(setting + "/") and "+aging" not in k}
        png = out_dir / f"sim_jct_cdf_{setting.replace('/', '_')}.png"
        plot_jct_cdf(jct, png, f"JCT CDF, simulator {setting}, draw 0")
        paths[f"cdf_{setting}"] = png
    plot_padding(report["summary"]["padding"], paths["padding_png"],
                 f"static batches of {cfg['max_num_seqs']}: padding ratio (95 % CI over {cfg['draws']} draws)")
    with atomic_path(paths["md"]) as tmp:
        tmp.write_text("\n".join(parts))
    return paths


def save_static_real_report(report: dict, out_dir: str | Path, console=None) -> dict[str, Path]:
    """Write ``static_real.md`` and ``static_real_padding.png`` (the JSON is written by the run itself)."""
    out_dir = Path(out_dir)
    header, rows = static_real_table(report)
    cfg = report["config"]
    title = (f"real run 1: transformers generate, {cfg['num_requests']} requests (true length ≤ "
             f"{cfg['max_output_len']}), static batches of {cfg['batch_size']}, seed {cfg['seed']}, greedy, each "
             "request forced to its true length")
    if console is not None:
        console.print(render(header, rows, title))
    paths = {"md": out_dir / "static_real.md", "png": out_dir / "static_real_padding.png",
             "cdf": out_dir / "static_real_jct_cdf.png"}
    plot_jct_cdf({g: r["jct_s"] for g, r in report["runs"].items()}, paths["cdf"], "JCT CDF, real run 1 (measured)")
    with atomic_path(paths["md"]) as tmp:
        tmp.write_text(f"# {title}\n\n" + markdown(header, rows))
    plot_padding({g: [r["padding_ratio"]] * 3 for g, r in report["runs"].items()}, paths["png"],
                 "real run 1: padding ratio per grouping")
    return paths


def save_markdown_with_cdf(name: str, text: str, jct_draw0: dict[str, list[float]], out_dir: str | Path,
                           title: str) -> dict[str, Path]:
    """Write ``<name>.md`` (``text``) and ``<name>_jct_cdf.png`` (:func:`plot_jct_cdf` of ``jct_draw0``, JCTs in
    seconds per policy) under ``out_dir``; returns their paths as ``{"md", "cdf"}``."""
    out_dir = Path(out_dir)
    paths = {"md": out_dir / f"{name}.md", "cdf": out_dir / f"{name}_jct_cdf.png"}
    with atomic_path(paths["md"]) as tmp:
        tmp.write_text(text)
    plot_jct_cdf(jct_draw0, paths["cdf"], title)
    return paths
