"""Backbones: map a batch of inputs to pooled feature vectors of size ``feature_size``."""

from __future__ import annotations

import math

import torch
from torch import nn

from kdml.checks import is_positive_int
from kdml.errors import KdmlError


def _check_widths(owner: str, name: str, widths: object) -> tuple[int, ...]:
    """``widths`` (a backbone's layer widths) as a tuple of ints, refused in one line unless
    it is a non-empty sequence of positive integers: torch's own errors ("negative dimension",
    an IndexError, a float's "type must be tuple of ints") come from inside the layers, and a
    width of 0 built a network of empty layers with only a warning."""
    values = tuple(widths) if isinstance(widths, list | tuple) else ()
    if not values or not all(is_positive_int(width) for width in values):
        raise KdmlError(f"{owner}: {name} must be a non-empty tuple of positive integers, got "
                        f"{widths!r}")
    return tuple(int(width) for width in values)


class SmallCNN(nn.Module):
    """A compact CNN for 1- or 3-channel images of side 8 and up, trained from scratch.

    Conv-BN-ReLU blocks; the first blocks halve the resolution (while it stays at least 4x4),
    then global average pooling gives the pooled feature. Images larger than 64x64 (photos
    cropped to 224) first pass a stem of stride-2 convolutions and max-pools, each dividing the
    side by 4, until it is at most 64, as ResNet's stem does: a quick CPU baseline, far from
    the pretrained backbones of the papers.

    Args:
        in_channels: 1 or 3.
        image_size: the input side length, at least 8.
        widths: channels of the conv blocks; the last one is ``feature_size``.

    Shape:
        - Input: [B, in_channels, H, W].
        - Output: [B, widths[-1]].
    """

    def __init__(self, in_channels: int = 1, image_size: int = 28,
                 widths: tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        # an integer: 3.0 and True compare equal to 3 and 1, and 3.0 then failed inside
        # nn.Conv2d with torch's "argument 'size' failed to unpack"
        if not is_positive_int(in_channels) or in_channels not in (1, 3):
            raise KdmlError(f"SmallCNN takes 1- or 3-channel images, got {in_channels!r} "
                            "channels")
        if not is_positive_int(image_size) or image_size < 8:
            # data.image_size, for image files: named, as BN-Inception's check_image_size does
            raise KdmlError(f"SmallCNN takes images of side 8 or more, got side {image_size!r}; "
                            "set data.image_size=8 or more (for image files), or choose "
                            "another backbone, e.g. model.backbone=mlp")
        widths = _check_widths("SmallCNN", "widths", widths)
        layers: list[nn.Module] = []
        channels = int(in_channels)
        while image_size > 64:
            layers += [nn.Conv2d(channels, widths[0], 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            channels, image_size = widths[0], image_size // 4
        # Halve while the map stays >= 4x4: 8x8 -> 1 pooling, 28x28 -> 2, 64x64 -> 3.
        num_pools = min(len(widths), int(math.log2(image_size / 4)))
        for index, width in enumerate(widths):
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False),
                       nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            if index < num_pools:
                layers.append(nn.MaxPool2d(2))
            channels = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.layers = nn.Sequential(*layers)
        self.feature_size = widths[-1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)


class MLP(nn.Module):
    """A ReLU MLP for vectors; ``feature_size`` is the last hidden width.

    Shape:
        - Input: [B, in_features] (extra dimensions are flattened).
        - Output: [B, hidden[-1]].
    """

    def __init__(self, in_features: int, hidden: tuple[int, ...] = (256, 256)) -> None:
        super().__init__()
        if not is_positive_int(in_features):
            raise KdmlError(f"MLP: in_features must be a positive integer, got {in_features!r}")
        hidden = _check_widths("MLP", "hidden", hidden)
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.BatchNorm1d(size), nn.ReLU(inplace=True)]
            width = size
        self.layers = nn.Sequential(*layers)
        self.feature_size = width

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs)


class Conv1dNet(nn.Module):
    """A 1-D CNN for signals such as MNIST-1D (length 40).

    Shape:
        - Input: [B, L] or [B, 1, L].
        - Output: [B, widths[-1]].
    """

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        widths = _check_widths("Conv1dNet", "widths", widths)
        layers: list[nn.Module] = []
        channels = 1
        for index, width in enumerate(widths):
            layers += [nn.Conv1d(channels, width, 3, padding=1, bias=False),
                       nn.BatchNorm1d(width), nn.ReLU(inplace=True)]
            if index < len(widths) - 1:
                layers.append(nn.MaxPool1d(2))
            channels = width
        layers += [nn.AdaptiveAvgPool1d(1), nn.Flatten()]
        self.layers = nn.Sequential(*layers)
        self.feature_size = widths[-1]

    def forward(self, signals: torch.Tensor) -> torch.Tensor:
        if signals.dim() == 2:
            signals = signals.unsqueeze(1)
        return self.layers(signals)


class FlattenInputs(nn.Flatten):
    """No learned layers: the flattened input is the feature (for models such as DTML's
    network, which are the whole model and only need the input size)."""

    # the name users give it (model.backbone): messages had named this class instead
    backbone_name = "identity"

    def __init__(self, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.feature_size = math.prod(input_shape)


def feature_size_of(backbone: nn.Module) -> int:
    """The width of ``backbone``'s pooled features: its ``feature_size`` attribute, which every
    kdml backbone has and a user's own backbone must set to be sized for a recipe's head."""
    size = getattr(backbone, "feature_size", None)
    if not is_positive_int(size):
        raise KdmlError(f"backbone {type(backbone).__name__} has no positive integer "
                        f"feature_size (got {size!r}); set it to the width of its output "
                        f"features")
    return int(size)


def pooled_features(backbone: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """``backbone(inputs)``, refused in one line unless it is [B, feature_size].

    A user's backbone whose ``feature_size`` is not the width it returns (or which returns
    unpooled [B, C, H, W] maps) would otherwise fail inside the head's matmul with torch's
    "mat1 and mat2 shapes cannot be multiplied", and one that returns a tuple, a list or a
    dict of outputs with "'tuple' object has no attribute 'ndim'". The check reads types and
    shapes only: no host sync.
    """
    features = backbone(inputs)
    size = backbone.feature_size
    if not isinstance(features, torch.Tensor):  # a tuple, a list or a dict of outputs
        raise KdmlError(f"backbone {type(backbone).__name__} returned a "
                        f"{type(features).__name__}, not a tensor; it must return pooled "
                        f"[batch, feature_size] features (wrap it in a module that returns "
                        f"them)")
    if features.ndim != 2 or features.shape[1] != size:
        raise KdmlError(f"backbone {type(backbone).__name__} returned features of shape "
                        f"{list(features.shape)}, but its feature_size is {size}; it must "
                        f"return pooled [batch, feature_size] features")
    return features


BACKBONES = ("auto", "cnn", "mlp", "conv1d", "identity", "bninception", "timm:NAME",
             "torchvision:NAME")


def check_backbone_name(name: str, small_input: bool = False) -> None:
    """Refuse a ``model.backbone`` that names no backbone, or ``model.small_input`` with a
    named backbone that has no stem to swap, before any data is read: :func:`build_backbone`
    calls it again once the data is there: in a grid, each cell's is checked before the first
    trains. (``auto`` is the dataset's backbone, checked when it is built.)"""
    library, colon, model = name.partition(":")
    if small_input and name != "auto" and library not in ("timm", "torchvision"):
        raise KdmlError(f"model.small_input swaps the stem of timm and torchvision ResNets; "
                        f"backbone {name!r} has none to swap: set model.small_input=false "
                        "with it (the SimCLR recipes set it true)")
    if name in ("timm", "torchvision") or (colon and library in ("timm", "torchvision")):
        if not model:
            raise KdmlError(f"name the model, e.g. {library}:resnet50")
        return
    if name not in BACKBONES:
        raise KdmlError(f"unknown backbone {name!r}; choose one of: {', '.join(BACKBONES)}")


def build_backbone(name: str, input_shape: tuple[int, ...], default: str = "mlp",
                   pooling: str = "avg", small_input: bool = False) -> nn.Module:
    """Build a backbone for inputs of ``input_shape`` (one sample's shape, as the backbone
    receives it), untrained.

    ``"auto"`` picks the dataset's ``default``. ``"bninception"`` is defined in kdml;
    ``"timm:NAME"`` and ``"torchvision:NAME"`` need the ``vision`` extra. ``pooling`` (``avg``,
    ``max``, ``avg+max``) and ``small_input`` apply to the pretrained-style backbones. Every
    backbone has ``feature_size``; those with their own input convention also have
    ``normalization`` (and ``input_channels`` when it is fixed).
    """
    if name == "auto":
        name = default
    check_backbone_name(name, small_input)
    if name == "cnn":
        if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
            raise KdmlError(f"backbone 'cnn' needs square images [C, H, W], got {input_shape}")
        return SmallCNN(input_shape[0], input_shape[1])
    if name == "mlp":
        return MLP(math.prod(input_shape))
    if name == "identity":
        return FlattenInputs(input_shape)
    if name == "conv1d":
        if len(input_shape) != 1:
            raise KdmlError(f"backbone 'conv1d' needs 1-D signals, got shape {input_shape}")
        return Conv1dNet()
    if name in ("bninception", "timm", "torchvision") or name.startswith(
            ("timm:", "torchvision:")):
        if len(input_shape) != 3:
            raise KdmlError(f"backbone {name!r} needs images [C, H, W], got shape {input_shape}")
        if name == "bninception":
            from kdml.models.bninception import BNInception, check_image_size

            if input_shape[0] != 3:
                raise KdmlError(f"backbone 'bninception' takes RGB images (3 channels), got "
                                f"{input_shape[0]} channels")
            check_image_size(input_shape[1], input_shape[2])
            return BNInception(pooling)
        from kdml.models import vision
        from kdml.models.bninception import POOLINGS

        library, _, model = name.partition(":")
        if pooling not in POOLINGS:  # global_pool would read any other word as avg+max
            raise KdmlError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if library == "timm":
            return vision.timm_backbone(model, input_shape[0], pooling, small_input,
                                        (input_shape[1], input_shape[2]))
        return vision.torchvision_backbone(model, input_shape[0], pooling, small_input)
    raise KdmlError(f"unknown backbone {name!r}; choose one of: {', '.join(BACKBONES)}")


def freeze_batchnorm(module: nn.Module) -> None:
    """Keep BatchNorm running statistics fixed (Sec. 5.1 of Chu et al. 2020: pretrained backbones).

    Call after every ``module.train()``; the affine parameters still train.
    """
    for layer in module.modules():
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            layer.eval()
