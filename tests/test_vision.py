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
