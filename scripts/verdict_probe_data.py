"""Verdict pairs of known direction from the synthetic recipes of ``scripts/synth.py``, for the verdict-loss probe of
docs/results.md: each recipe against its error copy (element, number, equipment: visible inconsistencies a small judge
can learn), in both orders, the verdict preferring the recipe chosen; and held-out pairs for the ``pairwise`` eval
suite, on other samples and on an error type (``action_antonym``) the training rows never show.

    python scripts/verdict_probe_data.py --out probe --pairs 128 --keep 32 --heldout 64 --keep_heldout 16
    # probe/train/train.parquet: JudgeBias-schema rows (prompt = the pairwise verdict prompt, chosen / rejected =
    #   "[[A>B]]" / "[[B>A]]"), shuffled; probe/heldout.jsonl: prompt, response_a, response_b, label, category

Deterministic: the same arguments write the same files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from judgetrain.data.pairwise import verdict_messages
from synth import apply_perturbation, make_recipe, render_recipe, user_message

TRAIN_TYPES = ("element_substitution", "numerical_perturbation", "equipment_substitution")
HELD_TYPE = "action_antonym"
HELDOUT_START = 5000  # held-out sample ids start here; training ids count from 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--pairs", type=int, default=128, help="training rows (each source/error pair gives two)")
    parser.add_argument("--keep", type=int, default=None, help="write only the first N training rows of the shuffle")
    parser.add_argument("--heldout", type=int, default=64, help="held-out pairs (each scored in both orders)")
    parser.add_argument("--keep_heldout", type=int, default=None, help="write only the first N held-out pairs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    (out / "train").mkdir(parents=True, exist_ok=True)
    rows = training_rows(args.pairs)[:args.keep]
    pq.write_table(pa.Table.from_pylist(rows), out / "train" / "train.parquet")
    held = heldout_pairs(args.heldout)[:args.keep_heldout]
    (out / "heldout.jsonl").write_text("".join(json.dumps(h) + "\n" for h in held), encoding="utf-8")
    print(f"{len(rows)} training rows, {len(held)} held-out pairs -> {out}")
    return 0


def training_rows(n_rows: int) -> list[dict]:
    """``n_rows`` verdict rows: source / error copy pairs of samples 0, 1, ... (types in turn), both orders each."""
    rows, sid = [], 0
    while len(rows) < n_rows:
        ptype = TRAIN_TYPES[sid % len(TRAIN_TYPES)]
        got = source_and_error(sid, ptype)
        sid += 1
        if got is None:
            continue
        question, src, err = got
        for a, b, good, bad in ((src, err, "[[A>B]]", "[[B>A]]"), (err, src, "[[B>A]]", "[[A>B]]")):
            rows.append(dict(prompt=json.dumps(verdict_messages(question, a, b)),
                             chosen=json.dumps([{"role": "assistant", "content": good}]),
                             rejected=json.dumps([{"role": "assistant", "content": bad}]),
                             score_chosen=5.0, score_rejected=1.0, score_delta=4.0, anchor_score=5.0,
                             sample_id=sid - 1, perturbation_type=ptype, perturbation_category="error",
                             perturbation_rate=1.0, chosen_model="known-direction", rejected_model="known-direction"))
    random.Random(0).shuffle(rows)
    return rows


def heldout_pairs(n_pairs: int) -> list[dict]:
    """``n_pairs`` pairwise-suite rows on samples from `HELDOUT_START`, the four types in turn (one never trained on);
    every other pair stores the source as B, so the label is not a constant."""
    held, types = [], TRAIN_TYPES + (HELD_TYPE,)
    for k in range(10 * n_pairs):
        sid, ptype = HELDOUT_START + k, types[k % len(types)]
        got = source_and_error(sid, ptype)
        if got is None:
            continue
        question, src, err = got
        a, b, label = (src, err, "A>B") if k % 2 == 0 else (err, src, "B>A")
        held.append(dict(id=f"{sid}-{ptype}", prompt=question, response_a=a, response_b=b, label=label,
                         category=ptype))
        if len(held) == n_pairs:
            break
    return held


def source_and_error(sample_id: int, ptype: str) -> tuple[str, str, str] | None:
    """(question, the recipe, its error copy), or None when the operator changed nothing."""
    recipe = make_recipe(sample_id)
    copy, changes = apply_perturbation(recipe, ptype, 1.0, seed=sample_id)
    src, err = render_recipe(recipe), render_recipe(copy)
    if src == err or not changes:
        return None
    target = user_message(recipe).split("## AI-generated recipe")[0].replace("## Target material\n", "").strip()
    return "Write a synthesis recipe for: " + target, src, err


if __name__ == "__main__":
    raise SystemExit(main())
