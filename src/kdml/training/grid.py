"""Config grids: ``grid: {method.dim: [2, 4, 8], method.n_charts: [1, 4, 16, 32]}`` in a config
file runs one training per cell, each into its own sub-folder of the grid's folder.

A grid's folder holds ``grid.yaml`` (the cells) and one run folder per cell, named after its
settings (``dim=2-n_charts=4``). Running the same command again, with the grid's folder as its
``--out``, continues the grid (without one it makes another folder): finished cells are kept,
an interrupted cell resumes from its checkpoint, and the rest start. A cell already started
with other settings (another override, an edited config file) is refused, not resumed or
counted under the new ones.

With ``data.validation`` the grid's closing table names the best cell on the validation part
(:func:`best_cells`: cells tied on the score are all named, the first in grid order taken).
Training warns when that part holds too few classes for the choice to mean much.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from kdml.config import flatten
from kdml.errors import KdmlError
from kdml.file_write import write_through_new_file
from kdml.training.run_folder import first_partials, holds_files

MARKER = "grid.yaml"
# settings a run saves as resolved where the command leaves them empty (eval.ks: the dataset's)
FILLED_IN_TRAINING = ("eval.ks",)
# Scores this close (relative) are one score: metrics.json gives back the float a run computed,
# but the same retrieval result summed in another order lands a few float64 ulps away.
SCORE_TIE = 1e-9


@dataclass(frozen=True)
class Cell:
    """One combination of grid values."""

    values: dict[str, Any]

    @property
    def name(self) -> str:
        parts = [f"{key.rsplit('.', 1)[-1]}={value}" for key, value in self.values.items()]
        return re.sub(r"[^A-Za-z0-9._=-]+", "_", "-".join(parts))



def grid_cells(grid: Any) -> list[Cell]:
    """Every cell of ``grid`` (a mapping of config keys to lists of values), in order."""
    if not isinstance(grid, dict) or not grid:
        raise KdmlError("grid must map config keys to lists of values, e.g. "
                        "grid: {method.dim: [2, 4, 8]}")
    for key, values in grid.items():
        if not isinstance(key, str):  # YAML reads 1:, true: and null: as such
            raise KdmlError(f"grid key {key!r} is not a config key; write a setting's name, "
                            "e.g. grid: {method.dim: [2, 4, 8]}")
        if not isinstance(values, list) or not values:
            raise KdmlError(f"grid.{key} must be a non-empty list of values, got {values!r}")
        repeated = repeated_position(values)
        if repeated is not None:  # a position: the repeated value may be None (null)
            raise KdmlError(f"grid.{key} lists {values[repeated]!r} twice, which would train "
                            "the same cells twice; drop the repeat")
    keys = list(grid)
    cells = [Cell(dict(zip(keys, combination, strict=True)))
             for combination in itertools.product(*(grid[key] for key in keys))]
    check_distinct_names(cells)
    return cells


def check_distinct_names(cells: list[Cell]) -> None:
    """Refuse two cells of one folder name: :attr:`Cell.name` writes ``_`` for any run of
    characters other than letters, digits, ``.``, ``_``, ``=`` and ``-`` (``"a b"``, ``"a_b"``
    and ``"a/b"`` are all ``a_b``), and the two cells would share one run folder. Names that
    differ only in case are one folder on the file systems of macOS and Windows, so they are
    refused everywhere: a grid behaves alike on every machine."""
    named: dict[str, Cell] = {}
    for cell in cells:
        earlier = named.setdefault(cell.name.casefold(), cell)
        if earlier is cell:
            continue
        first, second = (", ".join(f"grid.{key}={values[key]!r}" for key in cell.values
                                   if repr(cell.values[key]) != repr(earlier.values[key]))
                         for values in (earlier.values, cell.values))
        if cell.name != earlier.name:
            raise KdmlError(f"the grid's values {first} and {second} differ only in case, so "
                            f"their run folders {earlier.name} and {cell.name} would be one "
                            "on macOS and Windows; choose values that differ in more than "
                            "case")
        raise KdmlError(f"the grid's values {first} and {second} would share one run "
                        f"folder, {cell.name} (a "
                        "cell's folder name keeps letters, digits, '.', '_', '=' and '-', and "
                        "writes '_' for any other characters); choose values that differ in "
                        "those characters")


def check_distinct_keys(keys: Sequence[str], full_key: Callable[[str], str]) -> None:
    """Refuse two grid keys of one setting, such as a leaf name and its dotted key (``dim``
    and ``method.dim``; ``full_key`` resolves either, as the config does): the later key's
    value had silently won in every cell."""
    seen: dict[str, str] = {}
    for key in keys:
        full = full_key(key)
        if full in seen:
            raise KdmlError(f"grid.{seen[full]} and grid.{key} both set {full}, so the later "
                            "would win in every cell; keep one of them, with every value to "
                            "try in its list")
        seen[full] = key


def check_grid_keys_unset(grid_keys: Sequence[str], file_settings: dict[str, Any],
                          full_key: Callable[[str], str]) -> None:
    """Refuse a grid key whose setting the config file also gives a value outside the grid
    (``method: {alpha: 0.5}`` beside ``grid: {method.alpha: [0.1, 1]}``; ``file_settings``
    are the file's settings, flattened): the cells' values would win and the file's one be
    dropped without a word, as an override of a grid key would (which is refused too)."""
    set_by_file = {full_key(key): key for key in file_settings}
    for key in grid_keys:
        given = set_by_file.get(full_key(key))
        if given is not None:
            raise KdmlError(f"the config file sets {given}: {file_settings[given]!r} and its "
                            f"grid runs over {key}, so the cells' values would win; drop one "
                            "of them (a value that every cell shares is one outside the grid)")


def repeated_position(values: list[Any]) -> int | None:
    """The position of the first value of ``values`` equal to an earlier one, as the resolved
    config compares them (``1`` and ``1.0`` are one learning rate, ``[1, 2]`` and ``[1.0, 2]``
    one eval.ks), or None. Pairwise: values may be lists or mappings, which do not hash.

    >>> repeated_position([1e-4, 0.001, 1.0e-3])
    2
    """
    for position, value in enumerate(values):
        # true == 1 in Python, but a bool and a number are no one setting's same value
        if any(value == earlier and isinstance(value, bool) == isinstance(earlier, bool)
               for earlier in values[:position]):
            return position
    return None


def check_distinct_cells(cells: list[Cell], resolved: list[dict[str, Any]]) -> None:
    """Refuse two cells whose configs (``resolved``, one per cell) are the same: values that
    differ only as written, such as YAML's ``1e-3`` (a string, made a float by the config)
    and ``0.001``, would train the same run twice."""
    for position, config in enumerate(resolved):
        for earlier in range(position):
            if resolved[earlier] == config:
                raise KdmlError(f"the grid's cells {cells[earlier].name} and "
                                f"{cells[position].name} give the same config, which would "
                                "train the same run twice; drop one of their values")


def recorded_cells(root: Path) -> list[str] | None:
    """The cells listed by ``root``'s ``grid.yaml`` where kdml wrote it (a mapping of exactly
    ``grid`` and ``cells``, see :func:`write_marker`); ``None`` where there is none, or a file
    of the user's by that name (a config file, say: it had made its folder "another grid's")."""
    try:
        record = yaml.safe_load((root / MARKER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if (not isinstance(record, dict) or set(record) != {"grid", "cells"}
            or not isinstance(record["cells"], list)
            or not all(isinstance(cell, str) for cell in record["cells"])):
        return None
    return record["cells"]


def check_grid_folder(root: Path, cells: list[Cell]) -> bool:
    """Whether ``root`` continues an earlier run of the same grid (``False``: a new grid).

    A non-empty folder that is not a grid folder, or one of another grid, is refused."""
    earlier = recorded_cells(root)
    if earlier is not None:
        if earlier != [cell.name for cell in cells]:
            raise KdmlError(f"{root} holds another grid's runs; choose another --out")
        return True
    if root.exists() and not root.is_dir():  # "not empty" misled: it is a file
        raise KdmlError(f"--out {root} is a file; a grid goes into a new or empty folder: "
                        "choose another --out")
    if root.exists() and holds_files(root):
        raise KdmlError(f"--out {root} is not empty and holds no grid; a grid goes into a new "
                        "or empty folder: choose another --out")
    return False


# Settings of where and how fast a cell trains, not of what it trains: a grid stopped on one
# machine goes on on another (a GPU lent since, its data in another folder, more loader
# processes), as ``kdml train --resume`` lets a run (resume_settings.RESUMABLE, of which these
# are the ones that leave the grid's results as they are: not train.epochs, say, which would
# count a finished cell's fewer epochs as the grid's)
WHERE_IT_TRAINS = frozenset({"train.device", "data.num_workers", "eval.embed_batch_size",
                             "data.root", "train.compile"})


def changed_setting(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The first setting (dotted key) in which a cell's saved config differs from the one the
    command resolves, as ``key: saved -> now``, or None: a cell trained (or started) with other
    settings must not be continued or counted as this grid's. Settings of where it trains
    (:data:`WHERE_IT_TRAINS`) may differ: they had kept a grid stopped on a CPU from going on
    on a GPU."""
    flat_saved, flat_now = flatten(saved), flatten(now)
    for key in sorted(set(flat_saved) | set(flat_now)):
        if key in FILLED_IN_TRAINING and flat_now.get(key) == []:
            continue  # the run saved what "the dataset's own" resolved to
        if key in WHERE_IT_TRAINS:
            continue
        if flat_saved.get(key) != flat_now.get(key):
            return f"{key}: {flat_saved.get(key)!r} -> {flat_now.get(key)!r}"
    return None


def write_marker(root: Path, cells: list[Cell], grid: dict[str, Any]) -> None:
    """``grid.yaml``, whole or not at all: a file cut short by a kill would be taken for
    another grid's (:func:`check_grid_folder`). Called where there is none: one that appears
    meanwhile, another grid's, is refused, not replaced."""
    text = yaml.safe_dump({"grid": grid, "cells": [cell.name for cell in cells]},
                          sort_keys=False)
    # a kill while an earlier try wrote it left its hidden partial (kdml's; check_grid_folder
    # took the folder for empty): it goes, as a new run's first partials do
    for partial in first_partials(root) if root.is_dir() else []:
        partial.unlink(missing_ok=True)
    try:  # never over a marker written meanwhile: another grid started into this folder
        write_through_new_file(root / MARKER, lambda partial: partial.write_text(text),
                               replace=False)
    except FileExistsError:
        raise KdmlError(f"another grid started into {root} meanwhile (its {MARKER} appeared "
                        "while this one checked the folder); choose another --out") from None


def is_score(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is a number as JSON stores one, NaN included (a diverged run's): not
    a bool, which Python counts as an int, nor the null or text another tool may have written
    into a metrics file."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def best_cells(scores: Sequence[Any]) -> list[int]:
    """Positions of the cells with the highest score, in grid order: more than one when they tie
    (equal within :data:`SCORE_TIE`), none when no cell has a finite score (a missing or NaN
    one is never best).

    >>> best_cells([0.25, 0.3, 0.1 + 0.2, float("nan")])
    [1, 2]
    """
    finite = {position: float(score) for position, score in enumerate(scores)
              if is_score(score) and math.isfinite(score)}
    if not finite:
        return []
    top = max(finite.values())
    return [position for position, score in finite.items()
            if math.isclose(score, top, rel_tol=SCORE_TIE)]

