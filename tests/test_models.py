import hashlib
import re

import numpy as np
import pytest
import torch

from kdml.errors import KdmlError
from kdml.models import EmbeddingHead, build_backbone, freeze_batchnorm
from kdml.models.backbones import MLP, Conv1dNet, SmallCNN, feature_size_of
from kdml.models.vision import _small_stem


@pytest.mark.parametrize(("shape", "name"), [
    ((1, 8, 8), "cnn"), ((1, 28, 28), "cnn"), ((3, 32, 32), "cnn"), ((3, 64, 64), "cnn"),
    ((3, 224, 224), "cnn"), ((3, 100, 100), "cnn"),
    ((40,), "conv1d"), ((40,), "mlp"), ((1, 8, 8), "mlp"),
])
def test_backbones_expose_feature_size(shape, name):
    backbone = build_backbone(name, shape)
    out = backbone(torch.randn(3, *shape))
    assert out.shape == (3, backbone.feature_size)


def test_small_input_stem_is_initialised_as_a_resnet_convolution():
    """The 3x3 stem that replaces a ResNet's 7x7 one (Atlas App. A.1) gets the Kaiming-normal
    (fan_out, relu) weights of the ResNet's other convolutions, as the Atlas authors'
    ``resnet_init`` gives it, not torch's default uniform init (std 0.19 here, not 0.059).
    A stand-in module: the vision extra does not import everywhere."""
    network = torch.nn.Module()
    network.conv1 = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False)
    network.maxpool = torch.nn.MaxPool2d(3, 2, 1)
    torch.manual_seed(0)
    _small_stem(network, 1, "stand-in")
    weights = network.conv1.weight.detach().double()
    assert network.conv1.kernel_size == (3, 3) and network.conv1.in_channels == 1
    assert isinstance(network.maxpool, torch.nn.Identity)
    expected_std = (2 / (64 * 3 * 3)) ** 0.5  # gain sqrt(2) over sqrt(fan_out)
    assert weights.std().item() == pytest.approx(expected_std, rel=0.1)
    assert weights.mean().abs().item() < 0.1 * expected_std


def test_small_cnn_stem_brings_photos_to_at_most_64_pixels():
    layers = build_backbone("cnn", (3, 224, 224)).layers
    strided = [layer for layer in layers if isinstance(layer, torch.nn.Conv2d)
               and layer.stride == (2, 2)]
    assert len(strided) == 1  # 224 -> 56 after one stride-2 conv and one max-pool
    assert not any(isinstance(layer, torch.nn.Conv2d) and layer.stride == (2, 2)
                   for layer in build_backbone("cnn", (3, 64, 64)).layers)


def test_auto_uses_dataset_default():
    assert build_backbone("auto", (40,), default="conv1d").__class__.__name__ == "Conv1dNet"


@pytest.mark.parametrize(("name", "shape", "message"), [
    ("cnn", (2, 8, 8), "1- or 3-channel images, got 2 channels"),
    ("cnn", (1, 4, 4), "side 8 or more, got side 4"),
    ("cnn", (1, 8, 6), "needs square images"),
    ("conv1d", (1, 8, 8), "needs 1-D signals"),
    ("resnet", (1, 8, 8), "unknown backbone 'resnet'; choose one of"),
])
def test_bad_backbones(name, shape, message):
    with pytest.raises(KdmlError, match=re.escape(message)):
        build_backbone(name, shape)


@pytest.mark.parametrize("channels", [3.0, 1.0, True])
def test_small_cnn_refuses_channels_that_are_no_integer(channels):
    """3.0 and True compare equal to 3 and 1, so the (1, 3) check let them through: 3.0 then
    failed inside nn.Conv2d with torch's "argument 'size' failed to unpack", and True built
    a 1-channel network. The image side was already refused as a float."""
    with pytest.raises(KdmlError, match=re.escape(f"got {channels!r} channels")):
        SmallCNN(in_channels=channels)
    assert SmallCNN(in_channels=np.int64(3), image_size=8, widths=(4,))(
        torch.rand(2, 3, 8, 8)).shape == (2, 4)


def test_timm_without_extra_says_which_extra():
    try:
        import timm  # noqa: F401
    except Exception:
        with pytest.raises(KdmlError, match=r"-e '\.\[vision\]' in the kdml clone"):
            build_backbone("timm:resnet18", (3, 32, 32))
    else:
        pytest.skip("timm is installed here, so the missing-extra message cannot be triggered")


def test_embedding_head_is_unit_norm():
    head = EmbeddingHead(16, 4)
    out = head(torch.randn(5, 16))
    assert torch.allclose(out.norm(dim=1), torch.ones(5))


def test_freeze_batchnorm_keeps_running_stats():
    backbone = build_backbone("mlp", (6,))
    backbone.train()
    freeze_batchnorm(backbone)
    before = [b.clone() for b in backbone.buffers()]
    backbone(torch.randn(8, 6) * 5 + 3)
    assert all(torch.equal(a, b) for a, b in zip(before, backbone.buffers(), strict=True))


@pytest.mark.parametrize("size", [None, 0, 2.5, True])
def test_a_backbone_without_a_positive_integer_feature_size_is_refused(size):
    """A user's own backbone sizes a recipe's head by ``feature_size``: without one, a line
    that says what to set (nn.Module's AttributeError said only that it was missing)."""
    from kdml.training.recipes.atlas import TripletMethod, TripletParams

    backbone = torch.nn.Linear(4, 3)
    if size is not None:
        backbone.feature_size = size
    message = (rf"^backbone Linear has no positive integer feature_size \(got {size!r}\); set "
               rf"it to the width of its output features$")
    with pytest.raises(KdmlError, match=message):
        feature_size_of(backbone)
    with pytest.raises(KdmlError, match=message):
        TripletMethod(backbone, TripletParams())
    backbone.feature_size = 3
    assert feature_size_of(backbone) == 3
    assert TripletMethod(backbone, TripletParams()).embed(torch.ones(2, 4)).shape[0] == 2


@pytest.mark.parametrize("recipe", ["jrd", "triplet", "mtriplet", "simclr"])
@pytest.mark.parametrize("backbone", [
    torch.nn.Linear(4, 5),  # declares 3, returns 5
    torch.nn.Sequential(torch.nn.Unflatten(1, (3, 1, 1)), torch.nn.Flatten(2))  # [B, 3, 1]
], ids=["wrong-width", "unpooled"])
def test_a_backbone_whose_output_is_not_its_feature_size_is_refused(recipe, backbone):
    """A declared width that the backbone does not return is refused in one line that gives
    both shapes, not with torch's "mat1 and mat2 shapes cannot be multiplied"."""
    from kdml.training.recipes.atlas import (
        MTripletMethod,
        MTripletParams,
        SimCLRMethod,
        SimCLRParams,
        TripletMethod,
        TripletParams,
    )
    from kdml.training.recipes.jrd import AMSoftmaxParams, JRDMethod

    backbone.feature_size = 3
    method = {"jrd": lambda: JRDMethod(backbone, 8, 2, AMSoftmaxParams()),
              "triplet": lambda: TripletMethod(backbone, TripletParams()),
              "mtriplet": lambda: MTripletMethod(backbone, MTripletParams(n_charts=2)),
              "simclr": lambda: SimCLRMethod(backbone, SimCLRParams())}[recipe]()
    inputs = torch.ones(2, 4) if isinstance(backbone, torch.nn.Linear) else torch.ones(2, 3)
    shape = "[2, 5]" if isinstance(backbone, torch.nn.Linear) else "[2, 3, 1]"
    message = (rf"^backbone {type(backbone).__name__} returned features of shape "
               rf"{re.escape(shape)}, but its feature_size is 3; it must return pooled "
               rf"\[batch, feature_size\] features$")
    with pytest.raises(KdmlError, match=message):
        method.embed(inputs)


class _TwoOutputs(torch.nn.Module):
    """A user's backbone that returns its pooled features with something else, as
    torchvision's Inception does in training mode (and timm's features_only models a list)."""

    feature_size = 3

    def __init__(self, wrap: type) -> None:
        super().__init__()
        self.linear, self.wrap = torch.nn.Linear(4, 3), wrap

    def forward(self, inputs):
        features = self.linear(inputs)
        return {"pooled": features} if self.wrap is dict else self.wrap([features, features])


@pytest.mark.parametrize("wrap", [tuple, list, dict])
def test_a_backbone_that_returns_no_tensor_is_refused_in_one_line(wrap):
    """README: a backbone "whose output is not [batch, feature_size], is refused in one line";
    a tuple, a list or a dict of outputs failed with "AttributeError: 'tuple' object has no
    attribute 'ndim'" in training and in embedding."""
    from kdml.training.recipes.jrd import AMSoftmaxParams, JRDMethod

    method = JRDMethod(_TwoOutputs(wrap), 8, 2, AMSoftmaxParams())
    message = (rf"^backbone _TwoOutputs returned a {wrap.__name__}, not a tensor; it must "
               r"return pooled \[batch, feature_size\] features \(wrap it in a module that "
               r"returns them\)$")
    with pytest.raises(KdmlError, match=message):
        method.embed(torch.ones(2, 4))
    with pytest.raises(KdmlError, match=message):
        method(torch.ones(2, 4), torch.tensor([0, 1]))


class _StandInTimm(torch.nn.Module):
    """The parts of a timm model that TimmBackbone uses: a ConvNeXt-like head whose norm comes
    after the pooling, and a channels-last (Swin-like) variant. The vision extra does not
    import everywhere."""

    def __init__(self, channels_last: bool = False) -> None:
        super().__init__()
        self.num_features = self.head_hidden_size = 4
        self.output_fmt = "NHWC" if channels_last else "NCHW"
        self.stem = torch.nn.Conv2d(3, 4, 3)
        self.norm = torch.nn.LayerNorm(4)
        with torch.no_grad():
            self.norm.weight.uniform_(1, 3)
            self.norm.bias.uniform_(-1, 1)

    def forward_features(self, images):
        maps = self.stem(images)
        return maps.permute(0, 2, 3, 1) if self.output_fmt == "NHWC" else maps

    def forward_head(self, features, pre_logits=False):
        assert pre_logits
        pooled = features.mean((1, 2) if self.output_fmt == "NHWC" else (2, 3))  # timm's pool
        return self.norm(pooled)


@pytest.mark.parametrize("channels_last", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("pooling", ["avg", "max", "avg+max"])
def test_timm_backbone_applies_the_heads_layers_after_its_own_pooling(channels_last, pooling):
    """ConvNeXt's head LayerNorm (MobileNetV3's conv_head) follows the pooling: kdml had
    returned the pooled map without it, and pooled a Swin's [B, H, W, C] map over W and C."""
    from kdml.models.bninception import global_pool
    from kdml.models.vision import TimmBackbone

    torch.manual_seed(0)
    network = _StandInTimm(channels_last)
    backbone = TimmBackbone(network, pooling, None)
    images = torch.randn(2, 3, 9, 9)
    expected = network.norm(global_pool(network.stem(images), pooling))
    assert backbone.feature_size == 4
    assert torch.allclose(backbone(images), expected, atol=1e-6)


def test_a_broken_vision_install_is_one_line(monkeypatch):
    """A torchvision built for another torch raises RuntimeError at import, not ImportError."""
    import importlib

    def broken(name):
        raise RuntimeError("operator torchvision::nms does not exist\nmore lines")

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(KdmlError, match=r"^torchvision:resnet18 needs torchvision, whose install "
                       r"here is broken \(RuntimeError: operator torchvision::nms does not "
                       r"exist\), most often built for another torch; reinstall the vision "
                       "extra"):
        build_backbone("torchvision:resnet18", (3, 32, 32))


def test_vision_backbones_refuse_an_unknown_pooling():
    with pytest.raises(KdmlError, match=r"pooling must be one of avg, max, avg\+max, got 'mean'"):
        build_backbone("timm:resnet18", (3, 32, 32), pooling="mean")


def test_weights_keep_a_small_input_stem_that_the_files_stem_does_not_fit(tmp_path):
    """model.small_input's 3x3 stem with an ImageNet file (7x7) had been refused as a file
    'for another model'; the stem keeps its initialisation, the rest loads."""
    from kdml.models.weights import load_weights

    def network(stem_kernel):
        module = torch.nn.Module()
        module.conv1 = torch.nn.Conv2d(3, 4, stem_kernel, bias=False)
        module.layer1 = torch.nn.Linear(4, 4)
        return module

    imagenet = network(7)
    torch.save(imagenet.state_dict(), tmp_path / "imagenet.pth")
    small = network(3)
    stem = small.conv1.weight.clone()
    with pytest.raises(KdmlError, match="conv1.weight has shape"):  # not a small_input stem
        load_weights(small, tmp_path / "imagenet.pth")
    small.rebuilt_keys = ("conv1.weight",)
    lines = []
    load_weights(small, tmp_path / "imagenet.pth", report=lines.append)
    assert torch.equal(small.conv1.weight, stem)
    assert torch.equal(small.layer1.weight, imagenet.layer1.weight)
    digest = hashlib.sha256((tmp_path / "imagenet.pth").read_bytes()).hexdigest()
    assert lines == [f"loaded 2 tensors from {tmp_path / 'imagenet.pth'} (SHA-256 {digest}); "
                     "kept the model.small_input stem as built (conv1.weight)"]


@pytest.mark.parametrize("name", ["cnn", "mlp", "bninception"])
def test_small_input_is_refused_on_a_backbone_without_a_stem(name):
    """model.small_input swaps a timm or torchvision ResNet's stem: on kdml's own backbones it
    is refused in one line (ignoring it silently had passed every test)."""
    with pytest.raises(KdmlError, match=rf"backbone '{name}' has none to swap: set "
                                        r"model.small_input=false "):
        build_backbone(name, (3, 32, 32), small_input=True)


def test_bninception_takes_grayscale_input_as_three_channels():
    """A 1-channel dataset with bninception is fed as three equal channels (build.py); refusing
    it as "takes RGB images" had passed every test."""
    from types import SimpleNamespace

    from kdml.config import resolve_config
    from kdml.training.build import model_input_shape
    from kdml.training.recipes import get_recipe

    spec = get_recipe("amsoftmax")
    config = resolve_config(spec.name, spec.params, spec.defaults,
                            overrides=["model.backbone=bninception"])
    shape = model_input_shape(config, SimpleNamespace(sample_shape=(1, 32, 32),
                                                      is_file_backed=False))
    assert shape == (3, 32, 32)


@pytest.mark.parametrize(("side", "poolings"), [(8, 1), (28, 2), (64, 3)])
def test_small_cnn_pools_as_its_docstring_says(side, poolings):
    """SmallCNN halves while the map stays >= 4x4: 8x8 -> 1 pooling, 28x28 -> 2, 64x64 -> 3
    (halving one time fewer, which changes the default MNIST network, had passed every test)."""
    from kdml.models.backbones import SmallCNN
    net = SmallCNN(1, side)
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in net.modules()) == poolings


def test_conv1d_net_pools_between_its_blocks_only():
    """Conv1dNet (MNIST-1D, length 40) pools between its blocks, not after the last: 2 poolings,
    a length of 10 before the global pooling (pooling after every block had passed every
    test)."""
    from kdml.models.backbones import Conv1dNet
    net = Conv1dNet()
    assert sum(isinstance(m, torch.nn.MaxPool1d) for m in net.modules()) == 2
    assert net.layers[:-2](torch.zeros(2, 1, 40)).shape[-1] == 10


@pytest.mark.parametrize(("backbone", "args", "message"), [
    (MLP, (0,), r"MLP: in_features must be a positive integer, got 0"),
    (MLP, (5, (0,)), r"MLP: hidden must .* positive integers, got \(0,\)"),  # empty layers
    (MLP, (5, (-3,)), r"MLP: hidden must"),  # torch's "negative dimension"
    (Conv1dNet, ((),), r"Conv1dNet: widths must be a non-empty"),  # an IndexError
    (SmallCNN, (1, 28, (8, 2.0)), r"SmallCNN: widths must"),  # "type must be tuple of ints"
    (SmallCNN, (1, 8.5), r"SmallCNN takes images of side 8 or more, got side 8\.5"),
])
def test_backbone_sizes_are_checked_in_one_line(backbone, args, message):
    """A library user's backbone sizes: a width of 0 built a network of empty layers (only
    torch's "zero-element tensors" warning); a negative, float or missing one failed inside
    torch."""
    with pytest.raises(KdmlError, match=message):
        backbone(*args)
