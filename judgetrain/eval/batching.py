"""How the scoring engines group sequences: greedy token-budget batches, and the shared prefix of two sequences."""

from __future__ import annotations

from collections.abc import Sequence


def budget_batches(items: Sequence, cost, batch_tokens: int, max_batch: int) -> list[list]:
    """Greedy batches over ``items`` sorted most costly first: a batch grows while (its size + 1) x the cost of its
    first item fits ``batch_tokens`` and it holds fewer than ``max_batch`` items."""
    batches: list[list] = []
    current: list = []
    for item in items:
        if current and ((len(current) + 1) * cost(current[0]) > batch_tokens or len(current) >= max_batch):
            batches.append(current)
            current = []
        current.append(item)
    if current:
        batches.append(current)
    return batches


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

