"""One process at a time trains a run folder, and one ``kdml reproduce`` at a time uses a runs
folder: a second one gets a one-line error instead of interleaving its writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kdml import cli
from kdml.errors import KdmlError
from kdml.training import trainer
from kdml.training.run_folder import RunFolder, hold_folder


def test_a_run_being_trained_is_refused_to_a_second_process(tmp_path, tiny_overrides, capsys,
                                                            monkeypatch):
    out = tmp_path / "run"
    args = ["train", "amsoftmax", "--dataset", "digits", "--out", str(out), "--no-progress",
            *tiny_overrides, "train.epochs=2"]
    assert cli.main([*args[:-1], "train.epochs=1"]) == 0
    capsys.readouterr()
    # another process holds it (flock: a second open file of this process counts as another)
    with RunFolder(out).held(), monkeypatch.context() as patched:
        # refused before any data is loaded (a large dataset takes a while to open)
        patched.setattr(trainer.Session, "build", lambda *args: pytest.fail("data loaded"))
        assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"{out} is being trained by another process" in err and err.count("\n") == 1
    assert len(json.loads((out / "metrics.json").read_text())["epochs"]) == 1  # untouched
    # once it is let go, the run resumes
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0


def test_a_killed_process_leaves_nothing_held(tmp_path):
    lock = tmp_path / "run" / ".training.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from kdml.training.run_folder import hold_folder\n"
         f"with hold_folder(Path({str(lock)!r}), 'busy'):\n"
         "    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(KdmlError, match="^busy$"), hold_folder(lock, "busy"):
            pass
    finally:
        holder.kill()
        holder.wait()
    with hold_folder(lock, "busy"):  # the kill let it go
        pass


def test_a_second_reproduce_on_the_same_runs_folder_is_refused(tmp_path, capsys):
    runs = tmp_path / "runs"
    with hold_folder(runs / ".reproduce.lock", "held by this test"):
        assert cli.main(["reproduce", "dtml", "--quick", "--out", str(tmp_path / "r.md"),
                         "--runs", str(runs)]) == 2
    err = capsys.readouterr().err
    assert f"{runs} is in use by another kdml reproduce" in err and err.count("\n") == 1
    assert not (tmp_path / "r.md").exists()


def test_a_folder_holding_only_a_lock_file_takes_a_new_run(tmp_path, tiny_overrides):
    out = tmp_path / "run"
    with RunFolder(out).held():  # as a run that stopped before writing its config leaves it
        pass
    assert [path.name for path in out.iterdir()] == [".training.lock"]
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "train.epochs=1"]) == 0


def test_a_file_system_without_locks_trains_unguarded_and_an_unwritable_folder_says_so(
        tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with hold_folder(tmp_path / "nfs" / ".training.lock", "busy"):
        pass
    monkeypatch.undo()
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / ".training.lock").mkdir()  # cannot be opened as a file
    with (pytest.raises(KdmlError, match=r"^cannot write .*\.training\.lock: Is a directory$"),
          hold_folder(tmp_path / "locked" / ".training.lock", "busy")):
        pass


def test_a_new_run_never_writes_over_one_started_since_its_folder_was_checked(tmp_path,
                                                                              tiny_overrides):
    from kdml.config import resolve_config
    from kdml.training.recipes import get_recipe
    from kdml.training.trainer import train

    recipe = get_recipe("amsoftmax")
    config = resolve_config(recipe.name, recipe.params, recipe.defaults,
                            {"data": {"dataset": "digits"}}, [*tiny_overrides, "train.epochs=1"])
    out = tmp_path / "run"
    train(config, out, progress=False, echo=lambda line: None)
    before = (out / "config.yaml").read_text()
    with pytest.raises(KdmlError, match="already holds a run"):
        train(config, out, progress=False, echo=lambda line: None)  # as if its check was passed
    assert (out / "config.yaml").read_text() == before
