"""Reaches into TRL's private state (see `judgetrain.compat`; checked: trl 1.16.0)."""

# Late imports: trl, accelerate, datasets, judgetrain.compat, pyarrow (inside the functions that use them): each hook
# imports the library it reaches into when it is installed or called, so a moved private name fails there, named.

from __future__ import annotations

import functools
import logging
import os
import time
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


class _LocalMainWrites:
    """The trainer's accelerator as TRL's ``_precompute_ref_logps`` sees it under `PerMachineRefLogps`: the same
    object in every respect but ``is_main_process``, which answers whether this process is its machine's local main
    process (the one that writes the machine's rows folder)."""

    def __init__(self, accelerator: Any) -> None:
        self._accelerator = accelerator

    def __getattr__(self, name: str) -> Any:
        return getattr(self._accelerator, name)

    @property
    def is_main_process(self) -> bool:
        return self._accelerator.is_local_main_process


class PerMachineRefLogps:
    """DPOTrainer's ``precompute_ref_log_probs`` with its cache on every machine (a mixin over ``trl.DPOTrainer``).

    TRL's ``_precompute_ref_logps`` gathers the reference log-probs of every rank onto every rank, writes them as
    ``cache-<fingerprint>.arrow`` beside the tokenised rows on the global main process only (``if
    self.accelerator.is_main_process``), and then every rank opens that path in its own dataset's folder; each rank
    skips the pass where it finds the file. judgetrain keeps one rows folder per machine (``train_rows/node-<K>``),
    so on several machines every other machine's ranks found no file after the whole pass (FileNotFoundError).
    TRL's method still does all the work here (fingerprint, batches, reference engine, ``compute_ref_log_probs``,
    which judgetrain's trainer runs prefix-shared, ``gather_for_metrics``, the write and the read); around it:

    - whether the pass runs is decided once for all ranks: TRL loads the file (no pass) only when it is in every
      machine's folder; otherwise the machines that hold it drop it first, so that every rank enters the pass's
      collectives (a per-rank check would send some ranks into them and others past them). The pass writes the
      same values again;
    - TRL's write runs on each machine's local main process into its own folder (TRL is given the accelerator
      with ``is_main_process`` read as the local main process, `_LocalMainWrites`), and the others wait, so
      machine-local disks and a shared output_dir both work, and a resume on either loads them again;
    - the main process logs whether they were loaded (not recomputed) or computed.

    checked: trl 1.16.0 (``_precompute_ref_logps(dataset, name, batch_size)`` reads ``self.accelerator`` for its
    pass and its one ``is_main_process`` test, and names the file ``dataset._get_cache_file_path`` of rank 0's
    broadcast hash of the dataset's fingerprint and ``_precompute_model_hash``) and datasets 5.2.0 (the cache file's
    name: `judgetrain.compat.datasets`). A TRL that renames the method leaves this one unused (TRL's own runs;
    several machines then fail as before); one that renames the hash fails here at the first precompute, by name
    (`tests/test_compat.py` checks all of them)."""

    def _precompute_ref_logps(self, dataset, name, batch_size):

        from accelerate.utils import broadcast_object_list, gather_object
        from datasets import IterableDataset
        from datasets.fingerprint import Hasher

        from judgetrain.compat.datasets import cache_file_beside, dataset_fingerprint

        if isinstance(dataset, IterableDataset):  # TRL's own refusal
            return super()._precompute_ref_logps(dataset, name, batch_size)
        log = logging.getLogger("judgetrain.trainer.dpo")
        accelerator = self.accelerator
        fingerprint = [Hasher.hash((dataset_fingerprint(dataset), self._precompute_model_hash))]  # TRL's file name
        broadcast_object_list(fingerprint, from_process=0)
        cache_file = cache_file_beside(dataset, fingerprint[0])
        # the local main process of each machine answers for its folder
        here = os.path.exists(cache_file) if accelerator.is_local_main_process else True
        if all(gather_object([here])):
            log.info("Reference log-probs of the %s rows: loaded from %s on every machine (%d rows, computed at an "
                     "earlier start: not recomputed)", name, os.path.basename(cache_file), len(dataset))
            return super()._precompute_ref_logps(dataset, name, batch_size)  # TRL finds the file on every rank
        if accelerator.is_local_main_process and os.path.exists(cache_file):
            os.remove(cache_file)  # another machine lacks it: every rank runs the pass, which writes it again
        accelerator.wait_for_everyone()
        started = time.perf_counter()
        self.accelerator = _LocalMainWrites(accelerator)
        try:
            rows = super()._precompute_ref_logps(dataset, name, batch_size)
        finally:
            self.accelerator = accelerator
        log.info("Reference log-probs of the %s rows: computed (%d rows, %.1f s) and written as %s into each "
                 "machine's rows folder", name, len(rows), time.perf_counter() - started, os.path.basename(cache_file))
        return rows


def chunked_logprobs(hidden: Any, weight: Any, targets: Any) -> Any:
    """Per-token log-probabilities of ``hidden @ weight.T`` at ``targets`` (hidden [N, H], targets [N]) through TRL's
    chunked LM-head kernel (``trl.kernels.chunked_logprob.ChunkedLogProbFunction``): the [N, V] logits never exist,
    the backward recomputes each tile, and no entropy or other statistic is computed.

    checked: trl 1.16.0 (positional arguments: hidden, weight, bias, targets, temperature, chunk_size, softcap,
    logit_scale, outputs). A release that changes them fails here, in the bench only."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    return ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32768, None, 1.0, ())[0]


TOKEN_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")  # DPOTrainer's tokenised columns (trl 1.16.0)


def dpo_token_ids(tokenizer: Any, prompts: list, chosens: list, rejecteds: list) -> dict[str, list]:
    """The token ids TRL's DPOTrainer computes for conversational rows (``_prepare_dataset``'s ``tokenize_fn``), a
    batch at a time: the prompt with the generation prompt, prompt + chosen and prompt + rejected through the chat
    template, then the completions cut where the tokenised prompt and prompt + completion diverge (TRL's
    ``common_prefix_length``). Returns ``prompt_ids``, ``chosen_ids``, ``rejected_ids``: TRL's column names.

    Batched through ``apply_chat_template(tokenize=True)`` (TRL calls it once per sequence, without ``tools`` or
    ``chat_template_kwargs`` for rows that have neither column): the same rendering and the same tokenizer call, a
    batch of texts at once. checked: trl 1.16.0; `tests/test_families.py` compares the two on four chat templates."""
    from trl.data_utils import common_prefix_length

    def ids(conversations, generation_prompt):
        return tokenizer.apply_chat_template(conversations, tokenize=True, return_dict=True,
                                             add_generation_prompt=generation_prompt)["input_ids"]

    prompt_ids = ids(list(prompts), True)
    with_chosen = ids([p + c for p, c in zip(prompts, chosens)], False)
    with_rejected = ids([p + r for p, r in zip(prompts, rejecteds)], False)
    cut = [(p[:n], c[n:], r[n:]) for p, c, r in zip(prompt_ids, with_chosen, with_rejected)
           for n in [min(common_prefix_length(p, c), common_prefix_length(p, r))]]
    return {name: [row[i] for row in cut] for i, name in enumerate(TOKEN_COLUMNS)}


class AuditedTokenIds:
    """DPOTrainer's ``_prepare_dataset`` that reuses the ids judgetrain's length audit computed (a mixin over
    ``trl.DPOTrainer``).

    A `datasets.Dataset` that already holds TRL's three tokenised columns (``prompt_ids``, ``chosen_ids``,
    ``rejected_ids``: `dpo_token_ids`, the same ids TRL would compute) is not tokenised again, as TRL's SFTTrainer
    skips a dataset that already holds ``input_ids``; TRL's one step after tokenisation, dropping rows whose prompt
    alone fills ``max_length`` under ``keep_start`` truncation, still runs when any row needs it (the audit has
    counted those rows). Any other dataset goes through TRL's own preparation.

    checked: trl 1.16.0 (``_prepare_dataset(dataset, processing_class, args, dataset_name)``: prompt extraction, EOS
    for plain text, tokenisation, the keep_start filter, all under ``global_then_local_main_first``)."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):

        from datasets import Dataset

        columns = set(getattr(dataset, "column_names", None) or ())
        if not isinstance(dataset, Dataset) or not set(TOKEN_COLUMNS) <= columns:
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        logging.getLogger(__name__).info(
            "Training rows (%s): %d rows' token ids from the length audit reused, TRL's tokenisation skipped",
            dataset_name, len(dataset))
        if args.max_length is not None and args.truncation_mode == "keep_start":
            import pyarrow.compute as pc

            lengths = pc.list_value_length(dataset.data.column("prompt_ids"))
            if len(dataset) and pc.max(lengths).as_py() >= args.max_length:
                from trl.trainer.utils import global_then_local_main_first  # noqa: PLC0415

                with global_then_local_main_first():
                    dataset = dataset.filter(lambda ids: len(ids) < args.max_length, input_columns="prompt_ids",
                                             num_proc=args.dataset_num_proc,
                                             desc=f"Dropping fully truncated examples from {dataset_name} dataset")
        return dataset


class PairLossHook:
    """DPOTrainer's ``_compute_loss`` handed to the trainer's ``pair_loss_step`` (a mixin over ``trl.DPOTrainer``):
    TRL 1.16 computes its whole loss (forward passes, reference log-probs, every ``loss_type`` term, its metrics) in
    this one private method, with no hook for a term of its own, so judgetrain's pair loss
    (`judgetrain.trainer.pair_loss`) calls it whole and replaces its ``sigmoid`` term from what its forward passes
    returned.

    checked: trl 1.16.0 (``_compute_loss(model, inputs, return_outputs)``, returning the loss, or (loss, outputs))."""

    def _compute_loss(self, model, inputs, return_outputs):
        trl_loss = super()._compute_loss
        return self.pair_loss_step(model, inputs, return_outputs, trl_loss)
