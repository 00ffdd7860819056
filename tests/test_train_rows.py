"""The training rows folder (output_dir/train_rows/node-K): a start whose rows equal the folder's keeps it, with the
token ids of the length audit (TRL's, which it then does not compute again) and the caches TRL keeps beside the
rows (nothing re-tokenised on resume); other rows replace it; the machine's folder is
named from the process group, and a launch whose ranks are not numbered machine by machine is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from datasets import load_from_disk

from helpers import REPO
from judgetrain.config.recipe import RecipeError
from judgetrain.data.prepare import ROWS_FILE, machine_key, placement_of

QUICKSTART = str(REPO / "recipes" / "quickstart.yaml")


def _train(out, *extra, recipe=QUICKSTART):
    cmd = [sys.executable, "-m", "judgetrain.train", recipe, "--output_dir", str(out), "--eval_suites", "none",
           "--save_steps", "1", "--report_to", "none", *extra]
    env = {**os.environ, "HF_DATASETS_DISABLE_PROGRESS_BARS": "0"}  # TRL's "Tokenizing" bar shows whether it ran
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)


def test_machine_key_is_the_machines_first_rank():
    seen = [(0, 0, "a"), (1, 1, "a"), (2, 0, "b"), (3, 1, "b")]
    assert [machine_key(seen, r) for r in range(4)] == [0, 0, 2, 2]
    # two launches on one host (the localhost two-machine test): one folder each
    assert [machine_key([(0, 0, "h"), (1, 0, "h")], r) for r in (0, 1)] == [0, 1]


def test_the_machine_index_and_count_come_from_the_process_group():
    """What parallelism.json records as machine_rank / machines, whatever the launcher exported."""
    seen = [(0, 0, "a"), (1, 1, "a"), (2, 0, "b"), (3, 1, "b"), (4, 0, "c"), (5, 1, "c")]
    assert [placement_of(seen, r) for r in range(6)] == [(0, 0, 3), (0, 0, 3), (2, 1, 3), (2, 1, 3), (4, 2, 3),
                                                         (4, 2, 3)]
    with pytest.raises(RecipeError, match="not numbered machine by machine"):
        placement_of([(0, 0, "a"), (1, 0, "b"), (2, 1, "a"), (3, 1, "b")], 3)


def test_ranks_not_numbered_machine_by_machine_are_refused():
    cyclic = [(0, 0, "a"), (1, 0, "b"), (2, 1, "a"), (3, 1, "b")]  # srun --distribution=cyclic
    with pytest.raises(RecipeError, match="not numbered machine by machine.*rank 2 \\(local rank 1\\) on a"):
        machine_key(cyclic, 0)


@pytest.mark.slow
def test_rows_are_tokenised_once_and_a_resume_keeps_them(tmp_path):
    out = tmp_path / "run"
    first = _train(out, "--max_steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    rows = out / "train_rows" / "node-0"
    record = json.loads((rows / ROWS_FILE).read_text())
    assert record["rows"] > 0 and len(record["fingerprint"]) == 64
    # the audit's ids are TRL's: the trainer reuses them, TRL does not tokenise the rows a second time
    assert "Tokenizing train dataset" not in first.stderr
    assert f"{record['rows']} rows' token ids from the length audit reused" in first.stderr, first.stderr[-3000:]
    kept = load_from_disk(str(rows))
    assert {"prompt_ids", "chosen_ids", "rejected_ids"} <= set(kept.column_names)
    caches = {p.name: p.stat().st_mtime_ns for p in rows.glob("cache-*.arrow")}
    data_file = (rows / "data-00000-of-00001.arrow").stat().st_mtime_ns

    second = _train(out, "--max_steps", "3", "--resume", "auto", "--resume_force")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "kept with" in second.stderr and record["fingerprint"][:12] in second.stderr, second.stderr[-3000:]
    assert "Tokenizing train dataset" not in second.stderr
    # nothing prepared again: the key of its inputs (recipe data keys, source files, tokenizer, code) is the record's
    assert "nothing read, validated, neutralised or tokenised" in second.stderr, second.stderr[-3000:]
    assert "Data audit [" not in second.stderr
    assert (rows / "data-00000-of-00001.arrow").stat().st_mtime_ns == data_file
    for name, mtime in caches.items():
        assert (rows / name).stat().st_mtime_ns == mtime

    # other rows (a smaller mixture) replace the folder and its caches
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text(open(QUICKSTART).read().replace("{dataset: judgebias, source: bundled, split: train}",
                                                       "{dataset: judgebias, source: bundled, split: train, rows: 40}"))
    third = _train(tmp_path / "run", "--max_steps", "1", "--overwrite_output_dir", "true", recipe=str(smaller))
    assert third.returncode == 0, third.stderr[-3000:]
    assert json.loads((rows / ROWS_FILE).read_text())["rows"] < record["rows"]
    assert "rows written to" in third.stderr and "Tokenizing train dataset" not in third.stderr


def test_the_preparation_key_follows_the_inputs_and_refuses_to_guess(tmp_path, tiny_judge):
    import shutil
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from judgetrain.data.io import sample_source
    from judgetrain.config.recipe import Recipe
    from judgetrain.data.prepare import preparation_key

    tok = AutoTokenizer.from_pretrained(tiny_judge)
    shutil.copytree(sample_source("judgebias"), tmp_path / "jb")

    def key(source="%s" % (tmp_path / "jb"), batch_groups=False, **comp):
        script = SimpleNamespace(train_datasets=[{"dataset": "judgebias", "source": source, "split": "train", **comp}],
                                 long_rows="error", on_bad_row="error", batch_groups=batch_groups)
        training = SimpleNamespace(seed=42, max_length=1024, per_device_train_batch_size=4)
        return preparation_key(Recipe(script, training, None, {}), tok)

    first, why = key()
    assert len(first) == 64 and why == "" and key() == (first, "")
    assert key(rows=40)[0] != first  # a recipe data key
    assert key(batch_groups=True)[0] != first  # the rows' order
    os.utime(tmp_path / "jb" / "train.parquet", ns=(1, 1))
    assert key()[0] != first  # a source file's modification time
    assert key(source="owner/judgebias") == (None, "owner/judgebias is read from the hub at main, not at a commit")
    assert key(source="owner/judgebias", revision="a" * 40)[0] is not None
