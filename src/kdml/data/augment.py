r"""SimCLR's two-view augmentation on a batch of images, with kornia.

The pipeline of SimCLR's CIFAR-10 experiments (Chen et al. 2020), which Atlas uses for
MSimCLR (Korman, Sec. A.1): random resized crop, colour jitter of strength 0.5 applied with
probability 0.8, random grayscale with probability 0.2. It runs on whole batches on the
batch's device, with a different random draw for every image and every view. The draws come
from a given ``torch.Generator`` (the trainer's step generator), or else from torch's global
generator, so ``torch.manual_seed`` makes them repeatable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from kdml.data.transforms import draw_parameters
from kdml.errors import KdmlError
from kdml.seeding import BatchShare

if TYPE_CHECKING:  # imported where a pipeline is built (see kdml.data.transforms)
    import kornia.augmentation as K

__all__ = ["SimCLRAugment"]


class SimCLRAugment(nn.Module):
    r"""Two independently augmented views of a batch of images (SimCLR, Atlas Sec. A.1).

    Per view and image, in order:

    1. ``RandomResizedCrop`` to ``size`` (default: back to the input size), area fraction in
       ``crop_scale``, aspect ratio in :math:`[3/4, 4/3]`;
    2. horizontal flip with probability 0.5, only when ``horizontal_flip`` (off by default:
       mirrored digits are other symbols);
    3. with probability ``jitter_p``, colour jitter of strength :math:`s`: brightness,
       contrast and saturation factors in :math:`[1 - 0.8s, 1 + 0.8s]` and hue shift in
       :math:`[-0.2s, 0.2s]` (torchvision semantics, random order). Saturation and hue only
       exist for 3-channel images; 1-channel images get brightness and contrast;
    4. for 3-channel images, grayscale with probability ``grayscale_p``.

    Inputs are expected in :math:`[0, 1]`, as the offline datasets are. Works for any image
    size (the crop is built per input size) and 1 or 3 channels. No gradient flows through.

    Args:
        crop_scale: range of the cropped area fraction. Default: (0.08, 1.0) (SimCLR).
        jitter_strength: :math:`s`. Default: 0.5 (Atlas, Sec. A.1).
        jitter_p: probability of the colour jitter. Default: 0.8.
        grayscale_p: probability of grayscale (3-channel images). Default: 0.2.
        horizontal_flip: add random horizontal flips. Default: ``False``.
        size: side of the square crops; ``None`` keeps the input's size. The authors of Atlas
            crop to 32 (also for 28-pixel MNIST). Default: ``None``.

    Inputs: ``images`` :math:`(B, C, H, W)`, :math:`C \in \{1, 3\}`; optional ``generator``
    (a CPU ``torch.Generator``) for the random parameters.

    Shape: returns two tensors shaped like ``images``.

    Example::

        >>> augment = SimCLRAugment()
        >>> _ = torch.manual_seed(0)
        >>> view1, view2 = augment(torch.rand(4, 1, 28, 28))
        >>> view1.shape, bool((view1 != view2).any())
        (torch.Size([4, 1, 28, 28]), True)
    """

    def __init__(self, crop_scale: tuple[float, float] = (0.08, 1.0),
                 jitter_strength: float = 0.5, jitter_p: float = 0.8, grayscale_p: float = 0.2,
                 horizontal_flip: bool = False, size: int | None = None) -> None:
        super().__init__()
        low, high = crop_scale
        if not 0 < low <= high <= 1:
            raise KdmlError(f"crop_scale must satisfy 0 < low <= high <= 1, got {crop_scale}")
        if not 0 <= jitter_strength < 1.25:  # factors 1 - 0.8 s must stay positive
            raise KdmlError(f"jitter_strength must be in [0, 1.25), got {jitter_strength}")
        for name, p in (("jitter_p", jitter_p), ("grayscale_p", grayscale_p)):
            if not 0 <= p <= 1:
                raise KdmlError(f"{name} must be a probability, got {p}")
        self.crop_scale = (float(low), float(high))
        self.jitter_strength, self.jitter_p = jitter_strength, jitter_p
        self.grayscale_p, self.horizontal_flip = grayscale_p, horizontal_flip
        if size is not None and size < 1:
            raise KdmlError(f"size must be a positive crop side, got {size}")
        self.size = size
        self._pipelines: dict[tuple[int, int, int], K.AugmentationSequential] = {}

    def pipeline(self, channels: int, height: int, width: int) -> K.AugmentationSequential:
        """The kornia pipeline for images of this shape (built once, then cached)."""
        key = (channels, height, width)
        if key not in self._pipelines:
            import kornia.augmentation as K

            s = self.jitter_strength
            side = (height, width) if self.size is None else (self.size, self.size)
            steps: list[K.AugmentationBase2D] = [K.RandomResizedCrop(side, scale=self.crop_scale)]
            if self.horizontal_flip:
                steps.append(K.RandomHorizontalFlip(p=0.5))
            colour = (0.8 * s, 0.2 * s) if channels == 3 else (0.0, 0.0)  # saturation, hue
            steps.append(K.ColorJitter(0.8 * s, 0.8 * s, *colour, p=self.jitter_p))
            if channels == 3:
                steps.append(K.RandomGrayscale(p=self.grayscale_p))
            self._pipelines[key] = K.AugmentationSequential(*steps, data_keys=["input"])
        return self._pipelines[key]

    @torch.no_grad()
    def view(self, images: Tensor, generator: torch.Generator | None = None,
             share: BatchShare | None = None) -> Tensor:
        """One augmented view of ``images``; random parameters from ``generator`` (CPU) when
        given (those of the global batch when ``share`` says these are a rank's rows), else
        from torch's global generator."""
        if images.ndim != 4 or images.shape[1] not in (1, 3):
            raise KdmlError(
                "SimCLR augmentation needs images [B, C, H, W] with 1 or 3 channels, got shape "
                f"{tuple(images.shape)}"
            )
        if not images.is_floating_point():
            raise KdmlError(f"SimCLR augmentation needs float images in [0, 1], got {images.dtype}")
        channels, height, width = images.shape[1:]
        pipeline = self.pipeline(channels, height, width)
        if generator is None:
            return pipeline(images)
        return pipeline(images, params=draw_parameters(pipeline, images.shape, generator, share))

    def forward(self, images: Tensor, generator: torch.Generator | None = None,
                share: BatchShare | None = None) -> tuple[Tensor, Tensor]:
        return self.view(images, generator, share), self.view(images, generator, share)

    def extra_repr(self) -> str:
        return (f"crop_scale={self.crop_scale}, jitter_strength={self.jitter_strength}, "
                f"jitter_p={self.jitter_p}, grayscale_p={self.grayscale_p}, "
                f"horizontal_flip={self.horizontal_flip}, size={self.size}")
