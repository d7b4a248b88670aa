"""The recipes' names, known without importing the recipes (and torch with them): the command
line says a mistyped recipe at once, where importing them took seconds first. Kept in step
with :data:`kdml.training.recipes.RECIPES` (tests/test_cli.py checks the two agree)."""

from __future__ import annotations

from collections.abc import Iterable

from kdml.errors import KdmlError, did_you_mean

RECIPE_NAMES = ("jrd", "mrd", "jrd-c", "jrd-pooling", "jmmd", "jintra", "intra", "amsoftmax",
                "mtriplet", "triplet", "msimclr", "simclr", "dtml", "dstml", "ddml",
                "ddml-logistic", "pca")


def unknown_recipe(name: str, names: Iterable[str] = RECIPE_NAMES) -> KdmlError:
    """The refusal of a recipe ``name`` that is none of ``names``."""
    names = list(names)
    return KdmlError(f"unknown recipe {name!r}{did_you_mean(name, names)}; choose one of: "
                     f"{', '.join(names)}")


def check_recipe_name(name: str) -> None:
    """Refuse a ``name`` that is none of the built-in recipes'."""
    if name not in RECIPE_NAMES:
        raise unknown_recipe(name)
