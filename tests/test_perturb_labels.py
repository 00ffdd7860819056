"""Every item of `judgetrain perturb` means what its label says: a represent item changes no quantity, an error item
changes one (or a word) into something wrong and physical, anything else is a reject with its reason. Worked cases of
each failure once seen (unit conversion of signed numbers, ranges, tolerances and scientific notation; format
rewrites of arithmetic, identifiers and code; scale edits to zero; CAS numbers; unit letters inside words;
pattern-table escapes; Unicode case folding; case preservation), the spec-time refusals, the endpoint rules, and a
seeded property test over every operator."""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import read_jsonl

TEMPLATE = [{"role": "user", "content": "Judge this:\n{{text}}"}]
UNITS = {"temperature": {"°C": [1, 273.15], "K": [1, 0], "°F": [0.5555555555555556, 255.37222222222223]},
         "mass": {"mg": 0.001, "g": 1, "kg": 1000}, "time": {"s": 1, "min": 60, "h": 3600, "d": 86400}}
OPERATORS = {
    "convert": {"kind": "numeric", "category": "represent", "mode": "convert"},
    "scale": {"kind": "numeric", "category": "error", "mode": "scale", "factor": [0.1, 0.4], "require_unit": True},
    "scale_up": {"kind": "numeric", "category": "error", "mode": "scale", "factor": [2, 5], "require_unit": True},
    "shift": {"kind": "numeric", "category": "error", "mode": "shift", "shift": [-30, 30], "require_unit": True},
    "swap": {"kind": "numeric", "category": "error", "mode": "unit_swap"},
    "element": {"kind": "table", "category": "error", "case": "preserve",
                "pairs": {"iron": "manganese", "dissolve": "precipitate", "heat": "cool",
                          "Teflon-lined autoclave": "open beaker", "tube furnace": "hot plate"}},
    "formula": {"kind": "table", "category": "represent", "case": "preserve",
                "pairs": {"acetone": "C3H6O", "ethanol": "C2H6O", "lithium hydroxide": "LiOH"}},
    "to_plain": {"kind": "format", "category": "represent", "rewrite": "markdown_to_plain"},
    "to_markdown": {"kind": "format", "category": "represent", "rewrite": "plain_to_markdown"},
    "order": {"kind": "format", "category": "represent", "rewrite": "list_order"},
    "spacing": {"kind": "format", "category": "represent", "rewrite": "whitespace"},
    "thousands": {"kind": "format", "category": "represent", "rewrite": "number_format"},
}


def _perturb(argv: list[str]) -> int:
    from judgetrain.cli import run_command

    return run_command("perturb", argv)


def spec_data(**extra) -> dict:
    return {"template": TEMPLATE, "units": UNITS, "operators": OPERATORS, "sets": [{"name": k} for k in OPERATORS],
            **extra}


@functools.cache
def spec():
    from judgetrain.perturb.spec import parse_spec

    return parse_spec(spec_data())


def run_op(name: str, text: str, seed: int = 0, rate: float = 1.0):
    """(text, changes, reject reason or None) of operator ``name`` on ``text``, as `judgetrain perturb` makes and
    checks an item."""
    from judgetrain.perturb.build import Planned, SampleSpans, check, make
    from judgetrain.perturb.operators import Rules
    from judgetrain.perturb.source import Sample

    s = dataclasses.replace(spec(), seed=seed)
    pset = dataclasses.replace(next(p for p in s.sets if p.name == name), edits=None)  # the rate's share of spans
    sample = Sample(1, text, TEMPLATE, {}, "t", 0)
    p = Planned(sample, pset, rate, pset.set_name(rate), pset.operators, "rule")
    new, changes, why, _ = make(s, p, {}, SampleSpans(Rules(s), text))
    return new, changes, (why or check(s, p, new, changes, None) or (None,))[0]


def readings_differ(a: str, b: str) -> tuple[list, list]:
    from judgetrain.perturb.oracle import differ, read_quantities

    s = spec()
    return differ(read_quantities(a, s.units, ("acetone", "C3H6O", "ethanol", "C2H6O")),
                  read_quantities(b, s.units, ("acetone", "C3H6O", "ethanol", "C2H6O")))


# ------------------------------------------------------------------------------------------------ worked cases
@pytest.mark.parametrize("source, expected", [
    ("-20 °C", {"253.15 K", "-4.0 °F"}),
    ("−4 °F", {"−20.0 °C", "253.15 K"}),  # the Unicode minus kept; 1 °F resolves 0.56 °C: one decimal
    ("60-80 °C", {"333.15-353.15 K", "140-176 °F"}),
    ("60 to 80 °C", {"333.15 to 353.15 K", "140 to 176 °F"}),
    ("60–80 °C", {"333.15–353.15 K", "140–176 °F"}),
    ("25 ± 2 °C", {"298.15 ± 2 K", "77 ± 3.6 °F"}),  # a tolerance is a difference: no offset
    ("3.2e-3 g", {"3.2 mg", "3.2e-6 kg"}),
    ("3.2×10^-3 g", {"3.2 mg", "3.2×10^-6 kg"}),
    ("25 °C", {"298.15 K", "77 °F"}),  # exact, not 298.1 K
])
def test_unit_conversion_converts_the_whole_quantity_exactly(source, expected):
    made = set()
    for seed in range(12):
        text, changes, why = run_op("convert", f"Stir at {source} overnight.", seed)
        assert why is None, why
        made.add(text.removeprefix("Stir at ").removesuffix(" overnight."))
    assert made == expected
    for text in made:
        assert readings_differ(source, text) == ([], [])


@pytest.mark.parametrize("wrong, right", [("-20 °C", "-293.1 K"), ("-4 °F", "--15.56 °C"), ("60-80 °C", "60-353.1 K"),
                                          ("25 ± 2 °C", "25 ± 275.1 K"), ("3.2e-3 g", "3.2e-3000 mg"),
                                          ("25 °C", "298.1 K")])  # 298.15 K, written at four figures
def test_the_oracle_catches_what_the_old_conversion_wrote(wrong, right):
    lost, new = readings_differ(wrong, right)
    assert lost and new


@pytest.mark.parametrize("text", ["10 wt% Li2CO3", "5 mol% Mg", "a 1:2 ratio", "99.9% pure"])
def test_percentages_and_ratios_are_left_alone_with_the_reason(text):
    from judgetrain.perturb.operators import Rules

    for name in ("convert", "scale", "swap"):
        spans = Rules(spec()).spans(name, text)
        assert {s.skip for s in spans} <= {"percentage", "ratio"} and run_op(name, text)[2] == "no_eligible_span"
    assert run_op("scale", "-300 °C")[2] == "no_eligible_span"  # below absolute zero: no edit of it


def test_format_rewrites_leave_arithmetic_identifiers_code_and_math_alone():
    text = "Compute 2 * 3 * 4 = 24 in __init__ with `a_b`:\n```python\ndef f():\n    return 2 * 3\n```\nand $x*y$."
    for name in ("to_plain", "to_markdown", "spacing", "thousands"):
        new, changes, why = run_op(name, text)
        for part in ("2 * 3 * 4 = 24", "__init__", "`a_b`", "```python\ndef f():\n    return 2 * 3\n```", "$x*y$"):
            assert part in new, (name, new)
    from judgetrain.perturb.oracle import token_differences

    assert token_differences("2 * 3 * 4 = 24", "2  3  4 = 24") == "token 1: '*' became '3'"
    assert "'__init__'" in token_differences("call __init__", "call init")
    code = "Steps:\n```\nx = 1:\ny = 2\n```"
    assert token_differences(code, "**Steps:**\n```\n**x = 1:**\n- y = 2\n```").startswith("code, math")
    new, _, why = run_op("to_markdown", code + "\nmix it\nstir it")
    assert why is None and new == "**Steps:**\n```\nx = 1:\ny = 2\n```\n- mix it\n- stir it"
    assert run_op("to_plain", "- take **two** tablets")[0] == "take two tablets"


def test_scale_edits_are_real_errors_and_number_format_leaves_identifiers():
    for seed in range(40):
        text, changes, why = run_op("scale", "Dry for 1 h.", seed)
        assert why is None and text != "Dry for 0 h." and changes[0].after.endswith(" h")
        assert 0 < float(changes[0].after.split()[0]) < 1
        text, changes, why = run_op("scale_up", "Cool to -78 °C.", seed)
        assert why is None and changes[0].after.startswith("-") and float(changes[0].after.split()[0]) >= -273.15
    assert run_op("thousands", "CAS 7647-14-5, lot 12000.")[0] == "CAS 7647-14-5, lot 12,000."
    assert run_op("thousands", "Published in 2021 (2019).")[2] == "no_eligible_span"


def test_units_are_matched_as_units_and_expanded_abbreviations_pass(tmp_path):
    """The docs' clinic spec: b.i.d. -> twice daily is an item, not `numbers_lost: missing d`; e.g., 's and K2CO3
    hold no unit."""
    from judgetrain.perturb.oracle import read_quantities

    units = spec().units
    assert read_quantities("e.g. it's K2CO3 and b.i.d. dosing", units) == []
    assert [r.dim for r in read_quantities("give 5 g for 2 d, 3 s", units)] == ["mass", "time", "time"]
    data = {"name": "clinic", "template": TEMPLATE, "units": {"mass": {"mg": 0.001, "g": 1}, "time": {"h": 3600, "d": 86400}},
            "tables": {"abbreviations": {"b.i.d.": "twice daily", "q.d.": "once daily", "p.o.": "by mouth"}},
            "operators": {"expand": {"kind": "table", "category": "represent", "table": "abbreviations",
                                     "checks": {"numbers": True}}},
            "sets": [{"name": "expand"}]}
    path = tmp_path / "clinic.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    source = tmp_path / "notes.jsonl"
    source.write_text(json.dumps({"sample_id": 1, "text": "Warfarin 5 mg p.o. b.i.d. for 3 d, e.g. with food."}) + "\n")
    main = _perturb  # through the entry: bad input is its one line, exit code 2

    assert main(["--source", str(source), "--spec", str(path), "--output_dir", str(tmp_path / "out")]) == 0
    items = read_jsonl(tmp_path / "out" / "items.jsonl")
    assert len(items) == 1 and "Warfarin 5 mg by mouth twice daily for 3 d" in items[0]["prompt"][-1]["content"]


def test_case_is_folded_for_all_of_unicode_and_the_edit_is_invisible_in_casing():
    assert run_op("element", "İRON and Diſſolve it.")[0] == "MANGANESE and Precipitate it."
    assert run_op("element", "Seal it in a Teflon-lined autoclave.")[0] == "Seal it in a open beaker."
    assert run_op("element", "Teflon-lined autoclave: sealed.")[0] == "Open beaker: sealed."
    assert run_op("element", "Heat it; heat it. HEAT.")[0] == "Cool it; cool it. COOL."
    assert run_op("element", "preheat the iron-rich")[0] == "preheat the manganese-rich"


def test_a_value_with_capitals_of_its_own_keeps_them_and_a_visible_edit_is_a_reject():
    from judgetrain.perturb.build import visible_table_edit
    from judgetrain.perturb.edits import Change

    assert run_op("formula", "Dissolve lithium hydroxide in acetone.")[0] == "Dissolve LiOH in C3H6O."
    assert run_op("formula", "ACETONE, then Ethanol.")[0] == "C3H6O, then C2H6O."
    assert visible_table_edit(spec(), "heat it", [Change("element", "heat", "Cool", 0)]) == \
        "'heat' -> 'Cool': a lowercase word written capitalised"
    assert visible_table_edit(spec(), "HEAT it", [Change("element", "HEAT", "cool", 0)]) == \
        "'HEAT' -> 'cool': a word in capitals written otherwise"
    assert visible_table_edit(spec(), "preheat", [Change("element", "heat", "cool", 3)]) == "'heat' -> 'cool' cuts a word"
    assert visible_table_edit(spec(), "in a Teflon-lined autoclave", [
        Change("element", "Teflon-lined autoclave", "open beaker", 5)]) is None


# ------------------------------------------------------------------------------------------------ the spec
def _spec_file(tmp_path: Path, pairs: dict, **op) -> Path:
    data = {"template": TEMPLATE, "operators": {"dose": {"kind": "table", "category": "error", "match": "pattern",
                                                         "pairs": pairs, **op}}, "sets": [{"name": "dose"}]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("pairs, message", [
    ({r"(\d+) mg": r"\g<2> mg"}, "operators.dose: the value '\\\\g<2> mg' of pattern '(\\\\d+) mg' refers to group '2', "
                                 "and the pattern has 1 group(s)"),
    ({r"(\d+) mg": r"\alpha"}, "operators.dose: the value '\\\\alpha' of pattern '(\\\\d+) mg' holds the escape \\a"),
    ({r"(?P<n>\d+) mg": r"\g<m>"}, "refers to group 'm', and the pattern has 1 group(s) (n)"),
    ({r"(\d+ mg": "x"}, "operators.dose: pattern '(\\\\d+ mg' does not compile"),
])
def test_a_bad_pattern_table_exits_2_naming_the_key_before_any_row_is_read(tmp_path, capsys, pairs, message):
    main = _perturb  # through the entry: bad input is its one line, exit code 2

    code = main(["--source", str(tmp_path / "never-read.jsonl"), "--spec", str(_spec_file(tmp_path, pairs)),
                 "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert "never-read" not in err  # refused before the source is looked at


def test_a_good_pattern_table_runs(tmp_path):
    from judgetrain.perturb.spec import load_spec

    spec_ = load_spec(str(_spec_file(tmp_path, {r"(?P<n>\d+) mg": r"\g<n>0 mg \\ ok"})))
    from judgetrain.perturb.edits import apply, pick
    from judgetrain.perturb.operators import Rules

    rng = random.Random(0)
    assert apply("5 mg", pick(Rules(spec_).spans("dose", "5 mg"), 1.0, rng), rng)[0] == "50 mg \\ ok"


# ------------------------------------------------------------------------------------------------ endpoints
NOTES = [{"sample_id": i, "text": f"Give {i + 1} mg at 8 h daily."} for i in range(3)]


def _model_spec(tmp_path: Path) -> Path:
    data = {"template": TEMPLATE, "operators": {"reword": {"kind": "model", "category": "represent",
                                                           "instruction": "Reword it."}},
            "sets": [{"name": "reword"}]}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in NOTES))
    return path


def test_model_rewrites_get_judges_endpoint_preflight_and_refusals(tmp_path, monkeypatch, capsys):
    from openai_server import ScriptedServer

    main = _perturb  # through the entry: bad input is its one line, exit code 2

    spec_path, source = _model_spec(tmp_path), tmp_path / "notes.jsonl"

    def run(model: str, out: str, *extra) -> tuple[int, str]:
        code = main(["--source", str(source), "--spec", str(spec_path), "--model", model, "--output_dir",
                     str(tmp_path / out), "--max_new_tokens", "50", *map(str, extra)])
        return code, capsys.readouterr().err

    monkeypatch.delenv("JT_NO_SUCH_KEY", raising=False)
    with ScriptedServer(model="rw", key="sk-x") as server:
        code, err = run(f"endpoint={server.base_url},model=rw,key_env=JT_NO_SUCH_KEY", "a")
        assert code == 2 and "JT_NO_SUCH_KEY" in err and "Traceback" not in err and not server.requests
    with ScriptedServer(model="rw") as server:
        dead = server.base_url
    code, err = run(f"endpoint={dead},model=rw", "b", "--endpoint_wait_budget_s", 600)
    assert code == 2 and "did not answer" in err and "Traceback" not in err
    assert not (tmp_path / "b" / "rewrites").exists()  # refused before any work
    with ScriptedServer(model="rw", reject_word="Reword") as server:  # a 400 for every prompt: the request's fault
        code, err = run(f"endpoint={server.base_url},model=rw", "c")
        assert code == 2 and set(server.statuses) == {400} and "Traceback" not in err
        assert "This model's maximum context length is 32 tokens" in err  # the server's own words, quoted
    assert not (tmp_path / "c" / "rejects.jsonl").exists() or not read_jsonl(tmp_path / "c" / "rejects.jsonl")


def test_seed_redraws_rule_edits_and_keeps_finished_greedy_rewrites(tmp_path, capsys):
    from openai_server import ScriptedServer

    main = _perturb  # through the entry: bad input is its one line, exit code 2

    spec_path, source = _model_spec(tmp_path), tmp_path / "notes.jsonl"
    with ScriptedServer(model="rw") as server:
        args = ["--source", str(source), "--spec", str(spec_path), "--model", f"endpoint={server.base_url},model=rw",
                "--output_dir", str(tmp_path / "out")]
        assert main(args) == 0 and len(server.requests) == 3
        assert main(args + ["--seed", "7"]) == 0, capsys.readouterr().err
        assert len(server.requests) == 3  # no rewrite made twice
    assert len(read_jsonl(tmp_path / "out" / "items.jsonl")) + len(read_jsonl(tmp_path / "out" / "rejects.jsonl")) == 3


# ------------------------------------------------------------------------------------------------ property test
RECIPE_LINES = [
    "Dissolve 2.5 g of FeCl3 in 50 mL ethanol and stir for 30 min at 25 °C.",
    "Cool the flask to -78 °C (dry ice/acetone) and add 3.2e-3 g of catalyst.",
    "Heat the mixture in a tube furnace at 60-80 °C for 2 h, then hold at 25 ± 2 °C.",
    "Anneal at 800 to 950 °C for 12 h under argon; ramp 5 °C/min.",
    "Mix Li2CO3 and Co3O4 (10 wt% excess, 1:2 molar ratio) in a Teflon-lined autoclave.",
    "Keep at −20 °C for 1 h; CAS 7647-14-5; e.g. K2CO3 or NaOH (99.9%).",
    "1. Grind for 15 min.\n2. Press at 3.2×10^-3 kg.\n3. Sinter at 1200 °C for 4 h.",
    "## Steps\n- take **two** tablets\n- see [the leaflet](http://x)\n\nNotes:\nmix it\nstir it",
    "Compute 2 * 3 * 4 = 24 in __init__ with `a_b` and $x*y$.\n```\ndef f():\n    return 2 * 3\n```",
    "İRON and Diſſolve; HEAT it, then heat it again.   Trailing   spaces   \n\n\n\nEnd.",
    "Wash with acetone, dry at 120 °C for 12000 s, weigh 1,500 mg.",
    "Dissolve lithium hydroxide and LiOH in Ethanol; ACETONE rinse.",
]
HOSTILE = ["\u202e\u200b", "{{text}}", "\\g<1>", "$", "`", "**", "-", "−", "°C", "e-3", "×10^", "±", " to ", "\n",
           "\x00", "😀", "ſ", "İ", "K", "%", ":"]


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(RECIPE_LINES) | st.sampled_from(HOSTILE) | st.text(max_size=12), min_size=1,
                max_size=6), st.sampled_from(sorted(OPERATORS)), st.integers(0, 3), st.sampled_from([0.05, 0.5, 1.0]))
def test_every_operator_writes_items_that_mean_their_label_or_rejects(parts, name, seed, rate):
    """For every operator and text: a represent item changes no quantity (the independent reader finds none lost or
    added), an error item from a numeric operator changes at least one, an error table item changes whole words in
    the text's own casing; otherwise the item is a reject with a reason."""
    text = " ".join(parts)
    if not text.strip():
        return
    new, changes, why = run_op(name, text, seed, rate)
    if why is not None:
        assert isinstance(why, str) and why
        return
    assert changes and new != text
    op = OPERATORS[name]
    lost, added = readings_differ(text, new)
    if op["category"] == "represent":
        assert (lost, added) == ([], []), (name, text, new)
    elif op["kind"] == "numeric":
        assert lost and added, (name, text, new)
    else:
        for c in changes:
            end = c.position + len(c.before)
            assert not (text[c.position - 1: c.position].isalnum() or text[end: end + 1].isalnum())
            if c.before.islower():
                assert c.after == c.after.lower(), (c.before, c.after)
            if c.before.isupper() and len(c.before) > 1:
                assert c.after.isupper(), (c.before, c.after)


@pytest.mark.parametrize("change, message", [
    ({"operators": {"scale": {**OPERATORS["scale"], "decimals": "two"}}},
     "operators.scale.decimals: expected an integer from 0 to 12, got 'two'"),
    ({"operators": {"scale": {**OPERATORS["scale"], "require_unit": "yes"}}},
     "operators.scale.require_unit: expected true or false, got 'yes'"),
    ({"units": {**UNITS, "length": {"": 1, "m": 1}}}, "units.length.: a unit is a token without spaces"),
    ({"units": {**UNITS, "other": {"g": 1, "lb": 453.6}}}, "units.other.g: already a unit of another dimension"),
])
def test_every_bad_spec_exits_2_in_one_line_naming_the_key(tmp_path, capsys, change, message):
    main = _perturb  # through the entry: bad input is its one line, exit code 2

    data = spec_data()
    data["operators"] = {**data["operators"], **change.get("operators", {})}
    data["units"] = change.get("units", data["units"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    code = main(["--source", str(tmp_path / "never-read.jsonl"), "--spec", str(path), "--output_dir",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_a_long_rule_run_logs_items_per_second_and_the_time_left(caplog):
    """`make_all` logs its progress (items made, items/s, ETA) on the main process: here at every sample."""
    import logging

    from judgetrain.perturb.build import make_all, plan
    from judgetrain.perturb.source import Sample

    samples = [Sample(i, f"Heat iron at {20 + i} °C for {i + 1} h.", TEMPLATE, {}, "t", i) for i in range(4)]
    planned, _ = plan(spec(), samples, with_model=False)
    with caplog.at_level(logging.INFO, logger="judgetrain.perturb.build"):
        made = make_all(spec(), planned, {}, every=0.0)
    assert len(made) == len(planned) == 4 * len(OPERATORS)
    lines = [r.getMessage() for r in caplog.records if "items made" in r.getMessage()]
    assert [line.split(" items made")[0] for line in lines] == [f"perturb: {k * len(OPERATORS)}/{len(planned)}"
                                                                for k in (1, 2, 3)]
    assert all("items/s, ETA" in line and line.endswith(" min") for line in lines)
