"""A plot's PNG file: written atomically, marked as kdml's, and never over a file kdml did not
draw (a picture of the user's that happens to sit where a plot goes).

The mark is the PNG's "Software" text. Plots of kdml before it marked its own carry
matplotlib's, so a PNG with matplotlib's mark counts as kdml's too: a user's own matplotlib
figure saved under a plot's name in kdml's folder would be replaced. Any other file, link or
folder in the way is refused.
"""

from __future__ import annotations

import logging
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine
from PIL import Image, UnidentifiedImageError

from kdml import __version__
from kdml.errors import KdmlError
from kdml.file_write import check_writable_folder, write_through_new_file

SOFTWARE = f"kdml {__version__}"  # the PNG "Software" text of every plot kdml writes
# Plots written before kdml marked its own carry only matplotlib's mark; a resumed older run
# must still be able to redraw them.
SOFTWARE_MARK = "kdml "
REPLACEABLE_MARKS = (SOFTWARE_MARK, "Matplotlib version")
# matplotlib warns once per character its fonts lack ("Glyph 34924 (...) missing from
# font(s) DejaVu Sans."), at the first drawing of each text: class names in another script
# (CJK, say) gave a screenful per plot. kdml says it once per plot, with what to do.
MISSING_GLYPH = r"Glyph (\d+) .*missing from font\(s\) (.+?)\.?$"
SHOWN_MISSING = 8  # characters named in that one warning

_log = logging.getLogger("kdml.plots")


def drawn_by_kdml(path: Path, marked: bool = False) -> bool:
    """True when ``path`` is a PNG whose "Software" text is kdml's (or matplotlib's, of plots
    drawn before kdml marked its own; not with ``marked``, for a file to delete)."""
    try:
        # Pillow's guard against decompression bombs checks the header's size, but this reads
        # the text chunks and decodes no pixels: its warning (over 89 megapixels) is not ours
        # to print, and a picture past its limit (179) is the user's (kdml draws none so big)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                mark = str(getattr(image, "text", {}).get("Software", ""))
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError):
        return False
    return image.format == "PNG" and mark.startswith(SOFTWARE_MARK if marked
                                                     else REPLACEABLE_MARKS)


def check_replaceable(path: Path) -> None:
    """Refuse a plot path that does not end in ``.png``, where something kdml did not draw
    is in the way, or in a folder that cannot be written (checked before the work, so the user
    learns it at once)."""
    path = Path(path)
    _check_not_in_the_way(path)
    check_writable_folder(path.parent, "plots go there: move what is in the way, or make the "
                          "folder writable")


def _check_not_in_the_way(path: Path) -> None:
    """The checks of :func:`check_replaceable` that a write repeats: whether the folder can be
    written it finds out by writing (a scratch file per plot of every epoch would be waste)."""
    if path.suffix.lower() != ".png":  # the bytes are always PNG, whatever the name says
        raise KdmlError(f"{path}: kdml draws its plots as PNG files; give a path ending in .png")
    if path.is_symlink() or path.is_dir() or (path.exists() and not drawn_by_kdml(path)):
        raise KdmlError(f"{path} is in the way and kdml did not draw it; move it away (kdml "
                        "never replaces a file it did not write)")


def agg_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches on matplotlib's Agg canvas: no pyplot, no
    display, no change of the backend of a program that imports kdml."""
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def write_png(figure: Figure, path: Path, dpi: int = 100) -> Path:
    """Save ``figure`` to ``path`` with kdml's mark; a crash leaves the old file whole."""
    if isinstance(figure.get_layout_engine(), PlaceHolderLayoutEngine):
        # what tight_layout() leaves behind: an engine that lays nothing out, for which
        # savefig still drew the whole figure once before drawing it into the file (a third
        # of the save's time, and the same pixels without it)
        figure.set_layout_engine(None)
    return _replace(Path(path), lambda partial: figure.savefig(
        partial, dpi=dpi, metadata={"Software": SOFTWARE}))


@contextmanager
def missing_glyphs_named(path: Path) -> Iterator[None]:
    """While the plot of ``path`` is laid out and saved (matplotlib warns at the first
    drawing of each text, whichever that is), gather its warnings of characters that no font
    has into one warning of ``kdml.plots`` that names them; other warnings show as ever."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.filterwarnings("always", message=MISSING_GLYPH, category=UserWarning)
            yield
    finally:  # also when the plot failed: its other warnings are not lost
        missing = _show_all_but_missing_glyphs(caught)
    if missing:
        _log.warning(missing_glyphs_message(Path(path), missing))


def _show_all_but_missing_glyphs(caught: list[warnings.WarningMessage]) -> dict[str, str]:
    """Show the warnings in ``caught`` as they would have been shown, but for those of
    missing glyphs: their characters, each to the fonts that lack it."""
    missing: dict[str, str] = {}
    for warning in caught:
        glyph = re.match(MISSING_GLYPH, str(warning.message))
        if glyph is not None and issubclass(warning.category, UserWarning):
            missing.setdefault(chr(int(glyph[1])), glyph[2])
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno, source=warning.source)
    return missing


def missing_glyphs_message(path: Path, missing: dict[str, str]) -> str:
    """The one warning of :func:`missing_glyphs_named` for the characters (``missing``: character to
    the fonts that lack it) that ``path``'s plot shows as empty boxes."""
    shown = ", ".join(list(missing)[:SHOWN_MISSING])
    more = f" and {len(missing) - SHOWN_MISSING} more" if len(missing) > SHOWN_MISSING else ""
    fonts = next(iter(missing.values()))
    return (f"{path}: the plot's font ({fonts}) has no glyph for {len(missing)} "
            f"character{'s' if len(missing) != 1 else ''} of its text ({shown}{more}), which "
            "show as empty boxes; install a font that has them and put it first in "
            "matplotlib's font.sans-serif (in a matplotlibrc file)")


@contextmanager
def literal_text() -> Iterator[None]:
    """While a figure is built: the texts it creates are drawn as written, never parsed as
    matplotlib's mathtext (each text keeps that setting). Its titles, captions and legends
    hold the user's class names and dataset paths: a folder named "tea $2 or $3" had been
    drawn as "tea 2 or 3" in math italics, and one named "x $^$" stopped the plot in a
    ParseSyntaxException traceback."""
    with matplotlib.rc_context({"text.parse_math": False}):
        yield


def copy_png(source: Path, path: Path) -> Path:
    """Copy a plot kdml drew (``source``) to ``path``, under the same rules as
    :func:`write_png`."""
    return _replace(Path(path), lambda partial: shutil.copyfile(source, partial))


def _replace(path: Path, write: Callable[[Path], object]) -> Path:
    """Check that kdml may replace ``path``, then write it whole or not at all."""
    _check_not_in_the_way(path)
    return write_through_new_file(path, write)
