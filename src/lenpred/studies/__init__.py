"""Studies: each a config + ``run(cfg)`` returning a typed report, rendered and written under ``results/`` by the CLI.

The studies' configs hold the default input and output paths (the library below them takes paths as arguments).
"""

DEFAULT_BENCH = "benchmarks/smollm2-forelen"
"""The committed benchmark every study reads by default (``lenpred bench build --preset forelen``)."""
