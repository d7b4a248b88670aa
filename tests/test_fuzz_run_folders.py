"""Run folders and the files the reading commands write, under a user's mishaps, as a fuzzing
session found them mishandled."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from kdml.cli.evaluate import EVAL_FIELDS
from kdml.errors import KdmlError
from kdml.evaluation.index import IndexInfo, build_index, load_index, search_index
from kdml.inspection.analysis import GENERALIZATION_FIELDS
from kdml.training.run_folder import METRICS_FIELDS, check_csv_replaceable, write_json


@pytest.mark.parametrize("fields, mine, older_kdml", [
    (EVAL_FIELDS, {"metrics": {"recall@1": 0.99}, "source": "paper, Table 2, transcribed"},
     {"epoch": 2, "metrics": {"recall@1": 0.5}}),
    (METRICS_FIELDS, {"final": "v3", "notes": "my own"},
     {"epochs": [], "final": {"recall@1": 0.5}}),
    (GENERALIZATION_FIELDS, {"settings": {"lr": 0.1}},
     {"settings": {}, "h_divergence": {}, "lambda": {}}),
], ids=["eval.json", "metrics.json", "generalization.json"])
def test_a_users_json_that_shares_a_field_with_kdmls_is_not_replaced(tmp_path, fields, mine,
                                                                      older_kdml):
    """A user's own file under a name kdml writes, sharing one field with kdml's (a "metrics"
    key, say), had been taken for kdml's and replaced (kdml eval's eval.json); one with every
    field kdml has always written there is kdml's, an older version's too (without the
    fields added since, "checkpoint" and "scored"), and is replaced."""
    path = tmp_path / "result.json"
    path.write_text(json.dumps(mine))
    ours = {**dict.fromkeys(fields, 1), "scored": "test"}
    with pytest.raises(KdmlError, match="is in the way and kdml did not write it"):
        write_json(ours, path, fields)
    assert json.loads(path.read_text()) == mine
    path.write_text(json.dumps(older_kdml))
    write_json(ours, path, fields)
    assert json.loads(path.read_text()) == ours


@pytest.mark.parametrize("name, text", [
    ("metrics.json", json.dumps({"epochs": [], "final": None})),
    ("metrics.csv", "epoch,train/loss\n1,0.5\n"),
])
def test_a_link_where_a_result_goes_is_kept_though_it_leads_to_kdml_s_own_file(tmp_path, name,
                                                                               text):
    """A link at a result's name is the user's (to another run's file, say): the rename would
    put a file in its place, so it is refused even where what it leads to is kdml's."""
    (tmp_path / "elsewhere").write_text(text)
    path = tmp_path / name
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(KdmlError, match="is in the way and kdml did not write it"):
        if name.endswith(".json"):
            write_json({"epochs": [], "final": None}, path, METRICS_FIELDS)
        else:
            check_csv_replaceable(path)
    assert path.is_symlink() and (tmp_path / "elsewhere").read_text() == text


def _index(folder: Path, seed: int) -> None:
    """An exact cosine index of 50 random 8-d vectors, 5 classes."""
    vectors = np.random.default_rng(seed).normal(size=(50, 8)).astype(np.float32)
    items = {"labels": (np.arange(50) + seed) % 5, "positions": np.arange(50),
             "sources": np.array([f"test[{i}]" for i in range(50)])}
    build_index(folder, vectors, items, IndexInfo(str(folder), "0" * 64, "cosine", 0, "exact",
                                                  0, 1.0))


@pytest.mark.parametrize("name", ["index.faiss", "items.npz"])
def test_a_file_copied_from_another_index_of_the_same_size_is_refused(tmp_path, name):
    """docs/inspecting.md: a faiss file copied from another index is refused as damaged. One
    of the same dimension, metric and count had been searched without a word (a query's own
    vector came back at cosine 0.19, not 1); items.npz of another index, its labels wrong."""
    _index(tmp_path / "a", seed=0)
    _index(tmp_path / "b", seed=1)
    shutil.copy(tmp_path / "b" / name, tmp_path / "a" / name)
    with pytest.raises(KdmlError) as refused:
        load_index(tmp_path / "a")
    assert str(refused.value) == (
        f"{tmp_path / 'a'} holds a damaged index ({name} is not the file it was built with (its "
        "sha256 differs from index.json's): a file copied from another index, or changed "
        "since); build it again with 'kdml index'")


def test_an_index_of_an_older_kdml_without_sha256_sums_is_searched(tmp_path):
    """An index.json written before the sums has none: its files are checked as before
    (dimension, metric, count) and searched."""
    _index(tmp_path / "a", seed=0)
    meta = tmp_path / "a" / "index.json"
    recorded = json.loads(meta.read_text())
    assert sorted(recorded.pop("files_sha256")) == ["index.faiss", "items.npz"]
    meta.write_text(json.dumps(recorded))
    query = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32)[7:8]
    scores, positions = search_index(load_index(tmp_path / "a"), query, 1)
    assert positions.tolist() == [[7]] and scores[0, 0] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_a_stop_just_after_an_epochs_checkpoint_waits_for_its_log_line(tmp_path, monkeypatch,
                                                                       stop):
    """A Ctrl-C or kill (SIGTERM) landing between an epoch's last.pt and its log line had left
    the epoch in last.pt but never in train.log or TensorBoard: --resume goes on after it. The
    stop now waits for the line, then stops the run as before (exit 130 or 143), and the
    resumed run logs every epoch once."""
    import signal

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from kdml import cli
    from kdml.training import recorder

    original = recorder.save_checkpoint

    def save_then_stop(state, path):
        original(state, path)
        if path.name == "last.pt" and state["epoch"] == 1:
            signal.raise_signal(getattr(signal, stop))

    monkeypatch.setattr(recorder, "save_checkpoint", save_then_stop)
    # the handler the console command sets (cli.main with argv None): under the default one
    # the signal would end the test process
    previous = signal.signal(signal.SIGTERM, cli._interrupt)
    # Python's Ctrl-C, also where the suite was started in the background of a shell without
    # job control, which starts it with SIGINT ignored
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    run = tmp_path / "run"
    try:
        assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run),
                         "--no-progress", "train.epochs=2", "train.steps_per_epoch=2",
                         "eval.nmi=false", "model.embedding_size=8", "train.device=cpu"]) == (
            130 if stop == "SIGINT" else 143)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    log = (run / "train.log").read_text()
    assert " epoch 1: " in log and " epoch 2" not in log
    said = "interrupted (Ctrl-C)" if stop == "SIGINT" else "terminated (SIGTERM)"
    assert log.endswith(f"stopped: {said}\n")
    monkeypatch.setattr(recorder, "save_checkpoint", original)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    log = (run / "train.log").read_text()
    assert log.count(" epoch 1: ") == 1 and log.count(" epoch 2: ") == 1
    steps = []
    for events in sorted((run / "tensorboard").iterdir()):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        steps += [event.step for event in accumulator.Scalars("train/loss")]
    assert sorted(steps) == [1, 2]


# "unscored": moved before an epoch that is not scored (train.eval_every=3), whose checkpoint
# is the first write after the move (a scored epoch's unscored.pt comes before it)
@pytest.mark.parametrize("how", ["moved", "deleted", "moved unscored"])
def test_a_run_folder_moved_while_training_is_not_made_again_at_its_old_path(
        tmp_path, monkeypatch, capsys, how):
    """The user moves (or deletes) the folder of a run that is still training: the run had
    made a new, half one at the old path (checkpoints, metrics and plots, no config.yaml, so
    no command opens it) and stopped with TensorBoard's thread traceback and a b'...' path.
    It stops in one line now, writing nothing there, and the moved folder resumes."""
    from kdml import cli
    from kdml.training import recorder

    run, moved = tmp_path / "run", tmp_path / "moved"
    original = recorder.Recorder.epoch

    def epoch_then_move(self, row, *args, **kwargs):
        original(self, row, *args, **kwargs)
        if row["epoch"] == 1:
            if how.startswith("moved"):
                run.rename(moved)
            else:
                # TensorBoard's writer thread appends by opening its events file again, which
                # may make it anew in the folder rmtree is emptying ("Directory not empty",
                # seen once on a loaded machine): what it has queued is written first
                if self.writer is not None:
                    self.writer.flush()
                shutil.rmtree(run)

    monkeypatch.setattr(recorder.Recorder, "epoch", epoch_then_move)
    settings = ["--no-progress", "train.epochs=3", "train.steps_per_epoch=2", "eval.nmi=false",
                "model.embedding_size=8", "train.device=cpu",
                f"train.eval_every={3 if how == 'moved unscored' else 1}"]
    capsys.readouterr()
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run),
                     *settings]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: the run folder {run} was moved or deleted while the run trained, so "
        "nothing more is written; a moved folder keeps the epochs trained before: continue "
        "with kdml train --resume NEW_FOLDER\n")
    assert not run.exists()
    if how.startswith("moved"):
        assert (moved / "train.log").read_text().endswith(
            "was moved or deleted while the run trained, so nothing more is written; a moved "
            "folder keeps the epochs trained before: continue with kdml train --resume "
            "NEW_FOLDER\n")
        monkeypatch.setattr(recorder.Recorder, "epoch", original)
        assert cli.main(["train", "--resume", str(moved), "--no-progress"]) == 0
        assert [line.split(",")[0] for line in
                (moved / "metrics.csv").read_text().splitlines()[1:]] == ["1", "2", "3"]


def test_a_link_already_at_the_hidden_name_is_never_written_through(tmp_path, monkeypatch):
    """The hidden file is created exclusively: a link someone left at its name (pid and token
    alike) is refused as taken, and the file it points to is not written."""
    from kdml import file_write

    monkeypatch.setattr(file_write.secrets, "token_hex", lambda size: "feed")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / f".config.{os.getpid()}.feed.yaml").symlink_to(victim)
    with pytest.raises(FileExistsError):
        file_write.write_through_new_file(tmp_path / "config.yaml",
                                          lambda partial: partial.write_text("new"))
    assert victim.read_text() == "keep"
    assert not (tmp_path / "config.yaml").exists()
    assert (tmp_path / f".config.{os.getpid()}.feed.yaml").is_symlink()  # not kdml's to remove


def _small_index_args():
    from kdml.evaluation.index import IndexInfo

    vectors = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    items = {"labels": np.arange(6), "positions": np.arange(6),
             "sources": np.array([f"v[{i}]" for i in range(6)])}
    return vectors, items, IndexInfo("run", "x", "euclidean", 0, "exact", 0, 1.0)


def test_a_folder_already_at_the_index_s_hidden_name_is_refused_and_kept(tmp_path,
                                                                         monkeypatch):
    """Something at the hidden build folder's name (pid and token alike) is not kdml's: the
    build is refused in one line and the folder and its file are left as they were."""
    from kdml.evaluation import index

    monkeypatch.setattr(index.secrets, "token_hex", lambda size: "feed")
    theirs = tmp_path / f".index.partial-{os.getpid()}.feed"
    theirs.mkdir()
    (theirs / "mine.txt").write_text("keep")
    with pytest.raises(KdmlError, match="in the way"):
        index.build_index(tmp_path / "index", *_small_index_args())
    assert (theirs / "mine.txt").read_text() == "keep"


def test_a_full_disk_while_an_index_is_built_names_the_folder_asked_for(tmp_path, monkeypatch):
    """A full disk while items.npz is written into the hidden build folder is an OSError about
    INDEX/items.npz (the CLI's one line), and no hidden folder stays behind."""
    import errno

    from kdml.evaluation import index

    def full_disk(path, **arrays):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(index.np, "savez", full_disk)
    with pytest.raises(OSError) as raised:
        index.build_index(tmp_path / "index", *_small_index_args())
    assert raised.value.filename == str(tmp_path / "index" / "items.npz")
    assert sorted(tmp_path.iterdir()) == []


def test_an_error_about_a_file_inside_a_hidden_partial_folder_names_the_folder_asked_for():
    """An index is built in a hidden folder beside the one asked for: a full disk while its
    items.npz was written names that file in the folder asked for, not in the hidden one, whose
    random name the user never made; an error about another file, or the hidden name already
    taken, is left as it is."""
    import errno

    from kdml.file_write import error_about

    folder, partial = Path("/runs/r/index"), Path("/runs/r/.index.partial-7.ab12")
    inside = OSError(errno.ENOSPC, "No space left on device", str(partial / "items.npz"))
    mapped = error_about(inside, folder, partial)
    assert (mapped.errno, mapped.filename) == (errno.ENOSPC, str(folder / "items.npz"))
    other = OSError(errno.EACCES, "Permission denied", "/runs/r/other")
    assert error_about(other, folder, partial) is other
    # something already at the hidden name: about the hidden name, not the folder asked for
    taken = FileExistsError(errno.EEXIST, "File exists", str(partial))
    assert error_about(taken, folder, partial) is taken


def test_a_file_system_error_about_a_bytes_path_names_it_as_text(monkeypatch, capsys):
    """TensorBoard's writer raises its errors with the path as bytes: the one line had shown
    it as b'/runs/x/tensorboard/...'."""
    import errno

    from kdml import cli

    def full_disk(args):
        raise OSError(errno.ENOSPC, "No space left on device", b"/runs/r\xc3\xa9/events")

    monkeypatch.setitem(cli._COMMANDS, "recipes", full_disk)
    assert cli.main(["recipes"]) == 2
    assert capsys.readouterr().err.startswith(
        "kdml: error: /runs/ré/events: No space left on device; free space on its disk")


def test_an_index_folder_that_does_not_exist_is_named_so(tmp_path):
    """--index at a folder that does not exist had been called "not a kdml index (no
    index.json)", as if something were there; a folder without index.json still is."""
    with pytest.raises(KdmlError) as refused:
        load_index(tmp_path / "nothing")
    assert str(refused.value) == (f"no such index folder: {tmp_path / 'nothing'}; build one "
                                  "with 'kdml index RUN_DIR --out DIR'")
    with pytest.raises(KdmlError, match="is not a kdml index"):
        load_index(tmp_path)


def test_an_out_that_is_a_link_to_nothing_is_named_so(tmp_path, capsys):
    """--out at a dangling link had been refused as "cannot make the folder X: File exists",
    where nothing exists."""
    from kdml import cli

    (tmp_path / "runs").symlink_to(tmp_path / "gone")
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out",
                     str(tmp_path / "runs"), "--no-progress", "train.epochs=1"]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: cannot make the folder {tmp_path / 'runs'}: it is a link to "
        f"{tmp_path / 'gone'}, which does not exist; make that folder, or remove the link\n")


def _longest_name(folder: Path) -> int:
    return os.pathconf(folder, "PC_NAME_MAX")


def test_a_file_whose_name_fits_is_written_though_its_hidden_partial_s_would_not(tmp_path):
    """write_through_new_file's hidden partial adds ".PID.TOKEN" to the name: an --out whose
    name the file system takes (245 of its 255 bytes) had been refused as "File name too
    long", by the unlink of a partial that was never made."""
    from kdml.file_write import write_through_new_file

    path = tmp_path / ("x" * (_longest_name(tmp_path) - 10) + ".npz")
    assert write_through_new_file(path, lambda partial: partial.write_bytes(b"ok")) == path
    assert path.read_bytes() == b"ok" and list(tmp_path.iterdir()) == [path]
    too_long = tmp_path / ("y" * _longest_name(tmp_path) + ".npz")
    with pytest.raises(OSError) as refused:  # a name too long for the disk is still refused
        write_through_new_file(too_long, lambda partial: partial.write_bytes(b"ok"))
    assert refused.value.filename == str(too_long)
    assert list(tmp_path.iterdir()) == [path]


def test_an_index_folder_whose_name_fits_is_built(tmp_path):
    """The same for build_index's hidden folder (".partial-PID.TOKEN" added to the name)."""
    folder = tmp_path / ("i" * (_longest_name(tmp_path) - 10))
    _index(folder, seed=0)
    assert load_index(folder).info.count == 50
    assert list(tmp_path.iterdir()) == [folder]


@pytest.mark.parametrize("edit", [
    lambda info: {"scale": info["scale"] * 3},
    lambda info: {"centre": [value + 1.0 for value in info["centre"]]},
], ids=["scale", "centre"])
def test_an_index_json_whose_search_values_were_edited_is_refused(tmp_path, edit):
    """A Euclidean index.json whose scale or centre was edited to other valid numbers (the
    faiss files and their sums unchanged) had been searched without a word: the queries were
    shifted and scaled otherwise than the indexed vectors, and a vector's own query no longer
    found it first. index.json keeps the sum of the values its search uses."""
    vectors = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32)
    items = {"labels": np.arange(50) % 5, "positions": np.arange(50),
             "sources": np.array([f"test[{i}]" for i in range(50)])}
    folder = tmp_path / "index"
    build_index(folder, vectors + 5, items, IndexInfo(str(folder), "0" * 64, "euclidean", 0,
                                                      "exact", 0, 1.0))
    meta = folder / "index.json"
    info = json.loads(meta.read_text())
    meta.write_text(json.dumps({**info, **edit(info)}))
    with pytest.raises(KdmlError) as refused:
        load_index(folder)
    assert str(refused.value) == (
        f"{folder} holds a damaged index (index.json's metric, dim, kind, count, scale, charts "
        "or centre differ from those it was built with); build it again with 'kdml index'")


def test_an_index_given_as_its_index_json_is_refused_as_a_file(tmp_path):
    """--index FOLDER/index.json (the file, not its folder) had been refused as "not a kdml
    index (no index.json)", naming the very file it said was missing."""
    _index(tmp_path / "a", seed=0)
    with pytest.raises(KdmlError) as refused:
        load_index(tmp_path / "a" / "index.json")
    assert str(refused.value) == (
        f"{tmp_path / 'a' / 'index.json'} is a file; an index is the folder 'kdml index' "
        f"wrote: give {tmp_path / 'a'}")
