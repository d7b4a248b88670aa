"""A run folder alone rebuilds its model: data.json records what the model takes
(kdml.data.sample_spec), and load_model builds from it the model load_run builds from the data."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_array_sets import make_image_folder

from kdml import cli
from kdml.config import resolve_config
from kdml.data.dataset import ArrayDataset
from kdml.data.sample_spec import FIELD, SampleSpec, holds_pixels
from kdml.errors import KdmlError
from kdml.training.loading import TrainedRun, load_model, load_run

TINY = ["--no-progress", "train.epochs=1", "train.steps_per_epoch=3", "eval.nmi=false",
        "model.embedding_size=8", "train.device=cpu"]
FOLDER = ["data.batch_size=4", "data.resize=36", "data.image_size=32", "eval.ks=[1,2]"]


def kdml(*args) -> int:
    return cli.main([str(arg) for arg in args])


def train(tmp_path, name, recipe, dataset, *overrides):
    run = tmp_path / name
    assert kdml("train", recipe, "--dataset", dataset, "--out", run, *TINY, *overrides) == 0
    return run


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    """``train(tmp_path, "run", "amsoftmax", "digits")``, trained once for the tests that read
    that very run (those that change it work on a copy: ``own_copy``)."""
    return train(tmp_path_factory.mktemp("digits"), "run", "amsoftmax", "digits")


@pytest.fixture(scope="module")
def validated_run(tmp_path_factory) -> Path:
    """``train(tmp_path, "run", "amsoftmax", "digits", "data.validation=0.4",
    "train.keep_best=true")``, trained once (a test that changes it works on a copy)."""
    return train(tmp_path_factory.mktemp("validated"), "run", "amsoftmax", "digits",
                 "data.validation=0.4", "train.keep_best=true")


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory) -> Path:
    """A run on ``make_image_folder(tmp_path, classes=4, per_class=4, size=32)`` with
    ``FOLDER``, trained once for the tests that only read it."""
    root = tmp_path_factory.mktemp("files")
    folder = make_image_folder(root, classes=4, per_class=4, size=32)
    return train(root, "run", "amsoftmax", f"folder:{folder}", *FOLDER)


def own_copy(run: Path, tmp_path: Path) -> Path:
    """A copy of one of the module's runs at ``tmp_path / "run"``, for a test to change."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def embedded(model, inputs: torch.Tensor) -> torch.Tensor:
    """What ``model`` makes of ``inputs`` (chart codes for an Atlas run), as kdml embeds."""
    model.method.eval()
    with torch.no_grad():
        batch = model.embedder.transform(inputs)
        if model.method.has_charts:
            coords, chart = model.method.chart_codes(batch)
            return torch.cat([coords, chart[:, None].to(coords.dtype)], 1)
        return model.method.embed(batch)


@pytest.mark.parametrize("kind", ["images", "validated", "atlas", "files", "domain pair"])
def test_the_run_folder_alone_rebuilds_the_model_its_data_builds(tmp_path, kind, request):
    """The model, its input pipeline and what it makes of test samples are those load_run
    builds from the data: digits' float images, a validated run's (its training classes less
    the validation ones), an Atlas run's chart heads, decoded files (resize, then crop; three
    channels) and a domain pair's PCA features (domain.beta wraps the method)."""
    if kind == "files":  # read only: the module's run of the same command
        run = request.getfixturevalue("folder_run")
    elif kind == "atlas":
        run = train(tmp_path, "run", "mtriplet", "digits", "method.n_charts=3",
                    "data.batch_size=20", "data.samples_per_class=4")
    elif kind == "domain pair":
        run = train(tmp_path, "run", "triplet", "mnist5k->digits", "domain.beta=0.5",
                    "data.batch_size=20", "data.samples_per_class=4")
    elif kind == "validated":  # and its best.pt is rebuilt alike (the module's run, read only)
        run = request.getfixturevalue("validated_run")
    else:  # read only: the module's run of the same command
        run = request.getfixturevalue("digits_run")
    best = kind == "validated"
    trained, model = load_run(run, best=best), load_model(run, best=best)
    assert not isinstance(model, TrainedRun)  # no data read
    assert model.samples == trained.samples
    assert model.samples == SampleSpec.from_record(
        json.loads((run / "data.json").read_text()), "data.json")
    assert type(model.method) is type(trained.method)
    built, loaded = model.method.state_dict(), trained.method.state_dict()
    assert built.keys() == loaded.keys()
    assert all(torch.equal(built[key], loaded[key]) for key in built)
    test = trained.splits.test
    inputs = torch.stack([test.load(i) for i in range(min(len(test), 12))])
    assert torch.equal(embedded(model, inputs), embedded(trained, inputs))
    assert (model.epoch, model.checkpoint) == (trained.epoch, trained.checkpoint)
    assert model.checkpoint.name == ("best.pt" if best else "last.pt")
    # digits trains on classes 0-4 (0-2 with validation), the folder on 2 of its 4 classes and
    # the domain pair on all 10 digits
    assert model.samples.train_classes == {"validated": 3, "files": 2, "domain pair": 10}.get(
        kind, 5)


def test_the_record_says_what_the_model_takes(digits_run, folder_run):
    """Digits (8 x 8 float images in [0, 1], 5 training classes, class-disjoint) and a folder
    of JPEGs (decoded to three channels at data.resize) as data.json records them."""
    run = digits_run
    assert json.loads((run / "data.json").read_text())[FIELD] == {
        "sample_shape": [1, 8, 8], "is_file_backed": False, "holds_pixels": True,
        "float_dtype": "float32", "default_backbone": "cnn", "train_classes": 5}
    run = folder_run
    record = json.loads((run / "data.json").read_text())[FIELD]
    assert (record["sample_shape"], record["is_file_backed"], record["holds_pixels"]) == (
        [3, 36, 36], True, False)


def test_image_shaped_features_with_negative_values_are_not_pixels():
    """Standardised features shaped like images (negative values, none above 1) are not
    pixels, whose queries would be decoded image files; a check of the maximum alone had
    passed every test."""
    labels = torch.arange(10) % 2
    x = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(0)).clamp(max=1.0)
    assert x.min() < 0 and x.max() <= 1
    assert not holds_pixels(ArrayDataset("feat", "standardised", x, labels))
    assert holds_pixels(ArrayDataset("img", "in [0, 1]", x.clamp(min=0.0), labels))
    assert holds_pixels(ArrayDataset("img", "uint8", torch.zeros(10, 3, 4, 4, dtype=torch.uint8),
                                     labels))


@pytest.mark.parametrize("channels", [2, 4])
def test_uint8_samples_of_other_than_one_or_three_channels_are_not_pixels(channels):
    """A decoded image file is grey (1 channel) or RGB (3): uint8 samples of 2 or 4 channels
    (an alpha plane, stacked features) match no decoded query, so they are not pixels."""
    labels = torch.arange(10) % 2
    x = torch.zeros(10, channels, 4, 4, dtype=torch.uint8)
    assert not holds_pixels(ArrayDataset("planes", f"{channels} uint8 planes", x, labels))


@pytest.mark.parametrize(("field", "value", "words"), [
    ("sample_shape", [1, 0, 8], "model_input.sample_shape is [1, 0, 8], not a list of sizes"),
    ("holds_pixels", "yes", "model_input.holds_pixels is 'yes', not true or false"),
    ("float_dtype", "int8", "model_input.float_dtype is 'int8', not one of float16"),
    ("train_classes", 0, "model_input.train_classes is 0, not a count"),
    ("default_backbone", "", "model_input.default_backbone is ''"),
    (None, None, "its model_input is not kdml's record of the fields default_backbone"),
])
def test_a_damaged_record_is_refused_in_one_line(tmp_path, digits_run, capsys, field, value, words):
    run = own_copy(digits_run, tmp_path)
    assert kdml("index", run, "--out", tmp_path / "index") == 0
    path = run / "data.json"
    recorded = json.loads(path.read_text())
    if field is None:
        del recorded[FIELD]["holds_pixels"]
    else:
        recorded[FIELD][field] = value
    path.write_text(json.dumps(recorded))
    np.savez(tmp_path / "q.npz", inputs=np.zeros((1, 1, 8, 8), dtype=np.float32))
    capsys.readouterr()
    assert kdml("search", run, "--index", tmp_path / "index", "--query", tmp_path / "q.npz") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kdml: error: {path} is damaged (") and words in err, err
    assert err.endswith("restore it from a copy, or delete its 'model_input' field to rebuild "
                        "the model from the run's data\n") and err.count("\n") == 1


def test_another_dataset_is_embedded_without_the_run_s_data(tmp_path, capsys):
    """`kdml eval/embed/index RUN --dataset D` read D alone: the run's own data may be gone."""
    folder = make_image_folder(tmp_path, classes=4, per_class=4, size=32)
    run = train(tmp_path, "run", "amsoftmax", f"folder:{folder}", *FOLDER)
    second = make_image_folder(tmp_path / "second", classes=6, per_class=5, size=32, seed=7)
    capsys.readouterr()
    there = [kdml("embed", run, "--dataset", f"folder:{second}", "--out", tmp_path / "a.npz"),
             kdml("eval", run, "--dataset", f"folder:{second}")]
    printed = capsys.readouterr().out
    shutil.rmtree(folder)
    gone = [kdml("embed", run, "--dataset", f"folder:{second}", "--out", tmp_path / "b.npz"),
            kdml("eval", run, "--dataset", f"folder:{second}"),
            kdml("index", run, "--dataset", f"folder:{second}", "--out", tmp_path / "index")]
    assert there == gone[:2] == [0, 0] and gone[2] == 0
    assert capsys.readouterr().out.startswith(printed.replace("a.npz", "b.npz"))
    first, again = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert all(np.array_equal(first[key], again[key]) for key in first.files)
    # the run's own data is still needed for its own parts
    assert kdml("embed", run, "--out", tmp_path / "c.npz") == 2
    assert "whose folder does not exist now" in capsys.readouterr().err


def test_resuming_a_run_without_the_record_adds_it(tmp_path, digits_run):
    """A run whose data.json predates the record gets it when it is resumed (its data checked
    against the fingerprint first; here a finished run, with nothing left to train), and is
    then rebuilt without its data."""
    run = own_copy(digits_run, tmp_path)
    path = run / "data.json"
    recorded = json.loads(path.read_text())
    path.write_text(json.dumps({key: value for key, value in recorded.items() if key != FIELD}))
    assert isinstance(load_model(run), TrainedRun)  # from its data
    assert kdml("train", "--resume", run, "--no-progress") == 0  # nothing left to train
    assert json.loads(path.read_text()) == recorded
    assert not isinstance(load_model(run), TrainedRun)


def test_a_checkpoint_that_does_not_fit_the_record_is_refused(tmp_path, digits_run):
    run = own_copy(digits_run, tmp_path)
    path = run / "data.json"
    recorded = json.loads(path.read_text())
    recorded[FIELD]["train_classes"] = 7
    path.write_text(json.dumps(recorded))
    with pytest.raises(KdmlError, match=r"does not match the model built from .*config.yaml "
                       r"and .*data.json \(7 training classes\): .* in the checkpoint and .* in "
                       r"the model; restore the run's files from a copy"):
        load_model(run)


def test_a_test_part_plot_of_a_validated_run_does_not_overwrite_its_validation_plot():
    """plots/NAME-test.png for the test part of a run that validated, apart from the validation
    part's plots/NAME.png (dropping the suffix, so the two overwrote each other, had passed
    every test)."""
    from pathlib import Path
    from types import SimpleNamespace

    from kdml.training.run_folder import RunFolder

    run = RunFolder(Path("run"))
    config = SimpleNamespace(data=SimpleNamespace(validation=0.2))
    paths = []
    for part in (["validation samples"], None):
        trained = SimpleNamespace(run=run, checkpoint=run.checkpoint, config=config,
                                  splits=SimpleNamespace(validation=part))
        trained.variant = TrainedRun.variant.fget(trained)  # what eval.json's name takes too
        paths.append(TrainedRun.plot_path(trained, "embedding"))
    assert paths == [run.plots / "embedding.png", run.plots / "embedding-test.png"]


def test_a_stray_data_root_of_an_older_run_is_dropped_not_refused(tmp_path):
    """A run saved by a kdml from before data.root was refused for a dataset that does not read
    it (digits) is still read, its root dropped; refusing it (blaming a --data-root the user
    never gave) had passed every test."""
    from kdml.config import save_config
    from kdml.training.loading import run_config
    from kdml.training.recipes import get_recipe
    from kdml.training.run_folder import RunFolder

    spec = get_recipe("amsoftmax")
    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    save_config(resolve_config(spec.name, spec.params, spec.defaults,
                               overrides=["data.dataset=digits"]), run.config)
    text = run.config.read_text()
    assert "\n  root: ''\n" in text
    run.config.write_text(text.replace("\n  root: ''\n", f"\n  root: {tmp_path}\n"))
    config = run_config(run)
    assert (config.data.dataset, config.data.root) == ("digits", "")


def test_a_checkpoint_of_another_recipe_or_config_is_refused_not_scored(tmp_path, capsys):
    """Another run's checkpoint copied into a run folder (or config.yaml edited since) loaded
    wherever the shapes fit, and kdml eval scored it under the folder's recipe and settings
    without a word, where --resume refused the same folder. An edit of the eval section, which
    only says how to score, is taken."""
    jrd = train(tmp_path, "jrd", "jrd", "digits")
    mrd = train(tmp_path, "mrd", "mrd", "digits")
    swapped = tmp_path / "swapped"
    shutil.copytree(jrd, swapped)
    shutil.copy(mrd / "checkpoints" / "last.pt", swapped / "checkpoints" / "last.pt")
    for load in (load_model, load_run):
        with pytest.raises(KdmlError, match=r"^checkpoint .*last.pt is a 'mrd' run but "
                           r".*config.yaml says 'jrd'; it belongs to another run: put the run's "
                           r"own checkpoint back, or train this config again$"):
            load(swapped)
    capsys.readouterr()
    assert kdml("eval", swapped, "--no-progress") != 0
    assert "is a 'mrd' run but" in capsys.readouterr().err
    assert not (swapped / "eval.json").exists()

    edited = tmp_path / "edited"
    shutil.copytree(jrd, edited)
    config = edited / "config.yaml"
    config.write_text(config.read_text().replace("  seed: 0\n", "  seed: 1\n"))
    for load in (load_model, load_run):
        with pytest.raises(KdmlError, match=r"config.yaml differs from the config checkpoint "
                           r".*last.pt was trained with: train.seed 0 -> 1; put the setting "
                           r"back in config.yaml, or the checkpoint belongs to another run$"):
            load(edited)
    config.write_text(config.read_text().replace("  seed: 1\n", "  seed: 0\n")
                      .replace("  - 1\n  - 2\n  - 4\n  - 8\n", "  - 1\n  - 2\n"))
    assert list(load_model(edited).config.eval.ks) == [1, 2]
    assert kdml("eval", edited, "--no-progress") == 0


def test_a_run_that_never_finished_an_epoch_is_said_so_before_its_data_is_read(tmp_path):
    """No checkpoint and no final scores: the run never finished an epoch, said by
    chosen_checkpoint itself (kdml search reads no data, and load_run checks the data's path
    only after the checkpoint)."""
    from kdml.errors import UnreadableCheckpoint
    from kdml.training.loading import chosen_checkpoint
    from kdml.training.run_folder import RunFolder

    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    with pytest.raises(UnreadableCheckpoint, match=r"^no checkpoint at .*last\.pt: the run has "
                                                   r"not finished an epoch"):
        chosen_checkpoint(run)


def test_a_data_path_of_the_wrong_kind_is_refused_as_gone(tmp_path):
    """A folder: dataset whose path is a file, or a csv:/npz: one whose path is a folder, is
    refused as the run's data moved, as a path that is gone is."""
    from kdml.training.loading import check_data_path
    from kdml.training.run_folder import RunFolder

    run = RunFolder(tmp_path / "run")
    (tmp_path / "list.csv").write_text("path,label\n")
    check_data_path(run, f"folder:{tmp_path}", "point --data-root")
    check_data_path(run, f"csv:{tmp_path / 'list.csv'}", "point --data-root")
    for dataset, kind in ((f"csv:{tmp_path}", "file"), (f"npz:{tmp_path}", "file"),
                          (f"folder:{tmp_path / 'list.csv'}", "folder")):
        words = f"names {dataset}, whose {kind} is not a {kind} now; point --data-root"
        with pytest.raises(KdmlError, match=re.escape(words) + "$"):
            check_data_path(run, dataset, "point --data-root")


def test_a_checkpoint_that_records_no_recipe_is_taken_for_the_folder_s():
    """A checkpoint without its config (an older kdml's) is not refused as another recipe's."""
    from pathlib import Path

    from kdml.training.loading import check_checkpoint_recipe

    for state in ({}, {"config": None}, {"config": {}}, {"config": {"recipe": "jrd"}}):
        check_checkpoint_recipe(state, "jrd", Path("last.pt"), "config.yaml")
    with pytest.raises(KdmlError, match="is a 'mrd' run but config.yaml says 'jrd'"):
        check_checkpoint_recipe({"config": {"recipe": "mrd"}}, "jrd", Path("last.pt"),
                                "config.yaml")


def test_thefirst_mismatch_of_the_weights_is_named():
    """The weight whose shape differs (not the first one that fits), else the first missing,
    else the first extra one."""
    from kdml.training.loading import first_mismatch

    def weights(**shapes):
        return {key: torch.zeros(shape) for key, shape in shapes.items()}

    assert first_mismatch(weights(a=(2,), b=(3, 1)), weights(a=(2,), b=(4, 1))) == (
        "b is (3, 1) in the checkpoint and (4, 1) in the model")
    assert first_mismatch(weights(a=(2,)), weights(a=(2,), c=(1,), b=(1,))) == (
        "the checkpoint lacks b")
    assert first_mismatch(weights(a=(2,), d=(1,)), weights(a=(2,))) == (
        "the checkpoint has d, which the model does not")
    assert first_mismatch(weights(a=(2,)), weights(a=(2,))) == "their weights differ"


def test_a_run_without_the_record_is_loaded_from_its_data_at_the_checkpoint_asked(
        tmp_path, validated_run, monkeypatch):
    """load_model loads a run without the record from its data (load_run), best.pt with best
    as load_run loads it, not last.pt; so too a run of data.pca_dim whose checkpoint, of a
    kdml before it kept the PCA, has none (fitted again on the run's data)."""
    import dataclasses

    import kdml.training.loading as loading

    run = own_copy(validated_run, tmp_path)
    path = run / "data.json"
    recorded = json.loads(path.read_text())
    path.write_text(json.dumps({key: value for key, value in recorded.items() if key != FIELD}))
    assert load_model(run, best=True).checkpoint == run / "checkpoints" / "best.pt"
    assert load_model(run).checkpoint == run / "checkpoints" / "last.pt"
    path.write_text(json.dumps(recorded))
    read = loading.run_config
    monkeypatch.setattr(loading, "run_config", lambda folder: dataclasses.replace(
        read(folder), data=dataclasses.replace(read(folder).data, pca_dim=8)))
    monkeypatch.setattr(loading, "load_run", lambda *args, **kwargs: kwargs.get("best", False))
    assert load_model(run, best=True) is True and load_model(run) is False


def test_the_model_is_put_on_the_device_its_embedder_embeds_on(tmp_path, digits_run, monkeypatch):
    """load_run and load_model move the method to the embedder's device (a GPU's; here
    torch's meta device stands for one, so that a model left on the CPU fails on CPUs too)."""
    import kdml.training.loading as loading

    run = own_copy(digits_run, tmp_path)
    monkeypatch.setattr(loading, "run_device", lambda device, trained: torch.device("meta"))
    for load in (load_model, load_run):
        model = load(run)
        assert model.embedder.device.type == "meta"
        assert {weight.device.type for weight in model.method.parameters()} == {"meta"}


@pytest.mark.parametrize(("field", "value", "kind"), [
    ("config", "amsoftmax", "str"), ("method", [1, 2], "list"), ("history", {}, "dict"),
    ("optimizer", 3, "int")])
def test_a_checkpoint_with_a_field_of_another_type_is_damaged_in_one_line(
        tmp_path, digits_run, capsys, field, value, kind):
    """The keys were checked, not their types: a 'config' that is no mapping stopped kdml eval
    with an AttributeError traceback, a 'method' that is no state dict with a TypeError."""
    run = own_copy(digits_run, tmp_path)
    last = run / "checkpoints" / "last.pt"
    torch.save({**torch.load(last, weights_only=True), field: value}, last)
    capsys.readouterr()
    assert kdml("eval", run, "--no-progress") == 2
    assert capsys.readouterr().err == (
        f"kdml: error: checkpoint {last} is damaged: its {field!r} is a {kind}, not what kdml "
        "writes; delete it and train again\n")


def test_a_checkpoint_lacking_a_tensor_of_the_model_is_refused_naming_it(tmp_path, digits_run):
    """A run's model loads its checkpoint strictly: one that lacks a tensor (here the class
    proxies) is refused naming it, not loaded with the tensor left at its random
    initialisation (a load with strict=False had passed every test)."""
    run = own_copy(digits_run, tmp_path)
    path = run / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    del state["method"]["head.proxies"]
    torch.save(state, path)
    with pytest.raises(KdmlError, match=r"does not match the model built from .*: the "
                       r"checkpoint lacks head\.proxies; "):
        load_model(run)


def test_a_resumed_run_whose_checkpoint_lacks_a_tensor_is_refused(tmp_path, digits_run, capsys):
    """--resume loads the checkpoint strictly too: one without the class proxies is refused
    in one line, not resumed with fresh random proxies (a load with strict=False had passed
    every test)."""
    run = own_copy(digits_run, tmp_path)
    path = run / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    del state["method"]["head.proxies"]
    torch.save(state, path)
    config = run / "config.yaml"
    assert config.read_text().count("  epochs: 1\n") == 1
    config.write_text(config.read_text().replace("  epochs: 1\n", "  epochs: 2\n"))
    assert kdml("train", "--resume", run, "--no-progress") != 0
    assert "last.pt does not match the run's config (another model shape or recipe: the " \
        "checkpoint lacks head.proxies); " in capsys.readouterr().err
