"""What a source or a revision string names: a hub repository id, a pinned commit. Shared by the data sources, the
model loader and the hub pinning of a run."""

# Late imports: huggingface_hub, datasets (inside the functions that use them): the shared leaves are imported by
# every command, the light ones included: a library comes in with the function that needs it.

from __future__ import annotations

import re
from pathlib import Path

from judgetrain.utils.errors import exception_chain

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def is_hub_id(source: str) -> bool:
    """``owner/name`` that is not an existing local path."""
    return not Path(source).exists() and bool(_HUB_ID.match(source)) and not source.startswith((".", "/", "~"))


def is_url(source: str) -> bool:
    """Whether a source is an http(s) URL: a file its authors publish outside the hub (OffsetBias's biasbench.json)."""
    return str(source).startswith(("https://", "http://"))


def is_commit(revision: str | None) -> bool:
    """A full 40-hex commit hash (a branch or tag name can move; a commit cannot)."""
    return bool(revision) and bool(_COMMIT.fullmatch(str(revision)))


def hub_offline(env=None) -> bool:
    """Whether the hub is offline for this process, by huggingface_hub's own rule (``HF_HUB_OFFLINE``, else
    ``TRANSFORMERS_OFFLINE``, read when it is imported); ``env``: decide for that environment instead."""
    from huggingface_hub import constants

    if env is None:
        return constants.HF_HUB_OFFLINE
    return constants._is_true(env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE"))


def cached_snapshot(repo_id: str, revision: str | None = None, repo_type: str = "model") -> Path | None:
    """The local Hugging Face cache's snapshot folder of a hub repository at ``revision`` (a commit, or a branch or
    tag through the cache's ``refs``; None: main), found without asking the hub: the folder is named by its commit.
    None where the cache holds no such snapshot; huggingface_hub's ``HFValidationError`` for a string that is not
    a repository id. The one answer the preflight, the run's hub pinning and the model loader give to "is it
    cached"."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, revision=revision, local_files_only=True))
    except HFValidationError:
        raise
    except Exception:  # noqa: BLE001 - not in the cache (LocalEntryNotFoundError and the OS errors of a bare cache)
        return None


def hub_refusal(exc: BaseException) -> BaseException | None:
    """The hub's answer in the chain of a failed load (None when there is none): no such repository or revision, a
    gated or disabled one, a missing file, an invalid id; huggingface_hub's exception types, and datasets' wrapper
    of them (which drops the cause)."""
    from huggingface_hub import errors

    answers = (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.DisabledRepoError,
               errors.RemoteEntryNotFoundError, errors.HFValidationError, errors.BadRequestError)
    try:
        from datasets.exceptions import DatasetNotFoundError

        answers += (DatasetNotFoundError,)
    except ImportError:
        pass
    return next((e for e in exception_chain(exc) if isinstance(e, answers)), None)


def hub_unreachable(exc: BaseException) -> bool:
    """Whether a failure to load a hub repository means the hub could not be asked (offline mode, no connection, a
    timeout, a server error), as opposed to its answer (`hub_refusal`), read from the exception types anywhere in
    the chain: a mistyped id is never taken for an offline hub."""
    from huggingface_hub import errors

    if hub_refusal(exc) is not None:
        return False
    unreachable = (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError, ConnectionError, TimeoutError)
    return any(isinstance(e, unreachable) or _transport_error(e) or isinstance(e, errors.HfHubHTTPError)
               and getattr(e.response, "status_code", 0) >= 500 for e in exception_chain(exc))


def _transport_error(exc: BaseException) -> bool:
    """An httpx transport failure (connect, timeout, protocol), whichever httpx build huggingface_hub uses."""
    return any(c.__name__ == "TransportError" and c.__module__.split(".")[0].startswith("httpx")
               for c in type(exc).__mro__)
