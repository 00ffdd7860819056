"""The overall_score parser shared by pair building and evaluation: formats, arithmetic, safety, range."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from judgetrain.data.scoreparse import (
    parse_overall_score,
    parse_overall_score_result,
    parse_scores,
    safe_arithmetic,
)

FULL = {
    "materials_appropriateness_score": 4.0,
    "equipment_appropriateness_score": 3.5,
    "procedure_completeness_score": 4.5,
    "procedure_feasibility_score": 4.0,
    "characterization_appropriateness_score": 3.0,
    "overall_score": 4.0,
}


def _evaluation(block: str, tag: str = "json") -> str:
    return f"The recipe uses Li2CO3 and a tube furnace at 850 C.\nStep by step: fine.\n\n```{tag}\n{block}\n```\n"


def test_reads_json_fenced_block():
    assert parse_overall_score(_evaluation(json.dumps(FULL))) == 4.0


def test_reads_untagged_fenced_block():
    assert parse_overall_score(_evaluation('{"overall_score": 3.5}', tag="")) == 3.5


def test_reads_bare_object_in_prose():
    text = 'My verdict follows. {"materials_appropriateness_score": 2, "overall_score": 2.5} Thank you.'
    result = parse_overall_score_result(text)
    assert (result.score, result.source) == (2.5, "bare")


def test_json_fence_wins_over_untagged_fence_and_bare_object():
    text = '{"overall_score": 1.0}\n```\n{"overall_score": 2.0}\n```\n```json\n{"overall_score": 3.0}\n```'
    assert parse_overall_score(text) == 3.0


def test_last_block_wins_when_the_judge_restates_its_score():
    text = _evaluation('{"overall_score": 2.0}') + "On reflection:\n" + _evaluation('{"overall_score": 4.5}')
    assert parse_overall_score(text) == 4.5
    bare = 'draft {"overall_score": 1.5} final {"overall_score": 3.5}'
    assert parse_overall_score(bare) == 3.5


def test_fenced_block_without_the_key_falls_through_to_a_bare_object():
    text = '```json\n{"note": "none"}\n```\nFinal: {"overall_score": 4}'
    assert parse_overall_score(text) == 4.0


@pytest.mark.parametrize(
    "value, expected",
    [
        ("(4+3.5)/2", 3.75),
        ("4.5 - 0.5", 4.0),
        ('"4.5"', 4.5),
        ('"(4 + 4 + 3.5) / 3"', 3.833333),
        ("(4+4+3.5+4+3)/5 = 3.7", 3.7),
        ("-(-3)", 3.0),
        ("2 * 2", 4.0),
        ("3", 3.0),
    ],
)
def test_arithmetic_and_numeric_strings_are_evaluated(value, expected):
    block = '{\n  "materials_appropriateness_score": 4,\n  "overall_score": ' + value + "\n}"
    assert parse_overall_score(_evaluation(block)) == pytest.approx(expected)


def test_arithmetic_result_has_no_float_noise():
    assert safe_arithmetic("0.1 + 0.2") == 0.3


@pytest.mark.parametrize("score", [0.0, 0.4, 5.6, 10.0, -1.0])
def test_out_of_range_is_rejected_with_reason_and_value(score):
    result = parse_overall_score_result(_evaluation(json.dumps({"overall_score": score})))
    assert result.score is None
    assert result.reason == "out_of_range"
    assert result.value == score


@pytest.mark.parametrize("score", [0.5, 5.5])
def test_scale_bounds_are_inclusive(score):
    assert parse_overall_score(_evaluation(json.dumps({"overall_score": score}))) == score


def test_custom_scale_and_key():
    text = _evaluation('{"score": 8.5}')
    assert parse_overall_score(text, key="score", lo=1, hi=10) == 8.5
    assert parse_overall_score_result(text, key="score").reason == "out_of_range"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "The recipe is good. Overall I would give it four.",
        _evaluation('{"overall_score": "four"}'),
        _evaluation('{"overall_score": null}'),
        _evaluation('{"overall_score": true}'),
        _evaluation('{"overall_score": 1/0}'),
        _evaluation('{"overall_score": NaN}'),
        _evaluation('{"overall_score": '),
        _evaluation("{\"overall_score\": __import__('os').system('echo pwned')}"),
    ],
)
def test_unreadable_scores_are_unparseable(text):
    result = parse_overall_score_result(text)
    assert result.score is None
    assert result.reason == "unparseable"


def test_non_string_input_is_unparseable():
    assert parse_overall_score_result(None).reason == "unparseable"
    assert parse_overall_score(12) is None


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "open('/etc/passwd').read()",
        "2**1000000",
        "9" * 500,
        "(1).__class__",
        "[1, 2]",
        "lambda: 3",
        "1e999",
        "4.5.5",
        "",
    ],
)
def test_safe_arithmetic_refuses_everything_but_arithmetic(expr):
    assert safe_arithmetic(expr) is None


def test_parse_scores_returns_every_criterion_of_the_block():
    text = _evaluation(
        '{"materials_appropriateness_score": 4, "equipment_appropriateness_score": "3.5",\n'
        ' "procedure_completeness_score": (4+5)/2, "comment": "ok", "overall_score": 4.0}'
    )
    assert parse_scores(text) == {
        "materials_appropriateness_score": 4.0,
        "equipment_appropriateness_score": 3.5,
        "procedure_completeness_score": 4.5,
        "overall_score": 4.0,
    }
    assert parse_overall_score_result(text).scores["procedure_completeness_score"] == 4.5


def test_parse_scores_without_overall_uses_last_numeric_block():
    assert parse_scores('```json\n{"a_score": 2}\n```') == {"a_score": 2.0}
    assert parse_scores("no scores at all") == {}


# ---- properties ----------------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises_on_arbitrary_text(text):
    result = parse_overall_score_result(text)
    assert result.reason in {"ok", "unparseable", "out_of_range"}
    assert (result.score is not None) == (result.reason == "ok")
    assert isinstance(parse_scores(text), dict)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('{}[]"`\n:,0123456789.+-*/() eEjsonoverall_score')), max_size=120))
def test_never_raises_on_json_like_noise(text):
    result = parse_overall_score_result(text)
    assert result.reason in {"ok", "unparseable", "out_of_range"}


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(
        [
            "__import__('os').system('touch /tmp/judgetrain_pwned')",
            "exec('x=1')",
            "globals()",
            "(lambda: 4)()",
            "().__class__.__bases__[0]",
            "open('x','w')",
        ]
    ),
    st.sampled_from(["json", ""]),
)
def test_never_evaluates_code(code, tag):
    text = _evaluation('{"overall_score": ' + code + "}", tag=tag)
    result = parse_overall_score_result(text)
    assert result.reason == "unparseable"
    assert result.score is None


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0.5, max_value=5.5, allow_nan=False))
def test_numbers_roundtrip_exactly(score):
    assert parse_overall_score(_evaluation(json.dumps({"overall_score": score}))) == score
    assert parse_overall_score(f'{{"overall_score": "{score!r}"}}') == score


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not 0.5 <= x <= 5.5))
def test_out_of_scale_numbers_are_never_accepted(score):
    result = parse_overall_score_result(_evaluation(json.dumps({"overall_score": score})))
    assert result.score is None
    assert result.reason in {"out_of_range", "unparseable"}


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=10).map(lambda k: k / 2),
    st.integers(min_value=1, max_value=10).map(lambda k: k / 2),
)
def test_mean_of_two_half_steps_is_evaluated(a, b):
    assert parse_overall_score(_evaluation(f'{{"overall_score": ({a}+{b})/2}}')) == pytest.approx((a + b) / 2)


# ---- hostile sizes and shapes: the parser reads in linear time and never raises ------------------------------
# (speed is measured by `judgetrain bench --only parser`, not asserted here: every family at the 200,000-character cap)

CAP = 200_000


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{" + "a" * CAP + "} overall_score", None),  # was quadratic in the key: value scan (21 s at 20,000 chars)
        ("{" + "a:" * (CAP // 2) + "overall_score}", None),
        ("{" * CAP + " overall_score", None),
        ('{"' * (CAP // 2) + " overall_score", None),
        ("```json\n\"overall_score\": " + "x" * CAP, None),
        ("```\n" * (CAP // 4) + '"overall_score"', None),
        ("reasoning " * (CAP // 10) + '```json\n{"overall_score": 4}\n```', 4.0),
        ("{'overall_score': " + "(" * 100 + "4" + ")" * 100 + ", " + "b" * CAP + "}", None),
    ],
    ids=["identifier-run", "colons", "open-braces", "open-quotes", "unclosed-fence", "empty-fences", "padded-real",
         "deep-parens"],
)
def test_inputs_at_the_200k_cap_give_their_result(text, expected):
    assert len(text) >= CAP
    assert parse_overall_score(text) == expected
    scores = parse_scores(text)
    assert scores.get("overall_score") == expected


def test_a_1200_deep_nested_json_object_is_read_not_raised():
    deep = '{"overall_score": 3, "detail": ' + '{"a": ' * 1200 + "1" + "}" * 1200 + "}"
    result = parse_overall_score_result("```json\n" + deep + "\n```")
    assert (result.score, result.reason) == (3.0, "ok")
    bare = parse_overall_score_result("Verdict: " + deep)
    assert bare.score == 3.0


def test_flattening_a_5000_deep_dict_does_not_recurse():
    # json.loads on Python 3.12 decodes objects deeper than the recursion limit; the flattening must not recurse
    from judgetrain.data.scoreparse import _flatten

    deep: dict = {"leaf": 1}
    for _ in range(5000):
        deep = {"a": deep}
    out: dict = {}
    _flatten({"overall_score": 2, "n": deep}, out)
    assert out == {"overall_score": 2, "leaf": 1}
