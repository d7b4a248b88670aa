"""The commands that read a trained run: ``kdml eval``, ``analyze``, ``plot``, ``embed``,
``index`` and ``search``."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import sys
import unicodedata
from typing import TYPE_CHECKING

from kdml.cli.output import _print_results, _progress
from kdml.errors import KdmlError, counted, one_line

# eval.json's fields that every kdml has written (written_by_kdml: a file lacking one is a
# user's, never replaced)
EVAL_FIELDS = ("epoch", "metrics")

if TYPE_CHECKING:  # the commands import their modules lazily, to keep start-up fast
    from kdml.config import RunConfig
    from kdml.data.splits import DataSplits
    from kdml.evaluation.evaluator import Embedder
    from kdml.inspection.parts import Part
    from kdml.training.loading import RunModel, TrainedRun


def _eval(args: argparse.Namespace) -> int:
    from kdml.training.checks import check_evaluation, warn_about_target
    from kdml.training.loading import load_run
    from kdml.training.run_folder import check_json_replaceable, write_json

    if args.dataset is not None:
        return _eval_other_dataset(args)
    trained = load_run(args.run_dir, args.data_root, best=args.best, test_part=args.test,
                       progress=_progress(args), device=args.device)
    config = _with_ks(trained.config, args.ks)
    # also without --ks: config.yaml's eval section may have been edited (eval.ks beyond the
    # references had reached the scorer's "K=5000 in ks is larger than ...", saying no fix)
    check_evaluation(config, trained.splits, evaluating=True, ks_given=bool(args.ks))
    # as training warns: a labelled target of one class (or of no source class) scores the
    # data, not the model; eval had printed its trivial 1s (or its 0) without a word
    warn_about_target(trained.splits, logging.getLogger("kdml.eval"))
    result = {"epoch": trained.epoch, "checkpoint": "best" if args.best else "last",
              "scored": "validation" if trained.splits.validation else "test"}
    # eval-best.json, eval-test.json, ... as the plots are named: --best had replaced the last
    # checkpoint's eval.json, --test the validation part's
    path = trained.run.root / f"eval{trained.variant}.json"
    check_json_replaceable(path, EVAL_FIELDS)
    metrics = _score(trained, config, trained.splits, trained.embedder, args.best)
    try:  # written before the table is printed: `kdml eval RUN | head` ends the process at
        # the table's first line past head's (SIGPIPE), and eval.json had been lost with it
        # the run folder checked again: moved or deleted while scored, it had been made again
        write_json({**result, "metrics": metrics, **_unreadable_record(trained.splits)},
                   trained.run.output(path), EVAL_FIELDS)
    finally:  # also where eval.json cannot be written (an archived, read-only run folder)
        _print_results(config, metrics, trained.run.root, trained.splits.validation)
    return 0


def _unreadable_record(splits: DataSplits) -> dict[str, dict[str, dict[str, object]]]:
    """eval.json's record of the test (and gallery) images ``data.on_bad_image=skip`` left out
    of this scoring, each part's count listed and files left out: its metrics are of the
    others, which the printed warning alone did not keep. ``{}`` where none was."""
    record: dict[str, dict[str, object]] = {}
    for part, positions in splits.unreadable.items():
        dataset = splits.test if part == "test" else splits.gallery
        if dataset is not None and len(positions):
            record[part] = {"listed": len(dataset),
                            "left_out": [dataset.source_of(int(i)) for i in positions]}
    return {"unreadable": record} if record else {}


def _eval_other_dataset(args: argparse.Namespace) -> int:
    """``kdml eval RUN --dataset D``: the run's model scored on D's test part. Nothing is
    written: the run folder's ``eval.json`` is of the run's own data."""
    from kdml.inspection.parts import other_data
    from kdml.training.checks import check_evaluation, warn_about_target
    from kdml.training.loading import load_model

    _refuse_test_with_dataset(args)
    # without the run's data where it can
    model = load_model(args.run_dir, best=args.best, progress=_progress(args), device=args.device)
    other, splits, embedder = other_data(model, args.dataset,
                                         None if args.data_root is None else str(args.data_root))
    other = _with_ks(other, args.ks)
    # one class would score 1 everywhere, as training refuses
    check_evaluation(other, splits, evaluating=True, ks_given=bool(args.ks))
    warn_about_target(splits, logging.getLogger("kdml.eval"))  # as in _eval
    metrics = _score(model, other, splits, embedder, args.best)
    _print_results(other, metrics, model.run.root, validated=False)
    return 0


def _with_ks(config: RunConfig, ks: list[int] | None) -> RunConfig:
    """``config`` scoring Recall@K at ``ks`` (``kdml eval --ks``; None: its eval.ks)."""
    if not ks:
        return config
    return dataclasses.replace(config, eval=dataclasses.replace(config.eval,
                                                                ks=sorted(set(ks))))


def _score(trained: RunModel, config: RunConfig, splits: DataSplits, embedder: Embedder,
           best: bool) -> dict[str, float]:
    """The metrics of ``trained``'s model on ``splits`` (``config`` names the data and its
    eval settings), after ``kdml eval``'s first lines: the checkpoint and the test set."""
    from kdml.evaluation.evaluator import score_method

    print(f"{'best' if best else 'last'} checkpoint: epoch {trained.epoch}")
    print(f"test set: {splits.test_set}")
    metrics = score_method(trained.method, splits, config.eval, embedder).recorded()
    if splits.unreadable:  # counted again: only decoding finds the images it left out
        print(f"test set: {splits.test_set}")
    return metrics


def _analyze_generalization(args: argparse.Namespace) -> int:
    from kdml.evaluation.generalization import check_scored_counts, distance_note
    from kdml.inspection.analysis import (
        GeneralizationSettings,
        analyze_generalization,
        check_unseen_classes,
        labelled_count,
    )
    from kdml.training.loading import load_run

    settings = GeneralizationSettings(args.labelled_fraction, args.repeats, args.neighbors,
                                      args.seed)
    # from the config alone: loading the data and model first took seconds to minutes
    check_unseen_classes(args.run_dir)
    trained = load_run(args.run_dir, args.data_root, progress=_progress(args), device=args.device)
    # before minutes of embedding (checked again on the embedded sets); with a gallery, the
    # unseen samples are the queries and the gallery, of which the labelled alone are scored
    check_scored_counts(len(trained.splits.train), labelled_count(trained.splits.test_parts),
                        args.labelled_fraction, "--labelled-fraction", args.neighbors)
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
    from kdml.inspection.plots import check_chartable, draw_charts
    from kdml.training.loading import run_config
    from kdml.training.run_folder import RunFolder

    # from the config alone: loading the data and model first took seconds to minutes (and a
    # validated run's note on its validation part came before the refusal)
    check_chartable(run_config(RunFolder.existing(args.run_dir)))
    path = draw_charts(_plotted_run(args), args.thumbnails)
    print(f"chart plot written to {path}")
    return 0


def _refuse_test_with_dataset(args: argparse.Namespace) -> None:
    """Refuse ``--test`` with ``--dataset``: another dataset has no validation part standing
    in for its test part (``embed`` and ``index`` had taken it without a word)."""
    if args.test and args.dataset is not None:
        raise KdmlError("--test picks a validated run's own test part; with --dataset that "
                        "dataset's own parts are read anyway: drop --test")


def _run_and_part(args: argparse.Namespace) -> tuple[RunModel, Part]:
    """The run of ``args.run_dir`` and the ``--split`` part of its data (``--test``: of its
    test part), or of ``--dataset`` (then ``--data-root`` is that dataset's root, not the
    run's, and the model is rebuilt without the run's data where its folder records what it
    takes); a note on stderr where "test" is a validation part."""
    from kdml.inspection.parts import dataset_part, run_part
    from kdml.training.loading import load_model, load_run

    _refuse_test_with_dataset(args)
    if args.test and args.split == "train":  # the test part's load counts validation as trained
        raise KdmlError("--test picks the test part; with --split train it would add the "
                        "validation classes, which the run did not train on: drop --test")
    if args.dataset is not None:
        model = load_model(args.run_dir, best=args.best, progress=_progress(args),
                           device=args.device)
        return model, dataset_part(model, args.dataset, args.data_root, args.split)
    trained = load_run(args.run_dir, args.data_root, best=args.best, test_part=args.test,
                       progress=_progress(args), device=args.device)
    part = run_part(trained, args.split)
    _note_validation_part(part)
    return trained, part


def _plotted_run(args: argparse.Namespace) -> TrainedRun:
    """The run a plot draws: its test part (``--test``), or a validated run's validation part,
    which is then said on stderr."""
    from kdml.inspection.parts import run_part
    from kdml.training.loading import load_run

    trained = load_run(args.run_dir, args.data_root, best=args.best, test_part=args.test,
                       progress=_progress(args), device=args.device)
    _note_validation_part(run_part(trained))
    return trained


def _note_validation_part(part: Part) -> None:
    """Say on stderr where a validated run's "test" is its validation part."""
    from kdml.inspection.parts import validation_note

    note = validation_note(part)
    if note:
        print(f"kdml: note: {note}", file=sys.stderr)


def _embed(args: argparse.Namespace) -> int:
    from kdml.inspection.parts import check_npz_out, embed_part, write_npz

    check_npz_out(args.out)  # before the run is loaded and embedded
    trained, part = _run_and_part(args)
    arrays = embed_part(trained, part)
    path = write_npz(args.out, arrays)
    print(f"{counted(len(arrays['labels']), 'embedding')} of size "
          f"{arrays['embeddings'].shape[1]} written to {path}")
    return 0


def _index(args: argparse.Namespace) -> int:
    from kdml.inspection.parts import index_part

    trained, part = _run_and_part(args)
    info = index_part(trained, part, args.out, args.kind)
    charts = ("" if info.charts is None else
              f", {len(info.charts)} chart{'' if len(info.charts) == 1 else 's'}")
    print(f"{info.kind} {info.metric} index of {info.count} {info.dim}-d vectors{charts} "
          f"written to {args.out}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from kdml.data.registry import check_root_is_read, relocated
    from kdml.inspection.search import results_as_json, run_without_data, score_name, search
    from kdml.training.loading import load_model

    def model() -> RunModel:  # images and 'inputs' only: embeddings need no model
        return load_model(args.run_dir, best=args.best, data_root=args.data_root,
                          progress=_progress(args), device=args.device)

    run = run_without_data(args.run_dir, args.best)
    if args.data_root is not None:  # read for image queries only: refused at once where its
        # data reads no root, as eval refuses it, not ignored for a query of embeddings
        check_root_is_read(*relocated(run.config.data.dataset, args.data_root))
    results = search(run, args.index, args.query, args.k, model)
    short = sum(len(result["neighbours"]) < args.k for result in results)
    if short:  # an exact index holds too few items (in the query's chart) or ivf/hnsw missed
        print(f"kdml: note: {short} of {counted(len(results), 'query', 'queries')} found "
              f"fewer than {args.k} neighbour{'' if args.k == 1 else 's'}: the index holds "
              "fewer (in their chart), or an ivf or hnsw index missed some", file=sys.stderr)
    if args.json:
        print(results_as_json(results))
        return 0
    class_names = [one_line(item["class_name"]) for result in results
                   for item in result["neighbours"] if "class_name" in item]
    width = max([5, *map(_columns, class_names)]) if class_names else 0

    def named(text: str) -> str:  # a column only where the classes have names
        return f"{text}{' ' * (width - _columns(text))}  " if width else ""

    for result in results:
        print(f"query {one_line(result['query'])}:")
        score = score_name(result["metric"])  # cosine similarity or Euclidean distance
        print(f"  {'rank':>4}  {score:>10}  {'label':>6}  {named('class')}source")
        for item in result["neighbours"]:
            shown = (score_text(item["score"]) if result["metric"] != "cosine"
                     else f"{item['score']:.4f}")
            print(f"  {item['rank']:>4}  {shown:>10}  {item['label']:>6}  "
                  f"{named(one_line(item.get('class_name', '')))}{one_line(item['source'])}")
    return 0


def score_text(distance: float) -> str:
    """A search table's Euclidean distance, to 4 places as similarities are, but to at least 4
    significant digits: distances are in the embeddings' own units, and an Atlas run's chart
    coordinates may spread over 1e-3 (a network near its initialisation), where 4 places
    printed a neighbour at 0.0000 or two at distances that differ as the same 0.0003.
    Below 1e-5, scientific notation keeps the column 10 wide."""
    if distance == 0 or not math.isfinite(distance) or abs(distance) >= 0.1:
        return f"{distance:.4f}"
    if abs(distance) < 1e-5:
        return f"{distance:.3e}"
    return f"{distance:.{3 - math.floor(math.log10(abs(distance)))}f}"


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
    from kdml.inspection.plots import plot_retrieval

    path = plot_retrieval(_plotted_run(args), args.queries, args.k, args.seed)
    print(f"retrieval grid written to {path}")
    return 0


def _plot_embedding(args: argparse.Namespace) -> int:
    from kdml.inspection.plots import plot_embedding

    path = plot_embedding(_plotted_run(args), args.max_points)
    print(f"embedding map written to {path}")
    return 0
