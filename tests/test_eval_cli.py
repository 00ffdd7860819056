"""`judgetrain eval` on real RM-Bench rows: 1 process vs 2 processes (accelerate launch --cpu), run dirs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from helpers import free_port, read_jsonl, run

SMALL = dict(vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024)
ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory with two LoRA checkpoints (different adapters on one base) and a final adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from judgetrain.models.tiny import build_tiny_judge

    root = tmp_path_factory.mktemp("evalcli")
    base = build_tiny_judge(root / "base", seed=0, config=SMALL)
    run_path = root / "run"
    for step, seed in ((2, 1), (4, 2), (None, 2)):
        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                               LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        model.save_pretrained(run_path / f"checkpoint-{step}" if step else run_path)
    return run_path


@pytest.fixture(scope="module")
def eval_args(rmbench_real_dir) -> list[str]:
    """The real RM-Bench rows (skipped when ../shared is not beside the repository), 7 rows, short sequences."""
    return ["--eval_suites", "rmbench", "--eval_rmbench_source", str(rmbench_real_dir), "--eval_max_rows", "7",
            "--max-length", "384", "--eval_batch_tokens", "2048"]


def _rows(out: Path, name: str) -> list[dict]:
    return read_jsonl(out / name / "rmbench.jsonl")


@pytest.fixture(scope="module")
def one_process(run_dir, eval_args, tmp_path_factory):
    """One process scoring every sequence whole, LoRA unmerged: the reference the default runs are compared with."""
    out = tmp_path_factory.mktemp("one")
    one = run([sys.executable, "-m", "judgetrain.cli.eval", "--model", run_dir / "checkpoint-2", *eval_args,
               "--no_eval_prefix_sharing", "--no_eval_merge_lora", "--output-dir", out], env=ENV, timeout=300)
    assert "RM-Bench" in one.stdout and "overall" in one.stdout
    return out


def _launch(processes: int) -> list:
    # `accelerate launch --cpu --num_processes N` starts ONE process in accelerate 1.15 (multi-CPU needs mpirun);
    # the torchrun-based launcher starts N, which join over gloo (judgetrain.cli.eval passes cpu=True)
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", processes,
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", free_port()] if processes > 1 else [sys.executable]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2, 3])
def test_n_processes_sharing_prompts_give_the_same_metrics_and_rows_as_one_scoring_whole(run_dir, eval_args, one_process,
                                                                                          tmp_path, processes):
    run([*_launch(processes), "-m", "judgetrain.cli.eval", "--model", run_dir / "checkpoint-2", *eval_args,
         "--output-dir", tmp_path / "many"], env=ENV, timeout=300)
    res1 = json.loads((one_process / "checkpoint-2" / "results.json").read_text())
    resn = json.loads((tmp_path / "many" / "checkpoint-2" / "results.json").read_text())
    assert res1["num_processes"] == 1 and resn["num_processes"] == processes
    # both paths ran: prompts shared, and the responses whose prompt --max-length cut alone scored whole
    assert res1["engine"]["shared_prompts"] == 0
    assert resn["engine"]["shared_prompts"] > 0 and resn["engine"]["whole_sequences"] > 0
    rows1, rowsn = _rows(one_process, "checkpoint-2"), _rows(tmp_path / "many", "checkpoint-2")
    assert len(rows1) == len(rowsn) == 7  # 7 rows over 2 or 3 processes: every row once, none padded in
    assert [r["id"] for r in rows1] == [r["id"] for r in rowsn]
    for a, b in zip(rows1, rowsn):
        assert a["score_chosen"] == pytest.approx(b["score_chosen"], rel=1e-4, abs=1e-4)
        assert a["score_rejected"] == pytest.approx(b["score_rejected"], rel=1e-4, abs=1e-4)
    assert res1["metrics"].keys() == resn["metrics"].keys()
    for key, value in res1["metrics"].items():
        if not key.endswith("runtime"):  # accuracies exactly; style spread is in score units, as close as the scores
            tol = dict(rel=1e-4, abs=1e-4) if "style_spread" in key else dict(abs=1e-9)
            assert resn["metrics"][key] == pytest.approx(value, **tol), key
    assert res1["results"]["rmbench"]["domains"] == ["chat", "code", "safety"]  # math is not in the shared copy


def test_run_dir_evaluates_each_checkpoint_and_reuses_the_reference(run_dir, eval_args, tmp_path):
    from judgetrain.cli.eval import main

    assert main(["--model", str(run_dir), *eval_args, "--output-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary) == ["checkpoint-2", "checkpoint-4", "final"]
    engines = [json.loads((tmp_path / n / "results.json").read_text())["engine"] for n in summary]
    assert engines[0]["ref_sequences_computed"] == 42 and engines[1]["ref_sequences_computed"] == 0
    assert engines[1]["ref_batches"] == 0 and engines[2]["ref_batches"] == 0
    # checkpoint-4 and the final adapter hold the same weights (same seed), checkpoint-2 others
    assert summary["checkpoint-4"] == pytest.approx({**summary["final"], **{k: summary["checkpoint-4"][k]
                                                     for k in summary["final"] if k.endswith("runtime")}})
    assert _rows(tmp_path, "checkpoint-2")[0]["score_chosen"] != _rows(tmp_path, "checkpoint-4")[0]["score_chosen"]


def test_the_base_evaluated_alone_is_the_reference_of_an_adapter_on_it(run_dir, eval_args, tmp_path):
    """`judgetrain eval` of the base writes its log-probs as eval_reference.json; an adapter's evaluation given that
    file (--reference_logprobs) subtracts them instead of scoring the base again: no reference forward, the same
    implicit scores. Another dtype, or no such file, is refused naming the option."""
    from judgetrain.cli.eval import main
    from judgetrain.utils.errors import BadInputError

    base, adapter = run_dir.parent / "base", run_dir / "checkpoint-2"
    modes = ["--eval_scoring", "implicit", "loglik_sum"]
    assert main(["--model", str(base), *eval_args, *modes, "--output-dir", str(tmp_path / "base")]) == 0
    [saved] = (tmp_path / "base").glob("*/eval_reference.json")
    doc = json.loads(saved.read_text())
    assert doc["dtype"] == "float32" and len(doc["values"]) == 42  # 7 rows x 6 responses, one forward each
    runs = {}
    for name, extra in (("again", []), ("read", ["--reference_logprobs", str(saved)])):
        out = tmp_path / name
        assert main(["--model", str(base), "--adapter", str(adapter), *eval_args, *modes, *extra,
                     "--output-dir", str(out)]) == 0
        [folder] = [p for p in out.iterdir() if p.is_dir()]
        runs[name] = (json.loads((folder / "results.json").read_text())["engine"], read_jsonl(folder / "rmbench.jsonl"))
    assert runs["again"][0]["ref_sequences_computed"] == 42 and runs["again"][0]["ref_batches"] > 0
    assert runs["read"][0]["ref_sequences_computed"] == 0 and runs["read"][0]["ref_batches"] == 0
    assert runs["read"][0]["ref_cache_hits"] == 42
    for a, b in zip(runs["again"][1], runs["read"][1]):
        assert a["id"] == b["id"] and abs(a["score_chosen"][0]) < 50  # a log-ratio, not a summed log-likelihood
        assert b["score_chosen"] == pytest.approx(a["score_chosen"], abs=1e-4)
        assert b["score_rejected"] == pytest.approx(a["score_rejected"], abs=1e-4)
    with pytest.raises(BadInputError, match="scored in float32, this evaluation in bfloat16"):
        main(["--model", str(base), "--adapter", str(adapter), *eval_args, *modes, "--dtype", "bfloat16",
              "--reference_logprobs", str(saved), "--output-dir", str(tmp_path / "bf16")])
    with pytest.raises(BadInputError, match="--reference_logprobs .*: no such file"):
        main(["--model", str(base), "--adapter", str(adapter), *eval_args, "--reference_logprobs",
              str(tmp_path / "none.json"), "--output-dir", str(tmp_path / "none")])


@pytest.mark.slow
def test_two_processes_write_the_base_reference_of_every_row_and_read_it(run_dir, eval_args, tmp_path):
    """Each process scores its share of the rows; the base's reference file gathers every share (the same log-probs
    as one process writes), and an adapter's evaluation in two processes reads it instead of scoring the base."""
    base, adapter = run_dir.parent / "base", run_dir / "checkpoint-2"
    modes = ["--eval_scoring", "implicit", "loglik_sum"]
    files = {}
    for processes in (1, 2):
        out = tmp_path / f"base-{processes}"
        run([*_launch(processes), "-m", "judgetrain.cli.eval", "--model", base, *eval_args, *modes,
             "--output-dir", out], env=ENV, timeout=300)
        [saved] = out.glob("*/eval_reference.json")
        files[processes] = saved
    one, two = (json.loads(files[n].read_text())["values"] for n in (1, 2))
    assert len(one) == 42 and two.keys() == one.keys()  # 7 rows x 6 responses, each from the process that scored it
    for key, value in one.items():
        assert two[key] == pytest.approx(value, rel=1e-4, abs=1e-4), key
    out = tmp_path / "adapter"
    run([*_launch(2), "-m", "judgetrain.cli.eval", "--model", base, "--adapter", adapter, *eval_args, *modes,
         "--reference_logprobs", files[2], "--output-dir", out], env=ENV, timeout=300)
    [folder] = [p for p in out.iterdir() if p.is_dir()]
    engine = json.loads((folder / "results.json").read_text())["engine"]
    assert engine["ref_sequences_computed"] == 0 and engine["ref_batches"] == 0
