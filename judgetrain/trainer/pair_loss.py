"""The pair loss judgetrain trains in place of TRL's ``sigmoid`` term: ties (Chen et al. 2024, "On Extending Direct
Preference Optimization to Accommodate Ties") and a reference-free, length-normalised margin (SimPO), beside TRL's
log-ratio margin.

    trainer = JudgeDPOTrainer(..., pair_loss=PairLoss(form="mean_logprob", tie_model="rao_kupper", nu=3.0))

A recipe names it with ``training_form``, ``tie_model`` and ``tie_nu`` (`judgetrain.config.recipe`); a training row
whose ``tie`` column is true is a tie (its chosen and rejected responses are equally good).

The margin d of a pair (chosen y_w, rejected y_l, prompt x), ``form``:

- ``log_ratio`` (DPO, TRL's): d = beta * [(log pi(y_w|x) - log pi_ref(y_w|x)) - (log pi(y_l|x) - log pi_ref(y_l|x))]
- ``mean_logprob`` (SimPO; no reference forward): d = beta * [log pi(y_w|x) / |y_w| - log pi(y_l|x) / |y_l|], |y| the
  response's tokens

The loss of a row is -log P(outcome), its outcome a win of y_w (``tie`` false) or a tie, under ``tie_model``:

- none (Bradley-Terry): P(win) = sigmoid(d); TRL's ``sigmoid`` loss. A tie has no probability.
- ``rao_kupper``, nu >= 1: P(win) = sigmoid(d - log nu), P(tie) = (nu^2 - 1) sigmoid(d - log nu) sigmoid(-d - log nu)
- ``davidson``, nu >= 0: P(win) = 1 / (1 + e^-d + nu e^(-d/2)), P(tie) = nu e^(-d/2) / (1 + e^-d + nu e^(-d/2))

(on strengths lambda = e^reward: Rao-Kupper lambda_w / (lambda_w + nu lambda_l), Davidson lambda_w / (lambda_w +
lambda_l + nu sqrt(lambda_w lambda_l)), Davidson's 1970 form). Both give a tie the most probability at d = 0, and push a tie's margin to 0
from either side. rao_kupper at nu = 1 and davidson at nu = 0 are Bradley-Terry. On a win, rao_kupper is the sigmoid
loss with a margin of log nu (SimPO's gamma in the mean_logprob form).

RPO's likelihood term is TRL's loss mix ``loss_type: [sigmoid, sft]`` (``loss_weights: [1, alpha]``): the ``sigmoid``
term is this pair loss, the ``sft`` term TRL's (the mean negative log-probability of the chosen responses' tokens).

How it reaches TRL's loss (checked: trl 1.16.0): ``DPOTrainer._compute_loss`` computes the per-token log-probs and its
loss in one method, so `PairOutputs` records what the model calls of one loss computation return (forward hooks on
the policy and a separate reference: the policy's call first, then the reference's), and the trainer replaces TRL's
loss by this one computed from them; TRL's logged metrics stay as TRL computes them. The ``tie`` column rides beside
TRL's token columns (`TieCollator`) and never reaches the model.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from judgetrain.config.recipe import PAIR_LOSS_TYPES, TRAINING_FORMS, pair_loss_active, tie_nu, ties_trainable

TIE_COLUMN = "tie"


@dataclass(frozen=True)
class PairLoss:
    """The pair loss of one run (see the module doc): its margin ``form``, its ``tie_model`` (None: Bradley-Terry)
    and the tie model's ``nu`` (None: the model's default)."""

    form: str = "log_ratio"
    tie_model: str | None = None
    nu: float | None = None

    def __post_init__(self):
        if self.form not in TRAINING_FORMS:
            raise ValueError(f"training_form: {self.form!r} is not one of {', '.join(TRAINING_FORMS)}")
        object.__setattr__(self, "nu", tie_nu(self.tie_model, self.nu))

    @classmethod
    def of_recipe(cls, script_args) -> PairLoss | None:
        """The recipe's pair loss, or None where it trains TRL's own loss (log_ratio, no tie model)."""
        if not pair_loss_active(script_args):
            return None
        return cls(script_args.training_form, script_args.tie_model, script_args.tie_nu)

    @property
    def reference_free(self) -> bool:
        return self.form == "mean_logprob"

    @property
    def takes_ties(self) -> bool:
        """Whether a tie has any probability under this model (a tie row can train)."""
        return ties_trainable(self.tie_model, self.nu)

    def margins(self, beta: float, logps: torch.Tensor, lengths: torch.Tensor,
                ref_logps: torch.Tensor | None) -> torch.Tensor:
        """d per pair from the summed log-probs of TRL's [chosen; rejected] rows (``lengths``: their response
        tokens; ``ref_logps``: the reference's, for the log_ratio form)."""
        if self.reference_free:
            score = logps / lengths.clamp(min=1)
        else:
            score = logps - ref_logps
        chosen, rejected = score.chunk(2, dim=0)
        return beta * (chosen - rejected)

    def nll(self, d: torch.Tensor, tie: torch.Tensor | None) -> torch.Tensor:
        """-log P(outcome) per pair: a win where ``tie`` is false or None, a tie where it is true."""
        tie = torch.zeros_like(d, dtype=torch.bool) if tie is None else tie.to(device=d.device, dtype=torch.bool)
        if not self.takes_ties and bool(tie.any()):
            raise ValueError(f"a tie row trains only under a tie model that gives a tie a probability, not "
                             f"{self.tie_model or 'Bradley-Terry'} (nu {self.nu})")
        if self.tie_model == "rao_kupper":
            return rao_kupper_nll(d, tie, self.nu)
        if self.tie_model == "davidson":
            return davidson_nll(d, tie, self.nu)
        return -F.logsigmoid(d)


def rao_kupper_nll(d: torch.Tensor, tie: torch.Tensor, nu: float) -> torch.Tensor:
    """-log P under Rao-Kupper (nu >= 1): a win -log sigmoid(d - log nu); a tie -[log(nu^2 - 1) + log sigmoid(d -
    log nu) + log sigmoid(-d - log nu)] (+inf at nu = 1)."""
    alpha = math.log(nu)
    win = F.logsigmoid(d - alpha)
    log_scale = math.log(nu * nu - 1) if nu > 1 else -math.inf
    tied = log_scale + win + F.logsigmoid(-d - alpha)
    return -torch.where(tie, tied, win)


def davidson_nll(d: torch.Tensor, tie: torch.Tensor, nu: float) -> torch.Tensor:
    """-log P under Davidson (nu >= 0): a win log(1 + e^-d + nu e^(-d/2)); a tie that minus log(nu) - d/2
    (+inf at nu = 0)."""
    log_nu = math.log(nu) if nu > 0 else -math.inf
    terms = torch.stack([torch.zeros_like(d), -d, log_nu - d / 2])
    win = -torch.logsumexp(terms, dim=0)
    return -torch.where(tie, win + log_nu - d / 2, win)


def chosen_nll(per_token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's ``sft`` term: the mean negative log-probability of the chosen responses' tokens (the first half of
    TRL's [chosen; rejected] rows), one number."""
    chosen, _ = per_token_logps.chunk(2, dim=0)
    chosen_mask, _ = mask.chunk(2, dim=0)
    return -chosen[chosen_mask.bool()].mean()


def mixed_loss(pair_loss: PairLoss, loss_types: list[str], loss_weights: list[float], beta: float,
               per_token_logps: torch.Tensor, mask: torch.Tensor, ref_logps: torch.Tensor | None,
               tie: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the loss of one batch, the margins d) from the policy's per-token log-probs in TRL's [chosen; rejected]
    layout (``mask``: the response tokens, TRL's shifted completion mask): each of TRL's ``loss_type`` terms with
    its weight, ``sigmoid`` the pair loss (mean over pairs), ``sft`` TRL's likelihood term."""
    mask = mask.to(per_token_logps.dtype)
    logps = (per_token_logps * mask).sum(dim=1)
    d = pair_loss.margins(beta, logps, mask.sum(dim=1), ref_logps)
    loss = torch.zeros((), dtype=per_token_logps.dtype, device=per_token_logps.device)
    for loss_type, weight in zip(loss_types, loss_weights, strict=True):
        if loss_type not in PAIR_LOSS_TYPES:
            raise ValueError(f"the pair loss takes loss_type terms {PAIR_LOSS_TYPES}, not {loss_type!r}")
        term = pair_loss.nll(d, tie).mean() if loss_type == "sigmoid" else chosen_nll(per_token_logps, mask)
        loss = loss + weight * term
    return loss, d


# ----------------------------------------------------------------------------------------------- reaching TRL's loss


class PairOutputs:
    """The per-token log-probs that the DPO forwards of one loss computation return, in call order (TRL 1.16: the
    policy's, then the reference's unless it reads them from its inputs), recorded by forward hooks on ``modules``
    (the policy, and a separate reference model) while `recording`; calls without TRL's fused head are not
    recorded."""

    def __init__(self, modules: list[torch.nn.Module]):
        self.calls: list[torch.Tensor] | None = None
        self.handles = [m.register_forward_hook(self._hook, with_kwargs=True) for m in modules if m is not None]

    def _hook(self, module, args, kwargs, output) -> None:
        if self.calls is not None and kwargs.get("fused_lm_head"):
            self.calls.append(output.log_probs)

    @contextlib.contextmanager
    def recording(self):
        self.calls = []
        try:
            yield self.calls
        finally:
            self.calls = None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@contextlib.contextmanager
def reference_from_inputs(trainer: Any, inputs: dict) -> Any:
    """For a reference-free form: TRL's loss reads zero reference log-probs from its inputs instead of running the
    reference forward (its ``precompute_ref_logps`` path; checked: trl 1.16.0), so a step costs one forward less.
    Yields the inputs to pass."""
    if trainer.precompute_ref_logps:
        yield inputs
        return
    zeros = torch.zeros(inputs["input_ids"].size(0) // 2, device=inputs["input_ids"].device)
    trainer.precompute_ref_logps = True
    try:
        yield {**inputs, "ref_chosen_logps": zeros, "ref_rejected_logps": zeros}
    finally:
        trainer.precompute_ref_logps = False


class TieCollator:
    """TRL's collator with the rows' ``tie`` column as a bool tensor ``tie`` (one per pair) where the rows carry it;
    rows without it collate as TRL's."""

    def __init__(self, inner: Callable[[list[dict]], dict]):
        self.inner = inner

    def __call__(self, examples: list[dict]) -> dict:
        if not examples or TIE_COLUMN not in examples[0]:
            return self.inner(examples)
        ties = [bool(e.get(TIE_COLUMN)) for e in examples]
        out = self.inner([{k: v for k, v in e.items() if k != TIE_COLUMN} for e in examples])
        out[TIE_COLUMN] = torch.tensor(ties, dtype=torch.bool)
        return out
