"""The ``kdml`` command line: train, eval and datasets.

Every user error becomes one line on stderr and exit status 2; no traceback.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import errno
import functools
import io
import json
import os
import signal
import sys
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from kdml.errors import KdmlError, LocalError, QuietExit, Terminated, raised_over

if TYPE_CHECKING:  # the commands import their modules lazily, to keep start-up fast
    import torch

    from kdml.config import RunConfig
    from kdml.data.splits import DataSplits
    from kdml.evaluation.evaluator import Embedder
    from kdml.inspection import Part
    from kdml.reproduce.experiments import Experiment
    from kdml.reproduce.runner import ExperimentResult
    from kdml.training.grid import Cell
    from kdml.training.loading import RunModel, TrainedRun
    from kdml.training.recipes import Recipe


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of usage + message
        self.exit(2, f"kdml: error: {message} (see '{self.prog} --help')\n")


def _integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``minimum`` (to ``maximum``), else a one-line error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return parse


def _fraction(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {value}")
    return value


def _folder(text: str) -> Path:
    """An argparse type: a path, never empty (an empty one would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty one")
    return Path(text).expanduser()


MAX_SEED = 2**63 - 1  # seeds feed NumPy's SeedSequence and torch generators
DEFAULT_REPORT = Path("docs/reproduction.md")  # kdml reproduce --out


def build_parser() -> argparse.ArgumentParser:
    from kdml import __version__

    parser = _Parser(prog="kdml", description="Kernel-regularized deep metric learning.")
    parser.add_argument("--version", action="version", version=f"kdml {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = commands.add_parser("train", help="train a recipe into a run folder",
                                description="Train RECIPE on a dataset. Extra key=value "
                                "arguments override the config, e.g. train.epochs=5 or epochs=5.")
    train.add_argument("recipe", nargs="?", help="recipe name (see 'kdml recipes')")
    train.add_argument("overrides", nargs="*", metavar="key=value", default=[])
    train.add_argument("--dataset", help="dataset name, folder:DIR, csv:FILE, a domain pair "
                       "(SOURCE->TARGET, npz:PATH); see 'kdml datasets'")
    train.add_argument("--data-root", metavar="DIR", type=_folder,
                       help="folder of an on-disk dataset (data.root)")
    train.add_argument("--config", type=Path, help="YAML file with config values")
    train.add_argument("--weights", metavar="FILE", type=_folder,
                       help="pretrained backbone weights, a local .pth or .safetensors file "
                       "(model.weights)")
    train.add_argument("--seed", type=_integer(0, MAX_SEED), help="random seed (train.seed)")
    train.add_argument("--out", type=_folder,
                       help="run folder: new, empty, or one whose run stopped before its first "
                       "checkpoint (default: runs/RECIPE-DATASET-TIME)")
    train.add_argument("--resume", type=_folder, metavar="RUN_DIR",
                       help="continue an interrupted run from its last checkpoint")
    train.add_argument("--no-progress", action="store_true", help="hide progress bars")

    evaluate = commands.add_parser("eval", help="evaluate a run's last (or --best) checkpoint")
    evaluate.add_argument("run_dir", type=Path)
    _add_best(evaluate)
    evaluate.add_argument("--test", action="store_true",
                          help="for a run that validated (data.validation): score the test "
                               "part, which its training and choices never saw (a run that "
                               "did not validate scores it anyway)")
    evaluate.add_argument("--dataset",
                          help="score the run's model on another dataset's test part, as the "
                               "run's data.split makes it (without the run's own data where "
                               "its data.json records what the model takes; --data-root is "
                               "then that dataset's folder); prints the scores and writes no "
                               "eval.json")
    evaluate.add_argument("--ks", type=_integer(1), nargs="+", metavar="K",
                          help="the Recall@K values to score (default: the run's eval.ks)")
    _add_data_root(evaluate)

    analyze = commands.add_parser("analyze", help="analyses of a trained run")
    analyses = analyze.add_subparsers(dest="analysis", required=True, parser_class=_Parser)
    general = analyses.add_parser(
        "generalization", help="H-divergence and lambda between seen and unseen classes",
        description="Estimate the H-divergence and lambda of Chu et al. 2020 (Sec. 2) with "
        "nearest-neighbour classifiers on a trained run's embeddings.")
    general.add_argument("run_dir", type=Path)
    _add_data_root(general)
    general.add_argument("--repeats", type=_integer(2), default=10,
                         help="random splits (default 10; at least 2, for the 95%% interval)")
    general.add_argument("--labelled-fraction", type=_fraction, default=0.5,
                         help="share of each set the classifiers are fitted on (default 0.5)")
    general.add_argument("--neighbors", type=_integer(1), default=1,
                         help="k of the k-NN (default 1)")
    general.add_argument("--seed", type=_integer(0, 2**32 - 1), default=0)

    plot = commands.add_parser("plot", help="plots of a trained run")
    plots = plot.add_subparsers(dest="plot", required=True, parser_class=_Parser)
    charts = plots.add_parser(
        "charts", help="d = 2 charts of an Atlas run: one panel per chart, test points by class",
        description="Plot the test points of an Atlas run (d = 2) at their chart coordinates, "
        "one panel per chart, coloured by class, with image thumbnails (Korman, Sec. A.2).")
    charts.add_argument("run_dir", type=Path)
    _add_best(charts)
    _add_test_part(charts)
    _add_data_root(charts)
    charts.add_argument("--thumbnails", type=_integer(0), default=100,
                        help="images drawn as thumbnails (0 = points only; default 100)")

    embed = commands.add_parser(
        "embed", help="write a run's embeddings of a split to an .npz",
        description="Embed a split (or another dataset) with a trained run's model; writes "
        "embeddings, labels, positions, sources and, for Atlas runs, chart codes.")
    embed.add_argument("run_dir", type=Path)
    _add_split_options(embed)
    _add_best(embed)
    _add_test_part(embed)
    embed.add_argument("--out", type=_folder, required=True, help="the .npz to write")

    index = commands.add_parser(
        "index", help="build a faiss index of a run's embeddings",
        description="Build a search index of a split's embeddings: exact by default, IVF or "
        "HNSW for large galleries; Atlas runs get one index per chart.")
    index.add_argument("run_dir", type=Path)
    _add_split_options(index, "searched", "the part to index (default: the gallery where the "
                       "data has one, as In-Shop, else test)")
    _add_best(index)
    _add_test_part(index)
    index.add_argument("--out", type=_folder, required=True, help="a new index folder")
    index.add_argument("--kind", choices=("exact", "ivf", "hnsw"), default="exact",
                       help="exact (default): brute-force float32 search; ivf or "
                       "hnsw: approximate, for large galleries")

    search = commands.add_parser(
        "search", help="the nearest indexed items of a query image or .npz",
        description="Print a query's nearest items in the index. The query is an .npz of "
        "precomputed 'embeddings' (Atlas runs: 'chart_coords' and 'chart_index'), as 'kdml "
        "embed' writes them, which needs only the run's config and checkpoint, not its data; "
        "or an image file, or an .npz of raw 'inputs', which the run's model embeds, rebuilt "
        "from the run folder alone (config.yaml, the checkpoint and data.json; a run whose "
        "data.json predates that record, from its data: --data-root if it moved). For runs "
        "on in-memory images (e.g. Fashion-MNIST) an image is fitted to the samples' size and "
        "channels.")
    search.add_argument("run_dir", type=Path)
    search.add_argument("--index", type=_folder, required=True, metavar="DIR")
    search.add_argument("--query", type=_folder, required=True, metavar="IMAGE_OR_NPZ")
    search.add_argument("-k", type=_integer(1), default=10, help="neighbours (default 10)")
    search.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_best(search)
    _add_data_root(search)

    retrieval = plots.add_parser(
        "retrieval", help="queries and their nearest images, hits and misses marked",
        description="Draw random test queries and their top-K images (the gallery's where the "
        "metrics search one, else the other test images) into plots/retrieval.png, each result "
        "framed green (same class) or red.")
    retrieval.add_argument("run_dir", type=Path)
    _add_best(retrieval)
    _add_test_part(retrieval)
    _add_data_root(retrieval)
    # A grid of thumbnails past 64 a side is too large to read (and to draw: 10,000 of them
    # made a 116,480-pixel-wide PNG).
    retrieval.add_argument("--queries", type=_integer(1, 64), default=8,
                           help="rows of the grid (default 8, at most 64)")
    retrieval.add_argument("-k", type=_integer(1, 64), default=8,
                           help="neighbours per query (default 8, at most 64)")
    retrieval.add_argument("--seed", type=_integer(0, 2**32 - 1), default=0)
    embedding = plots.add_parser(
        "embedding", help="a 2-D map of the test embeddings, by class (UMAP or t-SNE)",
        description="Map the test embeddings to 2-D with UMAP when umap-learn is installed, "
        "else t-SNE (scikit-learn), into plots/embedding.png.")
    embedding.add_argument("run_dir", type=Path)
    _add_best(embedding)
    _add_test_part(embedding)
    _add_data_root(embedding)
    embedding.add_argument("--max-points", type=_integer(3), default=5000,
                           help="plot a random sample of at most this many (default 5000)")

    reproduce = commands.add_parser(
        "reproduce", help="run the papers' experiments and write a report",
        description="Train each paper's tables and figures on the offline data (mean +- 95% "
        "CI over seeds, the paper's numbers beside them, a verdict per claim) and write a "
        "Markdown report with PNG plots. Finished runs are reused and interrupted ones "
        "resumed, so the same command continues a stopped reproduction. The same command "
        "started several times (one per GPU, with CUDA_VISIBLE_DEVICES) shares the runs: "
        "each trains those no other is training, then waits for the others'.")
    reproduce.add_argument("paper", choices=("jrd", "atlas", "dtml", "all"))
    reproduce.add_argument("--seeds", type=_integer(1), default=None,
                           help="seeds per cell, 0..N-1 (default 5; 3 with --quick)")
    reproduce.add_argument("--quick", action="store_true",
                           help="a few steps per run and a small grid: checks the pipeline in "
                           "minutes on a CPU; its numbers say nothing about the methods")
    reproduce.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    reproduce.add_argument("--out", type=Path, default=None,
                           help="the report (default docs/reproduction.md, or "
                           "reproduction.md in the runs folder with --quick); plots go beside "
                           "it, to OUT's name without .md plus -plots/")
    reproduce.add_argument("--runs", type=Path, default=None,
                           help="where the runs go (default runs/reproduce, or "
                           "runs/reproduce-quick)")
    reproduce.add_argument("--only", action="append", metavar="PATTERN", default=[],
                           help="run only the experiments whose key matches (shell pattern, "
                           "e.g. 'jrd-table2-*'; repeatable)")
    reproduce.add_argument("--list", action="store_true",
                           help="list the experiments and their cells, train nothing")
    reproduce.add_argument("--no-progress", action="store_true", help="hide progress bars")

    commands.add_parser("datasets", help="list the datasets")
    commands.add_parser("recipes", help="list the recipes")
    config = commands.add_parser(
        "config", help="print a recipe's configuration: every key with its value",
        description="Print the configuration RECIPE resolves to (defaults < --config < "
        "key=value), as YAML: every key 'kdml train' accepts. Of a --config file with a "
        "grid: the first cell's config, the grid named in a comment and checked as 'kdml "
        "train' checks it.")
    config.add_argument("recipe", nargs="?",
                        help="recipe name (see 'kdml recipes'); optional with a --config file "
                        "that names one")
    config.add_argument("overrides", nargs="*", metavar="key=value", default=[])
    config.add_argument("--config", type=Path, help="YAML file with config values")
    return parser


def _add_split_options(parser: argparse.ArgumentParser, default: str = "test",
                       help_text: str = "the part to embed (default test; where the test "
                                        "set is queries and a gallery, as In-Shop's is, test "
                                        "is the queries)") -> None:
    parser.add_argument("--split", choices=("test", "train", "gallery"), default=default,
                        help=help_text)
    parser.add_argument("--dataset", help="embed another dataset with the run's model (without "
                        "the run's own data where its data.json records what the model "
                        "takes; --data-root is then that dataset's folder)")
    _add_data_root(parser)


def _add_best(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--best", action="store_true",
                        help="use checkpoints/best.pt (runs with train.keep_best), not last.pt")


def _add_test_part(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--test", action="store_true",
                        help="for a run that validated (data.validation): use the test part, "
                        "which its training and choices never saw, not the validation part (a "
                        "run that did not validate uses it anyway)")


def _data_folder(text: str) -> Path:
    """An argparse type: :func:`_folder`, made absolute, so that the sources an index or an
    embedding file records lead to the images from any folder (train's config records it so
    too). A file is refused: for ``csv:FILE`` it is the folder the list lies in."""
    folder = _folder(text).absolute()
    if folder.is_file():
        raise argparse.ArgumentTypeError(f"{text} is a file; give the folder the data lies in "
                                         "(for csv:FILE, the folder of the list)")
    return folder


def _add_data_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-root", metavar="DIR", type=_data_folder,
                        help="where the run's on-disk dataset is now, if it moved (for "
                        "folder:DIR the folder itself, for csv:FILE the folder of the list)")


# The process that set _interrupt as its SIGTERM handler (None: not set, as in tests that
# call it directly); a process forked from it inherits the handler.
_HANDLER_PID: int | None = None


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: the files being written through a hidden partial are removed, and a
    run's train.log says it stopped. (Training under torchrun keeps the default: torchrun
    stops its ranks with SIGTERM when one fails, and the failing one says why.)

    A kill of the whole process group (SLURM, systemd) also ends the data loader's workers,
    and torch's SIGCHLD handler would then raise "DataLoader worker ... is killed by signal"
    over this stop: it goes back to the default first. A worker killed after its fork but
    before torch set its own handler would have raised Terminated through the code it was
    forked from: a forked process dies by the signal instead, as torch's handler has it."""
    if _HANDLER_PID is not None and os.getpid() != _HANDLER_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if hasattr(signal, "SIGCHLD"):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    raise Terminated


# The error handler of the console command's stdout and stderr (_lenient_streams), by its
# codecs name.
ESCAPED_BYTES = "kdml.escaped-bytes"


def _escaped_bytes(error: UnicodeError) -> tuple[str, int]:
    """A codecs error handler: each byte of a file name that is not UTF-8 (which Python reads
    as a surrogate, U+DC80 to U+DCFF) written ``\\xNN``, as
    :func:`~kdml.data.formats.folder.shown_name` writes it in kdml's captions and tables
    (``backslashreplace`` wrote ``\\udcf6`` for the byte 0xF6); any other character the stream
    cannot encode is written as ``backslashreplace`` writes it."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    failed = error.object[error.start:error.end]
    return "".join(f"\\x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF
                   else char.encode("ascii", "backslashreplace").decode("ascii")
                   for char in failed), error.end


def _lenient_streams() -> None:
    """Print a file name that is not UTF-8 (a Latin-1 folder from an old zip, read as
    surrogates) with each such byte written ``\\xNN`` (``f\\xf6x``, as kdml's captions show
    it; :func:`_escaped_bytes`): a terminal whose locale makes stdout strict UTF-8 had stopped
    ``kdml search`` with a UnicodeEncodeError. stderr too, where kdml's one-line errors and
    warnings name such files: its default, ``backslashreplace``, had written the byte
    ``\\udcf6``, not as stdout and the captions write it."""
    codecs.register_error(ESCAPED_BYTES, _escaped_bytes)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=ESCAPED_BYTES)


def main(argv: Sequence[str] | None = None) -> int:
    global _HANDLER_PID
    if argv is None and hasattr(signal, "SIGPIPE"):  # `kdml search ... | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if argv is None:  # the console command: this process's streams are kdml's to set
        _lenient_streams()
    parser = build_parser()
    # key=value overrides may follow options (`--out DIR epochs=3`), which argparse's positional
    # matching does not allow, so collect the leftovers and accept only overrides among them.
    try:  # argparse exits on --help, --version and bad arguments; return its status instead
        args, extras = parser.parse_known_args(argv)
        unknown = [item for item in extras
                   if item.startswith("-") or args.command not in ("train", "config")]
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as exit_request:
        return int(exit_request.code or 0)
    if extras:
        args.overrides = [*args.overrides, *extras]
    try:
        training = args.command in ("train", "reproduce")
        # a kill (SIGTERM) cleans up what the command was writing, as Ctrl-C
        if argv is None and not (training and _launched_by_torchrun()):
            _HANDLER_PID = os.getpid()
            signal.signal(signal.SIGTERM, _interrupt)
        if training:  # training shows its warnings itself
            return _COMMANDS[args.command](args)
        from kdml.training.run_folder import warnings_on_stderr

        with warnings_on_stderr():
            return _COMMANDS[args.command](args)
    except QuietExit:  # rank 0 reported it
        return 2
    except KdmlError as error:
        if _is_main_process():  # under torchrun the ranks fail alike: rank 0 says it once
            print(f"kdml: error: {error}", file=sys.stderr)
        elif isinstance(error, LocalError):  # met by this rank alone: rank 0 cannot say it
            print(f"kdml: error: rank {_rank()}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C, or a kill (SIGTERM: Terminated)
        code, stopped = _stop_code(stop)
        print(f"kdml: {stopped}", file=sys.stderr)
        return code
    except RuntimeError as error:
        behind = raised_over(error, KeyboardInterrupt)
        if behind is not None:  # a worker's death raised over a kill or Ctrl-C: that stop
            code, stopped = _stop_code(behind)
            print(f"kdml: {stopped}", file=sys.stderr)
            return code
        if not _failed_collective(error):
            raise
        # another process of the job died (killed, out of memory): its own output says why;
        # this one's traceback, deep in gloo or NCCL, would only bury it
        reason = (str(error).splitlines() or [type(error).__name__])[0]
        print(f"kdml: error: a collective operation failed, most likely because another "
              f"process of this job stopped: its output says why ({reason[:300]})",
              file=sys.stderr)
        return 1
    except OSError as error:
        if error.filename is None:  # not about a path: a bug, so keep its traceback
            raise
        # the file system refused a path (a file where a folder goes, no permission, a full
        # disk): say which and why in one line, as for any other bad input
        if _is_main_process():
            paths = " -> ".join(str(name) for name in (error.filename, error.filename2)
                                if name is not None)
            advice = ("check its permissions" if isinstance(error, PermissionError)
                      else "move what is in the way or choose another path"
                      if isinstance(error, (FileExistsError, IsADirectoryError,
                                            NotADirectoryError))
                      else "free space on its disk and run the command again"
                      + _FULL_DISK_NOTES.get(args.command, "")
                      if error.errno in (errno.ENOSPC, errno.EDQUOT)
                      else "fix it or choose another path")
            print(f"kdml: error: {paths}: {error.strerror or error}; {advice}", file=sys.stderr)
        return 2
    finally:
        if "kdml.distributed" in sys.modules:  # imported only by commands that train
            sys.modules["kdml.distributed"].teardown(sys.exc_info()[1])


def _failed_collective(error: RuntimeError) -> bool:
    """Whether ``error`` is a collective failing because a peer is gone
    (:func:`kdml.distributed.failed_collective`); False where torch.distributed was never
    imported (a command that does not train)."""
    if "torch.distributed" not in sys.modules:
        return False
    from kdml.distributed import failed_collective

    return failed_collective(error)


# What a command stopped by a full disk keeps, said after "run the command again".
_FULL_DISK_NOTES = {"train": " (a stopped run continues with kdml train --resume)",
                    "reproduce": " (it keeps its finished runs and continues)"}


def _stop_code(stop: KeyboardInterrupt) -> tuple[int, str]:
    """The shell's exit code for a stop, and the word for it: a kill (SIGTERM, 143) or
    Ctrl-C (130)."""
    if isinstance(stop, Terminated):
        return 128 + signal.SIGTERM, "terminated"
    return 130, "interrupted"


def _launched_by_torchrun() -> bool:
    from kdml.distributed import launched_by_torchrun  # torch: only for training commands

    return launched_by_torchrun()


def _is_main_process() -> bool:
    return _rank() == 0


def _rank() -> int:
    module = sys.modules.get("kdml.distributed")  # imported only by commands that train
    return 0 if module is None else module.world().rank


def _train(args: argparse.Namespace) -> int:
    from kdml import distributed
    from kdml.config import load_config_file, resolve_config, with_absolute_paths
    from kdml.training.loading import run_config
    from kdml.training.recipes import get_recipe
    from kdml.training.run_folder import (
        RUNS_FOLDER,
        RunFolder,
        check_new_run_folder,
        check_outside_image_folders,
        default_run_dir,
        remove_if_unused,
    )
    from kdml.training.trainer import train

    if args.resume is not None:
        if (args.recipe or args.overrides or args.dataset or args.config or args.weights
                or args.seed is not None or args.data_root or args.out):
            raise KdmlError("--resume takes only the run folder: the run keeps its own config "
                            "(edit its config.yaml for what a resumed run can change, such as "
                            "train.epochs, or data.root where its data moved)")
        run = RunFolder.existing(args.resume)
        config = run_config(run)
        _join_processes(config)
        return _run_training(lambda: train(config, run.root, resume=True,
                                           progress=_progress(args)), config, run.root)

    file_values = load_config_file(args.config) if args.config else {}
    recipe_name, overrides = _recipe_and_overrides(args, file_values.get("recipe"))
    recipe = get_recipe(recipe_name)
    grid = file_values.get("grid")
    _check_flags_agree_with_overrides(
        args, overrides, [str(key) for key in grid] if isinstance(grid, dict) else [])
    # Quoted (a JSON string is a YAML string): unquoted, an override's value is read as YAML,
    # which makes `folder:` a mapping and a path named `yes` or `1e5` a bool or a number.
    if args.dataset is not None:
        overrides.append(f"data.dataset={json.dumps(str(args.dataset))}")
    if args.data_root:
        overrides.append(f"data.root={json.dumps(str(args.data_root))}")
    if args.weights:
        overrides.append(f"model.weights={json.dumps(str(args.weights))}")
    if args.seed is not None:
        overrides.append(f"train.seed={args.seed}")
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


def _join_processes(config: RunConfig) -> None:
    """Under torchrun: join the process group (NCCL when training on GPUs, else gloo)."""
    from kdml import distributed
    from kdml.training.build import resolve_device

    if distributed.launched_by_torchrun():
        device = resolve_device(distributed.device_for(config.train.device))
        distributed.setup(use_cuda=device.type == "cuda")


def _say(message: str) -> None:
    """Print on rank 0 only (the only process under a single launch)."""
    from kdml import distributed

    if distributed.world().is_main:
        print(message)


def _train_grid(recipe: Recipe, file_values: dict, overrides: list[str],
                args: argparse.Namespace) -> int:
    """One run per cell of the config file's grid (see kdml.training.grid)."""
    from kdml import distributed
    from kdml.config import with_absolute_paths
    from kdml.training.grid import best_cells, changed_setting, check_grid_folder, write_marker
    from kdml.training.loading import run_config
    from kdml.training.run_folder import (
        RUNS_FOLDER,
        RunFolder,
        check_outside_image_folders,
        check_utf8_path,
        default_run_dir,
    )
    from kdml.training.selection import as_validation_history, best_scores
    from kdml.training.trainer import train

    cells, resolved = _grid_configs(recipe, file_values, overrides)
    configs = [with_absolute_paths(config) for config in resolved]
    shares = sorted({config.data.validation for config in configs})
    if len(shares) > 1:
        raise KdmlError(f"the grid's cells have different data.validation ({shares[0]:g} to "
                        f"{shares[-1]:g}): each would be scored on another part (the test part, "
                        "or another validation part), which one table cannot compare; give "
                        "every cell the same data.validation")
    _check_dataset_name(configs[0].data.dataset)
    _join_processes(configs[0])

    def grid_folder() -> Path:  # rank 0 names, checks and marks it
        check_outside_image_folders(args.out or RUNS_FOLDER, configs[0].data.dataset)
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

    _say(f"grid of {len(cells)} runs of {recipe.name} on {configs[0].data.dataset} into {root}")
    finals = []
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
        except KdmlError as error:
            if not finals and not run.config.is_file():  # refused before anything trained
                raise KdmlError(f"grid cell {cell.name} failed: {error} -- nothing was "
                                f"trained; the same command, corrected, goes on in "
                                f"{root}") from None
            raise KdmlError(f"grid cell {cell.name} failed: {error} -- the {number - 1} cells "
                            f"before it are kept in {root}: the same command continues there "
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
        finals = [best_scores(as_validation_history(RunFolder(root / cell.name).history()),
                              metric) or final for cell, final in zip(cells, finals, strict=True)]
        scored += f", at each cell's best epoch by {metric} (train.keep_best)"
    # every cell's metrics, in order of first appearance: a grid over eval.nmi or eval.ks
    # scores its cells on different metrics (the first cell's alone had hidden the others')
    names = list(dict.fromkeys(name for final in finals for name in final))
    _say(f"\n{scored} ({recipe.name}, {configs[0].data.dataset}):")
    _say("  " + "  ".join([f"{'cell':<24}", *(f"{name:>12}" for name in names)]))
    for cell, final in zip(cells, finals, strict=True):  # "-": not scored (or not collapsed)
        _say("  " + "  ".join([f"{cell.name:<24}",
                              *(f"{final[name]:>12.4f}" if name in final else f"{'-':>12}"
                                for name in names)]))
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
             "weights": ("--weights", "model.weights"), "seed": ("--seed", "train.seed")}


def _check_flags_agree_with_overrides(args: argparse.Namespace, overrides: list[str],
                                      grid_keys: list[str]) -> None:
    """Refuse a flag and an override of its key, or a grid over it, together (``--dataset
    digits data.dataset=cub``), and an override of a key the grid runs over: one of them
    would be ignored without a word."""
    from kdml.config import parse_override

    for item in overrides:
        key = str(parse_override(item)[0])
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
            if parse_override(item)[0] in names:
                raise KdmlError(f"{flag} and the override {item} both set {key}; give one")
        for grid_key in grid_keys:
            if grid_key in names:
                raise KdmlError(f"{flag} sets {key}, over which the config's grid runs; give "
                                f"one")


def _check_dataset_name(dataset: str) -> None:
    from kdml.data.domains import DOMAIN_PAIRS, is_domain_dataset
    from kdml.data.registry import DATASETS, FORMATS, is_known_dataset

    if not is_known_dataset(dataset) and not is_domain_dataset(dataset):
        # An unquoted 'mnist5k->digits' reaches us as 'mnist5k-': the shell took '>'.
        hint = (" (quote domain pairs in the shell: --dataset 'mnist5k->digits')"
                if dataset.endswith("-") else "")
        raise KdmlError(f"unknown dataset {dataset!r}; choose one of: "
                        f"{', '.join([*DATASETS, *FORMATS, *DOMAIN_PAIRS])}, folder:DIR, "
                        f"csv:FILE or npz:PATH{hint}")


def _run_training(run: Callable[[], dict[str, float]], config: RunConfig,
                  run_dir: Path) -> int:
    from kdml import distributed

    try:
        final = run()
    except KeyboardInterrupt as stop:
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
    import yaml

    from kdml.config import load_config_file, resolve_config
    from kdml.training.recipes import get_recipe

    file_values = load_config_file(args.config) if args.config else {}
    recipe_name, overrides = _recipe_and_overrides(args, file_values.get("recipe"))
    recipe = get_recipe(recipe_name)
    if "grid" in file_values:  # the file's values alone may be no run's (keep_best without
        # the data.validation its grid gives): print the first cell's, saying so
        note, config = _first_grid_cell(args.config, recipe, file_values, overrides)
        print(note)
    else:
        config = resolve_config(recipe.name, recipe.params, recipe.defaults, file_values,
                                overrides)
    print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
    return 0


def _first_grid_cell(file: Path, recipe: Recipe, file_values: dict,
                     overrides: list[str]) -> tuple[str, RunConfig]:
    """A YAML comment naming the --config file's grid, and its first cell's config, after
    refusing what kdml train would refuse of the grid: an override of one of its keys, and
    what :func:`_grid_configs` refuses."""
    grid = file_values["grid"]
    keys = [str(key) for key in grid] if isinstance(grid, dict) else []
    # kdml config has none of kdml train's flags (--dataset, --seed, ...) to compare
    _check_flags_agree_with_overrides(argparse.Namespace(**dict.fromkeys(FLAG_KEYS)),
                                      overrides, keys)
    cells, configs = _grid_configs(recipe, file_values, overrides)
    return (f"# {file} holds a grid of {len(cells)} runs over {', '.join(keys)}, one per "
            f"cell;\n# printed: the first cell's config, {cells[0].name}"), configs[0]


def _grid_configs(recipe: Recipe, file_values: dict, overrides: list[str]
                  ) -> tuple[list[Cell], list[RunConfig]]:
    """The config file's grid cells and each one's config (the file's values, ``overrides``,
    then the cell's), refusing a malformed grid, two keys of one setting (``dim`` and
    ``method.dim``), two cells of one folder name, a bad value in any cell, and two cells of
    one config."""
    from kdml.config import RunConfig, resolve_config, resolve_key
    from kdml.training.grid import check_distinct_cells, check_distinct_keys, grid_cells

    cells = grid_cells(file_values["grid"])
    blank = RunConfig(recipe=recipe.name, method=recipe.params())  # the keys a cell may set
    check_distinct_keys([str(key) for key in file_values["grid"]],
                        functools.partial(resolve_key, blank))
    configs = [resolve_config(recipe.name, recipe.params, recipe.defaults, file_values,
                              [*overrides, *cell.overrides]) for cell in cells]
    check_distinct_cells(cells, [config.to_dict() for config in configs])
    return cells, configs


def _eval(args: argparse.Namespace) -> int:
    from kdml.training.checks import check_evaluation
    from kdml.training.loading import load_run
    from kdml.training.run_folder import check_json_replaceable, write_json

    if args.dataset is not None:
        return _eval_other_dataset(args)
    trained = load_run(args.run_dir, args.data_root, best=args.best, test_part=args.test)
    config = _with_ks(trained.config, args.ks)
    if args.ks:
        check_evaluation(config, trained.splits, evaluating=True)
    result = {"epoch": trained.epoch, "checkpoint": "best" if args.best else "last",
              "scored": "validation" if trained.splits.validation else "test"}
    check_json_replaceable(trained.run.root / "eval.json", [*result, "metrics"])
    metrics = _score_and_print(trained, config, trained.splits, trained.embedder,
                               args.best, trained.splits.validation)
    write_json({**result, "metrics": metrics}, trained.run.root / "eval.json")
    return 0


def _eval_other_dataset(args: argparse.Namespace) -> int:
    """``kdml eval RUN --dataset D``: the run's model scored on D's test part. Nothing is
    written: the run folder's ``eval.json`` is of the run's own data."""
    from kdml.inspection import other_data
    from kdml.training.checks import check_evaluation
    from kdml.training.loading import load_model

    if args.test:  # another dataset has no validation part to stand in for its test part
        raise KdmlError("--test picks a validated run's own test part; with --dataset the "
                        "test part of that dataset is scored anyway: drop --test")
    model = load_model(args.run_dir, best=args.best)  # without the run's data where it can
    other, splits, embedder = other_data(model, args.dataset,
                                         None if args.data_root is None else str(args.data_root))
    other = _with_ks(other, args.ks)
    # one class would score 1 everywhere, as training refuses
    check_evaluation(other, splits, evaluating=True)
    _score_and_print(model, other, splits, embedder, args.best, validated=False)
    return 0


def _with_ks(config: RunConfig, ks: list[int] | None) -> RunConfig:
    """``config`` scoring Recall@K at ``ks`` (``kdml eval --ks``; None: its eval.ks)."""
    if not ks:
        return config
    return dataclasses.replace(config, eval=dataclasses.replace(config.eval,
                                                                ks=sorted(set(ks))))


def _score_and_print(trained: RunModel, config: RunConfig, splits: DataSplits,
                     embedder: Embedder, best: bool, validated: bool) -> dict[str, float]:
    """``kdml eval``'s output: the checkpoint, the test set, and the metrics of ``trained``'s
    model on ``splits`` (``config`` names the data and its eval settings)."""
    from kdml.evaluation.evaluator import score_method

    print(f"{'best' if best else 'last'} checkpoint: epoch {trained.epoch}")
    print(f"test set: {splits.test_set}")
    metrics = score_method(trained.method, splits, config.eval, embedder).recorded()
    if splits.unreadable:  # counted again: only decoding finds the images it left out
        print(f"test set: {splits.test_set}")
    # printed before eval.json: a run folder that cannot be written (archived, read-only)
    # still shows them
    _print_results(config, metrics, trained.run.root, validated)
    return metrics


def _analyze_generalization(args: argparse.Namespace) -> int:
    from kdml.evaluation.generalization import check_scored_counts, distance_note
    from kdml.inspection import GeneralizationSettings, analyze_generalization
    from kdml.training.loading import load_run

    settings = GeneralizationSettings(args.labelled_fraction, args.repeats, args.neighbors,
                                      args.seed)
    trained = load_run(args.run_dir, args.data_root)
    # before minutes of embedding (checked again on the embedded sets)
    check_scored_counts(len(trained.splits.train), len(trained.splits.test),
                        args.labelled_fraction, "--labelled-fraction")
    if trained.splits.validation:
        print(f"kdml: note: this run validated (data.validation): its unseen classes here are "
              f"the validation part ({len(trained.splits.test):,} samples of the classes held "
              "out of its training classes to choose its epoch); the test part is not used",
              file=sys.stderr)
    terms, path = analyze_generalization(trained, settings)
    print(f"Generalization terms, seen vs unseen classes ({args.repeats} random splits, "
          f"{args.neighbors}-NN classifiers, 95% CI):")
    for name, label in (("h_divergence", "H-divergence d_H"),
                        ("h_divergence_bd", "  Ben-David form"), ("lambda", "lambda"),
                        ("err_seen", "  err_s(h*)"), ("err_unseen", "  err_u(h*)")):
        print(f"  {label:<18} {terms[name].mean:.4f} +- {terms[name].ci95:.4f}")
    print("(chance, sets a classifier cannot tell apart: d_H 0.5, Ben-David form 0)")
    if terms["unfitted"].mean > 0:
        print(f"kdml: note: {terms['unfitted'].mean:.1%} of the scored samples are of classes "
              "with no sample in the fitted part; lambda counts them as errors: raise "
              "--labelled-fraction", file=sys.stderr)
    note = distance_note(trained.method.has_charts)
    if note:
        print(f"kdml: note: {note}", file=sys.stderr)
    print(f"written to {path}")
    return 0


def _plot_charts(args: argparse.Namespace) -> int:
    from kdml.inspection import draw_charts

    path = draw_charts(_plotted_run(args), args.thumbnails)
    print(f"chart plot written to {path}")
    return 0


def _run_and_part(args: argparse.Namespace) -> tuple[RunModel, Part]:
    """The run of ``args.run_dir`` and the ``--split`` part of its data (``--test``: of its
    test part), or of ``--dataset`` (then ``--data-root`` is that dataset's root, not the
    run's, and the model is rebuilt without the run's data where its folder records what it
    takes); a note on stderr where "test" is a validation part."""
    from kdml.inspection import dataset_part, run_part
    from kdml.training.loading import load_model, load_run

    if args.test and args.split == "train":  # the test part's load counts validation as trained
        raise KdmlError("--test picks the test part; with --split train it would add the "
                        "validation classes, which the run did not train on: drop --test")
    if args.dataset is not None:
        model = load_model(args.run_dir, best=args.best)
        return model, dataset_part(model, args.dataset, args.data_root, args.split)
    trained = load_run(args.run_dir, args.data_root, best=args.best, test_part=args.test)
    part = run_part(trained, args.split)
    _note_validation_part(part)
    return trained, part


def _plotted_run(args: argparse.Namespace) -> TrainedRun:
    """The run a plot draws: its test part (``--test``), or a validated run's validation part,
    which is then said on stderr."""
    from kdml.inspection import run_part
    from kdml.training.loading import load_run

    trained = load_run(args.run_dir, args.data_root, best=args.best, test_part=args.test)
    _note_validation_part(run_part(trained))
    return trained


def _note_validation_part(part: Part) -> None:
    """Say on stderr where a validated run's "test" is its validation part."""
    from kdml.inspection import validation_note

    note = validation_note(part)
    if note:
        print(f"kdml: note: {note}", file=sys.stderr)


def _embed(args: argparse.Namespace) -> int:
    from kdml.inspection import check_npz_out, embed_part, write_npz

    check_npz_out(args.out)  # before the run is loaded and embedded
    trained, part = _run_and_part(args)
    arrays = embed_part(trained, part)
    path = write_npz(args.out, arrays)
    print(f"{len(arrays['labels'])} embeddings of size {arrays['embeddings'].shape[1]} "
          f"written to {path}")
    return 0


def _index(args: argparse.Namespace) -> int:
    from kdml.inspection import index_part

    trained, part = _run_and_part(args)
    info = index_part(trained, part, args.out, args.kind)
    charts = ("" if info.charts is None else
              f", {len(info.charts)} chart{'' if len(info.charts) == 1 else 's'}")
    print(f"{info.kind} {info.metric} index of {info.count} {info.dim}-d vectors{charts} "
          f"written to {args.out}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from kdml.inspection import results_as_json, run_without_data, score_name, search
    from kdml.training.loading import load_model

    def model() -> RunModel:  # images and 'inputs' only: embeddings need no model
        return load_model(args.run_dir, best=args.best, data_root=args.data_root)

    results = search(run_without_data(args.run_dir, args.best), args.index, args.query, args.k,
                     model)
    short = sum(len(result["neighbours"]) < args.k for result in results)
    if short:  # an exact index holds too few items (in the query's chart) or ivf/hnsw missed
        print(f"kdml: note: {short} of {len(results)} queries found fewer than {args.k} "
              "neighbours: the index holds fewer (in their chart), or an ivf or hnsw index "
              "missed some", file=sys.stderr)
    if args.json:
        print(results_as_json(results))
        return 0
    class_names = [item["class_name"] for result in results for item in result["neighbours"]
                   if "class_name" in item]
    width = max([5, *map(_columns, class_names)]) if class_names else 0

    def named(text: str) -> str:  # a column only where the classes have names
        return f"{text}{' ' * (width - _columns(text))}  " if width else ""

    for result in results:
        print(f"query {result['query']}:")
        score = score_name(result["metric"])  # cosine similarity or Euclidean distance
        print(f"  {'rank':>4}  {score:>10}  {'label':>6}  {named('class')}source")
        for item in result["neighbours"]:
            print(f"  {item['rank']:>4}  {item['score']:>10.4f}  {item['label']:>6}  "
                  f"{named(item.get('class_name', ''))}{item['source']}")
    return 0


def _columns(text: str) -> int:
    """The terminal columns ``text`` takes: East Asian wide and full-width characters take two
    (class names in Chinese or Japanese), combining marks and format characters none (the
    accents of a folder name macOS stored decomposed, "e" + U+0301), so a table padded by
    ``len`` would not line up. (The standard library's tables, not the wcwidth package:
    nothing else here needs it.)"""
    return sum(0 if unicodedata.category(character) in ("Mn", "Me", "Cf")
               else 2 if unicodedata.east_asian_width(character) in "WF" else 1
               for character in text)


def _plot_retrieval(args: argparse.Namespace) -> int:
    from kdml.inspection import plot_retrieval

    path = plot_retrieval(_plotted_run(args), args.queries, args.k, args.seed)
    print(f"retrieval grid written to {path}")
    return 0


def _plot_embedding(args: argparse.Namespace) -> int:
    from kdml.inspection import plot_embedding

    path = plot_embedding(_plotted_run(args), args.max_points)
    print(f"embedding map written to {path}")
    return 0


def _datasets(args: argparse.Namespace) -> int:
    from kdml.data.domains import DOMAIN_PAIRS
    from kdml.data.registry import DATASETS, FORMATS, PREFIXES, ROOT_VARIABLE, candidate_roots

    rows = [(entry.name, entry.description) for entry in DATASETS.values()]
    rows += [(entry.name, entry.description) for entry in DOMAIN_PAIRS.values()]
    rows += [("npz:PATH", "pre-extracted features of two domains (X, y, domain)")]
    rows += [(f"{prefix}{'DIR' if prefix == 'folder:' else 'FILE'}", text)
             for prefix, text in PREFIXES.items()]
    on_disk = []
    for entry in FORMATS.values():
        roots = [folder for root in candidate_roots(entry)
                 if (folder := entry.located(root)) is not None]
        on_disk.append((entry.name, entry.description,
                        f"found in {roots[0]}" if roots else "not found"))
    width = max(len(name) for name, *_ in rows + on_disk)
    print("Offline and your own data:")
    for name, description in rows:
        print(f"  {name:<{width}}  {description}")
    print(f"On-disk datasets (--data-root DIR, or ${ROOT_VARIABLE}/<name> or the archive's "
          "folder):")
    for name, description, where in on_disk:
        print(f"  {name:<{width}}  {description}; {where}")
    return 0


def _recipes(args: argparse.Namespace) -> int:
    from kdml.training.recipes import RECIPES

    width = max(map(len, RECIPES))
    for recipe in RECIPES.values():
        print(f"{recipe.name:<{width}}  {recipe.summary}")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    import fnmatch
    import re

    import torch

    from kdml import distributed
    from kdml.reproduce.catalog import experiments
    from kdml.reproduce.report import check_outputs, keep_reported
    from kdml.reproduce.runner import reproduce
    from kdml.training.build import resolve_device
    from kdml.training.run_folder import hold_folder

    if distributed.launched_by_torchrun():
        raise KdmlError("kdml reproduce trains its runs one after another in one process; "
                        "run it without torchrun (each run may use one GPU via --device)")
    def matches(experiment: Experiment, patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(experiment.key, pattern) for pattern in patterns)

    chosen = experiments(args.paper, args.quick)
    # every pattern must match: a mistyped key among others would drop its experiment unsaid
    unmatched = [pattern for pattern in args.only
                 if not any(matches(experiment, [pattern]) for experiment in chosen)]
    if unmatched:
        keys = ", ".join(experiment.key for experiment in chosen)
        # --quick keeps the first dataset of each table: a full run's key is not among them
        full = [experiment.key for experiment in experiments(args.paper)
                if matches(experiment, unmatched)]
        quick = f" with --quick (without it: {', '.join(full)})" if args.quick and full else ""
        raise KdmlError(f"--only {' '.join(unmatched)} matches no experiment of "
                        f"{args.paper}{quick}; the keys are: {keys}")
    if args.only:
        chosen = [experiment for experiment in chosen if matches(experiment, args.only)]
    if args.list:
        for experiment in chosen:
            print(f"{experiment.key}  ({experiment.mirrors}; {len(experiment.cells)} cells)")
            print(f"    every cell: data.dataset={experiment.dataset} {' '.join(experiment.common)}"
                  .rstrip())
            for cell in experiment.cells:
                print(f"    {cell.label}: {cell.recipe} {' '.join(cell.overrides)}".rstrip())
        return 0
    seeds = args.seeds or (3 if args.quick else 5)
    runs = args.runs or _default_runs(args.quick)
    # A quick report's numbers say nothing about the methods, so by default it stays beside
    # its runs instead of replacing the committed docs/reproduction.md.
    report = args.out or (runs / "reproduction.md" if args.quick else DEFAULT_REPORT)
    check_outputs(report)
    if re.fullmatch(r"cuda(:\d+)?", args.device) and not torch.cuda.is_available():
        # in its own words: resolve_device's name train.device, which reproduce does not take
        raise KdmlError(f"--device {args.device} but no CUDA device is available here; give "
                        "--device cpu or auto")
    device = resolve_device(args.device)
    # The report at --out keeps its other sections, with --only or without: they are read
    # again from their finished runs (never trained here), and one that cannot be is refused
    # before anything trains, not dropped (`kdml reproduce dtml` keeps a report's JRD tables).
    catalog = experiments("all", args.quick)
    chosen = keep_reported(chosen, catalog, report, seeds, args.quick, runs, str(device))
    try:
        results = reproduce(chosen, seeds, runs, str(device), _progress(args))
        # Another kdml reproduce on these runs may be writing the same report: one writes at a
        # time, and each keeps the sections the others added meanwhile (their runs finished).
        with hold_folder(runs / ".reproduce.lock", "", wait=True):
            added = [experiment for experiment in keep_reported(
                chosen, catalog, report, seeds, args.quick, runs, str(device))
                     if experiment not in chosen]
            if added:
                print(f"{report} gained {len(added)} section(s) from another kdml reproduce "
                      "while this one trained; reading their runs again")
                results += reproduce(added, seeds, runs, str(device), _progress(args))
                chosen = [experiment for experiment in catalog
                          if experiment in chosen or experiment in added]
                results.sort(key=lambda result: chosen.index(result.experiment))
            return _write_reproduction(args, catalog, chosen, results, report, runs, seeds,
                                       device)
    except KeyboardInterrupt as stop:
        code, stopped = _stop_code(stop)
        print(f"kdml: {stopped}; finished runs are kept, and the same command continues",
              file=sys.stderr)
        return code


def _default_runs(quick: bool) -> Path:
    return Path("runs/reproduce-quick" if quick else "runs/reproduce")


def _write_reproduction(args: argparse.Namespace, catalog: list[Experiment],
                        chosen: list[Experiment], results: list[ExperimentResult], report: Path,
                        runs: Path, seeds: int, device: torch.device) -> int:
    """Write ``kdml reproduce``'s report of ``results``; the exit code. ``catalog``: every
    experiment (``experiments("all", args.quick)``), of which the report lists the paper's
    others as not run."""
    import shlex

    import torch

    from kdml import __version__
    from kdml.machine import machine_description
    from kdml.reproduce.report import ReportContext, write_report

    minutes = sum(cell_wall for result in results for cell in result.cells.values()
                  for cell_wall in cell.wall_s if cell_wall == cell_wall) / 60

    # A report written elsewhere names its path, so that its command rewrites it and not
    # the default report (a quick report always does: its default follows --runs).
    out = "" if report == DEFAULT_REPORT and not args.quick else str(report)
    # and other runs than the default, so that its commands reuse them rather than train anew
    other_runs = "" if runs == _default_runs(args.quick) else str(runs)
    # and always the device: run folders hash it, so the commands find these runs even where
    # `auto` picks another device (a CPU report's commands pasted on a GPU machine)
    command = ["kdml", "reproduce", args.paper, "--seeds", str(seeds),
               *(["--quick"] if args.quick else []),
               *(item for pattern in args.only for item in ("--only", pattern)),
               "--device", str(device),
               *(["--runs", other_runs] if other_runs else []),
               *(["--out", out] if out else [])]
    context = ReportContext(
        command=shlex.join(command), machine=machine_description(device),
        versions=f"torch {torch.__version__}, kdml {__version__}", wall_minutes=minutes,
        seeds=seeds, quick=args.quick, out=shlex.quote(out) if out else "",
        runs=shlex.quote(other_runs) if other_runs else "", device=str(device))
    not_run = [experiment for experiment in catalog  # the paper's, as experiments(paper)
               if args.paper in ("all", experiment.paper) and experiment not in chosen]
    failed = [result for result in results if result.error]
    for result in failed:
        print(f"kdml: {result.experiment.key} could not run: {result.error}", file=sys.stderr)
    for result in results:  # the table is written; only its chart plot is left out
        for label, numbers in result.cells.items():
            if numbers.charts is None and numbers.charts_missing:
                print(f"kdml: {result.experiment.key}: the charts of {label} are not drawn: "
                      f"{numbers.charts_missing}", file=sys.stderr)
    if len(failed) == len(results) and report.exists():  # it may hold numbers: keep them
        print(f"{report} is left as it was: none of its experiments ran", file=sys.stderr)
        return 1
    path = write_report(results, report, context, not_run)
    print(f"report written to {path} ({len(results) - len(failed)} of {len(results)} "
          "experiments)")
    return 1 if failed else 0


def _progress(args: argparse.Namespace) -> bool | None:
    return False if args.no_progress else None


def _print_results(config: RunConfig, metrics: dict[str, float], run_dir: Path,
                   validated: bool | None = None) -> None:
    """The metrics table; ``validated`` (default: whether the run validates) names the part."""
    validated = bool(config.data.validation) if validated is None else validated
    scored = "Validation" if validated else "Test"
    print(f"\n{scored} metrics ({config.recipe}, {config.data.dataset}):")
    width = max([12, *map(len, metrics)])  # source_nn_accuracy is 18 long
    print(f"  {'metric':<{width}} value")
    for name, value in metrics.items():
        print(f"  {name:<{width}} {value:.4f}")
    print(f"run folder: {run_dir}")


_ANALYSES = {"generalization": _analyze_generalization}
_PLOTS = {"charts": _plot_charts, "retrieval": _plot_retrieval,
          "embedding": _plot_embedding}
_COMMANDS = {"train": _train, "eval": _eval, "datasets": _datasets, "recipes": _recipes,
             "config": _config, "embed": _embed, "index": _index, "search": _search,
             "reproduce": _reproduce,
             "analyze": lambda args: _ANALYSES[args.analysis](args),
             "plot": lambda args: _PLOTS[args.plot](args)}


if __name__ == "__main__":
    sys.exit(main())
