"""The judgetrain cache: model folders that judgetrain builds itself (the tiny judge, converted GGUF models), built
once per machine and trusted only when complete.

Layout: ``$JUDGETRAIN_CACHE`` (default ``~/.cache/judgetrain``) holds one folder per entry, e.g.
``tiny-judge-<fingerprint>/``, a ``<entry>.lock`` file beside it, and ``builds.jsonl`` (one line per build: entry,
time, seconds, host, process and rank).

- One process builds. Every process that needs an entry takes an exclusive file lock on ``<entry>.lock``; the first
  builds into a temporary folder and moves it into place, the others wait on the lock and then load the finished
  folder. This holds for the processes of one ``accelerate launch`` and for separate commands alike, before or after
  torch.distributed is initialised, because nothing here depends on ranks.
- A folder is trusted only when its manifest ``judgetrain_manifest.json``, written last, lists every file with its
  size and SHA-256 and the files on disk match. A folder without a manifest, with a missing, truncated or altered
  file, is rebuilt with a warning, never loaded.

``judgetrain cache list`` shows the entries, ``judgetrain cache clear`` removes them (or delete the folder).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

logger = logging.getLogger(__name__)

MANIFEST = "judgetrain_manifest.json"
_NOT_ENTRIES = {"rejects"}  # default rejects folder of `judgetrain data check` (judgetrain.data.validate)
_VERIFIED: dict[str, tuple] = {}  # folder -> stat signature of its files when this process verified it


def cache_root() -> Path:
    """``$JUDGETRAIN_CACHE``, or ``~/.cache/judgetrain``."""
    return Path(os.environ.get("JUDGETRAIN_CACHE") or Path.home() / ".cache" / "judgetrain")


# --------------------------------------------------------------------------------------------- manifests


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_path(path: Path) -> None:
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
        _fsync_path(path)
        files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {**(extra or {}), "files": files}
    tmp = folder / (name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / name)
    _fsync_path(folder)
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
        if hashes and isinstance(entry, dict) and entry.get("sha256") and _sha256(file) != entry["sha256"]:
            return f"{rel} does not match its SHA-256 in {name}"
    return None


# --------------------------------------------------------------------------------------------- locking


class LockBusy(BlockingIOError):
    """Another process holds the lock (raised by ``file_lock(..., wait=False)`` or when ``timeout`` runs out)."""


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, *, wait_message: str | None = None, poll: float = 0.2, wait: bool = True,
              timeout: float | None = None) -> Iterator[int]:
    """An exclusive ``flock`` on ``path`` (created if needed); yields the open descriptor. The kernel releases it
    when the holder exits, so a killed holder never leaves the lock stuck. Logs ``wait_message`` once if another
    process holds it; with ``wait=False`` (or once ``timeout`` seconds have passed) raises `LockBusy` instead."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if not wait or (deadline is not None and time.monotonic() > deadline):
                    raise LockBusy(e.errno, f"{path} is locked by another process") from None
                if not told and wait_message:
                    logger.info(wait_message)
                    told = True
                time.sleep(poll)
        yield fd
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# --------------------------------------------------------------------------------------------- entries


def cached_folder(entry: str, build: Callable[[Path], None], *, info: dict | None = None,
                  required: tuple[str, ...] = ("config.json",), description: str | None = None) -> str:
    """Return the path of cache entry ``entry``, building it with ``build(tmp_folder)`` if it is absent or broken.

    ``build`` writes an ordinary model folder into the empty folder it is given; it runs in exactly one process per
    machine (the holder of the entry's lock); every other process waits and then loads the result. ``required``:
    files that must be listed for the entry to count as complete (config, weights, tokenizer)."""
    root = cache_root()
    target = root / entry
    what = description or entry
    if _trusted(target, required):
        return str(target)
    with file_lock(root / f"{entry}.lock", wait_message=f"Waiting for another process to build {what} in {target}"):
        problem = manifest_problem(target, required=required)
        if problem is None:
            _VERIFIED[str(target)] = _signature(target)
            return str(target)
        if target.exists():
            logger.warning("Cache entry %s is incomplete or corrupt (%s): rebuilding it", target, problem)
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry}-", dir=root))
        try:
            started = time.time()
            logger.info("Building %s into %s (once per machine)", what, target)
            build(tmp)
            write_manifest(tmp, {"entry": entry, **(info or {})})
            problem = manifest_problem(tmp, required=required)
            if problem is not None:
                raise RuntimeError(f"building {what} produced an incomplete folder: {problem}")
            os.replace(tmp, target)
            _fsync_path(root)
            seconds = time.time() - started
            _record_build(root, entry, seconds)
            logger.info("Built %s in %.1f s", what, seconds)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _VERIFIED[str(target)] = _signature(target)
    return str(target)


def _record_build(root: Path, entry: str, seconds: float) -> None:
    """Append one line to ``builds.jsonl`` (under the entry's lock): which process built what, when, how long."""
    record = {"entry": entry, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(seconds, 2),
              "host": socket.gethostname(), "pid": os.getpid(), "rank": os.environ.get("RANK"),
              "local_rank": os.environ.get("LOCAL_RANK")}
    with (root / "builds.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _signature(folder: Path) -> tuple:
    """Names, sizes and modification times of the files of ``folder``: a rewrite changes it, reading does not."""
    try:
        return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file())
    except OSError:
        return ()


def _trusted(target: Path, required: tuple[str, ...]) -> bool:
    """Verified by this process and unchanged since (hashing a large model on every call would cost seconds), or
    verified now without taking the lock."""
    if not (target / MANIFEST).is_file():
        return False
    signature = _signature(target)
    if signature and _VERIFIED.get(str(target)) == signature:
        return True
    if manifest_problem(target, required=required) is None:
        _VERIFIED[str(target)] = signature
        return True
    return False


def save_model_folder(model, tokenizer, out: str | os.PathLike) -> None:
    """Write an ordinary model folder (config.json, generation_config.json, model.safetensors, tokenizer files) from
    every process that calls it. ``PreTrainedModel.save_pretrained`` writes weights on global rank 0 only once
    torch.distributed is up, so a builder running on another rank would leave a folder without weights."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]  # as save_pretrained records it (TRL picks the class by it)
    model.config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    tensors, seen = {}, set()
    for name, tensor in model.state_dict().items():  # tied weights (lm_head = embeddings) are stored once
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = tensor.detach().contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})  # byte-identical for equal weights
    tokenizer.save_pretrained(out)


def list_entries() -> list[dict]:
    root = cache_root()
    rows = []
    if not root.is_dir():
        return rows
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in _NOT_ENTRIES):
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        problem = manifest_problem(folder, hashes=False)
        rows.append({"entry": folder.name, "path": str(folder), "bytes": size, "state": problem or "complete"})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="judgetrain cache", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["list", "clear", "path"], help="list the entries, remove them, or print the root")
    args = parser.parse_args(argv)
    root = cache_root()
    if args.action == "path":
        print(root)
    elif args.action == "list":
        entries = list_entries()
        if not entries:
            print(f"{root}: empty")
        for e in entries:
            print(f"{e['entry']:48s} {e['bytes'] / 1e6:9.1f} MB  {e['state']}")
    else:
        n = 0
        if root.is_dir():
            for p in root.iterdir():
                if p.is_dir() and p.name not in _NOT_ENTRIES:
                    shutil.rmtree(p, ignore_errors=True)
                    n += 1
                elif p.suffix == ".lock":
                    p.unlink(missing_ok=True)
        print(f"removed {n} entries from {root}")
    return 0
