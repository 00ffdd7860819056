"""What the pairwise suites share (a prompt, two responses, the better one's label): the verdicts, read back to the
row's order, the position lean figures, and `PairSuite`, the base of EvalBiasBench, JudgeBench and a team's own pairs.

Each response is scored alone in implicit and judge mode (the higher score wins, a tie is wrong): the deployed
pairwise judge made of a pointwise one, whose verdict in each presentation names the same response by construction
(`derived_verdicts`: the record holds the verdict as stored and swapped, so accuracy, inconsistency and the position
figures are read as in the other modes); in ``verdict`` mode
the judge is shown both responses in one prompt (`judgetrain.data.pairwise.both_orders`, the recipe's
``eval_pairwise_prompt``), as stored and swapped, and in each order the log-probability of ``[[A>B]]`` against
``[[B>A]]`` is read in one forward: the verdict about what it was shown is the likelier one. Generate mode parses the
verdict each order's text gives. The records carry what the benchmark's own rule reads (`PairSuite.pair_fields`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from judgetrain.data.pairwise import PAIRWISE_USER, both_orders
from judgetrain.data.scoreparse import parse_pair_verdict
from judgetrain.eval.benchmarks.base import Suite, finite_number, rubric_prompt
from judgetrain.eval.requests import Request, RowScore
from judgetrain.eval.stats import as_score

VERDICTS = ("[[A>B]]", "[[B>A]]")  # verdict mode: the two answers whose log-probabilities are compared, per order
POSITION_FIGURES = ("first_position_rate", "first_position_prob")  # judgetrain's lean figures of the pairwise suites
_SWAP = {"A>B": "B>A", "B>A": "A>B", "A=B": "A=B", None: None}


def swap_verdict(verdict: str | None) -> str | None:
    """A verdict about the swapped presentation, read back to the row's order: "A>B" <-> "B>A"; "A=B", None stay."""
    if verdict not in _SWAP:
        raise ValueError(f"a pairwise verdict is 'A>B', 'B>A', 'A=B' or None, got {verdict!r}")
    return _SWAP[verdict]


def verdict_from_scores(score_a: Any, score_b: Any) -> str | None:
    """A score-based judge's verdict from its two scores: the higher wins, equal is "A=B", None / NaN is no verdict."""
    a, b = as_score(score_a), as_score(score_b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return None
    return "A>B" if a > b else "B>A" if b > a else "A=B"


def derived_verdicts(score_a: Any, score_b: Any) -> list[str | None]:
    """A pointwise judge deployed as a pairwise one: its verdict from the two scores (`verdict_from_scores`) in both
    presentations, each about what was shown: [as stored, swapped]. Each response is scored alone, so both name the
    same response: the same verdict in both orders by construction."""
    verdict = verdict_from_scores(score_a, score_b)
    return [verdict, swap_verdict(verdict)]


def presentation_scores(scores: Any) -> Any:
    """A pointwise judge's two scores [a, b] laid out as verdict mode lays out a pair's four (each presentation's
    first-shown then second-shown response: [a, b, b, a]), so that `first_position_prob` reads its lean (0.5 by
    construction); anything else as given."""
    if isinstance(scores, (list, tuple)) and len(scores) == 2:
        return [scores[0], scores[1], scores[1], scores[0]]
    return scores


def first_position_prob(scores: Any) -> float:
    """Verdict mode's position lean as probabilities: a pair's four log-probabilities (``[[A>B]]``, ``[[B>A]]`` as
    shown, then swapped) give, per order, the probability of the verdict that picks the response shown first, the
    two verdicts' probabilities normalised to 1; the mean of the two orders (0.5: no lean, whatever the content).
    It moves where the verdict itself does not yet flip. NaN for any other record (two scores of a score-based
    judge, unless laid out by `presentation_scores`; none in generate mode)."""
    if not isinstance(scores, (list, tuple)) or len(scores) != 4 or not all(finite_number(x) for x in scores):
        return math.nan
    # sigmoid(d) = (1 + tanh(d / 2)) / 2: no overflow at any gap (a verdict may be hundreds of nats less likely)
    return float(np.mean([(1.0 + math.tanh((scores[0] - scores[1]) / 2)) / 2,
                          (1.0 + math.tanh((scores[2] - scores[3]) / 2)) / 2]))


def first_position_share(verdicts: Sequence[str | None]) -> float:
    """A pair's share of read verdicts, each about what the judge was shown, that pick the response shown first
    ("A>B"); NaN when none was read (a tie names neither). Over a pair shown in both orders a judge without position
    bias averages 0.5 whatever it knows of the content: the two orders put each response first once."""
    read = [v == "A>B" for v in verdicts if v in ("A>B", "B>A")]
    return sum(read) / len(read) if read else math.nan


def slug(name: Any) -> str | None:
    """A category's name as a key part: runs of anything but letters, digits, ``_ . -`` become ``_``
    ("length bias" -> "length_bias")."""
    return None if name is None else re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name).strip()) or "_"


class PairSuite(Suite):
    """A pairwise benchmark: a prompt, ``response_a``, ``response_b`` and ``label`` (A>B / B>A); the unit is a pair
    (both presentations: one record). Subclasses say what their rule reads of a judged row (`pair_fields`)."""

    pairwise = True
    unit = "a pair (both presentations: one record)"
    record_field = "verdicts"  # what compare needs in each record

    def group_key(self, row: dict) -> Hashable:
        return row.get("category") or row.get("source")

    def request(self, row: dict, scoring: str) -> Request:
        """Each response alone, against the prompt: the higher score wins."""
        responses = [row["response_a"], row["response_b"]]
        if scoring == "judge":
            return Request("judge", judge_prompts=[rubric_prompt(row["prompt"], r) for r in responses])
        return Request("implicit", prompt=row["prompt"], responses=responses)

    def requests(self, row: dict, scoring: str, prompt: str | None = None) -> list[Request]:
        """Verdict mode: one request per order (as stored, swapped), each the verdict prompt with the two
        `VERDICTS` to compare."""
        if scoring == "verdict":
            return [Request("loglik_sum", prompt=messages, responses=list(VERDICTS))
                    for _, messages in both_orders(row, user=prompt or PAIRWISE_USER)]
        return super().requests(row, scoring, prompt)

    def pair_fields(self, row: dict, verdicts: list[str | None]) -> dict[str, Any]:
        """What the benchmark's rule reads of one row judged (``verdicts``: one from two scores, or one per order,
        each about what the judge was shown)."""
        raise NotImplementedError

    def row_fields(self, row: dict, score: RowScore, scoring: str) -> dict[str, Any]:
        s = score.scores
        if scoring == "verdict":  # [A, B] of the stored order, then of the swapped one: a verdict about each
            verdicts = [None, None] if s is None else [verdict_from_scores(*s[:2]), verdict_from_scores(*s[2:])]
        else:
            verdicts = [None] if s is None else derived_verdicts(*s)  # each response scored alone
        return {"id": row.get("id"), **self.pair_fields(row, verdicts), "scores": s}

    def generate_prompts(self, row: dict, prompt: str | None = None) -> list[Any]:
        """The verdict prompt (``prompt``: its user template) as stored and swapped."""
        return [messages for _, messages in both_orders(row, user=prompt or PAIRWISE_USER)]

    def generate_output(self, row: dict, slot: int, generated: Any, expected: list | None) -> dict[str, Any]:
        """The verdict written in one order (parsed by `parse_pair_verdict`, about what was shown), whether it names
        the better response once read back to the row's order (``agrees``: 1, 0 a tie, -1, None unread) and
        ``expected``: the judge-mode margin of the better response (its rubric score minus the other's)."""
        order = both_orders(row)[slot][0]
        parsed = parse_pair_verdict(generated.text)
        as_row = parsed.verdict if order == "AB" else swap_verdict(parsed.verdict)
        agrees = None if as_row is None else 1.0 if as_row == row["label"] else 0.0 if as_row == "A=B" else -1.0
        better = 0 if row["label"] == "A>B" else 1
        margin = None if expected is None else expected[better] - expected[1 - better]
        return {"order": order, "verdict": parsed.verdict, "reason": parsed.reason, "agrees": agrees,
                "expected": margin}

    def generate_fields(self, index: int, row: dict, outputs: list[dict]) -> dict[str, Any]:
        """The benchmark's fields (`pair_fields`) of the verdicts written."""
        return {"id": row.get("id"), **self.pair_fields(row, [o["verdict"] for o in outputs])}

    def generated_value(self, out: dict) -> float | None:
        """+1 the verdict (read back to the row's order) names the better response, -1 the other."""
        return out["agrees"]

    def generated_figures(self, records: list[dict]) -> dict[str, Any]:
        return self.figures(records, "generate")
