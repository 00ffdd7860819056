"""Nothing unsafe runs: no remote code unless the recipe says so (and then a warning), safe YAML only, no pickle from
a user path (safetensors; torch.load only with weights_only=True), a score parser that never evaluates code."""

import ast
import logging
import re

import pytest
import yaml

from judgetrain.config.recipe import RecipeError, parse_recipe
from judgetrain.data.scoreparse import parse_overall_score_result, safe_arithmetic

from helpers import QUICKSTART, REPO

PACKAGE = REPO / "judgetrain"


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_trust_remote_code_is_off_unless_the_recipe_sets_it():
    training_args = parse_recipe([str(QUICKSTART)]).training_args
    assert training_args.trust_remote_code is False
    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        assert "trust_remote_code: true" not in recipe.read_text().lower(), recipe
    from judgetrain.cli.eval import build_parser

    assert build_parser().parse_args(["--model", "x"]).trust_remote_code is False
    from judgetrain.models.loading import model_init_kwargs

    recipe = parse_recipe([str(QUICKSTART)])
    training_args, model_args = recipe.training_args, recipe.model_args
    assert model_init_kwargs(model_args, training_args)["trust_remote_code"] is False


def test_a_recipe_that_sets_trust_remote_code_logs_a_warning(tmp_path, tiny_judge, caplog):
    from judgetrain.train import train

    recipe = tmp_path / "r.yaml"
    recipe.write_text(QUICKSTART.read_text().replace("source: bundled, split: train}", "source: /nonexistent/none.jsonl}")
                      + "\ntrust_remote_code: true\n")
    recipe = parse_recipe([str(recipe), "--output_dir", str(tmp_path / "run")])
    assert recipe.training_args.trust_remote_code is True
    with caplog.at_level(logging.WARNING, logger="judgetrain.train"), pytest.raises(Exception, match="none.jsonl"):
        train(recipe)  # stops at the missing data, after the warning
    assert "Remote code is ON (trust_remote_code: true)" in caplog.text


def test_recipes_load_with_safe_yaml_only(tmp_path):
    # a YAML python tag is refused, not executed
    marker = tmp_path / "pwned"
    (tmp_path / "evil.yaml").write_text(f"learning_rate: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        parse_recipe([str(tmp_path / "evil.yaml")])
    assert not marker.exists()
    offenders = [f"{p}:{i}" for p in _sources() for i, line in enumerate(p.read_text().splitlines(), 1)
                 if re.search(r"yaml\.(load|unsafe_load|full_load)\(", line)]
    assert offenders == []
    assert yaml.safe_load("a: 1") == {"a": 1}


def _calls(tree, pred):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and pred(node):
            yield node


def test_no_pickle_and_no_torch_load_without_weights_only_in_the_package():
    found_torch_load, offenders = [], []
    for path in _sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                if any(n.split(".")[0] in ("pickle", "cPickle", "dill", "joblib", "shelve", "marshal") for n in names):
                    offenders.append(f"{path.name}:{node.lineno} imports {names}")
        for call in _calls(tree, lambda c: isinstance(c.func, ast.Attribute) and c.func.attr == "load"
                           and isinstance(c.func.value, ast.Name) and c.func.value.id == "torch"):
            found_torch_load.append(f"{path.name}:{call.lineno}")
            kw = {k.arg: k.value for k in call.keywords}
            if not (isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True):
                offenders.append(f"{path.name}:{call.lineno} torch.load without weights_only=True")
        for call in _calls(tree, lambda c: isinstance(c.func, ast.Name) and c.func.id in ("eval", "exec")):
            offenders.append(f"{path.name}:{call.lineno} {call.func.id}()")
    assert offenders == [], offenders
    print(f"torch.load calls in the package: {found_torch_load or 'none'}")


@pytest.mark.slow
def test_weights_are_written_and_read_as_safetensors_and_resume_uses_weights_only(tmp_path):
    """What a real run writes: every tensor file of the run folder and its checkpoint is safetensors, except the
    Trainer's optimizer, scheduler and RNG states, and those load with torch.load(weights_only=True) (no pickled
    code), as Trainer's resume reads them (transformers 5: every torch.load of its source passes weights_only=True)."""
    import inspect

    import torch
    import transformers.trainer as tr
    from safetensors.torch import load_file

    from test_reliability import run_to_end, small_recipe

    src = inspect.getsource(tr)
    starts = [m.start() for m in re.finditer(r"torch\.load\(", src)]
    assert starts and all("weights_only=True" in src[i:i + 400] for i in starts)
    recipe = small_recipe(tmp_path / "r.yaml", extra="max_steps: 2\nsave_steps: 2\neval_steps: 0\n")
    run = tmp_path / "run"
    run_to_end([recipe, "--output_dir", str(run), "--eval_suites", "none"], tmp_path / "run.log")
    tensors = [p for p in run.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl")]
    safe = {p.relative_to(run).as_posix() for p in tensors if p.suffix == ".safetensors"}
    assert {"adapter_model.safetensors", "checkpoint-2/adapter_model.safetensors"} <= safe, safe
    assert all(load_file(str(run / name)) for name in safe)  # real safetensors files, each with tensors
    # training_args.bin: Trainer's pickled record of its arguments, written and never read (by Trainer or judgetrain)
    assert "training_args.bin" not in "".join(p.read_text() for p in (REPO / "judgetrain").rglob("*.py"))
    states = [p for p in tensors if p.suffix != ".safetensors" and p.name != "training_args.bin"]
    assert {p.name for p in states} <= {"optimizer.pt", "scheduler.pt", "rng_state.pth"}, states
    assert any(p.name == "optimizer.pt" for p in states)
    from transformers.trainer import safe_globals  # numpy's RNG state types, the allowlist Trainer's resume uses

    for p in states:
        with safe_globals():
            torch.load(p, weights_only=True)  # raises UnpicklingError on anything but tensors and allowed types


PAYLOADS = [
    '{"overall_score": __import__("os").system("touch MARKER")}',
    '```json\n{"overall_score": eval("4")}\n```',
    '{"overall_score": (lambda: 4)()}',
    '{"overall_score": open("MARKER", "w").write("x")}',
    '{"overall_score": 4 if __import__("os").system("touch MARKER") else 4}',
    '{"overall_score": [x for x in ().__class__.__base__.__subclasses__()]}',
    '{"overall_score": 9**9**9**9}',
    '{"overall_score": "(4+3.5)/2"}',
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_score_parser_never_evaluates_code(payload, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = parse_overall_score_result(payload.replace("MARKER", str(tmp_path / "pwned")))
    assert not (tmp_path / "pwned").exists()
    if "(4+3.5)/2" in payload:
        assert result.score == 3.75  # plain arithmetic is read by the ast walker
    else:
        assert result.score is None and result.reason == "unparseable", result
    assert safe_arithmetic("__import__('os')") is None and safe_arithmetic("2**10") is None
