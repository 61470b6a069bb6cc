"""What learning from traffic costs: traffic-log bytes per request, `record()` per request (it journals the row on
the caller's thread), the part write per request (the writer's thread), what serving with no head costs the caller's
thread per request (`OnlineLearning.capture` + `finished`: the plug-in's `predictor: none`), and the refit time for
1,000 / 10,000 logged requests.

Run under the CPU lock (numbers quoted in docs/serving.md come from it):

    flock /tmp/lenpred-cpu.lock python scripts/traffic_log_cost.py [--log-only]

Features are synthetic (Gaussian, the shipped predictor's width 576; real hidden states compress about as
badly, see results/traffic/results.md for the replayed log's bytes per request); the refit uses the shipped
head's hyper-parameters (150 epochs) and 25 % capped requests. Writes results/scripts/traffic/cost.json.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def log_cost(dtype: str, n: int = 20000, dim: int = 576) -> dict:
    """Per request: ``record()`` on the caller's thread (it journals the row: one checksummed JSON line), the part
    write on the writer's thread (timed here on this thread, that thread stopped), and the bytes the journal and
    the parts take."""
    from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord

    rng = np.random.default_rng(0)
    feats = rng.normal(0, 1, (n, dim)).astype(np.float32)  # every row distinct (repeats would compress)
    records = [TrafficRecord(features=feats[i], expected=100.0, low=20.0, high=300.0, num_output_tokens=120,
                             finish_reason="stop", max_new_tokens=512, arrival_time_s=1.7e9 + i,
                             first_token_time_s=1.7e9 + i + 0.1, finish_time_s=1.7e9 + i + 2, low_raw=30.0,
                             high_raw=280.0, num_prompt_tokens=80, prompt_sha256="ab" * 32, group="chat")
               for i in range(n)]
    with tempfile.TemporaryDirectory() as d:
        w = TrafficLogWriter(TrafficLogConfig(d, features_dtype=dtype, max_records_per_part=n + 1,
                                              max_part_bytes=1 << 40, max_part_age_s=3600))
        w._stop.set()
        with w._changed:
            w._changed.notify_all()
        w._thread.join()  # no background work from here on: time each stage on this thread
        t0 = time.perf_counter()
        for r in records:
            w.record(r)
        record_s = time.perf_counter() - t0
        journal_bytes = sum(p.stat().st_size for p in Path(d).glob("*.open"))
        t1 = time.perf_counter()
        with w._lock:
            w._seal_head()
        w._write_part(w._buffers[0])
        write_s = time.perf_counter() - t1
        size = sum(p.stat().st_size for p in Path(d).glob("part-*.parquet*"))
    return {"features_dtype": dtype, "num_requests": n, "record_us_per_request": 1e6 * record_s / n,
            "journal_bytes_per_request": journal_bytes / n, "write_us_per_request": 1e6 * write_s / n,
            "bytes_per_request": size / n}


def capture_cost(n: int = 20000, dim: int = 576) -> dict:
    """Per request, on the caller's thread, serving with no head (:mod:`lenpred.online.capture`): ``capture()``
    when the prefill ends and ``finished()`` (which records the row) when it finishes; the log's own thread writes
    the parts meanwhile, as in the engine."""
    from lenpred.online.capture import HeadlessCapture
    from lenpred.online.learning import OnlineLearning
    from lenpred.online.traffic_log import TrafficLogConfig
    from lenpred.outcome import RequestOutcome

    feats = np.random.default_rng(1).normal(0, 1, (n, dim)).astype(np.float32)
    outcomes = [RequestOutcome(request_id=str(i), num_output_tokens=120, finish_reason="stop", max_new_tokens=512,
                               arrival_time_s=1.7e9 + i, first_token_time_s=1.7e9 + i + 0.1,
                               finish_time_s=1.7e9 + i + 2) for i in range(n)]
    with tempfile.TemporaryDirectory() as d:
        online = OnlineLearning(HeadlessCapture("m", "rev", 15, dim, "rule"), log=TrafficLogConfig(d))
        per = np.empty(n)
        for i in range(n):
            t = time.perf_counter()
            online.finished(online.capture(feats[i], 80, 512), outcomes[i])
            per[i] = time.perf_counter() - t
        online.close()
    return {"num_requests": n, "features_dtype": "float16", "caller_us_per_request_mean": 1e6 * float(per.mean()),
            "caller_us_per_request_p99": 1e6 * float(np.percentile(per, 99))}


def refit_cost(n: int, dim: int = 576) -> dict:
    from lenpred.online.refit import TrafficRows, fit_head

    rng = np.random.default_rng(n)
    y = np.minimum(np.round(rng.lognormal(5, 1, n)), 512)
    rows = TrafficRows(rng.normal(0, 1, (n, dim)).astype(np.float32), y, y >= 512, np.full(n, 512.0),
                       np.array([f"r{i}" for i in range(n)], dtype=object), np.full(n, "traffic", dtype=object))
    t = time.perf_counter()
    fit_head(rows, {"epochs": 150, "binning": "log"}, 0)
    return {"num_requests": n, "epochs": 150, "refit_s": time.perf_counter() - t}


def main() -> None:
    from lenpred.io import write_json

    import argparse

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--log-only", action="store_true", help="re-time the log only; keep the stored refit times")
    args = ap.parse_args()
    path = Path("results/scripts/traffic/cost.json")
    stored = json.loads(path.read_text()) if args.log_only else {}
    out = {"torch_threads": stored.get("torch_threads", torch.get_num_threads()),  # the refit's (the log uses none)
           "log": [log_cost("float16"), log_cost("float32")], "no_head": capture_cost()}
    out["refit"] = stored["refit"] if args.log_only else [refit_cost(1000), refit_cost(10000)]
    write_json(path, out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
