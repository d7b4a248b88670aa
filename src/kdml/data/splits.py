"""Train/test splits used in deep metric learning, and the splits a run trains and scores on.

Splits work on the label array alone (no sample is decoded):

- ``standard``: the dataset's own split (CUB and Cars196: the first half of the class ids;
  SOP, CIFAR, MNIST: the files' train/test; In-Shop: train, query and gallery), or, for
  datasets without one (the offline sets, ``folder:DIR``), the class-disjoint split;
- ``class-disjoint``: the sorted classes cut in two (``data.train_classes``);
- ``seen-holdout``: every class on both sides, ``data.holdout_fraction`` of each class's
  samples held out (the Atlas experiments).

``data.validation`` > 0 carves a validation part out of the training part, for choosing
hyperparameters without the test part (the papers' protocol: Korman's ``triplet.py`` holds out
the last 20% of the training classes): where the test classes are unseen, the last
``validation`` share of the sorted training classes, rounded half up (0.2 of Cars196's 98 holds
out 20, where ``triplet.py``'s ``label < 0.8 * 98`` holds out 19; of CUB's 100, 20 in both);
where they are seen, that share of every training class's samples. The run then trains on the
rest and scores the validation part in place of the test part, which it never touches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from kdml.checks import check_label_vector, is_finite_number
from kdml.data.dataset import DmlDataset, renamed_classes
from kdml.errors import KdmlError
from kdml.seeding import torch_seed

if TYPE_CHECKING:  # a type only: domains would bring the datasets' readers with it
    from kdml.data.domains import SourcePCA

SPLITS = ("standard", "class-disjoint", "seen-holdout")
UNSEEN, SEEN, DOMAIN = "unseen", "seen", "domain"
# What the test samples are, by split kind: the words a user reads next to the test metrics.
TEST_SETS = {UNSEEN: "classes not seen in training",
             SEEN: "the training classes, held out from training",
             DOMAIN: "the target domain, whose labels training never sees"}


# TEST_SETS for another dataset than the run's (kdml eval --dataset), whose classes the run may
# have trained on: its test part is what the run's data.split makes of it, nothing more.
OTHER_TEST_SETS = {UNSEEN: "the classes of its test part (as the run's data.split divides it)",
                   SEEN: "its classes, held out as the run's data.split divides it",
                   # another pair's target may be the run's own labelled source
                   DOMAIN: "the pair's target domain"}


def counted_classes(count: int, kind: str) -> str:
    """``"3,985 classes not seen in training"``: :data:`TEST_SETS`'s words with a count (of a
    query/gallery split, never a domain pair's)."""
    if kind == SEEN:
        return f"{count:,} training classes, held out from training"
    return f"{count:,} {TEST_SETS[UNSEEN]}"


@dataclass
class DataSplits:
    """What the trainer trains on and the evaluator scores.

    ``train`` labels are remapped to 0..C-1 (``train_classes`` maps them back); ``test`` keeps
    the dataset's labels. With a ``gallery`` (In-Shop), ``test`` holds the queries and each is
    searched in the gallery; otherwise the test samples are searched among themselves
    (leave-one-out). For a domain pair, ``train`` is the labelled source, ``target`` the target
    samples whose labels the method never sees, and ``test`` the same target samples with their
    labels, for evaluation only.

    ``kind`` is ``"unseen"`` when the test classes are not training classes, ``"seen"`` when
    they all are (the linear probe is then scored too), ``"domain"`` for a domain pair.
    """

    train: DmlDataset
    test: DmlDataset
    train_classes: list[int]
    kind: str = UNSEEN
    gallery: DmlDataset | None = None
    target: DmlDataset | None = None
    eval_ks: tuple[int, ...] = (1, 2, 4, 8)
    validation: bool = False  # ``test`` is a validation part carved from the training part
    own_split: bool = False  # ``test`` (and ``gallery``) are the dataset's own parts
    # The positions in ``test`` and ``gallery`` (by those names) of the unreadable images that
    # the last scoring left out (data.on_bad_image=skip): only decoding finds them, so the
    # evaluator records them (and a checkpoint keeps them, for a finished run resumed), and
    # :attr:`test_set` counts the samples the metrics are of.
    unreadable: dict[str, Tensor] = field(default_factory=dict)
    # A domain pair reduced by data.pca_dim: the PCA its samples went through, as raw inputs
    # must too (None: the samples are the inputs).
    input_pca: SourcePCA | None = None
    # What the test samples are where TEST_SETS' words, which speak of training on this data,
    # would not hold: another dataset scored by a run's model (OTHER_TEST_SETS).
    test_words: str = ""

    @property
    def test_parts(self) -> list[DmlDataset]:
        """The test part and, with one, the gallery: the unseen classes' samples, all of them
        (the queries alone had stood for them in ``kdml analyze generalization``)."""
        return [self.test] if self.gallery is None else [self.test, self.gallery]

    @property
    def test_set(self) -> str:
        """One line on the test samples, e.g. ``"1,000 samples of classes not seen in
        training"``, or with a gallery ``"14,218 query and 12,612 gallery samples of 3,985
        classes not seen in training"``, saying how many queries retrieval leaves out
        (:meth:`lone_queries`). Once a scoring has left out unreadable images
        (:attr:`unreadable`), it counts the samples scored, and says how many were left out."""
        queries = self.scored_labels("test", self.test)
        if self.validation:
            line = (f"{len(queries):,} validation samples of {TEST_SETS[self.kind]}, carved "
                    "from the training part (data.validation; the test part is not used)")
        elif self.gallery is not None:
            references = self.scored_labels("gallery", self.gallery)
            classes = torch.cat([queries, references]).unique().numel()
            line = (f"{len(queries):,} query and {len(references):,} gallery samples of "
                    + (f"{classes:,} classes, {self.test_words}" if self.test_words else
                       counted_classes(classes, self.kind)))
        else:
            line = f"{len(queries):,} samples of {self.test_words or TEST_SETS[self.kind]}"
        return (line + self.unlabelled_note(queries) + self.lone_queries_note()
                + self.unreadable_note())

    def unlabelled_note(self, labels: Tensor) -> str:
        """``""``, or the clause counting a domain pair's unlabelled target samples (label
        -1, an ``npz:`` file's): the metrics leave them out (:func:`~kdml.evaluation.transfer.
        target_metrics`), so the line says how many of the samples it counts are labelled."""
        unlabelled = int((labels < 0).sum()) if self.kind == DOMAIN else 0
        if not unlabelled:
            return ""
        return (f", {len(labels) - unlabelled:,} of them labelled ({unlabelled:,} unlabelled, "
                "which the metrics leave out)")

    def scored_labels(self, part: str, dataset: DmlDataset) -> Tensor:
        """The labels of ``dataset``, the ``"test"`` or ``"gallery"`` part, that are scored:
        all of them but the :attr:`unreadable` images the last scoring left out."""
        left_out = self.unreadable.get(part)
        if left_out is None:
            return dataset.labels
        scored = torch.ones(len(dataset), dtype=torch.bool)
        scored[left_out] = False
        return dataset.labels[scored]

    def lone_queries(self) -> int:
        """How many test queries have nothing to retrieve, so that Recall@K, MAP@R and
        R-Precision leave them out (as PML's ``AccuracyCalculator``): with a gallery, the
        queries whose class has no gallery sample; without, each sample that is the only one
        of its class; of a domain pair's target, its labelled samples (the metrics leave out
        those labelled -1). Of the samples scored: an unreadable image left out can leave a
        query alone."""
        labels = self.scored_labels("test", self.test)
        if self.kind == DOMAIN:
            labels = labels[labels >= 0]
        if self.gallery is not None:
            return int((~torch.isin(labels, self.scored_labels("gallery", self.gallery))).sum())
        _, inverse, counts = labels.unique(return_inverse=True, return_counts=True)
        return int((counts[inverse] == 1).sum())

    def lone_queries_note(self) -> str:
        """``""``, or the clause of :attr:`test_set` that counts :meth:`lone_queries`."""
        lone = self.lone_queries()
        if not lone:
            return ""
        one = lone == 1
        left_out = ("(nothing to retrieve): Recall@K, MAP@R and R-Precision leave "
                    f"{'it' if one else 'them'} out")
        if self.gallery is not None:
            return (f"; {lone:,} {'query has' if one else 'queries have'} no gallery sample of "
                    f"{'its' if one else 'their'} class {left_out}")
        return (f"; {lone:,} of them {'is' if one else 'are'} the only sample of "
                f"{'its' if one else 'their'} class and cannot be {'a query' if one else 'queries'}"
                f" {left_out}")

    def unreadable_note(self) -> str:
        """``""``, or the clause of :attr:`test_set` that counts the :attr:`unreadable` images
        left out, of those listed (the count the line had shown)."""
        left_out = sum(len(positions) for positions in self.unreadable.values())
        if not left_out:
            return ""
        listed = len(self.test) + (len(self.gallery) if self.gallery is not None else 0)
        one = left_out == 1
        return (f"; {left_out:,} unreadable image{'' if one else 's'} of the {listed:,} listed "
                f"{'was' if one else 'were'} left out (data.on_bad_image=skip)")

    @property
    def reference_size(self) -> int:
        """How many references a test query is searched among: of a domain pair's target, its
        labelled samples alone (the metrics leave the unlabelled, -1, out)."""
        if self.gallery is not None:
            return len(self.gallery)
        if self.kind == DOMAIN:
            return int((self.test.labels >= 0).sum()) - 1
        return len(self.test) - 1


def class_disjoint_split(
    labels: Tensor, train_classes: float | int = 0.5
) -> tuple[Tensor, Tensor]:
    """Split by class, as in DML benchmarks (CUB: classes 1-100 train, 101-200 test).

    The sorted classes are cut in two: the first ``train_classes`` go to training and the rest to
    testing, so test classes are never seen in training.

    Args:
        labels: integer labels, shape [N].
        train_classes: a fraction in (0, 1) of the classes, rounded down (7 classes at 0.5:
            3 train, 4 test), or a count >= 1.

    Returns:
        ``(train_indices, test_indices)``, each a sorted long tensor.
    """
    check_label_vector("class_disjoint_split", labels)
    classes = labels.unique(sorted=True)
    num_train = _num_train_classes(classes.numel(), train_classes)
    is_train = torch.isin(labels, classes[:num_train])
    return is_train.nonzero().squeeze(1), (~is_train).nonzero().squeeze(1)


def seen_holdout_split(
    labels: Tensor, holdout_fraction: float = 0.2, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Hold out a fraction of every class's samples: both parts contain the same (seen) classes.

    Each class keeps at least one sample on each side when it has two or more.

    Returns:
        ``(kept_indices, held_out_indices)``, each sorted.
    """
    check_label_vector("seen_holdout_split", labels)
    # a string had raised Python's TypeError on '<', a seed of 1.5 torch's RuntimeError
    if not is_finite_number(holdout_fraction, above=0.0) or not holdout_fraction < 1.0:
        raise KdmlError(f"holdout_fraction must be in (0, 1), got {holdout_fraction!r}")
    seed = torch_seed(seed, "seen_holdout_split: seed")
    if not labels.numel():
        raise KdmlError("a seen-holdout split needs samples to hold out; the labels are empty")
    generator = torch.Generator().manual_seed(seed)
    held_out = []
    for members in class_members(labels):
        members = members[torch.randperm(members.numel(), generator=generator)]
        # half up, as validation_split's classes (round() is half-to-even: at 0.5, classes
        # of 5 and 7 samples held out 2 and 4)
        count = math.floor(holdout_fraction * members.numel() + 0.5)
        count = min(max(count, 1), members.numel() - 1) if members.numel() > 1 else 0
        held_out.append(members[:count])
    held_out_idx = torch.cat(held_out).sort().values
    is_held = torch.zeros_like(labels, dtype=torch.bool)
    is_held[held_out_idx] = True
    return (~is_held).nonzero().squeeze(1), held_out_idx


def class_members(labels: Tensor) -> list[Tensor]:
    """Each class's sample positions (ascending), one tensor per class in sorted label order.

    One stable sort of the labels: a scan of every label per class (``labels == label``) costs
    N x C, some 90 s for a seen-holdout split of Stanford Online Products' 22,634 classes."""
    order = torch.argsort(labels, stable=True)
    counts = torch.unique_consecutive(labels[order], return_counts=True)[1]
    return list(torch.split(order, counts.tolist()))


def _filling_remedy(split: str, own_parts: bool, part: str) -> str:
    """What gives an empty ``part`` of ``split`` samples (the end of its one-line error)."""
    if split == "standard" and own_parts:
        part_name = "train" if part == "training" else part
        return (f"mark some of the dataset's images {part_name} in its own split, or choose "
                f"data.split=class-disjoint or seen-holdout")
    if split == "seen-holdout":
        return "give each class at least two images, or choose data.split=class-disjoint"
    return "change data.train_classes"


def make_splits(dataset: DmlDataset, parts: dict[str, Tensor], split: str,
                train_classes: float | int = 0.5, holdout_fraction: float = 0.2,
                eval_ks: tuple[int, ...] = (1, 2, 4, 8), validation: float = 0.0) -> DataSplits:
    """The :class:`DataSplits` of ``dataset`` under ``split`` (see the module docstring).

    Args:
        dataset: every sample, with its labels.
        parts: the dataset's own split (index tensors ``train`` and ``test``, or ``train``,
            ``query`` and ``gallery``); empty when it has none.
        split: one of :data:`SPLITS`.
        validation: in [0, 1): the share of the training part to validate on instead of
            testing (0: test as usual).
    """
    if split not in SPLITS:
        raise KdmlError(f"data.split must be one of {', '.join(SPLITS)}, got {split!r}")
    gallery_idx = None
    if split == "standard" and parts:
        train_idx = parts["train"]
        test_idx = parts.get("test", parts.get("query"))
        if test_idx is None:
            raise KdmlError(f"{dataset.name}'s own split has no test or query part; choose "
                            f"another data.split")
        gallery_idx = parts.get("gallery")
    elif split == "seen-holdout":
        train_idx, test_idx = seen_holdout_split(dataset.labels, holdout_fraction, seed=0)
    else:
        train_idx, test_idx = class_disjoint_split(dataset.labels, train_classes)
    # a dataset's own query/gallery split names its parts so (In-Shop, a CSV's flags)
    test_part = "query" if gallery_idx is not None else "test"
    for part, indices in (("training", train_idx), (test_part, test_idx),
                          ("gallery", gallery_idx)):
        if indices is not None and len(indices) == 0:
            raise KdmlError(f"{dataset.name}: the {split} split leaves the {part} part empty; "
                            f"{_filling_remedy(split, bool(parts), part)}")
    # the gallery is scored too: a gallery image of a training class had passed as unseen
    refuse_partly_seen(dataset, train_idx, test_idx if gallery_idx is None
                       else torch.cat([test_idx, gallery_idx]))
    test_name = "test"
    if validation:
        seen = bool(torch.isin(dataset.labels[test_idx], dataset.labels[train_idx]).all())
        keep, held = validation_split(dataset.labels[train_idx], validation, seen)
        train_idx, test_idx, gallery_idx = train_idx[keep], train_idx[held], None
        test_name = "validation"
    train = dataset.subset(train_idx, f"{dataset.name}/train")
    classes, remapped = torch.unique(train.labels, return_inverse=True)
    test = dataset.subset(test_idx, f"{dataset.name}/{test_name}")
    gallery = None if gallery_idx is None else dataset.subset(gallery_idx,
                                                              f"{dataset.name}/gallery")
    seen = bool(torch.isin(test.labels, classes).all())
    return DataSplits(remapped_to_training(train, classes, remapped), test, classes.tolist(),
                      SEEN if seen else UNSEEN, gallery=gallery, eval_ks=eval_ks,
                      validation=bool(validation),
                      own_split=split == "standard" and bool(parts) and not validation)


def refuse_partly_seen(dataset: DmlDataset, train_idx: Tensor, test_idx: Tensor) -> None:
    """Refuse a split (a dataset's own, such as a CSV's) whose test classes are partly training
    classes: the run could neither call them unseen nor score a probe on them, and their
    samples would match samples of the same class trained on, raising Recall@K. With a
    gallery, ``test_idx`` holds the queries and the gallery."""
    test_classes = dataset.labels[test_idx].unique()
    trained = torch.isin(test_classes, dataset.labels[train_idx].unique())
    if not trained.any() or trained.all():  # unseen, or seen: both are scored as such
        return
    label = int(test_classes[trained][0])
    name = dataset.class_name(label)
    example = f"{name!r}" if name is not None else f"label {label}"
    raise KdmlError(f"{dataset.name}: its train and test parts share {int(trained.sum())} of "
                    f"the {len(test_classes)} test classes (e.g. {example}); put each class on one "
                    "side (a test of unseen classes) or train on every test class (a test of "
                    "seen classes), or set data.split=class-disjoint or seen-holdout")


def validation_split(labels: Tensor, share: float, seen: bool) -> tuple[Tensor, Tensor]:
    """Positions in the training part ``labels`` [N] to keep training on and to validate on.

    ``seen``: the test classes are training classes, so the validation part holds out ``share``
    of every class's samples (as ``seen-holdout``); otherwise the last ``share`` of the sorted
    classes (as ``class-disjoint``), so validation classes are unseen too.
    """
    # NaN too, which math.floor below had raised a ValueError on (a string a TypeError)
    if not is_finite_number(share, above=0.0) or not share < 1.0:
        raise KdmlError(f"data.validation must be a share in (0, 1), got {share!r}")
    if seen:
        return seen_holdout_split(labels, share, seed=0)
    classes = labels.unique(sorted=True)
    # half up (round() is half-to-even: 5 classes at 0.5 had held out 2, 7 had held out 4), so
    # an odd class goes to the held-out side, as the class-disjoint split gives it to testing
    held = math.floor(share * classes.numel() + 0.5)
    if not 2 <= held < classes.numel():  # one class would make every Recall@K trivially 1
        raise KdmlError(f"data.validation={share} of the {classes.numel()} training classes "
                        f"holds out {held}; choose a share that holds out at least 2 classes "
                        "and trains on at least 1")
    return class_disjoint_split(labels, classes.numel() - held)


def remapped_to_training(train: DmlDataset, classes: Tensor, remapped: Tensor) -> DmlDataset:
    """``train`` with labels 0..C-1 (``remapped``; ``classes`` [C] are the old labels), its
    class names following them."""
    new_label_of = {old: new for new, old in enumerate(classes.tolist())}
    return train.relabelled(remapped, renamed_classes(train.class_names, new_label_of))


def _num_train_classes(num_classes: int, train_classes: float | int) -> int:
    if num_classes < 2:
        raise KdmlError(f"a class-disjoint split needs at least 2 classes, got {num_classes}")
    # a NumPy float is a fraction too (np.float32(0.5) had been refused as "got 0.5"), a string
    # none (Python's TypeError on '>='); True is 1 to Python, no class count
    fraction = (is_finite_number(train_classes) and not isinstance(train_classes, int | np.integer)
                and 0.0 < float(train_classes) < 1.0)
    if fraction:
        # the decimal written: float(np.float32(0.7)) is 0.69999999, 6 of 10 classes
        share = float(str(train_classes)) if isinstance(train_classes, np.floating) else float(
            train_classes)
        # rounded down, as the benchmarks' first half (CUB, Cars: len // 2): an odd class goes
        # to testing (round() had sent it either way: 3 -> 2 / 1 but 5 -> 2 / 3)
        count = math.floor(share * num_classes + 1e-9)
    elif (is_finite_number(train_classes, at_least=1.0)
          and float(train_classes).is_integer()):
        count = int(train_classes)
    else:
        raise KdmlError(
            f"train_classes must be a fraction in (0, 1) or a class count, got {train_classes!r}"
        )
    if not 1 <= count < num_classes:
        # a count past the classes there are (1e300) had been printed in its 301 digits
        leaves = (f"leaves {count} of {num_classes}" if count <= num_classes
                  else f"asks for more than the {num_classes}")
        raise ClassCountError(
            f"train_classes={train_classes} {leaves} classes for training; both sides need at "
            "least one class", count, num_classes)
    return count


class ClassCountError(KdmlError):
    """``data.train_classes`` that leaves one side of a class-disjoint split empty: ``count``
    classes for training of the dataset's ``num_classes``."""

    def __init__(self, message: str, count: int, num_classes: int) -> None:
        super().__init__(message)
        self.count, self.num_classes = count, num_classes
