"""Parked decoding in the simulator: can prefill-on-arrival + parked decode, re-ranked with what decoding reveals,
beat SJF by the prompt oracle? Stock continuous batching (FCFS, SJF by prediction at admission) vs parked FCFS / SJF
/ SRPT driven by the shipped head, PLP, TRAIL-progressive and the static head conditioned on the tokens generated,
vs parked SJF by the prompt oracle (the mean length of the prompt's other test samples, else its scenario's median:
:func:`lenpred.studies.workload.table_prompt_oracle`, the engine benchmark's rule) and by the recorded length.

The study is :mod:`lenpred.studies.parked_sim`; this script builds its config. Committed workload table and
progressive estimates, the transformers cost model of ``lenpred schedule simulate`` (same settings: 200 requests per
draw, ``max_num_seqs`` 8 = the decode slots, token budget 2048), all-at-once and Poisson arrivals at 0.9 × the FCFS
throughput. Intervals: 95 %, paired over requests clustered by draw (the mean JCT: over draws). Output:
``results/scripts/serving/parked_simulation.{json,md}``::

    python scripts/parked_simulation.py --draws 10
    python scripts/parked_simulation.py --num-requests 32 --decode-slots 4 --max-idle-s 60 --max-tokens 256 \\
        --cost-model results/scheduling/cost_vllm.json --out results/scripts/serving/parked_simulation_vllm
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lenpred.errors import run_script
from lenpred.studies.parked_sim import ParkedSimConfig


def parse_config() -> ParkedSimConfig:
    """The command line as a :class:`ParkedSimConfig` (its defaults)."""
    d = ParkedSimConfig()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--draws", type=int, default=d.draws)
    ap.add_argument("--num-requests", type=int, default=d.num_requests)
    ap.add_argument("--decode-slots", type=int, default=d.decode_slots)
    ap.add_argument("--max-idle-s", type=float, default=d.max_idle_s)
    ap.add_argument("--cost-model", default=d.cost_model)
    ap.add_argument("--prefill-scale", type=float, default=d.prefill_scale,
                    help="multiply the cost model's prefill coefficients (p0, p1, p2): < 1 models an engine whose "
                         "prefill is cheaper relative to decode (a GPU), where prefill on arrival costs less")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens, help="clip every cap (and recorded length) to this")
    ap.add_argument("--prefill-ahead", type=int, default=d.prefill_ahead, help="parked policies' prefill-ahead bound")
    ap.add_argument("--bootstrap-resamples", type=int, default=d.bootstrap_resamples)
    ap.add_argument("--out", default=d.out, help="output path prefix")
    return ParkedSimConfig(**vars(ap.parse_args()))


def main() -> None:
    from lenpred.io import write_json
    from lenpred.studies.parked_sim import markdown, run

    cfg = parse_config()
    report = run(cfg)
    write_json(cfg.out + ".json", report)
    text = markdown(report)
    Path(cfg.out + ".md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    run_script(main)
