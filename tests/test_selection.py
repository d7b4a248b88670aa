"""Choosing an epoch on the validation part: keep_best, patience and their refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from kdml import cli
from kdml.data import prepare
from kdml.data.registry import open_dataset
from kdml.errors import KdmlError
from kdml.evaluation.evaluator import Scores
from kdml.training import trainer
from kdml.training.selection import (
    best_epoch,
    best_scores,
    check_scored,
    evaluations_since_best,
    patience_exhausted,
)

KEY = "val/recall@1"


def history_of(values: list[float | None]) -> list[dict]:
    """Epochs 1..N; None = an epoch that was not evaluated."""
    return [{"epoch": epoch, **({} if value is None else {KEY: value})}
            for epoch, value in enumerate(values, start=1)]


@pytest.mark.parametrize(("values", "best", "since"), [
    ([], None, 0),
    ([None, None], None, 0),
    ([0.5], 1, 0),
    ([0.5, 0.7, 0.6, 0.65], 2, 2),
    ([0.5, None, 0.7, None, 0.7], 3, 1),  # a tie is not better: the first best stays
    ([math.nan, 0.2, math.nan], 2, 1),  # NaN never wins
])
def test_best_epoch_and_evaluations_since(values, best, since):
    history = history_of(values)
    assert best_epoch(history, "recall@1") == best
    assert evaluations_since_best(history, "recall@1") == since
    assert patience_exhausted(history, "recall@1", since) == (since > 0)
    assert not patience_exhausted(history, "recall@1", since + 1)
    assert not patience_exhausted(history, "recall@1", 0)  # 0: never


def test_an_unscored_metric_is_named_with_the_scored_ones():
    check_scored({"epoch": 1, "train/loss": 1.0}, "nmi")  # not evaluated: nothing to check
    with pytest.raises(KdmlError, match="select_metric='nmi' is not scored.*recall@1, map@r"):
        check_scored({"epoch": 1, KEY: 0.5, "val/map@r": 0.2}, "nmi")


SCRIPT = [0.5, 0.7, 0.6, 0.65, 0.9, 0.95]  # the validation recall@1 of epochs 1-6


def test_scores_on_the_test_part_are_never_chosen_from():
    history = [{"epoch": 1, "test/recall@1": 0.9}, {"epoch": 2, KEY: 0.4}]
    assert best_epoch(history, "recall@1") == 2
    assert best_scores(history, "recall@1") == {"recall@1": 0.4}
    assert best_scores([{"epoch": 1, "train/loss": 1.0}], "recall@1") is None


def scripted_scores(monkeypatch, script: list[float] = SCRIPT) -> None:
    """Replace evaluation by a script, epoch by epoch, so the choice is known in advance."""
    calls = iter(script)
    monkeypatch.setattr(trainer, "score_method",
                        lambda *args: Scores({"recall@1": next(calls), "map@r": 0.0}))


def test_patience_stops_and_keep_best_keeps_the_best_epoch(tmp_path, tiny_overrides, capsys,
                                                           monkeypatch):
    scripted_scores(monkeypatch)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "data.batch_size=12",
                     "data.validation=0.4", "train.epochs=6", "train.patience=2",
                     "train.keep_best=true", "train.steps_per_epoch=3"]) == 0
    printed = capsys.readouterr().out
    # epochs 3 and 4 do not beat epoch 2: stop after epoch 4, never reaching 0.9
    metrics = json.loads((out / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2, 3, 4]
    # the scores are the validation part's and say so, in both metrics files
    assert metrics["scored"] == "validation"
    assert all("val/recall@1" in row and not any(key.startswith("test/") for key in row)
               for row in metrics["epochs"])
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "val/recall@1" in header and not any(key.startswith("test/") for key in header)
    assert metrics["final"]["recall@1"] == 0.65
    assert "Validation metrics (amsoftmax, digits)" in printed
    assert "best validation recall@1: 0.7000 at epoch 2" in printed
    # said where the run is watched, not only in train.log
    assert ("stopped after epoch 4 of 6: 2 evaluations without a better validation recall@1 "
            "(train.patience)\n") in printed
    best = torch.load(out / "checkpoints" / "best.pt", weights_only=True)
    last = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert best["epoch"] == 2 and last["epoch"] == 4 and last["finished"]
    assert any(not torch.equal(best["method"][key], last["method"][key]) for key in best["method"])
    assert "without a better validation recall@1 than epoch 2's" in (out / "train.log").read_text()
    # resuming a run that stopped early trains nothing more
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert len(json.loads((out / "metrics.json").read_text())["epochs"]) == 4
    log = (out / "train.log").read_text()
    assert "it stopped early, after epoch 4; nothing left to train" in log
    assert "start epoch 7" not in log
    capsys.readouterr()
    # the chosen model, scored on the validation part, then on the test part it never saw
    assert cli.main(["eval", str(out), "--best"]) == 0
    printed = capsys.readouterr().out
    assert "best checkpoint: epoch 2" in printed and "364 validation samples" in printed
    assert "Validation metrics" in printed
    assert json.loads((out / "eval-best.json").read_text())["scored"] == "validation"
    opened = []
    monkeypatch.setattr(prepare, "open_dataset",
                        lambda *args: opened.append(args) or open_dataset(*args))
    assert cli.main(["eval", str(out), "--best", "--test"]) == 0
    assert len(opened) == 1  # one dataset, split as trained and without validation
    printed = capsys.readouterr().out
    assert "test set: 896 samples of classes not seen in training" in printed
    assert "Test metrics" in printed
    evaluated = json.loads((out / "eval-best-test.json").read_text())
    assert evaluated["scored"] == "test" and evaluated["checkpoint"] == "best"
    assert evaluated["epoch"] == 2 and 0 <= evaluated["metrics"]["recall@1"] <= 1
    # beside the validation part's, and the last checkpoint's beside both (--best and --test
    # had replaced one eval.json)
    assert json.loads((out / "eval-best.json").read_text())["scored"] == "validation"
    assert cli.main(["eval", str(out)]) == 0
    evaluated = json.loads((out / "eval.json").read_text())
    assert evaluated["checkpoint"] == "last" and evaluated["epoch"] == 4
    assert sorted(path.name for path in out.glob("eval*.json")) == [
        "eval-best-test.json", "eval-best.json", "eval.json"]
    # the chosen model's index answers only queries embedded by that same model
    index = tmp_path / "best-index"
    assert cli.main(["index", str(out), "--best", "--out", str(index)]) == 0
    assert cli.main(["embed", str(out), "--best", "--out", str(tmp_path / "q.npz")]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(out), "--best", "--index", str(index), "--query",
                     str(tmp_path / "q.npz"), "-k", "1", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert all(r["neighbours"][0]["score"] == pytest.approx(1.0, abs=1e-5) for r in found)
    assert cli.main(["search", str(out), "--index", str(index), "--query",
                     str(tmp_path / "q.npz")]) == 2
    assert "holds best.pt of this run, not last.pt: search it with --best" in \
        capsys.readouterr().err
    # the chosen model's plots go beside the last one's, never over them
    from kdml.inspection import plots

    titles, drawn = [], plots.plot_embedding_map
    monkeypatch.setattr(plots, "plot_embedding_map",
                        lambda *args: titles.append(args[4]) or drawn(*args))
    assert cli.main(["plot", "embedding", str(out), "--best", "--max-points", "60"]) == 0
    assert "embedding-best.png" in capsys.readouterr().out
    assert (out / "plots" / "embedding-best.png").is_file()
    assert not (out / "plots" / "embedding.png").exists()
    assert cli.main(["plot", "retrieval", str(out), "--best", "--queries", "2", "-k", "2"]) == 0
    assert sorted(path.name for path in (out / "plots").glob("retrieval*")) == [
        "retrieval-best.png"]
    # and their maps' titles tell them apart, as the file names do (the titles had been the
    # same, and a copied picture keeps only its title)
    assert cli.main(["plot", "embedding", str(out), "--max-points", "60"]) == 0
    assert titles == ["amsoftmax on digits, validation part, best checkpoint of epoch 2",
                      "amsoftmax on digits, validation part"]


def test_a_run_out_of_patience_on_its_last_epoch_trains_no_further_when_epochs_are_raised(
        tmp_path, tiny_overrides, monkeypatch):
    """Patience ran out at epoch 4 of 4: raising train.epochs to 6 and resuming had trained
    epoch 5, where a run of 6 epochs from the start stops after epoch 4 (its checkpoint said
    only that the run was finished, at its last planned epoch)."""
    scripted_scores(monkeypatch)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "data.batch_size=12",
                     "data.validation=0.4", "train.epochs=4", "train.patience=2",
                     "train.steps_per_epoch=3"]) == 0
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=True)["stopped_early"]
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["train"]["epochs"] = 6
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert len(json.loads((out / "metrics.json").read_text())["epochs"]) == 4
    assert "it stopped early, after epoch 4; nothing left to train" in (
        out / "train.log").read_text()


def test_eval_best_needs_a_kept_best_checkpoint(tmp_path, tiny_overrides, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "train.epochs=1"]) == 0
    capsys.readouterr()
    assert cli.main(["eval", str(out), "--best"]) == 2
    err = capsys.readouterr().err
    assert "has no best.pt: only runs trained with train.keep_best=true keep one" in err


@pytest.mark.parametrize("setting", ["train.patience=3", "train.keep_best=true"])
def test_choosing_an_epoch_on_the_test_part_is_refused(setting, tmp_path, capsys):
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(tmp_path / "r"),
                     setting]) == 2
    err = capsys.readouterr().err
    assert "need data.validation > 0" in err and err.count("\n") == 1



def test_a_grid_keeping_best_epochs_compares_them_not_the_last(tmp_path, capsys, monkeypatch):
    # cell 2: best 0.9 at epoch 2, last 0.6; cell 8: best 0.8, last 0.75. By the last epoch
    # cell 8 would win; by the kept (best) epochs, cell 2 does.
    scripted_scores(monkeypatch, [0.5, 0.9, 0.6, 0.7, 0.8, 0.75])
    config = {"recipe": "amsoftmax", "grid": {"model.embedding_size": [2, 8]},
              "data": {"dataset": "digits", "batch_size": 12, "validation": 0.4},
              "train": {"epochs": 3, "device": "cpu", "keep_best": True, "steps_per_epoch": 3},
              "eval": {"nmi": False}}
    file = tmp_path / "grid.yaml"
    file.write_text(yaml.safe_dump(config))
    out = tmp_path / "grid"
    assert cli.main(["train", "--config", str(file), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "at each cell's best epoch by recall@1 (train.keep_best)" in printed
    assert "best on validation by recall@1: embedding_size=2;" in printed
    table = printed[printed.index("Validation metrics per cell"):]
    assert "0.9000" in table and "0.8000" in table and "0.6000" not in table


def test_a_validation_run_from_before_the_val_keys_resumes_with_its_earlier_choice(
        tmp_path, tiny_overrides, capsys, monkeypatch, stop_in_epoch):
    # runs trained before scores were keyed val/ recorded validation scores as test/
    scripted_scores(monkeypatch, [0.9, 0.5, 0.6])
    undo = stop_in_epoch(3, trainer.KdmlError("stopped"))
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "data.batch_size=12",
                     "data.validation=0.4", "train.epochs=3", "train.keep_best=true"]) == 2
    last = out / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=False)
    state["history"] = [{key.replace("val/", "test/"): value for key, value in row.items()}
                        for row in state["history"]]
    torch.save(state, last)
    undo()
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert "best validation recall@1: 0.9000 at epoch 1" in capsys.readouterr().out
    assert torch.load(out / "checkpoints" / "best.pt", weights_only=True)["epoch"] == 1
    header = (out / "metrics.csv").read_text().splitlines()[0]
    assert "val/recall@1" in header and "test/" not in header


@pytest.mark.parametrize(("metric", "patience"), [("foo", "0"), ("nmi", "2")])
def test_an_unscored_select_metric_is_refused_before_an_epoch_trains(
        tmp_path, tiny_overrides, capsys, monkeypatch, metric, patience):
    trained = []
    monkeypatch.setattr(trainer, "train_one_epoch", lambda *args: trained.append(args) or {})
    out = tmp_path / "run"
    assert cli.main(["train", "jrd", "--dataset", "digits", "--out", str(out), "--no-progress",
                     *tiny_overrides, "data.batch_size=12", "data.validation=0.4",
                     f"train.select_metric={metric}", f"train.patience={patience}",
                     f"train.keep_best={patience == '0'}".lower()]) == 2
    assert not trained  # the old check came after epoch 1 had trained and been scored
    assert (f"train.select_metric='{metric}' is not scored by this run; choose one of "
            "recall@1, recall@2, recall@4, recall@8, map@r, r_precision\n"
            ) in capsys.readouterr().err


@pytest.mark.parametrize(("recipe", "overrides"), [
    ("amsoftmax", ["data.dataset=digits", "eval.nmi=false"]),
    ("amsoftmax", ["data.dataset=digits", "data.validation=0.4", "eval.ks=[1, 3]"]),
    ("amsoftmax", ["data.dataset=digits", "data.split=seen-holdout", "eval.nmi=false"]),
    ("mtriplet", ["data.dataset=digits", "data.split=seen-holdout", "eval.nmi=true"]),
    ("mtriplet", ["data.dataset=digits", "eval.nmi=false"]),  # chart metrics follow eval.nmi
    ("dtml", ["data.dataset=mnist5k->digits", "eval.nmi=false"]),
])
def test_the_metric_names_known_before_training_are_those_scored(recipe, overrides):
    from kdml.config import resolve_config
    from kdml.evaluation.evaluator import evaluate_method, metric_names
    from kdml.training.recipes import get_recipe

    spec = get_recipe(recipe)
    config = resolve_config(spec.name, spec.params, spec.defaults, {},
                            ["train.device=cpu", "model.embedding_size=8", *overrides])
    splits = prepare.prepare_data(config.data)
    method = trainer.build_method(config, splits, echo=lambda line: None)
    scored = evaluate_method(method, splits, config.eval)
    assert metric_names(config.eval, splits) == list(scored)


def test_an_unscored_last_epoch_scored_by_resume_is_kept_as_best_when_it_is(
        tmp_path, tiny_overrides, monkeypatch, stop_in_epoch):
    """train.eval_every left epoch 3 unscored, then train.epochs was lowered to 3: --resume
    scores it, and where it beats the epochs scored before, best.pt holds it."""
    scripted_scores(monkeypatch, [0.5, 0.9])  # epoch 2's, then epoch 3's once resumed
    stop_in_epoch(4)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "data.batch_size=12",
                     "data.validation=0.4", "train.epochs=4", "train.eval_every=2",
                     "train.keep_best=true", "train.steps_per_epoch=1"]) == 130
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["train"]["epochs"] = 3
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert torch.load(out / "checkpoints" / "best.pt", weights_only=True)["epoch"] == 3
