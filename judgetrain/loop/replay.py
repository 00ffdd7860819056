"""The loop's replay share: general preference pairs mixed into each round's training pairs, so that a judge trained on
one domain's error copies keeps what it knew of others (OffsetBias's and Skywork-Reward's mixtures of general data).

    replay: {suite: judgebench, source: path/to/judgebench, share: 0.2, seed: 0}

The rows come from a pairwise benchmark that the run does not score (`REPLAY_SUITES`; naming one of ``eval.suites`` is
refused before any stage runs): each pair becomes a preference row (prompt = the question, chosen = the better
response, rejected = the other). After the pairs stage, ``share`` of the round's
training rows are replay rows: share / (1 - share) x the training pairs, drawn without replacement (seeded); fewer
when the source holds fewer, said in a warning and in the counts. They are written beside the round's pairs
(``replay.jsonl``) and counted in the pairs' ``stats.json`` (``replay``); the round's recipe trains on both.

The draw does not yet know the training's ``max_length``: training skips a replayed row longer than it like any other
(counted, warned, written to its ``rejects/long_rows.jsonl``), and the share trained is then below the share stated
(JudgeBench at 768 tokens: about half its pairs are longer). Read the training's rejects beside ``stats.json``.
"""

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
REPLAY_SUITES = {"judgebench": load_judgebench, "evalbiasbench": load_evalbiasbench}


@dataclass(frozen=True)
class Replay:
    """The loop config's ``replay`` section: a pairwise benchmark's ``suite`` name and ``source``, the ``share`` of each
    round's training rows it makes (0: none) and the draw's ``seed``."""

    suite: str | None = None
    source: str | None = None
    share: float = 0.0
    seed: int = 0


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


def write_replay(replay: Replay, pairs_dir: Path) -> dict[str, Any]:
    """Draw the round's replay rows against its training pairs (``pairs_dir/train.parquet``), write them to
    ``pairs_dir/replay.jsonl`` and their counts into ``pairs_dir/stats.json`` (``replay``); returns the counts."""
    n_pairs = pq.read_metadata(pairs_dir / "train.parquet").num_rows
    wanted = round(replay.share * n_pairs / (1 - replay.share))
    rows = replay_rows(replay)
    picked = random.Random(replay.seed).sample(rows, min(wanted, len(rows)))
    with open(pairs_dir / REPLAY_FILE, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in picked)
    counts = {"suite": replay.suite, "source": str(replay.source), "share": replay.share, "rows_wanted": wanted,
              "rows": len(picked), "available": len(rows), "training_pairs": n_pairs,
              "share_made": round(len(picked) / (len(picked) + n_pairs), 4) if picked or n_pairs else 0.0}
    if len(picked) < wanted:
        logger.warning("replay: %s holds %d pairs, fewer than the %d a share of %g asks beside %d training pairs: "
                       "all %d replayed (share %.3f)", replay.source, len(rows), wanted, replay.share, n_pairs,
                       len(picked), counts["share_made"])
    stats_path = pairs_dir / "stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    stats["replay"] = counts
    stats_path.write_text(json.dumps(stats, indent=1) + "\n")
    logger.info("replay: %d %s pairs beside %d training pairs (share %.3f)", len(picked), replay.suite, n_pairs,
                counts["share_made"])
    return counts
