r"""Retrieval scores when neighbours are tied: each tie counts as its expectation over random
orders of the tied neighbours.

A query's ranked neighbours fall into tie groups: consecutive neighbours whose float32 scores
differ by at most a few ulps of their scale (:func:`tie_tolerance`), which
:mod:`kdml.evaluation.rescoring` then re-orders and splits by their float64 keys, so that only
neighbours equal within the keys' float64 rounding stay tied. Ordering a group at random,
a neighbour in group :math:`G` (size :math:`g`, with :math:`h` relevant members, starting after
:math:`a` neighbours of which :math:`b` are relevant) at 0-based position :math:`p` has

.. math::
    E[\mathrm{rel}(p)] = \frac{h}{g}, \qquad
    E[\mathrm{rel}(p)\, \mathrm{hits}(p)] = \frac{h}{g}(b + 1)
        + (p - a)\,\frac{h(h - 1)}{g(g - 1)},

where :math:`\mathrm{hits}(p)` counts the relevant neighbours up to and including :math:`p`.
Then, exactly:

- :math:`E[\mathrm{Recall@K}] = 1` if :math:`b > 0` for the group holding rank :math:`K`, else
  :math:`1 - \binom{g - h}{m} / \binom{g}{m}` with :math:`m = K - a` of its members ranked;
- :math:`E[\mathrm{R\text{-}Precision}] = \frac{1}{R} \sum_{p < R} h_p / g_p`;
- :math:`E[\mathrm{MAP@R}] = \frac{1}{R} \sum_{p < R} E[\mathrm{rel}(p)\,\mathrm{hits}(p)]
  / (p + 1)`.

Without ties every group has :math:`g = 1` and these are the usual values, so the scores never
depend on the order of the samples. For 500 identical embeddings in 50 classes of 10,
Recall@1 is :math:`9/499` and Recall@8 :math:`1 - \binom{490}{8}/\binom{499}{8} \approx 0.137`.
"""

from __future__ import annotations

import numpy as np

# Float32 ulps of their scale that the vectors' own preparation can move two scores apart: the
# same vector scaled and normalised lands up to 2 ulps away (faiss gives identical vectors
# bit-identical scores). The search's sums add search_error_ulps to it.
TIE_ULPS = 4.0

# Draws from a tie group up to which the chance of drawing no hit is a product of its factors
# (_choose_ratio): at most this many passes over the tied rows, a fraction of a second for
# SOP's 60,502 queries all tied (a collapsed embedding)
EXACT_TAKEN = 256


def search_error_ulps(dim: int, metric: str) -> float:
    r"""A bound, in float32 ulps (``eps``) of the scores' scale, on how far rounding in the
    float32 search can move the gap between two neighbours' scores: a dot product of ``dim``
    terms, summed in any order (BLAS blocks it as it likes), is within
    :math:`\gamma_d |q| |r|`, :math:`\gamma_d \approx d\,u = d\,\mathrm{eps} / 2`, of the
    exact one (Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, Sec. 3.1), so
    the gap of two inner products is within :math:`d` ulps; faiss's squared L2 distance
    :math:`|q|^2 + |r|^2 - 2 q \cdot r` adds the norms' sums and two roundings, within
    :math:`2(d + 2)`. Typical errors are near :math:`\sqrt{d}` ulps, but a fixed few ulps
    let float32 order some neighbours that exact arithmetic orders the other way (4 ulps at
    d = 512: 10 of 4,000 queries whose true gap is 1 ulp)."""
    return float(dim) if metric == "cosine" else 2.0 * (dim + 2)


def tie_tolerance(query_norms: np.ndarray, neighbour_norms: np.ndarray,
                  metric: str, dim: int) -> np.ndarray:
    r"""Tolerance ``[n, w]`` between neighbour ``j`` and ``j - 1`` of each query: TIE_ULPS
    plus :func:`search_error_ulps` float32 ulps of the scale of their scores,
    :math:`|q| \max(|r_{j-1}|, |r_j|)` for inner products and
    :math:`|q|^2 + \max(|r_{j-1}|, |r_j|)^2` for squared L2 distances. Gaps within it are
    re-scored in float64 (:mod:`kdml.evaluation.rescoring`): beyond it, float32's order is
    exact arithmetic's.

    Args:
        query_norms: ``[n]`` L2 norms of the (searched) queries.
        neighbour_norms: ``[n, w]`` L2 norms of their ranked neighbours.
        dim: the vectors' dimension (the length of the search's sums).
    """
    eps = float(np.finfo(np.float32).eps)
    pair_norms = neighbour_norms.astype(np.float64, copy=True)
    pair_norms[:, 1:] = np.maximum(pair_norms[:, 1:], pair_norms[:, :-1])
    if metric == "cosine":
        scale = query_norms[:, None] * pair_norms
    else:
        scale = query_norms[:, None] ** 2 + pair_norms**2
    return (TIE_ULPS + search_error_ulps(dim, metric)) * eps * scale


def continues_group(scores: np.ndarray, tolerance: np.ndarray) -> np.ndarray:
    """``[n, w]`` bool: neighbour ``j`` is tied with neighbour ``j - 1`` (column 0: False);
    ``tolerance`` is ``[n, w]`` (:func:`tie_tolerance`)."""
    return continues_from_gaps(score_gaps(scores), tolerance)


def score_gaps(scores: np.ndarray) -> np.ndarray:
    """``[n, w - 1]`` float64: the gap between each neighbour's score and the one before."""
    return np.abs(np.diff(scores.astype(np.float64), axis=1))


def continues_from_gaps(gaps: np.ndarray, tolerance: np.ndarray) -> np.ndarray:
    """:func:`continues_group` from :func:`score_gaps` already computed."""
    continues = np.zeros((len(gaps), gaps.shape[1] + 1), dtype=bool)
    continues[:, 1:] = gaps <= tolerance[:, 1:]
    return continues


def tied_positions(continues: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, columns, opens)`` of the ranks in a tie group, row-major (each group's members
    in order): a rank is tied when it continues a group or the next rank does; ``opens`` marks
    each group's first rank."""
    in_group = continues.copy()
    in_group[:, :-1] |= continues[:, 1:]
    rows, columns = np.nonzero(in_group)
    return rows, columns, ~continues[rows, columns]


def group_reaches_last_column(continues: np.ndarray, needed: np.ndarray) -> np.ndarray:
    """``[n]`` bool: the tie group holding rank ``needed`` (1-based) also holds the last
    column, so it may go on beyond the neighbours retrieved."""
    return _group_starts(continues)[:, -1] <= needed - 1


def last_group_settled(is_hit: np.ndarray, continues: np.ndarray,
                       num_relevant: np.ndarray) -> np.ndarray:
    """``[n]`` bool: no retrieval score depends on the members of the tie group holding the
    last column beyond the retrieved ones, nor on how many there are. So it is where either

    - all ``num_relevant`` (R) relevant neighbours are ranked before the group: its members
      are all irrelevant, its relevant share 0 whatever its size; or
    - the group starts at rank R or later (MAP@R and R-Precision read ranks before it) after a
      relevant neighbour: every Recall@K whose rank K it holds is 1 whatever its members.
    """
    starts = _group_starts(continues)[:, -1]
    before = np.arange(is_hit.shape[1]) < starts[:, None]
    found_before = (is_hit & before).sum(axis=1)
    return (found_before >= num_relevant) | ((num_relevant <= starts) & (found_before > 0))


def row_totals(terms: np.ndarray) -> np.ndarray:
    """``[n]`` float64 sums of the rows of ``terms`` ``[n, w]`` (overwritten), added left to
    right: the same value whatever zero columns follow. A query's row is as wide as the
    largest R among the queries scored with it, and ``np.sum``'s pairwise blocks, which
    depend on the width, had moved its MAP@R or R-Precision in the last digit with the
    ``chunk_size`` (or a tie's re-search), which the scores are documented not to depend on."""
    if not terms.shape[1]:
        return np.zeros(len(terms))
    return np.cumsum(terms, axis=1, out=terms)[:, -1]


def expected_scores(is_hit: np.ndarray, continues: np.ndarray, ks: tuple[int, ...],
                    num_relevant: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Expected Recall@K (``[len(ks), n]``), average precision at R and R-Precision (``[n]``)
    of ranked neighbours with tie groups (see the module docstring).

    A neighbour outside every tie group scores as in the plain definition, so the plain
    terms are computed for every rank and replaced at the tied ranks only: a query with 7,000
    neighbours has a few float32 ties among them, not 7,000.

    Args:
        is_hit: ``[n, w]`` bool, neighbour ``j`` is relevant. Every tie group that holds one of
            the first ``max(max(ks), R)`` ranks must be complete within the ``w`` columns.
        continues: ``[n, w]`` bool from :func:`continues_group`.
        ks: the K of Recall@K, each at most ``w``.
        num_relevant: ``[n]`` R per query (0 for lone queries, whose scores are 0).
    """
    n, width = is_hit.shape
    found = np.cumsum(is_hit, axis=1, dtype=np.int64)  # hits(p): relevant up to and with p
    r = np.maximum(num_relevant, 1)
    r_width = int(num_relevant.max()) if n else 0
    in_r = np.arange(r_width) < num_relevant[:, None]
    rel = is_hit[:, :r_width] & in_r
    # Per-rank terms of AP@R (rel(p) hits(p) / (p + 1)) and R-Precision (rel(p)), replaced by
    # their expectations at the tied ranks before summing, so that each sum is the same
    # whatever order the tied neighbours came in.
    ap_terms = np.where(rel, found[:, :r_width], 0) / np.arange(1, r_width + 1)
    rp_terms = rel.astype(np.float64)
    recall = np.stack([found[:, k - 1] > 0 for k in ks]).astype(np.float64)

    rows, columns, opens = tied_positions(continues)
    if not len(rows):
        return recall, row_totals(ap_terms) / r, row_totals(rp_terms) / r
    group = np.cumsum(opens) - 1  # group number of each tied position
    start = columns[opens][group]  # a
    size = np.bincount(group).astype(np.float64)[group]  # g
    hit = is_hit[rows, columns]
    group_hits = np.bincount(group, weights=hit)[group]  # h
    before = found[rows, start] - is_hit[rows, start]  # b
    expected_rel = group_hits / size
    expected_rel_hits = (expected_rel * (before + 1)
                         + (columns - start) * group_hits * (group_hits - 1) / (size * (size - 1)))
    counted = columns < num_relevant[rows]
    ap_terms[rows[counted], columns[counted]] = (expected_rel_hits[counted]
                                                 / (columns[counted] + 1))
    rp_terms[rows[counted], columns[counted]] = expected_rel[counted]
    for position, k in enumerate(ks):
        at_k = columns == k - 1  # the group holding rank K, in the rows where it is tied
        taken = k - start[at_k]
        recall[position, rows[at_k]] = np.where(
            before[at_k] > 0, 1.0,
            1.0 - _choose_ratio(size[at_k] - group_hits[at_k], size[at_k], taken))
    return recall, row_totals(ap_terms) / r, row_totals(rp_terms) / r


def _group_starts(continues: np.ndarray) -> np.ndarray:
    """``[n, w]``: the first column of the tie group of each column."""
    columns = np.broadcast_to(np.arange(continues.shape[1]), continues.shape)
    return np.maximum.accumulate(np.where(continues, 0, columns), axis=1)


def _choose_ratio(misses: np.ndarray, total: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """:math:`\\binom{misses}{taken} / \\binom{total}{taken}`: the chance that ``taken`` members
    drawn from a group of ``total`` are all misses (0 when ``taken > misses``).

    Up to :data:`EXACT_TAKEN` draws it is the product :math:`\\prod_{i < taken} (misses - i) /
    (total - i)`, correctly rounded per factor and exactly 1 for a group without hits (through
    ``exp(gammaln(...))`` it had been off by up to 1e-10, and a Recall@K of such a group read
    -4.4e-16); beyond, the log-gamma form, clipped to [0, 1]."""
    possible = taken <= misses
    ratio = np.zeros(len(misses), dtype=np.float64)
    exact = possible & (taken <= EXACT_TAKEN)
    if exact.any():
        hits_free, group, draws = (misses[exact].astype(np.float64),
                                   total[exact].astype(np.float64), taken[exact])
        product = np.ones(len(group), dtype=np.float64)
        for i in range(int(draws.max())):
            # the denominator kept >= 1 where the factor is not used (i >= draws)
            product *= np.where(i < draws, (hits_free - i) / np.maximum(group - i, 1.0), 1.0)
        ratio[exact] = product
    large = possible & ~exact
    if large.any():
        # imported here: scipy.special is 0.3 s of the start-up of every kdml command that
        # scores, for tie groups that few embeddings have
        from scipy.special import gammaln

        m, t, k = misses[large], total[large], taken[large]
        log_ratio = (gammaln(m + 1) - gammaln(m - k + 1) - gammaln(t + 1) + gammaln(t - k + 1))
        ratio[large] = np.clip(np.exp(log_ratio), 0.0, 1.0)
    return ratio
