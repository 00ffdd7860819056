"""How the C allocator handles large blocks in a process that trains or scores on CPUs (``cpu_allocator``).

glibc serves every allocation above its mmap threshold (32 MiB at most) with a fresh ``mmap`` and gives it back to the
kernel on free. A training step's largest tensors are far above it (a batch's log-probabilities over the vocabulary:
5,000 tokens x 49,152 x 4 bytes, about 1 GB for SmolLM2), so every step maps them, faults them in page by page (each
page zeroed by the kernel) and unmaps them again: a fifth to a quarter of a CPU run's time went to the kernel.

- ``system`` (the default): the allocator as the C library set it.
- ``keep``: large blocks come from the heap and freed ones stay there for the next step (glibc's ``mallopt``:
  ``M_MMAP_MAX`` 0, ``M_TRIM_THRESHOLD`` 2 GiB), set in the process itself, so every launcher (`accelerate launch`,
  `judgetrain train`, the loop) gets it. The model's numbers are unchanged: only where the memory comes from differs.
  Applied only where the process computes on CPUs; on a GPU machine nothing is changed.

A heap that keeps what it freed grows where batches vary in size: a larger block does not fit the hole a smaller one
left, and the heap's free pages stay resident (a loop's training run with JudgeBench rows of up to 768 tokens grew to
23 GB under ``keep`` alone and was killed by the kernel at its 49th step; under glibc's default the same run peaks at
14.5 GB). So ``keep`` comes with a guard: a thread that reads, once a second, the process's anonymous resident memory
and the bytes glibc has in use (``mallinfo2``), and gives the free heap pages back to the kernel (``malloc_trim``) when
the resident memory exceeds `heap_limit` of the most it has seen in use (a quarter more, at least `KEEP_FREE_BYTES`
more), or when the machine has less than a tenth of its memory available: a step's own peak stays in the heap, a heap
grown past it does not.
Each trim is logged and counted (`heap_trims`, in the launch's line of `judgetrain_status.jsonl`); the pages given
back are faulted in again by the next step that uses them, as with ``system``.

Where the C library is not glibc (musl, macOS), or is older than 2.33 (no ``mallinfo2``), ``keep`` cannot be set: it
says so in a warning and in the run's summary (``cpu_allocator: unavailable``). Measured by `judgetrain bench --only
train` (the ``cpu_allocator`` option: samples per second and peak memory against the same run without it).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import threading
import time

logger = logging.getLogger(__name__)

CHOICES = ("keep", "system")
_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_MAX = -4
KEEP_TRIM_BYTES = (1 << 31) - 1  # mallopt takes an int: free memory at the heap's top is returned above 2 GiB only
KEEP_FREE_BYTES = 1 << 30  # the guard leaves at least this much free heap resident beyond the most in use
GUARD_PERIOD_S = 1.0

_applied: str | None = None
_trims = 0
_peak_in_use = 0


class Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later): ``uordblks`` in use in the heap, ``hblkhd`` in mappings."""
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def glibc() -> ctypes.CDLL:
    """The C library, its ``mallinfo2`` (where it has one) returning `Mallinfo2`."""
    libc = ctypes.CDLL("libc.so.6")
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = Mallinfo2
    return libc


def apply_cpu_allocator(choice: str, on_cpu: bool) -> str:
    """Set ``choice`` (`CHOICES`) for this process when it computes on CPUs; returns what holds, for the run's
    summary: ``keep``, ``system``, ``not_cpu`` (a GPU process: nothing changed) or ``unavailable`` (no glibc,
    warned)."""
    global _applied
    if choice not in CHOICES:
        raise ValueError(f"cpu_allocator: one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "system":
        return _applied or "system"  # mallopt's settings last for the process
    if not on_cpu:
        return "not_cpu"
    if _applied == "keep":
        return "keep"
    libc_name, _ = platform.libc_ver()
    if libc_name != "glibc":
        logger.warning("cpu_allocator: keep is not set: the C library is %s, not glibc; large tensors are mapped "
                       "and unmapped at every step as the system allocator does (cpu_allocator: system avoids this "
                       "warning)", libc_name or "unknown")
        return "unavailable"
    libc = glibc()
    if not hasattr(libc, "mallinfo2"):
        logger.warning("cpu_allocator: keep is not set: glibc %s has no mallinfo2 (2.33 or later), which its guard "
                       "against a growing heap reads (cpu_allocator: system avoids this warning)",
                       platform.libc_ver()[1])
        return "unavailable"
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, KEEP_TRIM_BYTES)):
        logger.warning("cpu_allocator: keep is not set: glibc's mallopt refused it")
        return "unavailable"
    _applied = "keep"
    threading.Thread(target=_guard, name="judgetrain-heap-guard", daemon=True).start()
    logger.info("cpu_allocator: keep: large blocks come from the heap and freed ones stay for the next step, "
                "not mapped and unmapped each step; a guard gives the free pages back where the heap grows a quarter "
                "above the most in use (cpu_allocator: system for the C library's default)")
    return "keep"


def heap_trims() -> int:
    """How many times this process's guard gave the free heap pages back to the kernel (0 without ``keep``)."""
    return _trims


def trim_if_grown(free_bytes: int = KEEP_FREE_BYTES) -> bool:
    """Give the free heap pages back to the kernel (``malloc_trim``) where the anonymous resident memory is above
    `heap_limit` of the most glibc has had in use at any call, or the machine has less than a tenth of its memory
    available; returns whether it did (each time logged and counted)."""
    global _trims, _peak_in_use
    libc = glibc()
    info = libc.mallinfo2()
    in_use = info.uordblks + info.hblkhd
    _peak_in_use = max(_peak_in_use, in_use)
    resident = anonymous_resident_bytes()
    if resident - in_use < free_bytes // 4:
        return False  # little to give back
    grown = resident > heap_limit(_peak_in_use, free_bytes)
    if not grown and not _machine_short():
        return False
    libc.malloc_trim(0)
    _trims += 1
    logger.info("cpu_allocator: keep: the heap held %.1f GB resident where at most %.1f GB was in use%s; its free "
                "pages went back to the kernel (%.1f GB resident now; trim %d of this process)", resident / 1e9,
                _peak_in_use / 1e9, "" if grown else ", and the machine is short of memory",
                anonymous_resident_bytes() / 1e9, _trims)
    return True


def heap_limit(peak_in_use: int, free_bytes: int = KEEP_FREE_BYTES) -> int:
    """The resident bytes ``keep`` lets the heap hold: the most in use, and a quarter more (at least ``free_bytes``)."""
    return peak_in_use + max(peak_in_use // 4, free_bytes)


def _machine_short() -> bool:
    """Whether the machine has less than a tenth of its memory available (``/proc/meminfo``)."""
    fields = {}
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0])
    return "MemAvailable" in fields and fields["MemAvailable"] < fields["MemTotal"] // 10


def anonymous_resident_bytes() -> int:
    """This process's anonymous resident memory (``RssAnon``: the heap and other private memory, not mapped files)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _guard() -> None:
    while True:
        time.sleep(GUARD_PERIOD_S)
        try:
            trim_if_grown()
        except Exception as e:  # the run goes on; the heap is then unguarded, and that is said
            logger.warning("cpu_allocator: keep: the guard against a growing heap stopped (%s: %s); the heap keeps "
                           "what it frees from here on", type(e).__name__, e)
            return
