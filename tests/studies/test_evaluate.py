"""lenpred.studies.evaluate: an interrupted run resumes at the method it stopped in, with the same results."""

import json

import pytest
import torch

from lenpred.errors import LenpredError


def _config(tiny_model_dir, bench, data, out, **over):
    from lenpred.studies.evaluate import EvalConfig

    return EvalConfig(**{"model": str(tiny_model_dir), "bench": str(bench), "data_dir": str(data), "out": str(out),
                         "layers": (1,), "methods": ("global_median", "last", "prompt_length"), "seeds": (0, 1),
                         "epochs": 3, "bootstrap_resamples": 100, **over})


def _stable(out):
    """results.json without the wall times (the one part a resumed run may change)."""
    content = json.loads((out / "results.json").read_text())
    content.pop("timing_s")
    return content


def _predictor_file(path):
    """A saved predictor's header (JSON values parsed) and tensors."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        header = {k: json.loads(v) if k != "predictor" else v for k, v in f.metadata().items()}
    return header, load_file(str(path))


def test_an_interrupted_evaluate_resumes_at_its_method_with_the_same_results(tiny_model_dir, tiny_bench, tmp_path,
                                                                              monkeypatch):
    from lenpred import tuning
    from lenpred.studies.evaluate import run_evaluate

    monkeypatch.setenv("LENPRED_CACHE", str(tmp_path / "cache"))
    bench, data, _ = tiny_bench
    run_evaluate(_config(tiny_model_dir, bench, data, tmp_path / "fresh"))

    calls, real, interrupt = [], tuning.tune_and_refit, [True]

    def stop_at_prompt_length(method, *args):
        calls.append(method)
        if method == "prompt_length" and interrupt[0]:
            raise KeyboardInterrupt
        return real(method, *args)

    monkeypatch.setattr(tuning, "tune_and_refit", stop_at_prompt_length)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run_evaluate(_config(tiny_model_dir, bench, data, out))
    stored = json.loads((out / "checkpoint" / "runs.json").read_text())
    assert sorted(stored["runs"]) == ["global_median", "last"] and not (out / "results.json").exists()
    assert sorted(p.name for p in (out / "checkpoint").glob("*.safetensors")) == ["global_median.safetensors",
                                                                                    "last.safetensors"]

    with pytest.raises(LenpredError, match=r"checkpoint/runs.json holds runs with other settings \(seeds \[0, 1\] "
                                           r"\(now \[0, 2\]\)\)"):
        run_evaluate(_config(tiny_model_dir, bench, data, out, seeds=(0, 2)))

    calls.clear()
    interrupt[0] = False
    run_evaluate(_config(tiny_model_dir, bench, data, out, bootstrap_resamples=200, methods=(
        "global_median", "last", "prompt_length")))
    assert calls == ["prompt_length"]  # the two finished methods were read back, not refit
    assert not (out / "checkpoint").exists()
    fresh, resumed = _stable(tmp_path / "fresh"), _stable(out)
    assert resumed["results"] != {} and resumed["tuning"] == fresh["tuning"]
    for method in ("global_median", "last", "prompt_length"):
        assert resumed["results"][method]["overall"]["mae"] == fresh["results"][method]["overall"]["mae"]
        assert resumed["results"][method]["overall"]["rmse"] == fresh["results"][method]["overall"]["rmse"]
    assert sorted(p.name for p in (out / "predictors").iterdir()) == [
        "global_median.safetensors", "last.safetensors", "prompt_length.safetensors"]
    resumed_head, fresh_head = (_predictor_file(d / "predictors" / "last.safetensors")
                                for d in (out, tmp_path / "fresh"))
    assert resumed_head[0] == fresh_head[0]
    assert resumed_head[1].keys() == fresh_head[1].keys()
    assert all(torch.equal(resumed_head[1][k], fresh_head[1][k]) for k in fresh_head[1])
