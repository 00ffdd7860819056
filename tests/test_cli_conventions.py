"""The conventions every `judgetrain` command shares (judgetrain/cli/args.py), table-driven over the commands:

- each option taken in both spellings (``--output_dir``, ``--output-dir``) and its older name, shown once in the help;
- a misspelt option: one line naming the option to use, exit code 2;
- bad input (a missing path, a file for a folder and the reverse, an unknown model, a bad recipe, a reversed range,
  an empty source): exit code 2, one line, no traceback, the output folder as it was;
- every flag a message or a page names is one its command accepts;
- evaluation progress in the log; tables that keep their words in a file; log lines beside a progress bar.

Commands run in-process (``judgetrain.cli.main``); no model loads before the refusals tested here."""

import ast
import functools
import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from judgetrain.cli import COMMANDS
from judgetrain.cli import main as cli_main
from judgetrain.cli.args import canonical, figure_cell, normalise, settle

from helpers import QUICKSTART, REPO

PANEL = REPO / "judgetrain" / "data" / "samples" / "panel" / "evaluations.jsonl.gz"


@functools.lru_cache(maxsize=None)
def parsers() -> dict:
    """command -> its argparse parser (`train` and `status` read their argv themselves: their own tests below)."""
    import importlib

    out = {}
    for name, (module, _) in COMMANDS.items():
        builder = getattr(importlib.import_module(module), "build_parser", None)
        if builder is not None:
            out[name] = builder()
    return out


def accepted(command: str) -> set[str]:
    """The canonical names (``output_dir``) of every option ``command`` accepts, aliases included."""
    if command == "train":
        from judgetrain.config.parser import RecipeParser
        from judgetrain.config.recipe import dataclass_types

        names = set(RecipeParser(dataclass_types())._option_string_actions)
        return {canonical(n)[2:] for n in names if n.startswith("--")} | {"allow_env", "config", "help"}
    if command == "status":
        return {"verify", "help"}
    if command == "judgetrain":  # the command itself, before a subcommand
        return {"version", "help"}
    parser = parsers()[command]
    settle(parser)
    return {canonical(n)[2:] for n in parser._option_string_actions if n.startswith("--")}


# --------------------------------------------------------------------------------------------- spellings
def test_every_command_but_train_and_status_has_a_parser_following_the_conventions():
    built = parsers()
    assert set(COMMANDS) - set(built) == {"train", "status"}
    for name, parser in built.items():
        settle(parser)
        assert parser.prog == f"judgetrain {name}", parser.prog
        shown = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
        assert all("-" not in s[2:] for s in shown), (name, shown)  # the help shows the underscore spelling alone
        assert len(shown) == len(set(shown))


def _values(action) -> list[str]:
    """Command-line values an action accepts (its first choice, a number, a word)."""
    if action.nargs == 0:
        return []
    n = action.nargs if isinstance(action.nargs, int) else 1
    if action.choices:
        return [str(list(action.choices)[-1])] * n
    if action.type not in (None, str):
        return ["37"] * n
    return ["x"] * n


def _required(parser) -> list[str]:
    argv = []
    for action in parser._actions:
        if action.required and action.option_strings:
            argv += [action.option_strings[-1], *_values(action)]
        elif not action.option_strings and action.nargs not in ("?", "*"):
            argv += _values(action) if action.nargs != "+" else ["x"]
    return argv


SPELLING_CASES = [(name, action.option_strings[-1]) for name, parser in parsers().items()
                  for action in (settle(parser) or parser._actions)
                  if action.option_strings and "_" in action.option_strings[-1] and name != "eval"]


@pytest.mark.parametrize("command, option", SPELLING_CASES, ids=[f"{c}:{o}" for c, o in SPELLING_CASES])
def test_each_option_is_taken_with_underscores_and_with_hyphens_alike(command, option):
    parser = parsers()[command]
    settle(parser)
    action = parser._option_string_actions[option]
    base = _required(parser)
    base = [t for i, t in enumerate(base) if not (t == option or (i and base[i - 1] == option))]
    under = parser.parse_args(base + [option, *_values(action)])
    hyphen = parser.parse_args(base + ["--" + option[2:].replace("_", "-"), *_values(action)])
    assert vars(under) == vars(hyphen)
    assert getattr(under, action.dest) != action.default or action.nargs == 0 and action.const == action.default


@pytest.mark.parametrize("old, new, argv", [
    ("--out", "output_dir", ["pairs", "build", "--evaluations", "x"]),
    ("--rejects", "rejects_path", ["data", "check", "--dataset", "judgebias", "--source", "x"]),
    ("--on-bad-row", "on_bad_row", ["judge", "--items", "x", "--output_dir", "o"]),
    ("--score-key", "score_key", ["pairs", "build", "--evaluations", "x", "--output_dir", "o"]),
    ("--out", "output", ["compare", "a", "b"]),
    ("--out", "output_dir", ["report", "r"]),
    ("--out", "output_dir", ["tiny", "build"]),
])
def test_the_older_names_still_work(old, new, argv):
    command = " ".join(argv[:2]) if " ".join(argv[:2]) in COMMANDS else argv[0]
    rest = argv[len(command.split()):]
    value = "error" if new == "on_bad_row" else "v"
    args = parsers()[command].parse_args(rest + [old, value])
    assert getattr(args, new) == value


def test_eval_takes_its_own_and_the_recipe_options_in_both_spellings():
    from judgetrain.cli.eval import parse_args

    hyphens = parse_args(["--model", "m", "--output-dir", "o", "--max-length", "64", "--ref-model", "r",
                          "--trust-remote-code", "--eval-max-rows", "4", "--on-bad-row", "skip"])
    unders = parse_args(["--model", "m", "--output_dir", "o", "--max_length", "64", "--ref_model", "r",
                         "--trust_remote_code", "--eval_max_rows", "4", "--on_bad_row", "skip"])
    assert hyphens == unders
    assert (unders[1].output_dir, unders[1].max_length, unders[0].eval_max_rows, unders[1].on_bad_row) == (
        "o", 64, 4, "skip")


# --------------------------------------------------------------------------------------------- misspelt options
TYPOS = [  # (argv, the misspelt option, the hint)
    (["train", str(QUICKSTART), "--learnin_rate", "1e-5"], "--learnin_rate", "--learning_rate"),
    (["eval", "--model", "m", "--ouput_dir", "x"], "--ouput_dir", "--output_dir"),
    (["judge", "--items", "i", "--output_dir", "o", "--on_bad_rows", "skip"], "--on_bad_rows", "--on_bad_row"),
    (["perturb", "--source", "s", "--spec", "materials", "--output_dir", "o", "--sed", "1"], "--sed", "--seed"),
    (["report", "r", "--output_dri", "x"], "--output_dri", "--output_dir"),
    (["compare", "a", "b", "--resample", "10"], "--resample", "--resamples"),
    (["data", "check", "--dataset", "judgebias", "--source", "bundled", "--tokeniser", "t"], "--tokeniser",
     "--tokenizer"),
    (["pairs", "build", "--evaluations", "e", "--output_dir", "o", "--min-detla", "1"], "--min-detla", "--min_delta"),
    (["bench", "--quik"], "--quik", "--quick"),
    (["memory", "check", "m", "--lora-rr", "8"], "--lora-rr", "--lora_r"),
    (["status", str(REPO / "judgetrain"), "--verfy"], "--verfy", "--verify"),
    (["tiny", "build", "--sead", "1"], "--sead", "--seed"),
    (["cache", "list", "--al"], "--al", None),
    (["pairs", "known", "--items", "i", "--output_dir", "o", "--tie", "drop"], "--tie", "--ties"),
    (["loop", "loop.yaml", "--confg", "x"], "--confg", None),
    (["probe", "--items", "i", "--source", "s", "--spec", "materials", "--model", "m", "--output_dir", "o",
      "--holdout", "0.2"], "--holdout", "--holdout_fraction"),
    (["serve", "tiny-judge", "--max_text", "4"], "--max_text", "--max_texts"),
]


def _one_line(capsys, caplog) -> list[str]:
    """What a refused command said: its stderr lines and its logged errors."""
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return err + [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def _run(argv) -> int:
    try:
        return cli_main(argv)
    except SystemExit as e:  # argparse's exit
        return e.code


def test_the_typo_table_covers_every_command():
    assert {" ".join(a[:2]) if " ".join(a[:2]) in COMMANDS else a[0] for a, _, _ in TYPOS} == set(COMMANDS)


@pytest.mark.parametrize("argv, typo, hint", TYPOS, ids=[" ".join(a[:2]) for a, _, _ in TYPOS])
def test_a_misspelt_option_is_one_line_with_a_hint_and_exit_2(argv, typo, hint, capsys, caplog):
    assert _run(argv) == 2
    lines = _one_line(capsys, caplog)
    assert len(lines) == 1, lines
    assert f"unknown option {typo}" in lines[0] and "Traceback" not in lines[0], lines
    assert (f"did you mean {hint}?" in lines[0]) if hint else "did you mean" not in lines[0], lines


# --------------------------------------------------------------------------------------------- bad input
@pytest.fixture
def place(tmp_path):
    """A folder with an empty file, a file, an empty folder, the bundled panel, a saved evaluation folder."""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "items.jsonl").write_text(json.dumps({"sample_id": 1, "prompt": [
        {"role": "user", "content": "Rate this recipe."}]}) + "\n")
    return tmp_path


BAD_INPUTS = [  # (argv with {t} for the folder, what the line says)
    (["judge", "--items", "{t}/items.jsonl", "--judge", "no-such/model", "--output_dir", "{t}/out"], "no-such/model"),
    (["judge", "--items", "{t}/items.jsonl", "--judge", "{t}/emptydir", "--output_dir", "{t}/out"],
     "a folder without a model"),
    (["judge", "--items", "{t}/items.jsonl", "--judge", "tiny-judge", "--output_dir", "{t}/out", "--scale", "5", "1"],
     "--scale 5 1: the low end must be below the high end"),
    (["judge", "--items", "{t}/items.jsonl", "--judge", "tiny-judge", "--output_dir", "{t}/afile"],
     "a file, not a folder"),
    (["judge", "--items", "{t}/nope.jsonl", "--judge", "tiny-judge", "--output_dir", "{t}/out"], "nope.jsonl"),
    (["train", str(QUICKSTART), "--accelerate-config", "nope.yaml"], "--accelerate_config nope.yaml: no such file"),
    (["train", str(QUICKSTART), "--output_dir", "{t}/afile", "--dry-run"], "a file, not a folder"),
    (["train", "{t}/nope.yaml"], "file not found"),
    (["status", "{t}/nope.yaml"], "file not found"),
    (["status", "{t}/emptydir"], "not a run folder"),
    (["status", "--verify"], "name the run"),
    (["eval", "--model", "tiny-judge", "--ref-model", "nomodel", "--output_dir", "{t}/out"], "--ref_model nomodel"),
    (["eval", "--model", "no-such/model", "--output_dir", "{t}/out"], "--model no-such/model"),
    (["eval", "--model", "{t}/emptydir", "--output_dir", "{t}/out"], "a folder without a model"),
    (["eval", "--model", "tiny-judge", "--output-dir", "{t}/afile"], "a file, not a folder"),
    (["data", "check", "--dataset", "judgebias", "--source", "bundled", "--tokenizer", "{t}/nomodel"],
     "--tokenizer"),
    (["data", "check", "--dataset", "judgebias", "--source", "{t}/empty.jsonl"], "no rows"),
    (["data", "check", "--dataset", "rmbench", "--source", "{t}/emptydir"], "no RM-Bench files"),
    (["memory", "check", "{t}/nodir"], "not a model folder"),
    (["memory", "check", "{t}/afile"], "not a model folder"),
    (["pairs", "build", "--evaluations", str(PANEL), "--output_dir", "{t}/out", "--scale", "5", "1"], "--scale 5 1"),
    (["pairs", "known", "--form", "pointwise", "--evaluations", str(PANEL), "--output_dir", "{t}/out", "--scale", "5",
      "1"], "--scale 5 1"),
    (["pairs", "build", "--evaluations", "{t}/emptydir", "--output_dir", "{t}/out"], "a folder"),
    (["pairs", "build", "--evaluations", "{t}/empty.jsonl", "--output_dir", "{t}/out"], "empty"),
    (["pairs", "build", "--evaluations", str(PANEL), "--out", "{t}/afile"], "a file, not a folder"),
    (["report", "{t}/emptydir"], "nothing to report"),
    (["report", "{t}/nope"], "not a run directory"),
    (["compare", "{t}/nope", "{t}/nope2"], "not a saved evaluation"),
    (["compare", "{t}/emptydir", "{t}/emptydir", "--out", "{t}/emptydir"], "a folder; name the JSON file"),
    (["perturb", "--source", "{t}/items.jsonl", "--spec", "materials", "--model", "model=a,b", "--output_dir",
      "{t}/out"], "--model 'model=a,b'"),
    (["perturb", "--source", "{t}/items.jsonl", "--spec", "materials", "--output_dir", "{t}/afile"],
     "a file, not a folder"),
    (["perturb", "--source", "{t}/emptydir", "--spec", "materials", "--output_dir", "{t}/out"], "no files"),
    (["tiny", "build", "--output_dir", "{t}/afile"], "a file, not a folder"),
    (["serve", "{t}/emptydir"], "a folder without a model"),
    (["serve", "{t}/afile"], "a file, not a folder"),
    (["cache", "lst"], "invalid choice"),
    (["data", "chek"], "unknown command 'chek'"),
    (["trian"], "did you mean 'train'?"),
]


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("argv, says", BAD_INPUTS, ids=[" ".join(a[:3]) + f" [{i}]" for i, (a, _) in
                                                          enumerate(BAD_INPUTS)])
def test_bad_input_is_one_line_exit_2_and_leaves_the_folder_as_it_was(argv, says, place, capsys, caplog,
                                                                      monkeypatch):
    monkeypatch.chdir(place)
    before = _tree(place)
    code = _run([a.replace("{t}", str(place)) for a in argv])
    lines = _one_line(capsys, caplog)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert says in lines[0] and "Traceback" not in lines[0], lines
    assert _tree(place) == before  # nothing made, nothing left behind (no .tmp, no identity, no rejects)


@pytest.mark.slow
def test_a_refused_judge_leaves_the_folder_so_the_corrected_rerun_starts(tmp_path, capsys, caplog):
    from test_judge import write_items

    items = write_items(tmp_path / "items.jsonl", 2)
    out = tmp_path / "panel"
    common = ["judge", "--items", str(items), "--output_dir", str(out), "--force_score_prefix", "--max_new_tokens", "2"]
    assert _run(common + ["--judge", "no-such/model"]) == 2
    assert not out.exists()
    capsys.readouterr()
    assert _run(common + ["--judge", "tiny-judge"]) == 0
    rows = [json.loads(line) for line in (out / "evaluations.jsonl").read_text().splitlines()]
    assert [r["judge_model"] for r in rows] == ["tiny-judge", "tiny-judge"]


# --------------------------------------------------------------------------------------------- answers
def test_status_reports_each_state_by_folder_alone(tmp_path, capsys):
    lines = {"finished": {"status": "finished", "exit_code": 0, "step": 62},
             "stopped": {"status": "preempted", "exit_code": 143, "step": 40},
             "failed": {"status": "failed", "exit_code": 1, "message": "RuntimeError: boom\nmore"}}
    for name, status in lines.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "judgetrain_status.jsonl").write_text(json.dumps(status) + "\n")
    (tmp_path / "killed").mkdir()
    (tmp_path / "killed" / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "running").mkdir()
    (tmp_path / "running" / "metrics.jsonl").write_text('{"step": 1}\n')
    holder = subprocess.Popen(  # another process holds the run's lock, as a training run does
        [sys.executable, "-c", "import sys; from pathlib import Path; from judgetrain.run.state import "
         f"hold_output_dir; hold_output_dir(Path({str(tmp_path / 'running')!r})); print('held', flush=True); "
         "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        said = {}
        for name in ("finished", "stopped", "failed", "killed", "running"):
            assert cli_main(["status", str(tmp_path / name)]) == 0
            said[name] = capsys.readouterr().out.strip()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert said["finished"] == f"{tmp_path / 'finished'}: finished (exit code 0) at step 62"
    assert said["stopped"].endswith("stopped by a signal: resume it with judgetrain train RECIPE --resume auto (exit "
                                    "code 143) at step 40")
    assert said["failed"].endswith("failed (exit code 1): RuntimeError: boom")
    assert "failed: its last launch ended without writing how" in said["killed"]
    assert said["running"].startswith(f"{tmp_path / 'running'}: running (")


def test_two_word_commands_have_their_own_help_and_the_version_prints(capsys):
    import judgetrain

    assert cli_main(["data", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: judgetrain data COMMAND" in out and "data check" in out and "pairs build" not in out
    with pytest.raises(SystemExit) as info:
        cli_main(["memory", "check", "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: judgetrain memory check ")
    assert cli_main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"judgetrain {judgetrain.__version__}"


# --------------------------------------------------------------------------------------------- every hint is true
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:[_-][a-z0-9]+)*)")
# the tools whose flags a message may name after their own name (not judgetrain's)
TOOLS = re.compile(r"\b(pip install|accelerate launch|torchrun|srun|huggingface-cli|pytest|python scripts/\S+|"
                   r"judgetrain [a-z]+(?: (?:build|check))?|-m judgetrain\.(?:cli\.)?[a-z]+)")
# flags of other programs named without their program's name in the same string
FOREIGN = {"validation_rows": "scripts/make_judgebias_rows.py's, named by the start-up bench's generator",
           "name": "the form of an option (--name value), not one", "key": "the form of an option (--key value)"}
MODULE_COMMANDS = {module: name for name, (module, _) in COMMANDS.items()} | {"judgetrain.cli": "judgetrain"}


def _command_of(mention: str) -> str | None:
    """The judgetrain command a tool mention names, None for another tool's."""
    if mention.startswith("-m judgetrain."):
        module = mention[3:]
        return "train" if module == "judgetrain.train" else MODULE_COMMANDS.get(module)
    if mention.startswith("judgetrain "):
        words = mention.split()[1:]
        for n in (2, 1):
            if " ".join(words[:n]) in COMMANDS:
                return " ".join(words[:n])
    return None


def _mentions(text: str, default: set[str]) -> list[tuple[str, set[str] | None]]:
    """(flag, the commands that must accept it; None: another tool's) for each flag ``text`` names: the command
    whose words it follows (``judgetrain pairs build --score_key k``: no bracket or sentence break between them),
    else ``default``."""
    out = []
    for m in FLAG.finditer(text):
        tools = [t for t in TOOLS.finditer(text[: m.start()])]
        if tools and not re.search(r"[()\[\];]|[.,] ", text[tools[-1].end(): m.start()]):
            command = _command_of(tools[-1].group(1))
            out.append((m.group(1), {command} if command else None))
        else:
            out.append((m.group(1), default))
    return out


def _message_strings(path: Path) -> list[str]:
    """The string constants of a module but its docstrings (f-strings' literal parts joined, values as ``X``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    out, inside = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "X " for v in node.values))
            inside |= {id(v) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings | inside:
            out.append(node.value)
    return out


def hint_problems() -> list[str]:
    """Every flag a message string of judgetrain/ names that its command does not accept."""
    accepts = {name: accepted(name) for name in [*COMMANDS, "judgetrain"]}
    problems = []
    for path in sorted((REPO / "judgetrain").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        module = rel[:-3].replace("/", ".")
        if module in MODULE_COMMANDS:
            default = {MODULE_COMMANDS[module]}
        elif rel.startswith("judgetrain/bench/"):
            default = {"bench"}
        else:
            default = set()  # a library message: some command must accept it
        for text in _message_strings(path):
            if not re.search(r"\s", text.strip()):
                continue  # a lone token ('--output_dir'): an argument list being built, not a message
            for flag, commands in _mentions(text, default):
                name = flag.replace("-", "_")
                if commands is None or name in FOREIGN:
                    continue
                if commands and not all(name in accepts[c] for c in commands):
                    problems.append(f"{rel}: --{flag} ({', '.join(sorted(commands))}): {text[:80]!r}")
                elif not commands and not any(name in a for a in accepts.values()):
                    problems.append(f"{rel}: --{flag} (no command takes it): {text[:80]!r}")
    return problems


def test_every_flag_a_message_names_is_accepted_by_its_command():
    assert hint_problems() == []


def test_the_bad_row_hint_names_an_option_every_command_reading_rows_accepts():
    from judgetrain.data.validate import DataValidationError, RowProblem

    message = str(DataValidationError([RowProblem("rows.jsonl", "train", 3, "prompt", "missing value")]))
    [flag] = FLAG.findall(message)
    for command in ("data check", "judge", "perturb", "eval"):
        assert flag in accepted(command), command
    assert flag in accepted("train")  # the recipe key of the same name


def page_problems() -> tuple[list[str], int]:
    """(every flag a command on README.md or docs/*.md names that the command does not accept, flags checked)."""
    accepts = {name: accepted(name) for name in [*COMMANDS, "judgetrain"]}
    problems, checked = [], 0
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8").replace("\\\n", " ")
        spans = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        spans = [line for block in spans for line in block.splitlines()] + re.findall(r"`([^`\n]+)`",
                                                                                      re.sub(r"```.*?```", "", text,
                                                                                             flags=re.S))
        for span in spans:
            span = span.split(" #", 1)[0]
            for flag, commands in _mentions(span, set()):
                name = flag.replace("-", "_")
                checked += bool(commands)
                if commands and not all(name in accepts[c] for c in commands):
                    problems.append(f"{page.name}: --{flag} ({', '.join(sorted(commands))}): {span[:100]}")
    return problems, checked


def test_every_flag_a_page_shows_with_its_command_is_accepted_by_it():
    problems, checked = page_problems()
    assert problems == []
    assert checked > 200  # the pages' commands were read: 247 flags when this test was written


def test_the_hint_check_catches_a_flag_a_command_refuses():
    assert _mentions("pass --on-bad-row skip to judgetrain judge", {"judge"}) == [("on-bad-row", {"judge"})]
    assert _mentions("judgetrain pairs build --score-key k, then pip install --no-deps x", set()) == [
        ("score-key", {"pairs build"}), ("no-deps", None)]
    accepts = accepted("judge")
    assert "on_bad_row" in accepts and "no_such_flag" not in accepts and "score_values" not in accepts


# --------------------------------------------------------------------------------------------- progress and tables
def test_evaluation_logs_its_progress_per_suite(tiny_judge, tmp_path, caplog, monkeypatch):
    import judgetrain.eval.runner as runner

    monkeypatch.setattr(runner, "PROGRESS_EVERY_S", 0.0)  # every forward: the line's form, not its rate, is tested
    caplog.set_level(logging.INFO)
    assert cli_main(["eval", "--model", tiny_judge, "--eval_suites", "rmbench", "judgebias", "--eval_max_rows", "6",
                     "--eval_batch_tokens", "512", "--output_dir", str(tmp_path / "ev")]) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "judgetrain.eval.runner"]
    pattern = re.compile(r"eval (\w+): pass (\d) of the suite, (\d+)/(\d+) forwards \(\d+%\), ~(\d+)/(\d+) rows, "
                         r"[\d.]+ rows/s, ETA [\d.]+ min")
    seen = [pattern.fullmatch(line) for line in lines]
    progress = [m for m in seen if m]
    assert {m.group(1) for m in progress} == {"rmbench", "judgebias"}, lines
    for suite in ("rmbench", "judgebias"):
        done = [int(m.group(3)) for m in progress if m.group(1) == suite and m.group(2) == "1"]
        total = {int(m.group(4)) for m in progress if m.group(1) == suite and m.group(2) == "1"}
        assert len(total) == 1 and done == list(range(1, max(total) + 1)), (suite, done, total)
        assert {int(m.group(6)) for m in progress if m.group(1) == suite} == {6}
    end = [i for i, line in enumerate(lines) if line.startswith("eval rmbench: 6 rows")]
    assert end and all(i < end[0] for i, m in enumerate(seen) if m and m.group(1) == "rmbench")


def test_a_redirected_table_keeps_a_72_character_key_whole(tmp_path):
    """`judgetrain pairs build` with its output in a file: the rejects row of a judge with a 72-character name is
    whole on one line, and the counts are integers."""
    import gzip

    judge = "org/" + "a-very-long-judge-model-name-" * 2 + "x" * 10
    assert len(judge) == 72
    rows = [json.loads(line) for line in gzip.open(PANEL, "rt")]
    first = rows[0]["judge_model"]
    for row in rows:
        if row["judge_model"] == first:
            row["judge_model"] = judge
    panel = tmp_path / "panel.jsonl"
    panel.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "table.txt"
    with out.open("w") as f:
        proc = subprocess.run([sys.executable, "-m", "judgetrain.cli", "pairs", "build", "--evaluations", str(panel),
                               "--output_dir", str(tmp_path / "pairs")], stdout=f, stderr=subprocess.PIPE, text=True,
                              cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    [line] = [line for line in text.splitlines() if f"Rejects: {judge}" in line]
    stats = json.loads((tmp_path / "pairs" / "stats.json").read_text())
    detail = ", ".join(f"{reason} {n}" for reason, n in sorted(stats["rejects_by_judge"][judge].items()))
    assert detail and line.split("\u2502")[2].strip() == detail, line  # the cell beside it whole too
    assert f"{stats['total_pairs']:,}" in text and ".0000" not in text


def test_counts_show_as_integers_and_figures_to_four_places():
    assert figure_cell("eval/judgebias/n_rows", 96.0) == "96"
    assert figure_cell("eval/judgebench/n", 1200.0) == "1,200"
    assert figure_cell("eval/judgebias/error/accuracy", 1.0) == "1.0000"
    assert figure_cell("eval/rmbench/hard_acc", 0.5) == "0.5000"


def test_log_lines_never_land_inside_a_progress_bar():
    from tqdm import tqdm

    from judgetrain.utils.logging import FORMAT, BarSafeHandler

    stream = io.StringIO()
    handler = BarSafeHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "a log line", None, None)
    with tqdm(total=10, file=stream, ascii=True, mininterval=0) as bar:
        bar.update(3)
        handler.emit(record)
        bar.update(3)
    lines = [line.rsplit("\r", 1)[-1] for line in stream.getvalue().split("\n")]
    assert "a log line" in lines, stream.getvalue()  # alone on its line, the bar cleared before it
    assert FORMAT.endswith("%(message)s")
