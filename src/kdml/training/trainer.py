"""The one training loop. Recipes only assemble parts; the evaluator computes the metrics.

Data flows one way: a batch sampler picks indices, a ``DataLoader`` (worker processes for image
files) yields raw batches, the input pipeline augments and normalises them on the training
device, the method returns its loss terms as tensors, and the trainer reduces them once per
epoch. What the loop uses lives beside it: :mod:`~kdml.training.build` (the method, pipeline
and optimiser), :mod:`~kdml.training.checks` (refusals before anything trains),
:mod:`~kdml.training.batches` and :mod:`~kdml.training.recorder` (what a run writes);
:mod:`~kdml.training.loading` reads a trained run back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from kdml import distributed
from kdml.config import (
    ModelConfig,
    RunConfig,
    resolve_config,
    save_config,
    validate,
    with_absolute_paths,
)
from kdml.data.domains import SourcePCA
from kdml.data.fingerprint import FORMAT as FINGERPRINT_FORMAT
from kdml.data.fingerprint import FORMAT_FIELD, data_fingerprint
from kdml.data.loaders import to_device
from kdml.data.prepare import prepare_data_and_test_part
from kdml.data.sample_spec import FIELD as SAMPLES_FIELD
from kdml.data.samplers import check_batching
from kdml.data.splits import DataSplits
from kdml.data.transforms import InputPipeline
from kdml.distributed import World
from kdml.errors import KdmlError
from kdml.evaluation.evaluator import Embedder, NonFiniteEmbeddings, score_method
from kdml.models.backbones import freeze_batchnorm
from kdml.models.method import Method
from kdml.precision import autocast, cpu_has_kernels_for, gradient_scaler
from kdml.progress import bar_disabled
from kdml.run_log import warnings_on_stderr
from kdml.seeding import AUGMENT, BatchShare, StepRandom
from kdml.training.batches import TrainingBatches
from kdml.training.build import (
    Schedule,
    build_embedder,
    build_method,
    build_optimizer,
    build_pipeline,
    resolve_device,
    schedule_factor,
)
from kdml.training.checkpoint import partial_checkpoints
from kdml.training.checks import (
    check_batch_needs,
    check_before_data,
    check_distributed,
    check_evaluation,
    check_method_on_splits,
    check_same_run,
    warn_about_splits,
)
from kdml.training.denormal import flushing_denormals
from kdml.training.determinism import deterministic_mode
from kdml.training.loading import (
    RESUME_DATA_REMEDY,
    SAME_TENSORS,
    check_checkpoint_recipe,
    check_data_path,
    check_run_data,
    checkpoint_pca,
    data_record,
    first_mismatch,
)
from kdml.training.nonfinite import ADVICE, NonFiniteLoss, NonFiniteWatch, kept_checkpoint
from kdml.training.recipes import get_recipe
from kdml.training.recorder import Recorder
from kdml.training.resume_settings import changed_settings, first_of
from kdml.training.resume_state import recorded_unreadable, refuse_edited_settings, resumed_state
from kdml.training.run_folder import (
    NOTHING_LEFT,
    SCORED_FIRST,
    RunFolder,
    check_new_run_folder,
    check_utf8_path,
    metrics_partials,
    start_afresh,
)
from kdml.training.selection import (
    VALIDATION,
    as_validation_history,
    best_epoch,
    check_scored,
    part_scores,
    patience_exhausted,
    scored_prefix,
    scores,
)

# Steps between reads of the non-finite flag on a GPU (each read is a host sync), and under
# torchrun (each read is also a collective).
NONFINITE_CHECK_EVERY = 50


def nonfinite_check_every(device: torch.device, distributed: bool) -> int:
    """Steps between the reads of the non-finite watch: every step on a CPU in one process,
    where a read costs nothing, so the bad step stops before its update; else
    ``NONFINITE_CHECK_EVERY``. A GPU's read is a host sync, and under torchrun each read is
    also a collective (the ranks agree on the first bad step): on 2 gloo CPU processes one
    read cost 1.5 to 4 ms, a tenth of a small model's step. The first bad step is named
    either way (the watch keeps it), and the epoch's end reads it before the checkpoint."""
    return 1 if device.type == "cpu" and not distributed else NONFINITE_CHECK_EVERY


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
    weights_report: str | None = None  # load_weights' line on model.weights, for train.log
    fingerprint: dict[str, Any] | None = None  # of the data (data_fingerprint), once computed
    selects: bool = False  # a grid's cell, whose validation score picks the grid's best cell

    @classmethod
    def build(cls, config: RunConfig, echo: Callable[[str], None] = print,
              selects: bool = False, new_run: bool = True,
              pca: SourcePCA | None = None) -> Session:
        """``new_run``: the run trains from its first epoch, so its config can still change
        and a split setting its split does not use is refused; a run resumed from a checkpoint
        keeps the settings it trained with (an older kdml's, which ignored such a setting),
        and --resume's own check refuses an edit of them. ``pca``: a resumed run's input PCA
        (its checkpoint's), which its domain pair goes through instead of one fitted again."""
        world = distributed.world()
        reports: list[str] = []  # printed now, logged once train.log is open

        def report(line: str) -> None:
            echo(line)
            reports.append(line)

        # each process reads its own copy of the data and weights, and may fail alone (a
        # machine without them): the ranks agree before DistributedDataParallel's collective
        device, splits, test_part, method, pipeline, optimizer, scheduler = distributed.agreed(
            lambda: _build_parts(config, world, selects, new_run, report, pca))
        fingerprint = None
        if world.is_distributed:  # before the batches, which index every rank's own copy
            fingerprint = data_fingerprint(splits, test_part)  # rank 0's data.json's too
            configs, fingerprints = zip(*distributed.every_rank(
                (config.to_dict(), fingerprint)), strict=True)
            distributed.from_main(lambda: check_same_run(list(configs), list(fingerprints)))
        model: nn.Module = method
        if world.is_distributed and not method.needs_fit:
            model = DistributedDataParallel(
                method, device_ids=[device.index] if device.type == "cuda" else None)
        if config.train.compile:
            model = CompiledSteps(model)  # checkpoints save the method: its names unchanged
        return cls(config, device, splits, method, pipeline,
                   build_embedder(config, pipeline, device), optimizer, scheduler,
                   TrainingBatches(config, splits, method.uses_target, device, world,
                                   drawn=not method.needs_fit, resumed=not new_run),
                   gradient_scaler(device, config.train.precision), model, world, test_part,
                   "; ".join(reports) or None, fingerprint, selects)

    def data_fingerprint(self) -> dict[str, Any]:
        """:func:`~kdml.data.fingerprint.data_fingerprint` of the session's data and its test
        part, computed once (it hashes every sample): under torchrun at :meth:`build`, for the
        ranks' check, then reused for the run's ``data.json``."""
        if self.fingerprint is None:
            self.fingerprint = data_fingerprint(self.splits, self.test_part)
        return self.fingerprint

    def unused_embedding_size(self) -> str | None:
        """The setting that sizes this recipe's embedding, where ``model.embedding_size`` was
        given another value than its default and sizes nothing (Atlas, DTML)."""
        setting = get_recipe(self.config.recipe).embedding_setting
        if (setting == "model.embedding_size"
                or self.config.model.embedding_size == ModelConfig().embedding_size):
            return None
        return setting

    def unpooled_backbone(self) -> str | None:
        """The backbone that ``model.pooling``, given another value than its default, does
        not reach: kdml's small backbones (``cnn``, ``conv1d``) average their own maps, and
        ``mlp`` and ``identity`` have none."""
        model = self.config.model
        name = self.splits.train.default_backbone if model.backbone == "auto" else model.backbone
        if model.pooling == ModelConfig().pooling or name.startswith(IMAGENET_BACKBONES):
            return None
        return name

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
        check_checkpoint_recipe(state, self.config.recipe, path, "the run folder's config")
        try:
            self.method.load_state_dict(state["method"])
            if not self.method.needs_fit:
                optimizer, scheduler = self.steppers()
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
            if state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError, KeyError, TypeError):
            # an edit of config.yaml since (a new model.embedding_size) reads the same as
            # another run's checkpoint: name the setting where the checkpoint records it
            changed = changed_settings(state.get("config") or {}, self.config)
            if changed:
                raise KdmlError(f"checkpoint {path} does not fit the run's config, which "
                                f"differs from the one it was trained with: {first_of(changed)}; "
                                "put the setting back in config.yaml, or the checkpoint belongs "
                                "to another run") from None
            raise KdmlError(f"checkpoint {path} does not match the run's config (another model "
                            f"shape or recipe{self._first_mismatch(state)}); it belongs to "
                            "another run") from None

    def _first_mismatch(self, state: dict[str, Any]) -> str:
        """``: the checkpoint lacks head.proxies`` (its model's first difference from this
        run's, as scoring names it); empty where the models' tensors agree (the optimiser's
        state is what differs) or the checkpoint holds no model."""
        saved = state.get("method")
        if not isinstance(saved, dict):
            return ""
        try:
            mismatch = first_mismatch(saved, self.method.state_dict())
        except (AttributeError, TypeError):  # a value that is not a tensor: say no more
            return ""
        return "" if mismatch == SAME_TENSORS else f": {mismatch}"

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
            # optim.lr as scheduled now, as torch computes the backbone group's rate: the
            # first group is another (the head's) where the backbone has no parameters
            row["lr"] = config.optim.lr * schedule_factor(config.optim, scheduler.last_epoch)
            terms = train_one_epoch(self, epoch, progress)
            row.update({f"train/{name}": value for name, value in terms.items()})
            if self.batches.left_out:  # data.on_bad_image=skip: the epoch trained on fewer
                row[f"{UNREADABLE}/train"] = self.batches.left_out
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
        row.update(unreadable_counts(self.splits, prefix))

    def checkpoint(self, epoch: int, history: list[dict[str, Any]], finished: bool,
                   unscored: dict[str, Any] | None = None,
                   stopped_early: bool = False) -> dict[str, Any]:
        """The run's state after ``epoch``; ``stopped_early``: training ended there by the
        convergence or patience rule, which a run with more epochs would meet there too (so a
        resumed run with train.epochs raised trains no further). ``history`` holds the rows
        before it when
        ``unscored`` is given: the trained epoch's row, not yet scored, and whether training
        is over (``checkpoints/unscored.pt``). ``unreadable`` keeps the test and gallery
        positions the last scoring left out (:attr:`DataSplits.unreadable`), so that a
        finished run resumed counts the samples its metrics are of
        (:func:`recorded_unreadable`). ``input_pca``, for a domain pair reduced by
        ``data.pca_dim``: the PCA its inputs go through (:meth:`SourcePCA.to_state`)."""
        state = {"epoch": epoch, "method": self.method.state_dict(),
                 "optimizer": self.optimizer.state_dict() if self.optimizer else None,
                 "scheduler": self.scheduler.state_dict() if self.scheduler else None,
                 "scaler": self.scaler.state_dict(), "history": history,
                 "config": self.config.to_dict(), "finished": finished,
                 "stopped_early": stopped_early, "unreadable": dict(self.splits.unreadable)}
        if unscored is not None:
            state["unscored"] = unscored
        if self.splits.input_pca is not None:  # the model's input: load_model needs no data
            state["input_pca"] = self.splits.input_pca.to_state()
        return state


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
    ``data_remedy`` ends the refusal of a resumed run's changed data
    (:func:`~kdml.training.loading.check_run_data`).
    ``selects=True`` (a grid's cell, whose validation score picks the best cell) checks
    ``train.select_metric`` with ``data.validation`` even without keep_best or patience.
    """
    # resolve_config checks the settings; a RunConfig built in Python reaches here unchecked
    validate(config)
    main = distributed.world().is_main
    echo = echo if main else _silent
    run = RunFolder(run_dir)
    check_utf8_path(run.root, resume)  # before anything is read or written
    state: dict[str, Any] | None = None  # the checkpoint a resumed run continues from
    with contextlib.ExitStack() as held:  # the run folder, held while this process trains
        if not main:
            # kdml's warnings (MarginalFisherLoss's of a batch with too few neighbours) are
            # rank 0's to say, in its train.log too: every rank computes the same global
            # objective and meets the same ones, which the others had printed bare, as
            # Python's two lines naming kdml's source file
            held.enter_context(warnings_on_stderr(shown=False))
        # process-wide torch modes, set while this run trains and restored after
        held.enter_context(flushing_denormals(config.train.flush_denormal, echo))
        held.enter_context(deterministic_mode(config.train.deterministic))
        def hold() -> None:
            held.enter_context(run.held())

        if resume:  # the folder exists: refuse one another process trains before loading data
            distributed.from_main(hold)
            # read once, here, so that a refused edit of config.yaml is refused before the
            # data is read (minutes on SOP) and before a resumed old run gets its data.json
            state = distributed.from_main(lambda: resumed_state(run, config))
            distributed.from_main(run.check_metrics_replaceable)  # written after each epoch
            check_data_path(run, config.data.dataset, data_remedy)
        with warnings_on_stderr(shown=main):  # the data's (e.g. files a folder: left out)
            # checks all before a new folder; a run resumed from a checkpoint keeps its settings
            session = Session.build(
                config, echo, selects, new_run=state is None,
                pca=None if state is None else checkpoint_pca(state, run.checkpoint,
                                                              config.data.pca_dim))
        if not resume:
            # e.g. PCA's d x d matrices, or a source too small: refused before the folder
            session.method.check_fit(len(session.splits.train))
            distributed.from_main(hold)
        distributed.from_main(lambda: _open_run_folder(run, session, resume, echo,
                                                       data_remedy))
        if start_line is not None:
            echo(start_line)
        return _train_session(session, run, resume, state, progress, echo)


def _build_parts(config: RunConfig, world: World, selects: bool, new_run: bool,
                 report: Callable[[str], None], pca: SourcePCA | None = None) -> tuple[
                     torch.device, DataSplits, DataSplits, Method, InputPipeline,
                     torch.optim.Optimizer | None, Schedule | None]:
    """What :meth:`Session.build` builds in each process by itself, checked: the device,
    the data (and its test part), the method on the device, its input pipeline and its
    optimiser and schedule."""
    device = resolve_device(distributed.device_for(config.train.device))
    check_distributed(config, world, device, get_recipe(config.recipe).draws_batches,
                      resumed=not new_run)
    check_before_data(config)
    splits, test_part = prepare_data_and_test_part(config.data, new_run=new_run, pca=pca)
    if not config.eval.ks:
        config.eval.ks = list(splits.eval_ks)
    check_evaluation(config, splits, selects)
    # a resumed run's checkpoint holds every weight: model.weights' file is not read (it
    # may be gone), as by the commands that read a run
    method = build_method(config, splits, pretrained=new_run, echo=report)
    check_method_on_splits(config, splits, method)
    if not method.needs_fit:  # PCA's fit reads the whole split, in no batches of classes
        check_batching(splits.train.labels, config.data.samples_per_class,
                       config.data.batch_size)
        check_batch_needs(config, method)
    if config.model.sync_bn:
        method = nn.SyncBatchNorm.convert_sync_batchnorm(method)
    method = method.to(device)
    pipeline = build_pipeline(config, splits.train, method)
    optimizer, scheduler = build_optimizer(method, config)
    if optimizer is None and not method.needs_fit:
        raise KdmlError(f"the {config.recipe} model has no parameters to train and no "
                        f"closed-form fit")
    return device, splits, test_part, method, pipeline, optimizer, scheduler


@dataclass
class _Start:
    """Where a session's epochs start: the ``history`` it continues, the first ``epoch`` to
    train, whether the run had ``stopped_early`` (nothing left to do), and the epoch trained
    before the session stopped while it was scored, ``(row, over)``, to score first."""

    history: list[dict[str, Any]]
    epoch: int
    stopped_early: bool
    unscored: tuple[dict[str, Any], bool] | None


def _start(session: Session, run: RunFolder, resume: bool, state: dict[str, Any] | None,
           echo: Callable[[str], None]) -> _Start:
    """Restore a resumed run's ``state`` into ``session`` and say where its epochs start; a
    new run (and one resumed before its first checkpoint) starts at epoch 1."""
    config = session.config
    if state is None:
        if resume:  # stopped before its first checkpoint: start over
            echo(f"{run.root} has no checkpoint to continue from; training it from epoch 1")
        return _Start([], 1, False, None)
    session.restore(state, run.unscored_checkpoint if state.get("unscored") is not None
                    else run.checkpoint)
    # after restore, which names a checkpoint of another recipe or shape as such: the
    # edits resumed_state left to it (of settings that size the model, or an empty
    # eval.ks, filled from the data since)
    refuse_edited_settings(changed_settings(state.get("config", {}), config), run)
    history, start_epoch = state["history"], state["epoch"] + 1
    # the images its last scoring left out: a finished run resumed scores nothing, and
    # still counts the samples the metrics it ends with are of
    session.splits.unreadable = recorded_unreadable(state, session.splits)
    if scored_prefix(session.splits) == VALIDATION:
        history = as_validation_history(history)
    planned = state.get("config", {}).get("train", {}).get("epochs", config.train.epochs)
    # a stop on the last planned epoch too (checkpoints from before the key: before it only)
    stopped_early = bool(state.get("finished")) and bool(state.get("stopped_early")
                                                          or state["epoch"] < planned)
    if stopped_early:  # by the convergence or patience rule: nothing left to do
        start_epoch = config.train.epochs + 1
    of_epochs = (f" of {config.train.epochs}" if state["epoch"] <= config.train.epochs
                 else f" (train.epochs is now {config.train.epochs})")
    unscored = None
    if state.get("unscored") is not None:  # its epoch is scored first, then on as before
        unscored = dict(state["unscored"]["row"]), bool(state["unscored"]["over"])
        start_epoch = state["epoch"]
        echo(f"resuming {run.root} after epoch {state['epoch']}{of_epochs}, trained but "
             "not yet scored: scoring it first")
    else:
        # a finished run resumed: said on the screen too, not only in train.log, before the
        # final metrics it prints again
        done = ("" if start_epoch <= config.train.epochs
                else f": it stopped early; {NOTHING_LEFT}" if stopped_early
                else f": {NOTHING_LEFT}")
        echo(f"resuming {run.root} after epoch {state['epoch']}{of_epochs}{done}")
    if not stopped_early and planned < config.train.epochs:  # train.epochs was raised
        echo(f"train.epochs is {config.train.epochs}, not the {planned} it was trained "
             f"for: training epochs {state['epoch'] + 1} to {config.train.epochs}")
    return _Start(history, start_epoch, stopped_early, unscored)


def _train_session(session: Session, run: RunFolder, resume: bool,
                   state: dict[str, Any] | None, progress: bool | None,
                   echo: Callable[[str], None]) -> dict[str, float]:
    """The epochs of :func:`train`, once the run folder is open and held; ``state`` is the
    checkpoint a resumed run continues from (:func:`resumed_state`), ``None`` for a new run
    and one resumed before its first checkpoint."""
    config, main = session.config, session.world.is_main
    echo(f"test set: {session.splits.test_set}")
    begin = _start(session, run, resume, state, echo)
    history, start_epoch, stopped_early = begin.history, begin.epoch, begin.stopped_early
    unscored = begin.unscored
    # an unscored epoch is scored even where train.epochs was lowered below it since
    end_epoch = max(config.train.epochs, start_epoch) if unscored else config.train.epochs

    prefix = scored_prefix(session.splits)
    with Recorder(run, main, prefix, from_scratch=resume and state is None) as recorder:
        if start_epoch > end_epoch and stopped_early:
            recorder.log.info("it stopped early, after epoch %d; %s", len(history),
                              NOTHING_LEFT)
        elif start_epoch > end_epoch:  # a finished run resumed: nothing to train
            trained = start_epoch - 1  # more than train.epochs where that was lowered since
            recorder.log.info("all %d epochs are trained%s; %s", trained,
                              f" (train.epochs is now {config.train.epochs})"
                              if trained > config.train.epochs else "", NOTHING_LEFT)
            if not part_scores(history[-1], prefix):
                # its last epoch trained but never scored (train.eval_every, then train.epochs
                # lowered to it): scored now, as a run always scores its last epoch, or the
                # run would end with no final metrics
                _score_last_epoch(session, recorder, history, progress)
        else:
            # the thread count too: a CPU run's float sums, so its numbers, depend on it
            recorder.log.info("start epoch %d of %d%s, device %s, %d train / %d %s samples, "
                              "%d loader workers, %d process(es), %d CPU thread(s)", start_epoch,
                              config.train.epochs, f" ({SCORED_FIRST})" if unscored else "",
                              session.device, len(session.splits.train),
                              len(session.splits.test),
                              "validation" if session.splits.validation else "test",
                              session.batches.loader.num_workers,
                              session.world.size, torch.get_num_threads())
        if session.weights_report:  # what the backbone loaded, kept with the run
            recorder.log.info("model.weights: %s", session.weights_report)
        warn_about_splits(session.splits, recorder.log)
        _warn_about_settings(session, recorder.log)
        # counted by hand, once each epoch is recorded: a bar iterated over the epochs counts
        # one only when the next begins, so a run stopped early (train.tolerance,
        # train.patience, a closed-form fit) had ended its bar an epoch short ("1/3" after
        # two epochs)
        epochs = tqdm(desc="epochs", initial=start_epoch - 1, total=end_epoch,
                      disable=bar_disabled(progress, main))
        metric = config.train.select_metric
        for epoch in _counted(range(start_epoch, end_epoch + 1), epochs):
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
                                    if k == f"{prefix}/recall@1" or k == "train/loss"},
                                   refresh=False)
                if config.train.keep_best or config.train.patience:
                    check_scored(row, metric)
                # patience counts the evaluations of the train.eval_every grid alone: the
                # last planned epoch's score off it (a shorter run's) had counted, so a run
                # extended with --resume stopped where one of that length goes on
                every = config.train.eval_every
                out_of_patience = epoch % every == 0 and patience_exhausted(
                    [past for past in history if past["epoch"] % every == 0], metric,
                    config.train.patience)
                finished = over or out_of_patience or epoch >= config.train.epochs
                recorder.epoch(row, history,
                               functools.partial(session.checkpoint, epoch, history, finished,
                                                 stopped_early=over or out_of_patience),
                               keep_as_best=(config.train.keep_best
                                             and best_epoch(history, metric) == epoch))
                epochs.update()
            except KdmlError as error:  # not a kill: an error kdml reports
                # the trained epoch goes where scoring it again would repeat the error (a
                # diverged model: the message names the checkpoint kept), or where it would be
                # the run's only checkpoint, so that the corrected command starts afresh
                # (check_new_run_folder); otherwise (an unreadable test image, say) --resume
                # scores it once the cause is mended. Under torchrun another rank's error
                # reaches rank 0 as a failed collective, not here: the epoch is kept, since a
                # killed peer looks the same, and --resume scores it.
                if isinstance(error, NonFiniteLoss) or not run.checkpoint.exists():
                    recorder.drop_unscored()
                raise
            if over or out_of_patience:  # its last line, before the lines that say why
                epochs.close()
            if over:
                recorder.log.info("stopping after epoch %d: converged or nothing to train",
                                  epoch)
                if not session.method.needs_fit and epoch < config.train.epochs:
                    # else only train.log said why a run of 100 epochs ended after 7
                    echo(f"stopped after epoch {epoch} of {config.train.epochs}: the training "
                         f"loss changed by less than train.tolerance={config.train.tolerance:g}")
                break
            if out_of_patience:
                evaluations = ("1 evaluation" if config.train.patience == 1
                               else f"{config.train.patience} evaluations")
                recorder.log.info("stopping after epoch %d: %s without a better validation %s "
                                  "than epoch %d's (train.patience)", epoch, evaluations,
                                  metric, best_epoch(history, metric))
                echo(f"stopped after epoch {epoch} of {config.train.epochs}: {evaluations} "
                     f"without a better validation {metric} (train.patience)")
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


def _warn_about_settings(session: Session, log: logging.Logger) -> None:
    """Log, as warnings in ``train.log``, the settings that train a run far from what its
    user most likely meant: a paper's backbone without its ImageNet weights, an embedding
    size or a pooling the model does not use, mixed precision on a CPU without kernels for
    it, BatchNorm that sees only each process's share."""
    config = session.config
    if not config.model.weights and config.model.backbone.startswith(IMAGENET_BACKBONES):
        if config.model.freeze_bn:
            # the JRD configs' setting, meant for ImageNet weights: without them it trains
            # with its statistics at 0 and 1, a run far from the paper's, without a word
            log.warning(
                "model.freeze_bn=true with no model.weights: the %s backbone starts from "
                "random weights and its BatchNorm statistics stay at their initial values "
                "(mean 0, variance 1), far from the papers' ImageNet start; give --weights "
                "FILE, or model.freeze_bn=false to train it from scratch",
                config.model.backbone)
        elif get_recipe(config.recipe).pretrained:
            # the MTriplet configs train BatchNorm: without weights they had trained a
            # random network for hundreds of epochs at the fine-tuning rate, silently
            log.warning(
                "no model.weights: the %s backbone starts from random weights, while %s's "
                "paper fine-tunes it from ImageNet weights (its learning rate and epochs "
                "are set for that); give --weights FILE", config.model.backbone,
                config.recipe)
    sizing = session.unused_embedding_size()
    if sizing:
        log.warning("model.embedding_size=%d does not size %s's embedding: %s does",
                    config.model.embedding_size, config.recipe, sizing)
    unpooled = session.unpooled_backbone()
    if unpooled:
        log.warning("model.pooling=%s is not used by backbone '%s': it pools the feature "
                    "maps of bninception, timm and torchvision backbones only",
                    config.model.pooling, unpooled)
    precision = config.train.precision
    if (session.device.type == "cpu" and precision != "fp32" and not session.method.needs_fit
            and cpu_has_kernels_for(precision) is False):
        # a GPU config trained on a laptop: several times slower, and nothing said it
        log.warning(
            "train.precision=%s on a CPU for which torch has no %s kernels: on such a CPU "
            "its training steps took 3 (a small CNN) to 12 (BN-Inception) times float32's "
            "time (docs/benchmarks.md; its scoring runs in float32 on a CPU); "
            "train.precision=fp32 is faster here", precision,
            {"bf16": "bfloat16", "fp16": "float16"}[precision])
    if session.batchnorm_is_per_process():
        log.warning(
            "the model's BatchNorm layers train on each process's share of the batch "
            "(%d of %d samples), as DistributedDataParallel's do, so the run is not the "
            "one process would train; model.sync_bn=true (GPUs) or model.freeze_bn=true "
            "make them see the whole batch", config.data.batch_size // session.world.size,
            config.data.batch_size)
    for setting, why in _unread_settings(session):
        log.warning("%s is not read by this run: %s", setting, why)
    small = _classes_smaller_than(session.splits.train.labels, config.data.samples_per_class)
    if small and config.data.batch_size and not session.method.needs_fit:
        # the sampler fills them with replacement (as PML's MPerClassSampler): a sample's
        # copies are its nearest same-class neighbours, at distance 0 (DTML's k1 graph, a
        # triplet's positive), and nothing had said so
        label, count = small[0]
        log.warning("%d training class%s fewer samples than data.samples_per_class=%d (class "
                    "%s has %d): %s batches repeat samples, and a sample's copies are its "
                    "nearest same-class neighbours at distance 0; lower "
                    "data.samples_per_class", len(small),
                    "es have" if len(small) > 1 else " has", config.data.samples_per_class,
                    label, count, "their" if len(small) > 1 else "its")


def _unread_settings(session: Session) -> list[tuple[str, str]]:
    """The settings given other values than the recipe's defaults that this run never reads
    (``optim.proxy_lr`` of a recipe without class proxies, the crop of in-memory images,
    class-balanced batches of a full-batch run, ...), each with why: a grid over one had
    trained the same run in every cell, without a word."""
    config = session.config
    recipe = get_recipe(config.recipe)
    default = resolve_config(recipe.name, recipe.params, recipe.defaults)

    def changed(section: str, key: str) -> bool:
        return getattr(getattr(config, section), key) != getattr(getattr(default, section), key)

    method = session.method
    unread = []
    if changed("optim", "proxy_lr") and not method.proxy_parameters():
        unread.append(("optim.proxy_lr", f"{config.recipe} has no class proxies"))
    if changed("optim", "head_lr"):
        # Method.param_groups: the head is what is neither the backbone nor a proxy
        others = {id(p) for p in (*method.backbone.parameters(), *method.proxy_parameters())}
        if all(id(p) in others for p in method.parameters()):
            unread.append(("optim.head_lr", f"{config.recipe}'s model has no layers beyond "
                                            "its backbone (optim.lr trains them all)"))
    if changed("optim", "lr_gamma") and not (config.optim.lr_step or config.optim.lr_milestones):
        unread.append(("optim.lr_gamma", "neither optim.lr_step nor optim.lr_milestones is "
                       "set, so the rates are never multiplied by it"))
    if changed("optim", "adam_eps") and config.optim.name != "adam":
        unread.append(("optim.adam_eps", f"it is Adam's, and optim.name={config.optim.name}"))
    if changed("train", "precision") and method.needs_fit and session.device.type == "cpu":
        # its fit takes no autocast, and a CPU scores in float32 (embedding_precision)
        unread.append(("train.precision", f"{config.recipe} is fitted in closed form, in no "
                       "training steps, and on a CPU its scoring runs in float32"))
    if changed("train", "select_metric") and config.data.validation == 0:
        # train.keep_best and train.patience are refused without data.validation
        unread.append(("train.select_metric", "it compares validation scores (train.keep_best, "
                       "train.patience, a grid's best cell), and data.validation is 0"))
    elif (changed("train", "select_metric") and not session.selects
          and not (config.train.keep_best or config.train.patience)):
        # nor is it checked against the scored metrics then (check_evaluation): a misspelt
        # name had been taken without a word
        unread.append(("train.select_metric", "it picks the epoch of train.keep_best and "
                       "train.patience (or a grid's best cell), and neither is set"))
    if changed("domain", "kernel") and config.domain.beta == 0:
        unread.append(("domain.kernel", "domain.beta=0 adds no domain term"))
    if (getattr(config.method, "decay_proxies", False) and config.optim.weight_decay == 0
            and changed("method", "decay_proxies")):
        unread.append(("method.decay_proxies", "optim.weight_decay=0 decays nothing"))
    if not session.splits.train.is_file_backed:  # build_pipeline crops image files alone
        unread += [(f"data.{key}", f"{config.data.dataset}'s samples are arrays in memory, "
                    "which are neither resized nor cropped (image files are)")
                   for key in ("resize", "image_size") if changed("data", key)]
    if changed("data", "samples_per_class") and config.data.samples_per_class > 0:
        if method.needs_fit:
            unread.append(("data.samples_per_class", f"{config.recipe} is fitted in closed "
                           "form on the whole training split, in no batches"))
        elif config.data.batch_size == 0:
            unread.append(("data.samples_per_class", "data.batch_size=0 trains on the whole "
                           "training split as one batch"))
    method_unread = getattr(config.method, "unread_settings", None)
    if method_unread is not None:
        unread += method_unread(default.method)
    return unread


def _classes_smaller_than(labels: torch.Tensor, size: int) -> list[tuple[int, int]]:
    """The (label, count) of the classes of ``labels`` with fewer than ``size`` samples."""
    if size <= 1:
        return []
    classes, counts = labels.unique(return_counts=True)
    return [(int(label), int(count)) for label, count in zip(classes.tolist(), counts.tolist(),
                                                             strict=True) if count < size]


def _silent(message: str) -> None:
    """The echo of the ranks other than 0: they print nothing."""


def _open_run_folder(run: RunFolder, session: Session, resume: bool,
                     echo: Callable[[str], None], data_remedy: str) -> None:
    """Make a new run's folder (its config and data.json), or check a resumed run's data
    against its data.json (refused saying ``data_remedy``)."""
    for partial in partial_checkpoints(run.checkpoint.parent):  # of a session killed mid-write
        partial.unlink(missing_ok=True)
    # a run's folder: its metrics' hidden partials, of a session killed while it wrote them
    # (SIGKILL: no except ran), had stayed there for good
    for partial in metrics_partials(run.root) if resume else []:
        partial.unlink(missing_ok=True)
    splits = session.splits
    record = functools.partial(data_record, splits, session.test_part,
                               fingerprint=session.data_fingerprint)
    if resume and not run.resumable and not run.history():
        # nothing trained yet (a run refused in its first epoch: an unreadable image, say):
        # it starts over on the data as it is now, mended, which data.json then records.
        # Not a trained run kept as records alone (results/): it is trained again on the
        # data its data.json names, checked below as any resumed run's
        if run.recorded_data() is not None or not run.data_fingerprint.exists():
            run.write_data_fingerprint(record())
        return
    if resume:
        recorded = run.recorded_data()
        check_run_data(run, recorded, session.config, splits, session.test_part, data_remedy,
                       fingerprint=session.data_fingerprint)
        # A run of a kdml before data.json gets one: from now on it trains on this data,
        # and the commands that read it check against it. Not where a file of the user's is.
        # One before the record of what the model takes gets it (its data was just checked;
        # not a fingerprint of another format, which the check could not compare).
        if (recorded is None and not run.data_fingerprint.exists()) or (
                recorded is not None and recorded.get(FORMAT_FIELD) == FINGERPRINT_FORMAT
                and SAMPLES_FIELD not in recorded):
            run.write_data_fingerprint(record())
        return
    check_new_run_folder(run.root, held=True)  # again: another run may have started here
    afresh = start_afresh(run.root)  # a run here that saved no checkpoint: its files go
    if afresh:
        echo(afresh)
    # absolute: kdml eval and the other commands read it again from any folder
    save_config(with_absolute_paths(session.config), run.config)
    run.write_data_fingerprint(record())


def train_one_epoch(session: Session, epoch: int, progress: bool | None) -> dict[str, float]:
    """One pass over the training split; returns each loss term's mean over the steps.

    Methods that use a target domain get a random target batch of the same size with each
    source batch (the target labels are never passed on). The forward runs under the
    configured autocast, the backward through the loss scaler (float16 only). The terms stay
    on the device until the epoch ends. Host syncs: at the end of the epoch, the terms' means,
    the loss terms' non-finite check and the weights' finiteness; within it, the periodic
    non-finite check (every step on a CPU in one process, where it costs nothing; every
    ``NONFINITE_CHECK_EVERY`` on a GPU, and under torchrun, where it is also a small
    collective at which the ranks agree on the first non-finite step) and, under float16
    only, the loss scaler's own."""
    method, config, device = session.method, session.config, session.device
    optimizer, _ = session.steppers()
    method.train()
    if config.model.freeze_bn:
        freeze_batchnorm(method)
    sums: dict[str, torch.Tensor] = {}
    watch = NonFiniteWatch(nonfinite_check_every(device, session.world.is_distributed),
                           config.train.precision)
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
    check_epoch_weights(method, epoch, steps)
    if not steps:
        raise KdmlError(f"epoch {epoch} had no training batch (every image unreadable?)")
    means = (torch.stack(list(sums.values())) / steps).tolist()
    return dict(zip(sums, means, strict=True))


def check_epoch_weights(method: nn.Module, epoch: int, steps: int) -> None:
    """:meth:`NonFiniteWatch.check_weights` of the weights the epoch's checkpoint keeps, with
    every rank deciding alike: the parameters, the same on every rank under
    DistributedDataParallel, and the buffers as rank 0 holds them (broadcast first, as scoring
    and the next step's forward do). Each rank's own BatchNorm statistics, of its last share,
    had been checked: one rank's alone overflowing (a share's variance beyond float32) raised
    on that rank alone, while the others went on to their next collective."""
    distributed.broadcast_buffers(method)
    # the state the checkpoint keeps: not a non-persistent buffer (a cached mask may hold inf)
    NonFiniteWatch.check_weights(method.state_dict().values(), epoch, steps)


# metrics.csv's and metrics.json's columns of the samples data.on_bad_image=skip left out of an
# epoch: unreadable/train (trained on), unreadable/test or unreadable/validation, and
# unreadable/gallery (scored); present only where some were
UNREADABLE = "unreadable"


def unreadable_counts(splits: DataSplits, prefix: str) -> dict[str, int]:
    """The counts of the test (``prefix``: or validation) and gallery images the scoring just
    done left out as unreadable (:attr:`DataSplits.unreadable`), for the epoch's row: its
    scores are of the others, which train.log's warning alone had said. data.json's
    ``parts`` gives each part's samples listed."""
    return {f"{UNREADABLE}/{prefix if part == 'test' else part}": len(positions)
            for part, positions in splits.unreadable.items() if len(positions)}


def _counted(epochs: range, bar: tqdm) -> Iterator[int]:
    """``epochs``, closing ``bar`` (the epochs' progress bar, which the loop counts) when the
    loop over them ends, however it ends."""
    try:
        yield from epochs
    finally:
        bar.close()


def _converged(history: list[dict[str, Any]], row: dict[str, Any], tolerance: float) -> bool:
    """DTML's stopping rule: |J_k - J_(k-1)| < tolerance on the epoch-mean training loss."""
    if tolerance <= 0 or not history or "train/loss" not in row:
        return False
    return abs(row["train/loss"] - history[-1]["train/loss"]) < tolerance
