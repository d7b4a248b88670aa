"""Characters of a plot's text that no installed font has: one kdml warning per plot, instead
of matplotlib's warning per character at every layout and save."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from kdml.figure_file import SHOWN_MISSING, missing_glyphs_message, missing_glyphs_named, write_png
from kdml.viz_charts import plot_charts
from kdml.viz_retrieval import plot_embedding_map

CJK_NAMES = {0: "衬衫", 1: "裤子", 2: "Coat"}  # DejaVu Sans, matplotlib's own, has no CJK


def _glyph_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


def test_a_chart_plot_names_the_characters_its_font_lacks_once(tmp_path, caplog):
    """Four CJK characters in the legend gave eight lines of matplotlib's warnings (two per
    character: layout, then save); now one warning, in kdml's logger, names them."""
    rng = np.random.default_rng(0)
    codes, charts, labels = rng.standard_normal((30, 2)), np.arange(30) % 5, np.arange(30) % 3
    path = tmp_path / "charts.png"
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        plot_charts(codes, charts, labels, path, class_names=CJK_NAMES)
    assert _glyph_warnings(caught) == []
    (record,) = [r for r in caplog.records if r.name == "kdml.plots"]
    assert record.getMessage() == (
        f"{path}: the plot's font (DejaVu Sans) has no glyph for 4 characters of its text "
        "(衬, 衫, 裤, 子), which show as empty boxes; install a font that has them and put it "
        "first in matplotlib's font.sans-serif (in a matplotlibrc file)")
    assert path.is_file()


def test_a_plot_whose_font_has_every_character_warns_of_nothing(tmp_path, caplog):
    figure, axes = plt.subplots()
    axes.set_title("Coat, T-shirt/top, Müller, Ωμέγα")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        write_png(figure, tmp_path / "plain.png")
    plt.close(figure)
    assert _glyph_warnings(caught) == [] and caplog.records == []


def test_other_warnings_are_shown_as_they_were(tmp_path, caplog):
    """Only the missing-glyph warnings are gathered; any other still shows, also when the
    plot fails."""
    figure, axes = plt.subplots()
    axes.set_title("衬")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        with missing_glyphs_named(tmp_path / "other.png"):
            warnings.warn("something else", RuntimeWarning, stacklevel=1)
            write_png(figure, tmp_path / "other.png")
        with pytest.raises(ValueError, match="boom"), missing_glyphs_named(tmp_path / "x.png"):
            warnings.warn("before the failure", RuntimeWarning, stacklevel=1)
            raise ValueError("boom")
    plt.close(figure)
    assert [str(w.message) for w in caught] == ["something else", "before the failure"]
    assert [r.name for r in caplog.records] == ["kdml.plots"]


def test_an_embedding_map_names_them_once_too(tmp_path, caplog):
    coordinates = np.random.default_rng(0).standard_normal((12, 2))
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        plot_embedding_map(coordinates, np.arange(12) % 3, tmp_path / "map.png", "t-SNE",
                           "test", class_names=CJK_NAMES)
    assert _glyph_warnings(caught) == []
    (record,) = [r for r in caplog.records if r.name == "kdml.plots"]
    assert "(衬, 衫, 裤, 子)" in record.getMessage()


def test_the_warning_names_at_most_a_few_characters():
    missing = {chr(0x4E00 + i): "DejaVu Sans" for i in range(SHOWN_MISSING + 3)}
    tmp = Path("p.png")
    message = missing_glyphs_message(tmp, missing)
    assert f"has no glyph for {SHOWN_MISSING + 3} characters" in message
    assert f"{chr(0x4E00 + SHOWN_MISSING - 1)} and 3 more)" in message
    assert chr(0x4E00 + SHOWN_MISSING) not in message and str(tmp) in message
    one = missing_glyphs_message(tmp, {"衬": "DejaVu Sans"})
    assert "no glyph for 1 character of its text (衬)" in one
