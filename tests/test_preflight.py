"""The preflight: what would fail later, found before any weights load, one line per problem with its fix, all at
once, no traceback (judgetrain.checks.preflight)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections import namedtuple

import pytest
from helpers import FULL_PARAMS, QUICKSTART, REPO

from judgetrain.checks import preflight as pf
from judgetrain.config.recipe import parse_recipe

ZERO3 = str(REPO / "recipes" / "judgebias_qwen3_8b_full_zero3.yaml")


def test_wandb_without_a_key_or_offline_mode_is_a_problem_with_its_fix(tmp_path):
    env = {"HOME": str(tmp_path)}
    [problem] = pf.report_to_problems(["wandb"], env)
    assert "WANDB_MODE=offline" in problem and "wandb login" in problem
    assert pf.report_to_problems(["wandb"], {**env, "WANDB_MODE": "offline"}) == []
    assert pf.report_to_problems(["wandb"], {**env, "WANDB_API_KEY": "k"}) == []
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    assert pf.report_to_problems(["wandb"], env) == []
    assert pf.report_to_problems(["none"], env) == pf.report_to_problems([], env) == []


def test_report_to_none_imports_no_reporting_integration(monkeypatch):
    # transformers' availability check imports W&B (half a second of start-up): none and all alone need no check
    monkeypatch.setitem(sys.modules, "transformers.integrations", None)  # importing it now raises ImportError
    assert pf.report_to_problems("none") == pf.report_to_problems(["none"]) == pf.report_to_problems(None) == []
    with pytest.raises(ImportError):
        pf.report_to_problems(["wandb"])


def test_an_integration_that_is_not_installed_is_named_with_its_install_line(monkeypatch):
    monkeypatch.setattr(pf, "_installed", lambda module: module != "mlflow")
    [problem] = pf.report_to_problems(["tensorboard", "mlflow"], {})
    assert problem.startswith("report_to: mlflow is not installed: `pip install mlflow`")


def test_packages_the_recipe_names_by_its_keys(monkeypatch):
    monkeypatch.setattr(pf, "_installed", lambda module: False)
    recipe = parse_recipe(
        [str(QUICKSTART), "--attn_implementation", "flash_attention_2", "--use_liger_kernel", "true",
         "--load_in_4bit", "true"])
    problems = pf.package_problems(recipe)
    assert len(problems) == 3, problems
    assert "flash-attn" in problems[0] and "liger-kernel" in problems[1] and "bitsandbytes" in problems[2]
    monkeypatch.setattr(pf, "_installed", lambda module: True)
    monkeypatch.setattr(pf, "attention_problem", lambda attn: None)  # transformers' own check: see the next test
    assert pf.package_problems(recipe) == []


def test_flash_attention_is_checked_as_transformers_checks_it(tmp_path, monkeypatch):
    # this machine: no CUDA device, no flash-attention build, no kernels package
    assert pf.attention_problem("sdpa") is None and pf.attention_problem("eager") is None
    assert pf.attention_problem(None) is None
    fa2 = pf.attention_problem("flash_attention_2")
    assert fa2.startswith("attn_implementation: flash_attention_2 needs flash-attn: install `pip install flash-attn")
    assert "`pip install kernels`" in fa2 and "or use sdpa" in fa2
    # a module named flash_attn is not flash-attention 3 (another module, another distribution), nor a flash-attn
    # transformers would use: the distribution's name and a CUDA device decide, as at model load
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    fa3 = pf.attention_problem("flash_attention_3")
    assert fa3.startswith("attn_implementation: flash_attention_3 needs flash-attn-3: install flash-attn-3"), fa3
    assert "flash-attn" in pf.attention_problem("flash_attention_2")
    assert "not one transformers knows" in pf.attention_problem("flash_attention_9")
    assert "`pip install kernels`" in pf.attention_problem("kernels-community/vllm-flash-attn3")


def test_a_flash_attention_build_that_does_not_import_is_named(tmp_path, monkeypatch):
    (tmp_path / "builtforothertorch.py").write_text(
        "raise ImportError('builtforothertorch_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert pf._import_problem("builtforothertorch") == (
        "ImportError: builtforothertorch_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")
    assert pf._import_problem("json") is None


def test_report_to_is_checked_against_transformers_integrations(monkeypatch):
    [unknown] = pf.report_to_problems(["tensorbord"], {})
    assert unknown.startswith("report_to: tensorbord is not an integration transformers knows (one of ")
    assert "tensorboard" in unknown and "wandb" in unknown
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    [kubeflow] = pf.report_to_problems(["kubeflow"], {})
    assert kubeflow.startswith("report_to: transformers finds kubeflow unavailable here")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://127.0.0.1:1")
    assert pf.report_to_problems(["kubeflow", "tensorboard"], {}) == []


def test_a_filesystem_without_flock_is_named_before_the_run_takes_its_lock(tmp_path, monkeypatch):
    assert pf.lock_problem(tmp_path / "run") is None
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    problem = pf.lock_problem(tmp_path / "run")
    assert "does not support flock (ENOLCK)" in problem and "-o flock" in problem
    assert not list(tmp_path.iterdir()), "the probe file was left behind"


def test_disk_for_the_kept_checkpoints_of_a_full_fine_tune(tmp_path, monkeypatch):
    recipe = parse_recipe(
        [ZERO3, "--output_dir", str(tmp_path / "run"), "--save_total_limit", "2", "--bf16", "false"])
    size = pf.checkpoint_bytes(recipe)
    # Qwen3-8B's 8,190,735,360 weights (worked in tests/helpers.py) x 14 bytes: bf16 weights 2, fp32 Adam m and v 8,
    # fp32 master copy 4 (the allowance for tokenizer and trainer states is well under 0.1%)
    assert size == pytest.approx(FULL_PARAMS["Qwen/Qwen3-8B"] * 14, rel=1e-3)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(pf.shutil, "disk_usage", lambda p: usage(10**13, 0, 100 * pf.GIB))
    problem = pf.disk_problem(recipe)
    assert problem and "100.0 GiB free" in problem and "2 + 1 checkpoints" in problem and "save_total_limit" in problem
    monkeypatch.setattr(pf.shutil, "disk_usage", lambda p: usage(10**13, 0, 10**13))
    assert pf.disk_problem(recipe) is None


def test_a_hub_id_with_the_hub_offline_must_be_in_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    problem = pf.hub_problem("Qwen/Qwen3-8B", env={"HF_HUB_OFFLINE": "1"})
    assert problem and "not in the local Hugging Face cache" in problem and "huggingface-cli download Qwen/Qwen3-8B" in problem
    assert pf.hub_problem("Qwen/Qwen3-8B", env={}) is None  # online: transformers downloads it
    assert pf.hub_problem("tiny-judge", env={"HF_HUB_OFFLINE": "1"}) is None
    assert pf.hub_problem(str(tmp_path), env={"HF_HUB_OFFLINE": "1"}) is None


def test_the_preflight_reads_offline_mode_by_the_hubs_own_rule(tmp_path, monkeypatch):
    """One answer to "is the hub offline" (utils.hub.hub_offline): HF_HUB_OFFLINE=ON is offline for huggingface_hub,
    and a set HF_HUB_OFFLINE=0 wins over TRANSFORMERS_OFFLINE=1."""
    from judgetrain.utils.hub import hub_offline

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    for env, offline in (({"HF_HUB_OFFLINE": "ON"}, True), ({"TRANSFORMERS_OFFLINE": "yes"}, True),
                         ({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, False), ({}, False)):
        assert hub_offline(env) is offline, env
        assert (pf.hub_problem("Qwen/Qwen3-8B", env=env) is not None) is offline, env


def test_a_run_stops_before_loading_anything_naming_every_problem_at_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)
    p = subprocess.run([sys.executable, "-m", "judgetrain.train", str(QUICKSTART), "--output_dir", str(tmp_path / "run"),
                        "--report_to", "wandb", "--attn_implementation", "flash_attention_2", "--use_liger_kernel", "true"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    for needle in ("report_to: wandb has no API key", "flash-attn", "liger-kernel"):
        assert needle in p.stderr, p.stderr[-3000:]
    assert "Building the tiny judge" not in p.stderr and "Tokenizing" not in p.stderr  # nothing loaded
    assert not (tmp_path / "run" / "train_rows").exists()


def test_the_dry_run_lists_the_problems_and_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)
    p = subprocess.run([sys.executable, "-m", "judgetrain.train", str(QUICKSTART), "--dry-run", "--output_dir",
                        str(tmp_path / "run"), "--report_to", "wandb"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]  # the launch's verdict: it would be refused
    report = json.loads(p.stdout[p.stdout.index("{"):])
    assert len(report["preflight"]) == 1 and "WANDB_MODE=offline" in report["preflight"][0]
    assert report["exit_code"] == 2 and "Traceback" not in p.stderr
    assert "preflight: report_to: wandb" in p.stderr


# ------------------------------------------------------------------ the dry run's exit code is the launch's verdict

def _dry_run(tmp_path, *extra, out=None):
    """`judgetrain train QUICKSTART --dry-run` in this process (a few rows, no eval suites): (exit code, report)."""
    from judgetrain.cli.train import main

    out = out or tmp_path / "run"
    argv = [str(QUICKSTART), "--dry-run", "--output_dir", str(out), "--audit_rows", "4", "--eval_suites", "none", *extra]
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(argv)
    text = stdout.getvalue()
    return code, json.loads(text[text.index("{"):])


def _no_wandb_login(tmp_path, monkeypatch, request):
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    return []


def _busy(tmp_path, monkeypatch, request):
    from judgetrain.run.state import hold_output_dir, release_output_dir

    out = tmp_path / "run"
    hold_output_dir(out)  # another run holds the lock (flock: a second open file in this process is refused too)
    request.addfinalizer(lambda: release_output_dir(out))
    return []


def _flock_unsupported(tmp_path, monkeypatch, request):
    import fcntl

    real = fcntl.flock

    def no_flock(fd, op):  # only output_dir's filesystem lacks flock (the datasets cache elsewhere has it)
        fd = fd if isinstance(fd, int) else fd.fileno()
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            raise OSError(errno.ENOLCK, "No locks available")
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", no_flock)
    return []


def _small_disk(tmp_path, monkeypatch, request):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(pf.shutil, "disk_usage", lambda p: usage(10**13, 0, 10 * 2**20))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # (the hub check off) an 8B model's shape is known offline
    return ["--model_name_or_path", "Qwen/Qwen3-8B"]


def _used(tmp_path, monkeypatch, request=None):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    return []


def _no_deepspeed(tmp_path, monkeypatch, request):
    """The deepspeed package as a machine without it sees it (CI installs it, so the check would pass there)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    return []


# (what makes the check fail, the recipe overrides it needs, a phrase of its one line)
REFUSALS = {
    "wandb_login": (_no_wandb_login, ["--report_to", "wandb"], "wandb has no API key"),
    "integration": (None, ["--report_to", "dvclive"], "dvclive is not installed"),
    "flash_attn": (None, ["--attn_implementation", "flash_attention_2"], "needs flash-attn"),
    "liger": (None, ["--use_liger_kernel", "true"], "needs liger-kernel"),
    "bitsandbytes": (None, ["--load_in_4bit", "true"], "need bitsandbytes"),
    "deepspeed": (_no_deepspeed, ["--accelerate_config", str(REPO / "accelerate_configs" / "zero2.yaml")], "deepspeed"),
    "flock": (_flock_unsupported, [], "does not support flock"),
    "disk": (_small_disk, [], "GiB free"),
    "hub_offline": (None, ["--model_name_or_path", "Qwen/Qwen3-8B"], "not in the local Hugging Face cache"),
    "output_dir_in_use": (_busy, [], "is in use by another judgetrain run"),
    "output_dir_used": (_used, [], "already holds a run"),
}


@pytest.mark.parametrize("check", sorted(REFUSALS))
def test_a_dry_run_exits_2_when_a_check_would_refuse_the_launch(check, tmp_path, monkeypatch, capfd, request):
    make, overrides, phrase = REFUSALS[check]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    extra = (make(tmp_path, monkeypatch, request) if make else []) + overrides
    code, report = _dry_run(tmp_path, *extra)
    assert code == 2 and report["exit_code"] == 2, report
    lines = [p for p in report["preflight"] if phrase in p]
    assert len(lines) == 1, report["preflight"]
    err = capfd.readouterr().err
    logged = [line for line in err.splitlines() if " preflight: " in line]
    assert len(logged) == len(report["preflight"]) and any(phrase in m for m in logged), err[-3000:]
    assert "the launch would be refused" in err and "Traceback" not in err


def test_a_dry_run_exits_0_only_when_the_launch_would_start(tmp_path, monkeypatch):
    code, report = _dry_run(tmp_path)
    assert (code, report["exit_code"], report["preflight"]) == (0, 0, [])
    _used(tmp_path, monkeypatch)  # the same folder, now holding a run: resuming or overwriting it would start
    assert _dry_run(tmp_path, "--resume", "auto")[0] == 0
    assert _dry_run(tmp_path, "--overwrite_output_dir", "true")[0] == 0
    assert _dry_run(tmp_path)[0] == 2


@pytest.mark.parametrize("flags,named", [
    (["--train_datasets", '{dataset: judgebias, source: no-such-rows}'], "train_datasets[0].source no-such-rows"),
    (["--eval_suites", "judgebias", "--eval_judgebias_source", "no-such-rows"], "eval_judgebias_source no-such-rows"),
])
def test_the_dry_run_refuses_a_source_that_is_neither_a_path_nor_a_hub_id_by_the_loaders_rule(tmp_path, capsys, flags,
                                                                                              named):
    """A training or eval source that is no existing path and no hub id (owner/name) is refused by the dry run with
    the loaders' own rule (`data.io.resolve_local`), the field named; an eval source used to pass when it did not
    start with "." or "/"."""
    from judgetrain.cli.train import main

    argv = [str(QUICKSTART), "--dry-run", "--output_dir", str(tmp_path / "run"), "--audit_rows", "4",
            "--eval_suites", "none", *flags]
    code = main(argv)
    said = capsys.readouterr()
    assert code == 2, said
    assert f"judgetrain train --dry-run: {named}: file or folder not found (nor a hub id, owner/name)" in said.err + said.out
