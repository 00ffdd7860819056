"""Reaches into datasets' private state (see `judgetrain.compat`; checked: datasets 5.2.0)."""

from __future__ import annotations

from typing import Any


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
