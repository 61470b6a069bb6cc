"""What learning from traffic adds to `lenpred serve` per request, on the shipped predictor: the served interval
and features from the prediction pass (`LengthPredictorService(online=...)`: the head's features pooled again and
one head call) and the finished-request hook (`traffic_hook`: the adaptive update and the log's `record`).

Batches of 16 short prompts are predicted with online learning off and on (ACI + traffic log), alternating ABBA
over `--repeats` rounds (the whole prediction per request, both ways); the step online learning adds (the served
interval from the head pass's quantiles, the features kept to log) is also timed alone, since it is far below the
prediction's run-to-run noise. Run under the CPU lock:

    flock /tmp/lenpred-cpu.lock python scripts/serve_traffic_cost.py

Writes `results/scripts/serve_traffic_cost.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

PROMPTS = ["Write a haiku about rain", "What is 17 * 23?", "Explain how TCP congestion control works.",
           "Write a 1000-word story about a lighthouse keeper", "Translate 'good morning' into French.",
           "List three uses of baking soda.", "Solve: a train leaves at 3 pm at 60 km/h; when has it gone 150 km?",
           "Summarise the plot of Hamlet in two sentences."] * 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="results/scripts/serve_traffic_cost.json")
    args = ap.parse_args()

    import torch

    from lenpred.pipeline import LengthPredictor
    from lenpred.online.adaptive import AdaptiveConfig
    from lenpred.online.learning import OnlineLearning
    from lenpred.serving.proxy.app import traffic_hook
    from lenpred.serving.proxy.batching import LengthPredictorService
    from lenpred.serving.proxy.state import FinishedRequest
    from lenpred.online.traffic_log import TrafficLogConfig

    torch.set_num_threads(1)
    lp = LengthPredictor.from_pretrained()
    with tempfile.TemporaryDirectory() as d:
        online = OnlineLearning(lp, log=TrafficLogConfig(d), adaptive=AdaptiveConfig(method="aci"))
        services = {"off": LengthPredictorService(lp, tokenizers=1),
                    "on": LengthPredictorService(lp, tokenizers=1, online=online)}
        hook = traffic_hook(online)
        times = {"off": [], "on": []}
        for r in range(args.repeats):
            for mode in ("off", "on", "on", "off") if r % 2 == 0 else ("on", "off", "off", "on"):
                items = [services[mode].prepare([p], 512) for p in PROMPTS]
                t0 = time.perf_counter()
                services[mode].predict_batch(items)
                times[mode].append((time.perf_counter() - t0) / len(items))
        served = items[0].served
        flat = [r for item in items for r in item.payload[0]]
        predictions, features = lp.predict(flat, return_features=True)  # what a batch's one pass gives
        serve_s = []
        for _ in range(200):  # the step online learning adds to a batch, timed alone
            t0 = time.perf_counter()
            services["on"].attach_served(items, features, predictions)
            serve_s.append((time.perf_counter() - t0) / len(items))
        hook_s = []
        for i in range(2000):
            rec = FinishedRequest(request_id=f"r{i}", num_output_tokens=100, finish_reason="stop", max_new_tokens=512,
                                  arrival_time_s=1.7e9 + i, first_token_time_s=1.7e9 + i + 0.1,
                                  finish_time_s=1.7e9 + i + 2, client_request_id=None, path="/v1/chat/completions",
                                  outcome="forwarded", expected_tokens=served.expected, prediction_cap_tokens=512,
                                  served=served)
            t0 = time.perf_counter()
            hook(rec)
            hook_s.append(time.perf_counter() - t0)
        online.close()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    out = {"batch_size": len(PROMPTS), "repeats": args.repeats, "threads": 1,
           "predict_per_request_ms": {"off": 1e3 * off, "on": 1e3 * on},
           "on_minus_off_us_per_request": 1e6 * (on - off),
           "served_interval_and_features_us_per_request": 1e6 * statistics.median(serve_s),
           "finished_hook_us_per_request": {"median": 1e6 * statistics.median(hook_s),
                                            "p99": 1e6 * sorted(hook_s)[int(0.99 * len(hook_s))]}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
