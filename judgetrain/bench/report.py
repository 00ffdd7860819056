"""bench.json's summary (one figure per target), the targets and which are missed, and the printed table.
"""

# Late imports: rich (inside the functions that use them): each benchmark part loads only what it measures, and a
# timed side's imports are part of what it times.

from __future__ import annotations

import json
import math

from judgetrain.bench.common import ratio
from judgetrain.bench.eval import EVAL_SETS

SCHEMA_VERSION = 1


SUMMARY_KEYS = (
    "train_samples_per_s_ratio",
    "train_peak_memory_ratio",
    "train_prefix_sharing_peak_memory_ratio",
    "train_prefix_sharing_speedup_judgebias",
    "train_prefix_sharing_speedup_rmbench",
    "train_prefix_sharing_speedup_judgebias_bf16",
    "train_prefix_sharing_peak_memory_ratio_judgebias_bf16",
    "eval_rmbench_speedup_first_epoch",
    "eval_rmbench_speedup_later_epoch",
    "eval_judgebias_speedup_first_epoch",
    "eval_judgebias_speedup_later_epoch",
    "eval_padding_efficiency",
    "eval_scale_2x",
    "eval_scale_4x",
    "quickstart_eval_share",
    "parser_hostile_vs_clean_ratio",
    "parser_pairs_build_hostile_ratio",
    "generation_tiny_judge_tokens_per_s_ratio",
)


TARGETS = {
    "train_samples_per_s_ratio": (">=", 0.97),
    "train_peak_memory_ratio": ("<=", 1.02),  # judgetrain with prefix_sharing off / bare TRL
    "train_prefix_sharing_peak_memory_ratio": ("<=", 1.0),  # judgetrain as run (prefix sharing on) / bare TRL
    "train_prefix_sharing_speedup_judgebias": (">=", 1.3),
    # RM-Bench-shaped rows have nearly nothing to share (a 34-token prompt under two 526-token responses: 3% of the
    # tokens) and the trainer packs none of their batches (TRL's padded forward is cheaper): both sides run the same
    # computation, so the ratio is 1.0 within the spread of rounds (3.95-4.17 samples/s on a quiet machine, +-3%),
    # and 1/0.97 is the most sharing could give. The target asks that sharing costs nothing there, not a gain.
    "train_prefix_sharing_speedup_rmbench": (">=", 0.95),
    "train_prefix_sharing_speedup_judgebias_bf16": (">=", 1.3),  # bf16 weights, as the GPU recipes train
    "train_prefix_sharing_peak_memory_ratio_judgebias_bf16": ("<=", 1.0),
    "eval_rmbench_speedup_first_epoch": (">=", 2.5),
    "eval_rmbench_speedup_later_epoch": (">=", 5.0),
    "eval_judgebias_speedup_first_epoch": (">=", 3.0),
    "eval_judgebias_speedup_later_epoch": (">=", 5.0),
    "eval_padding_efficiency": (">=", 0.9),
    "eval_scale_2x": ("in", (1.8, 2.2)),
    "eval_scale_4x": ("in", (1.8**2, 2.2**2)),
    "train_scale_2x": ("in", (1.8, 2.2)),
    "train_scale_4x": ("in", (1.8**2, 2.2**2)),
    "quickstart_eval_share": ("<=", 0.25),
    "parser_hostile_vs_clean_ratio": ("<=", 20.0),  # slowest hostile family / clean evaluation, 200,000 characters
    "parser_pairs_build_hostile_ratio": ("<=", 2.0),  # build_pairs with 4 hostile evaluations / clean panel
    "checkpoint_marker_overhead": ("<=", 0.25),  # time the marker holds the training / time to write, 2 processes
    "checkpoint_resume_verify_ratio": ("<=", 0.25),  # resume check (the slower of warm and cold) / time to write
    "generation_tiny_judge_tokens_per_s_ratio": (">=", 4.0),  # batched engine / one prompt at a time
    # float32, 8 prompts: one batch of 8 rows on 2 cores; set from a measurement (docs/benchmarks.md, "The SmolLM2
    # generation target"); 16 prompts or bf16 weights give over 4x
    "generation_smollm2_tokens_per_s_ratio": (">=", 3.2),
    "startup_cold_ratio": ("<=", 0.5),  # launch to first step, judgetrain / bare TRL, cold
    "startup_cold_peak_tree_pss_ratio": ("<=", 1.0),  # the start's processes' peak memory, judgetrain / bare TRL
    "startup_resume_s": ("<=", 60.0),  # a resume's launch to its first new step, seconds
    "perturb_seconds_per_34000": ("<=", 60.0),  # judgetrain perturb, rule operators, 34,000 items on one core
    "evidence_share_of_eval": ("<=", 0.02),  # intervals + paired deltas at 10,000 rows / that eval's time
    "judge_tiny_judge_evaluations_per_s_ratio": (">=", 4.0),  # judgetrain judge / a one-item generate loop
    "judge_smollm2_135m_instruct_evaluations_per_s_ratio": (">=", 4.0),
    # the reward over a GRPO group of 8 / a per-completion loop, SmolLM2; chat: a short request and long answers
    "reward_smollm2_chat_rewards_per_s_ratio": (">=", 3.0),
    "reward_smollm2_judge_rewards_per_s_ratio": (">=", 3.0),  # a generative judge's GRPO: a long judge prompt
}


def _meets(key: str, value: float) -> bool | None:
    if key not in TARGETS or value is None or not math.isfinite(value):
        return None
    op, t = TARGETS[key]
    if op == ">=":
        return value >= t
    if op == "<=":
        return value <= t
    return t[0] <= value <= t[1]


def _target_text(key: str) -> str:
    if key not in TARGETS:
        return ""
    op, t = TARGETS[key]
    return f"{t[0]:.2f}-{t[1]:.2f}" if op == "in" else f"{op} {t}"


def print_table(report: dict) -> None:
    """The report as one table of figures (A, B, A/B against its target), the device shapes' table, the summary."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"judgetrain bench ({report['config']['device']}, load {report.get('load_average')})")
    for col in ("figure", "A", "B", "A/B", "target", "ok"):
        table.add_column(col)

    def row(name, a, b, r, key=None):
        ok = _meets(key, r) if key else None
        table.add_row(name, a, b, f"{r:.3f}" if isinstance(r, float) and math.isfinite(r) else "-",
                      _target_text(key) if key else "", {True: "yes", False: "NO", None: ""}[ok])

    for part in (_train_rows, _shape_rows, _eval_rows, _scale_rows, _parser_rows, _generation_rows):
        part(row, report)
    console.print(table)
    if report.get("device_bench"):
        console.print(_device_table(report))
    console.print(f"summary: {json.dumps(report['summary'])}")


def _train_rows(row, report: dict) -> None:
    """judgetrain's training against bare TRL's, and each option on against off."""
    tr = report.get("train")
    if tr:
        jt, bt = tr["judgetrain"], tr["bare_trl"]
        row("train samples/s (judgetrain / bare TRL)", f"{jt['samples_per_s']:.2f}", f"{bt['samples_per_s']:.2f}",
            tr["samples_per_s_ratio"], "train_samples_per_s_ratio")
        row("train tokens/s", f"{jt['tokens_per_s']:.0f}", f"{bt['tokens_per_s']:.0f}", tr["samples_per_s_ratio"])
        un = tr["judgetrain_unshared"]
        row("train samples/s (judgetrain prefix_sharing off / bare)", f"{un['samples_per_s']:.2f}",
            f"{bt['samples_per_s']:.2f}", tr["unshared_samples_per_s_ratio"])
        row("train peak RSS MB (judgetrain prefix_sharing off / bare)", f"{un['peak_rss_mb']:.0f}",
            f"{bt['peak_rss_mb']:.0f}", tr["peak_memory_ratio"], "train_peak_memory_ratio")
        row("train peak RSS MB (judgetrain / bare)", f"{jt['peak_rss_mb']:.0f}", f"{bt['peak_rss_mb']:.0f}",
            tr["prefix_sharing_peak_memory_ratio"], "train_prefix_sharing_peak_memory_ratio")
        row("train call wall s (setup incl.)", f"{jt['wall_s']:.1f}", f"{bt['wall_s']:.1f}", tr["wall_ratio"])
        for opt, o in tr.get("options", {}).items():
            row(f"option {opt}: samples/s (on / off)", f"{o['on']['samples_per_s']:.2f}", f"{o['plain']['samples_per_s']:.2f}",
                o["samples_per_s_ratio"])
            row(f"option {opt}: wall, peak RSS (on / off)", f"{o['on']['wall_s']:.1f}s {o['on']['peak_rss_mb']:.0f}MB",
                f"{o['plain']['wall_s']:.1f}s {o['plain']['peak_rss_mb']:.0f}MB", o["peak_memory_ratio"])


def _shape_rows(row, report: dict) -> None:
    """Prefix sharing against TRL's forward on each real-size row shape, float32 and bf16."""
    for tag, part in (("", "train_shapes"), ("_bf16", "train_shapes_bf16")):
        for shape, sh in (report.get(part) or {}).items():
            a, b, t = sh["prefix_sharing"], sh["trl"], sh["tokens_per_response"]
            label = f"train {shape}-shaped" + (" bf16" if tag else "")
            row(f"{label} samples/s (prefix sharing / TRL)", f"{a['samples_per_s']:.2f}", f"{b['samples_per_s']:.2f}",
                sh["samples_per_s_ratio"], f"train_prefix_sharing_speedup_{shape}{tag}")
            row(f"{label} tokens per response", f"{t['prefix_sharing']:.0f}", f"{t['trl']:.0f}", t["ratio"])
            row(f"{label} peak RSS MB", f"{a['peak_rss_mb']:.0f}", f"{b['peak_rss_mb']:.0f}", sh["peak_memory_ratio"],
                f"train_prefix_sharing_peak_memory_ratio_{shape}{tag}" if tag else None)


def _eval_rows(row, report: dict) -> None:
    """Each eval suite's engine against the naive evaluator and the plain engine."""
    ev = report.get("eval") or {}
    for name in EVAL_SETS:
        part = ev.get(name)
        if not part:
            continue
        nv = part["naive"]
        for key, label in (("engine_first_epoch", "first"), ("engine_later_epoch", "later")):
            e, w = part[key], part[key.replace("engine", "plain")]
            row(f"eval {name} {label} epoch responses/s (engine / naive)", f"{e['responses_per_s']:.1f}",
                f"{nv['responses_per_s']:.1f}", part[f"speedup_{label}_epoch"], f"eval_{name}_speedup_{label}_epoch")
            row(f"eval {name} {label} epoch responses/s (engine / plain engine)", f"{e['responses_per_s']:.1f}",
                f"{w['responses_per_s']:.1f}", part[f"speedup_vs_plain_{label}_epoch"])
            row(f"eval {name} {label} epoch tokens computed per response (engine / naive)",
                f"{e['tokens_per_response']['computed']:.0f}", f"{nv['tokens_per_response']['computed']:.0f}",
                ratio(e["tokens_per_response"]["computed"], nv["tokens_per_response"]["computed"]))
        row(f"eval {name} real/padded tokens (engine, naive)", f"{part['engine_first_epoch']['padding_efficiency']:.3f}",
            f"{nv['padding_efficiency']:.3f}", part["engine_first_epoch"]["padding_efficiency"],
            "eval_padding_efficiency" if name == "rmbench" else None)


def _scale_rows(row, report: dict) -> None:
    """Eval and train time at 2x and 4x the size, and the quickstart's eval share."""
    ev = report.get("eval") or {}
    if ev.get("scale"):
        sc = ev["scale"]
        row("eval time 2x rows / 1x", f"{sc['seconds']['2x']:.2f}s", f"{sc['seconds']['1x']:.2f}s", sc["scale_2x"], "eval_scale_2x")
        row("eval time 4x rows / 1x", f"{sc['seconds']['4x']:.2f}s", f"{sc['seconds']['1x']:.2f}s", sc["scale_4x"], "eval_scale_4x")
    ts = report.get("train_scale")
    if ts:
        t = ts["train_runtime_s"]
        row("train time 2x steps / 1x", f"{t['2x']:.2f}s", f"{t['1x']:.2f}s", ts["scale_2x"], "train_scale_2x")
        row("train time 4x steps / 1x", f"{t['4x']:.2f}s", f"{t['1x']:.2f}s", ts["scale_4x"], "train_scale_4x")
    qs = report.get("quickstart")
    if qs:
        row("quickstart eval share of epoch, first (eval s, epoch train s)", f"{qs['eval_seconds_first']:.1f}s",
            f"{qs['epoch_train_seconds']:.1f}s", qs["eval_share_first_epoch"])
        row("quickstart eval share of epoch, later (eval s, epoch train s)", f"{qs['eval_seconds_later']:.1f}s",
            f"{qs['epoch_train_seconds']:.1f}s", qs["eval_share_later_epoch"])
        row(f"quickstart eval share of the whole {report['config']['quickstart_epochs']}-epoch run", "", "",
            qs["eval_share"], "quickstart_eval_share")


def _parser_rows(row, report: dict) -> None:
    """The score parser and pairs build on hostile text against clean text."""
    pr = report.get("parser")
    if pr:
        row(f"parser CPU s, slowest hostile family ({pr['slowest_family']}) / clean, {pr['chars']:,} chars",
            f"{pr['slowest_cpu_s']:.4f}", f"{pr['clean_cpu_s']:.4f}", pr["hostile_vs_clean_ratio"],
            "parser_hostile_vs_clean_ratio")
        for name, key in (("pairs_build", "parser_pairs_build_hostile_ratio"), ("pairs_build_bundled_panel", None)):
            pb = pr.get(name)
            if pb:
                row(f"pairs build CPU s, {pb['hostile_evaluations']} hostile / clean, {pb['evaluations']} evaluations",
                    f"{pb['cpu_s']['hostile']:.3f}", f"{pb['cpu_s']['clean']:.3f}", pb["hostile_vs_clean_ratio"], key)


def _generation_rows(row, report: dict) -> None:
    """Batched generation (and vLLM) against one prompt at a time."""
    for label, g in ((report.get("generation") or {}).get("models") or {}).items():
        if "skipped" in g:
            continue
        e, n = g["engine"], g["one_at_a_time"]
        row(f"generation {label} ({g.get('base_dtype', 'float32')}) tokens/s (batched engine / one at a time), "
            f"texts equal: {g['texts_equal']}",
            f"{e['tokens_per_s']:.1f}", f"{n['tokens_per_s']:.1f}", g["tokens_per_s_ratio"],
            f"generation_{label}_tokens_per_s_ratio")
        v = g.get("vllm") or {}
        if "tokens_per_s" in v:
            row(f"generation {label} tokens/s (vLLM backend / one at a time), token ids equal: "
                f"{v['token_ids_equal_rows']} of {g['rows']}", f"{v['tokens_per_s']:.1f}", f"{n['tokens_per_s']:.1f}",
                v["tokens_per_s_ratio"], f"generation_{label}_vllm_tokens_per_s_ratio")


def _device_table(report: dict):
    """The real shapes measured on the device: tokens/s and MFU of training and eval."""
    from rich.table import Table

    dev = report["device_bench"]
    t2 = Table(title=f"real shapes on {report['machine'].get('gpu') or report['config']['device']} "
                     f"(bf16 matmul {dev['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s)")
    for col in ("shape", "train tok/s", "train MFU", "peak GPU MB", "eval tok/s", "eval MFU"):
        t2.add_column(col)
    for name, r in dev["shapes"].items():
        t2.add_row(name, f"{r['train_tokens_per_s']:.0f}", f"{100 * r['train_mfu']:.1f}%",
                   f"{r.get('train_peak_gpu_mb', float('nan')):.0f}", f"{r['eval_tokens_per_s']:.0f}",
                   f"{100 * r['eval_mfu']:.1f}%")
    return t2


def jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def summarize(report: dict) -> dict:
    s = _main_figures(report)
    _checkpoint_figures(s, report.get("checkpoint"))
    _eval_set_figures(s, report.get("eval") or {})
    _generation_and_option_figures(s, report)
    _device_figures(s, report.get("device_bench"))
    _startup_figures(s, report.get("startup"))
    if report.get("perturb"):
        s["perturb_seconds_per_34000"] = report["perturb"]["seconds_per_34000"]
    if report.get("evidence"):
        s["evidence_share_of_eval"] = report["evidence"]["share_of_eval"]
    for name, sp in ((report.get("judge") or {}).get("speed") or {}).items():
        if "evaluations_per_s_ratio" in sp:  # a model that could not load is reported as skipped
            s[f"judge_{name.replace('-', '_')}_evaluations_per_s_ratio"] = sp["evaluations_per_s_ratio"]
    for label, r in ((report.get("reward") or {}).get("models") or {}).items():
        for group, g in r.items():  # a model that could not load is reported as skipped
            if isinstance(g, dict) and "rewards_per_s_ratio" in g:
                s[f"reward_{label}_{group}_rewards_per_s_ratio"] = g["rewards_per_s_ratio"]
    s["targets_missed"] = sorted(k for k, v in s.items() if _meets(k, v) is False)
    return s


def _main_figures(report: dict) -> dict:
    """The training, eval, quickstart and parser ratios every report has (None where a part was not run)."""
    tr, ev, qs, ts = (report.get(k) or {} for k in ("train", "eval", "quickstart", "train_scale"))
    pr = report.get("parser") or {}
    shapes = report.get("train_shapes") or {}
    shapes_bf16 = report.get("train_shapes_bf16") or {}
    s = {
        "train_samples_per_s_ratio": tr.get("samples_per_s_ratio"),
        "train_unshared_samples_per_s_ratio": tr.get("unshared_samples_per_s_ratio"),
        "train_peak_memory_ratio": tr.get("peak_memory_ratio"),
        "train_prefix_sharing_peak_memory_ratio": tr.get("prefix_sharing_peak_memory_ratio"),
        **{f"train_prefix_sharing_speedup_{k}": v["samples_per_s_ratio"] for k, v in shapes.items()},
        **{f"train_tokens_per_response_ratio_{k}": v["tokens_per_response"]["ratio"] for k, v in shapes.items()},
        **{f"train_prefix_sharing_speedup_{k}_bf16": v["samples_per_s_ratio"] for k, v in shapes_bf16.items()},
        **{f"train_prefix_sharing_peak_memory_ratio_{k}_bf16": v["peak_memory_ratio"] for k, v in shapes_bf16.items()},
        "train_wall_ratio": tr.get("wall_ratio"),
        "eval_padding_efficiency": ((ev.get("rmbench") or {}).get("engine_first_epoch") or {}).get("padding_efficiency"),
        "eval_padding_efficiency_naive": ((ev.get("rmbench") or {}).get("naive") or {}).get("padding_efficiency"),
        "eval_scale_2x": (ev.get("scale") or {}).get("scale_2x"),
        "eval_scale_4x": (ev.get("scale") or {}).get("scale_4x"),
        "train_scale_2x": ts.get("scale_2x"),
        "train_scale_4x": ts.get("scale_4x"),
        "quickstart_eval_share": qs.get("eval_share"),
        "quickstart_eval_share_first_epoch": qs.get("eval_share_first_epoch"),
        "quickstart_eval_share_later_epoch": qs.get("eval_share_later_epoch"),
        "parser_hostile_vs_clean_ratio": pr.get("hostile_vs_clean_ratio"),
        "parser_pairs_build_hostile_ratio": (pr.get("pairs_build") or {}).get("hostile_vs_clean_ratio"),
    }
    return s


def _checkpoint_figures(s: dict, ck: dict | None) -> None:
    """The checkpoint markers' overhead and the resume check's cost, old and new."""
    if ck:
        s["checkpoint_marker_overhead"], s["checkpoint_resume_verify_ratio"] = ck["marker_overhead"], ck["resume_verify_ratio"]
        s["checkpoint_marker_overhead_old"] = ck["old"]["mark_blocking_ratio"]
        s["checkpoint_marker_latency_ratio"] = ck["new"]["mark_ratio"]  # until the marker is written (background)
        s["checkpoint_resume_verify_ratio_old"] = max(ck["old"]["verify_warm_ratio"], ck["old"]["verify_cold_ratio"])


def _eval_set_figures(s: dict, ev: dict) -> None:
    """Per eval set: the engine's speedups and the tokens computed per response."""
    for name in EVAL_SETS:
        part = ev.get(name) or {}
        for epoch in ("first", "later"):
            s[f"eval_{name}_speedup_{epoch}_epoch"] = part.get(f"speedup_{epoch}_epoch")
            s[f"eval_{name}_speedup_vs_plain_engine_{epoch}_epoch"] = part.get(f"speedup_vs_plain_{epoch}_epoch")
        for side in ("naive", "engine_first_epoch", "engine_later_epoch"):
            tokens = (part.get(side) or {}).get("tokens_per_response") or {}
            s[f"eval_{name}_tokens_per_response_{side.replace('_epoch', '')}"] = tokens.get("computed")


def _generation_and_option_figures(s: dict, report: dict) -> None:
    """Generation's tokens per second against the plain loop (vLLM's too), and each training option's cost."""
    tr = report.get("train") or {}
    for label, g in ((report.get("generation") or {}).get("models") or {}).items():
        s[f"generation_{label}_tokens_per_s_ratio"] = g.get("tokens_per_s_ratio")
        if "tokens_per_s_ratio" in (g.get("vllm") or {}):
            s[f"generation_{label}_vllm_tokens_per_s_ratio"] = g["vllm"]["tokens_per_s_ratio"]
    for opt, o in (tr.get("options") or {}).items():
        s[f"option_{opt}_samples_per_s_ratio"] = o["samples_per_s_ratio"]
        s[f"option_{opt}_peak_memory_ratio"] = o["peak_memory_ratio"]


def _device_figures(s: dict, dev: dict | None) -> None:
    """The device bench: MFU per shape, eval sharing's speedups and prefix sharing on the GPU."""
    if dev:
        for name, r in dev["shapes"].items():
            s[f"gpu_{name}_train_mfu"] = r["train_mfu"]
            s[f"gpu_{name}_eval_mfu"] = r["eval_mfu"]
            for set_name, e in (r.get("eval_sharing") or {}).items():
                s[f"gpu_{name}_eval_{set_name}_sharing_speedup"] = e["speedup"]
        for name, shapes in (dev.get("prefix_sharing") or {}).items():
            for shape, r in shapes.items():
                s[f"train_gpu_prefix_sharing_speedup_{shape}_{name}"] = r["samples_per_s_ratio"]
                gpu = (r["prefix_sharing"].get("peak_gpu_mb"), r["trl"].get("peak_gpu_mb"))
                if all(gpu):
                    s[f"train_gpu_prefix_sharing_peak_memory_ratio_{shape}_{name}"] = ratio(*gpu)


def _startup_figures(s: dict, st: dict | None) -> None:
    """The cold start and resume against a bare script, with their memory."""
    if st:
        s["startup_cold_ratio"] = st["cold_ratio"]
        if "resume_s" in st:  # --startup-cold-only runs no resume
            s.update(startup_resume_ratio=st["resume_ratio"], startup_resume_s=st["resume_s"])
        for key in ("cold_peak_rss_ratio", "cold_peak_tree_pss_ratio"):
            if key in st:  # reports written before the memory was measured have none
                s[f"startup_{key}"] = st[key]
