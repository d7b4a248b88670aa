"""The JRD family (Chu et al., ICML 2020): AM-Softmax plus a kernel regularizer over the
pooling, embedding and class-level representations of Eq. 9.

``L = L_AMS + alpha * R(representations, labels)`` where R is

- ``jrd``: JRS over [pool, emb, cls] (Eq. 10/11); ``mrd``: [emb]; ``jrd-c``: [pool, emb];
  ``jrd-pooling``: [emb, cls] (the variants of Table 2, named as in the paper);
- ``jmmd`` (Eq. 15) and ``jintra`` (Eq. 16), the baselines of Fig. 5 / Table 3;
- ``intra``: the explicit intra-class penalty of Eq. 4 (Fig. 2), on the embedding;
- ``amsoftmax``: no regularizer (alpha = 0).

The AM-Softmax loss (:func:`~kdml.losses.am_softmax_loss`, equal to PML's ``CosFaceLoss``)
takes its cosines from the head's class-level representation: one set of proxies for both.

The recipe-level defaults of the data, model, optim and train sections serve the offline
small-CNN demo (embedding 64, Adam 1e-3 with Adam's epsilon, no weight decay, 10 epochs). The
paper's settings (Sec. 5.1: BN-Inception with frozen BN statistics, embedding 512, Adam 1e-4 with
1e-2 for the proxies, decay by 10 every 20 epochs, 50 epochs) and those of the authors' code
where the paper is silent (Adam epsilon 0.01, weight decay 1e-4 also on the proxies, their
initialisation) are in configs/jrd-cub.yaml, jrd-cars.yaml and jrd-sop.yaml; docs/recipes.md
compares them setting by setting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn

from kdml.checks import (
    check_class_range,
    check_integer_labels,
    check_label_device,
    check_params,
    check_tensors,
    is_positive_int,
)
from kdml.config import OptimConfig, RunConfig, check_fields
from kdml.distributed import gather
from kdml.errors import KdmlError
from kdml.kernels import KERNELS, Kernel, build_kernel
from kdml.losses.am_softmax import am_softmax_loss
from kdml.models.backbones import feature_size_of, pooled_features
from kdml.models.heads import JRDHead
from kdml.models.method import Method, StepOutput, detached
from kdml.regularizers import (
    IntraClassPenalty,
    JointIntra,
    JointMMD,
    JointRepresentationSimilarity,
)
from kdml.regularizers.sharded import sharded_jrs
from kdml.seeding import StepRandom
from kdml.training.recipes.base import Recipe

LAYERS = ("pool", "emb", "cls")
CLS = LAYERS.index("cls")
PROXY_INITS = ("normal", "kaiming")
REGULARIZERS = {"jrs": JointRepresentationSimilarity, "jmmd": JointMMD, "jintra": JointIntra}


@dataclass
class AMSoftmaxParams:
    scale: float = 20.0  # s of Eq. 12 (Sec. 5.1)
    margin: float = 0.1  # m of Eq. 12 (0.1 for CUB and SOP, 0.05 for Cars)
    # Initial class proxies (the paper does not say): normal = N(0, 1) entries, as PML's
    # CosFaceLoss; kaiming = the authors' loss.py, kaiming_uniform_(a=sqrt(5)) on the [d, C]
    # matrix, i.e. U(-1/sqrt(C), 1/sqrt(C)). The proxies are normalised before use, but under
    # Adam their norm sets how fast their directions move: the authors' are ~17x shorter at
    # d = 512, C = 100. configs/jrd-*.yaml: kaiming
    proxy_init: str = "normal"
    # also apply optim.weight_decay to the proxies, as the authors' train.py (one Adam weight
    # decay for every parameter group; the paper names none). configs/jrd-*.yaml: true
    decay_proxies: bool = False

    def validate(self) -> None:
        check_fields(self)  # types, NaN and infinity, before the range checks compare
        if self.scale <= 0:
            raise KdmlError(f"method.scale must be positive, got {self.scale}")
        if not 0 <= self.margin < 1:
            raise KdmlError(f"method.margin must be in [0, 1), got {self.margin}")
        if self.proxy_init not in PROXY_INITS:
            raise KdmlError(f"method.proxy_init must be one of {', '.join(PROXY_INITS)}, "
                            f"got {self.proxy_init!r}")


@dataclass
class JRDParams(AMSoftmaxParams):
    alpha: float = 1.0  # weight of the regularizer (1 for Gaussian/Laplace kernels, Table 4)
    regularizer: str = "jrs"  # jrs | jmmd | jintra
    layers: list[str] = field(default_factory=lambda: list(LAYERS))
    # One kernel per layer: a name from kdml.kernels and, for Gaussian mixtures, K per layer
    # (K = 3 for pooling and embedding, K' = 1 for the class level; Fig. 6).
    pool_kernel: str = "gaussian"
    emb_kernel: str = "gaussian"
    cls_kernel: str = "gaussian"
    pool_num_kernels: int = 3
    emb_num_kernels: int = 3
    cls_num_kernels: int = 1
    kernel_multiplier: float = 2.0  # ratio of consecutive Gaussian bandwidths
    polynomial_degree: int = 2

    def validate(self) -> None:
        super().validate()
        if self.alpha < 0:
            raise KdmlError(f"method.alpha must be >= 0, got {self.alpha}")
        if self.regularizer not in REGULARIZERS:
            raise KdmlError(f"method.regularizer must be one of {', '.join(REGULARIZERS)}, "
                            f"got {self.regularizer!r}")
        unknown = [layer for layer in self.layers if layer not in LAYERS]
        if not self.layers or unknown or len(set(self.layers)) != len(self.layers):
            raise KdmlError(f"method.layers must be distinct names from {', '.join(LAYERS)}, "
                            f"got {self.layers}")
        for layer in LAYERS:
            name = getattr(self, f"{layer}_kernel")
            if name not in KERNELS or name == "imq":
                raise KdmlError(f"method.{layer}_kernel={name!r}; choose one of gaussian, "
                                "laplace, polynomial, mgf")
            if getattr(self, f"{layer}_num_kernels") < 1:
                raise KdmlError(f"method.{layer}_num_kernels must be at least 1")
        # checked here too, not only by the kernels, so that `kdml config` finds them and the
        # message names the setting
        if not self.kernel_multiplier > 0:
            raise KdmlError(f"method.kernel_multiplier must be positive (the ratio of "
                            f"consecutive Gaussian bandwidths), got {self.kernel_multiplier}")
        if self.polynomial_degree < 1:
            raise KdmlError(f"method.polynomial_degree must be at least 1, got "
                            f"{self.polynomial_degree}")
        for layer in self.layers:  # what the kernels refuse (bandwidths beyond float32's range)
            if getattr(self, f"{layer}_kernel") != "gaussian":
                continue
            try:
                self.kernel(layer)
            except KdmlError as err:
                raise KdmlError(f"method.{layer}_num_kernels="
                                f"{getattr(self, f'{layer}_num_kernels')} with "
                                f"method.kernel_multiplier={self.kernel_multiplier}: {err}"
                                ) from None

    def unread_settings(self, default: JRDParams) -> list[tuple[str, str]]:
        """The kernel settings given other values than ``default``'s that this regularizer
        never reads, each with why (for the trainer's warning): those of a layer that
        ``layers`` leaves out (MRD's pool and cls), a count of bandwidths of a kernel that
        has one, a multiplier without two Gaussian bandwidths, a degree without a polynomial
        kernel, and all of them, the regularizer and its layers too, with ``alpha`` 0."""
        def changed(name: str) -> bool:
            return bool(getattr(self, name) != getattr(default, name))

        kernel_settings = [f"{layer}_{what}" for layer in LAYERS
                           for what in ("kernel", "num_kernels")]
        kernel_settings += ["kernel_multiplier", "polynomial_degree"]
        if self.alpha == 0:
            return [(f"method.{name}", "method.alpha=0 adds no regularizer")
                    for name in ["regularizer", "layers", *kernel_settings] if changed(name)]
        unread = []
        for layer in LAYERS:
            if layer not in self.layers:
                unread += [(f"method.{layer}_{what}", f"method.layers={self.layers} leaves "
                            f"out {layer}") for what in ("kernel", "num_kernels")
                           if changed(f"{layer}_{what}")]
            elif (changed(f"{layer}_num_kernels")
                  and getattr(self, f"{layer}_kernel") != "gaussian"):
                unread.append((f"method.{layer}_num_kernels", f"the {layer} kernel, "
                               f"{getattr(self, f'{layer}_kernel')}, has no bandwidths to mix"))
        kernels = {layer: getattr(self, f"{layer}_kernel") for layer in self.layers}
        if changed("kernel_multiplier") and not any(
                kernel == "gaussian" and getattr(self, f"{layer}_num_kernels") > 1
                for layer, kernel in kernels.items()):
            unread.append(("method.kernel_multiplier", "no layer has a mixture of Gaussians "
                           "(a *_num_kernels above 1) whose bandwidths it spaces"))
        if changed("polynomial_degree") and "polynomial" not in kernels.values():
            unread.append(("method.polynomial_degree", "no layer's kernel is polynomial"))
        return unread

    def kernel(self, layer: str) -> Kernel:
        name = getattr(self, f"{layer}_kernel")
        if name == "gaussian":
            return build_kernel(name, num_kernels=getattr(self, f"{layer}_num_kernels"),
                                multiplier=self.kernel_multiplier)
        if name == "polynomial":
            return build_kernel(name, degree=self.polynomial_degree)
        return build_kernel(name)


@dataclass
class IntraParams(AMSoftmaxParams):
    # weight of the explicit intra-class penalty of Eq. 4; Fig. 2 sweeps it and names no one
    # value, so kdml takes JRS's (Table 4: 1), comparing the two regularizers at one weight
    alpha: float = 1.0

    def validate(self) -> None:
        super().validate()
        if self.alpha < 0:
            raise KdmlError(f"method.alpha must be >= 0, got {self.alpha}")


def _drop_pml_proxy_copy(state_dict: dict, prefix: str, *args: object) -> None:
    state_dict.pop(f"{prefix}am_softmax.W", None)


class JRDMethod(Method):
    """Backbone -> :class:`~kdml.models.JRDHead` -> AM-Softmax + alpha * regularizer.

    Args:
        backbone: a module with ``feature_size``.
        embedding_size: d.
        num_classes: C, the number of training classes.
        params: AM-Softmax scale and margin, the proxies' initialisation and weight decay
            (``proxy_init``, ``decay_proxies``), and alpha when there is a regularizer (0:
            AM-Softmax alone, the regularizer not computed).
        regularizer: called as ``regularizer(representations, labels)``, or ``None``.
        layers: which of ``pool``, ``emb``, ``cls`` the regularizer sees, in order.
        sharded: under torchrun, compute JRS from this rank's kernel rows
            (:func:`~kdml.regularizers.sharded.sharded_jrs`) instead of the gathered batch.

    Under torchrun both terms see the global batch (:func:`kdml.distributed.gather`).
    """

    def __init__(self, backbone: nn.Module, embedding_size: int, num_classes: int,
                 params: AMSoftmaxParams, regularizer: nn.Module | None = None,
                 layers: tuple[str, ...] = (), sharded: bool = False) -> None:
        # built from a config it is checked already; directly, here
        check_params("JRDMethod", params, AMSoftmaxParams)
        for name, value in (("embedding_size", embedding_size), ("num_classes", num_classes)):
            if not is_positive_int(value):
                raise KdmlError(f"JRDMethod: {name} must be a positive integer, got {value!r}")
        if isinstance(layers, str) or any(layer not in LAYERS for layer in layers):
            raise KdmlError(f"layers must be a sequence of {', '.join(LAYERS)}, got {layers!r}")
        if regularizer is not None and not layers:
            raise KdmlError("a regularizer needs the layers it sees, e.g. layers=('pool', 'emb', "
                            "'cls')")
        if regularizer is not None and not hasattr(params, "alpha"):
            raise KdmlError(f"a regularizer needs its weight alpha: pass JRDParams (or "
                            f"IntraParams), not {type(params).__name__}")
        if regularizer is None and isinstance(params, JRDParams) and params.alpha > 0:
            raise KdmlError(f"JRDParams name a regularizer ({params.regularizer} over "
                            f"{', '.join(params.layers)}) that JRDMethod does not build: use "
                            "JRDMethod.from_params(backbone, embedding_size, num_classes, "
                            "params), or AMSoftmaxParams for AM-Softmax alone")
        super().__init__()
        self.backbone = backbone
        self.num_classes = int(num_classes)
        self.head = JRDHead(feature_size_of(backbone), int(embedding_size), self.num_classes)
        if params.proxy_init == "kaiming":  # the authors' CosineSoftmax.fc (loss.py)
            nn.init.kaiming_uniform_(self.head.proxies, a=math.sqrt(5))
        self.decay_proxies = params.decay_proxies
        self.scale, self.margin = params.scale, params.margin
        # Checkpoints from when the loss was PML's CosFaceLoss hold the proxies twice, also
        # as its W; drop that copy so that those runs still resume.
        self._register_load_state_dict_pre_hook(_drop_pml_proxy_copy)
        self.regularizer = regularizer
        self.layer_indices = [LAYERS.index(layer) for layer in layers]
        self.alpha = getattr(params, "alpha", 0.0)
        if sharded and not isinstance(regularizer, JointRepresentationSimilarity):
            raise KdmlError("train.sharded_kernels applies to the JRS regularizer only")
        self.sharded = sharded

    @property
    def batch_needs(self) -> tuple[int, int, str]:
        if self.regularizer is None or self.alpha == 0:
            return 1, 1, ""
        if isinstance(self.regularizer, IntraClassPenalty):  # pairs within each class
            return 2, 1, "intra-class penalty (pairs of samples of one class)"
        # JRS, JMMD and JIntra average over pairs of different classes
        return 1, 2, f"{type(self.regularizer).__name__} (pairs of different classes)"

    @classmethod
    def from_params(cls, backbone: nn.Module, embedding_size: int, num_classes: int,
                    params: JRDParams, sharded: bool = False) -> JRDMethod:
        """JRD or the variant ``params`` names: its regularizer (``jrs``, ``jmmd``, ``jintra``)
        over its layers, one kernel per layer, as the recipes build it.

        Example:
            >>> from torch import nn
            >>> backbone = nn.Sequential(nn.Flatten(), nn.Linear(16, 8))
            >>> backbone.feature_size = 8
            >>> method = JRDMethod.from_params(backbone, 4, 3, JRDParams(layers=["emb", "cls"]))
            >>> type(method.regularizer).__name__, method.layer_indices
            ('JointRepresentationSimilarity', [1, 2])
        """
        check_params("JRDMethod.from_params", params, JRDParams)
        kernels = [params.kernel(layer) for layer in params.layers]
        return cls(backbone, embedding_size, num_classes, params,
                   REGULARIZERS[params.regularizer](kernels), tuple(params.layers),
                   sharded=sharded)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor,
                target_inputs: torch.Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        self._check_labels(inputs, labels)
        representations = self.head(pooled_features(self.backbone, inputs))
        all_labels = gather(labels)
        all_cosines = gather(representations.class_level)
        am_softmax = am_softmax_loss(all_cosines, all_labels, self.scale, self.margin)
        if self.regularizer is None or self.alpha == 0:
            # alpha = 0 is AM-Softmax alone: the regularizer is not computed, as 0 * an
            # overflowing kernel's inf was NaN (the loss's and every gradient's)
            return StepOutput(am_softmax, detached(loss=am_softmax), representations.embedding)
        chosen = [representations[index] for index in self.layer_indices]
        if self.sharded:
            # __init__ checked that a sharded regularizer is JRS, which holds its kernels
            kernels = cast(Sequence[Kernel], self.regularizer.kernels)
            regularizer = sharded_jrs(kernels, chosen, labels)
        else:
            regularizer = self.regularizer(
                [all_cosines if index == CLS else gather(layer)
                 for index, layer in zip(self.layer_indices, chosen, strict=True)], all_labels)
        loss = am_softmax + self.alpha * regularizer
        terms = detached(loss=loss, am_softmax=am_softmax, regularizer=regularizer)
        return StepOutput(loss, terms, representations.embedding)

    def _check_labels(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Refuse, in one line, labels that are not one integer class index in
        ``[0, num_classes)`` per input, on the inputs' device. Used outside the trainer (a PML
        loop), wrong ones used to fail inside the AM-Softmax loss (a device-side assert on a
        GPU). Shapes, dtypes and devices; the range is read on the CPU only (on a GPU: an
        asynchronous assert, see :func:`~kdml.checks.check_class_range`), so no host sync."""
        check_tensors("JRDMethod", labels, [inputs], "inputs")
        check_integer_labels("JRDMethod", labels)
        check_label_device("JRDMethod", labels, [inputs], "inputs", "inputs")
        if inputs.ndim == 0 or labels.shape != inputs.shape[:1]:
            raise KdmlError(f"JRDMethod needs one label per input, labels [B] for inputs "
                            f"[B, ...], got labels {tuple(labels.shape)} for inputs "
                            f"{tuple(inputs.shape)}")
        check_class_range("JRDMethod", labels, self.num_classes,
                          f"as it was built with num_classes={self.num_classes}")

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(pooled_features(self.backbone, inputs)).embedding

    def proxy_parameters(self) -> list[nn.Parameter]:
        return [self.head.proxies]

    def param_groups(self, optim: OptimConfig) -> list[dict]:
        """The three groups of :meth:`Method.param_groups`; with ``method.decay_proxies`` the
        proxies' group gets ``optim.weight_decay`` too (the authors' code)."""
        groups = super().param_groups(optim)
        if self.decay_proxies:
            proxies = {id(p) for p in self.proxy_parameters()}
            for group in groups:
                if group["params"] and all(id(p) in proxies for p in group["params"]):
                    group["weight_decay"] = optim.weight_decay
        return groups


def _build_amsoftmax(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    return JRDMethod(backbone, config.model.embedding_size, num_classes, config.method)


def _build_intra(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    return JRDMethod(backbone, config.model.embedding_size, num_classes, config.method,
                     IntraClassPenalty(), ("emb",))


def _build_joint(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    return JRDMethod.from_params(backbone, config.model.embedding_size, num_classes,
                                 config.method, sharded=config.train.sharded_kernels)


def _joint_recipe(name: str, summary: str, layers: list[str], regularizer: str = "jrs",
                  alpha: float | None = None) -> Recipe:
    method: dict[str, object] = {"layers": layers, "regularizer": regularizer}
    if alpha is not None:
        method["alpha"] = alpha
    return Recipe(name, summary, JRDParams, _build_joint, {"method": method})


RECIPES = (
    _joint_recipe("jrd", "JRD: AM-Softmax + JRS over pooling, embedding and class level",
                  ["pool", "emb", "cls"]),
    _joint_recipe("mrd", "MRD: JRS over the embedding only", ["emb"]),
    _joint_recipe("jrd-c", "JRD-C: JRS over pooling and embedding", ["pool", "emb"]),
    _joint_recipe("jrd-pooling", "JRD-Pooling: JRS over embedding and class level",
                  ["emb", "cls"]),
    # alpha = 0.1: the one weight the paper reports JMMD at (Table 3, from the sweep of Fig. 5);
    # JIntra has none, so it keeps JRD's alpha = 1.
    _joint_recipe("jmmd", "JMMD baseline (Eq. 15) on the joint kernel", ["pool", "emb", "cls"],
                  "jmmd", alpha=0.1),
    _joint_recipe("jintra", "JIntra baseline (Eq. 16) on the joint kernel",
                  ["pool", "emb", "cls"], "jintra"),
    Recipe("intra", "AM-Softmax + explicit intra-class penalty (Eq. 4)", IntraParams,
           _build_intra),
    Recipe("amsoftmax", "AM-Softmax (CosFace) baseline: JRD with alpha = 0", AMSoftmaxParams,
           _build_amsoftmax),
)
