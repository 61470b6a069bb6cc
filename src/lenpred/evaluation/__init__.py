"""Evaluation of length predictors on a stored benchmark: data, tuning, metrics, reports, and the pipeline."""
