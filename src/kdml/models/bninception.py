r"""BN-Inception (Ioffe & Szegedy, ICML 2015), the backbone of JRD (Chu et al. 2020, Sec. 5.1)
and of most deep metric learning papers since Oh Song et al. 2016.

No maintained library ships it, so it is defined here. Parameter and buffer names and shapes
are those of the widely used port in Cadene's ``pretrainedmodels`` (``bninception.py``, the
model behind ``bn_inception-52deb4733.pth`` / ``bn_inception-239d2248.pth``), so such a file
loads with ``load_state_dict``; its classifier ``last_linear`` is not part of the backbone.

Every convolution is followed by BatchNorm and a ReLU. (That port applies each ReLU in place
to the BN output, whose variable is then passed on: the ReLU takes effect although the code
reads as if it did not. Here the ReLU is an explicit step.) The input convention is the
Caffe model's: BGR channels, values 0-255, mean (104, 117, 128) subtracted, std 1.

BatchNorm momentum is PyTorch's default 0.1. The port sets 0.9, a Caffe-style value that in
PyTorch would weight every new batch by 0.9; DML recipes freeze BatchNorm anyway
(``model.freeze_bn``). Pooled features, at 224 px, are the 1024 channels of ``inception_5b``
averaged over its 7x7 map, as the port's ``global_pool``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from kdml.data.transforms import Normalization
from kdml.errors import KdmlError

BGR_MEAN = (104.0, 117.0, 128.0)
NORMALIZATION = Normalization(BGR_MEAN, (1.0, 1.0, 1.0), scale=255.0, bgr=True)


class Block(NamedTuple):
    """One Inception block: output channels of each branch (0 = branch absent).

    ``reduction`` blocks (3c, 4e) have no 1x1 branch, stride-2 3x3 branches and a max-pool
    branch without projection.
    """

    name: str
    in_channels: int
    one: int  # 1x1
    reduce3: int  # 3x3 branch: 1x1 reduce, then 3x3
    out3: int
    reduce_double: int  # double 3x3 branch: 1x1 reduce, then two 3x3
    out_double: int
    pool_proj: int  # pooling branch's 1x1 projection (0: none, reduction blocks)
    pool: str  # avg | max
    reduction: bool = False


# The sides BN-Inception takes. conv1 (stride 2) and the two stem max-pools (stride 2, ceil
# mode) bring a side s to ceil((s - 6) / 8) at inception_3a. Reductions 3c and 4e each halve
# the side n in parallel branches, stride-2 3x3 convolutions (to ceil(n / 2)) and a ceil-mode
# 3x3 max-pool (to ceil((n - 1) / 2)), whose maps torch.cat joins: they agree only on an even
# n. So the side at 3a must be a positive multiple of 4, i.e. s in 32k-1 .. 32k+6 for k >= 1,
# and the last map is k x k (224 -> 7). Other sides fail inside the network (torch.cat's
# "Sizes of tensors must match", or below 23 a max-pool's "Output size is too small").
MIN_SIDE = 31
SIDE_PERIOD, SIDE_SPAN = 32, 8  # sides 32k-1 .. 32k+6: a span of 8 in every 32


def side_fits(side: int) -> bool:
    """Whether BN-Inception takes images whose height (or width) is ``side`` pixels."""
    return side >= MIN_SIDE and (side + 1) % SIDE_PERIOD < SIDE_SPAN


def nearest_sides(side: int) -> list[int]:
    """The sides BN-Inception takes nearest to ``side``: the next one below (if any) and above."""
    below = next((s for s in range(side - 1, MIN_SIDE - 1, -1) if side_fits(s)), None)
    above = next(s for s in range(max(side + 1, MIN_SIDE), side + SIDE_PERIOD + MIN_SIDE + 1)
                 if side_fits(s))
    return [s for s in (below, above) if s is not None]


def check_image_size(height: int, width: int) -> None:
    """Refuse, in one line, image sides BN-Inception cannot take (see :func:`side_fits`)."""
    for side in dict.fromkeys((height, width)):
        if not side_fits(side):
            nearest = " or ".join(map(str, nearest_sides(side)))
            raise KdmlError(
                f"backbone 'bninception' cannot take images of side {side}: it needs a side of "
                f"at least {MIN_SIDE}, and one of 32k-1 to 32k+6 (31-38, 63-70, ..., 223-230) "
                f"for its strided poolings to line up (nearest: {nearest}); set "
                f"data.image_size=224 as the paper (for image files), or choose another "
                f"backbone, e.g. model.backbone=cnn")


BLOCKS = (
    Block("3a", 192, 64, 64, 64, 64, 96, 32, "avg"),
    Block("3b", 256, 64, 64, 96, 64, 96, 64, "avg"),
    Block("3c", 320, 0, 128, 160, 64, 96, 0, "max", reduction=True),
    Block("4a", 576, 224, 64, 96, 96, 128, 128, "avg"),
    Block("4b", 576, 192, 96, 128, 96, 128, 128, "avg"),
    Block("4c", 576, 160, 128, 160, 128, 160, 128, "avg"),
    Block("4d", 608, 96, 128, 192, 160, 192, 128, "avg"),
    Block("4e", 608, 0, 128, 192, 192, 256, 0, "max", reduction=True),
    Block("5a", 1056, 352, 192, 320, 160, 224, 128, "avg"),
    Block("5b", 1024, 352, 192, 320, 192, 224, 128, "max"),
)


class _ConvBN:
    """Conv (with bias, as the port) -> BatchNorm -> ReLU. The two layers are registered on
    ``owner`` under the port's names ``<name>`` and ``<name>_bn``, so state-dict keys match;
    this object only remembers them and their order."""

    def __init__(self, owner: nn.Module, name: str, in_channels: int, out_channels: int,
                 kernel: int, stride: int = 1) -> None:
        owner.add_module(name, nn.Conv2d(in_channels, out_channels, kernel, stride,
                                         padding=kernel // 2))
        owner.add_module(f"{name}_bn", nn.BatchNorm2d(out_channels, eps=1e-5))
        self.owner, self.name = owner, name

    def __call__(self, x: Tensor) -> Tensor:
        conv, bn = getattr(self.owner, self.name), getattr(self.owner, f"{self.name}_bn")
        return torch.relu(bn(conv(x)))


class BNInception(nn.Module):
    """BN-Inception feature extractor.

    Args:
        pooling: ``"avg"`` (the port's global pooling), ``"max"`` or ``"avg+max"`` (their
            sum, used by several DML papers) over the last feature map.

    Shape:
        - Input: :math:`(B, 3, H, W)`, BGR 0-255 minus the mean (:data:`NORMALIZATION`);
          224 px in the papers. Each side must be one of 32k-1 .. 32k+6 (k >= 1: 31-38,
          63-70, ..., 223-230; :func:`side_fits`), else a one-line KdmlError.
        - Output: :math:`(B, 1024)` pooled features (``feature_size = 1024``).

    Example::

        >>> net = BNInception().eval()
        >>> net(torch.zeros(1, 3, 224, 224)).shape
        torch.Size([1, 1024])
    """

    feature_size = 1024
    input_channels = 3
    normalization = NORMALIZATION

    def __init__(self, pooling: str = "avg") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise KdmlError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.pooling = pooling
        # Layers are attributes of this module with the port's names; _ConvBN only records
        # which ones run in which order.
        self._stem = [_ConvBN(self, "conv1_7x7_s2", 3, 64, 7, stride=2),
                      _ConvBN(self, "conv2_3x3_reduce", 64, 64, 1),
                      _ConvBN(self, "conv2_3x3", 64, 192, 3)]
        self._blocks = [self._block(block) for block in BLOCKS]

    def _block(self, block: Block) -> dict[str, list[_ConvBN]]:
        prefix, stride = f"inception_{block.name}", 2 if block.reduction else 1
        branches: dict[str, list[_ConvBN]] = {}
        if block.one:
            branches["1x1"] = [_ConvBN(self, f"{prefix}_1x1", block.in_channels, block.one, 1)]
        branches["3x3"] = [
            _ConvBN(self, f"{prefix}_3x3_reduce", block.in_channels, block.reduce3, 1),
            _ConvBN(self, f"{prefix}_3x3", block.reduce3, block.out3, 3, stride)]
        branches["double"] = [
            _ConvBN(self, f"{prefix}_double_3x3_reduce", block.in_channels,
                    block.reduce_double, 1),
            _ConvBN(self, f"{prefix}_double_3x3_1", block.reduce_double, block.out_double, 3),
            _ConvBN(self, f"{prefix}_double_3x3_2", block.out_double, block.out_double, 3,
                    stride)]
        branches["pool"] = ([_ConvBN(self, f"{prefix}_pool_proj", block.in_channels,
                                     block.pool_proj, 1)] if block.pool_proj else [])
        return branches

    def features(self, images: Tensor) -> Tensor:
        """The last feature map, :math:`(B, 1024, H/32, W/32)`."""
        check_image_size(int(images.shape[-2]), int(images.shape[-1]))
        conv1, conv2_reduce, conv2 = self._stem
        x = nn.functional.max_pool2d(conv1(images), 3, 2, ceil_mode=True)
        x = nn.functional.max_pool2d(conv2(conv2_reduce(x)), 3, 2, ceil_mode=True)
        for block, branches in zip(BLOCKS, self._blocks, strict=True):
            x = self._run_block(block, branches, x)
        return x

    @staticmethod
    def _run_block(block: Block, branches: dict[str, list[_ConvBN]], x: Tensor) -> Tensor:
        outputs = []
        for name, layers in branches.items():
            y = x
            if name == "pool":
                if block.reduction:
                    y = nn.functional.max_pool2d(y, 3, 2, ceil_mode=True)
                elif block.pool == "max":
                    y = nn.functional.max_pool2d(y, 3, 1, padding=1, ceil_mode=True)
                else:
                    y = nn.functional.avg_pool2d(y, 3, 1, padding=1, ceil_mode=True,
                                                 count_include_pad=True)
            for layer in layers:
                y = layer(y)
            outputs.append(y)
        return torch.cat(outputs, dim=1)

    def forward(self, images: Tensor) -> Tensor:
        return global_pool(self.features(images), self.pooling)


POOLINGS = ("avg", "max", "avg+max")


def global_pool(feature_map: Tensor, pooling: str) -> Tensor:
    """Pool a :math:`(B, C, H, W)` map to :math:`(B, C)`: mean, max, or their sum."""
    if pooling == "avg":
        return feature_map.mean(dim=(2, 3))
    if pooling == "max":
        return feature_map.amax(dim=(2, 3))
    return feature_map.mean(dim=(2, 3)) + feature_map.amax(dim=(2, 3))
