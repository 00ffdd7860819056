"""Attention implementations whose kernels honour a custom 4-D mask and explicit position ids: the ones on which
judgetrain packs a shared prompt with its responses, in training (judgetrain.trainer.prefix_sharing) and in scoring
(judgetrain.eval.sharing). Flash attention takes neither, so both fall back to unpacked sequences there."""

import inspect

from judgetrain.compat.transformers import attn_implementation, base_model, non_dynamic_cache_layers

SUPPORTED_ATTENTION = ("sdpa", "eager")


def prefix_sharing_problem(model_or_config, *, cache: bool = False) -> str | None:
    """Why prefix sharing cannot run on a model (or a model of this config) (None: it can): the one answer for
    training's packed rows (judgetrain.trainer.prefix_sharing) and scoring's and generation's shared key/value cache
    (judgetrain.eval.sharing, ``cache=True``: the model's forward must also take a cache and position ids, since the
    shared prompt runs once into a cache that each sequence then continues). A shared prefix is right only where every token sees the same tokens at the same
    positions as it would alone: an attention implementation that honours a custom 4-D mask and explicit position ids
    (`SUPPORTED_ATTENTION`), every layer full attention (a sliding-window, chunked, recurrent or shared layer is not
    expressed in the shared mask, nor kept whole in a cache), no ALiBi positions (computed from a 2-D mask), no
    multimodal rotary positions."""
    config = model_or_config
    if hasattr(model_or_config, "forward"):  # a model: the config of its base model (under a PEFT wrapper)
        inner = base_model(model_or_config)
        if cache:
            problem = _cache_forward_problem(inner)
            if problem:
                return problem
        config = getattr(inner, "config", None)
    attn = attn_implementation(config)
    if attn not in SUPPORTED_ATTENTION:
        return (f"attn_implementation={attn!r} takes no custom 4D attention mask (prefix sharing needs one of "
                f"{', '.join(SUPPORTED_ATTENTION)})")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kind = getattr(text, "model_type", type(text).__name__)
    try:
        odd = non_dynamic_cache_layers(text)
    except Exception as e:  # noqa: BLE001 - a cache that cannot be built is not one known to be plain
        return f"no DynamicCache for {kind}: {e}"
    other = sorted(set(getattr(text, "layer_types", None) or []) - {"full_attention"})
    if odd or other:
        return (f"{kind} has {', '.join(other or ['non-full-attention'])} layers (cache layers "
                f"{', '.join(odd) or 'DynamicLayer'}): sliding-window/chunked attention is not expressed in the "
                "shared mask")
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return f"{kind} uses sliding-window attention (sliding_window={text.sliding_window})"
    if getattr(text, "alibi", False) or "alibi" in str(getattr(text, "position_embedding_type", "")):
        return f"{kind} uses ALiBi positions, computed from a 2D mask"
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if isinstance(rope, dict) and "mrope_section" in rope:
        return f"{kind} uses multimodal rotary positions"
    return None


def _cache_forward_problem(model) -> str | None:
    """Why this model's forward cannot continue a shared prompt's key/value cache (None: it can)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return f"{type(model).__name__}.forward has no inspectable signature"
    if "cache" not in params and "past_key_values" not in params:
        return f"{type(model).__name__}.forward takes no cache / past_key_values"
    if "position_ids" not in params:
        return f"{type(model).__name__}.forward takes no position_ids (masked padding would shift positions)"
    return None
