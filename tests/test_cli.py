import json

import pytest
from typer.testing import CliRunner

from lenpred.cli import app

runner = CliRunner()


def _one_line_error(result, fragment: str):
    assert result.exit_code == 2, result.output
    lines = [l for l in result.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1 and fragment in lines[0], result.stderr


def test_unknown_model(tmp_path):
    r = runner.invoke(app, ["bench", "build", "--out", str(tmp_path / "b"), "--model", "no-org/no-model"])
    _one_line_error(r, "unknown model 'no-org/no-model'")
    assert not (tmp_path / "b").exists()


def test_unknown_preset(tmp_path):
    r = runner.invoke(app, ["bench", "build", "--out", str(tmp_path / "b"), "--preset", "huge"])
    _one_line_error(r, "unknown preset 'huge'; valid presets: first, forelen, tiny")


def test_unknown_method_names_valid_ones():
    r = runner.invoke(app, ["demo", "--methods", "egtp,oracle"])
    _one_line_error(r, "unknown methods ['oracle']; valid:")


def test_bad_layers_option():
    r = runner.invoke(app, ["demo", "--layers", "a,b"])
    _one_line_error(r, "--layers takes comma-separated integers")


def test_missing_benchmark(tiny_model_dir, tmp_path):
    r = runner.invoke(app, ["demo", "--model", str(tiny_model_dir), "--bench", str(tmp_path / "none")])
    _one_line_error(r, "holds no benchmark")


def test_bench_build_and_demo_end_to_end_on_tiny_model(tiny_model_dir, tiny_data_dir, tmp_path):
    """The whole main job on a tiny model: build, extract, tune on validation, report table + JSON + PNG."""
    bench = tmp_path / "bench"
    r = runner.invoke(app, ["bench", "build", "--out", str(bench), "--preset", "tiny", "--model", str(tiny_model_dir),
                            "--engine", "transformers", "--data-dir", str(tiny_data_dir), "--seed", "1"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "out"
    r = runner.invoke(app, ["demo", "--model", str(tiny_model_dir), "--bench", str(bench), "--data-dir",
                            str(tiny_data_dir), "--out", str(out), "--cache", str(tmp_path / "cache"),
                            "--layers", "1,-1", "--epochs", "2",
                            "--methods", "global_median,prompt_length,mean,last,egtp,estp"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "results.json").read_text())
    assert list(report["results"]) == ["global_median", "prompt_length", "mean", "last", "egtp", "estp"]
    for per_group in report["results"].values():
        assert "overall" in per_group and per_group["overall"]["mae"] >= 0
    # ESTP searched layers x lambda1 x alpha on validation; EGTP only layers
    assert len(report["tuning"]["estp"]["sweep"]) == 2 * 4 * 4 and len(report["tuning"]["egtp"]["sweep"]) == 2
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "predictors" / "estp.safetensors").is_file()
    assert "estp" in r.output and "MAE" in r.output
    # a second run reads the signal cache instead of extracting again
    r2 = runner.invoke(app, ["demo", "--model", str(tiny_model_dir), "--bench", str(bench), "--data-dir",
                             str(tiny_data_dir), "--out", str(out), "--cache", str(tmp_path / "cache"),
                             "--layers", "1,-1", "--epochs", "2", "--methods", "global_median"])
    assert r2.exit_code == 0, r2.output


def test_changed_data_directory_is_detected(tiny_model_dir, tiny_data_dir, tmp_path):
    bench = tmp_path / "bench"
    assert runner.invoke(app, ["bench", "build", "--out", str(bench), "--preset", "tiny", "--model",
                               str(tiny_model_dir), "--engine", "transformers", "--data-dir",
                               str(tiny_data_dir)]).exit_code == 0
    p = tiny_data_dir / "gsm8k" / "test.jsonl"
    p.write_text("\n".join(json.dumps({"question": "what is the sum of two and three and two and three " * 3,
                                       "answer": "5"}) for _ in range(4)) + "\n")
    r = runner.invoke(app, ["demo", "--model", str(tiny_model_dir), "--bench", str(bench), "--data-dir",
                            str(tiny_data_dir), "--out", str(tmp_path / "o"), "--cache", str(tmp_path / "c"), "--layers", "1"])
    _one_line_error(r, "differs from the one the benchmark was built with")
