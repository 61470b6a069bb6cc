"""Render ``REPORT.md``, the PNG figures and ``diagnose.json`` from the section JSONs of ``lenpred diagnose``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from lenpred.io import atomic_path, write_json
from lenpred.tables import markdown_table

SECTIONS = ("misalignment", "attribution", "ablation", "entropy", "overhead")
"""The sections of ``lenpred diagnose``, in the order they run and are reported."""


def _ci(x: dict | list | None, digits: int = 1, pct: bool = False) -> str:
    """``est [lo, hi]`` from ``{"mean", "ci"}`` or ``[est, lo, hi]``."""
    if x is None:
        return "—"
    est, lo, hi = (x["mean"], *x["ci"]) if isinstance(x, dict) else x
    f = (lambda v: f"{100 * v:.{digits}f} %") if pct else (lambda v: f"{v:+.{digits}f}" if isinstance(x, list) else
                                                           f"{v:.{digits}f}")
    if lo is None:
        return f(est)
    return f"{f(est)} [{f(lo)}, {f(hi)}]"


def _num(v, digits: int = 3) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _tok(token: str) -> str:
    """A decoded token string as a Markdown table cell (code span; pipes escaped)."""
    return "`" + token.replace("|", "\\|").replace("`", "'") + "`"


def _ratio_label(r) -> str:
    return "∞ (semantic-only)" if r is None else ("0 (entropy-only)" if r == 0 else f"{r:g}")


def _save_fig(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def misalignment_md(m: dict, out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = m["stats"]
    lines = ["## Misalignment of entropy and semantic score",
             f"Per prompt ({m['num_prompts']} distinct prompts, span `{m['pool_span']}`, semantic score divisor "
             f"`{m['semantic_divisor']}`): share of the top 40 % tokens by entropy that fall in the bottom half by "
             "semantic score, and the converse (top 40 % by semantic score in the bottom half by entropy); mean over "
             "prompts with a prompt-bootstrap 95 % interval. *Chance* is the share if the two rankings were "
             "independent (`floor(m/2)/m`): ESTP's \"more than 20 %\" is only informative next to it.", "",
             markdown_table(["scenario", "high entropy, low semantic", "high semantic, low entropy", "chance"],
                    [[g, _ci(s["high_entropy_low_semantic"][g], 1, True),
                      _ci(s["high_semantic_low_entropy"][g], 1, True), _ci(s["chance"][g], 1, True)]
                     for g in s["chance"]]), "",
             "![misalignment](misalignment.png)", "",
             "**Attention sinks.** How concentrated the semantic score (attention received in the last layer / n) is: "
             f"the median prompt's heaviest span token holds {100 * m['semantic_top_share_median']:.1f} % of the span's "
             "semantic score (mean per scenario: " + ", ".join(
                 f"{g} {_ci(s['semantic_top_share'][g], 1, True)}" for g in s['semantic_top_share'])
             + "). The heaviest token is most often:", "",
             markdown_table(["token", "prompts where it is the top semantic token", "share"],
                    [[_tok(t['token']), t["prompts"], f"{100 * t['share']:.1f} %"] for t in m["top_semantic_tokens"]]),
             "", "Median largest pooling weight per prompt (1 = one token gets all the weight): " + ", ".join(
                 f"{k} {v:.3f}" for k, v in m["median_top_weight"].items())
             + f" (ESTP at the evaluate run's choice λ1 = {m['estp_params']['lambda1']}, λ2 = 1, "
               f"α = {m['estp_params']['alpha']}).", ""]
    if "semantic_only_top_weight_by_alpha" in m:
        lines += ["Semantic-only pooling (softmax of the z-scored semantic score / α) concentrates on the sink token as "
                  "α falls — largest weight per prompt, median / 90th percentile: " + ", ".join(
                      f"α = {a}: {v['median']:.3f} / {v['p90']:.3f}"
                      for a, v in m["semantic_only_top_weight_by_alpha"].items()) + ".", ""]
    lines += ["**Tokens EGTP weighs more / less than ESTP** (decoded token strings aggregated over all prompts, at "
              "least 20 occurrences; mass = mean over prompts of the summed weight difference EGTP − ESTP):", ""]
    t = m["egtp_vs_estp_tokens"]
    rows = [[_tok(a['token']), f"{a['mass_per_prompt']:+.4f}", a["count"], _tok(b['token']),
             f"{b['mass_per_prompt']:+.4f}", b["count"]] for a, b in zip(t["over"], t["under"])]
    lines += [markdown_table(["EGTP over-weights", "mass", "count", "EGTP under-weights", "mass", "count"], rows), ""]
    npz = out / "misalignment_percentiles.npz"
    if npz.is_file():
        d = np.load(npz, allow_pickle=False)
        scen = sorted(set(d["scenario"].tolist()))  # the benchmark's scenarios, in the sections' order
        fig, axes = plt.subplots(1, len(scen), figsize=(5.2 * len(scen), 4.2), squeeze=False, layout="constrained")
        for i, (ax, g) in enumerate(zip(axes[0], scen)):
            k = d["scenario"] == g
            hb = ax.hexbin(d["entropy"][k], d["semantic"][k], gridsize=20, cmap="viridis")
            ax.set(title=f"{g} ({int(k.sum())} tokens)", xlabel="entropy percentile in prompt",
                   ylabel="semantic-score percentile in prompt" if i == 0 else None)
            ax.axvline(0.6, color="w", lw=0.8, ls="--")
            ax.axhline(0.5, color="w", lw=0.8, ls="--")
            fig.colorbar(hb, ax=ax, label="tokens")
        fig.suptitle("within-prompt ranks: entropy vs semantic score (dashed: top 40 % entropy, bottom half semantic)")
        _save_fig(fig, out / "misalignment.png")
    return lines


def attribution_md(a: dict) -> list[str]:
    rows = []
    for g, p in a["pooled"].items():  # the benchmark's scenarios (sorted) and overall, as the section wrote them
        w = a["within_prompt_spearman"]
        rows.append([g, p["HG"]["n"], *(f"{_num(p[k]['pearson'])} / {_num(p[k]['spearman'])}" for k in ("HG", "SG", "HS")),
                     *(_ci(w[k].get(g), 3) for k in ("HG", "SG"))])
    return ["## Attribution check",
            f"Importance `G_i = {a['importance']}` of the evaluate run's **{a['head']}-pooling head** (layer "
            f"{a['head_layer']}; its pooling weights are uniform, so `G` is not a function of the weights being "
            "tested — for EGTP/ESTP heads the gradient at the pooled layer is `w_i · dŷ/dz`, i.e. the weights "
            f"themselves), on the first {max(a['num_prompts'].values())} test prompts of each scenario. Correlations "
            "over all span tokens of a scenario (Pearson / Spearman), and the mean within-prompt Spearman with a "
            "prompt-bootstrap 95 % interval. EGTP reports Pearson r = 0.451 between entropy and gradient importance.",
            "", markdown_table(["scenario", "tokens", "H–G", "S–G", "H–S", "within-prompt ρ(H, G)", "within-prompt ρ(S, G)"],
                       rows), ""]


def ablation_md(ab: dict, out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = ab["headline"]
    lines = ["## Ablations",
             f"Soft-label head (the evaluate run's settings) over layer {ab['grid_layer']} (ESTP's layer in the evaluate run), "
             "hyper-parameters chosen on validation (seed "
             f"{ab['seeds'][0]}); test MAE is the mean over seeds {ab['seeds']} of the absolute errors, with a "
             "prompt-bootstrap 95 % interval, and the paired, prompt-clustered difference to the best entropy-only "
             "head (negative = better). λ2 = 1, so λ1/λ2 = λ1.", "",
             markdown_table(["pooling", "λ1/λ2", "α", "val MAE", "test MAE [95 % CI]", "test − entropy-only [95 % CI]"],
                    [[k, _ratio_label(v["ratio"]), v["alpha"], _num(v["val_mae"], 1),
                      f"{v['test_mae']:.1f} [{v['test_mae_ci'][0]:.1f}, {v['test_mae_ci'][1]:.1f}]",
                      _ci(v["diff_entropy_only"]) if v["diff_entropy_only"] else "(reference)"]
                     for k, v in h.items()]), "", "![ablation grid](ablation.png)", ""]
    grid = [r for r in ab["rows"] if r["group"] == "grid"]
    ratios, alphas = ab["ratios"], ab["alphas"]
    M = np.full((len(ratios), len(alphas)), np.nan)
    for r in grid:
        M[ratios.index(r["ratio"]), alphas.index(r["alpha"])] = r["val_mae"]
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    im = ax.imshow(M, cmap="viridis_r", aspect="auto")
    ax.set(xticks=range(len(alphas)), xticklabels=[f"{a:g}" for a in alphas], yticks=range(len(ratios)),
           yticklabels=[_ratio_label(r) for r in ratios], xlabel="α (temperature)", ylabel="λ1 / λ2",
           title=f"validation MAE (tokens), layer {ab['grid_layer']}, seed {ab['seeds'][0]}")
    for i in range(M.shape[0]):
        for j in range(M.shape[1]):
            if not np.isnan(M[i, j]):
                ax.text(j, i, f"{M[i, j]:.1f}", ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(im, ax=ax)
    _save_fig(fig, out / "ablation.png")
    one = [r for r in ab["rows"] if r["group"] != "grid"]
    lines += ["One change at a time from the best joint point (seed " f"{ab['seeds'][0]}; the head's defaults are "
              "K = 20 bins, τ = 1, λ = 0.95):", "",
              markdown_table(["change", "val MAE", "test MAE", "test − entropy-only [95 % CI]"],
                     [[f"{r['group']} = {r[r['group']]}", _num(r["val_mae"], 1), _num(r["test_mae"], 1),
                       _ci(r["test_diff_entropy_only"])] for r in one]), "",
              f"Layer: {ab['note']}.", ""]
    return lines


def entropy_md(e: dict) -> list[str]:
    v = e["verification"]
    methods = list(e["methods"])
    rows = []
    for name, var in e["variants"].items():
        agree = var.get("agreement")
        rows.append([name, var["k"], _num(agree["spearman"]) if agree else "1", *(
            f"{var[m]['val_mae']:.1f} / {var[m]['test_mae']:.1f}" for m in methods),
            *(_ci(var[m].get("diff_full")) if var[m].get("diff_full") else "(reference)" for m in methods)])
    return ["## Cheaper entropy (pruned output head), scored offline",
            f"The cache's last hidden state is the output head's input: the full-vocabulary entropy recomputed from "
            f"it matches the cached entropy on {v['num_tokens']} tokens of {v['num_prompts']} prompts (max |Δ| = "
            f"{v['max_abs_diff']:.2g} nats). A pruned head keeps the k output rows of {e['vocabulary']}, and the "
            "entropy of the softmax renormalised over them replaces the full entropy everywhere (train, validation, "
            f"test). EGTP and ESTP at the evaluate run's chosen settings, mean over seeds {e['seeds']}; differences "
            "are paired with the full-entropy head of the same seeds (prompt-clustered bootstrap, negative = better).",
            "", markdown_table(["entropy", "k", "Spearman vs full (tokens)", *(f"{m} val / test MAE" for m in methods),
                        *(f"{m} test − full [95 % CI]" for m in methods)], rows), ""]


def overhead_md(o: dict, out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    show = ("entropy_full", "signals_full", "estp_full", "entropy_pruned", "egtp_pruned", "signals_pruned",
            "estp_pruned")
    rows = [[f"{c['batch_size']} × {c['prompt_tokens']}", f"{c['plain_tok_s']:.0f}",
             *(f"{c['ratio'][k]:.3f}" for k in show),
             f"{c['variants']['plain']['peak_mib']:.0f} / {c['variants']['signals_full']['peak_mib']:.0f} / "
             f"{c['variants']['signals_pruned']['peak_mib']:.0f}"] for c in o["cases"]]
    lines = ["## Overhead",
             f"Wall time relative to a serving prefill (`plain`: SDPA, logits at the last position only) of the same "
             f"batch, one process, {o['threads']} torch threads, fastest of {o['repeats']} interleaved runs; random "
             f"token ids. `entropy_*`: hidden states + output head at every position + entropy (EGTP's signals); "
             f"`signals_*`: + eager attention in the last layer (ESTP's semantic score); `egtp_*` / `estp_*`: + pooling "
             f"and the evaluate run's head; `*_pruned`: the pruned output head (k = {o['pruned_k']} of "
             f"{o['vocab_size']}). Peak memory: RSS increase during the call (MiB; plain / signals_full / "
             "signals_pruned).", "",
             markdown_table(["B × n", "plain tok/s", *show, "peak MiB"], rows), "",
             "Every variant does strictly more work than `plain`, so a ratio below 1 is run-to-run timing noise (other "
             "processes, frequency scaling): differences of a few percent are within this machine's noise.", ""]
    if o["skipped"]:
        lines += ["Skipped (more than " f"{o['max_batch_tokens']} prompt tokens per batch; too slow for this 2-core "
                  "CPU's time budget): " + ", ".join(f"{s['batch_size']} × {s['prompt_tokens']}" for s in o["skipped"])
                  + ".", ""]
    ref = next((c for c in o["cases"] if c["batch_size"] == 8 and c["prompt_tokens"] == 512), None)
    if ref:
        lines += ["Breakdown at 8 × 512 (extra seconds and share of the plain prefill):", "",
                  markdown_table(["part", "seconds", "share of plain"],
                         [[k, f"{v['seconds']:.3f}", f"{100 * v['share_of_plain']:.1f} %"]
                          for k, v in ref["breakdown"].items()]), ""]
    lines += ["![overhead](overhead.png)", ""]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    x = np.arange(len(o["cases"]))
    width = 0.8 / len(show)
    for i, k in enumerate(show):
        ax.bar(x + i * width, [c["ratio"][k] for c in o["cases"]], width, label=k)
    ax.axhline(1.05, color="k", lw=0.8, ls="--", label="1.05× target")
    ax.set(xticks=x + 0.4 - width / 2, xticklabels=[f"{c['batch_size']}×{c['prompt_tokens']}" for c in o["cases"]],
           ylabel="time / plain prefill", ylim=(0.9, None), title="signal overhead vs serving prefill")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save_fig(fig, out / "overhead.png")
    return lines


def closing_md(sections: dict) -> list[str]:
    lines = ["## Closing note", ""]
    m = sections.get("misalignment")
    if m:
        s = m["stats"]
        lines.append("- Misalignment (all prompts): " + _ci(s["high_entropy_low_semantic"]["overall"], 1, True)
                     + " of the top-40 % entropy tokens are in the bottom semantic half, "
                     + _ci(s["high_semantic_low_entropy"]["overall"], 1, True) + " the converse; chance "
                     + _ci(s["chance"]["overall"], 1, True) + ".")
    ab = sections.get("ablation")
    if ab:
        j = ab["headline"]["joint"]
        lines.append(f"- Best (λ1, λ2, α) on validation: ({j['ratio']:g}, 1, {j['alpha']:g}) at layer "
                     f"{j['layer']}; test MAE {j['test_mae']:.1f} vs entropy-only "
                     f"{ab['headline']['entropy_only']['test_mae']:.1f}, difference {_ci(j['diff_entropy_only'])} "
                     "tokens (paired prompt bootstrap).")
    o = sections.get("overhead")
    ref = o and next((c for c in o["cases"] if c["batch_size"] == 8 and c["prompt_tokens"] == 512), None)
    if ref:
        r = ref["ratio"]
        lines.append(f"- Overhead at 8 × 512: EGTP signals {r['entropy_full']:.3f}× → {r['entropy_pruned']:.3f}× "
                     f"with the pruned head (k = {o['pruned_k']}); ESTP signals {r['signals_full']:.3f}× → "
                     f"{r['signals_pruned']:.3f}×; end to end with pooling + head: EGTP {r['egtp_full']:.3f}× → "
                     f"{r['egtp_pruned']:.3f}×, ESTP {r['estp_full']:.3f}× → {r['estp_pruned']:.3f}×.")
    return lines + [""]


def write_report(out: Path) -> dict:
    """Read every ``<section>.json`` in ``out``; write ``REPORT.md``, the PNGs and ``diagnose.json``. Returns
    ``{section: its result}`` for the sections present (:func:`lenpred.studies.diagnose.run.render_diagnose` prints
    where they went)."""
    out = Path(out)
    sections = {s: json.loads((out / f"{s}.json").read_text()) for s in SECTIONS if (out / f"{s}.json").is_file()}
    lines = ["# lenpred diagnose: misalignment, attribution, ablations, cheaper entropy, overhead", "",
             "Generated by `lenpred diagnose` from the committed benchmark (default `benchmarks/smollm2-forelen`) and "
             "the `lenpred evaluate` run it reads (default `results/evaluate`: its chosen settings and fitted heads). Numbers: `diagnose.json` (one key per "
             "section). Missing sections were not run.", ""]
    render = {"misalignment": lambda d: misalignment_md(d, out), "attribution": attribution_md,
              "ablation": lambda d: ablation_md(d, out), "entropy": entropy_md,
              "overhead": lambda d: overhead_md(d, out)}
    lines += closing_md(sections)
    for name in SECTIONS:
        if name in sections:
            lines += render[name](sections[name])
    with atomic_path(out / "REPORT.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    write_json(out / "diagnose.json", sections)
    return sections
