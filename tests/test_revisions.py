"""Pinned hub revisions: a dataset component's `revision` (passed to datasets.load_dataset for a hub source), so a
requeued run reads the same rows as its first start."""

from __future__ import annotations

import pytest

from helpers import QUICKSTART
from judgetrain.config.recipe import RecipeError, parse_recipe
from judgetrain.data.mixture import component_keys


@pytest.mark.parametrize("dataset", ["judgebias", "ideation"])
def test_every_training_adapter_takes_a_revision(dataset):
    assert "revision" in component_keys(dataset)


def test_a_component_with_a_revision_parses_and_a_misspelt_one_is_refused(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(QUICKSTART.read_text().replace("{dataset: judgebias, source: bundled, split: train}",
                                                   "{dataset: judgebias, source: bundled, split: train, revision: 3f2a1b}"))
    script_args, *_ = parse_recipe([str(good)])
    assert script_args.train_datasets[0]["revision"] == "3f2a1b"
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("revision: 3f2a1b", "revison: 3f2a1b"))
    with pytest.raises(RecipeError, match="revison.*revision"):
        parse_recipe([str(bad)])

