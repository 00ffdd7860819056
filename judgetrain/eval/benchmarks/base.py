"""What every eval suite is: the `Suite` class a benchmark subclasses, one module each (`judgetrain.eval.benchmarks`).

A suite holds what judgetrain knows of its benchmark: where its rows come from and how they are read and drawn
(`load`, `group_key`, `select_rows`), what the engine scores for a row in each scoring mode (`request`, `requests`,
`generate_prompts`), the per-row record written to ``<suite>.jsonl`` (`row_fields`, `generate_record`), its figures
(`figures`, `generate_figures`), their logged keys (`log_figures`), its per-item figures for intervals and paired
differences (`items`) over its unit of independence (``unit``), its headline figures (``headline``) and what the
model card says of its data (``title``, ``hub``, ``bundled``). A figure's direction (higher, lower, closer to a value
is better) is read from its name (`judgetrain.config.directions`). Subclasses set the class attributes and
override what differs; `judgetrain.config.suites.register` files one under its ``name``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from judgetrain import data
from judgetrain.data.sampling import balanced_sample
from judgetrain.data.scoreparse import parse_overall_score_result
from judgetrain.eval.requests import Request, RowScore
from judgetrain.eval.stats import Items, mean_of, spearman
from judgetrain.utils.errors import RecipeError


RUBRIC_SYSTEM = (
    "You are an impartial judge. Read the user's request and the assistant's response, then rate the response "
    "on a 1 to 5 scale (5 = correct, helpful, safe and complete; 1 = wrong, unhelpful or harmful). Reply with a "
    'JSON object {"overall_score": <score>} in a ```json block.'
)
BUNDLED = (None, "", "bundled")  # a source that names the bundled sample


def text_of(message: Any) -> str:
    """A prompt or response as plain text (a chat's contents joined by newlines)."""
    if isinstance(message, str):
        return message
    return "\n".join(m["content"] for m in message)


def rubric_prompt(prompt: Any, response: Any) -> list[dict]:
    """A judge prompt for a response that comes without its own rubric (RM-Bench, plain Ideation rows)."""
    user = f"[User request]\n{text_of(prompt)}\n\n[Assistant response]\n{text_of(response)}"
    return [{"role": "system", "content": RUBRIC_SYSTEM}, {"role": "user", "content": user}]


def mean_sd(values: Iterable[Any]) -> tuple[float, float] | None:
    """(mean, standard deviation) of the finite values; None without any."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
        return None
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def finite_number(value: Any) -> bool:
    """A number that may be logged: finite (NaN is a figure nothing measured, left out of the log), and not a bool."""
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool) \
        and math.isfinite(value)


def generation_summary(outputs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What the judge wrote, over all its generations: ``n_generated``, ``parse_rate`` (share whose score or verdict
    was read), ``parse_fail`` ({reason: count} of the rest, the parser's ``reason``), ``tokens_generated`` (total) and
    ``mean_tokens``, ``stopped_rate`` (ended on the end of turn rather than at max_new_tokens) and
    ``n_truncated_prompts`` (prompts cut from the left to fit). Each output holds ``reason``, ``n_tokens``,
    ``stopped`` and ``truncated``."""
    outputs = list(outputs)
    fails: dict[str, int] = defaultdict(int)
    for o in outputs:
        if o["reason"] != "ok":
            fails[str(o["reason"])] += 1
    n = len(outputs)
    tokens = int(sum(int(o["n_tokens"]) for o in outputs))
    return {
        "n_generated": n,
        "parse_rate": (n - sum(fails.values())) / n if n else math.nan,
        "parse_fail": dict(sorted(fails.items())),
        "tokens_generated": tokens,
        "mean_tokens": tokens / n if n else math.nan,
        "stopped_rate": mean_of([bool(o["stopped"]) for o in outputs]),
        "n_truncated_prompts": int(sum(bool(o.get("truncated")) for o in outputs)),
    }




class Suite:
    """One benchmark (see the module's docstring). A stateless object: `judgetrain.eval.benchmarks.get_suite` gives
    the registered class's instance."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""  # the model card: the benchmark's name
    hub: ClassVar[str] = ""  # the model card: the dataset it comes from
    bundled: ClassVar[str | None] = None  # the model card: what its bundled sample is (None: there is none)
    train_hub: ClassVar[str | None] = None  # the model card: the hub dataset of the same schema's training rows
    default_split: ClassVar[str | None] = None
    pairwise: ClassVar[bool] = False  # a prompt and two responses: scored in verdict mode too
    takes_mode: ClassVar[bool] = False  # its rows come in data modes (``SuiteSpec.mode``: implicit | pairwise)
    unit: ClassVar[str] = "a row"  # the unit of independence: one bootstrap draw, one count of the paired test
    headline: ClassVar[tuple[str, ...]] = ()  # the figures printed first (compare, the guard, the report)
    example_figure: ClassVar[str] = "accuracy"  # a figure named in messages (metric_for_best_model)
    generate_table: ClassVar[tuple[str, ...]] = ()  # the report's table of figures beside what the judge writes
    bare_figures: ClassVar[tuple[str, ...]] = ()  # the top-level keys `log_figures` names itself
    matrices: ClassVar[bool] = False  # the report draws its 3x3 style matrices (`style_matrices`)
    curves: ClassVar[bool] = False  # the report draws its figures' curves in panels of their own
    # the figures the report and the model card open with: (key under ``eval/<suite>/``, label); those of generate
    # mode (``generate/...``) follow every suite's others
    report_headline: ClassVar[tuple[tuple[str, str], ...]] = ()
    best_by: ClassVar[str | None] = None  # the figure a run's best evaluation is chosen by when the recipe names none
    # its place in the headline table, which also orders the fallback figures the best evaluation is chosen by
    headline_place: ClassVar[int] = 100

    # ------------------------------------------------------------------------------------------------ rows
    def source(self, spec: Any) -> Any:
        """Where the rows come from: the spec's source, or the bundled sample (RecipeError for a suite that has
        none)."""
        if spec.source not in BUNDLED:
            return spec.source
        if self.bundled is None:
            raise RecipeError(f"eval suite {self.name}: no bundled copy; set eval_{self.name}_source (a file, folder "
                              "or hub id)")
        return data.sample_source(self.name)

    def load(self, spec: Any, source: Any, **common: Any) -> Any:
        """The rows of ``source``, validated (``on_bad_row``, ``rejects_path`` in ``common``)."""
        raise NotImplementedError

    def group_key(self, row: dict) -> Hashable:
        """The group a row is drawn evenly across by the row cap (None: one group)."""
        return None

    def select_rows(self, rows: list[dict], max_rows: int | None, seed: int = 0) -> list[int]:
        """Indices of at most ``max_rows`` rows, drawn evenly across `group_key`, deterministic for ``seed``."""
        return balanced_sample([self.group_key(r) for r in rows], max_rows, seed)

    # -------------------------------------------------------------------------------------------- requests
    def applies(self, scoring: str) -> bool:
        """Whether the suite is scored in a mode: verdict mode is the pairwise suites'."""
        return scoring != "verdict" or self.pairwise

    def request(self, row: dict, scoring: str) -> Request:
        """What the engine scores for one row in implicit or judge mode."""
        raise NotImplementedError

    def requests(self, row: dict, scoring: str, prompt: str | None = None) -> list[Request]:
        """What the engine scores for one row in a mode (``prompt``: the verdict prompt's user template)."""
        return [self.request(row, scoring)]

    def row_fields(self, row: dict, score: RowScore, scoring: str) -> dict[str, Any]:
        """The row's identity and scores in its record (``row_index`` and the engine's flags are added)."""
        raise NotImplementedError

    def rule_texts(self, row: dict) -> list[Any] | None:
        """The responses the rules that need no judge read for one row (`judgetrain.eval.rules`), in the order of its
        implicit request's scores; None where the row holds no response to read alone."""
        return list(self.request(row, "implicit").responses)

    def figures(self, records: list[dict], scoring: str) -> dict[str, Any]:
        """The suite's figures from its scored records (skipped ones already left out)."""
        raise NotImplementedError

    # --------------------------------------------------------------------------------------- generate mode
    def generate_prompts(self, row: dict, prompt: str | None = None) -> list[Any]:
        """The prompts the judge writes an answer to for one row: its judge-mode prompts."""
        return list(self.request(row, "judge").judge_prompts)

    def generate_fields(self, index: int, row: dict, outputs: list[dict]) -> dict[str, Any]:
        """The row's identity in its generate record (``outputs``: what was read of each generation)."""
        return {}

    def generate_output(self, row: dict, slot: int, generated: Any, expected: list | None) -> dict[str, Any]:
        """What was read of one generation (the parsed score) and the judge-mode figure it is set beside."""
        parsed = parse_overall_score_result(generated.text)
        return {"score": parsed.score, "reason": parsed.reason, "expected": None if expected is None else expected[slot]}

    def generate_record(self, index: int, row: dict, generated: list[Any], expected: RowScore) -> dict[str, Any]:
        """The per-row record of generate mode (``<suite>.generate.jsonl``): the row's identity and one output per
        prompt (text, ``n_tokens``, ``prompt_tokens``, ``stopped``, ``truncated``, what was parsed, ``expected``)."""
        outputs = [{"text": g.text, "n_tokens": g.n_tokens, "prompt_tokens": g.prompt_tokens, "stopped": g.stopped,
                    "truncated": g.truncated, **self.generate_output(row, slot, g, expected.scores)}
                   for slot, g in enumerate(generated)]
        rec: dict[str, Any] = {"row_index": index, **self.generate_fields(index, row, outputs), "outputs": outputs}
        if expected.skipped:
            rec["judge_skipped"] = True
        return rec

    def generated_value(self, out: dict) -> float | None:
        """The number set beside the judge-mode figure for the agreement: the parsed score."""
        return out["score"]

    def generated_figures(self, records: list[dict]) -> dict[str, Any]:
        """The suite's figures from what the judge wrote."""
        raise NotImplementedError

    def generate_figures(self, records: list[dict]) -> dict[str, Any]:
        """Generate-mode figures: the suite's (`generated_figures`), what was written (`generation_summary`) and
        ``agreement``: Spearman between the generated value and the judge-mode figure."""
        outputs = [o for r in records for o in r["outputs"]]
        out = self.generated_figures(records)
        out.update(generation_summary(outputs))
        out["agreement"] = spearman([self.generated_value(o) for o in outputs], [o["expected"] for o in outputs])
        out["n_rows"] = len(records)
        return out

    # ------------------------------------------------------------------------------------------ logs, items
    def log_figures(self, results: Mapping[str, Any], base: str) -> dict[str, float]:
        """The logged keys of the suite's own figures (``base``: ``eval/<suite>/``); the engine's counters are added
        by `judgetrain.eval.logkeys.flatten_eval_metrics`. By default one level of numbers."""
        return {base + k: float(v) for k, v in results.items() if finite_number(v)}

    def items(self, records: list[dict], mode: str) -> tuple[Items | None, str | None]:
        """(the per-item figures of the records in a mode, None) or (None, why they cannot be compared)."""
        return None, "a suite compare does not know"

    def row_key(self, row: Mapping[str, Any]) -> Any:
        """A per-row record's identity, to drop rows written twice: the row index (None: keep every row)."""
        return ("row_index", row["row_index"]) if row.get("row_index") is not None else None

    # ----------------------------------------------------------------------------------- what reports show
    def style_matrices(self, records: list[dict]) -> dict[str, Any]:
        """{"overall" | <group>: 3x3 accuracy of chosen style (rows) against rejected style (columns)} of the
        records, for the suites that declare ``matrices``; {} for the others."""
        return {}

    def curve_plots(self, keys: list[str], rows: list[dict]) -> list[CurvePlot]:
        """The report's figures of the suite's curves over eval points (for the suites that declare ``curves``):
        ``keys``: the logged figures of every run drawn (bare mode, in reading order); ``rows``: the suite's
        per-row records of those runs."""
        return []

    def judge_scores(self, records: list[dict]) -> dict[str, list[float]]:
        """The judge-mode scores of the suite's items in its records: ``{"all": [...], <group>: [...]}``; {} for a
        suite whose scores are not read for their spread (`judgetrain.report.spread`)."""
        return {}

    def flat_judge_line(self, spreads: str, scores: dict[str, list[float]]) -> str:
        """What moves the suite's figures when the judge scores every item nearly alike (``spreads``: the scores'
        mean and standard deviation at the base and at the step, in words; ``scores``: `judge_scores` at the step)."""
        return (f"{self.title} in judge mode: the judge gives every item nearly one score ({spreads}): its figures "
                "move with that one score, not with what the judge reads.")

    def table(self, results: Mapping[str, Any]) -> FigureTable | None:
        """The terminal's table of the suite's own figures (`judgetrain eval`), None for a plain list of figures."""
        return None

    def trained_mode(self, components: Iterable[Mapping[str, Any]]) -> str | None:
        """The data mode the suite is scored in when the judge is trained on rows of its schema (``takes_mode``): the
        ``mode`` of such a component of ``train_datasets``; None for none."""
        return None


@dataclass
class CurvePlot:
    """One figure of a suite's curves in the report: its file, caption and title, and its panels: (panel title,
    [(series label, logged key)]); a key ending in ``/style_gap`` is the easy - hard gap of the figures under its
    prefix. The report draws it (matplotlib stays out of the suites)."""

    file: str
    caption: str
    title: str
    panels: list[tuple[str, list[tuple[str, str]]]]
    unit: str | None = None
    zero_line: bool = False


@dataclass
class FigureTable:
    """A suite's figures as a table: one row per group, then its total row (shown bold); ``notes``: lines after it.
    Its bare figures (``eval/<suite>/<figure>``) are in it, so the list of other figures leaves them out."""

    title: str
    columns: tuple[str, ...]
    rows: list[list[str]]
    total: list[str]
    notes: list[str] = field(default_factory=list)


def nan_or(value: Any) -> float:
    """A value as a float, NaN for None."""
    return math.nan if value is None else float(value)
