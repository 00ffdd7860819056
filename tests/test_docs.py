"""Every shell command README.md and docs/*.md show runs here, in a real but affordable form, so a renamed flag,
recipe key, command or file in the code fails a test until the docs say the same.

Commands come from fenced blocks tagged bash / sh / shell / console (``$ `` lines) and from untagged blocks whose
lines start with a command; a block that starts with ``#!`` is a script and must also pass ``bash -n``. Each command
is classified by `plan` below, and a command it cannot classify fails `test_every_docs_command_is_classified`:

- ``judgetrain train RECIPE ...``, ``accelerate launch ... -m judgetrain.train RECIPE ...``, ``python -m
  judgetrain.train`` and the recipe + config a SLURM submission hands over: with ``--dry-run`` appended (recipe,
  overrides, accelerate config, data, token lengths and the memory estimate, no weights; offline: a hub dataset
  falls back to the bundled samples and a hub tokenizer to the tiny judge's, as the dry run says in its notes).
  A recipe whose model is converted on first use (SmolLM2's GGUF, minutes of CPU on busy cores) is parsed with its
  accelerate config instead; tests/test_recipes.py dry-runs it.
- ``judgetrain eval / report / data check / pairs build / cache / tiny build`` run for real, in this process, on the
  bundled data and the tiny judge (an eval with ``--eval_max_rows 2`` appended); ``runs/quickstart`` is a real run of the
  quickstart recipe cut to 2 steps (`trained_run`, trained in a subprocess while the quicker commands run), and
  ``RM-Bench/data`` (a clone a user makes) is the real RM-Bench rows of tests/conftest.py when present, else the
  bundled RM-Bench sample; ``biasbench.json`` EvalBiasBench's own file when present, else two pairs in its format.
- ``--help`` where a real run needs a GPU, the hub or minutes of CPU (`judgetrain bench`, `judgetrain memory check`,
  an eval of a hub model, the SmolLM2 demo script):
  every ``--flag`` the docs line uses must appear in that command's ``--help`` (for ``accelerate launch``, its own
  flags in accelerate's ``--help``).
- Commands that are not judgetrain's (pip, venv, pytest, sbatch, scontrol, ...) are listed in `NOT_RUN`, each with
  the reason; shell builtins of a script block in `SHELL_BUILTINS`.

Commands run in a workspace that looks like a checkout (recipes/, accelerate_configs/, judgetrain/, scripts/ linked
from the repository), so what they write stays in a temporary folder.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import _shared_dir
from helpers import REPO, dry_run_verdict_holds, run

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_TAGS = {"bash", "sh", "shell", "console"}
LINKED = ("recipes", "accelerate_configs", "judgetrain", "scripts", "tests", "docs")  # the workspace's checkout
EVAL_ROWS = "2"  # --eval_max_rows of a real `judgetrain eval`

# First words of commands the test does not run, with the reason.
NOT_RUN = {
    ("python3", "-m", "venv"): "creates the virtual environment this test already runs in",
    ("python", "-m", "venv"): "creates the virtual environment this test already runs in",
    ("pip",): "installs packages; the environment under test is the one the README's test command builds",
    ("python", "-m", "pytest"): "runs test files; this file is one of the tests it runs",
    ("sbatch",): "submits to a SLURM cluster (its recipe and accelerate config are dry-run instead; "
                 "tests/test_runstate.py runs scripts/slurm_train.sh with srun / scontrol stand-ins)",
    ("scontrol",): "SLURM's own command, inside a batch script",
    ("git", "clone"): "fetches a repository from the network",
    ("nvidia-smi",): "needs a GPU",
    ("cat",): "joins files into one (the commands after it that read the result are classified on their own)",
    ("bash", "scripts/gpu_check_zero3.sh"): "a ZeRO-3 kill-and-resume check: needs deepspeed and minutes of training",
    ("python", "scripts/gpu_check.py"): "the first-contact GPU check: needs a GPU and up to 10 minutes "
                                        "(tests/test_gpu_check.py runs its --device cpu mode)",
    ("python", "scripts/device_kit.py"): "downloads the device kit's wheels from PyPI and installs them into a new "
                                         "venv: minutes (tests/test_gpu_check.py checks its contents; its whole run is "
                                         "an extended test there)",
}
SHELL_BUILTINS = {"trap", "wait", "kill", "exit", "[", "test", "cd", "export", "set", "echo", "true", "false"}
# Scripts of the repository run with --help (a real run trains a real model for many minutes).
HELP_SCRIPTS = {"scripts/smollm2_rmbench_demo.py": "trains and scores SmolLM2-135M-Instruct: 40 minutes of CPU",
                "scripts/verdict_probe_data.py": "writes the verdict-loss probe's pairs, which the next command "
                                                 "trains SmolLM2 on for half an hour",
                "scripts/make_samples.py": "writes the generated recipes the pointwise proof's 2-hour loop trains on",
                "scripts/loop_rules.py": "reads a loop's held-out files, which the loop's stages write first",
                "scripts/grid_table.py": "reads the grid's loop folders, which the loop commands write first "
                                         "(tests/test_grid_table.py runs it)"}
# Recipe models a dry run would first convert into the cache.
CONVERTED_MODELS = {"smollm2-135m-instruct"}


# ----------------------------------------------------------------------------------------------- extraction
@dataclass(frozen=True)
class DocCommand:
    where: str  # "docs/data.md:45"
    text: str  # the command as written (continuation lines joined)
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


@dataclass(frozen=True)
class Block:
    doc: str  # "docs/data.md"
    tag: str
    lines: tuple[str, ...]
    first_line: int  # of the block's first line inside the fence

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.first_line}"


def fenced_blocks(path: Path, name: str | None = None) -> list[Block]:
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    name = name or path.relative_to(REPO).as_posix()
    i = 0
    while i < len(lines):
        m = re.match(r"^```\s*([\w+-]*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        blocks.append(Block(name, m.group(1).lower(), tuple(lines[i + 1:j]), i + 2))
        i = j + 1
    return blocks


_COMMAND_START = re.compile(r"^(\$ )?(\.?[\w.-]*/)*[a-z][\w.+-]*(\s|$)")


def is_shell_block(block: Block) -> bool:
    """A tagged shell block, or an untagged one whose lines start with a command (not a table, JSON or a log)."""
    if block.tag in SHELL_TAGS:
        return True
    if block.tag:
        return False
    body = [line for line in block.lines if line.strip()]
    return bool(body) and all(_COMMAND_START.match(line) and not line.split()[0].endswith(":") for line in body)


def block_commands(block: Block) -> list[DocCommand]:
    """The commands of one block: continuation lines joined, comments dropped, split at ; && || | &."""
    out, pending, start = [], "", 0
    console = block.tag == "console"
    for k, raw in enumerate(block.lines):
        line = raw.rstrip()
        if console:
            if not line.startswith("$ ") and not pending:
                continue  # output
            line = line[2:] if line.startswith("$ ") else line
        if not pending:
            start = k
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, pending = (pending + line).strip(), ""
        if not text or text.startswith("#"):
            continue
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        segment: list[str] = []
        for token in [*lexer, ";"]:
            if token and set(token) <= set(";&|"):
                while segment and segment[0] in ("if", "then", "else", "elif", "do", "while", "until"):
                    segment.pop(0)
                if segment and segment[0] not in ("fi", "done"):
                    out.append(DocCommand(f"{block.doc}:{block.first_line + start}", text, tuple(segment)))
                segment = []
            else:
                segment.append(token)
    return out


def docs_commands() -> list[DocCommand]:
    return [cmd for doc in DOCS for block in fenced_blocks(doc) if is_shell_block(block)
            for cmd in block_commands(block)]


def script_blocks() -> list[Block]:
    return [b for doc in DOCS for b in fenced_blocks(doc) if is_shell_block(b) and b.lines and b.lines[0].startswith("#!")]


# ----------------------------------------------------------------------------------------------- classification
class Unclassified(Exception):
    pass


@dataclass(frozen=True)
class Plan:
    mode: str  # run | dry-run | parse | help | not-run | shell
    argv: tuple[str, ...] = ()  # judgetrain's argv (run, dry-run, help), a recipe argv (parse), a script (help)
    why: str = ""
    entry: str = "cli"  # cli: judgetrain.cli.main; train: judgetrain.train.process_main; script: a subprocess
    launcher_flags: tuple[str, ...] = ()  # `accelerate launch` flags, checked against its --help
    needs_run: bool = False  # reads runs/quickstart (the `trained_run` fixture)
    reads: tuple[str, ...] = ()  # what earlier commands of its page write (`plan_chained`)
    env: dict = field(default_factory=dict, hash=False, compare=False)


def _flags(args) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--") and a != "--"]


def _value(args, *flags: str) -> str | None:
    """The value of the first of ``flags`` that ``args`` give, in either spelling (``--output_dir``, ``--output-dir``)."""
    names = {"--" + f[2:].replace("-", "_") for f in flags}
    for i, a in enumerate(args):
        name = "--" + a[2:].split("=", 1)[0].replace("-", "_") if a.startswith("--") else a
        if name in names and "=" not in a and i + 1 < len(args):
            return args[i + 1]
        if name in names and "=" in a:
            return a.split("=", 1)[1]
    return None


def _normalise(argv: tuple[str, ...]) -> list[str]:
    """.venv/bin/X -> X, `nice -n N` and leading VAR=value dropped, python3 -> python."""
    words = list(argv)
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]) and len(words) > 1:
        words.pop(0)
    if words[:1] == ["nice"]:
        words = words[3:] if words[1:2] == ["-n"] else words[1:]
    if words:
        words[0] = words[0].removeprefix(".venv/bin/")
    if words[:1] == ["python3"] and words[1:3] != ["-m", "venv"]:
        words[0] = "python"
    return words


def _recipe_model(recipe: str) -> str | None:
    path = REPO / recipe
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return None
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("model_name_or_path")


def plan_train(args: list[str], why: str, entry: str = "cli", launcher=()) -> Plan:
    args = [a for a in args if a != "..."]
    recipe = args[0] if args and not args[0].startswith("-") else None
    if recipe and _recipe_model(recipe) in CONVERTED_MODELS:
        return Plan("parse", tuple(a for a in args if a not in ("--dry-run", "--dry_run")),
                    f"{why}; its model is converted into the cache on first use (minutes on busy cores), so the "
                    "recipe, overrides and accelerate config are parsed (tests/test_recipes.py dry-runs it)",
                    entry, launcher)
    if "--dry-run" not in args and "--dry_run" not in args:
        args = [*args, "--dry-run"]
    return Plan("dry-run", tuple(["train", *args] if entry == "cli" else args), why, entry, launcher)


def plan_judgetrain(args: list[str]) -> Plan:
    from judgetrain.cli import COMMANDS

    words = next((n for n in (" ".join(args[:2]), args[0] if args else "") if n in COMMANDS), None)
    if words is None:
        raise Unclassified(f"judgetrain has no command {' '.join(args[:2])!r}")
    rest = args[len(words.split()):]
    if words == "train":
        return plan_train(rest, "judgetrain train, dry run")
    if words == "eval":
        return plan_eval(rest)
    if words == "report" and rest and rest[0].startswith("loops/"):
        return Plan("help", ("report",), "a loop's folder, which its loop command writes first (tests/test_loop.py "
                    "draws a loop's report)")
    if words == "report":
        return Plan("run", ("report", *rest), "the quickstart run drawn", needs_run=True)
    if words == "compare":
        return Plan("help", ("compare",), "two saved evaluations (tests/test_compare.py writes two with the real "
                    "runner and compares them)")
    if words in ("data check", "pairs build", "pairs known", "tiny build"):
        return Plan("run", (*words.split(), *rest), "bundled data / the tiny judge: seconds")
    if words == "cache":
        env = {"JUDGETRAIN_CACHE": "<empty>"} if rest[:1] == ["clear"] else {}
        return Plan("run", ("cache", *rest), "on an empty cache" if env else "the test session's cache", env=env)
    if words == "memory check":
        return Plan("help", ("memory", "check"), "real DPO steps under a tensor tracker: 45 s on busy cores for the "
                    "tiny judge, minutes for a real shape (tests/test_memory.py measures them)")
    if words == "judge":
        return Plan("help", ("judge",), "judge models over items: minutes of CPU (tests/test_judge.py runs it)")
    if words == "perturb":
        source = _value(rest, "--source")
        if _value(rest, "--model") is None and source and (REPO / source).exists():
            return Plan("run", ("perturb", *rest), "rule operators over the bundled recipes: seconds")
        return Plan("help", ("perturb",), "a model's rewrites or the user's own samples (tests/test_perturb.py runs "
                    "both kinds on the bundled recipes)")
    if words == "probe":
        return Plan("help", ("probe",), "forward passes of a real model over every text and pair: minutes of CPU "
                    "even on the tiny judge's few items (tests/test_probe.py runs it on the tiny judge)")
    if words == "loop":
        return Plan("help", ("loop",), "rounds of judge, DPO and eval: minutes of CPU even on the tiny judge "
                    "(tests/test_loop.py runs two rounds, and kills it during each stage)")
    if words == "serve":
        return Plan("help", ("serve",), "a server that runs until stopped (tests/test_serve.py starts it, sends "
                    "OpenRLHF's requests from real clients and stops it)")
    if words == "bench":
        return Plan("help", ("bench",), "minutes of CPU even at its smallest (tests/test_bench.py runs --quick)")
    raise Unclassified(f"judgetrain {words}: the test does not know how to run it; add it to plan_judgetrain")


def plan_eval(args: list[str], launcher=()) -> Plan:
    model, adapter = _value(args, "--model"), _value(args, "--adapter")
    local = {"tiny-judge"} | {"runs/quickstart", "runs/quickstart/"}
    if model == "..." or model not in local or (adapter and not adapter.startswith("runs/quickstart")):
        return Plan("help", ("eval",), "a hub model (weights from the hub, a GPU) or a template", "cli", launcher)
    rest = [*args, "--eval_max_rows", EVAL_ROWS] if "--eval_max_rows" not in args else args
    return Plan("run", ("eval", *rest), f"the tiny judge on {EVAL_ROWS} rows per suite", "cli", launcher,
                needs_run=any(a.startswith("runs/quickstart") for a in args))


def plan_accelerate(args: list[str]) -> Plan:
    if args[:1] != ["launch"] or "-m" not in args:
        raise Unclassified("accelerate: only `accelerate launch ... -m MODULE ...` is known")
    i = args.index("-m")
    launcher, module, rest = args[1:i], args[i + 1], args[i + 2:]
    launcher_flags = tuple(_flags(launcher))
    if module == "judgetrain.train":
        extra = []
        config, processes = _value(launcher, "--config_file"), _value(launcher, "--num_processes")
        if config and config != "..." and "--accelerate_config" not in rest:
            extra += ["--accelerate_config", config]
        if processes and "--num_processes" not in rest:
            extra += ["--num_processes", processes]
        return plan_train([*rest, *extra], "accelerate launch: the module's dry run with the launch's config",
                          "train", launcher_flags)
    if module == "judgetrain.cli.eval":
        return plan_eval(rest, launcher_flags)
    if module == "judgetrain.cli.judge":
        return Plan("help", ("judge",), "several processes of judges over items (tests/test_judge.py launches two)",
                    "cli", launcher_flags)
    if module == "judgetrain.cli.perturb":
        return Plan("help", ("perturb",), "model rewrites over several processes (tests/test_perturb.py launches "
                    "two)", "cli", launcher_flags)
    raise Unclassified(f"accelerate launch -m {module}: unknown module")


OUTPUT_FLAGS = ("--out", "--output_dir", "--output")


def written_before(cmd: DocCommand) -> set[str]:
    """The folders the commands above ``cmd`` on its page write (their --out / --output_dir values)."""
    doc, line = cmd.where.rsplit(":", 1)
    written = set()
    for other in docs_commands():
        other_doc, other_line = other.where.rsplit(":", 1)
        if other_doc == doc and int(other_line) < int(line):
            written |= {v.rstrip("/") for f in OUTPUT_FLAGS if (v := _value(list(other.argv), f)) not in (None, "...")}
    return written


def chained_reads(cmd: DocCommand, words: list[str]) -> tuple[str, ...]:
    """What ``cmd`` reads of what an earlier command of its page writes (a path, or a path inside a value such as
    ``{dataset: judgebias, source: loop/pairs}``); its own --out / --output_dir values are not reads."""
    own = {_value(words, f) for f in OUTPUT_FLAGS}
    args = [a for a in words[1:] if a not in own]
    return tuple(sorted(w for w in written_before(cmd)
                        if any(re.search(rf"(?<![\w./-]){re.escape(w)}(?![\w.-])", a) for a in args)))


def plan_chained(words: list[str], reads: tuple[str, ...]) -> Plan:
    """A command that reads what an earlier command of its page writes (a panel, pairs, a trained adapter: a chain
    that tests/test_judge.py::test_the_loop_judges_pairs_dpo_then_the_trained_judge_on_held_out_items runs end to
    end at its smallest): a training command's recipe and overrides are parsed, any other command's flags are
    checked against its --help."""
    why = f"reads {', '.join(reads)}, which an earlier command of the page writes (the loop test runs the chain)"
    train = words[:2] == ["judgetrain", "train"] or words[:3] == ["python", "-m", "judgetrain.train"]
    if train:
        rest = words[2:] if words[0] == "judgetrain" else words[3:]
        return Plan("parse", tuple(a for a in rest if a not in ("--dry-run", "--dry_run")), why,
                    "cli" if words[0] == "judgetrain" else "train", reads=reads)
    inner = plan_judgetrain(words[1:]) if words[0] == "judgetrain" else plan(DocCommand("", "", tuple(words)))
    if inner.mode in ("run", "dry-run"):
        from judgetrain.cli import COMMANDS as CLI

        name = next(n for n in (" ".join(words[1:3]), words[1]) if n in CLI)
        return Plan("help", tuple(name.split()), why, reads=reads)
    return inner


def plan(cmd: DocCommand) -> Plan:
    words = _normalise(cmd.argv)
    if not words:
        raise Unclassified("empty command")
    if cmd.where and words[0] in ("judgetrain", "python") and (reads := chained_reads(cmd, words)):
        return plan_chained(words, reads)
    for prefix, why in NOT_RUN.items():
        if tuple(words[:len(prefix)]) == prefix:
            if prefix == ("sbatch",):
                script = next((k for k, w in enumerate(words) if w.endswith("slurm_train.sh")), None)
                if script is not None and len(words) > script + 2:
                    recipe, config, *overrides = words[script + 1:]
                    return plan_train([recipe, "--accelerate_config", config, *overrides],
                                      f"sbatch is not run ({why}); what it launches is")
            return Plan("not-run", why=why)
    if re.match(r"^[A-Za-z_]\w*=", words[0]) or words[0] in SHELL_BUILTINS:
        return Plan("shell", why="shell of a script block (checked by bash -n)")
    if words[0] == "judgetrain":
        return plan_judgetrain(words[1:])
    if words[0] == "accelerate":
        return plan_accelerate(words[1:])
    if words[:3] == ["python", "-m", "judgetrain.train"]:
        return plan_train(words[3:], "python -m judgetrain.train, dry run", "train")
    if words[0] == "python" and len(words) > 1 and words[1] in HELP_SCRIPTS:
        return Plan("help", (words[1],), HELP_SCRIPTS[words[1]], "script")
    raise Unclassified(f"{' '.join(words[:3])}: the test does not know how to run it")


# ----------------------------------------------------------------------------------------------- running
COMMANDS = docs_commands()


# The quickstart recipe for real (tiny judge, LoRA, bundled data, the eval at the end), cut to 2 steps of 2 pairs,
# a checkpoint and 2 rows per eval suite: runs/quickstart of the docs (runs/a and runs/b name the same run).
TRAIN = ["-m", "judgetrain.train", "recipes/quickstart.yaml", "--max_steps", "2", "--per_device_train_batch_size", "2",
         "--eval_max_rows", "2", "--logging_steps", "1", "--save_steps", "2"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, request):
    """A folder that looks like a checkout: the repository's folders linked, RM-Bench/data the real rows (or the
    bundled sample), runs/quickstart trained in the background while the quicker commands run (when a collected
    test needs it: `trained_run` waits for it)."""
    ws = tmp_path_factory.mktemp("docs-workspace")
    for name in LINKED:
        (ws / name).symlink_to(REPO / name, target_is_directory=True)
    shared = _shared_dir()
    rmbench = shared / "data" / "rm-bench" if shared else REPO / "judgetrain" / "data" / "samples" / "rmbench"
    (ws / "RM-Bench").mkdir()
    (ws / "RM-Bench" / "data").symlink_to(rmbench, target_is_directory=True)
    biasbench = shared / "data" / "evalbiasbench" / "biasbench.json" if shared else None
    if biasbench is not None and biasbench.is_file():  # EvalBiasBench's own file, as docs/evaluation.md names it
        (ws / "biasbench.json").symlink_to(biasbench)
    else:  # two pairs in the authors' format
        (ws / "biasbench.json").write_text(json.dumps({"length bias": [
            {"bias": "length bias", "instruction": "Name a colour.", "response1": "Red.", "response2": "A fish.",
             "label": 1},
            {"bias": "length bias", "instruction": "Add 2 and 2.", "response1": "5", "response2": "4", "label": 2}]}))
    (ws / "runs").mkdir()
    wanted = any(getattr(item, "callspec", None) and getattr(item.callspec.params.get("p"), "needs_run", False)
                 for item in request.session.items)
    with open(ws / "train.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, *TRAIN], cwd=ws, stdout=log, stderr=subprocess.STDOUT) if wanted else None
        yield ws, proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def trained_run(workspace) -> Path:
    ws, proc = workspace
    assert proc is not None
    rc = proc.wait(timeout=900)
    assert rc == 0, f"python {' '.join(TRAIN)} exited {rc}:\n{(ws / 'train.log').read_text()[-6000:]}"
    out = ws / "runs" / "quickstart"
    assert (out / "adapter_model.safetensors").is_file() and (out / "checkpoint-2").is_dir()
    for alias in ("a", "b"):
        if not (ws / "runs" / alias).exists():
            (ws / "runs" / alias).symlink_to(out, target_is_directory=True)
    return out


def _call(fn, argv) -> tuple[int, str, str]:
    """fn(argv) in this process: (exit code, stdout, what it printed to stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = fn(list(argv))
        except SystemExit as e:  # argparse's --help and usage errors
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return int(rc or 0), out.getvalue(), err.getvalue()


def _entry(name: str):
    if name == "train":
        from judgetrain.train import process_main

        return process_main
    from judgetrain import cli

    return cli.main


def _help_text(p: Plan) -> str:
    if p.entry == "script":
        return run([sys.executable, REPO / p.argv[0], "--help"]).stdout
    rc, out, _ = _call(_entry("cli"), [*p.argv, "--help"])
    assert rc == 0, f"{' '.join(p.argv)} --help exited {rc}"
    return out


def _accelerate_help() -> str:
    """accelerate launch's options (its help formatter hides most of them, depending on sys.argv)."""
    from accelerate.commands.launch import launch_command_parser

    options = launch_command_parser()._option_string_actions  # every spelling, - and _ both
    return " ".join(sorted(options))


def _assert_flags_in(flags, help_text: str, what: str, cmd: DocCommand):
    """Each flag in the help, in either spelling (a judgetrain command's help shows ``--output_dir`` and takes
    ``--output-dir`` too)."""
    missing = [f for f in flags if not any(re.search(rf"(?<![\w-]){re.escape(g)}(?![\w-])", help_text)
                                           for g in (f, "--" + f[2:].replace("-", "_")))]
    assert not missing, f"{cmd}\n{what} --help has no {', '.join(missing)}"


def _dry_run_report(out: str) -> dict:
    start = out.find("{")
    assert start >= 0, f"no dry-run report in the output:\n{out[-2000:]}"
    return json.loads(out[start:])


def _params():
    """One test per distinct command (the same line on two pages runs once), those reading runs/quickstart last."""
    params, seen = [], set()
    for cmd in COMMANDS:
        try:
            p = plan(cmd)
        except Unclassified:
            continue  # reported by test_every_docs_command_is_classified
        if p.mode in ("not-run", "shell") or tuple(_normalise(cmd.argv)) in seen:
            continue
        seen.add(tuple(_normalise(cmd.argv)))
        marks = [pytest.mark.slow] if p.needs_run else []
        params.append(pytest.param(cmd, p, marks=marks, id=f"{cmd.where} {' '.join(cmd.argv[:4])}"))
    return sorted(params, key=lambda param: param.values[1].needs_run)  # the trained run's readers last


@pytest.mark.parametrize(("cmd", "p"), _params())
def test_docs_command_runs(cmd: DocCommand, p: Plan, workspace, request, monkeypatch, tmp_path):
    workspace, _ = workspace
    if p.launcher_flags:
        _assert_flags_in(p.launcher_flags, _accelerate_help(), "accelerate launch", cmd)
    if p.needs_run:
        request.getfixturevalue("trained_run")
    monkeypatch.chdir(workspace)
    for key, value in p.env.items():
        monkeypatch.setenv(key, str(tmp_path / "empty-cache") if value == "<empty>" else value)

    if p.mode == "help":
        module_args = cmd.argv[cmd.argv.index("-m") + 2:] if "-m" in cmd.argv else cmd.argv
        _assert_flags_in(_flags(module_args), _help_text(p), " ".join(p.argv), cmd)
    elif p.mode == "parse":
        from accelerate.commands.config.config_args import load_config_from_file

        from judgetrain.config.recipe import parse_recipe

        recipe = parse_recipe(list(p.argv))
        script_args, training_args, model_args = recipe.script_args, recipe.training_args, recipe.model_args
        if script_args.accelerate_config:
            assert load_config_from_file(script_args.accelerate_config).num_processes >= 1
        assert model_args.model_name_or_path in CONVERTED_MODELS or p.reads
    elif p.mode == "dry-run":
        rc, out, err = _call(_entry(p.entry), p.argv)
        assert rc in (0, 2), f"{cmd}\n{' '.join(p.argv)} exited {rc}:\n{err[-3000:]}"
        report = _dry_run_report(out)
        assert dry_run_verdict_holds(rc, report), (rc, report.get("preflight"), err[-3000:])
        assert report["problems"] == [], report  # the verdict is exit_code and preflight (above)
        assert report["rows_audited"] > 0 and report["audit"]["datasets"], report
        if "--gpu" in p.argv:
            assert "fits" in report["memory"], report["memory"]
    elif p.mode == "run":
        rc, out, err = _call(_entry(p.entry), p.argv)
        assert rc == 0, f"{cmd}\n{' '.join(p.argv)} exited {rc}:\n{out[-2000:]}\n{err[-3000:]}"
        check_output(p, out, workspace)
    else:  # pragma: no cover
        raise AssertionError(p.mode)


def check_output(p: Plan, out: str, workspace: Path):
    """What a real run must have produced, beyond exit 0."""
    args = list(p.argv)
    if args[0] == "report":
        dest = Path(_value(args, *OUTPUT_FLAGS) or Path(args[1]) / "report")
        assert (workspace / dest / "report.html").stat().st_size > 0, dest
    elif args[:2] == ["pairs", "build"]:
        assert "Total pairs" in out and "468" in out, out  # the table docs/data.md shows
        assert (workspace / _value(args, *OUTPUT_FLAGS) / "train.parquet").is_file()
    elif args[0] == "eval":
        assert "overall" in out or "rmbench" not in (_value(args, "--eval_suites") or "rmbench"), out
        results = list((workspace / (_value(args, "--output_dir") or "judgetrain_eval")).rglob("results.json"))
        assert results, "judgetrain eval wrote no results.json"
    elif args[:2] == ["tiny", "build"]:
        assert (workspace / _value(args, *OUTPUT_FLAGS) / "config.json").is_file()
    elif args[:2] == ["cache", "clear"]:
        assert out.startswith("removed "), out


# ----------------------------------------------------------------------------------------------- the rules themselves
def test_docs_show_commands_and_every_kind_of_plan():
    modes = {}
    for cmd in COMMANDS:
        with contextlib.suppress(Unclassified):
            modes.setdefault(plan(cmd).mode, []).append(cmd)
    assert len(COMMANDS) >= 30, [str(c) for c in COMMANDS]
    assert {"run", "dry-run", "help", "not-run"} <= set(modes), sorted(modes)


def test_every_docs_command_is_classified():
    unknown = []
    for cmd in COMMANDS:
        try:
            plan(cmd)
        except Unclassified as e:
            unknown.append(f"{cmd}\n    -> {e}")
    assert not unknown, "commands in the docs that tests/test_docs.py cannot run:\n" + "\n".join(unknown)


def test_a_new_unknown_command_in_the_docs_fails_classification(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("```bash\njudgetrain data check --dataset judgebias --source bundled\n"
                   "judgetrain frobnicate --all\nrm -rf runs\n```\n\n```\n| a table |\n```\n", encoding="utf-8")
    cmds = [c for b in fenced_blocks(doc, "x.md") if is_shell_block(b) for c in block_commands(b)]
    assert [c.argv[:2] for c in cmds] == [("judgetrain", "data"), ("judgetrain", "frobnicate"), ("rm", "-rf")]
    assert plan(cmds[0]).mode == "run"
    for cmd in cmds[1:]:
        with pytest.raises(Unclassified):
            plan(cmd)


def test_help_mode_catches_a_renamed_flag():
    cmd = DocCommand("x.md:1", "judgetrain bench --quick --eval-rowz 2", ("judgetrain", "bench", "--quick", "--eval-rowz", "2"))
    p = plan(cmd)
    assert p.mode == "help"
    with pytest.raises(AssertionError, match="--eval-rowz"):
        _assert_flags_in(_flags(cmd.argv), _help_text(p), "judgetrain bench", cmd)


def test_not_run_commands_each_give_a_reason():
    for cmd in COMMANDS:
        with contextlib.suppress(Unclassified):
            p = plan(cmd)
            if p.mode in ("not-run", "help", "parse"):
                assert len(p.why) > 15, cmd


@pytest.mark.parametrize("block", script_blocks(), ids=lambda b: b.where)
def test_script_blocks_are_valid_bash(block: Block, tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("\n".join(block.lines) + "\n", encoding="utf-8")
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, f"{block.where}: {proc.stderr}"


# ----------------------------------------------------------------------------------------------- the README itself
def _readme_block_after(heading: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split(f"## {heading}", 1)[1]
    return section.split("```bash\n", 1)[1].split("\n```", 1)[0].strip()


def test_ci_runs_the_readme_quickstart_and_test_lines_exactly():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    quickstart = _readme_block_after("Quickstart")
    assert f"bash -c '{quickstart}'" in ci
    test_line = _readme_block_after("Tests")
    assert [line for line in ci.splitlines() if line.strip()][-1] == test_line


def test_readme_is_a_five_minute_read():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, len(lines)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = re.match(r"^#{1,6} (.+)$", line)
        if m and not in_code:
            slug = _slug(m.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_links_between_the_pages_resolve():
    broken = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target} (no file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.name}: {target} (no heading)")
    assert not broken, broken


def test_repository_paths_the_pages_name_exist():
    missing = []
    for doc in DOCS:
        for span in re.findall(r"`([^`\n]+)`", doc.read_text(encoding="utf-8")):
            for token in span.split():
                token = token.strip("(),;:'\"").split("::")[0]
                if (token.split("/")[0] in LINKED and "/" in token and not re.search(r"[<*{\[$]|\.\.\.", token)
                        and not re.search(r"/[A-Z_]+(/|$)", token)):
                    if not (REPO / token).exists():
                        missing.append(f"{doc.name}: {token}")
    assert not missing, missing


def test_repository_paths_in_the_commands_exist():
    missing = []
    for cmd in COMMANDS:
        for token in cmd.argv:
            if token.split("/")[0] in LINKED and "/" in token and not re.search(r"[<*{]|\.\.\.", token):
                if not (REPO / token).exists():
                    missing.append(f"{cmd}: {token}")
    assert not missing, missing


def test_tests_the_reliability_page_names_exist():
    """`tests/test_x.py::test_name` (or `test_prefix_...`) in docs/reliability.md names a test that is there."""
    missing = []
    text = (REPO / "docs" / "reliability.md").read_text(encoding="utf-8")
    for path, name, elided in re.findall(r"(tests/test_\w+\.py)::(test_\w+)(\.\.\.)?", text):
        source = (REPO / path).read_text(encoding="utf-8")
        boundary = "" if elided else r"\b"  # `test_x_...` names a prefix
        if not re.search(rf"def {name}{boundary}", source):
            missing.append(f"{path}::{name}{elided}")
    assert not missing, missing
