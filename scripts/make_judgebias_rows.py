"""Write N synthetic JudgeBias-shaped rows at real lengths (parquet), for benchmarks at the real dataset's size.

    python scripts/make_judgebias_rows.py OUT_DIR                  # 2,000 train rows: OUT_DIR/train.parquet
    python scripts/make_judgebias_rows.py OUT_DIR --rows 91639     # the real train split's size
    python scripts/make_judgebias_rows.py OUT_DIR --rows 91639 --validation-rows 10183

Synthetic, not real data: the schema and vocabulary are those of iknow-lab/JudgeBias-DPO-RefFree as
`judgetrain.data.load_judgebias` reads it (prompt / chosen / rejected as JSON strings of message lists; the 17
perturbation sets, their types, categories and rates, recurring evenly), and the lengths are the real data's:
prompts of 1.6-3.0k tokens (mean 2.58k, skewed long), completions of 0.37-0.99k tokens (mean 0.65k; SmolLM2's tokenizer
with the chat template, measured on 200 rows with --measure).
Each row is a `scripts/synth.py` row whose user message carries a block of reported-synthesis notes and whose two
evaluations carry longer reasoning, cut from a seeded pool of sentences so the lengths are drawn per row. A
91,639-row file took 54 s on 2 busy cores (about 20 s of CPU): the synth rows are built once per (recipe, set),
the padding is string slicing.
The output folder is a judgetrain data source (``{dataset: judgebias, source: OUT_DIR}``).
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import random
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from judgetrain.data.judgebias import PERTURBATION_SETS

import synth  # scripts/synth.py, beside this script
from make_samples import JUDGEBIAS_SCHEMA

logger = logging.getLogger("make_judgebias_rows")

CHARS_PER_TOKEN = 3.4  # SmolLM2's tokenizer on these rows (formulas, numbers and °C cut short; see --measure)
PROMPT_TOKENS = (1000, 3000)  # range; drawn as 3000 - 2000 * Beta(1, 4): mean 2,600
COMPLETION_TOKENS = (600, 110, 360, 920)  # target mean, sd (measured: about 0.64k; the cut ends on a whole sentence), clipped to [lo, hi]
BASE_RECIPES = 48  # distinct synth recipes; rows cycle over them (sample_id stays unique per row group)
BATCH = 4096


def sentence_pool(seed: int, n: int = 6000) -> tuple[str, list[int]]:
    """One long text of materials-synthesis sentences and the offsets where each sentence starts."""
    rng = random.Random(f"pool-{seed}")
    verbs = ("was calcined", "was annealed", "was ball-milled", "was dried", "was washed", "was sintered",
             "was quenched", "was pressed into pellets", "was dispersed", "was filtered")
    findings = ("gave a single-phase product by XRD", "showed a secondary carbonate phase", "left unreacted precursor",
                "gave particles of 40-80 nm by SEM", "raised the BET surface area", "lowered the crystallinity",
                "broadened the main reflection", "gave a Raman shift consistent with the target", "lost 12% mass by TGA")
    parts, offsets, pos = [], [], 0
    for _ in range(n):
        name, formula, use, _key, precursors, furnace, (lo, hi) = rng.choice(synth.TARGETS)
        pre, pre_formula = rng.choice(precursors)
        s = (f"In a reported synthesis of {name} ({formula}), {pre} ({pre_formula}, {rng.choice(synth.SUPPLIERS)}) "
             f"{rng.choice(verbs)} in the {furnace} at {rng.randrange(lo, hi + 1, 25)} °C for {rng.choice((2, 4, 6, 12))} h, "
             f"which {rng.choice(findings)}; the authors note its use as {use}. ")
        offsets.append(pos)
        parts.append(s)
        pos += len(s)
    return "".join(parts), offsets


def cut(pool: str, offsets: list[int], rng: random.Random, n_chars: int) -> str:
    """About ``n_chars`` of whole sentences from a random place in the pool."""
    i = rng.randrange(len(offsets) // 2)
    start = offsets[i]
    j = min(bisect.bisect_left(offsets, start + n_chars), len(offsets) - 1)
    return pool[start:offsets[j]].rstrip()


def base_rows(seed: int, sample_base: int) -> list[dict]:
    """The synth rows the output cycles over: each base recipe under every perturbation set."""
    return [synth.judgebias_row(sample_base + k, ptype, rate, seed=seed)
            for k in range(BASE_RECIPES) for ptype, rate in PERTURBATION_SETS]


def padded_row(base: dict, i: int, sample_id: int, pool: str, offsets: list[int], seed: int) -> dict:
    rng = random.Random(f"pad-{seed}-{i}")
    prompt = json.loads(base["prompt"])
    want = PROMPT_TOKENS[1] - (PROMPT_TOKENS[1] - PROMPT_TOKENS[0]) * rng.betavariate(1, 4)
    have = sum(len(m["content"]) for m in prompt) / CHARS_PER_TOKEN
    notes = cut(pool, offsets, rng, int(max(want - have, 0) * CHARS_PER_TOKEN))
    prompt[1]["content"] += f"\n\n## Reported syntheses of related materials\n{notes}"
    row = dict(base, prompt=json.dumps(prompt, ensure_ascii=False), sample_id=sample_id)
    mean, sd, lo, hi = COMPLETION_TOKENS
    for col in ("chosen", "rejected"):
        msgs = json.loads(base[col])
        text = msgs[0]["content"]
        want = min(max(rng.gauss(mean, sd), lo), hi)
        extra = cut(pool, offsets, rng, int(max(want - len(text) / CHARS_PER_TOKEN, 0) * CHARS_PER_TOKEN))
        msgs[0]["content"] = f"Context checked against the literature: {extra}\n{text}"
        row[col] = json.dumps(msgs, ensure_ascii=False)
    return row


def write_split(path: Path, n_rows: int, seed: int, sample_base: int) -> None:
    """``n_rows`` rows into ``path``; row i is base (recipe, set) i mod the base rows, sample_id one per recipe
    cycle (every set of a sample_id shares its recipe, as in the real data)."""
    pool, offsets = sentence_pool(seed)
    bases = base_rows(seed, sample_base)
    n_sets = len(PERTURBATION_SETS)
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, JUDGEBIAS_SCHEMA, compression="zstd") as writer:
        for start in range(0, n_rows, BATCH):
            rows = [padded_row(bases[i % len(bases)], i, sample_base + i // n_sets, pool, offsets, seed)
                    for i in range(start, min(start + BATCH, n_rows))]
            writer.write_table(pa.Table.from_pylist(rows, schema=JUDGEBIAS_SCHEMA))
    logger.info("wrote %s (%d rows, %d bytes)", path, n_rows, path.stat().st_size)


def measure(path: Path, tokenizer: str, n: int) -> dict:
    """Token lengths (chat template applied, as TRL counts them) of the first ``n`` rows of ``path``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    table = pq.read_table(path).slice(0, n).to_pylist()
    prompts, completions = [], []
    for row in table:
        prompt = json.loads(row["prompt"])
        ids = tok.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, return_dict=False)
        prompts.append(len(ids))
        completions += [len(tok(json.loads(row[c])[0]["content"])["input_ids"]) for c in ("chosen", "rejected")]
    return {"rows": len(table), "prompt_tokens": (min(prompts), sum(prompts) / len(prompts), max(prompts)),
            "completion_tokens": (min(completions), sum(completions) / len(completions), max(completions))}


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="output folder (train.parquet, validation.parquet)")
    p.add_argument("--rows", type=int, default=2000, help="train rows (default 2,000; the real split: 91,639)")
    p.add_argument("--validation-rows", type=int, default=0, help="validation rows (default none; the real split: 10,183)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--measure", metavar="TOKENIZER", default=None,
                   help="afterwards, print the token lengths of 200 rows with this tokenizer (a model folder)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.rows < 1 or args.validation_rows < 0:
        p.error("--rows must be >= 1 and --validation-rows >= 0")
    t0 = time.perf_counter()
    write_split(args.out / "train.parquet", args.rows, args.seed, 0)
    if args.validation_rows:  # other recipes and sample_ids than train, as in the real split
        write_split(args.out / "validation.parquet", args.validation_rows, args.seed + 1, 1_000_000)
    logger.info("%.1f s", time.perf_counter() - t0)
    if args.measure:
        print(json.dumps(measure(args.out / "train.parquet", args.measure, 200)))
    return 0


if __name__ == "__main__":
    sys.exit(run())
