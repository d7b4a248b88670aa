"""Train every (experiment, cell, seed) of ``kdml reproduce`` and collect its numbers.

Each distinct configuration is trained once per seed into
``RUNS/<recipe>-<dataset>-<config hash>/seed-<seed>``: a cell shared by several experiments
(JRD at alpha = 1 appears in five) is trained once, and a second ``kdml reproduce`` reuses
finished runs and resumes interrupted ones, so a long reproduction can be stopped and continued
with the same command.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from kdml.config import (
    ADDED_BEFORE_FORMAT,
    ADDED_IN_FORMAT,
    RunConfig,
    flatten,
    resolve_config,
)
from kdml.data.registry import ROOT_VARIABLE, root_is_read
from kdml.errors import KdmlError, UnreadableCheckpoint
from kdml.evaluation.evaluator import COLLAPSED, embed_dataset
from kdml.evaluation.knn import as_metric
from kdml.evaluation.parts import retrieval_over_parts
from kdml.figure_file import copy_png, drawn_by_kdml
from kdml.inspection.analysis import GeneralizationSettings, analyze_generalization
from kdml.inspection.plots import draw_charts
from kdml.machine import machine_description
from kdml.reproduce.experiments import NUM_PARTS, PARTS_KS, Cell, Experiment
from kdml.training.build import resolve_device
from kdml.training.grid import MARKER, is_score, recorded_cells
from kdml.training.loading import TrainedRun, load_run, run_config
from kdml.training.nonfinite import NonFiniteLoss
from kdml.training.recipes import get_recipe
from kdml.training.run_folder import (
    NOTHING_LEFT,
    SCORED_FIRST,
    STOPPED,
    FolderBusy,
    RunFolder,
    hold_folder,
    holds_run,
    safe_name,
    write_json,
)
from kdml.training.trainer import train

# Written by kdml into each run folder it trains: the wall time, device and machine of the
# training (runs recorded before kdml kept the machine have none).
TIMING_FILE = "reproduce.json"
PARTS_FILE = "parts.json"
# Written by kdml into the run folder of each run whose chart plot a report shows: that plot,
# kept with the records (not under plots/, which results/ leaves out of git), so that a report
# written again from records kept without their checkpoints still shows it.
CHARTS_RECORD = "reproduce-charts.png"


@dataclass(frozen=True)
class PlannedRun:
    """One training run: a cell's configuration at one seed."""

    config: RunConfig
    run_dir: Path


@dataclass
class CellResult:
    """A cell's numbers, one per seed (in seed order)."""

    values: dict[str, list[float]] = field(default_factory=dict)
    part_ci95: dict[str, list[float]] = field(default_factory=dict)  # parts protocol only
    wall_s: list[float] = field(default_factory=list)
    # the machine each seed's run trained on, in words ("" where its record does not say)
    machines: list[str] = field(default_factory=list)
    charts: Path | None = None
    charts_seed: int = 0  # the seed the charts show: the first whose run finished
    # why the charts are not drawn when ``charts`` is None: a run kept without its checkpoint
    # or its chart plot (records alone) has numbers but no model to draw them from ("" when
    # they are drawn)
    charts_missing: str = ""
    run_dirs: list[Path] = field(default_factory=list)
    # seed -> why its run diverged; its values are NaN, so that the others stay paired by seed
    diverged: dict[int, str] = field(default_factory=dict)
    # seed -> the share of its run's test embeddings at one point, where at least half lie at
    # one (its metrics.json's "collapsed"; a run recorded before kdml kept it has none)
    collapsed: dict[int, float] = field(default_factory=dict)


@dataclass
class ExperimentResult:
    experiment: Experiment
    cells: dict[str, CellResult]
    # every cell's (its first seed's), to describe the settings; () when it could not run
    configs: tuple[RunConfig, ...]
    error: str = ""  # why the experiment could not run ("" when it did)


def cell_config(experiment: Experiment, cell: Cell, seed: int, device: str) -> RunConfig:
    recipe = get_recipe(cell.recipe)
    overrides = [f"data.dataset={experiment.dataset}", *experiment.common, *cell.overrides,
                 f"train.seed={seed}", f"train.device={device}"]
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, None, overrides)
    # The tables need the scores after the last epoch only; scoring the test part after every
    # epoch took most of a Fashion-MNIST run (MAP@R ranks 3,500 neighbours of 35,000 queries).
    config.train.eval_every = config.train.epochs
    return config


# Settings that change how a run executes, not what it computes, and were added after runs
# existed: left out of the folder's hash, so that those runs keep their folders.
EXECUTION_ONLY = (("train", "compile"),)
# Settings added after runs existed, with the value that computes what those runs computed:
# left out of the hash at that value (another value is another run, in another folder).
ADDED_LATER = {tuple(key.split(".", 1)): value for key, value in
               {**ADDED_BEFORE_FORMAT,
                **{key: value for key, (_, value) in ADDED_IN_FORMAT.items()}}.items()}


# Settings that change only what a run records along the way, not its model or its last
# scores (tested: the same weights and final metrics): hashed at the value the first runs had,
# so a run that records more or less shares their folder.
RECORDED_ONLY = {("train", "eval_every"): 1}

# Recipes whose objective changed after runs existed: hashed with the change, so that their
# earlier runs, which trained the old objective, are not reused (they stay in their folders).
# The text is hashed as written: editing it would train those recipes' runs again (a test
# checks that the records in results/ keep their folders).
REVISED = {"dstml": "each hidden layer's weight penalty inside its hinge (Eq. 13)"}


def run_folder_of(config: RunConfig, runs_root: Path) -> Path:
    """``RUNS/<recipe>-<dataset>-<hash of the config without its seed>/seed-<seed>``."""
    values = config.to_dict()
    seed = values["train"].pop("seed")
    for section, key in EXECUTION_ONLY:
        values[section].pop(key)
    for (section, key), first in RECORDED_ONLY.items():
        values[section][key] = first
    for (section, key), earlier in ADDED_LATER.items():
        if values[section].get(key, earlier) == earlier:  # of some recipes only
            values[section].pop(key, None)
    if config.recipe in REVISED:
        values["revised"] = REVISED[config.recipe]
    digest = hashlib.sha1(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()
    name = f"{config.recipe}-{safe_name(config.data.dataset)}-{digest[:10]}"
    return runs_root / name / f"seed-{seed}"


def plan(experiments: list[Experiment], seeds: int, runs_root: Path,
         device: str) -> dict[tuple[str, str], list[PlannedRun]]:
    """The runs of every (experiment key, cell label), ``seeds`` each (seeds 0..N-1).

    Every configuration is resolved (and so checked) before anything trains. ``device`` is
    resolved too (``auto`` -> ``cpu`` or ``cuda``): a run folder's name hashes the device its
    run trains on, so ``auto`` finds the runs that the same device trained under its name."""
    device = str(resolve_device(device))
    planned = {}
    for experiment in experiments:
        for cell in experiment.cells:
            runs = []
            for seed in range(seeds):
                config = cell_config(experiment, cell, seed, device)
                runs.append(PlannedRun(config, run_folder_of(config, runs_root)))
            planned[experiment.key, cell.label] = runs
    return planned


def unique_runs(planned: dict[tuple[str, str], list[PlannedRun]]) -> list[PlannedRun]:
    seen: dict[Path, PlannedRun] = {}
    for runs in planned.values():
        for run in runs:
            seen.setdefault(run.run_dir, run)
    return list(seen.values())


class Trained(NamedTuple):
    """What :func:`train_planned` did for one run."""

    wall_s: float  # the run's training time, over all its sessions
    diverged: str  # why its loss became NaN or infinite ("" when it did not)
    reused: bool  # it had finished (or diverged) earlier, so nothing was trained now
    machine: str  # where it trained, in words ("" for a run recorded before kdml kept it)


def train_planned(run: PlannedRun, progress: bool | None) -> Trained:
    """Train ``run`` unless it finished earlier (resuming it if it started).

    ``reproduce.json`` keeps a divergence, and a later call returns it without training: the
    same seed diverges again the same way (delete the run folder to train it anyway)."""
    folder = RunFolder(run.run_dir)
    timing = run.run_dir / TIMING_FILE
    # an interrupted run too: it resumes with the planned config, not its config.yaml, so an
    # edit of that file (or another run copied in) went unseen, and the next command refused
    # the finished run whose numbers this one had reported
    check_holds_planned(run)
    if finished_earlier(run.run_dir):
        wall = read_stored(timing, "wall_s")
        if not isinstance(wall, (int, float)):
            raise not_as_written(timing, f"wall_s is {wall!r}")
        return Trained(float(wall), _stored_divergence(timing), reused=True,
                       machine=_stored_machine(timing))
    diverged = ""
    try:
        # a copy: the trainer fills in the dataset's Ks (eval.ks) of the config it trains,
        # and the planned one describes the cell in the report, the same whether its run
        # trains now or was reused (which had told a row's Ks as a change of that row alone)
        train(copy.deepcopy(run.config), run.run_dir, resume=folder.config.is_file(),
              progress=progress,
              echo=lambda line: None,
              data_remedy=reproduce_remedy(run.run_dir, run.config.data.dataset))
    except NonFiniteLoss as error:
        diverged = str(error)
    # every session counted alike, this one as the earlier ones of an interrupted run: from
    # its first epoch's start in train.log (after its data loaded) to its last line (this one
    # had counted from before its data loaded); a session that trains again from epoch 1 (no
    # checkpoint to resume from) drops the time of those before it
    wall = logged_seconds(folder.log, through_stop=bool(diverged))
    machine = machine_description(resolve_device(run.config.train.device))
    write_json({"wall_s": wall, "device": run.config.train.device, "machine": machine,
                **({"diverged": diverged} if diverged else {})}, timing, ("wall_s", "device"))
    return Trained(wall, diverged, reused=False, machine=machine)


def check_holds_planned(run: PlannedRun) -> None:
    """Refuse a run, finished or interrupted, whose ``config.yaml`` is not the run planned in
    its folder: the folder is found by its name alone, and a run copied in under another's name
    (records are copied between runs folders) would give its numbers to a cell it did not
    train; an interrupted one resumes with the planned config, which an edit of its
    ``config.yaml`` would no longer describe. A run that
    diverged before its folder held a config has nothing to compare. Settings its folder's name
    leaves out (:data:`EXECUTION_ONLY`, :data:`RECORDED_ONLY`) are not compared: a run that
    scored every epoch is reused, as its folder is; one of :data:`ADDED_LATER` that a run's
    config.yaml lacks (trained before it existed) is the value that run computed with, as
    :func:`~kdml.training.loading.run_config` reads it."""
    folder = RunFolder(run.run_dir)
    if not folder.config.is_file():
        return
    # run_config reads a setting added later, which the config.yaml of a run trained before it
    # existed lacks, as the value that computes what that run computed, not as today's default
    stored = flatten(run_config(folder).to_dict())
    planned = flatten(run.config.to_dict())
    if not planned["eval.ks"]:  # the dataset's own Ks, which the trainer writes out
        del stored["eval.ks"], planned["eval.ks"]
    # what the folder's name leaves out as not changing the run's model or last scores (how
    # often it scored, how it executed): a run that scored every epoch is the planned run
    for section, key in (*EXECUTION_ONLY, *RECORDED_ONLY):
        stored.pop(f"{section}.{key}", None)
        planned.pop(f"{section}.{key}", None)
    differing = sorted(key for key in stored.keys() | planned.keys()
                       if stored.get(key) != planned.get(key))
    if differing:
        key = differing[0]
        raise KdmlError(f"{run.run_dir} holds another run than the one planned there ({key} is "
                        f"{stored.get(key)!r} in its config.yaml, not {planned.get(key)!r}); "
                        "move it away, or delete it, and run the same command again to train "
                        "the planned run")


def check_runs_folder(runs: Path) -> None:
    """Refuse a ``--runs`` that is a run's folder (``kdml train``'s, or one of these runs) or
    a grid's, or any folder below one (``RUN/sub``): reproduce would nest its runs, and with
    ``--quick`` its report, among that run's files, where ``kdml train`` refuses to start a
    run and a grid to start."""
    what = _run_or_grid(runs)
    if what is not None:
        raise KdmlError(f"--runs {runs} is a {what}'s folder ({_MARKS[what]}); kdml reproduce's "
                        "runs go into a folder of their own: choose another --runs")
    # the folders above it, spelled without ".." (RUN/../other is not inside RUN)
    for above in Path(os.path.abspath(runs)).parents:
        what = _run_or_grid(above)
        if what is not None:
            marker = f" ({MARKER})" if what == "grid" else ""
            raise KdmlError(f"--runs {runs} is inside the {what} folder {above}{marker}; kdml "
                            "reproduce's runs go into a folder of their own: choose a --runs "
                            "outside it")


# What tells each kind of folder, as check_runs_folder says it.
_MARKS = {"run": "its config.yaml beside its log or checkpoints", "grid": MARKER}


def _run_or_grid(folder: Path) -> str | None:
    """``"run"`` where ``folder`` is a run's (kdml train's or reproduce's), ``"grid"`` where a
    grid's, else ``None``."""
    if holds_run(folder):
        return "run"
    return "grid" if recorded_cells(folder) is not None else None


def claim_file(run_dir: Path) -> Path:
    """The lock a ``kdml reproduce`` holds while it trains or reads ``run_dir``: beside the
    run's folder, not in it (a new run's folder holds nothing else), and ignored by git."""
    return run_dir.parent / f".{run_dir.name}.reproduce.lock"


_CLAIMED = "another kdml reproduce is training this run"


def finished_earlier(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` finished (or diverged) under ``kdml reproduce``, which
    writes ``reproduce.json`` after it: :func:`train_planned` then reuses it untrained."""
    timing = run_dir / TIMING_FILE
    return timing.is_file() and (bool(_stored_divergence(timing))
                                 or RunFolder(run_dir).final_metrics() is not None)


def _stored(timing: Path, key: str) -> Any:
    """``reproduce.json``'s value at ``key`` ("" where it has none, or is broken: a broken
    file gets its one-line error from read_stored)."""
    try:
        return json.loads(timing.read_text()).get(key, "")
    except (OSError, ValueError, AttributeError):
        return ""


def _stored_divergence(timing: Path) -> str:
    """Why the run diverged, as its ``reproduce.json`` records ("" when it did not)."""
    return str(_stored(timing, "diverged"))


def _stored_machine(timing: Path) -> str:
    """The machine the run trained on (the session that finished it), as its
    ``reproduce.json`` says; "" for a run recorded before kdml kept it."""
    machine = _stored(timing, "machine")
    return machine if isinstance(machine, str) else ""


def all_finished(experiment: Experiment, seeds: int, runs_root: Path, device: str) -> bool:
    """Whether every run of ``experiment`` (``seeds`` seeds, on ``device``) finished in
    ``runs_root``, so that its numbers can be read without training anything."""
    try:
        planned = plan([experiment], seeds, runs_root, device)
    except KdmlError:  # it cannot be configured here: it has no runs to read
        return False
    return all(finished_earlier(run.run_dir) for runs in planned.values() for run in runs)


def reproduce_remedy(run_dir: Path, dataset: str) -> str:
    """What a ``kdml reproduce`` user can do about data other than what the run in ``run_dir``
    trained on: train it again, or put the data back where reproduce reads it (the trainer's
    own words name --data-root and the run's config.yaml, which reproduce does not take)."""
    again = f"delete {run_dir} to train the run again on this data"
    if not root_is_read(dataset):  # kdml's own offline data: nothing to put back
        return again
    return (f"{again}, or put back the data it trained on where kdml reproduce reads it "
            f"(${ROOT_VARIABLE}, else the dataset's system folder)")


def reload_run(run_dir: Path) -> TrainedRun:
    """:func:`~kdml.training.loading.load_run`, refusing changed data in reproduce's words."""
    dataset = run_config(RunFolder.existing(run_dir)).data.dataset
    # On the CPU, where every committed record's parts.json and generalization.json were
    # computed, whichever device trained the run
    return load_run(run_dir, data_remedy=reproduce_remedy(run_dir, dataset), device="cpu")


def no_checkpoint(run_dir: Path, purpose: str) -> str:
    """Why a finished run kept without its checkpoint (its records alone, as in
    ``results/``) cannot ``purpose``, and what to do: train it again."""
    return (f"{run_dir} keeps its records but no checkpoint to {purpose} "
            f"({RunFolder(run_dir).checkpoint.name} is gone); delete {run_dir} and run the "
            "same command again to train it again")


def reload_to(run_dir: Path, purpose: str) -> TrainedRun:
    """:func:`reload_run`, refusing a run without its checkpoint in reproduce's words (the
    loader's own advice, ``kdml train --resume``, has nothing left to train)."""
    if not RunFolder(run_dir).checkpoint.is_file():
        raise UnreadableCheckpoint(no_checkpoint(run_dir, purpose))
    return reload_run(run_dir)


def read_stored(path: Path, *keys: str) -> Any:
    """``path``'s JSON value at ``keys``: a file kdml wrote into a run folder, which a hand edit
    or a full disk may have broken (a one-line error then says how to recompute it)."""
    try:
        value = json.loads(path.read_text())
        for key in keys:
            value = value[key]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        raise not_as_written(path, f"no {'/'.join(keys)}") from None
    return value


def not_as_written(path: Path, detail: str) -> KdmlError:
    """The error for a file kdml wrote into a run folder that no longer reads as written."""
    return KdmlError(f"{path} is not as kdml wrote it ({detail}); delete it and run the same "
                     "command again to recompute it")


def logged_seconds(log: Path, through_stop: bool = False) -> float:
    r"""The training time ``train.log`` records: for each session, from its ``start epoch``
    line to its last line (an epoch cut short by a kill, an error or Ctrl-C is not counted,
    nor is the ``stopped:`` line the last two leave). 0 without a log. ``through_stop``: the
    last session counts to its ``stopped:`` line (a run that diverged: its last epoch is not
    trained again).

    A session that starts at epoch 1 trains the run from scratch (its checkpoint was lost, as
    in a run record kept without checkpoints), so the sessions before it are not counted;
    unless it only scores epoch 1, trained by the session before (``SCORED_FIRST``).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     log = Path(folder) / "train.log"
    ...     _ = log.write_text("2026-01-01 10:00:00,000 start epoch 1 of 3\n"
    ...                        "2026-01-01 10:01:30,500 epoch 1: train/loss=1\n"
    ...                        "2026-01-01 11:00:00,000 start epoch 2 of 3\n"
    ...                        "2026-01-01 11:00:10,000 epoch 2: train/loss=1\n"
    ...                        "2026-01-02 09:00:00,000 all 2 epochs are trained; nothing left "
    ...                        "to train\n"
    ...                        "2026-01-02 09:00:05,000 final test/recall@1=0.5\n")
    ...     logged_seconds(log)
    100.5
    """
    if not log.is_file():
        return 0.0
    total = 0.0
    started: datetime | None = None
    last: datetime | None = None
    stopped: datetime | None = None  # the stop line that ends the log, if one does
    for line in log.read_text(errors="replace").splitlines():
        try:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:  # a line of a multi-line message
            continue
        message = line[24:]
        stopped = stamp if message.startswith(STOPPED) else None
        if stopped is not None:  # written at the stop: the cut-short epoch is redone
            continue
        # a session starts training, or (a finished run resumed) has nothing to train
        if message.startswith("start epoch") or message.endswith(NOTHING_LEFT):
            if started is not None and last is not None:
                total += max((last - started).total_seconds(), 0.0)  # local time: DST
            if message.startswith("start epoch 1 of") and SCORED_FIRST not in message:
                total = 0.0
            started = stamp if message.startswith("start epoch") else None
        last = stamp
    if through_stop and stopped is not None:
        last = stopped
    if started is not None and last is not None:
        total += max((last - started).total_seconds(), 0.0)
    return total


def collect(experiment: Experiment, planned: dict[tuple[str, str], list[PlannedRun]],
            trained: Mapping[Path, Trained]) -> ExperimentResult:
    """Read every cell's metrics from its finished runs (``trained``: what
    :func:`train_planned` did for each), adding the experiment's protocol. A run that diverged
    (its loss became NaN or infinite) counts NaN for every metric."""
    cells: dict[str, CellResult] = {}
    for cell in experiment.cells:
        result = CellResult()
        for seed, run in enumerate(planned[experiment.key, cell.label]):
            done = trained.get(run.run_dir)
            if done is not None and done.diverged:
                result.diverged[seed] = done.diverged
                metrics: dict[str, Any] = dict.fromkeys(experiment.metrics, float("nan"))
            else:
                metrics = _run_metrics(experiment, run.run_dir, result)
                share = metrics.get(COLLAPSED)
                if isinstance(share, (int, float)):
                    result.collapsed[seed] = float(share)
            for name in experiment.metrics:
                if name not in metrics:
                    raise KdmlError(f"{run.run_dir} has no {name!r}; the recipe "
                                    f"{cell.recipe} does not report it")
                _check_score(run.run_dir, name, metrics[name], seed in result.diverged)
                result.values.setdefault(name, []).append(float(metrics[name]))
            result.wall_s.append(done.wall_s if done is not None else float("nan"))
            result.machines.append(done.machine if done is not None else "")
            result.run_dirs.append(run.run_dir)
            if cell.plot_charts and result.charts is None and seed not in result.diverged:
                # the numbers are in the records; only the plot needs the model, so a
                # checkpoint gone or damaged costs the plot alone, and not even that where the
                # plot was kept (changed data still stops the table: its records may not be of
                # the data the report names)
                charts = _chart_plot(run.run_dir, result)
                if charts is not None:
                    result.charts, result.charts_seed = charts, seed
        cells[cell.label] = result
    configs = tuple(planned[experiment.key, cell.label][0].config for cell in experiment.cells)
    return ExperimentResult(experiment, cells, configs)


def _check_score(run_dir: Path, name: str, value: object, diverged: bool) -> None:
    """Refuse a score that is not a number (a bool, which Python counts as an int, had read as
    1 or 0), or that is NaN or infinite in a run that did not diverge: the row had left its seed
    out without a word, and its claims had said the run diverged."""
    if not is_score(value):
        raise KdmlError(f"{run_dir / 'metrics.json'}: {name} is {value!r}, not a number; "
                        "delete the run folder to train it again")
    if not diverged and not math.isfinite(value):
        raise KdmlError(f"{run_dir}: {name} is {value!r}, but the run did not diverge (its "
                        "reproduce.json says none): its records were edited or damaged; delete "
                        "the run folder to train it again")


def _chart_plot(run_dir: Path, result: CellResult) -> Path | None:
    """The chart plot of the run in ``run_dir``: drawn from its checkpoint and kept with its
    records (:data:`CHARTS_RECORD`), or, where the checkpoint is gone or will not load, the one
    kept when it was drawn. ``None`` when there is neither (``result.charts_missing`` then
    says why)."""
    record = run_dir / CHARTS_RECORD
    try:
        drawn = draw_charts(reload_to(run_dir, "draw its charts"))
    except UnreadableCheckpoint as error:
        if record.is_file() and drawn_by_kdml(record):
            return record
        result.charts_missing = result.charts_missing or str(error)
        return None
    return copy_png(drawn, record)


def _run_metrics(experiment: Experiment, run_dir: Path, result: CellResult) -> dict[str, Any]:
    """A finished run's final metrics with the experiment's protocol added (the parts'
    half-widths go into ``result``)."""
    metrics = dict(RunFolder(run_dir).final_metrics() or {})
    # Table 3 gives its Recall@1 with a 95% interval, which the paper has only from Table 2's
    # 10 parts (Sec. 5.3; its 0.506 is on the protocol of Table 2's 50.7, not Table 1's 67.9)
    if experiment.protocol in ("parts", "generalization"):
        for name, estimate in _parts(experiment, run_dir).items():
            metrics[name] = estimate["mean"]
            result.part_ci95.setdefault(name, []).append(estimate["ci95"])
    if experiment.protocol == "generalization":
        metrics.update(_generalization(run_dir))
    return metrics


def _parts(experiment: Experiment, run_dir: Path) -> dict[str, dict[str, float]]:
    """Retrieval within 10 disjoint test parts (Chu et al. 2020, Table 2), kept in the run
    folder's ``parts.json``."""
    path = run_dir / PARTS_FILE
    ks = [int(name.split("@")[1]) for name in experiment.metrics if name.startswith("recall@")]
    if path.is_file():
        if read_stored(path, "num_parts") != NUM_PARTS:
            raise not_as_written(path, f"not {NUM_PARTS} parts")
        stored = read_stored(path, "metrics")
        if not isinstance(stored, dict) or not all(
                isinstance(estimate, dict) and is_score(estimate.get("mean"))
                and is_score(estimate.get("ci95"))
                for estimate in stored.values()):
            raise not_as_written(path, "a metric without a numeric mean and ci95")
        # every Recall@K the table reads: a missing one had been taken from the whole test
        # set, a cell mixing the two protocols
        missing = [f"recall@{k}" for k in ks if f"recall@{k}" not in stored]
        if missing:
            raise not_as_written(path, f"no {missing[0]}")
        return stored
    trained = reload_to(run_dir, f"compute its {PARTS_FILE} from")
    embedded = embed_dataset(trained.method, trained.splits.test, trained.embedder)
    # at Table 2's K as well, whatever this experiment reads: Table 3 reads Recall@1 of runs a
    # Table 2 cell may share later, which would refuse a file without its K (above)
    estimates = retrieval_over_parts(embedded.tensor(), embedded.labels,
                                     sorted({*ks, *PARTS_KS}), NUM_PARTS,
                                     as_metric(trained.config.eval.metric))
    metrics = {name: {"mean": e.mean, "ci95": e.ci95} for name, e in estimates.items()}
    write_json({"num_parts": NUM_PARTS, "metrics": metrics}, path, ("num_parts", "metrics"))
    return metrics


def _generalization(run_dir: Path) -> dict[str, float]:
    """lambda, d_H and their sum with ``kdml analyze generalization``'s defaults, kept in the
    run folder's ``generalization.json`` (one written before it recorded its ``distance``, when
    cosine runs were analysed by Euclidean distance, is computed again, as is one of an epoch
    before the run's last: ``kdml analyze`` of a run stopped half-way, which the table would
    have set beside the finished run's Recall@1)."""
    path = run_dir / "generalization.json"
    settings = GeneralizationSettings()
    stored = read_stored(path) if path.is_file() else {}
    used = stored.get("settings") if isinstance(stored, dict) else None
    wanted: dict[str, object] = {**vars(settings)}
    history = RunFolder(run_dir).history()
    if history:
        wanted["epoch"] = history[-1].get("epoch")  # the checkpoint's, which analyze reads
    if (not isinstance(used, dict) or {key: used.get(key) for key in wanted} != wanted
            or "distance" not in stored):
        analyze_generalization(reload_to(run_dir, f"compute its {path.name} from"), settings)
    lam = read_stored(path, "lambda", "mean")
    h_divergence = read_stored(path, "h_divergence", "mean")
    for name, value in (("lambda", lam), ("h_divergence", h_divergence)):
        if not is_score(value):
            raise not_as_written(path, f"{name}/mean is not a number")
    return {"lambda": lam, "h_divergence": h_divergence, "bound": lam + h_divergence}


def reproduce(experiments: list[Experiment], seeds: int, runs_root: Path, device: str,
              progress: bool | None = None,
              echo: Callable[[str], None] = print) -> list[ExperimentResult]:
    """Train what is missing and collect every experiment's numbers. An experiment that
    cannot run here (a dataset or extra missing) is reported with its reason; the others go on.
    A run another process is training (another ``kdml reproduce`` on the same ``runs_root``,
    which holds its :func:`claim_file`) is read after the others, once that process lets go.
    """
    planned: dict[tuple[str, str], list[PlannedRun]] = {}
    failed: dict[str, str] = {}
    for experiment in experiments:
        try:
            planned.update(plan([experiment], seeds, runs_root, device))
        except KdmlError as error:
            failed[experiment.key] = str(error)
    runs = unique_runs(planned)
    trained_runs: dict[Path, Trained] = {}  # a divergence is a result, reported in its cell
    broken: dict[Path, str] = {}

    def train_held(run: PlannedRun, wait: bool) -> None:
        """Train (or reuse) ``run`` while holding its claim; :class:`FolderBusy` without
        ``wait`` when another process holds the claim or trains the run."""
        try:
            with hold_folder(claim_file(run.run_dir), _CLAIMED, wait=wait):
                trained = train_planned(run, progress)
        except KdmlError as failure:
            if isinstance(failure, FolderBusy) and not wait:  # come back to it later
                raise
            broken[run.run_dir] = str(failure)
            echo(f"  failed: {failure}")
            return
        trained_runs[run.run_dir] = trained
        if trained.reused:
            echo(f"  reused: {'diverged' if trained.diverged else 'finished'} earlier, after "
                 f"{trained.wall_s / 60:.1f} minutes of training")
        elif not trained.diverged:  # a log without progress bars (nohup, CI) says it ended
            echo(f"  finished after {trained.wall_s / 60:.1f} minutes of training")
        if trained.diverged:
            echo(f"  diverged: {trained.diverged}")

    # Several kdml reproduce may share a runs folder (one per GPU, say): each trains the runs
    # no other holds, then waits for the others' and reads them.
    later = []
    for number, run in enumerate(runs, start=1):
        echo(f"[{number}/{len(runs)}] {run.config.recipe} on {run.config.data.dataset}, seed "
             f"{run.config.train.seed}: {run.run_dir}")
        try:
            train_held(run, wait=False)
        except FolderBusy:
            echo("  another process is training it: it is read when that one has finished")
            later.append(run)
    for run in later:
        echo(f"back to {run.run_dir}, which another process was training")
        try:  # mostly finished long ago: the wait is said only where there is one
            train_held(run, wait=False)
        except FolderBusy as busy:
            if str(busy) == _CLAIMED:  # not kdml train's lock, which is not waited for
                echo("  it still is: waiting for it to finish")
            train_held(run, wait=True)
    results = []
    for experiment in experiments:
        why_not = failed.get(experiment.key) or next(
            (broken[run.run_dir] for cell in experiment.cells
             for run in planned[experiment.key, cell.label] if run.run_dir in broken), "")
        if not why_not:
            try:
                results.append(collect(experiment, planned, trained_runs))
                continue
            except KdmlError as problem:
                why_not = str(problem)
        results.append(ExperimentResult(experiment, {}, (), why_not))
    return results
