"""Audit as a user bringing their own images: folder:DIR class folders, CSV lists and the
photo benchmarks' layouts, with the files real users have (names spelled by another system,
images of every mode), each giving correct results or one line saying what to do."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from fixtures_photo_sets import write_photo

from kdml.data.formats.csv_list import load_csv
from kdml.data.formats.folder import load_folder
from kdml.errors import KdmlError


@pytest.mark.parametrize(("on_disk", "listed"), [("NFD", "NFC"), ("NFC", "NFD")])
def test_a_listed_name_in_another_unicode_form_than_the_file_s_is_said_to_be(
        tmp_path, on_disk, listed):
    """A CSV typed on Linux (``café`` composed, NFC) beside photos unzipped from a Mac, whose
    names are decomposed (NFD: e + U+0301), or the other way round: on Linux the two are other
    names, yet they print alike, so "missing image .../café/p0.jpg" named a file the user could
    see. The error now says that the two spell the name in other Unicode forms, and which form
    to write."""
    folder = unicodedata.normalize(on_disk, "café")
    rng = np.random.default_rng(0)
    rows = []
    for index in range(4):
        write_photo(tmp_path / folder / f"p{index}.jpg", rng.uniform(30, 225, 3), rng, (12, 12))
        rows.append(f"{unicodedata.normalize(listed, 'café')}/p{index}.jpg,{index % 2},"
                    f"{'train' if index < 2 else 'test'}")
    (tmp_path / "list.csv").write_text("path,label,split\n" + "\n".join(rows) + "\n")
    form = {"NFC": "composed (NFC)", "NFD": "decomposed (NFD)"}
    with pytest.raises(KdmlError, match=re.escape(
            f"line 2: missing image {tmp_path / unicodedata.normalize(listed, 'café')}/p0.jpg: "
            f"the file there is named in Unicode's {form[on_disk]} form and the list in the "
            f"{form[listed]} one") + ".* write the list's paths in " + on_disk
            + r".* \(4 of 4 listed images are missing\)") as error:
        load_csv(tmp_path / "list.csv")
    assert "\n" not in str(error.value)


def test_a_listed_image_missing_in_every_unicode_form_is_called_missing(tmp_path):
    """Only a file that is there under another form of the name is named so: a missing one
    keeps the plain message."""
    rng = np.random.default_rng(0)
    for index in range(2):
        write_photo(tmp_path / "cafe" / f"p{index}.jpg", rng.uniform(30, 225, 3), rng, (12, 12))
    (tmp_path / "list.csv").write_text("path,label,split\ncafe/p0.jpg,0,train\n"
                                       "café/p1.jpg,1,test\n")
    with pytest.raises(KdmlError, match=re.escape(
            f"line 3: missing image {tmp_path}/café/p1.jpg (1 of 2 listed images are missing)")):
        load_csv(tmp_path / "list.csv")


def _photos_and_list(root: Path, write: str) -> Path:
    """Four photos in ``root/photos/<a|b>/`` and ``root/lists/list.csv`` listing them with
    ``write(class, file)`` as each row's path; returns the CSV."""
    rng = np.random.default_rng(0)
    rows = []
    for index in range(4):
        label = "ab"[index % 2]
        write_photo(root / "photos" / label / f"p{index}.jpg", rng.uniform(30, 225, 3), rng,
                    (12, 12))
        rows.append(f"{write.format(label=label, file=f'p{index}.jpg')},{label},"
                    f"{'train' if index < 2 else 'test'}")
    (root / "lists").mkdir()
    (root / "lists" / "list.csv").write_text("path,label,split\n" + "\n".join(rows) + "\n")
    return root / "lists" / "list.csv"


def test_a_csv_path_relative_to_the_current_folder_is_told_to_be_relative_to_the_csv(
        tmp_path, monkeypatch):
    """A list written with paths relative to the folder the user works in (``photos/a/p0.jpg``
    beside ``lists/list.csv``) had every image called missing, by a path that did not say
    why; the error now says that paths are read relative to the CSV's folder, that the file is
    there relative to the current one, and what to write."""
    csv_file = _photos_and_list(tmp_path, "photos/{label}/{file}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KdmlError, match=re.escape(
            f"line 2: missing image {tmp_path}/lists/photos/a/p0.jpg: paths are read relative "
            f"to the CSV's folder, {tmp_path}/lists, and photos/a/p0.jpg is a file relative to "
            "the current folder; write them relative to the CSV's folder, or absolute (4 of 4 "
            "listed images are missing)")) as error:
        load_csv(csv_file)
    assert "\n" not in str(error.value)
    monkeypatch.chdir(tmp_path / "photos")  # not there from here either: plainly missing
    with pytest.raises(KdmlError, match=re.escape(
            f"line 2: missing image {tmp_path}/lists/photos/a/p0.jpg (4 of 4 listed")):
        load_csv(csv_file)


def test_a_csv_path_written_with_backslashes_is_told_to_use_slashes(tmp_path):
    """A list written on Windows (``..\\photos\\a\\p0.jpg``, as ``str(Path)`` gives there):
    a POSIX system reads each backslash as part of one name, so every image was missing; the
    error now says so and what to write."""
    csv_file = _photos_and_list(tmp_path, "..\\photos\\{label}\\{file}")
    with pytest.raises(KdmlError, match=re.escape(
            f"line 2: missing image {tmp_path}/lists/..\\photos\\a\\p0.jpg: its path separates "
            "folders with '\\', as Windows writes paths, which this system reads as part of a "
            "name; write the list's paths with '/' (4 of 4 listed images are missing)")):
        load_csv(csv_file)
    # written with slashes, the same list reads
    csv_file.write_text(csv_file.read_text().replace("\\", "/"))
    assert len(load_csv(csv_file).dataset) == 4
    # a backslash path that is not there with slashes either is plainly missing
    csv_file.write_text(csv_file.read_text() + "..\\photos\\c\\p9.jpg,c,test\n")
    with pytest.raises(KdmlError, match=re.escape(
            f"line 6: missing image {tmp_path}/lists/..\\photos\\c\\p9.jpg (1 of 5 listed")):
        load_csv(csv_file)


def test_a_csv_label_in_two_unicode_forms_is_refused_not_read_as_two_classes(tmp_path):
    """``café`` typed on one row (NFC) and pasted from a Mac's folder name on another (NFD)
    print alike but had been two classes, ``{0: 'café', 1: 'café'}``: each image of one was a
    miss for the other's queries. The list is now refused, naming both lines."""
    rng = np.random.default_rng(0)
    rows = []
    for index in range(6):
        write_photo(tmp_path / f"p{index}.jpg", rng.uniform(30, 225, 3), rng, (12, 12))
        label = "dog" if index < 2 else unicodedata.normalize("NFD" if index == 5 else "NFC",
                                                              "café")
        rows.append(f"p{index}.jpg,{label},{'train' if index < 2 else 'test'}")
    (tmp_path / "list.csv").write_text("path,label,split\n" + "\n".join(rows) + "\n")
    with pytest.raises(KdmlError, match=re.escape(
            "lines 4 and 7 spell the label 'cafe\u0301' in two Unicode forms (composed, NFC, "
            "and decomposed, NFD")):
        load_csv(tmp_path / "list.csv")
    # in one form, one class
    (tmp_path / "list.csv").write_text(unicodedata.normalize(
        "NFC", (tmp_path / "list.csv").read_text()))
    assert load_csv(tmp_path / "list.csv").dataset.class_names == {0: "café", 1: "dog"}


def test_class_folders_named_alike_in_two_unicode_forms_are_refused(tmp_path):
    """A Mac's zip (``café/``, NFD) unpacked beside a copy made on Linux (``café/``, NFC) makes
    two folders there, which print alike and had been two classes; refused, naming both."""
    rng = np.random.default_rng(0)
    for folder in ("cafe\u0301", "caf\u00e9", "dog"):
        write_photo(tmp_path / folder / "p.jpg", rng.uniform(30, 225, 3), rng, (12, 12))
    with pytest.raises(KdmlError, match=re.escape(
            "class folders cafe\u0301/ and caf\u00e9/ spell one name in two Unicode forms")):
        load_folder(tmp_path)
    (tmp_path / "cafe\u0301" / "p.jpg").rename(tmp_path / "caf\u00e9" / "q.jpg")
    (tmp_path / "cafe\u0301").rmdir()
    assert load_folder(tmp_path).dataset.class_names == {0: "café", 1: "dog"}


def test_a_listed_file_name_holding_a_newline_keeps_the_error_on_one_line(tmp_path, capsys):
    """A CSV may quote a path holding a newline (a file named so on Linux); its "missing image"
    error had printed the name's two halves on two lines, the second read as a line of its own
    (every error is one line, as kdml search's table rows are): the newline is now written
    ``\\n``, as the search table writes it."""
    from kdml.cli import main

    (tmp_path / "list.csv").write_text('path,label,split\n"bad\nname.jpg",0,train\n'
                                       "b.jpg,1,test\n")
    assert main(["train", "jrd", "--dataset", f"csv:{tmp_path / 'list.csv'}",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kdml: error: ") and len(err.splitlines()) == 1, err
    assert f"missing image {tmp_path}/bad\\nname.jpg" in err


def test_a_warning_naming_a_file_with_a_newline_is_one_line_on_stderr_and_in_train_log(
        tmp_path, capsys):
    """``data.on_bad_image=skip`` warns ``skipping unreadable image PATH`` on stderr and in
    ``train.log``; a name holding a newline had split that warning over two lines in both.
    (A logged traceback, as a run's stop by an error writes, keeps its lines.)"""
    import logging

    from kdml.run_log import run_logging, warnings_on_stderr

    warning = "skipping unreadable image %s"
    with warnings_on_stderr():
        logging.getLogger("kdml.data").warning(warning, "/photos/bad\nname.jpg")
    err = capsys.readouterr().err
    assert err == "kdml: warning: skipping unreadable image /photos/bad\\nname.jpg\n"
    with run_logging(tmp_path / "train.log") as log:
        log.warning(warning, "/photos/bad\tname.jpg")
        try:
            raise ValueError("why")
        except ValueError as error:
            log.info("stopped: an error", exc_info=error)
    logged = (tmp_path / "train.log").read_text().splitlines()
    assert logged[0].endswith(" skipping unreadable image /photos/bad\\tname.jpg"), logged
    assert logged[1].endswith(" stopped: an error") and logged[-1] == "ValueError: why", logged
