"""Embed a dataset with a trained method and score it. The evaluator never trains."""

from __future__ import annotations

import torch

from kdml.config import EvalConfig
from kdml.data.dataset import ArrayDataset
from kdml.evaluation.retrieval import retrieval_metrics
from kdml.training.method import Method


@torch.no_grad()
def embed_dataset(method: Method, dataset: ArrayDataset, batch_size: int = 512,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """Test-time embeddings of every sample, in order, shape [N, d] (on the CPU)."""
    was_training = method.training
    method.eval()
    chunks = [method.embed(dataset.x[start:start + batch_size].to(device)).cpu()
              for start in range(0, len(dataset), batch_size)]
    method.train(was_training)
    return torch.cat(chunks)


def evaluate_method(method: Method, dataset: ArrayDataset, config: EvalConfig,
                    device: torch.device | str = "cpu") -> dict[str, float]:
    """Retrieval metrics (Recall@K, MAP@R, R-Precision, NMI) of ``dataset`` against itself."""
    embeddings = embed_dataset(method, dataset, device=device)
    return retrieval_metrics(embeddings, dataset.y, ks=tuple(config.ks), metric=config.metric,
                             nmi=config.nmi)
