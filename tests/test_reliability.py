"""Fault injection on real runs of the tiny judge: SIGKILL at several points then --resume auto, SIGTERM to the
training process and to the `accelerate launch` parent, NaN/inf gradients from a real (absurd) learning rate.

Every run here is one process started as users start it (`python -m judgetrain.train` / `accelerate launch`), on a
small recipe (judgebias only, batch 2, 6 steps, checkpoints every 2, eval of 32 rows at step 4 and at the end)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import QUICKSTART, REPO, check_report

MAX_STEPS = 6


def small_recipe(path: Path, extra: str = "") -> str:
    text = QUICKSTART.read_text()
    text = text.replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", "")
    text = text.replace("eval_suites: [rmbench, judgebias, ideation]", "eval_suites: [judgebias]")
    text = text.replace("per_device_train_batch_size: 8", "per_device_train_batch_size: 2")
    text += f"\nmax_steps: {MAX_STEPS}\nsave_steps: 2\nlogging_steps: 1\neval_steps: 4\neval_max_rows: 32\n"
    text += "eval_scoring: implicit\neval_on_start: false\n" + extra  # no start eval: the evals at steps 4 and 8
    path.write_text(text)
    return str(path)


def records(run_dir) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written right now
    return out


def train_steps(run_dir) -> list[int]:
    return [r["step"] for r in records(run_dir) if "train/loss" in r]


def start(args, log: Path, *, launcher=None) -> subprocess.Popen:
    cmd = (launcher or [sys.executable]) + ["-m", "judgetrain.train", *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def run_to_end(args, log: Path, timeout=600) -> str:
    proc = start(args, log)
    rc = proc.wait(timeout=timeout)
    text = log.read_text(errors="replace")
    assert rc == 0, text[-6000:]
    return text


def wait_for(cond, proc, timeout=300, poll=0.002):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    return False


def kill(proc):
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def adapter(run_dir):
    return load_file(str(Path(run_dir) / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return small_recipe(tmp_path_factory.mktemp("recipe") / "small.yaml")


@pytest.fixture(scope="module")
def reference(recipe, tmp_path_factory):
    """The one uninterrupted run every interrupted run must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    run_to_end([recipe, "--output_dir", str(out)], out.parent / "reference.log")
    assert train_steps(out) == list(range(1, MAX_STEPS + 1))
    return out


def test_sigkill_mid_step_during_eval_and_during_checkpoint_save_then_resume_matches_uninterrupted(
    recipe, reference, tmp_path
):
    run = tmp_path / "run"
    args = [recipe, "--output_dir", str(run)]
    resume = args + ["--resume", "auto"]
    kills = []

    # 1. mid-step: checkpoint-2 is complete, step 3 is being computed
    log1 = tmp_path / "1.log"
    proc = start(args, log1)
    assert wait_for(lambda: (run / "checkpoint-2" / "judgetrain_complete.json").exists(), proc), log1.read_text()[-3000:]
    time.sleep(0.1)
    kill(proc)
    assert not (run / "checkpoint-4").exists()
    kills.append("mid-step 3")

    # 2. during the step-4 evaluation (its start is logged; scoring 32 rows, 64 responses, takes a second or more
    # even on a quiet machine, and the kill follows the log line at once)
    log2 = tmp_path / "2.log"
    proc = start(resume, log2)
    assert wait_for(lambda: "Evaluating judgebias at step 4" in log2.read_text(errors="replace"), proc), log2.read_text()[-3000:]
    kill(proc)
    assert "Resuming from" in log2.read_text() and "checkpoint-2" in log2.read_text()
    assert not (run / "checkpoint-4").exists(), "the kill came after the eval"
    kills.append("eval at step 4")

    # 3. during the checkpoint-4 save: the folder exists, its completion marker does not yet
    log3 = tmp_path / "3.log"
    proc = start(resume, log3)
    ckpt4 = run / "checkpoint-4"
    assert wait_for(lambda: ckpt4.is_dir(), proc, poll=0.0005), log3.read_text()[-3000:]
    kill(proc)
    assert not (ckpt4 / "judgetrain_complete.json").exists(), "the save finished before the kill (window missed)"
    kills.append("checkpoint-4 save")

    # resume: the torn checkpoint-4 is reported and passed over; the run finishes
    log4 = tmp_path / "4.log"
    text = run_to_end(resume, log4)
    assert "Skipping incomplete checkpoint" in text and "checkpoint-4" in text, text[-4000:]
    assert "no completion marker" in text
    assert f"Resuming from {run / 'checkpoint-2'}" in text

    a, b = adapter(reference), adapter(run)
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-6, msg=k)
    # every step logged exactly once, with the reference's losses; each eval once
    assert train_steps(run) == list(range(1, MAX_STEPS + 1))
    ref_loss = [r["train/loss"] for r in records(reference) if "train/loss" in r]
    run_loss = [r["train/loss"] for r in records(run) if "train/loss" in r]
    assert run_loss == pytest.approx(ref_loss, rel=1e-4, abs=1e-6)
    evals = [r["step"] for r in records(run) if "eval/judgebias/error/accuracy" in r]
    assert evals == [r["step"] for r in records(reference) if "eval/judgebias/error/accuracy" in r] == [4, MAX_STEPS]
    assert len(records(run)) == len(records(reference))
    assert all((run / f"checkpoint-{s}" / "judgetrain_complete.json").is_file() for s in (4, 6))
    assert len(kills) == 3
    # and the report of the killed-then-resumed run draws the reference's train curve, each step once
    paths, html, _, _ = check_report(run, tmp_path / "report")
    assert "train_curves.png" in paths and "status" in html


def test_resuming_a_finished_run_trains_no_step_past_max_steps(recipe, reference, tmp_path):
    """A requeued job whose run had finished resumes from the checkpoint at max_steps: Trainer's loop would train one
    step past it; judgetrain trains none and writes the final model from that checkpoint again."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = len(records(run))
    (run / "judgetrain_complete.json").unlink()  # as if killed between the last checkpoint and the final save
    (run / "adapter_model.safetensors").unlink()
    text = run_to_end([recipe, "--output_dir", str(run), "--resume", "auto"], tmp_path / "resume.log")
    assert f"step {MAX_STEPS} is the run's last (max_steps {MAX_STEPS}): nothing left to train" in text, text[-4000:]
    assert not (run / f"checkpoint-{MAX_STEPS + 1}").exists()
    assert train_steps(run) == list(range(1, MAX_STEPS + 1))
    assert len(records(run)) == before  # no train, eval or summary record added
    assert (run / "judgetrain_complete.json").is_file()
    a, b = adapter(reference), adapter(run)
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        assert torch.equal(a[k], b[k]), k
    status = [json.loads(line) for line in (run / "judgetrain_status.jsonl").read_text().splitlines()]
    assert status[-1]["status"] == "finished" and status[-1]["exit_code"] == 0 and status[-1]["step"] == MAX_STEPS


def test_a_resume_logs_evaluates_and_saves_at_the_intervals_it_was_resumed_with(recipe, reference, tmp_path):
    """Trainer restores the checkpoint's logging / eval / save steps with its state; judgetrain applies the resumed
    recipe's again (they may change on resume), says so, and the run evaluates and saves at the new steps."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    for name in ("checkpoint-4", "checkpoint-6"):  # as if killed after checkpoint-2
        shutil.rmtree(run / name, ignore_errors=True)
    for name in ("judgetrain_complete.json", "adapter_model.safetensors"):
        (run / name).unlink()
    assert (run / "checkpoint-2" / "judgetrain_complete.json").is_file()
    text = run_to_end([recipe, "--output_dir", str(run), "--resume", "auto", "--eval_steps", "3", "--save_steps", "3"],
                      tmp_path / "resume.log")
    assert ("resumed at step 2 with the recipe's eval_steps 3 (the checkpoint had 4), save_steps 3 (the checkpoint "
            "had 2)") in text, text[-4000:]
    assert (run / "checkpoint-3" / "judgetrain_complete.json").is_file() and not (run / "checkpoint-4").exists()
    evals = sorted({r["step"] for r in records(run) if any(k.startswith("eval/") for k in r)})
    assert 3 in evals and 4 not in evals, evals


def _wait_exit(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(proc)
        raise AssertionError(f"the run did not stop within {timeout}s of the signal")


def _assert_stopped_with_checkpoint(run, text):
    assert "SIGTERM received" in text, text[-4000:]
    line = next(l for l in text.splitlines() if "Stopped by SIGTERM at step" in l)
    ckpt = Path(line.split("checkpoint saved to ")[1].split(";")[0])
    assert ckpt.parent == run and (ckpt / "judgetrain_complete.json").is_file(), line
    marker = json.loads((ckpt / "judgetrain_complete.json").read_text())
    assert marker["verification"] == "sha256" and "unhashed" not in marker  # hashed well inside the stop window
    step = int(ckpt.name.split("-")[1])
    assert max(train_steps(run)) == step  # stopped at the checkpointed step
    assert not (run / "adapter_model.safetensors").exists(), "a stopped run must not pose as finished"
    assert not (run / "eval").exists(), "no evaluation after the signal"
    return step


def test_sigterm_to_the_training_process_saves_a_checkpoint_and_says_where(tmp_path):
    recipe = small_recipe(tmp_path / "r.yaml", extra="max_steps: 40\nsave_steps: 100\neval_steps: 0\n")
    run, log = tmp_path / "run", tmp_path / "term.log"
    proc = start([recipe, "--output_dir", str(run)], log)
    assert wait_for(lambda: train_steps(run), proc, poll=0.05), log.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    logged = max(train_steps(run))  # read after the signal: at least the steps done when it arrived
    assert _wait_exit(proc, 120) == 143  # preempted: a scheduler requeues it (docs/reliability.md: Exit codes)
    step = _assert_stopped_with_checkpoint(run, log.read_text())
    assert logged <= step <= logged + 1 < 40  # the step in flight finishes; none starts after the signal


def test_sigterm_to_the_accelerate_launch_parent_reaches_the_training_process(tmp_path):
    """accelerate's one-process launcher does not forward signals: without judgetrain's parent-death signal the
    training process ran on, orphaned, to the end of the run."""
    recipe = small_recipe(tmp_path / "r.yaml", extra="max_steps: 40\nsave_steps: 100\neval_steps: 0\n")
    run, log = tmp_path / "run", tmp_path / "term.log"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    parent = start([recipe, "--output_dir", str(run)], log, launcher=launcher)
    assert wait_for(lambda: train_steps(run), parent, poll=0.05), log.read_text()[-3000:]
    os.kill(parent.pid, signal.SIGTERM)  # the parent only, as a scheduler does
    parent.wait(timeout=60)
    # the child writes its stop message to the same log once its checkpoint is complete
    deadline = time.time() + 120
    while time.time() < deadline and "Stopped by SIGTERM" not in log.read_text(errors="replace"):
        time.sleep(0.2)
    time.sleep(1)
    try:
        step = _assert_stopped_with_checkpoint(run, log.read_text(errors="replace"))
    finally:
        os.killpg(parent.pid, signal.SIGKILL) if _group_alive(parent.pid) else None
    assert step < 40


def _group_alive(pgid) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_nan_gradient_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    """Real fault: learning_rate 1e30 (warmup 5 steps: lr 0 at step 1, 2e29 at step 2) with clipping off blows the
    LoRA weights up at step 2; the gradient of step 3 is NaN."""
    recipe = small_recipe(tmp_path / "r.yaml", extra="eval_steps: 0\n")
    run, log = tmp_path / "run", tmp_path / "nan.log"
    proc = start([recipe, "--output_dir", str(run), "--learning_rate", "1e30", "--max_grad_norm", "1e38"], log)
    rc = _wait_exit(proc, 300)
    text = log.read_text(errors="replace")
    assert rc == 3, text[-4000:]
    # the per-step loss is checked too (Trainer's logging_nan_inf_filter hides a NaN loss from the logs)
    assert "Non-finite loss and gradient at step 3: stopping" in text
    assert "Traceback" not in text
    # the last good checkpoint is complete and finite; nothing was written from the bad state
    good = run / "checkpoint-2"
    assert (good / "judgetrain_complete.json").is_file()
    assert all(torch.isfinite(t).all() for t in load_file(str(good / "adapter_model.safetensors")).values())
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (run / "adapter_model.safetensors").exists() and not (run / "eval").exists()
    assert train_steps(run) == [1, 2]
    from judgetrain.run.checkpoints import find_resume_checkpoint

    assert find_resume_checkpoint(str(run)) == str(good)


def test_nonfinite_skip_drops_and_counts_the_bad_batches_and_keeps_the_weights_finite(tmp_path):
    recipe = small_recipe(tmp_path / "r.yaml", extra="eval_steps: 0\nnonfinite: skip\nmax_steps: 4\nsave_steps: 100\n")
    run, log = tmp_path / "run", tmp_path / "skip.log"
    text = run_to_end([recipe, "--output_dir", str(run), "--learning_rate", "1e30", "--max_grad_norm", "1e38",
                       "--eval_suites", "none"], log)
    assert "Non-finite loss and gradient at step 3: batch skipped" in text
    assert "2 batches with a non-finite loss or gradient were skipped (steps [3, 4])" in text
    weights = adapter(run)
    assert weights and all(torch.isfinite(t).all() for t in weights.values())
    grad_norms = {r["step"]: r["train/grad_norm"] for r in records(run) if "train/grad_norm" in r}
    assert sorted(grad_norms) == [1, 2, 3, 4], grad_norms
    assert all(math.isfinite(grad_norms[s]) and grad_norms[s] > 0 for s in (1, 2)), grad_norms  # before the blow-up
    assert all(not math.isfinite(grad_norms[s]) for s in (3, 4)), grad_norms  # logged as they were, then skipped


def test_nonfinite_guard_stops_on_a_logged_nan_loss(tmp_path):
    """The logging path (a NaN loss with finite gradients): Trainer's real state/control objects."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from judgetrain.trainer.callbacks import NonFiniteGuard, RunStopped

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state = TrainerState()
    state.global_step = 7
    guard = NonFiniteGuard("stop")
    guard.on_log(args, state, TrainerControl(), logs={"loss": 0.5, "grad_norm": 1.0})
    with pytest.raises(RunStopped, match="Non-finite loss at step 7"):
        guard.on_log(args, state, TrainerControl(), logs={"loss": float("nan"), "grad_norm": 1.0})
    with pytest.raises(RunStopped, match="grad_norm at step 7"):
        NonFiniteGuard("stop").on_log(args, state, TrainerControl(), logs={"loss": 1.0, "grad_norm": float("inf")})
