"""Prompts from outside the benchmark (issue 48): serve a public prompt set none of the benchmark's sources holds
through the vLLM plug-in (its traffic log on), then score the shipped head, baselines and heads refitted on the
served traffic on the later half's unseen prompts.

The serving is :mod:`lenpred.studies.outside_serve` (needs ``.venv-vllm``; resumable by chunks of prompts), the
analysis :mod:`lenpred.studies.outside_source` (no engine). The prompt set is read from ``$LENPRED_PROMPT_SETS``
(default ``~/.cache/lenpred/prompt_sets``; docs/data.md says where to get it). Output (``--out``, default
``results/scripts/outside/``): ``samples.parquet``, ``traffic/``, ``outside.json``, ``outside.md``::

    taskset -c 0 .venv-vllm/bin/python scripts/outside_source.py --serve     # 640 prompts x 2 samples (~40 min)
    python scripts/outside_source.py                                          # the analysis, from what was served
"""

from __future__ import annotations

import argparse

from lenpred.errors import run_script


def main() -> int:
    from lenpred.studies.outside_serve import OutsideServeConfig
    from lenpred.studies.outside_source import OutsideConfig

    s, a = OutsideServeConfig(), OutsideConfig()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--serve", action="store_true", help="serve the missing prompts through the plug-in first")
    ap.add_argument("--num-prompts", type=int, default=s.num_prompts)
    ap.add_argument("--samples", type=int, default=s.samples)
    ap.add_argument("--prompt-sets-dir", default=s.prompt_sets_dir)
    ap.add_argument("--max-num-seqs", type=int, default=s.max_num_seqs)
    ap.add_argument("--draws", type=int, default=a.draws)
    ap.add_argument("--bootstrap-resamples", type=int, default=a.bootstrap_resamples)
    ap.add_argument("--out", default=a.out)
    x = ap.parse_args()
    if x.serve:
        from lenpred.studies.outside_serve import serve_outside

        serve_outside(OutsideServeConfig(num_prompts=x.num_prompts, samples=x.samples,
                                         prompt_sets_dir=x.prompt_sets_dir, max_num_seqs=x.max_num_seqs, out=x.out))
        return 0
    from lenpred.studies.outside_source import render, run_outside

    print(render(run_outside(OutsideConfig(out=x.out, draws=x.draws, bootstrap_resamples=x.bootstrap_resamples))))
    return 0


if __name__ == "__main__":
    run_script(main)
