"""The judge part (``--only judge``): `judgetrain judge` at work.

- **speed**: evaluations/s of the command's loop (`judgetrain.judge.runner.run_panel`: chunks, batched generation,
  per-batch commits to its shard) against a one-item-at-a-time ``model.generate`` loop
  (`judgetrain.bench.generation.one_at_a_time`), on the same JudgeBias items and judge, greedy, the same stops and
  ``max_new_tokens``; the ratio in one run, with both sides measured the same two ways: start to end with the
  model load (the command as run against the loop's model load plus the loop) and the generate calls alone (the
  command's batch seconds from its done index against the loop), after one untimed 2-token generate that warms
  the process for both.
- **resume**: the time from a start to the exit of a resume with nothing left to do, on an output folder holding
  ``--judge-resume-rows`` done rows (default 136,000: 34,000 items x 4 judges, the size of JudgeBias-DPO-RefFree's
  panel), as the command leaves it: decided from the items file's stamp, the identity and the done index before
  torch is imported (`judgetrain.judge.resume`); then the same with the items file touched (same bytes, another
  modification time): the full start, which imports the stack, reads and checks the items and compares them.
  The rows are synthetic (a short prompt per item), written the way the command writes them.
"""

# Late imports: judgetrain.bench, accelerate, judgetrain.eval, judgetrain.judge (inside the functions that use them):
# each benchmark part loads only what it measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from judgetrain.bench.common import ratio

logger = logging.getLogger(__name__)


def _items_file(path: Path, n: int) -> Path:
    from judgetrain.bench.eval import _judgebias_rows

    rows = _judgebias_rows(n)
    with path.open("w", encoding="utf-8") as f:
        for i, row in enumerate(rows):
            prompt = json.loads(row["prompt"]) if isinstance(row["prompt"], str) else row["prompt"]
            f.write(json.dumps({"sample_id": i, "prompt": prompt}) + "\n")
    return path


def bench_judge_speed(cfg: argparse.Namespace, workdir: Path, model_name: str) -> dict[str, Any]:
    from accelerate import PartialState

    from judgetrain.bench.generation import one_at_a_time
    from judgetrain.eval.generate import Generator
    from judgetrain.judge.items import read_items
    from judgetrain.judge.judges import load_local, parse_judge
    from judgetrain.judge.runner import Options, run_panel

    items_path = _items_file(workdir / f"items-{cfg.judge_items}.jsonl", cfg.judge_items)
    item_set = read_items(str(items_path))
    spec = parse_judge(model_name)
    opts = Options(max_new_tokens=cfg.judge_max_new_tokens, backend="transformers", chunk_size=cfg.judge_items)
    state = PartialState(cpu=True)
    out_dir = workdir / f"judge-{time.monotonic_ns()}"
    warm = Generator(*load_local(spec), max_new_tokens=2)  # untimed, before both sides: first-call allocations
    one_at_a_time(warm, [warm._fit(warm.prompt_ids(item_set.items[0].messages))[0]])
    del warm
    t0 = time.perf_counter()
    result = run_panel(item_set, [spec], opts, out_dir, state)
    command_s = time.perf_counter() - t0  # model load included, as a user waits for it
    command_generate_s = result["summary"][spec.name]["generate_seconds"]  # its generate calls alone
    t0 = time.perf_counter()
    model, tokenizer = load_local(spec)
    gen = Generator(model, tokenizer, max_new_tokens=cfg.judge_max_new_tokens)
    prompt_ids = [gen._fit(gen.prompt_ids(i.messages))[0] for i in item_set.items]
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    loop = one_at_a_time(gen, prompt_ids)
    loop_s = time.perf_counter() - t0
    n = len(item_set.items)
    rows = [json.loads(line) for line in (out_dir / "evaluations.jsonl").read_text().splitlines()]
    same = sum(r["evaluation"] == g.text for r, g in zip(rows, loop))
    # both sides measured the same two ways: start to end with the model load (the command against the loop's
    # load + loop), and the generate calls alone (the command's batches against the loop)
    return {"model": model_name, "items": n, "max_new_tokens": cfg.judge_max_new_tokens,
            "command_seconds": command_s, "command_evaluations_per_s": n / command_s,
            "loop_load_seconds": load_s, "loop_seconds": loop_s, "loop_evaluations_per_s": n / loop_s,
            "evaluations_per_s_ratio": ratio(n / command_s, n / (load_s + loop_s)),
            "command_generate_seconds": command_generate_s,
            "generate_evaluations_per_s_ratio": ratio(n / command_generate_s, n / loop_s) if command_generate_s else None,
            "texts_equal_rows": same, "generated_tokens": result["summary"][spec.name]["generated_tokens"]}


def _done_folder(out: Path, n_items: int, judges: list[str], items_path: Path) -> None:
    """An output folder as `judgetrain judge` leaves it after a finished run: identity, two shards, their index,
    the merged file (the rows are short: their size does not enter a resume, which never reads them)."""
    from judgetrain.judge.items import read_items
    from judgetrain.judge.judges import parse_judge
    from judgetrain.judge.output import ShardWriter, merge, read_done
    from judgetrain.judge.runner import Options, confirmed, identity

    item_set = read_items(str(items_path))
    specs = [parse_judge(f"model=tiny-judge,name={j}") for j in judges]
    confirmed(out, item_set, identity(item_set, specs, Options()))
    writers = [ShardWriter(out, r) for r in range(2)]
    for j in judges:
        for start in range(0, n_items, 64):
            chunk = list(range(start, min(start + 64, n_items)))
            for r, w in enumerate(writers):
                mine = chunk[r::2]
                rows = [{"sample_id": i, "judge_model": j, "evaluation": "```json\n{\"overall_score\": 4}\n```"}
                        for i in mine]
                w.append(rows, j, mine, {"score": [4.0] * len(mine), "reason": ["ok"] * len(mine),
                                         "n_tokens": [12] * len(mine), "stopped": [True] * len(mine),
                                         "truncated": 0, "seconds": 0.1})
    for w in writers:
        w.close()
    merge(out, [s.name for s in specs], n_items, read_done(out))


def bench_judge_resume(cfg: argparse.Namespace, workdir: Path) -> dict[str, Any]:

    n_judges = 4
    n_items = cfg.judge_resume_rows // n_judges
    items = workdir / "resume-items.jsonl"
    with items.open("w", encoding="utf-8") as f:
        for i in range(n_items):
            f.write(json.dumps({"sample_id": i, "perturbation_set": "element_substitution_100pct",
                                "prompt": [{"role": "user", "content": f"Rate recipe {i}: mix, dry, calcine."}]}) + "\n")
    out = workdir / "resume-run"
    judges = [f"judge-{k}" for k in range(n_judges)]
    t0 = time.perf_counter()
    _done_folder(out, n_items, judges, items)
    build_s = time.perf_counter() - t0
    cmd = [sys.executable, "-m", "judgetrain.cli.judge", "--items", str(items), "--output_dir", str(out)]
    for j in judges:
        cmd += ["--judge", f"model=tiny-judge,name={j}"]
    seconds, proc = _timed(cmd)
    os.utime(items)  # the same bytes, touched: the full start reads and compares the items
    touched_s, touched = _timed(cmd)
    return {"done_rows": n_items * n_judges, "items": n_items, "judges": n_judges, "seconds_to_exit": seconds,
            "target_seconds": 5.0, "nothing_generated": "nothing left to do" in proc.stderr,
            "decided_before_torch": "the file the run read" in proc.stderr,
            "seconds_to_exit_items_touched": touched_s,
            "items_touched_nothing_generated": "nothing left to do" in touched.stderr, "setup_seconds": build_s}


def _timed(cmd: list[str]):
    """(seconds from start to exit, the finished process) of one command."""

    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"resume run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, proc


def bench_judge(cfg: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"speed": {}}
    for name in cfg.judge_models:
        try:
            out["speed"][name] = bench_judge_speed(cfg, workdir, name)
        except Exception as e:  # noqa: BLE001 - SmolLM2 without its package: the other parts still run
            logger.warning("judge bench: %s skipped: %s", name, e)
            out["speed"][name] = {"skipped": f"{type(e).__name__}: {e}"}
    out["resume"] = bench_judge_resume(cfg, workdir)
    return out
