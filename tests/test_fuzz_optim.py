"""Training dynamics, as a fuzzing session checked them literally (parameter groups, every
step's learning rate under each schedule, determinism and bit-identical resumption held):
a run extended with --resume that stopped where a run of that length goes on (train.patience
had counted the score of the shorter run's last epoch off the train.eval_every grid),
optimiser constants beyond float32 taken (a traceback, or Adam's epsilon infinite and a run
that trained nothing), and optim.lr_gamma without a step schedule taken without a word."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from kdml import cli
from kdml.evaluation.evaluator import Scores
from kdml.training import trainer

# scores by epoch: the model after epoch 3 scores lower than after epoch 2, every later
# scored epoch (4, 6) higher than all before it
SCORE_OF_EPOCH = {2: 0.5, 3: 0.4, 4: 0.6, 6: 0.7}


def scores_by_epoch(monkeypatch) -> list[int]:
    """Score each epoch by SCORE_OF_EPOCH (the epoch read from the run's history length);
    returns the list of epochs scored."""
    scored: list[int] = []
    score = trainer.Session.score

    def scripted(self, epoch, row, progress=None):
        scored.append(epoch)
        calls = iter([Scores({"recall@1": SCORE_OF_EPOCH.get(epoch, 0.0), "map@r": 0.0})])
        monkeypatch.setattr(trainer, "score_method", lambda *args: next(calls))
        score(self, epoch, row, progress)

    monkeypatch.setattr(trainer.Session, "score", scripted)
    return scored


def test_raising_epochs_of_a_run_with_eval_every_ends_where_a_longer_run_ends(
        tmp_path, tiny_overrides, monkeypatch):
    """README: raise train.epochs in a finished run's config.yaml and --resume trains the
    extra epochs, "ending with the model a run of that length trains from the start". With
    train.eval_every=2 the short run scores its last epoch (3), which the longer run never
    scores; that extra evaluation counts towards train.patience, so the short run is marked
    as stopped early and the resumed run trains nothing more, where the longer run trains all
    6 epochs."""
    settings = ["--dataset", "digits", "--no-progress", *tiny_overrides, "data.batch_size=12",
                "data.validation=0.4", "train.eval_every=2", "train.patience=1",
                "train.steps_per_epoch=1"]
    scored = scores_by_epoch(monkeypatch)
    whole = tmp_path / "whole"
    assert cli.main(["train", "amsoftmax", "--out", str(whole), *settings,
                     "train.epochs=6"]) == 0
    assert scored == [2, 4, 6]
    scored.clear()
    short = tmp_path / "short"
    assert cli.main(["train", "amsoftmax", "--out", str(short), *settings,
                     "train.epochs=3"]) == 0
    config = yaml.safe_load((short / "config.yaml").read_text())
    config["train"]["epochs"] = 6
    (short / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["train", "--resume", str(short), "--no-progress"]) == 0
    resumed = torch.load(short / "checkpoints" / "last.pt", weights_only=True)
    expected = torch.load(whole / "checkpoints" / "last.pt", weights_only=True)
    assert resumed["epoch"] == expected["epoch"] == 6
    assert all(torch.equal(resumed["method"][key], value)
               for key, value in expected["method"].items())
    epochs = json.loads((short / "metrics.json").read_text())["epochs"]
    assert [row["epoch"] for row in epochs] == list(range(1, 7))


@pytest.mark.parametrize("setting", ["optim.weight_decay=1e39", "optim.weight_decay=1e300",
                                     "optim.adam_eps=1e39"])
def test_an_optimiser_constant_beyond_float32_is_refused_in_one_line(
        setting, tmp_path, tiny_overrides, capsys):
    """As optim.lr is capped (MAX_LR: float32 overflows at 3.4e+38): a weight decay that
    float32 cannot hold stopped the first step with torch's RuntimeError ('value cannot be
    converted to type float without overflow'), a traceback, after the run folder was made;
    an Adam epsilon beyond it becomes inf and every update 0, so the run trained nothing and
    reported the untrained model's scores, without a word."""
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "train.steps_per_epoch=1",
                     setting]) == 2
    err = capsys.readouterr().err
    assert setting.split("=")[0] in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("recipe", ["jrd", "mtriplet"])
def test_a_decay_factor_without_a_step_schedule_is_warned_of(recipe, tmp_path,
                                                             tiny_overrides, capsys):
    """optim.lr_gamma multiplies the rates only at optim.lr_step or optim.lr_milestones; with
    neither (every recipe's default) it is never read, and a grid over it trains the same run
    in every cell. README: a setting given another value than the recipe's default that the
    run never reads is warned of, as optim.adam_eps with another optimiser is."""
    out = tmp_path / "run"
    assert cli.main(["train", recipe, "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "train.epochs=1",
                     "train.steps_per_epoch=1", "optim.lr_gamma=0.5"]) == 0
    err = capsys.readouterr().err
    assert "kdml: warning: optim.lr_gamma is not read by this run" in err, err
    assert "optim.lr_gamma is not read by this run" in (out / "train.log").read_text()
