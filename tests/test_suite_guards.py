"""Guards on the test suite itself, read from the source with ``ast`` (no test is imported or run):

- every test function asserts something: an ``assert``, ``pytest.raises`` / ``pytest.warns``, a library
  ``assert_*`` (``torch.testing.assert_close``), a ``raise AssertionError``, or a call of a helper that does one of
  these (helpers defined in the same file, in tests/helpers.py, tests/families.py, tests/conftest.py, or imported
  from another test file);
- no value is compared with itself: ``x == pytest.approx(x)``, ``math.isclose(x, x)``, ``torch.allclose(x, x)``;
- no assertion compares a wall-clock reading (``time.time()``, ``time.monotonic()``, ``time.perf_counter()`` and
  what is computed from them) with ``<``, ``>``, ``<=``, ``>=``, outside tests marked
  ``@pytest.mark.contract_time(reason=...)``: tests whose time bound is the contract itself (a preemption window),
  kept at 10x the measured figure or more. A test asserts work done, events and their order; speed figures live
  in ``judgetrain bench``.

Each rule is checked on small synthetic sources first (the guard must flag each bad pattern), then on the suite.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
HELPER_FILES = ("helpers.py", "families.py", "conftest.py")
CONTRACT_TIME = "contract_time"
CLOCKS = {"time", "monotonic", "perf_counter", "monotonic_ns", "perf_counter_ns", "time_ns", "process_time"}

@dataclass
class Finding:
    file: str
    test: str
    rule: str
    line: int

    def __str__(self):
        return f"{self.file}:{self.line} {self.test}: {self.rule}"


@dataclass
class Module:
    name: str
    tree: ast.Module
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return ""


def parse_module(name: str, source: str) -> Module:
    tree = ast.parse(source)
    mod = Module(name, tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mod.functions.setdefault(node.name, node)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                mod.imported[alias.asname or alias.name] = (node.module, alias.name)
    return mod


def _asserts_directly(fn: ast.AST) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Raise) and node.exc is not None and _dotted(node.exc).endswith("AssertionError"):
            return True
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            last = name.rpartition(".")[2]
            if last in ("raises", "warns") and (name.startswith("pytest.") or name in ("raises", "warns")):
                return True
            if last.startswith("assert") and last != "assert_":  # assert_close, assert_allclose, assertEqual
                return True
    return False


def _called_names(fn: ast.AST) -> set[str]:
    return {_dotted(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}


def asserting_functions(modules: dict[str, Module]) -> dict[str, set[str]]:
    """Per module, the functions that assert directly or call (transitively, across modules) one that does."""
    found = {m: {n for n, fn in mod.functions.items() if _asserts_directly(fn)} for m, mod in modules.items()}
    changed = True
    while changed:
        changed = False
        for m, mod in modules.items():
            for n, fn in mod.functions.items():
                if n in found[m]:
                    continue
                for called in _called_names(fn):
                    head, _, last = called.rpartition(".")
                    if _resolves_to_asserting(mod, head, last, modules, found):
                        found[m].add(n)
                        changed = True
                        break
    return found


def _resolves_to_asserting(mod: Module, head: str, last: str, modules, found) -> bool:
    if not head:  # f(...): local, imported by name, or a helper module's (conftest fixtures are not called)
        if last in found[mod.name]:
            return True
        source = mod.imported.get(last)
        if source and source[0] in found and source[1] in found[source[0]]:
            return True
        return False
    if head in modules:  # helpers.run(...)
        return last in found[head]
    return last in found[mod.name] and head in ("self", "cls")


def _marked(fn, marker: str) -> ast.Call | None:
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and _dotted(dec.func) == f"pytest.mark.{marker}":
            return dec
    return None


def _test_functions(mod: Module):
    for node in mod.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            yield node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            yield from (f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and f.name.startswith("test"))


def self_comparisons(fn: ast.AST) -> list[int]:
    """Lines where a value is compared with itself through approx / isclose / allclose / assert_close."""
    lines = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            left, right = node.left, node.comparators[0]
            for a, b in ((left, right), (right, left)):
                if isinstance(b, ast.Call) and _dotted(b.func).rpartition(".")[2] == "approx" and b.args and \
                        ast.dump(b.args[0]) == ast.dump(a):
                    lines.append(node.lineno)
        if isinstance(node, ast.Call) and len(node.args) >= 2 and _dotted(node.func).rpartition(".")[2] in (
                "isclose", "allclose", "assert_close", "assert_allclose", "array_equal", "equal") and \
                ast.dump(node.args[0]) == ast.dump(node.args[1]):
            lines.append(node.lineno)
    return lines


def _is_clock_call(node: ast.AST, clock_functions: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = _dotted(node.func)
    head, _, last = name.rpartition(".")
    return (head == "time" and last in CLOCKS) or (not head and last in CLOCKS - {"time"}) or name in clock_functions


def _mentions_clock(expr: ast.AST, clock_names: set[str], clock_functions: set[str]) -> bool:
    for node in ast.walk(expr):
        if _is_clock_call(node, clock_functions):
            return True
        if isinstance(node, ast.Name) and node.id in clock_names:
            return True
        if isinstance(node, ast.Attribute) and _dotted(node) in clock_names:
            return True
    return False


def _clock_names(fn: ast.AST, clock_functions: set[str]) -> set[str]:
    """Names (and attributes) assigned, in ``fn``, a wall-clock reading or a value computed from one."""
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if not _mentions_clock(node.value, names, clock_functions):
                    continue
                for target in targets:
                    for t in ast.walk(target):
                        key = _dotted(t) if isinstance(t, (ast.Name, ast.Attribute)) else ""
                        if key and key not in names:
                            names.add(key)
                            changed = True
    return names


def clock_functions(mod: Module) -> set[str]:
    """Functions of a module that return a wall-clock reading or a value computed from one (a timing helper)."""
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for n, fn in mod.functions.items():
            if n in found:
                continue
            names = _clock_names(fn, found)
            if any(isinstance(r, ast.Return) and r.value is not None and _mentions_clock(r.value, names, found)
                   for r in ast.walk(fn)):
                found.add(n)
                changed = True
    return found


def wall_clock_assertions(fn: ast.AST, timing: set[str]) -> list[int]:
    """Lines of ``assert``s in ``fn`` that order-compare a wall-clock value."""
    names = _clock_names(fn, timing)
    lines = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in ast.walk(node.test):
            if isinstance(cmp, ast.Compare) and any(isinstance(op, (ast.Lt, ast.Gt, ast.LtE, ast.GtE)) for op in cmp.ops):
                if any(_mentions_clock(e, names, timing) for e in [cmp.left, *cmp.comparators]):
                    lines.append(node.lineno)
                    break
    return lines


def check(sources: dict[str, str], pending=frozenset()) -> list[Finding]:
    """Every finding of the three rules in ``sources`` (file name -> text; helper files by their names)."""
    modules = {Path(name).stem: parse_module(Path(name).stem, text) for name, text in sources.items()}
    asserting = asserting_functions(modules)
    findings = []
    for name in sorted(sources):
        if not Path(name).name.startswith("test_"):
            continue
        mod = modules[Path(name).stem]
        timing = clock_functions(mod) | {n for n, (m, f) in mod.imported.items()
                                         if m in modules and f in clock_functions(modules[m])}
        for fn in _test_functions(mod):
            if not _asserts_directly(fn) and not any(
                    _resolves_to_asserting(mod, *(c.rpartition(".")[::2]), modules, asserting)
                    for c in _called_names(fn)):
                findings.append(Finding(name, fn.name, "asserts nothing", fn.lineno))
            for line in self_comparisons(fn):
                findings.append(Finding(name, fn.name, "compares a value with itself", line))
            marker = _marked(fn, CONTRACT_TIME)
            if marker is not None and not any(k.arg == "reason" and isinstance(k.value, ast.Constant) and
                                              str(k.value.value).strip() for k in marker.keywords):
                findings.append(Finding(name, fn.name, f"{CONTRACT_TIME} marker without a reason", fn.lineno))
            if marker is None and (Path(name).name, fn.name) not in pending:
                for line in wall_clock_assertions(fn, timing):
                    findings.append(Finding(name, fn.name, "asserts a wall-clock bound (not a contract_time test)",
                                            line))
    return findings


def _suite_sources() -> dict[str, str]:
    files = sorted(TESTS.glob("test_*.py")) + [TESTS / n for n in HELPER_FILES if (TESTS / n).is_file()]
    return {p.name: p.read_text(encoding="utf-8") for p in files}


# ------------------------------------------------------------------------------------------ the guard, on examples

HELPERS = '''
def run(cmd):
    if cmd != 0:
        raise AssertionError(cmd)

def quiet(cmd):
    return cmd
'''


def _rules(test_source: str, **extra) -> list[str]:
    return [f.rule for f in check({"helpers.py": HELPERS, "test_x.py": test_source, **extra})]


@pytest.mark.parametrize("body", [
    "def test_a():\n    try:\n        f()\n    except ValueError:\n        pass\n",
    "def test_a():\n    x = f()\n    print(x)\n",
    "from helpers import quiet\ndef test_a():\n    quiet(1)\n",
    "import helpers\ndef test_a():\n    helpers.quiet(1)\n",
    "def _h(x):\n    return x\ndef test_a():\n    _h(1)\n",
    "class TestA:\n    def test_a(self):\n        f()\n",
])
def test_the_guard_flags_a_test_that_asserts_nothing(body):
    assert _rules(body) == ["asserts nothing"]


@pytest.mark.parametrize("body", [
    "def test_a():\n    assert f() == 1\n",
    "import pytest\ndef test_a():\n    with pytest.raises(ValueError):\n        f()\n",
    "import pytest\ndef test_a():\n    with pytest.warns(UserWarning):\n        f()\n",
    "import torch\ndef test_a():\n    torch.testing.assert_close(f(), g())\n",
    "from helpers import run\ndef test_a():\n    run(1)\n",
    "import helpers\ndef test_a():\n    helpers.run(1)\n",
    "def _check(x):\n    assert x\ndef _outer(x):\n    _check(x)\ndef test_a():\n    _outer(1)\n",
    "from test_y import shared\ndef test_a():\n    shared(1)\n",
    "class TestA:\n    def _c(self):\n        assert 1\n    def test_a(self):\n        self._c()\n",
])
def test_the_guard_accepts_each_way_of_asserting(body):
    assert _rules(body, **{"test_y.py": "def shared(x):\n    assert x\n"}) == []


@pytest.mark.parametrize("expr", ["g[1] == pytest.approx(g[1])", "pytest.approx(x.y) == x.y",
                                  "math.isclose(a, a)", "torch.allclose(t[0], t[0])"])
def test_the_guard_flags_a_value_compared_with_itself(expr):
    assert _rules(f"import math, pytest, torch\ndef test_a():\n    assert {expr}\n") == ["compares a value with itself"]
    assert _rules("import math, pytest, torch\ndef test_a():\n    assert " + expr.replace("[1]", "[2]", 1)
                  .replace("(x.y)", "(x.z)").replace("(a, a)", "(a, b)").replace("t[0], t[0]", "t[0], t[1]")) == []


@pytest.mark.parametrize("body", [
    "import time\ndef test_a():\n    t0 = time.time()\n    f()\n    assert time.time() - t0 < 5\n",
    "import time\ndef test_a():\n    t0 = time.monotonic()\n    f()\n    took = time.monotonic() - t0\n    assert took < 5\n",
    "from time import perf_counter\ndef test_a():\n    t = perf_counter()\n    f()\n    assert 0.5 <= perf_counter() - t\n",
    "import time\ndef _timed(f):\n    t = time.perf_counter()\n    f()\n    return time.perf_counter() - t\n"
    "def test_a():\n    assert _timed(f) >= 0.5\n",
    "import time\ndef test_a():\n    c = C()\n    c.start = time.monotonic()\n    assert time.monotonic() - c.start > 1\n",
    "import time, pytest\n@pytest.mark.slow\ndef test_a():\n    t = time.time()\n    assert time.time() - t <= 9\n",
])
def test_the_guard_flags_a_wall_clock_assertion_outside_a_contract_time_test(body):
    assert _rules(body) == ["asserts a wall-clock bound (not a contract_time test)"]


def test_the_guard_accepts_a_marked_contract_a_deadline_loop_and_a_recorded_count():
    marked = ("import time, pytest\n@pytest.mark.contract_time(reason='the preemption window')\n"
              "def test_a():\n    t = time.monotonic()\n    assert time.monotonic() - t < 300\n")
    assert _rules(marked) == []
    assert _rules(marked.replace("reason='the preemption window'", "")) == [f"{CONTRACT_TIME} marker without a reason"]
    loop = ("import time\ndef test_a():\n    deadline = time.monotonic() + 30\n"
            "    while time.monotonic() < deadline and not done():\n        time.sleep(0.1)\n    assert done()\n")
    assert _rules(loop) == []
    assert _rules("def test_a():\n    s = Server()\n    assert s.max_in_flight <= 4\n") == []
    pending = {("test_x.py", "test_a")}
    unmarked = "import time\ndef test_a():\n    t = time.time()\n    assert time.time() - t < 5\n"
    assert check({"test_x.py": unmarked}, pending) == []


# ------------------------------------------------------------------------------------------ the guard, on the suite

def test_every_test_in_the_suite_asserts_compares_distinct_values_and_reads_no_clock():
    findings = check(_suite_sources())
    assert not findings, "\n".join(map(str, findings))


def test_the_contract_time_marker_is_registered():
    markers = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith(f"{CONTRACT_TIME}:") for m in markers), markers
