"""The settings of ``lenpred diagnose`` (:class:`DiagnoseConfig`), torch-free: the CLI reads them at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from lenpred.errors import LenpredError
from lenpred.studies import DEFAULT_BENCH
from lenpred.studies.diagnose.report import SECTIONS


@dataclass
class DiagnoseConfig:
    """Settings of ``lenpred diagnose``.

    Attributes:
        model, bench, data_dir, cache: as in :class:`lenpred.studies.evaluate.EvalConfig`.
        evaluate: the ``lenpred evaluate`` output whose chosen hyper-parameters and fitted predictors are read.
        out: where REPORT.md, the PNGs and the section JSONs go.
        sections: which sections to (re)compute; the others are read from ``out`` if present.
        attribution_prompts: test prompts per scenario for the gradient attribution (a backward pass each).
        pruned_ks: pruned output-vocabulary sizes scored offline; ``overhead_k`` is timed in the overhead section.
        seeds: head seeds of the ablation headline and the cheaper-entropy comparison.
        max_batch_tokens: overhead cases with more prompt tokens per batch are skipped (CPU time).
        overhead_batch_sizes, overhead_lengths: the overhead grid (batch size x prompt tokens).
        overhead_repeats: timed runs per variant and case (the fastest counts).
        threads: torch threads for the backbone (heads always use one).
        bootstrap_resamples: prompt-clustered bootstrap resamples.
    """

    model: str | None = None  # None: the model the benchmark was sampled from (bench.json)
    bench: str = DEFAULT_BENCH
    data_dir: str | None = None
    cache: str | None = None
    evaluate: str = "results/evaluate"
    out: str = "results/diagnose"
    sections: tuple[str, ...] = SECTIONS
    attribution_prompts: int = 40
    pruned_ks: tuple[int, ...] = (1024, 4096)
    overhead_k: int = 4096
    seeds: tuple[int, ...] = (0, 1, 2)
    max_batch_tokens: int = 4096
    overhead_batch_sizes: tuple[int, ...] = (1, 8, 32)
    overhead_lengths: tuple[int, ...] = (128, 512, 2048)
    overhead_repeats: int = 2  # the committed results/diagnose/overhead.json ran with 2
    threads: int | None = None
    bootstrap_resamples: int = 2000

    def __post_init__(self):
        unknown = [s for s in self.sections if s not in SECTIONS]
        if unknown:
            raise LenpredError(f"unknown sections {unknown}; valid: {', '.join(SECTIONS)}")
        if not self.seeds:
            raise LenpredError("no seeds given: pass --seeds like 0,1,2")
        if self.attribution_prompts < 1 or self.max_batch_tokens < 1 or self.overhead_repeats < 1:
            raise LenpredError("--attribution-prompts, --max-batch-tokens and --overhead-repeats must be >= 1")
