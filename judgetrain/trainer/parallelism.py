"""What parallelism a launch asked for, what it got, and a refusal when the two differ.

`accelerate launch --config_file X.yaml` tells each process what to do through environment variables
(ACCELERATE_USE_FSDP, FSDP_VERSION, ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_ZERO_STAGE, WORLD_SIZE, ...).
Accelerate honours them only on some devices and says nothing when it does not: on a machine without a GPU an FSDP
config becomes plain data parallelism over gloo (Accelerate promotes MULTI_GPU-like states to FSDP, never
MULTI_CPU), and a DeepSpeed config either runs each process as "rank 0 of 1" (no CPU state: DeepSpeed then stops at
its batch-size check) or is ignored (a CPU state). judgetrain therefore

* reads the request (`requested_parallelism`),
* joins the processes (`join_process_group`): over gloo on a CPU machine, and for an FSDP2 or DeepSpeed request on
  CPU it lets Accelerate's own FSDP2 / DeepSpeed path run on the joined group (torch's ``fully_shard`` and DeepSpeed's
  ZeRO-1/2/3 with its CPU accelerator work over gloo; only Accelerate's type checks stood in the way),
* refuses a request it cannot honour before any data or weights load (`check_request`),
* and at the first training step checks and logs what is really in effect: type, processes, machines, backend and
  which tensors are sharded (`ParallelismReport`, written to ``<output_dir>/parallelism.json``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

import torch.distributed as dist
from accelerate import PartialState
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DistributedType
from transformers import TrainerCallback

from judgetrain.compat.accelerate import present_distributed_type, shared_distributed_type
from judgetrain.data.prepare import machine_placement
from judgetrain.utils.device import has_accelerator
from judgetrain.utils.errors import BadInputError

logger = logging.getLogger(__name__)


DEEPSPEED_INSTALL = (
    "pip install --no-build-isolation deepspeed, into an environment that already has torch (DeepSpeed's setup "
    "imports torch: under pip's build isolation it would fetch a second, CUDA build of torch to build with)"
)


def deepspeed_not_installed(subject: str) -> str | None:
    """``<subject> but the deepspeed package is not installed: <how to install it>``; None when it is installed. The
    one check and wording behind the launch refusal, `judgetrain train`'s pre-launch check and the dry run's note."""

    if importlib.util.find_spec("deepspeed") is not None:
        return None
    return f"{subject} but the deepspeed package is not installed: {DEEPSPEED_INSTALL}"


class ParallelismError(BadInputError, RuntimeError):
    """The launch asked for a parallelism (FSDP, DeepSpeed, several processes) that this run would not give."""


def _flag(env: Mapping[str, str], name: str) -> bool:
    return str(env.get(name, "false")).lower() in ("1", "true", "yes")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except (TypeError, ValueError):
        return default


@dataclass
class LaunchRequest:
    """The parallelism the launcher asked for, from the environment it gave this process."""

    kind: str  # "single" | "ddp" | "fsdp" | "deepspeed"
    processes: int
    machines: int
    machine_rank: int | None  # None: the launcher does not say (the process group does: `in_effect`)
    fsdp_version: int | None = None
    zero_stage: int | None = None
    fsdp_options: dict = field(default_factory=dict)

    def describe(self) -> str:
        extra = f" v{self.fsdp_version}" if self.kind == "fsdp" else f" ZeRO-{self.zero_stage}" if self.kind == "deepspeed" else ""
        return f"{self.kind}{extra} over {self.processes} process(es) on {self.machines} machine(s)"


def requested_parallelism(env: Mapping[str, str] | None = None) -> LaunchRequest:
    """Read what `accelerate launch` (or torchrun + the ACCELERATE_* variables) asked this process to do."""
    env = os.environ if env is None else env
    world = _int(env, "WORLD_SIZE", 1)
    machines, machine_rank = launcher_machine(env, world)
    if _flag(env, "ACCELERATE_USE_DEEPSPEED"):
        stage = _int(env, "ACCELERATE_DEEPSPEED_ZERO_STAGE", 2)
        return LaunchRequest("deepspeed", world, machines, machine_rank, zero_stage=stage)
    if _flag(env, "ACCELERATE_USE_FSDP"):
        options = {k[5:].lower(): v for k, v in env.items() if k.startswith("FSDP_") and k != "FSDP_VERSION"}
        return LaunchRequest("fsdp", world, machines, machine_rank, fsdp_version=_int(env, "FSDP_VERSION", 1),
                       fsdp_options=options)
    return LaunchRequest("ddp" if world > 1 else "single", world, machines, machine_rank)


# (machine index, machine count) variables of the launchers judgetrain documents (docs/scale.md), first that is set
MACHINE_VARIABLES = (
    ("GROUP_RANK", None),  # torchrun, and accelerate launch (which runs torchrun's agent)
    ("NODE_RANK", None),  # torch.distributed.launch
    ("CROSS_RANK", "CROSS_SIZE"),  # DeepSpeed's launcher
    ("SLURM_NODEID", "SLURM_NNODES"),  # srun, one task per GPU
)


def launcher_machine(env: Mapping[str, str], world: int) -> tuple[int, int | None]:
    """(machines, this machine's index) as the launcher tells this process; the index is None where no launcher
    variable says it (several processes and none of `MACHINE_VARIABLES`). The run itself does not depend on it:
    the rows folder and the report's machine come from the process group (`judgetrain.data.prepare.machine_placement`),
    which is refused where it cannot tell the machines apart."""
    if world <= 1:
        return 1, 0
    for index, count in MACHINE_VARIABLES:
        if index in env:
            local_world = _int(env, "LOCAL_WORLD_SIZE", _int(env, "LOCAL_SIZE", world))
            machines = _int(env, count, 0) if count else 0
            return max(machines or world // max(local_world, 1), 1), _int(env, index, 0)
    local_world = _int(env, "LOCAL_WORLD_SIZE", world)
    return max(world // max(local_world, 1), 1), None


def check_request(request: LaunchRequest, *, gpu: bool) -> None:
    """Refuse, with the reason and the way out, a request this machine / install would silently downgrade."""
    if request.kind == "deepspeed":
        if not gpu and request.processes < 2:
            raise ParallelismError(
                f"the launch asks for DeepSpeed ZeRO-{request.zero_stage} in a single process on a machine without a "
                "GPU: there is nothing to partition over. Launch 2 or more processes (--num_processes 2)."
            )
        missing = deepspeed_not_installed(f"the launch asks for DeepSpeed ZeRO-{request.zero_stage}")
        if missing:
            raise ParallelismError(missing)
    if request.kind == "fsdp":
        if request.processes < 2:
            raise ParallelismError(
                "the launch asks for FSDP with a single process: there is nothing to shard over and Accelerate would "
                "run it unsharded. Launch 2 or more processes (--num_processes) or use a single-device config."
            )
        if not gpu and request.fsdp_version != 2:
            raise ParallelismError(
                f"the launch asks for FSDP version {request.fsdp_version} on a machine without a GPU; judgetrain "
                "shards on CPU only with FSDP2 (fsdp_version: 2, e.g. accelerate_configs/fsdp2_cpu.yaml)."
            )


def deepspeed_missing(accelerate_config: str | None) -> str | None:
    """Before `judgetrain train` hands over to `accelerate launch`: a DeepSpeed config without the deepspeed package,
    in words with the way to install it (accelerate's own refusal says only `pip3 install deepspeed`, which builds
    against a second, downloaded torch)."""
    if not accelerate_config:
        return None
    missing = deepspeed_not_installed(f"{accelerate_config} is a DeepSpeed config")
    if missing is None:
        return None

    if not str(load_config_from_file(accelerate_config).distributed_type).endswith("DEEPSPEED"):
        return None
    return missing


def join_process_group(env: Mapping[str, str] | None = None, timeout_s: int | None = None):
    """Create Accelerate's process state for this launch (before anything reads the device) and return
    (PartialState, LaunchRequest).

    Without a GPU, `accelerate launch` starts N processes but Accelerate only joins them (gloo) when the state is
    created with cpu=True; and it promotes a state to FSDP only from a GPU-like type, so an FSDP2 request on CPU
    would fall back to DDP. For that request the joined CPU state is presented to Accelerate as a multi-device one
    (devices stay CPU, backend stays gloo); `ParallelismReport` then checks at the first step that the model really
    is sharded, so the shim cannot fail silently."""

    env = os.environ if env is None else env
    request = requested_parallelism(env)
    gpu = has_accelerator()
    check_request(request, gpu=gpu)
    if not gpu and request.processes > 1:
        os.environ["ACCELERATE_USE_CPU"] = "true"
    if not gpu and request.kind == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator: gloo, no CUDA probing
    kwargs = {}
    if timeout_s and request.processes > 1:  # the recipe's ddp_timeout for every collective of the group

        kwargs["timeout"] = timedelta(seconds=timeout_s)
    state = PartialState(cpu=not gpu, **kwargs)
    if timeout_s and request.processes > 1:
        logger.debug("process group joined with ddp_timeout %d s", timeout_s)
    if request.processes > 1 and state.num_processes != request.processes:
        raise ParallelismError(
            f"the launch asks for {request.processes} processes but this one joined a group of {state.num_processes} "
            f"(type {state.distributed_type}); refusing to train {request.processes} independent copies"
        )
    allow_fsdp_on_cpu(request)
    return state, request


def allow_fsdp_on_cpu(request: LaunchRequest) -> bool:
    """For an FSDP2 request on a CPU process group, present the joined state to Accelerate as a multi-device one so
    that `Accelerator()` builds its FSDP2 plugin (devices stay CPU, backend stays gloo). Call it again after
    `TrainingArguments` set up its devices: that resets and re-creates Accelerate's state. Returns whether it did."""

    if request.kind != "fsdp" or request.fsdp_version != 2:
        return False
    if shared_distributed_type() != DistributedType.MULTI_CPU:
        return False
    present_distributed_type(DistributedType.MULTI_GPU)
    return True


def allow_deepspeed_on_cpu(request: LaunchRequest) -> bool:
    """For a DeepSpeed request on a CPU process group, present the joined state (gloo, CPU devices) to Accelerate as
    a DeepSpeed one, so that `Accelerator()` builds its DeepSpeed plugin and `prepare` hands the model to
    ``deepspeed.initialize``. Call it after `TrainingArguments` set up its devices (which re-creates the state as a
    CPU one from ``ACCELERATE_USE_CPU``) and before the Trainer builds its Accelerator (which must not see
    ``ACCELERATE_USE_CPU``: Accelerate skips DeepSpeed on a CPU state). Returns whether it did."""

    if request.kind != "deepspeed":
        return False
    if shared_distributed_type() != DistributedType.MULTI_CPU:
        return False
    os.environ.pop("ACCELERATE_USE_CPU", None)
    present_distributed_type(DistributedType.DEEPSPEED)
    return True


# ----------------------------------------------------------------------------------------------- in effect


# What `zero3_gather_fits` keeps free beside the gathered weights: a fraction of them (the key/value cache,
# the decode step's activations and the allocator's fragmentation)
ZERO3_GATHER_HEADROOM = 0.2


def zero3_gather_fits(param_count: int, bytes_per_param: int, free_bytes: float | None,
                      headroom: float = ZERO3_GATHER_HEADROOM) -> bool:
    """Whether generation under ZeRO-3 may gather the whole model (``eval_generate_zero3_gather: auto``): the full
    weights (``param_count`` x ``bytes_per_param``), plus ``headroom`` of them, fit in ``free_bytes``, the device
    memory free beside what is already resident. ``free_bytes`` None (a CPU run, or free memory unknown): True,
    gather as before."""
    if free_bytes is None:
        return True
    return param_count * bytes_per_param * (1 + headroom) <= free_bytes


def sharding_of(model) -> dict[str, Any]:
    """Parameters held by this rank vs. the full model (DTensor shards under FSDP2, ZeRO-3 partitions), and, in a
    sharded model, the parameters gathered whole right now (FSDP2 keeps its root module's gathered after a forward)."""
    local = full = sharded = 0
    whole = []
    for name, p in model.named_parameters():
        n_full = p.numel()
        if hasattr(p, "to_local"):  # torch DTensor (FSDP2)
            n_local, is_sharded = p.to_local().numel(), True
        elif hasattr(p, "ds_numel"):  # DeepSpeed ZeRO-3 partitioned parameter
            n_full, n_local, is_sharded = p.ds_numel, getattr(p, "ds_tensor", p).numel(), True
        else:
            n_local, is_sharded = n_full, False
            whole.append(name)
        local, full, sharded = local + n_local, full + n_full, sharded + int(is_sharded)
    return {"parameters_full": full, "parameters_on_this_rank": local, "sharded_tensors": sharded,
            "fraction_on_this_rank": round(local / full, 4) if full else 1.0,
            "gathered_whole": whole if sharded else []}


def zero_partition(engine) -> dict[str, Any]:
    """The ZeRO stage the DeepSpeed engine really runs and the optimizer state this rank holds: its fp32 partition of
    the trainable parameters (ZeRO-1/2 keep ``single_partition_of_fp32_groups``, ZeRO-3 ``fp32_partitioned_groups_flat``)
    beside the trainable parameters of the whole model."""
    stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else 0
    optimizer = getattr(engine, "optimizer", None)
    flat = getattr(optimizer, "single_partition_of_fp32_groups", None) or \
        getattr(optimizer, "fp32_partitioned_groups_flat", None) or []
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in engine.parameters() if p.requires_grad)
    held = sum(t.numel() for t in flat)
    return {"zero_stage": stage, "trainable_full": trainable, "optimizer_state_on_this_rank": held,
            "optimizer_fraction_on_this_rank": round(held / trainable, 4) if trainable else 1.0}


def in_effect(accelerator, model, request: LaunchRequest) -> dict[str, Any]:
    """What this run actually does (from the prepared Accelerator and model), beside what was asked."""

    state = accelerator.state
    _, machine, machines = machine_placement(state)  # from the process group, whatever the launcher set
    kind = str(state.distributed_type).split(".")[-1]
    shards = sharding_of(model)
    sharded: list[str] = []
    if kind == "FSDP":
        sharded = ["parameters", "gradients", "optimizer state"]
    elif kind == "DEEPSPEED":
        zero = zero_partition(model)
        shards.update(zero)
        sharded = ["optimizer state", "gradients", "parameters"][: {1: 1, 2: 2, 3: 3}.get(zero["zero_stage"], 0)]
    return {
        "requested": asdict(request),
        "distributed_type": kind,
        "fsdp_version": getattr(state.fsdp_plugin, "fsdp_version", None) if kind == "FSDP" else None,
        "processes": state.num_processes,
        "machines": machines,
        "machine_rank": machine,
        "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
        "device": str(accelerator.device),
        "sharded": sharded,
        "replicated": [t for t in ("parameters", "gradients", "optimizer state") if t not in sharded],
        **shards,
    }


def honoured(request: LaunchRequest, effect: dict[str, Any]) -> str | None:
    """None when the run gives what was asked; otherwise the mismatch in words."""
    expected = {"single": ("NO",), "ddp": ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU"), "fsdp": ("FSDP",),
                "deepspeed": ("DEEPSPEED",)}[request.kind]
    if effect["distributed_type"] not in expected:
        return f"asked for {request.describe()}, Accelerate runs {effect['distributed_type']}"
    if effect["processes"] != request.processes:
        return f"asked for {request.processes} processes, the group has {effect['processes']}"
    if request.kind == "fsdp" and effect["sharded_tensors"] == 0:
        return "asked for FSDP, but no parameter of the prepared model is sharded"
    if request.kind == "fsdp" and effect["fsdp_version"] != request.fsdp_version:
        return f"asked for FSDP{request.fsdp_version}, Accelerate runs FSDP{effect['fsdp_version']}"
    if request.kind == "deepspeed":
        return _zero_problem(request, effect)
    return None


def _zero_problem(request: LaunchRequest, effect: dict[str, Any]) -> str | None:
    """A DeepSpeed run must run the requested stage and partition what that stage partitions."""
    if effect["zero_stage"] != request.zero_stage:
        return f"asked for ZeRO-{request.zero_stage}, DeepSpeed runs ZeRO-{effect['zero_stage']}"
    if request.processes > 1 and effect["optimizer_fraction_on_this_rank"] >= 1.0:
        return f"asked for ZeRO-{request.zero_stage}, but this rank holds the optimizer state of every parameter"
    if request.zero_stage == 3 and effect["sharded_tensors"] == 0:
        return "asked for ZeRO-3, but no parameter of the prepared model is partitioned"
    return None


def describe(effect: dict[str, Any]) -> str:
    kind = effect["distributed_type"] + (f"{effect['fsdp_version']}" if effect.get("fsdp_version") else "")
    if effect.get("zero_stage") is not None:
        kind += (f" ZeRO-{effect['zero_stage']} (optimizer state on this rank: "
                 f"{effect['optimizer_state_on_this_rank']:,} of {effect['trainable_full']:,} trainable)")
    return (
        f"Parallelism in effect: {kind}, {effect['processes']} process(es) on {effect['machines']} machine(s), "
        f"backend {effect['backend']}, device {effect['device']}; sharded: {', '.join(effect['sharded']) or 'nothing'}"
        f" (this rank holds {effect['parameters_on_this_rank']:,} of {effect['parameters_full']:,} parameters)"
    )


# config keys that name a mixture of experts' expert count (Mixtral, Qwen2/3-MoE, DeepSeek, OLMoE, ...)
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def may_leave_parameters_unused(model) -> bool:
    """Whether a forward pass can leave a trainable parameter of ``model`` without a gradient, which DDP must then
    look for (``find_unused_parameters``): a mixture of experts, whose tokens reach some experts only. A dense text
    model, full or LoRA (PEFT's wrapper passes the base model's config through), uses every trainable parameter."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return any((getattr(c, key, None) or 0) > 1 for c in (config, text) for key in EXPERT_COUNT_KEYS)


class ParallelismReport(TrainerCallback):
    """At the first step (the model is prepared by then) log and record what is in effect, and stop the run when
    it is not what the launch asked for. Needs `attach(trainer)` for the accelerator."""

    def __init__(self, request: LaunchRequest, output_dir: str | os.PathLike):
        self.request = request
        self.output_dir = Path(output_dir)
        self.trainer = None
        self.effect: dict[str, Any] | None = None

    def attach(self, trainer) -> ParallelismReport:
        self.trainer = trainer
        return self

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model = self.trainer.model_wrapped if self.trainer is not None else model
        self.effect = in_effect(self.trainer.accelerator, model, self.request)
        problem = honoured(self.request, self.effect)
        logger.info(describe(self.effect))
        if self.trainer.accelerator.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "parallelism.json").write_text(json.dumps(self.effect, indent=1, default=str))
        if problem:
            raise ParallelismError(f"refusing to train: {problem}")
        return control
