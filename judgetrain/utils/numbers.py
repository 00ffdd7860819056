"""Numbers in JSON files: NaN and infinity have no JSON spelling."""

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
