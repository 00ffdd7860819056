"""Deterministic row caps that sample evenly across groups (perturbation types, domains)."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Hashable, Sequence


def balanced_sample(keys: Sequence[Hashable], max_rows: int | None, seed: int = 0) -> list[int]:
    """Indices of at most ``max_rows`` rows, spread as evenly as possible over the distinct ``keys``.

    Round robin over the groups in sorted order, one row from each group per pass, until ``max_rows`` are taken:
    every group gets the same count until it runs out, and the last, partial pass goes to the groups first in
    sorted order. Within a group rows are drawn with ``random.Random(seed)``. The result keeps the original row
    order, so the same inputs and seed always give the same rows. Training adapters (``max_rows``) and the eval
    suites (``eval_max_rows``) both select with it.
    """
    if max_rows is None or max_rows >= len(keys):
        return list(range(len(keys)))
    if max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    rng = random.Random(seed)
    queues = []
    for k in sorted(groups, key=str):
        idx = list(groups[k])
        rng.shuffle(idx)
        queues.append(idx)
    picked: list[int] = []
    depth = 0
    while len(picked) < max_rows:
        for q in queues:
            if depth < len(q) and len(picked) < max_rows:
                picked.append(q[depth])
        depth += 1
    return sorted(picked)


def deterministic_subset(n: int, k: int, seed: int = 0) -> list[int]:
    """``k`` of ``range(n)`` drawn with ``random.Random(seed)``, in original order (k > n repeats whole passes)."""
    rng = random.Random(seed)
    full, rest = divmod(k, n) if n else (0, 0)
    out = list(range(n)) * full
    out.extend(sorted(rng.sample(range(n), rest)))
    return out
