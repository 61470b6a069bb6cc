"""Switching heads without dropping requests (issue 48): engine A (the old head, --shutdown-timeout) serves
streaming requests; engine B starts with the new head; A gets SIGTERM while requests are in flight and drains; B
serves the next ones. The run is :mod:`lenpred.studies.head_switch`; this script parses the settings and prints the
result (``--out``, default ``results/scripts/serving/head_switch/``: ``head_switch.json``, the engines' logs and
traffic logs)::

    .venv-vllm/bin/python scripts/head_switch.py          # the shipped head -> the first head from 1,000 requests
"""

from __future__ import annotations

import argparse
import json

from lenpred.errors import run_script


def main() -> int:
    from lenpred.studies.head_switch import HeadSwitchConfig, run_head_switch

    d = HeadSwitchConfig()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--old", default=d.old, help="the head A serves (default: the shipped one)")
    ap.add_argument("--new", default=d.new, help="the head B serves (a lenpred train directory)")
    ap.add_argument("--num-requests", type=int, default=d.num_requests)
    ap.add_argument("--num-after", type=int, default=d.num_after)
    ap.add_argument("--out", default=d.out)
    a = ap.parse_args()
    report = run_head_switch(HeadSwitchConfig(old=a.old, new=a.new, num_requests=a.num_requests,
                                              num_after=a.num_after, out=a.out))
    print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=2))
    return 0


if __name__ == "__main__":
    from lenpred.serving.supervisor import exit_on_sigterm

    exit_on_sigterm()
    run_script(main)
