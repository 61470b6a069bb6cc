"""The proxy-latency study's pure parts (:mod:`lenpred.studies.proxy_latency`): quantiles, the per-concurrency
summary with hand-worked values, and the committed report re-rendered from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lenpred.studies.proxy_latency import ProxyLatencyReport, quantiles, render_markdown, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_quantiles_skip_none_and_summarize_subtracts_the_direct_ttft():
    assert quantiles([None, 1.0, 3.0], (50,)) == {"p50": 2.0}
    assert quantiles([None], (50, 90)) == {"p50": None, "p90": None}
    rows = {1: [{"ttft_s": 0.010, "predict_ms": 4.0, "added_s": 0.005},
                {"ttft_s": 0.030, "predict_ms": None, "added_s": 0.007}]}
    direct = {1: [{"ttft_s": 0.002}, {"ttft_s": 0.004}]}
    cell = summarize(rows, direct)[1]
    assert cell["n"] == 2 and cell["predict_ms"]["p50"] == 4.0
    assert cell["ttft_ms"]["p50"] == pytest.approx(20.0) and cell["direct_ttft_ms"]["p50"] == pytest.approx(3.0)
    assert cell["added_ttft_ms"]["p50"] == pytest.approx(17.0) and cell["added_ms"]["p50"] == pytest.approx(6.0)


@pytest.mark.parametrize("name", ["proxy_latency", "proxy_latency_rerun"])
def test_committed_report_renders_from_its_json(name):
    path = ROOT / "results" / "scripts" / "serve" / f"{name}.json"
    report = ProxyLatencyReport(**json.loads(path.read_text()))
    assert render_markdown(report) == path.with_suffix(".md").read_text()
