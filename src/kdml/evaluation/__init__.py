"""Evaluation of embeddings: exact k-NN search and retrieval metrics."""

from kdml.evaluation.knn import knn_search
from kdml.evaluation.retrieval import retrieval_metrics

__all__ = ["knn_search", "retrieval_metrics"]
