"""Training steps without host-device synchronisation, checked on the CPU.

A step runs on PyTorch's meta device (shapes, no values) only if none of its operators needs
to see the data: no ``.item()``, ``torch.unique``, boolean-mask indexing, ``torch.where`` with
one argument, or CPU tensor mixed in. On a GPU each of those makes the host wait for the
device. tests/test_cuda.py checks the same on a GPU with ``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.losses import CosFaceLoss, NTXentLoss

from kdml.config import resolve_config
from kdml.models.backbones import build_backbone
from kdml.training.recipes import get_recipe

# Without a StepRandom the steps draw from torch's global generator, which the meta device
# accepts (a seeded step's generator on the model's device cannot be a meta one); the losses
# and the MMD are the same either way. The DTML family takes feature vectors, not images.
RECIPES = ["amsoftmax", "jrd", "mrd", "jrd-c", "jrd-pooling", "jmmd", "jintra", "intra",
           "triplet", "simclr", "mtriplet", "msimclr"]


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_a_step_needs_no_data_values(recipe_name):
    recipe = get_recipe(recipe_name)
    config = resolve_config(recipe_name, recipe.params, recipe.defaults,
                            overrides=["model.embedding_size=16"])
    model = recipe.build(config, build_backbone("cnn", (3, 32, 32)), 5).to("meta")
    images = torch.randn(20, 3, 32, 32, device="meta")
    labels = torch.arange(20, device="meta") % 5
    model(images, labels).loss.backward()
    assert any(parameter.grad is not None for parameter in model.parameters())


@pytest.mark.parametrize("recipe_name", ["dtml", "dstml", "ddml", "ddml-logistic"])
def test_a_dtml_step_needs_no_data_values(recipe_name):
    """The DTML family on feature vectors, with a target batch. Its marginal Fisher loss reads
    its first batch's neighbour counts once, to warn of clamped k1 or k2; that read, which the
    meta device cannot do, is skipped there (tests/test_dtml_losses.py counts it)."""
    recipe = get_recipe(recipe_name)
    config = resolve_config(recipe_name, recipe.params, recipe.defaults,
                            overrides=["model.embedding_size=16"])
    model = recipe.build(config, build_backbone("identity", (64,)), 5).to("meta")
    source, target = (torch.randn(20, 64, device="meta") for _ in range(2))
    labels = torch.arange(20, device="meta") % 5
    model(source, labels, target).loss.backward()
    assert any(parameter.grad is not None for parameter in model.parameters())


@pytest.mark.parametrize(("loss", "labels"), [
    (CosFaceLoss(5, 16), torch.arange(8) % 5),  # boolean mask on the target cosines
    (NTXentLoss(0.5), torch.arange(4).repeat(2)),  # torch.where on the label matrix
])
def test_the_check_catches_pml_s_synchronising_losses(loss, labels):
    """kdml computes these two losses itself for this reason; the check above would fail
    with PML's."""
    with pytest.raises(NotImplementedError):
        loss.to("meta")(torch.randn(8, 16, device="meta"), labels.to("meta"))
