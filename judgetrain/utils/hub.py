"""What a source or a revision string names: a hub repository id, a pinned commit. Shared by the data sources, the
model loader and the hub pinning of a run."""

from __future__ import annotations

import re
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def is_hub_id(source: str) -> bool:
    """``owner/name`` that is not an existing local path."""
    return not Path(source).exists() and bool(_HUB_ID.match(source)) and not source.startswith((".", "/", "~"))


def is_commit(revision: str | None) -> bool:
    """A full 40-hex commit hash (a branch or tag name can move; a commit cannot)."""
    return bool(revision) and bool(_COMMIT.fullmatch(str(revision)))
