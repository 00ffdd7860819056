"""`judgetrain bench` at its smallest size: bench.json's structure (keys, types, positive numbers), not timings."""

from __future__ import annotations

import json
import math

import pytest

from judgetrain import bench
from judgetrain.cli import bench as bench_cli


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    rc = bench_cli.main(["--quick", "--output", str(out)])
    assert rc == 0
    return json.loads(out.read_text())


def test_quick_bench_writes_every_summary_ratio_as_a_positive_number(quick_report):
    summary = quick_report["summary"]
    for key in bench.SUMMARY_KEYS:
        assert _positive(summary[key]), (key, summary[key])
    assert isinstance(summary["targets_missed"], list)


def test_quick_bench_records_versions_machine_and_config(quick_report):
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets"):
        assert isinstance(quick_report["versions"][name], str) and quick_report["versions"][name]
    machine = quick_report["machine"]
    assert machine["cpu_count"] >= 1 and isinstance(machine["platform"], str)
    assert "gpu" in machine
    assert quick_report["config"]["quick"] is True
    assert quick_report["config"]["repeats"] == 1
    # the wall time of each part run, which together make up nearly all of the bench's own
    parts = quick_report["part_seconds"]
    assert {"train", "train_shapes", "scale", "eval", "quickstart", "parser", "generation"} == set(parts)
    assert all(_positive(v) for v in parts.values()) and sum(parts.values()) <= quick_report["seconds"]


def test_quick_bench_train_sides_share_one_trainer_config(quick_report):
    train = quick_report["train"]
    assert train["config_match"] is True, train["config_diff"]
    for side in ("judgetrain", "bare_trl"):
        for key in ("samples_per_s", "tokens_per_s", "peak_rss_mb", "train_runtime_s", "wall_s"):
            assert _positive(train[side][key]), (side, key)
        assert len(train[side]["samples_per_s_runs"]) == 1
    assert train["options"] == {}  # the quick size leaves the speed-option runs out
    assert quick_report["config"]["skip_options"] is True


@pytest.mark.parametrize("name", ["rmbench", "judgebias"])
def test_quick_bench_engine_naive_and_plain_engine_scores_agree_and_cache_holds(quick_report, name):
    part = quick_report["eval"][name]
    assert part["checks"]["engine_vs_naive_max_abs_diff"] < 1e-2
    assert part["checks"]["engine_vs_plain_max_abs_diff"] < 1e-4
    assert part["checks"]["rows_compared"] == part["rows"] == quick_report["config"][f"{'eval' if name == 'rmbench' else name}_rows"]
    assert part["responses"] == part["rows"] * (6 if name == "rmbench" else 2)
    assert part["engine_later_epoch"]["stats"]["ref_batches"] == 0
    assert part["engine_first_epoch"]["stats"]["ref_batches"] > 0
    # the engine ran each prompt once: fewer tokens per response than the plain engine and the naive evaluator
    shared = part["engine_first_epoch"]["tokens_per_response"]["real"]
    assert shared < part["plain_first_epoch"]["tokens_per_response"]["real"]
    assert shared < part["naive"]["tokens_per_response"]["real"]
    assert part["engine_first_epoch"]["stats"]["shared_prompts"] > 0
    assert 0 < part["naive"]["padding_efficiency"] <= 1
    summary = quick_report["summary"]
    for epoch in ("first", "later"):
        assert _positive(part[f"speedup_{epoch}_epoch"]) and _positive(summary[f"eval_{name}_speedup_{epoch}_epoch"])
        assert _positive(summary[f"eval_{name}_speedup_vs_plain_engine_{epoch}_epoch"])
        assert _positive(summary[f"eval_{name}_tokens_per_response_engine_{epoch}"])


def test_quick_bench_scale_and_quickstart_parts(quick_report):
    ev = quick_report["eval"]
    assert set(ev["scale"]["seconds"]) == {"1x", "2x", "4x"}
    assert ev["scale"]["tokens"]["4x"] > ev["scale"]["tokens"]["2x"] > ev["scale"]["tokens"]["1x"] > 0
    assert set(quick_report["train_scale"]["train_runtime_s"]) == {"1x", "2x", "4x"}
    assert quick_report["quickstart"]["evals"], "the quickstart run logged no eval runtime"


def test_quick_bench_generation_engine_against_one_prompt_at_a_time(quick_report):
    g = quick_report["generation"]["models"]["tiny_judge"]
    assert g["rows"] == quick_report["config"]["generation_rows"] == 2
    assert g["texts_equal"] is True and g["token_ids_equal_rows"] == 2  # greedy: the same completions both ways
    engine, loop = g["engine"], g["one_at_a_time"]
    assert engine["generated_tokens"] == loop["generated_tokens"] > 0
    assert engine["generated_tokens"] <= 2 * g["max_new_tokens"]
    assert _positive(engine["tokens_per_s"]) and _positive(loop["tokens_per_s"])
    assert g["tokens_per_s_ratio"] == pytest.approx(engine["tokens_per_s"] / loop["tokens_per_s"])
    assert g["engine_stats"]["batches"] == 1 and g["prompt_tokens_mean"] > 100  # JudgeBias-shaped, one batch
    # the two prompts' shared rubric ran once; the third side ran them whole and wrote the same
    assert g["engine_stats"]["shared_prefix_batches"] == 1 and g["engine_stats"]["shared_prefix_tokens"] > 100
    assert g["whole_prompts_texts_equal"] is True and g["engine_whole_prompts"]["generated_tokens"] > 0
    assert g["prefix_sharing_speedup"] == pytest.approx(engine["tokens_per_s"] / g["engine_whole_prompts"]["tokens_per_s"])
    assert quick_report["summary"]["generation_tiny_judge_tokens_per_s_ratio"] == g["tokens_per_s_ratio"]
    assert (quick_report["generation"]["dtype"], g["base_dtype"], g["adapter_dtype"]) == ("float32",) * 3


def test_generation_part_in_bf16_keeps_the_adapter_in_float32(tmp_path):
    """--generation-dtype bfloat16: both sides on bf16 base weights with the adapter in float32, as training holds it."""
    out = tmp_path / "bench.json"
    assert bench_cli.main(["--quick", "--only", "generation", "--generation-dtype", "bfloat16", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    g = report["generation"]["models"]["tiny_judge"]
    assert report["generation"]["dtype"] == "bfloat16"
    assert (g["base_dtype"], g["adapter_dtype"]) == ("bfloat16", "float32")
    assert g["engine"]["generated_tokens"] > 0 and g["one_at_a_time"]["generated_tokens"] > 0
    assert _positive(g["tokens_per_s_ratio"]) and set(report["part_seconds"]) == {"generation"}


def test_cuda_without_a_gpu_exits_with_a_clear_message(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from judgetrain.cli import main  # bad input is caught once, at the `judgetrain` entry

    assert main(["bench", "--device", "cuda", "--output", "/nonexistent/never-written.json"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_real_shape_flops_follow_the_documented_formula():
    fl = bench.flops_per_token(bench.REAL_SHAPES["qwen3-8b"], 2048)
    # Qwen3-8B: ~6.95e9 matmul params in the layers + 0.62e9 in the LM head
    assert 7.4e9 < fl["params_matmul"] < 7.7e9
    attn = 4 * 36 * 4096 * 2048
    assert fl["forward"] == 2 * fl["params_matmul"] + attn
    assert fl["dpo_lora_step"] == 2 * fl["forward"] + 2 * fl["params_matmul"] + 2 * attn


def test_device_code_path_runs_on_a_tiny_shape_on_cpu():
    import torch

    rate = bench.measure_matmul_rate("cpu", torch.float32, n=128, seconds=0.05)
    r = bench.device_bench_shape("tiny", "cpu", torch.float32, seq_len=32, pairs=1, steps=1, warmup=0,
                                 eval_batch=2, peak_flops=rate)
    for key in ("train_tokens_per_s", "train_mfu", "eval_tokens_per_s", "eval_mfu"):
        assert _positive(r[key]), key


def test_device_eval_sharing_path_runs_on_a_tiny_shape_on_cpu():
    import torch

    r = bench.device_bench_eval_sharing("tiny", "cpu", torch.float32, repeats=1,
                                        sets={"judgebias": (2, 24, 2, 8), "rmbench": (1, 6, 6, 16)})
    for name, part in r.items():
        assert _positive(part["speedup"]) and _positive(part["responses_per_s"]), name
        assert part["computed_tokens_per_response"]["shared"] < part["computed_tokens_per_response"]["whole"]
        assert part["max_rel_score_diff"] < 1e-4  # fp32 on CPU: the shared scores equal the whole ones


def test_quick_bench_train_shapes_record_prefix_sharing_against_trl(quick_report):
    shapes = quick_report["train_shapes"]
    assert set(shapes) == {"judgebias", "rmbench"}
    for shape, r in shapes.items():
        for side in ("trl", "prefix_sharing"):
            assert _positive(r[side]["samples_per_s"]) and _positive(r[side]["peak_rss_mb"]), (shape, side)
        tokens = r["tokens_per_response"]
        assert tokens["prefix_sharing"] < tokens["trl"]  # the prompt is computed once per pair, not per response
        assert r["prefix_sharing_stats"]["on"] is True and r["prefix_sharing_stats"]["batches_fallback"] == 0
    jb = shapes["judgebias"]
    assert jb["tokens_per_response"]["prompt_to_completion"] > 1.3  # JudgeBias-shaped: the prompt outweighs the completion
    assert jb["prefix_sharing_stats"]["batches_packed"] > 0
    assert shapes["rmbench"]["tokens_per_response"]["prompt_to_completion"] < 1
    assert quick_report["train"]["judgetrain"]["prefix_sharing"]["on"] is True  # the recipe default


def test_device_prefix_sharing_part_runs_on_a_real_shape_code_path(tmp_path):
    """The `--device cuda` prefix-sharing comparison, on the CPU with the tiny shape (no GPU figures here)."""
    args = bench_cli.resolve_config(bench_cli.build_parser().parse_args(["--quick"]))
    args.prefix_sharing_shapes = ["tiny"]
    args.train_shapes = ["judgebias"]  # the RM-Bench shape runs the same code (the quick bench trains on it)
    tb = bench.TrainBench(args.recipe, tmp_path / "train", args.train_steps, args.train_batch_size, "cpu")
    out = bench.bench_device_prefix_sharing(args, tb, tmp_path / "device", peak_flops=1e9)
    assert set(out["tiny"]) == {"judgebias"}
    r = out["tiny"]["judgebias"]
    assert _positive(r["samples_per_s_ratio"]) and r["prefix_sharing_stats"]["on"] is True
    # each side's MFU over the stated rate: the same pairs' model FLOPs, so their ratio is the samples/s ratio
    assert _positive(r["trl"]["mfu"]) and _positive(r["prefix_sharing"]["mfu"])
    assert r["mfu_ratio"] == pytest.approx(r["samples_per_s_ratio"])
