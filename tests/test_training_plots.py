"""The plots a run writes each epoch: loss.png and recall.png."""

from __future__ import annotations

import numpy as np
import pytest

from kdml import viz


@pytest.mark.parametrize(("prefix", "title"), [("test", "Test retrieval"),
                                               ("val", "Validation retrieval")])
def test_training_plots_name_the_scored_part_and_count_whole_epochs(prefix, title, tmp_path,
                                                                    monkeypatch):
    drawn = {}

    def keep(figure, path):  # instead of writing and closing it
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
        viz.plt.close(figure)
