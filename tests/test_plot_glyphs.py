"""Characters of a plot's text that no installed font has: one kdml warning per plot, instead
of matplotlib's warning per character at every layout and save."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.text import Text

from kdml.figure_file import SHOWN_MISSING, missing_glyphs_message, missing_glyphs_named, write_png
from kdml.viz_charts import chart_figure, plot_charts
from kdml.viz_retrieval import plot_embedding_map, plot_retrieval_grid

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


# folder names as a folder: or csv: dataset's classes may be: two "$" made matplotlib parse
# the text between them as math, and "$^$" stopped the plot in a ParseSyntaxException
DOLLAR_NAMES = {0: "tea $2 or $3", 1: "x $^$", 2: "Coat"}


def test_class_names_with_dollar_signs_are_drawn_as_written(tmp_path):
    """Class names (and the map's title, which holds the dataset's path) are drawn as
    written in all three pictures, never as matplotlib's mathtext: ``kdml plot retrieval`` and
    ``plot embedding`` of a ``folder:`` run with a class folder named ``x $^$`` had ended in a
    ValueError traceback, and ``tea $2 or $3`` was drawn as "tea 2 or 3" in math italics."""
    rng = np.random.default_rng(0)
    codes, charts, labels = rng.standard_normal((30, 2)), np.arange(30) % 2, np.arange(30) % 3
    figure = chart_figure(codes, charts, labels, class_names=DOLLAR_NAMES)
    texts = [text for text in figure.findobj(Text) if "$" in text.get_text()]
    assert {text.get_text() for text in texts} == {"tea $2 or $3", "x $^$"}
    assert not any(text.get_parse_math() for text in texts)
    plot_charts(codes, charts, labels, tmp_path / "charts.png", class_names=DOLLAR_NAMES)
    plot_embedding_map(codes, labels, tmp_path / "map.png", "t-SNE", "folder:/data/$x$",
                       class_names=DOLLAR_NAMES)
    plot_retrieval_grid(np.array([0, 1]), np.array([[1, 2], [0, 2]]), np.ones((2, 2), bool),
                        lambda _: np.zeros((4, 4)), tmp_path / "grid.png",
                        lambda position: DOLLAR_NAMES[position])
    assert all((tmp_path / name).is_file() for name in ("charts.png", "map.png", "grid.png"))
    assert matplotlib.rcParams["text.parse_math"]  # only while kdml's figures are built
