"""The base's evaluation, scored once and shared: round 0 of every loop config that names the same base model, the same
rows and the same modes reads one cached evaluation (``eval: {base_cache: true}``), so a grid of configs pays for the
base once.

The key is the SHA-256 of round 0's `judgetrain eval` command with its output folder left out and every local file or
folder it names replaced by the digest of its contents (the held-out pairs, a benchmark's file, a local model
folder), and judgetrain's version: the same key only where the same model reads the same rows in the same modes. The
entry lives in the judgetrain cache (``$JUDGETRAIN_CACHE``, `judgetrain.models.cache.cached_folder`): built by one
process under a lock, trusted only with its manifest (a torn entry is scored again), listed by `judgetrain cache
list`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from judgetrain import __version__
from judgetrain.models.cache import cached_folder
from judgetrain.utils.files import MANIFEST

logger = logging.getLogger(__name__)

# What an entry holds; a change makes entries built before it another key. 2: the base's log-probs as the reference of
# every later round's implicit scoring (`judgetrain.eval.reference.save_base_reference`), so no round scores the base
# a second time.
ENTRY_FORMAT = 2


def base_eval_key(argv: list[str]) -> str:
    """The cache key of round 0's eval command (``argv`` as `judgetrain eval` takes it)."""
    parts, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--output_dir":
            skip = True  # where it is written is no part of what it is
            continue
        parts.append(identity(Path(arg)) if arg and Path(arg).exists() else arg)
    text = json.dumps({"judgetrain": __version__, "format": ENTRY_FORMAT, "command": parts})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


WHOLE = 64 << 20  # files up to this size are read whole for the key; a larger one (a weights shard) by its ends
_END = 1 << 20


def identity(path: Path) -> str:
    """SHA-256 of a file's contents, or of a folder's files by relative path: each file up to `WHOLE` bytes read
    whole, a larger one by its size, modification time and first and last MiB (a 115 GB checkpoint is not read to
    name it)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode("utf-8") + b"\0")
        stat = f.stat()
        if stat.st_size <= WHOLE:
            h.update(f.read_bytes())
        else:
            with open(f, "rb") as fh:
                head = fh.read(_END)
                fh.seek(-_END, 2)
                h.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode() + head + fh.read(_END))
        h.update(b"\0")
    return h.hexdigest()


def cached_base_eval(argv: list[str], out: Path, run: Callable[[list[str]], None]) -> Path:
    """Round 0's evaluation in ``out``: copied from the cache entry of its key, which ``run(argv with its output
    folder)`` builds when absent. Returns ``out``."""
    key = base_eval_key(argv)
    built = []

    def build(folder: Path) -> None:
        built.append(True)
        at = argv.index("--output_dir")
        run([*argv[:at + 1], str(folder), *argv[at + 2:]])

    folder = Path(cached_folder(f"loop-base-eval-{key}", build, required=(), description="the base's evaluation",
                                info={"command": argv}))
    if not built:
        logger.info("round 0: the base's evaluation read from the cache (%s): the same model, rows and modes were "
                    "scored before", folder)
    shutil.copytree(folder, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(MANIFEST))
    return out
