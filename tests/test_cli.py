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
                            "--methods", "scenario_median,global_median,prompt_length,mean,last,egtp,estp"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "results.json").read_text())
    assert list(report["results"]) == ["scenario_median", "global_median", "prompt_length", "mean", "last", "egtp",
                                       "estp"]
    for per_group in report["results"].values():
        assert "overall" in per_group and per_group["overall"]["mae"] >= 0
    # ESTP searched layers x lambda1 x alpha on validation; every other pooled head the same layers only
    assert report["tuning"]["estp"]["num_candidates"] == 2 * 4 * 4
    assert report["tuning"]["egtp"]["num_candidates"] == report["tuning"]["mean"]["num_candidates"] == 2
    # the weight diagnostic of the weighted poolers
    assert 0 < report["tuning"]["estp"]["diagnostics"]["top_token_weight"] <= 1
    assert report["tuning"]["last"]["diagnostics"]["top_token_weight"] == 1.0
    md = (out / "results.md").read_text()
    assert "top-token weight" in md and "| last | 2 | layer " in md and "| 1.000 |" in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "predictors" / "estp.safetensors").is_file()
    assert "estp" in r.output and "MAE" in r.output
    # the terminal shows only tables that fit 100 columns, none truncated; results.md holds every table
    tables = r.stdout.split("oracle floor")[0].splitlines()
    assert tables and max(len(line.rstrip()) for line in tables) <= 100 and "…" not in r.stdout, r.stdout
    assert "RMSE" not in "\n".join(tables) and "RMSE" in md
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


def test_evaluate_every_method_on_tiny_model(tiny_model_dir, tiny_encoder_dir, tiny_data_dir, tmp_path, monkeypatch):
    """The full comparison on a tiny model: every registered method, 2 seeds, oracle floor, reports."""
    from lenpred.studies.evaluate import ALL_METHODS

    monkeypatch.setenv("LENPRED_CACHE", str(tmp_path / "lenpred-cache"))
    bench = tmp_path / "bench"
    assert runner.invoke(app, ["bench", "build", "--out", str(bench), "--preset", "tiny", "--model",
                               str(tiny_model_dir), "--engine", "transformers", "--data-dir",
                               str(tiny_data_dir), "--seed", "5"]).exit_code == 0  # seed 5: two RL prompts in test
    out = tmp_path / "out"
    r = runner.invoke(app, ["evaluate", "--model", str(tiny_model_dir), "--bench", str(bench), "--data-dir",
                            str(tiny_data_dir), "--out", str(out), "--cache", str(tmp_path / "cache"),
                            "--layers", "1,-1", "--epochs", "2", "--proxy-epochs", "1", "--seeds", "0,1",
                            "--proxy-encoder", str(tiny_encoder_dir),
                            "--trail-layers", "1,2"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "results.json").read_text())
    assert list(report["results"]) == list(ALL_METHODS)
    res = report["results"]
    assert report["benchmark_complete"] is True and "incomplete" not in r.output
    assert res["estp"]["overall"]["seeds"] == 2 and res["global_median"]["overall"]["seeds"] == 1
    assert res["global_median"]["overall"]["mae_std"] == 0.0
    # the trivial median has no ranking (constant prediction) and closes none of the oracle gap
    assert res["global_median"]["overall"]["kendall_tau"] is None
    floor = report["oracle_floor"]
    assert floor["rl"]["num_prompts"] == 2 and floor["rl"]["n"] == 4
    assert res["scenario_median"]["rl"]["gap_closed"] == pytest.approx(0.0, abs=1e-9)
    assert res["scenario_median"]["rl"]["mae"] == pytest.approx(floor["rl"]["floor_method_mae"])
    assert [c["layer"] for c in report["tuning"]["trail"]["sweep"]] == [1, 2]
    estp = report["tuning"]["estp"]["chosen"]
    assert {k: report["tuning"]["ltr"]["chosen"][k] for k in ("layer", "lambda1", "alpha")} == {
        k: estp[k] for k in ("layer", "lambda1", "alpha")}
    pia = report["tuning"]["pia"]["diagnostics"]
    assert 0 <= pia["unparsed"] <= pia["of"] == res["pia"]["overall"]["n"]
    assert report["values"]["tokens_per_word"] > 0
    assert set(report["best_external"]) == set(res["estp"]) and all(
        m in ("ssjf_reg", "ssjf_mc", "s3", "pia", "trail", "ltr") for m in report["best_external"].values())
    # intervals and paired differences to the per-scenario floor
    estp = res["estp"]["overall"]
    assert estp["mae_ci"][0] <= estp["mae"] <= estp["mae_ci"][1] and len(estp["diff_floor"]) == 3
    assert res["scenario_median"]["overall"]["diff_floor"] is None
    md = (out / "results.md").read_text()
    assert "| estp |" in md and "overall tau" in md and "overall Δ floor" in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_rejects_bad_options(tmp_path):
    for args, msg in ((["--seeds", "x"], "--seeds takes"), (["--epochs", "0"], "--epochs must be >= 1, got 0"),
                      (["--proxy-epochs", "0"], "--proxy-epochs must be >= 1"),
                      (["--seeds", "0,99999999999999999999"], "seeds must lie in 0..4294967295"),
                      (["--seeds", "-1"], "got [-1]"),
                      (["--threads", "0"], "--threads must be >= 1"), (["--methods", " , "], "no methods"),
                      (["--trail-layers", ""], "--trail-layers takes comma-separated integers")):
        _one_line_error(runner.invoke(app, ["evaluate", *args]), msg)
    (tmp_path / "afile").write_text("x")
    for option in ("--out", "--cache"):
        r = runner.invoke(app, ["evaluate", option, str(tmp_path / "afile" / "sub")])
        _one_line_error(r, f"{option} {tmp_path / 'afile' / 'sub'} is (or lies under) a file")


def test_evaluate_trail_layers_out_of_range_leaves_nothing(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LENPRED_CACHE", str(tmp_path / "lenpred-cache"))
    bench = tmp_path / "bench"
    assert runner.invoke(app, ["bench", "build", "--out", str(bench), "--preset", "tiny", "--model",
                               str(tiny_model_dir), "--engine", "transformers", "--data-dir",
                               str(tiny_data_dir), "--seed", "5"]).exit_code == 0
    r = runner.invoke(app, ["evaluate", "--model", str(tiny_model_dir), "--bench", str(bench), "--data-dir",
                            str(tiny_data_dir), "--out", str(tmp_path / "out"), "--methods", "global_median,trail", "--layers", "1",
                            "--trail-layers", "0,99"])
    _one_line_error(r, "--trail-layers must lie in 1..2")
    assert not (tmp_path / "out").exists()


def test_evaluate_output_folder_is_replaced_whole(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LENPRED_CACHE", str(tmp_path / "lenpred-cache"))
    bench = _tiny_bench(tiny_model_dir, tiny_data_dir, tmp_path / "bench", "--seed", "5")
    out = tmp_path / "out"
    (out / "results.json").mkdir(parents=True)  # a directory where the results file goes: refused before any work
    args = ["evaluate", "--model", str(tiny_model_dir), "--bench", str(bench), "--data-dir", str(tiny_data_dir),
            "--out", str(out), "--layers", "1", "--methods"]
    _one_line_error(runner.invoke(app, [*args, "global_median,prompt_length"]), "results.json is a directory")
    assert [p.name for p in out.iterdir()] == ["results.json"]
    (out / "results.json").rmdir()
    (out / "predictors").write_text("x")
    _one_line_error(runner.invoke(app, [*args, "global_median"]), "predictors is a file")
    (out / "predictors").unlink()
    r = runner.invoke(app, [*args, "global_median,prompt_length"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (out / "predictors").iterdir()) == ["global_median.safetensors",
                                                                       "prompt_length.safetensors"]
    assert runner.invoke(app, [*args, "global_median"]).exit_code == 0  # no stale prompt_length head left behind
    assert [p.name for p in (out / "predictors").iterdir()] == ["global_median.safetensors"]


def _tiny_bench(tiny_model_dir, tiny_data_dir, out, *extra):
    r = runner.invoke(app, ["bench", "build", "--out", str(out), "--preset", "tiny", "--model", str(tiny_model_dir),
                            "--engine", "transformers", "--data-dir", str(tiny_data_dir), *extra])
    assert r.exit_code == 0, r.output
    return out


def test_bench_card_and_resume_on_bad_benchmarks(tiny_model_dir, tiny_data_dir, tmp_path):
    """`bench card` / a resumed `bench build` on missing, empty and corrupt benchmarks: one line each, no traceback."""
    build = ["bench", "build", "--preset", "tiny", "--model", str(tiny_model_dir), "--engine", "transformers",
             "--data-dir", str(tiny_data_dir), "--out"]
    _one_line_error(runner.invoke(app, ["bench", "card", str(tmp_path / "none")]), "holds no benchmark")
    bench = _tiny_bench(tiny_model_dir, tiny_data_dir, tmp_path / "bench", "--max-shards", "0")
    _one_line_error(runner.invoke(app, ["bench", "card", str(bench)]), "has no finished shards yet")
    _tiny_bench(tiny_model_dir, tiny_data_dir, bench, "--max-shards", "2")
    shard = bench / "shards" / "shard-00001.parquet"
    good = shard.read_bytes()
    import pyarrow.parquet as pq

    chunk = pq.ParquetFile(shard).metadata.row_group(0).column(7)  # response_token_ids: footer stays readable
    mid = chunk.data_page_offset + chunk.total_compressed_size // 2
    shard.write_bytes(good[:mid] + b"\0" * 16 + good[mid + 16:])  # garbage in a page
    for args in (["bench", "card", str(bench)], [*build, str(bench)]):
        _one_line_error(runner.invoke(app, args), f"{shard} is not a readable lenpred shard")
    shard.write_bytes(good)
    manifest = bench / "bench.json"
    manifest.write_text(manifest.read_text()[:40])
    for args in (["bench", "card", str(bench)], [*build, str(bench)]):
        _one_line_error(runner.invoke(app, args), f"{manifest} is not a readable benchmark manifest")
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me\n")
    _one_line_error(runner.invoke(app, [*build, str(a_file)]), f"{a_file} exists and is not a directory")
    assert a_file.read_text() == "keep me\n"


def test_bench_build_failed_engine_start_leaves_no_directory(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    import lenpred.bench.build as build
    from lenpred.errors import LenpredError

    def no_vllm(name, *args, **kwargs):
        raise LenpredError("engine 'vllm' needs vLLM: `pip install 'lenpred[vllm]'`")

    monkeypatch.setattr(build, "make_engine", no_vllm)
    r = runner.invoke(app, ["bench", "build", "--out", str(tmp_path / "b"), "--preset", "tiny", "--model",
                            str(tiny_model_dir), "--engine", "vllm", "--data-dir", str(tiny_data_dir)])
    _one_line_error(r, "engine 'vllm' needs vLLM")
    assert not (tmp_path / "b").exists()


def test_bench_build_error_mid_sampling_is_not_glued_to_the_progress_bar(tiny_model_dir, tiny_data_dir, tmp_path,
                                                                        monkeypatch):
    """The progress bar is closed before the error propagates, so `error: ...` starts its own line."""
    import lenpred.bench.build as build
    from lenpred.engines import SampleResult
    from lenpred.errors import LenpredError

    class DiesAfterOneShard:
        name = "flaky"
        calls = 0

        def generate(self, requests):
            self.calls += 1
            if self.calls > 1:
                raise LenpredError("the engine died: rerun the same command to resume")
            return [SampleResult((7, 8), "stop") for _ in requests]

    monkeypatch.setattr(build, "make_engine", lambda *a, **k: DiesAfterOneShard())
    r = runner.invoke(app, ["bench", "build", "--out", str(tmp_path / "b"), "--preset", "tiny", "--model",
                            str(tiny_model_dir), "--engine", "transformers", "--data-dir", str(tiny_data_dir)])
    assert r.exit_code == 2, r.output
    assert "bench build (flaky)" in r.stderr  # the bar was drawn
    assert "\nerror: the engine died: rerun the same command to resume\n" in r.stderr, repr(r.stderr)
    assert (tmp_path / "b" / "shards" / "shard-00000.parquet").is_file()  # the finished shard is kept


def test_unknown_scenario_lists_the_valid_ones():
    r = runner.invoke(app, ["predict", "--scenario", "nosuch", "write a haiku"])
    _one_line_error(r, "unknown scenario 'nosuch'; valid scenarios for this predictor: longseq, reasoning, rl")


def test_blank_prompt_is_refused_before_the_model_loads(monkeypatch):
    from lenpred.pipeline import LengthPredictor

    monkeypatch.setattr(LengthPredictor, "from_pretrained", lambda *a, **k: pytest.fail("the model was loaded"))
    r = runner.invoke(app, ["predict", "write a haiku", "  "])
    _one_line_error(r, "prompt 1 (counting from 0): empty prompt: give it text")


def test_scenario_check_reads_the_predictors_own_scenarios(tmp_path):
    from lenpred.cli import _check_scenario
    from lenpred.errors import LenpredError

    _check_scenario("rl", None)  # the shipped predictor's scenarios
    (tmp_path / "config.json").write_text(json.dumps({"card": {"docs": {}, "chat": {}, "overall": {}}}))
    _check_scenario("docs", str(tmp_path))  # a predictor trained on a benchmark of the user's own prompt files
    with pytest.raises(LenpredError,
                       match="unknown scenario 'longseq'; valid scenarios for this predictor: docs, chat"):
        _check_scenario("longseq", str(tmp_path))
    with pytest.raises(LenpredError, match="unknown scenario 'overall'"):
        _check_scenario("overall", None)
    _check_scenario("anything", str(tmp_path / "missing"))  # no config: left to from_pretrained to report


def _help_texts(command, path="lenpred"):
    yield path, command.help or ""
    for param in command.params:
        yield f"{path} {param.name}", getattr(param, "help", None) or ""
    for name, sub in getattr(command, "commands", {}).items():
        yield from _help_texts(sub, f"{path} {name}")


def test_help_texts_keep_their_square_brackets():
    """Rich markup reads '[word]' as a style tag and drops it (`pip install -e '.[vllm]'` became '.'): every help
    text and docstring must render to itself with its escaped brackets shown."""
    import typer.main
    from rich.markup import render

    for where, text in _help_texts(typer.main.get_command(app)):
        assert render(text).plain == text.replace("\\[", "["), where
    r = runner.invoke(app, ["schedule", "vllm-offline", "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert r.exit_code == 0 and "pip install -e '.[vllm]'" in r.output, r.output
    r = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert "coverage of the [low, high] interval" in r.output, r.output
