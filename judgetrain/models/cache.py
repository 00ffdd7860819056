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

# Late imports: safetensors (inside the functions that use them): the model cache and aliases are read without loading
# a model (`judgetrain cache`, the dry run): torch and transformers come in with a load.

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable

from judgetrain.utils.files import (
    MANIFEST,
    append_jsonl,
    cache_root,
    file_lock,
    fsync_path,
    manifest_problem,
    write_manifest,
)

logger = logging.getLogger(__name__)

NOT_ENTRIES = {"rejects"}  # default rejects folder of `judgetrain data check` (judgetrain.data.validate)
_VERIFIED: dict[str, tuple] = {}  # folder -> stat signature of its files when this process verified it


# --------------------------------------------------------------------------------------------- manifests


# --------------------------------------------------------------------------------------------- locking


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
            fsync_path(root)
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
    append_jsonl(root / "builds.jsonl", record, fsync=False)


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
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in NOT_ENTRIES):
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        problem = manifest_problem(folder, hashes=False)
        rows.append({"entry": folder.name, "path": str(folder), "bytes": size, "state": problem or "complete"})
    return rows
