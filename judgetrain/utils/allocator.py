"""How the C allocator handles large blocks in a process that trains or scores on CPUs (``cpu_allocator``).

glibc serves every allocation above its mmap threshold (32 MiB at most) with a fresh ``mmap`` and gives it back to the
kernel on free. A training step's largest tensors are far above it (a batch's log-probabilities over the vocabulary:
5,000 tokens x 49,152 x 4 bytes, about 1 GB for SmolLM2), so every step maps them, faults them in page by page (each
page zeroed by the kernel) and unmaps them again: a fifth to a quarter of a CPU run's time went to the kernel.

- ``keep`` (the default): large blocks come from the heap and freed ones stay there for the next step (glibc's
  ``mallopt``: ``M_MMAP_MAX`` 0, ``M_TRIM_THRESHOLD`` 2 GiB), set in the process itself, so every launcher
  (`accelerate launch`, `judgetrain train`, the loop) gets it. The model's numbers are unchanged: only where the
  memory comes from differs. Applied only where the process computes on CPUs; on a GPU machine nothing is changed.
- ``system``: the allocator as the C library set it.

Where the C library is not glibc (musl, macOS), ``keep`` cannot be set: it says so in a warning and in the run's
summary (``cpu_allocator``). Measured by `judgetrain bench --only train` (the ``cpu_allocator`` option: samples per
second and peak memory against the same run without it).
"""

from __future__ import annotations

import ctypes
import logging
import platform

logger = logging.getLogger(__name__)

CHOICES = ("keep", "system")
_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_MAX = -4
KEEP_TRIM_BYTES = (1 << 31) - 1  # mallopt takes an int: free memory at the heap's top is returned above 2 GiB only

_applied: str | None = None


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
    libc = ctypes.CDLL("libc.so.6")
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, KEEP_TRIM_BYTES)):
        logger.warning("cpu_allocator: keep is not set: glibc's mallopt refused it")
        return "unavailable"
    _applied = "keep"
    logger.info("cpu_allocator: keep: large blocks come from the heap and freed ones stay for the next step, "
                "not mapped and unmapped each step (cpu_allocator: system for the C library's default)")
    return "keep"
