"""Config grids as a user drives them, as a fuzzing session found them mishandled: every
cell's dataset checked before the first trains, a diverging cell recorded rather than blocking
the grid, a grid over train.select_metric refused, and the grid folder's marker never replaced
under another grid."""

from __future__ import annotations

import pytest
from fixtures_grids import grid_file, instant_cells

from kdml import cli
from kdml.errors import KdmlError
from kdml.training import trainer
from kdml.training.grid import MARKER, check_grid_folder, grid_cells, recorded_cells, write_marker
from kdml.training.nonfinite import NonFiniteLoss
from kdml.training.run_folder import RunFolder


@pytest.fixture
def trained(monkeypatch):
    """Cells that 'train' at once (one validation epoch in metrics.json); the list records
    the run folders trained."""
    return instant_cells(monkeypatch, {"recall@1": 0.5, "map@r": 0.1})


def test_a_later_cell_s_unknown_dataset_is_refused_before_anything_trains(tmp_path, capsys,
                                                                          trained):
    """Only the first cell's data.dataset was checked up front: cell 1 trained, then cell 2
    stopped the grid ('unknown dataset'), and no corrected command could continue it there."""
    assert cli.main(grid_file(tmp_path, {"data.dataset": ["digits", "bogus"]})) == 2
    assert "unknown dataset 'bogus'" in capsys.readouterr().err
    assert trained == []


@pytest.mark.parametrize(("grid", "said"), [
    ({"model.backbone": ["auto", "resnet999"]},
     "grid cell backbone=resnet999: unknown backbone 'resnet999'; choose one of: "),
    ({"model.backbone": ["auto", "timm:"]}, "grid cell backbone=timm_: name the model, e.g. "
                                            "timm:resnet50; nothing was trained"),
    ({"data.pca_dim": [0, 8]}, "grid cell pca_dim=8: data.pca_dim applies to domain pairs "
                               "(SOURCE->TARGET) only; nothing was trained"),
    ({"model.backbone": ["mlp", "cnn"], "model.small_input": [False, True]},
     "grid cell backbone=mlp-small_input=True: model.small_input swaps the stem of timm and "),
    ({"data.root": ["", "/nowhere"]}, "grid cell root=_nowhere: --data-root /nowhere "
                                      "(data.root) is read only by the on-disk formats"),
    ({"train.device": ["cpu", "cuda:99"]}, "grid cell device=cuda_99: train.device=cuda:99 ")])
def test_a_later_cell_s_setting_wrong_whatever_the_data_is_refused_before_anything_trains(
        tmp_path, capsys, trained, grid, said):
    """A backbone that does not exist (or has no stem for model.small_input), a data.pca_dim
    on a dataset that is no domain pair, a data.root the dataset does not read or a device
    this machine lacks was refused when its cell built its model or read its data: the cells
    before it had trained, into a folder the corrected grid cannot continue (another grid's
    cells)."""
    assert cli.main(grid_file(tmp_path, grid)) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert trained == []
    assert not (tmp_path / "grid").exists()


def test_a_grid_folder_inside_a_later_cell_s_image_folder_is_refused(tmp_path, capsys,
                                                                    trained):
    """check_outside_image_folders saw only the first cell's dataset: a grid over
    data.dataset with a folder: cell wrote its run folders (and their PNG plots) inside that
    image folder, which the next read of it took for one more class."""
    images = tmp_path / "photos"
    (images / "a").mkdir(parents=True)
    arguments = grid_file(tmp_path, {"data.dataset": ["digits", f"folder:{images}"]})
    arguments[arguments.index("--out") + 1] = str(images / "grid")
    assert cli.main(arguments) == 2
    assert "would lie inside" in capsys.readouterr().err
    assert trained == []
    assert not (images / "grid").exists()


def test_a_later_cell_that_does_not_score_select_metric_trains_nothing(tmp_path, capsys):
    """README: with data.validation, a train.select_metric that the cells do not score is
    refused. The cell eval.ks=[2, 4] (no recall@1) was refused only when its turn came, after
    the first cell had trained into the folder."""
    arguments = grid_file(tmp_path, {"eval.ks": [[1, 2], [2, 4]]}, {"validation": 0.4})
    assert cli.main(arguments) == 2
    assert capsys.readouterr().err == (
        "kdml: error: grid cell ks=_2_4_: train.select_metric='recall@1' is not scored by this "
        "run; choose one of recall@2, recall@4, map@r, r_precision; nothing was trained\n")
    assert not (tmp_path / "grid" / "ks=_1_2_").exists()


@pytest.mark.parametrize("keep_best", [False, True])
def test_a_diverging_cell_does_not_stop_the_rest_of_the_grid(tmp_path, capsys, monkeypatch,
                                                             trained, keep_best):
    """A learning rate that diverges is a result of a hyperparameter search (best_cells: a NaN
    score is never best), yet the grid stopped at that cell; the same command retrained it,
    diverged again, and never reached the other cells. With keep_best, the epochs it scored
    before diverging (here a high one) do not make it the best cell either."""
    plain = trainer.train

    def train(config, run_dir, resume=False, progress=None, **kwargs):
        if config.optim.lr > 1:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text("x: 1\n")  # started, as a real run is
            RunFolder(run_dir).write_metrics([{"epoch": 1, "val/recall@1": 0.99}], None,
                                             "validation")
            raise NonFiniteLoss("training stopped: the 'am_softmax' term became NaN or "
                                "infinite at epoch 1, step 2")
        return plain(config, run_dir, resume, progress, **kwargs)

    monkeypatch.setattr(trainer, "train", train)
    arguments = grid_file(tmp_path, {"optim.lr": [1.0e30, 0.001, 0.01]}, {"validation": 0.4},
                          keep_best=keep_best)
    assert cli.main(arguments) == 0, capsys.readouterr().err
    assert [run.name for run in trained] == ["lr=0.001", "lr=0.01"]
    out = capsys.readouterr().out
    assert "best on validation by recall@1: lr=0.001" in out
    assert "[1/3] lr=1e_30: diverged, so it has no scores and is never best (training " \
           "stopped: the 'am_softmax' term became NaN or infinite at epoch 1, step 2)" in out
    assert "diverged, without scores: lr=1e_30\n" in out


def test_a_grid_over_select_metric_shows_each_cell_s_kept_epoch(tmp_path, capsys,
                                                                monkeypatch):
    """With keep_best, each cell keeps its best epoch by its own train.select_metric, but the
    table showed every cell at its best epoch by the FIRST cell's metric: the map@r cell's row
    gave epoch 1's scores while its best.pt holds epoch 2 (a silently wrong row, and a false
    'tie'). Either refuse a grid over train.select_metric or show each cell's kept epoch."""
    history = [{"epoch": 1, "val/recall@1": 0.9, "val/map@r": 0.2},
               {"epoch": 2, "val/recall@1": 0.8, "val/map@r": 0.6}]

    def train(config, run_dir, resume=False, progress=None, **_):
        run_dir.mkdir(parents=True, exist_ok=True)
        final = {"recall@1": 0.8, "map@r": 0.6}
        RunFolder(run_dir).write_metrics(history, final, "validation")
        return final

    monkeypatch.setattr(trainer, "train", train)
    arguments = grid_file(tmp_path, {"train.select_metric": ["recall@1", "map@r"]},
                          {"validation": 0.4}, epochs=2, keep_best=True)
    assert cli.main(arguments) == 2
    assert capsys.readouterr().err == (
        "kdml: error: the grid's cells have different train.select_metric (recall@1, map@r), "
        "but one table compares its cells by one metric (and had shown each at the first's "
        "best epoch); give every cell the same train.select_metric, one grid per metric\n")


def test_a_grid_marker_written_meanwhile_by_another_grid_is_not_replaced(tmp_path):
    """Two different grids started into one new folder both find no grid.yaml, then each writes
    its own, the later replacing the earlier (write_through_new_file replaces by default): both
    train into the folder, and the first grid's next run is refused as 'another grid's'."""
    root = tmp_path / "grid"
    first, second = grid_cells({"optim.lr": [0.1, 0.2]}), grid_cells({"optim.lr": [0.3]})
    assert check_grid_folder(root, first) is False
    assert check_grid_folder(root, second) is False
    write_marker(root, second, {"optim.lr": [0.3]})
    with pytest.raises(KdmlError, match=f"another grid started into {root} meanwhile"):
        write_marker(root, first, {"optim.lr": [0.1, 0.2]})
    assert recorded_cells(root) == ["lr=0.3"]
    assert (root / MARKER).is_file()


def test_a_grid_killed_while_its_marker_was_written_makes_way_for_the_same_command(
        tmp_path, capsys, trained):
    """SIGKILL while write_marker wrote grid.yaml leaves its hidden partial
    ``.grid.PID.XXXX.yaml`` alone in the folder (kdml's own, as a run's config partial is): the
    same command had said "--out ... is not empty and holds no grid" (``ls`` shows it empty)."""
    root = tmp_path / "grid"
    root.mkdir()
    (root / ".grid.10806.fd201ee2.yaml").write_text("grid:\n  optim.lr: [0.1")  # cut short
    assert cli.main(grid_file(tmp_path, {"optim.lr": [0.1, 0.2]})) == 0, capsys.readouterr().err
    assert recorded_cells(root) == ["lr=0.1", "lr=0.2"] and len(trained) == 2
    assert not (root / ".grid.10806.fd201ee2.yaml").exists()  # kdml's: gone, not left hidden
    user = tmp_path / "mine"
    user.mkdir()
    (user / ".grid.10806.fd201ee2.yaml.bak").write_text("mine")  # not the partial's name
    with pytest.raises(KdmlError, match="is not empty and holds no grid"):
        check_grid_folder(user, grid_cells({"optim.lr": [0.1]}))


def test_a_cell_stopped_after_its_first_checkpoint_is_resumed_by_the_same_command(
        tmp_path, capsys, monkeypatch):
    """A grid stopped (Ctrl-C) in a cell's second epoch goes on from that cell's checkpoint
    with the same command; started anew, the cell would be refused as a folder that "already
    holds a run" (it saved a checkpoint), and the grid could not continue there."""
    real = trainer.train_one_epoch

    def stopped_in_epoch_2(session, epoch, progress):
        if epoch == 2:
            raise KeyboardInterrupt
        return real(session, epoch, progress)

    arguments = grid_file(tmp_path, {"optim.lr": [0.1, 0.2]}, epochs=2)
    with monkeypatch.context() as patched:
        patched.setattr(trainer, "train_one_epoch", stopped_in_epoch_2)
        assert cli.main(arguments) == 130
    cell = RunFolder(tmp_path / "grid" / "lr=0.1")
    assert cell.checkpoint.is_file() and cell.final_metrics() is None
    capsys.readouterr()
    assert cli.main(arguments) == 0, capsys.readouterr().err
    assert [row["epoch"] for row in cell.history()] == [1, 2]
    assert cell.final_metrics() is not None
