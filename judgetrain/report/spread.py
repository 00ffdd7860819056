"""Whether a judge tells a suite's items apart at all, read from an evaluation's per-row files in judge mode: when it
gives every item nearly one score, its figures move with that one score, and this says so beside them.

    lines = flat_judge_lines(run_dir, step=62)   # [] when the judge's scores at step 62 are spread out

A judge whose expected scores over a suite's items spread by less than `FLAT_SD` points (standard deviation, on the
1-5 scale) reads every item alike. On JudgeBias, error copies and rewrites then get the same score, so the error
figures (error/detect_rate: at least 0.5 under the anchor) and the representational ones (represent/anchor_mae,
represent/accuracy) move together, in opposite directions: a lower score flags more errors and puts every rewrite
further below its anchor. On RM-Bench, which response of a pair wins is decided by hundredths of a point. The
embedded tiny judge (a random 2-layer model) is such a judge before and after the quickstart's few minutes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FLAT_SD = 0.1  # points on the 1-5 scale: a judge's scores over a suite spread by less than this read items alike


def _rows(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _spread(values: list[float]) -> tuple[float, float] | None:
    """(mean, standard deviation) of the finite values; None without any."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
        return None
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _judgebias_scores(eval_dir: Path) -> dict[str, list[float]]:
    """The judge's score of each JudgeBias item, all and per category (error, represent)."""
    out: dict[str, list[float]] = {"all": []}
    for row in _rows(eval_dir / "judgebias.judge.jsonl"):
        score = row.get("judge_score")
        out["all"].append(score)
        out.setdefault(str(row.get("perturbation_category")), []).append(score)
    return out


def _rmbench_scores(eval_dir: Path) -> list[float]:
    return [s for row in _rows(eval_dir / "rmbench.judge.jsonl")
            for s in list(row.get("score_chosen") or []) + list(row.get("score_rejected") or [])]


def _at(step: int, spread: tuple[float, float]) -> str:
    return f"{'the base' if step == 0 else f'step {step}'}: {spread[0]:.3f}, sd {spread[1]:.3f}"


def flat_judge_lines(run_dir: str | Path, step: int, base_step: int = 0) -> list[str]:
    """A sentence per suite (JudgeBias, RM-Bench) whose judge-mode scores at ``step`` spread by less than `FLAT_SD`:
    what the judge's scores are at the base and at ``step``, and what moves its figures then (see the module doc);
    [] when the run has no such per-row files or the judge tells the items apart."""
    eval_root = Path(run_dir) / "eval"
    now, base = _judgebias_scores(eval_root / str(step)), _judgebias_scores(eval_root / str(base_step))
    lines = []
    spread, before = _spread(now["all"]), _spread(base["all"])
    if spread is not None and spread[1] < FLAT_SD:
        by = {c: _spread(now.get(c, [])) for c in ("error", "represent")}
        split = (f"; errors {by['error'][0]:.3f}, rewrites {by['represent'][0]:.3f}"
                 if by["error"] and by["represent"] else "")
        lines.append(
            f"JudgeBias in judge mode: the judge gives every item nearly one score ("
            + (f"{_at(base_step, before)}; " if before else "") + f"{_at(step, spread)}{split}): it does not tell an "
            "error from a rewrite, so its error figures and its representational figures move with that one score, "
            "in opposite directions: lower, it flags more errors and puts every rewrite further below its anchor "
            "(higher, the reverse). A judge that learns the difference moves them apart.")
    spread, before = _spread(_rmbench_scores(eval_root / str(step))), _spread(_rmbench_scores(eval_root / str(base_step)))
    if spread is not None and spread[1] < FLAT_SD:
        lines.append(
            "RM-Bench in judge mode: every response is scored within a sliver of the scale ("
            + (f"{_at(base_step, before)}; " if before else "") + f"{_at(step, spread)}): which response of a pair "
            "wins is decided by hundredths of a point, so its accuracies and its style spread move with changes that "
            "small, not with what the judge reads.")
    return lines
