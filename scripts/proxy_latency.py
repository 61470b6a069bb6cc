"""What `lenpred serve` adds to a request's latency, before and after batched, truncated predictions.

Usage: flock /tmp/lenpred-cpu.lock python scripts/proxy_latency.py [--before 09b1c3b] [--rounds 20,6,3]
       [--proxy-cpus 1 --client-cpus 0] [--out results/scripts/serve/proxy_latency.json]
       python scripts/proxy_latency.py --report-only [--out ...]   # the Markdown again, from the JSON

The study is :mod:`lenpred.studies.proxy_latency` (a local upstream that answers at once, the ``before`` proxy from
git and this checkout's in their own processes, bursts of 1, 8 and 32 short chat requests; the prediction latency,
the added latency and TTFT, the target; in-process prediction times); this script builds its
:class:`~lenpred.studies.proxy_latency.ProxyLatencyConfig` from the options.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lenpred.studies.proxy_latency import ProxyLatencyConfig, ProxyLatencyReport, render_markdown, run, save


def main() -> None:
    d = ProxyLatencyConfig()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--before", default=d.before,
                    help="git revision of the 'before' proxy app (09b1c3b: the last with one prediction at a time)")
    ap.add_argument("--rounds", default=",".join(map(str, d.rounds)), help="bursts at 1, 8 and 32 concurrent requests")
    ap.add_argument("--data-dir", default=d.data_dir, help="prompt data sets (default: $LENPRED_DATA_DIR or "
                    "../shared/datasets)")
    ap.add_argument("--proxy-cpus", default=d.proxy_cpus, help="CPU ids of the proxy process, e.g. 1")
    ap.add_argument("--client-cpus", default=d.client_cpus, help="CPU ids of this process (upstream + client), e.g. 0")
    ap.add_argument("--out", default=d.out)
    ap.add_argument("--report-only", action="store_true", help="rewrite the Markdown from the stored JSON")
    args = ap.parse_args()
    if args.report_only:
        report = ProxyLatencyReport(**json.loads(Path(args.out).read_text()))
        save(report, args.out)
    else:
        report = run(ProxyLatencyConfig(args.before, tuple(int(x) for x in args.rounds.split(",")), args.data_dir,
                                        args.proxy_cpus, args.client_cpus, args.out))
    print(render_markdown(report))


if __name__ == "__main__":
    main()
