"""BN-Inception: the published definition's state-dict layout, its features, and local weights."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from kdml.errors import KdmlError
from kdml.models.backbones import build_backbone
from kdml.models.bninception import BNInception
from kdml.models.weights import load_weights

# Every convolution of Cadene's pretrainedmodels bninception.py (the model behind
# bn_inception-52deb4733.pth), as (name, in channels, out channels, kernel, stride); each has a
# bias and a BatchNorm2d "<name>_bn". Transcribed from that file.
PUBLISHED_CONVS = [
    ("conv1_7x7_s2", 3, 64, 7, 2),
    ("conv2_3x3_reduce", 64, 64, 1, 1),
    ("conv2_3x3", 64, 192, 3, 1),
    ("inception_3a_1x1", 192, 64, 1, 1),
    ("inception_3a_3x3_reduce", 192, 64, 1, 1),
    ("inception_3a_3x3", 64, 64, 3, 1),
    ("inception_3a_double_3x3_reduce", 192, 64, 1, 1),
    ("inception_3a_double_3x3_1", 64, 96, 3, 1),
    ("inception_3a_double_3x3_2", 96, 96, 3, 1),
    ("inception_3a_pool_proj", 192, 32, 1, 1),
    ("inception_3b_1x1", 256, 64, 1, 1),
    ("inception_3b_3x3_reduce", 256, 64, 1, 1),
    ("inception_3b_3x3", 64, 96, 3, 1),
    ("inception_3b_double_3x3_reduce", 256, 64, 1, 1),
    ("inception_3b_double_3x3_1", 64, 96, 3, 1),
    ("inception_3b_double_3x3_2", 96, 96, 3, 1),
    ("inception_3b_pool_proj", 256, 64, 1, 1),
    ("inception_3c_3x3_reduce", 320, 128, 1, 1),
    ("inception_3c_3x3", 128, 160, 3, 2),
    ("inception_3c_double_3x3_reduce", 320, 64, 1, 1),
    ("inception_3c_double_3x3_1", 64, 96, 3, 1),
    ("inception_3c_double_3x3_2", 96, 96, 3, 2),
    ("inception_4a_1x1", 576, 224, 1, 1),
    ("inception_4a_3x3_reduce", 576, 64, 1, 1),
    ("inception_4a_3x3", 64, 96, 3, 1),
    ("inception_4a_double_3x3_reduce", 576, 96, 1, 1),
    ("inception_4a_double_3x3_1", 96, 128, 3, 1),
    ("inception_4a_double_3x3_2", 128, 128, 3, 1),
    ("inception_4a_pool_proj", 576, 128, 1, 1),
    ("inception_4b_1x1", 576, 192, 1, 1),
    ("inception_4b_3x3_reduce", 576, 96, 1, 1),
    ("inception_4b_3x3", 96, 128, 3, 1),
    ("inception_4b_double_3x3_reduce", 576, 96, 1, 1),
    ("inception_4b_double_3x3_1", 96, 128, 3, 1),
    ("inception_4b_double_3x3_2", 128, 128, 3, 1),
    ("inception_4b_pool_proj", 576, 128, 1, 1),
    ("inception_4c_1x1", 576, 160, 1, 1),
    ("inception_4c_3x3_reduce", 576, 128, 1, 1),
    ("inception_4c_3x3", 128, 160, 3, 1),
    ("inception_4c_double_3x3_reduce", 576, 128, 1, 1),
    ("inception_4c_double_3x3_1", 128, 160, 3, 1),
    ("inception_4c_double_3x3_2", 160, 160, 3, 1),
    ("inception_4c_pool_proj", 576, 128, 1, 1),
    ("inception_4d_1x1", 608, 96, 1, 1),
    ("inception_4d_3x3_reduce", 608, 128, 1, 1),
    ("inception_4d_3x3", 128, 192, 3, 1),
    ("inception_4d_double_3x3_reduce", 608, 160, 1, 1),
    ("inception_4d_double_3x3_1", 160, 192, 3, 1),
    ("inception_4d_double_3x3_2", 192, 192, 3, 1),
    ("inception_4d_pool_proj", 608, 128, 1, 1),
    ("inception_4e_3x3_reduce", 608, 128, 1, 1),
    ("inception_4e_3x3", 128, 192, 3, 2),
    ("inception_4e_double_3x3_reduce", 608, 192, 1, 1),
    ("inception_4e_double_3x3_1", 192, 256, 3, 1),
    ("inception_4e_double_3x3_2", 256, 256, 3, 2),
    ("inception_5a_1x1", 1056, 352, 1, 1),
    ("inception_5a_3x3_reduce", 1056, 192, 1, 1),
    ("inception_5a_3x3", 192, 320, 3, 1),
    ("inception_5a_double_3x3_reduce", 1056, 160, 1, 1),
    ("inception_5a_double_3x3_1", 160, 224, 3, 1),
    ("inception_5a_double_3x3_2", 224, 224, 3, 1),
    ("inception_5a_pool_proj", 1056, 128, 1, 1),
    ("inception_5b_1x1", 1024, 352, 1, 1),
    ("inception_5b_3x3_reduce", 1024, 192, 1, 1),
    ("inception_5b_3x3", 192, 320, 3, 1),
    ("inception_5b_double_3x3_reduce", 1024, 192, 1, 1),
    ("inception_5b_double_3x3_1", 192, 224, 3, 1),
    ("inception_5b_double_3x3_2", 224, 224, 3, 1),
    ("inception_5b_pool_proj", 1024, 128, 1, 1),
]
REDUCTION_BLOCKS = ("3c", "4e")
BLOCKS = ("3a", "3b", "3c", "4a", "4b", "4c", "4d", "4e", "5a", "5b")


def published_shapes() -> dict[str, tuple[int, ...]]:
    shapes = {}
    for name, in_channels, out_channels, kernel, _ in PUBLISHED_CONVS:
        shapes[f"{name}.weight"] = (out_channels, in_channels, kernel, kernel)
        shapes[f"{name}.bias"] = (out_channels,)
        for buffer in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{name}_bn.{buffer}"] = (out_channels,)
    return shapes


def test_state_dict_names_and_shapes_are_the_published_ones():
    backbone = build_backbone("bninception", (3, 224, 224))
    own = {key: tuple(value.shape) for key, value in backbone.state_dict().items()
           if not key.endswith("num_batches_tracked")}
    assert own == published_shapes()
    assert backbone.feature_size == 1024


def randomised() -> BNInception:
    """A BN-Inception whose BatchNorm statistics and affine parameters are not trivial."""
    generator = torch.Generator().manual_seed(0)
    net = BNInception().eval()
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            for tensor, low, high in ((module.running_mean, -0.5, 0.5),
                                      (module.running_var, 0.5, 2.0),
                                      (module.weight.data, 0.5, 1.5),
                                      (module.bias.data, -0.5, 0.5)):
                tensor.copy_(torch.rand(tensor.shape, generator=generator) * (high - low) + low)
    return net


def reference_features(state: dict[str, torch.Tensor], images: torch.Tensor) -> torch.Tensor:
    """The published forward, literally: conv -> BN (eval) -> ReLU everywhere, the port's
    pools (max 3/2 with ceil after the stem and in 3c/4e, avg 3/1/1 in the other blocks but
    max 3/1/1 in 5b), branches concatenated as 1x1, 3x3, double 3x3, pool."""
    def unit(name: str, x: torch.Tensor) -> torch.Tensor:
        conv = next(row for row in PUBLISHED_CONVS if row[0] == name)
        x = F.conv2d(x, state[f"{name}.weight"], state[f"{name}.bias"], stride=conv[4],
                     padding=conv[3] // 2)
        x = F.batch_norm(x, state[f"{name}_bn.running_mean"], state[f"{name}_bn.running_var"],
                         state[f"{name}_bn.weight"], state[f"{name}_bn.bias"], eps=1e-5)
        return F.relu(x)

    x = F.max_pool2d(unit("conv1_7x7_s2", images), 3, 2, ceil_mode=True)
    x = F.max_pool2d(unit("conv2_3x3", unit("conv2_3x3_reduce", x)), 3, 2, ceil_mode=True)
    for block in BLOCKS:
        p = f"inception_{block}"
        three = unit(f"{p}_3x3", unit(f"{p}_3x3_reduce", x))
        double = unit(f"{p}_double_3x3_2",
                      unit(f"{p}_double_3x3_1", unit(f"{p}_double_3x3_reduce", x)))
        if block in REDUCTION_BLOCKS:
            x = torch.cat([three, double, F.max_pool2d(x, 3, 2, ceil_mode=True)], 1)
            continue
        pooled = (F.max_pool2d(x, 3, 1, 1, ceil_mode=True) if block == "5b"
                  else F.avg_pool2d(x, 3, 1, 1, ceil_mode=True, count_include_pad=True))
        x = torch.cat([unit(f"{p}_1x1", x), three, double, unit(f"{p}_pool_proj", pooled)], 1)
    return x.mean(dim=(2, 3))


@pytest.mark.slow
def test_pooled_features_equal_the_published_forward():
    """(Also checked once against pretrainedmodels' own bninception.py with the same random
    weights: largest difference 3.6e-7 at 224 px.)"""
    net = randomised()
    images = 50 * torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, reference = net(images), reference_features(net.state_dict(), images)
    assert ours.shape == (2, 1024)
    assert torch.allclose(ours, reference, atol=1e-5, rtol=1e-5)
    assert (ours >= 0).all()  # every branch ends in a ReLU that takes effect


def test_pooling_options():
    net = randomised()
    images = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        feature_map = net.features(images)
        avg, maximum = feature_map.mean(dim=(2, 3)), feature_map.amax(dim=(2, 3))
        net.pooling = "max"
        assert torch.equal(net(images), maximum)
        net.pooling = "avg+max"
        assert torch.allclose(net(images), avg + maximum)
    with pytest.raises(KdmlError, match="pooling"):
        build_backbone("bninception", (3, 64, 64), pooling="median")


@pytest.mark.parametrize(("shape", "match"), [
    ((3, 8, 8), "side 8: it needs a side of at least 31.*nearest: 31\\)"),  # digits
    ((3, 56, 56), "side 56: .*32k-1 to 32k\\+6.*nearest: 38 or 63\\)"),  # torch.cat mismatch
    ((3, 30, 30), "side 30: "),  # one below the smallest
    ((3, 64, 39), "side 39: "),  # a non-square crop's bad width
    ((3, 299, 299), "side 299: "),  # Inception-v3's side is not one of them
])
def test_sides_it_cannot_take_are_refused_in_one_line_at_build(shape, match):
    with pytest.raises(KdmlError, match=match) as error:
        build_backbone("bninception", shape)
    message = str(error.value)
    assert "\n" not in message
    assert "data.image_size=224" in message and "model.backbone=cnn" in message
    with pytest.raises(KdmlError, match="3 channels"):
        build_backbone("bninception", (2, 224, 224))


def test_the_smallest_side_runs_and_the_rule_is_the_networks():
    from kdml.models import bninception

    net = build_backbone("bninception", (3, 31, 31)).eval()
    with torch.no_grad():
        assert net(torch.randn(2, 3, 31, 31)).shape == (2, 1024)
        assert net.features(torch.randn(1, 3, 63, 38)).shape == (1, 1024, 2, 1)
        with pytest.raises(KdmlError, match="side 56"):  # the module itself refuses too
            net(torch.randn(1, 3, 56, 56))
    # Without the check, the raw network runs exactly on the sides side_fits allows.
    check = bninception.check_image_size
    bninception.check_image_size = lambda height, width: None
    try:
        for side in (*range(21, 41), *range(61, 72)):
            with torch.no_grad():
                try:
                    net.features(torch.zeros(1, 3, side, side))
                    runs = True
                except RuntimeError:
                    runs = False
            assert runs == bninception.side_fits(side), side
    finally:
        bninception.check_image_size = check


@pytest.fixture(scope="module")
def new_bninception() -> Callable[[], BNInception]:
    """``new_bninception()``: a new ``BNInception()``, as a copy of one built once per module
    (building draws its 11M weights, about three times a copy's time). Its weights are
    another draw than every ``randomised()`` net's, so a copy equals one only once loaded."""
    built = BNInception()
    return lambda: copy.deepcopy(built)


def save_published_checkpoint(path, net: BNInception) -> dict[str, torch.Tensor]:
    """A file shaped like bn_inception-52deb4733.pth: the backbone plus last_linear."""
    state = {key: value.clone() for key, value in net.state_dict().items()
             if not key.endswith("num_batches_tracked")}
    state["last_linear.weight"] = torch.randn(1000, 1024)
    state["last_linear.bias"] = torch.randn(1000)
    torch.save(state, path)
    return state


def test_a_published_checkpoint_loads_and_its_classifier_is_ignored(tmp_path, new_bninception):
    saved = save_published_checkpoint(tmp_path / "bn_inception.pth", randomised())
    fresh = new_bninception()
    lines = []
    load_weights(fresh, tmp_path / "bn_inception.pth", report=lines.append)
    assert torch.equal(fresh.inception_5b_pool_proj.weight, saved["inception_5b_pool_proj.weight"])
    assert len(lines) == 1 and "ignored the classifier (last_linear" in lines[0]
    assert "missing" not in lines[0] and "unexpected" not in lines[0]


def test_weights_from_safetensors_and_nested_checkpoints(tmp_path, new_bninception):
    from safetensors.torch import save_file

    net = randomised()
    state = {key: value.contiguous() for key, value in net.state_dict().items()}
    save_file(state, str(tmp_path / "weights.safetensors"))
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}},
               tmp_path / "training.pth")
    save_file(state, str(tmp_path / "WEIGHTS.SAFETENSORS"))  # had been read as a pickle
    for name in ("weights.safetensors", "training.pth", "WEIGHTS.SAFETENSORS"):
        fresh = new_bninception()
        load_weights(fresh, tmp_path / name, report=lambda line: None)
        assert torch.equal(fresh.conv1_7x7_s2.weight, net.conv1_7x7_s2.weight)


def test_weights_errors_are_one_line(tmp_path, new_bninception):
    with pytest.raises(KdmlError, match="never downloads weights.*pretrainedmodels") as error:
        load_weights(new_bninception(), tmp_path / "bn_inception-52deb4733.pth")
    assert "\n" not in str(error.value) and "does not exist" in str(error.value)
    (tmp_path / "weights.pth").mkdir()
    with pytest.raises(KdmlError, match="weights.pth is not a file; kdml never downloads"):
        load_weights(new_bninception(), tmp_path / "weights.pth")
    state = new_bninception().state_dict()
    state["inception_4a_1x1.weight"] = torch.zeros(10, 576, 1, 1)
    torch.save(state, tmp_path / "other.pth")
    with pytest.raises(KdmlError, match="inception_4a_1x1.weight has shape"):
        load_weights(new_bninception(), tmp_path / "other.pth")
    torch.save({"encoder.weight": torch.zeros(3)}, tmp_path / "unrelated.pth")
    with pytest.raises(KdmlError, match="shares no key"):
        load_weights(new_bninception(), tmp_path / "unrelated.pth")
    # a file of a classifier alone names its keys, though they are dropped before the check
    torch.save({"fc.weight": torch.zeros(2, 3), "fc.bias": torch.zeros(2)},
               tmp_path / "classifier.pth")
    with pytest.raises(KdmlError, match=r"its first keys: fc\.weight, fc\.bias\); it holds "
                       "only a classifier"):
        load_weights(new_bninception(), tmp_path / "classifier.pth")
    (tmp_path / "junk.pth").write_bytes(b"junk")
    with pytest.raises(KdmlError, match="not a readable state dict"):
        load_weights(new_bninception(), tmp_path / "junk.pth")
    torch.save({}, tmp_path / "empty.pth")  # had said "(its first keys: )"
    with pytest.raises(KdmlError, match="empty.pth holds no state dict of tensors$"):
        load_weights(new_bninception(), tmp_path / "empty.pth")
    # a TorchScript archive: refused in kdml's line alone, without torch's warning before it
    with warnings.catch_warnings():  # torch.jit's own deprecation
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "scripted.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KdmlError, match="scripted.pth (holds no state dict|is not a "
                                            "readable state dict)"):
            load_weights(new_bninception(), tmp_path / "scripted.pth")
    # a model's state dict saved on the meta device: shapes only (a traceback at loading)
    torch.save({key: torch.empty_like(value, device="meta") for key, value in state.items()},
               tmp_path / "meta.pth")
    with pytest.raises(KdmlError, match="holds tensors without values .*meta device"):
        load_weights(new_bninception(), tmp_path / "meta.pth")


def test_batchnorm_tensors_stored_as_rows_load(tmp_path, new_bninception):
    net = randomised()
    state = {key: value.reshape(1, -1) if key.endswith(("_bn.weight", "_bn.bias",
                                                        "running_mean", "running_var"))
             else value for key, value in net.state_dict().items()}
    torch.save(state, tmp_path / "rows.pth")
    fresh = new_bninception()
    load_weights(fresh, tmp_path / "rows.pth", report=lambda line: None)
    assert torch.equal(fresh.conv2_3x3_bn.running_var, net.conv2_3x3_bn.running_var)


def test_a_file_for_another_model_is_refused_by_its_missing_and_unexpected_keys(tmp_path,
                                                                                new_bninception):
    """A file whose every shape fits (ResNet-18's in a ResNet-34) had loaded with the rest left
    random, and only a printed note said so."""
    # its own draw of weights, not the copies' below: a load into a copy would change it
    full = BNInception().state_dict()
    missing = dict(full)
    del missing["conv1_7x7_s2.bias"]
    unexpected = dict(full, **{"extra_layer.weight": torch.zeros(2)})
    both = dict(missing, **{"extra_layer.weight": torch.zeros(2)})
    for name, state, message in [
        ("missing", missing, r"lacks 1 of its tensors \(conv1_7x7_s2\.bias\): it is for "
                             "another model than the backbone; pass the file of this very "
                             "model$"),
        ("unexpected", unexpected, r"holds 1 it does not have \(extra_layer\.weight\): it is "
                                   "for another model"),
        ("both", both, r"lacks 1 of its tensors \(conv1_7x7_s2\.bias\) and holds 1 it does not "
                       r"have \(extra_layer\.weight\)"),
    ]:
        torch.save(state, tmp_path / f"{name}.pth")
        fresh = new_bninception()
        before = fresh.conv2_3x3.weight.clone()
        with pytest.raises(KdmlError, match=message):
            load_weights(fresh, tmp_path / f"{name}.pth", report=lambda line: None)
        assert torch.equal(fresh.conv2_3x3.weight, before)  # nothing loaded


def test_training_checkpoint_layouts(tmp_path, new_bninception):
    """PyTorch's tutorial's (and Proxy-Anchor's) model_state_dict loads; a checkpoint with a
    script's objects is refused as such, not as an unreadable file."""
    import argparse

    net = randomised()
    torch.save({"epoch": 5, "model_state_dict": net.state_dict(), "optimizer_state_dict": {}},
               tmp_path / "tutorial.pth")
    fresh = new_bninception()
    load_weights(fresh, tmp_path / "tutorial.pth", report=lambda line: None)
    assert torch.equal(fresh.conv1_7x7_s2.weight, net.conv1_7x7_s2.weight)
    torch.save({"state_dict": net.state_dict(), "args": argparse.Namespace(lr=0.1)},
               tmp_path / "timm_train.pth.tar")
    with pytest.raises(KdmlError, match=r"timm_train\.pth\.tar holds a Python object besides "
                       r"tensors \(argparse\.Namespace\), which kdml does not unpickle.*"
                       r"torch\.save\(checkpoint\['state_dict'\], 'weights\.pth'\)"):
        load_weights(new_bninception(), tmp_path / "timm_train.pth.tar")
    torch.save({"epoch": 5, "optimizer": {"lr": torch.zeros(1)}}, tmp_path / "no_model.pth")
    with pytest.raises(KdmlError, match=r"holds no state dict of tensors \(its keys: epoch, "
                       r"optimizer\)$"):
        load_weights(new_bninception(), tmp_path / "no_model.pth")


def test_an_rgb_first_convolution_loads_into_a_grayscale_backbone(tmp_path):
    from kdml.models.backbones import SmallCNN

    rgb, gray = SmallCNN(3, 28), SmallCNN(1, 28)
    torch.save(rgb.state_dict(), tmp_path / "rgb.pth")
    lines = []
    load_weights(gray, tmp_path / "rgb.pth", report=lines.append)
    assert torch.allclose(gray.layers[0].weight, rgb.layers[0].weight.sum(dim=1, keepdim=True))
    assert "summed RGB channels" in lines[0]


def test_vision_backbones_say_which_extra_they_need():
    from kdml.models.vision import vision_available

    available, reason = vision_available()
    if available:
        pytest.skip("timm and torchvision import here; tests/test_vision.py covers them")
    with pytest.raises(KdmlError, match="vision extra"):
        build_backbone("timm:resnet18", (1, 28, 28))
    with pytest.raises(KdmlError, match="vision extra"):
        build_backbone("torchvision:resnet18", (3, 32, 32))
    with pytest.raises(KdmlError, match="small_input"):
        build_backbone("bninception", (3, 32, 32), small_input=True)


@pytest.mark.slow
def test_jrd_trains_on_a_folder_with_bninception_weights(tmp_path, capsys):
    from fixtures_array_sets import make_image_folder

    from kdml import cli

    save_published_checkpoint(tmp_path / "bn_inception-52deb4733.pth", randomised())
    folder = make_image_folder(tmp_path, classes=4, per_class=4, size=48)
    out = tmp_path / "run"
    # one step on 32 px images (31-38 is BN-Inception's smallest range of sides), loaded in
    # this process: the checks are the weights' report and a scored run, not what it learns
    assert cli.main(["train", "jrd", "--dataset", f"folder:{folder}", "model.backbone=bninception",
                     "--weights", str(tmp_path / "bn_inception-52deb4733.pth"), "--out", str(out),
                     "--no-progress", "data.batch_size=4", "data.resize=40", "data.image_size=32",
                     "data.num_workers=0", "model.freeze_bn=true", "train.epochs=1",
                     "train.steps_per_epoch=1", "eval.nmi=false", "eval.ks=[1,2]",
                     "train.device=cpu"]) == 0
    printed = capsys.readouterr().out
    assert "ignored the classifier (last_linear" in printed  # the one-line weights report
    assert "recall@1" in printed


def test_frozen_batchnorm_without_weights_is_warned_of(tmp_path, capsys):
    """The paper configs' model.freeze_bn=true, run without --weights, trained a random
    BN-Inception with its BatchNorm statistics at 0 and 1 and said nothing."""
    from fixtures_array_sets import make_image_folder

    from kdml import cli

    folder = make_image_folder(tmp_path, classes=4, per_class=4, size=48)
    out = tmp_path / "run"
    # 32 px images (BN-Inception's smallest sides) loaded in this process (no loader
    # workers to start): the check is a warning, not the training
    assert cli.main(["train", "jrd", "--dataset", f"folder:{folder}", "model.backbone=bninception",
                     "--out", str(out), "--no-progress", "data.batch_size=4", "data.resize=40",
                     "data.image_size=32", "data.num_workers=0", "model.freeze_bn=true",
                     "train.epochs=1", "train.steps_per_epoch=1", "eval.nmi=false",
                     "eval.ks=[1]", "train.device=cpu"]) == 0
    warning = ("model.freeze_bn=true with no model.weights: the bninception backbone starts "
               "from random weights")
    assert f"kdml: warning: {warning}" in capsys.readouterr().err
    assert warning in (out / "train.log").read_text()


@pytest.mark.parametrize(("recipe", "extra", "warned"), [
    ("mtriplet", ["data.samples_per_class=2", "method.n_charts=2"], True),
    # the SimCLR recipes train their backbone from scratch, as their paper does
    ("simclr", ["method.crop_size=0", "data.holdout_fraction=0.5", "model.small_input=false"],
     False),
])
def test_a_backbone_its_paper_fine_tunes_warns_without_weights(tmp_path, capsys, recipe, extra,
                                                               warned):
    """The MTriplet configs (model.freeze_bn=false) run without --weights trained a random
    BN-Inception at the fine-tuning rate for hundreds of epochs and said nothing."""
    from fixtures_array_sets import make_image_folder

    from kdml import cli

    folder = make_image_folder(tmp_path, classes=4, per_class=4, size=48)
    out = tmp_path / "run"
    # 32 px images (BN-Inception's smallest sides) loaded in this process (no loader
    # workers to start): the check is a warning, not the training
    assert cli.main(["train", recipe, "--dataset", f"folder:{folder}",
                     "model.backbone=bninception", "--out", str(out), "--no-progress",
                     "data.batch_size=4", "data.resize=40", "data.image_size=32",
                     "data.num_workers=0", "model.freeze_bn=false", "train.epochs=1",
                     "train.steps_per_epoch=1", "eval.nmi=false", "eval.ks=[1]",
                     "train.device=cpu", *extra]) == 0
    warning = (f"no model.weights: the bninception backbone starts from random weights, while "
               f"{recipe}'s paper fine-tunes it from ImageNet weights")
    assert (warning in capsys.readouterr().err) == warned
    assert (warning in (out / "train.log").read_text()) == warned
