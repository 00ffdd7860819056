"""Generated source texts that are not one template filled in: each sample draws its own sections, their order and
form (a list, a sentence, nothing), the voice of its procedure (imperative or passive, numbered or prose), the
phrasing of every step among several, its optional steps, its numbers and its units. Used by
``scripts/make_samples.py --only synthesis cooking`` for the source samples of the ``synthesis`` and ``cooking``
packs of `judgetrain perturb`:

    target, text = synthesis_recipe(sample_id=3, seed=0)
    dish, text = cooking_recipe(sample_id=3, seed=0)

The words the packs' error types swap (equipment, elements, precursors, an action and its opposite, units) all recur
across samples, so an error copy's replacement is always one that other samples use. Seeded by the arguments: a
rerun writes identical texts.
"""

from __future__ import annotations

import random

from synth import ORGANICS, SUPPLIERS, TARGETS

# ------------------------------------------------------------------ synthesis recipes

HYDROTHERMAL = {"zinc oxide nanoparticles", "anatase titanium dioxide", "magnetite nanoparticles"}
SOLVENTS = [o for o in ORGANICS if o[0] in ("acetone", "isopropanol", "ethanol", "ethylene glycol")]
CHELATORS = [o for o in ORGANICS if o[0] in ("citric acid", "glycerol", "acetic acid")]
ATMOSPHERES = ("air", "flowing oxygen", "argon", "nitrogen")
CHARACTERIZATION = ("XRD", "SEM", "TEM", "BET surface area analysis", "Raman spectroscopy", "TGA")


def _time(rng: random.Random, choices: tuple[str, ...]) -> str:
    return rng.choice(choices)


def synthesis_recipe(sample_id: int, seed: int = 0) -> tuple[str, str]:
    """(the target as the prompt names it, the recipe's text)."""
    rng = random.Random(f"varied-synthesis-{seed}-{sample_id}")
    name, formula, use, _key, precursors, furnace, (t_lo, t_hi) = TARGETS[rng.randrange(len(TARGETS))]
    solvent, chelator = rng.choice(SOLVENTS), rng.choice(CHELATORS)
    formula_form = rng.random() < 0.3
    labels = [f if formula_form and rng.random() < 0.5 else n for n, f in precursors]
    masses = [rng.choice(("0.5 g", "1.0 g", "1.5 g", "2.0 g", "150 mg", "250 mg", "500 mg", "750 mg"))
              for _ in precursors]
    voice = rng.choice(("imperative", "imperative", "passive"))
    hydro = name in HYDROTHERMAL and rng.random() < 0.5
    calc = rng.randrange(t_lo, t_hi + 1, 25)
    steps = _synthesis_steps(rng, voice, labels, masses, solvent[0], chelator[0], furnace, calc, hydro)
    sections = []
    title = rng.choice((f"# Synthesis of {name}", f"## {name[0].upper()}{name[1:]} ({formula})",
                        f"**Recipe: {name} ({formula})**", f"Target: {name}", None))
    if title:
        sections.append(title)
    if rng.random() < 0.5:
        sections.append(rng.choice((f"This recipe gives {name} ({formula}), {use}.",
                                    f"The product is {use}.",
                                    f"{formula} is made here by a {'hydrothermal' if hydro else 'sol-gel'} route.")))
    sections.append(_materials(rng, labels, masses, solvent[0], chelator[0]))
    equipment = _equipment(rng, steps)
    procedure = _procedure(rng, steps, voice)
    characterization = _characterization(rng, voice)
    body = [procedure, characterization] if rng.random() < 0.7 else [characterization, procedure]
    if equipment:
        body.insert(rng.randrange(2), equipment)
    sections += [b for b in body if b]
    target = f"{name[0].upper()}{name[1:]} ({formula}), {use}."
    return target, "\n\n".join(sections)


def _synthesis_steps(rng, voice, labels, masses, solvent, chelator, furnace, calc, hydro) -> list[tuple[str, str]]:
    """(the step's equipment, its sentence) in order, each sentence one of several phrasings in the sample's voice."""
    imp = voice == "imperative"
    mixer, pace = rng.choice(("magnetic stirrer", "hot plate")), rng.choice(("slowly", "rapidly"))
    amounts = " and ".join(f"{m} of {l}" for m, l in zip(masses, labels))
    volume = rng.choice(("20 mL", "50 mL", "100 mL"))
    stir_t, stir_time = rng.choice((25, 40, 60, 80)), _time(rng, ("30 min", "1 h", "2 h", "45 min"))
    steps = [("", rng.choice((f"Dissolve {amounts} in {volume} of {solvent}.",
                              f"Weigh {amounts} and dissolve them in {volume} of {solvent}.",
                              f"Add {amounts} to {volume} of {solvent} and stir until dissolved."))
              if imp else f"{amounts[0].upper()}{amounts[1:]} were dissolved in {volume} of {solvent}.")]
    if rng.random() < 0.5:
        steps.append(("ultrasonic bath", rng.choice((f"Sonicate the solution in the ultrasonic bath for "
                                                     f"{_time(rng, ('5 min', '10 min', '15 min'))}.",)) if imp else
                      f"The solution was treated in the ultrasonic bath for {_time(rng, ('5 min', '10 min'))}."))
    steps.append((mixer, rng.choice((f"Add {chelator} {pace} and stir on the {mixer} at {stir_t} °C for {stir_time}.",
                                     f"Using the {mixer}, mix in {chelator} at {stir_t} °C for {stir_time}.",
                                     f"Stir the mixture with {chelator} on the {mixer} for {stir_time} at {stir_t} °C."))
                  if imp else f"{chelator[0].upper()}{chelator[1:]} was added {pace} and the mixture was stirred "
                              f"on the {mixer} at {stir_t} °C for {stir_time}."))
    if hydro:
        ht, hh = rng.choice((120, 150, 180, 200)), _time(rng, ("6 h", "12 h", "24 h"))
        steps.append(("Teflon-lined autoclave", f"Seal the mixture in a Teflon-lined autoclave and heat it at {ht} °C "
                      f"for {hh}." if imp else f"The mixture was sealed in a Teflon-lined autoclave and heated at "
                      f"{ht} °C for {hh}."))
        steps.append(("centrifuge", rng.choice(("Collect the product with the centrifuge and wash it with water.",
                                                "Wash the product with water after the centrifuge.")) if imp else
                      "The product was collected with the centrifuge and washed with water."))
    oven, dry_t = rng.choice(("drying oven", "drying oven", "vacuum oven")), rng.choice((60, 80, 100, 120))
    dry_h = _time(rng, ("4 h", "12 h", "90 min", "120 min"))
    steps.append((oven, rng.choice((f"Dry the gel in the {oven} at {dry_t} °C for {dry_h}.",
                                    f"Transfer the gel to the {oven} and dry it at {dry_t} °C for {dry_h}."))
                  if imp else f"The gel was dried in the {oven} at {dry_t} °C for {dry_h}."))
    grinder = rng.choice(("agate mortar", "planetary ball mill"))
    steps.append((grinder, rng.choice((f"Grind the dried powder in the {grinder} for "
                                       f"{_time(rng, ('10 min', '15 min', '30 min'))}.",
                                       f"Use the {grinder} to grind the powder.")) if imp else
                  f"The powder was ground in the {grinder} for {_time(rng, ('10 min', '15 min', '30 min'))}."))
    atm, hold = rng.choice(ATMOSPHERES), _time(rng, ("2 h", "4 h", "6 h", "90 min", "120 min", "180 min"))
    rate = rng.choice((2, 5, 10))
    steps.append((furnace, rng.choice((f"Calcine the powder in the {furnace} at {calc} °C for {hold} in {atm}.",
                                       f"Heat the powder in the {furnace} to {calc} °C at {rate} °C/min and hold "
                                       f"for {hold} in {atm}.",
                                       f"Transfer the powder to the {furnace} and heat it at {calc} °C for {hold} "
                                       f"under {atm}.")) if imp else
                  rng.choice((f"The powder was calcined in the {furnace} at {calc} °C for {hold} in {atm}.",
                              f"The powder was heated to {calc} °C in the {furnace} and held for {hold} under {atm}."))))
    steps.append((furnace, rng.choice(("Cool the furnace slowly to room temperature.", "Cool the sample rapidly.",
                                       "Let the sample cool to room temperature before grinding it again.",
                                       "After heating, cool the powder rapidly in air.",
                                       "Allow slow cooling to room temperature.")) if imp else
                  rng.choice(("The furnace was cooled slowly to room temperature.",
                              "The sample was cooled rapidly after heating.",
                              "After cooling, the powder was ground again."))))
    if rng.random() < 0.5:
        again = calc - rng.choice((50, 100))
        steps.append((furnace, f"Heat the product again at {again} °C for {_time(rng, ('2 h', '4 h', '60 min'))} "
                      f"to improve crystallinity." if imp else
                      f"The product was heated again at {again} °C to improve crystallinity."))
    return steps


def _materials(rng, labels, masses, solvent, chelator) -> str:
    reagents = [(l, m) for l, m in zip(labels, masses)] + [(solvent, None), (chelator, None)]
    form = rng.choice(("list", "list", "sentence"))
    if form == "sentence":
        names = ", ".join(l for l, _ in reagents[:-1]) + f" and {reagents[-1][0]}"
        return rng.choice((f"Reagents: {names}, used as received.",
                           f"All reagents ({names}) were bought from {rng.choice(SUPPLIERS)}."))
    head = rng.choice(("### Materials", "Materials:", "**Reagents**", "## Chemicals"))
    lines = [f"- {l} ({rng.choice(('99%', '99.5%', '99.9%'))}, {rng.choice(SUPPLIERS)})" if rng.random() < 0.6
             else f"- {l}" for l, _ in reagents]
    return "\n".join([head, *lines])


def _equipment(rng, steps) -> str | None:
    tools = list(dict.fromkeys(t for t, _ in steps if t))
    form = rng.choice(("list", "sentence", None))
    if form is None:
        return None
    if form == "sentence":
        return f"Equipment: {', '.join(tools)}."
    return "\n".join([rng.choice(("### Equipment", "Equipment:", "**Apparatus**")), *(f"- {t}" for t in tools)])


def _procedure(rng, steps, voice) -> str:
    sentences = [s for _, s in steps]
    head = rng.choice(("### Procedure", "Procedure:", "## Method", "**Steps**", None))
    if rng.random() < 0.65:
        body = "\n".join(f"{i}. {s}" for i, s in enumerate(sentences, 1))
    else:
        cut = rng.randrange(2, len(sentences) - 1)
        body = " ".join(sentences[:cut]) + "\n\n" + " ".join(sentences[cut:])
    return f"{head}\n{body}" if head else body


def _characterization(rng, voice) -> str | None:
    picked = rng.sample(CHARACTERIZATION, rng.choice((1, 2, 3)))
    form = rng.choice(("list", "sentence", "sentence", None))
    if form is None:
        return None
    if form == "list":
        return "\n".join([rng.choice(("### Characterization", "Characterization:")), *(f"- {c}" for c in picked)])
    joined = ", ".join(picked[:-1]) + (" and " if len(picked) > 1 else "") + picked[-1]
    return rng.choice((f"Check the product by {joined}." if voice == "imperative" else
                       f"The product was checked by {joined}.", f"Characterization: {joined}."))


# ------------------------------------------------------------------ cooking recipes

DISHES = {  # dish -> (its main ingredients, the vessel it cooks in, oven (°C, min range) or None)
    "banana bread": (("flour", "sugar", "butter", "eggs", "bananas", "baking soda"), "loaf tin", (170, 190)),
    "pancakes": (("flour", "milk", "eggs", "sugar", "butter", "baking powder"), "frying pan", None),
    "tomato soup": (("tomatoes", "onion", "garlic", "olive oil", "stock", "salt"), "saucepan", None),
    "chocolate cookies": (("flour", "sugar", "butter", "eggs", "cocoa", "baking soda"), "baking tray", (175, 190)),
    "roast chicken": (("chicken", "olive oil", "garlic", "lemon", "salt", "pepper"), "roasting tin", (190, 220)),
    "vegetable curry": (("onion", "garlic", "curry paste", "coconut milk", "potatoes", "rice"), "saucepan", None),
    "mushroom risotto": (("rice", "mushrooms", "onion", "butter", "stock", "parmesan"), "saucepan", None),
    "apple crumble": (("apples", "flour", "butter", "sugar", "oats", "cinnamon"), "baking dish", (180, 200)),
}
UNITS = {"flour": ("g",), "sugar": ("g", "tbsp"), "butter": ("g", "tbsp"), "milk": ("mL",), "stock": ("mL", "L"),
         "olive oil": ("tbsp", "tsp", "mL"), "salt": ("tsp",), "pepper": ("tsp",), "baking soda": ("tsp",),
         "baking powder": ("tsp",), "cocoa": ("g", "tbsp"), "rice": ("g",), "oats": ("g",), "cinnamon": ("tsp",),
         "curry paste": ("tbsp",), "coconut milk": ("mL",), "parmesan": ("g",), "mushrooms": ("g",)}
AMOUNTS = {"g": (50, 100, 150, 200, 250, 300, 400, 500), "mL": (100, 200, 250, 400, 500), "L": (1, 2),
           "tbsp": (1, 2, 3), "tsp": (1, 2)}


def cooking_recipe(sample_id: int, seed: int = 0) -> tuple[str, str]:
    """(the dish, the recipe's text)."""
    rng = random.Random(f"varied-cooking-{seed}-{sample_id}")
    dish = rng.choice(sorted(DISHES))
    ingredients, vessel, oven = DISHES[dish]
    lines = []
    for ing in ingredients:
        unit = rng.choice(UNITS.get(ing, ("",)))
        amount = f"{rng.choice(AMOUNTS[unit])} {unit} " if unit else rng.choice(("2 ", "3 ", "1 ", ""))
        lines.append(f"{amount}{ing}" if unit or amount else ing)
    steps = _cooking_steps(rng, ingredients, vessel, oven)
    head = rng.choice((f"# {dish[0].upper()}{dish[1:]}", f"**{dish.title()}**", f"Recipe for {dish}", None))
    listing = rng.choice(("list", "sentence"))
    ing_text = ("\n".join([rng.choice(("Ingredients:", "## Ingredients", "You need:")), *(f"- {l}" for l in lines)])
                if listing == "list" else f"You need {', '.join(lines[:-1])} and {lines[-1]}.")
    if rng.random() < 0.6:
        method = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
    else:
        method = " ".join(steps)
    method_head = rng.choice(("Method:", "## Method", "Steps:", None))
    parts = [head, ing_text, f"{method_head}\n{method}" if method_head else method]
    if rng.random() < 0.4:
        parts.append(rng.choice((f"Serves {rng.choice((2, 4, 6))}.", "Serve warm.", "Keeps for 2 days.")))
    return dish, "\n\n".join(p for p in parts if p)


def _cooking_steps(rng, ingredients, vessel, oven) -> list[str]:
    a, b, c = ingredients[0], ingredients[1], ingredients[2]
    minutes = lambda: f"{rng.choice((5, 10, 15, 20))} min"  # noqa: E731
    steps = []
    if oven:
        t = rng.randrange(oven[0], oven[1] + 1, 5)
        steps.append(rng.choice((f"Heat the oven to {t} °C.", f"Preheat the oven to {t} °C.",
                                 f"Set the oven to {t} °C before you start.")))
    steps.append(rng.choice((f"Mix the {a} and the {b} in a large bowl.", f"In a bowl, whisk the {a} with the {b}.",
                             f"Combine {a} and {b} in a bowl and stir well.")))
    steps.append(rng.choice((f"Add the {c} and stir slowly.", f"Stir in the {c} until smooth.",
                             f"Fold the {c} in gently.")))
    if rng.random() < 0.5:
        steps.append(rng.choice((f"Leave it to rest for {minutes()}.", f"Let the mixture rest for {minutes()}.")))
    if oven:
        bake = f"{rng.randrange(20, 65, 5)} min" if rng.random() < 0.7 else rng.choice(("1 h", "2 h"))
        steps.append(rng.choice((f"Pour the mixture into the {vessel} and bake for {bake}.",
                                 f"Transfer everything to the {vessel} and bake it for {bake}.",
                                 f"Bake in the {vessel} for {bake} until golden.")))
    else:
        steps.append(rng.choice((f"Heat the {vessel} over a medium heat and cook for {minutes()}.",
                                 f"Cook it in the {vessel} for {minutes()}, stirring often.",
                                 f"Simmer in the {vessel} for {minutes()}.")))
    steps.append(rng.choice(("Cool slightly before serving.", "Let it cool for a few minutes.",
                             "Serve hot, or cool and keep in the fridge.")))
    return steps
