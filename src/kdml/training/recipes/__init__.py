"""Recipe registry: each recipe picks a head, a loss and regularizers."""

from __future__ import annotations

from kdml.errors import KdmlError, did_you_mean
from kdml.training.recipes import atlas, dtml, jrd
from kdml.training.recipes.base import Recipe

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe for recipe in (*jrd.RECIPES, *atlas.RECIPES, *dtml.RECIPES)
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise KdmlError(f"unknown recipe {name!r}{did_you_mean(name, RECIPES)}; choose one "
                        f"of: {', '.join(RECIPES)}")
    return RECIPES[name]


__all__ = ["RECIPES", "Recipe", "get_recipe"]
