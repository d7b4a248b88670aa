"""The reproduction report: Markdown tables of mean +- 95% CI over seeds, the paper's numbers
beside them, a one-line verdict per claim, and PNG plots in a folder next to the report.

The report and its plot folder carry a marker, and kdml overwrites only files that carry it
(:func:`check_outputs`): a hand-written ``docs/reproduction.md`` is never replaced.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kdml.config import RunConfig, flatten, resolve_config
from kdml.errors import KdmlError, check_not_a_link, counted
from kdml.evaluation.estimate import Estimate
from kdml.figure_file import check_replaceable, copy_png, drawn_by_kdml
from kdml.file_write import check_writable_folder, write_through_new_file
from kdml.reproduce.experiments import Claim, Experiment, finished, metric_name, verdict
from kdml.reproduce.plots import plot_sweep
from kdml.reproduce.runner import ExperimentResult, all_finished
from kdml.training.recipes import get_recipe

MARKER = "<!-- Written by kdml reproduce; it rewrites this file on every run. -->"
PLOTS_MARKER = ".written-by-kdml-reproduce"
PAPER_TITLES = {
    "jrd": "JRD (Chu et al., ICML 2020)",
    "atlas": "Atlas (Korman)",
    "dtml": "DTML (Hu, Lu and Tan, CVPR 2015)",
}


@dataclass(frozen=True)
class ReportContext:
    """What the report's header says about the run."""

    command: str  # the command that wrote it
    machine: str  # the device and host, in words
    versions: str  # torch and kdml versions
    wall_minutes: float  # total training wall time of the runs the report reads
    seeds: int
    quick: bool
    out: str = ""  # a report path other than the default: the commands it prints name it
    runs: str = ""  # a runs folder other than the default: the commands it prints name it
    # the device the runs trained on: run folders hash the device, so the commands it prints
    # name it to find the report's runs on any machine ("": commands without --device)
    device: str = ""
    # (machine, how many runs trained on it) for the runs the report reads, most first; ""
    # for runs recorded before kdml kept the machine. Said where it is not just ``machine``.
    trained_on: tuple[tuple[str, int], ...] = ()


def plots_folder(report: Path) -> Path:
    return report.with_name(report.stem + "-plots")


def check_outputs(report: Path) -> None:
    """Refuse, before anything trains, to overwrite a report or plot folder kdml did not write.
    """
    if report.suffix != ".md":  # the plot folder is named by the stem: y.md and y.txt shared it
        raise KdmlError(f"--out {report}: a report is Markdown; give a path ending in .md")
    check_quotable(report, "--out")
    check_writable_folder(report.parent)
    check_not_a_link(report)
    if report.exists():
        if not report.is_file():
            raise KdmlError(f"--out {report} is not a file; choose another --out")
        with report.open(errors="replace") as handle:
            if handle.readline().strip() != MARKER:
                raise KdmlError(f"{report} was not written by kdml reproduce and would be "
                                "replaced; choose another --out")
    plots = plots_folder(report)
    if plots.exists() and not plots.is_dir():  # "holds files" misled: it is one
        raise KdmlError(f"{plots} is a file, where the report's plots folder goes; move it or "
                        "choose another --out")
    if plots.exists() and any(plots.iterdir()) and not (plots / PLOTS_MARKER).is_file():
        raise KdmlError(f"{plots} holds files kdml reproduce did not write; move it or choose "
                        "another --out")


def check_quotable(path: Path, option: str) -> None:
    """Refuse an ``--out`` or ``--runs`` that a section's command cannot name: the command is
    in a Markdown code span, which a backtick in the path ends, so the section was not read
    back and the next rewrite of the report dropped it (a line break ends the line it is
    read from)."""
    if "`" in str(path) or "\n" in str(path):
        raise KdmlError(f"{option} {str(path)!r} holds a backtick or a line break, which would "
                        "cut the report's commands short; choose a path without one")


def _sweep_plot(plots: Path, experiment: Experiment) -> Path:
    """Where an experiment's sweep plot goes in the report's plot folder ``plots``."""
    return plots / f"{experiment.key}.png"


def _charts_plot(plots: Path, experiment: Experiment) -> Path:
    """Where an experiment's chart plot goes in the report's plot folder ``plots``."""
    return plots / f"{experiment.key}-charts.png"


def check_plots(report: Path, chosen: Sequence[Experiment]) -> None:
    """Refuse, before anything trains, a file kdml did not draw where the report's plots of
    ``chosen`` go (the write at the end had refused it, after hours of training)."""
    plots = plots_folder(report)
    for experiment in chosen:
        if experiment.sweep:
            check_replaceable(_sweep_plot(plots, experiment))
        if any(cell.plot_charts for cell in experiment.cells):
            check_replaceable(_charts_plot(plots, experiment))


# how a section names the command that wrote it (see _experiment_section)
SECTION_COMMAND = re.compile(r"Command: `(kdml reproduce [^`]*)`")


@dataclass(frozen=True)
class Section:
    """An experiment's section of a report kdml wrote, as its command names it."""

    key: str
    seeds: int | None  # None: its command does not say
    quick: bool


def reported_sections(report: Path) -> list[Section]:
    """The sections with numbers of the report at ``report`` (none when there is no file):
    one that says "Not run here" holds none, so nothing of it can be lost."""
    if not report.is_file():
        return []
    sections: list[Section] = []
    current: Section | None = None
    for line in report.read_text(errors="replace").splitlines():
        if line.startswith("#"):
            sections += [current] if current else []
            current = None
        elif line.startswith("Not run here:"):  # its section holds no numbers to keep
            current = None
        elif (found := SECTION_COMMAND.search(line)) is not None:
            current = _section(found.group(1))
    return sections + ([current] if current else [])


def _section(command: str) -> Section | None:
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    value = {word: after for word, after in zip(words, words[1:], strict=False)}
    if "--only" not in value:
        return None
    seeds = value.get("--seeds", "")
    return Section(value["--only"], int(seeds) if seeds.isdigit() else None, "--quick" in words)


def keep_reported(chosen: Sequence[Experiment], catalog: Sequence[Experiment], report: Path,
                  seeds: int, quick: bool, runs: Path, device: str) -> list[Experiment]:
    """``chosen`` (a paper's experiments, or those ``--only`` picks) and the other experiments
    whose numbers ``report`` holds, in ``catalog``'s order: their runs finished in ``runs``, so
    rewriting the report reads them again and trains nothing. Refuses, before anything trains,
    when one of them cannot be read so (another setting, or runs not there): the report would
    lose its section. The same with ``--only`` and without: ``kdml reproduce dtml`` on a
    report that holds JRD's tables keeps them."""
    keys = {experiment.key for experiment in chosen}
    by_key = {experiment.key: experiment for experiment in catalog}
    lost = []
    unknown = 0  # sections of experiments kdml does not have: no setting reads them
    kept = set()
    for section in reported_sections(report):
        if section.key in keys:
            continue
        if section.quick != quick or section.seeds not in (None, seeds):
            written = " ".join([*([f"--seeds {section.seeds}"] if section.seeds is not None
                                  else []), *(["--quick"] if section.quick else [])])
            lost.append(f"{section.key} (written at {written or 'the full setting'})")
        elif section.key not in by_key:  # no setting can read it: say so, not "not finished"
            lost.append(f"{section.key} (an experiment this kdml does not have: renamed or "
                        "removed since it was written)")
            unknown += 1
        elif all_finished(by_key[section.key], seeds, runs, device):
            kept.add(section.key)
        else:
            lost.append(f"{section.key} (its runs at --seeds {seeds}{' --quick' * quick} on "
                        f"{device} are not all finished in {runs})")
    if lost:
        # each with its own reason: a section of other --seeds had been said to have runs
        # not finished, which they all were
        named = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        settings = ("" if unknown == len(lost) else
                    "give the --seeds, --runs and --device they were written with, ")
        raise KdmlError(
            f"{report} holds {len(lost)} section{'s' * (len(lost) != 1)} that this report "
            f"would drop: {named}; {settings}{'choose ' * (not settings)}another --out, or "
            f"delete {report} first")
    return [experiment for experiment in catalog
            if experiment.key in keys or experiment.key in kept]


def write_report(results: Sequence[ExperimentResult], report: Path, context: ReportContext,
                 not_run: Sequence[Experiment] = ()) -> Path:
    """Write the Markdown report (atomically) and its plots; returns the report's path.
    ``not_run`` lists the experiments left out (``--only``), each with its command."""
    check_outputs(report)
    plots = plots_folder(report)
    plots.mkdir(parents=True, exist_ok=True)
    (plots / PLOTS_MARKER).touch()
    lines = [MARKER, "", "# Reproduction", "", *_header(context)]
    for paper, title in PAPER_TITLES.items():
        chosen = [result for result in results if result.experiment.paper == paper]
        if not chosen:
            continue
        lines += ["", f"## {title}"]
        for result in chosen:
            lines += ["", *_experiment_section(result, plots, report.parent, context)]
    lines += _not_run_section(not_run, {result.experiment.dataset for result in results},
                              context, sibling_reports(report))
    text = "\n".join(lines) + "\n"
    previous = report.read_text(errors="replace") if report.is_file() else ""
    path = write_through_new_file(report, lambda partial: partial.write_text(text))
    _remove_unlinked_plots(plots, text, previous)
    return path


def _remove_unlinked_plots(plots: Path, text: str, previous: str) -> None:
    """Remove the PNGs of the report's plot folder (kdml's own: it carries the marker) that
    the report's ``previous`` text linked and its new ``text`` does not: a section not drawn
    this time (its charts not drawn, or not run here) leaves no plot of an earlier report
    behind as if it were this one's. Only plots the report itself drew, which carry kdml's
    mark: an image the user put there is kept, also one kdml drew elsewhere (a run's
    retrieval grid) that the user copied there, which every unlinked plot with kdml's mark
    had been."""
    if not (plots / PLOTS_MARKER).is_file():
        return
    linked = re.compile(rf"\]\(<?{re.escape(plots.name)}/([^/]+?\.png)>?\)")
    for name in set(linked.findall(previous)) - set(linked.findall(text)):
        path = plots / name
        if path.is_file() and not path.is_symlink() and drawn_by_kdml(path, marked=True):
            path.unlink()


def sibling_reports(report: Path) -> list[str]:
    """The names of the other reports ``kdml reproduce`` wrote into the report's folder."""
    names = []
    for path in sorted(report.parent.glob("*.md")):
        if path.name == report.name or not path.is_file():
            continue
        with path.open(errors="replace") as handle:
            if handle.readline().strip() == MARKER:
                names.append(path.name)
    return names


def _not_run_section(not_run: Sequence[Experiment], datasets: set[str],
                     context: ReportContext, siblings: Sequence[str] = ()) -> list[str]:
    """The experiments left out on this report's datasets, each with the command that adds it
    to this report. Those on other datasets are only counted, with the reports beside this one
    (``siblings``) that may hold them (as Fashion-MNIST's are beside the offline digits')."""
    if not not_run:
        return []
    listed = [experiment for experiment in not_run if experiment.dataset in datasets]
    elsewhere = sorted({experiment.dataset for experiment in not_run} - datasets)
    lines = ["", "## Not run for this report", ""]
    if listed:
        lines += ["Each is added to this report by its command (which reuses this report's "
                  "runs):", ""]
        lines += [f"- `{experiment.key}` ({experiment.mirrors}, {experiment.dataset}): "
                  f"`{_command(experiment, context)}`" for experiment in listed]
    if elsewhere:
        count = len(not_run) - len(listed)
        lines += [*([""] if listed else []),
                  f"{count} experiment{'s' if count > 1 else ''} on other datasets "
                  f"({', '.join(elsewhere)}) {'are' if count > 1 else 'is'} not listed here; "
                  "`kdml reproduce all --list` names every experiment."]
        if siblings:
            lines += ["", "Other reports of `kdml reproduce` beside this one: "
                      + ", ".join(f"[{name}]({name})" for name in siblings) + "."]
    return lines


def _header(context: ReportContext) -> list[str]:
    setting = ("the quick setting (a few steps per run: it checks the pipeline, its numbers "
               "say nothing about the methods)" if context.quick else
               "the recipes' defaults (docs/recipes.md sets each beside its paper's and says "
               "why where they differ), with the changes each table names")
    if context.seeds == 1:
        values = ("Values are from one seed (0): with one seed there is no interval over "
                  "seeds, and no claim can be tested (a difference between two runs does not "
                  "say whether it would survive another seed).")
    else:
        values = (f"Values are means over {context.seeds} seeds (0 to {context.seeds - 1}) +- "
                  "the half-width of their 95% confidence interval (Student t). A claim holds "
                  "when the 95% interval of the seed-paired difference lies above 0, does not "
                  "hold when it lies below, and is not shown otherwise.")
    return [
        f"Written by `{context.command}` on {context.machine} ({context.versions}); "
        f"{context.wall_minutes:.1f} minutes of training in all{_trained_on(context)}. "
        f"Settings: {setting}.",
        "",
        "The papers' datasets (CUB-200-2011, Cars196, SOP, LFW, CIFAR-10) are not offline, so "
        "no row is a reproduction of a paper's table on its own data: each table runs the "
        "offline dataset named in its heading, and the `paper` columns give the paper's "
        f"numbers on its data, for orientation only. {values} Nothing was tuned.",
    ]


def _trained_on(context: ReportContext) -> str:
    """Where the report's runs trained, where that is not (all) the machine writing it: a
    report written again from runs kept from elsewhere (``results/``) names their machines,
    not its own."""
    if all(machine == context.machine for machine, _ in context.trained_on):
        return ""
    return " (" + "; ".join(
        f"{count} run{'s' if count != 1 else ''} on "
        + (machine or "a machine not recorded: kdml did not keep it then")
        for machine, count in context.trained_on) + ")"


def distinct_runs(results: Sequence[ExperimentResult]) -> dict[Path, tuple[float, str]]:
    """Each run that ``results`` read, once, with its training wall time and machine: a run
    shared by cells or experiments (JRD at alpha = 1 is in five) trained once, so its minutes
    count once in the report's total."""
    runs: dict[Path, tuple[float, str]] = {}
    for result in results:
        for cell in result.cells.values():
            machines = cell.machines or [""] * len(cell.run_dirs)  # one built by hand has none
            for run_dir, wall, machine in zip(cell.run_dirs, cell.wall_s, machines,
                                              strict=True):
                runs[run_dir] = (wall, machine)
    return runs


def _experiment_section(result: ExperimentResult, plots: Path, report_dir: Path,
                        context: ReportContext) -> list[str]:
    experiment = result.experiment
    lines = [f"### {experiment.mirrors}: {experiment.dataset}", "",
             f"{experiment.title}. Command: `{_command(experiment, context)}`."]
    if result.error:
        return [*lines, "", f"Not run here: {result.error}"]
    lines += [f"Settings: {_settings(result)}.{_changes(result)} Paper column: "
              f"{experiment.paper_data}.", ""]
    lines += _table(result)
    if any(result.cells[label].part_ci95 for label in result.cells):
        spread = "" if context.seeds == 1 else "; +- is over seeds"
        lines += ["", "Recall@K is the mean over 10 disjoint test parts that each hold every "
                  f"class (the paper's protocol){spread}. The 95% half-width over the parts, "
                  "as the paper gives it beside each value"
                  + ("" if context.seeds == 1 else " (here averaged over the seeds)") + ":",
                  "", *_part_table(result)]
    if experiment.claims:
        lines += ["", "Claims:"]
        for claim in experiment.claims:
            better = result.cells[claim.better].values[claim.metric]
            worse = result.cells[claim.worse].values[claim.metric]
            lines.append(f"- {claim.text} ({metric_name(claim.metric)}): "
                         f"{verdict(claim, better, worse)}{_collapsed_in(claim, result)}.")
    if experiment.note:
        lines += ["", experiment.note]
    lines += _figures(result, plots, report_dir)
    return lines


def _collapsed_in(claim: Claim, result: ExperimentResult) -> str:
    """``"; X collapsed on 5 of 5 seeds"`` for each cell of ``claim`` whose runs collapsed,
    or ``""``: a verdict on scores of ties says little of either model."""
    said = []
    for label in dict.fromkeys((claim.better, claim.worse)):
        cell = result.cells[label]
        if cell.collapsed:
            said.append(f"{label} collapsed on {len(cell.collapsed)} of "
                        f"{counted(len(cell.run_dirs), 'seed')}")
    return "".join(f"; {words}" for words in said)


def _command(experiment: Experiment, context: ReportContext) -> str:
    """The command that (re)writes ``experiment``'s section of this report: the report's seeds,
    setting, device, runs and path, so that it reuses the report's runs and keeps its other
    sections."""
    return (f"kdml reproduce {experiment.paper} --only {experiment.key} --seeds "
            f"{context.seeds}{' --quick' if context.quick else ''}"
            + (f" --device {context.device}" if context.device else "")
            + (f" --runs {context.runs}" if context.runs else "")
            + (f" --out {context.out}" if context.out else ""))


def _settings(result: ExperimentResult) -> str:
    """The table's training settings; one its cells differ in is given with each value, in
    cell order ("10 epochs or 100 epochs"), not only the first cell's."""
    configs = result.configs
    assert configs

    def each(describe: Callable[[RunConfig], str]) -> str:
        return " or ".join(dict.fromkeys(describe(config) for config in configs))

    def epochs(config: RunConfig) -> str:
        count, steps = config.train.epochs, config.train.steps_per_epoch
        return (f"{count} epoch{'s' * (count != 1)}"  # "1 epoch", not "1 epochs"
                + (f" of at most {steps} step{'s' * (steps != 1)}" if steps else ""))

    return (f"backbone {each(lambda config: f'`{config.model.backbone}`')}, "
            f"batch {each(lambda config: str(config.data.batch_size))}, {each(epochs)}, "
            f"{each(lambda config: f'{config.optim.name} lr {config.optim.lr:g}')}, "
            f"split {each(lambda config: f'`{config.data.split}`')}, "
            f"{training_minutes(distinct_runs([result])):.1f} min of training")


# Settings the Settings line gives by value (:func:`_settings`), or that name the run, not a
# change of it: the dataset (the heading's), the seed, the device, and the scoring interval,
# which :func:`kdml.reproduce.runner.cell_config` sets to the epochs in every run.
_SAID_ELSEWHERE = frozenset({
    "model.backbone", "data.batch_size", "train.epochs", "train.steps_per_epoch", "optim.name",
    "optim.lr", "data.split", "data.dataset", "train.seed", "train.device", "train.eval_every"})


def _changes(result: ExperimentResult) -> str:
    """``" Changed from the recipes' defaults: `data.pca_dim=64` in every row; by row,
    `method.alpha` to 0 or 2."``: every other setting a row changes from its recipe's default
    (a row's own settings and the experiment's ``common`` ones), or ``""`` where none does.
    The line had named five settings alone, and DTML's `data.pca_dim=64` on every row was in
    no table's Settings."""
    changed = [_changed(config) for config in result.configs]
    every, by_row = [], []
    for key in dict.fromkeys(key for cell in changed for key in cell):
        values = [cell[key] for cell in changed if key in cell]
        if len(values) == len(changed) and len(set(values)) == 1:
            every.append(f"`{key}={values[0]}`")
        else:
            by_row.append(f"`{key}` to {_or(list(dict.fromkeys(values)))}")
    said = ([f"{_and(every)} in every row"] if every else []) + (
        [f"by row, {', '.join(by_row)}"] if by_row else [])
    return f" Changed from the recipes' defaults: {'; '.join(said)}." if said else ""


def _changed(config: RunConfig) -> dict[str, str]:
    """The settings of ``config`` that differ from its recipe's defaults on its dataset, as
    written in a config (``false``, ``0.0001``), but those :data:`_SAID_ELSEWHERE`."""
    recipe = get_recipe(config.recipe)
    default = flatten(resolve_config(recipe.name, recipe.params, recipe.defaults, None,
                                     [f"data.dataset={config.data.dataset}"]).to_dict())
    return {key: _setting_text(value) for key, value in flatten(config.to_dict()).items()
            if key not in _SAID_ELSEWHERE and default.get(key) != value}


def _setting_text(value: object) -> str:
    """A setting's value as a config file writes it: ``true``, ``0.0001``, ``64``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _and(items: Sequence[str], word: str = "and") -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"`` (or ``word`` for "and")."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


def _or(items: Sequence[str]) -> str:
    """``"a"``, ``"a or b"``, ``"a, b or c"``."""
    return _and(items, "or")


def training_minutes(runs: Mapping[Path, tuple[float, str]]) -> float:
    """The training time of ``runs`` (:func:`distinct_runs`)."""
    return sum(wall for wall, _ in runs.values() if math.isfinite(wall)) / 60


def _table(result: ExperimentResult) -> list[str]:
    experiment = result.experiment
    paper_keys: list[str] = []
    for cell in experiment.cells:
        paper_keys += [key for key in cell.paper if key not in paper_keys]
    header = ["", *(metric_name(name) for name in experiment.metrics),
              *(f"paper {metric_name(key)}" for key in paper_keys)]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    # a column at the precision of its most precise number: 83.80% beside 85.58% is 0.8380
    digits = {key: max(_decimals(cell.paper[key]) for cell in experiment.cells
                       if key in cell.paper) for key in paper_keys}
    notes, collapse_notes = [], []
    for cell in experiment.cells:
        cell_result = result.cells[cell.label]
        label = cell.label
        if cell_result.diverged:
            label = f"{label} ({_seeds(cell_result.diverged)} diverged)"
            notes += [f"- {cell.label}, seed {seed}: {why}"
                      for seed, why in sorted(cell_result.diverged.items())]
        if cell_result.collapsed:
            label = f"{label} ({_seeds(cell_result.collapsed)} collapsed)"
            collapse_notes += [f"- {cell.label}, seed {seed}: {share:.1%} of the test "
                               "embeddings at one point"
                               for seed, share in sorted(cell_result.collapsed.items())]
        entries = [label, *(_format_finite(cell_result.values[name])
                            for name in experiment.metrics),
                   *(f"{cell.paper[key]:.{digits[key]}f}" if key in cell.paper else "-"
                     for key in paper_keys)]
        rows.append("| " + " | ".join(entries) + " |")
    if notes:
        rows += ["", "Diverged runs (their loss became NaN or infinite, so they have no scores; "
                 "the row is the other seeds' mean, and a claim pairs only the seeds both of "
                 "its runs finished; delete a run's folder to train it again):", "", *notes]
    if collapse_notes:
        rows += ["", "Collapsed runs (at least half of their test embeddings lie at one point, "
                 "`kdml.evaluation.collapse`: their neighbours are ties or differ by float "
                 "rounding, which another device, precision or thread count changes, so their "
                 "scores say little of the model; they are counted in the row as measured):",
                 "", *collapse_notes]
    return rows


def _seeds(by_seed: Mapping[int, object]) -> str:
    """``"seed 1"`` or ``"seeds 0, 1"``: the seeds of ``by_seed``."""
    return (f"seed{'s' if len(by_seed) > 1 else ''} "
            + ", ".join(str(seed) for seed in sorted(by_seed)))


def _figures(result: ExperimentResult, plots: Path, report_dir: Path) -> list[str]:
    experiment = result.experiment
    lines = []
    if experiment.sweep:
        metric = experiment.metrics[0]
        values = {label: cell.values[metric] for label, cell in result.cells.items()}
        path = plot_sweep(experiment, values, metric, _sweep_plot(plots, experiment))
        lines += ["", f"![{experiment.key}]({_relative(path, report_dir)})"]
    for cell_spec in experiment.cells:
        label, cell = cell_spec.label, result.cells[cell_spec.label]
        if cell.charts is not None:
            path = _charts_plot(plots, experiment)
            copy_png(cell.charts, path)
            lines += ["", f"Charts of {label}, seed {cell.charts_seed} (Sec. A.2):", "",
                      f"![charts]({_relative(path, report_dir)})"]
        elif cell_spec.plot_charts:  # said, not left out without a word
            why = cell.charts_missing or "every seed's run diverged, so no model has charts"
            lines += ["", f"Charts of {label} (Sec. A.2) are not drawn here: {why}."]
    return lines


def _relative(path: Path, start: Path) -> str:
    """``path`` from ``start``, as a Markdown link's destination: in angle brackets where it
    holds a space, which ends a bare CommonMark destination (or a parenthesis, which a bare one
    takes only balanced)."""
    relative = Path(os.path.relpath(path, start)).as_posix()
    return f"<{relative}>" if any(char in relative for char in " ()") else relative


def _part_table(result: ExperimentResult) -> list[str]:
    """Per row: the 95% half-width of each metric over the test parts, averaged over seeds."""
    metrics = result.experiment.metrics
    rows = ["| parts: 95% half-width | " + " | ".join(metric_name(name) for name in metrics)
            + " |", "|" + "---|" * (len(metrics) + 1)]
    for label, cell in result.cells.items():
        widths = [finished(cell.part_ci95.get(name, [])) for name in metrics]
        rows.append(f"| {label} | " + " | ".join(
            f"{sum(width) / len(width):.3f}" if width else "-" for width in widths) + " |")
    return rows


def _decimals(value: float) -> int:
    """The decimals a paper's number needs, 3 to 6: 7.65% is 0.0765, not 0.076."""
    digits = 3
    while digits < 6 and abs(round(value, digits) - value) > 1e-12:
        digits += 1
    return digits


def _format_finite(values: Sequence[float]) -> str:
    """The estimate over the seeds whose run finished (a diverged run's values are NaN)."""
    values = finished(values)
    return _format(Estimate.of(values)) if values else "diverged"


def _format(estimate: Estimate) -> str:
    if math.isnan(estimate.ci95):
        return f"{estimate.mean:.3f}"
    return f"{estimate.mean:.3f} +- {estimate.ci95:.3f}"
