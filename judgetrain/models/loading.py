"""Which weights and tokenizer a run loads: the tokenizer every entry point uses, and the keyword arguments TRL
passes to ``from_pretrained`` for the policy."""

# Late imports: transformers, judgetrain.models, judgetrain.config, trl, accelerate, judgetrain.utils, peft, safetensors (inside the
# functions that use them): the model cache and aliases are read without loading a model (`judgetrain cache`, the dry
# run): torch and transformers come in with a load.

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def load_tokenizer(path: str | os.PathLike, *, trust_remote_code: bool = False, revision: str | None = None,
                   require_chat_template: bool = False):
    """``AutoTokenizer.from_pretrained(path)`` with a pad token: batched scoring and DPO collation pad, and many
    causal LMs ship without one, so the end-of-sequence token stands in (as TRL's own scripts do). A chat template
    that reads today's date gets a fixed one (`judgetrain.models.templates.pin_template_date`). Training needs a
    chat template (judgetrain's data is conversational): ``require_chat_template`` stops there with a
    `RecipeError`; evaluation falls back to plain text instead."""
    from transformers import AutoTokenizer

    from judgetrain.models.templates import pin_template_date

    kwargs = {"revision": revision} if revision else {}
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **kwargs)
    if require_chat_template and tokenizer.chat_template is None:
        from judgetrain.config.recipe import RecipeError

        raise RecipeError(
            f"the tokenizer of {path} has no chat template; judgetrain's data is conversational. Use an "
            "instruct model or set one with `chat_template_path`."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    pin_template_date(tokenizer)  # a template that reads the clock would change tokens (and scores) every day
    return tokenizer


def load_recipe_tokenizer(model_path: str, training_args, model_args=None):
    """The tokenizer of a training run: the recipe's trust setting and model revision, a chat template required."""
    return load_tokenizer(model_path, trust_remote_code=training_args.trust_remote_code,
                          revision=getattr(model_args, "model_revision", None), require_chat_template=True)


def model_init_kwargs(model_args, training_args) -> dict:
    """What TRL passes to ``from_pretrained`` for the policy: revision, trust, attention, dtype, the k-bit
    quantization config (each process's copy on its own device) and the recipe's own ``model_init_kwargs``."""
    from trl import get_quantization_config

    kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        from accelerate import PartialState

        # k-bit weights cannot move after loading: put each process's copy on its own device
        kwargs["device_map"] = {"": PartialState().local_process_index}
        kwargs["quantization_config"] = quantization_config
    if training_args.model_init_kwargs:
        kwargs.update(training_args.model_init_kwargs)
    return {k: v for k, v in kwargs.items() if v is not None}


def pinned_snapshot(name_or_path: str, revision: str | None) -> str:
    """The folder of ``name_or_path``'s cached snapshot at ``revision`` when the hub is offline (``HF_HUB_OFFLINE``),
    else ``name_or_path`` unchanged (a local folder, no revision, online, or a revision not in the cache: the load
    then reports it).

    TRL's ``create_model_from_path`` reads the model's config without the revision (to pick the architecture), so
    offline, with only the pinned commit in the cache, the policy (and a full fine-tune's reference) failed to load:
    "couldn't find them in the cached files". Loading from the snapshot folder loads the weights, config, tokenizer
    and chat template of that one commit. checked: trl 1.16.0."""
    from judgetrain.utils.hub import is_hub_id

    if not revision or os.path.exists(name_or_path) or not is_hub_id(name_or_path):
        return name_or_path
    from judgetrain.utils.hub import cached_snapshot, hub_offline

    if not hub_offline():
        return name_or_path
    try:
        folder = cached_snapshot(name_or_path, revision)
    except Exception:  # noqa: BLE001 - not a repository id: the model load says so with its own message
        folder = None
    if folder is None:  # not cached at that revision: the model load says so with its own message
        return name_or_path
    folder = str(folder)
    logger.info("Model %s at %s: the hub is offline, loading its cached snapshot %s", name_or_path, revision, folder)
    return folder


def init_adapter_config(path: str | os.PathLike):
    """The LoRA config of the adapter a run starts from (``init_adapter``), made trainable."""
    from peft import PeftConfig

    config = PeftConfig.from_pretrained(str(path))
    config.inference_mode = False
    return config


def load_init_adapter(model, path: str | os.PathLike) -> int:
    """Copy the safetensors weights of the adapter at ``path`` into ``model``'s ``default`` adapter (a PeftModel
    built with `init_adapter_config`): the reference, the adapter disabled, stays the base model. Returns the number
    of tensors copied; ValueError when the adapter holds a tensor the model has no place for."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(Path(path) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, weights, adapter_name="default")
    if result.unexpected_keys:
        raise ValueError(f"init_adapter {path}: tensors the model has no place for: {result.unexpected_keys[:3]}")
    return len(weights)
