"""Every measured number the README quotes is checked against the JSON file that holds it.

One row of :data:`CHECKS` per number: the JSON file (relative to the repository root), the key path in it ("/"
between keys, list indices as digits; or a function of the loaded JSON), the formatter, and the README snippet with
``{}`` where the formatted value goes. In a snippet ``…`` stands for any text on the same line (a table row's other
cells). The README is read with each paragraph on one line and every table row on its own, so a snippet may cross
the README's line breaks but not a table row's end. A number that changes in its JSON fails here until the README
quotes the new value. Numbers the README quotes that come from no results file (the example output of
``lenpred predict``, set-up times) are not listed.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = "docs/serving.md"
"""Where the results narrative the README links to lives: a check with it as a fifth element reads that file."""

EVALUATE = "results/evaluate/results.json"
PAIRED = "results/scripts/paired_methods.json"
CARD = "benchmarks/smollm2-forelen/card.json"
PREDICT_SPEED = "results/scripts/predict_speed/predict_speed.json"
PREDICTOR = "src/lenpred/default_predictor/config.json"
STATE_CHECK = "results/scripts/serving/state_check.json"
OVERHEAD = "results/scripts/serving/overhead.json"
ADMITTED = "results/scripts/serving/benchmark/report.json"
QUEUE = "results/scripts/serving/queue/report.json"
GUARD = "results/scripts/serving/queue_guard/report.json"
TRACE = "results/scripts/serving/queue_trace/queue_simulation.json"
TRACE_CELL = "studies/0/patterns/{}/modes/{}"
TRACE_ENGINE = "results/scripts/serving/queue_trace_engine/code_x1.1/report.json"
TRACE_11 = "patterns/tracecodex1.1"
TRACE_ENGINE_09 = "results/scripts/serving/queue_trace_engine/code_x0.9/report.json"
REPEAT = "results/scripts/serving/queue_trace_engine/code_x1.1_repeat/runs.json"
RUNS_11 = "results/scripts/serving/queue_trace_engine/code_x1.1/runs.json"
RUNS_09 = "results/scripts/serving/queue_trace_engine/code_x0.9/runs.json"
WAIT = "results/scripts/serving/queue_trace_engine/code_x1.1_wait/report.json"
WAIT_RUNS = "results/scripts/serving/queue_trace_engine/code_x1.1_wait/runs.json"
REPEAT_REPORT = "results/scripts/serving/queue_trace_engine/code_x1.1_repeat/report.json"
CONV = "results/scripts/serving/queue_trace_engine/conv_x1.1/report.json"
CONV_CELL = "patterns/traceconvx1.1/modes/"
RUNS_CONV = "results/scripts/serving/queue_trace_engine/conv_x1.1/runs.json"
FRONTIER_CONV = "results/scripts/serving/queue_trace_engine/conv_x1.1/guard_frontier_traceconvx1.1.json"
SERVE_11 = "results/scripts/serving/queue_trace_engine/code_x1.1_serve/report.json"
CAPACITY_CONV = "results/scripts/serving/queue_trace_engine/capacity_conv/report.json"
SITTING = "results/scripts/serving/queue_trace_engine/code_x0.9_sitting/report.json"
SITTING_CELL = "patterns/tracecodex0.9/modes/"
CAPACITY_1206 = "results/scripts/serving/queue_trace_engine/capacity_1206/report.json"
CAPACITY_1206B = "results/scripts/serving/queue_trace_engine/capacity_1206b/report.json"
SHARE = "results/scripts/serving/queue_share/queue_share.json"
SITTING_11 = "results/scripts/serving/queue_trace_engine/code_x1.1_sitting/report.json"
BURST_1206 = "results/scripts/serving/queue_trace_engine/burst_overhead_1206/report.json"
BURST_1206_CELL = "patterns/burst8/modes/plugin"
COST_1206 = "results/scripts/serving/queue_trace_engine/burst_overhead_1206/cost/cost_vllm_1core_sampled.json"
SIM_COST = "results/scripts/serving/queue_guard/cost/cost_vllm_1core_sampled.json"
FRONTIER_11 = "results/scripts/serving/queue_trace_engine/code_x1.1/guard_frontier_tracecodex1.1.json"
FRONTIER_09 = "results/scripts/serving/queue_trace_engine/code_x0.9/guard_frontier_tracecodex0.9.json"
FRONTIER_09_SJF = "results/scripts/serving/queue_trace_engine/code_x0.9/guard_frontier_tracecodex0.9_sjf.json"
FRONTIER_WAIT = ("results/scripts/serving/queue_trace_engine/code_x1.1_wait/"
                 "guard_frontier_tracecodex1.1_plugin_wait.json")


def as_run(frontier: dict) -> dict:
    """A guard frontier's point for the run as it ran."""
    return next(pt for pt in frontier["points"] if pt["as_run"])


def at_T(t: float | None):  # noqa: N802 - T, the threshold's name in the docs
    """A key picking a guard frontier's re-simulated point at threshold ``t`` s (``None``: no threshold)."""
    return lambda frontier: next(pt for pt in frontier["points"] if not pt["as_run"] and pt["max_wait_s"] == t)


def _p99(runs: dict, key: str) -> float:
    """p99 JCT (s) of one run in a ``runs.json``."""
    import numpy as np

    return float(np.percentile([x["jct_s"] for x in runs["runs"][key]["results"]], 99))


def _and(items: list[str]) -> str:
    """``a, b and c``."""
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else items[0]


def _longest(runs: dict, key: str) -> tuple[int, float, int]:
    """``(output tokens, TTFT s, decode steps parked)`` of the request with the longest JCT in one run of a
    ``runs.json`` (the parked steps from the plug-in's log)."""
    top = max(runs["runs"][key]["results"], key=lambda x: x["jct_s"])
    log = next(x for x in runs["runs"][key]["plugin_log"] if re.search(rf"-q{top['request_id']}-", x["request_id"]))
    return top["completion_tokens"], top["ttft_s"], log["num_parked_steps"]


def PCT(x: float) -> str:  # noqa: N802 - a formatter like the others, named for what it prints
    """``+16.2 %`` from a fraction."""
    return f"{_signed(100 * x)} %"
FIRST_HEAD = "results/scripts/first_head/first_head.json"
BENCH_SERVE = "results/scripts/serving/bench_serve/runs.json"
BENCH_SERVE_REPORT = "results/scripts/serving/bench_serve/report.json"
BENCH_SERVE_STOCK = "results/scripts/serving/bench_serve/vllm_bench/stock.json"
BENCH_SERVE_REPEAT = "results/scripts/serving/bench_serve/stock_repeat/runs.json"
OUTSIDE = "results/scripts/outside/outside.json"
FIRST_HEAD_ENGINE = "results/scripts/serving/first_head_engine/{}/report.json"


def _signed(x: float, digits: int = 1) -> str:
    """``+1.3`` / ``−7.7`` (a minus sign, as the README prints it) / ``0.0``."""
    text = f"{abs(x):.{digits}f}"
    if float(text) == 0:
        return text
    return ("+" if x > 0 else "−") + text


def f0(x: float) -> str:
    return f"{x:.0f}"


def f1(x: float) -> str:
    return f"{x:.1f}"


def f2(x: float) -> str:
    return f"{x:.2f}"


def f3(x: float) -> str:
    return f"{x:.3f}"


def thousands(x: float) -> str:
    """``1,520``."""
    return f"{x:,.0f}"


def sci(x: float) -> str:
    """``1.4e-4`` (one decimal, no padded exponent)."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def ci(v) -> str:
    """``[178.4, 206.3]`` from ``[low, high]``."""
    return f"[{v[0]:.1f}, {v[1]:.1f}]"


def diff(v) -> str:
    """``−20.1 [−34.9, −6.6]`` from ``[point, low, high]``."""
    return f"{_signed(v[0])} [{_signed(v[1])}, {_signed(v[2])}]"


def pct(v) -> str:
    """``+18.0 % [+11.5, +24.2]`` from fractions ``[point, low, high]``."""
    return f"{_signed(100 * v[0])} % [{_signed(100 * v[1])}, {_signed(100 * v[2])}]"


def share(v) -> str:
    """``0.90 [0.66, 1.30]`` from ``[point, low, high]``."""
    return f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"


def ratio(v) -> str:
    """``1.28× [1.09, 1.71]`` from ``[point, low, high]``."""
    return f"{v[0]:.2f}× [{v[1]:.2f}, {v[2]:.2f}]"


def times(x: float) -> str:
    """``3.0×``."""
    return f"{x:.1f}×"


def seconds(ms: float) -> str:
    """``10.8`` seconds from milliseconds."""
    return f"{ms / 1000:.1f}"


def first(f):
    """Format the point estimate of ``[point, low, high]`` with ``f``."""
    return lambda v: f(v[0])


def bold_point(f):
    """``f``'s text with its point estimate in bold: ``**0.90** [0.66, 1.30]``."""
    def render(v):
        point, rest = f(v).split(" ", 1)
        return f"**{point}** {rest}"
    return render


def card_total(column: str):
    """The benchmark card's ``column`` summed over scenarios, split ``all``."""
    return lambda card: sum(row[column] for row in card if row["split"] == "all")


def burst_steps(pace: dict) -> str:
    """The guide's sentence on the second VM's burst: per draw, stock's and the plug-in's steps and wall ms per
    step."""
    def at(mode: str, d: str) -> str:
        return f"{pace[mode][d]['steps']:,.0f} at {pace[mode][d]['wall_ms_per_step']:.0f} ms"

    return (f"draw 0 {at('stock', '0').replace(' at', ' steps at')} under stock, {at('plugin', '0')} under the "
            f"plug-in; draw 1 {at('stock', '1')} against {at('plugin', '1')}")


def thin_from(runs: dict, key: str) -> float:
    """When fewer than 16 requests of a burst run were left: its (N − 16 + 1)-th finish, s after the burst."""
    jct = sorted(x["jct_s"] for x in runs["runs"][key]["results"])
    return jct[len(jct) - 16]


FIRST_VM, SECOND_VM = "df4df3a0-", "2729868e-"
"""The kernel boot ids' starts of the first and second VM the engine's trace slices ran on."""


def machine(by_boot: dict, start: str):
    """The value of the one key of ``by_boot`` (kernel boot ids) that starts with ``start``."""
    (value,) = [v for k, v in by_boot.items() if k.startswith(start)]
    return value


def burst_probes(runs: dict) -> list[str]:
    """The speed probes (ms per token) before the second VM's burst runs: plug-in, stock of draw 0, then of draw 1."""
    return [f"{1000 * runs['runs'][f'{d}/{m}/burst8']['speed_probe']['tpot_s']:.0f}"
            for d in (0, 1) for m in ("plugin", "stock")]


ENGINE = "results/scripts/serving/queue_trace_engine/"
SETTINGS_11 = ENGINE + "code_x1.1_settings/report.json"
SRPT_1206 = ENGINE + "code_x1.1_srpt_1206/report.json"
BURST_SETTINGS = ENGINE + "burst_settings_1206/report.json"
SECOND_VM_STORES = ("burst_overhead_1206", "burst_settings_1206", "code_x1.1_sitting", "code_x0.9_sitting",
                    "code_x1.1_settings", "code_x1.1_srpt_1206")
"""The second VM's engine stores with a stock and a plug-in run per draw."""


def pace_ratios() -> list[float]:
    """Per pair of runs on the second VM: the plug-in run's own pace over its stock run's (both fitted by the
    simulator of their own mode: ``pace_scale_per_draw`` / ``stock_pace_scale``)."""
    out = []
    for store in SECOND_VM_STORES:
        for p in _load(ENGINE + store + "/report.json")["patterns"].values():
            out += [f / p["stock_pace_scale"][d] for d, f in p["modes"]["plugin"]["pace_scale_per_draw"].items()]
    return out


def pace_gaps(p: dict) -> list[float]:
    """Per draw of one pattern's report, |plug-in pace / stock pace − 1|, in %."""
    return [100 * abs(f / p["stock_pace_scale"][d] - 1) for d, f in p["modes"]["plugin"]["pace_scale_per_draw"].items()]


def share_range(rep: dict, trace: str, load: float) -> str:
    """``7–80 %``: the queue shares of the simulated slices of ``trace`` at ``load``, lowest to highest."""
    x = [100 * r["queue_share"] for r in rep["simulator"]["slices"] if r["trace"] == trace and r["load"] == load]
    return f"{min(x):.0f}–{max(x):.0f} %"


# the README's table rows, by their first cell
MEDIAN = "| per-scenario median (floor) |"
TRAIL = "| TRAIL (best external baseline) |"
SSJF = "| SSJF-Reg |"
ESTP = "| ESTP |"
EGTP = "| EGTP |"
LAST = "| **last-token head, layer 15 (ships)** |"
STOCK = "| stock vLLM, FCFS |"
PROMPT_LEN = "| `--scheduling-policy priority` by prompt length (free baseline) |"
SERVE = "| `lenpred serve` (the shipped head, its forward on a second core) in front of priority |"
PLUGIN = "| **the plug-in** (the engine's own prefill state, no second pass; the command above) |"
PROMPT_ORACLE = "| priority by the prompt oracle (the best any prompt-only predictor can do) |"
ORACLE = "| priority by the recorded length (oracle; draw 0 only) |"

BURST = "patterns/burst8/modes"
SUSTAINED = "patterns/gamma1x1.1/modes"
MAE = "results/{}/overall"

CHECKS = [
    # the benchmark
    (CARD, card_total("prompts"), thousands, "({} real prompts,"),
    (CARD, card_total("responses"), thousands, "{} sampled responses of SmolLM2-135M-Instruct"),
    (EVALUATE, "num_samples/test", thousands, "{} test samples"),
    # the MAE table
    (EVALUATE, MAE.format("scenario_median") + "/mae", f1, MEDIAN + " {} |"),
    (EVALUATE, MAE.format("scenario_median") + "/mae_ci", ci, MEDIAN + " … | {} |"),
    (EVALUATE, MAE.format("trail") + "/mae", f1, TRAIL + " {} |"),
    (EVALUATE, MAE.format("trail") + "/mae_ci", ci, TRAIL + " … | {} |"),
    (EVALUATE, MAE.format("trail") + "/diff_floor", diff, TRAIL + " … | {} |"),
    (EVALUATE, MAE.format("ssjf_reg") + "/mae", f1, SSJF + " {} |"),
    (EVALUATE, MAE.format("ssjf_reg") + "/mae_ci", ci, SSJF + " … | {} |"),
    (EVALUATE, MAE.format("ssjf_reg") + "/diff_floor", diff, SSJF + " … | {} |"),
    (EVALUATE, MAE.format("estp") + "/mae", f1, ESTP + " {} |"),
    (EVALUATE, MAE.format("estp") + "/mae_ci", ci, ESTP + " … | {} |"),
    (EVALUATE, MAE.format("estp") + "/diff_floor", diff, ESTP + " … | {} |"),
    (EVALUATE, MAE.format("egtp") + "/mae", f1, EGTP + " {} |"),
    (EVALUATE, MAE.format("egtp") + "/mae_ci", ci, EGTP + " … | {} |"),
    (EVALUATE, MAE.format("egtp") + "/diff_floor", diff, EGTP + " … | {} (within noise) |"),
    (EVALUATE, MAE.format("last") + "/mae", f1, LAST + " **{}** |"),
    (EVALUATE, MAE.format("last") + "/mae_ci", ci, LAST + " … | {} |"),
    (EVALUATE, MAE.format("last") + "/diff_floor", diff, LAST + " … | **{}** |"),
    # the shipped head paired with the others
    (PAIRED, "pairs/last - estp/overall", diff, "it beats ESTP ({})"),
    (PAIRED, "pairs/last - ssjf_reg/overall", diff, "and SSJF-Reg ({})"),
    (EVALUATE, "results/last/overall/diff_best_external", diff, "(the table's three seeds: {} overall,"),
    (EVALUATE, "results/last/longseq/diff_best_external", diff, "overall, {} long-form)"),
    (OVERHEAD, "ratio_of_medians", f3, "wall time {}× stock vLLM's"),
    # predict
    (PREDICT_SPEED, "warm_in_process_vicuna_32/ratio_before_over_after/median", times, "{} faster warm on 32 prompts"),
    (PREDICT_SPEED, "warm_in_process_vicuna_32/before_ms/median", seconds, "on 32 prompts ({} →"),
    (PREDICT_SPEED, "warm_in_process_vicuna_32/after_ms/median", seconds, "→ {} s, one thread)"),
    (PREDICT_SPEED, "whole_process_vicuna_32/ratio_before_over_after/median", times, "whole 32-prompt command {} faster"),
    (PREDICT_SPEED, "whole_process_vicuna_32/before_ms/median", seconds, "faster ({} →"),
    (PREDICT_SPEED, "whole_process_vicuna_32/after_ms/median", seconds, "→ {} s, mostly loading)"),
    (PREDICTOR, "interval_margin", f1, "the calibrated margin, {} tokens"),
    # the plug-in
    (STATE_CHECK, "max_abs_diff", sci, "reproduces transformers' states within {}."),
    # where everything is admitted
    (ADMITTED, "settings/num_requests", f0, "Where everything is admitted at once ({} requests under"),
    (ADMITTED, "settings/max_num_seqs", f0, "requests under `--max-num-seqs {}`) no order wins"),
    # the burst table
    (QUEUE, "patterns/burst8/num_requests", f0, "submissions: {} test-split requests at once", GUIDE),
    (QUEUE, "settings/decode_bound", f0, "requests at once, D = {}, ", GUIDE),
    (QUEUE, "settings/draws", f0, "at once, D = 16, {} draws;", GUIDE),
    (QUEUE, BURST + "/stock/mean_jct_s", f1, STOCK + " {} |", GUIDE),
    (QUEUE, BURST + "/stock/p99_jct_s", f0, STOCK + " … | {} |", GUIDE),
    (QUEUE, BURST + "/stock/throughput_tok_s", f1, STOCK + " … | {} |", GUIDE),
    (QUEUE, BURST + "/priority_prompt_len/mean_jct_s", f1, PROMPT_LEN + " {} |", GUIDE),
    (QUEUE, BURST + "/priority_prompt_len/jct_cut_vs_stock", pct, PROMPT_LEN + " … | {} |", GUIDE),
    (QUEUE, BURST + "/priority_prompt_len/share_of_priority_prompt_oracle", share, PROMPT_LEN + " … | {} |", GUIDE),
    (QUEUE, BURST + "/priority_prompt_len/p99_jct_s", f0, PROMPT_LEN + " … | {} (", GUIDE),
    (QUEUE, BURST + "/priority_prompt_len/p99_jct_ratio_vs_stock", first(f2), PROMPT_LEN + " … ({}) |", GUIDE),
    (QUEUE, BURST + "/priority_prompt_len/throughput_tok_s", f1, PROMPT_LEN + " … | {} |", GUIDE),
    (QUEUE, BURST + "/priority_lenpred/mean_jct_s", f1, SERVE + " {} |", GUIDE),
    (QUEUE, BURST + "/priority_lenpred/jct_cut_vs_stock", pct, SERVE + " … | {} |", GUIDE),
    (QUEUE, BURST + "/priority_lenpred/share_of_priority_prompt_oracle", share, SERVE + " … | {} |", GUIDE),
    (QUEUE, BURST + "/priority_lenpred/p99_jct_s", f0, SERVE + " … | {} (", GUIDE),
    (QUEUE, BURST + "/priority_lenpred/p99_jct_ratio_vs_stock", first(f2), SERVE + " … ({}) |", GUIDE),
    (QUEUE, BURST + "/priority_lenpred/throughput_tok_s", f1, SERVE + " … | {} |", GUIDE),
    (QUEUE, BURST + "/plugin/mean_jct_s", f1, PLUGIN + " {} |", GUIDE),
    (QUEUE, BURST + "/plugin/jct_cut_vs_stock", pct, PLUGIN + " … | **{}** |", GUIDE),
    (QUEUE, BURST + "/plugin/share_of_priority_prompt_oracle", bold_point(share), PLUGIN + " … | {} |", GUIDE),
    (QUEUE, BURST + "/plugin/p99_jct_s", f0, PLUGIN + " … | {} (", GUIDE),
    (QUEUE, BURST + "/plugin/p99_jct_ratio_vs_stock", first(f2), PLUGIN + " … ({}) |", GUIDE),
    (QUEUE, BURST + "/plugin/throughput_tok_s", f1, PLUGIN + " … | {} |", GUIDE),
    (QUEUE, BURST + "/priority_prompt_oracle/mean_jct_s", f1, PROMPT_ORACLE + " {} |", GUIDE),
    (QUEUE, BURST + "/priority_prompt_oracle/jct_cut_vs_stock", pct, PROMPT_ORACLE + " … | {} |", GUIDE),
    (QUEUE, BURST + "/priority_prompt_oracle/p99_jct_s", f0, PROMPT_ORACLE + " … | {} (", GUIDE),
    (QUEUE, BURST + "/priority_prompt_oracle/p99_jct_ratio_vs_stock", first(f2), PROMPT_ORACLE + " … ({}) |", GUIDE),
    (QUEUE, BURST + "/priority_prompt_oracle/throughput_tok_s", f1, PROMPT_ORACLE + " … | {} |", GUIDE),
    (QUEUE, "patterns/burst8/fewer_draws/priority_oracle/mean_jct_s", f1, ORACLE + " {} |", GUIDE),
    (QUEUE, "patterns/burst8/fewer_draws/priority_oracle/jct_cut_vs_stock", pct, ORACLE + " … | {} |", GUIDE),
    (QUEUE, "patterns/burst8/fewer_draws/priority_oracle/p99_jct_s", f0, ORACLE + " … | {} (", GUIDE),
    (QUEUE, "patterns/burst8/fewer_draws/priority_oracle/p99_jct_ratio_vs_stock", first(f2), ORACLE + " … ({}) |", GUIDE),
    (QUEUE, "patterns/burst8/fewer_draws/priority_oracle/throughput_tok_s", f1, ORACLE + " … | {} |", GUIDE),
    (QUEUE, "patterns/burst8/best_lenpred/jct_cut_vs/priority_prompt_len", pct,
     "The plug-in beats prompt-length priority by {};", GUIDE),
    (QUEUE, BURST + "/plugin/jct_cut_vs_stock", pct, "128 requests at once): the plug-in cuts mean JCT by {} with"),
    (QUEUE, BURST + "/plugin/p99_jct_ratio_vs_stock", first(f2), "with p99 {}× stock's, 0."),
    (QUEUE, BURST + "/plugin/share_of_priority_prompt_oracle", first(f2), "stock's, {} of the prompt oracle's gain"),
    (QUEUE, "patterns/burst8/best_lenpred/jct_cut_vs/priority_lenpred", pct, "its lead over `lenpred serve` ({})", GUIDE),
    # sustained load
    (GUARD, "settings/draws", f0, "at 1.1× the engine's stock capacity; {} draws on one machine;", GUIDE),
    (GUARD, SUSTAINED + "/priority_lenpred/jct_cut_vs_stock", pct, "`lenpred serve` cuts mean JCT by {} (ahead", GUIDE),
    (GUARD, "patterns/gamma1x1.1/best_lenpred/jct_cut_vs/priority_prompt_len", pct,
     "(ahead of prompt-length priority by {})", GUIDE),
    (GUARD, SUSTAINED + "/priority_lenpred_guard/jct_cut_vs_stock", pct, "(`--aging-tokens-per-s 4`) by {},", GUIDE),
    (GUARD, SUSTAINED + "/priority_lenpred/p99_jct_ratio_vs_stock", ratio, "but its p99 is {} and the guarded", GUIDE),
    (GUARD, SUSTAINED + "/priority_lenpred_guard/p99_jct_ratio_vs_stock", ratio, "the guarded one's {} stock's.", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len") + "/jct_cut_vs_stock", pct,
     "the plug-in cuts mean JCT by {} at 1.1× load", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len") + "/p99_ratio_vs_stock", f2,
     "at 1.1× load with p99 {}× stock's", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len@8") + "/jct_cut_vs_stock",
     first(PCT), "({} with the starvation guard at k = 8", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len@8") + "/p99_ratio_vs_stock", f2,
     "k = 8, p99 {}×)", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex0.9", "plugin:srpt:W16:prompt_len") + "/jct_cut_vs_stock", pct,
     "and by {} at 0.9× with p99", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex0.9", "plugin:srpt:W16:prompt_len") + "/p99_ratio_vs_stock", f2,
     "at 0.9× with p99 {}×", GUIDE),
    (TRACE, TRACE_CELL.format("traceconvx0.9", "plugin:srpt:W16:prompt_len") + "/jct_cut_vs_stock",
     first(PCT), "it gains {} below capacity", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:boost_predicted:W16:prompt_len:g0.01") + "/jct_cut_vs_stock", first(PCT),
     "at 1.1× γ = 0.01/s gives {} with", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:boost_predicted:W16:prompt_len:g0.01") + "/p99_ratio_vs_stock", f2,
     "γ = 0.01/s gives +9.8 % with p99 {}×", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len@4") + "/jct_cut_vs_stock", first(PCT),
     "the guard at 4 tokens/s gives {} with 1.04×", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len@4") + "/p99_ratio_vs_stock", f2,
     "the guard at 4 tokens/s gives +10.4 % with {}×", GUIDE),
    (TRACE, TRACE_CELL.format("traceconvx1.1", "plugin:boost_predicted:W16:prompt_len:g0.005") + "/jct_cut_vs_stock", first(PCT),
     "on conv at 1.1× γ = 0.005/s gives {} with", GUIDE),
    (TRACE, TRACE_CELL.format("traceconvx1.1", "plugin:boost_predicted:W16:prompt_len:g0.005") + "/p99_ratio_vs_stock", f2,
     "γ = 0.005/s gives +10.0 % with {}×", GUIDE),
    (TRACE, TRACE_CELL.format("traceconvx1.1", "plugin:srpt:W16:prompt_len@4") + "/jct_cut_vs_stock", first(PCT),
     "the guard {} with 1.38×", GUIDE),
    (TRACE, TRACE_CELL.format("traceconvx1.1", "plugin:srpt:W16:prompt_len@4") + "/p99_ratio_vs_stock", f2,
     "the guard +10.3 % with {}×", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex0.9", "plugin:boost_predicted:W16:prompt_len:g0.002") + "/jct_cut_vs_stock", first(PCT),
     "on code at 0.9× its best, {}", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len:w200") + "/jct_cut_vs_stock", pct,
     "on code at 1.1× T = 200 s keeps {} with", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len:w200") + "/p99_ratio_vs_stock", f2,
     "T = 200 s keeps +11.1 % [+7.9, +14.1] with p99 {}×", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len:w250") + "/p99_ratio_vs_stock",
     lambda v: "keeps" if v > 1.05 else "BREAKS", "the largest in the table that {} code's p99 within", GUIDE),
    (TRACE, TRACE_CELL.format("gamma3x1.1", "plugin:srpt:W16:prompt_len:w150") + "/jct_cut_vs_stock", first(PCT),
     "CV 3 at 1.1× T = 150 s keeps {} with", GUIDE),
    (TRACE, TRACE_CELL.format("gamma3x1.1", "plugin:srpt:W16:prompt_len:w150") + "/p99_ratio_vs_stock", f2,
     "T = 150 s keeps +10.7 % with {}×", GUIDE),
    (TRACE, TRACE_CELL.format("gamma3x1.1", "plugin:srpt:W16:prompt_len@8") + "/jct_cut_vs_stock", first(PCT),
     "8 tokens/s for 1.04×, at {})", GUIDE),
    (TRACE, TRACE_CELL.format("gamma3x1.1", "plugin:srpt:W16:prompt_len@8") + "/p99_ratio_vs_stock", f2,
     "the guard needs 8 tokens/s for {}×", GUIDE),
    (TRACE, TRACE_CELL.format("gamma1x1.1", "plugin:srpt:W16:prompt_len:w100") + "/jct_cut_vs_stock", first(PCT),
     "T = 100 s {} with 1.29×", GUIDE),
    (TRACE, TRACE_CELL.format("gamma1x1.1", "plugin:srpt:W16:prompt_len:w100") + "/p99_ratio_vs_stock", f2,
     "T = 100 s +7.8 % with {}×", GUIDE),
    (TRACE, TRACE_CELL.format("gamma1x1.1", "plugin:srpt:W16:prompt_len:w50") + "/jct_cut_vs_stock", first(PCT),
     "T = 50 s {} with 1.05×", GUIDE),
    (TRACE, TRACE_CELL.format("gamma1x1.1", "plugin:srpt:W16:prompt_len:w50") + "/p99_ratio_vs_stock", f2,
     "T = 50 s +1.4 % with {}×", GUIDE),
    (TRACE_ENGINE, lambda r: len(r["patterns"]["tracecodex1.1"]["draws"]), f0, "At 1.1× load, over {} slices", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len:w200") + "/jct_cut_vs_stock", first(PCT),
     "ahead of the rest), which keeps {} with p99", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len:w200") + "/p99_ratio_vs_stock", f2,
     "which keeps +11.1 % with p99 {}× over the simulator's own", GUIDE),
    (CONV, "regime/capacity/capacity_req_s", f3, "--capacity-req-s {}`,", GUIDE),
    (CONV, CONV_CELL + "plugin/jct_cut_vs_stock", pct, "The plug-in cuts mean JCT by {} with p99 1.98×", GUIDE),
    (CONV, CONV_CELL + "plugin/p99_jct_ratio_vs_stock", ratio, "+21.7] with p99 {} stock's; per slice", GUIDE),
    (CONV, CONV_CELL + "plugin/measured_cut_vs_stock_per_draw", lambda v: f"per slice {PCT(v[0])} and {PCT(v[1])}",
     "stock's; {}, p99", GUIDE),
    (RUNS_CONV, lambda r: [_p99(r, f"{d}/plugin/traceconvx1.1") / _p99(r, f"{d}/stock/traceconvx1.1") for d in (0, 1)],
     lambda v: f"p99 {v[0]:.2f}× and {v[1]:.2f}×", "+17.0 %, {}, where", GUIDE),
    (RUNS_CONV, lambda r: [sum(x["ttft_s"] for x in r["runs"][f"{d}/stock/traceconvx1.1"]["results"])
                           / len(r["runs"][f"{d}/stock/traceconvx1.1"]["results"]) for d in (0, 1)],
     lambda v: f"{v[0]:.1f} s and {v[1]:.1f} s", "stock's mean TTFT was {}: the slice", GUIDE),
    (CONV, CONV_CELL + "priority_prompt_len/jct_cut_vs_stock", pct, "Prompt-length priority gains {} with p99", GUIDE),
    (CONV, CONV_CELL + "priority_prompt_len/p99_jct_ratio_vs_stock", first(f2), "+8.9] with p99 {}×. This", GUIDE),
    (CONV, CONV_CELL + "plugin/simulated_over_measured_at_stock_pace", f2, "plug-in's mean JCT at {} of", GUIDE),
    (CONV, CONV_CELL + "priority_prompt_len/simulated_over_measured_at_stock_pace", f2,
     "prompt-length priority's at {}; `lenpred whatif`", GUIDE),
    (CONV, lambda r: [w["error_pp"] for w in r["patterns"]["traceconvx1.1"]["whatif"]],
     lambda v: f"{_signed(v[0])} and {_signed(v[1])} points", "errs by {}. The age", GUIDE),
    (FRONTIER_CONV, as_run, lambda pt: f"{PCT(pt['cut'])} with {pt['p99_ratio']:.2f}×", "simulated at {}):", GUIDE),
    (FRONTIER_CONV, at_T(50), lambda pt: f"T = 50 s keeps {PCT(pt['cut'])} with {pt['p99_ratio']:.2f}×",
     "{}, T = 100 s", GUIDE),
    (FRONTIER_CONV, at_T(100), lambda pt: f"T = 100 s {PCT(pt['cut'])} with {pt['p99_ratio']:.2f}×", "1.10×, {};",
     GUIDE),
    # the README's summary of the engine's trace runs (the table and the narrative are in the guide)
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin/jct_cut_vs_stock", pct, "on the bursty code trace by {} at 1.1×"),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/plugin/jct_cut_vs_stock", pct, "(5 slices) and by {} at 0.9×"),
    (TRACE_ENGINE_09, lambda r: len(r["patterns"]["tracecodex0.9"]["draws"]), str, "] at 0.9× ({} slices), and on"),
    (CONV, CONV_CELL + "plugin/jct_cut_vs_stock", pct, "on the Poisson-like conv trace by {} at 1.1× (2 slices)"),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin/p99_jct_ratio_vs_stock", first(f2), "free**: p99 JCT is {}×, 1.42×"),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/plugin/p99_jct_ratio_vs_stock", first(f2), "is 1.18×, {}× and"),
    (CONV, CONV_CELL + "plugin/p99_jct_ratio_vs_stock", first(f2), "1.42× and {}× stock's. The age threshold"),
    # lenpred serve on a second 1.1x slice, beside its own stock run
    (SERVE_11, "patterns/tracecodex1.1/modes/priority_lenpred/jct_cut_vs_stock", pct, "+28.1] on slice 4 and {} on slice 0", GUIDE),
    (SERVE_11, "patterns/tracecodex1.1/modes/priority_lenpred/p99_jct_ratio_vs_stock", first(f2), "with p99 1.32× and {}×.", GUIDE),
    (TRACE_ENGINE, "patterns/tracecodex1.1/fewer_draws/priority_lenpred/jct_cut_vs_stock", pct,
     "cut mean JCT at 1.1× by {} on slice 4", GUIDE),
    (SERVE_11, "patterns/tracecodex1.1/modes/stock/mean_jct_s", f1, "fresh stock run (`code_x1.1_serve/`: stock {} s,",
     GUIDE),
    (SERVE_11, "patterns/tracecodex1.1/modes/priority_lenpred/jct_cut_vs_stock", pct, "sittings), by {} with p99", GUIDE),
    (SERVE_11, "patterns/tracecodex1.1/modes/priority_lenpred/p99_jct_ratio_vs_stock", ratio, "+26.2] with p99 {} and",
     GUIDE),
    (SERVE_11, "patterns/tracecodex1.1/modes/priority_lenpred/throughput_ratio_vs_stock", f3, "and throughput {}×",
     GUIDE),
    (SERVE_11, "patterns/tracecodex1.1/modes/priority_lenpred/simulated_over_measured_at_stock_pace", f2,
     "the simulator at stock's pace {} of the measured", GUIDE),
    # the capacity re-measured before the conv runs, and the load the 0.9x code slices ran at against it
    (CAPACITY_CONV, "patterns/burst8/stock_capacity_req_s/0", f3, "conv: {}, measured just before"),
    (TRACE_ENGINE_09, "regime/capacity/capacity_req_s", f3, "(code: {} req/s, measured once"),
    (CAPACITY_CONV, lambda r: (_load(RUNS_09)["runs"]["0/stock/tracecodex0.9"]["settings"]["rate_req_s"]
                               / r["patterns"]["burst8"]["stock_capacity_req_s"][0]), f2,
     "a burst measures 0.383 req/s, so those slices ran near {}× of it", GUIDE),
    (CONV, lambda r: len(r["patterns"]["traceconvx1.1"]["draws"]), f0, "conv trace at 1.1×** ({} slices)", GUIDE),
    (CONV, CONV_CELL + "plugin/jct_cut_vs_stock", pct, "the plug-in cuts mean JCT by {} and leads prompt-length", GUIDE),
    (CONV, CONV_CELL + "priority_prompt_len/jct_cut_vs_stock", pct, "leads prompt-length priority ({}) by", GUIDE),
    (CONV, "patterns/traceconvx1.1/best_lenpred/jct_cut_vs/priority_prompt_len", pct, "+8.9]) by {}, within noise", GUIDE),
    (CONV, CONV_CELL + "plugin/p99_jct_ratio_vs_stock", ratio, "but p99 JCT is {} stock's: under sustained", GUIDE),
    (TRACE, TRACE_CELL.format("traceconvx1.1", "plugin:srpt:W16:prompt_len") + "/jct_cut_vs_stock", first(PCT),
     "predicted for this trace ({}, p99", GUIDE),
    (TRACE, TRACE_CELL.format("traceconvx1.1", "plugin:srpt:W16:prompt_len") + "/p99_ratio_vs_stock", f2,
     "(+14.8 %, p99 {}× over its 10 slices)", GUIDE),
    (CAPACITY_CONV, "patterns/burst8/stock_capacity_req_s/0", f3, "just before the conv runs: {} req/s", GUIDE),
    (CAPACITY_CONV, "patterns/burst8/stock_pace_scale/0", f2, "stock's burst at {}× the cost model's", GUIDE),
    (TRACE_ENGINE_09, lambda r: sorted(r["patterns"]["tracecodex0.9"]["stock_pace_scale"].values()),
     lambda v: f"{v[0]:.2f}–{v[-1]:.2f}", "sittings ran at stock paces {}, so", GUIDE),
    (CAPACITY_CONV, lambda r: (_load(RUNS_09)["runs"]["0/stock/tracecodex0.9"]["settings"]["rate_req_s"],
                               r["patterns"]["burst8"]["stock_capacity_req_s"][0]),
     lambda v: f"near {v[0] / v[1]:.2f}× ({v[0]:.3f} / {v[1]:.3f} req/s)", "those slices ran {} of the", GUIDE),
    # the age threshold's frontier on the engine's slices (scripts/guard_frontier.py), points picked by threshold
    (FRONTIER_11, as_run, lambda pt: f"{PCT(pt['cut'])} with p99 {pt['p99_ratio']:.2f}×",
     "the plug-in as it ran {}, measured", GUIDE),
    (FRONTIER_11, "measured", lambda m: f"measured {PCT(m['cut'])} and {m['p99_ratio']:.2f}×", "p99 1.20×, {}), the", GUIDE),
    (FRONTIER_11, at_T(200), lambda pt: f"T = 200 s keeps {PCT(pt['cut'])} with p99 {pt['p99_ratio']:.2f}×",
     "the same {} (`scripts/guard_frontier.py`)", GUIDE),
    (FRONTIER_WAIT, lambda r: at_T(200)(r)["cut"] - r["measured"]["cut"], lambda x: f"{100 * x:.1f} points",
     "said +11.0 % with 1.05×, {} more hopeful", GUIDE),
    (FRONTIER_WAIT, as_run, lambda pt: f"said {PCT(pt['cut'])} with {pt['p99_ratio']:.2f}×",
     "at each stock run's pace, {}, 0.7 points", GUIDE),
    (FRONTIER_WAIT, lambda r: r["measured"]["p99_ratio"] - as_run(r)["p99_ratio"], f2, "and {} lower on the tail", GUIDE),
    (FRONTIER_09, at_T(80), lambda pt: f"T = 80 s: {PCT(pt['cut'])}, {pt['p99_ratio']:.2f}×", "6 % and 1.05× ({}).", GUIDE),
    (FRONTIER_11, as_run, lambda pt: f"{PCT(pt['cut'])} with p99 {pt['p99_ratio']:.2f}× at 1.1×",
     "the plug-in as it ran comes out at {}", GUIDE),
    (FRONTIER_11, "measured", lambda m: f"(measured {PCT(m['cut'])}, {m['p99_ratio']:.2f}×)", "at 1.1× {} and", GUIDE),
    (FRONTIER_09, as_run, lambda pt: f"{PCT(pt['cut'])} with {pt['p99_ratio']:.2f}× at 0.9×", "1.18×) and {}", GUIDE),
    (FRONTIER_09, "measured", lambda m: f"(measured {PCT(m['cut'])}, {m['p99_ratio']:.2f}×)", "at 0.9× {}.", GUIDE),
    (FRONTIER_11, at_T(200), lambda pt: f"keeps {PCT(pt['cut'])} with p99 {pt['p99_ratio']:.2f}× over the 5",
     "10 slices, {} engine slices", GUIDE),
    (FRONTIER_11, at_T(150), lambda pt: f"T = 150 s {PCT(pt['cut'])}, {pt['p99_ratio']:.2f}×", "slices ({};", GUIDE),
    (FRONTIER_11, at_T(250), lambda pt: f"250 s {PCT(pt['cut'])}, {pt['p99_ratio']:.2f}×", "1.03×; {}; 300 s", GUIDE),
    (FRONTIER_11, at_T(300), lambda pt: f"300 s {PCT(pt['cut'])}, {pt['p99_ratio']:.2f}×", "1.03×; {}):", GUIDE),
    (FRONTIER_WAIT, at_T(200), lambda pt: f"said {PCT(pt['cut'])} with p99 {pt['p99_ratio']:.2f}×",
     "the same simulator {} and", GUIDE),
    (FRONTIER_WAIT, "measured", lambda m: f"measured {PCT(m['cut'])} with {m['p99_ratio']:.2f}×", "the engine {}:",
     GUIDE),
    (FRONTIER_WAIT, at_T(200), lambda pt: "(simulated " + _and([f"{x:.2f}×" for x in pt["p99_ratio_per_draw"]]),
     "the tails agree {}, measured", GUIDE),
    (FRONTIER_WAIT, "measured", lambda m: "measured " + _and([f"{x:.2f}×" for x in m["p99_ratio_per_draw"]]) + ")",
     "1.17×, {}, so", GUIDE),
    (FRONTIER_11, lambda r: at_T(200)(r)["p99_ratio_per_draw"][2], f2, "T = 200 s gives {}× where the", GUIDE),
    (FRONTIER_WAIT, lambda r: as_run(r)["p99_ratio_per_draw"][2], f2, "`plugin_wait` run gives {}×.", GUIDE),
    (FRONTIER_11, at_T(200), lambda pt: ", ".join(f"{x:.2f}×" for x in pt["p99_ratio_per_draw"][:-1])
     + f" and {pt['p99_ratio_per_draw'][-1]:.2f}×", "re-simulated at T = 200 s run {} of stock's", GUIDE),
    (FRONTIER_09, at_T(70), lambda pt: f"T = 70 s {PCT(pt['cut'])} with {pt['p99_ratio']:.2f}×", "1.05×: {}, 80 s",
     GUIDE),
    (FRONTIER_09, at_T(80), lambda pt: f"80 s {PCT(pt['cut'])} with {pt['p99_ratio']:.2f}×", "1.03×, {}, 100 s",
     GUIDE),
    (FRONTIER_09, at_T(100), lambda pt: f"100 s {PCT(pt['cut'])} with {pt['p99_ratio']:.2f}×", "1.08×, {}. On",
     GUIDE),
    (FRONTIER_09, lambda r: [x for pt in r["points"][1:] for x in pt["p99_ratio_per_draw"][1:3]],
     lambda v: f"{min(v):.2f}–{max(v):.2f}×", "the p99 stays at {} at every T down to", GUIDE),
    (FRONTIER_09, lambda r: min(pt["max_wait_s"] for pt in r["points"][1:]), f0, "at every T down to {} s:", GUIDE),
    (FRONTIER_09_SJF, at_T(None), lambda pt: "{:.2f}× and {:.2f}×".format(*pt["p99_ratio_per_draw"][1:3]),
     "keeps those two slices at {} but", GUIDE),
    (FRONTIER_09_SJF, at_T(None), lambda pt: f"{PCT(pt['cut'])} with {pt['p99_ratio']:.2f}× without a",
     "`guard_frontier_tracecodex0.9_sjf.md`: {}", GUIDE),
    (FRONTIER_09_SJF, at_T(80), lambda pt: f"{PCT(pt['cut'])} with {pt['p99_ratio']:.2f}× at T = 80 s",
     "threshold, {}):", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/jct_cut_vs_stock", pct, "slices, measured {} with p99", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/jct_cut_vs_stock", pct, "(`max_wait_s` 200 s) keeps {} at 1.1×"),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/p99_jct_ratio_vs_stock",
     lambda t: f"{t[0]:.2f}× [{t[1]:.2f}, {t[2]:.2f}]", "at 1.1× with p99 {} (5 slices)"),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/p99_jct_ratio_vs_stock",
     lambda t: f"{t[0]:.2f}× [{t[1]:.2f}, {t[2]:.2f}]", "+16.5] with p99 {} on 5 slices", GUIDE),
    (WAIT, lambda r: len(r["patterns"]["tracecodex1.1"]["draws"]), f0, "1.30] on {} slices, each beside", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/throughput_ratio_vs_stock", lambda x: f"{x:.3f}",
     "(throughput {}×)", GUIDE),
    (TRACE, TRACE_CELL.format("tracecodex1.1", "plugin:srpt:W16:prompt_len:w200") + "/jct_cut_vs_stock", first(PCT),
     "simulator's 10 slices, where it keeps {} with p99", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/jct_cut_vs_stock", pct,
     "one sitting (`code_x1.1_wait/`): {} with p99", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/p99_jct_ratio_vs_stock",
     lambda t: f"{t[0]:.2f}× [{t[1]:.2f}, {t[2]:.2f}]", "+16.5] with p99 {} (per", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/measured_cut_vs_stock_per_draw",
     lambda v: "per slice " + _and([PCT(x) for x in v]), "({}; p99", GUIDE),
    (WAIT_RUNS, lambda r: [_p99(r, f"{d}/plugin_wait/tracecodex1.1") / _p99(r, f"{d}/stock/tracecodex1.1")
                           for d in range(5)], lambda v: "p99 " + _and([f"{x:.2f}×" for x in v]), "+15.1 %; {})", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/simulated_cut_vs_stock", PCT,
     "the simulator at one pace says {} with", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/simulated_p99_ratio_vs_stock", f2,
     "at one pace says +9.6 % with {}×. No slice", GUIDE),
    (WAIT_RUNS, lambda r: _longest(r, "0/plugin_wait/tracecodex1.1"),
     lambda x: f"{x[0]:,} tokens, {x[1]:.1f} s to its first token, {x[2]:,} decode steps parked",
     "slice 0's longest: {})", GUIDE),
    (WAIT_RUNS, lambda r: [sum(x["jct_s"] for x in r["runs"][f"{d}/stock/tracecodex1.1"]["results"]) / 218
                           for d in (1, 0)], lambda v: f"(stock's mean JCT {v[0]:.1f} s against {v[1]:.1f} s on slice 0",
     "Slice 1 is a light slice {}", GUIDE),
    (WAIT_RUNS, lambda r: _p99(r, "1/stock/tracecodex1.1"), f0, "stock's p99 there was {} s,", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/stock/simulated_p99_over_measured", f2,
     "(its p99 over the measured: {} for stock", GUIDE),
    (WAIT, "patterns/tracecodex1.1/modes/plugin_wait/simulated_p99_over_measured", f2,
     "for stock, {} under the threshold)", GUIDE),
    (WAIT, lambda r: max(abs(w["error_pp"]) for w in r["patterns"]["tracecodex1.1"]["whatif"]), f1,
     "the five runs' logs was within {} points", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin_guard/jct_cut_vs_stock", first(PCT), "plug-in's measured {} is mostly drift", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin/jct_cut_vs_stock", pct, "the plug-in cuts mean JCT by {} and", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/priority_prompt_len/jct_cut_vs_stock", pct,
     "ahead of prompt-length priority's {} (paired lead", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/priority_prompt_len/jct_cut_vs_stock", pct,
     "ahead of prompt-length priority's {} (its paired lead", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/best_lenpred/jct_cut_vs/priority_prompt_len", pct, "(paired lead {});", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/best_lenpred/jct_cut_vs/priority_prompt_len", pct, "(its paired lead {});", GUIDE),
    (TRACE_ENGINE, lambda r: sorted(r["patterns"]["tracecodex1.1"]["draws_apart_from_stock"]["plugin_guard"]),
     lambda v: {(0, 1, 2): "three"}.get(tuple(v), str(v)), "is mostly drift: {} of its slices ran hours after", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/fewer_draws/priority_lenpred/jct_cut_vs_stock", pct,
     "same sitting, cut mean JCT by {} with p99", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/fewer_draws/priority_lenpred/p99_jct_ratio_vs_stock", first(lambda x: f"{x:.2f}×"),
     "with p99 {} (the plug-in there", GUIDE),
    (TRACE_ENGINE, lambda r: [r["patterns"]["tracecodex1.1"]["modes"]["plugin"]["measured_cut_vs_stock_per_draw"][4],
                              r["patterns"]["tracecodex1.1"]["whatif"][4]["measured_p99_ratio"]],
     lambda v: f"{PCT(v[0])}, p99 {v[1]:.2f}×", "(the plug-in there {})", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin_guard/simulated_p99_ratio_vs_stock", f2,
     "keeps +10.7 % with p99 {}× (pooled", GUIDE),
    (TRACE_ENGINE, lambda r: r["patterns"]["tracecodex1.1"]["modes"]["plugin_guard"]["measured_cut_vs_stock_per_draw"][3:],
     lambda v: f"{PCT(v[0])} and {PCT(v[1])}", "it measured +4.9 %, {}, with p99", GUIDE),
    (TRACE_ENGINE, lambda r: [w["measured_p99_ratio"] for w in r["patterns"]["tracecodex1.1"]["whatif"]
                              if w["mode"] == "plugin_guard"][3:],
     lambda v: f"{v[0]:.2f}× and {v[1]:.2f}×", "with p99 1.20×, {}. So on", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/length_classes/jct_cut_vs_stock/plugin/short", pct, "shortest third of requests gains {}", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin/p99_jct_ratio_vs_stock", ratio, "p99 JCT is {} stock's", GUIDE),
    (TRACE_ENGINE, lambda r: [w["measured_p99_ratio"] for w in r["patterns"]["tracecodex1.1"]["whatif"]
                              if w.get("mode", "plugin") == "plugin"],
     lambda v: ", ".join(f"{x:.2f}×" for x in v), "per slice {}: within", GUIDE),
    (REPEAT, lambda r: [sum(x["jct_s"] for x in r["runs"]["0/stock/tracecodex1.1"]["results"]) / 218], first(f1),
     "took {} s instead of", GUIDE),
    (RUNS_11, lambda r: [sum(x["jct_s"] for x in r["runs"]["2/stock/tracecodex1.1"]["results"]) / 218], first(f1),
     "instead of {} s", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin/mean_jct_s", f1, "gave the plug-in {} s against", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin_guard/jct_cut_vs_stock", first(PCT), "it measured {}, +3.2 %", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin_guard/p99_jct_ratio_vs_stock", first(lambda x: f"{x:.2f}×"),
     "with p99 {}, 1.12× and", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/stock/mean_jct_s", f1, "against stock's {} s,", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin/jct_cut_vs_stock", pct, "s, {} (+18.9 % before)", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin/jct_cut_vs_stock", pct, "1.19 and 1.18) gave {}", GUIDE),
    (REPEAT_REPORT, lambda r: [r["patterns"]["tracecodex1.1"]["modes"][m]["simulated_over_measured"]
                               for m in ("stock", "plugin")], lambda v: f"{v[0]:.2f} and {v[1]:.2f}",
     "(simulator / measured {}) gave", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin_guard/jct_cut_vs_stock", pct, "in the same sitting, {} with p99", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin_guard/p99_jct_ratio_vs_stock", first(lambda x: f"{x:.2f}×"),
     "with p99 {} (the simulator", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin_guard/simulated_cut_vs_stock", PCT, "(the simulator {}): at one pace",
     GUIDE),
    (REPEAT_REPORT, lambda r: r["patterns"]["tracecodex1.1"]["whatif"][0]["error_pp"], lambda x: f"{x:+.1f}",
     "`lenpred whatif` on its log {} points off", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin/p99_jct_ratio_vs_stock", first(lambda x: f"{x:.2f}×"), "with p99 {} (the simulator", GUIDE),
    (REPEAT_REPORT, TRACE_11 + "/modes/plugin/simulated_cut_vs_stock", PCT, "(the simulator {}, `lenpred whatif`", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin/simulated_cut_vs_stock", PCT,
     "equals the simulator's ({})", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin_guard/simulated_over_measured", f2,
     "faster period (simulator / measured {} over its runs", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/stock/simulated_over_measured", f2, "over its runs, stock's {}; the report", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin_guard/jct_cut_vs_stock", first(PCT),
     "its measured {} with p99", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin_guard/p99_jct_ratio_vs_stock", first(lambda x: f"{x:.2f}×"),
     "with p99 {} is mostly that drift", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin_guard/simulated_cut_vs_stock", PCT,
     "At one pace it keeps {} with p99", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin_guard/simulated_p99_ratio_vs_stock_per_draw",
     lambda v: ", ".join(f"{x:.2f}×" for x in v), "(pooled; per slice {} against", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin/simulated_p99_ratio_vs_stock_per_draw",
     lambda v: ", ".join(f"{x:.2f}×" for x in v), "against the plug-in's {})", GUIDE),
    (TRACE_ENGINE, lambda r: max(abs(w["error_pp"]) for w in r["patterns"]["tracecodex1.1"]["whatif"]
                                 if w.get("mode", "plugin") == "plugin"), f1, "its measured cut within {} points", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/plugin/jct_cut_vs_stock", pct,
     "stock run, the plug-in cuts mean JCT by {}** with p99", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/plugin/jct_cut_vs_stock", pct,
     "the plug-in cuts mean JCT by {} (prompt-length priority", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/priority_prompt_len/jct_cut_vs_stock", pct,
     "(prompt-length priority {}; the plug-in's", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/best_lenpred/jct_cut_vs/priority_prompt_len", pct,
     "paired lead over it {}, within noise) with", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/plugin/p99_jct_ratio_vs_stock",
     lambda t: f"{t[0]:.2f}× [{t[1]:.2f}, {t[2]:.2f}]", "with p99 {} stock's: the cut follows", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/plugin/p99_jct_ratio_vs_stock", lambda t: f"{t[0]:.2f}× [{t[1]:.2f}, {t[2]:.2f}]",
     "with p99 {} and throughput", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/plugin/throughput_ratio_vs_stock", lambda x: f"{x:.3f}×",
     "and throughput {} stock's", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/priority_prompt_len/jct_cut_vs_stock", pct,
     "stock's; prompt-length priority {}, and", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/best_lenpred/jct_cut_vs/priority_prompt_len", pct,
     "paired lead over it {} (within noise)", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/plugin/simulated_cut_vs_stock", PCT,
     "The simulator's cut at one pace is {}.", GUIDE),
    (TRACE_ENGINE_09, lambda r: len(r["patterns"]["tracecodex0.9"]["draws"]), str, "At 0.9×, over {} slices each run", GUIDE),
    (TRACE_ENGINE_09, lambda r: len(r["patterns"]["tracecodex0.9"]["draws"]), str, "**At 0.9×, over {} slices, each",
     GUIDE),
    (TRACE_ENGINE_09, lambda r: r["patterns"]["tracecodex0.9"]["modes"]["plugin"]["measured_cut_vs_stock_per_draw"],
     lambda v: "the plug-in cut " + ", ".join(PCT(x) for x in v[:-1]) + f" and {PCT(v[-1])}", "{}", GUIDE),
    (RUNS_09, lambda r: [sum(x["ttft_s"] for x in r["runs"][k]["results"]) / len(r["runs"][k]["results"])
                         for k in sorted((k for k in r["runs"] if k.endswith("/stock/tracecodex0.9")),
                                         key=lambda k: int(k.split("/")[0]))],
     lambda v: ", ".join(f"{x:.1f}" for x in v[:-1]) + f" and {v[-1]:.1f} s",
     "mean TTFT per slice was {} (", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/stock/mean_ttft_s", f1, "({} s at 1.1×)", GUIDE),
    # the slices stretched to the capacity of their own sitting, on another VM
    (SITTING, lambda r: r["patterns"]["tracecodex0.9"]["modes"],
     lambda m: (f"the plug-in {pct(m['plugin']['jct_cut_vs_stock'])} with p99 "
                f"{m['plugin']['p99_jct_ratio_vs_stock'][0]:.2f}× and throughput "
                f"{m['plugin']['throughput_ratio_vs_stock']:.3f}× stock's; prompt-length priority "
                f"{pct(m['priority_prompt_len']['jct_cut_vs_stock'])} with p99 "
                f"{m['priority_prompt_len']['p99_jct_ratio_vs_stock'][0]:.2f}×"), "{}.", GUIDE),
    (SITTING, lambda r: r["patterns"]["tracecodex0.9"]["modes"],
     lambda m: (f"the plug-in {pct(m['plugin']['jct_cut_vs_stock'])} with p99 "
                f"{m['plugin']['p99_jct_ratio_vs_stock'][0]:.2f}×, prompt-length priority "
                f"{pct(m['priority_prompt_len']['jct_cut_vs_stock'])}"), "the cut: {}"),
    (SITTING, lambda r: len(r["patterns"]["tracecodex0.9"]["draws"]), str, "VM, {} slices each stretched to 0.9×"),
    (TRACE_ENGINE, lambda r: r["patterns"]["tracecodex1.1"]["modes"]["plugin_guard"],
     lambda m: f"{100 * m['jct_cut_vs_stock'][0]:+.1f} % with p99 {m['p99_jct_ratio_vs_stock'][0]:.2f}×",
     "the guarded plug-in's {} in `code_x1.1/`"),
    (SITTING, lambda r: len(r["patterns"]["tracecodex0.9"]["draws"]), str, "Over {} slices at 0.9× of the capacity", GUIDE),
    (CAPACITY_1206, "patterns/burst8/stock_capacity_req_s/0", f3, "stock's burst of 128 measured {} req/s", GUIDE),
    (CAPACITY_1206B, lambda r: (_load(CAPACITY_1206)["patterns"]["burst8"]["stock_capacity_req_s"][0],
                                r["patterns"]["burst8"]["stock_capacity_req_s"][0]),
     lambda v: f"{v[0]:.3f} and {v[1]:.3f} req/s", "capacity measured in its own sitting ({}) did not"),
    (CAPACITY_1206B, "patterns/burst8/stock_capacity_req_s/0", f3, "2.5 hours later, on the same boot, {} req/s", GUIDE),
    (CAPACITY_CONV, lambda r: (_load(RUNS_09)["runs"]["0/stock/tracecodex0.9"]["settings"]["rate_req_s"]
                               / r["patterns"]["burst8"]["stock_capacity_req_s"][0]), f2,
     "slices above ran near {}× of the engine's capacity"),
    ("results/scripts/serving/overhead_1206.json", "median_paired_ratio", f3,
     "plug-in / stock wall time {} (median of pairs;", GUIDE),
    # slice 5's plug-in run, slower than its stock run: its fitted pace, speed probe and load, the simulator's cut
    (TRACE_ENGINE_09, lambda r: next(w for w in r["patterns"]["tracecodex0.9"]["whatif"]
                                     if (w["draw"], w["mode"]) == (5, "plugin")),
     lambda w: (f"went {100 * (w['pace_scale'] / w['stock_pace_scale'] - 1):.1f} % slower than its stock run (fitted "
                f"paces {w['pace_scale']:.3f} and {w['stock_pace_scale']:.3f};"), "Slice 5's plug-in run {}", GUIDE),
    (RUNS_09, lambda r: (r["runs"]["5/plugin/tracecodex0.9"]["speed_probe"]["tpot_s"],
                         [x["speed_probe"]["tpot_s"] for k, x in r["runs"].items() if k != "5/plugin/tracecodex0.9"],
                         [x["loadavg_1m_during"]["mean"] for x in r["runs"].values()],
                         r["runs"]["5/plugin/tracecodex0.9"]["loadavg_1m_during"]["mean"]),
     lambda v: (f"{1000 * v[0]:.0f} ms per token against {1000 * min(v[1]):.0f}–{1000 * max(v[1]):.0f} ms in every "
                f"other run of the store, and the {'highest' if v[3] == max(v[2]) else 'NOT highest'} load average of "
                f"them, {v[3]:.1f} on average"), "its speed probe {}", GUIDE),
    (FRONTIER_09, lambda r: (as_run(r)["cut_per_draw"][5], r["measured"]["cut_per_draw"][5]),
     lambda v: f"gives that slice {PCT(v[0])} where the engine measured {PCT(v[1])}", "pace {};", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/modes/stock/simulated_over_measured", f2,
     "(simulator / measured {} for stock's runs", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/stock/simulated_over_measured", f2, "stock's runs against {} at 1.1×", GUIDE),
    (TRACE_ENGINE_09, lambda r: [w["error_pp"] for w in r["patterns"]["tracecodex0.9"]["whatif"] if w["mode"] == "plugin"],
     lambda v: ", ".join(f"{x:+.1f}" for x in v[:-1]).replace("-", "−") + f" and {v[-1]:+.1f} points".replace("-", "−"),
     "logs errs by {}.", GUIDE),
    (TRACE_ENGINE_09, lambda r: [v for v in r["patterns"]["tracecodex0.9"]["stock_pace_scale"].values()],
     lambda v: f"{min(v):.2f}–{max(v):.2f}× the cost model's", "this engine ran at {} step times", GUIDE),
    (TRACE_ENGINE_09, lambda r: [r["patterns"]["tracecodex0.9"][k][m]["simulated_over_measured_at_stock_pace"]
                                 for k, m in (("modes", "plugin"), ("modes", "priority_prompt_len"),
                                              ("fewer_draws", "priority_lenpred"))],
     lambda v: f"at 0.9× the plug-in {v[0]:.2f}, prompt\nlength {v[1]:.2f}, `lenpred serve` {v[2]:.2f}".replace("\n", " "),
     "{};", GUIDE),
    (TRACE_ENGINE, lambda r: [r["patterns"]["tracecodex1.1"][k][m]["simulated_over_measured_at_stock_pace"]
                              for k, m in (("modes", "plugin"), ("modes", "priority_prompt_len"),
                                           ("fewer_draws", "priority_lenpred"), ("modes", "plugin_guard"))],
     lambda v: f"at 1.1× {v[0]:.2f}, {v[1]:.2f}, {v[2]:.2f} and the guard {v[3]:.2f}", "{} (the table's", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/fewer_draws/priority_lenpred/jct_cut_vs_stock", pct,
     "`lenpred serve` on slices 1 and 2 cut mean JCT by {} with p99", GUIDE),
    (TRACE_ENGINE_09, "patterns/tracecodex0.9/fewer_draws/priority_lenpred/p99_jct_ratio_vs_stock",
     first(lambda x: f"{x:.2f}×"), "+11.2] with p99 {}: at 0.9×", GUIDE),
    (TRACE_ENGINE_09, lambda r: r["patterns"]["tracecodex0.9"]["draws_apart_from_stock"].get("plugin", []),
     lambda v: "Slice 0 was rerun in one sitting" if not v else f"slices {v} apart", "{}", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/whatif/1/measured_cut", lambda x: f"{100 * x:.0f} %",
     "the plug-in cut its mean JCT by {} with p99", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/whatif/1/measured_p99_ratio", lambda x: f"{x:.1f}×", "with p99 {} stock's, and", GUIDE),
    (TRACE_ENGINE, lambda r: [w["measured_p99_ratio"] for w in r["patterns"]["tracecodex1.1"]["whatif"]
                              if w.get("mode", "plugin") == "plugin"],
     lambda v: f"{v[0]:.2f}×, {v[2]:.2f}×, {v[3]:.2f}× and {v[4]:.2f}×", "other slices {}.", GUIDE),
    (REPEAT, lambda r: [sum(x["jct_s"] for x in r["runs"]["0/stock/tracecodex1.1"]["results"]) / 218], first(f1),
     "took {} s instead of", GUIDE),
    (RUNS_11, lambda r: [sum(x["jct_s"] for x in r["runs"]["2/stock/tracecodex1.1"]["results"]) / 218], first(f1),
     "instead of {} s;", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin/jct_cut_vs_stock", first(PCT), "pooled measured cut ({}) equals", GUIDE),
    (TRACE_ENGINE, TRACE_11 + "/modes/plugin/simulated_cut_vs_stock", PCT, "equals the simulator's ({})", GUIDE),
    (TRACE_ENGINE, lambda r: [r["patterns"]["tracecodex1.1"]["modes"][m]["measured_cut_vs_stock_per_draw"][3]
                              for m in ("plugin", "plugin_guard", "priority_prompt_len")],
     lambda v: f"the plug-in {PCT(v[0])}, the guard {PCT(v[1])}, prompt-length priority {PCT(v[2])}",
     "four modes ran back to back: {},", GUIDE),
    (TRACE_ENGINE, lambda r: [r["patterns"]["tracecodex1.1"]["modes"][m]["simulated_cut_vs_stock_per_draw"][3]
                              for m in ("plugin", "plugin_guard", "priority_prompt_len")],
     lambda v: ", ".join(PCT(x) for x in v), "where the simulator says {}:", GUIDE),
    (BENCH_SERVE_STOCK, "median_itl_ms", f0, "differed the same way (median {} and", GUIDE),
    (BENCH_SERVE, lambda r: r["runs"]["0/stock/client"]["summary"]["p50_tbt_s"], lambda x: f"{1000 * x:.0f}",
     "under the benchmark, {} and", GUIDE),
    (BENCH_SERVE_REPEAT, lambda r: [r["runs"]["0/stock/" + c]["results"] for c in ("vllm_bench", "client")],
     lambda v: " against ".join(f"{sum(x['jct_s'] for x in rs) / len(rs):.1f} s" for rs in v).replace(
         " s against", " s under the benchmark against"), "gave {} under the client", GUIDE),
    (BENCH_SERVE_REPORT, lambda r: r["vs_stock"]["plugin"]["vllm_bench"]["mean_cut"][0],
     PCT, "measured with it ({} here)", GUIDE),
    (BENCH_SERVE_REPORT, lambda r: r["vs_stock"]["plugin"]["client"]["mean_cut"][0],
     PCT, "the project's client gives ({}", GUIDE),
    (FIRST_HEAD, "burst/first_1000/share_of_shipped", share, "1,000 logged requests alone recovers {} of the shipped", GUIDE),
    (FIRST_HEAD, "burst/first_250/share_of_shipped", first(f2), "five stream orders; {} after 250)", GUIDE),
    (FIRST_HEAD, "test/first_1000/mae_minus_shipped", diff, "its test MAE stays {} tokens worse", GUIDE),
    (FIRST_HEAD_ENGINE.format("first_1000"), "patterns/burst8/modes/plugin/jct_cut_vs_stock", pct,
     "on the engine's burst it cut mean JCT by {} against", GUIDE),
    (FIRST_HEAD_ENGINE.format("shipped"), "patterns/burst8/modes/plugin/jct_cut_vs_stock", pct,
     "against the shipped head's {} on the same draw", GUIDE),
    (OUTSIDE, "later_half/refit: log + benchmark/mae_minus_shipped", diff, "beats the shipped head on unseen prompts: MAE difference {} tokens", GUIDE),
    # the queue share: the plug-in's cut against how long stock keeps requests waiting, simulator and engine
    (SHARE, lambda r: (r["simulator"]["spearman"]["plugin"], len(r["simulator"]["slices"]),
                       r["simulator"]["spearman_load"]["plugin"], r["engine"]["spearman"]["plugin"],
                       len(r["engine"]["slices"]), r["engine"]["spearman_load"]["plugin"]),
     lambda v: (f"cut with Spearman {v[0]:+.2f} over {v[1]} simulated slices of both traces at 0.6–1.2× (the load: "
                f"{v[2]:+.2f}) and {v[3]:+.2f} over the {v[4]} engine slices (the load: {v[5]:+.2f})"), "{}"),
    (SHARE, lambda r: (r["simulator"]["bins"][2], r["engine"]["bins"][2]),
     lambda b: (f"at 20–40 % the simulator's {pct(b[0]['cut_vs_stock']['plugin'])} is not what the engine's "
                f"{b[1]['num_slices']} slices gave ({pct(b[1]['cut_vs_stock']['plugin'])})"), "{}"),
    (SHARE, lambda r: share_range(r, "code", 0.9), str, "(code at 0.9×: {})"),
    (SHARE, lambda r: (r["simulator"]["bins"][0], r["engine"]["bins"][0]),
     lambda b: (f"under 10 % the plug-in gains {pct(b[0]['cut_vs_stock']['plugin'])} in the simulator (the engine's "
                f"{b[1]['num_slices']} slices: {pct(b[1]['cut_vs_stock']['plugin'])})"), "share is {}"),
    (SHARE, lambda r: (r["simulator"]["bins"][3], r["engine"]["bins"][3]),
     lambda b: (f"at 40–60 % {pct(b[0]['cut_vs_stock']['plugin'])} (the engine's {b[1]['num_slices']}: "
                f"{pct(b[1]['cut_vs_stock']['plugin'])})"), "{}"),
    (SHARE, lambda r: r["simulator"]["bins"],
     lambda b: (f"pooled p99 {b[2]['p99_ratio_vs_stock']['plugin'][0]:.2f}× at 20–40 %, "
                f"{b[3]['p99_ratio_vs_stock']['plugin'][0]:.2f}× at 40–60 %"), "({};"),
    (SHARE, lambda r: (r["simulator"]["spearman"]["plugin"], r["simulator"]["spearman"]["priority:prompt_len"],
                       share_range(r, "code", 0.7), share_range(r, "code", 0.9), r["simulator"]["spearman_load"]["plugin"]),
     lambda v: (f"correlation of the queue share with the plug-in's cut is {v[0]:+.2f} (of the nominal load "
                f"{v[4]:+.2f}; of the share with prompt-length priority's cut {v[1]:+.2f}), and at one nominal load the "
                f"share spans most of its range (code at 0.7×: {v[2]}; at 0.9×: {v[3]})"), "{}", GUIDE),
    (SHARE, lambda r: (r["simulator"]["bins"][0]["cut_vs_stock"]["plugin"][0],
                       r["simulator"]["bins"][2]["p99_ratio_vs_stock"]["plugin"][0],
                       r["simulator"]["bins"][3]["p99_ratio_vs_stock"]["plugin"][0],
                       r["simulator"]["bins"][4]["p99_ratio_vs_stock"]["plugin"][0]),
     lambda v: (f"(the plug-in {PCT(v[0])}); from a fifth on it gains a tenth or more. It is a correlation over slices, "
                f"not a cause"), "{}", GUIDE),
    (SHARE, lambda r: [r["simulator"]["bins"][k]["p99_ratio_vs_stock"]["plugin"][0] for k in (2, 3, 4)],
     lambda v: f"At 20–60 % the plug-in's pooled p99 is {v[0]:.2f}–{v[1]:.2f}× stock's, above 60 % {v[2]:.2f}×",
     "{}", GUIDE),
    (SHARE, lambda r: (r["engine"]["spearman"]["plugin"], len(r["engine"]["slices"]),
                       r["engine"]["spearman_load"]["plugin"], r["engine"]["spearman_by_machine"],
                       r["engine"]["bins"][0]["cut_vs_stock"]["plugin"][0], r["engine"]["bins"][2]["cut_vs_stock"]["plugin"],
                       r["engine"]["bins"][3]["cut_vs_stock"]["plugin"][0]),
     lambda v: (f"(Spearman {v[0]:+.2f} over {v[1]} slices of both machines, of the nominal load {v[2]:+.2f}; within "
                f"the first VM's slices {machine(v[3], FIRST_VM):+.2f}, within the second VM's {machine(v[3], SECOND_VM):+.2f}; slice 2 "
                f"of code 1.1×, run twice, counted once): {PCT(v[4])} under 10 %, {pct(v[5])} at 20–40 % and "
                f"{PCT(v[6])} at 40–60 %"), "{}", GUIDE),
    (SITTING_11, lambda r: r["patterns"]["tracecodex1.1"],
     lambda p: (f"the plug-in {pct(p['modes']['plugin']['jct_cut_vs_stock'])} with p99 "
                f"{p['modes']['plugin']['p99_jct_ratio_vs_stock'][0]:.2f}×, where the simulator at one pace gives "
                f"{PCT(p['modes']['plugin']['simulated_cut_vs_stock'])} and whatif "
                f"{PCT(p['whatif'][0]['predicted_cut'])}"), "{}", GUIDE),
    (SITTING_11, lambda r: r["patterns"]["tracecodex1.1"]["rate_req_s"], f3, "code_x1.1_sitting/`, {} req/s", GUIDE),
    (SHARE, lambda r: [100 * x["queue_share"] for x in r["engine"]["slices"] if x["source"] == "code_x1.1_sitting"],
     lambda v: f"a 1.1× slice at {v[0]:.0f} %", "{}", GUIDE),
    (SHARE, lambda r: sorted(100 * x["queue_share"] for x in r["engine"]["slices"] if x["source"] == "code_x0.9_sitting"
                             and x["cut_vs_stock"]["plugin"] < 0),
     lambda v: f"the 0.9× slices at {v[0]:.0f} % and {v[1]:.0f} %", "{}", GUIDE),
    (COST_1206, lambda c: (100 * c["fit_stats"]["mean_rel_error"], 100 * _load(SIM_COST)["fit_stats"]["mean_rel_error"],
                           *[_load(COST_1206.replace("cost/cost_vllm_1core_sampled.json",
                                                     f"whatif_own_cost/{d}-plugin-burst8/whatif.json"))
                             ["results"]["16"]["lenpred"]["jct_cut_vs_stock"][0] for d in (0, 1)],
                           *[w["measured_cut"] for w in _load(BURST_1206)["patterns"]["burst8"]["whatif"]]),
     lambda v: (f"with a {v[0]:.1f} % mean error, the first VM's with {v[1]:.1f} %) whatif predicts {PCT(v[2])} and "
                f"{PCT(v[3])} for the measured {PCT(v[4])} and {PCT(v[5])}"), "{}", GUIDE),
    # the burst on the second VM: what the parked order costs there, its steps, and whatif on the first VM's cost model
    (BURST_1206, BURST_1206_CELL, lambda m: (f"the plug-in {pct(m['jct_cut_vs_stock'])} with p99 "
                                             f"{m['p99_jct_ratio_vs_stock'][0]:.2f}× and "
                                             f"{m['throughput_ratio_vs_stock']:.2f}× stock's throughput"),
     "lost no throughput: {}"),
    (BURST_1206.replace("report.json", "runs.json"), burst_probes, lambda v: f"{v[0]} vs {v[1]} and {v[2]} vs {v[3]}",
     "(speed probes {} ms per token)"),
    (BURST_1206.replace("report.json", "runs.json"), burst_probes,
     lambda v: f"{v[0]} against {v[1]} and {v[2]} against {v[3]} ms per token", "faster machine than their stock runs ({}:", GUIDE),
    (BURST_1206, BURST_1206_CELL, lambda m: (f"the plug-in {pct(m['jct_cut_vs_stock'])} with p99 "
                                             f"{m['p99_jct_ratio_vs_stock'][0]:.2f}× and "
                                             f"{m['throughput_ratio_vs_stock']:.2f}× stock's throughput (the simulator "
                                             f"at one pace {PCT(m['simulated_cut_vs_stock'])})"), "It lost no throughput: {}, but", GUIDE),
    (BURST_1206, lambda r: r["patterns"]["burst8"]["pace_ms"], burst_steps, "{}", GUIDE),
    (BURST_1206.replace("report.json", "runs.json"), lambda r: [thin_from(r, f"{d}/{m}/burst8") for m in
                                                                ("plugin", "stock") for d in (0, 1)],
     lambda v: f"fewer than 16 requests were left after {v[0]:.0f} and {v[1]:.0f} s under the plug-in against "
               f"{v[2]:.0f} and {v[3]:.0f} s under stock", "{}", GUIDE),
    (BURST_1206, lambda r: [r["patterns"]["burst8"]["pace_ms"]["plugin"][d]["plugin_ms_per_step"] for d in "01"],
     lambda v: f"took {v[0]:.2f} and {v[1]:.2f} ms per step", "{}", GUIDE),
    (COST_1206, lambda c: (c["coefficients"]["d2"] / _load(SIM_COST)["coefficients"]["d2"], 1e6 * c["coefficients"]["d2"],
                           1e6 * _load(SIM_COST)["coefficients"]["d2"]),
     lambda v: f"prices context {v[0]:.0f}× higher than the first VM's ({v[1]:.1f} µs per context token against {v[2]:.2f})",
     "the same hour) {}", GUIDE),
    (BURST_1206, lambda r: [-w["error_pp"] for w in r["patterns"]["burst8"]["whatif"]],
     lambda v: f"misses the burst by {v[0]:.1f} and {v[1]:.1f} points", "second VM {}"),
    (BURST_1206, lambda r: r["patterns"]["burst8"]["whatif"],
     lambda w: f"is missed by {-w[0]['error_pp']:.1f} and {-w[1]['error_pp']:.1f} points, on a cost model", "{}", GUIDE),
    (COST_1206, lambda c: c["coefficients"]["d2"] / _load(SIM_COST)["coefficients"]["d2"], f0,
     "(its own prices context {}× higher)", GUIDE),
    (BURST_1206, lambda r: r["patterns"]["burst8"]["whatif"],
     lambda w: " and ".join(f"{x['pace_scale']:.3f} / {x['stock_pace_scale']:.3f}" for x in w),
     "slower, {}, where its makespans", GUIDE),
    (BURST_1206.replace("report.json", "runs.json"),
     lambda r: sorted(1 - r["runs"][f"{d}/plugin/burst8"]["wall_s"] / r["runs"][f"{d}/stock/burst8"]["wall_s"]
                      for d in (0, 1)),
     lambda v: f"{100 * v[0]:.0f}–{100 * v[1]:.0f} % shorter", "makespans were {}", GUIDE),
    # the plug-in's settings with an FCFS order, and each run's own pace on the second VM
    (BURST_SETTINGS, "patterns/burst8/modes/plugin", lambda m: f"{pct(m['jct_cut_vs_stock'])}, throughput "
                                                             f"{m['throughput_ratio_vs_stock']:.3f}×",
     "showed no detectable effect in that burst ({}, 2 draws; `burst_settings_1206/`)"),
    (SRPT_1206, lambda r: [*pace_ratios(), max(e for s in SECOND_VM_STORES for p in _load(ENGINE + s + "/report.json")
                                               ["patterns"].values() for e in p["stock_pace_elasticity"].values())],
     lambda v: (f"put the plug-in's run at {min(v[:-1]):.2f}–{max(v[:-1]):.2f}× its stock run's over {len(v) - 1} pairs, "
                f"and in the simulator, near capacity, a 1 % slower engine lengthens stock's mean JCT by up to "
                f"{v[-1]:.1f} %"), "{}"),
    (SRPT_1206, "patterns/tracecodex1.1/modes/plugin",
     lambda m: f"{pct(m['jct_cut_vs_stock'])} with p99 {m['p99_jct_ratio_vs_stock'][0]:.2f}×",
     "code 1.1× slices 0 and 1 in a later hour gave {}"),
    (BURST_SETTINGS, "patterns/burst8/modes/plugin",
     lambda m: (f"{pct(m['jct_cut_vs_stock'])}, p99 {m['p99_jct_ratio_vs_stock'][0]:.2f}× and "
                f"{m['throughput_ratio_vs_stock']:.3f}× stock's throughput"), "In the burst of 128: {}", GUIDE),
    (SETTINGS_11, "patterns/tracecodex1.1/modes/plugin",
     lambda m: (f"{PCT(m['measured_cut_vs_stock_per_draw'][0])} and {PCT(m['measured_cut_vs_stock_per_draw'][1])} "
                f"(pooled {pct(m['jct_cut_vs_stock'])})"), "`code_x1.1_sitting/`): {}, which", GUIDE),
    (SETTINGS_11, "patterns/tracecodex1.1",
     lambda p: (f"was {p['stock_pace_scale']['0']:.3f} (stock) and {p['modes']['plugin']['pace_scale_per_draw']['0']:.3f}"
                f" (the plug-in) in draw 0, {p['stock_pace_scale']['1']:.3f} and "
                f"{p['modes']['plugin']['pace_scale_per_draw']['1']:.3f} in draw 1; stock's pace on slice 0 had been "
                f"{_load(SITTING_11)['patterns']['tracecodex1.1']['stock_pace_scale']['0']:.3f} two hours earlier, so "
                f"the engine ran {100 * (p['stock_pace_scale']['0'] / _load(SITTING_11)['patterns']['tracecodex1.1']['stock_pace_scale']['0'] - 1):.0f} % slower"),
     "{}", GUIDE),
    (SETTINGS_11, "patterns/tracecodex1.1/stock_pace_elasticity", lambda e: f"by {e['0']:.1f} % and {e['1']:.1f} %",
     "lengthens stock's mean JCT {} (the report's", GUIDE),
    (SETTINGS_11, lambda r: pace_gaps(r["patterns"]["tracecodex1.1"]),
     lambda g: f"The fitted paces of draw 0's runs are {g[0]:.1f} % apart", "{}", GUIDE),
    (SETTINGS_11, lambda r: pace_gaps(r["patterns"]["tracecodex1.1"])[1], lambda g: f"Draw 1's are {g:.0f} %", "{}",
     GUIDE),
    (SETTINGS_11, "patterns/tracecodex1.1/pace_ms", lambda m: (
        f"puts the plug-in's run {100 * (m['plugin']['0']['wall_ms_per_step'] / m['stock']['0']['wall_ms_per_step'] - 1):.1f}"
        f" % slower"), "the wall time per step {}: draw 0", GUIDE),
    (SETTINGS_11, "patterns/tracecodex1.1/pace_ms",
     lambda m: f"{m['plugin']['1']['wall_ms_per_step'] / m['stock']['1']['wall_ms_per_step']:.2f}×",
     "and the wall time per step ({}) puts that on the machine", GUIDE),
    (SETTINGS_11, "patterns/tracecodex1.1/pace_ms", lambda m: (
        f"{_load(SITTING_11)['patterns']['tracecodex1.1']['pace_ms']['stock']['0']['wall_ms_per_step']:.0f} → "
        f"{m['stock']['0']['wall_ms_per_step']:.0f} ms, "
        f"+{100 * (m['stock']['0']['wall_ms_per_step'] / _load(SITTING_11)['patterns']['tracecodex1.1']['pace_ms']['stock']['0']['wall_ms_per_step'] - 1):.0f} %; "
        f"the speed probe +{100 * (m['stock']['0']['probe_ms'] / _load(SITTING_11)['patterns']['tracecodex1.1']['pace_ms']['stock']['0']['probe_ms'] - 1):.0f} %"),
     "per step {})", GUIDE),
    (SRPT_1206, lambda r: (*[pace_gaps(_load(SITTING)["patterns"]["tracecodex0.9"])[d] for d in (0, 3)],
                           pace_gaps(_load(SITTING_11)["patterns"]["tracecodex1.1"])[0], sorted(pace_ratios())),
     lambda v: (f"({v[0]:.1f}, {v[1]:.1f} and {v[2]:.1f} % on the two queueing 0.9× slices and the 1.1× sitting "
                f"slice) sit at the top of that spread (the other {len(v[3]) - 3} pairs: "
                f"{v[3][0]:.2f}–{v[3][-4]:.2f}×)"), "{}", GUIDE),
    (SRPT_1206, "patterns/tracecodex1.1/modes/plugin",
     lambda m: (f"{pct(m['jct_cut_vs_stock'])} with p99 {m['p99_jct_ratio_vs_stock'][0]:.2f}× and "
                f"{m['throughput_ratio_vs_stock']:.3f}× stock's throughput (per draw "
                f"{PCT(m['measured_cut_vs_stock_per_draw'][0])} and {PCT(m['measured_cut_vs_stock_per_draw'][1])}; the "
                f"simulator at one pace {PCT(m['simulated_cut_vs_stock'])})"), "(ABBA again): {}", GUIDE),
    (SRPT_1206, lambda r: pace_gaps(r["patterns"]["tracecodex1.1"]), lambda g: f"{g[0]:.1f} % and {g[1]:.1f} % faster",
     "its runs {} in fitted pace than their stock runs", GUIDE),
    (SRPT_1206, "patterns/tracecodex1.1/pace_ms", lambda m: " and ".join(
        f"{m['plugin'][d]['wall_ms_per_step']:.0f} against {m['stock'][d]['wall_ms_per_step']:.0f}" for d in "01"),
     "wall time per step was the same ({} ms)", GUIDE),
    (SRPT_1206, "patterns/tracecodex1.1/pace_ms", lambda m: " and ".join(
        f"{m['plugin'][d]['wall_ms_per_step']:.0f} against {m['stock'][d]['wall_ms_per_step']:.0f}" for d in "01"),
     "wall time per step {} ms), above the simulator's"),
    (SRPT_1206, "patterns/tracecodex1.1/modes/plugin/simulated_cut_vs_stock", PCT,
     "above the simulator's {} at one pace"),
    (SETTINGS_11, "patterns/tracecodex1.1/stock_pace_scale/0",
     lambda f: f"{1.1 * f / _load(SITTING_11)['patterns']['tracecodex1.1']['stock_pace_scale']['0']:.1f}×",
     "the nominal 1.1× slices ran at about {} that hour's", GUIDE),
    (SRPT_1206, lambda r: pace_ratios(), lambda v: f"Over the {len(v)} pairs of runs on that VM the plug-in run's pace "
                                                  f"was {min(v):.2f}–{max(v):.2f}× its stock run's", "{}", GUIDE),
    (SITTING_11, lambda r: pace_gaps(r["patterns"]["tracecodex1.1"])[0], lambda g: f"{g:.1f} %",
     "Its plug-in run ran {} slower in pace than its stock run", GUIDE),
    (SRPT_1206, "patterns/tracecodex1.1/modes/plugin/measured_cut_vs_stock_per_draw/0", PCT,
     "the plug-in's run the faster one, gave {} (`code_x1.1_srpt_1206/`", GUIDE),
]


@lru_cache(maxsize=None)
def _load(path: str):
    return json.loads((ROOT / path).read_text())


def _value(path: str, key):
    data = _load(path)
    if callable(key):
        return key(data)
    for part in key.split("/"):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


@lru_cache(maxsize=None)
def _readme(doc: str = "README.md") -> str:
    """The README (or another doc) with each paragraph on one line, each table row on its own, runs of blanks as one
    space."""
    text = (ROOT / doc).read_text()
    text = re.sub(r"\n(?![|\n])", " ", text)
    return re.sub(r"[ \t]+", " ", text)


def _pattern(template: str, value: str) -> re.Pattern:
    parts = [re.escape(p) for p in template.format(value).split("…")]
    return re.compile(r"[^\n]*?".join(parts))


def _id(check) -> str:
    path, key = check[0], check[1]
    return f"{Path(path).parent.name}/{Path(path).name}:{key if isinstance(key, str) else key.__qualname__}"


@pytest.mark.parametrize("check", CHECKS, ids=[_id(c) for c in CHECKS])
def test_readme_quotes_its_json(check):
    path, key, fmt, template, *doc = check
    value = fmt(_value(path, key))
    assert _pattern(template, value).search(_readme(*doc)), (
        f"{doc[0] if doc else 'the README'} should quote {template.format(value)!r} ({path}: {key if isinstance(key, str) else 'computed'})")


def test_every_check_names_a_file_in_the_repository():
    for path, *_ in CHECKS:
        assert (ROOT / path).is_file(), path


WHATIF_STORES = ("code_x0.9", "code_x1.1", "code_x1.1_repeat", "code_x1.1_wait", "conv_x1.1", "code_x0.9_sitting",
                 "code_x1.1_sitting", "code_x1.1_srpt_1206")
"""The engine stores whose plug-in runs the guide's whatif summary reads: the first VM's and the second VM's trace
slices, each replayed on the first VM's cost model (the second VM's burst, missed for that cost model's shape, is
quoted on its own)."""


def whatif_drift() -> dict:
    """Over the engine stores' ``lenpred whatif`` rows whose log gave a pace (its engine settings say its order):
    whatif's error (points) against the plug-in run's fitted pace over its stock run's, minus 1; and the range of the
    stores' stock paces."""
    import numpy as np

    reports = [json.loads((ROOT / f"results/scripts/serving/queue_trace_engine/{s}/report.json").read_text())
               for s in WHATIF_STORES]
    every = [w for r in reports for p in r["patterns"].values() for w in p.get("whatif", [])]
    assert every and all("pace_scale" in w for w in every), "a store's whatif rows predate the pace: --report-only it"
    rows = [w for w in every if w["pace_scale"] is not None]
    err = np.array([w["error_pp"] for w in rows])
    drift = np.array([w["pace_scale"] / w["stock_pace_scale"] - 1 for w in rows])
    near, miss = np.abs(drift) < 0.015, np.abs(err) > 5
    stock = [f for r in reports for p in r["patterns"].values() for f in p["stock_pace_scale"].values()]
    return {"n": len(rows), "near": int(near.sum()), "near_max": float(np.abs(err[near]).max()),
            "misses": int(miss.sum()),
            "miss_drift": (float(100 * np.abs(drift[miss]).min()), float(100 * np.abs(drift[miss]).max())),
            "stock_paces": (min(stock), max(stock))}


def whatif_sentence(d: dict) -> str:
    """The guide's summary of :func:`whatif_drift`."""
    lo, hi = d["miss_drift"]
    return (f"Over the {d['n']} plug-in runs whose log says the order it was served in, the {d['near']} whose fitted "
            f"pace is within 1.5 % of their stock run's are all within {d['near_max']:.1f} points of the measured "
            f"cut, and the {d['misses']} misses beyond 5 points are runs whose fitted pace differs from their stock "
            f"run's by {lo:.1f}–{hi:.1f} %.")


def test_the_guides_whatif_summary_is_its_json():
    d = whatif_drift()
    assert whatif_sentence(d) in _readme(GUIDE), f"the guide should say: {whatif_sentence(d)}"
    lo, hi = d["miss_drift"]
    readme = (f"predicts its measured cut within {d['near_max']:.1f} points wherever the plug-in run and its stock run "
              f"ran at the same pace, within 1.5 % ({d['near']} of {d['n']} runs); {d['misses']} of the {d['n']} miss by more than 5 "
              f"points, each where the two runs' paces differ by {lo:.1f}–{hi:.1f} %")
    assert readme in _readme(), f"the README should say: {readme}"
    lo, hi = d["stock_paces"]
    assert f"stores ran at {lo:.2f}–{hi:.2f}× its cost model's step times" in _readme(GUIDE)


def sitting_slices() -> tuple[str, str]:
    """The guide's per-slice sentence of ``code_x0.9_sitting`` (each slice's rate, stock's mean TTFT, the plug-in's
    measured cut beside whatif's and the two runs' fitted paces) and the README's phrase on the slices that queue."""
    import numpy as np

    report = json.loads((ROOT / SITTING).read_text())["patterns"]["tracecodex0.9"]
    runs = json.loads((ROOT / SITTING.replace("report.json", "runs.json")).read_text())["runs"]
    whatif = {w["draw"]: w for w in report["whatif"] if w["mode"] == "plugin"}
    ttft = {d: float(np.mean([x["ttft_s"] for x in runs[f"{d}/stock/tracecodex0.9"]["results"]]))
            for d in report["draws"]}
    sign = lambda x: f"{x:+.1f}".replace("-", "−")  # noqa: E731
    guide = "; ".join(f"slice {d} at {report['rate_req_s_per_draw'][i]:.3f} req/s, stock's mean TTFT {ttft[d]:.1f} s: "
                      f"the plug-in {sign(100 * whatif[d]['measured_cut'])} % (whatif {sign(100 * whatif[d]['predicted_cut'])} %; "
                      f"fitted paces {whatif[d]['pace_scale']:.3f} / {whatif[d]['stock_pace_scale']:.3f})"
                      for i, d in enumerate(report["draws"]))
    queued = [d for d in report["draws"] if ttft[d] > 5]
    drift = [100 * (whatif[d]["pace_scale"] / whatif[d]["stock_pace_scale"] - 1) for d in queued]
    readme = (f"{len(report['draws']) - len(queued)} of them queue little (stock's mean TTFT "
              f"{max(ttft[d] for d in report['draws'] if d not in queued):.1f} s at most); on the {len(queued)} that "
              f"queue more, the plug-in's runs went " + " and ".join(f"{x:.1f}" for x in drift) + " % slower than their stock "
              "runs (fitted paces; the speed probes just before them: " + " and ".join(
                  f"{1000 * runs[f'{d}/plugin/tracecodex0.9']['speed_probe']['tpot_s']:.0f} vs "
                  f"{1000 * runs[f'{d}/stock/tracecodex0.9']['speed_probe']['tpot_s']:.0f}" for d in queued)
              + " ms per token)")
    return guide, readme


def test_the_sitting_slices_are_read_from_their_json():
    guide, readme = sitting_slices()
    assert guide in _readme(GUIDE), f"the guide should say: {guide}"
    assert readme in _readme(), f"the README should say: {readme}"
