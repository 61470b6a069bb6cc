"""How a lenpred command is declared: its options built from a config's fields (each option declared once, by its
help text; default and type are the field's, comma lists parsed by the field's type), its errors as one line, its
log records on stderr.

``Options(EvalConfig, {"epochs": "Head training epochs."})`` gives a command ``--epochs <int>`` with
``EvalConfig.epochs``'s default; :func:`with_options` hands the command the parsed values as keywords, ready for
``EvalConfig(**options)``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import typer

from lenpred.errors import LenpredError


class _StderrHandler(logging.StreamHandler):
    """Log records as plain lines on whatever ``sys.stderr`` is at the time (a test runner swaps it)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def log_to_stderr() -> None:
    """Show the package's progress (INFO) and warnings on stderr: the library logs, the CLI shows (idempotent)."""
    log = logging.getLogger("lenpred")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        log.addHandler(_StderrHandler())
    log.setLevel(logging.INFO)


def one_line_errors(fn):
    """Turn :class:`LenpredError` into ``error: <message>`` on stderr and exit status 2 (and show the package's log
    records on stderr while the command runs: :func:`log_to_stderr`)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        log_to_stderr()
        try:
            return fn(*args, **kwargs)
        except LenpredError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    return wrapper


DATA_DIR_HELP = "Prompt data sets \\[default: $LENPRED_DATA_DIR or ../shared/datasets]."
"""Help text of --data-dir (several command modules)."""


def off_if_empty(value):
    """An :class:`Opt` ``convert``: 0 or '' -> ``None``, the option's documented "off"."""
    return value or None


class _FromField:
    def __repr__(self) -> str:
        return "FROM_FIELD"


FROM_FIELD: Any = _FromField()
"""An :class:`Opt`'s ``default`` / ``type`` when they are the config field's."""


def ints(option: str, text: Optional[str]) -> Optional[tuple[int, ...]]:
    """``"0,1,2"`` -> ``(0, 1, 2)`` (``None`` stays ``None``).

    Raises:
        LenpredError: a piece is not an integer (the message names ``option``).
    """
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise LenpredError(f"{option} takes comma-separated integers (e.g. 1,2,4), got '{text}'") from None


def names(text: Optional[str]) -> Optional[tuple[str, ...]]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``: blanks dropped (``None`` stays ``None``)."""
    if text is None:
        return None
    return tuple(m.strip() for m in text.split(",") if m.strip())


@dataclass(frozen=True)
class Opt:
    """One command-line option: its help text, and what differs from ``--<field-name>`` of the command's config.

    Attributes:
        help: the help text (Rich markup: write a literal ``[`` as ``\\[``).
        flag: the declaration when it is not ``--<name>``: ``"--rate"``, ``"--truncated/--full-prefill"``.
        source: the config dataclass, function or class (its signature) holding the field, if not the command's.
        default: an option with no config field: its default (``...``: required); then ``type`` is needed too.
        type: the option's type when it is not the field's (or the source does not annotate it).
        convert: applied to the parsed value (after a comma-list type's parsing), e.g. ``0 -> None``.
    """

    help: str
    flag: Optional[str] = None
    source: Any = None
    default: Any = FROM_FIELD
    type: Any = FROM_FIELD
    convert: Optional[Callable[[Any], Any]] = None


def field_of(source: Any, name: str) -> tuple[Any, Any]:
    """``(default, type)`` of field ``name`` of a config dataclass (a ``default_factory()`` value), or of parameter
    ``name`` of a function's or class's signature; no default: ``...`` (a required option); string annotations are
    evaluated in the source's module.

    Raises:
        KeyError: ``source`` has no field or parameter ``name``.
    """
    if dataclasses.is_dataclass(source):
        field = {f.name: f for f in dataclasses.fields(source)}[name]
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = ...
        annotation = field.type
    else:
        parameter = inspect.signature(source).parameters[name]
        default, annotation = parameter.default, parameter.annotation
        default = ... if default is inspect.Parameter.empty else default
    if isinstance(annotation, str):
        annotation = eval(annotation, vars(sys.modules[source.__module__]))  # what typing.get_type_hints does
    return default, None if annotation is inspect.Parameter.empty else annotation


def cli_type(annotation: Any, optional: bool = False) -> tuple[Any, Optional[type]]:
    """The typer annotation of a field's type, and the item type of a comma list: ``tuple[int, ...]`` is ``(str,
    int)``, ``str | None`` is ``(Optional[str], None)``, a union holding ``str`` (``str | Path``) is ``str``, and
    ``list[str]`` (a repeatable option) stays itself. ``optional``: the default is ``None``.

    Raises:
        TypeError: a type with no command-line form (a programming error: give the :class:`Opt` a ``type``).
    """
    union = typing.get_origin(annotation) in (Union, types.UnionType)
    args = typing.get_args(annotation) if union else (annotation,)
    optional = optional or type(None) in args
    args = tuple(a for a in args if a is not type(None))
    base, item = (str if str in args else args[0] if len(args) == 1 else None), None
    origin, base_args = typing.get_origin(base), typing.get_args(base)
    if origin is tuple and len(base_args) == 2 and base_args[1] is Ellipsis and base_args[0] in (int, str):
        base, item = str, base_args[0]
    elif not (base in (str, int, float, bool) or (origin is list and base_args == (str,))):
        raise TypeError(f"no command-line form for {annotation!r}: give the option's Opt a type")
    return (Optional[base] if optional else base), item


def unset(help: str, type: Any = FROM_FIELD, **kwargs) -> Opt:
    """An option whose default is ``None`` ("not given": the command or the library picks the value)."""
    return Opt(help, default=None, type=type, **kwargs)


class Options:
    """The options of one command, in ``--help`` order: ``{name: help text or Opt}``. Each option's default and
    type are those of the field ``name`` of ``source`` (or of its :class:`Opt`'s ``source``); ``overrides[name]``
    replaces a field's default (``lenpred demo``'s ``DEMO_DEFAULTS``). Tuple defaults show as comma lists
    (``a, b``: --help wraps them).

    Raises:
        KeyError, TypeError: at import, an option with no field (and no ``default`` / ``type`` of its own) or a
            type with no command-line form.
    """

    def __init__(self, source: Any, specs: dict[str, str | Opt], overrides: Optional[dict] = None):
        self.source, self.overrides = source, dict(overrides or {})
        self.specs = {name: s if isinstance(s, Opt) else Opt(s) for name, s in specs.items()}
        self.parameters, self._parsers = [], {}
        for name, opt in self.specs.items():
            self._add(name, opt)

    def _add(self, name: str, opt: Opt) -> None:
        default, annotation = opt.default, opt.type
        if default is FROM_FIELD or annotation is FROM_FIELD:
            try:
                field_default, field_type = field_of(opt.source or self.source, name)
            except KeyError as exc:
                raise KeyError(f"option --{name}: {exc}; give its Opt a default and a type") from None
            default = self.overrides.get(name, field_default) if default is FROM_FIELD else default
            annotation = field_type if annotation is FROM_FIELD else annotation
        annotation, item = cli_type(annotation, optional=default is None)
        shown = ", ".join(str(v) for v in default) if isinstance(default, tuple) else default  # spaces: --help wraps
        flag = opt.flag or "--" + name.replace("_", "-")
        option = typer.Option(shown, *((opt.flag,) if opt.flag else ()), help=opt.help)
        self.parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                                 annotation=annotation))
        self._parsers[name] = (item, flag, opt.convert)

    def parse(self, values: dict) -> dict:
        """The command's values as its configs take them: comma lists parsed, each :class:`Opt`'s ``convert``.

        Raises:
            LenpredError: a comma list of integers that does not parse (naming the option).
        """
        parsed = {}
        for name, value in values.items():
            item, flag, convert = self._parsers[name]
            value = ints(flag, value) if item is int else names(value) if item is str else value
            parsed[name] = convert(value) if convert else value
        return parsed

    def take(self, values: dict, source: Any) -> dict:
        """Remove from ``values`` (parsed) the options whose :class:`Opt` names ``source``, and return them."""
        return {name: values.pop(name) for name, opt in self.specs.items() if opt.source is source and name in values}

    def variant(self, overrides: Optional[dict] = None, drop: tuple[str, ...] = (), **changes: str | Opt) -> Options:
        """These options with other defaults (``overrides``), some left out (``drop``) and some redeclared in place
        (``changes``: name -> help text or Opt)."""
        unknown = (set(changes) | set(drop)) - set(self.specs)
        if unknown:
            raise KeyError(f"no options {sorted(unknown)} to change; the options are {list(self.specs)}")
        specs = {name: changes.get(name, spec) for name, spec in self.specs.items() if name not in drop}
        return Options(self.source, specs, {**self.overrides, **(overrides or {})})


def with_options(options: Options):
    """Decorate a command body: typer sees ``options``' parameters, and the body is called with their parsed values
    (:meth:`Options.parse`) as keywords."""
    def decorate(fn):
        @functools.wraps(fn)
        def command(**values):
            return fn(**options.parse(values))

        del command.__wrapped__  # typer reads the signature below, not the body's
        command.__signature__ = inspect.Signature(options.parameters)
        command.__annotations__ = {p.name: p.annotation for p in options.parameters}
        return command
    return decorate
