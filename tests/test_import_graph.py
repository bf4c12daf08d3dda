"""The house's floors: no package imports one on a higher floor, and no package circles.

The floors are the ones ``docs/architecture.md`` draws; every ``import`` counts, also the lazy ones
inside functions and those under ``TYPE_CHECKING`` (an upward arrow is an upward arrow). A new
package must be given a floor here and in the document.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import trajforge

SRC = Path(trajforge.__file__).parent

# Ground first. A package may import its own floor and those below, never above.
FLOORS: list[set[str]] = [
    {"messages", "extras", "benchpython", "spawn", "cleanup", "trajectory", "sandbox", "report", "record"},
    {"llm"},
    {"protocols", "tools", "tasks", "serve", "distributions", "testing"},
    {"agent", "export"},
    {"endpoint", "raycluster", "rollout"},
    {"engine"},
    {"envs"},
    {"batch"},
    {"models"},
    {"rl"},
    {"experiments"},
    {"cli"},
]
FLOOR = {pkg: i for i, floor in enumerate(FLOORS) for pkg in floor}


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "trajforge":
        return None
    return parts[1] if len(parts) > 1 else "trajforge"


def _edges() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the modules that import it."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(rel.parts)
        src_pkg = _package(module)
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
                if node.module == "trajforge":  # ``from trajforge import llm`` (not ``__version__``)
                    targets = [f"trajforge.{a.name}" for a in node.names if a.name in FLOOR]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                dst_pkg = _package(target)
                if dst_pkg and src_pkg and dst_pkg != src_pkg and dst_pkg != "trajforge":
                    edges[src_pkg][dst_pkg].append(module)
    return edges


def test_every_package_has_a_floor():
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    packages |= {p.stem for p in SRC.glob("*.py") if not p.stem.startswith("__")}
    missing = sorted(packages - set(FLOOR))
    assert missing == [], (
        f"give these a floor in tests/test_import_graph.py and docs/architecture.md: {missing}"
    )


def test_no_upward_imports():
    upward = [
        f"{src} (floor {FLOOR[src]}) -> {dst} (floor {FLOOR[dst]}) in {sorted(set(mods))}"
        for src, dsts in _edges().items()
        for dst, mods in dsts.items()
        if FLOOR[dst] > FLOOR[src]
    ]
    assert upward == [], "\n".join(upward)


def test_no_circles_between_packages():
    edges = {src: set(dsts) for src, dsts in _edges().items()}
    circles = []
    for start in edges:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in path:
                    stack.append((nxt, [*path, nxt]))
    assert circles == [], "\n".join(sorted(set(circles)))


def test_no_circles_between_modules():
    """Within packages too: module A imports B imports ... A (the old tools registry circle).
    Every import counts, the function-local ones too: a lazy import that closes a circle is a
    circle that merely does not crash at import time (tools.registry <-> tools.builtin and
    testing.scripted_server <-> testing.server_cli were two)."""
    graph: dict[str, set[str]] = defaultdict(set)
    modules = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(p for p in rel.parts if p != "__init__")
        modules.add(module)
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(p for p in rel.parts if p != "__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                graph[module].update(n for n in names if n in modules and n != module)
            elif isinstance(node, ast.Import):
                graph[module].update(a.name for a in node.names if a.name in modules)
    # package __init__ re-exports are not cycles of their own: drop edges into a package's own parent
    for module in list(graph):
        graph[module] = {d for d in graph[module] if not module.startswith(d + ".")}
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == [], "\n".join(cycles)


def _top_level_names(path: Path) -> set[str] | None:
    """The names a module defines at its top level (None: it star-imports, so anything may be)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return None
                names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING blocks, optional imports
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.update(a.asname or a.name.split(".")[0] for a in sub.names)
                elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Assign):
                    names.update(t.id for t in sub.targets if isinstance(t, ast.Name))
    return names


def test_every_import_of_ours_names_something_that_exists():
    """``from trajforge.x import y`` (function-local ones included) names a module and a name that
    exist. mypy checks all of src but not tests or benchmarks, and a lazy import fails only when its command runs: a module moved on one branch and imported
    by its old name on another is caught here, statically, for src, tests and benchmarks."""
    files = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        files[".".join(p for p in rel.parts if p != "__init__")] = path
    root = SRC.parent.parent
    wrong: list[str] = []
    for where in ("src", "tests", "benchmarks"):
        for path in sorted((root / where).rglob("*.py")):
            if "_tasks" in path.parts[-4:-1] or "fixtures" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                    continue
                if node.module.split(".")[0] != "trajforge":
                    continue
                if node.module not in files:
                    wrong.append(f"{path.relative_to(root)}:{node.lineno}: no module {node.module}")
                    continue
                defined = _top_level_names(files[node.module])
                for a in node.names:
                    if (
                        defined is not None
                        and a.name not in defined
                        and f"{node.module}.{a.name}" not in files
                    ):
                        wrong.append(f"{path.relative_to(root)}:{node.lineno}: {node.module} has no {a.name}")
    assert wrong == [], "\n".join(wrong)
