"""The engine's queue benchmark report written out: ``report.md`` (the regime, then per pattern its tables),
``report.json``, a JCT CDF per pattern and the regime map (``regime_map.png``) from
:func:`lenpred.studies.queue_report.report`."""

from __future__ import annotations

import json
from pathlib import Path

from lenpred.io import write_json
from lenpred.studies.engine_bench import fmt_ci, pct
from lenpred.studies.queue_regime import LENGTH_CLASSES, QUEUE_MODES, parse_pattern
from lenpred.studies.queue_report import MAP_MODES, SITTING_H, add_whatif, mode_cells, report
from lenpred.tables import markdown_table


def markdown(rep: dict) -> str:
    """``report.md``: the regime, then per pattern its tables."""
    reg = rep["regime"]
    cap = reg["capacity"]
    lines = [f"# Scheduling where requests wait: `vllm serve` on one core, decode bound D = {reg['decode_bound']}, "
             f"{rep['label']}", "",
             f"KV cache {reg['kv_cache_bytes']:,} bytes for every mode ({reg['kv_bytes_per_token']:,} bytes/token, "
             f"{reg['kv_dtype']}; one-request floor applied: {reg['kv_floor_applied']}); --max-model-len "
             f"{reg['max_model_len']}. FCFS capacity at D: {cap['capacity_req_s']:.3f} req/s ({cap['how']}"
             + ("; the latest sitting's: the draws of a pattern below ran at their own sittings' capacities"
                if any(mixed_rates(p) for p in rep["patterns"].values()) else "") + "; cost "
             f"model {cap.get('cost_model')}). Plug-in: `{json.dumps(reg['plugin'])}`{mode_guards(rep)}. The last "
             f"invocation's settings (each run's own are in runs.json): `{json.dumps(rep['settings'])}`", ""]
    if "simulator_cost_model" in rep:
        fit = rep["simulator_streaming_overhead"]
        lines += [f"The simulator on the same runs uses the bare engine's cost model `{rep['simulator_cost_model']}` "
                  f"(`vllm.LLM`, no server) plus {1000 * fit['s_per_token']:.2f} ms per streamed token: what the API "
                  f"server, on the engine's core, spends on each token it streams, fitted on stock's burst runs "
                  f"({len(fit['fitted_on'])}, in-sample); every other run validates it.", ""]
    for pattern, p in rep["patterns"].items():
        lines += pattern_markdown(pattern, p)
    if rep.get("regime_map"):
        def cut(c: dict) -> str:
            sim = "" if c["simulated_cut"] is None else f"sim {c['simulated_cut']:+.1%}; "
            return f"{fmt_ci(c['measured_cut'], pct)} ({sim}draws {c['draws']})"

        lines += ["## Regime map: mean-JCT cut vs stock by queue depth (bursts of N = k·D; `regime_map.png`)", "",
                  markdown_table(["N / D", *MAP_MODES], [[str(k), *(cut(cells[m]) if m in cells else "–"
                                                                    for m in MAP_MODES)]
                                                          for k, cells in rep["regime_map"].items()]), ""]
    lines += ["Intervals: 95 %, two-stage paired bootstrap over requests clustered by draw. The best lenpred mode is "
              "chosen on the runs it is scored on. Shares of an oracle's gain are unstable when that gain is near 0.",
              ""]
    return "\n".join(lines)


def whatif_by_mode(p: dict) -> dict[str, list[dict]]:
    """A pattern's ``lenpred whatif`` rows (:func:`~lenpred.studies.queue_report.add_whatif`) per mode (``plugin``
    for rows from before they named it), in their order."""
    out: dict[str, list[dict]] = {}
    for w in p.get("whatif", []):
        out.setdefault(w.get("mode", "plugin"), []).append(w)
    return out


def mode_guards(rep: dict) -> str:
    """The starvation guards the report's modes add to the plug-in's settings (``; plugin_wait: max_wait_s 200 s``),
    "" when none does: the header's plug-in settings are the store's, each mode's own guard is in its run."""
    out = ""
    for m in dict.fromkeys(m for p in rep["patterns"].values() for m in [*p["modes"], *p.get("fewer_draws", {})]):
        q, guards = QUEUE_MODES.get(m), []
        if q is not None and q.aging_tokens_per_s:
            guards.append(f"aging_tokens_per_s {q.aging_tokens_per_s:g}")
        if q is not None and q.max_wait_s is not None:
            guards.append(f"max_wait_s {q.max_wait_s:g} s")
        if guards:
            out += f"; {m}: " + ", ".join(guards)
    return out


def engine_trace_table(reports: dict[str, dict]) -> str:
    """The engine's trace runs in one table (the guide's headline): per report (``{label: report.json}``, each one
    trace pattern's store) and mode (those run on fewer slices than stock too, paired on their own), the slices run,
    mean JCT, the paired cut, the simulator's cut and p99 ratio on the same runs (one fixed engine pace), the p99
    ratio and throughput vs stock and the simulator's mean JCT over the measured (the run's pace against the cost
    model's; in parentheses at the pace of the same slices' stock runs); then per report the modes' runs apart from
    stock's and ``lenpred whatif``'s error per slice."""
    rows, notes = [], []
    for label, rep in reports.items():
        for pattern, p in rep["patterns"].items():
            for m, c, draws in mode_cells(p):
                versus = m != "stock" and "jct_cut_vs_stock" in c
                rows.append([label, str(len(draws)), m, f"{c['mean_jct_s']:.1f}",
                             fmt_ci(c["jct_cut_vs_stock"], pct) if versus else "–",
                             f"{pct(c['simulated_cut_vs_stock'])} ({c['simulated_p99_ratio_vs_stock']:.2f})"
                             if "simulated_cut_vs_stock" in c else "–",
                             fmt_ci(c["p99_jct_ratio_vs_stock"], lambda x: f"{x:.2f}") if versus else "–",
                             f"{c['throughput_ratio_vs_stock']:.3f}" if versus else "–",
                             sim_over_measured(c)])
            fewer = p.get("fewer_draws", {})
            apart = p.get("draws_apart_from_stock", {}) | {
                m: c["draws_apart_from_stock"] for m, c in fewer.items() if c.get("draws_apart_from_stock")}
            for mode, ds in apart.items():
                notes.append(f"{label}: {mode}'s runs of slices {', '.join(map(str, ds))} ran more than "
                             f"{SITTING_H:g} h from stock's: read its cut at one pace.")
            for mode, ws in whatif_by_mode(p).items():
                notes.append(f"{label}: `lenpred whatif` on each {mode} run's traffic log, error vs the measured cut "
                             "per slice: " + ", ".join(f"{w['error_pp']:+.1f}" for w in ws) + " points.")
    table = markdown_table(["trace, load", "slices", "mode", "mean JCT s", "mean-JCT cut vs stock",
                            "simulator at one pace: cut (p99 / stock)", "p99 JCT / stock", "tok/s / stock",
                            "simulator / measured (at stock's pace)"], rows)
    return "\n".join([table, "", *notes])


def sim_over_measured(cell: dict) -> str:
    """The simulator's mean JCT over the measured, at the cost model's pace and, in parentheses, at the pace of the
    same slices' stock runs (:func:`lenpred.studies.queue_report.fit_run_pace`); "–" where it was not simulated."""
    if cell.get("simulated_over_measured") is None:
        return "–"
    at_pace = cell.get("simulated_over_measured_at_stock_pace")
    return f"{cell['simulated_over_measured']:.2f}" + ("" if at_pace is None else f" ({at_pace:.2f})")


def fmt_scale(x: float | None) -> str:
    """A fitted pace scale to 3 decimals; "–" for none."""
    return "–" if x is None else f"{x:.3f}"


def run_paces_markdown(stock: dict, paced: dict) -> list[str]:
    """Each run's own pace (:func:`~lenpred.studies.queue_report.fit_run_pace`), mode by draw, stock's first, with
    its legend, as Markdown lines; "–": none fitted or no run.

    Args:
        stock: ``{draw: pace or None}``, the pattern's ``stock_pace_scale``.
        paced: ``{mode: {draw: pace or None}}``, each other mode's ``pace_scale_per_draw``.
    """
    rows = {"stock": stock, **paced}
    draws = sorted({d for x in rows.values() for d in x}, key=int)
    return ["Each run's pace, as a scale of the cost model's step times: the simulator of the run's own mode fitted to "
            "its mean JCT (`fit_run_pace`; > 1: slower). It holds the machine's pace during the run and what the mode "
            "costs the engine beyond the simulator's model; two runs of one draw at different paces compare the "
            "machine as well as the modes (by how much: stock's elasticity below):", "",
            markdown_table(["mode", *(f"draw {d}" for d in draws)],
                           [[m, *(fmt_scale(x.get(d)) for d in draws)] for m, x in rows.items()]), ""]


def whatif_markdown(rows: list[dict]) -> list[str]:
    """A pattern's ``lenpred whatif`` rows (:func:`~lenpred.studies.queue_report.add_whatif`) as a table with its
    legend: per run the predicted and the measured cut, the error in points, both p99 ratios and both runs' paces
    (each fitted by its own replay of its own run: whatif's of the plug-in run's log, :func:`~lenpred.studies.
    queue_report.fit_run_pace`'s of the stock run, which adds the streaming overhead; "–": none fitted)."""
    return ["`lenpred whatif` on each plug-in run's own traffic log (the simulator's cost model at the pace whatif "
            "fits to the log, the run's D and starvation guard) against that draw's measured cut vs stock; the paces "
            "(> 1: slower) fitted to the plug-in run (by whatif; – : none, where the log does not say the order it "
            "was served in or no pace matches) and to the stock run it is measured against:", "",
            markdown_table(["mode", "draw", "whatif: cut vs stock", "measured cut", "error, points",
                            "whatif: p99 / stock", "measured p99 / stock", "pace: plug-in run / stock run"],
                           [[w.get("mode", "plugin"), w["draw"], f"{w['predicted_cut']:+.1%}",
                             f"{w['measured_cut']:+.1%}", f"{w['error_pp']:+.1f}",
                             f"{w['predicted_p99_ratio']:.2f}", f"{w['measured_p99_ratio']:.2f}",
                             f"{fmt_scale(w.get('pace_scale'))} / {fmt_scale(w.get('stock_pace_scale'))}"] for w in rows]), ""]


def mixed_rates(p: dict) -> bool:
    """Whether a pattern's draws ran at different arrival rates (to 4 decimals, as the report prints them): each
    slice stretched to the capacity measured in its own sitting."""
    return len({round(r, 4) for r in p.get("rate_req_s_per_draw", []) if r is not None}) > 1


def pattern_markdown(pattern: str, p: dict) -> list[str]:
    """One pattern's tables: latency per mode; against stock; by length class; the best lenpred mode's checks."""
    sh = lambda x: f"{x:.2f}"  # noqa: E731
    cells = p["modes"]
    kind = "a trace slice's arrivals" if pattern.startswith("trace") else "Gamma arrivals"
    rates, sizes = p.get("rate_req_s_per_draw", [p["rate_req_s"]]), p.get("num_requests_per_draw", [p["num_requests"]])
    if p["rate_req_s"] is None:
        rate = "all at once"
    elif not mixed_rates(p):
        rate = f"{kind} at {p['rate_req_s']:.3f} req/s"
    else:  # each slice stretched to load x the capacity measured in its own sitting
        rate = (f"{kind} at {parse_pattern(pattern).load:g}× the capacity measured in each draw's own sitting: "
                + ", ".join(f"draw {d} {r:.4f}" for d, r in zip(p["draws"], rates)) + " req/s")
    size = f"{sizes[0]}" if len(set(sizes)) == 1 else f"{min(sizes)}–{max(sizes)}"
    lines = [f"## {pattern} ({size} requests per draw, {rate}; draws {p['draws']})", ""]
    for mode, ds in p.get("draws_apart_from_stock", {}).items():
        lines += [f"**{mode}: draws {ds} ran more than {SITTING_H:g} h from stock's run**: the engine's pace "
                  "drifts over hours, so those pairs compare paces as well as orders (the simulator's cut at one "
                  "pace is the yardstick).", ""]
    if p.get("mixed_machine_draws"):
        lines += [f"**Draws {p['mixed_machine_draws']} ran on more than one machine** (`machine` in `runs.json`): "
                  "their pairs compare machines as well as orders; rerun them in one session.", ""]
    load = lambda x: (f"{x['loadavg_1m_before_max']:.1f} / "  # noqa: E731
                      + ("–" if x.get("loadavg_1m_during_max") is None else f"{x['loadavg_1m_during_max']:.1f}"))
    lines += [markdown_table(["mode", "ok", "mean JCT s", "p50", "p90", "p99", "mean TTFT s", "tok/s", "preemptions",
                              "capped", "load avg before / during, max"],
                             [[m, f"{x['num_ok']}/{x['num_requests']}", f"{x['mean_jct_s']:.1f}",
                               f"{x['p50_jct_s']:.1f}", f"{x['p90_jct_s']:.1f}", f"{x['p99_jct_s']:.1f}",
                               f"{x['mean_ttft_s']:.2f}", f"{x['throughput_tok_s']:.1f}", f"{x['preemptions']:.0f}",
                               f"{x['capped_share']:.0%}", load(x)] for m, x in cells.items()]), "",
              "Load avg: the 1-minute load average before each run and, sampled every 10 s, during it (max over the "
              "mode's runs; the engine and the client make about 2 on two cores, more is another job running; – : "
              "a run from before it was sampled).", ""]
    if p.get("stock_capacity_req_s"):
        caps = p["stock_capacity_req_s"]
        lines += [f"Stock's capacity at D on this machine, requests / makespan per draw: "
                  f"{', '.join(f'{c:.3f}' for c in caps)} req/s (mean {sum(caps) / len(caps):.3f}): the "
                  "`--capacity-req-s` of the Gamma and trace patterns here.", ""]
    if "jct_pooled" not in p:
        return lines + ["(no stock runs: nothing paired)", ""]
    get = lambda x, k, f: fmt_ci(x[k], f) if k in x else "–"  # noqa: E731
    versus = ["mean JCT cut vs stock", "share of prompt-oracle gain", "share of oracle gain", "p99 JCT / stock",
              "tok/s / stock"]
    versus_row = lambda x: [  # noqa: E731
        fmt_ci(x["jct_cut_vs_stock"], pct), get(x, "share_of_priority_prompt_oracle", sh),
        get(x, "share_of_priority_oracle", sh), fmt_ci(x["p99_jct_ratio_vs_stock"], sh),
        f"{x['throughput_ratio_vs_stock']:.3f}"]
    lines += [markdown_table(["mode", *versus], [[m, *versus_row(x)] for m, x in cells.items() if m != "stock"]), ""]
    simulated = {**cells, **p.get("fewer_draws", {})}
    if all("simulated_mean_jct_s" in x for x in simulated.values()):
        p99 = lambda x: (f"; p99 {x['simulated_p99_over_measured']:.2f}"  # noqa: E731
                         if "simulated_p99_over_measured" in x else "")
        at_pace = lambda x: (f"; at stock's pace {x['simulated_over_measured_at_stock_pace']:.2f}"  # noqa: E731
                             if x.get("simulated_over_measured_at_stock_pace") is not None else "")
        lines += ["Simulator on the same runs: predicted mean JCT s (predicted / measured; the same ratio "
                  "without the streaming overhead; p99 JCT predicted / measured, mean over draws; predicted / "
                  "measured with the cost model at the pace of the same draw's stock run): " + "; ".join(
                      f"{m} {x['simulated_mean_jct_s']:.1f} ({x['simulated_over_measured']:.2f}; "
                      f"{x['offline_over_measured']:.2f}{p99(x)}{at_pace(x)})" for m, x in simulated.items()) + ".",
                  ""]
        paced = {m: x["pace_scale_per_draw"] for m, x in simulated.items() if x.get("pace_scale_per_draw")}
        if any(f is not None for x in [p.get("stock_pace_scale", {}), *paced.values()] for f in x.values()):
            lines += run_paces_markdown(p.get("stock_pace_scale", {}), paced)
        elastic = {d: e for d, e in p.get("stock_pace_elasticity", {}).items() if e is not None}
        if elastic:
            lines += ["Stock's mean JCT's elasticity to the pace, per draw, at its fitted pace (`pace_elasticity`: the "
                      "% a 1 % slower engine adds to it in the simulator; 1 where the schedule does not depend on "
                      "arrival times, as in a burst): " + ", ".join(f"draw {d} ({e:.1f})" for d, e in elastic.items())
                      + ".", ""]
    if p.get("whatif"):
        lines += whatif_markdown(p["whatif"])
    if p.get("pace_ms"):
        draws = sorted({d for x in p["pace_ms"].values() for d in x}, key=int)
        ms = lambda x: "–" if x is None else f"{x:.0f}"  # noqa: E731
        lines += ["The engine's pace per run: median ms per output token after the first (under stock and prompt-length "
                  "priority nothing is parked, so on one slice this is the engine's speed; under the plug-in it "
                  "includes parked waits) and, in parentheses, the speed probe just before the run (4 requests forced "
                  "to 64 tokens; – : not recorded). Runs of one draw at different paces compare the machine as well "
                  "as the orders.", "", markdown_table(["mode", *[f"draw {d}" for d in draws]],
                                                       [[m, *[f"{ms(x[d]['tpot_ms'])} ({ms(x[d]['probe_ms'])})"
                                                              if d in x else "" for d in draws]]
                                                        for m, x in p["pace_ms"].items()]), ""]
        if any("steps" in y for x in p["pace_ms"].values() for y in x.values()):
            cell = lambda y: "–" if "steps" not in y else (  # noqa: E731
                f"{y['steps']:.0f} / {y['tokens_per_step']:.1f} / {y['wall_ms_per_step']:.0f}"
                + ("" if y["plugin_ms_per_step"] is None else f" ({y['plugin_ms_per_step']:.2f})"))
            lines += ["The engine's steps per run (vLLM's tokens-per-step histogram: the steps that emitted a token): "
                      "steps / tokens per step / the run's wall ms per step (the time per step where the engine is "
                      "busy throughout, as in a burst) and, in parentheses, the plug-in's own ms per step (its policy "
                      "and head; from its scheduler log, up to 255 steps behind; – : a run from before steps were "
                      "recorded):", "",
                      markdown_table(["mode", *[f"draw {d}" for d in draws]],
                                     [[m, *[cell(x[d]) if d in x else "" for d in draws]]
                                      for m, x in p["pace_ms"].items()]), ""]
    if p.get("fewer_draws"):
        best_cut = lambda x: fmt_ci(x["best_lenpred_cut"], pct) if "best_lenpred_cut" in x else "–"  # noqa: E731
        best_mode = (p["best_lenpred"] or {}).get("mode", "–")
        lines += ["Modes run in fewer draws, each paired with stock, the oracles and the best lenpred mode "
                  f"({best_mode}; its cut positive: it is faster) on its own draws:", "",
                  markdown_table(["mode", "draws", "mean JCT s", *versus, "best lenpred mode's cut vs it"],
                                 [[m, str(x["draws"]), f"{x['mean_jct_s']:.1f}", *versus_row(x), best_cut(x)]
                                  for m, x in p["fewer_draws"].items()]), ""]
    classes = p["length_classes"]
    bounds = ", ".join(f"{name} <= {b:.0f}" for name, b in zip(LENGTH_CLASSES, classes["upper_tokens"]) if b)
    cut_cls = classes["jct_cut_vs_stock"]
    lines += [f"Mean JCT (s) by length class (thirds of the recorded length, tokens: {bounds}), and each third's "
              "cut vs stock:", "",
              markdown_table(["mode", *LENGTH_CLASSES, *(f"{c} cut vs stock" for c in LENGTH_CLASSES)],
                             [[m, *(f"{v:.1f}" if v is not None else "–" for v in row.values()),
                               *(fmt_ci(cut_cls[m][c], pct) if c in cut_cls.get(m, {}) else "–"
                                 for c in LENGTH_CLASSES)]
                              for m, row in classes["modes"].items()]), ""]
    best, acc = p["best_lenpred"], p["acceptance"]
    if best is not None:
        lines += [f"Best lenpred mode: {best['mode']}; its mean-JCT cut vs each other mode (negative: that mode is "
                  "faster):", "",
                  markdown_table(["vs mode", "mean-JCT cut"],
                                 [[m, fmt_ci(v, pct)] for m, v in best["jct_cut_vs"].items()]), "",
                  f"Issue {acc.get('issue', 38)}'s checks: "
                  + ", ".join(f"{k} {'n/a' if v is None else 'yes' if v else 'NO'}"
                              for k, v in acc.items() if k not in ("mode", "issue", "all", "left_out_runs_apart"))
                  + "." + (f" Not chosen: {', '.join(acc['left_out_runs_apart'])} (runs apart from stock's)."
                           if acc.get("left_out_runs_apart") else ""), ""]
    return lines



def plot_regime_map(rmap: dict, path: Path, decode_bound: int) -> None:
    """Measured cut (points, 95 % intervals) and the simulator's on the same runs (dashed, crosses) vs depth N/D."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in MAP_MODES:
        depths = [k for k, cells in rmap.items() if mode in cells]
        if not depths:
            continue
        c = [rmap[k][mode]["measured_cut"] for k in depths]
        line = ax.errorbar(depths, [100 * v[0] for v in c], yerr=[[100 * (v[0] - v[1]) for v in c],
                                                                   [100 * (v[2] - v[0]) for v in c]],
                           marker="o", capsize=3, label=f"{mode} (engine)")
        sim = [(k, rmap[k][mode]["simulated_cut"]) for k in depths if rmap[k][mode]["simulated_cut"] is not None]
        if sim:
            ax.plot([k for k, _ in sim], [100 * v for _, v in sim], ls="--", marker="x", color=line[0].get_color(),
                    alpha=0.7)
    ax.axhline(0, color="grey", lw=0.8, label="stock FCFS")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(rmap), [str(k) for k in rmap])
    ax.set_xlabel("queue depth N / D (all at once)")
    ax.set_ylabel("mean JCT cut vs stock (%)")
    ax.set_title(f"vllm serve, 1 core, D = {decode_bound}; dashed / x: simulator on the same runs", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save_report(store: dict, out: str | Path, n_resamples: int = 2000, sim_cost_model: str | None = None) -> dict:
    """Write ``report.json``, ``report.md``, a JCT CDF per pattern and, with a burst run, the regime map
    (``regime_map.png``) under ``out``; returns the report (:func:`lenpred.studies.queue_report.report` with
    ``n_resamples`` and ``sim_cost_model``)."""
    from lenpred.studies.scheduling_report import plot_jct_cdf

    out = Path(out)
    rep = report(store, n_resamples, sim_cost_model)
    if sim_cost_model is not None:
        add_whatif(rep, store, out, sim_cost_model, n_resamples)
    if rep["regime_map"]:
        plot_regime_map(rep["regime_map"], out / "regime_map.png", rep["regime"]["decode_bound"])
    write_json(out / "report.json", rep)
    (out / "report.md").write_text(markdown(rep))
    for pattern, p in rep["patterns"].items():
        if "jct_pooled" in p:
            plot_jct_cdf(p["jct_pooled"], out / f"jct_cdf_{pattern}.png",
                         f"JCT per request, {pattern}, D = {rep['regime']['decode_bound']} (vllm serve, 1 core)")
    return rep


def frontier_markdown(fr: dict) -> str:
    """:func:`lenpred.studies.queue_report.guard_frontier`'s result as Markdown: the measured run, then one row per
    point (pooled cut and p99 ratio, then per draw)."""
    m = fr["measured"]
    rows = [[pt["label"], f"{pt['cut']:+.1%}", f"{pt['p99_ratio']:.3f}",
             " ".join(f"{c:+.1%}/{r:.2f}" for c, r in zip(pt["cut_per_draw"], pt["p99_ratio_per_draw"]))]
            for pt in fr["points"]]
    paces = ", ".join(f"{f:.3f}" for f in fr["stock_pace_scale"])
    left = f" (left out: draws {fr['left_out_draws']})" if fr["left_out_draws"] else ""
    return "\n".join([
        f"# The age threshold's frontier on the engine's {fr['pattern']} slices (simulated at stock's pace)", "",
        f"Draws {fr['draws']}{left}: each draw's {fr['mode']} run (`{fr['policy_as_run']}`) re-simulated under "
        f"`{fr['policy']}` with max_wait_s = T against its stock run, both at the pace of that stock run (scales "
        f"{paces} of `{fr['cost_model']}`). Measured on the engine: {fr['mode']} {m['cut']:+.1%}, p99 "
        f"{m['p99_ratio']:.3f}x stock's: compare the first row. Command: `{fr.get('command', '')}`.", "",
        markdown_table(["point", "mean-JCT cut vs stock", "p99 / stock", "per draw (cut/p99)"], rows, "lrrl"), ""])


P99_BAR = 1.05
"""Issue 49's tail bar (p99 JCT within 1.05x stock's), drawn on the frontier plot."""


def plot_frontier(fr: dict, path: Path) -> None:
    """The frontier as cut (%) against p99 / stock, each T labelled, the run without a threshold as a diamond; the
    run as it ran, simulated (square) and measured (star); a dotted line at :data:`P99_BAR`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    first, rest = fr["points"][0], fr["points"][1:]
    curve = [pt for pt in rest if pt["max_wait_s"] is not None]
    ax.plot([pt["p99_ratio"] for pt in curve], [100 * pt["cut"] for pt in curve], marker="o",
            label=f"{fr['mode']} ({fr['policy']}), age threshold T")
    for pt in curve:
        ax.annotate(f"{pt['max_wait_s']:g} s", (pt["p99_ratio"], 100 * pt["cut"]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    for pt in (pt for pt in rest if pt["max_wait_s"] is None):
        ax.plot(pt["p99_ratio"], 100 * pt["cut"], "D", label=f"{fr['mode']} ({fr['policy']}), no threshold")
    ax.plot(first["p99_ratio"], 100 * first["cut"], "s", label=f"as run ({fr['policy_as_run']}), simulator")
    ax.plot(fr["measured"]["p99_ratio"], 100 * fr["measured"]["cut"], "*", ms=12,
            label=f"as run ({fr['policy_as_run']}), engine")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.axvline(P99_BAR, color="grey", lw=0.8, ls=":", label=f"p99 {P99_BAR:g}x stock's")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("p99 JCT / stock's (pooled over the draws)")
    ax.set_ylabel("mean JCT cut vs stock (%)")
    ax.set_title(f"{fr['pattern']}, draws {fr['draws']}: simulated at each stock run's pace", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
