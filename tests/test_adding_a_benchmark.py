"""docs/evaluation.md, "Adding a benchmark", kept true: a suite defined here (one `Suite` subclass, its rows from a small
local file) is registered and runs through `judgetrain eval` (the tiny judge, with a baseline), `judgetrain compare`,
`judgetrain report` and the loop's round table, with no other file of judgetrain changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from judgetrain.config.suites import register, unregister
from judgetrain.eval.benchmarks import Suite
from judgetrain.eval.benchmarks.base import rubric_prompt
from judgetrain.eval.requests import Request, RowScore
from judgetrain.eval.stats import Items
from judgetrain.utils.errors import BadInputError

from helpers import tiny_judge_and_adapter

ROWS = Path(__file__).parent / "fixtures" / "toy_suite.jsonl"  # six questions, a right and a wrong answer each


class ToySuite(Suite):
    """A question, a right answer and a wrong one: the judge should score the right one higher."""

    name = "toysuite"
    title = "Toy questions"
    hub = "toy-questions"
    bundled = "six questions kept beside the test"
    unit = "a question"
    headline = ("accuracy",)

    def source(self, spec: Any) -> Any:
        return spec.source or ROWS

    def load(self, spec: Any, source: Any, **common: Any) -> list[dict]:
        rows = [json.loads(line) for line in Path(source).read_text(encoding="utf-8").splitlines() if line.strip()]
        for i, row in enumerate(rows, 1):
            for field in ("prompt", "chosen", "rejected"):
                if not isinstance(row.get(field), str):
                    raise BadInputError(f"{source} row {i}: {field!r} must be a string")
        return rows

    def request(self, row: dict, scoring: str) -> Request:
        if scoring == "judge":
            return Request("judge", judge_prompts=[rubric_prompt(row["prompt"], row[k]) for k in ("chosen", "rejected")])
        return Request("implicit", prompt=row["prompt"], responses=[row["chosen"], row["rejected"]])

    def row_fields(self, row: dict, score: RowScore, scoring: str) -> dict[str, Any]:
        s = score.scores
        return {"id": row["id"], "score_chosen": s[0] if s else None, "score_rejected": s[1] if s else None}

    def figures(self, records: list[dict], scoring: str) -> dict[str, Any]:
        return {"accuracy": float(np.mean([r["score_chosen"] > r["score_rejected"] for r in records]))}

    def items(self, records: list[dict], mode: str) -> tuple[Items | None, str | None]:
        right = np.asarray([float(r["score_chosen"] > r["score_rejected"]) for r in records])
        return Items([r["id"] for r in records], {"accuracy": right}, binary=("accuracy",)), None


@pytest.fixture
def toy_suite():
    register(ToySuite)
    yield ToySuite
    unregister(ToySuite.name)


@pytest.fixture
def judges(tmp_path):
    """The tiny judge and a LoRA adapter on it (random, not zero: its scores differ from the base's)."""
    return tiny_judge_and_adapter(tmp_path)


def test_a_suite_defined_outside_runs_through_eval_compare_report_and_the_round_table(tmp_path, toy_suite, judges):
    from judgetrain.cli.compare import main as compare_main
    from judgetrain.cli.eval import main as eval_main
    from judgetrain.cli.report import main as report_main
    from judgetrain.loop.table import write_round_table
    from judgetrain.report.rounds import round_table_figure

    base, adapter = judges
    out = tmp_path / "eval"
    assert eval_main(["--model", str(base), "--adapter", str(adapter), "--baseline", str(base),
                      "--eval_suites", "toysuite", "--eval_scoring", "judge", "--max-length", "384",
                      "--output-dir", str(out)]) == 0
    [trained] = [p for p in out.iterdir() if p.is_dir() and p.name != "baseline"]
    records = [json.loads(line) for line in (trained / "toysuite.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [f"toy-{i}" for i in range(6)]
    res = json.loads((trained / "results.json").read_text())
    right = np.mean([r["score_chosen"] > r["score_rejected"] for r in records])
    assert res["metrics"]["eval/toysuite/accuracy"] == pytest.approx(right)  # the suite's own figure, logged
    assert res["metrics"]["eval/toysuite/n_rows"] == 6
    assert "eval/toysuite/delta/accuracy" in res["metrics"]  # against the baseline, over the suite's units

    # A loop's folders: the base's evaluation as round 0, the adapter's as round 1, compared from their saved files
    loop = tmp_path / "loop"
    shutil.copytree(out / "baseline", loop / "round-0" / "eval" / "baseline")
    shutil.copytree(trained, loop / "round-1" / "eval" / trained.name)
    doc_path = loop / "round-1" / "eval" / "compare.json"
    assert compare_main([str(loop / "round-0" / "eval"), str(loop / "round-1" / "eval"),
                         "--output", str(doc_path)]) == 0
    doc = json.loads(doc_path.read_text())
    figure = doc["suites"]["toysuite"]["judge"]["accuracy"]
    assert figure["b"] == pytest.approx(right) and figure["n_units"] == 6

    write_round_table(loop, rounds=1)
    table = json.loads((loop / "rounds.json").read_text())
    assert {(r["round"], r["figure"]) for r in table["rows"]} >= {(0, "toysuite/accuracy"), (1, "toysuite/accuracy")}
    assert "toysuite/accuracy" in (loop / "rounds.md").read_text()

    assert report_main([str(loop), "--output-dir", str(tmp_path / "report")]) == 0
    assert "rounds.png" in (tmp_path / "report" / "report.md").read_text()
    drawn = round_table_figure([loop])  # the report's panels of the round table: one per figure
    assert "toysuite/accuracy (judge: expected_score)" in [ax.get_title() for ax in drawn.axes]  # its mode named


def test_a_name_that_is_no_suite_is_refused_with_the_registered_ones(toy_suite):
    from judgetrain.config.suites import check_suite_name
    from judgetrain.utils.errors import RecipeError

    check_suite_name("toysuite")
    with pytest.raises(RecipeError, match=r"unknown suite 'toysuit'; valid: rmbench, .*, toysuite"):
        check_suite_name("toysuit")
