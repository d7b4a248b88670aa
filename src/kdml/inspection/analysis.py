"""``kdml analyze generalization``: the H-divergence and lambda between the embeddings of a
run's seen and unseen classes (Chu et al. 2020, Sec. 2), written to its
``generalization.json``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from kdml.data.dataset import DmlDataset
from kdml.data.domains import is_domain_dataset
from kdml.errors import KdmlError
from kdml.evaluation.collapse import collapse_warning
from kdml.evaluation.estimate import Estimate
from kdml.evaluation.evaluator import dataset_labels, embed_dataset
from kdml.evaluation.generalization import check_disjoint_classes, generalization_terms
from kdml.evaluation.knn import l2_normalize
from kdml.file_write import check_writable_folder
from kdml.training.loading import TrainedRun, run_config
from kdml.training.run_folder import RunFolder, check_json_replaceable, write_json

# generalization.json's fields that every kdml has written (written_by_kdml)
GENERALIZATION_FIELDS = ("settings", "h_divergence", "lambda")

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GeneralizationSettings:
    """How ``kdml analyze generalization`` estimates the terms (see
    :func:`~kdml.evaluation.generalization.generalization_terms`)."""

    labelled_fraction: float = 0.5
    repeats: int = 10
    neighbors: int = 1
    seed: int = 0


def labelled_count(parts: Sequence[DmlDataset]) -> int:
    """How many samples of ``parts`` the analysis scores: the labelled ones (a domain pair's
    unlabelled target samples, label -1, are left out), counted from the labels before any
    embedding."""
    return sum(int((part.labels >= 0).sum()) for part in parts)


def check_unseen_classes(run_dir: Path) -> None:
    """Refuse, from the run's ``config.yaml`` alone (before its data and model are loaded), a
    run whose test classes are by construction its training classes: a seen-holdout split or
    a registered domain pair, whose target shares the source's classes. (A feature file's, or
    a dataset's own split, is checked on its labels: :func:`analyze_generalization`.)"""
    data = run_config(RunFolder.existing(run_dir)).data
    if is_domain_dataset(data.dataset) and not data.dataset.startswith("npz:"):
        raise KdmlError(f"this run's data ({data.dataset}) is a domain pair, whose target "
                        "shares the source's classes; the analysis needs unseen classes: a "
                        "class-disjoint split of one dataset")
    if data.split == "seen-holdout":
        raise KdmlError("this run's split (data.split=seen-holdout) tests on its training "
                        "classes; the analysis needs unseen classes: a run with "
                        "data.split=class-disjoint")


def analyze_generalization(trained: TrainedRun, settings: GeneralizationSettings
                           ) -> tuple[dict[str, Estimate], Path]:
    """The H-divergence and lambda between the training (seen) and test (unseen) classes'
    embeddings (Chu et al. 2020, Sec. 2), also written to the run's ``generalization.json``.
    For a run that validated (``data.validation``), the unseen classes are its validation
    part, which it did not train on either (``"unseen": "validation"`` in the file). With a
    gallery (In-Shop, a CSV's flags) the unseen samples are the queries and the gallery."""
    path = trained.run.root / "generalization.json"
    check_json_replaceable(path, GENERALIZATION_FIELDS)  # before minutes of embedding
    # unlike eval's metrics, these are shown only once written
    check_writable_folder(path.parent, "make the run folder writable")
    splits = trained.splits
    # before minutes of embedding: a seen-holdout run's or a domain pair's classes are shared
    check_disjoint_classes(np.asarray(splits.train_classes),
                           torch.cat([part.labels for part in splits.test_parts]).numpy())
    seen = embed_dataset(trained.method, splits.train, trained.embedder)
    # With a gallery (In-Shop, a CSV's flags) the unseen classes' samples are the queries and
    # the gallery: the queries alone had been scored, silently (In-Shop's 14,218 of 26,830).
    unseen_parts = [embed_dataset(trained.method, part, trained.embedder)
                    for part in splits.test_parts]
    unseen_embeddings = torch.cat([part.tensor() for part in unseen_parts])
    # The classifiers rank by Euclidean distance: on unit rows that is the cosine ranking the
    # run is evaluated with (Atlas runs' manifold distance has no such form: distance_note)
    cosine = not trained.method.has_charts and trained.config.eval.metric == "cosine"
    unseen_part = "validation" if splits.validation else "test"
    for embeddings, name in ((seen.tensor(), "the seen classes' embeddings"),
                             (unseen_embeddings,
                              f"the unseen ({unseen_part}) classes' embeddings")):
        warning = collapse_warning(embeddings, "cosine" if cosine else "euclidean", name,
                                   "the H-divergence and lambda")
        if warning is not None:
            _log.warning(warning)
    seen_x, unseen_x = (part.float().cpu().numpy()
                        for part in (seen.tensor(), unseen_embeddings))
    unseen_labels = torch.cat([part.labels for part in unseen_parts]).numpy()
    # a domain pair's unlabelled target samples (-1) would be a class of their own to the
    # classifiers of lambda (it had been 0.53 where the same data without them gave 0.00)
    labelled = unseen_labels >= 0
    if not labelled.all():
        _log.warning("%d unlabelled samples (label -1) of the unseen classes are left out of "
                     "the H-divergence and lambda", int((~labelled).sum()))
        unseen_x, unseen_labels = unseen_x[labelled], unseen_labels[labelled]
    if cosine:
        seen_x, unseen_x = l2_normalize(seen_x, inplace=True), l2_normalize(unseen_x, True)
    terms = generalization_terms(
        seen_x, dataset_labels(splits, seen.labels).numpy(), unseen_x, unseen_labels,
        labelled_fraction=settings.labelled_fraction, repeats=settings.repeats,
        neighbors=settings.neighbors, seed=settings.seed)
    distance = ("euclidean on the Atlas embedding" if trained.method.has_charts else
                "cosine" if cosine else "euclidean")
    written = {"settings": {**dataclasses.asdict(settings), "epoch": trained.epoch},
               "distance": distance, "unseen": unseen_part,
               **{name: estimate.to_dict() for name, estimate in terms.items()}}
    # the run folder checked again: moved or deleted while embedded, it had been made again
    write_json(written, trained.run.output(path), GENERALIZATION_FIELDS)
    return terms, path
