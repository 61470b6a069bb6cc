"""The serving benchmark's report on a hand-made store (:mod:`lenpred.studies.serving_bench`): paired cuts against
stock and the ordering against parked FCFS with hand-worked estimates, the cell's column order, the Markdown; and the
config's refusal of an unknown mode."""

from __future__ import annotations

import pytest

from lenpred.errors import LenpredError
from lenpred.studies.engine_bench import run_key
from lenpred.studies.serving_bench import ServingBenchReport, pattern_report, render_markdown
from lenpred.studies.serving_bench_runs import ServingBenchConfig

JCT = {"stock": [[4.0, 6.0], [8.0, 2.0]], "parked_fcfs": [[4.0, 4.0], [6.0, 2.0]],
       "parked_sjf": [[2.0, 3.0], [4.0, 1.0]]}
"""Per mode, per draw, each request's JCT (s): means 5, 4 and 2.5."""


def _run(jct: list[float]) -> dict:
    results = [{"request_id": i, "outcome": "ok", "jct_s": x, "ttft_s": x / 10, "max_gap_s": x / 4,
                "completion_tokens": 10, "finish_reason": "stop"} for i, x in enumerate(jct)]
    return {"results": results, "summary": {"throughput_tok_s": 50.0, "p99_tbt_s": 0.1}, "preemptions": 0.0,
            "loadavg_1m_before": 0.5, "plugin_log": []}


@pytest.fixture
def part() -> dict:
    store = {"capacity": {"capacity_req_s": 0.5},
             "runs": {run_key(d, m, "burst"): _run(jct[d]) for m, jct in JCT.items() for d in range(2)}}
    return pattern_report(ServingBenchConfig(bootstrap_resamples=50), store, [[], []], "burst", sim={})


def test_pattern_report_pairs_every_mode_with_stock_and_parked_fcfs(part):
    cells = part["modes"]
    assert part["rate_req_s"] is None and list(cells) == ["stock", "parked_fcfs", "parked_sjf"]
    sjf = cells["parked_sjf"]
    assert sjf["draws"] == [0, 1] and sjf["mean_jct_s"] == 2.5
    assert sjf["jct_cut_vs_stock"][0] == pytest.approx(1 - 2.5 / 5)
    assert sjf["jct_cut_vs_parked_fcfs"][0] == pytest.approx(1 - 2.5 / 4)
    assert sjf["ttft_diff_vs_stock_s"][0] == pytest.approx(0.25 - 0.5)
    assert sjf["longest_stall_diff_vs_stock_s"][0] == pytest.approx(2.5 / 4 - 5 / 4)
    low, high = sjf["jct_cut_vs_stock"][1:]
    assert low <= 0.5 <= high
    keys = list(sjf)  # the committed report's column order: stalls and TBT right after TTFT
    assert keys[keys.index("mean_ttft_s") + 1:keys.index("mean_ttft_s") + 3] == ["p99_tbt_s", "mean_longest_stall_s"]
    assert "jct_cut_vs_stock" not in cells["stock"] and part["jct_pooled"]["stock"] == [4.0, 6.0, 8.0, 2.0]


def test_render_markdown(part):
    rep = ServingBenchReport({"seed": 1}, {"capacity_req_s": 0.5, "mean_prompt_tokens": 100.0,
                                           "mean_output_tokens": 200.0, "throughput_tok_s": 50.0,
                                           "at_decoding_requests": 8},
                             "natural EOS", {"burst": part}, {"burst": {"oracle/8": 0.1, "last/8": 0.05}})
    md = render_markdown(rep)
    assert md.startswith("# lenpred inside vLLM: `vllm serve` on one core, natural EOS\n\nCapacity 0.500 req/s")
    assert "## burst (all at once; draws [0, 1])" in md
    assert "| parked_sjf | 2.5 |" in md and "| parked_sjf | +50.0% [" in md
    assert "Ordering alone (mean JCT cut vs parked_fcfs, the same decode slots): parked_sjf +37.5% [" in md
    assert "| burst | +10.0% / +5.0% |" in md


def test_config_refuses_an_unknown_mode():
    with pytest.raises(LenpredError, match="unknown serving-benchmark mode.*valid: stock, observe"):
        ServingBenchConfig(modes="stock,fastest")
