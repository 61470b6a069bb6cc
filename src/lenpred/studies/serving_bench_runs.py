"""The serving benchmark's engine side (``scripts/serving_benchmark.py``): its settings, modes and arrival patterns,
the test-split draws, the capacity they are paced at, and the grid of ``vllm serve`` runs.

Workload (per draw ``d``, seed ``seed + d``): ``num_requests`` requests of the committed benchmark's test split
(:class:`lenpred.studies.engine_bench.EngineWorkload`: every scenario mixed, natural EOS, each with its recorded
sampling settings and its recorded cap as ``max_tokens``). Arrival patterns (:data:`PATTERNS`): ``burst`` (all at
``t = 0``: a deep queue) and Poisson at 0.7 and 0.9 of the capacity (:func:`capacity`).

Modes (:data:`MODES`), all with the same engine flags (``--max-num-seqs``, KV cache, no chunked prefill):

* ``stock``: ``vllm serve`` with no plug-in flags (the reference);
* ``observe``: the plug-in capturing and predicting, stock scheduling (its overhead);
* ``parked_fcfs`` / ``parked_sjf`` / ``parked_srpt``: prefill on arrival, ``decode_slots`` decoding, by arrival,
  by the engine's own prediction, by PLP's re-estimated remaining length;
* ``oracle_sjf``: parked SJF by the request's recorded length (sent as ``priority``, ``rank_by: priority``);
  ``prompt_oracle_sjf``: by the mean recorded length of the prompt's other test samples (the scenario's median when
  it has none): the best any prompt-only predictor can do;
* ``proxy_priority``: ``lenpred serve`` (on the client's core) in front of ``--scheduling-policy priority``.

Controls: vLLM on ``vllm_cpus``, the client (and the proxy) on ``client_cpus``; within each draw the modes run in an
order rotated by the draw (one server per mode and draw, all patterns on it), so drift hits every mode alike. Each
run is written when it finishes (``runs.json``, :func:`lenpred.studies.resume.load_resumable`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError
from lenpred.studies.engine_bench import (EngineWorkload, engine_env, load_requests, one_run, pin_cores, plugin_args,
                                          run_grid, servers, split_stats, vllm_command, warm_up)
from lenpred.studies.resume import load_resumable

MODES = ("stock", "observe", "parked_fcfs", "parked_sjf", "parked_srpt", "oracle_sjf", "prompt_oracle_sjf",
         "proxy_priority")
PATTERNS = {"burst": None, "poisson0.7": 0.7, "poisson0.9": 0.9}
"""Arrival pattern -> share of the measured capacity (``None``: all at once)."""
PRIORITY = {"oracle_sjf": "oracle", "prompt_oracle_sjf": "prompt_oracle"}
"""Modes whose client sends ``priority`` -> what it sends (:func:`lenpred.studies.engine_bench.row_priority`)."""
RESUME_IGNORES = ("draws", "modes", "out", "bootstrap_resamples", "report_only")
"""Settings a finished run does not depend on."""


@dataclass
class ServingBenchConfig:
    """Settings of the in-engine scheduler benchmark; stored as ``runs.json``'s ``config`` (finished runs are kept
    only under the same settings, :data:`RESUME_IGNORES` aside) and as the report's ``settings``."""

    num_requests: int = 48
    """Requests per draw."""
    draws: int = 5
    """Workload draws (draw ``d``: requests and Poisson arrivals seeded ``seed + d``)."""
    seed: int = 100
    """The seed of draw 0."""
    max_tokens: int | None = None
    """Clip every recorded cap to this many tokens (a diagnostic; ``None``: the recorded caps)."""
    decode_slots: int = 32
    """Requests the plug-in's parked modes decode per step."""
    max_num_seqs: int = 64
    """vLLM's ``--max-num-seqs``; also the largest batch whose knee throughput sets the capacity."""
    kv_cache_gib: float = 2.0
    """vLLM's KV cache, GiB."""
    max_idle_s: float = 60.0
    """The parked modes' starvation guard: seconds parked before a request is promoted."""
    vllm_cpus: str = "0"
    """CPU ids ``vllm serve`` is pinned to."""
    client_cpus: str = "1"
    """CPU ids of this client and of ``lenpred serve`` (mode ``proxy_priority``)."""
    modes: str = ",".join(MODES)
    """Comma-separated modes to run (:data:`MODES`)."""
    knee: str = "results/scripts/serving/decode_knee.json"
    """``scripts/decode_knee.py``'s report: the decode throughput of :func:`capacity`."""
    cost_model: str = "results/scripts/serving/cost_vllm_1core.json"
    """This machine's cost model (``scripts/decode_knee.py``): the prefill time of :func:`capacity`, the simulator."""
    bootstrap_resamples: int = 2000
    """Resamples of every paired bootstrap interval."""
    report_only: bool = False
    """Write the report from the finished runs in ``out`` (no engine is started)."""
    out: str = "results/scripts/serving/benchmark"
    """Output directory: ``runs.json``, ``report.json``, ``report.md``, ``jct_cdf_<pattern>.png``, ``logs/``."""

    def __post_init__(self):
        unknown = [m for m in self.mode_list() if m not in MODES]
        if unknown:
            raise LenpredError(f"unknown serving-benchmark mode(s) {', '.join(unknown)}; valid: {', '.join(MODES)}")
        if min(self.num_requests, self.draws, self.decode_slots, self.max_num_seqs) < 1:
            raise LenpredError("num_requests, draws, decode_slots and max_num_seqs must be >= 1")

    def mode_list(self) -> list[str]:
        """The modes to run, in the order given."""
        return [m for m in self.modes.split(",") if m]


def draw_rows(cfg: ServingBenchConfig) -> tuple[EngineWorkload, list[list[dict]]]:
    """The workload source and, per draw, ``num_requests`` rows of it (seed ``seed`` + draw)."""
    source = EngineWorkload(cfg.max_tokens)
    return source, [source.draw(cfg.num_requests, cfg.seed + d) for d in range(cfg.draws)]


def capacity(cfg: ServingBenchConfig) -> dict:
    """Requests/s the engine serves at ``max_num_seqs`` decoding: 1 / (prefill of the test split's mean prompt +
    its mean output tokens / the knee's throughput at the largest measured batch <= ``max_num_seqs``)."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.studies.workload import load_workload_table

    knee = json.loads(Path(cfg.knee).read_text())
    cost = CostModel.load(cfg.cost_model)
    row = max((r for r in knee["rows"] if r["decoding_requests"] <= cfg.max_num_seqs),
              key=lambda r: r["decoding_requests"])
    stats = split_stats(load_workload_table(token_ids=False, rebuild=False), cfg.max_tokens)
    prompt, out = stats["mean_prompt_tokens"], stats["mean_output_tokens"]
    seconds = cost.prefill_time_s([prompt]) + out / row["throughput_tok_s"]
    return {"capacity_req_s": round(1.0 / seconds, 4), "mean_prompt_tokens": round(prompt, 1),
            "mean_output_tokens": round(out, 1), "throughput_tok_s": round(row["throughput_tok_s"], 2),
            "at_decoding_requests": row["decoding_requests"]}


def open_store(cfg: ServingBenchConfig) -> dict:
    """``out/runs.json``'s finished runs under ``cfg`` (or a fresh record), with the capacity as its fingerprint.

    Raises:
        LenpredError: the stored runs were made with other settings or another capacity."""
    return load_resumable(Path(cfg.out) / "runs.json", asdict(cfg), ignore=RESUME_IGNORES,
                          fingerprint={"capacity": capacity(cfg)})


def arrivals(cfg: ServingBenchConfig, pattern: str, d: int, capacity_req_s: float) -> np.ndarray:
    """``(num_requests,)`` send times of draw ``d`` under ``pattern``, seconds."""
    from lenpred.serving.simulator import arrival_times

    share = PATTERNS[pattern]
    if share is None:
        return np.zeros(cfg.num_requests)
    return arrival_times(cfg.num_requests, "poisson", share * capacity_req_s, seed=cfg.seed + d)


def mode_servers(model_dir: str, mode: str, cfg: ServingBenchConfig, log_dir: Path, client_cpus, vllm_cpus):
    """``(servers, plug-in log path)`` of one mode (:func:`lenpred.studies.engine_bench.servers`)."""
    from lenpred.serving.vllm.config import EngineConfig

    extra, plugin_log = [], None
    if mode == "proxy_priority":
        extra = ["--scheduling-policy", "priority"]
    elif mode != "stock":
        policy = {"observe": "observe", "parked_fcfs": "fcfs", "parked_srpt": "srpt"}.get(mode, "sjf")
        plugin_log = log_dir / f"{mode}.jsonl"
        engine = EngineConfig(policy=policy, decode_slots=cfg.decode_slots, max_idle_s=cfg.max_idle_s,
                              rank_by="priority" if "oracle" in mode else "prediction", log_path=str(plugin_log))
        extra = plugin_args(engine)
    cmd = vllm_command(model_dir, cfg.max_num_seqs, int(cfg.kv_cache_gib * 2**30), 4096, extra)
    proxy_log = log_dir / "proxy.log" if mode == "proxy_priority" else None
    return servers(cmd, log_dir / f"{mode}.log", vllm_cpus, proxy_log, client_cpus), plugin_log


def _progress_line(rec: dict) -> str:
    s = rec["summary"]
    return (f"{s['outcomes']['ok']}/{s['num_requests']} ok, mean JCT {s['mean_jct_s']:.1f} s, "
            f"TTFT {s['mean_ttft_s']:.2f} s, p99 stall {s['p99_max_gap_s']:.2f} s, "
            f"{s['throughput_tok_s']:.0f} tok/s, {rec['preemptions']:.0f} preemptions, {rec['wall_s']:.0f} s")


def run_engines(cfg: ServingBenchConfig) -> tuple[dict, list[list[dict]]]:
    """Every run of the grid not yet in ``out/runs.json`` (:func:`lenpred.studies.engine_bench.run_grid`); returns
    the store and the draws' rows. Starts servers: hold :func:`lenpred.studies.engine_bench.cpu_lock` around it."""
    from lenpred.backbone import resolve_model

    engine_env()
    out = Path(cfg.out)
    store = open_store(cfg)
    cap = store["capacity"]["capacity_req_s"]
    source, draws = draw_rows(cfg)
    messages = source.messages(draws)
    model_dir = str(resolve_model()[0])
    vllm_cpus, client_cpus = pin_cores(cfg.vllm_cpus, cfg.client_cpus)
    logs: dict[str, Path | None] = {}

    def servers_for(d, mode):
        spec, logs[mode] = mode_servers(model_dir, mode, cfg, out / "logs", client_cpus, vllm_cpus)
        return spec

    def warm(d, mode, url):
        warm_up(url, draws[d], messages, f"warm-{d}-{mode}-", PRIORITY.get(mode))

    def run_one(d, mode, pattern, url):
        tag = f"{d}-{mode}-{pattern}-"
        reqs = load_requests(draws[d], messages, arrivals(cfg, pattern, d, cap), tag, PRIORITY.get(mode))
        return one_run(url, reqs, tag, logs[mode])

    run_grid(store, out / "runs.json", cfg.draws, MODES, cfg.mode_list(), list(PATTERNS), servers_for, warm, run_one,
             _progress_line)
    return store, draws
