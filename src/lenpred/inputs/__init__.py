"""Input providers: one per input a predictor may read (``Predictor.reads().inputs``).

A provider fills the :class:`lenpred.predictors.Request` field of its name for the prompts that need it and returns
values the tuner may pass on (e.g. PiA's tokens-per-word ratio). ``text`` and ``scenario`` come with the prompt
itself (no provider). Adding an input is one registered function.
"""

from lenpred.inputs.registry import PROVIDERS, provide_inputs, register_provider

from lenpred.inputs import prefill, self_report  # noqa: F401  (registration side effect)

__all__ = ["PROVIDERS", "provide_inputs", "register_provider"]
