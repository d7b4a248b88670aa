"""Config grids as users run them (an audit of grid journeys): a grid over eval.nmi chosen by
NMI refused before its first cell trains, a cell another command trains now said so, rather
than as a failure of this one whose training "is kept", and a grid given no --out naming the
--out that continues it."""

from __future__ import annotations

import pytest
from fixtures_grids import grid_file, instant_cells

from kdml import cli
from kdml.errors import KdmlError
from kdml.training import trainer
from kdml.training.grid import changed_setting
from kdml.training.run_folder import RunFolder


@pytest.fixture
def trained(monkeypatch):
    """Cells that 'train' at once (one validation epoch in metrics.json, NMI included); the
    list records the run folders trained."""
    return instant_cells(monkeypatch, {"recall@1": 0.5, "nmi": 0.25})


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


def test_a_stopped_grid_goes_on_elsewhere_but_not_with_other_results(tmp_path, capsys,
                                                                    monkeypatch):
    """A grid stopped on one machine goes on on another: its cells' device, data.root, loader
    processes, embedding batch and compile flag may differ from those they started with, as
    `kdml train --resume` lets a run's (a cell already finished is kept, one started resumes
    with the new values); a setting of what the cells train is still refused. They had all
    been refused as "trained with other settings", so a grid begun on a CPU could not finish
    on a GPU lent since. A grid of one cell says "1 run"."""
    import yaml

    calls: list = []

    def train(config, run_dir, resume=False, progress=None, **_):
        calls.append((run_dir.name, resume, config.eval.embed_batch_size))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
        if run_dir.name == "seed=1" and not resume:  # stopped in its first epoch
            raise KeyboardInterrupt
        final = {"recall@1": 0.5}
        RunFolder(run_dir).write_metrics([{"epoch": 1, "recall@1": 0.5}], final, "test")
        return final

    monkeypatch.setattr(trainer, "train", train)
    args = grid_file(tmp_path, {"seed": [0, 1]})
    assert cli.main(args) != 0
    assert calls == [("seed=0", False, 256), ("seed=1", False, 256)]
    capsys.readouterr()
    elsewhere = ["data.num_workers=1", "eval.embed_batch_size=64", "train.compile=true"]
    assert cli.main([*args, *elsewhere]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "[1/2] seed=0: finished earlier" in out
    assert calls[2:] == [("seed=1", True, 64)]
    assert cli.main([*args, "method.margin=0.3"]) == 2
    assert "was trained with other settings (method.margin: " in capsys.readouterr().err
    # the data in another folder (digits reads none, so the function itself)
    assert changed_setting({"data": {"root": "/a", "dataset": "cub"}},
                           {"data": {"root": "/b", "dataset": "cub"}}) is None
    one = grid_file(tmp_path / "one", {"seed": [0]})
    assert cli.main(one) == 0
    assert capsys.readouterr().out.startswith("grid of 1 run of amsoftmax on digits into ")
