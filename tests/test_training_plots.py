"""The plots a run writes: loss.png and recall.png, and when the trainer redraws them."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from kdml import viz
from kdml.errors import KdmlError
from kdml.viz_charts import plot_charts
from kdml.viz_retrieval import plot_embedding_map, plot_retrieval_grid


@pytest.mark.parametrize(("prefix", "title"), [("test", "Test retrieval"),
                                               ("val", "Validation retrieval")])
def test_training_plots_name_the_scored_part_and_count_whole_epochs(prefix, title, tmp_path,
                                                                    monkeypatch):
    drawn = {}

    def keep(figure, path):  # instead of writing it
        drawn[path.name] = figure
        return path

    monkeypatch.setattr(viz, "save_figure", keep)
    history = [{"epoch": 1, "train/loss": 1.0, f"{prefix}/recall@1": 0.5, f"{prefix}/map@r": 0.1},
               {"epoch": 2, "train/loss": 0.8},
               {"epoch": 3, "train/loss": 0.7, f"{prefix}/recall@1": 0.6, f"{prefix}/map@r": 0.2}]
    written = viz.plot_training(history, tmp_path)
    assert [path.name for path in written] == ["loss.png", "recall.png"]
    (axes,) = drawn["recall.png"].axes
    assert axes.get_title() == title
    assert [line.get_label() for line in axes.get_lines()] == ["recall@1", "map@r"]
    assert list(axes.get_lines()[0].get_xdata()) == [1, 3]  # only the evaluated epochs
    for figure in drawn.values():
        ticks = figure.axes[0].get_xticks()
        assert np.array_equal(ticks, np.round(ticks))


def _drawn(history, tmp_path, monkeypatch):
    drawn = {}

    def keep(figure, path):  # instead of writing it
        drawn[path.name] = figure
        return path

    monkeypatch.setattr(viz, "save_figure", keep)
    viz.plot_training(history, tmp_path)
    return drawn


def test_a_run_stopped_after_an_unscored_epoch_still_draws_its_scores(tmp_path, monkeypatch):
    """The scores' names came from the last row alone: with train.eval_every=2, a run
    stopped after epoch 3 drew no recall.png though epoch 2 was scored."""
    history = [{"epoch": 1, "train/loss": 1.0}, {"epoch": 2, "train/loss": 0.8,
                                                 "val/recall@1": 0.5},
               {"epoch": 3, "train/loss": 0.7}]
    drawn = _drawn(history, tmp_path, monkeypatch)
    assert sorted(drawn) == ["loss.png", "recall.png"]
    (axes,) = drawn["recall.png"].axes
    assert axes.get_title() == "Validation retrieval"
    assert list(axes.get_lines()[0].get_xdata()) == [2]


def test_a_domain_pairs_source_nn_accuracy_is_drawn_with_its_retrieval(tmp_path, monkeypatch):
    """A DTML run's recall.png had left out source_nn_accuracy, the score its paper and
    `kdml reproduce dtml`'s claims judge the transfer by; other test scores stay out."""
    history = [{"epoch": epoch, "train/loss": 1.0, "test/recall@1": 0.5, "test/map@r": 0.1,
                "test/source_nn_accuracy": epoch / 4, "test/r_precision": 0.2}
               for epoch in (1, 2)]
    drawn = _drawn(history, tmp_path, monkeypatch)
    (axes,) = drawn["recall.png"].axes
    assert [line.get_label() for line in axes.get_lines()] == ["recall@1", "map@r",
                                                               "source_nn_accuracy"]
    assert list(axes.get_lines()[2].get_ydata()) == [0.25, 0.5]


def test_logged_terms_that_are_not_losses_are_drawn_apart(tmp_path, monkeypatch):
    """Atlas's q_max, active_triplets and infinite_positives (a count of hundreds) had been
    drawn as loss terms, on the loss axis."""
    history = [{"epoch": epoch, "train/loss": 1.0 / epoch, "train/mmd": 0.1, "train/q_max": 0.6,
                "train/active_triplets": 0.3, "train/infinite_positives": 200.0}
               for epoch in (1, 2)]
    drawn = _drawn(history, tmp_path, monkeypatch)
    assert sorted(drawn) == ["diagnostics.png", "loss.png"]
    labels = {name: [line.get_label() for line in figure.axes[0].get_lines()]
              for name, figure in drawn.items()}
    assert labels == {"loss.png": ["loss", "mmd"],
                      "diagnostics.png": ["q_max", "active_triplets", "infinite_positives"]}
    assert drawn["diagnostics.png"].axes[0].get_title() == "Training diagnostics"


def test_a_laid_out_plot_is_drawn_once_into_its_file(tmp_path, monkeypatch):
    """tight_layout() leaves the figure an engine that lays nothing out, for which savefig drew
    the whole figure once more before drawing it into the file: write_png draws it once, into
    the same pixels."""
    from matplotlib.figure import Figure
    from PIL import Image

    from kdml.figure_file import write_png

    def laid_out():
        figure, axes = viz.figure_and_axes()
        axes.plot([1, 2], [1.0, 0.5], marker="o", label="loss")
        axes.set(xlabel="epoch", ylabel="training loss (epoch mean)", title="Training loss")
        axes.legend()
        figure.tight_layout()
        return figure

    laid_out().savefig(tmp_path / "savefig.png", dpi=100)
    draws = []
    draw = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: draws.append(draw(self, renderer)))
    write_png(laid_out(), tmp_path / "kdml.png")
    assert len(draws) == 1
    with Image.open(tmp_path / "savefig.png") as expected, Image.open(tmp_path / "kdml.png") as got:
        assert np.array_equal(np.asarray(got), np.asarray(expected))


def test_a_plot_is_marked_as_kdmls_and_never_replaces_a_picture_it_did_not_draw(tmp_path):
    from PIL import Image

    from kdml import __version__
    from kdml.errors import KdmlError
    from kdml.figure_file import write_png

    history = [{"epoch": 1, "train/loss": 1.0}]
    (tmp_path / "loss.tmp.png").write_text("mine")  # where the partial file used to go
    (loss,) = viz.plot_training(history, tmp_path)
    assert (tmp_path / "loss.tmp.png").read_text() == "mine"
    (tmp_path / "loss.tmp.png").unlink()
    with Image.open(loss) as image:
        assert image.text["Software"] == f"kdml {__version__}"
    umask = os.umask(0)
    os.umask(umask)
    assert loss.stat().st_mode & 0o777 == 0o666 & ~umask  # readable as any file the user saves
    assert viz.plot_training(history, tmp_path) == [loss]  # its own plot is redrawn
    mine = tmp_path / "mine.png"
    Image.new("RGB", (3, 3)).save(mine)  # Pillow marks no "Software"
    for picture in (mine.read_bytes(), b"not a png"):
        loss.write_bytes(picture)
        with pytest.raises(KdmlError, match="is in the way and kdml did not draw it"):
            viz.plot_training(history, tmp_path)
        assert loss.read_bytes() == picture
        assert sorted(path.name for path in tmp_path.iterdir()) == ["loss.png", "mine.png"]
    figure, _ = viz.figure_and_axes()
    figure.savefig(loss, dpi=10)  # matplotlib's own mark: a plot of kdml before it marked its own
    assert write_png(viz.figure_and_axes()[0], loss) == loss
    with Image.open(loss) as image:
        assert image.text["Software"] == f"kdml {__version__}"


def _png_header_of(width: int, height: int) -> bytes:
    """A PNG of a header alone (no pixels): what Pillow's size guard reads."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                               0, 0, 0)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("side", [10_000, 20_000], ids=["warned", "refused"])
def test_a_huge_picture_where_a_plot_goes_is_the_users(tmp_path, side, recwarn):
    """Pillow refuses to open a PNG whose header says over 179 megapixels (its decompression
    bomb guard) and warns above 89: the first had stopped training after its checkpoint with
    a DecompressionBombError traceback, the second printed Pillow's warning."""
    history = [{"epoch": 1, "train/loss": 1.0}]
    picture = _png_header_of(side, side)
    (tmp_path / "loss.png").write_bytes(picture)
    with pytest.raises(KdmlError, match="loss.png is in the way and kdml did not draw it"):
        viz.plot_training(history, tmp_path)
    assert (tmp_path / "loss.png").read_bytes() == picture
    assert not [warning for warning in recwarn if "pixels" in str(warning.message)]


def test_a_copied_plot_follows_the_same_rules(tmp_path):
    from kdml.errors import KdmlError
    from kdml.figure_file import copy_png

    (drawn,) = viz.plot_training([{"epoch": 1, "train/loss": 1.0}], tmp_path / "run")
    copied = copy_png(drawn, tmp_path / "report" / "charts.png")
    assert copied.read_bytes() == drawn.read_bytes()
    assert copy_png(drawn, copied) == copied  # its own copy is replaced
    (tmp_path / "report" / "mine.png").write_text("my notes")
    with pytest.raises(KdmlError, match="kdml did not draw it"):
        copy_png(drawn, tmp_path / "report" / "mine.png")
    assert (tmp_path / "report" / "mine.png").read_text() == "my notes"
    assert sorted(path.name for path in (tmp_path / "report").iterdir()) == ["charts.png",
                                                                               "mine.png"]


@pytest.mark.parametrize("name", ["map.pdf", "map.svg", "map"])
def test_a_plot_path_that_does_not_end_in_png_is_refused(tmp_path, name):
    """Plots are always PNG bytes: a .pdf path used to get a PNG under that name (and an
    existing PDF there was refused as a file kdml did not draw)."""
    from kdml.viz_retrieval import plot_embedding_map

    path = tmp_path / name
    with pytest.raises(KdmlError, match=rf"^{re.escape(str(path))}: kdml draws its plots as PNG "
                                        r"files; give a path ending in \.png$"):
        plot_embedding_map(np.zeros((4, 2)), np.arange(4), path, "t-SNE", "map")
    assert not path.exists() and list(tmp_path.iterdir()) == []
    assert plot_embedding_map(np.zeros((4, 2)), np.arange(4), tmp_path / "map.PNG", "t-SNE",
                              "map").is_file()


def _drawn_epochs(monkeypatch) -> list[list[int]]:
    """The epochs of each history the trainer draws, from here on."""
    drawn: list[list[int]] = []
    real = viz.plot_training

    def record(history, folder):
        drawn.append([row["epoch"] for row in history])
        return real(history, folder)

    monkeypatch.setattr(viz, "plot_training", record)
    return drawn


# the small MLP: what is checked is when the plots are drawn, not what trains (digits' CNN
# embedded the test digits for a third of each epoch's time)
TINY_PLOTTED = ["--dataset", "digits", "--no-progress", "train.epochs=3",
                "train.steps_per_epoch=2", "data.batch_size=20", "model.embedding_size=8",
                "model.backbone=mlp", "eval.nmi=false", "train.device=cpu"]


@pytest.mark.parametrize(("every", "expected"), [(0.0, [[1], [1, 2], [1, 2, 3]]),
                                                 (3600.0, [[1, 2, 3]])])
def test_plots_are_redrawn_at_most_every_so_often_and_at_the_end(every, expected, tmp_path,
                                                                 monkeypatch):
    from kdml import cli
    from kdml.training import recorder

    monkeypatch.setattr(recorder, "PLOT_EVERY_S", every)
    drawn = _drawn_epochs(monkeypatch)
    assert cli.main(["train", "amsoftmax", *TINY_PLOTTED, "--out", str(tmp_path / "run")]) == 0
    assert drawn == expected
    assert sorted(path.name for path in (tmp_path / "run" / "plots").iterdir()) == [
        "loss.png", "recall.png"]


def test_a_run_stopped_between_redraws_draws_the_epochs_it_finished(tmp_path, monkeypatch):
    """Ctrl-C (or an error) in epoch 3, after epoch 2's metrics: the plots show epochs 1, 2."""
    from kdml import cli
    from kdml.training import recorder

    monkeypatch.setattr(recorder, "PLOT_EVERY_S", 3600.0)
    drawn = _drawn_epochs(monkeypatch)
    real_save = recorder.save_checkpoint

    def save_then_stop(state, path):
        real_save(state, path)
        if path.name == "unscored.pt" and state["epoch"] == 3:  # trained, before scoring
            raise KeyboardInterrupt

    monkeypatch.setattr(recorder, "save_checkpoint", save_then_stop)
    assert cli.main(["train", "amsoftmax", *TINY_PLOTTED, "--out", str(tmp_path / "run")]) == 130
    assert drawn == [[1, 2]]


def _blank(position: int) -> np.ndarray:
    return np.zeros((1, 4, 4))


@pytest.mark.parametrize(("draw", "message"), [
    # NaN coordinates had drawn an empty picture; the others had stopped in IndexError,
    # ValueError or matplotlib's TypeError
    (lambda path: plot_embedding_map(
        np.full((4, 2), np.nan), np.arange(4), path, "t-SNE", "map"),
     "coordinates contains NaN or infinite values"),
    (lambda path: plot_embedding_map(
        np.zeros((4, 3)), np.arange(4), path, "t-SNE", "map"),
     r"coordinates must be \[N, 2\], got \(4, 3\)"),
    (lambda path: plot_embedding_map(
        np.zeros((4, 2)), np.arange(3), path, "t-SNE", "map"),
     r"labels must have shape \(4,\)"),
    (lambda path: plot_retrieval_grid(
        np.array([0, 1]), np.array([[1, 2], [0, 2]]), np.array([[True]]), _blank, path),
     r"hits must have the neighbours' shape \(2, 2\), got \(1, 1\)"),
    (lambda path: plot_retrieval_grid(
        np.array([0, 1, 2]), np.array([[1, 2], [0, 2]]), np.ones((2, 2), bool), _blank, path),
     r"neighbours must be \[Q, K\] integer positions with Q = 3, got shape \(2, 2\)"),
    (lambda path: plot_retrieval_grid(
        np.zeros(0, int), np.zeros((0, 2), int), np.zeros((0, 2), bool), _blank, path),
     r"queries must be a non-empty \[Q\] array"),
    (lambda path: plot_retrieval_grid(
        np.array([0]), np.array([[1]]), np.array([[True]]), lambda i: np.zeros((2, 4, 4)), path),
     r"cannot draw a sample of shape \(2, 4, 4\) as an image"),
    (lambda path: plot_charts(
        np.zeros((4, 2)), np.zeros(4, int), np.arange(4), path, images=np.zeros((4, 4, 5, 5))),
     r"images must be .* 1 or 3 channels, got shape \(4, 4, 5, 5\)"),
    (lambda path: plot_charts(
        np.zeros((4, 2)), np.zeros(4, int), np.arange(4), path, images=np.zeros((4, 1, 5, 5)),
        max_thumbnails=-1), "max_thumbnails must be an integer >= 0, got -1"),
    (lambda path: plot_charts(
        np.zeros((4, 2)), np.zeros(4, int), np.arange(4), path, images=np.zeros((4, 1, 5, 5)),
        thumbnail_zoom=float("nan")), "thumbnail_zoom must be a finite number > 0, got nan"),
])
def test_the_plotting_functions_refuse_bad_arrays_in_one_line(tmp_path, draw, message):
    with pytest.raises(KdmlError, match=f"^{message}") as info:
        draw(tmp_path / "plot.png")
    assert "\n" not in str(info.value) and not (tmp_path / "plot.png").exists()


def test_a_map_of_many_classes_colours_them_by_rank_not_by_label_value():
    """Over 20 classes the map has no legend and colours by class rank: one far-off label
    (10,000 beside 0..19) must not squeeze the other twenty classes into one colour, as
    colouring by the raw label values would."""
    from kdml.viz_retrieval import _embedding_map_figure

    labels = np.append(np.arange(20), 10_000).repeat(2)
    coordinates = np.random.default_rng(0).normal(size=(len(labels), 2)).astype(np.float32)
    figure = _embedding_map_figure(coordinates, labels, "t-SNE", "map", None)
    figure.canvas.draw()  # the colours are mapped when drawn
    (points,) = figure.axes[0].collections
    colours = {tuple(np.round(colour, 6)) for colour in points.get_facecolors()}
    assert len(colours) == 20  # tab20's twenty colours, the 21st class wrapping round


@pytest.mark.parametrize("history", [
    [{"epoch": 1, "train/loss": 1.0, "test/recall@1": 0.5}],  # a one-epoch run (pca, --quick)
    [{"epoch": 1, "train/loss": 1.0}, {"epoch": 2, "train/loss": 0.5},
     {"epoch": 3, "train/loss": 0.4, "test/recall@1": 0.5}],  # scored once (eval_every)
])
def test_a_single_epoch_is_drawn_on_whole_epoch_ticks(history, tmp_path, monkeypatch):
    """A plot of one epoch (a one-epoch run's, or the scores of a run scored once) had its
    axis ticked 0.945, 0.960, ..., 1.050: matplotlib pads a lone point by 5%, and no whole
    epoch fell in that range."""
    drawn = _drawn(history, tmp_path, monkeypatch)
    assert sorted(drawn) == ["loss.png", "recall.png"]
    for figure in drawn.values():
        (axes,) = figure.axes
        low, high = axes.get_xlim()
        ticks = [tick for tick in axes.get_xticks() if low <= tick <= high]
        assert ticks and np.array_equal(ticks, np.round(ticks)), ticks
        for line in axes.get_lines():
            assert all(tick in ticks for tick in line.get_xdata())


def test_a_finished_run_resumed_draws_the_plots_a_kill_left_undrawn(tmp_path, monkeypatch):
    """A run killed (SIGKILL: the out-of-memory killer, a preempted job) after its last
    epoch's metrics but before its plots were drawn (at most every PLOT_EVERY_S, and at the
    end) had no plots of its last epochs, or none at all, for good: --resume found every
    epoch trained, wrote metrics.json's final scores and drew nothing."""
    from kdml import cli
    from kdml.training import recorder

    monkeypatch.setattr(recorder, "PLOT_EVERY_S", 3600.0)
    plot_training = viz.plot_training
    monkeypatch.setattr(viz, "plot_training", lambda history, folder: [])  # killed first
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", *TINY_PLOTTED, "--out", str(run)]) == 0
    assert not (run / "plots").exists()
    monkeypatch.setattr(viz, "plot_training", plot_training)
    drawn = _drawn_epochs(monkeypatch)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert drawn == [[1, 2, 3]]
    assert sorted(path.name for path in (run / "plots").iterdir()) == ["loss.png", "recall.png"]


def test_a_stop_while_the_last_epochs_metrics_are_written_is_drawn_by_resume(tmp_path,
                                                                            monkeypatch):
    """Ctrl-C (or a kill, SIGTERM) after the last epoch's checkpoint, while its metrics were
    written: the session's end drew epochs 1 and 2, and --resume, finding every epoch trained,
    wrote epoch 3 into metrics.json but left the plots without it."""
    from kdml import cli
    from kdml.training import recorder, run_folder

    monkeypatch.setattr(recorder, "PLOT_EVERY_S", 3600.0)
    drawn = _drawn_epochs(monkeypatch)
    real = run_folder.RunFolder.write_metrics
    stopped: list[int] = []

    def stop_once(self, history, final, scored="test"):
        if len(history) == 3 and final is None and not stopped:
            stopped.append(3)
            raise KeyboardInterrupt
        return real(self, history, final, scored)

    monkeypatch.setattr(run_folder.RunFolder, "write_metrics", stop_once)
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", *TINY_PLOTTED, "--out", str(run)]) == 130
    assert drawn == [[1, 2]]
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert drawn == [[1, 2], [1, 2, 3]]
    assert [row["epoch"] for row in run_folder.RunFolder(run).history()] == [1, 2, 3]


def test_a_finished_run_resumed_adds_no_empty_tensorboard_file(tmp_path):
    """TensorBoard's events file is opened at the first epoch a session records: each --resume
    of a finished run had left one more file holding no scalar. What is in the way of the
    events folder is still said before anything trains."""
    from kdml import cli

    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", *TINY_PLOTTED, "--out", str(run)]) == 0
    events = sorted((run / "tensorboard").iterdir())
    assert len(events) == 1
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert sorted((run / "tensorboard").iterdir()) == events
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("epochs: 3", "epochs: 4"))
    for path in events:
        path.unlink()
    (run / "tensorboard").rmdir()
    (run / "tensorboard").write_text("a file of the user's")
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 2
    assert "start epoch 4" not in (run / "train.log").read_text()
    assert not (run / "checkpoints" / "unscored.pt").exists()


def _import_failed_by_a_stop_directly() -> None:
    """pybind11's way (matplotlib's extensions): "initialization failed" from the stop."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as stop:
        raise ImportError("initialization failed") from stop


def _import_failed_by_a_stop_underneath() -> None:
    """numpy's way: its own ImportError over the one a stop made."""
    try:
        _import_failed_by_a_stop_directly()
    except ImportError as failed:
        raise ImportError("Importing the numpy C-extensions failed.") from failed


@pytest.mark.parametrize("failed_import", [_import_failed_by_a_stop_directly,
                                           _import_failed_by_a_stop_underneath])
def test_a_ctrl_c_that_fails_an_import_is_a_stop_not_a_traceback(tmp_path, monkeypatch, capsys,
                                                                  failed_import):
    """Ctrl-C while the run's first plot imports matplotlib (or any lazy import of a C
    extension) fails that import with an ImportError raised over the KeyboardInterrupt: it had
    escaped as a traceback with exit status 1, not the one line and 130 of any Ctrl-C."""
    from kdml import cli

    monkeypatch.setattr(viz, "plot_training", lambda history, folder: failed_import())
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", *TINY_PLOTTED, "--out", str(run)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"kdml: interrupted; continue with: kdml train --resume {run}")
    # and train.log says so in its one line (it had ended at the last epoch, or with the
    # ImportError's traceback as "an error")
    assert (run / "train.log").read_text().splitlines()[-1].endswith(
        "stopped: interrupted (Ctrl-C)")
