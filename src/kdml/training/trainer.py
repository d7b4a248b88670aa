"""The one training loop. Recipes only assemble parts; the evaluator computes the metrics.

Data flows one way: a batch sampler picks indices, a ``DataLoader`` (worker processes for image
files) yields raw batches, the input pipeline augments and normalises them on the training
device, the method returns its loss terms as tensors, and the trainer reduces them once per
epoch.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import re
import time
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from kdml import distributed
from kdml.config import (
    SECTIONS,
    ModelConfig,
    RunConfig,
    load_config_file,
    resolve_config,
    save_config,
    with_absolute_paths,
)
from kdml.data.dataset import Batch
from kdml.data.fingerprint import FORMAT as FINGERPRINT_FORMAT
from kdml.data.fingerprint import FORMAT_FIELD, data_fingerprint, fingerprint_difference
from kdml.data.loaders import batch_loader, readable_batches, resolve_num_workers, to_device
from kdml.data.prepare import prepare_data_and_test_part
from kdml.data.registry import PATH_FORMATS, relocated, root_is_read
from kdml.data.sample_spec import FIELD as SAMPLES_FIELD
from kdml.data.sample_spec import Samples, SampleSpec
from kdml.data.samplers import (
    ClassBalancedBatches,
    EpochBatches,
    RankShare,
    ShuffledBatches,
    TargetBatches,
    check_batching,
)
from kdml.data.splits import DOMAIN, SEEN, DataSplits
from kdml.data.transforms import InputPipeline, Normalization
from kdml.distributed import World
from kdml.errors import KdmlError, Terminated, why_missing
from kdml.evaluation.evaluator import (
    Embedder,
    NonFiniteEmbeddings,
    metric_names,
    score_method,
)
from kdml.kernels import GaussianMixtureKernel
from kdml.models.backbones import build_backbone, freeze_batchnorm
from kdml.models.method import Method
from kdml.models.weights import load_weights
from kdml.precision import autocast, gradient_scaler
from kdml.progress import bar_disabled
from kdml.regularizers.domain import DomainMMD
from kdml.seeding import AUGMENT, BatchShare, StepRandom, with_cpu_seed
from kdml.training.checkpoint import load_checkpoint, partial_checkpoints, save_checkpoint
from kdml.training.determinism import make_deterministic
from kdml.training.domain_adapted import DomainAdaptedMethod
from kdml.training.nonfinite import ADVICE, NonFiniteLoss, NonFiniteWatch, kept_checkpoint
from kdml.training.recipes import get_recipe
from kdml.training.resume_settings import RESUMABLE, changed_settings
from kdml.training.run_folder import (
    NOTHING_LEFT,
    SCORED_FIRST,
    STOPPED,
    RunFolder,
    check_new_run_folder,
    check_utf8_path,
    run_logging,
    start_afresh,
    warnings_on_stderr,
)
from kdml.training.selection import (
    SCORED_PARTS,
    VALIDATION,
    as_validation_history,
    best_epoch,
    check_scored,
    check_selectable,
    part_scores,
    patience_exhausted,
    scored_prefix,
    scores,
)
from kdml.viz import plot_training

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

# Steps between reads of the non-finite flag on a GPU (each read is a host sync).
NONFINITE_CHECK_EVERY = 50

# Seconds between redraws of plots/ while a run trains; the session's end draws the last epochs.
# Drawing the two plots takes about 0.3 s on a 2-core CPU (matplotlib; 0.27 s median of 7 for
# 10 epochs), more than a small run's epoch: small runs (tests, `kdml reproduce --quick`) spent
# up to half their time redrawing them every epoch.
PLOT_EVERY_S = 30.0


# Backbones made for RGB images (BN-Inception) get grayscale images as three equal channels.
RGB_ONLY = ("bninception",)


def model_input_shape(config: RunConfig, samples: Samples) -> tuple[int, ...]:
    """What the backbone takes: the crop of file-decoded images, else the sample itself;
    three channels for a grayscale image into an RGB-only backbone."""
    shape = samples.sample_shape
    if samples.is_file_backed:
        shape = (shape[0], config.data.image_size, config.data.image_size)
    if len(shape) == 3 and shape[0] == 1 and config.model.backbone in RGB_ONLY:
        shape = (3, *shape[1:])
    return shape


def build_method(config: RunConfig, splits: DataSplits, pretrained: bool = True,
                 echo: Callable[[str], None] = print) -> Method:
    """The recipe's method for ``splits``, its initial weights drawn from ``train.seed``, and
    the backbone's from ``model.weights`` when ``pretrained``."""
    if config.domain.beta > 0 and splits.target is None:
        raise KdmlError("domain.beta > 0 needs a domain pair as data.dataset, "
                        "e.g. mnist5k->digits")
    return build_method_for(config, splits.train, len(splits.train_classes), pretrained, echo)


def build_method_for(config: RunConfig, samples: Samples, train_classes: int,
                     pretrained: bool = True, echo: Callable[[str], None] = print) -> Method:
    """:func:`build_method` for training samples like ``samples`` (a dataset, or the
    :class:`~kdml.data.sample_spec.SampleSpec` a run folder records) of ``train_classes``
    classes."""

    def build() -> Method:
        model = config.model
        backbone = build_backbone(model.backbone, model_input_shape(config, samples),
                                  samples.default_backbone, model.pooling, model.small_input)
        if pretrained and model.weights:
            load_weights(backbone, model.weights, report=echo)
        return get_recipe(config.recipe).build(config, backbone, train_classes)

    method = with_cpu_seed(config.train.seed, build)
    if config.domain.beta > 0:
        kernel = GaussianMixtureKernel() if config.domain.kernel == "gaussian" else None
        method = DomainAdaptedMethod(method, config.domain.beta, DomainMMD(kernel))
    return method


def check_method_on_splits(config: RunConfig, splits: DataSplits, method: Method) -> None:
    """Refuse, before anything trains, a recipe that cannot train or be scored on these
    splits: each of these had failed only when the first epoch was scored, losing it. (Not on
    loading a trained run: its config was taken when it trained.)"""
    if method.uses_target and splits.target is None:
        raise KdmlError(f"{config.recipe} needs a target domain: set data.dataset to a domain "
                        "pair such as mnist5k->digits")
    if config.domain.beta > 0 and isinstance(method, DomainAdaptedMethod) and (
            method.inner.uses_target):
        raise KdmlError(f"{config.recipe} has its own domain term between source and "
                        "target: set method.beta, not domain.beta")
    if method.has_charts and config.eval.metric != "euclidean":
        raise KdmlError(f"{config.recipe} is scored by chart retrieval, with the manifold "
                        f"distance (Euclidean within a chart): eval.metric={config.eval.metric} "
                        "does not apply to it; drop it")
    if splits.kind == DOMAIN and method.has_charts:
        raise KdmlError(f"{config.recipe} is scored by chart retrieval, which kdml does not do "
                        "across a domain pair; train it on one dataset, or train a recipe "
                        "without charts (e.g. triplet) on the pair, with domain.beta")


def build_pipeline(config: RunConfig, samples: Samples, method: Method) -> InputPipeline:
    """The input pipeline of samples like ``samples`` (the training part, or its record):
    crops for file-decoded images, the backbone's channels and normalisation (of test batches
    only, for methods that augment their inputs themselves)."""
    normalization = getattr(method.backbone, "normalization", None) or Normalization()
    crop = config.data.image_size if samples.is_file_backed else None
    channels = model_input_shape(config, samples)[0]
    return InputPipeline(crop, normalization, channels=channels,
                         normalize_train=not method.augments_inputs)


def build_embedder(config: RunConfig, pipeline: InputPipeline,
                   device: torch.device) -> Embedder:
    return Embedder(pipeline.test, device, config.eval.embed_batch_size, config.data.num_workers,
                    config.data.on_bad_image, config.train.precision)


Schedule = torch.optim.lr_scheduler.LRScheduler


def build_optimizer(method: Method, config: RunConfig
                    ) -> tuple[torch.optim.Optimizer | None, Schedule | None]:
    """Adam, RMSProp or plain gradient steps over the method's parameter groups, with step decay
    (``lr_step`` or ``lr_milestones``, ``lr_gamma``; Sec. 5.1 of Chu et al.) and per-epoch decay
    (``lr_decay``; DTML's lambda <- 0.95 lambda). ``(None, None)`` for a method with nothing to
    train."""
    groups = [group for group in method.param_groups(config.optim) if group["params"]]
    if not groups:
        return None, None
    optim = config.optim
    if optim.name == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(groups, eps=optim.adam_eps)
    elif optim.name == "rmsprop":
        optimizer = torch.optim.RMSprop(groups)
    else:
        optimizer = torch.optim.SGD(groups, lr=optim.lr)

    def factor(epoch: int) -> float:  # epoch: 0-based, the epochs finished so far
        if optim.lr_milestones:
            steps = bisect.bisect_right(optim.lr_milestones, epoch)
        else:
            steps = epoch // optim.lr_step if optim.lr_step else 0
        return optim.lr_gamma ** steps * optim.lr_decay ** epoch

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class RunModel:
    """A run's model on the CPU, loaded from a checkpoint, and what it takes (``samples``)."""

    run: RunFolder
    config: RunConfig
    method: Method
    epoch: int
    embedder: Embedder
    checkpoint: Path  # the file the weights came from (last.pt, or best.pt)
    samples: SampleSpec


@dataclass
class TrainedRun(RunModel):
    """A run's model and its data (``splits``: the test part's with ``load_run(test_part=)``)."""

    splits: DataSplits

    def plot_path(self, name: str) -> Path:
        """Where a plot of this model goes: ``plots/NAME.png``, or ``plots/NAME-best.png`` for
        the kept best epoch, so the two never overwrite each other."""
        best = self.checkpoint == self.run.best_checkpoint
        return self.run.plots / f"{name}{'-best' if best else ''}.png"


def run_config(run: RunFolder) -> RunConfig:
    """The configuration in a run folder's ``config.yaml``, which kdml wrote whole: a file
    without its recipe or one of its sections (cut short, emptied, or the user's own) is
    refused, where reading it as a config file would fill the gaps with defaults, silently."""
    file_values = load_config_file(run.config)
    missing = [key for key in ("recipe", *SECTIONS) if key not in file_values]
    if missing:
        raise KdmlError(f"{run.config} has no {missing[0]!r}: it is not the whole config kdml "
                        "wrote for this run (cut short, emptied or replaced); restore it, or "
                        "train the run again into a new folder")
    recipe = get_recipe(str(file_values["recipe"]))
    config = resolve_config(recipe.name, recipe.params, file_values=file_values)
    if config.data.root and not root_is_read(config.data.dataset):
        # Saved before kdml refused a root the dataset does not read: it was ignored in
        # training, so it is dropped here rather than refused for a run already trained.
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, root=""))
    return config


def chosen_checkpoint(run: RunFolder, best: bool = False) -> Path:
    """The checkpoint a command reads: ``checkpoints/best.pt`` with ``best``
    (``train.keep_best``), else ``last.pt``; one line where it is not there."""
    checkpoint = run.best_checkpoint if best else run.checkpoint
    if best and not checkpoint.is_file():
        raise KdmlError(f"{run.root} has no {checkpoint.name}: only runs trained with "
                        "train.keep_best=true keep one")
    if not checkpoint.is_file():  # load_checkpoint's one line: the run never finished an epoch
        load_checkpoint(checkpoint)
    return checkpoint


# What a refusal of changed data tells the user of kdml train --resume, and of kdml eval & co.
RESUME_DATA_REMEDY = ("put back the data the run trained on where its config.yaml says, or point "
                      "its data.root (or folder:/csv: path) at where it is now")
LOAD_DATA_REMEDY = "point --data-root at the data the run trained on"


def load_run(run_dir: Path, data_root: str | None = None, best: bool = False,
             test_part: bool = False, data_remedy: str = LOAD_DATA_REMEDY) -> TrainedRun:
    """Rebuild a run's method from its config and load its last checkpoint (on the CPU).

    ``data_root`` replaces the run's ``data.root`` (a dataset moved since training). ``best``
    loads ``checkpoints/best.pt`` (``train.keep_best``) instead. ``test_part``: for a run that
    validated (``data.validation``), ``splits`` are the test part's, for scoring the chosen
    model on the classes it was never chosen on; the model is built as trained.
    Data other than the run's is refused (:func:`check_run_data`), saying ``data_remedy``."""
    run = RunFolder.existing(run_dir)
    config = run_config(run)
    if data_root is not None:  # set directly: a path is not parsed as an override's YAML
        dataset, root = relocated(config.data.dataset, data_root)
        config = dataclasses.replace(
            config, data=dataclasses.replace(config.data, dataset=dataset, root=root))
    checkpoint = chosen_checkpoint(run, best)  # needs no data: said first
    if data_root is None:
        check_data_path(run, config.data.dataset, data_remedy)
    state = load_checkpoint(checkpoint)
    recorded = run.recorded_data()
    # the test part too where it was recorded: the check compares every part training saw
    splits, test_splits = prepare_data_and_test_part(config.data,
                                                     test_part or recorded is not None)
    check_run_data(run, recorded, config, splits, test_splits, data_remedy)
    if not test_part:
        test_splits = splits
    method = build_method(config, splits, pretrained=False)  # the checkpoint has the weights
    _load_weights(method, state, checkpoint,
                  f"the run's config and its data as they are now ({len(splits.train_classes)} "
                  "training classes)", "if the data changed since training (classes added or "
                  "removed), point --data-root at the data the run trained on")
    embedder = build_embedder(config, build_pipeline(config, splits.train, method),
                              torch.device("cpu"))
    return TrainedRun(run, config, method, state["epoch"], embedder, checkpoint,
                      SampleSpec.of(splits.train, len(splits.train_classes)), test_splits)


def load_model(run_dir: Path, best: bool = False, data_root: str | None = None) -> RunModel:
    """A run's model (on the CPU, from ``last.pt``, or ``best.pt`` with ``best``), rebuilt from
    the run folder alone: its config, its checkpoint and what its ``data.json`` records of the
    samples the model takes (:mod:`kdml.data.sample_spec`). A run of a kdml before that record
    is rebuilt from its data by :func:`load_run` (at ``data_root`` where given)."""
    run = RunFolder.existing(run_dir)
    recorded = run.recorded_data()
    samples = (None if recorded is None else
               SampleSpec.from_record(recorded, str(run.data_fingerprint)))
    if samples is None:
        return load_run(run_dir, data_root, best=best)
    config = run_config(run)
    checkpoint = chosen_checkpoint(run, best)
    state = load_checkpoint(checkpoint)
    method = build_method_for(config, samples, samples.train_classes, pretrained=False)
    _load_weights(method, state, checkpoint,
                  f"{run.config} and {run.data_fingerprint} ({samples.train_classes} training "
                  "classes)", "restore the run's files from a copy")
    embedder = build_embedder(config, build_pipeline(config, samples, method),
                              torch.device("cpu"))
    return RunModel(run, config, method, state["epoch"], embedder, checkpoint, samples)


def data_record(splits: DataSplits, test_part: DataSplits | None) -> dict[str, Any]:
    """A run's ``data.json``: the fingerprint of its data (:mod:`kdml.data.fingerprint`) and
    what its model takes (:mod:`kdml.data.sample_spec`), from which the run folder alone
    rebuilds the model (:func:`load_model`)."""
    return {**data_fingerprint(splits, test_part),
            SAMPLES_FIELD: SampleSpec.of(splits.train, len(splits.train_classes)).to_record()}


def check_data_path(run: RunFolder, dataset: str, remedy: str) -> None:
    """Refuse, saying ``remedy``, a path-named dataset (``folder:DIR``, ``csv:FILE``,
    ``npz:FILE``) whose path is gone: the reader's own words would not say that the run's
    data moved, nor that --data-root follows it."""
    for prefix, kind in PATH_FORMATS.items():
        if dataset.startswith(prefix):
            path = Path(dataset.removeprefix(prefix)).expanduser()  # as the readers take it
            if not (path.is_dir() if kind == "folder" else path.is_file()):
                raise KdmlError(f"{run.config} names {dataset}, whose {kind} "
                                f"{why_missing(path, kind)} now; {remedy}")


def check_run_data(run: RunFolder, recorded: dict[str, Any] | None, config: RunConfig,
                   splits: DataSplits, test_part: DataSplits, remedy: str) -> None:
    """Refuse, with one line ending in ``remedy``, data other than what the run trained on:
    ``recorded`` is its fingerprint (``data.json``; ``None`` for a run made before kdml wrote
    one, which goes unchecked), ``splits`` and ``test_part`` the data as read now (see
    :func:`~kdml.data.prepare.prepare_data_and_test_part`)."""
    if recorded is None:
        return
    now = data_fingerprint(splits, test_part)
    difference = fingerprint_difference(recorded, now)
    if difference is None:
        return
    place = now["folder"] or config.data.root
    then = recorded.get("folder")
    trained_at = f" (it read {then})" if then and then != place else ""
    where = f"read from {place}" if place else f"of {config.data.dataset}"
    raise KdmlError(f"the data {where} is not what {run.root} trained on: "
                    f"{difference}; {remedy}{trained_at}, or delete {run.data_fingerprint} "
                    "to use this data anyway")


def _load_weights(method: Method, state: dict[str, Any], checkpoint: Path, built_from: str,
                  remedy: str) -> None:
    """Load a checkpoint's weights into ``method``, built from ``built_from``; one line saying
    ``remedy`` where they do not fit it."""
    try:
        method.load_state_dict(state["method"])
    except RuntimeError:
        raise KdmlError(f"checkpoint {checkpoint} does not match the model built from "
                        f"{built_from}: {_first_mismatch(state['method'], method.state_dict())}"
                        f"; {remedy}") from None


def _first_mismatch(saved: dict[str, Any], built: dict[str, Any]) -> str:
    """The first difference between a checkpoint's weights and a model's, in words."""
    for key in (key for key in saved if key in built):  # in the checkpoint's order
        if tuple(saved[key].shape) != tuple(built[key].shape):
            return (f"{key} is {tuple(saved[key].shape)} in the checkpoint and "
                    f"{tuple(built[key].shape)} in the model")
    missing, extra = sorted(built.keys() - saved.keys()), sorted(saved.keys() - built.keys())
    return (f"the checkpoint lacks {missing[0]}" if missing else
            f"the checkpoint has {extra[0]}, which the model does not" if extra else
            "their weights differ")


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    if not re.fullmatch(r"auto|(cpu|cuda)(:\d+)?", name):
        raise KdmlError(f"the device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise KdmlError(f"train.device={name} but no CUDA device is available; use cpu or auto")
    return torch.device(name)


class TrainingBatches:
    """The training split's batches, epoch by epoch, with a target batch for each when the
    method uses a target domain. Sampling is seeded from (seed, epoch) and decoding happens in
    the loader's workers. ``drawn=False`` (a method fitted in closed form, which reads every
    training sample once instead) draws plain batches, whatever ``data.samples_per_class``."""

    def __init__(self, config: RunConfig, splits: DataSplits, uses_target: bool,
                 device: torch.device, world: World | None = None, drawn: bool = True) -> None:
        data, seed, world = config.data, config.train.seed, world or World()
        train = splits.train
        global_batches: ShuffledBatches | ClassBalancedBatches
        if data.batch_size and data.samples_per_class and drawn:
            global_batches = ClassBalancedBatches(train.labels, data.samples_per_class,
                                                  data.batch_size, seed)
        else:
            global_batches = ShuffledBatches(len(train), data.batch_size, seed)
        self.batch_size = global_batches.batch_size  # the global batch
        # Under torchrun every rank draws the same global batches and loads its share.
        self.sampler: EpochBatches = (RankShare(global_batches, world.rank, world.size)
                                      if world.is_distributed else global_batches)
        self.dataset, self.on_bad_image = train, data.on_bad_image
        self.max_steps = config.train.steps_per_epoch
        pin = device.type == "cuda"
        self.loader = batch_loader(train, self.sampler, resolve_num_workers(data.num_workers,
                                                                            train),
                                   pin_memory=pin, persistent=True)
        self.target_sampler: EpochBatches | None = None
        self.target_loader: DataLoader | None = None
        if uses_target:
            if splits.target is None:
                raise KdmlError("this recipe needs a target domain: set data.dataset to a "
                                "domain pair such as mnist5k->digits")
            target_sampler: EpochBatches = TargetBatches(
                len(splits.target), [self.batch_size] * len(self.sampler), seed)
            if world.is_distributed:
                target_sampler = RankShare(target_sampler, world.rank, world.size)
            self.target_sampler = target_sampler
            self.target_loader = batch_loader(
                splits.target, target_sampler,
                resolve_num_workers(data.num_workers, splits.target), pin_memory=pin)

    def __len__(self) -> int:
        return min(len(self.sampler), self.max_steps or len(self.sampler))

    def epoch(self, epoch: int) -> Iterator[tuple[Batch, Batch | None]]:
        self.sampler.set_epoch(epoch)
        source = readable_batches(self.loader, self.dataset, self.on_bad_image)
        if self.target_loader is None or self.target_sampler is None:
            pairs: Iterator[tuple[Batch, Batch | None]] = ((batch, None) for batch in source)
        else:
            self.target_sampler.set_epoch(epoch)
            # not strict: skipped unreadable images can leave the source a batch short
            pairs = zip(source, self.target_loader, strict=False)
        yield from itertools.islice(pairs, len(self))


def check_distributed(config: RunConfig, world: World, device: torch.device) -> None:
    """Refuse, before anything runs, settings that cannot work over several processes."""
    if config.model.sync_bn and device.type != "cuda":
        raise KdmlError("model.sync_bn needs GPUs (torch's SyncBatchNorm runs on CUDA only); "
                        "drop it on CPUs")
    if config.train.sharded_kernels and not world.is_distributed:
        raise KdmlError("train.sharded_kernels splits JRS's kernel rows over torchrun's "
                        "processes; launch with torchrun or drop it")
    if not world.is_distributed:
        return
    if config.data.batch_size % world.size:
        raise KdmlError(f"data.batch_size={config.data.batch_size} is the global batch and must "
                        f"split evenly over the {world.size} processes")
    if config.data.on_bad_image == "skip":
        raise KdmlError("data.on_bad_image=skip would leave the processes' batches unequal; "
                        "use error under torchrun")


def check_evaluation(config: RunConfig, splits: DataSplits, selects: bool = False,
                     evaluating: bool = False) -> None:
    """Refuse a test set that cannot be scored, before anything is trained: a target domain
    without labels, a single class or no query with a relevant reference
    (:func:`check_test_classes`), then Recall@K values beyond the references, then a
    ``train.select_metric`` the run will not score (it had trained an epoch first). The data's
    own defects come first: lowering eval.ks would only have led to them. ``evaluating``:
    for ``kdml eval``, whose Ks come from its ``--ks`` (which the refusal then names) and which
    selects no epoch."""
    if splits.kind == DOMAIN:
        if not (splits.test.labels >= 0).any():
            raise KdmlError(f"the target domain of {splits.test.name} has no labelled sample, so "
                            "a run cannot be scored (target retrieval and source-NN accuracy "
                            "need target labels); label some of its samples (-1 marks the "
                            "unlabelled ones)")
    else:
        check_test_classes(splits)
    ks = config.eval.ks or splits.eval_ks
    if max(ks) > splits.reference_size:
        fitting = [str(k) for k in ks if k <= splits.reference_size] or ["1"]
        setting, example = (("--ks", f"--ks {' '.join(fitting)}") if evaluating else
                            ("eval.ks", f"eval.ks=[{', '.join(fitting)}]"))
        raise KdmlError(f"{setting} asks for Recall@{max(ks)} but a test query has only "
                        f"{splits.reference_size} references; lower {setting}, e.g. "
                        f"'{example}'")
    if evaluating:
        return
    if config.train.keep_best or config.train.patience or (selects and splits.validation):
        check_selectable(config.train.select_metric, metric_names(config.eval, splits))


def check_test_classes(splits: DataSplits) -> None:
    """Refuse a test part (its gallery, where it has one) of a single class, or without a
    query that has a sample of its class to retrieve."""
    references, part = (splits.test, "test") if splits.gallery is None else (splits.gallery,
                                                                             "gallery")
    if references.num_classes == 1:  # it had trained, then reported every metric as 1
        raise KdmlError(f"every {part} sample of {references.name} has the same class, so "
                        "Recall@K, MAP@R and R-Precision would be trivially 1; "
                        f"{_more_test_classes(splits)}")
    if splits.gallery is not None:
        scorable = torch.isin(splits.test.labels, splits.gallery.labels).any()
    else:
        scorable = (torch.unique(splits.test.labels, return_counts=True)[1] > 1).any()
    if not scorable:
        how = ("raise data.holdout_fraction, the share of each class held out for testing"
               if splits.kind == SEEN else "use a split with at least two test samples per "
               "class")
        raise KdmlError(f"no test query of {splits.test.name} has another sample of its class "
                        f"to retrieve, so Recall@K is undefined; {how}")


def _more_test_classes(splits: DataSplits) -> str:
    """What gives the test part (or gallery) of ``splits`` a second class."""
    if splits.own_split:  # data.train_classes is refused with a dataset's own split
        rows = ("mark gallery images (is_gallery=1 in a CSV) of at least 2 classes"
                if splits.gallery is not None else "give the dataset's own split test rows of "
                "at least 2 classes")
        return f"{rows}, or set data.split=class-disjoint"
    if splits.kind == SEEN:  # every class is tested: the dataset has one class
        return "give the dataset images of at least 2 classes"
    return "give the test part at least 2 classes (data.train_classes, or more classes)"


class CompiledSteps(nn.Module):
    """``torch.compile`` of a model whose compiler failures (no C++ compiler for a CPU run,
    say) end the run with one line instead of inductor's traceback."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.compiled = torch.compile(model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.compiled(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            inner = error.inner_exception
            reason = (str(inner).strip().splitlines() or [type(inner).__name__])[0][:200]
            raise KdmlError(f"train.compile=true: torch.compile failed ({reason}); train "
                            "without it: train.compile=false") from None


@dataclass
class Session:
    """Everything one training session works with, built and checked before the run folder is
    touched."""

    config: RunConfig
    device: torch.device
    splits: DataSplits
    method: Method
    pipeline: InputPipeline
    embedder: Embedder
    optimizer: torch.optim.Optimizer | None
    scheduler: Schedule | None
    batches: TrainingBatches
    scaler: torch.amp.GradScaler
    model: nn.Module  # what the steps call: the method or its DistributedDataParallel, compiled
    # with train.compile
    world: World
    test_part: DataSplits  # the data split without data.validation (else ``splits``), which
    # the run's data.json covers too

    @classmethod
    def build(cls, config: RunConfig, echo: Callable[[str], None] = print,
              selects: bool = False, new_run: bool = True) -> Session:
        """``new_run``: the run trains from its first epoch, so its config can still change
        and a split setting its split does not use is refused; a run resumed from a checkpoint
        keeps the settings it trained with (an older kdml's, which ignored such a setting),
        and --resume's own check refuses an edit of them."""
        world = distributed.world()
        device = resolve_device(distributed.device_for(config.train.device))
        check_distributed(config, world, device)
        if config.train.deterministic:
            make_deterministic()
        splits, test_part = prepare_data_and_test_part(config.data, new_run=new_run)
        if not config.eval.ks:
            config.eval.ks = list(splits.eval_ks)
        check_evaluation(config, splits, selects)
        method = build_method(config, splits, echo=echo)
        check_method_on_splits(config, splits, method)
        if not method.needs_fit:  # PCA's fit reads the whole split, in no batches of classes
            check_batching(splits.train.labels, config.data.samples_per_class,
                           config.data.batch_size)
        if config.model.sync_bn:
            method = nn.SyncBatchNorm.convert_sync_batchnorm(method)
        method = method.to(device)
        pipeline = build_pipeline(config, splits.train, method)
        optimizer, scheduler = build_optimizer(method, config)
        if optimizer is None and not method.needs_fit:
            raise KdmlError(f"the {config.recipe} model has no parameters to train and no "
                            f"closed-form fit")
        model: nn.Module = method
        if world.is_distributed and not method.needs_fit:
            model = DistributedDataParallel(
                method, device_ids=[device.index] if device.type == "cuda" else None)
        if config.train.compile:
            model = CompiledSteps(model)  # checkpoints save the method: its names unchanged
        return cls(config, device, splits, method, pipeline,
                   build_embedder(config, pipeline, device), optimizer, scheduler,
                   TrainingBatches(config, splits, method.uses_target, device, world,
                                   drawn=not method.needs_fit),
                   gradient_scaler(device, config.train.precision), model, world, test_part)

    def unused_embedding_size(self) -> str | None:
        """The setting that sizes this recipe's embedding, where ``model.embedding_size`` was
        given another value than its default and sizes nothing (Atlas, DTML)."""
        setting = get_recipe(self.config.recipe).embedding_setting
        if (setting == "model.embedding_size"
                or self.config.model.embedding_size == ModelConfig().embedding_size):
            return None
        return setting

    def batchnorm_is_per_process(self) -> bool:
        """Whether several processes train BatchNorm layers on their own shares of the batch
        (neither ``model.sync_bn`` nor ``model.freeze_bn``)."""
        model = self.config.model
        return (self.world.is_distributed and not model.sync_bn and not model.freeze_bn
                and any(isinstance(module, nn.modules.batchnorm._BatchNorm)
                        for module in self.method.modules()))

    def steppers(self) -> tuple[torch.optim.Optimizer, Schedule]:
        """The optimiser and the schedule; only methods fitted in closed form have none."""
        if self.optimizer is None or self.scheduler is None:
            raise RuntimeError(f"{self.config.recipe} is fitted in closed form, not stepped")
        return self.optimizer, self.scheduler

    def restore(self, state: dict[str, Any], path: Path) -> None:
        """Load a checkpoint; one line when it is another recipe's or another shape's."""
        saved_recipe = (state.get("config") or {}).get("recipe")
        if saved_recipe not in (None, self.config.recipe):
            raise KdmlError(f"checkpoint {path} is a {saved_recipe!r} run but the run folder's "
                            f"config is {self.config.recipe!r}; it belongs to another run")
        try:
            self.method.load_state_dict(state["method"])
            if not self.method.needs_fit:
                optimizer, scheduler = self.steppers()
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
            if state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError, KeyError, TypeError):
            raise KdmlError(f"checkpoint {path} does not match the run's config (another model "
                            "shape or recipe); it belongs to another run") from None

    def train_epoch(self, epoch: int, history: list[dict[str, Any]],
                    progress: bool | None) -> tuple[dict[str, Any], bool]:
        """Train (or fit) one epoch; returns the epoch's row, not yet scored, and whether
        training is over (converged, or nothing to train)."""
        config, method = self.config, self.method
        row: dict[str, Any] = {"epoch": epoch}
        if method.needs_fit:  # e.g. PCA: fitted once on the training inputs, no steps
            method.fit(inputs for inputs, _, _ in self.embedder.inputs(self.splits.train))
        else:
            optimizer, scheduler = self.steppers()
            row["lr"] = optimizer.param_groups[0]["lr"]
            terms = train_one_epoch(self, epoch, progress)
            row.update({f"train/{name}": value for name, value in terms.items()})
            with warnings.catch_warnings():
                # fp16's gradient scaler skips the optimizer's steps whose gradients overflow
                # (its first few, while it finds its scale): an epoch of only those makes torch
                # warn that the schedule stepped before the optimizer, which is intended here
                warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`")
                scheduler.step()
        converged = _converged(history, row, config.train.tolerance) or method.needs_fit
        return row, converged

    def is_scored(self, epoch: int, over: bool) -> bool:
        """Whether ``epoch`` is scored: every ``train.eval_every`` epochs, the last one, and
        the one training ends with."""
        train = self.config.train
        return epoch % train.eval_every == 0 or epoch == train.epochs or over

    def score(self, epoch: int, row: dict[str, Any], progress: bool | None = None) -> None:
        """Add the trained model's scores (test, or validation) to ``epoch``'s row
        (``progress``: bars while it embeds, as :func:`train`'s)."""
        embedder = dataclasses.replace(self.embedder, progress=progress)
        distributed.broadcast_buffers(self.method)  # the saved model's: rank 0's statistics
        try:
            metrics = score_method(self.method, self.splits, self.config.eval,
                                   embedder).recorded()
        except NonFiniteEmbeddings as error:  # finite losses, then an overflowing update
            raise NonFiniteLoss(f"training stopped after epoch {epoch}: {error}; "
                                f"{kept_checkpoint(epoch)}. {ADVICE}") from None
        prefix = scored_prefix(self.splits)
        row.update({f"{prefix}/{name}": value for name, value in metrics.items()})

    def checkpoint(self, epoch: int, history: list[dict[str, Any]], finished: bool,
                   unscored: dict[str, Any] | None = None) -> dict[str, Any]:
        """The run's state after ``epoch``; ``history`` holds the rows before it when
        ``unscored`` is given: the trained epoch's row, not yet scored, and whether training
        is over (``checkpoints/unscored.pt``). ``unreadable`` keeps the test and gallery
        positions the last scoring left out (:attr:`DataSplits.unreadable`), so that a
        finished run resumed counts the samples its metrics are of
        (:func:`recorded_unreadable`)."""
        state = {"epoch": epoch, "method": self.method.state_dict(),
                 "optimizer": self.optimizer.state_dict() if self.optimizer else None,
                 "scheduler": self.scheduler.state_dict() if self.scheduler else None,
                 "scaler": self.scaler.state_dict(), "history": history,
                 "config": self.config.to_dict(), "finished": finished,
                 "unreadable": dict(self.splits.unreadable)}
        if unscored is not None:
            state["unscored"] = unscored
        return state


# A validation part of fewer classes chooses on little: an embedding that separates none of C
# equal classes already scores Recall@1 about 1/C, and a few held-out classes say little of the
# next ones.
MIN_VALIDATION_CLASSES = 5


def warn_about_splits(splits: DataSplits, log: logging.Logger) -> None:
    """Warn about data that trains but means little: a single training class (a single test
    class is refused, :func:`check_evaluation`), a validation part of fewer than
    :data:`MIN_VALIDATION_CLASSES` classes, and a domain pair whose target shares no class
    with its source."""
    if splits.train.num_classes == 1:
        log.warning("the training split of %s has a single class: class-based losses have "
                    "nothing to separate", splits.train.name)
    if splits.validation and splits.test.num_classes < MIN_VALIDATION_CLASSES:
        more = ("a dataset of more classes: this validation part holds a share of every "
                "training class's samples" if splits.kind == SEEN else
                "a larger data.validation (or more training classes) holds out more")
        log.warning("the validation part holds %d classes, too few for what is chosen on it "
                    "(train.keep_best's epoch, train.patience's stop, a grid's best cell) to "
                    "mean much; %s", splits.test.num_classes, more)
    if splits.kind == DOMAIN:
        target = splits.test.labels[splits.test.labels >= 0]
        if not torch.isin(target, torch.tensor(splits.train_classes)).any():
            log.warning("no labelled target sample of %s has a source class, so "
                        "source_nn_accuracy (the target samples whose nearest source sample has "
                        "their label) is 0 whatever the model; the target retrieval metrics "
                        "still mean what they say", splits.test.name)


def train(config: RunConfig, run_dir: Path, resume: bool = False,
          progress: bool | None = None, echo: Callable[[str], None] = print,
          start_line: str | None = None, data_remedy: str = RESUME_DATA_REMEDY,
          selects: bool = False) -> dict[str, float]:
    """Train ``config`` into ``run_dir`` and return the final test metrics.

    With ``resume=True`` the run continues from ``checkpoints/last.pt``, or first scores the
    epoch after it where that was trained and killed while scored (``checkpoints/unscored.pt``,
    written before each scoring); batches, augmentations and prior samples are drawn from
    (seed, epoch, step), and scoring draws from no stream training uses, so a resumed run ends
    where an uninterrupted one would (same seed, CPU). ``progress=None`` shows progress bars
    only on a terminal. Under torchrun every rank trains and only rank 0 writes the run folder
    and prints. ``start_line`` (``kdml train``'s "training ... into ...") is echoed once the
    config, the data and the run folder are checked, before the first epoch's output.
    ``data_remedy`` ends the refusal of a resumed run's changed data (:func:`check_run_data`).
    ``selects=True`` (a grid's cell, whose validation score picks the best cell) checks
    ``train.select_metric`` with ``data.validation`` even without keep_best or patience.
    """
    main = distributed.world().is_main
    echo = echo if main else _silent
    run = RunFolder(run_dir)
    check_utf8_path(run.root, resume)  # before anything is read or written
    state: dict[str, Any] | None = None  # the checkpoint a resumed run continues from
    with contextlib.ExitStack() as held:  # the run folder, held while this process trains
        def hold() -> None:
            held.enter_context(run.held())

        if resume:  # the folder exists: refuse one another process trains before loading data
            distributed.from_main(hold)
            # read once, here, so that a refused edit of config.yaml is refused before the
            # data is read (minutes on SOP) and before a resumed old run gets its data.json
            state = distributed.from_main(lambda: _resumed_state(run, config))
            check_data_path(run, config.data.dataset, data_remedy)
        with warnings_on_stderr(shown=main):  # the data's (e.g. files a folder: left out)
            # checks all before a new folder; a run resumed from a checkpoint keeps its settings
            session = Session.build(config, echo, selects, new_run=state is None)
        if not resume:
            session.method.check_fit()  # e.g. PCA's d x d matrices: refused before the folder
            distributed.from_main(hold)
        distributed.from_main(lambda: _open_run_folder(run, session, resume, echo,
                                                       data_remedy))
        if start_line is not None:
            echo(start_line)
        return _train_session(session, run, resume, state, progress, echo)


# The config sections whose settings cannot size the model or name another run's checkpoint:
# an edit confined to them is refused before the data is read (_resumed_state).
UNSIZING_SECTIONS = ("optim", "train", "eval")


def _resumed_state(run: RunFolder, config: RunConfig) -> dict[str, Any] | None:
    """The checkpoint ``run`` resumes from (:func:`_checkpoint_to_resume`), its settings
    checked against ``config`` before any data is read where that can be decided then.

    Where the recipe or a setting of the data, model, method or domain differs, the
    checkpoint may be another run's, of another recipe or model shape: nothing is refused here,
    so that :meth:`Session.restore` names it as such, and where it loads, the check after it
    names the edit (:func:`_train_session`). Otherwise the edits, in :data:`UNSIZING_SECTIONS`
    only (optim.lr, say), are refused here, as is another ``data.dataset`` (not a moved path)
    whatever else differs. ``eval.ks`` left empty is filled from the data by
    :meth:`Session.build`, so it is compared after it."""
    state = _checkpoint_to_resume(run)
    trained = (state or {}).get("config") or {}
    # another dataset is an edit whatever the checkpoint: read first, the data's check would
    # have refused it as other data, and deleting data.json as told led to the restore's
    # "another run's checkpoint"
    if isinstance(trained.get("data"), dict) and "dataset" in trained["data"]:
        _refuse_edited_settings(
            changed_settings({"data": {"dataset": trained["data"]["dataset"]}}, config), run)
    sizing = {key: value for key, value in trained.items() if key not in UNSIZING_SECTIONS}
    if changed_settings(sizing, config):
        return state
    unsizing = {key: value for key, value in trained.items() if key in UNSIZING_SECTIONS}
    if not config.eval.ks and isinstance(unsizing.get("eval"), dict):
        unsizing["eval"] = {key: value for key, value in unsizing["eval"].items()
                            if key != "ks"}
    _refuse_edited_settings(changed_settings(unsizing, config), run)
    return state


def _refuse_edited_settings(changed: list[str], run: RunFolder) -> None:
    """Refuse, in one line naming the first, settings edited since the checkpoint that
    ``--resume`` cannot take (:func:`~kdml.training.resume_settings.changed_settings`)."""
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise KdmlError(f"{run.config} was edited since its checkpoint: {changed[0]}{more}; "
                        "--resume continues the run as it trained, and takes a change of "
                        f"{', '.join(sorted(RESUMABLE))} or a path-named data.dataset "
                        "only: put the setting back, or train a new run with it")


def _train_session(session: Session, run: RunFolder, resume: bool,
                   state: dict[str, Any] | None, progress: bool | None,
                   echo: Callable[[str], None]) -> dict[str, float]:
    """The epochs of :func:`train`, once the run folder is open and held; ``state`` is the
    checkpoint a resumed run continues from (:func:`_resumed_state`), ``None`` for a new run
    and one resumed before its first checkpoint."""
    config, main = session.config, session.world.is_main
    echo(f"test set: {session.splits.test_set}")
    history: list[dict[str, Any]] = []
    start_epoch, stopped_early = 1, False
    # an epoch trained before the session stopped, while it was scored: (row, over), unscored
    unscored: tuple[dict[str, Any], bool] | None = None
    if resume and state is None:  # stopped before its first checkpoint: start over
        echo(f"{run.root} has no checkpoint yet; training it from epoch 1")
    elif state is not None:  # resuming
        session.restore(state, run.unscored_checkpoint if state.get("unscored") is not None
                        else run.checkpoint)
        # after restore, which names a checkpoint of another recipe or shape as such: the
        # edits _resumed_state left to it (of settings that size the model, or an empty
        # eval.ks, filled from the data since)
        _refuse_edited_settings(changed_settings(state.get("config", {}), config), run)
        history, start_epoch = state["history"], state["epoch"] + 1
        # the images its last scoring left out: a finished run resumed scores nothing, and
        # still counts the samples the metrics it ends with are of
        session.splits.unreadable = recorded_unreadable(state, session.splits)
        if scored_prefix(session.splits) == VALIDATION:
            history = as_validation_history(history)
        planned = state.get("config", {}).get("train", {}).get("epochs", config.train.epochs)
        stopped_early = bool(state.get("finished")) and state["epoch"] < planned
        if stopped_early:  # by the convergence or patience rule: nothing left to do
            start_epoch = config.train.epochs + 1
        of_epochs = (f" of {config.train.epochs}" if state["epoch"] <= config.train.epochs
                     else f" (train.epochs is now {config.train.epochs})")
        if state.get("unscored") is not None:  # its epoch is scored first, then on as before
            unscored = dict(state["unscored"]["row"]), bool(state["unscored"]["over"])
            start_epoch = state["epoch"]
            echo(f"resuming {run.root} after epoch {state['epoch']}{of_epochs}, trained but "
                 "not yet scored: scoring it first")
        else:
            echo(f"resuming {run.root} after epoch {state['epoch']}{of_epochs}")
        if not stopped_early and planned < config.train.epochs:  # train.epochs was raised
            echo(f"train.epochs is {config.train.epochs}, not the {planned} it was trained "
                 f"for: training epochs {state['epoch'] + 1} to {config.train.epochs}")
    # an unscored epoch is scored even where train.epochs was lowered below it since
    end_epoch = max(config.train.epochs, start_epoch) if unscored else config.train.epochs

    prefix = scored_prefix(session.splits)
    with Recorder(run, main, prefix) as recorder:
        if start_epoch > end_epoch and stopped_early:
            recorder.log.info("it stopped early, after epoch %d; %s", len(history),
                              NOTHING_LEFT)
        elif start_epoch > end_epoch:  # a finished run resumed: nothing to train
            recorder.log.info("all %d epochs are trained; %s", config.train.epochs,
                              NOTHING_LEFT)
            if not part_scores(history[-1], prefix):
                # its last epoch trained but never scored (train.eval_every, then train.epochs
                # lowered to it): scored now, as a run always scores its last epoch, or the
                # run would end with no final metrics
                _score_last_epoch(session, recorder, history, progress)
        else:
            # the thread count too: a CPU run's float sums, so its numbers, depend on it
            recorder.log.info("start epoch %d of %d%s, device %s, %d train / %d test samples, "
                              "%d loader workers, %d process(es), %d CPU thread(s)", start_epoch,
                              config.train.epochs, f" ({SCORED_FIRST})" if unscored else "",
                              session.device, len(session.splits.train),
                              len(session.splits.test), session.batches.loader.num_workers,
                              session.world.size, torch.get_num_threads())
        warn_about_splits(session.splits, recorder.log)
        if (not config.model.weights
                and config.model.backbone.startswith(IMAGENET_BACKBONES)):
            if config.model.freeze_bn:
                # the JRD configs' setting, meant for ImageNet weights: without them it trains
                # with its statistics at 0 and 1, a run far from the paper's, without a word
                recorder.log.warning(
                    "model.freeze_bn=true with no model.weights: the %s backbone starts from "
                    "random weights and its BatchNorm statistics stay at their initial values "
                    "(mean 0, variance 1), far from the papers' ImageNet start; give --weights "
                    "FILE, or model.freeze_bn=false to train it from scratch",
                    config.model.backbone)
            elif get_recipe(config.recipe).pretrained:
                # the MTriplet configs train BatchNorm: without weights they had trained a
                # random network for hundreds of epochs at the fine-tuning rate, silently
                recorder.log.warning(
                    "no model.weights: the %s backbone starts from random weights, while %s's "
                    "paper fine-tunes it from ImageNet weights (its learning rate and epochs "
                    "are set for that); give --weights FILE", config.model.backbone,
                    config.recipe)
        sizing = session.unused_embedding_size()
        if sizing:
            recorder.log.warning("model.embedding_size=%d does not size %s's embedding: %s "
                                 "does", config.model.embedding_size, config.recipe, sizing)
        if session.batchnorm_is_per_process():
            recorder.log.warning(
                "the model's BatchNorm layers train on each process's share of the batch "
                "(%d of %d samples), as DistributedDataParallel's do, so the run is not the "
                "one process would train; model.sync_bn=true (GPUs) or model.freeze_bn=true "
                "make them see the whole batch", config.data.batch_size // session.world.size,
                config.data.batch_size)
        epochs = tqdm(range(start_epoch, end_epoch + 1), desc="epochs",
                      initial=start_epoch - 1, total=end_epoch,
                      disable=bar_disabled(progress, main))
        metric = config.train.select_metric
        for epoch in epochs:
            try:
                # trained in the session before, stopped while scored (the session's start
                # line says so: SCORED_FIRST)
                if unscored is not None:
                    (row, over), scored = unscored, True
                    unscored = None
                else:
                    row, over = session.train_epoch(epoch, history, progress)
                    scored = session.is_scored(epoch, over)
                    if scored:  # a kill while it is scored must not lose its training
                        recorder.trained(epoch, functools.partial(
                            session.checkpoint, epoch, history, False,
                            {"row": dict(row), "over": over}))
                if scored:
                    session.score(epoch, row, progress)
                history.append(row)
                epochs.set_postfix({k.split("/", 1)[1]: f"{v:.3f}" for k, v in row.items()
                                    if k == f"{prefix}/recall@1" or k == "train/loss"})
                if config.train.keep_best or config.train.patience:
                    check_scored(row, metric)
                out_of_patience = patience_exhausted(history, metric, config.train.patience)
                finished = over or out_of_patience or epoch >= config.train.epochs
                recorder.epoch(row, history,
                               functools.partial(session.checkpoint, epoch, history, finished),
                               keep_as_best=(config.train.keep_best
                                             and best_epoch(history, metric) == epoch))
            except KdmlError as error:  # not a kill: an error kdml reports
                # the trained epoch goes where scoring it again would repeat the error (a
                # diverged model: the message names the checkpoint kept), or where it would be
                # the run's only checkpoint, so that the corrected command starts afresh
                # (check_new_run_folder); otherwise (an unreadable test image, say) --resume
                # scores it once the cause is mended
                if isinstance(error, NonFiniteLoss) or not run.checkpoint.exists():
                    recorder.drop_unscored()
                raise
            if over:
                recorder.log.info("stopping after epoch %d: converged or nothing to train",
                                  epoch)
                break
            if out_of_patience:
                recorder.log.info("stopping after epoch %d: %d evaluations without a better "
                                  "validation %s than epoch %d's (train.patience)", epoch,
                                  config.train.patience, metric, best_epoch(history, metric))
                break
        final = part_scores(history[-1], prefix)
        recorder.finish(history, final)
        if config.train.keep_best or config.train.patience:
            best = best_epoch(history, metric)
            if best is not None:
                score = dict(scores(history, metric))[best]
                kept = f"; {run.best_checkpoint} holds it" if config.train.keep_best else ""
                echo(f"best validation {metric}: {score:.4f} at epoch {best}{kept}")
        # the "test set" line at the start counted the unreadable images the scoring left
        # out (only decoding finds them): the samples the metrics are of, once known (a
        # finished run resumed: from its checkpoint)
        if session.splits.unreadable:
            echo(f"test set: {session.splits.test_set}")
    return final


def _score_last_epoch(session: Session, recorder: Recorder, history: list[dict[str, Any]],
                      progress: bool | None) -> None:
    """Score the restored model, the last epoch of ``history``, and record it as scored."""
    row, config = history[-1], session.config
    epoch, metric = row["epoch"], config.train.select_metric
    beyond = (f" (beyond train.epochs={config.train.epochs}, lowered since)"
              if epoch > config.train.epochs else "")
    recorder.log.info("epoch %d%s was trained but not scored; scoring it", epoch, beyond)
    recorded = set(row)  # its training terms: logged when it trained
    session.score(epoch, row, progress)
    recorder.epoch(row, history, functools.partial(session.checkpoint, epoch, history, True),
                   keep_as_best=(config.train.keep_best
                                 and best_epoch(history, metric) == epoch),
                   recorded=recorded)


# backbones the papers start from ImageNet weights (model.weights)
IMAGENET_BACKBONES = ("bninception", "timm:", "torchvision:")


def _silent(message: str) -> None:
    """The echo of the ranks other than 0: they print nothing."""


def _open_run_folder(run: RunFolder, session: Session, resume: bool,
                     echo: Callable[[str], None], data_remedy: str) -> None:
    """Make a new run's folder (its config and data.json), or check a resumed run's data
    against its data.json (refused saying ``data_remedy``)."""
    for partial in partial_checkpoints(run.checkpoint.parent):  # of a session killed mid-write
        partial.unlink(missing_ok=True)
    splits, test_part = session.splits, session.test_part
    if resume and not run.resumable:
        # nothing trained yet (a run refused in its first epoch: an unreadable image, say):
        # it starts over on the data as it is now, mended, which data.json then records
        if run.recorded_data() is not None or not run.data_fingerprint.exists():
            run.write_data_fingerprint(data_record(splits, test_part))
        return
    if resume:
        recorded = run.recorded_data()
        check_run_data(run, recorded, session.config, splits, test_part, data_remedy)
        # A run of a kdml before data.json gets one: from now on it trains on this data,
        # and the commands that read it check against it. Not where a file of the user's is.
        # One before the record of what the model takes gets it (its data was just checked;
        # not a fingerprint of another format, which the check could not compare).
        if (recorded is None and not run.data_fingerprint.exists()) or (
                recorded is not None and recorded.get(FORMAT_FIELD) == FINGERPRINT_FORMAT
                and SAMPLES_FIELD not in recorded):
            run.write_data_fingerprint(data_record(splits, test_part))
        return
    check_new_run_folder(run.root, held=True)  # again: another run may have started here
    afresh = start_afresh(run.root)  # a run here that saved no checkpoint: its files go
    if afresh:
        echo(afresh)
    # absolute: kdml eval and the other commands read it again from any folder
    save_config(with_absolute_paths(session.config), run.config)
    run.write_data_fingerprint(data_record(splits, test_part))


def recorded_unreadable(state: dict[str, Any], splits: DataSplits) -> dict[str, torch.Tensor]:
    """The positions in ``splits``' test (and gallery) part of the unreadable images that the
    last scoring before the checkpoint ``state`` left out (``data.on_bad_image=skip``), as
    :attr:`DataSplits.unreadable` holds them. ``{}`` for a checkpoint of a kdml before it
    recorded them (the "test set" line then counts the images listed, as it did); a part
    whose positions do not fit ``splits`` is left out alike."""
    sizes = {"test": len(splits.test), "gallery": len(splits.gallery or ())}
    return {part: positions for part, positions in (state.get("unreadable") or {}).items()
            if part in sizes and bool((positions < sizes[part]).all())}


def _checkpoint_to_resume(run: RunFolder) -> dict[str, Any] | None:
    """The state a resumed run continues from: ``last.pt``'s, or ``unscored.pt``'s where the
    session before was stopped while it scored the epoch after ``last.pt``'s (the run then
    scores that epoch first). An ``unscored.pt`` of another epoch was superseded (a kill
    came between writing ``last.pt`` and removing it) and goes."""
    state = load_checkpoint(run.checkpoint) if run.checkpoint.exists() else None
    if run.unscored_checkpoint.exists():
        try:
            trained = load_checkpoint(run.unscored_checkpoint)
        except KdmlError:  # its own words would say "train again", losing last.pt's epochs
            raise KdmlError(f"{run.unscored_checkpoint}, an epoch trained but not yet scored, "
                            "is unreadable; delete it, and --resume trains that epoch "
                            "again") from None
        if trained.get("unscored") is not None and trained["epoch"] == (
                state["epoch"] if state is not None else 0) + 1:
            return trained
        run.unscored_checkpoint.unlink()
    return state


class Recorder:
    """What a run writes: ``train.log``, TensorBoard events, the checkpoint and the metrics
    once per epoch, and the plots at most every :data:`PLOT_EVERY_S` seconds and when the
    session ends (the metrics they draw are written every epoch). Only rank 0 writes; on the
    others every call does nothing."""

    def __init__(self, run: RunFolder, writes: bool, scored: str = "test") -> None:
        self.run, self.writes, self.scored = run, writes, scored  # scored: "test" or "val"
        self._stack = contextlib.ExitStack()
        self.log = logging.getLogger("kdml.train")
        self.writer: SummaryWriter | None = None
        self._plotted_at = time.monotonic()
        self._unplotted: list[dict[str, Any]] | None = None  # a history not drawn yet

    def __enter__(self) -> Recorder:
        if self.writes:
            from torch.utils.tensorboard import SummaryWriter  # slow import: only when training

            self.log = self._stack.enter_context(run_logging(self.run.log))
            self.writer = self._stack.enter_context(SummaryWriter(str(self.run.tensorboard)))
        else:
            self.log.disabled = True
            self._stack.callback(setattr, self.log, "disabled", False)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: object) -> None:
        with self._stack:  # train.log is still open for the plots' warning and the stop line
            if kind is not None and self.writes:
                self._log_stop(kind, error)
                try:  # the plots' own error (the same full disk) must not hide the stop's
                    self._plot()
                except Exception as plotting:
                    self.log.warning("the training plots are not drawn: %s", plotting)
            else:
                self._plot()

    def _log_stop(self, kind: type[BaseException], error: BaseException | None) -> None:
        """Say in ``train.log`` why the session stopped before its end: the log otherwise ends
        at the last thing it did, as if still running. kdml's own errors, the file system's
        about a file (a full disk), a collective whose peer process is gone, a Ctrl-C and a
        kill (SIGTERM, :class:`Terminated`; not under torchrun, which stops its ranks with it)
        take one line; anything else its traceback (SIGKILL leaves no line). Logged as INFO:
        the command itself prints the error."""
        if issubclass(kind, Terminated):
            self.log.info("%sterminated (SIGTERM)", STOPPED)
        elif issubclass(kind, KeyboardInterrupt):
            self.log.info("%sinterrupted (Ctrl-C)", STOPPED)
        elif isinstance(error, KdmlError):
            self.log.info("%s%s", STOPPED, error)
        elif isinstance(error, OSError) and error.filename is not None:  # a full disk, say
            self.log.info("%s%s: %s", STOPPED, error.filename, error.strerror or error)
        elif error is not None and distributed.failed_collective(error):
            self.log.info("%sa collective operation failed, most likely because another "
                          "process of this job stopped: its output says why", STOPPED)
        else:
            self.log.info("%san error", STOPPED, exc_info=error)

    def _plot(self) -> None:
        """Draw the history not drawn yet (if any) into ``plots/``."""
        if self._unplotted is None:
            return
        try:
            plot_training(self._unplotted, self.run.plots)
        # a picture of the user's in plots/, or plots/ not writable, must not stop training:
        # later epochs draw the whole history again (a full disk stops it at the checkpoint)
        except (KdmlError, OSError) as error:
            self.log.warning("the training plots are not drawn: %s", error)
        self._unplotted, self._plotted_at = None, time.monotonic()

    def trained(self, epoch: int, checkpoint: Callable[[], dict[str, Any]]) -> None:
        """Keep an epoch trained but not yet scored (``checkpoints/unscored.pt``): scoring can
        take minutes, and a kill then loses none of its training."""
        if not self.writes:
            return
        save_checkpoint(checkpoint(), self.run.unscored_checkpoint)
        self.log.info("epoch %d trained; scoring", epoch)

    def drop_unscored(self) -> None:
        """Remove the epoch whose scoring stopped with an error kdml reports that scoring it
        again would repeat (embeddings that overflow), or with any error in the run's first
        epoch: the run folder is then as it was before the epoch, with no checkpoint at all
        if it was the first."""
        if not self.writes:
            return
        self.run.unscored_checkpoint.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # only when empty: no earlier checkpoint there
            self.run.unscored_checkpoint.parent.rmdir()

    def epoch(self, row: dict[str, Any], history: list[dict[str, Any]],
              checkpoint: Callable[[], dict[str, Any]], keep_as_best: bool = False,
              recorded: Collection[str] = ()) -> None:
        """Record ``row`` (log line, TensorBoard), then save the checkpoint and the metrics.
        ``recorded``: keys of ``row`` an earlier session logged already (an epoch trained
        then, scored now): only the others are logged, so that train.log and TensorBoard
        hold each value once."""
        if not self.writes or self.writer is None:
            return
        new = {key: value for key, value in row.items()
               if key != "epoch" and key not in recorded}
        for key, value in new.items():
            self.writer.add_scalar(key, value, row["epoch"])
        self.log.info("epoch %d%s: %s", row["epoch"], " scored" if recorded else "",
                      _format_row(new))
        state = checkpoint()
        if keep_as_best:  # before last.pt: a crash between the two then redoes this epoch
            save_checkpoint(state, self.run.best_checkpoint)
            self.log.info("epoch %d has the best validation score so far: kept as %s",
                          row["epoch"], self.run.best_checkpoint.name)
        save_checkpoint(state, self.run.checkpoint)
        self.run.unscored_checkpoint.unlink(missing_ok=True)  # last.pt holds the epoch now
        self.run.write_metrics(history, None, SCORED_PARTS[self.scored])
        self._unplotted = list(history)
        if time.monotonic() - self._plotted_at >= PLOT_EVERY_S:
            self._plot()

    def finish(self, history: list[dict[str, Any]], final: dict[str, float]) -> None:
        if self.writes:
            self.run.write_metrics(history, final, SCORED_PARTS[self.scored])
            self.log.info("final %s metrics: %s", SCORED_PARTS[self.scored], final)


def train_one_epoch(session: Session, epoch: int, progress: bool | None) -> dict[str, float]:
    """One pass over the training split; returns each loss term's mean over the steps.

    Methods that use a target domain get a random target batch of the same size with each
    source batch (the target labels are never passed on). The forward runs under the
    configured autocast, the backward through the loss scaler (float16 only). The terms stay
    on the device until the epoch ends. Host syncs: at the end of the epoch, the terms' means,
    the loss terms' non-finite check and the weights' finiteness; within it, the periodic
    non-finite check (every step on a CPU, where it costs nothing) and, under float16 only,
    the loss scaler's own."""
    method, config, device = session.method, session.config, session.device
    optimizer, _ = session.steppers()
    method.train()
    if config.model.freeze_bn:
        freeze_batchnorm(method)
    sums: dict[str, torch.Tensor] = {}
    watch = NonFiniteWatch(1 if device.type == "cpu" else NONFINITE_CHECK_EVERY)
    steps = 0
    bar = tqdm(session.batches.epoch(epoch), total=len(session.batches), desc=f"epoch {epoch}",
               leave=False, disable=bar_disabled(progress, session.world.is_main))
    world = session.world
    for step, (batch, target_batch) in enumerate(bar):
        local = len(batch.labels)
        share = (BatchShare(world.rank * local, world.size * local) if world.is_distributed
                 else None)
        rng = StepRandom(config.train.seed, epoch, step, share=share)
        inputs = session.pipeline.train(to_device(batch.inputs, device),
                                        rng.generator("cpu", AUGMENT), share)
        labels = to_device(batch.labels, device)
        target_inputs = None
        if target_batch is not None:
            target_inputs = session.pipeline.test(to_device(target_batch.inputs, device))
        with autocast(device, config.train.precision):
            output = session.model(inputs, labels, target_inputs=target_inputs, rng=rng)
        watch.observe(step, output.terms)
        if watch.due(step):
            watch.check(epoch)
        optimizer.zero_grad(set_to_none=True)
        session.scaler.scale(output.loss).backward()
        session.scaler.step(optimizer)
        session.scaler.update()
        for name, value in output.terms.items():
            value = value.double()  # accumulate in float64, as Python floats would
            sums[name] = sums[name] + value if name in sums else value
        steps += 1
    watch.check(epoch)
    NonFiniteWatch.check_weights(method.state_dict().values(), epoch, steps)
    if not steps:
        raise KdmlError(f"epoch {epoch} had no training batch (every image unreadable?)")
    means = (torch.stack(list(sums.values())) / steps).tolist()
    return dict(zip(sums, means, strict=True))


def _converged(history: list[dict[str, Any]], row: dict[str, Any], tolerance: float) -> bool:
    """DTML's stopping rule: |J_k - J_(k-1)| < tolerance on the epoch-mean training loss."""
    if tolerance <= 0 or not history or "train/loss" not in row:
        return False
    return abs(row["train/loss"] - history[-1]["train/loss"]) < tolerance


def _format_row(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k}={v}"
                     for k, v in row.items() if k != "epoch")
