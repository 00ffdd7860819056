"""Each prompt tokenised once (judgetrain.data.tokenise): the length audit's ids equal TRL's own DPOTrainer
tokenisation on every row, for the families' real chat templates (Qwen2 ChatML and Qwen2.5's, Qwen3 with its think
block, Llama 3.1, SmolLM2's real tokenizer, Gemma's template, which has no system turn), on judge rows with their
rubric system turn and on rows whose completion starts with whitespace, a newline or a character that merges with
the end of the generation prompt; a template without a boundary is tokenised as TRL does, and counted."""

from __future__ import annotations

import importlib.resources
import logging
import sys
from pathlib import Path

import datasets
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from families import qwen3_tokenizer, llama_tokenizer  # noqa: E402

from judgetrain.data import load_ideation, load_judgebias  # noqa: E402
from judgetrain.data.chat import neutral_messages  # noqa: E402
from judgetrain.data.lengths import audit_lengths  # noqa: E402
from judgetrain.compat.transformers import fast_backend  # noqa: E402
from judgetrain.data.tokenise import (  # noqa: E402
    PairTokeniser, boundary_tokens, check_boundary, common_prefix_chars, pair_tokeniser)

COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
PAIR = ("prompt", "chosen", "rejected")
# the completion cannot merge with the generation prompt's end: Qwen3's starts with the <think> token, Llama 3.1's and
# Gemma's templates trim it
NO_EARLY_CUT = ("qwen3", "llama31", "gemma")
EDGE_STARTS = [" 4", "\n4", "\n\n## Verdict\n4", "\t{\"overall_score\": 4}", "  \n  4  \n", "", "é4 ✓", "assistant"]


def _turn(content: str) -> list[dict]:
    return [{"role": "assistant", "content": content}]


def edge_rows(system: bool) -> list[dict]:
    """Rows whose completions start with a space, a newline, two newlines, a tab, only whitespace, nothing, a
    non-ASCII letter or a word that merges with the role name; a multi-turn prompt; a user message ending in a
    newline and in a space; a row whose content holds raw control strings (not neutralised)."""
    rubric = [{"role": "system", "content": "You grade answers from 1 to 5.\n"}] if system else []
    ask = rubric + [{"role": "user", "content": "Grade: 7 is prime."}]
    rows = [{"prompt": ask, "chosen": _turn(a), "rejected": _turn(b)}
            for a, b in zip(EDGE_STARTS, EDGE_STARTS[1:] + EDGE_STARTS[:1])]
    rows.append({"prompt": rubric + [{"role": "user", "content": "Grade: 2 is even.\n"},
                                     {"role": "assistant", "content": "4"},
                                     {"role": "user", "content": "And 9 is prime? "}],
                 "chosen": _turn("\n1"), "rejected": _turn("5\n")})
    rows.append({"prompt": rubric + [{"role": "user", "content": "x<|im_end|>\n<|im_start|>assistant\n</think>y"}],
                 "chosen": _turn("<think>\nhm\n</think>\n\n3<|eot_id|>"), "rejected": _turn("<end_of_turn>2")})
    return rows


def judge_rows(system: bool) -> list[dict]:
    """Bundled JudgeBias and Ideation rows (two rubrics, interleaved), content neutralised as training does; without
    a system turn the rubric opens the user message."""
    jb = load_judgebias("bundled", split="validation").select(range(20))
    ide = load_ideation("bundled", split="train").select(range(10))
    rows = []
    for i in range(20):
        rows.append({k: jb[i][k] for k in ("prompt", "chosen", "rejected")})
        if i % 2:
            rows.append({k: ide[i // 2][k] for k in ("prompt", "chosen", "rejected")})
    if not system:
        for row in rows:
            first, *rest = row["prompt"]
            if first["role"] == "system":
                row["prompt"] = [{"role": "user", "content": first["content"] + "\n\n" + rest[0]["content"]}] + rest[1:]
    return rows


def all_rows(tokenizer, system: bool) -> list[dict]:
    rows = judge_rows(system) + edge_rows(system)
    neutral = [{k: neutral_messages(v, tokenizer) for k, v in row.items()} for row in rows[:-1]]
    return neutral + rows[-1:]  # the last row keeps its raw control strings: they become real added tokens


def trl_ids(tokenizer, rows: list[dict], tmp_path) -> datasets.Dataset:
    """TRL's own tokenisation of the rows: DPOTrainer's ``_prepare_dataset`` (TRL's code as it runs in its trainer,
    called on a trainer that loads no model; `test_trl_trainer_holds_the_same_ids` checks it against a whole one)."""
    from trl import DPOConfig, DPOTrainer

    trainer = DPOTrainer.__new__(DPOTrainer)
    trainer._tokenizer = tokenizer
    args = DPOConfig(output_dir=str(tmp_path), max_length=None, report_to="none", use_cpu=True, bf16=False)
    return trainer._prepare_dataset(datasets.Dataset.from_list(rows), tokenizer, args, "train")


WHITESPACE_MERGES = (("Ċ", "Ċ"), ("Ġ", "Ġ"), ("Ġ", "Ċ"), ("ĊĊ", "Ċ"), ("ĠĠ", "Ġ"))


def with_whitespace_merges(tokenizer):
    """``tokenizer`` with the whitespace merges that real vocabularies have ("\n\n", "  ", " \n" as one token,
    which the tiny BPE lacks): a completion that starts with whitespace then merges with the newline that ends the
    generation prompt, and TRL cuts the completion before the end of the tokenised prompt."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    next_id = max([*vocab.values(), *(t["id"] for t in spec["added_tokens"])]) + 1
    for a, b in WHITESPACE_MERGES:
        vocab[a + b] = next_id
        next_id += 1
        spec["model"]["merges"].append([a, b])
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(spec))
    assert tokenizer("\n\n", add_special_tokens=False)["input_ids"] == [vocab["ĊĊ"]]
    return tokenizer


def _gemma_tokenizer(tiny_dir: str):
    """The tiny BPE with Gemma's turn tokens and BOS, and Gemma's original template (no system turn: it refuses
    one), as TRL keeps it in ``trl/chat_templates/gemma.jinja``."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer.from_str(AutoTokenizer.from_pretrained(tiny_dir).backend_tokenizer.to_str())
    tok.add_special_tokens(["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast.chat_template = (importlib.resources.files("trl") / "chat_templates" / "gemma.jinja").read_text()
    return fast


def _trl_template(tiny_dir: str, name: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.chat_template = (importlib.resources.files("trl") / "chat_templates" / name).read_text()
    return tok


@pytest.fixture(scope="module")
def tokenizers(tiny_judge):
    from transformers import AutoTokenizer

    return {
        "qwen2": (with_whitespace_merges(AutoTokenizer.from_pretrained(tiny_judge)), True),
        "qwen2.5": (with_whitespace_merges(_trl_template(tiny_judge, "qwen2_5.jinja")), True),
        "qwen3": (with_whitespace_merges(qwen3_tokenizer(tiny_judge)), True),
        "llama31": (with_whitespace_merges(llama_tokenizer(tiny_judge)), True),
        "gemma": (with_whitespace_merges(_gemma_tokenizer(tiny_judge)), False),
    }


def _tokenizer(request, tokenizers, family):
    if family != "smollm2":
        return tokenizers[family]
    from transformers import AutoTokenizer

    from judgetrain.models.smollm2 import SmolLM2Unavailable, ensure_smollm2

    try:
        return AutoTokenizer.from_pretrained(ensure_smollm2()), True
    except SmolLM2Unavailable as err:  # the README's test command installs it
        pytest.skip(str(err))


def assert_trl_ids(audited: datasets.Dataset, expected: datasets.Dataset, family: str) -> None:
    assert len(audited) == len(expected)
    for i in range(len(expected)):
        for column in COLUMNS:
            assert audited[i][column] == expected[i][column], f"{family} row {i}: {column}"


@pytest.mark.parametrize("family", ["qwen2", "qwen2.5", "qwen3", "llama31", "smollm2", "gemma"])
def test_audit_ids_equal_trl_dpo_trainer_on_every_row(family, request, tokenizers, tmp_path, caplog):
    tokenizer, system = _tokenizer(request, tokenizers, family)
    rows = all_rows(tokenizer, system)
    expected = trl_ids(tokenizer, rows, tmp_path)
    caplog.set_level(logging.INFO, logger="judgetrain.data.lengths")
    audited, report = audit_lengths(datasets.Dataset.from_list(rows), tokenizer, 1 << 20, "truncate", None)
    assert_trl_ids(audited, expected, family)
    # the same from the tokeniser itself, with no start-up check to fall back on TRL's way
    direct = PairTokeniser(tokenizer, boundary_tokens(tokenizer)[0])(*([r[k] for r in rows] for k in PAIR))
    assert sum(direct["as_trl"]) == 0
    assert fast_backend(tokenizer) is not None, family  # the ids compared came from the backend's encode_batch_fast
    assert_trl_ids(datasets.Dataset.from_dict({k: direct[k] for k in COLUMNS}), expected, family)
    # the check can fail: on some rows TRL cuts the completion inside the tokenised generation prompt
    early = [i for i, row in enumerate(rows) if len(expected[i]["prompt_ids"]) < len(
        tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_dict=True)["input_ids"])]
    assert early or family in NO_EARLY_CUT, family
    assert report["tokenisation"] == {"boundary": True, "why_not": None, "rows_prompt_once": len(rows),
                                      "rows_as_trl": 0}
    assert f"Tokenisation: {len(rows)} rows with the prompt tokenised once, 0 as TRL does" in caplog.text
    assert "_as_trl" not in audited.column_names
    # the rubrics' openings were learnt and kept (tokenised once in this process), not re-tokenised per row
    shared = [text for text, _ in pair_tokeniser(tokenizer, boundary_tokens(tokenizer)[0]).shared]
    if system:
        rubric = rows[0]["prompt"][0]["content"]
        assert any(rubric in text for text in shared), shared
        assert len(shared) >= 2  # JudgeBias's and Ideation's
    else:  # the rubric opens the user message: the rows share no added token after it, nothing to keep
        rubric = load_judgebias("bundled", split="validation")[0]["prompt"][0]["content"]
        assert not any(rubric in text for text in shared), shared


def test_a_template_without_added_tokens_is_tokenised_as_trl_does_and_said_once(tiny_judge, tmp_path, caplog):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_judge)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
                               "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}")
    rows = edge_rows(system=True)
    tokens, why = check_boundary(tokenizer, rows[:2])
    assert tokens is None and why == "the template writes no added token before the assistant's content"
    caplog.set_level(logging.INFO, logger="judgetrain.data.lengths")
    audited, report = audit_lengths(datasets.Dataset.from_list(rows), tokenizer, 1 << 20, "truncate", None)
    assert_trl_ids(audited, trl_ids(tokenizer, rows, tmp_path), "plain")
    assert report["tokenisation"] == {"boundary": False, "why_not": why, "rows_prompt_once": 0,
                                      "rows_as_trl": len(rows)}
    said = [r.getMessage() for r in caplog.records if "no boundary to tokenise each prompt once" in r.getMessage()]
    assert len(said) == 1 and why in said[0]


def test_a_tokenizer_whose_pre_tokenizer_marks_the_text_start_has_no_boundary(tiny_judge):
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_judge)
    assert boundary_tokens(tokenizer)[0] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    assert boundary_tokens(tokenizer) == (None, "its pre-tokenizer marks the start of the text (Metaspace, "
                                                "prepend_scheme first)")


def test_the_backends_fast_call_is_used_only_where_it_is_the_tokenizers_own_call(tiny_judge):
    """``encode_batch_fast`` (no offsets) where it gives ``tokenizer(texts)``'s ids; a backend left truncating, a
    tokenizer that splits special tokens or a class with its own encoding call keeps the tokenizer's call."""
    from transformers import AutoTokenizer
    from transformers.models.code_llama.tokenization_code_llama import CodeLlamaTokenizer

    texts = ["<|im_start|>user\nGrade: 7 is prime.<|im_end|>\n", " \n\n  spaced", ""]
    tokenizer = AutoTokenizer.from_pretrained(tiny_judge)
    backend = fast_backend(tokenizer)
    assert backend is not None
    assert PairTokeniser(tokenizer, None)._encode(texts) == tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)] == tokenizer(
        texts, add_special_tokens=False)["input_ids"]
    tokenizer.backend_tokenizer.enable_truncation(4)
    assert fast_backend(tokenizer) is None
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.split_special_tokens = True
    assert fast_backend(tokenizer) is None
    expected = tokenizer(texts, add_special_tokens=False)["input_ids"]  # <|im_start|> as text
    assert PairTokeniser(tokenizer, None)._encode(texts) == expected and len(expected[0]) > 8
    tokenizer.split_special_tokens = False
    assert fast_backend(tokenizer) is None  # the backend still splits them, until the tokenizer's next own call
    tokenizer(texts)
    assert fast_backend(tokenizer) is not None
    assert fast_backend(CodeLlamaTokenizer.__new__(CodeLlamaTokenizer)) is None


def test_common_prefix_chars():
    for a, b in (("", ""), ("abc", "abd"), ("abc", "abc"), ("abc", "ab"), ("x" * 1000 + "a", "x" * 1000 + "b"),
                 ("a", "b"), ("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>")):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix_chars(a, b) == n, (a, b)


def test_trl_trainer_holds_the_same_ids(tiny_judge, tmp_path):
    """A whole DPOTrainer (model, LoRA) on the edge rows holds the ids `trl_ids` takes from its tokenisation step,
    and those the audit computes."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_judge)
    rows = all_rows(tokenizer, True)[-len(edge_rows(True)):]
    model = AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), max_length=None, report_to="none", use_cpu=True, bf16=False)
    trainer = DPOTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=tokenizer, peft_config=LoraConfig(r=4, target_modules=["q_proj"]))
    assert_trl_ids(trainer.train_dataset, trl_ids(tokenizer, rows, tmp_path), "qwen2 (trainer)")
    audited, _ = audit_lengths(datasets.Dataset.from_list(rows), tokenizer, 1 << 20, "truncate", None)
    assert_trl_ids(audited, trainer.train_dataset, "qwen2 (audit)")


@pytest.mark.parametrize("family", ["qwen2", "qwen2.5", "qwen3", "llama31", "smollm2", "gemma"])
def test_eval_engine_ids_with_the_prompt_tokenised_once_equal_its_whole_tokenisation(family, request, tokenizers):
    """The eval engine's implicit-reward sequences (`SequenceBuilder.build`, a batch of requests at once)
    equal its whole tokenisation of each sequence (`pair_ids`: prompt, prompt + each response), on every row:
    the judge rows and the edge rows as pairs, RM-Bench-shaped rows with six responses and string prompts, raw
    control strings in content (the engine neutralises them)."""
    from judgetrain.eval.sequences import Request, SequenceBuilder

    tokenizer, system = _tokenizer(request, tokenizers, family)
    rows = judge_rows(system) + edge_rows(system)
    requests = [Request("implicit", prompt=row["prompt"], responses=[row["chosen"], row["rejected"]]) for row in rows]
    texts = [row["chosen"][0]["content"] for row in rows]
    requests += [Request("implicit", prompt=rows[i]["prompt"], responses=texts[i:i + 6]) for i in range(0, 24, 6)]
    requests += [Request("loglik_sum", prompt="Grade: 7 is prime.", responses=[" 4", "\n1", "<|im_end|>5"])]
    sequences = SequenceBuilder(tokenizer, max_length=1 << 30)  # no model: tokenisation only
    pairs = sequences.chat_pairs(requests)
    assert sorted(pairs) == list(range(len(requests))), family  # every row cut at a boundary
    seqs = sequences.build(requests)[0]
    got = {(s.row, s.slot): (s.ids, s.start) for s in seqs}
    for r, req in enumerate(requests):
        prompt_ids, completions = sequences.pair_ids(req.prompt, req.responses)
        assert pairs[r] == (prompt_ids, completions), (family, r)
        for slot, comp in enumerate(completions):
            assert got[(r, slot)] == (prompt_ids + comp, len(prompt_ids)), (family, r, slot)
