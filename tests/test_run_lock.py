"""One process at a time trains a run folder: a second one gets a one-line error instead of
interleaving its writes (a second ``kdml reproduce`` waits for it: tests/test_reproduce.py)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kdml import cli
from kdml.errors import KdmlError
from kdml.training import trainer
from kdml.training.run_folder import RunFolder, check_new_run_folder, hold_folder, start_afresh


def test_a_run_being_trained_is_refused_to_a_second_process(tmp_path, trained_run, capsys,
                                                            monkeypatch):
    out = tmp_path / "run"
    shutil.copytree(trained_run, out)  # a tiny run of one epoch, which this test resumes
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


def _hold(lock: Path, sender) -> None:
    """The other process: holds ``lock`` (:func:`hold_folder`), says so to ``sender``, and
    sleeps."""
    with hold_folder(lock, "busy"):
        sender.send("held")
        time.sleep(60)


@contextlib.contextmanager
def held_by_another_process(lock: Path) -> Iterator[multiprocessing.Process]:
    """Another Python process holds ``lock`` (:func:`hold_folder`) until it is killed. It is
    forked from this one, which has imported kdml already (a fresh interpreter took seconds
    to import torch for it); nothing is held at the fork, so all it holds is its own."""
    fork = multiprocessing.get_context("fork")
    receiver, sender = fork.Pipe(duplex=False)
    holder = fork.Process(target=_hold, args=(lock, sender), daemon=True)
    holder.start()
    sender.close()  # the holder's end: should it die first, recv() raises instead of waiting
    try:
        assert receiver.poll(60) and receiver.recv() == "held"
        yield holder
    finally:
        holder.kill()
        holder.join()


def test_a_killed_process_leaves_nothing_held(tmp_path):
    lock = tmp_path / "run" / ".training.lock"
    with held_by_another_process(lock), pytest.raises(KdmlError, match="^busy$"), \
            hold_folder(lock, "busy"):
        pass
    with hold_folder(lock, "busy"):  # the kill let it go
        pass


def test_a_waiting_hold_takes_the_folder_once_the_other_process_lets_go(tmp_path):
    # how a kdml reproduce waits for another to write their shared report, or to finish a run
    lock = tmp_path / "runs" / ".reproduce.lock"
    with held_by_another_process(lock) as holder:
        threading.Timer(0.5, holder.kill).start()
        with hold_folder(lock, "busy", wait=True):
            holder.join(timeout=5)
            assert holder.exitcode == -signal.SIGKILL  # held until it was killed


def test_a_folder_holding_only_a_lock_file_takes_a_new_run(tmp_path, tiny_overrides):
    out = tmp_path / "run"
    with RunFolder(out).held():  # as a run that stopped before writing its config leaves it
        pass
    assert [path.name for path in out.iterdir()] == [".training.lock"]
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", *tiny_overrides, "train.epochs=1",
                     "train.steps_per_epoch=1"]) == 0


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


def test_a_new_run_never_writes_over_one_started_since_its_folder_was_checked(
        tmp_path, tiny_overrides, trained_run):
    from kdml.config import resolve_config
    from kdml.training.recipes import get_recipe
    from kdml.training.trainer import train

    recipe = get_recipe("amsoftmax")
    config = resolve_config(recipe.name, recipe.params, recipe.defaults,
                            {"data": {"dataset": "digits"}}, [*tiny_overrides, "train.epochs=1"])
    out = tmp_path / "run"
    shutil.copytree(trained_run, out)  # the run trained there with this config meanwhile
    before = (out / "config.yaml").read_text()
    with pytest.raises(KdmlError, match="already holds a run"):
        train(config, out, progress=False, echo=lambda line: None)  # as if its check was passed
    assert (out / "config.yaml").read_text() == before


# ------------------------------------------------------------------ a run without a checkpoint


STALE_EVENTS = "events.out.tfevents.1795482618.host.123.0"  # a TensorBoard events file's name


def stale_run(folder: Path) -> Path:
    """``folder`` as a run that stopped in its first epoch leaves it: config, log, events and
    lock file, no checkpoint."""
    from kdml.config import resolve_config, save_config
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("amsoftmax")
    with RunFolder(folder).held():
        pass
    save_config(resolve_config(recipe.name, recipe.params, recipe.defaults),
                folder / "config.yaml")
    (folder / "train.log").write_text("2026-01-01 10:00:00,000 start epoch 1 of 10, device "
                                      "cpu, 901 train / 896 test samples\n")
    (folder / "tensorboard").mkdir()
    (folder / "tensorboard" / STALE_EVENTS).write_bytes(b"\0")
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_run_without_a_checkpoint_makes_way_for_a_new_run_and_only_its_files_go(tmp_path):
    out = stale_run(tmp_path / "run")
    check_new_run_folder(out)
    with RunFolder(out).held():  # as the trainer, which checks again holding the folder
        check_new_run_folder(out, held=True)
        assert start_afresh(out) == f"starting afresh: the run in {out} saved no checkpoint"
    assert [path.name for path in out.iterdir()] == [".training.lock"]  # held: never removed


def test_a_first_checkpoint_killed_while_written_makes_way_too(tmp_path):
    """A SIGKILL while the first checkpoint was written leaves save_checkpoint's partial file
    (no except clause runs): the run still saved no checkpoint, and its files go."""
    out = stale_run(tmp_path / "run")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / ".last.pt.0q9ai83d.tmp").write_bytes(b"")
    check_new_run_folder(out)
    with RunFolder(out).held():
        assert start_afresh(out) == f"starting afresh: the run in {out} saved no checkpoint"
    assert [path.name for path in out.iterdir()] == [".training.lock"]


@pytest.mark.parametrize("extra", [
    "checkpoints/last.pt", "checkpoints/best.pt", "checkpoints/unscored.pt", "metrics.json",
    "plots/loss.png",
    "notes.txt", "tensorboard/notes.txt", "config.yaml", "train.log", "data.json",
    "checkpoints/.last.pt.notmine.tmp", "checkpoints/.last.pt.0q9ai83d.tmp.bak",
])
def test_a_run_folder_with_a_checkpoint_or_a_file_kdml_did_not_write_is_still_refused(
        tmp_path, extra):
    out = stale_run(tmp_path / "run")
    (out / extra).parent.mkdir(exist_ok=True)
    (out / extra).write_text("recipe: amsoftmax\n")  # the user's own config.yaml, train.log
    before = snapshot(out)
    if extra.startswith("checkpoints/") and extra.endswith(".pt"):
        message = r"already holds a run; continue it with 'kdml train --resume"
    else:  # it would have made way: the message had said it held a run, as if trained
        top = extra.split("/")[0]
        ours = top in ("config.yaml", "data.json", "train.log", "tensorboard", "checkpoints")
        example = "" if ours else f" (such as {top})"
        message = re.escape(f"holds a run that saved no checkpoint, beside files kdml did not "
                            f"write{example}, so a new run does not start afresh there")
    with pytest.raises(KdmlError, match=message):
        check_new_run_folder(out)
    assert start_afresh(out) is None
    assert snapshot(out) == before


def test_a_run_without_a_checkpoint_that_another_process_trains_is_refused(tmp_path):
    out = stale_run(tmp_path / "run")
    with held_by_another_process(RunFolder(out).lock_file), pytest.raises(
            KdmlError, match=f"^{out} is being trained by another process"):
        check_new_run_folder(out)
    check_new_run_folder(out)  # the kill let it go


def fail_in_the_first_epoch(failure: str, monkeypatch) -> list[str]:
    """The settings (and patches) of a run that fails in its first epoch, before any
    checkpoint: a setting found wrong only once scored, or a NaN loss."""
    if failure == "setting":  # refused before training since: as if only scoring found it
        from kdml.training import trainer

        def unscored(row, metric):
            raise KdmlError(f"train.select_metric={metric!r} is not scored by this run")

        monkeypatch.setattr(trainer, "check_scored", unscored)
        return ["train.keep_best=true", "data.validation=0.5", "data.samples_per_class=0"]
    from kdml.training.recipes.jrd import JRDMethod  # amsoftmax's too

    real_forward = JRDMethod.forward

    def poisoned(self, *args, **kwargs):
        output = real_forward(self, *args, **kwargs)
        output.loss = output.loss * float("nan")
        return output

    monkeypatch.setattr(JRDMethod, "forward", poisoned)
    return []


@pytest.mark.parametrize("failure", ["setting", "nan"])
def test_the_corrected_command_trains_where_a_run_failed_before_its_first_checkpoint(
        tmp_path, tiny_overrides, capsys, monkeypatch, failure):
    out = tmp_path / "run"
    command = ["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
               "--no-progress", *tiny_overrides, "train.epochs=1", "train.steps_per_epoch=1"]
    with monkeypatch.context() as patched:
        assert cli.main([*command, *fail_in_the_first_epoch(failure, patched)]) == 2
    assert not (out / "checkpoints").exists() and (out / "config.yaml").is_file()
    if failure == "nan":
        assert "no epoch finished, so the run folder holds no checkpoint" in (
            capsys.readouterr().err)
    capsys.readouterr()
    assert cli.main(command) == 0  # not "already holds a run"
    assert "select_metric: recall@1" in (out / "config.yaml").read_text()
    assert (out / "checkpoints" / "last.pt").is_file()
    # with a checkpoint, the folder is a run again: refused to a new run, as before
    assert cli.main(command) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_a_resumed_run_removes_the_partial_checkpoints_of_a_killed_session(tmp_path,
                                                                           trained_run):
    out = tmp_path / "run"
    shutil.copytree(trained_run, out)  # a tiny run of one epoch
    partial = out / "checkpoints" / ".last.pt.k1ll3d_x.tmp"  # as a kill mid-write leaves it
    partial.write_bytes(b"\0" * 64)
    mine = out / "checkpoints" / "notes.tmp"
    mine.write_text("mine")
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert not partial.exists() and mine.read_text() == "mine"


def test_starting_afresh_says_so_and_leaves_no_stale_events(tmp_path, tiny_overrides, capsys,
                                                            monkeypatch):
    out = tmp_path / "run"
    command = ["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
               "--no-progress", *tiny_overrides, "train.epochs=1", "train.steps_per_epoch=1"]
    assert cli.main([*command, *fail_in_the_first_epoch("setting", monkeypatch)]) == 2
    # the failed run's events, as a run that logged some before failing leaves them (this one
    # failed before TensorBoard wrote any)
    stale = out / "tensorboard" / STALE_EVENTS
    stale.write_bytes(b"\0")
    capsys.readouterr()
    assert cli.main(command) == 0
    assert f"starting afresh: the run in {out} saved no checkpoint" in capsys.readouterr().out
    events = list((out / "tensorboard").iterdir())
    assert len(events) == 1 and events != [stale]
    assert (out / "train.log").read_text().count("start epoch 1 of 1") == 1


def test_a_run_folder_not_named_in_utf8_is_refused_in_one_line(tmp_path, tiny_overrides,
                                                               capsys, trained_run):
    """TensorBoard encodes its paths as UTF-8: a run folder named with a Latin-1 byte (read as
    a surrogate) had stopped training with its UnicodeEncodeError traceback, the folder made.
    A new run is refused before anything is written; a run moved to such a folder, when
    resumed."""
    import os

    out = Path(os.fsdecode(bytes(tmp_path) + b"/f\xf6x"))
    args = ["train", "amsoftmax", "--dataset", "digits", "--no-progress", *tiny_overrides,
            "train.epochs=1"]
    assert cli.main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"kdml: error: the run folder {tmp_path}/f\\xf6x is not named in UTF-8, and "
                   "TensorBoard writes its event files under UTF-8 paths only: choose an --out "
                   "named in UTF-8\n")
    assert not out.exists()
    trained = tmp_path / "run"
    shutil.copytree(trained_run, trained)  # a tiny run of one epoch, trained as args say
    trained.rename(out)
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("epochs: 1", "epochs: 2"))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 2
    assert "rename the folder (or a folder above it) in UTF-8 and resume it there" in (
        capsys.readouterr().err)


def test_a_grid_folder_not_named_in_utf8_is_refused_before_it_is_made(tmp_path, capsys):
    import os

    config = tmp_path / "grid.yaml"
    config.write_text("recipe: amsoftmax\ngrid:\n  train.seed: [0, 1]\ntrain:\n  epochs: 1\n")
    out = Path(os.fsdecode(bytes(tmp_path) + b"/g\xf6"))
    assert cli.main(["train", "--config", str(config), "--dataset", "digits", "--out", str(out),
                     "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith(
        f"kdml: error: the grid folder {tmp_path}/g\\xf6 is not named in UTF-8")
    assert not out.exists()


def test_a_checkpoint_is_readable_as_the_runs_other_files_and_written_through_a_partial(
        tmp_path, monkeypatch):
    """mkstemp had made every checkpoint 0600: another user could read a run's metrics but
    not run kdml eval on it. Its partial file is one that partial_checkpoints finds (and a
    resumed run removes)."""
    import os

    from kdml.training import checkpoint

    renamed = []
    replace = os.replace
    monkeypatch.setattr(checkpoint.os, "replace",
                        lambda source, target: renamed.append(source) or replace(source, target))
    path = tmp_path / "checkpoints" / "last.pt"
    checkpoint.save_checkpoint({"epoch": 1}, path)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    (partial,) = renamed
    Path(partial).write_bytes(b"")  # as a SIGKILL mid-write leaves it
    assert checkpoint.partial_checkpoints(path.parent) == [Path(partial)]


def test_a_run_with_a_checkpoint_but_no_log_is_named_a_run_to_resume(tmp_path):
    """A run folder is a run by its config.yaml and a checkpoint even without train.log: the
    refusal says to resume it, not that the folder holds other files."""
    out = stale_run(tmp_path / "run")
    (out / "train.log").unlink()
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "last.pt").write_bytes(b"")
    with pytest.raises(KdmlError, match=r"already holds a run; continue it with 'kdml train "
                                        r"--resume"):
        check_new_run_folder(out)


@pytest.mark.parametrize("linked", ["train.log", "config.yaml"])
def test_a_run_without_a_checkpoint_whose_file_is_a_link_does_not_make_way(tmp_path, linked):
    """A link in the folder is not a file kdml wrote: the run is refused, and the link stays."""
    out = stale_run(tmp_path / "run")
    elsewhere = tmp_path / f"kept-{linked}"
    (out / linked).rename(elsewhere)
    (out / linked).symlink_to(elsewhere)
    with pytest.raises(KdmlError, match="holds a run that saved no checkpoint, beside files"):
        check_new_run_folder(out)
    assert start_afresh(out) is None
    assert (out / linked).is_symlink() and elsewhere.is_file()


def test_a_config_yaml_with_kdml_s_sections_in_another_order_is_not_kdml_s(tmp_path):
    """kdml writes config.yaml's sections in one order: the same sections in another are a file
    of the user's, which a new run must not remove."""
    import yaml

    out = stale_run(tmp_path / "run")
    values = yaml.safe_load((out / "config.yaml").read_text())
    reordered = dict(reversed(list(values.items())))
    (out / "config.yaml").write_text(yaml.safe_dump(reordered, sort_keys=False))
    before = snapshot(out)
    with pytest.raises(KdmlError, match="holds a run that saved no checkpoint"):
        check_new_run_folder(out)
    assert start_afresh(out) is None
    assert snapshot(out) == before


def test_a_run_without_a_checkpoint_whose_tensorboard_is_a_file_does_not_make_way(tmp_path):
    out = stale_run(tmp_path / "run")
    for event in (out / "tensorboard").iterdir():
        event.unlink()
    (out / "tensorboard").rmdir()
    (out / "tensorboard").write_text("my notes")
    with pytest.raises(KdmlError, match="holds a run that saved no checkpoint"):
        check_new_run_folder(out)
    assert start_afresh(out) is None
    assert (out / "tensorboard").read_text() == "my notes"


def test_an_out_that_is_a_file_or_lies_under_one_is_refused_saying_so(tmp_path):
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(KdmlError, match=r"is a file, not a folder; choose another --out$"):
        check_new_run_folder(tmp_path / "afile")
    with pytest.raises(KdmlError, match=f"^cannot make the run folder {tmp_path}/afile/run: "
                                        f"{tmp_path}/afile is a file$"):
        check_new_run_folder(tmp_path / "afile" / "run")


def test_an_out_that_cannot_be_written_is_refused_before_the_run(tmp_path, monkeypatch):
    """An --out that exists is checked itself, not the folder above it (as root, every folder
    is writable: the check is seen through os.access, as in test_out_in_an_unwritable_place)."""
    import os

    out = tmp_path / "out"
    out.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != out and real(path, mode))
    with pytest.raises(KdmlError, match=f"^cannot make the run folder {out}: {out} is not "
                                        "writable$"):
        check_new_run_folder(out)


def test_safe_name_collapses_each_run_of_other_characters_and_is_never_empty():
    from kdml.training.run_folder import safe_name

    assert safe_name("folder:/data/my  holiday   photos") == "folder-my-holiday-photos"
    assert safe_name("???") == "data"
    assert safe_name("..") == "data"


def test_a_default_run_folder_left_unused_goes_and_one_in_use_keeps_its_lock(tmp_path):
    from kdml.training.run_folder import LOCK_NAME, remove_if_unused

    unused = tmp_path / "unused"
    unused.mkdir()
    (unused / LOCK_NAME).write_text("")  # a refused run held it: still unused
    remove_if_unused(unused)
    assert not unused.exists()
    used = tmp_path / "used"
    used.mkdir()
    (used / LOCK_NAME).write_text("")
    (used / "config.yaml").write_text("recipe: jrd\n")
    remove_if_unused(used)
    assert sorted(path.name for path in used.iterdir()) == [LOCK_NAME, "config.yaml"]


@pytest.mark.parametrize("text", ["[]", "3", "null", '"x"', '{"final": 3, "epochs": "x"}',
                                  '{"final": [0.5], "epochs": [1, 2]}'])
def test_a_metrics_json_that_is_no_record_is_read_as_no_metrics(tmp_path, capsys, text):
    """JSON that is not kdml's metrics record (no object, or a final and epochs of other
    types) is read as no metrics, as unreadable JSON is: `kdml eval` of such a run without a
    checkpoint had stopped with an AttributeError traceback."""
    from kdml import cli
    from kdml.training.run_folder import RunFolder

    out = stale_run(tmp_path / "run")
    (out / "metrics.json").write_text(text)
    run = RunFolder(out)
    assert run.final_metrics() is None and run.history() == []
    capsys.readouterr()
    assert cli.main(["eval", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: no checkpoint at {out / 'checkpoints' / 'last.pt'}: "
                          "the run has not finished an epoch") and err.count("\n") == 1
