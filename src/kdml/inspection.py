"""Looking at a trained run: its embeddings of a split (``kdml embed``), a search index of them
(``kdml index``), queries against that index (``kdml search``), pictures (``kdml plot
retrieval``, ``kdml plot embedding``, ``kdml plot charts``) and the generalization terms
(``kdml analyze generalization``). The command line and ``kdml reproduce`` call these; they
return data and write files, and print nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kdml.config import RunConfig
from kdml.data.dataset import DmlDataset, renamed_classes
from kdml.data.images import DECODE_ERRORS, IMAGE_EXTENSIONS, load_image, load_image_as
from kdml.data.prepare import prepare_data
from kdml.data.sample_spec import SampleSpec
from kdml.data.splits import DataSplits
from kdml.data.transforms import to_unit_float
from kdml.errors import KdmlError, check_not_a_link, why_missing
from kdml.evaluation.collapse import collapse_description, collapse_warning
from kdml.evaluation.estimate import Estimate
from kdml.evaluation.evaluator import (
    Embedded,
    Embedder,
    chart_codes_of,
    dataset_labels,
    embed_dataset,
)
from kdml.evaluation.generalization import generalization_terms
from kdml.evaluation.index import (
    IndexInfo,
    build_index,
    check_index_folder,
    checkpoint_fingerprint,
    load_index,
    search_index,
)
from kdml.evaluation.knn import as_metric, knn_search, l2_normalize
from kdml.figure_file import check_replaceable
from kdml.file_write import check_writable_folder, write_through_new_file
from kdml.training.build import build_embedder, build_pipeline
from kdml.training.checkpoint import load_checkpoint
from kdml.training.loading import RunModel, TrainedRun, chosen_checkpoint, run_config
from kdml.training.run_folder import (
    RunFolder,
    check_json_replaceable,
    write_json,
)
from kdml.viz_charts import plot_charts
from kdml.viz_retrieval import (
    embedding_map,
    plot_embedding_map,
    plot_retrieval_grid,
    short_name,
)

SPLITS = ("test", "train", "gallery")
_log = logging.getLogger(__name__)


@dataclasses.dataclass
class Part:
    """A split of a run's data, as the run's model sees it."""

    dataset: DmlDataset
    labels: torch.Tensor  # the dataset's own labels
    embedder: Embedder
    is_validation: bool = False  # the validation part (data.validation), standing for "test"


def searches_gallery(trained: TrainedRun) -> bool:
    """Whether the run's metrics search a gallery: where its split has one (In-Shop, a CSV's
    flags); otherwise each test sample among the others."""
    return trained.splits.gallery is not None


def run_part(trained: TrainedRun, split: str = "test") -> Part:
    """The run's ``split``; ``"searched"`` is the part the metrics search: the gallery where
    they do (:func:`searches_gallery`), else test. A run that validated (``data.validation``)
    and was loaded without its test part has its validation part as test."""
    _check_split(split)
    return _part_of(trained.splits, trained.embedder, split)


def dataset_part(model: RunModel, dataset: str, data_root: str | None = None,
                 split: str = "test") -> Part:
    """:func:`run_part` of another ``dataset`` (at ``data_root``, else where it is found),
    which the run never saw, embedded by the run's model: its own test part is test."""
    _check_split(split)  # before the data is read
    _, splits, embedder = other_data(model, dataset, data_root)
    return _part_of(splits, embedder, split)


def _check_split(split: str) -> None:
    if split not in (*SPLITS, "searched"):
        raise KdmlError(f"--split must be one of {', '.join(SPLITS)}, got {split!r}")


def _part_of(splits: DataSplits, embedder: Embedder, split: str) -> Part:
    """``split`` (checked: :func:`_check_split`) of ``splits``, fed by ``embedder``."""
    if split == "searched":
        split = "gallery" if splits.gallery is not None else "test"
    chosen = {"test": splits.test, "train": splits.train, "gallery": splits.gallery}[split]
    if chosen is None:
        raise KdmlError(f"{splits.test.name.split('/')[0]} has no gallery; use --split test")
    if split != "train":
        return Part(chosen, chosen.labels, embedder, split == "test" and splits.validation)
    # Back from the training split's 0..C-1 to the dataset's labels, names following them.
    labels = dataset_labels(splits, chosen.labels)
    names = renamed_classes(chosen.class_names, dict(enumerate(splits.train_classes)))
    return Part(chosen.relabelled(labels, names), labels, embedder)


def other_data(model: RunModel, dataset: str, data_root: str | None
               ) -> tuple[RunConfig, DataSplits, Embedder]:
    """Another ``dataset`` (at ``data_root``, else where it is found) as the run's data
    settings split it (``data.split``; no validation part), with the embedder that feeds it
    to the run's model, and the run's config naming it. Its samples must have the shape the
    run trained on."""
    data = dataclasses.replace(model.config.data, dataset=dataset, root=data_root or "",
                               validation=0.0)
    splits = prepare_data(data)
    trained_shape, shape = model.samples.sample_shape, splits.train.sample_shape
    if shape != trained_shape:  # a CNN with global pooling would take any size silently
        raise KdmlError(f"--dataset {dataset} has samples of shape {shape}, but the run was "
                        f"trained on samples of shape {trained_shape}: give a dataset "
                        "shaped like the run's")
    other = dataclasses.replace(model.config, data=data)
    embedder = build_embedder(other, build_pipeline(other, splits.train, model.method),
                              model.embedder.device)
    return other, splits, embedder


def validation_note(part: Part) -> str | None:
    """For stderr: that ``part`` is a validated run's validation part, not its test part (and
    how to reach that), else None."""
    if not part.is_validation:
        return None
    return (f"this run validated (data.validation): its test split here is the validation "
            f"part ({len(part.dataset):,} samples carved from the training part); --test uses "
            "the test part, which its training and choices never saw")


def embed_part(trained: RunModel, part: Part) -> dict[str, np.ndarray]:
    """Embeddings (and, for Atlas runs, chart codes), labels, positions, sources and the
    checkpoint's sha256 (``checkpoint_sha256``: ``kdml search`` refuses these embeddings as
    queries of another model's index)."""
    embedded = embed_dataset(trained.method, part.dataset, part.embedder)
    arrays = _items(part.dataset, embedded)
    arrays["embeddings"] = embedded.tensor().float().cpu().numpy()
    arrays["checkpoint_sha256"] = np.array(checkpoint_fingerprint(trained.checkpoint))
    if trained.method.has_charts:
        codes = chart_codes_of(trained.method, part.dataset, part.embedder)
        arrays["chart_coords"] = codes.values[0].float().cpu().numpy()
        arrays["chart_index"] = codes.values[1].cpu().numpy()
    return arrays


def _items(dataset: DmlDataset, embedded: Embedded) -> dict[str, np.ndarray]:
    """Per-sample arrays: labels, positions, sources and, where the classes are named,
    ``class_names`` (each sample's class name)."""
    positions = embedded.indices.numpy()
    items = {"labels": embedded.labels.numpy(), "positions": positions,
             "sources": np.array([dataset.source_of(int(i)) for i in positions], dtype=str)}
    names = _class_names_of(dataset, items["labels"])
    if names is not None:
        items["class_names"] = names
    return items


def _class_names_of(dataset: DmlDataset, labels: np.ndarray) -> np.ndarray | None:
    """Each label's class name ``[N]`` (str), or None unless every class has a name."""
    if dataset.class_names is None:
        return None
    classes, codes = np.unique(labels, return_inverse=True)
    names = [dataset.class_name(int(label)) for label in classes]
    if any(name is None for name in names):
        return None
    return np.array(names, dtype=str)[codes.reshape(-1)]


def check_npz_out(path: Path) -> None:
    """Refuse an ``--out`` for an ``.npz`` that exists or cannot be written (before the work)."""
    if path.suffix != ".npz":
        raise KdmlError(f"--out {path} must end in .npz")
    check_not_a_link(path)
    if path.exists():
        raise KdmlError(f"{path} exists; kdml does not overwrite files: choose another --out")
    check_writable_folder(path.parent)


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``arrays`` to a new ``.npz`` file (an existing file is never replaced), whole or
    not at all."""
    check_npz_out(path)

    def save(partial: Path) -> None:
        with partial.open("wb") as handle:  # a handle: np.savez would add .npz to a name
            np.savez(handle, **arrays)  # type: ignore[arg-type]  # numpy's stubs

    return write_through_new_file(path, save)


def index_part(trained: RunModel, part: Part, folder: Path, kind: str) -> IndexInfo:
    """A faiss index of the part's embeddings (Atlas: one per chart, on chart coordinates)."""
    check_index_folder(folder)  # before embedding, which takes minutes on a large split
    check_writable_folder(folder.parent)
    arrays = embed_part(trained, part)
    items: dict[str, np.ndarray] = {
        key: arrays[key] for key in ("labels", "positions", "sources", "class_names")
        if key in arrays}
    charts = trained.method.has_charts
    # the run's absolute path: search tells a stale index of this run from another run's
    info = IndexInfo(str(trained.run.root.resolve()), checkpoint_fingerprint(trained.checkpoint),
                     "euclidean" if charts else trained.config.eval.metric, 0, kind, 0, 1.0,
                     checkpoint=trained.checkpoint.name, epoch=trained.epoch)
    vectors = arrays["chart_coords"] if charts else arrays["embeddings"]
    return build_index(folder, vectors, items, info,
                       arrays["chart_index"] if charts else None)


@dataclasses.dataclass(frozen=True)
class RunWithoutData:
    """A run's folder, config and the checkpoint a command reads (``last.pt``, or ``best.pt``),
    neither its data nor its model loaded: all a search of precomputed embeddings needs."""

    run: RunFolder
    config: RunConfig
    checkpoint: Path

    @functools.cached_property
    def fingerprint(self) -> str:
        """The checkpoint's SHA-256, read once: the index and the query's .npz are both
        checked against it, and a checkpoint may be hundreds of megabytes."""
        return checkpoint_fingerprint(self.checkpoint)


def run_without_data(run_dir: Path, best: bool = False) -> RunWithoutData:
    """The run at ``run_dir`` and its checkpoint (``best``: ``best.pt``), refused as
    :func:`~kdml.training.loading.load_run` refuses them, without reading data or weights."""
    run = RunFolder.existing(run_dir)
    return RunWithoutData(run, run_config(run), chosen_checkpoint(run, best))


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
        if vector_keys and "inputs" in arrays:  # either could be meant
            raise KdmlError(f"query {query} holds both '{vector_keys[0]}' and 'inputs'; save "
                            "only the one to search with")
        if vector_keys:
            return _stored_vectors(run, query, arrays, searched)
        if "inputs" not in arrays:
            raise KdmlError(f"query {query} holds neither '{searched}' nor 'inputs'")
        loaded = model()
        inputs = _query_inputs(arrays["inputs"], loaded.samples, query)
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
        raise KdmlError(f"query {query} holds embeddings of another checkpoint than "
                        f"this run's (its checkpoint_sha256 differs); embed the queries "
                        f"with this run (kdml embed {run.run.root} --dataset ...), "
                        f"or search with their run")
    if searched not in arrays:
        raise KdmlError(f"query {query} needs '{searched}' for this Atlas run")
    vectors = _query_rows(arrays[searched], searched, query)
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
    with torch.no_grad():  # in the evaluation's batches: an .npz may hold a whole test split
        for chunk in inputs.split(embedder.batch_size):
            batch = embedder.transform(chunk.to(embedder.device))
            if method.has_charts:
                coords, chart = method.chart_codes(batch)
                vector_chunks.append(coords.float().cpu())
                chart_chunks.append(chart.cpu())
            else:
                vector_chunks.append(method.embed(batch).float().cpu())
    return (torch.cat(vector_chunks).numpy(),
            torch.cat(chart_chunks).numpy() if chart_chunks else None)


def _query_inputs(raw: np.ndarray, samples: SampleSpec, query: Path) -> torch.Tensor:
    """Raw query ``inputs`` ``[Q, *sample_shape]`` as the model takes them: uint8, or float
    cast to the samples' float dtype (in [0, 1] where the samples are images)."""
    raw = _query_rows(raw, "inputs", query)
    if raw.dtype != np.uint8 and raw.dtype.kind != "f":
        raise KdmlError(f"query {query}: 'inputs' must be uint8 or float, like the run's "
                        f"samples, got {raw.dtype}")
    expected = tuple(samples.sample_shape)
    if tuple(raw.shape[1:]) != expected:
        raise KdmlError(f"query inputs have shape {tuple(raw.shape[1:])} per sample but the "
                        f"run's samples are {expected}")
    if raw.dtype == np.uint8:
        return torch.from_numpy(raw)
    if not np.isfinite(raw).all():
        raise KdmlError(f"query {query}: 'inputs' holds NaN or infinite values")
    # the pipeline scales uint8 images to [0, 1] and passes floats as they are: 0-255 floats
    # would be embedded as images 255 times too bright
    if samples.is_file_backed or samples.holds_pixels:
        low, high = float(raw.min()), float(raw.max())
        if low < 0 or high > 1:
            raise KdmlError(f"query {query}: float 'inputs' range from {low:.4g} to "
                            f"{high:.4g}, but the run's images are in [0, 1]: divide 0-255 "
                            "pixels by 255, or save them as uint8")
    return torch.from_numpy(raw).to(samples.dtype)


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


def search(run: RunWithoutData, index_folder: Path, query: Path, k: int,
           model: Callable[[], RunModel]) -> list[dict[str, Any]]:
    """Each query's ``k`` nearest indexed items (rank, score, label, source) and the index's
    ``metric``: scores are cosine similarities (higher is nearer) or Euclidean distances.
    ``model`` loads the run's model: only image and ``inputs`` queries call it, so
    precomputed embeddings are searched without it."""
    loaded = load_index(index_folder)
    if loaded.info.checkpoint_sha256 != run.fingerprint:
        raise KdmlError(_another_checkpoint(loaded.info, run, index_folder))
    # the index is of this run's checkpoint: per chart (info.charts) iff the run is an Atlas's
    vectors, charts, names = query_vectors(run, query, loaded.info.charts is not None, model)
    scores, positions = search_index(loaded, vectors, k, charts)
    class_names = loaded.items.get("class_names")
    results = []
    for name, row_scores, row_positions in zip(names, scores, positions, strict=True):
        neighbours = []
        for rank, (score, position) in enumerate(zip(row_scores, row_positions, strict=True),
                                                 start=1):
            if position < 0:  # fewer indexed items than k
                continue
            neighbour = {"rank": rank, "score": float(score),
                         "label": int(loaded.items["labels"][position]),
                         "source": str(loaded.items["sources"][position])}
            if class_names is not None:
                neighbour["class_name"] = str(class_names[position])
            neighbours.append(neighbour)
        results.append({"query": name, "metric": loaded.info.metric, "neighbours": neighbours})
    return results


def score_name(metric: str) -> str:
    """What a search's scores are under ``metric``: ``similarity`` (cosine) or ``distance``."""
    return "similarity" if metric == "cosine" else "distance"


def _another_checkpoint(info: IndexInfo, run: RunWithoutData, folder: Path) -> str:
    """Why an index of another checkpoint is refused: of this run (built before it trained on,
    or from best.pt rather than last.pt) or of another one."""
    best = " --best" if run.checkpoint == run.run.best_checkpoint else ""
    rebuild = f"'kdml index {run.run.root}{best} --out DIR'"
    built_from = Path(info.run)
    if not (built_from.is_dir() and built_from.samefile(run.run.root)):
        return (f"index {folder} was built from another checkpoint ({info.run}); build it from "
                f"this run with {rebuild}")
    other = (run.run.checkpoint if best else run.run.best_checkpoint)
    if other.is_file() and checkpoint_fingerprint(other) == info.checkpoint_sha256:
        flag = "without --best" if best else "with --best"
        return (f"index {folder} holds {other.name} of this run, not {run.checkpoint.name}: "
                f"search it {flag}, or build one of {run.checkpoint.name} with {rebuild}")
    then = (f"{info.checkpoint} at epoch {info.epoch}" if info.checkpoint is not None
            else "an earlier one")
    epoch = load_checkpoint(run.checkpoint)["epoch"]  # read only for this message
    return (f"index {folder} was built from another checkpoint of this run ({then}; this "
            f"search reads {run.checkpoint.name} at epoch {epoch}); build it again "
            f"with {rebuild}")


def results_as_json(results: list[dict[str, Any]]) -> str:
    return json.dumps(results, indent=2)


def refuse_collapsed(embedded: Embedded, trained: TrainedRun, picture: str) -> None:
    """Raise :class:`KdmlError` when the test embeddings have collapsed to one point
    (:func:`~kdml.evaluation.collapse.collapse_description`): ``picture`` would show ties and
    float rounding, not the model."""
    collapsed = collapse_description(embedded.tensor(), trained.config.eval.metric)
    if collapsed is not None:
        raise KdmlError(f"{collapsed}: {picture} would show ties and float rounding, not the "
                        "model; train the run again with lower learning rates")


def plot_retrieval(trained: TrainedRun, queries: int, k: int, seed: int = 0) -> Path:
    """``plots/retrieval.png`` (``retrieval-best.png`` with the best checkpoint): random test
    queries (with at least one same-class sample to find) and their ``k`` nearest images, hits
    and misses marked. Where the metrics search a gallery (:func:`searches_gallery`), the
    queries are searched in it; otherwise among the other test images."""
    check_replaceable(trained.plot_path("retrieval"))  # before minutes of embedding
    part = run_part(trained)
    if not part.dataset.is_image:
        raise KdmlError("plot retrieval draws images; this run's samples are not images")
    embedded = embed_dataset(trained.method, part.dataset, part.embedder)
    # a tied neighbour is drawn as found, so the grid's hits would be the search's tie order
    refuse_collapsed(embedded, trained, "a grid of their nearest neighbours")
    labels = embedded.labels.numpy()
    metric = as_metric(trained.config.eval.metric)
    requested_k = k
    if not searches_gallery(trained):
        found, reference, reference_labels = part, embedded, labels
        _, codes, counts = np.unique(labels, return_inverse=True, return_counts=True)
        eligible = np.flatnonzero(counts[codes] > 1)
        k = min(k, len(labels) - 1)
    else:
        found = run_part(trained, "gallery")
        reference = embed_dataset(trained.method, found.dataset, found.embedder)
        reference_labels = reference.labels.numpy()
        eligible = np.flatnonzero(np.isin(labels, reference_labels))
        k = min(k, len(reference_labels))
    if not len(eligible):
        raise KdmlError("no test query has another sample of its class to retrieve")
    # said, not drawn smaller without a word (kdml search notes short rows alike)
    if len(eligible) < queries:
        _log.warning("the retrieval grid shows %d queries, not %d: only %d test samples have "
                     "another of their class to retrieve", len(eligible), queries,
                     len(eligible))
    if k < requested_k:
        _log.warning("the retrieval grid shows %d neighbours per query, not %d: %s", k,
                     requested_k, f"the test part holds only {k} images besides the query"
                     if found is part else f"the gallery holds only {k} images")
    chosen = np.random.default_rng(seed).choice(eligible, min(queries, len(eligible)),
                                                replace=False)
    same_set = found is part
    if same_set:  # each test image against the others (its own row dropped)
        chunks = knn_search(embedded.values, k=k, metric=metric, exclude_self=True)
        neighbours = np.concatenate([chunk.indices for chunk in chunks])[chosen]
    else:
        chunks = knn_search(embedded.values[chosen], reference.values, k=k, metric=metric)
        neighbours = np.concatenate([chunk.indices for chunk in chunks])
    hits = reference_labels[neighbours] == labels[chosen][:, None]

    def loader(dataset: DmlDataset) -> tuple[Callable[[int], torch.Tensor],
                                             Callable[[int], str]]:
        def image(position: int) -> torch.Tensor:
            return to_unit_float(dataset.load(position))

        def title(position: int) -> str:
            label = int(dataset.labels[position])
            return short_name(dataset.class_name(label) or str(label))

        return image, title

    query_image, query_title = loader(part.dataset)
    return plot_retrieval_grid(
        embedded.indices.numpy()[chosen], reference.indices.numpy()[neighbours], hits,
        query_image, trained.plot_path("retrieval"), query_title,
        gallery=None if same_set else loader(found.dataset))


def plot_embedding(trained: TrainedRun, max_points: int = 5000, seed: int = 0) -> Path:
    """``plots/embedding.png`` (``embedding-best.png`` with the best checkpoint): the test
    embeddings in 2-D (UMAP, else t-SNE), by class."""
    check_replaceable(trained.plot_path("embedding"))  # before minutes of embedding
    part = run_part(trained)
    embedded = embed_dataset(trained.method, part.dataset, part.embedder)
    # t-SNE would spread float rounding out into clusters (and crashes on exact ties)
    refuse_collapsed(embedded, trained, "a 2-D map of them")
    values = embedded.tensor().float().cpu().numpy()
    labels = embedded.labels.numpy()
    if len(values) > max_points:
        keep = np.random.default_rng(seed).choice(len(values), max_points, replace=False)
        values, labels = values[keep], labels[keep]
    if len(values) < 3:
        raise KdmlError("a 2-D map needs at least 3 test samples")
    coordinates, method = embedding_map(values, seed)
    return plot_embedding_map(coordinates, labels, trained.plot_path("embedding"), method,
                              f"{trained.config.recipe} on {trained.config.data.dataset}",
                              part.dataset.class_names)


def draw_charts(trained: TrainedRun, thumbnails: int = 100) -> Path:
    """``plots/charts.png`` (``charts-best.png`` with the best checkpoint): the test samples in
    each chart of an Atlas run, by class (named in the legend), with up to ``thumbnails``
    images drawn (Korman, Sec. A.2)."""
    if not trained.method.has_charts:
        raise KdmlError(f"{trained.config.recipe!r} has no charts; plot charts needs an Atlas "
                        "recipe (mtriplet, msimclr)")
    check_replaceable(trained.plot_path("charts"))  # before minutes of embedding
    test = trained.splits.test
    codes = chart_codes_of(trained.method, test, trained.embedder)
    coords, index = codes.values

    def thumbnail(row: int) -> torch.Tensor:
        return to_unit_float(test.load(int(codes.indices[row])))

    return plot_charts(coords, index, codes.labels, trained.plot_path("charts"),
                       images=thumbnail if test.is_image else None, max_thumbnails=thumbnails,
                       class_names=test.class_names)


@dataclasses.dataclass(frozen=True)
class GeneralizationSettings:
    """How ``kdml analyze generalization`` estimates the terms (see
    :func:`~kdml.evaluation.generalization.generalization_terms`)."""

    labelled_fraction: float = 0.5
    repeats: int = 10
    neighbors: int = 1
    seed: int = 0


def analyze_generalization(trained: TrainedRun, settings: GeneralizationSettings
                           ) -> tuple[dict[str, Estimate], Path]:
    """The H-divergence and lambda between the training (seen) and test (unseen) classes'
    embeddings (Chu et al. 2020, Sec. 2), also written to the run's ``generalization.json``.
    For a run that validated (``data.validation``), the unseen classes are its validation
    part, which it did not train on either (``"unseen": "validation"`` in the file)."""
    path = trained.run.root / "generalization.json"
    check_json_replaceable(path, ["settings"])  # before minutes of embedding
    # unlike eval's metrics, these are shown only once written
    check_writable_folder(path.parent, "make the run folder writable")
    splits = trained.splits
    seen = embed_dataset(trained.method, splits.train, trained.embedder)
    unseen = embed_dataset(trained.method, splits.test, trained.embedder)
    # The classifiers rank by Euclidean distance: on unit rows that is the cosine ranking the
    # run is evaluated with (Atlas runs' manifold distance has no such form: distance_note)
    cosine = not trained.method.has_charts and trained.config.eval.metric == "cosine"
    for part, name in ((seen, "the seen classes' embeddings"),
                       (unseen, f"the unseen ({'validation' if splits.validation else 'test'}) "
                                "classes' embeddings")):
        warning = collapse_warning(part.tensor(), "cosine" if cosine else "euclidean", name,
                                   "the H-divergence and lambda")
        if warning is not None:
            _log.warning(warning)
    seen_x, unseen_x = (part.tensor().float().cpu().numpy() for part in (seen, unseen))
    if cosine:
        seen_x, unseen_x = l2_normalize(seen_x, inplace=True), l2_normalize(unseen_x, True)
    terms = generalization_terms(
        seen_x, dataset_labels(splits, seen.labels).numpy(), unseen_x, unseen.labels.numpy(),
        labelled_fraction=settings.labelled_fraction, repeats=settings.repeats,
        neighbors=settings.neighbors, seed=settings.seed)
    distance = ("euclidean on the Atlas embedding" if trained.method.has_charts else
                "cosine" if cosine else "euclidean")
    written = {"settings": {**dataclasses.asdict(settings), "epoch": trained.epoch},
               "distance": distance, "unseen": "validation" if splits.validation else "test",
               **{name: estimate.to_dict() for name, estimate in terms.items()}}
    write_json(written, path)
    return terms, path
