"""Scenario names come from the benchmark: a benchmark whose scenarios are not ForeLen's renders and scores them."""

import numpy as np

from lenpred.predictors.progressive import ProgressiveRows
from lenpred.studies import progressive


def _rows(scenarios: np.ndarray) -> ProgressiveRows:
    n = len(scenarios)
    sample = np.repeat(np.arange(n), 2)
    step = np.tile([0, 32], n)
    length = np.repeat(np.arange(n) * 10.0 + 100, 2)
    return ProgressiveRows(sample, step, np.zeros((2 * n, 1), np.float32), np.zeros((2 * n, 1), np.float32), {},
                           length, np.zeros(2 * n, bool), np.full(2 * n, 512.0))


def test_curve_table_uses_the_benchmarks_own_scenarios():
    scenarios = np.array(["support", "code", "support", "code", "code", "support"], dtype=object)
    rows = _rows(scenarios)
    pred = rows.observed_remaining + 5.0  # every row off by 5 tokens
    cells = progressive.curve_table({"plp": pred}, rows, scenarios, np.array([f"p{i}" for i in range(6)]), (0, 32),
                                    fixed_after=32, n_resamples=50)
    assert list(dict.fromkeys(c["scenario"] for c in cells)) == ["code", "support", "overall"]
    by = {(c["population"], c["scenario"], c["step"]): c for c in cells}
    assert by[("running", "code", 0)]["n"] == 3 and by[("running", "overall", 32)]["n"] == 6
    assert by[("running", "support", 32)]["mae"] == 5.0
    assert progressive.benchmark_scenarios(scenarios) == ["code", "support"]


def _report(names, paired_scenario):
    curves = [{"population": pop, "scenario": s, "step": t, "method": m, "mae": 10.0, "low": 9.0, "high": 11.0, "n": 4}
              for pop in ("running", "fixed") for s in [*names, "overall"] for t in (0, 32, 64, 128)
              for m in progressive.METHODS]
    paired = {f"{paired_scenario}/step0/plp-oracle_minus_t": {"diff": -1.0, "low": -2.0, "high": 0.5, "n": 4}}
    return {"plp": {"prompt": "last@15", "plp_layer": 30}, "trail_progressive": {"layer": 20, "width": 64.0},
            "steps": [0, 32, 64, 128], "curves": curves, "paired": paired, "config": {},
            "update_cost_us": {"batch1_us": 100.0, "batch64_us": 700.0, "batch64_per_request_us": 11.0}}


def test_progressive_markdown_and_plot_name_the_benchmarks_scenarios(tmp_path):
    report = _report(["chat", "code"], "overall")
    progressive._write_markdown(report, tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text()
    assert "## chat: every rollout still running at t" in text and "## code: the fixed set" in text
    assert "longseq" not in text and "## rl" not in text
    assert "## Paired differences (every scenario, every rollout running at t)" in text
    assert "| overall/step0/plp-oracle_minus_t | -1.0 [-2.0, +0.5] | 4 |" in text
    progressive._plot(report, tmp_path / "c.png")  # one column per scenario of this benchmark
    assert (tmp_path / "c.png").stat().st_size > 0
    progressive._write_markdown(_report(["chat", "rl"], "rl"), tmp_path / "rl.md")
    assert "## Paired differences (RL, every rollout running at t)" in (tmp_path / "rl.md").read_text()


def test_diagnose_report_lists_the_sections_scenarios():
    from lenpred.studies.diagnose.report import attribution_md

    ci = {"mean": 0.5, "ci": [0.4, 0.6]}
    pooled = {g: {k: {"n": 7, "pearson": 0.1, "spearman": 0.2} for k in ("HG", "SG", "HS")}
              for g in ("chat", "code", "overall")}
    a = {"importance": "|dy/dh|", "head": "mean", "head_layer": 15, "num_prompts": {"chat": 2, "code": 2},
         "pooled": pooled, "within_prompt_spearman": {"HG": {g: ci for g in pooled}, "SG": {g: ci for g in pooled}}}
    table = [line for line in "\n".join(attribution_md(a)).splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| chat", "| code", "| overall"]
    assert table[1] == "| chat | 7 | 0.100 / 0.200 | 0.100 / 0.200 | 0.100 / 0.200 | 0.500 [0.400, 0.600] | " \
                       "0.500 [0.400, 0.600] |"
