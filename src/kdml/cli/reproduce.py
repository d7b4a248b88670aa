"""``kdml reproduce``: run the experiment catalog and write its report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kdml.cli.output import _progress, _stop_code
from kdml.cli.parser import DEFAULT_REPORT
from kdml.errors import KdmlError, counted

if TYPE_CHECKING:  # the commands import their modules lazily, to keep start-up fast
    import torch

    from kdml.reproduce.experiments import Experiment
    from kdml.reproduce.runner import ExperimentResult


def _reproduce(args: argparse.Namespace) -> int:
    import fnmatch

    from kdml import distributed
    from kdml.file_write import check_writable_folder
    from kdml.launch import launched_by_torchrun
    from kdml.reproduce.catalog import PAPERS, experiments
    from kdml.reproduce.report import (
        check_outputs,
        check_plots,
        check_quotable,
        keep_reported,
    )
    from kdml.reproduce.runner import check_runs_folder, reproduce
    from kdml.training.build import resolve_device
    from kdml.training.run_folder import hold_folder

    if launched_by_torchrun():
        raise distributed.refusal("kdml reproduce trains its runs one after another in one "
                                  "process; run it without torchrun (each run may use one GPU "
                                  "via --device)")

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
        # a key of another paper's catalog: where it is, rather than this paper's keys alone
        elsewhere = {pattern: [paper for paper in PAPERS if paper != args.paper
                               and any(matches(experiment, [pattern])
                                       for experiment in experiments(paper))]
                     for pattern in unmatched}
        owned = "; ".join(f"{pattern} {_of_papers(papers, pattern)}"
                          for pattern, papers in elsewhere.items() if papers)
        if owned and all(elsewhere.values()) and not quick:
            raise KdmlError(f"--only {' '.join(unmatched)} matches no experiment of "
                            f"{args.paper}: {owned}")
        raise KdmlError(f"--only {' '.join(unmatched)} matches no experiment of "
                        f"{args.paper}{quick}; {owned + '; ' if owned else ''}the keys are: "
                        f"{keys}")
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
    # first: with --quick the report goes into the runs folder, whose fault is --runs'
    check_quotable(runs, "--runs")
    check_writable_folder(runs, "choose another --runs")
    check_runs_folder(runs)
    check_outputs(report)
    device = resolve_device(args.device, "--device")
    # The report at --out keeps its other sections, with --only or without: they are read
    # again from their finished runs (never trained here), and one that cannot be is refused
    # before anything trains, not dropped (`kdml reproduce dtml` keeps a report's JRD tables).
    catalog = experiments("all", args.quick)
    chosen = keep_reported(chosen, catalog, report, seeds, args.quick, runs, str(device))
    check_plots(report, chosen)
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


def _of_papers(papers: list[str], pattern: str) -> str:
    """Whose experiment the ``--only`` key ``pattern`` names (or a pattern with wildcards
    matches): ``"is an experiment of 'kdml reproduce atlas'"``."""
    commands = " and ".join(f"'kdml reproduce {paper}'" for paper in papers)
    if any(wildcard in pattern for wildcard in "*?["):
        return f"matches experiments of {commands}"
    return f"is an experiment of {commands}"


def _default_runs(quick: bool) -> Path:
    return Path("runs/reproduce-quick" if quick else "runs/reproduce")


def _write_reproduction(args: argparse.Namespace, catalog: list[Experiment],
                        chosen: list[Experiment], results: list[ExperimentResult], report: Path,
                        runs: Path, seeds: int, device: torch.device) -> int:
    """Write ``kdml reproduce``'s report of ``results``; the exit code. ``catalog``: every
    experiment (``experiments("all", args.quick)``), of which the report lists the paper's
    others as not run."""
    import shlex
    from collections import Counter

    import torch

    from kdml import __version__
    from kdml.machine import machine_description
    from kdml.reproduce.report import (
        ReportContext,
        distinct_runs,
        reported_sections,
        training_minutes,
        write_report,
    )

    read = distinct_runs(results)  # a run several tables read counts once
    trained_on = tuple(Counter(machine for _, machine in read.values()).most_common())

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
        versions=f"torch {torch.__version__}, kdml {__version__}",
        wall_minutes=training_minutes(read),
        seeds=seeds, quick=args.quick, out=shlex.quote(out) if out else "",
        runs=shlex.quote(other_runs) if other_runs else "", device=str(device),
        trained_on=trained_on)
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
    # a section with numbers that failed to be read again would become "Not run here"
    held = {section.key for section in reported_sections(report)}
    losing = [result.experiment.key for result in failed if result.experiment.key in held]
    if losing:
        print(f"{report} is left as it was: it holds the numbers of {', '.join(losing)}, which "
              "could not be read again (said above); the runs that ran are kept, and the same "
              "command writes the report once that is mended", file=sys.stderr)
        return 1
    path = write_report(results, report, context, not_run)
    print(f"report written to {path} ({len(results) - len(failed)} of "
          f"{counted(len(results), 'experiment')})")
    return 1 if failed else 0
