"""What a serving path (``lenpred serve``, the vLLM in-engine plug-in) calls to learn from its traffic: one object
that serves the interval (fixed or online-adaptive) and, when switched on, logs every finished request.

Integration (both are off by default; the serving paths expose ``--traffic-log DIR`` and
``--adaptive-interval aci|rolling``)::

    from lenpred.online.learning import OnlineLearning
    from lenpred.online.adaptive import AdaptiveConfig
    from lenpred.online.traffic_log import TrafficLogConfig

    online = OnlineLearning(predictor, log=TrafficLogConfig("traffic/") if args.traffic_log else None,
                            adaptive=AdaptiveConfig(method="aci") if args.adaptive_interval else None)
    # at prediction time, reusing the predictions already made (the plug-in: LengthPredictor.predict_states on its
    # hook's states; the proxy: LengthPredictor.predict(..., return_features=True); each LengthPrediction carries
    # the head's raw quantiles): no extra model or head pass
    served = online.serve(features, predictions, group=route_tag)               # -> list[ServedPrediction]
    # when request i finishes (lenpred.outcome.RequestOutcome: tokens generated, finish reason, times):
    online.finished(served[i], outcome)
    ...
    online.close()                                                               # flushes the log

Thread safety: :meth:`OnlineLearning.finished` and :meth:`OnlineLearning.serve` take one lock (the adaptive
state is shared); the log's ``record`` appends one journal line (no fsync, about 0.1 ms) and its parts are
written on the log's own thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from lenpred.errors import LenpredError
from lenpred.intervals import widened_interval
from lenpred.online.adaptive import AdaptiveInterval
from lenpred.online.capture import HeadlessCapture
from lenpred.online.traffic_log import TrafficLogWriter, TrafficRecord, predictor_metadata
from lenpred.outcome import RequestOutcome


@dataclass
class ServedPrediction:
    """One request's prediction as served, with what its outcome needs to be logged and learned from.

    Attributes:
        features: ``(d,)`` float32, the head's input (with no head: the captured state a head will read).
        expected: expected output tokens (capped); ``None`` (and the interval too) when captured with no head
            (:meth:`OnlineLearning.capture`).
        low, high: the interval served, tokens (adaptive margin when on, else the predictor's fixed one).
        low_raw, high_raw: the head's quantiles before any margin.
        max_new_tokens: the cap (``None``: uncapped).
        group: the Mondrian group key (route / client tag), or ``None``.
        prompt_sha256, num_prompt_tokens: optional, logged as given.
    """

    features: np.ndarray
    expected: float | None
    low: float | None
    high: float | None
    low_raw: float | None
    high_raw: float | None
    max_new_tokens: int | None = None
    group: str | None = None
    prompt_sha256: str | None = None
    num_prompt_tokens: int | None = None


class OnlineLearning:
    """A served predictor's interval (fixed or adaptive) and traffic log.

    Args:
        predictor: a pooled-head :class:`lenpred.pipeline.LengthPredictor` (the shipped one reads ``last@15``), or a
            :class:`lenpred.online.capture.HeadlessCapture` (no head yet: :meth:`capture` logs states without
            predictions; needs ``log`` and no ``adaptive``).
        log: switch the traffic log on (``None``: off, the default).
        adaptive: switch the online-adaptive margin on (``None``: the predictor's fixed calibrated margin);
            ``initial_margin`` ``None`` becomes the predictor's margin (an explicit 0 is kept), and ``coverage`` is
            the predictor's.

    Raises:
        LenpredError: a predictor without a pooled head; with no head, no log or an adaptive interval.
    """

    def __init__(self, predictor, log=None, adaptive=None):
        from dataclasses import replace

        self.predictor, self.headless = predictor, isinstance(predictor, HeadlessCapture)
        if self.headless:
            if log is None or adaptive is not None:
                raise LenpredError("with no head (predictor: none) there is nothing to serve an interval from: log "
                                   "the traffic (traffic_log) with no adaptive_interval, then train a head on it")
            self.coverage = self.margin = None
            meta = predictor.log_metadata()
        else:
            if not predictor.predictor_.reads().features:
                raise LenpredError(f"online learning needs a pooled-head predictor, '{predictor.method}' is not one")
            self.coverage, self.margin = predictor.coverage, predictor.margin_
            meta = predictor_metadata(predictor)
        if adaptive is not None:
            adaptive = replace(adaptive, coverage=predictor.coverage, initial_margin=(
                predictor.margin_ if adaptive.initial_margin is None else adaptive.initial_margin))
        self.adaptive = None if adaptive is None else AdaptiveInterval(adaptive)
        if log is not None:
            log = replace(log, metadata={**meta, **log.metadata})
        self.log = None if log is None else TrafficLogWriter(log)
        self._lock = threading.Lock()

    def serve(self, features: np.ndarray, predictions: list, group: str | None = None,
              prompt_sha256: list[str | None] | None = None) -> list[ServedPrediction]:
        """Served predictions for requests the predictor already predicted, reusing that head pass (no head call).

        Args:
            features: ``(n, d)`` (or ``(d,)`` for one request) the head's input, logged as is (float32).
            predictions: the ``n`` :class:`lenpred.prediction.LengthPrediction` made from them
                (``LengthPredictor.predict_states``): their expected length, raw quantiles (``low_raw`` /
                ``high_raw``), cap and prompt length are served and logged.
            group: the Mondrian group key (route / client tag), or ``None``.
            prompt_sha256: ``n`` prompt hashes to log, or ``None``.

        Raises:
            LenpredError: ``features`` and ``predictions`` differ in number, or a prediction without raw quantiles.
        """
        X = np.atleast_2d(np.asarray(features, np.float32))
        if len(X) != len(predictions) or any(p.low_raw is None or p.high_raw is None for p in predictions):
            raise LenpredError(f"serve needs one LengthPrediction with low_raw / high_raw per feature row, got "
                               f"{len(predictions)} for {len(X)} rows: pass what predict_states returned")
        return self._served(X, [p.expected for p in predictions], [p.low_raw for p in predictions],
                            [p.high_raw for p in predictions], [p.max_new_tokens for p in predictions], group,
                            prompt_sha256, [p.num_prompt_tokens for p in predictions])

    def capture(self, features: np.ndarray, num_prompt_tokens: int | None, max_new_tokens: int | None,
                group: str | None = None, prompt_sha256: str | None = None) -> ServedPrediction:
        """A request served with no head (:class:`lenpred.online.capture.HeadlessCapture`): its ``(d,)`` captured
        state, logged when it finishes (:meth:`finished`) with no prediction.

        Raises:
            LenpredError: this object serves a head (call :meth:`serve`)."""
        if not self.headless:
            raise LenpredError("capture() is for serving with no head; a predictor's requests go through serve()")
        return ServedPrediction(np.asarray(features, np.float32).reshape(-1), None, None, None, None, None,
                                max_new_tokens, group, prompt_sha256, num_prompt_tokens)

    def _served(self, X: np.ndarray, expected, low_raw, high_raw, caps: list, group, prompt_sha256,
                num_prompt_tokens: list) -> list[ServedPrediction]:
        """One :class:`ServedPrediction` per row: the interval from the adaptive margin when on, else the
        predictor's fixed margin (:func:`lenpred.intervals.widened_interval`, the predictor's own rule)."""
        out = []
        with self._lock:
            for i in range(len(X)):
                lo, hi = (self.adaptive.interval(low_raw[i], high_raw[i], group, caps[i]) if self.adaptive
                          else widened_interval(low_raw[i], high_raw[i], self.margin, caps[i]))
                out.append(ServedPrediction(X[i], float(expected[i]), lo, hi, float(low_raw[i]), float(high_raw[i]),
                                            caps[i], group, None if prompt_sha256 is None else prompt_sha256[i],
                                            num_prompt_tokens[i]))
        return out

    def finished(self, served: ServedPrediction, outcome: RequestOutcome) -> None:
        """Request ``served`` ended as ``outcome`` (:class:`lenpred.outcome.RequestOutcome`, with its
        ``num_output_tokens``): update the adaptive margin (if on) and log the row (if on; a missing finish reason
        is logged as ``"unknown"``)."""
        with self._lock:
            if self.adaptive is not None:
                self.adaptive.update(served.low_raw, served.high_raw, outcome.num_output_tokens, served.group)
        if self.log is not None:
            self.log.record(TrafficRecord(**vars(served), num_output_tokens=outcome.num_output_tokens,
                                          finish_reason=outcome.finish_reason or "unknown",
                                          arrival_time_s=outcome.arrival_time_s,
                                          first_token_time_s=outcome.first_token_time_s,
                                          finish_time_s=outcome.finish_time_s))

    def close(self) -> None:
        """Flush and close the log (if on)."""
        if self.log is not None:
            self.log.close()
