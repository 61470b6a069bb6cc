"""Progressive prediction: teacher-forced decode states, TRAIL's smoothing, PLP rows / weights, online updates."""

import numpy as np
import pytest
import torch
from conftest import attach_full_prefill

from lenpred.errors import LenpredError
from lenpred.heads import HeadConfig, SoftLabelRegressor
from lenpred.inputs.decode_states import (extract_decode_states, incremental_decode_states, steps_before,
                                               teacher_forced_shared_prompt, teacher_forced_states)
from lenpred.intervals import conditional_remaining
from lenpred.studies.progressive import oracle_remaining
from lenpred.predictors.progressive import (PLPHead, ProgressiveRows, TrailProgressive, bayes_update, remaining_targets,
                                       transition_prior)
from lenpred.online.progressive import load_plp, save_plp, start_states, update_batch


def test_steps_before_keeps_steps_of_a_running_request():
    assert steps_before(1).tolist() == [0]
    assert steps_before(9).tolist() == [0, 8]
    assert steps_before(64).tolist() == [0, 8, 16, 24, 32, 40, 48, 56]
    assert steps_before(200, (0, 32, 128, 256)).tolist() == [0, 32, 128]


def test_teacher_forcing_equals_incremental_decode(tiny_backbone, one_torch_thread):
    rng = np.random.default_rng(0)
    vocab = tiny_backbone.model.config.vocab_size
    prompt = rng.integers(7, vocab, 9).tolist()
    responses = [rng.integers(7, vocab, k).tolist() for k in (3, 12, 20)]
    steps = [steps_before(len(r), (0, 2, 8, 16)) for r in responses]
    layers = (1, 2)
    batched = teacher_forced_states(tiny_backbone, [(prompt, r) for r in responses], steps, layers)
    shared = teacher_forced_shared_prompt(tiny_backbone, prompt, responses, steps, layers)
    for r, s, a, b in zip(responses, steps, batched, shared):
        ref = incremental_decode_states(tiny_backbone, prompt, r, s, layers)
        assert a.shape == (len(s), 2, 32)
        torch.testing.assert_close(a, ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(b, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(LenpredError, match="beyond"):
        teacher_forced_states(tiny_backbone, [(prompt, responses[0])], [np.array([0, 8])], layers)


def test_decode_cache_resumes_and_refuses_another_key(tiny_backbone, tmp_path, one_torch_thread):
    samples = {"a#0": ([7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]), "a#1": ([7, 8, 9], [20, 21]),
               "b#0": ([9, 9], [12] * 12)}
    first = extract_decode_states(tiny_backbone, samples, (2,), tmp_path, part_size=2, progress=False)
    assert [s.tolist() for s in first.steps] == [[0, 8], [0], [0, 8]]
    parts = sorted(tmp_path.glob("part-*.safetensors"))
    assert len(parts) == 2
    parts[1].unlink()  # a killed run: the second part is re-extracted, the first is read
    again = extract_decode_states(tiny_backbone, samples, (2,), tmp_path, part_size=2, progress=False)
    for a, b in zip(first.states, again.states):
        torch.testing.assert_close(a, b)
    with pytest.raises(LenpredError, match="another model / layers / steps"):
        extract_decode_states(tiny_backbone, samples, (1,), tmp_path, part_size=2, progress=False)


def test_transition_prior_moves_mass_down_one_bin_per_width_tokens():
    p = np.array([[0.0, 0.0, 1.0]])
    np.testing.assert_allclose(transition_prior(p, 2.0, 1), [[0.0, 0.5, 0.5]])
    np.testing.assert_allclose(transition_prior(p, 2.0, 2), [[0.25, 0.5, 0.25]])  # by hand, token by token
    np.testing.assert_allclose(transition_prior(np.array([[1.0, 0.0]]), 4.0, 10), [[1.0, 0.0]])  # bin 0 stays


def test_bayes_update_is_the_normalised_product():
    post = bayes_update(np.array([[0.5, 0.5, 0.0]]), np.array([[0.2, 0.6, 0.2]]))
    np.testing.assert_allclose(post, [[0.25, 0.75, 0.0]])
    np.testing.assert_allclose(bayes_update(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])), [[0.0, 1.0]])


def test_remaining_targets_and_rollout_weights():
    rem, cens, cap = remaining_targets(np.array([10, 10, 512]), np.array([0, 0, 1]), np.array([512, 512, 512]),
                                       np.array([0, 8, 32]))
    assert rem.tolist() == [10, 2, 480] and cap.tolist() == [512, 504, 480] and cens.tolist() == [False, False, True]
    with pytest.raises(LenpredError, match="t < T"):
        remaining_targets(np.array([8]), np.array([0]), np.array([512]), np.array([8]))
    rows = _rows(np.array([0, 0, 0, 1]), np.array([0, 8, 16, 0]))
    np.testing.assert_allclose(rows.rollout_weights(), [1 / 3, 1 / 3, 1 / 3, 1.0])


def test_sample_weight_scales_out_and_pulls_towards_heavy_rows():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 4)).astype(np.float32), rng.integers(5, 100, 40).astype(float)
    y[0] = 400.0
    cfg = HeadConfig(num_bins=6, epochs=40, dropout=0.0)
    base = SoftLabelRegressor(cfg, 0).fit(X, y, sample_weight=np.ones(40))
    np.testing.assert_allclose(SoftLabelRegressor(cfg, 0).fit(X, y).predict(X), base.predict(X), rtol=1e-5)
    scaled = SoftLabelRegressor(cfg, 0).fit(X, y, sample_weight=np.full(40, 3.0))
    np.testing.assert_allclose(scaled.predict(X), base.predict(X), rtol=1e-4)  # only ratios of weights matter
    heavy = SoftLabelRegressor(cfg, 0).fit(X, y, sample_weight=np.r_[50.0, np.ones(39)])
    assert abs(heavy.predict(X[:1])[0] - 400) < abs(base.predict(X[:1])[0] - 400)
    with pytest.raises(LenpredError, match="sample_weight"):
        SoftLabelRegressor(cfg, 0).fit(X, y, sample_weight=np.zeros(40))


def test_conditional_remaining_by_hand():
    probs = np.array([[0.5, 0.25, 0.25]])
    values = np.array([[10.0, 50.0, 100.0]])
    # t = 20: bins above are 50 and 100 with mass .25 each -> E = (30 + 80) / 2 = 55
    np.testing.assert_allclose(conditional_remaining(probs, values, np.array([20.0])), [55.0])
    np.testing.assert_allclose(conditional_remaining(probs, values, np.array([100.0])), [0.0])


def test_oracle_remaining_uses_other_samples_only():
    y = np.array([10.0, 30.0, 50.0, 7.0])
    pids = np.array(["a", "a", "a", "b"])
    # row for sample 0 at t = 0: median(30, 50) = 40; sample 1 at t = 20: unconditional median(10, 50) - 20 = 10,
    # conditional: only 50 > 20 -> 30; single-sample prompt b: NaN
    got = oracle_remaining(y, pids, np.array([0, 1, 3]), np.array([0, 20, 0]), conditional=False)
    np.testing.assert_allclose(got[:2], [40.0, 10.0])
    assert np.isnan(got[2])
    np.testing.assert_allclose(oracle_remaining(y, pids, np.array([1]), np.array([20]), conditional=True), [30.0])


def _rows(sample, step, d=6, seed=0, lengths=None):
    rng = np.random.default_rng(seed)
    n = len(sample)
    lengths = np.asarray(lengths if lengths is not None else step + rng.integers(1, 200, n), float)
    return ProgressiveRows(sample, step, rng.normal(size=(n, 3)).astype(np.float32),
                           rng.normal(size=(n, d)).astype(np.float32), {1: rng.normal(size=(n, d)).astype(np.float32)},
                           lengths, lengths >= 512, np.full(n, 512.0))


def test_plp_online_updates_match_batch_prediction_and_round_trip(tmp_path):
    sample = np.repeat(np.arange(30), 3)
    step = np.tile([0, 8, 16], 30)
    rows = _rows(sample, step, lengths=np.repeat(np.random.default_rng(1).integers(20, 300, 30), 3))
    plp = PLPHead({"epochs": 2, "num_bins": 5}).fit(rows)
    direct = np.clip(plp.predict(rows.prompt_features, rows.plp_state, rows.step, rows.cap), 0, rows.cap - rows.step)
    states = start_states(plp, rows.prompt_features[:4], rows.plp_state[:4], rows.cap[:4])
    assert [s.step for s in states] == [0, 0, 0, 0]
    np.testing.assert_allclose([s.remaining for s in states], plp.predict(rows.prompt_features[:4],
                               rows.plp_state[:4], np.zeros(4), rows.cap[:4]))
    got = update_batch(plp, states, rows.step[:4], rows.plp_state[:4])
    np.testing.assert_allclose(got, direct[:4])
    single = [update_batch(plp, [st], rows.step[i:i + 1], rows.plp_state[i:i + 1])[0] for i, st in enumerate(states)]
    np.testing.assert_allclose(single, got, rtol=1e-6)
    assert states[1].step == 8 and states[1].expected_total == pytest.approx(8 + got[1])
    save_plp(plp, tmp_path / "plp.safetensors", {"prompt": "last@15"})
    loaded, info = load_plp(tmp_path / "plp.safetensors")
    assert info == {"prompt": "last@15"}
    np.testing.assert_allclose(loaded.predict(rows.prompt_features, rows.plp_state, rows.step, rows.cap),
                               plp.predict(rows.prompt_features, rows.plp_state, rows.step, rows.cap))
    with pytest.raises(LenpredError, match="update_batch needs"):
        update_batch(plp, states, rows.step[:3], rows.plp_state[:4])
    with pytest.raises(LenpredError, match="features, this PLP head reads 6"):
        update_batch(plp, states, rows.step[:4], rows.plp_state[:4, :5])
    with pytest.raises(LenpredError, match="NaN"):
        update_batch(plp, states, rows.step[:4], np.full((4, 6), np.nan, np.float32))


def test_trail_progressive_first_refresh_is_the_classifier_and_later_ones_are_smoothed():
    sample = np.repeat(np.arange(20), 2)
    step = np.tile([0, 8], 20)
    rows = _rows(sample, step, lengths=np.repeat(np.random.default_rng(2).integers(20, 300, 20), 2))
    trail = TrailProgressive(1, {"epochs": 2}).fit(rows)
    got = trail.predict_sequence(rows)
    probs = trail.head_.predict_proba(rows.trail_states[1])
    centres = trail.head_.centres_
    first = step == 0
    np.testing.assert_allclose(got[first], (probs[first] * np.minimum(centres, 512)).sum(1))
    i = 1  # the second refresh of rollout 0, by hand
    post = bayes_update(transition_prior(probs[0:1], trail.width_, 8), probs[1:2])
    assert got[i] == pytest.approx(float((post[0] * np.minimum(centres, 504)).sum()))


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir, tiny_bench, tmp_path_factory):
    from lenpred.studies.progressive import ProgressiveConfig, run_progressive

    bench, data, _ = tiny_bench
    root = tmp_path_factory.mktemp("progressive")
    cfg = ProgressiveConfig(model=str(tiny_model_dir), bench=str(bench), data_dir=str(data),
                            out=str(root / "out"), cache=str(root / "cache"), decode_cache=str(root / "dc"), threads=1,
                            head={"epochs": 2}, plp_layers=(2,), trail_layers=(1,), prompt_candidates=(("last", 1),),
                            static=("last", 1), signal_layers=(1, -1), steps=(0, 2, 4))
    return root, data, cfg, run_progressive(cfg)


def test_progressive_run_writes_curves_and_countdown_starts_at_plp(tiny_run):
    import json

    root, _, cfg, report = tiny_run
    out = root / "out"
    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "plp.safetensors", "results.json", "results.md",
                                                     "test_estimates.parquet", "test_estimates.parquet.sha256"]
    written = json.loads((out / "results.json").read_text())
    assert written["plp"]["prompt"] == report.plp["prompt"] == "last@1"
    assert list(written) == list(report.to_dict())  # the typed report is the JSON, key for key
    cells = {(c["population"], c["scenario"], c["step"], c["method"]): c for c in report.curves}
    at0 = [k for k in cells if k[0] == "running" and k[2] == 0 and k[3] == "plp"]
    assert at0
    for k in at0:  # the countdown of PLP's first estimate is PLP itself at step 0
        assert cells[(*k[:3], "countdown")]["mae"] == pytest.approx(cells[k]["mae"])
    running = [c["n"] for c in report.curves if c["population"] == "running" and c["scenario"] == "overall"
               and c["method"] == "plp"]
    assert running == sorted(running, reverse=True)  # fewer rollouts run at later steps
    cost = report.update_cost_us
    assert cost["batch64_us"] > 0 and cost["batch64_per_request_us"] == pytest.approx(cost["batch64_us"] / 64)
    from rich.console import Console

    from lenpred.studies.progressive import render_progressive

    console = Console(width=100, record=True)
    render_progressive(report, console)
    assert f"PLP update: {cost['batch1_us']:.0f} µs single" in console.export_text()


def test_exported_test_estimates_are_the_scored_predictions(tiny_run):
    from lenpred.io import read_parquet_checked

    root, _, cfg, report = tiny_run
    est = read_parquet_checked(root / "out" / "test_estimates.parquet").to_pydict()
    step, T, cap = (np.array(est[k]) for k in ("step", "output_len", "cap"))
    assert len(step) == report.num_rows["test"] and set(step) <= set(cfg.steps)
    assert (step < np.maximum(T, 1)).all()  # a rollout has a state only at the steps it reached
    for m in ("plp", "trail_progressive", "static_conditional"):
        v = np.array(est[m])
        assert ((v >= 0) & (v <= cap - step + 1e-9)).all()  # clipped as scored
    # the running-population MAE of the export reproduces the report's overall PLP cell at every step
    observed = np.minimum(T, cap) - step
    for t in cfg.steps:
        cell = [c for c in report.curves if (c["population"], c["scenario"], c["step"], c["method"])
                == ("running", "overall", t, "plp")]
        if cell and cell[0]["n"]:
            at = step == t
            assert cell[0]["n"] == at.sum()
            assert np.mean(np.abs(np.array(est["plp"])[at] - observed[at])) == pytest.approx(cell[0]["mae"], rel=1e-6)


def test_length_predictor_start_and_update_use_the_plp_head(tiny_run, tiny_model_dir, tmp_path):
    from lenpred.pipeline import LengthPredictor

    root, data, cfg, _ = tiny_run
    lp = LengthPredictor("last", str(tiny_model_dir), layers=(1,), coverage=0.5, epochs=2).fit(cfg.bench, data_dir=str(data),
                                                                                           cache=str(root / "lp-cache"))
    with pytest.raises(LenpredError, match="no progressive head"):
        lp.start(["write a poem"])
    lp.attach_progressive(root / "out" / "plp.safetensors")
    states = lp.start(["write a poem about sea", "what is the sum of two and three"], max_new_tokens=16)
    plp, _ = load_plp(root / "out" / "plp.safetensors")
    reqs = attach_full_prefill(lp.backbone_, lp.prepare(["write a poem about sea", "what is the sum of two and three"],
                                                        16), 1)
    final = np.stack([r.signals.last_token_states[2].numpy() for r in reqs])
    expect = plp.predict(lp.predictor_.features(reqs), final, np.zeros(2), np.full(2, 16.0))
    np.testing.assert_allclose([s.remaining for s in states], np.clip(expect, 0, 16), rtol=1e-5)
    got = lp.update(states, np.array([4, 4]), final)
    assert [s.step for s in states] == [4, 4] and (got <= 12).all()
    saved = LengthPredictor.from_pretrained(lp.save_pretrained(tmp_path / "lp"), backbone=lp.backbone_)
    again = saved.start(["write a poem about sea", "what is the sum of two and three"], max_new_tokens=16)
    np.testing.assert_allclose([s.remaining for s in again], [s.remaining for s in lp.start(
        ["write a poem about sea", "what is the sum of two and three"], max_new_tokens=16)])
