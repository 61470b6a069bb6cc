"""The one exception type the command line turns into a one-line message."""


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
