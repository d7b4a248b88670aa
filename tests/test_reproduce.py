"""kdml reproduce: the test-part protocol, the claim verdicts, the catalog, the runner's reuse of
finished runs, and the report (end to end on tiny grids)."""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import math
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from kdml import cli
from kdml.config import CONFIG_FORMAT, FORMAT_KEY, RunConfig
from kdml.data.registry import DATASETS
from kdml.errors import KdmlError
from kdml.evaluation.estimate import Estimate
from kdml.evaluation.parts import retrieval_over_parts, stratified_parts
from kdml.reproduce.catalog import PAPERS, experiments
from kdml.reproduce.experiments import PROTOCOLS, Cell, Claim, Experiment, verdict
from kdml.reproduce.report import MARKER, ReportContext, plots_folder, write_report
from kdml.reproduce.runner import (
    CHARTS_RECORD,
    CellResult,
    ExperimentResult,
    PlannedRun,
    cell_config,
    logged_seconds,
    plan,
    reproduce,
    run_folder_of,
    train_planned,
)
from kdml.training.run_folder import RunFolder, hold_folder


def test_parts_are_disjoint_cover_every_class_and_are_balanced():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, size=500)
    labels[:140] = np.repeat(np.arange(7), 20)  # every class has at least 20 samples
    parts = stratified_parts(labels, 10, seed=3)
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(500))
    for part in parts:
        assert set(labels[part].tolist()) == set(range(7))
    for label in range(7):
        sizes = [int(np.sum(labels[part] == label)) for part in parts]
        assert max(sizes) - min(sizes) <= 1
    assert [p.tolist() for p in parts] == [p.tolist() for p in stratified_parts(labels, 10, 3)]
    assert [p.tolist() for p in parts] != [p.tolist() for p in stratified_parts(labels, 10, 4)]


def test_parts_are_sorted_index_arrays():
    """stratified_parts promises each part's indices in ascending order (a part read in sample
    order, whatever the seeded dealing order was): 3 parts of 2 classes of 6."""
    labels = np.array([0, 1] * 6)
    parts = stratified_parts(labels, 3, seed=1)
    assert len(parts) == 3
    for part in parts:
        indices = part.tolist()
        assert all(a < b for a, b in zip(indices, indices[1:], strict=False)), indices
        assert sorted(labels[part].tolist()) == [0, 0, 1, 1]


def test_parts_refuse_classes_too_small_for_every_part():
    labels = np.array([0] * 30 + [1] * 19)
    with pytest.raises(KdmlError, match="fewer than 20 samples.*use fewer parts"):
        stratified_parts(labels, 10)
    with pytest.raises(KdmlError, match="at least 1"):
        stratified_parts(labels, 0)


def _literal_recall(vectors: np.ndarray, labels: np.ndarray, k: int,
                    metric: str = "cosine") -> float:
    """Recall@K with plain loops, float64, cosine similarity or Euclidean distance, query
    left out."""
    points = [v.tolist() for v in vectors.astype(np.float64)]
    if metric == "cosine":
        points = [[x / math.sqrt(sum(y * y for y in v)) for x in v] for v in points]

    def score(a: list[float], b: list[float]) -> float:  # smaller is nearer
        if metric == "cosine":
            return -sum(x * y for x, y in zip(a, b, strict=True))
        return sum((x - y) ** 2 for x, y in zip(a, b, strict=True))

    hits = 0
    for i in range(len(points)):
        scores = [(score(points[i], points[j]), j) for j in range(len(points)) if j != i]
        scores.sort()
        hits += any(labels[j] == labels[i] for _, j in scores[:k])
    return hits / len(points)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_retrieval_over_parts_is_the_mean_of_each_parts_literal_recall(metric):
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(4), 12)
    vectors = rng.normal(size=(48, 5)) + labels[:, None] * 0.4
    estimates = retrieval_over_parts(torch.from_numpy(vectors).float(), torch.from_numpy(labels),
                                     ks=(1, 2), num_parts=3, metric=metric, seed=5)
    parts = stratified_parts(labels, 3, seed=5)
    # the two metrics rank these differently: the metric is not ignored (it had been untested)
    assert ([_literal_recall(vectors[part], labels[part], 1, "cosine") for part in parts]
            != [_literal_recall(vectors[part], labels[part], 1, "euclidean") for part in parts])
    for k in (1, 2):
        per_part = [_literal_recall(vectors[part], labels[part], k, metric) for part in parts]
        assert estimates[f"recall@{k}"].mean == pytest.approx(np.mean(per_part), abs=1e-12)
        expected_ci = stats.t.ppf(0.975, 2) * np.std(per_part, ddof=1) / math.sqrt(3)
        assert estimates[f"recall@{k}"].ci95 == pytest.approx(expected_ci, abs=1e-12)


def test_retrieval_over_parts_refuses_labels_of_another_length_and_one_part():
    """Labels shorter than the vectors used to score only the first rows, silently; one part
    gave an interval of NaN."""
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(4), 12)
    vectors = rng.normal(size=(48, 5))
    with pytest.raises(KdmlError, match=r"^labels must have shape \(48,\) to match the "
                                        r"embeddings, got \(40,\)$"):
        retrieval_over_parts(vectors, labels[:40], ks=(1,), num_parts=2)
    with pytest.raises(KdmlError, match=r"^num_parts must be an integer of at least 2"):
        retrieval_over_parts(vectors, labels, ks=(1,), num_parts=1)
    with pytest.raises(KdmlError, match=r"^vectors contains NaN or infinite values$"):
        retrieval_over_parts(np.full((48, 5), np.nan), labels, ks=(1,), num_parts=2)


@pytest.mark.parametrize(("better", "worse", "lower", "expected"), [
    ([0.8, 0.82, 0.81], [0.7, 0.71, 0.72], False, "holds: A is higher by +0.100"),
    ([0.7, 0.71, 0.72], [0.8, 0.82, 0.81], False, "does not hold: A is lower by 0.100"),
    ([0.80, 0.70, 0.75], [0.75, 0.75, 0.74], False, "not shown"),
    # lower is better: "lower by 0.205", as README words it, not "lower by +0.205"
    ([0.3, 0.31], [0.5, 0.52], True, "holds: A is lower by 0.205 +- "),
    ([0.9], [0.8], False, "not testable with one seed (A higher by 0.100)"),
    ([0.8], [0.9], False, "not testable with one seed (A lower by 0.100)"),
    ([0.3], [0.5], True, "not testable with one seed (A lower by 0.200)"),
    ([0.5], [0.3], True, "not testable with one seed (A higher by 0.200)"),
])
def test_verdict(better, worse, lower, expected):
    claim = Claim("A beats B", "A", "B", "recall@1", lower_is_better=lower)
    assert verdict(claim, better, worse).startswith(expected)


def test_an_experiment_s_cell_is_found_by_its_whole_label():
    """``alpha = 1`` is not the row ``alpha = 1.5`` listed before it, and a part of a label
    names no row."""
    cells = (Cell("alpha = 1.5", "jrd"), Cell("alpha = 1", "jrd"))
    experiment = Experiment("key", "jrd", "Table 1", "title", "mnist5k", cells, ("recall@1",))
    assert experiment.cell("alpha = 1") is cells[1]
    with pytest.raises(KeyError, match="has no cell 'alpha'"):
        experiment.cell("alpha")


@pytest.mark.parametrize(("better", "worse", "lower", "expected"), [
    # a difference the same in every seed has a t interval of width 0: no evidence either way
    ([0.5, 0.6, 0.52], [0.4, 0.5, 0.42], False,
     "not testable: A is higher by the same 0.100 in all 3 seeds, no spread to judge it by"),
    ([0.5, 0.6], [0.5, 0.6], False, "not shown: the two are equal in all 2 seeds"),
    # lower is better: the measured difference (A minus B) keeps its sign when not shown
    ([1.134, 1.12, 1.14], [1.123, 1.13, 1.11], True,
     "not shown: A minus B is +0.010 +- 0.050, 3 seeds, within the seeds' spread"),
    # a seed that diverged in either cell is left out, and the line says where
    ([0.8, 0.9, np.nan, 0.7], [0.75, 0.8, 0.7, np.nan], False,
     "not shown: A minus B is +0.075 +- 0.318, 2 seeds, within the seeds' spread; 2 seeds left "
     "out, where A and B diverged"),
    # one seed equal in both cells: no direction to report
    ([0.5], [0.5], False, "not testable with one seed (the two are equal)"),
    # a mean that rounds to zero gets the decimals that show it, and never "-0.000"
    ([0.7, 0.7006, 0.7], [0.7004, 0.7, 0.7008], False,
     "not shown: A minus B is -0.0002 +- 0.0018, 3 seeds, within the seeds' spread"),
    ([0.8, 0.81, np.nan, 0.83], [0.7, 0.72, 0.7, 0.71], False,
     "holds: A is higher by +0.103 +- 0.038, 3 seeds; 1 seed left out, where A diverged"),
    # differences summing to 0 up to float rounding (mnist1d's alpha 1 and 0, seeds 0-4) had
    # printed "+0.000000 +- 0.009391": the rounding error is no difference to show
    ([0.854, 0.8336, 0.848, 0.8176, 0.8472], [0.8524, 0.8396, 0.8412, 0.8272, 0.84], False,
     "not shown: A minus B is +0.000 +- 0.009, 5 seeds, within the seeds' spread"),
])
def test_verdict_says_what_it_cannot_judge(better, worse, lower, expected):
    claim = Claim("A beats B", "A", "B", "recall@1", lower_is_better=lower)
    assert verdict(claim, better, worse) == expected


def test_verdict_prints_the_decimals_that_tell_the_interval_from_zero():
    """Rounded to 3 decimals, 0.0126 +- 0.0134 (not shown) and 0.0134 +- 0.0126 (holds) both
    print 0.013 +- 0.013: more decimals show on which side of 0 the interval ends."""
    claim = Claim("A beats B", "A", "B", "recall@1")
    for mean, half_width, expected in ((0.0126, 0.0134, "not shown: A minus B is +0.0126 +- "
                                        "0.0134"),
                                       (0.0134, 0.0126, "holds: A is higher by +0.0134 +- "
                                        "0.0126"),
                                       (-0.0134, 0.0126, "does not hold: A is lower by 0.0134 "
                                        "+- 0.0126")):
        # four seeds, two at mean - x and two at mean + x: the t interval has this half-width
        x = half_width * 2 / stats.t.ppf(0.975, 3) / np.sqrt(4 / 3)
        differences = [mean - x, mean - x, mean + x, mean + x]
        assert verdict(claim, differences, [0.0] * 4).startswith(expected)


def test_verdict_refuses_cells_of_unequal_seeds():
    claim = Claim("A beats B", "A", "B", "recall@1")
    with pytest.raises(ValueError, match="one value per seed in each cell: 3 against 2"):
        verdict(claim, [0.5, 0.52, 0.9], [0.4, 0.41])


def test_verdict_interval_is_the_paired_student_t_interval():
    claim = Claim("A beats B", "A", "B", "recall@1")
    better, worse = [0.80, 0.85, 0.83, 0.90], [0.79, 0.80, 0.84, 0.82]
    differences = np.subtract(better, worse)
    half_width = stats.t.ppf(0.975, 3) * differences.std(ddof=1) / 2
    assert f"{differences.mean():+.3f} +- {half_width:.3f}, 4 seeds" in verdict(claim, better,
                                                                               worse)


@pytest.mark.parametrize("quick", [False, True])
def test_catalog_is_consistent_and_every_cell_resolves(quick, tmp_path):
    found = experiments("all", quick)
    keys = [experiment.key for experiment in found]
    assert len(keys) == len(set(keys))
    assert {experiment.paper for experiment in found} == set(PAPERS)
    for experiment in found:
        assert experiment.protocol in PROTOCOLS
        labels = [cell.label for cell in experiment.cells]
        assert len(labels) == len(set(labels)), experiment.key
        settings = [override.split("=")[0] for override in experiment.common]
        assert len(settings) == len(set(settings)), experiment.key  # --list prints each once
        for claim in experiment.claims:
            assert claim.better in labels and claim.worse in labels, (experiment.key, claim)
            assert claim.metric in experiment.metrics
        for cell in experiment.cells:
            assert all(0 <= value <= 2 for value in cell.paper.values()), cell
    planned = plan(found, 1, tmp_path, "cpu")  # every config resolves (and so validates)
    assert len(planned) == sum(len(experiment.cells) for experiment in found)
    # each row is its own configuration: a row whose override restated a recipe default (an
    # ablation "reverting" a setting to the value it has) would read another row's runs, and
    # its claim would compare a configuration with itself
    for experiment in found:
        folders = [planned[experiment.key, cell.label][0].run_dir for cell in experiment.cells]
        assert len(set(folders)) == len(folders), experiment.key
        # --quick runs score no NMI, which costs more than their few steps of training
        assert not quick or all(planned[experiment.key, cell.label][0].config.eval.nmi is False
                                for cell in experiment.cells), experiment.key


def test_full_catalog_covers_the_issue_s_grids():
    found = {experiment.key: experiment for experiment in experiments("all")}
    table2 = found["atlas-table2-fashion-mnist"]
    assert len(table2.cells) == 3 + 4 * 3  # SimCLR at d = 2, 4, 8; MSimCLR n x d
    alpha = found["jrd-alpha-mnist1d"]
    assert [cell.x for cell in alpha.cells] == [0.0, 0.25, 0.5, 1.0, 1.5, 2.0]
    assert {found[f"dtml-{pair}"].dataset for pair in ("mnist5k-to-digits",
                                                        "digits-to-mnist5k")} == {
        "mnist5k->digits", "digits->mnist5k"}
    assert [cell.recipe for cell in found["dtml-mnist5k-to-digits"].cells] == [
        "pca", "ddml-logistic", "ddml", "dtml", "dstml"]


@pytest.mark.parametrize("dataset", ["mnist5k", "fashion-mnist"])
def test_the_cpu_setting_of_atlas_table2_changes_only_backbone_and_epochs(dataset, tmp_path):
    # Issue 12 keeps a small-CNN setting for CPU runs; its rows must differ from the paper's
    # setting (Appendix A.1) only where the catalog says so, on each dataset of Table 2.
    found = {experiment.key: experiment for experiment in experiments("atlas")}
    table2 = found[f"atlas-table2-{dataset}"]
    cpu_table2 = found[f"atlas-table2-cnn-{dataset}"]
    assert [cell.paper for cell in cpu_table2.cells] == [
        table2.cell(cell.label).paper for cell in cpu_table2.cells]
    paper_config = cell_config(table2, table2.cell("MSimCLR, n = 16, d = 2"), 0, "cpu")
    cpu_config = cell_config(cpu_table2, cpu_table2.cell("MSimCLR, n = 16, d = 2"), 0, "cpu")
    paper_values, cpu_values = paper_config.to_dict(), cpu_config.to_dict()
    changed = {(section, key) for section, values in paper_values.items()
               if isinstance(values, dict) for key in values
               if values[key] != cpu_values[section][key]}
    assert changed == {("model", "backbone"), ("model", "small_input"), ("train", "epochs"),
                       ("train", "eval_every")}  # scored after the last epoch: follows epochs
    assert (cpu_config.model.backbone, cpu_config.train.epochs) == ("cnn", 10)
    assert cpu_table2.paper_data.startswith(
        {"mnist5k": "MNIST (", "fashion-mnist": "Fashion-MNIST ("}[dataset])
    assert "cnn" not in " ".join(experiment.key for experiment in experiments("atlas", True))


def test_the_cpu_table2_has_the_paper_s_rows_and_columns_on_both_datasets():
    # Fashion-MNIST's runs take 15 to 48 minutes each on one core (mnist5k's a minute or two):
    # its d = 8 column joined when its 25 runs were in
    found = {experiment.key: experiment for experiment in experiments("atlas")}
    labels = {key: {cell.label for cell in found[key].cells} for key in found}
    for dataset in ("mnist5k", "fashion-mnist"):
        assert labels[f"atlas-table2-cnn-{dataset}"] == labels[f"atlas-table2-{dataset}"]
    claims = {key: {claim.text for claim in found[key].claims} for key in found}
    assert claims["atlas-table2-mnist5k"] < claims["atlas-table2-cnn-mnist5k"]
    assert {text for text in claims["atlas-table2-cnn-mnist5k"] if "d = 8" in text} == set()
    assert found["atlas-table2-cnn-mnist5k"].sweep == "d"
    assert found["atlas-table2-cnn-fashion-mnist"].sweep == "d"  # three columns: plotted over d


def test_the_cpu_ablation_is_table2_s_setting_less_the_backbone(tmp_path):
    # The CPU ablation's base must be the CPU Table 2's n = 16 run, trained once.
    found = {experiment.key: experiment for experiment in experiments("atlas")}
    ablation = found["atlas-ablation-mnist5k"]
    cpu_ablation = found["atlas-ablation-cnn-mnist5k"]
    cpu_table2 = found["atlas-table2-cnn-mnist5k"]
    assert [cell.label for cell in cpu_ablation.cells] == [
        cell.label for cell in ablation.cells if cell.label != "small CNN instead of ResNet-18"]
    base = run_folder_of(cell_config(cpu_ablation, cpu_ablation.cell("Appendix A.1"), 0, "cpu"),
                         tmp_path)
    cpu_config = cell_config(cpu_table2, cpu_table2.cell("MSimCLR, n = 16, d = 2"), 0, "cpu")
    assert base == run_folder_of(cpu_config, tmp_path)


def changed_settings(first: RunConfig, second: RunConfig) -> set[tuple[str, str]]:
    """The (section, key) settings whose values differ between two configs."""
    first_values, second_values = first.to_dict(), second.to_dict()
    return {(section, key) for section, values in first_values.items()
            if isinstance(values, dict) for key in values
            if values[key] != second_values[section][key]}


def test_the_epochs_ablation_reuses_the_cpu_table2_runs_and_changes_only_the_epochs(tmp_path):
    # Its 10-epoch rows are the CPU Table 2's runs (trained once); its 100-epoch rows differ
    # from them in the epochs alone (and eval_every, which follows them), so that the
    # comparison isolates the epochs from the backbone.
    found = {experiment.key: experiment for experiment in experiments("atlas")}
    epochs, cpu_table2 = found["atlas-epochs-cnn-mnist5k"], found["atlas-table2-cnn-mnist5k"]
    for name in ("SimCLR", "MSimCLR, n = 1", "MSimCLR, n = 16"):
        short = cell_config(epochs, epochs.cell(f"{name}, d = 2, 10 epochs"), 0, "cpu")
        long = cell_config(epochs, epochs.cell(f"{name}, d = 2, 100 epochs"), 0, "cpu")
        table2 = cell_config(cpu_table2, cpu_table2.cell(f"{name}, d = 2"), 0, "cpu")
        assert run_folder_of(short, tmp_path) == run_folder_of(table2, tmp_path)
        assert changed_settings(short, long) == {("train", "epochs"), ("train", "eval_every")}
        assert (short.train.epochs, long.train.epochs) == (10, 100)
    assert {claim.better for claim in epochs.claims} <= {
        "MSimCLR, n = 16, d = 2, 100 epochs", "SimCLR, d = 2, 100 epochs"}


@pytest.mark.parametrize(("dataset", "dims"), [
    ("mnist5k", (2, 4, 8)),
    # Fashion-MNIST's runs take 15 to 39 minutes each: its d = 2 column alone
    ("fashion-mnist", (2,))])
def test_the_head_ablation_reuses_the_cpu_table2_runs_and_changes_only_the_heads(
        tmp_path, dataset, dims):
    # Its hidden-d rows are the CPU Table 2's runs; its hidden-64 rows differ from them in the
    # projection heads' width alone.
    found = {experiment.key: experiment for experiment in experiments("atlas")}
    heads, cpu_table2 = found[f"atlas-head-cnn-{dataset}"], found[f"atlas-table2-cnn-{dataset}"]
    names = ("SimCLR", "MSimCLR, n = 1", "MSimCLR, n = 16")
    assert {cell.label for cell in heads.cells} == {
        f"{name}, d = {d}, hidden {width}" for name in names for d in dims
        for width in ("d", "64")}
    for name in names:
        for d in dims:
            narrow = cell_config(heads, heads.cell(f"{name}, d = {d}, hidden d"), 0, "cpu")
            wide = cell_config(heads, heads.cell(f"{name}, d = {d}, hidden 64"), 0, "cpu")
            table2 = cell_config(cpu_table2, cpu_table2.cell(f"{name}, d = {d}"), 0, "cpu")
            assert run_folder_of(narrow, tmp_path) == run_folder_of(table2, tmp_path)
            assert changed_settings(narrow, wide) == {("method", "proj_hidden")}
            assert (narrow.method.proj_hidden, wide.method.proj_hidden) == (0, 64)


def test_the_mmd_weight_ablation_reuses_the_wide_head_runs_and_changes_only_lambda1(tmp_path):
    found = {experiment.key: experiment for experiment in experiments("atlas")}
    weights, heads = found["atlas-mmd-weight-cnn-mnist5k"], found["atlas-head-cnn-mnist5k"]
    for d in (2, 4, 8):
        simclr = cell_config(weights, weights.cell(f"SimCLR, d = {d}"), 0, "cpu")
        wide_simclr = cell_config(heads, heads.cell(f"SimCLR, d = {d}, hidden 64"), 0, "cpu")
        assert run_folder_of(simclr, tmp_path) == run_folder_of(wide_simclr, tmp_path)
        for name in ("MSimCLR, n = 1", "MSimCLR, n = 16"):
            with_mmd = cell_config(weights, weights.cell(f"{name}, d = {d}, lambda1 = 20"), 0,
                                   "cpu")
            without = cell_config(weights, weights.cell(f"{name}, d = {d}, lambda1 = 0"), 0,
                                  "cpu")
            wide = cell_config(heads, heads.cell(f"{name}, d = {d}, hidden 64"), 0, "cpu")
            assert run_folder_of(with_mmd, tmp_path) == run_folder_of(wide, tmp_path)
            assert changed_settings(with_mmd, without) == {("method", "lambda1")}
            assert (with_mmd.method.lambda1, without.method.lambda1) == (20.0, 0.0)


def test_jrd_experiments_are_class_disjoint_on_every_dataset():
    # Issue 12: JRD on mnist5k, mnist1d and Fashion-MNIST, class-disjoint. `standard` is
    # class-disjoint only on the offline sets, which have no split of their own.
    for experiment in experiments("jrd"):
        for cell in experiment.cells:
            split = cell_config(experiment, cell, 0, "cpu").data.split
            assert split == "class-disjoint" or (
                split == "standard" and experiment.dataset in DATASETS), experiment.key


def test_identical_configurations_share_one_run_folder(tmp_path):
    jrd = experiments("jrd")
    table2 = next(e for e in jrd if e.key == "jrd-table2-mnist5k")
    sweep = next(e for e in jrd if e.key == "jrd-alpha-mnist5k")
    default = run_folder_of(cell_config(table2, table2.cell("JRD"), 0, "cpu"), tmp_path)
    explicit = run_folder_of(cell_config(sweep, sweep.cell("alpha = 1"), 0, "cpu"), tmp_path)
    other_seed = run_folder_of(cell_config(sweep, sweep.cell("alpha = 1"), 1, "cpu"), tmp_path)
    other_alpha = run_folder_of(cell_config(sweep, sweep.cell("alpha = 2"), 0, "cpu"), tmp_path)
    assert default == explicit
    assert other_seed.parent == explicit.parent and other_seed != explicit
    assert other_alpha.parent != explicit.parent


def test_run_folders_keep_their_names_when_settings_are_added():
    """Runs from earlier versions are reused only if their folder names stay put. A new
    setting changes every name (this literal fails), unless it only says how a run executes
    and goes into EXECUTION_ONLY, or keeps what earlier runs computed at one value and goes into
    ADDED_LATER; otherwise update the literal knowingly: every earlier run is then trained
    again."""
    table2 = next(e for e in experiments("jrd") if e.key == "jrd-table2-mnist5k")
    config = cell_config(table2, table2.cell("JRD"), 0, "cpu")
    assert run_folder_of(config, Path("runs")).parent.name == "jrd-mnist5k-b414363802"
    config.train.compile = True
    assert run_folder_of(config, Path("runs")).parent.name == "jrd-mnist5k-b414363802"
    config.data.validation = 0.2  # added later: a new folder only away from its old value
    assert run_folder_of(config, Path("runs")).parent.name != "jrd-mnist5k-b414363802"


TINY = ("train.epochs=1", "train.steps_per_epoch=3", "eval.nmi=false", "data.batch_size=40",
        "model.embedding_size=8")


def _tiny_experiments() -> list[Experiment]:
    jrd_cells = (Cell("alpha = 0", "jrd", ("method.alpha=0",), series="JRD", x=0.0),
                 Cell("alpha = 1", "jrd", ("method.alpha=1",), paper={"recall@1": 0.5},
                      series="JRD", x=1.0))
    claim = Claim("JRS helps", "alpha = 1", "alpha = 0", "recall@1")
    return [
        Experiment("tiny-parts", "jrd", "Table 2", "parts", "digits", jrd_cells,
                   ("recall@1", "recall@2"), "CUB", (claim,), protocol="parts", common=TINY,
                   sweep="alpha"),
        Experiment("tiny-generalization", "jrd", "Table 3", "terms", "digits", jrd_cells[1:],
                   ("recall@1", "lambda", "h_divergence", "bound"), "CUB",
                   protocol="generalization", common=TINY),
        Experiment("tiny-charts", "atlas", "Table 3", "charts", "digits",
                   (Cell("MTriplet", "mtriplet", ("method.n_charts=2",), plot_charts=True),),
                   ("recall@1",), "CUB", common=(*TINY, "data.batch_size=20")),
        Experiment("tiny-missing", "dtml", "LFW", "cannot run", "digits",
                   (Cell("nothing", "jrd", ("data.dataset=cub",)),), ("recall@1",),
                   common=TINY),
    ]


def test_runner_and_report_end_to_end(tmp_path):
    runs = tmp_path / "runs"
    trained: list[str] = []
    results = reproduce(_tiny_experiments(), 2, runs, "cpu", progress=False,
                        echo=trained.append)
    # each run trained now says that it ended (a log without progress bars shows nothing else)
    failed = sum(line.startswith("  failed: ") for line in trained)  # tiny-missing's 2 seeds
    assert sum(line.startswith("  finished after ") for line in trained) == \
        sum(line.startswith("[") for line in trained) - failed > 0 and failed == 2
    by_key = {result.experiment.key: result for result in results}
    parts = by_key["tiny-parts"].cells["alpha = 1"]
    assert len(parts.values["recall@1"]) == 2 and len(parts.part_ci95["recall@1"]) == 2
    stored = json.loads((parts.run_dirs[0] / "parts.json").read_text())
    assert stored["metrics"]["recall@1"]["mean"] == parts.values["recall@1"][0]
    # computed at Table 2's K whatever the experiment reads, for a later Table 2 sharing it
    assert {"recall@1", "recall@2", "recall@4", "recall@8"} <= set(stored["metrics"])
    # the generalization cell is the parts experiment's "alpha = 1" run, trained once
    general = by_key["tiny-generalization"].cells["alpha = 1"]
    assert general.run_dirs == parts.run_dirs
    # Table 3's Recall@1 (with 95% intervals) is Table 2's parts protocol, not the whole set's
    assert general.values["recall@1"] == parts.values["recall@1"]
    assert general.part_ci95["recall@1"] == parts.part_ci95["recall@1"]
    whole = [json.loads((run / "metrics.json").read_text())["final"]["recall@1"]
             for run in general.run_dirs]
    assert whole != general.values["recall@1"]
    assert general.values["bound"][0] == pytest.approx(
        general.values["lambda"][0] + general.values["h_divergence"][0])
    assert by_key["tiny-charts"].cells["MTriplet"].charts.is_file()
    assert by_key["tiny-missing"].error.startswith("cub: no dataset found (searched: ")

    report = tmp_path / "docs" / "reproduction.md"
    report.parent.mkdir()
    (report.parent / "reproduction.md.tmp").write_text("mine")  # where older kdml wrote first
    context = ReportContext("kdml reproduce all", "a test machine", "torch", 0.1, 2, True)
    on_digits = dataclasses.replace(experiments("jrd", quick=True)[0], dataset="digits")
    write_report(results, report, context,
                 not_run=[on_digits, *experiments("dtml", quick=True),
                          experiments("atlas", quick=True)[0]])
    text = report.read_text()
    assert "## Not run for this report" in text
    # left out on this report's dataset: listed with its command; on others: only counted
    assert f"`kdml reproduce jrd --only {on_digits.key} --seeds 2 --quick`" in text
    assert "dtml-mnist5k-to-digits" not in text
    assert "2 experiments on other datasets (mnist5k, mnist5k->digits) are not listed" in text
    assert "Other reports" not in text
    assert text.startswith(MARKER)
    assert (report.parent / "reproduction.md.tmp").read_text() == "mine"
    assert sorted(path.name for path in report.parent.iterdir()) == [
        "reproduction-plots", "reproduction.md", "reproduction.md.tmp"]
    assert "| alpha = 1 |" in text and "| 0.500 |" in text  # kdml's numbers and the paper's
    assert "- JRS helps (R@1): " in text
    assert "Not run here:" in text
    plots = plots_folder(report)
    assert (plots / "tiny-parts.png").is_file() and (plots / "tiny-charts-charts.png").is_file()
    assert "](reproduction-plots/tiny-parts.png)" in text
    # reports written beside it are named, so the datasets left out can be found
    (report.parent / "notes.md").write_text("# notes, not a report\n")
    write_report(results, report.parent / "reproduction-fashion.md", context,
                 not_run=experiments("dtml", quick=True))
    write_report(results, report, context, not_run=experiments("dtml", quick=True))
    elsewhere = dataclasses.replace(context, runs="elsewhere/runs")
    write_report(results, report, elsewhere, not_run=[on_digits])
    assert (f"`kdml reproduce jrd --only {on_digits.key} --seeds 2 --quick --runs elsewhere/runs`"
            in report.read_text())
    write_report(results, report, context, not_run=experiments("dtml", quick=True))
    assert ("Other reports of `kdml reproduce` beside this one: "
            "[reproduction-fashion.md](reproduction-fashion.md).") in report.read_text()

    # a second run reuses every finished run: nothing is trained again
    metrics = parts.run_dirs[0] / "metrics.json"
    before = metrics.stat().st_mtime_ns
    said: list[str] = []
    again = reproduce(_tiny_experiments()[:1], 2, runs, "cpu", progress=False,
                      echo=said.append)
    assert metrics.stat().st_mtime_ns == before
    # the progress says so, instead of looking the same as a run trained now
    assert sum(line.startswith("  reused: finished earlier, after ") for line in said) == \
        sum(line.startswith("[") for line in said) > 0
    assert again[0].cells["alpha = 1"].values == parts.values
    write_report(again, report, context)  # its own report: rewritten


def test_a_collapsed_run_is_marked_in_its_cell_and_its_claims(tmp_path, tiny_jrd_runs):
    """A run whose metrics.json records a collapse (``collapsed``: the share of its test
    embeddings at one point) is counted as measured, but its row names the seeds, a note gives
    each share, and each claim on its cell says so: a table of ties had read as a ranking."""
    cells = (Cell("steady", "jrd", ()), Cell("flat", "jrd", ("method.alpha=0.5",)))
    claims = (Claim("steady beats flat", "steady", "flat", "recall@1"),)
    experiment = Experiment("tiny-collapse", "jrd", "Figure 5", "regularizers", "digits", cells,
                            ("recall@1",), "CUB", claims, common=TINY)
    copy_of(tiny_jrd_runs, tmp_path / "runs")  # steady's runs (alpha 1): flat's train here
    (result,) = reproduce([experiment], 2, tmp_path / "runs", "cpu", progress=False,
                          echo=lambda line: None)
    assert result.cells["flat"].collapsed == {}
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    plain = write_report([result], tmp_path / "plain.md", context).read_text()
    for seed, share in ((0, 0.998), (1, 1.0)):  # as kdml train records a collapsed scoring
        record = result.cells["flat"].run_dirs[seed] / "metrics.json"
        metrics = json.loads(record.read_text())
        record.write_text(json.dumps({**metrics, "final": {**metrics["final"],
                                                           "collapsed": share}}))
    (again,) = reproduce([experiment], 2, tmp_path / "runs", "cpu", progress=False,
                         echo=lambda line: None)
    assert again.cells["flat"].collapsed == {0: 0.998, 1: 1.0}
    assert again.cells["flat"].values == result.cells["flat"].values
    assert again.cells["steady"].collapsed == {}
    text = write_report([again], tmp_path / "report.md", context).read_text()
    flat = Estimate.of(result.cells["flat"].values["recall@1"])
    assert f"| flat (seeds 0, 1 collapsed) | {flat.mean:.3f} +- {flat.ci95:.3f} |" in text
    assert "- flat, seed 0: 99.8% of the test embeddings at one point" in text
    assert "- flat, seed 1: 100.0% of the test embeddings at one point" in text
    claim_line = next(line for line in text.splitlines() if line.startswith("- steady beats"))
    assert claim_line.endswith("; flat collapsed on 2 of 2 seeds.")
    assert claim_line.removesuffix("; flat collapsed on 2 of 2 seeds.") in plain
    assert "collapsed" not in plain


def test_a_diverged_run_is_reported_in_its_cell_and_not_trained_again(tmp_path, monkeypatch,
                                                                       tiny_jrd_runs):
    """A run whose loss goes NaN is a result of its recipe: its cell keeps the other seeds,
    names the seed and why, and claims pair only the seeds both runs finished. It used to
    stop the whole experiment ('could not run'), and the report lost every table."""
    from kdml.reproduce import runner
    from kdml.training.nonfinite import NonFiniteLoss

    cells = (Cell("steady", "jrd", ()), Cell("shaky", "jrd", ("method.alpha=0.5",)),
             Cell("wild", "jrd", ("optim.lr=1e20",)),  # diverges in its second step
             # its one update leaves NaN weights, which no loss sees before the evaluation
             Cell("last step", "jrd", ("optim.lr=1e20", "train.steps_per_epoch=1")))
    claims = (Claim("steady beats shaky", "steady", "shaky", "recall@1"),
              Claim("steady beats wild", "steady", "wild", "recall@1"))
    experiment = Experiment("tiny-diverged", "jrd", "Table 4", "kernels", "digits", cells,
                            ("recall@1",), "CUB", claims, common=TINY, sweep="alpha")
    real_train = runner.train
    runs = copy_of(tiny_jrd_runs, tmp_path / "runs")  # steady's runs (alpha 1): reused

    def shaky_seed_1_diverges(config, run_dir, **kwargs):
        if config.method.alpha == 0.5 and config.train.seed == 1:
            run_dir.mkdir(parents=True)  # as train makes it before its first step
            raise NonFiniteLoss("training stopped: the 'jrs' term became NaN or infinite")
        return real_train(config, run_dir, **kwargs)

    monkeypatch.setattr(runner, "train", shaky_seed_1_diverges)
    lines: list[str] = []
    (result,) = reproduce([experiment], 2, runs, "cpu", progress=False, echo=lines.append)
    assert not result.error
    assert result.cells["shaky"].diverged == {1: "training stopped: the 'jrs' term became NaN "
                                                 "or infinite"}
    assert math.isnan(result.cells["shaky"].values["recall@1"][1])
    assert set(result.cells["wild"].diverged) == {0, 1}
    assert "the 'am_softmax' term became NaN" in result.cells["wild"].diverged[0]
    assert set(result.cells["last step"].diverged) == {0, 1}
    assert "the test embeddings contain NaN or infinite" in result.cells["last step"].diverged[0]
    assert sum(line.startswith("  diverged: ") for line in lines) == 5
    stored = json.loads((result.cells["wild"].run_dirs[0] / "reproduce.json").read_text())
    assert stored["diverged"] == result.cells["wild"].diverged[0]

    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    text = write_report([result], tmp_path / "report.md", context).read_text()
    steady = result.cells["steady"].values["recall@1"]
    assert f"| shaky (seed 1 diverged) | {result.cells['shaky'].values['recall@1'][0]:.3f} |" \
        in text  # the finished seed alone: no interval
    assert "| wild (seeds 0, 1 diverged) | diverged |" in text
    assert f"| steady | {Estimate.of(steady).mean:.3f} +- " in text
    assert "- shaky, seed 1: training stopped: the 'jrs' term became NaN or infinite" in text
    assert "- steady beats shaky (R@1): not testable with one seed" in text
    assert ("- steady beats wild (R@1): not testable: in every seed, one of the two runs "
            "diverged.") in text
    assert (plots_folder(tmp_path / "report.md") / "tiny-diverged.png").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("a diverged run was trained again")

    monkeypatch.setattr(runner, "train", no_training)
    said: list[str] = []
    (again,) = reproduce([experiment], 2, runs, "cpu", progress=False, echo=said.append)
    assert again.cells["wild"].diverged == result.cells["wild"].diverged
    assert sum(line.startswith("  reused: diverged earlier") for line in said) == 5
    assert again.cells["steady"].values == result.cells["steady"].values


@pytest.fixture(scope="module")
def quick_dtml(tmp_path_factory) -> Path:
    """A folder holding ``report.md`` and ``runs/`` of ``kdml reproduce dtml --quick --seeds
    2``: trained once, for the tests that read that report or reuse (a copy of) its runs."""
    root = tmp_path_factory.mktemp("quick-dtml")
    assert cli.main(["reproduce", "dtml", "--quick", "--seeds", "2", "--out",
                     str(root / "report.md"), "--runs", str(root / "runs"), "--no-progress",
                     "--device", "cpu"]) == 0
    return root


def test_a_report_is_kept_when_none_of_its_experiments_ran(quick_dtml, tmp_path, capsys,
                                                           monkeypatch):
    from kdml.reproduce import runner

    report = tmp_path / "reproduction.md"
    runs = copy_of(quick_dtml / "runs", tmp_path / "runs")  # reused, not trained
    cli.main(["reproduce", "dtml", "--quick", "--seeds", "1", "--only", "dtml-mnist5k-*",
              "--out", str(report), "--runs", str(runs), "--no-progress", "--device", "cpu"])
    written = report.read_text()
    assert "| DTML" in written
    assert "--only 'dtml-mnist5k-*'" in written  # its command reruns these experiments alone

    def unavailable(experiments, *args, **kwargs):
        return [runner.ExperimentResult(experiment, {}, (), "no such data here")
                for experiment in experiments]

    monkeypatch.setattr(runner, "reproduce", unavailable)
    capsys.readouterr()
    assert cli.main(["reproduce", "dtml", "--quick", "--seeds", "1", "--only",
                     "dtml-mnist5k-*", "--out", str(report), "--runs",
                     str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "could not run: no such data here" in err and "is left as it was" in err
    assert report.read_text() == written


def test_a_report_written_with_an_experiment_that_could_not_run_exits_1(tmp_path, monkeypatch,
                                                                          capsys):
    """The report is written (the experiment is said not to have run), but the command fails:
    a script running it must not take the missing numbers for a success. Run again with none
    of its experiments running, the report is left as it was, and says why."""
    from kdml.reproduce import runner

    def unavailable(experiments, *args, **kwargs):
        return [runner.ExperimentResult(experiment, {}, (), "no such data here")
                for experiment in experiments]

    monkeypatch.setattr(runner, "reproduce", unavailable)
    report = tmp_path / "reproduction.md"
    assert cli.main(["reproduce", "dtml", "--quick", "--seeds", "1", "--only",
                     "dtml-mnist5k-*", "--out", str(report), "--runs", str(tmp_path / "runs"),
                     "--device", "cpu"]) == 1
    assert "could not run: no such data here" in capsys.readouterr().err
    written = report.read_text()
    assert cli.main(["reproduce", "dtml", "--quick", "--seeds", "1", "--only", "dtml-*",
                     "--out", str(report), "--runs", str(tmp_path / "runs"),
                     "--device", "cpu"]) == 1
    assert (f"{report} is left as it was: none of its experiments ran"
            in capsys.readouterr().err)
    assert report.read_text() == written


@pytest.fixture(scope="module")
def tiny_jrd_runs(tmp_path_factory) -> Path:
    """The runs of ``reproduce(_tiny_experiments()[:2], 2, runs, "cpu")``: JRD on digits at
    TINY, alpha 0 and 1 (the recipe's default), seeds 0 and 1, with their parts.json and
    generalization.json. Trained once for the tests that read or break a copy of them (each
    test copies them, with ``copy_of``): a test whose cells have these settings reuses them."""
    runs = tmp_path_factory.mktemp("tiny-jrd") / "runs"
    results = reproduce(_tiny_experiments()[:2], 2, runs, "cpu", progress=False,
                        echo=lambda line: None)
    assert not any(result.error for result in results)
    return runs


@pytest.fixture(scope="module")
def tiny_charts_runs(tmp_path_factory) -> Path:
    """The runs of ``reproduce([_tiny_experiments()[2]], 2, runs, "cpu")`` (its chart plot
    kept with seed 0's records), trained once for the tests that read or break a copy."""
    runs = tmp_path_factory.mktemp("tiny-charts") / "runs"
    (result,) = reproduce([_tiny_experiments()[2]], 2, runs, "cpu", progress=False,
                          echo=lambda line: None)
    assert not result.error
    return runs


def copy_of(trained: Path, runs: Path) -> Path:
    """``runs`` holding a copy of the module's ``trained`` runs (beside any already there)."""
    shutil.copytree(trained, runs, dirs_exist_ok=True)
    return runs


def _errors_after(breaking: Path, text: str, runs: Path) -> dict[str, str]:
    """Each tiny JRD experiment's error once ``breaking`` (a file kdml wrote) holds ``text``."""
    kept = breaking.read_text()
    breaking.write_text(text)
    try:
        results = reproduce(_tiny_experiments()[:2], 1, runs, "cpu", progress=False,
                            echo=lambda line: None)
    finally:
        breaking.write_text(kept)
    return {result.experiment.key: result.error for result in results}


def test_hand_broken_run_files_give_one_line_errors(tmp_path, tiny_jrd_runs):
    """A run file that kdml wrote but a hand edit broke stops its experiments with a one-line
    message naming the file, never a traceback, and the other experiments go on."""
    runs = tmp_path / "runs"
    shutil.copytree(tiny_jrd_runs, runs)  # the same runs, trained once for the module
    first = reproduce(_tiny_experiments()[:2], 1, runs, "cpu", progress=False,
                      echo=lambda line: None)
    run_dir = first[0].cells["alpha = 1"].run_dirs[0]
    assert not first[0].error and not first[1].error
    errors = _errors_after(run_dir / "parts.json", '{"metrics": {"recall@1": {"mean": "x"}}}',
                           runs)
    assert errors["tiny-parts"].startswith(f"{run_dir / 'parts.json'} is not as kdml wrote it")
    assert "delete it" in errors["tiny-parts"]
    assert errors["tiny-generalization"] == errors["tiny-parts"]  # Table 3 reads it too
    # a Recall@K the table reads, or the count of parts, gone: the cell had taken the whole
    # test set's value for it, mixing the protocols
    parts = json.loads((run_dir / "parts.json").read_text())
    fewer = {**parts, "metrics": {k: v for k, v in parts["metrics"].items() if k != "recall@2"}}
    for broken, detail in ((fewer, "no recall@2"), ({**parts, "num_parts": 5}, "not 10 parts")):
        errors = _errors_after(run_dir / "parts.json", json.dumps(broken), runs)
        assert errors["tiny-parts"] == (f"{run_dir / 'parts.json'} is not as kdml wrote it "
                                        f"({detail}); delete it and run the same command again "
                                        "to recompute it")
        # Table 3 reads Recall@1 alone: a file without Recall@2 is still good for it
        assert bool(errors["tiny-generalization"]) == (detail == "not 10 parts")
    errors = _errors_after(run_dir / "reproduce.json", "{", runs)
    assert errors["tiny-parts"] == errors["tiny-generalization"] == (
        f"{run_dir / 'reproduce.json'} is not as kdml wrote it (no wall_s); delete it and run "
        "the same command again to recompute it")
    errors = _errors_after(run_dir / "reproduce.json", '{"wall_s": "long"}', runs)
    assert errors["tiny-parts"] == (f"{run_dir / 'reproduce.json'} is not as kdml wrote it "
                                    "(wall_s is 'long'); delete it and run the same command "
                                    "again to recompute it")
    # with its settings it is trusted (without them it is recomputed)
    stored = json.loads((run_dir / "generalization.json").read_text())
    errors = _errors_after(run_dir / "generalization.json",
                           json.dumps({**stored, "lambda": 1}), runs)
    assert errors["tiny-generalization"].startswith(f"{run_dir / 'generalization.json'} is not")
    errors = _errors_after(run_dir / "generalization.json", json.dumps(
        {**stored, "lambda": {**stored["lambda"], "mean": None}}), runs)  # had been a TypeError
    assert errors["tiny-generalization"] == (
        f"{run_dir / 'generalization.json'} is not as kdml wrote it (lambda/mean is not a "
        "number); delete it and run the same command again to recompute it")
    # one written before it recorded its distance (cosine runs analysed by Euclidean distance)
    # is computed again, not trusted
    old = {key: value for key, value in stored.items() if key != "distance"}
    errors = _errors_after(run_dir / "generalization.json", json.dumps({**old, "lambda": 1}),
                           runs)
    assert not errors["tiny-generalization"]
    # one of an earlier epoch (`kdml analyze` of the run stopped half-way) had been set beside
    # the finished run's Recall@1: it is computed again
    earlier = {**stored, "settings": {**stored["settings"], "epoch": 0}, "lambda": 1}
    assert stored["settings"]["epoch"] == 1
    errors = _errors_after(run_dir / "generalization.json", json.dumps(earlier), runs)
    assert not errors["tiny-generalization"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    kept = json.dumps(metrics)
    metrics["final"]["recall@1"] = "0.5"
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    # both tiny tables take Recall@1 from parts.json; a table of the whole test set, sharing
    # the run, reads metrics.json's
    whole_set = dataclasses.replace(_tiny_experiments()[0], key="tiny-test", protocol="test")
    try:
        results = reproduce([*_tiny_experiments()[:2], whole_set], 1, runs, "cpu",
                            progress=False, echo=lambda line: None)
    finally:
        (run_dir / "metrics.json").write_text(kept)
    errors = {result.experiment.key: result.error for result in results}
    assert not errors["tiny-parts"] and not errors["tiny-generalization"]
    assert errors["tiny-test"] == (f"{run_dir / 'metrics.json'}: recall@1 is '0.5', not a "
                                   "number; delete the run folder to train it again")
    assert all("\n" not in error for error in errors.values())


def test_parts_are_computed_at_table2_s_ks_whatever_table_reads_them(tmp_path, monkeypatch):
    """parts.json is written at Table 2's Recall@1, 2, 4, 8 whatever table computes it: Table 3
    reads Recall@1 alone, and a Table 2 cell that shares the run reads the same file later
    (written at Recall@1 only, it would be refused: "not as kdml wrote it (no recall@2)")."""
    from types import SimpleNamespace

    from kdml.reproduce import runner

    asked: list[list[int]] = []

    def parts(vectors, labels, ks, num_parts, metric):
        asked.append(list(ks))
        return {f"recall@{k}": SimpleNamespace(mean=k / 10, ci95=0.01) for k in ks}

    trained = SimpleNamespace(method=None, splits=SimpleNamespace(test=None), embedder=None,
                              config=SimpleNamespace(eval=SimpleNamespace(metric="cosine")))
    monkeypatch.setattr(runner, "reload_to", lambda run_dir, purpose: trained)
    monkeypatch.setattr(runner, "embed_dataset",
                        lambda *args: SimpleNamespace(tensor=lambda: None, labels=None))
    monkeypatch.setattr(runner, "retrieval_over_parts", parts)
    table3 = _tiny_experiments()[1]
    assert [name for name in table3.metrics if name.startswith("recall@")] == ["recall@1"]
    runner._parts(table3, tmp_path)
    assert asked == [[1, 2, 4, 8]]
    assert runner._parts(_tiny_experiments()[0], tmp_path)["recall@2"]["mean"] == 0.2
    assert len(asked) == 1  # read from the file


def test_a_score_that_is_a_bool_or_not_finite_in_a_run_that_did_not_diverge_is_refused(
        tmp_path, tiny_jrd_runs):
    """A hand-broken score of a finished run: `true` had read as 1.0, and NaN (or infinity)
    had left the seed out of its row without a word while each claim on the row said the run
    diverged; reproduce.json says it did not."""
    whole_set = dataclasses.replace(_tiny_experiments()[0], key="tiny-test", protocol="test")
    runs = copy_of(tiny_jrd_runs, tmp_path / "runs")  # its runs, the tiny parts table's: read
    first = reproduce([whole_set], 2, runs, "cpu", progress=False, echo=lambda line: None)[0]
    assert not first.error
    run_dir = first.cells["alpha = 1"].run_dirs[1]
    kept = (run_dir / "metrics.json").read_text()
    for broken, error in ((True, f"{run_dir / 'metrics.json'}: recall@1 is True, not a number"),
                          (float("nan"), f"{run_dir}: recall@1 is nan, but the run did not "
                                         "diverge"),
                          (float("inf"), f"{run_dir}: recall@1 is inf, but the run did not "
                                         "diverge")):
        metrics = json.loads(kept)
        metrics["final"]["recall@1"] = broken
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
        try:
            again = reproduce([whole_set], 2, runs, "cpu", progress=False,
                              echo=lambda line: None)[0]
        finally:
            (run_dir / "metrics.json").write_text(kept)
        assert again.error.startswith(error) and "delete the run folder" in again.error
    # the parts protocol's file too: a NaN mean there is as broken
    first = reproduce(_tiny_experiments()[:1], 1, runs, "cpu", progress=False,
                      echo=lambda line: None)[0]
    run_dir = first.cells["alpha = 1"].run_dirs[0]
    parts = json.loads((run_dir / "parts.json").read_text())
    parts["metrics"]["recall@2"]["mean"] = float("nan")
    errors = _errors_after(run_dir / "parts.json", json.dumps(parts), runs)
    assert errors["tiny-parts"].startswith(f"{run_dir}: recall@2 is nan, but the run did not")
    assert not errors["tiny-generalization"]  # it reads Recall@1 alone


def test_a_one_seed_report_claims_no_interval_and_tests_no_claim(tmp_path):
    """One seed (a long CPU run) gives values without +- and says so: no '1 seeds (0 to 0)
    +- ...' header, no '+- is over seeds', and every claim 'not testable'."""
    experiment = _tiny_experiments()[0]
    config = cell_config(experiment, experiment.cells[0], 0, "cpu")
    cells = {cell.label: CellResult(values={"recall@1": [0.5 + index / 10],
                                            "recall@2": [0.7 + index / 10]},
                                    part_ci95={"recall@1": [0.03], "recall@2": [0.02]},
                                    wall_s=[60.0], run_dirs=[tmp_path / cell.label])
             for index, cell in enumerate(experiment.cells)}
    context = ReportContext("kdml reproduce jrd --seeds 1", "a test machine", "torch", 1.0, 1,
                            False)
    report = write_report([ExperimentResult(experiment, cells, (config,))],
                          tmp_path / "one.md", context)
    text = report.read_text()
    assert "Values are from one seed (0)" in text and "1 seeds" not in text
    assert "| alpha = 1 | 0.600 | 0.800 | 0.500 |" in text  # no +- without a second seed
    assert "+- is over seeds" not in text and "averaged over the seeds" not in text
    assert "| parts: 95% half-width | R@1 | R@2 |" in text
    assert all(f"| {cell.label} | 0.030 | 0.020 |" in text for cell in experiment.cells)
    assert "- JRS helps (R@1): not testable with one seed (alpha = 1 higher by 0.100)." in text


def test_a_setting_the_cells_differ_in_is_said_with_each_value(tmp_path):
    """The Settings line described the first cell alone: the epochs ablation's table said
    '10 epochs' above its 100-epoch rows."""
    experiment = _tiny_experiments()[0]
    configs = tuple(cell_config(experiment, cell, 0, "cpu") for cell in experiment.cells)
    configs[1].train.epochs, configs[1].optim.lr = 100, 0.5
    first = configs[0]
    line = _settings_line(experiment, tmp_path / "cells", configs)
    assert line.startswith("Settings: backbone `auto`, batch 40, 1 epoch of at most 3 steps or "
                           "100 epochs of at most 3 steps, adam lr 0.001 or adam lr 0.5, split "
                           "`standard`, 4.0 min of training.")  # each value once, cell order
    alike = _settings_line(experiment, tmp_path / "alike", (first, first))  # once each
    assert ", 1 epoch of at most 3 steps, adam lr 0.001, " in alike and " or " not in alike


def _settings_line(experiment: Experiment, tmp_path: Path,
                   configs: tuple[RunConfig, ...] | None = None) -> str:
    """The Settings line of ``experiment``'s section, its cells' runs faked (two seeds) with
    ``configs`` (by default the cells' own)."""
    if configs is None:
        configs = tuple(cell_config(experiment, cell, 0, "cpu") for cell in experiment.cells)
    tmp_path.mkdir(parents=True, exist_ok=True)
    cells = {cell.label: CellResult(values={name: [0.5, 0.6] for name in experiment.metrics},
                                    wall_s=[60.0, 60.0],
                                    run_dirs=[tmp_path / cell.label / "0",
                                              tmp_path / cell.label / "1"])
             for cell in experiment.cells}
    context = ReportContext("kdml reproduce all --seeds 2", "a test machine", "torch", 1.0, 2,
                            False)
    text = write_report([ExperimentResult(experiment, cells, configs)],
                        tmp_path / f"{experiment.key}.md", context).read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("Settings:")]
    return line


def test_the_settings_line_names_every_setting_a_row_changes(tmp_path):
    """The Settings line named the backbone, batch, epochs, optimiser and split alone: DTML's
    tables said nothing of the `data.pca_dim=64` every row trains with (nor the Atlas CNN
    tables of `model.small_input=false`, nor the authors' code's settings of their row)."""
    (dtml,) = [experiment for experiment in experiments("dtml")
               if experiment.key == "dtml-mnist5k-to-digits"]
    assert ("min of training. Changed from the recipes' defaults: `data.pca_dim=64` and "
            "`eval.nmi=false` in every row. Paper column: ") in _settings_line(dtml, tmp_path)
    # a setting some rows change, with each value once in cell order; one set on every row
    # to one value is said once; the five the line gives by value are not said again
    alpha = _tiny_experiments()[0]  # alpha = 0, and alpha = 1: jrd's default
    assert _settings_line(alpha, tmp_path).endswith(
        "Changed from the recipes' defaults: `model.embedding_size=8` and `eval.nmi=false` in "
        "every row; by row, `method.alpha` to 0. Paper column: CUB.")
    code = dataclasses.replace(alpha, key="tiny-code", cells=(
        Cell("defaults", "jrd"), Cell("code", "jrd", ("optim.adam_eps=0.01",
                                                      "method.decay_proxies=true")),
        Cell("alpha", "jrd", ("method.alpha=0.5", "optim.adam_eps=0.1"))), claims=(),
        sweep="", common=())
    assert "Changed from the recipes' defaults: by row, `optim.adam_eps` to 0.01 or 0.1, " \
           "`method.decay_proxies` to true, `method.alpha` to 0.5. Paper" in \
        _settings_line(code, tmp_path)
    untouched = dataclasses.replace(code, cells=code.cells[:1])
    assert " min of training. Paper column: CUB." in _settings_line(untouched, tmp_path)


def test_every_catalog_experiment_says_its_changes():
    """Each experiment of the catalog, quick or not, gets its changes said (its recipes'
    defaults resolve on its dataset: a failure here would come at the end of its training)."""
    from kdml.reproduce.report import _changes

    for quick in (False, True):
        for experiment in experiments("all", quick):
            configs = tuple(cell_config(experiment, cell, 0, "cpu") for cell in experiment.cells)
            said = _changes(ExperimentResult(experiment, {}, configs))
            assert "`train.seed" not in said and "`train.eval_every" not in said
            if experiment.key.startswith("dtml-"):
                assert "`data.pca_dim=64`" in said


def test_report_never_replaces_a_file_kdml_did_not_write(tmp_path, capsys):
    report = tmp_path / "reproduction.md"
    report.write_text("# my notes\n")
    code = cli.main(["reproduce", "dtml", "--quick", "--out", str(report), "--runs",
                     str(tmp_path / "runs")])
    assert code == 2
    assert "was not written by kdml reproduce" in capsys.readouterr().err
    assert report.read_text() == "# my notes\n"
    assert not (tmp_path / "runs").exists()  # refused before anything trained
    plots = plots_folder(tmp_path / "other.md")
    plots.mkdir()
    (plots / "mine.png").write_bytes(b"")
    assert cli.main(["reproduce", "dtml", "--quick", "--out", str(tmp_path / "other.md")]) == 2
    assert "did not write" in capsys.readouterr().err


def test_a_bad_device_is_refused_before_anything_trains(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert cli.main(["reproduce", "dtml", "--quick", "--seeds", "1", "--only",
                     "dtml-mnist5k-to-digits", "--runs", str(runs), "--device", "tpu", "--out",
                     str(tmp_path / "r.md")]) == 2
    assert "the device must be auto, cpu, cuda or cuda:N, got 'tpu'" in capsys.readouterr().err
    assert not runs.exists()


def test_an_unwritable_report_is_refused_before_anything_trains(tmp_path, capsys):
    runs = tmp_path / "runs"
    (tmp_path / "notes.txt").write_text("mine")
    for out in (tmp_path / "notes.txt" / "r.md", Path("/proc/kdml-report.md")):
        assert cli.main(["reproduce", "dtml", "--quick", "--seeds", "1", "--only",
                         "dtml-mnist5k-to-digits", "--runs", str(runs), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("kdml: error: cannot ") and err.count("\n") == 1, err
    assert not runs.exists() and (tmp_path / "notes.txt").read_text() == "mine"


def test_the_settings_line_counts_one_epoch_and_one_step_in_the_singular():
    from types import SimpleNamespace

    from kdml.config import resolve_config
    from kdml.reproduce.report import _settings
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("jrd")

    def settings(*overrides: str) -> str:
        config = resolve_config(recipe.name, recipe.params, recipe.defaults,
                                overrides=list(overrides))
        return _settings(SimpleNamespace(configs=(config,), cells={}))  # type: ignore[arg-type]

    assert ", 1 epoch of at most 1 step, " in settings("train.epochs=1",
                                                       "train.steps_per_epoch=1")
    assert ", 1 epoch of at most 20 steps, " in settings("train.epochs=1",
                                                         "train.steps_per_epoch=20")
    assert ", 3 epochs, " in settings("train.epochs=3", "train.steps_per_epoch=0")


def test_only_that_matches_nothing_lists_the_keys(capsys):
    assert cli.main(["reproduce", "jrd", "--only", "nope-*", "--list"]) == 2
    err = capsys.readouterr().err
    assert "matches no experiment" in err and "jrd-table2-mnist5k" in err
    assert len(err.strip().splitlines()) == 1
    # a full run's experiment that --quick leaves out is named as such (its key was not listed)
    assert cli.main(["reproduce", "atlas", "--quick", "--only", "atlas-mmd64-fashion-*",
                     "--list"]) == 2
    assert capsys.readouterr().err == (
        "kdml: error: --only atlas-mmd64-fashion-* matches no experiment of atlas with --quick "
        "(without it: atlas-mmd64-fashion-mnist); the keys are: atlas-table2-mnist5k, "
        "atlas-ablation-mnist5k, atlas-triplet-mnist5k, atlas-mmd64-mnist5k\n")


def test_only_matches_whole_keys_not_their_prefixes(capsys):
    """--only takes a key or a shell pattern over whole keys: a key's prefix picks nothing
    (it had picked both datasets' Table 2 and, with atlas-table2-mnist5k, no other table)."""
    assert cli.main(["reproduce", "jrd", "--only", "jrd-table2-mnist", "--list"]) == 2
    assert "--only jrd-table2-mnist matches no experiment" in capsys.readouterr().err
    assert cli.main(["reproduce", "atlas", "--only", "atlas-table2-mnist5k", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()
              if not line.startswith(" ")]
    assert listed == ["atlas-table2-mnist5k"]


def test_only_names_the_paper_whose_experiment_a_key_is(capsys):
    """An Atlas key given to kdml reproduce jrd had been answered with jrd's keys alone, as if
    mistyped; it names the command whose catalog holds it."""
    assert cli.main(["reproduce", "jrd", "--only", "atlas-table2-mnist5k", "--list"]) == 2
    assert capsys.readouterr().err == (
        "kdml: error: --only atlas-table2-mnist5k matches no experiment of jrd: "
        "atlas-table2-mnist5k is an experiment of 'kdml reproduce atlas'\n")
    assert cli.main(["reproduce", "dtml", "--quick", "--only", "jrd-*", "--list"]) == 2
    assert capsys.readouterr().err == (
        "kdml: error: --only jrd-* matches no experiment of dtml: jrd-* matches experiments "
        "of 'kdml reproduce jrd'\n")
    # beside a key found nowhere, the paper's keys are listed still
    assert cli.main(["reproduce", "atlas", "--only", "dtml-mnist5k-to-digits", "--only", "zzz",
                     "--list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: --only dtml-mnist5k-to-digits zzz matches no experiment "
                          "of atlas; dtml-mnist5k-to-digits is an experiment of 'kdml "
                          "reproduce dtml'; the keys are: atlas-table2-mnist5k, ")
    assert err.count("\n") == 1


def test_list_prints_experiments_and_cells(capsys):
    assert cli.main(["reproduce", "dtml", "--list"]) == 0
    out = capsys.readouterr().out
    assert "dtml-mnist5k-to-digits" in out and "ddml-logistic" in out
    # the settings every cell shares are listed too: here, the CPU setting's small CNN
    assert cli.main(["reproduce", "atlas", "--list", "--only", "atlas-table2-cnn-mnist5k"]) == 0
    assert ("    every cell: data.dataset=mnist5k data.split=seen-holdout model.backbone=cnn"
            in capsys.readouterr().out)


def test_quick_dtml_from_the_command_line(quick_dtml):
    report = quick_dtml / "report.md"
    text = report.read_text()
    # a report written elsewhere names its path: its commands rewrite it, not the default;
    # and its runs folder, so that they reuse its runs rather than train them again
    runs = quick_dtml / "runs"
    # and the device, always: on a GPU machine `auto` would look for cuda runs
    assert (f"`kdml reproduce dtml --seeds 2 --quick --device cpu --runs {runs} --out {report}`"
            in text)
    assert (f"--only dtml-mnist5k-to-digits --seeds 2 --quick --device cpu --runs {runs} "
            f"--out {report}`"
            in text)
    for label in ("PCA", "DDML (2014)", "DTML, beta = 0", "DTML", "DSTML"):
        assert f"| {label} |" in text
    assert "| 0.8558 |" in text  # the paper's DTML on LFW (85.58%), beside kdml's numbers
    assert "| 0.8380 |" in text  # 83.80%: the column's precision, not 0.838
    assert text.count("- DTML beats") == 2


def test_a_quick_report_goes_beside_its_runs_not_into_docs(quick_dtml, tmp_path, monkeypatch,
                                                          capsys):
    """--quick without --out must not replace the committed docs/reproduction.md."""
    copy_of(quick_dtml / "runs", tmp_path / "quick-runs")  # reused, not trained
    monkeypatch.chdir(tmp_path)
    code = cli.main(["reproduce", "dtml", "--quick", "--seeds", "1", "--only",
                     "dtml-mnist5k-to-digits", "--runs", "quick-runs", "--no-progress",
                     "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    assert not (tmp_path / "docs").exists()
    text = (tmp_path / "quick-runs" / "reproduction.md").read_text()
    assert "--quick --device cpu --runs quick-runs --out quick-runs/reproduction.md`" in text
    # even at docs/reproduction.md, a quick report's command names it: without --out, the
    # same command would write beside its runs
    code = cli.main(["reproduce", "dtml", "--quick", "--seeds", "1", "--only",
                     "dtml-mnist5k-to-digits", "--runs", "quick-runs", "--no-progress",
                     "--device", "cpu", "--out", "docs/reproduction.md"])
    assert code == 0, capsys.readouterr().err
    text = (tmp_path / "docs" / "reproduction.md").read_text()
    assert "--quick --device cpu --runs quick-runs --out docs/reproduction.md`" in text


def test_plan_hashes_the_device_auto_resolves_to(tmp_path):
    """A library caller passing 'auto' must find the runs its device trained under that
    device's own name (the CLI is not the only caller of the runner)."""
    from kdml.training.build import resolve_device

    found = experiments("dtml", quick=True)[:1]
    resolved = str(resolve_device("auto"))
    auto = plan(found, 2, tmp_path, "auto")
    named = plan(found, 2, tmp_path, resolved)
    assert [run.run_dir for runs in auto.values() for run in runs] == [
        run.run_dir for runs in named.values() for run in runs]
    assert {run.config.train.device for runs in auto.values() for run in runs} == {resolved}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_the_runner_plans_and_trains_on_the_device_it_is_given(tmp_path):
    """reproduce() plans every experiment on its ``device``: on a machine without CUDA,
    ``cuda`` is refused in the experiment's error, with nothing trained (had it planned on
    another device, the runs would train on the CPU, into folders named by the CPU)."""
    experiment = dataclasses.replace(_tiny_experiments()[0], key="tiny-test", protocol="test")
    runs = tmp_path / "runs"
    (result,) = reproduce([experiment], 1, runs, "cuda", progress=False,
                          echo=lambda line: None)
    assert "cuda" in result.error.lower() and not result.cells
    assert not runs.exists() or not any(runs.iterdir())


def test_reproduce_refuses_torchrun(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["reproduce", "dtml", "--list"]) == 2
    assert "without torchrun" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")  # rank 0 says it once, for every rank
    assert cli.main(["reproduce", "dtml", "--list"]) == 2
    assert capsys.readouterr().err == ""


def test_device_auto_names_run_folders_by_the_device_it_resolves_to(tmp_path, monkeypatch):
    """Runs trained with --device cpu must be found again by the same command without it (on a
    CPU machine 'auto' is the CPU): the folder name hashes the resolved device."""
    from kdml.reproduce import runner

    seen = []

    def record(chosen, seeds, runs, device, progress):
        seen.append(device)
        raise KeyboardInterrupt  # stop before training anything

    monkeypatch.setattr(runner, "reproduce", record)
    monkeypatch.setattr("kdml.training.build.resolve_device",
                        lambda name, option=None: torch.device("cpu" if name == "auto"
                                                               else name))
    assert cli.main(["reproduce", "dtml", "--quick", "--device", "auto", "--out",
                     str(tmp_path / "r.md"), "--runs", str(tmp_path / "runs")]) == 130
    assert seen == ["cpu"]


@pytest.mark.parametrize(("quick", "seeds"), [([], 5), (["--quick"], 3)])
def test_the_default_seeds_are_5_and_3_with_quick(tmp_path, monkeypatch, quick, seeds):
    """As ``--seeds``'s help says: without it a cell trains seeds 0..4, with --quick 0..2."""
    from kdml.reproduce import runner

    seen = []

    def record(chosen, seeds, runs, device, progress):
        seen.append(seeds)
        raise KeyboardInterrupt  # stop before training anything

    monkeypatch.setattr(runner, "reproduce", record)
    assert cli.main(["reproduce", "dtml", *quick, "--device", "cpu", "--out",
                     str(tmp_path / "r.md"), "--runs", str(tmp_path / "runs")]) == 130
    assert seen == [seeds]


@pytest.mark.parametrize("checkpoint", [True, False])
def test_a_resumed_run_counts_the_sessions_before_it(tmp_path, monkeypatch, checkpoint):
    """Resumed from its checkpoint, a run's earlier sessions count; without one (a record
    kept without checkpoints) it trains again from epoch 1 and they were lost (they had been
    counted too)."""
    from kdml.config import save_config
    from kdml.reproduce import runner

    experiment = experiments("jrd", quick=True)[0]
    config = cell_config(experiment, experiment.cells[0], 0, "cpu")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_config(config, run_dir / "config.yaml")  # started in an earlier session
    (run_dir / "train.log").write_text(
        "2026-01-01 10:00:00,000 start epoch 1 of 2, device cpu\n"
        "2026-01-01 10:02:00,000 epoch 1: lr=0.001, train/loss=1.0\n")
    if checkpoint:
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "last.pt").write_bytes(b"epoch 1")
    first = 2 if checkpoint else 1  # without one, it trains again from epoch 1

    def session(*args, **kwargs):  # this session's half minute, as its train.log records it
        with (run_dir / "train.log").open("a") as log:
            log.write(f"2026-01-02 09:00:00,000 start epoch {first} of 2, device cpu\n"
                      "2026-01-02 09:00:30,000 epoch 2: lr=0.001, train/loss=0.5\n")

    monkeypatch.setattr(runner, "train", session)
    wall, diverged, reused, machine = train_planned(PlannedRun(config, run_dir), False)
    assert not diverged and not reused
    # the earlier session's two minutes and this one's half; without the checkpoint, this one's
    assert wall == (150.0 if checkpoint else 30.0)
    stored = json.loads((run_dir / "reproduce.json").read_text())
    assert stored["wall_s"] == wall and stored["machine"] == machine


@pytest.mark.parametrize("diverges", [False, True])
def test_a_run_trained_in_one_go_counts_from_its_first_epoch_as_a_resumed_one(
        tmp_path, monkeypatch, diverges):
    """A run trained in one go had counted from before its data loaded (the whole train()
    call), a resumed run's earlier sessions from their first epoch's line in train.log: every
    session now counts from that line to its last one (for a run that diverged, its stop
    line: the epoch that diverged is not trained again)."""
    from kdml.reproduce import runner
    from kdml.training.nonfinite import NonFiniteLoss

    experiment = experiments("jrd", quick=True)[0]
    config = cell_config(experiment, experiment.cells[0], 0, "cpu")
    run_dir = tmp_path / "run"

    def session(*args, **kwargs):  # the data loads, then two epochs train, as the log says
        run_dir.mkdir()
        lines = ["2026-01-01 10:00:00,000 start epoch 1 of 2, device cpu",
                 "2026-01-01 10:01:00,000 epoch 1: lr=0.001, train/loss=1.0"]
        lines += (["2026-01-01 10:01:40,000 stopped: the loss is NaN"] if diverges else
                  ["2026-01-01 10:01:40,000 epoch 2: lr=0.001, train/loss=0.5"])
        (run_dir / "train.log").write_text("".join(f"{line}\n" for line in lines))
        if diverges:
            raise NonFiniteLoss("the loss is NaN")

    monkeypatch.setattr(runner, "train", session)
    wall, diverged, reused, _ = train_planned(PlannedRun(config, run_dir), False)
    assert wall == 100.0 and bool(diverged) == diverges and not reused
    assert json.loads((run_dir / "reproduce.json").read_text())["wall_s"] == 100.0


# results/NAME: the experiments its report's command (results/README.md) trains there
# results/NAME: (paper, the experiments whose runs it keeps; None: all of the paper's)
# results/<name>: the paper and the experiment keys (fnmatch patterns) whose records it holds
COMMITTED_RECORDS = {"dtml": ("dtml", None),
                     "reproduce": ("all", ("atlas-mmd64-fashion-mnist",
                                           "atlas-triplet-fashion-mnist",
                                           # the JRD Fashion-MNIST reports', trained again
                                           "jrd-*-fashion-mnist",
                                           # docs/reproduction.md's, trained again with records
                                           "jrd-*-mnist5k", "jrd-*-mnist1d",
                                           "atlas-triplet-mnist5k", "atlas-mmd64-mnist5k")),
                     "simclr-ablation": ("atlas", ("atlas-ablation-cnn-mnist5k",)),
                     "simclr-table2-cnn": ("atlas", ("atlas-table2-cnn-mnist5k",
                                                     "atlas-epochs-cnn-mnist5k",
                                                     "atlas-head-cnn-mnist5k",
                                                     "atlas-mmd-weight-cnn-mnist5k")),
                     "simclr-table2-cnn-fashion-mnist": ("atlas", (
                         "atlas-table2-cnn-fashion-mnist", "atlas-head-cnn-fashion-mnist")),
                     "jrd-code-settings": ("jrd", ("jrd-code-settings-mnist5k",))}


@pytest.mark.parametrize("name", sorted(COMMITTED_RECORDS))
def test_the_committed_run_records_keep_the_folders_their_commands_look_in(name):
    """results/ keeps run records (without checkpoints) so that a report's command reuses
    them; a change to how run folders are named (a new setting left out of ADDED_LATER, an
    edit of REVISED's text) would train every one of them again."""
    root = Path(__file__).resolve().parents[1] / "results" / name
    paper, keys = COMMITTED_RECORDS[name]
    chosen = [experiment for experiment in experiments(paper)
              if keys is None or any(fnmatch.fnmatchcase(experiment.key, key) for key in keys)]
    planned = {run.run_dir for runs in plan(chosen, 5, root, "cpu").values() for run in runs}
    committed = {path.parent for path in root.glob("*/seed-*/config.yaml")}
    assert committed, f"no run records in {root}"
    assert committed <= planned, sorted(committed - planned)


def test_runs_of_a_revised_objective_get_folders_of_their_own(tmp_path, monkeypatch):
    """DSTML's objective changed (Eq. 13): its earlier runs trained another objective and must
    not be reused; the other recipes' folders stay where they were."""
    from kdml.reproduce import runner

    (experiment,) = [e for e in experiments("dtml", quick=True)]
    configs = {cell.recipe: cell_config(experiment, cell, 0, "cpu") for cell in experiment.cells}
    now = {recipe: run_folder_of(config, tmp_path) for recipe, config in configs.items()}
    monkeypatch.setattr(runner, "REVISED", {})
    before = {recipe: run_folder_of(config, tmp_path) for recipe, config in configs.items()}
    assert now["dstml"] != before["dstml"]
    assert all(now[recipe] == before[recipe] for recipe in now if recipe != "dstml")


@pytest.mark.parametrize("recipe", ["msimclr", "simclr"])
def test_a_setting_added_later_keeps_the_folders_of_the_runs_it_describes(tmp_path, monkeypatch,
                                                                          recipe):
    """The SimCLR recipes forwarded both views as one batch before ``method.joint_views``
    existed: its old value keeps those runs' folders, the new default gets others."""
    (experiment,) = [e for e in experiments("atlas", quick=True)
                     if e.key == "atlas-table2-mnist5k"]
    cell = next(cell for cell in experiment.cells if cell.recipe == recipe)
    config = cell_config(experiment, cell, 0, "cpu")
    assert config.method.joint_views is False
    joint = cell_config(experiment, cell, 0, "cpu")
    joint.method.joint_views = True
    now = {value: run_folder_of(c, tmp_path) for value, c in ((False, config), (True, joint))}
    assert now[False] != now[True]
    assert folder_before_the_setting(joint, "joint_views", tmp_path, monkeypatch) == now[True]


def test_a_run_trained_before_a_setting_existed_is_reused_in_the_folder_it_keeps(tmp_path):
    """A run trained before method.joint_views existed (both views as one batch) keeps its
    folder for the cell that sets joint_views=true, as ADDED_LATER says; but its config.yaml,
    without the setting, was read as today's default (false), and the run was refused as
    "another run than the one planned there"."""
    cell = Cell("both views as one batch", "simclr", ("method.dim=2", "method.joint_views=true"))
    experiment = Experiment("tiny-joint-views", "atlas", "Appendix A.1", "joint views", "digits",
                            (cell,), ("linear_accuracy",),
                            common=("train.epochs=1", "train.steps_per_epoch=2",
                                    "eval.nmi=false", "data.batch_size=32",
                                    "model.backbone=cnn", "model.small_input=false",
                                    "method.crop_size=0"))
    runs = tmp_path / "runs"
    first = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)[0]
    assert not first.error
    config = first.cells[cell.label].run_dirs[0] / "config.yaml"
    # as the code before the setting wrote it: no joint_views line (nor the format line,
    # which a setting added since raises: config.ADDED_IN_FORMAT)
    before = re.sub(r"\n +joint_views: true", "",
                    config.read_text().removeprefix(f"{FORMAT_KEY}: {CONFIG_FORMAT}\n"))
    assert before != config.read_text()
    config.write_text(before)
    echoed: list[str] = []
    again = reproduce([experiment], 1, runs, "cpu", progress=False, echo=echoed.append)[0]
    assert not again.error
    assert any(line.startswith("  reused: finished earlier") for line in echoed)
    assert again.cells[cell.label].values == first.cells[cell.label].values
    # one written since, that says false, is another run all the same
    config.write_text(before.replace("\nmethod:\n", "\nmethod:\n  joint_views: false\n"))
    assert "joint_views: false" in config.read_text()
    refused = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)[0]
    assert "(method.joint_views is False in its config.yaml, not True)" in refused.error


def folder_before_the_setting(config: RunConfig, setting: str, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run folder of ``config`` under the code before ``method.<setting>`` existed:
    configs without it, hashed without its ADDED_LATER entry."""
    from kdml.reproduce import runner

    to_dict = RunConfig.to_dict

    def without_the_setting(self):
        values = to_dict(self)
        del values["method"][setting]
        return values

    with monkeypatch.context() as before:
        before.setattr(RunConfig, "to_dict", without_the_setting)
        before.setattr(runner, "ADDED_LATER", {key: value for key, value
                                               in runner.ADDED_LATER.items()
                                               if key != ("method", setting)})
        return run_folder_of(config, tmp_path)


@pytest.mark.parametrize("recipe", ["msimclr", "simclr"])
def test_the_heads_width_added_later_keeps_the_folders_of_the_runs_before_it(tmp_path,
                                                                            monkeypatch, recipe):
    """Runs trained before ``method.proj_hidden`` had heads as wide as d, its default 0: they
    keep their folders; a wider head is another run."""
    (experiment,) = [e for e in experiments("atlas", quick=True)
                     if e.key == "atlas-table2-mnist5k"]
    cell = next(cell for cell in experiment.cells if cell.recipe == recipe)
    config = cell_config(experiment, cell, 0, "cpu")
    assert config.method.proj_hidden == 0
    wide = cell_config(experiment, cell, 0, "cpu")
    wide.method.proj_hidden = 64
    now = {0: run_folder_of(config, tmp_path), 64: run_folder_of(wide, tmp_path)}
    assert now[0] != now[64]
    assert folder_before_the_setting(config, "proj_hidden", tmp_path, monkeypatch) == now[0]


def test_the_training_time_restarts_with_a_run_trained_again_from_epoch_1(tmp_path):
    """A run whose checkpoint is gone (a record kept without it) trains again from epoch 1:
    the lost session's time is not part of the run's training time."""
    log = tmp_path / "train.log"
    log.write_text("2026-01-01 10:00:00,000 start epoch 1 of 2, device cpu\n"
                   "2026-01-01 10:05:00,000 epoch 1: lr=0.001, train/loss=1.0\n"
                   "2026-01-01 11:00:00,000 start epoch 1 of 2, device cpu\n"
                   "2026-01-01 11:01:00,000 epoch 1: lr=0.001, train/loss=1.0\n"
                   "2026-01-01 12:00:00,000 start epoch 2 of 2, device cpu\n"
                   "2026-01-01 12:00:30,000 epoch 2: lr=0.001, train/loss=0.5\n")
    assert logged_seconds(log) == 90.0


def test_a_session_that_only_scores_epoch_1_keeps_the_time_that_trained_it(tmp_path):
    """Killed while epoch 1 was scored, a run resumes by scoring it (checkpoints/unscored.pt):
    its 'start epoch 1' line starts no run afresh, so the first session's time still counts,
    as the trainer writes that line."""
    from kdml.training.run_folder import SCORED_FIRST

    log = tmp_path / "train.log"
    log.write_text("2026-01-01 10:00:00,000 start epoch 1 of 2, device cpu\n"
                   "2026-01-01 10:05:00,000 epoch 1 trained; scoring\n"
                   f"2026-01-01 11:00:00,000 start epoch 1 of 2 ({SCORED_FIRST}), device cpu\n"
                   "2026-01-01 11:01:00,000 epoch 1: lr=0.001, train/loss=1.0\n"
                   "2026-01-01 11:01:30,000 epoch 2: lr=0.001, train/loss=0.5\n")
    assert logged_seconds(log) == 300.0 + 90.0


def test_reproduction_runs_score_once_and_keep_the_folders_of_runs_that_scored_every_epoch():
    experiment = experiments("jrd", quick=False)[0]
    config = cell_config(experiment, experiment.cells[0], 0, "cpu")
    assert config.train.eval_every == config.train.epochs  # the tables need the last scores
    every_epoch = dataclasses.replace(config, train=dataclasses.replace(config.train,
                                                                        eval_every=1))
    assert run_folder_of(config, Path("runs")) == run_folder_of(every_epoch, Path("runs"))


def test_a_finished_run_that_scored_every_epoch_is_reused(tmp_path):
    """docs/reproducing.md: "runs that scored every epoch keep their folders and are reused".
    They kept their folders, but the check that a folder holds the planned run compared
    train.eval_every too and refused each of them as another run."""
    experiment = dataclasses.replace(_tiny_experiments()[0], key="tiny-test", protocol="test",
                                     common=(*TINY, "train.epochs=2"))
    runs = tmp_path / "runs"
    for planned in plan([experiment], 1, runs, "cpu").values():
        for run in planned:  # trained as an earlier kdml did: scored after every epoch
            every_epoch = dataclasses.replace(
                run.config, train=dataclasses.replace(run.config.train, eval_every=1))
            assert run.config.train.eval_every == 2
            train_planned(PlannedRun(every_epoch, run.run_dir), progress=False)
    echoed: list[str] = []
    result = reproduce([experiment], 1, runs, "cpu", progress=False, echo=echoed.append)[0]
    assert not result.error
    assert sum(line.startswith("  reused: finished earlier") for line in echoed) == 2
    for cell in result.cells.values():
        final = RunFolder(cell.run_dirs[0]).final_metrics()
        assert final is not None and cell.values["recall@1"] == [final["recall@1"]]


def test_a_table_s_settings_are_the_same_whether_its_runs_trained_now_or_earlier(tmp_path):
    """The trainer filled in the dataset's Ks (eval.ks) of the planned config it was given, so
    a table whose runs trained in this command said `eval.ks=[1, 2, 4, 8]` as a change from
    the recipes' defaults, the same command reusing them said nothing, and a table of which
    one row's run trained now (the other's reused, as after an interruption) said "by row,
    `eval.ks` to [1, 2, 4, 8]", as if the other row had other Ks."""
    from kdml.reproduce.report import _changes

    experiment = dataclasses.replace(_tiny_experiments()[0], key="tiny-test", protocol="test")
    runs = tmp_path / "runs"
    first = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)[0]
    shutil.rmtree(first.cells["alpha = 1"].run_dirs[0])  # one row trains again, one is reused
    mixed = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)[0]
    reused = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)[0]
    assert not (first.error or mixed.error or reused.error)
    assert _changes(first) == _changes(mixed) == _changes(reused)
    assert "eval.ks" not in _changes(mixed)


def test_a_run_is_finished_only_with_its_reproduce_json_and_its_final_scores(tmp_path):
    """A run is reused untrained where reproduce.json and metrics.json's final scores are both
    there, or reproduce.json says it diverged; one whose metrics.json was lost (its log and
    reproduce.json kept) resumes, which scores it again: reused, its table had stopped with
    "has no 'recall@1'"."""
    from kdml.reproduce.runner import finished_earlier

    (tmp_path / "train.log").write_text("2026-01-01 10:00:00,000 start epoch 1 of 1\n")
    assert not finished_earlier(tmp_path)
    (tmp_path / "reproduce.json").write_text(json.dumps({"wall_s": 1.0, "device": "cpu"}))
    assert not finished_earlier(tmp_path)  # its scores are gone
    (tmp_path / "metrics.json").write_text(json.dumps({"epochs": [], "final": {}}))
    assert finished_earlier(tmp_path)
    (tmp_path / "metrics.json").unlink()
    (tmp_path / "reproduce.json").write_text(json.dumps({"wall_s": 1.0, "device": "cpu",
                                                          "diverged": "loss is nan"}))
    assert finished_earlier(tmp_path)


def test_scoring_less_often_trains_the_same_model(tmp_path, tiny_overrides):
    # why eval_every may leave the run folder's hash: it changes what is recorded, not the run
    finals, weights = [], []
    for every in (1, 3):
        out = tmp_path / f"every-{every}"
        assert cli.main(["train", "mtriplet", "--dataset", "digits", "--out", str(out),
                         "--no-progress", *tiny_overrides, "train.epochs=3",
                         "train.steps_per_epoch=4",
                         f"train.eval_every={every}"]) == 0
        finals.append(json.loads((out / "metrics.json").read_text())["final"])
        weights.append(torch.load(out / "checkpoints" / "last.pt", weights_only=True)["method"])
    assert finals[0] == finals[1]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


def test_a_sweep_point_of_one_seed_draws_no_error_bar(tmp_path, monkeypatch):
    """One seed has no interval: its point gets no bar, not a bar of zero spread beside the
    points of several seeds."""
    from kdml.reproduce import plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    cells = (Cell("a", "jrd", x=0.0, series="s"), Cell("b", "jrd", x=1.0, series="s"))
    experiment = Experiment("sweep", "jrd", "Figure", "t", "digits", cells, ("recall@1",),
                            sweep="alpha")
    plots.plot_sweep(experiment, {"a": [0.5], "b": [0.6, 0.7, 0.65]}, "recall@1",
                     tmp_path / "sweep.png")
    (bars,) = drawn[0].axes[0].containers[0].lines[2]
    drawn_bars = [segment.size > 0 and bool(np.isfinite(segment).all())
                  for segment in bars.get_segments()]
    assert drawn_bars == [False, True]  # a's bar is not drawn (an empty segment), b's is


def test_a_sweep_plot_has_a_tick_at_each_swept_value(tmp_path, monkeypatch):
    from kdml.reproduce import plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    cells = (Cell("base", "jrd", x=0.0), Cell("a", "jrd", x=0.25, series="s"),
             Cell("b", "jrd", x=2.0, series="s"), Cell("c", "jrd", x=8.0, series="t"))
    experiment = Experiment("sweep", "jrd", "Figure", "t", "digits", cells, ("recall@1",),
                            sweep="alpha")
    plots.plot_sweep(experiment, {"base": [0.4], "a": [0.5], "b": [0.6], "c": [0.7]},
                     "recall@1", tmp_path / "sweep.png")
    axis = drawn[0].axes[0]
    assert list(axis.get_xticks()) == [0.0, 0.25, 2.0, 8.0]
    assert [label.get_text() for label in axis.get_xticklabels()] == ["0", "0.25", "2", "8"]


def test_a_long_sweep_title_is_wrapped_to_fit_the_figure(tmp_path, monkeypatch):
    from kdml.reproduce import plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    experiment = experiments("atlas")[0]
    long = dataclasses.replace(experiment, mirrors="Korman, Table 2, d = 2 (kdml's ablation: "
                                                   "the CPU setting for the paper's 100 epochs)")
    values = {cell.label: [0.5, 0.6] for cell in experiment.cells}
    plots.plot_sweep(long, values, "linear_accuracy", tmp_path / "long.png")
    title = drawn[0].axes[0].get_title()
    assert title.replace("\n", " ") == f"kdml's runs as {long.mirrors}: {long.dataset}"
    assert max(len(line) for line in title.splitlines()) <= 60 < len(long.mirrors)


@pytest.mark.parametrize("quick, span", [(False, "from 0 to 2"), (True, "from 0 to 1")])
def test_the_alpha_sweep_s_title_names_the_alphas_it_runs(quick, span):
    """The quick grid runs alpha = 0 and 1: its report had said alpha goes from 0 to 2."""
    sweep = next(e for e in experiments("jrd", quick) if e.key == "jrd-alpha-mnist5k")
    assert sweep.title.endswith(f"goes {span}")
    assert (sweep.cells[0].x, sweep.cells[-1].x) == (0.0, 1.0 if quick else 2.0)


def test_a_sweep_plot_says_it_is_kdml_s_runs_and_what_its_bars_are(tmp_path, monkeypatch):
    """The PNG is also read on its own (a slide, results/): titled with the paper's figure
    alone it read as the paper's own figure, and its bars were not said to be 95% intervals
    over seeds."""
    from kdml.reproduce import plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    experiment = next(e for e in experiments("jrd", True) if e.key == "jrd-alpha-mnist5k")
    values = {cell.label: [0.5, 0.6, 0.7] for cell in experiment.cells}
    plots.plot_sweep(experiment, values, "recall@1", tmp_path / "sweep.png")
    axis = drawn[0].axes[0]
    assert axis.get_title() == "kdml's runs as Chu et al. 2020, Figure 4: mnist5k"
    assert axis.get_ylabel() == "R@1 (mean +- 95% CI over 3 seeds)"


def test_a_run_whose_data_changed_is_refused_with_what_reproduce_can_do(tmp_path, monkeypatch):
    """A reused or resumed run whose data.json records other data than reproduce reads now:
    the refusal named kdml train's and eval's remedies (--data-root, its config.yaml's
    data.root), which reproduce does not take; it now says to train the run again or to put
    the data back where reproduce reads it. Following it trains the run again."""
    from fixtures_array_sets import make_idx

    monkeypatch.setenv("KDML_DATA_ROOT", str(tmp_path / "data"))
    make_idx(tmp_path / "data", train=40, test=20)
    (experiment,) = [Experiment(
        "tiny-mnist", "atlas", "Table 3", "charts", "mnist",  # its charts reload the run
        (Cell("MTriplet", "mtriplet", ("method.n_charts=2",), plot_charts=True),),
        ("recall@1",), "CUB", common=(*TINY, "data.batch_size=20"))]
    runs = tmp_path / "runs"
    (first,) = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)
    assert not first.error
    run_dir = first.cells["MTriplet"].run_dirs[0]
    make_idx(tmp_path / "data", train=40, test=20, seed=1)  # other images, as many

    def refusal() -> str:
        (result,) = reproduce([experiment], 1, runs, "cpu", progress=False,
                              echo=lambda line: None)
        return result.error

    reused = refusal()  # finished: reused, and reloaded for its charts
    (run_dir / "metrics.json").unlink()  # interrupted after its checkpoint: resumed
    (run_dir / "reproduce.json").unlink()
    for error in (reused, refusal()):
        # the folder it read, as for image files (an IDX dataset's had gone unnamed)
        assert error.startswith(f"the data read from {tmp_path / 'data' / 'mnist'} is not "
                                f"what {run_dir} trained on: ")
        assert (f"; delete {run_dir} to train the run again on this data, or put back the data "
                "it trained on where kdml reproduce reads it ($KDML_DATA_ROOT, else the "
                "dataset's system folder), or delete ") in error
        assert "--data-root" not in error and "config.yaml" not in error
        assert "data.root" not in error and "\n" not in error
    shutil.rmtree(run_dir)
    assert not refusal()


def _two_tiny_tables(monkeypatch) -> list[Experiment]:
    """A catalog of two one-cell JRD experiments on digits, for the commands to choose from."""
    tables = [Experiment(key, "jrd", mirrors, key, "digits",
                         (Cell("JRD", "jrd", (f"method.alpha={alpha}",)),), ("recall@1",),
                         common=TINY)
              for key, mirrors, alpha in (("tiny-a", "Table 2", 1), ("tiny-b", "Table 4", 0))]
    monkeypatch.setattr("kdml.reproduce.catalog.experiments",
                        lambda paper, quick=False: list(tables))
    return tables


def _sections(report: Path) -> list[str]:
    return [line for line in report.read_text().splitlines() if line.startswith("### ")]


def test_only_adds_to_the_report_from_finished_runs_and_refuses_to_drop_a_section(
        tmp_path, monkeypatch, capsys):
    """--only used to replace the report at --out with its own sections, and a second --only
    listed the first's experiment as not run although its runs had finished."""
    _two_tiny_tables(monkeypatch)
    runs, report = tmp_path / "runs", tmp_path / "report.md"
    common = ["--seeds", "1", "--runs", str(runs), "--out", str(report), "--no-progress",
              "--device", "cpu"]
    assert cli.main(["reproduce", "jrd", "--only", "tiny-a", *common]) == 0
    trained = _count_training(monkeypatch)
    assert cli.main(["reproduce", "jrd", "--only", "tiny-b", *common]) == 0
    assert trained == [0]  # tiny-a's section is read from its finished run, not trained
    assert _sections(report) == ["### Table 2: digits", "### Table 4: digits"]
    assert "## Not run for this report" not in report.read_text()

    # a report whose sections' runs are not in --runs, or that another setting wrote, is
    # refused before anything trains
    kept = report.read_text()
    capsys.readouterr()
    reasons = []
    for other in (["--seeds", "1", "--runs", str(tmp_path / "none")],
                  ["--seeds", "2", "--runs", str(runs)]):
        assert cli.main(["reproduce", "jrd", "--only", "tiny-b", *other, "--out", str(report),
                         "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"kdml: error: {report} holds 1 section that this report would "
                              "drop: tiny-a (") and err.count("\n") == 1, err
        assert "another --out, or delete" in err
        reasons.append(err.split("drop: ", 1)[1].split("; give", 1)[0])
    # each its own reason (the second had also said its runs were not finished)
    assert reasons == [f"tiny-a (its runs at --seeds 1 on cpu are not all finished in "
                       f"{tmp_path / 'none'})", "tiny-a (written at --seeds 1)"]
    assert trained == [0] and not (tmp_path / "none").exists()
    assert report.read_text() == kept
    # without --only, the command writes what it runs, as before
    assert cli.main(["reproduce", "jrd", *common]) == 0
    assert len(_sections(report)) == 2


def test_the_header_counts_a_shared_run_once_and_names_where_the_runs_trained(
        tmp_path, monkeypatch):
    """A run that several experiments share (JRD at alpha = 1 is in five) trained once, but
    its minutes were added once per experiment (docs/reproduction.md said 308.3 minutes of
    training for runs that took 271.1); and the header named the machine writing the report
    as if the runs kept from elsewhere (results/) had trained there."""
    from kdml.machine import machine_description

    tables = [Experiment(key, "jrd", mirrors, key, "digits",
                         (Cell("JRD", "jrd", ("method.alpha=1",)),), ("recall@1",),
                         common=TINY)
              for key, mirrors in (("tiny-a", "Table 2"), ("tiny-b", "Table 4"))]
    monkeypatch.setattr("kdml.reproduce.catalog.experiments",
                        lambda paper, quick=False: list(tables))
    runs, report = tmp_path / "runs", tmp_path / "report.md"
    command = ["reproduce", "jrd", "--seeds", "1", "--runs", str(runs), "--out", str(report),
               "--no-progress", "--device", "cpu"]
    assert cli.main(command) == 0
    (timing,) = runs.rglob("reproduce.json")  # one run, read by both tables
    stored = json.loads(timing.read_text())
    here = machine_description(torch.device("cpu"))
    assert stored["machine"] == here
    assert f"; {stored['wall_s'] / 60:.1f} minutes of training in all. Settings:" in \
        report.read_text()
    timing.write_text(json.dumps({**stored, "wall_s": 600.0, "machine": "Elsewhere CPU"}))
    assert cli.main(command) == 0
    assert ("; 10.0 minutes of training in all (1 run on Elsewhere CPU). Settings:"
            in report.read_text())
    del stored["machine"]  # as runs recorded before kdml kept it
    timing.write_text(json.dumps({**stored, "wall_s": 600.0}))
    assert cli.main(command) == 0
    assert ("; 10.0 minutes of training in all (1 run on a machine not recorded: kdml did not "
            "keep it then). Settings:" in report.read_text())


def test_a_not_run_command_adds_its_section_to_the_same_report(tmp_path, monkeypatch):
    """The commands listed as not run left out --seeds, --quick, --device and --out: pasted,
    they trained another setting into the default report."""
    _two_tiny_tables(monkeypatch)
    # here `auto` would be a GPU: runs trained with --device cpu are found only with it
    monkeypatch.setattr("kdml.training.build.resolve_device",
                        lambda name, option=None: torch.device("cuda" if name == "auto"
                                                               else name))
    runs, report = tmp_path / "runs", tmp_path / "report.md"
    assert cli.main(["reproduce", "jrd", "--quick", "--seeds", "1", "--only", "tiny-a",
                     "--runs", str(runs), "--out", str(report), "--no-progress",
                     "--device", "cpu"]) == 0
    text = report.read_text()
    command = (f"kdml reproduce jrd --only tiny-b --seeds 1 --quick --device cpu --runs {runs} "
               f"--out {report}")
    assert f"- `tiny-b` (Table 4, digits): `{command}`" in text
    assert "Command: `kdml reproduce jrd --only tiny-a --seeds 1 --quick --device cpu " in text
    assert cli.main([*command.split()[1:], "--no-progress"]) == 0
    assert _sections(report) == ["### Table 2: digits", "### Table 4: digits"]
    assert "## Not run for this report" not in report.read_text()


def test_a_section_not_run_holds_nothing_to_keep(tmp_path):
    """A failed experiment's section ("Not run here: ...") had been counted as one with
    numbers, so every --only of another key on that report was refused."""
    from kdml.reproduce.report import Section, reported_sections

    report = tmp_path / "report.md"
    report.write_text("### M: digits\n\nA. Command: `kdml reproduce jrd --only jrd-a --seeds 1 "
                      "--quick`.\n\nNot run here: boom\n\n### N: digits\n\nB. Command: `kdml "
                      "reproduce jrd --only jrd-b --seeds 1 --quick`.\n\n| table |\n")
    assert reported_sections(report) == [Section("jrd-b", 1, True)]


def _two_papers(monkeypatch) -> dict[str, list[Experiment]]:
    """A catalog of a one-cell JRD sweep (it draws a plot) and a one-cell DTML table."""
    tables = {
        "jrd": [Experiment("tiny-j", "jrd", "Figure 4", "alpha", "digits",
                           (Cell("alpha = 1", "jrd", ("method.alpha=1",), series="JRD", x=1.0),),
                           ("recall@1",), common=TINY, sweep="alpha")],
        "dtml": [Experiment("tiny-d", "dtml", "LFW", "transfer", "digits",
                            (Cell("JRD", "jrd", ("method.alpha=0",)),), ("recall@1",),
                            common=TINY)]}
    monkeypatch.setattr("kdml.reproduce.catalog.experiments",
                        lambda paper, quick=False: list(
                            tables["jrd"] + tables["dtml"] if paper == "all" else tables[paper]))
    return tables


def _report_of_both_papers(tmp_path, monkeypatch,
                           tiny_jrd_runs: Path) -> tuple[Path, Path, list[str]]:
    """The runs folder and a report of both tiny papers' sections (tiny-d by `kdml reproduce
    dtml`, then tiny-j by an --only of jrd), and the options that wrote it. The runs folder
    starts as a copy of ``tiny_jrd_runs``, which holds both sections' runs (JRD at alpha 0 and
    1): the commands read them rather than train them."""
    _two_papers(monkeypatch)
    runs, report = copy_of(tiny_jrd_runs, tmp_path / "runs"), tmp_path / "report.md"
    common = ["--seeds", "1", "--runs", str(runs), "--out", str(report), "--no-progress",
              "--device", "cpu"]
    assert cli.main(["reproduce", "dtml", *common]) == 0
    assert cli.main(["reproduce", "jrd", "--only", "tiny-j", *common]) == 0
    return runs, report, common


def test_a_paper_without_only_keeps_the_report_s_other_sections(tmp_path, monkeypatch, capsys,
                                                                 tiny_jrd_runs):
    """`kdml reproduce dtml` without --only kept only its own sections: a JRD section that an
    --only had added to the same report was dropped without a word, its plot left behind.
    It now keeps them as --only does, and refuses a report it would cut."""
    runs, report, common = _report_of_both_papers(tmp_path, monkeypatch, tiny_jrd_runs)
    assert _sections(report) == ["### Figure 4: digits", "### LFW: digits"]
    trained = _count_training(monkeypatch)
    assert cli.main(["reproduce", "dtml", *common]) == 0
    assert trained == []  # both read from their finished runs
    text = report.read_text()
    assert _sections(report) == ["### Figure 4: digits", "### LFW: digits"]
    assert "](report-plots/tiny-j.png)" in text and (tmp_path / "report-plots/tiny-j.png").is_file()
    # a report it would cut is refused in one line before anything trains
    capsys.readouterr()
    assert cli.main(["reproduce", "dtml", "--seeds", "1", "--runs", str(tmp_path / "none"),
                     "--out", str(report), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: {report} holds 1 section that this report would drop: "
                          "tiny-j (its runs at --seeds 1 on cpu are not all finished in "
                          f"{tmp_path / 'none'})") and err.count("\n") == 1, err
    assert "another --out, or delete" in err
    assert trained == [] and not (tmp_path / "none").exists() and report.read_text() == text


def test_a_paper_s_report_lists_no_other_paper_s_experiment_as_not_run(tmp_path, monkeypatch,
                                                                         tiny_jrd_runs):
    """The experiments a report lists as not run are its paper's: `kdml reproduce dtml` on a
    new report names no JRD experiment (nor its command)."""
    _two_papers(monkeypatch)
    report = tmp_path / "report.md"
    runs = copy_of(tiny_jrd_runs, tmp_path / "runs")  # tiny-d's run (alpha 0): read, not trained
    assert cli.main(["reproduce", "dtml", "--seeds", "1", "--runs", str(runs),
                     "--out", str(report), "--no-progress", "--device", "cpu"]) == 0
    assert _sections(report) == ["### LFW: digits"]
    assert "tiny-j" not in report.read_text()


def test_a_chart_plot_without_its_checkpoint_leaves_the_table_and_says_why(
        tmp_path, tiny_charts_runs, tiny_jrd_runs):
    """Run records kept without checkpoints (as in results/) lost the whole table of an
    experiment that draws chart plots ("could not run: no checkpoint at ..."), although its
    numbers are in the records; and a protocol file missing without a checkpoint said to
    resume the run with kdml train, which has nothing left to train."""
    charts, general = _tiny_experiments()[2], _tiny_experiments()[1]
    runs = copy_of(tiny_jrd_runs, copy_of(tiny_charts_runs, tmp_path / "runs"))  # both tables'
    first = reproduce([charts, general], 1, runs, "cpu", progress=False, echo=lambda line: None)
    assert not any(result.error for result in first)
    report = tmp_path / "report.md"
    context = ReportContext("kdml reproduce atlas", "a test machine", "torch", 0.1, 1, True)
    write_report(first, report, context)
    plot = plots_folder(report) / "tiny-charts-charts.png"
    assert plot.is_file()
    for checkpoint in runs.rglob("*.pt"):
        checkpoint.unlink()
    (run_dir,) = first[0].cells["MTriplet"].run_dirs
    (general_dir,) = first[1].cells["alpha = 1"].run_dirs
    (general_dir / "generalization.json").unlink()
    # the plot drawn while the checkpoint was there is kept with the records, and shown again
    drawn = plot.read_bytes()
    assert (run_dir / CHARTS_RECORD).read_bytes() == drawn
    kept = reproduce([charts], 1, runs, "cpu", progress=False, echo=lambda line: None)
    assert kept[0].cells["MTriplet"].charts == run_dir / CHARTS_RECORD
    plot.unlink()
    text = write_report(kept, report, context).read_text()
    assert "Charts of MTriplet, seed 0 (Sec. A.2):" in text and plot.read_bytes() == drawn
    # without it too, the report says why there is no plot
    (run_dir / CHARTS_RECORD).unlink()
    again = reproduce([charts, general], 1, runs, "cpu", progress=False, echo=lambda line: None)
    cell = again[0].cells["MTriplet"]
    assert not again[0].error and cell.charts is None
    assert cell.values == first[0].cells["MTriplet"].values
    assert cell.charts_missing == (f"{run_dir} keeps its records but no checkpoint to draw its "
                                   f"charts (last.pt is gone); delete {run_dir} and run the same "
                                   "command again to train it again")
    # lambda and d_H need the model: said so, with reproduce's remedy
    assert again[1].error == (f"{general_dir} keeps its records but no checkpoint to compute "
                              f"its generalization.json from (last.pt is gone); delete "
                              f"{general_dir} and run the same command again to train it again")
    text = write_report(again[:1], report, context).read_text()
    assert f"| MTriplet | {cell.values['recall@1'][0]:.3f} |" in text
    assert (f"Charts of MTriplet (Sec. A.2) are not drawn here: {cell.charts_missing}."
            in text)
    assert not plot.exists()  # the earlier report's plot is not left as if it were this one's
    # a cell whose every seed diverged says so too, instead of showing nothing
    diverged = dataclasses.replace(again[0], cells={"MTriplet": CellResult(
        values={"recall@1": [math.nan]}, run_dirs=[run_dir], wall_s=[1.0],
        diverged={0: "boom"})})
    assert ("Charts of MTriplet (Sec. A.2) are not drawn here: every seed's run diverged"
            in write_report([diverged], report, context).read_text())


def test_an_only_pattern_that_matches_nothing_is_refused_beside_one_that_matches(capsys):
    """A mistyped key beside a good one was ignored, and its experiment silently left out."""
    assert cli.main(["reproduce", "dtml", "--quick", "--only", "dtml-*", "--only", "zzz",
                     "--list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: --only zzz matches no experiment of dtml; the keys are: "
                          "dtml-mnist5k-to-digits") and err.count("\n") == 1, err
    assert cli.main(["reproduce", "atlas", "--quick", "--only", "atlas-triplet-mnist5k",
                     "--only", "atlas-mmd64-fashion-*", "--list"]) == 2
    assert capsys.readouterr().err.startswith(
        "kdml: error: --only atlas-mmd64-fashion-* matches no experiment of atlas with --quick "
        "(without it: atlas-mmd64-fashion-mnist); the keys are: ")


def test_a_missing_cuda_device_is_named_as_reproduce_s_option(tmp_path, monkeypatch, capsys):
    """It said "train.device=cuda but no CUDA device...", a setting reproduce does not take."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    runs = tmp_path / "runs"
    for device in ("cuda", "cuda:1"):
        assert cli.main(["reproduce", "dtml", "--quick", "--seeds", "1", "--only",
                         "dtml-mnist5k-to-digits", "--runs", str(runs), "--device", device,
                         "--out", str(tmp_path / "r.md")]) == 2
        assert capsys.readouterr().err == (f"kdml: error: --device {device} but no CUDA device "
                                           "is available here; give --device cpu or auto\n")
    assert not runs.exists()


def _count_training(monkeypatch) -> list[float]:
    """Patch reproduce's training to record each trained run's method.alpha, then train."""
    from kdml.reproduce import runner

    real_train = runner.train
    trained: list[float] = []

    def train_counted(config, run_dir, **kwargs):
        trained.append(config.method.alpha)
        return real_train(config, run_dir, **kwargs)

    monkeypatch.setattr(runner, "train", train_counted)
    return trained


def test_a_chart_plot_whose_checkpoint_will_not_load_leaves_the_table_and_says_why(
        tmp_path, tiny_charts_runs):
    """A corrupt checkpoint stopped the whole table of an experiment that draws chart plots
    ("could not run: ..."), although its numbers are in the run records: only the plot needs
    the model, so the report says why it is not drawn, as for a missing checkpoint."""
    charts = _tiny_experiments()[2]
    runs = tmp_path / "runs"
    shutil.copytree(tiny_charts_runs, runs)  # the same run, trained once for the module
    first = reproduce([charts], 1, runs, "cpu", progress=False, echo=lambda line: None)
    assert not first[0].error
    (run_dir,) = first[0].cells["MTriplet"].run_dirs
    checkpoint = run_dir / "checkpoints" / "last.pt"
    assert checkpoint.is_file()
    checkpoint.write_bytes(b"not a checkpoint")
    again = reproduce([charts], 1, runs, "cpu", progress=False, echo=lambda line: None)
    assert not again[0].error, again[0].error
    cell = again[0].cells["MTriplet"]
    # the plot drawn from it before is shown (kept with the records)
    assert cell.charts == run_dir / CHARTS_RECORD and cell.charts.is_file()
    assert cell.values == first[0].cells["MTriplet"].values
    (run_dir / CHARTS_RECORD).unlink()
    cell = reproduce([charts], 1, runs, "cpu", progress=False,
                     echo=lambda line: None)[0].cells["MTriplet"]
    assert cell.charts is None and cell.values == first[0].cells["MTriplet"].values
    assert str(checkpoint) in cell.charts_missing and "\n" not in cell.charts_missing
    assert checkpoint.read_bytes() == b"not a checkpoint"  # kept as it was, for the user


def test_a_file_of_the_users_where_the_chart_plot_is_kept_is_not_replaced(tmp_path,
                                                                          tiny_charts_runs):
    """The chart plot kept with a run's records goes where nothing of the user's may be."""
    charts = _tiny_experiments()[2]
    runs = tmp_path / "runs"
    shutil.copytree(tiny_charts_runs, runs)  # the same run, trained once for the module
    first = reproduce([charts], 1, runs, "cpu", progress=False, echo=lambda line: None)
    (run_dir,) = first[0].cells["MTriplet"].run_dirs
    record = run_dir / CHARTS_RECORD
    record.write_text("my notes")
    again = reproduce([charts], 1, runs, "cpu", progress=False, echo=lambda line: None)
    assert again[0].error == (f"{record} is in the way and kdml did not draw it; move it away "
                              "(kdml never replaces a file it did not write)")
    assert record.read_text() == "my notes"


@pytest.mark.parametrize("lets_go", ["while this one trains", "while this one waits"])
def test_a_run_another_process_trains_is_read_after_the_others(tmp_path, monkeypatch, lets_go):
    """Several kdml reproduce may share a runs folder (one per GPU): a run another one holds is
    left for later, and read once it lets go, not refused or trained twice. A wait is said
    only where there is one (the other had mostly finished long before)."""
    from kdml.reproduce import runner

    experiment = Experiment("tiny-shared", "jrd", "Table 2", "shared", "digits",
                            (Cell("JRD", "jrd"),), ("recall@1",), common=TINY)
    runs = tmp_path / "runs"
    first, second = (run.run_dir for run in plan([experiment], 2, runs, "cpu")[
        experiment.key, "JRD"])
    other = contextlib.ExitStack()  # another process's claim (flock: another open file)
    other.enter_context(hold_folder(runner.claim_file(first), "held by the other"))
    trained: list[Path] = []
    real = runner.train_planned

    def recorded(run, progress):
        trained.append(run.run_dir)
        if lets_go == "while this one trains":
            other.close()  # the other process finishes while this one trains its own run
        return real(run, progress)

    def held(lock, busy, wait=False):  # the other lets go once this one waits for it
        if wait and lets_go == "while this one waits":
            threading.Timer(0.2, other.close).start()
        return real_hold(lock, busy, wait)

    real_hold = runner.hold_folder
    monkeypatch.setattr(runner, "train_planned", recorded)
    monkeypatch.setattr(runner, "hold_folder", held)
    said: list[str] = []
    (result,) = reproduce([experiment], 2, runs, "cpu", progress=False, echo=said.append)
    assert trained == [second, first]
    assert "  another process is training it: it is read when that one has finished" in said
    assert f"back to {first}, which another process was training" in said
    waited = "  it still is: waiting for it to finish" in said
    assert waited == (lets_go == "while this one waits")
    assert not result.error and len(result.cells["JRD"].values["recall@1"]) == 2


def test_a_run_kdml_train_holds_is_a_failure_once_waited_for(tmp_path):
    # kdml train --resume on a reproduce run: waited for like another reproduce, then its
    # refusal is the run's failure, not a wait without end
    experiment = Experiment("tiny-held", "jrd", "Table 2", "held", "digits",
                            (Cell("JRD", "jrd"),), ("recall@1",), common=TINY)
    runs = tmp_path / "runs"
    (run,) = plan([experiment], 1, runs, "cpu")[experiment.key, "JRD"]
    said: list[str] = []
    with RunFolder(run.run_dir).held():
        (result,) = reproduce([experiment], 1, runs, "cpu", progress=False, echo=said.append)
    assert said[-1] == f"  failed: {run.run_dir} is being trained by another process; let it " \
                       "finish or stop it first"
    assert said[-2] == f"back to {run.run_dir}, which another process was training"  # no wait
    assert "is being trained by another process" in result.error


def test_a_report_keeps_the_sections_another_reproduce_wrote_while_this_one_trained(
        tmp_path, monkeypatch):
    """Two kdml reproduce on one runs folder and report: the one that writes last used to
    drop the other's section, read from the report before it trained."""
    from kdml.reproduce import runner

    _two_tiny_tables(monkeypatch)
    common = ["--seeds", "1", "--runs", str(tmp_path / "runs"), "--out",
              str(tmp_path / "report.md"), "--no-progress", "--device", "cpu"]
    real = runner.reproduce
    others: list[int] = []

    def beside_another(*args, **kwargs):
        if not others:  # while this one trains, the other writes its section
            others.append(-1)
            others[0] = cli.main(["reproduce", "jrd", "--only", "tiny-b", *common])
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "reproduce", beside_another)
    assert cli.main(["reproduce", "jrd", "--only", "tiny-a", *common]) == 0
    assert others == [0]
    assert _sections(tmp_path / "report.md") == ["### Table 2: digits", "### Table 4: digits"]


def test_a_rewrite_removes_only_the_plots_kdml_drew(tmp_path):
    """Every unlinked .png in the plot folder had been deleted: a user's own image there was
    lost without a word, and so was a plot kdml drew elsewhere (a run's retrieval grid) that
    the user copied there; only those the report linked before go. A plot from before kdml
    marked its own (matplotlib's mark alone) is replaced where a report draws it again, but
    not deleted."""
    import matplotlib.pyplot as plt
    from PIL import Image, PngImagePlugin

    from kdml.figure_file import write_png
    from kdml.reproduce.report import PLOTS_MARKER, _remove_unlinked_plots

    plots = tmp_path / "report-plots"
    plots.mkdir()
    (plots / PLOTS_MARKER).touch()
    figure = plt.figure()
    write_png(figure, plots / "stale.png")
    write_png(figure, plots / "linked.png")
    write_png(figure, plots / "copied-retrieval.png")
    plt.close(figure)
    Image.new("RGB", (4, 4)).save(plots / "mine.png")
    older = PngImagePlugin.PngInfo()
    older.add_text("Software", "Matplotlib version3.8.0, https://matplotlib.org/")
    Image.new("RGB", (4, 4)).save(plots / "older.png", pnginfo=older)
    before = "".join(f"![{name}](report-plots/{name}.png)\n"
                     for name in ("stale", "linked", "mine", "older"))
    _remove_unlinked_plots(plots, "![linked](report-plots/linked.png)\n", before)
    assert sorted(path.name for path in plots.glob("*.png")) == [
        "copied-retrieval.png", "linked.png", "mine.png", "older.png"]


def test_a_file_where_the_plots_folder_goes_is_called_a_file(tmp_path):
    """It was said to "hold files kdml reproduce did not write", of a plain file."""
    from kdml.reproduce.report import check_outputs

    plots = tmp_path / "report-plots"
    plots.write_text("mine")
    with pytest.raises(KdmlError, match=rf"^{re.escape(str(plots))} is a file, where the "
                                        r"report's plots folder goes; move it or choose "
                                        r"another --out$"):
        check_outputs(tmp_path / "report.md")
    plots.unlink()
    plots.mkdir()
    (plots / "mine.png").write_bytes(b"")
    with pytest.raises(KdmlError, match=r"holds files kdml reproduce did not write"):
        check_outputs(tmp_path / "report.md")


@pytest.mark.parametrize("name", ["report.txt", "report", "report.MD"])
def test_a_report_path_must_end_in_md(tmp_path, name):
    """Its plot folder is named by the stem: report.md and report.txt had shared
    report-plots/, and writing one deleted the other's plots."""
    from kdml.reproduce.report import check_outputs

    with pytest.raises(KdmlError, match=rf"^--out {re.escape(str(tmp_path / name))}: a report "
                                        r"is Markdown; give a path ending in \.md$"):
        check_outputs(tmp_path / name)
    check_outputs(tmp_path / "report.md")


@pytest.mark.parametrize("args, message", [
    (["--quick", "--runs", "afile"], "cannot write into afile: afile is not a folder; choose "
                                     "another --runs"),
    (["--runs", "afile"], "cannot write into afile: afile is not a folder; choose another "
                          "--runs"),
    (["--seeds", "1001"], "argument --seeds: must be from 1 to 1000, got 1001"),
])
def test_reproduce_refuses_a_runs_file_and_a_huge_seed_count_before_anything_runs(
        tmp_path, monkeypatch, capsys, args, message):
    """--runs FILE with --quick had blamed --out, which was not given, and without --quick
    every run failed before a second error ended the command; --seeds 10^11 had planned with
    its memory growing, saying nothing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine")
    trained = _count_training(monkeypatch)
    assert cli.main(["reproduce", "jrd", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: {message}") and err.count("\n") == 1, err
    assert trained == [] and (tmp_path / "afile").read_text() == "mine"


def _a_run_and_a_grid_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A folder as kdml train leaves a run (config.yaml, train.log, checkpoints/) and one as a
    grid leaves (grid.yaml)."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("recipe: jrd\n")
    (run / "train.log").write_text("epoch 1\n")
    grid = tmp_path / "grid"
    grid.mkdir()
    (grid / "grid.yaml").write_text("grid: {method.alpha: [0.1]}\ncells: [alpha-0.1]\n")
    return run, grid


def test_reproduce_refuses_a_run_folder_or_a_grid_folder_as_its_runs(tmp_path, monkeypatch,
                                                                     capsys):
    """A --runs made by kdml train had its runs nested among the run's own files (and, with
    --quick, its report written there), where kdml train and a grid refuse such a folder."""
    run, grid = _a_run_and_a_grid_folder(tmp_path)
    trained = _count_training(monkeypatch)
    for runs, message in ((run, f"--runs {run} is a run's folder (its config.yaml beside its "
                                "log or checkpoints); kdml reproduce's runs go into a folder "
                                "of their own: choose another --runs"),
                          (grid, f"--runs {grid} is a grid's folder (grid.yaml)")):
        before = sorted(path.name for path in runs.iterdir())
        assert cli.main(["reproduce", "dtml", "--quick", "--runs", str(runs)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"kdml: error: {message}") and err.count("\n") == 1, err
        assert sorted(path.name for path in runs.iterdir()) == before
    assert trained == []


def test_reproduce_refuses_a_runs_folder_inside_a_run_folder_or_a_grid_folder(
        tmp_path, monkeypatch, capsys):
    """--runs RUN/sub (a new folder inside kdml train's run folder, or inside a grid's) was
    accepted: reproduce trained its runs, and with --quick wrote its report, among that run's
    own files, where --runs RUN itself is refused."""
    run, grid = _a_run_and_a_grid_folder(tmp_path)
    trained = _count_training(monkeypatch)
    monkeypatch.chdir(run)  # a relative --runs below the working folder, itself a run's
    for runs, above, what in ((run / "sub" / "deeper", run, "the run folder"),
                              (Path("sub"), run, "the run folder"),
                              (grid / "sub", grid, "the grid folder")):
        before = sorted(path.name for path in above.iterdir())
        assert cli.main(["reproduce", "dtml", "--quick", "--runs", str(runs)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"kdml: error: --runs {runs} is inside {what} {above}"), err
        assert err.rstrip().endswith("choose a --runs outside it") and err.count("\n") == 1
        assert sorted(path.name for path in above.iterdir()) == before
    assert trained == []
    # a folder beside the run, spelled through it with "..", is not inside it
    from kdml.reproduce.runner import check_runs_folder

    check_runs_folder(Path("..") / "beside")
    check_runs_folder(run / ".." / "beside")


def test_a_kept_section_that_cannot_be_read_again_leaves_the_report_as_it_was(
        tmp_path, monkeypatch, capsys, tiny_jrd_runs):
    """`kdml reproduce dtml` reads a report's JRD section again from its runs; where that
    failed (a protocol file gone with its checkpoint), the section had become "Not run here",
    its numbers lost, which docs/reproducing.md says is refused."""
    from kdml.reproduce import runner

    runs, report, common = _report_of_both_papers(tmp_path, monkeypatch, tiny_jrd_runs)
    written = report.read_text()
    real_reproduce = runner.reproduce

    def tiny_j_unreadable(experiments, *args, **kwargs):
        return [dataclasses.replace(result, error="its parts.json is gone")
                if result.experiment.key == "tiny-j" else result
                for result in real_reproduce(experiments, *args, **kwargs)]

    monkeypatch.setattr(runner, "reproduce", tiny_j_unreadable)
    capsys.readouterr()
    assert cli.main(["reproduce", "dtml", *common]) == 1
    err = capsys.readouterr().err
    assert f"{report} is left as it was: it holds the numbers of tiny-j, which could not" in err
    assert report.read_text() == written


def test_an_image_where_a_plot_goes_is_refused_before_anything_trains(tmp_path, monkeypatch,
                                                                     capsys):
    """The write at the end refused it, after every run had trained."""
    from PIL import Image

    from kdml.reproduce.report import PLOTS_MARKER

    _two_papers(monkeypatch)
    runs, report = tmp_path / "runs", tmp_path / "report.md"
    plots = tmp_path / "report-plots"
    plots.mkdir()
    (plots / PLOTS_MARKER).touch()
    Image.new("RGB", (4, 4)).save(plots / "tiny-j.png")
    trained = _count_training(monkeypatch)
    assert cli.main(["reproduce", "jrd", "--seeds", "1", "--runs", str(runs), "--out",
                     str(report), "--no-progress", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: {plots / 'tiny-j.png'} is in the way and kdml did not "
                          "draw it") and err.count("\n") == 1, err
    assert trained == [] and not runs.exists()

def _by_hand(experiment: Experiment, values: dict[str, dict[str, list[float]]],
             **per_cell: dict[str, object]) -> ExperimentResult:
    """An ExperimentResult built without training: ``values[label][metric]`` per seed, and
    CellResult fields by cell label (``collapsed={"flat": {1: 0.9}}``)."""
    cells = {}
    for cell in experiment.cells:
        count = len(next(iter(values[cell.label].values())))
        cells[cell.label] = CellResult(
            values=values[cell.label], wall_s=[60.0] * count,
            run_dirs=[Path(f"/runs/{cell.label}/seed-{seed}") for seed in range(count)],
            **{name: by_label[cell.label] for name, by_label in per_cell.items()
               if cell.label in by_label})
    configs = tuple(cell_config(experiment, cell, 0, "cpu") for cell in experiment.cells)
    return ExperimentResult(experiment, cells, configs)


def _literal(values: list[float]) -> tuple[float, float]:
    """Mean and 95% Student-t half-width, in plain float64 loops."""
    kept = [value for value in values if not math.isnan(value)]
    mean = sum(kept) / len(kept)
    spread = math.sqrt(sum((value - mean) ** 2 for value in kept) / (len(kept) - 1))
    return mean, float(stats.t.ppf(0.975, len(kept) - 1)) * spread / math.sqrt(len(kept))


def test_a_report_s_numbers_are_the_literal_mean_interval_and_paired_margin(tmp_path):
    cells = (Cell("A", "jrd", ()), Cell("B", "jrd", ("method.alpha=0",)),
             Cell("C", "jrd", ("method.alpha=2",)))
    values = {"A": {"recall@1": [0.80, 0.82, 0.81, 0.85], "bound": [1.10, 1.05, 1.12, 1.08]},
              "B": {"recall@1": [0.70, 0.71, 0.74, 0.72], "bound": [1.20, 1.21, 1.15, 1.19]},
              "C": {"recall@1": [0.75, math.nan, 0.78, 0.76],
                    "bound": [1.30, math.nan, 1.25, 1.28]}}
    claims = (Claim("A beats B", "A", "B", "recall@1"),
              Claim("A's bound is below C's", "A", "C", "bound", lower_is_better=True))
    experiment = Experiment("hand", "jrd", "T", "t", "digits", cells, ("recall@1", "bound"),
                            "CUB", claims, common=TINY)
    result = _by_hand(experiment, values, diverged={"C": {1: "boom"}})
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 4, False)
    text = write_report([result], tmp_path / "report.md", context).read_text()
    for label in "AB":
        row = " | ".join("{:.3f} +- {:.3f}".format(*_literal(values[label][metric]))
                         for metric in ("recall@1", "bound"))
        assert f"| {label} | {row} |" in text
    margin = "{:+.3f} +- {:.3f}".format(*_literal(
        [b - w for b, w in zip(values["A"]["recall@1"], values["B"]["recall@1"], strict=True)]))
    assert f"- A beats B (R@1): holds: A is higher by {margin}, 4 seeds." in text
    lower = "{:.3f} +- {:.3f}".format(*_literal(
        [c - a for a, c in zip(values["A"]["bound"], values["C"]["bound"], strict=True)
         if not math.isnan(c)]))
    assert (f"- A's bound is below C's (lambda + d_H): holds: A is lower by {lower}, 3 seeds; "
            "1 seed left out, where C diverged.") in text


def test_verdict_shows_a_half_width_that_rounds_to_zero_and_judges_a_small_spread():
    claim = Claim("A beats B", "A", "B", "recall@1")
    # a spread of 2e-4 is a spread (not SAME), and its half-width 0.00025 is not "+- 0.000"
    assert verdict(claim, [0.5120, 0.5121, 0.5122], [0.5] * 3) == \
        "holds: A is higher by +0.0121 +- 0.0002, 3 seeds"
    # a mean of -1e-7 printed at 6 decimals is still not "-0.000000"
    line = verdict(claim, [-0.0010004, 0.001, 0.0], [0.0] * 3)
    assert "-0.0" not in line and line.startswith("not shown: A minus B is +0.000000 +- ")


def test_the_header_names_the_seeds_the_means_are_over():
    from kdml.reproduce.report import _header

    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 3, False)
    assert ("Values are means over 3 seeds (0 to 2) +- the half-width of their 95% confidence "
            "interval (Student t).") in " ".join(_header(context))


def test_a_claim_counts_the_seeds_its_cell_collapsed_on(tmp_path):
    cells = (Cell("steady", "jrd", ()), Cell("flat", "jrd", ("method.alpha=0.5",)))
    claim = Claim("steady beats flat", "steady", "flat", "recall@1")
    experiment = Experiment("tiny-collapse", "jrd", "Figure 5", "regularizers", "digits", cells,
                            ("recall@1",), "CUB", (claim,), common=TINY)
    result = _by_hand(experiment, {"steady": {"recall@1": [0.5, 0.6, 0.55]},
                                   "flat": {"recall@1": [0.2, 0.3, 0.25]}},
                      collapsed={"flat": {1: 0.9}})
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 3, False)
    text = write_report([result], tmp_path / "report.md", context).read_text()
    assert "| flat (seed 1 collapsed) |" in text
    line = next(line for line in text.splitlines() if line.startswith("- steady beats"))
    assert line.endswith("; flat collapsed on 1 of 3 seeds.")


def test_a_sweep_plot_draws_the_table_s_first_metric(tmp_path, monkeypatch):
    from kdml.reproduce import report as report_module

    drawn = []
    monkeypatch.setattr(report_module, "plot_sweep",
                        lambda experiment, values, metric, path: drawn.append((metric, values))
                        or path)
    cells = (Cell("a", "jrd", (), x=0.0), Cell("b", "jrd", ("method.alpha=0",), x=1.0))
    experiment = Experiment("sweep", "jrd", "Figure 4", "t", "digits", cells,
                            ("recall@1", "map@r"), "CUB", common=TINY, sweep="alpha")
    result = _by_hand(experiment, {"a": {"recall@1": [0.5, 0.6], "map@r": [0.1, 0.2]},
                                   "b": {"recall@1": [0.7, 0.8], "map@r": [0.3, 0.4]}})
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    write_report([result], tmp_path / "report.md", context)
    assert drawn == [("recall@1", {"a": [0.5, 0.6], "b": [0.7, 0.8]})]


def test_a_paper_column_keeps_up_to_six_decimals():
    from kdml.reproduce.report import _decimals

    assert [_decimals(value) for value in (0.5, 0.0765, 0.12345, 0.123456, 0.1234567)] == \
        [3, 4, 5, 6, 6]


def test_training_minutes_leave_out_a_run_without_its_time():
    from kdml.reproduce.report import training_minutes

    assert training_minutes({Path("a"): (120.0, ""), Path("b"): (math.nan, "")}) == 2.0


def test_a_section_written_at_another_setting_is_refused(tmp_path, monkeypatch, capsys):
    """A --quick section is not silently re-read at the full setting (the tiny catalog's
    runs are the same in both, so only the section's own command tells them apart)."""
    _two_tiny_tables(monkeypatch)
    runs, report = tmp_path / "runs", tmp_path / "report.md"
    common = ["--seeds", "1", "--runs", str(runs), "--out", str(report), "--no-progress",
              "--device", "cpu"]
    assert cli.main(["reproduce", "jrd", "--quick", "--only", "tiny-a", *common]) == 0
    kept = report.read_text()
    capsys.readouterr()
    assert cli.main(["reproduce", "jrd", "--only", "tiny-b", *common]) == 2
    assert "would drop: tiny-a (written at --seeds 1 --quick); give" in capsys.readouterr().err
    assert report.read_text() == kept


def test_a_section_whose_runs_are_partly_finished_is_refused(tmp_path, monkeypatch, capsys):
    _two_tiny_tables(monkeypatch)
    runs, report = tmp_path / "runs", tmp_path / "report.md"
    common = ["--seeds", "2", "--runs", str(runs), "--out", str(report), "--no-progress",
              "--device", "cpu"]
    assert cli.main(["reproduce", "jrd", "--only", "tiny-a", *common]) == 0
    (timing,) = runs.glob("*/seed-1/reproduce.json")  # tiny-a's second seed: interrupted
    timing.unlink()
    capsys.readouterr()
    trained = _count_training(monkeypatch)
    assert cli.main(["reproduce", "jrd", "--only", "tiny-b", *common]) == 2
    assert ("would drop: tiny-a (its runs at --seeds 2 on cpu are not all finished in "
            in capsys.readouterr().err)
    assert trained == []


def test_an_experiment_that_cannot_be_configured_has_no_finished_runs(tmp_path):
    from kdml.reproduce.runner import all_finished

    bad = Experiment("tiny-bad", "jrd", "T", "t", "digits",
                     (Cell("x", "jrd", ("method.no_such_setting=1",)),), ("recall@1",),
                     common=TINY)
    assert all_finished(bad, 1, tmp_path, "cpu") is False


def test_the_training_time_leaves_out_the_stopped_line_and_a_clock_set_back(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("2026-01-01 10:00:00,000 start epoch 1 of 3\n"
                   "2026-01-01 10:01:00,000 epoch 1: train/loss=1\n"
                   "2026-01-01 10:30:00,000 stopped: interrupted\n"  # the cut-short epoch 2
                   "2026-01-01 11:00:00,000 start epoch 2 of 3\n"
                   "2026-01-01 11:00:30,000 epoch 2: train/loss=1\n")
    assert logged_seconds(log) == 90.0
    # local time set back an hour (DST) within a session: that session counts 0, not minus
    log.write_text("2026-10-25 02:59:00,000 start epoch 1 of 2\n"
                   "2026-10-25 02:01:00,000 epoch 1: train/loss=1\n"
                   "2026-10-25 02:05:00,000 start epoch 2 of 2\n"
                   "2026-10-25 02:06:00,000 epoch 2: train/loss=1\n")
    assert logged_seconds(log) == 60.0


def test_the_chart_plot_is_the_first_finished_seed_s_and_none_of_diverged_ones(
        tmp_path, monkeypatch, tiny_charts_runs):
    from kdml.reproduce import runner
    from kdml.training.nonfinite import NonFiniteLoss

    charts = _tiny_experiments()[2]
    runs = copy_of(tiny_charts_runs, tmp_path / "runs")  # as reproduce at 2 seeds left them
    (result,) = reproduce([charts], 2, runs, "cpu", progress=False, echo=lambda line: None)
    cell = result.cells["MTriplet"]
    assert cell.charts == cell.run_dirs[0] / CHARTS_RECORD and cell.charts_seed == 0
    # drawn once when they trained, not per seed, nor for seed 1 when they are read again
    assert not (cell.run_dirs[1] / CHARTS_RECORD).exists()
    # every seed diverged: said so, not that a checkpoint is missing
    real_train = runner.train

    def diverges(config, run_dir, **kwargs):
        if config.method.n_charts == 3:
            run_dir.mkdir(parents=True)
            raise NonFiniteLoss("training stopped: the loss became NaN")
        return real_train(config, run_dir, **kwargs)

    monkeypatch.setattr(runner, "train", diverges)
    wild = dataclasses.replace(charts, key="tiny-wild", cells=(
        Cell("MTriplet", "mtriplet", ("method.n_charts=3",), plot_charts=True),))
    (result,) = reproduce([wild], 2, runs, "cpu", progress=False, echo=lambda line: None)
    assert result.cells["MTriplet"].charts is None
    assert result.cells["MTriplet"].charts_missing == ""
    context = ReportContext("kdml reproduce atlas", "a test machine", "torch", 0.1, 2, True)
    assert ("Charts of MTriplet (Sec. A.2) are not drawn here: every seed's run diverged"
            in write_report([result], tmp_path / "report.md", context).read_text())


def test_a_file_of_the_users_where_the_chart_plot_is_kept_is_not_shown(tmp_path,
                                                                       tiny_charts_runs):
    charts = _tiny_experiments()[2]
    runs = tmp_path / "runs"
    shutil.copytree(tiny_charts_runs, runs)  # the same run, trained once for the module
    first = reproduce([charts], 1, runs, "cpu", progress=False, echo=lambda line: None)
    (run_dir,) = first[0].cells["MTriplet"].run_dirs
    for checkpoint in run_dir.rglob("*.pt"):
        checkpoint.unlink()
    (run_dir / CHARTS_RECORD).write_bytes(b"\x89PNG not kdml's")
    cell = reproduce([charts], 1, runs, "cpu", progress=False,
                     echo=lambda line: None)[0].cells["MTriplet"]
    assert cell.charts is None and "no checkpoint to draw its charts" in cell.charts_missing


def test_a_protocol_file_s_boolean_is_not_a_number(tmp_path, tiny_jrd_runs):
    runs = tmp_path / "runs"
    shutil.copytree(tiny_jrd_runs, runs)  # the same runs, trained once for the module
    first = reproduce(_tiny_experiments()[:2], 1, runs, "cpu", progress=False,
                      echo=lambda line: None)
    run_dir = first[0].cells["alpha = 1"].run_dirs[0]
    parts = json.loads((run_dir / "parts.json").read_text())
    broken = {**parts, "metrics": {**parts["metrics"], "recall@1": {"mean": True, "ci95": 0.1}}}
    errors = _errors_after(run_dir / "parts.json", json.dumps(broken), runs)
    assert errors["tiny-parts"] == (f"{run_dir / 'parts.json'} is not as kdml wrote it (a "
                                    "metric without a numeric mean and ci95); delete it and run "
                                    "the same command again to recompute it")


def test_a_sweep_plot_joins_the_shared_start_to_every_line_at_the_seeds_mean(tmp_path,
                                                                             monkeypatch):
    from kdml.reproduce import plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    cells = (Cell("b", "jrd", x=2.0, series="s"), Cell("base", "jrd", x=0.0),
             Cell("a", "jrd", x=0.5, series="s"), Cell("c", "jrd", x=8.0, series="t"),
             Cell("gone", "jrd", x=4.0, series="t"))
    experiment = Experiment("sweep", "jrd", "Figure", "t", "digits", cells, ("recall@1",),
                            sweep="alpha")
    plots.plot_sweep(experiment, {"base": [0.4, 0.5], "a": [0.5, 0.7], "b": [0.6, 0.8],
                                  "c": [0.7, 0.9], "gone": [math.nan, math.nan]},
                     "recall@1", tmp_path / "sweep.png")
    axis = drawn[0].axes[0]
    lines = [(list(container.lines[0].get_xdata()), list(container.lines[0].get_ydata()))
             for container in axis.containers]
    assert lines == [([0.0, 0.5, 2.0], pytest.approx([0.45, 0.6, 0.7])),
                     ([0.0, 8.0], pytest.approx([0.45, 0.8]))]
    assert list(axis.get_xticks()) == [0.0, 0.5, 2.0, 8.0]  # none at 4: every seed diverged
    assert (axis.get_xlabel(), axis.get_ylabel()) == ("alpha", "R@1 (mean +- 95% CI over 2 seeds)")
    assert [text.get_text() for text in axis.get_legend().get_texts()] == ["s", "t"]


def test_a_paper_row_of_another_length_is_refused():
    from kdml.reproduce.catalog.common import paper_values

    with pytest.raises(ValueError):
        paper_values(("recall@1", "recall@2"), (0.5,))


def test_a_parts_row_keeps_each_part_s_mean_as_the_score_and_its_half_width_apart(
        tmp_path, monkeypatch):
    """The parts table's "95% half-width" is the parts' ci95, not their mean again."""
    from kdml.reproduce import runner

    monkeypatch.setattr(runner, "_parts", lambda experiment, run_dir: {
        "recall@1": {"mean": 0.5, "ci95": 0.02}})
    table2 = next(experiment for experiment in experiments("jrd")
                  if experiment.protocol == "parts")
    result = runner.CellResult()
    metrics = runner._run_metrics(table2, tmp_path, result)
    assert metrics["recall@1"] == 0.5 and result.part_ci95 == {"recall@1": [0.02]}
