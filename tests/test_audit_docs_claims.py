"""Numbers the documentation gives about kdml reproduce and the digit pairs, against what the
code plans and the committed records hold (README.md, docs/reproducing.md, docs/inspecting.md,
docs/datasets.md): the seeds ``--quick`` runs, the size of its grid and of the CPU grids, the
run folder docs/inspecting.md names, the pairs' own source-NN accuracy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kdml import cli
from kdml.errors import KdmlError
from kdml.reproduce import runner
from kdml.reproduce.catalog import experiments

ROOT = Path(__file__).resolve().parents[1]


def flat(doc: str) -> str:
    """``doc``'s text with every run of white space one space (its lines joined)."""
    return " ".join((ROOT / doc).read_text(encoding="utf-8").split())


def planned_runs(chosen: list, seeds: int, runs: Path = Path("runs/reproduce")) -> list[Path]:
    """The run folders ``kdml reproduce`` trains for ``chosen`` on the CPU, each once."""
    return [run.run_dir for run in runner.unique_runs(runner.plan(chosen, seeds, runs, "cpu"))]


@pytest.fixture(scope="module")
def seeds_used(tmp_path_factory) -> dict[bool, int]:
    """The seeds per cell ``kdml reproduce dtml`` plans without ``--seeds``, with and without
    ``--quick`` (caught where it would start training, which then stops)."""
    folder = tmp_path_factory.mktemp("seeds")
    used: dict[bool, int] = {}

    def caught(chosen: list, seeds: int, runs: Path, device: str, progress: object) -> list:
        used[any(command == "--quick" for command in argv)] = seeds
        raise KdmlError("stopped by the test before training")

    patch = pytest.MonkeyPatch()
    patch.setattr(runner, "reproduce", caught)
    try:
        for quick in (False, True):
            argv = ["reproduce", "dtml", "--runs", str(folder / f"runs-{quick}"), "--out",
                    str(folder / f"report-{quick}.md"), "--device", "cpu", "--no-progress",
                    *(["--quick"] if quick else [])]
            assert cli.main(argv) == 2
    finally:
        patch.undo()
    return used


def test_readme_gives_the_seeds_kdml_reproduce_runs_with_and_without_quick(seeds_used):
    """README said the tables average over ``--seeds`` seeds "(default 5)"; ``--quick``, which
    the same section offers, runs 3 (its 72 runs are 3 seeds' worth)."""
    found = re.search(r"over `--seeds` seeds \(default (\d+); (\d+) with `--quick`\)",
                      flat("README.md"))
    assert found, "README does not say the seeds kdml reproduce runs with --quick"
    assert seeds_used == {False: int(found.group(1)), True: int(found.group(2))}


def test_the_docs_give_the_size_of_the_quick_grid_as_it_is_planned(seeds_used):
    """README and docs/reproducing.md: "--quick runs a cut-down grid of 11 experiments ...
    (72 runs in 3 minutes on a 2-core CPU)"."""
    quick = experiments("all", quick=True)
    runs = planned_runs(quick, seeds_used[True])
    for doc in ("README.md", "docs/reproducing.md"):
        said = re.search(r"`--quick` runs a cut-down grid of (\d+) experiments .*?\((\d+) runs "
                         r"in 3 minutes", flat(doc))
        assert said, doc
        assert (int(said.group(1)), int(said.group(2))) == (len(quick), len(runs)), doc


def test_reproducing_md_gives_the_cpu_table2_grids_cells_and_runs(seeds_used):
    """docs/reproducing.md: the CPU setting's Table 2 experiments run "15 cells, 75 runs at 5
    seeds, on each"."""
    said = re.search(r"`(atlas-table2-cnn-mnist5k)`, `(atlas-table2-cnn-fashion-mnist)` and .*?"
                     r"\(all of it, d = 2, 4 and 8: (\d+) cells, (\d+) runs at (\d+) seeds",
                     flat("docs/reproducing.md"))
    assert said and int(said.group(5)) == seeds_used[False]
    catalog = {experiment.key: experiment for experiment in experiments("all")}
    for key in said.group(1, 2):
        assert len(catalog[key].cells) == int(said.group(3)), key
        assert len(planned_runs([catalog[key]], int(said.group(5)))) == int(said.group(4)), key


def test_inspecting_md_names_the_folder_its_command_trains_the_run_in():
    """docs/inspecting.md names the run it shows (``runs/reproduce/jrd-fashion-mnist-.../
    seed-0``) and the command that trains it "(with the other four rows of that table) under
    that name": the folder's name hashes the run's settings, so a change to them, or to what
    the hash leaves out, renames it."""
    text = flat("docs/inspecting.md")
    folder = re.search(r"`RUN` stands for its folder, `([^`]+)`", text).group(1)
    command = re.search(r"`(kdml reproduce jrd --only [^`]+)` trains it", text).group(1)
    only = re.search(r"--only (\S+)", command).group(1)
    seeds = int(re.search(r"--seeds (\d+)", command).group(1))
    assert "--device cpu" in command
    chosen = [experiment for experiment in experiments("jrd") if experiment.key == only]
    runs = planned_runs(chosen, seeds)
    assert Path(folder) in runs
    assert "with the other four rows of that table" in text and len(runs) == 5


def test_datasets_md_gives_the_digit_pairs_source_nn_accuracy_as_the_pca_rows_record_it():
    """docs/datasets.md gives the source-NN accuracy of the digit pairs' own features. It said
    0.597 for ``digits->mnist5k``, where docs/reproduction-dtml.md's PCA row (all 64
    components, the features' own distances) records 0.598 and docs/findings.md says the row
    moved from 0.597 to 0.598 (the exact Euclidean 0.5976)."""
    report = (ROOT / "docs" / "reproduction-dtml.md").read_text(encoding="utf-8")
    recorded = {}
    for pair in ("mnist5k->digits", "digits->mnist5k"):
        section = report.split(f"LFW table: {pair}\n", 1)[1]
        recorded[pair] = re.search(r"^\| PCA \| (\d\.\d{3}) \+- ", section, re.MULTILINE).group(1)
    said = re.search(r"on these raw features \(exact search, this machine\): `mnist5k->digits` "
                     r"(\d\.\d{3}), `digits->mnist5k` (\d\.\d{3})", flat("docs/datasets.md"))
    assert said
    assert dict(zip(recorded, said.groups(), strict=True)) == recorded
