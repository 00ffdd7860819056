"""Digests of what a cached or recorded result was computed from: the library versions, judgetrain's own source,
the training rows. Shared by the rows cache, the eval rows' audit and a run's identity."""

# Late imports: judgetrain, numpy, pyarrow (inside the functions that use them): the shared leaves are imported by
# every command, the light ones included: a library comes in with the function that needs it.

from __future__ import annotations

import hashlib
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


def library_versions() -> dict:

    import judgetrain

    versions = {"judgetrain": judgetrain.__version__}
    for name in LIBRARIES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


def code_digest(*names: str) -> str:
    """SHA-256 of judgetrain's own source files under ``names`` (files or folders, relative to the package): what
    a cached result keyed on it was computed with; an edit to that code makes the cache stale."""

    import judgetrain

    root = Path(judgetrain.__file__).parent
    h = hashlib.sha256()
    for name in names:
        path = root / name
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(str(f.relative_to(root)).encode("utf-8") + b"\0" + f.read_bytes())
    return h.hexdigest()


def data_fingerprint(dataset) -> str:
    """SHA-256 of the training rows as the trainer sees them (after mixture, validation and the length audit): two
    runs with equal fingerprints train on the same rows in the same order. Token-id columns (the audit's, TRL's
    tokenisation) are hashed as their Arrow values and lengths, not as JSON: ~4k ids a row at real lengths."""

    import numpy as np
    import pyarrow.compute as pc

    h = hashlib.sha256()
    h.update(f"{len(dataset)}\n".encode())
    ids = [c for c in dataset.column_names if c.endswith("_ids")]
    text = dataset.select_columns([c for c in dataset.column_names if c not in ids]) if ids else dataset
    for batch in text.iter(batch_size=1000):
        h.update(json.dumps(batch, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
    for name in ids:  # the rows in order (an indices mapping applied), 10k rows' ids at a time
        h.update(f"\n{name}\n".encode())
        for batch in dataset.select_columns([name]).with_format("arrow").iter(batch_size=10_000):
            for chunk in batch.column(name).chunks:
                h.update(np.ascontiguousarray(pc.list_value_length(chunk).to_numpy(zero_copy_only=False), np.int64))
                h.update(np.ascontiguousarray(chunk.flatten().to_numpy(zero_copy_only=False), np.int64))
    return h.hexdigest()
