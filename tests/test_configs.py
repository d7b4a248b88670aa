"""Every shipped config file resolves against its recipe."""

from pathlib import Path

import pytest

from kdml.config import load_config_file, resolve_config
from kdml.training.recipes import get_recipe

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_configs_are_shipped():
    assert len(CONFIGS) >= 4


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_resolves(path):
    values = load_config_file(path)
    recipe = get_recipe(values["recipe"])
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, values)
    assert config.recipe == path.stem.split("-")[0]
    assert config.data.dataset == values["data"]["dataset"]
