"""The LFW-style verification protocol and single-shot re-identification CMC, against hand
computations and brute-force references."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from reference_impls import nn_vote_accuracy

from kdml.errors import KdmlError
from kdml.evaluation.reid import cmc_curve, match_ranks, single_shot_cmc
from kdml.evaluation.retrieval import retrieval_metrics
from kdml.evaluation.transfer import source_nn_accuracy, target_metrics
from kdml.evaluation.verification import best_threshold, pair_scores, verification_accuracy

# ----------------------------------------------------------------- verification

# (score, same, fold); folds listed out of order on purpose
PAIRS = [
    (0.9, 1, 0), (0.8, 1, 1), (0.7, 1, 2), (0.6, 1, 0), (0.5, 0, 0), (0.45, 0, 1),
    (0.4, 1, 1), (0.55, 0, 2), (0.2, 0, 0), (0.1, 0, 1), (0.3, 1, 2), (0.35, 0, 2),
]


def brute_force_protocol(pairs):
    """For each fold: try every midpoint of the sorted distinct training scores (and one
    below / above all), keep the smallest with the best training accuracy, apply it."""
    results = []
    for fold in sorted({f for _, _, f in pairs}):
        train = [(s, y) for s, y, f in pairs if f != fold]
        test = [(s, y) for s, y, f in pairs if f == fold]
        values = sorted({s for s, _ in train})
        candidates = [values[0] - 1.0] + [(a + b) / 2 for a, b in zip(values, values[1:],
                                                                        strict=False)]
        candidates.append(values[-1] + 1.0)
        best_t, best_acc = None, -1.0
        for t in candidates:
            acc = sum((s >= t) == bool(y) for s, y in train) / len(train)
            if acc > best_acc:
                best_t, best_acc = t, acc
        results.append((best_t, sum((s >= best_t) == bool(y) for s, y in test) / len(test)))
    return results


def test_verification_matches_hand_computation_and_brute_force():
    scores, same, folds = (np.array(column) for column in zip(*PAIRS, strict=True))
    result = verification_accuracy(scores, same, folds)
    # fold 0 by hand: the other folds' best threshold is 0.625 (between 0.55 and 0.7: 6 of 8
    # right); on fold 0 it calls 0.6 "different" by mistake -> 3 of 4
    assert result.thresholds[0] == pytest.approx(0.625)
    assert result.fold_accuracies[0] == 0.75
    reference = brute_force_protocol(PAIRS)
    assert result.thresholds == pytest.approx(tuple(t for t, _ in reference))
    assert result.fold_accuracies == pytest.approx(tuple(a for _, a in reference))
    accuracies = [a for _, a in reference]
    mean = sum(accuracies) / 3
    std = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / 2)
    assert result.mean == pytest.approx(mean)
    assert result.std == pytest.approx(std)
    assert result.standard_error == pytest.approx(std / math.sqrt(3))
    # a Python float as the other fields are (it was an np.float64: repr np.float64(...))
    assert type(result.standard_error) is float
    assert result.fold_ids == (0, 1, 2)


def test_distances_give_the_same_decisions():
    scores, same, folds = (np.array(column) for column in zip(*PAIRS, strict=True))
    as_similarity = verification_accuracy(scores, same, folds)
    as_distance = verification_accuracy(1.0 - scores, same, folds, scores_are_distances=True)
    assert as_distance.fold_accuracies == pytest.approx(as_similarity.fold_accuracies)
    assert as_distance.thresholds == pytest.approx(tuple(1.0 - t for t in
                                                         as_similarity.thresholds))


def test_default_folds_are_ten_consecutive_blocks():
    rng = np.random.default_rng(0)
    same = rng.integers(0, 2, 600).astype(bool)
    scores = np.where(same, 1.0, 0.0) + rng.uniform(-0.4, 0.4, 600)  # separable
    result = verification_accuracy(torch.from_numpy(scores), torch.from_numpy(same))
    assert result.fold_ids == tuple(range(10))
    assert result.mean == 1.0 and result.std == 0.0
    assert all(0.4 < t < 0.6 for t in result.thresholds)


def test_a_far_gallery_entry_does_not_tie_the_other_probes():
    """The tie tolerance was a share of the largest distance of the whole matrix: one gallery
    entry 1e8 away tied matches 1e-5 and 2e-5 from their probes (ranks [2, 2, 1])."""
    probe = np.array([[0.0, 0.0], [5.0, 5.0], [1e8, 0.0]])
    gallery = np.array([[1e-5, 0.0], [2e-5, 0.0], [1e8 + 1, 0.0]])
    ids = np.arange(3)
    literal = [1 + sum(math.dist(p, g) < math.dist(p, gallery[i]) for g in gallery)
               for i, p in enumerate(probe)]
    assert match_ranks(probe, ids, gallery, ids).tolist() == literal == [1, 1, 1]


def test_distances_equal_in_exact_arithmetic_tie_far_from_the_origin():
    """A gallery entry at exactly the true match's distance ties, counted against the probe
    (rank 2), also at coordinates near 1e6, where the distances' rounding exceeds an absolute
    tolerance: the tolerance relative to the match's distance had passed every test."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        probe, step = rng.uniform(0, 1, 2) * 1e6, rng.uniform(0, 1, 2) * 1e6
        gallery = np.stack([probe + step, probe + step[::-1]])  # mirrored: the same distance
        assert match_ranks(probe[None], [0], gallery, [0, 1]).tolist() == [2]


def test_best_threshold_hand_case():
    # sorted: 0.1 D, 0.3 S, 0.35 D, 0.4 S -> candidates 0.2 (3/4), 0.325 (2/4), 0.375 (3/4)...
    threshold, accuracy = best_threshold(np.array([0.3, 0.1, 0.4, 0.35]),
                                         np.array([True, False, True, False]))
    assert threshold == pytest.approx(0.2) and accuracy == 0.75


@pytest.mark.parametrize("pair", [(0.75, np.nextafter(0.75, 1.0)), (1e308, 1.7e308),
                                  (-1.7e308, 1.7e308)])
def test_best_threshold_separates_adjacent_and_extreme_scores(pair):
    """The midpoint of two adjacent floats rounds onto the lower one, and (a + b) / 2 of two
    scores near float64's largest overflowed: either way no candidate separated the pairs
    (accuracy 0.5 for 1)."""
    scores = np.array(pair * 3)
    same = np.array([False, True] * 3)
    with np.errstate(all="raise"):
        threshold, accuracy = best_threshold(scores, same)
    assert accuracy == 1.0 and pair[0] < threshold <= pair[1]
    assert verification_accuracy(scores, same, num_folds=3).mean == 1.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scores": [0.1, np.nan], "same": [0, 1], "folds": [0, 1]}, "NaN"),
    ({"scores": [0.1, 0.2], "same": [0, 2], "folds": [0, 1]}, "0/1"),
    ({"scores": [0.1, 0.2], "same": [0, 1], "folds": [0, 0]}, "at least 2 folds"),
    ({"scores": [0.1, 0.2], "same": [0, 1, 1]}, "one length"),
    ({"scores": [0.1, 0.2], "same": [0, 1], "folds": [0.0, 1.0]}, "integers"),
    # a TypeError, a ValueError, and 2.0 taken as 2
    ({"scores": [0.1, 0.2], "same": [0, 1], "num_folds": None},
     r"num_folds must be an integer from 2 to the number of pairs \(2\), got None"),
    ({"scores": [0.1, 0.2], "same": [0, 1], "num_folds": 2.0}, "integer from 2 .* got 2.0"),
    ({"scores": ["a", "b"], "same": [0, 1], "num_folds": 2}, "scores must be numbers"),
])
def test_verification_errors(kwargs, message):
    with pytest.raises(KdmlError, match=message):
        verification_accuracy(**kwargs)


def test_pair_scores_match_loops():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    cosine = pair_scores(a, b)
    euclidean = pair_scores(torch.from_numpy(a), torch.from_numpy(b), metric="euclidean")
    for i in range(5):
        dot = sum(a[i, d] * b[i, d] for d in range(3))
        norms = math.sqrt(sum(v * v for v in a[i])) * math.sqrt(sum(v * v for v in b[i]))
        assert cosine[i] == pytest.approx(dot / norms)
        assert euclidean[i] == pytest.approx(-math.sqrt(sum((a[i] - b[i]) ** 2)))
    assert pair_scores(np.zeros((1, 2)), np.ones((1, 2)))[0] == 0.0
    with pytest.raises(KdmlError):
        pair_scores(a, b, metric="manhattan")


def test_pair_scores_of_large_finite_embeddings_and_non_finite_ones():
    """Squares of 1e200 overflowed: every score was NaN, and NaN inputs gave NaN scores."""
    big = np.array([[1e200, 3e200], [2e200, -1e200]])
    other = np.array([[2e200, 6e200], [1e200, 1e200]])
    with np.errstate(all="raise"):
        cosine = pair_scores(big, other)
        euclidean = pair_scores(big, other, metric="euclidean")
    assert cosine == pytest.approx([1.0, 1 / math.sqrt(10)])
    assert euclidean == pytest.approx([-math.sqrt(10) * 1e200, -math.sqrt(5) * 1e200])
    with pytest.raises(KdmlError, match="pair embeddings contain NaN or infinite values"):
        pair_scores(np.array([[np.nan, 1.0]]), np.ones((1, 2)))


# ----------------------------------------------------------------- re-identification


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("size", [1e160, 1e-160])
def test_match_ranks_of_very_large_or_small_embeddings_are_their_unit_scale_ranks(metric,
                                                                                 size):
    """Squared distances of 1e160-sized vectors overflow float64 (cmc@1 had been 0 where it
    is 1), and of 1e-160-sized ones underflow."""
    rng = np.random.default_rng(0)
    probe, gallery = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    ids = np.arange(6)
    expected = match_ranks(probe, ids, gallery, ids, metric=metric)
    with np.errstate(over="raise", under="ignore"):
        ranks = match_ranks(probe * size, ids, gallery * size, ids, metric=metric)
    assert ranks.tolist() == expected.tolist()


def test_match_ranks_and_cmc_hand_case():
    gallery, gallery_ids = np.array([[0.0], [1.0], [3.0]]), np.array([0, 1, 2])
    probe, probe_ids = np.array([[1.1], [2.9], [3.5]]), np.array([0, 1, 2])
    # probe 0: true 1.1, id 1 at 0.1 is closer -> 2; probe 1: true 1.9, id 2 at 0.1 -> 2;
    # probe 2: true 0.5, the others at 2.5 and 3.5 -> 1
    ranks = match_ranks(probe, probe_ids, gallery, gallery_ids)
    assert ranks.tolist() == [2, 2, 1]
    assert cmc_curve(ranks, 3).tolist() == pytest.approx([1 / 3, 1.0, 1.0])


def test_ties_count_against_the_probe():
    ranks = match_ranks(np.array([[0.0]]), [5], np.array([[1.0], [-1.0], [3.0]]), [7, 5, 9])
    assert ranks.tolist() == [2]


@pytest.mark.parametrize("gallery_ids", [[0, 1, 2, 2], [0, 1, 3, 4]], ids=["twice", "absent"])
def test_a_probe_identity_not_exactly_once_in_the_gallery_is_a_one_line_error(gallery_ids):
    """Single shot: a probe identity twice in the gallery (or absent) has no one true match; a
    clear error, not a NumPy shape error from the true distances."""
    with pytest.raises(KdmlError, match="^every probe identity must appear exactly once in the "
                                        "gallery$"):
        match_ranks(np.zeros((3, 2)), [0, 1, 2], np.ones((4, 2)), gallery_ids)


def test_single_shot_cmc_hand_case_with_ties_singletons_and_clamped_ranks():
    # identities 0 and 1 sit on the same point (a tie), identity 2 far away, identity 3 has a
    # single image (no probe/gallery pair: left out). Every split gives ranks [2, 2, 1].
    x = np.array([[0.0], [0.0], [0.0], [0.0], [5.0], [5.0], [9.0]])
    ids = np.array([0, 0, 1, 1, 2, 2, 3])
    result = single_shot_cmc(x, ids, num_splits=4, ranks=(1, 2, 5))
    assert result == pytest.approx({"cmc@1": 1 / 3, "cmc@2": 1.0, "cmc@5": 1.0,
                                    "gallery_size": 3.0})


def test_cameras_force_cross_camera_pairs():
    # Same-camera images of an identity coincide; across cameras every probe ties or loses, so
    # CMC@1 is 0 for every cross-camera split, and > 0 once same-camera pairs may be drawn.
    x = np.array([[0.0], [0.0], [100.0], [100.0], [100.0], [0.0]])
    ids = np.array([0, 0, 0, 1, 1, 1])
    cams = np.array([0, 0, 1, 0, 0, 1])
    across = single_shot_cmc(x, ids, cameras=cams, num_splits=30, ranks=(1, 2), seed=3)
    assert across == {"cmc@1": 0.0, "cmc@2": 1.0, "gallery_size": 2.0}
    anywhere = single_shot_cmc(x, ids, num_splits=30, ranks=(1,), seed=3)
    assert anywhere["cmc@1"] > 0


def test_single_shot_cmc_is_seeded():
    rng = np.random.default_rng(0)
    x, ids = rng.standard_normal((40, 4)), np.repeat(np.arange(10), 4)
    first = single_shot_cmc(x, ids, num_splits=5, seed=1)
    assert first == single_shot_cmc(x, ids, num_splits=5, seed=1)
    # another seed draws other splits (every seed's had been seed 0's: passed every test)
    assert first["cmc@1"] != single_shot_cmc(x, ids, num_splits=5, seed=2)["cmc@1"]
    assert first["gallery_size"] == 10.0
    assert 0 <= first["cmc@1"] <= first["cmc@5"] <= first["cmc@10"] == first["cmc@20"] == 1.0


def test_single_shot_cmc_errors():
    with pytest.raises(KdmlError, match="two images"):
        single_shot_cmc(np.zeros((3, 2)), [0, 1, 2])
    with pytest.raises(KdmlError, match="an image in each camera"):
        single_shot_cmc(np.zeros((4, 2)), [0, 0, 1, 1], cameras=[0, 0, 1, 1])
    with pytest.raises(KdmlError, match="exactly two cameras"):
        single_shot_cmc(np.zeros((4, 2)), [0, 0, 1, 1], cameras=[0, 1, 2, 1])
    with pytest.raises(KdmlError, match="ranks"):
        single_shot_cmc(np.zeros((4, 2)), [0, 0, 1, 1], ranks=(0,))


def test_single_shot_cmc_refuses_a_gallery_of_one_and_nan_identities():
    """One usable identity is a gallery of one, whose probe ranks its match first whatever the
    embedding: CMC 1 at every rank had been returned. A NaN identity equals no identity, not
    even its own, so its images had been left out silently (the gallery shrank)."""
    far_apart = np.array([[0.0], [100.0], [5.0], [5.0], [7.0]])
    with pytest.raises(KdmlError, match=r"^only one identity has two images, a gallery of one"):
        single_shot_cmc(far_apart, [0, 0, 1, 2, 3])
    with pytest.raises(KdmlError, match=r"^only one identity has an image in each camera"):
        single_shot_cmc(far_apart[:4], [0, 0, 1, 1], cameras=[0, 1, 0, 0])
    with pytest.raises(KdmlError, match=r"^identities contain NaN or infinite values$"):
        single_shot_cmc(far_apart[:4], np.array([0.0, 0.0, np.nan, np.nan]))


# ----------------------------------------------------------------- transfer accuracy


def test_source_nn_accuracy_matches_a_brute_force_vote():
    rng = np.random.default_rng(2)
    source, source_y = rng.standard_normal((30, 3)), rng.integers(0, 4, 30)
    target, target_y = rng.standard_normal((12, 3)), rng.integers(0, 4, 12)
    for k in (1, 3, 4):
        correct = 0
        for t, y in zip(target, target_y, strict=True):
            nearest = sorted(range(30), key=lambda j, t=t: sum((t - source[j]) ** 2))[:k]
            votes = {}
            for j in nearest:
                votes[source_y[j]] = votes.get(source_y[j], 0) + 1
            best = max(votes.values())
            # tie: the tied label seen first among the neighbours (nearest first)
            predicted = next(source_y[j] for j in nearest if votes[source_y[j]] == best)
            correct += predicted == y
        got = source_nn_accuracy(source, source_y, target, target_y, k=k)
        assert got == pytest.approx(correct / 12)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_source_nn_vote_takes_exactly_tied_sources_in_index_order(metric):
    """As documented (and as the brute-force vote's stable sort): equal source rows labelled
    0, 1, 1, 0 vote 0 at k = 2, the label of the first. faiss had returned the inner-product
    search's ties last index first, so the cosine vote had said 1."""
    source, labels = np.ones((4, 3)), [0, 1, 1, 0]
    assert source_nn_accuracy(source, labels, np.ones((1, 3)), [0], k=2, metric=metric) == 1.0
    rng = np.random.default_rng(5)
    source = np.repeat(rng.standard_normal((4, 3)), 5, axis=0)  # 4 points, 5 copies each
    source_y, target = rng.integers(0, 3, 20), rng.standard_normal((15, 3))
    target_y = rng.integers(0, 3, 15)
    for k in (2, 4, 7):
        assert source_nn_accuracy(source, source_y, target, target_y, k=k, metric=metric) \
            == pytest.approx(nn_vote_accuracy(source, source_y, target, target_y, k, metric))


def test_k_of_every_source_sample_votes_with_all_of_them():
    """k may be the number of source samples, as documented (1 to N_s): every target gets the
    majority label of the whole source set."""
    source, source_y = np.array([[0.0], [1.0], [2.0]]), [0, 0, 1]
    target = np.array([[2.0], [1.9], [0.0]])
    assert source_nn_accuracy(source, source_y, target, [0, 1, 0], k=3) == pytest.approx(2 / 3)
    with pytest.raises(KdmlError, match=r"^k must be an integer from 1 to 3, got 4$"):
        source_nn_accuracy(source, source_y, target, [0, 1, 0], k=4)


def test_a_vote_among_all_tied_sources_searches_every_source_at_once(monkeypatch):
    """Where every retrieved source is tied with the k-th (a collapsed embedding), the vote
    searches every source next, where doubling would search them log2(N / (k + 1)) times;
    a group that ends soon doubles."""
    from kdml.evaluation import transfer

    widths = []
    real = transfer.search_rows

    def counted(targets, rows, sources, k, *rest):
        widths.append(k)
        return real(targets, rows, sources, k, *rest)

    monkeypatch.setattr(transfer, "search_rows", counted)
    labels = np.arange(100) % 3
    assert source_nn_accuracy(np.ones((100, 3)), labels, np.ones((2, 3)), [0, 1], k=2) == 0.5
    assert widths == [3, 100]
    widths.clear()
    # one nearest point, then 3 copies of the next: 3 wide, then 6, where the group ends
    source = np.concatenate([[[0.0]], np.ones((3, 1)), np.arange(2.0, 98.0)[:, None]])
    source_nn_accuracy(source, labels, np.zeros((1, 1)), [0], k=2)
    assert widths == [3, 6]


def test_source_votes_a_few_float32_ulps_apart_go_by_distance_not_index():
    """Only equal float32 scores are taken in index order: sources 1 + 4e-7, 1 and 1 + 2e-7
    away (distinct in float32) vote by distance, so the two nearest (labels 0, 0) win, not
    the two lowest indices (labels 1, 0: a tie the nearer label 1 would win)."""
    source = np.array([[1.0 + 4e-7], [1.0], [1.0 + 2e-7], [10.0]])
    assert source_nn_accuracy(source, [1, 0, 0, 1], np.zeros((1, 1)), [0], k=2) == 1.0


def test_negative_source_labels_are_refused():
    """-1 marks an unknown target label; the source domain is labelled, so a -1 there is a
    mistake to name, not a class to vote for."""
    with pytest.raises(KdmlError, match=r"^source_labels must all be >= 0 \(the source domain "
                                        r"is labelled\)$"):
        source_nn_accuracy(np.array([[0.0], [10.0]]), [0, -1], np.array([[1.0], [9.0]]), [0, 1])


def test_target_metrics_take_any_magnitude_and_origin():
    """Source and target are searched shifted and scaled alike: the target alone had been
    rescaled (values beyond 2^30) before its source-NN search against the raw source."""
    rng = np.random.default_rng(4)
    source, source_y = rng.standard_normal((30, 3)), rng.integers(0, 3, 30)
    target, target_y = rng.standard_normal((12, 3)), rng.integers(0, 3, 12)
    expected = target_metrics(source, source_y, target, target_y, ks=(1, 2))
    for scale, offset in ((2.0**40, 0.0), (1.0, 1e4), (2.0**40, 1e4)):
        got = target_metrics(scale * source + offset, source_y, scale * target + offset,
                             target_y, ks=(1, 2))
        assert got == pytest.approx(expected, abs=1e-12), (scale, offset)


def test_target_metrics_leave_out_unknown_labels():
    """The unlabelled (-1) targets sit nearest to every labelled one: scored as neighbours,
    they would turn each hit into a miss."""
    source = np.array([[0.0], [10.0]])
    target = np.array([[1.0], [2.0], [9.0], [8.0], [1.4], [8.6]])
    labels = [0, 0, 1, 1, -1, -1]
    metrics = target_metrics(source, [0, 1], target, labels, ks=(1,))
    labelled = retrieval_metrics(target[:4], labels[:4], ks=(1,), metric="euclidean")
    assert metrics["recall@1"] == labelled["recall@1"] == 1.0
    assert metrics["map@r"] == labelled["map@r"] == 1.0
    assert metrics["r_precision"] == labelled["r_precision"] == 1.0
    assert metrics["source_nn_accuracy"] == 1.0
    with pytest.raises(KdmlError, match="no labelled"):
        source_nn_accuracy(source, [0, 1], target, [-1] * len(target))


def test_all_same_and_all_different_thresholds_hold_beyond_the_training_scores():
    """Training folds whose pairs are all "same" give the threshold -inf: a held-out "same"
    pair far below the training scores is still called same (min - 1 called it different)."""
    scores = np.array([0.5, 0.55, 0.6, 0.58, -40.0, 0.52])
    same = np.ones(6, dtype=bool)
    result = verification_accuracy(scores, same, folds=[0, 0, 0, 1, 1, 1])
    assert result.thresholds[1] == -np.inf and result.mean == 1.0
    as_distance = verification_accuracy(-scores, same, folds=[0, 0, 0, 1, 1, 1],
                                        scores_are_distances=True)
    assert as_distance.thresholds[1] == np.inf and as_distance.mean == 1.0
    different = verification_accuracy(scores, ~same, folds=[0, 0, 0, 1, 1, 1])
    assert different.thresholds[0] == np.inf and different.mean == 1.0


def test_camera_roles_are_fixed_and_both_directions_averaged():
    """VIPeR's protocol: probes from camera A against a camera-B gallery, then the reverse.
    Here identity 0's camera-A image sits next to identity 1's camera-B image, so A->B ranks
    identity 0's match second, while every B->A probe finds its match first."""
    x = np.array([[0.0], [10.0], [0.9], [5.0]])  # id 0: A at 0, B at 10; id 1: A at 0.9, B at 5
    ids, cams = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
    result = single_shot_cmc(x, ids, cameras=cams, num_splits=2, ranks=(1,))
    # A->B: probe 0 (at 0) is nearer 5 (id 1) than 10 (id 0): rank 2; probe 1 (0.9): rank 1.
    # B->A: probe 10 -> nearest 0.9 (id 1): rank 2; probe 5 -> 0.9 (id 1): rank 1.
    assert result["cmc@1"] == pytest.approx((0.5 + 0.5) / 2)


def test_cosine_ties_equal_in_exact_arithmetic_count_against_the_probe():
    """A gallery vector and its double have the same cosine distance to any probe: a tie."""
    direction = np.array([0.3, -1.7, 2.9])
    gallery = np.stack([direction, 2 * direction])
    ranks = match_ranks(np.array([[1.0, 0.2, 0.5]]), [1], gallery, [0, 1], metric="cosine")
    assert ranks.tolist() == [2]


def test_reid_refuses_non_finite_embeddings():
    """A NaN distance never counts as closer, so NaN embeddings used to rank every true match
    first: a perfect CMC."""
    with pytest.raises(KdmlError, match=r"^embeddings contains NaN or infinite values$"):
        single_shot_cmc(np.full((6, 1), np.nan), [0, 0, 1, 1, 2, 2], num_splits=2, ranks=(1,))
    with pytest.raises(KdmlError, match=r"^gallery contains NaN or infinite values$"):
        match_ranks(np.zeros((1, 2)), [0], np.array([[np.inf, 0.0], [1.0, 1.0]]), [0, 1])
    with pytest.raises(KdmlError, match=r"^probe must be 2-D \(N, D\), got shape \(2,\)$"):
        match_ranks(np.zeros(2), [0], np.zeros((2, 2)), [0, 1])


def test_single_shot_cmc_refuses_ranks_that_are_not_a_sequence():
    with pytest.raises(KdmlError, match=r"^ranks must be a sequence of positive integers, e\.g\. "
                                        r"\(1, 5\), got 5$"):
        single_shot_cmc(np.zeros((4, 2)), [0, 0, 1, 1], ranks=5)


def test_reid_takes_integer_codes_as_floats():
    """Binary or integer codes are embeddings too (the validation added for NaN refused them)."""
    codes = np.array([[0, 1], [0, 1], [1, 0], [1, 0], [5, 5], [5, 4]], dtype=np.int8)
    as_float = single_shot_cmc(codes.astype(np.float64), [0, 0, 1, 1, 2, 2], num_splits=3,
                               ranks=(1,))
    assert single_shot_cmc(codes, [0, 0, 1, 1, 2, 2], num_splits=3, ranks=(1,)) == as_float
    assert as_float["cmc@1"] == 1.0


def test_the_protocols_take_what_an_autocast_model_returns():
    """bfloat16 and float16 tensors (an autocast model's embeddings): NumPy has no bfloat16,
    and the verification and re-identification protocols failed on them with a TypeError."""
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.standard_normal((40, 6)).round(1))  # exact in both halves
    ids = torch.arange(40) // 2
    for dtype in (torch.bfloat16, torch.float16):
        low = x.to(dtype)
        scores = pair_scores(low[:20], low[20:])
        np.testing.assert_allclose(scores, pair_scores(low[:20].double(), low[20:].double()))
        assert scores.shape == (20,) and np.isfinite(scores).all()
        same = torch.arange(20) % 2 == 0
        assert verification_accuracy(torch.from_numpy(scores).to(dtype), same, num_folds=4).mean \
            == verification_accuracy(torch.from_numpy(scores).to(dtype).double(), same,
                                     num_folds=4).mean
        assert single_shot_cmc(low, ids, num_splits=3) == single_shot_cmc(low.double(), ids,
                                                                           num_splits=3)


def test_cosine_scores_keep_a_tiny_row_beside_a_huge_one():
    """One power of two for all rows had made a row of 1e-200 beside one of 1e200 a zero
    vector: its pair scored 0 and its match ranked behind another entry, silently. A cosine
    is each row's alone, so each row is scaled on its own."""
    tiny_and_huge = np.array([[1e-200, 1e-200], [1e200, 0.0]])
    assert pair_scores(tiny_and_huge, tiny_and_huge).tolist() == [1.0, 1.0]
    assert pair_scores(tiny_and_huge, tiny_and_huge[::-1]).tolist() == pytest.approx(
        [math.sqrt(0.5), math.sqrt(0.5)], rel=1e-15)
    ranks = match_ranks(np.array([[1e-200, 1e-200]]), [0], np.array([[3e-200, 3e-200],
                                                                     [1e200, 0.0]]), [0, 1],
                        metric="cosine")
    assert ranks.tolist() == [1]


def test_pair_scores_refuse_embeddings_that_are_not_numbers():
    """Strings had stopped pair_scores with NumPy's "could not convert string to float"."""
    with pytest.raises(KdmlError, match=r"^pair embeddings must be numbers, got dtypes <U1 and "
                                        r"<U1$"):
        pair_scores([["a", "b"]], [["c", "d"]])


@pytest.mark.parametrize("seed", [-1, 1.5, "a", True])
def test_seeded_protocols_refuse_a_seed_that_is_no_count(seed):
    """NumPy's own ValueError or TypeError had come through single_shot_cmc and the other
    seeded evaluations."""
    from kdml.evaluation.clustering import clustering_nmi
    from kdml.evaluation.generalization import generalization_terms
    from kdml.evaluation.parts import stratified_parts

    x, ids = np.eye(4), [0, 0, 1, 1]
    message = f"^seed must be an integer of at least 0, got {seed!r}$"
    for call in (lambda: single_shot_cmc(x, ids, seed=seed),
                 lambda: stratified_parts(np.array([0, 0, 1, 1]), 1, seed=seed),
                 lambda: clustering_nmi(x, ids, seed=seed),
                 lambda: generalization_terms(x, ids, x, [2, 2, 3, 3], seed=seed)):
        with pytest.raises(KdmlError, match=message):
            call()
    assert single_shot_cmc(x, ids, seed=np.int64(3)) == single_shot_cmc(x, ids, seed=3)


def test_a_numpy_seed_and_niter_cluster_as_the_same_python_ones():
    """The checks take NumPy integers, but faiss's k-means had then refused them with SWIG's
    bare TypeError ("in method 'ClusteringParameters_seed_set', argument 2 of type 'int'")."""
    from kdml.evaluation.charts import chart_clustering_nmi
    from kdml.evaluation.clustering import clustering_nmi

    x, ids = np.random.default_rng(0).standard_normal((40, 3)), np.repeat(np.arange(4), 10)
    charts = np.arange(40) % 2
    assert clustering_nmi(x, ids, niter=np.int64(5), seed=np.int64(3)) == clustering_nmi(
        x, ids, niter=5, seed=3)
    assert chart_clustering_nmi(x, charts, ids, niter=np.int64(5), seed=np.int64(3)) == (
        chart_clustering_nmi(x, charts, ids, niter=5, seed=3))


def test_stratified_parts_need_two_samples_of_every_class_per_part():
    """Every query of a part needs a relevant neighbour there: 2 parts need 4 samples of each
    class (4 are dealt 2 and 2, each part sorted, covering every sample once); 3 are refused."""
    from kdml.evaluation.parts import stratified_parts

    parts = stratified_parts(np.array([0, 0, 0, 0, 1, 1, 1, 1, 1]), 2, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(9))
    assert [len(part) for part in parts] == [5, 4]
    assert all((np.diff(part) > 0).all() for part in parts)
    # the seed deals each class's samples in a random order, not every other one
    by_seed = [stratified_parts(np.zeros(20, dtype=np.int64), 2, seed=seed)[0].tolist()
               for seed in (0, 1)]
    assert by_seed[0] != by_seed[1] and list(range(0, 20, 2)) not in by_seed
    with pytest.raises(KdmlError, match=r"^1 test class has fewer than 4 samples \(e\.g\. "
                                        r"class 1\), too few for 2 parts"):
        stratified_parts(np.array([0, 0, 0, 0, 1, 1, 1]), 2)


@pytest.mark.parametrize(("labels", "num_parts", "message"), [
    ([0, 0, 1, 1], 2.5, "the number of test parts must be an integer of at least 1, got 2.5"),
    ([0, 0, 1, 1], True, "the number of test parts must be an integer of at least 1, got True"),
    ([0, 0, 1, 1], "2", "the number of test parts must be an integer of at least 1, got '2'"),
    ([0, 0, 1, 1], 0, "the number of test parts must be an integer of at least 1, got 0"),
    ([[0, 0], [1, 1], [0, 0], [1, 1]], 1,
     "labels must be [N], one per sample, at least one, got shape (4, 2)"),
    ([], 1, "labels must be [N], one per sample, at least one, got shape (0,)"),
    ([0, 0, 0, 0, np.nan, np.nan, np.nan, np.nan], 2,
     "labels hold NaN, which is no class; give every sample a class"),
])
def test_stratified_parts_refuse_what_is_no_part_count_or_label_vector(labels, num_parts,
                                                                       message):
    """2.5 parts had raised Python's TypeError and True made one part; 2-D labels gave
    positions past N (8 of 4 rows), empty ones NumPy's ValueError, and NaN labels (equal to
    nothing) had been left out of every part, silently."""
    from kdml.evaluation.parts import stratified_parts

    with pytest.raises(KdmlError, match=f"^{re.escape(message)}$"):
        stratified_parts(np.array(labels), num_parts)


def test_retrieval_over_parts_is_the_estimate_of_each_part_s_own_retrieval():
    """Table 2's protocol: each of the parts scored alone (leave-one-out within it) by the
    metric given, and the mean and Student-t half-width over every part (a part left out, or
    the cosine metric replaced by the Euclidean one, changed the numbers silently)."""
    from kdml.evaluation.estimate import Estimate
    from kdml.evaluation.parts import retrieval_over_parts, stratified_parts

    rng = np.random.default_rng(4)
    labels = np.repeat(np.arange(3), 12)
    # rows of very different lengths: the cosine ranking is not the Euclidean one
    vectors = (rng.standard_normal((36, 3)) + labels[:, None]) * rng.uniform(0.1, 10, (36, 1))
    for metric in ("cosine", "euclidean"):
        got = retrieval_over_parts(vectors, labels, ks=(1, 2), num_parts=3, metric=metric,
                                   seed=5)
        per_part = [retrieval_metrics(vectors[part], labels[part], ks=(1, 2), metric=metric,
                                      nmi=False)
                    for part in stratified_parts(labels, 3, seed=5)]
        for name, estimate in got.items():
            assert estimate == Estimate.of([scores[name] for scores in per_part]), name
        assert len(got["recall@1"].values) == 3
    cosine = retrieval_over_parts(vectors, labels, ks=(1,), num_parts=3, metric="cosine")
    euclidean = retrieval_over_parts(vectors, labels, ks=(1,), num_parts=3, metric="euclidean")
    assert cosine["map@r"].values != euclidean["map@r"].values


def test_source_nn_accuracy_leaves_unknown_targets_out_of_the_vote_accuracy():
    """Targets labelled -1 are not scored for any k: the accuracy is over the labelled ones
    (as scikit-learn's k-NN classifier scores them), not their count over every target."""
    from sklearn.neighbors import KNeighborsClassifier

    rng = np.random.default_rng(6)
    source, source_y = rng.standard_normal((25, 2)), rng.integers(0, 3, 25)
    target, target_y = rng.standard_normal((14, 2)), rng.integers(0, 3, 14)
    target_y[[1, 4, 9]] = -1
    labelled = target_y >= 0
    for k in (1, 3):
        peer = KNeighborsClassifier(n_neighbors=k).fit(source, source_y)
        expected = np.mean(peer.predict(target[labelled]) == target_y[labelled])
        got = source_nn_accuracy(source, source_y, target, target_y, k=k)
        assert got == pytest.approx(expected, abs=1e-12), k


def test_source_nn_accuracy_counts_equally_near_sources_as_their_expectation():
    """Two equal source rows labelled 0 and 1 are a target's nearest: at k = 1 it counts half
    right, whichever row comes first (the first row alone counted 0 or 1 by the order)."""
    source = np.array([[0.0, 1.0], [0.0, 1.0], [5.0, 5.0]])
    target = np.array([[0.0, 1.2], [5.0, 5.1]])
    for source_y in ([0, 1, 2], [1, 0, 2]):
        got = source_nn_accuracy(source, source_y, target, [0, 2], k=1)
        assert got == pytest.approx(0.75, abs=1e-15)


def test_retrieval_over_one_part_is_refused():
    """An interval over the parts needs two of them; one part is retrieval_metrics."""
    from kdml.evaluation.parts import retrieval_over_parts

    with pytest.raises(KdmlError, match=r"^num_parts must be an integer of at least 2 \(an "
                                        r"interval over the parts needs two\), got 1; for one "
                                        r"part use retrieval_metrics$"):
        retrieval_over_parts(np.eye(4), [0, 0, 1, 1], ks=(1,), num_parts=1)


def test_retrieval_over_parts_refuses_labels_of_another_length():
    """Labels shorter or longer than the vectors are refused in one line: the parts index the
    labels, and a longer array had been dealt into parts past the last vector (an IndexError)
    or a shorter one had scored only its first rows."""
    from kdml.evaluation.parts import retrieval_over_parts

    vectors = np.random.default_rng(0).standard_normal((16, 3))
    for labels in (np.repeat([0, 1], 8)[:12], np.repeat([0, 1], 10)):
        with pytest.raises(KdmlError, match=r"^labels must have shape \(16,\) to match the "
                                            r"embeddings, got \(\d+,\)"):
            retrieval_over_parts(vectors, labels, ks=(1,), num_parts=2)
