"""The shape of the source tree: the longest functions, the import cycles between modules, and any
import against the order of the package's layers.

    python benchmarks/code_shape.py [--top 10] [--json]

The layers of ``src/vitkit``, from the bottom up (``LAYERS``): a module may import from its own layer and
those below it, never from one above. ``vitkit/__init__`` loads its public names lazily by their
module's name (a string), so it has no edges; ``__main__`` is the command line's.

Function length counts the lines from ``def`` to the function's last line (nested functions are part
of their parent, and are listed on their own as well). An import cycle is a loop in the graph of
module -> module imports, counting imports anywhere in a module (inside functions too), so a
function-level import that points back up is a cycle. Package ``__init__`` re-exports are edges too,
except the edge from a module to its own package's ``__init__`` (importing ``..x`` from ``pkg.mod``
runs ``pkg/__init__`` first, but that is Python's import order, not a dependency a reader follows).
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# the layers of src/vitkit from the bottom up; a module's layer is its first package under vitkit
LAYERS = ["core", "model", "io", "data", "infer", "train", "tools", "api", "cli", "__main__"]


def layer(mod: str) -> int | None:
    """The index in LAYERS of module ``mod`` (dotted), None for the package's own ``__init__``."""
    parts = mod.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def against_layers(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports (module, imported) from a lower layer to a higher one."""
    bad = []
    for a, targets in graph.items():
        for b in targets:
            la, lb = layer(a), layer(b)
            if la is not None and lb is not None and lb > la:
                bad.append((a, b))
    return sorted(bad)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names]


def scan(top: int):
    files = sorted(SRC.rglob("*.py"))
    mods = {module_name(f): f for f in files}
    funcs, graph = [], {m: set() for m in mods}
    for mod, f in mods.items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((node.end_lineno - node.lineno + 1, f"{f.relative_to(SRC.parent)}:{node.lineno} {node.name}"))
            targets = []
            if isinstance(node, ast.ImportFrom):
                targets = resolve(mod, is_pkg, node)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in mods and t != mod and not (mod.startswith(t + ".") and t.count(".") == mod.count(".") - 1):
                    graph[mod].add(t)
    funcs.sort(reverse=True)
    # cycles: strongly connected components with more than one module
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
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
                comps.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    pairs = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    return funcs[:top], comps, pairs, against_layers(graph), [m for m in mods if layer(m) is None and m != "vitkit"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    funcs, comps, pairs, upward, unlayered = scan(a.top)
    if a.json:
        print(json.dumps({"longest": funcs, "cycles": comps, "mutual": pairs, "against_layers": upward,
                          "unlayered": unlayered}))
        return
    print("longest functions (lines):")
    for n, where in funcs:
        print(f"  {n:4d}  {where}")
    print(f"import cycles: {len(comps)}")
    for c in comps:
        print("  " + " <-> ".join(c))
    print(f"modules that import each other: {len(pairs)}")
    for a_, b in pairs:
        print(f"  {a_} <-> {b}")
    print(f"imports against the layer order ({' < '.join(LAYERS)}): {len(upward)}")
    for a_, b in upward:
        print(f"  {a_} -> {b}")
    print(f"top-level modules outside the layers: {len(unlayered)}")
    for m in unlayered:
        print(f"  {m}")


if __name__ == "__main__":
    main()
