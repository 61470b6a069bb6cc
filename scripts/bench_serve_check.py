"""`vllm bench serve` and the project's client on the same workload (issue 49): stock vLLM and the plug-in, each
measured by both clients on one Gamma draw of test-split requests, paired request by request.

The study is :mod:`lenpred.studies.bench_serve` (the design, and why the trace runs keep the project's client); this
script parses the settings and runs it. Four runs of about 9 minutes on one core at D = 16 (capacity 0.331 req/s,
CV 1, 1.1× load: 146 requests over 400 s). Output (``--out``, default ``results/scripts/serving/bench_serve/``):
``runs.json``, ``report.json``, ``report.md``, ``bench_serve.png``, ``vllm_bench/<mode>.json``::

    .venv-vllm/bin/python scripts/bench_serve_check.py --capacity-req-s 0.331
    .venv-vllm/bin/python scripts/bench_serve_check.py --capacity-req-s 0.331 --window-s 100 --out /tmp/bs  # a look
    python scripts/bench_serve_check.py --capacity-req-s 0.331 --report-only        # the report from runs.json
"""

from __future__ import annotations

import argparse
import dataclasses

from lenpred.errors import run_script
from lenpred.studies.bench_serve import BenchServeConfig


def main() -> None:
    from lenpred.studies.bench_serve import run, save_report
    from lenpred.studies.engine_bench import engine_env
    from lenpred.studies.queue_bench import load_runs

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    for f in dataclasses.fields(BenchServeConfig):  # one flag per setting (their meaning: the class docstring)
        kind = float if f.name == "capacity_req_s" else type(f.default)
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)
    ap.add_argument("--report-only", action="store_true", help="write the report from runs.json")
    args = vars(ap.parse_args())
    report_only = args.pop("report_only")
    cfg = BenchServeConfig(**args)
    engine_env()
    store = load_runs(cfg.out) if report_only else run(cfg)
    print(save_report(store, cfg))


if __name__ == "__main__":
    from lenpred.serving.supervisor import exit_on_sigterm

    exit_on_sigterm()
    run_script(main)
