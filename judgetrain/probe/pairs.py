"""The texts a probe reads and the pairs it compares, from `judgetrain perturb`'s items and their source samples,
checked before any model loads.

Each item's text is read out of its prompt by its sample's template (`judgetrain.perturb.known.item_text`); the
source's own text is the sample's. An item that makes no pair is counted by reason (``no_source``,
``prompt_mismatch``, ``unchanged``, ``no_category``), never dropped silently. Bad input (no items file, an items file
without error copies, a ``types`` entry the items do not hold) raises `ProbeInputError` naming the file.

Pairs (``better`` is the text an ideal judge ranks first):

- ``error``: better = the source, worse = the error copy; ``perturbation_type`` the copy's;
- ``represent``: better = the source, worse = the rewrite (the share where the source wins measures how much the base
  sees change);
- ``cross``: better = the rewrite, worse = an error copy of the same source (every combination);
  ``perturbation_type`` the error copy's, ``other_type`` the rewrite's.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from judgetrain.judge.items import read_items
from judgetrain.perturb.known import item_operators, item_text, question_of
from judgetrain.perturb.source import Sample
from judgetrain.perturb.spec import ORIGINAL_SET
from judgetrain.utils.errors import BadInputError

logger = logging.getLogger(__name__)

KINDS = ("error", "represent", "cross")
CATEGORIES = ("error", "represent")
SOURCE = "source"  # the category of a source text


class ProbeInputError(BadInputError, ValueError):
    """Items a probe cannot read as asked (named in the message)."""


@dataclass(frozen=True)
class Text:
    """One text of a sample: its source (``category`` "source") or a copy."""

    sample_id: Any
    text: str
    category: str
    perturbation_type: str | None = None
    perturbation_set: str | None = None
    operators: frozenset = frozenset()  # the operators whose edits made the copy (its changes' ``kind``)


@dataclass(frozen=True)
class Pair:
    kind: str
    sample_id: Any
    perturbation_type: str
    better: int  # index into `ProbeSet.texts`
    worse: int
    operators: frozenset = frozenset()  # of the error or represent copy (cross: the error copy's)
    other_type: str | None = None  # cross: the rewrite's type


@dataclass
class ProbeSet:
    """What a probe reads: the texts, each sample's question and each text's judge prompt, the pairs."""

    texts: list[Text]
    questions: dict[Any, str]
    judge_prompts: list[list[dict]]
    pairs: list[Pair]
    skipped: Counter = field(default_factory=Counter)
    samples: int = 0

    def of(self, kind: str) -> list[Pair]:
        return [p for p in self.pairs if p.kind == kind]

    def types(self, kind: str) -> list[str]:
        """The perturbation types of ``kind``'s pairs, in their first order of appearance."""
        return list(dict.fromkeys(p.perturbation_type for p in self.of(kind)))


def draw_samples(ids: list[Any], max_samples: int | None, seed: int) -> set[Any]:
    """``max_samples`` of ``ids`` drawn with ``seed`` (all of them when None or when there are no more)."""
    ordered = sorted(ids, key=str)
    if max_samples is None or max_samples >= len(ordered):
        return set(ordered)
    return set(random.Random(seed).sample(ordered, max_samples))


def read_probe_set(items_path: str, samples: list[Sample], *, types: list[str] | None = None,
                   max_samples: int | None = None, seed: int = 0) -> ProbeSet:
    """The texts and pairs of the items at ``items_path`` made from ``samples`` (see the module doc)."""
    try:
        items = read_items(str(items_path)).items
    except FileNotFoundError as err:
        raise ProbeInputError(f"--items {items_path}: {err}") from None
    by_id = {str(s.sample_id): s for s in samples}
    skipped: Counter = Counter()
    copies: dict[str, list[tuple[Sample, Text, list[dict]]]] = {}
    held = Counter()
    for item in items:
        cols = item.columns
        if cols.get("perturbation_set") == ORIGINAL_SET:
            continue
        category, ptype = cols.get("perturbation_category"), cols.get("perturbation_type")
        held[(category, ptype)] += 1
        reason, sample, text = _copy_text(item, by_id, category, ptype)
        if reason:
            skipped[reason] += 1
            continue
        operators = item_operators(cols)
        copies.setdefault(str(sample.sample_id), []).append(
            (sample, Text(sample.sample_id, text, category, str(ptype), cols.get("perturbation_set"),
                          operators or frozenset({str(ptype)})), item.messages))
    _check_types(items_path, held, types)
    wanted = draw_samples(list(copies), max_samples, seed)
    chosen = {k: [c for c in v if types is None or c[1].perturbation_type in types]
              for k, v in copies.items() if k in wanted}
    probe = _pair_up({k: v for k, v in chosen.items() if v})
    probe.skipped = skipped
    if not probe.of("error"):
        raise ProbeInputError(f"--items {items_path}: no error copy to compare with its source"
                              + (f" among the types {', '.join(types)}" if types else "")
                              + (f" ({dict(skipped)} skipped)" if skipped else "")
                              + "; make the items with a spec that has error operators")
    logger.info("probe: %d samples, %d texts, pairs %s%s", probe.samples, len(probe.texts),
                {k: len(probe.of(k)) for k in KINDS}, f"; skipped {dict(skipped)}" if skipped else "")
    return probe


def _copy_text(item, by_id: dict[str, Sample], category: Any, ptype: Any) -> tuple[str | None, Sample | None, str]:
    """(why the item makes no pair, or None; its sample; its text)."""
    if category not in CATEGORIES or not ptype:
        return "no_category", None, ""
    sample = by_id.get(str(item.columns.get("sample_id")))
    if sample is None:
        return "no_source", None, ""
    text = item_text(sample, item.messages)
    if text is None:
        return "prompt_mismatch", None, ""
    if text == sample.text:
        return "unchanged", None, ""
    return None, sample, text


def _check_types(items_path: str, held: Counter, types: list[str] | None) -> None:
    if not types:
        return
    known = sorted({str(t) for (c, t) in held if c in CATEGORIES and t})
    unknown = [t for t in types if t not in known]
    if unknown:
        raise ProbeInputError(f"--types: {', '.join(unknown)} not among the perturbation types of {items_path} "
                              f"({', '.join(known) or 'none'})")


def _pair_up(copies: dict[str, list[tuple[Sample, Text, list[dict]]]]) -> ProbeSet:
    texts: list[Text] = []
    prompts: list[list[dict]] = []
    questions: dict[Any, str] = {}
    pairs: list[Pair] = []
    for key in sorted(copies, key=str):
        sample = copies[key][0][0]
        questions[sample.sample_id] = question_of(sample)
        source = len(texts)
        texts.append(Text(sample.sample_id, sample.text, SOURCE))
        prompts.append(sample.prompt(sample.text))
        errors, rewrites = [], []
        for _, text, messages in copies[key]:
            (errors if text.category == "error" else rewrites).append(len(texts))
            texts.append(text)
            prompts.append(messages)
        for i in errors + rewrites:
            pairs.append(Pair(texts[i].category, sample.sample_id, texts[i].perturbation_type, source, i,
                              texts[i].operators))
        for e in errors:
            for r in rewrites:
                pairs.append(Pair("cross", sample.sample_id, texts[e].perturbation_type, r, e, texts[e].operators,
                                  texts[r].perturbation_type))
    return ProbeSet(texts, questions, prompts, pairs, samples=len(copies))
