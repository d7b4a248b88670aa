"""One training step of a kdml recipe as the trainer builds it, for the benchmarks that time or
count steps (train_throughput.py, jrs_speed.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from kdml.config import resolve_config
from kdml.precision import autocast
from kdml.training.recipes import get_recipe

# Not a recipe: the bare backbone with a linear classifier and cross-entropy, the floor a
# recipe's step is compared with.
BARE_BACKBONE = "backbone"


def training_step(name: str, backbone: torch.nn.Module, images: Tensor, labels: Tensor,
                  num_classes: int, overrides: Sequence[str] = (), precision: str = "fp32",
                  channels_last: bool = False, compile_loss: bool = False
                  ) -> Callable[[], None]:
    """Forward (under ``precision``'s autocast), backward and Adam step of recipe ``name`` (or
    of :data:`BARE_BACKBONE`) on one fixed batch, on ``images``' device.

    The recipe's model is built with its defaults plus ``overrides``, and Adam gets its
    parameter groups as the trainer gives them (``Method.param_groups``).
    """
    device = images.device
    if name == BARE_BACKBONE:
        model = torch.nn.Sequential(backbone, torch.nn.Linear(backbone.feature_size,
                                                              num_classes)).to(device)
        optimizer = torch.optim.Adam(model.parameters())

        def loss() -> Tensor:
            return torch.nn.functional.cross_entropy(model(images), labels)
    else:
        recipe = get_recipe(name)
        config = resolve_config(name, recipe.params, recipe.defaults, overrides=list(overrides))
        model = recipe.build(config, backbone, num_classes).to(device)
        optimizer = torch.optim.Adam(model.param_groups(config.optim))

        def loss() -> Tensor:
            return model(images, labels).loss
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    compute_loss = torch.compile(loss) if compile_loss else loss

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            value = compute_loss()
        value.backward()
        optimizer.step()

    return step
