"""A recipe is a trust boundary: its `env:` mapping cannot set loader variables (PYTHONPATH, LD_PRELOAD, ...) unless
the person running it allows each by name on the command line, and every route to remote code gives one warning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from judgetrain.config.recipe import RecipeError, parse_recipe, remote_code_routes, remote_code_warning

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "recipes" / "quickstart.yaml"


def _recipe(tmp_path: Path, extra: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(QUICKSTART.read_text() + "\n" + extra + "\n")
    return str(path)


LOADER_VARS = ["PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONSTARTUP", "PYTHONHOME",
               "PYTHONWARNINGS", "DYLD_INSERT_LIBRARIES", "PATH", "BASH_ENV", "NODE_OPTIONS", "HF_MODULES_CACHE",
               "pythonpath"]


@pytest.mark.parametrize("name", LOADER_VARS)
def test_env_refuses_a_loader_variable_and_says_how_to_allow_it(name, tmp_path, monkeypatch):
    monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("JT_HARMLESS_MARK", raising=False)
    recipe = _recipe(tmp_path, f"env:\n  JT_HARMLESS_MARK: set\n  {name}: /tmp/evil")
    with pytest.raises(RecipeError) as err:
        parse_recipe([recipe])
    message = str(err.value)
    assert f"env: {name} would make the launched processes load code" in message and f"--allow_env {name}" in message
    assert name not in os.environ and "JT_HARMLESS_MARK" not in os.environ  # nothing of the env was applied


def test_allow_env_on_the_command_line_lets_a_named_variable_through(tmp_path, monkeypatch):
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    value = os.environ["PYTHONPATH"]  # the test's own path: harmless to set again
    recipe = _recipe(tmp_path, f"env:\n  PYTHONPATH: '{value}'\n  LD_LIBRARY_PATH: /opt/lib")
    with pytest.raises(RecipeError, match="LD_LIBRARY_PATH"):  # allowing one does not allow the other
        parse_recipe([recipe, "--allow_env", "PYTHONPATH"])
    recipe = parse_recipe([recipe, "--allow_env=PYTHONPATH,LD_LIBRARY_PATH", "--learning_rate", "1e-4"])
    args, resolved = recipe.training_args, recipe.resolved
    assert os.environ["LD_LIBRARY_PATH"] == "/opt/lib" and args.learning_rate == 1e-4
    assert "allow_env" not in resolved


def test_a_recipe_cannot_allow_a_loader_variable_for_itself(tmp_path):
    recipe = _recipe(tmp_path, "allow_env: [LD_PRELOAD]\nenv:\n  LD_PRELOAD: /tmp/evil.so")
    with pytest.raises(RecipeError, match="unknown key 'allow_env'"):
        parse_recipe([recipe])


def test_harmless_variables_and_malformed_env_entries(tmp_path, monkeypatch):
    for name in ("PYTHONHASHSEED", "WANDB_MODE", "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    parse_recipe([_recipe(tmp_path, "env:\n  PYTHONHASHSEED: 0\n  WANDB_MODE: offline\n  TOKENIZERS_PARALLELISM: false")])
    assert (os.environ["PYTHONHASHSEED"], os.environ["WANDB_MODE"]) == ("0", "offline")
    with pytest.raises(RecipeError, match="not an environment variable name"):
        parse_recipe([_recipe(tmp_path, "env:\n  'A=B': 1")])
    with pytest.raises(RecipeError, match="env must be a mapping"):
        parse_recipe([_recipe(tmp_path, "env: [PYTHONPATH]")])


def test_judgetrain_train_refuses_before_launching_anything(tmp_path):
    marker = tmp_path / "launched"
    recipe = _recipe(tmp_path, f"env:\n  LD_PRELOAD: {tmp_path / 'evil.so'}")
    p = subprocess.run([sys.executable, "-m", "judgetrain.cli", "train", recipe, "--output_dir", str(marker)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1].startswith("judgetrain train: recipe ") and "--allow_env LD_PRELOAD" in p.stderr
    assert "Traceback" not in p.stderr and not marker.exists()


# ---------------------------------------------------------------------------------------------------- remote code

ROUTES = {
    "trust_remote_code: true": "trust_remote_code: true",
    "model_init_kwargs: {trust_remote_code: true}": "model_init_kwargs: {trust_remote_code: true}",
    "model_init_kwargs: {use_kernels: true}": "model_init_kwargs: {use_kernels: true} (kernels from the Hub)",
    "attn_implementation: kernels-community/flash-attn": "attn_implementation: kernels-community/flash-attn (a kernel from the Hub)",
}


@pytest.mark.parametrize("line", list(ROUTES))
def test_every_recipe_route_to_remote_code_is_named_in_the_one_warning(line, tmp_path):
    recipe = parse_recipe([_recipe(tmp_path, line)])
    training_args, model_args = recipe.training_args, recipe.model_args
    routes = remote_code_routes(training_args, model_args)
    assert routes == [ROUTES[line]]
    warning = remote_code_warning(routes, model_args.model_name_or_path)
    assert warning.startswith(f"Remote code is ON ({ROUTES[line]}): loading tiny-judge runs Python code")


def test_command_line_model_init_kwargs_is_a_route_too(tmp_path):
    recipe = parse_recipe([str(QUICKSTART), "--model_init_kwargs", '{"trust_remote_code": true}'])
    training_args, model_args = recipe.training_args, recipe.model_args
    assert remote_code_routes(training_args, model_args) == ["model_init_kwargs: {trust_remote_code: true}"]
    recipe = parse_recipe([str(QUICKSTART)])
    training_args, model_args = recipe.training_args, recipe.model_args
    assert remote_code_routes(training_args, model_args) == []


def test_dry_run_gives_the_warning_for_model_init_kwargs(tmp_path, tiny_judge, capfd):
    from judgetrain.train import run

    recipe = _recipe(tmp_path, "model_init_kwargs: {trust_remote_code: true}")
    report = run([recipe, "--dry_run", "--output_dir", str(tmp_path / "run"), "--audit_rows", "4"])
    expected = "Remote code is ON (model_init_kwargs: {trust_remote_code: true})"
    assert expected in capfd.readouterr().err and any(n.startswith(expected) for n in report["notes"])


def test_eval_cli_trust_remote_code_gives_the_same_warning(tmp_path):
    p = subprocess.run([sys.executable, "-m", "judgetrain.cli.eval", "--model", str(tmp_path / "none"),
                        "--eval_suites", "judgebias", "--eval_max_rows", "2", "--trust-remote-code",
                        "--output-dir", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert f"Remote code is ON (--trust_remote_code): loading {tmp_path / 'none'}" in p.stderr
