"""End to end on real on-disk formats: every named dataset trains from its fixture through the
CLI, broken layouts stop with one line and leave no run folder, runs do not depend on the
number of loader workers, and memory stays flat as the number of images grows."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_array_sets import make_cifar10, make_cifar100, make_csv_list, make_idx
from fixtures_array_sets import make_image_folder as make_folder
from fixtures_photo_sets import make_cars196, make_cub, make_inshop, make_sop, write_matlab_v73

from kdml import cli

# Small crops keep the photo runs to a second or two on a CPU.
TINY = ["train.epochs=1", "model.embedding_size=8", "eval.nmi=false", "--no-progress",
        "data.resize=40", "data.image_size=32", "eval.ks=[1,2]", "train.device=cpu"]

# name -> (fixture builder returning the data root, batch size that the training split fills)
FORMATS = {
    "cub": (lambda root: make_cub(root, classes=4, per_class=4), 4),
    "cars196": (lambda root: make_cars196(root, classes=4, per_class=4), 4),
    "sop": (lambda root: make_sop(root, classes=4, per_class=3), 4),
    "inshop": (lambda root: make_inshop(root, items=6, per_item=4), 4),
    "cifar10": (make_cifar10, 20),
    "cifar100": (lambda root: make_cifar100(root, classes=10), 20),
    "mnist": (make_idx, 20),
    "fashion-mnist": (lambda root: make_idx(root, name="fashion-mnist", gzipped=False), 20),
}


def train(*args: str | Path) -> int:
    return cli.main([str(arg) for arg in args])


def printed_test_set_lines(capsys) -> list[str]:
    """The "test set: ..." lines printed since the last read."""
    return [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("test set:")]


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_format_trains_from_its_fixture(tmp_path, name, capsys):
    build, batch_size = FORMATS[name]
    root = build(tmp_path / "data")
    out = tmp_path / "run"
    assert train("train", "amsoftmax", "--dataset", name, "--data-root", root, "--out", out,
                 f"data.batch_size={batch_size}", *TINY) == 0
    final = json.loads((out / "metrics.json").read_text())["final"]
    assert 0.0 <= final["recall@1"] <= final["recall@2"] <= 1.0
    assert f"root: {root}" in (out / "config.yaml").read_text()
    if name in ("cifar10", "cifar100", "mnist", "fashion-mnist"):  # the files' split: seen
        assert 0.0 <= final["linear_accuracy"] <= 1.0
    else:
        assert "linear_accuracy" not in final
    printed = capsys.readouterr().out
    assert "recall@1" in printed
    if name == "inshop":  # had counted the queries alone: "test set: 6 samples of ..."
        assert "test set: 6 query and 6 gallery samples of 3 classes not seen" in printed


def test_folder_of_images_trains_with_the_default_crops(tmp_path):
    """``--dataset folder:DIR`` with the default 256-pixel decode and 224-pixel crops."""
    folder = make_folder(tmp_path, classes=4, per_class=4, size=48)
    out = tmp_path / "run"
    assert train("train", "jrd", "--dataset", f"folder:{folder}", "--out", out, "--no-progress",
                 "data.batch_size=4", "train.epochs=1", "eval.nmi=false", "eval.ks=[1,2]",
                 "model.embedding_size=8") == 0
    run = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= run["final"]["recall@1"] <= 1.0 and "train/regularizer" in run["epochs"][0]
    checkpoint = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    first_conv = next(v for k, v in checkpoint["method"].items() if k.endswith("0.weight"))
    assert first_conv.shape[1] == 3  # RGB photos


@pytest.mark.parametrize("query_gallery", [False, True])
def test_csv_list_trains(tmp_path, query_gallery):
    csv_file = make_csv_list(tmp_path, classes=4, per_class=4, query_gallery=query_gallery)
    out = tmp_path / "run"
    assert train("train", "amsoftmax", "--dataset", f"csv:{csv_file}", "--out", out,
                 "data.batch_size=4", *TINY) == 0
    assert 0.0 <= json.loads((out / "metrics.json").read_text())["final"]["recall@1"] <= 1.0


def test_eval_finds_a_moved_dataset_with_data_root(tmp_path, capsys):
    root = make_cub(tmp_path / "data", classes=4, per_class=4)
    out = tmp_path / "run"
    assert train("train", "amsoftmax", "--dataset", "cub", "--data-root", root, "--out", out,
                 "data.batch_size=4", *TINY) == 0
    final = json.loads((out / "metrics.json").read_text())["final"]
    moved = shutil.move(root, tmp_path / "elsewhere")
    assert train("eval", out) == 2
    assert f"data root {root} does not exist" in error_line(capsys)
    assert train("eval", out, "--data-root", moved) == 0
    assert json.loads((out / "eval.json").read_text())["metrics"] == pytest.approx(final)


@pytest.mark.parametrize("kind", ["folder", "csv"])
def test_eval_finds_a_moved_folder_or_csv_list_with_data_root(kind, tmp_path, capsys):
    """``folder:DIR`` and ``csv:FILE`` carry their path in their name: ``--data-root`` gives
    the folder's new place, or the folder the CSV list now lies in."""
    made = (make_folder(tmp_path / "data", classes=4, per_class=4) if kind == "folder"
            else make_csv_list(tmp_path / "data", classes=4, per_class=4))
    out = tmp_path / "run"
    assert train("train", "amsoftmax", "--dataset", f"{kind}:{made}", "--out", out,
                 "data.batch_size=4", *TINY) == 0
    final = json.loads((out / "metrics.json").read_text())["final"]
    moved = Path(shutil.move(tmp_path / "data", tmp_path / "elsewhere"))
    new_root = moved / made.relative_to(tmp_path / "data") if kind == "folder" else moved
    assert train("eval", out) == 2
    error_line(capsys)
    assert train("eval", out, "--data-root", new_root) == 0
    assert json.loads((out / "eval.json").read_text())["metrics"] == pytest.approx(final)


def test_eval_finds_a_moved_feature_file_with_data_root(tmp_path, capsys):
    """``npz:FILE`` (DTML's pre-extracted features) moves like a CSV list: ``--data-root``
    names the folder the file now lies in."""
    rng = np.random.default_rng(0)
    features = tmp_path / "data" / "lbp.npz"
    features.parent.mkdir()
    np.savez(features, X=rng.standard_normal((80, 6)).astype(np.float32),
             y=np.tile(np.arange(4), 20), domain=np.repeat(["source", "target"], 40))
    out = tmp_path / "run"
    assert train("train", "dtml", "--dataset", f"npz:{features}", "--out", out,
                 "data.batch_size=32", *TINY) == 0
    final = json.loads((out / "metrics.json").read_text())["final"]
    moved = Path(shutil.move(tmp_path / "data", tmp_path / "elsewhere"))
    capsys.readouterr()  # training's output (TINY's model.embedding_size sizes no DTML net)
    assert train("eval", out) == 2
    assert "lbp.npz" in error_line(capsys)
    assert train("eval", out, "--data-root", moved) == 0
    assert json.loads((out / "eval.json").read_text())["metrics"] == pytest.approx(final)


@pytest.mark.parametrize("shared", [True, False])
def test_a_target_without_source_classes_is_warned_of(tmp_path, capsys, shared):
    """Its source_nn_accuracy can only be 0, and was printed as a plain 0.0000."""
    rng = np.random.default_rng(0)
    features = tmp_path / "lbp.npz"
    labels = np.tile(np.arange(4), 10) if shared else np.repeat(np.arange(4), 10)
    np.savez(features, X=rng.standard_normal((40, 6)).astype(np.float32), y=labels,
             domain=np.repeat(["source", "target"], 20))
    out = tmp_path / "run"
    assert train("train", "dtml", "--dataset", f"npz:{features}", "--out", out,
                 "data.batch_size=16", "method.k1=2", "method.k2=3", *TINY) == 0
    warned = "lbp/target has a source class, so source_nn_accuracy" in capsys.readouterr().err
    assert warned != shared
    assert (json.loads((out / "metrics.json").read_text())["final"]["source_nn_accuracy"] == 0
            or shared)


# ----------------------------------------------------------------------------- broken layouts


def _remove(relative: str):
    return lambda root: (root / relative).unlink()


def _first_image(pattern: str):
    return lambda root: sorted(root.glob(pattern))[0].unlink()


def _append(relative: str, line: str):
    def append(root: Path) -> None:
        with (root / relative).open("a") as stream:
            stream.write(line)
    return append


def _truncate(relative: str):
    return lambda root: (root / relative).write_bytes((root / relative).read_bytes()[:100])


def _devkit_only(root: Path) -> None:
    """The classification release's files in place of Cars196's."""
    (root / "devkit").mkdir()
    (root / "cars_annos.mat").rename(root / "devkit" / "cars_meta.mat")
    shutil.rmtree(root / "car_ims")


BROKEN = {
    "cub": [(_remove("image_class_labels.txt"), "missing image_class_labels.txt"),
            (_first_image("images/*/*.jpg"), "missing image"),
            (_append("images.txt", "42\n"), "images.txt line 17 is malformed")],
    "cars196": [(_remove("cars_annos.mat"), "missing cars_annos.mat"),
                (_first_image("car_ims/*.jpg"), "missing image"),
                (_truncate("cars_annos.mat"), "not a readable MATLAB file"),
                (lambda root: write_matlab_v73(root / "cars_annos.mat"),
                 "cars_annos.mat is a MATLAB v7.3 (HDF5) file, which scipy cannot read; use "),
                (_devkit_only, "devkit/cars_meta.mat is of the Stanford Cars classification "
                               "release")],
    "sop": [(_remove("Ebay_test.txt"), "missing Ebay_test.txt"),
            (_first_image("*_final/*.JPG"), "missing image"),
            (_append("Ebay_train.txt", "7 1 1\n"), "Ebay_train.txt line")],
    "inshop": [(_remove("list_eval_partition.txt"), "missing list_eval_partition.txt"),
               (_first_image("img/*/*/*/*.jpg"), "missing image"),
               (_append("list_eval_partition.txt", "img/x.jpg id_1\n"), "malformed")],
    "cifar10": [(_remove("test_batch"), "test_batch"), (_truncate("data_batch_3"), "data_batch_3")],
    "mnist": [(_remove("t10k-labels-idx1-ubyte.gz"), "t10k-labels-idx1-ubyte"),
              (_truncate("train-images-idx3-ubyte.gz"), "train-images-idx3-ubyte")],
}
CASES = [(name, index) for name, cases in BROKEN.items() for index in range(len(cases))]


@pytest.mark.parametrize(("name", "case"), CASES)
def test_broken_layouts_give_one_line_and_no_run_folder(tmp_path, capsys, name, case):
    build, batch_size = FORMATS[name]
    root = build(tmp_path / "data")
    breaks, message = BROKEN[name][case]
    breaks(root)
    out = tmp_path / "run"
    assert train("train", "amsoftmax", "--dataset", name, "--data-root", root, "--out", out,
                 f"data.batch_size={batch_size}", *TINY) == 2
    line = error_line(capsys)
    assert message in line and name in line, line
    assert not out.exists()


@pytest.fixture(scope="module")
def skipped_run(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """A folder of 4 classes of 4 images whose first image of c03 (a test class) is not an
    image, and a run trained on it with data.on_bad_image=skip: (that image, the run, the
    "test set: ..." lines its training printed). Trained once per module for the tests that
    score, resume and embed it, each on its own copy."""
    root = tmp_path_factory.mktemp("skipped")
    folder = make_folder(root, classes=4, per_class=4, size=24)
    broken = sorted((folder / "c03").iterdir())[0]
    broken.write_bytes(b"\xff\xd8 this is not really a JPEG")
    run, printed = root / "run", io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert train("train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", run,
                     "data.batch_size=4", "data.on_bad_image=skip", *TINY) == 0
    lines = [line for line in printed.getvalue().splitlines() if line.startswith("test set:")]
    return broken, run, lines


def test_unreadable_image_stops_the_run_or_is_skipped(tmp_path, capsys, skipped_run):
    broken, trained, printed = skipped_run
    folder = broken.parent.parent
    stopped = tmp_path / "stopped"
    args = ["--dataset", f"folder:{folder}", "data.batch_size=4", *TINY]
    assert train("train", "amsoftmax", "--out", stopped, *args) == 2
    line = error_line(capsys)
    assert str(broken) in line and "data.on_bad_image=skip" in line
    # the same run trained with data.on_bad_image=skip (skipped_run)
    skipped = shutil.copytree(trained, tmp_path / "skipped")
    log = (skipped / "train.log").read_text()
    assert str(broken) in log
    # the line before scoring counts the 8 listed; once scored, it had still said 8, not the
    # 7 the metrics are of: the run and kdml eval count the 7 again above their metrics
    listed = "test set: 8 samples of classes not seen in training"
    scored = ("test set: 7 samples of classes not seen in training; 1 unreadable image of the 8 "
              "listed was left out (data.on_bad_image=skip)")
    assert printed == [listed, scored]
    assert ("1 of the 8 test samples was skipped as an unreadable image "
            "(data.on_bad_image=skip): the metrics use the other 7") in log
    assert train("eval", skipped) == 0
    assert printed_test_set_lines(capsys) == [listed, scored]
    # the finished run resumed scores nothing, and counts the 7 from its checkpoint's record
    assert train("train", "--resume", skipped, "--no-progress") == 0
    assert printed_test_set_lines(capsys) == [listed, scored]
    # the commands that do not train warn in the same form, once per skipped image
    capsys.readouterr()
    assert train("embed", skipped, "--out", tmp_path / "emb.npz") == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if str(broken) in line]
    assert warned == [f"kdml: warning: skipping unreadable image {broken}"]


def test_finished_run_resumed_counts_the_images_its_last_scoring_left_out(tmp_path, capsys,
                                                                          skipped_run):
    """A finished run resumed with nothing to train scores nothing: it had printed only the
    listed count above the metrics of its last scoring, which had left an image out. The
    checkpoint records the positions that scoring left out; one of a kdml before it (no such
    record) prints the listed count alone, as before. The run: skipped_run's, an image of its
    test part unreadable and skipped."""
    _, trained, printed = skipped_run
    run = shutil.copytree(trained, tmp_path / "run")
    listed = "test set: 8 samples of classes not seen in training"
    scored = ("test set: 7 samples of classes not seen in training; 1 unreadable image of the 8 "
              "listed was left out (data.on_bad_image=skip)")
    assert printed == [listed, scored]
    assert train("train", "--resume", run, "--no-progress") == 0
    assert printed_test_set_lines(capsys) == [listed, scored]
    last = run / "checkpoints" / "last.pt"
    old = torch.load(last, weights_only=True)
    del old["unreadable"]  # a checkpoint of a kdml before the record
    torch.save(old, last)
    assert train("train", "--resume", run, "--no-progress") == 0
    assert printed_test_set_lines(capsys) == [listed]


def test_dataset_without_a_root_says_where_to_put_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KDML_DATA_ROOT", raising=False)
    assert train("train", "amsoftmax", "--dataset", "cub", "--out", tmp_path / "run",
                 *TINY) == 2
    assert "--data-root DIR" in error_line(capsys)
    root = make_cub(tmp_path / "data" / "cub" / "CUB_200_2011", classes=4, per_class=4)
    monkeypatch.setenv("KDML_DATA_ROOT", str(tmp_path / "data"))  # found in its archive folder
    assert train("train", "amsoftmax", "--dataset", "cub", "--out", tmp_path / "run",
                 "data.batch_size=4", *TINY) == 0
    assert root.name == "CUB_200_2011"


# ----------------------------------------------------------------------------- determinism


def test_runs_are_identical_with_zero_or_two_workers(tmp_path):
    """Crops, flips, batches and prior samples come from (seed, epoch, step), not from the
    loader's processes."""
    folder = make_folder(tmp_path, classes=4, per_class=6, size=40)
    runs = []
    for workers in (0, 2):
        out = tmp_path / f"workers{workers}"
        assert train("train", "mtriplet", "--dataset", f"folder:{folder}", "--out", out,
                     "data.batch_size=8", "data.samples_per_class=4", "train.epochs=2",
                     f"data.num_workers={workers}", "method.n_charts=2", *TINY[1:]) == 0
        checkpoint = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
        runs.append((json.loads((out / "metrics.json").read_text()), checkpoint["method"]))
    (metrics0, weights0), (metrics2, weights2) = runs
    assert metrics0 == metrics2
    assert all(torch.equal(weights0[key], weights2[key]) for key in weights0)


# ----------------------------------------------------------------------------- memory

# VmHWM, not getrusage's ru_maxrss: a child started by fork + exec inherits the parent's peak in
# ru_maxrss, so under pytest it would report the test runner's own size.
MEMORY_SCRIPT = """
import sys
from kdml.cli import main
code = main()  # as `kdml` runs it
status = open("/proc/self/status").read()
print("peak_kib", status.split("VmHWM:")[1].split()[0])
sys.exit(code)
"""


@pytest.mark.slow
def test_peak_memory_stays_flat_as_images_quadruple(tmp_path):
    """Images are decoded batch by batch and only embeddings are kept: 4x the images must raise
    the peak by less than half of what holding the extra 300 decoded images would take (at
    512 px each is a 768 KiB uint8 square). A difference rather than a ratio, so that the
    test means the same whatever the baseline: a CUDA build of torch alone maps ~1 GB."""
    # The two runs go side by side (two cores, one thread each): each peak is its own process's.
    runs = {}
    for count in (100, 400):
        folder = make_folder(tmp_path / str(count), classes=4, per_class=count // 4, size=48)
        runs[count] = subprocess.Popen(
            [sys.executable, "-c", MEMORY_SCRIPT, "train", "amsoftmax", "--dataset",
             f"folder:{folder}", "--out", str(tmp_path / f"run{count}"), "--no-progress",
             "data.num_workers=0", "data.resize=512", "data.image_size=32",
             "data.batch_size=20", "train.epochs=1", "eval.nmi=false",
             "eval.embed_batch_size=20", "model.embedding_size=8",
             "train.device=cpu"],  # host memory: CUDA's libraries would dwarf the images
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
    peaks = {}
    for count, run in runs.items():
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        peaks[count] = int(out.split("peak_kib")[-1])
    extra_decoded = 300 * 3 * 512 * 512 / 1024  # KiB the 300 extra images would hold
    assert peaks[400] - peaks[100] < 0.5 * extra_decoded, peaks


@pytest.mark.parametrize("out", [None, "inside/run"])
def test_a_run_folder_inside_the_image_folder_is_refused(tmp_path, capsys, monkeypatch, out):
    """Trained from inside the photo folder with no --out, the run's runs/ folder became a
    class of the data: refused on a first run (no images yet) and, once runs/ existed, read
    with kdml's plots as its images."""
    folder = make_folder(tmp_path / "photos", classes=4, per_class=4, size=24)
    monkeypatch.chdir(folder)
    args = ["train", "amsoftmax", "--dataset", "folder:.", "data.batch_size=4", *TINY]
    assert train(*args, *(["--out", out] if out else [])) == 2
    assert error_line(capsys) == (
        f"kdml: error: the run folder {out or 'runs (where runs go without --out)'} would lie "
        f"inside {folder}, the image folder of --dataset folder:{folder}: its plots would be "
        "read as images of a class the next time; give --out a folder outside it")
    assert sorted(path.name for path in folder.iterdir()) == ["c00", "c01", "c02", "c03"]
    grid = tmp_path / "grid.yaml"  # a grid's folder alike
    grid.write_text("recipe: amsoftmax\ngrid: {train.seed: [0]}\n")
    assert train("train", "--config", grid, *args[2:], *(["--out", out] if out else [])) == 2
    assert "would lie inside" in error_line(capsys)
    assert sorted(path.name for path in folder.iterdir()) == ["c00", "c01", "c02", "c03"]
    assert train(*args, "--out", tmp_path / "run") == 0


def test_skipped_images_that_leave_one_test_class_are_refused(tmp_path, capsys):
    """Every image of one of the two test classes unreadable: skipped, they left a one-class
    test part whose metrics were all a trivial 1.0 (the listed labels had passed the check)."""
    folder = make_folder(tmp_path, classes=4, per_class=4, size=24)
    for image in (folder / "c03").iterdir():
        image.write_bytes(b"\xff\xd8 this is not really a JPEG")
    out = tmp_path / "run"
    assert train("train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", out,
                 "data.batch_size=4", "data.on_bad_image=skip", *TINY) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "kdml: error: the unreadable images data.on_bad_image=skip left out leave the test part "
        "with fewer than 2 classes, so Recall@K, MAP@R and R-Precision would be trivially 1 (or "
        "undefined); replace those images")
    assert not (out / "metrics.json").exists() or json.loads(
        (out / "metrics.json").read_text())["final"] is None


@pytest.mark.parametrize(("dataset", "overrides", "message"), [
    ("cub", ["data.train_classes=4"],
     "data.train_classes applies to the class-disjoint split only, and cub has a split of its "
     "own, which data.split=standard takes; drop it, or set data.split=class-disjoint"),
    ("digits", ["data.holdout_fraction=0.3"],
     "data.holdout_fraction applies to the seen-holdout split only, and the split is "
     "class-disjoint; drop it, or set data.split=seen-holdout"),
    ("digits", ["data.split=seen-holdout", "data.train_classes=3"],
     "data.train_classes applies to the class-disjoint split only, and the split is "
     "seen-holdout; drop it, or set data.split=class-disjoint"),
    ("mnist5k->digits", ["data.train_classes=3"],
     "data.train_classes applies to the class-disjoint split only, and mnist5k->digits is a "
     "domain pair, trained on its source and scored on its target; drop it"),
    ("mnist5k->digits", ["data.split=class-disjoint"],  # recorded, and ignored without a word
     "data.split does not apply to a domain pair, trained on its source and scored on its "
     "target; drop it"),
])
def test_a_split_setting_the_split_does_not_use_is_refused(tmp_path, capsys, dataset,
                                                           overrides, message):
    """data.train_classes on CUB's own split was ignored without a word (3 of 6 classes
    trained), while config.yaml recorded it; holdout_fraction outside seen-holdout alike."""
    root = make_cub(tmp_path / "cub", classes=6, per_class=2) if dataset == "cub" else None
    out = tmp_path / "run"
    assert train("train", "amsoftmax", "--dataset", dataset, "--out", out, *overrides, *TINY,
                 *(["--data-root", root] if root else [])) == 2
    assert error_line(capsys) == f"kdml: error: {message}"
    assert not out.exists()


def test_a_relative_data_root_gives_sources_that_lead_to_the_images(tmp_path, monkeypatch,
                                                                     capsys):
    """``kdml embed``/``index`` with a relative --data-root kept the sources relative to the
    folder they ran in, so ``kdml search`` run elsewhere printed paths that led nowhere."""
    root = make_cub(tmp_path / "cub", classes=4, per_class=4)
    out = tmp_path / "run"
    assert train("train", "amsoftmax", "--dataset", "cub", "--data-root", root, "--out", out,
                 "data.batch_size=4", *TINY) == 0
    monkeypatch.chdir(tmp_path)
    assert train("embed", out, "--data-root", "cub", "--out", tmp_path / "emb.npz") == 0
    sources = np.load(tmp_path / "emb.npz")["sources"]
    assert all(Path(source).is_absolute() and Path(source).is_file() for source in sources)
    # a file (a CSV list, say) is not the folder the data lies in: it had been searched under
    assert train("eval", out, "--data-root", root / "images.txt") == 2
    assert "images.txt is a file; give the folder the data lies in" in error_line(capsys)


@pytest.mark.parametrize(("validation", "said"), [(False, "test"), (True, "validation")])
def test_the_skip_warning_names_the_part_scored(caplog, validation, said):
    """A data.validation run scores its validation part in the test part's place: the warning
    of the images left out names that part (it had said "test samples")."""
    from types import SimpleNamespace

    from kdml.evaluation import evaluator

    splits = SimpleNamespace(test=list(range(8)), gallery=None, train=None, kind="unseen",
                             validation=validation)
    scored = {"test": SimpleNamespace(labels=torch.tensor([0, 0, 1, 1, 2, 2, 3]))}
    with caplog.at_level("WARNING"):
        evaluator._warn_of_skipped(scored, splits)
    assert (f"1 of the 8 {said} samples was skipped as an unreadable image "
            "(data.on_bad_image=skip): the metrics use the other 7") in caplog.text
