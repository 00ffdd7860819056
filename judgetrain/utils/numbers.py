"""Numbers: NaN and infinity in JSON files (they have no JSON spelling), and a score range checked."""

from __future__ import annotations

import math


def nan_to_none(value):
    """``value`` with NaN/inf floats as None (JSON null), recursively, for metrics and stats files. (Rejects files
    keep the raw bad value as text instead: judgetrain.data.validate.json_safe.)"""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [nan_to_none(v) for v in value]
    return value


def check_scale(scale: tuple[float, float]) -> None:
    """A score range ``(lo, hi)`` is accepted only with lo below hi (``--scale 5 1`` is refused, not read as empty)."""
    lo, hi = scale
    if not lo < hi:
        raise ValueError(f"--scale {lo:g} {hi:g}: the low end must be below the high end (e.g. --scale {min(lo, hi):g} "
                         f"{max(lo, hi):g})")
