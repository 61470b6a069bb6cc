"""What the tuner searches besides the layers (:class:`TuningSettings`), torch-free: the studies' configs take
their defaults from it at CLI start-up, and :mod:`lenpred.tuning` runs the search."""

from __future__ import annotations

from dataclasses import dataclass

from lenpred.errors import raise_first


@dataclass
class TuningSettings:
    """What the tuner searches besides the layers: the fields of the same names of
    :class:`lenpred.studies.evaluate.EvalConfig` (documented there), with the same defaults.

    Raises:
        LenpredError: ``epochs`` or ``proxy_epochs`` < 1, or an unknown ``pool_span``, ``semantic_divisor`` or
            ``binning``.
    """

    trail_layers: tuple[int, ...] | None = None
    lambda1_grid: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    alpha_grid: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    pool_span: str = "after_prefix"
    semantic_divisor: str = "n"
    epochs: int = 150
    binning: str = "log"
    proxy_encoder: str = "minilm"
    proxy_epochs: int = 2
    proxy_max_length: int = 128

    def __post_init__(self):
        from lenpred.heads import BINNINGS  # deferred: torch (this module is imported by the CLI's configs)
        from lenpred.predictors.pooled import POOL_SPANS
        from lenpred.signals import SEMANTIC_DIVISORS

        checks = [(self.epochs < 1, f"--epochs must be >= 1, got {self.epochs}"),
                  (self.proxy_epochs < 1, f"--proxy-epochs must be >= 1, got {self.proxy_epochs}"),
                  (self.pool_span not in POOL_SPANS, f"--pool-span must be one of {', '.join(POOL_SPANS)}"),
                  (self.semantic_divisor not in SEMANTIC_DIVISORS,
                   f"--semantic-divisor must be one of {', '.join(SEMANTIC_DIVISORS)}"),
                  (self.binning not in BINNINGS, f"--binning must be one of {', '.join(BINNINGS)}")]
        raise_first(checks)
