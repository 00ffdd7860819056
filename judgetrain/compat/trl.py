"""Reaches into TRL's private state (see `judgetrain.compat`; checked: trl 1.16.0)."""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

_MARK = "_judgetrain_pair_forward"


def forward_is_wrapped(model: Any) -> bool:
    """Whether `wrap_fused_forward` put a forward in front of this model's."""
    return bool(getattr(model, _MARK, False))


def wrap_fused_forward(model: Any, inner: Callable[..., Any], forward: Callable[..., Any]) -> None:
    """Bind ``forward(self, *args, **kwargs)`` as ``model.forward`` in front of ``inner``, the model's forward as
    TRL's ``add_fused_lm_head`` left it: an instance attribute (``types.MethodType``) taking ``fused_lm_head``,
    ``labels`` and ``shift_labels``. ``forward`` takes ``inner``'s name and docstring, and ``__wrapped__`` holds
    ``inner``: `unwrap_fused_forward` puts it back from there.

    checked: trl 1.16.0. A TRL that stops binding its fused head on the instance, or renames ``fused_lm_head``,
    makes the wrapped forward pass every call through unpacked: the start-up probe then turns prefix sharing off
    with a warning (``the probe pair did not run packed``)."""
    model.forward = types.MethodType(functools.wraps(inner)(forward), model)
    setattr(model, _MARK, True)


def unwrap_fused_forward(model: Any) -> None:
    """Put back the forward `wrap_fused_forward` wrapped (TRL's fused forward, bound to the model)."""
    if forward_is_wrapped(model):
        model.forward = model.forward.__func__.__wrapped__
        setattr(model, _MARK, False)


def uses_vision_data(trainer: Any) -> bool:
    """Whether TRL's DPOTrainer found images in its dataset (its private ``_is_vision_dataset``).

    checked: trl 1.16.0. A release that renames it reads as False: a vision run would try prefix sharing, and the
    start-up probe (text-only pairs) cannot catch that."""
    return bool(getattr(trainer, "_is_vision_dataset", False))


def chunked_logprobs(hidden: Any, weight: Any, targets: Any) -> Any:
    """Per-token log-probabilities of ``hidden @ weight.T`` at ``targets`` (hidden [N, H], targets [N]) through TRL's
    chunked LM-head kernel (``trl.kernels.chunked_logprob.ChunkedLogProbFunction``): the [N, V] logits never exist,
    the backward recomputes each tile, and no entropy or other statistic is computed.

    checked: trl 1.16.0 (positional arguments: hidden, weight, bias, targets, temperature, chunk_size, softcap,
    logit_scale, outputs). A release that changes them fails here, in the bench only."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    return ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32768, None, 1.0, ())[0]
