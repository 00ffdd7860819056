"""A resume continues only its own run; one run per output_dir; checkpoints verified by SHA-256 and never all rotated
away; exit codes a scheduler can act on; the non-finite guard under fp16 loss scaling and over several ranks.

Real components: the tiny judge, DPOTrainer, accelerate, torch's GradScaler and gloo process groups, flock."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from judgetrain.run.checkpoints import (
    assign_files,
    checkpoint_problem,
    find_resume_checkpoint,
    marker_verification,
    rotate_checkpoints,
    stop_deadline,
    stop_window_s,
    write_final_marker,
    write_marker,
)
from judgetrain.config.recipe import RecipeError
from helpers import QUICKSTART, REPO, read_jsonl
from judgetrain.run.state import (
    EXIT_PREEMPTED,
    IDENTITY_FILE,
    LOCK_FILE,
    hold_output_dir,
    plan_start,
    read_statuses,
    release_output_dir,
    run_identity,
)


def small_recipe(path: Path, extra: str = "") -> str:
    text = QUICKSTART.read_text()
    text = text.replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", "")
    text = text.replace("eval_suites: [rmbench, judgebias, ideation]", "eval_suites: []")
    text = text.replace("per_device_train_batch_size: 8", "per_device_train_batch_size: 2")
    path.write_text(text + "\nmax_steps: 4\nsave_steps: 2\nlogging_steps: 1\n" + extra)
    return str(path)


def train(args, log: Path, timeout=600) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "judgetrain.train", *args], cwd=REPO, stdout=log.open("wb"),
                          stderr=subprocess.STDOUT, timeout=timeout)
    return proc.returncode, log.read_text(errors="replace")


def metrics(run) -> list[dict]:
    return read_jsonl(Path(run) / "metrics.jsonl")


def identity(lr=0.002, data="d1", n=1):
    return run_identity({"learning_rate": lr, "output_dir": "x", "logging_steps": 5}, num_processes=n, data=data)


# ----------------------------------------------------------------------------------------------- identity (files)


def test_resume_of_another_run_is_refused_naming_each_field_and_forcing_keeps_the_new_values(tmp_path):
    ckpt = tmp_path / "checkpoint-4"
    ckpt.mkdir()
    (ckpt / IDENTITY_FILE).write_text(json.dumps(identity()))
    new = identity(lr=0.5, n=2)
    new["versions"]["transformers"] = "0.0-other"
    with pytest.raises(RecipeError) as e:
        plan_start(tmp_path, new, checkpoint=str(ckpt), resume_asked=True, force=False, overwrite=False)
    text = str(e.value)
    assert "recipe.learning_rate: 0.002 -> 0.5" in text and "num_processes: 1 -> 2" in text
    assert "versions.transformers:" in text and "--resume_force" in text
    assert "recipe.logging_steps" not in text and "recipe.output_dir" not in text  # operational: not the run
    plan = plan_start(tmp_path, new, checkpoint=str(ckpt), resume_asked=True, force=True, overwrite=False)
    assert plan["kind"] == "resume" and len(plan["forced"]) == 3
    # the same run resumes without force
    assert plan_start(tmp_path, identity(), checkpoint=str(ckpt), resume_asked=True, force=False,
                      overwrite=False)["forced"] == []


def test_fresh_run_in_a_used_output_dir_refuses_and_overwrite_clears_only_judgetrain_files(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RecipeError, match="already holds a run .*--overwrite_output_dir"):
        plan_start(tmp_path, identity(), checkpoint=None, resume_asked=False, force=False, overwrite=False)
    plan = plan_start(tmp_path, identity(), checkpoint=None, resume_asked=False, force=False, overwrite=True)
    assert plan["kind"] == "fresh" and set(plan["clear"]) == {"checkpoint-2", "metrics.jsonl"}
    from judgetrain.run.state import clear_run

    clear_run(tmp_path, plan["clear"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_resume_auto_without_a_checkpoint_restarts_only_its_own_run(tmp_path):
    """Killed before its first checkpoint: the same run starts again from step 0; another run is refused."""
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / IDENTITY_FILE).write_text(json.dumps({"first": identity(), "current": identity(), "history": []}))
    plan = plan_start(tmp_path, identity(data=None), checkpoint=None, resume_asked=True, force=False, overwrite=False)
    assert plan["kind"] == "restart"
    with pytest.raises(RecipeError, match="holds another run"):
        plan_start(tmp_path, identity(lr=1.0), checkpoint=None, resume_asked=True, force=False, overwrite=False)


# ----------------------------------------------------------------------------------------------- lock


HOLDER = """
import sys, time
from pathlib import Path
from judgetrain.run.state import hold_output_dir
hold_output_dir(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def test_second_run_meets_the_lock_and_a_killed_holder_leaves_none(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, cwd=REPO)
    assert holder.stdout.readline().strip() == b"held"
    with pytest.raises(RecipeError, match=rf"is in use by another judgetrain run \(pid {holder.pid} on "):
        hold_output_dir(tmp_path)
    holder.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel drops the flock
    holder.wait()
    hold_output_dir(tmp_path)
    assert (tmp_path / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} ")
    release_output_dir(tmp_path)


LOCKER = """
import os, sys
from judgetrain.utils.files import file_lock
with file_lock(sys.argv[1], on_acquired=lambda fd: os.write(fd, b"holder %d" % os.getpid())):
    print("held", flush=True)
    sys.stdin.readline()  # until the test says: let go
    print("letting go", flush=True)  # written while the lock is still held
"""


def _let_go_once_logged(holder, caplog, message):
    while message not in caplog.text:
        time.sleep(0.01)
    holder.stdin.write(b"go\n")
    holder.stdin.flush()


def test_file_lock_refuses_times_out_waits_with_one_message_and_never_truncates_the_holders_file(tmp_path, caplog):
    """Order, not seconds: the refusals happen while the holder holds the lock (it is alive, its file intact), and
    the waiting acquire returns only after the holder said, still holding, that it lets go."""
    import select
    import threading

    from judgetrain.utils.files import LockBusy, file_lock

    path = tmp_path / "entry.lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCKER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(LockBusy, match="is locked by another process"):
            with file_lock(path, wait=False):
                pass
        with caplog.at_level("INFO"), pytest.raises(LockBusy):
            with file_lock(path, timeout=0.5, wait_message="waiting for the holder", poll=0.05):
                pass
        assert caplog.text.count("waiting for the holder") == 1  # it waited (the message), then gave up
        assert holder.poll() is None  # ... while the lock was still held
        assert path.read_text() == f"holder {holder.pid}"  # the refused attempts left the holder's words alone
        caplog.clear()
        # let go only once the waiter below has logged that it waits
        release = threading.Thread(target=_let_go_once_logged, args=(holder, caplog, "waiting for the holder"),
                                   daemon=True)
        release.start()
        with caplog.at_level("INFO"):
            with file_lock(path, wait_message="waiting for the holder", poll=0.05, timeout=300):
                said = select.select([holder.stdout], [], [], 0)[0]  # "letting go" already written
                assert said and holder.stdout.readline().strip() == b"letting go"
        release.join(60)
        assert caplog.text.count("waiting for the holder") == 1
        assert path.read_text() == f"holder {holder.pid}"  # released, not removed
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("code", ["ENOLCK", "EOPNOTSUPP", "ENOSYS"])
def test_an_output_dir_whose_filesystem_has_no_flock_is_refused_naming_it(tmp_path, monkeypatch, code):
    """NFS without lockd, some FUSE mounts: one message naming output_dir and the cause, no bare OSError and no
    fallback to a marker file that a killed run would leave behind."""
    import errno
    import fcntl

    from judgetrain.run.state import output_dir_in_use

    number = getattr(errno, code)

    def no_locks(fd, operation):
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    run = tmp_path / "run"
    expected = (f"output_dir {run}: cannot lock {LOCK_FILE} there: its filesystem does not support file locks "
                f"(flock: {os.strerror(number)};")
    with pytest.raises(RecipeError) as refused:
        hold_output_dir(run)
    assert str(refused.value).startswith(expected)
    assert output_dir_in_use(run).startswith(expected)  # `judgetrain train` says the same before it launches
    assert [p.name for p in run.iterdir()] == [LOCK_FILE]


# ----------------------------------------------------------------------------------------------- checkpoints


def _checkpoint(root: Path, step: int, marker=True) -> Path:
    ckpt = root / f"checkpoint-{step}"
    shard = ckpt / f"global_step{step}"  # a DeepSpeed-style shard folder
    shard.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (ckpt / "optimizer.pt").write_bytes(os.urandom(4096))
    (shard / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(os.urandom(2048))
    if marker:
        write_marker(ckpt, step, identity())
    return ckpt


def test_marker_hashes_every_file_including_shard_folders_and_catches_same_size_corruption(tmp_path, caplog):
    good, bad = _checkpoint(tmp_path, 2), _checkpoint(tmp_path, 4)
    listed = json.loads((bad / "judgetrain_complete.json").read_text())["files"]
    assert set(listed) == {"trainer_state.json", "optimizer.pt", IDENTITY_FILE,
                           "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt"}
    assert all(len(entry["sha256"]) == 64 for entry in listed.values())
    (bad / "optimizer.pt").write_bytes(b"\0" * 4096)  # zero-filled, right size: the size-only marker trusted it
    assert checkpoint_problem(bad) == "optimizer.pt does not match its SHA-256 in judgetrain_complete.json"
    with caplog.at_level("WARNING"):
        assert find_resume_checkpoint(str(tmp_path)) == str(good)
    assert "Skipping incomplete checkpoint" in caplog.text and "does not match its SHA-256" in caplog.text
    assert f"Falling back to {good}" in caplog.text
    shard = bad / "global_step4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    (bad / "optimizer.pt").unlink()
    _checkpoint(tmp_path, 6)
    shard6 = tmp_path / "checkpoint-6" / "global_step6" / shard.name
    data = shard6.read_bytes()
    shard6.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # same size, last byte changed (never equal to itself)
    assert "global_step6/" in checkpoint_problem(tmp_path / "checkpoint-6")


def test_rotation_keeps_the_last_complete_checkpoint_while_the_next_one_has_no_marker(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4, marker=False)  # being saved (or killed while saving)
    assert rotate_checkpoints(tmp_path, 1, upto=4) == []
    assert checkpoint_problem(tmp_path / "checkpoint-2") is None
    write_marker(tmp_path / "checkpoint-4", 4)
    assert rotate_checkpoints(tmp_path, 1, upto=4) == [tmp_path / "checkpoint-2"]
    # a later checkpoint of an abandoned timeline (resumed from before it) is neither kept in place of, nor deleted
    _checkpoint(tmp_path, 8)
    _checkpoint(tmp_path, 6)
    assert rotate_checkpoints(tmp_path, 1, upto=6) == [tmp_path / "checkpoint-4"]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-6", "checkpoint-8"]


MARK_TWO_RANKS = """
import json, os, sys, torch.distributed as dist
from pathlib import Path
rank, root = int(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo", init_method="file://" + str(root / "store"), rank=rank, world_size=2)
from judgetrain.run.checkpoints import finish_markers, rotate_checkpoints, start_marker, write_marker
for mode in ("shared", "local"):
    # shared: one output_dir for both ranks; local: two machines of one process each, each with its own disk
    os.environ["LOCAL_RANK"] = str(rank) if mode == "shared" else "0"
    out = root / mode / (f"machine-{rank}" if mode == "local" else "")
    for step in (2, 4, 6):
        ckpt = out / f"checkpoint-{step}"
        (ckpt / f"global_step{step}").mkdir(parents=True, exist_ok=True)
        if rank == 0:  # Trainer's files, written by the main process only
            (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
            (ckpt / "adapter_model.safetensors").write_bytes(os.urandom(3000))
        (ckpt / f"rng_state_{rank}.pth").write_bytes(os.urandom(100 + rank))  # every rank's own
        (ckpt / f"global_step{step}" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(os.urandom(5000))
        dist.barrier()
        if mode == "shared":  # in the foreground (a stop checkpoint)
            done = write_marker(ckpt, step, {"run": "two ranks"})
            if done["owner"]:
                rotate_checkpoints(out, 2, upto=step)
        else:  # in the background, on the markers' own gloo group, as CheckpointMarkerCallback does
            rotate = lambda done, out=out, step=step: done["owner"] and rotate_checkpoints(out, 2, upto=step)
            job = start_marker(ckpt, step, {"run": "two ranks"}, after=rotate)
    finish_markers()
    done = done if mode == "shared" else job.done
    print(mode, json.dumps({"owner": done["owner"], "ranks": done["ranks"]}), flush=True)
dist.destroy_process_group()
"""


def test_two_processes_hash_their_own_files_into_one_marker_or_one_per_machine_and_each_machine_rotates(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", MARK_TWO_RANKS, str(r), str(tmp_path)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    rank0 = {"trainer_state.json", "adapter_model.safetensors", IDENTITY_FILE, "rng_state_0.pth",
             "global_step6/zero_pp_rank_0_mp_rank_00_optim_states.pt"}
    rank1 = {"rng_state_1.pth", "global_step6/zero_pp_rank_1_mp_rank_00_optim_states.pt"}
    # shared output_dir: one marker, every file of both ranks, each rank hashed its own
    shared = tmp_path / "shared"
    marker = json.loads((shared / "checkpoint-6" / "judgetrain_complete.json").read_text())
    assert set(marker["files"]) == rank0 | rank1
    assert marker["verification"] == "sha256" and all(len(e["sha256"]) == 64 for e in marker["files"].values())
    assert set(marker["hash_seconds"]) == {"0", "1"} and marker["world_size"] == 2
    assert marker["parts"] == [{"owner": 0, "ranks": [0, 1], "files": 7}]
    assert not list(shared.glob("checkpoint-*/.judgetrain-probe-*")), "the probe is removed"
    assert sorted(p.name for p in shared.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert checkpoint_problem(shared / "checkpoint-6") is None
    # machine-local disks: each machine's marker lists that machine's files and names both parts; both rotate
    for rank, files in ((0, rank0), (1, rank1)):
        out = tmp_path / "local" / f"machine-{rank}"
        marker = json.loads((out / "checkpoint-6" / "judgetrain_complete.json").read_text())
        assert set(marker["files"]) == files and marker["ranks"] == [rank] and marker["step"] == 6
        assert marker["parts"] == [{"owner": 0, "ranks": [0], "files": 5}, {"owner": 1, "ranks": [1], "files": 2}]
        assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"], rank
        assert checkpoint_problem(out / "checkpoint-6") is None
    saves = [json.loads((tmp_path / "local" / f"machine-{r}" / "checkpoint-6" / "judgetrain_complete.json")
                        .read_text())["save_id"] for r in (0, 1)]
    assert saves[0] == saves[1], "both parts name the same save"
    assert [o.splitlines()[-1] for o in outs] == ['local {"owner": true, "ranks": [0]}',
                                                   'local {"owner": true, "ranks": [1]}']


def test_files_go_to_the_rank_their_name_carries_and_the_rest_to_the_folders_owner():
    names = ["trainer_state.json", "rng_state_0.pth", "rng_state_3.pth", "global_step4/mp_rank_00_model_states.pt",
             "global_step4/bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt", "pytorch_model_fsdp_0/__1_0.distcp",
             "pytorch_model_fsdp_0/.metadata", "rng_state_9.pth"]
    views = [{"rank": r, "machine": 0 if r < 2 else 2, "shared": True, "files": names} for r in range(4)]
    files, owners = assign_files(views)
    assert owners == {0: [0, 1, 2, 3]}
    assert files == {0: ["global_step4/mp_rank_00_model_states.pt", "pytorch_model_fsdp_0/.metadata",
                         "rng_state_0.pth", "rng_state_9.pth", "trainer_state.json"],
                     1: ["pytorch_model_fsdp_0/__1_0.distcp"],
                     2: ["global_step4/bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt"], 3: ["rng_state_3.pth"]}
    # machine 2 does not see the main process's folder: its first rank owns its own files
    local = [{"rank": 2, "machine": 2, "shared": False, "files": ["rng_state_2.pth", "rng_state_3.pth", "x"]},
             {"rank": 3, "machine": 2, "shared": False, "files": ["rng_state_2.pth", "rng_state_3.pth", "x"]}]
    files, owners = assign_files(views[:2] + local)
    assert owners == {0: [0, 1], 2: [2, 3]} and files[2] == ["rng_state_2.pth", "x"] and files[3] == ["rng_state_3.pth"]


def _big_checkpoint(root: Path, step: int) -> tuple[Path, Path]:
    ckpt = _checkpoint(root, step, marker=False)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(os.urandom(3 << 20))  # larger than the three sampled blocks together
    write_marker(ckpt, step, identity())
    return ckpt, weights


def test_resume_check_catches_a_truncated_or_torn_file_without_reading_it_all_and_full_check_any_change(tmp_path, capsys):
    good, _ = _big_checkpoint(tmp_path, 2)
    ckpt, weights = _big_checkpoint(tmp_path, 4)
    entry = json.loads((ckpt / "judgetrain_complete.json").read_text())["files"]["model.safetensors"]
    assert set(entry) == {"size", "sha256", "mtime_ns", "sample"}
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    # a byte changed outside the sampled blocks, mtime put back: the cheap check trusts it, the full one does not
    data[1 << 20] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert checkpoint_problem(ckpt) is None
    assert checkpoint_problem(ckpt, full=True) == "model.safetensors does not match its SHA-256 in judgetrain_complete.json"
    assert find_resume_checkpoint(str(tmp_path), full=True) == str(good)
    from judgetrain.cli.status import verify_run  # `judgetrain status RECIPE --verify`

    assert verify_run(tmp_path) == 1
    assert capsys.readouterr().out.splitlines() == [
        "checkpoint-2: ok (every file matches its SHA-256)",
        "checkpoint-4: FAILED: model.safetensors does not match its SHA-256 in judgetrain_complete.json"]
    # a torn tail of the same size (mtime put back): the sampled blocks catch it
    data[-10:] = b"\0" * 10
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert checkpoint_problem(ckpt) == "model.safetensors does not match its sampled blocks in judgetrain_complete.json"
    # truncated
    os.truncate(weights, (3 << 20) - 1)
    assert checkpoint_problem(ckpt) == f"model.safetensors has {(3 << 20) - 1} bytes, judgetrain_complete.json says {3 << 20}"
    assert find_resume_checkpoint(str(tmp_path)) == str(good)


def test_a_stop_checkpoint_past_its_deadline_is_marked_by_size_and_sample_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "40")
    assert stop_window_s() == 40 and stop_deadline(100.0) == 130.0  # a quarter of the window kept for the rest
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert stop_window_s() == 30  # torchrun's own default
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert stop_window_s() == 110  # judgetrain.cli.train's, which `judgetrain train` exports
    ckpt = _checkpoint(tmp_path, 2, marker=False)
    write_marker(ckpt, 2, identity(), deadline=time.monotonic() - 1)  # the deadline has passed
    marker = json.loads((ckpt / "judgetrain_complete.json").read_text())
    assert marker["verification"] == "sample" == marker_verification(ckpt)
    assert sorted(marker["unhashed"]) == sorted(marker["files"])
    assert all("sha256" not in e and len(e["sample"]) == 64 for e in marker["files"].values())
    assert checkpoint_problem(ckpt) is None and checkpoint_problem(ckpt, full=True) is None
    (ckpt / "optimizer.pt").write_bytes(b"\0" * 4096)  # same size, new content: no SHA-256, the sample sees it
    assert checkpoint_problem(ckpt, full=True) == "optimizer.pt does not match its sampled blocks in judgetrain_complete.json"
    fresh = _checkpoint(tmp_path, 4)
    assert marker_verification(fresh) == "sha256"


def test_final_model_marker_lists_the_model_files_only(tmp_path):
    for name in ("adapter_model.safetensors", "adapter_config.json", "metrics.jsonl", "recipe.yaml",
                 "recipe.resume-4.yaml", IDENTITY_FILE):
        (tmp_path / name).write_text(name)
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "x").write_text("x")
    write_final_marker(str(tmp_path))
    marker = json.loads((tmp_path / "judgetrain_complete.json").read_text())
    assert set(marker["files"]) == {"adapter_model.safetensors", "adapter_config.json"} and marker["final"] is True
    (tmp_path / "adapter_model.safetensors").write_text("adapter_model.safetensorz")
    assert "does not match its SHA-256" in checkpoint_problem(tmp_path)


# ----------------------------------------------------------------------------------------------- real runs


def test_real_resume_refuses_a_changed_recipe_forcing_applies_the_new_learning_rate_rejects_kept_once(tmp_path):
    """lr and max_steps changed on resume: refused naming both; forced: the new lr replaces the restored scheduler's
    (warmup 5: step 5 at 4/5 of it, step 6 at all of it), recipe.yaml stays the first; rejects are not doubled."""
    recipe = small_recipe(tmp_path / "r.yaml", "max_length: 600\nlong_rows: skip\n")
    run = tmp_path / "run"
    rc, text = train([recipe, "--output_dir", str(run)], tmp_path / "1.log")
    assert rc == 0, text[-3000:]
    rejects = (run / "rejects" / "long_rows.jsonl").read_text()
    assert rejects.count("\n") > 0
    final = json.loads((run / "judgetrain_complete.json").read_text())
    assert "adapter_model.safetensors" in final["files"] and "metrics.jsonl" not in final["files"]

    rc, text = train([recipe, "--output_dir", str(run)], tmp_path / "2.log")  # a fresh run in the used folder
    assert rc == 2 and "already holds a run" in text and "Traceback" not in text

    changed = [recipe, "--output_dir", str(run), "--resume", "auto", "--learning_rate", "0.5", "--max_steps", "6"]
    rc, text = train(changed, tmp_path / "3.log")
    assert rc == 2, text[-3000:]
    assert "recipe.learning_rate: 0.002 -> 0.5" in text and "recipe.max_steps: 4 -> 6" in text
    assert "--resume_force" in text and "Traceback" not in text

    rc, text = train(changed + ["--resume_force"], tmp_path / "4.log")
    assert rc == 0, text[-3000:]
    lrs = {r["step"]: r["train/learning_rate"] for r in metrics(run) if "train/learning_rate" in r}
    assert lrs[4] == pytest.approx(0.002 * 3 / 5) and lrs[5] == pytest.approx(0.4) and lrs[6] == pytest.approx(0.5)
    assert "learning_rate: 0.002" in (run / "recipe.yaml").read_text()
    assert "learning_rate: 0.5" in (run / "recipe.resume-4.yaml").read_text()
    record = json.loads((run / IDENTITY_FILE).read_text())
    assert record["first"]["recipe"]["learning_rate"] == 0.002 and record["current"]["recipe"]["learning_rate"] == 0.5
    assert [h["event"] for h in record["history"]] == ["fresh", "resume"]
    assert (run / "rejects" / "long_rows.jsonl").read_text() == rejects
    assert [s["status"] for s in read_statuses(run)] == ["finished", "refused", "refused", "finished"]


def test_real_resume_falls_back_past_a_zero_filled_optimizer_file_and_ends_where_the_run_did(tmp_path):
    recipe = small_recipe(tmp_path / "r.yaml", "max_steps: 6\nsave_total_limit: 2\n")
    run = tmp_path / "run"
    rc, text = train([recipe, "--output_dir", str(run)], tmp_path / "1.log")
    assert rc == 0, text[-3000:]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]  # rotation: 2 kept
    reference = load_file(str(run / "adapter_model.safetensors"))
    optimizer = run / "checkpoint-6" / "optimizer.pt"
    optimizer.write_bytes(b"\0" * optimizer.stat().st_size)  # the crash of the size-only marker

    rc, text = train([recipe, "--output_dir", str(run), "--resume", "auto"], tmp_path / "2.log")
    assert rc == 0, text[-3000:]
    assert f"Skipping incomplete checkpoint {run / 'checkpoint-6'}: optimizer.pt does not match its SHA-256" in text
    assert f"Falling back to {run / 'checkpoint-4'}" in text and f"Resuming from {run / 'checkpoint-4'}" in text
    resumed = load_file(str(run / "adapter_model.safetensors"))
    for key in reference:
        torch.testing.assert_close(resumed[key], reference[key], rtol=1e-4, atol=1e-6, msg=key)
    assert checkpoint_problem(run / "checkpoint-6") is None  # rewritten when the run got there again
    assert [r["step"] for r in metrics(run) if "train/loss" in r] == [1, 2, 3, 4, 5, 6]


def test_second_run_is_refused_by_the_lock_and_a_killed_run_resumes(tmp_path):
    recipe = small_recipe(tmp_path / "r.yaml", "max_steps: 8\n")
    run, log = tmp_path / "run", tmp_path / "1.log"
    first = subprocess.Popen([sys.executable, "-m", "judgetrain.train", recipe, "--output_dir", str(run)], cwd=REPO,
                             stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not (run / "checkpoint-2" / "judgetrain_complete.json").exists():
        assert first.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    # paused, not ended: on a loaded machine the first run could otherwise finish (and free the lock) before the
    # second one, a new interpreter, gets to it
    os.killpg(first.pid, signal.SIGSTOP)
    rc, text = train([recipe, "--output_dir", str(run), "--resume", "auto"], tmp_path / "2.log")
    assert rc == 2 and f"is in use by another judgetrain run (pid {first.pid} on " in text, text[-3000:]
    assert first.poll() is None, "the refused run must not disturb the first"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    rc, text = train([recipe, "--output_dir", str(run), "--resume", "auto"], tmp_path / "3.log")
    assert rc == 0 and "Resuming from" in text, text[-3000:]
    assert [r["step"] for r in metrics(run) if "train/loss" in r] == list(range(1, 9))


def test_judgetrain_train_exits_with_the_preempted_code_on_sigterm(tmp_path):
    """SIGTERM to the `judgetrain train` wrapper only: it passes the signal to `accelerate launch`, whose training
    process saves a checkpoint and exits 143; the wrapper waits for it and exits 143 (accelerate alone gives 1)."""
    recipe = small_recipe(tmp_path / "r.yaml", "max_steps: 40\nsave_steps: 100\n")
    run, log = tmp_path / "run", tmp_path / "term.log"
    wrapper = subprocess.Popen([sys.executable, "-m", "judgetrain.cli", "train", recipe, "--output_dir", str(run)],
                               cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size):
        assert wrapper.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    wrapper.send_signal(signal.SIGTERM)
    rc = wrapper.wait(timeout=300)
    text = log.read_text(errors="replace")
    assert rc == EXIT_PREEMPTED, text[-4000:]
    assert "Stopped by SIGTERM at step" in text
    status = read_statuses(run)[-1]
    assert status["status"] == "preempted" and status["exit_code"] == 143 and status["launch_id"]
    step = status["step"]
    assert (run / f"checkpoint-{step}" / "judgetrain_complete.json").is_file()
    assert not (run / "judgetrain_complete.json").exists(), "a preempted run has no final-model marker"


# ----------------------------------------------------------------------------------------------- non-finite guard


@pytest.mark.extended(reason="fp16 loss scaling on CPU, about a minute")
def test_fp16_loss_scaler_overflow_steps_are_skipped_and_counted_not_stopped(tiny_judge, tmp_path):
    """accelerate enables fp16 loss scaling only on an accelerator; here Trainer's accelerator gets the real
    torch.amp.GradScaler('cpu') (the model runs fp16 weights, as TRL loads them with fp16: true). An initial scale
    of 2**24 overflows fp16 gradients for the first steps: the scaler skips them and halves its scale."""
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from judgetrain.trainer.callbacks import NonFiniteGuard
    from judgetrain.data import load_judgebias

    rows = load_judgebias("bundled", split="train").select(range(24)).select_columns(["prompt", "chosen", "rejected"])
    args = DPOConfig(output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=2, fp16=True, bf16=False,
                     report_to=[], logging_steps=1, save_strategy="no", learning_rate=1e-3, use_cpu=True)
    trainer = DPOTrainer(model=tiny_judge, args=args, train_dataset=rows,
                         processing_class=AutoTokenizer.from_pretrained(tiny_judge),
                         peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    trainer.accelerator.native_amp = True
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    guard = NonFiniteGuard("stop").attach(trainer)
    trainer.add_callback(guard)
    trainer.train()  # no RunStopped

    assert trainer.state.global_step == 8
    final_scale = trainer.accelerator.scaler.get_scale()
    halvings = round(torch.log2(torch.tensor(2.0**24 / final_scale)).item())
    assert 1 <= len(guard.scaler_skipped_steps) == halvings < 8, (guard.scaler_skipped_steps, final_scale)
    assert guard.scaler_skipped_steps == list(range(1, halvings + 1))  # the first steps, then a scale that fits
    assert guard.bad_steps == [] and guard.skipped_steps == []
    grad_norms = {r["step"]: r.get("grad_norm") for r in trainer.state.log_history if "grad_norm" in r}
    assert all(grad_norms[s] != grad_norms[s] or grad_norms[s] == float("inf") for s in guard.scaler_skipped_steps)
    weights = [p for n, p in trainer.model.named_parameters() if "lora_" in n]
    assert weights and all(torch.isfinite(p).all() for p in weights)


def test_fp16_a_real_nonfinite_loss_still_stops_under_the_scaler():
    """The scaler cannot fix a NaN loss: the guard stops, naming it (a real Accelerator with a real GradScaler,
    Trainer's state/control objects; the step's loss flag and grad norm set as `attach` records them)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from judgetrain.trainer.callbacks import NonFiniteGuard, RunStopped

    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    guard = NonFiniteGuard("stop")
    guard._accelerator = accelerator
    state, args = TrainerState(), TrainingArguments(output_dir="unused", report_to=[])
    state.global_step = 4
    guard._grad_norm = float("inf")
    guard.on_pre_optimizer_step(args, state, TrainerControl())  # overflow with a finite loss: the scaler's business
    assert guard.bad_steps == []
    guard._loss_bad, guard._grad_norm = True, float("nan")
    with pytest.raises(RunStopped, match="Non-finite loss and gradient at step 5"):
        guard.on_pre_optimizer_step(args, state, TrainerControl())


AGREE = """
import os, sys, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
from judgetrain.utils.ranks import any_rank
print(any_rank([rank == 1, False]), flush=True)
dist.destroy_process_group()
"""


def test_all_ranks_agree_when_one_rank_sees_a_nonfinite_value(tmp_path):
    """Under FSDP / ZeRO-3 each rank sees its own micro-batch losses: a NaN on rank 1 stops rank 0 as well."""
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-c", AGREE, str(r), str(store)], stdout=subprocess.PIPE, cwd=REPO)
             for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0].decode().strip().splitlines()[-1] for p in procs]
    assert outs == ["[True, False]", "[True, False]"]


def test_judgetrain_train_exits_2_at_once_when_another_run_holds_the_output_dir(tmp_path):
    """Checked before anything is launched: the refusal reaches the scheduler as 2 (from inside `accelerate launch`
    it would be 1), and the run that holds the folder is not disturbed."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == b"held"
        proc = subprocess.run([sys.executable, "-m", "judgetrain.cli", "train", small_recipe(tmp_path / "r.yaml"),
                               "--output_dir", str(run)], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert f"is in use by another judgetrain run (pid {holder.pid} on " in proc.stderr
        assert "Launching" not in proc.stderr and holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


FINISHED_THEN_ABORTED = """
import os, sys
from pathlib import Path
from judgetrain.run.state import hold_output_dir, write_status
out = Path(sys.argv[1])
hold_output_dir(out)
write_status(out, sys.argv[2], int(sys.argv[3]), step=62)
os.abort()  # what a worker's SIGABRT at its exit looks like to the launcher
"""


@pytest.mark.parametrize("written, code, expected", [("finished", 0, 134), ("preempted", 143, 143)])
def test_status_never_reports_0_for_a_launch_whose_launcher_exited_otherwise(tmp_path, monkeypatch, capsys, written,
                                                                               code, expected):
    """A launch whose run wrote "finished" (0) and whose process then died by SIGABRT: `judgetrain train` exits with
    the launcher's code (128 + 6), not the 0 it read, and `judgetrain status` says failed with that code, in both
    its modes (the folder, and a launch id with the launcher's code as a scheduler script passes it). A non-zero
    code the run wrote (143) still wins over the launcher's."""
    from judgetrain.cli import run_command
    from judgetrain.run.launch import launch_and_wait
    from judgetrain.run.state import LAUNCH_ID_ENV, LAUNCHER_EXIT_ENV

    run = tmp_path / "run"
    assert launch_and_wait([sys.executable, "-c", FINISHED_THEN_ABORTED, str(run), written, str(code)], run) == expected
    first, *rest = read_statuses(run)
    assert (first["status"], first["exit_code"]) == (written, code)
    assert run_command("status", [str(run)]) == 0
    line = capsys.readouterr().out
    if written == "finished":
        assert line.startswith(f"{run}: failed (exit code 134) at step 62: the run wrote finished (exit code 0), "
                               "then its launch exited 134"), line
        assert [(s["status"], s["exit_code"], s["launch_id"]) for s in rest] == [("failed", 134, first["launch_id"])]
    else:
        assert "(exit code 143) at step 62" in line and rest == []
    # a bare launch around which a scheduler script reads the code: the same rule, through the launch id
    bare = tmp_path / "bare"
    monkeypatch.setenv(LAUNCH_ID_ENV, "slurm-1-0")
    assert subprocess.run([sys.executable, "-c", FINISHED_THEN_ABORTED, str(bare), written, str(code)]).returncode < 0
    monkeypatch.setenv(LAUNCHER_EXIT_ENV, "1")
    assert run_command("status", [str(bare)]) == 0
    assert capsys.readouterr().out.strip() == ("1" if written == "finished" else "143")
    monkeypatch.delenv(LAUNCH_ID_ENV)
    run_command("status", [str(bare)])
    assert ("failed (exit code 1)" if written == "finished" else "(exit code 143)") in capsys.readouterr().out


ENDING = """
import atexit, sys, threading, time
from pathlib import Path
from judgetrain.trainer.process import end_process
out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
threading.Thread(target=lambda: (time.sleep(1), (out / "thread").write_text("joined"))).start()
print("buffered line", end="")  # no newline, into a pipe: flushed only by the exit
end_process(int(sys.argv[2]))
"""


@pytest.mark.parametrize("code", [0, 5])
def test_a_process_of_a_launch_ends_with_its_code_after_its_exit_handlers_and_threads(tmp_path, code):
    """`end_process` (the end of every process of a launch of several, which skips the interpreter's teardown where
    gloo's threads met a finalizing interpreter): the run's code, the exit handlers run, other threads joined,
    the buffered output flushed."""
    proc = subprocess.run([sys.executable, "-c", ENDING, str(tmp_path), str(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "WORLD_SIZE": "2"})
    assert proc.returncode == code, proc.stderr[-2000:]
    assert proc.stdout == "buffered line"
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "joined"


def test_the_slurm_script_requeues_on_the_preempted_code_that_accelerate_hides(tmp_path):
    """srun / scontrol / accelerate stand in for a cluster (as in test_scale); the stand-in launch writes what a
    preempted run writes (status line 143 tagged with the launch id) and exits 1, as `accelerate launch` does."""
    out = tmp_path / "run"
    out.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/bash\n[[ $1 == show ]] && printf "gpu-a\\n" || echo "scontrol $*"\n')
    (bin_dir / "srun").write_text('#!/bin/bash\nif [[ " $* " == *" hostname "* ]]; then echo 10.1.2.3; exit 0; fi\n'
                                  'while [[ $1 == --* ]]; do shift; done\nSLURM_PROCID=0 "$@"\n')
    (bin_dir / "accelerate").write_text(
        '#!/bin/bash\necho "{\\"status\\": \\"preempted\\", \\"exit_code\\": 143, \\"launch_id\\": \\"$JUDGETRAIN_LAUNCH_ID\\"}"'
        f' >> {out}/judgetrain_status.jsonl\nexit 1\n')
    (bin_dir / "python").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-a",
           "SLURM_NNODES": "1", "SLURM_JOB_ID": "77", "GPUS_PER_NODE": "8", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "slurm_train.sh"), str(QUICKSTART),
                           str(REPO / "accelerate_configs" / "multinode_ddp.yaml"), "--output_dir", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "scontrol requeue 77" in proc.stdout
    assert read_statuses(out)[-1]["launch_id"] == "slurm-77-0"


def test_a_resume_takes_a_step_every_machine_holds_complete():
    from judgetrain.run.checkpoints import common_resume_step

    shared = [("rank 0's machine (a)", [2, 4]), ("rank 8's machine (b)", [2, 4])]
    assert common_resume_step(4, shared, auto=True) == (4, "")
    assert common_resume_step(None, shared, auto=True) == (None, "")
    # machine-local disks: machine b's save of step 4 did not finish; auto falls back to the newest common step
    local = [("rank 0's machine (a)", [2, 4]), ("rank 8's machine (b)", [2])]
    step, warning = common_resume_step(4, local, auto=True)
    assert step == 2 and "checkpoint-4 is not complete on every machine (rank 8's machine (b) has checkpoint-2)" in warning
    # a named checkpoint is never swapped for another; no common step is refused, never a fresh start
    with pytest.raises(RecipeError, match="rank 8's machine \\(b\\) has checkpoint-2\\): with one output_dir per machine, set save_on_each_node"):
        common_resume_step(4, local, auto=False)
    with pytest.raises(RecipeError, match="rank 8's machine \\(b\\) has none"):
        common_resume_step(4, [("rank 0's machine (a)", [4]), ("rank 8's machine (b)", [])], auto=True)
