"""The checkpoint part: what the completion marker costs at a save and at a resume, on a synthetic checkpoint written
by 2 processes (gloo), shaped like a ZeRO checkpoint: the main process writes the model (a quarter of the bytes)
and the trainer state, each process its optimizer shard (``global_step1/zero_pp_rank_R_mp_rank_00_optim_states.pt``)
and its RNG state. The bytes are random (one buffer written over and over); ``--checkpoint-gb`` sets the total.

Per round, each way on a checkpoint written just before it (its pages still dirty, as after a real save):
- **write**: both processes write their files (no fsync, as Trainer's save), timed from a barrier to a barrier.
- **mark, old way**: the main process alone fsyncs and SHA-256s every file, one after another (judgetrain before).
- **mark, new way**: as `CheckpointMarkerCallback` does at a save: `judgetrain.run.checkpoints.start_marker` on
  both processes (each fsyncs and hashes its own files in a thread pool, in the background; the entries gathered
  into one marker on the markers' own gloo group). ``mark_blocking_s`` is what holds the training (the save
  returns), ``mark_s`` the time until the marker is written (`finish_markers`: what a stop checkpoint, which is
  marked in the foreground, costs). The old way blocks for all of it.
- **resume check**: the old way (every file's SHA-256, one after another) against the new one (sizes, mtimes and
  sampled blocks), warm (the pages still cached) and cold (the checkpoint's pages dropped from the page cache with
  ``posix_fadvise(DONTNEED)``, as on a resume after a requeue).
Figures are medians over ``--repeats`` rounds, the ways alternating which goes first; ratios are to the write time.
The load average is recorded with them: on a shared machine each figure moves with it.
"""

# Late imports: judgetrain.run, judgetrain.utils, torch (inside the functions that use them): each benchmark part
# loads only what it measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from judgetrain.bench.common import BenchError, alternating, load_average, median, ratio

BUFFER = 64 << 20  # bytes of random data written over and over


def _write_file(path: Path, size: int, buf: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        left = size
        while left > 0:
            n = min(left, len(buf))
            f.write(buf[:n])
            left -= n


def _files_of(rank: int, total: int) -> dict[str, int]:
    """What ``rank`` writes into the synthetic checkpoint: relative path -> bytes."""
    files = {f"global_step1/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt": total * 3 // 8,
             f"rng_state_{rank}.pth": 16_000}
    if rank == 0:
        files.update({"model.safetensors": total // 4, "trainer_state.json": 2_000})
    return files


def _drop_cache(ckpt: Path) -> None:
    for path in ckpt.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _old_mark(ckpt: Path) -> None:
    """judgetrain's marker before: one process, one file after another, fsync then SHA-256."""
    from judgetrain.run.layout import COMPLETE_MARKER
    from judgetrain.utils.files import fsync_path, sha256, write_manifest

    entries = {}
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER):
        fsync_path(path)
        entries[path.relative_to(ckpt).as_posix()] = {"size": path.stat().st_size, "sha256": sha256(path)}
    write_manifest(ckpt, {"step": 1}, name=COMPLETE_MARKER, entries=entries)


def _old_check(ckpt: Path) -> str | None:
    """judgetrain's resume check before: every file's SHA-256, one after another."""
    from judgetrain.run.layout import COMPLETE_MARKER
    from judgetrain.utils.files import sha256

    files = json.loads((ckpt / COMPLETE_MARKER).read_text())["files"]
    for rel, entry in sorted(files.items()):
        if sha256(ckpt / rel) != entry["sha256"]:
            return rel
    return None


def rank_process(rank: int, spec: dict) -> None:
    """One of the bench's 2 processes (``python -m judgetrain.bench.checkpoint RANK SPEC``)."""
    import torch.distributed as dist

    from judgetrain.run.checkpoints import checkpoint_problem, finish_markers, start_marker

    root, world = Path(spec["workdir"]), spec["processes"]
    os.environ["LOCAL_RANK"] = str(rank)  # one machine, one shared folder
    dist.init_process_group("gloo", init_method="file://" + str(root / "store"), rank=rank, world_size=world)
    buf = os.urandom(BUFFER)
    total = int(spec["gb"] * 1e9)
    rounds = []

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t0

    for i, warm, order in alternating(0, spec["repeats"], ["old", "new"]):
        for way in order:
            ckpt = root / f"round-{i}-{way}" / "checkpoint-1"
            write = timed(lambda: [_write_file(ckpt / rel, size, buf) for rel, size in _files_of(rank, total).items()])
            if way == "old":
                mark = blocking = timed(lambda: _old_mark(ckpt) if rank == 0 else None)
            else:
                blocking = timed(lambda: start_marker(ckpt, 1))
                mark = blocking + timed(finish_markers)
            record = {"round": i, "way": way, "write_s": write, "mark_blocking_s": blocking, "mark_s": mark,
                      "load": load_average()}
            if rank == 0:
                checks = {"old": lambda: _old_check(ckpt), "new": lambda: checkpoint_problem(ckpt)}
                for temp in ("warm", "cold"):
                    if temp == "cold":
                        _drop_cache(ckpt)
                    t0 = time.perf_counter()
                    problem = checks[way]()
                    record[f"verify_{temp}_s"] = time.perf_counter() - t0
                    if problem is not None:
                        raise RuntimeError(f"{ckpt}: the {way} check fails on a fresh checkpoint: {problem}")
                record["bytes"] = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
                rounds.append(record)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(ckpt.parent)
            dist.barrier()
    if rank == 0:
        (root / "result.json").write_text(json.dumps(rounds))
    dist.destroy_process_group()


def bench_checkpoint(cfg: argparse.Namespace, workdir: Path) -> dict:
    """Run the 2 processes and summarise their rounds (see the module docstring)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec = {"workdir": str(workdir), "processes": 2, "gb": cfg.checkpoint_gb, "repeats": cfg.repeats}
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR")}
    procs = [subprocess.Popen([sys.executable, "-m", "judgetrain.bench.checkpoint", str(r), json.dumps(spec)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(spec["processes"])]
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode for p in procs) or not (workdir / "result.json").is_file():
        raise BenchError("checkpoint bench failed:\n" + "\n".join(o[-2000:] for o in outs))
    rounds = json.loads((workdir / "result.json").read_text())
    by_way = {way: [r for r in rounds if r["way"] == way] for way in ("old", "new")}
    out: dict = {"gb": cfg.checkpoint_gb, "processes": spec["processes"], "repeats": cfg.repeats,
                 "bytes": rounds[0]["bytes"], "rounds": rounds}
    for way, rs in by_way.items():
        write = median([r["write_s"] for r in rs])
        keys = ("mark_blocking", "mark", "verify_warm", "verify_cold")
        out[way] = {"write_s": write, **{f"{key}_s": median([r[f"{key}_s"] for r in rs]) for key in keys}}
        for key in keys:  # per round, to the write time of that round
            out[way][f"{key}_ratio"] = median([ratio(r[f"{key}_s"], r["write_s"]) for r in rs])
    out["marker_overhead"] = out["new"]["mark_blocking_ratio"]
    out["resume_verify_ratio"] = max(out["new"]["verify_warm_ratio"], out["new"]["verify_cold_ratio"])
    return out


if __name__ == "__main__":
    rank_process(int(sys.argv[1]), json.loads(sys.argv[2]))
