"""Switching heads without dropping requests (issue 48, item 4), on the real engine: vLLM loads the plug-in's head
once, at start-up, so a new head reaches the serving path by a restart, done as for any vLLM upgrade.

The run: engine **A** (``vllm serve`` with the plug-in and the ``old`` head, its traffic log on, started with
``--shutdown-timeout``) serves ``num_requests`` streaming test-split requests (natural EOS, recorded sampling
settings) that arrive over ``arrival_s`` seconds. While they are in flight engine **B** starts with the ``new`` head
(its own traffic log) on the next port; once B answers, A gets SIGTERM: vLLM refuses new requests and lets the
in-flight ones finish, the plug-in's scheduler closes A's traffic log on shutdown. Then ``num_after`` requests go to
B. What is checked and written (``out/head_switch.json``): every request sent to A finished (no error, no cut
stream), how many were in flight at the SIGTERM, A's exit code and drain time, a request sent to A after the SIGTERM
refused, both traffic logs holding exactly their engine's finished requests, and B's logged predictions equal to the
new head's on the logged states (B served the new head).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lenpred.errors import LenpredError


@dataclass
class HeadSwitchConfig:
    """Settings of :func:`run_head_switch` (``scripts/head_switch.py``).

    Attributes:
        old, new: the head A serves (``None``: the shipped one) and the head B serves (a ``lenpred train`` dir).
        num_requests, arrival_s: requests sent to A, spread evenly over this many seconds.
        num_after: requests sent to B once A has the SIGTERM.
        shutdown_timeout_s: A's ``--shutdown-timeout`` (its drain's bound).
        seed: the test-split draw.
        vllm_cpus_a, vllm_cpus_b: each engine's cores.
        out: the output directory (``head_switch.json``, the engines' logs, both traffic logs).
    """

    old: str | None = None
    new: str = "results/scripts/first_head/heads/first-1000"
    num_requests: int = 32
    arrival_s: float = 20.0
    num_after: int = 8
    shutdown_timeout_s: int = 600
    seed: int = 7
    vllm_cpus_a: str = "0"
    vllm_cpus_b: str = "1"
    out: str = "results/scripts/serving/head_switch"


def _command(model_dir: str, port: int, head: str | None, traffic: Path, timeout_s: int) -> list[str]:
    from lenpred.serving.vllm.config import EngineConfig
    from lenpred.studies.engine_bench import PORT, plugin_args, vllm_command

    cmd = vllm_command(model_dir, 32, 1 << 30, 2422, ["--scheduling-policy", "priority", *plugin_args(
        EngineConfig(predictor=head, traffic_log=str(traffic))), "--shutdown-timeout", str(timeout_s)])
    return [str(port) if c == str(PORT) else c for c in cmd]


def run_head_switch(cfg: HeadSwitchConfig) -> dict:
    """The run (module docstring); writes and returns ``head_switch.json``.

    Raises:
        LenpredError: a non-empty ``out``, a head that is not a saved predictor, a port in use or an engine that
            does not start (its log named)."""
    import subprocess

    import httpx

    from lenpred.backbone import resolve_model
    from lenpred.online.traffic_log import read_traffic_log
    from lenpred.pipeline import LengthPredictor
    from lenpred.serving.loadgen import run_replay
    from lenpred.serving.supervisor import ServerGroup, parse_cpu_set
    from lenpred.studies.engine_bench import MODEL_NAME, PORT, EngineWorkload, engine_env, load_requests

    out = Path(cfg.out)
    if out.exists() and any(out.iterdir()):
        raise LenpredError(f"{out} is not empty: its traffic logs would mix runs; pass a fresh --out")
    for flag, head in (("--old", cfg.old), ("--new", cfg.new)):  # before an engine starts, not after A's 900 s
        if head is not None and not (Path(head) / "config.json").is_file():
            raise LenpredError(f"{flag} {head} is not a saved predictor (no config.json): pass a `lenpred train` "
                               "output directory")
    engine_env()
    model_dir = str(resolve_model()[0])
    source = EngineWorkload()
    rows = source.draw(cfg.num_requests + cfg.num_after, cfg.seed)
    messages = source.messages([rows])
    gap = cfg.arrival_s / max(cfg.num_requests - 1, 1)
    to_a = load_requests(rows[:cfg.num_requests], messages, [i * gap for i in range(cfg.num_requests)], "a-")
    to_b = load_requests(rows[cfg.num_requests:], messages, [0.0] * cfg.num_after, "b-")
    urls = [f"http://127.0.0.1:{PORT}", f"http://127.0.0.1:{PORT + 2}"]
    engines = [ServerGroup([_command(model_dir, PORT + 2 * k, head, out / f"traffic_{name}", cfg.shutdown_timeout_s)],
                           [f"{urls[k]}/health"], [out / f"engine_{name}.log"], 900.0, [parse_cpu_set(cpus)],
                           ports=(PORT + 2 * k,))
               for k, (name, head, cpus) in enumerate((("a", cfg.old, cfg.vllm_cpus_a),
                                                        ("b", cfg.new, cfg.vllm_cpus_b)))]
    result: dict = {}
    with engines[0] as a:
        replay = threading.Thread(target=lambda: result.update(a=run_replay(urls[0], to_a, MODEL_NAME)))
        t0 = time.monotonic()
        replay.start()
        with engines[1]:
            started_b = time.monotonic() - t0
            proc = a.procs[0]
            in_flight = _running(urls[0])
            t_term = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            time.sleep(2.0)
            try:
                refused = httpx.post(f"{urls[0]}/v1/chat/completions", timeout=10, json={
                    "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                ).status_code >= 400
            except httpx.HTTPError:
                refused = True
            replay.join()
            try:
                code = proc.wait(timeout=cfg.shutdown_timeout_s + 60)
            except subprocess.TimeoutExpired:
                code = None
            drain_s = time.monotonic() - t_term
            result["b"] = run_replay(urls[1], to_b, MODEL_NAME)
    logs = {k: read_traffic_log(out / f"traffic_{k}") for k in ("a", "b")}
    new = LengthPredictor.from_pretrained(cfg.new, load_model=False)
    c = logs["b"].columns
    from_new = new.predict_states(logs["b"].features, c["num_prompt_tokens"].astype(int).tolist(),
                                  c["max_new_tokens"].astype(int).tolist())
    report = {"config": asdict(cfg), "engine_b_ready_after_s": started_b, "in_flight_at_sigterm": in_flight,
              "a_exit_code": code, "a_drain_s": drain_s, "a_refused_new_request": refused,
              "a": _outcomes(result["a"]), "b": _outcomes(result["b"]),
              "traffic_log_rows": {k: v.num_records for k, v in logs.items()},
              "traffic_log_heads": {k: json.loads(v.metadata["layers"]) for k, v in logs.items()},
              "b_expected_max_abs_diff_vs_new_head_tokens": float(max(abs(p.expected - e) for p, e in zip(
                  from_new, c["expected"])))}
    out.mkdir(parents=True, exist_ok=True)
    (out / "head_switch.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _running(url: str) -> int | None:
    """vLLM's ``vllm:num_requests_running`` gauge from ``/metrics`` (``None``: not found)."""
    import httpx

    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return int(float(line.rsplit(" ", 1)[1]))
    return None


def _outcomes(results: list[dict]) -> dict:
    """Requests sent, how many finished (outcome ``ok``) and the other outcomes."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return {"sent": len(results), "ok": counts.get("ok", 0), "outcomes": counts}
