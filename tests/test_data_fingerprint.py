"""A run's data.json: the fingerprint of the data it trained on, which ``kdml eval`` and the
other commands (``--data-root``), and ``kdml train --resume``, check before scoring: other data
with as many training classes had loaded the checkpoint and been scored without a word."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from fixtures_array_sets import make_idx, make_image_folder

from kdml import cli
from kdml.data.dataset import ArrayDataset
from kdml.data.fingerprint import FORMAT_FIELD, data_fingerprint, fingerprint_difference
from kdml.data.images import ImageFiles
from kdml.data.splits import make_splits
from kdml.errors import KdmlError
from kdml.training.run_folder import RunFolder, stale_run_files

TINY = ["--no-progress", "train.epochs=1", "eval.nmi=false", "train.device=cpu",
        "data.batch_size=4", "data.resize=28", "data.image_size=24", "eval.ks=[1]",
        "model.embedding_size=8"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A tiny run trained on ``folder:DIR`` (4 classes of 3 images: 2 train, 2 test), its
    data, and other data of as many classes: the same with one file renamed (same counts),
    and another folder with fewer images per class."""
    base = tmp_path_factory.mktemp("fingerprint")
    data = make_image_folder(base / "here", classes=4, per_class=3, size=24)
    renamed = base / "renamed" / "images"
    shutil.copytree(data, renamed)
    (renamed / "c00" / "000.jpg").rename(renamed / "c00" / "100.jpg")
    fewer = make_image_folder(base / "fewer", classes=4, per_class=2, size=24, seed=1)
    run = base / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", f"folder:{data}", "--out", str(run),
                     *TINY]) == 0
    return {"base": base, "data": data, "renamed": renamed, "fewer": fewer, "run": run}


def copy_of(folder: Path, tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(folder, tmp_path / name))


def refused(capsys, *args: str | Path) -> str:
    """Run ``kdml ARGS``; assert exit 2 and one line on stderr, no traceback."""
    capsys.readouterr()
    assert cli.main([str(arg) for arg in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kdml: error:") and "\n" not in err and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- the run folder


def test_a_new_run_records_its_data(folders):
    recorded = json.loads((folders["run"] / "data.json").read_text())
    assert recorded[FORMAT_FIELD] == 1 and recorded["folder"] == str(folders["data"].resolve())
    assert {name: (part["samples"], part["classes"], part["kind"])
            for name, part in recorded["parts"].items()} == {"train": (6, 2, "files"),
                                                             "test": (6, 2, "files")}


@pytest.mark.parametrize("other, difference", [
    ("renamed", "its train part has the same 6 samples of 2 classes but its files or labels "
                "differ"),
    ("fewer", "its train part had 6 samples of 2 classes then and has 4 samples of 2 classes "
              "now"),
])
def test_eval_on_other_data_of_as_many_classes_is_refused(folders, capsys, other, difference):
    err = refused(capsys, "eval", folders["run"], "--data-root", folders[other])
    assert difference in err
    read, trained = folders[other].resolve(), folders["data"].resolve()
    assert f"the data read from {read} is not what {folders['run']} trained on: " in err
    assert f"point --data-root at the data the run trained on (it read {trained}), or " in err
    assert not (folders["run"] / "eval.json").exists()


def test_other_idx_files_found_under_the_data_root_variable_are_refused_naming_both_folders(
        tmp_path, monkeypatch, capsys):
    """A run trained on MNIST's IDX files found through ``$KDML_DATA_ROOT``, scored with the
    variable pointing at another copy of other labels: the refusal names the folder read now
    and the one the run read, as for image files. An array read from files had recorded no
    folder, so the line said only "the data of mnist" and "point --data-root at the data the
    run trained on", without saying where that was."""
    trained_root, other_root = tmp_path / "data", tmp_path / "other"
    trained = make_idx(trained_root, train=20, test=10, classes=4)
    other = make_idx(other_root, train=20, test=10, classes=4, seed=1)
    monkeypatch.setenv("KDML_DATA_ROOT", str(trained_root))
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "mnist", "--out", str(run),
                     *TINY]) == 0
    assert json.loads((run / "data.json").read_text())["folder"] == str(trained)
    monkeypatch.setenv("KDML_DATA_ROOT", str(other_root))
    err = refused(capsys, "eval", run)
    assert f"the data read from {other} is not what {run} trained on: " in err
    assert f"point --data-root at the data the run trained on (it read {trained}), or " in err


def test_a_moved_copy_of_the_data_is_evaluated(folders, tmp_path, capsys):
    moved = copy_of(folders["data"], tmp_path, "moved")
    run = copy_of(folders["run"], tmp_path, "run")  # eval writes its eval.json there
    assert cli.main(["eval", str(run), "--data-root", str(moved)]) == 0
    assert "test set: 6 samples" in capsys.readouterr().out


def test_a_run_without_data_json_is_not_checked(folders, tmp_path, capsys):
    """A run trained before kdml wrote data.json: scored as before, and given no file."""
    run = copy_of(folders["run"], tmp_path, "old")
    (run / "data.json").unlink()
    assert cli.main(["eval", str(run), "--data-root", str(folders["renamed"])]) == 0
    assert not (run / "data.json").exists()


@pytest.mark.parametrize(("text", "why"), [
    ("{bad", "not readable JSON: Expecting property name enclosed in double quotes: line 1 "
             "column 2 (char 1)"),
    ('{"data_fingerprint": 1, "parts": {}}', "kdml's record without its parts"),
    # counts the messages print as numbers: a string or null had raised ValueError or TypeError
    ('{"data_fingerprint": 1, "parts": {"train": {"samples": "5", "classes": 2}}}',
     "a part whose sample or class count is not a whole number"),
    ('{"data_fingerprint": 1, "parts": {"test": {"samples": 5, "classes": null}}}',
     "a part whose sample or class count is not a whole number"),
    ('{"data_fingerprint": 1, "parts": {"test": {"samples": true, "classes": 3}}}',
     "a part whose sample or class count is not a whole number"),
])
def test_a_damaged_data_json_is_refused_not_taken_for_the_users(folders, tmp_path, capsys,
                                                                 text, why):
    """A data.json that is not JSON was taken for a file of the user's: the check of the data
    was off without a word, and other data was scored."""
    run = copy_of(folders["run"], tmp_path, "damaged")
    (run / "data.json").write_text(text)
    err = refused(capsys, "eval", run, "--data-root", folders["renamed"])
    assert err == (f"kdml: error: {run / 'data.json'} is damaged ({why}), so the data this run "
                   "trained on cannot be checked; restore it from a copy, or delete it to go on "
                   "unchecked (a --resume then records the data it reads)")
    assert not (run / "eval.json").exists()


def test_embedding_another_dataset_with_the_runs_model_is_not_refused(folders, tmp_path):
    out = tmp_path / "other.npz"
    assert cli.main(["embed", str(folders["run"]), "--dataset", f"folder:{folders['fewer']}",
                     "--out", str(out)]) == 0
    assert out.is_file()


def run_on_a_copy(folders, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the run and of its data, the run's config pointing at the copy: the same run
    as one trained on it (its data.json holds paths relative to the data's folder)."""
    data = copy_of(folders["data"], tmp_path, "data")
    run = copy_of(folders["run"], tmp_path, "run")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["dataset"] = f"folder:{data}"
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run, data


def test_resume_with_data_root_says_where_moved_data_is_given(folders, capsys):
    """--resume takes no --data-root (nor any other flag): its refusal said only that the run
    keeps its own config, not how to follow data that moved (run_on_a_copy's edit)."""
    err = refused(capsys, "train", "--resume", folders["run"], "--data-root", folders["data"])
    assert err.endswith("--resume takes only the run folder: the run keeps its own config (edit "
                        "its config.yaml for what a resumed run can change, such as "
                        "train.epochs, or data.root where its data moved)"), err


def test_resume_on_changed_data_is_refused(folders, tmp_path, capsys):
    run, data = run_on_a_copy(folders, tmp_path)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0  # unchanged: fine
    (data / "c01" / "001.png").rename(data / "c01" / "100.png")
    before = (run / "data.json").read_text()
    err = refused(capsys, "train", "--resume", run, "--no-progress")
    assert "its train part has the same 6 samples of 2 classes but its files or labels" in err
    assert ("put back the data the run trained on where its config.yaml says, or point its "
            "data.root (or folder:/csv: path) at where it is now" in err)
    assert (run / "data.json").read_text() == before


def test_a_run_refused_before_its_first_checkpoint_resumes_on_the_mended_data(
        folders, tmp_path, capsys):
    """A run that stopped in its first epoch (an unreadable image: "replace or remove it")
    trained nothing, and --resume starts it over: on the data as mended, not refused for it."""
    run, data = run_on_a_copy(folders, tmp_path)
    for name in ("checkpoints", "plots", "tensorboard"):
        shutil.rmtree(run / name, ignore_errors=True)
    for name in ("metrics.csv", "metrics.json"):
        (run / name).unlink()
    (data / "c01" / "001.png").unlink()  # the unreadable image, removed
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert "has no checkpoint to continue from; training it from epoch 1" in capsys.readouterr().out
    assert json.loads((run / "data.json").read_text())["parts"]["train"]["samples"] == 5


def test_a_run_kept_as_records_alone_is_trained_again_on_its_own_data_only(
        folders, tmp_path, capsys):
    """docs/inspecting.md: `kdml train --resume RUN` trains a run kept without checkpoints
    again. On changed data it had trained without a word and replaced data.json, the record
    that told; the same resume with its checkpoint is refused."""
    run, data = run_on_a_copy(folders, tmp_path)
    shutil.rmtree(run / "checkpoints")
    (data / "c01" / "001.png").unlink()
    before = (run / "data.json").read_text()
    err = refused(capsys, "train", "--resume", run, "--no-progress")
    assert "its train part had 6 samples of 2 classes then and has 5 samples" in err
    assert (run / "data.json").read_text() == before


def test_resuming_a_run_without_data_json_writes_it_and_never_over_a_users_file(
        folders, tmp_path):
    run, _ = run_on_a_copy(folders, tmp_path)
    (run / "data.json").unlink()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert json.loads((run / "data.json").read_text()) == json.loads(
        (folders["run"] / "data.json").read_text()) | {"folder": str((tmp_path / "data").resolve())}
    (run / "data.json").write_text('{"mine": 1}')
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert (run / "data.json").read_text() == '{"mine": 1}'
    assert RunFolder(run).recorded_data() is None


def test_a_run_that_saved_no_checkpoint_takes_its_data_json_with_it(folders, tmp_path):
    run = copy_of(folders["run"], tmp_path, "stale")
    for name in ("checkpoints", "plots"):
        shutil.rmtree(run / name)
    for name in ("metrics.csv", "metrics.json"):
        (run / name).unlink()
    assert run / "data.json" in (stale_run_files(run) or [])
    (run / "data.json").write_text('{"mine": 1}')  # a file of the user's: not kdml's to remove
    assert stale_run_files(run) is None


# ----------------------------------------------------------------------------- the fingerprint


def files(root: str, labels: list[int], names: dict[int, str] | None = None) -> ImageFiles:
    paths = [f"{root}/c{label}/{number}.jpg" for number, label in enumerate(labels)]
    return ImageFiles("folder:x", "", np.asarray(paths), torch.tensor(labels),
                      class_names=names)


def arrays(x: torch.Tensor, labels: list[int]) -> ArrayDataset:
    return ArrayDataset("mnist", "", x, torch.tensor(labels))


def parts(dataset, **settings) -> dict:
    """The fingerprint's parts of ``dataset`` split class-disjoint (settings: make_splits's)."""
    splits = make_splits(dataset, {}, "class-disjoint", **settings)
    test_part = make_splits(dataset, {}, "class-disjoint") if splits.validation else None
    return data_fingerprint(splits, test_part)["parts"]


LABELS = [0, 0, 1, 1, 2, 2, 3, 3]


def test_the_digest_is_the_same_in_every_process():
    """Golden digests: no Python hash(), no memory address, nothing of the process in them (a
    change of what is hashed must change FORMAT)."""
    x = torch.arange(8 * 4, dtype=torch.uint8).reshape(8, 1, 2, 2)
    assert {name: part["sha256"][:16] for name, part in parts(arrays(x, LABELS)).items()} == {
        "train": "e75ae6a67046f47c", "test": "d7dce322490e7b8e"}
    assert {name: part["sha256"][:16] for name, part in parts(files("/d", LABELS)).items()} == {
        "train": "b0648cf0e1f0995f", "test": "98596beda385f579"}


def test_files_are_known_by_their_path_below_the_data_folder():
    here = data_fingerprint(make_splits(files("/data/sets/photos", LABELS), {},
                                        "class-disjoint"))
    moved = data_fingerprint(make_splits(files("/mnt/photos", LABELS), {}, "class-disjoint"))
    assert here["parts"] == moved["parts"]
    assert (here["folder"], moved["folder"]) == ("/data/sets/photos", "/mnt/photos")
    assert fingerprint_difference(here, moved) is None



def test_files_listed_out_of_path_order_are_known_below_the_folder_of_them_all():
    """A list need not be in the paths' order (a CSV list, In-Shop's parts): the folder cut off
    holds every file of the part, not only the first and last listed (both in c1/ here), so a
    moved copy still matches."""
    labels = [1, 0, 0, 1, 3, 2, 2, 3]
    here = data_fingerprint(make_splits(files("/data/sets/photos", labels), {}, "class-disjoint"))
    moved = data_fingerprint(make_splits(files("/mnt/photos", labels), {}, "class-disjoint"))
    assert here["parts"] == moved["parts"]
    assert (here["folder"], moved["folder"]) == ("/data/sets/photos", "/mnt/photos")

def test_the_same_files_on_windows_or_macos_hash_the_same(monkeypatch):
    """A run trained on Linux and scored on Windows (paths joined with a backslash) or on
    macOS (file names in decomposed Unicode) reads the same files: the same digest."""
    import unicodedata

    from kdml.data import fingerprint

    def named(paths: list[str]) -> dict:
        return parts(ImageFiles("folder:x", "", np.asarray(paths), torch.tensor(LABELS)))

    linux = [f"/data/café{label}/{number}.jpg" for number, label in enumerate(LABELS)]
    here = named(linux)
    decomposed = [unicodedata.normalize("NFD", path) for path in linux]  # as HFS+ stores them
    assert decomposed != linux and named(decomposed) == here
    windows = [f"C:\\data\\café{label}\\{number}.jpg" for number, label in enumerate(LABELS)]
    monkeypatch.setattr(fingerprint.os, "sep", "\\")
    assert named(windows) == here


def test_labels_samples_and_class_names_change_the_digest():
    x = torch.rand(8, 3)
    changed_x = x.clone()
    changed_x[1, 2] += 1
    assert parts(arrays(x, LABELS)) == parts(arrays(x.clone(), LABELS))  # same data
    assert parts(arrays(changed_x, LABELS))["train"] != parts(arrays(x, LABELS))["train"]
    assert parts(arrays(x, [0, 1, 0, 1, 2, 2, 3, 3]))["train"] != (
        parts(arrays(x, LABELS))["train"])
    assert parts(files("/d", [0, 1, 0, 1, 2, 2, 3, 3]))["train"] != (
        parts(files("/d", LABELS))["train"])
    names = {label: f"class {label}" for label in range(4)}
    assert parts(files("/d", LABELS, names))["train"] != parts(
        files("/d", LABELS, names | {0: "renamed"}))["train"]


def test_the_order_of_the_samples_is_part_of_the_digest():
    """The module docstring's promise: splits are deterministic, so two samples of one class
    listed the other way round (the same files and labels, in another order) are other data."""
    paths = np.asarray([f"/d/c{label}/{number}.jpg" for number, label in enumerate(LABELS)])
    swapped = paths.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # both of class 0
    listed = [parts(ImageFiles("folder:x", "", order, torch.tensor(LABELS)))["train"]
              for order in (paths, swapped)]
    assert listed[0]["samples"] == listed[1]["samples"] and listed[0] != listed[1]
    x = torch.rand(8, 3, generator=torch.Generator().manual_seed(0))
    assert parts(arrays(x[[1, 0, *range(2, 8)]], LABELS))["train"] != (
        parts(arrays(x, LABELS))["train"])


def own_parts(labels: list[int], paths: list[str] | None = None,
              names: dict[int, str] | None = None) -> dict:
    """The fingerprint of files of ``labels`` split as their own list says: train, then test."""
    dataset = files("/d", labels, names)
    if paths is not None:
        dataset.paths = np.asarray(paths)
    half = len(labels) // 2
    own = {"train": torch.arange(half), "test": torch.arange(half, len(labels))}
    return data_fingerprint(make_splits(dataset, own, "standard"))


def test_a_part_of_as_many_samples_in_other_classes_is_said_to_have_other_counts():
    """The class count is compared with the sample count: a part whose samples are as many
    but fall in fewer classes is said to have other counts, not only other labels."""
    recorded, now = own_parts([0, 1, 2, 2, 5, 5, 6, 6]), own_parts([0, 1, 1, 1, 5, 5, 6, 6])
    assert fingerprint_difference(recorded, now) == (
        "its train part had 4 samples of 3 classes then and has 4 samples of 2 classes now")


def test_file_names_that_are_not_utf8_are_told_apart():
    """Two file names that differ only in a byte that is not UTF-8 (read by Python as lone
    surrogates) are other files: their bytes are hashed, not a replacement character."""
    labels = [0, 1, 2, 3]
    first = own_parts(labels, ["/d/c0/a\udce9.jpg", "/d/c1/b.jpg", "/d/c2/c.jpg", "/d/c3/d.jpg"])
    other = own_parts(labels, ["/d/c0/a\udce8.jpg", "/d/c1/b.jpg", "/d/c2/c.jpg", "/d/c3/d.jpg"])
    assert first["parts"]["train"] != other["parts"]["train"]


def test_class_names_spelled_decomposed_hash_as_composed():
    """A class folder's name as macOS spells it (decomposed accents) names the same class."""
    import unicodedata

    composed = {0: "café", 1: "crème", 2: "x", 3: "y"}
    decomposed = {label: unicodedata.normalize("NFD", name) for label, name in composed.items()}
    assert decomposed != composed
    assert own_parts([0, 1, 2, 3], names=decomposed) == own_parts([0, 1, 2, 3], names=composed)


def test_computed_features_are_known_despite_last_bit_differences():
    """Generated and PCA-reduced features are floats that another BLAS, CPU or thread count
    computes a last bit apart: those differences (and -0.0 for 0.0) do not refuse the run's
    own data; a change in the fourth significant digit does."""
    x = torch.rand(8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.5
    x[0, 0] = 0.0
    nudged = torch.from_numpy(np.nextafter(x.numpy(), np.inf))
    nudged[0, 0] = -0.0
    assert parts(arrays(nudged, LABELS)) == parts(arrays(x, LABELS))
    changed = x.clone()
    changed[1, 2] *= 1.001
    assert parts(arrays(changed, LABELS))["train"] != parts(arrays(x, LABELS))["train"]



def test_float32_features_a_few_last_bits_apart_hash_the_same():
    """Float32 features (computed, or float64 rounded) a few units in the last place apart, as
    another BLAS gives them, are the same data: the digest drops the last 8 mantissa bits."""
    x = torch.rand(8, 3, generator=torch.Generator().manual_seed(0)) + 0.5
    bits = (x.numpy().view(np.uint32) & np.uint32(0xFFFFFF00)) | np.uint32(0x80)
    centred = torch.from_numpy(bits.view(np.float32).copy())
    nudged = torch.from_numpy((bits + np.uint32(3)).view(np.float32).copy())
    assert not torch.equal(centred, nudged)
    assert parts(arrays(nudged, LABELS)) == parts(arrays(centred, LABELS))

def test_a_validated_run_records_its_validation_and_test_parts():
    recorded = parts(files("/d", [label for label in range(10) for _ in range(2)]),
                     validation=0.4)
    assert {name: (part["samples"], part["classes"]) for name, part in recorded.items()} == {
        "train": (6, 3), "validation": (4, 2), "test": (10, 5)}



def test_a_query_gallery_split_records_its_gallery_part():
    """In-Shop's and a CSV list's query/gallery split: the gallery is a part of its own, so a
    gallery image changed is other data."""
    own = {"train": torch.tensor([0, 1, 2, 3]), "query": torch.tensor([4, 6]),
           "gallery": torch.tensor([5, 7])}
    recorded = data_fingerprint(make_splits(files("/d", LABELS), own, "standard"))
    assert {name: (part["samples"], part["classes"])
            for name, part in recorded["parts"].items()} == {
        "train": (4, 2), "test": (2, 2), "gallery": (2, 2)}
    other = files("/d", LABELS)
    other.paths[7] = "/d/c3/other.jpg"
    changed = data_fingerprint(make_splits(other, own, "standard"))
    assert fingerprint_difference(recorded, changed) == (
        "its gallery part has the same 2 samples of 2 classes but its files or labels differ")


def test_a_validated_run_of_a_query_gallery_split_records_its_gallery_part():
    """A validated run is finally scored on its test part's queries against its gallery: both
    are recorded, so a gallery image changed after training is other data."""
    labels = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    own = {"train": torch.arange(8), "query": torch.tensor([8, 10]),
           "gallery": torch.tensor([9, 11])}

    def recorded(dataset: ImageFiles) -> dict:
        return data_fingerprint(make_splits(dataset, own, "standard", validation=0.5),
                                make_splits(dataset, own, "standard"))

    before = recorded(files("/d", labels))
    assert {name: (part["samples"], part["classes"]) for name, part in before["parts"].items()
            } == {"train": (4, 2), "validation": (4, 2), "test": (2, 2), "gallery": (2, 2)}
    other = files("/d", labels)
    other.paths[11] = "/d/c5/other.jpg"
    assert fingerprint_difference(before, recorded(other)) == (
        "its gallery part has the same 2 samples of 2 classes but its files or labels differ")


def test_a_domain_pair_records_its_target_part():
    """A domain pair's target (the samples its method sees unlabelled) is a part of its own,
    as every run of a pair has recorded it: leaving it out would call their data changed."""
    from kdml.data.prepare import domain_splits

    source = arrays(torch.arange(16, dtype=torch.uint8).reshape(8, 2), LABELS)
    target = arrays(torch.arange(12, dtype=torch.uint8).reshape(6, 2), [0, 0, 1, 1, 2, 2])
    recorded = data_fingerprint(domain_splits(source, target))["parts"]
    assert {name: (part["samples"], part["classes"]) for name, part in recorded.items()} == {
        "train": (8, 4), "test": (6, 3), "target": (6, 3)}

def test_the_difference_is_said_part_by_part():
    recorded = data_fingerprint(make_splits(files("/d", LABELS), {}, "class-disjoint"))
    fewer = data_fingerprint(make_splits(files("/d", LABELS[:-1]), {}, "class-disjoint"))
    assert fingerprint_difference(recorded, fewer) == (
        "its test part had 4 samples of 2 classes then and has 3 samples of 2 classes now")
    assert fingerprint_difference({**recorded, FORMAT_FIELD: 2}, fewer) is None  # a newer kdml's


def test_a_data_json_of_the_users_sharing_a_field_name_is_never_replaced(tmp_path):
    """data.json counts as kdml's by its data_fingerprint field alone: a user's notes that
    happen to hold a "folder" or "parts" key are not written over."""
    run = RunFolder(tmp_path)
    mine = '{"folder": "my photos", "parts": "notes"}'
    run.data_fingerprint.write_text(mine)
    assert run.recorded_data() is None  # the user's: no check, and ...
    with pytest.raises(KdmlError, match=r"data\.json is in the way and kdml did not write it"):
        run.write_data_fingerprint({FORMAT_FIELD: 1, "folder": "/data", "parts": {"train": {}}})
    assert run.data_fingerprint.read_text() == mine  # ... never replaced


@pytest.mark.parametrize("parts", [{"train": {"samples": 6}, "test": 6}, [{"samples": 6}]])
def test_a_data_json_with_a_part_that_is_no_record_is_damaged(tmp_path, parts):
    """Every part must be a record, under its part's name: else it had been read as the run's
    data, or stopped the command with a traceback."""
    run = RunFolder(tmp_path)
    run.data_fingerprint.write_text(json.dumps({FORMAT_FIELD: 1, "parts": parts}))
    with pytest.raises(KdmlError, match=r"data\.json is damaged \(kdml's record without its "
                                        r"parts\)"):
        run.recorded_data()
