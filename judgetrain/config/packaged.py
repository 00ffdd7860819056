"""The recipes and accelerate configs that ship with judgetrain, found by name.

The repository keeps them at its top level (``recipes/``, ``accelerate_configs/``); a built wheel carries a copy
inside the package (``judgetrain/recipes/``, ``judgetrain/accelerate_configs/``, put there by setup.py's build_py).
So ``judgetrain train quickstart --accelerate_config cpu`` works from any folder, after ``pip install`` as in a
source checkout. A path that exists always wins over a packaged name.
"""

from __future__ import annotations

import os
from pathlib import Path

KINDS = ("recipes", "accelerate_configs")
_PACKAGE = Path(__file__).resolve().parent.parent  # judgetrain/


def packaged_dir(kind: str) -> Path | None:
    """The folder of packaged ``recipes`` or ``accelerate_configs``: inside the installed package (a wheel), else at
    the top of the source checkout this package was imported from (an editable install, or the repository on the
    path). None when neither exists."""
    if kind not in KINDS:
        raise ValueError(f"unknown packaged kind {kind!r}; choose one of {KINDS}")
    inside = _PACKAGE / kind
    if inside.is_dir():
        return inside
    checkout = _PACKAGE.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / kind).is_dir():
        return checkout / kind
    return None


def packaged_names(kind: str) -> list[str]:
    """The names (file stems) of the packaged files of ``kind``, sorted."""
    folder = packaged_dir(kind)
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder else []


def packaged_file(value: str | os.PathLike, kind: str) -> Path | None:
    """The packaged file that ``value`` names (``quickstart`` or ``quickstart.yaml``), or None: when ``value`` is an
    existing path, has a folder part, or names no packaged file."""
    text = os.fspath(value)
    if not text or Path(text).exists() or os.sep in text or (os.altsep and os.altsep in text):
        return None
    folder = packaged_dir(kind)
    if folder is None:
        return None
    name = text[: -len(".yaml")] if text.endswith(".yaml") else text
    candidate = folder / f"{name}.yaml"
    return candidate if name in packaged_names(kind) and candidate.is_file() else None


def resolve_packaged(value: str | os.PathLike, kind: str) -> str:
    """``value`` as a path to open: the packaged file it names, else ``value`` unchanged (an existing path, or a
    missing one that the caller reports, with :func:`packaged_names` in the message)."""
    found = packaged_file(value, kind)
    return str(found) if found else os.fspath(value)
