"""The training rows of a recipe, as TRL takes them: the mixture through the validating adapters, chat-control
strings neutralised, the length audit applied, written once per machine and read back memory-mapped."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from judgetrain.config.recipe import RecipeError


def build_train_dataset(script_args, training_args, *, max_rows_each: int | None = None):
    """The recipe's training mixture through the validating adapters."""
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
    return load_mixture(components, seed=training_args.seed)


def load_audited_dataset(script_args, training_args, tokenizer):
    """The training mixture after the length audit, as TRL takes it (prompt, chosen, rejected), and the audit
    report (also written to data_audit.json). The main process prepares it first; the others reuse its cache."""
    from accelerate import PartialState

    from judgetrain.data.chat import neutralise_dataset
    from judgetrain.data.lengths import audit_lengths

    state = PartialState()
    out = Path(training_args.output_dir)
    with state.main_process_first():
        dataset = build_train_dataset(script_args, training_args)
        # Content is text (judgetrain.data.chat): a control string in a row cannot fake a turn, here or in TRL.
        dataset = neutralise_dataset(dataset, tokenizer)
        dataset, audit = audit_lengths(
            dataset, tokenizer, training_args.max_length, script_args.long_rows,
            str(out / "rejects" / "long_rows.jsonl") if state.is_main_process else None,
            num_proc=training_args.dataset_num_proc,
        )
    if state.is_main_process:
        (out / "data_audit.json").write_text(json.dumps(audit, indent=1))
    if len(dataset) == 0:
        raise RecipeError(f"no training rows left after validation and the length audit (see {out / 'rejects'} and "
                          f"{out / 'data_audit.json'}): raise max_length or change long_rows / on_bad_row")
    # TRL's own length filter must find nothing left to drop silently: error/skip/shorten_prompt removed such rows.
    return reload_memory_mapped(dataset.select_columns(["prompt", "chosen", "rejected"]), out / "train_rows", state), audit


def reload_memory_mapped(dataset, path: Path, state):
    """The audited rows, written once (main process) and read back memory-mapped, with the adapters' in-memory
    objects released first. What the adapters and the audit parsed otherwise stays resident for the whole run
    (~15-30 MB over a bare TRL script that reads one parquet file)."""
    import gc

    from datasets import load_from_disk

    # One copy per machine, written by that machine's main process: every process reads its own machine's copy,
    # whether output_dir is on a shared file system or not.
    path = path / f"node-{os.environ.get('GROUP_RANK', '0')}"
    if state.is_local_main_process:
        if path.exists():  # a resumed run writes its rows afresh (and drops the old run's tokenization caches)
            import shutil

            shutil.rmtree(path)
        dataset.save_to_disk(str(path))
    state.wait_for_everyone()
    del dataset
    gc.collect()
    release_freed_memory()
    return load_from_disk(str(path))


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (Arrow's pool and glibc's arenas keep them otherwise)."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass

