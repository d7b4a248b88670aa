"""kdml.evaluation.collapse: the share of an embedding that lies at one point."""

import pytest
import torch

from kdml.evaluation.collapse import (
    COLLAPSE_TOLERANCE,
    Collapse,
    chart_collapse,
    collapse,
    collapse_warning,
)


def literal_collapse(embeddings, metric):
    """Plain loops in float64: the lower middle value of each sorted coordinate is the
    centre; a row lies at it when no coordinate is further than the tolerance x its size."""
    rows = [[float(value) for value in row] for row in embeddings]
    if metric == "cosine":
        rows = [[value / max(sum(v * v for v in row) ** 0.5, 1e-12) for value in row]
                for row in rows]
    centre = [sorted(column)[(len(rows) - 1) // 2] for column in zip(*rows, strict=True)]
    size = max(abs(value) for value in centre)
    within = exact = 0
    spread = 0.0
    for row in rows:
        distance = max(abs(a - b) for a, b in zip(row, centre, strict=True))
        if distance <= COLLAPSE_TOLERANCE * size:
            within += 1
            spread = max(spread, distance)
        exact += distance == 0
    return within / len(rows), exact / len(rows), spread / size if size > 0 else 0.0


def clustered(seed, count=60, dim=5):
    """Some rows at one point (exactly, or within a few float32 roundings), the rest apart."""
    generator = torch.Generator().manual_seed(seed)
    point = torch.randn(dim, generator=generator)
    rows = torch.randn(count, dim, generator=generator) * 3
    at_point = int(torch.randint(0, count + 1, (1,), generator=generator))
    rows[:at_point] = point
    if seed % 2:
        rows[:at_point] += 1e-7 * torch.randn(at_point, dim, generator=generator)
    if seed % 3 == 0:
        rows[:at_point] *= 1 + torch.rand(at_point, 1, generator=generator)  # one direction
    return rows[torch.randperm(count, generator=generator)]


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("seed", range(12))
def test_collapse_agrees_with_a_literal_loop(seed, metric):
    """In float64, so that both normalise alike; which cosine rows are *exactly* at the
    centre turns on the last bit of each norm, so ``exact`` is compared for euclidean only."""
    rows = clustered(seed).double()
    share, exact, spread = literal_collapse(rows, metric)
    found = collapse(rows, metric)
    assert found.share == share
    assert found.spread == pytest.approx(spread, rel=1e-6, abs=1e-12)
    if metric == "euclidean":
        assert found.exact == exact


def test_the_two_collapses_seen_in_kdmls_runs_are_both_reported():
    """JIntra at alpha = 2 on Fashion-MNIST: every point within a float32 rounding of one
    point (the old test caught it), and most points exactly alike beside a few outliers
    1e-5 of the size away (the old test, the largest spread from the first point, missed it)."""
    generator = torch.Generator().manual_seed(0)
    point = torch.rand(64, generator=generator) + 0.1
    rounded = point + 6e-8 * torch.randint(-1, 2, (500, 64), generator=generator)
    assert "100.0% of them lie at one point (to within" in collapse_warning(rounded, "cosine")
    mostly = point.repeat(500, 1)
    mostly[:2] += 1e-5 * torch.randn(2, 64, generator=generator)
    warning = collapse_warning(mostly, "cosine")
    assert "99.6% of them lie at one point (exactly)" in warning
    assert warning.endswith("check the loss terms in its train.log)")


def test_a_spread_or_partly_tied_embedding_is_not_reported():
    generator = torch.Generator().manual_seed(1)
    spread = torch.randn(400, 16, generator=generator)
    assert collapse(spread, "euclidean").share == 0 and collapse_warning(spread, "cosine") is None
    spread[:199] = spread[0]  # just under half alike: duplicates, not a collapse
    assert collapse(spread, "euclidean").exact == pytest.approx(199 / 400)
    assert collapse_warning(spread, "euclidean") is None
    spread[:200] = spread[0]
    assert collapse_warning(spread, "euclidean") is not None


def test_cosine_collapse_is_of_directions():
    """Rows of one direction and many lengths: collapsed for cosine, not for euclidean."""
    rows = torch.arange(1.0, 11.0)[:, None] * torch.tensor([[0.6, 0.8]])
    assert collapse(rows, "cosine").share == 1
    assert collapse(rows, "euclidean").share == 0.1  # only the median row itself
    assert collapse_warning(rows, "euclidean") is None


def test_an_all_zero_embedding_has_collapsed_and_a_single_row_is_not_judged():
    assert collapse(torch.zeros(5, 3)) == (1.0, 1.0, 0.0)
    assert collapse_warning(torch.zeros(5, 3), "cosine") is not None
    assert collapse_warning(torch.ones(1, 3), "cosine") is None


def test_half_precision_rows_are_measured_in_float32():
    rows = torch.ones(6, 4, dtype=torch.float16)
    rows[0, 0] = 1.0009765625  # one float16 rounding above 1: far more than the tolerance
    assert collapse(rows).share == pytest.approx(5 / 6)


def test_collapse_refuses_a_shape_that_is_not_an_embedding():
    with pytest.raises(ValueError, match=r"non-empty \(N, D\) embedding, not shape \(3,\)"):
        collapse(torch.ones(3))
    with pytest.raises(ValueError, match=r"not shape \(0, 4\)"):
        collapse(torch.ones(0, 4))


@pytest.mark.parametrize("seed", range(8))
def test_chart_collapse_agrees_with_a_literal_loop_over_the_charts(seed):
    """Points at one place in one chart, the same coordinates in other charts, and the rest:
    only the points of one chart count, as shares of all the points."""
    generator = torch.Generator().manual_seed(100 + seed)
    coords = clustered(seed, count=90, dim=2).double()
    index = torch.randint(0, 3, (90,), generator=generator)
    if seed % 2:
        near = (coords - coords.median(dim=0).values).abs().amax(dim=1) < 1e-5
        index[near] = 1  # the cluster, if any, kept in one chart
    best = (0.0, 0.0, 0.0)
    for chart in range(3):
        members = [row for row, where in zip(coords, index, strict=True) if where == chart]
        if members:
            share, exact, spread = literal_collapse(torch.stack(members), "euclidean")
            weight = len(members) / 90
            if share * weight > best[0]:
                best = (share * weight, exact * weight, spread)
    found = chart_collapse(coords, index)
    assert found.share == pytest.approx(best[0])
    assert found.exact == pytest.approx(best[1])
    assert found.spread == pytest.approx(best[2], rel=1e-6, abs=1e-12)


def test_a_point_shared_by_two_charts_is_not_one_point():
    """The manifold distance between charts is infinite: the same coordinates in two charts
    are two places. 60% of the points at (0.3, 0.3), split 30/30 between two charts."""
    coords = torch.randn(100, 2, generator=torch.Generator().manual_seed(0))
    coords[:60] = 0.3
    index = torch.tensor([0] * 30 + [1] * 30 + [2] * 40)
    assert collapse(coords).share == 0.6
    assert chart_collapse(coords, index).share == 0.3
    assert collapse_warning(coords, "euclidean", chart_index=index) is None
    index[:60] = 1
    assert "60.0% of them lie at one point (exactly)" in collapse_warning(
        coords, "euclidean", chart_index=index)


def test_chart_collapse_needs_a_chart_per_row():
    with pytest.raises(ValueError, match=r"chart_index has shape \(3,\); chart_coords of "
                                         r"shape \(4, 2\) need one chart per row"):
        chart_collapse(torch.ones(4, 2), torch.zeros(3, dtype=torch.long))


def test_the_cosine_collapse_normalises_rows_of_any_norm():
    """Under the cosine metric a row of norm 2e-13 is its direction as much as a row of norm 2
    is: four rows of one direction have collapsed (F.normalize's floor of 1e-12 on the norm
    had left the tiny rows at a tenth of unit length, 75% at one point)."""
    rows = torch.tensor([[1e-13, 2e-13]] * 3 + [[1.0, 2.0]])
    assert collapse(rows, "cosine") == Collapse(share=1.0, exact=1.0, spread=0.0)


def test_the_spread_is_the_largest_of_every_chunk():
    """Points are measured in chunks of 4,096: the spread is the largest distance within the
    tolerance over all of them, here in the first chunk (one float32 ulp of 1), not the last
    chunk's (0)."""
    rows = torch.ones(4106, 3)
    rows[0, 0] += 1e-7  # rounds to 1 + 2^-23
    found = collapse(rows)
    assert found.share == 1.0 and found.spread == 2.0**-23


def test_a_collapse_partly_exact_names_both_shares():
    """The description names how much lies exactly at the point and how far the rest is:
    exactly, within a spread, or a share of each (even where under half is exact)."""
    # 60 rows exactly at one point, 140 within 1e-8 of it on both sides (so the median is
    # the point), 50 far apart
    point = torch.full((1, 4), 0.5, dtype=torch.float64)
    exact = point.repeat(60, 1)
    offsets = torch.cat([-torch.linspace(1e-8, 2e-8, 70), torch.linspace(1e-8, 2e-8, 70)])
    rounded = point + offsets[:, None].double() * torch.tensor([1.0, 0, 0, 0]).double()
    spread = torch.rand(50, 4, generator=torch.Generator().manual_seed(0)).double() + 2.0
    embeddings = torch.cat([exact, rounded, spread])
    found = collapse(embeddings)
    assert found.share == 200 / 250 and found.exact == 60 / 250
    warning = collapse_warning(embeddings, "euclidean")
    assert warning is not None
    assert (f"80.0% of them lie at one point (24.0% exactly, the rest to within "
            f"{found.spread:.1g} of its size)") in warning
