"""The pair loss (judgetrain.trainer.pair_loss): ties by Rao-Kupper and Davidson (Chen et al. 2024), the
reference-free mean_logprob margin (SimPO), RPO's sft term, on tensors and through the real trainer on the tiny judge.

Worked rows (d: the pair's margin; P: the model's probability of the row's outcome; loss = -log P):

    Rao-Kupper, nu = 3 (log nu = 1.0986): P(win) = sigmoid(d - log 3), P(tie) = 8 sigmoid(d - log 3) sigmoid(-d - log 3)
      win, d = log 3      sigmoid(0) = 1/2                        loss = log 2        = 0.693147
      tie, d = log 3      8 x 1/2 x sigmoid(-log 9) = 8/2/10 = 0.4  loss = -log 0.4     = 0.916291
      tie, d = 0          8 x 1/4 x 1/4 = 1/2                     loss = log 2        = 0.693147
      win, d = 0          sigmoid(-log 3) = 1/4                   loss = log 4        = 1.386294
    Davidson, nu = 1: P(win) = 1 / (1 + e^-d + 2 e^(-d/2)), P(tie) = 2 e^(-d/2) P(win)
      win, d = 2 log 2    1 / (1 + 1/4 + 2 x 1/2) = 4/9           loss = -log(4/9)    = 0.810930
      tie, d = 2 log 2    2 x 1/2 x 4/9 = 4/9                     loss = 0.810930
      tie, d = 0          2 / (1 + 1 + 2) = 1/2                   loss = log 2        = 0.693147
      win, d = 0          1/4                                     loss = log 4        = 1.386294

With no tie, Rao-Kupper at nu = 1 and Davidson at nu = 0 are Bradley-Terry: TRL's sigmoid loss -log sigmoid(d).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from judgetrain.config.recipe import RecipeError, check_pair_loss, check_tie_rows
from judgetrain.trainer.dpo import JudgeDPOTrainer
from judgetrain.trainer.pair_loss import PairLoss

LOG2, LOG3 = math.log(2), math.log(3)
BETA = 0.5


# ----------------------------------------------------------------------------------------------- on tensors


@pytest.mark.parametrize("tie_model, d, tie, expected", [
    ("rao_kupper", LOG3, False, math.log(2)), ("rao_kupper", LOG3, True, -math.log(0.4)),
    ("rao_kupper", 0.0, True, math.log(2)), ("rao_kupper", 0.0, False, math.log(4)),
    ("davidson", 2 * LOG2, False, -math.log(4 / 9)), ("davidson", 2 * LOG2, True, -math.log(4 / 9)),
    ("davidson", 0.0, True, math.log(2)), ("davidson", 0.0, False, math.log(4)),
])
def test_the_tie_losses_equal_the_worked_rows(tie_model, d, tie, expected):
    loss = PairLoss(tie_model=tie_model).nll(torch.tensor([d], dtype=torch.float64), torch.tensor([tie]))
    assert loss.item() == pytest.approx(expected, abs=1e-9)


def test_the_default_nu_gives_a_tie_half_the_probability_at_equal_rewards_and_pushes_its_margin_to_zero():
    assert PairLoss(tie_model="rao_kupper").nu == 3.0 and PairLoss(tie_model="davidson").nu == 2.0
    d = torch.arange(-40, 41, dtype=torch.float64) / 10
    for model in ("rao_kupper", "davidson"):
        tie_loss = PairLoss(tie_model=model).nll(d, torch.ones_like(d, dtype=torch.bool))
        assert d[tie_loss.argmin()].item() == 0.0 and tie_loss.min().item() == pytest.approx(LOG2, abs=1e-9)
        assert tie_loss[0].item() == pytest.approx(tie_loss[-1].item(), abs=1e-9)  # symmetric in d


def test_with_no_tie_the_bradley_terry_limits_are_trls_sigmoid_and_rao_kupper_a_margin_of_log_nu():
    d = torch.tensor([-3.0, -0.5, 0.0, 0.7, 5.0], dtype=torch.float64)
    no_tie = torch.zeros_like(d, dtype=torch.bool)
    sigmoid = -F.logsigmoid(d)  # TRL's sigmoid loss of beta x delta_score
    for model, nu in (("rao_kupper", 1.0), ("davidson", 0.0), (None, None)):
        torch.testing.assert_close(PairLoss(tie_model=model, nu=nu).nll(d, no_tie), sigmoid, rtol=0, atol=1e-12)
    torch.testing.assert_close(PairLoss(tie_model="rao_kupper", nu=3.0).nll(d, no_tie), -F.logsigmoid(d - LOG3))
    with pytest.raises(ValueError, match="a tie row trains only under a tie model"):
        PairLoss(tie_model="rao_kupper", nu=1.0).nll(d, ~no_tie)


def test_the_mean_logprob_margin_divides_each_response_by_its_tokens_and_reads_no_reference():
    # rows [chosen; rejected]: chosen sums -6 over 3 tokens (mean -2), rejected -4 over 1 token (mean -4)
    logps, lengths = torch.tensor([-6.0, -4.0]), torch.tensor([3, 1])
    assert PairLoss(form="mean_logprob").margins(BETA, logps, lengths, None).item() == pytest.approx(BETA * 2.0)
    ref = torch.tensor([-1.0, -5.0])  # log_ratio: (-6 + 1) - (-4 + 5) = -6
    assert PairLoss(tie_model="davidson").margins(BETA, logps, lengths, ref).item() == pytest.approx(BETA * -6.0)


def test_recipes_refuse_tie_rows_without_a_tie_probability_and_loss_terms_the_pair_loss_does_not_take():
    from types import SimpleNamespace as NS

    check_tie_rows(NS(tie_model=None, tie_nu=None), 0)
    check_tie_rows(NS(tie_model="davidson", tie_nu=0.5), 7)
    with pytest.raises(RecipeError, match=r"7 training row\(s\) are ties .* names no tie_model"):
        check_tie_rows(NS(tie_model=None, tie_nu=None), 7)
    with pytest.raises(RecipeError, match="rao_kupper with tie_nu 1 gives a tie no probability"):
        check_tie_rows(NS(tie_model="rao_kupper", tie_nu=1.0), 2)
    plain = dict(f_divergence_type="reverse_kl", ld_alpha=None, use_weighting=False)
    check_pair_loss(NS(tie_model="davidson", training_form="log_ratio"), NS(loss_type=["sigmoid", "sft"], **plain))
    with pytest.raises(RecipeError, match=r"loss_type \['ipo'\] names other terms"):
        check_pair_loss(NS(tie_model=None, training_form="mean_logprob"), NS(loss_type=["ipo"], **plain))
    with pytest.raises(RecipeError, match="ld_alpha: 0.5 changes TRL's own margin"):
        check_pair_loss(NS(tie_model="davidson", training_form="log_ratio"),
                        NS(loss_type=["sigmoid"], **{**plain, "ld_alpha": 0.5}))


def test_the_tie_column_is_read_as_bools_through_the_mixture_and_a_bad_value_is_named(tmp_path):
    import json

    from judgetrain.data.mixture import load_mixture
    from judgetrain.data.preference import load_preference
    from judgetrain.data.validate import DataValidationError

    rows = [{**r, "prompt": json.dumps(r["prompt"]), "chosen": json.dumps(r["chosen"]),
             "rejected": json.dumps(r["rejected"])} for r in _rows(ties=True)]
    rows[0].pop("tie")  # absent: a win
    rows[2]["tie"] = None  # null: a win
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    mixed = load_mixture([{"dataset": "preference", "source": str(path), "split": "train"}], seed=0)
    assert sorted(mixed["tie"]) == [False] * 4 + [True] * 2
    rows[3]["tie"] = "yes"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataValidationError) as err:
        load_preference(str(path))
    problem = err.value.problems[0]
    assert (problem.row, problem.field) == (3, "tie") and "'yes' is not true, false or null" in problem.describe()


# ----------------------------------------------------------------------------------------------- through the trainer


def _rows(ties: bool) -> list[dict]:
    """Six pairs of different lengths; rows 1 and 4 are ties where ``ties``."""
    rows = []
    for i in range(6):
        body = " ".join(f"claim {j} about item {i}" for j in range(2 + 3 * i))
        rows.append({
            "prompt": [{"role": "system", "content": "You are a strict judge."},
                       {"role": "user", "content": f"Evaluation {i}: {body}"}],
            "chosen": [{"role": "assistant", "content": f"Score: {4 - i % 3}. " + "Well argued. " * (1 + i % 2)}],
            "rejected": [{"role": "assistant", "content": f"Score: {i % 5}."}],
            "tie": ties and i in (1, 4),
        })
    return rows


def _trainer(tiny_judge, tmp_path, *, ties: bool, pair_loss: PairLoss | None, prefix_sharing: bool = True, **dpo):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig

    args = DPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=6, max_length=512,
                     report_to="none", use_cpu=True, seed=0, beta=BETA, **dpo)
    peft = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"],
                      init_lora_weights=False)  # a random adapter: the policy differs from the reference
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)
    return JudgeDPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(_rows(ties)),
                           processing_class=AutoTokenizer.from_pretrained(tiny_judge), peft_config=peft,
                           prefix_sharing=prefix_sharing, pair_loss=pair_loss)


def _loss_and_grads(trainer):
    trainer.model.train()
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def _sequence_logps(trainer, inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(policy logps, reference logps, response tokens, per-token policy logps) of TRL's [chosen; rejected] rows,
    from the model's logits directly (the reference: the adapter disabled)."""
    ids, mask = inputs["input_ids"], inputs["completion_mask"][:, 1:].float()

    def per_token():
        logits = trainer.model(input_ids=ids, attention_mask=inputs["attention_mask"]).logits[:, :-1].float()
        return logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1) * mask

    with torch.no_grad():
        policy = per_token()
        with trainer.model.disable_adapter():
            ref = per_token()
    return policy.sum(1), ref.sum(1), mask.sum(1), policy


@pytest.mark.parametrize("prefix_sharing", [True, False])
@pytest.mark.parametrize("limit", [PairLoss(tie_model="rao_kupper", nu=1.0), PairLoss(tie_model="davidson", nu=0.0)])
def test_with_no_tie_the_trainer_gives_trls_sigmoid_loss_and_gradients(tiny_judge, tmp_path, limit, prefix_sharing):
    reference = _loss_and_grads(_trainer(tiny_judge, tmp_path / "trl", ties=False, pair_loss=None,
                                         prefix_sharing=prefix_sharing))
    ours = _loss_and_grads(_trainer(tiny_judge, tmp_path / "ours", ties=False, pair_loss=limit,
                                    prefix_sharing=prefix_sharing))
    assert reference[0].item() > 0.1  # the random adapter moves the policy: the loss is not log 2 by construction
    torch.testing.assert_close(ours[0], reference[0], rtol=1e-5, atol=1e-6)
    assert reference[1] and set(ours[1]) == set(reference[1])
    for name, grad in reference[1].items():
        torch.testing.assert_close(ours[1][name], grad, rtol=1e-4, atol=1e-6 * grad.abs().max().item())


@pytest.mark.parametrize("pair_loss, precompute", [(PairLoss(tie_model="rao_kupper"), False),
                                                    (PairLoss(tie_model="davidson", nu=2.0), False),
                                                    (PairLoss(tie_model="rao_kupper"), True)])
def test_with_ties_the_trainer_gives_the_papers_loss_of_the_log_ratio_margin(tiny_judge, tmp_path, pair_loss,
                                                                           precompute):
    trainer = _trainer(tiny_judge, tmp_path, ties=True, pair_loss=pair_loss, precompute_ref_log_probs=precompute)
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert inputs["tie"].dtype == torch.bool and int(inputs["tie"].sum()) == 2  # collated beside TRL's columns
    assert ("ref_chosen_logps" in inputs) == precompute
    loss = trainer.compute_loss(trainer.model, inputs).item()
    assert trainer.prefix_sharing and trainer.prefix_sharing_stats["batches_packed"] >= 1  # the packed forward ran
    policy, ref, _, _ = _sequence_logps(trainer, inputs)
    ratio = policy - ref
    d = BETA * (ratio[:6] - ratio[6:])
    nu, tie = pair_loss.nu, inputs["tie"]
    if pair_loss.tie_model == "rao_kupper":  # written out from the paper's formulas, not the module's
        win = F.logsigmoid(d - math.log(nu))
        rows = torch.where(tie, math.log(nu**2 - 1) + win + F.logsigmoid(-d - math.log(nu)), win)
    else:
        p_win = 1 / (1 + torch.exp(-d) + nu * torch.exp(-d / 2))
        rows = torch.log(torch.where(tie, nu * torch.exp(-d / 2) * p_win, p_win))
    assert d.abs().max().item() > 0.05  # margins far enough from 0 that the tie and win terms differ
    # the trainer's log-probs come from the packed forward (and, precomputed, from another batch's padding): each sum
    # within 1e-4 of its size, so d within 2 x beta x that, and the loss (its slope in d is below 1) as well
    tol = 2 * BETA * 1e-4 * max(policy.abs().max().item(), ref.abs().max().item())
    assert loss == pytest.approx(-rows.mean().item(), rel=1e-4, abs=tol)
    assert trainer._metrics["train"]["ties/share"][-1] == pytest.approx(2 / 6)


def test_the_mean_logprob_form_with_ties_and_rpos_sft_term_runs_one_forward_per_step(tiny_judge, tmp_path):
    pair_loss = PairLoss(form="mean_logprob", tie_model="rao_kupper")
    trainer = _trainer(tiny_judge, tmp_path, ties=True, pair_loss=pair_loss, loss_type=["sigmoid", "sft"],
                       loss_weights=[1.0, 0.5])
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    calls = []
    hook = trainer.model.register_forward_hook(lambda m, a, k, out: calls.append(1), with_kwargs=True)
    loss = trainer.compute_loss(trainer.model, inputs).item()
    hook.remove()
    assert len(calls) == 1  # the policy's forward only: the form reads no reference
    policy, _, tokens, per_token = _sequence_logps(trainer, inputs)
    mean = policy / tokens
    d = BETA * (mean[:6] - mean[6:])
    win = F.logsigmoid(d - LOG3)
    pair = -torch.where(inputs["tie"], math.log(8) + win + F.logsigmoid(-d - LOG3), win).mean()
    chosen_mask = inputs["completion_mask"][:6, 1:].bool()
    sft = -per_token[:6][chosen_mask].mean()  # TRL's sft term: the chosen tokens' mean negative log-probability
    assert loss == pytest.approx((pair + 0.5 * sft).item(), rel=1e-4)


def test_rpos_sft_term_is_trls_own(tiny_judge, tmp_path):
    mix = dict(loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.3])
    reference = _loss_and_grads(_trainer(tiny_judge, tmp_path / "trl", ties=False, pair_loss=None, **mix))
    ours = _loss_and_grads(_trainer(tiny_judge, tmp_path / "ours", ties=False,
                                    pair_loss=PairLoss(tie_model="davidson", nu=0.0), **mix))
    torch.testing.assert_close(ours[0], reference[0], rtol=1e-5, atol=1e-6)


def test_a_tie_row_under_trls_own_loss_is_refused(tiny_judge, tmp_path):
    trainer = _trainer(tiny_judge, tmp_path, ties=True, pair_loss=None)
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    with pytest.raises(ValueError, match="a tie row trains only under a tie model"):
        trainer.compute_loss(trainer.model, inputs)


# ----------------------------------------------------------------------------------------------- a run


def test_a_run_trains_pairs_knowns_tie_pairs_under_a_tie_model_and_refuses_them_without_one(tmp_path):
    """`judgetrain pairs known --form response` (a rewrite against its source: a tie) into `judgetrain.train`: the
    tie column passes the preference adapter, the mixture, the length audit (counted in data_audit.json) and the
    collator; the run logs the tie share. Without a tie model the run stops before any model loads, naming the fix."""
    import json
    import subprocess
    import sys

    from helpers import REPO, read_jsonl
    from test_known_pairs import cli, factory

    spec, source, items = factory(tmp_path)
    pairs = tmp_path / "pairs"
    assert cli("pairs", "known", "--form", "response", "--items", items, "--source", source, "--spec", spec,
               "--output_dir", pairs, "--validation_fraction", "0") == 0
    ties = json.loads((pairs / "stats.json").read_text())["pairs_by_label"]["tie"]

    def train(run, *extra):
        return subprocess.run([sys.executable, "-m", "judgetrain.train", "recipes/quickstart.yaml", "--train_datasets",
                               f"{{dataset: preference, source: {pairs}, split: train}}", "--eval_suites", "none",
                               "--output_dir", str(run), "--max_steps", "2", "--per_device_train_batch_size", "5",
                               "--logging_steps", "1", "--save_steps", "2", "--warmup_steps", "0", *extra],
                              cwd=REPO, capture_output=True, text=True, timeout=900)

    proc = train(tmp_path / "run", "--training_form", "mean_logprob", "--tie_model", "davidson",
                 "--loss_type", "sigmoid", "sft", "--loss_weights", "1.0", "0.2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((tmp_path / "run" / "data_audit.json").read_text())["tie_rows"] == ties
    shares = [m["train/ties/share"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/ties/share" in m]
    assert len(shares) == 2 and sum(shares) > 0
    refused = train(tmp_path / "refused")
    assert refused.returncode == 2, refused.stderr[-4000:]
    assert f"{ties} training row(s) are ties (their `tie` column is true) and the recipe names no tie_model" \
           in refused.stderr
    assert "Loading weights" not in refused.stderr  # refused before any model loads
    dry = train(tmp_path / "dry", "--dry_run")  # the dry run refuses what the launch refuses
    assert dry.returncode == 2 and "the recipe names no tie_model" in dry.stderr, dry.stderr[-4000:]
