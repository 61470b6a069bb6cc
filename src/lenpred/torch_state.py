"""Scoped changes to torch's process-wide state: the intra-op thread count and the global CPU generator.

Every lenpred function that needs either sets it for its own duration and restores the caller's on the way out
(also on an exception), so no call leaves global torch state changed.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run a block with ``n`` torch intra-op threads, restoring the previous ``torch.get_num_threads()`` on exit.

    ``None`` (or 0) keeps the current count. Raises ``ValueError`` for a negative ``n``.
    """
    import torch

    if n is not None and n < 0:
        raise ValueError(f"threads must be >= 1 (or None: unchanged), got {n}")
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def with_threads_of(attribute: str) -> Callable[[F], F]:
    """Decorator factory: the decorated function runs under :func:`torch_threads` ``(getattr(first_argument,
    attribute, None))``, e.g. a config's ``threads`` field, and the caller's count is back when it returns."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(first, *args, **kwargs):
            with torch_threads(getattr(first, attribute, None)):
                return fn(first, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


with_backbone_threads = with_threads_of("num_threads")
"""Decorator for a function whose first argument is a :class:`lenpred.backbone.Backbone`: it runs under
:func:`torch_threads` ``(backbone.num_threads)`` (the count given to ``load_backbone``; ``None``: unchanged)."""


@contextlib.contextmanager
def torch_seed(seed: int) -> Iterator[None]:
    """Run a block with torch's global CPU generator seeded to ``seed``, then put the caller's generator state back.

    Inside, the CPU stream is exactly the one ``torch.manual_seed(seed)`` starts (module initialisation such as
    ``nn.Linear`` and dropout draw from it). CUDA generators are neither seeded nor touched: lenpred's heads train on
    the CPU. (``torch.random.fork_rng(devices=[])`` + ``default_generator.manual_seed``.)
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(int(seed))
        yield
