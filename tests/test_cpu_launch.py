"""A launch on a machine of CPUs alone uses its cores: `accelerate launch` without ``--cpu`` gives each process one
thread (``OMP_NUM_THREADS=1``), so judgetrain passes each process its share of the cores unless the user chose
(``OMP_NUM_THREADS``) or a config file names the launch; and a recipe asking for bf16 there trains with CPU autocast
(``use_cpu``, which transformers requires) instead of being refused."""

from __future__ import annotations

import os

import pytest

from judgetrain.run.launch import Launch, accelerate_argv
from judgetrain.utils.device import has_accelerator

pytestmark = pytest.mark.skipif(has_accelerator(), reason="what a machine without an accelerator does")


def threads_flag(argv: list[str]) -> str | None:
    return argv[argv.index("--num_cpu_threads_per_process") + 1] if "--num_cpu_threads_per_process" in argv else None


def test_each_process_gets_its_share_of_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert threads_flag(accelerate_argv("judgetrain.train", ["r.yaml"], Launch(1))) == str(cores)
    assert threads_flag(accelerate_argv("judgetrain.train", [], Launch(2))) == str(max(1, cores // 2))
    assert threads_flag(accelerate_argv("judgetrain.train", [], Launch(2, "cpu.yaml"))) is None  # the config decides
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_flag(accelerate_argv("judgetrain.train", [], Launch(1))) is None  # the user chose


def test_bf16_on_cpus_trains_with_cpu_autocast(tmp_path):
    from judgetrain.config.recipe import parse_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: tiny-judge\noutput_dir: out\neval_suites: none\n", encoding="utf-8")
    on = parse_recipe([str(recipe), "--bf16", "true"])
    assert on.training_args.bf16 is True and on.training_args.use_cpu is True
    off = parse_recipe([str(recipe), "--bf16", "false"])
    assert off.training_args.use_cpu is False


def test_a_recipe_without_bf16_launches_as_its_dry_run_said(tmp_path):
    """TRL turns an unset bf16 into true: the launch reads it so (CPU autocast, as for ``bf16: true``) instead of
    refusing it ("Your setup doesn't support bf16/gpu", exit 2) after its dry run passed."""
    from judgetrain.config.recipe import parse_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: tiny-judge\noutput_dir: out\neval_suites: none\n", encoding="utf-8")
    dry = parse_recipe([str(recipe), "--dry_run"])
    assert dry.script_args.dry_run is True and dry.training_args.bf16 is False  # checked as a GPU recipe would be
    launch = parse_recipe([str(recipe)])
    assert launch.training_args.bf16 is True and launch.training_args.use_cpu is True
    fp16 = parse_recipe([str(recipe), "--fp16", "true", "--use_cpu", "true"])
    assert fp16.training_args.bf16 is False  # unset beside fp16: TRL's bf16 = not fp16
