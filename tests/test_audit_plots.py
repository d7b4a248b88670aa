"""Audit: the training plots (a refused plot, a term logged late, pyplot left alone) and the
pictures of an embedding (image layouts, checked positions, the gallery, the map's colours)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from kdml import viz
from kdml.errors import KdmlError
from kdml.viz_charts import chart_figure
from kdml.viz_retrieval import (
    _embedding_map_figure,
    _retrieval_grid_figure,
    embedding_map,
    plot_embedding_map,
    plot_retrieval_grid,
    short_name,
)

HISTORY = [{"epoch": 1, "train/loss": 1.0, "test/recall@1": 0.5},
           {"epoch": 2, "train/loss": 0.5, "train/mmd": 0.2, "test/recall@1": 0.7}]


def test_a_plot_in_the_way_leaves_the_others_drawn(tmp_path):
    """The docstring: a plot whose path holds a file kdml did not draw is skipped and the others
    still drawn; the error names it."""
    (tmp_path / "loss.png").write_bytes(b"mine")
    with pytest.raises(KdmlError, match="loss.png"):
        viz.plot_training(HISTORY, tmp_path)
    assert (tmp_path / "loss.png").read_bytes() == b"mine"
    assert (tmp_path / "recall.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_term_first_logged_later_is_missing_not_zero_before(tmp_path, monkeypatch):
    drawn = {}

    def keep(figure, path):
        drawn[path.name] = figure
        return path

    monkeypatch.setattr(viz, "save_figure", keep)
    viz.plot_training(HISTORY, tmp_path)
    lines = {line.get_label(): line for line in drawn["loss.png"].axes[0].get_lines()}
    mmd = list(lines["mmd"].get_ydata())
    assert math.isnan(mmd[0]) and mmd[1] == 0.2
    assert drawn["recall.png"].axes[0].get_ylim() == (0.0, 1.0)


def test_plots_leave_pyplot_and_the_backend_alone_and_training_imports_no_plotting(tmp_path):
    """kdml's plots had been pyplot figures, after ``matplotlib.use("Agg")`` at the import of
    kdml.viz: a notebook that imported kdml lost its backend. Nor do the modules of ``kdml
    train`` and ``kdml eval`` import matplotlib before the first plot (a second of every
    command's start-up, and of each torchrun rank's), nor scipy (scipy.special: 0.3 s),
    scikit-learn or kornia, which only some of their functions use."""
    code = f"""
import sys
import kdml.cli.train, kdml.training.trainer, kdml.evaluation.evaluator
print(sorted({{name.split(".")[0] for name in sys.modules}}
             & {{"matplotlib", "scipy", "sklearn", "kornia"}}))
import matplotlib
matplotlib.use("svg")  # a program's own backend
from kdml import viz
written = viz.plot_training({HISTORY!r}, __import__("pathlib").Path({str(tmp_path)!r}) / "plots")
print(sorted(path.name for path in written), matplotlib.get_backend(),
      "matplotlib.pyplot" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "[]\n['loss.png', 'recall.png'] svg False\n"


def _figure(image, queries=(0,), neighbours=((1,),), hits=((True,),)):
    return _retrieval_grid_figure(np.array(queries), np.array(neighbours), np.array(hits),
                                  (image, None), (image, None))


@pytest.mark.parametrize("shape", [(1, 6, 5), (6, 5), (6, 5, 1)])
def test_a_gray_sample_is_drawn_as_a_gray_picture(shape):
    """MNIST's [1, H, W] tensors, [H, W] and [H, W, 1]: one gray [H, W] picture."""
    figure = _figure(lambda position: torch.full(shape, 0.25))
    for axes in figure.axes:
        (picture,) = axes.images
        assert picture.get_array().shape == (6, 5)
        assert picture.get_cmap().name == "gray"


def test_a_sample_outside_0_1_is_clipped():
    figure = _figure(lambda position: np.full((3, 4, 4), 1.5 if position else -0.5))
    query, neighbour = (axes.images[0].get_array() for axes in figure.axes)
    assert query.shape == (4, 4, 3) and np.all(query == 0.0) and np.all(neighbour == 1.0)


def test_uint8_and_0_255_samples_are_drawn_in_their_range_not_white():
    """A user's npz of 0-255 images (kdml trains on such data as it comes) and uint8 arrays
    were clipped to [0, 1]: every non-black pixel drawn white. uint8 is read as 0-255, other
    floats beyond [0, 1] are scaled by their own range; a resize's overshoot is clipped."""
    ramp = np.arange(16, dtype=np.float32).reshape(1, 4, 4) * 17  # 0 to 255
    cases = {0: ramp, 1: ramp.astype(np.uint8), 2: ramp / 255 * 1.0005}
    figure = _figure(lambda position: cases[position], queries=(0, 2), neighbours=((1,), (1,)),
                     hits=((True,), (True,)))
    expected = (ramp[0] / 255).astype(np.float32)
    for axes in figure.axes:
        np.testing.assert_allclose(axes.images[0].get_array(), expected, atol=1e-3)


def test_chart_thumbnails_are_drawn_in_their_range_not_white():
    ramp = np.arange(16, dtype=np.float32).reshape(1, 4, 4) * 17
    codes, charts, labels = np.zeros((2, 2)), np.zeros(2, dtype=int), np.arange(2)
    for images in (np.stack([ramp, ramp]), torch.from_numpy(np.stack([ramp, ramp])).byte(),
                   lambda index: ramp):
        figure = chart_figure(codes, charts, labels, images=images)
        for picture in figure.axes[0].images:
            np.testing.assert_allclose(picture.get_array(), ramp[0] / 255, atol=1e-6)


@pytest.mark.parametrize(("queries", "neighbours", "message"), [
    (np.array([0.0]), np.array([[1]]), "queries must be a non-empty"),
    (np.array([0]), np.array([[1.5]]), r"neighbours must be \[Q, K\] integer positions"),
])
def test_positions_that_are_not_integers_are_refused(tmp_path, queries, neighbours, message):
    with pytest.raises(KdmlError, match=message):
        plot_retrieval_grid(queries, neighbours, np.array([[True]]),
                            lambda position: np.zeros((4, 4)), tmp_path / "grid.png")
    assert not (tmp_path / "grid.png").exists()


def test_plot_retrieval_grid_loads_the_neighbours_from_the_gallery(tmp_path):
    loaded = {"queries": [], "gallery": []}

    def loader(name):
        def image(position):
            loaded[name].append(position)
            return np.zeros((4, 4))
        return image

    plot_retrieval_grid(np.array([0]), np.array([[5, 7]]), np.array([[True, False]]),
                        loader("queries"), tmp_path / "grid.png",
                        gallery=(loader("gallery"), None))
    assert loaded == {"queries": [0], "gallery": [5, 7]}


def test_short_name_cuts_only_longer_names():
    assert short_name("abcd", 4) == "abcd"
    assert short_name("abcde", 4) == "abc…"


def test_the_embedding_map_of_two_dimensions_is_the_embedding_itself(monkeypatch):
    monkeypatch.setitem(sys.modules, "umap", None)  # t-SNE, whether or not umap is installed
    flat = np.arange(8, dtype=np.float32).reshape(4, 2)
    coordinates, method = embedding_map(flat)
    assert coordinates is flat and method == "the embedding itself (d = 2)"
    few = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)  # perplexity < 10
    coordinates, method = embedding_map(few)
    assert coordinates.shape == (10, 2) and method == "t-SNE"


@pytest.mark.parametrize("count", [12, 20])
def test_up_to_20_classes_get_a_legend_and_a_colour_each(count):
    labels = np.arange(count).repeat(2)
    coordinates = np.random.default_rng(0).normal(size=(len(labels), 2)).astype(np.float32)
    figure = _embedding_map_figure(coordinates, labels, "t-SNE", "map", None)
    (axes,) = figure.axes
    assert len(axes.get_legend().get_texts()) == count
    colours = {tuple(np.round(points.get_facecolor()[0], 6)) for points in axes.collections}
    assert len(colours) == count


@pytest.mark.parametrize("draw", ["grid", "map"])
def test_the_pictures_never_replace_a_file_kdml_did_not_draw(tmp_path, draw):
    """Called directly (not through ``kdml plot``, which checks the path first)."""
    path = tmp_path / "picture.png"
    path.write_bytes(b"mine")
    with pytest.raises(KdmlError, match="is in the way and kdml did not draw it"):
        if draw == "grid":
            plot_retrieval_grid(np.array([0]), np.array([[1]]), np.array([[True]]),
                                lambda position: np.zeros((4, 4)), path)
        else:
            plot_embedding_map(np.zeros((3, 2)), np.arange(3), path, "t-SNE", "map")
    assert path.read_bytes() == b"mine"


@pytest.mark.parametrize("shape", [(2, 5), (0, 5), (6,)])
def test_embedding_map_refuses_too_few_points_or_no_matrix_in_one_line(shape):
    """t-SNE's "perplexity must be less than n_samples" or an IndexError had been raised."""
    with pytest.raises(KdmlError, match=r"^embedding_map needs embeddings \[N, d\] with N >= 3"):
        embedding_map(np.zeros(shape))


@pytest.mark.parametrize("title", ["jrd on digits",
                                   "jrd on folder:/home/someone/photos/holiday-2026/all",
                                   "jrd on folder:/a-very-long-folder-name-without-any-spaces-at"
                                   "-all-in-it-whatsoever"])
def test_the_embedding_maps_title_fits_in_the_picture(title):
    """docs/inspecting.md: the map of a run scored by the cosine is of its L2-normalised
    embeddings, "and its title says so". On one line the title had run past both edges of the
    600-pixel figure, cutting off those words ("n digits (t-SNE, of the L2-normalised
    embeddings (cosine metric), 5 clas"); wrapped, all of it is in the picture."""
    from kdml.viz_retrieval import _embedding_map_figure

    coordinates = np.random.default_rng(0).normal(size=(50, 2))
    method = "t-SNE, of the L2-normalised embeddings (cosine metric)"
    figure = _embedding_map_figure(coordinates, np.arange(50) % 5 + 5, method, title, None)
    figure.canvas.draw()
    drawn = figure.axes[0].title
    extent = drawn.get_window_extent(figure.canvas.get_renderer())
    assert extent.x0 >= 0 and extent.x1 <= figure.bbox.width, (extent.x0, extent.x1)
    assert extent.y1 <= figure.bbox.height
    expected = f"{title} ({method}, 5 classes)"
    assert "".join(drawn.get_text().split()) == "".join(expected.split())


@pytest.mark.parametrize(("count", "said"), [(1, "1 class"), (2, "2 classes")])
def test_the_embedding_maps_title_counts_one_class_in_the_singular(count, said):
    """A map of one class's samples had been titled "(PCA, 1 classes)"."""
    from kdml.viz_retrieval import _embedding_map_figure

    coordinates = np.random.default_rng(0).normal(size=(12, 2))
    figure = _embedding_map_figure(coordinates, np.arange(12) % count, "PCA", "map", None)
    assert figure.axes[0].get_title() == f"map (PCA, {said})"
