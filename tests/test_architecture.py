"""The package's shape: data flows one way, and training steps do not sync with the host."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "kdml"


def imported_modules(package: str) -> dict[str, set[str]]:
    """Every module a package's files import (absolute names), by file."""
    found = {}
    for path in sorted((SRC / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(SRC))] = names
    return found


@pytest.mark.parametrize(("package", "forbidden"), [
    ("evaluation", "kdml.training"),  # the evaluator never trains
    ("models", "kdml.training"),  # the method interface lives in models/
    ("data", "kdml.training"),
    ("data", "kdml.evaluation"),
])
def test_packages_do_not_import_downstream(package, forbidden):
    offenders = {path: sorted(name for name in names if name.startswith(forbidden))
                 for path, names in imported_modules(package).items()}
    assert not {path: names for path, names in offenders.items() if names}


def test_scikit_learn_is_imported_only_by_the_functions_that_use_it():
    """scikit-learn brings scipy.stats and pandas, seconds of importing that every kdml command
    (and every rank of a torchrun job) paid at its start, though only a few functions use it
    (NMI, the piecewise-linear probe, the H-divergence estimate, t-SNE maps, the digits
    loaders). This checks kdml's own top-level imports, not what other packages import."""
    def names(node: ast.stmt) -> list[str]:
        if isinstance(node, ast.ImportFrom):
            return [node.module or ""]
        return [alias.name for alias in node.names] if isinstance(node, ast.Import) else []

    at_top = [f"{path.relative_to(SRC)}: {name}" for path in sorted(SRC.rglob("*.py"))
              for node in ast.parse(path.read_text()).body for name in names(node)
              if name.split(".")[0] == "sklearn"]
    assert not at_top


@pytest.mark.parametrize("folder", ["training/recipes", "regularizers", "losses", "kernels.py",
                                    "atlas.py", "models"])
def test_no_host_sync_in_the_maths_and_the_steps(folder):
    """Steps return tensor terms: no ``.item()`` in what runs inside a training step
    (docstring examples are string literals, not calls, so they do not count)."""
    paths = [SRC / folder] if folder.endswith(".py") else sorted((SRC / folder).rglob("*.py"))
    calls = [f"{path.name}:{node.lineno}" for path in paths
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "item"]
    assert calls == []


def test_every_docstring_example_runs():
    """The ``>>>`` examples in kdml's docstrings are run, so none can drift from the code."""
    import doctest
    import importlib
    import pkgutil

    import kdml

    attempted, failures = 0, []
    for module in pkgutil.walk_packages(kdml.__path__, "kdml."):
        if module.name.endswith("__main__"):  # runs the command line on import
            continue
        result = doctest.testmod(importlib.import_module(module.name), report=False)
        attempted += result.attempted
        if result.failed:
            failures.append(module.name)
    assert failures == [] and attempted >= 100


def test_the_package_says_it_is_typed():
    """PEP 561: the public API is annotated (mypy's disallow_untyped_defs), but without a
    ``py.typed`` marker in the package a user's mypy skipped it ("module is installed, but
    missing library stubs or py.typed marker") and pyright inferred its types from the code:
    a wrong argument to a kernel or a loss went unreported. setuptools ships the marker in the
    wheel and the editable install."""
    marker = SRC / "py.typed"
    assert marker.is_file() and marker.read_bytes() == b""
