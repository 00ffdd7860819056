"""Which machine a process runs on, answered once per process: ``(first global rank, index, count)`` of its machine,
from every process's (global rank, local rank, host) gathered over the process group the first time it is asked and
remembered after (later calls are no collective). Used for the rows folder of each machine (data.prepare), the
checkpoint markers' groups (run.checkpoints) and the parallelism report.

A machine is named by the global rank of its local main process: read from the process group, not from a launcher's
variables (torchrun sets GROUP_RANK, srun and DeepSpeed's launcher do not), and checked: the processes must be
numbered machine by machine (global rank = its machine's first rank + local rank) on the hosts they claim."""

# Late imports: torch (inside the functions that use them): the shared leaves are imported by every command, the light
# ones included: a library comes in with the function that needs it.

from __future__ import annotations

import os
import socket

from judgetrain.utils.errors import RecipeError

_KNOWN: dict[tuple[int, int, int], tuple[int, int, int]] = {}  # (rank, world, local rank) -> placement


def local_rank() -> int | None:
    """This process's rank on its machine as the launcher set it (LOCAL_RANK), None when it set none."""
    value = os.environ.get("LOCAL_RANK")
    return int(value) if value not in (None, "") else None


def machine_placement(rank: int, world: int, local: int, group=None) -> tuple[int, int, int]:
    """(first global rank, index, count) of this process's machine; the index counts machines in rank order (0 for
    the one holding rank 0). The first call of a layout is a collective over ``group`` (torch.distributed's default
    when None): call it on every rank; later calls answer from memory."""
    if world == 1:
        return 0, 0, 1
    key = (rank, world, local)
    if key not in _KNOWN:
        import torch.distributed as dist

        seen = [None] * world
        dist.all_gather_object(seen, (rank, local, socket.gethostname()), group=group)
        _KNOWN[key] = placement_of(seen, rank)
    return _KNOWN[key]


def machine_first_rank(rank: int, world: int, local: int | None) -> int:
    """The first global rank of this process's machine without a collective: `machine_placement`'s answer when this
    process has gathered it (the rows folder is named at the run's start), else the launcher's numbering (global rank
    less local rank, which that answer checks); 0 without a local rank. For code that may run in a background thread
    or on a subset of ranks, where a first gather could not be a collective every rank joins."""
    if world == 1 or local is None:
        return 0
    known = _KNOWN.get((rank, world, local))
    return known[0] if known is not None else rank - local


def placement_of(seen: list[tuple[int, int, str]], rank: int) -> tuple[int, int, int]:
    """(first global rank, index, count) of ``rank``'s machine from every process's (global rank, local rank, host)
    (`machine_key`'s refusal included)."""
    first = machine_key(seen, rank)
    firsts = sorted({r for r, loc, _ in seen if loc == 0})
    return first, firsts.index(first), len(firsts)


def machine_key(seen: list[tuple[int, int, str]], rank: int) -> int:
    """The global rank of the local main process of ``rank``'s machine, from every process's (global rank, local
    rank, host); `RecipeError` when the ranks are not numbered machine by machine (a process whose machine's first
    rank is not a local rank 0 on its own host)."""
    hosts = {r: host for r, loc, host in seen if loc == 0}
    wrong = [f"rank {r} (local rank {loc}) on {host}" for r, loc, host in seen if hosts.get(r - loc) != host]
    if wrong:
        raise RecipeError("the processes are not numbered machine by machine (global rank = machine's first rank + "
                          "local rank), so a machine's rows folder cannot be named: " + "; ".join(wrong[:4]) +
                          ". Launch with accelerate launch / torchrun, or srun with --distribution=block")
    local = next(loc for r, loc, _ in seen if r == rank)
    return rank - local
