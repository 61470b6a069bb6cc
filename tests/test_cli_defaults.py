"""The CLI's defaults: a handful checked against values written here (not computed with the CLI's own helper), and
every option of every command traced to the config field it sets or to a short list of options that have none."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import typer

from lenpred.backbone import DEFAULT_MODEL
from lenpred.bench.build import build_benchmark
from lenpred.bench.plan import BenchConfig
from lenpred.bench.user_prompts import PromptFileConfig
from lenpred.cli import app
from lenpred.engines import VLLMOptions
from lenpred.pipeline import LengthPredictor
from lenpred.serving.proxy.app import serve as run_proxy
from lenpred.serving.proxy.batching import BatchConfig
from lenpred.studies.diagnose.config import DiagnoseConfig
from lenpred.studies.evaluate import EvalConfig
from lenpred.studies.progressive import ProgressiveConfig
from lenpred.studies.simulate import SimExperimentConfig
from lenpred.studies.static_run import CalibrationConfig, StaticRunConfig
from lenpred.studies.traffic import TrafficReplayConfig
from lenpred.studies.vllm_offline import VLLMOfflineConfig
from lenpred.studies.vllm_serve import VLLMServeConfig
from lenpred.studies.whatif import WhatifConfig
from lenpred.studies.workload import WorkloadConfig

# (command, flag) -> the default `--help` shows, as the README / docs state it; comma lists are text
LITERAL_DEFAULTS = {
    ("evaluate", "--epochs"): 150,
    ("evaluate", "--seeds"): "0, 1, 2",
    ("demo", "--out"): "runs/demo",
    ("demo", "--seed"): 0,
    ("train", "--coverage"): 0.8,
    ("serve", "--port"): 8001,
    ("serve", "--batch-window-ms"): 2.0,
    ("schedule simulate", "--arrivals"): "all, poisson, gamma",
    ("schedule simulate", "--aging-steps"): 200,
    ("diagnose", "--overhead-repeats"): 2,
    ("schedule vllm-serve", "--port"): 8011,
    ("bench build", "--kv-cache-space-gib"): 2.0,
    ("bench build", "--model"): DEFAULT_MODEL,
    ("traffic-replay", "--mix-bench"): True,
}

# command -> (configs / functions whose fields or parameters its options set, options with no such field)
COMMANDS = {
    "demo": ([EvalConfig], set()),
    "evaluate": ([EvalConfig], set()),
    "progressive": ([ProgressiveConfig], set()),
    "train": ([LengthPredictor, LengthPredictor.fit, LengthPredictor.from_traffic], {"out", "traffic", "force"}),
    "traffic-replay": ([TrafficReplayConfig], set()),
    "whatif": ([WhatifConfig], set()),
    "predict": ([], {"predictor", "file", "max_new_tokens", "scenario", "distribution", "threads"}),
    "serve": ([run_proxy, BatchConfig], set()),
    "diagnose": ([DiagnoseConfig], {"skip"}),
    "bench build": ([build_benchmark, BenchConfig, VLLMOptions, PromptFileConfig], {"preset", "prompts", "spec"}),
    "bench card": ([], set()),
    "schedule predictions": ([WorkloadConfig], set()),
    "schedule calibrate": ([CalibrationConfig], set()),
    "schedule simulate": ([SimExperimentConfig], set()),
    "schedule run-static": ([StaticRunConfig], set()),
    "schedule report": ([SimExperimentConfig], set()),
    "schedule vllm-offline": ([VLLMOfflineConfig], set()),
    "schedule vllm-serve": ([VLLMServeConfig], set()),
}


def _commands() -> dict:
    def walk(command, path=()):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, (*path, name))
        else:
            yield " ".join(path), command
    return dict(walk(typer.main.get_command(app)))


def _options(path: str) -> list:
    return [p for p in _commands()[path].params if getattr(p, "param_type_name", "") == "option"]


def _has(source, name: str) -> bool:
    if dataclasses.is_dataclass(source):
        return name in {f.name for f in dataclasses.fields(source)}
    return name in inspect.signature(source).parameters


@pytest.mark.parametrize(("path", "flag"), sorted(LITERAL_DEFAULTS))
def test_defaults_are_the_documented_values(path, flag):
    option = next((o for o in _options(path) if flag in o.opts), None)
    assert option is not None, f"{path} has no {flag}"
    assert option.default == LITERAL_DEFAULTS[path, flag], (path, flag, option.default)


def test_every_command_is_listed():
    assert set(_commands()) == set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_option_sets_a_config_field_or_is_listed(path):
    """An option is named after the field it sets (its flag may differ: --rate sets rate_per_s); one with no field
    must be in the command's list, and the list holds no stale names."""
    sources, no_field = COMMANDS[path]
    names = [o.name for o in _options(path)]
    assert names or path == "bench card"
    orphans = [n for n in names if n not in no_field and not any(_has(s, n) for s in sources)]
    assert orphans == [], f"{path}: options with no config field: {orphans}"
    assert no_field <= set(names), f"{path}: listed options that do not exist: {sorted(no_field - set(names))}"


def test_parsed_defaults_reach_the_config(monkeypatch):
    """The comma-list text and the '0 = none' option arrive in the config as the typed values."""
    from typer.testing import CliRunner

    import lenpred.studies.simulate as simulate

    seen = []

    def capture(cfg):
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(simulate, "run_simulation", capture)
    assert CliRunner().invoke(app, ["schedule", "simulate"]).exit_code == 0
    assert CliRunner().invoke(app, ["schedule", "simulate", "--aging-steps", "0", "--progressive", "",
                                    "--predictors", "estp, egtp"]).exit_code == 0
    default, changed = seen
    assert (default.arrivals, default.aging_steps, default.num_requests) == (("all", "poisson", "gamma"), 200, 200)
    assert (changed.aging_steps, changed.progressive, changed.predictors) == (None, None, ("estp", "egtp"))


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
