"""What `pip install judgetrain` gets: the declared dependency bounds hold in this environment."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from helpers import REPO

try:
    import tomllib
except ImportError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

# judgetrain reaches into private state of these (pyproject.toml says where): each is capped at its newest tested minor
PRIVATE_STATE = ("trl", "transformers", "peft", "accelerate", "torch")


def _dependencies() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(text) for text in project["dependencies"]]


def test_installed_versions_satisfy_the_declared_bounds():
    wrong = []
    for req in _dependencies():
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            installed = version(req.name)
        except PackageNotFoundError:
            wrong.append(f"{req.name} is not installed (pyproject.toml declares {req})")
            continue
        if not req.specifier.contains(Version(installed), prereleases=True):
            wrong.append(f"{req.name} {installed} is installed but pyproject.toml declares {req}")
    assert not wrong, "this environment is outside the tested versions:\n  " + "\n  ".join(wrong)


def test_libraries_whose_private_state_judgetrain_touches_have_an_upper_bound():
    declared = {canonicalize_name(req.name): req for req in _dependencies()}
    for name in PRIVATE_STATE:
        assert name in declared, f"{name} is not a declared dependency"
        assert any(s.operator in ("<", "<=", "==", "~=") for s in declared[name].specifier), (
            f"{declared[name]} has no upper bound")
