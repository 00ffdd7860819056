"""The training rows of a recipe, as TRL takes them: the mixture through the validating adapters, chat-control
strings neutralised, the length audit applied, written once per machine and read back memory-mapped."""

# Late imports: judgetrain.data, accelerate, judgetrain.utils, datasets, pyarrow (inside the functions that use them):
# `judgetrain data check` and `pairs build` read rows without a model: tokenizer and training libraries come in with
# the functions that need them.

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import logging
import shutil
import sys
from pathlib import Path

from judgetrain.config.recipe import Recipe, RecipeError, check_tie_rows
from judgetrain.utils.machines import machine_key, placement_of  # noqa: F401 - their home before utils.machines

logger = logging.getLogger(__name__)


def build_train_dataset(recipe: Recipe, *, max_rows_each: int | None = None, flatten: bool = True):
    """The recipe's training mixture through the validating adapters (``flatten``: see `load_mixture`)."""
    script_args, training_args = recipe.script_args, recipe.training_args
    from judgetrain.data import load_mixture

    if not script_args.train_datasets:
        raise RecipeError("train_datasets is empty: a recipe needs at least one training component")
    components = []
    rejects_dir = Path(training_args.output_dir) / "rejects"
    for i, comp in enumerate(script_args.train_datasets):
        comp = dict(comp)
        comp.setdefault("on_bad_row", script_args.on_bad_row)
        comp.setdefault("rejects_path", str(rejects_dir / f"{comp['dataset']}_{i}.jsonl"))
        if max_rows_each is not None:
            comp["max_rows"] = min(comp.get("max_rows") or max_rows_each, max_rows_each)
            comp.pop("rows", None)
            comp.setdefault("weight", 1.0)
        components.append(comp)
    return load_mixture(components, seed=training_args.seed, flatten=flatten, groups=script_args.batch_groups)


def load_audited_dataset(recipe: Recipe, tokenizer):
    """The training mixture after the length audit, as TRL takes it (prompt, chosen, rejected and TRL's token ids),
    and the audit report (also written to data_audit.json).

    Prepared once per machine: the global main process first (a cache on a shared disk is then warm for the
    others), then the local main process of every other machine (each fills its own machine-local cache), as TRL
    orders its own tokenisation; the other processes build nothing and read their machine's rows folder. A
    preparation that fails (a bad row, a missing file) stops every process with its message, none waits for it.

    A start whose inputs equal those of the start that wrote the machine's rows folder (`preparation_key`: the
    recipe's data keys, each source file's size and modification time, the tokenizer, the code and library
    versions; a resume, a requeue) loads the folder without reading, validating, neutralising or tokenising a row."""
    training_args = recipe.training_args
    from accelerate import PartialState

    state = PartialState()
    out = Path(training_args.output_dir)
    folder = out / "train_rows" / machine_folder(state)
    rows = audit = failure = record = audit_key = None
    with state.main_process_first(), state.local_main_process_first():
        if state.is_local_main_process:
            try:
                key, why = preparation_key(recipe, tokenizer)
                kept = trusted_rows_record(folder) or {}
                if key and kept.get("preparation") == key and isinstance(kept.get("audit"), dict):
                    record, audit = kept, dict(kept["audit"])
                    if state.is_main_process:
                        (out / "data_audit.json").write_text(json.dumps(audit, indent=1))
                    logger.info("Training rows: sources, recipe data keys and tokenizer unchanged since the start that "
                                "wrote %s (preparation key %s...): its %d rows and token ids are used as they are, "
                                "nothing read, validated, neutralised or tokenised", folder, key[:12], kept.get("rows", 0))
                else:
                    if not key:
                        logger.info("Training rows: prepared from the sources (%s)", why)
                    audit_key = key
                    rows, audit = _audited_rows(recipe, tokenizer, out, state.is_main_process)
            except Exception as e:  # noqa: BLE001 - raised below, on every process
                failure = e
    _raise_on_every_process(failure, state)
    # TRL's own length filter must find nothing left to drop silently: error/skip/shorten_prompt removed such rows.
    extra = None
    if state.is_local_main_process and record is None:
        extra = {"preparation": audit_key, "audit": audit}
    dataset, fingerprint, reused = reload_memory_mapped(rows, out / "train_rows", state, record=record, extra=extra)
    audit = _machine_audit(audit, state)
    audit["rows_fingerprint"], audit["rows_reused"] = fingerprint, reused
    check_tie_rows(recipe.script_args, int(audit.get("tie_rows", 0)), recipe.path)
    return dataset, audit


PREPARATION_CODE = ("data", "compat/trl.py", "compat/datasets.py")  # judgetrain's code that shapes the rows


def preparation_key(recipe: Recipe, tokenizer) -> tuple[str | None, str]:
    """(key, "") for the inputs of the rows preparation, or (None, why) when they cannot be known without reading
    the data: a hub source not pinned to a commit (its branch may have moved), a tokenizer without a serialised
    backend. The key hashes the recipe's ``train_datasets`` (with on_bad_row), seed, max_length and long_rows;
    each local source's files by path, size and modification time (a file rewritten in place with the same size
    and time is not noticed: delete ``output_dir/train_rows`` to prepare again); a hub source's commit; the
    tokenizer's vocabulary, merges, special tokens and chat template; judgetrain's data code and the versions of
    the libraries that read and tokenise the rows."""
    script_args, training_args = recipe.script_args, recipe.training_args

    from judgetrain.data.io import resolve_local
    from judgetrain.data.mixture import component_source
    from judgetrain.utils.fingerprints import code_digest, library_versions
    from judgetrain.utils.hub import is_commit

    tokenizer_part = tokenizer_key(tokenizer)
    if tokenizer_part is None:
        return None, "the tokenizer has no serialised backend to compare"
    h = hashlib.sha256()

    def add(*parts):
        for part in parts:
            h.update(json.dumps(part, sort_keys=True, default=str).encode("utf-8") + b"\n")

    add(library_versions(), training_args.seed, training_args.max_length, script_args.long_rows,
        script_args.on_bad_row, code_digest(*PREPARATION_CODE))
    if script_args.batch_groups:  # the rows' order (a key written before batch_groups existed stays as it was)
        add("batch_groups", training_args.per_device_train_batch_size)
    for comp in script_args.train_datasets:
        comp = dict(comp)
        source = component_source(comp)
        if source is None:
            return None, f"unknown dataset {comp.get('dataset')!r}"
        add(comp)
        path = resolve_local(source, comp["dataset"])
        if path is None:
            revision = str(comp.get("revision") or "")
            if not is_commit(revision):
                return None, f"{source} is read from the hub at {revision or 'main'}, not at a commit"
            continue
        files = [path] if path.is_file() else sorted(
            f for f in path.rglob("*") if f.is_file() and not any(p.startswith(".") for p in f.relative_to(path).parts))
        for f in files:
            st = f.stat()
            add([str(f.resolve()), st.st_size, st.st_mtime_ns])
    add(tokenizer_part)
    return h.hexdigest(), ""


def tokenizer_key(tokenizer) -> str | None:
    """SHA-256 of what decides a tokenizer's ids: its serialised backend (vocabulary, merges, normaliser, added
    tokens), chat template, special tokens and class; None without a serialised backend."""

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    h = hashlib.sha256(backend.to_str().encode("utf-8"))
    h.update(json.dumps([getattr(tokenizer, "chat_template", None), tokenizer.special_tokens_map,
                         type(tokenizer).__name__], sort_keys=True, default=str).encode("utf-8"))
    return h.hexdigest()


def _audited_rows(recipe: Recipe, tokenizer, out: Path, main: bool):
    """The mixture through the adapters, neutralised and length-audited (on a machine's local main process)."""
    script_args, training_args = recipe.script_args, recipe.training_args
    from judgetrain.data.lengths import TOKEN_COLUMNS, audit_lengths

    dataset = build_train_dataset(recipe, flatten=False)  # the audit's map writes them in order
    # Content is text (judgetrain.data.chat): a control string in a row cannot fake a turn, here or in TRL; the
    # audit neutralises the rows in its own pass over them, before it tokenises them.
    dataset, audit = audit_lengths(
        dataset, tokenizer, training_args.max_length, script_args.long_rows,
        str(out / "rejects" / "long_rows.jsonl") if main else None,
        num_proc=training_args.dataset_num_proc, neutralise=True,
    )
    if script_args.batch_groups:
        audit["batch_groups"] = batch_groups_report(dataset["group"], training_args.per_device_train_batch_size)
    audit["tie_rows"] = tie_rows(dataset)
    if main:
        (out / "data_audit.json").write_text(json.dumps(audit, indent=1))
    if len(dataset) == 0:
        raise RecipeError(f"no training rows left after validation and the length audit (see {out / 'rejects'} and "
                          f"{out / 'data_audit.json'}): raise max_length or change long_rows / on_bad_row")
    kept = ["prompt", "chosen", "rejected", "tie", *TOKEN_COLUMNS]  # the ids: none when max_length is None (no audit)
    return dataset.select_columns([c for c in kept if c in dataset.column_names]), audit


def batch_groups_report(groups: list, batch_size: int) -> dict:
    """batch_groups' check of the rows as training reads them (after the length audit): how many groups are cut
    across per-device batches, warned of loudly (their rows then meet in no batch)."""
    from judgetrain.data.mixture import groups_cut

    report = groups_cut(groups, batch_size)
    if report["groups"] == 0:
        logger.warning("batch_groups: no row has a group (the `group` column, written by `judgetrain pairs known`): "
                       "the rows are shuffled one by one")
    elif report["cut"]:
        logger.warning("batch_groups: %d of %d groups are cut across per-device batches of %d rows (a group has up "
                       "to %d rows; a batch size that is not a multiple of it, rows without a group between them, or "
                       "rows the length audit dropped move the boundaries)", report["cut"], report["groups"],
                       batch_size, report["largest"])
    else:
        logger.info("batch_groups: each of %d groups lies within one per-device batch of %d rows", report["groups"],
                    batch_size)
    return report


def _raise_on_every_process(failure: Exception | None, state) -> None:
    """Raise ``failure`` where it happened and, on the processes that did not prepare the rows, a `RecipeError`
    with its message (one collective: every process passes here)."""
    if state.num_processes > 1:
        from accelerate.utils import gather_object

        failed = [f for f in gather_object([None if failure is None else
                                            (state.process_index, f"{type(failure).__name__}: {failure}")]) if f]
    else:
        failed = []
    if failure is not None:
        raise failure
    if failed:
        rank, message = failed[0]
        raise RecipeError(f"the training rows could not be prepared (on rank {rank}): {message}")


def _machine_audit(audit: dict | None, state) -> dict:
    """The audit of this machine's rows: its own on a local main process, its local main's on the others."""
    if state.num_processes == 1:
        return audit
    from accelerate.utils import gather_object

    audits = gather_object([audit])
    return dict(audits[state.process_index - state.local_process_index])


ROWS_FILE = "judgetrain_rows.json"  # in each machine's rows folder: the rows' fingerprint and count, written last


def machine_folder(state) -> str:
    """The name of this machine's rows folder: ``node-<global rank of its local main process>``.

    Read from the process group, not from a launcher's variables (torchrun sets GROUP_RANK, srun and DeepSpeed's
    launcher do not), so it holds for every launcher; checked across processes: every process of a machine must
    name the same folder and run on the same host as that machine's local main process. Where that cannot be
    known (no local rank, or ranks not numbered machine by machine) the run is refused with the reason."""
    return f"node-{machine_placement(state)[0]}"


def machine_placement(state) -> tuple[int, int, int]:
    """(first global rank, index, count) of this process's machine, from the process group (see `machine_folder`):
    the index counts machines in rank order (0 for the one holding rank 0)."""
    local = state.local_process_index
    if state.num_processes == 1:
        return 0, 0, 1
    if local < 0:
        raise RecipeError("cannot tell which machine this process runs on: the launcher set no LOCAL_RANK (launch "
                          "with accelerate launch or torchrun, or export LOCAL_RANK per task, e.g. from SLURM_LOCALID)")
    from judgetrain.utils.machines import machine_placement as placement

    return placement(state.process_index, state.num_processes, local)  # gathered once per process, then remembered


def reload_memory_mapped(dataset, path: Path, state, record: dict | None = None, extra: dict | None = None):
    """The audited rows, written once per machine (by its local main process, the only one that holds them: None on
    the others) and read back memory-mapped, with the adapters' in-memory objects released first. What the adapters
    and the audit parsed otherwise stays resident for the whole run (~15-30 MB over a bare TRL script that reads one
    parquet file).

    A start whose rows equal those already in the folder (same fingerprint: a resume, a requeue) keeps the folder
    as it is, and with it the caches TRL keeps beside the rows (precomputed reference log-probs): nothing is
    re-tokenised or recomputed. Rows that differ replace the folder and its caches. ``record``: the folder's record,
    when the caller already knows the folder holds this start's rows (`preparation_key`; ``dataset`` is None then);
    ``extra``: fields stored in the record beside the fingerprint. Returns (dataset, fingerprint of the rows,
    whether the folder was reused)."""

    from datasets import load_from_disk

    from judgetrain.utils.files import write_manifest
    from judgetrain.utils.fingerprints import data_fingerprint

    # One copy per machine, written by that machine's main process: every process reads its own machine's copy,
    # whether output_dir is on a shared file system or not.
    path = path / machine_folder(state)
    reused = None  # known to the machine's local main process, which decides
    if state.is_local_main_process and record is not None:
        reused = True
    elif state.is_local_main_process:
        fingerprint = data_fingerprint(dataset)
        kept = trusted_rows_record(path)
        reused = bool(kept) and kept.get("fingerprint") == fingerprint and kept.get("rows") == len(dataset)
        if not reused:
            if path.exists():  # other rows (or a folder a killed start left half written): its caches go with it
                shutil.rmtree(path)
            dataset.save_to_disk(str(path))
        if not reused or any(kept.get(k) != v for k, v in (extra or {}).items()):
            # the record lists the saved files (size, SHA-256, sampled blocks), written last: a torn folder is seen
            files = None if not reused else kept["files"]
            write_manifest(path, {"fingerprint": fingerprint, "rows": len(dataset), **(extra or {})}, name=ROWS_FILE,
                           only=None if files else _saved_files(path), entries=files, details=True)
    state.wait_for_everyone()
    del dataset
    gc.collect()
    release_freed_memory()
    record = _rows_record(path) or {}
    if state.is_local_main_process:
        caches = sorted(p.name for p in path.glob("cache-*.arrow"))
        if reused:
            logger.info("Training rows: the rows in %s are this run's (fingerprint %s...): kept with %d cache file(s) "
                        "of earlier starts (reference log-probs load from them, not recomputed)", path,
                        record["fingerprint"][:12], len(caches))
        else:
            logger.info("Training rows: %d rows written to %s", record.get("rows", 0), path)
    return load_from_disk(str(path)), record.get("fingerprint"), reused


def _rows_record(path: Path) -> dict | None:
    try:
        return json.loads((path / ROWS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _saved_files(path: Path) -> list[Path]:
    """The files `Dataset.save_to_disk` wrote (Arrow shards, dataset_info.json, state.json), not TRL's caches."""
    return sorted(p for p in path.iterdir() if p.is_file() and p.name != ROWS_FILE and not p.name.startswith("cache-"))


def trusted_rows_record(path: Path) -> dict | None:
    """The record of the rows folder ``path`` when its files match it (size, and the sampled blocks, or every byte
    of a file rewritten since); a torn folder (a file truncated or zero-filled, as a crash during its write or a
    full disk leaves it) is named in one warning and removed, so the caller prepares it again. None: no rows there."""

    from judgetrain.utils.files import manifest_problem

    if not (path / ROWS_FILE).is_file():
        return None
    problem = manifest_problem(path, name=ROWS_FILE, quick=True)
    if problem is None:
        return _rows_record(path)
    logger.warning("Rows folder %s is torn or from an older judgetrain (%s): preparing it again", path, problem)
    shutil.rmtree(path, ignore_errors=True)
    return None


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (Arrow's pool and glibc's arenas keep them otherwise)."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def tie_rows(dataset) -> int:
    """The training rows marked a tie (the ``tie`` column; 0 without one)."""
    return int(sum(dataset["tie"])) if "tie" in dataset.column_names else 0
