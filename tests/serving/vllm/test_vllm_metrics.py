"""Issue #28 item 9 on the real server: the plug-in's counters in a real ``vllm serve``'s ``/metrics``.

``vllm serve`` (the OpenAI server, loopback only) starts with ``PROMETHEUS_MULTIPROC_DIR`` set to a fresh directory
and the plug-in in ``observe`` mode; after 6 chat requests have finished, ``/metrics`` must list each
``lenpred_*_total`` counter exactly once, count 6 predicted requests and no missing state, and still hold vLLM's own
metrics (multiprocess mode must not hide them)."""

import re
import sys
import time

import pytest
from conftest import free_port

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

N = 6


def _samples(text: str, name: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")]


def test_vllm_serve_metrics_list_each_plugin_counter_once(tmp_path, monkeypatch):
    import httpx

    from lenpred.backbone import resolve_model
    from lenpred.serving.supervisor import ServerGroup
    from lenpred.serving.vllm.config import EngineConfig
    from lenpred.serving.vllm.prometheus import COUNTERS, metric_name

    prom = tmp_path / "prometheus"
    prom.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(prom))
    port = free_port()
    cfg = EngineConfig(policy="observe", plp=False, log_path=str(tmp_path / "requests.jsonl"))
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(resolve_model()[0]),
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "m", "--dtype", "float32",
           "--enforce-eager", "--max-model-len", "1024", "--max-num-seqs", "8", "--kv-cache-memory-bytes",
           str(1 << 28), "--generation-config", "vllm", "--disable-uvicorn-access-log",
           "--worker-cls", "lenpred.serving.vllm.worker.LenpredCPUWorker",
           "--scheduler-cls", "lenpred.serving.vllm.scheduler.LenpredScheduler", "--additional-config", cfg.to_json()]
    url = f"http://127.0.0.1:{port}"
    with ServerGroup([cmd], [f"{url}/health"], [tmp_path / "serve.log"], timeout_s=300, ports=(port,)):
        with httpx.Client(base_url=url, timeout=120) as client:
            for k in range(N):  # sequential: every request is prefilled, decoded 40 steps and finished
                r = client.post("/v1/chat/completions", json={
                    "model": "m", "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"Count to {k + 3}."}]})
                assert r.status_code == 200, r.text
            deadline = time.monotonic() + 30  # counters reach the directory every 16 steps
            while True:
                text = client.get("/metrics").text
                if _samples(text, "lenpred_predicted_total") == [N] or time.monotonic() > deadline:
                    break
                time.sleep(1)
    for key in COUNTERS:
        name = metric_name(key)
        assert len(re.findall(rf"^# TYPE {name}(_total)? counter$", text, re.M)) == 1, name
        assert len(_samples(text, f"{name}_total")) == 1, name
    assert _samples(text, "lenpred_predicted_total") == [N]
    assert _samples(text, "lenpred_missing_states_total") == [0]
    assert _samples(text, "lenpred_steps_total")[0] >= N * 40
    assert sum(_samples(text, "vllm:request_success_total")) == N
