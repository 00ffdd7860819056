"""Durable files: what judgetrain writes so that a reader, a crash or a kill never sees half of it.

- `write_json` / `write_lines`: through a temporary file, an fsync and an atomic rename (the old or the new file).
- `append_jsonl`: one JSON line appended and fsynced (metrics.jsonl, judgetrain_status.jsonl, builds.jsonl).
- `naming_failures`: a failed write names its file (a buffered write's error at flush or close names none).
- `write_manifest` / `manifest_problem`: a folder's files with their sizes and SHA-256, written last; a folder is
  trusted only when its files match (model cache entries, checkpoints, the final model). `hash_files` fsyncs and
  hashes files in a thread pool (hashlib releases the GIL), optionally stopping the full hashes at a deadline; a
  ``details`` entry adds the file's mtime and a digest of a few sampled blocks, which `manifest_problem(quick=True)`
  checks instead of re-reading every byte.
- `file_lock`: an exclusive ``flock`` (through filelock) that the kernel drops when its holder exits, however it
  exits.
"""

# Late imports: filelock (inside the functions that use them): the shared leaves are imported by every command, the
# light ones included: a library comes in with the function that needs it.

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

logger = logging.getLogger(__name__)

MANIFEST = "judgetrain_manifest.json"


SAMPLE_BLOCK = 1 << 18  # bytes read at the head, the middle and the tail of a file for its sample digest
_READ = 1 << 22


Deadline = float | Callable[[], float | None] | None  # a time.monotonic() value, or what returns the current one


def past(deadline: Deadline) -> bool:
    value = deadline() if callable(deadline) else deadline
    return value is not None and time.monotonic() > value


def sha256(path: Path, deadline: Deadline = None) -> str | None:
    """The file's SHA-256; None when ``deadline`` (`time.monotonic`) passes before its last block is read."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_READ), b""):
            if past(deadline):
                return None
            h.update(block)
    return h.hexdigest()


def sample_digest(path: Path, size: int) -> str:
    """SHA-256 of the size and of three blocks (head, middle, tail): a truncated, torn or replaced file differs, at
    the cost of three reads whatever its size. A change elsewhere in a file of the same size does not."""
    h = hashlib.sha256(f"{size}\n".encode())
    with path.open("rb") as f:
        for offset in sorted({0, max(size // 2 - SAMPLE_BLOCK // 2, 0), max(size - SAMPLE_BLOCK, 0)}):
            f.seek(offset)
            h.update(f.read(SAMPLE_BLOCK))
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


def file_entry(path: Path, *, deadline: Deadline = None, details: bool = False) -> dict:
    """``{"size", "sha256"}`` of ``path`` after an fsync of it (no ``sha256`` when ``deadline`` passed first); with
    ``details`` also its ``mtime_ns`` and ``sample`` (`sample_digest`), what a quick verification compares."""
    fsync_path(path)
    st = path.stat()
    entry: dict = {"size": st.st_size}
    digest = sha256(path, deadline)
    if digest is not None:
        entry["sha256"] = digest
    if details:
        entry.update(mtime_ns=st.st_mtime_ns, sample=sample_digest(path, st.st_size))
    return entry


def _workers(n: int, workers: int | None) -> int:
    return max(1, min(n, workers or min(os.cpu_count() or 1, 8)))


def hash_files(paths: Iterable[Path], *, deadline: Deadline = None, details: bool = False,
               workers: int | None = None) -> dict[Path, dict]:
    """`file_entry` of each path, in a pool of threads (the largest files first); past ``deadline`` the remaining
    files are fsynced and sized (and sampled) but not hashed."""
    paths = sorted(paths, key=lambda p: -p.stat().st_size)
    if not paths:
        return {}
    with ThreadPoolExecutor(_workers(len(paths), workers)) as pool:
        entries = pool.map(lambda p: file_entry(p, deadline=deadline, details=details), paths)
        return dict(zip(paths, entries))


def write_manifest(folder: str | os.PathLike, extra: dict | None = None, *, name: str = MANIFEST,
                   only: list[Path] | None = None, entries: dict[str, dict] | None = None,
                   details: bool = False) -> dict:
    """Write ``name`` into ``folder`` listing every file below it (relative path, size, SHA-256), after an fsync of
    each file, through a temporary file and an atomic rename: the manifest exists only once all files are on disk.
    ``only``: list these files instead (a model saved into a folder that also holds other things). ``entries``:
    the files' entries as already computed (`file_entry`, by the processes that wrote them), by relative path.
    ``details``: entries with mtime and sample digest (`file_entry`)."""
    folder = Path(folder)
    if entries is None:
        paths = sorted(only) if only is not None else _listed_files(folder, name)
        entries = {p.relative_to(folder).as_posix(): e for p, e in hash_files(paths, details=details).items()}
    manifest = {**(extra or {}), "files": dict(sorted(entries.items()))}
    tmp = folder / (name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / name)
    fsync_path(folder)
    return manifest


def read_manifest(folder: Path, name: str = MANIFEST) -> tuple[dict | None, str | None]:
    """(manifest, None), or (None, why it cannot be read)."""
    path = folder / name
    if not path.is_file():
        return None, f"no {name} (a build or save that never finished)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest["files"], dict):
            raise TypeError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"{name} is unreadable ({type(e).__name__}: {e})"
    return manifest, None


def _entry_problem(folder: Path, rel: str, entry, name: str, hashes: bool, quick: bool) -> str | None:
    file = folder / rel
    if not file.is_file():
        return f"{rel} is missing"
    st = file.stat()
    size = entry["size"] if isinstance(entry, dict) else entry
    if st.st_size != size:
        return f"{rel} has {st.st_size} bytes, {name} says {size}"
    if not hashes or not isinstance(entry, dict):
        return None
    if quick and "sample" in entry and st.st_mtime_ns == entry.get("mtime_ns"):
        # untouched since the save (same size and mtime): its sampled blocks stand for the whole file
        return None if sample_digest(file, size) == entry["sample"] else f"{rel} does not match its sampled blocks in {name}"
    if entry.get("sha256"):  # rewritten or copied since (another mtime), or a full verification: every byte
        return None if sha256(file) == entry["sha256"] else f"{rel} does not match its SHA-256 in {name}"
    if entry.get("sample") and sample_digest(file, size) != entry["sample"]:  # marked under a deadline: no SHA-256
        return f"{rel} does not match its sampled blocks in {name}"
    return None


def manifest_problem(folder: str | os.PathLike, *, name: str = MANIFEST, hashes: bool = True,
                     required: tuple[str, ...] = (), quick: bool = False, workers: int | None = None) -> str | None:
    """Why ``folder`` cannot be trusted (None when its manifest matches the files on disk). Every file: present,
    its size; with ``hashes`` its SHA-256, or with ``quick`` only for files whose mtime changed since the manifest
    was written (the others: their sampled blocks). Files are checked in a pool of threads; the first problem in
    path order is returned."""
    folder = Path(folder)
    if not folder.is_dir():
        return "missing"
    manifest, unreadable = read_manifest(folder, name)
    if unreadable:
        return unreadable
    files = manifest["files"]
    for req in required:
        if req not in files:
            return f"{req} is not listed in {name}"
    items = sorted(files.items())
    pool = ThreadPoolExecutor(_workers(len(items), workers))
    try:
        for problem in pool.map(lambda item: _entry_problem(folder, item[0], item[1], name, hashes, quick), items):
            if problem is not None:
                return problem
        return None
    finally:
        pool.shutdown(cancel_futures=True)  # the first problem decides: the files not yet read are not


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


@contextlib.contextmanager
def naming_failures(path: str | os.PathLike) -> Iterator[None]:
    """An OSError raised inside names ``path`` (the errno kept): a buffered write that fails at its flush or close
    (ENOSPC on a full disk) carries no file name, and the error that stops a run must say which file failed."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e


def append_jsonl(path: str | os.PathLike, record: dict[str, Any], *, fsync: bool = True, **dumps) -> None:
    """Append ``record`` as one JSON line (the folder created if needed), flushed and fsynced: a killed writer
    leaves at most a torn last line, which the readers skip. A failed write names ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming_failures(path), path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, **dumps) + "\n")
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def utf8_problem(data: bytes, exc: UnicodeDecodeError, line: int | None = None) -> str:
    """Where the first byte that is not UTF-8 sits, as a line and column (``line`` when data is one line)."""
    where = line if line is not None else data.count(b"\n", 0, exc.start) + 1
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    return f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {where} column {column}"


def cache_root() -> Path:
    """``$JUDGETRAIN_CACHE``, or ``~/.cache/judgetrain``."""
    return Path(os.environ.get("JUDGETRAIN_CACHE") or Path.home() / ".cache" / "judgetrain")


def read_json(path: Path) -> dict | None:
    """A JSON object file's contents; None when it is missing, unreadable, not JSON or not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
