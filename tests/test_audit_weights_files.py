"""Weights files as a user brings them (--weights FILE), as an audit of that journey found
them misread: a safetensors file under a .pth name (or a .pth under a .safetensors one) was
"not a readable state dict ...; expected a .pth or .safetensors file", and a file of this
very backbone whose keys carry a wrapper's prefix (``backbone.``, Lightning's ``model.``) was
"for another model"."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from kdml.errors import KdmlError
from kdml.models.backbones import build_backbone
from kdml.models.weights import load_weights


def _cnn_weights() -> dict[str, torch.Tensor]:
    """A CNN's tensors, moved off its initialisation (so that a load that took nothing would
    not pass for one)."""
    backbone = build_backbone("cnn", (1, 8, 8))
    return {key: value + 0.5 if value.is_floating_point() else value.clone()
            for key, value in backbone.state_dict().items()}


def _loaded_into_a_new_cnn(path) -> torch.nn.Module:
    backbone = build_backbone("cnn", (1, 8, 8))
    load_weights(backbone, path, report=lambda line: None)
    return backbone


def test_a_safetensors_file_named_pth_loads(tmp_path):
    state = _cnn_weights()
    save_file(state, str(tmp_path / "weights.pth"))
    backbone = _loaded_into_a_new_cnn(tmp_path / "weights.pth")
    assert all(torch.equal(backbone.state_dict()[key], value) for key, value in state.items())


def test_a_pth_file_named_safetensors_loads(tmp_path):
    state = _cnn_weights()
    torch.save(state, tmp_path / "weights.safetensors")
    backbone = _loaded_into_a_new_cnn(tmp_path / "weights.safetensors")
    assert all(torch.equal(backbone.state_dict()[key], value) for key, value in state.items())


@pytest.mark.parametrize("prefix", ["backbone.", "model.", "encoder.layers."])
def test_a_file_whose_keys_carry_a_prefix_is_refused_naming_it(tmp_path, prefix):
    """Loading them as they are could be the wrong half of a bigger model: the refusal names
    the prefix to strip instead of calling the file another model's."""
    torch.save({f"{prefix}{key}": value for key, value in _cnn_weights().items()},
               tmp_path / "wrapped.pth")
    with pytest.raises(KdmlError) as refusal:
        _loaded_into_a_new_cnn(tmp_path / "wrapped.pth")
    message = str(refusal.value)
    assert f"its keys carry the prefix '{prefix}'" in message
    assert "another model" not in message and "\n" not in message
