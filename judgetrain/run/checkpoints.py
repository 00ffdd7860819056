"""Checkpoints and resume: the completion marker that makes a ``checkpoint-N`` (and the final model) trustworthy
(every file with its SHA-256), finding the newest complete one, rotation that never leaves none, and cutting
metrics.jsonl back to the step a run resumes from.

The marker is written by every process together (`write_marker`, a collective): each process fsyncs and hashes the
files it wrote itself (its ``rng_state_R.pth``, its DeepSpeed ``*rank_R_*`` and FSDP ``__R_*.distcp`` shards; the
files without a rank in their name are the folder owner's), in a pool of threads, and the per-process entries are
gathered to the owner of each folder: the main process where output_dir is shared (one marker, every file), each
machine's local main process where it is machine-local (that machine's files; every marker part names all parts).
At a save the marker is written in the background (`start_marker`: a thread, its collectives on a gloo group of
their own) while training goes on; a stop, the end of training and the next save wait for it. A resume trusts a
checkpoint by size, mtime and sampled blocks (`checkpoint_problem`), and reads every byte only
when asked (``full=True``, `judgetrain status --verify`). A stop checkpoint is hashed until its deadline (the
SIGTERM window, `stop_deadline`); files left then are marked by size and sample, and the marker says so."""

# Late imports: transformers, torch, judgetrain.utils, accelerate, judgetrain.data (inside the functions that use
# them): `judgetrain report` and `status` read a run folder without torch: it comes in with the functions that need a
# process group or a checkpoint list.

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path

from judgetrain.config.recipe import RecipeError
from judgetrain.run.layout import COMPLETE_MARKER, IDENTITY_FILE, LOCK_FILE, METRICS_FILE, STATUS_FILE
from judgetrain.utils.files import (
    hash_files,
    manifest_problem,
    read_manifest,
    write_json,
    write_lines,
    write_manifest,
)

logger = logging.getLogger(__name__)

# the name Trainer gives a checkpoint (transformers' own pattern, ``trainer_utils._re_checkpoint``, is private)
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def checkpoint_dir(output_dir: str | os.PathLike, step: int) -> Path:
    """Where Trainer saves the checkpoint of ``step``."""
    return Path(output_dir) / f"checkpoint-{step}"


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """N of a ``checkpoint-N`` folder; None for any other name."""
    match = _CHECKPOINT_NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-N`` folders of a run directory, by step (``checkpoint-10`` after ``checkpoint-9``): Trainer's
    own listing (`transformers.trainer_utils.sort_checkpoints`), less the names it accepts by their prefix only
    (``checkpoint-2.tmp``, ``checkpoint-2-old``), which are not Trainer's checkpoints."""
    if not Path(output_dir).is_dir():
        return []
    from transformers.trainer_utils import sort_checkpoints  # imports torch: only when a run directory is listed

    return [Path(p) for p in sort_checkpoints(str(output_dir)) if checkpoint_step(p) is not None]


# Seconds a SIGTERM'd launch gives its workers to save the stop checkpoint before torchrun kills them (the SLURM
# script sends SIGTERM 120 s before the time limit). An exported TORCH_ELASTIC_SHUTDOWN_TIMEOUT wins.
STOP_WINDOW_S = 110
TORCHRUN_STOP_WINDOW_S = 30  # torchrun's own default when nothing sets TORCH_ELASTIC_SHUTDOWN_TIMEOUT
STOP_RESERVE = 0.25  # share of the stop window kept after the hashes: the marker's write, the barriers, the exit

_PROBE = ".judgetrain-probe-"  # written by the main process into a checkpoint being marked: who sees it shares it
# the process a file of a checkpoint belongs to, by its name: rng_state_R.pth (Trainer), DeepSpeed's
# [bf16_]zero_pp_rank_R_mp_rank_M_* and mp_rank_M_model_states.pt (data-parallel rank R, or the rank that writes
# the model states), torch.distributed.checkpoint's __R_I.distcp (FSDP)
_RANK_FILE = re.compile(r"rng_state_(\d+)\.pth$|(?:^|[/_])rank_(\d+)_|__(\d+)_\d+\.distcp$")


def file_rank(rel: str) -> int | None:
    """The rank whose name a checkpoint file carries (see ``_RANK_FILE``); None for a file without one."""
    match = _RANK_FILE.search(rel)
    return int(next(g for g in match.groups() if g is not None)) if match else None


def stop_window_s() -> float:
    """The stop window: TORCH_ELASTIC_SHUTDOWN_TIMEOUT when set (`judgetrain train` sets `STOP_WINDOW_S`,
    scripts/slurm_train.sh exports it), torchrun's 30 s under a torchrun agent that was given none, else
    `STOP_WINDOW_S`."""
    value = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    try:
        if value:
            return float(value)
    except ValueError:
        logger.warning("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=%r is not a number: the stop window is %d s", value, STOP_WINDOW_S)
        return float(STOP_WINDOW_S)
    return float(TORCHRUN_STOP_WINDOW_S if os.environ.get("TORCHELASTIC_RUN_ID") else STOP_WINDOW_S)


def stop_deadline(requested_at: float, window: float | None = None) -> float:
    """When a stop checkpoint's hashes must end (`time.monotonic`): the stop request plus the stop window, less
    `STOP_RESERVE` of it."""
    window = stop_window_s() if window is None else window
    return requested_at + window * (1 - STOP_RESERVE)


def checkpoint_files(ckpt: Path) -> list[str]:
    """The files of ``ckpt`` a marker lists (relative paths): all below it but the marker, temporaries and probes."""
    if not ckpt.is_dir():
        return []
    return sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*")
                  if p.is_file() and p.name != COMPLETE_MARKER and not p.name.endswith(".tmp")
                  and not p.name.startswith(_PROBE))


def assign_files(views: list[dict]) -> tuple[dict[int, list[str]], dict[int, list[int]]]:
    """Who hashes what. ``views``: one per process, ``{"rank", "machine", "shared", "files"}`` (``shared``: it sees
    the main process's checkpoint folder; ``machine``: its machine's first rank). Processes that see one folder form
    a group: all that share the main process's, and per machine those that do not. Each file a group sees goes to
    the rank its name carries when that rank is in the group and sees it, else to the group's owner (its first
    rank), else to the first rank that sees it. Returns ({rank: files}, {owner: ranks of its group})."""
    by_rank = {v["rank"]: v for v in views}
    groups: dict[object, list[int]] = {}
    for v in sorted(views, key=lambda v: v["rank"]):
        groups.setdefault("shared" if v["shared"] else v["machine"], []).append(v["rank"])
    files: dict[int, list[str]] = {r: [] for r in by_rank}
    owners: dict[int, list[int]] = {}
    for ranks in groups.values():
        seen = {rel: [r for r in ranks if rel in by_rank[r]["files"]] for r in ranks for rel in by_rank[r]["files"]}
        owner = ranks[0]
        for rel, seers in sorted(seen.items()):
            named = file_rank(rel)
            files[named if named in seers else owner if owner in seers else seers[0]].append(rel)
        owners[owner] = ranks
    return files, owners


def _world():
    """torch.distributed when it runs several processes (else None), rank, world size and this machine's first
    rank (`judgetrain.utils.machines.machine_first_rank`: the run's one answer, gathered when the rows folder was
    named, read without a collective: a marker may be written in a background thread)."""
    import torch.distributed as dist

    from judgetrain.utils.machines import local_rank, machine_first_rank

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None, 0, 1, 0
    rank, world = dist.get_rank(), dist.get_world_size()
    return dist, rank, world, machine_first_rank(rank, world, local_rank())


def _gather(dist, value, world: int, group=None) -> list:
    # torch's all_gather_object, which accelerate's gather_object calls: accelerate's own asks PartialState, which
    # sees no distributed run in a process group that accelerate did not set up (judgetrain.utils.ranks.any_rank)
    if dist is None:
        return [value]
    out = [None] * world
    dist.all_gather_object(out, value, group=group)
    return out


SHARED_WAIT_S = 2.0  # how long a process looks for the main process's probe file before it calls its disk its own
_SHARED: dict[tuple[str, int], bool] = {}  # (output_dir, world size) -> whether this process sees rank 0's


def sees_main_folder(folder: Path, dist, rank: int, group=None) -> bool:
    """Whether this process sees the main process's ``folder`` (output_dir on one shared disk) or a folder of its own
    machine's disk of the same path: decided once per run and folder (a collective on its first call: every rank),
    then remembered. The main process writes a probe file holding a fresh token; each other process opens it by
    name and reads the token, for up to `SHARED_WAIT_S` (a directory listing right after a barrier can be stale
    under NFS's attribute caching; opening a file revalidates it)."""
    if dist is None:
        return True
    key = (str(folder), dist.get_world_size())
    if key not in _SHARED:
        _SHARED[key] = _probe_round(Path(folder), dist, rank, group)
    return _SHARED[key]


def _probe_round(folder: Path, dist, rank: int, group) -> bool:
    token = _gather(dist, uuid.uuid4().hex if rank == 0 else None, dist.get_world_size(), group)[0]
    probe = folder / f"{_PROBE}{token}"
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
    dist.barrier(group=group)
    seen = rank == 0
    until = time.monotonic() + SHARED_WAIT_S
    while not seen:
        try:
            seen = probe.read_text() == token
        except OSError:
            pass
        if seen or time.monotonic() >= until:
            break
        time.sleep(0.1)
    dist.barrier(group=group)  # every process has looked
    if rank == 0:
        probe.unlink(missing_ok=True)
    return seen


def write_marker(ckpt: Path, step: int, identity: dict | None = None, *, deadline=None, workers: int | None = None,
                 group=None) -> dict:
    """The completion marker of ``ckpt``, written last, by every process together when torch.distributed runs
    several (a collective: call it on every rank). Each process fsyncs and hashes its own files (`assign_files`) in a
    pool of threads, each file's entry with its size, SHA-256, mtime and sample digest; the entries are gathered and
    each folder's owner writes ``judgetrain_complete.json`` there (shard folders included: DeepSpeed
    ``global_stepN/``, FSDP ``pytorch_model_fsdp_0/``), with the identity of the run that wrote it
    (``judgetrain_run.json``, from the main process). ``deadline`` (`time.monotonic`, a stop checkpoint): files not
    hashed by then get no SHA-256 (a callable: the deadline as it is now); ``verification`` in the marker says
    ``sha256`` (every file) or ``sample`` (``unhashed`` lists the rest). ``group``: the process group of the
    collectives (`marker_group`, for a marker written in the background). Returns ``{"owner": whether this process
    wrote a marker, "ranks": its group, "marker": what it wrote}``."""
    ckpt = Path(ckpt)
    dist, rank, world, machine = _world()
    shared = sees_main_folder(ckpt.parent, dist, rank, group)  # decided at the run's first save, then remembered
    token = uuid.uuid4().hex
    if rank == 0 and ckpt.is_dir() and identity is not None:
        write_json(ckpt / IDENTITY_FILE, identity)
    if dist is not None:
        dist.barrier(group=group)
    view = {"rank": rank, "machine": machine, "token": token, "files": checkpoint_files(ckpt), "shared": shared}
    views = _gather(dist, view, world, group)
    files, owners = assign_files(views)
    started = time.monotonic()
    entries, failed = {}, None
    try:  # a failure is sent to the others, which would otherwise wait for this process at the gather
        mine = hash_files([ckpt / rel for rel in files[rank]], deadline=deadline, details=True, workers=workers)
        entries = {p.relative_to(ckpt).as_posix(): e for p, e in mine.items()}
    except OSError as e:
        failed = f"rank {rank}: {type(e).__name__}: {e}"
    parts = _gather(dist, {"rank": rank, "entries": entries, "failed": failed,
                           "seconds": time.monotonic() - started}, world, group)
    result = {"owner": rank in owners, "ranks": next(r for r in owners.values() if rank in r), "marker": None}
    failures = [p["failed"] for p in parts if p["failed"] and rank in owners and p["rank"] in owners[rank]]
    if failures:
        logger.error("%s: no completion marker (a resume passes over it): %s", ckpt, "; ".join(failures))
    elif rank in owners and any(files[r] for r in owners[rank]):
        listed = {rel: e for part in parts if part["rank"] in owners[rank] for rel, e in part["entries"].items()}
        unhashed = sorted(rel for rel, e in listed.items() if "sha256" not in e)
        extra = {"step": step, "save_id": views[0]["token"], "world_size": world, "ranks": owners[rank],
                 "verification": "sample" if unhashed else "sha256",
                 "hash_seconds": {str(p["rank"]): round(p["seconds"], 3) for p in parts if p["rank"] in owners[rank]},
                 "parts": [{"owner": o, "ranks": rs, "files": sum(len(files[r]) for r in rs)}
                           for o, rs in sorted(owners.items()) if any(files[r] for r in rs)]}
        if unhashed:
            extra["unhashed"] = unhashed
            logger.warning("%s: %d of %d files marked by size and sampled blocks only (the stop deadline came "
                           "first); `judgetrain status RUN_DIR --verify` cannot check their every byte",
                           ckpt, len(unhashed), len(listed))
        result["marker"] = write_manifest(ckpt, extra, name=COMPLETE_MARKER, entries=listed)
    if dist is not None:
        dist.barrier(group=group)  # no process goes on (rotates, stops) before every marker is written
    return result


class MarkerJob:
    """A marker written in the background (`start_marker`) while training goes on; ``deadline`` may be set later
    (a stop while it runs)."""

    def __init__(self, ckpt: Path, step: int, identity: dict | None, after, group):
        self.ckpt, self.deadline, self.done = Path(ckpt), None, None
        self.thread = threading.Thread(target=self._run, args=(step, identity, after, group), daemon=True,
                                       name=f"judgetrain-marker-{step}")

    def _run(self, step, identity, after, group):
        try:
            self.done = write_marker(self.ckpt, step, identity, deadline=lambda: self.deadline, group=group)
            if after is not None:
                after(self.done)
        except Exception:  # the checkpoint stays without a marker: a resume passes over it
            logger.exception("The completion marker of %s could not be written", self.ckpt)


_jobs: list[MarkerJob] = []
_group = None


def marker_group():
    """The process group of the background markers' collectives: a gloo group of their own (made at the first
    call, which every process makes at the same save), so that they never interleave with the training's
    collectives on the default group. None with one process."""
    global _group
    dist, *_ = _world()
    if dist is not None and _group is None:
        _group = dist.new_group(backend="gloo")
    return _group if dist is not None else None


def forget_marker_group() -> None:
    """After `torch.distributed.destroy_process_group()` (which destroys the markers' group with the others): a
    later run in this process makes a new one."""
    global _group
    _group = None


def start_marker(ckpt: Path, step: int, identity: dict | None = None, *, after=None) -> MarkerJob:
    """`write_marker` in a background thread (every process at the same save), ``after(result)`` once it is
    written (rotation). The marker before it is finished first, so markers are written in save order."""
    finish_markers()
    job = MarkerJob(ckpt, step, identity, after, marker_group())
    _jobs.append(job)
    job.thread.start()
    return job


def finish_markers(deadline: float | None = None) -> None:
    """Wait for the markers still being written; ``deadline`` (a stop): their hashes end then."""
    while _jobs:
        job = _jobs[0]
        if deadline is not None:
            job.deadline = deadline
        job.thread.join()
        _jobs.remove(job)


# files at the top of output_dir that belong to the run, not to the final model
_RUN_FILES = (METRICS_FILE, "data_audit.json", IDENTITY_FILE, STATUS_FILE, LOCK_FILE)


def write_final_marker(output_dir: str) -> None:
    """The same marker for the final model, listing the model files at the top of output_dir (not the run's log,
    recipes and checkpoints beside them)."""

    out = Path(output_dir)
    files = [p for p in out.iterdir() if p.is_file() and p.name not in _RUN_FILES + (COMPLETE_MARKER,)
             and not p.name.endswith(".tmp") and not (p.name.startswith("recipe") and p.suffix == ".yaml")]
    write_manifest(out, {"final": True}, name=COMPLETE_MARKER, only=files, details=True)


def checkpoint_problem(ckpt: Path, *, hashes: bool = True, full: bool = False) -> str | None:
    """None when ``ckpt`` is complete (its marker matches every file), else why not. What is compared: sizes;
    with ``hashes`` also each file's sampled blocks where its mtime is the marker's and its SHA-256 where the mtime
    changed (rewritten or copied since); with ``full`` every file's SHA-256 (every byte read). A marker of an older
    judgetrain (sizes and SHA-256, no mtimes) is checked by SHA-256 (with ``hashes``), one of sizes only by size."""

    if not (Path(ckpt) / COMPLETE_MARKER).is_file():
        return "no completion marker (the save was interrupted)"
    return manifest_problem(ckpt, name=COMPLETE_MARKER, hashes=hashes, quick=not full)


def marker_verification(ckpt: Path) -> str:
    """What the marker of ``ckpt`` can vouch for: ``sha256`` (every file hashed) or ``sample`` (a stop checkpoint
    marked under its deadline: some files by size and sampled blocks only)."""
    manifest, _ = read_manifest(Path(ckpt), COMPLETE_MARKER)
    return (manifest or {}).get("verification", "sha256")


def find_resume_checkpoint(output_dir: str, *, full: bool = False) -> str | None:
    """The newest complete ``checkpoint-N`` in ``output_dir`` (`checkpoint_problem`: sizes, mtimes and sampled
    blocks, every byte with ``full``); newer ones that fail are skipped, each with a warning saying why."""
    skipped = []
    for ckpt in reversed(list_checkpoints(output_dir)):
        problem = checkpoint_problem(ckpt, full=full)
        if problem is None:
            if skipped:
                logger.warning("Falling back to %s, the newest checkpoint that verifies (skipped: %s)",
                               ckpt, ", ".join(p.name for p in skipped))
            return str(ckpt)
        logger.warning("Skipping incomplete checkpoint %s: %s", ckpt, problem)
        skipped.append(ckpt)
    return None


def rotate_checkpoints(output_dir, keep: int | None, *, upto: int, protect: str | None = None) -> list[Path]:
    """``save_total_limit``, applied after the marker (Trainer deletes old checkpoints while the new one has none
    yet, so a kill then left zero complete checkpoints): delete checkpoints up to step ``upto`` beyond the newest
    ``keep`` complete ones, and torn ones older than the newest complete one. Checkpoints after ``upto`` (a later
    point of a timeline this run resumed before) are left alone: they are rewritten, marker first removed, when the
    run gets there. Returns what was deleted."""

    if not keep or keep <= 0:
        return []
    ckpts = [(step, p) for p in list_checkpoints(output_dir) if (step := checkpoint_step(p)) <= upto]
    complete = [p for _, p in ckpts if checkpoint_problem(p, hashes=False) is None]
    if not complete:
        return []
    kept = set(complete[-keep:]) | ({Path(protect)} if protect else set())
    newest = checkpoint_step(complete[-1])
    deleted = [p for step, p in ckpts if p not in kept and step < newest]
    for p in deleted:
        shutil.rmtree(p, ignore_errors=True)
    return deleted


def truncate_metrics(output_dir: str, last_step: int) -> int:
    """Drop metrics.jsonl records after ``last_step`` (logged after the checkpoint a run resumes from) and a torn
    last line, so a resumed run continues without duplicated or missing steps. Returns how many lines were dropped."""
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1  # torn write of a killed process
            continue
        if record.get("step", 0) <= last_step:
            kept.append(line)
        else:
            dropped += 1
    write_lines(path, kept)
    return dropped


def resolve_resume(resume: str | None, output_dir: str) -> str | None:
    """The checkpoint ``--resume`` asks for: None (fresh run), ``auto`` (newest complete one, if any) or a path,
    checked complete before anything is written."""
    if resume in (None, "", "none", "no"):
        return None
    if resume == "auto":
        ckpt = find_resume_checkpoint(output_dir)  # verified file by file; falls back past bad ones
        if ckpt is None:
            logger.info("--resume auto: no complete checkpoint in %s, starting from scratch", output_dir)
        return ckpt
    problem = checkpoint_problem(Path(resume)) if Path(resume).is_dir() else "not a directory"
    if problem is None and checkpoint_step(resume) is None:
        problem = "its name is not checkpoint-<step>"
    if problem:
        raise RecipeError(f"--resume {resume}: cannot resume from it: {problem}")
    return resume


RESUME_FILES = ("trainer_state.json",)  # what Trainer reads on every process when it resumes from a checkpoint


def resumable_steps(output_dir: str | os.PathLike) -> list[int]:
    """Steps of the checkpoints in ``output_dir`` that a process of this machine can resume from: complete by
    their marker on this disk (`checkpoint_problem`) and holding what Trainer reads on every process."""
    return [checkpoint_step(c) for c in list_checkpoints(output_dir)
            if all((c / f).is_file() for f in RESUME_FILES) and checkpoint_problem(c) is None]


def common_resume_step(picked: int | None, machines: list[tuple[str, list[int]]], *, auto: bool) -> tuple[int | None, str]:
    """The step every machine can resume from, given the main process's pick (``picked``: its newest complete
    checkpoint for ``--resume auto``, the one named otherwise) and each machine's (name, `resumable_steps`), and
    a warning line ("" when the pick holds everywhere). `RecipeError` when no step is common to every machine, or
    when a named checkpoint is missing on one: the run would load different states on different machines."""
    if picked is None:
        return None, ""
    lacking = [(name, steps) for name, steps in machines if picked not in steps]
    if not lacking:
        return picked, ""
    where = "; ".join(f"{name} has {', '.join(f'checkpoint-{s}' for s in steps[-3:]) or 'none'}"
                      for name, steps in lacking)
    common = set.intersection(*(set(steps) for _, steps in machines)) if machines else set()
    fix = ("with one output_dir per machine, set save_on_each_node: true so that each machine saves the model "
           "and trainer state, or copy the checkpoint to the machines that lack it")
    if not auto or not common:
        raise RecipeError(f"--resume: checkpoint-{picked} is complete on the main process's machine but not on every "
                          f"machine ({where}): {fix}")
    step = max(common)
    return step, (f"--resume auto: checkpoint-{picked} is not complete on every machine ({where}): resuming from "
                  f"checkpoint-{step}, the newest one every machine holds complete")


def resolve_resume_everywhere(resume: str | None, output_dir: str) -> str | None:
    """`resolve_resume` on the main process, then checked on every machine: each machine's local main process
    lists the checkpoints its own disk holds complete (a shared output_dir gives every machine the same list;
    machine-local disks each their own), and the run resumes from a step every machine holds (`common_resume_step`:
    ``--resume auto`` falls back to the newest common one, a named checkpoint missing on a machine is refused).
    One process, or one machine: `resolve_resume` alone. Which machine a process is on is the run's one answer
    (`judgetrain.data.prepare.machine_placement`, gathered once and remembered for the rows folder)."""

    from accelerate import PartialState

    from judgetrain.data.prepare import machine_placement
    from judgetrain.utils.ranks import decided_on_main

    state = PartialState()
    picked = decided_on_main(lambda: resolve_resume(resume, output_dir))
    if picked is None or state.num_processes == 1:
        return picked
    first, _, machines = machine_placement(state)  # the same count on every rank: all return here, or none
    if machines == 1:
        return picked
    from accelerate.utils import gather_object

    # auto: this machine's own output_dir (the same path on every machine, on a shared disk or each its own);
    # a named checkpoint: its run folder, on this machine's disk
    folder = Path(output_dir) if resume == "auto" else Path(picked).parent
    mine = resumable_steps(folder) if state.process_index == first else None
    seen = [(f"rank {rank}'s machine ({host})", steps)
            for rank, host, steps in gather_object([(state.process_index, socket.gethostname(), mine)])
            if steps is not None]

    def decide():
        step, warning = common_resume_step(checkpoint_step(picked), seen, auto=resume == "auto")
        if warning:
            logger.warning(warning)
        return str(Path(picked).parent / f"checkpoint-{step}")

    return decided_on_main(decide)
