"""The `vllm serve` command the README (and docs/serving.md) give for the plug-in runs the plug-in's defaults, which
are the design the queue benchmark measured, under the vLLM flags that design needs."""

from __future__ import annotations

import json
import shlex
from dataclasses import fields
from pathlib import Path

import pytest

from lenpred.serving.vllm.config import KEY, EngineConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/serving.md")
MEASURED = "results/scripts/serving/queue/report.json"
"""The queue benchmark whose burst the README's table quotes; ``regime/plugin`` holds the plug-in's settings there."""


def _plugin_command(doc: str) -> list[str]:
    """The arguments of the first ```bash block in ``doc`` that starts vLLM with lenpred's scheduler."""
    text = (ROOT / doc).read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```bash\n")[1:]]
    block = next((b for b in blocks if "lenpred.serving.vllm.scheduler" in b), None)
    assert block is not None, f"{doc} has no ```bash block that starts vLLM with the plug-in"
    lines = [line for line in block.replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#")]
    command = next(line for line in lines if "--scheduler-cls" in line)
    return shlex.split(command)


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _settings(args: list[str]) -> dict:
    raw = _option(args, "--additional-config")
    return json.loads(raw)[KEY] if raw else {}


@pytest.fixture(params=DOCS)
def command(request) -> list[str]:
    return _plugin_command(request.param)


def test_the_settings_build_an_engine_config(command):
    EngineConfig(**_settings(command))  # an unknown key or a bad value raises


def test_the_settings_are_the_plugins_defaults(command):
    default = EngineConfig()
    differ = {k: (v, getattr(default, k)) for k, v in _settings(command).items() if getattr(default, k) != v}
    assert not differ, ("the plug-in command names settings that are not EngineConfig's defaults "
                        "(setting: (command, default)): " + ", ".join(f"{k}: {v}" for k, v in differ.items()))


def test_the_settings_are_the_measured_design(command):
    measured = json.loads((ROOT / MEASURED).read_text())["regime"]["plugin"]
    config = EngineConfig(**_settings(command))
    names = [f.name for f in fields(EngineConfig) if f.name in measured]
    assert names, f"{MEASURED} names no plug-in setting"
    differ = {k: (getattr(config, k), measured[k]) for k in names if getattr(config, k) != measured[k]}
    assert not differ, f"the command's settings differ from the measured ones (setting: (command, measured)): {differ}"


def test_max_num_seqs_is_the_decode_slots_plus_the_window(command):
    config = EngineConfig(**_settings(command))
    max_num_seqs = _option(command, "--max-num-seqs")
    assert max_num_seqs is not None, "the command sets no --max-num-seqs"
    assert config.prefill_ahead is not None
    assert int(max_num_seqs) == config.decode_slots + config.prefill_ahead


def test_admission_by_prompt_length_runs_under_priority_scheduling(command):
    if EngineConfig(**_settings(command)).admit_by == "prompt_len":
        assert _option(command, "--scheduling-policy") == "priority"


def test_the_command_is_the_one_the_plugin_needs(command):
    assert "--enforce-eager" in command
    assert _option(command, "--worker-cls") == "lenpred.serving.vllm.worker.LenpredCPUWorker"
    assert _option(command, "--scheduler-cls") == "lenpred.serving.vllm.scheduler.LenpredScheduler"
