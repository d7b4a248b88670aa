"""Trainer options beyond the class-disjoint default: splits, domain pairs, optimisers, stopping."""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest
import torch
import yaml

from kdml import cli
from kdml.data.prepare import prepare_data
from kdml.errors import KdmlError

TINY = ["train.epochs=2", "data.batch_size=40", "model.embedding_size=8", "eval.nmi=false",
        "--no-progress", "train.device=cpu"]


def train(tmp_path, *args: str) -> dict:
    """``kdml train`` with the tiny settings; the test's own overrides come last and win."""
    out = tmp_path / "run"
    assert cli.main(["train", *args[:3], "--out", str(out), *TINY, *args[3:]]) == 0
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory) -> Path:
    """A finished amsoftmax run on digits of 1 epoch of 2 steps, trained once per module for
    the tests that edit and resume it (each on its own copy: ``copy_of``)."""
    folder = tmp_path_factory.mktemp("two_step")
    train(folder, "amsoftmax", "--dataset", "digits", "train.epochs=1", "train.steps_per_epoch=2")
    return folder / "run"


def copy_of(run: Path, tmp_path: Path) -> Path:
    """``tmp_path / "run"``: a copy of ``run`` that the test may change."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def test_seen_holdout_split_adds_a_linear_probe(tmp_path):
    metrics = train(tmp_path, "amsoftmax", "--dataset", "digits", "data.split=seen-holdout")
    assert 0.5 < metrics["final"]["linear_accuracy"] <= 1.0  # 10 seen digit classes
    assert "recall@1" in metrics["final"]
    assert "collapsed" not in metrics["final"]  # recorded only for a collapsed embedding


def _digits_of_classes(classes: list[int]):
    """The digits of ``classes`` only: a dataset whose labels are not 0..C-1."""
    from kdml.data.registry import open_dataset

    digits = open_dataset("digits").dataset
    return digits.subset(torch.isin(digits.labels, torch.tensor(classes)).nonzero().squeeze(1))


def _untrained_method(recipe: str, splits, *overrides: str):
    from kdml.config import resolve_config
    from kdml.training.build import build_method
    from kdml.training.recipes import get_recipe

    spec = get_recipe(recipe)
    config = resolve_config(spec.name, spec.params, spec.defaults,
                            overrides=["model.backbone=mlp", "model.embedding_size=8",
                                       "eval.nmi=false", "train.device=cpu", *overrides])
    return config, build_method(config, splits, pretrained=False, echo=lambda line: None)


@pytest.mark.parametrize(("recipe", "settings"), [
    ("amsoftmax", []), ("mtriplet", ["method.n_charts=2", "method.dim=8"])])
def test_linear_probe_scores_training_classes_that_are_not_0_to_c(recipe, settings):
    """Training classes 3, 7, 9 (remapped to 0, 1, 2 for training): the evaluator's linear
    probe, with one chart or per chart, equals the probe fitted and scored directly on the
    dataset's labels, so the test labels reach the probe in the training split's label space."""
    from kdml.data.splits import SEEN, make_splits, seen_holdout_split
    from kdml.evaluation.charts import piecewise_linear_accuracy
    from kdml.evaluation.evaluator import chart_codes_of, embed_dataset, evaluate_method

    dataset = _digits_of_classes([3, 7, 9])
    splits = make_splits(dataset, {}, "seen-holdout")
    assert splits.train_classes == [3, 7, 9] and splits.kind == SEEN
    config, method = _untrained_method(recipe, splits, *settings)
    metrics = evaluate_method(method, splits, config.eval)

    kept, held_out = seen_holdout_split(dataset.labels, config.data.holdout_fraction)
    if method.has_charts:
        train, test = (chart_codes_of(method, dataset.subset(part)) for part in (kept, held_out))
        (train_codes, train_index), (test_codes, test_index) = train.values, test.values
    else:
        train, test = (embed_dataset(method, dataset.subset(part)) for part in (kept, held_out))
        train_codes, test_codes = train.values, test.values
        train_index, test_index = (torch.zeros(len(codes), dtype=torch.long)
                                   for codes in (train_codes, test_codes))
    assert set(train.labels.tolist()) == set(test.labels.tolist()) == {3, 7, 9}
    expected = piecewise_linear_accuracy(train_codes, train_index, train.labels, test_codes,
                                         test_index, test.labels,
                                         sigmoid=method.has_charts)["accuracy"]
    # Above chance (1/3); a probe scoring dataset labels against 0..2 would score 0.
    assert expected > 0.5
    assert metrics["linear_accuracy"] == pytest.approx(expected, abs=1e-12)


def test_source_nn_accuracy_scores_source_classes_that_are_not_0_to_c():
    """A source domain of classes 3, 7, 9 (remapped to 0, 1, 2 for training): the evaluator's
    source-NN accuracy equals the one computed on the dataset's labels, so the source labels
    are mapped back before they are compared with the target's."""
    from kdml.data.prepare import domain_splits
    from kdml.data.splits import DOMAIN, seen_holdout_split
    from kdml.evaluation.evaluator import embed_dataset, evaluate_method
    from kdml.evaluation.transfer import source_nn_accuracy

    dataset = _digits_of_classes([3, 7, 9])
    kept, held_out = seen_holdout_split(dataset.labels, 0.2)
    source, target = dataset.subset(kept), dataset.subset(held_out)
    splits = domain_splits(source, target)
    assert splits.train_classes == [3, 7, 9] and splits.kind == DOMAIN
    config, method = _untrained_method("amsoftmax", splits)
    metrics = evaluate_method(method, splits, config.eval)

    source_embedded, target_embedded = (embed_dataset(method, part) for part in (source, target))
    expected = source_nn_accuracy(source_embedded.values, source_embedded.labels,
                                  target_embedded.values, target_embedded.labels,
                                  metric=config.eval.metric)
    # Above chance (1/3); sources labelled 0..2 against targets 3, 7, 9 would score 0.
    assert expected > 0.5
    assert metrics["source_nn_accuracy"] == pytest.approx(expected, abs=1e-12)


def test_sgd_with_per_epoch_decay_and_step_decay(tmp_path):
    metrics = train(tmp_path, "amsoftmax", "--dataset", "digits", "optim.name=sgd",
                    "optim.lr=0.1", "optim.lr_decay=0.5", "optim.lr_step=2",
                    "optim.lr_gamma=0.1", "train.epochs=3", "train.steps_per_epoch=2")
    rates = [row["lr"] for row in metrics["epochs"]]
    assert rates == pytest.approx([0.1, 0.05, 0.1 * 0.1 * 0.25])


def test_the_lr_column_is_optim_lr_as_scheduled_also_without_backbone_parameters(tmp_path):
    """The ``lr`` column is the backbone's rate, optim.lr as scheduled; it had been the first
    optimizer group's, which is the head's (optim.head_lr) where the backbone has no
    parameters (model.backbone=identity)."""
    metrics = train(tmp_path, "amsoftmax", "--dataset", "digits", "optim.name=sgd",
                    "optim.lr=0.1", "optim.head_lr=0.7", "optim.lr_decay=0.5",
                    "model.backbone=identity", "train.epochs=2")
    assert [row["lr"] for row in metrics["epochs"]] == [0.1, 0.1 * 0.5]


def test_lr_milestones_follow_torchs_multistep_schedule():
    """[19, 39] is the JRD authors' schedule: rates / 10 from 0-based epochs 19 and 39."""
    from kdml.config import resolve_config
    from kdml.training.build import build_method, build_optimizer
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("amsoftmax")
    config = resolve_config("amsoftmax", recipe.params, recipe.defaults, None,
                            ["optim.lr_milestones=[19, 39]", "optim.lr=0.5", "optim.name=sgd"])
    splits = prepare_data(config.data)
    optimizer, scheduler = build_optimizer(build_method(config, splits, pretrained=False),
                                           config)
    reference_optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    reference = torch.optim.lr_scheduler.MultiStepLR(reference_optimizer, [19, 39], 0.1)
    ours, theirs = [], []
    for _ in range(50):
        ours.append(optimizer.param_groups[0]["lr"])
        theirs.append(reference_optimizer.param_groups[0]["lr"])
        for stepped in (optimizer, scheduler, reference_optimizer, reference):
            stepped.step()
    assert ours == pytest.approx(theirs)
    assert ours[18] == 0.5 and ours[19] == pytest.approx(0.05) and ours[39] == pytest.approx(5e-3)


@pytest.mark.parametrize(("setting", "message"), [
    (["optim.lr_milestones=[20, 10]"], "must be increasing epoch numbers"),
    (["optim.lr_milestones=[0]"], "must be increasing epoch numbers"),
    (["optim.lr_milestones=[19]", "optim.lr_step=20"], "not both"),
])
def test_bad_lr_milestones_are_refused(setting, message):
    from kdml.config import resolve_config
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("amsoftmax")
    with pytest.raises(KdmlError, match=message):
        resolve_config("amsoftmax", recipe.params, recipe.defaults, None, setting)


def test_a_config_built_in_python_is_checked_before_anything_is_written(tmp_path):
    from kdml.config import RunConfig
    from kdml.training.recipes import get_recipe
    from kdml.training.trainer import train as train_config

    recipe = get_recipe("amsoftmax")
    config = RunConfig(recipe="amsoftmax", method=recipe.params())
    config.data.dataset = "digits"
    config.train.epochs = 0  # resolve_config refuses this; set here, it is not seen by it
    with pytest.raises(KdmlError, match=r"^train.epochs must be at least 1$"):
        train_config(config, tmp_path / "run", progress=False, echo=lambda line: None)
    config.train.epochs, config.method.margin = 1, float("nan")  # the recipe's own checks too
    with pytest.raises(KdmlError, match="method.margin"):
        train_config(config, tmp_path / "run", progress=False, echo=lambda line: None)
    assert not (tmp_path / "run").exists()


def test_tolerance_stops_early_and_resume_keeps_it_stopped(tmp_path):
    metrics = train(tmp_path, "amsoftmax", "--dataset", "digits", "train.tolerance=1e9",
                    "train.epochs=5", "train.steps_per_epoch=2")
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2]
    assert "recall@1" in metrics["final"]
    assert cli.main(["train", "--resume", str(tmp_path / "run"), "--no-progress"]) == 0
    again = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [row["epoch"] for row in again["epochs"]] == [1, 2]


def test_a_finished_run_resumed_with_more_epochs_trains_them(tmp_path, capsys):
    """Raising train.epochs in a finished run's config.yaml trains the new epochs (as timm's
    and Lightning's resume do), instead of saying they are all trained."""
    train(tmp_path, "amsoftmax", "--dataset", "digits", "train.epochs=1", "train.steps_per_epoch=3")
    config = tmp_path / "run" / "config.yaml"
    settings = yaml.safe_load(config.read_text())
    settings["train"]["epochs"] = 2
    config.write_text(yaml.safe_dump(settings))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(tmp_path / "run"), "--no-progress"]) == 0
    assert ("train.epochs is 2, not the 1 it was trained for: training epochs 2 to 2"
            in capsys.readouterr().out)
    again = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [row["epoch"] for row in again["epochs"]] == [1, 2]
    assert "nothing left to train" not in (tmp_path / "run" / "train.log").read_text()
    # the same model as a run trained for 2 epochs from the start (the schedules do not
    # depend on the length)
    direct = tmp_path / "direct"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(direct), *TINY,
                     "train.epochs=2", "train.steps_per_epoch=3"]) == 0
    resumed, straight = (torch.load(folder / "checkpoints" / "last.pt", weights_only=True)
                         for folder in (tmp_path / "run", direct))
    assert all(torch.equal(resumed["method"][key], straight["method"][key])
               for key in straight["method"])


def test_resume_refuses_a_config_edited_beyond_what_it_can_take(tmp_path, capsys):
    """An edit of config.yaml before --resume was taken in part without a word: a new
    method.alpha applied, a new optim.lr did not (the optimizer's state brought the old one
    back). Such edits are refused in one line naming the first; the settings a resumed run
    can take (train.epochs, and where and how fast it runs) still change; lowering
    train.epochs below the trained epochs says so."""
    train(tmp_path, "jrd", "--dataset", "digits", "train.epochs=1", "train.steps_per_epoch=2")
    run, config = tmp_path / "run", tmp_path / "run" / "config.yaml"
    trained = yaml.safe_load(config.read_text())
    edited = yaml.safe_load(config.read_text())
    edited["optim"]["lr"], edited["method"]["alpha"] = 0.1, 0.0
    config.write_text(yaml.safe_dump(edited))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kdml: error: {config} was edited since its checkpoint: "
                          "optim.lr 0.001 -> 0.1 (and 1 more); --resume continues the run as "
                          "it trained, and takes a change of ") and "\n" not in err, err
    assert [row["epoch"] for row in json.loads((run / "metrics.json").read_text())["epochs"]
            ] == [1]
    resumable = yaml.safe_load(config.read_text())
    resumable["optim"]["lr"], resumable["method"]["alpha"] = 0.001, trained["method"]["alpha"]
    resumable["train"]["epochs"], resumable["data"]["num_workers"] = 2, 0
    resumable["eval"]["embed_batch_size"] = 17
    resumable["train"]["eval_every"] = 2  # kdml reproduce resumes its runs with today's value
    config.write_text(yaml.safe_dump(resumable))
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert [row["epoch"] for row in json.loads((run / "metrics.json").read_text())["epochs"]
            ] == [1, 2]
    resumable["train"]["epochs"] = 1
    config.write_text(yaml.safe_dump(resumable))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert f"resuming {run} after epoch 2 (train.epochs is now 1)" in capsys.readouterr().out


def test_resume_names_an_edit_that_changes_the_model_s_shape(tmp_path, capsys, two_step_run):
    """A new model.embedding_size cannot load the checkpoint: it had been named "another
    run's checkpoint", where the run's own config.yaml had been edited."""
    copy_of(two_step_run, tmp_path)
    run, config = tmp_path / "run", tmp_path / "run" / "config.yaml"
    edited = yaml.safe_load(config.read_text())
    edited["model"]["embedding_size"], edited["train"]["epochs"] = 16, 2
    config.write_text(yaml.safe_dump(edited))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: checkpoint {run / 'checkpoints' / 'last.pt'} does not fit the run's "
        "config, which differs from the one it was trained with: model.embedding_size 8 -> 16; "
        "put the setting back in config.yaml, or the checkpoint belongs to another run\n")


def test_resume_refuses_an_edited_config_before_reading_the_data(tmp_path, capsys,
                                                                 monkeypatch, two_step_run):
    """The edit was refused only after all the data was read and the checkpoint restored
    (minutes on SOP), and a run of a kdml before data.json got its data.json written first."""
    from kdml.training import trainer

    copy_of(two_step_run, tmp_path)
    run, config = tmp_path / "run", tmp_path / "run" / "config.yaml"
    (run / "data.json").unlink()  # as a run made before kdml wrote one
    edited = yaml.safe_load(config.read_text())
    edited["optim"]["lr"] = 0.1
    config.write_text(yaml.safe_dump(edited))

    def no_data(*args, **kwargs):
        raise AssertionError("the data was read before the edit was refused")

    monkeypatch.setattr(trainer, "prepare_data_and_test_part", no_data)
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kdml: error: {config} was edited since its checkpoint: "
                          "optim.lr 0.001 -> 0.1; --resume continues"), err
    assert not (run / "data.json").exists()


@pytest.mark.parametrize(("before", "after", "change"), [
    ("dataset: digits", "dataset: mnist5k", "data.dataset 'digits' -> 'mnist5k'"),
    ("validation: 0.0", "validation: 0.4", "data.validation 0.0 -> 0.4"),
    ("split: standard", "split: seen-holdout", "data.split 'standard' -> 'seen-holdout'")])
def test_resume_names_another_dataset_or_split_as_an_edit_before_reading_the_data(
        tmp_path, capsys, monkeypatch, two_step_run, before, after, change):
    """data.dataset, data.validation or data.split edited: refused as other data ("or delete
    data.json to use this data anyway"), and deleting data.json led to "another run's
    checkpoint" or the edit's refusal; now the edit is named before the data is read."""
    from kdml.training import trainer

    copy_of(two_step_run, tmp_path)
    run, config = tmp_path / "run", tmp_path / "run" / "config.yaml"
    assert f"  {before}\n" in config.read_text()
    config.write_text(config.read_text().replace(f"  {before}\n", f"  {after}\n"))

    def no_data(*args, **kwargs):
        raise AssertionError("the data was read before the edit was refused")

    monkeypatch.setattr(trainer, "prepare_data_and_test_part", no_data)
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith(
        f"kdml: error: {config} was edited since its checkpoint: {change}; --resume continues")


def test_resume_of_a_config_leaving_eval_ks_to_the_data_is_not_refused(tmp_path):
    """A config whose eval.ks is empty (kdml reproduce's and a grid's, resumed) gets the
    data's Ks from Session.build: the checkpoint's, so the check before the data is read
    does not take it for an edit."""
    from kdml.config import resolve_config
    from kdml.training import trainer
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("amsoftmax")

    def config(epochs: int):
        return resolve_config(recipe.name, recipe.params, recipe.defaults, {}, [
            "data.dataset=digits", f"train.epochs={epochs}", "data.batch_size=40",
            "model.embedding_size=8", "eval.nmi=false", "train.device=cpu",
            "train.steps_per_epoch=2"])

    assert config(1).eval.ks == []
    trainer.train(config(1), tmp_path / "run", progress=False, echo=lambda line: None)
    trainer.train(config(2), tmp_path / "run", resume=True, progress=False,
                  echo=lambda line: None)
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.pt",
                      weights_only=True)["epoch"] == 2


def test_train_says_where_it_trains_once_its_checks_pass(tmp_path, capsys):
    """"training RECIPE on DATASET into FOLDER" had been printed before the config and data
    were checked: a refusal followed it, naming a folder that was never made."""
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "eval.ks=[1,2,4000]"]) == 2
    printed = capsys.readouterr()
    assert printed.err.rstrip().endswith("lower eval.ks, e.g. 'eval.ks=[1, 2]'"), printed.err
    assert "training" not in printed.out and not out.exists()
    train(tmp_path, "amsoftmax", "--dataset", "digits", "train.epochs=1", "train.steps_per_epoch=2")
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if line.startswith("training amsoftmax on digits into ")]
    assert said == [f"training amsoftmax on digits into {out}"]
    assert lines.index(said[0]) < next(number for number, line in enumerate(lines)
                                       if line.startswith("test set:"))


def test_train_log_names_the_cpu_thread_count(tmp_path, monkeypatch):
    """A CPU run's float sums, so its numbers, depend on torch's thread count (JRD Figure 5's
    JMMD run at alpha = 2 trains differently with two than with one): each session's start
    line says it."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)  # not the tests' own 1 (conftest)
    train(tmp_path, "amsoftmax", "--dataset", "digits", "train.epochs=1",
          "train.steps_per_epoch=2")
    start = (tmp_path / "run" / "train.log").read_text().splitlines()[0]
    assert start.endswith("1 process(es), 3 CPU thread(s)"), start


def test_a_pca_run_is_loaded_where_its_fit_would_not_fit(tmp_path, capsys, monkeypatch):
    """A pca run fitted on a large machine is evaluated on a smaller one (building its method
    had been refused as if to fit it); there, kdml train pca is refused in one line before the
    run folder is made. 64 features: the fit takes 96 KiB, the model 16 KiB."""
    from kdml.training.loading import load_run
    from kdml.training.recipes import dtml

    train(tmp_path, "pca", "--dataset", "mnist5k->digits", "train.epochs=1")
    monkeypatch.setattr(dtml, "_physical_memory", lambda: 100_000)  # 50,000 bytes may be used
    assert bool(load_run(tmp_path / "run").method.fitted)
    new = tmp_path / "new"
    capsys.readouterr()
    assert cli.main(["train", "pca", "--dataset", "mnist5k->digits", "--out", str(new),
                     *TINY]) == 2
    printed = capsys.readouterr()
    assert printed.err.startswith("kdml: error: the pca recipe's inputs have 64 features, too "
                                  "many: ") and printed.err.count("\n") == 1, printed.err
    assert "training" not in printed.out and not new.exists()


def test_a_users_picture_in_plots_is_kept_and_training_goes_on(tmp_path, capsys,
                                                               two_step_run):
    copy_of(two_step_run, tmp_path)
    run = tmp_path / "run"
    (run / "plots" / "loss.png").write_text("my notes")
    config = run / "config.yaml"
    settings = yaml.safe_load(config.read_text())
    settings["train"]["epochs"] = 2
    config.write_text(yaml.safe_dump(settings))
    recall = (run / "plots" / "recall.png").read_bytes()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert (run / "plots" / "loss.png").read_text() == "my notes"
    assert (run / "plots" / "recall.png").read_bytes() != recall  # redrawn with epoch 2
    # the picture named, and the others said to be drawn (it had said no plot was drawn)
    assert (f"a training plot is not drawn (the others are): {run / 'plots' / 'loss.png'} is "
            "in the way") in (run / "train.log").read_text()
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 2


@pytest.mark.parametrize("recipe", ["dtml", "dstml", "ddml"])
def test_dtml_recipes_on_a_domain_pair(tmp_path, recipe):
    metrics = train(tmp_path, recipe, "--dataset", "mnist5k->digits", "method.k1=2",
                    "method.k2=3", "data.samples_per_class=4", "train.steps_per_epoch=2")
    final = metrics["final"]
    assert 0.0 <= final["source_nn_accuracy"] <= 1.0 and "recall@1" in final
    assert "train/d_ts" in metrics["epochs"][-1]


def test_pca_baseline_fits_once_without_an_optimiser(tmp_path):
    metrics = train(tmp_path, "pca", "--dataset", "mnist5k->digits", "train.epochs=5")
    assert [row["epoch"] for row in metrics["epochs"]] == [1]
    assert metrics["final"]["source_nn_accuracy"] > 0.5  # raw 64-d transfer is ~0.8


def test_pca_is_fitted_whatever_the_batch_settings_it_does_not_use(tmp_path):
    """PCA reads every training sample once, in no batches of classes: batch settings that a
    trained recipe's sampler could not fill (refused for those: test_data's sampler tests)
    had been refused for it, for nothing."""
    from distributed_harness import write_domains

    features = write_domains(tmp_path / "domains.npz")  # 4 classes of 20: cheaper than digits
    unused = ["data.batch_size=7", "data.samples_per_class=8"]
    assert "source_nn_accuracy" in train(tmp_path / "odd", "pca", "--dataset",
                                         f"npz:{features}", *unused)["final"]


def test_domain_mmd_composes_with_any_recipe(tmp_path):
    """domain.beta and domain.kernel reach the method: a DomainAdaptedMethod around the recipe's
    method whose loss on a batch is the recipe's loss plus beta times the kernel MMD."""
    from kdml.config import resolve_config
    from kdml.kernels import GaussianMixtureKernel
    from kdml.regularizers.domain import DomainMMD
    from kdml.training.build import build_method
    from kdml.training.domain_adapted import DomainAdaptedMethod
    from kdml.training.recipes import get_recipe

    domain = ["domain.beta=0.5", "domain.kernel=gaussian"]
    metrics = train(tmp_path, "jrd", "--dataset", "mnist5k->digits", *domain,
                    "train.steps_per_epoch=2")
    assert "train/d_ts" in metrics["epochs"][-1]
    assert "source_nn_accuracy" in metrics["final"]

    recipe = get_recipe("jrd")
    config = resolve_config("jrd", recipe.params, recipe.defaults,
                            overrides=["data.dataset=mnist5k->digits", "model.embedding_size=8",
                                       *domain])
    splits = prepare_data(config.data)
    method = build_method(config, splits, pretrained=False, echo=lambda line: None)
    assert isinstance(method, DomainAdaptedMethod) and method.beta == 0.5
    assert isinstance(method.mmd, DomainMMD)
    assert isinstance(method.mmd.kernel, GaussianMixtureKernel)

    batch = torch.arange(40) * (len(splits.train) // 40)  # every class of the sorted source
    source, labels, target = splits.train.x[batch], splits.train.labels[batch], splits.target.x[:40]
    method.eval()  # BatchNorm from its running statistics: the same in both calls
    with torch.no_grad():
        output = method(source, labels, target_inputs=target)
        inner = method.inner(source, labels)
    d_ts = output.terms["d_ts"]
    assert float(d_ts) > 1e-3 * abs(float(inner.loss))  # beta visibly moves the loss
    assert float(output.terms["inner_loss"]) == pytest.approx(float(inner.loss), rel=1e-6)
    assert float(output.loss) == pytest.approx(float(inner.loss) + 0.5 * float(d_ts),
                                               rel=1e-6, abs=1e-9)


def test_domain_options_need_a_domain_pair(tmp_path, capsys):
    assert cli.main(["train", "jrd", "--dataset", "digits", "domain.beta=1",
                     "--out", str(tmp_path / "a"), *TINY]) == 2
    assert "domain pair" in capsys.readouterr().err
    assert cli.main(["train", "dtml", "--dataset", "digits", "--out", str(tmp_path / "b"),
                     *TINY]) == 2
    assert "target domain" in capsys.readouterr().err
    assert cli.main(["train", "dtml", "--dataset", "mnist5k->svhn", "--out",
                     str(tmp_path / "c"), *TINY]) == 2
    assert "unknown domain pair" in capsys.readouterr().err
    assert cli.main(["train", "dtml", "--dataset", "mnist5k-", "--out", str(tmp_path / "d"),
                     *TINY]) == 2
    assert "quote domain pairs" in capsys.readouterr().err


def test_training_leaves_the_global_generators_untouched(tmp_path):
    """Batches, initial weights and prior samples come from their own seeded generators."""
    import numpy as np
    import torch

    torch_state, numpy_state = torch.random.get_rng_state(), np.random.get_state()[1].copy()
    train(tmp_path, "mtriplet", "--dataset", "digits", "data.batch_size=20",
          "data.samples_per_class=4", "method.n_charts=2", "data.num_workers=2",
          "train.steps_per_epoch=3")
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], numpy_state)


def test_seen_holdout_split_of_a_dataset_with_its_own_split(tmp_path):
    """data.split=seen-holdout pools the dataset's parts and holds out samples of every class."""
    metrics = train(tmp_path, "amsoftmax", "--dataset", "digits", "data.split=seen-holdout",
                    "data.holdout_fraction=0.3", "train.steps_per_epoch=2")
    assert "linear_accuracy" in metrics["final"]


@pytest.mark.parametrize("recipe", ["amsoftmax", "pca", "mtriplet"])
def test_a_collapsed_embedding_warns_on_screen_and_in_the_log(tmp_path, capsys, monkeypatch,
                                                              recipe):
    """Every test sample embedded alike (finite: JIntra at alpha = 2 does it on Fashion-MNIST),
    in a class-disjoint run, in a domain pair's and in an Atlas run's charts: warned of, and
    recorded beside the metrics (``collapsed``: the share at one point) in metrics.json, the
    printed table and ``kdml eval``'s eval.json. optim.lr=1e10 no longer serves: it makes
    BatchNorm's running variances infinite, which stops training as diverged. The domain pair
    is a feature file's (80 source and 60 target samples): on mnist5k->digits, scoring 896
    tied targets against 5,000 tied sources took seconds each time."""
    from distributed_harness import write_domains

    from kdml.training.recipes.atlas import MTripletMethod
    from kdml.training.recipes.dtml import PCAMethod
    from kdml.training.recipes.jrd import JRDMethod

    if recipe == "mtriplet":  # one chart, one place in it
        monkeypatch.setattr(MTripletMethod, "chart_codes", lambda self, inputs: (
            torch.ones(len(inputs), 2), torch.zeros(len(inputs), dtype=torch.long)))
    else:
        method = PCAMethod if recipe == "pca" else JRDMethod
        monkeypatch.setattr(method, "embed", lambda self, inputs: torch.ones(len(inputs), 8))
    dataset = f"npz:{write_domains(tmp_path / 'domains.npz')}" if recipe == "pca" else "digits"
    # 2 steps: the embedding is replaced above, so how far the run trains changes nothing here
    metrics = train(tmp_path, recipe, "--dataset", dataset, "train.epochs=1",
                    "train.steps_per_epoch=2",
                    *(["data.batch_size=20", "data.samples_per_class=4"] if recipe == "mtriplet"
                      else []))
    warning = "the test embeddings have collapsed: 100.0% of them lie at one point (exactly)"
    out, err = capsys.readouterr()
    assert warning in err
    assert warning in (tmp_path / "run" / "train.log").read_text()
    assert metrics["final"]["recall@1"] < 0.5
    assert metrics["final"]["collapsed"] == 1.0 == metrics["epochs"][-1]["test/collapsed"]
    assert re.search(r"\n  collapsed +1\.0000\n", out)
    assert cli.main(["eval", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["metrics"] == (
        metrics["final"])


@pytest.mark.parametrize("recipe", ["jrd", "mtriplet"])
def test_evaluation_builds_no_autograd_graph(recipe, monkeypatch):
    """Test-time embeddings carry no graph: a kept graph holds every batch's activations
    (a 2 GB peak for 2,500 MNIST digits) and slows evaluation down."""
    from kdml.config import resolve_config
    from kdml.evaluation.evaluator import evaluate_method
    from kdml.training.recipes import get_recipe
    from kdml.training.trainer import Session

    spec = get_recipe(recipe)
    config = resolve_config(spec.name, spec.params, spec.defaults,
                            overrides=["data.dataset=digits", "train.device=cpu",
                                       "data.num_workers=0", "eval.nmi=false"])
    session = Session.build(config, echo=lambda line: None)
    method = session.method
    function_name = "chart_codes" if method.has_charts else "embed"
    original = getattr(method, function_name)
    outputs = []

    def recorded(inputs):
        output = original(inputs)
        outputs.append(output if isinstance(output, tuple) else (output,))
        return output

    monkeypatch.setattr(method, function_name, recorded)
    evaluate_method(method, session.splits, session.config.eval, session.embedder)
    assert outputs
    assert not any(part.requires_grad for output in outputs for part in output)


def test_compiled_steps_train_as_the_eager_ones(tmp_path, monkeypatch):
    """train.compile=true: the same first loss (later steps drift apart, as Adam normalises
    tiny gradient differences) and a checkpoint with the method's own parameter names, so it
    resumes and evaluates either way. Compiled by dynamo and AOTAutograd (aot_eager), without
    inductor's C++ code, which took 25 to 40 s of a cold cache here (a fresh CI machine's):
    inductor compiles JRS in test_jrs, and the whole step in test_cuda on a GPU."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: real_compile(model, backend="aot_eager"))
    common = ["train", "jrd", "--dataset", "digits", "--no-progress", "train.epochs=1",
              "train.steps_per_epoch=1", "eval.nmi=false", "model.embedding_size=8",
              "train.device=cpu"]
    runs = {}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for name, extra in (("eager", []), ("compiled", ["train.compile=true"])):
        assert cli.main([*common, "--out", str(tmp_path / name), *extra]) == 0
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        state = torch.load(tmp_path / name / "checkpoints" / "last.pt", weights_only=True)
        runs[name] = (metrics["epochs"][0], sorted(state["method"]))
    (eager_row, eager_keys), (compiled_row, compiled_keys) = runs["eager"], runs["compiled"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert compiled_keys == eager_keys
    for term in ("train/loss", "train/am_softmax", "train/regularizer"):
        assert compiled_row[term] == pytest.approx(eager_row[term], rel=1e-4), term


def test_a_compiler_failure_is_one_line(tmp_path, monkeypatch, capsys):
    def no_compiler(graph, example_inputs):
        raise RuntimeError("no C++ compiler found")

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: real_compile(model, backend=no_compiler))
    torch._dynamo.reset()
    code = cli.main(["train", "jrd", "--dataset", "digits", "--no-progress", "--out",
                     str(tmp_path / "run"), "train.compile=true", "train.device=cpu",
                     "train.epochs=1", "train.steps_per_epoch=1", "eval.nmi=false"])
    torch._dynamo.reset()
    assert code != 0
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["kdml: error: train.compile=true: torch.compile failed (no C++ compiler "
                     "found); train without it: train.compile=false"]


def test_a_model_with_nothing_to_train_and_no_fit_is_refused(monkeypatch):
    """A method with no trainable parameters (and no closed-form fit) has no optimiser:
    one line before training instead of a crash at its first epoch."""
    from kdml.config import resolve_config
    from kdml.training import trainer
    from kdml.training.recipes import get_recipe

    spec = get_recipe("jrd")
    config = resolve_config(spec.name, spec.params, spec.defaults,
                            overrides=["data.dataset=digits", "train.device=cpu",
                                       "data.num_workers=0"])
    monkeypatch.setattr(trainer, "build_optimizer", lambda method, config: (None, None))
    with pytest.raises(KdmlError, match=r"^the jrd model has no parameters to train and no "
                                        r"closed-form fit$"):
        trainer.Session.build(config, echo=lambda line: None)


def test_metrics_files_are_written_through_new_files_only(tmp_path):
    """metrics.csv is replaced through a new hidden file, never through a ``metrics.csv.tmp``
    that may be somebody else's."""
    from kdml.training.run_folder import RunFolder

    (tmp_path / "metrics.csv.tmp").write_text("mine")
    folder = RunFolder(tmp_path)
    folder.write_metrics([{"epoch": 1, "train/loss": 0.5}], None)
    folder.write_metrics([{"epoch": 1, "train/loss": 0.5}, {"epoch": 2, "train/loss": 0.25}],
                         {"recall@1": 0.75})
    assert (tmp_path / "metrics.csv.tmp").read_text() == "mine"
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "epoch,train/loss", "1,0.5", "2,0.25"]
    assert json.loads((tmp_path / "metrics.json").read_text())["final"] == {"recall@1": 0.75}
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "metrics.csv", "metrics.csv.tmp", "metrics.json"]


def test_metrics_csv_has_a_column_for_a_metric_first_scored_in_a_later_epoch(tmp_path):
    """An epoch scored only every so often (train.eval_every) or one that left images out
    adds columns after the first row: every row's keys are columns, blank where it has none."""
    from kdml.training.run_folder import RunFolder

    RunFolder(tmp_path).write_metrics(
        [{"epoch": 1, "train/loss": 0.5},
         {"epoch": 2, "train/loss": 0.25, "test/map@r": 0.125, "unreadable/train": 3}], None)
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "epoch,train/loss,test/map@r,unreadable/train", "1,0.5,,", "2,0.25,0.125,3"]


def test_a_full_disk_while_metrics_csv_is_rewritten_leaves_the_old_one_whole(tmp_path,
                                                                          monkeypatch):
    """metrics.csv is rewritten whole each epoch: a write cut short keeps the last epoch's."""
    import csv
    import errno

    from kdml.training.run_folder import RunFolder

    folder = RunFolder(tmp_path)
    folder.write_metrics([{"epoch": 1, "train/loss": 0.5}], None)
    before = folder.metrics_csv.read_text()

    class FullDisk:
        def __init__(self, handle):
            self.handle = handle

        def writerows(self, rows):
            self.handle.write("epo")
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv, "writer", FullDisk)
    with pytest.raises(OSError, match="No space left on device"):
        folder.write_metrics([{"epoch": 1, "train/loss": 0.5}, {"epoch": 2, "train/loss": 0.25}],
                             None)
    assert folder.metrics_csv.read_text() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["metrics.csv", "metrics.json"]


def test_a_pooling_the_backbone_does_not_use_is_named(tmp_path, tiny_overrides, capsys):
    """kdml's small backbones pool their own maps (or have none): model.pooling=max had been
    saved in config.yaml and left unused, silently."""
    out = tmp_path / "max"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "model.pooling=max",
                     "train.epochs=1", "train.steps_per_epoch=2"]) == 0
    warned = ("model.pooling=max is not used by backbone 'cnn': it pools the feature maps of "
              "bninception, timm and torchvision backbones only")
    assert f"kdml: warning: {warned}" in capsys.readouterr().err
    assert warned in (out / "train.log").read_text()
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out",
                     str(tmp_path / "avg"), "--no-progress", *tiny_overrides,
                     "train.epochs=1", "train.steps_per_epoch=2"]) == 0
    assert "model.pooling" not in capsys.readouterr().err


def test_metrics_files_are_left_alone_where_metrics_json_is_someone_else_s(tmp_path):
    """metrics.csv had been replaced before metrics.json's own check refused the write."""
    from kdml.training.run_folder import RunFolder

    (tmp_path / "metrics.csv").write_text("epoch,train/loss\n1,0.5\n")
    (tmp_path / "metrics.json").write_text('{"mine": true}')
    with pytest.raises(KdmlError, match=r"metrics\.json is in the way and kdml did not write"):
        RunFolder(tmp_path).write_metrics([{"epoch": 1, "train/loss": 0.25}], None)
    assert (tmp_path / "metrics.csv").read_text() == "epoch,train/loss\n1,0.5\n"
    assert (tmp_path / "metrics.json").read_text() == '{"mine": true}'


@pytest.mark.parametrize("text", ["my own notes\n", "run,score\n1,0.5\n"])
def test_a_metrics_csv_kdml_did_not_write_is_not_replaced(tmp_path, text):
    """metrics.csv had been replaced whatever it held, where metrics.json is refused."""
    from kdml.training.run_folder import RunFolder

    (tmp_path / "metrics.csv").write_text(text)
    with pytest.raises(KdmlError, match=r"metrics\.csv is in the way and kdml did not write"):
        RunFolder(tmp_path).write_metrics([{"epoch": 1, "train/loss": 0.25}], None)
    assert (tmp_path / "metrics.csv").read_text() == text
    assert not (tmp_path / "metrics.json").exists()
    (tmp_path / "metrics.csv").write_text("")  # empty: nothing to lose
    RunFolder(tmp_path).write_metrics([], None)  # no epoch: an empty header row
    RunFolder(tmp_path).write_metrics([{"epoch": 1, "train/loss": 0.25}], None)
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0] == "epoch,train/loss"


@pytest.mark.parametrize("name", ["metrics.json", "metrics.csv"])
def test_resume_refuses_someone_else_s_metrics_file_before_training(tmp_path, tiny_overrides,
                                                                   capsys, name):
    """The refusal had come after a whole epoch was trained and checkpointed (hours on a real
    run): --resume checks before its first epoch."""
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run),
                     "--no-progress", *tiny_overrides, "train.steps_per_epoch=2"]) == 0
    config = run / "config.yaml"
    assert "  epochs: 2\n" in config.read_text()
    config.write_text(config.read_text().replace("  epochs: 2\n", "  epochs: 3\n"))
    (run / name).write_text('{"mine": true}')
    checkpoint = (run / "checkpoints" / "last.pt").read_bytes()
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) != 0
    assert f"{name} is in the way and kdml did not write it" in capsys.readouterr().err
    assert (run / "checkpoints" / "last.pt").read_bytes() == checkpoint
    assert "epoch 3" not in (run / "train.log").read_text()


def test_an_embedding_size_that_sizes_nothing_is_named(tmp_path, tiny_overrides, capsys):
    """Atlas and DTML size their embeddings with their own settings: a model.embedding_size
    given to them (tiny_overrides give 8) had been saved and left unused, silently."""
    out = tmp_path / "atlas"
    assert cli.main(["train", "mtriplet", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "method.n_charts=2",
                     "train.epochs=1", "train.steps_per_epoch=2"]) == 0
    warned = ("model.embedding_size=8 does not size mtriplet's embedding: method.dim does")
    assert f"kdml: warning: {warned}" in capsys.readouterr().err
    assert warned in (out / "train.log").read_text()
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out",
                     str(tmp_path / "sized"), "--no-progress", *tiny_overrides,
                     "train.epochs=1", "train.steps_per_epoch=2"]) == 0
    assert "does not size" not in capsys.readouterr().err


def test_a_trained_run_loads_whatever_the_checks_before_training_now_refuse(tmp_path,
                                                                          tiny_overrides):
    """The checks made before training (e.g. eval.metric on an Atlas recipe) do not apply to
    a run trained already: an older run whose config.yaml says eval.metric: cosine is scored
    as before."""
    out = tmp_path / "atlas"
    assert cli.main(["train", "mtriplet", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "method.n_charts=2",
                     "train.epochs=1", "train.steps_per_epoch=2"]) == 0
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("metric: euclidean", "metric: cosine"))
    assert "metric: cosine" in config.read_text()
    assert cli.main(["eval", str(out)]) == 0


def scoring_killed_at(monkeypatch, kills: set[int], script: list[float] | None = None
                      ) -> list[int]:
    """Make the trainer's scoring raise KeyboardInterrupt (as a kill stops it: no except
    clause of kdml's runs) at the given calls, counted over every session; the other calls
    score as usual, or by ``script`` (validation recall@1, epoch by epoch: a killed call
    takes none). Returns the epochs trained, session by session, in order."""
    from kdml.evaluation.evaluator import Scores
    from kdml.training import trainer

    real_train, real_evaluate = trainer.train_one_epoch, trainer.score_method
    calls, scores, trained = [0], iter(script or []), []

    def scoring(*args, **kwargs):
        calls[0] += 1
        if calls[0] in kills:
            raise KeyboardInterrupt
        if script is not None:
            return Scores({"recall@1": next(scores), "map@r": 0.0})
        return real_evaluate(*args, **kwargs)

    def counted(session, epoch, progress):
        trained.append(epoch)
        return real_train(session, epoch, progress)

    monkeypatch.setattr(trainer, "score_method", scoring)
    monkeypatch.setattr(trainer, "train_one_epoch", counted)
    return trained


def test_keep_best_and_patience_decide_alike_after_kills_while_scoring(tmp_path, monkeypatch):
    """The best checkpoint and the patience rule are decided once an epoch is scored: a run
    killed while scoring its best epoch (2), then while scoring the one patience stops at (4),
    keeps and stops as the uninterrupted run does, training no epoch twice."""
    settings = ["--no-progress", "data.batch_size=12", "data.validation=0.4", "train.epochs=6",
                "train.patience=2", "train.keep_best=true", "train.steps_per_epoch=2"]
    script = [0.5, 0.7, 0.6, 0.65, 0.9, 0.95]
    full, part = tmp_path / "full", tmp_path / "part"
    with monkeypatch.context() as patched:
        scoring_killed_at(patched, set(), script)
        assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(full),
                         *TINY, *settings]) == 0
    trained = scoring_killed_at(monkeypatch, {2, 5}, script)
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(part), *TINY,
                     *settings]) == 130
    best = part / "checkpoints" / "best.pt"
    assert torch.load(best, weights_only=True)["epoch"] == 1  # epoch 2 is not scored yet
    assert cli.main(["train", "--resume", str(part), "--no-progress"]) == 130
    assert torch.load(best, weights_only=True)["epoch"] == 2
    assert cli.main(["train", "--resume", str(part), "--no-progress"]) == 0
    assert trained == [1, 2, 3, 4]
    assert "without a better validation recall@1 than epoch 2's" in (
        part / "train.log").read_text()
    assert (json.loads((part / "metrics.json").read_text())
            == json.loads((full / "metrics.json").read_text()))
    for name in ("best.pt", "last.pt"):
        mine, theirs = (torch.load(run / "checkpoints" / name, weights_only=True)
                        for run in (part, full))
        assert (mine["epoch"], mine["finished"]) == (theirs["epoch"], theirs["finished"])
        assert all(torch.equal(mine["method"][key], theirs["method"][key])
                   for key in theirs["method"])
    assert sorted(path.name for path in (part / "checkpoints").iterdir()) == ["best.pt",
                                                                              "last.pt"]


def test_patience_after_a_resume_with_more_epochs_counts_the_eval_every_grid_alone(
        tmp_path, monkeypatch):
    """A run of 3 epochs at train.eval_every=2 scores epochs 2 and 3 (its last); raised to 6
    epochs and resumed, train.patience=1 compares epoch 4 with epoch 2 alone, as a run of 6
    epochs from the start does (it never scores epoch 3). Counting epoch 3's better score, off
    the grid, had stopped the resumed run after epoch 4 and passed every test."""
    trained = scoring_killed_at(monkeypatch, set(), [0.5, 0.8, 0.7, 0.6])
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "data.batch_size=12", "data.validation=0.4", "train.epochs=3",
                     "train.eval_every=2", "train.patience=1", "train.steps_per_epoch=1"]) == 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["train"]["epochs"] = 6
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert trained == [1, 2, 3, 4, 5, 6]
    epochs = json.loads((out / "metrics.json").read_text())["epochs"]
    assert [row["epoch"] for row in epochs if "val/recall@1" in row] == [2, 3, 4, 6]


def test_only_epochs_that_are_scored_are_kept_before_their_scoring(tmp_path, monkeypatch):
    """train.eval_every: an epoch not scored has its checkpoint at once, as before; a scored
    one is kept as trained before it is scored. A kept epoch that last.pt holds already (a
    kill came between the two files) is superseded: a resume removes it."""
    from kdml.training import recorder

    real_save, written = recorder.save_checkpoint, []

    def save(state, path):
        written.append((path.name, state["epoch"]))
        real_save(state, path)

    monkeypatch.setattr(recorder, "save_checkpoint", save)
    train(tmp_path, "amsoftmax", "--dataset", "digits", "train.epochs=3", "train.eval_every=2",
          "train.steps_per_epoch=2")
    assert written == [("last.pt", 1), ("unscored.pt", 2), ("last.pt", 2), ("unscored.pt", 3),
                       ("last.pt", 3)]
    checkpoints = tmp_path / "run" / "checkpoints"
    state = torch.load(checkpoints / "last.pt", weights_only=True)
    before = (tmp_path / "run" / "metrics.json").read_text()
    torch.save({**state, "unscored": {"row": {"epoch": 3}, "over": False}},
               checkpoints / "unscored.pt")
    assert cli.main(["train", "--resume", str(tmp_path / "run"), "--no-progress"]) == 0
    assert not (checkpoints / "unscored.pt").exists()
    assert (tmp_path / "run" / "metrics.json").read_text() == before


def test_an_error_kdml_reports_while_scoring_drops_the_epoch_as_before(tmp_path, monkeypatch,
                                                                       capsys):
    """An error, not a kill (a setting refused once scored, embeddings that overflow): the
    trained epoch goes, the folder keeps last.pt as before the epoch (as the error says), and
    a resume trains the epoch again."""
    from kdml.training import trainer

    real_evaluate, calls = trainer.score_method, []

    def fails_in_epoch_2(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise trainer.NonFiniteEmbeddings("the test embeddings contain NaN")
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(trainer, "score_method", fails_in_epoch_2)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "train.steps_per_epoch=2"]) == 2
    assert "the run folder keeps epoch 1's checkpoint" in capsys.readouterr().err
    assert [path.name for path in (out / "checkpoints").iterdir()] == ["last.pt"]
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 1
    trained = scoring_killed_at(monkeypatch, set())
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert trained == [2]


def test_a_kill_while_the_unscored_epoch_is_written_leaves_a_partial_file_that_goes(tmp_path):
    from kdml.training.checkpoint import partial_checkpoints

    (tmp_path / ".unscored.pt.0q9ai83d.tmp").write_bytes(b"")
    (tmp_path / "unscored.pt").write_bytes(b"")
    assert partial_checkpoints(tmp_path) == [tmp_path / ".unscored.pt.0q9ai83d.tmp"]


def test_a_resumed_run_removes_the_partial_checkpoint_a_kill_left(tmp_path, trained_run):
    """A SIGKILL while last.pt was written leaves save_checkpoint's hidden partial (no except
    clause runs): the run's next session removes it, and only kdml's own."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(trained_run, out)
    partial = out / "checkpoints" / ".last.pt.0q9ai83d.tmp"
    partial.write_bytes(b"half")
    mine = out / "checkpoints" / ".last.pt.notmine.tmp"
    mine.write_bytes(b"the user's")
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert not partial.exists() and mine.read_bytes() == b"the user's"


def test_a_run_that_converged_on_an_epoch_killed_while_scored_stops_there_on_resume(
        tmp_path, kill_in_scoring):
    """unscored.pt keeps whether training ended with its epoch (train.tolerance met there):
    --resume scores it and stops, as the uninterrupted run did, not training on."""
    undo = kill_in_scoring(2)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "train.epochs=4", "train.tolerance=1e9", "train.steps_per_epoch=2"]) == 130
    assert torch.load(out / "checkpoints" / "unscored.pt", weights_only=True)["unscored"]["over"]
    undo()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2]
    assert "recall@1" in metrics["final"]
    assert "stopping after epoch 2: converged" in (out / "train.log").read_text()


def test_an_error_that_mending_ends_keeps_the_trained_epoch_for_resume(tmp_path, monkeypatch,
                                                                      capsys):
    """An unreadable test image (a one-off read failure, or a file to replace) while epoch 2
    is scored: the trained epoch is kept, and --resume scores it without training it again.
    In epoch 1 the same error leaves no checkpoint, so the corrected command starts afresh."""
    from kdml.training import trainer

    real_evaluate, calls = trainer.score_method, []

    def unreadable_at(failing: int):
        def scoring(*args, **kwargs):
            calls.append(1)
            if len(calls) == failing:
                raise KdmlError("cannot decode image x.jpg; replace or remove it")
            return real_evaluate(*args, **kwargs)
        return scoring

    out = tmp_path / "run"
    monkeypatch.setattr(trainer, "score_method", unreadable_at(2))
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "train.steps_per_epoch=2"]) == 2
    assert "cannot decode image" in capsys.readouterr().err
    assert sorted(path.name for path in (out / "checkpoints").iterdir()) == [
        "last.pt", "unscored.pt"]
    trained = scoring_killed_at(monkeypatch, set())
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert trained == []  # epoch 2, the last, is scored, not trained again
    assert [row["epoch"] for row in json.loads((out / "metrics.json").read_text())["epochs"]] \
        == [1, 2]
    calls.clear()
    first = tmp_path / "first"
    monkeypatch.setattr(trainer, "score_method", unreadable_at(1))
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(first), *TINY,
                     "train.steps_per_epoch=2"]) == 2
    assert not (first / "checkpoints").exists()


def test_an_unreadable_unscored_epoch_says_that_deleting_it_loses_that_epoch_only(tmp_path,
                                                                                   capsys):
    train(tmp_path, "amsoftmax", "--dataset", "digits", "train.steps_per_epoch=2")
    out = tmp_path / "run"
    (out / "checkpoints" / "unscored.pt").write_bytes(b"half a file")
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: {out / 'checkpoints' / 'unscored.pt'}, an epoch trained but not yet "
        "scored, is unreadable; delete it, and --resume trains that epoch again\n")


def test_embedding_a_test_set_shows_a_progress_bar_unless_told_not_to(capsys):
    """Scoring printed nothing for minutes while a large test set was embedded (kdml eval on
    10,000 images: a minute of silence); the embedding now counts its batches: on a terminal
    by default (tqdm's rule: not under pytest's capture), always with progress=True, never
    with False (--no-progress)."""
    from kdml.data.dataset import ArrayDataset
    from kdml.evaluation.evaluator import Embedder, embed_dataset

    dataset = ArrayDataset("rows", "", torch.rand(10, 3), torch.arange(10) % 2)
    class Rows(torch.nn.Linear):
        def embed(self, inputs: torch.Tensor) -> torch.Tensor:  # what the evaluator calls
            return self(inputs)

    method = Rows(3, 2)
    for progress, shown in ((None, False), (False, False), (True, True)):
        capsys.readouterr()
        embedded = embed_dataset(method, dataset, Embedder(batch_size=4, progress=progress))
        assert embedded.values.shape == (10, 2)
        err = capsys.readouterr().err
        assert ("embedding:" in err and "/3 " in err) == shown, (progress, err)  # 3 batches


def test_training_bars_stay_out_of_output_that_is_not_a_terminal(tmp_path, capsys):
    """Without --no-progress the bars follow tqdm's rule, drawn on a terminal only: rank 0's
    had been drawn everywhere (``None or not main`` is False), so a run's redirected output
    filled with thousands of bar lines (2.6 MB for six short runs)."""
    out = tmp_path / "run"
    settings = [arg for arg in TINY if arg != "--no-progress"]
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *settings,
                     "train.epochs=1", "train.steps_per_epoch=3"]) == 0
    err = capsys.readouterr().err
    assert "epoch 1:" not in err and "epochs:" not in err and "embedding" not in err, err


def test_a_run_whose_data_folder_moved_is_told_how_to_follow_it(tmp_path, capsys,
                                                                monkeypatch):
    """kdml eval and kdml train --resume of a folder: run whose folder moved got the reader's
    "no such folder" alone, which says neither that the run's data moved nor what follows it."""
    from fixtures_array_sets import make_image_folder

    folder = make_image_folder(tmp_path / "data", classes=4, per_class=4, size=24)
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", str(run),
                     *TINY, "train.epochs=1", "train.steps_per_epoch=1", "data.batch_size=4",
                     "data.resize=24", "data.image_size=24", "eval.ks=[1,2]"]) == 0
    moved = folder.rename(tmp_path / "moved")
    resume = ["train", "--resume", str(run), "--no-progress"]
    for command, remedy in ((["eval", str(run)], "point --data-root at the data the run "
                             "trained on"),
                            (resume, "put back the data the run trained on where its "
                             "config.yaml says, or point its data.root (or folder:/csv: path) "
                             "at where it is now")):
        capsys.readouterr()
        assert cli.main(command) == 2
        assert capsys.readouterr().err == (f"kdml: error: {run / 'config.yaml'} names "
                                           f"folder:{folder}, whose folder does not exist "
                                           f"now; {remedy}\n")
    assert cli.main(["eval", str(run), "--data-root", str(moved)]) == 0
    # a path edited into config.yaml as the readers take it, ~ for the home folder too
    monkeypatch.setenv("HOME", str(tmp_path))
    config = run / "config.yaml"
    config.write_text(config.read_text().replace(f"folder:{folder}", "folder:~/moved"))
    assert cli.main(["eval", str(run)]) == 0


@pytest.mark.parametrize(("raised", "code", "logged"), [
    (KeyboardInterrupt, 130, "stopped: interrupted (Ctrl-C)"),
    (KdmlError("the embeddings overflow"), 2, "stopped: the embeddings overflow"),
    (ZeroDivisionError("boom"), None, "stopped: an error"),
])
def test_train_log_says_why_a_session_stopped(tmp_path, monkeypatch, raised, code, logged):
    """train.log ends with why the session stopped (before, it ended at "epoch 1 trained;
    scoring" as if still running); an unexpected error leaves its traceback there, and the
    stop line is not counted as training time."""
    from kdml.reproduce.runner import logged_seconds
    from kdml.training import trainer

    def scoring(*args, **kwargs):
        raise raised

    monkeypatch.setattr(trainer, "score_method", scoring)
    run = tmp_path / "run"
    command = ["train", "amsoftmax", "--dataset", "digits", "--out", str(run), *TINY,
               "--no-progress", "train.steps_per_epoch=2"]
    if code is None:
        with pytest.raises(ZeroDivisionError):
            cli.main(command)
    else:
        assert cli.main(command) == code
    lines = (run / "train.log").read_text().splitlines()
    stop = next(position for position, line in enumerate(lines) if logged in line)
    assert lines[stop - 1].endswith("epoch 1 trained; scoring")
    assert ("Traceback (most recent call last):" in lines[stop + 1:]) == (code is None)
    start, end = (datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                  for line in (lines[0], lines[stop - 1]))
    assert "start epoch 1 of 2" in lines[0]
    assert logged_seconds(run / "train.log") == pytest.approx((end - start).total_seconds())


def test_a_run_resumed_with_nothing_left_to_train_scores_its_unscored_last_epoch(
        tmp_path, stop_in_epoch, capsys):
    """Stopped after epoch 2 of 4 (scored every 4th), then resumed with train.epochs lowered
    to 2: the run ended with an empty metrics table and "final": {}, as its epoch 2 was
    never scored. It is scored now, as a run's last epoch always is."""
    stop_in_epoch(3)
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run), *TINY,
                     "--no-progress", "train.epochs=4", "train.eval_every=4",
                     "train.steps_per_epoch=2"]) == 130
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("epochs: 4", "epochs: 2"))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert "recall@1" in capsys.readouterr().out
    final = json.loads((run / "metrics.json").read_text())["final"]
    assert "test/recall@1" in json.loads((run / "metrics.json").read_text())["epochs"][-1]
    log = (run / "train.log").read_text()
    assert "epoch 2 was trained but not scored; scoring it" in log
    # each value once: epoch 2's training terms were logged when it trained, its scores now
    # (the scoring had logged the whole row again, and TensorBoard got lr and loss twice)
    assert sum("epoch 2: " in line and "train/loss=" in line for line in log.splitlines()) == 1
    scored = next(line for line in log.splitlines() if "epoch 2 scored: " in line)
    assert "test/recall@1=" in scored and "train/loss" not in scored and "lr=" not in scored
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("train/loss")] == [1, 2]
    assert [event.step for event in events.Scalars("test/recall@1")] == [2]
    assert cli.main(["eval", str(run)]) == 0
    assert final == json.loads((run / "eval.json").read_text())["metrics"]


def test_a_stop_while_a_checkpoint_is_written_leaves_each_epoch_logged_once(tmp_path,
                                                                            monkeypatch):
    """A Ctrl-C during epoch 2's last.pt (torch.save raises it mid-write): the epoch had been
    logged to train.log and TensorBoard before the write, then again when --resume did it
    over, two points for one epoch (of different values, where it trains again)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from kdml.training import recorder

    real_save = recorder.save_checkpoint
    writes = []

    def stopped_at_the_second_last_pt(state, path):
        if path.name == "last.pt":
            writes.append(path)
            if len(writes) == 2:
                raise KeyboardInterrupt
        return real_save(state, path)

    monkeypatch.setattr(recorder, "save_checkpoint", stopped_at_the_second_last_pt)
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run), *TINY,
                     "--no-progress", "train.epochs=3", "train.steps_per_epoch=2"]) == 130
    monkeypatch.setattr(recorder, "save_checkpoint", real_save)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    log = (run / "train.log").read_text().splitlines()
    for epoch in (1, 2, 3):
        assert sum(f"epoch {epoch}: " in line for line in log) == 1, epoch
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("train/loss")] == [1, 2, 3]
    assert [event.step for event in events.Scalars("test/recall@1")] == [1, 2, 3]


def test_a_run_resumed_without_its_checkpoint_shows_each_epoch_once_in_tensorboard(tmp_path):
    """A run whose last.pt is gone (deleted; or kept as records alone) is trained again from
    epoch 1 by --resume: TensorBoard had shown its old events beside the new, each epoch
    twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run), *TINY,
                     "--no-progress", "train.epochs=2", "train.steps_per_epoch=1"]) == 0
    (run / "checkpoints" / "last.pt").unlink()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert len(list((run / "tensorboard").iterdir())) == 2  # the old file is kept
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("train/loss")] == [1, 2]
    assert [event.step for event in events.Scalars("test/recall@1")] == [1, 2]


def test_a_ctrl_c_between_an_epoch_s_checkpoint_and_its_log_line_waits_for_the_line():
    """A signal (a real one, not raised by a patched writer) inside the block that writes
    last.pt and logs the epoch stops the run only at the block's end, with the handler that
    was there (Python's Ctrl-C here); outside it, the handler is that one again."""
    import signal

    from kdml.training.recorder import _stops_deferred

    # Python's Ctrl-C, also where the suite was started in the background of a shell without
    # job control, which starts it with SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    done = []
    try:
        with pytest.raises(KeyboardInterrupt), _stops_deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("the log line")
        assert done == ["the log line"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupted_run_s_metrics_hold_the_epochs_it_finished(tmp_path, stop_in_epoch):
    """metrics.csv and metrics.json are written after each epoch, not only when the run ends:
    a run stopped in epoch 2 keeps epoch 1's row (and no final scores)."""
    stop_in_epoch(2)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "train.epochs=3"]) == 130
    metrics = json.loads((out / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["epochs"]] == [1] and metrics["final"] is None
    assert [line.split(",")[0] for line in
            (out / "metrics.csv").read_text().splitlines()] == ["epoch", "1"]


def test_a_worker_death_pending_with_the_sigterm_prints_nothing():
    """A kill of the process group delivers the loader workers' SIGCHLD with the SIGTERM:
    both pending, Python runs SIGTERM's handler first (the lower number), which took SIGCHLD's
    handler back to SIG_DFL, and then printed "Signal 17 ignored due to race condition" with
    a traceback over kdml's one-line stop (seen once in test_a_killed_training_says_so under
    load). Blocking both and sending them makes that order certain."""
    import subprocess
    import sys

    script = """
import os, signal, sys
from kdml import cli
from kdml.errors import Terminated
signal.signal(signal.SIGCHLD, lambda signum, frame: sys.exit("torch's handler ran"))
signal.signal(signal.SIGTERM, cli._interrupt)
both = {signal.SIGTERM, signal.SIGCHLD}
signal.pthread_sigmask(signal.SIG_BLOCK, both)
os.kill(os.getpid(), signal.SIGCHLD)
os.kill(os.getpid(), signal.SIGTERM)
try:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
    sum(range(10))
except Terminated:
    print("terminated")
sum(range(10))
print("end")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "terminated\nend\n", "")


def test_a_killed_training_says_so(tmp_path):
    """SIGTERM (kill, timeout, a scheduler's preemption) had stopped training without a word
    on the terminal or in train.log; it now stops it as Ctrl-C does (whose resume is tested
    above), with the shell's code for SIGTERM. Sent to the whole process group (as SLURM
    does), it also ends the loader's workers, whose deaths torch raised over the stop."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "kdml", "train", "amsoftmax", "--dataset", "digits", "--out",
         str(run), *TINY, "train.epochs=200", "train.eval_every=200", "--no-progress",
         "data.num_workers=2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    log = run / "train.log"
    deadline = time.time() + 120
    while not (log.exists() and "epoch 1:" in log.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    assert log.exists() and "epoch 1:" in log.read_text(), "epoch 1 did not end in 120 s"
    os.killpg(process.pid, signal.SIGTERM)  # the run and its loader's workers
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.endswith(f"kdml: terminated; continue with: kdml train --resume {run}\n"), err
    assert "Traceback" not in err
    assert log.read_text().splitlines()[-1].endswith("stopped: terminated (SIGTERM)")


def test_the_plots_error_does_not_hide_why_a_run_stopped(tmp_path, monkeypatch, capsys):
    """Drawn as the session ends, the plots met the same full disk that stopped the run and
    their error was raised in place of the stop (here a Ctrl-C)."""
    import errno

    from kdml import viz
    from kdml.training import trainer

    def scoring(*args, **kwargs):
        raise KeyboardInterrupt

    def full_disk(history, folder):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "loss.png"))

    monkeypatch.setattr(trainer, "score_method", scoring)
    monkeypatch.setattr(viz, "plot_training", full_disk)
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run), *TINY,
                     "train.steps_per_epoch=2", "train.eval_every=2"]) == 130
    err = capsys.readouterr().err
    assert "kdml: warning: the training plots are not drawn: " in err
    assert err.rstrip().endswith(f"kdml: interrupted; continue with: kdml train --resume {run}")


@pytest.mark.parametrize("fails_at", ["first", "later"])
def test_tensorboard_on_a_full_disk_names_its_folder(tmp_path, monkeypatch, capsys, fails_at):
    """TensorBoard's writer thread meets a full disk with an OSError that names no file, which
    its next write raises in the run's thread: the CLI took it for its printed output's
    ("the output could not be written"), and train.log's stop line held its traceback."""
    import errno

    from tensorboard.compat.tensorflow_stub.io import gfile

    writes: list[bytes] = []

    def full_disk_at(name: str):
        real = getattr(gfile.LocalFileSystem, name)

        def full_disk(self, filename, file_content, binary_mode=False):
            writes.append(file_content)
            if fails_at == "first" or len(writes) > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(self, filename, file_content, binary_mode)
        return full_disk

    for name in ("write", "append"):  # the events file's first write, and those after it
        monkeypatch.setattr(gfile.LocalFileSystem, name, full_disk_at(name))
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run), *TINY,
                     "train.steps_per_epoch=1", "train.epochs=3"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"kdml: error: {run / 'tensorboard'}: No space left on device; free space on its disk "
        "and run the command again (a stopped run continues with kdml train --resume)")
    log = (run / "train.log").read_text()
    assert f"stopped: {run / 'tensorboard'}: No space left on device" in log
    assert "Traceback" not in log


def test_plots_that_cannot_be_written_do_not_stop_training(tmp_path, monkeypatch, capsys):
    """plots/ not writable (an OSError, not kdml's own refusal of a picture it did not draw)
    had stopped the run with its checkpoints and metrics still writable."""
    from kdml import viz
    from kdml.training import recorder

    def not_writable(history, folder):
        raise PermissionError(13, "Permission denied", str(folder / "loss.png"))

    monkeypatch.setattr(viz, "plot_training", not_writable)
    monkeypatch.setattr(recorder, "PLOT_EVERY_S", 0.0)
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run), *TINY,
                     "train.steps_per_epoch=2"]) == 0
    assert "kdml: warning: the training plots are not drawn: " in capsys.readouterr().err
    assert len(json.loads((run / "metrics.json").read_text())["epochs"]) == 2


def test_a_checkpoint_gives_back_the_images_its_last_scoring_left_out():
    """A finished run resumed counts the samples its last scoring's metrics are of from the
    positions its checkpoint recorded; a checkpoint of a kdml before the record gives none,
    and positions that do not fit the splits are left out."""
    from kdml.data.dataset import ArrayDataset
    from kdml.data.splits import DataSplits
    from kdml.training.resume_state import recorded_unreadable

    def rows(count: int) -> ArrayDataset:
        return ArrayDataset("rows", "", torch.rand(count, 3), torch.arange(count) % 2)

    splits = DataSplits(rows(10), rows(4), [0, 1], gallery=rows(6))
    recorded = {"test": torch.tensor([1, 3]), "gallery": torch.tensor([5])}
    given = recorded_unreadable({"epoch": 3, "unreadable": recorded}, splits)
    assert {part: positions.tolist() for part, positions in given.items()} == {
        "test": [1, 3], "gallery": [5]}
    assert recorded_unreadable({"epoch": 3}, splits) == {}  # a kdml before the record
    beyond = {"test": torch.tensor([4]), "gallery": torch.tensor([0]), "train": torch.tensor([0])}
    assert recorded_unreadable({"unreadable": beyond}, DataSplits(rows(10), rows(4), [0, 1])) == {}


def test_a_run_converged_on_its_last_epoch_trains_no_further_when_epochs_are_raised(
        tmp_path, tiny_overrides, capsys):
    """As a run out of patience (tests/test_selection.py): the convergence rule met on the last
    planned epoch is met there by a longer run too, so raising train.epochs trains nothing
    (said on the screen too: it had been only in train.log)."""
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "train.epochs=2",
                     "train.tolerance=1e6", "train.steps_per_epoch=2"]) == 0
    assert "stopping after epoch 2: converged" in (out / "train.log").read_text()
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["train"]["epochs"] = 3
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert len(json.loads((out / "metrics.json").read_text())["epochs"]) == 2
    assert "it stopped early, after epoch 2; nothing left to train" in (
        out / "train.log").read_text()
    assert (f"resuming {out} after epoch 2 of 3: it stopped early; nothing left to train\n"
            in capsys.readouterr().out)


def test_a_resumed_run_takes_its_weights_from_its_checkpoint_not_from_model_weights(
        tmp_path, tiny_overrides, capsys):
    """--resume had read model.weights' file again, only for the checkpoint to replace every
    weight, and stopped when the file was gone (its message said to pass the path, which
    --resume refuses)."""
    from kdml.models.backbones import build_backbone

    weights = tmp_path / "pretrained.pth"
    torch.save(build_backbone("cnn", (1, 8, 8)).state_dict(), weights)  # digits' default
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "train.epochs=1", "--weights",
                     str(weights), "train.steps_per_epoch=2"]) == 0
    assert f"from {weights}" in capsys.readouterr().out
    # the load's line is kept with the run, not only printed
    assert re.search(rf"model\.weights: loaded \d+ tensors from {re.escape(str(weights))}",
                     (out / "train.log").read_text())
    weights.unlink()
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["train"]["epochs"] = 2
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert len(json.loads((out / "metrics.json").read_text())["epochs"]) == 2


def test_a_finished_run_resumed_with_fewer_epochs_logs_the_epochs_it_trained(
        tmp_path, tiny_overrides, capsys):
    """The log had said "all 1 epochs are trained" of a run whose checkpoint and metrics hold
    2. The screen says there is nothing left to train (it had said only "resuming ...")."""
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "train.epochs=2",
                     "train.steps_per_epoch=2"]) == 0
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("epochs: 2", "epochs: 1"))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert (f"resuming {out} after epoch 2 (train.epochs is now 1): nothing left to train\n"
            in capsys.readouterr().out)
    log = (out / "train.log").read_text()
    assert "all 2 epochs are trained (train.epochs is now 1); nothing left to train" in log
    assert len(json.loads((out / "metrics.json").read_text())["epochs"]) == 2


def test_an_unknown_key_in_a_run_s_config_yaml_names_the_file(tmp_path, trained_run, capsys):
    """The refusal had read as one of a command's own inputs: "unknown config key
    'train.foo' for recipe 'amsoftmax'", with no word of which file held it."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(trained_run, out)  # the tiny run trained for 1 epoch (conftest)
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("train:\n", "train:\n  foo: 1\n"))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith(
        f"kdml: error: {config}: unknown config key 'train.foo' for recipe 'amsoftmax'")


@pytest.fixture(scope="module")
def stopped_on_an_unscored_epoch(tmp_path_factory):
    """A run that train.tolerance stops after epoch 2, an epoch train.eval_every=5 does not
    score; epoch 1 is not scored either."""
    out = tmp_path_factory.mktemp("unscored") / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "data.batch_size=20", "train.steps_per_epoch=2", "train.epochs=5",
                     "train.eval_every=5", "train.tolerance=1e9"]) == 0
    return out


def test_the_epoch_a_tolerance_stop_ends_on_is_scored(stopped_on_an_unscored_epoch):
    """The epoch training ends with is scored, also when train.tolerance ends it on an epoch
    eval_every skips; a run that then ended with `final: {}` had passed every test."""
    metrics = json.loads((stopped_on_an_unscored_epoch / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2]
    assert "recall@1" in metrics["final"]
    assert "test/recall@1" in metrics["epochs"][1]


def test_metrics_csv_has_the_score_columns_when_epoch_1_is_not_scored(
        stopped_on_an_unscored_epoch):
    """metrics.csv's columns are every row's keys, not epoch 1's: taking them from the first
    row (unscored with eval_every>1) had dropped every score column and passed every test."""
    metrics = json.loads((stopped_on_an_unscored_epoch / "metrics.json").read_text())
    lines = (stopped_on_an_unscored_epoch / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert set(header) == {key for row in metrics["epochs"] for key in row}
    assert "test/recall@1" in header
    scored = dict(zip(header, lines[2].split(","), strict=True))
    assert float(scored["test/recall@1"]) == pytest.approx(
        metrics["epochs"][1]["test/recall@1"], abs=1e-4)


def test_the_epoch_loss_is_the_mean_over_the_steps_that_ran(tmp_path):
    """With data.on_bad_image=skip, batches of only unreadable files are left out: the epoch's
    train/loss (which train.tolerance reads) is the mean over the steps that ran. Dividing by
    the number of batches drawn made it silently smaller and had passed every test."""
    from PIL import Image

    from kdml.config import resolve_config
    from kdml.training.recipes import get_recipe
    from kdml.training.trainer import Session, train_one_epoch

    generator = torch.Generator().manual_seed(0)
    for label in range(4):
        folder = tmp_path / "photos" / f"class{label}"
        folder.mkdir(parents=True)
        for index in range(4):
            pixels = torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8, generator=generator)
            Image.fromarray(pixels.numpy()).save(folder / f"ok{index}.png")
            (folder / f"bad{index}.jpg").write_bytes(b"not a jpeg at all")
    spec = get_recipe("amsoftmax")
    config = resolve_config(spec.name, spec.params, spec.defaults, overrides=[
        f"data.dataset=folder:{tmp_path / 'photos'}", "train.device=cpu",
        "model.embedding_size=8", "eval.nmi=false", "data.batch_size=2",
        "data.split=seen-holdout", "data.on_bad_image=skip", "data.resize=16",
        "data.image_size=16", "model.backbone=identity", "data.num_workers=0", "eval.ks=[1]"])
    session = Session.build(config, echo=lambda line: None)
    losses = []
    session.model.register_forward_hook(
        lambda module, inputs, output: losses.append(float(output.terms["loss"])))
    means = train_one_epoch(session, 1, progress=False)
    assert 0 < len(losses) < len(session.batches)  # some batches were left out
    assert means["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_a_change_of_exactly_the_tolerance_does_not_stop_a_run():
    """DTML's rule stops when |J_k - J_(k-1)| < tolerance, strictly: a change of exactly the
    tolerance trains on (stopping on it, with <=, had passed every test)."""
    from kdml.training.trainer import _converged
    assert not _converged([{"train/loss": 1.0}], {"train/loss": 1.5}, 0.5)
    assert _converged([{"train/loss": 1.0}], {"train/loss": 1.25}, 0.5)


def test_convergence_compares_an_epoch_with_the_one_before_it_not_the_first():
    """J_(k-1) is the previous epoch's loss: against the first epoch's, a run whose loss
    settled after falling a long way would train on forever (and one that came back near its
    first loss would stop)."""
    from kdml.training.trainer import _converged
    assert _converged([{"train/loss": 5.0}, {"train/loss": 1.0}], {"train/loss": 1.05}, 0.1)
    assert not _converged([{"train/loss": 1.0}, {"train/loss": 5.0}], {"train/loss": 1.05},
                          0.1)


def test_a_missing_or_nan_value_is_an_empty_cell_of_metrics_csv(tmp_path):
    """An epoch not scored (None) or a NaN loss is an empty cell, not "nan" (metrics.json keeps
    the row as it is)."""
    from kdml.training.run_folder import RunFolder

    RunFolder(tmp_path).write_metrics(
        [{"epoch": 1, "train/loss": float("nan"), "test/recall@1": None},
         {"epoch": 2, "train/loss": 0.25, "test/recall@1": 0.5}], None)
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "epoch,train/loss,test/recall@1", "1,,", "2,0.25,0.5"]


@pytest.mark.parametrize("name", ["metrics.json", "metrics.csv"])
def test_a_metrics_file_that_is_a_link_is_never_replaced(tmp_path, name):
    """A link at metrics.json or metrics.csv, even to a file kdml wrote, is refused: the rename
    into place had replaced the link with a file."""
    from kdml.training.run_folder import RunFolder

    kept = tmp_path / "kept"
    kept.mkdir()
    RunFolder(kept).write_metrics([{"epoch": 1, "train/loss": 0.5}], None)
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(kept / name)
    with pytest.raises(KdmlError, match=f"{name} is in the way and kdml did not write it"):
        RunFolder(run).write_metrics([{"epoch": 1, "train/loss": 0.25}], None)
    assert (run / name).is_symlink()
    assert "0.5" in (kept / name).read_text()


def test_run_logging_gives_back_the_package_logger_s_level(tmp_path):
    import logging

    from kdml.run_log import run_logging

    package = logging.getLogger("kdml")
    before = package.level
    package.setLevel(logging.ERROR)
    try:
        with run_logging(tmp_path / "train.log") as log:
            log.info("an epoch")
        assert package.level == logging.ERROR
    finally:
        package.setLevel(before)
    assert "an epoch" in (tmp_path / "train.log").read_text()


def test_warnings_on_stderr_shows_kdml_s_warnings_or_drops_them(capsys):
    import logging

    from kdml.run_log import warnings_on_stderr

    with warnings_on_stderr():
        logging.getLogger("kdml.data").warning("an image skipped")
    assert capsys.readouterr().err == "kdml: warning: an image skipped\n"
    with warnings_on_stderr(shown=False):
        logging.getLogger("kdml.data").warning("an image skipped")
    assert capsys.readouterr().err == ""
