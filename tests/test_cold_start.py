"""First use on a fresh machine: model aliases built once per machine, broken cache entries rebuilt, and every file
of a 2-process run written by exactly one process. The launches here start from an empty judgetrain cache and an
empty Hugging Face home, as a new user's first command does (the session-wide tiny judge of conftest is not used)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import yaml

from helpers import QUICKSTART, accelerate_launch, read_jsonl

TINY_FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "judgetrain_tiny.json",
              "judgetrain_manifest.json"}


def cold_env(root: Path) -> dict:
    """An empty judgetrain cache and HF home (datasets cache included) under ``root``."""
    env = {"JUDGETRAIN_CACHE": str(root / "jt-cache"), "HF_HOME": str(root / "hf-home"),
           "HF_DATASETS_CACHE": str(root / "hf-home" / "datasets"), "OMP_NUM_THREADS": "1"}
    for value in env.values():
        if value != "1":
            assert not Path(value).exists()
    return env


def cache_entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_dir())


def plant_tiny_entry(cache: Path, damage: str) -> Path:
    """A tiny-judge cache entry at the path ensure_tiny_judge will look at, damaged as a crashed or racing build
    leaves it: the old marker file without weights (the state the cold-start race left), or truncated weights."""
    from judgetrain.models.tiny import ensure_tiny_judge

    old = os.environ.get("JUDGETRAIN_CACHE")
    os.environ["JUDGETRAIN_CACHE"] = str(cache)
    try:
        entry = Path(ensure_tiny_judge())
    finally:
        os.environ["JUDGETRAIN_CACHE"] = old
    if damage == "marker_without_weights":
        for name in ("config.json", "model.safetensors", "generation_config.json", "judgetrain_manifest.json"):
            (entry / name).unlink()
    elif damage == "truncated_safetensors":
        weights = entry / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "same_size_corruption":
        weights = entry / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-64:] = bytes(64)
        weights.write_bytes(bytes(data))
    else:
        raise ValueError(damage)
    return entry


# ------------------------------------------------------------------------------------------- in process


@pytest.mark.parametrize("damage", ["marker_without_weights", "truncated_safetensors", "same_size_corruption"])
def test_a_broken_cache_entry_is_rebuilt_with_a_warning_never_loaded(tmp_path, monkeypatch, caplog, damage):
    from transformers import AutoModelForCausalLM

    from judgetrain.models.cache import manifest_problem
    from judgetrain.models.tiny import ensure_tiny_judge

    entry = plant_tiny_entry(tmp_path / "cache", damage)
    assert manifest_problem(entry) is not None
    monkeypatch.setenv("JUDGETRAIN_CACHE", str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="judgetrain.models.cache"):
        path = ensure_tiny_judge()
    assert Path(path) == entry
    assert "incomplete or corrupt" in caplog.text and entry.name in caplog.text
    assert manifest_problem(entry) is None
    assert TINY_FILES <= {p.name for p in entry.iterdir()}
    AutoModelForCausalLM.from_pretrained(path)  # loads
    assert [p.name for p in cache_entries(tmp_path / "cache")] == [entry.name]  # no temporary folders left


def test_manifest_names_every_file_with_size_and_sha256(tmp_path, monkeypatch):
    import hashlib

    from judgetrain.models.tiny import ensure_tiny_judge

    monkeypatch.setenv("JUDGETRAIN_CACHE", str(tmp_path))
    entry = Path(ensure_tiny_judge())
    manifest = json.loads((entry / "judgetrain_manifest.json").read_text())
    on_disk = {p.name for p in entry.iterdir()} - {"judgetrain_manifest.json"}
    assert set(manifest["files"]) == on_disk
    weights = manifest["files"]["model.safetensors"]
    data = (entry / "model.safetensors").read_bytes()
    assert weights == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    # an ordinary model folder, as save_pretrained writes it: TRL picks the model class from `architectures`
    assert json.loads((entry / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    from trl.trainer.utils import create_model_from_path

    model = create_model_from_path(str(entry))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as built


def _build_in_child(cache: str, queue) -> None:
    os.environ["JUDGETRAIN_CACHE"] = cache
    import logging

    logging.basicConfig(level=logging.INFO)
    from judgetrain.models.tiny import ensure_tiny_judge

    queue.put(ensure_tiny_judge())


def test_processes_racing_on_a_cold_cache_build_once_and_all_load_the_same_folder(tmp_path, caplog):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build_in_child, args=(str(tmp_path), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    paths = {queue.get(timeout=600) for _ in procs}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(paths) == 1
    (entry,) = cache_entries(tmp_path)
    assert str(entry) in paths
    assert len(read_jsonl(tmp_path / "builds.jsonl")) == 1  # built once
    manifest = json.loads((entry / "judgetrain_manifest.json").read_text())
    assert "model.safetensors" in manifest["files"]


def test_weights_written_from_a_rank_other_than_zero(tmp_path):
    """save_pretrained writes weights on global rank 0 only once torch.distributed is up: the builder must not use
    it, since whichever process holds the lock builds."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from judgetrain.models.tiny import build_tiny_judge

    code = (
        "import os, sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo', rank=int(os.environ['RANK']), world_size=2)\n"
        "from judgetrain.models.tiny import build_tiny_judge\n"
        "if dist.get_rank() == 1:\n"
        "    build_tiny_judge(sys.argv[1])\n"
        "dist.barrier()\n"
    )
    from helpers import free_port, run
    import subprocess
    import sys

    port = str(free_port())
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "m")], env={**env, "RANK": str(r)})
             for r in (0, 1)]
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
    assert (tmp_path / "m" / "model.safetensors").is_file()
    AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert not dist.is_initialized()


# ------------------------------------------------------------------------------------------- launches


def small_quickstart_args(out: Path) -> list[str]:
    # The tiny judge's training recipe (recipes/quickstart.yaml), shortened: a few steps, an eval every 2 steps on a
    # few rows, a checkpoint, TensorBoard.
    return [str(QUICKSTART), "--output_dir", str(out), "--max_steps", "4", "--eval_steps", "2",
            "--eval_max_rows", "6", "--save_steps", "2", "--logging_steps", "1", "--report_to", "tensorboard",
            "--eval_on_start", "false", "--eval_scoring", "implicit"]


def assert_written_once(out: Path) -> None:
    """Every file of the run exists once and holds each record once (two writers would duplicate or tear it)."""
    records = read_jsonl(out / "metrics.jsonl")
    train_steps = [r["step"] for r in records if "train/loss" in r]
    assert train_steps == [1, 2, 3, 4]
    eval_steps = [r["step"] for r in records if "eval/rmbench/total_avg_acc" in r]
    assert eval_steps == [2, 4]
    for step in (2, 4):
        folder = out / "eval" / str(step)
        assert {p.name for p in folder.iterdir()} == {"ideation.jsonl", "judgebias.jsonl", "rmbench.jsonl", "results.json"}
        for suite in ("rmbench", "judgebias", "ideation"):
            rows = read_jsonl(folder / f"{suite}.jsonl")
            ids = [r.get("id", r.get("row_id", json.dumps(r, sort_keys=True))) for r in rows]
            assert len(rows) == 6 and len(set(ids)) == 6, (suite, step, len(rows))
        assert json.loads((folder / "results.json").read_text())["step"] == step
    events = list((out / "runs").rglob("events.out.tfevents.*")) if (out / "runs").exists() else []
    events += [p for p in out.rglob("events.out.tfevents.*") if p not in events]
    assert len(events) == 1, events  # one TensorBoard writer
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set(EventAccumulator(str(events[0])).Reload().Tags()["scalars"])
    assert {"eval/rmbench/total_avg_acc", "train/loss"} <= tags  # the figures reach the tracker, the bounds do not
    assert not [t for t in tags if t.endswith(("/ci_low", "/ci_high"))]
    assert [r["step"] for r in records if "eval/rmbench/total_avg_acc/ci_low" in r] == [2, 4]  # metrics.jsonl has them
    audit = json.loads((out / "data_audit.json").read_text())
    assert audit["max_length"] == 1024
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    assert recipe["output_dir"] == str(out) and recipe["max_steps"] == 4
    for step in (2, 4):
        assert (out / f"checkpoint-{step}" / "judgetrain_complete.json").is_file()
    assert (out / "adapter_model.safetensors").is_file()
    assert not list(out.rglob("*.tmp"))


@pytest.mark.slow
def test_the_tiny_judge_training_run_from_an_empty_cache(tmp_path):
    """Two processes start with no tiny judge built: one builds it, the other waits and loads it (.ci/run's first
    step, the tiny judge's training run in an empty home, is a second draw of the same race)."""
    env = cold_env(tmp_path)
    out = tmp_path / "run"
    proc = accelerate_launch("cpu.yaml", small_quickstart_args(out), env=env, timeout=1200)
    assert "Traceback" not in proc.stderr
    (entry,) = cache_entries(Path(env["JUDGETRAIN_CACHE"]))  # built once, no leftover temporary folder
    assert entry.name.startswith("tiny-judge-")
    assert TINY_FILES <= {p.name for p in entry.iterdir()}
    builds = read_jsonl(Path(env["JUDGETRAIN_CACHE"]) / "builds.jsonl")
    assert [b["entry"] for b in builds] == [entry.name]  # one process built it, the other waited and loaded it
    assert builds[0]["local_rank"] in ("0", "1")
    assert_written_once(out)
    # the datasets cache of the training mixture: no half-written cache file left behind by a second writer
    assert not [p for p in Path(env["HF_DATASETS_CACHE"]).rglob("*") if p.name.endswith((".incomplete", ".lock.tmp"))]


def bad_rows_source(tmp_path: Path) -> tuple[Path, int]:
    """The bundled JudgeBias train rows as jsonl with rows that fail validation planted among them."""
    from datasets import load_dataset

    from judgetrain.data.io import sample_source

    rows = load_dataset("parquet", data_files=str(Path(sample_source("judgebias")) / "train.parquet"), split="train")
    rows = rows.select(range(64)).to_list()
    rows[3]["rejected"] = rows[3]["chosen"]  # chosen == rejected
    rows[10]["prompt"] = "[not json"  # malformed JSON string column
    path = tmp_path / "judgebias_train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, 2


@pytest.mark.slow
def test_two_process_run_from_a_broken_cache_rebuilds_it_and_writes_rejects_once(tmp_path):
    env = cold_env(tmp_path)
    entry = plant_tiny_entry(Path(env["JUDGETRAIN_CACHE"]), "marker_without_weights")
    source, n_bad = bad_rows_source(tmp_path)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        QUICKSTART.read_text()
        .replace("  - {dataset: judgebias, source: bundled, split: train}\n",
                 f"  - {{dataset: judgebias, source: {source}, split: train}}\n")
        .replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", "")
        .replace("long_rows: error", "long_rows: skip\non_bad_row: skip")
        .replace("max_length: 1024", "max_length: 640")
    )
    out = tmp_path / "run"
    proc = accelerate_launch("cpu.yaml", [recipe, "--output_dir", out, "--max_steps", "2", "--eval_suites", "none",
                                          "--save_steps", "2"], env=env, timeout=1200)
    assert "is incomplete or corrupt" in proc.stderr
    assert TINY_FILES <= {p.name for p in entry.iterdir()}
    rejects = read_jsonl(out / "rejects" / "judgebias_0.jsonl")
    assert sorted(r["row"] for r in rejects) == [3, 10] and len(rejects) == n_bad
    audit = json.loads((out / "data_audit.json").read_text())
    long_rows = read_jsonl(out / "rejects" / "long_rows.jsonl")
    assert audit["skipped"] > 0 and len(long_rows) == audit["skipped"]
    assert len({r["row"] for r in long_rows}) == len(long_rows)
