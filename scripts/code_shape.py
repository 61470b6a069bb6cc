import ast, sys, pathlib, itertools
root = pathlib.Path("src/lenpred")
mods = {}
for p in sorted(root.rglob("*.py")):
    rel = p.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__": parts = parts[:-1]
    mods[".".join(parts)] = p
def resolve(modname, node, is_pkg):
    if node.level:
        base = modname.split(".")
        if not is_pkg: base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module
edges = {}  # (a,b) -> list of (line, toplevel, names)
fn_imports = 0
private = []
longest = []
for m, p in mods.items():
    tree = ast.parse(p.read_text())
    is_pkg = p.name == "__init__.py"
    top = set(id(n) for n in tree.body)
    # find nodes inside functions
    infunc = set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            longest.append((f.end_lineno - f.lineno + 1, m, f.name))
            for n in ast.walk(f):
                if n is not f: infunc.add(id(n))
    for n in ast.walk(tree):
        targets = []
        if isinstance(n, ast.Import):
            targets = [(a.name, None) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = resolve(m, n, is_pkg)
            for a in n.names:
                cand = f"{base}.{a.name}"
                if cand in mods: targets.append((cand, None))
                else: targets.append((base, a.name))
        for t, name in targets:
            if not t or not t.startswith("lenpred"): continue
            while t not in mods and "." in t: t = t.rsplit(".", 1)[0]
            if t == m: continue
            if id(n) in infunc: fn_imports += 1
            edges.setdefault((m, t), []).append((n.lineno, id(n) not in infunc))
            if name and name.startswith("_") and not name.startswith("__"):
                private.append((m, t, name))
# implicit: importing a.b.c imports package a.b
graph = {}
for (a, b) in edges: graph.setdefault(a, set()).add(b)
# SCCs
import sys
sys.setrecursionlimit(10000)
idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in graph.get(v, ()):
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(comp)
for v in mods:
    if v not in idx: sc(v)
print("modules", len(mods), "lines", sum(len(p.read_text().splitlines()) for p in mods.values()))
print("function-level imports of own modules:", fn_imports)
print("largest file:", max((len(p.read_text().splitlines()), m) for m, p in mods.items()))
longest.sort(reverse=True)
print("longest functions:", longest[:8])
print("private cross-module imports:", private)
print("cycles (SCCs):", len(sccs))
for s in sccs: print("  ", sorted(s))
