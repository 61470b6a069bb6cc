"""Real end-to-end measurement of lenpred inside vLLM: ``vllm serve`` (the OpenAI server) with the plug-in's
policies vs stock FCFS, natural EOS, Poisson arrivals at two rates, paired over workload draws.

Workload: test-split requests of the committed benchmark (``results/scheduling/test_predictions.parquet``), each
sent as a streaming chat request with its recorded sampling parameters and per-request seed, ``max_tokens`` = its
benchmark cap clipped to ``--max-tokens``; nothing forces a length (no ``ignore_eos``). Modes (one server each, every
draw and rate on it; vLLM pinned to ``--vllm-cpus``, this load generator to ``--client-cpus``):

* ``fcfs``: stock vLLM, ``--max-num-seqs`` = the decode slots (the reference);
* ``observe``: the plug-in capturing and predicting, stock scheduling, same settings (its overhead);
* ``parked_sjf``, ``parked_srpt``: prefill on arrival, ``decode_slots`` decoding, by the engine's own prediction
  (``srpt``: PLP re-estimates from decode states);
* ``proxy_priority``: stock vLLM with ``--scheduling-policy priority`` behind ``lenpred serve`` (the proxy predicts
  with its own truncated forward on the client's core and sets ``priority``): the path without an engine plug-in;
* ``oracle_sjf``: parked SJF by the request's recorded length (sent as ``priority``, ``rank_by: priority``): reachable
  only if the engine reproduces the recorded sample; ``prompt_oracle_sjf``: by the mean recorded length of the
  prompt's other test samples (the best any prompt-only predictor can do).

Output: ``results/scripts/serving/in_engine.{json,md}`` (+ ``in_engine_runs.json``, resumable per run; per-request records
and the plug-in's request log) and the simulator's numbers for the same draws (``simulate_parked`` with the
committed vLLM cost model). Run alone, under the CPU lock::

    flock /tmp/lenpred-cpu.lock .venv-vllm/bin/python scripts/vllm_in_engine.py
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

MODES = ("fcfs", "observe", "parked_sjf", "parked_srpt", "oracle_sjf", "prompt_oracle_sjf", "proxy_priority")
PORT = 8031


def workload(args):
    """Draws of requests: ``[(WorkloadRequest, body fields)]`` per draw, and the messages by prompt id."""
    import pyarrow.parquet as pq

    from lenpred.bench.build import read_manifest
    from lenpred.bench.user_prompts import prompt_messages
    from lenpred.studies.workload import draw_workload, load_workload_table

    table = load_workload_table(token_ids=False, rebuild=False)
    bench = Path("benchmarks/smollm2-forelen")
    records = pq.read_table(sorted((bench / "shards").glob("*.parquet")),
                            columns=["prompt_id", "sample_index", "split", "seed", "temperature", "top_p"]).to_pylist()
    sampling = {(r["prompt_id"], r["sample_index"]): r for r in records if r["split"] == "test"}
    lengths: dict[str, list[int]] = {}
    for pid, L in zip(table.column("prompt_id").to_pylist(), table.column("output_len").to_pylist()):
        lengths.setdefault(pid, []).append(min(int(L), args.max_tokens))
    sample = dict(zip(table.column("request_index").to_pylist(), table.column("sample_index").to_pylist()))
    draws = []
    for d in range(args.draws):
        reqs = draw_workload(table, args.num_requests, args.seed + d)
        rows = []
        for r in reqs:
            s = sampling[(r.prompt_id, sample[r.table_row])]
            own = min(r.output_len, args.max_tokens)
            others = list(lengths[r.prompt_id])
            others.remove(own)
            rows.append({"request": r, "max_tokens": min(r.max_new_tokens, args.max_tokens), "seed": s["seed"],
                         "temperature": round(float(s["temperature"]), 4), "top_p": float(s["top_p"]),
                         "oracle": own, "prompt_oracle": float(np.mean(others)) if others else float(own)})
        draws.append(rows)
    files = read_manifest(bench).get("prompt_files")
    messages = {row["request"].prompt_id: prompt_messages(row["request"].prompt_id, None, files)
                for rows in draws for row in rows}
    return draws, messages


def server_command(model_dir: str, mode: str, args, log_path: Path) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` for one mode (loopback only)."""
    import sys

    from lenpred.serving.vllm.config import EngineConfig

    plugin = mode not in ("fcfs", "proxy_priority")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1",
           "--port", str(PORT), "--served-model-name", "lenpred-model", "--dtype", "float32", "--enforce-eager",
           "--max-model-len", "4096", "--max-num-batched-tokens", "8192", "--no-enable-chunked-prefill",
           "--no-enable-prefix-caching", "--kv-cache-memory-bytes", str(2 << 30), "--generation-config", "vllm",
           "--disable-uvicorn-access-log",
           "--max-num-seqs", str(args.decode_slots if mode in ("fcfs", "observe", "proxy_priority")
                                 else args.max_admitted)]
    if mode == "proxy_priority":
        cmd += ["--scheduling-policy", "priority"]
    if plugin:
        policy = {"observe": "observe", "parked_srpt": "srpt"}.get(mode, "sjf")
        cfg = EngineConfig(policy=policy, decode_slots=args.decode_slots, max_idle_s=args.max_idle_s,
                           rank_by="priority" if "oracle" in mode else "prediction", log_path=str(log_path))
        cmd += ["--worker-cls", "lenpred.serving.vllm.worker.LenpredCPUWorker",
                "--scheduler-cls", "lenpred.serving.vllm.scheduler.LenpredScheduler",
                "--additional-config", cfg.to_json()]
    return cmd


def load_requests(rows, messages, arrivals, mode: str, tag: str):
    from lenpred.serving.loadgen import LoadRequest

    out = []
    for i, (row, t) in enumerate(zip(rows, arrivals)):
        r = row["request"]
        extra = {"seed": int(row["seed"]), "temperature": row["temperature"], "top_p": row["top_p"],
                 "request_id": f"{tag}q{i}"}
        priority = {"oracle_sjf": row["oracle"], "prompt_oracle_sjf": int(round(row["prompt_oracle"]))}.get(mode)
        out.append(LoadRequest(r.request_id, messages[r.prompt_id], row["max_tokens"], float(t), priority,
                               extra_body=extra))
    return out


def _non_streaming(url: str, messages, row) -> dict:
    """One non-streaming chat request: what the response carries (the plug-in's prediction rides in
    ``kv_transfer_params``)."""
    import httpx

    body = {"model": "lenpred-model", "messages": messages[row["request"].prompt_id], "max_tokens": 16,
            "temperature": 0.0}
    out = httpx.post(url + "/v1/chat/completions", json=body, timeout=600).json()
    return {"kv_transfer_params": out.get("kv_transfer_params"), "usage": out.get("usage")}


def read_log(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def run(args) -> dict:
    from lenpred.backbone import resolve_model
    from lenpred.io import write_json
    from lenpred.serving.loadgen import run_replay
    from lenpred.serving.simulator import arrival_times
    from lenpred.serving.supervisor import ServerGroup, check_ports_free, parse_cpu_set

    out = Path(args.out)
    partial_path = out / "in_engine_runs.json"
    # runs are keyed mode/rate/draw (draw d's workload: seed + d), so the modes, rates and draws may grow later
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "modes", "draws", "rates")}
    partial = json.loads(partial_path.read_text()) if partial_path.exists() else {"settings": settings, "runs": {}}
    for key in ("draws", "rates"):  # files from before these left the settings
        partial["settings"].pop(key, None)
    if partial["settings"] != settings:
        raise SystemExit(f"{partial_path} holds runs with other settings: delete it or use another --out")
    draws, messages = workload(args)
    model_dir = str(resolve_model()[0])
    vllm_cpus = parse_cpu_set(args.vllm_cpus, "--vllm-cpus")
    client_cpus = parse_cpu_set(args.client_cpus, "--client-cpus")
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    for mode in [m for m in args.modes.split(",") if m]:  # --modes "": only the report
        check_ports_free(PORT, PORT + 1)
        todo = [(rate, d) for rate in args.rates for d in range(args.draws)
                if f"{mode}/{rate}/{d}" not in partial["runs"]]
        if not todo:
            continue
        log_path = out / "logs" / f"in_engine_{mode}.jsonl"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.unlink(missing_ok=True)
        env_log = out / "logs" / f"in_engine_{mode}.log"
        commands, urls, logs, cpus = [server_command(model_dir, mode, args, log_path)], \
            [f"http://127.0.0.1:{PORT}/health"], [env_log], [vllm_cpus]
        url = f"http://127.0.0.1:{PORT}"
        if mode == "proxy_priority":  # lenpred serve on the client's cores, in front of the engine
            import sys

            commands.append([sys.executable, "-m", "lenpred.cli", "serve", "--upstream", url, "--port",
                             str(PORT + 1), "--threads", "1"])
            urls.append(f"http://127.0.0.1:{PORT + 1}/health")
            logs.append(out / "logs" / "in_engine_proxy.log")
            cpus.append(client_cpus)
            url = f"http://127.0.0.1:{PORT + 1}"
        with ServerGroup(commands, urls, logs, 900, cpus=cpus):
            warm = load_requests(draws[0][:2], messages, [0, 0], mode, f"warm-{mode}-")
            run_replay(url, warm, "lenpred-model")
            partial.setdefault("non_streaming_example", {})[mode] = _non_streaming(url, messages, draws[0][0])
            for rate, d in todo:
                tag = f"{mode}-{rate}-{d}-"
                arrivals = arrival_times(args.num_requests, "poisson", rate, seed=args.seed + d)
                t = time.time()
                results = run_replay(url, load_requests(draws[d], messages, arrivals, mode, tag), "lenpred-model")
                logged = [x for x in read_log(log_path) if x["request_id"].startswith(f"chatcmpl-{tag}")]
                partial["runs"][f"{mode}/{rate}/{d}"] = {"results": results, "plugin_log": logged,
                                                         "wall_s": time.time() - t}
                write_json(partial_path, partial)
                ok = sum(r["outcome"] == "ok" for r in results)
                print(f"{mode} rate {rate} draw {d}: {ok}/{len(results)} ok, "
                      f"mean JCT {np.mean([r['jct_s'] for r in results if r['outcome'] == 'ok']):.2f} s, "
                      f"{time.time() - t:.0f} s", flush=True)
    return partial, draws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[0.3, 0.6])
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--decode-slots", type=int, default=4)
    ap.add_argument("--max-admitted", type=int, default=64)
    ap.add_argument("--max-idle-s", type=float, default=60.0)
    ap.add_argument("--vllm-cpus", default="0")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="results/scripts/serving")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from lenpred.io import write_json

    partial, draws = run(args)
    rep = report(args, partial, draws)
    write_json(Path(args.out) / "in_engine.json", rep)
    md = markdown(rep)
    (Path(args.out) / "in_engine.md").write_text(md)
    print(md)


def _summary(run: dict) -> dict:
    from lenpred.serving.loadgen import summarize_replay

    return summarize_replay(run["results"])


def simulated(args, partial: dict, draws) -> dict:
    """The simulator on the same draws: arrivals as sent, lengths as the fcfs run generated them, the engine's own
    predictions (the parked_sjf run's log), the committed vLLM cost model; mean JCT per mode and draw."""
    import copy

    from lenpred.serving.cost_model import CostModel
    from lenpred.serving.policies import make_policy
    from lenpred.serving.simulator import ParkedConfig, SimConfig, _Continuous, _Parked, arrival_times
    from lenpred.serving.policies import countdown_remaining

    cost = CostModel.load("results/scheduling/cost_vllm.json")
    out: dict[str, dict[str, list[float]]] = {}
    for rate in args.rates:
        for d, rows in enumerate(draws):
            fcfs = partial["runs"].get(f"fcfs/{rate}/{d}")
            sjf = partial["runs"].get(f"parked_sjf/{rate}/{d}")
            if not fcfs or not sjf:
                continue
            gen = {r["request_id"]: r["completion_tokens"] or 1 for r in fcfs["results"]}
            pred = {int(x["request_id"].split("q")[-1].split("-")[0]): x["expected"] for x in sjf["plugin_log"]}
            arrivals = arrival_times(args.num_requests, "poisson", rate, seed=args.seed + d)
            reqs = []
            for i, (row, t) in enumerate(zip(rows, arrivals)):
                r = copy.copy(row["request"])
                r.arrival_time_s, r.output_len = float(t), int(gen[r.request_id])
                r.predictions = {"engine": pred.get(i, float(row["max_tokens"])), "oracle": float(row["oracle"]),
                                 "prompt_oracle": row["prompt_oracle"]}
                reqs.append(r)
            cfg = SimConfig(max_num_seqs=args.decode_slots, max_num_batched_tokens=8192)
            pcfg = SimConfig(max_num_seqs=args.max_admitted, max_num_batched_tokens=8192)
            runs = {"fcfs": _Continuous(reqs, make_policy("fcfs"), cost, cfg).run()[0]}
            for mode, (policy, p) in {"parked_sjf": ("sjf", "engine"), "parked_srpt": ("srpt", "engine"),
                                      "oracle_sjf": ("sjf", "oracle"),
                                      "prompt_oracle_sjf": ("sjf", "prompt_oracle")}.items():
                runs[mode] = _Parked(reqs, ParkedConfig(policy, p, args.decode_slots, args.max_idle_s),
                                     countdown_remaining(p), cost, pcfg).run()[0]
            for mode, s in runs.items():
                out.setdefault(f"{mode}/{rate}", {}).setdefault("mean_jct_s", []).append(s["mean_jct_s"])
    return out


def report(args, partial: dict, draws) -> dict:
    """Per mode and rate: summaries per draw, means, paired JCT cuts vs fcfs and oracle-gain shares (bootstrap over
    draws), the engine's prediction error, and the simulator's mean JCT for the same draws."""
    from lenpred.studies.simulate import draw_bootstrap

    rep: dict = {"settings": {**partial["settings"], "draws": args.draws, "rates": args.rates}, "label": "natural EOS",
                 "rates": {}}
    sim = simulated(args, partial, draws)
    for rate in args.rates:
        per_mode = {}
        for mode in MODES:
            runs = [partial["runs"].get(f"{mode}/{rate}/{d}") for d in range(args.draws)]
            if not all(runs):
                continue
            sums = [_summary(r) for r in runs]
            cell = {k: float(np.mean([s[k] for s in sums])) for k in
                    ("mean_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s", "mean_ttft_s", "p90_ttft_s",
                     "throughput_tok_s")}
            cell["per_draw_mean_jct_s"] = [s["mean_jct_s"] for s in sums]
            cell["outcomes"] = {k: int(sum(s["outcomes"][k] for s in sums)) for k in sums[0]["outcomes"]}
            cell["finish_reasons"] = {}
            for s in sums:
                for k, v in s["finish_reasons"].items():
                    cell["finish_reasons"][k] = cell["finish_reasons"].get(k, 0) + v
            recorded = [{row["request"].request_id: row["oracle"] for row in rows} for rows in draws]
            ok = [(x["completion_tokens"], recorded[d][x["request_id"]]) for d, r in enumerate(runs)
                  for x in r["results"] if x["outcome"] == "ok"]
            cell["share_reproducing_recorded_length"] = float(np.mean([a == b for a, b in ok])) if ok else None
            logs = [x for r in runs for x in r["plugin_log"]]
            if logs:
                err = [abs(x["expected"] - x["num_output_tokens"]) for x in logs]
                cell["prediction_mae_tokens"] = float(np.mean(err))
                cell["num_parked_steps_mean"] = float(np.mean([x["num_parked_steps"] for x in logs]))
            if f"{mode}/{rate}" in sim:
                cell["simulated_mean_jct_s"] = float(np.mean(sim[f"{mode}/{rate}"]["mean_jct_s"]))
            per_mode[mode] = cell
        if "fcfs" in per_mode:
            base = np.array(per_mode["fcfs"]["per_draw_mean_jct_s"])
            for mode, cell in per_mode.items():
                if mode == "fcfs":
                    continue
                x = np.array(cell["per_draw_mean_jct_s"])
                cell["jct_cut_vs_fcfs"] = draw_bootstrap({"f": base, "p": x},
                                                         lambda v: 1 - v["p"].mean() / v["f"].mean())
                for oracle in ("oracle_sjf", "prompt_oracle_sjf"):
                    if oracle in per_mode and mode != oracle:
                        o = np.array(per_mode[oracle]["per_draw_mean_jct_s"])
                        cell[f"share_of_{oracle}"] = draw_bootstrap(
                            {"f": base, "p": x, "o": o},
                            lambda v: (v["f"].mean() - v["p"].mean()) / (v["f"].mean() - v["o"].mean()))
        rep["rates"][str(rate)] = per_mode
    return rep


def markdown(rep: dict) -> str:
    from lenpred.tables import markdown_table

    lines = [f"# lenpred inside vLLM: `vllm serve`, {rep['label']}", "",
             f"settings: `{json.dumps(rep['settings'])}`", ""]
    ci = lambda t: f"{t[0]:+.1%} [{t[1]:+.1%}, {t[2]:+.1%}]"  # noqa: E731
    sh = lambda t: f"{t[0]:.2f} [{t[1]:.2f}, {t[2]:.2f}]"  # noqa: E731
    for rate, per_mode in rep["rates"].items():
        rows = [[mode, f"{c['mean_jct_s']:.2f}", f"{c['p50_jct_s']:.2f}", f"{c['p90_jct_s']:.2f}",
                 f"{c['p99_jct_s']:.2f}", f"{c['mean_ttft_s']:.2f}", f"{c['throughput_tok_s']:.1f}",
                 ci(c["jct_cut_vs_fcfs"]) if "jct_cut_vs_fcfs" in c else "–",
                 sh(c["share_of_oracle_sjf"]) if "share_of_oracle_sjf" in c else "–",
                 sh(c["share_of_prompt_oracle_sjf"]) if "share_of_prompt_oracle_sjf" in c else "–",
                 f"{c.get('simulated_mean_jct_s', float('nan')):.2f}",
                 f"{c.get('prediction_mae_tokens', float('nan')):.1f}"] for mode, c in per_mode.items()]
        lines += [f"## Poisson {rate} req/s", "",
                  markdown_table(["mode", "mean JCT s", "p50", "p90", "p99", "mean TTFT s", "tok/s", "JCT cut vs FCFS",
                                  "share of oracle", "share of prompt oracle", "sim. mean JCT s", "pred. MAE"], rows), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from lenpred.serving.supervisor import exit_on_sigterm

    exit_on_sigterm()
    main()
