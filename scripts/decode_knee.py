"""The decode-slot knee: engine throughput (output tok/s) and step time of the real vLLM engine against the number of
requests decoding together, on the serving benchmark's core layout (the engine pinned to one core).

The study is :mod:`lenpred.studies.decode_knee` (timed decode steps per batch size, timed prefills, the cost model
fitted to both, the knee and the half-saturation point); this script builds its
:class:`~lenpred.studies.decode_knee.DecodeKneeConfig` from the options.

Output: ``results/scripts/serving/decode_knee.{json,png}`` and ``cost_vllm_1core.json`` (``*_sampled`` with
``--sampling recorded``)::

    .venv-vllm/bin/python scripts/decode_knee.py            # ~3 min on one core
    .venv-vllm/bin/python scripts/decode_knee.py --sampling recorded   # the serving benchmarks' sampling
    .venv/bin/python scripts/decode_knee.py --plot-only     # redraw the PNG from the stored JSON
"""

from __future__ import annotations

import argparse

from lenpred.studies.decode_knee import DecodeKneeConfig, replot, run


def main() -> None:
    d = DecodeKneeConfig()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--batch-sizes", default=",".join(map(str, d.batch_sizes)))
    ap.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--knee-share", type=float, default=d.knee_share)
    ap.add_argument("--cpus", default=d.cpus)
    ap.add_argument("--sampling", choices=("greedy", "recorded"), default=d.sampling)
    ap.add_argument("--out", default=d.out)
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the stored JSON")
    args = ap.parse_args()
    cfg = DecodeKneeConfig(tuple(int(x) for x in args.batch_sizes.split(",")), args.prompt_tokens, args.steps,
                           args.knee_share, args.cpus, args.sampling, args.out)
    if args.plot_only:
        print(replot(cfg))
        return
    rep = run(cfg)
    print(f"knee: {rep.knee} decoding requests ({cfg.path('decode_knee')}, {cfg.path('decode_knee', 'png')})")


if __name__ == "__main__":
    main()
