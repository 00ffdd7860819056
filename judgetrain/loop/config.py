"""The loop's config: a YAML file (read with yaml.safe_load), every key checked before anything runs.

    output_dir: loops/clinic
    goal: "error detection on held-out notes up, no figure worse than the base"   # said first by `judgetrain report`
    rounds: 2
    model: tiny-judge                 # the base judge; round k judges with it plus round k-1's adapter
    recipe: recipes/quickstart.yaml   # each round's training recipe starts from this one
    train: {max_steps: 4, per_device_train_batch_size: 2}   # recipe keys for every round (over the recipe's)
    num_processes: 1                  # accelerate launch of perturb, judge, training and evaluation
    items: {source: notes.jsonl, spec: clinic.yaml, sets: [drug_swap, spacing]}   # the factory, or {file: ...}
    heldout: {fraction: 0.25, types: [spacing], seed: 0}
    judge: {samples: 3, temperature: 1.0, force_score_prefix: true}
    pairs: {method: known, form: pairwise, ties: tie}
    eval: {suites: [pairwise, evalbiasbench], scoring: [verdict], options: {eval_evalbiasbench_source: ...}}

An unknown key is refused with the nearest valid one (`LoopConfigError`, exit 2), as a recipe's is.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from judgetrain.config.recipe import did_you_mean
from judgetrain.perturb.known import RESPONSE_TIE
from judgetrain.utils.errors import BadInputError


class LoopConfigError(BadInputError, ValueError):
    """A loop config that cannot be used (the message names the file and the key)."""


@dataclass(frozen=True)
class Items:
    """Where each round's items come from: the factory (``source`` + ``spec``, `judgetrain perturb`, seeded
    ``seed + round - 1`` so that each round edits afresh) or a given ``file`` (every round the same items; ``source``
    and ``spec`` then only give the texts that pairwise pairs and the held-out pairs need)."""

    source: str | None = None
    source_split: str = "train"
    spec: str | None = None
    sets: list[str] | None = None
    seed: int = 0
    file: str | None = None


@dataclass(frozen=True)
class Heldout:
    """Held out of training and scored each round: a seeded ``fraction`` of the samples (by sample_id) and every
    item of the perturbation ``types`` named."""

    fraction: float = 0.2
    types: list[str] = field(default_factory=list)
    seed: int = 0


@dataclass(frozen=True)
class Judge:
    """The current judge's evaluations of the training items: ``samples`` sampled evaluations per item stand in for a
    panel, beside the ``judges`` listed (`judgetrain judge`'s --judge specs: other models, endpoints)."""

    samples: int = 3
    temperature: float = 1.0
    max_new_tokens: int | None = None
    force_score_prefix: bool = False
    judges: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Pairs:
    """How pairs are built: ``known`` (`judgetrain pairs known`, ``form`` pairwise, pointwise or response) or ``anchor``
    (`judgetrain pairs build`, consensus over the evaluations); ``options``: the command's own flags."""

    method: str = "known"
    form: str = "pairwise"
    ties: str = "tie"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Eval:
    """What each round is scored on against the base (`judgetrain eval --baseline`): the held-out pairs (the
    ``pairwise`` suite, added when the held-out items make any) and the benchmark suites named; ``options``: more
    `judgetrain eval` keys (``eval_evalbiasbench_source``, ``eval_generate_max_rows``, ...)."""

    suites: list[str] = field(default_factory=lambda: ["pairwise"])
    scoring: list[str] = field(default_factory=lambda: ["verdict"])
    max_rows: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoopConfig:
    output_dir: str
    model: str
    recipe: str
    rounds: int = 1
    train: dict[str, Any] = field(default_factory=dict)
    num_processes: int = 1
    accelerate_config: str | None = None
    items: Items = field(default_factory=Items)
    heldout: Heldout = field(default_factory=Heldout)
    judge: Judge = field(default_factory=Judge)
    pairs: Pairs = field(default_factory=Pairs)
    eval: Eval = field(default_factory=Eval)
    goal: str | None = None  # what the loop is for, in words: the loop's report states it

    def digest(self) -> str:
        """SHA-256 of the config's values but ``rounds`` and ``goal``: a rerun continues only the loop this config
        started, a larger ``rounds`` adds rounds to a finished loop, and the goal's words may be edited."""
        values = {k: v for k, v in asdict(self).items() if k not in ("rounds", "goal")}
        return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()

    @property
    def needs_judge(self) -> bool:
        """Whether pairs come from evaluations (anchor consensus, or the pointwise known form)."""
        return self.pairs.method == "anchor" or self.pairs.form == "pointwise"


SECTIONS = {"items": Items, "heldout": Heldout, "judge": Judge, "pairs": Pairs, "eval": Eval}
CHOICES = {("pairs", "method"): ("known", "anchor"), ("pairs", "form"): ("pairwise", "pointwise", "response"),
           ("pairs", "ties"): ("tie", "drop")}


def load_config(path: str | Path) -> LoopConfig:
    """The checked config of the YAML file at ``path``; `LoopConfigError` naming the file and key otherwise."""
    path = Path(path)
    if not path.is_file():
        raise LoopConfigError(f"loop config not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise LoopConfigError(f"{path}: not YAML: {err}") from None
    if not isinstance(data, dict):
        raise LoopConfigError(f"{path}: a mapping of keys is expected")
    return parse_config(data, where=str(path))


def parse_config(data: dict, where: str = "<loop config>") -> LoopConfig:
    values = _checked(data, LoopConfig, where, "")
    for name, kind in SECTIONS.items():
        if name in values:
            section = values[name] if values[name] is not None else {}
            if not isinstance(section, dict):
                raise LoopConfigError(f"{where}: {name}: a mapping of keys is expected, got {section!r}")
            values[name] = kind(**_checked(section, kind, where, f"{name}."))
    config = LoopConfig(**values)
    _check_values(config, where)
    return config


def _checked(data: dict, kind, where: str, prefix: str) -> dict:
    valid = [f.name for f in fields(kind)]
    for key in data:
        if key not in valid:
            raise LoopConfigError(f"{where}: unknown key {prefix + str(key)!r}{did_you_mean(str(key), valid)}; "
                                  f"valid: {', '.join(valid)}")
    missing = [name for name in ("output_dir", "model", "recipe") if kind is LoopConfig and name not in data]
    if missing:
        raise LoopConfigError(f"{where}: missing key(s) {', '.join(missing)}")
    return dict(data)


def _check_values(config: LoopConfig, where: str) -> None:
    for (section, key), allowed in CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in allowed:
            raise LoopConfigError(f"{where}: {section}.{key}: {value!r} is not one of {', '.join(allowed)}")
    if not isinstance(config.rounds, int) or config.rounds < 1:
        raise LoopConfigError(f"{where}: rounds: a whole number >= 1, got {config.rounds!r}")
    items = config.items
    if items.file is None and (items.source is None or items.spec is None):
        raise LoopConfigError(f"{where}: items: name the factory's source and spec, or a file of items")
    if config.pairs.method == "known" and config.pairs.form in ("pairwise", "response") \
            and (items.source is None or items.spec is None):
        raise LoopConfigError(f"{where}: pairs: the {config.pairs.form} known form needs items.source and items.spec "
                              "(the texts)")
    if config.pairs.method == "known" and config.pairs.form == "response" and config.pairs.ties != "drop":
        raise LoopConfigError(f"{where}: pairs.ties: {RESPONSE_TIE}")
    if config.needs_judge and config.judge.samples + len(config.judge.judges) < 1:
        raise LoopConfigError(f"{where}: judge: samples or judges: the pairs are built from evaluations")
    if config.goal is not None and not isinstance(config.goal, str):
        raise LoopConfigError(f"{where}: goal: a sentence saying what the loop is for, got {config.goal!r}")
    if not 0 <= config.heldout.fraction < 1:
        raise LoopConfigError(f"{where}: heldout.fraction: in [0, 1), got {config.heldout.fraction!r}")
    for key in ("output_dir", "model_name_or_path", "train_datasets", "init_adapter", "resume"):
        if key in config.train:
            raise LoopConfigError(f"{where}: train.{key}: the loop sets it each round; remove it")
