"""The queries of ``kdml search`` as vectors: an image file, or an ``.npz`` of raw ``inputs``
(both embedded by the run's model) or of precomputed embeddings (checked against the run's
checkpoint, and searched with no model).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from kdml.data.domains import SourcePCA
from kdml.data.images import DECODE_ERRORS, IMAGE_EXTENSIONS, load_image, load_image_as
from kdml.data.sample_spec import SampleSpec
from kdml.errors import KdmlError, why_missing
from kdml.precision import autocast
from kdml.training.loading import RunModel

if TYPE_CHECKING:  # search imports this module
    from kdml.inspection.search import RunWithoutData


def query_vectors(run: RunWithoutData, query: Path, atlas: bool,
                  model: Callable[[], RunModel]) -> tuple[np.ndarray, np.ndarray | None,
                                                            list[str]]:
    """The query's vectors (embeddings, or chart coordinates for Atlas runs: ``atlas``), their
    charts and names, from an image file (decoded as the run's data loader decodes image
    files, or fitted to the samples' ``(C, H, W)`` for in-memory image datasets such as
    Fashion-MNIST) or an ``.npz`` with ``embeddings`` (Atlas runs: ``chart_coords`` and
    ``chart_index``) or raw ``inputs`` shaped like the run's samples. Only images and
    ``inputs`` call ``model`` (the run's model: :func:`~kdml.training.loading.load_model`)."""
    if not query.is_file():
        raise KdmlError(f"query {query} {why_missing(query, 'file')}: give an image file or an "
                        ".npz")
    if query.suffix.lower() == ".npz":
        arrays = _query_arrays(query)
        # Atlas runs search chart coordinates; kdml embed writes them beside the embeddings
        searched = "chart_coords" if atlas else "embeddings"
        vector_keys = [key for key in dict.fromkeys((searched, "embeddings")) if key in arrays]
        if vector_keys == ["embeddings"] and atlas and "inputs" in arrays:
            # not "either could be meant": the embeddings cannot be searched by this run
            raise KdmlError(f"query {query} holds 'embeddings' and 'inputs', but an Atlas run "
                            "searches chart coordinates ('chart_coords' and 'chart_index', "
                            "which kdml embed writes beside the embeddings), not embeddings: "
                            "drop 'embeddings' to search with 'inputs'")
        if vector_keys and "inputs" in arrays:  # either could be meant
            raise KdmlError(f"query {query} holds both '{vector_keys[0]}' and 'inputs'; save "
                            "only the one to search with")
        if vector_keys:
            return _stored_vectors(run, query, arrays, searched)
        if "inputs" not in arrays:
            raise KdmlError(f"query {query} holds neither '{searched}' nor 'inputs'")
        loaded = model()
        inputs = _query_inputs(arrays["inputs"], loaded.samples, query, loaded.input_pca)
        names = [f"{query.name}[{i}]" for i in range(len(inputs))]
    elif query.suffix.lower() in IMAGE_EXTENSIONS:
        loaded = model()
        inputs, names = _query_image(loaded, query), [query.name]
    else:
        raise KdmlError(f"query {query} must be an image file or an .npz")
    return (*_embedded_queries(loaded, inputs), names)


def _query_arrays(query: Path) -> dict[str, np.ndarray]:
    """The arrays of a query ``.npz`` (one line where it is not a readable one)."""
    if not zipfile.is_zipfile(query):  # np.load would talk of pickles
        raise KdmlError(f"query {query} is not an .npz archive (numpy.savez writes one)")
    try:
        with np.load(query, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise KdmlError(f"query {query} is not a readable .npz ({error})") from None


def _stored_vectors(run: RunWithoutData, query: Path, arrays: dict[str, np.ndarray],
                    searched: str) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    """Precomputed query vectors ``arrays[searched]`` ``[Q, d]`` (and, for ``chart_coords``,
    their charts ``[Q]``) and their names: checked against the run's checkpoint and config,
    with no model (the width is checked against the index's when searched)."""
    # an .npz of `kdml embed` names its model; a user's own names none
    made_by = str(arrays.get("checkpoint_sha256", ""))
    if made_by and made_by != run.fingerprint:
        best = run.reads_best
        other = run.other_checkpoint_of(made_by)  # kdml embed --best, searched without
        if other is not None:
            raise KdmlError(f"query {query} holds embeddings of {other.name} of this run, not "
                            f"of {run.checkpoint.name}: search {'without' if best else 'with'} "
                            f"--best, or embed the queries {'with' if best else 'without'} "
                            "--best")
        raise KdmlError(f"query {query} holds embeddings of another checkpoint than "
                        f"this run's (its checkpoint_sha256 differs); embed the queries "
                        f"with this run (kdml embed {run.run.root} --dataset ...), "
                        f"or search with their run")
    if searched not in arrays:
        raise KdmlError(f"query {query} needs '{searched}' for this Atlas run")
    vectors = _query_rows(arrays[searched], searched, query)
    _check_query_vectors(vectors, searched, query)
    charts = None
    if searched == "chart_coords":
        charts = _query_charts(arrays.get("chart_index"), len(vectors), query,
                               run.config.method.n_charts)
    return vectors, charts, [f"{query.name}[{i}]" for i in range(len(vectors))]


def _query_image(model: RunModel, query: Path) -> torch.Tensor:
    """An image file as one sample ``[1, *sample_shape]`` of the run's model."""
    samples = model.samples
    shape = tuple(samples.sample_shape)
    if not samples.is_file_backed and not samples.holds_pixels:
        raise KdmlError(f"image queries need a run trained on images (uint8, or float in "
                        f"[0, 1]); this run's samples are {shape}: give an .npz with "
                        f"'inputs' or 'embeddings'")
    try:
        return (load_image(query, model.config.data.resize) if samples.is_file_backed
                else load_image_as(query, shape))[None]
    except DECODE_ERRORS as error:
        raise KdmlError(f"cannot decode image {query} ({error}); give a readable image file "
                        f"or an .npz of inputs or embeddings") from None


def _embedded_queries(trained: RunModel, inputs: torch.Tensor
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    """The run's model's vectors of ``inputs`` ``[Q, *sample_shape]``: embeddings ``[Q, d]``,
    or for Atlas runs chart coordinates ``[Q, d]`` and charts ``[Q]``."""
    method, embedder = trained.method, trained.embedder
    method.eval()
    vector_chunks: list[torch.Tensor] = []
    chart_chunks: list[torch.Tensor] = []
    # in the evaluation's batches (an .npz may hold a whole test split), the model under its
    # autocast, so that a query is embedded as the index's items were
    with torch.no_grad():
        for chunk in inputs.split(embedder.batch_size):
            batch = embedder.transform(chunk.to(embedder.device))
            with autocast(embedder.device, embedder.precision):
                output = method.chart_codes(batch) if method.has_charts else method.embed(batch)
            if isinstance(output, tuple):
                vector_chunks.append(output[0].float().cpu())
                chart_chunks.append(output[1].cpu())
            else:
                vector_chunks.append(output.float().cpu())
    return (torch.cat(vector_chunks).numpy(),
            torch.cat(chart_chunks).numpy() if chart_chunks else None)


def _query_inputs(raw: np.ndarray, samples: SampleSpec, query: Path,
                  pca: SourcePCA | None = None) -> torch.Tensor:
    """Raw query ``inputs`` ``[Q, *sample_shape]`` as the model takes them: uint8 images, or
    float (in [0, 1] where the samples are images) and features cast to the samples' dtype.
    With a ``pca`` (a domain pair's ``data.pca_dim``), ``inputs`` are the pair's features
    ``[Q, pca.feature_size]``, projected by it as the training samples were."""
    raw = _query_rows(raw, "inputs", query)
    if raw.dtype != np.uint8 and raw.dtype.kind != "f":
        raise KdmlError(f"query {query}: 'inputs' must be uint8 or float, like the run's "
                        f"samples, got {raw.dtype}")
    shape = tuple(raw.shape[1:])
    if pca is not None and shape != (pca.feature_size,):
        raise KdmlError(f"query inputs have shape {shape} per sample but the run's are its "
                        f"domain pair's features, ({pca.feature_size},) each, which kdml "
                        f"projects by the run's PCA (data.pca_dim={pca.dim}): give them before "
                        "the PCA")
    if pca is None and shape != tuple(samples.sample_shape):
        dims = ", ".join(map(str, samples.sample_shape))  # a 1-D array is read as Q scalars
        raise KdmlError(f"query inputs have shape {shape} per sample but the run's samples "
                        f"are {tuple(samples.sample_shape)}: give 'inputs' as [Q, {dims}], "
                        f"one query as [1, {dims}]")
    if not np.isfinite(raw).all():  # uint8 inputs always pass
        raise KdmlError(f"query {query}: 'inputs' holds NaN or infinite values")
    if pca is not None:
        return pca.project(torch.from_numpy(raw))
    is_images = samples.is_file_backed or samples.holds_pixels
    if raw.dtype == np.uint8:
        # the pipeline scales uint8 to [0, 1]: right for pixels, not for features, which are
        # taken at their own scale (a feature 200 had been embedded as 0.78)
        return torch.from_numpy(raw) if is_images else torch.from_numpy(raw).to(samples.dtype)
    # the pipeline scales uint8 images to [0, 1] and passes floats as they are: 0-255 floats
    # would be embedded as images 255 times too bright
    if is_images:
        low, high = float(raw.min()), float(raw.max())
        if low < 0 or high > 1:
            raise KdmlError(f"query {query}: float 'inputs' range from {low:.4g} to "
                            f"{high:.4g}, but the run's images are in [0, 1]: divide 0-255 "
                            "pixels by 255, or save them as uint8")
    return torch.from_numpy(raw).to(samples.dtype)


def _check_query_vectors(vectors: np.ndarray, key: str, query: Path) -> None:
    """Refuse query vectors that are not finite floats ``[Q, d]``, naming the file, the key
    and the first row holding NaN or infinity, as NaN 'inputs' are: the search's own checks
    had said only "queries must have a floating dtype", "queries must be 2-D (N, D)" (for one
    embedding saved as a 1-D array) or "queries contains NaN or infinite values", of no
    file."""
    if vectors.dtype.kind != "f":
        raise KdmlError(f"query {query}: '{key}' must be floats, got {vectors.dtype}")
    if vectors.ndim != 2:
        raise KdmlError(f"query {query}: '{key}' must be [Q, d], one row per query (one query "
                        f"as [1, d]), got shape {tuple(vectors.shape)}")
    bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
    if bad.size:
        raise KdmlError(f"query {query}: '{key}' holds NaN or infinite values (row "
                        f"{int(bad[0])})")


def _query_rows(array: np.ndarray, key: str, query: Path) -> np.ndarray:
    """``array`` if it holds at least one row (the finer checks follow its use)."""
    if array.ndim == 0 or len(array) == 0:
        raise KdmlError(f"query {query}: '{key}' must hold one row per query, got shape "
                        f"{tuple(array.shape)}")
    return array


def _query_charts(chart_index: np.ndarray | None, count: int, query: Path,
                  n_charts: int) -> np.ndarray:
    """The queries' charts: one integer in [0, n_charts) per query row."""
    if chart_index is None:
        raise KdmlError(f"query {query} needs 'chart_index' beside 'chart_coords' for this "
                        "Atlas run (kdml embed writes both)")
    if chart_index.dtype.kind not in "iu" or chart_index.shape != (count,):
        raise KdmlError(f"query {query}: 'chart_index' must hold one integer per row of "
                        f"'chart_coords' ({count}), got {chart_index.dtype} of shape "
                        f"{tuple(chart_index.shape)}")
    outside = np.flatnonzero((chart_index < 0) | (chart_index >= n_charts))
    if len(outside):
        raise KdmlError(f"query {query}: chart_index[{outside[0]}] is "
                        f"{chart_index[outside[0]]}, but the run has charts 0 to {n_charts - 1}")
    return chart_index
