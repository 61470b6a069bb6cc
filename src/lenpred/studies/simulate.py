"""The simulator experiment of ``lenpred schedule simulate``: every policy × predictor on many seeded workload
draws, under each arrival process, with a measured cost model; paired bootstrap intervals over draws."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError, raise_first
from lenpred.serving.cost_model import CostModel
from lenpred.serving.policies import countdown_remaining, make_policy, progressive_remaining
from lenpred.serving.simulator import ARRIVALS, SimConfig, simulate
from lenpred.studies import DEFAULT_BENCH, report_dict
from lenpred.studies.paired import compare_draws, draw_mean
from lenpred.studies.workload import (DEFAULT_PREDICTORS, DEFAULT_PREDICTORS_DIR, DEFAULT_TABLE, check_predictors,
                                      draw_workload, load_workload_table, progressive_estimates)

logger = logging.getLogger(__name__)


@dataclass
class SimExperimentConfig:
    """Settings of the simulator experiment.

    Attributes:
        cost_model: calibrated cost model JSON (``lenpred schedule calibrate``).
        predictors: predictors whose static predictions rank requests (``oracle`` is always added).
        num_requests: requests per workload draw (from the whole test split, its own scenario mix).
        draws: workload draws (seeds ``seed .. seed + draws − 1``; the arrival process uses the same seed).
        max_num_seqs: concurrency limit of continuous batching and the static batch size.
        max_num_batched_tokens: continuous batching's per-step token budget.
        arrivals: arrival processes to run (``all``, ``poisson``, ``gamma``).
        load: Poisson / Gamma arrival rate as a share of the server's FCFS all-at-once throughput in requests/s
            (measured by the simulator on the first draw): < 1 keeps the queue finite, close to 1 makes it queue.
        cv: gamma inter-arrival coefficient of variation.
        aging_steps: vllm-ltr starvation guard for the ``+aging`` rows (``None``: no aging rows).
        bootstrap_resamples: draw-level paired bootstrap resamples.
        seed: first draw seed.
        out: result directory (``simulation.json``, ``simulation.md``, PNGs).
        progressive: ``lenpred progressive``'s ``test_estimates.parquet``: adds a ``srpt:<method>`` row per
            progressive method (PLP, TRAIL-progressive, the static head conditioned on still running), ranked by
            the method's latest re-prediction (:func:`~lenpred.serving.policies.progressive_remaining`), with
            TRAIL's preemption limit on its step-0 estimate; ``None`` or a missing file: no such rows.
        workload: the prediction table of ``lenpred schedule predictions`` (its ``--out``); never rebuilt here.
        bench, predictors_dir: the benchmark and saved predictors the table must have been built from (its
            freshness check, :func:`lenpred.studies.workload.load_workload_table`).
    """

    cost_model: str = "results/scheduling/cost_transformers.json"
    predictors: tuple[str, ...] = DEFAULT_PREDICTORS
    num_requests: int = 200
    draws: int = 20
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    arrivals: tuple[str, ...] = ("all", "poisson", "gamma")  # the committed results/scheduling/simulation.json
    load: float = 0.9
    cv: float = 2.0
    aging_steps: int | None = 200
    bootstrap_resamples: int = 2000
    seed: int = 0
    out: str = "results/scheduling"
    progressive: str | None = "results/progressive/test_estimates.parquet"
    progressive_methods: tuple[str, ...] = ()  # filled from the file by run_simulation
    workload: str = str(DEFAULT_TABLE)
    bench: str = DEFAULT_BENCH
    predictors_dir: str = DEFAULT_PREDICTORS_DIR

    def __post_init__(self):
        checks = [(self.draws < 2, f"--draws must be >= 2 (the intervals resample draws), got {self.draws}"),
                  (self.num_requests < 2, f"--num-requests must be >= 2, got {self.num_requests}"),
                  (not 0 < self.load, f"--load must be > 0, got {self.load}"),
                  (not 0 < self.cv, f"--cv must be > 0 (1 = Poisson; > 1 burstier), got {self.cv}")]
        raise_first(checks)

        bad = [a for a in self.arrivals if a not in ARRIVALS or a == "given"]
        if bad:
            raise LenpredError(f"--arrivals: unknown process {', '.join(bad)}; use any of all, poisson, gamma")

    def policies(self) -> list[tuple[str, int | None]]:
        """``(policy spec, aging steps)`` rows of the continuous-batching table."""
        preds = [*self.predictors, "oracle"]
        rows = [("fcfs", None), ("random", None)] + [(f"sjf:{p}", None) for p in preds]
        rows += [(f"srpt:{p}", None) for p in (*preds, *self.progressive_methods)]
        if self.aging_steps:
            rows += [(f"sjf:{p}", self.aging_steps) for p in preds]
        return rows

    def static_policies(self) -> list[str]:
        return ["fcfs", "random", *(f"sjf:{p}" for p in [*self.predictors, "oracle"])]


@dataclass
class SimReport:
    """What :func:`run_simulation` returns; :meth:`to_dict` is the content of ``simulation.json`` (key for key),
    which :func:`lenpred.studies.scheduling_report.save_simulation_report` renders and writes.

    Attributes:
        config: the resolved :class:`SimExperimentConfig` (``progressive_methods`` filled), as ``asdict`` gives it.
        arrival_rate_per_s: the Poisson / Gamma rate (requests/s): ``load`` x the first draw's FCFS throughput.
        cost_model: the cost model's fields (``asdict`` of :class:`~lenpred.serving.cost_model.CostModel`).
        runs: ``{"<batching>/<arrival>/<policy label>": [summary per draw]}`` (metrics of
            :func:`lenpred.serving.metrics.summarize`).
        jct_draw0: per row, the per-request JCTs (s) of draw 0 (the CDF plot).
        summary: :func:`summarize_runs` (per-row bootstrap means, oracle-gain shares, padding).
    """

    config: dict
    arrival_rate_per_s: float
    cost_model: dict
    runs: dict
    jct_draw0: dict
    summary: dict

    def to_dict(self) -> dict:
        """The ``simulation.json`` content, in its key order."""
        return report_dict(self)


def _rate(table, cfg: SimExperimentConfig, cost) -> float:
    """Arrival rate (requests/s) = load × FCFS all-at-once throughput of the first draw."""
    requests = draw_workload(table, cfg.num_requests, cfg.seed)
    summary, _ = simulate(requests, make_policy("fcfs"), cost,
                          SimConfig(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens))
    return cfg.load * cfg.num_requests / summary["makespan_s"]


def run_simulation(cfg: SimExperimentConfig, table=None) -> SimReport:
    """Every continuous-batching policy row under every arrival process and every static-batching grouping, on
    ``cfg.draws`` workload draws. Returns the :class:`SimReport` (``lenpred.studies.scheduling_report`` renders and
    saves its :meth:`~SimReport.to_dict`): per row and draw the summary metrics, per-request JCTs of draw 0 (CDF
    plot), and bootstrap summaries. ``table``: the workload table (``None``: read from ``cfg.workload``)."""
    from tqdm.auto import tqdm

    cost = CostModel.load(cfg.cost_model)
    table = table if table is not None else load_workload_table(cfg.workload, cfg.bench, cfg.predictors_dir,
                                                                token_ids=False, rebuild=False)
    check_predictors(table, cfg.predictors)
    progressive = {}
    if cfg.progressive and Path(cfg.progressive).exists():
        progressive = progressive_estimates(cfg.progressive, table)
        cfg = replace(cfg, progressive_methods=tuple(progressive))
    elif cfg.progressive:
        logger.warning("no %s: no srpt rows driven by progressive re-predictions (run `lenpred progressive` to write "
                       "it)", cfg.progressive)
    steps = tuple(sorted({t for est in progressive.values() for by_step in est.values() for t in by_step}))
    rate = _rate(table, cfg, cost)
    settings = [("continuous", a) for a in cfg.arrivals] + [("static", "all")]
    runs: dict[str, dict[str, list]] = {}
    jct_draw0: dict[str, list[float]] = {}
    total = cfg.draws * (len(cfg.arrivals) * len(cfg.policies()) + len(cfg.static_policies()))
    with tqdm(total=total, desc="simulate", unit="run") as bar:
        for d in range(cfg.draws):
            requests = draw_workload(table, cfg.num_requests, cfg.seed + d)
            for r in requests:  # a progressive method's static prediction is its step-0 estimate
                r.predictions |= {m: est[r.table_row][0] for m, est in progressive.items()}
            for batching, arrival in settings:
                sim = SimConfig(batching=batching, max_num_seqs=cfg.max_num_seqs,
                                max_num_batched_tokens=cfg.max_num_batched_tokens, arrival=arrival,
                                rate_per_s=rate, cv=cfg.cv, seed=cfg.seed + d)
                rows = cfg.policies() if batching == "continuous" else [(p, None) for p in cfg.static_policies()]
                for spec, aging in rows:
                    method = spec.partition(":")[2]
                    kw = {}
                    if spec.startswith("srpt:") and method in progressive:
                        kw["remaining"] = progressive_remaining(progressive[method], countdown_remaining(method),
                                                                steps=steps, key=lambda r: r.table_row)
                    policy = make_policy(spec, aging_steps=aging, seed=cfg.seed + d, **kw)
                    summary, timings = simulate(requests, policy, cost, sim)
                    key = f"{batching}/{arrival}/{policy.label}"
                    runs.setdefault(key, []).append(summary)
                    if d == 0:
                        jct_draw0[key] = [t.jct_s for t in timings]
                    bar.update()
    return SimReport(asdict(cfg), rate, asdict(cost), runs, jct_draw0, summarize_runs(runs, cfg))


METRICS = ("throughput_tok_s", "mean_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s", "mean_ttft_s",
           "mean_normalised_latency_s_per_tok", "num_preemptions", "padding_ratio")


def summarize_runs(runs: dict[str, list[dict]], cfg: SimExperimentConfig) -> dict:
    """Per row: mean over draws of each metric with a bootstrap interval; per setting and length policy: the share
    of the oracle's mean-JCT gain over FCFS that each predictor recovers,
    ``(JCT_fcfs − JCT_pred) / (JCT_fcfs − JCT_oracle)`` (ratio of draw means, paired bootstrap over draws)."""
    out: dict[str, dict] = {"rows": {}, "gain_share": {}, "padding": {}}
    for key, summaries in runs.items():
        row = {}
        for m in METRICS:
            vals = np.array([s[m] for s in summaries if s[m] is not None], dtype=np.float64)
            if len(vals) == len(summaries):
                row[m] = draw_mean(vals, cfg.bootstrap_resamples)
        out["rows"][key] = row
    settings = sorted({k.rsplit("/", 1)[0] for k in runs})
    for setting in settings:
        fcfs = f"{setting}/fcfs"
        for name in ("sjf", "srpt"):
            oracle = f"{setting}/{name}:oracle"
            if fcfs not in runs or oracle not in runs:
                continue
            for p in (*cfg.predictors, *cfg.progressive_methods):
                key = f"{setting}/{name}:{p}"
                if key not in runs:
                    continue
                per = lambda r: np.array([s["mean_jct_s"] for s in runs[r]])  # noqa: E731
                out["gain_share"][key] = compare_draws("oracle_share", per(fcfs), per(key), cfg.bootstrap_resamples,
                                                       oracle=per(oracle))
    for key, summaries in runs.items():
        if key.startswith("static/"):
            out["padding"][key.rsplit("/", 1)[1]] = out["rows"][key]["padding_ratio"]
    return out
