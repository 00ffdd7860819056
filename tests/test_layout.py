"""The package layout: the layers of judgetrain's docstring (each folder imports only the ones below it), no import
circle between judgetrain's modules, and nothing outside judgetrain.cli imports it.

Imports are read from the source (module level and inside functions alike), so a circle hidden behind a lazy import
counts too: a lazy import only moves the failure from import time to the first call.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

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


def layers() -> list[str]:
    """The layer order the package docstring writes, bottom first: the indented lines ``name  what it holds``."""
    text = judgetrain.__doc__
    return [m.group(1) for m in re.finditer(r"^    ([a-z_]+(?:\.py)?)  +\S", text, re.M)]


def layer_of(module: str) -> str:
    """``judgetrain.eval.scoring`` -> ``eval``; ``judgetrain.train`` -> ``train.py``; the package root -> ``""``."""
    parts = module.split(".")
    if len(parts) == 1:
        return ""
    return parts[1] if len(parts) > 2 or (PACKAGE / parts[1]).is_dir() else parts[1] + ".py"


def layer_violations(graph: dict[str, set[str]], order: list[str]) -> list[str]:
    """Every import from a layer to one above it (or to a layer the order does not place), named module to module."""
    rank = {name: i for i, name in enumerate(order)}
    rank[""] = -1  # the package root (its version) is below everything
    problems = []
    for mod in sorted(graph):
        here = layer_of(mod)
        if here not in rank:
            problems.append(f"{mod}: its layer {here!r} is not in the package docstring's order")
            continue
        for dep in sorted(graph[mod]):
            there = layer_of(dep)
            if rank.get(there, len(order)) > rank[here]:
                problems.append(f"{mod} ({here}) imports {dep} ({there}), a layer above it")
    return problems


def test_the_package_docstring_orders_every_folder_and_top_level_module():
    order = layers()
    present = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    present |= {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert sorted(order) == sorted(present), order
    assert order[:3] == ["compat", "utils", "config"] and order[-2:] == ["bench", "cli"]
    assert order.index("checks") > max(order.index(s) for s in ("config", "data", "models", "trainer", "eval"))


def test_each_layer_imports_only_the_layers_below_it():
    problems = layer_violations(import_graph(), layers())
    assert problems == [], "\n".join(problems)


def test_the_layer_check_catches_an_import_from_below_to_above():
    graph = {"judgetrain.data.io": {"judgetrain.utils.files", "judgetrain.eval.metrics"},
             "judgetrain.utils.files": {"judgetrain"}, "judgetrain.eval.metrics": set(), "judgetrain": set()}
    assert layer_violations(graph, ["utils", "data", "eval"]) == [
        "judgetrain.data.io (data) imports judgetrain.eval.metrics (eval), a layer above it"]
    assert layer_violations(graph, ["utils", "eval", "data"]) == []
    graph["judgetrain.newstage.x"] = {"judgetrain.utils.files"}
    assert layer_violations(graph, ["utils", "eval", "data"]) == [
        "judgetrain.newstage.x: its layer 'newstage' is not in the package docstring's order"]


@pytest.mark.parametrize("module, layer", [("judgetrain", ""), ("judgetrain.train", "train.py"),
                                           ("judgetrain.checks.dry_run", "checks"), ("judgetrain.utils", "utils")])
def test_a_modules_layer_is_its_folder_or_its_file(module, layer):
    assert layer_of(module) == layer


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
    stages = ("config", "data", "models", "trainer", "eval", "run", "report", "compat", "utils", "checks", "bench", "cli")
    missing = [s for s in stages if not (PACKAGE / s / "__init__.py").is_file()]
    assert missing == []
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "metrics.py", "train.py"], top


def test_no_function_is_longer_than_100_lines():
    """A longer function is split into named parts (the bench's table and device shape were)."""
    long = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 100:
                long.append(f"{mod}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == []


def classes_in_functions(source: str) -> list[str]:
    """``function.Class`` for every class defined inside a function body."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [f"{node.name}.{sub.name}" for sub in ast.walk(node) if isinstance(sub, ast.ClassDef)]
    return found


def test_no_class_is_defined_inside_a_function():
    """A class is defined once, at module level, where go-to-definition and isinstance find it."""
    found = [f"{mod}: {name}" for mod, path in sorted(_modules().items()) for name in classes_in_functions(path.read_text())]
    assert found == []
    assert classes_in_functions("def f():\n    class A:\n        pass\n") == ["f.A"]


def late_imports(source: str, module: str) -> list[str]:
    """The packages a module imports inside its functions (``torch``, ``judgetrain.eval``), in order of appearance."""
    package = module if module.count(".") == 0 else module.rpartition(".")[0]
    found: dict[str, None] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import):
                name = sub.names[0].name
            elif isinstance(sub, ast.ImportFrom):
                name = sub.module or ""
                if sub.level:
                    anchor = package.split(".")[: len(package.split(".")) - sub.level + 1]
                    name = ".".join(anchor + ([name] if name else []))
            else:
                continue
            found[".".join(name.split(".")[:2]) if name.startswith("judgetrain") else name.split(".")[0]] = None
    return list(found)


def undeclared_late_imports(source: str, module: str) -> list[str]:
    """The late-imported packages the module's ``# Late imports:`` comment (which says why) does not name."""
    comment = re.search(r"^# Late imports:(.*(?:\n# .*)*)", source, re.M)
    declared = set(re.findall(r"[A-Za-z_][\w.]*", comment.group(1).split("(inside", 1)[0])) if comment else set()
    return [name for name in late_imports(source, module) if name not in declared]


def test_every_late_import_is_declared_at_the_top_of_its_module():
    """Imports go at the top of a module; one inside a function is deliberate (a light command's start, an optional
    or private library) and the module's ``# Late imports:`` comment names it and says why."""
    problems = []
    for mod, path in sorted(_modules().items()):
        missing = undeclared_late_imports(path.read_text(), mod)
        if missing:
            problems.append(f"{mod}: {', '.join(missing)} imported inside a function, not named in its "
                            "'# Late imports:' comment")
    assert problems == [], "\n".join(problems)
    bad = '"""Doc."""\n\nimport os\n\n\ndef f():\n    import torch\n'
    assert undeclared_late_imports(bad, "judgetrain.x") == ["torch"]
    good = '"""Doc."""\n\n# Late imports: torch (inside f): a reason.\n\nimport os\n\n\ndef f():\n    import torch\n'
    assert undeclared_late_imports(good, "judgetrain.x") == []


def test_every_module_is_mapped_to_its_tests():
    """tests/README.md names, for every module of the package, the test files that test it; each file exists."""
    tests = Path(__file__).resolve().parent
    rows = dict(re.findall(r"^\| `(judgetrain[\w.]*)` \| ([^|]+) \|$", (tests / "README.md").read_text(), re.M))
    unmapped = sorted(set(_modules()) - set(rows))
    assert unmapped == [], f"modules with no row in tests/README.md: {unmapped}"
    missing = sorted({f for files in rows.values() for f in map(str.strip, files.split(",")) if not (tests / f).is_file()})
    assert missing == [], f"tests/README.md names test files that do not exist: {missing}"
    stale = sorted(set(rows) - set(_modules()))
    assert stale == [], f"tests/README.md maps modules that no longer exist: {stale}"
