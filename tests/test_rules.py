"""The rules that need no judge (judgetrain.eval.rules): each checked on worked rows, and on EvalBiasBench's own file
against the rule computed by hand there."""

from __future__ import annotations

import json

import pytest

from judgetrain.eval.benchmarks import get_suite
from judgetrain.eval.requests import RowScore
from judgetrain.eval.rules import (NovelTokens, response_score, rule_records, rule_verdict, rules_for, verdict_words,
                                   words)


def _pair(a: str, b: str, label: str = "A>B", **more) -> dict:
    return {"id": more.pop("id", f"{a[:8]}|{b[:8]}"), "prompt": "Which recipe?",
            "response_a": a, "response_b": b, "label": label, "category": "c", **more}


def test_words_keep_numbers_whole_and_case():
    assert words("Heat to 850.5 °C, then Cool.") == ["Heat", "to", "850.5", "°", "C", ",", "then", "Cool", "."]


def test_novel_token_rule_fitted_on_training_items_marks_a_word_no_source_holds():
    """Training: two sources and their error copies; "beaker" and "2257" appear in copies only. A held-out pair whose
    copy says "beaker" is caught; one whose copy holds only words the sources use is a tie; a source that itself holds
    a marked word ties with its copy."""
    novel = NovelTokens.fit(["Heat the powder in a crucible at 850 °C.", "Grind in a mortar for 12 h."],
                            ["Heat the powder in a beaker at 850 °C.", "Grind in a mortar for 2257 h."])
    assert novel.marks == frozenset({"beaker", "2257"})
    assert rule_verdict("novel_token", "Dry in a crucible.", "Dry in a beaker.", novel) == "A>B"
    assert rule_verdict("novel_token", "Dry at 850 °C.", "Dry at 12 °C.", novel) == "A=B"
    assert rule_verdict("novel_token", "A beaker.", "A beaker, 2257.", novel) == "A=B"
    with pytest.raises(ValueError, match="fitted on training items"):
        response_score("novel_token", "text")


def test_length_and_first_shown_rules_read_through_the_suites_own_rule():
    """Four pairs, the better response shorter in pairs 1, 3 and 4, longer in pair 2. shorter: 3 of 4 right in both
    presentations -> pair_acc 0.75; longer: 1 of 4; first_shown: the first-shown response picked in both
    presentations, so each pair is right once of twice: single_acc 0.5, pair_acc 0, agreement 0."""
    suite = get_suite("evalbiasbench")
    rows = [_pair("ok", "a long wrong answer"), _pair("short", "a much longer answer", "B>A"),
            _pair("yes", "no, wrong"), _pair("abcd", "wxyz!")]
    assert rules_for(suite) == ("shorter", "longer", "first_shown")
    shorter = suite.figures(rule_records(suite, rows, "shorter"), "implicit")
    longer = suite.figures(rule_records(suite, rows, "longer"), "implicit")
    first = suite.figures(rule_records(suite, rows, "first_shown"), "verdict")
    assert (shorter["pair_acc"], longer["pair_acc"]) == (0.75, 0.25)
    assert (first["single_acc"], first["pair_acc"], first["agreement"]) == (0.5, 0.0, 0.0)
    assert first["first_position_rate"] == 1.0
    items, _ = suite.items(rule_records(suite, rows, "shorter"), "implicit")
    assert list(items.values["pair_acc"]) == [1.0, 0.0, 1.0, 1.0]


def test_a_rule_that_cannot_tell_two_responses_apart_scores_chance_not_zero():
    """400 pairs of equal length, each labelled A>B: the shorter and longer rules abstain on every pair, and a seeded
    coin breaks each tie as a guessing judge would: pair_acc near 0.5 (the coin's 400 draws: within 0.43-0.57), the
    same figure twice and for both length rules (one coin per row). Counted as the suite counts a judge's tie, the
    rule would score 0 and any judge would "beat" it by breaking ties alone. The novel-token rule with no marked word
    either side does the same."""
    suite = get_suite("evalbiasbench")
    rows = [_pair(f"answer {i:03d}", f"answer {i + 500:03d}", id=f"p{i}") for i in range(400)]
    figures = [suite.figures(rule_records(suite, rows, rule), "implicit")["pair_acc"] for rule in ("shorter", "longer")]
    assert 0.43 < figures[0] < 0.57 and figures[0] == figures[1]
    assert suite.figures(rule_records(suite, rows, "shorter"), "implicit")["pair_acc"] == figures[0]
    novel = suite.figures(rule_records(suite, rows, "novel_token", NovelTokens(frozenset({"beaker"}))), "implicit")
    assert novel["pair_acc"] == figures[0]


def test_shorter_rule_on_evalbiasbench_equals_the_rule_by_hand_on_the_authors_file(shared_dir):
    """The authors' 80 pairs: "the shorter response wins" by characters, counted by hand from biasbench.json, equals
    the suite's pair_acc of the rule's records (59 of 80; length_bias 17 of 17)."""
    from judgetrain.data.pairwise import load_evalbiasbench

    path = shared_dir / "data" / "evalbiasbench" / "biasbench.json"
    raw = json.loads(path.read_text())
    raw = [r for rows in raw.values() for r in rows] if isinstance(raw, dict) else raw
    by_hand = {}
    for r in raw:
        a, b, label = str(r["response1"]), str(r["response2"]), int(r["label"])
        by_hand.setdefault(r["bias"], []).append(len(a) != len(b) and (len(a) < len(b)) == (label == 1))
    suite = get_suite("evalbiasbench")
    rows = [dict(r) for r in load_evalbiasbench(path)]
    figures = suite.figures(rule_records(suite, rows, "shorter"), "implicit")
    assert len(rows) == 80
    assert figures["pair_acc"] == pytest.approx(sum(sum(v) for v in by_hand.values()) / 80)
    assert round(figures["pair_acc"] * 80) == 59
    assert figures["length_bias"]["pair_acc"] == 1.0 and figures["length_bias"]["n"] == 17


def _by_hand(shared_dir) -> dict[str, list[bool]]:
    """The authors' 80 pairs, each rule's pick counted by hand on biasbench.json (characters; equal lengths: no
    pick, wrong by OffsetBias's rule): {rule: right per pair}."""
    raw = json.loads((shared_dir / "data" / "evalbiasbench" / "biasbench.json").read_text())
    raw = [r for rows in raw.values() for r in rows] if isinstance(raw, dict) else raw
    out: dict[str, list[bool]] = {"shorter": [], "longer": []}
    for r in raw:
        a, b, better_a = len(str(r["response1"])), len(str(r["response2"])), int(r["label"]) == 1
        out["shorter"].append(a != b and (a < b) == better_a)
        out["longer"].append(a != b and (a > b) == better_a)
    return out


def test_judgetrain_eval_prints_the_rules_beside_the_judge_equal_to_the_rule_by_hand(shared_dir, tiny_judge, tmp_path,
                                                                                   capsys):
    """`judgetrain eval` on EvalBiasBench's own file (the tiny judge, implicit mode): results.json holds each rule's
    figures under eval/evalbiasbench/rule/<rule>/..., equal to the rules counted by hand on the authors' file (shorter
    59 of 80, longer the pairs of unequal lengths the other way; first-shown: one presentation of two right, so
    single_acc 0.5 and pair_acc 0), each with its interval; the printed table sets them beside the judge with a
    verdict per figure, and the judge's difference from the best rule is logged."""
    from judgetrain.cli import main

    path = shared_dir / "data" / "evalbiasbench" / "biasbench.json"
    out = tmp_path / "eval"
    assert main(["eval", "--model", "tiny-judge", "--eval_suites", "evalbiasbench", "--eval_evalbiasbench_source",
                 str(path), "--eval_scoring", "implicit", "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    (results_path,) = out.glob("*/results.json")
    results = json.loads(results_path.read_text())
    metrics = results["metrics"]
    hand = _by_hand(shared_dir)
    assert sum(hand["shorter"]) == 59 and sum(hand["longer"]) == 21
    assert metrics["eval/evalbiasbench/rule/shorter/pair_acc"] == pytest.approx(59 / 80)
    assert metrics["eval/evalbiasbench/rule/longer/pair_acc"] == pytest.approx(sum(hand["longer"]) / 80)
    assert metrics["eval/evalbiasbench/rule/first_shown/single_acc"] == 0.5
    assert metrics["eval/evalbiasbench/rule/first_shown/pair_acc"] == 0.0
    assert metrics["eval/evalbiasbench/rule/shorter/length_bias/pair_acc"] == 1.0
    low, high = (metrics[f"eval/evalbiasbench/rule/shorter/pair_acc/{b}"] for b in ("ci_low", "ci_high"))
    assert low < 59 / 80 < high
    assert "eval/evalbiasbench/rule/novel_token/pair_acc" not in metrics  # no training pairs given
    verdict = results["rules"]["evalbiasbench"]["learned"]["implicit"]["pair_acc"]
    assert verdict["rule"] == "shorter" and verdict["rule_value"] == pytest.approx(59 / 80)
    judge = metrics["eval/evalbiasbench/pair_acc"]
    assert verdict["delta"] == pytest.approx(judge - 59 / 80)
    assert metrics["eval/evalbiasbench/over_rule/pair_acc"] == pytest.approx(judge - 59 / 80)
    assert verdict["learned"] == (verdict["delta_ci_low"] > 0)
    assert "The judge beside the rules that need no judge" in printed
    row = next(line for line in printed.splitlines() if "│ evalbiasbench/pair_acc " in line)
    assert "0.738 [" in row and f"{sum(hand['longer']) / 80:.3f} [" in row and "0.000" in row
    assert "best rule (shorter)" in row


def test_the_novel_token_rule_fitted_on_a_training_pairs_file_and_a_bad_file_refused(tiny_judge, tmp_path, capsys):
    """`--rules_train_pairs`: response pairs (chosen the source, rejected its error copy) fit the novel-token rule,
    whose figures on a team's pairs equal the rule applied by hand; a file of verdict pairs, or a row without its
    rejected response, is refused naming the file and row, exit 2, before any evaluation is written."""
    from judgetrain.cli import main

    def pair(chosen: str, rejected: str) -> dict:
        return {"prompt": [{"role": "user", "content": "Recipe?"}], "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}]}

    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(json.dumps(pair(a, b)) for a, b in [
        ("Heat in a crucible at 850 C.", "Heat in a beaker at 850 C."),
        ("Grind in a mortar for 12 h.", "Grind in a mortar for 2257 h.")]) + "\n")
    held = tmp_path / "held.jsonl"
    held.write_text("\n".join(json.dumps(r) for r in [
        _pair("Dry in a crucible.", "Dry in a beaker.", id="1"),  # caught
        _pair("Mix for 2257 h.", "Mix for 12 h.", "B>A", id="2"),  # caught: the copy is B
        _pair("Dry in a beaker at 850 C.", "Dry at 12 C.", id="3")]) + "\n")  # the source marked: wrong
    out = tmp_path / "eval"
    assert main(["eval", "--model", "tiny-judge", "--eval_suites", "pairwise", "--eval_pairwise_source", str(held),
                 "--eval_scoring", "implicit", "--rules_train_pairs", str(train), "--output_dir", str(out)]) == 0
    (results_path,) = out.glob("*/results.json")
    metrics = json.loads(results_path.read_text())["metrics"]
    assert metrics["eval/pairwise/rule/novel_token/accuracy"] == pytest.approx(2 / 3)
    assert "novel_token" in capsys.readouterr().out

    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(json.dumps(pair("[[A>B]]", "[[B>A]]")) + "\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(pair("a", "b")) + "\n" + json.dumps({"prompt": "x", "chosen": "y"}) + "\n")
    for bad, says in ((verdicts, "row 0, field 'chosen': a verdict, not a response"), (broken, "row 1")):
        out = tmp_path / f"eval-{bad.stem}"
        assert main(["eval", "--model", "tiny-judge", "--eval_suites", "pairwise", "--eval_pairwise_source",
                     str(held), "--rules_train_pairs", str(bad), "--output_dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert "--rules_train_pairs" in err and str(bad) in err and says in err
        assert not list(out.glob("*/results.json"))


def test_the_novel_token_rule_is_fitted_on_the_error_pairs_of_a_file_with_tie_rows(tmp_path):
    """A training file of `pairs known --form response --ties tie`: a rewrite against its source is a tie row, not an
    error copy, so its new words (a formula for a name) mark nothing; the error copy's do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from judgetrain.eval.rules import read_training_pairs

    def row(chosen: str, rejected: str, tie: bool) -> dict:
        return {"prompt": [{"role": "user", "content": "Recipe?"}], "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}], "tie": tie}

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([row("Heat in a crucible with iron oxide.", "Heat in a beaker with iron oxide.",
                                             False),
                                         row("Heat in a crucible with iron oxide.", "Heat in a crucible with Fe2O3.",
                                             True)]), path)
    novel = read_training_pairs(str(path))
    assert "beaker" in novel.marks and "Fe2O3" not in novel.marks
    assert novel.score("Dry the Fe2O3.") == 0.0 and novel.score("Dry in a beaker.") == -1.0


def test_a_judge_figure_is_learned_only_where_it_beats_the_best_rule_and_every_table_says_so():
    """24 pairs, the better response the shorter one in 12 (shorter: 0.5, longer: 0.5, first-shown: pair_acc 0). A
    judge right on all 24 beats the best rule by +0.5, its interval above 0: learned; a judge whose scores are the
    shorter rule's is not above it (+0 [0, 0]). The verdict reaches the logged keys, read back by `flat_verdict` into
    the headline table of the report and the card, results.json's `rules`, and the loop's round table and its
    markdown."""
    from judgetrain.eval.evidence import suite_evidence
    from judgetrain.eval.rules import flat_verdict, learned, rule_figures
    from judgetrain.eval.runner import SuiteResult, rules_summary, set_rules
    from judgetrain.eval.suites import SuiteSpec, suite_metrics
    from judgetrain.loop.table import figure_rows, markdown

    suite = get_suite("evalbiasbench")
    rows = [_pair("ok" if i % 2 else "a long right answer", "a much longer wrong answer" if i % 2 else "no",
                  id=str(i)) for i in range(24)]
    figures = rule_figures(suite, rows)
    assert [figures[r].metrics["pair_acc"] for r in ("shorter", "longer", "first_shown")] == [0.5, 0.5, 0.0]
    assert rule_figures(suite, [dict(r) for r in rows]) is figures  # the same rows: computed once

    def judge(scores_of):
        records = [{"row_index": i, **suite.row_fields(r, RowScore(scores_of(r)), "implicit")}
                   for i, r in enumerate(rows)]
        items, intervals = suite_evidence("evalbiasbench", "implicit", records)
        return SuiteResult("evalbiasbench", suite_metrics("evalbiasbench", records, "implicit"), records, items=items,
                           intervals=intervals)

    right = judge(lambda r: [1.0, 0.0])  # the label is A>B in every pair
    set_rules(right, SuiteSpec("evalbiasbench", rows=rows), rows, None)
    v = right.learned["pair_acc"]
    assert v["rule"] == "shorter" and v["rule_value"] == 0.5 and v["delta"] == 0.5 and v["learned"]
    assert 0 < v["delta_ci_low"] <= 0.5 <= v["delta_ci_high"]
    assert verdict_words(v).startswith("beats the best rule (shorter) by +0.500 [")
    same = learned(judge(lambda r: [-len(r["response_a"]), -len(r["response_b"])]).items, figures)["pair_acc"]
    assert (same["delta"], same["delta_ci_low"], same["delta_ci_high"], same["learned"]) == (0.0, 0.0, 0.0, False)
    assert verdict_words(same) == "not above the best rule (shorter): +0.000 [0.000, 0.000]"

    flat = right.flat()
    assert flat["eval/evalbiasbench/rule/longer/pair_acc"] == 0.5
    assert flat["eval/evalbiasbench/over_rule/pair_acc"] == 0.5
    assert flat_verdict(flat, "eval/evalbiasbench/pair_acc") == {k: v[k] for k in (
        "rule", "rule_value", "delta", "delta_ci_low", "delta_ci_high", "learned")}
    from judgetrain.report.headline import headline, headline_table

    header, cells = headline_table(headline({10: {**flat, "step": 10}}))  # the report's and the card's headline
    assert header[-1] == "last eval beside the rules that need no judge"
    assert cells[0][0].startswith("EvalBiasBench pair accuracy") and cells[0][-1] == verdict_words(v)
    doc = {"scoring": "implicit", "intervals": {"evalbiasbench": {"implicit": right.intervals}},
           "rules": rules_summary({"evalbiasbench": right}, "implicit")}
    row = next(r for r in figure_rows(1, doc, None) if r["figure"] == "evalbiasbench/pair_acc")
    assert (row["best_rule"], row["over_rule"], row["learned"]) == ("shorter", 0.5, True)
    assert "| evalbiasbench/pair_acc (implicit: log_ratio) | 1.000 [1.000, 1.000]; beats the best rule (shorter) by +0.500 [" \
        in markdown(figure_rows(1, doc, None))
