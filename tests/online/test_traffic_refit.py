"""Refit on logged traffic: time split by hand, `LengthPredictor.from_traffic` / `lenpred train --traffic` on the tiny
model (saved like any predictor, card says where its data came from), refusals, and the serving-side API."""

import json
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from lenpred.cli import app
from lenpred.errors import LenpredError
from lenpred.intervals import widened_interval
from lenpred.pipeline import LengthPredictor
from lenpred.online.adaptive import AdaptiveConfig
from lenpred.online.learning import OnlineLearning
from lenpred.outcome import RequestOutcome
from lenpred.online.refit import time_split
from lenpred.online.traffic_log import TrafficLogConfig, TrafficLogWriter, TrafficRecord, read_traffic_log

runner = CliRunner()


def _row(features, finish_time_s):
    return TrafficRecord(features=features, expected=1.0, low=0.0, high=2.0, num_output_tokens=1, finish_reason="stop",
                         arrival_time_s=0.0, finish_time_s=finish_time_s)


def test_time_split_by_hand():
    train, cal, test = time_split(10, 0.1, 0.2)  # 2 test (latest), 1 calibration, 7 train (earliest)
    assert train.tolist() == list(range(7)) and cal.tolist() == [7] and test.tolist() == [8, 9]
    with pytest.raises(LenpredError, match="sum below 1"):
        time_split(10, 0.5, 0.5)
    with pytest.raises(LenpredError, match="leave 1 for training"):
        time_split(3, 0.34, 0.34)


@pytest.fixture(scope="module")
def base(tiny_model_dir, tmp_path_factory):
    from conftest import make_tiny_data_dir

    root = tmp_path_factory.mktemp("traffic")
    data = make_tiny_data_dir(root / "data")
    r = runner.invoke(app, ["bench", "build", "--out", str(root / "bench"), "--preset", "tiny", "--model",
                            str(tiny_model_dir), "--engine", "transformers", "--data-dir", str(data), "--seed", "5"])
    assert r.exit_code == 0, r.output
    p = LengthPredictor("last", str(tiny_model_dir), layers=(1,), coverage=0.5, epochs=3).fit(
        root / "bench", data_dir=str(data), cache=str(root / "cache"))
    return p, p.save_pretrained(root / "base"), root


def _write_log(base_p, directory, n=60, seed=0):
    """A log the base predictor would have written: its features of short prompts, outcomes made up (2 prompts
    alternate; every 4th request capped at 16)."""
    prompts = ["write a long poem about sea", "what is the sum of two and three"]
    predictions, feats = base_p.predict(prompts, 16, return_features=True)
    online = OnlineLearning(base_p, log=TrafficLogConfig(directory, max_records_per_part=16),
                            adaptive=AdaptiveConfig(method="rolling", min_scores=5))
    rng = np.random.default_rng(seed)
    for i in range(n):
        served = online.serve(feats[i % 2], [predictions[i % 2]], group=f"route{i % 2}",
                              prompt_sha256=[f"{i % 2:064x}"])[0]
        y = 16 if i % 4 == 3 else int(rng.integers(2 + 6 * (i % 2), 8 + 6 * (i % 2)))
        online.finished(served, RequestOutcome(
            request_id=str(i), num_output_tokens=y, finish_reason="length" if y == 16 else "stop", max_new_tokens=16,
            arrival_time_s=1000.0 + i, first_token_time_s=1000.1 + i, finish_time_s=1001.0 + i))
    online.close()
    return feats


def test_fit_traffic_saves_a_predictor_whose_card_names_its_data(base, tmp_path):
    base_p, base_dir, _ = base
    _write_log(base_p, tmp_path / "log")
    log = read_traffic_log(tmp_path / "log")
    assert log.num_records == 60 and len(log.parts) >= 4 and log.metadata["method"] == "last"  # <= 16 rows a part
    assert set(log.columns["group"]) == {"route0", "route1"} and log.censored.sum() == 15
    p = LengthPredictor.from_traffic(tmp_path / "log", base=base_dir, calibration_share=0.25, test_share=0.25)
    t = p.config_.training_traffic
    assert (t.num_train, t.num_calibration, t.num_test, t.parts) == (30, 15, 15, len(log.parts))
    assert p.config_.training_benchmark is None and p.method == "last" and p.coverage == 0.5
    assert p.predictor_.n_features_in_ == base_p.predictor_.n_features_in_ == 32  # the tiny model's hidden size
    card = p.card_["latest traffic"]
    assert card["n"] == 15 and 0 <= card["interval_coverage"] <= 1 and len(card["mae_minus_base"]) == 3
    path = p.save_pretrained(tmp_path / "refit")
    text = (path / "CARD.md").read_text()
    assert "trained on logged traffic" in text and "the earliest 30 train" in text and "refitted from" in text
    tuned = LengthPredictor.from_traffic(tmp_path / "log", base=base_dir, finetune=True)
    assert set(tuned.config_.chosen_on_validation["finetuned"]) == {"epochs", "lr"}
    assert "fine-tuned from" in tuned.save_pretrained(tmp_path / "tuned").joinpath("CARD.md").read_text()
    loaded = LengthPredictor.from_pretrained(path)
    [pred] = loaded.predict(["what is the sum of two and three"], max_new_tokens=16)
    assert 0 <= pred.low <= pred.expected <= pred.high <= 16


def test_train_traffic_cli_mixes_a_benchmark(base, tmp_path):
    base_p, base_dir, root = base
    _write_log(base_p, tmp_path / "log")
    r = runner.invoke(app, ["train", "--traffic", str(tmp_path / "log"), "--base", str(base_dir), "--bench",
                            str(root / "bench"), "--data-dir", str(root / "data"), "--cache", str(root / "cache-traffic"),
                            "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["training_benchmark"]["split"] == "train" and config["training_traffic"]["num_train"] == 42
    assert "mixed into training: benchmark" in (tmp_path / "p" / "CARD.md").read_text()


def test_logs_of_another_predictor_are_refused(base, tmp_path):
    base_p, base_dir, _ = base
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "wide")) as w:
        for i in range(20):
            w.record(_row(np.zeros(3), float(i)))
    with pytest.raises(LenpredError, match="3-wide features"):
        LengthPredictor.from_traffic(tmp_path / "wide", base=base_dir)
    d = base_p.predictor_.n_features_in_
    with TrafficLogWriter(TrafficLogConfig(tmp_path / "rev", metadata={"model_revision": "other"})) as w:
        for i in range(20):
            w.record(_row(np.zeros(d), float(i)))
    with pytest.raises(LenpredError, match="model_revision other"):
        LengthPredictor.from_traffic(tmp_path / "rev", base=base_dir)


def test_online_fixed_interval_is_the_predictors(base):
    base_p, _, _ = base
    prompts = ["write a long poem about sea"]
    [pred], features = base_p.predict(prompts, max_new_tokens=16, return_features=True)
    [served] = OnlineLearning(base_p).serve(features, [pred])
    assert served.expected == pytest.approx(pred.expected) and served.low == pytest.approx(pred.low)
    assert served.high == pytest.approx(pred.high)


def test_online_initial_margin_zero_is_honoured(base):
    """AdaptiveConfig(initial_margin=0) serves the head's raw quantiles until min_scores outcomes; the default (None)
    serves the predictor's calibrated margin."""
    base_p, _, _ = base
    assert base_p.margin_ != 0  # else the two cases below could not differ
    predictions, features = base_p.predict(["write a long poem about sea"], 16, return_features=True)
    [zero] = OnlineLearning(base_p, adaptive=AdaptiveConfig(initial_margin=0.0)).serve(features, predictions)
    [default] = OnlineLearning(base_p, adaptive=AdaptiveConfig()).serve(features, predictions)
    assert (zero.low, zero.high) == widened_interval(zero.low_raw, zero.high_raw, 0.0, 16)
    assert (default.low, default.high) == widened_interval(default.low_raw, default.high_raw, base_p.margin_, 16)


def test_train_traffic_on_a_live_log(base, tmp_path):
    """`lenpred train --traffic` while the serving side keeps logging (a part every 8 rows): the refit reads a
    consistent snapshot (closed parts plus the journals' complete rows) and succeeds."""
    import threading

    base_p, base_dir, _ = base
    predictions, feats = base_p.predict(["write a long poem about sea", "what is the sum of two and three"], 16,
                                        return_features=True)
    online = OnlineLearning(base_p, log=TrafficLogConfig(tmp_path / "log", max_records_per_part=8))
    stop, logged = threading.Event(), [0]

    def serve():
        while not stop.is_set() or logged[0] < 60:
            i = logged[0]
            served = online.serve(feats[i % 2], [predictions[i % 2]])[0]
            online.finished(served, RequestOutcome(
                request_id=str(i), num_output_tokens=3 + 9 * (i % 2), finish_reason="stop", max_new_tokens=16,
                arrival_time_s=1000.0 + i, first_token_time_s=None, finish_time_s=1001.0 + i))
            logged[0] += 1
            time.sleep(0.001)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        _wait_for_rows(logged, 60)
        r = runner.invoke(app, ["train", "--traffic", str(tmp_path / "log"), "--base", str(base_dir), "--out",
                                str(tmp_path / "p")])
        during = logged[0]
    finally:
        stop.set()
        thread.join()
        online.close()
    assert r.exit_code == 0, r.output
    used = json.loads((tmp_path / "p" / "config.json").read_text())["training_traffic"]["num_records"]
    assert 60 <= used < during  # all logged before the read started; more logged while the refit ran
    assert logged[0] > 60 and read_traffic_log(tmp_path / "log").num_records == logged[0]


def _wait_for_rows(logged, n, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while logged[0] < n:
        assert time.monotonic() < deadline, "the serving thread logged too few rows"
        time.sleep(0.01)


def _write_headless_log(base_p, directory, n=60, flip_before=None):
    """A log captured with no head (lenpred.online.capture): the base's layer-1 last-token features of two prompts,
    no prediction; prompt 0 answers short (2-7 tokens), prompt 1 long (20-29). Rows before ``flip_before`` swap the
    two (a stream whose early part teaches the opposite)."""
    from lenpred.online.capture import HeadlessCapture

    prompts = ["write a long poem about sea", "what is the sum of two and three"]
    _, feats = base_p.predict(prompts, 16, return_features=True)
    capture = HeadlessCapture("tiny", base_p.config_.model_revision, 1, feats.shape[1], base_p.config_.template_rule)
    online = OnlineLearning(capture, log=TrafficLogConfig(directory, features_dtype="float32"))
    rng = np.random.default_rng(0)
    for i in range(n):
        k = i % 2 if flip_before is None or i >= flip_before else 1 - i % 2
        served = online.capture(feats[i % 2], 12, 64, prompt_sha256=f"{i % 2:064x}")
        y = int(rng.integers(2, 8)) if k == 0 else int(rng.integers(20, 30))
        online.finished(served, RequestOutcome(request_id=str(i), num_output_tokens=y, finish_reason="stop",
                                               max_new_tokens=64, arrival_time_s=1000.0 + i,
                                               first_token_time_s=1000.1 + i, finish_time_s=1001.0 + i))
    online.close()
    return feats


def test_first_head_from_a_log_captured_with_no_head(base, tmp_path):
    """No base, no benchmark: the log alone gives a `last` head at the log's layer whose predictions separate the
    short prompt from the long one; saved, it loads without a backbone and predicts from states."""
    base_p, _, _ = base
    feats = _write_headless_log(base_p, tmp_path / "log")
    log = read_traffic_log(tmp_path / "log")
    assert log.metadata["head"] == "none" and json.loads(log.metadata["layers"]) == [1]
    assert np.isnan(log.columns["expected"]).all()
    p = LengthPredictor.from_traffic(tmp_path / "log")
    assert (p.method, p.layers, p.config_.layers, p.config_.model_revision) == (
        "last", (1,), [1], base_p.config_.model_revision)
    assert p.config_.training_benchmark is None and p.config_.training_traffic.num_train == 42
    assert "mae_minus_base" not in p.card_["latest traffic"]  # nothing to compare with
    loaded = LengthPredictor.from_pretrained(p.save_pretrained(tmp_path / "first"), load_model=False)
    assert loaded.engine_layer == 1 and "first head" in (tmp_path / "first" / "CARD.md").read_text()
    short, long = loaded.predict_states(feats, [12, 12], [64, 64])
    assert short.expected < 10 < 18 < long.expected
    with pytest.raises(LenpredError, match="captured with no head: its first head trains on the log alone"):
        LengthPredictor.from_traffic(tmp_path / "log", bench=tmp_path)
    with pytest.raises(LenpredError, match="layers \\[1\\], the base predictor has \\[2\\]"):  # another layer
        other = LengthPredictor.from_pretrained(tmp_path / "first", load_model=False)
        other.config_ = type(other.config_)(**{**vars(other.config_), "layers": [2]})
        from lenpred.traffic_refit import check_log_matches
        check_log_matches(log, other, tmp_path / "log")


def test_train_traffic_refuses_to_save_a_worse_head_over_the_one_in_service(base, tmp_path):
    """`lenpred train --traffic` scores the head already in --out on the log's latest requests: a head trained on a
    stream whose early part teaches the opposite is refused (both MAEs in the message), --force saves it."""
    base_p, _, _ = base
    _write_headless_log(base_p, tmp_path / "good")
    _write_headless_log(base_p, tmp_path / "flipped", flip_before=42)  # train part flipped; calibration/test not
    out = tmp_path / "served"
    r = runner.invoke(app, ["train", "--traffic", str(tmp_path / "good"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    before = (out / "predictor.safetensors").read_bytes()
    r = runner.invoke(app, ["train", "--traffic", str(tmp_path / "flipped"), "--out", str(out)])
    assert r.exit_code != 0 and "not saved" in r.output and "the predictor in service" in r.output, r.output
    assert (out / "predictor.safetensors").read_bytes() == before
    r = runner.invoke(app, ["train", "--traffic", str(tmp_path / "flipped"), "--out", str(out), "--force"])
    assert r.exit_code == 0, r.output
    assert (out / "predictor.safetensors").read_bytes() != before
    r = runner.invoke(app, ["train", "--traffic", str(tmp_path / "good"), "--out", str(out)])
    assert r.exit_code == 0 and "the predictor in service has MAE" in r.output, r.output  # better: replaced


def test_train_traffic_refuses_an_out_whose_replacement_would_lose_something(base, tmp_path):
    """Saving replaces --out whole: a directory of other files, the log itself, a directory holding the log and an
    unreadable predictor are refused (nothing touched); settings --traffic would ignore are refused too."""
    base_p, _, _ = base
    _write_headless_log(base_p, tmp_path / "traffic" / "observe")
    log = str(tmp_path / "traffic" / "observe")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{")
    for args, message in ((["--out", str(tmp_path / "mine")], "holds files but no saved predictor"),
                          (["--out", log], "is (or holds) the traffic log"),
                          (["--out", str(tmp_path / "traffic")], "is (or holds) the traffic log"),
                          (["--out", str(tmp_path / "bad")], "holds a predictor that cannot be read"),
                          (["--out", str(tmp_path / "p"), "--coverage", "0.9"], "--coverage would be ignored")):
        r = runner.invoke(app, ["train", "--traffic", log, *args])
        assert r.exit_code != 0 and message in r.output, (args, r.output)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious" and read_traffic_log(log).num_records == 60
    r = runner.invoke(app, ["train", "--out", str(tmp_path / "p"), "--force"])
    assert r.exit_code != 0 and "--force is for --traffic" in r.output
    r = runner.invoke(app, ["train", "--traffic", log, "--out", str(tmp_path / "bad"), "--force"])
    assert r.exit_code == 0, r.output  # --force replaces the unreadable one


def test_a_log_too_short_to_calibrate_says_how_many_requests_it_needs(base, tmp_path):
    base_p, _, _ = base
    _write_headless_log(base_p, tmp_path / "log", n=12)  # 12 x 0.1 -> 1 calibration request; 80 % needs 4
    with pytest.raises(LenpredError, match="the log's 12 requests leave 1 to calibrate the 80% interval on, which "
                                           "needs at least 4: log at least 48 requests"):
        LengthPredictor.from_traffic(tmp_path / "log")
