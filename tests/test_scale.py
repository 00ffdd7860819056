"""Beyond one process, checked against one machine with 2 DDP processes on the same rows:

* two machines on localhost: two `accelerate launch` processes (num_machines 2, machine ranks 0 and 1, one process
  each) rendezvous on 127.0.0.1, train with precompute_ref_log_probs, are killed, resume with --resume auto; and
  with one output_dir per machine, trained and resumed at max_steps (the reference log-probs loaded, not recomputed);
* FSDP2 on 2 CPU processes over gloo: LoRA (adapter-disabled reference) killed and resumed, the eval callback on the
  sharded model; and a full fine-tune (separate frozen reference) against DDP.

The recipe is the quickstart cut to what a CI machine affords: judgebias only, batch 2 per process, 6 steps, an eval
of 12 rows of each suite every 3 steps, a checkpoint every 3 steps. Tolerance: float reduction order only (the same
global batches, gradients averaged over the same 2 ranks): rel 2e-3 on losses, rewards and eval margins; accuracies
equal. The SLURM script is checked with stand-ins for srun / scontrol that print what each task would run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import QUICKSTART, REPO, free_port, read_jsonl
STEPS, EVERY = 6, 3
GENERATED_ROWS = 5  # JudgeBias: 3 + 2 prompts over 2 ranks, 2 + 1 generate calls: rank 1 runs a padding call
TOL = dict(rel=2e-3, abs=2e-3)


def _recipe(path: Path, full: bool = False) -> str:
    text = QUICKSTART.read_text()
    if full:  # a full fine-tune: no adapter, a learning rate for all weights
        text = text.replace("use_peft: true", "use_peft: false").replace("learning_rate: 2.0e-3", "learning_rate: 1.0e-4")
        # and generate mode on 5 rows a suite, in batches of 2 JudgeBias prompts (about 400 tokens each)
        text = text.replace("eval_scoring: [implicit, judge]", "eval_scoring: [implicit, generate]")
        text += f"\neval_generate_max_rows: {GENERATED_ROWS}\neval_generate_max_new_tokens: 6\neval_batch_tokens: 1024\n"
    text = text.replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", "")
    text = text.replace("eval_suites: [rmbench, judgebias, ideation]", "eval_suites: [rmbench, judgebias]")
    text = text.replace("eval_max_rows: null", "eval_max_rows: 12")
    text = text.replace("eval_scoring: [implicit, judge]", "eval_scoring: implicit")  # proxy only, no start eval
    text = text.replace("eval_on_start: true", "eval_on_start: false")
    text = text.replace("per_device_train_batch_size: 8", "per_device_train_batch_size: 2")
    text += (f"\nmax_steps: {STEPS}\nsave_steps: {EVERY}\nlogging_steps: 1\neval_steps: {EVERY}\n"
             "lr_scheduler_type: constant\nwarmup_steps: 0\n")
    path.write_text(text)
    return str(path)


def _launch(config: str, recipe: str, out: Path, log: Path, *extra: str,
            args: tuple[str, ...] = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "--mixed_precision", "no",
           *extra, "-m", "judgetrain.train", recipe, "--output_dir", str(out), "--resume", "auto", *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def _two_machines(recipe: str, out: Path | tuple[Path, Path], logs: Path, *args: str,
                  tag: str = "machine") -> list[subprocess.Popen]:
    """Machines 0 and 1 on localhost, one process each, into one output_dir or (a pair) one each."""
    port = free_port()
    outs = out if isinstance(out, tuple) else (out, out)
    return [
        _launch("accelerate_configs/multinode_ddp.yaml", recipe, outs[rank], logs / f"{tag}{rank}.log",
                "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
                "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), args=args)
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
    return read_jsonl(out / "metrics.jsonl")


def _by_step(records, key_prefix):
    return {r["step"]: r for r in records if any(k.startswith(key_prefix) for k in r)}


def _run(config: str, recipe: str, out: Path, log: Path) -> Path:
    proc = _launch(config, recipe, out, log, "--main_process_port", str(free_port()))
    assert proc.wait(timeout=600) == 0, log.read_text(errors="replace")[-5000:]
    return out


def ddp_reference(tmp_path_factory, full: bool) -> tuple[str, Path]:
    """The reference: one machine, 2 DDP processes (accelerate_configs/cpu.yaml), LoRA or a full fine-tune. Run once
    per session for this file and tests/test_deepspeed.py (the ``ddp_lora`` and ``ddp_full`` fixtures, conftest.py)."""
    tmp = tmp_path_factory.mktemp("ddp_full" if full else "ddp_lora")
    recipe = _recipe(tmp / "recipe.yaml", full=full)
    return recipe, _run("accelerate_configs/cpu.yaml", recipe, tmp / "out", tmp / "run.log")


def _kill_after_first_checkpoint(procs, out: Path, log: Path) -> None:
    marker = out / f"checkpoint-{EVERY}" / "judgetrain_complete.json"
    deadline = time.time() + 600
    while not marker.exists() and time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.1)
    assert marker.exists(), log.read_text(errors="replace")[-5000:]
    _kill_machines(procs)
    assert not (out / f"checkpoint-{STEPS}").exists(), "the run ended before the kill"


def _assert_same_run(one: Path, two: Path, *, final: str = "adapter_model.safetensors") -> None:
    """`two` follows `one`: loss curve and eval metrics within TOL, metrics written once, each eval row counted
    once, the last checkpoint complete, the final weights written."""
    from judgetrain.run.checkpoints import checkpoint_problem

    a, b = _records(one), _records(two)
    # metrics written once: one train record per step, one eval record per eval step, nothing twice
    assert [r["step"] for r in b if "train/loss" in r] == list(range(1, STEPS + 1))
    assert [r["step"] for r in b if "eval/rmbench/total_avg_acc" in r] == [EVERY, STEPS]
    a_train, b_train = _by_step(a, "train/loss"), _by_step(b, "train/loss")
    for step in range(1, STEPS + 1):
        for key in ("train/loss", "train/rewards/margins", "train/logps/chosen"):
            assert b_train[step][key] == pytest.approx(a_train[step][key], **TOL), (step, key)
    assert b_train[STEPS]["train/loss"] < b_train[1]["train/loss"]  # and it learns
    a_eval, b_eval = _by_step(a, "eval/rmbench/"), _by_step(b, "eval/rmbench/")
    for step in (EVERY, STEPS):
        for key, value in a_eval[step].items():
            if key.startswith("eval/") and not key.endswith("runtime"):
                assert b_eval[step][key] == pytest.approx(value, nan_ok=True, **TOL), (step, key)
        for suite in ("rmbench", "judgebias"):
            lines = (two / "eval" / str(step) / f"{suite}.jsonl").read_text().splitlines()
            ids = [json.loads(line)["row_index"] for line in lines]
            assert len(ids) == len(set(ids)) == b_eval[step][f"eval/{suite}/n_rows"] == 12
    assert checkpoint_problem(two / f"checkpoint-{STEPS}") is None
    assert (two / final).is_file()


@pytest.mark.slow
def test_two_machines_killed_and_resumed_match_one_machine_with_two_processes(ddp_lora, tmp_path):
    recipe, single = ddp_lora
    multi = tmp_path / "multi"
    # with precompute_ref_log_probs (the reference computes it on the fly: the same values), output_dir shared
    precompute = ("--precompute_ref_log_probs", "true")
    _kill_after_first_checkpoint(_two_machines(recipe, multi, tmp_path, *precompute), multi, tmp_path / "machine0.log")
    started = (tmp_path / "machine0.log").read_text(errors="replace")
    assert "Reference log-probs of the train rows: computed (" in started, started[-3000:]

    procs = _two_machines(recipe, multi, tmp_path, *precompute)
    _wait(procs)
    logs = [(tmp_path / f"machine{r}.log").read_text(errors="replace") for r in (0, 1)]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-5000:] + logs[1][-3000:]
    assert f"Resuming from {multi / f'checkpoint-{EVERY}'}" in logs[0]
    resumed = logs[0][len(started):]
    assert "on every machine" in resumed and "not recomputed" in resumed and "computed (" not in resumed, resumed[-3000:]
    written = started.split(" written as ")[1].split()[0]  # the same file name in both machines' folders
    assert all((multi / "train_rows" / node / written).is_file() for node in ("node-0", "node-1")), written
    effect = json.loads((multi / "parallelism.json").read_text())
    assert (effect["distributed_type"], effect["processes"], effect["machines"], effect["backend"]) == \
        ("MULTI_CPU", 2, 2, "gloo")
    _assert_same_run(single, multi)


def _assert_same_generations(one: Path, two: Path, layerwise: bool = False) -> None:
    """Generate mode (the full fine-tune's recipe) on `two`'s model as on `one`'s: every row once, the same texts
    token for token, greedy. Under FSDP2 the ranks' generate calls run in step (synced_gpus), the rank with fewer
    rows running a padding call; under ZeRO-3 the parameters are gathered once for the suite (``gathered_calls``)
    and the rank with fewer batches passes its remaining stop points (collectives) without one, or, ``layerwise``
    (eval_generate_zero3_gather: never), the calls run in step as under FSDP2 (``zero3_layerwise_calls``)."""
    for step in (EVERY, STEPS):
        for suite in ("rmbench", "judgebias"):
            a, b = (read_jsonl(run / "eval" / str(step) / f"{suite}.generate.jsonl") for run in (one, two))
            assert [r["row_index"] for r in b] == [r["row_index"] for r in a] and len(a) == GENERATED_ROWS
            assert all(o["n_tokens"] > 0 for r in b for o in r["outputs"])
            texts = [[o["text"] for o in r["outputs"]] for r in a]
            assert [[o["text"] for o in r["outputs"]] for r in b] == texts, (step, suite)
        # rank 0 (whose figures results.json holds) ran 2 generate calls on its 3 JudgeBias prompts; rank 1, with 2
        # prompts in 1 call, kept in step with the second (FSDP2: a padding call; ZeRO-3: a stop point) or the run
        # would hang
        stats = json.loads((two / "eval" / str(step) / "results.json").read_text())["mode_stats"]["judgebias"]["generate"]
        assert (stats["prompts"], stats["batches"], stats["padding_batches"]) == (3, 2, 0), stats
        zero3 = json.loads((two / "parallelism.json").read_text()).get("zero_stage") == 3
        assert stats["gathered_calls"] == int(zero3 and not layerwise), stats
        assert stats["zero3_layerwise_calls"] == int(zero3 and layerwise), stats


def _assert_sharded(out: Path) -> None:
    effect = json.loads((out / "parallelism.json").read_text())
    assert (effect["distributed_type"], effect["fsdp_version"], effect["processes"], effect["backend"]) == \
        ("FSDP", 2, 2, "gloo")
    assert effect["fraction_on_this_rank"] == pytest.approx(0.5, abs=0.02)
    for step in (EVERY, STEPS):  # the eval callback scored on the sharded model, each row on one rank
        summary = json.loads((out / "eval" / str(step) / "results.json").read_text())
        held = summary["model_sharding"]
        assert held["module"].startswith("FSDP")
        # FSDP2 gathers one decoder layer at a time and reshards it; only its root module (embeddings, final norm,
        # tied head) stays gathered after a forward, as in training: never the whole model on one rank
        assert held["gathered_whole"] and not any(".layers." in name for name in held["gathered_whole"])
        assert 0.5 < held["fraction_on_this_rank"] < 0.8
        for suite in ("rmbench", "judgebias"):
            assert summary["stats"][suite]["rows_per_rank"] == [6, 6]


@pytest.mark.slow
def test_fsdp2_on_cpu_lora_killed_and_resumed_matches_ddp(ddp_lora, tmp_path):
    """LoRA under FSDP2: the reference is the same sharded model with its adapter disabled (TRL and the eval
    callback); full-state-dict checkpoints; kill, --resume auto; the same curve and eval as DDP."""
    recipe, ddp = ddp_lora
    out, log = tmp_path / "fsdp", tmp_path / "fsdp.log"
    _kill_after_first_checkpoint([_launch("accelerate_configs/fsdp2_cpu.yaml", recipe, out, log,
                                          "--main_process_port", str(free_port()))], out, log)
    _run("accelerate_configs/fsdp2_cpu.yaml", recipe, out, log)
    assert f"Resuming from {out / f'checkpoint-{EVERY}'}" in log.read_text(errors="replace")
    _assert_sharded(out)
    _assert_same_run(ddp, out)


@pytest.mark.slow
def test_fsdp2_on_cpu_full_fine_tune_matches_ddp(ddp_full, tmp_path):
    """A full fine-tune of the tiny judge (TRL's separate frozen reference) under FSDP2 and under DDP; the final
    model is saved from the full state dict and loads as an ordinary model with DDP's weights."""
    import torch
    from transformers import AutoModelForCausalLM

    recipe, ddp = ddp_full
    fsdp = _run("accelerate_configs/fsdp2_cpu.yaml", recipe, tmp_path / "fsdp", tmp_path / "fsdp.log")
    _assert_sharded(fsdp)
    _assert_same_run(ddp, fsdp, final="model.safetensors")
    _assert_same_generations(ddp, fsdp)
    a = AutoModelForCausalLM.from_pretrained(ddp).state_dict()
    b = AutoModelForCausalLM.from_pretrained(fsdp).state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-5, msg=name)


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


@pytest.mark.slow
def test_two_machines_with_their_own_output_dirs_precompute_and_resume_without_recomputing(tmp_path):
    """precompute_ref_log_probs on two machines with one output_dir each (machine-local disks; the shared output_dir
    is the kill-and-resume test above): each machine writes only its own folder, both hold the same gathered values,
    and the resume (at max_steps) loads them on every machine: nothing recomputed, nothing re-tokenised."""
    from datasets import Dataset

    recipe = tmp_path / "recipe.yaml"
    text = Path(_recipe(recipe)).read_text()
    text = text.replace("split: train}", "split: train, max_rows: 16}").replace(f"max_steps: {STEPS}", "max_steps: 2")
    text = text.replace(f"save_steps: {EVERY}", "save_steps: 2").replace(f"eval_steps: {EVERY}\n", "")
    text = text.replace("eval_suites: [rmbench, judgebias]", "eval_suites: none")
    # machine-local disks: each machine saves the model and trainer state into its own output_dir
    recipe.write_text(text + "precompute_ref_log_probs: true\nsave_on_each_node: true\n")
    outs = (tmp_path / "machine0", tmp_path / "machine1")
    folders = [outs[0] / "train_rows" / "node-0", outs[1] / "train_rows" / "node-1"]

    def launch(tag: str) -> str:
        procs = _two_machines(str(recipe), outs, tmp_path, tag=tag)
        _wait(procs)
        logs = [(tmp_path / f"{tag}{r}.log").read_text(errors="replace") for r in (0, 1)]
        assert [p.returncode for p in procs] == [0, 0], logs[0][-4000:] + logs[1][-3000:]
        return logs[0]

    log = launch("start")
    assert "Reference log-probs of the train rows: computed (16 rows" in log and "loaded from" not in log, log[-3000:]
    # the same gathered values in both machines' folders, under the fingerprint rank 0 broadcast
    written = [line.split(" written as ")[1].split()[0] for line in log.splitlines() if " written as " in line]
    caches = [{p.name for p in f.glob("cache-*.arrow")} for f in folders]
    assert len(written) == 1 and all(written[0] in c for c in caches), (written, caches)
    values = [Dataset.from_file(str(f / written[0])).to_dict() for f in folders]
    assert values[0] == values[1] and len(values[0]["ref_chosen_logps"]) == 16
    assert not (outs[0] / "train_rows" / "node-1").exists() and not (outs[1] / "train_rows" / "node-0").exists()

    log = launch("resume")
    assert f"Resuming from {outs[0] / 'checkpoint-2'}" in log, log[-3000:]
    assert f"loaded from {written[0]} on every machine (16 rows, computed at an earlier start: not recomputed)" in log
    assert "computed (16 rows" not in log
    assert [{p.name for p in f.glob("cache-*.arrow")} for f in folders] == caches  # nothing new: nothing re-tokenised

    # one machine's file lost: every rank runs the pass again (machine 0 drops its copy first, so that both enter
    # the pass's collectives), and both folders hold the same values again
    (folders[1] / written[0]).unlink()
    log = launch("recompute")
    assert "Reference log-probs of the train rows: computed (16 rows" in log and "loaded from" not in log, log[-3000:]
    assert [Dataset.from_file(str(f / written[0])).to_dict() for f in folders] == values

    # a machine whose disk lacks the checkpoint's trainer state: the resume is refused on both, before any load
    (outs[1] / "checkpoint-2" / "trainer_state.json").unlink()
    procs = _two_machines(str(recipe), outs, tmp_path, tag="lacking")
    _wait(procs)
    log = (tmp_path / "lacking0.log").read_text(errors="replace")
    assert all(p.returncode != 0 for p in procs), log[-3000:]  # each worker exits 2; torchrun's agent then 1
    assert "RecipeError: --resume: checkpoint-2 is complete on the main process's machine but not on every machine (rank 1's machine" in log
    assert "has none): with one output_dir per machine, set save_on_each_node: true" in log, log[-3000:]
