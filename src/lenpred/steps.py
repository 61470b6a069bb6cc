"""The decode steps at which progressive predictors re-estimate the remaining length (PLP, TRAIL-progressive) and
at which decode-time states are kept (:mod:`lenpred.inputs.decode_states`); torch-free, so the studies' configs
import it at CLI start-up."""

DECODE_STEPS = (0, 8, 16, 24, 32, 40, 48, 56, 64, 128)
"""Tokens generated before the state is read (0: at the prefill). Dense early, where most rollouts still run."""
