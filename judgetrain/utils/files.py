"""Durable files: what judgetrain writes so that a reader, a crash or a kill never sees half of it.

- `write_json` / `write_lines`: through a temporary file, an fsync and an atomic rename (the old or the new file).
- `append_jsonl`: one JSON line appended and fsynced (metrics.jsonl, judgetrain_status.jsonl, builds.jsonl).
- `write_manifest` / `manifest_problem`: a folder's files with their sizes and SHA-256, written last; a folder is
  trusted only when its files match (model cache entries, checkpoints, the final model).
- `file_lock`: an exclusive ``flock`` (through filelock) that the kernel drops when its holder exits, however it
  exits.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

logger = logging.getLogger(__name__)

MANIFEST = "judgetrain_manifest.json"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_path(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _listed_files(folder: Path, manifest_name: str) -> list[Path]:
    return sorted(
        p for p in folder.rglob("*")
        if p.is_file() and p.name != manifest_name and not p.name.endswith(".tmp")
    )


def write_manifest(folder: str | os.PathLike, extra: dict | None = None, *, name: str = MANIFEST,
                   only: list[Path] | None = None) -> dict:
    """Write ``name`` into ``folder`` listing every file below it (relative path, size, SHA-256), after an fsync of
    each file, through a temporary file and an atomic rename: the manifest exists only once all files are on disk.
    ``only``: list these files instead (a model saved into a folder that also holds other things)."""
    folder = Path(folder)
    files = {}
    for path in (sorted(only) if only is not None else _listed_files(folder, name)):
        fsync_path(path)
        files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": sha256(path)}
    manifest = {**(extra or {}), "files": files}
    tmp = folder / (name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / name)
    fsync_path(folder)
    return manifest


def manifest_problem(folder: str | os.PathLike, *, name: str = MANIFEST, hashes: bool = True,
                     required: tuple[str, ...] = ()) -> str | None:
    """Why ``folder`` cannot be trusted (None when its manifest matches the files on disk)."""
    folder = Path(folder)
    if not folder.is_dir():
        return "missing"
    path = folder / name
    if not path.is_file():
        return f"no {name} (a build or save that never finished)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{name} is unreadable ({type(e).__name__}: {e})"
    for req in required:
        if req not in files:
            return f"{req} is not listed in {name}"
    for rel, entry in sorted(files.items()):
        file = folder / rel
        if not file.is_file():
            return f"{rel} is missing"
        size = entry["size"] if isinstance(entry, dict) else entry
        if file.stat().st_size != size:
            return f"{rel} has {file.stat().st_size} bytes, {name} says {size}"
        if hashes and isinstance(entry, dict) and entry.get("sha256") and sha256(file) != entry["sha256"]:
            return f"{rel} does not match its SHA-256 in {name}"
    return None


class LockBusy(BlockingIOError):
    """Another process holds the lock (raised by ``file_lock(..., wait=False)`` or when ``timeout`` runs out)."""


class LockUnsupported(OSError):
    """The lock file's filesystem does not support ``flock`` (some NFS and FUSE mounts); ``strerror`` is flock's."""


# what flock fails with where the filesystem has no locks (NFS without lockd: ENOLCK; FUSE, some others: EOPNOTSUPP)
_NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, *, wait_message: str | None = None, poll: float = 0.2, wait: bool = True,
              timeout: float | None = None, on_acquired: Callable[[int], None] | None = None) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (filelock's `UnixFileLock`; the file is created if needed, left in place on
    release, and a process that fails to get the lock neither truncates nor removes it). The kernel releases it when
    the holder exits, so a killed holder never leaves the lock stuck. Logs ``wait_message`` once if another process
    holds it; with ``wait=False`` (or once ``timeout`` seconds have passed) raises `LockBusy` instead.
    ``on_acquired(fd)`` runs once the lock is held (the holder may write who it is into the file). Raises
    `LockUnsupported` where the filesystem has no ``flock``: filelock's fallback there, a marker file, would outlive a
    killed holder. Waiting without a timeout for a lock this same process holds raises filelock's RuntimeError
    (deadlock) rather than hanging."""
    from filelock import Timeout, UnixFileLock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = UnixFileLock(path, mode=0o644, thread_local=False, fallback_to_soft=False, on_acquired=on_acquired)
    busy = LockBusy(errno.EAGAIN, f"{path} is locked by another process")
    try:
        try:
            lock.acquire(blocking=False)
        except Timeout:
            if not wait:
                raise busy from None
            if wait_message:
                logger.info(wait_message)
            try:
                lock.acquire(timeout=-1 if timeout is None else timeout, poll_interval=poll)
            except Timeout:
                raise busy from None
    except LockBusy:
        raise
    except OSError as e:
        if e.errno not in _NO_FLOCK:
            raise
        raise LockUnsupported(e.errno, os.strerror(e.errno), str(path)) from None
    try:
        yield
    finally:
        lock.release()


def write_json(path: str | os.PathLike, value: Any) -> None:
    """Through a temporary file and a rename: a reader sees the old or the new file, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)



def write_lines(path: str | os.PathLike, lines: Iterable[str]) -> Path:
    """Write ``lines`` (each without its newline) through a temporary file and a rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def append_jsonl(path: str | os.PathLike, record: dict[str, Any], *, fsync: bool = True, **dumps) -> None:
    """Append ``record`` as one JSON line (the folder created if needed), flushed and fsynced: a killed writer
    leaves at most a torn last line, which the readers skip."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, **dumps) + "\n")
        f.flush()
        if fsync:
            os.fsync(f.fileno())
