"""Scheduling where requests wait (issue 38): ``vllm serve`` on one core with a deep queue at a fixed decode bound D,
every mode on the same draws of test-split requests, natural EOS, paired with stock vLLM.

The regime, the arrival patterns, the modes, the controls and the report are described in
:mod:`lenpred.studies.queue_bench` (the settings, :class:`~lenpred.studies.queue_bench.QueueBenchConfig`, and the
runs), :mod:`lenpred.studies.queue_report` and :mod:`lenpred.studies.queue_render`; this script builds the config and
calls them. Output (``--out``, default ``results/scripts/serving/queue/``): ``runs.json`` (every run, as it finishes;
a restart skips finished runs, changed settings are refused), ``report.json``, ``report.md``,
``jct_cdf_<pattern>.png`` and, with a burst pattern, ``regime_map.png``; ``--report-only`` rewrites the report from
``runs.json``.

Size: at D = 16 a run is about 12 minutes (burst8 = 128 requests: 640-710 s; gamma1x1.1 at 0.22 req/s = 132
requests over 600 s, then the drain) and a draw of one pattern in all seven modes about 85 minutes; the two
acceptance patterns at 5 draws take about 14 hours, so they run over several sessions (a restart resumes)::

    .venv-vllm/bin/python scripts/queue_benchmark.py --capacity-req-s 0.20          # the acceptance patterns, 5 draws
    .venv-vllm/bin/python scripts/queue_benchmark.py --patterns burst8 --draws 1 --out /tmp/queue   # one draw (~85 min)
    .venv-vllm/bin/python scripts/queue_benchmark.py --draws 2 --patterns burst2,burst4 \\
        --modes stock,plugin,priority_oracle                              # the regime map's shallower depths
    .venv-vllm/bin/python scripts/queue_benchmark.py --plan               # the resolved regime and runs; starts nothing
    python scripts/queue_benchmark.py --report-only                       # the report from runs.json (no engine)

The prompts are re-read from ``../shared/datasets`` (elsewhere set ``LENPRED_DATA_DIR``).
"""

from __future__ import annotations

import argparse

from lenpred.errors import run_script
from lenpred.studies.queue_bench import QueueBenchConfig
from lenpred.studies.queue_regime import QUEUE_MODES


def parse_args() -> tuple[QueueBenchConfig, argparse.Namespace]:
    """``(config, actions)``: the settings as a :class:`QueueBenchConfig` (its defaults) and ``report_only`` /
    ``plan``."""
    d = QueueBenchConfig()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--decode-bound", type=int, default=d.decode_bound,
                    help="D: sequences decoded per step at most, every mode")
    ap.add_argument("--patterns", default=d.patterns,
                    help="burst<k> (k·D at once), gamma<cv>x<load>, trace<code|conv>x<load> (a slice of the Azure "
                         "trace stretched to load × the capacity)")
    ap.add_argument("--modes", default=d.modes, help=f"any of {', '.join(QUEUE_MODES)}")
    ap.add_argument("--draws", type=int, default=d.draws)
    ap.add_argument("--only-draws", default=d.only_draws,
                    help="comma-separated draws to run now (one slice's modes in one sitting); default: every draw")
    ap.add_argument("--seed", type=int, default=d.seed, help="draw d uses seed + d (requests and arrivals)")
    ap.add_argument("--window-s", type=float, default=d.window_s, help="arrival window of the gamma patterns, s")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens,
                    help="clip every recorded cap to this many tokens (a labelled diagnostic; default: none)")
    ap.add_argument("--cost-model", default=d.cost_model, help="cost model of the simulated FCFS capacity at D")
    ap.add_argument("--sim-cost-model", default=d.sim_cost_model,
                    help="cost model of the report's simulator on the same runs (predicted / measured mean JCT)")
    ap.add_argument("--plugin-config", default=d.plugin_config, help="JSON merged over the plug-in's defaults at D")
    ap.add_argument("--capacity-req-s", type=float, default=d.capacity_req_s,
                    help="stock FCFS capacity at D, requests/s, measured on the engine (N / makespan of its burst "
                         "runs); sets the sustained patterns' rates (default: simulated with --cost-model)")
    ap.add_argument("--run-timeout-s", type=float, default=d.run_timeout_s,
                    help="each run ends by then: the client gives up on what is left (outcome cancelled), s")
    ap.add_argument("--vllm-cpus", default=d.vllm_cpus)
    ap.add_argument("--client-cpus", default=d.client_cpus, help="this client and the lenpred serve proxy")
    ap.add_argument("--bootstrap-resamples", type=int, default=d.bootstrap_resamples)
    ap.add_argument("--report-only", action="store_true", help="write the report from runs.json")
    ap.add_argument("--plan", action="store_true", help="print the resolved regime and the runs to do; start nothing")
    ap.add_argument("--out", default=d.out)
    args = vars(ap.parse_args())
    actions = argparse.Namespace(report_only=args.pop("report_only"), plan=args.pop("plan"))
    return QueueBenchConfig(**args), actions


def main() -> None:
    from lenpred.studies.engine_bench import engine_env
    from lenpred.studies.queue_bench import load_runs, plan_text, run
    from lenpred.studies.queue_render import markdown, save_report

    cfg, actions = parse_args()
    engine_env()
    if actions.plan:
        return print(plan_text(cfg))
    store = load_runs(cfg.out) if actions.report_only else run(cfg)
    print(markdown(save_report(store, cfg.out, cfg.bootstrap_resamples, cfg.sim_cost_model)))


if __name__ == "__main__":
    from lenpred.serving.supervisor import exit_on_sigterm

    exit_on_sigterm()
    run_script(main)
