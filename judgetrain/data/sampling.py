"""Deterministic row caps that sample evenly across groups (perturbation types, domains)."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Hashable, Sequence


def balanced_sample(keys: Sequence[Hashable], max_rows: int | None, seed: int = 0) -> list[int]:
    """Indices of at most ``max_rows`` rows, spread as evenly as possible over the distinct ``keys``.

    Every group gets ``max_rows // n_groups`` rows (the remainder to the groups first in sorted order); a group
    with fewer rows gives its unused share to the others. Within a group rows are drawn with ``random.Random(seed)``.
    The result keeps the original row order, so the same inputs and seed always give the same rows.
    """
    if max_rows is None or max_rows >= len(keys):
        return list(range(len(keys)))
    if max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    order = sorted(groups, key=str)
    quota = {k: 0 for k in order}
    left = max_rows
    open_groups = [k for k in order if groups[k]]
    while left > 0 and open_groups:
        share, extra = divmod(left, len(open_groups))
        for j, k in enumerate(open_groups):
            quota[k] += share + (1 if j < extra else 0)
        left = 0
        for k in open_groups:
            over = quota[k] - len(groups[k])
            if over > 0:
                quota[k] -= over
                left += over
        open_groups = [k for k in open_groups if quota[k] < len(groups[k])]
    rng = random.Random(seed)
    picked: list[int] = []
    for k in order:
        idx = list(groups[k])
        rng.shuffle(idx)
        picked.extend(idx[: quota[k]])
    return sorted(picked)


def deterministic_subset(n: int, k: int, seed: int = 0) -> list[int]:
    """``k`` of ``range(n)`` drawn with ``random.Random(seed)``, in original order (k > n repeats whole passes)."""
    rng = random.Random(seed)
    full, rest = divmod(k, n) if n else (0, 0)
    out = list(range(n)) * full
    out.extend(sorted(rng.sample(range(n), rest)))
    return out
