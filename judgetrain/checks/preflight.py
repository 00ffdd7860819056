"""What would fail later, found before any weights load: each problem one line with its fix, all of them at once.

Run by `judgetrain train --dry-run` and at the start of every run (before the model loads, on the main process):
- every ``report_to`` integration is importable and can log (W&B: an API key, or offline / disabled mode);
- what the recipe names is installed: deepspeed (a DeepSpeed accelerate config), flash attention
  (``attn_implementation: flash_attention_2`` / ``_3``, by transformers' own checks, hub kernels included), liger-kernel (``use_liger_kernel``), bitsandbytes (4/8-bit loading);
- the output_dir filesystem takes the run's lock (``flock``: Lustre without ``-o flock`` and NFSv3 ``nolock``
  refuse it);
- there is disk for ``save_total_limit`` (+1 while the next one is written) checkpoints of the estimated size;
- a hub model id resolves while the hub is offline (``HF_HUB_OFFLINE``): its files must be in the local cache.

A run with problems stops with `PreflightError` (exit code 2), naming every one; the dry run lists them.
"""

# Late imports: transformers (its integrations, inside report_to_problems): their availability check imports W&B,
# half a second of start-up, which `report_to: none` does not need.

from __future__ import annotations

import errno
import importlib
import importlib.util
import os
import shutil
import uuid
from pathlib import Path

import torch
from huggingface_hub import HfApi
from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError
from transformers.utils import import_utils

from judgetrain.checks.memory import model_shape, plan_from_recipe
from judgetrain.config.recipe import Recipe, RecipeError
from judgetrain.models.aliases import aliases, is_alias
from judgetrain.trainer.parallelism import deepspeed_missing
from judgetrain.utils.files import LockUnsupported, file_lock
from judgetrain.utils.hub import cached_snapshot, hub_offline, is_hub_id
from judgetrain.utils.ranks import decided_on_main

GIB = 1024**3


class PreflightError(RecipeError):
    """One or more start-up checks failed; the message has one line per problem, each with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("the run would fail later; fix these first:\n" + "\n".join(f"  - {p}" for p in problems))


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# the pip line of an integration whose module or package is named otherwise (the rest: its own name)
_INSTALL = {"azure_ml": "azureml-core", "dagshub": "dagshub mlflow", "flyte": "flytekit flytekitplugins-deck-standard"}
_MODULE = {"azure_ml": "azureml", "flyte": "flytekit"}


def report_to_problems(report_to, env=os.environ) -> list[str]:
    """Each ``report_to`` integration one that transformers knows and finds available
    (``get_available_reporting_integrations``, the rule its Trainer uses), and W&B able to log (an API key, a netrc
    login, or a mode that needs neither). ``none`` and ``all`` alone import nothing (transformers' availability
    check imports W&B, half a second of start-up, when it is installed)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if all(name in ("none", "all") for name in names):
        return []
    from transformers.integrations import INTEGRATION_TO_CALLBACK, get_available_reporting_integrations

    available = set(get_available_reporting_integrations())
    problems = []
    for name in names:
        if name in ("none", "all"):
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            problems.append(f"report_to: {name} is not an integration transformers knows (one of "
                            f"{', '.join(INTEGRATION_TO_CALLBACK)})")
            continue
        module = _MODULE.get(name, name)
        if name not in available:
            if not _installed(module) and name != "kubeflow":
                problems.append(f"report_to: {name} is not installed: `pip install {_INSTALL.get(name, module)}`, or "
                                "drop it from report_to (metrics.jsonl is always written)")
            else:  # comet_ml without its API key, mlflow or kubeflow switched off, azure_ml beside mlflow
                problems.append(f"report_to: transformers finds {name} unavailable here (not configured, or "
                                "switched off by its DISABLE_* variable): see its setup, or drop it from report_to")
            continue
        if name == "wandb" and not wandb_can_log(env):
            problems.append("report_to: wandb has no API key and is not offline: `wandb login` (or set WANDB_API_KEY),"
                            " or set WANDB_MODE=offline to log locally and `wandb sync` later (compute nodes without"
                            " network need offline)")
    return problems


def wandb_can_log(env=os.environ) -> bool:
    if env.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or env.get("WANDB_DISABLED", "").lower() in ("true", "1"):
        return True
    if env.get("WANDB_API_KEY"):
        return True
    netrc = Path(env.get("NETRC") or Path(env.get("HOME", str(Path.home()))) / ".netrc")
    try:
        return "api.wandb.ai" in netrc.read_text(errors="replace")
    except OSError:
        return False


def package_problems(recipe: Recipe) -> list[str]:
    """The packages the recipe names by its keys."""
    script_args, training_args, model_args = recipe.script_args, recipe.training_args, recipe.model_args
    problems = []
    config = script_args.accelerate_config
    if config and Path(config).is_file():
        missing = deepspeed_missing(config)  # the check `judgetrain train` makes before it launches
        if missing:
            problems.append(missing)
    attn = attention_problem(getattr(model_args, "attn_implementation", None))
    if attn:
        problems.append(attn)
    if getattr(training_args, "use_liger_kernel", False) and not _installed("liger_kernel"):
        problems.append("use_liger_kernel: true needs liger-kernel: `pip install liger-kernel`, or set it to false")
    if (getattr(model_args, "load_in_4bit", False) or getattr(model_args, "load_in_8bit", False)) and not _installed("bitsandbytes"):
        problems.append("load_in_4bit / load_in_8bit need bitsandbytes: `pip install 'judgetrain[quant]'`")
    return problems


# flash_attention_N: the distribution transformers looks for, its module, and how to install it
_FLASH = {"2": ("flash-attn", "flash_attn", "`pip install flash-attn --no-build-isolation` (a CUDA build)"),
          "3": ("flash-attn-3", "flash_attn_interface", "flash-attn-3 (flash-attention's hopper/ build; H100-class GPUs)"),
          "4": ("flash-attn-4", "flash_attn.cute", "`pip install flash-attn-4`")}


def attention_problem(attn: str | None) -> str | None:
    """Whether the model load will find the ``attn_implementation`` asked for, by transformers' own checks
    (checked: transformers 5.24, ``PreTrainedModel._check_and_adjust_attn_implementation``): ``flash_attention_N`` is
    there when ``is_flash_attn_N_available()`` (the package, its version and a CUDA device), or else when the
    ``kernels`` package is installed, as transformers then loads the kernel from the hub
    (``kernels-community/...``); a hub kernel named directly (``owner/repo``) needs ``kernels``. An installed
    flash-attn that does not import (built for another torch or CUDA) is named here, not at model load."""

    attn = str(attn or "")
    if not attn.startswith("flash_attention") and "/" not in attn:
        return None  # eager, sdpa, flex_attention: torch's own
    kernels = import_utils.is_kernels_available()
    if "/" in attn:
        return None if kernels else (f"attn_implementation: {attn} is a hub kernel, loaded with the kernels package: "
                                     "`pip install kernels`, or use sdpa")
    version = attn.rsplit("_", 1)[-1]
    if version not in _FLASH:
        return f"attn_implementation: {attn} is not one transformers knows (flash_attention_2, _3 or _4), or use sdpa"
    dist, module, install = _FLASH[version]
    if getattr(import_utils, f"is_flash_attn_{version}_available")():
        broken = _import_problem(module)
        return None if broken is None else (
            f"attn_implementation: {attn}: the installed {dist} does not load ({broken}): it was built for another "
            f"torch or CUDA; reinstall it for this torch ({install}), or use sdpa")
    if kernels:
        return None  # transformers falls back to the kernels-community build (downloaded at load, cached after)

    here = "" if torch.cuda.is_available() else (" and no CUDA device is visible here (run this check where the job "
                                                 "runs)" if _installed(module.split(".")[0]) else "")
    return (f"attn_implementation: {attn} needs {dist}{here}: install {install}, or `pip install kernels` to load "
            "it from the hub, or use sdpa")


def _import_problem(module: str) -> str | None:
    """Why ``module`` does not import (None when it does): a compiled extension built for another torch fails here."""

    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - ImportError (undefined symbol), OSError (a missing CUDA library), ...
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def _existing_folder(path: str | os.PathLike) -> Path:
    """``path`` if it is a folder, else its nearest parent that exists (where the run will create it)."""
    path = Path(path)
    return path if path.is_dir() else next((p for p in path.parents if p.is_dir()), Path("."))


def lock_problem(output_dir: str | os.PathLike) -> str | None:
    """Whether output_dir's filesystem takes the run's lock: the run's own `file_lock` tried on a probe file there."""

    folder = Path(output_dir)
    probe = _existing_folder(folder) / f".judgetrain-lock-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with file_lock(probe, wait=False):
            return None
    except LockUnsupported as e:
        return (f"output_dir {folder}: its filesystem does not support flock ({errno.errorcode.get(e.errno, e.errno)}"
                "), which the run's lock needs: mount it with flock (Lustre: -o flock; NFS: without nolock) or "
                "use an output_dir on a filesystem that has it")
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        return f"output_dir {folder}: cannot write there ({e.strerror}): choose a writable output_dir"
    finally:
        probe.unlink(missing_ok=True)


def checkpoint_bytes(recipe: Recipe) -> int | None:
    """A checkpoint's size from the model's shape (None when the shape is unknown offline): LoRA saves the adapter
    and its Adam state (fp32: 4 + 8 bytes per trainable number); a full fine-tune saves the weights in their dtype
    and the fp32 Adam state (and master weights under mixed precision), 8-16 bytes per weight in all."""
    model_args = recipe.model_args

    if is_alias(model_args.model_name_or_path):  # judgetrain's own small models: building one here is no check
        return None
    try:
        shape, _ = model_shape(model_args.model_name_or_path)
    except (ValueError, OSError):
        return None
    plan = plan_from_recipe(recipe)
    if plan.lora_r:
        return shape.lora_params(plan.lora_r, plan.lora_targets) * 12 + 64 * 2**20  # + tokenizer, states
    optimizer = 8 + (4 if plan.weight_bytes == 2 else 0)  # Adam m, v (+ fp32 master copy of half weights)
    return shape.params() * (plan.weight_bytes + optimizer) + 64 * 2**20


def disk_problem(recipe: Recipe) -> str | None:
    training_args = recipe.training_args
    if getattr(training_args, "save_strategy", "steps") in ("no", None) or str(getattr(training_args, "save_strategy", "")).endswith("NO"):
        return None
    size = checkpoint_bytes(recipe)
    if size is None:
        return None
    keep = training_args.save_total_limit
    out = Path(training_args.output_dir)
    free = shutil.disk_usage(_existing_folder(out)).free
    need = size * ((keep + 1) if keep else 2)  # the kept ones, plus the next being written before rotation
    if need <= free:
        return None
    many = f"{keep} + 1 checkpoints" if keep else "2 checkpoints (save_total_limit is unset: more pile up)"
    return (f"output_dir {out}: {free / GIB:.1f} GiB free, {many} of ~{size / GIB:.1f} GiB need {need / GIB:.1f} GiB: "
            "free disk, lower save_total_limit, or choose another output_dir")


def hub_problem(model_name_or_path: str, revision: str | None = None, env=os.environ) -> str | None:
    """A hub id with the hub offline must be in the local cache (its config.json at least)."""

    if is_alias(model_name_or_path) or Path(model_name_or_path).exists():
        return None

    if not hub_offline(env):
        return None

    try:
        snapshot = cached_snapshot(model_name_or_path, revision)
    except HFValidationError:  # not a valid hub id: transformers says so itself
        return None
    if snapshot is not None and (snapshot / "config.json").is_file():
        return None
    return (f"model_name_or_path {model_name_or_path}: the hub is offline (HF_HUB_OFFLINE) and the model is not in "
            "the local Hugging Face cache: download it first (`huggingface-cli download "
            f"{model_name_or_path}`) on a machine with network, or give a local folder")


def model_problem(name: str, option: str) -> str | None:
    """Why the model ``name`` given as ``option`` (``--judge``, ``--model``, ...) cannot load here, checked without
    loading it, one line, or None: a folder without a model (no config.json or adapter_config.json), a file, a path
    that does not exist and is no hub id or alias, a hub id that the hub (or, offline, the local cache) does not
    have. A command asks it before it writes anything, so a refused run leaves its output folder as it was."""
    if is_alias(name):
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
            return None
        return f"{option} {name}: a folder without a model (no config.json or adapter_config.json)"
    if path.exists():
        return f"{option} {name}: a file, not a model folder"
    if not is_hub_id(name):
        return f"{option} {name}: no such folder, and not a hub id (owner/name) or an alias ({', '.join(aliases())})"
    offline = hub_problem(name)
    if offline:
        return f"{option} {name}: {offline.split(': ', 1)[1]}"
    if hub_offline():
        return None
    try:
        HfApi().model_info(name, timeout=30)
    except RepositoryNotFoundError:
        return f"{option} {name}: no such model on the hub (or it is private: set HF_TOKEN); check the name"
    except Exception:  # noqa: BLE001 - hub unreachable: the cache may hold it, and the load says what is wrong
        return None
    return None


def preflight(recipe: Recipe) -> list[str]:
    """Every problem found, one line each (empty: nothing predicted to fail)."""
    training_args, model_args = recipe.training_args, recipe.model_args
    problems = report_to_problems(training_args.report_to)
    problems += package_problems(recipe)
    for problem in (lock_problem(training_args.output_dir),
                    disk_problem(recipe),
                    hub_problem(model_args.model_name_or_path, getattr(model_args, "model_revision", None))):
        if problem:
            problems.append(problem)
    return problems


def check_before_start(recipe: Recipe) -> None:
    """At the start of a run, before the model loads: stop with every problem at once (main process decides)."""

    def decide():
        problems = preflight(recipe)
        if problems:
            raise PreflightError(problems)

    decided_on_main(decide)
