"""Print the package's shape: module and line counts, function-level imports, the largest file, the longest
functions, private cross-module imports and import cycles.

Usage: python scripts/code_shape.py [src/lenpred]

The graph is ``tests/import_graph.py``'s, the one ``tests/test_imports.py`` enforces the layer rule on.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from import_graph import cycles, import_edges, longest_functions, package_modules, private_imports  # noqa: E402


def main(root: str = "src/lenpred") -> None:
    mods = package_modules(root)
    edges = import_edges(mods)
    sccs = cycles(edges)
    print("modules", len(mods), "lines", sum(len(p.read_text().splitlines()) for p in mods.values()))
    print("function-level imports of own modules:", sum(e.in_function for e in edges))
    print("largest file:", max((len(p.read_text().splitlines()), m) for m, p in mods.items()))
    print("longest functions:", longest_functions(mods))
    print("private cross-module imports:", [(e.src, e.dst, e.name) for e in private_imports(edges)])
    print("cycles (SCCs):", len(sccs))
    for s in sccs:
        print("  ", s)


if __name__ == "__main__":
    main(*sys.argv[1:])
