"""Bad input from a user, one case per class: exit status 2, one line on stderr, no traceback,
and no file that existed before is changed."""

from __future__ import annotations

import errno
import gc
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kdml import __version__, cli
from kdml.training import trainer

TINY = ["train.epochs=1", "data.batch_size=20", "data.samples_per_class=4",
        "model.embedding_size=8", "eval.nmi=false", "--no-progress", "train.device=cpu"]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def refused(tmp_path: Path, capsys, *args: str | Path) -> str:
    """Run ``kdml ARGS``; assert exit 2, one line, and tmp_path's files untouched."""
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert cli.main([str(arg) for arg in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kdml: error:") and "\n" not in err and "Traceback" not in err, err
    after = snapshot(tmp_path)
    assert {name: after.get(name) for name in before} == before
    return err


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory) -> Path:
    """A finished tiny run of one step, trained once per module, for the commands that read a
    run (tests that change it work on a copy). One step, not conftest's trained_run's whole
    epoch: what these tests read of a run does not depend on how long it trained."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "train.steps_per_epoch=1"]) == 0
    return out


@pytest.fixture
def finished_run(one_step_run, tmp_path_factory) -> Path:
    """A copy of one finished tiny run, for each test to break as it likes."""
    out = tmp_path_factory.mktemp("finished") / "run"
    shutil.copytree(one_step_run, out)
    return out


# ----------------------------------------------------------------------------- files


def test_a_folder_with_a_users_files_is_never_written_into(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "metrics.csv").write_text("my,own,numbers\n")
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out", out,
                  *TINY)
    assert "other files" in err
    assert (out / "metrics.csv").read_text() == "my,own,numbers\n"


def test_an_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out", "",
                  *TINY)
    assert "empty one" in err
    assert list(tmp_path.iterdir()) == []


def test_out_under_a_file(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out",
                  tmp_path / "notes.txt" / "run", *TINY)
    assert "is a file" in err


def test_out_in_an_unwritable_place(tmp_path, capsys, monkeypatch):
    """A folder the user may not write into. Root may write anywhere, and the suite may run as
    root: the permission check is told so, as it would find it for another user."""
    from kdml.training import run_folder

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    access = os.access
    monkeypatch.setattr(run_folder.os, "access", lambda path, mode: (
        False if Path(path) == locked else access(path, mode)))
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out",
                  locked / "run", *TINY)
    assert err == (f"kdml: error: cannot make the run folder {locked / 'run'}: {locked} is not "
                   "writable")
    assert not (locked / "run").exists()


def test_something_in_the_way_of_a_result_is_named(tmp_path, capsys, finished_run):
    """A folder where a result file goes, or a file where the plots folder goes: the path and
    the reason in one line, not an OSError's traceback."""
    (finished_run / "eval.json").mkdir()
    err = refused(tmp_path, capsys, "eval", finished_run)
    assert err == (f"kdml: error: {finished_run / 'eval.json'} is a folder, where kdml writes "
                   "a file; move it away")
    assert not (finished_run / "eval.json.tmp").exists()
    shutil.rmtree(finished_run / "plots")
    (finished_run / "plots").write_text("mine\n")
    err = refused(tmp_path, capsys, "plot", "retrieval", finished_run)
    assert err == (f"kdml: error: cannot write into {finished_run / 'plots'}: "
                   f"{finished_run / 'plots'} is not a folder; plots go there: move what is in "
                   "the way, or make the folder writable")
    assert (finished_run / "plots").read_text() == "mine\n"


@pytest.mark.parametrize("name", ["eval.json", "generalization.json"])
def test_a_result_file_kdml_did_not_write_is_never_replaced(tmp_path, capsys, finished_run,
                                                            name):
    """A user's file under a result's name (a JSON object with none of kdml's fields, or
    anything else) is refused before any work and left as it was; kdml's own is replaced."""
    from kdml.evaluation import evaluator
    from kdml.inspection import analysis

    command = {"eval.json": ["eval"], "generalization.json": ["analyze", "generalization"]}[name]

    def no_work(*args, **kwargs):
        raise AssertionError("the embedding started before the refusal")

    for theirs in ('{"note": "mine"}', "[1, 2]", "notes, not JSON\n"):
        (finished_run / name).write_text(theirs)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(evaluator, "score_method", no_work)
            patch.setattr(analysis, "embed_dataset", no_work)
            err = refused(tmp_path, capsys, *command, finished_run)
        assert err == (f"kdml: error: {finished_run / name} is in the way and kdml did not "
                       "write it; move it away (kdml never replaces a file it did not write)")
        assert (finished_run / name).read_text() == theirs
    (finished_run / name).unlink()
    for _ in range(2):  # the second run replaces the first's file
        assert cli.main([*command, str(finished_run)]) == 0
    assert isinstance(json.loads((finished_run / name).read_text()), dict)
    assert not list(finished_run.glob(".*.json"))  # no partial file left beside it


def test_an_out_that_is_a_symbolic_link_is_never_replaced(tmp_path, capsys, finished_run):
    """A link (dangling or not) at --out would be replaced by the file renamed into place."""
    (tmp_path / "emb.npz").symlink_to(tmp_path / "elsewhere.npz")  # dangling
    (tmp_path / "empty").mkdir()
    (tmp_path / "index").symlink_to(tmp_path / "empty")
    (tmp_path / "report.md").symlink_to(tmp_path / "missing.md")
    for command, out in (("embed", "emb.npz"), ("index", "index")):
        err = refused(tmp_path, capsys, command, finished_run, "--out", tmp_path / out)
        assert err == (f"kdml: error: --out {tmp_path / out} is a symbolic link, which kdml "
                       "would replace; give the path it points to, or another one")
    err = refused(tmp_path, capsys, "reproduce", "dtml", "--quick", "--out",
                  tmp_path / "report.md")
    assert "report.md is a symbolic link" in err
    assert all((tmp_path / name).is_symlink() for name in ("emb.npz", "index", "report.md"))


def test_default_run_folder_names_are_single_safe_folders(tmp_path, monkeypatch):
    from kdml.training.run_folder import default_run_dir

    monkeypatch.chdir(tmp_path)  # the folders are made
    for dataset in ("folder:/data/my photos/", "csv:../lists/train.csv", "npz:/x/y/f.npz",
                    "mnist5k->digits"):
        path = default_run_dir("jrd", dataset, parent=Path("runs"))
        assert path.parent == Path("runs") and re.fullmatch(r"[\w.-]+", path.name), path


def test_default_run_folders_claimed_in_the_same_second_are_each_their_own(tmp_path,
                                                                           monkeypatch):
    # jobs started together without --out once picked the same free name; all but one failed
    from concurrent.futures import ThreadPoolExecutor
    from datetime import datetime

    from kdml.errors import KdmlError
    from kdml.training import run_folder

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(run_folder, "datetime", Frozen)
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: run_folder.default_run_dir("jrd", "digits",
                                                                   tmp_path / "runs"), range(8)))
    assert len(set(paths)) == 8 and all(path.is_dir() for path in paths)
    assert tmp_path / "runs" / "jrd-digits-20260102-030405" in paths
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(KdmlError, match=f"cannot make the run folder {tmp_path}/afile/jrd-"
                                        f"digits-20260102-030405: {tmp_path}/afile is a file$"):
        run_folder.default_run_dir("jrd", "digits", tmp_path / "afile")


@pytest.mark.parametrize("runs", ["runs", "runs/deeper"])
def test_a_default_run_folder_under_a_link_to_nothing_is_refused_not_sought_forever(tmp_path,
                                                                                   runs):
    # runs/ linked to a drive not mounted: mkdir -p says "File exists" for every name, and
    # default_run_dir had tried -2, -3, ... forever (kdml train without --out hung); a
    # daemon thread, so that a claim that never ends fails the test instead of hanging it
    import threading

    from kdml.errors import KdmlError
    from kdml.training.run_folder import default_run_dir

    (tmp_path / "runs").symlink_to(tmp_path / "unmounted" / "runs")
    said: list[str] = []

    def claim() -> None:
        try:
            default_run_dir("jrd", "digits", tmp_path / runs)
        except KdmlError as error:
            said.append(str(error))

    thread = threading.Thread(target=claim, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "default_run_dir is still looking for a free name"
    (message,) = said
    here = re.escape(str(tmp_path))
    assert re.fullmatch(f"cannot make the run folder {here}/{runs}/jrd-digits-[0-9-]+: "
                        f"{here}/runs is a link to {here}/unmounted/runs, which does not "
                        "exist; make that folder, or remove the link", message), message
    assert not (tmp_path / "unmounted").exists()


def test_a_refused_run_leaves_no_default_run_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a setting refused once the data loads, after the claim
    err = refused(tmp_path, capsys, "train", "jrd", "--dataset", "digits",
                  "data.batch_size=100000", *TINY[3:])
    assert "batch_size" in err
    assert not (tmp_path / "runs").exists()  # nor the runs/ folder made for it
    (tmp_path / "runs").mkdir()  # a runs/ folder of the user's stays, empty as it was
    refused(tmp_path, capsys, "train", "jrd", "--dataset", "digits", "data.batch_size=100000",
            *TINY[3:])
    assert (tmp_path / "runs").is_dir() and not any((tmp_path / "runs").iterdir())


def test_safe_name_examples_of_its_docstring():
    from kdml.training.run_folder import safe_name

    assert safe_name("folder:/data/my photos") == "folder-my-photos"
    assert safe_name("mnist5k->digits") == "mnist5k--digits"
    assert safe_name("npz:/x/y/f.npz") == "npz-f"


def test_a_run_stopped_in_its_first_epoch_can_be_resumed(tmp_path, capsys, stop_in_epoch):
    out = tmp_path / "run"
    undo = stop_in_epoch(1)
    # one step per epoch: the stop comes as epoch 1 starts, and the resume needs no long epoch
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     *TINY, "train.steps_per_epoch=1"]) == 130
    assert f"kdml train --resume {out}" in capsys.readouterr().err
    undo()
    # (the same new command would start it afresh: it saved no checkpoint; test_run_lock.py)
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert "recall@1" in capsys.readouterr().out


def test_an_epochs_last_update_that_overflows_the_outputs_stops_training(tmp_path, capsys):
    """The epoch's last update is seen by no loss before the evaluation: its weights (1e20,
    finite) overflowed the test embeddings, and the run used to end with "embeddings contains
    NaN or infinite values", which `kdml reproduce` took for a broken run, not a diverged one."""
    out = tmp_path / "run"
    assert cli.main(["train", "jrd", "--dataset", "digits", "--out", str(out), *TINY,
                     "train.steps_per_epoch=1", "optim.lr=1e20"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("kdml: error: training stopped after epoch 1: the test embeddings contain NaN "
                   "or infinite values: the model's weights or its outputs overflowed; no epoch "
                   "finished, so the run folder holds no checkpoint. Lower the learning rates "
                   "or the regularizer weight and train again"), err
    # as before the epoch: not even an empty checkpoints/ (its unscored.pt went with it)
    assert not (out / "checkpoints").exists()


def test_weights_left_non_finite_by_an_epochs_last_update_stop_training():
    """Checked before the epoch's checkpoint keeps them: parameters and float buffers (BatchNorm's
    running statistics), not integer ones."""
    from kdml.training.nonfinite import NonFiniteLoss, NonFiniteWatch

    layer = torch.nn.BatchNorm1d(3)
    NonFiniteWatch.check_weights(layer.state_dict().values(), 2, 7)  # finite: nothing
    layer.running_var[1] = float("inf")
    with pytest.raises(NonFiniteLoss, match=r"^training stopped: the weights became NaN or "
                       r"infinite in the update of epoch 2, step 7; the run folder keeps epoch "
                       r"1's checkpoint\. Lower the learning rates"):
        NonFiniteWatch.check_weights(layer.state_dict().values(), 2, 7)
    layer.running_var[1] = 1.0
    layer.weight.data[0] = float("nan")
    with pytest.raises(NonFiniteLoss, match="weights became NaN"):
        NonFiniteWatch.check_weights(layer.state_dict().values(), 2, 7)


def test_an_unevaluated_epoch_never_checkpoints_non_finite_weights(tmp_path, capsys, monkeypatch):
    """A finite loss with NaN gradients (sqrt at 0) makes the epoch's only update NaN; with no
    evaluation after that epoch, its checkpoint used to keep the NaN weights."""
    from kdml.training.recipes.jrd import JRDMethod

    real_forward = JRDMethod.forward

    def nan_gradients(self, *args, **kwargs):
        output = real_forward(self, *args, **kwargs)
        output.loss = output.loss + (self.head.proxies * 0).sqrt().sum()  # + 0, gradient NaN
        return output

    monkeypatch.setattr(JRDMethod, "forward", nan_gradients)
    out = tmp_path / "run"
    assert cli.main(["train", "jrd", "--dataset", "digits", "--out", str(out), *TINY,
                     "train.epochs=2", "train.eval_every=2", "train.steps_per_epoch=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "training stopped: the weights became NaN or infinite in the update of epoch 1, " \
        "step 1; no epoch finished" in err, err
    assert not (out / "checkpoints" / "last.pt").exists()


def test_a_non_finite_loss_stops_with_its_epoch_step_and_term(tmp_path, capsys, monkeypatch):
    from kdml.training.recipes.jrd import JRDMethod

    out = tmp_path / "run"
    real_forward = JRDMethod.forward
    steps = []

    def poisoned(self, *args, **kwargs):
        output = real_forward(self, *args, **kwargs)
        steps.append(1)
        if len(steps) == 15:  # in the second epoch (train.steps_per_epoch=10)
            output.terms["regularizer"] = output.terms["regularizer"] * float("nan")
            output.loss = output.loss * float("nan")
        return output

    monkeypatch.setattr(JRDMethod, "forward", poisoned)
    assert cli.main(["train", "jrd", "--dataset", "digits", "--out", str(out), *TINY,
                     "train.epochs=3", "train.steps_per_epoch=10"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'regularizer' term became NaN or infinite at epoch 2, step 5" in err, err
    assert "the run folder keeps epoch 1's checkpoint" in err
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert state["epoch"] == 1
    assert all(torch.isfinite(value).all() for value in state["method"].values()
               if value.is_floating_point())


def test_a_watch_read_every_few_steps_names_the_first_non_finite_step_and_its_term():
    """On a GPU the watch is read every NONFINITE_CHECK_EVERY steps; the CPU tests read it every
    step, so a watch that kept the last bad step (and its terms) had passed every test."""
    from kdml.training.nonfinite import NonFiniteLoss, NonFiniteWatch

    nan, ok = torch.tensor(float("nan")), torch.tensor(1.0)
    watch = NonFiniteWatch(check_every=8)
    for step in range(8):  # the regularizer goes NaN at step 3, am_softmax at step 6
        terms = {"regularizer": nan if step >= 2 else ok, "am_softmax": nan if step >= 5 else ok}
        terms["loss"] = terms["regularizer"] + terms["am_softmax"]
        watch.observe(step, terms)
        assert watch.due(step) == (step == 7)
    with pytest.raises(NonFiniteLoss, match=r"^training stopped: the 'regularizer' term became "
                       r"NaN or infinite at epoch 1, step 3; no epoch finished"):
        watch.check(epoch=1)


def test_a_float16_overflow_is_named_as_such(tmp_path, capsys):
    """Features of size 1e5, beyond float16's 65504, overflow at the first step under fp16,
    before any update: the error had told to lower the learning rates, which cannot help."""
    rng = np.random.default_rng(0)
    features = (rng.standard_normal((400, 16)) * 1e5).astype(np.float32)
    np.savez(tmp_path / "big.npz", X=features, y=np.tile(np.arange(10), 40),
             domain=np.repeat(["source", "target"], 200))
    assert cli.main(["train", "dtml", "--dataset", f"npz:{tmp_path / 'big.npz'}", "--out",
                     str(tmp_path / "run"), "--no-progress", "train.epochs=1",
                     "train.steps_per_epoch=2", "train.precision=fp16", "train.device=cpu",
                     "data.batch_size=100", "data.samples_per_class=10"]) == 2
    err = capsys.readouterr().err
    assert "became NaN or infinite at epoch 1, step 1" in err and err.endswith(
        "Under train.precision=fp16 a value beyond float16's range (65504) overflows too: train "
        "with train.precision=bf16 or fp32, or lower the learning rates or the regularizer "
        "weight and train again\n")


# ----------------------------------------------------------------------------- one line


def test_config_that_is_not_utf8(tmp_path, capsys):
    (tmp_path / "config.yaml").write_bytes(b"recipe: jrd\ndata:\n  dataset: \xff\xfe\n")
    assert "not UTF-8" in refused(tmp_path, capsys, "train", "jrd", "--config",
                                  tmp_path / "config.yaml")


def test_an_empty_dataset_name_is_refused(tmp_path, capsys):
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "", "--out",
                  tmp_path / "run", *TINY)
    assert "dataset name is empty" in err and "kdml datasets" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("prefix", ["folder:", "csv:"])
def test_a_dataset_prefix_without_a_path_asks_for_one(tmp_path, capsys, prefix):
    """`folder:` as YAML is the mapping {'folder': None}; its message was about that type."""
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", prefix, "--out",
                  tmp_path / "run", *TINY)
    what = "DIR" if prefix == "folder:" else "FILE"
    assert err == f"kdml: error: {prefix} needs a path: --dataset {prefix}{what}"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("dataset", "why"), [
    ("digits", "it is not read from a data folder"),
    ("mnist5k->digits", "it is not read from a data folder"),
    ("folder:{tmp}/photos", "its path is in its name")])
def test_a_data_root_that_the_dataset_would_ignore_is_refused(tmp_path, capsys, dataset, why,
                                                              finished_run):
    """It used to be ignored without a word: a user pointing at their own copy trained on
    the bundled data, or on another folder than the one they named."""
    dataset = dataset.format(tmp=tmp_path)
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", dataset, "--data-root",
                  tmp_path, "--out", tmp_path / "run", *TINY)
    assert err == (f"kdml: error: --data-root {tmp_path} (data.root) is read only by the "
                   "on-disk formats (cub, cars196, sop, inshop, cifar10, cifar100, mnist, "
                   f"fashion-mnist); {dataset} does not use it ({why}): drop it")
    assert not (tmp_path / "run").exists()
    if dataset == "digits":  # a finished run's commands refuse it too
        assert "does not use it" in refused(tmp_path, capsys, "eval", finished_run,
                                            "--data-root", tmp_path)


def test_a_run_saved_with_a_data_root_its_dataset_ignored_still_works(finished_run, capsys):
    """Runs trained before the root was refused kept it in config.yaml; it changed nothing
    then, so eval and --resume drop it instead of refusing the run."""
    config = finished_run / "config.yaml"
    config.write_text(config.read_text().replace("  root: ''", "  root: /nowhere"))
    assert "root: /nowhere" in config.read_text()
    assert cli.main(["eval", str(finished_run)]) == 0
    assert "Test metrics (amsoftmax, digits)" in capsys.readouterr().out
    assert cli.main(["train", "--resume", str(finished_run), "--no-progress"]) == 0


def test_an_empty_dataset_setting_is_refused(tmp_path, capsys):
    err = refused(tmp_path, capsys, "train", "amsoftmax", "data.dataset=", "--out",
                  tmp_path / "run", *TINY)
    assert "dataset name is empty" in err and "kdml datasets" in err


@pytest.mark.parametrize("setting", ["optim.weight_decay=-1", "optim.lr_gamma=0",
                                     "method.scale=nan", "optim.lr=inf", "optim.lr=1e38",
                                     "optim.proxy_lr=1e31"])
def test_a_nonsense_number_is_refused_before_training(tmp_path, capsys, setting):
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out",
                  tmp_path / "run", setting, "optim.lr_step=1", *TINY)
    assert setting.split("=")[0] in err and "Lower the learning rates" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("setting", ["method.kernel_multiplier=0",
                                     "method.polynomial_degree=0"])
def test_kernel_settings_out_of_range_are_named_by_kdml_config(tmp_path, capsys, setting):
    """These were refused only by the kernels, inside training, without the setting's name."""
    err = refused(tmp_path, capsys, "config", "jrd", setting)
    assert err.startswith(f"kdml: error: {setting.split('=')[0]} must be ")


def test_a_section_given_as_a_setting_is_named_a_section(tmp_path, capsys):
    err = refused(tmp_path, capsys, "config", "jrd", "data=5")
    assert err == ("kdml: error: 'data' is a section, not a setting; set one of its keys, e.g. "
                   "data.dataset=VALUE ('kdml config jrd' lists them)")


def test_config_for_another_recipe(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("recipe: mtriplet\n")
    assert "recipe 'mtriplet'" in refused(tmp_path, capsys, "train", "jrd", "--config",
                                          tmp_path / "c.yaml")


@pytest.mark.parametrize(("args", "message"), [
    (["analyze", "generalization", "RUN", "--repeats", "1"], "--repeats: must be >= 2"),
    (["analyze", "generalization", "RUN", "--neighbors", "-2"], "--neighbors: must be >= 1"),
    (["analyze", "generalization", "RUN", "--labelled-fraction", "1.5"], "between 0 and 1"),
    (["plot", "charts", "RUN", "--thumbnails", "-1"], "--thumbnails: must be >= 0"),
    (["train", "jrd", "--seed", "-1"], "--seed: must be from 0"),
    (["train", "jrd", "--seed", str(2**64)], "--seed: must be from 0"),
    (["train", "jrd", "train.seed=-5"], "train.seed must be from 0"),
])
def test_out_of_range_options(tmp_path, capsys, finished_run, args, message):
    args = [str(finished_run) if arg == "RUN" else arg for arg in args]
    assert message in refused(tmp_path, capsys, *args)


def test_resume_with_a_checkpoint_of_another_recipe_or_shape(tmp_path, capsys, finished_run):
    other = tmp_path / "other"
    # one step, as finished_run: the embedding size is the one setting that differs
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(other), *TINY,
                     "model.embedding_size=16", "train.steps_per_epoch=1"]) == 0
    (other / "checkpoints" / "last.pt").write_bytes(
        (finished_run / "checkpoints" / "last.pt").read_bytes())
    # its config records the model it fits: the setting that differs is named
    err = refused(tmp_path, capsys, "train", "--resume", other)
    assert "does not fit the run's config" in err and "model.embedding_size 8 -> 16" in err
    assert err.endswith("or the checkpoint belongs to another run")
    triplet = tmp_path / "triplet"
    assert cli.main(["train", "triplet", "--dataset", "digits", "--out", str(triplet),
                     *TINY, "train.steps_per_epoch=1"]) == 0
    (triplet / "checkpoints" / "last.pt").write_bytes(
        (finished_run / "checkpoints" / "last.pt").read_bytes())
    assert "'amsoftmax' run" in refused(tmp_path, capsys, "train", "--resume", triplet)


def test_settings_for_many_gpus_are_refused_where_they_cannot_work(tmp_path, capsys):
    assert "SyncBatchNorm" in refused(tmp_path, capsys, "train", "jrd", "--dataset", "digits",
                                      "--out", tmp_path / "a", "model.sync_bn=true", *TINY)
    assert "torchrun" in refused(tmp_path, capsys, "train", "jrd", "--dataset", "digits",
                                 "--out", tmp_path / "b", "train.sharded_kernels=true", *TINY)


def test_feature_file_that_is_not_an_npz(tmp_path, capsys):
    np.save(tmp_path / "features.npy", np.zeros((4, 3)))
    assert "not an .npz" in refused(tmp_path, capsys, "train", "dtml", "--dataset",
                                    f"npz:{tmp_path / 'features.npy'}", "--out",
                                    tmp_path / "run")


def test_version_is_printed(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kdml {__version__}"


def test_config_command_lists_every_key(capsys):
    assert cli.main(["config", "jrd", "epochs=3"]) == 0
    printed = capsys.readouterr().out
    assert "epochs: 3" in printed and "emb_num_kernels: 3" in printed


def test_overrides_may_follow_a_config_file_that_names_its_recipe(tmp_path, capsys):
    """README's `kdml train --config FILE key=value`: argparse takes the first override for
    the recipe; with a config file that names one, it is an override."""
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("recipe: jrd\ndata:\n  batch_size: 32\n")
    assert cli.main(["config", "--config", str(config_file), "epochs=3",
                     "method.alpha=0.5"]) == 0
    printed = capsys.readouterr().out
    assert "epochs: 3" in printed and "alpha: 0.5" in printed and "batch_size: 32" in printed
    assert cli.main(["config", "--config", str(config_file)]) == 0
    assert "recipe: jrd" in capsys.readouterr().out
    config_file.write_text("data:\n  batch_size: 32\n")  # no recipe: line to take instead
    assert cli.main(["config", "--config", str(config_file), "epochs=3"]) == 2
    assert (f"{config_file} has no recipe: line, so the first argument must name the recipe: "
            f"'kdml config RECIPE --config {config_file} epochs=3'") in capsys.readouterr().err
    out = tmp_path / "run"
    config_file.write_text("recipe: amsoftmax\ndata:\n  dataset: digits\n")
    assert cli.main(["train", "--config", str(config_file), "train.epochs=1",
                     "train.steps_per_epoch=2", "eval.nmi=false", "--out", str(out),
                     "--no-progress"]) == 0
    assert "steps_per_epoch: 2" in (out / "config.yaml").read_text()


def test_error_messages_advise_only_flags_that_exist():
    """Every ``--flag`` quoted in the source's messages is an option of some command, or one
    of torchrun's that a message names as torchrun's."""
    options = set()
    parsers = [cli.build_parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            options.update(action.option_strings)
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                parsers.extend(action.choices.values())
    source = "\n".join(path.read_text() for path in
                       Path(cli.__file__).parents[1].rglob("*.py"))
    quoted = set(re.findall(r"(?<![\w-])(--[a-z][a-z_-]+)", source))
    torchrun = {"--nproc_per_node", "--nnodes"}  # a resumed run's batch remedy names them
    assert quoted - options - torchrun == set()


@pytest.mark.parametrize(("query_gallery", "part", "remedy"), [
    (False, "test", "test rows of at least 2 classes"),
    (True, "gallery", "mark gallery images (is_gallery=1 in a CSV) of at least 2 classes")])
def test_a_single_class_test_split_is_refused_before_training(tmp_path, capsys, query_gallery,
                                                               part, remedy):
    """It had trained, warned, and reported Recall@1 = MAP@R = 1 as the run's result. The
    remedy had then said to change data.train_classes, which a CSV's own split refuses."""
    from fixtures_array_sets import make_csv_list

    csv_file = make_csv_list(tmp_path, classes=2, per_class=6, query_gallery=query_gallery)
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", f"csv:{csv_file}",
                  "--out", tmp_path / "run", "data.batch_size=4", "train.epochs=1",
                  "eval.nmi=false", "eval.ks=[1]", "data.resize=32", "data.image_size=24",
                  "--no-progress")
    assert (f"every {part} sample of csv:list.csv/{part} has the same class, so Recall@K, "
            "MAP@R and R-Precision would be trivially 1") in err
    assert remedy in err and "data.train_classes" not in err
    assert not (tmp_path / "run").exists()


def test_a_path_of_the_wrong_kind_is_named_as_such(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "folder").mkdir()
    err = refused(tmp_path, capsys, "train", "--resume", tmp_path / "notes.txt")
    assert "is not a folder" in err
    err = refused(tmp_path, capsys, "train", "--config", tmp_path / "folder")
    assert "is not a file" in err
    assert "does not exist" in refused(tmp_path, capsys, "train", "--config",
                                       tmp_path / "nope.yaml")


def test_config_without_a_recipe_asks_for_the_recipe_only(tmp_path, capsys):
    err = refused(tmp_path, capsys, "config")
    assert "name a recipe, e.g. 'kdml config jrd' (or a --config file with a recipe: line)" \
        in err


@pytest.mark.parametrize("damage", ["cut short", "emptied", "cut after method:"])
def test_a_damaged_run_config_is_refused_not_completed_with_defaults(tmp_path, capsys,
                                                                     finished_run, damage):
    """A config.yaml cut before its last sections would load with their defaults (here:
    eval.nmi back to true); an empty one used to read as the recipe 'None'. One cut just after
    its last section's name (`method:`, null) was refused as an override: "'method' is a
    section, not a setting; set one of its keys, e.g. method.scale=VALUE"."""
    config = finished_run / "config.yaml"
    text = config.read_text()
    config.write_text(text[:text.index("\neval:")] + "\n" if damage == "cut short" else
                      text[:text.index("\nmethod:") + len("\nmethod:")] + "\n"
                      if damage == "cut after method:" else "")
    missing = {"cut short": "eval", "emptied": "recipe"}.get(damage, "method")
    for command in (["eval", finished_run], ["train", "--resume", finished_run]):
        err = refused(tmp_path, capsys, *command)
        assert err == (f"kdml: error: {config} has no '{missing}': it is not the whole config "
                       "kdml wrote for this run (cut short, emptied or replaced); restore it, "
                       "or train the run again into a new folder")


def test_a_folder_with_the_users_own_config_yaml_is_not_called_a_run(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("recipe: jrd\n")
    (out / "notes.txt").write_text("my notes\n")
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out", out,
                  *TINY)
    assert "is a folder with other files in it" in err and "--resume" not in err


def test_eval_of_a_run_folder_it_cannot_write_still_prints_its_metrics(finished_run, capsys,
                                                                     monkeypatch):
    """An archived or read-only run: the metrics are shown though eval.json cannot be written,
    and the error names eval.json, not the hidden partial file it was written through."""
    import kdml.file_write

    real_open = os.open

    def refuse_partials(path, *args, **kwargs):
        if Path(path).name.startswith(".eval."):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(kdml.file_write.os, "open", refuse_partials)
    (finished_run / "eval.json").unlink(missing_ok=True)
    capsys.readouterr()
    assert cli.main(["eval", str(finished_run)]) == 2
    captured = capsys.readouterr()
    assert "Test metrics (amsoftmax, digits):" in captured.out and "recall@1" in captured.out
    assert captured.err.strip() == (f"kdml: error: {finished_run / 'eval.json'}: Permission "
                                    "denied; check its permissions")
    assert not any(path.name.startswith(".eval.") for path in finished_run.iterdir())


def test_eval_piped_into_head_writes_eval_json_before_its_table(finished_run):
    """`kdml eval RUN | head -2`: the process is ended by SIGPIPE at the table's first line
    past head's, and eval.json, written after the table, had been lost with minutes of
    scoring; it is written first now."""
    (finished_run / "eval.json").unlink(missing_ok=True)
    done = subprocess.run(f"{shlex.quote(sys.executable)} -m kdml eval "
                          f"{shlex.quote(str(finished_run))} | head -2", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == ["last checkpoint: epoch 1",
                                        done.stdout.splitlines()[1]], done.stderr
    recorded = json.loads((finished_run / "eval.json").read_text())
    assert recorded["epoch"] == 1 and "recall@1" in recorded["metrics"]


@pytest.mark.parametrize(("command", "folder"), [(["plot", "embedding"], "plots"),
                                                 (["plot", "retrieval"], "plots"),
                                                 (["analyze", "generalization"], "")])
def test_a_picture_or_analysis_of_a_run_folder_it_cannot_write_is_refused_before_the_work(
        finished_run, capsys, monkeypatch, command, folder):
    """These write their only output into the run folder: unwritable, they had embedded the
    test part (and run t-SNE, minutes on a large one) before failing to save the result."""
    import kdml.file_write
    from kdml.inspection import analysis, plots

    real_temporary_file = kdml.file_write.tempfile.TemporaryFile

    def read_only_run(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve().is_relative_to(finished_run.resolve()):
            raise PermissionError(13, "Permission denied")
        return real_temporary_file(*args, dir=dir, **kwargs)

    def no_work(*args, **kwargs):
        raise AssertionError("the work started before the refusal")

    monkeypatch.setattr(kdml.file_write.tempfile, "TemporaryFile", read_only_run)
    for module in (plots, analysis):
        monkeypatch.setattr(module, "embed_dataset", no_work)
    capsys.readouterr()
    assert cli.main([*command, str(finished_run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kdml: error: cannot write into {finished_run / folder}".rstrip("/")
                          + " (Permission denied); "), err
    assert err.endswith("make the run folder writable" if command[0] == "analyze" else
                        "move what is in the way, or make the folder writable"), err


def test_a_kill_stops_the_inspection_commands_as_ctrl_c_does(monkeypatch, capsys):
    """SIGTERM raises KeyboardInterrupt (Terminated) in embed, index, search, eval and the
    plots, so what they write through a hidden partial is removed (training too: see
    test_trainer's SIGTERM test); it ends with the shell's code for SIGTERM, 143, not Ctrl-C's
    130."""
    import signal

    handlers = {number: signal.getsignal(number)
                for number in (signal.SIGTERM, signal.SIGPIPE, signal.SIGINT)}
    seen = []

    def killed_while_running(args):
        seen.append(signal.getsignal(signal.SIGTERM))
        # checked first: under the default handler the signal would end the test process
        assert seen[0] is cli._interrupt
        signal.raise_signal(signal.SIGTERM)

    try:
        monkeypatch.setattr(sys, "argv", ["kdml", "recipes"])
        with monkeypatch.context() as patched:
            patched.setitem(cli._COMMANDS, "recipes", killed_while_running)
            assert cli.main() == 143
        assert seen == [cli._interrupt]
        # the command done, a kill ends the process by the signal (one that arrived while
        # the interpreter exited had raised Terminated in an atexit callback: a traceback)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        gc.unfreeze()  # the console command's exit froze this process's objects
    monkeypatch.setitem(cli._COMMANDS, "recipes",
                        lambda args: cli._interrupt(signal.SIGTERM, None))
    capsys.readouterr()
    assert cli.main(["recipes"]) == 143  # the shell's code for SIGTERM
    assert capsys.readouterr().err == "kdml: terminated\n"


def test_a_kill_that_reaches_a_forked_loader_worker_early_ends_it_quietly(monkeypatch):
    """A worker forked by the data loader inherits kdml's SIGTERM handler until torch sets its
    own: a kill of the process group in that window raised Terminated in the worker, which
    unwound the parent's code it was forked from and printed a traceback over the stop. In a
    forked process the handler now ends it by SIGTERM, as torch's own handler does."""
    import os
    import signal

    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        monkeypatch.setattr(sys, "argv", ["kdml", "recipes"])
        assert cli.main() == 0
        signal.signal(signal.SIGTERM, cli._interrupt)  # as during a command (main put it back)
        child = os.fork()
        if child == 0:  # the worker: dies by the signal, or says how it went on
            try:
                signal.raise_signal(signal.SIGTERM)
            except BaseException:
                os._exit(3)
            os._exit(4)
        _, status = os.waitpid(child, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
        with pytest.raises(cli.Terminated):  # the process that installed it: as before
            signal.raise_signal(signal.SIGTERM)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        gc.unfreeze()


def test_the_console_command_alone_leaves_its_objects_to_the_system_at_exit(monkeypatch):
    """The garbage collection that ends the interpreter went through every object of torch's
    (0.6 s or more of each command's exit): the console command freezes them as it returns.
    Called with arguments (a program's or a test's own call) main leaves the collector be."""
    import signal

    assert gc.get_freeze_count() == 0
    assert cli.main(["recipes"]) == 0
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(sys, "argv", ["kdml", "recipes"])
    handlers = {number: signal.getsignal(number)
                for number in (signal.SIGTERM, signal.SIGPIPE, signal.SIGINT)}
    try:
        assert cli.main() == 0
        assert gc.get_freeze_count() > 0
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        gc.unfreeze()


def test_a_full_disk_names_the_file_asked_for_and_leaves_no_partial(tmp_path):
    """ENOSPC from a write names no file: the error names the file asked for (the CLI prints
    one line about it instead of a traceback), and the hidden partial is gone."""
    from kdml.file_write import write_through_new_file

    def full_disk(partial: Path) -> None:
        partial.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as caught:
        write_through_new_file(tmp_path / "eval.json", full_disk)
    assert caught.value.errno == 28 and caught.value.filename == str(tmp_path / "eval.json")
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_file_system_names_the_file_asked_for(tmp_path, monkeypatch):
    """A read-only file system refuses the hidden file's creation, and then its removal too
    (EROFS, even of no file): that second error had replaced the first, so kdml eval on a run
    folder on a read-only disk said ".eval.1681.730b21ca.json: Read-only file system"."""
    import kdml.file_write
    from kdml.file_write import write_through_new_file

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(kdml.file_write.os, "open", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(OSError) as caught:
        write_through_new_file(tmp_path / "eval.json", lambda partial: partial.write_text("{}"))
    assert caught.value.errno == errno.EROFS
    assert caught.value.filename == str(tmp_path / "eval.json")


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_new_file_never_replaces_one_that_appears_while_it_is_written(tmp_path, monkeypatch,
                                                                       hard_links):
    """kdml embed --out checks that its .npz is new, then writes for as long as it takes; a
    rename would have replaced a file made there meanwhile. Also where the file system has no
    hard links (EPERM), the way it places a new file."""
    import kdml.file_write
    from kdml.file_write import write_through_new_file

    target = tmp_path / "embeddings.npz"

    def someone_else_writes_there(partial: Path) -> None:
        partial.write_text("kdml's")
        target.write_text("theirs")

    if not hard_links:
        def no_links(source: object, destination: object) -> None:
            raise PermissionError(1, "Operation not permitted")
        monkeypatch.setattr(kdml.file_write.os, "link", no_links)
    with pytest.raises(FileExistsError) as caught:
        write_through_new_file(target, someone_else_writes_there, replace=False)
    assert caught.value.filename == str(target)
    assert target.read_text() == "theirs" and list(tmp_path.iterdir()) == [target]
    target.unlink()
    write_through_new_file(target, lambda partial: partial.write_text("kdml's"), replace=False)
    assert target.read_text() == "kdml's" and list(tmp_path.iterdir()) == [target]


def _train_log_on_a_full_disk(monkeypatch) -> None:
    """Open every train.log on /dev/full, whose writes fail with ENOSPC: a full disk met by
    the append that needs a new block."""
    import logging

    real_open = logging.FileHandler._open

    def full(handler):
        if Path(handler.baseFilename).name != "train.log":
            return real_open(handler)
        return open("/dev/full", "a", encoding=handler.encoding)  # noqa: SIM115

    monkeypatch.setattr(logging.FileHandler, "_open", full)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_train_log_on_a_full_disk_is_one_warning_and_the_run_goes_on(tmp_path, capsys,
                                                                       monkeypatch):
    """A full disk refusing train.log's lines had printed logging's "--- Logging error ---"
    and a traceback for each line, and the handler's close raised the ENOSPC again (naming no
    file) at the end of a finished run: exit 2, "the output could not be written"."""
    _train_log_on_a_full_disk(monkeypatch)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "--no-progress", "train.steps_per_epoch=1"]) == 0
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
    assert err.count("kdml: warning: ") == 1
    assert (f"kdml: warning: {out / 'train.log'} cannot be written (No space left on device)"
            in err)
    assert json.loads((out / "metrics.json").read_text())["final"] is not None


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_names_the_file_that_stopped_the_run_not_train_log(tmp_path, capsys,
                                                                       monkeypatch):
    """The same full disk stopping the run at metrics.json: train.log's close had raised its
    own ENOSPC over it, and the CLI said "the output could not be written" with no file."""
    from kdml.training import run_folder

    _train_log_on_a_full_disk(monkeypatch)
    real_write = run_folder.write_through_new_file

    def full_disk(path, write, replace=True):
        if path.name == "metrics.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_write(path, write, replace)

    monkeypatch.setattr(run_folder, "write_through_new_file", full_disk)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "--no-progress", "train.steps_per_epoch=1"]) == 2
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"kdml: error: {out / 'metrics.json'}: No space left on device; free space on its "
        "disk and run the command again (a stopped run continues with kdml train --resume)")


def test_a_full_disk_while_a_checkpoint_is_written_is_one_line_and_resumes(tmp_path, capsys,
                                                                         monkeypatch):
    """torch's writer wraps a full disk's OSError in "RuntimeError: [enforce fail at
    inline_container.cc:672] . unexpected pos 88768 vs 88664", whose traceback buried the
    cause: the error names the checkpoint and the disk, in one line, in train.log too."""
    from kdml.training import checkpoint

    real_save = torch.save

    def full_disk(state, file):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:  # raised as torch's writer raises it: the OSError its context only
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "  # noqa: B904
                               "88768 vs 88664")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "--no-progress", "train.epochs=1", "train.steps_per_epoch=1"]) == 2
    unscored = out / "checkpoints" / "unscored.pt"
    assert capsys.readouterr().err == (
        f"kdml: error: {unscored}: No space left on device; free space on its disk and run the "
        "command again (a stopped run continues with kdml train --resume)\n")
    assert f"stopped: {unscored}: No space left on device" in (out / "train.log").read_text()
    assert not [path for path in out.rglob("*.tmp")]  # no partial checkpoint left behind
    monkeypatch.setattr(checkpoint.torch, "save", real_save)  # space freed
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0


@pytest.mark.parametrize("write", [1, 2, 3])
def test_a_stop_while_a_checkpoint_is_written_is_that_stop(tmp_path, monkeypatch, write):
    """A Ctrl-C or kill inside torch's writer made it raise "RuntimeError: [enforce fail at
    inline_container.cc:672] . unexpected pos 64 vs 0" over the stop: a traceback, exit 1.
    The stop itself is raised, and no partial file stays."""
    from kdml.errors import Terminated
    from kdml.training import checkpoint

    real_fdopen = os.fdopen

    class StopsAtAWrite:  # the checkpoint's file, whose write number `write` is stopped
        def __init__(self, handle):
            self.handle, self.writes = handle, 0

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def write(self, data):
            self.writes += 1
            if self.writes == write:
                raise Terminated
            return self.handle.write(data)

    monkeypatch.setattr(checkpoint.os, "fdopen",
                        lambda fd, mode: StopsAtAWrite(real_fdopen(fd, mode)))
    with pytest.raises(Terminated):
        checkpoint.save_checkpoint({"weights": torch.randn(1000, 100)}, tmp_path / "last.pt")
    assert list(tmp_path.iterdir()) == []


def test_a_run_evaluated_on_data_with_other_classes_says_what_changed(tmp_path, capsys):
    """Classes added to a run's data after training: the checkpoint's proxies no longer fit
    the model built for the data. This had read "checkpoint ... does not match the run's
    config", which sent the user to the checkpoint, not the data."""
    from fixtures_photo_sets import make_cub

    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "cub", "--data-root",
                     str(make_cub(tmp_path / "cub6", classes=6)), "--out", str(out),
                     *TINY, "model.backbone=cnn", "eval.ks=[1]", "data.batch_size=6",
                     "data.samples_per_class=2", "train.steps_per_epoch=1",
                     # small images: the refusal is about the classes, not the pixels
                     "data.resize=32", "data.image_size=24"]) == 0
    (out / "data.json").unlink()  # as a run made before kdml wrote one (else data.json says it)
    err = refused(tmp_path, capsys, "eval", out, "--data-root",
                  make_cub(tmp_path / "cub10", classes=10))
    assert err.startswith(f"kdml: error: checkpoint {out / 'checkpoints' / 'last.pt'} does not "
                          "match the model built from the run's config and its data as they "
                          "are now (5 training classes): "), err
    assert "(3, " in err or ", 3)" in err  # the checkpoint's 3 classes, named in a shape
    assert err.rstrip().endswith("point --data-root at the data the run trained on")


def test_recall_at_more_than_the_references_names_the_ks_to_give(tmp_path, capsys):
    """The hint had said "lower eval.ks" without the form it takes; eval.ks=1,2,4 then failed
    a type check."""
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out",
                  tmp_path / "run", *TINY, "eval.ks=[1,2,4000]")
    assert err.endswith("references; lower eval.ks, e.g. 'eval.ks=[1, 2]'"), err


def test_a_held_out_share_too_small_to_retrieve_names_holdout_fraction(tmp_path, capsys):
    """A seen-holdout split whose classes each hold out one test sample has nothing to
    retrieve: the refusal said "use a split with at least two test samples per class", not
    which setting makes them."""
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out",
                  tmp_path / "run", "data.split=seen-holdout", "data.holdout_fraction=0.001",
                  *TINY)
    assert err.endswith("so Recall@K is undefined; raise data.holdout_fraction, the share of "
                        "each class held out for testing"), err


def _array_splits(train, test, gallery=None, **fields):
    from kdml.data.dataset import ArrayDataset
    from kdml.data.splits import DataSplits

    def part(name, labels):
        return ArrayDataset(name, name, torch.zeros(len(labels), 2), torch.tensor(labels))

    return DataSplits(part("train", train), part("test", test), sorted(set(train)),
                      gallery=None if gallery is None else part("gallery", gallery), **fields)


def test_a_test_part_is_scorable_with_one_query_that_has_a_reference():
    """A class with two test samples (or a query whose class the gallery holds) is enough to
    score; refused only where no query has one."""
    from kdml.errors import KdmlError
    from kdml.training.checks import check_test_classes

    check_test_classes(_array_splits([0, 0, 1, 1], [2, 2, 3, 4]))
    check_test_classes(_array_splits([0, 0, 1, 1], [2, 3, 5], gallery=[2, 3, 4]))
    with pytest.raises(KdmlError, match="^no test query of test has another sample"):
        check_test_classes(_array_splits([0, 0, 1, 1], [2, 3, 4]))
    with pytest.raises(KdmlError, match="^no test query of test has a sample of its class in "
                       "the gallery"):
        check_test_classes(_array_splits([0, 0, 1, 1], [5, 6], [2, 3]))


@pytest.mark.parametrize("evaluating", [False, True])
def test_queries_without_their_classes_in_the_gallery_are_told_to_mark_gallery_images(
        evaluating):
    """Queries of classes 5 and 6 over a gallery of 2 and 3, each class of many samples: the
    refusal said "use a split with at least two test samples per class" (kdml eval: "give
    --dataset a dataset of more classes, each with two samples or more"), which every class
    already met; what the split lacks is gallery images of the queries' classes."""
    from kdml.errors import KdmlError
    from kdml.training.checks import check_test_classes

    splits = _array_splits([0, 0, 1, 1], [5, 5, 6, 6], gallery=[2, 2, 3, 3])
    with pytest.raises(KdmlError) as refusal:
        check_test_classes(splits, evaluating)
    assert str(refusal.value) == (
        "no test query of test has a sample of its class in the gallery (gallery) to "
        "retrieve, so Recall@K is undefined; the dataset's own split chose the queries and the "
        "gallery: mark gallery images (is_gallery=1 in a CSV) of the queries' classes")


def test_kdml_eval_s_ks_are_not_held_to_the_run_s_select_metric():
    """kdml eval --ks 1 2 of a run that kept its best epoch by recall@4 scores what it is
    asked: the select metric is checked where training chooses by it, not where eval scores."""
    from kdml.config import RunConfig
    from kdml.errors import KdmlError
    from kdml.training.checks import check_evaluation

    config = RunConfig(recipe="jrd", method=None)
    config.train.keep_best = True
    config.train.select_metric = "recall@4"
    config.eval.ks = [1, 2]
    splits = _array_splits([0, 0, 1, 1], [2, 2, 3, 3])
    check_evaluation(config, splits, evaluating=True)
    with pytest.raises(KdmlError, match="^train.select_metric='recall@4' is not scored"):
        check_evaluation(config, splits)


def test_a_single_training_class_or_a_small_validation_part_is_warned_about(caplog):
    """A single training class, and a validation part (not a test part) of fewer than 5
    classes, are warned about; a test part of few classes is not."""
    import logging

    from kdml.training.checks import warn_about_splits

    log = logging.getLogger("kdml.test")
    with caplog.at_level("WARNING", logger="kdml.test"):
        warn_about_splits(_array_splits([0, 0, 1, 1], [2, 2, 3, 3]), log)
        assert caplog.records == []
        warn_about_splits(_array_splits([0, 0], [2, 2, 3, 3]), log)
        warn_about_splits(_array_splits([0, 0, 1, 1], [2, 2, 3, 3], validation=True), log)
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2
    assert said[0].startswith("the training split of train has a single class")
    assert said[1].startswith("the validation part holds 2 classes, too few")


def test_a_validation_part_too_small_to_retrieve_names_data_validation(tmp_path, capsys):
    """A validation part is carved from the training part by data.validation: the refusal
    had said to raise data.holdout_fraction, which does not change it (and which kdml refuses
    beside a dataset's own split)."""
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out",
                  tmp_path / "run", "data.split=seen-holdout", "data.validation=0.001", *TINY)
    assert err.endswith("so Recall@K is undefined; raise data.validation, the share of each "
                        "training class held out for validation, or give each class more "
                        "samples"), err


def test_a_test_part_that_cannot_be_scored_is_refused_before_its_eval_ks(tmp_path, capsys):
    """A test part of one class, or with nothing to retrieve, was refused for its eval.ks
    first (too few references); lowering eval.ks then only led to the refusal of the data."""
    from fixtures_array_sets import make_csv_list

    csv_file = make_csv_list(tmp_path, classes=2, per_class=6)  # 5 references per query
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", f"csv:{csv_file}",
                  "--out", tmp_path / "run", *TINY, "eval.ks=[1,2,4,8]", "data.resize=32",
                  "data.image_size=24")
    assert "every test sample of " in err and "has the same class" in err, err
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", "digits", "--out",
                  tmp_path / "run", "data.split=seen-holdout", "data.holdout_fraction=0.001",
                  *TINY, "eval.ks=[1,2,4,16]")  # 10 test samples: 9 references per query
    assert err.endswith("so Recall@K is undefined; raise data.holdout_fraction, the share of "
                        "each class held out for testing"), err


def test_a_pca_dimension_too_large_names_data_pca_dim(tmp_path, capsys):
    """It said "PCA dim must be an integer from 1 to 64", the words of the library function."""
    err = refused(tmp_path, capsys, "train", "dtml", "--dataset", "digits->mnist5k", "--out",
                  tmp_path / "run", *TINY, "data.pca_dim=100")
    assert err == ("kdml: error: data.pca_dim=100 exceeds 64, the smaller of the source's "
                   "samples and features in digits->mnist5k; lower it")


def test_a_removed_checkpoint_is_not_said_never_to_have_been_trained(capsys, finished_run):
    """A run whose last.pt was removed after epoch 1 was said to have never finished one."""
    run = finished_run  # a copy of the module's one-epoch run, trained as TINY says (one step)
    (run / "checkpoints" / "last.pt").unlink()
    # finished: its scores are there (as in records kept without checkpoints, results/)
    err = refused(run.parent, capsys, "eval", run)
    assert err == (f"kdml: error: no checkpoint at {run / 'checkpoints' / 'last.pt'}: the run "
                   "finished (its scores are in metrics.json) but its checkpoint was removed; "
                   f"'kdml train --resume {run}' trains it again from epoch 1")
    # not finished: as a run stopped in its second epoch, whose first checkpoint was removed
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**metrics, "final": None}))
    err = refused(run.parent, capsys, "eval", run)
    assert err == (f"kdml: error: no checkpoint at {run / 'checkpoints' / 'last.pt'}: the run "
                   "has not finished an epoch (or the file was removed); train it with "
                   f"'kdml train --resume {run}'")
    # what the first line says: resumed, the finished run trains again from its first epoch
    (run / "metrics.json").write_text(json.dumps(metrics))
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert (run / "checkpoints" / "last.pt").is_file()
    starts = [line for line in (run / "train.log").read_text().splitlines()
              if " start epoch " in line]
    assert len(starts) == 2 and " start epoch 1 of 1," in starts[1]


@pytest.mark.parametrize("args", [["eval", ""], ["plot", "retrieval", ""],
                                  ["reproduce", "dtml", "--quick", "--runs", ""]])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(tmp_path, capsys, args):
    """`kdml eval ""` had read the current folder as the run, and `--runs ""` put the runs
    there."""
    err = refused(tmp_path, capsys, *args)
    assert "expected a path, got an empty one" in err


def test_a_config_path_given_with_a_tilde_is_expanded(tmp_path, capsys, monkeypatch):
    """--config=~/x.yaml reaches kdml unexpanded (the shell expands ~ only at a word's
    start), as the other path options did already."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "mine.yaml").write_text("train:\n  epochs: 7\n")
    capsys.readouterr()
    assert cli.main(["config", "amsoftmax", "--config=~/mine.yaml"]) == 0
    assert "epochs: 7" in capsys.readouterr().out


def test_a_missing_dependency_is_one_line_naming_what_to_install(monkeypatch, capsys):
    """A declared dependency missing from the environment (a partial install) stops a command
    in one line naming the package to install, not a ModuleNotFoundError traceback; a missing
    module that is not one of kdml's dependencies is a bug and keeps its traceback."""
    def needs(name: str):
        def command(args):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return command

    monkeypatch.setitem(cli._COMMANDS, "recipes", needs("faiss"))
    assert cli.main(["recipes"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: the Python package faiss-cpu (import name faiss), "
                          "which kdml recipes needs, is not installed here")
    assert "pip install -c constraints.txt -e ." in err and err.count("\n") == 1
    monkeypatch.setitem(cli._COMMANDS, "recipes", needs("sklearn.neighbors"))
    assert cli.main(["recipes"]) == 2
    assert "scikit-learn (import name sklearn)" in capsys.readouterr().err
    monkeypatch.setitem(cli._COMMANDS, "recipes", needs("kdml_no_such_module"))
    with pytest.raises(ModuleNotFoundError):
        cli.main(["recipes"])


def test_the_missing_dependency_names_cover_pyproject_dependencies():
    """Every dependency pyproject.toml declares has its import name in cli.DEPENDENCIES, so
    that its absence gets the one-line error (a new dependency must be added there too), and
    each import name is one that its installed distribution provides."""
    from importlib.metadata import packages_distributions

    tomllib = pytest.importorskip("tomllib", reason="tomllib came with Python 3.11")
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ \[;]", item, maxsplit=1)[0].lower() for item in declared}
    assert set(cli.DEPENDENCIES.values()) == names
    provided = packages_distributions()
    for module, package in cli.DEPENDENCIES.items():
        assert package in {name.lower() for name in provided[module]}, module


def _main_in_a_new_python(setup: str, argv: list[str]):
    """``kdml.cli.main(argv)`` in a Python of its own, after the statement ``setup`` (a module
    made unimportable, a resource limit): neither may reach this test process."""
    import subprocess

    script = f"import sys\n{setup}\nfrom kdml.cli import main\nsys.exit(main({argv!r}))"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)


def test_training_without_faiss_stops_before_its_run_folder(tmp_path):
    """The real import path: with faiss unimportable, kdml train stops in one line, exit 2,
    and leaves no run folder behind."""
    done = _main_in_a_new_python("sys.modules['faiss'] = None",
                                 ["train", "jrd", "--out", str(tmp_path / "run"), "epochs=1",
                                  "--no-progress"])
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("kdml: error: the Python package faiss-cpu")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def test_an_index_that_outgrows_the_disk_is_one_line_and_leaves_nothing(tmp_path,
                                                                         one_step_run):
    """faiss's own file writer raised a full disk (here a file size limit, RLIMIT_FSIZE:
    EFBIG, as ENOSPC) as "RuntimeError: Error in void faiss::write_index(...): write error in
    .../index.faiss", a traceback and exit 1; it is one line naming --out, exit 2."""
    before = snapshot(one_step_run)
    index = tmp_path / "index"
    done = _main_in_a_new_python(
        "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))",
        ["index", str(one_step_run), "--out", str(index), "--no-progress"])
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"kdml: error: {index}: File too large; fix it or choose another path\n"
    assert list(tmp_path.iterdir()) == []  # no partial folder
    assert snapshot(one_step_run) == before  # the module's run, read only


def _fails_to_allocate(error: BaseException):
    def command(args):
        raise error
    return command


def _cpu_allocation_error() -> RuntimeError:
    """torch's own error for an allocation the CPU cannot give (8 PiB)."""
    try:
        torch.empty(2**50, dtype=torch.uint8)
    except RuntimeError as error:
        return error
    pytest.skip("this machine allocated 1 PiB")  # an overcommitting kernel might


@pytest.mark.parametrize(("make_error", "size"), [
    (_cpu_allocation_error, " (tried to allocate 1,048,576.0 GiB)"),
    (lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
                                    "a total capacity of 79.10 GiB of which 1.12 GiB is free."),
     " (tried to allocate 2.00 GiB)"),
    (lambda: MemoryError("Unable to allocate 8.00 PiB for an array with shape (2**50,)"),
     " (tried to allocate 8.00 PiB)"),
    (lambda: RuntimeError("Caught RuntimeError in DataLoader worker process 0.\nOriginal "
                          "Traceback (most recent call last):\n  ...\nRuntimeError: "
                          "DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                          "3221225472 bytes. Error code 12"), " (tried to allocate 3.0 GiB)"),
    (MemoryError, ""),
])
def test_running_out_of_memory_is_one_line_with_the_size_and_what_lowers_it(
        monkeypatch, capsys, make_error, size):
    """A failed allocation, torch's on the CPU or a GPU (also met in a loader worker) or
    NumPy's, stops a command in one line giving the size and what to lower, not torch's
    traceback with its allocator's source line or its GPU memory summary."""
    monkeypatch.setitem(cli._COMMANDS, "recipes", _fails_to_allocate(make_error()))
    assert cli.main(["recipes"]) == 1
    assert capsys.readouterr().err == (f"kdml: error: out of memory{size}; free memory or use "
                                       "a device with more, and run it again\n")


def test_training_out_of_memory_names_the_settings_that_lower_it(monkeypatch, capsys):
    monkeypatch.setitem(cli._COMMANDS, "train", _fails_to_allocate(_cpu_allocation_error()))
    assert cli.main(["train", "amsoftmax"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: out of memory (tried to allocate 1,048,576.0 GiB); "
                          "lower data.batch_size or eval.embed_batch_size (or data.resize for "
                          "image files) and run it again (a stopped run continues with kdml "
                          "train --resume)")
    assert err.count("\n") == 1


def test_other_runtime_errors_keep_their_traceback(monkeypatch):
    """Only allocation failures become the one line: any other RuntimeError is a bug."""
    monkeypatch.setitem(cli._COMMANDS, "recipes",
                        _fails_to_allocate(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        cli.main(["recipes"])


def test_a_run_out_of_memory_in_its_second_epoch_keeps_its_first_and_resumes(
        tmp_path, capsys, monkeypatch):
    """The one line is all the console shows; train.log keeps the traceback (where it ran out
    matters for choosing what to lower), and --resume continues from epoch 1's checkpoint."""
    out = tmp_path / "run"
    real = trainer.train_one_epoch
    epochs = []

    def second_runs_out(*args, **kwargs):
        epochs.append(1)
        if len(epochs) == 2:
            torch.empty(2**50, dtype=torch.uint8)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_one_epoch", second_runs_out)
    # one step per epoch: what is checked is which epoch ran out, not how long it trained
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     *TINY[1:], "train.epochs=2", "train.steps_per_epoch=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: out of memory (tried to allocate 1,048,576.0 GiB)")
    log = (out / "train.log").read_text()
    assert "stopped: an error" in log and "can't allocate memory" in log
    monkeypatch.setattr(trainer, "train_one_epoch", real)
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert "recall@1" in capsys.readouterr().out
    assert len((out / "metrics.csv").read_text().splitlines()) == 3  # header, epochs 1 and 2


def _killed_worker_error() -> RuntimeError:
    """torch's own error for a loader worker killed by SIGKILL (as by the OOM killer)."""
    import signal

    from torch.utils.data import DataLoader, Dataset

    class KilledOnRead(Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int):
            os.kill(os.getpid(), signal.SIGKILL)

    from torch.utils.data._utils import signal_handling

    # torch installs its SIGCHLD handler (which adds "is killed by signal: Killed") once per
    # process; a test before this one that stopped a command by SIGTERM (cli._interrupt) put
    # a handler of its own over it, and the error then read "exited unexpectedly" alone
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(signal_handling, "_SIGCHLD_handler_set", False)
    previous = signal.getsignal(signal.SIGCHLD)
    try:
        next(iter(DataLoader(KilledOnRead(), num_workers=1)))
    except RuntimeError as error:
        return error
    finally:
        signal.signal(signal.SIGCHLD, previous)
        monkeypatch.undo()
    raise AssertionError("the worker was not killed")


@pytest.mark.parametrize(("command", "advice"), [
    ("train", "lower data.num_workers or data.batch_size (or data.resize for image files) and "
              "run it again (a stopped run continues with kdml train --resume)"),
    ("recipes", "free memory or use a device with more, and run it again"),
])
def test_a_loader_worker_killed_by_sigkill_is_one_line_about_memory(monkeypatch, capsys,
                                                                    command, advice):
    """The kernel's OOM killer ending a loader worker had stopped the command with torch's
    "exited unexpectedly" traceback; any other RuntimeError keeps its traceback (above)."""
    monkeypatch.setitem(cli._COMMANDS, command, _fails_to_allocate(_killed_worker_error()))
    assert cli.main([command, *(["amsoftmax"] if command == "train" else [])]) == 1
    assert capsys.readouterr().err == ("kdml: error: a data loader worker was killed (SIGKILL), "
                                       f"most likely by the system for lack of memory; {advice}\n")


@pytest.mark.parametrize("name", ["phötos", "a\\b", "#2 'x'"])
def test_a_flag_s_path_reaches_the_config_as_written(tmp_path, capsys, name):
    """--dataset, --data-root, --weights and --device were passed on as JSON strings, which a
    text setting no longer reads as YAML: folder:phötos searched ph\\u00f6tos, and a backslash
    came through doubled."""
    folder = tmp_path / name
    folder.mkdir()
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", f"folder:{folder}",
                  "--out", tmp_path / "run", *TINY)
    assert f"no class sub-folders (searched {folder};" in err


def test_a_pca_source_too_small_for_method_pca_dim_is_refused_before_the_folder(tmp_path,
                                                                               capsys):
    """PCAMethod.fit's refusal (fewer source samples than method.pca_dim < d) had come after
    the run folder was made (config.yaml, data.json, train.log, a lock): the trainer knows
    the source's size before it, as it knows the d x d matrices' memory (check_fit)."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "small.npz", X=rng.standard_normal((16, 16)).astype(np.float32),
             y=np.array([0, 0, 0, 1, 1, 1] + [0, 1] * 5),
             domain=np.array(["source"] * 6 + ["target"] * 10))
    err = refused(tmp_path, capsys, "train", "pca", "--dataset", f"npz:{tmp_path}/small.npz",
                  "--out", tmp_path / "run", "method.pca_dim=10", "train.device=cpu",
                  "--no-progress")
    assert err == ("kdml: error: PCA to 10 of 16 dimensions needs at least 10 source samples, "
                   "got 6; lower method.pca_dim to at most 6, or set it to 0 (all 16: the "
                   "plain Euclidean distance)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("recipe", "overrides"), [
    ("simclr", []),  # its default split, seen-holdout, had been called the user's to drop
    ("msimclr", ["data.split=standard"]),  # then the first step: "augment images [B, C, H, W]"
])
def test_the_simclr_recipes_on_a_domain_pair_are_refused_as_such(tmp_path, capsys, recipe,
                                                                  overrides):
    """`kdml train simclr --dataset mnist5k->digits` said "data.split does not apply to a
    domain pair ...; drop it" of a split the user never set (the recipe's default); with it
    set to the pair's, the run failed later: a pair holds feature vectors, which the SimCLR
    recipes cannot augment. The refusal says so, and what trains a pair."""
    err = refused(tmp_path, capsys, "train", recipe, "--dataset", "mnist5k->digits", "--out",
                  tmp_path / "run", "train.device=cpu", "--no-progress", *overrides)
    assert err == (f"kdml: error: {recipe} augments images into two views, and a domain pair "
                   "(mnist5k->digits) holds feature vectors, so it cannot train on one; train "
                   "it on an image dataset, or train dtml or dstml on the pair (or a recipe "
                   "without charts with domain.beta, e.g. jrd)")
    assert not (tmp_path / "run").exists()


def test_a_simclr_recipe_on_feature_vectors_is_refused_before_the_folder(tmp_path, capsys):
    """With an MLP backbone, SimCLR on a dataset of vectors had made the run folder and then
    stopped at its first step ("the SimCLR recipes augment images [B, C, H, W]")."""
    err = refused(tmp_path, capsys, "train", "simclr", "--dataset", "mnist1d", "--out",
                  tmp_path / "run", "train.device=cpu", "--no-progress", "model.backbone=mlp",
                  "model.small_input=false")
    assert err == ("kdml: error: simclr augments images [C, H, W]; mnist1d/train has inputs of "
                   "shape (40,): train it on an image dataset")
    assert not (tmp_path / "run").exists()


def test_simclr_views_of_another_size_than_an_mlp_takes_are_refused(tmp_path, capsys):
    """The 32-pixel crops (method.crop_size's default) of 8x8 digits went into an MLP built
    for 64 inputs: torch's raw "mat1 and mat2 shapes cannot be multiplied (128x1024 and
    64x256)" at the first step, after the run folder was made."""
    err = refused(tmp_path, capsys, "train", "msimclr", "--dataset", "digits", "--out",
                  tmp_path / "run", "train.device=cpu", "--no-progress", "model.backbone=mlp",
                  "model.small_input=false")
    assert err == ("kdml: error: model.backbone=mlp takes inputs of 8x8 pixels, its dataset's, "
                   "and method.crop_size=32 crops the views to 32x32; set method.crop_size=0 "
                   "(views of the input's size)")
    assert not (tmp_path / "run").exists()


def test_simclr_views_too_small_for_the_backbone_are_refused(tmp_path, capsys):
    """method.crop_size=1 cropped the views of 8x8 digits to 1x1, which the small CNN's
    max-pool shrinks to nothing: torch's traceback ("Output size is too small") at the first
    step, exit status 1, after the run folder was made."""
    err = refused(tmp_path, capsys, "train", "msimclr", "--dataset", "digits", "--out",
                  tmp_path / "run", "train.device=cpu", "--no-progress", "model.backbone=cnn",
                  "model.small_input=false", "method.crop_size=1")
    assert err.startswith("kdml: error: method.crop_size=1 crops the views to 1x1, which "
                          "model.backbone=cnn cannot take (")
    assert err.endswith("); raise method.crop_size, or set it to 0 (views of the input's "
                        "size, 8x8)")
    assert "\n" not in err
    assert not (tmp_path / "run").exists()


def test_a_one_dimensional_embedding_scored_by_cosine_is_refused(tmp_path, capsys):
    """model.embedding_size=1 trained two epochs, then every test embedding, scaled to unit
    length, was -1 or +1: "the test embeddings have collapsed: 100.0% of them lie at one
    point ... Train it again with lower learning rates", a cause the setting was not."""
    err = refused(tmp_path, capsys, "train", "jrd", "--dataset", "digits", "--out",
                  tmp_path / "run", "train.device=cpu", "--no-progress",
                  "model.embedding_size=1")
    assert err == ("kdml: error: model.embedding_size=1 with eval.metric=cosine scores each "
                   "embedding by its sign alone (scaled to unit length, a 1-D embedding is -1 "
                   "or +1), so the test samples tie in two groups; set model.embedding_size to "
                   "2 or more")
    assert not (tmp_path / "run").exists()


def test_an_unknown_domain_pair_names_npz_files_too(tmp_path, capsys):
    err = refused(tmp_path, capsys, "train", "dtml", "--dataset", "foo->digits", "--out",
                  tmp_path / "run", "train.device=cpu", "--no-progress")
    # the one pair into digits is named as meant (its "->digits" alike)
    assert err == ("kdml: error: unknown domain pair 'foo->digits' (did you mean "
                   "'mnist5k->digits'?); choose one of: "
                   "mnist5k->digits, digits->mnist5k, or npz:FILE for domains of one's own (a "
                   ".npz of both domains' features: X, y, domain)")


def test_image_files_cropped_too_small_for_the_small_cnn_name_data_image_size(tmp_path,
                                                                              capsys):
    """data.resize=8 data.image_size=7 on image files with the small CNN had been refused as
    "SmallCNN takes images of side 8 or more, got side 7", naming no setting to change."""
    from fixtures_array_sets import make_image_folder

    root = make_image_folder(tmp_path, classes=4, per_class=3, size=12)
    err = refused(tmp_path, capsys, "train", "amsoftmax", "--dataset", f"folder:{root}",
                  "--out", tmp_path / "run", "model.backbone=cnn", "data.resize=8",
                  "data.image_size=7", "train.epochs=1", "eval.nmi=false", "eval.ks=[1]",
                  "--no-progress")
    assert err == ("kdml: error: SmallCNN takes images of side 8 or more, got side 7; set "
                   "data.image_size=8 or more (for image files), or choose another backbone, "
                   "e.g. model.backbone=mlp")
    assert not (tmp_path / "run").exists()
