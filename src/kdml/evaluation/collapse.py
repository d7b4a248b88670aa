"""Detecting an embedding that has collapsed to one point.

A regularizer that wins over its loss can map (almost) every input alike: JRD's JIntra at
alpha = 2 does it on Fashion-MNIST. Two shapes of it were seen in kdml's own runs, and
kdml's first test (every point within 1e-6 of the size from the first point) caught only the
first of them:

- every point within one float32 rounding of the others (736 distinct rows among 35,000, all
  within 6e-8 of the first, at a size of 0.55); Recall@1 was 0.32 where chance is 0.20,
  because those roundings still follow the classes a little, but another device, precision
  or thread count rounds differently;
- 34,911 of 35,000 points exactly alike and 89 a little apart (up to 1.1e-5 of the size);
  Recall@1 was 0.2006, chance.

So the test here is the *share* of the points that lie at one point, within a tolerance far
below any spread that carries meaning (float32 rounds at about 6e-8 of a value's size).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from kdml.evaluation.knn import unit_rows

# Points this close to the centre, as a share of its size, lie at one point: 8 to 17 float32
# units in the last place. kdml's collapsed JIntra runs (alpha = 2, seeds 0 to 4) lie within
# 2.2e-7 of it, or (seeds 3 and 4) 99.7% and 100% exactly at it; at alpha = 1, no point of
# seed 0's 35,000 lies within 0.015 of it.
COLLAPSE_TOLERANCE = 1e-6
# A collapse is reported when at least this share of the points lies at one point: half a test
# set tied is no longer a ranking of it, and no real test set holds that many duplicates.
COLLAPSE_SHARE = 0.5
# Rows compared with the centre at a time (a float64 copy of 16 MB at 512-d).
_CHUNK = 4096


class Collapse(NamedTuple):
    """How much of an embedding lies at one point.

    ``share``: the fraction of the points within ``COLLAPSE_TOLERANCE`` of the centre's size
    of the coordinate-wise median point (that point itself when more than half the points
    are exactly alike; at exactly half, torch's median, the lower of the two middle values,
    may fall on the other points' side). ``exact``: the fraction exactly at the centre.
    ``spread``: the largest distance (max-norm) of the points within the tolerance from the
    centre, as a share of its size; 0 when they are exactly alike."""

    share: float
    exact: float
    spread: float


def collapse(embeddings: Tensor, metric: str = "euclidean") -> Collapse:
    """Measure how much of ``embeddings`` (N, D) lies at one point: the same direction when
    ``metric == "cosine"``, the same point otherwise. Returns :class:`Collapse`.

    Example::

        >>> collapse(torch.ones(4, 3)).share
        1.0
        >>> collapse(torch.eye(3)).share
        0.0
    """
    if embeddings.ndim != 2 or len(embeddings) == 0:
        raise ValueError(f"collapse takes a non-empty (N, D) embedding, not shape "
                         f"{tuple(embeddings.shape)}")
    vectors = embeddings.detach()
    if vectors.dtype != torch.float64:
        vectors = vectors.float()  # half-precision outputs are compared as float32
    if metric == "cosine":  # F.normalize left rows of norm below 1e-12 unnormalised
        vectors = unit_rows(vectors).to(vectors.dtype)
    # the median is an input value, so the centre of points that are more than half alike is
    # exactly their point; float64 so that its size and the distances are not rounded again
    centre = vectors.median(dim=0).values.double()
    size = centre.abs().max()
    within = exact = 0
    spread = torch.zeros((), dtype=torch.float64)
    for start in range(0, len(vectors), _CHUNK):
        distance = (vectors[start:start + _CHUNK].double() - centre).abs().amax(dim=1)
        close = distance <= COLLAPSE_TOLERANCE * size
        within += int(close.sum())
        exact += int((distance == 0).sum())
        if close.any():
            spread = torch.maximum(spread, distance[close].max())
    return Collapse(share=within / len(vectors), exact=exact / len(vectors),
                    spread=float(spread / size) if size > 0 else 0.0)


def chart_collapse(chart_coords: Tensor, chart_index: Tensor) -> Collapse:
    """:func:`collapse` of an Atlas embedding (Korman): points lie at one point only in the
    same chart (``chart_index`` [N], the argmax chart) at the same coordinates
    (``chart_coords`` [N, d], compared as Euclidean points, as the manifold distance does).
    The chart holding the most points at one point gives the result, its shares taken of all
    N points. (A point where at least half of all lie is at least half of its chart's, so its
    chart's median finds it.)"""
    if chart_index.shape != chart_coords.shape[:1]:
        raise ValueError(f"chart_index has shape {tuple(chart_index.shape)}; chart_coords of "
                         f"shape {tuple(chart_coords.shape)} need one chart per row")
    best = Collapse(0.0, 0.0, 0.0)
    for chart in chart_index.unique():
        members = chart_index == chart
        found = collapse(chart_coords[members])
        share = int(members.sum()) / len(chart_index)
        if found.share * share > best.share:
            best = Collapse(found.share * share, found.exact * share, found.spread)
    return best


def collapsed(embeddings: Tensor, metric: str, chart_index: Tensor | None = None
              ) -> Collapse | None:
    """:func:`collapse` of ``embeddings`` (with ``chart_index``, an Atlas run's chart
    coordinates: :func:`chart_collapse`) when at least ``COLLAPSE_SHARE`` of the points lie at
    one point, else None."""
    if len(embeddings) < 2:
        return None
    found = (collapse(embeddings, metric) if chart_index is None
             else chart_collapse(embeddings, chart_index))
    return found if found.share >= COLLAPSE_SHARE else None


def describe(found: Collapse, name: str = "the test embeddings") -> str:
    """``"the test embeddings have collapsed: 99.8% of them lie at one point (...)"`` (``name``
    first) for a :func:`collapsed` embedding."""
    within = f"to within {found.spread:.1g} of its size"
    where = ("exactly" if found.exact == found.share else within if found.exact == 0
             else f"{found.exact:.1%} exactly, the rest {within}")
    return f"{name} have collapsed: {found.share:.1%} of them lie at one point ({where})"


def collapse_description(embeddings: Tensor, metric: str,
                         name: str = "the test embeddings",
                         chart_index: Tensor | None = None) -> str | None:
    """:func:`describe` of a :func:`collapsed` embedding, else None."""
    found = collapsed(embeddings, metric, chart_index)
    return None if found is None else describe(found, name)


def warning(description: str, scores: str = "their metrics") -> str:
    """The one-line warning for a collapsed embedding (:func:`describe`): ``scores`` (what was
    computed from them) say little of the model."""
    return (f"{description}, so their neighbours are ties or differ by float rounding, which "
            f"another device, precision or thread count changes; {scores} say little of the "
            f"model. Train it again with lower learning rates (or check the loss terms in "
            f"its train.log)")


def collapse_warning(embeddings: Tensor, metric: str, name: str = "the test embeddings",
                     scores: str = "their metrics",
                     chart_index: Tensor | None = None) -> str | None:
    """:func:`warning` for a :func:`collapsed` embedding, or None."""
    description = collapse_description(embeddings, metric, name, chart_index)
    return None if description is None else warning(description, scores)
