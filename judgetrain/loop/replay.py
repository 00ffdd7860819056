"""The loop's replay share: general preference pairs mixed into each round's training pairs, so that a judge trained on
one domain's error copies keeps what it knew of others (OffsetBias's and Skywork-Reward's mixtures of general data).

    replay: {suite: judgebench, source: path/to/judgebench, share: 0.2, seed: 0}

The rows come from a pairwise benchmark that the run does not score (`REPLAY_SUITES`; naming one of ``eval.suites`` is
refused before any stage runs): each pair becomes a preference row (prompt = the question, chosen = the better
response, rejected = the other). After the pairs stage, ``share`` of the round's
training rows are replay rows: share / (1 - share) x the training pairs, drawn without replacement (seeded); fewer
when the source holds fewer, said in a warning and in the counts. They are written beside the round's pairs
(``replay.jsonl``) and counted in the pairs' ``stats.json`` (``replay``); the round's recipe trains on both.

The draw takes only rows that fit the round's training: with a `ReplayFit` (the round recipe's tokenizer and
``max_length``), every source row is tokenised and audited as training audits its rows (`judgetrain.data.lengths`,
control strings neutralised), and the rows longer than ``max_length`` are left out of the draw: counted
(``stats.json``'s ``replay.too_long``), said in the log and written to ``rejects/replay_long_rows.jsonl`` beside the
pairs. Training would skip or cut them, and the share trained would fall below the share stated (JudgeBench at 768
SmolLM2 tokens: about half its pairs are longer). The audit reads the whole source once a round, one tokenisation
pass of the kind training makes over its own rows.
"""

# Late imports: datasets, judgetrain.data (inside the functions that use them): the loop's config check reads the
# replay source without a tokenizer; the length audit's libraries come in with a draw that has one.

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from judgetrain.data.pairwise import load_evalbiasbench, load_judgebench

logger = logging.getLogger(__name__)

REPLAY_FILE = "replay.jsonl"  # beside the round's pairs
LONG_REJECTS = "rejects/replay_long_rows.jsonl"  # beside the round's pairs: the source rows that do not fit
REPLAY_SUITES = {"judgebench": load_judgebench, "evalbiasbench": load_evalbiasbench}


@dataclass(frozen=True)
class Replay:
    """The loop config's ``replay`` section: a pairwise benchmark's ``suite`` name and ``source``, the ``share`` of each
    round's training rows it makes (0: none) and the draw's ``seed``."""

    suite: str | None = None
    source: str | None = None
    share: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class ReplayFit:
    """What a replayed row must fit: the round's training ``tokenizer`` and its recipe's ``max_length``."""

    tokenizer: Any
    max_length: int


def replay_rows(replay: Replay) -> list[dict[str, Any]]:
    """The replay source's pairs (each labelled A>B or B>A: the loader refuses anything else, naming file, row and
    field) as preference rows."""
    rows = []
    for row in REPLAY_SUITES[replay.suite](replay.source):
        better, other = (row["response_a"], row["response_b"]) if row["label"] == "A>B" else \
            (row["response_b"], row["response_a"])
        rows.append({"prompt": [{"role": "user", "content": str(row["prompt"])}],
                     "chosen": [{"role": "assistant", "content": str(better)}],
                     "rejected": [{"role": "assistant", "content": str(other)}],
                     "sample_id": f"replay:{row.get('id')}", "group": None, "tie": False})
    return rows


def fitting_rows(rows: list[dict[str, Any]], fit: ReplayFit, rejects_path: Path) -> list[dict[str, Any]]:
    """``rows`` less those that do not fit ``fit.max_length`` as training counts them (prompt and the longer
    response, in TRL's token ids after neutralising control strings); those are written to ``rejects_path``."""
    from datasets import Dataset

    from judgetrain.data.lengths import audit_lengths

    table = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"],
                                "replay_row": i} for i, r in enumerate(rows)])
    kept, _ = audit_lengths(table, fit.tokenizer, fit.max_length, "skip", str(rejects_path), neutralise=True)
    return [rows[i] for i in kept["replay_row"]]


def write_replay(replay: Replay, pairs_dir: Path, fit: ReplayFit | None = None) -> dict[str, Any]:
    """Draw the round's replay rows against its training pairs (``pairs_dir/train.parquet``), from the source rows
    that fit ``fit`` (all rows without one), write them to ``pairs_dir/replay.jsonl`` and their counts into
    ``pairs_dir/stats.json`` (``replay``); returns the counts."""
    n_pairs = pq.read_metadata(pairs_dir / "train.parquet").num_rows
    wanted = round(replay.share * n_pairs / (1 - replay.share))
    every = replay_rows(replay)
    rows = fitting_rows(every, fit, pairs_dir / LONG_REJECTS) if fit else every
    too_long = len(every) - len(rows)
    if too_long:
        logger.warning("replay: %d of %s's %d pairs are longer than max_length %d and are left out of the draw "
                       "(written to %s)", too_long, replay.source, len(every), fit.max_length, pairs_dir / LONG_REJECTS)
    picked = random.Random(replay.seed).sample(rows, min(wanted, len(rows)))
    with open(pairs_dir / REPLAY_FILE, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in picked)
    counts = {"suite": replay.suite, "source": str(replay.source), "share": replay.share, "rows_wanted": wanted,
              "rows": len(picked), "source_rows": len(every), "too_long": too_long, "available": len(rows),
              "max_length": fit.max_length if fit else None, "training_pairs": n_pairs,
              "share_made": round(len(picked) / (len(picked) + n_pairs), 4) if picked or n_pairs else 0.0}
    if len(picked) < wanted:
        logger.warning("replay: %s holds %d pairs that fit, fewer than the %d a share of %g asks beside %d training "
                       "pairs: all %d replayed (share %.3f)", replay.source, len(rows), wanted, replay.share, n_pairs,
                       len(picked), counts["share_made"])
    stats_path = pairs_dir / "stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    stats["replay"] = counts
    stats_path.write_text(json.dumps(stats, indent=1) + "\n")
    logger.info("replay: %d %s pairs beside %d training pairs (share %.3f)", len(picked), replay.suite, n_pairs,
                counts["share_made"])
    return counts
