"""The perturb part (``--only perturb``): `judgetrain perturb`'s rule operators at the size of JudgeBias-DPO-RefFree.

``--perturb-samples`` source recipes (default 2,000: the bundled recipes repeated under new ids) x the
materials pack's 17 sets without a model (the model sets made by their rule stand-ins): 34,000 sample x set pairs.
Timed in this process (one core): the source read and checked, and every item made, checked and written
(`judgetrain.perturb.build.perturb`); then the same run again into another folder, whose files must be
byte-identical (the bench fails if not). ``seconds_per_34000`` scales the time to 34,000 items (target: under 60 s).
"""

# Late imports: judgetrain.perturb (inside the functions that use them): each benchmark part loads only what it
# measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from judgetrain.bench.common import BenchError

TARGET_ITEMS = 34_000


def _run(source: Path, out: Path) -> tuple[dict, float]:
    from judgetrain.perturb.build import perturb
    from judgetrain.perturb.source import read_samples
    from judgetrain.perturb.spec import load_spec

    t0 = time.perf_counter()
    spec = load_spec("materials")
    samples, _ = read_samples(str(source), spec)
    result = perturb(spec, samples, out)
    return result, time.perf_counter() - t0


def bench_perturb(cfg: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from judgetrain.perturb.build import ITEMS, REJECTS, SUMMARY
    from judgetrain.perturb.source import bundled_recipes

    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "recipes.jsonl"
    rows = bundled_recipes("train", cfg.perturb_samples)
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    first, seconds = _run(source, workdir / "a")
    second, seconds_again = _run(source, workdir / "b")
    identical = all((workdir / "a" / n).read_bytes() == (workdir / "b" / n).read_bytes()
                    for n in (ITEMS, REJECTS, SUMMARY))
    if not identical:
        raise BenchError("perturb: two runs with the same seed wrote different files")
    summary = first["summary"]
    made = summary["items"] + summary["rejected"]
    best = min(seconds, seconds_again)
    return {"samples": len(rows), "sets": len(summary["sets"]), "sample_x_set": made, "items": summary["items"],
            "rejected": summary["rejected"], "seconds": [seconds, seconds_again], "items_per_s": made / best,
            "seconds_per_34000": best * TARGET_ITEMS / made, "identical": identical,
            "rejects_by_reason": {k: sum(s["rejects"].get(k, 0) for s in summary["sets"].values())
                                  for k in sorted({r for s in summary["sets"].values() for r in s["rejects"]})}}
