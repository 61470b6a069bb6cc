"""The one Markdown table writer (lenpred.tables) and the reports that use it."""

import pytest

from lenpred.bench.card import prompt_files_markdown
from lenpred.tables import markdown_cell, markdown_table


def test_markdown_table_exact_string():
    text = markdown_table(["method", "MAE"], [["last", "12.5"], ["estp", 3]])
    assert text == "| method | MAE |\n|---|---|\n| last | 12.5 |\n| estp | 3 |"


def test_markdown_table_alignment_rules():
    text = markdown_table(["a", "b", "c"], [[1, 2, 3]], align="lrc")
    assert text.splitlines()[1] == "|---|---:|:---:|"


def test_markdown_table_no_rows_is_header_and_rule():
    assert markdown_table(["x"], []) == "| x |\n|---|"


def test_markdown_cell_escapes_pipes_once():
    assert markdown_cell("a|b") == "a\\|b"
    assert markdown_cell("`\\|`") == "`\\|`"  # already escaped (diagnose's token cells): left as is
    assert markdown_table(["h|x"], [["1|2"]]) == "| h\\|x |\n|---|\n| 1\\|2 |"


def test_markdown_table_rejects_bad_align_and_ragged_rows():
    with pytest.raises(ValueError, match="align='lx'"):
        markdown_table(["a", "b"], [], align="lx")
    with pytest.raises(ValueError, match="align='l'"):
        markdown_table(["a", "b"], [], align="l")
    with pytest.raises(ValueError, match="row 1 has 1 cells for 2 columns"):
        markdown_table(["a", "b"], [["1", "2"], ["3"]])


def test_prompt_files_table_is_unchanged():
    """The exact string the card's prompt-file table had before it used the shared writer (no committed benchmark
    has prompt files, so this pins it)."""
    entries = [{"name": "faq", "scenario": "support", "path": "/x/y/faq.jsonl", "sha256": "ab" * 32,
                "samples_per_prompt": 2, "eval_samples_per_prompt": 4, "temperature": 0.7, "top_p": 0.95,
                "max_new_tokens": 256}]
    assert prompt_files_markdown(entries) == (
        "## Prompt files\n\n| name | scenario | file | SHA-256 | samples (train / eval) | temperature | top_p | "
        "max_new_tokens |\n|---|---|---|---|---|---|---|---|\n| faq | support | faq.jsonl | abababababab | 2 / 4 | 0.7 "
        "| 0.95 | 256 |\n")


def _committed(path):
    import json
    from pathlib import Path

    p = Path(__file__).resolve().parents[1] / path
    if not p.is_file():
        pytest.skip(f"{path} not committed")
    return p, (json.loads(p.read_text()) if p.suffix == ".json" else p.read_text())


def test_committed_reports_regenerate_byte_identical(tmp_path):
    """Each committed Markdown report renders again from its committed JSON to the same bytes."""
    from lenpred.pipeline import render_card
    from lenpred.predictor_config import PredictorConfig
    from lenpred.studies import evaluate_report, progressive, traffic, vllm_offline, vllm_serve

    _, rep = _committed("results/evaluate/results.json")
    parts = [evaluate_report.markdown_table(rep["results"], k) for k in evaluate_report.TABLES]
    parts.append(evaluate_report.tuning_markdown(rep["tuning"]))
    assert "\n\n".join(parts) + "\n" == _committed("results/evaluate/results.md")[1]
    assert (vllm_offline.offline_markdown(_committed("results/scheduling/vllm_offline.json")[1])
            == _committed("results/scheduling/vllm_offline.md")[1])
    assert (vllm_serve.serve_markdown(_committed("results/scheduling/vllm_serve.json")[1])
            == _committed("results/scheduling/vllm_serve.md")[1])
    assert traffic.render_markdown(_committed("results/traffic/results.json")[1]) == _committed(
        "results/traffic/results.md")[1]
    progressive._write_markdown(_committed("results/progressive/results.json")[1], tmp_path / "p.md")
    assert (tmp_path / "p.md").read_text() == _committed("results/progressive/results.md")[1]
    config, _, card = PredictorConfig.from_json(_committed("src/lenpred/default_predictor/config.json")[0].read_text())
    assert render_card(config, card) == _committed("src/lenpred/default_predictor/CARD.md")[1]
