"""Fuzzing of ``kdml reproduce``'s report: what a rewrite keeps of the report at ``--out``."""

from __future__ import annotations

import shlex
import shutil

import pytest

from kdml.errors import KdmlError
from kdml.reproduce.catalog import experiments
from kdml.reproduce.experiments import Cell, Experiment
from kdml.reproduce.report import (
    MARKER,
    ReportContext,
    Section,
    _command,
    check_outputs,
    keep_reported,
    reported_sections,
)
from kdml.reproduce.runner import reproduce


@pytest.mark.parametrize("name", ["a`b.md", "notes `v2`.md"])
def test_a_report_at_a_path_with_a_backtick_keeps_its_sections(tmp_path, name):
    """A section's command names --out in a Markdown code span; a backtick in the path ended
    the span early, so the section was not recognised when the report was read back, and
    the next ``--only`` of another experiment on that report dropped it unsaid (and, at other
    --seeds, replaced it without the refusal a section written at other --seeds gets).
    kdml must either refuse such an --out before anything trains, or read its own sections
    back."""
    report = tmp_path / name
    experiment = next(e for e in experiments("jrd", quick=True)
                      if e.key == "jrd-alpha-mnist5k")
    # as the command line makes it (cli/reproduce.py): --out and --runs shell-quoted
    context = ReportContext(command="kdml reproduce jrd", machine="cpu", versions="",
                            wall_minutes=0.0, seeds=3, quick=True, out=shlex.quote(str(report)),
                            runs=shlex.quote(str(tmp_path / "runs")), device="cpu")
    try:
        check_outputs(report)
    except KdmlError:
        return  # refused up front: nothing can be lost
    report.write_text(f"{MARKER}\n\n# Reproduction\n\n## JRD\n\n### Chu et al. 2020, Figure 4: "
                      f"mnist5k\n\nRecall@1 as alpha grows. Command: "
                      f"`{_command(experiment, context)}`.\n\n| | R@1 |\n|---|---|\n")
    assert reported_sections(report) == [Section("jrd-alpha-mnist5k", 3, True)]


TINY = ("train.epochs=1", "train.steps_per_epoch=1", "eval.nmi=false", "data.batch_size=40",
        "model.embedding_size=8")


def _tiny_alpha_experiment() -> Experiment:
    """Two tiny jrd cells on digits, alpha = 0 and alpha = 1, whose Recall@1 differ."""
    cells = (Cell("alpha = 0", "jrd", ("method.alpha=0",)),
             Cell("alpha = 1", "jrd", ("method.alpha=1",)))
    return Experiment("tiny-alpha", "jrd", "Figure 4", "alpha", "digits", cells, ("recall@1",),
                      common=TINY)


def test_a_run_folder_holding_another_configuration_s_run_is_not_read_as_this_cell(tmp_path):
    """A finished run is reused by its folder's name alone: a folder that holds another
    configuration's run (records copied between runs folders, as results/README.md tells of,
    under the wrong name) gave its numbers to the cell, with the cell's settings printed
    beside them. Its config.yaml says which run it is: kdml must notice that it is not the
    planned one (refuse it in one line, or train the planned run), never report it as the
    cell's."""
    experiment = _tiny_alpha_experiment()
    runs = tmp_path / "runs"
    first = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)[0]
    zero, one = first.cells["alpha = 0"], first.cells["alpha = 1"]
    assert zero.values["recall@1"] != one.values["recall@1"]  # else the test shows nothing
    # alpha = 0's records put where alpha = 1's run goes
    shutil.rmtree(one.run_dirs[0])
    shutil.copytree(zero.run_dirs[0], one.run_dirs[0])
    again = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)[0]
    assert again.error or again.cells["alpha = 1"].values["recall@1"] != zero.values["recall@1"]


@pytest.mark.parametrize("edit", ["optim.lr", "copied"])
def test_an_interrupted_run_whose_config_yaml_is_not_the_planned_run_is_not_resumed(
        tmp_path, monkeypatch, edit):
    """Only a finished run's config.yaml was compared with the planned run: an interrupted
    one (no reproduce.json) resumed with the planned config, so an edit of its config.yaml
    went unseen, its numbers were reported, and the next same command refused the finished
    run as "another run"; a run copied in under another's name was refused in the words of
    ``kdml train --resume`` ("was edited since its checkpoint ... put the setting back").
    Either is refused as a finished one is, and nothing trains."""
    from kdml.reproduce import runner

    experiment = _tiny_alpha_experiment()
    runs = tmp_path / "runs"
    first = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)[0]
    run_dir = first.cells["alpha = 1"].run_dirs[0]
    if edit == "copied":  # alpha = 0's run where alpha = 1's goes
        shutil.rmtree(run_dir)
        shutil.copytree(first.cells["alpha = 0"].run_dirs[0], run_dir)
    else:  # its config.yaml edited by hand
        config = run_dir / "config.yaml"
        config.write_text(config.read_text().replace("  lr: 0.001\n", "  lr: 0.005\n", 1))
    (run_dir / runner.TIMING_FILE).unlink()  # as if stopped before its end: not finished
    trained: list[object] = []
    monkeypatch.setattr(runner, "train", lambda *args, **kwargs: trained.append(args))
    again = reproduce([experiment], 1, runs, "cpu", progress=False, echo=lambda line: None)[0]
    assert again.error.startswith(f"{run_dir} holds another run than the one planned there ("
                                  f"{'optim.lr' if edit == 'optim.lr' else 'method.alpha'} is ")
    assert trained == []


def test_a_section_of_an_experiment_kdml_no_longer_has_is_not_called_unfinished(tmp_path):
    """A report holding the section of an experiment key the catalog does not have (renamed or
    removed since) was refused as if its runs were not finished, with the advice to give
    the --seeds, --runs and --device it was written with: none of them can ever make it
    readable. The refusal must say that kdml has no such experiment."""
    report = tmp_path / "report.md"
    report.write_text(f"{MARKER}\n\n# Reproduction\n\n### Old table: mnist5k\n\nOld. Command: "
                      "`kdml reproduce jrd --only jrd-renamed-mnist5k --seeds 3 --quick "
                      "--device cpu`.\n\n| | R@1 |\n|---|---|\n| a | 0.5 |\n")
    catalog = experiments("all", quick=True)
    chosen = [e for e in catalog if e.key == "jrd-alpha-mnist5k"]
    with pytest.raises(KdmlError) as refused:
        keep_reported(chosen, catalog, report, 3, True, tmp_path / "runs", "cpu")
    message = str(refused.value)
    assert "jrd-renamed-mnist5k (an experiment this kdml does not have" in message
    assert "not all finished" not in message and "--seeds, --runs" not in message
    assert message.endswith(f"; choose another --out, or delete {report} first")


def test_a_report_name_with_a_space_links_its_plots_in_angle_brackets(tmp_path):
    """``![x](my rep-plots/x.png)`` is no link in CommonMark (a bare destination ends at the
    space): GitHub showed the text. A rewrite still removes the stale plots so linked."""
    import matplotlib.pyplot as plt

    from kdml.figure_file import write_png
    from kdml.reproduce.report import PLOTS_MARKER, _relative, _remove_unlinked_plots

    plots = tmp_path / "my rep-plots"
    assert _relative(plots / "a b.png", tmp_path) == "<my rep-plots/a b.png>"
    assert _relative(tmp_path / "rep-plots" / "a.png", tmp_path) == "rep-plots/a.png"
    plots.mkdir()
    (plots / PLOTS_MARKER).touch()
    figure = plt.figure()
    for name in ("stale", "kept"):
        write_png(figure, plots / f"{name}.png")
    plt.close(figure)
    before = "![s](<my rep-plots/stale.png>)\n![k](<my rep-plots/kept.png>)\n"
    _remove_unlinked_plots(plots, "![k](<my rep-plots/kept.png>)\n", before)
    assert [path.name for path in plots.glob("*.png")] == ["kept.png"]


def test_a_runs_folder_with_a_backtick_is_refused_before_anything_trains(tmp_path, capsys):
    from kdml import cli

    runs = tmp_path / "a`b"
    assert cli.main(["reproduce", "jrd", "--quick", "--only", "jrd-alpha-mnist5k", "--runs",
                     str(runs), "--out", str(tmp_path / "report.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: --runs {str(runs)!r} holds a backtick")
    assert err.count("\n") == 1 and not runs.exists()


@pytest.mark.parametrize("quick", [True, False])
def test_atlas_table2_names_the_one_dataset_whose_paper_numbers_it_shows(quick):
    """Its paper column had said "MNIST (60,000) or Fashion-MNIST" beside MNIST's numbers."""
    table2 = [e for e in experiments("atlas", quick=quick)
              if e.key.startswith("atlas-table2-") and "-cnn-" not in e.key]
    assert table2
    for experiment in table2:
        named = {"mnist5k": "MNIST (60,000)", "fashion-mnist": "Fashion-MNIST (60,000)"}
        assert experiment.paper_data == (f"{named[experiment.dataset]}, ResNet-18, 100 epochs, "
                                         "3 runs")
