"""``kdml search``: a run's index (``kdml index``) searched with queries, the run's data never
read and its model loaded only for queries that need embedding.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kdml.config import RunConfig
from kdml.errors import KdmlError
from kdml.evaluation.index import IndexInfo, checkpoint_fingerprint, load_index, search_index
from kdml.inspection.queries import query_vectors
from kdml.training.checkpoint import load_checkpoint
from kdml.training.loading import RunModel, chosen_checkpoint, run_config
from kdml.training.run_folder import RunFolder


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

    @property
    def reads_best(self) -> bool:
        """Whether the command reads ``best.pt`` (``--best``) rather than ``last.pt``."""
        return self.checkpoint == self.run.best_checkpoint

    def other_checkpoint_of(self, sha256: str) -> Path | None:
        """The run's other checkpoint (``last.pt`` where this reads ``best.pt``, and back)
        where its SHA-256 is ``sha256``: what an index or embeddings made without (or with)
        ``--best`` hold. Hashed only when asked: a checkpoint may be hundreds of megabytes."""
        other = self.run.checkpoint if self.reads_best else self.run.best_checkpoint
        return other if other.is_file() and checkpoint_fingerprint(other) == sha256 else None


def run_without_data(run_dir: Path, best: bool = False) -> RunWithoutData:
    """The run at ``run_dir`` and its checkpoint (``best``: ``best.pt``), refused as
    :func:`~kdml.training.loading.load_run` refuses them, without reading data or weights."""
    run = RunFolder.existing(run_dir)
    return RunWithoutData(run, run_config(run), chosen_checkpoint(run, best))


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
    scores, positions = search_index(loaded, vectors, k, charts, source=query)
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
    best = " --best" if run.reads_best else ""
    rebuild = f"'kdml index {run.run.root}{best} --out DIR'"
    built_from = Path(info.run)
    if not (built_from.is_dir() and built_from.samefile(run.run.root)):
        return (f"index {folder} was built from another checkpoint ({info.run}); build it from "
                f"this run with {rebuild}")
    other = run.other_checkpoint_of(info.checkpoint_sha256)
    if other is not None:
        flag = "without --best" if best else "with --best"
        return (f"index {folder} holds {other.name} of this run, not {run.checkpoint.name}: "
                f"search it {flag}, or build one of {run.checkpoint.name} with {rebuild}")
    then = (f"{info.checkpoint} at epoch {info.epoch}" if info.checkpoint is not None
            else "an earlier one")
    epoch = load_checkpoint(run.checkpoint)["epoch"]  # read only for this message
    if (info.checkpoint, info.epoch) == (run.checkpoint.name, epoch):  # the two sides had
        # read the same: "(last.pt at epoch 1; this search reads last.pt at epoch 1)"
        return (f"index {folder} was built from another {then} of this run than the one there "
                f"now (trained again since, or replaced); build it again with {rebuild}")
    return (f"index {folder} was built from another checkpoint of this run ({then}; this "
            f"search reads {run.checkpoint.name} at epoch {epoch}); build it again "
            f"with {rebuild}")


def results_as_json(results: list[dict[str, Any]]) -> str:
    return json.dumps(results, indent=2)
