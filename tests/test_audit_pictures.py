"""Audit (mutation): what the pictures and the analysis numbers show, each checked against an
independent computation: the colours and names of the legends, where thumbnails sit, which
neighbours and marks a retrieval grid gets, the collapse and generalization numbers."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from scipy.special import expit

from kdml.errors import KdmlError
from kdml.evaluation.generalization import generalization_terms
from kdml.viz_charts import chart_figure
from kdml.viz_retrieval import (
    HIT,
    MISS,
    _embedding_map_figure,
    _retrieval_grid_figure,
    counted_points,
)


def test_the_chart_legend_gives_each_class_its_points_colour_for_labels_not_from_0():
    """The digits test classes are 5 to 9: a legend coloured by the label's number, not its
    place among the classes, would name each colour's points after another class."""
    rng = np.random.default_rng(2)
    codes, charts = rng.standard_normal((40, 2)), np.arange(40) % 2
    labels = 5 + np.arange(40) % 5
    figure = chart_figure(codes, charts, labels)
    figure.canvas.draw()
    (legend,) = [axes.get_legend() for axes in figure.axes if axes.get_legend() is not None]
    names = [text.get_text() for text in legend.get_texts()]
    assert names == ["5", "6", "7", "8", "9"]
    for handle, name in zip(legend.legend_handles, names, strict=True):
        for axes in figure.axes:
            chart = int(axes.get_title().split()[1])
            drawn = axes.collections[0].get_facecolors()[labels[charts == chart] == int(name)]
            assert len(drawn) and np.allclose(drawn, matplotlib.colors.to_rgba(handle.get_color()))


def test_a_thumbnail_is_centred_on_its_own_point():
    """Each thumbnail at its point's chart coordinates (x, y) = sigmoid(code)."""
    codes = np.array([[-2.0, 1.0], [0.5, -1.5], [1.5, 2.0]])
    images = np.stack([np.full((4, 4), value) for value in (0.1, 0.5, 0.9)])
    figure = chart_figure(codes, np.zeros(3, dtype=int), np.arange(3), images=images)
    (axes,) = figure.axes
    centres = {}
    for picture in axes.images:
        left, right, bottom, top = picture.get_extent()
        centres[round(float(picture.get_array().mean()), 3)] = ((left + right) / 2,
                                                               (bottom + top) / 2)
    for code, image in zip(codes, images, strict=True):
        assert np.allclose(centres[round(float(image.mean()), 3)], expit(code))


def test_the_map_legend_names_each_class_s_own_points():
    """Each legend entry is the scatter of its class's points, named by ``class_names``."""
    rng = np.random.default_rng(3)
    labels = 5 + np.arange(30) % 3
    coordinates = rng.normal(size=(30, 2)).astype(np.float32)
    names = {5: "five", 6: "six", 7: "seven"}
    figure = _embedding_map_figure(coordinates, labels, "PCA", "map", names)
    (axes,) = figure.axes
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["five", "six", "seven"]
    for points in axes.collections:
        label = {name: number for number, name in names.items()}[points.get_label()]
        assert np.allclose(points.get_offsets(), coordinates[labels == label])


def test_unlabelled_points_are_grey_and_no_class_of_the_legend():
    labels = np.array([-1, -1, 5, 5, 6, 6])
    coordinates = np.arange(12, dtype=np.float32).reshape(6, 2)
    figure = _embedding_map_figure(coordinates, labels, "PCA", "map", None)
    (axes,) = figure.axes
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["unlabelled", "5",
                                                                           "6"]
    assert axes.get_title() == "map (PCA, 2 classes)"


@pytest.mark.parametrize(("labels", "sample_of", "said"), [
    (np.array([-1, 5, 6]), None, "2 classes"),
    (np.array([5, 6, 6]), (3, 2), "2 classes"),  # all the points: no sample
    (np.array([5, 6, 6]), (896, 5), "a random 3 of 896 points, 2 of 5 classes"),
    (np.array([5, 6, 7]), (896, 3), "a random 3 of 896 points, 3 classes"),
    (np.array([5, 5, 5]), (10, 1), "a random 3 of 10 points, 1 class"),
])
def test_the_map_title_counts_what_it_draws(labels, sample_of, said):
    assert counted_points(labels, sample_of) == said


def test_seen_and_unseen_sets_sharing_a_single_class_are_refused():
    rng = np.random.default_rng(4)
    seen, unseen = rng.normal(size=(12, 3)), rng.normal(size=(12, 3))
    seen_labels, unseen_labels = np.arange(12) % 3, 2 + np.arange(12) % 3  # class 2 in both
    with pytest.raises(KdmlError, match="seen and unseen classes overlap"):
        generalization_terms(seen, seen_labels, unseen, unseen_labels)


def test_a_grid_frames_hits_green_misses_red_and_the_query_black():
    """Each neighbour's frame says whether it has the query's class, in its own column."""
    figure = _retrieval_grid_figure(np.array([0, 1]), np.array([[2, 3, 4], [5, 6, 7]]),
                                    np.array([[True, False, True], [False, False, True]]),
                                    (lambda position: np.zeros((4, 4)), str),
                                    (lambda position: np.zeros((4, 4)), str))
    expected = [["black", HIT, MISS, HIT], ["black", MISS, MISS, HIT]]
    drawn = [[matplotlib.colors.to_hex(axes.spines["left"].get_edgecolor())
              for axes in figure.axes[row * 4:(row + 1) * 4]] for row in range(2)]
    assert drawn == [[matplotlib.colors.to_hex(colour) for colour in row] for row in expected]
    captions = [axes.get_title() for axes in figure.axes]
    assert captions == ["query: 0", "1: 2", "2: 3", "3: 4", "query: 1", "1: 5", "2: 6", "3: 7"]


def test_each_sample_gets_its_class_name_only_where_every_class_has_one():
    """embed's and index's ``class_names``: each sample's own class's name, or none at all."""
    from types import SimpleNamespace

    from kdml.inspection.parts import _class_names_of

    def dataset(names):
        return SimpleNamespace(class_names=names, class_name=names.get)

    labels = np.array([7, 5, 6, 5, 7])
    named = _class_names_of(dataset({5: "five", 6: "six", 7: "seven"}), labels)
    assert named is not None
    assert named.tolist() == ["seven", "five", "six", "five", "seven"]
    assert _class_names_of(dataset({5: "five", 6: "six"}), labels) is None


def test_an_estimate_is_the_mean_and_the_student_t_half_width():
    """Written out: the 95% half-width of 4 values is t(0.975, 3) * s / sqrt(4), s with n - 1."""
    from kdml.evaluation.estimate import Estimate

    values = [0.25, 0.5, 0.75, 1.5]
    mean = sum(values) / 4
    s = (sum((value - mean) ** 2 for value in values) / 3) ** 0.5
    found = Estimate.of(values)
    assert found.mean == pytest.approx(0.75)
    assert found.ci95 == pytest.approx(3.182446305284263 * s / 2)  # scipy.stats.t.ppf(0.975, 3)
    assert found.values == tuple(values)


def test_test_parts_hold_every_class_twice_and_are_dealt_by_the_seed():
    from kdml.evaluation.parts import retrieval_over_parts, stratified_parts
    from kdml.evaluation.retrieval import retrieval_metrics

    labels = np.repeat([3, 8, 9], [8, 6, 7])
    parts = [stratified_parts(labels, 3, seed) for seed in (0, 1)]
    for dealt in parts:
        assert sorted(np.concatenate(dealt).tolist()) == list(range(len(labels)))
        for part in dealt:
            assert all((labels[part] == label).sum() >= 2 for label in (3, 8, 9))
    assert any(not np.array_equal(a, b) for a, b in zip(*parts, strict=True))
    with pytest.raises(KdmlError, match="fewer than 8 samples"):  # class 8's 6 for 4 parts
        stratified_parts(labels, 4)
    vectors = np.random.default_rng(5).normal(size=(len(labels), 4)).astype(np.float32)
    found = retrieval_over_parts(vectors, labels, ks=(1,), num_parts=3)
    literal = [retrieval_metrics(vectors[part], labels[part], ks=(1,), nmi=False)["recall@1"]
               for part in parts[0]]
    assert found["recall@1"].values == pytest.approx(literal)


@pytest.mark.parametrize("max_points", [10, 39, 40])
def test_a_sampled_map_counts_the_whole_part_s_classes_without_the_unlabelled(tmp_path,
                                                                              monkeypatch,
                                                                              max_points):
    """``plot embedding --max-points`` below the part's size: the title's "of N classes" counts
    the whole part's classes, a domain pair's unlabelled samples (-1) no class of them, and
    the points drawn keep their own labels."""
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from kdml.inspection import plots

    labels = np.r_[np.full(20, -1), np.repeat([5, 6, 7, 8], 5)]
    values = np.random.default_rng(6).normal(size=(40, 3)).astype(np.float32)
    embedded = SimpleNamespace(values=torch.from_numpy(values),
                               tensor=lambda: torch.from_numpy(values),
                               labels=torch.from_numpy(labels))
    part = SimpleNamespace(dataset=SimpleNamespace(class_names=None), embedder=None,
                           is_validation=False)
    trained = SimpleNamespace(
        plot_path=lambda name: tmp_path / f"{name}.png", checkpoint=Path("last.pt"), method=None,
        run=SimpleNamespace(best_checkpoint=Path("best.pt"), output=lambda path: path), epoch=1,
        config=SimpleNamespace(eval=SimpleNamespace(metric="euclidean"), recipe="pca",
                               data=SimpleNamespace(dataset="npz:pair.npz")))
    drawn = {}
    monkeypatch.setattr(plots, "run_part", lambda trained: part)
    monkeypatch.setattr(plots, "embed_dataset", lambda method, dataset, embedder: embedded)
    monkeypatch.setattr(plots, "embedding_map", lambda points, seed=0: (points[:, :2], "PCA"))
    monkeypatch.setattr(plots, "plot_embedding_map",
                        lambda coordinates, labels, path, method, title, names, sample_of:
                        drawn.update(coordinates=coordinates, labels=labels,
                                     sample_of=sample_of) or path)
    plots.plot_embedding(trained, max_points=max_points, seed=3)
    keep = (np.random.default_rng(3).choice(40, max_points, replace=False)
            if max_points < 40 else np.arange(40))  # all 40: no sample, in their order
    assert drawn["sample_of"] == (40, 4)
    assert drawn["labels"].tolist() == labels[keep].tolist()
    assert np.array_equal(drawn["coordinates"], values[keep][:, :2])


def test_normalised_pixels_are_drawn_scaled_by_their_own_minimum_and_maximum():
    """Inputs normalised to [-1, 1] (a user's npz): drawn as (x - min) / (max - min)."""
    from kdml.viz_retrieval import unit_pixels

    image = np.linspace(-1.0, 3.0, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(unit_pixels(image), (image + 1.0) / 4.0, atol=1e-7)


def test_a_cosine_run_whose_embeddings_share_one_direction_is_not_drawn():
    """Rows of one direction at many lengths have collapsed for the cosine, which the run is
    scored by, though not as points: the pictures refuse them as its metrics would."""
    from types import SimpleNamespace

    import torch

    from kdml.inspection.plots import refuse_collapsed

    lengths = torch.linspace(0.5, 4.0, 12)[:, None]
    embeddings = lengths * torch.tensor([[0.6, 0.8, 0.0]])
    embedded = SimpleNamespace(values=embeddings, tensor=lambda: embeddings)
    for metric, refused in (("cosine", True), ("euclidean", False)):
        trained = SimpleNamespace(config=SimpleNamespace(eval=SimpleNamespace(metric=metric)))
        if refused:
            with pytest.raises(KdmlError, match="100.0% of them lie at one point"):
                refuse_collapsed(embedded, trained, "a map")
        else:
            refuse_collapsed(embedded, trained, "a map")


def test_a_chart_trained_on_one_class_predicts_that_class_not_the_overall_majority():
    """Chart 0's training points are all of class 7, while class 1 is the most frequent
    of the whole training set: chart 0's test points are classified as 7 (the single-class
    rule), and only a chart with no training points falls back on the majority 1."""
    from kdml.evaluation.charts import piecewise_linear_accuracy

    rng = np.random.default_rng(0)
    train_charts = np.array([0] * 3 + [1] * 9)
    train_labels = np.array([7] * 3 + [1] * 6 + [2] * 3)
    test_charts = np.array([0, 0, 2, 2])
    test_labels = np.array([7, 7, 1, 7])
    result = piecewise_linear_accuracy(rng.standard_normal((12, 2)), train_charts, train_labels,
                                       rng.standard_normal((4, 2)), test_charts, test_labels)
    by_chart = {entry["chart"]: entry for entry in result["charts"]}
    assert (by_chart[0]["classifier"], by_chart[0]["num_correct"]) == ("single-class", 2)
    assert (by_chart[2]["classifier"], by_chart[2]["num_correct"]) == ("majority", 1)
    assert (by_chart[1]["classifier"], by_chart[1]["num_test"]) == ("none", 0)
    assert result["num_correct"] == 3 and result["accuracy"] == 3 / 4


def test_the_analysis_counts_class_0_as_labelled_and_only_minus_1_as_unlabelled():
    """A domain pair's unlabelled target samples are -1; class 0 is a class like any other."""
    from types import SimpleNamespace

    import torch

    from kdml.inspection.analysis import labelled_count

    parts = [SimpleNamespace(labels=torch.tensor([0, 0, 1, -1])),
             SimpleNamespace(labels=torch.tensor([-1, 2, 0]))]
    assert labelled_count(parts) == sum(int(label) >= 0 for part in parts for label in part.labels)
    assert labelled_count(parts) == 5


def test_an_npz_that_appears_after_the_check_is_still_not_replaced(tmp_path, monkeypatch):
    """write_npz checks --out before the work and again as it writes: a file another process
    puts there meanwhile is kept, not replaced."""
    import kdml.inspection.parts as parts

    path = tmp_path / "e.npz"
    monkeypatch.setattr(parts, "check_npz_out", lambda _: None)  # the check ran before it came
    path.write_bytes(b"the user's")
    with pytest.raises(FileExistsError, match="a file appeared there while kdml wrote"):
        parts.write_npz(path, {"embeddings": np.zeros((2, 3), dtype=np.float32)})
    assert path.read_bytes() == b"the user's"
    assert [p.name for p in tmp_path.iterdir()] == ["e.npz"]
