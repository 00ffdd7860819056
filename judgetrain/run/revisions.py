"""Hub revisions pinned at a run's start: every hub repository the run reads (the model, each training source on the
hub) at a branch or tag (``main`` when none is named) is resolved to the commit it names at the first start, and the
run reads that commit from then on.

- The commits are recorded in the run identity (``judgetrain_run.json``, ``revisions``: ``"model:<repo>@<asked>"`` or
  ``"dataset:<repo>@<asked>"`` -> commit), and so in each checkpoint's copy of it.
- A resume (``--resume auto`` or a checkpoint) reads the recorded commits: a SLURM requeue after an upstream push
  trains on the weights and rows it started with, and says that the branch has moved.
- The model's weights, config, tokenizer and chat template all load at the commit (``model_revision``), and the saved
  adapter names it; a hub source loads at it (the component's ``revision``), so the rows' preparation key can be made
  and an unchanged restart reads nothing.
- Asked of the hub (``HfApi.repo_info``), or read from the local cache when the hub is offline (``HF_HUB_OFFLINE``).
  When neither can tell, the repository is read at its branch as before, with a warning, and the identity records
  ``None`` for it.
- A revision that is already a commit (40 hexadecimal digits) is left as it is; local paths are never looked up.
"""

# Late imports: judgetrain.utils, huggingface_hub, judgetrain.data, judgetrain.run (inside the functions that use
# them): `judgetrain report` and `status` read a run folder without torch: it comes in with the functions that need a
# process group or a checkpoint list.

from __future__ import annotations

import logging
from pathlib import Path

from judgetrain.config.recipe import Recipe
from judgetrain.utils.hub import is_commit

logger = logging.getLogger(__name__)


def hub_commit(repo_id: str, revision: str | None, repo_type: str = "model") -> str | None:
    """The commit ``revision`` (a branch, a tag; None: ``main``) of a hub repository names now: asked of the hub,
    or read from the local cache's ``refs`` when the hub is offline. None when neither can tell (with the reason
    logged)."""
    from judgetrain.utils.hub import cached_snapshot, hub_offline

    revision = revision or "main"
    if hub_offline():
        try:  # the cache's refs/<revision> names the snapshot folder, named by its commit
            folder = cached_snapshot(repo_id, revision, repo_type)
        except Exception as e:  # noqa: BLE001 - not a repository id: the load reports it with its own message
            folder, why = None, type(e).__name__
        else:
            why = "not in the cache"
        if folder is None:  # the load reports it with its own message
            logger.warning("%s %s at %s: the hub is offline and the cache does not name its commit (%s)", repo_type,
                           repo_id, revision, why)
            return None
        return folder.name if is_commit(folder.name) else None
    from huggingface_hub import HfApi

    try:
        sha = HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision).sha
    except Exception as e:  # noqa: BLE001 - unreachable hub, unknown repo or revision, no access
        logger.warning("%s %s at %s: could not ask the hub for its commit (%s: %s)", repo_type, repo_id, revision,
                       type(e).__name__, e)
        return None
    return sha if is_commit(sha) else None


def hub_reads(recipe: Recipe, model_path: str) -> list[dict]:
    """The hub repositories the run reads at a branch or tag: the model, and each training component whose source is
    a hub id (``index``: its place in ``train_datasets``)."""
    script_args, model_args = recipe.script_args, recipe.model_args
    from judgetrain.data.io import resolve_local
    from judgetrain.data.mixture import component_source
    from judgetrain.utils.hub import is_hub_id

    reads = []
    if is_hub_id(model_path) and not is_commit(model_args.model_revision):
        reads.append({"kind": "model", "repo": model_path, "asked": model_args.model_revision or "main"})
    for i, comp in enumerate(script_args.train_datasets or []):
        source = component_source(comp)
        if source is None:
            continue  # the mixture names the unknown dataset itself
        try:
            local = resolve_local(source, comp["dataset"])
        except FileNotFoundError:
            continue  # the reader names the missing path
        if local is None and not is_commit(comp.get("revision")):
            reads.append({"kind": "dataset", "repo": str(source), "asked": str(comp.get("revision") or "main"),
                          "index": i})
    return reads


def read_key(read: dict) -> str:
    return f"{read['kind']}:{read['repo']}@{read['asked']}"


def recorded_revisions(output_dir: str | Path) -> dict:
    """The commits the run in ``output_dir`` recorded at its start (empty: none, or a run from before pinning)."""
    from judgetrain.run.state import IDENTITY_FILE
    from judgetrain.utils.files import read_json

    current = (read_json(Path(output_dir) / IDENTITY_FILE) or {}).get("current") or {}
    return dict(current.get("revisions") or {})


def pin_hub_revisions(recipe: Recipe, model_path: str) -> dict:
    """Resolve (first start) or reuse (resume) the commit of every hub read, decided on the main process; set
    ``model_args.model_revision`` and each hub component's ``revision`` to it. Returns the identity's
    ``revisions``."""
    script_args, model_args, output_dir = recipe.script_args, recipe.model_args, recipe.training_args.output_dir
    from judgetrain.utils.ranks import decided_on_main

    reads = hub_reads(recipe, model_path)
    if not reads:
        return {}

    def decide() -> dict:
        recorded = recorded_revisions(output_dir) if script_args.resume else {}
        pins: dict[str, str | None] = {}
        for read in reads:
            key, repo, asked = read_key(read), read["repo"], read["asked"]
            now = hub_commit(repo, asked, read["kind"])
            commit = recorded.get(key)
            if commit:
                if now and now != commit:
                    logger.warning("%s %s: %s is now at %s; this run started at %s and resumes there (start a new "
                                   "run to train on the new commit)", read["kind"], repo, asked, now[:12], commit[:12])
                else:
                    logger.info("%s %s: resuming at %s, the commit %s named at the run's start", read["kind"], repo,
                                commit[:12], asked)
            elif now:
                commit = now
                logger.info("%s %s: %s is commit %s; the run reads that commit from now on, resumes included",
                            read["kind"], repo, asked, commit)
            else:
                logger.warning("%s %s: read at %s, not pinned to a commit: a resume after an upstream push would "
                               "read other files (set its revision to a commit)", read["kind"], repo, asked)
            pins[key] = commit
        return pins

    pins = decided_on_main(decide)
    for read in reads:
        commit = pins.get(read_key(read))
        if not commit:
            continue
        if read["kind"] == "model":
            model_args.model_revision = commit
        else:
            i = read["index"]
            script_args.train_datasets[i] = {**script_args.train_datasets[i], "revision": commit}
    return pins
