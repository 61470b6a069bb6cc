"""Dataset card of a benchmark: counts, length statistics, truncation, within-prompt spread; Markdown + PNG.

Within-prompt spread (for prompts with >= 2 samples): the mean over prompts of the standard
deviation of their samples' lengths, and the median over prompts of ``max / max(min, 1)`` — how far
one prompt's own samples scatter, which bounds what any prompt-only predictor can achieve.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa

from lenpred.bench.records import load_records, read_manifest
from lenpred.bench.plan import SPLITS
from lenpred.io import atomic_path
from lenpred.tables import markdown_table

logger = logging.getLogger(__name__)


def _spread(prompt_ids: np.ndarray, lengths: np.ndarray) -> tuple[float | None, float | None, int]:
    """Mean within-prompt std, median max/min ratio and count of prompts with >= 2 samples (None, None, 0 if none)."""
    groups: dict[str, list[float]] = {}
    for pid, n in zip(prompt_ids, lengths):
        groups.setdefault(pid, []).append(float(n))
    multi = [np.asarray(v) for v in groups.values() if len(v) >= 2]
    if not multi:
        return None, None, 0  # JSON null, not NaN (strict JSON readers reject NaN)
    return (float(np.mean([v.std() for v in multi])), float(np.median([v.max() / max(v.min(), 1.0) for v in multi])),
            len(multi))


def card_stats(bench_dir: str | Path, records: pa.Table | None = None) -> list[dict]:
    """One row per (scenario, split) plus an ``all`` split per scenario: counts and length statistics in tokens.

    ``records`` (from :func:`load_records`) saves reading the shards again.

    Raises:
        LenpredError: no readable benchmark in ``bench_dir``.
    """
    t = load_records(bench_dir) if records is None else records
    cols = {c: np.asarray(t.column(c).to_pylist()) for c in
            ("scenario", "split", "prompt_id", "num_output_tokens", "finish_reason", "num_prompt_tokens")}
    rows = []
    for scenario in sorted(set(cols["scenario"])):
        for split in (*SPLITS, "all"):
            m = cols["scenario"] == scenario
            if split != "all":
                m &= cols["split"] == split
            if not m.any():
                continue
            y = cols["num_output_tokens"][m]
            std, ratio, n_multi = _spread(cols["prompt_id"][m], y)
            rows.append({"scenario": scenario, "split": split, "prompts": int(len(set(cols["prompt_id"][m]))),
                         "responses": int(m.sum()), "prompt_tokens_mean": float(cols["num_prompt_tokens"][m].mean()),
                         "mean": float(y.mean()), "median": float(np.median(y)), "p90": float(np.percentile(y, 90)),
                         "max": int(y.max()), "truncated": float(np.mean(cols["finish_reason"][m] == "length")),
                         "multi_sample_prompts": n_multi, "within_prompt_std": std,
                         "within_prompt_max_min_ratio": ratio})
    return rows


def prompt_files_markdown(entries: list[dict]) -> str:
    """A Markdown table of a benchmark's prompt files (``bench.json["prompt_files"]``): scenario and sampling settings
    per file, and the file's SHA-256 (the card never shows prompt text)."""
    header = ["name", "scenario", "file", "SHA-256", "samples (train / eval)", "temperature", "top_p", "max_new_tokens"]
    rows = [[e["name"], e["scenario"], Path(e["path"]).name, e["sha256"][:12],
             f"{e['samples_per_prompt']} / {e['eval_samples_per_prompt']}", e["temperature"], e["top_p"],
             e["max_new_tokens"]] for e in entries]
    return "\n".join(["## Prompt files", "", markdown_table(header, rows)]) + "\n"


def card_markdown(rows: list[dict], title: str, note: str = "", prompt_files: list[dict] | None = None) -> str:
    """The card's Markdown table, with ``note`` (e.g. a warning) under the title and, for a benchmark built from
    prompt files, a table of those files (:func:`prompt_files_markdown`) after it."""
    header = ["scenario", "split", "prompts", "responses", "prompt tok (mean)", "length mean", "median", "p90", "max",
              "truncated", "within-prompt std", "within-prompt max/min"]
    cells = []
    for r in rows:
        spread = ([f"{r['within_prompt_std']:.1f}", f"{r['within_prompt_max_min_ratio']:.2f}"]
                  if r["multi_sample_prompts"] else ["–", "–"])
        cells.append([r["scenario"], r["split"], r["prompts"], r["responses"], f"{r['prompt_tokens_mean']:.0f}",
                      f"{r['mean']:.1f}", f"{r['median']:.0f}", f"{r['p90']:.0f}", r["max"],
                      f"{100 * r['truncated']:.1f}%", *spread])
    lines = [f"# {title}", "", *([note, ""] if note else []),
             "Lengths in tokens (EOS excluded); *truncated* = share that hit max_new_tokens; "
             "within-prompt columns use prompts with >= 2 samples.", "", markdown_table(header, cells)]
    return "\n".join(lines) + "\n" + ("\n" + prompt_files_markdown(prompt_files) if prompt_files else "")


CAPPED_SHARE = 0.8
"""A scenario whose responses hit ``max_new_tokens`` this often (or more) is warned about (:func:`capped_warnings`):
the committed SmolLM2 benchmarks peak at 41 % (RL), Gemma 3 270M (a base model) capped 7 of 8 chat replies at 128."""


def capped_warnings(rows: list[dict], share: float = CAPPED_SHARE) -> list[str]:
    """One message per scenario whose responses (all splits) are almost all capped (``truncated >= share``): the
    model rarely stops, so its lengths are the cap and a predictor learns nothing but the cap. A base model without
    a chat template (e.g. gemma-3-270m) seldom emits EOS after the blank-line prompt; a larger ``max_new_tokens`` or
    an instruction-tuned model helps.

    Args:
        rows: :func:`card_stats` rows (those with ``split == "all"`` are read)."""
    return [f"scenario '{r['scenario']}': {100 * r['truncated']:.0f} % of its {r['responses']} responses hit "
            "max_new_tokens: the model rarely stops, so lengths will be the cap (raise max_new_tokens, or use a model "
            "that ends its turn, e.g. an instruction-tuned one)"
            for r in rows if r["split"] == "all" and r["truncated"] >= share]


def warn_if_capped(bench_dir: str | Path, rows: list[dict] | None = None) -> list[str]:
    """Log :func:`capped_warnings` of a benchmark (one ``lenpred: warning`` line each) and return them."""
    messages = capped_warnings(card_stats(bench_dir) if rows is None else rows)
    for m in messages:
        logger.warning("lenpred: %s: %s", Path(bench_dir).name, m)
    return messages


def write_card(bench_dir: str | Path) -> dict[str, Path]:
    """Write ``CARD.md``, ``card.json`` and ``card.png`` (length histograms per scenario) into the benchmark dir.

    Everything is computed before the first file is written, so bad input leaves the old card intact.

    Raises:
        LenpredError: no readable benchmark in ``bench_dir`` (missing, corrupt ``bench.json`` or shard).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bench_dir = Path(bench_dir)
    t = load_records(bench_dir)
    manifest = read_manifest(bench_dir)
    rows = card_stats(bench_dir, t)
    capped = warn_if_capped(bench_dir, rows)
    scen = np.asarray(t.column("scenario").to_pylist())
    y = np.asarray(t.column("num_output_tokens").to_pylist())
    scenarios = sorted(set(scen))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4 * len(scenarios), 3.2), squeeze=False)
    try:
        for ax, s in zip(axes[0], scenarios):
            ax.hist(y[scen == s], bins=40, color="tab:blue")
            ax.set_title(f"{s} (n={int((scen == s).sum())})")
            ax.set_xlabel("num_output_tokens")
        axes[0][0].set_ylabel("responses")
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=110)
    finally:
        plt.close(fig)
    planned = manifest["num_requests"]
    note = (f"**Incomplete: {t.num_rows} of {planned} planned responses** (finish it with `lenpred bench build`)."
            if t.num_rows < planned else "")
    note = "\n\n".join([note, *(f"**Warning: {m}.**" for m in capped)]).strip()
    contents = {"md": card_markdown(rows, f"{bench_dir.name}: responses of {manifest['model_id']} "
                                          f"(revision {manifest['model_revision']})", note,
                                   manifest.get("prompt_files")),
                "json": json.dumps(rows, indent=2, allow_nan=False) + "\n", "png": png.getvalue()}
    paths = {"md": bench_dir / "CARD.md", "json": bench_dir / "card.json", "png": bench_dir / "card.png"}
    for key, path in paths.items():
        with atomic_path(path) as tmp:
            if isinstance(contents[key], bytes):
                tmp.write_bytes(contents[key])
            else:
                tmp.write_text(contents[key])
    return paths
