"""The plug-in's gain against stock's queue share: per slice of a public arrival trace, stock FCFS's mean
TTFT / mean JCT beside the plug-in's paired mean-JCT cut and p99 ratio, in the simulator over a grid of loads and on
every committed engine trace store. The queue share ranks the slices' gains better than their nominal load, and an
operator reads it off vLLM's ``/metrics``.

The study is :mod:`lenpred.studies.queue_share`; this script builds its config and writes ``<out>.json``, ``.md``
and ``.png``::

    python scripts/queue_share.py          # ~2 min on one core
"""

from __future__ import annotations

import argparse

from lenpred.errors import LenpredError, run_script
from lenpred.studies.queue_share import QueueShareConfig


def numbers(text: str, name: str) -> tuple[float, ...]:
    """Comma-separated numbers.

    Raises:
        LenpredError: one that is not a number (the message names the option).
    """
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LenpredError(f"--{name} takes comma-separated numbers, e.g. 0.8,0.9,1.1; got {text!r}") from None


def parse_config() -> QueueShareConfig:
    """The command line as a :class:`QueueShareConfig` (its defaults)."""
    d = QueueShareConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--traces", default=",".join(d.traces), help="public traces, comma-separated: code, conv")
    ap.add_argument("--loads", default=",".join(f"{x:g}" for x in d.loads),
                    help="arrival rates as multiples of the simulated stock capacity, comma-separated")
    ap.add_argument("--draws", type=int, default=d.draws, help="slices per trace and load")
    ap.add_argument("--seed", type=int, default=d.seed, help="slice d uses seed + d")
    ap.add_argument("--decode-bound", type=int, default=d.decode_bound,
                    help="D: sequences decoded per step, in every mode")
    ap.add_argument("--window-s", type=float, default=d.window_s, help="seconds of arrivals per slice")
    ap.add_argument("--cost-model", default=d.cost_model, help="the bare engine's cost model")
    ap.add_argument("--streaming-overhead-ms", type=float, default=d.streaming_overhead_ms,
                    help="API-server work per streamed token, ms")
    ap.add_argument("--engine-stores", default=d.engine_stores,
                    help="folder of scripts/queue_benchmark.py trace stores ('' = simulator only)")
    ap.add_argument("--share-bins", default=",".join(f"{x:g}" for x in d.share_bins),
                    help="queue-share bin edges from 0 to 1, comma-separated")
    ap.add_argument("--bootstrap-resamples", type=int, default=d.bootstrap_resamples,
                    help="resamples of every paired interval")
    ap.add_argument("--out", default=d.out, help="output path prefix")
    args = vars(ap.parse_args())
    args["traces"] = tuple(x.strip() for x in args["traces"].split(",") if x.strip())
    args["loads"] = numbers(args["loads"], "loads")
    args["share_bins"] = numbers(args["share_bins"], "share-bins")
    return QueueShareConfig(**args)


def main() -> None:
    from lenpred.studies.queue_share import markdown, run, save

    cfg = parse_config()
    rep = run(cfg)
    save(rep, cfg.out)
    print(markdown(rep))


if __name__ == "__main__":
    run_script(main)
