"""Diagnostics of the prefill signals (``lenpred diagnose``): why entropy / semantic pooling works and what it costs.

* :mod:`.misalignment` — ESTP's measurement: how often high-entropy tokens are semantically unimportant and the
  converse; attention-sink concentration; which tokens EGTP and ESTP weigh differently.
* :mod:`.attribution` — EGTP's grounding: correlation of entropy / semantic score with gradient attribution.
* :mod:`.ablation` — entropy-only / semantic-only / joint, the lambda x alpha grid, layer, bins, tau, CE/MSE mix.
* :mod:`.entropy` — a cheaper entropy (pruned output head), verified and scored offline from cached states.
* :mod:`.overhead` — wall time and peak memory of prefill + signals vs a serving prefill.
* :mod:`.run` / :mod:`.report` — the command and its Markdown report, PNGs and JSON.
"""
