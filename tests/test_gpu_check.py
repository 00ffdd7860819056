"""scripts/gpu_check.py in its CPU mode (tiny shapes): every check runs and passes, and the JSON holds the figures a
person reads on a GPU machine, so the script cannot rot between GPU loans."""

import json
import sys

import pytest
import torch
from helpers import REPO, run


@pytest.mark.slow
def test_the_gpu_check_runs_every_check_on_cpu_and_writes_its_figures(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--out", out, "--workdir", tmp_path / "w"],
               cwd=REPO, env={"OMP_NUM_THREADS": "1"}, timeout=600, check=False)
    report = json.loads(out.read_text())
    checks = report["checks"]
    assert list(checks) == ["quickstart", "prefix_sharing", "eval_engine", "memory", "bench"]
    assert {k: v["ok"] for k, v in checks.items()} == dict.fromkeys(checks, True), (proc.stderr[-3000:], checks)
    assert proc.returncode == 0 and report["ok"] is True
    assert all(v["seconds"] > 0 for v in checks.values())  # recorded; the speed figures live in `judgetrain bench`
    quick = checks["quickstart"]["figures"]
    assert quick["steps"] == 1 and quick["prefix_sharing_line"].startswith("prefix_sharing: on")
    assert "eval/rmbench/total_avg_acc" in quick["eval"]
    # bounds of the test's own, from bf16's rounding step (torch.finfo), not the script's: the probe's largest
    # per-token difference within 4 eps, TRL's loss within 4 eps (relative), rewards and gradients within 8 eps
    eps = torch.finfo(torch.bfloat16).eps
    share = checks["prefix_sharing"]["figures"]
    assert share["probe"]["max_abs_diff"] <= 4 * eps and share["probe"]["mean_abs_diff"] <= 0.15 * eps, share
    assert share["sdpa"]["loss_rel_diff"] <= 4 * eps and share["sdpa"]["rewards_max_abs_diff"] <= 8 * eps, share
    assert share["sdpa"]["grad_max_rel_diff"] <= 8 * eps, share
    engine = checks["eval_engine"]["figures"]
    assert engine["float32"]["max_rel_score_diff"] <= 1e-4 and engine["bfloat16"]["shared_prompts"] > 0
    mem = checks["memory"]["figures"]["cases"]
    assert [(c["lora_r"], c["checkpointing"]) for c in mem] == [(16, False), (None, True)]
    assert all(c["optimizer"] == "fused" and c["estimated_phase"] for c in mem)
    assert all(c["measured_mib"] > 0 and c["bf16"] for c in mem)
    bench = checks["bench"]["figures"]["tiny"]
    assert bench["train_tokens_per_s"] > 0 and bench["train_mfu"] > 0 and bench["eval_tokens_per_s"] > 0
    gen = bench["generation"]  # the device bench's generation figures, every key, from the same code on CPU
    assert gen["static_cache"]["tokens"] == gen["dynamic_cache"]["tokens"] == 2 * 4
    assert gen["static_cache"]["static_cache_batches"] == 1 and gen["dynamic_cache"]["static_cache_batches"] == 0
    assert gen["static_cache"]["tokens_per_s"] > 0 and gen["static_cache_speedup"] > 0
    assert gen["batch_tokens_auto"] > 0 and gen["batch_tokens_how"].startswith("CPU: ")
    assert report["environment"]["device"] == "cpu" and report["setup"]["missing"] == []


def test_the_gpu_questions_run_their_cpu_halves_when_named(tmp_path):
    """vLLM, flash-attention and tf32 are GPU questions (run by default on cuda only); on CPU, named with --only: vLLM
    skipped with its reason, each flash-attention verdict of the preflight agreeing with the model load, tf32 not in
    effect and the probe computing in fp32."""
    out = tmp_path / "gpu_check.json"
    proc = run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--only", "vllm", "flash_attention", "tf32",
                "--out", out, "--workdir", tmp_path / "w"], cwd=REPO, env={"OMP_NUM_THREADS": "1"}, timeout=300,
               check=False)
    checks = json.loads(out.read_text())["checks"]
    assert proc.returncode == 0 and all(c["ok"] for c in checks.values()), (proc.stderr[-3000:], checks)
    assert checks["vllm"]["skipped"].startswith("vLLM's GPU engine: CUDA only")
    flash = checks["flash_attention"]["figures"]
    for attn in ("flash_attention_2", "flash_attention_3"):
        assert (flash[attn]["preflight_problem"] is None) == flash[attn]["loads"]
    tf32 = checks["tf32"]["figures"]
    assert tf32["compute_dtype"] == tf32["probe"]["compute_dtype"] == "float32" and tf32["probe"]["prefix_sharing"]
    assert tf32["matmul_rel_error"] < 1e-5


def _script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_device_kit_holds_the_stack_and_the_hub_clients_deps_and_leaves_torch_to_the_device(tmp_path):
    """The kit's packages: the training stack and huggingface_hub's httpx2 / httpcore2 (whose absence stopped the
    first GPU loan at import), none of torch, its CUDA libraries, or the three wheels too large to carry; the
    device-like site of the offline check holds torch and those three, and nothing of the kit."""
    kit = _script("device_kit")
    packages = kit.closure()
    assert {"trl", "transformers", "peft", "accelerate", "datasets", "huggingface-hub", "httpx2",
            "httpcore2", "tokenizers", "safetensors"} <= set(packages)
    assert not {"torch", "triton", "numpy", "pandas", "pyarrow"} & set(packages)
    assert not [p for p in packages if p.startswith("nvidia-")]
    assert packages["trl"] == "1.16.0" and packages["transformers"] == "5.24.0"  # the versions the tests run on
    kit.device_like_site(tmp_path / "device")
    held = {p.name for p in (tmp_path / "device").iterdir()}
    assert {"torch", "numpy", "pandas", "pyarrow"} <= held
    assert not {"trl", "transformers", "datasets", "huggingface_hub", "peft", "httpx2"} & held


def test_the_gpu_check_names_what_the_kit_expects_the_machine_to_have_before_any_check(tmp_path):
    """A kit whose device_must_have the machine lacks stops gpu_check at set-up, naming the package."""
    (tmp_path / "kit.json").write_text(json.dumps({"device_must_have": {"no_such_package_here": "1.0"}}))
    (tmp_path / "requirements.txt").write_text("trl==1.16.0\n")
    proc = run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--wheels", tmp_path, "--only", "vllm",
                "--out", tmp_path / "out.json"], cwd=REPO, timeout=120, check=False)
    assert proc.returncode != 0
    assert "this machine lacks no_such_package_here, which the kit in" in proc.stderr
    assert not (tmp_path / "out.json").exists()


@pytest.mark.extended(reason="downloads the kit's wheels from PyPI (2-5 minutes); the cheaper tests above check its "
                             "contents and the device-like site without the network")
def test_the_device_kit_installs_offline_into_an_empty_venv_and_imports_the_stack(tmp_path):
    """scripts/device_kit.py end to end for this Python: the wheels fetched, under 60 MiB, installed with
    --no-index into an empty venv holding only torch, numpy, pandas and pyarrow, and judgetrain, trl, datasets,
    huggingface_hub, transformers, peft and accelerate imported there."""
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    proc = run([sys.executable, "scripts/device_kit.py", "--out", tmp_path / "kit", "--pythons", this], cwd=REPO,
               timeout=900, check=False)
    manifest = json.loads((tmp_path / "kit" / "kit.json").read_text())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert manifest["verified"]["ok"] and manifest["mib"] <= 60
    assert manifest["verified"]["versions"]["trl"] == "1.16.0"
    assert set(manifest["verified"]["versions"]) == {"judgetrain", "trl", "datasets", "huggingface_hub",
                                                     "transformers", "peft", "accelerate"}


def test_the_device_benchs_mfu_of_prefix_shared_dpo_against_trls_on_a_worked_example():
    """add_train_mfu: MFU counts the pairs' model FLOPs at TRL's length for both sides (the same work for the same
    loss). Tiny shape, 100 tokens a response: N = 2 x 36,864 + 64 x 512 = 106,496 matmul parameters; a DPO LoRA step
    6 N + 4 x (4 L q S) = 843,776 FLOPs a token; a pair 2 x 100 of them; 2 and 3 pairs/s over 1e9 FLOP/s."""
    from judgetrain.bench.gpu import REAL_SHAPES, add_train_mfu

    rows = {"tokens_per_response": {"trl": 100, "prefix_sharing": 60},
            "trl": {"samples_per_s": 2.0}, "prefix_sharing": {"samples_per_s": 3.0}}
    add_train_mfu(rows, REAL_SHAPES["tiny"], 1e9)
    assert rows["trl"]["mfu"] == pytest.approx(2 * 2 * 100 * 843_776 / 1e9)
    assert rows["prefix_sharing"]["mfu"] == pytest.approx(3 * 2 * 100 * 843_776 / 1e9)
    assert rows["mfu_ratio"] == pytest.approx(1.5)
