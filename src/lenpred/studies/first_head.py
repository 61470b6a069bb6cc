"""Study: how many served requests a new deployment's first head needs (issue 48, item 2).

SmolLM2 is treated as a model lenpred has no head for. A stream of the benchmark's **train**-split requests (every
sample a request, in a seeded random order) is logged the way the plug-in logs with no head
(:mod:`lenpred.online.capture`: the final prompt token's layer-15 state, float16, the outcome, no prediction), and
``lenpred train --traffic`` 's own path (:meth:`lenpred.pipeline.LengthPredictor.from_traffic`: the earliest 70 %
train, the next 10 % calibrate, the shipped head's hyper-parameters) trains a head on the stream's first n requests,
for each n of ``sizes``, saved under ``<out>/heads/first-<n>`` (what the engine's draw serves with). Each head is then scored where the shipped head is:

* on the **test** split (MAE with a prompt-clustered interval, Kendall τ; both paired with the shipped head);
* in the simulator's burst of ``burst``·D (D = ``decode_bound``; ``draws`` draws of test requests; the cost model of
  the machine that ran the engine): the plug-in's design (parked SRPT, a window of D, prompts prefilled shortest
  first) ranked by each head, its mean-JCT cut vs stock FCFS and its share of the shipped head's cut, paired by draw
  (:func:`lenpred.studies.paired.compare`).

The states are the signal cache's layer-15 last-token states: the ones the engine captures
(``tests/serving/vllm/test_vllm_plugin.py`` checks the engine's states equal transformers' and its predictions
equal ``LengthPredictor``'s on the same states). Output: ``first_head.json``, ``first_head.md`` and
``learning_curve.png`` under ``out``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError, raise_first
from lenpred.io import write_json
from lenpred.studies import DEFAULT_BENCH

SIM_COST_MODEL = "results/scripts/serving/queue_guard/cost/cost_vllm_1core_sampled.json"


@dataclass
class FirstHeadConfig:
    """Settings of :func:`run_first_head` (``scripts/first_head_curve.py``).

    Attributes:
        bench: the benchmark; its train split is the served stream, its test split scores the heads.
        sizes: logged requests (the stream's first n) each head is trained from.
        streams: stream orders (seeds ``seed`` .. ``seed + streams - 1``): every size is trained once per order, and
            its scores pool the orders (one order's luck is not the size's).
        seed: the first stream's order (the heads use LengthPredictor's default seed, as `lenpred train` does).
        data_dir, cache: prompt data and signal-cache directories (``None``: defaults).
        log_root: where each stream prefix's traffic log is written (``None``: ``<out>/logs``, not committed).
        cost_model: the simulator's engine cost model; decode_bound: D; burst: the burst is ``burst``·D requests;
        draws: simulator draws (seed ``sim_seed`` + d).
        bootstrap_resamples: every paired interval's resamples.
        out: the results directory.
    """

    bench: str = DEFAULT_BENCH
    sizes: tuple[int, ...] = (250, 500, 1000, 2000)
    streams: int = 5
    seed: int = 0
    data_dir: str | None = None
    cache: str | None = None
    log_root: str | None = None
    cost_model: str = SIM_COST_MODEL
    decode_bound: int = 16
    burst: int = 8
    draws: int = 10
    sim_seed: int = 100
    bootstrap_resamples: int = 2000
    out: str = "results/scripts/first_head"

    def __post_init__(self):
        self.sizes = tuple(sorted({int(n) for n in self.sizes}))
        raise_first([(not self.sizes or self.sizes[0] < 40, "--sizes must be >= 40 requests each (a log of n trains "
                       "on 0.7 n and calibrates an 80 % interval on 0.1 n)"),
                     (self.decode_bound < 1 or self.burst < 1 or self.draws < 1 or self.streams < 1,
                      "--decode-bound, --burst, --draws and --streams must be >= 1"),
                     (self.bootstrap_resamples < 100, "--bootstrap-resamples must be >= 100")])


def log_stream(rows: dict, n: int, capture, directory: Path) -> Path:
    """Write the stream's first ``n`` requests as the plug-in with no head writes them (a fresh directory): the
    state (float16), the outcome, the cap, no prediction, finish times one second apart in stream order."""
    from lenpred.io import atomic_path
    from lenpred.online.learning import OnlineLearning
    from lenpred.online.traffic_log import TrafficLogConfig
    from lenpred.outcome import RequestOutcome

    with atomic_path(directory) as tmp:
        online = OnlineLearning(capture, log=TrafficLogConfig(tmp))
        for i in range(n):
            served = online.capture(rows["X"][i], int(rows["prompt_tokens"][i]), int(rows["caps"][i]))
            y = int(rows["y"][i])
            online.finished(served, RequestOutcome(
                request_id=str(i), num_output_tokens=y, finish_reason="length" if rows["censored"][i] else "stop",
                max_new_tokens=int(rows["caps"][i]), arrival_time_s=float(i), first_token_time_s=i + 0.1,
                finish_time_s=i + 1.0))
        online.close()
    return directory


def split_rows(shipped, data, split: str) -> dict:
    """A split's pooled states (what the engine captures), lengths, censoring, caps, prompt lengths and prompt ids."""
    idx = data.index[split]
    return {"X": shipped.predictor_.features(data.rows(split)), "y": data.y[idx].astype(np.float64),
            "censored": data.censored[idx], "caps": data.cols["max_new_tokens"][idx].astype(np.float64),
            "prompt_tokens": data.cols["num_prompt_tokens"][idx], "prompt_id": data.cols["prompt_id"][idx].astype(str)}


def score(expected: dict[str, np.ndarray], test: dict, n_resamples: int,
          groups: dict[str, list[str]] | None = None) -> dict:
    """Per group (default: each prediction alone) on the test rows: MAE of the members' mean absolute error per
    request (prompt-clustered interval) and its paired difference to ``expected["shipped"]``; Kendall τ (the
    members' mean) and, for one member, the paired τ difference; with several members also each one's MAE and τ."""
    from scipy.stats import kendalltau

    from lenpred.metrics import clustered_bootstrap
    from lenpred.studies.traffic import paired_tau_bootstrap

    y, ids = test["y"], test["prompt_id"]
    ref_err = np.abs(expected["shipped"] - y)
    out = {}
    for name, members in (groups or {k: [k] for k in expected}).items():
        err = np.mean([np.abs(expected[m] - y) for m in members], axis=0)
        taus = [float(kendalltau(expected[m], y).statistic) for m in members]
        cell = {"mae": list(clustered_bootstrap(err, ids, n_resamples)), "kendall_tau": float(np.mean(taus)),
                "mae_minus_shipped": list(clustered_bootstrap(err - ref_err, ids, n_resamples))}
        if len(members) == 1 and np.ptp(expected[members[0]]) == 0:  # a constant ranks nothing: τ undefined
            cell["tau_minus_shipped"] = [float("nan")] * 3
        elif len(members) == 1:
            cell["tau_minus_shipped"] = paired_tau_bootstrap(y, expected[members[0]], expected["shipped"], ids,
                                                             n_resamples)["diff"]
        else:
            cell["per_stream"] = {"mae": [float(np.abs(expected[m] - y).mean()) for m in members],
                                  "kendall_tau": taus}
        out[name] = cell
    return out


def simulate_burst(cfg: FirstHeadConfig, expected: dict[str, np.ndarray], test: dict) -> dict[str, list]:
    """:func:`burst_jct` on ``draws`` bursts of test requests (the workload table's rows, which must be the test
    split's in order), every ranking of ``expected`` on each."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.queue_sim import draw, kv_tokens
    from lenpred.studies.workload import load_workload_table, table_prompt_oracle

    table = load_workload_table(bench=cfg.bench, token_ids=False)
    if (table.column("prompt_id").to_pylist() != test["prompt_id"].tolist()
            or not np.array_equal(table.column("output_len").to_numpy(), test["y"].astype(np.int64))):
        raise LenpredError("the workload table's rows are not the benchmark's test split in order: rebuild it "
                           "(lenpred.studies.workload.build_workload_table)")
    shipped_gap = np.abs(expected["shipped"] - table.column("pred_last").to_numpy()).max()
    if shipped_gap > 0.5:  # the states pooled here are not the ones the shipped predictions were made from
        raise LenpredError(f"the shipped head's test predictions from the signal cache differ from the workload "
                           f"table's by up to {shipped_gap:.2f} tokens: a stale signal cache (delete it) or table")
    oracle_p = table_prompt_oracle(table)
    draws = []
    for d in range(cfg.draws):
        reqs = draw(table, oracle_p, cfg.burst * cfg.decode_bound, cfg.sim_seed + d)
        for r in reqs:
            r.predictions.update({name: float(p[r.table_row]) for name, p in expected.items()})
        draws.append(reqs)
    return burst_jct(draws, list(expected), CostModel.load(cfg.cost_model), cfg.decode_bound,
                     kv_tokens(table, cfg.decode_bound), cfg.sim_seed)


def burst_jct(draws: list[list], names: list[str], cost, D: int, kv_cache_tokens: int, seed: int
              ) -> dict[str, list[np.ndarray]]:
    """Per ranking ``names[i]`` (a key of every request's ``predictions``) and ``stock``: each draw's JCTs (s,
    request by request) of its burst (all at ``t = 0``) in the simulator, under the plug-in's design (parked SRPT, D
    slots, a window of D, prompts prefilled shortest first) or, for ``stock``, FCFS at D."""
    from lenpred.serving.simulator import SimConfig
    from lenpred.studies.queue_sim import BLOCK_SIZE, run_mode, run_parked

    jct: dict[str, list[np.ndarray]] = {m: [] for m in ["stock", *names]}
    for d, reqs in enumerate(draws):
        base = SimConfig(max_num_seqs=D, max_num_batched_tokens=8192, arrival="all", seed=seed + d,
                         kv_cache_tokens=kv_cache_tokens, block_size=BLOCK_SIZE)
        jct["stock"].append(_jct(run_mode("stock", reqs, cost, base, None)))
        plugin = dataclasses.replace(base, max_num_seqs=2 * D)
        for name in names:
            jct[name].append(_jct(run_parked(reqs, cost, plugin, policy="srpt", predictor=name, decode_slots=D,
                                             max_idle_s=None, prefill_ahead=D, admit_by="prompt_len")[1]))
    return jct


def burst_cells(jct: dict[str, list[np.ndarray]], groups: dict[str, list[str]], n_resamples: int) -> dict:
    """Per group (a name and the rankings it pools, e.g. one size's heads over the stream orders): mean JCT, the
    mean-JCT cut vs stock, p99 / stock's and (every group but ``shipped``) the share of the shipped head's cut,
    paired, requests clustered by draw (a draw's cluster holds its requests under every member, each beside the
    same request under stock and the shipped head; :func:`lenpred.studies.paired.compare`)."""
    from lenpred.studies.paired import compare

    out = {"stock": {"mean_jct_s": float(np.concatenate(jct["stock"]).mean())}}
    for name, members in groups.items():
        mode = [np.concatenate([jct[m][d] for m in members]) for d in range(len(jct["stock"]))]
        ref = [np.tile(x, len(members)) for x in jct["stock"]]
        ship = [np.tile(x, len(members)) for x in jct["shipped"]]
        out[name] = {"mean_jct_s": float(np.concatenate(mode).mean()),
                     "jct_cut_vs_stock": list(compare("mean_cut", ref, mode, n_resamples)),
                     "p99_ratio_vs_stock": list(compare("p99_ratio", ref, mode, n_resamples))}
        if name != "shipped":
            out[name]["share_of_shipped"] = list(compare("oracle_share", ref, mode, n_resamples, oracle=ship))
    return out


def _jct(timings) -> np.ndarray:
    return np.array([t.jct_s for t in sorted(timings, key=lambda t: t.request_id)])


def run_first_head(cfg: FirstHeadConfig) -> dict:
    """The study (module docstring); writes and returns the report."""
    from lenpred.backbone import load_backbone, recorded_model_name
    from lenpred.dataset import load_eval_data
    from lenpred.online.capture import HeadlessCapture
    from lenpred.pipeline import LengthPredictor
    from lenpred.prediction import head_quantiles
    from lenpred.studies.traffic_data import STREAM_LAYERS, split_prompt_ids, stream_signals

    backbone = load_backbone()
    shipped = LengthPredictor.from_pretrained(backbone=backbone)
    data = load_eval_data(cfg.bench, backbone.tokenizer, cfg.data_dir)
    stream_signals(data, backbone, cfg.cache, split_prompt_ids(data, "train") + split_prompt_ids(data, "test"),
                   cfg.bench)
    train, test = split_rows(shipped, data, "train"), split_rows(shipped, data, "test")
    if cfg.sizes[-1] > len(train["y"]):
        raise LenpredError(f"--sizes {cfg.sizes[-1]} exceeds the train split's {len(train['y'])} requests")
    capture = HeadlessCapture(recorded_model_name(backbone.model_id), backbone.revision, STREAM_LAYERS[0],
                              train["X"].shape[1], shipped.config_.template_rule)
    root = Path(cfg.log_root or Path(cfg.out) / "logs")
    expected = {"shipped": head_quantiles(shipped.predictor_.head_, test["X"], test["caps"], shipped.coverage)[0]}
    heads, groups = {}, {"shipped": ["shipped"]}
    for k in range(cfg.streams):
        order = np.random.default_rng(cfg.seed + k).permutation(len(train["y"]))
        stream = {key: v[order] for key, v in train.items()}
        for n in cfg.sizes:  # `lenpred train --traffic LOG --out DIR`, as a user runs it
            name = f"first_{n}@{k}"
            head = LengthPredictor.from_traffic(log_stream(stream, n, capture, root / f"stream{k}-first-{n}"))
            saved = head.save_pretrained(Path(cfg.out) / "heads" / f"first-{n}") if k == 0 else None
            expected[name] = head_quantiles(head.predictor_.head_, test["X"], test["caps"], head.coverage)[0]
            heads[name] = {"logged": n, "stream": k, "trained_on": head.config_.training_traffic.num_train,
                           "margin": head.margin_, "card": head.card_, "saved": saved and str(saved)}
            groups.setdefault(f"first_{n}", []).append(name)
            print(f"stream {k}: first head from {n} logged requests trained", flush=True)
    report = {"config": asdict(cfg), "num_train_stream": len(train["y"]), "num_test": len(test["y"]),
              "heads": heads, "test": score(expected, test, cfg.bootstrap_resamples, groups),
              "burst": burst_cells(simulate_burst(cfg, expected, test), groups, cfg.bootstrap_resamples)}
    save(report, Path(cfg.out))
    return report


def summary_table(report: dict) -> str:
    """The report's table (Markdown): one row per size (its heads over the stream orders pooled) and the shipped
    head; ``docs/serving.md`` quotes it."""
    from lenpred.studies.scheduling_report import markdown

    fmt = lambda v, d=1: f"{v[0]:+.{d}f} [{v[1]:+.{d}f}, {v[2]:+.{d}f}]"  # noqa: E731
    rows = []
    for name, t in report["test"].items():
        b, spread = report["burst"][name], t.get("per_stream", {})
        share = b.get("share_of_shipped")
        maes = spread.get("mae")
        rows.append(["shipped head" if name == "shipped" else f"first head, {name.split('_')[1]} logged",
                     f"{t['mae'][0]:.1f} [{t['mae'][1]:.1f}, {t['mae'][2]:.1f}]",
                     "–" if maes is None else f"{min(maes):.1f}–{max(maes):.1f}",
                     "–" if name == "shipped" else fmt(t["mae_minus_shipped"]), f"{t['kendall_tau']:.3f}",
                     fmt([100 * v for v in b["jct_cut_vs_stock"]]) + " %", f"{b['p99_ratio_vs_stock'][0]:.2f}",
                     "–" if share is None else fmt(share, 2)])
    return markdown(["head", "test MAE", "MAE over orders", "Δ MAE vs shipped", "Kendall τ",
                     "burst mean-JCT cut vs stock", "p99 / stock", "share of the shipped head's cut"], rows)


def render(report: dict) -> str:
    """``first_head.md``: the settings and :func:`summary_table`."""
    c = report["config"]
    return "\n".join([
        "# A new deployment's first head: how many served requests it needs", "",
        f"Streams: `{c['bench']}` train split, {report['num_train_stream']} requests in {c['streams']} seeded orders "
        f"(seeds {c['seed']}..{c['seed'] + c['streams'] - 1}), logged as the plug-in logs with no head; per order and "
        "size n, a head trained by `lenpred train --traffic`'s path on the order's first n requests (70 % train, "
        f"10 % calibrate). Scored on the test split ({report['num_test']} requests: MAE of the orders' mean error per "
        f"request, Kendall τ the orders' mean) and in the simulator's burst of {c['burst']}·D (D = "
        f"{c['decode_bound']}, {c['draws']} draws, `{c['cost_model']}`): the plug-in's design ranked by each head. "
        "Paired with the shipped head; 95 % intervals (test: prompts clustered; burst: requests clustered by draw, "
        "every order's requests in their draw's cluster).", "", summary_table(report)])


def save(report: dict, out: Path) -> None:
    """``first_head.json``, ``first_head.md`` and ``learning_curve.png`` under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "first_head.json", report)
    (out / "first_head.md").write_text(render(report))
    names = [n for n in report["test"] if n != "shipped"]
    sizes = [int(n.split("_")[1]) for n in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, pick, label in ((a, "test", lambda v: v["mae"], "test MAE, tokens"),
                                 (b, "burst", lambda v: [100 * x for x in v["jct_cut_vs_stock"]],
                                  f"burst of {report['config']['burst']}·D: mean-JCT cut vs stock, %")):
        vals = np.array([pick(report[key][n]) for n in names])
        ax.errorbar(sizes, vals[:, 0], yerr=[vals[:, 0] - vals[:, 1], vals[:, 2] - vals[:, 0]], marker="o",
                    capsize=3, label="first head (the traffic log alone)")
        if key == "test":
            for n, x in zip(names, sizes):
                ax.scatter([x] * len(report[key][n]["per_stream"]["mae"]), report[key][n]["per_stream"]["mae"],
                           s=8, color="C0", alpha=0.4)
        ship = pick(report[key]["shipped"])
        ax.axhline(ship[0], color="k", ls="--", label="shipped head (the benchmark)")
        ax.axhspan(ship[1], ship[2], color="k", alpha=0.08)
        ax.set_xscale("log")
        ax.set_xticks(sizes, [str(x) for x in sizes])
        ax.minorticks_off()
        ax.set_xlabel("logged requests")
        ax.set_ylabel(label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=120)
    plt.close(fig)
