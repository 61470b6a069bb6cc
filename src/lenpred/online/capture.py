"""Capture with no head: what a serving path logs for a model that has no trained length predictor yet.

A new deployment starts with no head for its model. It serves with the vLLM plug-in in ``observe`` and
``predictor: "none"`` (:data:`HEADLESS`); the plug-in captures one hidden state per request — the final prompt
token's output of decoder layer :func:`capture_layer` (``last`` pooling: the only pooling an engine's own prefill
gives without a second pass) — and the traffic log (:mod:`lenpred.online.traffic_log`) stores it with the request's
outcome and no prediction. ``lenpred train --traffic LOG`` then trains a head from that log alone
(:func:`lenpred.traffic_refit.refit_on_traffic` with no base), and the plug-in loads it on restart
(``predictor: <its directory>``).

The one rule for the layer: half the model's depth, ``num_hidden_layers // 2`` (the first of
:func:`lenpred.signals.default_layers`): SmolLM2-135M's 30 layers give 15, the layer the shipped head was chosen at
on validation; TRAIL and the signal-probing literature find the length signal in middle layers. ``capture_layer``
in the plug-in's settings overrides it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lenpred.errors import LenpredError

HEADLESS = "none"
"""The plug-in's ``predictor`` value for capture with no head."""
CAPTURE_POOLING = "last"
"""The pooling an engine captures: the final prompt token's state (the registered ``last`` predictor reads it)."""


def capture_layer(num_hidden_layers: int) -> int:
    """The hidden-state index captured with no head: ``num_hidden_layers // 2`` (module docstring).

    Raises:
        LenpredError: fewer than 2 layers (no intermediate layer to hook)."""
    if num_hidden_layers < 2:
        raise LenpredError(f"a {num_hidden_layers}-layer model has no intermediate layer to capture")
    return num_hidden_layers // 2


@dataclass(frozen=True)
class HeadlessCapture:
    """What the plug-in captures and logs when it serves with no head: the served model and one layer's
    last-prompt-token state.

    Attributes:
        model_id: the served model as recorded (:func:`lenpred.backbone.recorded_model_name`).
        model_revision: its content revision (:func:`lenpred.backbone.local_model_revision`).
        engine_layer: the hidden-state index captured (1 .. depth - 1: a decoder layer's output).
        width: the hidden size, the features' width.
        template_rule: the prompt rule the engine's chat template matches (:data:`lenpred.prompts.TEMPLATE_RULE`).
    """

    model_id: str
    model_revision: str
    engine_layer: int
    width: int
    template_rule: str
    method: str = CAPTURE_POOLING

    def log_metadata(self) -> dict[str, str]:
        """What every traffic-log part records (as :func:`lenpred.online.traffic_log.predictor_metadata` does for a
        predictor), plus ``head: "none"``: a log that holds no predictions, which ``lenpred train --traffic``
        trains a fresh head on."""
        return {"model_id": self.model_id, "model_revision": self.model_revision, "method": self.method,
                "layers": json.dumps([self.engine_layer]), "template_rule": self.template_rule, "head": HEADLESS}


def is_headless(metadata: dict[str, str]) -> bool:
    """Whether a traffic log's metadata says it was captured with no head."""
    return metadata.get("head") == HEADLESS
