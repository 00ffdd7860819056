"""Run suites through a `ScoringEngine` (and, in generate mode, a `Generator`), sharded over processes, and write
what they found.

`evaluate_and_write` is the one evaluation path: the per-epoch callback and `judgetrain eval` both call it, so both
write the same files: ``<suite>.jsonl`` (one record per row, the first of the `PROXY_MODES` listed),
``<suite>.<mode>.jsonl`` (each other mode: ``<suite>.generate.jsonl`` holds the texts written) and ``results.json``
(see `eval_summary`). Each record and results.json's ``readings`` say what the scores are (`ScoringEngine.reading`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate.utils import gather_object

from judgetrain.config.recipe import LIKELIHOOD_MODES, PROXY_MODES, READINGS, recorded_mode
from judgetrain.eval.compare import REGRESSION_ALPHA, worse_rule
from judgetrain.eval.evidence import headline_table, paired_deltas, suite_evidence
from judgetrain.eval.generate import generate_sharded
from judgetrain.eval.logkeys import over_rule_keys, rule_keys
from judgetrain.eval.metrics import Items, flatten_eval_metrics, flatten_mode_metrics, interval_keys
from judgetrain.eval.reference import save_base_reference
from judgetrain.eval.rules import LEARNED_RULE, NovelTokens, RuleFigures, learned, rule_figures
from judgetrain.eval.scoring import RowScore, ScoringEngine, score_sharded
from judgetrain.eval.suites import (
    SuiteSpec,
    applies,
    build_generate_record,
    build_record,
    build_requests,
    generate_metrics,
    generate_prompts,
    select_rows,
    suite_metrics,
)
from judgetrain.trainer.parallelism import sharding_of
from judgetrain.utils.files import naming_failures
from judgetrain.utils.numbers import nan_to_none

logger = logging.getLogger(__name__)


@dataclass
class SuiteResult:
    """One suite's outcome: ``metrics`` (nested, from judgetrain.eval.metrics plus counts), per-row ``records`` in row
    order, and ``stats`` (engine work for this suite: sequences, real/padded tokens, forwards, seconds), all of the
    first of the `PROXY_MODES` scored (empty when only generate ran); ``modes``: the other modes' SuiteResults."""

    name: str
    metrics: dict[str, Any]
    records: list[dict]
    stats: dict[str, float] = field(default_factory=dict)
    modes: dict[str, SuiteResult] = field(default_factory=dict)
    items: Items | None = None  # the per-item figures (what intervals and paired deltas resample)
    intervals: dict[str, dict[str, float]] = field(default_factory=dict)  # {metric: {value, ci_low, ci_high, n}}
    rules: dict[str, RuleFigures] = field(default_factory=dict)  # the rules' figures on the same rows (bare only)
    learned: dict[str, dict[str, Any]] = field(default_factory=dict)  # {metric: its verdict against the best rule}

    def flat(self, prefix: str = "eval/") -> dict[str, float]:
        """Logged keys of this suite (docs/evaluation.md, "Where metrics go"), e.g. ``eval/rmbench/hard_acc``, and
        those of its other modes, ``eval/rmbench/generate/hard_acc``; each figure with an interval also as
        ``.../ci_low``, ``.../ci_high``; the rules' figures (``eval/rmbench/rule/shorter/hard_acc``) and each judge
        figure's difference from the best rule (``eval/rmbench[/<mode>]/over_rule/hard_acc``)."""
        out = flatten_eval_metrics(self.name, self.metrics, prefix=prefix) if self.metrics else {}
        out.update(interval_keys(self.intervals, f"{prefix}{self.name}/"))
        out.update(over_rule_keys(self.learned, f"{prefix}{self.name}/"))
        for mode, sub in self.modes.items():
            out.update(flatten_mode_metrics(self.name, mode, sub.metrics, prefix=prefix))
            out.update(interval_keys(sub.intervals, f"{prefix}{self.name}/{mode}/"))
            out.update(over_rule_keys(sub.learned, f"{prefix}{self.name}/{mode}/"))
        out.update(rule_keys(self.name, self.rules, prefix))
        return out

    def items_by_mode(self, bare: str) -> dict[str, Items]:
        """{mode: per-item figures} of this suite, the bare mode's under ``bare``."""
        out = {bare: self.items} if self.items is not None else {}
        out.update({mode: sub.items for mode, sub in self.modes.items() if sub.items is not None})
        return out


def _rows(spec: SuiteSpec) -> list[dict]:
    rows = spec.load_rows()  # the cap is applied here once; later calls keep these rows
    return list(rows) if not isinstance(rows, list) else rows


def _requests(spec: SuiteSpec, rows: list[dict], mode: str, indices: list[int] | None = None) -> tuple[list, int]:
    """(the engine's requests for ``rows`` in ``mode``, requests per row: 2 in verdict mode, one per order, else 1),
    each named by its suite row (``indices``, default 0..n-1) so the engine keeps its token ids across evals."""
    requests, per_row = [], 1
    for i, row in zip(range(len(rows)) if indices is None else indices, rows):
        built = build_requests(spec, row, mode)
        per_row = len(built)
        for k, req in enumerate(built):
            req.cache_key = f"{spec.key}:{i}" + (f":{k}" if len(built) > 1 else "")
            requests.append(req)
    return requests, per_row


def _per_row(scores: list[RowScore], per_row: int) -> list[RowScore]:
    """One RowScore per row from ``per_row`` consecutive ones (verdict mode's two orders): the scores in order, None
    when any was skipped."""
    if per_row == 1:
        return scores
    out = []
    for start in range(0, len(scores), per_row):
        part = scores[start:start + per_row]
        skipped = any(s.skipped for s in part)
        out.append(RowScore(None if skipped else [x for s in part for x in s.scores], truncated=any(s.truncated for s in part),
                            skipped=skipped, no_reference=any(s.no_reference for s in part)))
    return out


PROGRESS_EVERY_S = 30.0  # a suite's progress line at most this often (main process)


class SuiteProgress:
    """A suite's progress while it is scored, logged by the main process at most every `PROGRESS_EVERY_S` seconds:
    ``eval rmbench: pass 1 of the suite, 120/300 forwards (40%), ~19/48 rows, 2.1 rows/s, ETA 0.2 min``. The scoring
    engine calls `stage` with a pass's forwards (the policy's, then the reference's) and `forward` before each one;
    rows are the suite's rows times the pass's share done (sharded over processes, they move together)."""

    def __init__(self, label: str, n_rows: int, main: bool):
        self.label, self.n_rows, self.main = label, n_rows, main
        self.passes, self.total, self.done = 0, 0, 0
        self.t0 = self.last = time.monotonic()

    def stage(self, total: int) -> None:
        self.passes, self.total, self.done = self.passes + 1, total, 0
        self.t0 = time.monotonic()

    def forward(self) -> None:
        self.done += 1
        now = time.monotonic()
        if not self.main or now - self.last < PROGRESS_EVERY_S or not self.total:
            return
        self.last = now
        share = min(self.done / self.total, 1.0)
        rate = share * self.n_rows / max(now - self.t0, 1e-9)
        eta = (1 - share) * self.n_rows / rate if rate > 0 else float("nan")
        logger.info("eval %s: pass %d of the suite, %d/%d forwards (%.0f%%), ~%d/%d rows, %.1f rows/s, ETA %.1f min",
                    self.label, self.passes, self.done, self.total, 100 * share, round(share * self.n_rows),
                    self.n_rows, rate, eta / 60)


def _score(engine: ScoringEngine, spec: SuiteSpec, rows: list[dict], mode: str, state: Any,
           bare: bool = True) -> SuiteResult:
    name = spec.name
    requests, per_row = _requests(spec, rows, mode)
    before = engine.stats.as_dict()
    t0 = time.perf_counter()
    progress = SuiteProgress(name if bare else f"{name} ({mode})", len(rows), state is None or state.is_main_process)
    scores, rows_per_rank = score_sharded(engine, requests, state, progress)
    scores = _per_row(scores, per_row)
    seconds = time.perf_counter() - t0
    reading = engine.reading(mode)
    records = [build_record(name, i, row, s, mode, reading) for i, (row, s) in enumerate(zip(rows, scores))]
    metrics = suite_metrics(name, records, mode)
    metrics["runtime"] = seconds
    items, intervals = suite_evidence(name, mode, records)
    after = engine.stats.as_dict()
    stats = {k: after[k] - before[k] for k in after}  # this process's share of the work
    stats["seconds"] = seconds
    if rows_per_rank is not None:
        stats["rows_per_rank"] = rows_per_rank
    logger.info("eval %s%s: %d rows (%d skipped, %d truncated) in %.1fs", name, "" if bare else f" ({mode})",
                len(rows), metrics["n_skipped"], metrics["n_truncated"], seconds)
    return SuiteResult(name, metrics, records, stats, items=items, intervals=intervals)


def _generate(engine: ScoringEngine, generator: Any, spec: SuiteSpec, rows: list[dict], state: Any) -> SuiteResult:
    """Generate mode on a balanced sample of the scored rows (``spec.generate_max_rows``): every prompt written once
    over the processes, parsed, and set beside the judge-mode figure of the same response (one forward each)."""

    keep = select_rows(spec.name, rows, spec.generate_max_rows, spec.seed)
    picked = [rows[i] for i in keep]
    prompts = [generate_prompts(spec.name, row, spec.prompt) for row in picked]
    before = generator.stats.as_dict()
    t0 = time.perf_counter()
    flat = generate_sharded(generator, [p for row in prompts for p in row], state)
    gen_seconds = time.perf_counter() - t0
    expected, _ = score_sharded(engine, _requests(spec, picked, "judge", keep)[0], state)
    seconds = time.perf_counter() - t0
    records, start = [], 0
    for i, row, row_prompts, judged in zip(keep, picked, prompts, expected):
        records.append({**build_generate_record(spec.name, i, row, flat[start: start + len(row_prompts)], judged),
                        "reading": READINGS["generate"]})
        start += len(row_prompts)
    metrics = generate_metrics(spec.name, records)
    metrics["runtime"] = seconds
    cut = sum(1 for o in (o for r in records for o in r["outputs"]) if o["truncated"])
    if cut:  # a prompt cut from the left loses its start (the rubric, the system prompt): say it, not just count it
        logger.warning("eval %s (generate): %d of %d prompts cut from the left to fit max_length %d - max_new_tokens "
                       "%d; raise max_length or lower eval_generate_max_new_tokens",
                       spec.name, cut, metrics["n_generated"], generator.max_length, generator.max_new_tokens)
    after = generator.stats.as_dict()
    stats = {k: after[k] - before[k] for k in after if isinstance(after[k], (int, float))}
    stats.update(seconds=seconds, generate_seconds=gen_seconds)
    logger.info("eval %s (generate): %d rows, %d texts, parse rate %.2f, %d tokens in %.1fs", spec.name, len(records),
                metrics["n_generated"], metrics["parse_rate"], metrics["tokens_generated"], seconds)
    items, intervals = suite_evidence(spec.name, "generate", records)
    return SuiteResult(spec.name, metrics, records, stats, items=items, intervals=intervals)


def evaluate(
    engine: ScoringEngine,
    specs: list[SuiteSpec],
    *,
    state: Any | None = None,
    modes: list[str] | tuple[str, ...] | None = None,
    generator: Any = None,
    novel: NovelTokens | None = None,
    base_reference: dict[str, float] | None = None,
) -> dict[str, SuiteResult]:
    """Score every suite in each of ``modes`` (default: the engine's ``scoring``); all processes must call this together
    when ``state`` has several processes. The first of the `PROXY_MODES` listed is the SuiteResult itself, the other
    modes its ``modes``; ``generate`` needs ``generator`` (a `judgetrain.eval.generate.Generator`). Each suite's rules
    that need no judge (`judgetrain.eval.rules`; ``novel``: the novel-token rule fitted on training items, absent
    without it) are computed on the same rows, and each judge figure set beside the best of them (`set_rules`).

    Rows are loaded once per spec and kept on it (``spec.rows``) so later calls score the same rows. A response's
    policy log-prob is computed once for every likelihood mode listed (`ScoringEngine.sharing_policy_scores`).
    ``base_reference``: filled with those log-probs keyed as an adapter's reference (this process's share), where the
    engine scores a base model alone (`ScoringEngine.scores_its_own_reference`). Returns {suite name: SuiteResult};
    every process gets the full results.
    """
    modes = list(modes or [engine.scoring])
    if "generate" in modes and generator is None:
        raise ValueError("the generate scoring mode needs a generator (judgetrain.eval.generate.Generator)")
    proxies = [m for m in modes if m in PROXY_MODES]
    results: dict[str, SuiteResult] = {}
    with engine.sharing_policy_scores():  # the weights hold still: the likelihood modes read one policy forward
        for spec in specs:
            rows = _rows(spec)
            res = _score(engine, spec, rows, proxies[0], state) if proxies else SuiteResult(spec.name, {}, [])
            for mode in proxies[1:]:
                res.modes[mode] = _score(engine, spec, rows, mode, state, bare=False)
            if "verdict" in modes and applies(spec.name, "verdict"):
                res.modes["verdict"] = _score(engine, spec, rows, "verdict", state, bare=False)
            if "generate" in modes:
                res.modes["generate"] = _generate(engine, generator, spec, rows, state)
            set_rules(res, spec, rows, novel)
            results[spec.name] = res
        if base_reference is not None and engine.scores_its_own_reference:
            base_reference.update(engine.policy_values_as_reference())
    return results


def set_rules(res: SuiteResult, spec: SuiteSpec, rows: list[dict], novel: NovelTokens | None) -> None:
    """The rules' figures on the suite's rows (computed once per eval set), and each mode's verdicts against the best
    rule (`judgetrain.eval.rules.learned`)."""
    if novel is None and not _SAID_NO_NOVEL:
        _SAID_NO_NOVEL.append(spec.name)
        logger.info("rules that need no judge: no novel-token rule (it is fitted on training items: `judgetrain eval "
                    "--rules_train_pairs FILE`, or the loop's training pairs); the shorter, longer and (pairwise "
                    "suites) first-shown rules stand beside the judge")
    res.rules = rule_figures(spec.suite, rows, novel)
    if not res.rules and rows and spec.key not in _SAID_NO_NOVEL:
        _SAID_NO_NOVEL.append(spec.key)
        logger.info("eval %s: no rule that needs no judge applies: its rows hold no response to read alone",
                    spec.name)
    for mode, sub in [("", res), *res.modes.items()]:
        try:
            sub.learned = learned(sub.items, res.rules) if sub.items is not None else {}
        except ValueError as err:  # items that cannot be paired (two rows of one id): said, the figures stand
            logger.warning("eval %s%s: no verdict against the rules that need no judge: %s", spec.name,
                           f" ({mode})" if mode else "", err)


_SAID_NO_NOVEL: list[str] = []  # said once a process: the missing novel-token rule, an eval set no rule reads


def flat_metrics(results: dict[str, SuiteResult], prefix: str = "eval/") -> dict[str, float]:
    out: dict[str, float] = {}
    for res in results.values():
        out.update(res.flat(prefix))
    return out


def write_records(results: dict[str, SuiteResult], directory: str | Path) -> list[Path]:
    """Write <directory>/<suite>.jsonl (one record per row) and <directory>/<suite>.<mode>.jsonl for each other mode.
    Call on the main process only. A write that fails (a full disk) removes every file of this call, the one it was
    writing included, and raises naming that file: no part of a set of per-row files is left to be read as whole."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    try:
        for name, res in results.items():
            parts = ([(f"{name}.jsonl", res.records)] if res.metrics else []) + [
                (f"{name}.{mode}.jsonl", sub.records) for mode, sub in res.modes.items()]
            for filename, records in parts:
                path = directory / filename
                paths.append(path)
                with naming_failures(path), path.open("w") as f:
                    for rec in records:
                        f.write(json.dumps(nan_to_none(rec)) + "\n")
    except OSError:
        _remove(paths)
        raise
    return paths


def _remove(paths: list[Path]) -> None:
    """The files this evaluation wrote; a link is left as it is (not ours: the error names where it leads)."""
    for path in paths:
        if not path.is_symlink():
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


RESULTS_FILE = "results.json"


def write_evaluation(results: dict[str, SuiteResult], summary: dict[str, Any], directory: str | Path) -> None:
    """The per-row files (`write_records`), then ``results.json``: a folder that holds it holds a whole evaluation.
    An earlier evaluation's results.json goes first (a resumed run scoring this step again), and a write that fails
    removes what this one wrote. Call on the main process only."""
    path = Path(directory) / RESULTS_FILE
    path.unlink(missing_ok=True)
    paths = write_records(results, directory)
    try:
        with naming_failures(path):
            path.write_text(json.dumps(nan_to_none(summary), indent=1))
    except OSError:
        _remove([*paths, path])
        raise


def eval_summary(results: dict[str, SuiteResult], engine: ScoringEngine, *, num_processes: int = 1,
                 modes: list[str] | None = None, generator: Any = None, **about: Any) -> dict[str, Any]:
    """The results.json document: ``about`` (what was scored: model / adapter, or step / epoch), the logged flat
    ``metrics``, the nested ``results`` and per-suite ``stats`` of each suite (the bare mode's), ``mode_results`` and
    ``mode_stats`` ({suite: {mode: ...}}) of the other modes, and the engine's (and generator's) totals."""
    modes = list(modes or [engine.scoring])
    return {
        **about,
        "scoring": recorded_mode(modes),
        "scoring_modes": modes,
        "readings": {mode: engine.reading(mode) for mode in modes},  # what each mode's figures are
        "metrics": flat_metrics(results),
        "results": {name: r.metrics for name, r in results.items()},
        "intervals": {name: {m: sub.intervals for m, sub in [(recorded_mode(modes), r), *r.modes.items()]
                             if sub.intervals} for name, r in results.items()},
        "stats": {name: r.stats for name, r in results.items()},
        "rules": rules_summary(results, recorded_mode(modes)),
        "learned_rule": LEARNED_RULE,
        "mode_results": {name: {m: sub.metrics for m, sub in r.modes.items()} for name, r in results.items() if r.modes},
        "mode_stats": {name: {m: sub.stats for m, sub in r.modes.items()} for name, r in results.items() if r.modes},
        "engine": engine.stats.as_dict(),
        **({"generator": generator.stats.as_dict()} if generator is not None else {}),
        "num_processes": num_processes,
        **_model_sharding(engine.model),
    }


def rules_summary(results: dict[str, SuiteResult], bare: str | None) -> dict[str, Any]:
    """results.json's ``rules``: per suite, each rule's ``figures`` (its nested figures and intervals) and ``learned``
    ({mode: {metric: the judge's verdict against the best rule}}, the bare mode under its name)."""
    return {name: {"figures": {rule: {"metrics": f.metrics, "intervals": f.intervals} for rule, f in r.rules.items()},
                   "learned": {m: sub.learned for m, sub in [(bare, r), *r.modes.items()] if sub.learned}}
            for name, r in results.items() if r.rules}


def _model_sharding(model) -> dict[str, Any]:
    """Under FSDP2 / ZeRO-3, what this rank held once scoring was done (never the whole model)."""

    held = sharding_of(model)
    return {"model_sharding": dict(held, module=type(model).__name__)} if held["sharded_tensors"] else {}


def evaluate_and_write(
    engine: ScoringEngine,
    specs: list[SuiteSpec],
    directory: str | Path,
    *,
    state: Any | None = None,
    modes: list[str] | tuple[str, ...] | None = None,
    generator: Any = None,
    baseline: dict[tuple[str, str], Items] | None = None,
    baseline_readings: dict[str, str] | None = None,
    regression_margin: float = 0.0,
    regression_alpha: float = REGRESSION_ALPHA,
    novel: NovelTokens | None = None,
    **about: Any,
) -> tuple[dict[str, SuiteResult], dict[str, Any]]:
    """`evaluate` on every process, then, on the main process, ``<directory>/<suite>[.<mode>].jsonl`` and
    ``<directory>/results.json``, and the compact table of the headline figures logged. ``baseline``: {(suite, mode):
    per-item figures} of the judge compared with (`judgetrain.eval.evidence`): the summary then also holds the paired
    ``deltas``, their logged keys and ``regressions`` (the categories that got worse: paired p under
    ``regression_alpha`` after Holm, the interval beyond ``regression_margin``, enough units:
    `judgetrain.eval.compare.changes`). ``baseline_readings``: {mode: reading} of the baseline (None: this engine's,
    the same judge before training); a mode read otherwise than this evaluation reads it is not differenced, said in
    the summary's ``not_compared``. Returns (results, summary); every process gets both."""
    modes = list(modes or [engine.scoring])
    base_reference: dict[str, float] | None = None
    if engine.scores_its_own_reference and any(m in ("implicit", *LIKELIHOOD_MODES) for m in modes):
        base_reference = {}  # a base alone: its log-probs are the reference of an adapter's evaluation
    results = evaluate(engine, specs, state=state, modes=modes, generator=generator, novel=novel,
                       base_reference=base_reference)
    if base_reference is not None and getattr(state, "num_processes", 1) > 1:
        base_reference = {k: v for part in gather_object([base_reference]) for k, v in part.items()}
    summary = eval_summary(results, engine, num_processes=getattr(state, "num_processes", 1), modes=modes,
                           generator=generator, **about)
    if baseline is not None:
        readings = (summary["readings"], summary["readings"] if baseline_readings is None else baseline_readings)
        keys, summary["deltas"], summary["regressions"], summary["not_compared"] = paired_deltas(
            current_items(results, modes), baseline, summary["scoring"], regression_margin, regression_alpha,
            readings=readings)
        summary["worse_rule"] = worse_rule(regression_margin, regression_alpha)
        summary["metrics"].update(keys)
    if state is None or state.is_main_process:
        write_evaluation(results, summary, directory)
        if base_reference:
            save_base_reference(base_reference, engine, directory)
        logger.info("eval figures%s:\n%s", "" if baseline is None else " against the baseline", headline_table(summary))
    return results, summary


def current_items(results: dict[str, SuiteResult], modes: list[str]) -> dict[tuple[str, str], Items]:
    """{(suite, mode): per-item figures} of an evaluation (the bare mode named as it ran)."""
    bare = recorded_mode(modes)
    return {(name, mode): items for name, res in results.items() for mode, items in res.items_by_mode(bare).items()}
