"""``load_image``: the decoded, resized and centre-cropped square against a literal Pillow
reference (resize the whole image's short side, then crop the centred square)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image

from kdml.data.images import load_image


def reference(path, size: int) -> np.ndarray:
    """torchvision's ``Resize(size)`` + centre square, written out with Pillow, with the same
    JPEG draft as ``load_image``."""
    with Image.open(path) as image:
        image.draft("RGB", (size, size))
        image = image.convert("RGB")
        width, height = image.size
        scale = size / min(width, height)
        new_size = (max(size, round(width * scale)), max(size, round(height * scale)))
        resized = image.resize(new_size, Image.Resampling.BILINEAR)
        left, top = (new_size[0] - size) // 2, (new_size[1] - size) // 2
        return np.asarray(resized.crop((left, top, left + size, top + size))).transpose(2, 0, 1)


@pytest.mark.parametrize("width,height,size,fmt", [
    (500, 375, 256, "PNG"), (333, 500, 256, "PNG"), (97, 61, 64, "PNG"), (61, 97, 50, "JPEG"),
    (1200, 801, 256, "JPEG"), (40, 40, 64, "PNG"), (257, 1000, 256, "JPEG"),
])
def test_load_image_equals_resize_then_crop(tmp_path, width, height, size, fmt):
    rng = np.random.default_rng(width * height)
    # smooth content plus noise, so that a shifted or differently filtered square would show
    coarse = rng.integers(0, 256, (height // 8 + 2, width // 8 + 2, 3), dtype=np.uint8)
    pixels = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC))
    pixels = (pixels + rng.integers(0, 20, pixels.shape)).clip(0, 255).astype(np.uint8)
    path = tmp_path / f"image.{fmt.lower()}"
    Image.fromarray(pixels).save(path, fmt)
    loaded = load_image(path, size)
    assert loaded.dtype == torch.uint8 and loaded.shape == (3, size, size)
    expected = reference(path, size)
    difference = np.abs(loaded.numpy().astype(int) - expected.astype(int))
    # Same filter taps; only Pillow's fixed-point rounding differs when it resamples a box, by
    # one grey level at most (a shifted or rescaled square would differ by tens on this noise)
    assert difference.max() <= 1 and difference.mean() < 0.5


def test_sixteen_bit_grey_is_scaled_not_clipped(tmp_path):
    """Pillow's own conversion clips 16-bit grey at 255 (almost all white); kdml scales it."""
    from kdml.data.images import load_image_as

    values = (np.arange(64).reshape(8, 8) * 1040).astype(np.uint16)  # 0 .. 65,520
    path = tmp_path / "grey16.png"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "I;16"
    expected = np.array([[round(int(v) / 257) for v in row] for row in values], dtype=np.uint8)
    grey = load_image_as(path, (1, 8, 8))
    assert np.array_equal(grey[0].numpy(), expected)
    rgb = load_image(path, 8)
    assert all(np.array_equal(rgb[channel].numpy(), expected) for channel in range(3))


@pytest.mark.parametrize(("pixels", "match"), [
    (np.full((8, 8), 0.5, dtype=np.float32), "32-bit float pixels"),
    (np.full((8, 8), 70_000, dtype=np.int32), "beyond 0..65535"),
    (np.full((8, 8), 65_536, dtype=np.int32), "beyond 0..65535"),
    (np.full((8, 8), -1, dtype=np.int32), "beyond 0..65535"),
])
def test_images_without_a_standard_range_are_refused(tmp_path, pixels, match):
    from kdml.data.images import DECODE_ERRORS, load_image_as

    path = tmp_path / "wide.tif"
    Image.fromarray(pixels).save(path)
    with pytest.raises(DECODE_ERRORS, match=match):
        load_image(path, 8)
    with pytest.raises(DECODE_ERRORS, match=match):
        load_image_as(path, (1, 8, 8))


def test_thirty_two_bit_grey_within_sixteen_bits_is_scaled(tmp_path):
    from kdml.data.images import load_image_as

    path = tmp_path / "grey32.tif"
    Image.fromarray(np.array([[0, 257], [65_535, 32_896]], dtype=np.int32)).save(path)
    assert Image.open(path).mode == "I"
    assert load_image_as(path, (1, 2, 2))[0].tolist() == [[0, 1], [255, 128]]


def test_an_image_decoded_like_wide_in_memory_samples_keeps_its_left_and_right(tmp_path):
    from kdml.data.images import load_image_as

    pixels = np.zeros((8, 16, 3), dtype=np.uint8)
    pixels[:, 8:] = 255  # dark left half, bright right half, as wide as the samples
    path = tmp_path / "wide.png"
    Image.fromarray(pixels).save(path)
    for channels in (1, 3):
        loaded = load_image_as(path, (channels, 4, 8))
        assert loaded.shape == (channels, 4, 8)
        assert (loaded[..., :3] < 30).all() and (loaded[..., 5:] > 225).all()


def test_big_endian_sixteen_bit_grey_is_scaled_not_clipped(tmp_path):
    from kdml.data.images import load_image_as

    path = tmp_path / "grey16be.tif"
    Image.fromarray(np.array([[0, 257], [65_535, 32_896]], dtype=">u2")).save(path)
    assert Image.open(path).mode == "I;16B"
    assert load_image_as(path, (1, 2, 2))[0].tolist() == [[0, 1], [255, 128]]


def test_a_decompression_bomb_is_an_unreadable_image(tmp_path, monkeypatch):
    from kdml.data.images import ImageFiles

    Image.fromarray(np.zeros((40, 40, 3), dtype=np.uint8)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 1,600 pixels: over twice the limit
    files = ImageFiles("f", "one", np.array([str(tmp_path / "big.png")]), torch.tensor([0]),
                       resize=8)
    assert files.__getitems__([0]).unreadable.tolist() == [True]


def test_image_files_take_one_label_per_path_and_name_their_subsets():
    from kdml.data.images import ImageFiles
    from kdml.errors import KdmlError

    with pytest.raises(KdmlError, match="^photos: 2 paths but 3 labels$"):
        ImageFiles("photos", "three", np.array(["a.png", "b.png"]), torch.tensor([0, 1, 2]))
    files = ImageFiles("photos", "three", np.array(["a.png", "b.png", "c.png"]),
                       torch.tensor([0, 1, 2]))
    part = files.subset(torch.tensor([2, 0]), "photos/test")
    assert part.name == "photos/test" and part.labels.tolist() == [2, 0]
    assert part.paths.tolist() == ["c.png", "a.png"]
    assert files.subset(torch.tensor([1])).name == "photos"
    assert files.sample_shape == (3, 256, 256) and files.resized(64).sample_shape == (3, 64, 64)


@pytest.mark.parametrize(("make", "reason"), [
    (lambda path: Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32)).save(path),
     ": 32-bit float pixels have no standard range: save the image with 8 or 16 bits"),
    (lambda path: Image.fromarray(np.full((8, 8), 70_000, dtype=np.int32)).save(path),
     ": 32-bit integer pixels beyond 0..65535 have no standard range"),
    (lambda path: path.write_text("not an image"), ": not a readable image file; replace"),
    (lambda path: None, ": not a readable image file \\(No such file or directory\\); "),
])
def test_training_and_embedding_report_why_an_image_does_not_decode(tmp_path, make, reason):
    """The loaders' workers only flag a bad file; the one-line error still gives the reason
    (as ``kdml search`` does for a query image), not just "not a readable image file"."""
    from kdml.data.images import ImageFiles
    from kdml.data.loaders import readable_batches, sequential_loader
    from kdml.errors import KdmlError

    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "good.png")
    bad = tmp_path / "bad.tif"
    make(bad)
    files = ImageFiles("folder:test", "two files", np.array([str(tmp_path / "good.png"),
                                                             str(bad)]),
                       torch.tensor([0, 1]), resize=8)
    with pytest.raises(KdmlError, match=re.escape(f"cannot decode image {bad}") + reason) as error:
        list(readable_batches(sequential_loader(files, 2, num_workers=0), files, "error"))
    assert "\n" not in str(error.value) and "data.on_bad_image=skip" in str(error.value)
    assert len(list(readable_batches(sequential_loader(files, 2, 0), files, "skip"))) == 1


def test_a_batch_of_image_files_holds_the_requested_samples_in_order(tmp_path):
    """``__getitems__`` yields each requested index's image, label and index in the order asked,
    flagging only the rows whose file does not decode (the others keep their pixels)."""
    from kdml.data.images import ImageFiles

    paths = []
    for value in (50, 100, 200):
        paths.append(str(tmp_path / f"{value}.png"))
        Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)).save(paths[-1])
    paths.append(str(tmp_path / "missing.png"))
    files = ImageFiles("f", "four", np.array(paths), torch.tensor([5, 6, 7, 8]), resize=8)
    batch = files.__getitems__([2, 3, 0])
    assert batch.labels.tolist() == [7, 8, 5] and batch.indices.tolist() == [2, 3, 0]
    assert batch.unreadable.tolist() == [False, True, False]
    assert batch.inputs[:, 0, 0, 0].tolist() == [200, 0, 50]
    assert batch.inputs.shape == (3, 3, 8, 8) and batch.inputs.dtype == torch.uint8


def test_missing_files_follow_links_and_keep_the_listed_order(tmp_path):
    """A link to an image is a file (as the decoder opens it); a link to nothing, a folder or
    an absent path is not; the missing are returned in the order listed (the error names the
    first)."""
    from kdml.data.images import missing_files

    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(tmp_path / "real.png")
    (tmp_path / "linked.png").symlink_to(tmp_path / "real.png")
    (tmp_path / "dangling.png").symlink_to(tmp_path / "nothing.png")
    (tmp_path / "folder.png").mkdir()
    paths = [str(tmp_path / name) for name in
             ("z.png", "linked.png", "folder.png", "real.png", "dangling.png", "a.png")]
    assert missing_files(paths) == [paths[0], paths[2], paths[4], paths[5]]
    assert missing_files(np.array([paths[1], paths[3]])) == []


def test_an_image_decoded_like_in_memory_samples_is_resampled_bilinearly(tmp_path):
    """``load_image_as`` of an image with the samples' aspect ratio is Pillow's bilinear,
    antialiased resize of the whole image (a nearest-neighbour resize keeps one pixel in four
    here, and differs by tens of grey levels on this noise)."""
    from kdml.data.images import load_image_as

    pixels = np.random.default_rng(0).integers(0, 256, (8, 16, 3), dtype=np.uint8)
    path = tmp_path / "noise.png"
    Image.fromarray(pixels).save(path)
    expected = np.asarray(Image.fromarray(pixels).resize((8, 4), Image.Resampling.BILINEAR))
    assert np.array_equal(load_image_as(path, (3, 4, 8)).numpy(), expected.transpose(2, 0, 1))
    grey = np.asarray(Image.fromarray(pixels).convert("L").resize((8, 4),
                                                                  Image.Resampling.BILINEAR))
    assert np.array_equal(load_image_as(path, (1, 4, 8))[0].numpy(), grey)


def test_a_link_in_a_loop_is_a_missing_file(tmp_path):
    """A link in a loop is no file (the folder listing's ``is_file`` raises ELOOP for it): it
    is named before training, not left to fail in the decoder."""
    from kdml.data.images import missing_files

    (tmp_path / "a.png").symlink_to(tmp_path / "b.png")
    (tmp_path / "b.png").symlink_to(tmp_path / "a.png")
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(tmp_path / "real.png")
    paths = [str(tmp_path / name) for name in ("real.png", "a.png", "b.png")]
    assert missing_files(paths) == paths[1:]


def test_an_image_that_decodes_when_read_again_is_called_unreadable_without_a_reason(tmp_path):
    """A worker flagged it but it decodes now (a failed read of the worker's): the error says
    only that it is not a readable image file, with no reason made up."""
    from kdml.data.images import ImageFiles
    from kdml.data.loaders import UNREADABLE, decode_failure

    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(tmp_path / "good.png")
    files = ImageFiles("f", "one", np.array([str(tmp_path / "good.png")]), torch.tensor([0]),
                       resize=4)
    assert decode_failure(files, 0) == UNREADABLE
