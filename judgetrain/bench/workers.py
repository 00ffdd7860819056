"""The code a bench subprocess runs (`python -m judgetrain.bench.workers SPEC RESULT`): judgetrain's trainer, a bare
TRL script, or the quickstart recipe; each writes its timings and its own peak memory to RESULT.
"""

# Late imports: judgetrain.config, judgetrain.train, judgetrain.trainer, judgetrain.utils, datasets, peft, transformers,
# trl (inside the functions that use them): each benchmark part loads only what it measures, and a timed side's imports
# are part of what it times.

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from judgetrain.bench.common import args_digest, device_peak, peak_rss_mb
from judgetrain.utils.logging import setup_logging


def _worker_train_judgetrain(spec: dict) -> dict:
    """judgetrain's own trainer path, exactly as `accelerate launch -m judgetrain.train` runs it."""
    from judgetrain.config.recipe import parse_recipe
    from judgetrain.train import train
    from judgetrain.trainer.process import init_process_state

    init_process_state()
    recipe = parse_recipe(spec["argv"])
    t0 = time.perf_counter()
    summary = train(recipe, command="judgetrain bench")
    wall = time.perf_counter() - t0
    digest, args_dict = args_digest(recipe.training_args)
    m = summary["train_metrics"]
    return {
        "train_runtime": m["train_runtime"],
        "train_samples_per_second": m["train_samples_per_second"],
        "global_step": summary["global_step"],
        "wall": wall,
        "args_digest": digest,
        "args": args_dict,
        "prefix_sharing": summary.get("prefix_sharing"),
    }


def _worker_train_bare(spec: dict) -> dict:
    """A bare TRL script: what a user writes from the TRL docs, given the same rows and DPOConfig."""
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    t0 = time.perf_counter()
    dataset = load_dataset("parquet", data_files=spec["data"], split="train")
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    args = DPOConfig(**spec["dpo"])
    peft_config = LoraConfig(**spec["lora"]) if spec.get("lora") else None
    trainer_cls = DPOTrainer
    if spec.get("trainer") == "prefix_sharing":  # the same script with judgetrain's prefix-sharing subclass
        from judgetrain.trainer.dpo import JudgeDPOTrainer as trainer_cls
    trainer = trainer_cls(model=spec["model"], args=args, train_dataset=dataset, processing_class=tokenizer,
                          peft_config=peft_config)
    result = trainer.train()
    trainer.save_model(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    wall = time.perf_counter() - t0
    digest, args_dict = args_digest(args)
    return {
        "train_runtime": result.metrics["train_runtime"],
        "train_samples_per_second": result.metrics["train_samples_per_second"],
        "global_step": trainer.state.global_step,
        "wall": wall,
        "args_digest": digest,
        "args": args_dict,
        "prefix_sharing": ({"on": trainer.prefix_sharing, **trainer.prefix_sharing_stats}
                           if hasattr(trainer, "prefix_sharing_stats") else None),
    }


def _worker_quickstart(spec: dict) -> dict:
    """The quickstart recipe run for real (evaluation on); eval runtimes read back from its metrics.jsonl."""
    result = _worker_train_judgetrain(spec)
    evals = []
    with open(Path(spec["output_dir"]) / "metrics.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            runtimes = {k: v for k, v in rec.items() if k.startswith("eval/") and k.endswith("runtime")}
            if runtimes:
                evals.append({"step": rec.get("step"), "epoch": rec.get("epoch"), "seconds": sum(runtimes.values()),
                              "by_suite": runtimes})
    result["evals"] = evals
    return result


_WORKERS = {"train_judgetrain": _worker_train_judgetrain, "train_bare": _worker_train_bare,
            "quickstart": _worker_quickstart}


def worker_main(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    setup_logging(quiet=True, force=True)
    if spec.get("cpu_allocator"):  # a bare TRL run's allocator, as judgetrain's run would set it (train_judgetrain
        # sets its own, from its recipe)
        from judgetrain.utils.allocator import apply_cpu_allocator
        from judgetrain.utils.device import has_accelerator

        apply_cpu_allocator(spec["cpu_allocator"], on_cpu=spec["dpo"].get("use_cpu", False) or not has_accelerator())
    result = _WORKERS[spec["kind"]](spec)
    result["peak_rss_mb"] = peak_rss_mb()
    device_peak(result)
    Path(result_path).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(worker_main(sys.argv[1], sys.argv[2]))
