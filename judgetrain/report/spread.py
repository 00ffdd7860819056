"""Whether a judge tells a suite's items apart at all, read from an evaluation's per-row files in judge mode: when it
gives every item nearly one score, its figures move with that one score, and this says so beside them.

    lines = flat_judge_lines(run_dir, step=62)   # [] when the judge's scores at step 62 are spread out

A judge whose expected scores over a suite's items spread by less than `FLAT_SD` points (standard deviation, on the
1-5 scale) reads every item alike; what then moves the suite's figures is the suite's to say
(`Suite.flat_judge_line`): on a suite of error copies and rewrites both get the same score, so the error figures and
the representational ones move together, in opposite directions; on a suite of styled pairs, which response of a pair
wins is decided by hundredths of a point. The embedded tiny judge (a random 2-layer model) is such a judge before and
after the quickstart's few minutes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from judgetrain.config.suites import known_suites
from judgetrain.eval.benchmarks import get_suite
from judgetrain.eval.benchmarks.base import mean_sd

FLAT_SD = 0.1  # points on the 1-5 scale: a judge's scores over a suite spread by less than this read items alike


def _rows(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _at(step: int, spread: tuple[float, float]) -> str:
    return f"{'the base' if step == 0 else f'step {step}'}: {spread[0]:.3f}, sd {spread[1]:.3f}"


def flat_judge_lines(run_dir: str | Path, step: int, base_step: int = 0) -> list[str]:
    """A sentence per suite whose judge-mode scores at ``step`` spread by less than `FLAT_SD` (the suites that read
    their scores, `Suite.judge_scores`, in the registry's order): what the judge's scores are at the base and at
    ``step``, and what moves its figures then (`Suite.flat_judge_line`; see the module doc); [] when the run has no
    such per-row files or the judge tells the items apart."""
    eval_root = Path(run_dir) / "eval"
    lines = []
    for name in known_suites():
        suite = get_suite(name)
        now = suite.judge_scores(_rows(eval_root / str(step) / f"{name}.judge.jsonl"))
        base = suite.judge_scores(_rows(eval_root / str(base_step) / f"{name}.judge.jsonl"))
        spread, before = mean_sd(now.get("all", [])), mean_sd(base.get("all", []))
        if spread is not None and spread[1] < FLAT_SD:
            lines.append(suite.flat_judge_line((f"{_at(base_step, before)}; " if before else "") + _at(step, spread),
                                               now))
    return lines
