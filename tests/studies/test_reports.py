"""Typed study reports and their terminal rendering, checked on the committed results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "results"


def _report(path: Path):
    from lenpred.studies.evaluate import EvalReport

    content = json.loads(path.read_text())
    known = ("config", "model_revision", "overhead", "tuning", "timing_s", "values", "num_samples",
             "dropped_duplicates", "benchmark_complete", "censored_test_share")
    scores = {k: v for k, v in content.items() if k != "results" and k not in known}
    return content, EvalReport(results=content["results"], scores=scores, **{k: content[k] for k in known})


@pytest.mark.parametrize("name", ["demo", "evaluate"])
def test_eval_report_to_dict_is_the_committed_json(name):
    """``EvalReport.to_dict`` gives back the committed results.json key for key, in order."""
    content, report = _report(RESULTS / name / "results.json")
    assert list(report.to_dict()) == list(content)
    assert json.dumps(report.to_dict()) == json.dumps(content)


@pytest.mark.parametrize("name", ["demo", "evaluate"])
def test_terminal_tables_fit_100_columns(name):
    """The demo's and evaluate's terminal tables fit 100 columns with no truncated cell, and show the committed
    numbers as the Markdown file does (demo: ``last`` overall MAE 162.9 [151.8, 174.8], Δ floor -28.7)."""
    from rich.console import Console

    from lenpred.studies.evaluate import render_evaluate

    _, report = _report(RESULTS / name / "results.json")
    report.paths = {"json": "r.json", "md": "r.md", "png": "r.png"}
    console = Console(width=100, record=True)
    render_evaluate(report, console, name)
    text = console.export_text()
    lines = text.splitlines()
    table_lines = [line for line in lines if line.startswith(" ") or line.startswith(f"{name}:")]
    assert max(len(line.rstrip()) for line in table_lines) <= 100
    assert "…" not in "\n".join(table_lines)
    md = (RESULTS / name / "results.md").read_text()
    last_overall = report.results["last"]["overall"]
    mae_cell = f"{last_overall['mae']:.1f}"
    ci_cell = f"[{last_overall['mae_ci'][0]:.1f}, {last_overall['mae_ci'][1]:.1f}]"
    assert mae_cell in text and ci_cell in text and ci_cell in md
    if name == "demo":
        assert (mae_cell, ci_cell) == ("162.9", "[151.8, 174.8]")
        assert "-28.7" in text and "[-42.1, -16.4]*" in text


def test_terminal_table_refuses_unknown_kind():
    from lenpred.studies.evaluate_report import render_terminal_table

    results = json.loads((RESULTS / "demo" / "results.json").read_text())["results"]
    with pytest.raises(ValueError, match="mae, diff"):
        render_terminal_table(results, "t", kind="detail")


def test_sim_report_to_dict_is_the_committed_json():
    """``SimReport.to_dict`` gives back the committed simulation.json key for key, in order."""
    from lenpred.studies.simulate import SimReport

    content = json.loads((RESULTS / "scheduling" / "simulation.json").read_text())
    report = SimReport(**content)
    assert json.dumps(report.to_dict()) == json.dumps(content)


def test_traffic_report_to_dict_and_render_are_the_committed_files():
    """``TrafficReport.to_dict`` is the committed traffic results.json; its rendering is the committed results.md."""
    from rich.console import Console

    from lenpred.studies.traffic import TrafficReport, render_markdown, render_traffic

    content = json.loads((RESULTS / "traffic" / "results.json").read_text())
    report = TrafficReport(**content)
    assert json.dumps(report.to_dict()) == json.dumps(content)
    assert render_markdown(report.to_dict()) == (RESULTS / "traffic" / "results.md").read_text()
    console = Console(width=200, record=True)
    render_traffic(report, console)
    assert "coverage" in console.export_text()


def test_diagnose_report_rerenders_the_committed_report(tmp_path):
    """From the committed section JSONs, the report renders the committed REPORT.md and diagnose.json exactly."""
    import shutil

    from rich.console import Console

    from lenpred.studies.diagnose.report import write_report
    from lenpred.studies.diagnose.report import SECTIONS
    from lenpred.studies.diagnose.run import DiagnoseReport, render_diagnose

    for section in SECTIONS:
        shutil.copy(RESULTS / "diagnose" / f"{section}.json", tmp_path)
    report = DiagnoseReport(write_report(tmp_path), tmp_path / "REPORT.md")
    assert (tmp_path / "REPORT.md").read_text() == (RESULTS / "diagnose" / "REPORT.md").read_text()
    assert report.to_dict() == json.loads((RESULTS / "diagnose" / "diagnose.json").read_text())
    console = Console(width=200, record=True)
    render_diagnose(report, console)
    assert console.export_text().strip() == f"wrote {tmp_path / 'REPORT.md'} ({', '.join(SECTIONS)})"


def test_static_run_report_to_dict_is_the_committed_json():
    """``StaticRunReport.to_dict`` gives back the committed static_real.json key for key, in order; and a rerun with
    its config (the input-path fields added since at their defaults) passes the resume rule's comparison."""
    import dataclasses

    from lenpred.studies.static_run import StaticRunConfig, StaticRunReport

    content = json.loads((RESULTS / "scheduling" / "static_real.json").read_text())
    assert json.dumps(StaticRunReport(**content).to_dict()) == json.dumps(content)
    stored = content["config"]
    assert "workload" not in stored  # made before the field existed
    rerun = StaticRunConfig(**{**stored, "groupings": tuple(stored["groupings"])})
    as_stored = lambda cfg: json.loads(json.dumps(dataclasses.asdict(cfg)))  # noqa: E731
    assert {**as_stored(StaticRunConfig()), **stored} == as_stored(rerun)
