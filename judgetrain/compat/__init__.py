"""Every reach into a library's private state, in one dated place.

judgetrain leans on a few things its libraries do not promise to keep: private attributes and methods, instance
attributes their classes set for themselves, internals of public classes (a cache's layers), methods shadowed on
instances, and the behaviour of a base class that a subclass overrides. Each such reach is a small named function or
class in ``judgetrain.compat.<library>`` (``accelerate``, ``datasets``, ``peft``, ``torch``, ``transformers``,
``trl``), whose docstring says what it touches, the version it was checked against and what happens when the
library changes.
`HOOKS` lists every hooked attribute; ``tests/test_compat.py`` checks each against the installed library (it exists,
its parameter names or kind are the expected ones), fails when an installed library is newer than `CHECKED` (re-check
the listed hooks, then raise the version), and scans the package so that no module outside ``judgetrain.compat``
touches those names.

A few hooks are public methods that judgetrain's trainer overrides (``private=False``): they are listed because the
override relies on what the base method does, not only on its name.
"""

from __future__ import annotations

from dataclasses import dataclass

# The versions every hook below was read and tested against.
CHECKED = {"trl": "1.16.0", "transformers": "5.24.0", "peft": "0.21.2", "accelerate": "1.15.0", "torch": "2.13.0",
           "datasets": "5.2.0"}

KINDS = ("callable", "class", "mapping", "property", "module attribute", "instance attribute", "fields")


@dataclass(frozen=True)
class Hook:
    """One hooked attribute.

    ``kind``: ``callable`` (its parameter names are ``expects``), ``class``, ``mapping``, ``property``, ``module
    attribute`` (a module-level name, its value may be None), ``instance attribute`` (the class assigns
    ``self.<name>`` in its own code), ``fields`` (a dataclass holding the fields ``expects``)."""

    library: str  # the distribution, and its top-level module
    path: str  # dotted path from the top-level module
    kind: str
    feature: str  # the judgetrain feature that depends on it
    patch: str  # where judgetrain holds the reach
    expects: tuple[str, ...] = ()
    private: bool = True
    checked: str = ""  # the library version checked against (CHECKED[library] when empty)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.path}: kind {self.kind!r} is not one of {KINDS}")
        if not self.checked:
            object.__setattr__(self, "checked", CHECKED[self.library])


_CPU_PARALLEL = "FSDP2 / DeepSpeed on a CPU process group (trainer.parallelism.allow_fsdp_on_cpu / allow_deepspeed_on_cpu)"
_PREFIX_SHARING = "prefix sharing in DPO training (trainer.prefix_sharing, JudgeDPOTrainer(prefix_sharing=True))"
_NONFINITE = "the non-finite guard (NonFiniteGuard: policy stop/skip, exit code 3)"
_EVAL_SHARING = "prefix-shared eval scoring (eval.sharing)"
_PRECOMPUTE = "precompute_ref_log_probs on several machines: the cache in every machine's rows folder"
_WANDB = "W&B: the final history flush (train.finish) and the RM-Bench heatmap images (eval.plots)"

HOOKS: tuple[Hook, ...] = (
    # accelerate
    Hook("accelerate", "accelerate.PartialState._shared_state", "mapping", _CPU_PARALLEL,
         "judgetrain.compat.accelerate.present_distributed_type"),
    Hook("accelerate", "accelerate.PartialState.distributed_type", "instance attribute", _CPU_PARALLEL,
         "judgetrain.compat.accelerate.present_distributed_type"),
    # transformers
    Hook("transformers", "transformers.Trainer._get_grad_norm", "callable",
         _NONFINITE + ": the step's global gradient norm", "judgetrain.compat.transformers.GradNormHook",
         ("self", "model", "grad_norm")),
    Hook("transformers", "transformers.Trainer._build_accelerator_args", "callable",
         "DDP searches for unused parameters only where a model can leave some (trainer.parallelism)",
         "judgetrain.compat.transformers.UnusedParameterSearch", ("self", "kwargs")),
    Hook("transformers", "transformers.Trainer.training_step", "callable", _NONFINITE + ": each micro-batch's loss",
         "judgetrain.trainer.dpo.JudgeDPOTrainer.training_step", ("self", "model", "inputs", "num_items_in_batch"),
         private=False),
    Hook("transformers", "transformers.Trainer._save_checkpoint", "callable",
         "the stop checkpoint right after an eval a SIGTERM abandoned (eval.callback)",
         "judgetrain.compat.transformers.save_checkpoint_now", ("self", "model", "trial")),
    Hook("transformers", "transformers.Trainer.log", "callable",
         "per-epoch eval metrics logged apart from the train-mode DPO metrics (eval.callback)",
         "judgetrain.compat.transformers.log_without_overrides", ("self", "logs", "start_time")),
    Hook("transformers", "transformers.integrations.integration_utils.rewrite_logs", "callable",
         "metrics.jsonl key names (train/..., eval/...) equal to W&B's and TensorBoard's (trainer.callbacks)",
         "judgetrain.compat.transformers.report_to_keys", ("d",)),
    Hook("transformers", "transformers.integrations.deepspeed._hf_deepspeed_config_weak_ref", "module attribute",
         "the tiny judge built whole inside a DeepSpeed ZeRO-3 launch (models.tiny)",
         "judgetrain.compat.transformers.without_zero3_init"),
    Hook("transformers", "transformers.integrations.deepspeed.unset_hf_deepspeed_config", "callable",
         "the tiny judge built whole inside a DeepSpeed ZeRO-3 launch (models.tiny)",
         "judgetrain.compat.transformers.without_zero3_init", (), private=False),
    Hook("transformers", "transformers.PreTrainedTokenizerBase._get_control_tokens", "callable",
         "hostile-text neutralisation: the control strings of a chat template (data.chat.control_strings)",
         "judgetrain.compat.transformers.chat_control_tokens", ("self", "chat_template")),
    Hook("transformers", "transformers.PretrainedConfig._attn_implementation", "property",
         _PREFIX_SHARING + " and " + _EVAL_SHARING + ": which attention takes a custom mask",
         "judgetrain.compat.transformers.attn_implementation"),
    Hook("transformers", "transformers.cache_utils.DynamicCache.__init__", "callable", _EVAL_SHARING,
         "judgetrain.compat.transformers.select_cache_entries",
         ("self", "ddp_cache_data", "config", "offloading", "offload_only_non_sliding")),
    Hook("transformers", "transformers.cache_utils.Cache.layers", "instance attribute", _EVAL_SHARING,
         "judgetrain.compat.transformers.select_cache_entries / non_dynamic_cache_layers"),
    Hook("transformers", "transformers.cache_utils.DynamicLayer", "class", _EVAL_SHARING,
         "judgetrain.compat.transformers.non_dynamic_cache_layers"),
    Hook("transformers", "transformers.cache_utils.DynamicLayer.keys", "instance attribute", _EVAL_SHARING,
         "judgetrain.compat.transformers.select_cache_entries"),
    Hook("transformers", "transformers.cache_utils.DynamicLayer.values", "instance attribute", _EVAL_SHARING,
         "judgetrain.compat.transformers.select_cache_entries"),
    Hook("transformers", "transformers.tokenization_utils_tokenizers.TokenizersBackend._encode_plus", "callable",
         "one tokenisation per start: the ids from the Rust backend's encode_batch_fast, the call this method makes",
         "judgetrain.compat.transformers.fast_backend",
         ("self", "text", "text_pair", "add_special_tokens", "padding_strategy", "truncation_strategy", "max_length",
          "stride", "is_split_into_words", "pad_to_multiple_of", "padding_side", "return_tensors",
          "return_token_type_ids", "return_attention_mask", "return_overflowing_tokens", "return_special_tokens_mask",
          "return_offsets_mapping", "return_length", "verbose", "split_special_tokens", "kwargs")),
    Hook("transformers", "transformers.integrations.WandbCallback._wandb", "instance attribute", _WANDB,
         "judgetrain.compat.transformers.active_wandb"),
    # trl
    Hook("trl", "trl.trainer.utils.add_fused_lm_head", "callable",
         _PREFIX_SHARING + ": the packed forward wraps TRL's fused-head forward bound on the model",
         "judgetrain.compat.trl.wrap_fused_forward / unwrap_fused_forward",
         ("model", "temperature", "cast_lm_head_to_fp32", "outputs")),
    Hook("trl", "trl.trainer.utils.FusedCausalLMOutput", "fields", _PREFIX_SHARING + ": the per-token fields unpacked",
         "judgetrain.trainer.prefix_sharing.unpack_output",
         ("loss", "log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask", "aux_loss")),
    Hook("trl", "trl.DPOTrainer._compute_loss", "callable",
         "the pair loss (trainer.pair_loss: ties, the mean_logprob form): TRL's loss with its sigmoid term replaced",
         "judgetrain.compat.trl.PairLossHook", ("self", "model", "inputs", "return_outputs")),
    Hook("trl", "trl.DPOTrainer._is_vision_dataset", "instance attribute", _PREFIX_SHARING + ": off for vision data",
         "judgetrain.compat.trl.uses_vision_data"),
    Hook("trl", "trl.DPOTrainer.compute_loss", "callable", _PREFIX_SHARING + ": the policy (and reference) pair calls",
         "judgetrain.trainer.dpo.JudgeDPOTrainer.compute_loss",
         ("self", "model", "inputs", "return_outputs", "num_items_in_batch"), private=False),
    Hook("trl", "trl.DPOTrainer.compute_ref_log_probs", "callable",
         _PREFIX_SHARING + ": the reference pair calls of precompute_ref_log_probs",
         "judgetrain.trainer.dpo.JudgeDPOTrainer.compute_ref_log_probs", ("self", "model", "inputs"), private=False),
    Hook("trl", "trl.DPOTrainer.log", "callable",
         "per-epoch eval metrics logged apart from the train-mode DPO metrics (eval.callback): this override is skipped",
         "judgetrain.compat.transformers.log_without_overrides", ("self", "logs", "start_time")),
    Hook("trl", "trl.DPOTrainer._precompute_ref_logps", "callable", _PRECOMPUTE + " (overridden)",
         "judgetrain.compat.trl.PerMachineRefLogps", ("self", "dataset", "name", "batch_size")),
    Hook("trl", "trl.DPOTrainer._precompute_model_hash", "instance attribute", _PRECOMPUTE + ": the cache's fingerprint",
         "judgetrain.compat.trl.PerMachineRefLogps"),
    Hook("trl", "trl.DPOTrainer._prepare_dataset", "callable",
         "one tokenisation per start: rows that carry the length audit's ids skip TRL's tokenisation (overridden)",
         "judgetrain.compat.trl.AuditedTokenIds", ("self", "dataset", "processing_class", "args", "dataset_name")),
    Hook("trl", "trl.models.unwrap_model_for_generation", "callable",
         "generation on the live model under DeepSpeed ZeRO-3: the parameters gathered once per generate call",
         "judgetrain.eval.generate.Generator._gathered",
         ("model", "accelerator", "gather_deepspeed3_params", "generation_kwargs", "gradient_checkpointing_kwargs"),
         private=False),
    Hook("trl", "trl.data_utils.common_prefix_length", "callable",
         "one tokenisation per start: where the audit's completion ids start, as TRL's tokenisation cuts them",
         "judgetrain.compat.trl.dpo_token_ids / judgetrain.data.tokenise.PairTokeniser", ("ids", "other_ids"),
         private=False),
    # datasets
    Hook("datasets", "datasets.Dataset._fingerprint", "instance attribute",
         _PRECOMPUTE + ": the cache's fingerprint; a JSON-lines file's normalised rows' cache (data.io)",
         "judgetrain.compat.datasets.dataset_fingerprint"),
    Hook("datasets", "datasets.Dataset._get_cache_file_path", "callable",
         _PRECOMPUTE + ": the cache file beside the tokenised rows", "judgetrain.compat.datasets.cache_file_beside",
         ("self", "fingerprint")),
    # peft
    Hook("peft", "peft.tuners.lora.layer.Linear", "class", "merged-LoRA eval scoring (eval.merged)",
         "judgetrain.compat.peft.lora_linear_type"),
    Hook("peft", "peft.tuners.lora.layer.Linear.forward", "callable",
         "merged-LoRA eval scoring (eval.merged): shadowed on instances", "judgetrain.compat.peft.shadow_forward",
         ("self", "x", "args", "kwargs")),
    Hook("peft", "peft.tuners.lora.layer.Linear.get_delta_weight", "callable", "merged-LoRA eval scoring (eval.merged)",
         "judgetrain.eval.merged", ("self", "adapter"), private=False),
    Hook("peft", "peft.tuners.lora.layer.LoraLayer.lora_variant", "instance attribute",
         "merged-LoRA eval scoring (eval.merged): DoRA and other variants keep PEFT's forward", "judgetrain.eval.merged",
         private=False),
    # torch
    Hook("torch", "torch.utils._python_dispatch.TorchDispatchMode", "class",
         "the measured peak memory of `judgetrain memory check` (bench.memory)",
         "judgetrain.compat.torch.tensor_dispatch_mode"),
    Hook("torch", "torch.utils._python_dispatch.TorchDispatchMode.__torch_dispatch__", "callable",
         "the measured peak memory of `judgetrain memory check` (bench.memory)",
         "judgetrain.compat.torch.tensor_dispatch_mode", ("self", "func", "types", "args", "kwargs")),
    Hook("torch", "torch.utils._pytree.tree_map_only", "callable",
         "the measured peak memory of `judgetrain memory check` (bench.memory)", "judgetrain.compat.torch.each_tensor",
         ("type_or_types_or_pred", "func", "tree", "is_leaf")),
    Hook("trl", "trl.kernels.chunked_logprob.ChunkedLogProbFunction.forward", "callable",
         "judgetrain bench --device cuda: the LoRA step's log-probs without the full logits (bench.gpu)",
         "judgetrain.compat.trl.chunked_logprobs",
         ("ctx", "hidden", "weight", "bias", "targets", "temperature", "chunk_size", "final_logit_softcapping",
          "logit_scale", "outputs")),
    Hook("torch", "torch.optim.lr_scheduler.LRScheduler._last_lr", "instance attribute",
         "--resume_force: the recipe's learning rate logged from the resumed step (trainer.callbacks.ForcedResume)",
         "judgetrain.compat.torch.set_last_lr"),
)
