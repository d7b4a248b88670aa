"""Audit: the Atlas recipes (mtriplet, msimclr) as a user meets them, end to end on tiny data:
settings refused before anything trains, and the commands that read an Atlas run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from kdml import cli
from kdml.config import resolve_config
from kdml.training.recipes import get_recipe
from kdml.training.recipes.atlas import MTripletMethod


def _photo_folder(root: Path, classes: int = 4, per_class: int = 10, side: int = 24) -> Path:
    """``folder:`` data of ``classes`` sub-folders of ``per_class`` RGB PNGs of one colour
    each, with noise (the same files every time)."""
    rng = np.random.default_rng(0)
    for label in range(classes):
        colour = rng.uniform(30, 225, 3)
        for k in range(per_class):
            pixels = np.clip(colour + rng.normal(0, 20, (side, side, 3)), 0, 255)
            (root / f"class{label}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels.astype(np.uint8)).save(root / f"class{label}" / f"{k}.png")
    return root


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return _photo_folder(tmp_path_factory.mktemp("photos") / "photos")


MLP_MSIMCLR = ["msimclr", "model.backbone=mlp", "model.small_input=false", "data.resize=20",
               "data.image_size=16", "data.batch_size=4", "train.epochs=1",
               "train.steps_per_epoch=1", "train.device=cpu", "eval.nmi=false", "eval.ks=[1]",
               "method.feature_dim=0", "--no-progress"]


def test_simclr_views_of_image_files_are_checked_against_the_crop_an_mlp_takes(
        tmp_path, capsys, photos):
    """Image files reach msimclr as their data.image_size centre crop (16 here), not at their
    decoded data.resize side (20): the MLP's check compared the views with the decoded side, so
    crop_size=20 passed it and stopped the first step in torch's raw "mat1 and mat2 shapes
    cannot be multiplied" (exit 1, a traceback), while crop_size=16, which fits, was
    refused."""
    capsys.readouterr()
    code = cli.main(["train", *MLP_MSIMCLR, "--dataset", f"folder:{photos}",
                     "method.crop_size=20", "--out", str(tmp_path / "wrong")])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err == ("kdml: error: model.backbone=mlp takes inputs of 16x16 pixels, its images' "
                   "data.image_size crop, and method.crop_size=20 crops the views to 20x20; "
                   "set method.crop_size=0 (views of the input's size)")
    assert not (tmp_path / "wrong").exists()
    code = cli.main(["train", *MLP_MSIMCLR, "--dataset", f"folder:{photos}",
                     "method.crop_size=16", "--out", str(tmp_path / "fits")])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "fits" / "checkpoints" / "last.pt").is_file()


def _unread(recipe: str, *overrides: str) -> list[str]:
    spec = get_recipe(recipe)
    default = resolve_config(spec.name, spec.params, spec.defaults)
    config = resolve_config(spec.name, spec.params, spec.defaults, None, list(overrides))
    return [setting for setting, _ in config.method.unread_settings(default.method)]


@pytest.mark.parametrize("recipe", ["mtriplet", "msimclr"])
def test_the_chart_loss_weight_of_one_chart_is_named_unread(recipe):
    """With method.n_charts=1 every membership is q = 1, where the chart loss and its gradient
    are 0: a grid over method.lambda2 trained the same run in every cell, without the warning
    kdml gives other settings a run never reads. Two charts read it."""
    assert _unread(recipe, "method.n_charts=1", "method.lambda2=0.5") == ["method.lambda2"]
    assert _unread(recipe, "method.n_charts=1") == []
    assert _unread(recipe, "method.n_charts=2", "method.lambda2=0.5") == []
    # the premise: at n = 1 the weight changes neither the loss nor any gradient
    grads = []
    for weight in (0.1, 5.0):
        params = resolve_config("mtriplet", get_recipe("mtriplet").params, {}, None,
                                ["method.n_charts=1", f"method.lambda2={weight}"]).method
        torch.manual_seed(0)
        backbone = torch.nn.Linear(4, 3)
        backbone.feature_size = 3
        method = MTripletMethod(backbone, params)
        inputs, labels = torch.randn(8, 4), torch.arange(4).repeat(2)
        loss = method(inputs, labels).loss
        loss.backward()
        grads.append([loss.detach(), *(p.grad.clone() for p in method.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_one_charts_membership_loss_is_zero_not_minus_zero():
    """With n = 1 every membership is 1, where the chart loss is exactly 0: it had been -0
    (written `-0` and `-0.0` in train.log and metrics.csv), the negation of an exact 0."""
    from kdml.regularizers.manifold import ChartMembershipLoss

    loss = ChartMembershipLoss()(torch.ones(5, 1, requires_grad=True))
    assert loss.item() == 0.0 and not torch.signbit(loss)
    assert f"{loss.item()}" == "0.0"
