"""Parked decoding in the simulator (``scripts/parked_simulation.py``): stock continuous batching (FCFS; SJF by
prediction at admission, which an engine cannot do, since the prediction exists only after the prefill) against
parked FCFS / SJF / SRPT ranked by the shipped head, by each progressive estimator's re-predictions (PLP,
TRAIL-progressive, the static head conditioned on the tokens generated), by the prompt oracle
(:func:`lenpred.studies.workload.table_prompt_oracle`) and by the recorded length; all-at-once and Poisson arrivals
at 0.9 × the FCFS throughput of the first draw. Comparisons are paired over requests clustered by draw
(:func:`lenpred.studies.paired.compare`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from lenpred.errors import raise_first
from lenpred.studies.paired import compare

STOCK = ("fcfs", "sjf:last (admission, not reachable in-engine)", "sjf:oracle (admission)")
"""The stock rows: ``sjf:<predictor>`` ordered at admission by that prediction."""


@dataclass
class ParkedSimConfig:
    """Settings of the parked-decoding simulation.

    Attributes:
        draws: workload draws; draw d uses seed d (requests and arrivals).
        num_requests: requests per draw.
        decode_slots: requests decoding per step (stock: ``max_num_seqs``).
        max_idle_s: the parked policies' starvation guard, s parked before promotion; ``None``: off.
        cost_model: the simulator's cost model (``lenpred schedule calibrate``).
        prefill_scale: multiplies the prefill coefficients (p0, p1, p2): < 1 models an engine whose prefill is
            cheaper relative to decode (a GPU), where prefill on arrival costs less.
        max_tokens: clip every cap (and recorded length and prediction) to this many tokens; ``None``: none.
        prefill_ahead: the parked policies' prefill-ahead bound; ``None``: every arrival prefilled as it fits.
        bootstrap_resamples: resamples of every interval.
        out: output path prefix (``.json``, ``.md``).
    """

    draws: int = 10
    num_requests: int = 200
    decode_slots: int = 8
    max_idle_s: float | None = None
    cost_model: str = "results/scheduling/cost_transformers.json"
    prefill_scale: float = 1.0
    max_tokens: int | None = None
    prefill_ahead: int | None = None
    bootstrap_resamples: int = 2000
    out: str = "results/scripts/serving/parked_simulation"

    def __post_init__(self):
        raise_first([(self.draws < 1, "draws must be >= 1"), (self.num_requests < 1, "num_requests must be >= 1"),
                     (self.decode_slots < 1, "decode_slots must be >= 1"),
                     (self.max_tokens is not None and self.max_tokens < 1, "max_tokens must be >= 1")])


def _clip(r, max_tokens: int | None) -> None:
    if max_tokens is not None:
        r.max_new_tokens = min(r.max_new_tokens, max_tokens)
        r.output_len = min(r.output_len, max_tokens)
        r.predictions = {k: min(v, max_tokens) for k, v in r.predictions.items()}


def _parked_rows(progressive: dict) -> dict:
    """``name -> (parked policy, predictor, remaining-length callback)`` of the parked rows."""
    from lenpred.serving.policies import countdown_remaining, progressive_remaining

    steps = tuple(sorted({t for est in progressive.values() for by in est.values() for t in by}))
    rows = {"parked_fcfs": ("fcfs", None, None), "parked_sjf:last": ("sjf", "last", None),
            "parked_srpt:last (countdown)": ("srpt", "last", None),
            "parked_sjf:prompt_oracle": ("sjf", "prompt_oracle", None), "parked_sjf:oracle": ("sjf", "oracle", None)}
    for m in progressive:
        rows[f"parked_srpt:{m}"] = ("srpt", m, progressive_remaining(
            progressive[m], countdown_remaining("last"), steps=steps, key=lambda r: r.table_row))
    return rows


def _one_draw(cfg: ParkedSimConfig, reqs: list, cost, stock, d: int, rate: float, parked: dict) -> dict:
    """Per ``<arrivals>/<row>``: the draw's per-request JCTs ``(n,)`` s in request order."""
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import simulate
    from lenpred.studies.queue_sim import run_parked

    out = {}
    for arrival in ("all", "poisson"):
        sim_cfg = dataclasses.replace(stock, arrival=arrival, rate_per_s=rate, seed=d)
        parked_cfg = dataclasses.replace(sim_cfg, max_num_seqs=10_000)
        runs = {name: simulate(reqs, make_policy(name.split(" ")[0]), cost, sim_cfg)[1] for name in STOCK}
        for name, (policy, pred, remaining) in parked.items():
            runs[name] = run_parked(reqs, cost, parked_cfg, policy=policy, predictor=pred,
                                    decode_slots=cfg.decode_slots, max_idle_s=cfg.max_idle_s,
                                    prefill_ahead=cfg.prefill_ahead, remaining=remaining)[1]
        for name, timings in runs.items():
            out[f"{arrival}/{name}"] = np.array([t.jct_s for t in sorted(timings, key=lambda t: t.request_id)])
    return out


def run(cfg: ParkedSimConfig) -> dict:
    """Every row on ``cfg.draws`` draws of the committed workload table; the report: ``settings``, ``rate_per_s``,
    ``per_draw_mean_jct_s`` and per ``<arrivals>/<row>`` the mean JCT (interval over draws), the paired mean-JCT cut
    vs FCFS, the shares of the parked oracle's and the prompt oracle's gains over FCFS and the difference to the
    prompt oracle (s)."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import SimConfig, simulate
    from lenpred.studies.paired import draw_mean
    from lenpred.studies.workload import draw_workload, load_workload_table, progressive_estimates, table_prompt_oracle

    cost = CostModel.load(cfg.cost_model)
    for k in ("p0", "p1", "p2"):
        cost.coefficients[k] *= cfg.prefill_scale
    table = load_workload_table(token_ids=False, rebuild=False)
    progressive = progressive_estimates("results/progressive/test_estimates.parquet", table)
    oracle_p = table_prompt_oracle(table, cfg.max_tokens)
    stock = SimConfig(max_num_seqs=cfg.decode_slots, max_num_batched_tokens=2048)
    first = draw_workload(table, cfg.num_requests, 0)
    for r in first:
        _clip(r, cfg.max_tokens)
    rate = 0.9 * cfg.num_requests / simulate(first, make_policy("fcfs"), cost, stock)[0]["makespan_s"]
    parked = _parked_rows(progressive)
    jct: dict[str, list[np.ndarray]] = {}
    for d in range(cfg.draws):
        reqs = draw_workload(table, cfg.num_requests, d)
        for r in reqs:
            _clip(r, cfg.max_tokens)
            r.predictions["prompt_oracle"] = float(oracle_p[r.table_row])
            r.predictions |= {m: min(est[r.table_row][0], r.max_new_tokens) for m, est in progressive.items()}
        for key, x in _one_draw(cfg, reqs, cost, stock, d, rate, parked).items():
            jct.setdefault(key, []).append(x)
        print(f"draw {d} done", flush=True)
    per_draw = {key: [float(x.mean()) for x in xs] for key, xs in jct.items()}
    report = {"settings": dataclasses.asdict(cfg), "rate_per_s": rate, "per_draw_mean_jct_s": per_draw, "rows": {}}
    n = cfg.bootstrap_resamples
    for key, x in jct.items():
        arrival = key.split("/", 1)[0]
        base, orc, porc = (jct[f"{arrival}/{k}"] for k in ("fcfs", "parked_sjf:oracle", "parked_sjf:prompt_oracle"))
        report["rows"][key] = {
            "mean_jct_s": draw_mean(per_draw[key], n),
            "jct_cut_vs_fcfs": compare("mean_cut", base, x, n),
            "share_of_oracle": compare("oracle_share", base, x, n, oracle=orc),
            "share_of_prompt_oracle": compare("oracle_share", base, x, n, oracle=porc),
            "minus_prompt_oracle_s": compare("mean_diff", porc, x, n)}
    return report


def markdown(report: dict) -> str:
    """The report as Markdown: settings, then one row per arrivals / policy (estimate [95 % interval])."""
    from lenpred.tables import markdown_table

    f = lambda t, p=1: f"{t[0]:.{p}f} [{t[1]:.{p}f}, {t[2]:.{p}f}]"  # noqa: E731
    rows = [[key, f(c["mean_jct_s"]), f(c["jct_cut_vs_fcfs"], 3), f(c["share_of_oracle"], 2),
             f(c["share_of_prompt_oracle"], 2), f(c["minus_prompt_oracle_s"])] for key, c in report["rows"].items()]
    lines = ["# Parked decoding in the simulator", "",
             f"settings: {report['settings']}; Poisson rate {report['rate_per_s']:.4f} req/s", "",
             markdown_table(["arrivals / policy", "mean JCT s", "cut vs FCFS", "share of parked oracle",
                             "share of prompt oracle", "minus prompt oracle (s)"], rows)]
    return "\n".join(lines) + "\n"
