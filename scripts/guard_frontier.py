"""The age threshold's mean-vs-tail frontier on the engine's own trace slices (issue 49): each slice's plug-in run
re-simulated with ``max_wait_s`` = T, against the slice's stock run, at the pace of that stock run
(:func:`lenpred.studies.queue_report.guard_frontier`). Reads a queue-benchmark store (``runs.json`` and the
``report.json`` that ``queue_benchmark.py --report-only`` wrote with ``--sim-cost-model``); writes
``guard_frontier_<pattern>.json``, ``.md`` and ``.png`` beside them. No engine; about 15 s per slice and T here::

    python scripts/guard_frontier.py --store results/scripts/serving/queue_trace_engine/code_x1.1 \\
        --pattern tracecodex1.1 --max-waits 100,150,200,250,300
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lenpred.errors import LenpredError

COST = "results/scripts/serving/queue_guard/cost/cost_vllm_1core_sampled.json"


def main() -> None:
    from lenpred.io import write_json
    from lenpred.studies.queue_render import frontier_markdown, plot_frontier
    from lenpred.studies.queue_report import guard_frontier

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="a queue-benchmark output directory (runs.json, report.json)")
    ap.add_argument("--pattern", required=True, help="a trace pattern of that store, e.g. tracecodex1.1")
    ap.add_argument("--max-waits", default="50,100,150,200,250,300", help="the thresholds T, s, comma-separated")
    ap.add_argument("--policy", default=None,
                    help="re-simulate under this decode-slot policy (e.g. sjf; default: the run's own)")
    ap.add_argument("--sim-cost-model", default=COST, help="the cost model the report was simulated with")
    args = ap.parse_args()
    store_dir = Path(args.store)
    try:
        store = json.loads((store_dir / "runs.json").read_text())
        rep = json.loads((store_dir / "report.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LenpredError(f"{store_dir}: not a readable queue-benchmark store ({exc}); run queue_benchmark.py there "
                           "first") from exc
    try:
        max_waits = [float(t) for t in args.max_waits.split(",")]
    except ValueError as exc:
        raise LenpredError(f"--max-waits must be numbers of seconds, comma-separated, got {args.max_waits!r}") from exc
    if not all(t >= 0 for t in max_waits):
        raise LenpredError(f"--max-waits must be >= 0 s, got {args.max_waits!r}")
    fr = guard_frontier(store, rep, args.pattern, max_waits, args.sim_cost_model, args.policy)
    # the pattern has dots (x1.1): names by f-string, not with_suffix
    stem = f"guard_frontier_{args.pattern}" + (f"_{args.policy}" if args.policy else "")
    write_json(store_dir / f"{stem}.json", fr)
    (store_dir / f"{stem}.md").write_text(frontier_markdown(fr))
    plot_frontier(fr, store_dir / f"{stem}.png")
    print(frontier_markdown(fr))


if __name__ == "__main__":
    import sys

    try:
        main()
    except LenpredError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
