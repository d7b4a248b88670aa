"""Rebuild a trained run's model from its folder (config, checkpoint, ``data.json``), and check
that the data a command reads is the data the run trained on."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kdml.config import (
    SECTIONS,
    RunConfig,
    config_format,
    load_config_file,
    missing_settings,
    resolve_config,
    set_key,
)
from kdml.data.domains import SourcePCA
from kdml.data.fingerprint import data_fingerprint, fingerprint_difference
from kdml.data.prepare import prepare_data_and_test_part
from kdml.data.registry import PATH_FORMATS, relocated, root_is_read
from kdml.data.sample_spec import FIELD as SAMPLES_FIELD
from kdml.data.sample_spec import SampleSpec
from kdml.data.splits import DataSplits
from kdml.errors import KdmlError, UnreadableCheckpoint, home_expanded, why_missing
from kdml.evaluation.evaluator import Embedder
from kdml.models.method import Method
from kdml.training.build import (
    build_embedder,
    build_method,
    build_method_for,
    build_pipeline,
    run_device,
)
from kdml.training.checkpoint import load_checkpoint
from kdml.training.recipes import Recipe, get_recipe
from kdml.training.resume_settings import changed_settings, first_of
from kdml.training.run_folder import RunFolder, trained_elsewhere


@dataclass
class RunModel:
    """A run's model, loaded from a checkpoint onto its embedder's device, and what it takes
    (``samples``)."""

    run: RunFolder
    config: RunConfig
    method: Method
    epoch: int
    embedder: Embedder
    checkpoint: Path  # the file the weights came from (last.pt, or best.pt)
    samples: SampleSpec
    pca: SourcePCA | None = field(default=None, kw_only=True)

    @property
    def input_pca(self) -> SourcePCA | None:
        """The PCA raw inputs go through before the model (a domain pair's ``data.pca_dim``,
        kept in the checkpoint); ``None``: the model takes the inputs as they are."""
        return self.pca


@dataclass
class TrainedRun(RunModel):
    """A run's model and its data (``splits``: the test part's with ``load_run(test_part=)``)."""

    splits: DataSplits

    @property
    def input_pca(self) -> SourcePCA | None:
        return self.splits.input_pca

    @property
    def variant(self) -> str:
        """What this model and part add to the names of the files made of them: ``-best`` for
        the kept best epoch, then ``-test`` for the test part of a run that validated (whose
        files are of the validation part); empty for the last checkpoint on the run's own part.
        So no command's file of one replaces that of another."""
        best = "-best" if self.checkpoint == self.run.best_checkpoint else ""
        test = "-test" if self.config.data.validation > 0 and not self.splits.validation else ""
        return f"{best}{test}"

    def plot_path(self, name: str) -> Path:
        """Where a plot of this model goes: ``plots/NAME.png``, ``plots/NAME-best.png`` and so
        on (:attr:`variant`)."""
        return self.run.plots / f"{name}{self.variant}.png"


def run_config(run: RunFolder) -> RunConfig:
    """The configuration in a run folder's ``config.yaml``, which kdml wrote whole: a file
    without its recipe or one of its sections (cut short, emptied, or the user's own) is
    refused, where reading it as a config file would fill the gaps with defaults, silently; so
    is one of a :data:`~kdml.config.FORMAT_KEY` line that lacks a setting (a line deleted),
    whose built-in default may not be the recipe's. A file from before that line, or of an
    earlier format, reads each setting added to kdml since as the value its run computed with
    (:data:`~kdml.config.ADDED_BEFORE_FORMAT`, :data:`~kdml.config.ADDED_IN_FORMAT`)."""
    file_values = load_config_file(run.config)
    # kdml writes every section as a mapping ({} where empty): a null one (`method:` at the
    # file's end) is a file cut short there, not a section to fill with defaults
    missing = [key for key in ("recipe", *SECTIONS) if file_values.get(key) is None]
    if missing:
        raise KdmlError(f"{run.config} has no {missing[0]!r}: it is not the whole config kdml "
                        "wrote for this run (cut short, emptied or replaced); restore it, or "
                        "train the run again into a new folder")
    version = config_format(file_values, str(run.config))
    recipe = get_recipe(str(file_values["recipe"]))
    try:
        config = resolve_config(recipe.name, recipe.params, file_values=file_values)
        deleted, added_since = missing_settings(config, file_values, version)
        for key, value in added_since.items():
            set_key(config, key, value)
    except KdmlError as error:  # an edit of the file: say which file (not a command's input)
        raise KdmlError(f"{run.config}: {error}") from None
    if deleted:
        raise KdmlError(deleted_setting_problem(run, recipe, deleted))
    if config.data.root and not root_is_read(config.data.dataset):
        # Saved before kdml refused a root the dataset does not read: it was ignored in
        # training, so it is dropped here rather than refused for a run already trained.
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, root=""))
    return config


def deleted_setting_problem(run: RunFolder, recipe: Recipe, deleted: list[str]) -> str:
    """The refusal of a run folder's config.yaml that lacks the ``deleted`` settings, which
    kdml wrote there: the first, with the line to put back (the recipe's default, since the
    run may have trained with another value), and how many more."""
    key = deleted[0]
    section, leaf = key.split(".", 1)
    defaults = resolve_config(recipe.name, recipe.params, recipe.defaults)
    line = yaml.safe_dump({leaf: getattr(getattr(defaults, section), leaf)},
                          default_flow_style=True, width=10**6).strip()[1:-1]
    return (f"{run.config} has no {first_of(deleted)}, which kdml wrote there (a line "
            f"deleted?): put the line back under {section}: with the value the run trained with "
            f"({recipe.name}'s default is '{line}'); a deleted setting is not read as a default")


# What the refusal of a missing best.pt adds where the run has its last checkpoint.
LAST_INSTEAD = "; without --best, kdml reads its last checkpoint"


def chosen_checkpoint(run: RunFolder, best: bool = False) -> Path:
    """The checkpoint a command reads: ``checkpoints/best.pt`` with ``best``
    (``train.keep_best``), else ``last.pt``; one line where it is not there."""
    checkpoint = run.best_checkpoint if best else run.checkpoint
    if best and not checkpoint.is_file() and not run_config(run).train.keep_best:
        raise KdmlError(f"{run.root} has no {checkpoint.name}: only runs trained with "
                        "train.keep_best=true keep one")
    if not checkpoint.is_file() and trained_elsewhere(run.root):
        # in its first epoch (or, for best.pt, before its first epoch scored on validation):
        # the advice below, 'kdml train --resume', is refused while another process trains it
        raise UnreadableCheckpoint(
            f"no checkpoint at {checkpoint} yet: {run.root} is being trained by another "
            "process, which writes it at the end of an epoch"
            f"{' scored on validation' if best else ''}; wait for that")
    if best and not checkpoint.is_file():
        # "only runs trained with train.keep_best=true keep one" misled about such a run
        raise KdmlError(f"{run.root} has no {checkpoint.name}: its train.keep_best keeps one "
                        "from its first epoch scored on validation, which it has not reached "
                        f"(continue it with 'kdml train --resume {run.root}'), or the file was "
                        f"removed{LAST_INSTEAD if run.checkpoint.is_file() else ''}")
    if not checkpoint.is_file() and run.final_metrics() is not None:
        # a finished run kept as records alone (results/ in the repository): its scores are
        # there, and it has to be trained again, from the start, to have a model
        raise UnreadableCheckpoint(
            f"no checkpoint at {checkpoint}: the run finished (its scores are in "
            f"{run.metrics_json.name}) but its checkpoint was removed; 'kdml train --resume "
            f"{run.root}' trains it again from epoch 1")
    if not checkpoint.is_file():  # load_checkpoint's one line: the run never finished an epoch
        load_checkpoint(checkpoint)
    return checkpoint


# What a refusal of changed data tells the user of kdml train --resume, and of kdml eval & co.
RESUME_DATA_REMEDY = ("put back the data the run trained on where its config.yaml says, or point "
                      "its data.root (or folder:/csv: path) at where it is now")
LOAD_DATA_REMEDY = "point --data-root at the data the run trained on"


def load_run(run_dir: Path, data_root: str | None = None, best: bool = False,
             test_part: bool = False, data_remedy: str = LOAD_DATA_REMEDY,
             progress: bool | None = None, device: str | None = None) -> TrainedRun:
    """Rebuild a run's method from its config and load its last checkpoint onto ``device``
    (``None``: where the run trained, if this machine has it, else auto:
    :func:`~kdml.training.build.run_device`).

    ``data_root`` replaces the run's ``data.root`` (a dataset moved since training). ``best``
    loads ``checkpoints/best.pt`` (``train.keep_best``) instead. ``test_part``: for a run that
    validated (``data.validation``), ``splits`` are the test part's, for scoring the chosen
    model on the classes it was never chosen on; the model is built as trained.
    Data other than the run's is refused (:func:`check_run_data`), saying ``data_remedy``.
    ``progress`` is its embedder's progress bar (:class:`~kdml.evaluation.evaluator.Embedder`)."""
    run = RunFolder.existing(run_dir)
    config = run_config(run)
    target = run_device(device, config.train.device)  # a missing GPU said before the work
    if data_root is not None:  # set directly: a path is not parsed as an override's YAML
        dataset, root = relocated(config.data.dataset, data_root)
        config = dataclasses.replace(
            config, data=dataclasses.replace(config.data, dataset=dataset, root=root))
    checkpoint = chosen_checkpoint(run, best)  # needs no data: said first
    if data_root is None:
        check_data_path(run, config.data.dataset, data_remedy)
    state = load_checkpoint(checkpoint)
    recorded = run.recorded_data()
    # the test part too where it was recorded: the check compares every part training saw;
    # a domain pair through the PCA the model was trained on, not one fitted again
    splits, test_splits = prepare_data_and_test_part(
        config.data, test_part or recorded is not None,
        pca=checkpoint_pca(state, checkpoint, config.data.pca_dim))
    check_run_data(run, recorded, config, splits, test_splits, data_remedy)
    if not test_part:
        test_splits = splits
    check_checkpoint_config(state, config, checkpoint, run)
    method = build_method(config, splits, pretrained=False)  # the checkpoint has the weights
    _load_weights(method, state, checkpoint,
                  f"the run's config and its data as they are now ({len(splits.train_classes)} "
                  "training classes)", "if the data changed since training (classes added or "
                  "removed), point --data-root at the data the run trained on")
    method.to(target)
    embedder = build_embedder(config, build_pipeline(config, splits.train, method), target,
                              progress)
    return TrainedRun(run, config, method, state["epoch"], embedder, checkpoint,
                      SampleSpec.of(splits.train, len(splits.train_classes)), test_splits)


def load_model(run_dir: Path, best: bool = False, data_root: str | None = None,
               progress: bool | None = None, device: str | None = None) -> RunModel:
    """A run's model (on ``device``, as :func:`load_run` puts it, from ``last.pt``, or
    ``best.pt`` with ``best``), rebuilt from
    the run folder alone: its config, its checkpoint and what its ``data.json`` records of the
    samples the model takes (:mod:`kdml.data.sample_spec`). A run of a kdml before that record
    is rebuilt from its data by :func:`load_run` (at ``data_root`` where given). ``progress``
    is its embedder's progress bar. A run whose domain pair went through a PCA
    (``data.pca_dim``) takes it from its checkpoint (:attr:`RunModel.input_pca`, which raw
    inputs go through); a checkpoint of a kdml before it kept the PCA is loaded with the run's
    data, to fit it again on the run's own source."""
    run = RunFolder.existing(run_dir)
    recorded = run.recorded_data()
    samples = (None if recorded is None else
               SampleSpec.from_record(recorded, str(run.data_fingerprint)))
    config = run_config(run)
    if samples is None:
        return load_run(run_dir, data_root, best=best, progress=progress, device=device)
    target = run_device(device, config.train.device)
    checkpoint = chosen_checkpoint(run, best)
    state = load_checkpoint(checkpoint)
    pca = None
    if config.data.pca_dim:
        if "input_pca" not in state:
            return load_run(run_dir, data_root, best=best, progress=progress, device=device)
        pca = stored_pca(state, checkpoint, config.data.pca_dim, samples)
    check_checkpoint_config(state, config, checkpoint, run)
    method = build_method_for(config, samples, samples.train_classes, pretrained=False)
    _load_weights(method, state, checkpoint,
                  f"{run.config} and {run.data_fingerprint} ({samples.train_classes} training "
                  "classes)", "restore the run's files from a copy")
    method.to(target)
    embedder = build_embedder(config, build_pipeline(config, samples, method), target, progress)
    return RunModel(run, config, method, state["epoch"], embedder, checkpoint, samples, pca=pca)


def checkpoint_pca(state: dict[str, Any], checkpoint: Path, pca_dim: int) -> SourcePCA | None:
    """The input PCA ``checkpoint`` keeps (its ``state``) for a run of ``data.pca_dim`` > 0,
    to project the run's own pair by: a PCA fitted again on its source, edited since (its
    data.json deleted to use it anyway), had given the model a basis it never saw. ``None``
    without ``pca_dim``, for a checkpoint of a kdml before it kept the PCA (fitted again, as
    that kdml did), and for a PCA of another size: config.yaml's data.pca_dim edited since,
    which the checks of the run's data and settings name."""
    if not pca_dim or "input_pca" not in state:
        return None
    pca = SourcePCA.from_state(state["input_pca"], str(checkpoint))
    return pca if pca.dim == pca_dim else None


def stored_pca(state: dict[str, Any], checkpoint: Path, pca_dim: int,
               samples: SampleSpec) -> SourcePCA:
    """The input PCA ``checkpoint`` keeps (its ``state``), checked against the run's
    ``data.pca_dim`` and the samples its model takes."""
    pca = SourcePCA.from_state(state["input_pca"], str(checkpoint))
    if pca.dim != pca_dim or samples.sample_shape != (pca.dim,):
        raise UnreadableCheckpoint(
            f"checkpoint {checkpoint} is damaged: its input PCA has {pca.dim} components, but "
            f"the run's data.pca_dim is {pca_dim} and its model takes samples of shape "
            f"{samples.sample_shape}; delete it and train again")
    return pca


def data_record(splits: DataSplits, test_part: DataSplits | None,
                fingerprint: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """A run's ``data.json``: the fingerprint of its data (:mod:`kdml.data.fingerprint`) and
    what its model takes (:mod:`kdml.data.sample_spec`), from which the run folder alone
    rebuilds the model (:func:`load_model`). ``fingerprint`` gives the fingerprint of
    ``splits`` and ``test_part`` where it is already computed (a training session's,
    :meth:`~kdml.training.trainer.Session.data_fingerprint`)."""
    fingerprinted = (fingerprint() if fingerprint is not None
                     else data_fingerprint(splits, test_part))
    return {**fingerprinted,
            SAMPLES_FIELD: SampleSpec.of(splits.train, len(splits.train_classes)).to_record()}


def check_data_path(run: RunFolder, dataset: str, remedy: str) -> None:
    """Refuse, saying ``remedy``, a path-named dataset (``folder:DIR``, ``csv:FILE``,
    ``npz:FILE``) whose path is gone: the reader's own words would not say that the run's
    data moved, nor that --data-root follows it."""
    for prefix, kind in PATH_FORMATS.items():
        if dataset.startswith(prefix):
            path = home_expanded(dataset.removeprefix(prefix))  # as the readers take it
            if not (path.is_dir() if kind == "folder" else path.is_file()):
                raise KdmlError(f"{run.config} names {dataset}, whose {kind} "
                                f"{why_missing(path, kind)} now; {remedy}")


def check_run_data(run: RunFolder, recorded: dict[str, Any] | None, config: RunConfig,
                   splits: DataSplits, test_part: DataSplits, remedy: str,
                   fingerprint: Callable[[], dict[str, Any]] | None = None) -> None:
    """Refuse, with one line ending in ``remedy``, data other than what the run trained on:
    ``recorded`` is its fingerprint (``data.json``; ``None`` for a run made before kdml wrote
    one, which goes unchecked), ``splits`` and ``test_part`` the data as read now (see
    :func:`~kdml.data.prepare.prepare_data_and_test_part`), whose fingerprint ``fingerprint``
    gives where it is already computed (a training session's)."""
    if recorded is None:
        return
    now = fingerprint() if fingerprint is not None else data_fingerprint(splits, test_part)
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


def check_checkpoint_recipe(state: dict[str, Any], recipe: str, checkpoint: Path,
                            config_name: str) -> None:
    """Refuse, in one line, a checkpoint trained with another recipe than ``recipe``, which
    ``config_name`` (the run folder's config) names: another run's checkpoint."""
    trained = (state.get("config") or {}).get("recipe", recipe)
    if trained != recipe:
        raise KdmlError(f"checkpoint {checkpoint} is a {trained!r} run but {config_name} says "
                        f"{recipe!r}; it belongs to another run: put the run's own checkpoint "
                        "back, or train this config again")


def check_checkpoint_config(state: dict[str, Any], config: RunConfig, checkpoint: Path,
                            run: RunFolder) -> None:
    """Refuse, in one line, a checkpoint trained with another recipe or other settings than
    the run folder's ``config.yaml`` (another run's, copied in; or the file edited since): its
    weights would load wherever the shapes fit and be scored under the folder's config. The
    settings ``--resume`` may change (:data:`~kdml.training.resume_settings.RESUMABLE`: paths,
    device, epochs, ...) and the ``eval`` section, which only says how to score, may differ."""
    check_checkpoint_recipe(state, config.recipe, checkpoint, str(run.config))
    trained = state.get("config") or {}
    changed = [change for change in changed_settings(trained, config)
               if not change.startswith("eval.")]
    if changed:
        raise KdmlError(f"{run.config} differs from the config checkpoint {checkpoint} was "
                        f"trained with: {first_of(changed)}; put the setting back in "
                        "config.yaml, or the checkpoint belongs to another run")


def _load_weights(method: Method, state: dict[str, Any], checkpoint: Path, built_from: str,
                  remedy: str) -> None:
    """Load a checkpoint's weights into ``method``, built from ``built_from``; one line saying
    ``remedy`` where they do not fit it."""
    try:
        method.load_state_dict(state["method"])
    except RuntimeError:
        raise KdmlError(f"checkpoint {checkpoint} does not match the model built from "
                        f"{built_from}: {first_mismatch(state['method'], method.state_dict())}"
                        f"; {remedy}") from None


def first_mismatch(saved: dict[str, Any], built: dict[str, Any]) -> str:
    """The first difference between a checkpoint's weights and a model's, in words."""
    for key in (key for key in saved if key in built):  # in the checkpoint's order
        if tuple(saved[key].shape) != tuple(built[key].shape):
            return (f"{key} is {tuple(saved[key].shape)} in the checkpoint and "
                    f"{tuple(built[key].shape)} in the model")
    missing, extra = sorted(built.keys() - saved.keys()), sorted(saved.keys() - built.keys())
    return (f"the checkpoint lacks {missing[0]}" if missing else
            f"the checkpoint has {extra[0]}, which the model does not" if extra else
            SAME_TENSORS)


SAME_TENSORS = "their weights differ"  # first_mismatch's answer where names and shapes agree
