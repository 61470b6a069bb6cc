"""The simulator's queue study written out (:func:`lenpred.studies.queue_sim.run`'s report): ``.json``, ``.md`` (a
table per decode bound and pattern), ``_map.png`` (mean-JCT cut vs queue depth N/D) and ``_aging.png`` (the
starvation guard's mean-vs-tail trade-off)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lenpred.io import write_json
from lenpred.studies.queue_sim import AGED, BURSTS
from lenpred.tables import markdown_table


def markdown(rep: dict) -> str:
    """The report as Markdown: settings, then per decode bound and pattern a row per mode."""
    ci = lambda t: f"{t[0]:+.1%} [{t[1]:+.1%}, {t[2]:+.1%}]"  # noqa: E731
    sh = lambda t: "–" if not np.isfinite(t).all() else f"{t[0]:.2f} [{t[1]:.2f}, {t[2]:.2f}]"  # noqa: E731
    lines = ["# Scheduling where requests wait (simulator)", "",
             f"Cost model `{rep['settings']['cost_model']}` (prefill x{rep['settings']['prefill_scale']}) plus "
             f"{rep['settings']['streaming_overhead_ms']:.2f} ms per streamed token, starvation guard rates "
             f"{', '.join(f'{k:g}' for k in rep['settings']['aging']) or 'none'} tokens/s (`@k` rows), "
             + (f"γ-Boost on the predicted length at γ {', '.join(f'{g:g}' for g in rep['settings']['boost_gammas'])}"
                "/s (`:g<γ>` rows), " if rep["settings"].get("boost_gammas") else "")
             + (f"the plug-in's age threshold at {', '.join(f'{w:g}' for w in rep['settings']['max_waits'])} s "
                "(`:w<s>` rows), " if rep["settings"].get("max_waits") else "")
             + f"{rep['settings']['draws']} draws, the plug-in's max_idle_s {rep['settings']['max_idle_s']}. "
             "Cut = 1 − mean JCT / stock's; intervals 95 %, paired, requests clustered by draw.", ""]
    for study_ in rep["studies"]:
        lines += [f"## D = {study_['D']} (KV cache {study_['kv_cache_tokens']} tokens, stock capacity "
                  f"{study_['capacity_req_s']:.3f} req/s)", ""]
        for name, p in study_["patterns"].items():
            rows = [[m, f"{c['mean_jct_s']:.1f}", ci(c["jct_cut_vs_stock"]) if "jct_cut_vs_stock" in c else "–",
                     sh(c["share_of_prompt_oracle"]) if "share_of_prompt_oracle" in c else "–",
                     ci(c["jct_cut_vs_prompt_len"]) if "jct_cut_vs_prompt_len" in c else "–",
                     f"{c['p99_ratio_vs_stock']:.2f}"] for m, c in p["modes"].items()]
            lines += [f"### {name} ({p['num_requests']} requests)", "",
                      markdown_table(["mode", "mean JCT s", "cut vs stock", "share of prompt-oracle gain",
                                      "cut vs prompt-length priority", "p99 / stock p99"], rows), ""]
    return "\n".join(lines)


def plot_map(rep: dict, path: Path) -> None:
    """Per decode bound, the mean-JCT cut vs stock (95 % intervals) of the oracles, the proxy, the best plug-in mode and
    prompt-length priority against the burst depth N/D."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rep["studies"]), figsize=(5 * len(rep["studies"]), 3.8), squeeze=False)
    for ax, s in zip(axes[0], rep["studies"]):
        bursts = [f"burst{k}" for k in BURSTS]
        for mode in ("priority:oracle", "priority:prompt_oracle", "priority:proxy", rep["best_plugin"][str(s["D"])],
                     "priority:prompt_len"):
            if mode is None or mode not in s["patterns"][bursts[0]]["modes"]:  # a study run with --only
                continue
            y = [s["patterns"][b]["modes"][mode]["jct_cut_vs_stock"] for b in bursts]
            ax.errorbar(BURSTS, [100 * v[0] for v in y], yerr=[[100 * (v[0] - v[1]) for v in y],
                                                                [100 * (v[2] - v[0]) for v in y]],
                        marker="o", capsize=3, label=mode)
        ax.axhline(0, color="grey", lw=0.8, label="stock FCFS")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("queue depth N / D (all at once)")
        ax.set_ylabel("mean JCT cut vs stock (%)")
        ax.set_title(f"D = {s['D']} (simulator)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



def plot_aging(rep: dict, path: Path) -> None:
    """The mean-vs-tail frontier: per D, on the sustained 1.1x Gamma patterns and every trace pattern, each aged
    signal's and the plug-in's mean-JCT cut vs its p99 / stock p99 as the guard's rate grows (0 = no guard), γ-Boost
    on the predicted length as its γ grows (the settings' ``boost_gammas``), the plug-in under the age threshold as
    it falls (``max_waits``), the other plug-in policies
    (prediction-free ones among them) as single points, and the p99 <= 1.1x and 1.05x lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in rep["studies"][0]["patterns"]
             if (n.startswith("gamma") and n.endswith("x1.1")) or n.startswith("trace")]
    fig, axes = plt.subplots(len(rep["studies"]), len(names), figsize=(5 * len(names), 3.8 * len(rep["studies"])),
                             squeeze=False)
    rates = rep["settings"]["aging"]
    for row, s in zip(axes, rep["studies"]):
        for ax, name in zip(row, names):
            cells = s["patterns"][name]["modes"]
            best = f"plugin:srpt:W{s['D']}:prompt_len"
            curves = [(f"priority:{signal}", signal, "o") for signal in AGED] + [
                (best, "plug-in (SRPT, window D, admit by prompt length)", "*")]
            boosted = [f"plugin:boost_predicted:W{s['D']}:prompt_len:g{g:g}"
                       for g in sorted(rep["settings"].get("boost_gammas", ()))]
            curves.append((boosted, "γ-Boost on the predicted length, γ growing", "^"))
            waited = [f"plugin:srpt:W{s['D']}:prompt_len:w{w:g}"
                      for w in sorted(rep["settings"].get("max_waits", ()), reverse=True)]
            curves.append(([best] + waited, "plug-in, age threshold max_wait_s falling", "v"))
            for base, label, marker in curves:
                ms = [m for m in (base if isinstance(base, list) else [base] + [f"{base}@{k:g}" for k in rates])
                      if m in cells]
                if ms:
                    ax.plot([cells[m]["p99_ratio_vs_stock"] for m in ms],
                            [100 * cells[m]["jct_cut_vs_stock"][0] for m in ms], marker=marker, label=label)
            for m in cells:
                if (m.startswith("plugin:") and "@" not in m and m != best and m not in boosted
                        and not m.startswith(("plugin:sjf", "plugin:srpt"))):
                    ax.plot(cells[m]["p99_ratio_vs_stock"], 100 * cells[m]["jct_cut_vs_stock"][0], "s", label=m)
            ax.axvline(1.1, color="grey", ls="--", lw=0.8)
            ax.axvline(1.05, color="grey", ls=":", lw=0.8)
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xlabel("p99 JCT / stock p99")
            ax.set_ylabel("mean JCT cut vs stock (%)")
            ax.set_title(f"{name}, D = {s['D']}: guard 0, {', '.join(f'{k:g}' for k in rates)} tok/s", fontsize=9)
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save(rep: dict, out: str) -> None:
    """Write ``<out>.json``, ``<out>.md``, ``<out>_map.png`` and, with guard rates, ``<out>_aging.png``."""
    write_json(f"{out}.json", rep)
    Path(f"{out}.md").write_text(markdown(rep))
    plot_map(rep, Path(f"{out}_map.png"))
    if rep["settings"]["aging"]:
        plot_aging(rep, Path(f"{out}_aging.png"))


def summary_table(rep: dict, patterns: list[str], modes: list[str]) -> str:
    """A Markdown table of the first decode bound's study: per mode (rows) and pattern (columns) the mean-JCT cut vs
    stock with its 95 % interval and the p99 ratio to stock (what the docs quote, rendered from the report)."""
    cells = rep["studies"][0]["patterns"]
    rows = []
    for m in modes:
        row = [f"`{m}`"]
        for p in patterns:
            c = cells[p]["modes"].get(m, {})  # a guard (@k) runs on sustained patterns only
            cut = c.get("jct_cut_vs_stock")
            row.append("–" if cut is None else
                       f"{cut[0]:+.1%} [{cut[1]:+.1%}, {cut[2]:+.1%}] ({c['p99_ratio_vs_stock']:.2f})")
        rows.append(row)
    return markdown_table(["mode", *patterns], rows)


TRACE_TABLE = (("burst8", "gamma1x1.1", "tracecodex0.9", "tracecodex1.1", "traceconvx0.9", "traceconvx1.1"),
               ("priority:prompt_len", "plugin:hrrn:W16:prompt_len", "plugin:boost:W16:prompt_len",
                "plugin:las:W16:prompt_len", "plugin:boost_predicted:W16:prompt_len", "priority:proxy",
                "plugin:srpt:W16:prompt_len", "plugin:srpt:W16:prompt_len@4", "plugin:srpt:W16:prompt_len@8",
                "plugin:srpt:W16:prompt_len:w150", "plugin:srpt:W16:prompt_len:w200",
                "priority:prompt_oracle", "priority:oracle"))
"""The patterns and modes of the trace study's table in docs/serving.md (``results/scripts/serving/queue_trace/``;
``tests/test_doc_tables.py`` checks the docs against :func:`summary_table` of its JSON)."""
