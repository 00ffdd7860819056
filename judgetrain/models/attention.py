"""Attention implementations whose kernels honour a custom 4-D mask and explicit position ids: the ones on which
judgetrain packs a shared prompt with its responses, in training (judgetrain.trainer.prefix_sharing) and in scoring
(judgetrain.eval.sharing). Flash attention takes neither, so both fall back to unpacked sequences there."""

SUPPORTED_ATTENTION = ("sdpa", "eager")
