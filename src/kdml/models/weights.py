"""Pretrained backbone weights from a local file (``--weights PATH`` / ``model.weights``).

kdml never downloads weights. A ``.pth``/``.pt`` file (a state dict, possibly under
``state_dict``, ``model`` or ``model_state_dict``, keys possibly prefixed ``module.``) or a
``.safetensors`` file (told apart by content, whatever the name) is loaded into the backbone
(for timm and torchvision backbones, into the library's own network, so their checkpoints
load as they are):

- classifier keys the backbone does not have (``last_linear``, ``fc``, ``classifier``,
  ``head``) are ignored, with a note;
- a backbone tensor the file lacks, or another tensor of the file, is refused in one line: the
  file is for another model (a ResNet-18 file in a ResNet-34 fits every shape it has); one
  holding every backbone tensor under another prefix (``backbone.``) is refused naming it;
- the first convolution ``model.small_input`` re-made (3x3) keeps its initialisation where the
  file's (an ImageNet 7x7) does not fit it, with a note;
- a first convolution trained on RGB loads into a 1-channel backbone by summing its input
  channels (as timm adapts pretrained stems for grayscale);
- BatchNorm tensors stored as ``[1, C]`` (some copies of the BN-Inception file) load as
  ``[C]``;
- any other shape mismatch is a one-line error.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kdml.errors import KdmlError, home_expanded, why_missing
from kdml.file_digest import file_sha256

CLASSIFIER_PREFIXES = ("last_linear.", "fc.", "classifier.", "head.", "heads.")
WHERE_TO_GET = ("kdml never downloads weights: for BN-Inception use the bn_inception-52deb4733.pth"
                " of Cadene's pretrainedmodels (or bn_inception-239d2248.pth), for timm and "
                "torchvision models the checkpoint files their model pages list; then pass the "
                "file's path")
# the class torch.load(weights_only=True) refused to unpickle, as its message names it
# (torch words it two ways: "Unsupported global: GLOBAL X", "unsupported GLOBAL X whose
# module Y is blocked")
UNSAFE_GLOBAL = re.compile(r"[Uu]nsupported (?:global: )?GLOBAL ([\w.]+)")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.pth``/``.pt`` or ``.safetensors`` file, keys without ``module.``."""
    if not path.is_file():
        raise KdmlError(f"weights file {path} {why_missing(path, 'file')}; {WHERE_TO_GET}")
    state: Any
    try:
        if _is_safetensors(path):  # by content: a renamed file keeps its format
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            # an open file, not the path: torch reads a path named .safetensors as one
            with warnings.catch_warnings(), path.open("rb") as file:
                # torch's own words on a TorchScript archive come before kdml's one line
                warnings.simplefilter("ignore", UserWarning)
                state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # torch and safetensors raise many types for a bad file
        refused = UNSAFE_GLOBAL.search(str(error))
        if refused:  # a training checkpoint with its script's objects (timm's args)
            raise KdmlError(
                f"weights file {path} holds a Python object besides tensors "
                f"({refused.group(1)}), which kdml does not unpickle, as unpickling can run "
                "code; where you trust the file, save its weights alone, e.g. torch.save("
                "checkpoint['state_dict'], 'weights.pth') (of a whole pickled model, "
                "model.state_dict()), and pass that file") from None
        raise KdmlError(f"weights file {path} is not a readable state dict "
                        f"({type(error).__name__}); expected a .pth or .safetensors file") from None
    # training checkpoints nest the weights (model_state_dict: PyTorch's tutorial's layout)
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if _is_kdml_checkpoint(state):  # fine-tuning from a kdml run: its backbone's weights
        state = _backbone_weights(state["method"])
        if not state:
            raise KdmlError(f"weights file {path} is a kdml run's checkpoint whose model has "
                            "no backbone weights (an identity backbone): there is nothing to "
                            "load")
    if not isinstance(state, dict) or not state or not all(
            isinstance(key, str) and isinstance(value, torch.Tensor)
            for key, value in state.items()):  # a state dict is named tensors
        keys = f" (its keys: {_few([str(key) for key in state], 5)})" if isinstance(
            state, dict) and state else ""
        raise KdmlError(f"weights file {path} holds no state dict of tensors{keys}")
    empty = [key for key, value in state.items() if value.is_meta]
    if empty:  # saved from a model on the meta device: shapes without values
        raise KdmlError(f"weights file {path} holds tensors without values ({empty[0]}, on "
                        "torch's meta device); save the weights of a model that holds them")
    sparse = [key for key, value in state.items() if value.layout != torch.strided]
    if sparse:  # the checks below (isnan) and load_state_dict raise torch's long errors
        raise KdmlError(f"weights file {path} holds a sparse tensor ({sparse[0]}); save the "
                        "weights dense (tensor.to_dense()) and pass that file")
    unprefixed = {key.removeprefix("module."): value for key, value in state.items()}
    if len(unprefixed) != len(state):  # both "module.X" and "X": one would silently win
        twice = sorted({key.removeprefix("module.") for key in state if key.startswith(
            "module.")} & {key for key in state if not key.startswith("module.")})
        raise KdmlError(f"weights file {path} holds two copies of {twice[0]} (with and without "
                        "DataParallel's 'module.' prefix); save one model's weights and pass "
                        "that file")
    return unprefixed


def _is_safetensors(path: Path) -> bool:
    """Whether ``path`` holds the safetensors format (an 8-byte header length, then the JSON
    header) rather than torch's zip or pickle: a file renamed from ``model.safetensors`` to
    ``.pth`` (or back) is read as what it is."""
    with path.open("rb") as file:
        start = file.read(9)
    return len(start) == 9 and start[8:] == b"{"


def _backbone_weights(method: dict[str, Any]) -> dict[str, Any]:
    """The backbone's tensors of a kdml run's model, without their ``backbone.`` prefix: a
    run with ``domain.beta > 0`` wraps its recipe's model (``DomainAdaptedMethod``), whose
    backbone is then under ``inner.backbone.``."""
    prefix = ("inner.backbone." if any(key.startswith("inner.backbone.") for key in method)
              else "backbone.")
    return {key.removeprefix(prefix): value for key, value in method.items()
            if key.startswith(prefix)}


def _is_kdml_checkpoint(state: object) -> bool:
    """Whether ``state`` is a kdml run's checkpoint (``checkpoints/last.pt``): the model's
    tensors under ``method``, beside the epoch and the optimiser's state."""
    return (isinstance(state, dict) and isinstance(state.get("method"), dict)
            and "epoch" in state and "optimizer" in state)


def load_weights(backbone: nn.Module, path: str | Path,
                 report: Callable[[str], None] = print) -> None:
    """Load ``path`` into ``backbone`` (see the module docstring); ``report`` gets one line."""
    path = home_expanded(path)
    weights_target = getattr(backbone, "weights_target", None)
    target: nn.Module = weights_target() if callable(weights_target) else backbone
    state = read_state_dict(path)
    file_keys = list(state)  # named in the refusal below: the classifier's are dropped next
    own = target.state_dict()
    if not own:  # the identity backbone (pca, the DTML family): any file would be refused
        name = getattr(target, "backbone_name", type(target).__name__)
        raise KdmlError(f"the backbone ({name}) has no weights to load, so "
                        f"model.weights ({path}) has nothing to set; drop it")
    ignored = sorted(key for key in state if key not in own and key.startswith(
        CLASSIFIER_PREFIXES))
    state = {key: value for key, value in state.items() if key not in ignored}
    rebuilt = set(getattr(backbone, "rebuilt_keys", ()))
    adapted, kept = [], []
    for key, value in list(state.items()):
        if key in own and value.shape != own[key].shape:
            if _is_rgb_to_gray_conv(value, own[key]):
                state[key] = value.sum(dim=1, keepdim=True)
                adapted.append(key)
                continue
            if own[key].ndim == 1 and value.numel() == own[key].numel() and value.ndim == 2:
                state[key] = value.reshape(own[key].shape)  # BatchNorm stored as [1, C]
                continue
            if key in rebuilt:  # model.small_input's 3x3 stem: a 7x7 ImageNet one cannot fit
                del state[key]
                kept.append(key)
                continue
            raise KdmlError(f"weights file {path}: {key} has shape {tuple(value.shape)} but the "
                            f"backbone expects {tuple(own[key].shape)}; it is for another model")
    missing = sorted(set(own) - set(state) - _num_batches_tracked(own) - set(kept))
    unexpected = sorted(set(state) - set(own))
    if not set(state) & set(own):
        _refuse_a_prefixed_copy(path, file_keys, own)
        what = ("holds only a classifier, which kdml never loads" if not state and file_keys
                else "is for another model")
        raise KdmlError(f"weights file {path} shares no key with the backbone (its first keys: "
                        f"{', '.join(file_keys[:3])}); it {what}")
    if missing or unexpected:
        # a neighbouring depth (ResNet-18's file in a ResNet-34) shares every shape: loading
        # what fits would train a half-pretrained network, as strict loading refuses to
        lacks = f"lacks {len(missing)} of its tensors ({_few(missing)})" if missing else ""
        extra = (f"holds {len(unexpected)} it does not have ({_few(unexpected)})"
                 if unexpected else "")
        raise KdmlError(f"weights file {path} {lacks}{' and ' if lacks and extra else ''}"
                        f"{extra}: it is for another model than the backbone; pass the file "
                        "of this very model")
    _check_finite(state, own, {name for name, _ in target.named_parameters()}, path)
    target.load_state_dict(state, strict=False)
    # the file by content too, as data.json records the data: a file replaced at the same
    # path (a corrected copy, a re-download) is then told apart in train.log
    notes = [f"loaded {len(set(state) & set(own))} tensors from {path} (SHA-256 "
             f"{file_sha256(path)})"]
    if kept:
        notes.append(f"kept the model.small_input stem as built ({_few(kept)})")
    if ignored:
        notes.append(f"ignored the classifier ({_few(ignored)})")
    if adapted:
        notes.append(f"summed RGB channels for 1-channel input ({_few(adapted)})")
    report("; ".join(notes))


def _refuse_a_prefixed_copy(path: Path, file_keys: list[str],
                            own: dict[str, torch.Tensor]) -> None:
    """Refuse a file holding every backbone tensor under one prefix (a wrapper's
    ``backbone.``, Lightning's ``model.``) by naming the prefix: stripping it silently could
    load one part of a bigger model whose other parts hold the same names."""
    needed = sorted(set(own) - _num_batches_tracked(own))
    if not needed:
        return
    probe, names = needed[0], set(file_keys)
    for key in file_keys:
        prefix = key.removesuffix(probe)
        if key.endswith("." + probe) and all(prefix + name in names for name in needed):
            raise KdmlError(
                f"weights file {path}: its keys carry the prefix '{prefix}' before the "
                f"backbone's names ({key} for {probe}); save the tensors under that prefix "
                f"without it, e.g. torch.save({{k.removeprefix('{prefix}'): v for k, v in "
                f"state.items() if k.startswith('{prefix}')}}, 'weights.pth'), and pass that "
                "file")


def _check_finite(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor],
                  parameters: set[str], path: Path) -> None:
    """Refuse a file whose weights hold NaN, a parameter or BatchNorm statistic infinity (a
    buffer may hold -inf as a mask), a negative BatchNorm variance, or values of another kind
    than the model's tensor (integers, booleans or complex numbers for float weights; the
    complex ones had lost their imaginary part with torch's raw warning): loaded, a damaged
    one stopped the first step with advice to lower the learning rates."""
    damaged = ("the file is damaged (or was saved from a run that diverged): pass a good copy")
    for key, value in state.items():
        if key in own and own[key].is_floating_point() and not value.is_floating_point():
            raise KdmlError(f"weights file {path}: {key} holds {value.dtype} values where the "
                            f"backbone's tensor is {own[key].dtype}; it is for another model, "
                            "or was saved wrongly")
        if not value.is_floating_point():
            continue
        statistic = key.endswith((".running_mean", ".running_var"))
        if value.isnan().any() or ((key in parameters or statistic)
                                   and not value.isfinite().all()):
            raise KdmlError(f"weights file {path}: {key} holds NaN or infinite values; {damaged}")
        if key.endswith(".running_var") and (value < 0).any():
            raise KdmlError(f"weights file {path}: {key}, a BatchNorm variance, holds negative "
                            f"values; {damaged}")


def _is_rgb_to_gray_conv(saved: torch.Tensor, own: torch.Tensor) -> bool:
    return (saved.ndim == own.ndim == 4 and saved.shape[1] == 3 and own.shape[1] == 1
            and saved.shape[0] == own.shape[0] and saved.shape[2:] == own.shape[2:])


def _num_batches_tracked(own: dict[str, torch.Tensor]) -> set[str]:
    """BatchNorm counters, absent from older checkpoints and irrelevant to the weights."""
    return {key for key in own if key.endswith("num_batches_tracked")}


def _few(keys: list[str], count: int = 3) -> str:
    return ", ".join(keys[:count]) + (", ..." if len(keys) > count else "")
