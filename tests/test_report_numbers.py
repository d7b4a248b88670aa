"""Each committed reproduction report's numbers, recomputed from its run records without the
report's code.

``tests/test_committed_reports.py`` writes each report again with kdml's own code and compares
the text: a wrong statistic in that code (a standard deviation for the interval, n for n - 1,
a seed left out of a mean, a paired difference of the wrong sign or rows) would be written
into both the committed report and the one written again, and the comparison would pass. Here
every value a report prints (each cell's mean +- 95% half-width, the parts' half-widths, each
claim's verdict and paired difference) is computed again from the records' JSON with the
``statistics`` module and scipy's Student t quantiles, and set beside the printed text.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import statistics
from pathlib import Path
from typing import Any

import pytest
import scipy.stats
import yaml

from kdml.reproduce.experiments import Experiment

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [command for command in
            re.findall(r"`(kdml reproduce [^`]*)`", (ROOT / "results" / "README.md").read_text())
            if "--out" in command]
# each metric's column heading, written out here rather than read from kdml
HEADINGS = {"map@r": "MAP@R", "r_precision": "R-Prec.", "nmi": "NMI",
            "linear_accuracy": "linear acc.", "source_nn_accuracy": "source-NN acc.",
            "lambda": "lambda", "h_divergence": "d_H", "bound": "lambda + d_H",
            "recall@1": "R@1", "recall@2": "R@2", "recall@4": "R@4", "recall@8": "R@8",
            "recall@16": "R@16", "recall@32": "R@32", "lfw_accuracy": "LFW acc."}
NUMBER = r"([+-]?\d+\.\d+) \+- (\d+\.\d+)"
# libyaml's parser where PyYAML has it: several times faster over hundreds of config.yaml, and
# the same values as PyYAML's own for the plain YAML that kdml writes there
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def mean_and_half_width(values: list[float]) -> tuple[float, float]:
    """The mean and the 95% half-width (Student t, n - 1 degrees of freedom) of ``values``."""
    if len(values) < 2:
        return statistics.fmean(values), math.nan
    sem = statistics.stdev(values) / math.sqrt(len(values))
    # the 97.5% quantile of Student's t (two-sided 95%), scipy's, for any number of seeds
    return statistics.fmean(values), float(scipy.stats.t.ppf(0.975, len(values) - 1)) * sem


def search(pattern: str, text: str) -> re.Match[str]:
    """The first match of ``pattern`` in ``text`` (multi-line), which must have one."""
    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None, pattern
    return found


def close(printed: str, value: float) -> bool:
    """Whether ``printed`` is ``value`` rounded to the decimals it shows (float noise aside)."""
    decimals = len(printed.split(".")[1])
    return abs(float(printed) - value) <= 0.5 * 10 ** -decimals + 1e-9


def seed_values(experiment: Experiment, run_dirs: list[Path], metric: str) -> list[float]:
    """The value of ``metric`` of each seed's run, read from its JSON records (NaN for a run
    whose reproduce.json says it diverged)."""
    values = []
    for run_dir in run_dirs:
        if json.loads((run_dir / "reproduce.json").read_text()).get("diverged"):
            values.append(math.nan)
        elif metric in ("lambda", "h_divergence", "bound"):
            record = json.loads((run_dir / "generalization.json").read_text())
            values.append(record["lambda"]["mean"] + record["h_divergence"]["mean"]
                          if metric == "bound" else record[metric]["mean"])
        elif experiment.protocol in ("parts", "generalization") and metric.startswith("recall@"):
            values.append(json.loads((run_dir / "parts.json").read_text())
                          ["metrics"][metric]["mean"])
        else:
            values.append(json.loads((run_dir / "metrics.json").read_text())["final"][metric])
    return values


def part_widths(run_dirs: list[Path], metric: str) -> list[float]:
    """Each finished seed's 95% half-width of ``metric`` over the 10 test parts."""
    widths = []
    for run_dir in run_dirs:
        if not json.loads((run_dir / "reproduce.json").read_text()).get("diverged"):
            widths.append(json.loads((run_dir / "parts.json").read_text())
                          ["metrics"][metric]["ci95"])
    return widths


def sections(report: str) -> dict[str, str]:
    """A report's experiment sections, by their ``### heading`` line."""
    return {part.split("\n", 1)[0]: part for part in report.split("\n### ")[1:]}


def reports() -> list[tuple[str, str]]:
    """(report path, runs folder) of each committed report."""
    found = []
    for command in COMMANDS:
        args = shlex.split(command)
        found.append((args[args.index("--out") + 1], args[args.index("--runs") + 1]))
    return sorted(set(found))


@pytest.mark.parametrize(("report", "runs"), reports(), ids=[out for out, _ in reports()])
def test_a_committed_report_prints_what_its_records_give(report: str, runs: str) -> None:
    check_numbers((ROOT / report).read_text(), ROOT / runs)


def test_a_report_written_now_prints_what_its_records_give(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The same check on a report kdml writes now (DTML's, from a copy of its committed
    records: every verdict kind, a row of zero spread): a wrong statistic in the report's code
    fails here even where it wrote the committed reports too."""
    from kdml import cli

    runs = tmp_path / "runs"
    for source in (ROOT / "results" / "dtml").rglob("*"):
        if source.is_file() and "checkpoints" not in source.parts:
            copy = runs / source.relative_to(ROOT / "results" / "dtml")
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(source.read_bytes())
    monkeypatch.chdir(tmp_path)
    code = cli.main(["reproduce", "dtml", "--seeds", "5", "--device", "cpu", "--runs",
                     str(runs), "--out", str(tmp_path / "report.md"), "--no-progress"])
    assert code == 0, capsys.readouterr().err[-2000:]
    check_numbers((tmp_path / "report.md").read_text(), runs)


def check_numbers(text: str, runs: Path) -> None:
    """Every number of the report ``text`` recomputed from the records in ``runs``."""
    from kdml.reproduce.catalog import experiments
    from kdml.reproduce.runner import plan

    seeds = int(search(r"Values are means over (\d+) seeds", text).group(1))
    by_heading = {f"{experiment.mirrors}: {experiment.dataset}": experiment
                  for experiment in experiments("all")}
    checked = 0
    every_run: dict[Path, float] = {}  # a run two sections read trained once
    for heading, section in sections(text).items():
        experiment = by_heading[heading]
        planned = plan([experiment], seeds, runs, "cpu")
        values = {cell.label: {metric: seed_values(
            experiment, [run.run_dir for run in planned[experiment.key, cell.label]], metric)
            for metric in experiment.metrics} for cell in experiment.cells}
        dirs = {run.run_dir for runs_of_cell in planned.values() for run in runs_of_cell}
        walls = {run_dir: json.loads((run_dir / "reproduce.json").read_text())["wall_s"]
                 for run_dir in dirs}
        every_run.update(walls)
        minutes = search(r"^Settings: .*, (\d+\.\d) min of training\.", section)
        assert close(minutes.group(1), sum(walls.values()) / 60), (heading, minutes.group(1))
        table = [line for line in section.splitlines() if line.startswith("|")]
        header = [word.strip() for word in table[0].strip("|").split("|")]
        assert header[1:1 + len(experiment.metrics)] == [
            HEADINGS[metric] for metric in experiment.metrics], heading
        rows = table[2:2 + len(experiment.cells)]
        for cell, row in zip(experiment.cells, rows, strict=True):
            entries = [word.strip() for word in row.strip("|").split("|")]
            assert (entries[0] == cell.label
                    or entries[0].startswith(f"{cell.label} (seed")), (heading, entries[0])
            for metric, entry in zip(experiment.metrics, entries[1:], strict=False):
                finite = [value for value in values[cell.label][metric] if math.isfinite(value)]
                mean, half = mean_and_half_width(finite)
                printed = entry.split(" +- ")
                assert close(printed[0], mean), (heading, cell.label, metric, entry, mean)
                if len(finite) > 1:
                    assert close(printed[1], half), (heading, cell.label, metric, entry, half)
                checked += 1
            for key, paper in cell.paper.items():
                column = header.index(f"paper {HEADINGS[key]}")
                assert close(entries[column], paper), (heading, cell.label, key)
        if "| parts: 95% half-width |" in section:
            start = table.index(next(line for line in table if "parts: 95%" in line))
            for cell, row in zip(experiment.cells, table[start + 2:], strict=False):
                entries = [word.strip() for word in row.strip("|").split("|")]
                assert entries[0] == cell.label
                for metric, entry in zip(experiment.metrics, entries[1:], strict=True):
                    of_cell = [run.run_dir for run in planned[experiment.key, cell.label]]
                    widths = part_widths(of_cell, metric) if metric.startswith("recall@") else []
                    if widths:
                        assert close(entry, statistics.fmean(widths)), (heading, cell.label)
                    else:
                        assert entry == "-"
        block = section.split("\nClaims:\n", 1)[1] if "\nClaims:\n" in section else ""
        claims = block.split("\n\n", 1)[0].splitlines()
        for claim, line in zip(experiment.claims, claims, strict=True):
            assert line.startswith(f"- {claim.text} ({HEADINGS[claim.metric]}): "), line
            better, worse = values[claim.better][claim.metric], values[claim.worse][claim.metric]
            differences = [(b - w) * (-1 if claim.lower_is_better else 1)
                           for b, w in zip(better, worse, strict=True)
                           if math.isfinite(b) and math.isfinite(w)]
            mean, half = mean_and_half_width(differences)
            said = line.split("): ", 1)[1]
            if len(differences) < 2 or max(differences) - min(differences) <= 1e-6:
                assert said.startswith("not"), line
                continue
            found = re.search(NUMBER, said)
            assert found, line
            if mean - half > 0:
                expected = "holds"
                shown = mean if not claim.lower_is_better else abs(mean)
            elif mean + half < 0:
                expected, shown = "does not hold", -mean
            else:
                expected, shown = "not shown", mean * (-1 if claim.lower_is_better else 1)
            assert said.startswith(expected + ":"), (line, mean, half)
            assert close(found.group(1), shown), (line, mean)
            assert close(found.group(2), half), (line, half)
            assert f", {len(differences)} seeds" in said, line
            checked += 1
    total = search(r"; (\d+\.\d) minutes of training in all", text).group(1)
    assert close(total, sum(every_run.values()) / 60), total
    assert checked


# what a row's label says of its run, and the setting of the run's config.yaml that says it
LABEL_SETTINGS = ((r"\bd = (\d+)", ("method", "dim")), (r"\bn = (\d+)", ("method", "n_charts")),
                  (r"\balpha = ([\d.]+)", ("method", "alpha")),
                  (r"\blambda1 = ([\d.]+)", ("method", "lambda1")),
                  (r"\b(\d+) epochs\b", ("train", "epochs")),
                  (r"\bhidden (\d+)", ("method", "proj_hidden")),
                  (r"\(K, K'\) = \((\d+), ", ("method", "emb_num_kernels")),
                  (r"\(K, K'\) = \(\d+, (\d+)\)", ("method", "cls_num_kernels")))


@pytest.mark.parametrize(("report", "runs"), reports(), ids=[out for out, _ in reports()])
def test_each_row_of_a_committed_report_reads_the_runs_its_label_names(report: str,
                                                                      runs: str) -> None:
    """A row's numbers are read from runs whose config.yaml is what its label says (d, n,
    alpha, lambda1, epochs, head width, kernels), of its seed and the section's dataset: a
    row that read another cell's runs would print their numbers under its label."""
    from kdml.reproduce.catalog import experiments
    from kdml.reproduce.runner import plan

    text = (ROOT / report).read_text()
    seeds = int(search(r"Values are means over (\d+) seeds", text).group(1))
    by_heading = {f"{experiment.mirrors}: {experiment.dataset}": experiment
                  for experiment in experiments("all")}
    checked = 0
    for heading in sections(text):
        experiment = by_heading[heading]
        planned = plan([experiment], seeds, ROOT / runs, "cpu")
        for cell in experiment.cells:
            for seed, run in enumerate(planned[experiment.key, cell.label]):
                config = yaml.load((run.run_dir / "config.yaml").read_text(),
                                   Loader=SAFE_LOADER)
                assert config["recipe"] == cell.recipe
                assert config["data"]["dataset"] == experiment.dataset
                assert config["train"]["seed"] == seed
                checked += 1
                for pattern, (section, key) in LABEL_SETTINGS:
                    found = re.search(pattern, cell.label)
                    if found:
                        assert float(config[section][key]) == float(found.group(1)), (
                            cell.label, key, config[section][key])
                        checked += 1
    assert checked


def test_each_metric_has_a_column_heading_of_its_own() -> None:
    """Two metrics under one heading would be read as one: a column of R-Precision headed
    MAP@R. Every heading the reports may print is its metric's alone, and the one written out
    in :data:`HEADINGS` above."""
    from kdml.reproduce.experiments import METRIC_NAMES, metric_name

    names = [*METRIC_NAMES, "recall@1", "recall@2", "recall@4", "recall@8", "recall@16"]
    headings = [metric_name(name) for name in names]
    assert len(set(headings)) == len(headings)
    assert {name: metric_name(name) for name in HEADINGS} == HEADINGS


def test_a_sweep_plot_s_bars_are_the_table_s_95_half_widths(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each point of a sweep plot is its cell's mean with a bar of the table's 95% half-width
    over seeds (Student t, n - 1) on each side: the figure and the table beside it show the
    same interval."""
    from kdml.reproduce import plots
    from kdml.reproduce.experiments import Cell

    drawn: list[Any] = []

    def keep(figure: Any, path: Path) -> Path:
        drawn.append(figure)
        return path

    monkeypatch.setattr(plots, "save_figure", keep)
    cells = (Cell("a", "jrd", x=0.0, series="s"), Cell("b", "jrd", x=1.0, series="s"))
    experiment = Experiment("sweep", "jrd", "Figure", "t", "digits", cells, ("recall@1",),
                            sweep="alpha")
    values = {"a": [0.5, 0.62, 0.55], "b": [0.6, 0.7, 0.66, 0.71, 0.58]}
    plots.plot_sweep(experiment, values, "recall@1", tmp_path / "sweep.png")
    (bars,) = drawn[0].axes[0].containers[0].lines[2]
    for segment, label in zip(bars.get_segments(), ("a", "b"), strict=True):
        mean, half = mean_and_half_width(values[label])
        assert segment[:, 1] == pytest.approx([mean - half, mean + half])


def test_a_run_without_a_wall_time_adds_nothing_to_the_training_minutes() -> None:
    """A run whose time is not known (NaN: a cell built without its timing) leaves the others'
    minutes as they are, where summing it made the header's total "nan minutes"."""
    from kdml.reproduce.report import training_minutes

    runs = {Path("a"): (90.0, ""), Path("b"): (math.nan, ""), Path("c"): (30.0, "")}
    assert training_minutes(runs) == 2.0
