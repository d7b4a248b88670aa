"""Domain pairs: the MNIST -> optdigits conversion, the built-in pairs, the .npz feature
format and the source-fitted PCA."""

from __future__ import annotations

import math
import zipfile

import numpy as np
import pytest
import torch

from kdml.config import resolve_config
from kdml.data.dataset import ArrayDataset
from kdml.data.domains import (
    BINARIZE_THRESHOLD,
    DOMAIN_PAIRS,
    DomainPair,
    fit_source_pca,
    load_domain_data,
    load_domain_pair,
    load_feature_domains,
    mnist_to_optdigits,
)
from kdml.data.prepare import domain_splits
from kdml.errors import KdmlError
from kdml.models.backbones import build_backbone
from kdml.training.recipes import RECIPES, get_recipe

# ----------------------------------------------------------------- literal conversion


def bilinear_profile(on_first: int, on_last: int, side: int, out: int = 32) -> list[float]:
    """1-D bilinear resize (half-pixel centres, edge clamped) of a 0/1 profile of length
    ``side`` that is 1 on [on_first, on_last], to ``out`` samples."""
    values = []
    for j in range(out):
        x = min(max((j + 0.5) * side / out - 0.5, 0.0), side - 1.0)
        left = math.floor(x)
        right = min(left + 1, side - 1)
        frac = x - left

        def profile(i: int) -> float:
            return 1.0 if on_first <= i <= on_last else 0.0

        values.append((1 - frac) * profile(left) + frac * profile(right))
    return values


def literal_rectangle_counts(height: int, width: int, threshold: float) -> list[float]:
    """optdigits counts of a filled height x width rectangle on a black frame, by hand:
    crop = the rectangle; pad the short side to a square (smaller half first); bilinear
    resize to 32x32 (a rectangle is separable: row profile x column profile); binarize;
    count 4x4 blocks."""
    side = max(height, width)
    top, left = (side - height) // 2, (side - width) // 2
    rows = bilinear_profile(top, top + height - 1, side)
    cols = bilinear_profile(left, left + width - 1, side)
    bitmap = [[1 if r * c >= threshold else 0 for c in cols] for r in rows]
    return [float(sum(bitmap[4 * bi + a][4 * bj + b] for a in range(4) for b in range(4)))
            for bi in range(8) for bj in range(8)]


@pytest.mark.parametrize(("top", "left", "height", "width"),
                         [(5, 17, 14, 7), (2, 1, 9, 20), (20, 20, 6, 6), (0, 3, 28, 11)])
def test_conversion_of_an_off_centre_rectangle_matches_hand_computation(top, left, height, width):
    image = np.zeros((28, 28), dtype=np.uint8)
    image[top:top + height, left:left + width] = 255
    got = mnist_to_optdigits(image[None])
    expected = literal_rectangle_counts(height, width, BINARIZE_THRESHOLD)
    assert got.shape == (1, 64)
    assert got[0].tolist() == expected


def test_tall_rectangle_worked_example():
    # 14 x 7 box -> padded 3 left / 4 right in a 14 x 14 square -> on-columns 7..22 of 32:
    # per block row the counts are [0, 4 (col 7), 16, 16, 16, 12 (cols 20-22), 0, 0]
    image = torch.zeros(28, 28)
    image[5:19, 17:24] = 1.0
    counts = mnist_to_optdigits(image[None]).reshape(8, 8)
    assert counts.tolist() == [[0.0, 4.0, 16.0, 16.0, 16.0, 12.0, 0.0, 0.0]] * 8


def test_conversion_ignores_position_and_faint_pixels():
    square = torch.zeros(2, 28, 28)
    square[0, 2:10, 3:11] = 1.0
    square[1, 15:23, 18:26] = 1.0
    square[1, 0, 0] = BINARIZE_THRESHOLD / 2  # faint: outside the bounding box
    counts = mnist_to_optdigits(square)
    assert counts.tolist() == [[16.0] * 64, [16.0] * 64]  # a square fills the bitmap


def test_conversion_of_grey_strokes_is_in_range_and_dtype_agnostic():
    # grey, blurred random strokes in 28x28 frames (MNIST-like: uint8 with soft edges)
    gen = torch.Generator().manual_seed(0)
    strokes = (torch.rand(20, 1, 28, 28, generator=gen) > 0.93).float()
    blurred = torch.nn.functional.avg_pool2d(strokes, 3, stride=1, padding=1) * 3
    images = (blurred.clamp(0, 1)[:, 0] * 255).round().to(torch.uint8)
    as_uint8 = mnist_to_optdigits(images)
    as_float = mnist_to_optdigits((images.float() / 255).unsqueeze(1))
    assert torch.equal(as_uint8, as_float)
    assert as_uint8.shape == (20, 64)
    assert as_uint8.min() >= 0 and as_uint8.max() <= 16
    assert torch.equal(as_uint8, as_uint8.round())
    assert as_uint8.sum(dim=1).min() > 0
    assert mnist_to_optdigits(np.zeros((1, 28, 28), dtype=np.uint8)).tolist() == [[0.0] * 64]


def test_a_pixel_exactly_at_the_threshold_is_on():
    """The docstring's binarisation, on where intensity >= threshold; '>' (every pixel of an
    image at the threshold off) had passed every test, whose pixels were all away from it."""
    at = torch.full((1, 28, 28), BINARIZE_THRESHOLD)
    assert mnist_to_optdigits(at).tolist() == [[16.0] * 64]
    below = torch.nextafter(at, torch.zeros(()))
    assert mnist_to_optdigits(below).tolist() == [[0.0] * 64]


def test_conversion_rejects_bad_inputs():
    with pytest.raises(KdmlError, match="\\[0, 1\\]"):
        mnist_to_optdigits(torch.full((1, 28, 28), 200.0))
    # below 0 or NaN had passed as images of no ink: all-zero counts
    with pytest.raises(KdmlError, match="these hold values from -5 to -5$"):
        mnist_to_optdigits(torch.full((1, 28, 28), -5.0))
    strokes = torch.zeros(1, 28, 28)
    strokes[0, 5:20, 5:20] = float("nan")
    with pytest.raises(KdmlError, match="these hold NaN$"):
        mnist_to_optdigits(strokes)
    with pytest.raises(KdmlError, match="threshold"):
        mnist_to_optdigits(torch.zeros(1, 28, 28), threshold=1.5)
    with pytest.raises(KdmlError, match="images"):
        mnist_to_optdigits(torch.zeros(3, 5))


def test_conversion_of_no_images_and_refusal_of_colour_images_and_edge_thresholds():
    assert mnist_to_optdigits(torch.zeros(0, 28, 28)).shape == (0, 64)
    with pytest.raises(KdmlError, match="expected images \\[N, H, W\\]"):
        mnist_to_optdigits(torch.zeros(2, 3, 28, 28))  # colour: not the first channel alone
    for threshold in (0, 1):
        with pytest.raises(KdmlError, match="threshold must be in \\(0, 1\\)"):
            mnist_to_optdigits(torch.zeros(1, 28, 28), threshold=threshold)


# ----------------------------------------------------------------- built-in pairs


@pytest.mark.parametrize("name", list(DOMAIN_PAIRS))
def test_domain_pairs_load(name):
    pair = load_domain_pair(name)
    assert pair.name == name and pair.feature_size == 64
    sizes = {"mnist5k": 5000, "digits": 1797}
    source_name, target_name = name.split("->")
    assert len(pair.source) == sizes[source_name] and len(pair.target) == sizes[target_name]
    for dataset in (pair.source, pair.target):
        assert dataset.x.shape[1] == 64 and dataset.num_classes == 10
        assert dataset.x.min() >= 0 and dataset.x.max() <= 1
        counts = dataset.x * 16  # the same /16 scaling on both sides: integer block counts
        assert torch.allclose(counts, counts.round())
    # the two domains' features line up: a raw 1-NN from target to source is far above chance
    # (0.80 and 0.60; mirrored or misaligned MNIST blocks give 0.17)
    nearest = torch.cdist(pair.target.x, pair.source.x).argmin(dim=1)
    accuracy = (pair.source.y[nearest] == pair.target.y).double().mean()
    assert accuracy > {"mnist5k->digits": 0.7, "digits->mnist5k": 0.5}[name]


def test_converted_mnist_has_the_ink_of_optdigits():
    """The reason for BINARIZE_THRESHOLD: about as many on-pixels per digit (~309) as
    optdigits has (~313); 0.4 gives ~281, 0.5 ~266."""
    pair = load_domain_pair("mnist5k->digits")
    mnist, optdigits = ((dataset.x * 16).sum(dim=1).mean() for dataset in (pair.source,
                                                                            pair.target))
    assert abs(mnist - optdigits) < 0.03 * optdigits


def test_domain_splits_describe_their_test_set_as_the_target():
    pair = load_domain_pair("mnist5k->digits")
    splits = domain_splits(pair.source, pair.target)
    assert splits.test_set == "1,797 samples of the target domain, whose labels training never sees"
    # an npz: target's unlabelled samples (-1) are counted as not scored, as the metrics do
    unlabelled = pair.target.relabelled(torch.where(torch.arange(len(pair.target)) < 400,
                                                    -1, pair.target.labels))
    assert domain_splits(pair.source, unlabelled).test_set == (
        "1,797 samples of the target domain, whose labels training never sees, 1,397 of them "
        "labelled (400 unlabelled, which the metrics leave out)")
    # a labelled target sample alone in its class is no query, as target_metrics scores it
    # (an unlabelled one is no class of its own)
    lone = pair.target.relabelled(torch.tensor([0, 0, 1, -1, -1] * 359 + [2, -1]))
    assert domain_splits(pair.source, lone).lone_queries() == 1
    assert domain_splits(pair.source, lone).test_set.endswith(
        "1 of them is the only sample of its class and cannot be a query (nothing to "
        "retrieve): Recall@K, MAP@R and R-Precision leave it out")


def test_unknown_domain_pair_lists_the_valid_names():
    with pytest.raises(KdmlError, match="mnist5k->digits"):
        load_domain_pair("mnist->usps")


# ----------------------------------------------------------------- .npz features


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def good_arrays(domain_style: str = "strings"):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 0, -1, -1, 2])
    if domain_style == "strings":
        domain = np.array(["source", "source", "source", "source", "target", "target", "Target"])
    else:
        domain = np.array([0, 0, 0, 0, 1, 1, 1])
    return {"X": x, "y": y, "domain": domain}


@pytest.mark.parametrize("domain_style", ["strings", "ints"])
def test_npz_loader_splits_the_domains(tmp_path, domain_style):
    arrays = good_arrays(domain_style)
    pair = load_feature_domains(write_npz(tmp_path / "lbp.npz", **arrays))
    assert isinstance(pair, DomainPair) and pair.name == "lbp"
    assert torch.equal(pair.source.x, torch.from_numpy(arrays["X"][:4]))
    assert torch.equal(pair.target.x, torch.from_numpy(arrays["X"][4:]))
    assert pair.source.y.tolist() == [0, 1, 2, 0]
    assert pair.target.y.tolist() == [-1, -1, 2]


def test_npz_loader_reads_padded_domain_strings(tmp_path):
    """Fixed-width or padded strings, as CSV or pandas exports write them ('source ',
    ' target'): refusing them as unknown domain values had passed every test."""
    arrays = good_arrays()
    arrays["domain"] = np.array(["source ", " source", "source  ", "SOURCE", " target", "target ",
                                 "\tTarget"])
    pair = load_feature_domains(write_npz(tmp_path / "padded.npz", **arrays))
    assert torch.equal(pair.source.x, torch.from_numpy(arrays["X"][:4]))
    assert pair.target.y.tolist() == [-1, -1, 2]


def test_npz_loader_reads_unsigned_labels(tmp_path):
    arrays = good_arrays()
    arrays["y"] = np.array([0, 1, 2, 0, 1, 1, 2], dtype=np.uint8)
    pair = load_feature_domains(write_npz(tmp_path / "lbp.npz", **arrays))
    assert pair.source.y.dtype == torch.int64 and pair.target.y.tolist() == [1, 1, 2]


def test_npz_loader_reads_the_largest_int64_label_saved_unsigned(tmp_path):
    arrays = good_arrays()
    largest = int(np.iinfo(np.int64).max)
    arrays["y"] = np.array([0, 1, 2, 0, 1, 1, largest], dtype=np.uint64)
    pair = load_feature_domains(write_npz(tmp_path / "big.npz", **arrays))
    assert pair.target.y.tolist() == [1, 1, largest]


@pytest.mark.parametrize(("change", "message"), [
    ({"X": None}, "lacks the array\\(s\\) X"),
    ({"X": np.zeros((7,))}, "\\[N, D\\]"),
    ({"y": np.zeros(6, dtype=int)}, "y must have shape \\(7,\\)"),
    ({"domain": np.array(["source"] * 6)}, "domain must have shape"),
    # a count of 1 in the singular (it had said "1 source samples are unlabelled")
    ({"y": np.array([0, -1, 2, 0, -1, -1, 2])}, "1 source sample is unlabelled \\(y < 0\\)"),
    ({"y": np.array([-1, -1, 2, 0, -1, -1, 2])}, "2 source samples are unlabelled"),
    ({"y": np.arange(7, dtype=float)}, "y must be integers .*; save it as y.astype\\(int\\)"),
    ({"X": np.full((7, 3), np.nan)}, "NaN"),
    ({"X": np.full((7, 3), 1e39)}, "beyond float32's range"),  # finite in float64 only
    ({"domain": np.array(["source"] * 6 + ["test"])}, "unknown domain value"),
    ({"domain": np.array([0, 0, 0, 0, 1, 1, 2])}, "unknown domain value\\(s\\) \\['2'\\]"),
    ({"domain": np.array(["source"] * 7)}, "both domains"),
    ({"y": np.array([0, 1, 2, 0, -1, -3, 2])}, "-1 for unlabelled"),
    ({"y": np.array([0, 1, 2, 0, -1, -2, 2])}, "-1 for unlabelled"),
    ({"X": np.zeros((7, 0))}, "X must be a non-empty numeric"),
    # -1 saved unsigned is 2**64 - 1: the cast to int64 had wrapped it back to an unlabelled
    # source sample, trained on as class -1
    ({"y": np.array([0, 1, 2, -1, -1, -1, 2]).astype(np.uint64)}, "beyond int64's range"),
])
def test_npz_loader_errors(tmp_path, change, message):
    arrays = good_arrays()
    for key, value in change.items():
        if value is None:
            del arrays[key]
        else:
            arrays[key] = value
    with pytest.raises(KdmlError, match=message):
        load_feature_domains(write_npz(tmp_path / "bad.npz", **arrays))


def test_npz_loader_file_errors(tmp_path):
    with pytest.raises(KdmlError, match="does not exist"):
        load_feature_domains(tmp_path / "missing.npz")
    (tmp_path / "folder.npz").mkdir()
    with pytest.raises(KdmlError, match="folder.npz is a folder; give the .npz file"):
        load_feature_domains(tmp_path / "folder.npz")
    (tmp_path / "junk.npz").write_text("not an archive")
    with pytest.raises(KdmlError, match="not an .npz archive"):
        load_feature_domains(tmp_path / "junk.npz")
    np.save(tmp_path / "features.npy", np.zeros((4, 3)))
    with pytest.raises(KdmlError, match="is a single .npy array, not an .npz archive"):
        load_feature_domains(tmp_path / "features.npy")
    arrays = good_arrays()
    arrays["domain"] = np.array(["source"] * 4 + ["target"] * 3, dtype=object)
    with pytest.raises(KdmlError, match="object arrays"):
        load_feature_domains(write_npz(tmp_path / "objects.npz", **arrays))
    with zipfile.ZipFile(tmp_path / "header.npz", "w") as archive:  # not an object array
        archive.writestr("X.npy", b"\x93NUMPY\x01\x00\x10\x00{garbage header}\n")
    with pytest.raises(KdmlError, match=r"header.npz is not a readable .npz file without object "
                                        r"arrays \(Cannot parse header"):
        load_feature_domains(tmp_path / "header.npz")


def test_npz_loader_never_advises_loading_unsafely(tmp_path):
    # np.load takes a non-zip file for a pickle and suggests allow_pickle=True.
    (tmp_path / "features.txt").write_text("1 2 3\n")
    write_npz(tmp_path / "whole.npz", **good_arrays())
    (tmp_path / "cut.npz").write_bytes((tmp_path / "whole.npz").read_bytes()[:100])
    (tmp_path / "empty.npz").write_bytes(b"")
    for name in ("features.txt", "cut.npz", "empty.npz"):
        with pytest.raises(KdmlError) as caught:
            load_feature_domains(tmp_path / name)
        message = str(caught.value)
        assert "not an .npz archive" in message and "numpy.savez(" in message
        assert "pickle" not in message and "\n" not in message
    with zipfile.ZipFile(tmp_path / "raw.npz", "w") as archive:  # members that are not .npy
        for key in ("X", "y", "domain"):
            archive.writestr(key, b"raw")
    with pytest.raises(KdmlError, match="X, y, domain not saved as numpy arrays"):
        load_feature_domains(tmp_path / "raw.npz")
    for blank in ("npz:", "npz:  "):
        with pytest.raises(KdmlError, match="npz: needs a path"):
            load_domain_data(blank)


# ----------------------------------------------------------------- PCA


def make_pair(source_x: torch.Tensor, target_x: torch.Tensor) -> DomainPair:
    source = ArrayDataset("s", "", source_x, torch.zeros(len(source_x), dtype=torch.long))
    target = ArrayDataset("t", "", target_x, torch.full((len(target_x),), -1))
    return DomainPair(source, target, "toy", "toy pair")


def test_pca_is_fitted_on_the_source_only():
    gen = torch.Generator().manual_seed(0)
    # source varies along axis 0 (and a little along 2), target mostly along axis 1
    source = torch.randn(50, 3, generator=gen) * torch.tensor([5.0, 0.1, 1.0]) + 2.0
    target = torch.randn(30, 3, generator=gen) * torch.tensor([0.1, 9.0, 0.1])
    reduced = fit_source_pca(make_pair(source, target), 2)
    assert reduced.name == "toy+pca2" and reduced.feature_size == 2
    # literal reference: the source mean and the two leading eigenvectors of the source scatter
    mean = source.double().mean(dim=0)
    _, vectors = torch.linalg.eigh((source.double() - mean).T @ (source.double() - mean))
    axes = vectors[:, [2, 1]]
    for original, projected in ((source, reduced.source), (target, reduced.target)):
        expected = (original.double() - mean) @ axes
        got = projected.x.double()
        signs = torch.sign((got * expected).sum(dim=0))  # each axis is defined up to its sign
        assert torch.allclose(got * signs, expected, atol=1e-4)
        # the pair keeps its PCA, which projects raw inputs (kdml search) as it did the samples
        assert torch.equal(reduced.pca.project(original), projected.x)
    assert (reduced.pca.feature_size, reduced.pca.dim) == (3, 2)
    # changing the target changes nothing about the source projection
    other = fit_source_pca(make_pair(source, target * 100), 2)
    assert torch.equal(other.source.x, reduced.source.x)
    assert torch.equal(reduced.target.y, torch.full((30,), -1))


def test_pca_projects_as_scikit_learn_and_reads_back_bit_for_bit():
    """SourcePCA writes scikit-learn's transform out; a PCA read back from a checkpoint's
    tensors projects exactly as the fitted one (float64 product, then float32), also for a
    wide PCA whose product goes through BLAS."""
    from sklearn.decomposition import PCA

    from kdml.data.domains import SourcePCA

    generator = torch.Generator().manual_seed(0)
    for samples, features, dim in ((50, 3, 2), (300, 784, 50)):
        source = torch.randn(samples, features, generator=generator) * 3 + 1
        fitted = PCA(n_components=dim, svd_solver="full").fit(source.double().numpy())
        pca = fit_source_pca(make_pair(source, source[:5]), dim).pca
        inputs = torch.randn(40, features, generator=generator)
        expected = torch.from_numpy(fitted.transform(inputs.double().numpy()).astype(np.float32))
        assert torch.equal(pca.project(inputs), expected)
        state = pca.to_state()
        assert {key: (value.dtype, tuple(value.shape)) for key, value in state.items()} == {
            "mean": (torch.float64, (features,)),
            "components": (torch.float64, (dim, features))}
        read_back = SourcePCA.from_state(state, "last.pt")
        assert torch.equal(read_back.project(inputs), expected)
        assert (read_back.feature_size, read_back.dim) == (features, dim)


@pytest.mark.parametrize("state", [
    None, [], {"mean": torch.zeros(3, dtype=torch.float64)},
    {"mean": torch.zeros(3), "components": torch.zeros(2, 3)},  # float32
    {"mean": torch.zeros(4, dtype=torch.float64),
     "components": torch.zeros(2, 3, dtype=torch.float64)},
    {"mean": torch.zeros(3, dtype=torch.float64),
     "components": torch.zeros(0, 3, dtype=torch.float64)},
    {"mean": torch.zeros(1, 3, dtype=torch.float64),
     "components": torch.zeros(2, 3, dtype=torch.float64)},
    {"mean": torch.tensor([0.0, float("inf"), 0.0], dtype=torch.float64),
     "components": torch.zeros(2, 3, dtype=torch.float64)},
    {"mean": torch.zeros(3, dtype=torch.float64), "components": np.zeros((2, 3))},
])
def test_a_damaged_pca_state_is_refused_in_one_line(state):
    from kdml.data.domains import SourcePCA
    from kdml.errors import UnreadableCheckpoint

    with pytest.raises(UnreadableCheckpoint) as error:
        SourcePCA.from_state(state, "run/checkpoints/last.pt")
    assert str(error.value) == (
        "checkpoint run/checkpoints/last.pt is damaged: its input PCA is not the finite float64 "
        "mean [D] and components [dim, D] kdml writes; delete it and train again")


def test_pca_dim_is_checked():
    pair = make_pair(torch.randn(4, 6), torch.randn(3, 6))
    with pytest.raises(KdmlError, match="from 1 to 4"):
        fit_source_pca(pair, 5)
    with pytest.raises(KdmlError):
        fit_source_pca(pair, 0)
    assert fit_source_pca(pair, 4).feature_size == 4  # min(source samples, features)
    for side in (fit_source_pca(pair, 2).source, fit_source_pca(pair, 2).target):
        assert side.default_backbone == pair.source.default_backbone == "mlp"


def _refused_before_training(tmp_path, capsys, monkeypatch, *args):
    """``kdml train *args`` refused in one line before any step (a step would fail the test)."""
    from kdml import cli
    from kdml.training import trainer

    def never(*_, **__):
        raise AssertionError("trained before the settings were checked")

    monkeypatch.setattr(trainer, "train_one_epoch", never)
    out = tmp_path / "run"
    assert cli.main(["train", *map(str, args), "--out", str(out), "--no-progress",
                     "train.epochs=1", "train.device=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: ") and err.count("\n") == 1, err
    assert not (out / "checkpoints").exists()
    return err


def test_what_a_domain_pair_cannot_train_is_refused_before_training(tmp_path, capsys,
                                                                    monkeypatch):
    """Each of these trained an epoch and failed when it was scored, losing it: an Atlas
    recipe on a pair (chart retrieval has no cross-domain scoring), a target without one
    labelled sample, domain.beta on a recipe with its own domain term, and the DTML recipes
    without a pair (whose first error advised a batch size)."""
    arrays = good_arrays()
    arrays["y"] = np.where(arrays["domain"] == "source", arrays["y"], -1)
    unlabelled = write_npz(tmp_path / "unlabelled.npz", **arrays)
    labelled_arrays = good_arrays()
    labelled_arrays["y"] = np.array([0, 1, 2, 0, 2, -1, 2])  # 2 labelled targets: 1 reference
    labelled = write_npz(tmp_path / "labelled.npz", **labelled_arrays)
    err = _refused_before_training(tmp_path, capsys, monkeypatch, "dtml", "--dataset",
                                   f"npz:{write_npz(tmp_path / 'one.npz', **good_arrays())}")
    assert "has one labelled sample, so target retrieval has no reference to rank" in err
    err = _refused_before_training(tmp_path, capsys, monkeypatch, "mtriplet", "--dataset",
                                   "mnist5k->digits", "method.n_charts=2")
    assert "mtriplet is scored by chart retrieval, which kdml does not do across a domain " \
           "pair" in err
    err = _refused_before_training(tmp_path, capsys, monkeypatch, "dtml", "--dataset",
                                   f"npz:{unlabelled}", "eval.ks=[1]")
    assert "has no labelled sample, so a run cannot be scored" in err
    err = _refused_before_training(tmp_path, capsys, monkeypatch, "dtml", "--dataset",
                                   f"npz:{labelled}", "domain.beta=1", "eval.ks=[1]")
    assert err == ("kdml: error: dtml has its own domain term between source and target: set "
                   "method.beta, not domain.beta\n")
    err = _refused_before_training(tmp_path, capsys, monkeypatch, "mtriplet", "--dataset",
                                   "digits", "eval.metric=cosine")  # had been saved, not used
    assert "eval.metric=cosine does not apply to it; drop it" in err
    err = _refused_before_training(tmp_path, capsys, monkeypatch, "dtml", "--dataset",
                                   "mnist5k")
    assert err == ("kdml: error: dtml needs a target domain: set data.dataset to a domain pair "
                   "such as mnist5k->digits\n")


@pytest.mark.parametrize("recipe", ["dtml", "dstml", "ddml"])
def test_a_recipe_that_needs_a_target_is_refused_before_the_data_is_read(tmp_path, capsys,
                                                                          monkeypatch, recipe):
    """dtml on folder:DIR read the images and built its identity-initialised network over
    their 3 x 224 x 224 flattened pixels: "out of memory (tried to allocate 84.4 GiB); lower
    data.batch_size ...", exit status 1, before "dtml needs a target domain". The refusal
    comes before the data is read (here a missing folder, which had been said instead)."""
    err = _refused_before_training(tmp_path, capsys, monkeypatch, recipe, "--dataset",
                                   f"folder:{tmp_path / 'no-such-images'}")
    assert err == (f"kdml: error: {recipe} needs a target domain: set data.dataset to a "
                   "domain pair such as mnist5k->digits\n")


def test_a_recipe_with_charts_is_refused_a_domain_pair_before_it_is_read(tmp_path, capsys,
                                                                          monkeypatch):
    """mtriplet on mnist5k->digits read the pair (8 s) before "scored by chart retrieval";
    the refusal comes before the data is read (here a missing .npz, which had been said
    instead). msimclr is refused as augmenting images (test_bad_inputs)."""
    err = _refused_before_training(tmp_path, capsys, monkeypatch, "mtriplet", "--dataset",
                                   f"npz:{tmp_path / 'no-such-pair.npz'}")
    assert err == ("kdml: error: mtriplet is scored by chart retrieval, which kdml does not "
                   "do across a domain pair; train it on one dataset, or train a recipe "
                   "without charts (e.g. triplet) on the pair, with domain.beta\n")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_s_flags_say_what_its_method_does(name):
    """Recipe.has_charts and Recipe.needs_target refuse datasets from their names, for what the
    built method does (Method.has_charts, Method.uses_target): each must say the same."""
    recipe = get_recipe(name)
    config = resolve_config(name, recipe.params, recipe.defaults,
                            overrides=["model.embedding_size=16"])
    features = name in ("dtml", "dstml", "ddml", "ddml-logistic", "pca")
    backbone = build_backbone("identity", (64,)) if features else build_backbone(
        "cnn", (3, 32, 32))
    method = recipe.build(config, backbone, 5)
    assert (recipe.has_charts, recipe.needs_target) == (method.has_charts, method.uses_target)


def test_a_target_with_two_labelled_samples_of_class_0_is_scored():
    """Class 0 is a label (only -1 marks the unlabelled), and two labelled targets give each
    query one reference: neither is refused."""
    from kdml.config import RunConfig
    from kdml.training.checks import check_evaluation

    source = ArrayDataset("src", "s", torch.rand(6, 4), torch.arange(6) % 2)
    target = ArrayDataset("tgt", "t", torch.rand(5, 4), torch.tensor([0, 0, -1, -1, -1]))
    splits = domain_splits(source, target)
    assert splits.reference_size == 1
    config = RunConfig(recipe="dtml")
    config.eval.ks = [1]
    check_evaluation(config, splits)


def test_a_target_sharing_some_class_with_its_source_is_not_warned_about(caplog):
    """The warning that source_nn_accuracy is 0 whatever the model is for a target none of
    whose labelled samples has a source class; one such sample is enough."""
    import logging

    from kdml.training.checks import warn_about_splits

    source = ArrayDataset("src", "s", torch.rand(6, 4), torch.arange(6) % 2)
    log = logging.getLogger("kdml.test")
    with caplog.at_level("WARNING", logger="kdml.test"):
        warn_about_splits(domain_splits(source, ArrayDataset(
            "tgt", "t", torch.rand(4, 4), torch.tensor([0, 5, 6, -1]))), log)
        assert caplog.records == []
        warn_about_splits(domain_splits(source, ArrayDataset(
            "tgt", "t", torch.rand(4, 4), torch.tensor([5, 5, 6, -1]))), log)
    assert [record.getMessage().split(",")[0] for record in caplog.records] == [
        "no labelled target sample of tgt has a source class"]


def test_evaluation_check_counts_only_the_labelled_target_as_references():
    """Unlabelled target samples (-1) had been counted as references: eval.ks=[..., 8] passed
    the check before training with 5 labelled targets, and the first scoring failed."""
    from kdml.config import RunConfig
    from kdml.training.checks import check_evaluation

    source = ArrayDataset("src", "s", torch.rand(20, 4), torch.arange(20) % 2)
    target = ArrayDataset("tgt", "t", torch.rand(20, 4),
                          torch.tensor([0, 0, 1, 1, 0] + [-1] * 15))
    splits = domain_splits(source, target)
    assert splits.reference_size == 4
    config = RunConfig(recipe="dtml")
    config.eval.ks = [1, 2, 4, 8]
    with pytest.raises(KdmlError, match=r"asks for Recall@8 but a test query has only 4 "
                                        r"references; lower eval.ks, e.g. 'eval.ks=\[1, 2, 4\]'"):
        check_evaluation(config, splits)
    # two labelled targets: one reference each, in the singular (it had said "1 references")
    two = ArrayDataset("tgt", "t", torch.rand(4, 4), torch.tensor([0, 0, -1, -1]))
    splits = domain_splits(source, two)
    assert splits.reference_size == 1
    with pytest.raises(KdmlError, match=r"asks for Recall@8 but a test query has only 1 "
                                        r"reference; lower eval.ks, e.g. 'eval.ks=\[1\]'"):
        check_evaluation(config, splits)
