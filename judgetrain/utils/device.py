"""Which device this machine has."""

from __future__ import annotations


def has_accelerator() -> bool:
    """True when torch sees a CUDA (or ROCm) or XPU device; without one, accelerate must be told ``cpu=True``."""
    import torch

    xpu = getattr(torch, "xpu", None)
    return torch.cuda.is_available() or (xpu is not None and xpu.is_available())
