"""Training dynamics, as a fuzzing session checked them literally (parameter groups, every
step's learning rate under each schedule, determinism and bit-identical resumption held):
optimiser constants beyond float32 taken (a traceback, or Adam's epsilon infinite and a run
that trained nothing), and optim.lr_gamma without a step schedule taken without a word."""

from __future__ import annotations

import pytest

from kdml import cli


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
