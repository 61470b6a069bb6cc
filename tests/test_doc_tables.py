"""Tables the docs quote are rendered from the JSON that holds them: the docs carry the rendered text between
``<!-- rendered: NAME -->`` and ``<!-- /rendered -->``, and a test fails when the two differ."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rendered_block(doc: Path, name: str) -> str:
    m = re.search(rf"<!-- rendered: {name} -->\n(.*?)\n<!-- /rendered -->", doc.read_text(), re.S)
    assert m, f"{doc.name} has no rendered block '{name}'"
    return m.group(1).strip()


def test_the_trace_study_table_in_the_serving_guide_is_its_json():
    from lenpred.studies.queue_sim_render import TRACE_TABLE, summary_table

    rep = json.loads((ROOT / "results/scripts/serving/queue_trace/queue_simulation.json").read_text())
    want = summary_table(rep, *TRACE_TABLE).strip()
    assert rendered_block(ROOT / "docs/serving.md", "queue_trace") == want, f"render it anew:\n{want}"


def test_the_plugins_paired_leads_the_guide_quotes_are_its_json():
    rep = json.loads((ROOT / "results/scripts/serving/queue_trace/queue_simulation.json").read_text())
    cells = rep["studies"][0]["patterns"]
    text = " ".join((ROOT / "docs/serving.md").read_text().split())
    fmt = lambda t: f"{100 * t[0]:+.1f} % [{100 * t[1]:+.1f}, {100 * t[2]:+.1f}]"  # noqa: E731
    for rival in ("plugin:hrrn:W16:prompt_len", "plugin:boost:W16:prompt_len"):
        leads = [fmt(cells[p]["modes"]["plugin:srpt:W16:prompt_len"]["jct_cut_vs"][rival])
                 for p in ("burst8", "tracecodex0.9", "tracecodex1.1")]
        assert ", ".join(leads) in text, leads


TRACE_ENGINE = {"code, 1.1×": "results/scripts/serving/queue_trace_engine/code_x1.1/report.json",
                "code, 0.9×": "results/scripts/serving/queue_trace_engine/code_x0.9/report.json",
                "code, 1.1×, age threshold": "results/scripts/serving/queue_trace_engine/code_x1.1_wait/report.json",
                "code, 1.1×, `lenpred serve`": "results/scripts/serving/queue_trace_engine/code_x1.1_serve/report.json",
                "conv, 1.1×": "results/scripts/serving/queue_trace_engine/conv_x1.1/report.json"}
"""The engine's trace runs the serving guide's trace table shows, one store per trace and load."""


def test_the_engine_trace_table_in_the_serving_guide_is_its_json():
    from lenpred.studies.queue_render import engine_trace_table

    want = engine_trace_table({k: json.loads((ROOT / v).read_text()) for k, v in TRACE_ENGINE.items()}).strip()
    assert rendered_block(ROOT / "docs/serving.md", "queue_trace_engine") == want, f"render it anew:\n{want}"


def test_the_first_head_table_in_the_serving_guide_is_its_json():
    from lenpred.studies.first_head import summary_table

    rep = json.loads((ROOT / "results/scripts/first_head/first_head.json").read_text())
    want = summary_table(rep).strip()
    assert rendered_block(ROOT / "docs/serving.md", "first_head") == want, f"render it anew:\n{want}"
    shares = [f"{rep['burst'][f'first_{n}']['share_of_shipped'][0]:.2f}" for n in (250, 500)]
    text = " ".join((ROOT / "docs/serving.md").read_text().split())
    assert f"recovers {shares[0]} of the shipped head's scheduling gain, after 500 {shares[1]}" in text


def test_the_outside_source_table_in_the_serving_guide_is_its_json():
    from lenpred.studies.outside_source import later_half_table

    rep = json.loads((ROOT / "results/scripts/outside/outside.json").read_text())
    want = later_half_table(rep).strip()
    assert rendered_block(ROOT / "docs/serving.md", "outside_source") == want, f"render it anew:\n{want}"
    cov = rep["coverage"]
    text = " ".join((ROOT / "docs/serving.md").read_text().split())
    assert f"fixed margin covers {cov['fixed']['later']:.3f} of the later half" in text
    assert f"conformal inference over the stream {cov['aci']['later']:.3f}" in text


def test_the_head_switch_run_the_guide_quotes_is_its_json():
    rep = json.loads((ROOT / "results/scripts/serving/head_switch/head_switch.json").read_text())
    text = " ".join((ROOT / "docs/serving.md").read_text().split())
    assert rep["a"]["ok"] == rep["a"]["sent"] and rep["a_exit_code"] == 0 and rep["a_refused_new_request"]
    assert (f"answered after {rep['engine_b_ready_after_s']:.0f} s; A got SIGTERM with {rep['in_flight_at_sigterm']} "
            f"requests in flight") in text
    assert f"finished all {rep['a']['sent']} (none cut) and exited 0 after {rep['a_drain_s']:.0f} s" in text
    assert f"A's traffic log holds its {rep['traffic_log_rows']['a']} requests, B's its {rep['traffic_log_rows']['b']}" in text


def test_the_bench_serve_tables_in_the_serving_guide_are_their_json():
    from lenpred.studies.bench_serve import tables

    rep = json.loads((ROOT / "results/scripts/serving/bench_serve/report.json").read_text())
    want = tables(rep)
    assert rendered_block(ROOT / "docs/serving.md", "bench_serve") == want, f"render it anew:\n{want}"


def test_the_queue_share_tables_in_the_serving_guide_are_their_json():
    from lenpred.studies.queue_share import bins_markdown

    rep = json.loads((ROOT / "results/scripts/serving/queue_share/queue_share.json").read_text())
    for source in ("simulator", "engine"):
        want = bins_markdown(rep[source]["bins"]).strip()
        got = rendered_block(ROOT / "docs/serving.md", f"queue_share_{source}")
        assert got == want, f"render it anew:\n{want}"
