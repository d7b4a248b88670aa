"""Embed the evaluation data with a trained method and score it. The evaluator never trains.

Samples reach the method batch by batch through a loader (:class:`Embedder`); only the
embeddings are kept. What is scored depends on the split and the method:

- test classes not seen in training: retrieval on the test set (Recall@K, MAP@R,
  R-Precision, NMI), leave-one-out, or each query against the gallery (In-Shop);
- methods with charts (Atlas): the same metrics under the manifold distance with argmax charts
  (:func:`~kdml.evaluation.charts.chart_retrieval_metrics`);
- test classes seen in training: also ``linear_accuracy``, the piecewise-linear probe of Atlas
  (Table 2), one chart for methods without charts (the ordinary linear probe), fitted on the
  training split and scored on the test samples;
- domain pairs: retrieval within the target plus ``source_nn_accuracy``, the accuracy of
  labelling target samples by their nearest source samples.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from kdml import distributed
from kdml.config import EvalConfig
from kdml.data.dataset import DmlDataset
from kdml.data.loaders import (
    readable_batches,
    resolve_num_workers,
    sequential_loader,
    to_device,
)
from kdml.data.splits import DOMAIN, SEEN, DataSplits
from kdml.data.transforms import to_unit_float
from kdml.errors import KdmlError
from kdml.evaluation.charts import chart_retrieval_metrics, piecewise_linear_accuracy
from kdml.evaluation.collapse import collapsed, describe, warning
from kdml.evaluation.knn import as_metric
from kdml.evaluation.retrieval import retrieval_metrics
from kdml.evaluation.transfer import target_metrics
from kdml.models.method import Method
from kdml.precision import autocast
from kdml.progress import bar_disabled

Output = Tensor | tuple[Tensor, ...]
logger = logging.getLogger("kdml.evaluation")


@dataclass(frozen=True)
class Embedder:
    """How samples reach a method at test time.

    Args:
        transform: raw batch -> model input on ``device`` (the input pipeline's ``test``).
        device: where the method runs.
        batch_size: samples per batch.
        num_workers: loader processes (``-1``: automatic, see :mod:`kdml.data.loaders`).
        on_bad_image: ``"error"`` or ``"skip"`` for undecodable image files.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``: the autocast of the forward pass.
        progress: a progress bar over the batches: ``None`` on a terminal only (tqdm's rule),
            ``False`` never; only rank 0 draws one under torchrun.
    """

    transform: Callable[[Tensor], Tensor] = to_unit_float
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    batch_size: int = 256
    num_workers: int = 0
    on_bad_image: str = "error"
    precision: str = "fp32"
    progress: bool | None = None

    def inputs(self, dataset: DmlDataset,
               shard: bool = False) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """``(model inputs, labels, indices)`` of every readable sample, in dataset order;
        with ``shard`` under torchrun, only this rank's share (:func:`rank_share`)."""
        positions = rank_share(len(dataset)) if shard else None
        part = dataset if positions is None else dataset.subset(positions)
        workers = resolve_num_workers(self.num_workers, part)
        loader = sequential_loader(part, self.batch_size, workers,
                                   pin_memory=self.device.type == "cuda")
        for batch in readable_batches(loader, part, self.on_bad_image):
            indices = batch.indices if positions is None else positions[batch.indices]
            yield self.transform(to_device(batch.inputs, self.device)), batch.labels, indices


def rank_share(count: int) -> Tensor | None:
    """This rank's contiguous share of ``count`` samples, all shares of equal length (the last
    padded with its final index, removed again after the gather); ``None`` in one process."""
    world = distributed.world()
    if not world.is_distributed:
        return None
    share = -(-count // world.size)
    positions = torch.arange(world.rank * share, (world.rank + 1) * share)
    return positions.clamp(max=count - 1)


class Embedded(NamedTuple):
    """A method's outputs for a dataset, on the embedder's device (so a GPU's embeddings are
    searched on the GPU), with the labels and dataset positions of the samples (on the CPU; an
    unreadable image skipped under ``on_bad_image=skip`` has no row)."""

    values: Output
    labels: Tensor
    indices: Tensor

    def tensor(self) -> Tensor:
        """``values`` as the one [N, d] tensor of an ``embed`` (chart codes are a tuple)."""
        if isinstance(self.values, tuple):
            raise TypeError("these are chart codes, not one embedding tensor")
        return self.values


def embed_dataset(method: Method, dataset: DmlDataset,
                  embedder: Embedder | None = None) -> Embedded:
    """Test-time embeddings of every sample, in order: ``values`` is [N, d]."""
    return _run(method, method.embed, dataset, embedder or Embedder())


def chart_codes_of(method: Method, dataset: DmlDataset,
                   embedder: Embedder | None = None) -> Embedded:
    """Compressed codes of every sample: ``values`` is (chart coordinates [N, d], chart [N])."""
    return _run(method, method.chart_codes, dataset, embedder or Embedder())


# The key of a collapsed scoring's share in a run's metrics (metrics.json, eval.json).
COLLAPSED = "collapsed"


@dataclass(frozen=True)
class Scores:
    """A scoring's metrics (:func:`metric_names`) and ``collapsed``: the share of the test
    embeddings that lie at one point where at least half do
    (:func:`kdml.evaluation.collapse.collapsed`; the metrics then rest on ties and float
    rounding), else None."""

    metrics: dict[str, float]
    collapsed: float | None = None

    def recorded(self) -> dict[str, float]:
        """The metrics, and ``collapsed`` where the embeddings collapsed: what a run folder
        records and ``kdml eval`` prints."""
        if self.collapsed is None:
            return dict(self.metrics)
        return {**self.metrics, COLLAPSED: self.collapsed}


def evaluate_method(method: Method, splits: DataSplits, config: EvalConfig,
                    embedder: Embedder | None = None) -> dict[str, float]:
    """Score ``method`` on ``splits`` (see the module docstring for what is scored): the
    metrics of :func:`score_method`."""
    return score_method(method, splits, config, embedder).metrics


def score_method(method: Method, splits: DataSplits, config: EvalConfig,
                 embedder: Embedder | None = None) -> Scores:
    """Score ``method`` on ``splits``: its metrics, and whether its test embeddings collapsed
    (warned of in the log too).

    Under torchrun every rank embeds its share of each set; rank 0 scores the gathered
    embeddings and every rank returns its scores. The scoring records in
    ``splits.unreadable`` the test and gallery images ``data.on_bad_image=skip`` left out
    (only decoding finds them), so that ``splits.test_set`` then counts the samples scored."""
    embedded = _embed_for_evaluation(method, splits, embedder or Embedder())
    # every rank, each holding the gathered embeddings: a diverged model is then a
    # NonFiniteEmbeddings on all of them (from rank 0 the others had a QuietExit, so a torchrun
    # grid's later ranks stopped where rank 0 went on to the next cell, and its first
    # collective failed)
    _check_finite(embedded)
    # rank 0 scores; an error there stops the other ranks too instead of leaving them waiting
    return distributed.from_main(lambda: _score(embedded, splits, config, method.has_charts))


def _embed_for_evaluation(method: Method, splits: DataSplits,
                          embedder: Embedder) -> dict[str, Embedded]:
    """The embeddings (chart codes, for Atlas methods) each metric needs, by role."""
    parts = {"test": splits.test}
    if splits.kind == DOMAIN:
        parts["source"] = splits.train
    elif splits.kind == SEEN:
        parts["train"] = splits.train
    if splits.gallery is not None:
        parts["gallery"] = splits.gallery
    function = method.chart_codes if method.has_charts else method.embed
    return {role: _run(method, function, dataset, embedder, shard=True,
                       what=f"embedding the {role} set")
            for role, dataset in parts.items()}


class NonFiniteEmbeddings(KdmlError):
    """A method's test-time outputs hold NaN or infinite values (e.g. a diverged training)."""


def _check_finite(embedded: dict[str, Embedded]) -> None:
    for role, outputs in embedded.items():
        values = outputs.values if isinstance(outputs.values, tuple) else (outputs.values,)
        if not all(bool(torch.isfinite(part).all()) for part in values if part.is_floating_point()):
            raise NonFiniteEmbeddings(f"the {role} embeddings contain NaN or infinite values: "
                                      "the model's weights or its outputs overflowed")


def _record_unreadable(embedded: dict[str, Embedded], splits: DataSplits) -> None:
    """Keep in ``splits`` the positions of the test (and gallery) samples that
    ``data.on_bad_image=skip`` left out of this scoring, so that the "test set" line counts
    the samples its metrics are of (decoding alone finds an unreadable image)."""
    splits.unreadable = {}
    for part, dataset in (("test", splits.test), ("gallery", splits.gallery)):
        if dataset is None or part not in embedded:
            continue
        scored = torch.zeros(len(dataset), dtype=torch.bool)
        scored[embedded[part].indices] = True
        if not scored.all():
            splits.unreadable[part] = (~scored).nonzero().squeeze(1)


def _warn_of_skipped(embedded: dict[str, Embedded], splits: DataSplits) -> None:
    """Say how many samples of each set ``data.on_bad_image=skip`` left out, at each scoring
    (in train.log, or on stderr), so that its metrics are not read as those of the whole set."""
    datasets = {"test": splits.test, "gallery": splits.gallery, "train": splits.train,
                "source": splits.train}
    skipped = False
    for role, outputs in embedded.items():
        total = len(datasets[role] or ())
        if (scored := len(outputs.labels)) < total:
            skipped = True
            # a data.validation run scores its validation part in the test part's place; with
            # a gallery the test part holds the queries, as the "test set" line calls them
            said = role if role != "test" else ("validation" if splits.validation else
                                                "query" if splits.gallery is not None else role)
            one = total - scored == 1
            logger.warning("%d of the %d %s samples %s skipped as %s (data.on_bad_image=skip): "
                           "the metrics use the other %d", total - scored, total, said,
                           "was" if one else "were",
                           "an unreadable image" if one else "unreadable images", scored)
    if skipped and splits.kind != DOMAIN:
        _check_scorable(embedded)


def _check_scorable(embedded: dict[str, Embedded]) -> None:
    """The training's check of the test part (a single class scores a trivial 1; a part where
    no query has a sample of its class to retrieve scores nothing), again on what was read:
    skipped images can leave either, which the check of the listed labels had passed."""
    queries = embedded["test"].labels
    references = embedded["gallery"].labels if "gallery" in embedded else queries
    if references.unique().numel() < 2:
        raise KdmlError("the unreadable images data.on_bad_image=skip left out leave the test "
                        "part with fewer than 2 classes, so Recall@K, MAP@R and R-Precision "
                        "would be trivially 1 (or undefined); replace those images")
    scorable = (torch.isin(queries, references).any() if "gallery" in embedded
                else (queries.unique(return_counts=True)[1] > 1).any())
    if not scorable:
        raise KdmlError("the unreadable images data.on_bad_image=skip left out leave no test "
                        "query with another sample of its class to retrieve, so Recall@K is "
                        "undefined; replace those images")


def _score(embedded: dict[str, Embedded], splits: DataSplits, config: EvalConfig,
           charts: bool) -> Scores:
    _record_unreadable(embedded, splits)
    _warn_of_skipped(embedded, splits)
    ks = tuple(config.ks) or splits.eval_ks
    test = embedded["test"]
    if splits.kind == DOMAIN:
        source = embedded["source"]
        share = warn_if_collapsed(test.tensor(), config.metric)
        return Scores(target_metrics(source.values, dataset_labels(splits, source.labels),
                                     test.values, test.labels, ks=ks,
                                     metric=as_metric(config.metric), nmi=config.nmi), share)
    gallery = embedded.get("gallery")
    if charts:
        coords, index = test.values
        share = warn_if_collapsed(coords, "euclidean", index)
        reference_coords, reference_index = (None, None) if gallery is None else gallery.values
        metrics = chart_retrieval_metrics(
            coords, index, test.labels, ks=ks, nmi=config.nmi, reference_coords=reference_coords,
            reference_chart_index=reference_index,
            reference_labels=None if gallery is None else gallery.labels)
        if splits.kind == SEEN:
            train_coords, train_index = embedded["train"].values
            metrics["linear_accuracy"] = piecewise_linear_accuracy(
                train_coords, train_index, embedded["train"].labels, coords, index,
                _train_space(splits, test.labels))["accuracy"]
        return Scores(metrics, share)
    test_values = test.tensor()
    share = warn_if_collapsed(test_values, config.metric)
    metrics = retrieval_metrics(test_values, test.labels, ks=ks, metric=as_metric(config.metric),
                                reference=None if gallery is None else gallery.values,
                                reference_labels=None if gallery is None else gallery.labels,
                                nmi=config.nmi)
    if splits.kind == SEEN:
        train = embedded["train"]
        metrics["linear_accuracy"] = piecewise_linear_accuracy(
            train.values, torch.zeros(len(train.labels), dtype=torch.long), train.labels,
            test_values, torch.zeros(len(test.labels), dtype=torch.long),
            _train_space(splits, test.labels), sigmoid=False)["accuracy"]
    return Scores(metrics, share)


def metric_names(config: EvalConfig, splits: DataSplits) -> list[str]:
    """The names of the metrics :func:`evaluate_method` returns for ``splits``, known before
    anything is embedded (``train.select_metric`` is checked against them before training),
    in its order. Keep in step with :func:`_score`."""
    return scored_metric_names(tuple(config.ks) or splits.eval_ks, config.nmi, splits.kind)


def scored_metric_names(ks: Sequence[int], nmi: bool, kind: str | None = None) -> list[str]:
    """:func:`metric_names` from the Recall@K values ``ks``, ``nmi`` and the split's
    ``kind`` (None: not known yet, so without the metric a split kind adds)."""
    names = [*dict.fromkeys(f"recall@{k}" for k in ks), "map@r", "r_precision"]
    if nmi:
        names.append("nmi")
    if kind == DOMAIN:
        names.append("source_nn_accuracy")
    elif kind == SEEN:
        names.append("linear_accuracy")
    return names


def warn_if_collapsed(embeddings: Tensor, metric: str, chart_index: Tensor | None = None
                      ) -> float | None:
    """Log :func:`kdml.evaluation.collapse.warning` for a collapsed test embedding (an Atlas
    run's chart coordinates with ``chart_index``) and return the share of it at one point;
    None where it has not collapsed."""
    found = collapsed(embeddings, metric, chart_index)
    if found is None:
        return None
    logger.warning(warning(describe(found)))
    return found.share


def dataset_labels(splits: DataSplits, train_labels: Tensor) -> Tensor:
    """The training split's remapped labels (0..C-1) -> the dataset's labels."""
    return torch.tensor(splits.train_classes, dtype=torch.long)[train_labels]


def _train_space(splits: DataSplits, labels: Tensor) -> Tensor:
    """Dataset labels -> the training split's remapped labels (-1 for a class not trained)."""
    lookup = {label: index for index, label in enumerate(splits.train_classes)}
    return torch.tensor([lookup.get(int(label), -1) for label in labels])


# Every embedding path goes through here, so no autograd graph is ever kept for test data.
@torch.no_grad()
def _run(method: Method, function: Callable[[Tensor], Output], dataset: DmlDataset,
         embedder: Embedder, shard: bool = False, what: str = "embedding") -> Embedded:
    was_training = method.training
    method.eval()
    chunks: list[Output] = []
    labels: list[Tensor] = []
    indices: list[Tensor] = []
    # a large test set takes minutes to embed (SOP: 60,502 images): the batches are counted
    per_rank = -(-len(dataset) // (distributed.world().size if shard else 1))
    num_batches = -(-per_rank // embedder.batch_size)
    batches = tqdm(embedder.inputs(dataset, shard), total=num_batches, desc=what, leave=False,
                   disable=bar_disabled(embedder.progress, distributed.world().is_main))
    try:
        for inputs, batch_labels, batch_indices in batches:
            with autocast(embedder.device, embedder.precision):
                output = function(inputs)
            chunks.append(output)
            labels.append(batch_labels)
            indices.append(batch_indices)
    finally:
        method.train(was_training)
    if not chunks:
        raise KdmlError(f"{dataset.name}: no readable sample to evaluate")
    tensors = [chunk for chunk in chunks if isinstance(chunk, Tensor)]
    values: Output
    if len(tensors) == len(chunks):
        values = torch.cat(tensors)
    else:  # chart codes: a tuple of tensors per batch, concatenated part by part
        tuples = [chunk for chunk in chunks if isinstance(chunk, tuple)]
        values = tuple(torch.cat(parts) for parts in zip(*tuples, strict=True))
    embedded = Embedded(values, torch.cat(labels), torch.cat(indices))
    return _gathered(embedded) if shard and distributed.world().is_distributed else embedded


def _gathered(local: Embedded) -> Embedded:
    """Every rank's share, back in dataset order with the padding's duplicates removed."""
    parts = local.values if isinstance(local.values, tuple) else (local.values,)
    device = parts[0].device  # NCCL gathers device tensors only
    indices = distributed.gather(local.indices.to(device)).cpu()
    labels = distributed.gather(local.labels.to(device)).cpu()
    values = tuple(distributed.gather(part) for part in parts)
    positions, first = np.unique(indices.numpy(), return_index=True)
    keep = torch.from_numpy(first)
    kept = tuple(value[keep.to(value.device)] for value in values)
    return Embedded(kept if isinstance(local.values, tuple) else kept[0], labels[keep],
                    torch.from_numpy(positions))
