"""Eval suites by name: the spec of one suite to evaluate (`SuiteSpec`: which rows, from where, how many) and the
functions the engine's callers use, each a thin call into the suite's class (`judgetrain.eval.benchmarks`: one module
per benchmark, where its rows, requests, records and figures are written).

| suite     | rows                         | implicit scoring                     | judge scoring                                   |
|-----------|------------------------------|--------------------------------------|-------------------------------------------------|
| rmbench   | RM-Bench prompts             | 6 responses (3 chosen, 3 rejected)   | rubric prompt per response -> expected score    |
| judgebias | JudgeBias validation split   | chosen and rejected evaluation       | the row's own judge prompt -> the judge's score |
| ideation  | Ideation test split          | chosen and rejected proposal         | pairwise rows: log p(verdict) of chosen vs      |
|           |                              |                                      | rejected; plain rows: rubric score per proposal |
| evalbiasbench, judgebench, pairwise | a prompt and two responses | each response alone: the higher | each response's rubric score: the higher wins |
|           |                              | reward wins (a tie is wrong)          | (a tie is wrong)                                 |

The likelihood readings (``loglik_sum``, ``loglik_mean``) score implicit scoring's responses by the judge's own
log-likelihood, summed or per token, with no reference: the suite's requests, records and figures are implicit mode's.

The pairwise suites also score in ``verdict`` mode (`judgetrain.eval.benchmarks.verdicts`). Generate mode (a sample
of the scored rows, ``generate_max_rows``): the judge writes its evaluation of the judge-mode prompts and the score
(or the verdict) is parsed from the text; each generation is set beside the judge-mode figure of the same response
for the agreement.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from judgetrain.config.recipe import LIKELIHOOD_MODES, suite_mode
from judgetrain.config.suites import known_suites
from judgetrain.data.pairwise import check_template
from judgetrain.eval.benchmarks import get_suite
from judgetrain.eval.benchmarks.base import RUBRIC_SYSTEM, rubric_prompt  # noqa: F401 (imported from here)
from judgetrain.eval.benchmarks.verdicts import VERDICTS, slug  # noqa: F401 (imported from here)
from judgetrain.eval.requests import Request, RowScore
from judgetrain.utils.errors import RecipeError

logger = logging.getLogger(__name__)

SUITES = known_suites()  # judgetrain's own suites (a suite registered later is known to `known_suites`)
PAIRWISE_SUITES = tuple(n for n in SUITES if get_suite(n).pairwise)  # a prompt, two responses: verdict mode


def pairwise_suites() -> tuple[str, ...]:
    """Every registered suite scored in verdict mode."""
    return tuple(n for n in known_suites() if get_suite(n).pairwise)


@dataclass
class SuiteSpec:
    """One suite to evaluate.

    name: a registered suite (`judgetrain.config.suites`). source: hub id, path, or None / "bundled" (the bundled
    sample). split: the suite's default when None. max_rows: cap, sampled evenly across the suite's groups
    (RM-Bench domains, JudgeBias perturbation types, ...), deterministic for ``seed``. mode: ideation data mode
    (implicit | pairwise). rows: the rows once loaded (`load_rows`; a datasets.Dataset or list of dicts given here
    is used instead of source).
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
        if self.name not in known_suites():
            raise ValueError(f"unknown eval suite {self.name!r}; valid: {', '.join(known_suites())}")

    @property
    def suite(self) -> Any:
        """The suite's class instance (`judgetrain.eval.benchmarks.get_suite`)."""
        return get_suite(self.name)

    @property
    def key(self) -> str:
        """Names the eval set (rows and their selection) in logs and caches."""
        columns = f":{sorted(self.columns.items())}" if self.columns else ""
        return (f"{self.name}:{self.source or 'bundled'}:{self.split or self.suite.default_split or ''}:"
                f"{self.max_rows}:{self.seed}:{self.mode}{columns}")

    def load_rows(self, *, on_bad_row: str = "error", rejects_path: str | None = None) -> list[dict]:
        """The suite's rows, read from the source once (bad rows refused, or with ``on_bad_row="skip"`` written to
        ``rejects_path`` and counted) and capped once: later calls (every checkpoint) get the same rows. Rows given
        to the spec are kept as they are."""
        if self.rows is None:
            self.rows = load_suite_rows(self, on_bad_row=on_bad_row, rejects_path=rejects_path)
            self.max_rows = None
        return self.rows


def suite_specs(eval_args: Any, *, seed: int = 0, ideation_mode: str = "implicit") -> list[SuiteSpec]:
    """The suites an `EvalArguments` names (a recipe's or `judgetrain eval`'s), with their sources, splits and cap."""
    prompt = eval_args.eval_pairwise_prompt
    if prompt is not None:
        try:
            check_template(prompt)
        except ValueError as err:
            raise RecipeError(f"eval_pairwise_prompt: {err}") from None
    specs = []
    for name in eval_args.eval_suites:
        suite = get_suite(name)
        specs.append(SuiteSpec(name, source=getattr(eval_args, f"eval_{name}_source", None),
                               split=getattr(eval_args, f"eval_{name}_split", None), max_rows=eval_args.eval_max_rows,
                               seed=seed, mode=ideation_mode if suite.takes_mode else "implicit",
                               generate_max_rows=eval_args.eval_generate_max_rows,
                               columns=getattr(eval_args, f"eval_{name}_columns", None),
                               prompt=prompt if suite.pairwise else None))
    return specs


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


def load_suite_dataset(spec: SuiteSpec, *, on_bad_row: str = "error", rejects_path: str | None = None):
    """The suite's rows from its source (the bundled sample for None / "bundled"), validated by its adapter
    (``on_bad_row``, ``rejects_path``), before any row cap."""
    suite = spec.suite
    return suite.load(spec, suite.source(spec), on_bad_row=on_bad_row, rejects_path=rejects_path)


def load_suite_rows(spec: SuiteSpec, **load: Any) -> list[dict]:
    """The suite's rows as dicts (after the row cap); ``load``: `load_suite_dataset`'s options."""
    rows = [dict(r) for r in (spec.rows if spec.rows is not None else load_suite_dataset(spec, **load))]
    return [rows[i] for i in select_rows(spec.name, rows, spec.max_rows, spec.seed)]


def select_rows(name: str, rows: list[dict], max_rows: int | None, seed: int = 0) -> list[int]:
    """Indices of at most ``max_rows`` rows, drawn evenly across the suite's groups (`Suite.select_rows`)."""
    return get_suite(name).select_rows(rows, max_rows, seed)


def applies(name: str, scoring: str) -> bool:
    """Whether a suite is scored in a mode: verdict mode is the pairwise suites'; every other mode, every suite's."""
    return get_suite(name).applies(scoring)


def verdict_suites(names: Sequence[str], scoring: Sequence[str]) -> list[str]:
    """The suites of ``names`` scored in verdict mode when ``scoring`` asks for it; the others are named in one
    INFO line (verdict mode shows two responses of a pair: RM-Bench, JudgeBias and Ideation's plain rows score
    each response alone)."""
    if "verdict" not in scoring:
        return []
    left_out = [n for n in names if not applies(n, "verdict")]
    if left_out:
        logger.info("verdict mode: %s not scored in it (not a pairwise suite: each response is scored alone in the "
                    "other modes asked for); pairwise suites: %s", ", ".join(left_out), ", ".join(pairwise_suites()))
    return [n for n in names if applies(n, "verdict")]


def build_requests(spec: SuiteSpec, row: dict, scoring: str) -> list[Request]:
    """What the engine scores for one row: one request, or in verdict mode one per order (as stored, swapped), each
    the verdict prompt with the two `VERDICTS` to compare. A likelihood reading (`LIKELIHOOD_MODES`) scores implicit
    mode's responses under its own kind."""
    return [_read_as(req, scoring) for req in spec.suite.requests(row, suite_mode(scoring), spec.prompt)]


def build_request(name: str, row: dict, scoring: str) -> Request:
    """What the engine scores for one row (verdict mode: `build_requests`)."""
    return _read_as(get_suite(name).request(row, suite_mode(scoring)), scoring)


def _read_as(request: Request, scoring: str) -> Request:
    """An implicit request scored under a likelihood reading takes the reading's kind (forced verdicts stay)."""
    if scoring in LIKELIHOOD_MODES and request.kind == "implicit":
        request.kind = scoring
    return request


def build_record(name: str, index: int, row: dict, score: RowScore, scoring: str, reading: str | None = None) -> dict:
    """The per-row record written to <output_dir>/eval/<step>/<suite>.jsonl (read back by `judgetrain report`);
    ``reading``: what its scores are (`judgetrain.config.recipe.READINGS`), written with them."""
    rec: dict[str, Any] = {"row_index": index, **get_suite(name).row_fields(row, score, suite_mode(scoring))}
    if reading is not None:
        rec["reading"] = reading
    for flag in ("truncated", "skipped", "no_reference"):
        if getattr(score, flag):
            rec[flag] = True
    return rec


def suite_metrics(name: str, records: list[dict], scoring: str) -> dict[str, Any]:
    """Metrics of one suite from its records (skipped rows left out and counted)."""
    scored = [r for r in records if not r.get("skipped")]
    out = get_suite(name).figures(scored, suite_mode(scoring))
    out["n_rows"] = len(scored)
    out["n_skipped"] = len(records) - len(scored)
    out["n_truncated"] = sum(1 for r in records if r.get("truncated"))
    no_ref = sum(1 for r in records if r.get("no_reference"))
    if no_ref:  # rows the run's frozen reference does not know (eval data changed since the start): unscored
        out["n_no_reference"] = no_ref
    return out


def generate_prompts(name: str, row: dict, prompt: str | None = None) -> list[Any]:
    """The prompts the judge writes an answer to for one row in generate mode (RM-Bench: 6, JudgeBias: 1,
    Ideation: one per order; the pairwise suites: the verdict prompt as stored and swapped)."""
    return get_suite(name).generate_prompts(row, prompt)


def build_generate_record(name: str, index: int, row: dict, generated: list[Any], expected: RowScore) -> dict:
    """The per-row record of generate mode (``<suite>.generate.jsonl``, `Suite.generate_record`)."""
    return get_suite(name).generate_record(index, row, generated, expected)


def generate_metrics(name: str, records: list[dict]) -> dict[str, Any]:
    """Generate-mode metrics of one suite (`Suite.generate_figures`)."""
    return get_suite(name).generate_figures(records)
