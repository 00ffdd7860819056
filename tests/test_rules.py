"""The rules that need no judge (judgetrain.eval.rules): each checked on worked rows, and on EvalBiasBench's own file
against the rule computed by hand there."""

from __future__ import annotations

import json

import pytest

from judgetrain.eval.benchmarks import get_suite
from judgetrain.eval.rules import NovelTokens, response_score, rule_records, rule_verdict, rules_for, words


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
    """Four pairs, the better response shorter in pairs 1-3 (pair 4: equal lengths, a tie, wrong by OffsetBias's rule).
    shorter: 3 of 4 right in both presentations -> pair_acc 0.75; longer: 0 of 4; first_shown: the first-shown
    response picked in both presentations, so each pair is right once of twice: single_acc 0.5, pair_acc 0,
    agreement 0."""
    suite = get_suite("evalbiasbench")
    rows = [_pair("ok", "a long wrong answer"), _pair("a much longer answer", "short", "B>A"),
            _pair("yes", "no, wrong"), _pair("abcd", "wxyz")]
    assert rules_for(suite) == ("shorter", "longer", "first_shown")
    shorter = suite.figures(rule_records(suite, rows, "shorter"), "implicit")
    longer = suite.figures(rule_records(suite, rows, "longer"), "implicit")
    first = suite.figures(rule_records(suite, rows, "first_shown"), "verdict")
    assert (shorter["pair_acc"], longer["pair_acc"]) == (0.75, 0.0)
    assert (first["single_acc"], first["pair_acc"], first["agreement"]) == (0.5, 0.0, 0.0)
    assert first["first_position_rate"] == 1.0
    items, _ = suite.items(rule_records(suite, rows, "shorter"), "implicit")
    assert list(items.values["pair_acc"]) == [1.0, 1.0, 1.0, 0.0]


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
