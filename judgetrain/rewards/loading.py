"""A judge folder read for use as a reward: where its weights are, the recipe it was trained with, then the weights.

    judge = judge_source("runs/quickstart")     # checked, nothing loaded: BadInputError naming the folder
    model, tokenizer = load_judge(judge, dtype="float32")

A judge is a folder with ``adapter_config.json`` (a LoRA adapter: its base, the model the adapter config names, is
loaded and the adapter applied; implicit scoring's reference is that base, the adapter disabled), a folder with
``config.json`` (a full model), an alias (``tiny-judge``) or a hub id. A run's output_dir also holds ``recipe.yaml``:
the length and truncation rule (``max_length``, ``long_rows``) and the verdict template (``eval_pairwise_prompt``) the
judge was trained and evaluated with, which the reward then uses as its own.
"""

# Late imports: torch, transformers, peft, yaml (inside `load_judge` and `judge_source`): a folder is checked, and a
# bad one refused, before any of them load.

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from judgetrain.models.aliases import resolve_model
from judgetrain.models.loading import load_tokenizer
from judgetrain.utils.errors import BadInputError, MissingFileError
from judgetrain.utils.hub import is_hub_id

logger = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class JudgeSource:
    """Where a judge's weights are and what its recipe says (see the module doc)."""

    folder: str  # as given: a folder, an alias or a hub id
    model: str  # the weights loaded first: the base of an adapter, else the model itself
    adapter: str | None = None
    revision: str | None = None  # the base revision an adapter recorded
    recipe: dict[str, Any] = field(default_factory=dict)  # recipe.yaml of a run folder ({} without one)

    @property
    def max_length(self) -> int | None:
        value = self.recipe.get("max_length")
        return int(value) if isinstance(value, int) and value > 0 else None

    @property
    def long_rows(self) -> str:
        return str(self.recipe.get("long_rows") or "truncate")

    @property
    def pairwise_prompt(self) -> str | None:
        return self.recipe.get("eval_pairwise_prompt") or None


def judge_source(folder: str) -> JudgeSource:
    """The judge named by ``folder``, checked before any weights load (BadInputError naming the folder and the fix)."""
    import yaml

    name = resolve_model(str(folder))
    path = Path(name)
    if not path.exists():
        if is_hub_id(str(folder)):
            return JudgeSource(str(folder), str(folder))
        raise MissingFileError(f"judge {folder}: no such folder (a run's output_dir, an adapter or model folder, an "
                               "alias such as tiny-judge, or a hub id)")
    if not path.is_dir():
        raise BadInputError(f"judge {folder}: a file, not a folder (give the folder with adapter_config.json or "
                            "config.json)")
    recipe: dict[str, Any] = {}
    if (path / "recipe.yaml").is_file():
        try:
            loaded = yaml.safe_load((path / "recipe.yaml").read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise BadInputError(f"judge {folder}: recipe.yaml cannot be read: {err}") from None
        recipe = loaded if isinstance(loaded, dict) else {}
    if (path / "adapter_config.json").is_file():
        try:
            config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
            base = config["base_model_name_or_path"]
        except (ValueError, KeyError) as err:
            raise BadInputError(f"judge {folder}: adapter_config.json has no readable base_model_name_or_path "
                                f"({type(err).__name__}: {err})") from None
        return JudgeSource(str(folder), resolve_model(str(base)), adapter=name, revision=config.get("revision"),
                           recipe=recipe)
    if (path / "config.json").is_file():
        return JudgeSource(str(folder), name, recipe=recipe)
    raise BadInputError(f"judge {folder}: a folder without a model (no adapter_config.json or config.json)")


def load_judge(source: JudgeSource, *, dtype: str = "auto", device: str | None = None,
               trust_remote_code: bool = False):
    """(model, tokenizer) of a checked judge: the base with the adapter applied (a PEFT model), or the full model; the
    tokenizer saved beside the adapter when there is one (the template the judge was trained with), else the base's."""
    import torch
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise BadInputError(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
    at = {"revision": source.revision} if source.revision else {}
    weights = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(source.model, dtype=weights, trust_remote_code=trust_remote_code, **at)
    own = source.adapter is not None and (Path(source.adapter) / "tokenizer_config.json").is_file()
    tokenizer = load_tokenizer(source.adapter if own else source.model, trust_remote_code=trust_remote_code,
                               revision=None if own else source.revision)
    if source.adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, source.adapter)
    if device:
        model.to(device)
    model.eval()
    return model, tokenizer
