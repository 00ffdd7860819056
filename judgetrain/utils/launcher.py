"""Every process of an `accelerate launch` ends with its launcher."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path


def die_with_launcher() -> None:
    """Ask Linux to send this process SIGTERM when its `accelerate launch` / torchrun parent dies.

    accelerate's single-process launcher does not forward signals: a SIGTERM to `accelerate launch` (what a
    scheduler or spot reclaim sends to the command it started) killed the launcher and left the training process
    running on, orphaned, to the end of the run. With the parent-death signal the child gets SIGTERM too and
    GracefulStop saves a checkpoint and stops. The same for every process of `judgetrain judge` and `judgetrain eval`:
    torchrun starts its workers in sessions of their own, so a kill of the launcher's process group leaves them
    running, still writing the output_dir that a requeued launch reads. Only when the parent is a launcher: a shell
    parent exiting must not stop a `nohup python -m judgetrain.train` run."""
    if not sys.platform.startswith("linux"):
        return
    ppid = os.getppid()
    try:
        cmdline = Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return
    if not any(s in cmdline for s in ("accelerate", "torchrun", "torch.distributed.run")):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return
        if os.getppid() != ppid:  # the launcher died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)
    except (OSError, AttributeError):
        pass
