"""Search indexes of a trained run's embeddings, with faiss (``kdml index``, ``kdml search``).

An index folder holds ``index.faiss`` (or, for an Atlas run, ``chart_<i>.faiss``, one per
chart, since points of different charts are infinitely far apart), ``items.npz`` (the labels,
dataset positions and sources of the indexed samples) and ``index.json``: the metric, the
dimension, the kind, the vectors' rescaling factor and the fingerprint of the run's checkpoint,
so that a query embedded by another model is refused (with the run folder, checkpoint file and
epoch, for saying which) and the sha256 of each of its files, all checked against the faiss
files when loaded.

Kinds: ``exact`` (brute force in float32: the evaluation's ranking, except among neighbours
within float32 rounding of each other, which the evaluation re-scores in float64), ``ivf``
(an inverted file: k-means cells, ``4 sqrt(N)`` of them but at least 39 points each, searching
16; below 78 points, one cell, searched exactly) and ``hnsw`` (a graph, 32 links per node,
searched with a candidate list of ``max(64, 2k)``), the usual faiss choices for galleries of
millions; both approximate.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import secrets
import shutil
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from kdml.checks import is_count, is_finite_number
from kdml.errors import KdmlError, check_not_a_link
from kdml.evaluation.knn import (
    SAFE_MAGNITUDE,
    as_float_matrix,
    l2_normalize,
    search_centre,
    search_scale,
    shifted,
    to_search_vectors,
)
from kdml.file_digest import file_sha256
from kdml.file_write import error_about, hidden_name

INDEX_KINDS = ("exact", "ivf", "hnsw")
INDEX_METRICS = ("cosine", "euclidean")
IVF_PROBES = 16
HNSW_LINKS = 32
HNSW_MIN_CANDIDATES = 64


@dataclass
class IndexInfo:
    """What ``index.json`` records about an index."""

    run: str
    checkpoint_sha256: str
    metric: str  # cosine | euclidean
    dim: int
    kind: str
    count: int
    scale: float  # the vectors were divided by it before indexing (kdml.evaluation.knn)
    charts: list[int] | None = None  # Atlas: the charts with an index file
    # euclidean: the vectors were shifted by it first (knn.search_centre); older indexes: none
    centre: list[float] | None = None
    checkpoint: str | None = None  # the checkpoint's file name (last.pt, best.pt); older: none
    epoch: int | None = None  # the epoch it holds; older indexes: none
    # the sha256 of each faiss file and of items.npz, by name: a file copied in from another
    # index of the same size had been searched without a word; older indexes: none
    files_sha256: dict[str, str] | None = None
    # the sha256 of the values above that the search uses (search_values_sha256): a scale or
    # centre edited to other valid numbers had shifted the queries wrongly; older: none
    values_sha256: str | None = None


def checkpoint_fingerprint(path: Path) -> str:
    """sha256 of a checkpoint file (or any file): ties an index to the model that embedded
    it, and an index's files to its ``index.json``."""
    return file_sha256(path)


SEARCH_VALUES = ("metric", "dim", "kind", "count", "scale", "charts", "centre")


def search_values_sha256(info: IndexInfo) -> str:
    """sha256 of the values of ``info`` that place the queries among the indexed vectors
    (:data:`SEARCH_VALUES`), as canonical JSON: floats round-trip through it exactly."""
    values = {name: getattr(info, name) for name in SEARCH_VALUES}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def _faiss_index(vectors: np.ndarray, kind: str, metric: str) -> faiss.Index:
    dim = vectors.shape[1]
    faiss_metric = faiss.METRIC_INNER_PRODUCT if metric == "cosine" else faiss.METRIC_L2
    # IVF needs 39 training points per cell: with fewer than two cells' worth (a small gallery,
    # or an Atlas chart with few members), one cell is all there is, which is an exact search,
    # so faiss's flat index does it without k-means warning about too few points.
    index: faiss.Index
    if kind == "exact" or (kind == "ivf" and len(vectors) < 2 * 39):
        index = faiss.IndexFlatIP(dim) if metric == "cosine" else faiss.IndexFlatL2(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_LINKS, faiss_metric)
    else:
        # faiss's rule of thumb, 4 sqrt(N) cells, with the 39 points per cell its k-means asks
        cells = min(int(4 * math.sqrt(len(vectors))), len(vectors) // 39)
        quantizer = faiss.IndexFlatIP(dim) if metric == "cosine" else faiss.IndexFlatL2(dim)
        inverted = faiss.IndexIVFFlat(quantizer, dim, cells, faiss_metric)
        inverted.train(vectors)
        inverted.nprobe = min(IVF_PROBES, cells)
        index = inverted
    index.add(vectors)
    return index


def check_index_folder(folder: Path) -> None:
    """Refuse an ``--out`` that is a file, a link, a folder with anything in it or the folder
    the command runs in."""
    check_not_a_link(folder)
    if folder.exists() and not folder.is_dir():  # "not an empty folder" misled: it is a file
        raise KdmlError(f"--out {folder} is a file; an index goes into a new folder: choose "
                        "another --out")
    if folder.exists() and any(folder.iterdir()):
        raise KdmlError(f"--out {folder} is not an empty folder; an index goes into a new one")
    if folder.exists() and folder.resolve() == Path.cwd().resolve():  # the build renames its
        # finished folder onto --out: onto '.' that failed with "Device or resource busy"
        raise KdmlError(f"--out {folder} is the folder you are in; an index goes into a folder "
                        "of its own: give one such as --out index")


def build_index(folder: Path, embeddings: Any, items: dict[str, np.ndarray], info: IndexInfo,
                chart_index: np.ndarray | None = None) -> IndexInfo:
    """Index ``embeddings`` [N, d] into ``folder``, a new or empty folder (one index per chart
    with ``chart_index``); ``items`` holds per-sample arrays (labels, positions, sources) saved
    beside it. The files are written into a hidden folder beside it that is renamed into place
    at the end, so a build that is killed never leaves a half-built index at ``folder``."""
    if info.kind not in INDEX_KINDS:
        raise KdmlError(f"the index kind must be one of {', '.join(INDEX_KINDS)}, got "
                        f"{info.kind!r}")
    check_index_folder(folder)
    array = as_float_matrix(embeddings, "embeddings")
    centre = search_centre(array, info.metric)
    array = shifted(array, centre)
    info.centre = None if centre is None else np.asarray(centre, dtype=np.float64).tolist()
    info.scale = search_scale(array)
    vectors = to_search_vectors(array, info.scale, info.metric)
    info.dim, info.count = int(vectors.shape[1]), len(vectors)
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / hidden_name(
        folder.name, f".partial-{os.getpid()}.{secrets.token_hex(4)}", folder.parent)
    in_the_way = KdmlError(f"{partial} is in the way of the index being built; move it away")
    try:
        # made inside the try that removes it (made by mkdtemp before it, a stop in between
        # had left it behind); 0777 less the umask, where mkdtemp's 0700 made it private
        try:
            partial.mkdir(mode=0o777)
        except FileExistsError:  # something at the hidden name: not kdml's to remove
            raise in_the_way from None
        if chart_index is None:
            _write_faiss(_faiss_index(vectors, info.kind, info.metric),
                         partial / "index.faiss")
        else:
            info.charts = sorted(int(chart) for chart in np.unique(chart_index))
            for chart in info.charts:
                members = np.flatnonzero(chart_index == chart)
                _write_faiss(_faiss_index(vectors[members], info.kind, info.metric),
                             partial / f"chart_{chart}.faiss")
            items = {**items, "chart": chart_index}
        np.savez(partial / "items.npz", **items)  # type: ignore[arg-type]  # numpy's stubs
        info.files_sha256 = {path.name: checkpoint_fingerprint(path)
                             for path in sorted(partial.iterdir())}
        info.values_sha256 = search_values_sha256(info)
        (partial / "index.json").write_text(json.dumps(asdict(info), indent=2))
        try:
            os.replace(partial, folder)  # POSIX: also replaces an empty folder the user made
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            # checked empty before the build: filled since, by another process (two
            # `kdml index` into one --out), whose files stay; the raw "Directory not empty"
            # named no cause
            what = ("another index was written there" if (folder / "index.json").exists()
                    else "files were written into it")
            raise KdmlError(f"--out {folder}: {what} while this one was built (another kdml "
                            "index into the same folder?); this one was not kept: choose "
                            "another --out") from None
    except BaseException as error:  # Ctrl-C or a full disk: no half-built index stays behind
        if error is not in_the_way:
            shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, OSError):  # a full disk: name the folder asked for
            raise error_about(error, folder, partial) from None
        raise
    return info


def _write_faiss(index: faiss.Index, path: Path) -> None:
    """Write ``index`` to ``path`` through a Python file: faiss's own file writer raises a full
    disk as a RuntimeError ("write error in ... (No space left on device)"), which stopped
    ``kdml index`` with a traceback; Python's write raises it as the OSError it is."""
    with path.open("wb") as handle:
        writer = faiss.PyCallbackIOWriter(handle.write)  # type: ignore[attr-defined]
        faiss.write_index(index, writer)


@dataclass
class LoadedIndex:
    info: IndexInfo
    items: dict[str, np.ndarray]
    indexes: dict[int, faiss.Index]  # chart -> index (key -1: the single index)


def load_index(folder: Path) -> LoadedIndex:
    """Read an index folder written by :func:`build_index` (one-line errors)."""
    meta = folder / "index.json"
    if not folder.exists():  # "not a kdml index" misled: there is nothing there
        raise KdmlError(f"no such index folder: {folder}; build one with 'kdml index RUN_DIR "
                        "--out DIR'")
    if folder.is_file():  # "no index.json" misled where the file given is index.json
        parent = (f": give {folder.parent}" if (folder.parent / "index.json").is_file()
                  else "")
        raise KdmlError(f"{folder} is a file; an index is the folder 'kdml index' wrote{parent}")
    if not meta.is_file():
        raise KdmlError(f"{folder} is not a kdml index (no index.json); build one with "
                        "'kdml index RUN_DIR --out DIR'")
    reading = "index.json"  # the file an error names: a missing or unreadable items.npz or
    # faiss file had been said as "(FileNotFoundError)" or "(RuntimeError)" alone
    try:
        info = IndexInfo(**json.loads(meta.read_text()))
        names = ([f"chart_{chart}.faiss" for chart in info.charts] if info.charts is not None
                 else ["index.faiss"])
        missing = [name for name in ["items.npz", *names] if not (folder / name).is_file()]
        if not missing:
            reading = "items.npz"
            with np.load(folder / reading, allow_pickle=False) as archive:
                items = {key: archive[key] for key in archive.files}
            keys = info.charts if info.charts is not None else [-1]
            indexes = {}
            for key, name in zip(keys, names, strict=True):
                reading = name
                indexes[key] = faiss.read_index(str(folder / name))
    except (OSError, ValueError, TypeError, RuntimeError, zipfile.BadZipFile) as error:
        raise KdmlError(f"{folder} holds a damaged index ({reading} is unreadable: "
                        f"{type(error).__name__}); build it again with 'kdml index'") from None
    if missing:
        raise KdmlError(f"{folder} holds a damaged index (its {missing[0]} is missing); build "
                        "it again with 'kdml index'")
    if not is_count(info.count):  # 896.0 passed the length checks, then crashed np.full
        raise KdmlError(f"{folder} holds a damaged index (index.json's count is "
                        f"{info.count!r}, not a whole number); build it again with 'kdml index'")
    # class_names only where the run's classes have names: one per item, as search reads it
    wanted = ["labels", "sources", *(["chart"] if info.charts is not None else []),
              *(["class_names"] if "class_names" in items else [])]
    short = [key for key in wanted
             if key not in items or items[key].ndim != 1 or len(items[key]) != info.count]
    # labels and charts are read as ints: text or floats there crashed the search
    not_whole = [key for key in wanted if key in ("labels", "chart") and key not in short
                 and items[key].dtype.kind not in "iu"]
    stored = sum(index.ntotal for index in indexes.values())
    if short:
        what: str | None = f"items.npz has no {short[0]!r} of {info.count} items"
    elif not_whole:
        what = f"items.npz's {not_whole[0]!r} are {items[not_whole[0]].dtype}, not integers"
    elif stored != info.count:
        what = f"its faiss files hold {stored} vectors, index.json says {info.count}"
    else:  # a file of another index of the same size: its sums tell
        what = (_info_disagreement(info, indexes) or _changed_values(info)
                or _changed_file(folder, info, [*names, "items.npz"]))
    if what:
        raise KdmlError(f"{folder} holds a damaged index ({what}); build it again with "
                        "'kdml index'")
    return LoadedIndex(info, items, indexes)


def _changed_values(info: IndexInfo) -> str | None:
    """Whether the search's values in ``index.json`` are not those :func:`build_index` wrote
    (None for an index of an older kdml, without their sum)."""
    if info.values_sha256 is None or info.values_sha256 == search_values_sha256(info):
        return None
    return (f"index.json's {', '.join(SEARCH_VALUES[:-1])} or {SEARCH_VALUES[-1]} differ from "
            "those it was built with")


def _changed_file(folder: Path, info: IndexInfo, names: list[str]) -> str | None:
    """Which of the index's files ``names`` is not the one :func:`build_index` wrote, as the
    sha256 sums in ``index.json`` tell (None for an index of an older kdml, without them)."""
    recorded = info.files_sha256
    if recorded is None:
        return None
    if not (isinstance(recorded, dict) and sorted(recorded) == sorted(names)
            and all(isinstance(value, str) for value in recorded.values())):
        return f"index.json's files_sha256 does not list its files {', '.join(names)}"
    for name in names:
        if checkpoint_fingerprint(folder / name) != recorded[name]:
            return (f"{name} is not the file it was built with (its sha256 differs from "
                    "index.json's): a file copied from another index, or changed since")
    return None


def _info_disagreement(info: IndexInfo, indexes: dict[int, faiss.Index]) -> str | None:
    """What in ``index.json`` is not an allowed value or disagrees with its faiss files (an
    edited or damaged file would be searched wrongly, or crash faiss), or None."""
    faiss_metric = {"cosine": faiss.METRIC_INNER_PRODUCT, "euclidean": faiss.METRIC_L2}
    if not (isinstance(info.run, str) and isinstance(info.checkpoint_sha256, str)):
        return "index.json's run and checkpoint_sha256 must be text"
    if info.metric not in INDEX_METRICS:
        return f"index.json's metric is {info.metric!r}, not one of {', '.join(INDEX_METRICS)}"
    if info.kind not in INDEX_KINDS:
        return f"index.json's kind is {info.kind!r}, not one of {', '.join(INDEX_KINDS)}"
    if not is_finite_number(info.scale, above=0):
        return f"index.json's scale is {info.scale!r}, not a positive number"
    if not is_count(info.dim):
        return f"index.json's dim is {info.dim!r}, not a whole number"
    for index in indexes.values():
        if index.d != info.dim:
            return f"index.json says dim {info.dim}, its faiss files hold {index.d}-d vectors"
        if index.metric_type != faiss_metric[info.metric]:
            return f"index.json says metric {info.metric!r}, its faiss files another"
    if info.centre is not None and not (isinstance(info.centre, list)
                                        and len(info.centre) == info.dim
                                        and all(map(is_finite_number, info.centre))):
        return f"index.json's centre is not a list of {info.dim} finite numbers"
    return None


def search_index(loaded: LoadedIndex, queries: Any, k: int,
                 query_charts: np.ndarray | None = None,
                 source: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest indexed items of each query: scores ``[Q, K]`` with ``K = min(k,
    number of items)`` (cosine similarities, or Euclidean distances in the embeddings' units;
    NaN where fewer items exist) and item positions ``[Q, K]`` (-1 where none). Atlas indexes
    search each query's own chart (``query_charts``) only. The errors about the queries name
    their ``source`` (the query file) where given, as ``query FILE: ...``."""
    info = loaded.info
    array = as_float_matrix(queries, "queries")
    if array.shape[1] != info.dim:
        raise KdmlError(_about_queries(source, f"the queries have dimension {array.shape[1]} "
                                       f"but the index holds {info.dim}-d vectors; embed them "
                                       "with the run the index was built from"))
    if k < 1:
        raise KdmlError(f"-k must be at least 1, got {k}")
    vectors = _query_vectors(array, info, source)
    k = min(k, info.count)  # no query finds more, and a huge -k must not allocate [Q, k]
    scores = np.full((len(vectors), k), np.nan, dtype=np.float32)
    positions = np.full((len(vectors), k), -1, dtype=np.int64)
    if info.charts is None:
        found_scores, found = _search(loaded.indexes[-1], vectors, min(k, info.count))
        scores[:, :found.shape[1]], positions[:, :found.shape[1]] = found_scores, found
        return _in_units(scores, positions, info), positions
    if query_charts is None:
        raise KdmlError("an Atlas index is searched chart by chart: give the queries' charts")
    chart_of_item = loaded.items["chart"]
    for chart, index in loaded.indexes.items():
        rows = np.flatnonzero(query_charts == chart)
        members = np.flatnonzero(chart_of_item == chart)
        if not len(rows):
            continue
        found_scores, found = _search(index, vectors[rows], min(k, len(members)))
        width = found.shape[1]
        scores[rows, :width] = found_scores
        positions[rows, :width] = np.where(found >= 0, members[np.maximum(found, 0)], -1)
    return _in_units(scores, positions, info), positions


def hnsw_candidates(k: int) -> int:
    """The candidate list (faiss's efSearch) an HNSW search of ``k`` neighbours keeps: of
    2,500 test embeddings of a JRD run (64-d), faiss's default of 16 found 94% of the exact 10
    and 82% of the exact 100 nearest; this finds 99.3% and 99.9%, in a time about linear in
    it. (On another such run, of 2026-12-07's defaults, the default found 99.99% and 95.1%,
    and this 100% of both: docs/inspecting.md.)"""
    return max(HNSW_MIN_CANDIDATES, 2 * k)


def _search(index: faiss.Index, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """faiss's ``k`` nearest of ``vectors`` [Q, d] in ``index``: scores and positions [Q, k]
    (HNSW with :func:`hnsw_candidates`)."""
    if isinstance(index, faiss.IndexHNSW):  # set on the index: faiss.contrib.torch_utils, which
        # PML imports, replaces search() by a version that takes no SearchParameters
        index.hnsw.efSearch = hnsw_candidates(k)
    return index.search(vectors, k)


def _about_queries(source: Path | None, message: str) -> str:
    """``message`` about the queries, prefixed by their file (``query FILE: ``) where known."""
    return message if source is None else f"query {source}: {message}"


def _query_vectors(array: np.ndarray, info: IndexInfo, source: Path | None = None
                   ) -> np.ndarray:
    """Queries as the index's vectors: unit rows for cosine (normalised row by row in float64,
    so that no magnitude overflows or underflows float32), else divided by the index's scale.
    Errors name the queries' ``source`` file where given."""
    if info.metric == "cosine":
        rows = array.astype(np.float64)
        largest = np.abs(rows).max(axis=1)
        if (largest == 0).any():
            row = int(np.flatnonzero(largest == 0)[0])
            raise KdmlError(f"{f'query {source}: row' if source else 'query'} {row} is all "
                            "zeros: its cosine similarity to anything is undefined")
        rows /= largest[:, None]  # then the squares of the norms neither overflow nor underflow
        return np.ascontiguousarray(l2_normalize(rows, inplace=True), dtype=np.float32)
    if info.centre is not None:
        array = shifted(array, np.asarray(info.centre))
    largest = float(np.abs(array).max()) / info.scale
    if largest > SAFE_MAGNITUDE[1]:
        raise KdmlError(_about_queries(source, f"the queries reach {largest:.3g} times the "
                                       "indexed vectors' scale, too far for a float32 search; "
                                       "were they embedded by this run?"))
    return to_search_vectors(array, info.scale, info.metric)


def _in_units(scores: np.ndarray, positions: np.ndarray, info: IndexInfo) -> np.ndarray:
    """faiss's scores as similarities (cosine) or distances in the embeddings' own units."""
    scores = np.where(positions >= 0, scores, np.nan)
    if info.metric == "cosine":
        return scores
    return np.sqrt(np.maximum(scores, 0.0)) * info.scale
