"""``kdml train`` (one run, a config grid, torchrun), ``kdml config``, ``kdml datasets`` and
``kdml recipes``."""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kdml.cli.output import _print_results, _progress, _say, _stop_code
from kdml.errors import KdmlError, LocalError, QuietExit, counted, raised_over

if TYPE_CHECKING:  # the commands import their modules lazily, to keep start-up fast
    from kdml.config import RunConfig
    from kdml.data.registry import DiskFormat
    from kdml.training.grid import Cell
    from kdml.training.recipes import Recipe


def _train(args: argparse.Namespace) -> int:
    if args.resume is not None:
        return _resume(args)
    recipe_name, file_values, overrides = _named_recipe(args)
    # imported once the command's own words are checked: with them torch (seconds)
    from kdml import distributed
    from kdml.config import resolve_config, with_absolute_paths
    from kdml.training.recipes import get_recipe
    from kdml.training.run_folder import (
        RUNS_FOLDER,
        check_new_run_folder,
        check_outside_image_folders,
        default_run_dir,
        remove_if_unused,
    )
    from kdml.training.trainer import train

    recipe = get_recipe(recipe_name)
    overrides = _with_flags(args, overrides, file_values)
    if "grid" in file_values:
        return _train_grid(recipe, file_values, overrides, args)
    config = with_absolute_paths(resolve_config(recipe.name, recipe.params, recipe.defaults,
                                                file_values, overrides))
    _check_dataset_name(config.data.dataset)
    _join_processes(config)

    runs_made = not RUNS_FOLDER.exists()  # by default_run_dir, if it is used

    def new_run_folder() -> Path:  # rank 0 names and checks it (its time stamp for all)
        check_outside_image_folders(args.out or RUNS_FOLDER, config.data.dataset)
        run_dir = args.out or default_run_dir(recipe.name, config.data.dataset)
        check_new_run_folder(run_dir)
        return run_dir

    run_dir = distributed.from_main(new_run_folder)
    # said by train() once the config, the data and the folder pass its checks (rank 0 only):
    # said here, it had preceded their refusals, naming a folder that was never made
    start_line = f"training {recipe.name} on {config.data.dataset} into {run_dir}"
    try:
        return _run_training(lambda: train(config, run_dir, progress=_progress(args),
                                           start_line=start_line), config, run_dir)
    finally:  # default_run_dir made the folder: a run refused before writing leaves none
        if args.out is None and distributed.world().is_main:
            remove_if_unused(run_dir)
            if runs_made and not run_dir.exists():  # nor the runs/ folder made for it
                with contextlib.suppress(OSError):
                    run_dir.parent.rmdir()


def _resume(args: argparse.Namespace) -> int:
    """``kdml train --resume RUN_DIR``."""
    from kdml.training.loading import run_config
    from kdml.training.run_folder import RunFolder
    from kdml.training.trainer import train

    if (args.recipe or args.overrides or args.dataset or args.config or args.weights
            or args.seed is not None or args.data_root or args.out or args.device):
        raise KdmlError("--resume takes only the run folder: the run keeps its own config "
                        "(edit its config.yaml for what a resumed run can change, such as "
                        "train.epochs, or data.root where its data moved)")
    run = RunFolder.existing(args.resume)
    config = run_config(run)
    _join_processes(config)
    return _run_training(lambda: train(config, run.root, resume=True,
                                       progress=_progress(args)), config, run.root)


def _named_recipe(args: argparse.Namespace) -> tuple[str, dict, list[str]]:
    """The recipe ``kdml train`` or ``kdml config`` names, the --config file's values and the
    key=value overrides, read and checked before the recipes (and torch, seconds) are
    imported: a missing or malformed file, a mistyped recipe and a mistyped --dataset are
    said at once."""
    from kdml.config import load_config_file
    from kdml.dataset_names import check_dataset_name
    from kdml.training.recipe_names import check_recipe_name

    file_values = load_config_file(args.config) if args.config else {}
    recipe_name, overrides = _recipe_and_overrides(args, file_values.get("recipe"))
    check_recipe_name(recipe_name)
    if args.dataset and args.dataset.strip() and "\0" not in args.dataset:  # else validate's
        check_dataset_name(args.dataset)  # words: "the dataset name is empty", a NUL byte
    return recipe_name, file_values, overrides


def _with_flags(args: argparse.Namespace, overrides: list[str],
                file_values: dict) -> list[str]:
    """``overrides``, then the settings kdml train's and kdml config's flags give (--dataset,
    --data-root, --weights, --seed, --device), each refused beside an override of its key or a
    grid over it (:func:`_check_flags_agree_with_overrides`)."""
    grid = file_values.get("grid")
    _check_flags_agree_with_overrides(
        args, overrides, [str(key) for key in grid] if isinstance(grid, dict) else [])
    # One pair of quotes around the flag's text: a text setting's override takes its value as
    # written less one enclosing pair (config.override_value), so the value comes through
    # whole, a `#`, quotes, backslashes and non-ASCII letters too (json.dumps had written
    # folder:phötos as folder:ph\u00f6tos and C:\data as C:\\data, read back as written).
    flagged = list(overrides)
    if args.dataset is not None:
        flagged.append(f"data.dataset={_quoted(str(args.dataset))}")
    if args.data_root:
        flagged.append(f"data.root={_quoted(str(args.data_root))}")
    if args.weights:
        flagged.append(f"model.weights={_quoted(str(args.weights))}")
    if args.seed is not None:
        flagged.append(f"train.seed={args.seed}")
    if args.device is not None:
        flagged.append(f"train.device={_quoted(args.device)}")
    return flagged


def _quoted(text: str) -> str:
    """``text`` as the value of a text setting's override: in one pair of quotes, which
    :func:`~kdml.config.override_value` takes off again, leaving ``text`` as it is."""
    return f'"{text}"'


def _join_processes(config: RunConfig) -> None:
    """Under torchrun: join the process group (NCCL when training on GPUs, else gloo)."""
    from kdml import distributed
    from kdml.launch import launched_by_torchrun
    from kdml.training.build import resolve_device

    if launched_by_torchrun():
        device = resolve_device(distributed.device_for(config.train.device))
        distributed.setup(use_cuda=device.type == "cuda")


def _train_grid(recipe: Recipe, file_values: dict, overrides: list[str],
                args: argparse.Namespace) -> int:
    """One run per cell of the config file's grid (see kdml.training.grid)."""
    from kdml import distributed
    from kdml.config import with_absolute_paths
    from kdml.training.grid import (
        best_cells,
        changed_setting,
        check_grid_folder,
        is_score,
        write_marker,
    )
    from kdml.training.loading import run_config
    from kdml.training.nonfinite import NonFiniteLoss
    from kdml.training.run_folder import (
        RUNS_FOLDER,
        FolderBusy,
        RunFolder,
        check_outside_image_folders,
        check_utf8_path,
        default_run_dir,
    )
    from kdml.training.selection import as_validation_history, best_scores
    from kdml.training.trainer import train

    cells, resolved = _grid_configs(recipe, file_values, overrides)
    configs = [with_absolute_paths(config) for config in resolved]
    datasets = list(dict.fromkeys(config.data.dataset for config in configs))
    for dataset in datasets:  # every cell's, before any cell trains
        _check_dataset_name(dataset)
    _join_processes(configs[0])

    def grid_folder() -> Path:  # rank 0 names, checks and marks it
        for dataset in datasets:  # a later cell's image folder too: its plots had become a class
            check_outside_image_folders(args.out or RUNS_FOLDER, dataset)
        root = args.out or default_run_dir(recipe.name, configs[0].data.dataset)
        check_utf8_path(root, what="grid folder")  # its cells' TensorBoard writes need it
        if not check_grid_folder(root, cells):
            write_marker(root, cells, file_values["grid"])
        return root

    root = distributed.from_main(grid_folder)

    def cell_state(run: RunFolder) -> tuple[dict[str, float] | None, bool]:
        return run.final_metrics(), run.config.is_file()

    def check_cells_settings() -> None:  # rank 0: before any cell trains
        for cell, config in zip(cells, configs, strict=True):
            run = RunFolder(root / cell.name)
            if run.config.is_file():
                changed = changed_setting(run_config(run).to_dict(), config.to_dict())
                if changed:
                    raise KdmlError(f"grid cell {cell.name} in {root} was trained with other "
                                    f"settings ({changed}); give the command it was trained "
                                    "with, or train this grid into another --out")

    distributed.from_main(check_cells_settings)

    _say(f"grid of {counted(len(cells), 'run')} of {recipe.name} on {configs[0].data.dataset} "
         f"into {root}")
    finals: list[dict[str, float]] = []
    diverged: list[str] = []
    # the command that goes on in this folder: without --out, the same command makes another
    # (default_run_dir's time stamp) and trains the grid there from its first cell
    again = "the same command" if args.out else f"the same command with --out {root}"
    for number, (cell, config) in enumerate(zip(cells, configs, strict=True), start=1):
        run = RunFolder(root / cell.name)
        done, started = distributed.from_main(functools.partial(cell_state, run))
        if done is not None:
            _say(f"[{number}/{len(cells)}] {cell.name}: finished earlier")
            finals.append(done)
            continue
        _say(f"[{number}/{len(cells)}] {cell.name}")
        try:
            finals.append(train(config, run.root, resume=started, progress=_progress(args),
                                selects=True))  # validation chooses the best cell by it
        except NonFiniteLoss as error:  # the grid's own value (a learning rate too high): a
            # search result, not a cause to mend, so the other cells go on; it had stopped them
            _say(f"[{number}/{len(cells)}] {cell.name}: diverged, so it has no scores and is "
                 f"never best ({error})")
            diverged.append(cell.name)
            finals.append({})
        except FolderBusy:  # another command trains this grid (or this cell) now: nothing of
            # this one's failed, and it had said "what it trained is kept" of another's work
            raise KdmlError(f"grid cell {cell.name} in {root} is being trained by another "
                            "process (this grid run twice at once?); let it finish or stop it, "
                            f"then {again} continues the grid") from None
        except KdmlError as error:
            # of the kind it was: a LocalError (an unreadable image in this rank's share) is
            # said by the rank that met it, where rank 0 sees only a failed collective; made
            # a plain KdmlError, no process of a torchrun grid said it
            kind = type(error) if isinstance(error, LocalError | QuietExit) else KdmlError
            if not finals and not run.config.is_file():  # refused before anything trained
                goes_on = (f"the same command, corrected, goes on in {root}" if args.out else
                           f"the same command, corrected and given --out {root}, goes on there")
                raise kind(f"grid cell {cell.name} failed: {error} -- nothing was "
                           f"trained; {goes_on}") from None
            kept = ("what it trained is kept" if number == 1 else "the cell before it is kept"
                    if number == 2 else f"the {number - 1} cells before it are kept")
            raise kind(f"grid cell {cell.name} failed: {error} -- {kept} in {root}: "
                       f"{again} continues there "
                       "once the cause is fixed outside the grid (a changed grid or "
                       "setting needs another --out)") from None
        except KeyboardInterrupt as stop:
            code, stopped = _stop_code(stop)
            if distributed.world().is_main:
                print(f"kdml: {stopped} in cell {cell.name}; continue with the same command "
                      f"and --out {root}", file=sys.stderr)
            return code
    validation = configs[0].data.validation
    metric = configs[0].train.select_metric
    scored = (f"Validation metrics per cell (data.validation={validation}; the test part was "
              "not used)" if validation else "Test metrics per cell")
    if all(config.train.keep_best for config in configs):  # each cell's kept model is its
        # best epoch: compare those (keep_best needs data.validation: the history is validation)
        finals = [final if cell.name in diverged else  # its epochs before: no result
                  best_scores(as_validation_history(RunFolder(root / cell.name).history()),
                              metric) or final for cell, final in zip(cells, finals, strict=True)]
        scored += f", at each cell's best epoch by {metric} (train.keep_best)"
    # every cell's metrics, in order of first appearance: a grid over eval.nmi or eval.ks
    # scores its cells on different metrics (the first cell's alone had hidden the others')
    names = list(dict.fromkeys(name for final in finals for name in final))
    _say(f"\n{scored} ({recipe.name}, {configs[0].data.dataset}):")
    # columns as wide as their longest entry: a cell of three keys' values, or a name such
    # as source_nn_accuracy, had pushed its row or header out of line
    cell_width = max(24, *(len(cell.name) for cell in cells))
    widths = [max(12, len(name)) for name in names]
    _say("  " + "  ".join([f"{'cell':<{cell_width}}",
                           *(f"{name:>{width}}" for name, width in zip(names, widths,
                                                                       strict=True))]))
    # "-": not scored (or not collapsed), or no number (a metrics.json rewritten by another
    # tool, whose null or text had stopped the table with a traceback)
    for cell, final in zip(cells, finals, strict=True):
        _say("  " + "  ".join([f"{cell.name:<{cell_width}}",
                              *(f"{final[name]:>{width}.4f}" if is_score(final.get(name))
                                else f"{'-':>{width}}"
                                for name, width in zip(names, widths, strict=True))]))
    if validation and metric not in names:  # e.g. cells finished before a check of the name
        _say(f"best on validation by {metric}: none, no cell scores train.select_metric="
             f"{metric!r} (they score {', '.join(names)})")
    elif validation:  # the choice validation exists for; not made on test
        tied = best_cells([final.get(metric) for final in finals])
        if not tied:
            _say(f"best on validation by {metric}: none, no cell has a finite score")
        else:
            best = tied[0]
            test_it = (f"kdml eval {root / cells[best].name} --best --test tests its kept "
                       "epoch" if configs[best].train.keep_best else
                       "train it without data.validation to test it")
            tie = (f" (tied at {finals[best][metric]:.4f} with "
                   f"{', '.join(cells[i].name for i in tied[1:])}: validation does not tell "
                   "them apart, and the first in grid order is named)" if len(tied) > 1 else "")
            _say(f"best on validation by {metric}: {cells[best].name}{tie}; {test_it}")
    if diverged:  # run again, the command trains them again: they diverge again
        _say(f"diverged, without scores: {', '.join(diverged)}")
    _say(f"grid folder: {root}")
    return 0


def _recipe_and_overrides(args: argparse.Namespace, in_file: object) -> tuple[str, list[str]]:
    """The recipe and the key=value overrides. With a --config file that names its recipe,
    the overrides may come first (``kdml train --config FILE train.epochs=2``): argparse
    reads the first of them as the recipe."""
    given, overrides = args.recipe, list(args.overrides)
    if given and "=" in given and args.config and in_file is not None:
        given, overrides = None, [given, *overrides]
    return _recipe_name(given, in_file, args.config, args.command), overrides


def _recipe_name(given: str | None, in_file: object, config_file: Path | None,
                 command: str) -> str:
    """The recipe named on the command line, else by the --config file; never two."""
    if given and "=" in given and config_file is not None:  # in_file is None: no recipe there
        raise KdmlError(f"{config_file} has no recipe: line, so the first argument must name "
                        f"the recipe: 'kdml {command} RECIPE --config {config_file} {given}'")
    if given and "=" in given:
        raise KdmlError(f"the first argument must be a recipe name, got {given!r}")
    if given and in_file is not None and str(in_file) != given:
        raise KdmlError(f"{config_file} is a config for recipe {in_file!r} but the command "
                        f"names {given!r}; drop one of them")
    if not given and in_file is None:
        example = "train jrd --dataset mnist5k" if command == "train" else f"{command} jrd"
        raise KdmlError(f"name a recipe, e.g. 'kdml {example}' (or a --config file with a "
                        "recipe: line)")
    return given or str(in_file)


# a flag of `kdml train` and the config key it sets
FLAG_KEYS = {"dataset": ("--dataset", "data.dataset"), "data_root": ("--data-root", "data.root"),
             "weights": ("--weights", "model.weights"), "seed": ("--seed", "train.seed"),
             "device": ("--device", "train.device")}


def _check_flags_agree_with_overrides(args: argparse.Namespace, overrides: list[str],
                                      grid_keys: list[str]) -> None:
    """Refuse a flag and an override of its key, or a grid over it, together (``--dataset
    digits data.dataset=cub``), and an override of a key the grid runs over: one of them
    would be ignored without a word."""
    for item in overrides:
        key = _override_key(item)
        for grid_key in grid_keys:  # either may be dotted or a bare leaf
            if key == grid_key or key.split(".")[-1] == grid_key.split(".")[-1] and (
                    "." not in key or "." not in grid_key):
                raise KdmlError(f"the override {item} sets {grid_key}, over which the "
                                "config's grid runs: the cells' values would win; drop it or "
                                "edit the grid")
    for attribute, (flag, key) in FLAG_KEYS.items():
        if getattr(args, attribute) is None:
            continue
        names = (key, key.split(".", 1)[1])
        for item in overrides:
            if _override_key(item) in names:
                raise KdmlError(f"{flag} and the override {item} both set {key}; give one")
        for grid_key in grid_keys:
            if grid_key in names:
                raise KdmlError(f"{flag} sets {key}, over which the config's grid runs; give "
                                f"one")


def _override_key(item: str) -> str:
    """The key an override ``item`` sets, "" where it is malformed: resolve_config refuses it
    then, saying why (``eval.ks=[1, 2]`` unquoted is two arguments, which the shell split:
    ``2]`` alone had been refused first, as "malformed override '2]'")."""
    key, sep, _ = item.partition("=")
    return key.strip() if sep else ""


def _check_dataset_name(dataset: str) -> None:
    from kdml.dataset_names import check_dataset_name

    check_dataset_name(dataset)


def _run_training(run: Callable[[], dict[str, float]], config: RunConfig,
                  run_dir: Path) -> int:
    from kdml import distributed

    try:
        final = run()
    except (KeyboardInterrupt, ImportError) as error:
        stop = raised_over(error, KeyboardInterrupt)  # an import a Ctrl-C failed
        if stop is None:
            raise
        code, stopped = _stop_code(stop)
        if not distributed.world().is_main:
            return code
        if (run_dir / "config.yaml").is_file():
            print(f"kdml: {stopped}; continue with: kdml train --resume {run_dir}",
                  file=sys.stderr)
        else:
            print(f"kdml: {stopped} before training started; nothing was written",
                  file=sys.stderr)
        return code
    if distributed.world().is_main:
        _print_results(config, final, run_dir)
    return 0


def _config(args: argparse.Namespace) -> int:
    recipe_name, file_values, overrides = _named_recipe(args)
    import yaml

    from kdml.config import resolve_config
    from kdml.training.checks import check_before_data
    from kdml.training.recipes import get_recipe

    recipe = get_recipe(recipe_name)
    overrides = _with_flags(args, overrides, file_values)
    if "grid" in file_values:  # the file's values alone may be no run's (keep_best without
        # the data.validation its grid gives): print the first cell's, saying so
        note, config = _first_grid_cell(args.config, recipe, file_values, overrides)
        print(note)
    else:
        config = resolve_config(recipe.name, recipe.params, recipe.defaults, file_values,
                                overrides)
        # what kdml train refuses whatever the data (dtml on no domain pair, a backbone that
        # does not exist), as a grid's cells are: it had been printed, exit 0, and refused
        # only once trained from; the device is not checked: a config may be for another
        # machine
        _check_dataset_name(config.data.dataset)
        check_before_data(config)
    print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
    return 0


def _first_grid_cell(file: Path, recipe: Recipe, file_values: dict,
                     overrides: list[str]) -> tuple[str, RunConfig]:
    """A YAML comment naming the --config file's grid, and its first cell's config, after
    refusing what kdml train would refuse of the grid (:func:`_grid_configs`; an override of
    one of its keys is refused before, by :func:`_with_flags`)."""
    grid = file_values["grid"]
    keys = [str(key) for key in grid] if isinstance(grid, dict) else []
    # the device unchecked, as a single config's: a config may be for another machine
    cells, configs = _grid_configs(recipe, file_values, overrides, on_this_machine=False)
    return (f"# {file} holds a grid of {counted(len(cells), 'run')} over {', '.join(keys)}, "
            f"one per cell;\n# printed: the first cell's config, {cells[0].name}"), configs[0]


def _grid_configs(recipe: Recipe, file_values: dict, overrides: list[str],
                  on_this_machine: bool = True) -> tuple[list[Cell], list[RunConfig]]:
    """The config file's grid cells and each one's config (the file's values, ``overrides``,
    then the cell's), refusing a malformed grid, two keys of one setting (``dim`` and
    ``method.dim``), two cells of one folder name, a bad value in any cell, two cells of
    one config, a setting the file gives a value and its grid too, and cells scored on
    different parts (data.validation); ``on_this_machine``: a device this machine lacks
    too."""
    from kdml.config import RunConfig, file_settings, flatten, resolve_config, resolve_key
    from kdml.training.grid import (
        check_distinct_cells,
        check_distinct_keys,
        check_grid_keys_unset,
        grid_cells,
    )

    if isinstance(file_values["grid"], dict) and "recipe" in file_values["grid"]:
        # "unknown config key 'recipe'; did you mean 'resize'?" had said nothing of why
        raise KdmlError("a grid cannot vary the recipe: its cells share one recipe's settings "
                        "and one table; run one grid per recipe")
    cells = grid_cells(file_values["grid"])
    blank = RunConfig(recipe=recipe.name, method=recipe.params())  # the keys a cell may set
    full_key = functools.partial(resolve_key, blank)
    check_distinct_keys([str(key) for key in file_values["grid"]], full_key)
    check_grid_keys_unset([str(key) for key in file_values["grid"]],
                          flatten(file_settings(file_values)), full_key)
    configs = [resolve_config(recipe.name, recipe.params, recipe.defaults, file_values,
                              overrides, cell.values) for cell in cells]
    check_distinct_cells(cells, [config.to_dict() for config in configs])
    metrics = list(dict.fromkeys(config.train.select_metric for config in configs))
    if len(metrics) > 1:  # each cell's row at its own kept epoch, compared by the first's
        raise KdmlError(f"the grid's cells have different train.select_metric "
                        f"({', '.join(metrics)}), but one table compares its cells by one "
                        "metric (and had shown each at the first's best epoch); give every cell "
                        "the same train.select_metric, one grid per metric")
    for cell, config in zip(cells, configs, strict=True):
        _check_cell_selects(cell.name, config)
        _check_cell_before_data(cell.name, config, on_this_machine)
    shares = sorted({config.data.validation for config in configs})
    if len(shares) > 1:
        raise KdmlError(f"the grid's cells have different data.validation ({shares[0]:g} to "
                        f"{shares[-1]:g}): each would be scored on another part (the test part, "
                        "or another validation part), which one table cannot compare; give "
                        "every cell the same data.validation")
    return cells, configs


def _check_cell_selects(name: str, config: RunConfig) -> None:
    """Refuse, before any cell trains, a cell that chooses epochs by a Recall@K or NMI it does
    not score (its eval.ks without K, eval.nmi off, also where eval.ks is the dataset's own):
    training refuses it at the cell's turn, after the cells before it trained into a folder
    that a corrected grid may not reuse. A Recall@K of a cell scored at the dataset's own Ks is
    checked at its turn, once the data is read."""
    from kdml.evaluation.evaluator import scored_metric_names
    from kdml.training.selection import check_selectable

    metric = config.train.select_metric
    chooses = config.train.keep_best or config.train.patience or config.data.validation
    if not chooses:
        return
    try:
        if metric == "nmi" and not config.eval.ks and not config.eval.nmi:
            # eval.nmi alone says whether NMI is scored, whatever the dataset's own Ks: such a
            # cell had been refused only at its turn, after the cells before it trained
            raise KdmlError("train.select_metric='nmi' is not scored by this run, whose "
                            "eval.nmi is false; set eval.nmi: true in every cell, or choose "
                            "a metric it scores (a Recall@K, map@r, r_precision)")
        if config.eval.ks and (metric.startswith("recall@") or metric == "nmi"):
            check_selectable(metric, scored_metric_names(config.eval.ks, config.eval.nmi))
    except KdmlError as error:
        raise KdmlError(f"grid cell {name}: {error}; nothing was trained") from None


def _check_cell_before_data(name: str, config: RunConfig, on_this_machine: bool = True) -> None:
    """Refuse, before any cell trains, a cell whose settings are wrong whatever the data (a
    backbone that does not exist, a data.pca_dim of a dataset that is no domain pair, a device
    this machine lacks, unless not ``on_this_machine``: kdml config's): training refuses it
    at the cell's turn, after the cells before it trained into a folder that the corrected
    grid may not reuse."""
    from kdml.training.build import resolve_device
    from kdml.training.checks import check_before_data

    try:
        check_before_data(config)
        if on_this_machine:
            resolve_device(config.train.device)
    except KdmlError as error:
        raise KdmlError(f"grid cell {name}: {error}; nothing was trained") from None


def _datasets(args: argparse.Namespace) -> int:
    from kdml.data.domains import DOMAIN_PAIRS
    from kdml.data.registry import DATASETS, FORMATS, PREFIXES, ROOT_VARIABLE

    rows = [(entry.name, entry.description) for entry in DATASETS.values()]
    rows += [(entry.name, entry.description) for entry in DOMAIN_PAIRS.values()]
    rows += [("npz:PATH", "pre-extracted features of two domains (X, y, domain)")]
    rows += [(f"{prefix}{'DIR' if prefix == 'folder:' else 'FILE'}", text)
             for prefix, text in PREFIXES.items()]
    on_disk = []
    for entry in FORMATS.values():
        # the folder training reads (find_root's choice), also where it holds an incomplete
        # copy: a complete one elsewhere, which training passes over, would be no help
        on_disk.append((entry.name, entry.description, *_where_found(entry)))
    width = max(len(name) for name, *_ in rows + on_disk)
    print("Offline and your own data:")
    for name, description in rows:
        print(f"  {name:<{width}}  {description}")
    print(f"On-disk datasets (--data-root DIR, or ${ROOT_VARIABLE}/<name> or the archive's "
          "folder):")
    whys = [why for *_, why in on_disk if why]
    shared = [why for why in dict.fromkeys(whys) if whys.count(why) > 1]  # a variable that
    # does not exist: said once, below, not on every line
    for name, description, where, why in on_disk:
        said = f" ({why})" if why and why not in shared else ""
        print(f"  {name:<{width}}  {description}; {where}{said}")
    for why in shared:
        print(f"Not found because {why}")
    return 0


def _where_found(entry: DiskFormat) -> tuple[str, str]:
    """Where ``kdml datasets`` says an on-disk dataset is: the folder training reads (find_root's
    choice), also where it holds an incomplete copy (a complete one elsewhere, which training
    passes over, would be no help); "not found", with what is wrong with ``$KDML_DATA_ROOT``
    where that is why (second, "" otherwise); or a folder that cannot be read (no permission),
    which had stopped the whole listing with the first dataset whose folders it searched."""
    from kdml.data.registry import (
        archive_not_extracted,
        elsewhere,
        find_root,
        root_variable_problem,
    )

    try:
        root = find_root(entry)
        missing = entry.missing(root)  # its needs include its markers
        instead = elsewhere(entry, root)  # where they are, as training's refusal says
    except KdmlError:
        return "not found", root_variable_problem(entry) or archive_not_extracted(entry)
    except OSError as error:
        named = f"{error.filename}: " if error.filename else ""
        hint = "; check its permissions" if isinstance(error, PermissionError) else ""
        return f"cannot be read ({named}{error.strerror or error}){hint}", ""
    if not missing:
        return f"found in {root}", ""
    return (f"not complete in {root}, which training reads (missing {', '.join(missing)})"
            + (f"; {instead}" if instead else "")), ""


def _recipes(args: argparse.Namespace) -> int:
    from kdml.training.recipes import RECIPES

    width = max(map(len, RECIPES))
    for recipe in RECIPES.values():
        print(f"{recipe.name:<{width}}  {recipe.summary}")
    return 0
