"""The tuner: validation choice, clipping to the cap, and the same numbers in any caller thread count."""

import numpy as np
import pytest
import torch

from lenpred.dataset import EvalData
from lenpred.errors import LenpredError
from lenpred.tuning import (TuningContext, TuningSettings, check_run_settings, clipped_predict, fit_and_score,
                            fit_order, one_se_choice, tune_and_refit, tuning_context)
from lenpred.predictors import Request, make_predictor
from lenpred.signals import PromptSignals


def _data(n_prompts: int = 24) -> EvalData:
    g = torch.Generator().manual_seed(0)
    by_prompt, pids, y = {}, [], []
    for i in range(n_prompts):
        n = 3 + i % 4
        s = PromptSignals(torch.randn(2, n, 8, generator=g), torch.rand(n, generator=g), torch.rand(n, generator=g),
                          (1, 2), torch.randn(3, 8, generator=g))
        by_prompt[f"p{i}"] = Request(f"p{i}", list(range(n)), signals=s, content_span=(1, n), max_new_tokens=100,
                                     scenario="ab"[i % 2])
        pids += [f"p{i}", f"p{i}"]
        y += [float(10 + 7 * i % 90), float(100 if i % 3 == 0 else 20 + i)]
    pids, y = np.array(pids), np.array(y)
    split = np.array(["train"] * 32 + ["validation"] * 8 + ["test"] * 8)
    cols = {"prompt_id": pids, "split": split, "scenario": np.array([by_prompt[p].scenario for p in pids])}
    return EvalData(cols, by_prompt, {}, np.empty(len(y), object), y, y == 100,
                    {s: np.flatnonzero(split == s) for s in ("train", "validation", "test")}, {}, True)


def _ctx() -> TuningContext:
    return TuningContext(layers=(1, 2), trail_layers=(1, 2), lambda1_grid=(1.0,), alpha_grid=(1.0, 2.0),
                         pooled_settings={"pool_span": "content", "semantic_divisor": "n", "head": {"epochs": 3}})


def test_same_predictions_in_any_caller_thread_count():
    data, before = _data(), torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(tune_and_refit("estp", data, _ctx(), (0, 1)))
        assert torch.get_num_threads() == 2  # the caller's count is restored
    finally:
        torch.set_num_threads(before)
    for a, b in zip(runs[0].predictions, runs[1].predictions):
        np.testing.assert_array_equal(a, b)
    assert runs[0].chosen == runs[1].chosen and len(runs[0].sweep) == 2 * 1 * 2  # layers x lambda1 x alpha


def test_predictions_are_clipped_to_each_requests_cap():
    data = _data()
    reqs = data.rows("test")
    model = make_predictor("prompt_length").fit(data.rows("train"), data.y[data.index["train"]] * 50)
    assert model.predict(reqs).max() > 100 and clipped_predict(model, reqs).max() == 100


def test_fit_order_puts_tune_after_dependencies_first():
    assert fit_order(("ltr", "mean", "estp")) == ["mean", "estp", "ltr"]
    assert fit_order(("ltr", "mean")) == ["ltr", "mean"]  # without estp in the run, ltr tunes ESTP's choice itself


def test_fit_and_score_fits_on_train_and_scores_clipped_validation_and_test():
    data = _data()
    scored = fit_and_score("global_median", {}, data, seed=None)
    median = float(np.median(data.y[data.index["train"]]))  # the whole model: one number
    assert scored.predictor.predict(data.rows("test")).tolist() == [median] * 8
    np.testing.assert_array_equal(scored.val_abs_err, np.abs(median - data.y[data.index["validation"]]))
    np.testing.assert_array_equal(scored.test_abs_err, np.abs(median - data.y[data.index["test"]]))
    assert scored.val_mae == float(np.mean(np.abs(median - data.y[data.index["validation"]])))
    assert fit_and_score("global_median", {}, data, seed=None, test=False).test_abs_err is None


def test_fit_and_score_gives_the_tuners_validation_mae():
    data = _data()
    run = tune_and_refit("mean", data, _ctx(), (0,))
    for row in run.sweep:  # every candidate's validation MAE is fit_and_score's, to the last digit
        params = {k: v for k, v in row.items() if k != "val_mae"}
        assert fit_and_score("mean", params, data, 0, test=False).val_mae == row["val_mae"]


def test_tuning_settings_defaults_are_the_evaluate_configs():
    from dataclasses import fields

    from lenpred.studies.evaluate import EvalConfig

    config = EvalConfig()
    for f in fields(TuningSettings):
        assert getattr(TuningSettings(), f.name) == getattr(config, f.name), f.name


def test_tuning_context_of_settings():
    ctx = tuning_context(TuningSettings(epochs=7, binning="quantile"), (15, 30), 30, {"tokens_per_word": 1.3})
    assert ctx.layers == (15, 30) and ctx.trail_layers == tuple(range(1, 31))
    assert ctx.pooled_settings == {"pool_span": "after_prefix", "semantic_divisor": "n",
                                   "head": {"epochs": 7, "binning": "quantile"}}
    assert ctx.values == {"tokens_per_word": 1.3} and ctx.proxy_settings["encoder"] == "minilm"
    with pytest.raises(LenpredError, match="--epochs must be >= 1, got 0"):
        TuningSettings(epochs=0)


def test_run_settings_are_checked_with_the_configs_messages():
    check_run_settings(("mean", "estp"), (0, 1), 2)
    with pytest.raises(LenpredError, match=r"unknown methods \['nosuch'\]; valid: .*estp"):
        check_run_settings(("nosuch",))
    with pytest.raises(LenpredError, match="seeds must lie in"):
        check_run_settings(("mean",), (2**32,))
    with pytest.raises(LenpredError, match="--threads must be >= 1, got 0"):
        check_run_settings(("mean",), threads=0)


def test_ltr_grid_does_not_depend_on_whether_estp_ran():
    """ltr pools as ESTP chose on validation: alone, after estp, or before it, the same single candidate and the
    same test predictions (the committed run fitted estp first; that choice is what ltr reads in every case)."""
    from lenpred.errors import LenpredError
    from lenpred.predictors import PREDICTORS

    data = _data()
    with pytest.raises(LenpredError, match="no ESTP choice"):
        PREDICTORS["ltr"].param_grid(_ctx())
    after_estp = _ctx()
    estp = tune_and_refit("estp", data, after_estp, (0,))
    with_estp = tune_and_refit("ltr", data, after_estp, (0,))
    alone_ctx = _ctx()
    alone = tune_and_refit("ltr", data, alone_ctx, (0,))
    assert alone_ctx.chosen["estp"] == estp.chosen  # made by tune_dependencies, the same choice
    assert alone.chosen == with_estp.chosen and len(alone.sweep) == 1
    assert {k: alone.chosen[k] for k in ("layer", "lambda1", "alpha")} == {k: estp.chosen[k] for k in
                                                                          ("layer", "lambda1", "alpha")}
    np.testing.assert_array_equal(alone.predictions[0], with_estp.predictions[0])


def test_one_se_choice_keeps_the_simplest_candidate_within_one_standard_error():
    # best: candidate 2, MAE 3.0, errors [1, 3, 5]: std (ddof 1) 2, SE 2 / sqrt(3) = 1.1547; threshold 4.1547
    errs = [np.array([5.0, 5.0, 5.0]), np.array([4.0, 4.0, 4.0]), np.array([1.0, 3.0, 5.0]), np.array([3.5] * 3)]
    assert one_se_choice(errs) == 1  # 5.0 is outside, 4.0 inside: the first (simplest) inside wins, not the best
    assert one_se_choice([errs[2], errs[0]]) == 0
    assert one_se_choice([np.array([1.0, 1.0]), np.array([0.0, 0.0])]) == 1  # SE 0: the best only
    with pytest.raises(LenpredError, match=">= 2 validation requests"):
        one_se_choice([np.array([1.0])])


def test_the_tuner_records_its_one_se_choice_and_the_grid_is_simplest_first():
    data, ctx = _data(), _ctx()
    grid = make_predictor("estp").param_grid(TuningContext(layers=(2, 1), trail_layers=(2, 1), lambda1_grid=(2.0, 1.0),
                                                           alpha_grid=(1.0, 4.0), pooled_settings={}))
    assert [(g["layer"], g["lambda1"], g["alpha"]) for g in grid][:3] == [(1, 1.0, 4.0), (1, 1.0, 1.0), (1, 2.0, 4.0)]
    run = tune_and_refit("mean", data, ctx, (0,))
    errs = [fit_and_score("mean", {k: v for k, v in row.items() if k != "val_mae"}, data, 0, test=False).val_abs_err
            for row in run.sweep]
    assert run.chosen == run.sweep[one_se_choice(errs)]
