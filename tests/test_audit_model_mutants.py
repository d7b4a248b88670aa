"""Tests from the models' mutation audit (session 88): each pins a behaviour of the backbones,
heads, weight files or parameter groups that a mutant changed without any earlier test
failing, checked against an independent computation."""

import pytest
import torch

from kdml.models import freeze_batchnorm
from kdml.models.backbones import MLP


def test_frozen_batchnorm_normalises_by_its_statistics_and_its_affine_parameters_train():
    """``freeze_batchnorm`` fixes the running statistics only (Sec. 5.1 of Chu et al.): in
    train mode the layer then normalises by them, and its weight and bias still get
    gradients (a freeze that also set requires_grad=False had left them untrained)."""
    torch.manual_seed(0)
    backbone = MLP(6, (5,))
    linear, norm = backbone.layers[1], backbone.layers[2]
    with torch.no_grad():
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2)
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
    backbone.train()
    freeze_batchnorm(backbone)
    inputs = torch.randn(8, 6)
    out = backbone(inputs)
    expected = torch.relu((inputs @ linear.weight.T + linear.bias - norm.running_mean)
                          / torch.sqrt(norm.running_var + norm.eps) * norm.weight + norm.bias)
    assert torch.allclose(out, expected, atol=1e-6)
    assert backbone.training and linear.training and not norm.training
    out.square().sum().backward()
    assert norm.weight.requires_grad and norm.bias.requires_grad
    assert norm.weight.grad.abs().sum() > 0 and norm.bias.grad.abs().sum() > 0


def test_a_domain_adapted_runs_checkpoint_as_weights_loads_its_backbone(tmp_path):
    """A run with ``domain.beta > 0`` wraps its recipe's model (DomainAdaptedMethod), so its
    checkpoints/last.pt holds the backbone under ``inner.backbone.``: passed as --weights it
    was refused as "a kdml run's checkpoint whose model has no backbone weights (an identity
    backbone)". Its backbone's weights load as a plain run's do."""
    from kdml.models.backbones import build_backbone
    from kdml.models.weights import load_weights
    from kdml.regularizers.domain import DomainMMD
    from kdml.training.domain_adapted import DomainAdaptedMethod
    from kdml.training.recipes.jrd import AMSoftmaxParams, JRDMethod

    torch.manual_seed(0)
    backbone = build_backbone("cnn", (1, 8, 8))
    method = DomainAdaptedMethod(JRDMethod(backbone, 4, 3, AMSoftmaxParams()), 1.0, DomainMMD())
    path = tmp_path / "last.pt"
    torch.save({"epoch": 1, "method": method.state_dict(), "optimizer": {},
                "config": {"recipe": "jrd"}}, path)
    fresh = build_backbone("cnn", (1, 8, 8))
    lines: list[str] = []
    load_weights(fresh, path, report=lines.append)
    assert all(torch.equal(fresh.state_dict()[key], value)
               for key, value in backbone.state_dict().items())
    assert lines[0].startswith(f"loaded {len(backbone.state_dict())} tensors from {path}")


def test_dtml_hidden_layers_outputs_backpropagate_to_their_own_layer():
    """DSTML applies its criterion to the hidden layers too (Eq. 13), so ``forward``'s hidden
    outputs h^(m) = tanh(W^(m) h^(m-1) + b^(m)) must carry gradients to W^(m): here against
    the closed form d sum(h^(1)) / dW^(1) = (1 - h^(1)^2)^T x (a detached hidden output had
    passed every test)."""
    from kdml.models.dtml import DTMLNetwork

    torch.manual_seed(0)
    network = DTMLNetwork([4, 3, 2], init="standard")
    inputs = torch.randn(5, 4, dtype=torch.float64)
    network.double()
    hidden, top = network(inputs)
    hidden.sum().backward()
    first = network.layers[0]
    expected = torch.tanh(inputs @ first.weight.T + first.bias)
    assert torch.allclose(hidden, expected)
    assert torch.allclose(first.weight.grad, (1 - expected.square()).T @ inputs)
    assert torch.allclose(first.bias.grad, (1 - expected.square()).sum(dim=0))
    assert network.layers[1].weight.grad is None  # the top layer plays no part in h^(1)


def test_bninception_batchnorm_updates_its_statistics_at_torchs_default_momentum():
    """The module docstring: BatchNorm momentum is PyTorch's default 0.1, not the port's
    Caffe-style 0.9 (which in PyTorch weights each new batch by 0.9). One train-mode batch
    moves conv1's running mean from 0 to 0.1 times the batch mean of its convolution."""
    from kdml.models.bninception import BNInception

    torch.manual_seed(0)
    network = BNInception().train()
    images = torch.randn(2, 3, 31, 31)
    network(images)
    conv = network.conv1_7x7_s2
    batch_mean = torch.nn.functional.conv2d(images, conv.weight, conv.bias, stride=2,
                                            padding=3).mean(dim=(0, 2, 3))
    assert torch.allclose(network.conv1_7x7_s2_bn.running_mean, 0.1 * batch_mean, atol=1e-6)
    assert {layer.momentum for layer in network.modules()
            if isinstance(layer, torch.nn.BatchNorm2d)} == {0.1}


@pytest.mark.parametrize("training", [False, True])
def test_embedding_a_dataset_puts_the_model_back_in_the_mode_it_was_in(training):
    """The evaluator embeds in eval mode (BatchNorm by its running statistics) and then puts
    the model back as it found it: a scored model stays in eval mode, one mid-training in
    train mode (a restore to train mode had passed every test)."""
    from kdml.data.dataset import ArrayDataset
    from kdml.evaluation.evaluator import embed_dataset
    from kdml.training.recipes.jrd import AMSoftmaxParams, JRDMethod

    torch.manual_seed(0)
    method = JRDMethod(MLP(6, (5,)), 3, 2, AMSoftmaxParams()).train(training)
    dataset = ArrayDataset("toy", "toy", torch.randn(7, 6), torch.tensor([0, 1] * 3 + [0]))
    embedded = embed_dataset(method, dataset)
    assert method.training is training
    assert all(module.training is training for module in method.modules())
    method.eval()
    with torch.no_grad():
        assert torch.allclose(embedded.values, method.embed(dataset.x), atol=1e-6)
