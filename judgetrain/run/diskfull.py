"""A full disk mid-run: one error that says where and what to do, instead of a traceback from deep inside torch.

The preflight checks the free space at the start only; on a shared filesystem other jobs fill it later. A write that
fails for lack of space (a checkpoint save, the final save, an evaluation's per-row files, a metrics.jsonl line)
ends the run with `DiskFull` (exit code 4, `EXIT_DISK_FULL`): the output_dir's filesystem (mount point, type,
device), its free and total space, the space the save needed (the size of the last complete checkpoint), and what
to do; a write that names its file is named (judgetrain's writers name theirs: `naming_failures`), with where
it leads when it is a link elsewhere (a device such as /dev/full is said to be one). The checkpoint being written
when the disk filled has no completion marker, so it is never taken for a complete one; it is removed to give the
space back (a resume would pass over it anyway), and rotation, which runs after a marker only, has deleted nothing.
After space is freed, ``--resume auto`` continues from the last complete checkpoint. On several processes a checkpoint save and the final save are agreed on by every rank
(`every_rank_stops`): all of them stop together with exit code 4, none waits in a collective for the one that
failed.

torch's checkpoint writer reports a full disk as ``RuntimeError: [enforce fail at inline_container.cc] ...
unexpected pos`` (or an ``iostream error``) with no errno; such an error counts as a full disk when output_dir's
filesystem has almost nothing left. Writers in Rust (safetensors: ``SafetensorError: Error while serializing: I/O
error: No space left on device (os error 28)``) carry the errno in their message only: ``(os error 28)`` or ``122``
counts as ENOSPC / EDQUOT.
"""

# Late imports: judgetrain.run (inside the functions that use them): `judgetrain report` and `status` read a run
# folder without torch: it comes in with the functions that need a process group or a checkpoint list.

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import stat
from pathlib import Path

from judgetrain.run.checkpoints import finish_markers
from judgetrain.utils.errors import exception_chain
from judgetrain.utils.ranks import any_rank

logger = logging.getLogger(__name__)

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
TORCH_WRITE_FAILURES = ("inline_container", "iostream error", "file write failed", "unexpected pos")
RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust's std::io::Error shows its errno
LOW_FREE = 4 * 2**20  # what a torch write failure leaves free on a full disk is below this


class DiskFull(OSError):
    """A write into output_dir failed for lack of space; the message says where, how much and what to do."""

    def __init__(self, message: str, *, agreed: bool = False):
        super().__init__(errno.ENOSPC, message)
        self.message = message
        self.agreed = agreed  # every process stops with it (`every_rank_stops`): they can meet once more to exit

    def __str__(self) -> str:
        return self.message


def _existing(path: Path) -> Path:
    return path if path.exists() else next((p for p in path.parents if p.exists()), Path("."))


def disk_full_error(exc: BaseException, output_dir: str | os.PathLike) -> OSError | RuntimeError | None:
    """The error of ``exc``'s chain that says the disk is full (an ENOSPC / EDQUOT OSError, a Rust writer's error
    naming that errno, or torch's write failure on a filesystem with almost nothing left), or None."""
    chain = list(exception_chain(exc))
    for e in chain:
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return e
        if not isinstance(e, OSError) and any(int(n) in DISK_ERRNOS for n in RUST_OS_ERROR.findall(str(e))):
            return e
    torch_write = next((e for e in chain if isinstance(e, RuntimeError)
                        and any(s in str(e) for s in TORCH_WRITE_FAILURES)), None)
    if torch_write is not None and shutil.disk_usage(_existing(Path(output_dir))).free < LOW_FREE:
        return torch_write
    return None


@contextlib.contextmanager
def every_rank_stops(output_dir: str | os.PathLike, what: str):
    """Run the block (a save) on every process and agree on its outcome with one small all-reduce: when it failed on
    any process, it fails on all of them, so that no rank goes on to a collective that the failed one never joins
    (it would wait there until its connection closes, then end in a traceback). The rank that failed raises its own
    error; the others raise an ENOSPC OSError when that failure was a full disk (`DiskFull` follows on every rank,
    exit code 4), a RuntimeError otherwise. One process alone: the block as it is."""
    failure = None
    try:
        yield
    except Exception as e:  # noqa: BLE001 - agreed on below, then raised again
        failure = e
    failed, full = any_rank([failure is not None,
                             failure is not None and disk_full_error(failure, output_dir) is not None])
    if failure is None and full:
        failure = OSError(errno.ENOSPC, f"{what} failed for lack of space on another process")
    elif failure is None and failed:
        failure = RuntimeError(f"{what} failed on another process (its error is in the log)")
    if failure is not None:
        with contextlib.suppress(AttributeError):
            failure.agreed = True  # every rank raises it: `DiskFull.agreed`
        raise failure


def filesystem_of(path: str | os.PathLike) -> str:
    """``<mount point> (<type>, <device>)`` of the filesystem that holds ``path`` (from /proc/self/mounts)."""
    target = os.path.realpath(_existing(Path(path)))
    best = ("", "", "")
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                device, mount, kind = line.split()[:3]
                mount = mount.replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best[0]):
                    best = (mount, kind, device)
    except OSError:
        pass
    return f"{best[0]} ({best[1]}, {best[2]})" if best[0] else target


def _size(folder: Path) -> int:
    """The bytes of the files below ``folder`` (what another process removes meanwhile counts as gone)."""
    total = 0
    with contextlib.suppress(OSError):
        for p in folder.rglob("*"):
            with contextlib.suppress(OSError):
                total += p.stat().st_size if p.is_file() else 0
    return total


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _inside(path: Path, folder: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


def _where(out: Path, failed: Path | None) -> tuple[str, str]:
    """(what the filesystem that refused the write holds, what to do first). Usually output_dir's filesystem; a
    failed file that is a link elsewhere is named with its target (another filesystem's space, or a device such as
    /dev/full that refuses every write whatever the space)."""
    usage = shutil.disk_usage(_existing(out))
    here = f"the filesystem of output_dir {out}, {filesystem_of(out)}, has {_mib(usage.free)} free of {_mib(usage.total)}"
    todo = "Free space there (or lower save_total_limit, or choose an output_dir on a larger filesystem)"
    if failed is None or not failed.exists():
        return here, todo
    target = Path(os.path.realpath(failed))
    info = target.stat()
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        return (f"{failed} is a link to {target}, a device that refuses the write whatever the space (output_dir "
                f"{out} is on {filesystem_of(out)}, {_mib(usage.free)} free of {_mib(usage.total)})",
                f"Make {failed} a regular file")
    if info.st_dev != _existing(out).stat().st_dev:
        theirs = shutil.disk_usage(target)
        return (f"{failed} is a link to {target}, on {filesystem_of(target)}, which has {_mib(theirs.free)} free of "
                f"{_mib(theirs.total)}", "Free space there (or make it a regular file in output_dir)")
    return here, todo


def disk_full_message(output_dir: str | os.PathLike, step: int, error: BaseException, *, final: bool = False,
                      remove: bool = True) -> str:
    """The one error of a run stopped by a full disk. It names the file that failed when the error does; the torn
    checkpoint of ``step`` is removed when the failed write was its own and ``remove`` (each machine's first
    process: one remover per folder)."""
    from judgetrain.run.checkpoints import COMPLETE_MARKER, checkpoint_dir, list_checkpoints

    out = Path(output_dir)
    torn = checkpoint_dir(out, step)
    complete = [c for c in list_checkpoints(out) if (c / COMPLETE_MARKER).is_file()]
    last = complete[-1] if complete else None
    failed = Path(error.filename) if isinstance(getattr(error, "filename", None), (str, os.PathLike)) else None
    written = 0
    if final:
        what = "the final save"
    elif (failed is None or _inside(failed, torn)) and torn.is_dir() and not (torn / COMPLETE_MARKER).exists():
        written = _size(torn)
        if remove:  # never complete; its space back, the resume passes over it anyway
            shutil.rmtree(torn, ignore_errors=True)
        what = f"the save of {torn.name} (never complete: removed)"
    else:
        what = f"writing {failed}" if failed is not None else "a write"
    needed = _size(last) if last is not None else written
    need = f"about {_mib(needed)} (the size of {last.name})" if last is not None else f"more than {_mib(needed)}"
    resume = (f"then `--resume auto` continues from {last.name}, the last complete checkpoint"
              if last is not None else "then run again with `--resume auto` (no complete checkpoint yet: from step 0)")
    where, todo = _where(out, None if final else failed)
    return f"disk full at step {step}: {what} failed: {where}; a save needs {need}. {todo}, {resume}"


def stop_if_disk_full(error: Exception, trainer, out: Path, *, final: bool = False) -> None:
    """Raise `DiskFull` (one message: where, how much, what to do) when ``error`` is a full output_dir, after the
    background markers of earlier checkpoints are done. ``trainer``: the run's Trainer (its step, its accelerator)."""
    cause = disk_full_error(error, out)
    if cause is None:
        return
    try:
        finish_markers()
    except Exception:  # noqa: BLE001 - a marker the full disk also stopped: that checkpoint stays unmarked
        logger.warning("the marker of an earlier checkpoint could not be written either", exc_info=False)
    remove = trainer.accelerator.is_local_main_process
    raise DiskFull(disk_full_message(out, trainer.state.global_step, cause, final=final, remove=remove),
                   agreed=getattr(error, "agreed", False)) from None
