"""Audit: where the registry looks for a dataset (``~``, an empty ``$KDML_DATA_ROOT``, the
current folder), what the offline sets are drawn with, and a domain pair's PCA settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures_array_sets import make_cifar10, make_csv_list, make_idx, make_image_folder

from kdml.config import DataConfig
from kdml.data.prepare import prepare_data
from kdml.data.registry import DATASETS, FORMATS, ROOT_VARIABLE, find_root, open_dataset
from kdml.errors import KdmlError


def test_a_home_relative_path_is_expanded_by_the_library_too(tmp_path, monkeypatch):
    """``~`` in ``data.root``, ``folder:`` and ``csv:`` given to open_dataset directly (not
    through the command line, which makes paths absolute first)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    make_idx(tmp_path / "data", train=20, test=10)
    make_image_folder(tmp_path)
    make_csv_list(tmp_path / "lists")
    assert len(open_dataset("mnist", "~/data").dataset) == 30
    assert len(open_dataset("folder:~/images").dataset) == 12
    assert len(open_dataset("csv:~/lists/list.csv").dataset) == 16


def test_an_empty_data_root_variable_is_as_if_unset(tmp_path, monkeypatch):
    """``KDML_DATA_ROOT=`` must not make the current folder a folder of datasets."""
    make_idx(tmp_path, train=20, test=10)  # ./mnist
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ROOT_VARIABLE, "")
    with pytest.raises(KdmlError, match=r"mnist: no dataset found \(searched: "
                                        r"\$KDML_DATA_ROOT is not set\); pass its folder"):
        open_dataset("mnist")


def test_files_in_the_current_folder_are_not_called_the_variable_s_folder(tmp_path,
                                                                          monkeypatch):
    """Without ``$KDML_DATA_ROOT``, MNIST's files in the current folder had the refusal speak of
    ``$KDML_DATA_ROOT=`` (empty) as mnist's own folder."""
    make_idx(tmp_path, train=20, test=10, name=".")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ROOT_VARIABLE, raising=False)
    with pytest.raises(KdmlError) as info:
        open_dataset("mnist")
    assert str(info.value).endswith(f"pass its folder with --data-root DIR or set {ROOT_VARIABLE} "
                                    "(see 'kdml datasets')")


def test_in_shop_is_found_by_its_eval_folder_layout(tmp_path):
    """The In-Shop archive keeps its partition file in Eval/."""
    (tmp_path / "Eval").mkdir()
    (tmp_path / "Eval" / "list_eval_partition.txt").write_text("")
    assert FORMATS["inshop"].located(tmp_path) == tmp_path
    assert FORMATS["inshop"].located(tmp_path / "Eval") == tmp_path / "Eval"


def test_a_marker_that_is_a_folder_does_not_locate_the_dataset(tmp_path):
    """A folder named images.txt in the data root is not CUB's list: the copy in its archive
    folder is read (the reader refuses such a marker alone: test_formats_photos)."""
    (tmp_path / "images.txt").mkdir()
    assert FORMATS["cub"].located(tmp_path) is None
    (tmp_path / "CUB_200_2011").mkdir()
    (tmp_path / "CUB_200_2011" / "images.txt").write_text("")
    assert find_root(FORMATS["cub"], str(tmp_path)) == tmp_path / "CUB_200_2011"


def test_the_offline_sets_name_the_backbone_that_reads_their_samples():
    """``model.backbone=auto``: the 1-D signals of MNIST-1D need conv1d, the images a CNN."""
    assert {name: entry.default_backbone for name, entry in DATASETS.items()} == {
        "mnist5k": "cnn", "digits": "cnn", "mnist1d": "conv1d"}
    assert open_dataset("digits").dataset.default_backbone == "cnn"


def _pair(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "pair.npz"
    np.savez(path, X=rng.standard_normal((9, 3)).astype(np.float32),
             y=np.array([0, 1, 2, 0, 1, -1, -1, 2, 0]),
             domain=np.array(["source"] * 5 + ["target"] * 4))
    return f"npz:{path}"


def test_pca_dim_may_be_the_smaller_of_the_source_s_samples_and_features(tmp_path):
    """5 source samples of 3 features: data.pca_dim=3 is allowed, 4 is refused."""
    dataset = _pair(tmp_path)
    splits = prepare_data(DataConfig(dataset=dataset, pca_dim=3))
    assert splits.train.x.shape == (5, 3) and splits.input_pca is not None
    with pytest.raises(KdmlError, match="data.pca_dim=4 exceeds 3"):
        prepare_data(DataConfig(dataset=dataset, pca_dim=4))


def test_a_trained_run_s_pca_is_used_only_with_data_pca_dim(tmp_path):
    dataset = _pair(tmp_path)
    pca = prepare_data(DataConfig(dataset=dataset, pca_dim=2)).input_pca
    assert prepare_data(DataConfig(dataset=dataset, pca_dim=2), pca=pca).train.x.shape == (5, 2)
    plain = prepare_data(DataConfig(dataset=dataset), pca=pca)
    assert plain.train.x.shape == (5, 3) and plain.input_pca is None


def test_a_domain_pair_trains_on_its_source_classes_numbered_from_0(tmp_path):
    """The source's labels 3, 5, 7 train as 0, 1, 2; train_classes maps them back; the target
    keeps its own labels (-1: unlabelled) for scoring."""
    path = tmp_path / "pair.npz"
    np.savez(path, X=np.arange(21, dtype=np.float32).reshape(7, 3),
             y=np.array([7, 3, 5, 3, 7, -1, 5]),
             domain=np.array(["source"] * 5 + ["target"] * 2))
    splits = prepare_data(DataConfig(dataset=f"npz:{path}"))
    assert splits.kind == "domain"
    assert splits.train_classes == [3, 5, 7]
    assert splits.train.labels.tolist() == [2, 0, 1, 0, 2]
    assert splits.test.labels.tolist() == [-1, 5]


def test_open_dataset_names_the_dataset_an_unknown_name_nearly_spells():
    """As the CLI does: the library's refusal of a name spelt nearly right says which was
    meant before listing every dataset."""
    with pytest.raises(KdmlError, match=r"^unknown dataset 'Cars196' \(did you mean "
                                        r"'cars196'\?\); choose one of: mnist5k, "):
        open_dataset("Cars196")


def test_files_directly_in_the_data_root_variable_are_not_searched(tmp_path, monkeypatch):
    """$KDML_DATA_ROOT holds many datasets, each in its own folder: its own folder is not
    searched (MNIST's and Fashion-MNIST's IDX files have the same names), --data-root's is."""
    from kdml.data.registry import FORMATS, ROOT_VARIABLE, candidate_roots

    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))
    assert candidate_roots(FORMATS["mnist"]) == [tmp_path / "mnist"]
    assert candidate_roots(FORMATS["mnist"], str(tmp_path)) == [tmp_path, tmp_path / "mnist"]


def test_a_base_s_folders_are_searched_in_the_documented_order(tmp_path, monkeypatch):
    """The base itself (not $KDML_DATA_ROOT's), the archive's folder, ``<name>`` and the
    archive's folder inside that; $KDML_DATA_ROOT's before the system folder. Where two of them
    hold the dataset, the first is read."""
    from kdml.data.registry import candidate_roots

    cub = FORMATS["cub"]
    assert candidate_roots(cub, str(tmp_path)) == [
        tmp_path, tmp_path / "CUB_200_2011", tmp_path / "cub", tmp_path / "cub" / "CUB_200_2011"]
    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))
    system = FORMATS["fashion-mnist"].system_root
    assert candidate_roots(FORMATS["fashion-mnist"]) == [
        tmp_path / "fashion-mnist", Path(system), Path(system) / "fashion-mnist"]
    for folder in (tmp_path / "cub", tmp_path / "CUB_200_2011"):
        folder.mkdir()
        (folder / "images.txt").write_text("")
    assert find_root(cub, str(tmp_path)) == tmp_path / "CUB_200_2011"
    assert find_root(cub) == tmp_path / "CUB_200_2011"


@pytest.mark.parametrize("name, absent", [
    ("cifar10", "data_batch_5"), ("cifar10", "test_batch"),
    ("mnist", "t10k-labels-idx1-ubyte"), ("mnist", "train-images-idx3-ubyte"),
])
def test_each_file_a_reader_needs_is_named_when_it_is_missing(tmp_path, name, absent):
    """The registry names every file the reader would stop on: CIFAR-10's five train batches
    and its test batch, and each of the four IDX files (under any of its names)."""
    folder = (make_cifar10(tmp_path, per_batch=2, test=2) if name == "cifar10"
              else make_idx(tmp_path, train=10, test=10))
    assert FORMATS[name].missing(folder) == []
    for path in folder.glob(absent + "*"):
        path.unlink()
    assert FORMATS[name].missing(folder) == [absent]


def test_a_needed_folder_that_is_a_file_is_missing(tmp_path):
    """``images/`` must be a folder: a file of that name is named, with why."""
    for need in ("images.txt", "image_class_labels.txt"):
        (tmp_path / need).write_text("")
    (tmp_path / "images").write_text("")
    (missing,) = FORMATS["cub"].missing(tmp_path)
    assert missing.startswith("images/ (")
    (tmp_path / "images").unlink()
    (tmp_path / "images").mkdir()
    (tmp_path / "image_class_labels.txt").unlink()
    (tmp_path / "image_class_labels.txt").mkdir()
    (missing,) = FORMATS["cub"].missing(tmp_path)
    assert missing.startswith("image_class_labels.txt (")


def test_without_a_marker_the_most_specific_existing_folder_is_read(tmp_path):
    """An incomplete copy: the deepest of a base's folders that exists is returned, where the
    reader then names what is missing there, not the base that merely holds it."""
    (tmp_path / "cub").mkdir()
    assert find_root(FORMATS["cub"], str(tmp_path)) == tmp_path / "cub"
    (tmp_path / "cub" / "CUB_200_2011").mkdir()
    assert find_root(FORMATS["cub"], str(tmp_path)) == tmp_path / "cub" / "CUB_200_2011"


def test_a_path_named_dataset_is_stored_absolute_and_moved_with_its_root(tmp_path,
                                                                         monkeypatch):
    """with_absolute_path: a relative or ``~`` path made absolute, other names unchanged;
    relocated: a moved run's ``folder:`` becomes the new root, ``csv:``/``npz:`` the file of
    the same name in it, and a format keeps its name and takes the root."""
    from kdml.data.registry import relocated, with_absolute_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert with_absolute_path("csv:lists/list.csv") == f"csv:{tmp_path}/lists/list.csv"
    assert with_absolute_path("folder:~/photos") == f"folder:{tmp_path}/home/photos"
    assert with_absolute_path("npz:f.npz") == f"npz:{tmp_path}/f.npz"
    for name in ("cub", "mnist5k->digits", "folder: "):
        assert with_absolute_path(name) == name
    assert relocated("folder:/old/photos", "/new/photos") == ("folder:/new/photos", "")
    assert relocated("csv:/old/lists/list.csv", "/new") == ("csv:/new/list.csv", "")
    assert relocated("npz:/old/f.npz", "/new") == ("npz:/new/f.npz", "")
    assert relocated("cub", "/new") == ("cub", "/new")
