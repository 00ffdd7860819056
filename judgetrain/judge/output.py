"""What `judgetrain judge` writes, so that a kill at any moment loses at most the batch in flight.

    <output_dir>/judge_run.json          the run's identity: items digest, judges (weights, adapter SHA-256), options
    <output_dir>/shards/rank-R.jsonl     the rows process R generated, one JSON object a line, appended per batch
    <output_dir>/shards/rank-R.index     the done index: one line per committed batch
    <output_dir>/evaluations.jsonl       the merged panel (every item x judge once), written at the end (`merge`:
                                         streamed, never every row in memory)
    <output_dir>/summary.json            per judge: parse rate, reasons, mean score, tokens/s

A batch is committed in two appends, each one ``write`` then ``fsync``: its rows to the shard, then one index line
``{"end": <shard size after the rows>, "judge": ..., "items": [...], "score": [...], ...}``. A batch whose index line
is not complete (no newline, not JSON, zero bytes, not the shape above, rows past the shard's end) does not exist, nor
does any line after it: at start the owner of a shard cuts the shard back to the last committed ``end`` and the index
to the end of that batch's line, saying so in one warning, and their items are generated again, so a row is never
duplicated, lost or torn. The index
alone says what is done and holds each row's score, reason and token count: a resume and the summary never read the
rows themselves. ``shards/rank-R.lock`` (an flock the kernel drops when its holder dies) keeps two runs from writing
one shard.
"""

# Late imports: judgetrain.config (inside the functions that use them): items are read and checked before any model
# loads: the model libraries come in when a judge is loaded.

from __future__ import annotations

import json
import logging
import os
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from judgetrain.utils.files import file_lock, fsync_path, write_json

logger = logging.getLogger(__name__)

IDENTITY = "judge_run.json"
SHARDS = "shards"
EVALUATIONS = "evaluations.jsonl"
SUMMARY = "summary.json"
REJECTS = "rejects.jsonl"
REJECTED_REASON = "endpoint_rejected"  # a row's reason when its endpoint refused the prompt (judge.endpoint)


@dataclass
class Committed:
    """The committed batches of one shard."""

    shard: Path
    end: int = 0  # bytes of the shard that belong to committed batches
    index_bytes: int = 0  # bytes of the index that are complete lines
    batches: list[dict] = field(default_factory=list)
    torn: str | None = None  # why the index stops being trusted at index_bytes (None: every byte of it is)


def shard_paths(out: Path, rank: int) -> tuple[Path, Path]:
    folder = out / SHARDS
    return folder / f"rank-{rank}.jsonl", folder / f"rank-{rank}.index"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _batch_problem(batch: Any, end_before: int, shard_size: int) -> str | None:
    """Why one index line is not a committed batch whose rows are in the shard (None when it is)."""
    if not isinstance(batch, dict):
        return "a line that is not a JSON object"
    end, items = batch.get("end"), batch.get("items")
    if not _is_int(end) or end < end_before:
        return f"a line whose end {end!r} is not a byte offset after {end_before}"
    if end > shard_size:
        return f"a line whose rows end at byte {end}, past the shard's {shard_size}"
    if not isinstance(batch.get("judge"), str) or not isinstance(items, list) or not all(map(_is_int, items)):
        return "a line without its judge name and item indices"
    if any(isinstance(v, list) and len(v) != len(items) for v in batch.values() if v is not items):
        return f"a line whose per-row lists do not have its {len(items)} item(s)"
    return None


def read_index(index: Path) -> Committed:
    """The committed batches of ``index`` (its shard beside it): complete JSON lines of the right shape whose rows
    are in the shard, up to the first line that is not one (``torn`` says what it is; nothing after it counts)."""
    shard = index.with_suffix(".jsonl")
    out = Committed(shard)
    try:
        data = index.read_bytes()
    except FileNotFoundError:
        return out
    size = shard.stat().st_size if shard.exists() else 0
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        try:
            batch = json.loads(data[pos:nl])
        except ValueError:
            out.torn = "a line that is not JSON"
            break
        out.torn = _batch_problem(batch, out.end, size)
        if out.torn is not None:
            break
        out.batches.append(batch)
        out.end = batch["end"]
        pos = nl + 1
    out.index_bytes = pos
    if out.torn is None and pos < len(data):
        out.torn = "a last line without its newline (a batch never committed)"
    if out.torn is not None and not data[pos:].strip(b"\0"):
        out.torn = "zero bytes (a write the disk never completed)"
    return out


def read_done(out: Path) -> list[Committed]:
    """Every shard's committed batches (the shards of every process count: a resume may run on fewer or more)."""
    folder = out / SHARDS
    if not folder.is_dir():
        return []
    return [read_index(p) for p in sorted(folder.glob("rank-*.index"))]


def done_items(committed: Iterable[Committed]) -> dict[str, set[int]]:
    """judge name -> the item indices committed for it."""
    done: dict[str, set[int]] = {}
    for c in committed:
        for batch in c.batches:
            done.setdefault(batch["judge"], set()).update(batch["items"])
    return done


def _rows(committed: Iterable[Committed]):
    """(shard position, judge, item, its row refused by the endpoint, the row's bytes or None) of every committed row,
    in the order a merge reads them."""
    for s, c in enumerate(committed):
        for batch in c.batches:
            items = batch["items"]
            reasons = batch.get("reason") or [None] * len(items)
            sizes = batch.get("bytes") or [None] * len(items)
            for item, reason, size in zip(items, reasons, sizes):
                yield s, batch["judge"], item, reason == REJECTED_REASON, size


def rejected_items(committed: Iterable[Committed]) -> dict[str, set[int]]:
    """judge name -> the items whose row is a refusal of the endpoint (``reason`` endpoint_rejected) and no later row
    answered: what ``--retry_rejected`` generates again."""
    kept: dict[tuple[str, int], bool] = {}
    for _, judge, item, rejected, _ in _rows(committed):
        if kept.get((judge, item), True):  # `merge`'s rule: a row stays unless it is a refusal a later row replaces
            kept[(judge, item)] = rejected
    out: dict[str, set[int]] = {}
    for (judge, item), rejected in kept.items():
        if rejected:
            out.setdefault(judge, set()).add(item)
    return out


def merged_bytes(committed: list[Committed], judges: list[str], n_items: int) -> int | None:
    """The size `merge` gives evaluations.jsonl: every committed row but those it drops (an endpoint's refusal that a
    later row of the same item replaced, a row committed twice); None where a dropped row's size is not in the index
    (batches committed before it held ``bytes``)."""
    column = {j: k for k, j in enumerate(judges)}
    kept: dict[int, tuple[bool, int | None]] = {}
    dropped = 0
    for _, judge, item, rejected, size in _rows(committed):
        if judge not in column or not 0 <= item < n_items:
            continue
        k = item * len(judges) + column[judge]
        if k in kept:
            gone = kept[k][1] if kept[k][0] else size  # the refusal replaced, or the second copy dropped
            if gone is None:
                return None
            dropped += gone
            if not kept[k][0]:
                continue
        kept[k] = (rejected, size)
    return sum(c.end for c in committed) - dropped


class ShardWriter:
    """Process ``rank``'s shard: locked, cut back to its committed part, appended one batch at a time."""

    def __init__(self, out: Path, rank: int):
        self.shard, self.index = shard_paths(out, rank)
        self.shard.parent.mkdir(parents=True, exist_ok=True)
        self._lock = file_lock(self.shard.with_suffix(".lock"), wait=False)
        self._lock.__enter__()  # LockBusy: another process writes this shard
        committed = read_index(self.index)
        cut = {}
        for path, keep in ((self.shard, committed.end), (self.index, committed.index_bytes)):
            if path.exists() and path.stat().st_size > keep:
                cut[path] = path.stat().st_size - keep
                os.truncate(path, keep)
        if cut:
            rows = sum(len(b["items"]) for b in committed.batches)
            logger.warning("done index %s is torn at byte %d (%s): its %d committed batch(es) (%d row(s)) kept, %d "
                           "byte(s) of it and %d of %s cut off; the items they held are generated again", self.index,
                           committed.index_bytes, committed.torn or "rows past its last line", len(committed.batches),
                           rows, cut.get(self.index, 0), cut.get(self.shard, 0), self.shard.name)
        self._shard = self.shard.open("ab")
        self._index = self.index.open("ab")
        fsync_path(self.shard.parent)

    def append(self, rows: list[dict], judge: str, items: list[int], meta: dict[str, list]) -> None:
        """Commit one batch: the rows, then the index line that makes them count."""
        lines = [(json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8") for row in rows]
        self._shard.write(b"".join(lines))
        self._shard.flush()
        os.fsync(self._shard.fileno())
        record = {"end": self._shard.tell(), "judge": judge, "items": items, **meta,
                  "bytes": [len(line) for line in lines]}  # each row's line: `merged_bytes`
        self._index.write((json.dumps(record) + "\n").encode("utf-8"))
        self._index.flush()
        os.fsync(self._index.fileno())

    def close(self) -> None:
        for f in (self._shard, self._index):
            f.close()
        self._lock.__exit__(None, None, None)


def merge(out: Path, judges: list[str], n_items: int, committed: list[Committed]) -> tuple[Path, int]:
    """Write ``evaluations.jsonl``: every item x judge once, by item then judge, from the committed rows (the lines
    are copied as they are, never parsed again). Returns (path, rows). Raises RuntimeError when a row is missing;
    a row committed twice (never, unless two runs shared a shard) is written once and counted.

    It streams (a panel of 136,000 items x 4 judges is gigabytes of rows): one pass over each shard, a block at a
    time, records where each row's line is (`_row_places`: about 14 bytes a row), then the lines are copied in item
    order, each read back at its place; no row is held beyond the one being copied."""
    places, twice = _row_places(judges, n_items, committed)
    shard_of, offset, length = places
    if (n_missing := shard_of.count(-1)):
        first = []
        for k, s in enumerate(shard_of):
            if s < 0 and len(first) < 3:
                first.append((judges[k % len(judges)], k // len(judges)))
            elif len(first) == 3:
                break
        raise RuntimeError(f"{n_missing} evaluation(s) missing from the shards, first {first}")
    if twice:
        logger.warning("%d evaluation(s) were committed twice; each is written once", twice)
    path = out / EVALUATIONS
    tmp = path.with_name(path.name + ".tmp")
    files = [c.shard.open("rb") for c in committed]
    try:
        with tmp.open("wb", buffering=MERGE_BLOCK) as f:
            for k in range(len(shard_of)):
                f.write(os.pread(files[shard_of[k]].fileno(), length[k], offset[k]) + b"\n")
            f.flush()
            os.fsync(f.fileno())
    finally:
        for handle in files:
            handle.close()
    os.replace(tmp, path)
    fsync_path(out)
    return path, n_items * len(judges)


MERGE_BLOCK = 1 << 20  # bytes a merge reads from a shard at a time (its first pass), and its write buffer


def _row_places(judges: list[str], n_items: int, committed: list[Committed],
                block: int | None = None) -> tuple[tuple[array, array, array], int]:
    """Where each item x judge's row is: three arrays over ``item * len(judges) + judge`` (the shard's position in
    ``committed``, -1 for none; the line's byte offset; its length without the newline), and how many rows were
    committed twice (the first kept; an endpoint's refusal is replaced by a later row of its item, ``--retry_rejected``,
    and not counted). Rows of a judge not in ``judges`` or an item past ``n_items`` are passed over."""
    column = {j: k for k, j in enumerate(judges)}
    slots = n_items * len(judges)
    shard_of, offset, length = array("h", [-1]) * slots, array("q", [0]) * slots, array("l", [0]) * slots
    refused = bytearray(slots)
    twice = 0
    for s, c in enumerate(committed):
        keys = ((judge, item, rejected) for shard, judge, item, rejected, _ in _rows([c]))
        for (judge, item, rejected), (start, size) in zip(keys, _line_spans(c.shard, c.end, block or MERGE_BLOCK)):
            if judge not in column or not 0 <= item < n_items:
                continue
            k = item * len(judges) + column[judge]
            if shard_of[k] >= 0 and not refused[k]:
                twice += 1
                continue
            shard_of[k], offset[k], length[k], refused[k] = s, start, size, rejected
    return (shard_of, offset, length), twice


def _line_spans(shard: Path, end: int, block: int):
    """(offset, length) of each newline-ended line of the first ``end`` bytes of ``shard``, read ``block`` bytes at a
    time (a line longer than a block is carried over, never held twice)."""
    if end <= 0:
        return
    with shard.open("rb") as f:
        pos = 0  # file offset of buf[0]
        buf = b""
        while pos + len(buf) < end:
            data = f.read(min(block, end - pos - len(buf)))
            if not data:
                break
            buf += data
            line_start = 0
            while (nl := buf.find(b"\n", line_start)) >= 0:
                yield pos + line_start, nl - line_start
                line_start = nl + 1
            pos += line_start
            buf = buf[line_start:]


# ------------------------------------------------------------------------------------------------ identity
def identity_differences(old: dict, new: dict) -> list[str]:
    """One line per difference that makes the rows already written not those this command would write."""
    diffs = []
    if old.get("items", {}).get("digest") != new["items"]["digest"]:
        o, n = old.get("items", {}), new["items"]
        diffs.append(f"items: {o.get('source')!r} ({o.get('n_items')} items, digest {str(o.get('digest'))[:12]}) -> "
                     f"{n['source']!r} ({n['n_items']} items, digest {n['digest'][:12]})")
    old_j, new_j = [_judge_record(j) for j in old.get("judges", [])], new["judges"]
    if [j.get("name") for j in old_j] != [j["name"] for j in new_j]:
        diffs.append(f"judges: {[j.get('name') for j in old_j]} -> {[j['name'] for j in new_j]}")
    else:
        for a, b in zip(old_j, new_j):
            for key in sorted(set(a) & set(b)):  # what both runs recorded (a run before a key was added: not it)
                if a.get(key) != b.get(key):
                    diffs.append(_judge_difference(b["name"], key, a.get(key), b.get(key)))
    for key in sorted(set(old.get("options", {})) | set(new["options"])):
        a, b = old.get("options", {}).get(key), new["options"].get(key)
        if a != b:
            diffs.append(f"option {key}: {a!r} -> {b!r}")
    return diffs


def _judge_record(judge: dict) -> dict:
    """A judge of a recorded identity as this version writes it: a record from before ``kind`` gets it from its
    ``endpoint``; the URL and the key variable, which a record from before kept, are not compared."""
    kind = judge.get("kind") or ("endpoint" if judge.get("endpoint") else "local")
    return {**{k: v for k, v in judge.items() if k not in ("endpoint", "key_env")}, "kind": kind}


def _judge_difference(name: str, key: str, old: Any, new: Any) -> str:
    if key == "adapter_sha256":
        return f"judge {name!r} adapter weights changed ({str(old)[:12]} -> {str(new)[:12]})"
    if key == "weights":
        return (f"judge {name!r} weights changed ({str(old)[:19]} -> {str(new)[:19]}): retrained or replaced in "
                "place, or its hub branch moved")
    if key == "served_model":
        return f"judge {name!r} served model: the server lists it as {new!r}, the run's was {old!r}"
    return f"judge {name!r} {key}: {old!r} -> {new!r}"


def check_identity(out: Path, identity: dict) -> str:
    """``fresh`` (identity written) or ``resume``; RecipeError naming every difference when the output_dir holds
    another run's rows. A run that committed no row (stopped at its first answers: an endpoint refusing an option)
    holds nothing to mix: its identity is replaced."""
    from judgetrain.config.recipe import RecipeError

    path = out / IDENTITY
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise RecipeError(f"{path} is unreadable ({e}); move the folder away to start again") from None
        diffs = identity_differences(old, identity)
        if diffs and not any(c.batches for c in read_done(out)):
            logger.info("%s: no evaluation was committed under the earlier options (%s): starting afresh", out,
                        "; ".join(diffs))
            write_json(path, identity)
            return "fresh"
        if diffs:
            raise RecipeError(f"{out} holds evaluations of another run; refusing to mix them. What changed: "
                              + "; ".join(diffs) + ". Use another --output_dir, or put the old values back.")
        return "resume"
    if (out / SHARDS).is_dir() and any((out / SHARDS).glob("rank-*.index")):
        raise RecipeError(f"{out} has shards but no {IDENTITY}: not a run this command can continue")
    out.mkdir(parents=True, exist_ok=True)
    write_json(path, identity)
    return "fresh"


# ------------------------------------------------------------------------------------------------ summary
def summarize(committed: list[Committed], judges: list[str], n_items: int) -> dict[str, Any]:
    """Per judge, from the done index: rows, parse rate, reasons, mean score, stopped share, tokens and tokens/s. The
    rows are those `merge` writes (an endpoint's refusal replaced by a later row of its item is not counted); tokens
    and seconds are every batch's."""
    out: dict[str, Any] = {}
    for judge in judges:
        batches = [b for c in committed for b in c.batches if b["judge"] == judge]
        kept: dict[int, dict[str, Any]] = {}
        for b in batches:
            for j, item in enumerate(b["items"]):
                row = {k: b[k][j] for k in ("score", "reason", "stopped") if isinstance(b.get(k), list)}
                if kept.get(item, {}).get("reason", REJECTED_REASON) == REJECTED_REASON:
                    kept[item] = row
        scores = [r["score"] for r in kept.values() if r.get("score") is not None]
        reasons = Counter(r["reason"] for r in kept.values() if "reason" in r)
        rows = len(kept)
        tokens = sum(sum(b.get("n_tokens", [])) for b in batches)
        seconds = sum(b.get("seconds", 0.0) for b in batches)
        out[judge] = {
            "rows": rows, "items": n_items, "parsed": len(scores), "parse_rate": len(scores) / rows if rows else None,
            "reasons": dict(reasons.most_common()), "mean_score": sum(scores) / len(scores) if scores else None,
            "stopped": sum(bool(r.get("stopped")) for r in kept.values()),
            "truncated_prompts": sum(b.get("truncated", 0) for b in batches),
            "generated_tokens": tokens, "generate_seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else None,  # per process: the seconds are each process's own
        }
    return out


def write_summary(out: Path, summary: dict) -> Path:
    write_json(out / SUMMARY, summary)
    return out / SUMMARY
