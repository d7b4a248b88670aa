"""data.train_classes and data.holdout_fraction where the split does not read them: refused for
a run about to train (test_real_data.py), but a trained run is still evaluated, embedded and
resumed with them, and another dataset its model embeds drops them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from fixtures_array_sets import make_idx

from kdml import cli

TINY = ["train.epochs=1", "train.steps_per_epoch=2", "model.embedding_size=8", "eval.nmi=false",
        "eval.ks=[1,2]", "train.device=cpu", "--no-progress"]


def kdml(*args: str | Path) -> int:
    return cli.main([str(arg) for arg in args])


def as_an_older_kdml_wrote_it(run: Path, setting: str, before: str, after: str) -> None:
    """Record ``setting`` as ``after`` in the run's config.yaml and its checkpoint's config, as
    a kdml that ignored the setting where the split does not read it had written it."""
    config = run / "config.yaml"
    assert f"{setting}: {before}\n" in config.read_text()
    config.write_text(config.read_text().replace(f"{setting}: {before}\n",
                                                 f"{setting}: {after}\n"))
    checkpoint = run / "checkpoints" / "last.pt"
    state = torch.load(checkpoint, weights_only=False)
    state["config"]["data"][setting] = type(state["config"]["data"][setting])(after)
    torch.save(state, checkpoint)


def assert_evaluated_and_embedded_as_trained(run: Path, metrics: str, tmp_path: Path,
                                             capsys) -> None:
    """``kdml eval`` prints the metrics training printed (the same split), and ``embed``
    writes the test part."""
    assert kdml("eval", run) == 0
    out, err = capsys.readouterr()
    assert "error" not in err, err
    assert out.split("Test metrics")[-1] == metrics
    assert kdml("embed", run, "--out", tmp_path / "test.npz") == 0, capsys.readouterr().err
    assert len(np.load(tmp_path / "test.npz")["labels"]) > 0


def test_an_older_run_with_a_setting_its_split_ignored_is_still_evaluated(tmp_path, capsys):
    """A run whose config.yaml recorded data.holdout_fraction on a class-disjoint split (an
    older kdml ignored it) could no longer be evaluated or embedded: "drop it, or set
    data.split=seen-holdout", advice a finished run cannot follow."""
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", "digits", "--out", run, *TINY) == 0
    metrics = capsys.readouterr().out.split("Test metrics")[-1]
    as_an_older_kdml_wrote_it(run, "holdout_fraction", "0.2", "0.3")
    assert_evaluated_and_embedded_as_trained(run, metrics, tmp_path, capsys)
    # --resume continues it as it trained (its own check refuses an edit of the setting)
    assert kdml("train", "--resume", run, "--no-progress") == 0, capsys.readouterr().err
    assert "all 1 epochs are trained" in (run / "train.log").read_text()


def test_resume_refuses_the_setting_edited_in(tmp_path, capsys):
    """Not refused as a setting its split does not read, the setting added by hand to a run's
    config.yaml is still refused by --resume, as an edit since its checkpoint."""
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", "digits", "--out", run, *TINY) == 0
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("holdout_fraction: 0.2\n",
                                                 "holdout_fraction: 0.3\n"))
    capsys.readouterr()
    assert kdml("train", "--resume", run, "--no-progress") == 2
    assert capsys.readouterr().err.startswith(
        f"kdml: error: {config} was edited since its checkpoint: data.holdout_fraction 0.2 -> "
        "0.3; --resume continues")


def test_another_dataset_with_a_split_of_its_own_drops_the_runs_split_setting(tmp_path,
                                                                               capsys):
    """Trained on mnist5k's class-disjoint split with data.train_classes, the run's model
    embedded fashion-mnist (a split of its own, which reads no train_classes) before that
    setting was refused; then it was refused, for a run that has nothing left to change."""
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", "mnist5k", "data.train_classes=0.6", "--out",
                run, *TINY) == 0
    root = make_idx(tmp_path / "data", train=30, test=20, name="fashion-mnist", gzipped=False)
    capsys.readouterr()
    out = tmp_path / "fm.npz"
    assert kdml("embed", run, "--dataset", "fashion-mnist", "--data-root", root,
                "--out", out) == 0, capsys.readouterr().err
    assert len(np.load(out)["labels"]) == 20  # its own test part (t10k), not 40% of classes


def test_a_run_resumed_before_its_first_checkpoint_is_refused_as_a_new_run(tmp_path, capsys):
    """--resume of a run that stopped before its first checkpoint trains it from epoch 1: its
    config can still change, so the setting is refused as for a new run, and once dropped as
    told the run trains."""
    run = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", "digits", "--out", run, *TINY) == 0
    for name in ("checkpoints", "plots", "tensorboard"):
        shutil.rmtree(run / name, ignore_errors=True)
    for name in ("metrics.csv", "metrics.json"):
        (run / name).unlink()
    config = run / "config.yaml"
    trained = config.read_text()
    config.write_text(trained.replace("holdout_fraction: 0.2\n", "holdout_fraction: 0.3\n"))
    capsys.readouterr()
    assert kdml("train", "--resume", run, "--no-progress") == 2
    assert capsys.readouterr().err == (
        "kdml: error: data.holdout_fraction applies to the seen-holdout split only, and the "
        "split is class-disjoint; drop it, or set data.split=seen-holdout\n")
    config.write_text(trained)
    assert kdml("train", "--resume", run, "--no-progress") == 0
    assert "has no checkpoint to continue from; training it from epoch 1" in capsys.readouterr().out


def test_an_older_pair_run_with_a_split_it_ignored_is_still_evaluated(tmp_path, capsys):
    """data.split on a domain pair is refused for a new run (test_real_data.py), but a pair run
    whose config.yaml recorded it (an older kdml ignored it: a pair trains on its source and is
    scored on its target) is still evaluated on the same data, and embedded."""
    run = tmp_path / "run"
    assert kdml("train", "dtml", "--dataset", "mnist5k->digits", "--out", run, *TINY) == 0
    metrics = capsys.readouterr().out.split("Test metrics")[-1]
    as_an_older_kdml_wrote_it(run, "split", "standard", "class-disjoint")
    assert_evaluated_and_embedded_as_trained(run, metrics, tmp_path, capsys)
