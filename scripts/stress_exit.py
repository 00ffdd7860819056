"""Stress the end of 2-process runs: N consecutive launches, counting exit codes. A finished run must exit 0 every
time (a race at interpreter exit shows as rank 1 dying with SIGABRT, "terminate called without an active exception",
and accelerate's exit 1).

- `--command train` (default): quickstart launches, half fresh, half resumed with `--resume auto` after a SIGKILL
  once the first checkpoint is complete;
- `--command eval`: `judgetrain eval` of the tiny judge on the bundled RM-Bench and JudgeBias rows, every launch fresh;
- `--command judge`: `judgetrain judge` of two tiny judges over bundled JudgeBias items, half fresh, half resumed
  (the same command again) after a SIGKILL once the first chunk is committed; the items are the bundled JudgeBias
  validation rows.

    python scripts/stress_exit.py --runs 20
    python scripts/stress_exit.py --runs 20 --fresh -- --max_steps 2 --eval_max_rows 8 --save_steps 100   # the ending
    python scripts/stress_exit.py --runs 4 -- --num_train_epochs 1     # overrides go to every train launch
    python scripts/stress_exit.py --command judge --runs 10

Not part of the test suite (a quickstart takes minutes on 2 CPU cores). Prints one line per launch and the counts.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VALIDATION = REPO / "judgetrain" / "data" / "samples" / "judgebias" / "validation.parquet"


def command_line(command: str, out: Path, overrides: list[str], resume: bool) -> list[str]:
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(REPO / "accelerate_configs" / "cpu.yaml")]
    if command == "eval":
        return [*launcher, "-m", "judgetrain.cli.eval", "--model", "tiny-judge", "--eval_suites", "rmbench",
                "judgebias", "--output-dir", str(out), *overrides]
    if command == "judge":
        return [*launcher, "-m", "judgetrain.cli.judge", "--items", str(VALIDATION), "--judge", "tiny-judge",
                "--judge", "model=tiny-judge,name=second",
                "--output_dir", str(out), "--chunk_size", "2", "--max_new_tokens", "8", "--force_score_prefix",
                *overrides]
    cmd = [*launcher, "-m", "judgetrain.train", str(REPO / "recipes" / "quickstart.yaml"), "--output_dir", str(out),
           *overrides]
    return cmd + ["--resume", "auto"] if resume else cmd


def launch(command: str, out: Path, overrides: list[str], resume: bool = False) -> subprocess.Popen:
    cmd = command_line(command, out, overrides, resume)
    log = open(out.parent / f"{out.name}{'.resume' if resume else ''}.log", "w")
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def kill_tree(proc: subprocess.Popen, launcher_only: bool) -> None:
    """SIGKILL the launch: every process of it (torchrun starts its workers in sessions of their own, so a kill of
    the launcher's process group does not reach them), or with ``launcher_only`` the launcher's group alone (as a
    scheduler that kills the command it started), then wait until the workers are gone."""
    import psutil

    workers = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    if not launcher_only:
        for w in workers:
            try:
                w.kill()
            except psutil.NoSuchProcess:
                pass
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=120)
    if alive:
        print(f"workers {[w.pid for w in alive]} still running 120 s after the launcher was killed", flush=True)
        for w in alive:
            w.kill()


def kill_after_first_checkpoint(proc: subprocess.Popen, out: Path, timeout: float, launcher_only: bool) -> bool:
    """SIGKILL the whole launch once a checkpoint with its completion marker (a judge: a committed chunk) exists."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        done = [c / "judgetrain_complete.json" for c in out.glob("checkpoint-*")] + list(out.glob("shards/*.index"))
        if any(p.is_file() and p.stat().st_size for p in done):
            kill_tree(proc, launcher_only)
            return True
        time.sleep(0.5)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", choices=("train", "eval", "judge"), default="train", help="what each launch runs")
    parser.add_argument("--runs", type=int, default=20, help="launches in all, half fresh and half resumed")
    parser.add_argument("--fresh", action="store_true", help="every launch fresh (no kill and resume)")
    parser.add_argument("--kill_launcher_only", action="store_true",
                        help="SIGKILL only the launcher's process group (the workers then get the parent-death SIGTERM)")
    parser.add_argument("--workdir", default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one launch may take")
    parser.add_argument("overrides", nargs="*", help="recipe overrides for every launch (after --)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="stress-exit-"))
    work.mkdir(parents=True, exist_ok=True)
    counts: dict[str, collections.Counter] = {"fresh": collections.Counter(), "resumed": collections.Counter()}
    for i in range(args.runs):
        kind = "fresh" if i % 2 == 0 or args.command == "eval" or args.fresh else "resumed"
        out = work / f"run-{i:02d}"
        t0 = time.monotonic()
        if kind == "resumed":
            first = launch(args.command, out, args.overrides)
            if not kill_after_first_checkpoint(first, out, args.timeout, args.kill_launcher_only):
                first.wait()
                print(f"run {i}: no checkpoint before the first launch ended ({first.returncode}); skipped", flush=True)
                counts[kind]["no checkpoint"] += 1
                continue
        proc = launch(args.command, out, args.overrides, resume=kind == "resumed")
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = "timeout"
        counts[kind][code] += 1
        print(f"run {i} ({kind}): exit {code} in {time.monotonic() - t0:.0f}s, log {out}.{'resume.' if kind == 'resumed' else ''}log",
              flush=True)
    failures = sum(n for c in counts.values() for code, n in c.items() if code != 0)
    for kind, c in counts.items():
        print(f"{kind}: {dict(c)}")
    print(f"{args.runs} launches, {failures} not exiting 0 (workdir {work})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
