"""Generation for the ``generate`` scoring mode: the judge writes its evaluation and the caller parses it.

A minimal engine: one prompt at a time through ``model.generate`` (greedy unless ``do_sample``), the prompt rendered
as training renders an assistant turn (`judgetrain.models.templates.assistant_prefix`), stopped on the tokenizer's end
of sequence or at ``max_new_tokens``. `generate_sharded` splits the prompts over processes like scoring does (each
prompt once) and gives every process all the results, in order.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

BACKENDS = ("transformers", "vllm")


@dataclass
class Generated:
    """One generation: the decoded ``text``, how many tokens were generated (``n_tokens``) from a prompt of
    ``prompt_tokens``, whether it ``stopped`` on the end of turn (False: it hit max_new_tokens), and whether the
    prompt was cut from the left to fit ``max_length`` (``truncated``)."""

    text: str
    n_tokens: int
    prompt_tokens: int
    stopped: bool
    truncated: bool = False


@dataclass
class GenerationStats:
    prompts: int = 0
    batches: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class Generator:
    """Generates judge evaluations of prompts (messages lists or plain strings) with ``model``."""

    def __init__(self, model, tokenizer, *, max_new_tokens=512, max_length=None, batch_tokens=8192, max_batch_size=32,
                 do_sample=False, temperature=1.0, top_p=1.0, seed=0, merge_lora=True, backend="transformers"):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend != "transformers":
            raise ValueError(f"generation backend {backend!r} is not available in this engine; use transformers")
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.max_length = int(max_new_tokens), max_length
        self.batch_tokens, self.max_batch_size = int(batch_tokens), int(max_batch_size)
        self.do_sample, self.temperature, self.top_p, self.seed = bool(do_sample), float(temperature), float(top_p), seed
        self.merge_lora, self.backend = merge_lora, backend
        self.stats = GenerationStats()

    def set_model(self, model) -> None:
        self.model = model

    def prompt_ids(self, prompt) -> list[int]:
        from judgetrain.data.chat import text_ids
        from judgetrain.models.templates import assistant_prefix

        tok = self.tokenizer
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not getattr(tok, "chat_template", None):
            return text_ids(tok, "\n".join(m["content"] for m in prompt) + "\n")
        ids = tok(text=assistant_prefix(tok, prompt), add_special_tokens=False)["input_ids"]
        return list(ids.tolist() if hasattr(ids, "tolist") else ids)

    def _pad_id(self) -> int:
        tok = self.tokenizer
        for cand in (tok.pad_token_id, tok.eos_token_id, 0):
            if cand is not None:
                return int(cand)
        return 0

    def _stop_ids(self) -> set[int]:
        tok = self.tokenizer
        stops = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        stops |= set(eos if isinstance(eos, list) else [eos]) - {None}
        return stops

    @torch.inference_mode()
    def generate(self, prompts, *, sync: bool = False) -> list[Generated]:
        """One `Generated` per prompt, in order. ``sync`` (weights sharded over processes) is accepted; this engine
        runs no collective, so every process must hold whole weights."""
        t0 = time.perf_counter()
        model = self.model
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        limit = self.max_length or getattr(getattr(model, "config", None), "max_position_embeddings", None) or 4096
        room = max(int(limit) - self.max_new_tokens, 1)
        stops = self._stop_ids()
        out = []
        try:
            for i, prompt in enumerate(prompts):
                ids = self.prompt_ids(prompt)
                truncated = len(ids) > room
                ids = ids[-room:]
                inp = torch.tensor([ids], device=device)
                kwargs: dict[str, Any] = dict(do_sample=self.do_sample)
                if self.do_sample:
                    torch.manual_seed(self.seed + i)
                    kwargs.update(temperature=self.temperature, top_p=self.top_p)
                res = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), max_new_tokens=self.max_new_tokens,
                                     pad_token_id=self._pad_id(), **kwargs)
                new = res[0, len(ids):].tolist()
                stopped = bool(new) and new[-1] in stops
                text = self.tokenizer.decode(new, skip_special_tokens=True)
                out.append(Generated(text, len(new), len(ids), stopped, truncated))
                self.stats.prompts += 1
                self.stats.batches += 1
                self.stats.prompt_tokens += len(ids)
                self.stats.generated_tokens += len(new)
        finally:
            if was_training:
                model.train()
        self.stats.seconds += time.perf_counter() - t0
        return out


def generate_sharded(generator: Generator, prompts, state=None) -> list[Generated]:
    """Each prompt generated once over the processes of ``state``; every process gets all results, in order."""
    prompts = list(prompts)
    if state is None or state.num_processes == 1:
        return generator.generate(prompts)
    from accelerate.utils import gather_object

    from judgetrain.eval.scoring import shard_indices

    mine = shard_indices(len(prompts), state.process_index, state.num_processes)
    local = generator.generate([prompts[i] for i in mine], sync=True)
    gathered = gather_object(list(zip(mine, local)))
    out: list[Generated | None] = [None] * len(prompts)
    for i, g in gathered:
        out[i] = g
    missing = [i for i, g in enumerate(out) if g is None]
    if missing:
        raise RuntimeError(f"sharded generation lost prompts {missing[:10]}")
    return out  # type: ignore[return-value]
