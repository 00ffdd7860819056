"""The share of items and of rejects by reason per set of `judgetrain perturb`'s materials and style packs (rule
operators and stand-ins, no model), over the bundled recipes and over generated ones, and how many of the items an
independent reading finds mislabelled: a represent item whose quantities (read back to base units) or whose text
outside markup changed, an error item whose numeric edit reads back as the same quantity or turns non-physical, and
any item whose word-table edit cuts a word or shows in its casing.

    python scripts/perturb_figures.py --out /tmp/figures                       # bundled + 2,000 generated
    python scripts/perturb_figures.py --out /tmp/figures --audit_only DIR      # audit another run's output folder

The generated recipes are scripts/synth.py's recipes with lines a chemist writes mixed in (signed temperatures with
either minus, ranges, tolerances, tolerances standing alone and differences, scientific notation, percentages,
ratios, rates, CAS numbers, abbreviations, step labels; for the style pack code, indented and nested code, arithmetic,
setext headings, rules, hard-wrapped sentences, emphasis before punctuation, years, standards and ports), drawn from
``random.Random(seed)``. The audit needs judgetrain.perturb.oracle;
the runs themselves use only `judgetrain.perturb.build.perturb`, so an older judgetrain can make the output that this
script then audits (``--audit_only``).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth  # noqa: E402  (scripts/synth.py, beside this script)

HARD_LINES = [
    "Cool the solution to {neg} °C in a dry ice bath before adding the precursor.",
    "Quench the flask at \u2212{n} °C and keep it there for {m} min.",
    "Hold the suspension at {a}-{b} °C for {h} h.",
    "Age the gel at {a} to {b} °C overnight.",
    "Keep the bath at {a}\u2013{b} °C while stirring.",
    "Maintain the reaction at {t} \u00b1 {tol} °C for {h} h.",
    "Add {sci}e-3 g of the dopant and {sci}\u00d710^-3 g of surfactant.",
    "Ramp the furnace at {r} °C/min to the calcination temperature.",
    "Add {p} wt% binder and {p} mol% dopant in a 1:{ratio} molar ratio (99.9% purity).",
    "Sodium chloride (CAS 7647-14-5) can replace KCl, e.g. at {g} g per batch.",
    "Adjust to pH {a2}-{b2} with dilute acid; store at 4 °C.",
    "Dry at {t} \u00b0C for {m} min, weigh {mg} mg and record it.",
    "Keep the bath within \u00b1{tol} °C of the set point.",
    "Raise the temperature by {r} °C every hour; the difference between runs was {m} K.",
    "Hold at {t}°C \u00b1{tol}°C for {h} h, then at {a} °C +/- {tol} °C.",
    "Step {a2}: add {g} g of the salt.",
]
STYLE_LINES = [
    "Check it: 2 * {a2} * 4 = {prod} before scaling up.",
    "The helper `scale_batch()` in __init__ converts {g} g to moles.",
    "```python\nmass_g = {g}  # grams\nprint(mass_g * 2)\n```",
    "The yield is $m_{{out}} / m_{{in}}$ times 100.",
    "**Note:** keep the *dried* powder sealed.",
    "Steps:\nweigh the powder\ngrind it",
    "Code:\n\n    mass = **{g}**\n",
    "````\n```\nx = **{a2}**\n```\n````",
    "Results\n=======",
    "This sentence is wrapped\nover two lines.",
    "---",
    "Use **bold**, then *it*:",
    "The 2023 report covers 2019\u20132023 under ISO 9001 on port 8080.",
    "Run this:\n    x = {a2}",
]


def generated(n: int, seed: int = 0) -> list[dict]:
    """``n`` recipes: synth.py's, each with one to three hard lines placed among its steps."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        recipe = synth.make_recipe(i, seed)
        lines = synth.render_recipe(recipe).split("\n")
        for _ in range(rng.randint(1, 3)):
            template = rng.choice(HARD_LINES + STYLE_LINES)
            a = rng.choice((40, 60, 80, 100))
            a2 = rng.randint(2, 9)
            values = dict(neg=rng.choice((-20, -40, -78, -10)), n=rng.choice((5, 20, 78)), m=rng.choice((15, 30, 45)),
                          a=a, b=a + rng.choice((10, 20, 40)), h=rng.choice((1, 2, 6, 12)), t=rng.choice((25, 37, 80)),
                          tol=rng.choice((1, 2, 5)), sci=rng.choice((1.5, 3.2, 7)), r=rng.choice((2, 5, 10)),
                          p=rng.choice((5, 10, 20)), ratio=rng.choice((2, 3)), g=rng.choice((0.5, 2, 12.5)),
                          a2=a2, b2=a2 + 1, mg=rng.choice((250, 1500, 12000)), prod=8 * a2)
            at = lines.index("### Characterization") - 1
            lines.insert(at, template.format(**values))
        rows.append({"sample_id": 10_000 + i, "target": synth.target_description(recipe),
                     "question": f"How is {recipe.target} made?", "text": "\n".join(lines)})
    return rows


def bundled() -> list[dict]:
    from judgetrain.perturb.source import bundled_recipes

    rows = bundled_recipes("validation") + bundled_recipes("train")
    return [{**r, "question": f"How is {r['target']} made?"} for r in rows]


def run(pack: str, rows: list[dict], out: Path) -> dict:
    """`judgetrain perturb` of ``pack`` over ``rows`` (rule operators and stand-ins), into ``out``; its summary."""
    from judgetrain.perturb.build import perturb
    from judgetrain.perturb.source import read_samples
    from judgetrain.perturb.spec import load_spec

    out.mkdir(parents=True, exist_ok=True)
    source = out / "source.jsonl"
    source.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    spec = load_spec(pack)
    samples, _ = read_samples(str(source), spec)
    perturb(spec, samples, out)
    return json.loads((out / "summary.json").read_text())


def audit(pack: str, out: Path) -> Counter:
    """Per set, the items the independent reading finds mislabelled (see the module doc)."""
    from judgetrain.perturb.build import no_real_error, represent_words, visible_table_edit
    from judgetrain.perturb.edits import Change
    from judgetrain.perturb.oracle import differ, read_quantities, token_differences
    from judgetrain.perturb.spec import load_spec

    spec = load_spec(pack)
    sources = {r["sample_id"]: r["text"] for r in map(json.loads, (out / "source.jsonl").open(encoding="utf-8"))}
    bad: Counter = Counter()
    for line in (out / "items.jsonl").open(encoding="utf-8"):
        item = json.loads(line)
        source, changes = sources[item["sample_id"]], [Change(**c) for c in item["perturbation_changes"]]
        parts, pos = [], 0
        for c in changes:
            parts += [source[pos: c.position], c.after]
            pos = c.position + len(c.before)
        text = "".join(parts) + source[pos:]
        kinds = {spec.operators[c.kind].kind for c in changes if c.kind in spec.operators}
        if item["perturbation_category"] == "represent":
            lost, new = differ(*(read_quantities(t, spec.units, represent_words(spec)) for t in (source, text)))
            wrong = bool(lost or new) or ("format" in kinds and token_differences(
                source, text, all(spec.operators[c.kind].options.get("rewrite") != "list_order" for c in changes)))
        else:
            wrong = bool(no_real_error(spec, [c for c in changes if spec.operators[c.kind].kind == "numeric"], source))
        wrong = wrong or bool(visible_table_edit(spec, source, [c for c in changes if c.kind in spec.operators and
                                                                spec.operators[c.kind].kind == "table"]))
        bad[item["perturbation_set"]] += bool(wrong)
    return bad


def table(name: str, summary: dict, bad: Counter | None) -> list[str]:
    lines = [f"{name}: {summary['samples']} samples", "",
             "| set | items | mislabelled items | rejects by reason |", "|---|---:|---:|---|"]
    n = summary["samples"]
    for set_name, s in summary["sets"].items():
        rejects = ", ".join(f"{k} {100 * v / n:.1f}%" for k, v in s["rejects"].items()) or "-"
        wrong = "-" if bad is None else f"{100 * bad[set_name] / n:.1f}%"
        lines.append(f"| {set_name} | {100 * s['items'] / n:.1f}% | {wrong} | {rejects} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder of the runs (one per pack x source)")
    p.add_argument("--generated", type=int, default=2000, help="generated recipes (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--audit_only", help="audit the runs already in this folder (made by another judgetrain)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    report = []
    for pack in ("materials", "style"):
        for source in ("bundled", "generated"):
            out = Path(args.audit_only or args.out) / f"{pack}-{source}"
            if args.audit_only:
                summary = json.loads((out / "summary.json").read_text())
            else:
                rows = bundled() if source == "bundled" else generated(args.generated, args.seed)
                summary = run(pack, rows, out)
            try:
                bad = audit(pack, out)
            except ImportError:
                bad = None  # a judgetrain without the oracle: audit this folder with --audit_only later
            report += table(f"{pack}, {source} recipes", summary, bad)
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
