"""One default per option: every CLI option's default is its config field's default (drift cannot come back)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import typer

from lenpred.backbone import DEFAULT_MODEL
from lenpred.bench.build import build_benchmark
from lenpred.bench.plan import BenchConfig
from lenpred.cli import app, default_of
from lenpred.engines import VLLMOptions
from lenpred.pipeline import LengthPredictor
from lenpred.serving.proxy.app import serve as run_proxy
from lenpred.serving.proxy.batching import BatchConfig
from lenpred.studies.diagnose.config import DiagnoseConfig
from lenpred.studies.evaluate import DEMO_DEFAULTS, EvalConfig
from lenpred.studies.progressive import ProgressiveConfig
from lenpred.studies.simulate import SimExperimentConfig
from lenpred.studies.static_run import CalibrationConfig, StaticRunConfig
from lenpred.studies.traffic import TrafficReplayConfig
from lenpred.studies.vllm_offline import VLLMOfflineConfig
from lenpred.studies.vllm_serve import VLLMServeConfig
from lenpred.studies.workload import WorkloadConfig

# command -> (sources searched in order, {option: field} where the names differ, options with no config field:
# their default must be "not given" (None / False / "" / required))
COMMANDS = {
    "demo": ([(EvalConfig, DEMO_DEFAULTS)], {}, {}),
    "evaluate": ([EvalConfig], {}, {}),
    "progressive": ([ProgressiveConfig], {}, {}),
    "train": ([LengthPredictor, LengthPredictor.from_traffic, LengthPredictor.fit],
              {}, {"bench", "out", "traffic", "data_dir", "cache", "threads"}),
    "traffic-replay": ([TrafficReplayConfig], {}, {}),
    "predict": ([], {}, {"predictor", "file", "max_new_tokens", "scenario", "distribution", "threads"}),
    "serve": ([run_proxy, BatchConfig], {"batch_window_ms": "window_ms"}, {"upstream"}),
    "diagnose": ([DiagnoseConfig], {"evaluate_dir": "evaluate"}, {"skip"}),
    "bench build": ([build_benchmark, BenchConfig, VLLMOptions], {},
                    {"out", "preset", "prompts", "spec", "scenario", "samples", "eval_samples", "temperature", "top_p",
                     "max_new_tokens", "num_prompts", "max_prompt_tokens", "gpu_memory_utilization",
                     "cpu_threads_bind", "cpu_reserved_cores"}),
    "bench card": ([], {}, {}),
    "schedule predictions": ([WorkloadConfig], {}, {}),
    "schedule calibrate": ([CalibrationConfig], {}, {}),
    "schedule simulate": ([SimExperimentConfig], {}, {}),
    "schedule run-static": ([StaticRunConfig], {}, {}),
    "schedule report": ([SimExperimentConfig], {}, {}),
    "schedule vllm-offline": ([VLLMOfflineConfig], {}, {}),
    "schedule vllm-serve": ([VLLMServeConfig], {"rate": "rate_per_s"}, {}),
}
# options whose default is a value of another form than the field's (checked here by hand)
SPECIAL = {("demo", "seed"): DEMO_DEFAULTS["seeds"][0], ("bench build", "model"): DEFAULT_MODEL}


def _commands():
    def walk(command, path=()):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, (*path, name))
        else:
            yield " ".join(path), command
    return dict(walk(typer.main.get_command(app)))


def _has(source, name: str) -> bool:
    source = source[0] if isinstance(source, tuple) else source
    if dataclasses.is_dataclass(source):
        return name in {f.name for f in dataclasses.fields(source)}
    return name in inspect.signature(source).parameters


def _default(source, name: str):
    cls, overrides = source if isinstance(source, tuple) else (source, None)
    return default_of(cls, name, overrides)


def test_every_command_is_listed():
    assert set(_commands()) == set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_cli_defaults_are_the_config_defaults(path):
    sources, renames, cli_only = COMMANDS[path]
    options = [p for p in _commands()[path].params if getattr(p, "param_type_name", "") == "option"]
    assert options or path == "bench card"
    for option in options:
        name = option.name
        if (path, name) in SPECIAL:
            assert option.default == SPECIAL[path, name], (path, name)
        elif name in cli_only:
            assert option.required or option.default in (None, False, ""), (path, name, option.default)
        else:
            field = renames.get(name, name)
            source = next((s for s in sources if _has(s, field)), None)
            assert source is not None, f"{path} --{name}: no config field {field}"
            assert option.default == _default(source, field), (path, name, option.default)


def test_default_of_reads_fields_signatures_and_overrides():
    assert default_of(SimExperimentConfig, "arrivals") == "all,poisson,gamma"  # tuple -> comma-separated text
    assert default_of(EvalConfig, "out") == "results/evaluate"
    assert default_of(EvalConfig, "out", DEMO_DEFAULTS) == "results/demo"
    assert default_of(TrafficReplayConfig, "streams") == "recurring,new-prompts"  # a field(default=...)
    assert default_of(LengthPredictor.from_traffic, "calibration_share") == 0.1
    with pytest.raises(KeyError):
        default_of(EvalConfig, "no_such_field")
    with pytest.raises(KeyError):
        default_of(LengthPredictor.fit, "bench")  # a parameter without a default


def test_drifted_defaults_are_the_committed_runs():
    """The two defaults that had drifted apart are the ones the committed results were made with."""
    import json

    root = Path(__file__).resolve().parents[1] / "results"
    sim = json.loads((root / "scheduling" / "simulation.json").read_text())["config"]
    assert tuple(sim["arrivals"]) == SimExperimentConfig().arrivals == ("all", "poisson", "gamma")
    overhead = json.loads((root / "diagnose" / "overhead.json").read_text())
    assert overhead["repeats"] == DiagnoseConfig().overhead_repeats == 2


def test_one_source_for_the_default_model_name():
    """The default model's alias is written once (``backbone.DEFAULT_MODEL``) in the package's code."""
    src = Path(__file__).resolve().parents[1] / "src" / "lenpred"
    holders = [p.relative_to(src).as_posix() for p in src.rglob("*.py") if f'"{DEFAULT_MODEL}"' in p.read_text()]
    assert holders == ["backbone.py"]


def test_library_below_studies_has_no_results_or_benchmarks_defaults():
    """Paths under results/ or benchmarks/ are the studies' defaults; the library takes them as arguments."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "lenpred"
    found = []
    for path in src.rglob("*.py"):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("studies/") or rel == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            defaults = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defaults = [*node.args.defaults, *node.args.kw_defaults]
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                defaults = [node.value]
            for d in defaults:
                if isinstance(d, ast.Constant) and isinstance(d.value, str) and \
                        d.value.startswith(("results/", "benchmarks/")):
                    found.append(f"{rel}:{d.lineno}")
    assert found == []
