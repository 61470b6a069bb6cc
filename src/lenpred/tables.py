"""The one Markdown table writer every report uses (evaluate, scheduling, diagnose, progressive, traffic, cards)."""

from __future__ import annotations

import re
from typing import Iterable, Sequence

_RULES = {"l": "---", "r": "---:", "c": ":---:"}
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def markdown_cell(value) -> str:
    """``str(value)`` with every ``|`` not already escaped written as ``\\|`` (so a cell never splits a row)."""
    return _UNESCAPED_PIPE.sub(r"\\|", str(value))


def markdown_table(header: Sequence, rows: Iterable[Sequence], align: str | None = None) -> str:
    """A GitHub-flavoured Markdown table: ``| a | b |`` rows under a ``|---|---:|`` rule line.

    Args:
        header: the column titles (any objects; written with ``str``).
        rows: one sequence of cells per row, each as long as ``header``; cells are written with
            :func:`markdown_cell` (``str``, unescaped pipes escaped).
        align: one letter per column: ``l`` = ``---`` (Markdown's default, left), ``r`` = ``---:`` (right),
            ``c`` = ``:---:`` (centred); ``None`` = every column ``l``.

    Returns:
        The table's lines joined by ``\\n``, without a trailing newline.

    Raises:
        ValueError: ``align`` is not one letter of ``l``/``r``/``c`` per column, or a row's length differs from the
            header's.
    """
    align = "l" * len(header) if align is None else align
    if len(align) != len(header) or set(align) - set(_RULES):
        raise ValueError(f"align={align!r}: need one of 'l', 'r', 'c' per column ({len(header)} columns)")
    lines = ["| " + " | ".join(markdown_cell(h) for h in header) + " |", "|" + "".join(_RULES[a] + "|" for a in align)]
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"row {i} has {len(row)} cells for {len(header)} columns: {list(row)!r}")
        lines.append("| " + " | ".join(markdown_cell(c) for c in row) + " |")
    return "\n".join(lines)
