"""config.json of a saved predictor: the typed PredictorConfig, its one reader / writer, the old files (the shipped
predictor's among them) loading unchanged, and the refusals naming the bad key."""

import dataclasses
import json
import shutil

import pytest

from lenpred.errors import LenpredError
from lenpred.pipeline import DEFAULT_PREDICTOR, LengthPredictor
from lenpred.predictor_config import (CONFIG_FILE, PredictorConfig, TrainingBenchmark, TrainingTraffic,
                                      checked_settings, read_config)

SHIPPED = DEFAULT_PREDICTOR / CONFIG_FILE


def test_the_shipped_config_reads_typed_and_writes_back_byte_identical():
    config, settings, card = read_config(DEFAULT_PREDICTOR)
    assert (config.method, config.layers, config.model_revision) == ("last", [15], "b179c9523d0e6a0f")
    assert config.training_benchmark == TrainingBenchmark("smollm2-forelen", "83296444e9e446de", 4879,
                                                          {"train": 0, "validation": 12, "test": 8})
    assert config.training_traffic is None and config.interval_margin == 18.60480464936292
    assert settings["layers"] == [15, 22, -1] and card["overall"]["n"] == 1576
    assert config.to_json(settings, card) == SHIPPED.read_text()
    assert not hasattr(config, "__getitem__") and not hasattr(config, "get")  # typed: no dict-style shim


def test_a_traffic_refit_config_round_trips():
    traffic = TrainingTraffic(log="log/", num_records=60, parts=4, features_dtype="float16", first_finish_time_s=1.0,
                              last_finish_time_s=2.0, num_train=30, num_calibration=15, num_test=15)
    config = PredictorConfig(method="last", params={"layer": 1}, chosen_on_validation={"refit_of": "base"},
                             model_id="tiny", model_revision="r0", layers=[1], semantic=False, template_rule="t",
                             coverage=0.5, interval_margin=2.5,
                             training_benchmark=TrainingBenchmark("b", "f", 10, {"train": 0}, split="train"),
                             training_traffic=traffic, lenpred_version="9")
    text = config.to_json({"method": "last"}, {})
    data = json.loads(text)
    assert list(data)[-4:] == ["training_traffic", "lenpred_version", "settings", "card"]
    assert data["training_benchmark"]["split"] == "train" and data["training_traffic"]["num_train"] == 30
    assert PredictorConfig.from_json(text) == (config, {"method": "last"}, {})
    no_split = dataclasses.replace(config, training_benchmark=TrainingBenchmark("b", "f", 10, {}))
    assert "split" not in json.loads(no_split.to_json({}, {}))["training_benchmark"]  # a benchmark fit's format


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(extra=1), r"holds unknown key\(s\) extra \(valid: method, params,"),
    (lambda d: d.pop("model_revision"), r"lacks key\(s\) model_revision: it was not written by"),
    (lambda d: d["training_benchmark"].update(rows=3), r"\(training_benchmark\) holds unknown key\(s\) rows"),
    (lambda d: d["training_benchmark"].pop("plan_fingerprint"), r"\(training_benchmark\) lacks key\(s\) plan_fing"),
    (lambda d: d.pop("settings"), r"is not a saved LengthPredictor's config \(KeyError: no readable settings\)"),
    (lambda d: d.update(coverage=1.5), r"coverage must lie in \(0, 1\), got 1.5"),
])
def test_bad_keys_are_refused_by_name(edit, message):
    data = json.loads(SHIPPED.read_text())
    edit(data)
    with pytest.raises(LenpredError, match=message):
        PredictorConfig.from_json(json.dumps(data))


def test_settings_take_init_defaults_and_refuse_unknown_names():
    names = LengthPredictor.param_names()
    assert names == ["method", "model", "layers", "coverage", "seed", "epochs", "binning", "pool_span",
                     "semantic_divisor"]
    assert checked_settings({"method": "last", "layers": [1, 2]}, names, "c") == {"method": "last", "layers": (1, 2)}
    with pytest.raises(LenpredError, match=r"has settings \['lr'\] that LengthPredictor does not take"):
        checked_settings({"method": "last", "lr": 0.1}, names, "c")


def test_another_prompt_rule_or_no_file_is_refused(tmp_path):
    with pytest.raises(LenpredError, match="is not a saved LengthPredictor"):
        read_config(tmp_path)
    shutil.copytree(DEFAULT_PREDICTOR, tmp_path / "p")
    data = json.loads(SHIPPED.read_text())
    (tmp_path / "p" / CONFIG_FILE).write_text(json.dumps({**data, "template_rule": "old/v0"}))
    with pytest.raises(LenpredError, match="trained with prompt rule 'old/v0'"):
        LengthPredictor.from_pretrained(tmp_path / "p", load_model=False)


def test_the_shipped_predictor_loads_head_only_with_its_settings(one_torch_thread):
    lp = LengthPredictor.from_pretrained(load_model=False)
    assert isinstance(lp.config_, PredictorConfig) and lp.margin_ == 18.60480464936292
    assert lp.engine_layer == 15 and lp.get_params()["layers"] == (15, 22, -1) and lp.coverage == 0.8
    assert lp.progressive_info_["prompt"] == "last@15"  # plp.safetensors attached: same method, layer, revision
