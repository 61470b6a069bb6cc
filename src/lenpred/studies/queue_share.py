"""Where the plug-in's gain comes from: the share of stock's job completion time spent waiting (issue 49;
``scripts/queue_share.py``).

A nominal load (requests/s as a multiple of stock's burst capacity) does not say how much a slice of real arrivals
queues: at "0.9×" one slice of the Azure code trace left stock's requests waiting half their JCT and another one 2 %
(and a capacity measured on a burst need not carry over to trickling arrivals alike on every machine). What a
reorder can shorten is the wait. So per slice this study takes stock FCFS's **queue share**, mean TTFT / mean JCT over the
slice's requests (TTFT: arrival to first token, the wait for admission plus the prefill; an operator reads nearly the
same from vLLM's ``/metrics``: the ``_sum`` of ``vllm:time_to_first_token_seconds`` over its ``_count``, divided by
the same for ``vllm:e2e_request_latency_seconds``, over a window in which both counted the same requests), beside the
plug-in's paired mean-JCT cut vs stock and its p99 ratio:

* in the simulator, ``draws`` slices of each trace (:mod:`lenpred.serving.traces`) at each of ``loads`` × the
  simulated stock capacity (the slices, requests, KV cache and modes of :mod:`lenpred.studies.queue_sim`: stock,
  prompt-length priority and the plug-in's design ``plugin:srpt:W<D>:prompt_len``);
* on the engine, every committed trace store's slices with a stock and a ``plugin`` run in one sitting (paired
  request by request, :func:`lenpred.studies.engine_bench.paired`; a slice rerun in another store counted once, the
  first store's by name; a plug-in run more than :data:`lenpred.studies.queue_report.SITTING_H` hours from its stock
  run left out, as the queue report leaves it out).

Slices are pooled into bins of the queue share (``share_bins``); each bin's cut is a paired two-stage bootstrap over
requests clustered by slice (:func:`lenpred.studies.paired.compare`). Output: ``<out>.json``, ``<out>.md``,
``<out>.png``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError, raise_first
from lenpred.studies.queue_regime import plugin_settings

MODES = ("stock", "plugin", "priority:prompt_len")
"""The simulated modes (``plugin``: :func:`design_mode`)."""


DESIGN = {**{k: v for k, v in plugin_settings(0).items() if k not in ("decode_slots", "prefill_ahead")},
          "aging_tokens_per_s": 0.0, "max_wait_s": None}
"""The plug-in's design (:func:`lenpred.studies.queue_regime.plugin_settings`, no starvation guard) an engine run
must have served to count as the plug-in here; a setting a run's record lacks was at this value."""


def is_design(plugin: dict) -> bool:
    """Whether a plug-in run's settings (``runs.json``'s ``settings["plugin"]``) are :data:`DESIGN` with a window of
    its decode slots (``prefill_ahead`` = ``decode_slots``); e.g. the plug-in run with an FCFS order to isolate its
    settings is not."""
    return (all(plugin.get(k, v) == v for k, v in DESIGN.items())
            and plugin.get("prefill_ahead") == plugin.get("decode_slots"))


def design_mode(D: int) -> str:
    """The plug-in's defaults as a :mod:`lenpred.studies.queue_sim` mode: parked SRPT, a window of D, shortest prompt
    first into it."""
    return f"plugin:srpt:W{D}:prompt_len"


@dataclass
class QueueShareConfig:
    """Settings of the queue-share study (module docstring).

    Attributes:
        traces: public traces replayed (:data:`lenpred.serving.traces.TRACES`).
        loads: mean arrival rates as multiples of the simulated stock capacity at D.
        draws: slices per trace and load; slice d at ``seed + d`` (its offset and requests).
        seed: the first slice's seed.
        decode_bound: D, sequences decoded per step in every mode.
        window_s: seconds of arrivals per slice (N = load × capacity × window).
        cost_model: the bare engine's cost model (``scripts/decode_knee.py``).
        streaming_overhead_ms: the API server's work per streamed token, ms (the engine reports fitted 0).
        engine_stores: a folder of engine trace stores (``*/runs.json`` of ``scripts/queue_benchmark.py``); ``""``:
            the simulator only.
        share_bins: ascending edges of the queue-share bins, from 0 to 1.
        bootstrap_resamples: resamples of every paired interval.
        out: output path prefix.

    Raises:
        LenpredError: a bad load, draw count, seed, resample count, bin edges or overhead; an unknown trace.
    """

    traces: tuple[str, ...] = ("code", "conv")
    loads: tuple[float, ...] = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)
    draws: int = 8
    seed: int = 300
    decode_bound: int = 16
    window_s: float = 600.0
    cost_model: str = "results/scripts/serving/queue_guard/cost/cost_vllm_1core_sampled.json"
    streaming_overhead_ms: float = 0.0
    engine_stores: str = "results/scripts/serving/queue_trace_engine"
    share_bins: tuple[float, ...] = (0.0, 0.1, 0.2, 0.4, 0.6, 1.0)
    bootstrap_resamples: int = 2000
    out: str = "results/scripts/serving/queue_share/queue_share"

    def __post_init__(self):
        from lenpred.serving.traces import TRACES

        self.traces, self.loads = tuple(self.traces), tuple(float(x) for x in self.loads)
        self.share_bins = tuple(float(x) for x in self.share_bins)
        unknown = [t for t in self.traces if t not in TRACES]
        bins = np.array(self.share_bins)
        raise_first([(bool(unknown), f"unknown trace {', '.join(unknown)}; valid: {', '.join(TRACES)}"),
                     (not self.traces or not self.loads, "name at least one trace and one load"),
                     (any(not 0 < x < 10 for x in self.loads), f"loads must be in (0, 10), got {self.loads}"),
                     (self.draws < 1, f"draws must be >= 1, got {self.draws}"),
                     (self.seed < 0, f"the seed must be >= 0, got {self.seed}"),
                     (self.bootstrap_resamples < 100,
                      f"bootstrap resamples must be >= 100 for a 95 % interval, got {self.bootstrap_resamples}"),
                     (self.decode_bound < 1, f"the decode bound must be >= 1, got {self.decode_bound}"),
                     (not self.window_s > 0, f"the window must be > 0 s, got {self.window_s}"),
                     (len(bins) < 2 or bins[0] != 0 or bins[-1] != 1 or bool(np.any(np.diff(bins) <= 0)),
                      f"share bins must ascend from 0 to 1, e.g. 0,0.1,0.2,0.4,0.6,1; got {self.share_bins}"),
                     (not 0 <= self.streaming_overhead_ms < 1e3,
                      f"the streaming overhead must be in [0, 1000) ms, got {self.streaming_overhead_ms}")])


def queue_share(ttft_s: np.ndarray, jct_s: np.ndarray) -> float:
    """Stock's queue share of one slice: ``mean(ttft_s) / mean(jct_s)`` (``(n,)`` float arrays, seconds, the same
    requests).

    Raises:
        LenpredError: no requests, or a mean JCT that is not positive.
    """
    ttft_s, jct_s = np.asarray(ttft_s, dtype=np.float64), np.asarray(jct_s, dtype=np.float64)
    if ttft_s.size == 0 or ttft_s.shape != jct_s.shape or not jct_s.mean() > 0:
        raise LenpredError(f"a queue share needs paired TTFT and JCT of at least one request with a positive mean JCT "
                           f"(got {ttft_s.size} and {jct_s.size} values)")
    return float(ttft_s.mean() / jct_s.mean())


def slice_row(source: str, trace: str, load: float, draw: int, jct: dict[str, np.ndarray],
              stock_ttft_s: np.ndarray, **extra) -> dict:
    """One slice's row: where it came from, stock's mean TTFT and JCT (s) and :func:`queue_share`, and per other
    mode of ``jct`` (``(n,)`` arrays aligned request by request with ``jct["stock"]``) its mean-JCT cut vs stock
    (``1 − Σ mode / Σ stock``) and p99 ratio (numpy's linear percentile): :data:`lenpred.studies.paired.STATISTICS`'
    ``mean_cut`` and ``p99_ratio``."""
    from lenpred.studies.paired import STATISTICS

    stock = jct["stock"]
    stat = lambda name, x: float(STATISTICS[name]({"ref": stock, "mode": x}))  # noqa: E731
    return {"source": source, "trace": trace, "load": load, "draw": draw, "num_requests": int(stock.size),
            "stock_mean_ttft_s": float(stock_ttft_s.mean()), "stock_mean_jct_s": float(stock.mean()),
            "queue_share": queue_share(stock_ttft_s, stock), **extra,
            "cut_vs_stock": {m: stat("mean_cut", x) for m, x in jct.items() if m != "stock"},
            "p99_ratio_vs_stock": {m: stat("p99_ratio", x) for m, x in jct.items() if m != "stock"}}


def simulated_slices(cfg: QueueShareConfig) -> tuple[list[dict], list[dict[str, np.ndarray]], dict]:
    """``(rows, jct, setting)``: per simulated slice its :func:`slice_row` and the per-request JCTs of
    :data:`MODES`, and the capacity and KV cache they ran at."""
    from tqdm import tqdm

    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_sim import capacity, draw_timings, kv_tokens
    from lenpred.studies.workload import load_workload_table, table_prompt_oracle

    cost = CostModel.load(cfg.cost_model).with_streaming_overhead(cfg.streaming_overhead_ms / 1e3)
    table = load_workload_table(token_ids=False, rebuild=False)
    oracle_p = table_prompt_oracle(table)
    D = cfg.decode_bound
    kv = kv_tokens(table, D)
    cap = capacity(table, cost, D, kv, cfg.seed)
    names = {"stock": "stock", "plugin": design_mode(D), "priority:prompt_len": "priority:prompt_len"}
    rows, jcts = [], []
    grid = [(t, load, d) for t in cfg.traces for load in cfg.loads for d in range(cfg.draws)]
    for trace, load, d in tqdm(grid, desc="simulated slices", unit="slice"):
        n, rate = int(round(load * cap * cfg.window_s)), load * cap
        timings = draw_timings(table, oracle_p, cost, names.values(), n=n, arrival=f"trace:{trace}", rate=rate,
                               cv=1.0, seed=cfg.seed + d, D=D, kv=kv)
        jct = {m: np.array([t.jct_s for t in timings[name]]) for m, name in names.items()}
        ttft = np.array([t.ttft_s for t in timings["stock"]])
        rows.append(slice_row("simulator", trace, load, d, jct, ttft, rate_req_s=rate))
        jcts.append(jct)
    return rows, jcts, {"capacity_req_s": cap, "kv_cache_tokens": kv}


def engine_slices(folder: str | Path) -> tuple[list[dict], list[dict[str, np.ndarray]]]:
    """``(rows, jct)``: every slice of a trace pattern (``trace<name>x<load>``) in ``folder/*/runs.json`` with a
    ``stock`` and a ``plugin`` run in one sitting, as :func:`slice_row` (``source`` the store's folder name, with the
    machine's kernel boot id and the day its stock run started) and its paired JCTs; a slice (trace, rate, the
    store's seed + draw) met again in a later store by name is skipped; ``([], [])`` for ``""`` (the simulator only).

    Raises:
        LenpredError: a folder with no ``*/runs.json`` (a store itself, or a wrong path), or a ``runs.json`` that is
            not a queue benchmark's store (the message names it).
    """
    if not str(folder):
        return [], []
    paths = sorted(Path(folder).glob("*/runs.json"))
    if not paths:
        raise LenpredError(f"no engine stores (*/runs.json) under {folder}: give the folder that holds the stores of "
                           "scripts/queue_benchmark.py (e.g. results/scripts/serving/queue_trace_engine), or '' for "
                           "the simulator only")
    rows, jcts, seen = [], [], set()
    for path in paths:
        try:
            found = store_slices(path, seen)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise LenpredError(f"{path} is not a queue benchmark's store ({type(exc).__name__}: {exc}): restore it "
                               "with git checkout, or rerun that store with scripts/queue_benchmark.py") from None
        for row, jct in found:
            rows.append(row)
            jcts.append(jct)
    return rows, jcts


def store_slices(path: Path, seen: set) -> list[tuple[dict, dict[str, np.ndarray]]]:
    """:func:`engine_slices` of one ``runs.json``; ``seen`` collects the slices met so far (and is added to).

    Raises:
        ValueError, KeyError, TypeError, AttributeError, OSError: a file that is not a queue benchmark's store.
    """
    import json

    from lenpred.studies.engine_bench import paired, run_key
    from lenpred.studies.queue_regime import parse_pattern
    from lenpred.studies.queue_report import draws_apart_from_stock

    store = json.loads(path.read_text())
    out = []
    keys = [k.split("/") for k in store["runs"]]
    for d, name in sorted({(int(d), p) for d, m, p in keys if m == "plugin"}):
        pattern = parse_pattern(name)
        if pattern.trace is None or run_key(d, "stock", name) not in store["runs"] \
                or not is_design(store["runs"][run_key(d, "plugin", name)]["settings"].get("plugin") or {}) \
                or draws_apart_from_stock(store, name, [d], ["plugin"]):
            continue
        stock = store["runs"][run_key(d, "stock", name)]
        settings = stock.get("settings") or {}
        slice_id = (pattern.trace, settings.get("rate_req_s"), store.get("config", {}).get("seed", 0) + d)
        if slice_id in seen:  # the same slice rerun in another store: counted once
            continue
        seen.add(slice_id)
        jct = {m: x[0] for m, x in paired(store, [d], name, ["stock", "plugin"]).items()}
        ttft = paired(store, [d], name, ["stock", "plugin"], key="ttft_s")["stock"][0]
        out.append((slice_row(path.parent.name, pattern.trace, pattern.load, d, jct, ttft,
                              rate_req_s=settings.get("rate_req_s"),
                              boot_id=(stock.get("machine") or {}).get("boot_id"),
                              day=(stock.get("started") or "")[:10] or None), jct))
    return out


def binned(rows: list[dict], jcts: list[dict[str, np.ndarray]], bins: tuple[float, ...], n_resamples: int) -> list:
    """Per queue-share bin ``[low, high)`` (the last one closed): its slices' count and, per mode, the pooled mean-JCT
    cut vs stock and p99 ratio, each with a paired interval (requests clustered by slice); ``None`` cells for an
    empty bin.

    Raises:
        LenpredError: a slice whose queue share is not a finite number in [0, 1] (a damaged TTFT).
    """
    from lenpred.studies.paired import compare

    bad = [r["source"] for r in rows if not 0 <= r["queue_share"] <= 1]
    if bad:
        raise LenpredError(f"{len(bad)} slice(s) with a queue share outside [0, 1] (first from {bad[0]}): a TTFT is "
                           "missing or longer than its JCT; rerun that slice")
    out = []
    for k, (low, high) in enumerate(zip(bins[:-1], bins[1:])):
        last = k == len(bins) - 2
        idx = [i for i, r in enumerate(rows) if low <= r["queue_share"] < high or (last and r["queue_share"] == high)]
        cell = {"low": low, "high": high, "num_slices": len(idx), "cut_vs_stock": {}, "p99_ratio_vs_stock": {}}
        for m in (m for m in jcts[0] if m != "stock") if jcts else ():
            if not idx:
                cell["cut_vs_stock"][m] = cell["p99_ratio_vs_stock"][m] = None
                continue
            stock, mode = [jcts[i]["stock"] for i in idx], [jcts[i][m] for i in idx]
            cell["cut_vs_stock"][m] = compare("mean_cut", stock, mode, n_resamples)
            cell["p99_ratio_vs_stock"][m] = compare("p99_ratio", stock, mode, n_resamples)
        out.append(cell)
    return out


def spearman(rows: list[dict], mode: str, by: str = "queue_share") -> float | None:
    """Spearman's rank correlation of the rows' ``by`` (the queue share, or the nominal ``load``) with ``mode``'s cut
    over ``rows`` (scipy; ``None`` below 3 slices)."""
    from scipy.stats import spearmanr

    if len(rows) < 3:
        return None
    return float(spearmanr([r[by] for r in rows], [r["cut_vs_stock"][mode] for r in rows]).statistic)


def run(cfg: QueueShareConfig) -> dict:
    """The study (module docstring): ``settings``, the simulated and engine slices, their bins and rank
    correlations of the cut with the queue share (``spearman``) and with the nominal load (``spearman_load``; on the
    engine also the share's per machine, by kernel boot id)."""
    sim_rows, sim_jct, setting = simulated_slices(cfg)
    eng_rows, eng_jct = engine_slices(cfg.engine_stores)
    n = cfg.bootstrap_resamples
    return {"settings": dataclasses.asdict(cfg), **setting, "design_mode": design_mode(cfg.decode_bound),
            "simulator": {"slices": sim_rows, "bins": binned(sim_rows, sim_jct, cfg.share_bins, n),
                          "spearman": {m: spearman(sim_rows, m) for m in MODES[1:]},
                          "spearman_load": {m: spearman(sim_rows, m, "load") for m in MODES[1:]}},
            "engine": {"slices": eng_rows, "bins": binned(eng_rows, eng_jct, cfg.share_bins, n),
                       "spearman": {"plugin": spearman(eng_rows, "plugin")},
                       "spearman_load": {"plugin": spearman(eng_rows, "plugin", "load")},
                       "spearman_by_machine": {str(boot): spearman([r for r in eng_rows if r.get("boot_id") == boot],
                                                                   "plugin")
                                               for boot in sorted({r.get("boot_id") for r in eng_rows}, key=str)}}}


def bins_markdown(bins: list[dict]) -> str:
    """:func:`binned`'s cells as a Markdown table: per queue-share bin its slices and, per mode (in :data:`MODES`'
    order), the pooled cut and p99 ratio with their intervals."""
    from lenpred.tables import markdown_table

    from lenpred.studies.engine_bench import fmt_ci, pct

    cut = lambda t: "–" if t is None else fmt_ci(t, pct)  # noqa: E731
    ratio = lambda t: "–" if t is None else fmt_ci(t, lambda x: f"{x:.2f}")  # noqa: E731
    name = {"plugin": "plug-in", "priority:prompt_len": "prompt-length priority"}
    modes = [m for m in MODES[1:] if bins and m in bins[0]["cut_vs_stock"]]
    return markdown_table(["queue share", "slices", *(f"{name.get(m, m)}: {x}" for m in modes for x in ("cut", "p99"))],
                          [[f"{b['low']:.0%}–{b['high']:.0%}", str(b["num_slices"]),
                            *(y for m in modes for y in (cut(b["cut_vs_stock"][m]), ratio(b["p99_ratio_vs_stock"][m])))]
                           for b in bins])


def markdown(rep: dict) -> str:
    """The report as Markdown: the bins (simulator, then engine), then every engine slice."""
    from lenpred.tables import markdown_table

    rho = lambda x: "–" if x is None else f"{x:+.2f}"  # noqa: E731
    s, sim, eng = rep["settings"], rep["simulator"], rep["engine"]
    lines = ["# The plug-in's gain against stock's queue share", "",
             "Queue share of a slice: stock FCFS's mean TTFT / mean JCT over its requests (the wait for admission plus "
             "the prefill, as a share of the job). Cut: 1 − mean JCT / stock's on the same requests; intervals 95 %, "
             "paired, requests clustered by slice. p99: the pooled p99 JCT over stock's.", "",
             "Terms: JCT, job completion time (arrival to last token); TTFT, time to first token; p99, the 99th "
             "percentile; D, the sequences decoded per step; the plug-in, lenpred's in-engine scheduler as it ships "
             f"(`{rep['design_mode']}`: parked SRPT on the engine's own prediction, a window of D prefilled requests, "
             "shortest prompt first into it); machine: the kernel boot id of the engine's host (and the day its stock "
             "run started).", "",
             f"Simulator: traces {', '.join(s['traces'])} at {', '.join(f'{x:g}' for x in s['loads'])} × the "
             f"simulated stock capacity ({rep['capacity_req_s']:.3f} req/s at D = {s['decode_bound']}, cost model "
             f"`{s['cost_model']}`), {s['draws']} slice(s) of {s['window_s']:g} s each. Spearman's rank correlation of the queue share with the cut: plug-in "
             f"{rho(sim['spearman']['plugin'])}, prompt-length priority {rho(sim['spearman']['priority:prompt_len'])} "
             f"({len(sim['slices'])} slice(s)); of the nominal load with the plug-in's cut "
             f"{rho(sim['spearman_load']['plugin'])}.", "",
             bins_markdown(sim["bins"]), ""]
    if eng["slices"]:
        per_machine = ", ".join(f"{rho(v)} on machine {k[:8]}" for k, v in eng["spearman_by_machine"].items())
        lines += [f"Engine (`{s['engine_stores']}`, every slice with a stock and a plug-in run; Spearman of the share "
                  f"{rho(eng['spearman']['plugin'])} over {len(eng['slices'])} slice(s) ({per_machine}), of the nominal "
                  f"load {rho(eng['spearman_load']['plugin'])}):", "",
                  bins_markdown(eng["bins"]), "",
                  "Every engine slice, by queue share:", "",
                  markdown_table(["store", "slice", "machine (day)", "requests", "stock TTFT s", "stock JCT s",
                                  "queue share", "plug-in cut", "plug-in p99"],
                                 [[r["source"], str(r["draw"]), machine_label(r), str(r["num_requests"]),
                                   f"{r['stock_mean_ttft_s']:.1f}", f"{r['stock_mean_jct_s']:.1f}",
                                   f"{r['queue_share']:.0%}", f"{r['cut_vs_stock']['plugin']:+.1%}",
                                   f"{r['p99_ratio_vs_stock']['plugin']:.2f}"]
                                  for r in sorted(eng["slices"], key=lambda r: r["queue_share"])]), ""]
    return "\n".join(lines)


def machine_label(row: dict) -> str:
    """``2729868e (2026-12-06)``: an engine slice's machine (its kernel boot id's start) and the day of its stock
    run."""
    boot = (row.get("boot_id") or "–")[:8]
    return f"{boot} ({row['day']})" if row.get("day") else boot


def plot(rep: dict, path: Path) -> None:
    """The plug-in's cut (left) and p99 ratio (right) against the queue share: simulated slices by trace, engine
    slices by machine, and the simulator's bins with their intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sim, eng = rep["simulator"], rep["engine"]
    for trace, color in zip(rep["settings"]["traces"], ("tab:blue", "tab:orange", "tab:green", "tab:purple")):
        rows = [r for r in sim["slices"] if r["trace"] == trace]
        x = [100 * r["queue_share"] for r in rows]
        left.scatter(x, [100 * r["cut_vs_stock"]["plugin"] for r in rows], s=12, alpha=0.45, color=color,
                     label=f"simulator, {trace}")
        right.scatter(x, [r["p99_ratio_vs_stock"]["plugin"] for r in rows], s=12, alpha=0.45, color=color)
    full = [b for b in sim["bins"] if b["num_slices"]]
    mid = [50 * (b["low"] + b["high"]) for b in full]
    cuts = [b["cut_vs_stock"]["plugin"] for b in full]
    left.errorbar(mid, [100 * c[0] for c in cuts], yerr=[[100 * (c[0] - c[1]) for c in cuts],
                                                          [100 * (c[2] - c[0]) for c in cuts]],
                  color="black", marker="s", capsize=3, label="simulator, pooled per bin")
    for k, boot in enumerate(sorted({r.get("boot_id") for r in eng["slices"]}, key=str)):
        rows = [r for r in eng["slices"] if r.get("boot_id") == boot]
        marker = "D^v<>"[k % 5]
        x = [100 * r["queue_share"] for r in rows]
        days = sorted(r["day"] for r in rows if r.get("day"))
        when = f" ({days[0]}{'' if days[0] == days[-1] else ' to ' + days[-1]})" if days else ""
        left.scatter(x, [100 * r["cut_vs_stock"]["plugin"] for r in rows], marker=marker, s=55, facecolor="none",
                     edgecolor="crimson", linewidth=1.5, label=f"engine, machine {str(boot)[:8]}{when}")
        right.scatter(x, [r["p99_ratio_vs_stock"]["plugin"] for r in rows], marker=marker, s=55, facecolor="none",
                      edgecolor="crimson", linewidth=1.5)
    left.axhline(0, color="grey", lw=0.8)
    right.axhline(1, color="grey", lw=0.8)
    left.set(xlabel="stock's queue share: mean TTFT / mean JCT, %", ylabel="plug-in's mean-JCT cut vs stock, %",
             title="Mean JCT")
    right.set(xlabel="stock's queue share: mean TTFT / mean JCT, %", ylabel="p99 JCT / stock's", title="Tail")
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def save(rep: dict, out: str) -> None:
    """``<out>.json`` (atomically), ``<out>.md`` and ``<out>.png``."""
    from lenpred.io import atomic_path, write_json

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_json(f"{out}.json", rep)
    with atomic_path(f"{out}.md") as tmp:
        tmp.write_text(markdown(rep) + "\n")
    plot(rep, Path(f"{out}.png"))
