"""Backbones from timm (``timm:NAME``) and torchvision (``torchvision:NAME``), built untrained:
weights come only from local files (:mod:`kdml.models.weights`).

Both libraries are the optional ``vision`` extra and are imported only here, when such a
backbone is asked for. The networks are cut before their classifier; convolutional feature
maps are pooled by ``model.pooling`` (``avg``, ``max``, ``avg+max``), then go through the layers
a timm head keeps before its classifier (ConvNeXt's norm). The input channels follow
the data (1 for MNIST), and ``model.small_input`` swaps a ResNet's stem for a 3x3 stride-1
convolution without max-pool, as SimCLR's CIFAR ResNets (the Atlas Table 2 runs use it).
Normalisation follows the model's own config (timm's ``pretrained_cfg``), else ImageNet's.
A timm model refuses, when built, images of another size than its fixed one (ViT) and images
its layers shrink to nothing (ConvNeXt below 32x32).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import Tensor, nn

from kdml.data.transforms import Normalization
from kdml.errors import KdmlError
from kdml.models.bninception import global_pool

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGENET = Normalization(IMAGENET_MEAN, IMAGENET_STD)
VISION_EXTRA = ("pip install -c constraints.txt -e '.[vision]' in the kdml clone (or "
                "model.backbone=cnn model.small_input=false: a small CPU network, much weaker)")


# The timm and torchvision models are typed ``Any`` here: their layers (conv1, fc,
# forward_features, ...) are attributes that nn.Module's typing cannot see.


# The weights a small_input stem replaces: a file's 7x7 ImageNet stem does not fit it, and
# is left out of a load (kdml.models.weights) instead of refused.
SMALL_STEM_KEYS = ("conv1.weight",)


def _small_stem(network: Any, in_channels: int, name: str) -> None:
    """Replace a ResNet's 7x7 stride-2 convolution and max-pool with a 3x3 stride-1
    convolution (SimCLR's CIFAR variant; Atlas App. A.1), Kaiming-normal initialised."""
    if not isinstance(getattr(network, "conv1", None), nn.Conv2d) or not hasattr(network,
                                                                                 "maxpool"):
        raise KdmlError(f"model.small_input needs a ResNet-style model with a conv1 and a "
                        f"maxpool; {name} has none")
    stem = nn.Conv2d(in_channels, network.conv1.out_channels, 3, 1, 1, bias=False)
    # initialised as torchvision and timm initialise a ResNet's other convolutions, and as the
    # Atlas authors re-initialise this one (neurve/contrastive/utils.py, resnet_init)
    nn.init.kaiming_normal_(stem.weight, mode="fan_out", nonlinearity="relu")
    network.conv1 = stem
    network.maxpool = nn.Identity()


class TimmBackbone(nn.Module):
    """A timm model without its classifier: ``forward_features``, global pooling, then the
    layers timm's head keeps before its classifier (``forward_head(pre_logits=True)``: e.g.
    ConvNeXt's LayerNorm, MobileNetV3's ``conv_head``), so a checkpoint's head layers are used.

    ``network`` holds the timm model, so a timm checkpoint loads into it as it is.
    ``rebuilt_keys``: the weights ``model.small_input`` re-made, whose file's shapes differ.
    """

    network: Any

    def __init__(self, network: Any, pooling: str, normalization: Normalization,
                 rebuilt_keys: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.network, self.pooling, self.normalization = network, pooling, normalization
        self.rebuilt_keys = rebuilt_keys
        # [B, H, W, C] maps (Swin, MambaOut); timm's head pools them on the axes this names
        self.channels_last = getattr(network, "output_fmt", "NCHW") == "NHWC"
        # the head's output width where its pre-logits layers change it (MobileNetV3: 1280)
        self.feature_size = getattr(network, "head_hidden_size", None) or network.num_features

    def forward(self, images: Tensor) -> Tensor:
        features = self.network.forward_features(images)
        if features.ndim == 4:  # a convolutional map: pooled as model.pooling says
            if self.channels_last:
                pooled = global_pool(features.permute(0, 3, 1, 2), self.pooling)
                features = pooled[:, None, None, :]
            else:
                features = global_pool(features, self.pooling)[:, :, None, None]
            # timm's own global pooling, next, leaves the 1x1 map as it is
        return self.network.forward_head(features, pre_logits=True)  # tokens: timm's pooling

    def weights_target(self) -> nn.Module:
        return self.network


def timm_backbone(name: str, in_channels: int, pooling: str, small_input: bool,
                  image_size: tuple[int, int]) -> nn.Module:
    timm = _import_vision("timm", name)
    try:
        network = timm.create_model(name, pretrained=False, num_classes=0,
                                    in_chans=in_channels)
    except (RuntimeError, ValueError, OSError) as error:  # an unknown name, a bad local-dir:
        raise KdmlError(f"timm cannot build {name!r}: {_first_line(error)}") from None
    if small_input:
        _small_stem(network, in_channels, f"timm:{name}")
    config = getattr(network, "pretrained_cfg", None) or {}
    fixed_size = tuple(config.get("input_size", ()))[1:]
    if config.get("fixed_input_size") and len(fixed_size) == 2 and image_size != fixed_size:
        # a ViT's position embeddings are sized for it: other sizes fail in the first step
        raise KdmlError(f"timm:{name} takes {fixed_size[0]}x{fixed_size[1]} images only, got "
                        f"{image_size[0]}x{image_size[1]}; set data.image_size="
                        f"{fixed_size[0]} (for image files) or choose a model without a fixed "
                        "input size")
    if len(fixed_size) != 2 or image_size[0] < fixed_size[0] or image_size[1] < fixed_size[1]:
        # below its own input size (pretrained_cfg's), strided layers may shrink a map to
        # nothing; at that size or above, a timm model runs
        _refuse_too_small_images(network, in_channels, image_size, f"timm:{name}")
    normalization = Normalization(tuple(config.get("mean", IMAGENET_MEAN)),
                                  tuple(config.get("std", IMAGENET_STD)))
    return TimmBackbone(network, pooling, normalization.for_channels(in_channels),
                        SMALL_STEM_KEYS if small_input else ())


def _refuse_too_small_images(network: Any, in_channels: int, image_size: tuple[int, int],
                             name: str) -> None:
    """Refuse in one line images too small for the model's layers (ConvNeXt's, DenseNet's and
    VGG's need 32x32, Inception-v3's more), found by one blank image through its features:
    the first training step had stopped with torch's traceback."""
    was_training = network.training
    network.eval()  # BatchNorm's running statistics stay as they are
    try:
        with torch.no_grad():
            network.forward_features(torch.zeros(1, in_channels, *image_size))
    except (RuntimeError, AssertionError) as error:  # torch's shape checks, timm's asserts
        raise KdmlError(f"{name} cannot take {image_size[0]}x{image_size[1]} images: its layers "
                        f"shrink them to nothing ({_first_line(error)}); give larger images "
                        "(data.image_size, for image files) or choose a model that takes "
                        "them, e.g. a ResNet (timm:resnet18, with model.small_input=true for "
                        "small images)") from None
    finally:
        network.train(was_training)


def _import_vision(library: str, name: str) -> Any:
    """``timm`` or ``torchvision``, or one line on why it cannot be used here."""
    try:
        return importlib.import_module(library)
    except ImportError as error:  # an optional extra, absent from this environment
        raise KdmlError(f"{library}:{name} needs {library}, which is not importable here "
                        f"({error}); install the vision extra: {VISION_EXTRA}") from None
    except Exception as error:  # e.g. a torchvision built for another torch: its operators
        raise KdmlError(f"{library}:{name} needs {library}, whose install here is broken "
                        f"({type(error).__name__}: {_first_line(error)}), most often built "
                        f"for another torch; reinstall the vision extra: {VISION_EXTRA}"
                        ) from None


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [""])[0]


class TorchvisionBackbone(nn.Module):
    """A torchvision ResNet (also ResNeXt, Wide ResNet) without ``avgpool`` and ``fc``, pooled
    by ``model.pooling``; ``network`` keeps torchvision's names for its checkpoints."""

    network: Any

    def __init__(self, network: Any, pooling: str,
                 normalization: Normalization = IMAGENET,
                 rebuilt_keys: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.normalization, self.rebuilt_keys = normalization, rebuilt_keys
        self.feature_size = network.fc.in_features
        network.fc = nn.Identity()  # classifier keys of a checkpoint are ignored
        self.network, self.pooling = network, pooling

    def forward(self, images: Tensor) -> Tensor:
        net = self.network
        x = net.maxpool(net.relu(net.bn1(net.conv1(images))))
        x = net.layer4(net.layer3(net.layer2(net.layer1(x))))
        return global_pool(x, self.pooling)

    def weights_target(self) -> nn.Module:
        return self.network


def torchvision_backbone(name: str, in_channels: int, pooling: str,
                         small_input: bool) -> nn.Module:
    torchvision = _import_vision("torchvision", name)
    try:
        network = torchvision.models.get_model(name, weights=None)
    except ValueError as error:
        raise KdmlError(f"torchvision has no model {name!r} ({error})") from None
    if not all(hasattr(network, part) for part in ("conv1", "layer4", "fc")):
        raise KdmlError(f"torchvision:{name} is not a ResNet-style model; kdml takes "
                        "torchvision's ResNet, ResNeXt and Wide ResNet (use timm:NAME for others)")
    if small_input:
        _small_stem(network, in_channels, f"torchvision:{name}")
    elif in_channels != 3:
        old = network.conv1
        network.conv1 = nn.Conv2d(in_channels, old.out_channels, old.kernel_size, old.stride,
                                  old.padding, bias=old.bias is not None)
    return TorchvisionBackbone(network, pooling, IMAGENET.for_channels(in_channels),
                               SMALL_STEM_KEYS if small_input else ())


def vision_available() -> tuple[bool, str]:
    """Whether timm and torchvision import here, and why not (for test skips)."""
    try:
        import timm  # noqa: F401
        import torchvision  # noqa: F401
    except Exception as error:  # a broken install raises more than ImportError
        return False, f"timm/torchvision do not import here ({type(error).__name__}: {error})"
    return True, ""


__all__ = ["TimmBackbone", "TorchvisionBackbone", "timm_backbone", "torchvision_backbone",
           "vision_available"]
