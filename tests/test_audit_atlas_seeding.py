"""Audit: the Atlas geometry's edges (compressed_code's shapes, the "code" variant's threshold)
and the explicit random streams of kdml.seeding (reproducible, separate, CPU only)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from kdml.atlas import CODE_LOG_SMALL, ChartOutputs, compressed_code, manifold_distance
from kdml.errors import KdmlError
from kdml.seeding import AUGMENT, METHOD, StepRandom, derive_seed, with_cpu_seed


@pytest.mark.parametrize("charts", [2, 4], ids=["fewer", "more"])
def test_compressed_code_refuses_memberships_of_another_chart_count(charts):
    """q [B, m] with m != n had been taken: fewer charts silently picked a chart index of the
    wrong table, more stopped in a raw IndexError."""
    coords = torch.zeros(2, 3, 2)
    with pytest.raises(KdmlError, match=r"compressed_code needs coords \[B, n, d\] and q \[B, n\]"):
        compressed_code(ChartOutputs(coords, torch.full((2, charts), 1.0 / charts)))


def test_compressed_code_refuses_memberships_of_another_batch():
    with pytest.raises(KdmlError, match="compressed_code needs"):
        compressed_code(ChartOutputs(torch.zeros(2, 3, 2), torch.full((3, 3), 1.0 / 3)))


def test_the_code_variant_gives_1_at_a_shared_membership_of_exactly_1e_12():
    """neurve's pdist_mfld: 1 wherever the shared membership is *at most* 1e-12. Log
    memberships put it exactly on the threshold (one chart: log q(x) + log q(y) = log 1e-12)."""
    c1 = torch.tensor([[[0.0, 0.0]]], dtype=torch.float64)
    c2 = torch.tensor([[[3.0, 4.0]]], dtype=torch.float64)
    at = torch.tensor([[CODE_LOG_SMALL]], dtype=torch.float64)
    one = torch.zeros(1, 1, dtype=torch.float64)
    assert manifold_distance(at, c1, one, c2, variant="code", q_is_log=True).item() == 1.0
    # just above the threshold: the chart distance (12.5, the mean square) times s / (s + 1e-12)
    above = at + 1e-3
    shared = math.exp(CODE_LOG_SMALL + 1e-3)
    expected = 12.5 * shared / (shared + 1e-12)
    got = manifold_distance(above, c1, one, c2, variant="code", q_is_log=True).item()
    assert got == pytest.approx(expected, rel=1e-9)


def test_derive_seed_is_pinned_and_uses_63_bits():
    """A run's every draw comes from derive_seed: changing it (its hash, its bits) changes
    every seeded run an earlier kdml trained, without a word."""
    import numpy as np

    for keys in [(0,), (7, 1, 2, 0, 0), (123, 4, 5)]:
        seed, *rest = keys
        word = np.random.SeedSequence(entropy=seed, spawn_key=tuple(rest)).generate_state(
            1, np.uint64)[0]
        assert derive_seed(*keys) == int(word) // 2
    seeds = [derive_seed(0, step) for step in range(64)]
    assert all(0 <= seed < 2**63 for seed in seeds)
    assert max(seeds) >= 2**62  # the top bit of the 63 is used


def test_a_step_s_streams_are_separate_and_each_generator_is_kept():
    """The augmentation and the method draw from different streams; asking twice for a stream's
    generator gives the same generator, so successive draws go on rather than repeat."""
    rng = StepRandom(seed=3, epoch=1, step=2)
    assert rng.seed(AUGMENT) != rng.seed(METHOD)
    first = torch.rand(4, generator=rng.generator("cpu", METHOD))
    again = torch.rand(4, generator=rng.generator("cpu", METHOD))
    assert rng.generator("cpu", METHOD) is rng.generator("cpu", METHOD)
    assert not torch.equal(first, again)
    fresh = StepRandom(seed=3, epoch=1, step=2).generator("cpu", METHOD)
    assert torch.equal(torch.rand(4, generator=fresh), first)
    augment = torch.rand(4, generator=StepRandom(3, 1, 2).generator("cpu", AUGMENT))
    assert not torch.equal(augment, first)
    # the same object: its augmentation stream is not the method's generator it made first
    assert torch.equal(torch.rand(4, generator=rng.generator("cpu", AUGMENT)), augment)


def test_with_cpu_seed_seeds_the_cpu_generator_only(monkeypatch):
    """torch.manual_seed would also seed (and leave changed) every CUDA generator."""
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: seeded.append(seed))
    before = torch.random.get_rng_state()
    drawn = with_cpu_seed(5, lambda: torch.rand(3))
    assert seeded == []
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(drawn, torch.rand(3, generator=torch.Generator().manual_seed(5)))


def test_with_cpu_seed_takes_a_numpy_seed_as_the_same_python_seed():
    """torch's manual_seed had refused np.int64(5) with a bare TypeError."""
    assert torch.equal(with_cpu_seed(np.int64(5), lambda: torch.rand(3)),
                       with_cpu_seed(5, lambda: torch.rand(3)))


@pytest.mark.parametrize(("seed", "message"), [
    (-1, "with_cpu_seed: the seed must be an integer of at least 0, got -1"),
    (2**64, "with_cpu_seed: the seed must be at most 2**64 - 1 (torch's largest seed), "
            "got 18446744073709551616"),
])
def test_with_cpu_seed_refuses_a_seed_torch_cannot_take_in_one_line(seed, message):
    """-1 had seeded torch as a seed of its own (no other kdml seed is negative), 2**64 raised
    torch's "Overflow when unpacking long long"; the global state stays as it was."""
    before = torch.random.get_rng_state()
    with pytest.raises(KdmlError, match=f"^{re.escape(message)}$"):
        with_cpu_seed(seed, lambda: torch.rand(3))
    assert torch.equal(torch.random.get_rng_state(), before)


# ------------------------------------------------------------------ non-finite and empty inputs

NAN = float("nan")


def test_safe_sqrt_keeps_nan_and_zero_s_zero_gradient():
    """A NaN squared distance had come out as 0 (NaN > 0 is False): a diverged encoder's
    coordinates were "the same point" to the Euclidean chart distance and to MTriplet."""
    from kdml.atlas import safe_sqrt

    x = torch.tensor([0.0, 4.0, NAN, math.inf], requires_grad=True)
    root = safe_sqrt(x)
    values = root.detach().tolist()
    assert values[:2] == [0.0, 2.0] and math.isnan(values[2]) and values[3] == math.inf
    root[:2].sum().backward()
    assert x.grad[:2].tolist() == [0.0, 0.25]


@pytest.mark.parametrize("variant", ["paper", "code"])
@pytest.mark.parametrize("d0", [None, "euclidean", "squared", "mean_squared"])
def test_nan_coordinates_give_a_nan_distance(variant, d0):
    q = torch.ones(1, 1)
    nan_coords, zero = torch.full((1, 1, 2), NAN), torch.zeros(1, 1, 2)
    assert math.isnan(manifold_distance(q, nan_coords, q, zero, d0, variant).item())


@pytest.mark.parametrize("variant", ["paper", "code"])
@pytest.mark.parametrize("bad", [NAN, -0.5])
def test_a_nan_or_negative_membership_gives_nan_not_no_shared_chart(variant, bad):
    """NaN or negative memberships had read as log 0: "no shared chart", inf for the paper's
    variant and 1 for the code's, silently; an exact 0 is still no share of that chart."""
    c = torch.zeros(1, 2, 1)
    q_bad = torch.tensor([[bad, bad]])
    assert math.isnan(manifold_distance(q_bad, c, torch.tensor([[0.5, 0.5]]), c,
                                        variant=variant).item())
    apart = manifold_distance(torch.tensor([[1.0, 0.0]]), c, torch.tensor([[0.0, 1.0]]), c,
                              variant=variant).item()
    assert apart == (math.inf if variant == "paper" else 1.0)


def test_the_code_variant_of_a_nan_log_membership_is_nan():
    c = torch.zeros(1, 1, 1)
    got = manifold_distance(torch.tensor([[NAN]]), c, torch.zeros(1, 1), c, variant="code",
                            q_is_log=True)
    assert math.isnan(got.item())


def test_no_chart_at_all_is_refused_in_one_line():
    """n = 0 charts had stopped in argmax's or amax's IndexError."""
    with pytest.raises(KdmlError, match=r"compressed_code needs .* n >= 1"):
        compressed_code(ChartOutputs(torch.zeros(2, 0, 3), torch.zeros(2, 0)))
    empty_q, empty_c = torch.zeros(2, 0), torch.zeros(2, 0, 3)
    with pytest.raises(KdmlError, match=r"manifold_distance: .* n >= 1"):
        manifold_distance(empty_q, empty_c, empty_q, empty_c)


def test_chart_distances_refuse_coordinates_of_no_dimension():
    """d = 0: the mean square had been 0 / 0 = NaN, the others 0 for every pair."""
    from kdml.atlas import chart_distances

    with pytest.raises(KdmlError, match=r"chart_distances needs .* d >= 1"):
        chart_distances(torch.zeros(2, 1, 0), torch.zeros(3, 1, 0), "mean_squared")


@pytest.mark.parametrize(("keys", "message"), [
    ((-1,), r"^derive_seed: the seed must be an integer of at least 0, got -1$"),
    ((1, 2, -2), r"^derive_seed: key 2 must be an integer of at least 0, got -2$"),
    ((1.5,), r"^derive_seed: the seed must be an integer of at least 0, got 1.5$"),
])
def test_derive_seed_refuses_a_negative_or_fractional_key_in_one_line(keys, message):
    """NumPy's own ValueError ("expected non-negative integer") named neither."""
    with pytest.raises(KdmlError, match=message):
        derive_seed(*keys)
