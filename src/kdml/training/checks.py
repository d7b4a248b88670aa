"""Refusals and warnings about a run's settings and data, said before anything trains: the
method against the splits, the distributed settings, the test set's scorability."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from kdml.config import RunConfig, flatten
from kdml.data.domains import is_domain_dataset
from kdml.data.fingerprint import rank_difference
from kdml.data.loaders import first_line
from kdml.data.prepare import check_pca_dataset
from kdml.data.registry import PATH_FORMATS, ROOT_VARIABLE, check_root_is_read
from kdml.data.splits import DOMAIN, SEEN, DataSplits
from kdml.distributed import World
from kdml.errors import KdmlError, counted
from kdml.evaluation.evaluator import metric_names
from kdml.launch import processes_on_this_machine
from kdml.models.backbones import check_backbone_name
from kdml.models.method import Method
from kdml.training.build import model_input_shape
from kdml.training.domain_adapted import DomainAdaptedMethod
from kdml.training.recipes import get_recipe
from kdml.training.recipes.jrd import JRDMethod
from kdml.training.selection import check_selectable


def check_recipe_data(config: RunConfig) -> None:
    """Refuse, before the data is read, a recipe that cannot train on ``data.dataset``'s kind:
    the SimCLR recipes on a domain pair, whose samples are feature vectors they cannot augment
    (it had been refused as "data.split does not apply to a domain pair; drop it", of the
    recipe's own default split, and with that dropped, at its first step); and a
    ``model.backbone`` the recipe cannot take (:attr:`Recipe.check_backbone`: DTML's family
    takes identity only; ``model.backbone=cnn`` had been refused by the backbone's check of
    the data's shape, "backbone 'cnn' needs square images", before the recipe's clearer
    word); and a dataset that is no domain pair for a recipe that trains on a target domain
    (:attr:`Recipe.needs_target`: dtml on folder:DIR had built its network over the images'
    flattened pixels, "out of memory (tried to allocate 84.4 GiB)", before it was refused); and
    a domain pair for a recipe scored by chart retrieval (:attr:`Recipe.has_charts`: mtriplet
    had read the pair first)."""
    recipe = get_recipe(config.recipe)
    if recipe.check_backbone is not None:  # before build_backbone's checks of the data's shape
        recipe.check_backbone(config)
    if recipe.needs_target and not is_domain_dataset(config.data.dataset):
        raise _needs_target(config.recipe)
    if recipe.augments_images and is_domain_dataset(config.data.dataset):
        raise KdmlError(f"{config.recipe} augments images into two views, and a domain pair "
                        f"({config.data.dataset}) holds feature vectors, so it cannot train on "
                        "one; train it on an image dataset, or train dtml or dstml on the "
                        "pair (or a recipe without charts with domain.beta, e.g. jrd)")
    if recipe.has_charts and is_domain_dataset(config.data.dataset):
        raise _no_charts_across_domains(config.recipe)


def _no_charts_across_domains(recipe: str) -> KdmlError:
    return KdmlError(f"{recipe} is scored by chart retrieval, which kdml does not do across a "
                     "domain pair; train it on one dataset, or train a recipe without charts "
                     "(e.g. triplet) on the pair, with domain.beta")


def _needs_target(recipe: str) -> KdmlError:
    return KdmlError(f"{recipe} needs a target domain: set data.dataset to a domain pair such "
                     "as mnist5k->digits")


def check_before_data(config: RunConfig) -> None:
    """Refuse, before the data is read, the settings that are wrong whatever the data: the
    recipe against the dataset's kind (:func:`check_recipe_data`), a ``data.pca_dim`` on a
    dataset that is not a domain pair, a ``data.root`` that the dataset does not read and a
    ``model.backbone`` that names no backbone (or has no stem for ``model.small_input``). A
    grid checks every cell so before the first trains; each had been refused at its cell's
    turn, after the cells before it trained into a folder that the corrected grid may not
    reuse."""
    check_recipe_data(config)
    check_pca_dataset(config.data)
    check_root_is_read(config.data.dataset, config.data.root)
    check_backbone_name(config.model.backbone, config.model.small_input)
    _check_cosine_embedding_width(config)


def _check_cosine_embedding_width(config: RunConfig) -> None:
    """Refuse a 1-D embedding scored by cosine: scaled to unit length it is -1 or +1, so the
    run had trained every epoch and then warned that its test embeddings collapsed, advising
    lower learning rates, a cause the setting was not."""
    sizes_embedding = get_recipe(config.recipe).embedding_setting == "model.embedding_size"
    if sizes_embedding and config.model.embedding_size == 1 and config.eval.metric == "cosine":
        raise KdmlError("model.embedding_size=1 with eval.metric=cosine scores each embedding "
                        "by its sign alone (scaled to unit length, a 1-D embedding is -1 or "
                        "+1), so the test samples tie in two groups; set "
                        "model.embedding_size to 2 or more")


def check_method_on_splits(config: RunConfig, splits: DataSplits, method: Method) -> None:
    """Refuse, before anything trains, a recipe that cannot train or be scored on these
    splits: each of these had failed only when the first epoch was scored, losing it. (Not on
    loading a trained run: its config was taken when it trained.)"""
    if method.augments_inputs and len(splits.train.sample_shape) != 3:
        # it had been refused at the first step, after the run folder was made
        raise KdmlError(f"{config.recipe} augments images [C, H, W]; {splits.train.name} has "
                        f"inputs of shape {tuple(splits.train.sample_shape)}: train it on an "
                        "image dataset")
    crop = getattr(config.method, "crop_size", 0)
    if method.augments_inputs and config.model.backbone == "mlp" and crop:
        # an MLP takes inputs of the size it was built for: torch's "mat1 and mat2 shapes
        # cannot be multiplied" had stopped the first step, after the run folder was made.
        # Image files reach the method as their data.image_size centre crop (InputPipeline),
        # not at their decoded data.resize side: compared with that side, a crop_size equal
        # to image_size had been refused, and one equal to resize let through to torch's error
        file_backed = splits.train.is_file_backed
        sides = ((config.data.image_size,) * 2 if file_backed
                 else tuple(splits.train.sample_shape[1:]))
        if sides != (crop, crop):
            side = "x".join(map(str, sides))
            whose = "its images' data.image_size crop" if file_backed else "its dataset's"
            raise KdmlError(f"model.backbone=mlp takes inputs of {side} pixels, {whose}, "
                            f"and method.crop_size={crop} crops the views to {crop}x{crop}; "
                            "set method.crop_size=0 (views of the input's size)")
    inner = method.inner if isinstance(method, DomainAdaptedMethod) else method
    if method.augments_inputs and crop:
        _check_views_fit_backbone(config, splits, inner.backbone, crop)
    if method.uses_target and splits.target is None:
        raise _needs_target(config.recipe)
    if config.train.sharded_kernels and not (isinstance(inner, JRDMethod) and inner.sharded):
        # under torchrun (a single process refuses it in check_distributed): it had been
        # taken and ignored, every kernel matrix gathered whole
        raise KdmlError(f"train.sharded_kernels splits JRS's kernel rows, and {config.recipe} "
                        "has no JRS regularizer: drop it (it applies where "
                        "method.regularizer=jrs, as in jrd)")
    if isinstance(method, DomainAdaptedMethod) and method.inner.needs_fit:
        # it had been refused as having "no closed-form fit", which the wrapper hid
        raise KdmlError(f"{config.recipe} is fitted in closed form and trains nothing, so "
                        "domain.beta (a training term) does not apply to it; drop it")
    if config.domain.beta > 0 and isinstance(method, DomainAdaptedMethod) and (
            method.inner.uses_target):
        raise KdmlError(f"{config.recipe} has its own domain term between source and "
                        "target: set method.beta, not domain.beta")
    if method.has_charts and config.eval.metric != "euclidean":
        raise KdmlError(f"{config.recipe} is scored by chart retrieval, with the manifold "
                        f"distance (Euclidean within a chart): eval.metric={config.eval.metric} "
                        "does not apply to it; drop it")
    if splits.kind == DOMAIN and method.has_charts:  # a recipe registered without has_charts
        raise _no_charts_across_domains(config.recipe)


def _check_views_fit_backbone(config: RunConfig, splits: DataSplits, backbone: nn.Module,
                              crop: int) -> None:
    """Refuse views of ``method.crop_size`` that the backbone's layers shrink to nothing, by
    one blank view through it: it is built for the input's size, and the small CNN's
    max-pools (BN-Inception's, a timm model's) had failed on 1x1 views with torch's traceback
    at the first step, after the run folder was made."""
    shape = model_input_shape(config, splits.train)
    was_training = backbone.training
    backbone.eval()  # BatchNorm's running statistics stay as they are
    try:
        with torch.no_grad():
            backbone(torch.zeros(1, shape[0], crop, crop))
    except (RuntimeError, AssertionError) as error:  # torch's shape checks, timm's asserts
        reason = first_line(str(error)) or "an error"
        side = "x".join(map(str, shape[1:]))
        raise KdmlError(f"method.crop_size={crop} crops the views to {crop}x{crop}, which "
                        f"model.backbone={config.model.backbone} cannot take ({reason}); "
                        f"raise method.crop_size, or set it to 0 (views of the input's size, "
                        f"{side})") from None
    finally:
        backbone.train(was_training)


def check_batch_needs(config: RunConfig, method: Method) -> None:
    """Refuse class-balanced batches (``data.samples_per_class`` m > 0) that hold too few
    samples of a class, or too few classes, for the method's metric term
    (:attr:`~kdml.models.method.Method.batch_needs`): it was exactly 0 at every step (m = 1
    for a triplet loss, one class a batch for JRS), and the run trained without it, silently.
    Plain shuffled batches (m = 0) and the whole split as one batch are drawn, not checked."""
    m, batch_size = config.data.samples_per_class, config.data.batch_size
    if not m or not batch_size:
        return
    per_class, classes, term = method.batch_needs
    if m < per_class:
        raise KdmlError(f"data.samples_per_class={m} puts {m} sample of each class in a batch, "
                        f"where {config.recipe}'s {term} needs {per_class}: its term would be "
                        f"0 at every step; set data.samples_per_class to {per_class} or more")
    if batch_size // m < classes:
        raise KdmlError(f"data.batch_size={batch_size} with data.samples_per_class={m} puts one "
                        f"class in each batch, where {config.recipe}'s {term} needs {classes}: "
                        f"its term would be 0 at every step; set data.batch_size to "
                        f"{classes * m} or more")


def check_distributed(config: RunConfig, world: World, device: torch.device,
                      draws_batches: bool = True, resumed: bool = False) -> None:
    """Refuse, before anything runs, settings that cannot work over several processes
    (``draws_batches``: the recipe trains on batches, whose size must then split over them).
    ``resumed``: a run resumed from a checkpoint, which keeps its ``data.batch_size``
    (``--resume`` refuses an edit of it), so a batch that does not split is mended by the
    number of processes instead (:func:`resumed_batch_remedy`)."""
    if config.model.sync_bn and device.type != "cuda":
        raise KdmlError("model.sync_bn needs GPUs (torch's SyncBatchNorm runs on CUDA only); "
                        "drop it on CPUs")
    if config.train.sharded_kernels and not world.is_distributed:
        raise KdmlError("train.sharded_kernels splits JRS's kernel rows over torchrun's "
                        "processes; launch with torchrun or drop it")
    if not world.is_distributed:
        return
    local = processes_on_this_machine(world.size)
    if config.train.device.startswith("cuda:") and local > 1:
        # every process of this machine on that one GPU: NCCL refuses it, in an error of its
        # own (one process per machine may name its GPU)
        raise KdmlError(f"train.device={config.train.device} puts all {local} processes of "
                        "this machine on one GPU; under torchrun give train.device=cuda (or "
                        "auto), and each process takes its own (LOCAL_RANK); pick the GPUs with "
                        "CUDA_VISIBLE_DEVICES")
    if config.data.on_bad_image == "skip":
        raise KdmlError("data.on_bad_image=skip would leave the processes' batches unequal; "
                        "use error under torchrun")
    if not draws_batches:  # PCA, fitted on the whole split: data.batch_size sizes nothing
        return
    batch_size = config.data.batch_size
    if batch_size % world.size:
        remedy = (resumed_batch_remedy(batch_size, world.size) if resumed else
                  new_batch_remedy(batch_size, world.size, config.data.samples_per_class))
        raise KdmlError(f"data.batch_size={batch_size} is the global batch and must split "
                        f"evenly over the {world.size} processes; {remedy}")
    if 0 < batch_size < 2 * world.size:
        # as one process needs 2: BatchNorm cannot normalise one sample of features (torch's
        # "Expected more than 1 value per channel" had stopped every process with a traceback)
        remedy = (resumed_batch_remedy(batch_size, world.size) if resumed else
                  f"set data.batch_size to {2 * world.size} or more")
        raise KdmlError(f"data.batch_size={batch_size} gives each of the {world.size} "
                        "processes one sample; each needs at least 2, as a single process "
                        f"does: {remedy}")


# Settings each process may hold its own value of: where its machine keeps the data and the
# weights (the data itself is compared), its loader processes and embedding batches.
OWN_SETTINGS = frozenset({"data.root", "model.weights", "data.num_workers",
                          "eval.embed_batch_size"})


def check_same_run(configs: list[dict[str, Any]], fingerprints: list[dict[str, Any]]) -> None:
    """Refuse ranks that train other settings or read other data (each rank's
    ``config.to_dict()`` and :func:`~kdml.data.fingerprint.data_fingerprint`, in rank order):
    every rank draws the same global batches by index from its own copy of the data and steps
    its own optimiser, so a copy of other size had stopped them in mismatched collectives
    ("Received data size doesn't match expected size", or a wait of 30 minutes), and other
    samples, labels or settings (another config file on one machine) trained and scored a
    mixture without a word."""
    for rank in range(1, len(configs)):
        setting = _differing_setting(configs[0], configs[rank])
        if setting is not None:
            key, first, other = setting
            raise KdmlError(f"the processes train different settings: {key} is {first!r} on "
                            f"rank 0 and {other!r} on rank {rank} (another config file or "
                            "command); start every process with the same command and config")
        difference = rank_difference(fingerprints[0], fingerprints[rank], rank)
        if difference is not None:
            raise KdmlError(f"the processes read different data for "
                            f"{configs[0]['data']['dataset']}: {difference}; every process "
                            "must read the same data (on several machines, the same copy: "
                            f"check data.root, ${ROOT_VARIABLE} and the dataset's files on "
                            "each)")


def _differing_setting(first: dict[str, Any], other: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first setting (its key, ``first``'s value and ``other``'s) in which two configs'
    ``to_dict()`` differ, leaving out :data:`OWN_SETTINGS`; a path-named dataset's path may
    differ, not its kind."""
    flat_first, flat_other = flatten(first), flatten(other)
    for key in sorted(set(flat_first) | set(flat_other)):
        values = flat_first.get(key), flat_other.get(key)
        if key in OWN_SETTINGS or values[0] == values[1]:
            continue
        kinds = {value.split(":", 1)[0] for value in values if isinstance(value, str)
                 and value.startswith(tuple(PATH_FORMATS))}
        if key == "data.dataset" and len(kinds) == 1 and all(
                isinstance(value, str) and ":" in value for value in values):
            continue
        return key, *values
    return None


def new_batch_remedy(batch_size: int, size: int, samples_per_class: int = 0) -> str:
    """The data.batch_size values nearest ``batch_size`` that ``size`` processes split into
    equal shares of 2 or more: the multiples of ``size`` (of the least common multiple of
    ``size`` and ``samples_per_class``, when that is set, since a class-balanced global batch
    is whole classes) just below and just above it, the one below only where it is large
    enough. A new run may set any; a resumed one keeps its batch
    (:func:`resumed_batch_remedy`)."""
    step = math.lcm(size, samples_per_class or 1)
    smallest = -(-2 * size // step) * step  # the first multiple with 2 samples per process
    below, above = batch_size // step * step, max(batch_size // step * step + step, smallest)
    values = [below, above] if below >= smallest else [above]
    both = (f" (the {size} processes and data.samples_per_class={samples_per_class} both "
            "divide it)" if samples_per_class and step != size else "")
    floor = f" of at least {smallest}" if step < smallest and below < smallest else ""
    return (f"set data.batch_size to a multiple of {step}{both}{floor}, such as "
            f"{' or '.join(map(str, values))}")


def resumed_batch_remedy(batch_size: int, size: int, *others: int) -> str:
    """What mends a resumed run's global batch of ``batch_size`` samples that ``size``
    processes cannot share: not data.batch_size, which ``--resume`` keeps (a refusal that
    advised a new one was followed by --resume's refusal of the edit), but fewer processes,
    the most that split it, and the ``others`` (the source batch beside a target one), into
    equal shares of 2 samples or more."""
    fitting = max((count for count in range(1, size + 1)
                   if all(batch % count == 0 and batch // count >= 2
                          for batch in (batch_size, *others))), default=1)
    return (f"a resumed run keeps the global batch it trained with, so resume it in a number "
            f"of processes that splits {batch_size:,} samples into equal shares of 2 or more, "
            f"such as {fitting} (torchrun's --nproc_per_node times --nnodes)")


def check_evaluation(config: RunConfig, splits: DataSplits, selects: bool = False,
                     evaluating: bool = False, ks_given: bool = True) -> None:
    """Refuse a test set that cannot be scored, before anything is trained: a target domain
    without labels, a single class or no query with a relevant reference
    (:func:`check_test_classes`), then Recall@K values beyond the references, then a
    ``train.select_metric`` the run will not score (it had trained an epoch first). The data's
    own defects come first: lowering eval.ks would only have led to them. ``evaluating``:
    for ``kdml eval``, whose Ks come from its ``--ks`` (which the refusal then names; without
    it, ``ks_given`` False, from the run's eval.ks, which --ks replaces) and which selects no
    epoch."""
    if splits.kind == DOMAIN:
        if not (splits.test.labels >= 0).any():
            raise KdmlError(f"the target domain of {splits.test.name} has no labelled sample, so "
                            "a run cannot be scored (target retrieval and source-NN accuracy "
                            "need target labels); label some of its samples (-1 marks the "
                            "unlabelled ones)")
        if splits.reference_size < 1:
            raise KdmlError(f"the target domain of {splits.test.name} has one labelled sample, "
                            "so target retrieval has no reference to rank; label two or more "
                            "of its samples (-1 marks the unlabelled ones)")
        _check_target_classes(splits)
    else:
        check_test_classes(splits, evaluating)
    ks = config.eval.ks or splits.eval_ks
    if max(ks) > splits.reference_size:
        fitting = [str(k) for k in ks if k <= splits.reference_size] or ["1"]
        setting, example = (("--ks", f"--ks {' '.join(fitting)}") if evaluating else
                            ("eval.ks", f"eval.ks=[{', '.join(fitting)}]"))
        asks, fix = ((setting, f"lower {setting}") if ks_given or not evaluating else
                     ("the run's eval.ks", "give --ks"))
        raise KdmlError(f"{asks} asks for Recall@{max(ks)} but a test query has only "
                        f"{counted(splits.reference_size, 'reference')}; {fix}, e.g. "
                        f"'{example}'")
    if evaluating:
        return
    if config.train.keep_best or config.train.patience or (selects and splits.validation):
        check_selectable(config.train.select_metric, metric_names(config.eval, splits))


def check_test_classes(splits: DataSplits, evaluating: bool = False) -> None:
    """Refuse a test part (its gallery, where it has one) of a single class, or without a
    query that has a sample of its class to retrieve. ``evaluating``: for ``kdml eval``, which
    cannot change the run's split settings, only the data it scores (``--dataset``)."""
    references, part = (splits.test, "test") if splits.gallery is None else (splits.gallery,
                                                                             "gallery")
    if references.num_classes == 1:  # it had trained, then reported every metric as 1
        how = (_evaluated_split(splits, "at least 2 classes") if evaluating
               else _more_test_classes(splits))
        raise KdmlError(f"every {part} sample of {references.name} has the same class, so "
                        f"Recall@K, MAP@R and R-Precision would be trivially 1; {how}")
    if splits.gallery is not None:
        if not torch.isin(splits.test.labels, splits.gallery.labels).any():
            raise KdmlError(_no_query_class_in_gallery(splits.test.name, splits.gallery.name))
        return
    if not (torch.unique(splits.test.labels, return_counts=True)[1] > 1).any():
        if evaluating:
            how = _evaluated_split(splits, "two samples of a class or more")
        elif splits.validation:  # carved from the training part: data.holdout_fraction is not it
            how = ("raise data.validation, the share of each training class held out for "
                   "validation, or give each class more samples" if splits.kind == SEEN else
                   "give the validation classes at least two samples each, or train without "
                   "data.validation")
        elif splits.kind == SEEN:
            how = "raise data.holdout_fraction, the share of each class held out for testing"
        else:
            how = "use a split with at least two test samples per class"
        raise KdmlError(f"no test query of {splits.test.name} has another sample of its class "
                        f"to retrieve, so Recall@K is undefined; {how}")


def _no_query_class_in_gallery(queries: str, gallery: str) -> str:
    """The refusal of queries none of whose classes the gallery holds. Only a dataset's own
    split has a gallery (a CSV's flags, In-Shop's list), so neither a split setting nor more
    samples per class mends it: the data must mark gallery images of the queries' classes."""
    return (f"no test query of {queries} has a sample of its class in the gallery ({gallery}) "
            "to retrieve, so Recall@K is undefined; the dataset's own split chose the queries "
            "and the gallery: mark gallery images (is_gallery=1 in a CSV) of the queries' "
            "classes")


def _check_target_classes(splits: DataSplits) -> None:
    """Refuse a domain pair's target of which no labelled sample (the only ones scored) has
    another of its class to retrieve: it had trained its first epoch, then stopped when it was
    scored. A single labelled class is only warned about (:func:`warn_about_splits`):
    source_nn_accuracy still measures the transfer."""
    labels = splits.test.labels[splits.test.labels >= 0]
    if not (torch.unique(labels, return_counts=True)[1] > 1).any():
        raise KdmlError(f"no labelled target sample of {splits.test.name} has another of its "
                        "class to retrieve, so Recall@K is undefined; label at least two target "
                        "samples of a class (-1 marks the unlabelled ones)")


# What kdml eval, which splits data as the run did, can do about a test part it cannot score.
EVALUATED_SPLIT = ("the run's split settings (data.split, data.train_classes) chose it: give "
                   "--dataset a dataset of more classes, each with two samples or more")


def _evaluated_split(splits: DataSplits, lacking: str) -> str:
    """What ``kdml eval`` can change of a test part it refuses, which ``lacking`` names: only
    the data it scores. A dataset's own split (a CSV's flags, In-Shop's list) chose its part,
    not the run's split settings, which EVALUATED_SPLIT had named for it too."""
    if not splits.own_split:
        return EVALUATED_SPLIT
    part = "gallery holds" if splits.gallery is not None else "test rows hold"
    return f"the dataset's own split chose it: give --dataset one whose {part} {lacking}"


def _more_test_classes(splits: DataSplits) -> str:
    """What gives the test part (or gallery) of ``splits`` a second class."""
    if splits.own_split:  # data.train_classes is refused with a dataset's own split
        rows = ("mark gallery images (is_gallery=1 in a CSV) of at least 2 classes"
                if splits.gallery is not None else "give the dataset's own split test rows of "
                "at least 2 classes")
        return f"{rows}, or set data.split=class-disjoint"
    if splits.kind == SEEN:  # every class is tested: the dataset has one class
        return "give the dataset images of at least 2 classes"
    if splits.train.num_classes == 1:  # 2 in all: no data.train_classes leaves 2 to test
        return ("a class-disjoint split of 2 classes tests 1: give the dataset 3 classes or "
                "more, or test on held-out samples of its classes with data.split=seen-holdout")
    return "give the test part at least 2 classes (data.train_classes, or more classes)"


# A validation part of fewer classes chooses on little: an embedding that separates none of C
# equal classes already scores Recall@1 about 1/C, and a few held-out classes say little of the
# next ones.
MIN_VALIDATION_CLASSES = 5


def warn_about_splits(splits: DataSplits, log: logging.Logger) -> None:
    """Warn about data that trains but means little: a single training class (a single test
    class is refused, :func:`check_evaluation`), a validation part of fewer than
    :data:`MIN_VALIDATION_CLASSES` classes, and a domain pair whose labelled target is of one
    class or shares no class with its source (:func:`warn_about_target`)."""
    if splits.train.num_classes == 1:
        # the dataset as it is named elsewhere: the part's own name, "folder:p4/train", read
        # as a folder p4/train
        log.warning("the training split of %s has a single class: class-based losses have "
                    "nothing to separate", splits.train.name.removesuffix("/train"))
    if splits.validation and splits.test.num_classes < MIN_VALIDATION_CLASSES:
        more = ("a dataset of more classes: this validation part holds a share of every "
                "training class's samples" if splits.kind == SEEN else
                "a larger data.validation (or more training classes) holds out more")
        log.warning("the validation part holds %d classes, too few for what is chosen on it "
                    "(train.keep_best's epoch, train.patience's stop, a grid's best cell) to "
                    "mean much; %s", splits.test.num_classes, more)
    warn_about_target(splits, log)


def warn_about_target(splits: DataSplits, log: logging.Logger) -> None:
    """Warn about a domain pair whose labelled target is of one class (the target retrieval
    metrics are trivially 1) or shares no class with its source (``source_nn_accuracy`` is 0
    whatever the model); nothing for other splits. Training warns so before its first epoch,
    ``kdml eval`` before it prints the scores: they are of the data, not of the model."""
    if splits.kind != DOMAIN:
        return
    target = splits.test.labels[splits.test.labels >= 0]
    if len(torch.unique(target)) == 1:  # a single class elsewhere is refused: all trivial
        log.warning("every labelled target sample of %s has the same class, so the target "
                    "retrieval metrics (Recall@K, MAP@R, R-Precision, NMI) are trivially 1; "
                    "only source_nn_accuracy measures the model: label target samples of "
                    "two classes or more", splits.test.name)
    if not torch.isin(target, torch.tensor(splits.train_classes)).any():
        log.warning("no labelled target sample of %s has a source class, so "
                    "source_nn_accuracy (the target samples whose nearest source sample has "
                    "their label) is 0 whatever the model; the target retrieval metrics "
                    "still mean what they say", splits.test.name)
