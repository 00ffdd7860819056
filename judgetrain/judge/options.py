"""The options of a `judgetrain judge` run (standard library only: a resume with nothing left to do decides with
them before torch is imported, `judgetrain.judge.resume`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Options:
    max_new_tokens: int = 512
    max_length: int | None = None
    batch_tokens: int | None = None  # None: auto (`judgetrain.judge.fit.auto_batch_tokens`)
    max_batch_size: int = 32
    chunk_size: int = 64
    backend: str = "auto"
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    force_score_prefix: bool = False
    score_key: str = "overall_score"
    scale: tuple[float, float] = (0.5, 5.5)
    dtype: str = "auto"
    concurrency: int = 8
    trust_remote_code: bool = False
    endpoint_timeout_s: float = 120.0  # endpoint judges: seconds for one response,
    endpoint_max_retries: int = 30  # retries per prompt,
    endpoint_wait_budget_s: float = 600.0  # and seconds a prompt may wait between its retries in all
    gpu_memory_utilization: float = 0.85  # vLLM judges: the share of the GPU's memory the engine may take
    retry_rejected: bool = False  # endpoint judges: rows the server refused are generated again (not the identity)

    def identity(self) -> dict[str, Any]:
        """The options that change what is written (batching and backend do not, beyond float noise)."""
        return {"max_new_tokens": self.max_new_tokens, "max_length": self.max_length, "do_sample": self.do_sample,
                "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                "force_score_prefix": self.force_score_prefix, "score_key": self.score_key, "scale": list(self.scale)}


def check_settings(*, max_new_tokens: int = 1, concurrency: int = 1, max_retries: int = 0, timeout_s: float = 1.0,
                   wait_budget_s: float = 0.0, gpu_memory_utilization: float = 0.85) -> None:
    """ValueError naming the first setting out of range (the command line and a judges file are checked with it
    before anything starts)."""
    for name, value, low in (("max_new_tokens", max_new_tokens, 1), ("concurrency", concurrency, 1),
                             ("max_retries", max_retries, 0)):
        if int(value) < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")
    if not float(timeout_s) > 0 or not float(wait_budget_s) >= 0:
        raise ValueError(f"timeout_s must be > 0 and wait_budget_s >= 0 (got {timeout_s}, {wait_budget_s})")
    if not 0 < float(gpu_memory_utilization) <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
