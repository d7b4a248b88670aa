"""A stop (Ctrl-C, SIGTERM, SIGKILL) at an unlucky moment: nothing is left behind that blocks
the next command, and no hidden partial outlives a stop that kdml caught."""

from __future__ import annotations

import numpy as np
import pytest

from kdml import cli, file_write
from kdml.evaluation import index as index_module
from kdml.training import recorder


def test_a_run_stopped_between_its_config_and_its_log_makes_way_for_the_same_command(
        tmp_path, tiny_overrides, capsys, monkeypatch):
    """A new run writes config.yaml and data.json, then (about 50 ms later on digits) opens
    train.log. A kill in between (SIGKILL, or SIGTERM/Ctrl-C, which leave the same files)
    left a folder that the same command refused as "a folder with other files in it", though
    every file in it is kdml's and the run saved no checkpoint: README says such a run "does
    not block the corrected command: a new run into its folder starts afresh"."""
    out = tmp_path / "run"
    command = ["train", "amsoftmax", "--dataset", "digits", "--out", str(out), "--no-progress",
               *tiny_overrides, "train.epochs=1"]

    def killed_here(path):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(recorder, "run_logging", killed_here)
        assert cli.main(command) == 130
    assert sorted(path.name for path in out.iterdir()) == [".training.lock", "config.yaml",
                                                           "data.json"]
    capsys.readouterr()
    assert cli.main(command) == 0, capsys.readouterr().err


def test_a_stop_just_after_the_partial_file_is_made_leaves_no_hidden_file(tmp_path,
                                                                         monkeypatch):
    """write_through_new_file makes its hidden partial (O_EXCL) before the ``try`` that
    removes it on a stop: a Ctrl-C or SIGTERM (the CLI raises it as KeyboardInterrupt) that
    lands between the two left an empty ``.NAME.PID.XXXX.json`` (seen with a SIGTERM to
    ``kdml analyze generalization``), though docs/inspecting.md says a stopped command
    "leaves nothing behind"."""
    real_close = file_write.os.close
    calls = []

    def close_then_stop(handle):
        real_close(handle)
        if not calls:
            calls.append(handle)
            raise KeyboardInterrupt

    monkeypatch.setattr(file_write.os, "close", close_then_stop)
    with pytest.raises(KeyboardInterrupt):
        file_write.write_through_new_file(tmp_path / "generalization.json",
                                          lambda partial: partial.write_text("{}"))
    monkeypatch.undo()
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_a_stop_just_after_the_hidden_index_folder_is_made_leaves_nothing(tmp_path,
                                                                          monkeypatch):
    """build_index made its hidden folder (mkdtemp), then set its mode, before the ``try``
    that removes it: a SIGTERM there (seen with ``kdml index``, exit 143, 'kdml: terminated')
    left an empty ``.idx.partial-XXXX/`` beside the index, which docs/inspecting.md says only
    SIGKILL leaves. Here the stop comes the moment the folder exists."""
    from pathlib import Path

    make = Path.mkdir

    def made_then_stopped(self, *args, **kwargs):
        make(self, *args, **kwargs)
        if self.name.startswith(".idx.partial-"):
            raise KeyboardInterrupt

    monkeypatch.setattr(Path, "mkdir", made_then_stopped)
    info = index_module.IndexInfo(run=str(tmp_path), checkpoint_sha256="0" * 64,
                                  metric="cosine", dim=0, kind="exact", count=0, scale=1.0)
    embeddings = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    with pytest.raises(KeyboardInterrupt):
        index_module.build_index(tmp_path / "idx", embeddings,
                                 {"labels": np.arange(20)}, info)
    monkeypatch.undo()
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_a_run_killed_while_its_config_was_written_makes_way_for_the_same_command(
        tmp_path, tiny_overrides, capsys):
    """SIGKILL while save_config wrote config.yaml leaves only the lock and the hidden partial
    ``.config.PID.XXXX.yaml`` (kdml's own, made by write_through_new_file). The same command
    then said "--out ... is a folder with other files in it" (``ls`` shows none: the file is
    hidden) and ``--resume`` "is not a kdml run folder (no config.yaml)": the folder could be
    used only after the user found and deleted the hidden file."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".training.lock").write_text("")
    (out / ".config.10806.fd201ee2.yaml").write_text("recipe: amsoftmax\n")  # cut short
    command = ["train", "amsoftmax", "--dataset", "digits", "--out", str(out), "--no-progress",
               *tiny_overrides, "train.epochs=1"]
    assert cli.main(command) == 0, capsys.readouterr().err
    assert not (out / ".config.10806.fd201ee2.yaml").exists()  # kdml's: gone, not left hidden


def test_a_link_named_as_a_config_partial_is_not_taken_for_kdml_s(tmp_path):
    """Only a plain file at a partial's name is kdml's: a link there (to a file of the user's)
    keeps the folder from a new run, and start_afresh leaves it."""
    from kdml.errors import KdmlError
    from kdml.training.run_folder import check_new_run_folder, first_partials, start_afresh

    out = tmp_path / "run"
    out.mkdir()
    (tmp_path / "notes.yaml").write_text("mine")
    link = out / ".config.10806.fd201ee2.yaml"
    link.symlink_to(tmp_path / "notes.yaml")
    assert first_partials(out) == []
    with pytest.raises(KdmlError, match="is a folder with other files in it"):
        check_new_run_folder(out)
    assert start_afresh(out) is None
    assert link.is_symlink() and (tmp_path / "notes.yaml").read_text() == "mine"


def test_a_kill_as_the_command_exits_prints_no_traceback(tmp_path):
    """kdml's SIGTERM handler stays installed after main() returns, so a SIGTERM that lands
    while the interpreter exits (after ``kdml embed`` wrote its file, say: seen 2 ms after
    the partial appeared) raised Terminated inside an atexit callback of torch: "Exception
    ignored in atexit callback ... Traceback ... kdml.errors.Terminated" on stderr, and exit
    status 0. Here the atexit callback sends the SIGTERM itself, deterministically."""
    import subprocess
    import sys

    script = ("import atexit, os, signal, sys\n"
              "sys.argv = ['kdml', 'recipes']\n"
              "from kdml.cli import main\n"
              "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
              "sys.exit(main())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
