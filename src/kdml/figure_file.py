"""A plot's PNG file: written atomically, marked as kdml's, and never over a file kdml did not
draw (a picture of the user's that happens to sit where a plot goes)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from PIL import Image, UnidentifiedImageError

from kdml import __version__
from kdml.errors import KdmlError

SOFTWARE = f"kdml {__version__}"  # the PNG "Software" text of every plot kdml writes
# Plots written before kdml marked its own carry only matplotlib's mark; a resumed older run
# must still be able to redraw them.
REPLACEABLE_MARKS = ("kdml ", "Matplotlib version")


def drawn_by_kdml(path: Path) -> bool:
    """True when ``path`` is a PNG whose "Software" text is kdml's (or matplotlib's)."""
    try:
        with Image.open(path) as image:
            mark = str(getattr(image, "text", {}).get("Software", ""))
    except (OSError, UnidentifiedImageError):
        return False
    return image.format == "PNG" and mark.startswith(REPLACEABLE_MARKS)


def check_replaceable(path: Path) -> None:
    """Refuse a plot path where something kdml did not draw is in the way (checked before the
    work, so the user learns it at once)."""
    path = Path(path)
    if path.is_symlink() or path.is_dir() or (path.exists() and not drawn_by_kdml(path)):
        raise KdmlError(f"{path} is in the way and kdml did not draw it; move it away (kdml "
                        "never replaces a file it did not write)")


def write_png(figure: Figure, path: Path, dpi: int = 100) -> Path:
    """Save ``figure`` to ``path`` with kdml's mark; a crash leaves the old file whole."""
    path = Path(path)
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.stem + ".tmp.png")
    try:
        figure.savefig(partial, dpi=dpi, metadata={"Software": SOFTWARE})
    except BaseException:  # Ctrl-C or a full disk: nothing half-written stays behind
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)
    return path
