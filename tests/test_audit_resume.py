"""Crash safety and resume guards, case by case: the partial file of a write, the checkpoint's
loader, the settings ``--resume`` may change, the data fingerprint and the non-finite watch."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import kdml.file_write
from kdml.file_write import write_through_new_file


def test_a_link_where_the_partial_file_goes_is_never_written_through(tmp_path, monkeypatch):
    """The hidden partial is made with O_EXCL: a link planted at its name (the name is random,
    but a guessed one) makes the write fail rather than write through to the link's target."""
    monkeypatch.setattr(kdml.file_write.secrets, "token_hex", lambda size: "abcd1234")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    (tmp_path / f".eval.{os.getpid()}.abcd1234.json").symlink_to(victim)
    with pytest.raises(FileExistsError) as caught:
        write_through_new_file(tmp_path / "eval.json", lambda partial: partial.write_text("x"))
    assert victim.read_text() == "the user's" and not (tmp_path / "eval.json").exists()
    # the name taken is the partial's (random) one, not the file asked for
    assert caught.value.filename == str(tmp_path / f".eval.{os.getpid()}.abcd1234.json")


def test_the_partial_is_a_hidden_file_beside_the_file_asked_for(tmp_path):
    seen: list[Path] = []
    write_through_new_file(tmp_path / "a" / "Eval.JSON",
                           lambda partial: (seen.append(partial), partial.write_text("{}")))
    (partial,) = seen
    assert partial.parent == tmp_path / "a" and partial.name.startswith(".Eval.")
    assert partial.name.endswith(".json") and not partial.exists()
    assert [path.name for path in (tmp_path / "a").iterdir()] == ["Eval.JSON"]


def test_a_partial_that_cannot_be_made_is_named_by_the_file_asked_for(tmp_path, monkeypatch):
    def refused(path: object, *args: object) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(kdml.file_write.os, "open", refused)
    with pytest.raises(PermissionError) as caught:
        write_through_new_file(tmp_path / "eval.json", lambda partial: None)
    assert caught.value.filename == str(tmp_path / "eval.json")


def test_a_folder_under_a_dangling_link_or_a_file_is_refused_before_the_work(tmp_path):
    from kdml.errors import KdmlError
    from kdml.file_write import check_writable_folder

    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(KdmlError, match=r"/gone is not a folder; choose another --out$"):
        check_writable_folder(tmp_path / "gone" / "run")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(KdmlError, match=r"notes\.txt is not a folder; choose another --out$"):
        check_writable_folder(tmp_path / "notes.txt" / "run" / "plots")
    check_writable_folder(tmp_path / "new" / "run")  # made later, by the writer
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gone", "notes.txt"]


def test_a_file_written_through_a_partial_is_readable_as_any_new_file(tmp_path):
    """0666 less the umask, as open() makes files (mkstemp's 0600 would hide it from others)."""
    old = os.umask(0o022)
    try:
        path = write_through_new_file(tmp_path / "eval.json", lambda p: p.write_text("{}"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_dangling_link_in_the_way_of_a_new_file_is_kept_without_hard_links(tmp_path,
                                                                              monkeypatch):
    """Where the file system has no hard links, the check before the rename sees a link even
    when it points nowhere (a rename would replace the user's link)."""
    def no_links(source: object, destination: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(kdml.file_write.os, "link", no_links)
    target = tmp_path / "embeddings.npz"
    target.symlink_to(tmp_path / "nowhere.npz")
    with pytest.raises(FileExistsError):
        write_through_new_file(target, lambda partial: partial.write_text("kdml's"),
                               replace=False)
    assert target.is_symlink() and os.readlink(target) == str(tmp_path / "nowhere.npz")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["embeddings.npz"]


# --- checkpoints: what a resume reads back ----------------------------------------------------

def _state(epoch: int, **extra: object) -> dict[str, object]:
    return {"epoch": epoch, "method": {}, "optimizer": None, "history": [], "config": None,
            **extra}


def test_a_checkpoint_is_flushed_to_disk_before_it_is_renamed_into_place(tmp_path,
                                                                         monkeypatch):
    """A power loss after the rename must not leave an empty last.pt: fsync, then rename."""
    from kdml.training import checkpoint

    calls: list[str] = []
    real_fsync, real_replace = checkpoint.os.fsync, checkpoint.os.replace
    monkeypatch.setattr(checkpoint.os, "fsync",
                        lambda handle: (calls.append("fsync"), real_fsync(handle))[1])
    monkeypatch.setattr(checkpoint.os, "replace",
                        lambda *paths: (calls.append("replace"), real_replace(*paths))[1])
    checkpoint.save_checkpoint(_state(1), tmp_path / "last.pt")
    assert calls == ["fsync", "replace"]
    assert checkpoint.load_checkpoint(tmp_path / "last.pt")["epoch"] == 1


def test_only_kdml_s_own_partial_checkpoints_are_taken_for_partials(tmp_path):
    """partial_checkpoints names the files the next session removes: never a file of another
    name, nor a link, nor anything in a folder that is not there."""
    from kdml.training.checkpoint import partial_checkpoints

    assert partial_checkpoints(tmp_path / "checkpoints") == []
    own = tmp_path / ".last.pt.0a1b2c3d.tmp"
    own.write_bytes(b"half")
    for name in (".last.pt.user-notes.tmp", ".last.pt.0a1b2c3d9.tmp", ".other.pt.0a1b2c3d.tmp",
                 "last.pt.0a1b2c3d.tmp"):
        (tmp_path / name).write_bytes(b"the user's")
    (tmp_path / ".best.pt.00000000.tmp").symlink_to(tmp_path / "last.pt.0a1b2c3d.tmp")
    assert partial_checkpoints(tmp_path) == [own]


def test_every_partial_a_checkpoint_is_written_through_is_one_the_next_session_removes(
        tmp_path, monkeypatch):
    """A SIGKILL mid-write runs no ``except``: the next session finds the partial by its name
    (partial_checkpoints), so the name save_checkpoint gives must be one it finds."""
    from kdml.training import checkpoint

    opened: list[Path] = []
    real_open = checkpoint.os.open
    monkeypatch.setattr(checkpoint.os, "open", lambda name, *args: (
        opened.append(Path(name)), real_open(name, *args))[1])
    for name in ("last.pt", "best.pt", "unscored.pt"):
        checkpoint.save_checkpoint(_state(1), tmp_path / name)
    assert len(opened) == 3 and all(path.parent == tmp_path for path in opened)
    for partial in opened:  # as a kill would have left them
        partial.write_bytes(b"half")
    assert checkpoint.partial_checkpoints(tmp_path) == sorted(opened)


def test_a_link_where_a_partial_checkpoint_goes_is_never_written_through(tmp_path,
                                                                         monkeypatch):
    from kdml.training import checkpoint

    monkeypatch.setattr(checkpoint.secrets, "token_hex", lambda size: "abcd1234")
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"the user's")
    (tmp_path / ".last.pt.abcd1234.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        checkpoint.save_checkpoint(_state(1), tmp_path / "last.pt")
    assert victim.read_bytes() == b"the user's" and not (tmp_path / "last.pt").exists()


@pytest.mark.parametrize(("state", "message"), [
    # only the fields it lacks are named (all four had been, whichever were there)
    ({"method": {}, "optimizer": None, "history": []},
     r"is not a kdml checkpoint \(missing epoch\)$"),
    ([1, 2], r"is not a kdml checkpoint \(missing epoch, history, method, optimizer\)$"),
    # an epoch of another type had reached the trainer's epoch + 1 (a TypeError)
    (_state("3"), "its 'epoch' is a str, not what kdml writes"),
    (_state(True), "its 'epoch' is a bool, not what kdml writes"),
    (_state(1, optimizer=[1]), "its 'optimizer' is a list, not what kdml writes"),
    (_state(1, history={}), "its 'history' is a dict, not what kdml writes"),
    (_state(1, method=[]), "its 'method' is a list, not what kdml writes"),
])
def test_a_checkpoint_without_kdml_s_fields_is_refused_in_one_line(tmp_path, state, message):
    from kdml.errors import UnreadableCheckpoint
    from kdml.training.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(state, tmp_path / "last.pt")
    with pytest.raises(UnreadableCheckpoint, match=message):
        load_checkpoint(tmp_path / "last.pt")


def test_a_checkpoint_without_a_config_or_optimizer_loads(tmp_path):
    """A run of a kdml before it kept its config, or a PCA run (no optimizer), loads."""
    from kdml.training.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(_state(3), tmp_path / "last.pt")
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 3


def test_a_folder_where_the_checkpoint_goes_is_no_checkpoint(tmp_path):
    from kdml.errors import UnreadableCheckpoint
    from kdml.training.checkpoint import load_checkpoint

    (tmp_path / "run" / "checkpoints" / "last.pt").mkdir(parents=True)
    with pytest.raises(UnreadableCheckpoint, match="^no checkpoint at .*kdml train --resume "):
        load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")


def test_a_checkpoint_holding_other_objects_than_tensors_and_plain_data_is_not_loaded(
        tmp_path):
    """weights_only: a checkpoint is never unpickled into arbitrary objects (code could run)."""
    from fractions import Fraction

    import torch

    from kdml.errors import UnreadableCheckpoint
    from kdml.training.checkpoint import load_checkpoint

    torch.save(_state(1, extra=Fraction(1, 3)), tmp_path / "last.pt")
    with pytest.raises(UnreadableCheckpoint, match="is corrupt or unreadable"):
        load_checkpoint(tmp_path / "last.pt")


# --- what --resume may change -----------------------------------------------------------------

def _config():
    from kdml.config import RunConfig

    config = RunConfig(recipe="amsoftmax")
    config.eval.ks = [1, 2, 4]
    return config


@pytest.mark.parametrize("setting", ["train.epochs", "train.device", "data.num_workers",
                                     "eval.embed_batch_size", "data.on_bad_image",
                                     "train.compile", "train.eval_every",
                                     "train.flush_denormal", "data.root", "model.weights",
                                     "train.sharded_kernels", "model.sync_bn"])
def test_each_setting_the_docs_name_resumable_may_change(setting):
    from kdml.training.resume_settings import changed_settings

    config = _config()
    trained = config.to_dict()
    section, key = setting.split(".")
    trained[section][key] = "something else"
    assert changed_settings(trained, config) == []
    trained["train"]["seed"] = 7  # and one that may not
    assert changed_settings(trained, config) == ["train.seed 7 -> 0"]


def test_changed_settings_names_the_recipe_and_skips_what_one_side_lacks():
    from kdml.training.resume_settings import changed_settings, first_of

    config = _config()
    trained = config.to_dict()
    trained["optim"]["lr_milestones"] = (19, 39)  # YAML gives a list back for a tuple
    config.optim.lr_milestones = [19, 39]
    trained["optim"]["a_setting_kdml_removed"] = 1
    trained["a_section_kdml_removed"] = {"x": 1}
    assert changed_settings(trained, config) == []
    trained["recipe"] = "triplet"
    trained["optim"]["lr"] = 0.1
    changed = changed_settings(trained, config)
    assert changed == ["recipe 'triplet' -> 'amsoftmax'", "optim.lr 0.1 -> 0.001"]
    assert first_of(changed) == "recipe 'triplet' -> 'amsoftmax' (and 1 more)"
    assert first_of(changed[:1]) == "recipe 'triplet' -> 'amsoftmax'"


def test_a_simclr_run_may_move_its_weights_file_but_not_drop_or_add_one():
    """model.weights is resumable (the checkpoint holds the weights), but for the SimCLR
    recipes given or not decides the inputs' normalisation: only that change is named."""
    from kdml.config import RunConfig
    from kdml.training.resume_settings import changed_settings

    for recipe, named in (("simclr", True), ("msimclr", True), ("amsoftmax", False)):
        config = RunConfig(recipe=recipe)
        trained = config.to_dict()
        trained["model"]["weights"] = "/old/place/resnet.pth"
        config.model.weights = "/new/place/resnet.pth"
        assert changed_settings(trained, config) == []
        config.model.weights = ""
        changed = changed_settings(trained, config)
        assert bool(changed) == named, recipe
        assert all(line.startswith("model.weights '/old/place/resnet.pth' -> ''")
                   for line in changed)


def test_a_path_named_dataset_may_move_but_not_change_its_kind():
    from kdml.training.resume_settings import changed_settings

    config = _config()
    config.data.dataset = "folder:/new/place/photos"
    trained = config.to_dict()
    trained["data"]["dataset"] = "folder:photos"  # relative then, absolute now
    assert changed_settings(trained, config) == []
    config.data.dataset = "csv:/new/place/photos.csv"
    trained["data"]["dataset"] = "csv:photos.csv"
    assert changed_settings(trained, config) == []
    config.data.dataset = "npz:/new/place/features.npz"
    trained["data"]["dataset"] = "npz:features.npz"
    assert changed_settings(trained, config) == []
    config.data.dataset = "folder:/new/place/photos"
    trained["data"]["dataset"] = "csv:photos.csv"
    assert changed_settings(trained, config) == [  # the paths as written, not 'csv:' alone
        "data.dataset 'csv:photos.csv' -> 'folder:/new/place/photos'"]


def test_a_hard_link_failing_for_another_reason_than_no_links_is_not_a_rename(tmp_path,
                                                                              monkeypatch):
    """Only a file system without hard links falls back to check-then-rename; another error
    (an I/O error, say) is the error, about the file asked for, and no partial stays."""
    def broken_link(source: object, destination: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(kdml.file_write.os, "link", broken_link)
    target = tmp_path / "embeddings.npz"
    with pytest.raises(OSError) as caught:
        write_through_new_file(target, lambda partial: partial.write_text("kdml's"),
                               replace=False)
    assert caught.value.errno == errno.EIO and caught.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []


# --- the checkpoint a resumed run continues from ----------------------------------------------

def _run(tmp_path: Path, last: int | None, unscored: dict[str, object] | None, config=None):
    from kdml.training.checkpoint import save_checkpoint
    from kdml.training.run_folder import RunFolder

    run = RunFolder(tmp_path / "run")
    trained = (config or _config()).to_dict()
    if last is not None:
        save_checkpoint(_state(last, config=trained), run.checkpoint)
    if unscored is not None:
        save_checkpoint(_state(config=trained, **unscored), run.unscored_checkpoint)
    return run


@pytest.mark.parametrize(("last", "unscored", "resumed"), [
    (2, {"epoch": 3, "unscored": {"row": {}, "over": False}}, 3),  # killed while scoring 3
    (None, {"epoch": 1, "unscored": {"row": {}, "over": False}}, 1),  # ... scoring epoch 1
    (2, {"epoch": 2, "unscored": {"row": {}, "over": False}}, 2),  # superseded by last.pt
    (2, {"epoch": 4, "unscored": {"row": {}, "over": False}}, 2),  # not the epoch after
    (2, {"epoch": 3}, 2),  # not marked as unscored
    (None, {"epoch": 2, "unscored": {"row": {}, "over": False}}, None),
])
def test_the_unscored_epoch_is_resumed_only_when_it_is_the_one_after_last_pt(
        tmp_path, last, unscored, resumed):
    from kdml.training.resume_state import resumed_state

    run = _run(tmp_path, last, unscored)
    state = resumed_state(run, _config())
    assert (state and state["epoch"]) == resumed
    assert run.unscored_checkpoint.exists() == (resumed is not None and resumed != last)


def test_an_edit_of_optim_train_or_eval_alone_is_refused_before_the_data(tmp_path):
    from kdml.errors import KdmlError
    from kdml.training.resume_state import resumed_state

    run = _run(tmp_path, 2, None)
    for section, key, value in [("optim", "lr", 0.1), ("train", "seed", 3),
                                ("eval", "nmi", False)]:
        config = _config()
        setattr(getattr(config, section), key, value)
        with pytest.raises(KdmlError, match=rf"was edited since its checkpoint: {section}\.{key} "):
            resumed_state(run, config)
    config = _config()
    config.optim.lr, config.model.embedding_size = 0.1, 32  # the model's shape too: told later
    assert resumed_state(run, config)["epoch"] == 2
    config.data.dataset = "digits"  # but another dataset is refused whatever else differs
    with pytest.raises(KdmlError, match="data.dataset 'mnist5k' -> 'digits'"):
        resumed_state(run, config)


def test_eval_ks_left_to_the_data_is_no_edit(tmp_path):
    from kdml.training.resume_state import resumed_state

    run = _run(tmp_path, 2, None)  # trained with ks [1, 2, 4], filled in from the data
    config = _config()
    config.eval.ks = []
    assert resumed_state(run, config)["epoch"] == 2


def test_recorded_unreadable_keeps_only_positions_that_fit_the_splits():
    from types import SimpleNamespace

    import torch

    from kdml.training.resume_state import recorded_unreadable

    splits = SimpleNamespace(test=[0] * 5, gallery=None)
    state = {"unreadable": {"test": torch.tensor([1, 4]), "gallery": torch.tensor([0]),
                            "train": torch.tensor([0])}}
    assert list(recorded_unreadable(state, splits)) == ["test"]
    state = {"unreadable": {"test": torch.tensor([5])}}
    assert recorded_unreadable(state, splits) == {}
    splits = SimpleNamespace(test=[0] * 5, gallery=[0] * 3)
    state = {"unreadable": {"gallery": torch.tensor([2])}}
    assert list(recorded_unreadable(state, splits)) == ["gallery"]
    state = {"unreadable": {"gallery": torch.tensor([3])}}
    assert recorded_unreadable(state, splits) == {}
    assert recorded_unreadable({}, splits) == {}


def test_an_unreadable_unscored_epoch_is_named_as_that_epoch_alone(tmp_path):
    """Its own words ("delete it and train again") would lose last.pt's epochs too."""
    from kdml.errors import KdmlError
    from kdml.training.resume_state import resumed_state

    run = _run(tmp_path, 2, None)
    run.unscored_checkpoint.write_bytes(b"half a checkpoint")
    with pytest.raises(KdmlError, match=r"unscored\.pt, an epoch trained but not yet scored, is "
                       "unreadable; delete it, and --resume trains that epoch again$"):
        resumed_state(run, _config())
    assert run.checkpoint.exists() and run.unscored_checkpoint.exists()


# --- plots: never over a file kdml did not draw -----------------------------------------------

def _png(path: Path, software: str | None) -> Path:
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    if software is not None:
        info.add_text("Software", software)
    Image.new("RGB", (2, 2)).save(path, pnginfo=info)
    return path


def test_only_a_png_with_kdml_s_own_mark_counts_as_marked(tmp_path):
    """drawn_by_kdml(marked=True) decides which PNGs kdml reproduce may delete: matplotlib's
    mark (a user's own figure) is replaceable, but never deleted."""
    from kdml import __version__
    from kdml.figure_file import drawn_by_kdml

    ours = _png(tmp_path / "ours.png", f"kdml {__version__}")
    old = _png(tmp_path / "old.png", "Matplotlib version3.8.0, https://matplotlib.org/")
    theirs = _png(tmp_path / "theirs.png", "GIMP 2.10")
    assert [drawn_by_kdml(path) for path in (ours, old, theirs)] == [True, True, False]
    assert [drawn_by_kdml(path, marked=True) for path in (ours, old, theirs)] == [True, False,
                                                                                  False]
    assert not drawn_by_kdml(tmp_path) and not drawn_by_kdml(tmp_path / "none.png")


def test_a_link_to_a_plot_kdml_drew_is_never_replaced(tmp_path):
    from matplotlib.figure import Figure

    from kdml import __version__
    from kdml.errors import KdmlError
    from kdml.figure_file import check_replaceable, write_png

    drawn = _png(tmp_path / "drawn.png", f"kdml {__version__}")
    link = tmp_path / "loss.png"
    link.symlink_to(drawn)
    for attempt in (lambda: write_png(Figure(), link), lambda: check_replaceable(link)):
        with pytest.raises(KdmlError, match="is in the way and kdml did not draw it"):
            attempt()
        assert link.is_symlink()
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(KdmlError, match="is in the way"):
        write_png(Figure(), tmp_path / "folder.png")


# --- the data fingerprint's difference, in words ----------------------------------------------

def _fingerprint(**parts: dict[str, object]) -> dict[str, object]:
    return {"data_fingerprint": 1, "folder": None, "parts": parts}


def _part(samples: int, classes: int, kind: str = "files", sha256: str = "a") -> dict:
    return {"samples": samples, "classes": classes, "kind": kind, "sha256": sha256}


def test_the_difference_names_the_first_part_that_differs_and_how():
    from kdml.data.fingerprint import fingerprint_difference

    then = _fingerprint(train=_part(6, 3), test=_part(4, 2))
    assert fingerprint_difference(then, _fingerprint(train=_part(6, 3), test=_part(4, 2))) is None
    assert fingerprint_difference(then, _fingerprint(train=_part(6, 2), test=_part(4, 2))) == (
        "its train part had 6 samples of 3 classes then and has 6 samples of 2 classes now")
    assert fingerprint_difference(then, _fingerprint(train=_part(6, 3, sha256="b"),
                                                     test=_part(5, 2))) == (
        "its train part has the same 6 samples of 3 classes but its files or labels differ")
    assert fingerprint_difference(
        _fingerprint(train=_part(6, 3, "array")),
        _fingerprint(train=_part(6, 3, "array", "b"))) == (
        "its train part has the same 6 samples of 3 classes but its samples or labels differ")
    assert fingerprint_difference(then, _fingerprint(train=_part(6, 3))) == (
        "its test part had 4 samples of 2 classes then and has none now")
    assert fingerprint_difference(then, _fingerprint(
        train=_part(6, 3), validation=_part(2, 1), test=_part(4, 2))) == (
        "its validation part had none then and has 2 samples of 1 class now")


# --- plots: the one warning of missing glyphs -------------------------------------------------

def test_exactly_as_many_missing_characters_as_shown_says_no_more():
    from kdml.figure_file import SHOWN_MISSING, missing_glyphs_message

    missing = {chr(0x4E00 + i): "DejaVu Sans" for i in range(SHOWN_MISSING)}
    message = missing_glyphs_message(Path("p.png"), missing)
    assert f"({', '.join(missing)}), which show" in message and "more" not in message


def test_a_character_warned_of_twice_keeps_the_font_named_first(caplog):
    import logging
    import warnings

    from kdml.figure_file import missing_glyphs_named

    with caplog.at_level(logging.WARNING), missing_glyphs_named(Path("p.png")):
        warnings.warn("Glyph 34924 (\\N{CJK UNIFIED IDEOGRAPH-886C}) missing from font(s) "
                      "DejaVu Sans.", UserWarning, stacklevel=1)
        warnings.warn("Glyph 34924 (\\N{CJK UNIFIED IDEOGRAPH-886C}) missing from font(s) "
                      "Noto Sans.", UserWarning, stacklevel=1)
    (record,) = [r for r in caplog.records if r.name == "kdml.plots"]
    assert "the plot's font (DejaVu Sans) has no glyph for 1 character" in record.getMessage()


def test_a_warning_of_another_category_that_looks_like_a_glyph_s_is_shown_as_it_was(caplog):
    import warnings

    from kdml.figure_file import missing_glyphs_named

    message = "Glyph 34924 (x) missing from font(s) DejaVu Sans."
    with pytest.warns(RuntimeWarning, match=r"^Glyph 34924"), missing_glyphs_named(
            Path("p.png")):
        warnings.warn(message, RuntimeWarning, stacklevel=1)
    assert [r for r in caplog.records if r.name == "kdml.plots"] == []


# --- choosing an epoch ------------------------------------------------------------------------

def test_a_score_of_zero_is_a_score():
    """Recall@1 of 0.0 (an untrained model on many classes) is still the best epoch so far:
    keep_best keeps it and patience counts from it."""
    from kdml.training.selection import best_epoch, evaluations_since_best, patience_exhausted

    history = [{"epoch": 1, "val/recall@1": 0.0}, {"epoch": 2, "val/recall@1": 0.0}]
    assert best_epoch(history, "recall@1") == 1
    assert evaluations_since_best(history, "recall@1") == 1
    assert patience_exhausted(history, "recall@1", 1)


def test_scored_prefix_follows_the_validation_part():
    from types import SimpleNamespace

    from kdml.training.selection import scored_prefix

    assert scored_prefix(SimpleNamespace(validation=0.2)) == "val"
    assert scored_prefix(SimpleNamespace(validation=0.0)) == "test"


# --- the non-finite watch ---------------------------------------------------------------------

def test_the_watch_names_the_first_term_that_went_infinite_whatever_the_order_of_the_terms():
    """An infinity is non-finite as NaN is; the culprit is the term that went bad first (not
    ``loss``, which every bad term makes bad), even when another goes bad before the read."""
    import torch

    from kdml.training.nonfinite import NonFiniteLoss, NonFiniteWatch

    inf, nan, ok = torch.tensor(float("inf")), torch.tensor(float("nan")), torch.tensor(1.0)
    watch = NonFiniteWatch(check_every=4)
    for step in range(4):  # reg goes infinite at step 2, aux NaN at step 3
        terms = {"loss": ok, "aux": nan if step >= 2 else ok, "reg": inf if step >= 1 else ok}
        terms["loss"] = terms["aux"] + terms["reg"]
        watch.observe(step, terms)
    with pytest.raises(NonFiniteLoss, match=r"^training stopped: the 'reg' term became NaN or "
                       r"infinite at epoch 3, step 2; the run folder keeps epoch 2's "):
        watch.check(epoch=3)


def test_a_watch_of_the_loss_alone_names_the_loss():
    import torch

    from kdml.training.nonfinite import NonFiniteLoss, NonFiniteWatch

    watch = NonFiniteWatch(check_every=1)
    watch.observe(0, {"loss": torch.tensor(1.0)})
    watch.check(epoch=1)  # finite: nothing
    watch.observe(1, {"loss": torch.tensor(float("-inf"))})
    with pytest.raises(NonFiniteLoss, match=r"the 'loss' term became NaN or infinite at epoch 1, "
                       r"step 2; no epoch finished"):
        watch.check(epoch=1)


def test_the_watch_is_read_after_every_check_every_steps_not_before_the_first():
    """NonFiniteWatch(50) (a GPU's) is due after steps 50, 100, ... (0-based 49, 99): reading
    it at step 0 too, one host sync more an epoch, had passed every test (on a CPU it is read
    every step)."""
    from kdml.training.nonfinite import NonFiniteWatch

    watch = NonFiniteWatch(50)
    assert [step for step in range(120) if watch.due(step)] == [49, 99]
    assert all(NonFiniteWatch(1).due(step) for step in range(3))


def test_the_steps_after_the_watch_s_last_read_are_checked_at_the_epoch_s_end(
        tmp_path, capsys, monkeypatch):
    """On a GPU the watch is read every 50 steps: the epoch's steps after its last read are read
    once more before the checkpoint. A term beside the loss (finite weights) that went
    infinite there would otherwise end the run with it in metrics.json."""
    import torch

    from kdml import cli
    from kdml.training import trainer
    from kdml.training.nonfinite import NonFiniteWatch

    class ReadRarely(NonFiniteWatch):  # as on a GPU, with fewer steps than its reads' interval
        def __init__(self, check_every: int, precision: str = "fp32") -> None:
            super().__init__(1000, precision)

    real_build = trainer.build_method

    def with_an_infinite_term(*args, **kwargs):
        method = real_build(*args, **kwargs)

        def infinite_aux(module, inputs, output):
            if module.training:
                output.terms["aux"] = torch.tensor(float("inf"))

        method.register_forward_hook(infinite_aux)
        return method

    monkeypatch.setattr(trainer, "NonFiniteWatch", ReadRarely)
    monkeypatch.setattr(trainer, "build_method", with_an_infinite_term)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", "train.epochs=1", "train.steps_per_epoch=2",
                     "data.batch_size=20", "model.embedding_size=8", "eval.nmi=false",
                     "train.device=cpu"]) == 2
    assert "the 'aux' term became NaN or infinite at epoch 1, step 1" in capsys.readouterr().err
    assert not (out / "checkpoints" / "last.pt").exists()


# --- the data fingerprint ---------------------------------------------------------------------

def _files(root: str, labels: list[int]):
    import numpy as np
    import torch

    from kdml.data.images import ImageFiles

    paths = [f"{root}/c{label}/{number}.jpg" for number, label in enumerate(labels)]
    return ImageFiles("folder:x", "", np.asarray(paths), torch.tensor(labels))


def test_a_moved_folder_matches_whatever_the_order_of_its_files():
    """The folder cut off every path is the one holding all of a part's files, not the one
    its first and last file share (c0/ here, where c1/ lies between them)."""
    from kdml.data.fingerprint import data_fingerprint, fingerprint_difference
    from kdml.data.splits import make_splits

    labels = [0, 1, 1, 0, 2, 3, 3, 2]
    here = data_fingerprint(make_splits(_files("/data/sets", labels), {}, "class-disjoint"))
    moved = data_fingerprint(make_splits(_files("/mnt", labels), {}, "class-disjoint"))
    assert here["folder"] == "/data/sets" and moved["folder"] == "/mnt"
    assert fingerprint_difference(here, moved) is None


def test_float32_features_a_last_bit_apart_are_the_same_data():
    """Features stored as float32 (an npz of PCA features) differ in their last bits from one
    BLAS to another: within the 8 bits cleared, the digest is the same."""
    import numpy as np
    import torch

    from kdml.data.dataset import ArrayDataset
    from kdml.data.fingerprint import data_fingerprint
    from kdml.data.splits import make_splits

    labels = [0, 0, 1, 1, 2, 2, 3, 3]
    x = torch.tensor([[1.0 + i / 16, 2.0, 3.0] for i in range(8)], dtype=torch.float32)
    nudged = torch.from_numpy(np.nextafter(x.numpy(), np.float32(np.inf)))
    assert not torch.equal(x, nudged)

    def digest(features: torch.Tensor) -> dict:
        return data_fingerprint(make_splits(ArrayDataset("mnist", "", features,
                                                         torch.tensor(labels)), {},
                                            "class-disjoint"))["parts"]

    assert digest(nudged) == digest(x)
    assert digest(x * 1.001)["train"] != digest(x)["train"]


def test_the_folder_said_is_the_one_holding_every_part():
    from kdml.data.fingerprint import data_fingerprint
    from kdml.data.splits import make_splits

    dataset = _files("/data/sets", [0, 0, 1, 1, 2, 2, 3, 3])
    dataset.paths = np.asarray([path.replace("/c0/", "/a/c0/").replace("/c1/", "/a/c1/")
                                .replace("/c2/", "/b/c2/").replace("/c3/", "/b/c3/")
                                for path in dataset.paths.tolist()])
    recorded = data_fingerprint(make_splits(dataset, {}, "class-disjoint"))
    assert recorded["folder"] == "/data/sets" and set(recorded["parts"]) == {"train", "test"}


def test_a_setting_an_old_checkpoint_lacks_is_compared_with_the_value_it_trained_with():
    """A checkpoint trained before kdml had ``method.joint_views`` or ``data.validation`` lacks
    the key, but its run computed with a known value (ADDED_BEFORE_FORMAT): the line added to
    its config.yaml (``joint_views: false``, ``validation: 0.2``) had been skipped as a
    setting the checkpoint does not have, and --resume went on with the other computation
    (another split) without a word."""
    from kdml.config import RunConfig
    from kdml.training.recipes.atlas import MSimCLRParams
    from kdml.training.resume_settings import changed_settings

    config = RunConfig(recipe="msimclr", method=MSimCLRParams())
    trained = config.to_dict()
    for section, key in (("method", "joint_views"), ("data", "validation"),
                         ("train", "keep_best")):
        del trained[section][key]  # a checkpoint from before these settings
    config.method.joint_views = True  # what those runs computed with: not an edit
    assert changed_settings(trained, config) == []
    config.method.joint_views = False
    config.data.validation = 0.2
    assert changed_settings(trained, config) == ["data.validation 0.0 -> 0.2",
                                                 "method.joint_views True -> False"]
    config.data.validation = 0.0
    config.train.flush_denormal = True  # resumable, known or not
    del trained["train"]["flush_denormal"]
    assert changed_settings(trained, config) == ["method.joint_views True -> False"]


def test_a_weights_change_of_a_recipe_kdml_no_longer_has_is_left_to_the_recipe_check():
    """Whether the inputs follow model.weights is asked of the recipe; one kdml no longer has
    is refused by the recipe check, so its dropped weights file is no change of its own (a
    mutation audit: answering "follows" there had passed every test)."""
    from kdml.config import RunConfig
    from kdml.training.resume_settings import changed_settings

    config = RunConfig(recipe="a-recipe-kdml-removed")
    trained = config.to_dict()
    trained["model"]["weights"] = "/old/place/resnet.pth"
    assert changed_settings(trained, config) == []
