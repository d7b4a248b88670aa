"""A ``--dataset`` name with a path prefix (``folder:``, ``csv:``, ``npz:``) is that path,
whatever characters it holds: ``folder:/data/im->gs`` had been taken for a domain pair
(``SOURCE->TARGET``) and refused as an unknown one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_array_sets import make_csv_list, make_image_folder

from kdml import cli
from kdml.data.domains import is_domain_dataset
from kdml.data.registry import PATH_FORMATS

TINY = ["train.epochs=1", "train.steps_per_epoch=2", "model.embedding_size=8", "eval.nmi=false",
        "eval.ks=[1,2]", "train.device=cpu", "--no-progress", "data.resize=40",
        "data.image_size=32", "data.batch_size=4"]


def kdml(*args: str | Path) -> int:
    return cli.main([str(arg) for arg in args])


@pytest.mark.parametrize(("name", "is_pair"), [
    ("mnist5k->digits", True),
    ("digits->mnist5k", True),
    ("npz:features.npz", True),  # a feature file holds two domains
    ("npz:/data/a->b.npz", True),
    ("folder:/data/im->gs", False),
    ("folder:A->digits", False),
    ("csv:/data/a->b/list.csv", False),
    ("digits", False),
    ("folder:/data/photos", False),
])
def test_a_path_prefix_decides_before_an_arrow(name, is_pair):
    assert is_domain_dataset(name) is is_pair


def test_every_path_prefix_is_covered():
    """A prefix added to the registry is a path too, arrow or not."""
    for prefix in PATH_FORMATS:
        assert is_domain_dataset(f"{prefix}/data/a->b") is (prefix == "npz:")


def test_a_folder_whose_path_holds_an_arrow_trains(tmp_path, capsys):
    folder = make_image_folder(tmp_path / "im->gs", classes=4, per_class=4, size=32)
    out = tmp_path / "run"
    assert kdml("train", "jrd", "--dataset", f"folder:{folder}", "--out", out, *TINY) == 0, (
        capsys.readouterr().err)
    assert 0.0 <= json.loads((out / "metrics.json").read_text())["final"]["recall@1"] <= 1.0


def test_a_csv_list_whose_path_holds_an_arrow_trains(tmp_path, capsys):
    csv_file = make_csv_list(tmp_path / "a->b", classes=4, per_class=4)
    out = tmp_path / "run"
    assert kdml("train", "amsoftmax", "--dataset", f"csv:{csv_file}", "--out", out,
                *TINY) == 0, capsys.readouterr().err
    assert 0.0 <= json.loads((out / "metrics.json").read_text())["final"]["recall@1"] <= 1.0


@pytest.mark.parametrize("dataset", ["folder:A->digits", "csv:A->digits.csv",
                                     "folder:/no/a->folder:/no/b",
                                     "csv:/no/a.csv->csv:/no/b.csv"])
def test_a_missing_path_with_an_arrow_says_it_is_missing(tmp_path, capsys, monkeypatch,
                                                         dataset):
    """Read as a path now, not as an unknown domain pair: the error says the path is missing,
    by the name the user wrote (folder:/a->folder:/b had been called "folder:b"), and that it
    is no domain pair, naming those there are and npz:FILE."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    assert kdml("train", "jrd", "--dataset", dataset, "--out", out, *TINY) == 2
    err = capsys.readouterr().err
    kind, path = dataset.split(":", 1)
    what = "folder" if kind == "folder" else "file"
    assert err.count("\n") == 1 and err.startswith(
        f"kdml: error: {kind}:{tmp_path / path}: no such {what}; "), err
    assert err.endswith(f"; a {kind}: dataset is one path, '->' included, not a domain pair: "
                        "kdml's pairs are mnist5k->digits, digits->mnist5k, or npz:FILE, a .npz "
                        "of both domains' features (X, y, domain)\n"), err
    assert not out.exists()


def test_a_run_folder_inside_an_image_folder_whose_path_holds_an_arrow_is_refused(tmp_path):
    """check_outside_image_folders split the name at "->" as a domain pair's two sides, so it
    compared the run folder with tmp/im, not tmp/im->gs, and let a run inside the images."""
    from kdml.errors import KdmlError
    from kdml.training.run_folder import check_outside_image_folders

    images = tmp_path / "im->gs"
    images.mkdir()
    with pytest.raises(KdmlError, match="would lie inside .*im->gs, the image folder"):
        check_outside_image_folders(images / "run", f"folder:{images}")
    check_outside_image_folders(tmp_path / "run", f"folder:{images}")  # beside it: fine


def test_folder_without_a_path_says_so_also_with_a_relative_out(tmp_path, monkeypatch, capsys):
    """``folder:`` of an unset variable is the current folder to Path(""): a relative --out
    then lay "inside" it, and that refusal hid the one the data's reader gives."""
    monkeypatch.chdir(tmp_path)
    assert kdml("train", "jrd", "--dataset", "folder:", "--out", "runs/r", "--no-progress") == 2
    assert capsys.readouterr().err == "kdml: error: folder: needs a path: --dataset folder:DIR\n"
    assert not (tmp_path / "runs").exists()


def test_the_image_folder_itself_as_the_run_folder_is_refused(tmp_path):
    from kdml.errors import KdmlError
    from kdml.training.run_folder import check_outside_image_folders

    images = tmp_path / "photos"
    images.mkdir()
    with pytest.raises(KdmlError, match="would lie inside .*photos, the image folder"):
        check_outside_image_folders(images, f"folder:{images}/")
