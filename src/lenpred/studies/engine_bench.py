"""What the real-engine benchmarks share (``scripts/serving_benchmark.py``, ``scripts/queue_benchmark.py``):
test-split requests with their recorded sampling settings and both oracles, the ``vllm serve`` / ``lenpred serve``
command lines, the grid of runs (draws x modes x patterns, resumable) with one replayed run each, and the paired
report helpers.

Every server listens on ``127.0.0.1`` only and is started and stopped by
:class:`lenpred.serving.supervisor.ServerGroup`. Runs are stored as ``store["runs"]["<draw>/<mode>/<pattern>"]`` in
the record :func:`lenpred.studies.resume.load_resumable` keeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Sequence

import numpy as np

from lenpred.studies import DEFAULT_BENCH

PORT = 8041
"""``vllm serve``'s loopback port; ``lenpred serve`` (when a mode has it) listens on the next one."""
MODEL_NAME = "lenpred-model"
LOCK = "/tmp/lenpred-cpu.lock"
"""The machine-wide lock heavy jobs take (``flock``), so two benchmarks never share the cores."""
PLUGIN_CLASSES = ("--worker-cls", "lenpred.serving.vllm.worker.LenpredCPUWorker",
                  "--scheduler-cls", "lenpred.serving.vllm.scheduler.LenpredScheduler")
PRIORITY_KEYS = ("oracle", "prompt_oracle", "prompt_tokens")
"""What a client can send as vLLM's ``priority`` (lower first): the recorded length, the prompt oracle, the prompt's
token count."""


# ---------------------------------------------------------------------------------------------------- workload

def split_stats(table, max_tokens: int | None = None) -> dict:
    """The test split's request sizes in tokens: mean prompt, mean cap (``max_new_tokens`` clipped to
    ``max_tokens``), mean recorded output (clipped to the cap) and the longest request (prompt + cap).

    Args:
        table: the workload table (:func:`lenpred.studies.workload.load_workload_table`).
        max_tokens: the diagnostic clip of every cap (``None``: none).
    """
    col = lambda c: np.asarray(table.column(c).to_pylist())  # noqa: E731
    prompt, cap, out = col("num_prompt_tokens"), col("max_new_tokens"), col("output_len")
    cap = np.minimum(cap, max_tokens or cap)
    return {"mean_prompt_tokens": float(np.mean(prompt)), "mean_cap_tokens": float(np.mean(cap)),
            "mean_output_tokens": float(np.mean(np.minimum(out, cap))),
            "max_request_tokens": int(np.max(prompt + cap)), "num_requests": len(prompt)}


class EngineWorkload:
    """The committed benchmark's test split as served requests (natural EOS, recorded sampling settings).

    A row (one request of a draw) is a dict: ``request`` (a :class:`~lenpred.studies.workload.WorkloadRequest`),
    ``max_tokens`` (its recorded cap, clipped to ``max_tokens``), the recorded ``seed``, ``temperature`` and
    ``top_p``, ``oracle`` (its recorded length in tokens, clipped to the cap) and ``prompt_oracle``
    (:func:`lenpred.studies.workload.table_prompt_oracle` of the clipped test lengths: the mean of the prompt's other
    samples, else its scenario's median; the best any prompt-only predictor can do).

    Args:
        max_tokens: clip every cap to this many tokens (a diagnostic; ``None``: the recorded caps).
        bench: the benchmark whose shards hold the sampling settings.
    """

    def __init__(self, max_tokens: int | None = None, bench: str | Path = DEFAULT_BENCH):
        import pyarrow.parquet as pq

        from lenpred.studies.workload import load_workload_table, table_prompt_oracle

        self.max_tokens, self.bench = max_tokens, Path(bench)
        self.table = load_workload_table(bench=bench, token_ids=False, rebuild=False)
        records = pq.read_table(sorted((self.bench / "shards").glob("*.parquet")),
                                columns=["prompt_id", "sample_index", "split", "seed", "temperature",
                                         "top_p"]).to_pylist()
        self.sampling = {(r["prompt_id"], r["sample_index"]): r for r in records if r["split"] == "test"}
        col = lambda c: self.table.column(c).to_pylist()  # noqa: E731
        self.prompt_oracle = table_prompt_oracle(self.table, max_tokens)  # (rows,) tokens, by table row
        self.sample_index = dict(zip(col("request_index"), col("sample_index")))

    def clip(self, length: int, cap: int) -> int:
        """``length`` tokens clipped to the cap and to ``max_tokens``."""
        return min(int(length), int(cap), self.max_tokens or int(cap))

    def draw(self, n: int, seed: int) -> list[dict]:
        """``n`` distinct test requests drawn with ``seed`` (:func:`~lenpred.studies.workload.draw_workload`), as
        rows (class docstring)."""
        from lenpred.studies.workload import draw_workload

        rows = []
        for r in draw_workload(self.table, n, seed):
            s = self.sampling[(r.prompt_id, self.sample_index[r.table_row])]
            rows.append({"request": r, "max_tokens": min(r.max_new_tokens, self.max_tokens or r.max_new_tokens),
                         "seed": int(s["seed"]), "temperature": round(float(s["temperature"]), 4),
                         "top_p": float(s["top_p"]), "oracle": self.clip(r.output_len, r.max_new_tokens),
                         "prompt_oracle": float(self.prompt_oracle[r.table_row])})
        return rows

    def messages(self, draws: list[list[dict]]) -> dict[str, list[dict]]:
        """The chat messages of every drawn prompt, by prompt id (read from the data sets, never stored)."""
        from lenpred.bench.build import read_manifest
        from lenpred.bench.user_prompts import prompt_messages

        files = read_manifest(self.bench).get("prompt_files")
        return {row["request"].prompt_id: prompt_messages(row["request"].prompt_id, None, files)
                for rows in draws for row in rows}


def row_priority(row: dict, key: str | None) -> int | None:
    """The ``priority`` a client sends for ``row`` (:data:`PRIORITY_KEYS`; ``None``: none sent)."""
    if key is None:
        return None
    return {"oracle": lambda: int(row["oracle"]), "prompt_oracle": lambda: int(round(row["prompt_oracle"])),
            "prompt_tokens": lambda: int(row["request"].num_prompt_tokens)}[key]()


def load_requests(rows: list[dict], messages: dict, times, tag: str, priority: str | None = None,
                  deadline_s: float | None = None) -> list:
    """Streaming chat requests for ``rows`` sent at ``times`` (seconds after the replay starts), with each row's
    recorded sampling settings, vLLM request id ``<tag>q<i>`` and ``priority`` from :func:`row_priority`.

    Args:
        deadline_s: the client gives up on every request this many seconds after the replay starts (its
            ``cancel_after_s`` is what is left of it at its send time); ``None``: no deadline.
    """
    from lenpred.serving.loadgen import LoadRequest

    out = []
    for i, (row, t) in enumerate(zip(rows, times)):
        r = row["request"]
        extra = {"seed": row["seed"], "temperature": row["temperature"], "top_p": row["top_p"],
                 "request_id": f"{tag}q{i}"}
        cancel = None if deadline_s is None else max(deadline_s - float(t), 1.0)
        out.append(LoadRequest(r.request_id, messages[r.prompt_id], row["max_tokens"], float(t),
                               row_priority(row, priority), extra_body=extra, cancel_after_s=cancel))
    return out


WARMUP_REQUESTS = 2
"""Requests a fresh server gets before anything is measured on it (the first rows of the run's plan, at once)."""


def warm_up(url: str, rows: list[dict], messages: dict, tag: str, priority: str | None = None) -> None:
    """Send a fresh server the first :data:`WARMUP_REQUESTS` of ``rows`` at once (ids ``<tag>q<i>``, ``priority``
    as :func:`load_requests`) and wait for them: nothing measured afterwards pays the first requests' costs."""
    from lenpred.serving.loadgen import run_replay

    run_replay(url, load_requests(rows[:WARMUP_REQUESTS], messages, [0.0] * WARMUP_REQUESTS, tag, priority),
               MODEL_NAME)

PROBE_REQUESTS, PROBE_TOKENS = 4, 64
"""The speed probe (:func:`speed_probe`): this many requests at once, each forced to this many output tokens."""


def speed_probe(url: str, rows: list[dict], messages: dict, tag: str) -> dict:
    """The engine's decode speed just before a run, so runs made hours apart can be told apart by the engine's pace
    rather than their order (the same workload's JCT varied by up to 17 % across sessions on one VM): the first
    :data:`PROBE_REQUESTS` of ``rows`` sent at once, each forced (``ignore_eos``) to :data:`PROBE_TOKENS` tokens,
    ids ``<tag>q<i>``; :func:`probe_summary` of what came back."""
    import dataclasses

    from lenpred.serving.loadgen import run_replay

    reqs = [dataclasses.replace(r, max_tokens=PROBE_TOKENS)
            for r in load_requests(rows[:PROBE_REQUESTS], messages, [0.0] * PROBE_REQUESTS, tag)]
    return probe_summary(run_replay(url, reqs, MODEL_NAME, ignore_eos=True))


def median_tpot_s(results: list[dict]) -> float | None:
    """The median over ``results``' finished requests of the time per output token after the first,
    ``(jct − ttft) / (tokens − 1)``, in seconds; ``None`` when none finished with 2+ tokens."""
    tpot = [(r["jct_s"] - r["ttft_s"]) / (r["completion_tokens"] - 1) for r in results
            if r["outcome"] == "ok" and (r["completion_tokens"] or 0) >= 2]
    return float(np.median(tpot)) if tpot else None


def probe_summary(results: list[dict]) -> dict:
    """``{"tpot_s", "requests", "tokens"}``: the probe's :func:`median_tpot_s` and how many requests and tokens it
    asked for."""
    return {"tpot_s": median_tpot_s(results), "requests": PROBE_REQUESTS, "tokens": PROBE_TOKENS}


# ---------------------------------------------------------------------------------------------------- servers

def engine_env() -> None:
    """The engine's environment on this CPU (kept where already set): no reserved core, one OpenMP thread, no
    thread binding (``taskset`` pins the processes instead)."""
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def pin_cores(vllm_cpus: str, client_cpus: str) -> tuple[set[int] | None, set[int] | None]:
    """``(engine cores, client cores)`` parsed from the ``--vllm-cpus`` / ``--client-cpus`` settings; this process
    (the client, and the proxy it starts) is pinned to the client cores when any are given.

    Raises:
        LenpredError: a malformed core list (:func:`lenpred.serving.supervisor.parse_cpu_set`)."""
    from lenpred.serving.supervisor import parse_cpu_set

    engine, client = parse_cpu_set(vllm_cpus, "--vllm-cpus"), parse_cpu_set(client_cpus, "--client-cpus")
    if client:
        os.sched_setaffinity(0, client)
    return engine, client


def vllm_command(model_dir: str, max_num_seqs: int, kv_cache_bytes: int, max_model_len: int = 4096,
                 extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` on ``127.0.0.1:PORT``: float32, eager, no chunked prefill,
    no prefix caching, ``max_model_len`` tokens per request, ``kv_cache_bytes`` of KV cache, at most
    ``max_num_seqs`` requests admitted, then ``extra`` (``--scheduling-policy priority``, :func:`plugin_args`)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1",
            "--port", str(PORT), "--served-model-name", MODEL_NAME, "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(max_model_len), "--max-num-batched-tokens", str(max(8192, max_model_len)),
            "--no-enable-chunked-prefill", "--no-enable-prefix-caching", "--kv-cache-memory-bytes",
            str(int(kv_cache_bytes)), "--generation-config", "vllm", "--disable-uvicorn-access-log",
            "--max-num-seqs", str(max_num_seqs), *extra]


def plugin_args(cfg) -> list[str]:
    """The flags that load the in-engine plug-in with ``cfg`` (a :class:`~lenpred.serving.vllm.config.EngineConfig`)."""
    return [*PLUGIN_CLASSES, "--additional-config", cfg.to_json()]


@dataclass
class Servers:
    """The servers of one mode, as :class:`~lenpred.serving.supervisor.ServerGroup` takes them, and the URL the
    client sends to (the proxy's when there is one)."""

    commands: list[list[str]]
    urls: list[str]
    logs: list[Path]
    cpus: list[set[int] | None]
    url: str

    def start(self, timeout_s: float = 900.0):
        """A :class:`~lenpred.serving.supervisor.ServerGroup` over them (enter it to start, on loopback ports)."""
        from lenpred.serving.supervisor import ServerGroup

        return ServerGroup(self.commands, self.urls, self.logs, timeout_s, cpus=self.cpus, ports=(PORT, PORT + 1))


def servers(vllm_cmd: list[str], log: Path, vllm_cpus: set[int] | None, proxy_log: Path | None = None,
            proxy_cpus: set[int] | None = None, proxy_args: Sequence[str] = ()) -> Servers:
    """``vllm_cmd`` pinned to ``vllm_cpus``; with ``proxy_log``, ``lenpred serve --threads 1 *proxy_args`` in front
    of it on ``PORT + 1``, pinned to ``proxy_cpus`` (its prediction's forward runs there)."""
    url = f"http://127.0.0.1:{PORT}"
    out = Servers([vllm_cmd], [f"{url}/health"], [log], [vllm_cpus], url)
    if proxy_log is not None:
        out.commands.append([sys.executable, "-m", "lenpred.cli", "serve", "--upstream", url, "--port",
                             str(PORT + 1), "--threads", "1", *proxy_args])
        out.url = f"http://127.0.0.1:{PORT + 1}"
        out.urls.append(f"{out.url}/health")
        out.logs.append(proxy_log)
        out.cpus.append(proxy_cpus)
    return out


@contextlib.contextmanager
def cpu_lock(path: str = LOCK):
    """Hold the machine-wide CPU lock (``flock``) for the block, waiting (with a line saying so) when another heavy
    job holds it."""
    import fcntl

    Path(path).touch()
    with open(path) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {path} (another heavy job holds it)", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ---------------------------------------------------------------------------------------------------- runs

SERVER_COUNTERS = ("vllm:num_preemptions_total", "vllm:e2e_request_latency_seconds_sum",
                   "vllm:e2e_request_latency_seconds_count", "vllm:inter_token_latency_seconds_sum",
                   "vllm:inter_token_latency_seconds_count", "vllm:iteration_tokens_total_sum",
                   "vllm:iteration_tokens_total_count")
"""The engine's own counters a run records (vLLM's ``/metrics``): preemptions, its end-to-end latency and
inter-token latency histograms' sums and counts (what the server measured, whatever the client did), and its
tokens-per-step histogram's sum and count (vLLM 0.32 observes it once per engine step that emitted a token: the
tokens generated in it plus the prompt tokens of the requests whose prefill ended in it; a step that only advanced a
chunked prefill is not counted)."""


def parse_counters(text: str) -> dict[str, float]:
    """:data:`SERVER_COUNTERS` from a Prometheus text exposition (each summed over label sets; 0 when absent)."""
    out = dict.fromkeys(SERVER_COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def server_counters() -> dict[str, float]:
    """:func:`parse_counters` of the engine's ``/metrics``."""
    import httpx

    return parse_counters(httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=10).text)


def server_side(before: dict[str, float], after: dict[str, float]) -> dict:
    """What the engine measured between two :func:`server_counters` reads: ``preemptions``, ``requests`` finished,
    their mean end-to-end latency and mean inter-token latency, s (``None`` with nothing finished), the engine
    ``steps`` that emitted a token and the mean ``tokens_per_step`` computed in them (``None`` with no step;
    :data:`SERVER_COUNTERS`)."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SERVER_COUNTERS}
    n, tokens = d["vllm:e2e_request_latency_seconds_count"], d["vllm:inter_token_latency_seconds_count"]
    steps = d["vllm:iteration_tokens_total_count"]
    return {"preemptions": d["vllm:num_preemptions_total"], "requests": n,
            "mean_e2e_s": d["vllm:e2e_request_latency_seconds_sum"] / n if n else None,
            "mean_itl_s": d["vllm:inter_token_latency_seconds_sum"] / tokens if tokens else None,
            "steps": steps, "tokens_per_step": d["vllm:iteration_tokens_total_sum"] / steps if steps else None}


PLUGIN_COUNTERS = ("steps", "policy_s", "head_s", "parked_request_steps", "predicted")
"""The plug-in's scheduler counters a run records (:data:`lenpred.serving.vllm.prometheus.COUNTERS`)."""


def scheduler_log(plugin_log: Path | None) -> Path | None:
    """Where the plug-in with log ``plugin_log`` writes its scheduler counters (``None`` without a plug-in log); the
    scheduler writes the file when it starts, so a server that reuses the log path never shows the previous
    server's totals."""
    return None if plugin_log is None else Path(f"{plugin_log}.scheduler.json")


def plugin_counters(plugin_log: Path | None) -> dict[str, float]:
    """:data:`PLUGIN_COUNTERS` from the plug-in's ``<plugin_log>.scheduler.json`` (its running totals, which the
    scheduler writes at start, every 256 steps and at shutdown: read between two runs they are up to 255 steps
    behind); ``{}`` without a plug-in log or before the file's first write."""
    path = scheduler_log(plugin_log)
    if path is None or not path.exists():
        return {}
    counters = json.loads(path.read_text())
    return {k: float(counters.get(k, 0.0)) for k in PLUGIN_COUNTERS}


class LoadSampler:
    """The 1-minute load average sampled every ``every_s`` seconds on a daemon thread while the ``with`` block runs:
    what else ran on the machine during a timed run (the engine and the client make about 2 on two cores; more is
    another job, and the run's timings are suspect).

    Args:
        every_s: seconds between samples.
    """

    def __init__(self, every_s: float = 10.0):
        import threading

        self.every_s, self.samples, self._stop = every_s, [], threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        """``{"mean", "max", "samples"}`` of the samples (``None``s when the block ended before the first)."""
        if not self.samples:
            return {"mean": None, "max": None, "samples": 0}
        return {"mean": round(sum(self.samples) / len(self.samples), 2), "max": round(max(self.samples), 2),
                "samples": len(self.samples)}


def one_run(url: str, requests: list, tag: str, plugin_log: Path | None = None, timeout_s: float = 1200.0) -> dict:
    """Replay ``requests`` (:func:`load_requests`) once; the record keeps each request's result (with its longest
    stall, not every gap, so the file stays small), the replay's summary, the plug-in log's lines of this run, the
    engine's own measurements during it (:func:`server_side`: preemptions, mean end-to-end and inter-token latency,
    steps), the plug-in's scheduler counters gained during it (:func:`plugin_counters`; ``None`` without a plug-in),
    wall seconds, the 1-minute load average before and during it (:class:`LoadSampler`) and when it started and
    finished (local time, ISO; records written before ``finished`` existed hold the finish time in ``started``).

    Args:
        timeout_s: the client's read timeout between two frames of one stream, seconds.
    """
    from lenpred.serving.loadgen import run_replay, summarize_replay

    load, started = os.getloadavg()[0], time.strftime("%Y-%m-%dT%H:%M:%S")
    before, plugin_before, t = server_counters(), plugin_counters(plugin_log), time.time()
    with LoadSampler() as during:
        results = run_replay(url, requests, MODEL_NAME, timeout_s=timeout_s)
    server = server_side(before, server_counters())
    plugin_after = plugin_counters(plugin_log)
    summary = summarize_replay(results)
    for r in results:
        r.pop("gaps_s", None)
    logged = []
    if plugin_log is not None and plugin_log.exists():
        logged = [x for x in map(json.loads, plugin_log.read_text().splitlines())
                  if x["request_id"].startswith(f"chatcmpl-{tag}")]
    return {"results": results, "summary": summary, "plugin_log": logged, "preemptions": server["preemptions"],
            "server": server,
            "plugin_counters": {k: v - plugin_before.get(k, 0.0) for k, v in plugin_after.items()} or None,
            "wall_s": time.time() - t, "loadavg_1m_before": load, "loadavg_1m_during": during.summary(),
            "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}


def run_key(draw: int, mode: str, pattern: str) -> str:
    """The key of one run in ``store["runs"]``."""
    return f"{draw}/{mode}/{pattern}"


def rotated(items, k: int) -> list:
    """``items`` rotated left by ``k`` (``k`` modulo their number): each draw starts the cycle elsewhere, so drift
    hits every mode alike."""
    items = list(items)
    k = k % len(items) if items else 0
    return items[k:] + items[:k]


def run_grid(store: dict, path: Path, num_draws: int, all_modes, modes, patterns,
             servers_for: Callable[[int, str], Servers], warm: Callable[[int, str, str], None],
             run_one: Callable[[int, str, str, str], dict], line: Callable[[dict], str],
             only_draws: Collection[int] | None = None) -> None:
    """Every ``(draw, mode, pattern)`` not yet in ``store["runs"]`` (of the draws in ``only_draws`` only, when given:
    one slice's modes run back to back in one sitting, the rest resume later): per draw the modes in
    ``all_modes``'s order rotated by the draw (those in ``modes`` only), one server group per mode and draw with every
    pattern on it (in an order rotated by the draw), ``warm(draw, mode, url)`` first;
    ``run_one(draw, mode, pattern, url)`` gives the record, stored at once (``path`` written atomically) and
    announced with a ``[done/total]`` line."""
    from lenpred.io import write_json

    grid = [run_key(d, m, p) for d in range(num_draws) for m in modes for p in patterns]
    for d in range(num_draws):
        if only_draws is not None and d not in only_draws:
            continue
        for mode in [m for m in rotated(all_modes, d) if m in modes]:
            todo = [p for p in rotated(patterns, d) if run_key(d, mode, p) not in store["runs"]]
            if not todo:
                continue
            spec = servers_for(d, mode)
            with spec.start():
                warm(d, mode, spec.url)
                for pattern in todo:
                    rec = run_one(d, mode, pattern, spec.url)
                    store["runs"][run_key(d, mode, pattern)] = rec
                    write_json(path, store)
                    done = sum(k in store["runs"] for k in grid)
                    print(f"[{done}/{len(grid)}] draw {d} {mode:22s} {pattern:11s}: {line(rec)}", flush=True)


# ---------------------------------------------------------------------------------------------------- report

def mode_draws(store: dict, pattern: str, all_modes, num_draws: int) -> dict[str, list[int]]:
    """Per mode of ``all_modes`` (in its order) with at least one run of ``pattern``: the draws that have it."""
    draws = {m: [d for d in range(num_draws) if run_key(d, m, pattern) in store["runs"]] for m in all_modes}
    return {m: ds for m, ds in draws.items() if ds}


def complete_draws(store: dict, pattern: str, all_modes, num_draws: int) -> tuple[list[str], list[int]]:
    """The draws of ``pattern`` the reference mode (the first of ``all_modes`` with a run: stock) ran in, and the
    modes (in ``all_modes``'s order) that ran in every one of them: only those are paired. A mode run in fewer
    draws (added later, or a draw still running) is left out rather than cutting every comparison down to its
    draws: pair it separately on its own draws (:func:`mode_draws`)."""
    draws = mode_draws(store, pattern, all_modes, num_draws)
    if not draws:
        return [], []
    done = next(iter(draws.values()))
    return [m for m, ds in draws.items() if set(done) <= set(ds)], done


def paired(store: dict, draws_done: list[int], pattern: str, modes: list[str], key: str = "jct_s"):
    """Per mode, per draw: the requests ``ok`` under every mode of ``modes``, in request order, as arrays of
    ``key``; so every comparison is paired request by request."""
    out: dict[str, list[np.ndarray]] = {m: [] for m in modes}
    for d in draws_done:
        runs = {m: {r["request_id"]: r for r in store["runs"][run_key(d, m, pattern)]["results"]} for m in modes}
        ids = sorted(set.intersection(*({i for i, r in rs.items() if r["outcome"] == "ok"} for rs in runs.values())))
        for m in modes:
            out[m].append(np.array([runs[m][i][key] for i in ids], dtype=np.float64))
    return out


def latency_cell(runs: list[dict]) -> dict:
    """What every report shows of one mode's runs of one pattern (``ok`` requests pooled over draws): request counts,
    mean / p50 / p90 / p99 JCT and mean TTFT (s), throughput (tok/s, mean over runs), preemptions (sum), the capped
    share, mean output tokens and the largest 1-minute load average before a run."""
    res = [r for run in runs for r in run["results"] if r["outcome"] == "ok"]
    x = np.array([r["jct_s"] for r in res])
    return {"num_ok": len(res), "num_requests": sum(len(run["results"]) for run in runs),
            "mean_jct_s": float(x.mean()), **{f"p{q}_jct_s": float(np.percentile(x, q)) for q in (50, 90, 99)},
            "mean_ttft_s": float(np.mean([r["ttft_s"] for r in res])),
            "throughput_tok_s": float(np.mean([run["summary"]["throughput_tok_s"] for run in runs])),
            "preemptions": float(sum(run["preemptions"] for run in runs)),
            "capped_share": float(np.mean([r["finish_reason"] == "length" for r in res])),
            "mean_output_tokens": float(np.mean([r["completion_tokens"] or 0 for r in res])),
            "loadavg_1m_before_max": float(max(run["loadavg_1m_before"] for run in runs)),
            "loadavg_1m_during_max": max((run["loadavg_1m_during"]["max"] for run in runs
                                          if (run.get("loadavg_1m_during") or {}).get("max") is not None),
                                         default=None)}


def fmt_ci(t, f) -> str:
    """``estimate [low, high]`` with each number written by ``f``."""
    return f"{f(t[0])} [{f(t[1])}, {f(t[2])}]"


def pct(x: float) -> str:
    """A signed percentage with one decimal."""
    return f"{x:+.1%}"


def pooled(values) -> list[float]:
    """Per-draw arrays flattened into one list of floats (JSON and the CDF plot)."""
    return [float(x) for v in values for x in v]
