"""Every recipe parses, passes --dry-run without the hub, and bad recipes fail before any weights load."""

import sys

import pytest

from judgetrain.config.recipe import RecipeError, parse_recipe

from helpers import QUICKSTART, REPO, expected_dry_run_refusals, refusal_kinds, run

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
CONFIGS = sorted((REPO / "accelerate_configs").glob("*.yaml"))


def test_there_are_real_recipes_and_a_quickstart():
    names = {p.stem for p in RECIPES}
    assert "quickstart" in names
    assert len(names) >= 6


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_passes_dry_run(recipe, tmp_path, monkeypatch):
    """Exit code 0 with no refusal where the recipe can start on this machine; elsewhere exit code 2 with exactly
    the refusals this machine must give, one line each (helpers.expected_dry_run_refusals: the hub offline and the
    model not cached, DeepSpeed not installed, the disk too small for the kept checkpoints)."""
    from judgetrain.train import run as train_run

    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    expected, unjudged = expected_dry_run_refusals(recipe, out)
    report = train_run([str(recipe), "--dry_run", "--output_dir", str(out), "--audit_rows", "16"])
    kinds = [k for k in refusal_kinds(report["preflight"]) if k not in unjudged]
    assert sorted(kinds) == sorted(expected), report["preflight"]
    verdict = bool(expected) if not unjudged else bool(report["preflight"])  # 2: refused, as the launch would be
    assert report["exit_code"] == (2 if verdict else 0), report["preflight"]
    assert report["problems"] == [] and report["rows_audited"] > 0
    audit = report["audit"]
    if audit["max_length"] is not None:
        for name, entry in audit["datasets"].items():
            assert entry["rows"] > 0, name


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_accelerate_config_parses_and_is_in_the_scale_page(config):
    """Each launch config parses, and docs/scale.md (where README sends a user who launches on more than a laptop)
    names it."""
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(config))
    assert cfg.num_processes >= 1
    assert f"accelerate_configs/{config.name}" in (REPO / "docs" / "scale.md").read_text()


def test_unknown_recipe_key_names_the_nearest_valid_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: tiny-judge\nlearnig_rate: 1.0e-4\n")
    with pytest.raises(RecipeError, match=r"unknown key 'learnig_rate'; did you mean 'learning_rate'"):
        parse_recipe([str(bad)])


@pytest.mark.parametrize("dataset, typo, nearest", [("judgebias", "min_score_detla", "min_score_delta"),
                                                    ("ideation", "mdoe", "mode")])
def test_unknown_train_dataset_key_names_the_adapter_parameter_before_anything_is_written(tmp_path, dataset, typo,
                                                                                          nearest):
    from judgetrain.train import run

    out = tmp_path / "out"
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"model_name_or_path: tiny-judge\noutput_dir: {out}\n"
                   f"train_datasets:\n  - dataset: {dataset}\n    source: bundled\n    {typo}: 1\n")
    with pytest.raises(RecipeError, match=rf"train_datasets\[0\] \(dataset {dataset}\): unknown key '{typo}'; "
                                          rf"did you mean '{nearest}'\?"):
        run([str(bad)])
    assert not out.exists()  # no recipe.yaml, no rejects: the check runs at parse


def test_train_dataset_keys_are_the_mixture_keys_and_the_adapter_parameters():
    import inspect

    from judgetrain.data import load_ideation, load_judgebias
    from judgetrain.data.mixture import component_keys

    for name, adapter in (("judgebias", load_judgebias), ("ideation", load_ideation)):
        keys = component_keys(name)
        assert set(keys) == {"dataset", "name", "weight", "rows", *inspect.signature(adapter).parameters}
    assert "min_score_delta" in component_keys("judgebias") and "min_score_delta" not in component_keys("ideation")


def test_the_recipe_schema_lists_each_adapters_keys_in_its_order():
    """The recipe check (config, below the data stage) reads COMPONENT_KEYS; the adapters' signatures are the truth."""
    from judgetrain.config.recipe import COMPONENT_KEYS
    from judgetrain.data.mixture import component_keys

    assert sorted(COMPONENT_KEYS) == ["ideation", "judgebias", "preference"]
    for name, keys in COMPONENT_KEYS.items():
        assert list(keys) == component_keys(name), name


def test_unknown_command_line_option_names_the_nearest(tmp_path):
    with pytest.raises(RecipeError, match=r"unknown option --num_train_epoch; did you mean --num_train_epochs"):
        parse_recipe([str(QUICKSTART), "--num_train_epoch", "3"])


def test_recipe_must_be_a_mapping_and_is_read_with_safe_yaml(tmp_path):
    bad = tmp_path / "evil.yaml"
    bad.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        parse_recipe([str(bad)])
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(RecipeError, match="must be a YAML mapping"):
        parse_recipe([str(listy)])


def test_command_line_overrides_win_and_are_saved(tmp_path):
    from judgetrain.config.recipe import save_recipe

    recipe = parse_recipe([str(QUICKSTART), "--learning_rate", "3e-4", "--beta", "0.2"])
    s, t, m, resolved = recipe.script_args, recipe.training_args, recipe.model_args, recipe.resolved
    assert t.learning_rate == pytest.approx(3e-4) and t.beta == pytest.approx(0.2)
    save_recipe(resolved, tmp_path / "recipe.yaml")
    recipe = parse_recipe([str(tmp_path / "recipe.yaml")])
    s2, t2 = recipe.script_args, recipe.training_args
    assert t2.learning_rate == pytest.approx(3e-4) and t2.beta == pytest.approx(0.2)
    assert s2.train_datasets == s.train_datasets


def test_trust_remote_code_is_off_unless_the_recipe_sets_it():
    t = parse_recipe([str(QUICKSTART)]).training_args
    assert t.trust_remote_code is False
    for recipe in RECIPES:
        assert "trust_remote_code: true" not in recipe.read_text()


def test_cli_dry_run_exits_nonzero_on_a_missing_data_file(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text(
        "model_name_or_path: tiny-judge\nbf16: false\ntrain_datasets:\n"
        f"  - {{dataset: judgebias, source: {tmp_path}/nope.parquet, split: train}}\n"
    )
    proc = run([sys.executable, "-m", "judgetrain.cli", "train", bad, "--dry-run", "--output_dir", tmp_path / "o"],
               check=False)
    assert proc.returncode != 0
    assert "nope.parquet" in proc.stderr
