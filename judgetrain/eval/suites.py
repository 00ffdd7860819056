"""Eval suites: which rows, what to score in each, and the per-row records and metrics built from the scores.

| suite     | rows                         | implicit scoring                     | judge scoring                                   |
|-----------|------------------------------|--------------------------------------|-------------------------------------------------|
| rmbench   | RM-Bench prompts             | 6 responses (3 chosen, 3 rejected)   | rubric prompt per response -> expected score    |
| judgebias | JudgeBias validation split   | chosen and rejected evaluation       | the row's own judge prompt -> the judge's score |
| ideation  | Ideation test split          | chosen and rejected proposal         | pairwise rows: log p(verdict) of chosen vs      |
|           |                              |                                      | rejected; plain rows: rubric score per proposal |
| evalbiasbench, judgebench, pairwise | a prompt and two responses | each response alone: the higher | each response's rubric score: the higher wins |
|           |                              | reward wins (a tie is wrong)          | (a tie is wrong)                                 |

The pairwise suites also score in ``verdict`` mode: the judge is shown both responses in one prompt
(`judgetrain.data.pairwise.both_orders`, the recipe's ``eval_pairwise_prompt``), as stored and swapped, and in each
order the log-probability of ``[[A>B]]`` against ``[[B>A]]`` is read in one forward (as Ideation's pairwise rows
read theirs): the verdict about what it was shown is the likelier one. Their records carry what the benchmark's own
rule reads (`judgetrain.eval.metrics.judgebench_results`, `evalbiasbench_results`): ``label``, ``source`` /
``category`` and ``verdicts`` (one from two scores, or one per order, each about what the judge was shown), or for
EvalBiasBench ``bias`` (slugged: no spaces), ``label`` 1 / 2 and ``predictions`` (the pick in each presentation).

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
import re
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from judgetrain import data
from judgetrain.config.recipe import PAIRWISE_SUITES, SUITES
from judgetrain.data.ideation import pairwise_prompt
from judgetrain.data.pairwise import (PAIRWISE_USER, both_orders, check_template, load_evalbiasbench, load_judgebench,
                                      load_pairwise)
from judgetrain.data.sampling import balanced_sample
from judgetrain.data.scoreparse import parse_overall_score_result, parse_pair_verdict, parse_verdict
from judgetrain.eval import metrics as M
from judgetrain.eval.scoring import Request, RowScore
from judgetrain.utils.errors import RecipeError

logger = logging.getLogger(__name__)

DEFAULT_SPLITS = {"judgebias": "validation", "ideation": "test"}
VERDICTS = ("[[A>B]]", "[[B>A]]")  # verdict mode: the two answers whose log-probabilities are compared, per order
_PICK = {"A>B": 1, "B>A": 2, "A=B": 3, None: None}  # EvalBiasBench's pick of a verdict about what was shown

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
    columns: dict | None = None  # pairwise: our field -> the source's column
    prompt: str | None = None  # pairwise suites, verdict and generate modes: the user template (default PAIRWISE_USER)

    def __post_init__(self):
        if self.name not in SUITES:
            raise ValueError(f"unknown eval suite {self.name!r}; valid: {', '.join(SUITES)}")

    @property
    def key(self) -> str:
        """Names the eval set (rows and their selection) in logs and caches."""
        columns = f":{sorted(self.columns.items())}" if self.columns else ""
        return (f"{self.name}:{self.source or 'bundled'}:{self.split or DEFAULT_SPLITS.get(self.name, '')}:"
                f"{self.max_rows}:{self.seed}:{self.mode}{columns}")


def suite_specs(eval_args: Any, *, seed: int = 0, ideation_mode: str = "implicit") -> list[SuiteSpec]:
    """The suites an `EvalArguments` names (a recipe's or `judgetrain eval`'s), with their sources, splits and cap."""
    sources = {name: getattr(eval_args, f"eval_{name}_source") for name in SUITES}
    splits = {name: getattr(eval_args, f"eval_{name}_split", None) for name in SUITES}
    prompt = eval_args.eval_pairwise_prompt
    if prompt is not None:
        try:
            check_template(prompt)
        except ValueError as err:
            raise RecipeError(f"eval_pairwise_prompt: {err}") from None
    return [SuiteSpec(name, source=sources[name], split=splits.get(name), max_rows=eval_args.eval_max_rows, seed=seed,
                      mode=ideation_mode if name == "ideation" else "implicit",
                      generate_max_rows=eval_args.eval_generate_max_rows,
                      columns=eval_args.eval_pairwise_columns if name == "pairwise" else None,
                      prompt=prompt if name in PAIRWISE_SUITES else None) for name in eval_args.eval_suites]


def check_verdict_tokens(tokenizer: Any) -> None:
    """Verdict mode reads the log-probability of `VERDICTS` after the verdict prompt: they must tokenise apart, the
    first token where they differ naming A in the one and B in the other. RecipeError (said at start, before any
    eval) for a tokenizer where they do not."""
    ids = [list(tokenizer(text=v, add_special_tokens=False)["input_ids"]) for v in VERDICTS]
    at = next((i for i, (a, b) in enumerate(zip(*ids)) if a != b), None)
    if at is None:
        raise RecipeError(f"verdict mode: the tokenizer gives the verdicts {VERDICTS} the same tokens; score the "
                          "pairwise suites in judge or generate mode")
    first, second = (tokenizer.decode([x[at]]) for x in ids)
    if "A" not in first or "B" not in second:
        raise RecipeError(f"verdict mode: the verdicts {VERDICTS} first differ at tokens {first!r} / {second!r}, which "
                          "do not name the letters A / B; score the pairwise suites in judge or generate mode")


def _group_key(name: str, row: dict) -> Hashable:
    if name == "rmbench":
        return M.rmbench_domain(row.get("domain") or row.get("id", ""))
    if name == "judgebias":
        return row.get("perturbation_type")
    if name in PAIRWISE_SUITES:
        return row.get("category") or row.get("source")
    return None  # ideation: no groups, an even deterministic draw


def load_suite_dataset(spec: SuiteSpec, *, on_bad_row: str = "error", rejects_path: str | None = None):
    """The suite's rows from its source (the bundled sample for None / "bundled"), validated by its adapter
    (``on_bad_row``, ``rejects_path``), before any row cap: the one place a suite name picks its reader."""
    if spec.name in PAIRWISE_SUITES and spec.source in (None, "", "bundled"):
        raise RecipeError(f"eval suite {spec.name}: no bundled copy; set eval_{spec.name}_source (a file, folder or "
                          "hub id)")
    source = data.sample_source(spec.name) if spec.source in (None, "", "bundled") else spec.source
    common = dict(on_bad_row=on_bad_row, rejects_path=rejects_path)
    if spec.name == "rmbench":
        return data.load_rmbench(source, **common)
    if spec.name == "judgebias":
        return data.load_judgebias(source, split=spec.split or DEFAULT_SPLITS["judgebias"], **common)
    if spec.name == "evalbiasbench":
        return load_evalbiasbench(spec.source, **common)
    if spec.name == "judgebench":  # split: gpt | claude, the response model's name
        ds = load_judgebench(spec.source, **common)
        return ds.filter(lambda subset: str(subset or "").startswith(spec.split), input_columns="subset") \
            if spec.split else ds
    if spec.name == "pairwise":
        return load_pairwise(spec.source, columns=spec.columns, split=spec.split, **common)
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


def applies(name: str, scoring: str) -> bool:
    """Whether a suite is scored in a mode: verdict mode is the pairwise suites'; every other mode, every suite's."""
    return scoring != "verdict" or name in PAIRWISE_SUITES


def verdict_suites(names: Sequence[str], scoring: Sequence[str]) -> list[str]:
    """The suites of ``names`` scored in verdict mode when ``scoring`` asks for it; the others are named in one
    INFO line (verdict mode shows two responses of a pair: RM-Bench, JudgeBias and Ideation's plain rows score
    each response alone)."""
    if "verdict" not in scoring:
        return []
    left_out = [n for n in names if not applies(n, "verdict")]
    if left_out:
        logger.info("verdict mode: %s not scored in it (not a pairwise suite: each response is scored alone in the "
                    "other modes asked for); pairwise suites: %s", ", ".join(left_out), ", ".join(PAIRWISE_SUITES))
    return [n for n in names if applies(n, "verdict")]


def build_requests(spec: SuiteSpec, row: dict, scoring: str) -> list[Request]:
    """What the engine scores for one row: one request, or in verdict mode one per order (as stored, swapped), each
    the verdict prompt with the two `VERDICTS` to compare."""
    if scoring == "verdict":
        return [Request("loglik", prompt=messages, responses=list(VERDICTS))
                for _, messages in both_orders(row, user=spec.prompt or PAIRWISE_USER)]
    return [build_request(spec.name, row, scoring)]


def build_request(name: str, row: dict, scoring: str) -> Request:
    """What the engine scores for one row (verdict mode: `build_requests`)."""
    if name in PAIRWISE_SUITES:  # each response alone, against the prompt: the higher score wins
        responses = [row["response_a"], row["response_b"]]
        if scoring == "judge":
            return Request("judge", judge_prompts=[rubric_prompt(row["prompt"], r) for r in responses])
        return Request("implicit", prompt=row["prompt"], responses=responses)
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
    if name in PAIRWISE_SUITES:
        if scoring == "verdict":  # [A, B] of the stored order, then of the swapped one: a verdict about each
            verdicts = [None, None] if s is None else [M.verdict_from_scores(*s[:2]), M.verdict_from_scores(*s[2:])]
        else:
            verdicts = [None] if s is None else [M.verdict_from_scores(*s)]
        rec.update(pair_record(name, row, verdicts), scores=s)
    elif name == "rmbench":
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


def slug(name: Any) -> str | None:
    """A category's name as a key part: runs of anything but letters, digits, ``_ . -`` become ``_``
    ("length bias" -> "length_bias")."""
    return None if name is None else re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name).strip()) or "_"


def pair_record(name: str, row: dict, verdicts: list[str | None]) -> dict[str, Any]:
    """What the pairwise benchmark's rule reads of one row judged: EvalBiasBench ``bias``, ``label`` (1 / 2) and
    ``predictions`` (the pick in the stored and in the swapped presentation; one verdict from two scores is mirrored:
    the order cannot move a judge that scores each response alone); JudgeBench and a team's pairs ``label``, ``source``,
    ``category`` and ``verdicts`` as given."""
    rec: dict[str, Any] = {"id": row.get("id")}
    if name == "evalbiasbench":
        picks = [_PICK[v] for v in verdicts]
        if len(picks) == 1:
            picks.append({1: 2, 2: 1}.get(picks[0], picks[0]))
        rec.update(bias=slug(row.get("category")), label=1 if row["label"] == "A>B" else 2, predictions=picks)
    else:
        rec.update(label=row["label"], source=row.get("source"), category=slug(row.get("category")),
                   subset=row.get("subset"), verdicts=list(verdicts))
    return rec


def suite_metrics(name: str, records: list[dict], scoring: str) -> dict[str, Any]:
    """Metrics of one suite from its records (skipped rows left out and counted)."""
    scored = [r for r in records if not r.get("skipped")]
    if name == "evalbiasbench":
        out = M.evalbiasbench_results(scored)
    elif name in PAIRWISE_SUITES:
        out = M.judgebench_results(scored)
    elif name == "rmbench":
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


def generate_prompts(name: str, row: dict, prompt: str | None = None) -> list[Any]:
    """The prompts the judge writes an answer to for one row in generate mode (RM-Bench: 6, JudgeBias: 1,
    Ideation: one per order, 1 for a pairwise row and 2 for a plain one; the pairwise suites: the verdict prompt
    (``prompt``: its user template) as stored and swapped)."""
    if name in PAIRWISE_SUITES:
        return [messages for _, messages in both_orders(row, user=prompt or PAIRWISE_USER)]
    if name == "ideation":
        return [prompt for _, _, prompt in _ideation_orders(row)]
    return list(build_request(name, row, "judge").judge_prompts)


def build_generate_record(name: str, index: int, row: dict, generated: list[Any], expected: RowScore) -> dict:
    """The per-row record of generate mode (``<suite>.generate.jsonl``): the row's identity and one output per prompt
    with the text written, ``n_tokens``, ``prompt_tokens``, ``stopped``, ``truncated``, what was parsed (``score``, or
    ``choice`` for ideation) with the parser's ``reason``, and ``expected``: the judge-mode figure of the same response
    (expected score; ideation: the preferred proposal's margin, chosen - rejected), None when judge mode skipped it."""

    rec: dict[str, Any] = {"row_index": index}
    if name in PAIRWISE_SUITES:
        return _pair_generate_record(name, index, row, generated, expected)
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


def _pair_generate_record(name: str, index: int, row: dict, generated: list[Any], expected: RowScore) -> dict:
    """A pairwise row in generate mode: the verdict written in each order (parsed by `parse_pair_verdict`, about what
    was shown), the benchmark's fields (`pair_record`) and, per output, ``expected``: the judge-mode margin of the
    better response (its rubric score minus the other's), None when judge mode skipped it."""
    outputs, verdicts = [], []
    better = 0 if row["label"] == "A>B" else 1
    margin = None if expected.scores is None else expected.scores[better] - expected.scores[1 - better]
    for (order, _), g in zip(both_orders(row), generated):
        parsed = parse_pair_verdict(g.text)
        as_row = parsed.verdict if order == "AB" else M.swap_verdict(parsed.verdict)
        verdicts.append(parsed.verdict)
        outputs.append({"text": g.text, "n_tokens": g.n_tokens, "prompt_tokens": g.prompt_tokens, "stopped": g.stopped,
                        "truncated": g.truncated, "order": order, "verdict": parsed.verdict, "reason": parsed.reason,
                        "agrees": None if as_row is None else (1.0 if as_row == row["label"] else
                                                               0.0 if as_row == "A=B" else -1.0),
                        "expected": margin})
    rec = {"row_index": index, **pair_record(name, row, verdicts), "outputs": outputs}
    if expected.skipped:
        rec["judge_skipped"] = True
    return rec


def _generated_value(name: str, out: dict) -> float | None:
    """The number set beside the judge-mode figure: the parsed score; ideation: +1 picked the preferred proposal,
    -1 the other, None unread."""
    if name in PAIRWISE_SUITES:  # +1 the verdict (read back to the row's order) names the better response, -1 the other
        return out["agrees"]
    if name == "ideation":
        return None if out["choice"] is None else (1.0 if out["choice"] == out["preferred"] else -1.0)
    return out["score"]


def generate_metrics(name: str, records: list[dict]) -> dict[str, Any]:
    """Generate-mode metrics of one suite: the suite's figures from the parsed scores or verdicts
    (`judgetrain.eval.metrics`: rmbench_results with unread = NaN, judgebias_generated, ideation_generated), what was
    written (generation_summary) and ``agreement``: Spearman between the generated value and the judge-mode figure."""
    outputs = [o for r in records for o in r["outputs"]]
    if name == "evalbiasbench":
        out = M.evalbiasbench_results(records)
    elif name in PAIRWISE_SUITES:
        out = M.judgebench_results(records)
    elif name == "rmbench":
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
