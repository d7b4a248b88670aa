"""timm and torchvision backbones (the vision extra). Skipped where they do not import."""

from __future__ import annotations

import pytest
import torch

from kdml.models.backbones import build_backbone
from kdml.models.vision import vision_available
from kdml.models.weights import load_weights

AVAILABLE, WHY_NOT = vision_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)


@pytest.mark.parametrize("name", ["timm:resnet18", "torchvision:resnet18"])
def test_grayscale_inputs_and_small_input_stem(name):
    backbone = build_backbone(name, (1, 28, 28), small_input=True).eval()
    with torch.no_grad():
        features = backbone(torch.randn(2, 1, 28, 28))
    assert features.shape == (2, backbone.feature_size) == (2, 512)
    conv1 = backbone.network.conv1
    assert conv1.kernel_size == (3, 3) and conv1.stride == (1, 1) and conv1.in_channels == 1
    assert isinstance(backbone.network.maxpool, torch.nn.Identity)


@pytest.mark.parametrize("name", ["timm:resnet18", "torchvision:resnet18"])
def test_grayscale_backbones_normalise_one_channel(name):
    """ImageNet's 3-channel statistics would broadcast a grayscale batch to 3 channels in
    front of a 1-channel stem."""
    backbone = build_backbone(name, (1, 28, 28), small_input=True).eval()
    assert len(backbone.normalization.mean) == 1
    inputs = backbone.normalization(torch.rand(2, 1, 28, 28))
    assert inputs.shape == (2, 1, 28, 28)
    with torch.no_grad():
        assert backbone(inputs).shape == (2, 512)


@pytest.mark.parametrize("pooling", ["avg", "max", "avg+max"])
def test_pooling_of_the_feature_map(pooling):
    backbone = build_backbone("timm:resnet18", (3, 64, 64), pooling=pooling).eval()
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feature_map = backbone.network.forward_features(images)
        expected = {"avg": feature_map.mean((2, 3)), "max": feature_map.amax((2, 3)),
                    "avg+max": feature_map.mean((2, 3)) + feature_map.amax((2, 3))}[pooling]
        assert torch.allclose(backbone(images), expected, atol=1e-6)


def test_normalisation_follows_the_model_config():
    backbone = build_backbone("timm:resnet18", (3, 224, 224))
    assert backbone.normalization.mean == tuple(backbone.network.pretrained_cfg["mean"])


@pytest.mark.parametrize("name", ["timm:resnet18", "torchvision:resnet18"])
def test_library_checkpoints_load_with_their_classifier_ignored(name, tmp_path):
    source = build_backbone(name, (3, 64, 64))
    state = dict(source.network.state_dict())
    state["fc.weight"], state["fc.bias"] = torch.zeros(1000, 512), torch.zeros(1000)
    torch.save(state, tmp_path / "weights.pth")
    target, lines = build_backbone(name, (3, 64, 64)), []
    load_weights(target, tmp_path / "weights.pth", report=lines.append)
    assert torch.equal(target.network.conv1.weight, source.network.conv1.weight)
    assert "ignored the classifier (fc." in lines[0]


@pytest.mark.parametrize("name", ["convnext_atto", "mobilenetv3_small_050"])
def test_timm_features_are_the_models_own_pre_logits(name):
    """ConvNeXt's head LayerNorm and MobileNetV3's conv_head come after the pooling: kdml had
    dropped them (a checkpoint's tensors for them loaded, unused)."""
    torch.manual_seed(0)
    backbone = build_backbone(f"timm:{name}", (3, 64, 64)).eval()
    images = torch.randn(2, 3, 64, 64)
    network = backbone.network
    with torch.no_grad():
        expected = network.forward_head(network.forward_features(images), pre_logits=True)
        assert torch.allclose(backbone(images), expected, atol=1e-5)
    assert expected.shape == (2, backbone.feature_size)


def test_channels_last_timm_models_pool_their_maps():
    """Swin's maps are [B, H, W, C]: they had been pooled over W and C, then refused."""
    backbone = build_backbone("timm:swin_tiny_patch4_window7_224", (3, 224, 224)).eval()
    with torch.no_grad():
        assert backbone(torch.randn(1, 3, 224, 224)).shape == (1, backbone.feature_size)


def test_fixed_size_timm_models_refuse_other_image_sizes():
    from kdml.errors import KdmlError

    with pytest.raises(KdmlError, match="takes 224x224 images only, got 28x28"):
        build_backbone("timm:vit_tiny_patch16_224", (1, 28, 28))


@pytest.mark.parametrize("name", ["timm:resnet18", "torchvision:resnet18"])
def test_imagenet_weights_load_around_a_small_input_stem(name, tmp_path):
    source = build_backbone(name, (3, 64, 64))
    torch.save(source.network.state_dict(), tmp_path / "imagenet.pth")
    target, lines = build_backbone(name, (3, 32, 32), small_input=True), []
    load_weights(target, tmp_path / "imagenet.pth", report=lines.append)
    assert torch.equal(target.network.layer4[0].conv1.weight,
                       source.network.layer4[0].conv1.weight)
    assert "kept the model.small_input stem as built (conv1.weight)" in lines[0]


@pytest.mark.parametrize(("name", "size"), [("resnet50", 64), ("vit_tiny_patch16_224", 224)])
@pytest.mark.parametrize("channels", [3, 1])
def test_timm_normalisation_is_its_pretrained_config(name, size, channels):
    """ViT's pretrained_cfg says 0.5 for mean and std, not ImageNet's; a grayscale input takes
    the means of the three channels' statistics."""
    import timm

    config = timm.create_model(name, pretrained=False).pretrained_cfg
    normalization = build_backbone(f"timm:{name}", (channels, size, size)).normalization
    mean, std = tuple(config["mean"]), tuple(config["std"])
    if channels == 1:
        mean, std = (sum(mean) / 3,), (sum(std) / 3,)
    assert normalization.mean == pytest.approx(mean) and normalization.std == pytest.approx(std)
    assert normalization.scale == 1.0 and not normalization.bgr


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
@pytest.mark.parametrize("channels", [3, 1])
def test_torchvision_normalisation_is_its_weights_transforms(name, channels):
    """Every published weight of the model says its mean and std in its transforms (read
    without downloading anything)."""
    import torchvision

    normalization = build_backbone(f"torchvision:{name}", (channels, 32, 32)).normalization
    for weights in torchvision.models.get_model_weights(name):
        transform = weights.transforms()
        mean, std = tuple(transform.mean), tuple(transform.std)
        if channels == 1:
            mean, std = (sum(mean) / 3,), (sum(std) / 3,)
        assert normalization.mean == pytest.approx(mean), weights
        assert normalization.std == pytest.approx(std), weights


def _library_model(name):
    """The timm or torchvision model with its classifier, its BatchNorm statistics moved off
    their initial values (a buffer left unloaded then shows), and its pre-logits features."""
    import timm
    import torchvision

    library, model = name.split(":")
    if library == "timm":
        network = timm.create_model(model, pretrained=False)
    else:
        network = torchvision.models.get_model(model, weights=None)
    for layer in network.modules():
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
            layer.running_mean.uniform_(-0.5, 0.5)
            layer.running_var.uniform_(0.5, 2.0)

    def pre_logits(images):
        if library == "timm":
            return network.forward_head(network.forward_features(images), pre_logits=True)
        return torch.flatten(network.avgpool(torch.nn.Sequential(*list(
            network.children())[:-2])(images)), 1)

    return network.eval(), pre_logits


@pytest.mark.parametrize(("name", "size"), [("timm:resnet18", 64), ("torchvision:resnet18", 64),
                                            ("timm:vit_tiny_patch16_224", 224)])
@pytest.mark.parametrize("channels", [3, 1])
def test_a_library_state_dict_gives_the_library_models_features(name, size, channels, tmp_path):
    """The whole file (BatchNorm statistics too) goes where the library puts it: the features
    are the library model's pre-logits (ResNets' last map is 2x2 here, so its pooling shows);
    on grayscale inputs, those of the image repeated over RGB (the file's first layer summed
    over its input channels)."""
    torch.manual_seed(0)
    network, pre_logits = _library_model(name)
    torch.save(network.state_dict(), tmp_path / "library.pth")
    backbone = build_backbone(name, (channels, size, size))
    load_weights(backbone, tmp_path / "library.pth", report=lambda line: None)
    images = torch.randn(2, channels, size, size)
    with torch.no_grad():
        features = backbone.eval()(images)
        expected = pre_logits(images.expand(-1, 3, -1, -1))
    assert features.shape == expected.shape == (2, backbone.feature_size)
    assert torch.allclose(features, expected, atol=1e-4)


@pytest.mark.parametrize("name", ["timm:resnet18", "torchvision:resnet18"])
def test_a_library_state_dict_around_a_small_input_stem_gives_its_features(name, tmp_path):
    """Under model.small_input, every tensor but the 7x7 stem loads: the features are those of
    the library model with kdml's 3x3 stem and no max-pool, also on 16x16 images."""
    torch.manual_seed(0)
    network, pre_logits = _library_model(name)
    torch.save(network.state_dict(), tmp_path / "library.pth")
    backbone, lines = build_backbone(name, (1, 16, 16), small_input=True), []
    load_weights(backbone, tmp_path / "library.pth", report=lines.append)
    stem = backbone.network.conv1
    network.conv1 = torch.nn.Conv2d(3, stem.out_channels, 3, 1, 1, bias=False)
    network.conv1.weight.data = stem.weight.detach().expand(-1, 3, -1, -1) / 3
    network.maxpool = torch.nn.Identity()
    images = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        features = backbone.eval()(images)
        expected = pre_logits(images.expand(-1, 3, -1, -1))
    assert features.shape == expected.shape == (2, backbone.feature_size)
    assert torch.allclose(features, expected, atol=1e-4)
    assert "kept the model.small_input stem as built (conv1.weight)" in lines[0]


def test_small_input_refuses_a_model_without_a_resnet_stem():
    from kdml.errors import KdmlError

    with pytest.raises(KdmlError, match="needs a ResNet-style model .* timm:convnext_atto has"):
        build_backbone("timm:convnext_atto", (3, 32, 32), small_input=True)


def test_images_too_small_for_the_models_layers_are_refused_when_built():
    """ConvNeXt's stride-2 downsampling convolutions need 32x32 images: MNIST's 28x28 had
    stopped the first training step with torch's traceback."""
    from kdml.errors import KdmlError

    with pytest.raises(KdmlError, match=r"timm:convnext_atto cannot take 28x28 images: its "
                                        r"layers shrink them to nothing \(Calculated padded"):
        build_backbone("timm:convnext_atto", (1, 28, 28))
    backbone = build_backbone("timm:convnext_atto", (1, 32, 32))  # the smallest it takes
    # the blank image went through in eval mode, then the network was set back to training
    assert all(module.training for module in backbone.modules())
    with torch.no_grad():
        assert backbone(torch.randn(2, 1, 32, 32)).shape == (2, 320)
