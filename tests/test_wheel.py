"""What `pip install judgetrain` gets: the declared dependency bounds hold in this environment, a recipe or
accelerate config can be named instead of given as a path, and a built wheel carries them, so the quickstart runs by
name from an empty folder."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import yaml
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
SHIPPED = ("recipes", "accelerate_configs")


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


# ------------------------------------------------------------------------------------------ the built wheel

# what a source tree may hold beyond what the wheel is built from (the .gitignore's build and run outputs)
LEFTOVERS = (".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache",
             ".hypothesis", "runs", "outputs", "wandb", "judgetrain_report", "pairs_out", "bench.json")


def _run(cmd, *, cwd, env=None, check=True, timeout=600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {cmd}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
                             f"{proc.stderr[-8000:]}")
    return proc


def _site_dirs() -> list[str]:
    """This interpreter's site-packages folders, where the tests' third-party packages are installed."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def _user_env(home: Path, venv: Path) -> dict:
    """A user's shell with the new venv first on PATH and an empty HOME: nothing of this checkout or of the test
    session (PYTHONPATH, JUDGETRAIN_CACHE, Hugging Face or Accelerate settings) leaks in; offline stays offline."""
    drop = ("PYTHON", "JUDGETRAIN_", "VIRTUAL_ENV", "XDG_", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE",
            "TRANSFORMERS_CACHE", "ACCELERATE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(HOME=str(home), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


@pytest.mark.slow
def test_the_wheel_carries_the_recipes_and_runs_the_quickstart_by_name(tmp_path):
    """Build the wheel from a copy of the source, install it (--no-deps) into a fresh venv outside the repository that
    sees this environment's third-party packages through a .pth path line (which does not run the editable-install
    hook in that folder), and run `judgetrain train quickstart --accelerate_config cpu` from an empty folder with an
    empty HOME. The launch uses accelerate's default rendezvous port, as the README's quickstart does."""
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*LEFTOVERS))
    builder = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # pip's own index settings stay
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w",
          tmp_path / "dist", "."], cwd=src, env=builder)
    (wheel,) = (tmp_path / "dist").glob("judgetrain-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        for kind in SHIPPED:
            top = sorted((REPO / kind).glob("*.yaml"))
            assert top, kind
            for path in top:
                member = f"judgetrain/{kind}/{path.name}"
                assert member in zf.namelist(), f"{wheel.name} lacks {member}"
                assert zf.read(member) == path.read_bytes(), member
        data = [*(REPO / "judgetrain" / "perturb" / "packs").glob("*.yaml"),  # judgetrain perturb's packs and recipes
                *(REPO / "judgetrain" / "data" / "samples" / "recipes").glob("*.jsonl")]
        assert len(data) >= 4
        for path in data:
            assert path.relative_to(REPO).as_posix() in zf.namelist(), f"{wheel.name} lacks {path.name}"

    venv, home, work = tmp_path / "venv", tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    env = _user_env(home, venv)
    site_packages = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              cwd=work, env=env).stdout.strip())
    # installed before the .pth exists, so that pip sees no other judgetrain (this checkout's editable install)
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel], cwd=work, env=env)
    (site_packages / "test-environment.pth").write_text("\n".join(_site_dirs()) + "\n", encoding="utf-8")

    package = site_packages / "judgetrain"
    where = _run([python, "-c", "import judgetrain\nfrom judgetrain.config.packaged import packaged_dir\n"
                  "print(judgetrain.__file__)\nprint(packaged_dir('recipes'))\nprint(packaged_dir('accelerate_configs'))"],
                 cwd=work, env=env).stdout.split()
    assert where == [str(package / "__init__.py"), str(package / "recipes"), str(package / "accelerate_configs")]

    unknown = _run(["judgetrain", "train", "no_such_recipe"], cwd=work, env=env, check=False)
    assert unknown.returncode == 2, unknown.stderr[-3000:]
    assert "recipe no_such_recipe: file not found; packaged recipes: " in unknown.stderr
    for path in (REPO / "recipes").glob("*.yaml"):
        assert path.stem in unknown.stderr

    overrides = {"max_steps": 1, "eval_suites": "none", "accelerate_config": "cpu"}
    proc = _run(["judgetrain", "train", "quickstart", *[t for k, v in overrides.items() for t in (f"--{k}", v)]],
                cwd=work, env=env)
    packaged = package / "recipes" / "quickstart.yaml"
    assert f"recipe quickstart: the packaged {packaged}" in proc.stderr
    assert f"--config_file {package / 'accelerate_configs' / 'cpu.yaml'} -m judgetrain.train quickstart" in proc.stderr
    out = work / "runs" / "quickstart"
    assert (out / "adapter_model.safetensors").is_file()
    assert (out / "judgetrain_complete.json").is_file()
    saved = yaml.safe_load((out / "recipe.yaml").read_text(encoding="utf-8"))
    for key, value in yaml.safe_load(packaged.read_text(encoding="utf-8")).items():
        if key not in overrides:
            assert saved[key] == value, key
    assert sorted(p.name for p in work.iterdir()) == ["runs"]  # no repository file was needed, nothing else written
    assert list((home / ".cache" / "judgetrain").glob("tiny-judge-*"))  # built into the empty HOME's cache


# ------------------------------------------------------------------------------------------ names in a checkout

def test_a_packaged_recipe_and_accelerate_config_can_be_named_from_any_folder(tmp_path, monkeypatch):
    from judgetrain.config.recipe import parse_recipe

    monkeypatch.chdir(tmp_path)
    recipe = parse_recipe(["quickstart", "--accelerate_config", "cpu"])
    script_args, model_args, resolved = recipe.script_args, recipe.model_args, recipe.resolved
    assert model_args.model_name_or_path == "tiny-judge"
    assert script_args.accelerate_config == str(REPO / "accelerate_configs" / "cpu.yaml")
    assert resolved["accelerate_config"] == "cpu"  # the saved recipe keeps the name
    assert parse_recipe(["quickstart.yaml"]).model_args.model_name_or_path == "tiny-judge"


def test_a_path_that_exists_wins_over_a_packaged_name(tmp_path, monkeypatch):
    from judgetrain.config.recipe import parse_recipe

    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").write_text("model_name_or_path: my-own-model\nbf16: false\nactivation_checkpointing: false\n")
    (tmp_path / "cpu").write_text("distributed_type: 'NO'\n")
    recipe = parse_recipe(["quickstart", "--accelerate_config", "cpu"])
    script_args, model_args = recipe.script_args, recipe.model_args
    assert model_args.model_name_or_path == "my-own-model"
    assert script_args.accelerate_config == "cpu"


def test_an_unknown_recipe_name_lists_the_packaged_recipes(tmp_path, monkeypatch):
    from judgetrain.config.recipe import RecipeError, load_recipe_file

    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError, match="recipe no_such_recipe: file not found; packaged recipes: ") as err:
        load_recipe_file("no_such_recipe")
    assert all(p.stem in str(err.value) for p in (REPO / "recipes").glob("*.yaml"))
    with pytest.raises(RecipeError, match="file not found"):  # a path with a folder part is never a name
        load_recipe_file("recipes/no_such_recipe.yaml")
