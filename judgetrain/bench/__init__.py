"""`judgetrain bench`: what judgetrain costs over bare TRL in training, and what its scoring engine saves in evaluation.

One module per part: `train` (judgetrain against bare TRL, prefix sharing by row shape), `eval` (the engine against a
naive evaluator), `scale` (1x/2x/4x, quickstart overhead), `gpu` (`--device cuda`, real shapes), `parser` (the score
parser on hostile text), `generation` (the batched generation engine against one prompt at a time), `report`
(summary, targets, table), `memory` (the memory-measurement harness), with `common` (shared helpers, subprocess
plumbing) and `workers` (what a bench subprocess runs). The names below are the package's public surface.
"""

from judgetrain.bench.common import BenchError, default_recipe, median, ratio, run_worker
from judgetrain.bench.eval import (
    EVAL_SETS,
    NaiveEvaluator,
    bench_eval,
    bench_eval_scale,
    bench_eval_set,
    eval_model_location,
    load_eval_model,
    naive_items,
)
from judgetrain.bench.generation import bench_generation
from judgetrain.bench.gpu import (
    DEVICE_EVAL_SETS,
    REAL_SHAPES,
    bench_device,
    bench_device_prefix_sharing,
    device_bench_eval_sharing,
    device_bench_shape,
    flops_per_token,
    measure_matmul_rate,
    random_model_folder,
)
from judgetrain.bench.parser import bench_parser, clean_evaluation, hostile_families
from judgetrain.bench.report import SCHEMA_VERSION, SUMMARY_KEYS, TARGETS, print_table, summarize
from judgetrain.bench.scale import bench_quickstart, bench_train_scale
from judgetrain.bench.train import TRAIN_SHAPES, TrainBench, bench_train, bench_train_shapes

__all__ = [
    "DEVICE_EVAL_SETS", "EVAL_SETS", "REAL_SHAPES", "SCHEMA_VERSION", "SUMMARY_KEYS", "TARGETS",
    "TRAIN_SHAPES", "BenchError", "NaiveEvaluator", "TrainBench", "bench_device", "bench_device_prefix_sharing",
    "bench_eval", "bench_eval_scale", "bench_eval_set", "bench_generation", "bench_parser", "bench_quickstart", "bench_train",
    "bench_train_scale", "bench_train_shapes", "clean_evaluation", "default_recipe",
    "device_bench_eval_sharing", "device_bench_shape", "eval_model_location", "flops_per_token", "hostile_families",
    "load_eval_model", "measure_matmul_rate", "median", "naive_items", "print_table", "random_model_folder",
    "ratio", "run_worker", "summarize",
]
