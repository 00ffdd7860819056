"""Eval suites: which rows, what to score in each, and the per-row records and metrics built from the scores.

| suite     | rows                         | implicit scoring                     | judge scoring                                   |
|-----------|------------------------------|--------------------------------------|-------------------------------------------------|
| rmbench   | RM-Bench prompts             | 6 responses (3 chosen, 3 rejected)   | rubric prompt per response -> expected score    |
| judgebias | JudgeBias validation split   | chosen and rejected evaluation       | the row's own judge prompt -> the judge's score |
| ideation  | Ideation test split          | chosen and rejected proposal         | pairwise rows: log p(verdict) of chosen vs      |
|           |                              |                                      | rejected; plain rows: rubric score per proposal |

Generate mode (a sample of the scored rows, ``generate_max_rows``): the judge writes its evaluation of the judge-mode
prompts (RM-Bench: the rubric prompt of each of the 6 responses; JudgeBias: the row's own prompt) and the overall
score is parsed from the text; Ideation asks for a pairwise verdict in both orders (pairwise rows are already one
order each; a plain row's two proposals are put in both orders with the pairwise prompt of
`judgetrain.data.ideation`) and the letter picked is parsed. Each generation is set beside the judge-mode figure of
the same response (expected score; Ideation: the margin of the preferred proposal) for the agreement.

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

from judgetrain import data
from judgetrain.config.recipe import SUITES
from judgetrain.data.ideation import pairwise_prompt
from judgetrain.data.sampling import balanced_sample
from judgetrain.data.scoreparse import parse_overall_score_result, parse_verdict
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
    generate_max_rows: int | None = 64

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
                      mode=ideation_mode if name == "ideation" else "implicit",
                      generate_max_rows=eval_args.eval_generate_max_rows) for name in eval_args.eval_suites]


def _group_key(name: str, row: dict) -> Hashable:
    if name == "rmbench":
        return M.rmbench_domain(row.get("domain") or row.get("id", ""))
    if name == "judgebias":
        return row.get("perturbation_type")
    return None  # ideation: no groups, an even deterministic draw


def load_suite_dataset(spec: SuiteSpec, *, on_bad_row: str = "error", rejects_path: str | None = None):
    """The suite's rows from its source (the bundled sample for None / "bundled"), validated by its adapter
    (``on_bad_row``, ``rejects_path``), before any row cap: the one place a suite name picks its reader."""
    source = data.sample_source(spec.name) if spec.source in (None, "", "bundled") else spec.source
    common = dict(on_bad_row=on_bad_row, rejects_path=rejects_path)
    if spec.name == "rmbench":
        return data.load_rmbench(source, **common)
    if spec.name == "judgebias":
        return data.load_judgebias(source, split=spec.split or DEFAULT_SPLITS["judgebias"], **common)
    return data.load_ideation(source, split=spec.split or DEFAULT_SPLITS["ideation"], mode=spec.mode, **common)


def load_suite_rows(spec: SuiteSpec) -> list[dict]:
    """The suite's rows as dicts (after the row cap)."""
    rows = [dict(r) for r in (spec.rows if spec.rows is not None else load_suite_dataset(spec))]
    return [rows[i] for i in select_rows(spec.name, rows, spec.max_rows, spec.seed)]


def select_rows(name: str, rows: list[dict], max_rows: int | None, seed: int = 0) -> list[int]:
    """Indices of at most ``max_rows`` rows, drawn evenly across domains (rmbench) / perturbation types (judgebias)
    with `balanced_sample`; ideation draws whole pairs (a pairwise row's two orders stay together: position
    consistency needs both). Deterministic for ``seed``, in row order."""
    if name == "ideation" and max_rows is not None and max_rows < len(rows):
        units: dict[Any, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            units[r.get("pair_id", i)].append(i)
        per_unit = max(1, round(len(rows) / len(units)))
        picked = balanced_sample([None] * len(units), max(1, max_rows // per_unit), seed)
        unit_rows = list(units.values())
        return sorted(i for u in picked for i in unit_rows[u])
    return balanced_sample([_group_key(name, r) for r in rows], max_rows, seed)


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
    return out


# ------------------------------------------------------------------------------------------------ generate mode
def _ideation_orders(row: dict) -> list[tuple[str, str, Any]]:
    """(order, preferred letter, verdict prompt) of each pairwise verdict asked about an ideation row."""
    if _is_pairwise(row):
        return [(row["order"], row.get("preferred") or ("A" if row["order"] == "AB" else "B"), row["prompt"])]

    context, chosen, rejected = _text(row["prompt"]), _text(row["chosen"]), _text(row["rejected"])
    return [("AB", "A", pairwise_prompt(context, chosen, rejected)), ("BA", "B", pairwise_prompt(context, rejected, chosen))]


def generate_prompts(name: str, row: dict) -> list[Any]:
    """The prompts the judge writes an answer to for one row in generate mode (RM-Bench: 6, JudgeBias: 1,
    Ideation: one per order, 1 for a pairwise row and 2 for a plain one)."""
    if name == "ideation":
        return [prompt for _, _, prompt in _ideation_orders(row)]
    return list(build_request(name, row, "judge").judge_prompts)


def build_generate_record(name: str, index: int, row: dict, generated: list[Any], expected: RowScore) -> dict:
    """The per-row record of generate mode (``<suite>.generate.jsonl``): the row's identity and one output per prompt
    with the text written, ``n_tokens``, ``prompt_tokens``, ``stopped``, ``truncated``, what was parsed (``score``, or
    ``choice`` for ideation) with the parser's ``reason``, and ``expected``: the judge-mode figure of the same response
    (expected score; ideation: the preferred proposal's margin, chosen - rejected), None when judge mode skipped it."""

    rec: dict[str, Any] = {"row_index": index}
    if name == "rmbench":
        rec.update(id=row.get("id"), domain=row.get("domain"))
    elif name == "judgebias":
        rec.update(sample_id=row.get("sample_id"), perturbation_category=row.get("perturbation_category"),
                   perturbation_type=row.get("perturbation_type"), anchor_score=row.get("anchor_score"))
    else:
        rec.update(sample_id=row.get("sample_id"), pair_id=row.get("pair_id") or row.get("sample_id") or index)
    values = expected.scores
    outputs = []
    for slot, g in enumerate(generated):
        out = {"text": g.text, "n_tokens": g.n_tokens, "prompt_tokens": g.prompt_tokens, "stopped": g.stopped,
               "truncated": g.truncated}
        if name == "ideation":
            order, preferred, _ = _ideation_orders(row)[slot]
            verdict = parse_verdict(g.text)
            out.update(order=order, preferred=preferred, choice=verdict.choice, reason=verdict.reason,
                       expected=None if values is None else values[0] - values[1])
        else:
            parsed = parse_overall_score_result(g.text)
            out.update(score=parsed.score, reason=parsed.reason, expected=None if values is None else values[slot])
        outputs.append(out)
    rec["outputs"] = outputs
    if expected.skipped:
        rec["judge_skipped"] = True
    return rec


def _generated_value(name: str, out: dict) -> float | None:
    """The number set beside the judge-mode figure: the parsed score; ideation: +1 picked the preferred proposal,
    -1 the other, None unread."""
    if name == "ideation":
        return None if out["choice"] is None else (1.0 if out["choice"] == out["preferred"] else -1.0)
    return out["score"]


def generate_metrics(name: str, records: list[dict]) -> dict[str, Any]:
    """Generate-mode metrics of one suite: the suite's figures from the parsed scores or verdicts
    (`judgetrain.eval.metrics`: rmbench_results with unread = NaN, judgebias_generated, ideation_generated), what was
    written (generation_summary) and ``agreement``: Spearman between the generated value and the judge-mode figure."""
    outputs = [o for r in records for o in r["outputs"]]
    if name == "rmbench":
        nan = float("nan")
        out = M.rmbench_results([{"domain": r.get("domain") or r.get("id", ""),
                                  "score_chosen": [nan if o["score"] is None else o["score"] for o in r["outputs"][:3]],
                                  "score_rejected": [nan if o["score"] is None else o["score"] for o in r["outputs"][3:]]}
                                 for r in records])
    elif name == "judgebias":
        out = M.judgebias_generated([{**r, "score": r["outputs"][0]["score"]} for r in records])
    else:
        out = M.ideation_generated([{**o, "pair_id": r["pair_id"]} for r in records for o in r["outputs"]])
    out.update(M.generation_summary(outputs))
    out["agreement"] = M.spearman([_generated_value(name, o) for o in outputs], [o["expected"] for o in outputs])
    out["n_rows"] = len(records)
    return out
