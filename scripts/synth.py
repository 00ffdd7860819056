"""Deterministic synthetic materials-synthesis judge data (JudgeBias-style) and research proposals (Ideation-style).

Used by ``scripts/make_samples.py`` to build the bundled samples and by ``scripts/make_panel.py`` for the judge-panel
sample; not part of the installed package (a user trains on real data, or on the samples these scripts wrote):

    recipe = make_recipe(sample_id=3)
    perturbed, changes = apply_perturbation(recipe, "element_substitution", 1.0, seed=3)
    prompt = judge_prompt(perturbed)                       # [system, user] messages
    text = judge_evaluation(perturbed, changes, overall=2.5, verdict="detect")   # ends in a ```json block

The signal is deliberately learnable by a tiny model: error operators make visible inconsistencies (a foreign
element, a doubled temperature, a hot plate for a calcination, "Cool" where the recipe heats), and the evaluation
wording is consistent: a judge that catches an error writes "Detected error: ...", one that misses it writes "No
errors found", one that accepts a rewrite writes "Equivalent representation: ...", one that penalises it writes
"Penalty: ...". Everything is drawn from ``random.Random`` seeded by the arguments, so reruns are identical.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field

from judgetrain.data.judgebias import ERROR_TYPES, REPRESENT_TYPES, TYPE_CATEGORY, canonical_type

# ------------------------------------------------------------------ vocabulary

JUDGE_MODELS = ("Qwen3-8B", "Qwen3-32B", "Llama-3.1-8B-Instruct", "gemini-2.5-flash")
SUPPLIERS = ("Sigma-Aldrich", "Alfa Aesar", "Merck", "Thermo Fisher", "TCI")
CRITERIA = ("materials_appropriateness_score", "equipment_appropriateness_score", "procedure_completeness_score",
            "procedure_feasibility_score", "characterization_appropriateness_score")

ELEMENTS = {  # symbol -> (name, substitute symbol, substitute name)
    "Li": ("lithium", "Na", "sodium"), "Co": ("cobalt", "Ni", "nickel"), "Ba": ("barium", "Sr", "strontium"),
    "Zn": ("zinc", "Cd", "cadmium"), "Ti": ("titanium", "Zr", "zirconium"), "La": ("lanthanum", "Ce", "cerium"),
    "Mg": ("magnesium", "Ca", "calcium"), "Fe": ("iron", "Mn", "manganese"),
}
EQUIPMENT_SWAP = {"tube furnace": "hot plate", "muffle furnace": "hot plate", "drying oven": "refrigerator",
                  "agate mortar": "glass beaker", "Teflon-lined autoclave": "open beaker",
                  "magnetic stirrer": "ultrasonic bath", "planetary ball mill": "spatula"}
ANTONYMS = {"Heat": "Cool", "Dissolve": "Precipitate", "Dry": "Wet", "Calcine": "Quench", "Mix": "Separate"}
ORGANICS = (  # name, formula, IUPAC name
    ("acetone", "C3H6O", "propan-2-one"), ("isopropanol", "C3H8O", "propan-2-ol"),
    ("ethylene glycol", "C2H6O2", "ethane-1,2-diol"), ("acetic acid", "C2H4O2", "ethanoic acid"),
    ("citric acid", "C6H8O7", "2-hydroxypropane-1,2,3-tricarboxylic acid"), ("ethanol", "C2H6O", "ethan-1-ol"),
    ("oleic acid", "C18H34O2", "(9Z)-octadec-9-enoic acid"), ("glycerol", "C3H8O3", "propane-1,2,3-triol"),
)
TARGETS = (  # name, formula, use, key element, precursors (name, formula), furnace, calcination range
    ("lithium cobalt oxide", "LiCoO2", "a layered cathode for lithium-ion batteries", "Li",
     (("lithium carbonate", "Li2CO3"), ("cobalt(II,III) oxide", "Co3O4")), "tube furnace", (800, 950)),
    ("lithium iron phosphate", "LiFePO4", "an olivine cathode", "Fe",
     (("lithium hydroxide", "LiOH"), ("iron(II) sulfate", "FeSO4"), ("phosphoric acid", "H3PO4")), "tube furnace", (600, 750)),
    ("barium titanate", "BaTiO3", "a ferroelectric ceramic", "Ba",
     (("barium carbonate", "BaCO3"), ("titanium dioxide", "TiO2")), "muffle furnace", (1000, 1200)),
    ("zinc oxide nanoparticles", "ZnO", "a wide-band-gap semiconductor", "Zn",
     (("zinc acetate", "Zn(CH3COO)2"), ("sodium hydroxide", "NaOH")), "muffle furnace", (350, 500)),
    ("anatase titanium dioxide", "TiO2", "a photocatalyst", "Ti",
     (("titanium isopropoxide", "Ti(OC3H7)4"), ("nitric acid", "HNO3")), "muffle furnace", (400, 550)),
    ("lanthanum manganite", "LaMnO3", "a perovskite catalyst", "La",
     (("lanthanum nitrate", "La(NO3)3"), ("manganese nitrate", "Mn(NO3)2")), "muffle furnace", (700, 900)),
    ("magnesium aluminate spinel", "MgAl2O4", "a refractory ceramic", "Mg",
     (("magnesium nitrate", "Mg(NO3)2"), ("aluminium nitrate", "Al(NO3)3")), "muffle furnace", (900, 1100)),
    ("magnetite nanoparticles", "Fe3O4", "a magnetic nanomaterial", "Fe",
     (("iron(III) chloride", "FeCl3"), ("iron(II) chloride", "FeCl2")), "tube furnace", (300, 450)),
)
CHARACTERIZATION = ("XRD for phase purity", "SEM for particle morphology", "TEM for particle size",
                    "BET for surface area", "Raman spectroscopy for bonding", "TGA for thermal stability")

# The perturbation vocabulary is the JudgeBias adapter's: the first type of each category is the combined set,
# the others are single operators.
ERROR_OPERATORS = ERROR_TYPES[1:]
REPRESENT_OPERATORS = REPRESENT_TYPES[1:]
COMBINED = {ERROR_TYPES[0]: ERROR_OPERATORS, REPRESENT_TYPES[0]: REPRESENT_OPERATORS}


# ------------------------------------------------------------------ recipe model

@dataclass
class Material:
    name: str
    formula: str
    iupac: str | None = None
    form: str = "name"  # how the recipe writes it: name | formula | iupac
    purity: str = "99.9%"
    supplier: str = "Sigma-Aldrich"

    @property
    def label(self) -> str:
        return {"name": self.name, "formula": self.formula, "iupac": self.iupac or self.name}[self.form]


@dataclass
class Step:
    verb: str
    materials: list[int]  # indices into Recipe.materials
    rest: str  # object text after the materials, e.g. "in a 1:1 molar ratio"
    tool: str | None = None
    temp: int | None = None
    hours: float | None = None


@dataclass
class Recipe:
    sample_id: int
    target: str
    formula: str
    use: str
    key_element: str
    materials: list[Material]
    equipment: list[str]
    steps: list[Step]
    characterization: list[str]
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Change:
    """One edit an operator made: kind (operator), where (e.g. "step 4"), old and new surface text."""

    kind: str
    where: str
    old: str
    new: str

    def describe(self) -> str:
        what = {
            "element_substitution": "element substitution",
            "numerical_perturbation": "wrong number",
            "equipment_substitution": "wrong equipment",
            "action_antonym": "wrong action",
            "llm_to_formula": "name written as formula",
            "llm_to_name": "formula written as name",
            "llm_to_iupac": "common name written as IUPAC name",
        }[self.kind]
        return f"{what} in {self.where}, {self.old} -> {self.new}"


def _fmt_hours(h: float) -> str:
    return f"{int(h * 60)} min" if h < 1 else f"{h:g} h"


def make_recipe(sample_id: int, seed: int = 0) -> Recipe:
    """A plausible synthesis recipe for one of the bundled target materials, fixed by (sample_id, seed)."""
    rng = random.Random(f"recipe-{seed}-{sample_id}")
    name, formula, use, key, precursors, furnace, (t_lo, t_hi) = TARGETS[sample_id % len(TARGETS)]
    mats = [Material(n, f, None, "name", rng.choice(("99%", "99.5%", "99.9%", "99.99%")), rng.choice(SUPPLIERS))
            for n, f in precursors]
    mats[rng.randrange(len(mats))].form = "formula"  # one precursor by formula, the others by name
    if all(m.form == "formula" for m in mats):
        mats[0].form = "name"
    solvent, binder = rng.sample(ORGANICS, 2)
    for n, f, iu in (solvent, binder):
        mats.append(Material(n, f, iu, "name", rng.choice(("99.5%", "99.8%", "ACS grade")), rng.choice(SUPPLIERS)))
    n_pre = len(precursors)
    s_idx, b_idx = n_pre, n_pre + 1
    calc = rng.randrange(t_lo, t_hi + 1, 25)
    dry = rng.choice((60, 80, 100, 120))
    mixer = rng.choice(("magnetic stirrer", "planetary ball mill"))
    steps = [
        Step("Dissolve", list(range(n_pre)), f"in {{m{s_idx}}} in a stoichiometric ratio", mixer, None, rng.choice((0.5, 1, 2))),
        Step("Mix", [b_idx], "into the solution as a chelating agent", mixer, rng.choice((25, 40, 60)), rng.choice((1, 2, 3))),
        Step("Dry", [], "the gel", "drying oven", dry, rng.choice((4, 6, 12))),
        Step("Grind", [], "the dried precursor", "agate mortar", None, rng.choice((0.25, 0.5))),
        Step("Calcine", [], f"the powder in {rng.choice(('air', 'flowing oxygen', 'argon'))}", furnace, calc, rng.choice((4, 6, 10, 12))),
        Step("Heat", [], "the product again to improve crystallinity", furnace, calc - rng.choice((50, 100)), rng.choice((2, 4))),
    ]
    equipment = ["analytical balance", mixer, "drying oven", "agate mortar", furnace]
    chars = sorted(rng.sample(CHARACTERIZATION, 2), key=CHARACTERIZATION.index)
    return Recipe(sample_id, name, formula, use, key, mats, equipment, steps, chars)


def _step_text(recipe: Recipe, step: Step) -> str:
    names = [recipe.materials[i].label for i in step.materials]
    subject = " and ".join(names)
    rest = step.rest
    for i, m in enumerate(recipe.materials):
        rest = rest.replace(f"{{m{i}}}", m.label)
    parts = [step.verb, subject, rest] if subject else [step.verb, rest]
    text = " ".join(p for p in parts if p)
    if step.tool:
        text += f" using the {step.tool}"
    if step.temp is not None:
        text += f" at {step.temp} °C"
    if step.hours is not None:
        text += f" for {_fmt_hours(step.hours)}"
    return text + "."


def render_recipe(recipe: Recipe) -> str:
    """The markdown recipe a judge reads: materials, equipment, numbered procedure, characterization."""
    lines = ["### Materials"]
    lines += [f"- {m.label} ({m.purity}, {m.supplier})" for m in recipe.materials]
    lines += ["", "### Equipment"] + [f"- {e}" for e in recipe.equipment]
    lines += ["", "### Procedure"] + [f"{i}. {_step_text(recipe, s)}" for i, s in enumerate(recipe.steps, 1)]
    lines += ["", "### Characterization"] + [f"- {c}" for c in recipe.characterization]
    return "\n".join(lines)


def target_description(recipe: Recipe) -> str:
    return f"{recipe.target[0].upper()}{recipe.target[1:]} ({recipe.formula}), {recipe.use}."


SYSTEM_PROMPT = (
    "You are an expert materials scientist judging an AI-generated synthesis recipe for a target material. "
    "Rate the recipe on five criteria, each from 1 to 5 in steps of 0.5: materials appropriateness, equipment "
    "appropriateness, procedure completeness, procedure feasibility and characterization appropriateness. "
    "Reason step by step first. Then end with a fenced ```json block holding the float keys "
    + ", ".join(CRITERIA) + " and overall_score."
)


def user_message(recipe: Recipe) -> str:
    return f"## Target material\n{target_description(recipe)}\n\n## AI-generated recipe\n{render_recipe(recipe)}"


def judge_prompt(recipe: Recipe) -> list[dict]:
    """[system rubric, user request] messages for judging ``recipe``."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_message(recipe)}]


# ------------------------------------------------------------------ perturbation operators (mutate a copy)

def _element_substitution(recipe: Recipe, rng: random.Random) -> list[Change]:
    key = recipe.key_element
    name, sub, sub_name = ELEMENTS[key]
    cands = [m for m in recipe.materials if key in m.formula and m.iupac is None]
    m = rng.choice(cands)
    old = m.label
    m.formula = m.formula.replace(key, sub)
    m.name = m.name.replace(name, sub_name)
    return [Change("element_substitution", "the materials", old, m.label)]


def _numerical_perturbation(recipe: Recipe, rng: random.Random) -> list[Change]:
    i = rng.choice([i for i, s in enumerate(recipe.steps) if s.temp is not None])
    step = recipe.steps[i]
    old = step.temp
    step.temp = old * 10 if old < 200 else old * 2  # 60 -> 600 °C, 850 -> 1700 °C
    return [Change("numerical_perturbation", f"step {i + 1}", f"{old} °C", f"{step.temp} °C")]


def _equipment_substitution(recipe: Recipe, rng: random.Random) -> list[Change]:
    tool = rng.choice([e for e in recipe.equipment if e in EQUIPMENT_SWAP])
    new = EQUIPMENT_SWAP[tool]
    recipe.equipment = [new if e == tool else e for e in recipe.equipment]
    where = [i + 1 for i, s in enumerate(recipe.steps) if s.tool == tool]
    for s in recipe.steps:
        if s.tool == tool:
            s.tool = new
    return [Change("equipment_substitution", f"step {where[0]}" if where else "the equipment list", tool, new)]


def _action_antonym(recipe: Recipe, rng: random.Random) -> list[Change]:
    i = rng.choice([i for i, s in enumerate(recipe.steps) if s.verb in ANTONYMS])
    step = recipe.steps[i]
    old, step.verb = step.verb, ANTONYMS[step.verb]
    return [Change("action_antonym", f"step {i + 1}", old, step.verb)]


def _rewrite(recipe: Recipe, rng: random.Random, kind: str, src: str, dst: str, k: int | None) -> list[Change]:
    cands = [m for m in recipe.materials if m.form == src and (dst != "iupac" or m.iupac)]
    if dst == "formula":
        cands = [m for m in recipe.materials if m.form in ("name", "iupac")]
    if not cands:
        return []
    picked = cands if k is None else rng.sample(cands, min(k, len(cands)))
    changes = []
    for m in picked:
        old = m.label
        m.form = dst
        changes.append(Change(kind, "the materials", old, m.label))
    return changes


def _to_formula(recipe: Recipe, rng: random.Random, k: int | None = None) -> list[Change]:
    return _rewrite(recipe, rng, "llm_to_formula", "name", "formula", k)


def _to_name(recipe: Recipe, rng: random.Random, k: int | None = None) -> list[Change]:
    return _rewrite(recipe, rng, "llm_to_name", "formula", "name", k)


def _to_iupac(recipe: Recipe, rng: random.Random, k: int | None = None) -> list[Change]:
    return _rewrite(recipe, rng, "llm_to_iupac", "name", "iupac", k)


OPERATORS = {
    "element_substitution": _element_substitution,
    "numerical_perturbation": _numerical_perturbation,
    "equipment_substitution": _equipment_substitution,
    "action_antonym": _action_antonym,
    "llm_to_formula": _to_formula,
    "llm_to_name": _to_name,
    "llm_to_iupac": _to_iupac,
}
if set(OPERATORS) != {*ERROR_OPERATORS, *REPRESENT_OPERATORS}:
    raise ImportError("every single perturbation type of the JudgeBias adapter needs an operator here")


def n_edits(rate: float) -> int:
    """Edits a combined set makes at a perturbation rate (1% -> 1 ... 15% -> 3)."""
    return 1 if rate < 0.05 else 2 if rate < 0.15 else 3


def apply_perturbation(recipe: Recipe, perturbation_type: str, rate: float = 1.0, *, seed: int = 0) -> tuple[Recipe, list[Change]]:
    """A perturbed copy of ``recipe`` and the changes made.

    Single operators (element_substitution, ..., llm_to_iupac) are applied at rate 1.0 (every eligible spot for
    the representational rewrites); the combined sets (all_error_perturbation / all_error_injection,
    llm_representational_perturbation / all_equivalence_rewriting) apply :func:`n_edits` (rate) edits, each one
    a different operator drawn with the seed. The 17 perturbation sets are these types at their rates.
    """
    ptype = canonical_type(perturbation_type)
    rng = random.Random(f"perturb-{seed}-{recipe.sample_id}-{ptype}-{rate}")
    out = copy.deepcopy(recipe)
    if ptype in COMBINED:
        ops = list(COMBINED[ptype])
        rng.shuffle(ops)
        changes: list[Change] = []
        for op in ops:
            if len(changes) >= n_edits(rate):
                break
            changes += OPERATORS[op](out, rng, 1) if op in REPRESENT_OPERATORS else OPERATORS[op](out, rng)
        return out, changes
    return out, OPERATORS[ptype](out, rng)


# ------------------------------------------------------------------ judge evaluations

AFFECTED = {"element_substitution": 0, "llm_to_formula": 0, "llm_to_name": 0, "llm_to_iupac": 0,
            "equipment_substitution": 1, "numerical_perturbation": 3, "action_antonym": 3}


def criteria_scores(overall: float, changes: list[Change] = (), lowered: bool = False) -> dict[str, float]:
    """Five criteria scores around ``overall``; criteria touched by ``changes`` sit 0.5 lower when ``lowered``."""
    scores = {c: overall for c in CRITERIA}
    if lowered:
        for ch in changes:
            c = CRITERIA[AFFECTED[ch.kind]]
            scores[c] = max(1.0, overall - 0.5)
        if overall < 5.0:
            scores[CRITERIA[4]] = min(5.0, overall + 0.5)  # characterization is untouched by every operator
    scores["overall_score"] = overall
    return scores


VERDICTS = ("detect", "miss", "equivalent", "penalize")
LOWERING_VERDICTS = ("detect", "penalize")  # the verdicts whose criteria sit lower


def judge_reasoning(recipe: Recipe, changes: list[Change], verdict: str) -> list[str]:
    """The reasoning lines of a judge's evaluation, before its scores.

    verdict: ``detect`` (names each injected error, scores low), ``miss`` (finds no error), ``equivalent``
    (names each rewrite as an equivalent representation, keeps the score), ``penalize`` (treats a rewrite as a
    wrong material and lowers the score).
    """
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}")
    mats = ", ".join(m.label for m in recipe.materials[:2])
    lines = [
        f"Materials: {mats} are considered as precursors for {recipe.formula}.",
        f"Equipment: {', '.join(recipe.equipment[-2:])} are listed for the key steps.",
        f"Procedure: {len(recipe.steps)} numbered steps from mixing to calcination.",
        f"Characterization: {' and '.join(c.split(' for ')[0] for c in recipe.characterization)} suit the target.",
    ]
    if verdict == "detect":
        lines += [f"Detected error: {ch.describe()}." for ch in changes]
        lines.append("This is a real scientific error, so the affected criteria are lowered.")
    elif verdict == "miss":
        lines.append("No errors found: the recipe is consistent and feasible as written.")
    elif verdict == "equivalent":
        lines += [f"Equivalent representation: {ch.old} is written as {ch.new}, the same substance." for ch in changes]
        lines.append("The meaning is unchanged, so no penalty is applied.")
    else:
        lines += [f"Penalty: {ch.new} is not the expected {ch.old}, so it looks like a wrong material." for ch in changes]
        lines.append("The unfamiliar notation is treated as a mistake and the score is lowered.")
    return lines


def judge_evaluation(recipe: Recipe, changes: list[Change], overall: float, verdict: str) -> str:
    """A judge's evaluation text (:func:`judge_reasoning`) ending in a fenced ```json block with the five criteria
    and overall_score."""
    lines = judge_reasoning(recipe, changes, verdict)
    scores = criteria_scores(overall, changes, lowered=verdict in LOWERING_VERDICTS)
    block = json.dumps(scores, indent=2)
    return "\n".join(lines) + f"\n\n```json\n{block}\n```"


def evaluation_messages(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


# ------------------------------------------------------------------ JudgeBias-schema rows

def judgebias_row(sample_id: int, perturbation_type: str, rate: float, *, seed: int = 0) -> dict:
    """One row in the exact hub schema (prompt/chosen/rejected as JSON strings) for a sample and perturbation set."""
    rng = random.Random(f"row-{seed}-{sample_id}-{perturbation_type}-{rate}")
    recipe = make_recipe(sample_id, seed)
    perturbed, changes = apply_perturbation(recipe, perturbation_type, rate, seed=seed)
    category = TYPE_CATEGORY[canonical_type(perturbation_type)]
    anchor = rng.choice((3.5, 4.0, 4.0, 4.5))
    delta = rng.choice((1.0, 1.5, 2.0))
    if category == "error":
        score_rejected = min(5.0, anchor + rng.choice((0.0, 0.5)))
        score_chosen = score_rejected - delta
        chosen = judge_evaluation(perturbed, changes, score_chosen, "detect")
        rejected = judge_evaluation(perturbed, changes, score_rejected, "miss")
    else:
        score_chosen = anchor
        score_rejected = anchor - delta
        chosen = judge_evaluation(perturbed, changes, score_chosen, "equivalent")
        rejected = judge_evaluation(perturbed, changes, score_rejected, "penalize")
    chosen_model, rejected_model = rng.sample(JUDGE_MODELS, 2)
    return {
        "prompt": json.dumps(judge_prompt(perturbed), ensure_ascii=False),
        "chosen": json.dumps(evaluation_messages(chosen), ensure_ascii=False),
        "rejected": json.dumps(evaluation_messages(rejected), ensure_ascii=False),
        "score_chosen": float(score_chosen),
        "score_rejected": float(score_rejected),
        "score_delta": float(abs(score_chosen - score_rejected)),
        "anchor_score": float(anchor),
        "sample_id": int(sample_id),
        "perturbation_type": perturbation_type,
        "perturbation_category": category,
        "perturbation_rate": float(rate),
        "chosen_model": chosen_model,
        "rejected_model": rejected_model,
    }


# ------------------------------------------------------------------ Ideation-schema rows

IDEATION_INSTRUCTION = (
    "You are a research scientist. Read the literature context below and write a short research proposal: "
    "state a hypothesis, the experiment that tests it, and the expected measurable outcome."
)
TOPICS = (
    ("sodium-ion cathodes", "layered oxides lose capacity after 200 cycles", "cobalt-free dopants", "capacity retention after 500 cycles", "coin cells"),
    ("perovskite solar cells", "moisture degrades the absorber within weeks", "a fluorinated capping layer", "efficiency after 1000 h at 85% humidity", "encapsulated devices"),
    ("protein language models", "embeddings miss long-range contacts", "contact-aware pretraining", "contact precision on CASP15 targets", "a 150M-parameter model"),
    ("graph neural networks", "message passing oversmooths deep layers", "residual gating", "node accuracy at 32 layers", "the ogbn-arxiv benchmark"),
    ("CO2 electroreduction", "copper catalysts drift toward hydrogen", "a tin-copper alloy surface", "formate Faradaic efficiency", "a flow cell at 200 mA/cm2"),
    ("soil microbiomes", "drought shifts community composition", "biochar amendment", "microbial respiration after rewetting", "field plots over two seasons"),
    ("retrieval-augmented generation", "retrieved passages are often ignored", "passage-attribution training", "answer accuracy on multi-hop questions", "a 7B model"),
    ("solid-state electrolytes", "lithium dendrites short thin pellets", "an interlayer of lithium nitride", "critical current density", "symmetric cells"),
    ("coral reef restoration", "heat stress bleaches transplanted fragments", "heat-tolerant symbiont strains", "fragment survival after one summer", "nursery tanks"),
    ("speech recognition", "accuracy drops on accented speech", "accent-balanced fine-tuning", "word error rate per accent group", "a public multi-accent corpus"),
    ("quantum dot LEDs", "blue devices burn out quickly", "a graded shell", "half-life at 1000 cd/m2", "inkjet-printed pixels"),
    ("urban heat islands", "dark roofs raise night temperatures", "reflective roof coatings", "indoor night temperature", "paired houses"),
)
GENERATORS = ("ideagen-alpha", "ideagen-beta", "ideagen-gamma", "ideagen-delta")


def ideation_prompt(topic: tuple) -> str:
    area, problem, *_ = topic
    return f"{IDEATION_INSTRUCTION}\n\nLiterature context: Recent work on {area} reports that {problem}. Existing fixes trade performance for stability."


def specific_proposal(topic: tuple, rng: random.Random) -> str:
    area, problem, idea, metric, setup = topic
    gain = rng.choice((15, 20, 25, 30, 40))
    return (f"Hypothesis: {idea} addresses the finding that {problem}, improving {metric} by at least {gain}%. "
            f"Experiment: compare {idea} against the standard baseline in {setup}, with three replicates and one ablation. "
            f"Expected outcome: a measurable gain in {metric}; a gain below {gain // 2}% would falsify the hypothesis.")


def vague_proposal(topic: tuple, rng: random.Random) -> str:
    area, *_ = topic
    verb = rng.choice(("explore", "investigate", "look into", "study"))
    return (f"We will {verb} new ideas in {area} and try various approaches to see what happens. "
            f"Many methods could be interesting, and the results may be useful for the field in general. "
            f"Further work will decide the details later.")


def ideation_rows(n_pairs: int, split: str, *, seed: int = 0, start: int = 0, shares_test_every: int = 0) -> list[dict]:
    """Rows in the research-ideation-arena-si-rm schema (core + provenance fields).

    The human-preferred proposal is the specific, testable one; the other is vague. Rows of the same topic and
    block of three share a ``split_group_id``; with ``shares_test_every`` = k every k-th group is flagged
    ``shares_test_group`` (train only).
    """
    rows = []
    for j in range(start, start + n_pairs):
        rng = random.Random(f"ideation-{seed}-{split}-{j}")
        topic = TOPICS[j % len(TOPICS)]
        good, bad = specific_proposal(topic, rng), vague_proposal(topic, rng)
        group = j // 3
        swapped = rng.random() < 0.5
        response_a, response_b = (bad, good) if swapped else (good, bad)
        gen_a, gen_b = rng.sample(GENERATORS, 2)
        pref = "B" if swapped else "A"
        shares = bool(split == "train" and shares_test_every and group % shares_test_every == 0)
        rows.append({
            "sample_id": f"{split}-{j:05d}",
            "source_dataset": "research-ideation-arena",
            "category": rng.choice(("materials", "biology", "machine learning", "climate")),
            "task": "research_proposal",
            "split": split,
            "prompt": ideation_prompt(topic),
            "chosen": good,
            "rejected": bad,
            "response_a": response_a,
            "response_b": response_b,
            "human_preference": pref,
            "source_record_indices": [j * 2, j * 2 + 1],
            "source_record_index": j * 2,
            "source_dimension_results": json.dumps({"D0": pref}),
            "source_human_preference": pref,
            "context_id": f"ctx-{split}-{j % len(TOPICS):03d}-{group:04d}",
            "split_group_id": f"grp-{split}-{group:04d}",
            "position_swapped": swapped,
            "generator_a": gen_a,
            "generator_b": gen_b,
            "shares_test_group": shares,
        })
    return rows
