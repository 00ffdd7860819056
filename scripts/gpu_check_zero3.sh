#!/bin/bash
# On a machine with 2 or more CUDA GPUs and deepspeed installed (docs/scale.md, "DeepSpeed"): run the ZeRO-3 full fine-tune
# recipe with the tiny judge for a few steps, kill it after its first checkpoint, resume with --resume auto, and check
# that
#   - the run was really ZeRO-3 (parallelism.json: DEEPSPEED, parameters partitioned over the GPUs),
#   - the eval callback scored every row once (results.json rows_per_rank),
#   - the final model.safetensors is the gathered 16-bit model (full shapes, bf16) and loads as an ordinary model,
#   - metrics.jsonl has each step once.
# Usage, from the repository root:  bash scripts/gpu_check_zero3.sh [NUM_GPUS] [OUT_DIR] [TRAIN ARGS...]
# TRAIN ARGS go to judgetrain.train. The same check runs on a machine without a GPU (DeepSpeed's CPU accelerator, 2
# processes over gloo; transformers accepts bf16 on CPU only with use_cpu):
#   bash scripts/gpu_check_zero3.sh 2 runs/cpu-check-zero3 --use_cpu true
set -euo pipefail

NUM_GPUS=${1:-$(python -c "import torch; print(torch.cuda.device_count())")}
OUT=${2:-runs/gpu-check-zero3}
shift $(( $# < 2 ? $# : 2 ))
TRAIN_ARGS=("$@")
PORT=${PORT:-29531}
RECIPE=$OUT.recipe.yaml
rm -rf "$OUT" && mkdir -p "$(dirname "$OUT")"

# The ZeRO-3 recipe with the tiny judge and the bundled samples, 6 steps, a checkpoint and an eval every 3.
python - "$RECIPE" <<'PY'
import sys, yaml
recipe = yaml.safe_load(open("recipes/judgebias_qwen3_8b_full_zero3.yaml"))
recipe.update(model_name_or_path="tiny-judge", train_datasets=[{"dataset": "judgebias", "source": "bundled", "split": "train"}],
              eval_rmbench_source="bundled", eval_judgebias_source="bundled", eval_max_rows=16,
              eval_strategy="steps", eval_steps=3,
              max_steps=6, save_steps=3, logging_steps=1, max_length=1024, per_device_train_batch_size=2,
              gradient_accumulation_steps=1, learning_rate=1e-4, warmup_steps=0, report_to="none", run_name=None)
yaml.safe_dump(recipe, open(sys.argv[1], "w"), sort_keys=False)
PY

LAUNCH=(accelerate launch --config_file accelerate_configs/zero3.yaml --num_processes "$NUM_GPUS"
        --main_process_port "$PORT" -m judgetrain.train "$RECIPE" --output_dir "$OUT" --resume auto "${TRAIN_ARGS[@]}")

# 1. start, stop the launch (SIGTERM to `accelerate launch` itself: the run saves and stops) once checkpoint-3 is
#    complete, and wait for it to end
"${LAUNCH[@]}" > "$OUT.log1" 2>&1 &
LAUNCHER=$!
until [[ -f "$OUT/checkpoint-3/judgetrain_complete.json" ]]; do
  kill -0 $LAUNCHER 2>/dev/null || { echo "run ended before checkpoint-3"; tail -50 "$OUT.log1"; exit 1; }
  sleep 0.2
done
kill -TERM $LAUNCHER; wait $LAUNCHER || true
[[ ! -f "$OUT/checkpoint-6/judgetrain_complete.json" ]] || { echo "the run reached its end before the stop"; exit 1; }
echo "stopped after checkpoint-3"

# 2. resume to the end
"${LAUNCH[@]}" > "$OUT.log2" 2>&1 || { tail -80 "$OUT.log2"; exit 1; }
grep -q "Resuming from .*checkpoint-" "$OUT.log2"

# 3. checks
python - "$OUT" "$NUM_GPUS" <<'PY'
import json, sys
from pathlib import Path
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from judgetrain.models.tiny import ensure_tiny_judge

out, n = Path(sys.argv[1]), int(sys.argv[2])
effect = json.loads((out / "parallelism.json").read_text())
assert effect["distributed_type"] == "DEEPSPEED" and effect["processes"] == n, effect
assert effect["sharded"] == ["optimizer state", "gradients", "parameters"], effect
assert effect["fraction_on_this_rank"] < 1.0, effect
steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines() if '"train/loss"' in l]
assert steps == [1, 2, 3, 4, 5, 6], steps
for step in (3, 6):
    res = json.loads((out / "eval" / str(step) / "results.json").read_text())
    for suite, stats in res["stats"].items():
        assert sum(stats["rows_per_rank"]) == res["results"][suite]["n_rows"], (suite, stats)
reference = AutoModelForCausalLM.from_pretrained(ensure_tiny_judge())
with safe_open(str(out / "model.safetensors"), "pt") as f:
    for name in f.keys():
        t = f.get_tensor(name)
        assert t.dtype == torch.bfloat16, (name, t.dtype)
        assert t.numel() > 0, f"{name} is an empty ZeRO-3 partition, not the gathered weight"
model = AutoModelForCausalLM.from_pretrained(out)
assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in reference.state_dict().items()}
print("ZeRO-3 check passed: partitioned over", n, "processes, stopped and resumed, 16-bit model gathered on save")
PY
