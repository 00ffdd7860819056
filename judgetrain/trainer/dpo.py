"""judgetrain's DPOTrainer: TRL's, with prefix sharing (``prefix_sharing=True``), the pair loss (``pair_loss``: ties,
the mean_logprob form) and the per-step records that the non-finite guard reads, all as method overrides.

    trainer = JudgeDPOTrainer(model=..., args=DPOConfig(...), train_dataset=..., prefix_sharing=True,
                              pair_loss=PairLoss(tie_model="rao_kupper"))
    guard = NonFiniteGuard("stop").attach(trainer)

- prefix sharing (`judgetrain.trainer.prefix_sharing`): ``compute_loss`` and ``compute_ref_log_probs`` run inside
  the pair-call context, in which the packed forward installed on the models runs each pair's prompt once. With
  ``prefix_sharing=False`` the trainer is TRL's, ``prefix_sharing`` stays None.
- ``precompute_ref_log_probs`` on several machines (`judgetrain.compat.trl.PerMachineRefLogps`): each machine's
  local main process writes the gathered reference log-probs into that machine's rows folder, and a start that finds
  them on every machine loads them instead of recomputing.
- one tokenisation per start (`judgetrain.compat.trl.AuditedTokenIds`): rows that carry the length audit's token
  ids (TRL's own, `judgetrain.data.lengths`) are not tokenised again by TRL.
- the pair loss (``pair_loss``, `judgetrain.trainer.pair_loss`): ties (Rao-Kupper, Davidson) and the reference-free
  mean_logprob margin in place of TRL's ``sigmoid`` term, computed from the per-token log-probs TRL's own loss
  computation gets; the rows' ``tie`` column is collated beside TRL's and kept out of the model's inputs. Without it
  (None) the loss is TRL's.
- the model card: ``create_model_card`` calls the run's ``model_card_writer`` (train.py gives the judge's card,
  `judgetrain.report.card`) instead of writing TRL's generic one; without a writer it is TRL's.
- non-finite checks: ``training_step`` records a micro-batch loss that is not finite, and the grad-norm hook
  (`judgetrain.compat.transformers.GradNormHook`) the step's global gradient norm; `NonFiniteGuard` reads and clears
  both (`StepRecord.take`) before every optimizer step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from trl import DPOTrainer

from judgetrain.compat.transformers import GradNormHook, UnusedParameterSearch
from judgetrain.compat.trl import AuditedTokenIds, PairLossHook, PerMachineRefLogps
from judgetrain.run.diskfull import every_rank_stops
from judgetrain.trainer.pair_loss import TIE_COLUMN, PairLoss, PairOutputs, TieCollator, mixed_loss, reference_from_inputs
from judgetrain.trainer.parallelism import may_leave_parameters_unused
from judgetrain.trainer.prefix_sharing import PrefixSharingMixin


@dataclass
class StepRecord:
    """What the trainer saw since the last optimizer step: a non-finite micro-batch loss, the global gradient norm."""

    loss_nonfinite: bool = False
    grad_norm: Any = None

    def take(self) -> tuple[bool, Any]:
        """(loss_nonfinite, grad_norm) of this step, cleared for the next one."""
        out = (self.loss_nonfinite, self.grad_norm)
        self.loss_nonfinite, self.grad_norm = False, None
        return out


class JudgeDPOTrainer(PrefixSharingMixin, GradNormHook, UnusedParameterSearch, PerMachineRefLogps, AuditedTokenIds,
                      PairLossHook, DPOTrainer):
    """TRL's DPOTrainer; ``prefix_sharing``: compute each pair's prompt once per model where the model allows it
    (decided and probed at start-up, see `judgetrain.trainer.prefix_sharing`); ``pair_loss``: the loss in place of
    TRL's sigmoid term (`judgetrain.trainer.pair_loss`; None: TRL's loss, and a tie row is refused)."""

    def __init__(self, *args, prefix_sharing: bool = True, pair_loss: PairLoss | None = None, **kwargs):
        self.step_record = StepRecord()
        self.pair_loss = pair_loss
        self._init_prefix_sharing(prefix_sharing)
        super().__init__(*args, **kwargs)
        self._setup_prefix_sharing()
        self.data_collator = TieCollator(self.data_collator)
        self.pair_outputs = PairOutputs([self.model, self.ref_model]) if pair_loss is not None else None

    def unused_parameters_possible(self) -> bool:
        """DDP looks for unused parameters (an extra traversal of the autograd graph each step, and torch's warning
        each run when it finds none) only where a forward pass can leave a trainable parameter without a gradient
        (`may_leave_parameters_unused`), not for every PEFT model as transformers would (`UnusedParameterSearch`)."""
        return may_leave_parameters_unused(self.model)

    def _save_checkpoint(self, model, trial):
        """Trainer's save, its failure agreed over the processes: a rank whose save failed (a full disk) stops with
        every other rank instead of leaving them waiting in the next collective (`every_rank_stops`)."""

        with every_rank_stops(self.args.output_dir, f"the save of checkpoint-{self.state.global_step}"):
            super()._save_checkpoint(model, trial)

    # -- prefix sharing: mark the calls that carry a [chosen; rejected] batch
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self._pair_calls(training_step=model.training):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    def compute_ref_log_probs(self, model, inputs):
        # precompute_ref_log_probs runs inside DPOTrainer.__init__, once the models carry TRL's fused head
        self._setup_prefix_sharing()
        inputs = {k: v for k, v in inputs.items() if k != TIE_COLUMN}
        with self._pair_calls():
            return super().compute_ref_log_probs(model, inputs)

    # -- the pair loss: TRL's loss computation, its sigmoid term replaced (judgetrain.trainer.pair_loss)
    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        if TIE_COLUMN not in self._signature_columns:
            self._signature_columns = [*self._signature_columns, TIE_COLUMN]

    def pair_loss_step(self, model, inputs, return_outputs, trl_loss):
        """TRL's loss of a batch (``trl_loss``: its loss computation, `judgetrain.compat.trl.PairLossHook`), with its
        sigmoid term replaced by the pair loss where the recipe names one."""
        tie = inputs.get(TIE_COLUMN)
        inputs = {k: v for k, v in inputs.items() if k != TIE_COLUMN}
        if self.pair_loss is None:
            if tie is not None and bool(tie.any()):
                raise ValueError("a tie row trains only under a tie model (tie_model: rao_kupper or davidson)")
            return trl_loss(model, inputs, return_outputs)
        free = self.pair_loss.reference_free
        with (reference_from_inputs(self, inputs) if free else contextlib.nullcontext(inputs)) as inputs, \
                self.pair_outputs.recording() as calls:
            trl_out = trl_loss(model, inputs, return_outputs)
        mask = inputs["completion_mask"][..., 1:]
        seq_len = mask.size(1)
        expected = 1 if free or self.precompute_ref_logps else 2
        if len(calls) < expected:
            raise RuntimeError(f"the pair loss saw {len(calls)} model calls of TRL's loss, expected {expected} "
                               "(checked: trl 1.16.0)")
        ref_logps = None
        if not free:
            ref_logps = (torch.cat([inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]])
                         if self.precompute_ref_logps else (calls[1][:, -seq_len:] * mask).sum(dim=1))
        loss, margins = mixed_loss(self.pair_loss, self.loss_types, self.loss_weights, self.beta,
                                   calls[0][:, -seq_len:], mask, ref_logps, tie)
        self._log_ties(margins, tie)
        return (loss, trl_out[1]) if return_outputs else loss

    def _log_ties(self, margins, tie) -> None:
        """The share of tie pairs and their mean |margin| (gathered over processes), beside TRL's metrics."""
        mode = "train" if self.model.training else "eval"
        tie = torch.zeros_like(margins, dtype=torch.bool) if tie is None else tie.to(margins.device).bool()
        tie, margins = self.accelerator.gather_for_metrics((tie, margins.detach()))
        self._metrics[mode]["ties/share"].append(tie.float().mean().item())
        if bool(tie.any()):
            self._metrics[mode]["ties/abs_margin"].append(margins[tie].abs().mean().item())

    # -- evaluation: the eval suites are what eval_strategy, eval_on_start and checkpoint selection run
    judge_eval = None  # the JudgeEvalCallback that scores them (judgetrain.eval.callback), set when it attaches

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        if self.judge_eval is None or eval_dataset is not None:  # a dataset of the caller's: Trainer's own evaluation
            return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        metrics = {}
        if self.eval_dataset is not None:
            metrics.update(super().evaluate(ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix))
        metrics.update(self.judge_eval.evaluate())
        return metrics

    # -- non-finite checks: what Trainer computes but gives no callback
    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        if not bool(loss.detach().isfinite().all()):
            self.step_record.loss_nonfinite = True
        return loss

    def record_grad_norm(self, norm: Any) -> None:
        self.step_record.grad_norm = norm

    # -- the model card: the run's writer (the judge's card) wherever TRL writes its generic one (each checkpoint
    # save, push_to_hub), so that TRL's never replaces it
    model_card_writer: Callable[[str], None] | None = None

    def create_model_card(self, *args, **kwargs) -> None:
        if self.model_card_writer is None:
            return super().create_model_card(*args, **kwargs)
        if self.is_world_process_zero():
            self.model_card_writer(self.args.output_dir)
        return None
