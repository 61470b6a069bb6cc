"""Floors every learned predictor must beat: the median and a prompt-length linear regression, per scenario (what a
user who knows the workload has; the floors "gap closed" is measured from) and pooled over all scenarios."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LinearRegression

from lenpred.errors import LenpredError
from lenpred.predictors.registry import Predictor, Reads, num_prompt_tokens, register


@register("global_median")
class GlobalMedian(Predictor):
    """Predicts the median training length for every prompt (the best constant under MAE)."""

    def fit(self, signals, y):
        self.median_ = float(np.median(np.asarray(y, dtype=np.float64)))
        return self

    def predict(self, signals):
        return np.full(len(signals), self.median_)

    def _get_state(self):
        return {}, {"median": self.median_}

    def _set_state(self, tensors, info):
        self.median_ = float(info["median"])


@register("prompt_length")
class PromptLengthRegression(Predictor):
    """Least-squares line ``y = a * num_prompt_tokens + b`` (scikit-learn ``LinearRegression``), clipped at 0."""

    def fit(self, signals, y):
        self.model_ = LinearRegression().fit(num_prompt_tokens(signals)[:, None], np.asarray(y, dtype=np.float64))
        return self

    def predict(self, signals):
        return np.clip(self.model_.predict(num_prompt_tokens(signals)[:, None]), 0, None)

    def _get_state(self):
        return {"coef": torch.tensor(self.model_.coef_, dtype=torch.float64)}, {"intercept": float(self.model_.intercept_)}

    def _set_state(self, tensors, info):
        self.model_ = LinearRegression()
        self.model_.coef_ = tensors["coef"].numpy()
        self.model_.intercept_ = float(info["intercept"])
        self.model_.n_features_in_ = 1


def _scenarios(requests) -> np.ndarray:
    if any(r.scenario is None for r in requests):
        raise LenpredError("a per-scenario floor needs Request.scenario on every request")
    return np.array([r.scenario for r in requests])


@register("scenario_median")
class ScenarioMedian(Predictor):
    """The median training length of the request's scenario (the best constant per scenario under MAE); a scenario
    not seen in training gets the median over all scenarios."""

    def reads(self) -> Reads:
        """The request's workload (``Request.scenario``); the prompt length comes with its token ids."""
        return Reads(scenario=True)

    def fit(self, requests, y):
        y, scen = np.asarray(y, dtype=np.float64), _scenarios(requests)
        self.medians_ = {s: float(np.median(y[scen == s])) for s in sorted(set(scen.tolist()))}
        self.median_ = float(np.median(y))
        return self

    def predict(self, requests):
        return np.array([self.medians_.get(s, self.median_) for s in _scenarios(requests)])

    def _get_state(self):
        return {}, {"medians": self.medians_, "median": self.median_}

    def _set_state(self, tensors, info):
        self.medians_, self.median_ = dict(info["medians"]), float(info["median"])


@register("scenario_prompt_length")
class ScenarioPromptLengthRegression(Predictor):
    """One least-squares line ``y = a_s * num_prompt_tokens + b_s`` per scenario ``s``, clipped at 0; a scenario not
    seen in training gets the line fitted on all of them."""

    def reads(self) -> Reads:
        """The request's workload (``Request.scenario``); the prompt length comes with its token ids."""
        return Reads(scenario=True)

    def fit(self, requests, y):
        y, scen, n = np.asarray(y, dtype=np.float64), _scenarios(requests), num_prompt_tokens(requests)[:, None]
        self.lines_ = {s: LinearRegression().fit(n[scen == s], y[scen == s]) for s in sorted(set(scen.tolist()))}
        self.line_ = LinearRegression().fit(n, y)
        return self

    def predict(self, requests):
        scen, n = _scenarios(requests), num_prompt_tokens(requests)[:, None]
        out = np.empty(len(requests))
        for s in set(scen.tolist()):
            m = scen == s
            out[m] = self.lines_.get(s, self.line_).predict(n[m])
        return np.clip(out, 0, None)

    def _get_state(self):
        lines = {s: [float(m.coef_[0]), float(m.intercept_)] for s, m in self.lines_.items()}
        return {}, {"lines": lines, "line": [float(self.line_.coef_[0]), float(self.line_.intercept_)]}

    def _set_state(self, tensors, info):
        def line(coef, intercept):
            m = LinearRegression()
            m.coef_, m.intercept_, m.n_features_in_ = np.array([coef]), intercept, 1
            return m

        self.lines_ = {s: line(*v) for s, v in info["lines"].items()}
        self.line_ = line(*info["line"])
