"""PLP's online prediction on a :class:`lenpred.pipeline.LengthPredictor` (:class:`ProgressiveMixin`): attach a
progressive head (``plp.safetensors``, read on first use), :meth:`~ProgressiveMixin.start` each request after its
prefill, :meth:`~ProgressiveMixin.update` the running ones during decoding. The kernels are
:mod:`lenpred.online.progressive`'s; torch loads inside the methods, as the pipeline's."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from lenpred.errors import LenpredError

PROGRESSIVE_FILE = "plp.safetensors"  # optional in a saved predictor: the PLP head (lenpred progressive)


class ProgressiveMixin:
    """The progressive (PLP) part of a :class:`lenpred.pipeline.LengthPredictor`, which provides ``method``,
    ``predictor_``, ``config_``, ``backbone_`` and ``prepare``.

    Fitted attributes (absent without a progressive head): ``progressive_`` (the
    :class:`lenpred.predictors.progressive.PLPHead`), ``progressive_info_`` (what it reads).
    """

    _plp: tuple | None = None  # (head, info) once read
    _plp_path: Path | None = None  # a saved directory's plp.safetensors, read on first use

    def attach_progressive(self, path: str | Path):
        """Add a PLP head written by ``lenpred progressive`` (``plp.safetensors``); it must read this predictor's
        prompt representation (same method and layer) and this model. Returns ``self``.

        Raises:
            LenpredError: unreadable, or trained on another prompt representation or model revision."""
        from lenpred.online.progressive import load_plp

        self._plp = load_plp(path, f"{self.method}@{self.predictor_.params.get('layer')}", self.config_.model_revision)
        self._plp_path = None
        return self

    def _progressive(self) -> tuple:
        """``(plp head, info)``: attached, or read now from the saved directory's ``plp.safetensors`` (predict never
        needs it, so loading waits for the first use).

        Raises:
            AttributeError: no progressive head (so ``hasattr(lp, "progressive_")`` answers ``False``)."""
        if self._plp_path is not None:
            self.attach_progressive(self._plp_path)
        if self._plp is None:
            raise AttributeError("this LengthPredictor has no progressive head")
        return self._plp

    @property
    def progressive_(self):
        """The PLP head (:class:`lenpred.predictors.progressive.PLPHead`); absent without one."""
        return self._progressive()[0]

    @property
    def progressive_info_(self) -> dict:
        """What the PLP head reads (``plp_layer``, ``steps``, ``prompt``, ``model_revision``); absent without one."""
        return self._progressive()[1]

    def start(self, prompts: Iterable[str | list[dict[str, str]]], max_new_tokens: int | None = None) -> list:
        """Prefill each prompt and return its online state (:class:`lenpred.online.progressive.RequestState`) with
        the first remaining-length estimate (PLP at decode step 0, from the prefill's signals).

        Raises:
            LenpredError: no progressive head attached, or a bad prompt."""
        from lenpred.online.progressive import start_states
        from lenpred.truncated import attach_prefill_signals

        if not hasattr(self, "progressive_"):
            raise LenpredError("this LengthPredictor has no progressive head: attach_progressive('plp.safetensors') "
                               "from a `lenpred progressive` run")
        requests = self.prepare(prompts, max_new_tokens)
        # the PLP layer's last-token state too: the full prefill
        attach_prefill_signals(self.backbone_, requests, self.predictor_.reads(), truncated=False)
        final = self.progressive_info_["plp_layer"]
        states = np.stack([r.signals.last_token_state(final).numpy() for r in requests])
        caps = np.full(len(requests), np.inf if max_new_tokens is None else float(max_new_tokens))
        return start_states(self.progressive_, self.predictor_.features(requests), states, caps)

    def update(self, states: list, steps, hidden_states) -> np.ndarray:
        """Re-estimate the remaining tokens of running requests: ``steps`` ``(B,)`` tokens generated, ``hidden_states``
        ``(B, d)`` each current token's hidden state at the layer in ``progressive_info_['plp_layer']``. ``(B,)``
        float64 (see :func:`lenpred.online.progressive.update_batch`)."""
        from lenpred.online.progressive import update_batch

        if not hasattr(self, "progressive_"):
            raise LenpredError("this LengthPredictor has no progressive head: attach_progressive(...) first")
        return update_batch(self.progressive_, states, steps, hidden_states)

    def _save_progressive(self, directory: Path) -> None:
        """Write the PLP head, if any, into a saved predictor's ``directory``."""
        if hasattr(self, "progressive_"):
            from lenpred.online.progressive import save_plp

            save_plp(self.progressive_, directory / PROGRESSIVE_FILE, self.progressive_info_)

    def _find_progressive(self, directory: Path) -> None:
        """Note a saved predictor's PLP head, read on first use (:meth:`_progressive`)."""
        self._plp_path = directory / PROGRESSIVE_FILE if (directory / PROGRESSIVE_FILE).exists() else None
