"""Config grids as users run them (an audit of grid journeys): a grid over eval.nmi chosen by
NMI refused before its first cell trains, a cell another command trains now said so, rather
than as a failure of this one whose training "is kept", and a grid given no --out naming the
--out that continues it."""

from __future__ import annotations

import pytest
from fixtures_grids import grid_file

from kdml import cli
from kdml.errors import KdmlError
from kdml.training import trainer
from kdml.training.run_folder import RunFolder


@pytest.fixture
def trained(monkeypatch):
    """Cells that 'train' at once (one validation epoch in metrics.json, NMI included); the
    list records the run folders trained."""
    runs: list = []

    def train(config, run_dir, resume=False, progress=None, **_):
        runs.append(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        final = {"recall@1": 0.5, "nmi": 0.25}
        RunFolder(run_dir).write_metrics([{"epoch": 1, "val/recall@1": 0.5, "val/nmi": 0.25}],
                                         final, "validation")
        return final

    monkeypatch.setattr(trainer, "train", train)
    return runs


def test_a_grid_over_eval_nmi_chosen_by_nmi_trains_nothing(tmp_path, capsys):
    """README: with data.validation, a train.select_metric that the cells do not score is
    refused, and the cells' needs are checked before the first trains. A cell of eval.nmi=false
    scored at the dataset's own Ks (eval.ks unset) had been refused only at its turn, after the
    first cell trained, with "the same command continues there once the cause is fixed outside
    the grid": the cause is the grid, which the folder then no longer takes."""
    arguments = grid_file(tmp_path, {"eval.nmi": [True, False]}, {"validation": 0.4},
                          select_metric="nmi")
    assert cli.main(arguments) == 2
    assert capsys.readouterr().err == (
        "kdml: error: grid cell nmi=False: train.select_metric='nmi' is not scored by this "
        "run, whose eval.nmi is false; set eval.nmi: true in every cell, or choose a metric it "
        "scores (a Recall@K, map@r, r_precision); nothing was trained\n")
    assert not (tmp_path / "grid" / "nmi=True").exists()


def test_a_grid_chosen_by_nmi_that_every_cell_scores_trains(tmp_path, capsys, trained):
    """The check above refuses only a cell without NMI: with eval.nmi on (its default) in every
    cell, a grid chosen by NMI at the dataset's own Ks trains and names its best cell."""
    arguments = grid_file(tmp_path, {"optim.lr": [0.1, 0.2]}, {"validation": 0.4},
                          select_metric="nmi")
    arguments[arguments.index("--config") + 1:arguments.index("--config") + 2] = [
        _with_nmi(tmp_path / "grid.yaml")]
    assert cli.main(arguments) == 0, capsys.readouterr().err
    assert len(trained) == 2
    assert "best on validation by nmi: lr=0.1 (tied at 0.2500" in capsys.readouterr().out


def _with_nmi(file) -> str:
    """``file``, a grid_file config, with eval.nmi left at its default (on)."""
    import yaml

    config = yaml.safe_load(file.read_text())
    del config["eval"]["nmi"]
    file.write_text(yaml.safe_dump(config))
    return str(file)


def test_a_cell_another_command_trains_now_is_said_so(tmp_path, capsys, monkeypatch):
    """The same grid command run twice at once: the second meets the first's cell (its
    config.yaml written, its folder held). It had said "grid cell lr=0.1 failed: ... is being
    trained by another process ... -- what it trained is kept in GRID: the same command
    continues there once the cause is fixed outside the grid (a changed grid or setting needs
    another --out)", of training it never did."""
    arguments = grid_file(tmp_path, {"optim.lr": [0.1, 0.2]})

    def stopped(session, epoch, progress):  # the other command, in the cell's first epoch
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(trainer, "train_one_epoch", stopped)
        assert cli.main(arguments) == 130
    cell = RunFolder(tmp_path / "grid" / "lr=0.1")
    assert cell.config.is_file()
    capsys.readouterr()
    with cell.held():  # the other command trains it now
        assert cli.main(arguments) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: grid cell lr=0.1 in {tmp_path / 'grid'} is being trained by another "
        "process (this grid run twice at once?); let it finish or stop it, then the same "
        "command continues the grid\n")
    assert not (tmp_path / "grid" / "lr=0.2").exists()
    assert cli.main(arguments) == 0, capsys.readouterr().err  # once it let go: as it said
    assert cell.final_metrics() is not None


def _failing_from(seed: int):
    """A stand-in for ``train``: cells of a lower train.seed finish at once (recall@1 0.5),
    the cell of ``seed`` is refused before it writes anything, as a data check refuses it."""
    def train(config, run_dir, resume=False, progress=None, **_):
        if config.train.seed >= seed:
            raise KdmlError("a cause outside the grid")
        RunFolder(run_dir).write_metrics([{"epoch": 1, "test/recall@1": 0.5}],
                                         {"recall@1": 0.5})
        return {"recall@1": 0.5}
    return train


@pytest.mark.parametrize(("failing", "said"), [
    (1, "the cell before it is kept in {root}: the same command with --out {root} continues "
        "there once the cause is fixed"),
    (0, "nothing was trained; the same command, corrected and given --out {root}, goes on "
        "there\n"),
], ids=["after-a-cell", "nothing-trained"])
def test_a_grid_without_out_names_the_out_that_continues_it(tmp_path, capsys, monkeypatch,
                                                            failing, said):
    """Without --out a grid goes into runs/RECIPE-DATASET-TIME, and the same command makes
    another such folder and trains every cell again: "the same command continues there" had
    been true only of a grid given its --out."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trainer, "train", _failing_from(failing))
    arguments = grid_file(tmp_path, {"train.seed": [0, 1]})
    arguments = arguments[:arguments.index("--out")] + ["--no-progress"]
    assert cli.main(arguments) == 2
    [root] = (tmp_path / "runs").iterdir()
    root = root.relative_to(tmp_path)
    assert said.format(root=root) in capsys.readouterr().err
    monkeypatch.setattr(trainer, "train", _failing_from(2))  # the cause fixed
    assert cli.main([*arguments, "--out", str(root)]) == 0
    finished = "[1/2] seed=0: finished earlier\n" in capsys.readouterr().out
    assert finished == (failing == 1)  # its cell trained before is kept, not trained again
    assert [path.name for path in (tmp_path / "runs").iterdir()] == [root.name]
