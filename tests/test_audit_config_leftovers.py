"""Audit of what earlier mutation audits left: the YAML loader's numbers Python will not read
(more digits than its limit, none at all), its octal refusal, the hint a refused setting's
value gets (``what_to_write``), the MNIST -> optdigits conversion against a float64
implementation of its documented steps (on grey images and on images larger than the bitmap),
and the loading checks of a run's checkpoint PCA, its data's folder and its weights' names.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kdml import cli
from kdml.config import check_fields, load_config_file
from kdml.data.domains import BINARIZE_THRESHOLD, mnist_to_optdigits
from kdml.errors import KdmlError

LIMIT = sys.get_int_max_str_digits()  # Python's limit on the digits of an int read from text

# ----------------------------------------------------------------- numbers in a config file


def test_the_digit_limit_counts_digits_not_underscores(tmp_path):
    """A number of exactly the limit's digits is read; one more is refused as too long; and a
    YAML 1.1 int of more characters than the limit but no digit (0x and underscores) is said
    to have none: it had been said to have more digits than Python reads."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"train:\n  seed: {'1' * LIMIT}\n")
    assert load_config_file(config_file) == {"train": {"seed": int("1" * LIMIT)}}
    config_file.write_text(f"train:\n  seed: {'1' * (LIMIT + 1)}\n")
    with pytest.raises(KdmlError, match=rf": a number of {LIMIT + 1:,} characters, more digits "
                                        rf"than Python reads \({LIMIT:,}\) \(line 2\)$"):
        load_config_file(config_file)
    no_digits = "0x" + "_" * LIMIT
    config_file.write_text(f"train:\n  seed: {no_digits}\n")
    with pytest.raises(KdmlError, match=r": '0x_+' is read by YAML 1\.1 as a number without "
                                        r"digits: write a number, or quote it as text \(line 2\)$"):
        load_config_file(config_file)


def test_a_config_file_s_base_60_number_may_be_quoted_as_text(tmp_path):
    """In a file, where a text setting may hold it, the base-60 refusal ends as the octal one
    does (an override's, tested elsewhere, drops that end)."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text("train:\n  epochs: 1:30\n")
    with pytest.raises(KdmlError, match=r"c\.yaml: '1:30' is read by YAML 1\.1 as base 60 "
                                        r"\(90\): write 90, or quote it as text \(line 2\)$"):
        load_config_file(config_file)


def test_zeros_alone_are_zero_not_octal(tmp_path):
    """00 is 0 to YAML 1.1 and to any other reader: no octal to refuse."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text("train:\n  seed: 00\n  epochs: -0_0\n")
    assert load_config_file(config_file) == {"train": {"seed": 0, "epochs": 0}}


def test_one_digit_after_zeros_is_that_digit_to_every_reader(tmp_path):
    """07 is 7 as octal and as decimal: it had been refused as "octal (7): write 7 or 7"."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text("train:\n  seed: 07\n  epochs: -0_03\n")
    assert load_config_file(config_file) == {"train": {"seed": 7, "epochs": -3}}
    config_file.write_text("train:\n  seed: 070\n")  # two digits: 56 or 70
    with pytest.raises(KdmlError, match=r"'070' is read by YAML 1\.1 as octal \(56\): write 70 "):
        load_config_file(config_file)


# ----------------------------------------------------------------- what to write instead


@pytest.mark.parametrize(("setting", "text", "hint"), [
    # YAML 1.1 refuses each unquoted (octal, too many digits): quoted, a float setting had
    # let the refusal out as a traceback where an int setting says what to write
    ("optim.lr", "010", ": write 10, without quotes"),
    ("optim.lr", "-010", ": write -10, without quotes"),
    ("optim.lr", "1" * 5000, ""),
    # int() had raised ValueError (a traceback) on the digits of the hint
    ("train.epochs", "1" * 5000, ""),
])
def test_a_quoted_number_yaml_refuses_unquoted_is_refused_in_one_line(tmp_path, capsys,
                                                                      setting, text, hint):
    expected = "int" if setting == "train.epochs" else "float"
    message = f"{setting}={text!r} has the wrong type; expected {expected}{hint}"
    assert cli.main(["config", "jrd", f"{setting}='{text}'"]) == 2
    assert capsys.readouterr().err == f"kdml: error: {message}\n"
    section, key = setting.split(".")
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"recipe: jrd\n{section}: {{{key}: '{text}'}}\n")
    assert cli.main(["config", "--config", str(config_file)]) == 2
    assert capsys.readouterr().err == f"kdml: error: {message}\n"


def test_a_library_user_s_octal_text_for_a_float_field_is_a_kdml_error():
    """check_fields, a library user's params checked without a config: the same refusal."""

    @dataclasses.dataclass
    class Params:
        rate: float = 0.5

    with pytest.raises(KdmlError, match=r"^method\.rate='010' has the wrong type; expected "
                                        r"float$"):
        check_fields(Params(rate="010"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("override", "message"), [
    # text with spaces around a whole number: still "without quotes" (not _whole_number's 3)
    ("train.epochs=' 3'", "train.epochs=' 3' has the wrong type; expected int: write 3, "
                          "without quotes"),
    # a fraction of an int setting: what a whole number is, not one chosen for the user
    ("train.epochs=2.5", "train.epochs=2.5 has the wrong type; expected int: write a whole "
                         "number"),
    ("train.epochs='2.5'", "train.epochs='2.5' has the wrong type; expected int"),
    ("train.epochs='1e999'", "train.epochs='1e999' has the wrong type; expected int"),
    ("train.epochs=1e3", "train.epochs='1e3' has the wrong type; expected int: write 1000"),
])
def test_the_hint_for_an_int_setting_names_only_a_number_the_value_writes(capsys, override,
                                                                         message):
    assert cli.main(["config", "jrd", override]) == 2
    assert capsys.readouterr().err == f"kdml: error: {message}\n"


# ----------------------------------------------------------------- MNIST -> optdigits, literally


def literal_resize_weights(size: int, out: int = 32) -> list[list[tuple[int, float]]]:
    """Each output sample's taps of a 1-D antialiased bilinear resize from ``size`` samples:
    half-pixel centres; a triangle filter of half-width 1 input pixel when enlarging, of the
    scale ``size / out`` when shrinking (a low-pass); weights renormalised where the frame
    cuts the filter."""
    scale = size / out
    width = max(scale, 1.0)
    taps = []
    for i in range(out):
        centre = (i + 0.5) * scale
        weights = [(j, 1.0 - abs(j + 0.5 - centre) / width) for j in range(size)]
        weights = [(j, w) for j, w in weights if w > 0]
        total = sum(w for _, w in weights)
        taps.append([(j, w / total) for j, w in weights])
    return taps


def literal_optdigits(image: list[list[float]], threshold: float) -> tuple[list[float], float]:
    """The five steps of mnist_to_optdigits' docstring in float64, on one image in [0, 1]:
    crop to the pixels >= threshold, pad to a centred square (odd leftover bottom/right),
    resize to 32x32 (antialiased bilinear, rows then columns), binarize (>= threshold), count
    4x4 blocks row-major. Also the bitmap's least distance to the threshold, so that a test
    can make sure float32's rounding cannot flip a pixel."""
    rows = [r for r, row in enumerate(image) if any(v >= threshold for v in row)]
    cols = [c for c in range(len(image[0])) if any(row[c] >= threshold for row in image)]
    if not rows:
        return [0.0] * 64, 1.0
    crop = [row[cols[0]: cols[-1] + 1] for row in image[rows[0]: rows[-1] + 1]]
    height, width = len(crop), len(crop[0])
    side = max(height, width)
    top, left = (side - height) // 2, (side - width) // 2
    square = [[0.0] * side for _ in range(side)]
    for r in range(height):
        square[top + r][left: left + width] = crop[r]
    taps = literal_resize_weights(side)
    across = [[sum(w * square[r][j] for j, w in taps[c]) for c in range(32)]
              for r in range(side)]
    bitmap = [[sum(w * across[j][c] for j, w in taps[r]) for c in range(32)]
              for r in range(32)]
    margin = min(abs(v - threshold) for row in bitmap for v in row)
    counts = [float(sum(bitmap[4 * bi + a][4 * bj + b] >= threshold
                        for a in range(4) for b in range(4)))
              for bi in range(8) for bj in range(8)]
    return counts, margin


def _strokes(count: int, height: int, width: int, seed: int) -> torch.Tensor:
    """Grey, blurred random strokes in [0, 1] (MNIST-like soft edges), [count, H, W]."""
    gen = torch.Generator().manual_seed(seed)
    dots = (torch.rand(count, 1, height, width, generator=gen) > 0.95).float()
    blurred = torch.nn.functional.avg_pool2d(dots, 3, stride=1, padding=1) * 2.5
    return blurred.clamp(0, 1)[:, 0]


def _check_against_literal(images: torch.Tensor, unit: torch.Tensor) -> None:
    got = mnist_to_optdigits(images)
    assert got.shape == (len(unit), 64)
    for index, image in enumerate(unit.double().tolist()):
        counts, margin = literal_optdigits(image, BINARIZE_THRESHOLD)
        assert margin > 1e-5, index  # no pixel float32 could put on the other side
        assert got[index].tolist() == counts, index


def test_grey_uint8_digits_convert_as_the_documented_steps_say():
    """MNIST's own kind of input, uint8 28x28 with grey edges (the literal tests before had
    0/1 rectangles alone): enlarged to the bitmap, from intensities v / 255."""
    images = (_strokes(6, 28, 28, seed=3) * 255).round().to(torch.uint8)
    _check_against_literal(images, images.double() / 255)


@pytest.mark.parametrize(("height", "width"), [(48, 40), (37, 64)])
def test_images_larger_than_the_bitmap_are_shrunk_with_a_low_pass(height, width):
    """(N, 1, H, W) float images whose crop is larger than 32x32: shrunk with the triangle
    filter widened by the scale (antialiased), not sampled at 4 points a pixel."""
    images = _strokes(4, height, width, seed=height)
    images[:, 0, :] = images[:, -1, :] = 1.0  # strokes at both edges: the crop is the frame
    _check_against_literal(images[:, None], images)


# ----------------------------------------------------------------- a run's checkpoint and data


def test_a_checkpoint_s_pca_is_used_only_at_the_run_s_pca_dim():
    """checkpoint_pca: the kept PCA where its size is data.pca_dim; None for another size
    (config.yaml's pca_dim edited since, which the data and settings checks then name),
    without pca_dim, and for a checkpoint from before kdml kept the PCA."""
    from kdml.training.loading import checkpoint_pca

    state = {"input_pca": {"mean": torch.zeros(5, dtype=torch.float64),
                           "components": torch.eye(3, 5, dtype=torch.float64)}}
    checkpoint = Path("run/checkpoints/last.pt")
    kept = checkpoint_pca(state, checkpoint, 3)
    assert kept is not None and (kept.dim, kept.feature_size) == (3, 5)
    assert checkpoint_pca(state, checkpoint, 2) is None
    assert checkpoint_pca(state, checkpoint, 0) is None
    assert checkpoint_pca({}, checkpoint, 3) is None


def test_the_folder_the_run_read_is_named_only_where_it_is_not_the_one_read_now():
    """check_run_data's refusal says "(it read F)" for data read from another folder than
    the run's; from the same folder it would only repeat the folder said before it."""
    from kdml.config import RunConfig
    from kdml.data.fingerprint import FORMAT, FORMAT_FIELD
    from kdml.training.loading import check_run_data

    def fingerprint(folder: str | None, samples: int) -> dict:
        return {FORMAT_FIELD: FORMAT, "folder": folder, "parts": {
            "train": {"samples": samples, "classes": 2, "kind": "array", "sha256": "0"}}}

    run = SimpleNamespace(root=Path("runs/r"), data_fingerprint=Path("runs/r/data.json"))
    config = RunConfig(recipe="amsoftmax")
    recorded = fingerprint("/data/sets", 5)
    difference = ("is not what runs/r trained on: its train part had 5 samples of 2 classes "
                  "then and has 4 samples of 2 classes now; REMEDY")
    anyway = ", or delete runs/r/data.json to use this data anyway"
    for folder, said in (("/data/sets", f"the data read from /data/sets {difference}"),
                         ("/new/sets", f"the data read from /new/sets {difference} "
                                       "(it read /data/sets)"),
                         (None, f"the data of {config.data.dataset} {difference} "
                                "(it read /data/sets)")):
        with pytest.raises(KdmlError) as refusal:
            check_run_data(run, recorded, config, None, None,  # type: ignore[arg-type]
                           "REMEDY", fingerprint=lambda folder=folder: fingerprint(folder, 4))
        assert str(refusal.value) == f"{said}{anyway}"
    check_run_data(run, recorded, config, None, None, "REMEDY",  # type: ignore[arg-type]
                   fingerprint=lambda: fingerprint("/new/sets", 5))  # a moved copy matches


def test_a_checkpoint_lacking_one_weight_and_holding_another_names_the_lacking_one():
    """first_mismatch: a weight the model has and the checkpoint lacks comes before one only
    the checkpoint has (the order its test's docstring gives, unchecked with both)."""
    from kdml.training.loading import first_mismatch

    saved = {"a": torch.zeros(2), "d": torch.zeros(1)}
    built = {"a": torch.zeros(2), "b": torch.zeros(1)}
    assert first_mismatch(saved, built) == "the checkpoint lacks b"


def test_only_a_validated_run_s_test_part_adds_test_to_its_plots_names():
    """TrainedRun.variant: -best for best.pt, -test for the test part of a run that validated;
    a run that never validated has no other part, so its plots keep their plain names."""
    from kdml.config import RunConfig
    from kdml.training.loading import TrainedRun

    run = SimpleNamespace(best_checkpoint=Path("r/checkpoints/best.pt"), plots=Path("r/plots"))
    for validation, validating, checkpoint, variant in (
            (0.0, False, "last.pt", ""), (0.0, False, "best.pt", "-best"),
            (0.2, True, "last.pt", ""), (0.2, False, "last.pt", "-test"),
            (0.2, False, "best.pt", "-best-test")):
        config = RunConfig(recipe="amsoftmax")
        config.data.validation = validation
        trained = TrainedRun(run, config, None, 1, None,  # type: ignore[arg-type]
                             Path("r/checkpoints") / checkpoint, None,  # type: ignore[arg-type]
                             SimpleNamespace(validation=validating))  # type: ignore[arg-type]
        assert trained.variant == variant
        assert trained.plot_path("charts") == Path(f"r/plots/charts{variant}.png")


@pytest.mark.parametrize(("overrides", "message"), [
    (["dtml", "data.dataset=mnist5k"], "dtml needs a target domain: set data.dataset to a "
                                       "domain pair such as mnist5k->digits"),
    (["jrd", "model.backbone=bogus"], "unknown backbone 'bogus'; choose one of: "),
    (["jrd", "data.dataset=digts"], "unknown dataset 'digts' (did you mean 'digits'?); "),
    (["mtriplet", "data.dataset=mnist5k->digits"], "mtriplet is scored by chart retrieval"),
])
def test_kdml_config_refuses_what_kdml_train_refuses_whatever_the_data(capsys, overrides,
                                                                        message):
    """kdml config printed these (exit 0), and kdml train refused the saved file before
    reading its data, as it refuses a grid's cells, which kdml config checks so already."""
    assert cli.main(["config", *overrides]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"kdml: error: {message}") and err.count("\n") == 1


def test_kdml_config_prints_a_config_for_a_device_this_machine_lacks(capsys, tmp_path):
    """A config written on a laptop for a GPU machine: the device is not checked, of a single
    config or of a grid's cells (whose check had refused it: "no CUDA device")."""
    assert cli.main(["config", "jrd", "train.device=cuda:7"]) == 0
    assert "device: cuda:7" in capsys.readouterr().out
    grid = tmp_path / "grid.yaml"
    grid.write_text("recipe: jrd\ngrid: {optim.lr: [0.001, 0.002]}\n")
    assert cli.main(["config", "--config", str(grid), "--device", "cuda:7"]) == 0
    assert "device: cuda:7" in capsys.readouterr().out


def test_kdml_config_takes_kdml_train_s_setting_flags(capsys, tmp_path):
    """`kdml config jrd --dataset cub` had been refused ("unrecognized arguments: --dataset"):
    a train command with config for train prints the config it would train, its flags'
    settings too; a flag beside an override of its key is refused as by kdml train."""
    weights = tmp_path / "w.pth"
    assert cli.main(["config", "jrd", "--dataset", "cub", "--data-root", str(tmp_path),
                     "--weights", str(weights), "--seed", "3", "--device", "cpu",
                     "data.batch_size=64"]) == 0
    import yaml

    config = yaml.safe_load(capsys.readouterr().out)
    assert (config["data"]["dataset"], config["data"]["root"], config["model"]["weights"],
            config["train"]["seed"], config["train"]["device"], config["data"]["batch_size"]) \
        == ("cub", str(tmp_path), str(weights), 3, "cpu", 64)
    assert cli.main(["config", "jrd", "--seed", "3", "seed=4"]) == 2
    assert capsys.readouterr().err == ("kdml: error: --seed and the override seed=4 both set "
                                       "train.seed; give one\n")
