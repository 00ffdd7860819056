"""Reaches into accelerate's private state (see `judgetrain.compat`; checked: accelerate 1.15.0)."""

# Late imports: accelerate (inside the functions that use them): each hook imports the library it reaches into when it
# is installed or called, so a moved private name fails there, named.

from __future__ import annotations

from typing import Any


def shared_distributed_type() -> Any:
    """The distributed type of Accelerate's process state as it stands, without creating a state (None before one
    exists): ``PartialState._shared_state["distributed_type"]``, the Borg dict every `PartialState` shares.

    checked: accelerate 1.15.0. A release that renames the dict fails here with an AttributeError at the launch."""
    from accelerate import PartialState

    return PartialState._shared_state.get("distributed_type")


def present_distributed_type(kind: Any) -> None:
    """Overwrite the distributed type of the joined process state (devices, backend and process group stay), so that
    the next `Accelerator()` builds the plugin of ``kind`` (FSDP2 or DeepSpeed over a gloo CPU group): writes
    ``PartialState._shared_state["distributed_type"]``, which `PartialState` serves as ``self.distributed_type``.

    checked: accelerate 1.15.0. A release that keeps the type elsewhere makes the write ineffective: Accelerate then
    runs plain DDP, and `ParallelismReport` refuses the run at its first step (``asked for fsdp ..., Accelerate runs
    MULTI_CPU``); a renamed dict fails with an AttributeError at the launch."""
    from accelerate import PartialState

    PartialState._shared_state["distributed_type"] = kind
