"""``kdml analyze generalization`` (Chu et al. 2020, Eq. 2-3): the labelled fractions it refuses
and the notes on the distance its nearest-neighbour classifiers use."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kdml import cli
from kdml.errors import KdmlError
from kdml.evaluation.estimate import Estimate
from kdml.evaluation.generalization import (
    MIN_SCORED,
    check_scored_counts,
    distance_note,
    generalization_terms,
)
from kdml.inspection import analysis
from kdml.training import loading

# ----------------------------------------------------------------- too few scored samples


def chance_sets(seen_count: int = 2000, unseen_count: int = 300):
    """Two samples of one distribution: no classifier tells them apart (d_H 0.5)."""
    rng = np.random.default_rng(0)
    seen, unseen = rng.normal(size=(seen_count, 4)), rng.normal(size=(unseen_count, 4))
    return seen, np.arange(seen_count) % 5, unseen, np.arange(unseen_count) % 5 + 10


def test_a_fraction_that_leaves_too_few_samples_to_score_is_refused():
    """0.999 of 300 unseen samples left one to score: at chance d_H came out at 0.65 +- 0.13
    from one seen and one unseen sample per split (each split 0.5, 0.75 or 1.0), silently."""
    data = chance_sets()
    with pytest.raises(KdmlError) as refused:
        generalization_terms(*data, labelled_fraction=0.999, repeats=2)
    assert str(refused.value) == (
        "labelled_fraction 0.999 leaves the unseen set 299 fitted and 1 scored of its 300 "
        "samples; each set needs at least 5 scored: use a labelled_fraction of at most 0.983")
    with pytest.raises(KdmlError, match=r"^labelled_fraction 0\.99 leaves the unseen set 297 "
                                        r"fitted and 3 scored of its 300 samples;"):
        generalization_terms(*data, labelled_fraction=0.99, repeats=2)
    # the fraction named is taken, and scores 5 of the smaller set
    terms = generalization_terms(*data, labelled_fraction=0.983, repeats=2)
    assert 0.5 <= terms["h_divergence"].mean <= 1.0


def test_a_set_too_small_to_score_is_refused_whatever_the_fraction():
    seen, seen_y, unseen, unseen_y = chance_sets(40, MIN_SCORED)
    with pytest.raises(KdmlError, match=r"^the unseen set has 5 samples; the analysis needs at "
                                        r"least 6 in each set \(1 fitted, 5 scored\)$"):
        generalization_terms(seen, seen_y, unseen, unseen_y, labelled_fraction=0.01)
    # one more sample and a small fraction: 1 fitted, 5 scored
    seen, seen_y, unseen, unseen_y = chance_sets(40, MIN_SCORED + 1)
    assert len(generalization_terms(seen, seen_y, unseen, unseen_y, labelled_fraction=0.1,
                                    repeats=2)["lambda"].values) == 2


# 1112: 1 - 5/1112 rounded to 3 places (0.996, not floored to 0.995) scores 4 of 1,112
@pytest.mark.parametrize("smallest", [6, 7, 10, 11, 33, 150, 301, 999, 1112])
def test_the_fraction_named_scores_enough_of_every_set(smallest):
    for fraction in (0.9999, 0.99, 0.95):
        try:
            check_scored_counts(smallest * 7, smallest, fraction)
            continue
        except KdmlError as error:
            named = float(str(error).rsplit(" ", 1)[1])
        check_scored_counts(smallest * 7, smallest, named)  # accepted
        for count in (smallest, smallest * 7):
            assert count - min(max(round(named * count), 1), count - 1) >= MIN_SCORED


def test_few_fitted_samples_are_not_refused():
    """The other end keeps its behaviour: one fitted sample per set is a weak classifier, not
    a meaningless estimate; lambda's unseen classes are counted in ``unfitted``."""
    terms = generalization_terms(*chance_sets(), labelled_fraction=0.001, repeats=2)
    assert terms["unfitted"].mean > 0


# ----------------------------------------------------------------- the command line


class LabelledPart(list):
    """A stand-in for a dataset: its samples and their ``labels``."""

    labels: torch.Tensor


def fake_run(monkeypatch, tmp_path: Path, has_charts: bool, metric: str,
             sizes: tuple[int, int] = (2000, 300), unlabelled: int = 0) -> list[str]:
    """A loaded run of the given kind, whose analysis returns fixed terms; returns the
    command line that analyses it. Its test part has ``sizes[1]`` labelled samples and
    ``unlabelled`` more of label -1 (a domain pair's target)."""
    test = LabelledPart(range(sizes[1] + unlabelled))
    test.labels = torch.cat([torch.arange(sizes[1]) % 5 + 10, torch.full((unlabelled,), -1)])
    run = SimpleNamespace(
        method=SimpleNamespace(has_charts=has_charts),
        config=SimpleNamespace(eval=SimpleNamespace(metric=metric)),
        splits=SimpleNamespace(train=range(sizes[0]), test=test, validation=False,
                               test_parts=[test]))
    estimate = Estimate.of([0.5, 0.5])

    def analyze(trained, settings):
        assert trained is run
        return {name: estimate for name in ("h_divergence", "h_divergence_bd", "lambda",
                                            "err_seen", "err_unseen")} | {
            "unfitted": Estimate.of([0.0, 0.0])}, tmp_path / "generalization.json"

    monkeypatch.setattr(loading, "load_run",
                        lambda run_dir, data_root=None, progress=None, device=None: run)
    monkeypatch.setattr(analysis, "check_unseen_classes", lambda run_dir: None)  # no folder
    monkeypatch.setattr(analysis, "analyze_generalization", analyze)
    return ["analyze", "generalization", str(tmp_path), "--repeats", "2"]


@pytest.mark.parametrize(("has_charts", "metric"), [(True, "euclidean"), (False, "cosine")])
def test_the_distance_of_an_atlas_analysis_is_named(monkeypatch, tmp_path, capsys,
                                                    has_charts, metric):
    """An Atlas run is evaluated with the manifold distance on chart codes; the analysis's
    1-NN used Euclidean distance on its ``embed`` vectors, and said nothing. Methods without
    charts get no note."""
    assert cli.main(fake_run(monkeypatch, tmp_path, has_charts, metric)) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "the k-NN used" in line]
    assert len(notes) == int(has_charts)
    if has_charts:
        assert notes[0] == ("kdml: note: the k-NN used Euclidean distance on the Atlas "
                            "embedding [sigmoid chart coordinates, sqrt(d) x one-hot chart] (a "
                            "point's own chart ranks first), not the manifold distance on "
                            "pre-sigmoid chart coordinates that eval scores this run with")
        assert notes[0].removeprefix("kdml: note: ") == distance_note(True)
    else:
        assert distance_note(False) is None


def test_the_command_refuses_the_fraction_before_embedding(monkeypatch, tmp_path, capsys):
    command = fake_run(monkeypatch, tmp_path, False, "euclidean")

    def no_work(*args, **kwargs):
        raise AssertionError("the embedding started before the refusal")

    monkeypatch.setattr(analysis, "analyze_generalization", no_work)
    assert cli.main([*command, "--labelled-fraction", "0.999"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("kdml: error: --labelled-fraction 0.999 leaves the unseen set 299 fitted "
                   "and 1 scored of its 300 samples; each set needs at least 5 scored: use a "
                   "--labelled-fraction of at most 0.983")


@pytest.mark.parametrize(("labelled", "fraction", "expected"), [
    (4, "0.5", "the unseen set has 4 samples; the analysis needs at least 6 in each set "
               "(1 fitted, 5 scored)"),
    (10, "0.6", "--labelled-fraction 0.6 leaves the unseen set 6 fitted and 4 scored of its 10 "
                "samples; each set needs at least 5 scored: use a --labelled-fraction of at "
                "most 0.5")])
def test_the_command_counts_the_labelled_unseen_samples_before_embedding(
        monkeypatch, tmp_path, capsys, labelled, fraction, expected):
    """A domain pair's unlabelled target samples (-1), which the analysis leaves out, had been
    counted by the check before embedding: a few labelled among 100 unlabelled passed it, and
    were refused only once both sets were embedded (minutes on a large target)."""
    command = fake_run(monkeypatch, tmp_path, False, "euclidean", (2000, labelled),
                       unlabelled=100)

    def no_work(*args, **kwargs):
        raise AssertionError("the embedding started before the refusal")

    monkeypatch.setattr(analysis, "analyze_generalization", no_work)
    assert cli.main([*command, "--labelled-fraction", fraction]) == 2
    assert capsys.readouterr().err.strip() == f"kdml: error: {expected}"


@pytest.mark.slow
def test_an_atlas_run_is_analysed_with_the_note(tmp_path, capsys):
    out = tmp_path / "mtriplet"
    assert cli.main(["train", "mtriplet", "--dataset", "digits", "--out", str(out),
                     "train.epochs=1", "model.backbone=mlp", "eval.nmi=false", "--no-progress",
                     "method.n_charts=2"]) == 0
    capsys.readouterr()
    assert cli.main(["analyze", "generalization", str(out), "--repeats", "2"]) == 0
    assert "not the manifold distance" in capsys.readouterr().err
    written = json.loads((out / "generalization.json").read_text())
    assert written["settings"]["repeats"] == 2
    assert written["distance"] == "euclidean on the Atlas embedding"


@pytest.mark.parametrize(("has_charts", "metric", "distance"), [
    (False, "cosine", "cosine"), (False, "euclidean", "euclidean"),
    (True, "euclidean", "euclidean on the Atlas embedding"),
    # an Atlas run's eval.metric is not its ranking (the manifold distance): not normalised
    (True, "cosine", "euclidean on the Atlas embedding")])
def test_the_classifiers_rank_by_the_run_s_own_distance_where_it_has_a_euclidean_form(
        monkeypatch, tmp_path, has_charts, metric, distance):
    """A cosine run's embeddings (a SimCLR head's are not unit rows) had been classified by
    Euclidean distance, a ranking the run is not evaluated with: they are now scaled to unit
    rows, on which Euclidean distance ranks as cosine does. generalization.json says which."""
    rng = np.random.default_rng(0)
    raw = {"train": rng.normal(size=(40, 3)) * rng.uniform(0.1, 10, size=(40, 1)),
           "test": rng.normal(size=(30, 3)) * rng.uniform(0.1, 10, size=(30, 1))}
    labels = {"train": np.arange(40) % 4, "test": np.arange(30) % 3 + 10}

    def embed(method, part, embedder):
        return SimpleNamespace(tensor=lambda: torch.tensor(raw[part], dtype=torch.float32),
                               labels=torch.tensor(labels[part]))

    given = []

    def terms(seen, seen_labels, unseen, unseen_labels, **settings):
        given.append((seen, unseen, settings))
        return {"h_divergence": Estimate.of([0.5, 0.5])}

    monkeypatch.setattr(analysis, "embed_dataset", embed)
    monkeypatch.setattr(analysis, "dataset_labels", lambda splits, found: found)
    monkeypatch.setattr(analysis, "generalization_terms", terms)
    class Part(str):  # a part named as raw's keys, with its labels for the overlap check
        labels: torch.Tensor

    train, test = Part("train"), Part("test")
    train.labels, test.labels = torch.tensor(labels["train"]), torch.tensor(labels["test"])
    trained = SimpleNamespace(run=SimpleNamespace(root=tmp_path, output=lambda path: path),
                              epoch=1, embedder=None,
                              splits=SimpleNamespace(train=train, test=test, validation=False,
                                                     train_classes=[0, 1, 2, 3], test_parts=[test]),
                              method=SimpleNamespace(has_charts=has_charts),
                              config=SimpleNamespace(eval=SimpleNamespace(metric=metric)))
    analysis.analyze_generalization(trained, analysis.GeneralizationSettings(0.6, 2, 3, 7))
    (seen, unseen, settings), = given
    assert settings == {"labelled_fraction": 0.6, "repeats": 2, "neighbors": 3, "seed": 7}
    written = json.loads((tmp_path / "generalization.json").read_text())
    assert written["settings"] == {**settings, "epoch": 1}
    for found, part in ((seen, "train"), (unseen, "test")):
        expected = raw[part] / np.linalg.norm(raw[part], axis=1, keepdims=True) \
            if distance == "cosine" else raw[part]
        np.testing.assert_allclose(found, expected, rtol=1e-6)
    assert json.loads((tmp_path / "generalization.json").read_text())["distance"] == distance


def test_the_command_refuses_too_many_neighbors_before_embedding(monkeypatch, tmp_path, capsys):
    """--neighbors beyond the fitted samples had been refused only after both sets were
    embedded (minutes on SOP)."""
    command = fake_run(monkeypatch, tmp_path, False, "euclidean")

    def no_work(*args, **kwargs):
        raise AssertionError("the embedding started before the refusal")

    monkeypatch.setattr(analysis, "analyze_generalization", no_work)
    assert cli.main([*command, "--neighbors", "100000"]) == 2
    assert capsys.readouterr().err.strip() == (
        "kdml: error: --neighbors (100000) is more than the 1,150 samples the classifiers are "
        "fitted on; use fewer")
