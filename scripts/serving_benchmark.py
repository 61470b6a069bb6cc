"""The in-engine scheduler on real traffic: ``vllm serve`` on one core, every mode on the same draws of test-split
requests, natural EOS, three arrival patterns, stall-aware latency, paired with stock vLLM.

The study is :mod:`lenpred.studies.serving_bench` (report, pairing, the simulator on the same draws) over
:mod:`lenpred.studies.serving_bench_runs` (workload, modes, patterns, the grid of runs): this script builds its
:class:`~lenpred.studies.serving_bench_runs.ServingBenchConfig` from the options (one default each, the config's).
Arrivals: ``burst`` (all at ``t = 0``) and Poisson at 0.7 and 0.9 of the capacity measured by
``scripts/decode_knee.py``. The whole benchmark holds ``/tmp/lenpred-cpu.lock`` (``flock``); each run is written
when it finishes (``runs.json``); a restart skips finished runs, and settings that differ from the stored ones are
refused. Report: ``results/scripts/serving/benchmark/`` (``report.json``, ``report.md``, ``jct_cdf_<pattern>.png``).

One draw, as a newcomer would (about 80 minutes on 2 cores: 8 modes x 3 patterns; a fresh ``--out``, since the
committed ``runs.json`` already holds draws 0-4 and a restart only adds what is missing; the prompts are re-read from
``../shared/datasets``, elsewhere set ``LENPRED_DATA_DIR``)::

    .venv-vllm/bin/python scripts/serving_benchmark.py --draws 1 --out /tmp/bench
    .venv-vllm/bin/python scripts/decode_knee.py --out /tmp/knee   # optional: this machine's own knee and cost model
                                                                  # (then pass --knee and --cost-model)
    .venv/bin/python scripts/serving_benchmark.py --report-only    # the committed report, from the committed runs
"""

from __future__ import annotations

import argparse

from lenpred.studies.serving_bench import render_markdown, run
from lenpred.studies.serving_bench_runs import ServingBenchConfig


def parse_config() -> ServingBenchConfig:
    d = ServingBenchConfig()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--num-requests", type=int, default=d.num_requests, help="requests per draw")
    ap.add_argument("--draws", type=int, default=d.draws)
    ap.add_argument("--seed", type=int, default=d.seed, help="seed of draw 0 (draw d: seed + d)")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens, help="clip every recorded cap to this "
                    "(default: none)")
    ap.add_argument("--decode-slots", type=int, default=d.decode_slots)
    ap.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    ap.add_argument("--kv-cache-gib", type=float, default=d.kv_cache_gib)
    ap.add_argument("--max-idle-s", type=float, default=d.max_idle_s)
    ap.add_argument("--vllm-cpus", default=d.vllm_cpus)
    ap.add_argument("--client-cpus", default=d.client_cpus)
    ap.add_argument("--modes", default=d.modes)
    ap.add_argument("--knee", default=d.knee)
    ap.add_argument("--cost-model", default=d.cost_model)
    ap.add_argument("--bootstrap-resamples", type=int, default=d.bootstrap_resamples)
    ap.add_argument("--report-only", action="store_true", help="write the report from the finished runs")
    ap.add_argument("--out", default=d.out)
    return ServingBenchConfig(**vars(ap.parse_args()))


def main() -> None:
    print(render_markdown(run(parse_config())))


if __name__ == "__main__":
    from lenpred.serving.supervisor import exit_on_sigterm

    exit_on_sigterm()
    main()
