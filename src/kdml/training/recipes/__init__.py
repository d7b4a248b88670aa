"""Recipe registry: each recipe picks a head, a loss and regularizers."""

from __future__ import annotations

from kdml.training.recipe_names import unknown_recipe
from kdml.training.recipes import atlas, dtml, jrd
from kdml.training.recipes.base import Recipe

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe for recipe in (*jrd.RECIPES, *atlas.RECIPES, *dtml.RECIPES)
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise unknown_recipe(name, RECIPES)
    return RECIPES[name]


__all__ = ["RECIPES", "Recipe", "get_recipe"]
