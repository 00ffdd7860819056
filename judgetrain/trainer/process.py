"""What every process of an `accelerate launch` does first and last: join the process group (gloo on a machine
without a GPU) and follow the launcher if it dies; at the end, destroy every process group itself and exit without
the interpreter's teardown (`end_process`)."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import sys
import threading
from typing import NoReturn

import torch
from trl import DPOConfig

from judgetrain.config.recipe import RecipeError, load_recipe_file, split_recipe_argv
from judgetrain.run.checkpoints import forget_marker_group
from judgetrain.trainer.parallelism import join_process_group
from judgetrain.utils.launcher import die_with_launcher


def init_process_state(argv: list[str] | None = None):
    """Join the launcher's process group before anything reads the device, refusing a parallelism this machine
    would silently downgrade (judgetrain.trainer.parallelism.join_process_group: on a machine without a GPU the processes
    join over gloo; Trainer would otherwise run N independent copies). The group gets the recipe's ``ddp_timeout``
    (read from ``argv`` ahead of the full parse): Accelerate does not create the group again once it exists, so a
    group created without it would keep the backend's default (NCCL's 10 minutes) while rank 0 alone prepares data."""

    die_with_launcher()
    state, _ = join_process_group(timeout_s=ddp_timeout_of(argv or []))
    return state


def ddp_timeout_of(argv: list[str]) -> int:
    """The recipe's ``ddp_timeout`` in seconds: the command line's ``--ddp_timeout``, else the recipe file's, else
    TrainingArguments' default."""

    recipe, overrides = split_recipe_argv(argv)
    value = next((f.default for f in dataclasses.fields(DPOConfig) if f.name == "ddp_timeout"), 1800)
    if recipe:
        value = load_recipe_file(recipe).get("ddp_timeout", value)
    for i, token in enumerate(overrides):
        if token == "--ddp_timeout" and i + 1 < len(overrides):
            value = overrides[i + 1]
        elif token.startswith("--ddp_timeout="):
            value = token.split("=", 1)[1]
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        raise RecipeError(f"ddp_timeout: {value!r} is not a whole number of seconds") from None
    if seconds <= 0:
        raise RecipeError(f"ddp_timeout: {seconds} must be a positive number of seconds")
    return seconds


def destroy_process_groups(*, barrier: bool) -> None:
    """Every process group (the markers' own gloo group and the default one) destroyed here, not by the interpreter's
    teardown (see `judgetrain.train.finish`); after a ``barrier`` when every rank is known to reach it."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if barrier:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    forget_marker_group()


def close_process_group(agreed: bool) -> bool:
    """After a stop (a full disk): the process group destroyed here, not by the interpreter's teardown (see
    `judgetrain.train.finish`). When every rank ``agreed`` on the stop they meet at a barrier first, so that none exits while the main
    process still writes its status (torchrun ends the others at the first exit); otherwise no barrier (the other
    ranks are in another collective, or gone). Returns whether this is the main process."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return True
    main = torch.distributed.get_rank() == 0
    try:
        destroy_process_groups(barrier=agreed)
    except Exception:  # noqa: BLE001 - the exit code says what happened; the teardown is best effort
        pass
    return main


def end_process(code: int) -> NoReturn:
    """Exit with ``code``; a process of a launch of several does so without the interpreter's teardown.

    `torch.distributed.destroy_process_group` forgets a group, but the DDP model still holds it, so its gloo worker
    threads live on into the interpreter's finalization. One that only then lets go of a collective's tensor (late,
    on a busy machine) must take the GIL to free the tensor's Python object, and a thread that asks for the GIL of a
    finalizing interpreter is ended by pthread_exit, whose unwinding through a C++ frame calls std::terminate:
    "terminate called without an active exception", SIGABRT, after the run had written exit code 0
    (docs/reliability.md, "A finished run exits 0 under load"). So the other non-daemon threads are joined, the exit
    handlers (logging, trackers, temporary files) run while the interpreter is whole (``atexit._run_exitfuncs``, the
    standard library's own, checked: Python 3.11), the streams are flushed, and the process leaves with
    ``os._exit``: no C++ thread meets a finalizing interpreter."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        sys.exit(code)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said there
            pass
    os._exit(code)
