"""Mutation audit of kdml reproduce, second part (the mutants the first part left unrun): each
test here failed on a mutant of kdml.cli.reproduce, kdml.reproduce.report or
the trainer's progress bars that the rest of the suite let pass, and a user would have seen
the difference (a section read twice or out of order, a stale plot left, a refusal only after
training, a bar not drawn or not closed)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from kdml import cli
from kdml.reproduce.experiments import Cell, Experiment
from kdml.reproduce.runner import CellResult, ExperimentResult, cell_config

TINY = ("train.epochs=1", "train.steps_per_epoch=3", "eval.nmi=false", "data.batch_size=40",
        "model.embedding_size=8")


def _table(key: str) -> Experiment:
    return Experiment(key, "jrd", f"Table {key}", "t", "digits",
                      (Cell("A", "jrd", ()), Cell("B", "jrd", ("method.alpha=0",))),
                      ("recall@1",), common=TINY)


def _result(experiment: Experiment, seeds: int) -> ExperimentResult:
    """A result built by hand, without training: A 0.5, 0.51, ... and B 0.1 below."""
    cells = {}
    for cell in experiment.cells:
        values = [0.5 + 0.01 * seed - 0.1 * (cell.label == "B") for seed in range(seeds)]
        cells[cell.label] = CellResult(
            values={"recall@1": values}, wall_s=[60.0] * seeds,
            run_dirs=[Path(f"/runs/{experiment.key}/{cell.label}/seed-{seed}")
                      for seed in range(seeds)])
    configs = tuple(cell_config(experiment, cell, 0, "cpu") for cell in experiment.cells)
    return ExperimentResult(experiment, cells, configs)


@pytest.fixture
def another_writer(monkeypatch, tmp_path) -> SimpleNamespace:
    """``kdml reproduce jrd`` in ``tmp_path`` over three tables (tiny-a, tiny-b, tiny-c) whose
    results are made up, where another kdml reproduce adds tiny-a's section to the report
    while this one trains: ``keep_reported`` returns it at its second call (under the lock),
    unless ``adds`` is False. ``ran`` records the keys each call of the runner was given;
    ``missing[key][label]`` says why a cell's charts are not drawn."""
    from kdml.reproduce import report as report_module

    tables = [_table("tiny-a"), _table("tiny-b"), _table("tiny-c")]
    writer = SimpleNamespace(ran=[], calls=0, adds=True, missing={})

    def reproduce(chosen, seeds, runs, device, progress=None, echo=print):
        writer.ran.append([experiment.key for experiment in chosen])
        results = [_result(experiment, seeds) for experiment in chosen]
        for result in results:
            for label, why in writer.missing.get(result.experiment.key, {}).items():
                result.cells[label].charts_missing = why
        return results

    def keep_reported(chosen, catalog, report, seeds, quick, runs, device):
        writer.calls += 1
        return [experiment for experiment in catalog if experiment in chosen
                or (writer.adds and writer.calls > 1 and experiment.key == "tiny-a")]

    monkeypatch.setattr("kdml.reproduce.catalog.experiments",
                        lambda paper, quick=False: list(tables))
    monkeypatch.setattr("kdml.reproduce.runner.reproduce", reproduce)
    monkeypatch.setattr(report_module, "keep_reported", keep_reported)
    monkeypatch.chdir(tmp_path)
    return writer


def test_a_section_another_reproduce_added_meanwhile_is_read_once_and_kept_in_order(
        another_writer, capsys):
    """tiny-c trains here; tiny-a, added by another kdml reproduce meanwhile, is read again
    (and only it), and the report lists the sections in the catalog's order, not tiny-a last.
    """
    assert cli.main(["reproduce", "jrd", "--only", "tiny-c", "--seeds", "2", "--out",
                     "report.md", "--device", "cpu", "--no-progress"]) == 0
    assert another_writer.ran == [["tiny-c"], ["tiny-a"]]
    assert capsys.readouterr().out.startswith(
        "report.md gained 1 section(s) from another kdml reproduce while this one trained; "
        "reading their runs again\n")
    text = Path("report.md").read_text()
    # the command that wrote it names the device: run folders hash it
    assert text.count("Written by `kdml reproduce jrd --seeds 2 --only tiny-c --device cpu "
                      "--out report.md` on ") == 1
    assert re.findall(r"Command: `kdml reproduce jrd --only (tiny-\w)", text) == [
        "tiny-a", "tiny-c"]
    # tiny-b, in neither, is the one left out
    assert "- `tiny-b` (Table tiny-b, digits)" in text.split("## Not run for this report")[1]



def test_a_cell_whose_charts_are_not_drawn_is_said_on_stderr(another_writer, capsys):
    """The table is written; the missing chart plot is said, with why, not left unsaid."""
    another_writer.adds = False
    another_writer.missing = {"tiny-b": {"B": "its run keeps no checkpoint"}}
    assert cli.main(["reproduce", "jrd", "--seeds", "2", "--out", "report.md", "--device",
                     "cpu", "--no-progress"]) == 0
    assert capsys.readouterr().err == (
        "kdml: tiny-b: the charts of B are not drawn: its run keeps no checkpoint\n")


# ---- the report's files

def test_an_empty_plots_folder_kdml_did_not_mark_is_taken(tmp_path):
    """Only a folder holding files kdml did not write is refused: an empty one (made by hand,
    or left by a report moved away) loses nothing."""
    from kdml.reproduce.report import check_outputs, plots_folder

    plots_folder(tmp_path / "report.md").mkdir()
    check_outputs(tmp_path / "report.md")


# ---- --only's refusals

def test_an_only_key_of_the_full_setting_and_of_another_paper_names_both(monkeypatch, capsys):
    """With --quick, a pattern that matches a table of this paper's full setting (which
    --quick leaves out) and one of another paper's: both are said, not the other paper's
    alone, which sent the user to the wrong paper."""
    def experiments(paper, quick=False):
        tables = {"jrd": [_table("tiny-a"), *([] if quick else [_table("tiny-full")])],
                  "atlas": [Experiment("tiny-fa", "atlas", "Table 9", "t", "digits",
                                       (Cell("A", "jrd", ()),), ("recall@1",))]}
        return list(tables.get(paper, []))

    monkeypatch.setattr("kdml.reproduce.catalog.experiments", experiments)
    assert cli.main(["reproduce", "jrd", "--quick", "--only", "tiny-f*", "--list"]) == 2
    assert capsys.readouterr().err == (
        "kdml: error: --only tiny-f* matches no experiment of jrd with --quick (without it: "
        "tiny-full); tiny-f* matches experiments of 'kdml reproduce atlas'; the keys are: "
        "tiny-a\n")


# ---- the sections a rewrite would drop

def _written(report: Path, *commands: str) -> Path:
    """A report kdml wrote, holding a section (with numbers) per command."""
    from kdml.reproduce.report import MARKER

    sections = [f"### Table\n\nCommand: `{command}`\n\n| row | R@1 |\n" for command in commands]
    report.write_text("\n".join([MARKER, "", "# Reproduction", "", "## JRD", "", *sections]))
    return report


def test_sections_a_rewrite_would_drop_are_named_five_at_most_each_with_its_reason(tmp_path):
    """Seven sections of experiments this kdml does not have: five named and "2 more", and
    no other setting to give (none reads them); one of another --seeds beside one unknown:
    the settings are said."""
    from kdml.errors import KdmlError
    from kdml.reproduce.report import keep_reported

    report = _written(tmp_path / "report.md",
                      *(f"kdml reproduce jrd --only gone-{n} --seeds 2" for n in range(7)))
    gone = " (an experiment this kdml does not have: renamed or removed since it was written)"
    with pytest.raises(KdmlError) as refused:
        keep_reported([], [], report, 2, False, tmp_path / "runs", "cpu")
    assert str(refused.value) == (
        f"{report} holds 7 sections that this report would drop: "
        + ", ".join(f"gone-{n}{gone}" for n in range(5))
        + f" and 2 more; choose another --out, or delete {report} first")
    _written(report, "kdml reproduce jrd --only gone-0 --seeds 2",
             "kdml reproduce jrd --only tiny-a --seeds 3 --quick")
    with pytest.raises(KdmlError) as refused:
        keep_reported([], [_table("tiny-a")], report, 2, False, tmp_path / "runs", "cpu")
    assert str(refused.value) == (
        f"{report} holds 2 sections that this report would drop: gone-0{gone}, tiny-a "
        "(written at --seeds 3 --quick); give the --seeds, --runs and --device they were "
        f"written with, another --out, or delete {report} first")


def test_a_rewrite_keeps_the_plots_it_links_and_removes_its_own_it_no_longer_links(tmp_path):
    """Written twice with its sweep, the report keeps the sweep's plot; written without it
    (not run here), the plot goes; a user's image put at that name is kept."""
    from PIL import Image

    from kdml.reproduce.report import ReportContext, plots_folder, write_report

    sweep = Experiment("hand-sweep", "jrd", "Figure 1", "t", "digits",
                       (Cell("A, x = 1", "jrd", (), series="A", x=1.0),
                        Cell("A, x = 2", "jrd", ("method.alpha=0",), series="A", x=2.0)),
                       ("recall@1",), common=TINY, sweep="x")
    table = _table("tiny-a")
    report = tmp_path / "report.md"
    plot = plots_folder(report) / "hand-sweep.png"
    context = ReportContext("kdml reproduce jrd", "a test machine", "torch", 0.1, 2, False)
    for _ in range(2):
        write_report([_result(sweep, 2), _result(table, 2)], report, context)
        assert plot.is_file()
    text = write_report([_result(table, 2)], report, context, [sweep]).read_text()
    assert not plot.exists()
    # a paper without a table here has no heading
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        "## JRD (Chu et al., ICML 2020)", "## Not run for this report"]
    write_report([_result(sweep, 2), _result(table, 2)], report, context)
    Image.new("RGB", (4, 4)).save(plot)  # the user's own image, where the plot was
    write_report([_result(table, 2)], report, context, [sweep])
    assert plot.is_file()


@pytest.mark.parametrize("path", ["my\nreport.md", "my`report.md"])
def test_a_report_path_with_a_line_break_is_refused_as_one_with_a_backtick(path):
    """A section's command is read back from one line: a line break in --out cut it, and the
    next rewrite dropped the section."""
    from kdml.errors import KdmlError
    from kdml.reproduce.report import check_quotable

    with pytest.raises(KdmlError, match=r"^--out .* holds a backtick or a line break, which "
                                        r"would cut the report's commands short; choose a path "
                                        r"without one$"):
        check_quotable(Path(path), "--out")


def test_a_users_file_where_one_cell_s_chart_plot_goes_is_refused_before_anything_trains(
        tmp_path):
    """The chart plot of a table where one cell of two draws charts (Atlas beside a baseline
    that has none): refused by check_plots, not by the write after the runs trained."""
    from kdml.errors import KdmlError
    from kdml.reproduce.report import check_plots, plots_folder

    plots = plots_folder(tmp_path / "report.md")
    plots.mkdir()
    (plots / "hand-charts-charts.png").write_bytes(b"mine")
    experiment = Experiment("hand-charts", "atlas", "Table 3", "t", "digits",
                            (Cell("MTriplet", "mtriplet", (), plot_charts=True),
                             Cell("Triplet", "triplet", ())), ("recall@1",), common=TINY)
    with pytest.raises(KdmlError, match=r"hand-charts-charts\.png is in the way and kdml did "
                                        r"not draw it"):
        check_plots(tmp_path / "report.md", [experiment])


# ---- the trainer's progress bars

def test_progress_draws_every_training_bar_and_closes_each(tmp_path, monkeypatch):
    """With progress=True the epoch's bar is drawn too (not left to tqdm's terminal rule) and
    cleared when its epoch ends (the epochs bar stays), and the epochs bar is closed when its
    loop ends: its last count is drawn."""
    import io

    from tqdm.auto import tqdm

    from kdml.config import resolve_config
    from kdml.training import trainer
    from kdml.training.recipes import get_recipe

    made = []

    def recording_tqdm(*args, **kwargs):
        bar = tqdm(*args, **kwargs)
        made.append((kwargs.get("desc"), kwargs.get("disable"), kwargs.get("leave", True), bar))
        return bar

    monkeypatch.setattr(trainer, "tqdm", recording_tqdm)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    recipe = get_recipe("amsoftmax")
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, {}, [
        "data.dataset=digits", "train.epochs=2", "train.steps_per_epoch=2",
        "data.batch_size=20", "model.embedding_size=8", "eval.nmi=false", "train.device=cpu"])
    trainer.train(config, tmp_path / "run", progress=True)
    assert [(desc, disable, leave) for desc, disable, leave, _ in made] == [
        ("epochs", False, True), ("epoch 1", False, False), ("epoch 2", False, False)]
    assert all(bar.disable for *_, bar in made)  # tqdm's close() sets it
    # resumed for a third epoch: its epochs bar starts at the two done, not at 0
    made.clear()
    more = resolve_config(recipe.name, recipe.params, recipe.defaults, {}, [
        "data.dataset=digits", "train.epochs=3", "train.steps_per_epoch=2",
        "data.batch_size=20", "model.embedding_size=8", "eval.nmi=false", "train.device=cpu"])
    trainer.train(more, tmp_path / "run", resume=True, progress=True)
    assert [(bar.desc, bar.n, bar.total) for *_, bar in made] == [
        ("epochs", 3, 3), ("epoch 3", 2, 2)]
    assert made[0][3].format_dict["initial"] == 2
