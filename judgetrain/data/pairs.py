"""Build anchor-consensus, direction-aware DPO pairs from a judge panel's scored evaluations.

    judgetrain pairs build --evaluations judgetrain/data/samples/panel/evaluations.jsonl.gz --output_dir pairs_out

Input: one row per (sample, perturbation set, judge) with ``sample_id``, ``perturbation_set`` (e.g.
``element_substitution_100pct``), ``perturbation_category`` (``error`` / ``represent``; derived from the set
name when absent), ``perturbation_rate`` (derived from the ``_<n>pct`` suffix when absent), ``judge_model``,
``prompt`` (the messages the judge saw: a list or its JSON string) and ``evaluation`` (the judge's text).

The construction is the one of iknow-lab/JudgeBias-DPO-RefFree:
1. the overall score of every evaluation is read by :mod:`judgetrain.data.scoreparse`; unreadable or out-of-scale
   scores are counted per judge and written to ``<out>/rejects.jsonl``, never guessed; only the judge's own turn
   is read: an evaluation holding a chat turn marker followed by more text (``<|im_end|>\n<|im_start|>...``) is
   rejected as ``fake_turn``, a trailing end-of-turn marker is dropped (:func:`judgetrain.data.chat.judge_turn`);
   a row whose ``reason`` is ``endpoint_rejected`` (`judgetrain judge`: the endpoint refused the prompt, there is no
   evaluation) is rejected as ``endpoint_rejected``, counted apart from the unparseable ones;
2. anchor per sample = median of the overall scores over all judges x the representational rate sets
   (the card's "4 models x 5 representational rates"; ``anchor_sets="represent"`` uses every represent set);
   samples with fewer than ``min_represent_evals`` such scores are counted and skipped;
3. for every sample, set and pair of judges: ``represent`` -> chosen = higher score (meaning kept, no penalty is
   right), ``error`` -> chosen = lower score (the injected error was caught); keep gaps >= ``min_delta``;
   drop represent pairs whose chosen score is more than ``represent_anchor_margin`` below the anchor and error
   pairs whose rejected score is more than ``error_anchor_margin`` below it;
4. at most ``max_pairs`` per sample and set: the largest gaps first, ties ordered by a seeded shuffle;
5. SHA-256 deduplication of (prompt, chosen, rejected); split by sample_id into train / validation parquet
   files in exactly the JudgeBias-DPO-RefFree schema, plus ``stats.json`` (the card's statistics table).
"""

# Late imports: pyarrow (inside the functions that use them): `judgetrain data check` and `pairs build` read rows
# without a model: tokenizer and training libraries come in with the functions that need them.

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable

from tqdm import tqdm

from judgetrain.data.chat import judge_turn
from judgetrain.data.io import UnreadableFile, read_file
from judgetrain.data.judgebias import PERTURBATION_SETS, TYPE_ALIASES, TYPE_CATEGORY, perturbation_set
from judgetrain.data.scoreparse import parse_overall_score_result
from judgetrain.data.validate import MALFORMED
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.numbers import check_scale, nan_to_none

logger = logging.getLogger(__name__)
PROGRESS_FROM = 20_000  # evaluations: a smaller panel is read in seconds, without a progress bar

# The perturbation vocabulary is the JudgeBias adapter's: one table for the data we read and the data we build.
ERROR_SETS = tuple(perturbation_set(t, r) for t, r in PERTURBATION_SETS if TYPE_CATEGORY[t] == "error")
REPRESENT_SETS = tuple(perturbation_set(t, r) for t, r in PERTURBATION_SETS if TYPE_CATEGORY[t] == "represent")
ERROR_TYPES = frozenset(t for t, c in TYPE_CATEGORY.items() if c == "error")
REPRESENT_TYPES = frozenset(t for t, c in TYPE_CATEGORY.items() if c == "represent")
CATEGORY_ALIASES = {"error": "error", "represent": "represent", "representational": "represent",
                    "representation": "represent"}

# the reason `judgetrain judge` writes on the row of a prompt its endpoint refused (judgetrain.judge.endpoint's
# REJECTED_REASON): no evaluation was written, so the row is no judge's unreadable score
ENDPOINT_REJECTED = "endpoint_rejected"
REQUIRED_COLUMNS = ("sample_id", "perturbation_set", "judge_model", "prompt", "evaluation")
OUTPUT_COLUMNS = ("prompt", "chosen", "rejected", "score_chosen", "score_rejected", "score_delta", "anchor_score",
                  "sample_id", "perturbation_type", "perturbation_category", "perturbation_rate", "chosen_model",
                  "rejected_model")
_EPS = 1e-9  # scores are half steps; the tolerance only absorbs float noise from arithmetic scores
# <type>_<pct>pct: the type is all before the last "_" (the rate holds none), the rate is matched on its own: no two
# quantifiers of the pattern share a character, so it cannot backtrack (the former "^(?P<type>.+?)_(?P<pct>\d+...)"
# let the lazy type and the digits compete for the same characters; only its anchoring kept it linear).
_RATE_RE = re.compile(r"(?P<pct>\d+(?:\.\d+)?)pct\n?")


class PanelDataError(BadInputError, ValueError):
    """The evaluations table cannot be used at all (unreadable file, missing columns)."""


def parse_set_name(name: str) -> tuple[str, float | None]:
    """``element_substitution_100pct`` -> (``element_substitution``, 1.0); combined sets canonicalised."""
    head, _, tail = name.rpartition("_")
    match = _RATE_RE.fullmatch(tail) if head and "\n" not in head else None
    ptype, rate = (head, float(match["pct"]) / 100) if match else (name, None)
    return TYPE_ALIASES.get(ptype, ptype), rate


def category_of(ptype: str) -> str | None:
    if ptype in ERROR_TYPES:
        return "error"
    if ptype in REPRESENT_TYPES:
        return "represent"
    return None


@dataclass(frozen=True)
class Evaluation:
    sample_id: int
    perturbation_set: str  # canonical name, e.g. all_error_perturbation_5pct
    perturbation_type: str
    perturbation_category: str
    perturbation_rate: float
    judge_model: str
    prompt: str  # JSON string of the message list
    evaluation: str
    score: float


# ---- input ---------------------------------------------------------------------------------------------------

def read_evaluations(source: str | Path | Iterable[dict]) -> list[dict]:
    """Rows of a jsonl / json / parquet file, optionally gzipped (or an iterable of dicts, e.g. a datasets.Dataset).

    The file is read by the data loaders' reader: a file or line that is not UTF-8, not JSON (including numbers of
    over 4,300 digits and nesting past the recursion limit) or a torn parquet file is a one-line PanelDataError
    naming the file and line."""
    if not isinstance(source, (str, Path)):
        return [dict(row) for row in source]
    path = Path(source)
    if path.is_dir():
        raise PanelDataError(f"--evaluations {path}: a folder; give the evaluations file (`judgetrain judge` writes "
                             f"{path / 'evaluations.jsonl'})")
    if not path.is_file():
        raise PanelDataError(f"evaluations file not found: {path}")
    try:
        rows = read_file(path).rows
    except UnreadableFile as err:
        raise PanelDataError(str(err)) from None
    if not isinstance(rows, list):  # parquet: a datasets.Dataset
        rows = rows.to_list()
    for i, row in enumerate(rows):
        if isinstance(row, dict) and MALFORMED in row:
            raise PanelDataError(f"{path}: {row[MALFORMED]}")
        if not isinstance(row, dict):
            raise PanelDataError(f"{path}: row {i} is not a JSON object")
    return rows


def _messages_json(prompt: Any) -> str:
    """The prompt as the JSON string of a [{"role", "content"}] list; ValueError when it is not one."""
    try:
        messages = json.loads(prompt) if isinstance(prompt, str) else prompt
    except RecursionError:
        raise ValueError("prompt is nested too deep to read") from None
    if not isinstance(messages, list) or not messages:
        raise ValueError("prompt is not a non-empty message list")
    clean = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise ValueError("prompt message without string role/content")
        clean.append({"role": message["role"], "content": message["content"]})
    return json.dumps(clean, ensure_ascii=False)


def _normalise(row: dict, key: str, scale: tuple[float, float]) -> tuple[Evaluation | None, dict | None]:
    """(evaluation, None) for a usable row, (None, reject record) otherwise."""
    missing = [col for col in REQUIRED_COLUMNS if row.get(col) is None]
    base = {"sample_id": row.get("sample_id"), "perturbation_set": row.get("perturbation_set"),
            "judge_model": row.get("judge_model")}
    if missing:
        return None, {**base, "reason": "missing_field", "detail": f"missing {', '.join(missing)}"}
    try:
        sample_id = int(row["sample_id"])
        if isinstance(row["sample_id"], float) and row["sample_id"] != sample_id:
            raise ValueError
    except (TypeError, ValueError):
        return None, {**base, "reason": "bad_row", "detail": f"sample_id {row['sample_id']!r} is not an integer"}
    ptype, name_rate = parse_set_name(str(row["perturbation_set"]))
    canonical_set = str(row["perturbation_set"])
    if name_rate is not None:
        canonical_set = f"{ptype}_{_pct(name_rate)}pct"
    raw_category = row.get("perturbation_category")
    category = CATEGORY_ALIASES.get(str(raw_category).lower()) if raw_category is not None else category_of(ptype)
    if category is None:
        detail = (f"perturbation_category {raw_category!r} is not error/represent" if raw_category is not None
                  else f"cannot derive the category of set {row['perturbation_set']!r}; give perturbation_category")
        return None, {**base, "reason": "bad_row", "detail": detail}
    rate = row.get("perturbation_rate")
    try:
        rate = float(rate) if rate is not None else (name_rate if name_rate is not None else 1.0)
    except (TypeError, ValueError):
        return None, {**base, "reason": "bad_row", "detail": f"perturbation_rate {rate!r} is not a number"}
    try:
        prompt = _messages_json(row["prompt"])
    except (ValueError, TypeError) as err:
        return None, {**base, "reason": "bad_row", "detail": str(err)}
    if row.get("reason") == ENDPOINT_REJECTED:
        return None, {**base, "reason": ENDPOINT_REJECTED, "detail": str(row.get("error") or "the endpoint refused "
                                                                         "the prompt")}
    text = row["evaluation"]
    if isinstance(text, str):  # only the judge's own turn is its verdict (judgetrain.data.chat)
        text, fake_turn = judge_turn(text)
        if fake_turn:
            return None, {**base, "reason": "fake_turn", "detail": f"the evaluation {fake_turn}", "evaluation": text}
    result = parse_overall_score_result(text, key=key, lo=scale[0], hi=scale[1])
    if not result.ok:
        return None, {**base, "reason": result.reason, "detail": result.detail, "value": result.value,
                      "evaluation": text if isinstance(text, str) else repr(text)}
    return Evaluation(sample_id, canonical_set, ptype, category, rate, str(row["judge_model"]), prompt, text,
                      result.score), None


def _pct(rate: float) -> str:
    pct = rate * 100
    return str(int(round(pct))) if abs(pct - round(pct)) < 1e-9 else f"{pct:g}"


# ---- anchors and hashes ------------------------------------------------------------------------------------

def compute_anchors(evals: list[Evaluation], *, anchor_sets: str = "rates") -> tuple[dict[int, list[float]], str]:
    """sample_id -> the scores its anchor is the median of, and the anchor set mode actually used.

    ``rates``: represent sets measured at a rate below 100% (the card's 5 representational rates); when the
    panel has none, every represent set is used (logged). ``represent``: every represent set.
    """
    represent = [e for e in evals if e.perturbation_category == "represent"]
    used = anchor_sets
    if anchor_sets == "rates":
        rated = [e for e in represent if e.perturbation_rate < 1.0]
        if rated:
            represent = rated
        else:
            used = "represent"
            logger.warning("no represent sets below 100% rate: anchors use every represent set")
    elif anchor_sets != "represent":
        raise ValueError(f"anchor_sets must be 'rates' or 'represent', not {anchor_sets!r}")
    scores: dict[int, list[float]] = defaultdict(list)
    for e in represent:
        scores[e.sample_id].append(e.score)
    return dict(scores), used


def _pair_hash(prompt: str, chosen: str, rejected: str) -> str:
    return hashlib.sha256(json.dumps([prompt, chosen, rejected], ensure_ascii=False).encode("utf-8")).hexdigest()


def pair_hash(row: dict) -> str:
    """SHA-256 of an output row's (prompt, chosen, rejected) JSON strings: the deduplication key."""
    return _pair_hash(row["prompt"], row["chosen"], row["rejected"])


def _assistant(text: str) -> str:
    return json.dumps([{"role": "assistant", "content": text}], ensure_ascii=False)


# ---- the pipeline: scores -> anchors -> pairs -> filters -> split ---------------------------------------------

def check_options(max_pairs: int, validation_fraction: float, scale: tuple[float, float]) -> None:
    """ValueError for options no pair builder can use (`build_pairs`, `judgetrain.perturb.known.known_pairs`)."""
    check_scale(scale)
    if max_pairs < 1:
        raise ValueError("max_pairs must be >= 1")
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError("validation_fraction must be in [0, 1)")


def load_table(evaluations: str | Path | Iterable[dict]) -> list[dict]:
    """The evaluation rows; :class:`PanelDataError` when the table is empty or lacks a required column."""
    rows = read_evaluations(evaluations)
    if not rows:
        raise PanelDataError("the evaluations table is empty")
    columns = set().union(*(row.keys() for row in rows))
    absent = [col for col in REQUIRED_COLUMNS if col not in columns]
    if absent:
        raise PanelDataError(f"the evaluations table lacks column(s) {', '.join(absent)}; has {sorted(columns)}")
    logger.info("read %d evaluations", len(rows))
    return rows


def score_evaluations(rows: list[dict], *, score_key: str = "overall_score",
                      scale: tuple[float, float] = (0.5, 5.5)) -> tuple[list[Evaluation], list[dict]]:
    """Stage 1: every row scored, or a reject record (with its row index) saying why not.

    A second evaluation of the same (sample, set, judge) is a reject too: it would count twice in the anchor.
    """
    evals: list[Evaluation] = []
    rejects: list[dict] = []
    seen: set[tuple[int, str, str]] = set()
    bar = tqdm(rows, desc="scoring evaluations", unit="row", disable=len(rows) < PROGRESS_FROM)
    for index, row in enumerate(bar):
        ev, reject = _normalise(row, score_key, scale)
        if ev is not None:
            key = (ev.sample_id, ev.perturbation_set, ev.judge_model)
            if key in seen:
                ev, reject = None, {"sample_id": ev.sample_id, "perturbation_set": ev.perturbation_set,
                                    "judge_model": ev.judge_model, "reason": "duplicate",
                                    "detail": "second evaluation of the same sample, set and judge"}
            else:
                seen.add(key)
        if reject is not None:
            rejects.append({"row": index, **reject})
        else:
            evals.append(ev)
    return evals, rejects


def count_rejects(rejects: list[dict], judges: Iterable[str]) -> dict[str, dict[str, int]]:
    """judge -> reason -> count; every judge of the table appears, with ``{}`` when none of its rows failed."""
    by_judge: dict[str, dict[str, int]] = {judge: {} for judge in sorted(judges)}
    for reject in rejects:
        counts = by_judge.setdefault(str(reject["judge_model"]), {})
        counts[reject["reason"]] = counts.get(reject["reason"], 0) + 1
    return by_judge


def sample_anchors(evals: list[Evaluation], *, anchor_sets: str = "rates",
                   min_represent_evals: int = 3) -> tuple[dict[int, float], list[int], str]:
    """Stage 2: sample_id -> anchor (median of its representational scores), the skipped samples (too few such
    scores to trust a median) and the anchor set mode used."""
    anchor_scores, used = compute_anchors(evals, anchor_sets=anchor_sets)
    all_samples = sorted({e.sample_id for e in evals})
    anchors = {sid: float(statistics.median(anchor_scores[sid])) for sid in all_samples
               if len(anchor_scores.get(sid, ())) >= min_represent_evals}
    skipped = [sid for sid in all_samples if sid not in anchors]
    if skipped:
        logger.warning("%d sample(s) skipped: fewer than %d representational scores for the anchor: %s",
                       len(skipped), min_represent_evals, skipped[:20])
    return anchors, skipped, used


def group_evaluations(evals: list[Evaluation], anchors: dict[int, float]) -> dict[tuple[int, str], list[Evaluation]]:
    """(sample_id, perturbation set) -> its judges' evaluations, sorted by judge; anchored samples only."""
    groups: dict[tuple[int, str], list[Evaluation]] = defaultdict(list)
    for e in evals:
        if e.sample_id in anchors:
            groups[(e.sample_id, e.perturbation_set)].append(e)
    for members in groups.values():
        members.sort(key=lambda e: e.judge_model)
    return dict(sorted(groups.items()))


def direct(a: Evaluation, b: Evaluation) -> tuple[Evaluation, Evaluation]:
    """(chosen, rejected) by the category's direction: ``represent`` keeps the higher score (no penalty for a
    harmless rewrite), ``error`` the lower one (the injected error was caught). Ties are the caller's to drop."""
    high, low = (a, b) if a.score > b.score else (b, a)
    return (high, low) if a.perturbation_category == "represent" else (low, high)


def anchor_ok(chosen: Evaluation, rejected: Evaluation, anchor: float, *, represent_anchor_margin: float,
              error_anchor_margin: float) -> bool:
    """The anchor filter: a represent pair's chosen score, an error pair's rejected score, may sit at most the
    margin below the sample's anchor (a judge far below consensus is not a trustworthy side of a pair)."""
    if chosen.perturbation_category == "represent":
        return chosen.score >= anchor - represent_anchor_margin - _EPS
    return rejected.score >= anchor - error_anchor_margin - _EPS


def candidate_pairs(members: list[Evaluation], anchor: float, dropped: Counter, *, min_delta: float,
                    represent_anchor_margin: float, error_anchor_margin: float
                    ) -> list[tuple[Evaluation, Evaluation, float]]:
    """Stage 3 and its filters for one group: every pair of judges, directed, as (chosen, rejected, gap); ties,
    gaps below ``min_delta`` and anchor-filtered pairs are counted in ``dropped`` by reason."""
    kept = []
    for a, b in combinations(members, 2):
        dropped["candidates"] += 1
        if abs(a.score - b.score) < _EPS:
            dropped["tie"] += 1
            continue
        chosen, rejected = direct(a, b)
        delta = abs(a.score - b.score)
        if delta < min_delta - _EPS:
            dropped["min_delta"] += 1
            continue
        if not anchor_ok(chosen, rejected, anchor, represent_anchor_margin=represent_anchor_margin,
                         error_anchor_margin=error_anchor_margin):
            dropped["anchor_filter"] += 1
            continue
        kept.append((chosen, rejected, delta))
    return kept


def cap_pairs(kept: list[tuple[Evaluation, Evaluation, float]], max_pairs: int, rng: random.Random
              ) -> list[tuple[Evaluation, Evaluation, float]]:
    """At most ``max_pairs``: the clearest pairs (largest gap) first, equal gaps ordered by ``rng``'s shuffle."""
    kept = list(kept)
    rng.shuffle(kept)
    kept.sort(key=lambda item: -item[2])
    return kept[:max_pairs]


def pair_row(chosen: Evaluation, rejected: Evaluation, delta: float, anchor: float) -> dict:
    """One output row in the JudgeBias-DPO-RefFree schema; the chosen judge's prompt is the pair's prompt."""
    return {
        "prompt": chosen.prompt,
        "chosen": _assistant(chosen.evaluation),
        "rejected": _assistant(rejected.evaluation),
        "score_chosen": float(chosen.score),
        "score_rejected": float(rejected.score),
        "score_delta": float(delta),
        "anchor_score": anchor,
        "sample_id": chosen.sample_id,
        "perturbation_type": chosen.perturbation_type,
        "perturbation_category": chosen.perturbation_category,
        "perturbation_rate": float(chosen.perturbation_rate),
        "chosen_model": chosen.judge_model,
        "rejected_model": rejected.judge_model,
    }


def make_pairs(evals: list[Evaluation], anchors: dict[int, float], dropped: Counter, *, min_delta: float = 0.5,
               represent_anchor_margin: float = 1.5, error_anchor_margin: float = 2.0, max_pairs: int = 5,
               seed: int = 0) -> list[dict]:
    """Stage 3: the capped, filtered pairs of every (sample, set) group as output rows, in group order."""
    pairs: list[dict] = []
    prompt_mismatch = 0
    for (sid, set_name), members in group_evaluations(evals, anchors).items():
        kept = candidate_pairs(members, anchors[sid], dropped, min_delta=min_delta,
                               represent_anchor_margin=represent_anchor_margin,
                               error_anchor_margin=error_anchor_margin)
        capped = cap_pairs(kept, max_pairs, random.Random(f"{seed}/{sid}/{set_name}"))
        dropped["cap"] += len(kept) - len(capped)
        for chosen, rejected, delta in capped:
            prompt_mismatch += chosen.prompt != rejected.prompt
            pairs.append(pair_row(chosen, rejected, delta, anchors[sid]))
    dropped["prompt_mismatch"] += prompt_mismatch
    if prompt_mismatch:
        logger.warning("%d pair(s) joined judges that saw different prompts; the chosen judge's prompt is kept",
                       prompt_mismatch)
    return pairs


def deduplicate(pairs: list[dict], dropped: Counter) -> list[dict]:
    """Filter: the first of every byte-identical (prompt, chosen, rejected) triple (SHA-256), order kept."""
    unique, hashes = [], set()
    for row in pairs:
        digest = pair_hash(row)
        if digest in hashes:
            dropped["duplicate"] += 1
            continue
        hashes.add(digest)
        unique.append(row)
    return unique


def validation_samples(sample_ids: Iterable[int], validation_fraction: float, seed: int) -> set[int]:
    """Stage 5: the held-out sample ids, a seeded share of the samples (at least one when asked for any and
    there are two or more), so that no sample is on both sides of the split."""
    order = sorted(set(sample_ids))
    random.Random(seed).shuffle(order)
    n_val = round(len(order) * validation_fraction)
    if validation_fraction > 0 and n_val == 0 and len(order) >= 2:
        n_val = 1
    return set(order[:n_val])


def split_by_sample(rows: list[dict], validation_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows), split by sample_id with :func:`validation_samples`."""
    held_out = validation_samples((row["sample_id"] for row in rows), validation_fraction, seed)
    return ([row for row in rows if row["sample_id"] not in held_out],
            [row for row in rows if row["sample_id"] in held_out])


def pair_statistics(train_rows: list[dict], val_rows: list[dict]) -> dict[str, Any]:
    """The card's statistics table: counts, category shares, samples per split, score gaps, pairs per type."""
    rows = train_rows + val_rows
    deltas = [row["score_delta"] for row in rows if row.get("score_delta") is not None]
    n_error = sum(row["perturbation_category"] == "error" for row in rows)
    n_repr = len(rows) - n_error
    n_samples = len({row["sample_id"] for row in rows})
    n_val_samples = len({row["sample_id"] for row in val_rows})
    return {
        "total_pairs": len(rows),
        "train_pairs": len(train_rows),
        "validation_pairs": len(val_rows),
        "error_pairs": n_error,
        "represent_pairs": n_repr,
        "error_share": n_error / len(rows) if rows else 0.0,
        "represent_share": n_repr / len(rows) if rows else 0.0,
        "unique_samples": n_samples,
        "train_samples": n_samples - n_val_samples,
        "validation_samples": n_val_samples,
        "score_delta_mean": statistics.fmean(deltas) if deltas else math.nan,
        "score_delta_median": float(statistics.median(deltas)) if deltas else math.nan,
        "pairs_by_type": dict(sorted(Counter(row["perturbation_type"] for row in rows).items())),
    }


def write_rejects(rejects: list[dict], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for reject in rejects:
            handle.write(json.dumps(reject, ensure_ascii=False) + "\n")


def build_pairs(
    evaluations: str | Path | Iterable[dict],
    out_dir: str | Path,
    *,
    min_delta: float = 0.5,
    represent_anchor_margin: float = 1.5,
    error_anchor_margin: float = 2.0,
    max_pairs: int = 5,
    min_represent_evals: int = 3,
    validation_fraction: float = 0.1,
    seed: int = 0,
    scale: tuple[float, float] = (0.5, 5.5),
    score_key: str = "overall_score",
    anchor_sets: str = "rates",
) -> dict[str, Any]:
    """Build the pairs, write ``train.parquet``, ``validation.parquet``, ``rejects.jsonl``, ``stats.json`` to
    ``out_dir`` and return the statistics. Raises :class:`PanelDataError` when the table has no usable shape."""
    check_options(max_pairs, validation_fraction, scale)
    rows = load_table(evaluations)  # read before the output folder is made: a refused table leaves nothing behind
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    evals, rejects = score_evaluations(rows, score_key=score_key, scale=scale)
    write_rejects(rejects, out / "rejects.jsonl")
    logger.info("scored %d evaluations, rejected %d (see %s)", len(evals), len(rejects), out / "rejects.jsonl")
    anchors, skipped, anchor_sets_used = sample_anchors(evals, anchor_sets=anchor_sets,
                                                         min_represent_evals=min_represent_evals)
    dropped: Counter = Counter()
    pairs = make_pairs(evals, anchors, dropped, min_delta=min_delta, represent_anchor_margin=represent_anchor_margin,
                       error_anchor_margin=error_anchor_margin, max_pairs=max_pairs, seed=seed)
    unique = deduplicate(pairs, dropped)
    logger.info("%d pairs from %d samples (%d candidates)", len(unique), len(anchors), dropped["candidates"])
    train_rows, val_rows = split_by_sample(unique, validation_fraction, seed)
    write_pairs(train_rows, out / "train.parquet")
    write_pairs(val_rows, out / "validation.parquet")

    stats = {**pair_statistics(train_rows, val_rows), **panel_counts(rows, evals, rejects),
             "anchored_samples": len(anchors), "skipped_samples": len(skipped), "skipped_sample_ids": skipped,
             "anchor_sets": anchor_sets_used, "candidate_pairs": dropped["candidates"],
             "dropped": {k: dropped[k] for k in ("tie", "min_delta", "anchor_filter", "cap", "duplicate")},
             "prompt_mismatch_pairs": dropped["prompt_mismatch"],
             "options": {"min_delta": min_delta, "represent_anchor_margin": represent_anchor_margin,
                         "error_anchor_margin": error_anchor_margin, "max_pairs": max_pairs,
                         "min_represent_evals": min_represent_evals, "validation_fraction": validation_fraction,
                         "seed": seed, "scale": list(scale), "score_key": score_key, "anchor_sets": anchor_sets}}
    (out / "stats.json").write_text(json.dumps(nan_to_none(stats), indent=2) + "\n", encoding="utf-8")
    logger.info("wrote %s (%d rows), %s (%d rows), stats.json", out / "train.parquet", len(train_rows),
                out / "validation.parquet", len(val_rows))
    return stats


def panel_counts(rows: list[dict], evals: list, rejects: list[dict]) -> dict[str, Any]:
    """The panel's rows as `build_pairs` counted them: read, scored, rejected (by judge, by reason, by the endpoint),
    and the judges."""
    judges = {str(row.get("judge_model")) for row in rows}
    return {"input_rows": len(rows), "scored_rows": len(evals), "rejected_rows": len(rejects),
            "rejects_by_judge": count_rejects(rejects, judges),
            "rejects_by_reason": dict(sorted(Counter(r["reason"] for r in rejects).items())),
            "endpoint_rejected_rows": sum(r["reason"] == ENDPOINT_REJECTED for r in rejects),
            "judges": sorted(judges)}


def output_schema():
    """The JudgeBias-DPO-RefFree parquet schema, column order as published."""
    import pyarrow as pa

    types = {"score_chosen": pa.float64(), "score_rejected": pa.float64(), "score_delta": pa.float64(),
             "anchor_score": pa.float64(), "sample_id": pa.int64(), "perturbation_rate": pa.float64()}
    return pa.schema([(name, types.get(name, pa.string())) for name in OUTPUT_COLUMNS])


def write_pairs(rows: list[dict], path: str | Path, columns: tuple[str, ...] = OUTPUT_COLUMNS) -> None:
    """``rows`` as a parquet file of ``columns`` (the published schema's types; ``tie`` a bool; any other column a
    string, or an integer sample_id / a float rate where the rows hold them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([output_schema().field(name) if name in OUTPUT_COLUMNS
                        else (name, pa.bool_() if name == "tie" else pa.string()) for name in columns])
    if rows and not isinstance(rows[0].get("sample_id"), int):
        schema = schema.set(schema.get_field_index("sample_id"), pa.field("sample_id", pa.string()))
    table = pa.Table.from_pydict({name: [row[name] for row in rows] for name in columns}, schema=schema)
    pq.write_table(table, path)


# ---- CLI -----------------------------------------------------------------------------------------------------
