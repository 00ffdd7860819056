#!/bin/bash
# Train a judgetrain recipe on several machines under SLURM: one task per machine, each task runs one
# `accelerate launch` that starts one process per GPU of its machine. Submit from the repository root:
#
#   sbatch --nodes 2 scripts/slurm_train.sh recipes/judgebias_qwen3_8b_lora.yaml accelerate_configs/multinode_ddp.yaml
#   sbatch --nodes 4 scripts/slurm_train.sh recipes/judgebias_qwen3_8b_full_zero3.yaml accelerate_configs/multinode_zero3.yaml
#
# Extra arguments after the accelerate config are recipe overrides (--learning_rate 1e-6 ...). output_dir must be on
# a filesystem every machine sees: checkpoints are written there and `--resume auto` finds them after a requeue.
#
#SBATCH --job-name=judgetrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one `accelerate launch` per machine; it starts the per-GPU processes
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --requeue                    # a preempted job goes back to the queue and resumes from its last checkpoint
#SBATCH --signal=TERM@120            # SIGTERM to every task 2 minutes before the time limit: judgetrain saves, stops
#SBATCH --output=logs/%x-%j.out

set -euo pipefail

RECIPE=${1:?usage: sbatch scripts/slurm_train.sh RECIPE ACCELERATE_CONFIG [overrides...]}
ACCELERATE_CONFIG=${2:?usage: sbatch scripts/slurm_train.sh RECIPE ACCELERATE_CONFIG [overrides...]}
shift 2

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MAIN_PROCESS_PORT=${MAIN_PROCESS_PORT:-29500}
# The exit status judgetrain gives a run it stopped on SIGTERM after saving a checkpoint (preemption, time limit):
# docs/reliability.md, "Exit codes and schedulers".
PREEMPTED_EXIT_CODE=${PREEMPTED_EXIT_CODE:-143}
# Tags this launch's line in output_dir/judgetrain_status.jsonl (accelerate launch reports every worker exit as 1).
export JUDGETRAIN_LAUNCH_ID="slurm-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"

# The head node (machine rank 0) hosts the rendezvous: the first host of the allocation.
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)   # sed reads all: no SIGPIPE under pipefail
HEAD_NODE_IP=$(srun --nodes=1 --ntasks=1 -w "$HEAD_NODE" hostname --ip-address | awk '{print $1}')

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# torchrun's agent SIGKILLs its workers this many seconds after passing a SIGTERM on (30 by default): too short for
# an 8B step plus the stop checkpoint. Inside the 120 s of --signal=TERM@120, with room for the agent to exit.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-110}
export NCCL_ASYNC_ERROR_HANDLING=1
mkdir -p logs

echo "judgetrain: $SLURM_NNODES machines x $GPUS_PER_NODE GPUs, head $HEAD_NODE ($HEAD_NODE_IP:$MAIN_PROCESS_PORT)," \
     "recipe $RECIPE, config $ACCELERATE_CONFIG, restart ${SLURM_RESTART_COUNT:-0}"

# The single quotes keep $SLURM_PROCID for each task: the machine rank is the task's own.
set +e
# --cpus-per-task again on srun: Slurm 22.05-23.02 does not pass the batch value on, and the whole launch tree (per-GPU
# workers, tokenisation, data loaders) would be bound to one core.
srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-64}" bash -c '
  exec accelerate launch \
    --config_file "'"$ACCELERATE_CONFIG"'" \
    --num_machines "$SLURM_NNODES" \
    --num_processes $(( SLURM_NNODES * '"$GPUS_PER_NODE"' )) \
    --machine_rank "$SLURM_PROCID" \
    --main_process_ip "'"$HEAD_NODE_IP"'" \
    --main_process_port '"$MAIN_PROCESS_PORT"' \
    --rdzv_backend static \
    --same_network \
    -m judgetrain.train "'"$RECIPE"'" --resume auto '"$*"'
'
status=$?
# the run's own exit code, as it wrote it for this launch (0 finished, 2 refused, 3 non-finite, 143 preempted); a 0
# that the launcher contradicts (a process failed at its exit) gives the launcher's code
if run_status=$(JUDGETRAIN_LAUNCHER_EXIT=$status python -m judgetrain.cli.status "$RECIPE" "$@" 2>/dev/null); then
  status=${run_status##*$'\n'}
fi
set -e

if [[ -n "$PREEMPTED_EXIT_CODE" && $status -eq $PREEMPTED_EXIT_CODE ]]; then
  echo "judgetrain: stopped on SIGTERM after a checkpoint; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit $status
