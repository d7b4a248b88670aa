"""Input checks and boundaries of the verification and re-identification protocols
(kdml.evaluation.verification, kdml.evaluation.reid) that the other protocol tests leave open:
each bad input is a one-line KdmlError, and the tie tolerance and scaling hold at their edges."""

from __future__ import annotations

import numpy as np
import pytest

from kdml.errors import KdmlError
from kdml.evaluation.reid import TIE_TOLERANCE, match_ranks, single_shot_cmc
from kdml.evaluation.verification import pair_scores, verification_accuracy

# ----------------------------------------------------------------- verification


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scores": [True, False, True, False], "same": [1, 0, 1, 0], "num_folds": 2},
     "^scores must be numbers, got dtype bool$"),
    ({"scores": [0.1, 0.2, 0.3], "same": [1, 0, 1], "num_folds": 1},
     r"^num_folds must be an integer from 2 to the number of pairs \(3\), got 1$"),
    ({"scores": [0.1, 0.2, 0.3, 0.4], "same": [1, 0, 1, 0], "folds": [True, False, True, False]},
     r"^folds must be integers of shape \(4,\)$"),
    ({"scores": [[0.1, 0.2], [0.3, 0.4]], "same": [[1, 0], [1, 0]], "num_folds": 2},
     r"^scores and same must be 1-D of one length, got \(2, 2\) and \(2, 2\)$"),
])
def test_verification_refuses_bad_inputs_in_one_line(kwargs, message):
    """Boolean scores or folds are not numbers or fold ids; one fold has no training pairs;
    a matrix of scores is not a pair list."""
    with pytest.raises(KdmlError, match=message):
        verification_accuracy(**kwargs)


def test_pair_scores_refuse_non_finite_values_in_either_side():
    with pytest.raises(KdmlError, match="^pair embeddings contain NaN or infinite values$"):
        pair_scores(np.ones((2, 3)), np.array([[1.0, np.nan, 1.0], [1.0, 1.0, 1.0]]))
    with pytest.raises(KdmlError, match="^pair embeddings contain NaN or infinite values$"):
        pair_scores(np.ones((1, 2)), np.array([[np.inf, 1.0]]), metric="euclidean")


def test_pair_scores_refuse_vectors_that_are_not_pair_matrices():
    with pytest.raises(KdmlError, match=r"must both be \(P, D\), got \(3,\) and \(3,\)"):
        pair_scores(np.zeros(3), np.zeros(3))
    with pytest.raises(KdmlError, match=r"must both be \(P, D\), got \(1, 2, 2\)"):
        pair_scores(np.zeros((1, 2, 2)), np.zeros((1, 2, 2)))


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_pair_scores_of_no_pairs_are_empty(metric):
    got = pair_scores(np.zeros((0, 3)), np.zeros((0, 3)), metric=metric)
    assert got.shape == (0,) and got.dtype == np.float64


# ----------------------------------------------------------------- re-identification


@pytest.mark.parametrize(("call", "message"), [
    (lambda: match_ranks(np.zeros((2, 2)), [0, 1], np.zeros((2, 3)), [0, 1]),
     r"^probe and gallery must be \(P, D\) and \(G, D\), got \(2, 2\) and \(2, 3\)$"),
    (lambda: match_ranks(np.zeros((2, 2)), np.array([[0], [1]]), np.zeros((2, 2)), [0, 1]),
     "^identity labels must be 1-D and match the embeddings$"),
    (lambda: match_ranks(np.zeros((2, 2)), [0, 1], np.zeros((2, 2)), np.array([[0], [1]])),
     "^identity labels must be 1-D and match the embeddings$"),
    (lambda: match_ranks(np.zeros((2, 2)), [0, 1], np.eye(2), [0, 1], metric="manhattan"),
     "^metric must be euclidean or cosine, got 'manhattan'$"),
    (lambda: single_shot_cmc(np.eye(4), [0, 0, 1, 1], ranks=()),
     r"^ranks must be a sequence of positive integers, e\.g\. \(1, 5\), got \(\)$"),
    (lambda: single_shot_cmc(np.eye(4), np.array([[0], [0], [1], [1]])),
     r"^embeddings must be \(N, D\) with \(N,\) identities, got \(4, 4\) and \(4, 1\)$"),
    (lambda: single_shot_cmc(np.eye(4), [0, 0, 1, 1], cameras=np.array([[0], [1], [0], [1]])),
     r"^cameras must have shape \(4,\), got \(4, 1\)$"),
])
def test_reid_refuses_bad_inputs_in_one_line(call, message):
    """Mismatched dimensions, label arrays that are not 1-D, an unknown metric and no ranks:
    each a KdmlError naming the input, not a SciPy or NumPy error (or, for an unknown metric,
    the cosine distance used silently)."""
    with pytest.raises(KdmlError, match=message):
        call()


def test_a_distance_exactly_at_the_tie_tolerance_ties():
    """Euclidean: the other entry sits at 1 + 1e-12, exactly the true match's distance 1 plus
    TIE_TOLERANCE times it: "within the tolerance" includes the bound."""
    other = 1.0 + TIE_TOLERANCE * 1.0
    assert other > 1.0
    ranks = match_ranks(np.array([[0.0]]), [0], np.array([[1.0], [other]]), [0, 1])
    assert ranks.tolist() == [2]
    # three times the tolerance away: a distinct, farther entry
    beyond = match_ranks(np.array([[0.0]]), [0], np.array([[1.0], [1 + 3 * TIE_TOLERANCE]]),
                         [0, 1])
    assert beyond.tolist() == [1]


def test_a_cosine_tie_at_distance_zero_is_absolute():
    """The probe's match is 3d (cosine distance 0 in float64) and another entry d itself
    (1.1e-16 after rounding): equal in exact arithmetic, so a tie however small the true
    distance (the cosine tolerance is absolute, not relative to the true distance)."""
    d = np.array([0.1, -0.54, 0.36])
    ranks = match_ranks(d[None], [0], np.stack([3 * d, d]), [0, 1], metric="cosine")
    assert ranks.tolist() == [2]


def test_float32_embeddings_are_ranked_in_float64():
    """g and its cyclic shift have equal cosines to (1, 1, 1) in exact arithmetic; float32
    arithmetic leaves them 2e-7 apart (no tie), float64 within the tolerance (a tie)."""
    g = np.array([-2.325, -0.219, -1.246], dtype=np.float32)
    gallery = np.stack([g, np.roll(g, 1)])
    probe = np.ones((1, 3), dtype=np.float32)
    assert match_ranks(probe, [0], gallery, [0, 1], metric="cosine").tolist() == [2]
    assert match_ranks(probe, [1], gallery, [0, 1], metric="cosine").tolist() == [2]


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_a_gallery_far_larger_than_the_probes_is_scaled_too(metric):
    """One power of two for both sides: a 1e160 gallery beside unit probes had squared
    distances of 1e320 (inf, all tied) if only the probes set it. Both probes are nearest
    the first entry by distance, and each nearest its own match by angle."""
    probe = np.array([[0.0, 1.0], [0.0, -1.0]])
    gallery = np.array([[1e160, 1e160], [-1e160, -3e160]])
    ranks = match_ranks(probe, [0, 1], gallery, [0, 1], metric=metric)
    assert ranks.tolist() == ([1, 2] if metric == "euclidean" else [1, 1])


def test_reid_takes_binary_codes_as_floats():
    """Boolean codes are embeddings too (as the docstring says): scored as their 0/1 floats."""
    codes = np.array([[1, 0, 0], [1, 0, 1], [0, 1, 0], [0, 1, 1], [1, 1, 0], [1, 1, 1]], bool)
    ids = [0, 0, 1, 1, 2, 2]
    assert single_shot_cmc(codes, ids, num_splits=3, ranks=(1, 2)) == single_shot_cmc(
        codes.astype(np.float64), ids, num_splits=3, ranks=(1, 2))
    assert match_ranks(codes[::2], [0, 1, 2], codes[1::2], [0, 1, 2]).tolist() == [1, 1, 1]
