"""Items once left alone, now met as a user meets them: bool labels in the metrics, a
``folder:`` or ``csv:`` name typed in the other Unicode form of the name on disk, ``~`` in a
CSV list's paths, CSV labels written as decimals, two ``kdml index`` into one ``--out``, and
the single-class warning's dataset name."""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_photo_sets import write_photo

from kdml.data.formats.csv_list import label_ids, load_csv
from kdml.data.registry import open_dataset
from kdml.errors import KdmlError
from kdml.evaluation import index as index_module


def _photos(folder: Path, names: list[str], size: tuple[int, int] = (12, 12)) -> None:
    rng = np.random.default_rng(0)
    for name in names:
        write_photo(folder / name, rng.uniform(30, 225, 3), rng, size)


# ---------------------------------------------------------------------------- bool labels


@pytest.mark.parametrize("as_tensor", [False, True])
def test_bool_labels_are_the_classes_0_and_1_in_the_metrics_as_in_the_losses(as_tensor):
    """The losses and regularizers take bool labels as the classes 0 and 1, and so do
    pytorch-metric-learning's losses and its AccuracyCalculator; retrieval_metrics had refused
    them ("labels must be integers, got dtype bool"). They now score as 0/1 labels do."""
    from kdml.evaluation.retrieval import retrieval_metrics

    embeddings = np.random.default_rng(0).normal(size=(10, 3))
    flags = np.arange(10) % 3 == 0
    given = torch.from_numpy(flags) if as_tensor else flags
    as_bools = retrieval_metrics(embeddings, given, ks=(1, 2), nmi=False)
    assert as_bools == retrieval_metrics(embeddings, flags.astype(np.int64), ks=(1, 2),
                                         nmi=False)
    assert 0 < as_bools["recall@1"] < 1  # scored by class, not refused nor trivial


# ---------------------------------------------------------------------------- Unicode forms


@pytest.mark.parametrize(("on_disk", "given"), [("NFD", "NFC"), ("NFC", "NFD")])
def test_a_folder_or_csv_named_in_another_unicode_form_says_so(tmp_path, monkeypatch, on_disk,
                                                               given):
    """``--dataset folder:café`` typed (NFC) for a folder unzipped from a Mac (NFD), or the
    other way round: the two print alike, so "no such folder" named a folder the user could
    see. The error now says that the two are named in other Unicode forms; so for a CSV."""
    form = {"NFC": "composed (NFC)", "NFD": "decomposed (NFD)"}
    folder = unicodedata.normalize(on_disk, "café")
    _photos(tmp_path / folder, ["a/p0.jpg", "b/p1.jpg"])
    (tmp_path / unicodedata.normalize(on_disk, "lïst.csv")).write_text(
        f"path,label,split\n{folder}/a/p0.jpg,a,train\n{folder}/b/p1.jpg,b,test\n")
    monkeypatch.chdir(tmp_path)
    for name, kind in (("folder:café", "folder"), ("csv:lïst.csv", "file")):
        typed = unicodedata.normalize(given, name)
        with pytest.raises(KdmlError, match=re.escape(
                f"{typed}: no such {kind}; the {kind} there is named in Unicode's "
                f"{form[on_disk]} form and the path given in the {form[given]} one, which look "
                "alike but are two names on this file system: type the path with the shell's "
                f"Tab completion, which copies the name as stored, or rename the {kind} "
                f"(searched {tmp_path / typed.partition(':')[2]};")) as error:
            open_dataset(typed)
        assert "\n" not in str(error.value)
        assert len(open_dataset(unicodedata.normalize(on_disk, name)).dataset) == 2
    # missing in every form: the plain message
    with pytest.raises(KdmlError, match=r"^folder:cafe: no such folder \(searched "):
        open_dataset("folder:cafe")


# ---------------------------------------------------------------------------- ~ in a CSV


def test_a_csv_path_under_a_home_folder_is_read_there(tmp_path, monkeypatch):
    """``~/photos/a/p0.jpg`` in a list had been joined to the CSV's folder, a folder named
    ``~`` beside the CSV, so every image was missing; kdml expands ``~`` in every path it is
    given (``--dataset csv:~/list.csv``), and now in the list's paths too. A ``~user`` that
    names no home folder is refused in one line at its row, with how to list a file of the
    CSV's folder whose name starts with ``~``."""
    home = tmp_path / "home"
    _photos(home / "photos", ["a/p0.jpg", "b/p1.jpg", "a/p2.jpg", "b/p3.jpg"])
    monkeypatch.setenv("HOME", str(home))
    lists = tmp_path / "lists"
    lists.mkdir()
    rows = [f"~/photos/{'ab'[index % 2]}/p{index}.jpg,{'ab'[index % 2]},"
            f"{'train' if index < 2 else 'test'}" for index in range(4)]
    (lists / "list.csv").write_text("path,label,split\n" + "\n".join(rows) + "\n")
    dataset = load_csv(lists / "list.csv").dataset
    assert dataset.paths.tolist() == [str(home / "photos" / f"{'ab'[index % 2]}/p{index}.jpg")
                                      for index in range(4)]
    # missing at home: plainly missing, though ~/photos/a/p9.jpg is a file of the current
    # folder (a folder named ~ there), which "relative to the current folder" had named
    _photos(tmp_path / "~" / "photos", ["a/p9.jpg"])
    monkeypatch.chdir(tmp_path)
    (lists / "list.csv").write_text("path,label,split\n" + "\n".join(rows)
                                    + "\n~/photos/a/p9.jpg,a,test\n")
    with pytest.raises(KdmlError, match=re.escape(
            f"line 6: missing image {home}/photos/a/p9.jpg (1 of 5 listed images are missing)")):
        load_csv(lists / "list.csv")
    # listed twice so: one image twice, not "through a link"
    (lists / "list.csv").write_text("path,label,split\n" + "\n".join(rows) + f"\n{rows[0]}\n")
    with pytest.raises(KdmlError, match=re.escape(
            "lines 2 and 6 list the image ~/photos/a/p0.jpg twice; list each image once")):
        load_csv(lists / "list.csv")
    # a file of the CSV's folder named ~p.jpg: as ./~p.jpg; as ~p.jpg, a user's home
    _photos(lists, ["~p.jpg"])
    (lists / "list.csv").write_text("path,label,split\n" + "\n".join(rows)
                                    + "\n./~p.jpg,c,test\n")
    assert load_csv(lists / "list.csv").dataset.paths[-1] == str(lists / "~p.jpg")
    (lists / "list.csv").write_text("path,label,split\n" + "\n".join(rows)
                                    + "\n~kdml-no-such-user/p.jpg,c,test\n")
    with pytest.raises(KdmlError, match=re.escape(
            "csv:list.csv: line 6: ~kdml-no-such-user/p.jpg: ~kdml-no-such-user names no home "
            "folder on this machine (no such user); write the path out in full, or "
            "./~kdml-no-such-user/p.jpg for a file of the CSV's folder (searched")) as error:
        load_csv(lists / "list.csv")
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------- decimal labels


def test_csv_labels_written_as_decimals_are_numbers_in_class_order_and_identity(tmp_path):
    """pandas writes an integer label column that holds an empty cell as floats: ``1.0``,
    ``2.0``, ``10.0``. Sorted as text, ``10.0`` came before ``2.0``, so a class-disjoint split
    trained on other classes than the same list written with integers (classes 1 and 10, not
    1 and 2); and ``1`` and ``1.0`` on two rows were two classes. Whole numbers now sort and
    compare as integers, each class named as its first row writes it."""
    from kdml.data.splits import make_splits

    labels = ["1.0", "2.0", "10.0", "3.0", "1", "2.0", "10.0", "3.0"]
    _photos(tmp_path, [f"p{index}.jpg" for index in range(len(labels))])
    (tmp_path / "list.csv").write_text("path,label,split\n" + "".join(
        f"p{index}.jpg,{label},train\n" for index, label in enumerate(labels)))
    parts = load_csv(tmp_path / "list.csv")
    assert parts.dataset.class_names == {0: "1.0", 1: "2.0", 2: "3.0", 3: "10.0"}
    assert parts.dataset.labels.tolist() == [0, 1, 3, 2, 0, 1, 3, 2]
    splits = make_splits(parts.dataset, {}, "class-disjoint")
    train_names = {splits.train.class_names[label] for label in splits.train.labels.tolist()}
    assert train_names == {"1.0", "2.0"}
    # a fraction is no class number: 1.1 and 1.10 (sections, say) stay two names
    assert label_ids(["1.1", "1.10", "2"])[1] == {0: "1.1", 1: "1.10", 2: "2"}


# ---------------------------------------------------------------------------- index race


def test_an_index_written_into_its_out_meanwhile_is_said_in_one_line_and_kept(tmp_path,
                                                                            monkeypatch):
    """Two ``kdml index RUN --out IDX`` at once: both found IDX empty, and the one that
    finished second failed with the file system's "IDX: Directory not empty; fix it or choose
    another path". It now says that another index was written there while it built its own,
    leaves that index as it was, and leaves no hidden partial folder."""
    out = tmp_path / "idx"
    embeddings = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)

    def items(count):
        return {"labels": np.arange(count),
                "sources": np.array([f"p{number}.jpg" for number in range(count)])}

    def info():
        return index_module.IndexInfo(run=str(tmp_path), checkpoint_sha256="0" * 64,
                                      metric="cosine", dim=0, kind="exact", count=0, scale=1.0)

    checked = index_module.check_index_folder

    def checked_then_won_by_another(folder):
        checked(folder)
        monkeypatch.setattr(index_module, "check_index_folder", checked)
        index_module.build_index(folder, embeddings[:10], items(10), info())

    monkeypatch.setattr(index_module, "check_index_folder", checked_then_won_by_another)
    with pytest.raises(KdmlError, match=re.escape(
            f"--out {out}: another index was written there while this one was built (another "
            "kdml index into the same folder?); this one was not kept: choose another --out")):
        index_module.build_index(out, embeddings, items(20), info())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["idx"]
    assert index_module.load_index(out).info.count == 10  # the other's, whole


# ---------------------------------------------------------------------------- warning


def test_the_single_class_warning_names_the_dataset_not_a_part_path(tmp_path, caplog):
    """Three class folders, class-disjoint: one class trains. The warning had said "the
    training split of folder:p4/train", read as a folder p4/train the user never gave; it
    now names the dataset, folder:p4."""
    from kdml.data.formats.folder import load_folder
    from kdml.data.splits import make_splits
    from kdml.training.checks import warn_about_splits

    _photos(tmp_path / "p4", [f"{name}/p{index}.jpg" for name in "abc" for index in range(2)])
    parts = load_folder(tmp_path / "p4")
    log = logging.getLogger("kdml.test")
    with caplog.at_level("WARNING", logger="kdml.test"):
        warn_about_splits(make_splits(parts.dataset, parts.parts, "class-disjoint"), log)
    assert [record.getMessage() for record in caplog.records] == [
        "the training split of folder:p4 has a single class: class-based losses have nothing "
        "to separate"]
