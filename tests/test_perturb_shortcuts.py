"""Error copies a rule with no judge cannot catch: the rule figures of `judgetrain.perturb.shortcuts` on worked pairs;
the swap, borrow, pooled unit_swap and order operators drawing only what other sources use, 1 to 3 edits per copy
counted per item; the synthesis (7 error types) and cooking (5) packs on their generated sources (scripts/varied.py,
texts that are not one template filled in): every type's copies at most 0.65 by the shorter, longer and novel-token
rules, no word new to the sources, and `judgetrain perturb` printing those figures; the spec's new keys checked."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter

import pytest

from helpers import REPO, read_jsonl, run


def parsed(data: dict):
    from judgetrain.perturb.spec import parse_spec

    return parse_spec({"template": [{"role": "user", "content": "{{text}}"}], **data})


def test_rule_figures_on_worked_pairs():
    """Four samples in two folds (ids 0 and 2, 1 and 3). Type "tell": every copy adds "warfarin", a word no source
    holds, and is longer; type "fair": copies of their source's length and words. By hand: tell's shorter 1, longer 0,
    novel-token 1 (fitted on the other fold's copies, which hold warfarin); fair's all ties, 1/2."""
    from judgetrain.perturb.shortcuts import CopyPair, over_limit, copy_rule_figures

    pairs = []
    for i in range(4):
        source = f"Give aspirin {i} mg."
        pairs.append(CopyPair(i, "tell", source, f"Give aspirin {i} mg with warfarin.", 1))
        pairs.append(CopyPair(i, "fair", source, f"Give {i} aspirin mg.", 2 + i % 2))
    figures = copy_rule_figures(pairs, folds=2)
    assert figures["tell"] == {"copies": 4, "edits_per_copy": {"mean": 1.0, "min": 1, "max": 1},
                               "token_change": 2.0, "rules": {"shorter": 1.0, "longer": 0.0, "novel_token": 1.0}}
    assert figures["fair"]["rules"] == {"shorter": 0.5, "longer": 0.5, "novel_token": 0.5}
    assert figures["fair"]["edits_per_copy"] == {"mean": 2.5, "min": 2, "max": 3}
    assert over_limit(figures) == [("tell", "shorter", 1.0), ("tell", "novel_token", 1.0)]
    # one fold's copies alone hold the tell: the rule fitted on the other fold never marks them (ties)
    half = [p for p in pairs if p.key == "fair"] + [p for p in pairs if p.key == "tell" and p.sample_id in (0, 2)]
    assert copy_rule_figures(half, folds=2)["tell"]["rules"]["novel_token"] == 0.5


SOURCES = [f"Heat the powder in the {tool} at {t} °C for {h}. Cool it {pace}. Weigh {m} of salt."
           for tool in ("tube furnace", "drying oven", "hot plate") for t in (80, 450, 900) for h in ("2 h", "30 min")
           for pace in ("slowly", "rapidly") for m in ("1.0 g", "250 mg")]


def test_error_copies_hold_no_word_other_sources_lack_with_1_to_3_edits_counted_per_item(tmp_path):
    from judgetrain.eval.rules import words
    from judgetrain.perturb.build import perturb
    from judgetrain.perturb.source import Sample

    spec = parsed({
        "units": {"temperature": {"°C": [1, 273.15], "K": [1, 0]}, "time": {"min": 60, "h": 3600, "s": 1},
                  "mass": {"mg": 0.001, "g": 1}},
        "operators": {"tool": {"kind": "swap", "category": "error",
                               "classes": [["tube furnace", "drying oven", "hot plate", "glovebox"]]},
                      "antonym": {"kind": "swap", "category": "error", "classes": [["heat", "cool"],
                                                                                    ["slowly", "rapidly"]]},
                      "number": {"kind": "numeric", "category": "error", "mode": "borrow"},
                      "unit": {"kind": "numeric", "category": "error", "mode": "unit_swap", "pool": True},
                      "order": {"kind": "order", "category": "error"}},
        "sets": [{"name": n} for n in ("tool", "antonym", "number", "unit", "order")] + [
            {"name": "all", "operators": ["tool", "antonym", "number", "unit"], "edits": [2, 2]}]})
    assert {s.name: s.edits for s in spec.sets} == {"tool": (1, 3), "antonym": (1, 3), "number": (1, 3),
                                                    "unit": (1, 3), "order": (1, 3), "all": (2, 2)}
    samples = [Sample(i, text, spec.template, {}, "inline", i) for i, text in enumerate(SOURCES)]
    result = perturb(spec, samples, tmp_path)
    items = read_jsonl(tmp_path / "items.jsonl")
    assert Counter(i["perturbation_type"] for i in items) == {n: len(SOURCES) for n in
                                                              ("tool", "antonym", "number", "unit", "order", "all")}
    for item in items:
        copy, sid = item["prompt"][0]["content"], item["sample_id"]
        others = {w for j, s in enumerate(SOURCES) if j != sid for w in words(s)}
        assert set(words(copy)) <= others, (item["perturbation_type"], copy)
        edits = len(item["perturbation_changes"])
        assert (edits == 2) if item["perturbation_type"] == "all" else 1 <= edits <= 3
        for change in item["perturbation_changes"]:
            assert change["after"] != change["before"]
        if item["perturbation_type"] == "tool":  # the glovebox no source uses is never drawn
            assert "glovebox" not in copy
        if item["perturbation_type"] == "order":  # the same words, another order
            assert sorted(words(copy)) == sorted(words(SOURCES[sid])) and copy != SOURCES[sid]
        if item["perturbation_type"] == "unit":  # 2 h -> 2 min, 250 mg -> 250 g: the number kept
            assert all(re.sub(r"[^\d.]", "", c["before"]) == re.sub(r"[^\d.]", "", c["after"])
                       for c in item["perturbation_changes"])
    sets = result["summary"]["sets"]
    assert sets["order_100pct"]["rules"] == {"shorter": 0.5, "longer": 0.5, "novel_token": 0.5}
    assert all(s["rules"]["novel_token"] == 0.5 for s in sets.values())
    assert sets["all_100pct"]["edits_per_item"] == {"mean": 2.0, "min": 2, "max": 2}


def test_perturb_warns_of_a_set_a_rule_reads(tmp_path, caplog):
    """The same sources, a tool swapped for a glovebox no source names: the novel-token rule, fitted on other
    samples, reads every copy (1.0 > 0.9), and perturb says so."""
    from judgetrain.perturb.build import perturb
    from judgetrain.perturb.source import Sample

    spec = parsed({"operators": {"tool": {"kind": "table", "category": "error",
                                          "pairs": {"tube furnace": "glovebox", "drying oven": "glovebox",
                                                    "hot plate": "glovebox"}}},
                   "sets": [{"name": "tool"}]})
    samples = [Sample(i, text, spec.template, {}, "inline", i) for i, text in enumerate(SOURCES)]
    with caplog.at_level("WARNING"):
        summary = perturb(spec, samples, tmp_path)["summary"]
    assert summary["sets"]["tool_100pct"]["rules"]["novel_token"] == 1.0
    assert "set tool_100pct: the novel_token rule, with no judge, scores 1.000 on its copies against their sources " \
           "(above 0.9" in caplog.text


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """150 generated sources of each of the synthesis and cooking packs, and each pack's perturb run (the table it
    prints, its summary and items)."""
    from judgetrain.cli import main

    root = tmp_path_factory.mktemp("varied")
    run([sys.executable, REPO / "scripts" / "make_samples.py", "--only", "synthesis", "cooking", "--samples", "150",
         "0", "--out", root])
    runs = {}
    for pack in ("synthesis", "cooking"):
        import contextlib
        import io

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["perturb", "--source", str(root / pack), "--spec", pack, "--output_dir",
                         str(root / f"out-{pack}")]) == 0
        runs[pack] = {"printed": printed.getvalue(), "sources": read_jsonl(root / pack / "train.jsonl"),
                      "summary": json.loads((root / f"out-{pack}" / "summary.json").read_text()),
                      "items": read_jsonl(root / f"out-{pack}" / "items.jsonl")}
    return runs


@pytest.mark.parametrize("pack, types", [("synthesis", 7), ("cooking", 5)])
def test_each_error_type_of_the_packs_is_at_most_065_by_every_rule_and_perturb_prints_it(generated, pack, types):
    from judgetrain.eval.rules import words

    got = generated[pack]
    errors = {k: s for k, s in got["summary"]["sets"].items() if s["category"] == "error"}
    assert len(errors) == types
    for name, s in errors.items():
        assert s["items"] >= 140 and 1 <= s["edits_per_item"]["min"] and s["edits_per_item"]["max"] <= 3, name
        assert all(v <= 0.65 for v in s["rules"].values()), (name, s["rules"])
        assert s["rules"]["novel_token"] == 0.5, name  # no copy holds a word the other samples' sources lack
        assert abs(s["token_change"]) < 1, name
        line = next(x for x in got["printed"].splitlines() if f" {name} " in x)
        shown = [f"{s['rules'][r]:.3f}" for r in ("shorter", "longer", "novel_token")]
        assert re.search(r"\s+│\s+".join(map(re.escape, [f"{s['token_change']:+.2f}", *shown])), line), line
    vocabulary = {w for r in got["sources"] for w in words(r["text"])}
    for item in got["items"]:
        if item["perturbation_category"] == "error":
            text = item["prompt"][-1]["content"].split("## Recipe\n", 1)[-1].split("## AI-generated recipe\n", 1)[-1]
            assert set(words(text)) <= vocabulary, item["perturbation_set"]


def test_the_generated_sources_are_not_one_template_filled_in(generated):
    """With every number, the swapped words and the target masked, a filled template leaves one text per target;
    the generator's draw of sections, voice and phrasings leaves nearly every text its own."""
    texts = [r["text"] for r in generated["synthesis"]["sources"]]
    skeletons = {re.sub(r"\d+(?:\.\d+)?", "N", re.sub(r"[a-z]+ (?:furnace|oven|mortar|stirrer|plate|bath|mill)", "T",
                                                         t)) for t in texts}
    assert len(skeletons) >= 0.8 * len(texts)
    first_lines = Counter(t.split("\n", 1)[0].split(" ", 1)[0] for t in texts)
    assert len(first_lines) >= 5 and max(first_lines.values()) < 0.5 * len(texts)
    numbered = sum(bool(re.search(r"^1\. ", t, re.M)) for t in texts)
    assert 0.3 * len(texts) < numbered < 0.9 * len(texts)  # a numbered procedure in some, prose in the others


@pytest.mark.parametrize("edit, message", [
    ({"sets": [{"name": "swap", "rates": [0.5], "edits": 2}]}, "edits is for an error set without rates"),
    ({"edits": [0, 2]}, "edits: expected a whole number of edits >= 1"),
    ({"operators": {"swap": {"kind": "swap", "category": "error", "classes": [["heat", "cool"], ["Cool", "dry"]]}}},
     "a word stands in two classes"),
    ({"operators": {"swap": {"kind": "order", "category": "represent"}}}, "two steps in another order is an error"),
    ({"operators": {"swap": {"kind": "numeric", "category": "represent", "mode": "borrow"}}},
     "a value borrowed from another source is an error"),
    ({"operators": {"swap": {"kind": "numeric", "category": "error", "mode": "scale", "pool": True}}},
     "only a unit_swap draws its unit from the sources"),
])
def test_the_new_spec_keys_are_checked(edit, message):
    from judgetrain.perturb.spec import SpecError

    base = {"operators": {"swap": {"kind": "swap", "category": "error", "classes": [["heat", "cool"]]}},
            "sets": [{"name": "swap"}]}
    with pytest.raises(SpecError, match=re.escape(message)):
        parsed({**base, **edit})


def test_perturb_draws_the_same_copies_under_any_string_hash_seed(generated, tmp_path):
    """The same sources, spec and seed make the same items in every process: a draw's candidates (another source's
    quantity for numerical_perturbation) are listed in one order, not in the order of a set of strings, which Python
    randomises per process (PYTHONHASHSEED). Two processes of different hash seeds, every synthesis error type."""
    source = tmp_path / "sources.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in generated["synthesis"]["sources"][:60]))
    made = []
    for seed in ("1", "2"):
        out = tmp_path / f"out-{seed}"
        run([sys.executable, "-m", "judgetrain.cli", "perturb", "--source", source, "--spec", "synthesis",
             "--sets", "numerical_perturbation", "unit_swap", "equipment_substitution", "--output_dir", out],
            env={"PYTHONHASHSEED": seed})
        made.append((out / "items.jsonl").read_text())
    assert made[0].count("\n") >= 150
    assert made[0] == made[1]
