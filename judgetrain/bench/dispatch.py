"""The torch dispatch mode `judgetrain memory check` measures under: every aten op's output tensors handed to a tracker.

A module of its own because its base class is torch's private `TorchDispatchMode` (`judgetrain.compat.torch`), taken
when this module is imported: `judgetrain.bench.memory` imports it only when a measurement starts.
"""

from __future__ import annotations

from typing import Any, Callable

from judgetrain.compat.torch import each_tensor, tensor_dispatch_mode


class TrackingMode(tensor_dispatch_mode()):
    """Inside ``with TrackingMode(track):`` every op runs as usual and ``track`` sees each tensor it returns."""

    def __init__(self, track: Callable[[Any], Any]):
        super().__init__()
        self.track = track

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        each_tensor(self.track, out)
        return out
