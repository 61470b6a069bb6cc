"""Floors every learned predictor must beat: the global median and prompt-length linear regression."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LinearRegression

from lenpred.predictors import Predictor, num_prompt_tokens, register


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
