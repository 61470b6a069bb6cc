"""The age threshold's mean-vs-tail frontier on the engine's own trace slices (issue 49): each slice's plug-in run
re-simulated with ``max_wait_s`` = T, against the slice's stock run, at the pace of that stock run, on the cost model
the store's report was simulated with (:func:`lenpred.studies.queue_report.guard_frontier`). Reads a queue-benchmark
store (``runs.json`` and the ``report.json`` that ``queue_benchmark.py --report-only --sim-cost-model ...`` wrote);
writes ``guard_frontier_<pattern>[_<mode>][_<policy>].json``, ``.md`` and ``.png`` beside them. No engine; about 2 s
per threshold for 5 slices. Run from the repository root (the report names its cost model by a relative path)::

    python scripts/guard_frontier.py --store results/scripts/serving/queue_trace_engine/code_x1.1 \\
        --pattern tracecodex1.1 --max-waits 100,150,200,250,300
    python scripts/guard_frontier.py --store results/scripts/serving/queue_trace_engine/code_x0.9 \\
        --pattern tracecodex0.9 --max-waits 80,100,none --policy sjf      # none: no threshold
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lenpred.errors import LenpredError, run_script


def parse_max_waits(text: str) -> list[float | None]:
    """``"100,50,none"`` → ``[50.0, 100.0, None]``: finite seconds >= 0, sorted and each once, ``none`` (no
    threshold) last.

    Raises:
        LenpredError: an empty list, a word other than ``none``, or a value that is negative or not finite.
    """
    values: set[float] = set()
    none = False
    for part in (p.strip() for p in text.split(",")):
        if part.lower() == "none":
            none = True
            continue
        try:
            t = float(part)
        except ValueError:
            t = float("nan")
        if not 0 <= t < float("inf"):
            raise LenpredError(f"--max-waits takes seconds >= 0 or none, comma-separated; got {text!r}")
        values.add(t)
    if not values and not none:
        raise LenpredError("--max-waits is empty: give seconds, e.g. 100,200")
    return sorted(values) + ([None] if none else [])


def main() -> None:
    from lenpred.io import write_json
    from lenpred.studies.queue_render import frontier_markdown, plot_frontier
    from lenpred.studies.queue_report import guard_frontier

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--store", required=True, help="a queue-benchmark output directory (runs.json, report.json)")
    ap.add_argument("--pattern", required=True, help="a trace pattern of that store, e.g. tracecodex1.1")
    ap.add_argument("--max-waits", default="50,100,150,200,250,300",
                    help="the thresholds T, s, comma-separated; none: no threshold")
    ap.add_argument("--mode", default="plugin", help="the plug-in mode whose runs are re-simulated")
    ap.add_argument("--policy", default=None,
                    help="re-simulate under this decode-slot policy (e.g. sjf; default: the run's own)")
    args = ap.parse_args()
    store_dir = Path(args.store)
    if not (store_dir / "runs.json").is_file():
        raise LenpredError(f"{store_dir} holds no runs.json: give a store scripts/queue_benchmark.py wrote (e.g. "
                           "results/scripts/serving/queue_trace_engine/code_x1.1)")
    try:
        store = json.loads((store_dir / "runs.json").read_text())
        rep = json.loads((store_dir / "report.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LenpredError(f"{store_dir}: not a readable queue-benchmark store ({exc}); write its report with "
                           "queue_benchmark.py --report-only --out <store> --sim-cost-model <cost model>") from exc
    fr = guard_frontier(store, rep, args.pattern, parse_max_waits(args.max_waits), args.mode, args.policy)
    fr["command"] = "python scripts/guard_frontier.py " + " ".join(sys.argv[1:])
    # the pattern has dots (x1.1): names by f-string, not with_suffix
    stem = "_".join(["guard_frontier", args.pattern] + ([args.mode] if args.mode != "plugin" else [])
                    + ([args.policy] if args.policy else []))
    write_json(store_dir / f"{stem}.json", fr)
    (store_dir / f"{stem}.md").write_text(frontier_markdown(fr))
    plot_frontier(fr, store_dir / f"{stem}.png")
    print(frontier_markdown(fr))


if __name__ == "__main__":
    run_script(main)
