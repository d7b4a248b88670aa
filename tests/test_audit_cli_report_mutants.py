"""Mutation audit of what the command line prints and of the reproduction report's writing:
each test here failed on a mutant of kdml.reproduce.experiments, kdml.reproduce.report,
kdml.reproduce.plots, kdml.cli.reproduce, kdml.cli.output, kdml.cli.parser or the progress
bars that the rest of the suite let pass, and a user would have seen the difference (a wrong
verdict, a number printed otherwise, a section dropped, a file left behind)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from kdml import cli
from kdml.cli.output import _print_results, _say
from kdml.cli.parser import build_parser
from kdml.errors import KdmlError
from kdml.progress import bar_disabled
from kdml.reproduce.experiments import Cell, Claim, Experiment, verdict
from kdml.reproduce.report import (
    MARKER,
    ReportContext,
    _header,
    _not_run_section,
    check_outputs,
    check_plots,
    write_report,
)
from kdml.reproduce.runner import CellResult, ExperimentResult, cell_config

CLAIM = Claim("A beats B", "A", "B", "recall@1")


def test_a_claim_whose_every_seed_diverged_on_one_side_is_not_testable():
    """No seed pairs two finished runs: nothing is left to judge, which the line says, rather
    than a "one seed" line about an empty difference."""
    assert verdict(CLAIM, [math.nan, 0.5], [0.4, math.nan]) == \
        "not testable: in every seed, one of the two runs diverged"


def test_one_seed_left_after_a_divergence_says_which_run_diverged():
    assert verdict(CLAIM, [0.5, math.nan], [0.4, 0.3]) == \
        "not testable with one seed (A higher by 0.100); 1 seed left out, where A diverged"


def test_one_seed_differing_by_float_rounding_is_equal():
    """4e-7 apart (below SAME): the same score, not "A higher by 0.000"."""
    assert verdict(CLAIM, [0.5 + 4e-7], [0.5]) == "not testable with one seed (the two are equal)"


def test_a_difference_of_a_few_millionths_is_printed_at_six_decimals():
    """At five decimals the mean and the half-width both print 0.00001."""
    better = [0.5, 0.6, 0.7, 0.4]
    worse = [0.5 - 1e-5, 0.6 - 2e-5, 0.7 - 1.5e-5, 0.4 - 1.2e-5]
    assert verdict(CLAIM, better, worse) == \
        "holds: A is higher by +0.000014 +- 0.000007, 4 seeds"


# ---- the report, written from results built by hand (nothing trains)

TINY = ("train.epochs=1", "train.steps_per_epoch=3", "eval.nmi=false", "data.batch_size=40",
        "model.embedding_size=8")


def _result(experiment: Experiment, values: dict[str, dict[str, list[float]]],
            **per_cell: dict[str, object]) -> ExperimentResult:
    """An ExperimentResult without training: ``values[label][metric]`` per seed, and CellResult
    fields by cell label (``collapsed={"B": {1: 0.9}}``)."""
    cells = {}
    for cell in experiment.cells:
        count = len(next(iter(values[cell.label].values())))
        cells[cell.label] = CellResult(
            values=values[cell.label], wall_s=[60.0] * count,
            run_dirs=[Path(f"/runs/{experiment.key}/{cell.label}/seed-{seed}")
                      for seed in range(count)],
            **{name: by_label[cell.label] for name, by_label in per_cell.items()
               if cell.label in by_label})
    configs = tuple(cell_config(experiment, cell, 0, "cpu") for cell in experiment.cells)
    return ExperimentResult(experiment, cells, configs)


def _table(key: str, dataset: str = "digits") -> Experiment:
    return Experiment(key, "jrd", f"Table {key}", "t", dataset,
                      (Cell("A", "jrd", ()), Cell("B", "jrd", ("method.alpha=0",))),
                      ("recall@1",), common=TINY)


@pytest.fixture(scope="module")
def not_run_report(tmp_path_factory) -> str:
    """A report of one table written twice (the second time over the first), beside another
    report of kdml's and a user's notes, with two experiments left out on its dataset and three
    on two others."""
    folder = tmp_path_factory.mktemp("not-run")
    (folder / "other.md").write_text(f"{MARKER}\n\n# Reproduction\n")
    (folder / "notes.md").write_text("# my notes\n")
    result = _result(_table("hand-a"), {"A": {"recall@1": [0.5, 0.6]},
                                        "B": {"recall@1": [0.4, 0.45]}})
    not_run = [_table("hand-b"), _table("hand-c", "mnist5k"), _table("hand-d", "mnist5k"),
               _table("hand-e", "fashion-mnist"), _table("hand-f")]
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    for _ in range(2):
        text = write_report([result], folder / "report.md", context, not_run).read_text()
    return text


def test_the_not_run_section_lists_this_dataset_s_and_counts_the_others(not_run_report):
    section = not_run_report.split("## Not run for this report\n", 1)[1]
    assert [line for line in section.splitlines() if line.startswith("- ")] == [
        "- `hand-b` (Table hand-b, digits): `kdml reproduce jrd --only hand-b --seeds 2`",
        "- `hand-f` (Table hand-f, digits): `kdml reproduce jrd --only hand-f --seeds 2`"]
    assert ("\n3 experiments on other datasets (fashion-mnist, mnist5k) are not listed here; "
            "`kdml reproduce all --list` names every experiment.\n") in section


def test_the_not_run_section_names_the_other_reports_kdml_wrote_and_no_other_file(
        not_run_report):
    """Not the report itself (written there before), not a user's notes.md."""
    assert not_run_report.endswith(
        "\n\nOther reports of `kdml reproduce` beside this one: [other.md](other.md).\n")


@pytest.mark.parametrize(("count", "said"), [
    (1, "1 experiment on other datasets (mnist5k) is not listed here"),
    (2, "2 experiments on other datasets (mnist5k) are not listed here")])
def test_one_experiment_on_another_dataset_is_counted_in_the_singular(count, said):
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    lines = _not_run_section([_table(f"other-{n}", "mnist5k") for n in range(count)],
                             {"digits"}, context)
    assert lines[3].startswith(said), lines


def test_the_header_names_every_machine_where_runs_trained_on_several_this_one_among_them():
    """Runs of this machine and of another: both counted, not left unsaid because some ran
    here; two runs are "2 runs"."""
    context = ReportContext("kdml reproduce jrd", "Here CPU", "torch", 0.1, 2, False,
                            trained_on=(("Here CPU", 3), ("Elsewhere CPU", 2)))
    assert ("; 0.1 minutes of training in all (3 runs on Here CPU; 2 runs on Elsewhere CPU). "
            "Settings:") in _header(context)[0]


# ---- kdml reproduce's command line, over a catalog of two tables whose runs are made up

@pytest.fixture
def made_up_runs(monkeypatch, tmp_path) -> SimpleNamespace:
    """``kdml reproduce jrd`` in ``tmp_path`` over two one-cell-pair tables (tiny-a, tiny-b)
    whose results are built by hand, not trained: ``failing`` lists the keys that "could not
    run", ``progress`` records the ``progress`` the runner was given."""
    tables = [_table("tiny-a"), _table("tiny-b")]
    made_up = SimpleNamespace(failing=[], progress=[])

    def reproduce(chosen, seeds, runs, device, progress=None, echo=print):
        made_up.progress.append(progress)
        results = []
        for experiment in chosen:
            values = [0.5 + 0.01 * seed for seed in range(seeds)]
            result = _result(experiment, {"A": {"recall@1": values},
                                          "B": {"recall@1": [value - 0.1 for value in values]}})
            result.error = "no such data here" if experiment.key in made_up.failing else ""
            results.append(result)
        return results

    monkeypatch.setattr("kdml.reproduce.catalog.experiments",
                        lambda paper, quick=False: list(tables))
    monkeypatch.setattr("kdml.reproduce.runner.reproduce", reproduce)
    monkeypatch.chdir(tmp_path)
    return made_up


def _commands(report: Path) -> list[str]:
    return re.findall(r"Command: `([^`]*)`", report.read_text())


def test_a_quick_report_written_at_the_default_report_s_path_names_it(made_up_runs):
    """--quick writes into its runs folder unless --out says otherwise: its commands must name
    docs/reproduction.md, or they rewrite runs/reproduce-quick/reproduction.md instead."""
    Path("docs").mkdir()
    assert cli.main(["reproduce", "jrd", "--quick", "--seeds", "2", "--out",
                     "docs/reproduction.md", "--device", "cpu", "--no-progress"]) == 0
    assert _commands(Path("docs/reproduction.md")) == [
        f"kdml reproduce jrd --only tiny-{key} --seeds 2 --quick --device cpu --out "
        "docs/reproduction.md" for key in "ab"]


def test_a_quick_report_of_the_full_setting_s_runs_folder_names_it(made_up_runs):
    """--quick --runs runs/reproduce: the commands name that folder, which is not the quick
    setting's default (runs/reproduce-quick)."""
    assert cli.main(["reproduce", "jrd", "--quick", "--seeds", "2", "--runs", "runs/reproduce",
                     "--device", "cpu", "--no-progress"]) == 0
    assert _commands(Path("runs/reproduce/reproduction.md"))[0] == (
        "kdml reproduce jrd --only tiny-a --seeds 2 --quick --device cpu --runs runs/reproduce "
        "--out runs/reproduce/reproduction.md")


def test_a_runs_folder_with_a_space_is_quoted_in_the_report_s_commands(made_up_runs):
    assert cli.main(["reproduce", "jrd", "--seeds", "2", "--runs", "my runs", "--out",
                     "report.md", "--device", "cpu", "--no-progress"]) == 0
    assert _commands(Path("report.md"))[1] == (
        "kdml reproduce jrd --only tiny-b --seeds 2 --device cpu --runs 'my runs' --out "
        "report.md")


def test_no_progress_reaches_the_runner(made_up_runs):
    for flags in ([], ["--no-progress"]):
        assert cli.main(["reproduce", "jrd", "--seeds", "2", "--out", "report.md", "--device",
                         "cpu", *flags]) == 0
    assert made_up_runs.progress == [None, False]


def test_the_last_line_counts_the_experiments_that_ran(made_up_runs, capsys):
    made_up_runs.failing.append("tiny-b")
    assert cli.main(["reproduce", "jrd", "--seeds", "2", "--out", "report.md", "--device",
                     "cpu", "--no-progress"]) == 1
    done = capsys.readouterr()
    assert done.out.endswith("report written to report.md (1 of 2 experiments)\n")
    assert done.err == "kdml: tiny-b could not run: no such data here\n"


def test_an_only_pattern_with_a_question_mark_of_another_paper_is_said_to_match(capsys):
    assert cli.main(["reproduce", "jrd", "--only", "atlas-triplet-mnist?k", "--list"]) == 2
    assert capsys.readouterr().err == (
        "kdml: error: --only atlas-triplet-mnist?k matches no experiment of jrd: "
        "atlas-triplet-mnist?k matches experiments of 'kdml reproduce atlas'\n")


# ---- files and plots

def _sweep() -> Experiment:
    cells = (Cell("A, x = 1", "jrd", (), series="A", x=1.0),
             Cell("A, x = 2", "jrd", ("method.alpha=0",), series="A", x=2.0),
             Cell("B, x = 1", "jrd", ("method.alpha=2",), series="B", x=1.0))
    return Experiment("hand-sweep", "jrd", "Figure 1", "t", "digits", cells, ("recall@1",),
                      common=TINY, sweep="x")


def test_a_plot_link_with_an_unbalanced_parenthesis_is_in_angle_brackets(tmp_path):
    """A bare Markdown link destination takes parentheses only balanced: report(1.md's plot
    folder, report(1-plots, would end the link early."""
    values = {cell.label: {"recall@1": [0.5, 0.6]} for cell in _sweep().cells}
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    text = write_report([_result(_sweep(), values)], tmp_path / "report(1.md",
                        context).read_text()
    assert "\n![hand-sweep](<report(1-plots/hand-sweep.png>)\n" in text


def test_a_folder_at_out_is_refused_as_not_a_file(tmp_path):
    (tmp_path / "report.md").mkdir()
    with pytest.raises(KdmlError, match=rf"^--out {re.escape(str(tmp_path / 'report.md'))} is "
                                        r"not a file; choose another --out$"):
        check_outputs(tmp_path / "report.md")


@pytest.mark.parametrize(("labels", "legend"), [(("A, x = 1", "A, x = 2"), False),
                                                (("A, x = 1", "A, x = 2", "B, x = 1"), True)])
def test_a_sweep_plot_of_several_lines_has_a_legend_and_one_of_one_line_none(
        tmp_path, monkeypatch, labels, legend):
    from kdml.reproduce import plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure",
                        lambda figure, path: drawn.append(figure.axes[0].get_legend()) or path)
    values = {label: [0.5, 0.6] for label in labels}
    plots.plot_sweep(_sweep(), values, "recall@1", tmp_path / "sweep.png")
    assert (drawn[0] is not None) == legend
    if legend:
        assert [text.get_text() for text in drawn[0].get_texts()] == ["A", "B"]


def test_the_metrics_table_names_the_part_the_command_scored(capsys):
    """kdml eval --test of a run that validated scores its test part: "Test metrics", not the
    run's own "Validation metrics"."""
    config = cell_config(_table("x"), Cell("A", "jrd", ("data.validation=0.2",)), 0, "cpu")
    _print_results(config, {"recall@1": 0.5}, Path("run"), validated=False)
    _print_results(config, {"recall@1": 0.5}, Path("run"))
    out = capsys.readouterr().out
    assert out.startswith("\nTest metrics (jrd, digits):\n")
    assert "\nValidation metrics (jrd, digits):\n" in out


def test_the_embedding_bar_counts_a_last_short_batch(trained_run, tmp_path, monkeypatch):
    """Its total is the batches it draws: the last, short one too."""
    import numpy as np
    from tqdm.auto import tqdm

    from kdml.evaluation import evaluator

    totals = []

    def recording_tqdm(*args, **kwargs):
        totals.append(kwargs["total"])
        return tqdm(*args, **kwargs)

    monkeypatch.setattr(evaluator, "tqdm", recording_tqdm)
    assert cli.main(["embed", str(trained_run), "--out", str(tmp_path / "e.npz"),
                     "--no-progress"]) == 0
    count = len(np.load(tmp_path / "e.npz")["embeddings"])
    assert count % 256 and totals == [-(-count // 256)]


def _parts_table() -> Experiment:
    return Experiment("hand-parts", "jrd", "Table 2", "t", "digits",
                      (Cell("A", "jrd", ()), Cell("B", "jrd", ("method.alpha=0",))),
                      ("recall@1", "map@r"), protocol="parts", common=TINY)


def test_the_parts_table_averages_the_seeds_widths_and_keeps_a_row_whose_runs_diverged(
        tmp_path):
    """B's every run diverged, so it has no parts' widths: the table keeps A's, the mean of
    its seeds' (0.010 and 0.030: 0.020), with a dash for B and for MAP@R, which has none."""
    result = _result(_parts_table(),
                     {"A": {"recall@1": [0.5, 0.6], "map@r": [0.2, 0.3]},
                      "B": {"recall@1": [math.nan] * 2, "map@r": [math.nan] * 2}},
                     part_ci95={"A": {"recall@1": [0.01, 0.03]}},
                     diverged={"B": {0: "boom", 1: "boom"}})
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    text = write_report([result], tmp_path / "report.md", context).read_text()
    assert ("\n| parts: 95% half-width | R@1 | MAP@R |\n|---|---|---|\n| A | 0.020 | - |\n"
            "| B | - | - |\n") in text
    assert ("that each hold every class (the paper's protocol); +- is over seeds. The 95% "
            "half-width over the parts, as the paper gives it beside each value (here averaged "
            "over the seeds):") in text


def test_a_one_seed_parts_table_says_no_spread_over_seeds(tmp_path):
    result = _result(_parts_table(), {"A": {"recall@1": [0.5], "map@r": [0.2]},
                                      "B": {"recall@1": [0.4], "map@r": [0.1]}},
                     part_ci95={"A": {"recall@1": [0.01]}, "B": {"recall@1": [0.02]}})
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 1, False)
    text = write_report([result], tmp_path / "report.md", context).read_text()
    assert ("each hold every class (the paper's protocol). The 95% half-width over the parts, "
            "as the paper gives it beside each value:\n") in text


# ---- what only rank 0 prints under torchrun

@pytest.mark.parametrize(("rank", "said"), [("0", True), ("1", False)])
def test_a_usage_error_is_printed_by_rank_0_alone(monkeypatch, capsys, rank, said):
    """Every process torchrun starts parses the same arguments: one line, not one per rank;
    each exits with 2."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["reproduce", "nopaper"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("kdml: error: argument paper") == said


@pytest.mark.parametrize("main", [True, False])
def test_a_line_said_once_is_printed_by_the_main_process_alone(monkeypatch, capsys, main):
    from kdml import distributed

    monkeypatch.setattr(distributed, "world", lambda: SimpleNamespace(is_main=main))
    _say("trained")
    assert capsys.readouterr().out == ("trained\n" if main else "")


@pytest.mark.parametrize("progress", [None, True, False])
def test_a_rank_other_than_0_draws_no_bar_even_when_asked(progress, monkeypatch):
    """Rank 0's bar stands for every rank's: another rank's would be drawn over it."""
    monkeypatch.delenv("TERM", raising=False)
    assert bar_disabled(progress, main=False) is True
    assert bar_disabled(progress, main=True) is (None if progress is None else not progress)


def test_a_setting_every_row_changes_to_its_own_value_is_given_by_row(tmp_path):
    """alpha 0.5 in one row and 2 in the other: changed in every row, but not to one value
    (it had read "`method.alpha=0.5` in every row")."""
    experiment = Experiment("hand-rows", "jrd", "Table 9", "t", "digits",
                            (Cell("A", "jrd", ("method.alpha=0.5",)),
                             Cell("B", "jrd", ("method.alpha=2",))), ("recall@1",),
                            common=TINY)
    result = _result(experiment, {"A": {"recall@1": [0.5, 0.6]},
                                  "B": {"recall@1": [0.4, 0.45]}})
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    text = write_report([result], tmp_path / "report.md", context).read_text()
    assert "; by row, `method.alpha` to 0.5 or 2." in text
    assert "`method.alpha=0.5` in every row" not in text


def test_a_collapsed_run_s_note_gives_its_share_in_percent(tmp_path):
    result = _result(_table("hand-flat"), {"A": {"recall@1": [0.5, 0.6]},
                                           "B": {"recall@1": [0.4, 0.45]}},
                     collapsed={"B": {1: 0.9}})
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    text = write_report([result], tmp_path / "report.md", context).read_text()
    assert "\n- B, seed 1: 90.0% of the test embeddings at one point\n" in text


def test_a_recall_at_a_two_digit_k_keeps_both_digits_in_its_heading(tmp_path):
    experiment = Experiment("hand-ks", "jrd", "Table 8", "t", "digits",
                            (Cell("A", "jrd", ()),), ("recall@1", "recall@16"), common=TINY)
    result = _result(experiment, {"A": {"recall@1": [0.5, 0.6], "recall@16": [0.9, 0.95]}})
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    text = write_report([result], tmp_path / "report.md", context).read_text()
    assert "\n|  | R@1 | R@16 |\n" in text


def test_a_users_file_where_a_chart_plot_goes_is_refused_before_anything_trains(tmp_path):
    """Refused by check_plots, before the runs train, not by the write hours later."""
    plots = tmp_path / "report-plots"
    plots.mkdir()
    (plots / "hand-charts-charts.png").write_bytes(b"mine")
    experiment = Experiment("hand-charts", "atlas", "Table 3", "t", "digits",
                            (Cell("MTriplet", "mtriplet", (), plot_charts=True),),
                            ("recall@1",), common=TINY)
    with pytest.raises(KdmlError, match=r"hand-charts-charts\.png is in the way and kdml did "
                                        r"not draw it"):
        check_plots(tmp_path / "report.md", [experiment])
