"""Embed the evaluation data with a trained method and score it. The evaluator never trains.

What is scored depends on the split and the method:

- class-disjoint split: retrieval on the unseen test classes (Recall@K, MAP@R, R-Precision,
  NMI);
- methods with charts (Atlas): the same metrics under the manifold distance with argmax charts
  (:func:`~kdml.evaluation.charts.chart_retrieval_metrics`);
- seen-holdout split: also ``linear_accuracy``, the piecewise-linear probe of Atlas (Table 2),
  one chart for methods without charts (the ordinary linear probe), fitted on the training
  split and scored on the held-out samples;
- domain pairs: retrieval within the target plus ``source_nn_accuracy``, the accuracy of
  labelling target samples by their nearest source samples.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kdml.config import EvalConfig
from kdml.data.dataset import ArrayDataset
from kdml.data.splits import DataSplits
from kdml.evaluation.charts import chart_retrieval_metrics, piecewise_linear_accuracy
from kdml.evaluation.retrieval import retrieval_metrics
from kdml.evaluation.transfer import target_metrics
from kdml.training.method import Method

Output = torch.Tensor | tuple[torch.Tensor, ...]


@torch.no_grad()
def embed_dataset(method: Method, dataset: ArrayDataset, batch_size: int = 512,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """Test-time embeddings of every sample, in order, shape [N, d] (on the CPU)."""
    return _batched(method, method.embed, dataset, batch_size, device)


@torch.no_grad()
def chart_codes_of(method: Method, dataset: ArrayDataset, batch_size: int = 512,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Compressed codes of every sample: chart coordinates [N, d] and chart index [N]."""
    return _batched(method, method.chart_codes, dataset, batch_size, device)


def evaluate_method(method: Method, splits: DataSplits, config: EvalConfig,
                    device: torch.device | str = "cpu") -> dict[str, float]:
    """Score ``method`` on ``splits.test`` (see the module docstring for what is scored)."""
    ks, test = tuple(config.ks), splits.test
    if splits.kind == "domain":
        return target_metrics(embed_dataset(method, splits.train, device=device), splits.train.y,
                              embed_dataset(method, test, device=device), test.y, ks=ks,
                              metric=config.metric, nmi=config.nmi)
    if hasattr(method, "chart_codes"):
        coords, index = chart_codes_of(method, test, device=device)
        metrics = chart_retrieval_metrics(coords, index, test.y, ks=ks, nmi=config.nmi)
        if splits.kind == "seen-holdout":
            train_coords, train_index = chart_codes_of(method, splits.train, device=device)
            metrics["linear_accuracy"] = piecewise_linear_accuracy(
                train_coords, train_index, splits.train.y, coords, index,
                _train_space(splits, test.y))["accuracy"]
        return metrics
    embeddings = embed_dataset(method, test, device=device)
    metrics = retrieval_metrics(embeddings, test.y, ks=ks, metric=config.metric, nmi=config.nmi)
    if splits.kind == "seen-holdout":
        train_embeddings = embed_dataset(method, splits.train, device=device)
        metrics["linear_accuracy"] = piecewise_linear_accuracy(
            train_embeddings, torch.zeros(len(train_embeddings), dtype=torch.long),
            splits.train.y, embeddings, torch.zeros(len(embeddings), dtype=torch.long),
            _train_space(splits, test.y), sigmoid=False)["accuracy"]
    return metrics


def _train_space(splits: DataSplits, labels: torch.Tensor) -> torch.Tensor:
    """Dataset labels -> the training split's remapped labels (same classes when seen)."""
    lookup = {label: index for index, label in enumerate(splits.train_classes)}
    return torch.tensor([lookup.get(int(label), -1) for label in labels])


def _batched(method: Method, function: Callable[[torch.Tensor], Output], dataset: ArrayDataset,
             batch_size: int, device: torch.device | str) -> Output:
    was_training = method.training
    method.eval()
    chunks = [function(dataset.x[start:start + batch_size].to(device))
              for start in range(0, len(dataset), batch_size)]
    method.train(was_training)
    if isinstance(chunks[0], tuple):
        return tuple(torch.cat([chunk[i].cpu() for chunk in chunks])
                     for i in range(len(chunks[0])))
    return torch.cat([chunk.cpu() for chunk in chunks])
