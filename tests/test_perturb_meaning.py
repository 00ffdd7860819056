"""A represent item keeps the meaning of its source and an error item shows no tell: differences and tolerances
(a quantity the text calls a difference, change, rise, drop, gap or tolerance) convert as differences, format
rewrites leave code, setext headings, rules, wrapped sentences, years, standards and ports as they are, an edited
number keeps its notation, a bare number is edited only where the spec asks. Each worked case is a reproduction the
operators once got wrong, with what they wrote then caught by the checker (`judgetrain.perturb.oracle`, which reads
quantities and markup on its own); then a seeded property test over hostile texts for every represent operator, its
items checked by that checker."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_perturb_labels import HOSTILE, OPERATORS, RECIPE_LINES, readings_differ, run_op

REPRESENT = sorted(k for k, op in OPERATORS.items() if op["category"] == "represent")


def outputs(name: str, text: str, seeds: int = 16) -> tuple[set[str], set]:
    """The texts operator ``name`` writes over ``seeds`` seeds, and the reject reasons it gives."""
    made, why = set(), set()
    for seed in range(seeds):
        new, _, reason = run_op(name, text, seed)
        (why.add(reason) if reason else made.add(new))
    return made, why


# ------------------------------------------------------------------------------------------------ differences
@pytest.mark.parametrize("source, expected", [
    ("Keep within ±2 °C.", {"Keep within ±2 K.", "Keep within ±3.6 °F."}),
    ("Keep within +/- 2 °C.", {"Keep within +/- 2 K.", "Keep within +/- 3.6 °F."}),
    ("Heat at 25°C ±2°C.", {f"Heat at {a} {b}." for a in ("298.15K", "77°F") for b in ("±2K", "±3.6°F")}),
])
def test_a_tolerance_standing_alone_converts_as_a_difference(source, expected):
    made, why = outputs("convert", source, 40)
    assert made == expected and not why
    for text in made:
        assert readings_differ(source, text) == ([], [])


@pytest.mark.parametrize("source, expected", [
    ("The difference between the two baths was 15 K.",
     {"The difference between the two baths was 15 °C.", "The difference between the two baths was 27 °F."}),
    ("Allow a rise of 10 °C at most.", {"Allow a rise of 10 K at most.", "Allow a rise of 18 °F at most."}),
    ("Raise the temperature by 10 °C.", {"Raise the temperature by 10 K.", "Raise the temperature by 18 °F."}),
    ("The difference was 15 K.", {"The difference was 15 °C.", "The difference was 27 °F."}),
    ("The change in the bath's temperature over the run was 4 °C.",
     {"The change in the bath's temperature over the run was 4 K.",
      "The change in the bath's temperature over the run was 7.2 °F."}),
    ("The gap between the two zones of the furnace was 20 °C.",
     {"The gap between the two zones of the furnace was 20 K.", "The gap between the two zones of the furnace was 36 °F."}),
    ("The drop between the two zones was 50 °F.", {"The drop between the two zones was 27.8 °C.",
                                                   "The drop between the two zones was 27.8 K."}),
    ("Keep it within 2 °C of the set point.", {"Keep it within 2 K of the set point.",
                                                "Keep it within 3.6 °F of the set point."}),
    # a temperature: converted as one, with its offset (between two baths, then "and" just before a value)
    ("Heat the difference of the two baths to 80 °C.", {"Heat the difference of the two baths to 353.15 K.",
                                                         "Heat the difference of the two baths to 176 °F."}),
    ("Keep the bath at 15 K.", {"Keep the bath at -258.15 °C.", "Keep the bath at -432.67 °F."}),
    ("Hold between 20 and 30 °C.", {"Hold between 20 and 303.15 K.", "Hold between 20 and 86 °F."}),
])
def test_a_quantity_called_a_difference_converts_as_a_difference(source, expected):
    """The text calls it a difference, change, rise, drop, gap or tolerance: converted without the offset (15 K of
    difference is 15 °C, not -258.15 °C), and the checker reads both alike."""
    made, why = outputs("convert", source, 24)
    assert made == expected and not why
    for text in made:
        assert readings_differ(source, text) == ([], [])


def test_a_difference_and_a_value_of_one_sentence_convert_apart():
    made, _ = outputs("convert", "Heat by 10 °C to 80 °C.", 24)  # to 80 °C is a value, by 10 °C a difference
    assert made == {f"Heat by {a} to {b}." for a in ("10 K", "18 °F") for b in ("353.15 K", "176 °F")}


@pytest.mark.parametrize("source, wrong", [
    ("Keep within ±2 °C", "Keep within ±275.15 K"), ("Keep within ±2 °C", "Keep within ±35.6 °F"),
    ("+/- 2 °C", "+/- 275.15 K"), ("Heat at 25°C ±2°C.", "Heat at 298.15K ±275.15K."),
    ("Raise the temperature by 10 °C", "Raise the temperature by 283.15 K"),
    ("Raise the temperature by 10 °C", "Raise the temperature by 50 °F"),
    ("The difference was 15 K.", "The difference was -258.15 °C."),
    ("The difference between the two baths was 15 K.", "The difference between the two baths was -258.15 °C."),
    ("The difference between the two baths was 15 K.", "The difference between the two baths was -432.67 °F."),
])
def test_the_checker_catches_a_difference_converted_as_a_temperature(source, wrong):
    lost, new = readings_differ(source, wrong)
    assert lost and new and all(r.dim == "±temperature" for r in lost + new)


# ------------------------------------------------------------------------------------------------ markup
@pytest.mark.parametrize("name, source", [
    ("to_plain", "Code:\n\n    x = **kwargs**\n"),
    ("to_plain", "````\n```\nx = **a**\n```\n````\nNow **stir**."),
    ("to_markdown", "Results\n=======\n\nThe yield was high."),
    ("to_markdown", "This sentence is wrapped\nover two lines."),
    ("to_markdown", "Dry it.\n\n---\n\nGrind it."),
    ("thousands", "The 2023 report covers 2019–2023 under ISO 9001 on port 8080."),
    ("thousands", "2024 was warm."),
    ("spacing", "Run this:\n    x = 1\n"),
])
def test_a_format_rewrite_leaves_what_would_change_meaning(name, source):
    made, why = outputs(name, source, 4)
    for text in made:
        for part in ("    x = **kwargs**", "```\nx = **a**\n```", "Results\n=======", "wrapped\nover", "\n---\n",
                     "2023 report", "2019–2023", "ISO 9001", "port 8080", "2024 was", "this:\n    x"):
            if part in source:
                assert part in text, (name, text)
    assert made or why == {"no_eligible_span"}


def test_the_format_rewrites_that_stay_do_their_work():
    assert run_op("to_plain", "````\n```\nx = **a**\n```\n````\nNow **stir**.")[0] == \
        "````\n```\nx = **a**\n```\n````\nNow stir."
    assert run_op("to_plain", "Use **bold**, then *it*:")[:3:2] == ("Use bold, then it:", None)  # was content_changed
    assert run_op("to_markdown", "Dry it at 80 °C.\nGrind it\nfinely.")[0] == "- Dry it at 80 °C.\n- Grind it\nfinely."
    assert run_op("thousands", "Weigh 1500 mL in 2023, lot 12000 of ISO 9001.")[0] == \
        "Weigh 1,500 mL in 2023, lot 12,000 of ISO 9001."
    assert run_op("spacing", "Para.\n\n\n\n    code = 1\n")[0] == "Para.\n\n    code = 1\n"  # the break kept


@pytest.mark.parametrize("source, wrong, why", [
    ("Code:\n\n    x = **kwargs**\n", "Code:\n\n    x = kwargs\n", "code, math or identifier changed"),
    ("````\n```\nx = **a**\n```\n````\n", "````\n```\nx = a\n```\n````\n", "code, math or identifier changed"),
    ("Results\n=======\n\nText.", "- Results\n- =======\n\nText.", "token 1: 'Text.' became '======='"),
    ("This sentence is wrapped\nover two lines.", "- This sentence is wrapped\n- over two lines.",
     "a sentence cut in two blocks between token 3 'wrapped' and 'over'"),
    ("The 2023 report covers 2019–2023 under ISO 9001 on port 8080.",
     "The 2,023 report covers 2,019–2,023 under ISO 9,001 on port 8,080.", "a number that names something"),
    ("2024 was warm.", "2,024 was warm.", "a number that names something"),
    ("Para.\n\n\n    code = 1\n", "Para.\n    code = 1\n", "code, math or identifier changed"),
    ("Run this:\n    x = 1\n", "Run this:\n\n    x = 1\n", "code, math or identifier changed"),
])
def test_the_checker_catches_what_the_format_rewrites_wrote(source, wrong, why):
    from judgetrain.perturb.oracle import token_differences

    assert why in (token_differences(source, wrong) or "")


def test_the_checker_reads_markup_apart_from_the_operators():
    """No pattern of the operators' is the checker's (it was character for character the fence pattern), and it
    accepts what a rewrite may do: emphasis before punctuation, a list after a ``:`` line, separators on a
    quantity."""
    from judgetrain.perturb import formats, oracle

    theirs = {v.pattern for v in vars(formats).values() if isinstance(v, re.Pattern)}
    assert not theirs & {v.pattern for v in vars(oracle).values() if isinstance(v, re.Pattern)}
    for source, copy in [("Use **bold**, then *it*:", "Use bold, then it:"),
                         ("Steps:\nmix it\nstir it", "**Steps:**\n- mix it\n- stir it"),
                         ("Weigh 1500 mL and 2,000 g.", "Weigh 1,500 mL and 2000 g.")]:
        assert oracle.token_differences(source, copy) is None, (source, copy)


# ------------------------------------------------------------------------------------------------ error copies
def test_an_edited_number_keeps_its_notation_and_decimals():
    for name in ("scale", "scale_up"):
        for source, shape in [("Add 3.2×10^-3 g.", r"Add \d\.\d×10\^-\d g\."), ("Add 3.2e-3 g.", r"Add \d\.\de-\d g\."),
                              ("Add 2.50 g.", r"Add \d+\.\d\d g\.")]:
            made, why = outputs(name, source, 12)
            assert made and not why and all(re.fullmatch(shape, t) for t in made), (name, source, made)


def test_a_bare_number_is_edited_only_where_the_spec_asks():
    from judgetrain.perturb.spec import parse_spec
    from test_perturb_labels import TEMPLATE, UNITS

    def edited(op: dict, text: str) -> str:
        import dataclasses

        from judgetrain.perturb.build import Planned, SampleSpans, make
        from judgetrain.perturb.operators import Rules
        from judgetrain.perturb.source import Sample

        s = parse_spec({"template": TEMPLATE, "units": UNITS, "operators": {"op": op},
                        "sets": [{"name": "op", "rates": [1.0]}]})  # every eligible span, not 1 to 3 edits
        s = dataclasses.replace(s, seed=0)
        pset = s.sets[0]
        p = Planned(Sample(1, text, TEMPLATE, {}, "t", 0), pset, 1.0, pset.set_name(1.0), pset.operators, "rule")
        return make(s, p, {}, SampleSpans(Rules(s), text))[0]

    scale = {"kind": "numeric", "category": "error", "mode": "scale", "factor": [3, 3]}
    assert edited(scale, "Step 2: add 5 g of 3 salts.") == "Step 2: add 15 g of 3 salts."  # was Step 6: ... 9 salts
    assert edited({**scale, "require_unit": False}, "Step 2: add 5 g of 3 salts.") == "Step 2: add 15 g of 9 salts."


# ------------------------------------------------------------------------------------------------ property test
ISSUE_LINES = [
    "Keep within ±2 °C", "+/- 2 °C", "Heat at 25°C ±2°C.", "Raise the temperature by 10 °C",
    "The difference was 15 K.", "Code:\n\n    x = **kwargs**\n", "````\n```\nx = **a**\n```\n````",
    "Results\n=======", "This sentence is wrapped\nover two lines.", "---", "Use **bold**, then *it*:",
    "The 2023 report covers 2019–2023 under ISO 9001 on port 8080.", "2024 was warm.", "Run this:\n    x = 1",
    "Step 2: add 5 g.", "Add 3.2×10^-3 g.",
]
MARKUP = ["\n\n", "\n", "    ", "\t", "```", "~~~~", "====", "---", "- ", "1. ", "> ", "# ", "**", "*", "_", "`", "$",
          ":", ".", "ISO", "port", "by", "within", "±", "1500", "2021"]


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(ISSUE_LINES + RECIPE_LINES) | st.sampled_from(MARKUP + HOSTILE) | st.text(max_size=10),
                min_size=1, max_size=8), st.sampled_from(REPRESENT), st.integers(0, 3), st.sampled_from([0.5, 1.0]),
       st.sampled_from(["", " ", "\n"]))
def test_every_represent_operator_keeps_meaning_on_hostile_text(parts, name, seed, rate, joiner):
    """For every represent operator and hostile text: the item keeps every quantity and every token outside markup
    as the checker reads them, or it is a reject; and the operator's own edits are right by themselves: the checker
    never has to reject a rule item for a changed quantity or content (it did for each reproduction above)."""
    from judgetrain.perturb.oracle import token_differences

    text = joiner.join(parts)
    if not text.strip():
        return
    new, changes, why = run_op(name, text, seed, rate)
    assert why in (None, "no_eligible_span", "no_valid_edit"), (name, text, new, why)
    if why is None:
        assert changes and readings_differ(text, new) == ([], []), (name, text, new)
        if OPERATORS[name]["kind"] == "format":
            assert token_differences(text, new, name != "order") is None, (name, text, new)


def test_a_unit_swapped_on_a_difference_is_a_real_error_or_none():
    """A unit swap is an error copy; on a difference, °C -> K changes nothing (2 °C of difference is 2 K), so the
    swap draws only a unit of another scale, and the checker, reading the edit after the words before it, finds
    ``by 2 °C`` -> ``by 2 K`` no real error."""
    from judgetrain.perturb.build import no_real_error
    from judgetrain.perturb.edits import Change
    from test_perturb_labels import spec

    for source in ("Keep within ±2 °C.", "Raise it by 10 °C."):
        made, why = outputs("swap", source, 12)
        assert made and not why and all("°F" in t for t in made), made
    source = "Raise it by 10 °C."
    assert no_real_error(spec(), [Change("swap", "10 °C", "10 K", 12)], source)[0] == "no_real_error"
    assert no_real_error(spec(), [Change("swap", "10 °C", "10 °F", 12)], source) is None
    assert no_real_error(spec(), [Change("swap", "10 °C", "10 K", 12)]) is None  # read alone: a temperature
