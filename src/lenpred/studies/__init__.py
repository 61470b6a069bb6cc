"""Studies: each a config + ``run(cfg)`` whose report is written under ``results/<command>/`` (with the config that
made it): ``run(cfg)`` returns a typed report dataclass whose ``to_dict()`` is the written JSON, and a
``render_*`` function prints it for the CLI.

The studies' configs hold the default input and output paths (the library below them takes paths as arguments).
"""

DEFAULT_BENCH = "benchmarks/smollm2-forelen"
"""The committed benchmark every study reads by default (``lenpred bench build --preset forelen``)."""


def report_dict(report) -> dict:
    """A report dataclass's fields as ``{name: value}`` in declaration order (no copies): the JSON content of the
    reports whose fields are exactly their file's keys."""
    from dataclasses import fields

    return {f.name: getattr(report, f.name) for f in fields(report)}
