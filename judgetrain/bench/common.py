"""What every part of the bench shares: medians and ratios, the machine and package versions, the load average,
alternating rounds, and the fresh-subprocess plumbing (`run_worker`) that gives each train run its own peak memory.
"""

# Late imports: torch, yaml, trl (inside the functions that use them): each benchmark part loads only what it
# measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata as md
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from judgetrain.utils.errors import BadInputError

# Keys of the trainer arguments that name a run rather than configure it (left out of the config comparison).
_RUN_NAMING_KEYS = {"output_dir", "logging_dir", "run_name", "hub_model_id"}


class BenchError(BadInputError, RuntimeError):
    """A benchmark that cannot give a fair figure (configs differ, scores differ, a run failed); `judgetrain bench`
    refuses with its one line, exit code 2."""


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def ratio(a: float, b: float) -> float:
    return float(a / b) if b else math.nan


def peak_rss_mb() -> float:
    """High-water resident set of this process (Linux: KiB; macOS: bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def package_versions() -> dict[str, str]:

    out = {"python": platform.python_version()}
    for name in ("judgetrain", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": None,
    }
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def alternating(n_warmup: int, n_repeats: int, sides: list[str]):
    """(round, is_warmup, order) for every round: warm-up rounds first, then timed rounds whose order rotates so no
    side always runs first (drift and cache effects spread over all sides)."""
    for i in range(n_warmup + n_repeats):
        shift = i % len(sides)
        yield i, i < n_warmup, sides[shift:] + sides[:shift]


def timed_sides(run: dict, repeats: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """(seconds of each round, last output) of each side of ``run`` (side -> a call), ``repeats`` rounds in
    `alternating` order."""
    times: dict[str, list[float]] = {side: [] for side in run}
    outs: dict[str, Any] = {}
    for _, _, order in alternating(0, repeats, list(run)):
        for side in order:
            t0 = time.perf_counter()
            outs[side] = run[side]()
            times[side].append(time.perf_counter() - t0)
    return times, outs


def default_recipe() -> str:
    for base in (Path(__file__).resolve().parents[2], Path.cwd()):
        path = base / "recipes" / "quickstart.yaml"
        if path.is_file():
            return str(path)
    raise BenchError("recipes/quickstart.yaml not found next to the package or in the current directory; pass --recipe")


def args_digest(args) -> tuple[str, dict]:
    """Hash of the trainer arguments that configure the run (naming keys left out)."""
    d = {k: v for k, v in args.to_dict().items() if k not in _RUN_NAMING_KEYS}
    text = json.dumps(d, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16], json.loads(text)


def device_peak(result: dict) -> None:
    import torch

    if torch.cuda.is_available():
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20


def run_worker(spec: dict, workdir: Path, name: str, timeout: float = 3600) -> dict:
    """Run one worker in a fresh Python process; returns its result (peak memory is that process's own)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = workdir / f"{name}.spec.json", workdir / f"{name}.result.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", WANDB_MODE="disabled",
               HF_DATASETS_DISABLE_PROGRESS_BARS="1", TQDM_DISABLE="1", PYTHONWARNINGS="ignore")
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "judgetrain.bench.workers", str(spec_path), str(result_path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not result_path.is_file():
        tail = (proc.stderr or "")[-3000:]
        raise BenchError(f"bench worker {name} ({spec['kind']}) failed with exit code {proc.returncode}:\n{tail}")
    result = json.loads(result_path.read_text())
    result["process_wall"] = time.perf_counter() - t0
    return result


def recipe_parts(recipe_path: str) -> tuple[dict, dict, dict]:
    """(DPOConfig keys, ModelConfig keys, judgetrain keys) of a recipe file."""

    import yaml
    from trl import DPOConfig, ModelConfig

    data = yaml.safe_load(Path(recipe_path).read_text())
    dpo_fields = {f.name for f in dataclasses.fields(DPOConfig)}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    dpo = {k: v for k, v in data.items() if k in dpo_fields}
    model = {k: v for k, v in data.items() if k in model_fields}
    rest = {k: v for k, v in data.items() if k not in dpo_fields and k not in model_fields}
    return dpo, model, rest


def overrides_argv(overrides: dict) -> list[str]:
    argv = []
    for k, v in overrides.items():
        argv += [f"--{k}", json.dumps(v) if isinstance(v, (list, dict)) else str(v)]
    return argv
