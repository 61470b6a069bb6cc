"""Study: prompts from outside the benchmark, served through the plug-in (issue 48, item 3): what the shipped head
is worth there, and whether a head refitted on the served traffic beats it on prompts it never saw.

Input: what :func:`lenpred.studies.outside_serve.serve_outside` wrote — the engine's own traffic log (the states the
plug-in captured, the shipped head's served prediction and interval, each request's outcome) and ``samples.parquet``
(which prompt each request was, in serving order). The stream is split by prompt in serving order: the **earlier**
half's prompts and the **later** half's, which the earlier half never saw.

On the later half (MAE with prompt-clustered 95 % intervals, Kendall τ, both paired with the shipped head):

* baselines: the shipped head as served; a constant (the earlier half's median length); prompt length (a line
  fitted on the earlier half, clipped to the cap); the **prompt oracle** (the mean of the prompt's other samples:
  the most any prompt-only predictor can know);
* refits on the earlier half, in time order: the log alone (the shipped head's hyper-parameters, from scratch); the
  log plus the benchmark's train split; the shipped head fine-tuned (epochs and learning rate chosen on the earlier
  half's latest 20 %, :func:`lenpred.online.refit.choose_finetune`);
* the 80 % interval: the shipped head's fixed margin vs adaptive conformal inference over the whole stream
  (:func:`lenpred.online.adaptive.replay_intervals`), coverage on the later half;
* the simulator's burst of ``burst``·D later-half requests (``draws`` draws): the plug-in's design ranked by each
  head (:func:`lenpred.studies.first_head.burst_jct`).

Output: ``outside.json`` and ``outside.md`` under ``out``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError
from lenpred.studies import DEFAULT_BENCH
from lenpred.studies.first_head import SIM_COST_MODEL


@dataclass
class OutsideConfig:
    """Settings of :func:`run_outside` (``scripts/outside_source.py``).

    Attributes:
        out: the directory :func:`~lenpred.studies.outside_serve.serve_outside` wrote (and the report's).
        bench, data_dir, cache: the benchmark whose train split the ``log + benchmark`` refit mixes in, and where
            its prompts and layer-15 signals are (``None``: defaults).
        adaptive_window, gamma: the ACI replay's window and step (as the traffic study's).
        cost_model, decode_bound, burst, draws, sim_seed: the simulator's burst.
        bootstrap_resamples: every interval's resamples.
    """

    out: str = "results/scripts/outside"
    bench: str = DEFAULT_BENCH
    data_dir: str | None = None
    cache: str | None = None
    adaptive_window: int = 300
    gamma: float = 0.01
    cost_model: str = SIM_COST_MODEL
    decode_bound: int = 16
    burst: int = 8
    draws: int = 10
    sim_seed: int = 100
    bootstrap_resamples: int = 2000


def load_stream(out: Path) -> dict:
    """The served stream in finish order (a refit's time order): states, lengths, censoring, caps, the served
    prediction and raw quantiles, prompt tokens, the prompt (its token-id SHA-256), whether it is in the later
    half, and its prompt oracle. A prompt served more than once (a chunk cut short and served again) keeps its
    latest ``samples`` requests; requests of prompts ``samples.parquet`` does not list (a chunk still being served,
    or cut short) are left out and counted (``unlisted``).

    Raises:
        LenpredError: no logged request of a listed prompt (a log from another run), or a prompt with one sample."""
    from lenpred.io import read_parquet_checked
    from lenpred.online.traffic_log import read_traffic_log

    samples = read_parquet_checked(out / "samples.parquet").to_pylist()
    per_prompt = max(r["sample"] for r in samples) + 1
    order = {r["prompt_sha256"]: r["order"] for r in samples}
    log = read_traffic_log(out / "traffic")
    c = log.columns
    sha = c["prompt_sha256"]
    listed = np.array([h in order for h in sha])
    if not listed.any():
        raise LenpredError(f"no logged request of {out / 'traffic'} belongs to a prompt of "
                           f"{out / 'samples.parquet'}: a log from another run; serve into a fresh --out")
    keep = np.zeros(len(sha), bool)
    by_arrival = np.argsort(c["arrival_time_s"], kind="stable")
    seen: dict[str, int] = {}
    for i in by_arrival[::-1]:  # latest first; a chunk still running (or cut short) is not listed yet
        if listed[i] and seen.get(sha[i], 0) < per_prompt:
            seen[sha[i]] = seen.get(sha[i], 0) + 1
            keep[i] = True
    idx = np.flatnonzero(keep)
    idx = idx[np.argsort(c["finish_time_s"][idx], kind="stable")]
    rank = np.array([order[h] for h in sha[idx]])
    s = {"X": log.features[idx], "y": c["num_output_tokens"][idx].astype(np.float64),
         "censored": log.censored[idx], "caps": c["max_new_tokens"][idx].astype(np.float64),
         "expected": c["expected"][idx], "low_raw": c["low_raw"][idx], "high_raw": c["high_raw"][idx],
         "prompt_tokens": c["num_prompt_tokens"][idx].astype(np.float64), "prompt_id": sha[idx].astype(str),
         "later": rank >= np.median(sorted(set(order.values())))}
    s["prompt_oracle"] = _other_samples_mean(s["prompt_id"], s["y"])
    s["unlisted"] = np.full(len(idx), int((~listed).sum()))  # requests of prompts samples.parquet does not list
    if np.isnan(s["prompt_oracle"]).any():
        raise LenpredError("a prompt has one served sample: the prompt oracle needs another (serve with --samples 2)")
    return s


def _other_samples_mean(groups: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row, the mean of ``y`` over the other rows of its group (NaN when it has none)."""
    out = np.full(len(y), np.nan)
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        if len(rows) > 1:
            out[rows] = (y[rows].sum() - y[rows]) / (len(rows) - 1)
    return out


def refit_heads(shipped, s: dict, bench_rows) -> dict:
    """Heads trained on the earlier half's requests in time order: ``log`` (the shipped head's hyper-parameters,
    from scratch), ``log+bench`` (``bench_rows`` mixed in; skipped when ``None``) and ``finetuned`` (the shipped
    head trained further, epochs / learning rate chosen on the earlier half's latest 20 %)."""
    from lenpred.online.refit import TrafficRows, choose_finetune, finetune_head, fit_head

    e = ~s["later"]
    rows = TrafficRows(s["X"][e], s["y"][e], s["censored"][e], s["caps"][e], s["prompt_id"][e].astype(object),
                       np.full(int(e.sum()), "traffic", dtype=object))
    params, base = shipped.predictor_.params, shipped.predictor_.head_
    heads = {"refit: log": fit_head(rows, params["head"], params["seed"])}
    if bench_rows is not None:
        heads["refit: log + benchmark"] = fit_head(TrafficRows.concat([rows, bench_rows]), params["head"],
                                                   params["seed"])
    epochs, lr, _ = choose_finetune(base, rows, shipped.coverage, seed=params["seed"])
    heads["fine-tuned shipped head"] = finetune_head(base, rows, epochs, lr, params["seed"]) if epochs else base
    return heads


def run_outside(cfg: OutsideConfig) -> dict:
    """The study (module docstring); writes and returns the report."""
    from lenpred.intervals import widened_interval
    from lenpred.online.adaptive import AdaptiveConfig, replay_intervals
    from lenpred.pipeline import LengthPredictor
    from lenpred.prediction import head_quantiles
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.first_head import burst_cells, burst_jct, score
    from lenpred.studies.queue_sim import kv_cache_tokens
    from lenpred.traffic_refit import bench_train_rows

    out = Path(cfg.out)
    s = load_stream(out)
    shipped = LengthPredictor.from_pretrained()
    later, earlier = s["later"], ~s["later"]
    L = {k: v[later] for k, v in s.items()}
    line = np.polyfit(s["prompt_tokens"][earlier], s["y"][earlier], 1)
    expected = {"shipped": L["expected"], "constant": np.full(int(later.sum()), np.median(s["y"][earlier])),
                "prompt length": np.clip(np.polyval(line, L["prompt_tokens"]), 0, L["caps"]),
                "prompt oracle": L["prompt_oracle"]}
    bench_rows = bench_train_rows(shipped, cfg.bench, cfg.data_dir, cfg.cache)[0]
    for name, head in refit_heads(shipped, s, bench_rows).items():
        expected[name] = head_quantiles(head, L["X"], L["caps"], shipped.coverage)[0]
    fixed = widened_interval(s["low_raw"], s["high_raw"], shipped.margin_, s["caps"])
    aci = replay_intervals(s["low_raw"], s["high_raw"], s["y"], s["caps"], None, AdaptiveConfig(
        coverage=shipped.coverage, method="aci", window=cfg.adaptive_window, gamma=cfg.gamma,
        initial_margin=shipped.margin_))
    coverage = {name: {"later": float(((lo <= s["y"]) & (s["y"] <= hi))[later].mean()),
                       "all": float(((lo <= s["y"]) & (s["y"] <= hi)).mean()),
                       "mean_width_later": float(np.mean(hi[later] - lo[later]))}
                for name, (lo, hi) in (("fixed", fixed), ("aci", aci))}
    report = {"config": asdict(cfg), "num_requests": len(s["y"]), "num_later": int(later.sum()),
              "unlisted_requests_left_out": int(s.pop("unlisted")[0]),
              "num_prompts": len(set(s["prompt_id"])), "mean_output_tokens": float(s["y"].mean()),
              "censored_share": float(s["censored"].mean()), "nominal_coverage": shipped.coverage,
              "later_half": score(expected, L, cfg.bootstrap_resamples), "coverage": coverage,
              "burst": burst_cells(burst_jct(_draws(cfg, L, expected), list(expected), CostModel.load(cfg.cost_model),
                                             cfg.decode_bound, kv_cache_tokens(L["prompt_tokens"], L["caps"], cfg.decode_bound),
                                             cfg.sim_seed),
                                   {k: [k] for k in expected}, cfg.bootstrap_resamples)}
    from lenpred.io import write_json

    write_json(out / "outside.json", report)
    (out / "outside.md").write_text(render(report))
    return report


def _draws(cfg: OutsideConfig, L: dict, expected: dict) -> list[list]:
    """``draws`` bursts of ``burst``·D later-half requests (without replacement within a draw), each request
    carrying every ranking of ``expected``."""
    from lenpred.studies.workload import WorkloadRequest

    n = min(cfg.burst * cfg.decode_bound, len(L["y"]))
    draws = []
    for d in range(cfg.draws):
        rows = np.random.default_rng(cfg.sim_seed + d).choice(len(L["y"]), n, replace=False)
        draws.append([WorkloadRequest(request_id=i, prompt_token_ids=[], output_len=int(L["y"][r]),
                                      max_new_tokens=int(L["caps"][r]), scenario="outside",
                                      prompt_id=str(L["prompt_id"][r]),
                                      predictions={k: float(v[r]) for k, v in expected.items()},
                                      num_prompt_tokens=int(L["prompt_tokens"][r]), table_row=int(r))
                      for i, r in enumerate(rows)])
    return draws


def later_half_table(report: dict) -> str:
    """The later half's table (Markdown): every predictor's MAE, Kendall τ and burst gain, paired with the shipped
    head; ``docs/serving.md`` quotes it."""
    from lenpred.studies.scheduling_report import markdown

    c = report["config"]
    def fmt(v, d=1):  # a constant has no ranking: its τ is undefined
        return "–" if np.isnan(v[0]) else f"{v[0]:+.{d}f} [{v[1]:+.{d}f}, {v[2]:+.{d}f}]"

    rows = []
    for name, t in report["later_half"].items():
        b = report["burst"][name]
        rows.append([name, f"{t['mae'][0]:.1f} [{t['mae'][1]:.1f}, {t['mae'][2]:.1f}]",
                     "–" if name == "shipped" else fmt(t["mae_minus_shipped"]),
                     "–" if np.isnan(t["kendall_tau"]) else f"{t['kendall_tau']:.3f}",
                     "–" if name == "shipped" else fmt(t["tau_minus_shipped"], 3),
                     fmt([100 * v for v in b["jct_cut_vs_stock"]]) + " %",
                     "–" if name == "shipped" else fmt(b["share_of_shipped"], 2)])
    return markdown(["predictor", "MAE", "Δ MAE vs shipped", "Kendall τ", "Δ τ vs shipped",
                     f"burst of {c['burst']}·{c['decode_bound']}: mean-JCT cut vs stock",
                     "share of the shipped head's cut"], rows)


def render(report: dict) -> str:
    """``outside.md``: the settings, :func:`later_half_table` and the interval coverage."""
    from lenpred.studies.scheduling_report import markdown

    c = report["config"]
    cov = [[k, f"{v['later']:.3f}", f"{v['all']:.3f}", f"{v['mean_width_later']:.0f}"]
           for k, v in report["coverage"].items()]
    return "\n".join([
        "# Prompts from outside the benchmark, served through the plug-in", "",
        f"{report['num_requests']} requests ({report['num_prompts']} prompts, mean {report['mean_output_tokens']:.0f} "
        f"output tokens, {100 * report['censored_share']:.1f} % capped) from `{c['out']}`; scored on the later "
        f"half ({report['num_later']} requests), whose prompts the earlier half never saw. Paired with the shipped "
        "head; 95 % intervals (prompts clustered; the burst: requests clustered by draw).", "",
        later_half_table(report),
        f"Interval coverage (nominal {report['nominal_coverage']:.2f}):", "",
        markdown(["interval", "later half", "whole stream", "mean width, later half"], cov)])
