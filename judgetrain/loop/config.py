"""The loop's config: a YAML file (read with yaml.safe_load), every key checked before anything runs.

    output_dir: loops/clinic
    goal: "error detection on held-out notes up, no figure worse than the base"   # said first by `judgetrain report`
    rounds: 2
    model: tiny-judge                 # the base judge; round k judges with it plus round k-1's adapter
    recipe: recipes/quickstart.yaml   # each round's training recipe starts from this one
    train: {max_steps: 4, per_device_train_batch_size: 2}   # recipe keys for every round (over the recipe's)
    num_processes: 1                  # accelerate launch of perturb, judge, training and evaluation
    items: {source: notes.jsonl, spec: clinic.yaml, sets: [drug_swap, spacing]}   # the factory, or {file: ...}
    # domains: [{name: clinic, source: notes.jsonl, spec: clinic.yaml}, {name: lab, source: ..., spec: ...}]
    #          several factories in place of items: each domain's items, split and pairs apart, trained together
    heldout: {fraction: 0.25, types: [spacing], seed: 0}
    judge: {samples: 3, temperature: 1.0, force_score_prefix: true}
    pairs: {method: known, form: pairwise, ties: tie}
    eval: {suites: [pairwise, evalbiasbench], scoring: [verdict], options: {eval_evalbiasbench_source: ...}}

An unknown key is refused with the nearest valid one (`LoopConfigError`, exit 2), as a recipe's is; so is a value
of the wrong type (a string where a number, a list or a mapping belongs), before any stage runs. `load_config` then
checks what the config names (`check_inputs`): the recipe, the spec, the source and the items file exist and read,
``items.sets`` and ``heldout.types`` are the spec's (the nearest named), the ``train`` keys pass the recipe's parser
over the recipe, ``output_dir`` is no file, and the eval stage has a suite to score. The contents of the files the
loop reads (`input_fingerprints`) are recorded with the config's values: a rerun continues only a loop whose recipe,
spec, source and items are as they were.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import types
import typing
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from judgetrain.config.packaged import resolve_packaged
from judgetrain.config.recipe import (READINGS, TRAINED_MODE, did_you_mean, load_recipe_file, parse_recipe,
                                     read_modes, valid_keys)
from judgetrain.judge.items import read_items
from judgetrain.loop.replay import REPLAY_FILE, REPLAY_SUITES, Replay, replay_rows
from judgetrain.perturb.source import read_samples
from judgetrain.perturb.spec import load_spec, select_sets, spec_path
from judgetrain.perturb.known import RESPONSE_TIE
from judgetrain.run.layout import HELDOUT_FILES
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
class Domain(Items):
    """One domain of a loop that trains on several (``domains``): its own factory (source, spec, sets, seed), its
    items, split and pairs apart from the others' (``round-<k>/<stage>/<name>/``), its held-out samples drawn
    alike; the training pairs and the held-out pairs of every domain are pooled (a held-out row's ``sample_id`` is
    ``<name>/<sample_id>``, its domain kept in ``domain``)."""

    name: str = ""


@dataclass(frozen=True)
class Heldout:
    """Held out of training and scored each round: a seeded ``fraction`` of the samples (by sample_id) and every
    item of the perturbation ``types`` named, with every item of another set holding an edit of their operators."""

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
    base_cache: bool = False  # round 0 read from the judgetrain cache where the same base, rows and modes were scored

    @property
    def modes(self) -> list[str]:
        """The modes every round is scored in, round 0 (the base) included: ``scoring``, and where it lists implicit,
        the likelihood readings it does not list. The base has no reference, so its implicit figures are its
        log-likelihood, never differenced against a round's log-ratio; under loglik_sum and loglik_mean the base and
        each round are read alike."""
        return read_modes(self.scoring)


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
    replay: Replay = field(default_factory=Replay)
    domains: list[Domain] = field(default_factory=list)  # several factories in place of ``items``
    goal: str | None = None  # what the loop is for, in words: the loop's report states it

    def digest(self) -> str:
        """SHA-256 of the config's values but ``rounds`` and ``goal``: a rerun continues only the loop this config
        started, a larger ``rounds`` adds rounds to a finished loop, and the goal's words may be edited. A config
        without ``domains`` digests as before the key existed."""
        values = {k: v for k, v in asdict(self).items()
                  if k not in ("rounds", "goal") and not (k == "domains" and not v)}
        return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()

    @property
    def parts(self) -> list[Items]:
        """The factories the loop draws on: each of ``domains``, or ``items`` alone."""
        return list(self.domains) or [self.items]

    @property
    def needs_judge(self) -> bool:
        """Whether pairs come from evaluations (anchor consensus, or the pointwise known form)."""
        return self.pairs.method == "anchor" or self.pairs.form == "pointwise"


SECTIONS = {"items": Items, "heldout": Heldout, "judge": Judge, "pairs": Pairs, "eval": Eval, "replay": Replay}
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
    config = parse_config(data, where=str(path))
    check_inputs(config, where=str(path))
    return config


def parse_config(data: dict, where: str = "<loop config>") -> LoopConfig:
    values = _checked(data, LoopConfig, where, "")
    for name, kind in SECTIONS.items():
        if name in values:
            section = values[name] if values[name] is not None else {}
            if not isinstance(section, dict):
                raise LoopConfigError(f"{where}: {name}: a mapping of keys is expected, got {section!r}")
            values[name] = kind(**_checked(section, kind, where, f"{name}."))
    if values.get("domains") is not None:
        values["domains"] = _domains(values["domains"], where)
    config = LoopConfig(**values)
    _check_values(config, where)
    return config


def _checked(data: dict, kind, where: str, prefix: str) -> dict:
    """``data``'s keys, each one of ``kind``'s fields and of its type (`_type_problem`)."""
    valid = [f.name for f in fields(kind)]
    for key in data:
        if key not in valid:
            raise LoopConfigError(f"{where}: unknown key {prefix + str(key)!r}{did_you_mean(str(key), valid)}; "
                                  f"valid: {', '.join(valid)}")
    missing = [name for name in ("output_dir", "model", "recipe") if kind is LoopConfig and name not in data]
    if missing:
        raise LoopConfigError(f"{where}: missing key(s) {', '.join(missing)}")
    hints = typing.get_type_hints(kind)
    for key, value in data.items():
        problem = None if key in (*SECTIONS, "domains") and kind is LoopConfig else _type_problem(value, hints[key])
        if problem:
            raise LoopConfigError(f"{where}: {prefix}{key}: {value!r} is not {problem}")
    return dict(data)


def _domains(value: Any, where: str) -> list[Domain]:
    """``domains``: a list of mappings, each a `Domain` with its own name."""
    if not isinstance(value, list) or not value or not all(isinstance(d, dict) for d in value):
        raise LoopConfigError(f"{where}: domains: a list of mappings (name, source, spec, sets, seed), got {value!r}")
    domains = [Domain(**_checked(d, Domain, where, f"domains[{i}].")) for i, d in enumerate(value)]
    names = [d.name for d in domains]
    for i, d in enumerate(domains):
        if not d.name or "/" in d.name or names.count(d.name) > 1:
            raise LoopConfigError(f"{where}: domains[{i}].name: {d.name!r}: each domain needs a name of its own, "
                                  "without '/'")
        if d.source is None or d.spec is None or d.file is not None:
            raise LoopConfigError(f"{where}: domains[{i}] ({d.name}): a domain is a factory: name its source and "
                                  "spec (no file)")
    return domains


def _type_problem(value: Any, hint: Any) -> str | None:
    """What ``value`` is not, for a field annotated ``hint`` (None: it fits). YAML gives each value its own type: a
    quoted number is a string, and a string where a list belongs is not read as one."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    origin = typing.get_origin(hint) or hint
    if origin is list:
        if not isinstance(value, list):
            return "a list" + (f" (one name is written [{value}])" if isinstance(value, str) else "")
        return None if all(isinstance(v, str) for v in value) else "a list of names (strings)"
    if origin is dict:
        return None if isinstance(value, dict) else "a mapping of keys"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    wanted = {bool: ("true or false", isinstance(value, bool)),
              int: ("a whole number", number and isinstance(value, int)),
              float: ("a number", number), str: ("a string", isinstance(value, str))}
    what, fits = wanted.get(hint, (None, True))
    return None if fits else what


def _check_values(config: LoopConfig, where: str) -> None:
    for (section, key), allowed in CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in allowed:
            raise LoopConfigError(f"{where}: {section}.{key}: {value!r} is not one of {', '.join(allowed)}")
    if not isinstance(config.rounds, int) or config.rounds < 1:
        raise LoopConfigError(f"{where}: rounds: a whole number >= 1, got {config.rounds!r}")
    items = config.items
    if config.domains:
        if items != Items():
            raise LoopConfigError(f"{where}: items and domains: name the factories in one of them (domains: each "
                                  "its own items)")
        if config.pairs.method != "known" or config.pairs.form == "pointwise":
            raise LoopConfigError(f"{where}: domains: pairs of known direction from the texts (pairs.method known, "
                                  f"form pairwise or response) are built domain by domain; "
                                  f"{config.pairs.method}/{config.pairs.form} pairs are not")
        items = config.domains[0]
    if items.file is None and (items.source is None or items.spec is None):
        raise LoopConfigError(f"{where}: items: name the factory's source and spec, or a file of items")
    if config.pairs.method == "known" and config.pairs.form in ("pairwise", "response") \
            and (items.source is None or items.spec is None):
        raise LoopConfigError(f"{where}: pairs: the {config.pairs.form} known form needs items.source and items.spec "
                              "(the texts)")
    if config.needs_judge and config.judge.samples + len(config.judge.judges) < 1:
        raise LoopConfigError(f"{where}: judge: samples or judges: the pairs are built from evaluations")
    if config.goal is not None and not isinstance(config.goal, str):
        raise LoopConfigError(f"{where}: goal: a sentence saying what the loop is for, got {config.goal!r}")
    if not 0 <= config.heldout.fraction < 1:
        raise LoopConfigError(f"{where}: heldout.fraction: in [0, 1), got {config.heldout.fraction!r}")
    for key in ("output_dir", "model_name_or_path", "train_datasets", "init_adapter", "resume"):
        if key in config.train:
            raise LoopConfigError(f"{where}: train.{key}: the loop sets it each round; remove it")
    for section in ("pairs", "eval"):  # a command's flags: --key value, or --key v1 v2 for a list
        for key, value in getattr(config, section).options.items():
            if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)):
                raise LoopConfigError(f"{where}: {section}.options.{key}: {value!r} is not a value or a list of values")
    if not config.eval.suites:
        raise LoopConfigError(f"{where}: eval.suites: an empty list: name the suites each round is scored on")
    _check_replay(config.replay, config.eval.suites, where)


def _check_replay(replay: Replay, suites: list[str], where: str) -> None:
    """The replay section names a pairwise benchmark the run does not score, its source, and a share in [0, 1)."""
    if not 0 <= replay.share < 1:
        raise LoopConfigError(f"{where}: replay.share: the share of each round's training rows, in [0, 1), got "
                              f"{replay.share!r}")
    if not replay.share:
        return
    if replay.suite not in REPLAY_SUITES:
        raise LoopConfigError(f"{where}: replay.suite: {replay.suite!r} is not one of {', '.join(REPLAY_SUITES)}")
    if replay.suite in suites:
        raise LoopConfigError(f"{where}: replay.suite: {replay.suite} is scored by eval.suites: pairs the judge trains "
                              "on cannot measure it; replay a benchmark the run does not score")
    if not replay.source:
        raise LoopConfigError(f"{where}: replay.source: the {replay.suite} rows to replay (a file, folder or hub id)")


def option_args(options: dict[str, Any]) -> list[str]:
    """A section's ``options`` as a command's flags: ``--key value``, ``--key v1 v2`` for a list."""
    return [arg for key, value in options.items()
            for arg in (f"--{key}", *(map(str, value) if isinstance(value, list) else [str(value)]))]


HELDOUT_SOURCE = "<held-out>"  # an option's value the eval stage replaces with the loop's held-out file of the suite


def eval_suites(config: LoopConfig, held: Collection[str]) -> tuple[list[str], dict[str, Any]]:
    """(the suites the eval stage scores, its options): each held-out file that holds rows (``held``: their suites'
    names, `judgetrain.run.layout.HELDOUT_FILES`: the held-out pairs for ``pairwise``, the held-out rewrites for
    ``rewrites``) is its suite's source (`HELDOUT_SOURCE`) unless the options name one; a suite named without either
    is left out."""
    suites, options = list(config.eval.suites), dict(config.eval.options)
    for name in HELDOUT_FILES:
        key = f"eval_{name}_source"
        if name in held:
            options.setdefault(key, HELDOUT_SOURCE)
        elif name in suites and key not in options:
            suites.remove(name)  # nothing held out to score
    return suites, options


def round_recipe(config: LoopConfig, recipe: dict[str, Any], rd: Path, init_adapter: str | None) -> dict[str, Any]:
    """The recipe round ``rd`` trains with: ``recipe`` (the config's recipe file) with the config's ``train`` keys,
    the round's pairs, output folder and adapter to start from."""
    recipe = {**recipe, **config.train}
    recipe.update({"model_name_or_path": config.model, "output_dir": str(rd / "train"), "resume": "auto",
                   "train_datasets": [{"dataset": "preference", "source": str(rd / "pairs"), "split": "train"},
                                      *([{"dataset": "preference", "source": str(rd / "pairs" / REPLAY_FILE),
                                          "split": "train"}] if config.replay.share else [])],
                   "num_processes": config.num_processes})
    recipe["eval_suites"] = config.train.get("eval_suites", "none")  # the eval stage scores the round
    if config.accelerate_config:
        recipe["accelerate_config"] = config.accelerate_config
    if init_adapter:
        recipe["init_adapter"] = init_adapter
    return recipe


# ---- what the config names ---------------------------------------------------------------------------------------

SMOKE_MODEL = "tiny-judge"
SMOKE_STEPS = 2
SMOKE_ROWS = 8


def smoke_config(config: LoopConfig) -> LoopConfig:
    """``judgetrain loop CONFIG --smoke``: the same stages on the embedded tiny judge (a random 2-layer model, built
    offline in seconds), `SMOKE_STEPS` training steps and `SMOKE_ROWS` rows per suite, into ``<output_dir>-smoke``:
    it shows that every stage of the config runs here, and nothing about a judge."""
    train = {**config.train, "max_steps": SMOKE_STEPS}
    rows = min(config.eval.max_rows or SMOKE_ROWS, SMOKE_ROWS)
    return replace(config, output_dir=f"{config.output_dir.rstrip('/')}-smoke", model=SMOKE_MODEL, train=train,
                   eval=replace(config.eval, max_rows=rows, base_cache=False),
                   goal="A smoke run: the tiny judge (random weights) through every stage; its figures mean nothing.")


def check_inputs(config: LoopConfig, where: str = "<loop config>") -> None:
    """What the config names, checked before any stage runs (`LoopConfigError` naming the key): the output folder is
    no file; the recipe, spec, source and items file read; the sets and held-out types are the spec's; the
    ``train`` keys pass the recipe's parser; the eval stage has a suite to score."""
    out = Path(config.output_dir)
    if out.exists() and not out.is_dir():
        raise LoopConfigError(f"{where}: output_dir: {out} is a file, not a folder")
    types_known: list[str] | None = None
    for items in config.parts:
        key = f"domains ({items.name})" if isinstance(items, Domain) else "items"
        try:
            if items.spec is not None:
                spec = select_sets(load_spec(items.spec), items.sets)
                types_known = (types_known or []) + [s.name for s in spec.sets] + (["original"] if spec.original else [])
                if items.source is not None:
                    read_samples(items.source, spec, split=items.source_split)
            if items.file is not None:
                types_known = sorted({str(i.columns.get("perturbation_type")) for i in read_items(items.file).items})
        except (BadInputError, OSError) as err:
            raise LoopConfigError(f"{where}: {key}: {err}") from None
    items = config.parts[0]
    for name in config.heldout.types:
        if types_known is not None and name not in types_known:
            raise LoopConfigError(f"{where}: heldout.types: no perturbation type {name!r}"
                                  f"{did_you_mean(name, types_known)}; types: {', '.join(types_known)}")
    check_train(config, where)
    if config.replay.share:
        try:
            replay_rows(config.replay)
        except (BadInputError, OSError) as err:
            raise LoopConfigError(f"{where}: replay.source: {err}") from None
    anything_held = bool(items.source and items.spec and (config.heldout.fraction > 0 or config.heldout.types))
    if not eval_suites(config, HELDOUT_FILES if anything_held else ())[0]:
        raise LoopConfigError(f"{where}: eval.suites: {config.eval.suites} leaves no suite to score: without "
                              "items.source and items.spec (or anything held out) there are no held-out pairs for the "
                              "pairwise suite; name another suite or eval.options.eval_pairwise_source")


def trained_form(config: LoopConfig, recipe: dict[str, Any] | None = None) -> str:
    """The training form each round trains (``train.training_form``, else the recipe file's, else log_ratio)."""
    recipe = load_recipe_file(config.recipe) if recipe is None else recipe
    return {**recipe, **config.train}.get("training_form") or "log_ratio"


def check_train(config: LoopConfig, where: str) -> None:
    """The round's recipe (the recipe file with the ``train`` keys, as round 1 trains it) through the recipe's
    parser: an unknown key is named with the nearest, a value of the wrong type with what it should be."""
    try:
        recipe = load_recipe_file(config.recipe)
    except BadInputError as err:
        raise LoopConfigError(f"{where}: recipe: {err}") from None
    if config.pairs.method == "known" and config.pairs.form == "response" and config.pairs.ties != "drop" \
            and not {**recipe, **config.train}.get("tie_model"):
        raise LoopConfigError(f"{where}: pairs.ties: {RESPONSE_TIE}")
    form = trained_form(config, recipe)
    if config.pairs.form == "response" and TRAINED_MODE[form] not in config.eval.modes:
        raise LoopConfigError(f"{where}: eval.scoring: {config.eval.scoring}: the training form {form} trains the "
                              f"{TRAINED_MODE[form]} reading; list {TRAINED_MODE[form]} so that every round, the base "
                              "included, is scored in the reading it trains")
    keys = valid_keys()
    for key in config.train:
        if key not in keys:
            raise LoopConfigError(f"{where}: unknown key 'train.{key}'{did_you_mean(key, keys)} (a recipe key)")
    environ = dict(os.environ)  # parse_recipe applies the recipe's env: the training stage does that, not the loop
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.yaml"
        path.write_text(yaml.safe_dump(round_recipe(config, recipe, Path(tmp), None), sort_keys=False),
                        encoding="utf-8")
        try:
            parse_recipe([str(path)])
        except BadInputError as err:
            said = str(err).replace(f"recipe {path}: ", "").replace(str(path), "the round's recipe")
            raise LoopConfigError(f"{where}: train (over the recipe {config.recipe}): {said}") from None
        finally:
            os.environ.clear()
            os.environ.update(environ)


def input_paths(config: LoopConfig) -> dict[str, str]:
    """The path of each file or folder the loop reads, by its key (``recipe``, ``items.spec``, ``items.source``,
    ``items.file``, ``domains.<name>.source``, ``domains.<name>.spec``)."""
    paths = {"recipe": resolve_packaged(config.recipe, "recipes"), "items.file": config.items.file,
             "items.source": config.items.source,
             "items.spec": str(spec_path(config.items.spec)) if config.items.spec else None}
    for d in config.domains:
        paths.update({f"domains.{d.name}.source": d.source, f"domains.{d.name}.spec": str(spec_path(d.spec))})
    return {key: str(value) for key, value in paths.items() if value is not None}


def input_fingerprints(config: LoopConfig) -> dict[str, str]:
    """SHA-256 of the contents of each of `input_paths` (a folder: every file in it, by relative path; a hub id: its
    name)."""
    return {key: _contents_digest(Path(value)) for key, value in input_paths(config).items()}


def _contents_digest(path: Path) -> str:
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(path)).encode("utf-8") + b"\0" + f.read_bytes() + b"\0")
    elif path.is_file():
        h.update(path.read_bytes())
    else:
        h.update(f"not a local file: {path}".encode("utf-8"))
    return h.hexdigest()
