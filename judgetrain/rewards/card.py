"""The judge's card as data: what whoever uses a judge as a reward should see of what was measured.

    from judgetrain.rewards.card import read_card
    card = read_card("runs/quickstart")
    card.base, card.training_data, card.against_base["rows"][0]   # figure, base, trained, ci_low, ci_high, delta, ...

It reads the run folder as `judgetrain.report.card` does (``recipe.yaml``, ``metrics.jsonl``, ``README.md``): the base
model as a command names it (a hub id or alias; a local folder by its name only), the training data (each component's
dataset, its source as a hub id, ``bundled`` or a folder's name, its split and options: never a machine path), the
figures of the last evaluation against the base judge with their intervals (`judgetrain.report.headline.against_base`:
base, trained, 95% interval, the difference, its interval and p) and the figures that got worse, and the card's text. A
folder that is not a run (a bare adapter or model folder) gives a card with what it has: ``recipe`` and ``against_base``
None, said in ``note``.
"""

# Late imports: yaml (inside `read_card`): a light read of the run folder.

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from judgetrain.report.build import read_metrics
from judgetrain.report.card import CARD_FILE, base_model
from judgetrain.report.headline import against_base, against_base_verdict
from judgetrain.utils.hub import is_hub_id
from judgetrain.utils.numbers import nan_to_none


@dataclass
class JudgeCard:
    """What was measured of a judge (see the module doc); ``as_dict`` is what `judgetrain serve`'s /health shows."""

    name: str
    base: str | None = None  # how a command names the base: a hub id, an alias, or path/to/<folder name>
    adapter: bool = False  # a LoRA adapter on ``base`` (else a full model)
    training_data: list[dict[str, Any]] = field(default_factory=list)  # {dataset, source, split, options}
    against_base: dict[str, Any] | None = None  # `judgetrain.report.headline.against_base`'s figures
    verdict: str = ""  # one sentence: what got worse against the base judge, or why there is no comparison
    recipe: dict[str, Any] | None = None  # recipe.yaml as run
    text: str | None = None  # README.md, the model card
    note: str = ""

    def as_dict(self, *, with_text: bool = False) -> dict[str, Any]:
        out = nan_to_none(asdict(self))
        out.pop("recipe")
        if not with_text:
            out.pop("text")
        return out


def _shown_source(source: Any) -> str:
    """A data source as the card shows it: a hub id or ``bundled`` as itself, a file or folder by its name only."""
    text = str(source or "bundled")
    if text == "bundled" or is_hub_id(text):
        return text
    return Path(text.rstrip("/")).name


def read_card(folder: str | Path) -> JudgeCard:
    """The card of the judge in ``folder`` (a run's output_dir, or any adapter or model folder)."""
    import yaml

    out = Path(folder)
    card = JudgeCard(name=out.resolve().name, adapter=(out / "adapter_config.json").is_file())
    if (out / CARD_FILE).is_file():
        card.text = (out / CARD_FILE).read_text(encoding="utf-8")
    try:
        recipe = yaml.safe_load((out / "recipe.yaml").read_text(encoding="utf-8")) if (out / "recipe.yaml").is_file() \
            else None
    except yaml.YAMLError:
        recipe = None
    if not isinstance(recipe, dict):
        card.note = "no recipe.yaml in the folder: not a judgetrain run (its base, data and figures are unknown)"
        return card
    card.recipe = recipe
    card.base = base_model(str(recipe.get("model_name_or_path", "")))[2]
    card.adapter = card.adapter or bool(recipe.get("use_peft"))
    card.training_data = [{**c, "dataset": str(c.get("dataset")), "source": _shown_source(c.get("source")),
                           "split": c.get("split")} for c in recipe.get("train_datasets") or []
                          if isinstance(c, dict)]
    records = read_metrics(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else {}
    card.against_base = against_base(records, recipe)
    card.verdict = against_base_verdict(card.against_base)
    return card
