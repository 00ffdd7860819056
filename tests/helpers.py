"""Shared test helpers: the repository root, the shared data folder, and launching judgetrain as a user does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "recipes" / "quickstart.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, *, env=None, timeout=900, check=True, cwd=REPO) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {cmd}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
                             f"{proc.stderr[-8000:]}")
    return proc


def accelerate_launch(config: str, module_args, *, port: int | None = None, **kw) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file accelerate_configs/<config> -m judgetrain.train ...`, as the README writes it
    (a free rendezvous port is added so that launches of parallel test runs do not meet on the default one)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", REPO / "accelerate_configs" / config]
    if port is not None or config != "single_gpu.yaml":
        cmd += ["--main_process_port", port or free_port()]
    return run(cmd + ["-m", "judgetrain.train", *module_args], **kw)


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def train_on_pairs(pairs: Path, run_dir: Path) -> subprocess.CompletedProcess:
    """4 DPO steps of the quickstart recipe on a `judgetrain pairs build` folder (no eval): the loop's training step.
    Asserts the run ended well and logged 4 finite, plausible losses."""
    proc = subprocess.run([sys.executable, "-m", "judgetrain.train", "recipes/quickstart.yaml", "--train_datasets",
                           f"{{dataset: judgebias, source: {pairs}, split: train}}", "--eval_suites", "none",
                           "--output_dir", str(run_dir), "--max_steps", "4", "--per_device_train_batch_size", "2",
                           "--logging_steps", "1", "--save_steps", "4", "--warmup_steps", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = [m["train/loss"] for m in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in m]
    assert len(losses) == 4 and all(0 < x < 2 for x in losses), losses
    return proc


def check_report(run_dir, out):
    """judgetrain report on a real run: the files, decodable PNGs, every image embedded, table values == metrics.jsonl."""
    import base64
    import re

    from matplotlib.image import imread

    from judgetrain.report.build import make_report

    paths = make_report([run_dir], out)
    html = (out / "report.html").read_text()
    pngs = sorted(p for name, p in paths.items() if name.endswith(".png"))
    assert pngs and "train_curves.png" in paths
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(embedded) == len(pngs)
    for png in pngs:
        img = imread(png)
        assert img.shape[0] >= 300 and img.shape[1] >= 400 and img.shape[2] in (3, 4), png
        assert base64.b64encode(png.read_bytes()).decode() in embedded, png
    last = {}
    for record in read_jsonl(Path(run_dir) / "metrics.jsonl"):
        last.update({k: v for k, v in record.items() if k.startswith("eval/")})
    summary = json.loads((out / "summary.json").read_text())
    return paths, html, summary, last


# What a dry run of a documented command refuses on this test machine alone: an 8B model that is not in the offline
# hub cache, DeepSpeed (not installed here), the disk for an 8B model's checkpoints, an output_dir that a test's
# earlier run already used.
# "is in use by another judgetrain run": the suite's own runs share runs/quickstart with the docs' dry runs
MACHINE_REFUSALS = ("not in the local Hugging Face cache", "the deepspeed package is not installed", " GiB free, ",
                    "already holds a run", "is in use by another judgetrain run")


def dry_run_verdict_holds(code: int, report: dict) -> bool:
    """A dry run's exit code is its verdict: 0 with no problem, else 2 and every problem one this machine causes."""
    problems = report.get("preflight") or []
    if report.get("exit_code") != code:
        return False
    if code == 0:
        return not problems
    return code == 2 and bool(problems) and all(any(m in p for m in MACHINE_REFUSALS) for p in problems)


EXTENDED = "JUDGETRAIN_TEST_EXTENDED"  # runs the tests marked `extended` (tests/conftest.py)


def extended_run() -> bool:
    """Whether the extended tests run (a test's optional extra runs read this too)."""
    return bool(os.environ.get(EXTENDED))


class _CountingPattern:
    """A compiled pattern that adds to ``tally[0]`` the characters each call covered (a failed anchored match: 1;
    a search or finditer: every character from ``pos`` to its match or to the end)."""

    def __init__(self, pattern, tally):
        self.pattern, self.tally = pattern, tally

    def __getattr__(self, name):
        return getattr(self.pattern, name)

    def _anchored(self, how, string, pos=0, *rest):
        m = getattr(self.pattern, how)(string, pos, *rest)
        self.tally[0] += (m.end() - pos if m else 0) + 1
        return m

    def match(self, string, pos=0, *rest):
        return self._anchored("match", string, pos, *rest)

    def fullmatch(self, string, pos=0, *rest):
        return self._anchored("fullmatch", string, pos, *rest)

    def search(self, string, pos=0, *rest):
        m = self.pattern.search(string, pos, *rest)
        self.tally[0] += (m.end() if m else len(string)) - pos + 1
        return m

    def finditer(self, string, pos=0, *rest):
        yield from self.pattern.finditer(string, pos, *rest)
        self.tally[0] += len(string) - pos + 1


def parser_work(module, fn, text) -> int:
    """The work ``fn(text)`` does, counted, not timed: Python lines run in ``module``'s file plus the characters its
    module-level compiled patterns covered (str.find is not counted). A linear parser's work grows with the text;
    a quadratic one's with its square."""
    import re

    tally = [0]
    saved = {}
    for name, value in vars(module).items():
        if isinstance(value, re.Pattern):
            saved[name] = value
        elif isinstance(value, dict) and value and all(isinstance(v, re.Pattern) for v in value.values()):
            saved[name] = value
    for name, value in saved.items():
        setattr(module, name, {k: _CountingPattern(v, tally) for k, v in value.items()} if isinstance(value, dict)
                else _CountingPattern(value, tally))
    source = module.__file__

    def trace(frame, event, arg):
        if frame.f_code.co_filename != source:
            return None
        if event == "line":
            tally[0] += 1
        return trace

    sys.settrace(trace)
    try:
        fn(text)
    finally:
        sys.settrace(None)
        for name, value in saved.items():
            setattr(module, name, value)
    return tally[0]


def unbounded_repeats(pattern) -> list[str]:
    """The quantifiers of a compiled pattern with no upper bound (``*``, ``+``, ``{n,}``), read from its parse tree."""
    import re

    parser = re._parser  # the parser the re module compiles with (sre_parse before 3.11)
    found = []

    def walk(items):
        for op, av in items:
            if op in (parser.MAX_REPEAT, parser.MIN_REPEAT):
                lo, hi, sub = av
                if hi == parser.MAXREPEAT:
                    found.append(f"{op} {lo}..")
                walk(sub)
            elif op == parser.SUBPATTERN:
                walk(av[-1])
            elif op == parser.BRANCH:
                for sub in av[1]:
                    walk(sub)
            elif op in (parser.ASSERT, parser.ASSERT_NOT):
                walk(av[1])

    walk(parser.parse(pattern.pattern, pattern.flags))
    return found


# What a dry run of a shipped recipe must refuse on the machine the test runs on, by kind, each worked out here from
# the environment (not from the preflight's own code): the line that names each kind.
REFUSAL_KINDS = {"hub": "not in the local Hugging Face cache", "deepspeed": "the deepspeed package is not installed",
                 "disk": " GiB free, "}
GIB = 1024**3
# Full fine-tune parameter counts from the models' published config.json (untied embeddings). Qwen3-8B: embed and
# lm_head 151,936 x 4,096 x 2 = 1,244,659,712; a layer: q, o 4,096 x 4,096 each, k, v 4,096 x 1,024 each
# (41,943,040), MLP 3 x 4,096 x 12,288 (150,994,944), two norms of 4,096 and q/k norms of 128 (8,448):
# 192,946,432 x 36 layers = 6,946,071,552; final norm 4,096: 8,190,735,360 in all.
FULL_PARAMS = {"Qwen/Qwen3-8B": 8_190_735_360}
# The largest LoRA checkpoint of the shipped recipes: r 64 on the 7 projections, r x (in + out) each, x 12 bytes
# (fp32 weights + Adam m, v). Qwen3-8B: 4,521,984 a layer x 36 = 162.8M; Llama-3.1-8B: 5,242,880 x 32 = 167.8M:
# 2.01e9 bytes. Bounded above at 2.5 GiB.
LORA_CHECKPOINT_MAX = 2.5 * GIB


def expected_dry_run_refusals(recipe: Path, output_dir: Path) -> tuple[set[str], set[str]]:
    """(kinds the dry run of ``recipe`` must refuse here, kinds left unjudged): the hub when the model is a hub id
    not in the local cache (the suite runs offline); DeepSpeed when the accelerate config is a DeepSpeed one and the
    package cannot be imported; the disk when the kept checkpoints (save_total_limit + 1, the next one being
    written) do not fit the free space, unjudged within 5% of the need or for a LoRA that might not fit."""
    import importlib.util
    import shutil

    import yaml
    from huggingface_hub import try_to_load_from_cache

    r = yaml.safe_load(recipe.read_text())
    kinds: set[str] = set()
    unjudged: set[str] = set()
    model = str(r["model_name_or_path"])
    if "/" in model and not (REPO / model).exists() and not isinstance(try_to_load_from_cache(model, "config.json"),
                                                                      str):
        kinds.add("hub")
    config = r.get("accelerate_config")
    if config and yaml.safe_load((REPO / config).read_text()).get("distributed_type") == "DEEPSPEED" and \
            importlib.util.find_spec("deepspeed") is None:
        kinds.add("deepspeed")
    free = shutil.disk_usage(output_dir if output_dir.exists() else output_dir.parent).free
    kept = (r.get("save_total_limit") or 1) + 1
    if r.get("use_peft"):
        if free < LORA_CHECKPOINT_MAX * kept:
            unjudged.add("disk")
    elif model in FULL_PARAMS:
        need = FULL_PARAMS[model] * (2 + 8 + 4 if r.get("bf16") else 4 + 8) * kept  # weights, Adam m, v, fp32 copy
        if abs(free - need) < 0.05 * need:
            unjudged.add("disk")
        elif free < need:
            kinds.add("disk")
    elif "/" in model:
        raise AssertionError(f"{recipe.name}: a full fine-tune of {model}: add its parameter count to FULL_PARAMS")
    return kinds, unjudged


def refusal_kinds(preflight: list[str]) -> list[str]:
    """The kind of each preflight line (REFUSAL_KINDS), "other" for a line of none of them."""
    return [next((k for k, m in REFUSAL_KINDS.items() if m in line), "other") for line in preflight]


def tiny_judge_and_adapter(folder: Path) -> tuple[Path, Path]:
    """(the small tiny judge, a LoRA adapter on it) under ``folder``: the adapter random, not zero, so that its scores
    differ from the base's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from judgetrain.models.tiny import build_tiny_judge

    from test_eval_cli import SMALL

    base = build_tiny_judge(Path(folder) / "base", seed=0, config=SMALL)
    torch.manual_seed(1)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                   LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)).save_pretrained(
        Path(folder) / "adapter")
    return Path(base), Path(folder) / "adapter"
