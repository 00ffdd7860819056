"""DPO pairs whose direction is known by construction (OffsetBias's construction), from `judgetrain perturb`'s items:
an error copy is worse than its source, a representational copy is as good as it.

    judgetrain pairs known --items perturbed/items.jsonl --source recipes.jsonl --spec materials --out pairs_known
    judgetrain pairs known --form pointwise --evaluations panel/evaluations.jsonl --out pairs_known

Three forms:

- ``pairwise`` (no judge needed): the pairwise verdict prompt of the EvalBiasBench / JudgeBench / pairwise suites
  (`judgetrain.data.pairwise.verdict_messages`: the question, then the two texts as assistants A and B) with the
  source against each copy, in both orders (``order`` AB: the source shown as A; BA: as B), so that position never
  predicts the label. An error copy: chosen = the verdict that prefers the source (``[[A>B]]`` in AB, ``[[B>A]]``
  in BA), rejected = the other. A representational copy, as ``ties`` says: ``tie`` writes chosen ``[[A=B]]`` against
  each of the two preferences in each order (4 rows), ``drop`` writes no pair (counted). The texts come from the
  source samples (``--source`` / ``--spec``, as `judgetrain perturb` read them): each item's text is read out of its
  prompt by the sample's template; the question is the user turn with the text left out.
  Rows: ``prompt``, ``chosen``, ``rejected`` (JSON message lists), ``sample_id``, ``perturbation_set``,
  ``perturbation_type``, ``perturbation_category``, ``perturbation_rate``, ``order``, ``label`` (A>B, B>A or A=B),
  ``group`` (the same for every row of one copy: a recipe's ``batch_groups`` trains them in one batch), read by the
  ``preference`` training dataset.
- ``response`` (no judge needed; the implicit-reward judge, RM-Bench's reading: a response's score is
  log pi(y|x) - log pi_ref(y|x)): prompt = the question the judge is given (the sample's user turn(s) with the text
  left out, a user turn), chosen = the source's text, rejected = the error copy's, one row per copy, ``tie`` false;
  the held-out pairs' ``prompt`` is the same question, so implicit scoring reads the trained judge as it was trained.
  A representational copy, as ``ties`` says: ``tie`` writes one row, chosen = the source, rejected = the copy,
  ``tie`` true (a pair only a recipe's ``tie_model`` trains: the tie-aware DPO loss of
  `judgetrain.trainer.pair_loss`), ``drop`` no pair (counted). Rows: the pairwise form's columns but ``order`` and
  ``label``, and ``tie``.
- ``pointwise`` (score pairs, JudgeBias's form): a panel file of evaluations of the items (`judgetrain judge`'s
  evaluations.jsonl; several sampled evaluations of one judge may stand in for a panel) holding the ``original`` set (the spec's ``original: true``):
  the source's score is the median over its evaluations; an error copy's evaluation that scores below it is chosen
  against one that does not; on a representational copy (``ties: tie``) an evaluation within ``tie_margin`` of the
  source's score is chosen against one further than ``min_delta`` from it. Rows in `judgetrain pairs build`'s schema
  (``anchor_score`` = the source's score), read by the ``preference`` training dataset, and by the ``judgebias``
  dataset and eval suite where the spec names its sets in the JudgeBias vocabulary (the materials pack).

All three write what `judgetrain pairs build` writes: ``train.parquet``, ``validation.parquet`` (split by sample_id),
``rejects.jsonl`` (every item or evaluation that made no pair for a reason other than the tie policy, with its
reason: ``no_source``, ``prompt_mismatch``, ``unchanged``, ``no_source_score`` and the score parser's reasons; an item
whose category is missing or not one of the spec's is a bad row, exit 2) and
``stats.json`` (`judgetrain.data.pairs.pair_statistics` plus the counts by reason; ``pairs_by_label``: the
pairwise form's verdicts, else the form's name, and ``tie`` for the response form's tie pairs).

`write_heldout_pairs` writes the loop's held-out pairs: each held-out error copy against its source, as rows of the
pairwise eval suite; `write_heldout_rewrites` each held-out rewrite against its source and against an error copy of the
same source, as rows of the rewrites suite.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from judgetrain.data.pairs import (OUTPUT_COLUMNS, Evaluation, PanelDataError, check_options, deduplicate,
                                   load_table, pair_statistics, score_evaluations, split_by_sample, write_pairs,
                                   write_rejects)
from judgetrain.data.pairwise import verdict_messages
from judgetrain.data.validate import DataValidationError, RowProblem
from judgetrain.judge.items import Item, read_items
from judgetrain.perturb.source import Sample
from judgetrain.perturb.spec import CATEGORIES, ORIGINAL_SET
from judgetrain.utils.files import write_lines
from judgetrain.utils.numbers import nan_to_none

logger = logging.getLogger(__name__)

FORMS = ("pairwise", "pointwise", "response")
TIES = ("tie", "drop")
TIE, BETTER = "[[A=B]]", {"A": "[[A>B]]", "B": "[[B>A]]"}
PAIRWISE_COLUMNS = ("prompt", "chosen", "rejected", "sample_id", "perturbation_set", "perturbation_type",
                    "perturbation_category", "perturbation_rate", "order", "label", "group")
RESPONSE_COLUMNS = ("prompt", "chosen", "rejected", "sample_id", "perturbation_set", "perturbation_type",
                    "perturbation_category", "perturbation_rate", "group", "tie")
RESPONSE_TIE = ("the response form's tie pairs (a rewrite against its source) train only under a recipe's tie_model "
                "(the tie-aware DPO loss), which the loop's training recipe does not set; set train.tie_model "
                "(rao_kupper or davidson), or use ties drop")
_SENTINEL = "\x00judgetrain-text\x00"


def known_pairs(out_dir: str | Path, *, form: str = "pairwise", items: str | Path | None = None,
                samples: list[Sample] | None = None, evaluations: str | Path | list[dict] | None = None,
                ties: str = "tie", min_delta: float = 0.5, tie_margin: float = 0.5, max_pairs: int = 5,
                validation_fraction: float = 0.1, seed: int = 0, score_key: str = "overall_score",
                scale: tuple[float, float] = (0.5, 5.5)) -> dict[str, Any]:
    """Build the pairs of ``form`` (see the module doc), write them with their rejects and statistics to
    ``out_dir``; returns the statistics. ValueError (PanelDataError) when the inputs cannot be used at all."""
    if form not in FORMS or ties not in TIES:
        raise ValueError(f"form must be one of {FORMS} and ties one of {TIES}, got {form!r}, {ties!r}")
    check_options(max_pairs, validation_fraction, scale)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dropped: Counter = Counter()
    if form in ("pairwise", "response"):
        if items is None or samples is None:
            raise ValueError(f"the {form} form needs the items and the source samples they were made from")
        make = pairwise_pairs if form == "pairwise" else response_pairs
        pairs, rejects = make(read_items(str(items)).items, samples, ties, dropped)
        columns = PAIRWISE_COLUMNS if form == "pairwise" else RESPONSE_COLUMNS
    else:
        if evaluations is None:
            raise ValueError("the pointwise form needs a panel file of evaluations of the items")
        pairs, rejects = pointwise_pairs(load_table(evaluations), ties, dropped, min_delta=min_delta,
                                         tie_margin=tie_margin, max_pairs=max_pairs, seed=seed,
                                         score_key=score_key, scale=scale)
        columns = OUTPUT_COLUMNS
    unique = deduplicate(pairs, dropped)
    train_rows, val_rows = split_by_sample(unique, validation_fraction, seed)
    write_rejects(rejects, out / "rejects.jsonl")
    write_pairs(train_rows, out / "train.parquet", columns)
    write_pairs(val_rows, out / "validation.parquet", columns)
    stats = {**pair_statistics(train_rows, val_rows), "form": form, "ties": ties,
             "pairs_by_label": dict(sorted(Counter("tie" if r.get("tie") else r.get("label", form)
                                                   for r in unique).items())),
             "rejected_rows": len(rejects), "rejects_by_reason": dict(sorted(Counter(r["reason"] for r in rejects).items())),
             "dropped": dict(sorted(dropped.items())),
             "options": {"min_delta": min_delta, "tie_margin": tie_margin, "max_pairs": max_pairs,
                         "validation_fraction": validation_fraction, "seed": seed}}
    (out / "stats.json").write_text(json.dumps(nan_to_none(stats), indent=2) + "\n", encoding="utf-8")
    logger.info("pairs known (%s): %d pairs (train %d, validation %d), %d rejected (%s)", form, len(unique),
                len(train_rows), len(val_rows), len(rejects), out / "rejects.jsonl")
    return stats


# ---- pairwise ----------------------------------------------------------------------------------------------------

def pairwise_pairs(items: list[Item], samples: list[Sample], ties: str,
                   dropped: Counter) -> tuple[list[dict], list[dict]]:
    """Every item against its source in both orders (see the module doc): (rows, rejects)."""
    rows, rejects = [], []
    for copy in source_copies(items, samples, ties, dropped, rejects):
        sample, text, category = copy.sample, copy.text, copy.category
        question = question_of(sample)
        for order, (a, b) in (("AB", (sample.text, text)), ("BA", (text, sample.text))):
            prompt = json.dumps(verdict_messages(question, a, b), ensure_ascii=False)
            source_letter = "A" if order == "AB" else "B"
            if category == "error":
                verdicts = [(BETTER[source_letter], BETTER["B" if source_letter == "A" else "A"])]
            else:
                verdicts = [(TIE, BETTER["A"]), (TIE, BETTER["B"])]
            for chosen, rejected in verdicts:
                rows.append({"prompt": prompt, "chosen": _assistant(chosen), "rejected": _assistant(rejected),
                             **copy.columns(), "order": order, "label": chosen.strip("[]"), "group": copy.group})
    return rows, rejects


def response_pairs(items: list[Item], samples: list[Sample], ties: str,
                   dropped: Counter) -> tuple[list[dict], list[dict]]:
    """The response form (see the module doc): the question as the prompt, the source chosen against its copy; an
    error copy's pair is a win, a representational copy's (``ties: tie``) a tie."""
    rows, rejects = [], []
    for copy in source_copies(items, samples, ties, dropped, rejects):
        rows.append({"prompt": json.dumps([{"role": "user", "content": question_of(copy.sample)}], ensure_ascii=False),
                     "chosen": _assistant(copy.sample.text), "rejected": _assistant(copy.text), **copy.columns(),
                     "group": copy.group, "tie": copy.category == "represent"})
    return rows, rejects


@dataclass(frozen=True)
class SourceCopy:
    """An item read back against its source sample: the copy's ``text`` in the place of the sample's."""

    item: Item
    sample: Sample
    text: str
    category: str | None

    @property
    def group(self) -> str:
        """The same for every row made of this copy."""
        return f"{self.item.columns.get('sample_id')}|{self.item.columns.get('perturbation_set')}|{self.item.row}"

    def columns(self) -> dict[str, Any]:
        cols = self.item.columns
        return {"sample_id": cols.get("sample_id"), "perturbation_set": cols.get("perturbation_set"),
                "perturbation_type": cols.get("perturbation_type"), "perturbation_category": self.category,
                "perturbation_rate": float(cols.get("perturbation_rate") or 0.0)}


def check_categories(items: list[Item]) -> None:
    """`DataValidationError` naming each item (file, row, field) whose category is missing or not the spec's."""
    bad = [RowProblem(i.source, "train", i.row, "perturbation_category",
                      f"{i.columns.get('perturbation_category')!r} is not one of the spec's categories "
                      f"({', '.join(CATEGORIES)})") for i in items
           if i.columns.get("perturbation_set") != ORIGINAL_SET
           and i.columns.get("perturbation_category") not in CATEGORIES]
    if bad:
        raise DataValidationError(bad, n_rows=len(items))


def source_copies(items: list[Item], samples: list[Sample], ties: str, dropped: Counter,
                  rejects: list[dict]) -> Iterator[SourceCopy]:
    """Every item but the sources themselves with its source and text; an item that makes no pair is appended to
    ``rejects`` with its reason, a representational copy under ``ties: drop`` counted in ``dropped``. An item whose
    category is missing or not one of the spec's is a bad row (`DataValidationError`), never a tie."""
    check_categories(items)
    by_id = {str(s.sample_id): s for s in samples}
    for item in items:
        cols = item.columns
        if cols.get("perturbation_set") == ORIGINAL_SET:
            continue  # the source itself
        base = {"sample_id": cols.get("sample_id"), "perturbation_set": cols.get("perturbation_set"),
                "source": item.source, "row": item.row}
        sample = by_id.get(str(cols.get("sample_id")))
        if sample is None:
            rejects.append({**base, "reason": "no_source", "detail": "no source sample has this sample_id"})
            continue
        text = item_text(sample, item.messages)
        if text is None:
            rejects.append({**base, "reason": "prompt_mismatch",
                            "detail": "the item's prompt is not the sample's template around a text"})
            continue
        if text == sample.text:
            rejects.append({**base, "reason": "unchanged", "detail": "the copy is its source: it makes no pair"})
            continue
        category = cols.get("perturbation_category")
        if category == "represent" and ties == "drop":
            dropped["represent_no_pair"] += 1
            continue
        yield SourceCopy(item, sample, text, category)


def item_text(sample: Sample, messages: list[dict]) -> str | None:
    """The text an item's prompt holds in the place of the sample's ``{{text}}`` (the template's other parts must
    match exactly), or None."""
    shape = sample.prompt(_SENTINEL)
    if len(shape) != len(messages):
        return None
    text = None
    for want, got in zip(shape, messages):
        if want["role"] != got["role"]:
            return None
        if _SENTINEL not in want["content"]:
            if want["content"] != got["content"]:
                return None
            continue
        head, _, tail = want["content"].partition(_SENTINEL)
        content = got["content"]
        if _SENTINEL in tail or not (content.startswith(head) and content.endswith(tail)) \
                or len(content) < len(head) + len(tail):
            return None
        text = content[len(head):len(content) - len(tail)]
    return text


def item_operators(columns: dict) -> frozenset:
    """The operators whose edits made an item: the ``kind`` of each of its ``perturbation_changes``."""
    return frozenset(str(c.get("kind")) for c in columns.get("perturbation_changes") or []
                     if isinstance(c, dict) and c.get("kind"))


def question_of(sample: Sample) -> str:
    """What the two texts answer: the sample's user turn(s) with the text left out."""
    parts = [m["content"].replace(_SENTINEL, "").strip() for m in sample.prompt(_SENTINEL) if m["role"] == "user"]
    return "\n\n".join(p for p in parts if p)


def _assistant(text: str) -> str:
    return json.dumps([{"role": "assistant", "content": text}], ensure_ascii=False)


# ---- pointwise ---------------------------------------------------------------------------------------------------

def pointwise_pairs(rows: list[dict], ties: str, dropped: Counter, *, min_delta: float, tie_margin: float,
                    max_pairs: int, seed: int, score_key: str,
                    scale: tuple[float, float]) -> tuple[list[dict], list[dict]]:
    """Evaluations of a copy ranked against the source's score (see the module doc): (rows, rejects)."""
    evals, rejects = score_evaluations(rows, score_key=score_key, scale=scale)
    source_scores: dict[int, list[float]] = defaultdict(list)
    groups: dict[tuple[int, str], list[Evaluation]] = defaultdict(list)
    for e in evals:
        if e.perturbation_set == ORIGINAL_SET:
            source_scores[e.sample_id].append(e.score)
        else:
            groups[(e.sample_id, e.perturbation_set)].append(e)
    pairs = []
    for (sample_id, _), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if sample_id not in source_scores:
            rejects += [{"sample_id": e.sample_id, "perturbation_set": e.perturbation_set, "judge_model": e.judge_model,
                         "reason": "no_source_score", "detail": f"no evaluation of the sample's {ORIGINAL_SET} set"}
                        for e in group]
            continue
        anchor = float(statistics.median(source_scores[sample_id]))
        if group[0].perturbation_category == "error":  # the copy below the source is right
            chosen = [e for e in group if e.score < anchor]
            rejected = [e for e in group if e.score >= anchor]
            candidates = [(c, r) for c in chosen for r in rejected if r.score - c.score >= min_delta]
        elif ties == "drop":
            dropped["represent_no_pair"] += len(group)
            continue
        else:  # the copy at the source's score is right
            chosen = [e for e in group if abs(e.score - anchor) <= tie_margin]
            rejected = [e for e in group if abs(e.score - anchor) > tie_margin]
            candidates = [(c, r) for c in chosen for r in rejected
                          if abs(r.score - anchor) - abs(c.score - anchor) >= min_delta]
        dropped["candidates"] += len(chosen) * len(rejected)
        dropped["min_delta"] += len(chosen) * len(rejected) - len(candidates)
        random.Random(f"{seed}|{sample_id}|{group[0].perturbation_set}").shuffle(candidates)
        candidates.sort(key=lambda cr: -abs(cr[0].score - cr[1].score))
        dropped["cap"] += max(0, len(candidates) - max_pairs)
        pairs += [_pointwise_row(c, r, anchor) for c, r in candidates[:max_pairs]]
    return pairs, rejects


def _pointwise_row(chosen: Evaluation, rejected: Evaluation, anchor: float) -> dict:
    return {"prompt": chosen.prompt, "chosen": _assistant(chosen.evaluation), "rejected": _assistant(rejected.evaluation),
            "score_chosen": chosen.score, "score_rejected": rejected.score,
            "score_delta": abs(chosen.score - rejected.score), "anchor_score": anchor, "sample_id": chosen.sample_id,
            "perturbation_type": chosen.perturbation_type, "perturbation_category": chosen.perturbation_category,
            "perturbation_rate": chosen.perturbation_rate, "chosen_model": chosen.judge_model,
            "rejected_model": rejected.judge_model}


__all__ = ["FORMS", "TIES", "RESPONSE_TIE", "SourceCopy", "source_copies", "PanelDataError", "known_pairs",
           "item_text", "question_of"]


def heldout_copies(heldout: list[dict], samples: list[Sample]) -> Iterator[tuple[dict, Sample, str]]:
    """(item, its sample, its text) of each held-out copy whose text differs from its source's, in the items' order
    (the original's copy, a copy of an unknown sample and one whose text cannot be read are left out)."""
    by_id = {str(s.sample_id): s for s in samples}
    for item in heldout:
        sample = by_id.get(str(item["sample_id"]))
        if item.get("perturbation_set") == ORIGINAL_SET or sample is None:
            continue
        text = item_text(sample, item["prompt"])
        if text is not None and text != sample.text:
            yield item, sample, text


def write_heldout_pairs(heldout: list[dict], samples: list[Sample], path: Path) -> int:
    """Each held-out error copy against its source as a pairwise-suite row (``id`` sample|set, ``sample_id`` (the
    suite's unit: one sample's pairs share its text), ``prompt`` the question, ``response_a`` the source,
    ``response_b`` the copy, ``label`` A>B, ``category`` the perturbation type); the suite shows both orders. Returns
    the rows written."""
    rows = [{"id": f"{item['sample_id']}|{item['perturbation_set']}", "sample_id": str(item["sample_id"]),
             "prompt": question_of(sample), "response_a": sample.text, "response_b": text, "label": "A>B",
             "category": item.get("perturbation_type")}
            for item, sample, text in heldout_copies(heldout, samples)
            if item.get("perturbation_category") == "error"]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lines(path, (json.dumps(r, ensure_ascii=False) for r in rows))
    logger.info("held-out pairs: %d error copies against their sources (%s)", len(rows), path)
    return len(rows)


def write_heldout_rewrites(heldout: list[dict], samples: list[Sample], path: Path) -> int:
    """The held-out representational rewrites as rows of the ``rewrites`` suite (the pairwise schema): each rewrite
    against its source (``category`` ``source_vs_rewrite``: ``response_a`` the source, ``response_b`` the rewrite,
    label A>B, so the share the judge "gets right" is the share of rewrites it scores below their source) and against
    one error copy of the same source (``rewrite_vs_error``: ``response_a`` the rewrite, ``response_b`` the error copy,
    label A>B: the judge tells an error from a change of form). A sample's rewrites take its error copies in turn
    (sorted by set), so each rewrite is scored against one. ``id`` sample|rewrite set[|error set]. Returns the rows
    written (a sample with rewrites and no error copy gives only its source rows)."""
    copies = list(heldout_copies(heldout, samples))
    errors: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for item, _, text in copies:
        if item.get("perturbation_category") == "error":
            errors[str(item["sample_id"])].append((str(item["perturbation_set"]), text))
    rows, turn = [], Counter()
    for item, sample, text in copies:
        if item.get("perturbation_category") != "represent":
            continue
        sid, rewrite_set = str(item["sample_id"]), str(item["perturbation_set"])
        common = {"sample_id": sid, "prompt": question_of(sample), "label": "A>B"}
        rows.append({"id": f"{sid}|{rewrite_set}", **common, "response_a": sample.text, "response_b": text,
                     "category": "source_vs_rewrite"})
        own = sorted(errors.get(sid, []))
        if own:
            error_set, error_text = own[turn[sid] % len(own)]
            turn[sid] += 1
            if error_text != text:
                rows.append({"id": f"{sid}|{rewrite_set}|{error_set}", **common, "response_a": text,
                             "response_b": error_text, "category": "rewrite_vs_error"})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lines(path, (json.dumps(r, ensure_ascii=False) for r in rows))
    logger.info("held-out rewrites: %d rows, %d rewrites against their sources and %d against an error copy (%s)",
                len(rows), sum(r["category"] == "source_vs_rewrite" for r in rows),
                sum(r["category"] == "rewrite_vs_error" for r in rows), path)
    return len(rows)
