"""Reaches into transformers' private state (see `judgetrain.compat`; checked: transformers 5.24.0)."""

# Late imports: transformers (inside the functions that use them): each hook imports the library it reaches into when
# it is installed or called, so a moved private name fails there, named.

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any


class GradNormHook:
    """Trainer mixin: ``record_grad_norm(norm)`` is called with each optimizer step's global gradient norm, the one
    Trainer computes for clipping (accelerate's, reduced over FSDP shards; DeepSpeed's global norm under ZeRO), which
    Trainer gives to no callback. Overrides the private ``Trainer._get_grad_norm(model, grad_norm=None)``.

    checked: transformers 5.24.0. A release that renames or stops calling it leaves ``record_grad_norm`` uncalled:
    the non-finite guard then checks every gradient itself before the step (slower; under FSDP/ZeRO it sees this
    rank's shards only)."""

    def _get_grad_norm(self, *args, **kwargs):
        norm = super()._get_grad_norm(*args, **kwargs)
        self.record_grad_norm(norm)
        return norm

    def record_grad_norm(self, norm: Any) -> None:
        """Called with the step's global gradient norm (a float or tensor, possibly a DTensor under FSDP2)."""


class UnusedParameterSearch:
    """Trainer mixin: DDP's ``find_unused_parameters`` is the trainer's ``unused_parameters_possible()`` where the
    arguments leave ``ddp_find_unused_parameters`` unset, in place of transformers' rule (on for every model that is
    not a ``PreTrainedModel``, a PEFT model included). Overrides the private ``Trainer._build_accelerator_args(
    **kwargs)``, which reads ``args.ddp_find_unused_parameters`` into the DDP kwargs.

    checked: transformers 5.24.0. A release that reads it elsewhere leaves transformers' rule: DDP searches a LoRA
    model's graph every step again, and torch warns each run that it found nothing."""

    def _build_accelerator_args(self, **kwargs):
        if self.args.ddp_find_unused_parameters is not None:  # a recipe's value, or TRL's for a vision model, stands
            return super()._build_accelerator_args(**kwargs)
        self.args.ddp_find_unused_parameters = self.unused_parameters_possible()
        try:
            return super()._build_accelerator_args(**kwargs)
        finally:  # the arguments stay as given (saved with the run, compared by the bench)
            self.args.ddp_find_unused_parameters = None

    def unused_parameters_possible(self) -> bool:
        """Whether a forward pass can leave a trainable parameter without a gradient."""
        return True


def log_without_overrides(trainer: Any, logs: dict[str, float]) -> None:
    """Log ``logs`` through ``transformers.Trainer.log`` itself, skipping subclass overrides: TRL's
    ``DPOTrainer.log`` merges (and clears) its pending train-mode reward metrics into whatever it logs, which would
    move them into an eval event. A trainer that is no transformers Trainer logs through its own ``log``.

    checked: transformers 5.24.0, trl 1.16.0. A Trainer.log with other parameters fails here with a TypeError; an
    override that does more than merge metrics (TRL's) is skipped as well."""
    from transformers import Trainer

    if isinstance(trainer, Trainer):
        Trainer.log(trainer, logs)
    else:
        trainer.log(logs)


def save_checkpoint_now(trainer: Any) -> None:
    """Save a checkpoint of the trainer's present state and run the ``on_save`` callbacks, as
    ``Trainer._maybe_log_save_evaluate`` does after an evaluation (``_save_checkpoint`` then ``on_save``): the stop
    checkpoint of a SIGTERM that came during an eval, saved at once instead of after another step.

    checked: transformers 5.24.0 (``_save_checkpoint(model, trial)``; the model argument is unused there, the
    trainer saves ``self.model``). A changed signature fails here with a TypeError."""
    trainer._save_checkpoint(trainer.model, None)
    trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)


def report_to_keys(logs: dict[str, Any]) -> dict[str, Any]:
    """The key names transformers' W&B and TensorBoard callbacks give a log record (``loss`` -> ``train/loss``,
    ``eval_x`` -> ``eval/x``): ``transformers.integrations.integration_utils.rewrite_logs``, not exported.

    checked: transformers 5.24.0. A release that moves it fails here with an ImportError at the first logged step."""
    from transformers.integrations.integration_utils import rewrite_logs

    return rewrite_logs(logs)


@contextlib.contextmanager
def without_zero3_init() -> Iterator[None]:
    """Build models whole in this process even inside a DeepSpeed ZeRO-3 launch, where transformers creates them
    under ``deepspeed.zero.Init`` (partitioned over all ranks, a collective): unsets transformers' DeepSpeed config
    for the block and puts the private module global ``integrations.deepspeed._hf_deepspeed_config_weak_ref`` back.

    checked: transformers 5.24.0. A release that keeps the config elsewhere fails here with an AttributeError (the
    block never runs half-set-up)."""
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = ref


def fast_backend(tokenizer):
    """The Rust tokenizer whose ``encode_batch_fast(texts, add_special_tokens=False)`` gives the ids of
    ``tokenizer(texts, add_special_tokens=False)``, or None. transformers' own call sets the backend to no
    truncation and no padding, sets ``encode_special_tokens`` to the tokenizer's ``split_special_tokens``, calls
    ``encode_batch`` and copies out each encoding's ids (and offsets, which the ids do not need); so the backend
    qualifies when it is in that state already and the tokenizer class does not change that call.

    checked: transformers 5.24.0 (``TokenizersBackend._encode_plus``). A release that changes that call fails
    ``tests/test_tokenise_once.py`` (the ids against TRL's on every row) rather than a user's run: the start-up
    check compares the ids with TRL's own tokenisation on probes and falls back to it."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers: the tokenizer's own call
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (backend is None or not hasattr(backend, "encode_batch_fast")
            or type(tokenizer)._encode_plus is not TokenizersBackend._encode_plus
            or backend.truncation is not None or backend.padding is not None
            or backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False))):
        return None
    return backend


def chat_control_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The added tokens that ``apply_chat_template(..., sanitize_control_tokens=True)`` would encode as text in user
    input for this tokenizer's chat template (its special tokens and the added tokens the template writes):
    the private ``tokenizer._get_control_tokens(chat_template)``. Raises when the tokenizer has no template.

    checked: transformers 5.24.0. A release that renames it raises AttributeError here; `data.chat.control_strings`
    then counts every added token as a control string (stricter, never laxer)."""
    return tuple(tokenizer._get_control_tokens(tokenizer.get_chat_template()))


def attn_implementation(config: Any) -> str | None:
    """The attention implementation a model config selects (``config._attn_implementation``, a private property
    with no public reader), None when it has none.

    checked: transformers 5.24.0. A release that renames it gives None: prefix sharing (training and eval) turns
    itself off with a warning naming ``None`` as the attention implementation; results stay right, only slower."""
    return getattr(config, "_attn_implementation", None)


def non_dynamic_cache_layers(config: Any) -> list[str]:
    """The class names, sorted, of the layers of ``DynamicCache(config=config)`` other than the plain full-attention
    ``DynamicLayer`` (sliding-window, chunked, linear-attention or shared layers), read from ``cache.layers``.

    checked: transformers 5.24.0. A release without ``layers`` raises here; eval.sharing then scores unshared with a
    warning naming the error."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return sorted({type(layer).__name__ for layer in DynamicCache(config=config).layers if type(layer) is not DynamicLayer})


def base_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (the module ``generate`` runs and whose class and forward say what
    it supports); any other model (or a config) as it is."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_keyword(model: Any) -> str:
    """The keyword a model's forward (and ``generate``) takes its key/value cache by: ``cache`` (transformers 5.x,
    which keeps ``past_key_values`` as a deprecated alias) or ``past_key_values`` (older releases, remote code)."""

    return "cache" if "cache" in inspect.signature(base_model(model).forward).parameters else "past_key_values"


def output_cache(outputs: Any) -> Any:
    """The key/value cache a forward returned (``outputs.cache`` in transformers 5.x, ``past_key_values`` before)."""
    cache = getattr(outputs, "cache", None)
    return outputs.past_key_values if cache is None else cache


def select_cache_entries(cache: Any, index: Any) -> Any:
    """A new ``DynamicCache`` holding batch entries ``index`` (repeats allowed) of every layer of ``cache``, which is
    left as it is: each layer's ``keys`` / ``values`` tensors, passed as ``ddp_cache_data``.

    checked: transformers 5.24.0 (only full-attention ``DynamicLayer`` layers: `non_dynamic_cache_layers` is empty).
    A release that renames the layer fields or the argument fails here with an AttributeError or TypeError at the
    first shared eval forward."""
    from transformers.cache_utils import DynamicCache

    return DynamicCache(ddp_cache_data=[(layer.keys[index], layer.values[index]) for layer in cache.layers])


def supports_static_cache(model: Any) -> bool:
    """Whether the model's forward works with transformers' preallocated ``StaticCache``: the model classes that
    declare ``_can_compile_fullgraph`` (Llama, Qwen2/3, Mistral, Gemma, ...), whose attention reads the cache through
    `Cache.update` and masks its unused tail. A PEFT model answers for its base model."""

    return bool(getattr(type(base_model(model)), "_can_compile_fullgraph", False))


def static_cache(model: Any, max_len: int, rows: int, prefix: Any = None) -> Any:
    """A ``StaticCache`` of ``max_len`` positions for the model's layers (sliding-window layers as the config says),
    its first positions holding ``prefix`` (a one-row cache a forward returned) repeated to ``rows`` rows.

    checked: transformers 5.24.0 (``StaticCache(config=, max_cache_len=)``; a layer allocates its tensors on its first
    ``update``, for that call's batch, dtype and device; ``layers[i].keys`` / ``values`` of a ``DynamicCache``)."""
    from transformers.cache_utils import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=max_len)
    if prefix is not None:
        for layer, src in zip(cache.layers, prefix.layers):
            layer.update(src.keys.expand(rows, -1, -1, -1), src.values.expand(rows, -1, -1, -1))
    return cache


def active_wandb(callback: Any) -> Any:
    """The ``wandb`` module a transformers ``WandbCallback`` logs through (its private ``_wandb``) when it has a run
    on this process, else None (also for any other callback).

    checked: transformers 5.24.0. A release that renames it gives None: no heatmap images are logged and the run's
    history is flushed by W&B's own exit hook instead of `train.finish`."""
    wandb = getattr(callback, "_wandb", None)
    return wandb if wandb is not None and getattr(wandb, "run", None) is not None else None
