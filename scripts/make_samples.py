"""Build the bundled samples in judgetrain/data/samples/ (deterministic: a rerun writes identical files).

    python scripts/make_samples.py                      # all three
    python scripts/make_samples.py --only judgebias ideation
    python scripts/make_samples.py --only recipes
    python scripts/make_samples.py --rmbench-dir ../shared/data/rm-bench --rmbench-rows 12
    python scripts/make_samples.py --only synthesis cooking --samples 500 0 --out data/pointwise

judgebias/: synthetic rows in the exact JudgeBias-DPO-RefFree schema from scripts/synth.py (all 17
perturbation sets, validation on other sample_ids). ideation/: synthetic rows in the research-ideation-arena-si-rm
schema. rmbench/: the first N rows of each real per-domain RM-Bench file, re-serialised exactly as upstream
(json.dumps indent=4, ensure_ascii=False), with the ODC-By attribution. recipes/: the unperturbed synthesis recipes
of the judgebias samples (same sample_ids per split) as source samples of `judgetrain perturb`'s materials pack.
synthesis/ and cooking/ (``--samples`` per split; cooking/ is bundled with 96, the quickstart's recipes:
``--only cooking --samples 96 0``): the source samples of the synthesis and cooking packs, texts that are not one
template filled in (scripts/varied.py: each sample draws its sections, their form and order, its voice and the
phrasing of every step).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from judgetrain.data.judgebias import PERTURBATION_SETS
from judgetrain.data.rmbench import DOMAINS, domain_file

import synth  # scripts/synth.py, beside this script
import varied  # scripts/varied.py, beside this script

logger = logging.getLogger("make_samples")
REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "judgetrain" / "data" / "samples"

JUDGEBIAS_SCHEMA = pa.schema([
    ("prompt", pa.string()), ("chosen", pa.string()), ("rejected", pa.string()),
    ("score_chosen", pa.float64()), ("score_rejected", pa.float64()), ("score_delta", pa.float64()),
    ("anchor_score", pa.float64()), ("sample_id", pa.int64()), ("perturbation_type", pa.string()),
    ("perturbation_category", pa.string()), ("perturbation_rate", pa.float64()),
    ("chosen_model", pa.string()), ("rejected_model", pa.string()),
])
IDEATION_SCHEMA = pa.schema([
    ("sample_id", pa.string()), ("source_dataset", pa.string()), ("category", pa.string()), ("task", pa.string()),
    ("split", pa.string()), ("prompt", pa.string()), ("chosen", pa.string()), ("rejected", pa.string()),
    ("response_a", pa.string()), ("response_b", pa.string()), ("human_preference", pa.string()),
    ("source_record_indices", pa.list_(pa.int64())), ("source_record_index", pa.int64()),
    ("source_dimension_results", pa.string()), ("source_human_preference", pa.string()),
    ("context_id", pa.string()), ("split_group_id", pa.string()), ("position_swapped", pa.bool_()),
    ("generator_a", pa.string()), ("generator_b", pa.string()), ("shares_test_group", pa.bool_()),
])
SETS_PER_SAMPLE = 8

RMBENCH_NOTICE = """\
RM-Bench sample: attribution (ODC-By 1.0)

These files are the first {n} rows of each RM-Bench per-domain file, row content unchanged (re-serialised
with the upstream layout: json.dumps(indent=4, ensure_ascii=False)).

Source repository: https://github.com/THU-KEG/RM-Bench (files data/<domain>_filtered.json)
Commit: 73c52d7b27b361621361ec959ac6c0eb9bb7a689 (2025-07-18)
Hugging Face dataset: https://huggingface.co/datasets/THU-KEG/RM-Bench
Paper: Yantao Liu et al., "RM-Bench: Benchmarking Reward Models of Language Models with Subtlety and Style",
arXiv:2410.16184 (ICLR 2025).
License: Open Data Commons Attribution License (ODC-By) v1.0, as declared on the Hugging Face dataset card
(https://opendatacommons.org/licenses/by/1-0/). The GitHub repository has no LICENSE file.
Files here: {files}. Not included: math_filtered.json (not available to the generator).
"""

SYNTH_README = """\
{title}: synthetic sample in the real schema (generated, not real data)

Made by scripts/make_samples.py from scripts/{generator} (seeded; rerunning it writes identical files).
{body}
"""


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def write_parquet(rows: list[dict], schema: pa.Schema, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="zstd")
    logger.info("wrote %s (%d rows, %d bytes)", _rel(path), len(rows), path.stat().st_size)


def judgebias_rows(sample_ids: list[int], seed: int) -> list[dict]:
    """SETS_PER_SAMPLE perturbation sets per sample, assigned round-robin so all 17 sets recur evenly."""
    rows = []
    for k, sid in enumerate(sample_ids):
        for j in range(SETS_PER_SAMPLE):
            ptype, rate = PERTURBATION_SETS[(k * SETS_PER_SAMPLE + j) % len(PERTURBATION_SETS)]
            rows.append(synth.judgebias_row(sid, ptype, rate, seed=seed))
    return rows


def make_judgebias(out: Path, n_train_samples: int, n_val_samples: int, seed: int) -> None:
    write_parquet(judgebias_rows(list(range(n_train_samples)), seed), JUDGEBIAS_SCHEMA, out / "train.parquet")
    val_ids = list(range(1000, 1000 + n_val_samples))  # other sample_ids than train
    write_parquet(judgebias_rows(val_ids, seed), JUDGEBIAS_SCHEMA, out / "validation.parquet")
    (out / "README.md").write_text(SYNTH_README.format(generator="synth.py",
        title="JudgeBias-DPO-RefFree",
        body="Schema of iknow-lab/JudgeBias-DPO-RefFree: prompt/chosen/rejected are JSON strings of message lists;\n"
             "scores float64, sample_id int64. All 17 perturbation sets appear in both splits; validation uses other\n"
             "sample_ids (1000+) than train (0+). Error rows inject element / number / equipment / action errors and\n"
             "the chosen evaluation names them (\"Detected error: ...\") with a lower score; represent rows rewrite\n"
             "names / formulas / IUPAC names and the chosen evaluation keeps the score (\"Equivalent representation\")."),
        encoding="utf-8")


def make_recipes(out: Path, n_train_samples: int, n_val_samples: int, seed: int) -> None:
    """The judgebias samples' recipes unperturbed: ``sample_id``, ``target``, ``text`` (the materials pack's source)."""
    out.mkdir(parents=True, exist_ok=True)
    for split, ids in (("train", range(n_train_samples)), ("validation", range(1000, 1000 + n_val_samples))):
        rows = []
        for sid in ids:
            recipe = synth.make_recipe(sid, seed)
            rows.append({"sample_id": sid, "target": synth.target_description(recipe),
                         "text": synth.render_recipe(recipe)})
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        logger.info("wrote %s (%d rows, %d bytes)", _rel(path), len(rows), path.stat().st_size)
    (out / "README.md").write_text(SYNTH_README.format(generator="synth.py",
        title="materials-synthesis recipes (source samples of judgetrain perturb)",
        body="The unperturbed recipes of the judgebias samples (the same sample_ids: train 0+, validation 1000+), one\n"
             "JSON object a line: sample_id, target (the material asked for) and text (the recipe), the source row\n"
             "the materials pack of judgetrain perturb reads."), encoding="utf-8")


VARIED = {"synthesis": (varied.synthesis_recipe, "target", "materials-synthesis recipes (the synthesis pack)"),
          "cooking": (varied.cooking_recipe, "dish", "cooking recipes (the cooking pack)")}


def make_varied(kind: str, out: Path, n_train: int, n_val: int, seed: int) -> None:
    """Source samples of the synthesis or cooking pack: ``sample_id``, the target or dish, ``text``."""
    make, field, title = VARIED[kind]
    out.mkdir(parents=True, exist_ok=True)
    for split, ids in (("train", range(n_train)), ("validation", range(1000, 1000 + n_val))):
        rows = [dict(zip(("sample_id", field, "text"), (sid, *make(sid, seed)))) for sid in ids]
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        logger.info("wrote %s (%d rows, %d bytes)", _rel(path), len(rows), path.stat().st_size)
    (out / "README.md").write_text(SYNTH_README.format(generator="varied.py",
        title=f"{title}: source samples of judgetrain perturb",
        body=f"One JSON object a line: sample_id (train 0+, validation 1000+), {field} and text. Each text draws its\n"
             "sections, their form and order, its voice and the phrasing of each step (scripts/varied.py)."),
        encoding="utf-8")


def make_ideation(out: Path, n_train: int, n_test: int, seed: int) -> None:
    write_parquet(synth.ideation_rows(n_train, "train", seed=seed, shares_test_every=4), IDEATION_SCHEMA, out / "train.parquet")
    write_parquet(synth.ideation_rows(n_test, "test", seed=seed, start=10_000), IDEATION_SCHEMA, out / "test.parquet")
    (out / "README.md").write_text(SYNTH_README.format(generator="synth.py",
        title="research-ideation-arena-si-rm",
        body="Core and provenance fields of tintin1027/research-ideation-arena-si-rm (generator names as generator_a /\n"
             "generator_b). The preferred proposal is specific and testable, the other vague. Train rows come in\n"
             "split_group_id groups of three; every fourth group is flagged shares_test_group. Test rows never are.\n"
             "The real dataset is CC BY-NC 4.0 (original authors: Zhiyu Chen et al.); these synthetic rows hold none of it."),
        encoding="utf-8")


def make_rmbench(src: Path, out: Path, n_rows: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for domain in DOMAINS:
        f = src / domain_file(domain)
        if not f.exists():
            logger.info("rmbench: %s not in %s, skipped", f.name, src)
            continue
        raw = f.read_text(encoding="utf-8")
        rows = json.loads(raw)
        if json.dumps(rows, indent=4, ensure_ascii=False) != raw.rstrip("\n"):
            raise SystemExit(f"{f} is not serialised as json.dumps(indent=4, ensure_ascii=False); refusing to re-serialise")
        text = json.dumps(rows[:n_rows], indent=4, ensure_ascii=False)
        (out / f.name).write_text(text, encoding="utf-8")
        logger.info("wrote %s (%d of %d rows, %d bytes)", _rel(out / f.name), min(n_rows, len(rows)),
                    len(rows), len(text.encode()))
    files = ", ".join(sorted(p.name for p in out.glob("*_filtered.json")))
    (out / "NOTICE").write_text(RMBENCH_NOTICE.format(n=n_rows, files=files), encoding="utf-8")


def default_rmbench_dir() -> Path:
    shared = os.environ.get("JUDGETRAIN_SHARED")
    return (Path(shared) if shared else REPO.parent / "shared") / "data" / "rm-bench"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=("judgebias", "ideation", "rmbench", "recipes", *VARIED),
                   default=("judgebias", "ideation", "rmbench", "recipes"))
    p.add_argument("--out", type=Path, default=SAMPLES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--judgebias-samples", type=int, nargs=2, default=(40, 12), metavar=("TRAIN", "VALIDATION"),
                   help="base recipes per split; each gives %d rows" % SETS_PER_SAMPLE)
    p.add_argument("--samples", type=int, nargs=2, default=(500, 0), metavar=("TRAIN", "VALIDATION"),
                   help="synthesis and cooking samples per split (default 500 0)")
    p.add_argument("--ideation-pairs", type=int, nargs=2, default=(120, 40), metavar=("TRAIN", "TEST"))
    p.add_argument("--rmbench-dir", type=Path, default=None, help="folder of real *_filtered.json files (default ../shared/data/rm-bench)")
    p.add_argument("--rmbench-rows", type=int, default=12, help="first N rows of each domain file")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if "judgebias" in args.only:
        make_judgebias(args.out / "judgebias", *args.judgebias_samples, args.seed)
    if "recipes" in args.only:
        make_recipes(args.out / "recipes", *args.judgebias_samples, args.seed)
    for kind in VARIED:
        if kind in args.only:
            make_varied(kind, args.out / kind, *args.samples, args.seed)
    if "ideation" in args.only:
        make_ideation(args.out / "ideation", *args.ideation_pairs, args.seed)
    if "rmbench" in args.only:
        src = args.rmbench_dir or default_rmbench_dir()
        if not src.is_dir():
            logger.error("rmbench: source folder %s not found (set --rmbench-dir or JUDGETRAIN_SHARED)", src)
            return 1
        make_rmbench(src, args.out / "rmbench", args.rmbench_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
