"""From source samples and a spec to the items `judgetrain judge` reads, checked, with rejects and a summary.

    result = perturb(spec, samples, "perturbed")                       # rule operators (and stand-ins) only
    result = perturb(spec, samples, "perturbed", rewriter=spec_of_model, opts=Options(...), state=PartialState())

Writes into the output folder:

    items.jsonl     one item per sample x set x rate that passed its checks, in spec order: ``sample_id``,
                    ``perturbation_set`` (``<set>_<percent>pct``), ``perturbation_category``, ``perturbation_rate``,
                    ``perturbation_type`` (the set's name), ``prompt`` (the judge's messages with the perturbed
                    text), ``perturbation_changes`` (each edit's kind, before, after, position in the source text),
                    ``perturbation_method`` (rule | stand_in | model:<name>)
    rejects.jsonl   every item that failed a check, with its reason, detail, the text it would have had and its
                    changes (nothing is dropped silently)
    summary.json    per set: items, rejected, rejects by reason, edits per item (mean, min, max), method; per
                    error set, the mean change in words of a copy (``token_change``) and what the shorter, longer
                    and novel-token rules get on its copies against their sources (``rules``;
                    `judgetrain.perturb.shortcuts`: the novel-token rule fitted on other samples)

Seeded: every item draws from its own generator, seeded by the spec's seed, the set and the sample, so the same
seed, source and spec give byte-identical files, whichever sets are asked for.

Checks (the reason written to rejects): a rule item whose operators found nothing to edit (``no_eligible_span``;
the quantities they left alone, a percentage or a ratio, counted per set as ``left_alone``) or drew no valid edit
(``no_valid_edit``), an edit not where its operator said (``edit_misplaced``), a word table's edit that cuts a word
or shows in its casing (``edit_visible``); a model rewrite the endpoint refused (``endpoint_refused``, with the
server's status and message), empty (``empty``), cut at max_new_tokens (``cut_at_max_new_tokens``) or the same as
its source (``unchanged``); every represent item read by `judgetrain.perturb.oracle`, its quantities back to base
units: one of the source's missing (``numbers_lost``) or, made by rule, one added (``numbers_added``); a format
rewrite that changed a token outside markup, code, math or an identifier (``content_changed``); a numeric error
edit that reads back as the same quantity (``no_real_error``) or turns zero, of the other sign or below absolute
zero (``not_physical``); and the operator's declared ``checks``: ``entities`` (every listed word or table key
present in the source survives, as itself or an equivalent of the spec's represent tables), ``length_ratio`` (new
length / source length within [low, high]), ``changed: false`` (an operator allowed to leave the text as is),
``numbers: false`` (a represent operator whose quantities are not read).
"""

from __future__ import annotations

import json
import logging
import random
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from judgetrain.judge.judges import JudgeSpec
from judgetrain.judge.options import Options
from judgetrain.perturb.edits import Change, Span, aim, apply, misplaced, pick
from judgetrain.perturb.operators import Rules
from judgetrain.perturb.oracle import differ, read_quantities, token_differences
from judgetrain.perturb.rewrite import Request, diff_changes, rewrite_messages, run_rewrites
from judgetrain.perturb.shortcuts import LIMIT, CopyPair, over_limit, copy_rule_figures
from judgetrain.perturb.source import Sample
from judgetrain.perturb.spec import ORIGINAL_SET, PerturbSet, Spec, table_entities
from judgetrain.utils.files import write_json, write_lines

logger = logging.getLogger(__name__)

ITEMS = "items.jsonl"
REJECTS = "rejects.jsonl"
SUMMARY = "summary.json"


@dataclass(frozen=True)
class Planned:
    """One sample x set x rate: how it is made (rule operators, or a model rewrite)."""

    sample: Sample
    pset: PerturbSet | None  # None: the original
    rate: float
    set_name: str
    operators: tuple[str, ...]
    method: str  # rule | stand_in | model


def plan(spec: Spec, samples: list[Sample], *, with_model: bool) -> tuple[list[Planned], dict[str, str]]:
    """Every item to make, in output order, and the sets left out with why (a model set without a rewriting model
    and without a stand-in)."""
    planned, skipped = [], {}
    if spec.original:
        planned += [Planned(s, None, 0.0, ORIGINAL_SET, (), "original") for s in samples]
    for pset in spec.sets:
        ops, method = pset.operators, "rule"
        first = spec.operators[ops[0]]
        if first.kind == "model" and not with_model:
            ops, method = first.options["stand_in"], "stand_in"
            if not ops:
                for rate in pset.rates:
                    skipped[pset.set_name(rate)] = "a model rewrite: no --model given and the operator has no stand_in"
                continue
        elif first.kind == "model":
            method = "model"
        for rate in pset.rates:
            planned += [Planned(s, pset, rate, pset.set_name(rate), tuple(ops), method) for s in samples]
    return planned, skipped


def perturb(spec: Spec, samples: list[Sample], out: str | Path, *, rewriter: JudgeSpec | None = None,
            opts: Options | None = None, state=None) -> dict:
    """Make, check and write every item (see the module doc). Returns ``{"status": "finished" | "stopped",
    "summary", "items", "rejects", "n_items", "n_rejected", "skipped"}`` (on the main process; the others get the
    status only)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    planned, skipped = plan(spec, samples, with_model=rewriter is not None)
    rewrites: dict[tuple, dict] = {}
    model = [p for p in planned if p.method == "model"]
    if model:
        requests = [Request((p.sample.sample_id, p.set_name),
                            rewrite_messages(spec, spec.operators[p.operators[0]], p.rate, p.sample.text))
                    for p in model]
        got = run_rewrites(requests, spec, rewriter, opts, out, state)
        if got is None:
            return {"status": "stopped"}
        rewrites = got
    if state is not None and not state.is_main_process:
        return {"status": "finished"}
    made = make_all(spec, planned, rewrites)
    items, rejects, copies = [], [], []
    per_set: dict[str, dict[str, Any]] = {}
    for p, (text, changes, why, left_alone) in zip(planned, made):
        stats = per_set.setdefault(p.set_name, {"category": p.pset.category if p.pset else "represent",
                                                "rate": p.rate, "operators": list(p.operators), "method": p.method,
                                                "items": 0, "rejected": 0, "rejects": Counter(), "edits": [],
                                                "left_alone": Counter()})
        stats["left_alone"].update(left_alone)
        if why is None:
            why = check(spec, p, text, changes, rewrites.get((p.sample.sample_id, p.set_name)))
        if why is not None:
            stats["rejected"] += 1
            stats["rejects"][why[0]] += 1
            rejects.append({"sample_id": p.sample.sample_id, "perturbation_set": p.set_name, "reason": why[0],
                            "detail": why[1], "source": p.sample.source, "row": p.sample.row, "text": text,
                            "perturbation_changes": [c.as_dict() for c in changes]})
            continue
        stats["items"] += 1
        stats["edits"].append(len(changes))
        items.append(item(p, text, changes, rewriter))
        if p.pset is not None and p.pset.category == "error":
            copies.append(CopyPair(p.sample.sample_id, p.set_name, p.sample.text, text, len(changes)))
    summary = {"spec": spec.name, "seed": spec.seed, "samples": len(samples), "items": len(items),
               "rejected": len(rejects), "skipped_sets": skipped, "sets": {k: _set_summary(v) for k, v in per_set.items()}}
    figures = copy_rule_figures(copies)  # the tells a rule with no judge reads (shortcuts.py)
    for name, f in figures.items():
        summary["sets"][name]["token_change"] = f["token_change"]
        summary["sets"][name]["rules"] = f["rules"]
    for name, rule, accuracy in over_limit(figures):
        logger.warning("set %s: the %s rule, with no judge, scores %.3f on its copies against their sources (above "
                       "%s: a judge trained on them can learn that instead of the error; docs/perturb.md)", name, rule,
                       accuracy, LIMIT)
    write_lines(out / ITEMS, (json.dumps(i, ensure_ascii=False) for i in items))
    write_lines(out / REJECTS, (json.dumps(r, ensure_ascii=False) for r in rejects))
    write_json(out / SUMMARY, summary)
    for name, why in skipped.items():
        logger.warning("set %s left out: %s", name, why)
    logger.info("perturb: %d item(s) from %d sample(s) x %d set(s), %d rejected (%s)", len(items), len(samples),
                len(per_set), len(rejects), out / REJECTS)
    return {"status": "finished", "summary": summary, "items": str(out / ITEMS), "rejects": str(out / REJECTS),
            "n_items": len(items), "n_rejected": len(rejects), "skipped": skipped}


def make_all(spec: Spec, planned: list[Planned], rewrites: dict, every: float = 10.0) -> list[tuple]:
    """`make` for every planned item, in its order; a sample's spans are found once per operator, however many
    sets and rates use that operator (the items of one sample are made together). Logs items made, items/s and
    the time left at most every ``every`` seconds."""
    rules = Rules(spec, list({id(p.sample): p.sample.text for p in planned}.values()))
    by_sample: dict[int, list[int]] = {}
    for k, p in enumerate(planned):
        by_sample.setdefault(id(p.sample), []).append(k)
    made: list = [None] * len(planned)
    t0 = last = time.monotonic()
    done = 0
    for ks in by_sample.values():
        spans = SampleSpans(rules, planned[ks[0]].sample.text)
        for k in ks:
            made[k] = make(spec, planned[k], rewrites, spans)
        done += len(ks)
        now = time.monotonic()
        if now - last >= every and done < len(planned):
            last, rate = now, done / max(now - t0, 1e-9)
            logger.info("perturb: %d/%d items made (%.1f%%), %.1f items/s, ETA %.1f min", done, len(planned),
                        100 * done / len(planned), rate, (len(planned) - done) / rate / 60)
    return made


class SampleSpans:
    """The spans of one sample's text, per operator, found at the first ask."""

    def __init__(self, rules: Rules, text: str):
        self.rules, self.text, self.found = rules, text, {}

    def __call__(self, name: str) -> list[Span]:
        if name not in self.found:
            self.found[name] = self.rules.spans(name, self.text)
        return self.found[name]


def make(spec: Spec, p: Planned, rewrites: dict, spans_of: SampleSpans) -> tuple[str, list[Change], tuple | None,
                                                                               Counter]:
    """(new text, changes, None or the reason nothing usable could be made, the quantities the operators left
    alone by why: a percentage, a ratio, a value below absolute zero). ``spans_of(operator)``: the spans an
    operator could edit in the sample's text."""
    source = p.sample.text
    if p.pset is None:
        return source, [], None, Counter()
    if p.method == "model":
        got = rewrites[(p.sample.sample_id, p.set_name)]
        return got["text"], diff_changes(p.operators[0], source, got["text"]), None, Counter()
    rng = random.Random(f"{spec.seed}|{p.set_name}|{p.sample.sample_id!r}")
    spans = [s for name in p.operators for s in spans_of(name)]
    left_alone = Counter(s.skip for s in spans if s.skip)
    direction = rng.choice((-1, 1)) if p.pset.edits else None  # the way this copy's length may move
    picked = pick(aim(spans, direction) if direction else spans, p.rate, rng,
                  rng.randint(*p.pset.edits) if p.pset.edits else None)
    if not picked:
        alone = f" (left alone: {', '.join(f'{n} {k}' for k, n in sorted(left_alone.items()))})" if left_alone else ""
        return source, [], ("no_eligible_span", f"{', '.join(p.operators)} found nothing to edit in the text{alone}"), \
            left_alone
    text, changes = apply(source, picked, rng, direction)
    if not changes:
        return source, [], ("no_valid_edit", "no drawn edit differs from the source after rounding and keeps its "
                                              "physical sense"), left_alone
    return text, changes, None, left_alone


def check(spec: Spec, p: Planned, text: str, changes: list[Change], rewrite: dict | None) -> tuple[str, str] | None:
    """The first check ``text`` fails, as (reason, detail); None when it passes them all (see the module doc)."""
    if p.pset is None:
        return None
    source = p.sample.text
    declared: dict[str, Any] = {}
    for name in p.operators:
        declared.update(spec.operators[name].checks)
    if p.method == "model":
        if rewrite.get("error"):
            return "endpoint_refused", rewrite["error"]
        if not text.strip():
            return "empty", "the model wrote nothing"
        if not rewrite["stopped"]:
            return "cut_at_max_new_tokens", f"the rewrite stopped at {rewrite['n_tokens']} tokens, unfinished"
    else:
        where = misplaced(source, text, changes)
        if where:
            return "edit_misplaced", where
    if declared.get("changed", True) and (not changes or p.method == "model" and text.split() == source.split()):
        return "unchanged", "the text is its source" + (" (whitespace aside)" if text != source else "")
    kinds = {spec.operators[name].kind for name in p.operators}
    category = p.pset.category
    if category == "represent" and declared.get("numbers", True):
        lost, new = differ(*(read_quantities(t, spec.units, represent_words(spec)) for t in (source, text)))
        if lost:
            return "numbers_lost", "missing: " + ", ".join(map(str, lost)) + (
                f"; the copy has instead: {', '.join(map(str, new))}" if new else "")
        if new and p.method != "model":
            return "numbers_added", "the copy has: " + ", ".join(map(str, new))
    if category == "represent" and "format" in kinds:
        ordered = all(spec.operators[name].options.get("rewrite") != "list_order" for name in p.operators)
        why = token_differences(source, text, ordered)
        if why:
            return "content_changed", why
    if "table" in kinds and p.method != "model":
        why = visible_table_edit(spec, source, [c for c in changes if spec.operators[c.kind].kind == "table"])
        if why:
            return "edit_visible", why
    if category == "error" and "numeric" in kinds:
        why = no_real_error(spec, [c for c in changes if spec.operators[c.kind].kind == "numeric"], source)
        if why:
            return why
    if declared.get("entities"):
        for entity, spellings in table_entities(spec, declared["entities"]).items():
            if _has(source, {entity}) and not _has(text, spellings):
                others = sorted(spellings - {entity})
                return "entity_lost", f"{entity!r}" + (f" (nor {', '.join(others)})" if others else "")
    if "length_ratio" in declared:
        lo, hi = declared["length_ratio"]
        ratio = len(text) / max(len(source), 1)
        if not lo <= ratio <= hi:
            return "length_ratio", f"length {len(text)} / {len(source)} = {ratio:.2f}, outside [{lo:g}, {hi:g}]"
    return None


def represent_words(spec: Spec) -> tuple[str, ...]:
    """The words the spec's represent tables rewrite (b.i.d. and twice daily, acetone and C3H6O): the quantity
    checks read around them, so an abbreviation's letters are never a unit and its expansion loses nothing."""
    return tuple({w for op in spec.operators.values() if op.kind == "table" and op.category == "represent"
                  and op.options["match"] == "word" for k, v in op.options["pairs"].items() for w in (k, v)})


def visible_table_edit(spec: Spec, source: str, changes: list[Change]) -> str | None:
    """Why a word table's edit shows in the text (None when it does not): it cuts a word, or its casing differs
    from the word it replaced (a lowercase word turned capitalised, an all-capitals word not in capitals), a key or
    a value with capitals of its own (a formula, a name) aside."""
    for c in changes:
        op = spec.operators[c.kind]
        if op.options["match"] != "word":
            continue
        end = c.position + len(c.before)
        if source[c.position - 1: c.position].isalnum() or source[end: end + 1].isalnum():
            return f"{c.before!r} -> {c.after!r} cuts a word"
        if c.before in op.options["pairs"] and c.before != c.before.lower():
            continue  # a key with capitals of its own (HNO3, Teflon): its casing is the table's, not the text's
        if c.after in {v for v in op.options["pairs"].values() if v != v.lower()}:
            continue
        if c.before.islower() and not c.after.islower():
            return f"{c.before!r} -> {c.after!r}: a lowercase word written capitalised"
        if len(c.before) > 1 and c.before.isupper() and not c.after.isupper():
            return f"{c.before!r} -> {c.after!r}: a word in capitals written otherwise"
    return None


def no_real_error(spec: Spec, changes: list[Change], source: str = "") -> tuple[str, str] | None:
    """(reason, detail) where a numeric error edit is no real error: the quantity read back the same
    (``no_real_error``; read after the words of ``source`` before it, so a difference reads as one: ``by 2 °C`` ->
    ``by 2 K`` is none), or it turned zero, changed its sign or went below absolute zero (``not_physical``)."""
    for c in changes:
        prefix = source[max(0, c.position - 80): c.position]
        before, after = (differ(read_quantities(prefix + t, spec.units), read_quantities(prefix, spec.units))[0]
                         for t in (c.before, c.after))
        if not differ(before, after)[0]:
            return "no_real_error", f"{c.before!r} -> {c.after!r} reads back as the same quantity"
        for a, b in zip(before, after):
            offset = a.dim in spec.units and any(off for _, off in spec.units[a.dim].values())
            if b.value <= 0 if offset else (b.value == 0 or (a.value < 0) != (b.value < 0)):
                return "not_physical", f"{c.before!r} -> {c.after!r}"
    return None


def _has(text: str, words: set[str]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", text) for w in words)


def item(p: Planned, text: str, changes: list[Change], rewriter: JudgeSpec | None) -> dict:
    """One item in the schema `judgetrain judge` reads."""
    method = f"model:{rewriter.name}" if p.method == "model" else p.method
    return {"sample_id": p.sample.sample_id, "perturbation_set": p.set_name,
            "perturbation_category": p.pset.category if p.pset else "represent", "perturbation_rate": p.rate,
            "perturbation_type": p.pset.name if p.pset else "original", "prompt": p.sample.prompt(text),
            "perturbation_changes": [c.as_dict() for c in changes], "perturbation_method": method}


def _set_summary(stats: dict) -> dict:
    edits = stats.pop("edits")
    stats["rejects"] = dict(sorted(stats["rejects"].items(), key=lambda kv: (-kv[1], kv[0])))
    stats["left_alone"] = dict(sorted(stats["left_alone"].items()))
    stats["edits_per_item"] = ({"mean": round(statistics.fmean(edits), 4), "min": min(edits), "max": max(edits)}
                               if edits else None)
    return stats
