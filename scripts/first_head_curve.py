"""How many served requests a new deployment's first head needs (issue 48): heads trained by `lenpred train
--traffic`'s path on the first n requests of a logged stream of train-split prompts (captured as the plug-in captures
with no head), scored on the test split and in the simulator's burst beside the shipped head.

The study is :mod:`lenpred.studies.first_head`; this script parses the settings and runs it. Needs the benchmark's
layer-15 signals of both splits (extracted into the signal cache on first use: ~25 minutes on one CPU core).
Output (``--out``, default ``results/scripts/first_head/``): ``first_head.json``, ``first_head.md``,
``learning_curve.png``; the logs it trains on go under ``<out>/logs`` (not committed)::

    python scripts/first_head_curve.py                                   # 250 / 500 / 1000 / 2000 requests
    python scripts/first_head_curve.py --sizes 100,250 --draws 2 --out /tmp/first_head   # a quick look
"""

from __future__ import annotations

import argparse

from lenpred.errors import LenpredError, run_script
from lenpred.studies.first_head import FirstHeadConfig, run_first_head


def main() -> int:
    d = FirstHeadConfig()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--bench", default=d.bench)
    ap.add_argument("--sizes", default=",".join(map(str, d.sizes)), help="logged requests per head, comma-separated")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--data-dir", default=d.data_dir)
    ap.add_argument("--cache", default=d.cache)
    ap.add_argument("--cost-model", default=d.cost_model)
    ap.add_argument("--decode-bound", type=int, default=d.decode_bound)
    ap.add_argument("--burst", type=int, default=d.burst)
    ap.add_argument("--draws", type=int, default=d.draws)
    ap.add_argument("--bootstrap-resamples", type=int, default=d.bootstrap_resamples)
    ap.add_argument("--out", default=d.out)
    a = ap.parse_args()
    try:
        sizes = tuple(int(x) for x in a.sizes.split(","))
    except ValueError:
        raise LenpredError(f"--sizes takes comma-separated request counts, e.g. 250,500; got {a.sizes!r}") from None
    report = run_first_head(FirstHeadConfig(bench=a.bench, sizes=sizes, seed=a.seed, data_dir=a.data_dir,
                                            cache=a.cache, cost_model=a.cost_model, decode_bound=a.decode_bound,
                                            burst=a.burst, draws=a.draws, bootstrap_resamples=a.bootstrap_resamples,
                                            out=a.out))
    from lenpred.studies.first_head import render

    print(render(report))
    return 0


if __name__ == "__main__":
    run_script(main)
