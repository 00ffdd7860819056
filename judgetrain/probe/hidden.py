"""The frozen model's hidden states of each text: per chosen layer, the mean over the text's tokens, read in forward
passes over batches of similar length (`judgetrain.eval.batching.budget_batches`, the engine's rule), left padded as
the engine pads, the language-model head run on one position only.

``hidden_states[0]`` is the embeddings' output and ``hidden_states[k]`` layer k's, so layer k of an n-layer model is
1..n (the default: a third, two thirds and the last, `default_layers`: 10, 20, 30 for SmolLM2-135M's 30 layers).
"""

from __future__ import annotations

import inspect
import logging

import numpy as np
import torch

from judgetrain.compat.transformers import base_model
from judgetrain.eval.batching import MIN_FILL, budget_batches
from judgetrain.probe.pairs import ProbeInputError

logger = logging.getLogger(__name__)


def default_layers(n_layers: int) -> list[int]:
    """A third, two thirds and the last of ``n_layers`` (each at least 1, each once)."""
    return sorted({max(1, round(n_layers * k / 3)) for k in (1, 2, 3)})


def check_layers(layers: list[int], n_layers: int) -> list[int]:
    bad = [k for k in layers if not 1 <= k <= n_layers]
    if bad:
        raise ProbeInputError(f"--layers {' '.join(map(str, bad))}: the model has layers 1 to {n_layers}")
    return sorted(set(layers))


def _keeps_one_logit(model) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(base_model(model).forward).parameters
    except (TypeError, ValueError):
        return False


@torch.no_grad()
def response_means(model, sequences: list[tuple[list[int], int]], layers: list[int], *, pad_id: int,
                   batch_tokens: int = 8192, max_batch: int = 64) -> np.ndarray:
    """(texts, layers, hidden size) float32: each layer's hidden states averaged over each sequence's tokens from its
    start (the text's tokens) on."""
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i][0]))
    batches = budget_batches(order, lambda i: len(sequences[i][0]), batch_tokens, max_batch, min_fill=MIN_FILL)
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    out = np.zeros((len(sequences), len(layers), hidden or 0), dtype=np.float32)
    extra = {"logits_to_keep": 1} if _keeps_one_logit(model) else {}
    for batch in batches:
        longest = max(len(sequences[i][0]) for i in batch)
        ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        scored = torch.zeros((len(batch), longest), dtype=torch.float32)
        for row, i in enumerate(batch):
            seq, start = sequences[i]
            ids[row, longest - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, longest - len(seq):] = 1
            scored[row, longest - len(seq) + start:] = 1.0
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        states = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=position_ids.to(device),
                       output_hidden_states=True, use_cache=False, **extra).hidden_states
        weights = (scored / scored.sum(-1, keepdim=True).clamp_min(1.0)).to(device)
        for j, layer in enumerate(layers):
            means = torch.einsum("bt,bth->bh", weights, states[layer].float())
            out[batch, j, :] = means.cpu().numpy()
    logger.info("probe: hidden states of %d texts at layers %s in %d forward passes", len(sequences),
                ",".join(map(str, layers)), len(batches))
    return out
