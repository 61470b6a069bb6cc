"""The one exception type the command line turns into a one-line message."""

from collections.abc import Callable


class LenpredError(ValueError):
    """Bad input or state that the user can fix; the message names the problem and the fix."""


class ContextWindowError(LenpredError):
    """A prompt plus the tokens it may generate does not fit the model's context window
    (:func:`lenpred.prompts.check_fits`)."""


def raise_first(checks) -> None:
    """Raise :class:`LenpredError` with the message of the first ``(failed, message)`` pair whose ``failed`` is true
    (a config's ``__post_init__`` lists its checks in the order users should fix them)."""
    for failed, message in checks:
        if failed:
            raise LenpredError(message)


def run_script(main: Callable[[], int | None]) -> None:
    """Run a script's ``main()`` as the ``lenpred`` commands end theirs (:func:`lenpred.cli_options.one_line_errors`):
    a :class:`LenpredError` ends the process with ``error: <message>`` on one line of stderr and exit status 2, no
    traceback; otherwise the process exits with the status ``main`` returns (``None``: 0). Any other exception is a
    bug and propagates with its traceback.

    Args:
        main: a callable with no arguments returning an ``int`` exit status or ``None``.

    Raises:
        SystemExit: when ``main`` returns or raises :class:`LenpredError` (status 2).
    """
    import sys

    try:
        status = main()
    except LenpredError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status or 0)
