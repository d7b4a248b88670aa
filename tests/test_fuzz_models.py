"""Models and pretrained weights as a user brings them (--weights FILE), as a fuzzing session
found them mishandled (the weights otherwise loaded exactly and freeze_bn kept BatchNorm
statistics bit-identical): BatchNorm statistics no network can hold, a DataParallel copy beside
a plain one, a kdml run's own checkpoint, weights for the identity backbone, sparse, integer or
complex tensors, a blocked global misnamed, the weights file not recorded by content, and a
SimCLR run's model.weights blanked, which changed its inputs' normalisation silently."""

from __future__ import annotations

import pytest
import torch

from kdml.config import resolve_config
from kdml.errors import KdmlError
from kdml.models.backbones import build_backbone
from kdml.models.weights import load_weights
from kdml.training.recipes import get_recipe
from kdml.training.resume_settings import changed_settings


def _cnn_weights() -> dict[str, torch.Tensor]:
    backbone = build_backbone("cnn", (1, 8, 8))
    return {key: value.clone() for key, value in backbone.state_dict().items()}


@pytest.mark.parametrize("key, value", [
    ("layers.1.running_var", -1.0),  # a variance below 0: sqrt(var + eps) is NaN
    ("layers.1.running_var", float("inf")),  # every output of the channel becomes 0
    ("layers.1.running_mean", float("-inf")),  # every output becomes -inf, then NaN
])
def test_a_batchnorm_statistic_no_network_can_hold_is_refused_as_a_damaged_file(
        tmp_path, key, value):
    # loaded, such a file stopped the first step with "Lower the learning rates or the
    # regularizer weight": the advice _check_finite was written to spare a damaged file
    state = _cnn_weights()
    state[key] = torch.full_like(state[key], value)
    path = tmp_path / "damaged.pth"
    torch.save(state, path)
    with pytest.raises(KdmlError, match=key):
        load_weights(build_backbone("cnn", (1, 8, 8)), path, report=lambda line: None)


def test_a_kdml_runs_checkpoint_as_weights_loads_its_backbone(tmp_path):
    """A user fine-tuning from an earlier run passes its checkpoints/last.pt: it was refused as
    holding "no state dict of tensors (its keys: epoch, method, optimizer, ...)", without a
    word on how to use it. Its backbone's weights (under method, prefixed backbone.) load."""
    backbone = build_backbone("cnn", (1, 8, 8))
    method = {f"backbone.{key}": value for key, value in backbone.state_dict().items()}
    method["head.weight"] = torch.ones(3, 3)  # the rest of the model: not the backbone's
    # nor are keys no classifier prefix covers: kept, they were "tensors it does not have"
    method["embedding.weight"] = torch.ones(8, 3)
    method["loss.proxies"] = torch.ones(4, 8)
    path = tmp_path / "last.pt"
    torch.save({"epoch": 1, "method": method, "optimizer": {}, "config": {"recipe": "jrd"}}, path)
    fresh = build_backbone("cnn", (1, 8, 8))
    load_weights(fresh, path, report=lambda line: None)
    assert all(torch.equal(fresh.state_dict()[key], value)
               for key, value in backbone.state_dict().items())


def test_weights_of_both_a_dataparallel_and_a_plain_copy_are_not_merged_silently(tmp_path):
    # "module.x" and "x" both become "x": the later one won, without a word
    state = _cnn_weights()
    merged = {**state, **{f"module.{key}": torch.zeros_like(value)
                          for key, value in state.items()}}
    path = tmp_path / "merged.pth"
    torch.save(merged, path)
    backbone = build_backbone("cnn", (1, 8, 8))
    try:
        load_weights(backbone, path, report=lambda line: None)
    except KdmlError:
        return  # refused: fine
    loaded = backbone.state_dict()
    assert all(torch.equal(loaded[key], state[key]) for key in state)


def _msimclr_bninception(weights: str):
    recipe = get_recipe("msimclr")
    return resolve_config("msimclr", recipe.params, recipe.defaults, overrides=[
        "model.backbone=bninception", "model.small_input=false", "data.dataset=digits",
        f"model.weights={weights}"])


def test_blanking_model_weights_of_a_simclr_run_does_not_silently_change_its_inputs(tmp_path):
    # model.weights may change before --resume, kdml eval and embed ("the checkpoint holds
    # the weights"), but the msimclr/simclr recipes pick the input normalisation from it:
    # BN-Inception's BGR 0-255 with weights, the identity without. A trained run whose
    # config.yaml had model.weights blanked was resumed and scored on other inputs, silently.
    trained = _msimclr_bninception(str(tmp_path / "bn_inception.pth"))
    now = _msimclr_bninception("")
    recipe = get_recipe("msimclr")
    before = recipe.build(trained, build_backbone("bninception", (3, 32, 32)), 5)
    after = recipe.build(now, build_backbone("bninception", (3, 32, 32)), 5)
    refused = bool(changed_settings(trained.to_dict(), now))
    assert refused or before.backbone.normalization == after.backbone.normalization


def test_a_weights_file_for_a_backbone_without_weights_says_the_backbone_takes_none(tmp_path):
    # pca and the DTML family use the identity backbone: any file was refused as "for another
    # model", which sends the user looking for another file
    path = tmp_path / "weights.pth"
    torch.save(_cnn_weights(), path)
    with pytest.raises(KdmlError) as refused:
        load_weights(build_backbone("identity", (1, 8, 8)), path, report=lambda line: None)
    assert "for another model" not in str(refused.value)
    # named as users name it (model.backbone=identity), not by kdml's class FlattenInputs
    assert "the backbone (identity) has no weights to load" in str(refused.value)


def test_a_sparse_tensor_in_a_weights_file_is_refused_in_one_line(tmp_path):
    state = _cnn_weights()
    state["layers.0.weight"] = state["layers.0.weight"].to_sparse()
    path = tmp_path / "sparse.pth"
    torch.save(state, path)
    with pytest.raises(KdmlError):
        load_weights(build_backbone("cnn", (1, 8, 8)), path, report=lambda line: None)


def test_a_run_records_which_weights_file_it_started_from_by_content(tmp_path, capsys):
    # only the path was recorded: a file replaced at that path (a re-download, a corrected
    # copy) left a grid's cells "finished earlier" with the old file's results, and a rerun of
    # the config trained from other weights without a word; data.json records data by content
    import hashlib

    from kdml import cli

    weights = tmp_path / "w.pth"
    torch.save(_cnn_weights(), weights)
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run),
                     "--weights", str(weights), "--no-progress", "train.epochs=1",
                     "train.steps_per_epoch=1", "eval.nmi=false", "model.embedding_size=8",
                     "train.device=cpu"]) == 0
    capsys.readouterr()
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    recorded = "".join(path.read_text(errors="replace") for path in run.iterdir()
                       if path.is_file())
    assert digest in recorded


class _RunsAShellCommand:
    def __reduce__(self):
        import os
        return (os.system, ("true",))


def test_a_pickle_with_a_blocked_global_is_named_as_such(tmp_path):
    """torch words an unsafe global two ways; "Trying to load unsupported GLOBAL posix.system
    whose module posix is blocked" was reported as "not a readable state dict ...; expected a
    .pth or .safetensors file", which it is."""
    path = tmp_path / "trainer.pth"
    torch.save({"state_dict": _cnn_weights(), "args": _RunsAShellCommand()}, path)
    with pytest.raises(KdmlError, match=r"holds a Python object besides tensors \(posix\.system"):
        load_weights(build_backbone("cnn", (1, 8, 8)), path, report=lambda line: None)


@pytest.mark.parametrize("dtype", [torch.int64, torch.complex64])
def test_weights_of_another_kind_than_the_model_s_are_refused(tmp_path, dtype):
    """Integer, boolean or complex tensors loaded into float weights (the imaginary part
    dropped, with torch's raw UserWarning)."""
    state = _cnn_weights()
    key = next(key for key in state if key.endswith("weight"))
    state[key] = state[key].to(dtype)
    path = tmp_path / "w.pth"
    torch.save(state, path)
    with pytest.raises(KdmlError, match=f"{key} holds torch.{str(dtype).split('.')[1]} values"):
        load_weights(build_backbone("cnn", (1, 8, 8)), path, report=lambda line: None)


class _MaskedNet(torch.nn.Module):
    """A parameter beside a buffer that is neither a parameter nor a BatchNorm statistic."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.register_buffer("mask", torch.zeros(2))


@pytest.mark.parametrize(("value", "refused"), [(float("nan"), True), (float("-inf"), False)])
def test_a_buffer_may_hold_infinity_as_a_mask_but_never_nan(tmp_path, value, refused):
    """NaN is damage wherever it is; infinity only in a parameter or a BatchNorm statistic (a
    buffer may hold -inf as a mask)."""
    state = _MaskedNet().state_dict()
    state["mask"] = torch.tensor([0.0, value])
    torch.save(state, tmp_path / "masked.pth")
    model = _MaskedNet()
    if refused:
        with pytest.raises(KdmlError, match=r"mask holds NaN or infinite values; the file is "
                                            r"damaged"):
            load_weights(model, tmp_path / "masked.pth", report=lambda line: None)
    else:
        load_weights(model, tmp_path / "masked.pth", report=lambda line: None)
        assert model.mask.tolist() == [0.0, float("-inf")]
