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
    script_args = parse_recipe([str(good)]).script_args
    assert script_args.train_datasets[0]["revision"] == "3f2a1b"
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("revision: 3f2a1b", "revison: 3f2a1b"))
    with pytest.raises(RecipeError, match="revison.*revision"):
        parse_recipe([str(bad)])



@pytest.mark.slow
def test_an_offline_run_at_main_pins_its_commit_loads_that_snapshot_and_its_adapter_names_the_hub_model(tmp_path, tiny_judge):
    """Offline, a hub model named without a revision: the run pins the commit main names in the cache and records it
    in its identity. It loads that commit's snapshot folder (TRL reads the model's config without the revision, so
    with only the commit's files cached the load failed before), and the saved adapter names the hub id and the
    commit (not the cache folder)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from helpers import REPO

    commit = "0123456789abcdef0123456789abcdef01234567"
    hub = tmp_path / "hub"
    shutil.copytree(tiny_judge, hub / "models--judgetrain--tiny-judge" / "snapshots" / commit)
    (hub / "models--judgetrain--tiny-judge" / "refs").mkdir()
    (hub / "models--judgetrain--tiny-judge" / "refs" / "main").write_text(commit)
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "judgetrain.train", str(QUICKSTART), "--model_name_or_path", "judgetrain/tiny-judge",
           "--output_dir", str(out), "--max_steps", "1", "--eval_suites", "none",
           "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none"]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"model judgetrain/tiny-judge: main is commit {commit}" in run.stderr
    assert f"Model judgetrain/tiny-judge at {commit}: the hub is offline, loading its cached snapshot" in run.stderr
    record = json.loads((out / "judgetrain_run.json").read_text())
    assert record["current"]["revisions"] == {"model:judgetrain/tiny-judge@main": commit}
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "judgetrain/tiny-judge" and adapter["revision"] == commit


def _hub_cache(root, kind: str, repo: str, commit: str, files: dict[str, str]) -> None:
    """A hub cache entry as huggingface_hub writes it: refs/main names the commit, its snapshot folder holds files."""
    folder = root / f"{kind}s--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (snap / name).write_text(text)


def test_unpinned_hub_reads_are_pinned_at_the_start_and_a_resume_keeps_the_first_commits(tmp_path, monkeypatch, caplog):
    """A run reading a hub model and a hub source at main: the first start pins both to the commits main names (read
    from the cache while offline); after an upstream push, a resume keeps the recorded commits and says main moved,
    while a new run takes the new ones. Commits already pinned and local paths are not looked up."""
    import json
    from types import SimpleNamespace

    from huggingface_hub import constants

    from judgetrain.config.recipe import Recipe
    from judgetrain.run.revisions import hub_reads, pin_hub_revisions
    from judgetrain.run.state import IDENTITY_FILE, identity_differences, run_identity

    old, new = "1" * 40, "2" * 40
    hub = tmp_path / "hub"
    for commit in (old,):
        _hub_cache(hub, "model", "acme/judge", commit, {"config.json": "{}"})
        _hub_cache(hub, "dataset", "acme/judgebias", commit, {"train.jsonl": ""})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    out = tmp_path / "run"

    def args(resume=None, revision=None):
        script = SimpleNamespace(resume=resume, train_datasets=[
            {"dataset": "judgebias", "source": "acme/judgebias", "split": "train"},
            {"dataset": "judgebias", "source": "bundled", "split": "train"},
            {"dataset": "ideation", "source": "acme/ideation", "split": "train", "revision": "3" * 40}])
        return script, SimpleNamespace(model_revision=revision)

    def recipe(script, model) -> Recipe:
        return Recipe(script, SimpleNamespace(output_dir=str(out)), model, {})

    script, model = args()
    assert [r["repo"] for r in hub_reads(recipe(script, model), "acme/judge")] == ["acme/judge", "acme/judgebias"]
    with caplog.at_level("INFO"):
        pins = pin_hub_revisions(recipe(script, model), "acme/judge")
    assert pins == {"model:acme/judge@main": old, "dataset:acme/judgebias@main": old}
    assert model.model_revision == old and script.train_datasets[0]["revision"] == old
    assert "revision" not in script.train_datasets[1] and script.train_datasets[2]["revision"] == "3" * 40
    assert f"main is commit {old}" in caplog.text
    out.mkdir()
    first = run_identity({"learning_rate": 1e-5}, num_processes=1, data="d", revisions=pins)
    (out / IDENTITY_FILE).write_text(json.dumps({"current": first}))

    for kind, repo in (("model", "acme/judge"), ("dataset", "acme/judgebias")):  # upstream pushes to main
        _hub_cache(hub, kind, repo, new, {"config.json": "{}"})
    caplog.clear()
    script, model = args(resume="auto")
    with caplog.at_level("INFO"):
        again = pin_hub_revisions(recipe(script, model), "acme/judge")
    assert again == pins and model.model_revision == old and script.train_datasets[0]["revision"] == old
    assert f"main is now at {new[:12]}; this run started at {old[:12]} and resumes there" in caplog.text
    script, model = args()  # not a resume: a new run reads main as it is now
    fresh = pin_hub_revisions(recipe(script, model), "acme/judge")
    assert set(fresh.values()) == {new}
    moved = identity_differences(first, run_identity({"learning_rate": 1e-5}, num_processes=1, data="d", revisions=fresh))
    assert moved == [f"revisions.dataset:acme/judgebias@main: {old!r} -> {new!r}",
                     f"revisions.model:acme/judge@main: {old!r} -> {new!r}"]
    assert identity_differences({k: v for k, v in first.items() if k != "revisions"}, first) == []  # an older run

    caplog.clear()
    script, model = args()
    with caplog.at_level("WARNING"):
        assert pin_hub_revisions(recipe(script, model), "acme/other")["model:acme/other@main"] is None
    assert model.model_revision is None and "not pinned to a commit" in caplog.text
    pinned = SimpleNamespace(model_revision=old)  # a commit already, or a local folder: nothing to look up
    assert [r["repo"] for r in hub_reads(recipe(args()[0], pinned), "acme/judge")] == ["acme/judgebias"]
    assert [r["repo"] for r in hub_reads(recipe(args()[0], SimpleNamespace(model_revision=None)), str(tmp_path))] == [
        "acme/judgebias"]


def test_one_answer_to_is_it_cached_for_the_preflight_the_pinning_the_loader_and_the_memory_check(tmp_path, monkeypatch):
    """utils.hub.cached_snapshot: the preflight (offline, a model not cached is refused), the run's pinning (the
    commit main names), the loader (the snapshot folder of a pinned commit) and the memory check (its config) read
    the same cache entry the same way; a repository not cached is absent for all four, an invalid id raises."""
    import json

    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError

    from judgetrain.checks.memory import model_shape
    from judgetrain.checks.preflight import hub_problem
    from judgetrain.models.loading import pinned_snapshot
    from judgetrain.run.revisions import hub_commit
    from judgetrain.utils.hub import cached_snapshot

    commit = "4" * 40
    config = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048}
    hub = tmp_path / "hub"
    _hub_cache(hub, "model", "acme/judge", commit, {"config.json": json.dumps(config)})
    _hub_cache(hub, "model", "acme/weights-only", "5" * 40, {"model.safetensors": ""})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = hub / "models--acme--judge" / "snapshots" / commit
    assert cached_snapshot("acme/judge") == snapshot == cached_snapshot("acme/judge", commit)
    assert cached_snapshot("acme/absent") is None and cached_snapshot("acme/judge", "6" * 40) is None
    with pytest.raises(HFValidationError):
        cached_snapshot("not//an id")
    offline = {"HF_HUB_OFFLINE": "1"}
    assert hub_problem("acme/judge", env=offline) is None and hub_problem("acme/judge", commit, env=offline) is None
    assert "not in the local Hugging Face cache" in hub_problem("acme/absent", env=offline)
    assert "not in the local Hugging Face cache" in hub_problem("acme/weights-only", env=offline)  # no config.json
    assert hub_problem("not//an id", env=offline) is None  # transformers names an invalid id itself
    assert hub_commit("acme/judge", None) == commit and hub_commit("acme/absent", "main") is None
    assert pinned_snapshot("acme/judge", commit) == str(snapshot)
    assert pinned_snapshot("acme/absent", commit) == "acme/absent"
    shape, where = model_shape("acme/judge")
    assert (shape.hidden, shape.layers, where) == (64, 2, "cached hub config of acme/judge")
