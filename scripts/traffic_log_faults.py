"""kill -9 of a fast traffic-log writer: rows lost per kill, at random moments and around rotations, what the reader
reads back and what the next writer recovers.

    python scripts/traffic_log_faults.py [--kills 24] [--rate 3000] [--rows-per-part 64] [--out DIR]
    python scripts/traffic_log_faults.py --report-only [--out DIR]   # the table again, from DIR/faults.json

The study is :mod:`lenpred.studies.traffic_log_faults` (the writer process, the kills, the reads and recoveries);
this script builds its :class:`~lenpred.studies.traffic_log_faults.TrafficLogFaultsConfig` from the options. Writes
``DIR/faults.json`` (default ``results/scripts/traffic``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lenpred.studies.traffic_log_faults import TrafficLogFaultsConfig, TrafficLogFaultsReport, render_markdown, run


def main() -> None:
    d = TrafficLogFaultsConfig()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--kills", type=int, default=d.kills)
    ap.add_argument("--rate", type=float, default=d.rate, help="rows per second the writer records")
    ap.add_argument("--rows-per-part", type=int, default=d.rows_per_part)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--out", default=d.out)
    ap.add_argument("--report-only", action="store_true", help="print the table from the stored faults.json")
    args = ap.parse_args()
    if args.report_only:
        report = TrafficLogFaultsReport(**json.loads((Path(args.out) / "faults.json").read_text()))
    else:
        report = run(TrafficLogFaultsConfig(args.kills, args.rate, args.rows_per_part, args.seed, args.out))
    print(render_markdown(report))


if __name__ == "__main__":
    main()
