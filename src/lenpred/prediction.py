"""The last prediction stage, shared by every predict path: the head's input -> ONE head pass -> the distribution ->
expected / median / calibrated interval (:class:`LengthPrediction`).

* :func:`head_pass` runs a fitted predictor once on ``n`` requests (or on their already computed features, e.g.
  states an engine captured) and returns a :class:`HeadOutput`: the expected length and, for a distribution head,
  the bin probabilities and the length each bin stands for (:meth:`lenpred.heads.SoftLabelRegressor.distribution`).
* :meth:`HeadOutput.quantiles` reads the raw interval (before any conformal margin) and the median off that
  distribution (:func:`lenpred.intervals.distribution_quantiles`): the one home of features -> quantiles
  (:func:`head_quantiles` is the same for a bare head, as a traffic refit trains it).
* :func:`length_predictions` widens the raw interval by the calibrated margin and clips to each cap
  (:func:`lenpred.intervals.widened_interval`).

``LengthPredictor.predict`` (prompts in) and ``LengthPredictor.predict_states`` (an engine's states in) both end
here, so the head runs once per request whatever the path. Numpy only: the predictor brings its own torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lenpred.errors import LenpredError
from lenpred.intervals import distribution_quantiles, widened_interval


@dataclass
class LengthPrediction:
    """Predicted output length of one request, in tokens (EOS excluded).

    Attributes:
        num_prompt_tokens: the chat-formatted prompt's length.
        expected: expected observed length, ``sum_j p_j min(c_j, cap)`` (what MAE is measured on).
        median: the distribution's median (interpolated between bins).
        low, high: the interval, calibrated on the validation split to hold ``coverage`` of responses (split
            conformal; see :mod:`lenpred.intervals`), clipped to ``[0, max_new_tokens]``.
        coverage: the nominal share of responses inside ``[low, high]``.
        max_new_tokens: the request's cap (``None``: uncapped).
        bin_values: ``(K,)`` the length each bin stands for (capped), or ``None`` for a point predictor.
        bin_probs: ``(K,)`` bin probabilities summing to 1, or ``None``.
        low_raw, high_raw: the head's ``(1 -/+ coverage) / 2`` quantiles before the margin (a point predictor: its
            prediction), what an online-adaptive interval re-widens (:meth:`lenpred.online.learning.OnlineLearning.
            serve`); not in :meth:`to_dict`.
    """

    num_prompt_tokens: int
    expected: float
    median: float
    low: float
    high: float
    coverage: float
    max_new_tokens: int | None = None
    bin_values: list[float] | None = None
    bin_probs: list[float] | None = None
    low_raw: float | None = None
    high_raw: float | None = None

    def to_dict(self, distribution: bool = False) -> dict[str, Any]:
        """JSON-able fields, rounded to 0.1 token (the bin distribution only with ``distribution``)."""
        out = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in asdict(self).items()
               if not k.startswith("bin_") and not k.endswith("_raw")}
        if distribution and self.bin_probs is not None:
            out |= {"bin_values": [round(v, 1) for v in self.bin_values], "bin_probs": [round(p, 4) for p in self.bin_probs]}
        return out


@dataclass
class HeadOutput:
    """What one head pass over ``n`` requests gives.

    Attributes:
        expected: ``(n,)`` float64 tokens: ``sum_j p_j min(c_j, cap)`` for a distribution head, the prediction for
            a point predictor; clipped to ``[0, cap]`` either way.
        caps: ``(n,)`` float64 ``max_new_tokens`` (``inf``: uncapped).
        probs: ``(n, K)`` float64 bin probabilities (rows sum to 1), ``None`` for a point predictor.
        values: ``(n, K)`` float64 the length each bin stands for, ``min(c_j, cap)``, ``None`` for a point predictor.
    """

    expected: np.ndarray
    caps: np.ndarray
    probs: np.ndarray | None = None
    values: np.ndarray | None = None

    @classmethod
    def from_distribution(cls, probs: np.ndarray, values: np.ndarray, caps: np.ndarray) -> "HeadOutput":
        """A distribution head's output: ``expected = clip(sum_j p_j v_j, 0, cap)`` (``probs``, ``values`` ``(n, K)``,
        ``caps`` ``(n,)``)."""
        caps = np.asarray(caps, np.float64)
        return cls(np.clip((probs * values).sum(axis=1), 0, caps), caps, probs, values)

    def quantiles(self, coverage: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(median, low_raw, high_raw)``, ``(n,)`` float64 tokens each: the distribution's 0.5 and
        ``(1 -/+ coverage) / 2`` quantiles before any margin; a point predictor's prediction three times."""
        if self.probs is None:
            return self.expected, self.expected, self.expected
        tail = (1 - coverage) / 2
        q = distribution_quantiles(self.probs, self.values, (tail, 0.5, 1 - tail))
        return q[:, 1], q[:, 0], q[:, 2]


def head_pass(predictor, caps: np.ndarray, requests: list | None = None,
              features: np.ndarray | None = None) -> HeadOutput:
    """Run ``predictor``'s head once.

    Args:
        predictor: a fitted :class:`lenpred.predictors.Predictor`. A feature head (``reads().features``) runs
            through :meth:`~lenpred.predictors.Predictor.features` and
            :meth:`~lenpred.predictors.Predictor.distribution_from_features`, any other through ``predict``.
        caps: ``(n,)`` float64 ``max_new_tokens`` (``inf``: none).
        requests: the :class:`lenpred.predictors.Request` objects (signals attached where the predictor reads them);
            unused when ``features`` is given.
        features: ``(n, d)`` float32, the head's input already computed (an engine's captured states, a logged row).

    Returns:
        :class:`HeadOutput`; ``expected`` is the same float as ``clip(predictor.predict(requests), 0, caps)``
        (a distribution head's ``predict`` is its distribution's capped mean).

    Raises:
        LenpredError: neither requests nor features, or features for a predictor without a feature head.
    """
    caps = np.asarray(caps, np.float64)
    if requests is None and features is None:
        raise LenpredError("head_pass needs the requests or their features")
    if not predictor.reads().features:
        if features is not None:
            raise LenpredError(f"predictor '{predictor.registry_name}' has no feature head: pass the requests, not "
                               "features")
        return HeadOutput(np.clip(predictor.predict(requests), 0, caps), caps)
    X = predictor.features(requests) if features is None else features
    return HeadOutput.from_distribution(*predictor.distribution_from_features(X, caps), caps)


def head_quantiles(head, features: np.ndarray, caps: np.ndarray, coverage: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(expected, low_raw, high_raw)``, ``(n,)`` float64 tokens each, of a fitted bare head
    (:class:`lenpred.heads.SoftLabelRegressor`, e.g. one a traffic refit trains) on ``features`` ``(n, d)`` float32
    with caps ``(n,)`` (``inf``: none): :meth:`HeadOutput.quantiles` of its distribution, before any margin."""
    out = HeadOutput.from_distribution(*head.distribution(np.asarray(features, np.float32), caps), caps)
    _, low_raw, high_raw = out.quantiles(coverage)
    return out.expected, low_raw, high_raw


def length_predictions(out: HeadOutput, coverage: float, margin: float, num_prompt_tokens,
                       max_new_tokens) -> list[LengthPrediction]:
    """One :class:`LengthPrediction` per row of ``out``: median clipped to the cap, the raw interval widened by
    ``margin`` tokens and clipped to ``[0, cap]`` (:func:`lenpred.intervals.widened_interval`).

    Args:
        num_prompt_tokens: ``(n,)`` prompt lengths (reported only).
        max_new_tokens: ``(n,)`` caps as given (``None``: uncapped), reported as given; ``out.caps`` is their float
            form.
    """
    median, low_raw, high_raw = out.quantiles(coverage)
    low, high = widened_interval(low_raw, high_raw, margin, out.caps)
    median = np.minimum(median, out.caps)
    dist = out.probs is not None
    return [LengthPrediction(int(n), float(out.expected[i]), float(median[i]), float(low[i]), float(high[i]),
                             coverage, cap, out.values[i].tolist() if dist else None,
                             out.probs[i].tolist() if dist else None, float(low_raw[i]), float(high_raw[i]))
            for i, (n, cap) in enumerate(zip(num_prompt_tokens, max_new_tokens))]
