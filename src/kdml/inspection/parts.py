"""The parts of a run's data that a command looks at, and what ``kdml embed`` and ``kdml
index`` make of one: its embeddings (with chart codes for Atlas runs) in a new ``.npz``, or a
faiss index of them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from kdml.config import RunConfig
from kdml.data.dataset import DmlDataset, renamed_classes
from kdml.data.domains import is_domain_dataset
from kdml.data.prepare import prepare_data
from kdml.data.splits import OTHER_TEST_SETS, ClassCountError, DataSplits
from kdml.dataset_names import check_dataset_name
from kdml.errors import KdmlError, check_not_a_link
from kdml.evaluation.evaluator import (
    Embedded,
    Embedder,
    chart_codes_of,
    dataset_labels,
    embed_dataset,
)
from kdml.evaluation.index import IndexInfo, build_index, check_index_folder, checkpoint_fingerprint
from kdml.file_write import check_writable_folder, write_through_new_file
from kdml.training.build import build_embedder, build_pipeline
from kdml.training.loading import RunModel, TrainedRun

SPLITS = ("test", "train", "gallery")


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
    run trained on. A run whose domain pair went through a PCA (``data.pca_dim``) takes
    another pair of the same features, projected by the run's PCA (:attr:`RunModel.input_pca`),
    never one fitted on the other pair's source: a basis the model never saw."""
    check_dataset_name(dataset)  # as kdml train: the pairs and npz:PATH among the choices
    pca_dim, pca = model.config.data.pca_dim, model.input_pca
    if pca_dim and pca is None:  # a RunModel built by hand: load_model gives it one
        raise KdmlError(f"the run's inputs are projected by a PCA (data.pca_dim={pca_dim}) "
                        "that this loaded model lacks; load the run with load_model")
    if pca_dim and not is_domain_dataset(dataset):
        raise KdmlError(f"the run's inputs are its domain pair's features projected by a PCA "
                        f"(data.pca_dim={pca_dim}): --dataset must be a domain pair of those "
                        f"features (SOURCE->TARGET or npz:FILE), got {dataset}")
    data = dataclasses.replace(model.config.data, dataset=dataset, root=data_root or "",
                               validation=0.0)
    try:
        splits = prepare_data(data, pca=pca)
    except ClassCountError as error:  # its advice, data.train_classes, is the run's: not ours
        raise KdmlError(f"--dataset {dataset} has {error.num_classes} classes, but the run's "
                        f"data.train_classes={data.train_classes:g} keeps {error.count} of "
                        "them as its training classes and scores the rest: give a dataset of "
                        f"more than {error.count} classes") from None
    # "classes not seen in training" would speak of the run's training, which may have been
    # on these classes (a run of all MNIST scored on mnist5k)
    splits = dataclasses.replace(splits, test_words=OTHER_TEST_SETS[splits.kind])
    trained_shape, shape = model.samples.sample_shape, splits.train.sample_shape
    if shape != trained_shape:  # a CNN with global pooling would take any size silently
        raise KdmlError(f"--dataset {dataset} has samples of shape {shape}, but the run was "
                        f"trained on samples of shape {trained_shape}: give a dataset "
                        "shaped like the run's")
    other = dataclasses.replace(model.config, data=data)
    embedder = build_embedder(other, build_pipeline(other, splits.train, model.method),
                              model.embedder.device, model.embedder.progress)
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

    return write_through_new_file(path, save, replace=False)


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
