"""Prefill-signal overhead on the default model: plain serving prefill vs prefill + signals (+ pooling + head), full
vs pruned output head, batch 1/8/32 x 128/512/2048 prompt tokens (cases over --max-batch-tokens skipped).

Same as ``lenpred diagnose --sections overhead``; writes ``results/diagnose/overhead.json`` and re-renders
``results/diagnose/REPORT.md``. A timing: run it alone, under the CPU lock::

    flock /tmp/lenpred-cpu.lock python scripts/overhead.py --max-batch-tokens 4096
"""

import argparse

from rich.console import Console

from lenpred.studies.diagnose.config import DiagnoseConfig
from lenpred.studies.diagnose.run import render_diagnose, run_diagnose

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--max-batch-tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--k", type=int, default=4096, help="pruned output-vocabulary size")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="results/diagnose")
    a = ap.parse_args()
    report = run_diagnose(DiagnoseConfig(sections=("overhead",), max_batch_tokens=a.max_batch_tokens,
                                         overhead_repeats=a.repeats, overhead_k=a.k, threads=a.threads, out=a.out))
    render_diagnose(report, Console())
