"""The option builder of the CLI (:mod:`lenpred.cli_options`): types, defaults and comma lists from a config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

from lenpred.cli_options import Opt, Options, cli_type, ints, names, with_options
from lenpred.errors import LenpredError


@dataclass
class _Config:
    seeds: tuple[int, ...] = (0, 1)
    methods: tuple[str, ...] = ("a", "b")
    layers: tuple[int, ...] | None = None
    out: str = "results/x"
    rate: float | None = None
    needed: int = 0


def test_cli_type_of_field_types():
    assert cli_type(tuple[int, ...]) == (str, int)
    assert cli_type(tuple[str, ...] | None) == (Optional[str], str)
    assert cli_type(int | None) == (Optional[int], None)
    assert cli_type(float, optional=True) == (Optional[float], None)
    from pathlib import Path

    assert cli_type(str | Path | None) == (Optional[str], None)
    with pytest.raises(TypeError, match="no command-line form"):
        cli_type(dict)


def test_comma_lists():
    assert ints("--seeds", "0,1,2") == (0, 1, 2) and ints("--seeds", None) is None
    assert names(" a, b,,c ") == ("a", "b", "c")
    with pytest.raises(LenpredError, match="--seeds takes comma-separated integers"):
        ints("--seeds", "0,x")


def _run(options: Options, *args: str) -> dict:
    app, seen = typer.Typer(), {}

    @app.command()
    @with_options(options)
    def main(**values):
        seen.update(values)

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return seen


def test_options_take_the_fields_defaults_and_parse_them():
    options = Options(_Config, {"seeds": "Seeds.", "methods": "Methods.", "layers": "Layers.", "out": "Out.",
                                "rate": Opt("Rate.", flag="--rate-per-s")})
    assert _run(options) == {"seeds": (0, 1), "methods": ("a", "b"), "layers": None, "out": "results/x",
                             "rate": None}
    assert _run(options, "--seeds", "3", "--layers", "1,-1", "--rate-per-s", "2.5") == {
        "seeds": (3,), "methods": ("a", "b"), "layers": (1, -1), "out": "results/x", "rate": 2.5}


def test_variant_overrides_drops_and_redeclares():
    options = Options(_Config, {"seeds": "Seeds.", "out": "Out.", "needed": "Needed."})
    demo = options.variant({"out": "results/demo"}, drop=("needed",),
                           seeds=Opt("Seed.", flag="--seed", default=7, type=int, convert=lambda s: (s,)))
    assert _run(demo) == {"seeds": (7,), "out": "results/demo"}
    with pytest.raises(KeyError, match="no options"):
        options.variant(nosuch="x")


def test_an_option_with_no_field_is_refused_at_declaration():
    with pytest.raises(KeyError, match="option --nosuch"):
        Options(_Config, {"nosuch": "Help."})
    assert _run(Options(_Config, {"extra": Opt("Extra.", default="", type=tuple[str, ...])})) == {"extra": ()}


def test_a_script_ends_as_the_commands_do(capsys):
    """``run_script``: a LenpredError is one line on stderr and status 2; otherwise main's own status (None: 0)."""
    from lenpred.errors import LenpredError, run_script

    def bad():
        raise LenpredError("--out is a file: pass a directory")

    for main, status in ((bad, 2), (lambda: 3, 3), (lambda: None, 0)):
        with pytest.raises(SystemExit) as stop:
            run_script(main)
        assert stop.value.code == status
    assert capsys.readouterr().err == "error: --out is a file: pass a directory\n"
    with pytest.raises(KeyError):  # anything else is a bug: its traceback is kept
        run_script(lambda: {}["missing"])
