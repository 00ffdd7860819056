"""Write the bundled judge-panel sample: judgetrain/data/samples/panel/evaluations.jsonl.gz (gzip, mtime 0).

    python scripts/make_panel.py            # rewrites the file; the output is byte-for-byte deterministic

6 synthetic synthesis recipes x the 17 perturbation sets of JudgeBias-DPO-RefFree x 4 judges = 408 rows in the
input schema of `judgetrain pairs build`. Judges differ the way the card describes real ones: some penalise a
harmless change of surface form (formula instead of name), some miss injected errors, so pairs exist in both
categories. A few rows are deliberately bad (no score, a word as score, scores of 0 and 7) to exercise the
rejects file, two judges write a byte-identical evaluation once (deduplication), and two groups of scores sit far
below the anchor (anchor filter). All text is synthetic, written for this sample.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "judgetrain" / "data" / "samples" / "panel" / "evaluations.jsonl.gz"

JUDGES = ("Qwen3-8B", "Qwen3-32B", "Llama-3.1-8B-Instruct", "gemini-2.5-flash")
RATES = (1, 2, 5, 10, 15)
ERROR_SETS = [f"all_error_perturbation_{r}pct" for r in RATES] + [
    "element_substitution_100pct", "numerical_perturbation_100pct", "equipment_substitution_100pct",
    "action_antonym_100pct"]
REPRESENT_SETS = [f"llm_representational_perturbation_{r}pct" for r in RATES] + [
    "llm_to_formula_100pct", "llm_to_name_100pct", "llm_to_iupac_100pct"]
CRITERIA = ("materials_appropriateness_score", "equipment_appropriateness_score", "procedure_completeness_score",
            "procedure_feasibility_score", "characterization_appropriateness_score")

SYSTEM = (
    "You are an expert materials scientist acting as a judge. Rate the AI-generated synthesis recipe for the "
    "target material on five criteria, each from 1 to 5 in steps of 0.5: materials appropriateness, equipment "
    "appropriateness, procedure completeness, procedure feasibility and characterization appropriateness. "
    "Reason step by step first, then end with a ```json block holding the float keys "
    + ", ".join(CRITERIA) + " and overall_score."
)

# name, target description, quality (the score a careful judge gives the unperturbed recipe), recipe fields
RECIPES = [
    dict(target="LiFePO4 olivine cathode with carbon coating for lithium-ion batteries", quality=4.5,
         materials=["Li2CO3 (99.9%, Sigma-Aldrich)", "FeC2O4*2H2O (99%, Alfa Aesar)",
                    "NH4H2PO4 (99%, Sigma-Aldrich)", "glucose (carbon source)", "ethanol (milling medium)"],
         equipment=["planetary ball mill", "tube furnace under Ar", "vacuum oven"],
         steps=["Mix the precursors in stoichiometric ratio with ethanol and ball-mill for 6 h at 300 rpm.",
                "Dry the slurry at 80 C in the vacuum oven.",
                "Heat the powder at 350 C for 5 h under Ar to decompose the oxalate.",
                "Regrind, add 10 wt% glucose and heat at 700 C for 10 h under Ar."],
         characterization=["XRD", "SEM", "galvanostatic cycling at 0.1 C"]),
    dict(target="Na3V2(PO4)3 NASICON cathode for sodium-ion batteries", quality=4.0,
         materials=["Na2CO3 (99.5%, Sigma-Aldrich)", "NH4VO3 (99%, Alfa Aesar)", "NH4H2PO4 (99%, Sigma-Aldrich)",
                    "citric acid", "deionized water"],
         equipment=["magnetic stirrer with hot plate", "tube furnace under Ar", "agate mortar"],
         steps=["Dissolve NH4VO3 and citric acid in water at 80 C until the solution turns blue.",
                "Add Na2CO3 and NH4H2PO4 and stir for 4 h.",
                "Evaporate to a gel and dry at 120 C overnight.",
                "Heat at 350 C for 4 h, grind, then heat at 800 C for 8 h under Ar."],
         characterization=["XRD", "TEM", "cyclic voltammetry"]),
    dict(target="ZnO nanorods grown hydrothermally on glass", quality=3.5,
         materials=["Zn(NO3)2*6H2O (98%, Sigma-Aldrich)", "hexamethylenetetramine (99%)", "zinc acetate (seed layer)",
                    "ethanol", "acetone (substrate cleaning)"],
         equipment=["spin coater", "Teflon-lined autoclave", "laboratory oven", "ultrasonic bath"],
         steps=["Clean the glass in acetone and ethanol in the ultrasonic bath for 10 min each.",
                "Spin-coat a 5 mM zinc acetate seed layer and anneal at 350 C for 30 min.",
                "Heat the substrate in 25 mM Zn(NO3)2 / HMTA solution at 90 C for 6 h in the autoclave.",
                "Rinse with water and dry at 60 C."],
         characterization=["SEM", "XRD", "UV-Vis spectroscopy"]),
    dict(target="Anatase TiO2 nanoparticles by sol-gel", quality=4.0,
         materials=["titanium isopropoxide (97%, Sigma-Aldrich)", "ethanol (absolute)", "HNO3 (65%)",
                    "deionized water"],
         equipment=["magnetic stirrer", "muffle furnace", "centrifuge"],
         steps=["Add titanium isopropoxide dropwise to ethanol under stirring.",
                "Hydrolyse with acidified water (pH 2) and stir for 2 h to form a sol.",
                "Age the gel for 24 h and dry at 100 C.",
                "Heat at 450 C for 2 h in air."],
         characterization=["XRD", "BET surface area", "Raman spectroscopy"]),
    dict(target="Cu-doped ZIF-8 metal-organic framework", quality=3.0,
         materials=["Zn(NO3)2*6H2O (98%)", "Cu(NO3)2*3H2O (99%)", "2-methylimidazole (99%, Sigma-Aldrich)",
                    "methanol"],
         equipment=["magnetic stirrer", "centrifuge", "vacuum oven"],
         steps=["Dissolve the metal nitrates (Cu:Zn 1:19) in methanol.",
                "Pour into a methanol solution of 2-methylimidazole and stir for 1 h at 25 C.",
                "Collect the solid by centrifugation and wash three times with methanol.",
                "Dry at 60 C under vacuum."],
         characterization=["PXRD", "N2 physisorption", "ICP-OES"]),
    dict(target="Perovskite BaTiO3 powder by solid-state reaction", quality=3.5,
         materials=["BaCO3 (99.8%, Alfa Aesar)", "TiO2 (rutile, 99.9%)", "isopropanol (milling medium)",
                    "polyvinyl alcohol binder"],
         equipment=["ball mill with zirconia media", "box furnace", "hydraulic press"],
         steps=["Ball-mill BaCO3 and TiO2 in isopropanol for 12 h.",
                "Dry and calcine at 1100 C for 4 h.",
                "Press pellets with PVA binder at 200 MPa.",
                "Sinter at 1300 C for 6 h and cool slowly."],
         characterization=["XRD", "SEM", "dielectric spectroscopy"]),
]

# perturbation operators (on the recipe text)
ELEMENTS = [("Li2CO3", "Na2CO3"), ("Fe", "Co"), ("Na2CO3", "K2CO3"), ("Zn(NO3)2", "Mg(NO3)2"), ("Ba", "Sr"),
            ("Ti", "Zr"), ("Cu(NO3)2", "Ni(NO3)2"), ("V", "Cr")]
EQUIPMENT = [("tube furnace", "hot plate"), ("autoclave", "beaker"), ("ball mill", "mortar"),
             ("muffle furnace", "water bath"), ("box furnace", "heat gun"), ("vacuum oven", "fume hood")]
ACTIONS = [("Heat", "Cool"), ("heat", "cool"), ("Dry", "Wet"), ("Dissolve", "Precipitate"), ("dried", "wetted"),
           ("Add", "Remove"), ("Rinse", "Soak")]
TO_FORMULA = [("ethanol", "C2H5OH"), ("methanol", "CH3OH"), ("acetone", "C3H6O"), ("glucose", "C6H12O6"),
              ("isopropanol", "C3H8O"), ("citric acid", "C6H8O7"), ("deionized water", "deionized H2O")]
TO_NAME = [("Li2CO3", "lithium carbonate"), ("Na2CO3", "sodium carbonate"), ("NH4H2PO4",
           "ammonium dihydrogen phosphate"), ("TiO2", "titanium dioxide"), ("BaCO3", "barium carbonate"),
           ("HNO3", "nitric acid"), ("Zn(NO3)2*6H2O", "zinc nitrate hexahydrate"), ("NH4VO3", "ammonium metavanadate")]
TO_IUPAC = [("acetone", "propan-2-one"), ("isopropanol", "propan-2-ol"), ("hexamethylenetetramine",
            "1,3,5,7-tetraazaadamantane"), ("titanium isopropoxide", "titanium(IV) propan-2-olate"),
            ("2-methylimidazole", "2-methyl-1H-imidazole"), ("citric acid", "2-hydroxypropane-1,2,3-tricarboxylic acid"),
            ("ethanol", "ethan-1-ol"), ("glucose", "D-gluco-hexose")]


def recipe_text(recipe: dict) -> str:
    lines = ["## Materials"] + [f"- {m}" for m in recipe["materials"]]
    lines += ["", "## Equipment"] + [f"- {e}" for e in recipe["equipment"]]
    lines += ["", "## Procedure"] + [f"{i}. {s}" for i, s in enumerate(recipe["steps"], 1)]
    lines += ["", "## Characterization"] + [f"- {c}" for c in recipe["characterization"]]
    return "\n".join(lines)


def _replace(text: str, table, limit: int | None) -> tuple[str, int]:
    done = 0
    for old, new in table:
        if limit is not None and done >= limit:
            break
        if old in text:
            text = text.replace(old, new, 1)
            done += 1
    return text, done


def _double_temperatures(text: str, limit: int | None) -> tuple[str, int]:
    count = 0

    def bump(match):
        nonlocal count
        if limit is not None and count >= limit:
            return match.group(0)
        count += 1
        return f"{int(match.group(1)) * 2} C"

    return re.sub(r"(\d+) C\b", bump, text), count


def perturb(text: str, set_name: str) -> tuple[str, int]:
    """The recipe text under a perturbation set, and how many edits were made."""
    rate = int(set_name.rsplit("_", 1)[1].removesuffix("pct"))
    n = None if rate == 100 else {1: 1, 2: 1, 5: 2, 10: 3, 15: 4}[rate]
    if set_name.startswith("element_substitution"):
        return _replace(text, ELEMENTS, None)
    if set_name.startswith("numerical_perturbation"):
        return _double_temperatures(text, None)
    if set_name.startswith("equipment_substitution"):
        return _replace(text, EQUIPMENT, None)
    if set_name.startswith("action_antonym"):
        return _replace(text, ACTIONS, None)
    if set_name.startswith("all_error_perturbation"):
        total = 0
        for op in (lambda t, k: _replace(t, ELEMENTS, k), _double_temperatures,
                   lambda t, k: _replace(t, EQUIPMENT, k), lambda t, k: _replace(t, ACTIONS, k)):
            text, done = op(text, max(1, n // 2))
            total += done
            if total >= n:
                break
        return text, total
    if set_name.startswith("llm_to_formula"):
        return _replace(text, TO_FORMULA, None)
    if set_name.startswith("llm_to_name"):
        return _replace(text, TO_NAME, None)
    if set_name.startswith("llm_to_iupac"):
        return _replace(text, TO_IUPAC, None)
    total = 0  # llm_representational_perturbation: a mix of equivalent rewritings
    for table in (TO_FORMULA, TO_NAME, TO_IUPAC):
        text, done = _replace(text, table, max(1, n // 2))
        total += done
        if total >= n:
            break
    return text, total


def judge_score(rng: random.Random, quality: float, judge: str, set_name: str, category: str) -> float:
    """A judge's overall score: the card's biases, made deterministic."""
    noise = rng.choice((-0.5, 0.0, 0.0, 0.5))
    if category == "represent":
        # the small judges penalise a harmless change of surface form, more for whole-recipe rewrites
        penalty = {"Qwen3-8B": 1.0, "Llama-3.1-8B-Instruct": 1.5, "Qwen3-32B": 0.0, "gemini-2.5-flash": 0.0}[judge]
        if "representational" in set_name:
            penalty *= rng.choice((0.0, 0.5, 1.0))
        score = quality - penalty + noise
    else:
        # the large judges catch injected errors, the small ones often miss them
        catch = {"Qwen3-8B": 0.5, "Llama-3.1-8B-Instruct": 0.15, "Qwen3-32B": 0.85, "gemini-2.5-flash": 0.95}[judge]
        drop = rng.choice((1.5, 2.0, 2.5)) if rng.random() < catch else 0.0
        score = quality - drop + noise
    return min(5.0, max(1.0, round(score * 2) / 2))


def evaluation_text(rng: random.Random, judge: str, recipe: dict, score: float, edits: int, category: str,
                    set_name: str) -> str:
    crit = [min(5.0, max(1.0, score + rng.choice((-0.5, 0.0, 0.5)))) for _ in CRITERIA]
    reasoning = [
        f"The target is {recipe['target']}.",
        f"Materials: the precursor list ({', '.join(m.split(' (')[0] for m in recipe['materials'][:3])}) "
        + ("is consistent with the target." if score >= 3.5 else "contains choices I cannot reconcile with the target."),
        f"Equipment: {', '.join(recipe['equipment'][:2])} "
        + ("are suitable." if score >= 3.0 else "do not match the thermal steps."),
        "Procedure: the steps are ordered and complete." if score >= 3.5
        else "Procedure: some steps look wrong or unsafe for this chemistry.",
        f"Characterization: {', '.join(recipe['characterization'])} cover phase and morphology.",
    ]
    if judge == "Qwen3-8B":
        reasoning.insert(0, "Let me go through the recipe criterion by criterion.")
    scores = dict(zip(CRITERIA, crit))
    body = ",\n".join(f'  "{k}": {v}' for k, v in scores.items())
    if judge == "gemini-2.5-flash" and rng.random() < 0.4:
        # gemini writes its overall score as arithmetic now and then: (a+b)/2 with the same value
        overall = f"({score - 0.5}+{score + 0.5})/2"
    else:
        overall = f"{score}"
    block = "{\n" + body + f',\n  "overall_score": {overall}\n' + "}"
    text = "\n".join(reasoning)
    if judge == "Llama-3.1-8B-Instruct":
        return f"{text}\n\nFinal scores:\n```\n{block}\n```"
    if judge == "Qwen3-32B" and rng.random() < 0.3:
        return f"{text}\n\nScores: {block}"
    return f"{text}\n\n```json\n{block}\n```"


# deliberate defects: (sample, set, judge) -> evaluation text replacing the judge's own
BROKEN = {
    (1, "element_substitution_100pct", "Llama-3.1-8B-Instruct"):
        "The recipe swaps some precursors. Overall I would rate it fairly low, around two out of five.",
    (3, "llm_to_name_100pct", "Qwen3-8B"):
        'Reasoning done.\n\n```json\n{"materials_appropriateness_score": 4, "overall_score": "good"}\n```',
    (2, "numerical_perturbation_100pct", "Qwen3-8B"):
        'The temperatures are off.\n\n```json\n{"materials_appropriateness_score": 7, "overall_score": 7.0}\n```',
    (4, "llm_to_formula_100pct", "Llama-3.1-8B-Instruct"):
        'Formulas instead of names.\n\n```\n{"materials_appropriateness_score": 0, "overall_score": 0}\n```',
}
# score overrides that put a whole group far below the anchor (exercise the anchor filter)
LOW = {
    (0, "action_antonym_100pct"): {"Qwen3-8B": 1.0, "Qwen3-32B": 1.5, "Llama-3.1-8B-Instruct": 1.0,
                                   "gemini-2.5-flash": 1.5},
    (5, "llm_to_iupac_100pct"): {"Qwen3-8B": 1.0, "Qwen3-32B": 1.5, "Llama-3.1-8B-Instruct": 1.0,
                                 "gemini-2.5-flash": 1.0},
}
IDENTICAL = (3, "equipment_substitution_100pct", ("Qwen3-32B", "gemini-2.5-flash"))


def rows() -> list[dict]:
    out = []
    for sample_id, recipe in enumerate(RECIPES):
        base = recipe_text(recipe)
        for set_name in ERROR_SETS + REPRESENT_SETS:
            category = "error" if set_name in ERROR_SETS else "represent"
            text, edits = perturb(base, set_name)
            rate = int(set_name.rsplit("_", 1)[1].removesuffix("pct")) / 100
            prompt = [{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": f"Target material:\n{recipe['target']}\n\n"
                                                  f"AI-generated recipe:\n{text}"}]
            texts = {}
            for judge in JUDGES:
                rng = random.Random(f"panel/{sample_id}/{set_name}/{judge}")
                score = judge_score(rng, recipe["quality"], judge, set_name, category)
                score = LOW.get((sample_id, set_name), {}).get(judge, score)
                texts[judge] = evaluation_text(rng, judge, recipe, score, edits, category, set_name)
            if (sample_id, set_name) == IDENTICAL[:2]:
                first, second = IDENTICAL[2]
                texts[second] = texts[first]
            for judge in JUDGES:
                out.append({
                    "sample_id": sample_id,
                    "perturbation_set": set_name,
                    "perturbation_category": category,
                    "perturbation_rate": rate,
                    "judge_model": judge,
                    "prompt": prompt,
                    "evaluation": BROKEN.get((sample_id, set_name, judge), texts[judge]),
                })
    return out


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    data = rows()
    # gzip with a fixed mtime: the 400 evaluations repeat a lot (860 KB -> 16 KB) and the bytes stay reproducible
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in data)
    with OUT.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    print(f"wrote {len(data)} evaluations to {OUT}")


if __name__ == "__main__":
    main()
