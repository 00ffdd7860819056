"""Real-size start-up: the JudgeBias-shaped row generator (scripts/make_judgebias_rows.py) and the bench's start-up
part (judgetrain against bare TRL, launch to the first optimizer step, cold and on resume)."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

from judgetrain.data.judgebias import COLUMNS, PERTURBATION_SETS, TYPE_CATEGORY, load_judgebias

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import make_judgebias_rows  # noqa: E402


def test_generator_writes_valid_judgebias_rows_at_real_lengths(tmp_path):
    assert make_judgebias_rows.run([str(tmp_path), "--rows", "200", "--validation-rows", "34"]) == 0
    table = pq.read_table(tmp_path / "train.parquet")
    assert table.num_rows == 200 and tuple(table.column_names) == COLUMNS
    ds = load_judgebias(str(tmp_path), "train")  # every row passes the adapter's validation
    assert len(ds) == 200
    sets = collections.Counter(zip(ds["perturbation_type"], ds["perturbation_rate"]))
    assert set(sets) == set(PERTURBATION_SETS) and max(sets.values()) - min(sets.values()) <= 1
    assert all(TYPE_CATEGORY[t] == c for t, c in zip(ds["perturbation_type"], ds["perturbation_category"]))
    # characters, at the generator's calibrated 3.4 per SmolLM2 token: prompts ~1.6-3k tokens, completions ~0.64k
    prompt_chars = [sum(len(m["content"]) for m in p) for p in ds["prompt"]]
    assert 1500 * 3.4 < min(prompt_chars) and max(prompt_chars) < 3100 * 3.4
    assert 2400 * 3.4 < sum(prompt_chars) / len(prompt_chars) < 2800 * 3.4
    completion = [len(c[0]["content"]) for c in list(ds["chosen"]) + list(ds["rejected"])]
    assert 550 * 3.4 < sum(completion) / len(completion) < 750 * 3.4
    val = load_judgebias(str(tmp_path), "validation")
    assert len(val) == 34 and not set(val["sample_id"]) & set(ds["sample_id"])
    again = tmp_path / "again"  # seeded: a rerun writes the same rows
    make_judgebias_rows.run([str(again), "--rows", "200"])
    assert pq.read_table(again / "train.parquet").equals(table)
