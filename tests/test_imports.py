"""The package's imports point one way: cli -> studies -> {pipeline, serving, bench} -> core, with no cycle and no
private name taken from another module. The graph (module-level and function-level imports, relative ones
resolved) comes from ``tests/import_graph.py``, the same code ``scripts/code_shape.py`` prints the package's shape
with."""

from __future__ import annotations

from pathlib import Path

import import_graph as shape
import pytest

ROOT = Path(__file__).resolve().parents[1]

# Layer of every top-level part of the package: a module may import its own layer or a lower one, never a higher
# one. Within a layer the cycle check keeps the arrows one-way.
RANKS = {
    # core kernels: pure functions and the serving model's signals
    "errors": 0, "registry": 0, "io": 0, "prompts": 0, "pooling": 0, "heads": 0, "intervals": 0, "metrics": 0,
    "signals": 0,
    "backbone": 0, "version": 0, "tables": 0, "torch_state": 0, "steps": 0,
    "outcome": 0,  # how a served request ended: the one per-request record of the serving paths and the traffic log
    # what a predictor reads, the predictors, the engines that generate responses; `truncated` turns signals of a
    # cut prompt into a prediction with `inputs.cache`'s batching
    "engines": 1, "inputs": 1, "predictors": 1, "truncated": 1,
    # the last predict stage (one head pass -> distribution -> interval), numpy only
    "prediction": 1,
    # benchmarks and the one loader / tuner on top of them (the loader reads benchmark files)
    "bench": 2, "dataset": 2, "tuning": 2, "tuning_settings": 2,
    # learning while serving: the online PLP state, the traffic log, adaptive intervals, refits and OnlineLearning;
    # none of them imports the pipeline, which uses them (attach_progressive, from_traffic)
    "online": 2,
    "pipeline": 3,  # LengthPredictor: dataset + tuning + predictors
    "predictor_config": 3, "predictor_card": 3, "traffic_refit": 3,  # its config.json, card, refit on traffic
    "predictor_progressive": 3,  # its PLP part (start / update), a mixin
    "serving": 4,  # policies, simulator, proxy (serves a LengthPredictor), vLLM plug-in
    "studies": 5,
    "cli": 6, "cli_schedule": 6,  # the commands (`lenpred schedule ...` in their own module)
    "cli_options": 6,  # how a command is declared: options from a config's fields, one-line errors
}

def layer_of(module: str) -> int | None:
    """The layer of a dotted module name: the longest prefix (below the package) that :data:`RANKS` names, or
    ``None``."""
    parts = module.split(".")[1:]
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in RANKS:
            return RANKS[".".join(parts[:k])]
    return None


def layer_violations(edges, package: str = "lenpred") -> list[str]:
    """Upward imports per :data:`RANKS`, and any import of the root package (a facade for users: modules import
    ``lenpred.errors`` etc. directly). Each as ``"src:line -> dst"``. A module with no layer in the rank map is
    reported too, so a new module gets a layer on purpose."""
    bad = []
    for e in edges:
        if e.dst == package:
            bad.append(f"{e.src}:{e.line} -> {e.dst} (the root package is a facade; import the module itself)")
            continue
        if e.src == package:
            continue
        src, dst = layer_of(e.src), layer_of(e.dst)
        for name, rank in ((e.src, src), (e.dst, dst)):
            if rank is None:
                bad.append(f"{name} has no layer in RANKS")
        if src is not None and dst is not None and dst > src:
            bad.append(f"{e.src}:{e.line} -> {e.dst} (layer {src} imports layer {dst})")
    return sorted(set(bad))


@pytest.fixture(scope="module")
def edges():
    return shape.import_edges(shape.package_modules(ROOT / "src" / "lenpred"))


def test_no_import_cycle(edges):
    found = shape.cycles(edges)
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_upward_import(edges):
    found = layer_violations(edges)
    assert found == [], "upward imports:\n" + "\n".join(found)


def test_no_private_name_across_modules(edges):
    found = {(e.src, e.dst, e.name) for e in shape.private_imports(edges)}
    assert found == set(), "make these names public or keep them in their module"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "lenpred"


def test_checker_finds_a_hand_made_cycle_and_layer_breaks(tmp_path):
    pkg = _write(tmp_path, {
        "lenpred/__init__.py": "",
        "lenpred/errors.py": "def f():\n    from lenpred import cli\n",  # function-level, upward
        "lenpred/cli.py": "from .errors import X\nfrom lenpred.studies.run import _private\n",
        "lenpred/studies/__init__.py": "",
        "lenpred/studies/run.py": "import lenpred.studies.report\nfrom lenpred import pipeline\n",
        "lenpred/studies/report.py": "from . import run\n",  # relative, closes run <-> report
        "lenpred/pipeline.py": "import lenpred\nimport numpy\n",
    })
    mods = shape.package_modules(pkg)
    assert set(mods) == {"lenpred", "lenpred.errors", "lenpred.cli", "lenpred.studies", "lenpred.studies.run",
                         "lenpred.studies.report", "lenpred.pipeline"}
    edges = shape.import_edges(mods)
    assert {(e.src, e.dst, e.in_function) for e in edges} == {
        ("lenpred.errors", "lenpred.cli", True),
        ("lenpred.cli", "lenpred.errors", False),
        ("lenpred.cli", "lenpred.studies.run", False),
        ("lenpred.studies.run", "lenpred.studies.report", False),
        ("lenpred.studies.run", "lenpred.pipeline", False),
        ("lenpred.studies.report", "lenpred.studies.run", False),
        ("lenpred.pipeline", "lenpred", False),
    }
    assert shape.cycles(edges) == [["lenpred.cli", "lenpred.errors"], ["lenpred.studies.report", "lenpred.studies.run"]]
    assert [(e.src, e.name) for e in shape.private_imports(edges)] == [("lenpred.cli", "_private")]
    assert layer_violations(edges) == [
        "lenpred.errors:2 -> lenpred.cli (layer 0 imports layer 6)",
        "lenpred.pipeline:1 -> lenpred (the root package is a facade; import the module itself)",
    ]


def test_layer_of_takes_the_longest_prefix():
    assert layer_of("lenpred.online.refit") == 2
    assert layer_of("lenpred.serving.proxy.app") == 4
    assert layer_of("lenpred.studies.diagnose.run") == 5
    assert layer_of("lenpred.nosuch") is None


def test_checker_passes_a_clean_package(tmp_path):
    pkg = _write(tmp_path, {
        "lenpred/__init__.py": "def __getattr__(name):\n    from lenpred import pipeline\n",
        "lenpred/errors.py": "",
        "lenpred/pipeline.py": "from lenpred.errors import X\n",
        "lenpred/cli.py": "def main():\n    from lenpred import pipeline\n",
    })
    edges = shape.import_edges(shape.package_modules(pkg))
    assert shape.cycles(edges) == []
    assert layer_violations(edges) == []
    assert sum(e.in_function for e in edges) == 2


def test_the_cli_starts_without_torch():
    """`lenpred --help` stays fast: the CLI and every config it reads at start-up import no torch, transformers or
    scipy (those load inside the commands)."""
    import subprocess
    import sys

    code = ("import sys, lenpred.cli; heavy = [m for m in ('torch', 'transformers', 'scipy') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_scripts_are_thin_argument_parsers_that_import_no_other_script():
    """Results come from studies under src: a script is at most 150 lines and imports no other script."""
    import ast

    scripts = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))
    names = {p.stem for p in scripts}
    long = [p.name for p in scripts if len(p.read_text().splitlines()) > 150]
    imports = {}
    for p in scripts:
        tree = ast.parse(p.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        if mods & names:
            imports[p.name] = sorted(mods & names)
    assert scripts and long == [] and imports == {}
