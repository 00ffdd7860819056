"""`judgetrain data check`: statistics on good data, non-zero exit naming row and field on bad data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from judgetrain.cli import main as cli_main
from judgetrain.data import sample_source

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """A small byte-level BPE tokenizer with a ChatML template, trained on the bundled JudgeBias text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rows = pq.read_table(Path(sample_source("judgebias")) / "train.parquet").to_pylist()
    texts = [r[c] for r in rows for c in ("prompt", "chosen")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=["<|im_start|>", "<|im_end|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.chat_template = CHATML
    out = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(out)
    return str(out)


def test_check_prints_counts_per_split_category_type_and_token_percentiles(tokenizer_dir, capsys):
    rc = cli_main(["data", "check", "--dataset", "judgebias", "--source", "bundled", "--tokenizer", tokenizer_dir])
    out = capsys.readouterr().out
    assert rc == 0
    for text in ("train", "validation", "320", "96", "perturbation_category", "represent", "element_substitution",
                 "llm_to_iupac_100pct", "prompt+chosen", "p95"):
        assert text in out, text


def test_check_rmbench_counts_domains_of_the_real_files(rmbench_real_dir, capsys):
    assert cli_main(["data", "check", "--dataset", "rmbench", "--source", str(rmbench_real_dir)]) == 0
    out = capsys.readouterr().out
    for domain, n in {"chat": 129, "code": 228, "safety-refuse": 284, "safety-response": 157}.items():
        assert domain in out and str(n) in out


def test_check_ideation_pairwise_reports_orders(capsys):
    assert cli_main(["data", "check", "--dataset", "ideation", "--source", "bundled", "--mode", "pairwise"]) == 0
    out = capsys.readouterr().out
    assert "AB" in out and "BA" in out and "test" in out


def test_check_on_corrupted_file_exits_2_naming_row_and_field(tmp_path):
    rows = pq.read_table(Path(sample_source("judgebias")) / "validation.parquet").to_pylist()[:8]
    rows[5]["chosen"] = rows[5]["chosen"][:-3]  # truncated JSON
    path = tmp_path / "validation.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, "-m", "judgetrain.cli", "data", "check", "--dataset", "judgebias",
                           "--source", str(path), "--split", "validation"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert str(path) in proc.stderr and "row 5" in proc.stderr and "'chosen'" in proc.stderr
    assert "malformed JSON" in proc.stderr and "1 of 8 rows are bad" in proc.stderr


def test_check_skip_mode_writes_rejects_and_succeeds(tmp_path, capsys):
    rows = json.loads((Path(sample_source("rmbench")) / "code_filtered.json").read_text())
    rows[2]["chosen"] = rows[2]["chosen"][:2]
    (tmp_path / "code_filtered.json").write_text(json.dumps(rows))
    rejects = tmp_path / "rejects.jsonl"
    assert cli_main(["data", "check", "--dataset", "rmbench", "--source", str(tmp_path)]) == 2
    assert cli_main(["data", "check", "--dataset", "rmbench", "--source", str(tmp_path), "--on_bad_row", "skip",
                     "--rejects_path", str(rejects)]) == 0
    rec = json.loads(rejects.read_text())
    assert (rec["row"], rec["field"]) == (2, "chosen") and "wrong length" in rec["reason"]
    assert "11" in capsys.readouterr().out


def test_check_missing_source_exits_2(tmp_path):
    assert cli_main(["data", "check", "--dataset", "judgebias", "--source", str(tmp_path / "nope.parquet")]) == 2
