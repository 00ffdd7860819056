"""Reaches into datasets' private state (see `judgetrain.compat`; checked: datasets 5.2.0)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

_PARALLELISM = "TOKENIZERS_PARALLELISM"


def cache_file_beside(dataset: Any, fingerprint: str) -> str:
    """The path datasets gives a cache file of ``fingerprint`` for ``dataset``: ``cache-<fingerprint>.arrow`` in the
    folder of the dataset's first Arrow file (a random name in a temporary folder for an in-memory dataset).

    checked: datasets 5.2.0 (``Dataset._get_cache_file_path``, which TRL's precompute uses for the same file). A
    release that renames it fails at the first precompute with an AttributeError naming it."""
    return dataset._get_cache_file_path(fingerprint)


def dataset_fingerprint(dataset: Any) -> str:
    """The dataset's fingerprint (``Dataset._fingerprint``: what datasets names its cache files after).

    checked: datasets 5.2.0; read by name, an AttributeError names it when a release renames it."""
    return dataset._fingerprint


@contextlib.contextmanager
def tokenizers_parallelism_kept() -> Iterator[None]:
    """Around a ``Dataset.map(num_proc=N)``: the process's ``TOKENIZERS_PARALLELISM`` as it was before it.

    That map sets ``TOKENIZERS_PARALLELISM=false`` for its forked workers and afterwards puts back Python's
    ``os.environ`` mapping object, not the process's environment: the variable stays ``false`` where the tokenizers
    library reads it, and every later batch the main process encodes runs on one core instead of all of them (the
    eval rows' length audit after the training rows' map with ``dataset_num_proc`` 2). checked: datasets 5.2.0
    (``Dataset.map``); a release that restores the environment itself makes this a no-op."""
    before = os.environ.get(_PARALLELISM)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_PARALLELISM, None)
            os.unsetenv(_PARALLELISM)
        else:
            os.environ[_PARALLELISM] = before
