"""Run folders under concurrent and interrupted use: the commands that read a run (eval,
analyze, plot, embed) while another process trains it, or while it is moved."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from kdml import cli
from kdml.inspection import analysis, plots
from kdml.training.run_folder import LOCK_NAME, RunFolder, trained_elsewhere


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _moving(run: Path, call):
    """``call``, moving ``run`` away first: as a user's ``mv`` while the command works."""
    def moved(*args, **kwargs):
        os.rename(run, run.with_name("moved"))
        return call(*args, **kwargs)

    return moved


def _refused_as_moved(run: Path, written: str, err: str) -> None:
    assert err == (f"kdml: error: the run folder {run} was moved or deleted while kdml read it, "
                   f"so its {written} is not written; give the command the folder where the "
                   "run is now\n")
    assert not run.exists()  # not made again, holding that file alone
    assert not (run.with_name("moved") / written).exists()


def test_eval_of_a_run_moved_while_scored_writes_nothing_at_its_old_path(
        trained_run, tmp_path, monkeypatch, capsys):
    from kdml.evaluation import evaluator

    run = _copy(trained_run, tmp_path)
    monkeypatch.setattr(evaluator, "score_method", _moving(run, evaluator.score_method))
    assert cli.main(["eval", str(run), "--no-progress"]) == 2
    shown = capsys.readouterr()
    # the scores are shown before the write, as for a read-only folder
    assert "recall@1" in shown.out
    _refused_as_moved(run, "eval.json", shown.err)


def test_analyze_of_a_run_moved_while_embedded_writes_nothing_at_its_old_path(
        trained_run, tmp_path, monkeypatch, capsys):
    run = _copy(trained_run, tmp_path)
    monkeypatch.setattr(analysis, "generalization_terms",
                        _moving(run, analysis.generalization_terms))
    assert cli.main(["analyze", "generalization", str(run), "--repeats", "2",
                     "--no-progress"]) == 2
    _refused_as_moved(run, "generalization.json", capsys.readouterr().err)


@pytest.mark.parametrize("picture", ["retrieval", "embedding"])
def test_a_plot_of_a_run_moved_while_drawn_writes_nothing_at_its_old_path(
        trained_run, tmp_path, monkeypatch, capsys, picture):
    run = _copy(trained_run, tmp_path)
    # moved once its test part is embedded; the map itself is not what is tested: a fast
    # stand-in for UMAP or t-SNE
    monkeypatch.setattr(plots, "refuse_collapsed", _moving(run, plots.refuse_collapsed))
    monkeypatch.setattr(plots, "embedding_map",
                        lambda values, seed: (np.asarray(values)[:, :2], "first coordinates"))
    assert cli.main(["plot", picture, str(run), "--no-progress"]) == 2
    _refused_as_moved(run, f"plots/{picture}.png", capsys.readouterr().err)


@pytest.fixture
def first_epoch(trained_run, tmp_path) -> Path:
    """A run folder as in its first epoch: its config, data.json, log and lock, no
    checkpoint yet."""
    run = tmp_path / "first"
    run.mkdir()
    for name in ("config.yaml", "data.json"):
        shutil.copy(trained_run / name, run / name)
    first_line = (trained_run / "train.log").read_text().splitlines()[0]
    (run / "train.log").write_text(first_line + "\n")
    (run / LOCK_NAME).touch()
    return run


@pytest.mark.parametrize("command", [["eval", "{run}"], ["embed", "{run}", "--out", "{tmp}/e.npz"],
                                     ["plot", "retrieval", "{run}"]])
def test_a_run_in_its_first_epoch_is_said_to_be_training_not_to_resume(
        first_epoch, tmp_path, command, capsys):
    argv = [*(part.format(run=first_epoch, tmp=tmp_path) for part in command), "--no-progress"]
    with RunFolder(first_epoch).held():  # another process trains it (a second open file)
        assert trained_elsewhere(first_epoch)
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
    # "train it with 'kdml train --resume RUN'" had been refused: the run is being trained
    assert err == (f"kdml: error: no checkpoint at {first_epoch / 'checkpoints' / 'last.pt'} "
                   f"yet: {first_epoch} is being trained by another process, which writes it "
                   "at the end of an epoch; wait for that\n")
    assert not trained_elsewhere(first_epoch)  # let go: the probe holds nothing
    assert cli.main(argv) == 2
    assert "train it with 'kdml train --resume" in capsys.readouterr().err
    assert sorted(path.name for path in first_epoch.iterdir()) == [
        LOCK_NAME, "config.yaml", "data.json", "train.log"]  # the readers wrote nothing


def _keeping_best(run: Path) -> None:
    """``run``'s config.yaml as a run that validates and keeps its best epoch."""
    values = yaml.safe_load((run / "config.yaml").read_text())
    values["data"]["validation"] = 0.2
    values["train"]["keep_best"] = True
    (run / "config.yaml").write_text(yaml.safe_dump(values, sort_keys=False))


def test_best_of_a_keep_best_run_before_its_first_scored_epoch_is_not_denied_keep_best(
        first_epoch, trained_run, tmp_path, capsys):
    best = first_epoch / "checkpoints" / "best.pt"
    # a run without train.keep_best: said so, whether or not it is being trained
    with RunFolder(first_epoch).held():
        assert cli.main(["eval", str(first_epoch), "--best"]) == 2
        assert "only runs trained with train.keep_best=true keep one" in capsys.readouterr().err
    _keeping_best(first_epoch)
    with RunFolder(first_epoch).held():
        assert cli.main(["eval", str(first_epoch), "--best"]) == 2
        assert capsys.readouterr().err == (
            f"kdml: error: no checkpoint at {best} yet: {first_epoch} is being trained by "
            "another process, which writes it at the end of an epoch scored on validation; "
            "wait for that\n")
    # stopped before (it had said "only runs trained with train.keep_best=true keep one")
    assert cli.main(["eval", str(first_epoch), "--best"]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: {first_epoch} has no best.pt: its train.keep_best keeps one from its "
        "first epoch scored on validation, which it has not reached (continue it with 'kdml "
        f"train --resume {first_epoch}'), or the file was removed\n")
    # a run with its last checkpoint: --best's file removed, the last one named instead
    run = _copy(trained_run, tmp_path)
    _keeping_best(run)
    assert cli.main(["eval", str(run), "--best"]) == 2
    assert capsys.readouterr().err.endswith(
        "or the file was removed; without --best, kdml reads its last checkpoint\n")


MOVE_SETTINGS = ["--no-progress", "train.epochs=2", "train.steps_per_epoch=2", "eval.nmi=false",
                 "model.embedding_size=8", "train.device=cpu"]


def test_a_new_run_at_the_old_path_of_a_moved_run_gets_none_of_its_writes(
        tmp_path, monkeypatch, capsys):
    """The user renames the folder of a run still training and starts the same command into
    the old name: the first run took that folder, with its config.yaml, for its own (moved on
    a file system whose inode numbers change) and wrote its checkpoint and metrics there."""
    from kdml.training import recorder

    run, moved = tmp_path / "run", tmp_path / "moved"
    original = recorder.Recorder.epoch

    def epoch_then_move(self, row, *args, **kwargs):
        original(self, row, *args, **kwargs)
        if row["epoch"] == 1:
            run.rename(moved)
            run.mkdir()  # the new run's first files: the same config text, its log, its lock
            (run / "config.yaml").write_text((moved / "config.yaml").read_text())
            (run / "train.log").write_text((moved / "train.log").read_text().splitlines()[0])
            (run / LOCK_NAME).touch()

    monkeypatch.setattr(recorder.Recorder, "epoch", epoch_then_move)
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run),
                     *MOVE_SETTINGS]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: the run folder {run} was moved or deleted while the run trained, so "
        "nothing more is written; a moved folder keeps the epochs trained before: continue "
        "with kdml train --resume NEW_FOLDER\n")
    assert sorted(path.name for path in run.iterdir()) == [LOCK_NAME, "config.yaml",
                                                          "train.log"]
    assert (moved / "checkpoints" / "last.pt").is_file()


def test_a_run_folder_whose_inode_number_changes_is_not_taken_for_moved(
        tmp_path, monkeypatch, capsys):
    """A file system whose folders' inode numbers change between two looks (as some network
    and FUSE file systems give them) trains the run to its end."""
    from kdml.training import recorder

    looks = iter(range(10**6))
    monkeypatch.setattr(recorder, "_identity", lambda folder: (0, next(looks)))
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run),
                     *MOVE_SETTINGS]) == 0
    assert len(json.loads((run / "metrics.json").read_text())["epochs"]) == 2


def test_a_resumed_run_removes_the_metrics_partials_of_a_killed_session(trained_run, tmp_path):
    """A SIGKILL while a session wrote metrics.json or metrics.csv leaves its hidden partial
    (no except runs): the next session removes it, as it does a checkpoint's; a file of the
    user's of a like name stays."""
    run = _copy(trained_run, tmp_path)
    killed = [run / ".metrics.4242.0a1b2c3d.json", run / ".metrics.4242.0a1b2c3d.csv"]
    for partial in killed:
        partial.write_text("epoch,")  # cut short
    mine = [run / ".metrics.notes.json", run / "plots" / ".metrics.4242.0a1b2c3d.json"]
    for path in mine:
        path.write_text("mine")
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0  # nothing to train
    assert not any(partial.exists() for partial in killed)
    assert all(path.read_text() == "mine" for path in mine)
