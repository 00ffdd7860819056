#!/usr/bin/env python3
"""First contact with a GPU machine: does judgetrain run here as the recipes need it (bf16, prefix sharing, the eval
engine, the memory estimate)? One run, at most 10 minutes on one GPU, one JSON of pass/fail and figures.

    python scripts/gpu_check.py --device cuda --out gpu_check.json [--wheels DIR] [--only CHECK ...] [--budget S]

Run it from the checkout, after ``python scripts/device_kit.py`` made the kit of wheels (``--wheels``; default:
``wheels/`` beside the checkout or inside it): its pinned stack is installed first, offline, where the machine lacks
it. Each check runs under its own time cap, and all of them with the install within ``--budget`` seconds (default
465: one device call of 8 minutes); the script goes on after a failed one, writes one JSON after each, and exits 1
when any check failed. The checks (the GPU questions run before memory and bench):

* ``quickstart``: recipes/quickstart.yaml in bf16 (``--dtype bfloat16 --bf16 true``) for a few steps: it ends 0, logs
  ``prefix_sharing: on`` and finite losses;
* ``prefix_sharing``: a Qwen3-shaped random model (Qwen3-0.6B's layer shape, 4 layers) with LoRA in bf16: the start-up
  probe keeps prefix sharing on, and loss, rewards and gradients equal TRL's own forward within bf16 rounding; with
  sdpa, and with flash-attention 2 when flash_attn is installed (prefix sharing then falls back, named; its TRL loss
  equals sdpa's);
* ``eval_engine``: judgetrain.eval.scoring.ScoringEngine with prefix sharing and merged LoRA against the plain engine
  (both off) on the same requests, fp32 (merged LoRA runs there) and bf16;
* ``memory``: torch.cuda.max_memory_allocated of real DPOTrainer steps against the dry run's estimate
  (judgetrain.checks.memory), within its 10% margin, for the five cases of the first H200 loan (Qwen3-0.6B-shaped LoRA
  and full, checkpointing on and off; Qwen3-1.7B full with checkpointing), each with the allocator's reserved peak and
  the peak of each phase (forward and backward, the optimizer's step);
* ``bench``: ``judgetrain bench --device cuda --only device`` at Qwen3-0.6B and -1.7B (tokens/s, MFU), its JSON kept
  beside this one;
* ``vllm`` (GPU, vLLM installed; a subprocess): the vLLM generation backend on a LoRA model loaded by hub id at a
  pinned commit of a local hub cache whose ``main`` holds other weights: the engine is built at the pinned revision
  and writes what transformers writes, the allocator's cache is emptied before it starts (free memory before and
  after), and sleep mode frees its memory between evals (free memory asleep and awake);
* ``flash_attention``: transformers' own availability of flash-attention 2 and 3 (``is_flash_attn_N_available``), the
  preflight's verdict for each, and whether a model loads with it: the verdict and the load must agree;
* ``tf32``: with fp32 matmuls in tf32 as ``tf32: true`` sets them (transformers, torch's ``fp32_precision``) a
  matmul's error is tf32's, ``compute_dtype`` names tf32, and the prefix-sharing probe of fp32 weights runs at tf32's tolerance and keeps
  prefix sharing on.

``--device cpu`` runs the same checks at tiny shapes in seconds each (tests/test_gpu_check.py runs it, so the script
cannot rot; the memory check then counts live tensors, and the bench check times the tiny shape in process). The last
three are GPU questions: on ``--device cuda`` they run by default, on ``--device cpu`` when named with ``--only`` (their
CPU halves: the flash-attention verdicts against the loads, tf32 not in effect, vLLM skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BF16_EPS = 2.0**-7  # bf16's relative rounding step: the tolerances below are small multiples of it
CAPS = {"cuda": {"quickstart": 120, "prefix_sharing": 60, "eval_engine": 60, "memory": 180, "bench": 200,
                 "vllm": 240, "flash_attention": 60, "tf32": 60},
        "cpu": {"quickstart": 120, "prefix_sharing": 60, "eval_engine": 60, "memory": 60, "bench": 60,
                "vllm": 30, "flash_attention": 60, "tf32": 60}}
GPU_QUESTIONS = ("vllm", "flash_attention", "tf32")  # run by default on cuda only


class CheckTimeout(Exception):
    pass


class CheckFailed(AssertionError):
    pass


class CheckSkipped(Exception):
    """Nothing to check here (a package or the device missing): reported as skipped, with the reason."""


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


# ------------------------------------------------------------------------------------------------- set-up


def ensure_packages(wheels: Path | None) -> dict:
    """The device kit's pinned stack (scripts/device_kit.py: ``requirements.txt`` in the wheels folder), installed
    offline (pip --no-index) when any of it is missing or at another version; without a kit, trl and datasets from
    the folder when missing. What the kit expects the machine to have (torch, numpy, pandas, pyarrow) is checked
    first, so that a machine without them fails here, named, not at the first import of a check."""
    import importlib.metadata as metadata

    kit = wheels / "kit.json" if wheels is not None else None
    out = {"wheels": str(wheels) if wheels is not None else None, "installed_from": None}
    if kit is not None and kit.is_file():
        manifest = json.loads(kit.read_text())
        absent = [n for n in manifest["device_must_have"] if importlib.util.find_spec(n) is None]
        if absent:
            raise SystemExit(f"gpu_check: this machine lacks {', '.join(absent)}, which the kit in {wheels} expects "
                             "the machine to have (too large to carry)")
        pins = [line.split("==") for line in (wheels / "requirements.txt").read_text().split()]
        out["missing"] = [f"{n}=={v}" for n, v in pins if _version(metadata, n) != v]
        if out["missing"]:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                            str(wheels), "-r", str(wheels / "requirements.txt")], check=True)
            out["installed_from"] = str(wheels)
    else:
        out["missing"] = [name for name in ("trl", "datasets") if importlib.util.find_spec(name) is None]
        if out["missing"]:
            if wheels is None or not wheels.is_dir():
                raise SystemExit(f"gpu_check: {', '.join(out['missing'])} not installed and no wheels folder "
                                 "(--wheels DIR; make one with scripts/device_kit.py)")
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels),
                            *out["missing"]], check=True)
            out["installed_from"] = str(wheels)
    importlib.invalidate_caches()
    return out


def _version(metadata, name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(device: str) -> dict:
    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "device": device,
            "cuda": torch.version.cuda, "flash_attn": importlib.util.find_spec("flash_attn") is not None}
    for name in ("transformers", "trl", "peft", "accelerate", "datasets", "deepspeed"):
        with contextlib.suppress(Exception):
            info[name] = __import__(name).__version__
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
    return info


def tiny_tokenizer_dir() -> str:
    from judgetrain.models.tiny import ensure_tiny_judge

    return ensure_tiny_judge()


def qwen3_model(shape: dict, vocab: int, layers: int, dtype, device: str, attn: str = "sdpa"):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(**{**shape, "vocab_size": vocab, "num_hidden_layers": layers}, attn_implementation=attn)
    torch.manual_seed(1)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)


def shapes(device: str) -> dict:
    from judgetrain.bench.gpu import REAL_SHAPES

    if device == "cuda":
        return {"layer": REAL_SHAPES["qwen3-0.6b"], "layers": 4}
    return {"layer": REAL_SHAPES["tiny"], "layers": 2}


def rows(n: int) -> list[dict]:
    rubric = "Grade the recipe for materials, equipment and procedure. " * 8
    return [{"prompt": [{"role": "user", "content": f"{rubric} Recipe {i}: heat at {800 + i} C."}],
             "chosen": [{"role": "assistant", "content": f"score 4: sound procedure {i} " * (2 + i % 3)}],
             "rejected": [{"role": "assistant", "content": f"score 2: missing step {i} " * (1 + i % 2)}]}
            for i in range(n)]


# ------------------------------------------------------------------------------------------------- checks


def check_quickstart(cfg) -> dict:
    out = cfg.work / "quickstart"
    cmd = [sys.executable, "-m", "judgetrain.train", "recipes/quickstart.yaml", "--dtype", "bfloat16", "--bf16", "true",
           "--output_dir", str(out), "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1"]
    if cfg.device == "cuda":
        cmd += ["--max_steps", "8", "--eval_strategy", "steps", "--eval_steps", "8", "--eval_max_rows", "16"]
    else:
        cmd += ["--max_steps", "1", "--use_cpu", "true", "--per_device_train_batch_size", "2", "--eval_suites", "rmbench",
                "--eval_strategy", "steps", "--eval_steps", "1", "--eval_max_rows", "4"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=cfg.cap - 5,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4")})
    log = proc.stdout + proc.stderr
    (cfg.work / "quickstart.log").write_text(log)
    expect(proc.returncode == 0, f"judgetrain.train ended {proc.returncode}: {log[-1500:]}")
    losses = [r["train/loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if "train/loss" in r]
    expect(bool(losses) and all(math.isfinite(x) for x in losses), f"losses {losses}")
    on = [line for line in log.splitlines() if "prefix_sharing: on" in line]
    expect(bool(on), "prefix sharing is not on: " + next((x for x in log.splitlines() if "prefix_sharing" in x), "no line"))
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if any(k.startswith("eval/rmbench/") for k in r)]
    expect(bool(evals), "no eval/rmbench metrics in metrics.jsonl")
    return {"eval": {k: v for k, v in evals[-1].items() if k.startswith("eval/rmbench/total")},"seconds": round(time.perf_counter() - t0, 1), "steps": len(losses), "losses": losses,
            "prefix_sharing_line": on[0].split("judgetrain.trainer.prefix_sharing:")[-1].strip()}


def _dpo_trainer(cls, model, tok, cfg, attn_rows: list[dict]):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig

    args = DPOConfig(output_dir=str(cfg.work / "dpo"), per_device_train_batch_size=3, max_length=512, report_to="none",
                     use_cpu=cfg.device == "cpu", bf16=True, seed=0, beta=0.1)
    peft = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"],
                      init_lora_weights=False, task_type="CAUSAL_LM")
    return cls(model=model, args=args, train_dataset=Dataset.from_list(attn_rows), processing_class=tok,
               peft_config=peft)


def _loss_rewards_grads(trainer):
    trainer.model.train()
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.float().detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return loss.item(), metrics, grads


def check_prefix_sharing(cfg) -> dict:
    import torch
    from trl import DPOTrainer

    from judgetrain.models.loading import load_recipe_tokenizer
    from judgetrain.trainer.dpo import JudgeDPOTrainer
    from judgetrain.trainer.prefix_sharing import probe_tolerance
    from trl import DPOConfig

    tok = load_recipe_tokenizer(tiny_tokenizer_dir(), DPOConfig(output_dir=str(cfg.work), report_to="none",
                                                                use_cpu=cfg.device == "cpu"))
    s = shapes(cfg.device)
    data = rows(6)
    make = lambda attn: qwen3_model(s["layer"], len(tok), s["layers"], torch.bfloat16, cfg.device, attn)  # noqa: E731
    out = {"shape": {**s["layer"], "num_hidden_layers": s["layers"]}, "tolerance": {}}
    torch.manual_seed(0)
    ref = _loss_rewards_grads(_dpo_trainer(DPOTrainer, make("sdpa"), tok, cfg, data))
    torch.manual_seed(0)
    trainer = _dpo_trainer(JudgeDPOTrainer, make("sdpa"), tok, cfg, data)
    expect(trainer.prefix_sharing is True, "prefix sharing turned itself off in bf16 (see the log)")
    mean_tol, max_tol = probe_tolerance(torch.bfloat16)
    stats = trainer.prefix_sharing_stats
    out["probe"] = {"mean_abs_diff": stats["probe_mean_abs_diff"], "max_abs_diff": stats["probe_max_abs_diff"],
                    "allowed": [mean_tol, max_tol], "route": stats["probe_route"],
                    "chosen_mean_abs_diff": stats["probe_chosen_mean_abs_diff"],
                    "rejected_mean_abs_diff": stats["probe_rejected_mean_abs_diff"]}
    shared = _loss_rewards_grads(trainer)
    out["sdpa"] = _compare(ref, shared)
    out["tolerance"] = {"loss_rel": 4 * BF16_EPS, "rewards_abs": 8 * BF16_EPS, "grad_rel_to_max": 8 * BF16_EPS}
    expect(out["sdpa"]["loss_rel_diff"] <= 4 * BF16_EPS, f"loss differs from TRL's: {out['sdpa']}")
    expect(out["sdpa"]["rewards_max_abs_diff"] <= 8 * BF16_EPS, f"rewards differ from TRL's: {out['sdpa']}")
    expect(out["sdpa"]["grad_max_rel_diff"] <= 8 * BF16_EPS, f"gradients differ from TRL's: {out['sdpa']}")
    if cfg.device == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        torch.manual_seed(0)
        flash = _dpo_trainer(JudgeDPOTrainer, make("flash_attention_2"), tok, cfg, data)
        got = _loss_rewards_grads(flash)
        out["flash_attention_2"] = {"prefix_sharing": flash.prefix_sharing, **_compare(ref, got)}
        expect(out["flash_attention_2"]["loss_rel_diff"] <= 4 * BF16_EPS, f"flash-attention loss: {out['flash_attention_2']}")
    else:
        out["flash_attention_2"] = "flash_attn is not installed" if cfg.device == "cuda" else "CPU: not applicable"
    return out


def _compare(ref, got) -> dict:
    (loss_a, met_a, grad_a), (loss_b, met_b, grad_b) = ref, got
    expect(bool(grad_a) and set(grad_a) == set(grad_b), "different parameters got gradients")
    rel = max(((grad_b[n] - g).abs().max() / g.abs().max().clamp(min=1e-8)).item() for n, g in grad_a.items())
    rewards = max(abs(met_b[k] - met_a[k]) for k in ("rewards/chosen", "rewards/rejected", "rewards/margins"))
    return {"loss_trl": loss_a, "loss": loss_b, "loss_rel_diff": abs(loss_b - loss_a) / max(abs(loss_a), 1e-8),
            "rewards_max_abs_diff": rewards, "grad_max_rel_diff": rel}


def check_eval_engine(cfg) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model

    from judgetrain.eval.scoring import Request, ScoringEngine
    from judgetrain.models.loading import load_recipe_tokenizer
    from trl import DPOConfig

    tok = load_recipe_tokenizer(tiny_tokenizer_dir(), DPOConfig(output_dir=str(cfg.work), report_to="none",
                                                                use_cpu=cfg.device == "cpu"))
    s = shapes(cfg.device)
    requests = [Request("implicit", prompt=r["prompt"], responses=[r["chosen"], r["rejected"], r["chosen"]])
                for r in rows(8)]
    out = {}
    for dtype, rtol in ((torch.float32, 1e-4), (torch.bfloat16, 8 * BF16_EPS)):
        model = get_peft_model(qwen3_model(s["layer"], len(tok), s["layers"], dtype, cfg.device),
                               LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
        model.eval()
        scores, seconds, stats = {}, {}, {}
        for fast in (True, False):
            engine = ScoringEngine(model, tok, prefix_sharing=fast, merge_lora=fast, max_length=1024)
            t0 = time.perf_counter()
            scores[fast] = [x for r in engine.score_requests(requests) for x in r.scores]
            seconds[fast] = time.perf_counter() - t0
            stats[fast] = engine.stats.shared_prompts
        diff = max(abs(a - b) / max(abs(b), 1.0) for a, b in zip(scores[True], scores[False]))
        name = str(dtype).removeprefix("torch.")
        out[name] = {"max_rel_score_diff": diff, "allowed": rtol, "shared_prompts": stats[True],
                     "seconds_fast": round(seconds[True], 3), "seconds_plain": round(seconds[False], 3)}
        expect(stats[True] > 0, f"{name}: the engine shared no prompt")
        expect(diff <= rtol, f"{name}: the fast engine differs from the plain one by {diff:.2e} (allowed {rtol:.1e})")
        del model
    return out


def check_memory(cfg) -> dict:
    from judgetrain.bench.gpu import random_model_folder
    from judgetrain.bench.memory import check
    from judgetrain.checks.memory import ESTIMATE_MARGIN

    tok = tiny_tokenizer_dir()
    if cfg.device == "cuda":
        # the five cases of the first H200 loan (docs/scale.md), so that a new card's figures compare with them
        cases = [("qwen3-0.6b", 16, False), ("qwen3-0.6b", 16, True), ("qwen3-0.6b", None, False),
                 ("qwen3-0.6b", None, True), ("qwen3-1.7b", None, True)]
        words, margin = 1000, (-ESTIMATE_MARGIN, ESTIMATE_MARGIN)
    else:
        cases = [("tiny", 16, False), ("tiny", None, True)]
        words, margin = 100, (-0.05, 0.30)  # the tiny judge: CPU LM-head tiles weigh most there
    out = []
    for name, lora_r, ckpt in cases:  # all cases measured before any verdict: one failure must not hide the rest
        folder = random_model_folder(name, tok, cfg.work / f"model-{name}")
        got = check(folder, lora_r=lora_r, checkpointing=ckpt, bf16=True, words=words, steps=2,
                    output_dir=str(cfg.work / f"mem-{name}-{lora_r}-{ckpt}"), device=cfg.device)
        got["shape"] = name
        out.append(got)
        if cfg.device == "cuda":
            import torch

            torch.cuda.empty_cache()
    for got in out:
        name, lora_r, ckpt = got["shape"], got["lora_r"], got["checkpointing"]
        expect(margin[0] <= got["error"] <= margin[1],
               f"{name} lora_r={lora_r} checkpointing={ckpt}: estimate {got['estimated_mib']} MiB against measured "
               f"{got['measured_mib']} MiB ({got['error']:+.0%}; allowed {margin[0]:+.0%} to {margin[1]:+.0%})")
    return {"cases": out, "allowed_error": margin}


def check_bench(cfg) -> dict:
    if cfg.device == "cpu":  # the code path of the device bench at the tiny shape, in process
        import torch

        from judgetrain.bench.gpu import device_bench_generation, device_bench_shape, measure_matmul_rate

        peak = measure_matmul_rate("cpu", torch.bfloat16, n=256, seconds=0.2)
        got = device_bench_shape("tiny", "cpu", torch.bfloat16, 64, 2, 2, 1, 4, peak)
        expect(got["train_tokens_per_s"] > 0 and got["train_mfu"] > 0, f"bench figures: {got}")
        gen = device_bench_generation("tiny", "cpu", torch.float32, tiny_tokenizer_dir(), cfg.work, prompts=2,
                                      prompt_words=12, new_tokens=4)
        expect(gen["static_cache"]["static_cache_batches"] > 0 and gen["dynamic_cache"]["static_cache_batches"] == 0,
               f"generation figures: {gen}")
        return {"tiny": {**{k: got[k] for k in ("train_tokens_per_s", "train_mfu", "eval_tokens_per_s", "eval_mfu")},
                         "generation": gen}}
    report = cfg.work / "bench.json"
    # Qwen3-0.6B and -1.7B (the 8B default is a bench of its own: building and initialising it alone took most of
    # the first loan's 180 s), few steps, a 1 s matmul probe
    cmd = [sys.executable, "-m", "judgetrain.cli", "bench", "--device", "cuda", "--only", "device",
           "--shapes", "qwen3-0.6b", "qwen3-1.7b", "--prefix-sharing-shapes", "qwen3-0.6b", "qwen3-1.7b",
           "--device-steps", "3", "--device-warmup", "1", "--matmul-seconds", "1", "--repeats", "1", "--warmup", "0",
           "--train-steps", "2", "--output", str(report)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=cfg.cap - 5)
    (cfg.work / "bench.log").write_text(proc.stdout + proc.stderr)
    expect(proc.returncode == 0, f"judgetrain bench ended {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}")
    device = json.loads(report.read_text())["device_bench"]
    out = {name: {**{k: v.get(k) for k in ("train_tokens_per_s", "train_mfu", "eval_tokens_per_s", "eval_mfu",
                                           "train_peak_gpu_mb", "train_peak_estimated_mb")},
                  "eval_sharing": v.get("eval_sharing"), "generation": v.get("generation")}
           for name, v in device["shapes"].items()}
    for name, shapes_ in (device.get("prefix_sharing") or {}).items():  # prefix-shared DPO against TRL's, bf16
        out.setdefault(name, {})["prefix_sharing_vs_trl"] = {
            rows_: {side: {k: figs[side].get(k) for k in ("samples_per_s", "tokens_per_s", "mfu", "peak_gpu_mb")}
                    for side in ("trl", "prefix_sharing")} | {"mfu_ratio": figs.get("mfu_ratio")}
            for rows_, figs in shapes_.items()}
    return out


VLLM_CHILD = r"""
import json, sys, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from judgetrain.eval.generate import Generator
repo, pinned, main = sys.argv[1:4]
prompts = [[{"role": "user", "content": f"Grade recipe {i}: heat the alloy at {700 + 37 * i} C for {i + 1} h."}]
           for i in range(8)]
tok = AutoTokenizer.from_pretrained(repo, revision=pinned)
model = AutoModelForCausalLM.from_pretrained(repo, revision=pinned, dtype=torch.float32).cuda()
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                                         revision=pinned)).eval()
hf = Generator(model, tok, max_new_tokens=16).generate(prompts)
junk = torch.empty(2**30, dtype=torch.uint8, device="cuda"); del junk  # freed training memory, held in the cache
cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
gen = Generator(model, tok, max_new_tokens=16, backend="vllm", model_revision=pinned,
                vllm_kwargs={"gpu_memory_utilization": 0.3, "enable_sleep_mode": True})
first = gen.generate(prompts)
engine = gen._vllm
config = engine.llm.llm_engine.vllm_config.model_config
out = {"revision": config.revision, "tokenizer_revision": getattr(config, "tokenizer_revision", None),
       "cached_gib_before_start": cached / 2**30,
       "cached_gib_after_start": (torch.cuda.memory_reserved() - torch.cuda.memory_allocated()) / 2**30,
       "equal_rows": sum(a.token_ids == b.token_ids for a, b in zip(first, hf)), "rows": len(prompts)}
out["slept"] = gen.release()
second = gen.generate(prompts)  # wakes the engine
out["equal_rows_after_wake"] = sum(a.token_ids == b.token_ids for a, b in zip(second, hf))
out["memory"] = dict(engine.memory)
print("VLLM_CHECK " + json.dumps(out))
"""


def _hub_cache(root: Path, repo: str, shape: dict, tok_dir: str) -> tuple[str, str]:
    """A hub cache (HF_HUB_CACHE) of ``repo`` with two snapshots of different weights; refs/main names the other."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    main, pinned = "a" * 40, "b" * 40
    tok = AutoTokenizer.from_pretrained(tok_dir)
    config = Qwen3Config(**{**shape, "vocab_size": max(shape["vocab_size"], len(tok))})
    config.architectures = ["Qwen3ForCausalLM"]
    folder = root / ("models--" + repo.replace("/", "--"))
    for commit, seed in ((main, 1), (pinned, 2)):
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder / "snapshots" / commit)
        tok.save_pretrained(folder / "snapshots" / commit)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(main)
    return main, pinned


def check_vllm(cfg) -> dict:
    """The vLLM backend on a GPU: pinned revision, the allocator's cache emptied before the engine, sleep mode."""
    if cfg.device != "cuda":
        raise CheckSkipped("vLLM's GPU engine: CUDA only (the engine's arguments are tested on CPU)")
    if importlib.util.find_spec("vllm") is None:
        raise CheckSkipped("vllm is not installed")
    from judgetrain.bench.gpu import REAL_SHAPES

    repo, hub = "judgetrain-check/judge", cfg.work / "hub"
    main, pinned = _hub_cache(hub, repo, {**REAL_SHAPES["qwen3-0.6b"], "num_hidden_layers": 4}, tiny_tokenizer_dir())
    proc = subprocess.run([sys.executable, "-c", VLLM_CHILD, repo, pinned, main], cwd=REPO, capture_output=True,
                          text=True, timeout=cfg.cap - 10, env={**os.environ, "HF_HUB_CACHE": str(hub),
                                                                "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    (cfg.work / "vllm.log").write_text(proc.stdout + proc.stderr)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("VLLM_CHECK ")), None)
    expect(proc.returncode == 0 and line is not None, f"the vLLM child ended {proc.returncode}: "
                                                       f"{(proc.stdout + proc.stderr)[-1500:]}")
    out = json.loads(line.removeprefix("VLLM_CHECK "))
    mem = out["memory"]
    expect(out["revision"] == pinned, f"the engine loaded revision {out['revision']}, not the pinned {pinned}")
    expect(out["cached_gib_after_start"] < out["cached_gib_before_start"],
           f"the allocator's cache was not emptied before the engine started: {out}")
    expect(out["equal_rows"] >= out["rows"] - 1, f"vLLM wrote other tokens than transformers: {out}")
    expect(out["slept"] and mem["free_gib_asleep"] > mem["free_gib_after"], f"sleep mode freed nothing: {mem}")
    expect(out["equal_rows_after_wake"] == out["equal_rows"], f"after wake_up the engine writes otherwise: {out}")
    return out


def check_flash_attention(cfg) -> dict:
    """transformers' availability of flash-attention 2/3, the preflight's verdict, and a model load with each."""
    import torch
    from transformers.utils import import_utils

    from judgetrain.checks.preflight import attention_problem

    s = shapes(cfg.device)
    out = {}
    for version in ("2", "3"):
        attn = f"flash_attention_{version}"
        got = {"transformers_available": getattr(import_utils, f"is_flash_attn_{version}_available")(),
               "kernels_installed": importlib.util.find_spec("kernels") is not None,
               "preflight_problem": attention_problem(attn)}
        try:
            model = qwen3_model(s["layer"], 512, s["layers"], torch.bfloat16, cfg.device, attn)
            ids = torch.randint(0, 512, (2, 64), device=cfg.device)
            with torch.no_grad():
                flash = model(ids).logits.float()
                model.set_attn_implementation("sdpa")
                sdpa = model(ids).logits.float()
            got["loads"], got["logits_max_abs_diff_vs_sdpa"] = True, (flash - sdpa).abs().max().item()
            del model
        except Exception as e:  # noqa: BLE001 - the load's refusal is the figure
            got["loads"], got["load_error"] = False, f"{type(e).__name__}: {str(e)[:300]}"
        out[attn] = got
        expect((got["preflight_problem"] is None) == got["loads"],
               f"{attn}: the preflight says {got['preflight_problem']!r} but the model "
               f"{'loads' if got['loads'] else 'does not load'}")
        if got["loads"]:
            expect(got["logits_max_abs_diff_vs_sdpa"] <= 0.1, f"{attn}: logits differ from sdpa: {got}")
    return out


def check_tf32(cfg) -> dict:
    """fp32 matmuls in tf32 as a recipe's ``tf32: true`` sets them (transformers, through torch's fp32_precision): their
    error, compute_dtype's name for it, and the prefix-sharing probe of fp32 weights at tf32's tolerance."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig

    from judgetrain.models.loading import load_recipe_tokenizer
    from judgetrain.trainer.dpo import JudgeDPOTrainer
    from judgetrain.trainer.prefix_sharing import compute_dtype, probe_tolerance

    previous = getattr(torch.backends, "fp32_precision", None)
    try:
        args = DPOConfig(output_dir=str(cfg.work / "tf32"), per_device_train_batch_size=2, max_length=512,
                         report_to="none", use_cpu=cfg.device == "cpu", bf16=False,
                         tf32=True if cfg.device == "cuda" else None)
        a, b = (torch.randn(512, 512, generator=torch.Generator().manual_seed(i)).to(cfg.device) for i in (0, 1))
        exact = a.double() @ b.double()
        rel = ((a @ b).double() - exact).abs().max().item() / exact.abs().max().item()
        dtype, name = compute_dtype(torch.float32, torch.device(cfg.device))
        out = {"fp32_precision": previous and torch.backends.fp32_precision, "matmul_rel_error": rel,
               "compute_dtype": name}
        tok = load_recipe_tokenizer(tiny_tokenizer_dir(), args)
        s = shapes(cfg.device)
        trainer = JudgeDPOTrainer(model=qwen3_model(s["layer"], len(tok), s["layers"], torch.float32, cfg.device),
                                          args=args, train_dataset=Dataset.from_list(rows(4)), processing_class=tok,
                                          peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"],
                                                                 task_type="CAUSAL_LM"))
        stats = trainer.prefix_sharing_stats
        out["probe"] = {"compute_dtype": stats.get("probe_compute_dtype"), "max_abs_diff": stats["probe_max_abs_diff"],
                        "mean_abs_diff": stats["probe_mean_abs_diff"], "allowed": probe_tolerance(dtype),
                        "route": stats.get("probe_route"),
                        "prefix_sharing": trainer.prefix_sharing}
    finally:
        if previous is not None:
            torch.backends.fp32_precision = previous
    want = "tf32" if cfg.device == "cuda" else "float32"
    expect(name == want and out["probe"]["compute_dtype"] == want, f"compute dtype {name}, probe's "
                                                                   f"{out['probe']['compute_dtype']}; want {want}")
    expect(trainer.prefix_sharing is True, f"the probe turned prefix sharing off: {out['probe']}")
    if cfg.device == "cuda":  # tf32 in effect: its rounding shows, far beyond fp32's
        expect(rel > 1e-5, f"fp32 matmul error {rel:.1e}: tf32 is not in effect")
    return out


# In the order they run: the short GPU questions before the long memory and bench checks, vLLM (rarely installed) last
CHECKS = {"quickstart": check_quickstart, "prefix_sharing": check_prefix_sharing, "eval_engine": check_eval_engine,
          "flash_attention": check_flash_attention, "tf32": check_tf32, "memory": check_memory, "bench": check_bench,
          "vllm": check_vllm}
BUDGET_S = 465  # the whole run, the kit's install included: one device call of 8 minutes, less a margin


# ------------------------------------------------------------------------------------------------- driver


def run_check(name: str, cfg) -> dict:
    """One check under its time cap (SIGALRM; a subprocess has its own timeout): pass/fail, seconds, figures."""
    def on_alarm(signum, frame):
        raise CheckTimeout(f"over its cap of {cfg.cap} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(cfg.cap)
    t0 = time.perf_counter()
    try:
        figures = CHECKS[name](cfg)
        result = {"ok": True, "figures": figures}
    except CheckSkipped as e:
        result = {"ok": True, "skipped": str(e)}
    except (CheckFailed, CheckTimeout, subprocess.TimeoutExpired) as e:
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # a crash is a failed check, the others still run
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["cap_s"] = cfg.cap
    if cfg.device == "cuda":
        import torch

        torch.cuda.empty_cache()
    return result


def default_wheels() -> Path | None:
    return next((p for p in (REPO.parent / "wheels", REPO / "wheels") if p.is_dir()), None)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", default="gpu_check.json", help="the JSON report (default: gpu_check.json)")
    p.add_argument("--wheels", type=Path, default=None, help="folder of wheels for trl / datasets (offline install)")
    p.add_argument("--only", nargs="+", choices=list(CHECKS), default=None,
                   help="the checks to run (default: all on cuda; on cpu all but " + ", ".join(GPU_QUESTIONS) + ")")
    p.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--budget", type=int, default=BUDGET_S,
                   help=f"seconds for the whole run, the install included (default {BUDGET_S}): a check gets its cap "
                        "or what is left, whichever is less; one with under 10 s left is recorded as not run")
    return p.parse_args(argv)


def run(args) -> int:
    started = time.perf_counter()
    setup = ensure_packages(args.wheels or default_wheels())
    setup["seconds"] = round(time.perf_counter() - started, 1)
    sys.path.insert(0, str(REPO))
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no CUDA device (or pass --device cpu)", file=sys.stderr)
        return 2
    report = {"environment": environment(args.device), "setup": setup, "checks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        only = args.only or [c for c in CHECKS if args.device == "cuda" or c not in GPU_QUESTIONS]
        for name in only:
            left = int(args.budget - (time.perf_counter() - started))
            if left < 10:
                report["checks"][name] = result = {"ok": False, "error": f"not run: the budget of {args.budget} s "
                                                   "was spent", "seconds": 0.0, "cap_s": 0}
            else:
                cfg = argparse.Namespace(device=args.device, work=work, cap=min(CAPS[args.device][name], left))
                report["checks"][name] = result = run_check(name, cfg)
            print(f"gpu_check: {name}: {'pass' if result['ok'] else 'FAIL ' + result['error'][:300]} "
                  f"({result['seconds']} s)", file=sys.stderr, flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        report["seconds"] = round(time.perf_counter() - t0, 1)
        report["seconds_with_setup"] = round(time.perf_counter() - started, 1)
        report["ok"] = all(r["ok"] for r in report["checks"].values())
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"gpu_check: {'all passed' if report['ok'] else 'FAILED'}; {args.out}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(run(parse()))
