"""Studies: each a config + ``run(cfg)`` whose report is written under ``results/<command>/`` (with the config that
made it) and rendered by the CLI (``evaluate``: a typed :class:`~lenpred.studies.evaluate.EvalReport` +
:func:`~lenpred.studies.evaluate.render_evaluate`; the others still return dicts).

The studies' configs hold the default input and output paths (the library below them takes paths as arguments).
"""

DEFAULT_BENCH = "benchmarks/smollm2-forelen"
"""The committed benchmark every study reads by default (``lenpred bench build --preset forelen``)."""
