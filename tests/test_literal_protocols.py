"""The LFW verification protocol and single-shot re-identification CMC on random data with
exact ties, against literal float64 loops of their definitions.

Verification (LFW View 2, DTML's face protocol): for each fold, the threshold of best accuracy
on the other folds (candidates below, between and above their distinct scores; equally good
ones broken towards calling more pairs "same"), applied to the held-out fold; mean, sample std
and standard error of the fold accuracies. Scores are multiples of 1/4, so pairs tie often and
every midpoint is exact.

Re-identification (DTML's VIPeR / i-LIDS / CAVIAR / 3DPeS protocol): each probe's rank is 1 +
the number of other gallery entries at a distance <= its true match's, compared exactly (integer
coordinates: squared distances as integers, cosines as fractions); CMC(r) is the share of ranks
<= r, averaged over the splits. The splits :func:`single_shot_cmc` draws are recorded and
checked against the protocol, then scored by the loops.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from kdml.evaluation import reid
from kdml.evaluation.reid import cmc_curve, match_ranks, single_shot_cmc
from kdml.evaluation.verification import best_threshold, verification_accuracy

# ----------------------------------------------------------------- verification references


def literal_best_threshold(scores: list[float], same: list[bool]) -> tuple[float, float]:
    """Similarity threshold t of best accuracy of "same iff score >= t"; the smallest on ties."""
    values = sorted(set(scores))
    candidates = [-math.inf] + [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)]
    candidates.append(math.inf)
    best, best_correct = candidates[0], -1
    for t in candidates:  # ascending: a later candidate must be strictly better
        correct = sum((s >= t) == y for s, y in zip(scores, same, strict=True))
        if correct > best_correct:
            best, best_correct = t, correct
    return best, best_correct / len(scores)


def literal_best_distance_threshold(distances: list[float], same: list[bool]) -> float:
    """Distance threshold t of best accuracy of "same iff distance <= t"; the largest on ties."""
    values = sorted(set(distances), reverse=True)
    candidates = [math.inf] + [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)]
    candidates.append(-math.inf)
    best, best_correct = candidates[0], -1
    for t in candidates:  # descending
        correct = sum((d <= t) == y for d, y in zip(distances, same, strict=True))
        if correct > best_correct:
            best, best_correct = t, correct
    return best


def literal_protocol(
    scores: list[float], same: list[bool], folds: list[int], distances: bool
) -> tuple[list[float], list[float], float, float]:
    """(thresholds, fold accuracies, mean, sample std) of the cross-validated protocol."""
    thresholds, accuracies = [], []
    for fold in sorted(set(folds)):
        train = [(s, y) for s, y, f in zip(scores, same, folds, strict=True) if f != fold]
        test = [(s, y) for s, y, f in zip(scores, same, folds, strict=True) if f == fold]
        train_scores, train_same = [s for s, _ in train], [y for _, y in train]
        if distances:
            t = literal_best_distance_threshold(train_scores, train_same)
            correct = sum((s <= t) == y for s, y in test)
        else:
            t, _ = literal_best_threshold(train_scores, train_same)
            correct = sum((s >= t) == y for s, y in test)
        thresholds.append(t)
        accuracies.append(correct / len(test))
    mean = sum(accuracies) / len(accuracies)
    std = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / (len(accuracies) - 1))
    return thresholds, accuracies, mean, std


def random_pairs(num_pairs: int, num_folds: int, seed: int, levels: int = 12):
    """Tied scores (multiples of 1/4), same-pairs scoring higher on average, random folds."""
    rng = np.random.default_rng(seed)
    same = rng.random(num_pairs) < 0.5
    scores = (rng.integers(0, levels, num_pairs) + 3 * same) / 4.0
    folds = rng.integers(0, num_folds, num_pairs) * 3 + 1  # non-contiguous fold ids
    return scores, same, folds


# ----------------------------------------------------------------- verification


@pytest.mark.parametrize(
    ("num_pairs", "num_folds", "seed"), [(12, 2, 0), (40, 3, 1), (61, 5, 2), (150, 10, 3)]
)
@pytest.mark.parametrize("as_distances", [False, True])
def test_verification_protocol_matches_the_literal_protocol(
    num_pairs, num_folds, seed, as_distances
):
    scores, same, folds = random_pairs(num_pairs, num_folds, seed)
    given = 5.0 - scores if as_distances else scores  # a distance: lower = more alike
    result = verification_accuracy(given, same, folds, scores_are_distances=as_distances)
    thresholds, accuracies, mean, std = literal_protocol(
        given.tolist(), same.tolist(), folds.tolist(), as_distances
    )
    assert result.fold_ids == tuple(sorted(set(folds.tolist())))
    assert result.thresholds == pytest.approx(tuple(thresholds), rel=1e-15, abs=0)
    assert result.fold_accuracies == pytest.approx(tuple(accuracies), rel=1e-15, abs=0)
    assert result.mean == pytest.approx(mean, rel=1e-12)
    assert result.std == pytest.approx(std, rel=1e-12, abs=1e-15)
    assert result.standard_error == pytest.approx(
        std / math.sqrt(len(accuracies)), rel=1e-12, abs=1e-15
    )


@pytest.mark.parametrize(("num_pairs", "num_folds"), [(20, 10), (23, 4), (7, 7)])
def test_default_folds_are_consecutive_nearly_equal_blocks(num_pairs, num_folds):
    """LFW's pairs.txt layout: fold f is a consecutive block; sizes differ by at most one, the
    first num_pairs % num_folds folds one larger."""
    scores, same, _ = random_pairs(num_pairs, 2, seed=num_pairs)
    base, extra = divmod(num_pairs, num_folds)
    folds, start = [], 0
    for fold in range(num_folds):
        size = base + (fold < extra)
        folds += [fold] * size
        start += size
    result = verification_accuracy(scores, same, num_folds=num_folds)
    explicit = verification_accuracy(scores, same, folds=np.array(folds))
    assert result == explicit
    assert result.fold_accuracies == pytest.approx(
        tuple(literal_protocol(scores.tolist(), same.tolist(), folds, False)[1]), rel=1e-15
    )


@pytest.mark.parametrize("seed", range(6))
def test_best_threshold_matches_the_literal_search(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 30))
    scores = rng.integers(-4, 5, size) / 4.0  # few distinct values: many ties
    same = rng.random(size) < rng.random()
    threshold, accuracy = best_threshold(scores, same)
    expected, expected_accuracy = literal_best_threshold(scores.tolist(), same.tolist())
    assert threshold == expected
    assert accuracy == pytest.approx(expected_accuracy, rel=1e-15)


def test_all_tied_scores_have_only_the_extreme_decisions():
    """One distinct score: every pair the same decision; the majority wins, "same" on a tie."""
    for same, expected in (
        ([1, 1, 0], -math.inf),
        ([0, 0, 1], math.inf),
        ([1, 0, 1, 0], -math.inf),
    ):
        threshold, _ = best_threshold(np.full(len(same), 0.5), np.array(same, dtype=bool))
        assert threshold == expected
        assert literal_best_threshold([0.5] * len(same), [bool(v) for v in same])[0] == expected


# ----------------------------------------------------------------- re-identification references


def squared_distance(a: list[int], b: list[int]) -> int:
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True))


def cosine_key(a: list[int], b: list[int]) -> Fraction:
    """A key ordered as the cosine similarity: sign(a.b) (a.b)^2 / (|a|^2 |b|^2), exactly; 0
    for a zero vector (its cosine distance is 1)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = sum(x * x for x in a) * sum(y * y for y in b)
    if norms == 0:
        return Fraction(0)
    return (1 if dot >= 0 else -1) * Fraction(dot * dot, norms)


def literal_ranks(
    probe: list[list[int]],
    probe_ids: list[int],
    gallery: list[list[int]],
    gallery_ids: list[int],
    metric: str,
) -> list[int]:
    """1 + the number of other gallery entries at a distance <= the true match's."""
    ranks = []
    for p, identity in zip(probe, probe_ids, strict=True):
        match = gallery_ids.index(identity)
        if metric == "euclidean":
            true = squared_distance(p, gallery[match])
            closer = [squared_distance(p, g) <= true for g in gallery]
        else:  # distance 1 - cos: at most the true one's iff cos at least the true one's
            true = cosine_key(p, gallery[match])
            closer = [cosine_key(p, g) >= true for g in gallery]
        ranks.append(1 + sum(c for j, c in enumerate(closer) if j != match))
    return ranks


def literal_cmc(ranks: list[int], gallery_size: int) -> list[float]:
    return [sum(r <= limit for r in ranks) / len(ranks) for limit in range(1, gallery_size + 1)]


def integer_points(num: int, dim: int, seed: int, spread: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).integers(-spread, spread + 1, (num, dim))


# ----------------------------------------------------------------- re-identification


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize(
    ("num_probes", "gallery_size", "dim", "seed"),
    [(1, 1, 1, 0), (4, 4, 1, 1), (6, 9, 2, 2), (12, 15, 3, 3)],
)
def test_match_ranks_count_ties_against_the_probe_exactly(
    metric, num_probes, gallery_size, dim, seed
):
    rng = np.random.default_rng(seed)
    gallery = integer_points(gallery_size, dim, seed)  # few values: exact ties and duplicates
    gallery[0] = 0  # a zero vector: cosine distance 1 to everything
    probe = integer_points(num_probes, dim, seed + 100)
    gallery_ids = rng.permutation(gallery_size) * 2 + 5
    probe_ids = rng.choice(gallery_ids, size=num_probes, replace=False)
    got = match_ranks(probe, probe_ids, gallery, gallery_ids, metric=metric)
    expected = literal_ranks(
        probe.tolist(), probe_ids.tolist(), gallery.tolist(), gallery_ids.tolist(), metric
    )
    assert got.tolist() == expected
    assert cmc_curve(got, gallery_size).tolist() == pytest.approx(
        literal_cmc(expected, gallery_size), rel=1e-15
    )


def test_scaled_copies_tie_under_the_cosine_distance():
    """Gallery entries 2g and 3g have g's cosine to every probe: each ties with the match g."""
    gallery = np.array([[1, 2], [2, 4], [3, 6], [-1, 1]])
    probe = np.array([[2, 1], [0, 1]])
    ids = [0, 1, 2, 3]
    got = match_ranks(probe, [0, 3], gallery, ids, metric="cosine")
    assert (
        got.tolist()
        == literal_ranks(probe.tolist(), [0, 3], gallery.tolist(), ids, "cosine")
        == [3, 4]
    )


def recorded_splits(monkeypatch) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """Wrap reid's split drawing: (gallery indices, probe indices, with cameras) per draw."""
    draws = []
    original = reid._draw_split

    def recording(images_by_identity, probe_images, rng):
        gallery, probe = original(images_by_identity, probe_images, rng)
        draws.append((gallery.copy(), probe.copy(), probe_images is not None))
        return gallery, probe

    monkeypatch.setattr(reid, "_draw_split", recording)
    return draws


def literal_split_cmc(
    points: list[list[int]],
    identities: list[int],
    gallery: np.ndarray,
    probe: np.ndarray,
    metric: str,
) -> list[float]:
    ranks = literal_ranks(
        [points[i] for i in probe],
        [identities[i] for i in probe],
        [points[i] for i in gallery],
        [identities[i] for i in gallery],
        metric,
    )
    return literal_cmc(ranks, len(gallery))


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_shot_cmc_is_the_mean_of_the_literal_cmcs_of_its_splits(monkeypatch, metric, seed):
    rng = np.random.default_rng(seed)
    # identities with 1 (left out), 2, 3 and 4 images, in shuffled order
    identities = rng.permutation(np.repeat(np.arange(8) * 3 + 2, [1, 2, 3, 4, 2, 1, 3, 2]))
    points = integer_points(len(identities), 2, seed, spread=1)  # many exact ties
    draws = recorded_splits(monkeypatch)
    ranks = (1, 2, 5, 50)  # 50 beyond the gallery: clamped to G, where CMC is 1
    result = single_shot_cmc(
        points, identities, num_splits=7, ranks=ranks, metric=metric, seed=seed
    )
    usable = sorted(i for i in set(identities.tolist()) if (identities == i).sum() >= 2)
    assert result["gallery_size"] == len(usable) == 6
    assert len(draws) == 7
    curves = []
    for gallery, probe, with_cameras in draws:
        assert not with_cameras
        # one gallery and one other probe image of each usable identity
        assert sorted(identities[gallery].tolist()) == usable
        assert identities[gallery].tolist() == identities[probe].tolist()
        assert (gallery != probe).all()
        curves.append(
            literal_split_cmc(points.tolist(), identities.tolist(), gallery, probe, metric)
        )
    mean_curve = [sum(c[r] for c in curves) / len(curves) for r in range(len(usable))]
    for r in ranks:
        assert result[f"cmc@{r}"] == pytest.approx(mean_curve[min(r, len(usable)) - 1], rel=1e-12)
    assert result["cmc@50"] == 1.0


@pytest.mark.parametrize("seed", [0, 1])
def test_camera_cmc_averages_both_fixed_directions_literally(monkeypatch, seed):
    """VIPeR-style: probes from camera A against a camera-B gallery and the reverse, both
    averaged; identities without an image in each camera are left out."""
    rng = np.random.default_rng(seed)
    identities = np.repeat(np.arange(7), 3)
    cameras = rng.integers(0, 2, len(identities)) * 4 + 1  # camera ids 1 and 5
    cameras[identities == 0] = 1  # identity 0 only in camera A: left out
    cameras[[3, 6, 9]] = 1  # identities 1-3 surely have an image in camera A ...
    cameras[[4, 7, 10]] = 5  # ... and in camera B
    points = integer_points(len(identities), 2, seed + 7, spread=2)
    draws = recorded_splits(monkeypatch)
    result = single_shot_cmc(
        points, identities, cameras=cameras, num_splits=5, ranks=(1, 3), seed=seed
    )
    usable = sorted(
        i for i in set(identities.tolist()) if {1, 5} <= set(cameras[identities == i].tolist())
    )
    assert result["gallery_size"] == len(usable)
    assert len(draws) == 2 * 5
    curves, directions = [], []
    for gallery, probe, with_cameras in draws:
        assert with_cameras
        assert sorted(identities[gallery].tolist()) == usable
        assert identities[gallery].tolist() == identities[probe].tolist()
        probe_camera, gallery_camera = set(cameras[probe].tolist()), set(cameras[gallery].tolist())
        assert len(probe_camera) == len(gallery_camera) == 1 and probe_camera != gallery_camera
        directions.append(probe_camera.pop())
        curves.append(
            literal_split_cmc(points.tolist(), identities.tolist(), gallery, probe, "euclidean")
        )
    assert directions.count(1) == directions.count(5) == 5  # A -> B and B -> A, every split
    for r in (1, 3):
        expected = sum(c[min(r, len(usable)) - 1] for c in curves) / len(curves)
        assert result[f"cmc@{r}"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("with_cameras", [False, True])
def test_every_image_of_an_identity_is_drawn_as_gallery_and_probe(monkeypatch, with_cameras):
    """The split draws an identity's gallery and probe images at random among its images (per
    camera with cameras): over 30 splits each of the three candidates is drawn in each role.
    A gallery of always the first image would score one fixed split, not the protocol's
    random ones."""
    if with_cameras:  # three images per identity in each of cameras 1 and 5
        identities, cameras = np.repeat(np.arange(4), 6), np.tile([1, 1, 1, 5, 5, 5], 4)
    else:  # three images per identity
        identities, cameras = np.repeat(np.arange(8), 3), None
    points = integer_points(len(identities), 2, seed=0)
    draws = recorded_splits(monkeypatch)
    single_shot_cmc(points, identities, cameras=cameras, num_splits=30, ranks=(1,), seed=0)
    gallery_seen: dict[tuple[int, int], set[int]] = {}
    probe_seen: dict[tuple[int, int], set[int]] = {}
    for gallery, probe, _ in draws:
        for seen, images in ((gallery_seen, gallery), (probe_seen, probe)):
            for image in images.tolist():
                camera = 0 if cameras is None else int(cameras[image])
                seen.setdefault((int(identities[image]), camera), set()).add(image)
    for seen in (gallery_seen, probe_seen):
        candidates = {key: {i for i in range(len(identities)) if identities[i] == key[0] and (
            cameras is None or cameras[i] == key[1])} for key in seen}
        assert len(seen) == 8  # every identity (and camera) in the role
        assert seen == candidates
