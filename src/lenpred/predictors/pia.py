"""PiA baseline: the serving model's own stated answer length, in words, converted to tokens.

Zheng et al. (2023), *Response Length Perception and Sequence Scheduling: An LLM-Empowered LLM Inference
Pipeline* (arXiv:2305.13144): the model is asked to print the estimated number of words of its response
before answering ("Perception in Advance"). The answers come from :func:`lenpred.inputs.pia.ask_self_reports`
and are parsed by :func:`lenpred.inputs.pia.parse_word_count`.
"""

from __future__ import annotations

import math

import numpy as np

from lenpred.errors import LenpredError
from lenpred.inputs.pia import parse_word_count
from lenpred.predictors.registry import Predictor, Reads, register, unique_map


@register("pia")
class PerceptionInAdvance(Predictor):
    """``prediction = parsed words × tokens_per_word``; unparseable answers get the training median.

    Args:
        tokens_per_word: tokens per whitespace-separated word of the serving model's responses. The default
            1.3 is a typical figure for English text under BPE tokenizers; the evaluation pipeline passes
            the value measured on the training responses (:func:`lenpred.inputs.pia.tokens_per_word`).

    Attributes (after ``predict``):
        num_predicted_: rows predicted by the last ``predict`` call.
        num_unparsed_: rows among them whose self-report did not parse (missing, no number, zero, negative
            or absurd) and got the fallback median.
        unparsed_share_: ``num_unparsed_ / num_predicted_`` (0.0 for an empty call).

    Raises:
        LenpredError: ``tokens_per_word`` is not a positive finite number; ``predict`` on requests none of
            which carries a ``self_report``; ``predict`` before ``fit``.
    """

    def reads(self) -> Reads:
        """The serving model's own answer-length estimate (``Request.self_report``)."""
        return Reads(self_report=True)

    @classmethod
    def param_grid(cls, ctx) -> list[dict]:
        """The tokens-per-word ratio measured on the training responses (``ctx.values``), else the default."""
        tpw = ctx.values.get("tokens_per_word")
        return [{"tokens_per_word": tpw}] if tpw else [{}]

    def diagnostics(self, requests) -> dict:
        """How many of ``requests`` state no parseable length (they get the training median)."""
        words = self.words(requests)
        return {"unparsed": sum(w is None for w in words), "of": len(words),
                "empty_answers": sum(not r.self_report for r in requests)}

    def __init__(self, tokens_per_word: float = 1.3):
        if not (isinstance(tokens_per_word, (int, float)) and math.isfinite(tokens_per_word) and tokens_per_word > 0):
            raise LenpredError(f"tokens_per_word must be a positive number, got {tokens_per_word!r}; measure it with "
                               "lenpred.inputs.pia.tokens_per_word on the training responses")
        super().__init__(tokens_per_word=float(tokens_per_word))

    def fit(self, requests, y):
        """Store the median training length in tokens (the fallback for unparseable answers); returns ``self``."""
        y = np.asarray(y, dtype=np.float64)
        if y.size == 0:
            raise LenpredError("cannot fit pia on an empty training set")
        self.median_ = float(np.median(y))
        return self

    def words(self, requests) -> list[float | None]:
        """Parsed word counts per request (``None`` where the answer does not parse), parsed once per object.

        Raises:
            LenpredError: no request carries a ``self_report``.
        """
        if requests and all(r.self_report is None for r in requests):
            raise LenpredError("pia needs the model's self-reports: generate them first "
                               "(lenpred.inputs.pia.ask_self_reports) and set Request.self_report")
        return unique_map(requests, lambda r: parse_word_count(r.self_report))

    def predict(self, requests):
        """``(n,)`` float64 predicted output lengths in tokens; counts fallbacks in ``num_unparsed_``."""
        if not hasattr(self, "median_"):
            raise LenpredError("pia is not fitted: call fit (or Predictor.load) first")
        words = self.words(requests)
        ratio = self.params["tokens_per_word"]
        pred = np.array([self.median_ if w is None else w * ratio for w in words], dtype=np.float64)
        self.num_predicted_ = len(words)
        self.num_unparsed_ = sum(w is None for w in words)
        self.unparsed_share_ = self.num_unparsed_ / self.num_predicted_ if self.num_predicted_ else 0.0
        return pred

    def _get_state(self):
        return {}, {"median": self.median_}

    def _set_state(self, tensors, info):
        self.median_ = float(info["median"])
