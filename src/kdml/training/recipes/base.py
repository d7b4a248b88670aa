"""The recipe record: a name, its hyperparameters and a builder. Recipes own no training loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from kdml.config import RunConfig
from kdml.models.method import Method

# build(config, backbone, num_train_classes) -> Method
Builder = Callable[[RunConfig, nn.Module, int], Method]


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    params: type  # dataclass of the recipe's hyperparameters (the config's `method` section)
    build: Builder
    defaults: dict[str, Any] = field(default_factory=dict)  # overrides of other sections
    # the setting that sizes the embedding, where it is not model.embedding_size
    embedding_setting: str = "model.embedding_size"
    # whether its paper starts an ImageNet backbone from ImageNet weights (model.weights); the
    # SimCLR recipes train theirs from scratch
    pretrained: bool = True
    # whether it trains on batches (data.batch_size); a method fitted in closed form on the
    # whole split (PCA: Method.needs_fit) draws none
    draws_batches: bool = True
    # whether model.weights being given or not decides the backbone's input normalisation (the
    # SimCLR recipes: the [0, 1] images from scratch, the backbone's own with weights), so
    # that a resumed or scored run may move its weights file but not drop or add one
    inputs_follow_weights: bool = False
    # whether its method augments image inputs into views (the SimCLR recipes): it cannot
    # train a domain pair, whose samples are feature vectors (built-in pairs and npz:FILE)
    augments_images: bool = False
    # whether its method trains on a target domain (Method.uses_target: dtml, dstml, ddml), so
    # that a dataset that is no domain pair is refused from its name, before the data is read
    needs_target: bool = False
    # whether its method is scored by chart retrieval (Method.has_charts: the Atlas recipes),
    # which kdml does not do across a domain pair: such a dataset is refused from its name
    has_charts: bool = False
    # refuses, before the data is read, a model.backbone its method cannot take (DTML's family
    # is its own whole network, fed the flattened inputs: identity only), ahead of the
    # backbone's own checks of the data's shape, which would say less
    check_backbone: Callable[[RunConfig], None] | None = None
