"""Two machines on localhost: two `accelerate launch` processes (num_machines 2, machine ranks 0 and 1, one process
each) rendezvous on 127.0.0.1, train, are killed, resume with --resume auto, and match one machine with 2 processes.

The recipe is the quickstart cut to what a CI machine affords: judgebias only, batch 2 per process, 6 steps, an eval
of 12 rows of each suite every 3 steps, a checkpoint every 3 steps. Tolerance: float reduction order only (the same
global batches, gradients averaged over the same 2 ranks): rel 2e-3 on losses, rewards and eval margins; accuracies
equal. The SLURM script is checked with stand-ins for srun / scontrol that print what each task would run."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STEPS, EVERY = 6, 3
TOL = dict(rel=2e-3, abs=2e-3)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recipe(path: Path) -> str:
    text = (REPO / "recipes" / "quickstart.yaml").read_text()
    text = text.replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", "")
    text = text.replace("eval_suites: [rmbench, judgebias, ideation]", "eval_suites: [rmbench, judgebias]")
    text = text.replace("eval_max_rows: null", "eval_max_rows: 12")
    text = text.replace("per_device_train_batch_size: 8", "per_device_train_batch_size: 2")
    text += (f"\nmax_steps: {STEPS}\nsave_steps: {EVERY}\nlogging_steps: 1\neval_every_n_steps: {EVERY}\n"
             "lr_scheduler_type: constant\nwarmup_steps: 0\n")
    path.write_text(text)
    return str(path)


def _launch(config: str, recipe: str, out: Path, log: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "--mixed_precision", "no",
           *extra, "-m", "judgetrain.train", recipe, "--output_dir", str(out), "--resume", "auto"]
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def _two_machines(recipe: str, out: Path, logs: Path) -> list[subprocess.Popen]:
    port = _port()
    return [
        _launch("accelerate_configs/multinode_ddp.yaml", recipe, out, logs / f"machine{rank}.log",
                "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
                "--main_process_ip", "127.0.0.1", "--main_process_port", str(port))
        for rank in (0, 1)
    ]


def _wait(procs, timeout=600) -> None:
    for p in procs:
        p.wait(timeout=timeout)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _kill_machines(procs) -> None:
    """A crash of both machines: the training processes first, then their launchers (SIGKILL, no checkpoint)."""
    for p in procs:
        for child in _children(p.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _wait(procs)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _by_step(records, key_prefix):
    return {r["step"]: r for r in records if any(k.startswith(key_prefix) for k in r)}


@pytest.mark.slow
def test_two_machines_killed_and_resumed_match_one_machine_with_two_processes(tmp_path):
    recipe = _recipe(tmp_path / "recipe.yaml")

    single = tmp_path / "single"
    proc = _launch("accelerate_configs/cpu.yaml", recipe, single, tmp_path / "single.log",
                   "--main_process_port", str(_port()))
    assert proc.wait(timeout=600) == 0, (tmp_path / "single.log").read_text()[-5000:]

    multi = tmp_path / "multi"
    procs = _two_machines(recipe, multi, tmp_path)
    marker = multi / f"checkpoint-{EVERY}" / "judgetrain_complete.json"
    deadline = time.time() + 600
    while not marker.exists() and time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.1)
    assert marker.exists(), (tmp_path / "machine0.log").read_text()[-5000:]
    _kill_machines(procs)
    assert not (multi / f"checkpoint-{STEPS}").exists(), "the run ended before the kill"

    procs = _two_machines(recipe, multi, tmp_path)
    _wait(procs)
    logs = [(tmp_path / f"machine{r}.log").read_text(errors="replace") for r in (0, 1)]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-5000:] + logs[1][-3000:]
    assert f"Resuming from {multi / f'checkpoint-{EVERY}'}" in logs[0]

    effect = json.loads((multi / "parallelism.json").read_text())
    assert (effect["distributed_type"], effect["processes"], effect["machines"], effect["backend"]) == \
        ("MULTI_CPU", 2, 2, "gloo")

    one, two = _records(single), _records(multi)
    # metrics written once: one train record per step, one eval record per eval step, nothing twice
    train_steps = [r["step"] for r in two if "train/loss" in r]
    eval_steps = [r["step"] for r in two if "eval/rmbench/total_avg_acc" in r]
    assert train_steps == list(range(1, STEPS + 1))
    assert eval_steps == [EVERY, STEPS]
    # the loss curve
    a_train, b_train = _by_step(one, "train/loss"), _by_step(two, "train/loss")
    for step in range(1, STEPS + 1):
        for key in ("train/loss", "train/rewards/margins", "train/logps/chosen"):
            assert b_train[step][key] == pytest.approx(a_train[step][key], **TOL), (step, key)
    # the eval metrics, every row counted once across the two machines
    a_eval, b_eval = _by_step(one, "eval/rmbench/"), _by_step(two, "eval/rmbench/")
    for step in (EVERY, STEPS):
        for key, value in a_eval[step].items():
            if key.startswith("eval/") and not key.endswith("runtime"):
                assert b_eval[step][key] == pytest.approx(value, **TOL), (step, key)
        for suite in ("rmbench", "judgebias"):
            rows = [json.loads(line) for line in (multi / "eval" / str(step) / f"{suite}.jsonl").read_text().splitlines()]
            ids = [r["row_index"] for r in rows]
            assert len(ids) == len(set(ids)) == b_eval[step][f"eval/{suite}/n_rows"] == 12
    # the checkpoint is complete and the final adapter written
    from judgetrain.callbacks import checkpoint_problem

    assert checkpoint_problem(multi / f"checkpoint-{STEPS}") is None
    assert (multi / "adapter_model.safetensors").is_file()


def test_the_slurm_script_runs_one_launch_per_machine_with_its_rank(tmp_path):
    """srun / scontrol stand-ins: srun runs the task command once per node with SLURM_PROCID set and prints it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/bash\n[[ $1 == show ]] && printf "gpu-a\\ngpu-b\\n" || echo "$@"\n')
    (bin_dir / "srun").write_text(
        '#!/bin/bash\n'
        'if [[ " $* " == *" hostname "* ]]; then echo 10.1.2.3; exit 0; fi\n'
        'while [[ $1 == --* ]]; do shift; done\n'
        'for r in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_PROCID=$r "$@"; done\n'
    )
    (bin_dir / "accelerate").write_text('#!/bin/bash\necho "accelerate $*"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-[a-b]",
           "SLURM_NNODES": "2", "SLURM_JOB_ID": "77", "GPUS_PER_NODE": "8"}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "slurm_train.sh"), "recipes/judgebias_qwen3_8b_lora.yaml",
                           "accelerate_configs/multinode_ddp.yaml", "--learning_rate", "1e-6"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    launches = [line for line in proc.stdout.splitlines() if line.startswith("accelerate launch")]
    assert len(launches) == 2
    for rank, line in enumerate(launches):
        assert f"--machine_rank {rank} " in line
        assert "--num_machines 2 --num_processes 16 " in line
        assert "--main_process_ip 10.1.2.3 --main_process_port 29500 " in line
        assert line.endswith("-m judgetrain.train recipes/judgebias_qwen3_8b_lora.yaml --resume auto --learning_rate 1e-6")
