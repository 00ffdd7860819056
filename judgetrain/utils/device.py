"""Which device this machine has."""

# Late imports: torch (inside the functions that use them): the shared leaves are imported by every command, the light
# ones included: a library comes in with the function that needs it.

from __future__ import annotations


def has_accelerator() -> bool:
    """True when torch sees a CUDA (or ROCm) or XPU device; without one, accelerate must be told ``cpu=True``."""
    import torch

    xpu = getattr(torch, "xpu", None)
    return torch.cuda.is_available() or (xpu is not None and xpu.is_available())
