"""The one exception type the command line turns into a one-line message."""


class LenpredError(ValueError):
    """Bad input or state that the user can fix; the message names the problem and the fix."""


class ContextWindowError(LenpredError):
    """A prompt plus the tokens it may generate does not fit the model's context window
    (:func:`lenpred.prompts.check_fits`)."""
