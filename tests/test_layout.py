"""The package layout: no import circle between judgetrain's modules, and nothing outside judgetrain.cli imports it.

Imports are read from the source (module level and inside functions alike), so a circle hidden behind a lazy import
counts too: a lazy import only moves the failure from import time to the first call.
"""

from __future__ import annotations

import ast
from pathlib import Path

import judgetrain

PACKAGE = Path(judgetrain.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The judgetrain module an import names (``judgetrain.a.b.func`` -> ``judgetrain.a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                if t.startswith("judgetrain"):
                    dep = _resolve(t, modules)
                    # a package's __init__ importing its own submodules is not a circle with them
                    if dep and dep != mod and not (dep.startswith(mod + ".") and path.name == "__init__.py"):
                        graph[mod].add(dep)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            # importing a submodule imports its package's __init__ first: an edge to the package is not a circle
            if node.startswith(dep + "."):
                continue
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_circle():
    cycle = _cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_nothing_imports_the_cli_package():
    graph = import_graph()
    users = sorted(m for m, deps in graph.items() if not m.startswith("judgetrain.cli")
                   and any(d == "judgetrain.cli" or d.startswith("judgetrain.cli.") for d in deps))
    assert users == [], f"modules outside judgetrain.cli import it: {users}"


def test_every_command_lives_in_the_cli_package():
    """A `main()` is a command's entry: only judgetrain.cli holds them (train.py's process_main is the one
    per-process entry that `accelerate launch -m judgetrain.train` runs)."""
    mains = []
    for mod, path in _modules().items():
        if mod.startswith("judgetrain.cli"):
            continue
        tree = ast.parse(path.read_text())
        mains += [f"{mod}.{n.name}" for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert mains == [], f"command entry points outside judgetrain.cli: {mains}"


def test_the_stage_folders_exist():
    stages = ("config", "data", "models", "trainer", "eval", "run", "report", "compat", "utils", "bench", "cli")
    missing = [s for s in stages if not (PACKAGE / s / "__init__.py").is_file()]
    assert missing == []
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "metrics.py", "train.py"], top
