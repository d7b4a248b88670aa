"""What a run's model takes, recorded in its ``data.json`` so that the run folder alone (config,
checkpoint, ``data.json``) rebuilds the model: ``kdml search`` embeds image and raw-input
queries, and ``kdml eval/embed/index --dataset D`` embed another dataset, on a machine without
the data the run trained on, as timm or torchvision rebuild a model from its name and weights.

The record is everything the model's construction and the queries' checks read of the training
data: the shape of a sample, whether samples are decoded from files, whether they are images a
decoded file matches, the float dtype the model takes, the backbone ``model.backbone=auto``
resolved to, and the number of training classes (the size of a classifier's proxies).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch

from kdml.data.dataset import ArrayDataset, DmlDataset
from kdml.errors import KdmlError

# data.json's field holding the record (a run of a kdml before it has none: its data rebuilds
# the model, as before)
FIELD = "model_input"
FLOAT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                "float32": torch.float32, "float64": torch.float64}


class Samples(Protocol):
    """What building a backbone and an input pipeline read of the training samples: a
    :class:`~kdml.data.dataset.DmlDataset`, or a :class:`SampleSpec` standing for one."""

    @property
    def sample_shape(self) -> tuple[int, ...]: ...

    @property
    def is_file_backed(self) -> bool: ...

    @property
    def default_backbone(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class SampleSpec:
    """A run's training samples as its model sees them, without the samples.

    Attributes:
        sample_shape: one sample as the loader yields it, e.g. ``(1, 28, 28)``, ``(3, 256,
            256)`` (file-decoded images: before the crop to ``data.image_size``), ``(64,)``.
        is_file_backed: samples decoded from image files (``data.resize``, then the crop).
        holds_pixels: in-memory grey or RGB images a decoded image file matches (uint8, or
            float in [0, 1]); False for features, and for file-backed images.
        float_dtype: the float dtype the model takes (``"float32"`` for uint8 images).
        default_backbone: the backbone ``model.backbone=auto`` resolves to.
        train_classes: the number of training classes.
    """

    sample_shape: tuple[int, ...]
    is_file_backed: bool
    holds_pixels: bool
    float_dtype: str
    default_backbone: str
    train_classes: int

    @classmethod
    def of(cls, train: DmlDataset, train_classes: int) -> SampleSpec:
        """The record of a training part ``train`` of ``train_classes`` classes."""
        return cls(tuple(train.sample_shape), train.is_file_backed, holds_pixels(train),
                   str(float_dtype(train)).removeprefix("torch."), train.default_backbone,
                   train_classes)

    @property
    def dtype(self) -> torch.dtype:
        return FLOAT_DTYPES[self.float_dtype]

    def to_record(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "sample_shape": list(self.sample_shape)}

    @classmethod
    def from_record(cls, recorded: dict[str, Any], where: str) -> SampleSpec | None:
        """The record in ``recorded`` (a ``data.json``'s content, read from ``where``), or
        None where it has none (a run of a kdml before the record); one line where it is
        not kdml's whole record."""
        value = recorded.get(FIELD)
        if value is None:
            return None
        fields = {field.name for field in dataclasses.fields(cls)}
        if not isinstance(value, dict) or set(value) != fields:
            raise _damaged(where, f"its {FIELD} is not kdml's record of the fields "
                           f"{', '.join(sorted(fields))}")
        shape = value["sample_shape"]
        if not (isinstance(shape, list) and shape and all(
                isinstance(size, int) and not isinstance(size, bool) and size > 0
                for size in shape)):
            raise _damaged(where, f"{FIELD}.sample_shape is {shape!r}, not a list of sizes")
        for name in ("is_file_backed", "holds_pixels"):
            if not isinstance(value[name], bool):
                raise _damaged(where, f"{FIELD}.{name} is {value[name]!r}, not true or false")
        if value["float_dtype"] not in FLOAT_DTYPES:
            raise _damaged(where, f"{FIELD}.float_dtype is {value['float_dtype']!r}, not one "
                            f"of {', '.join(FLOAT_DTYPES)}")
        if not (isinstance(value["default_backbone"], str) and value["default_backbone"]):
            raise _damaged(where, f"{FIELD}.default_backbone is {value['default_backbone']!r}")
        classes = value["train_classes"]
        if not (isinstance(classes, int) and not isinstance(classes, bool) and classes > 0):
            raise _damaged(where, f"{FIELD}.train_classes is {classes!r}, not a count")
        return cls(**{**value, "sample_shape": tuple(shape)})


def _damaged(where: str, why: str) -> KdmlError:
    return KdmlError(f"{where} is damaged ({why}); restore it from a copy, or delete its "
                    f"{FIELD!r} field to rebuild the model from the run's data")


def holds_pixels(dataset: DmlDataset) -> bool:
    """Whether in-memory samples are grey or RGB images that a decoded file matches: uint8, or
    float in [0, 1] (features shaped like images, e.g. standardised, are not)."""
    if not (isinstance(dataset, ArrayDataset) and dataset.is_image
            and dataset.sample_shape[0] in (1, 3)):
        return False
    x = dataset.x
    return x.dtype == torch.uint8 or bool(x.min() >= 0 and x.max() <= 1)


def float_dtype(dataset: DmlDataset) -> torch.dtype:
    """The float dtype the model takes: that of float samples in memory, else float32 (what
    the pipeline makes of uint8 images)."""
    if isinstance(dataset, ArrayDataset) and dataset.x.is_floating_point():
        return dataset.x.dtype
    return torch.float32
