"""End-to-end CLI runs on tiny settings, bad inputs, and resuming after an interruption."""

from __future__ import annotations

import copy
import importlib.abc
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_RUN

from kdml import cli, entry
from kdml.training import recorder, trainer
from kdml.training.recipes import RECIPES


def run_cli(*args: str) -> int:
    return cli.main([str(a) for a in args])


def read_metrics(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())


def test_train_writes_the_run_folder(tmp_path, tiny_overrides, capsys):
    out = tmp_path / "run"
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", out, "--no-progress",
                   *tiny_overrides) == 0
    printed = capsys.readouterr().out
    for key in ("recall@1", "recall@8", "map@r"):
        assert key in printed
    # digits' standard split is class-disjoint: 5 of its 10 classes are tested
    assert "test set: 896 samples of classes not seen in training" in printed
    for name in ("config.yaml", "metrics.csv", "metrics.json", "train.log",
                 "checkpoints/last.pt", "plots/loss.png", "plots/recall.png"):
        assert (out / name).is_file(), name
    assert any((out / "tensorboard").iterdir())
    metrics = read_metrics(out)
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2]
    assert 0.0 <= metrics["final"]["recall@1"] <= 1.0
    assert metrics["final"]["recall@1"] <= metrics["final"]["recall@8"]
    csv_lines = (out / "metrics.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and "test/map@r" in csv_lines[0]
    assert metrics["scored"] == "test"
    assert not list(out.rglob("*.tmp"))

    assert run_cli("eval", out) == 0
    assert "test set: 896 samples of classes not seen in training" in capsys.readouterr().out
    evaluated = json.loads((out / "eval.json").read_text())
    assert evaluated["metrics"]["recall@1"] == pytest.approx(metrics["final"]["recall@1"], abs=1e-6)


def test_a_seen_holdout_run_says_its_test_classes_were_seen(tmp_path, tiny_overrides, capsys):
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "data.split=seen-holdout",
                   "--out", tmp_path / "run", "--no-progress", *tiny_overrides,
                   "train.steps_per_epoch=2") == 0
    printed = capsys.readouterr().out
    assert "samples of the training classes, held out from training" in printed


def test_a_validation_run_scores_held_out_training_classes(tmp_path, tiny_overrides, capsys):
    """digits trains on classes 0-4; data.validation=0.4 trains on 0-2 and scores 3-4."""
    out = tmp_path / "run"
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "data.validation=0.4",
                   "--out", out, "--no-progress", *tiny_overrides, "data.batch_size=12",
                   "train.steps_per_epoch=2") == 0
    printed = capsys.readouterr().out
    assert ("test set: 364 validation samples of classes not seen in training, carved from the "
            "training part") in printed
    assert "validation: 0.4" in (out / "config.yaml").read_text()
    # and train.log says so too (it had called them "364 test samples")
    assert "537 train / 364 validation samples" in (out / "train.log").read_text()
    assert run_cli("embed", out, "--out", tmp_path / "validation.npz") == 0
    import numpy as np

    assert set(np.load(tmp_path / "validation.npz")["labels"].tolist()) == {3, 4}


def test_seed_makes_runs_repeatable(tmp_path, tiny_overrides):
    finals = []
    for name in ("a", "b"):
        # two epochs of a few steps: the seed draws the weights, each epoch's batches and its
        # scores as in whole epochs (45 steps here), which took most of the time
        assert run_cli("train", "amsoftmax", "--dataset", "digits", "--seed", "3", "--out",
                       tmp_path / name, "--no-progress", *tiny_overrides,
                       "train.steps_per_epoch=3") == 0
        finals.append(read_metrics(tmp_path / name))
    assert finals[0] == finals[1]


INTERRUPTED_RUN = [*TINY_RUN, "train.epochs=3", "optim.lr_step=2"]


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory):
    """The run of INTERRUPTED_RUN trained without a stop, once for the module (read only)."""
    full = tmp_path_factory.mktemp("uninterrupted") / "full"
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", full, "--no-progress",
                   *INTERRUPTED_RUN) == 0
    return full


@pytest.mark.parametrize("crash_after", ["unscored.pt", "last.pt"])
def test_resume_after_interruption_matches_uninterrupted(tmp_path, uninterrupted_run,
                                                         monkeypatch, crash_after):
    """A kill after epoch 1's trained weights (unscored.pt) or its scored checkpoint (last.pt)
    was written: --resume ends bit for bit where the uninterrupted run ends (resuming from
    last.pt had been checked by no test: retraining its epoch went unseen)."""
    overrides = INTERRUPTED_RUN
    full = uninterrupted_run

    # Crash right after the first checkpoint of that name has been written.
    real_save = recorder.save_checkpoint
    calls = []

    def save_then_crash(state, path):
        real_save(state, path)
        if path.name == crash_after:
            calls.append(state["epoch"])
            raise KeyboardInterrupt

    monkeypatch.setattr(recorder, "save_checkpoint", save_then_crash)
    part = tmp_path / "part"
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", part, "--no-progress",
                   *overrides) == 130
    assert calls == [1]
    monkeypatch.setattr(recorder, "save_checkpoint", real_save)
    assert run_cli("train", "--resume", part, "--no-progress") == 0

    resumed, uninterrupted = read_metrics(part), read_metrics(full)
    assert resumed == uninterrupted
    state_a = torch.load(part / "checkpoints/last.pt", weights_only=True)["method"]
    state_b = torch.load(full / "checkpoints/last.pt", weights_only=True)["method"]
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


def same(a, b) -> bool:
    """Whether two checkpoint parts (nested dicts and lists of tensors and numbers) are equal."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return (isinstance(b, dict) and a.keys() == b.keys()
                and all(same(a[key], b[key]) for key in a))
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b, strict=True)))
    return a == b


def test_a_kill_while_an_epoch_is_scored_loses_none_of_its_training(
        tmp_path, tiny_overrides, monkeypatch, capsys, kill_in_scoring):
    """Scoring can take many minutes (SOP: 60k test images embedded and searched); a kill then
    keeps the trained epoch (checkpoints/unscored.pt), and --resume scores it without training
    it again, ending where the uninterrupted run ends."""
    overrides = [*tiny_overrides, "train.epochs=3", "optim.lr_step=2", "train.steps_per_epoch=4"]
    real_save, real_train = recorder.save_checkpoint, trainer.train_one_epoch
    saved: dict[tuple[str, int], dict] = {}

    def kept_save(state, path):
        saved[path.name, state["epoch"]] = copy.deepcopy(state)  # not the live tensors
        real_save(state, path)

    monkeypatch.setattr(recorder, "save_checkpoint", kept_save)
    full = tmp_path / "full"
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", full, "--no-progress",
                   *overrides) == 0
    assert not (full / "checkpoints" / "unscored.pt").exists()  # gone once last.pt holds it
    # scoring leaves the training state as it was: resuming before it or after it is the same
    before, after = saved["unscored.pt", 2], saved["last.pt", 2]
    assert before["unscored"]["row"] == {key: value for key, value in after["history"][-1].items()
                                         if not key.startswith("test/")}
    assert before["history"] == after["history"][:-1] and not before["finished"]
    for key in ("method", "optimizer", "scheduler", "scaler"):
        assert same(before[key], after[key]), key
    monkeypatch.setattr(recorder, "save_checkpoint", real_save)

    trained = []

    def counted_train(session, epoch, progress):
        trained.append(epoch)
        return real_train(session, epoch, progress)

    monkeypatch.setattr(trainer, "train_one_epoch", counted_train)
    undo = kill_in_scoring(2)
    part = tmp_path / "part"
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", part, "--no-progress",
                   *overrides) == 130
    assert trained == [1, 2]
    checkpoints = part / "checkpoints"
    assert torch.load(checkpoints / "last.pt", weights_only=True)["epoch"] == 1
    assert torch.load(checkpoints / "unscored.pt", weights_only=True)["epoch"] == 2
    assert [row["epoch"] for row in read_metrics(part)["epochs"]] == [1]  # no half epoch
    assert "epoch 2 trained; scoring" in (part / "train.log").read_text()
    # kdml eval scores last.pt, the epoch metrics.json ends with
    undo()
    assert run_cli("eval", part) == 0
    assert json.loads((part / "eval.json").read_text())["epoch"] == 1
    # a new run into the folder is refused: it holds a trained epoch
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", part, "--no-progress",
                   *overrides) == 2
    assert "already holds a run; continue it with 'kdml train --resume" in capsys.readouterr().err

    trained.clear()
    torch.manual_seed(12345)  # another process: training draws nothing from the global streams
    assert run_cli("train", "--resume", part, "--no-progress") == 0
    assert "after epoch 2 of 3, trained but not yet scored: scoring it first" in (
        capsys.readouterr().out)
    assert trained == [3]  # epoch 2 is scored, not trained again
    # the session's first line says so (kdml reproduce's time accounting reads it)
    from kdml.training.run_folder import SCORED_FIRST

    assert f"start epoch 2 of 3 ({SCORED_FIRST})," in (part / "train.log").read_text()
    assert not (checkpoints / "unscored.pt").exists()
    assert read_metrics(part) == read_metrics(full)
    state_a = torch.load(checkpoints / "last.pt", weights_only=True)
    state_b = torch.load(full / "checkpoints/last.pt", weights_only=True)
    assert state_a["finished"] and state_a["history"] == state_b["history"]
    assert all(torch.equal(state_a["method"][k], state_b["method"][k]) for k in state_a["method"])


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path, uninterrupted_run):
    """A real kill -9 in the middle of training loses nothing already written: resumed, the
    run ends where the same run trained without a stop ends (the module's, already trained)."""
    # the kill lands after epoch 1's checkpoint, with two whole epochs still to train (as long
    # after it, in the subprocess, as the five epochs of 10 steps this test had trained)
    overrides = INTERRUPTED_RUN
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "kdml", "train", "amsoftmax", "--dataset", "digits",
               "--out", str(run_dir), "--no-progress", *overrides]
    # Same thread count as this process (conftest): float sums depend on it.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env)
    checkpoint = run_dir / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while not checkpoint.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    # killed while it trained, not after it had finished on its own
    assert process.wait() == -signal.SIGKILL
    assert checkpoint.exists()
    assert not torch.load(checkpoint, weights_only=True)["finished"]
    assert run_cli("train", "--resume", run_dir, "--no-progress") == 0
    assert read_metrics(run_dir)["final"] == read_metrics(uninterrupted_run)["final"]


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("args", "expected"), [
    (["train", "nope", "--dataset", "digits"], "unknown recipe 'nope'; choose one of: "),
    (["train", "amsoftmax", "--dataset", "imagenet"],
     "unknown dataset 'imagenet'; choose one of: mnist5k"),
    # a name spelt nearly right: the one meant first, as for config keys, then the list
    (["train", "jdr", "--dataset", "digits"], "unknown recipe 'jdr' (did you mean 'jrd'?); "
                                              "choose one of: jrd, mrd"),
    (["train", "jrd", "--dataset", "fashion_mnist"],
     "unknown dataset 'fashion_mnist' (did you mean 'fashion-mnist'?); choose one of: "),
    (["train", "jrd", "--dataset", "CUB"], "unknown dataset 'CUB' (did you mean 'cub'?)"),
    (["config", "msimclr2"], "unknown recipe 'msimclr2' (did you mean 'msimclr'?)"),
    (["train", "amsoftmax", "--dataset", "digits", "epochs"], "malformed override 'epochs'"),
    (["train", "amsoftmax", "--dataset", "digits", "train.epoch=2"], "did you mean 'train.epochs'"),
    (["train", "amsoftmax", "--dataset", "digits", "batch_size=2000"], "larger than the training"),
    (["train", "epochs=3"], "must be a recipe name"),
    (["train"], "name a recipe"),
    (["eval", "/nonexistent/run"], "does not exist"),
    (["train", "--resume", "/nonexistent/run"], "does not exist"),
    (["frobnicate"], "invalid choice"),
    # --ks takes every value after it: a run folder there is one more K (tmp_path exists)
    (["eval", "--ks", "1", "2", "TMP"], "expected an integer, got 'TMP', a path read as one "
                                        "more K; put the run folder before --ks"),
    (["eval", "RUN", "--ks", "1", "x"], "expected an integer, got 'x' (see"),
])
def test_bad_input_is_one_line(args, expected, capsys, tmp_path):
    args = [str(tmp_path) if arg == "TMP" else arg for arg in args]
    expected = expected.replace("TMP", str(tmp_path))
    if args[0] == "train" and "--resume" not in args:
        args = [*args, "--out", str(tmp_path / "run"), "--no-progress"]
    assert run_cli(*args) == 2
    assert expected in error_line(capsys)


class _InterruptedImport(importlib.abc.MetaPathFinder):
    """An import of kdml.cli stopped by a Ctrl-C, as one ~0.1-0.4 s after the start would be."""

    def find_spec(self, name, path, target=None):
        if name == "kdml.cli":
            raise KeyboardInterrupt
        return None


def test_a_ctrl_c_while_the_command_line_is_imported_is_one_line(monkeypatch, capsys):
    """The console script imports kdml.cli under a guard: a Ctrl-C there had printed Python's
    traceback, before kdml.cli.main could say it."""
    monkeypatch.delitem(sys.modules, "kdml.cli")
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(), *sys.meta_path])
    assert entry.main() == 130
    assert capsys.readouterr().err == "kdml: interrupted\n"


def test_the_console_script_and_python_m_kdml_run_the_guarded_entry():
    """The installed ``kdml`` and ``python -m kdml`` both start at :func:`kdml.entry.main`."""
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="kdml")
    assert script.load() is entry.main
    main_module = (Path(entry.__file__).parent / "__main__.py").read_text()
    assert "from kdml.entry import main\n" in main_module


# Each command that reads a run, and a resumed training, given a run folder that is not there.
MISTYPED_RUN_COMMANDS = """
import sys
from kdml.cli import main
missing = sys.argv[1]
for argv in (["eval", missing], ["analyze", "generalization", missing],
             ["plot", "charts", missing], ["plot", "retrieval", missing],
             ["plot", "embedding", missing], ["embed", missing, "--out", "e.npz"],
             ["index", missing, "--out", "index"],
             ["search", missing, "--index", "index", "--query", "q.npz"],
             ["train", "--resume", missing]):
    print(main(argv), file=sys.stderr)
print("torch imported:", "torch" in sys.modules)
"""


def test_a_mistyped_run_folder_is_said_before_torch_is_imported(tmp_path):
    """Every command that reads a run imported torch (2-3 s) before it found that its run
    folder was not there; said now from the command line alone, in the same line."""
    (tmp_path / "a-file").write_text("not a run")
    for name, why in (("no-such-run", "does not exist"), ("a-file", "is not a folder")):
        done = subprocess.run([sys.executable, "-c", MISTYPED_RUN_COMMANDS, name], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "torch imported: False\n"
        assert done.stderr.splitlines() == 9 * [f"kdml: error: run folder {name} {why}", "2"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]  # nothing written

# A mistyped recipe, and a --config file missing, malformed or naming no known recipe.
MISTYPED_TRAINING_COMMANDS = """
import sys
from kdml.cli import main
for argv in (["train", "jdr", "--dataset", "digits"], ["config", "jdr"], ["config"],
             ["train", "jrd", "--config", "missing.yaml"], ["train", "--config", "broken.yaml"],
             ["config", "--config", "other.yaml"], ["train", "jrd", "--dataset", "digts"],
             ["config", "jrd", "--dataset", "mnist5k-"]):
    print(main(argv), file=sys.stderr)
print("torch imported:", "torch" in sys.modules)
"""


def test_a_mistyped_recipe_or_config_file_is_said_before_torch_is_imported(tmp_path):
    """kdml train and kdml config imported the recipes, and torch with them (3 s, 7 s on a busy
    machine), before they found the recipe's name, the --config file or the --dataset
    wrong."""
    (tmp_path / "broken.yaml").write_text("recipe: [jrd\n")
    (tmp_path / "other.yaml").write_text("recipe: jdr\n")
    done = subprocess.run([sys.executable, "-c", MISTYPED_TRAINING_COMMANDS], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "torch imported: False\n"
    unknown = ("kdml: error: unknown recipe 'jdr' (did you mean 'jrd'?); choose one of: "
               f"{', '.join(RECIPES)}")
    lines = done.stderr.splitlines()
    assert lines[0:12:2] == [unknown, unknown, "kdml: error: name a recipe, e.g. 'kdml "
                             "config jrd' (or a --config file with a recipe: line)",
                             "kdml: error: config file missing.yaml does not exist",
                             lines[8], unknown], done.stderr
    assert lines[8].startswith("kdml: error: config file broken.yaml is not valid YAML: ")
    datasets = ("mnist5k, digits, mnist1d, cub, cars196, sop, inshop, cifar10, cifar100, "
                "mnist, fashion-mnist, mnist5k->digits, digits->mnist5k, folder:DIR, csv:FILE "
                "or npz:PATH")
    assert lines[12:] == [
        f"kdml: error: unknown dataset 'digts' (did you mean 'digits'?); choose one of: "
        f"{datasets}", "2", f"kdml: error: unknown dataset 'mnist5k-'; choose one of: "
        f"{datasets} (quote domain pairs in the shell: --dataset 'mnist5k->digits')", "2"]
    assert lines[1::2] == 8 * ["2"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["broken.yaml", "other.yaml"]


def test_the_recipe_names_known_without_torch_are_the_recipes():
    from kdml.training.recipe_names import RECIPE_NAMES

    assert tuple(RECIPES) == RECIPE_NAMES


def test_the_dataset_names_known_without_torch_are_the_registries():
    from kdml import dataset_names
    from kdml.data.domains import DOMAIN_PAIRS
    from kdml.data.registry import DATASETS, FORMATS, PATH_FORMATS

    assert tuple(DATASETS) == dataset_names.OFFLINE_NAMES
    assert tuple(FORMATS) == dataset_names.FORMAT_NAMES
    assert tuple(DOMAIN_PAIRS) == dataset_names.PAIR_NAMES
    assert tuple(PATH_FORMATS) == dataset_names.PATH_PREFIXES


def test_missing_or_corrupt_checkpoint(tmp_path, tiny_overrides, capsys):
    out = tmp_path / "run"
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", out, "--no-progress",
                   *tiny_overrides, "train.steps_per_epoch=2") == 0
    capsys.readouterr()
    checkpoint = out / "checkpoints" / "last.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    assert run_cli("eval", out) == 2
    assert "corrupt" in error_line(capsys)
    checkpoint.unlink()
    assert run_cli("eval", out) == 2
    assert "no checkpoint" in error_line(capsys)
    (out / "config.yaml").unlink()
    assert run_cli("eval", out) == 2
    assert "not a kdml run folder" in error_line(capsys)


def test_a_grid_folder_given_as_a_run_names_one_of_its_cells(tmp_path, capsys):
    # it had said "not a kdml run folder (no config.yaml)", of a folder kdml made
    from kdml.training.grid import grid_cells, write_marker

    grid = tmp_path / "g1"
    values = {"train.seed": [0, 1]}
    write_marker(grid, grid_cells(values), values)
    (grid / "seed=1").mkdir()  # a cell started (seed=0 not yet): the one named
    (grid / "seed=1" / "config.yaml").write_text("recipe: jrd\n")
    for args in (("eval", grid), ("train", "--resume", grid),
                 ("index", grid, "--out", tmp_path / "idx")):
        assert run_cli(*args) == 2
        assert (f"{grid} is a grid's folder (grid.yaml), not a run: each of its cells is a run "
                f"folder (such as {grid}/seed=1); give one of those") in error_line(capsys)


def test_existing_run_is_not_overwritten(tmp_path, tiny_overrides, capsys):
    out = tmp_path / "run"
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", out,
                   *tiny_overrides, "train.steps_per_epoch=2") == 0
    before = (out / "checkpoints" / "last.pt").read_bytes()
    capsys.readouterr()
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", out,
                   *tiny_overrides) == 2
    assert "already holds a run; continue it with 'kdml train --resume" in error_line(capsys)
    assert (out / "checkpoints" / "last.pt").read_bytes() == before


def test_datasets_and_recipes_are_listed(capsys):
    assert run_cli("datasets") == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("mnist5k", "digits", "mnist1d"))
    assert run_cli("recipes") == 0
    assert "amsoftmax" in capsys.readouterr().out



def test_a_run_stores_its_paths_absolute_so_any_folder_reads_the_same_data(
        tmp_path, monkeypatch, capsys):
    """Trained with ``folder:images`` (relative), the run must name that folder absolutely: a
    later ``kdml eval`` from a folder with another ``images/`` had scored those (exit 0, and
    its numbers in eval.json)."""
    import yaml
    from fixtures_array_sets import make_image_folder

    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    make_image_folder(here, classes=4, per_class=3, size=24)
    make_image_folder(elsewhere, classes=4, per_class=2, size=24, seed=1)
    monkeypatch.chdir(here)
    assert run_cli("train", "amsoftmax", "--dataset", "folder:images", "--out", "run",
                   "--no-progress", "train.epochs=1", "eval.nmi=false", "train.device=cpu",
                   "data.batch_size=4", "data.resize=28", "data.image_size=24",
                   "eval.ks=[1]") == 0
    stored = yaml.safe_load((here / "run" / "config.yaml").read_text())["data"]["dataset"]
    assert stored == f"folder:{here / 'images'}"
    capsys.readouterr()
    monkeypatch.chdir(elsewhere)
    assert run_cli("eval", here / "run") == 0
    assert "test set: 6 samples" in capsys.readouterr().out  # here's 2 test classes x 3


def test_the_library_train_stores_the_paths_absolute_too(tmp_path, monkeypatch):
    import yaml
    from fixtures_array_sets import make_image_folder

    from kdml.config import resolve_config
    from kdml.training.recipes import get_recipe

    make_image_folder(tmp_path, classes=4, per_class=3, size=24)
    monkeypatch.chdir(tmp_path)
    recipe = get_recipe("amsoftmax")
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, {}, [
        "data.dataset=folder:images", "train.epochs=1", "eval.nmi=false", "train.device=cpu",
        "data.batch_size=4", "data.resize=28", "data.image_size=24", "eval.ks=[1]"])
    trainer.train(config, tmp_path / "run", progress=False)
    stored = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["dataset"]
    assert stored == f"folder:{tmp_path / 'images'}"


def test_relative_data_root_and_weights_are_stored_absolute(tmp_path, monkeypatch):
    from kdml.config import RunConfig, with_absolute_paths

    monkeypatch.chdir(tmp_path)
    config = RunConfig("jrd")
    config.data.dataset, config.data.root = "csv:lists/train.csv", "cub"
    config.model.weights = "weights/resnet.pth"
    absolute = with_absolute_paths(config)
    assert absolute.data.dataset == f"csv:{tmp_path / 'lists' / 'train.csv'}"
    assert absolute.data.root == str(tmp_path / "cub")
    assert absolute.model.weights == str(tmp_path / "weights" / "resnet.pth")
    for name in ("mnist5k", "mnist5k->digits", "cub"):  # names, not paths
        config.data.dataset = name
        assert with_absolute_paths(config).data.dataset == name
    assert with_absolute_paths(RunConfig("jrd")).data.root == ""  # unset stays unset


@pytest.mark.parametrize(("flag", "override"), [
    (["--dataset", "digits"], "data.dataset=mnist5k"),
    (["--dataset", "digits"], "dataset=mnist5k"),
    (["--seed", "3"], "train.seed=4"),
])
def test_a_flag_and_an_override_of_its_key_are_refused_together(flag, override, capsys,
                                                               tmp_path, monkeypatch):
    """One of them would be ignored without a word (the flag won)."""
    monkeypatch.chdir(tmp_path)
    assert run_cli("train", "amsoftmax", *flag, override, "--out", "never-made") == 2
    err = capsys.readouterr().err.strip()
    key = override.split("=")[0]
    assert err == (f"kdml: error: {flag[0]} and the override {override} both set "
                   f"{'data.dataset' if key == 'dataset' else key}; give one")
    assert not os.path.exists("never-made")


@pytest.mark.parametrize(("override", "hint"), [
    ("train.lr=0.1", "did you mean 'optim.lr'?"),  # the setting, under the wrong section
    ("eval.ks=", "expected a list of int, e.g. eval.ks=[1,2]"),
    ("foo=1", "'kdml config amsoftmax' lists every key"),  # no look-alike guess ('root')
])
def test_a_mistyped_override_gets_a_helpful_hint(override, hint, capsys, tmp_path,
                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_cli("train", "amsoftmax", override, "--out", "never-made") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kdml: error: ") and err.endswith(hint) and "\n" not in err


def test_a_flag_over_which_the_grid_runs_is_refused(tmp_path, monkeypatch, capsys):
    """A grid cell's value had silently won over --seed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.yaml").write_text("recipe: amsoftmax\ngrid: {train.seed: [0, 1]}\n")
    assert run_cli("train", "--config", "grid.yaml", "--seed", "5", "--out", "never-made") == 2
    assert capsys.readouterr().err.strip() == (
        "kdml: error: --seed sets train.seed, over which the config's grid runs; give one")
    assert not os.path.exists("never-made")


def test_the_metrics_table_and_the_index_line_read_right(capsys, monkeypatch, tmp_path):
    """Metric names longer than the column (source_nn_accuracy) had pushed their values out of
    it; an index of one chart said "1 charts"."""
    import argparse

    from kdml.config import resolve_config
    from kdml.evaluation.index import IndexInfo
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("dtml")
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, {},
                            ["data.dataset=mnist5k->digits"])
    cli.output._print_results(config, {"recall@1": 0.5, "source_nn_accuracy": 0.25}, tmp_path)
    rows = capsys.readouterr().out.splitlines()[2:5]
    assert [row.index(row.split()[1]) for row in rows] == [21, 21, 21], rows

    import kdml.inspection.parts

    for charts, said in (([0], ", 1 chart written"), ([0, 2], ", 2 charts written")):
        info = IndexInfo("run", "0", "cosine", 2, "exact", 9, 1.0, charts)
        monkeypatch.setattr(cli.evaluate, "_run_and_part", lambda args: (None, None))
        monkeypatch.setattr(kdml.inspection.parts, "index_part", lambda *args, info=info: info)
        assert cli.evaluate._index(argparse.Namespace(out=tmp_path / "index", kind="exact")) == 0
        assert said in capsys.readouterr().out


def test_every_option_of_every_command_says_what_it_is():
    """search's --index and --query and two --seed options had no help line."""
    import argparse

    from kdml.cli.parser import build_parser

    def silent(parser: argparse.ArgumentParser, name: str):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, subparser in action.choices.items():
                    yield from silent(subparser, f"{name} {command}")
            elif action.option_strings and not action.help:
                yield f"{name} {action.option_strings[0]}"

    assert list(silent(build_parser(), "kdml")) == []


def test_the_grid_table_keeps_its_columns_in_line(tmp_path, capsys):
    """Its columns were 24 and 12 wide whatever they held: a cell named by three keys' values
    and source_nn_accuracy (18 letters) pushed their rows and header out of line."""
    import re

    grid = tmp_path / "grid.yaml"
    grid.write_text("recipe: pca\ndata:\n  dataset: mnist5k->digits\ngrid:\n"
                    "  method.pca_dim: [8, 16]\n  eval.ks: [[1, 2]]\n  eval.nmi: [false]\n")
    assert cli.main(["train", "--config", str(grid), "--out", str(tmp_path / "grid"),
                     "--no-progress"]) == 0
    printed = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(printed) if line.startswith("Test metrics per cell"))
    header, *rows = printed[start + 1:start + 4]
    assert "source_nn_accuracy" in header and len(rows) == 2
    ends = [[match.end() for match in re.finditer(r"\S+", line)] for line in (header, *rows)]
    assert ends[0][1:] == ends[1][1:] == ends[2][1:]  # every metric column ends in one place
    assert ends[1][0] < ends[0][1] - len(header.split()[1])  # the cell names fit their column


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_output_to_a_full_disk_is_one_line(tmp_path):
    """print() into a full disk raised an OSError that names no file: a raw traceback. With
    stdout buffered (no PYTHONUNBUFFERED, as for most users) the error came at Python's exit,
    after main: "Exception ignored ... OSError" and exit status 120."""
    for unbuffered in ("1", None):
        env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
        if unbuffered:
            env["PYTHONUNBUFFERED"] = unbuffered
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", "kdml", "config", "jrd"], stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=120, env=env)
        assert done.returncode == 2, (unbuffered, done.stderr)
        assert done.stderr == ("kdml: error: the output could not be written (No space left "
                               "on device); free space where it goes, or send it elsewhere\n")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("unbuffered", ["1", None])
@pytest.mark.parametrize("asked", [["train", "--help"], ["--version"]])
def test_help_or_version_to_a_full_disk_is_one_line(asked, unbuffered):
    """argparse prints help and the version itself, ignoring an OSError of its write: into a
    full disk, the help was lost with exit status 0 (stdout unbuffered), or Python's flush at
    exit printed "Exception ignored ... OSError" and exit status 120."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "kdml", *asked], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    assert (done.returncode, done.stderr) == (
        2, "kdml: error: the output could not be written (No space left on device); free "
           "space where it goes, or send it elsewhere\n")


def test_console_output_to_a_file_keeps_its_order_with_stderr(tmp_path):
    """`kdml train ... > log 2>&1` (a batch job's log): stdout, block-buffered into a file, had
    come out only at the end, after every warning, so "training ... into FOLDER" (and a grid's
    "[2/6] cell" lines) showed only once the run was over, and a kill (SIGKILL) lost them."""
    script = ("import os, sys\n"
              "import kdml.cli as cli\n"
              "def command(args):\n"
              "    print('first')\n"
              "    os.write(2, b'warning\\n')\n"
              "    print('last')\n"
              "    return 0\n"
              "cli._COMMANDS['recipes'] = command\n"
              "sys.argv = ['kdml', 'recipes']\n"
              "sys.exit(cli.main())\n")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    log = tmp_path / "log"
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-c", script], stdout=out,
                              stderr=subprocess.STDOUT, timeout=120, env=env)
    assert done.returncode == 0
    assert log.read_text().splitlines() == ["first", "warning", "last"]


def test_a_grid_folder_given_as_a_run_names_its_first_started_cell_in_grid_order(tmp_path,
                                                                                  capsys):
    """The cell named is the first of grid.yaml's order that holds a run, not the first by
    name nor the last."""
    from kdml.training.grid import grid_cells, write_marker

    grid = tmp_path / "g2"
    values = {"train.seed": [2, 0, 1]}  # by name: seed=0 first, seed=2 last
    write_marker(grid, grid_cells(values), values)
    for cell in ("seed=0", "seed=1", "seed=2"):
        (grid / cell).mkdir()
        (grid / cell / "config.yaml").write_text("recipe: jrd\n")
    assert run_cli("eval", grid) == 2
    assert f"(such as {grid}/seed=2); give one of those" in error_line(capsys)


def test_a_grid_folder_with_no_cell_started_names_no_folder_beside_its_cells(tmp_path, capsys):
    """A run in a folder beside the grid's cells is not one of them: the refusal of the grid
    folder as a run names no example cell until one of its own has started."""
    from kdml.training.grid import grid_cells, write_marker

    grid = tmp_path / "g"
    values = {"train.seed": [0, 1]}
    write_marker(grid, grid_cells(values), values)
    (grid / "mine").mkdir()
    (grid / "mine" / "config.yaml").write_text("recipe: jrd\n")
    assert run_cli("eval", grid) == 2
    line = error_line(capsys)
    assert "is a grid's folder (grid.yaml), not a run: each of its cells is a run folder; give" \
        in line and "mine" not in line, line


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_run_without_standard_output_or_error_trains_and_exits_0(closed, tmp_path,
                                                                   tiny_overrides, monkeypatch):
    """A process started with its standard output or error closed (``>&-``, ``2>&-``, a job
    runner's closed descriptors, ``pythonw``) has ``sys.stdout`` or ``sys.stderr`` None, into
    which ``print`` writes nothing. Without stdout, a finished run had ended in an
    AttributeError's traceback and exit status 1 (the flush after the command); without
    stderr, tqdm, which found no ``isatty`` to ask, drew its bar into None and stopped the run
    before its first step."""
    monkeypatch.setattr(sys, closed, None)
    out = tmp_path / "run"
    assert run_cli("train", "amsoftmax", "--dataset", "digits", "--out", out,
                   *tiny_overrides, "train.epochs=1", "train.steps_per_epoch=2") == 0
    assert read_metrics(out)["final"]
    assert run_cli("recipes") == 0
