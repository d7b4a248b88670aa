"""Damaged or unexpected dataset files and paths: each stops with one line that says what was
wrong and what to do (a class folder whose name is not UTF-8 is read, not refused)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from fixtures_array_sets import make_csv_list, make_image_folder
from fixtures_photo_sets import make_cub, make_inshop

from kdml import cli
from kdml.data.domains import load_domain_data
from kdml.data.fingerprint import data_fingerprint
from kdml.data.formats.cub import load_cub
from kdml.data.formats.inshop import load_inshop
from kdml.data.images import ImageFiles
from kdml.data.registry import open_dataset
from kdml.data.splits import DataSplits
from kdml.errors import KdmlError


def refusal(dataset: str) -> str:
    """The one-line error that reading ``dataset`` stops with."""
    with pytest.raises(KdmlError) as raised:
        open_dataset(dataset)
    message = str(raised.value)
    assert "\n" not in message
    return message


def named_splits(class_names: dict[int, str]) -> DataSplits:
    """Two files of two classes named ``class_names``, as both the train and the test part."""
    paths = [f"/data/{class_names[label]}/{label}.jpg" for label in (0, 1)]
    files = ImageFiles("t", "two files", np.asarray(paths), torch.tensor([0, 1]),
                       class_names=class_names)
    return DataSplits(files, files, [0, 1])


# ----------------------------------------------------------------------------- class names


def test_fingerprint_of_utf8_class_names_is_unchanged():
    """Existing runs' data.json must still match: the digest of UTF-8 names (accents, CJK) is
    the one kdml wrote before names that are not UTF-8 were read."""
    parts = data_fingerprint(named_splits({0: "föx", 1: "日本"}))["parts"]
    assert parts["train"]["sha256"] == (
        "0289926c0e05fa671ea246dc7600a64c68f13286f0aa81dd0ffb6deb75deaf54")


def test_fingerprint_of_a_class_name_that_is_not_utf8():
    """A name holding surrogates (bytes that are not UTF-8, as Python reads a file name) is
    hashed by its bytes, and differs from another such name."""
    first = data_fingerprint(named_splits({0: "f\udcf6x", 1: "cat"}))["parts"]["train"]
    second = data_fingerprint(named_splits({0: "f\udce4x", 1: "cat"}))["parts"]["train"]
    assert first["sha256"] != second["sha256"]


def test_folder_class_whose_name_is_not_utf8(tmp_path):
    """A class folder named in Latin-1 (an old Windows zip) is read; its name is shown with
    its byte escaped, so captions, tables and data.json can all hold it."""
    images = make_image_folder(tmp_path, classes=2, per_class=2, size=8)
    try:
        os.rename(os.fsencode(images / "c01"), os.fsencode(images) + b"/f\xf6x")
    except OSError:  # a file system that takes UTF-8 names only (macOS)
        pytest.skip("this file system refuses names that are not UTF-8")
    parts = open_dataset(f"folder:{images}")
    assert parts.dataset.class_names == {0: "c00", 1: "f\\xf6x"}
    assert os.path.isfile(parts.dataset.paths[-1])  # the file itself is still read
    splits = DataSplits(parts.dataset, parts.dataset, [0, 1])
    assert data_fingerprint(splits)["parts"]["train"]["classes"] == 2


# ----------------------------------------------------------------------------- paths


@pytest.mark.parametrize("prefix", ["folder:", "csv:"])
def test_path_that_is_a_symlink_loop(tmp_path, prefix):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    message = refusal(f"{prefix}{tmp_path / 'a'}")
    assert message.startswith(f"{prefix}a: ") and "symbolic link in a loop" in message


@pytest.mark.parametrize(("name", "hint"), [
    ("list.csv", "--dataset csv:"), ("features.npz", "--dataset npz:"),
    ("photos.zip", "extract it"), ("notes.txt", "give the folder that holds the class")])
def test_folder_that_is_a_file(tmp_path, name, hint):
    (tmp_path / name).write_text("x")
    message = refusal(f"folder:{tmp_path / name}")
    assert "it is a file, not a folder" in message and hint in message
    assert "no such folder" not in message


def test_csv_that_is_a_folder(tmp_path):
    message = refusal(f"csv:{tmp_path}")
    assert "it is a folder, not a CSV file" in message and f"folder:{tmp_path}" in message


# ----------------------------------------------------------------------------- damaged lists


def test_csv_path_with_a_nul_byte(tmp_path, capsys):
    """A damaged CSV: the line and the file are named, on the command line too."""
    csv_file = make_csv_list(tmp_path, classes=4, per_class=2, size=8)
    lines = csv_file.read_text().splitlines()
    lines[3] = lines[3].replace(".png", "\0.png").replace(".jpg", "\0.jpg")
    assert "\0" in lines[3]
    csv_file.write_text("\n".join(lines) + "\n")
    message = refusal(f"csv:{csv_file}")
    assert message.startswith("csv:list.csv: line 4: the path") and "NUL byte" in message
    assert str(csv_file) in message
    assert cli.main(["train", "jrd", "--dataset", f"csv:{csv_file}", "--no-progress",
                     "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kdml: error: csv:list.csv: line 4") and "\n" not in err


def test_cub_path_with_a_nul_byte_in_its_folder(tmp_path):
    root = make_cub(tmp_path, classes=2, per_class=2)
    images = root / "images.txt"
    images.write_text(images.read_text().replace("002.", "0\0" "02.", 1))
    with pytest.raises(KdmlError, match="holds a NUL byte"):
        load_cub(root)


@pytest.mark.parametrize(("section", "key", "value"), [
    ("data", "dataset", "folder:/tmp/a\0b"), ("data", "dataset", "csv:list\0.csv"),
    ("data", "root", "/tmp/\0"), ("model", "weights", "/tmp/w\0.pth")])
def test_a_setting_that_names_a_path_with_a_nul_byte_is_refused(tmp_path, capsys, section, key,
                                                                value):
    """A YAML "\\0" escape (a command line cannot carry one) had stopped kdml train with a
    traceback (ValueError: embedded null byte), and open_dataset with a bare ValueError."""
    config = tmp_path / "nul.yaml"
    config.write_text(yaml.safe_dump({section: {key: value}}))
    assert cli.main(["train", "amsoftmax", "--config", str(config), "--out",
                     str(tmp_path / "run"), "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"kdml: error: {section}.{key}={value!r} holds a NUL "
                                       "byte, which no file name can: remove it\n")
    assert not (tmp_path / "run").exists()
    if section == "data":
        name, root = (value, "") if key == "dataset" else ("cub", value)
        what = "the dataset" if key == "dataset" else "data.root"
        with pytest.raises(KdmlError) as refused:
            open_dataset(name, root)
        assert str(refused.value) == (f"{what} {value!r} holds a NUL byte, which no file name "
                                      "can: remove it")


def test_cub_image_id_listed_twice(tmp_path):
    root = make_cub(tmp_path, classes=2, per_class=2)
    images = root / "images.txt"
    lines = images.read_text().splitlines()
    lines[3] = "2 " + lines[3].split()[1]
    images.write_text("\n".join(lines) + "\n")
    with pytest.raises(KdmlError, match="images.txt lists an image id twice: lines 2 and 4 "
                                        "both list id 2; give each image its own id"):
        load_cub(root)


def test_inshop_images_left_in_img_img(tmp_path):
    """The archive's Img/img.zip unpacked where it lies: say where the images are and where
    kdml reads them (img/ beside the list, as docs/datasets.md has it)."""
    root = make_inshop(tmp_path / "inshop", eval_folder=True)
    (root / "Img").mkdir()
    shutil.move(root / "img", root / "Img" / "img")
    with pytest.raises(KdmlError) as raised:
        load_inshop(root)
    message = str(raised.value)
    assert "the images are in Img/img/" in message
    assert f"move {Path(root) / 'Img' / 'img'} to {Path(root) / 'img'}" in message


def test_an_npz_object_array_is_named_with_its_fix(tmp_path):
    """pandas' ``.values`` of a text column is an object array, which np.load refuses to
    read without unpickling: the message had named neither the array nor the fix."""
    path = tmp_path / "features.npz"
    np.savez(path, X=np.zeros((4, 2), np.float32), y=np.array([0, 1, 0, 1]),
             domain=np.array(["source", "source", "target", "target"], dtype=object))
    with pytest.raises(KdmlError) as raised:
        load_domain_data(f"npz:{path}")
    assert str(raised.value) == (
        f"{path}: the array 'domain' holds Python objects (dtype object, as pandas' .values "
        "gives), and kdml reads no object arrays (loading one can run code); save it as "
        "domain.astype(str)")


def test_training_on_a_folder_that_is_a_symlink_loop_says_so(tmp_path, capsys):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    assert cli.main(["train", "amsoftmax", "--dataset", f"folder:{tmp_path / 'a'}", "--out",
                     str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "symbolic link in a loop" in err, err


def test_a_file_name_that_is_not_utf8_prints_on_a_strict_terminal(tmp_path):
    """``kdml search`` prints each neighbour's file; one named in Latin-1 stopped it with a
    UnicodeEncodeError where the locale makes stdout strict UTF-8 (en_US.UTF-8). Run as the
    command, so that main() is what makes its stdout lenient: the byte written ``\\xf6``, as
    shown_name writes it, here in the run folder kdml eval names."""
    import subprocess
    import sys

    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run),
                     "train.epochs=1", "train.steps_per_epoch=1", "model.embedding_size=8",
                     "eval.nmi=false", "eval.ks=[1]", "train.device=cpu", "--no-progress"]) == 0
    named = run.rename(tmp_path / os.fsdecode(b"f\xf6x"))
    result = subprocess.run([sys.executable, "-m", "kdml", "eval", str(named)],
                            capture_output=True, text=True,
                            env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(f"run folder: {tmp_path}/f\\xf6x\n"), result.stdout


def test_an_error_naming_a_file_that_is_not_utf8_writes_it_as_stdout_does(tmp_path):
    """kdml's one-line errors go to stderr, whose ``backslashreplace`` had written the byte
    0xF6 ``\\udcf6`` where stdout and the captions write ``\\xf6``. Run as the command, so
    that main() is what sets its stderr, and on a strict terminal as the test above."""
    import subprocess
    import sys

    missing = tmp_path / os.fsdecode(b"f\xf6x")
    result = subprocess.run([sys.executable, "-m", "kdml", "eval", str(missing)],
                            capture_output=True, text=True,
                            env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    assert result.returncode == 2
    # the last line: an import may warn first (another machine's torch or numpy)
    assert result.stderr.endswith("\n")
    assert result.stderr.splitlines()[-1] == (
        f"kdml: error: run folder {tmp_path}/f\\xf6x does not exist")


def test_the_lenient_streams_write_a_name_as_shown_name_does():
    """Its handler writes a byte that is not UTF-8 ``\\xNN``, as class captions show it
    (``backslashreplace`` wrote ``\\udcf6``), and any other character a stream cannot encode as
    ``backslashreplace`` does."""
    import codecs

    from kdml.cli import ESCAPED_BYTES, _escaped_bytes
    from kdml.data.formats.folder import shown_name

    codecs.register_error(ESCAPED_BYTES, _escaped_bytes)
    name = os.fsdecode(b"f\xf6x \xc3\xa9 \xff")
    assert name.encode("utf-8", ESCAPED_BYTES).decode("utf-8") == shown_name(name)
    assert shown_name(name) == "f\\xf6x \u00e9 \\xff"
    assert "\u00e9\u20ac\U0001f600\udcf6".encode("ascii", ESCAPED_BYTES) == (
        b"\\xe9\\u20ac\\U0001f600\\xf6")


NO_USER = "~kdml-no-such-user-3f9a"


@pytest.mark.parametrize("args", [
    ["--dataset", f"folder:{NO_USER}/photos"], ["--dataset", f"csv:{NO_USER}/list.csv"],
    ["--dataset", f"npz:{NO_USER}/pair.npz"], ["--dataset", "cub", f"data.root={NO_USER}/d"],
    ["--weights", f"{NO_USER}/w.pth"], ["--out", f"{NO_USER}/run"]], ids=lambda a: a[-1][:8])
def test_a_path_under_the_home_of_no_user_is_refused_in_one_line(tmp_path, capsys, args):
    """pathlib's RuntimeError ("Could not determine home directory") had stopped the command
    with a traceback, naming neither the path nor the fix."""
    out = [] if "--out" in args else ["--out", str(tmp_path / "run")]
    assert cli.main(["train", "amsoftmax", *args, *out, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kdml: error: "), err
    assert (f"{NO_USER}/" in err and f": {NO_USER} names no home folder on this machine (no "
            "such user); write the path out in full" in err), err
    assert not (tmp_path / "run").exists()
    with pytest.raises(KdmlError, match=f"^{NO_USER}/x: {NO_USER} names no home folder"):
        open_dataset(f"folder:{NO_USER}/x", "")


def test_commands_that_read_a_run_refuse_a_path_under_the_home_of_no_user(capsys):
    assert cli.main(["eval", f"{NO_USER}/run"]) == 2
    assert capsys.readouterr().err.startswith(
        f"kdml: error: argument run_dir: {NO_USER}/run: {NO_USER} names no home folder")


def test_a_data_root_longer_than_the_file_system_takes_is_refused_in_one_line(tmp_path, capsys):
    """--data-root's check that it is no file had raised OSError (File name too long) as a
    traceback."""
    long_name = str(tmp_path / ("a" * 300))
    assert cli.main(["eval", str(tmp_path / "run"), "--data-root", long_name]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: argument --data-root: {long_name}: File name too long")
    assert err.count("\n") == 1
