"""`lenpred predict` before vs after it took the cheapest forward (issue 37): the README's 3 prompts and 32 prompts,
warm, in one paired, interleaved run.

Usage: python scripts/predict_speed.py [--before main] [--rounds 7] [--cli-rounds 5] [--threads 1]
       [--data-dir ../shared/datasets] [--out results/scripts/predict_speed/predict_speed.json]
       python scripts/predict_speed.py --report-only [--out ...]   # the table again, from the stored JSON

The study is :mod:`lenpred.studies.predict_speed` (``before`` is ``src/`` at git revision ``--before``, ``after``
this checkout's; warm in-process calls and whole ``lenpred predict`` commands, paired and interleaved; both sides
must predict the same to 0.1 token); this script builds its :class:`~lenpred.studies.predict_speed.PredictSpeedConfig`
from the options. The machine is shared: quote medians and ratios.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lenpred.studies.predict_speed import PredictSpeedConfig, PredictSpeedReport, render_markdown, run


def main() -> None:
    d = PredictSpeedConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=d.before, help="git revision of the 'before' src/")
    ap.add_argument("--rounds", type=int, default=d.rounds, help="paired in-process rounds per prompt set")
    ap.add_argument("--cli-rounds", type=int, default=d.cli_rounds, help="paired command rounds per prompt set")
    ap.add_argument("--threads", type=int, default=d.threads)
    ap.add_argument("--data-dir", default=d.data_dir, help="prompt data sets (default: $LENPRED_DATA_DIR or "
                    "../shared/datasets)")
    ap.add_argument("--out", default=d.out)
    ap.add_argument("--report-only", action="store_true", help="print the table from the stored JSON")
    args = ap.parse_args()
    if args.report_only:
        report = PredictSpeedReport.from_dict(json.loads(Path(args.out).read_text()))
    else:
        report = run(PredictSpeedConfig(args.before, args.rounds, args.cli_rounds, args.threads, args.data_dir,
                                        args.out))
    print(render_markdown(report))


if __name__ == "__main__":
    main()
