"""Write the bundled judge-panel sample: judgetrain/data/samples/panel/evaluations.jsonl.gz (gzip, mtime 0).

    python scripts/make_panel.py                # rewrites the file; the output is byte-for-byte deterministic
    python scripts/make_panel.py --out x.jsonl.gz

6 synthetic synthesis recipes x the 17 perturbation sets of JudgeBias-DPO-RefFree x 4 judges = 408 rows in the
input schema of `judgetrain pairs build`. Recipes, perturbations and evaluation wording come from scripts/synth.py
(the generator of the JudgeBias sample), the perturbation sets from the JudgeBias adapter. Judges differ the way
the card describes real ones: some penalise a harmless change of surface form (formula instead of name), some miss
injected errors, so pairs exist in both categories; each writes its scores in its own format. A few rows are
deliberately bad (no score, a word as score, scores of 0 and 7) to exercise the rejects file, two judges write a
byte-identical evaluation once (deduplication), and two groups of scores sit far below the anchor (anchor filter).
All text is synthetic, written for this sample.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

from judgetrain.data.judgebias import PERTURBATION_SETS, TYPE_CATEGORY, perturbation_set

import synth  # scripts/synth.py, beside this script

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "judgetrain" / "data" / "samples" / "panel" / "evaluations.jsonl.gz"
N_SAMPLES = 6
# the score a careful judge gives sample i's unperturbed recipe
QUALITY = (4.5, 4.0, 3.5, 4.0, 3.0, 3.5)
# the card's biases: small judges penalise a harmless rewrite (by this much) and miss injected errors (catch rate)
PENALTY = {"Qwen3-8B": 1.0, "Llama-3.1-8B-Instruct": 1.5, "Qwen3-32B": 0.0, "gemini-2.5-flash": 0.0}
CATCH = {"Qwen3-8B": 0.5, "Llama-3.1-8B-Instruct": 0.15, "Qwen3-32B": 0.85, "gemini-2.5-flash": 0.95}
# each judge's voice: an opening line, and (below) its score format, so that two judges rarely write the same text
OPENING = {"Qwen3-8B": ["Let me go through the recipe criterion by criterion."],
           "gemini-2.5-flash": ["Here is my assessment of the recipe."]}


def judge_verdict(rng: random.Random, quality: float, judge: str, set_name: str, category: str) -> tuple[float, str]:
    """A judge's overall score and its verdict (a :data:`synth.VERDICTS` word): the card's biases, deterministic."""
    noise = rng.choice((-0.5, 0.0, 0.0, 0.5))
    if category == "represent":
        penalty = PENALTY[judge]
        if "representational" in set_name:  # less for a few rewrites than for a whole-recipe rewrite
            penalty *= rng.choice((0.0, 0.5, 1.0))
        score, verdict = quality - penalty + noise, "penalize" if penalty else "equivalent"
    else:
        drop = rng.choice((1.5, 2.0, 2.5)) if rng.random() < CATCH[judge] else 0.0
        score, verdict = quality - drop + noise, "detect" if drop else "miss"
    return min(5.0, max(1.0, round(score * 2) / 2)), verdict


def score_block(rng: random.Random, judge: str, score: float, changes: list, verdict: str) -> str:
    """The judge's scores as a JSON-like block, each criterion within half a point of the generator's;
    gemini writes its overall score as arithmetic now and then."""
    criteria = synth.criteria_scores(score, changes, lowered=verdict in synth.LOWERING_VERDICTS)
    overall = criteria.pop("overall_score")
    criteria = {k: min(5.0, max(1.0, v + rng.choice((-0.5, 0.0, 0.5)))) for k, v in criteria.items()}
    if judge == "gemini-2.5-flash" and rng.random() < 0.4:
        overall = f"({overall - 0.5}+{overall + 0.5})/2"
    body = ",\n".join(f'  "{k}": {v}' for k, v in criteria.items())
    return "{\n" + body + f',\n  "overall_score": {overall}\n' + "}"


def evaluation_text(rng: random.Random, judge: str, recipe: synth.Recipe, changes: list, score: float,
                    verdict: str) -> str:
    """The judge's reasoning, then its scores in the judge's own format (a fenced json block, a bare fence, or none)."""
    reasoning = OPENING.get(judge, []) + synth.judge_reasoning(recipe, changes, verdict)
    text, block = "\n".join(reasoning), score_block(rng, judge, score, changes, verdict)
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


def group_rows(sample_id: int, ptype: str, rate: float) -> list[dict]:
    """The four judges' rows for one sample under one perturbation set."""
    set_name, category = perturbation_set(ptype, rate), TYPE_CATEGORY[ptype]
    recipe, changes = synth.apply_perturbation(synth.make_recipe(sample_id), ptype, rate)
    texts = {}
    for judge in synth.JUDGE_MODELS:
        rng = random.Random(f"panel/{sample_id}/{set_name}/{judge}")
        score, verdict = judge_verdict(rng, QUALITY[sample_id], judge, set_name, category)
        score = LOW.get((sample_id, set_name), {}).get(judge, score)
        texts[judge] = evaluation_text(rng, judge, recipe, changes, score, verdict)
    if (sample_id, set_name) == IDENTICAL[:2]:
        first, second = IDENTICAL[2]
        texts[second] = texts[first]
    return [{"sample_id": sample_id, "perturbation_set": set_name, "perturbation_category": category,
             "perturbation_rate": rate, "judge_model": judge, "prompt": synth.judge_prompt(recipe),
             "evaluation": BROKEN.get((sample_id, set_name, judge), texts[judge])} for judge in synth.JUDGE_MODELS]


def rows() -> list[dict]:
    return [row for sample_id in range(N_SAMPLES) for ptype, rate in PERTURBATION_SETS
            for row in group_rows(sample_id, ptype, rate)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    out = parser.parse_args(argv).out
    out.parent.mkdir(parents=True, exist_ok=True)
    data = rows()
    # gzip with a fixed mtime: the evaluations repeat a lot and the bytes stay reproducible
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in data)
    with out.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    print(f"wrote {len(data)} evaluations to {out}")


if __name__ == "__main__":
    main()
