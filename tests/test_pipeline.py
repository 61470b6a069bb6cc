"""LengthPredictor on the tiny model: train -> save -> load -> predict round trip, intervals, refusals, CLI."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lenpred.cli import app
from lenpred.errors import LenpredError
from lenpred.pipeline import LengthPrediction, LengthPredictor

runner = CliRunner()


@pytest.fixture(scope="module")
def fitted(tiny_bench, tiny_model_dir):
    bench, data, root = tiny_bench
    return LengthPredictor("estp", str(tiny_model_dir), layers=(1, -1), coverage=0.5, epochs=3).fit(
        bench, data_dir=str(data), cache=str(root / "cache"))


def test_round_trip_gives_identical_predictions(fitted, tmp_path, tiny_model_dir):
    prompts = ["write a long poem about sea", [{"role": "system", "content": "please answer"},
                                               {"role": "user", "content": "what is the sum of two and three"}]]
    before = fitted.predict(prompts, max_new_tokens=20)
    path = fitted.save_pretrained(tmp_path / "p")
    assert sorted(p.name for p in path.iterdir()) == ["CARD.md", "config.json", "predictor.safetensors"]
    config = json.loads((path / "config.json").read_text())
    assert config["method"] == "estp" and config["model_revision"] == fitted.backbone_.revision
    assert config["layers"] == [config["params"]["layer"]] and config["template_rule"].startswith("chat-template")
    loaded = LengthPredictor.from_pretrained(path)
    after = loaded.predict(prompts, max_new_tokens=20)
    assert [a.to_dict(True) for a in after] == [b.to_dict(True) for b in before]
    for p in after:
        assert isinstance(p, LengthPrediction) and 0 <= p.low <= p.median <= p.high <= 20 and p.expected <= 20
        assert sum(p.bin_probs) == pytest.approx(1.0) and max(p.bin_values) <= 20


def test_fit_is_the_loader_then_fit_dataset_which_reads_no_file(fitted, tiny_bench, monkeypatch):
    """fit(bench) = load_dataset (all the I/O) + fit_dataset (none: the loaders are made to fail)."""
    import lenpred.bench.records
    import lenpred.dataset
    from lenpred.dataset import load_dataset
    from lenpred.predictors import required_inputs

    bench, data, root = tiny_bench
    dataset = load_dataset(bench, required_inputs(("estp",)), model=fitted.model, data_dir=str(data),
                           cache=str(root / "cache"), layers=(1, -1))
    assert required_inputs(("estp",)) == {"signals"} and dataset.layers == (1, 2)

    def no_io(*args, **kwargs):
        raise AssertionError("fit_dataset read a file")

    for module, name in ((lenpred.dataset, "load_dataset"), (lenpred.dataset, "load_backbone"),
                         (lenpred.bench.records, "read_manifest"), (lenpred.bench.records, "load_records")):
        monkeypatch.setattr(module, name, no_io)
    again = LengthPredictor("estp", fitted.model, layers=(1, -1), coverage=0.5, epochs=3).fit_dataset(dataset)
    assert again.config_ == fitted.config_ and again.card_ == fitted.card_ and again.margin_ == fitted.margin_
    assert again.predictor_.n_features_in_ == 32  # the tiny model's hidden size


def test_card_scores_every_test_sample_once(fitted):
    """The card's scenario groups together hold the whole test split (the scores themselves are checked by hand in
    tests/test_predictor_card.py)."""
    card = fitted.card_
    groups = {g: c["n"] for g, c in card.items() if g != "overall"}
    assert sum(groups.values()) == card["overall"]["n"] > 0


def test_loading_with_another_model_is_refused(fitted, tmp_path, tmp_path_factory):
    from lenpred.backbone import load_backbone
    from conftest import make_tiny_model_dir

    path = fitted.save_pretrained(tmp_path / "p")
    other = load_backbone(str(make_tiny_model_dir(tmp_path_factory.mktemp("other-llama"), seed=1)))
    with pytest.raises(LenpredError, match="was trained on .* revision .* but the model given is .* revision"):
        LengthPredictor.from_pretrained(path, backbone=other)


def test_not_a_predictor_directory(tmp_path):
    with pytest.raises(LenpredError, match="is not a saved LengthPredictor"):
        LengthPredictor.from_pretrained(tmp_path)


def test_cli_train_and_predict_from_args_file_and_stdin(tiny_bench, tiny_model_dir, tmp_path):
    bench, data, root = tiny_bench
    out = tmp_path / "pred"
    r = runner.invoke(app, ["train", "--bench", str(bench), "--method", "mean", "--out", str(out), "--model",
                            str(tiny_model_dir), "--data-dir", str(data), "--cache", str(root / "cache"),
                            "--layers", "1,-1", "--epochs", "2", "--coverage", "0.5"])  # 2 validation samples
    assert r.exit_code == 0, r.output
    assert "interval coverage" in r.output and (out / "CARD.md").is_file()
    r = runner.invoke(app, ["predict", "--predictor", str(out), "write a poem", "tell me story"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert [l["id"] for l in lines] == [0, 1]
    assert set(lines[0]) >= {"num_prompt_tokens", "expected", "median", "low", "high"}
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt": "write a poem"}\n{"messages": [{"role": "user", "content": "tell me story"}]}\n')
    r2 = runner.invoke(app, ["predict", "--predictor", str(out), "--file", str(f)])
    assert [json.loads(l) for l in r2.stdout.splitlines()] == lines  # the same prompts, the same numbers
    r3 = runner.invoke(app, ["predict", "--predictor", str(out)], input="write a poem\ntell me story\n")
    assert [json.loads(l) for l in r3.stdout.splitlines()] == lines
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    r4 = runner.invoke(app, ["predict", "--predictor", str(out), "--file", str(bad)])
    assert r4.exit_code == 2 and "line 1 of" in r4.stderr and "'prompt' or 'messages'" in r4.stderr
    r5 = runner.invoke(app, ["predict", "--predictor", str(out), "write a poem", "   "])
    assert r5.exit_code == 2 and "error: prompt 1 (counting from 0): empty prompt" in r5.stderr
    (tmp_path / "afile").write_text("x")  # an --out that is a file: refused before any work
    r6 = runner.invoke(app, ["train", "--bench", str(bench), "--out", str(tmp_path / "afile"), "--model", "no/such"])
    assert r6.exit_code == 2 and "is (or lies under) a file" in r6.stderr


@pytest.mark.slow
def test_shipped_predictor_predicts_with_the_default_model():
    model = LengthPredictor.from_pretrained()  # the directory inside the package
    assert model.config_.model_id == "smollm2-135m-instruct" and model.config_.method == "last"
    a, b = model.predict(["Write a haiku about rain", "Write a 1000-word story about a lighthouse keeper"],
                         max_new_tokens=1024)
    assert 0 <= a.low <= a.median <= a.high <= 1024 and 0 < a.expected < b.expected <= 1024
    r = runner.invoke(app, ["predict", "--max-new-tokens", "1024", "Write a haiku about rain"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.splitlines()[0])["expected"] == round(a.expected, 1)  # CLI and Python agree
    assert model.card_["overall"]["n"] > 1000 and 0 < model.card_["overall"]["interval_coverage"] <= 1


@pytest.mark.slow
def test_shipped_predictor_updates_remaining_length_during_decoding():
    from lenpred.inputs.decode_states import teacher_forced_states

    model = LengthPredictor.from_pretrained()
    layer = model.progressive_info_["plp_layer"]
    states = model.start(["Write a haiku about rain"], max_new_tokens=256)
    assert states[0].step == 0 and 0 < states[0].remaining <= 256
    prompt = model.prepare(["Write a haiku about rain"], 256)[0].token_ids
    response = model.backbone_.tokenizer.encode("Soft rain on the roof, a quiet song for the night, the garden drinks deep")
    hidden = teacher_forced_states(model.backbone_, [(prompt, response)], [np.array([0, 8])], (layer,))[0][:, 0]
    first = states[0].remaining
    model.update(states, [0], hidden[:1].numpy())
    assert states[0].remaining == pytest.approx(first, rel=1e-4)  # step 0 from the prefill = step 0 teacher-forced
    model.update(states, [8], hidden[1:].numpy())
    assert states[0].step == 8 and 0 <= states[0].remaining <= 248
