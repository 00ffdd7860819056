"""A resume with nothing left to do, decided before torch, transformers or accelerate are imported.

A finished panel of 136,000 evaluations is started again as a matter of course (a job array restarted, a pipeline
step rerun); the full start imports the generation stack and reads and checks every item before it can say that
nothing is missing. This module says it from what the run itself wrote and the standard library alone:

- ``<output_dir>/items_file.json``, written whenever the run's identity is confirmed (`record_items`): the items
  file's resolved path, size, modification time (ns) and inode, taken before it was read, with the digest of the
  items read from it, their count and the rejected rows. The same stamp now means the same items (the rule of make
  and of the datasets cache). Hashing the file's bytes instead costs a read of the whole file at every start (about
  a second per few hundred MB on a busy core) and is what the full start does anyway, so a stamp that differs (the
  file rewritten, touched, copied) sends the start down the full path, which compares the items themselves;
- ``judge_run.json``: the judges (weights fingerprint, adapter weights by SHA-256) and the options, compared as the
  full start does, save what would build an alias, ask the hub or ask an endpoint server (a finished run holds the
  rows of what it was started with);
- the done index of every shard: every judge holds every item, each once, and ``evaluations.jsonl`` has the size of
  the committed rows it is merged from.

When any of these does not hold (a hub dataset or a folder of items, a run from before this file, a missing row, a
changed judge, bad rows that ``--on_bad_row error`` would refuse), `nothing_left` returns None and the command
starts in full, which refuses or resumes as it always did.
"""

# Late imports: judgetrain.utils, judgetrain.judge (inside the functions that use them): items are read and checked
# before any model loads: the model libraries come in when a judge is loaded.

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from judgetrain.judge.output import (EVALUATIONS, IDENTITY, done_items, identity_differences, merged_bytes, read_done,
                                     rejected_items)
from judgetrain.utils.files import read_json

logger = logging.getLogger(__name__)

ITEMS_FILE = "items_file.json"


def file_stamp(source: str) -> dict[str, Any] | None:
    """A local file's resolved path, size, modification time (ns) and inode; None for a folder or a hub id."""
    path = Path(str(source)).expanduser()
    if not path.is_file():
        return None
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def record_items(out: Path, item_set) -> None:
    """Write ``items_file.json`` for the items of a run whose identity was just confirmed (main process)."""
    from judgetrain.utils.files import write_json

    if item_set.stamp is None:
        (out / ITEMS_FILE).unlink(missing_ok=True)
        return
    write_json(out / ITEMS_FILE, {**item_set.stamp, "digest": item_set.digest(), "n_items": len(item_set.items),
                                  "n_rows": item_set.n_rows, "n_rejected": item_set.n_rejected,
                                  "rejects_path": item_set.rejects_path, "on_bad_row": item_set.on_bad_row})


def _items_unchanged(out: Path, source: str, on_bad_row: str, rejects_path: str, old: dict) -> dict | None:
    """The recorded items (``items_file.json``) when the file is the one the run read and would be read the same."""
    record = read_json(out / ITEMS_FILE)
    stamp = file_stamp(source)
    if record is None or stamp is None or any(record.get(k) != v for k, v in stamp.items()):
        return None
    items = old.get("items", {})
    if record.get("digest") != items.get("digest") or record.get("n_items") != items.get("n_items"):
        return None
    if record.get("n_rejected") and (on_bad_row != "skip" or record.get("rejects_path") != rejects_path):
        return None  # the full start refuses the bad rows, or writes them to another rejects file
    return record


def _all_committed(out: Path, names: list[str], n_items: int, retry: list[str]):
    """The committed batches when every judge holds every item, none of the judges in ``retry`` holds a row its
    endpoint refused (``--retry_rejected`` generates those again) and ``evaluations.jsonl`` is their merge (its size
    is `merged_bytes`); None otherwise."""
    committed = read_done(out)
    done = done_items(committed)
    if any(len(done.get(n, ())) != n_items for n in names):
        return None
    if any(not 0 <= i < n_items for n in names for i in done[n]):
        return None
    refused = rejected_items(committed)
    if any(refused.get(n) for n in retry):
        return None
    final, size = out / EVALUATIONS, merged_bytes(committed, names, n_items)
    if size is None or not final.is_file() or final.stat().st_size != size:
        return None
    return committed


def nothing_left(out: Path, source: str, specs: list, opts, *, on_bad_row: str = "error",
                 rejects_path: str = "", main: bool = True) -> dict | None:
    """``{"summary", "evaluations", "n_items", "n_rejected", "rejects_path"}`` when the run in ``out`` has every
    evaluation of these items, judges and options (the summary written again by the main process); None when the
    command has to start in full (see the module doc)."""
    old = read_json(out / IDENTITY)
    if old is None:
        return None
    record = _items_unchanged(out, source, on_bad_row, rejects_path, old)
    if record is None:
        return None
    try:
        new = {"items": old["items"], "judges": [s.identity(resolve=False) for s in specs], "options": opts.identity()}
    except (OSError, ValueError, KeyError):
        return None  # an adapter that cannot be read: the full start says so
    if identity_differences(old, new):
        return None
    names = [s.name for s in specs]
    n_items = record["n_items"]
    committed = _all_committed(out, names, n_items, [s.name for s in specs if s.retries_rejected(opts)])
    if committed is None:
        return None
    from judgetrain.judge.output import summarize, write_summary

    summary = summarize(committed, names, n_items)
    if main:
        logger.info("items: %d from %s (the file the run read: same size, modification time and inode)", n_items,
                    source)
        logger.info("resume %s: %d/%d evaluations done, 0 to generate (%d item(s) x %d judge(s))", out,
                    n_items * len(names), n_items * len(names), n_items, len(names))
        logger.info("nothing left to do: %s holds every evaluation", out / EVALUATIONS)
        write_summary(out, summary)
    return {"summary": summary, "evaluations": str(out / EVALUATIONS), "n_items": n_items,
            "n_rejected": record.get("n_rejected", 0), "rejects_path": record.get("rejects_path")}


def launch_rank() -> int:
    """This process's global rank as the launcher set it (torchrun's ``RANK``), before accelerate is imported."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0
