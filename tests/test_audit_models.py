"""Audit of kdml.models: behaviours that hand-made mutants of the model code showed untested.

Each test names what a plausible bug would have changed; numbers are checked against plain
float64 loops.
"""

from __future__ import annotations

import hashlib
import re

import pytest
import torch

from kdml.errors import KdmlError
from kdml.models.atlas_heads import AtlasHead, ProjectionHeads

# ----------------------------------------------------------------- Atlas heads


@pytest.mark.parametrize("features", [torch.ones(4, 8, dtype=torch.long), [[0.0] * 8] * 4])
def test_atlas_head_refuses_integer_or_non_tensor_features_in_one_line(features):
    """Without its checks the head fails inside nn.Linear ("mat1 and mat2 must have the same
    dtype") or on a list's missing ``ndim``."""
    head = AtlasHead(8, dim=2, n_charts=3)
    with pytest.raises(KdmlError, match=r"^AtlasHead (expects floating point features, got "
                                        r"torch\.int64|takes torch tensors \(features\))"):
        head(features)


@pytest.mark.parametrize("q_shape", [(4, 2), (3, 3), (4,)])
def test_projection_heads_refuse_memberships_of_the_wrong_shape(q_shape):
    """forward and project both check q against coords [B, n]; einsum's own error otherwise."""
    heads = ProjectionHeads(dim=2, n_charts=3, out_features=4)
    coords, q = torch.zeros(4, 3, 2), torch.full(q_shape, 1.0 / 3)
    message = re.escape(f"ProjectionHeads: q must be [B, n] = (4, 3), got {q_shape}")
    with pytest.raises(KdmlError, match=message):
        heads(coords, q)
    with pytest.raises(KdmlError, match=message):
        heads.project(coords, q)


def test_active_share_does_not_count_a_unit_whose_preactivation_is_exactly_zero():
    """A unit is on when its pre-activation is > 0: at exactly 0 the ReLU outputs 0, so it is
    off. Pre-sigmoid coordinates of 0 give pre-activations of exactly 0 (no bias)."""
    heads = ProjectionHeads(dim=2, n_charts=3, out_features=4, hidden=5,
                            head_input="pre-sigmoid").double()
    coords = torch.zeros(6, 3, 2, dtype=torch.float64)
    q = torch.full((6, 3), 1.0 / 3, dtype=torch.float64)
    assert heads.active_share(coords, q).item() == 0.0
    assert heads.project(coords, q)[1].item() == 0.0
    assert torch.count_nonzero(heads(coords, q)) == 0


def test_active_share_has_no_gradient_even_for_memberships_that_need_one():
    """A logged diagnostic, "without gradient": it must not keep the graph of q alive."""
    torch.manual_seed(0)
    heads = ProjectionHeads(dim=2, n_charts=3, out_features=4).double()
    coords = torch.randn(5, 3, 2, dtype=torch.float64, requires_grad=True)
    q = torch.softmax(torch.randn(5, 3, dtype=torch.float64), dim=1).requires_grad_()
    assert not heads.active_share(coords, q).requires_grad
    projection, share = heads.project(coords, q)
    assert projection.requires_grad and not share.requires_grad


def test_projection_backpropagates_to_the_memberships_and_the_coordinates():
    """z = sum_i q_i h_i(phi_i): dz_p/dq_i = h_i(phi_i)_p, so the gradient of sum(z) with respect
    to q_{b,i} is the sum of chart i's head output (the memberships are trained through it)."""
    torch.manual_seed(1)
    heads = ProjectionHeads(dim=2, n_charts=3, out_features=4, hidden=5).double()
    coords = torch.randn(4, 3, 2, dtype=torch.float64, requires_grad=True)
    q = torch.softmax(torch.randn(4, 3, dtype=torch.float64), dim=1).requires_grad_()
    heads(coords, q).sum().backward()
    per_chart = heads.per_chart(coords.detach())
    assert q.grad is not None and coords.grad is not None
    for b in range(4):
        for i in range(3):
            assert q.grad[b, i].item() == pytest.approx(per_chart[b, i].sum().item(), abs=1e-12)


def test_projection_heads_initialise_like_nn_linear():
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in the layer's input width: d for the hidden
    layer, h for the output layer (not their output widths)."""
    torch.manual_seed(2)
    heads = ProjectionHeads(dim=4, n_charts=2, out_features=200, hidden=100)
    for weight, fan_in in ((heads.hidden_weight, 4), (heads.output_weight, 100)):
        bound = fan_in ** -0.5
        assert weight.abs().max().item() <= bound
        assert weight.abs().max().item() > 0.9 * bound  # thousands of draws reach the bound


# ----------------------------------------------------------------- JRD head


def test_jrd_cosines_are_taken_in_float32_under_bf16_autocast():
    """The class-level cosines go into AM-Softmax times its scale: under bf16 autocast they
    are computed in float32 from the (bf16) embedding, within float32 rounding of a float64
    product, not rounded to bfloat16 (about 4e-3)."""
    from kdml.models.heads import JRDHead

    torch.manual_seed(0)
    head = JRDHead(32, 16, 4)
    pooled = torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, embedding, cosines = head(pooled)
    assert cosines.dtype == torch.float32
    proxies = head.proxies.detach().double()
    unit_proxies = proxies / proxies.norm(dim=0, keepdim=True)
    reference = embedding.detach().double() @ unit_proxies
    assert (cosines.detach().double() - reference).abs().max().item() < 1e-6


# ----------------------------------------------------------------- DTML network


@pytest.mark.parametrize(("activation", "phi"), [("relu", lambda v: max(0.0, v)),
                                                 ("identity", lambda v: v)])
def test_dtml_relu_and_identity_activations_follow_eq_1(activation, phi):
    """tests/test_dtml_model.py checks tanh and sigmoid; relu and identity are options too."""
    from kdml.models.dtml import DTMLNetwork

    torch.manual_seed(4)
    network = DTMLNetwork([3, 4, 2], activation=activation, init="standard").double()
    x = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    rows = x.tolist()
    for layer, output in zip(network.layers, network(x), strict=True):
        weight, bias = layer.weight.tolist(), layer.bias.tolist()
        rows = [[phi(sum(w * v for w, v in zip(w_row, row, strict=True)) + b)
                 for w_row, b in zip(weight, bias, strict=True)] for row in rows]
        for got, expected in zip(output.tolist(), rows, strict=True):
            assert got == pytest.approx(expected, abs=1e-12)
    if activation == "identity":  # the identity lets negative values through
        assert min(value for row in rows for value in row) < 0


def test_dtml_network_refuses_an_unknown_init():
    from kdml.models.dtml import DTMLNetwork

    with pytest.raises(KdmlError, match=r"^unknown init 'eye'; choose one of identity, "
                                        r"standard$"):
        DTMLNetwork([3, 2], init="eye")


def test_dtml_network_refuses_a_non_tensor_input_in_one_line():
    import numpy as np

    from kdml.models.dtml import DTMLNetwork

    with pytest.raises(KdmlError, match=r"^DTMLNetwork takes torch tensors \(features\)"):
        DTMLNetwork([3, 2])(np.zeros((4, 3), dtype=np.float32))


# ----------------------------------------------------------------- local weights files


class _TinyNet(torch.nn.Module):
    """A first convolution, a BatchNorm and a layer of its own called ``fc``."""

    def __init__(self, in_channels: int = 3, out_channels: int = 4, kernel: int = 3) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(in_channels, out_channels, kernel, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(out_channels)
        self.fc = torch.nn.Linear(out_channels, 2)


def _randomised_state(net: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {key: torch.rand(value.shape, generator=generator) if value.is_floating_point()
            else value.clone() for key, value in net.state_dict().items()}



def test_every_tensor_of_a_matching_file_reaches_the_backbone(tmp_path):
    """A file of exactly the backbone's tensors sets each one (weights, biases, BatchNorm
    statistics) to the file's values, and the note counts them all."""
    from kdml.models.weights import load_weights

    state = _randomised_state(_TinyNet(), seed=3)
    torch.save(state, tmp_path / "all.pth")
    net, lines = _TinyNet(), []
    load_weights(net, tmp_path / "all.pth", report=lines.append)
    assert all(torch.equal(net.state_dict()[key], value) for key, value in state.items())
    assert lines[0].startswith(f"loaded {len(state)} tensors from ")

def test_a_backbone_layer_named_like_a_classifier_loads_from_the_file(tmp_path):
    """Classifier keys are ignored only where the backbone lacks them: a backbone whose own
    layer is called ``fc`` gets it from the file (not refused as missing)."""
    from kdml.models.weights import load_weights

    state = _randomised_state(_TinyNet())
    torch.save(state, tmp_path / "tiny.pth")
    net, lines = _TinyNet(), []
    load_weights(net, tmp_path / "tiny.pth", report=lines.append)
    assert torch.equal(net.fc.weight, state["fc.weight"])
    digest = hashlib.sha256((tmp_path / "tiny.pth").read_bytes()).hexdigest()
    assert lines == [f"loaded {len(state)} tensors from {tmp_path / 'tiny.pth'} (SHA-256 "
                     f"{digest})"]


@pytest.mark.parametrize("prefix", ["last_linear", "fc", "classifier", "head", "heads"])
def test_every_classifier_prefix_the_backbone_lacks_is_ignored(tmp_path, prefix):
    """The module docstring's classifier keys (Cadene's last_linear, torchvision's fc and
    classifier, timm's head, ViT's heads) are dropped with a note."""
    from kdml.models.weights import load_weights

    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    state = dict(_randomised_state(net), **{f"{prefix}.weight": torch.zeros(5, 2)})
    torch.save(state, tmp_path / "with_classifier.pth")
    lines = []
    load_weights(net, tmp_path / "with_classifier.pth", report=lines.append)
    assert torch.equal(net[0].weight, state["0.weight"])
    assert lines[0].endswith(f"; ignored the classifier ({prefix}.weight)")


def test_weights_nested_under_model_load(tmp_path):
    """Checkpoints that nest the weights under ``model`` (DeiT's, the module docstring's
    third layout), also next to a string naming the architecture."""
    from kdml.models.weights import load_weights

    state = _randomised_state(_TinyNet())
    torch.save({"model": state, "epoch": 3}, tmp_path / "deit.pth")
    torch.save({"arch": "tiny", "model": "tiny", "model_state_dict": state},
               tmp_path / "named.pth")
    for name in ("deit.pth", "named.pth"):
        net = _TinyNet()
        load_weights(net, tmp_path / name, report=lambda line: None)
        assert torch.equal(net.conv1.weight, state["conv1.weight"])


@pytest.mark.parametrize(("saved", "own"), [((3, 4, 7), (1, 4, 3)), ((3, 8, 3), (1, 4, 3))],
                         ids=["other-kernel", "other-width"])
def test_an_rgb_convolution_of_another_shape_is_refused_in_one_line(tmp_path, saved, own):
    """The RGB-to-gray sum applies to a first convolution of the same output width and kernel
    only: anything else is the one-line "is for another model" (load_state_dict's multi-line
    size-mismatch RuntimeError otherwise)."""
    from kdml.models.weights import load_weights

    torch.save(_randomised_state(_TinyNet(*saved)), tmp_path / "rgb.pth")
    with pytest.raises(KdmlError, match=r"conv1\.weight has shape \(\d+, 3, \d+, \d+\) but "
                                        r"the backbone expects .*it is for another model$"):
        load_weights(_TinyNet(*own), tmp_path / "rgb.pth", report=lambda line: None)


@pytest.mark.parametrize("shape", [(1, 5), (1, 1, 4)], ids=["row-too-long", "three-dims"])
def test_only_batchnorm_rows_of_the_same_size_load_as_vectors(tmp_path, shape):
    """[1, C] loads as [C]; [1, C + 1] or a 3-D tensor is a one-line refusal, not a reshape's
    RuntimeError or a silent reshape."""
    from kdml.models.weights import load_weights

    state = _randomised_state(_TinyNet())
    state["bn1.running_var"] = torch.ones(shape)
    torch.save(state, tmp_path / "rows.pth")
    with pytest.raises(KdmlError, match=rf"bn1\.running_var has shape {re.escape(str(shape))} "
                                        r"but the backbone expects \(4,\)"):
        load_weights(_TinyNet(), tmp_path / "rows.pth", report=lambda line: None)


def test_weights_load_into_the_backbones_weights_target(tmp_path):
    """timm and torchvision backbones load the file into their inner ``network`` (their
    ``weights_target``), so the library's own checkpoints load as they are."""
    from kdml.models.weights import load_weights

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.network = _TinyNet()

        def weights_target(self) -> torch.nn.Module:
            return self.network

    state = _randomised_state(_TinyNet())
    torch.save(state, tmp_path / "library.pth")
    wrapper = Wrapper()
    load_weights(wrapper, tmp_path / "library.pth", report=lambda line: None)
    assert torch.equal(wrapper.network.conv1.weight, state["conv1.weight"])
    assert torch.equal(wrapper.network.bn1.running_mean, state["bn1.running_mean"])


def test_a_weights_path_with_a_tilde_is_the_home_folder(tmp_path, monkeypatch):
    from kdml.models.weights import load_weights

    monkeypatch.setenv("HOME", str(tmp_path))
    state = _randomised_state(_TinyNet())
    torch.save(state, tmp_path / "home.pth")
    net = _TinyNet()
    load_weights(net, "~/home.pth", report=lambda line: None)
    assert torch.equal(net.conv1.weight, state["conv1.weight"])


def test_a_file_lacking_many_tensors_names_three_and_says_there_are_more(tmp_path):
    from kdml.models.weights import load_weights

    net = torch.nn.Sequential(*(torch.nn.Linear(2, 2) for _ in range(3)))
    state = {"0.weight": torch.zeros(2, 2)}
    torch.save(state, tmp_path / "partial.pth")
    with pytest.raises(KdmlError, match=r"lacks 5 of its tensors \(0\.bias, 1\.bias, 1\.weight, "
                                        r"\.\.\.\): it is for another model"):
        load_weights(net, tmp_path / "partial.pth", report=lambda line: None)


# ----------------------------------------------------------------- Method.param_groups


def test_param_groups_decay_the_backbone_and_head_but_not_the_proxies():
    """Method.param_groups: weight decay on the backbone and the new layers, none on the class
    proxies (Sec. 5.1 of Chu et al. 2020), each parameter in exactly one group, and the
    detached logging terms carry no graph."""
    from kdml.config import OptimConfig
    from kdml.models.method import Method, detached

    class TwoPart(Method):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = torch.nn.Linear(3, 4)
            self.head = torch.nn.Linear(4, 2)
            self.proxies = torch.nn.Parameter(torch.zeros(2, 5))

        def proxy_parameters(self) -> list[torch.nn.Parameter]:
            return [self.proxies]

    method = TwoPart()
    groups = method.param_groups(OptimConfig(lr=0.1, head_lr=0.2, proxy_lr=0.3,
                                             weight_decay=0.01))
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [(0.1, 0.01), (0.2, 0.01),
                                                             (0.3, 0.0)]
    assert [len(g["params"]) for g in groups] == [2, 2, 1]
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in method.parameters())
    loss = method.head(method.backbone(torch.ones(1, 3))).sum()
    terms = detached(loss=loss, half=loss / 2)
    assert not any(value.requires_grad for value in terms.values())
    assert terms["half"].item() == pytest.approx(loss.item() / 2)


# ----------------------------------------------------------------- backbones


def test_identity_backbone_feature_size_is_the_flattened_input_size():
    from kdml.models.backbones import build_backbone

    backbone = build_backbone("identity", (1, 8, 8))
    assert backbone.feature_size == 64
    assert backbone(torch.zeros(2, 1, 8, 8)).shape == (2, 64)


@pytest.mark.parametrize(("name", "shape", "message"), [
    ("cnn", (40,), "backbone 'cnn' needs square images [C, H, W], got (40,)"),
    ("bninception", (3, 224), "backbone 'bninception' needs images [C, H, W], got shape "
                              "(3, 224)"),
    ("bninception", (1, 224, 224), "backbone 'bninception' takes RGB images (3 channels), "
                                   "got 1 channels"),
    ("timm:", (3, 32, 32), "name the model, e.g. timm:resnet50"),
    ("torchvision", (3, 32, 32), "name the model, e.g. torchvision:resnet50"),
])
def test_backbones_refuse_inputs_they_cannot_take_in_one_line(name, shape, message):
    """An IndexError on the shape or the vision extra's message about a model named "" had
    come instead of these lines."""
    from kdml.models.backbones import build_backbone

    with pytest.raises(KdmlError, match=f"^{re.escape(message)}"):
        build_backbone(name, shape)


@pytest.mark.parametrize("pooling", ["avg", "max", "avg+max"])
def test_bninception_backbone_is_built_with_the_pooling_asked_for(pooling):
    from kdml.models.backbones import build_backbone

    assert build_backbone("bninception", (3, 32, 32), pooling=pooling).pooling == pooling


def test_mlp_has_batchnorm_statistics_that_freeze_batchnorm_keeps():
    """freeze_batchnorm's test in test_models.py holds vacuously for a network without
    BatchNorm: here the MLP's running statistics exist and stay put in train mode."""
    from kdml.models.backbones import MLP, freeze_batchnorm

    torch.manual_seed(0)
    mlp = MLP(6, (5, 4))
    norms = [m for m in mlp.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    assert [m.num_features for m in norms] == [5, 4]
    mlp.train()
    mlp(torch.randn(8, 6) * 5 + 3)
    moved = [m.running_mean.clone() for m in norms]
    assert all(torch.count_nonzero(mean) > 0 for mean in moved)  # train mode updates them
    freeze_batchnorm(mlp)
    mlp(torch.randn(8, 6) * 5 + 3)
    assert all(torch.equal(m.running_mean, mean) for m, mean in zip(norms, moved, strict=True))


# ----------------------------------------------------------------- BN-Inception input


def test_bninception_normalization_is_caffes_bgr_0_255_minus_the_mean():
    """BN-Inception takes BGR channels, values 0-255, mean (104, 117, 128) subtracted, std 1
    (the Caffe model's convention): an RGB pixel (r, g, b) in [0, 1] becomes
    (255 b - 104, 255 g - 117, 255 r - 128)."""
    from kdml.models.bninception import BNInception

    r, g, b = 0.2, 0.5, 0.9
    image = torch.tensor([r, g, b], dtype=torch.float64).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    out = BNInception.normalization(image)
    expected = [255 * b - 104, 255 * g - 117, 255 * r - 128]
    for channel in range(3):
        assert out[0, channel].flatten().tolist() == pytest.approx([expected[channel]] * 4,
                                                                   abs=1e-9)


# ----------------------------------------------------------------- round 3


@pytest.mark.parametrize(("build", "message"), [
    (lambda: ProjectionHeads(2, 3, hidden=0), "hidden must be a positive integer, got 0"),
    (lambda: AtlasHead(0, 2, 3), "in_features must be a positive integer, got 0"),
])
def test_head_sizes_are_checked_in_one_line(build, message):
    """A hidden width of 0 had divided by zero in the init; an in_features of 0 builds an
    empty Linear."""
    with pytest.raises(KdmlError, match=f"^{re.escape(message)}$"):
        build()


def test_log_memberships_stay_finite_where_the_memberships_underflow():
    """log_q is log_softmax of the logits, finite where q underflows to 0 (the geometry's
    log-membership path relies on it), not log(softmax) = -inf."""
    head = AtlasHead(2, dim=2, n_charts=3).double()
    with torch.no_grad():
        head.membership.weight.zero_()
        head.membership.bias.copy_(torch.tensor([0.0, -200.0, -2000.0]))
    out = head(torch.zeros(1, 2, dtype=torch.float64))
    assert out.q[0, 2].item() == 0.0
    assert out.log_q[0].tolist() == pytest.approx([0.0, -200.0, -2000.0], abs=1e-9)


def test_embedding_head_is_the_normalised_affine_map_with_its_bias():
    """x = (W^T f + b) / ||W^T f + b||, written out; a zero affine output stays 0 (F.normalize's
    eps), not NaN."""
    import math

    from kdml.models.heads import EmbeddingHead

    torch.manual_seed(0)
    head = EmbeddingHead(3, 2).double()
    with torch.no_grad():
        head.linear.bias.copy_(torch.tensor([5.0, -5.0]))
    features = torch.randn(4, 3, dtype=torch.float64)
    weight, bias = head.linear.weight.tolist(), head.linear.bias.tolist()
    for row, got in zip(features.tolist(), head(features).tolist(), strict=True):
        affine = [sum(w * f for w, f in zip(w_row, row, strict=True)) + b
                  for w_row, b in zip(weight, bias, strict=True)]
        norm = math.sqrt(sum(a * a for a in affine))
        assert got == pytest.approx([a / norm for a in affine], abs=1e-12)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.zero_()
    assert head(features).tolist() == [[0.0, 0.0]] * 4


def test_jrd_representations_backpropagate_to_the_backbone_and_the_embedding():
    """The JRS loss takes gradients through x^- (pooled, the backbone's output) and through
    x^+ (the cosines) into the embedding layer."""
    from kdml.models.heads import JRDHead

    torch.manual_seed(1)
    head = JRDHead(6, 4, 3).double()
    pooled = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    representations = head(pooled)
    assert representations.pooled.requires_grad
    representations.pooled.sum().backward()
    assert torch.equal(pooled.grad, torch.ones_like(pooled))
    head.zero_grad()
    head(pooled).class_level.sum().backward()
    assert head.embedding.linear.weight.grad.abs().sum() > 0
    assert head.proxies.grad.abs().sum() > 0


@pytest.mark.parametrize(("saved", "own"), [((4, 4, 3), (1, 4, 3)), ((3, 4, 3), (2, 4, 3))],
                         ids=["rgba-into-gray", "rgb-into-two-channels"])
def test_only_an_rgb_convolution_is_summed_and_only_into_one_channel(tmp_path, saved, own):
    """The docstring's adaptation is RGB (3 channels) into a 1-channel backbone."""
    from kdml.models.weights import load_weights

    torch.save(_randomised_state(_TinyNet(*saved)), tmp_path / "other.pth")
    with pytest.raises(KdmlError, match=r"conv1\.weight has shape .*it is for another model$"):
        load_weights(_TinyNet(*own), tmp_path / "other.pth", report=lambda line: None)


def test_small_cnn_stem_divides_the_side_by_4_before_the_blocks():
    """224 px: the stem (stride-2 conv, 2x2 max-pool) gives 56, the blocks halve it three times
    to 7 before the global pooling."""
    from kdml.models.backbones import SmallCNN

    net = SmallCNN(3, 224).eval()
    with torch.no_grad():
        assert net.layers[:-2](torch.zeros(1, 3, 224, 224)).shape[-2:] == (7, 7)


@pytest.mark.parametrize(("side", "nearest"), [(33, [32, 34]), (39, [38, 63]), (30, [31]),
                                               (71, [70, 95])])
def test_nearest_sides_are_the_next_fitting_side_below_and_above(side, nearest):
    from kdml.models.bninception import nearest_sides

    assert nearest_sides(side) == nearest


# ----------------------------------------------------------------- defects the audit found


def test_active_share_refuses_memberships_of_the_wrong_shape():
    """A q of [B, 1] had broadcast over the charts: 0.875 for a share of about 0.29, and it
    could leave [0, 1]; forward and project refused it already."""
    torch.manual_seed(0)
    heads = ProjectionHeads(dim=2, n_charts=3, out_features=4)
    coords = torch.randn(4, 3, 2)
    with pytest.raises(KdmlError, match=re.escape(
            "ProjectionHeads: q must be [B, n] = (4, 3), got (4, 1)")):
        heads.active_share(coords, torch.ones(4, 1))
    q = torch.full((4, 3), 1.0 / 3)
    assert heads.active_share(coords, q).item() == heads.project(coords, q)[1].item()


@pytest.mark.parametrize(("coords", "q", "message"), [
    (torch.zeros(4, 3, 2), torch.ones(4, 3, dtype=torch.long),
     "ProjectionHeads expects floating point memberships q, got torch.int64"),
    (torch.zeros(4, 3, 2, dtype=torch.long), torch.ones(4, 3),
     "ProjectionHeads expects floating point coords, got torch.int64"),
    ([[[0.0, 0.0]] * 3] * 4, torch.ones(4, 3),
     "ProjectionHeads takes torch tensors (coords and memberships q), got list"),
])
def test_projection_heads_refuse_inputs_that_are_no_float_tensors(coords, q, message):
    heads = ProjectionHeads(dim=2, n_charts=3, out_features=4)
    for call in (heads, heads.project, heads.active_share):
        with pytest.raises(KdmlError, match=f"^{re.escape(message)}"):
            call(coords, q)


@pytest.mark.parametrize(("features", "message"), [
    (torch.zeros(4, 5), "expects pooled features [B, 6], got (4, 5)"),
    (torch.zeros(6), "expects pooled features [B, 6], got (6,)"),
    (torch.zeros(4, 6, dtype=torch.long), "expects floating point pooled features, got "
                                          "torch.int64"),
    ([[0.0] * 6] * 4, "takes torch tensors (pooled features), got list"),
])
def test_embedding_and_jrd_heads_refuse_features_they_cannot_take(features, message):
    """torch's "mat1 and mat2 shapes cannot be multiplied" (or dtype) error had come from
    inside the Linear layer."""
    from kdml.models.heads import EmbeddingHead, JRDHead

    for owner, head in (("EmbeddingHead", EmbeddingHead(6, 4)), ("JRDHead", JRDHead(6, 4, 3))):
        with pytest.raises(KdmlError, match=f"^{re.escape(f'{owner} {message}')}"):
            head(features)


@pytest.mark.parametrize(("sizes", "named"), [
    ((128, 64, 0), "num_classes must be a positive integer, got 0"),  # built silently
    ((128, -1, 10), "embedding_size must be a positive integer, got -1"),  # torch's RuntimeError
    ((128.0, 64, 10), "in_features must be a positive integer, got 128.0"),  # torch's TypeError
    ((True, 64, 10), "in_features must be a positive integer, got True"),  # Linear(True, ...)
])
def test_embedding_and_jrd_heads_refuse_sizes_that_are_no_positive_integers(sizes, named):
    """AtlasHead refused such sizes in one line; the JRD and embedding heads left them to
    nn.Linear and torch.randn ("Trying to create tensor with negative dimension -1", "empty():
    argument 'size' failed to unpack"), or built a head of no class."""
    import numpy as np

    from kdml.models.heads import EmbeddingHead, JRDHead

    with pytest.raises(KdmlError, match=f"^JRDHead: {re.escape(named)}$"):
        JRDHead(*sizes)
    if "num_classes" not in named:
        with pytest.raises(KdmlError, match=f"^EmbeddingHead: {re.escape(named)}$"):
            EmbeddingHead(*sizes[:2])
    head = JRDHead(np.int64(6), 4, 3)  # a NumPy integer is a size, as for AtlasHead
    assert head.proxies.shape == (4, 3) and head.embedding.linear.in_features == 6


def test_a_weights_file_whose_keys_are_not_names_is_refused_in_one_line(tmp_path):
    """{0: tensor} had stopped read_state_dict with an AttributeError (int has no
    removeprefix)."""
    from kdml.models.weights import read_state_dict

    torch.save({0: torch.zeros(2)}, tmp_path / "numbered.pth")
    with pytest.raises(KdmlError, match=r"holds no state dict of tensors \(its keys: 0\)$"):
        read_state_dict(tmp_path / "numbered.pth")


# ----------------------------------------------------------------- mutation audit, round 86


def test_projection_heads_hidden_width_defaults_to_the_chart_dimension():
    """SimCLR's head and the authors' code: the hidden width is the input dimension d, not
    the output width (hidden defaulting to out_features had passed every model test)."""
    heads = ProjectionHeads(dim=2, n_charts=3, out_features=8)
    assert tuple(heads.hidden_weight.shape) == (3, 2, 2)
    assert tuple(heads.output_weight.shape) == (3, 2, 8)


def _randomised_batchnorm_statistics(net: torch.nn.Module, seed: int) -> None:
    """Running means, variances and affine parameters away from their 0/1 initialisation, so
    that a dropped or misplaced BatchNorm changes the output."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in net.modules():
            if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
                size = layer.num_features
                layer.running_mean.copy_(torch.randn(size, generator=generator))
                layer.running_var.copy_(torch.rand(size, generator=generator) + 0.5)
                layer.weight.copy_(torch.randn(size, generator=generator))
                layer.bias.copy_(torch.randn(size, generator=generator))


def _batchnorm(x: torch.Tensor, layer: torch.nn.Module) -> torch.Tensor:
    """Eval-mode BatchNorm over dim 1, written out: (x - mean) / sqrt(var + eps) * w + b."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    scale = (layer.running_var + layer.eps).sqrt().view(shape)
    return ((x - layer.running_mean.view(shape)) / scale * layer.weight.view(shape)
            + layer.bias.view(shape))


def test_mlp_backbone_is_linear_batchnorm_relu_per_hidden_layer():
    """MLP: h = ReLU(BN(W h + b)) per hidden width, flattened input (a Tanh in place of the
    ReLU had passed every model test)."""
    from kdml.models.backbones import MLP
    torch.manual_seed(0)
    net = MLP(6, (5, 4)).double().eval()
    _randomised_batchnorm_statistics(net, 1)
    x = torch.randn(7, 2, 3, dtype=torch.float64)
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    hidden = x.reshape(7, 6)
    for linear, norm in zip(linears, norms, strict=True):
        hidden = _batchnorm(hidden @ linear.weight.T + linear.bias, norm).clamp(min=0)
    assert net.feature_size == 4
    assert torch.allclose(net(x), hidden, atol=1e-12, rtol=0)


def test_conv1d_net_is_conv_batchnorm_relu_blocks_then_a_global_mean():
    """Conv1dNet, written out: conv (no bias) -> BN -> ReLU per block, a max-pool of 2 between
    blocks, then the mean over the length (a dropped BatchNorm or a global max had passed)."""
    import torch.nn.functional as F

    from kdml.models.backbones import Conv1dNet
    torch.manual_seed(0)
    net = Conv1dNet((3, 4)).double().eval()
    _randomised_batchnorm_statistics(net, 2)
    signals = torch.randn(5, 12, dtype=torch.float64)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv1d)]
    norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    x = signals[:, None]
    for index, (conv, norm) in enumerate(zip(convs, norms, strict=True)):
        assert conv.bias is None
        x = _batchnorm(F.conv1d(x, conv.weight, padding=1), norm).clamp(min=0)
        if index < len(convs) - 1:
            x = F.max_pool1d(x, 2)
    assert torch.allclose(net(signals), x.mean(dim=2), atol=1e-12, rtol=0)


def test_small_cnn_is_conv_batchnorm_relu_blocks_then_a_global_mean():
    """SmallCNN at side 8, written out: conv 3x3 (no bias) -> BN -> ReLU per block, one
    max-pool of 2 after the first block (8 -> 4), then the mean over the map (a dropped
    BatchNorm or a global max had passed every model test)."""
    import torch.nn.functional as F

    from kdml.models.backbones import SmallCNN
    torch.manual_seed(0)
    net = SmallCNN(1, 8, widths=(3, 4)).double().eval()
    _randomised_batchnorm_statistics(net, 3)
    images = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    x = images
    for index, (conv, norm) in enumerate(zip(convs, norms, strict=True)):
        assert conv.bias is None
        x = _batchnorm(F.conv2d(x, conv.weight, padding=1), norm).clamp(min=0)
        if index == 0:
            x = F.max_pool2d(x, 2)
    assert torch.allclose(net(images), x.mean(dim=(2, 3)), atol=1e-12, rtol=0)


@pytest.mark.parametrize(("side", "stems"), [(64, 0), (65, 1), (128, 1), (259, 1), (260, 2)])
def test_small_cnn_stem_runs_until_the_side_is_at_most_64(side, stems):
    """One stem stage (stride-2 conv and 2x2 max-pool) per division by 4 while the side is
    above 64: 65-259 px take one (a threshold of 128 had passed, as 224 takes one either
    way)."""
    from kdml.models.backbones import SmallCNN

    net = SmallCNN(3, side, widths=(4, 8))
    strided = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d) and m.stride == (2, 2)]
    assert len(strided) == stems


def test_an_rgb_first_convolution_loads_into_a_gray_backbone_as_the_sum_of_its_channels(
        tmp_path):
    """The docstring's adaptation, by value: the 1-channel kernel is the sum of the three RGB
    kernels (a mean, or the red channel alone, had passed every model test), and the note
    names the tensor."""
    from kdml.models.weights import load_weights

    state = _randomised_state(_TinyNet(3), seed=4)
    torch.save(state, tmp_path / "rgb.pth")
    net, lines = _TinyNet(1), []
    load_weights(net, tmp_path / "rgb.pth", report=lines.append)
    assert torch.equal(net.conv1.weight, state["conv1.weight"].sum(dim=1, keepdim=True))
    assert torch.equal(net.bn1.running_var, state["bn1.running_var"])
    assert lines[0].endswith("; summed RGB channels for 1-channel input (conv1.weight)")


def test_a_dataparallel_file_loads_without_its_module_prefix(tmp_path):
    """Keys saved from nn.DataParallel ("module.conv1.weight") load as the backbone's own
    (removing "module" without its dot had passed every model test)."""
    from kdml.models.weights import load_weights

    state = _randomised_state(_TinyNet(), seed=5)
    torch.save({f"module.{key}": value for key, value in state.items()},
               tmp_path / "parallel.pth")
    net = _TinyNet()
    load_weights(net, tmp_path / "parallel.pth", report=lambda line: None)
    assert all(torch.equal(net.state_dict()[key], value) for key, value in state.items())


def test_a_file_with_tensors_the_backbone_lacks_is_refused_naming_them(tmp_path):
    """A file holding every backbone tensor and more (a deeper network's: ResNet-34's file in
    a ResNet-18) is refused in one line naming the extra tensors, not loaded in part (a check
    of missing tensors alone had passed every model test)."""
    from kdml.models.weights import load_weights

    state = dict(_randomised_state(_TinyNet()), **{"layer4.0.weight": torch.zeros(2, 2)})
    torch.save(state, tmp_path / "deeper.pth")
    net = _TinyNet()
    before = {key: value.clone() for key, value in net.state_dict().items()}
    with pytest.raises(KdmlError, match=r"holds 1 it does not have \(layer4\.0\.weight\): it is "
                                        r"for another model than the backbone"):
        load_weights(net, tmp_path / "deeper.pth", report=lambda line: None)
    assert all(torch.equal(net.state_dict()[key], value) for key, value in before.items())


def test_only_whole_classifier_module_names_are_ignored(tmp_path):
    """A classifier prefix is a module name with its dot: a file's ``fc1.weight`` (a hidden
    layer the backbone lacks) is for another model and refused, not dropped as a classifier
    (prefixes without their dots had passed every model test)."""
    from kdml.models.weights import load_weights

    state = dict(_randomised_state(_TinyNet()), **{"fc1.weight": torch.zeros(2, 2)})
    torch.save(state, tmp_path / "fc1.pth")
    with pytest.raises(KdmlError, match=r"holds 1 it does not have \(fc1\.weight\)"):
        load_weights(_TinyNet(), tmp_path / "fc1.pth", report=lambda line: None)


def test_batchnorm_tensors_stored_as_rows_load_as_vectors_by_value(tmp_path):
    """Some copies of the BN-Inception file store BatchNorm tensors as [1, C]: they load as
    [C] with the file's values (dropping them had passed every model test)."""
    from kdml.models.weights import load_weights

    state = _randomised_state(_TinyNet(), seed=6)
    rows = {key: value[None] if key.startswith("bn1.") and value.ndim == 1 else value
            for key, value in state.items()}
    torch.save(rows, tmp_path / "rows.pth")
    net = _TinyNet()
    load_weights(net, tmp_path / "rows.pth", report=lambda line: None)
    for key in ("bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"):
        assert torch.equal(net.state_dict()[key], state[key])


@pytest.mark.parametrize("key", ["bn1.running_mean", "bn1.running_var"])
def test_a_file_without_batchnorm_statistics_is_refused(tmp_path, key):
    """BatchNorm running statistics are part of a pretrained backbone (model.freeze_bn keeps
    them): a file lacking one is refused, not loaded over the 0/1 initialisation (only
    num_batches_tracked may be absent; waiving the statistics had passed every model test)."""
    from kdml.models.weights import load_weights

    state = _randomised_state(_TinyNet())
    del state[key]
    torch.save(state, tmp_path / "no_stats.pth")
    with pytest.raises(KdmlError, match=rf"lacks 1 of its tensors \({re.escape(key)}\)"):
        load_weights(_TinyNet(), tmp_path / "no_stats.pth", report=lambda line: None)


@pytest.mark.parametrize("key", ["conv1.weight", "fc.bias"])
def test_a_file_whose_parameter_holds_infinity_is_refused(tmp_path, key):
    """An infinite weight (not NaN, not a BatchNorm statistic) is a damaged file: refused in one
    line, not loaded to stop the first step (checking buffers only had passed every model
    test)."""
    from kdml.models.weights import load_weights

    state = _randomised_state(_TinyNet())
    state[key].view(-1)[0] = float("inf")
    torch.save(state, tmp_path / "inf.pth")
    with pytest.raises(KdmlError, match=rf"{re.escape(key)} holds NaN or infinite values; the "
                                        r"file is damaged"):
        load_weights(_TinyNet(), tmp_path / "inf.pth", report=lambda line: None)
