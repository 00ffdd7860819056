"""Pinned hub revisions: a dataset component's `revision` (passed to datasets.load_dataset for a hub source), so a
requeued run reads the same rows as its first start."""

from __future__ import annotations

import pytest

from helpers import QUICKSTART
from judgetrain.config.recipe import RecipeError, parse_recipe
from judgetrain.data.mixture import component_keys


@pytest.mark.parametrize("dataset", ["judgebias", "ideation"])
def test_every_training_adapter_takes_a_revision(dataset):
    assert "revision" in component_keys(dataset)


def test_a_component_with_a_revision_parses_and_a_misspelt_one_is_refused(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(QUICKSTART.read_text().replace("{dataset: judgebias, source: bundled, split: train}",
                                                   "{dataset: judgebias, source: bundled, split: train, revision: 3f2a1b}"))
    script_args, *_ = parse_recipe([str(good)])
    assert script_args.train_datasets[0]["revision"] == "3f2a1b"
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("revision: 3f2a1b", "revison: 3f2a1b"))
    with pytest.raises(RecipeError, match="revison.*revision"):
        parse_recipe([str(bad)])



@pytest.mark.slow
def test_an_offline_run_pinned_to_a_commit_loads_that_snapshot_and_its_adapter_names_the_hub_model(tmp_path, tiny_judge):
    """Offline, with only the pinned commit in the hub cache: TRL reads the model's config without the revision (at
    main, not cached), so the run failed at the model load; now it loads the commit's snapshot folder, and the saved
    adapter names the hub id and the commit (not the cache folder)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from helpers import REPO

    commit = "0123456789abcdef0123456789abcdef01234567"
    hub = tmp_path / "hub"
    shutil.copytree(tiny_judge, hub / "models--judgetrain--tiny-judge" / "snapshots" / commit)
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "judgetrain.train", str(QUICKSTART), "--model_name_or_path", "judgetrain/tiny-judge",
           "--model_revision", commit, "--output_dir", str(out), "--max_steps", "1", "--eval_suites", "none",
           "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none"]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"Model judgetrain/tiny-judge at {commit}: the hub is offline, loading its cached snapshot" in run.stderr
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "judgetrain/tiny-judge" and adapter["revision"] == commit
