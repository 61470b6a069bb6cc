"""The package's import graph (cycles, function-level imports, private cross-module imports), largest file and
longest functions, read from the source with :mod:`ast` (nothing is imported).

``tests/test_imports.py`` enforces the layer rule on it; ``python scripts/code_shape.py [src/lenpred]`` prints the
same graph's summary, so the script and the test read one graph.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImportEdge:
    """One imported name (or module) of the package inside one of its modules.

    Attributes:
        src: importing module (dotted, e.g. ``lenpred.pipeline``; a package's ``__init__`` is the package's name).
        dst: imported module (the longest dotted prefix of the target that is a module of the package).
        line: 1-based line of the import statement in ``src``'s file.
        in_function: the statement sits inside a function (a deferred, function-level import).
        name: the name taken from ``dst`` by ``from dst import name``, or ``None`` when the import names a module.
    """

    src: str
    dst: str
    line: int
    in_function: bool
    name: str | None


def package_modules(root: str | Path) -> dict[str, Path]:
    """Every module of the package at ``root`` (a directory with ``__init__.py``): ``{dotted name: file}``, the
    dotted names starting with ``root``'s directory name; a package's ``__init__.py`` is named after the package."""
    root = Path(root)
    mods = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _resolve(modname: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    """Absolute module named by a (possibly relative) ``from ... import`` inside ``modname``."""
    if not node.level:
        return node.module or ""
    base = modname.split(".")
    if not is_pkg:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(mods: dict[str, Path]) -> list[ImportEdge]:
    """Every import of a package module inside the package's modules (module-level and function-level, ``import x``
    and ``from x import y``, relative or absolute), one :class:`ImportEdge` per imported name; a module importing
    itself is left out. ``mods`` is :func:`package_modules`' result."""
    package = next(iter(mods)).split(".")[0] if mods else ""
    edges = []
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        is_pkg = p.name == "__init__.py"
        infunc = set()
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                infunc.update(id(n) for n in ast.walk(f) if n is not f)
        for n in ast.walk(tree):
            targets: list[tuple[str, str | None]] = []
            if isinstance(n, ast.Import):
                targets = [(a.name, None) for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = _resolve(m, n, is_pkg)
                for a in n.names:
                    cand = f"{base}.{a.name}"
                    targets.append((cand, None) if cand in mods else (base, a.name))
            for t, name in targets:
                if not (t == package or t.startswith(package + ".")):
                    continue
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t != m:
                    edges.append(ImportEdge(m, t, n.lineno, id(n) in infunc, name))
    return edges


def cycles(edges: list[ImportEdge]) -> list[list[str]]:
    """The import graph's cycles: its strongly connected components with more than one module (Tarjan), each
    sorted, the list sorted too; a list of lists of dotted names."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.src, set()).add(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(set(graph) | {e.dst for e in edges}):
        if v not in index:
            visit(v)
    return sorted(found)


def private_imports(edges: list[ImportEdge]) -> list[ImportEdge]:
    """Edges that take a private name (``_x``, not a dunder) from another module."""
    return [e for e in edges if e.name and e.name.startswith("_") and not e.name.startswith("__")]


def longest_functions(mods: dict[str, Path], k: int = 8) -> list[tuple[int, str, str]]:
    """The ``k`` longest functions: ``(lines, module, name)``, longest first."""
    found = []
    for m, p in mods.items():
        for f in ast.walk(ast.parse(p.read_text())):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f.end_lineno - f.lineno + 1, m, f.name))
    return sorted(found, reverse=True)[:k]
