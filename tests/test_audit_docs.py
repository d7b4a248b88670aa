"""What the documentation promises, command by command (README.md, docs/datasets.md,
docs/inspecting.md, docs/recipes.md, docs/reproducing.md), where a check found the code or the
text saying otherwise: ``kdml datasets`` on broken roots, the readers on unreadable folders."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from fixtures_photo_sets import make_cub

from kdml import cli
from kdml.data.formats.cub import load_cub
from kdml.data.registry import ROOT_VARIABLE
from kdml.errors import KdmlError


def listed(out: str, name: str) -> str:
    """The line of ``kdml datasets``'s output for the dataset ``name``."""
    (line,) = [line for line in out.splitlines() if line.split() and line.split()[0] == name]
    return line


def refuse_under(monkeypatch: pytest.MonkeyPatch, locked: Path) -> None:
    """Make the system refuse, as for a folder without read and search permission (which a
    test run as root cannot make), every look inside ``locked``: its listing and the status
    of what it holds."""
    scandir, stat = os.scandir, Path.stat

    def inside(path: object) -> bool:
        return str(path).startswith(f"{locked}{os.sep}") or str(path) == str(locked)

    def refused_scandir(path: object = ".") -> object:
        if inside(path):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)  # type: ignore[call-overload]

    def refused_stat(self: Path, *, follow_symlinks: bool = True) -> os.stat_result:
        if str(self).startswith(f"{locked}{os.sep}"):
            raise PermissionError(13, "Permission denied", str(self))
        return stat(self, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "scandir", refused_scandir)
    monkeypatch.setattr(Path, "stat", refused_stat)


def test_kdml_datasets_lists_every_dataset_when_one_folder_cannot_be_read(tmp_path, monkeypatch,
                                                                          capsys):
    """README: kdml datasets shows the folder training reads for each dataset. A dataset's
    folder under $KDML_DATA_ROOT without read permission (copied by another user) had stopped
    the whole listing with one error line about it: no dataset was listed at all. Its line
    now says it cannot be read, and the others are listed as before."""
    (tmp_path / "CUB_200_2011").mkdir()
    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))
    refuse_under(monkeypatch, tmp_path / "CUB_200_2011")
    assert cli.main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert listed(out, "cub").endswith(
        f"; cannot be read ({tmp_path / 'CUB_200_2011' / 'images.txt'}: Permission denied); "
        "check its permissions")
    assert listed(out, "cars196").endswith("; not found")
    assert listed(out, "sop").endswith("; not found")


@pytest.mark.parametrize("kind", ["missing", "file", "own folder"])
def test_kdml_datasets_says_what_is_wrong_with_the_data_root_variable(tmp_path, monkeypatch,
                                                                      capsys, kind):
    """A $KDML_DATA_ROOT that does not exist, is a file, or is one dataset's own folder had
    every on-disk dataset listed as "not found", where training says what is wrong with the
    variable: kdml datasets, the command for finding out, now says it too."""
    root = tmp_path / "data"
    if kind == "file":
        root.write_text("")
    elif kind == "own folder":
        root = make_cub(tmp_path / "CUB_200_2011", classes=2, per_class=2)
    monkeypatch.setenv(ROOT_VARIABLE, str(root))
    assert cli.main(["datasets"]) == 0
    out = capsys.readouterr().out
    line = listed(out, "cub")
    why = {"missing": "does not exist", "file": "is not a folder",
           "own folder": f"is cub's own folder, but the variable names the folder that holds "
                         f"the datasets, each in a folder of its own: set it to {tmp_path}"}[kind]
    if kind == "own folder":  # cub's alone
        assert f"; not found (${ROOT_VARIABLE}={root} {why}" in line
        assert listed(out, "cars196").endswith("; not found")
    else:  # every dataset's: said once, below them
        assert line.endswith("; not found") and listed(out, "cars196").endswith("; not found")
        assert out.count(f"${ROOT_VARIABLE}={root} {why}") == 1
        assert out.splitlines()[-1].startswith(
            f"Not found because ${ROOT_VARIABLE}={root} {why}: set it to the folder")
    with pytest.raises(KdmlError, match=f"\\${ROOT_VARIABLE}=.* {why}"):
        from kdml.data.registry import FORMATS, find_root

        find_root(FORMATS["cub"])  # training's refusal, unchanged


def test_an_image_folder_that_cannot_be_read_is_not_called_missing(tmp_path, monkeypatch):
    """docs/datasets.md: a listed image that does not exist stops the command with one line
    naming it. Images in a folder without read permission had been called "missing image"
    (60 of 60 listed images are missing), sending the user to look for files that are there;
    the line now says the folder cannot be read."""
    root = make_cub(tmp_path / "CUB_200_2011", classes=2, per_class=2)
    refuse_under(monkeypatch, root / "images")
    with pytest.raises(KdmlError) as caught:
        load_cub(root)
    message = str(caught.value)
    assert "\n" not in message and "missing image" not in message
    assert "cannot read the folder of " in message and "(Permission denied); make it readable" \
        in message


@pytest.mark.parametrize(("kind", "why"), [("missing", "does not exist"),
                                           ("file", "is not a folder")])
def test_a_data_root_that_does_not_exist_is_not_called_no_folder(tmp_path, kind, why):
    """README: kdml eval RUN --data-root NEW reads a run's moved data. A run whose data folder
    was moved away, or a --data-root mistyped, had been told "data root DIR is not a folder",
    as for a file given there, which sends the user looking at the wrong thing."""
    from kdml.data.registry import FORMATS, find_root

    root = tmp_path / "CUB_200_2011"
    if kind == "file":
        root.write_text("")
    with pytest.raises(KdmlError, match=f"^cub: data root {root} {why}; pass the folder"):
        find_root(FORMATS["cub"], str(root))


def test_the_readme_layout_names_every_module_and_package_of_kdml():
    """README's Layout lists src/kdml's modules and packages, each with what it holds; the
    file hasher, kdml.file_digest, was added without a line there."""
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("```", 2)[1]
    package = Path(__file__).parent.parent / "src" / "kdml"
    names = {path.name for path in package.glob("*.py") if path.name != "__init__.py"}
    names |= {f"{path.name}/" for path in package.iterdir()
              if path.is_dir() and (path / "__init__.py").is_file()}
    assert sorted(name for name in names if name not in layout) == []


def documented_settings() -> tuple[dict[str, str], str]:
    """README's configuration table, row by section (``data`` -> its keys' text), and the text
    of README and docs/recipes.md together, where the recipes' ``method`` settings are told."""
    root = Path(__file__).parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`"): line.split("|", 2)[2]
            for line in readme.splitlines() if line.startswith("| `")}
    return rows, readme + (root / "docs" / "recipes.md").read_text(encoding="utf-8")


def test_every_setting_of_every_recipe_is_documented():
    """README says each section's keys and docs/recipes.md each recipe's defaults, while
    ``kdml config RECIPE`` lists every key: DTML's method.activation, method.init,
    method.mmd_kernel and method.mmd_num_kernels, and the SimCLR recipes' method.crop_size and
    method.crop_scale_min, were named in neither, so a user could not learn what values they
    take (``linear`` or ``gaussian``; ``identity`` or ``standard``; 0 = the input's size)."""
    from kdml.config import all_keys, resolve_config
    from kdml.training.recipes import RECIPES

    rows, text = documented_settings()
    undocumented = set()
    for recipe in RECIPES.values():
        config = resolve_config(recipe.name, recipe.params, recipe.defaults, None, [])
        for key in all_keys(config):
            section, leaf = key.split(".", 1)
            if section == "method":  # `leaf`, `method.leaf=...`, `leaf: ...`, "leaf = 5"
                if not re.search(rf"`(method\.)?{leaf}[`:= ]|\b{leaf} [=*] ", text):
                    undocumented.add(key)
            elif f"`{leaf}`" not in rows[section] and f"`{leaf}` (" not in rows[section]:
                undocumented.add(key)
    assert sorted(undocumented) == [], sorted(undocumented)


def test_every_option_of_every_command_is_documented():
    """Each ``kdml`` subcommand and option is told in README or docs/ (datasets, inspecting,
    reproducing, recipes), not only in its --help: ``analyze generalization``'s ``--repeats``
    and ``--neighbors``, ``plot charts``'s ``--thumbnails`` and ``kdml --version`` were not."""
    import argparse

    from kdml.cli.parser import build_parser

    root = Path(__file__).parent.parent
    text = "".join((root / name).read_text(encoding="utf-8") for name in (
        "README.md", "docs/datasets.md", "docs/inspecting.md", "docs/reproducing.md",
        "docs/recipes.md"))

    def undocumented(parser: argparse.ArgumentParser, command: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if f"kdml {name}" not in text and f"{command} {name}" not in text:
                        found.append(f"{command} {name}")
                    found += undocumented(sub, f"{command} {name}")
            found += [f"{command} {option}" for option in action.option_strings
                      if option not in ("-h", "--help") and option not in text]
        return found

    assert undocumented(build_parser(), "kdml") == []


def test_readme_names_every_command_that_reads_a_moved_run_s_data_root():
    """README's "When a run's data moves, `kdml eval RUN --data-root NEW` (and ...)" names
    every command that reads a trained run with ``--data-root`` (all but ``train`` and
    ``config``, whose ``--data-root`` is a new run's), by its first word: ``analyze`` was left
    out of the list though ``kdml analyze generalization`` takes it."""
    import argparse

    from kdml.cli.parser import build_parser

    text = " ".join((Path(__file__).parent.parent / "README.md").read_text(
        encoding="utf-8").split())
    (listed_part,) = re.findall(r"`kdml eval RUN --data-root NEW` \(and ([^)]*)\)", text)
    listed_commands = {"eval", *re.findall(r"`([a-z]+)`", listed_part)}

    def taking(parser: argparse.ArgumentParser, command: tuple[str, ...]) -> set[str]:
        found = set()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found |= taking(sub, (*command, name))
            elif "--data-root" in action.option_strings:
                found.add(command[0])
        return found

    assert listed_commands == taking(build_parser(), ()) - {"train", "config"}


def test_reproducing_md_quotes_the_measured_d64_atlas_run_times():
    """docs/reproducing.md's time of a d = 64 Atlas run is docs/benchmarks.md's measured
    ranges (2026-11-25's runs: on the quiet machine, and beside other work), not a rounded
    "7 to 14" that neither range gives."""
    root = Path(__file__).parent.parent

    def flat(name: str) -> str:
        return " ".join((root / name).read_text(encoding="utf-8").split())

    (quiet, busy) = re.findall(r"a d = 64 Atlas run ([\d.]+ to [\d.]+), and ([\d.]+ to [\d.]+) "
                               r"beside other work", flat("docs/reproducing.md"))[0]
    assert f"{quiet} on the otherwise quiet machine, {busy} beside the test suite" in flat(
        "docs/benchmarks.md")


def test_readme_names_every_setting_a_run_warns_it_never_reads():
    """README's "A setting given another value than the recipe's default that the run never
    reads is warned of" lists what the trainer and the recipes' ``unread_settings`` warn of:
    ``optim.lr_gamma`` without a schedule, JRD's ``method.kernel_multiplier`` and
    ``method.polynomial_degree`` without the kernels they shape, every JRD regularizer setting
    at ``method.alpha=0`` and DTML's ``method.mmd_num_kernels`` with the linear MMD were warned
    of but named nowhere, so a user could not tell a warning's rule from the documentation."""
    import fnmatch
    import inspect

    from kdml.training import trainer
    from kdml.training.recipes.dtml import DTMLParams
    from kdml.training.recipes.jrd import JRDParams

    readme = " ".join((Path(__file__).parent.parent / "README.md").read_text(
        encoding="utf-8").split())
    paragraph = readme.split("that the run never reads is warned of", 1)[1].split(
        "A run folder holds", 1)[0]
    named = set(re.findall(r"`([a-z_.*]+)", paragraph))
    warned = set(re.findall(r'\("((?:data|model|optim|train|eval|domain)\.[a-z_]+)"',
                            inspect.getsource(trainer._unread_settings)))
    assert {"optim.proxy_lr", "optim.lr_gamma", "domain.kernel"} <= warned  # the regex reads
    warned |= {"data.resize", "data.image_size"}  # f"data.{key}" for in-memory images
    for params, default in (
            (JRDParams(layers=["emb"], pool_kernel="laplace", pool_num_kernels=2,
                       cls_kernel="laplace", cls_num_kernels=2), JRDParams()),
            (JRDParams(emb_kernel="laplace", emb_num_kernels=2), JRDParams()),
            (JRDParams(pool_num_kernels=1, emb_num_kernels=1, kernel_multiplier=3.0,
                       polynomial_degree=3), JRDParams()),
            (JRDParams(alpha=0.0, regularizer="jmmd", layers=["emb"]), JRDParams()),
            (DTMLParams(beta=0.0, mmd_kernel="gaussian", mmd_num_kernels=2), DTMLParams()),
            (DTMLParams(mmd_num_kernels=2, tau=1.0), DTMLParams())):
        warned |= {key for key, _ in params.unread_settings(default)}

    def documented(key: str) -> bool:
        leaf = key.split(".", 1)[1]
        return any(key == name or leaf == name or fnmatch.fnmatch(leaf, name.split(".")[-1])
                   and "*" in name for name in named)

    assert sorted(key for key in warned if not documented(key)) == []


def test_inspecting_md_names_the_hidden_partials_as_kdml_makes_them(tmp_path, monkeypatch):
    """docs/inspecting.md names what a SIGKILL leaves of ``kdml embed`` and ``kdml index``
    (``.NAME.PID.XXXX.npz``, ``.NAME.partial-PID.XXXX/``), for a user to find and delete: the
    index's was given as ``.NAME.partial-XXXX/``, without the process id that build_index puts
    in it."""
    import numpy as np

    from kdml.evaluation.index import IndexInfo, build_index
    from kdml.file_write import write_through_new_file

    text = " ".join((Path(__file__).parent.parent / "docs" / "inspecting.md").read_text(
        encoding="utf-8").split())
    (npz, folder) = re.findall(r"leaves the hidden partial \(`([^`]+)`, `([^`]+)`\)", text)[0]

    def pattern(documented: str) -> str:
        """The documented name as a regex, NAME, PID and XXXX read as what they stand for."""
        escaped = re.escape(documented).replace("NAME", "out")
        return escaped.replace("PID", str(os.getpid())).replace("XXXX", "[0-9a-f]+")

    partials: list[str] = []
    write_through_new_file(tmp_path / "out.npz", lambda partial: (
        partials.append(partial.name), partial.write_bytes(b"npz")), replace=False)
    replace = os.replace  # build_index renames its hidden folder into place
    monkeypatch.setattr(os, "replace", lambda source, target: (
        partials.append(Path(source).name), replace(source, target))[1])
    vectors = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    items = {"labels": np.arange(10) % 2, "positions": np.arange(10),
             "sources": np.array([f"test[{i}]" for i in range(10)])}
    build_index(tmp_path / "out", vectors, items,
                IndexInfo(str(tmp_path), "0" * 64, "cosine", 0, "exact", 0, 1.0))
    assert len(partials) == 2
    assert re.fullmatch(pattern(npz), partials[0]), (npz, partials[0])
    assert re.fullmatch(pattern(folder.rstrip("/")), partials[1]), (folder, partials[1])


def test_inspecting_md_quotes_what_kdml_eval_does_with_a_user_s_eval_json(tmp_path):
    """docs/inspecting.md had said only that a user's own eval.json is "refused, not
    replaced": not that the refusal comes before any scoring (no metrics printed), nor the
    line printed, nor what to do. It quotes the line the code gives."""
    from kdml.cli.evaluate import EVAL_FIELDS
    from kdml.training.run_folder import check_json_replaceable

    (tmp_path / "eval.json").write_text('{"mine": 1}')
    with pytest.raises(KdmlError) as caught:
        check_json_replaceable(tmp_path / "eval.json", EVAL_FIELDS)
    text = " ".join((Path(__file__).parent.parent / "docs" / "inspecting.md").read_text(
        encoding="utf-8").split())
    line = str(caught.value).replace(str(tmp_path), "RUN")
    assert f"stops before it scores anything (no metrics printed, exit status 2) with `kdml: " \
           f"error: {line}`. Move or rename your file and run the same command again" in text


def test_readme_gives_the_exit_statuses_the_command_returns(tmp_path, monkeypatch, capsys):
    """README said nothing of kdml's exit statuses (a script running kdml had to guess which
    are refusals): it gives them, and they are the ones main returns."""
    from kdml.cli import _memory_stop
    from kdml.cli.output import _stop_code
    from kdml.errors import Terminated

    text = " ".join((Path(__file__).parent.parent / "README.md").read_text(
        encoding="utf-8").split())
    assert ("Every command exits with status 0 when it did its work; 2 when it refused (a usage "
            "error or a bad input, said in one line on stderr that starts `kdml: error:`, with "
            "no traceback); 1 when it ran out of memory, when another process of a torchrun "
            "job stopped, or when `kdml reproduce` could not run one of its experiments (each "
            "said in one line); 130 on Ctrl-C and 143 on a kill (SIGTERM).") in text
    monkeypatch.chdir(tmp_path)
    assert cli.main(["recipes"]) == 0
    assert cli.main(["eval"]) == 2  # usage
    assert cli.main(["eval", str(tmp_path / "none")]) == 2  # a refusal
    assert capsys.readouterr().err.count("kdml: error: ") == 2
    assert _memory_stop("out of memory", "lower data.batch_size", "train") == 1
    assert _stop_code(KeyboardInterrupt())[0] == 130 and _stop_code(Terminated())[0] == 143
