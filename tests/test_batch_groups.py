"""batch_groups: the rows of one group (both orders of a verdict pair from `judgetrain pairs known`) are shuffled as
one unit and trained in one batch. The grouped order keeps every group's rows adjacent and in their order under any
seed; a plain shuffle scatters them. A recipe with batch_groups reads the rows sequentially (another sampler is
refused); a run counts the groups cut across per-device batches in data_audit.json and warns when there are any."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

from judgetrain.config.recipe import RecipeError, parse_recipe
from judgetrain.data.mixture import grouped_order, groups_cut, load_mixture
from judgetrain.data.prepare import batch_groups_report


def grouped_rows(path: Path, groups: int = 40, loose: int = 6) -> Path:
    """``groups`` verdict pairs in both orders (group g: rows AB then BA) and ``loose`` rows without a group."""
    rows = []
    for g in range(groups):
        for order in ("AB", "BA"):
            rows.append({"prompt": [{"role": "user", "content": f"pair {g} shown {order}"}],
                         "chosen": [{"role": "assistant", "content": "[[A>B]]" if order == "AB" else "[[B>A]]"}],
                         "rejected": [{"role": "assistant", "content": "[[B>A]]" if order == "AB" else "[[A>B]]"}],
                         "sample_id": g, "group": f"pair-{g}"})
    for k in range(loose):
        rows.append({"prompt": [{"role": "user", "content": f"loose {k}"}],
                     "chosen": [{"role": "assistant", "content": "yes"}],
                     "rejected": [{"role": "assistant", "content": "no"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def adjacent(prompts: list[str]) -> int:
    """How many pairs have their AB row directly followed by their BA row."""
    return sum(a.endswith("shown AB") and b == a.replace("AB", "BA") for a, b in zip(prompts, prompts[1:]))


def test_grouped_order_keeps_groups_whole_and_shuffles_them():
    groups = [None, "x", "x", None, "y", "y", "y", "z", "z"]
    for seed in range(20):
        order = grouped_order(groups, seed)
        assert sorted(order) == list(range(len(groups)))
        for g in ("x", "y", "z"):
            at = [k for k, i in enumerate(order) if groups[i] == g]
            assert at == list(range(at[0], at[0] + len(at)))  # adjacent
            assert [order[k] for k in at] == sorted(order[k] for k in at)  # in their own order
    assert len({tuple(grouped_order(groups, seed)) for seed in range(20)}) > 5


def test_groups_cut_counts_groups_across_batches():
    assert groups_cut(["a", "a", "b", "b"], 2) == {"groups": 2, "cut": 0, "largest": 2}
    assert groups_cut([None, "a", "a", "b", "b"], 2) == {"groups": 2, "cut": 2, "largest": 2}
    assert groups_cut(["a", "a", "b", "b", "c"], 4) == {"groups": 2, "cut": 0, "largest": 2}  # c has one row
    assert groups_cut([None, None], 2) == {"groups": 0, "cut": 0, "largest": 0}


def test_mixture_with_groups_keeps_both_orders_adjacent(tmp_path):
    data = grouped_rows(tmp_path / "pairs.jsonl")
    comp = [{"dataset": "preference", "source": str(data), "split": "train"}]
    plain = load_mixture(comp, seed=3)
    grouped, again = load_mixture(comp, seed=3, groups=True), load_mixture(comp, seed=3, groups=True)
    text = lambda ds: [p[0]["content"] for p in ds["prompt"]]  # noqa: E731
    assert adjacent(text(grouped)) == 40 and text(grouped) == text(again)
    assert adjacent(text(plain)) < 10  # a plain shuffle of 86 rows keeps few of 40 pairs adjacent
    assert sorted(text(grouped)) == sorted(text(plain))  # the same rows
    assert text(load_mixture(comp, seed=4, groups=True)) != text(grouped)
    assert grouped["group"].count(None) == 6 and "preference|pair-0" in grouped["group"]


def test_report_warns_of_cut_groups(caplog):
    with caplog.at_level(logging.WARNING, logger="judgetrain.data.prepare"):
        assert batch_groups_report(["a", "a", "b", "b", "c", "c"], 3)["cut"] == 1
    assert "1 of 3 groups are cut across per-device batches of 3 rows" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="judgetrain.data.prepare"):
        batch_groups_report([None, None], 2)
    assert "no row has a group" in caplog.text


def test_recipe_reads_grouped_rows_sequentially():
    recipe = parse_recipe(["recipes/quickstart.yaml", "--batch_groups", "true"])
    assert recipe.training_args.train_sampling_strategy == "sequential"
    assert parse_recipe(["recipes/quickstart.yaml"]).training_args.train_sampling_strategy == "random"
    with pytest.raises(RecipeError, match="train_sampling_strategy: group_by_length reorders them"):
        parse_recipe(["recipes/quickstart.yaml", "--batch_groups", "true", "--train_sampling_strategy",
                      "group_by_length"])


def test_a_run_trains_each_pair_in_one_batch(tmp_path, tiny_judge):
    data = grouped_rows(tmp_path / "pairs.jsonl", groups=6, loose=0)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "judgetrain.train", "recipes/quickstart.yaml", "--train_datasets",
                           f"{{dataset: preference, source: {data}, split: train}}", "--output_dir", str(out),
                           "--eval_suites", "none", "--batch_groups", "true", "--per_device_train_batch_size", "2",
                           "--max_steps", "2", "--save_strategy", "no"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    audit = json.loads((out / "data_audit.json").read_text())
    assert audit["batch_groups"] == {"groups": 6, "cut": 0, "largest": 2}
    assert "each of 6 groups lies within one per-device batch of 2 rows" in proc.stderr
    import yaml

    assert yaml.safe_load((out / "recipe.yaml").read_text())["batch_groups"] is True
