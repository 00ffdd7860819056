"""How the scoring engines group sequences: greedy token-budget batches, and the shared prefix of two sequences."""

from __future__ import annotations

from collections.abc import Sequence


MIN_FILL = 0.8  # a scoring batch closes before an item shorter than this share of its longest (padding bound)


def budget_batches(items: Sequence, cost, batch_tokens: int, max_batch: int, *, padded=None,
                   min_fill: float = 0.0) -> list[list]:
    """Greedy batches over ``items`` sorted most costly first: a batch grows while (its size + 1) x the cost of its
    first item fits ``batch_tokens``, it holds fewer than ``max_batch`` items and, with ``min_fill``, the next item's
    padded length (``padded``, default ``cost``: the tokens the forward pads to the batch's longest) is at least
    ``min_fill`` x the first's, so that no sequence of a batch is more than 1 - min_fill padding."""
    padded = padded or cost
    batches: list[list] = []
    current: list = []
    for item in items:
        if current and ((len(current) + 1) * cost(current[0]) > batch_tokens or len(current) >= max_batch
                        or padded(item) < min_fill * padded(current[0])):
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

