"""The ``kdml`` command's arguments: its subcommands, their options and the argparse types
that refuse a bad value in one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from kdml.cli.output import _is_main_process
from kdml.errors import KdmlError, home_expanded

if TYPE_CHECKING:
    from _typeshed import SupportsWrite


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of usage + message
        # every process torchrun starts parses the same arguments: rank 0 says it, once
        message = _missing_choice(self, message) or message
        self.exit(2, f"kdml: error: {message} (see '{self.prog} --help')\n"
                  if _is_main_process() else None)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        """argparse's, except that a failed write of the help or version to standard output
        (> /dev/full) is raised, for main's one line: argparse ignored it, so the text was lost
        with exit status 0, or Python's flush at exit failed ("Exception ignored", 120). A
        message to stderr (a usage error) keeps argparse's way: there is nowhere to say that
        it failed."""
        stdout = sys.stdout  # None where closed (>&-): argparse's way writes to stderr
        if not message or stdout is None or file is not sys.stdout:
            super()._print_message(message, file)
            return
        stdout.write(message)
        stdout.flush()  # buffered, the write fails only here


def _missing_choice(parser: argparse.ArgumentParser, message: str) -> str | None:
    """``name a command: train, eval, ... or config`` for argparse's "the following arguments
    are required: command" (``kdml`` alone, or ``kdml plot``: "plot"), which named the
    parser's inner name of the missing subcommand, not the ones to choose from; ``None`` for
    any other message."""
    for action in parser._actions:
        if (isinstance(action, argparse._SubParsersAction)
                and message == f"the following arguments are required: {action.dest}"):
            *others, last = list(action.choices)
            what = "an analysis" if action.dest == "analysis" else f"a {action.dest}"
            return f"name {what}: {', '.join(others)} or {last}" if others else \
                f"name {what}: {last}"
    return None


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


def _k_value(text: str) -> int:
    """An argparse type for ``--ks K [K ...]``: :func:`_integer` from 1, and where the value is
    a path, what happened: ``kdml eval --ks 1 2 RUN`` reads RUN as one more K."""
    try:
        return _integer(1)(text)
    except argparse.ArgumentTypeError as error:
        if not Path(text).exists():
            raise
        raise argparse.ArgumentTypeError(f"{error}, a path read as one more K; put the run "
                                         "folder before --ks") from None


def _fraction(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {value}")
    return value


def _path(text: str) -> Path:
    """An argparse type: a path, never empty (an empty one would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty one")
    try:
        return home_expanded(text)
    except KdmlError as error:  # argparse words a ValueError as "invalid _path value"
        raise argparse.ArgumentTypeError(str(error)) from None


def _device(text: str) -> str:
    """An argparse type: auto, cpu, cuda or cuda:N (whether this machine has it is checked
    where the device is used)."""
    from kdml.config import device_name_problem  # here, not at start-up: it imports numpy

    problem = device_name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


class _OneFile(argparse.Action):
    """``--config FILE``, refused when given twice: argparse keeps the last, and the first
    file's settings were dropped without a word (kdml reads one config file, it merges none)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        given = getattr(namespace, self.dest, None)
        if given is not None:
            parser.error(f"{option_string} is given twice ({given} and {values}); kdml reads "
                         "one config file: put the settings in one, or give the other's as "
                         "key=value")
        setattr(namespace, self.dest, values)


MAX_SEED = 2**63 - 1  # seeds feed NumPy's SeedSequence and torch generators
DEFAULT_REPORT = Path("docs/reproduction.md")  # kdml reproduce --out
MAX_SEEDS = 1000  # kdml reproduce --seeds


def command_parser(parser: argparse.ArgumentParser,
                   args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` were parsed for (``kdml plot retrieval``'s, say):
    an error found after parsing then points at that command's ``--help``, which lists its
    options, not at ``kdml --help``, which lists only the commands."""
    current = parser
    while True:
        chosen = next((action.choices[getattr(args, action.dest)] for action in current._actions
                       if isinstance(action, argparse._SubParsersAction)
                       and getattr(args, action.dest, None) in action.choices), None)
        if chosen is None:
            return current
        current = chosen


# The plots' other names (TrainedRun.variant), so that no command's plot replaces another's.
_VARIANT_NAMES = ("{name}-best.png with --best; {name}-test.png with --test, of a run that "
                  "validated")


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
    _add_setting_flags(train)
    train.add_argument("--out", type=_path,
                       help="run folder: new, empty, or one whose run stopped before its first "
                       "checkpoint (default: runs/RECIPE-DATASET-TIME)")
    train.add_argument("--resume", type=_path, metavar="RUN_DIR",
                       help="continue an interrupted run from its last checkpoint")
    _add_no_progress(train)

    evaluate = commands.add_parser(
        "eval", help="evaluate a run's last (or --best) checkpoint",
        description="Score a run's last (or --best) checkpoint on its test part (a run that "
        "validated: its validation part, or the test part with --test), print the metrics and "
        "write them to RUN/eval.json (eval-best.json with --best; eval-test.json with --test, "
        "of a run that validated). A file of that name kdml did not write is refused before "
        "scoring: move it away.")
    evaluate.add_argument("run_dir", type=_path)
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
    # extend: `--ks 1 --ks 5` scores both (argparse's default kept the last, dropping Recall@1)
    evaluate.add_argument("--ks", type=_k_value, nargs="+", action="extend", metavar="K",
                          help="the Recall@K values to score (default: the run's eval.ks; "
                          "repeatable, the values add up)")
    _add_data_root(evaluate)
    _add_device(evaluate)
    _add_no_progress(evaluate)

    analyze = commands.add_parser("analyze", help="analyses of a trained run")
    analyses = analyze.add_subparsers(dest="analysis", required=True, parser_class=_Parser)
    general = analyses.add_parser(
        "generalization", help="H-divergence and lambda between seen and unseen classes",
        description="Estimate the H-divergence and lambda of Chu et al. 2020 (Sec. 2) with "
        "nearest-neighbour classifiers on a trained run's embeddings.")
    general.add_argument("run_dir", type=_path)
    _add_data_root(general)
    _add_device(general)
    _add_no_progress(general)
    general.add_argument("--repeats", type=_integer(2), default=10,
                         help="random splits (default 10; at least 2, for the 95%% interval)")
    general.add_argument("--labelled-fraction", type=_fraction, default=0.5,
                         help="share of each set the classifiers are fitted on (default 0.5)")
    general.add_argument("--neighbors", type=_integer(1), default=1,
                         help="k of the k-NN (default 1)")
    general.add_argument("--seed", type=_integer(0, 2**32 - 1), default=0,
                         help="seed of the random splits (default 0)")

    plot = commands.add_parser("plot", help="plots of a trained run")
    plots = plot.add_subparsers(dest="plot", required=True, parser_class=_Parser)
    charts = plots.add_parser(
        "charts", help="d = 2 charts of an Atlas run: one panel per chart, test points by class",
        description="Plot the test points of an Atlas run (d = 2) at their chart coordinates, "
        "one panel per chart, coloured by class, with image thumbnails (Korman, Sec. A.2).")
    _add_plotted_run(charts)
    charts.add_argument("--thumbnails", type=_integer(0), default=100,
                        help="images drawn as thumbnails in each chart's panel, at most "
                        "(0 = points only; default 100)")

    embed = commands.add_parser(
        "embed", help="write a run's embeddings of a split to an .npz",
        description="Embed a split (or another dataset) with a trained run's model; writes "
        "embeddings, labels, positions, sources and, for Atlas runs, chart codes.")
    embed.add_argument("run_dir", type=_path)
    _add_split_options(embed)
    _add_best(embed)
    _add_test_part(embed)
    embed.add_argument("--out", type=_path, required=True, help="the .npz to write")

    index = commands.add_parser(
        "index", help="build a faiss index of a run's embeddings",
        description="Build a search index of a split's embeddings: exact by default, IVF or "
        "HNSW for large galleries; Atlas runs get one index per chart.")
    index.add_argument("run_dir", type=_path)
    _add_split_options(index, "searched", "the part to index (default: the gallery where the "
                       "data has one, as In-Shop, else test)")
    _add_best(index)
    _add_test_part(index)
    index.add_argument("--out", type=_path, required=True, help="a new index folder")
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
    search.add_argument("run_dir", type=_path)
    search.add_argument("--index", type=_path, required=True, metavar="DIR",
                        help="an index folder 'kdml index' wrote of this run")
    search.add_argument("--query", type=_path, required=True, metavar="IMAGE_OR_NPZ",
                        help="an image, or an .npz of 'embeddings' or raw 'inputs'")
    search.add_argument("-k", type=_integer(1), default=10, help="neighbours (default 10)")
    search.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_best(search)
    _add_data_root(search)
    _add_device(search, "; only image and 'inputs' queries run it")
    _add_no_progress(search)

    retrieval = plots.add_parser(
        "retrieval", help="queries and their nearest images, hits and misses marked",
        description="Draw random test queries and their top-K images (the gallery's where the "
        "metrics search one, else the other test images) into plots/retrieval.png "
        f"({_VARIANT_NAMES.format(name='retrieval')}), each result framed green (same class) "
        "or red.")
    _add_plotted_run(retrieval)
    # A grid of thumbnails past 64 a side is too large to read (and to draw: 10,000 of them
    # made a 116,480-pixel-wide PNG).
    retrieval.add_argument("--queries", type=_integer(1, 64), default=8,
                           help="rows of the grid (default 8, at most 64)")
    retrieval.add_argument("-k", type=_integer(1, 64), default=8,
                           help="neighbours per query (default 8, at most 64)")
    retrieval.add_argument("--seed", type=_integer(0, 2**32 - 1), default=0,
                           help="seed of the queries' draw (default 0)")
    embedding = plots.add_parser(
        "embedding", help="a 2-D map of the test embeddings, by class (UMAP or t-SNE)",
        description="Map the test embeddings to 2-D with UMAP when umap-learn is installed, "
        "else t-SNE (scikit-learn), into plots/embedding.png "
        f"({_VARIANT_NAMES.format(name='embedding')}).")
    _add_plotted_run(embedding)
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
    # at most MAX_SEEDS: far beyond any use; a huge count had planned for minutes, unsaid
    reproduce.add_argument("--seeds", type=_integer(1, MAX_SEEDS), default=None,
                           help="seeds per cell, 0..N-1 (default 5; 3 with --quick)")
    reproduce.add_argument("--quick", action="store_true",
                           help="a few steps per run and a small grid: checks the pipeline in "
                           "minutes on a CPU; its numbers say nothing about the methods")
    reproduce.add_argument("--device", type=_device, default="auto",
                           help="cpu, cuda, cuda:N or auto (default)")
    reproduce.add_argument("--out", type=_path, default=None,
                           help="the report, a .md file (default docs/reproduction.md, or "
                           "reproduction.md in the runs folder with --quick); plots go beside "
                           "it, to OUT's name without .md plus -plots/")
    reproduce.add_argument("--runs", type=_path, default=None,
                           help="where the runs go (default runs/reproduce, or "
                           "runs/reproduce-quick)")
    reproduce.add_argument("--only", action="append", metavar="PATTERN", default=[],
                           help="run only the experiments whose key matches (shell pattern, "
                           "e.g. 'jrd-table2-*'; repeatable)")
    reproduce.add_argument("--list", action="store_true",
                           help="list the experiments and their cells, train nothing")
    _add_no_progress(reproduce)

    commands.add_parser("datasets", help="list the datasets")
    commands.add_parser("recipes", help="list the recipes")
    config = commands.add_parser(
        "config", help="print a recipe's configuration: every key with its value",
        description="Print the configuration RECIPE resolves to (defaults < --config < "
        "key=value and the flags), as YAML: every key 'kdml train' accepts. Of a --config "
        "file with a grid: the first cell's config, the grid named in a comment and checked "
        "as 'kdml train' checks it.")
    config.add_argument("recipe", nargs="?",
                        help="recipe name (see 'kdml recipes'); optional with a --config file "
                        "that names one")
    config.add_argument("overrides", nargs="*", metavar="key=value", default=[])
    _add_setting_flags(config)
    return parser


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """``kdml train``'s and ``kdml config``'s flags that give settings (--config, and those of
    cli.train.FLAG_KEYS): a train command with ``config`` for ``train`` prints the config it
    would train."""
    parser.add_argument("--dataset", help="dataset name, folder:DIR, csv:FILE, a domain pair "
                        "(SOURCE->TARGET, npz:PATH); see 'kdml datasets'")
    parser.add_argument("--data-root", metavar="DIR", type=_path,
                        help="folder of an on-disk dataset (data.root)")
    parser.add_argument("--config", type=_path, help="YAML file with config values",
                        action=_OneFile)
    parser.add_argument("--weights", metavar="FILE", type=_path,
                        help="pretrained backbone weights, a local .pth or .safetensors file "
                        "(model.weights)")
    parser.add_argument("--seed", type=_integer(0, MAX_SEED), help="random seed (train.seed)")
    parser.add_argument("--device", type=_device,
                        help="cpu, cuda, cuda:N or auto (train.device; default auto)")


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
    _add_device(parser)
    _add_no_progress(parser)


def _add_plotted_run(parser: argparse.ArgumentParser) -> None:
    """The run a ``kdml plot`` draws, and which of its checkpoints, parts and data."""
    parser.add_argument("run_dir", type=_path)
    _add_best(parser)
    _add_test_part(parser)
    _add_data_root(parser)
    _add_device(parser)
    _add_no_progress(parser)


def _add_device(parser: argparse.ArgumentParser, note: str = "") -> None:
    """Where the command runs the run's model (:func:`~kdml.training.build.run_device`)."""
    parser.add_argument("--device", type=_device, default=None,
                        help="where the run's model runs: cpu, cuda, cuda:N or auto (default: "
                        f"where the run trained, if this machine has it, else auto{note})")


def _add_no_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true",
                        help="hide progress bars (shown only on a terminal anyway)")


def _add_best(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--best", action="store_true",
                        help="use checkpoints/best.pt (runs with train.keep_best), not last.pt")


def _add_test_part(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--test", action="store_true",
                        help="for a run that validated (data.validation): use the test part, "
                        "which its training and choices never saw, not the validation part (a "
                        "run that did not validate uses it anyway)")


def _data_folder(text: str) -> Path:
    """An argparse type: :func:`_path`, made absolute, so that the sources an index or an
    embedding file records lead to the images from any folder (train's config records it so
    too). A file is refused: for ``csv:FILE`` it is the folder the list lies in."""
    folder = _path(text).absolute()
    try:
        is_file = folder.is_file()
    except OSError as error:  # a name longer than the file system takes
        raise argparse.ArgumentTypeError(f"{text}: {error.strerror or error}") from None
    if is_file:
        raise argparse.ArgumentTypeError(f"{text} is a file; give the folder the data lies in "
                                         "(for csv:FILE, the folder of the list)")
    return folder


def _add_data_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-root", metavar="DIR", type=_data_folder,
                        help="where the run's on-disk dataset is now, if it moved (for "
                        "folder:DIR the folder itself, for csv:FILE the folder of the list)")
