"""Batch transforms on the training device: uint8 -> float, augmentation, normalisation.

The loader yields raw batches (:class:`~kdml.data.dataset.Batch`); :class:`InputPipeline`
turns them into what the backbone takes:

- images decoded from files (uint8 squares of side ``data.resize``): for training, kornia's
  random resized crop to ``data.image_size`` (area 8-100%, aspect ratio 3/4-4/3) and a
  horizontal flip with probability 0.5; for testing, the centre crop of ``data.image_size``
  (the usual ``Resize(256)`` + ``CenterCrop(224)`` of DML papers, up to a pixel of
  rounding); ``simclr`` and ``msimclr`` train on that centre crop and make their own views;
- in-memory datasets: no augmentation (uint8 images are scaled to [0, 1]);
- then the backbone's :class:`Normalization` (mean, std, 0-255 scale, BGR order).

The augmentation's random parameters come from the step's generator, so a step's crops are a
function of (seed, epoch, step) alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from kdml.errors import KdmlError
from kdml.seeding import BatchShare, seed_stream, with_cpu_seed

if TYPE_CHECKING:  # imported where a pipeline is built: kornia's import takes ~0.4 s, which
    # every kdml command (and torchrun rank) that never augments files had paid at start-up
    import kornia.augmentation as K

CROP_SCALE = (0.08, 1.0)  # torchvision's RandomResizedCrop defaults
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)


@dataclass(frozen=True)
class Normalization:
    """How a backbone wants its input: ``(x * scale - mean) / std`` per channel, channels in
    RGB or BGR order, from images in [0, 1].

    The default is the identity (the small from-scratch backbones take [0, 1] inputs).
    ImageNet models take ``Normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))``;
    BN-Inception takes ``Normalization((104, 117, 128), (1, 1, 1), scale=255, bgr=True)``.
    """

    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    scale: float = 1.0
    bgr: bool = False

    def __post_init__(self) -> None:
        # a mismatch had surfaced as a ZeroDivisionError (for_channels) or a broadcast error
        if len(self.mean) != len(self.std):
            raise KdmlError(f"a normalisation takes one standard deviation per mean, got "
                            f"{len(self.mean)} means and {len(self.std)} standard deviations")
        if not all(value > 0 for value in self.std):  # NaN fails it too
            raise KdmlError(f"a normalisation's standard deviations must be > 0, got {self.std}")

    def for_channels(self, channels: int) -> Normalization:
        """The statistics for ``channels``-channel inputs: a backbone built for grayscale
        images (``in_chans=1``) takes the means of its RGB means and standard deviations,
        the usual convention for grayscale inputs to ImageNet-style models."""
        if not self.mean or len(self.mean) == channels:
            return self
        if channels == 1:
            return Normalization((sum(self.mean) / len(self.mean),),
                                 (sum(self.std) / len(self.std),), self.scale, bgr=False)
        raise KdmlError(f"a backbone normalised for {len(self.mean)} channels cannot take "
                        f"{channels}-channel images")

    def __call__(self, images: Tensor) -> Tensor:
        if self.bgr:
            images = images.flip(1)
        if self.scale != 1.0:
            images = images * self.scale
        if self.mean:
            shape = (1, -1) + (1,) * (images.ndim - 2)
            mean = torch.tensor(self.mean, dtype=images.dtype).to(images.device, non_blocking=True)
            std = torch.tensor(self.std, dtype=images.dtype).to(images.device, non_blocking=True)
            images = (images - mean.view(shape)) / std.view(shape)
        return images


def to_unit_float(inputs: Tensor) -> Tensor:
    """uint8 images -> float32 in [0, 1]; float inputs unchanged."""
    if inputs.dtype == torch.uint8:
        return inputs.float().div_(255.0)  # a new tensor: safe to divide in place
    return inputs


def centre_crop(images: Tensor, size: int) -> Tensor:
    """The central ``size x size`` window of ``[B, C, H, W]`` images (torchvision's rounding)."""
    height, width = images.shape[-2:]
    if size > min(height, width):
        raise KdmlError(f"cannot centre-crop {size}x{size} from {height}x{width} images; "
                        "data.image_size must be at most data.resize")
    top, left = int(round((height - size) / 2.0)), int(round((width - size) / 2.0))
    return images[..., top:top + size, left:left + size]


class InputPipeline:
    """Raw batch -> backbone input, for training (augmented) and testing.

    Args:
        crop_size: side of the crops of file-decoded images (``data.image_size``); ``None``
            for in-memory data, which is neither cropped nor flipped.
        normalization: the backbone's :class:`Normalization`.
        channels: the backbone's input channels; grayscale images are repeated to 3 when
            it takes RGB (``None``: as they come).
        method_augments: the method augments its [0, 1] training inputs itself and normalises
            afterwards (:attr:`~kdml.models.method.Method.augments_inputs`, SimCLR's views):
            training batches are then prepared as test batches are (the centre crop of
            file-decoded images), without augmentation or normalisation, where a random crop
            and flip here had been cropped again by the method's own views.

    Example::

        >>> pipeline = InputPipeline(crop_size=24)
        >>> raw = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
        >>> pipeline.train(raw, torch.Generator().manual_seed(0)).shape
        torch.Size([4, 3, 24, 24])
        >>> pipeline.test(raw).shape
        torch.Size([4, 3, 24, 24])
    """

    def __init__(self, crop_size: int | None = None,
                 normalization: Normalization | None = None,
                 channels: int | None = None, method_augments: bool = False) -> None:
        self.crop_size = crop_size
        self.normalization = normalization or Normalization()
        self.channels = channels
        self.method_augments = method_augments
        self.augment = None
        if crop_size is not None and not method_augments:
            import kornia.augmentation as K

            self.augment = K.AugmentationSequential(
                K.RandomResizedCrop((crop_size, crop_size), scale=CROP_SCALE, ratio=CROP_RATIO),
                K.RandomHorizontalFlip(p=0.5), data_keys=["input"])

    def output_shape(self, sample_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The backbone's input shape for raw samples of ``sample_shape``."""
        if len(sample_shape) != 3:
            return sample_shape
        channels = self.channels or sample_shape[0]
        if self.crop_size is None:
            return (channels, *sample_shape[1:])
        return (channels, self.crop_size, self.crop_size)

    def train(self, inputs: Tensor, generator: torch.Generator,
              share: BatchShare | None = None) -> Tensor:
        """Augmented training inputs; the random draws come from ``generator`` (CPU), for the
        global batch when ``share`` says these are a rank's rows of it."""
        if self.method_augments:
            if self.crop_size is not None:
                inputs = centre_crop(inputs, self.crop_size)
            return self._channels(to_unit_float(inputs))
        images = to_unit_float(inputs)
        if self.augment is not None:
            params = draw_parameters(self.augment, images.shape, generator, share)
            images = self.augment(images, params=params)
        return self.normalization(self._channels(images))

    def test(self, inputs: Tensor) -> Tensor:
        """Deterministic test inputs (centre crop for file-decoded images)."""
        if self.crop_size is not None:
            inputs = centre_crop(inputs, self.crop_size)  # before the float copy: 4x smaller
        return self.normalization(self._channels(to_unit_float(inputs)))

    def _channels(self, images: Tensor) -> Tensor:
        if self.channels == 3 and images.ndim == 4 and images.shape[1] == 1:
            return images.expand(-1, 3, -1, -1)
        return images


# Parameters of a kornia augmentation that are not one row per image.
BATCH_WIDE_PARAMETERS = ("order", "forward_input_shape")


def draw_parameters(augment: K.AugmentationSequential, shape: torch.Size,
                    generator: torch.Generator, share: BatchShare | None = None) -> list:
    """kornia's random parameters for a batch of ``shape``, drawn from ``generator``.

    With ``share``, the parameters of the whole global batch are drawn and this rank's rows
    kept, so each image gets the same augmentation whatever the number of processes.
    """
    local = shape[0]
    global_shape = shape if share is None else torch.Size((share.size, *shape[1:]))
    params = with_cpu_seed(seed_stream(generator),
                           lambda: augment.forward_parameters(global_shape))
    if share is None:
        return params
    rows = slice(share.offset, share.offset + local)
    for item in params:
        data = item.data
        if not isinstance(data, dict):  # a nested sequential's list; kdml's pipelines are flat
            raise TypeError(f"expected one augmentation's parameters, got {type(data).__name__}")
        for key, value in data.items():
            if key == "forward_input_shape":
                value = value.clone()
                value[0] = local
                data[key] = value
            elif key not in BATCH_WIDE_PARAMETERS and torch.is_tensor(value) and value.ndim and (
                    len(value) == share.size):
                data[key] = value[rows]
    return params
