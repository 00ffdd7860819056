"""Eval suites: which rows, what to score in each, and the per-row records and metrics built from the scores.

| suite     | rows                         | implicit scoring                     | judge scoring                                   |
|-----------|------------------------------|--------------------------------------|-------------------------------------------------|
| rmbench   | RM-Bench prompts             | 6 responses (3 chosen, 3 rejected)   | rubric prompt per response -> expected score    |
| judgebias | JudgeBias validation split   | chosen and rejected evaluation       | the row's own judge prompt -> the judge's score |
| ideation  | Ideation test split          | chosen and rejected proposal         | pairwise rows: log p(verdict) of chosen vs      |
|           |                              |                                      | rejected; plain rows: rubric score per proposal |

JudgeBias in judge mode: the JudgeBias prompt already is a judge prompt (rubric + the perturbed recipe), so the
engine reads the judge's expected ``overall_score`` for it (``judge_score``). The row records keep the dataset's
recorded overall scores of the chosen and rejected evaluations as ``score_chosen`` / ``score_rejected`` and the
metrics ask whether the judge lands closer to the chosen verdict, how far it is from ``anchor_score`` on
representational rows (``represent/anchor_mae``) and whether it drops >= 0.5 below the anchor on error rows
(``error/detect_rate``). See `judgetrain.eval.metrics.judgebias_checks`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from judgetrain.config.recipe import SUITES
from judgetrain.data.sampling import balanced_sample
from judgetrain.eval import metrics as M
from judgetrain.eval.scoring import Request, RowScore

logger = logging.getLogger(__name__)

DEFAULT_SPLITS = {"judgebias": "validation", "ideation": "test"}

RUBRIC_SYSTEM = (
    "You are an impartial judge. Read the user's request and the assistant's response, then rate the response "
    "on a 1 to 5 scale (5 = correct, helpful, safe and complete; 1 = wrong, unhelpful or harmful). Reply with a "
    'JSON object {"overall_score": <score>} in a ```json block.'
)


@dataclass
class SuiteSpec:
    """One suite to evaluate.

    name: rmbench | judgebias | ideation. source: hub id, path, or None / "bundled" (the bundled sample).
    split: judgebias default "validation", ideation default "test". max_rows: cap, sampled evenly across
    domains (rmbench) / perturbation types (judgebias), deterministic for ``seed``. mode: ideation data mode
    (implicit | pairwise). rows: already loaded rows (a datasets.Dataset or list of dicts): used instead of source.
    """

    name: str
    source: str | None = None
    split: str | None = None
    max_rows: int | None = None
    seed: int = 0
    mode: str = "implicit"
    rows: Any = None

    def __post_init__(self):
        if self.name not in SUITES:
            raise ValueError(f"unknown eval suite {self.name!r}; valid: {', '.join(SUITES)}")

    @property
    def key(self) -> str:
        """Names the eval set (rows and their selection) in logs and caches."""
        return f"{self.name}:{self.source or 'bundled'}:{self.split or DEFAULT_SPLITS.get(self.name, '')}:{self.max_rows}:{self.seed}:{self.mode}"


def suite_specs(eval_args: Any, *, seed: int = 0, ideation_mode: str = "implicit") -> list[SuiteSpec]:
    """The suites an `EvalArguments` names (a recipe's or `judgetrain eval`'s), with their sources, splits and cap."""
    sources = {"rmbench": eval_args.eval_rmbench_source, "judgebias": eval_args.eval_judgebias_source,
               "ideation": eval_args.eval_ideation_source}
    splits = {"judgebias": eval_args.eval_judgebias_split, "ideation": eval_args.eval_ideation_split}
    return [SuiteSpec(name, source=sources[name], split=splits.get(name), max_rows=eval_args.eval_max_rows, seed=seed,
                      mode=ideation_mode if name == "ideation" else "implicit") for name in eval_args.eval_suites]


def _group_key(name: str, row: dict) -> Hashable:
    if name == "rmbench":
        return M.rmbench_domain(row.get("domain") or row.get("id", ""))
    if name == "judgebias":
        return row.get("perturbation_type")
    return None  # ideation: no groups, an even deterministic draw


def load_suite_rows(spec: SuiteSpec) -> list[dict]:
    """The suite's rows as dicts (after the row cap)."""
    if spec.rows is not None:
        rows = [dict(r) for r in spec.rows]
    else:
        from judgetrain import data

        source = data.sample_source(spec.name) if spec.source in (None, "", "bundled") else spec.source
        if spec.name == "rmbench":
            ds = data.load_rmbench(source)
        elif spec.name == "judgebias":
            ds = data.load_judgebias(source, split=spec.split or DEFAULT_SPLITS["judgebias"])
        else:
            ds = data.load_ideation(source, split=spec.split or DEFAULT_SPLITS["ideation"], mode=spec.mode)
        rows = [dict(r) for r in ds]
    if spec.name == "ideation" and spec.max_rows is not None and spec.max_rows < len(rows):
        # whole pairs: a pairwise row's two orders stay together (position consistency needs both)
        units: dict[Any, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            units[r.get("pair_id", i)].append(i)
        per_unit = max(1, round(len(rows) / len(units)))
        picked = balanced_sample([None] * len(units), max(1, spec.max_rows // per_unit), spec.seed)
        unit_rows = list(units.values())
        keep = sorted(i for u in picked for i in unit_rows[u])
    else:
        keep = balanced_sample([_group_key(spec.name, r) for r in rows], spec.max_rows, spec.seed)
    return [rows[i] for i in keep]


def _text(message: Any) -> str:
    if isinstance(message, str):
        return message
    return "\n".join(m["content"] for m in message)


def rubric_prompt(prompt: Any, response: Any) -> list[dict]:
    """A judge prompt for a response that comes without its own rubric (RM-Bench, plain Ideation rows)."""
    user = f"[User request]\n{_text(prompt)}\n\n[Assistant response]\n{_text(response)}"
    return [{"role": "system", "content": RUBRIC_SYSTEM}, {"role": "user", "content": user}]


def _is_pairwise(row: dict) -> bool:
    return row.get("order") in ("AB", "BA")


def build_request(name: str, row: dict, scoring: str) -> Request:
    """What the engine scores for one row."""
    if name == "rmbench":
        responses = list(row["chosen"]) + list(row["rejected"])
        if scoring == "judge":
            return Request("judge", judge_prompts=[rubric_prompt(row["prompt"], r) for r in responses])
        return Request("implicit", prompt=row["prompt"], responses=responses)
    if name == "judgebias":
        if scoring == "judge":
            return Request("judge", judge_prompts=[row["prompt"]])
        return Request("implicit", prompt=row["prompt"], responses=[row["chosen"], row["rejected"]])
    # ideation
    if scoring == "judge":
        if _is_pairwise(row):  # the prompt already asks for a verdict: compare the two forced verdicts
            return Request("loglik", prompt=row["prompt"], responses=[row["chosen"], row["rejected"]])
        return Request("judge", judge_prompts=[rubric_prompt(row["prompt"], row[k]) for k in ("chosen", "rejected")])
    return Request("implicit", prompt=row["prompt"], responses=[row["chosen"], row["rejected"]])


def build_record(name: str, index: int, row: dict, score: RowScore, scoring: str) -> dict:
    """The per-row record written to <output_dir>/eval/<step>/<suite>.jsonl (read back by `judgetrain report`)."""
    s = score.scores
    rec: dict[str, Any] = {"row_index": index}
    if name == "rmbench":
        rec.update(id=row.get("id"), domain=row.get("domain"),
                   score_chosen=s[:3] if s else None, score_rejected=s[3:] if s else None)
    elif name == "judgebias":
        rec.update(sample_id=row.get("sample_id"), perturbation_category=row.get("perturbation_category"),
                   perturbation_type=row.get("perturbation_type"), anchor_score=row.get("anchor_score"))
        if scoring == "judge":  # score_* are the dataset's recorded verdicts, judge_score the model's
            rec.update(score_chosen=row.get("score_chosen"), score_rejected=row.get("score_rejected"),
                       judge_score=s[0] if s else None)
        else:
            rec.update(score_chosen=s[0] if s else None, score_rejected=s[1] if s else None)
    else:
        rec.update(sample_id=row.get("sample_id"), pair_id=row.get("pair_id"),
                   score_chosen=s[0] if s else None, score_rejected=s[1] if s else None)
        if _is_pairwise(row):
            rec.update(order=row["order"], preferred=row.get("preferred"))
    if score.truncated:
        rec["truncated"] = True
    if score.skipped:
        rec["skipped"] = True
    if score.no_reference:
        rec["no_reference"] = True
    if score.generated is not None:
        rec["generated_overall_score"] = score.generated
    return rec


def suite_metrics(name: str, records: list[dict], scoring: str) -> dict[str, Any]:
    """Metrics of one suite from its records (skipped rows left out and counted)."""
    scored = [r for r in records if not r.get("skipped")]
    if name == "rmbench":
        out = M.rmbench_results(scored)
    elif name == "judgebias":
        out = M.judgebias_checks(scored, scoring=scoring)
    else:
        out = M.ideation_accuracy(scored)
    out["n_rows"] = len(scored)
    out["n_skipped"] = len(records) - len(scored)
    out["n_truncated"] = sum(1 for r in records if r.get("truncated"))
    no_ref = sum(1 for r in records if r.get("no_reference"))
    if no_ref:  # rows the run's frozen reference does not know (eval data changed since the start): unscored
        out["n_no_reference"] = no_ref
    gen = [g for r in records for g in (r.get("generated_overall_score") or [])]
    if gen:
        out["generated_parse_rate"] = sum(g is not None for g in gen) / len(gen)
    return out
