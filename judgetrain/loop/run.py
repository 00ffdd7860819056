"""`judgetrain loop CONFIG`: rounds of the debiasing loop, each stage the command a user would run, resumable.

    result = run_loop(load_config("loop.yaml"))     # {"rounds": [...], "table": path, "status": "finished"}

Round k (1-based), in ``<output_dir>/round-<k>/``:

    items   `judgetrain perturb` (the factory, seeded ``items.seed + k - 1``) -> items/items.jsonl, or the given file
    split   the items of held-out samples (by sample_id) and held-out types (with every item holding an edit of
            their operators), and the copies reading as a held-out copy, apart -> split/train.jsonl, heldout.jsonl;
            the training error copies against their sources read by the shorter, longer and novel-token rules per
            type (split.json's ``shortcuts``): a figure above 0.9 stops the loop before any training, unless it runs
            with ``allow_shortcuts`` (`judgetrain loop --allow_shortcuts`; each figure let through is recorded);
            round 1 also writes the held-out pairs every round is scored on (``<output_dir>/heldout/pairwise.jsonl``:
            each held-out error copy against its source, the pairwise suite's rows) and the held-out rewrites
            (``heldout/rewrites.jsonl``: each against its source and against an error copy of the same source, the
            rewrites suite's rows, scored where ``eval.suites`` names it)
    judge   (pairs from evaluations) `judgetrain judge`: the current judge (the base plus round k-1's adapter),
            ``judge.samples`` sampled evaluations per item (one command per sample, seeded) beside ``judge.judges``
            -> judge/<name>/evaluations.jsonl, all of them in judge/evaluations.jsonl
    pairs   `judgetrain pairs known` or `judgetrain pairs build` -> pairs/train.parquet, stats.json, rejects.jsonl
    train   `judgetrain train` (accelerate launch of judgetrain.train) of round-<k>/recipe.yaml: the config's recipe
            with its ``train`` keys, the pairs, ``init_adapter`` = round k-1's adapter (the reference stays the
            base), ``resume: auto`` -> train/ (the adapter, metrics.jsonl, checkpoints)
    eval    `judgetrain eval` of the adapter on the held-out pairs and the benchmark suites -> eval/<name>/, then
            `judgetrain compare` of it against the base's saved files -> eval/compare.json

The base is scored once, as round 0 (``<output_dir>/round-0/eval/``, `judgetrain eval` of the model alone), right after
round 1's split has written the held-out pairs; each round's differences against the base come from the two
evaluations' per-row files. After each round the round table (`judgetrain.loop.table`) is written again from every
finished round's eval files.

The stages that run on several processes (items, judge, eval: `judgetrain.run.launch.SEVERAL_PROCESSES`, and train
through its recipe) are started with the config's ``num_processes`` and ``accelerate_config``; every stage's command
is looked up in the one command table (`judgetrain.run.launch.command_argv`).

A stage is done once its commands exited 0; ``<output_dir>/loop_state.json`` records it (atomically) with its wall
time and the CPU-seconds of its processes, beside the config's ``settings`` and each round's ``stages`` in order
(`judgetrain report` tells from them whether the loop finished or where it stopped); ``stages.jsonl`` logs each start
and end. Killed at any point, the
same command skips the stages done and reruns the one it stopped in, which continues through the command's own
resume where it has one (`judgetrain judge`'s done index, training's checkpoints). A config other than the one
that started the loop is refused (exit 2).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shlex
import subprocess
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from judgetrain.data.pairs import validation_samples
from judgetrain.eval.rules import NovelTokens
from judgetrain.judge.items import read_items
from judgetrain.config.recipe import load_recipe_file, parse_recipe
from judgetrain.loop.config import (HELDOUT_SOURCE, Domain, Items, LoopConfig, LoopConfigError, eval_suites,
                                   input_fingerprints, input_paths, option_args, round_recipe, trained_form)
from judgetrain.loop.basecache import cached_base_eval
from judgetrain.loop.replay import ReplayFit, write_replay
from judgetrain.loop.table import write_round_table
from judgetrain.models.aliases import resolve_model
from judgetrain.models.loading import load_recipe_tokenizer
from judgetrain.perturb.known import item_operators, item_text, write_heldout_pairs, write_heldout_rewrites
from judgetrain.perturb.shortcuts import LIMIT, CopyPair, over_limit, copy_rule_figures
from judgetrain.perturb.source import read_samples
from judgetrain.perturb.spec import load_spec, type_operators
from judgetrain.run.launch import Launch, command_argv, find_command
from judgetrain.run.layout import (EVAL_REFERENCE_FILE, HELDOUT_FILES, HELDOUT_PAIRS, HELDOUT_REWRITES, LOOP_LOG_FILE,
                                   LOOP_STATE_FILE, ROUND_COMPARE_FILE, round_folder)
from judgetrain.utils.files import append_jsonl, read_json, write_json, write_lines

logger = logging.getLogger(__name__)


class ShortcutsRefused(LoopConfigError):
    """A round's training set whose error copies a rule with no judge tells from their sources (exit 2)."""


class StageFailed(RuntimeError):
    """A stage's command exited with an error (its code is ``code``)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def run_loop(config: LoopConfig, allow_shortcuts: bool = False, data_only: bool = False) -> dict[str, Any]:
    """Every round's stages in order, those done skipped (see the module doc). Returns ``{"status", "rounds",
    "table"}``; raises `StageFailed` when a command fails, `LoopConfigError` when the output_dir holds another loop,
    `ShortcutsRefused` when a rule with no judge separates a round's training copies from their sources (unless
    ``allow_shortcuts``). ``data_only``: round 1's stages before training and scoring alone (items, split, judge
    where the pairs need it, pairs), returning ``{"status": "data", "split"}`` (the split's record, its
    ``shortcuts`` included); the same command without it continues from there."""
    out = Path(config.output_dir)
    loop = Loop(config, out, open_state(config, out), allow_shortcuts)
    if data_only:
        for round_k, stage in loop.plan(1):
            if stage not in ("train", "eval"):
                loop.stage(round_k, stage)
        return {"status": "data", "split": read_json(loop.round_dir(1) / "split" / "split.json")}
    for k in range(1, config.rounds + 1):
        for round_k, stage in loop.plan(k):
            loop.stage(round_k, stage)
        table = write_round_table(out, config.rounds)
    return {"status": "finished", "rounds": config.rounds, "table": str(table)}


def open_state(config: LoopConfig, out: Path) -> dict:
    """The loop's state in ``out`` (new, or the one this config started: `LoopConfigError` for another's)."""
    inputs = input_fingerprints(config)
    state = read_json(out / LOOP_STATE_FILE) or {"config": config.digest(), "inputs": inputs, "done": {}}
    if state["config"] != config.digest():
        raise LoopConfigError(f"{out} holds a loop started with another config ({LOOP_STATE_FILE}); continue it with "
                              "that config (rounds may grow), or give this one another output_dir")
    for key, digest in state.setdefault("inputs", inputs).items():
        if inputs.get(key) != digest:
            raise LoopConfigError(f"{out} holds a loop started with other contents of {key} "
                                  f"({input_paths(config)[key]}): the file changed since; restore it, or give this "
                                  "config another output_dir")
    out.mkdir(parents=True, exist_ok=True)
    state.update(settings=asdict(config), stages=Loop(config, out, state).stages(),  # `judgetrain report` reads them
                 trained_form=trained_form(config))
    write_json(out / LOOP_STATE_FILE, state)
    return state


class Loop:
    """One loop's stages: each a method named after the stage, given the round."""

    def __init__(self, config: LoopConfig, out: Path, state: dict, allow_shortcuts: bool = False):
        self.config, self.out, self.state, self.allow_shortcuts = config, out, state, allow_shortcuts
        self.launch = Launch(config.num_processes, config.accelerate_config)

    def stages(self) -> list[str]:
        return ["items", "split", *(["judge"] if self.config.needs_judge else []), "pairs", "train", "eval"]

    def plan(self, k: int) -> list[tuple[int, str]]:
        """Round ``k``'s (round, stage) in order; round 1's split is followed by the base's evaluation (round 0)."""
        plan = [(k, stage) for stage in self.stages()]
        if k == 1:
            plan.insert(plan.index((1, "split")) + 1, (0, "eval"))
        return plan

    def round_dir(self, k: int) -> Path:
        return self.out / round_folder(k)

    def adapter(self, k: int) -> Path | None:
        """Round k's trained adapter (None for round 0, the base)."""
        return self.round_dir(k) / "train" if k >= 1 else None

    def stage(self, k: int, name: str) -> None:
        """Run stage ``name`` of round ``k`` unless it is done; record it done with its time and CPU-seconds."""
        key = f"{k}/{name}"
        if key in self.state["done"]:
            logger.info("round %d: %s done earlier, skipped", k, name)
            return
        logger.info("round %d: %s", k, name)
        self._log({"round": k, "stage": name, "event": "start"})
        wall, cpu = time.monotonic(), _cpu_seconds()
        getattr(self, f"stage_{name}")(k, self.round_dir(k))
        record = {"wall_s": round(time.monotonic() - wall, 3), "cpu_s": round(_cpu_seconds() - cpu, 3)}
        self.state["done"][key] = record
        write_json(self.out / LOOP_STATE_FILE, self.state)
        self._log({"round": k, "stage": name, "event": "done", **record})

    def _log(self, record: dict) -> None:
        append_jsonl(self.out / LOOP_LOG_FILE, {"time": time.time(), **record})

    # ---- the stages -------------------------------------------------------------------------------------------

    def part_dir(self, rd: Path, part: Items) -> Path:
        """Where a factory's items, split and pairs go in round folder ``rd`` (or, for ``self.out``, its held-out
        files): ``rd`` itself for ``items``, ``rd/domains/<name>`` for each of ``domains``."""
        return rd / "domains" / part.name if isinstance(part, Domain) else rd

    def stage_items(self, k: int, rd: Path) -> None:
        for items in self.config.parts:
            if items.file is not None:
                continue  # given: every round reads the same file
            cmd = ["perturb", "--source", items.source, "--source_split", items.source_split, "--spec", items.spec,
                   "--seed", str(items.seed + k - 1), "--output_dir", str(self.part_dir(rd, items) / "items")]
            run_command(cmd + (["--sets", *items.sets] if items.sets else []), self.launch)

    def items_path(self, k: int, part: Items | None = None) -> str:
        part = part or self.config.parts[0]
        return part.file or str(self.part_dir(self.round_dir(k), part) / "items" / "items.jsonl")

    def stage_split(self, k: int, rd: Path) -> None:
        """Training items apart from the held-out ones, factory by factory (`split_part`); with ``domains``,
        ``split/split.json`` pools the domains' records (each in ``domains``) and round 1 pools their held-out
        files (`pool_heldout`)."""
        records = {}
        for part in self.config.parts:
            records[part.name if isinstance(part, Domain) else ""] = self.split_part(k, rd, part)
        if self.config.domains:
            (rd / "split").mkdir(parents=True, exist_ok=True)
            write_json(rd / "split" / "split.json", pooled_split(records))
            if k == 1 and self.has_texts():
                for file in (HELDOUT_PAIRS, HELDOUT_REWRITES):
                    pool_heldout({d.name: self.part_dir(self.out, d) / file for d in self.config.domains},
                                 self.out / file)
        if k == 1 and self.has_texts() and not eval_suites(self.config, self.held_files())[0]:
            raise LoopConfigError(f"eval.suites: {self.config.eval.suites}: the held-out items hold no error copy, "
                                  "so there are no held-out pairs and no suite to score; name another suite")

    def split_part(self, k: int, rd: Path, part: Items) -> dict[str, Any]:
        """One factory's training items apart from its held-out ones (`heldout_samples`, the same every round;
        ``heldout.types`` and the items holding an edit of their operators, `held_operators`; and any copy whose
        text is a held-out text: a held-out sample's, or a held-out item's copy of this round); round 1 also writes
        the held-out pairs. Returns the split's record."""
        held = self.config.heldout
        where = self.part_dir(rd, part)
        items = read_items(self.items_path(k, part)).items
        held_ids, held_texts = self.heldout_samples(part)
        samples = {str(s.sample_id): s for s in self.samples(part)} if self.has_texts() else {}
        operators = self.held_operators(items, part)
        rows = []
        for item in items:
            sample = samples.get(str(item.columns["sample_id"]))
            text = item_text(sample, item.messages) if sample is not None else None
            out = str(item.columns["sample_id"]) in held_ids or item.columns.get("perturbation_type") in held.types \
                or bool(item_operators(item.columns) & operators)
            rows.append(({**item.columns, "prompt": item.messages}, text, out))
            if out and text is not None and text != sample.text:
                held_texts.add(text)  # a held-out copy: no other item of the same text trains
        train, heldout, same_text = [], [], 0
        for row, text, out in rows:
            if not out and text is not None and text in held_texts:
                out, same_text = True, same_text + 1  # another sample's copy reads as a held-out text
            (heldout if out else train).append(row)
        label = f"{part.name}: " if isinstance(part, Domain) else ""
        if not train:
            raise LoopConfigError(f"round {k}: {label}every item is held out (heldout.fraction {held.fraction}, "
                                  f"types {held.types}): nothing to train on")
        (where / "split").mkdir(parents=True, exist_ok=True)
        write_lines(where / "split" / "train.jsonl", (json.dumps(r, ensure_ascii=False) for r in train))
        write_lines(where / "split" / "heldout.jsonl", (json.dumps(r, ensure_ascii=False) for r in heldout))
        shortcuts = self.shortcuts(k, train, heldout, samples, label) if samples else None
        record = {"train_items": len(train), "heldout_items": len(heldout), "heldout_samples": sorted(held_ids),
                  "heldout_types": list(held.types), "heldout_operators": sorted(operators),
                  "heldout_same_text": same_text, **({"shortcuts": shortcuts} if shortcuts else {})}
        write_json(where / "split" / "split.json", record)
        if k == 1 and self.has_texts():
            out = self.part_dir(self.out, part)
            write_heldout_pairs(heldout, list(samples.values()), out / HELDOUT_PAIRS)
            write_heldout_rewrites(heldout, list(samples.values()), out / HELDOUT_REWRITES)
        return record

    def shortcuts(self, k: int, train: list[dict], heldout: list[dict], samples: dict,
                  label: str = "") -> dict[str, Any]:
        """What the shorter, longer and novel-token rules get on the training error copies against their sources,
        per type (`judgetrain.perturb.shortcuts`, the novel-token rule fitted on other training samples), and on the
        held-out copies (``heldout``: the rule fitted on the training items); `ShortcutsRefused` where a training
        figure is above its limit, unless the loop runs with ``allow_shortcuts`` (then each figure let through is
        counted in the split's record)."""
        pairs, held = (copy_pairs(rows, samples) for rows in (train, heldout))
        figures = copy_rule_figures(pairs) if pairs else {}
        novel = NovelTokens.fit({p.source for p in pairs}, [p.copy for p in pairs])
        over = over_limit(figures)
        said = ", ".join(f"{rule} {acc:.3f} on {key}" for key, rule, acc in over)
        if over and not self.allow_shortcuts:
            raise ShortcutsRefused(f"round {k}: {label}a rule with no judge separates the training error copies from "
                                   f"their sources above {LIMIT}: {said} (per type in round-{k}/split/split.json's "
                                   "shortcuts): a judge trained on them can learn the tell, not the error; make "
                                   "copies no rule catches (docs/perturb.md), or run again with --allow_shortcuts")
        if over:
            logger.warning("round %d: %straining anyway (--allow_shortcuts) on copies a rule separates from their "
                           "sources: %s", k, label, said)
        return {"limit": LIMIT, "types": figures, "allowed": [{"type": key, "rule": rule, "accuracy": acc}
                                                              for key, rule, acc in over],
                "heldout": copy_rule_figures(held, fitted=novel) if held else {}}

    def held_operators(self, items, part: Items | None = None) -> set[str]:
        """The operators of the held-out types (`judgetrain.perturb.spec.type_operators`; without a spec, the one
        operator every item of a held-out type names): an item of any set holding one of their edits is held out."""
        types = self.config.heldout.types
        if not types:
            return set()
        part = part or self.config.parts[0]
        if part.spec:
            return type_operators(load_spec(part.spec), types)
        named: dict[str, set] = {}
        for item in items:
            if item.columns.get("perturbation_type") in types:
                named.setdefault(item.columns["perturbation_type"], set()).update(item_operators(item.columns))
        return {op for ops in named.values() if len(ops) == 1 for op in ops}

    def held_files(self) -> list[str]:
        """The suites whose held-out file (`HELDOUT_FILES`) is written and holds rows."""
        return [name for name, file in HELDOUT_FILES.items()
                if (self.out / file).is_file() and (self.out / file).stat().st_size > 0]

    def has_texts(self) -> bool:
        return all(part.source and part.spec for part in self.config.parts)

    def heldout_samples(self, part: Items | None = None) -> tuple[set[str], set[str]]:
        """(the held-out sample ids as text, their texts), drawn once for the loop: a seeded ``heldout.fraction`` of
        the source's samples (of the items file's without a source, every round the same file), with every sample
        whose text is a held-out one's. A round whose items lack a sample (none of its copies accepted) holds out
        the same samples."""
        held, part = self.config.heldout, part or self.config.parts[0]
        samples = self.samples(part) if self.has_texts() else []
        ids = [s.sample_id for s in samples] if samples else \
            [i.columns["sample_id"] for i in read_items(self.items_path(1, part)).items]
        drawn = {str(x) for x in validation_samples(ids, held.fraction, held.seed)}
        texts = {s.text for s in samples if str(s.sample_id) in drawn}
        for file in (HELDOUT_PAIRS, HELDOUT_REWRITES):  # the held-out copies (each row's response_b; response_a is
            if (self.out / file).is_file():             # a source, or a rewrite that is another row's response_b)
                texts |= {json.loads(line)["response_b"]
                          for line in (self.out / file).read_text(encoding="utf-8").splitlines() if line}
        return drawn | {str(s.sample_id) for s in samples if s.text in texts}, texts

    def samples(self, items: Items | None = None):
        """The source samples of factory ``items`` (the first, or only, one by default)."""
        items = items or self.config.parts[0]
        samples, _ = read_samples(items.source, load_spec(items.spec), split=items.source_split)
        return samples

    def stage_judge(self, k: int, rd: Path) -> None:
        judge, model = self.config.judge, self.config.model
        current = f"model={model}" + (f",adapter={self.adapter(k - 1)}" if k > 1 else "")
        runs = [(f"round{k - 1}-s{j}", [f"{current},name=round{k - 1}-s{j}"], j) for j in range(1, judge.samples + 1)]
        runs += [("judges", list(judge.judges), 0)] if judge.judges else []
        for name, specs, seed in runs:
            cmd = ["judge", "--items", str(rd / "split" / "train.jsonl"), "--output_dir", str(rd / "judge" / name),
                   "--seed", str(seed)]
            cmd += [arg for spec in specs for arg in ("--judge", spec)]
            if name != "judges":
                cmd += ["--do_sample", "--temperature", str(judge.temperature)]
            if judge.force_score_prefix:
                cmd.append("--force_score_prefix")
            if judge.max_new_tokens:
                cmd += ["--max_new_tokens", str(judge.max_new_tokens)]
            run_command(cmd, self.launch)
        (rd / "judge").mkdir(parents=True, exist_ok=True)
        rows = [line for name, _, _ in runs
                for line in (rd / "judge" / name / "evaluations.jsonl").read_text(encoding="utf-8").splitlines() if line]
        write_lines(rd / "judge" / "evaluations.jsonl", rows)

    def stage_pairs(self, k: int, rd: Path) -> None:
        """The round's training pairs in ``pairs/``: with ``domains``, each domain's built in its own folder and pooled
        (`pool_pairs`); then the replay rows beside them."""
        pairs = self.config.pairs
        options = option_args(pairs.options)
        evaluations = str(rd / "judge" / "evaluations.jsonl")
        if pairs.method == "anchor":
            run_command(["pairs", "build", "--evaluations", evaluations, "--validation_fraction", "0",
                         "--output_dir", str(rd / "pairs")] + options)
        elif pairs.form == "pointwise":
            run_command(["pairs", "known", "--form", "pointwise", "--evaluations", evaluations, "--ties", pairs.ties,
                         "--validation_fraction", "0", "--output_dir", str(rd / "pairs")] + options)
        else:
            for items in self.config.parts:
                where = self.part_dir(rd, items)
                run_command(["pairs", "known", "--form", pairs.form, "--items", str(where / "split" / "train.jsonl"),
                             "--source", items.source, "--source_split", items.source_split, "--spec", items.spec,
                             "--ties", pairs.ties, "--validation_fraction", "0",
                             "--output_dir", str(where / "pairs")] + options)
            if self.config.domains:
                pool_pairs({d.name: self.part_dir(rd, d) / "pairs" for d in self.config.domains}, rd / "pairs")
        if self.config.replay.share:
            write_replay(self.config.replay, rd / "pairs", self.replay_fit(k, rd))

    def write_round_recipe(self, k: int, rd: Path) -> tuple[dict[str, Any], Path]:
        """Round k's training recipe (`round_recipe`), written to ``rd/recipe.yaml``: (the recipe, its path)."""
        recipe = round_recipe(self.config, load_recipe_file(self.config.recipe), rd,
                              str(self.adapter(k - 1)) if k > 1 else None)
        path = rd / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
        return recipe, path

    def replay_fit(self, k: int, rd: Path) -> ReplayFit | None:
        """What round k's replayed rows must fit: its recipe's tokenizer and ``max_length`` (None without one)."""
        recipe = parse_recipe([str(self.write_round_recipe(k, rd)[1])])
        if recipe.training_args.max_length is None:
            return None
        tokenizer = load_recipe_tokenizer(resolve_model(recipe.model_args.model_name_or_path), recipe.training_args,
                                          recipe.model_args)
        return ReplayFit(tokenizer, recipe.training_args.max_length)

    def stage_train(self, k: int, rd: Path) -> None:
        recipe, path = self.write_round_recipe(k, rd)
        warn_reference_relative(recipe, self.config.pairs)
        warn_orders_apart(recipe, self.config.pairs)
        run_command(["train", str(path)])

    def stage_eval(self, k: int, rd: Path) -> None:
        """`judgetrain eval` of round k's adapter (round 0: the base alone) on the held-out pairs and the suites, in
        the same modes every round (`Eval.modes`: each reading the rounds use); after round 0, `judgetrain compare` of
        it against the base's saved evaluation (a mode read two ways left out, said in its ``skipped``)."""
        ev = self.config.eval
        suites, options = eval_suites(self.config, self.held_files())
        for name, file in HELDOUT_FILES.items():
            if options.get(f"eval_{name}_source") == HELDOUT_SOURCE:
                options[f"eval_{name}_source"] = str(self.out / file)
        if ev.modes != ev.scoring:
            logger.info("round %d: eval.scoring lists implicit, a log-ratio to the base that the base itself does not "
                        "have; every round, the base included, is also read by %s, the readings the base shares",
                        k, ", ".join(m for m in ev.modes if m not in ev.scoring))
        cmd = ["eval", "--model", self.config.model, *(["--adapter", str(self.adapter(k))] if k else []),
               "--output_dir", str(rd / "eval"), "--eval_suites", *suites, "--eval_scoring", *ev.modes]
        if ev.max_rows:
            cmd += ["--eval_max_rows", str(ev.max_rows)]
        base_logprobs = next((self.round_dir(0) / "eval").glob(f"*/{EVAL_REFERENCE_FILE}"), None) if k else None
        if base_logprobs is not None:  # the base's own log-probs: implicit scoring subtracts them, no second pass
            cmd += ["--reference_logprobs", str(base_logprobs)]
        train_pairs = rd / "pairs" / "train.parquet"  # the novel-token rule is fitted on this round's training pairs
        if k and self.config.pairs.method == "known" and self.config.pairs.form == "response" and train_pairs.is_file():
            cmd += ["--rules_train_pairs", str(train_pairs)]
        cmd += option_args(options)
        if k == 0 and ev.base_cache:  # one evaluation of the base for every config that scores it alike
            cached_base_eval(cmd, rd / "eval", lambda argv: run_command(argv, self.launch))
        else:
            run_command(cmd, self.launch)
        if k:
            run_command(["compare", str(self.round_dir(0) / "eval"), str(rd / "eval"),
                         "--output", str(rd / "eval" / ROUND_COMPARE_FILE)])


def pooled_split(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The split's record of a loop with several domains: the counts summed, each sample id and rule figure's key
    named with its domain (``<name>/<id>``), every domain's own record in ``domains``."""
    shortcuts = {name: r["shortcuts"] for name, r in records.items() if r.get("shortcuts")}
    pooled: dict[str, Any] = {
        "train_items": sum(r["train_items"] for r in records.values()),
        "heldout_items": sum(r["heldout_items"] for r in records.values()),
        "heldout_samples": [f"{name}/{sid}" for name, r in records.items() for sid in r["heldout_samples"]],
        "heldout_types": next(iter(records.values()))["heldout_types"],
        "heldout_operators": sorted({op for r in records.values() for op in r["heldout_operators"]}),
        "heldout_same_text": sum(r["heldout_same_text"] for r in records.values())}
    if shortcuts:
        pooled["shortcuts"] = {
            "limit": next(iter(shortcuts.values()))["limit"],
            "types": {f"{name}/{key}": f for name, s in shortcuts.items() for key, f in s["types"].items()},
            "allowed": [{**a, "type": f"{name}/{a['type']}"} for name, s in shortcuts.items() for a in s["allowed"]],
            "heldout": {f"{name}/{key}": f for name, s in shortcuts.items() for key, f in s["heldout"].items()}}
    return {**pooled, "domains": records}


def pool_heldout(files: dict[str, Path], path: Path) -> int:
    """The held-out rows of every domain's file (``files``: name -> file) in one file at ``path``: each row's
    ``sample_id`` and ``id`` prefixed ``<name>/`` (two domains may number their samples alike; a sample is the
    suite's unit) and its ``domain`` named. Returns the rows written."""
    rows = []
    for name, file in files.items():
        for line in file.read_text(encoding="utf-8").splitlines() if file.is_file() else []:
            if line.strip():
                row = json.loads(line)
                rows.append({**row, "id": f"{name}/{row['id']}", "sample_id": f"{name}/{row['sample_id']}",
                             "domain": name})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lines(path, (json.dumps(r, ensure_ascii=False) for r in rows))
    logger.info("held-out rows of %d domains pooled: %d (%s)", len(files), len(rows), path)
    return len(rows)


def pool_pairs(folders: dict[str, Path], out: Path) -> dict[str, Any]:
    """Every domain's training pairs (``folders``: name -> `judgetrain pairs known`'s output folder) in one
    ``out/train.parquet`` (rows in domain order), their rejects in ``out/rejects.jsonl`` (each naming its domain),
    and ``out/stats.json``: the pairs and rejects counted, every domain's own statistics in ``domains``."""
    out.mkdir(parents=True, exist_ok=True)
    tables = [pq.read_table(folder / "train.parquet") for folder in folders.values()]
    table = pa.concat_tables(tables, promote_options="default")
    pq.write_table(table, out / "train.parquet")
    rejects = [json.dumps({**json.loads(line), "domain": name}, ensure_ascii=False)
               for name, folder in folders.items() if (folder / "rejects.jsonl").is_file()
               for line in (folder / "rejects.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    write_lines(out / "rejects.jsonl", rejects)
    stats = {name: read_json(folder / "stats.json") or {} for name, folder in folders.items()}
    labels = sum((Counter(s.get("pairs_by_label") or {}) for s in stats.values()), Counter())
    pooled = {**{key: sum(s.get(key) or 0 for s in stats.values())
                 for key in ("total_pairs", "error_pairs", "represent_pairs")},
              "train_pairs": table.num_rows, "validation_pairs": 0, "pairs_by_label": dict(sorted(labels.items())),
              "rejected_rows": len(rejects), "domains": stats}
    write_json(out / "stats.json", pooled)
    logger.info("training pairs of %d domains pooled: %d (%s)", len(folders), table.num_rows, out / "train.parquet")
    return pooled


def copy_pairs(rows: list[dict], samples: dict) -> list[CopyPair]:
    """Each error copy of ``rows`` (items as the split writes them) against its source, keyed by its type."""
    return [CopyPair(row["sample_id"], str(row.get("perturbation_type")), sample.text,
                     item_text(sample, row["prompt"]), len(row.get("perturbation_changes") or []))
            for row in rows if row.get("perturbation_category") == "error"
            and (sample := samples.get(str(row["sample_id"]))) is not None]


def verdict_pairs(pairs) -> bool:
    """Whether the loop trains verdict pairs shown in both orders (`judgetrain pairs known`'s pairwise form)."""
    return pairs.method == "known" and pairs.form == "pairwise"


def warn_reference_relative(recipe: dict, pairs) -> bool:
    """Warn (and return True) when verdict pairs shown in both orders are trained on a purely reference-relative DPO
    loss. Such a loss scores the policy's change against the base judge, and the two orders of a pair ask for opposite
    changes of any constant preference for the first position: the loss is flat in that preference at the base, so a
    base judge that always says [[A>B]] keeps saying it unless the judge learns the content. A likelihood term
    (``loss_type: [sigmoid, sft]``, SFR-Judge's DPO + SFT) scores the verdict itself and pulls both orders to it."""
    loss = recipe.get("loss_type", ["sigmoid"])
    loss = [loss] if isinstance(loss, str) else list(loss)
    if not verdict_pairs(pairs) or "sft" in loss:
        return False
    logger.warning("loss_type %s on verdict pairs in both orders: a reference-relative loss cannot move the base "
                   "judge's preference for a position (the two orders cancel it); add the likelihood term, "
                   "loss_type: [%s, sft] with loss_weights, to train the verdicts themselves (docs/loop.md)",
                   loss, ", ".join(loss))
    return True


def warn_orders_apart(recipe: dict, pairs) -> bool:
    """Warn (and return True) when verdict pairs shown in both orders train with their rows shuffled one by one
    (``batch_groups`` off): a batch may then hold more verdicts of one letter than the other, and the likelihood term
    pushes the judge's preference for a position back and forth instead of to the middle (docs/results.md, the
    verdict probe: 12 steps ended at a gap of 2.57 nats with rows apart, 0.21 with both orders in one batch)."""
    if not verdict_pairs(pairs) or recipe.get("batch_groups"):
        return False
    logger.warning("verdict pairs in both orders train with batch_groups off: a batch may hold more [[A>B]] than "
                   "[[B>A]] verdicts; set train: {batch_groups: true} to keep both orders of a pair in one batch "
                   "(docs/loop.md)")
    return True


def run_command(argv: list[str], launch: Launch = Launch()) -> None:
    """``judgetrain ARGV`` in a child process, as a user runs it (`accelerate launch` of the command's module with
    ``launch``'s processes and config where the command runs on several: `judgetrain.run.launch.command_argv`);
    `StageFailed` unless it exits 0."""
    cmd = command_argv(argv, launch)
    logger.info("running: %s", " ".join(shlex.quote(a) for a in ["judgetrain", *argv]))
    code = subprocess.run(cmd, env=os.environ.copy()).returncode
    if code != 0:
        raise StageFailed(f"judgetrain {find_command(argv)[0]} exited with {code}", code)


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
