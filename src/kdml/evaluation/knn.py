"""Exact, chunked k-nearest-neighbour search: faiss on the CPU, torch on a GPU.

Backend choice on the CPU: ``benchmarks/eval_scale.py`` times faiss against a chunked torch
``matmul`` + ``topk`` at SOP scale (60,502 x 512, k = 101) on the 2-core development
machine. faiss took 22-28 s and 160-220 MiB; torch took 41-52 s (1.8x) and 540 MiB.
Most of the gap is the matrix product itself (1024 queries: torch's matmul alone 0.75 s,
the whole faiss search 0.54 s, topk 0.08 s more), and torch must also hold each chunk's
full similarity rows, where faiss folds 4096 x 1024 blocks into its top-k buffers as it
goes. So vectors on the CPU are searched with faiss (see ``docs/benchmarks.md``), except
when k is a sizeable share of the references (:func:`uses_full_rows`): faiss's per-query heap
then costs more than ranking whole rows with ``torch.topk``.

Embeddings that live on a GPU are searched there (``backend="auto"``): a chunked float32
``matmul`` + ``topk`` of the same exact scores, without copying the embeddings to the host
(an H100 did the SOP-size search in 0.12 s where faiss on 16 CPU cores took 20 s).
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Literal, NamedTuple, cast, overload

import faiss
import numpy as np
import torch

from kdml.checks import check_has_values, is_positive_int
from kdml.errors import KdmlError

Metric = Literal["cosine", "euclidean"]
METRICS: tuple[str, ...] = ("cosine", "euclidean")
BACKENDS = ("auto", "faiss", "torch")
# Prepared vectors: a float32 NumPy array (faiss) or a float32 tensor on its device (torch).
Vectors = np.ndarray | torch.Tensor

# faiss computes exact k-NN in query blocks of 4096 (faiss.cvar.distance_compute_blas_query_bs)
# anyway, so chunks of that size cost no speed, and a chunk's result (4096 x k) stays small.
DEFAULT_CHUNK_SIZE = 4096
# A CPU search whose k is at least FULL_ROWS_MIN_K and at least 1 / FULL_ROWS_MAX_SHARE_INVERSE
# of the references ranks whole score rows with torch.topk (see uses_full_rows), in blocks of
# at most FULL_ROWS_BLOCK scores (128 MiB of float32).
FULL_ROWS_MIN_K = 1024
FULL_ROWS_MAX_SHARE_INVERSE = 20
FULL_ROWS_BLOCK = 2**25
# The Euclidean search's shift is the median of at most 2 * CENTRE_ROWS rows (search_centre).
CENTRE_ROWS = 8192


class KnnChunk(NamedTuple):
    """Neighbours of the queries ``start:stop``.

    ``scores`` are inner products of L2-normalized vectors (descending) for
    ``metric="cosine"`` and squared L2 distances (ascending, in the units :func:`knn_search`
    names) for ``"euclidean"``;
    ``indices`` are row indices into the reference set. Both have shape
    ``(stop - start, k_chunk)``.
    """

    start: int
    stop: int
    scores: np.ndarray
    indices: np.ndarray


def check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise KdmlError(f"metric must be one of {METRICS}, got {metric!r}")


def check_positive_int(name: str, value: int) -> None:
    """A count of the evaluation (``chunk_size``, ``neighbors``): a Python or NumPy integer
    of at least 1, not a bool."""
    if not is_positive_int(value):
        raise KdmlError(f"{name} must be a positive integer, got {value!r}")


def as_metric(name: str) -> Metric:
    """``name`` (e.g. ``eval.metric``) checked to be one of :data:`METRICS`."""
    check_metric(name)
    return cast(Metric, name)


def host_array(x: Any) -> np.ndarray:
    """``x`` as a NumPy array: a tensor detached and brought to the host, its float16 and
    bfloat16 (which NumPy cannot hold) as float32; anything else through ``np.asarray``."""
    if not isinstance(x, torch.Tensor):
        return np.asarray(x)
    tensor = x.detach().cpu()
    if tensor.is_floating_point() and tensor.dtype not in (torch.float32, torch.float64):
        tensor = tensor.float()
    return tensor.numpy()


def equal_values(embeddings: Any, reference: Any) -> bool:
    """Whether two validated ``(N, D)`` float matrices (tensors or NumPy arrays, any float
    dtypes) hold the same values: compared on the device for two tensors on one device, on
    the host otherwise. One pass over each, nothing beside the search. Lists, which the
    search takes, are read as arrays."""
    embeddings, reference = (matrix if isinstance(matrix, torch.Tensor) else np.asarray(matrix)
                             for matrix in (embeddings, reference))
    if tuple(embeddings.shape) != tuple(reference.shape):
        return False
    if (isinstance(embeddings, torch.Tensor) and isinstance(reference, torch.Tensor)
            and embeddings.device == reference.device):
        common = torch.promote_types(embeddings.dtype, reference.dtype)
        return bool(torch.equal(embeddings.detach().to(common), reference.detach().to(common)))
    return bool(np.array_equal(host_array(embeddings), host_array(reference)))


def as_float_matrix(x: Any, name: str) -> np.ndarray:
    """``x`` as a validated 2-D NumPy float array, without copying where possible.

    NumPy arrays keep a float32 or wider dtype, float16 comes as float32 (its own range and
    rounding would overflow or round a shift or a distance); tensors come to the CPU, float16
    and bfloat16 as float32. Checks the dtype, the shape, emptiness and finiteness (in the
    input's precision:
    a float64 value too large for float32 is finite here; :func:`search_scale` handles it).
    """
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            raise KdmlError(f"{name} must have a floating dtype, got {x.dtype}")
        check_has_values(name, x)
        array = host_array(x)
    else:
        array = np.asarray(x)
        if array.dtype.kind != "f":
            raise KdmlError(f"{name} must have a floating dtype, got {array.dtype}")
        if array.dtype.itemsize < 4:
            array = array.astype(np.float32)
    if array.ndim != 2:
        raise KdmlError(f"{name} must be 2-D (N, D), got shape {tuple(array.shape)}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise KdmlError(f"{name} is empty (shape {tuple(array.shape)})")
    if not np.isfinite(array).all():
        raise KdmlError(f"{name} contains NaN or infinite values")
    return array


def as_float32_matrix(x: Any, name: str) -> tuple[np.ndarray, bool]:
    """Return ``x`` as a C-contiguous float32 ``(N, D)`` array and whether it is a new buffer.

    As :func:`as_float_matrix`, and the values must fit float32 (one-line error otherwise).
    """
    array = as_float_matrix(x, name)
    converted = np.ascontiguousarray(array, dtype=np.float32)
    if converted.dtype != array.dtype and not np.isfinite(converted).all():
        raise KdmlError(f"{name} holds values beyond float32's range (|x| > 3.4e38); "
                        "rescale them")
    return converted, not np.may_share_memory(converted, array)


# Largest absolute values searched without rescaling: within them, squared distances and norms
# of vectors of up to 2^20 dimensions stay far from float32's overflow and underflow.
SAFE_MAGNITUDE = (2.0**-30, 2.0**30)


def resolve_backend(backend: str, *inputs: Any) -> str:
    """``"auto"``: torch for tensors on a GPU, else faiss."""
    if backend not in BACKENDS:
        raise KdmlError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend != "auto":
        return backend
    on_gpu = any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in inputs)
    return "torch" if on_gpu else "faiss"


def as_float_tensor(x: Any, name: str) -> torch.Tensor:
    """``x`` as a validated 2-D float tensor on its device (NumPy arrays on the CPU), with the
    checks of :func:`as_float_matrix`."""
    if not isinstance(x, torch.Tensor):
        return torch.from_numpy(as_float_matrix(x, name))
    if not x.is_floating_point():
        raise KdmlError(f"{name} must have a floating dtype, got {x.dtype}")
    check_has_values(name, x)
    tensor = x.detach()
    if tensor.dtype not in (torch.float32, torch.float64):
        tensor = tensor.float()
    if tensor.ndim != 2:
        raise KdmlError(f"{name} must be 2-D (N, D), got shape {tuple(tensor.shape)}")
    if tensor.shape[0] == 0 or tensor.shape[1] == 0:
        raise KdmlError(f"{name} is empty (shape {tuple(tensor.shape)})")
    if not bool(torch.isfinite(tensor).all()):
        raise KdmlError(f"{name} contains NaN or infinite values")
    return tensor


def _largest_magnitude(matrix: Vectors) -> float:
    """The largest absolute value of ``matrix`` (a host sync for a tensor on a GPU)."""
    if isinstance(matrix, torch.Tensor):
        return float(matrix.abs().max())
    return max(float(matrix.max()), -float(matrix.min()))


def search_scale(*arrays: Vectors) -> float:
    """A power of two to divide vectors by before a float32 search: 1 when their largest
    absolute value is within :data:`SAFE_MAGNITUDE`, else the power of two nearest to it.

    Dividing by a power of two is exact, so the ranking of the rescaled vectors is that of the
    originals; without it, squared distances of values around 1e19 overflow float32 and
    values around 1e-25 underflow it.
    """
    largest = max(_largest_magnitude(array) for array in arrays)
    low, high = SAFE_MAGNITUDE
    if largest == 0.0 or low <= largest <= high:
        return 1.0
    return float(2.0 ** np.round(np.log2(largest)))


def row_powers_of_two(x: np.ndarray) -> np.ndarray:
    """``[N]``: per row of float ``x`` ``[N, D]``, the power of two just above its largest
    absolute value (1 for a zero row). Dividing a row by it is exact and brings its values
    into (-1, 1), so that a cosine, a per-row quantity, neither underflows for a row of 1e-200
    nor overflows for one of 1e200, whatever the other rows hold (a power of two shared by all
    rows, :func:`search_scale`, cannot keep both)."""
    _, exponents = np.frexp(np.abs(x).max(axis=1, initial=0.0))
    return np.ldexp(1.0, exponents)


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """``[N, D]`` float64: each row of ``x`` at unit L2 norm, all-zero rows left at zero; as
    :func:`l2_normalize`, each row first divided by its own power of two (exact), so that its
    squares neither underflow nor overflow whatever the other rows hold. (F.normalize's floor
    of 1e-12 on the norm leaves smaller rows short of unit length.)"""
    largest = x.abs().amax(dim=1, keepdim=True).double()
    _, exponents = torch.frexp(largest)
    # divided by 2^e (a subnormal for a subnormal row), not multiplied by 2^-e, which
    # overflows there
    rows = x.double() / torch.ldexp(torch.ones_like(largest), exponents)
    norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    return rows / torch.where(norms > 0, norms, 1.0)


def l2_normalize(x: np.ndarray, inplace: bool) -> np.ndarray:
    """Scale rows to unit L2 norm; all-zero rows stay zero (similarity 0 to everything). The
    norms are summed in float64, where no float32 row's squares underflow (in float32 a row of
    norm below about 1e-19 had a norm of 0 and stayed a zero vector); a float64 row is first
    divided by its own power of two (:func:`row_powers_of_two`, exact), as its squares would
    underflow below about 1e-154 (a zero vector again) or overflow above 1e154."""
    out = x if inplace else np.empty_like(x)
    rows = np.divide(x, row_powers_of_two(x)[:, None], out=out) if x.dtype == np.float64 else x
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows, dtype=np.float64))
    norms[norms == 0] = 1.0
    np.divide(rows, norms[:, None], out=out)
    return out


def search_centre(reference: Vectors, metric: str, *others: Vectors) -> Vectors | None:
    r"""The point Euclidean vectors are searched relative to: the reference rows' median, per
    column (robust to a few far points, where a mean or a midrange would move the shift away
    from the bulk); ``None`` for cosine, which a shift would change, and where the shift of
    the reference or of ``others`` (the queries) could overflow their dtype.

    Distances do not change under a shift, but their float32 rounding does: faiss computes
    :math:`|q|^2 + |r|^2 - 2 q \cdot r`, whose error grows with the vectors' distance from the
    origin, so embeddings far from it (an offset of 1000 on unit-scale clusters) were ranked
    almost at random and every neighbour looked tied. Shifted, the error grows with their
    distance from the median instead: a cluster far from the bulk whose spread is below about
    1e-7 of that distance still ties in float32 (there is one shift for all queries), which
    ``retrieval_metrics`` re-scores in float64 and a faiss index (``kdml search``) does not.
    """
    if metric != "euclidean":
        return None
    # |x - c| <= 2 max|x|: within the dtype's range when max|x| is within half of it
    limit = float(np.finfo(np.float32 if reference.dtype in (np.float32, torch.float32)
                           else np.float64).max) / 2
    if any(_largest_magnitude(matrix) > limit for matrix in (reference, *others)):
        return None
    # any common shift is exact for the distances; every so many rows, 8,192 to 16,383 of
    # them, place it well enough at a sixth of the cost at SOP's size (1.2 s for 60,502 rows)
    rows = reference[::max(1, len(reference) // CENTRE_ROWS)]
    if isinstance(rows, torch.Tensor):
        return rows.median(dim=0).values
    return np.median(rows, axis=0)


@overload
def shifted(matrix: np.ndarray, centre: Vectors | None) -> np.ndarray: ...
@overload
def shifted(matrix: torch.Tensor, centre: Vectors | None) -> torch.Tensor: ...
def shifted(matrix: Vectors, centre: Vectors | None) -> Vectors:
    """``matrix - centre`` in the matrix's own dtype (a new array), or ``matrix`` itself for no
    centre. Rounding the centre moves every row alike, which leaves distances as they were."""
    if centre is None:
        return matrix
    if isinstance(matrix, torch.Tensor):
        return matrix - torch.as_tensor(centre, dtype=matrix.dtype, device=matrix.device)
    return matrix - np.asarray(centre, dtype=matrix.dtype)


@overload
def to_search_vectors(array: np.ndarray, scale: float, metric: str) -> np.ndarray: ...
@overload
def to_search_vectors(array: torch.Tensor, scale: float, metric: str) -> torch.Tensor: ...
def to_search_vectors(array: Vectors, scale: float, metric: str) -> Vectors:
    """``array / scale`` as C-contiguous float32, or for ``metric="cosine"`` the L2-normalized
    rows, each brought to unit norm on its own (``scale`` unused: one power of two shared by
    all rows had made a row of 1e-200 beside one of 1e200 a zero vector).

    Copies at most once: a float32 input that needs no change is returned as it is.
    """
    if metric == "cosine":
        scale = 1.0
    if isinstance(array, torch.Tensor):
        vectors = array / scale if scale != 1.0 else array
        if metric == "cosine":
            # as l2_normalize: each row divided by its own power of two (exact), then in
            # float64, before float32 rounds a tiny row to zero, and all-zero rows left at
            # zero (F.normalize's floor of 1e-12 on the norm left smaller rows short of unit
            # length)
            vectors = unit_rows(vectors)
        return vectors.float().contiguous()
    owned = False
    if scale != 1.0:
        array, owned = array / scale, True
    if metric == "cosine" and array.dtype != np.float32:
        # normalised before float32 rounds a tiny row's values to zero (a float64 row of norm
        # 1e-50 among unit ones); then again in float32 below, for unit norms after rounding
        array = l2_normalize(np.asarray(array, dtype=np.float64),
                             inplace=owned and array.dtype == np.float64)
        owned = True
    converted = np.ascontiguousarray(array, dtype=np.float32)
    owned = owned or not np.may_share_memory(converted, array)
    if metric == "cosine":
        converted = l2_normalize(converted, inplace=owned)
    return converted


@overload
def prepare_vectors(x: Any, metric: str, name: str,
                    backend: Literal["faiss"] = "faiss") -> np.ndarray: ...
@overload
def prepare_vectors(x: Any, metric: str, name: str, backend: str) -> Vectors: ...
def prepare_vectors(x: Any, metric: str, name: str, backend: str = "faiss") -> Vectors:
    """Validated float32 vectors ready for the search (a NumPy array for faiss, a tensor on
    its device for torch): shifted by their median (:func:`search_centre`) for
    ``metric="euclidean"``, rescaled by :func:`search_scale`, and L2-normalized for
    ``metric="cosine"``. Either way a new array: a memory-mapped input is read into memory."""
    matrix: Vectors = as_float_tensor(x, name) if backend == "torch" else as_float_matrix(
        x, name)
    matrix = shifted(matrix, search_centre(matrix, metric))
    return to_search_vectors(matrix, search_scale(matrix) if metric == "euclidean" else 1.0,
                             metric)


@overload
def prepare_pair(queries: Any, reference: Any, metric: str, names: tuple[str, str] = ...,
                 backend: Literal["faiss"] = "faiss") -> tuple[np.ndarray, np.ndarray]: ...
@overload
def prepare_pair(queries: Any, reference: Any, metric: str, names: tuple[str, str],
                 backend: str) -> tuple[Vectors, Vectors]: ...
def prepare_pair(queries: Any, reference: Any, metric: str, names: tuple[str, str] = (
        "queries", "reference"), backend: str = "faiss") -> tuple[Vectors, Vectors]:
    """Queries and reference ready for the search: for ``metric="euclidean"`` both shifted by
    the reference's median, and both rescaled by one common factor (Euclidean distances between
    the two sets must keep their ratios)."""
    query_matrix: Vectors
    reference_matrix: Vectors
    if backend == "torch":
        query_matrix = as_float_tensor(queries, names[0])
        reference_matrix = as_float_tensor(reference, names[1]).to(query_matrix.device)
    else:
        query_matrix = as_float_matrix(queries, names[0])
        reference_matrix = as_float_matrix(reference, names[1])
    _check_dimensions(query_matrix, reference_matrix, names)
    # one dtype for both: the centre rounded to float32 for one and float64 for the other
    # would move every query against the reference, far beyond the tie tolerance
    query_matrix, reference_matrix = _in_one_dtype(query_matrix, reference_matrix)
    centre = search_centre(reference_matrix, metric, query_matrix)
    query_matrix, reference_matrix = shifted(query_matrix, centre), shifted(reference_matrix,
                                                                             centre)
    scale = search_scale(query_matrix, reference_matrix) if metric == "euclidean" else 1.0
    return (to_search_vectors(query_matrix, scale, metric),
            to_search_vectors(reference_matrix, scale, metric))


def _in_one_dtype(queries: Vectors, reference: Vectors) -> tuple[Vectors, Vectors]:
    """Both matrices in the wider of their two float dtypes (the narrower one copied)."""
    if isinstance(queries, torch.Tensor) and isinstance(reference, torch.Tensor):
        wide = torch.promote_types(queries.dtype, reference.dtype)
        return queries.to(wide), reference.to(wide)
    query_array, reference_array = np.asarray(queries), np.asarray(reference)
    wide_dtype = np.result_type(query_array.dtype, reference_array.dtype)
    return (query_array.astype(wide_dtype, copy=False),
            reference_array.astype(wide_dtype, copy=False))


def _check_dimensions(queries: Vectors, reference: Vectors, names: tuple[str, str]) -> None:
    if reference.shape[1] != queries.shape[1]:
        raise KdmlError(f"{names[0]} have dimension {queries.shape[1]} but {names[1]} has "
                        f"{reference.shape[1]}")


def _search(
    queries: Vectors, reference: Vectors, k: int, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(queries, torch.Tensor) and isinstance(reference, torch.Tensor):
        return _torch_search(queries, reference, k, metric)
    if not isinstance(queries, np.ndarray) or not isinstance(reference, np.ndarray):
        raise TypeError("queries and reference must both be tensors or both be arrays")
    if uses_full_rows(k, len(reference)):
        return _torch_search_in_blocks(queries, reference, k, metric)
    # faiss.knn is the brute-force search behind IndexFlatIP / IndexFlatL2, without
    # copying the reference into an index first.
    faiss_metric = faiss.METRIC_INNER_PRODUCT if metric == "cosine" else faiss.METRIC_L2
    return faiss.knn(queries, reference, k, faiss_metric)


def uses_full_rows(k: int, num_reference: int) -> bool:
    """Whether a CPU search of the top ``k`` of ``num_reference`` goes through whole score
    rows and ``torch.topk`` rather than faiss: faiss keeps each query's top k in a heap, at
    ``log k`` per candidate, which loses once k is a sizeable share of the reference (MAP@R
    on a few large classes, such as Fashion-MNIST's 5 test classes of 7,000; see
    ``benchmarks/eval_few_classes.py``)."""
    return k >= FULL_ROWS_MIN_K and k * FULL_ROWS_MAX_SHARE_INVERSE >= num_reference


def _torch_search_in_blocks(queries: np.ndarray, reference: np.ndarray, k: int,
                            metric: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_torch_search` on host arrays (shared, not copied), in blocks of queries whose
    score rows hold at most :data:`FULL_ROWS_BLOCK` floats."""
    reference_tensor = _shared_tensor(reference)
    rows = max(1, FULL_ROWS_BLOCK // len(reference))
    results = [_torch_search(_shared_tensor(queries[start:start + rows]), reference_tensor,
                             k, metric) for start in range(0, len(queries), rows)]
    return (np.concatenate([scores for scores, _ in results]),
            np.concatenate([indices for _, indices in results]))


def _torch_search(queries: torch.Tensor, reference: torch.Tensor, k: int,
                  metric: str) -> tuple[np.ndarray, np.ndarray]:
    """faiss's results with torch: inner products (descending) or squared L2 distances
    (ascending, as ``|q|^2 + |r|^2 - 2 q.r``), float32, top ``k`` of each row. In full float32
    whatever the caller's matmul precision says: TF32's (or bf16's) products would put errors
    far beyond the tie tolerance, which the float64 re-scoring could not repair."""
    # The device's own backend setting, set and put back: torch's global
    # set_float32_matmul_precision had raised where the caller used the per-backend API
    # (torch.backends.cuda.matmul.fp32_precision = "tf32", PyTorch's advice), and had left
    # both backends at "ieee" after it, where "none" lets torch.backends.fp32_precision rule.
    backends: Any = torch.backends  # the stubs lack mkldnn.matmul
    backend = (backends.cuda if queries.device.type == "cuda" else backends.mkldnn).matmul
    previous = backend.fp32_precision
    backend.fp32_precision = "ieee"
    try:
        products = queries @ reference.T
    finally:
        backend.fp32_precision = previous
    if metric == "cosine":
        scores, indices = products.topk(k, dim=1)
    else:
        distances = (queries.pow(2).sum(1)[:, None] + reference.pow(2).sum(1)[None, :]
                     - 2.0 * products).clamp_min_(0.0)
        scores, indices = distances.topk(k, dim=1, largest=False)
    return scores.cpu().numpy(), indices.cpu().numpy()


def _shared_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array``'s memory. A read-only array (a memory-mapped ``.npy``) makes
    torch warn that writing to it is undefined; the search only reads it, and copying the
    reference to silence the warning would double its memory."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def drop_self(
    scores: np.ndarray, indices: np.ndarray, self_indices: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Remove each row's own index from a ``(n, k + 1)`` result, leaving ``(n, k)``.

    Exact duplicates of a query tie with it, so the query is not necessarily in the
    first column; when it is not among the ``k + 1`` at all (more than ``k``
    duplicates), the last column is dropped instead.
    """
    is_self = indices == self_indices[:, None]
    is_self[~is_self.any(axis=1), -1] = True
    keep = ~is_self
    n, width = indices.shape
    return scores[keep].reshape(n, width - 1), indices[keep].reshape(n, width - 1)


def knn_search(
    queries: Any,
    reference: Any | None = None,
    k: int | Sequence[int] | np.ndarray = 1,
    metric: Metric = "cosine",
    exclude_self: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[KnnChunk]:
    r"""Exact k-nearest neighbours of ``queries`` in ``reference``, one query chunk at a time.

    Queries are searched in chunks of ``chunk_size`` rows with a brute-force faiss
    search, so the memory held at once is ``O(chunk_size * k)`` plus the (normalized)
    vectors, never ``O(N^2)``.

    Args:
        queries: ``(Nq, D)`` float array or tensor.
        reference: ``(Nr, D)`` float array or tensor; ``None`` searches ``queries``
            against themselves.
        k: neighbours per query. Either one int, or one int per query (shape
            ``(Nq,)``): then each chunk searches the largest ``k`` of its queries and
            returns that many columns, so chunks may differ in width.
        metric: ``"cosine"`` (rows L2-normalized, largest inner product first) or
            ``"euclidean"`` (smallest squared L2 distance first).
        exclude_self: drop query ``i``'s own row ``i`` of the reference from its
            neighbours (leave-one-out); requires ``reference`` to be ``None`` or to
            have the same rows as ``queries``. ``k`` then counts neighbours other
            than the query.
        chunk_size: queries per search.

    Returns:
        An iterator of :class:`KnnChunk` ``(start, stop, scores, indices)`` covering
        the queries in order; ``scores`` (float32) and ``indices`` (int64) have shape
        ``(stop - start, k_chunk)``. Euclidean scores are the squared distances of the
        vectors as searched: shifted (which changes no distance) and divided by
        :func:`search_scale`, a power of two that is 1 unless the largest absolute value lies
        outside :data:`SAFE_MAGNITUDE` (then multiply them by its square for the inputs'
        units), in float32 as :math:`|q|^2 + |r|^2 - 2 q \cdot r`: recompute a distance
        whose value matters in float64.

    Example:
        >>> x = np.random.default_rng(0).standard_normal((100, 16)).astype(np.float32)
        >>> chunks = knn_search(x, k=5, metric="euclidean", exclude_self=True)
        >>> indices = np.concatenate([c.indices for c in chunks])
        >>> indices.shape
        (100, 5)
    """
    check_metric(metric)
    check_positive_int("chunk_size", chunk_size)
    if not isinstance(exclude_self, bool | np.bool_):  # -1 had raised an IndexError
        raise KdmlError(f"exclude_self must be True or False, got {exclude_self!r}")
    refuse_count_as_reference(reference)
    if reference is None:
        query_vectors = reference_vectors = prepare_vectors(queries, metric, "queries")
    else:
        query_vectors, reference_vectors = prepare_pair(queries, reference, metric)
    num_queries, num_reference = len(query_vectors), len(reference_vectors)
    if exclude_self and num_reference != num_queries:
        raise KdmlError(
            f"exclude_self needs the reference to be the queries, got {num_queries} "
            f"queries and {num_reference} references"
        )
    if exclude_self and reference is not None and not equal_values(queries, reference):
        # as many rows of other values: each query's row i, its true neighbour, was dropped
        raise KdmlError("exclude_self needs the reference to be the queries, but it holds "
                        "other values; leave reference out to search the queries among "
                        "themselves, or drop exclude_self")
    ks = np.asarray(k)
    if ks.ndim > 1 or ks.size not in (1, num_queries):  # numpy's broadcast error names neither
        raise KdmlError(f"k must be one int or one per query ({num_queries},), got shape "
                        f"{ks.shape}")
    ks = np.broadcast_to(ks, (num_queries,))
    if ks.dtype.kind not in "iu":
        raise KdmlError(f"k must be an integer or integers, got dtype {ks.dtype}")
    available = num_reference - int(exclude_self)
    if ks.min() < 1 or ks.max() > available:
        raise KdmlError(
            f"k must be between 1 and the {available} available references, "
            f"got {int(ks.min())}..{int(ks.max())}"
        )
    return search_prepared(query_vectors, reference_vectors, ks, metric, exclude_self, chunk_size)


def refuse_count_as_reference(reference: Any) -> None:
    """Refuse a number given as ``reference``: ``knn_search(x, 5)``, the call of faiss's
    ``index.search(x, k)``, passes the neighbour count as the reference set, which had been
    refused as "reference must have a floating dtype, got int64" (or, for 5.0, "must be 2-D")
    without naming ``k``."""
    if isinstance(reference, numbers.Number | np.number):
        # 5, not np.int64(5)
        shown = reference.item() if isinstance(reference, np.number) else reference
        raise KdmlError(f"knn_search: reference must be (Nr, D) embeddings, got the number "
                        f"{shown!r}; the neighbour count is k, the third argument: "
                        f"knn_search(queries, k={shown!r})")


def search_prepared(
    query_vectors: Vectors,
    reference_vectors: Vectors,
    ks: np.ndarray,
    metric: str,
    exclude_self: bool,
    chunk_size: int,
) -> Iterator[KnnChunk]:
    """The chunk loop of :func:`knn_search`, on vectors from :func:`prepare_vectors`.

    No validation: ``ks`` holds one valid k per query. Separate from ``knn_search`` so
    that callers which already prepared the vectors do not normalize them twice, and
    so that ``knn_search`` validates at call time rather than on first iteration.
    """
    for start in range(0, len(query_vectors), chunk_size):
        stop = min(start + chunk_size, len(query_vectors))
        k_chunk = int(ks[start:stop].max())
        scores, indices = _search(
            query_vectors[start:stop], reference_vectors, k_chunk + int(exclude_self), metric
        )
        if exclude_self:
            scores, indices = drop_self(scores, indices, np.arange(start, stop))
        yield KnnChunk(start, stop, scores, indices)


def search_rows(query_vectors: Vectors, rows: np.ndarray, reference_vectors: Vectors,
                k: int, metric: str, exclude_self: bool) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` of the queries at ``rows`` (their own row left out with
    ``exclude_self``): scores and indices ``(len(rows), k)``."""
    if isinstance(query_vectors, torch.Tensor):
        selected = query_vectors[torch.as_tensor(rows, device=query_vectors.device)]
    else:
        selected = query_vectors[rows]
    scores, indices = _search(selected, reference_vectors, k + int(exclude_self), metric)
    if exclude_self:
        scores, indices = drop_self(scores, indices, rows)
    return scores, indices
