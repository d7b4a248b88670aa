r"""The DTML family (Hu, Lu & Tan, CVPR 2015): transfer metric learning on vectors.

- ``dtml``: marginal Fisher criterion + beta * domain MMD on the top layer, gamma weight decay
  (Eq. 7); paper defaults alpha = 0.1, beta = 10, gamma = 0.1, k1 = 5, k2 = 10, tanh;
- ``dstml``: DTML plus the hinged criterion on the hidden layers (omega = 1, tau = 0);
- ``ddml``: the no-transfer baseline, DTML with beta = 0 (the paper's "DTML, beta = 0" row);
- ``ddml-logistic``: the original DDML of Hu, Lu & Tan (CVPR 2014), the DTML paper's "DDML" row:
  the pairwise generalized logistic loss on the same network, trained on the source only;
- ``pca``: the Euclidean baseline, PCA fitted on the source, nothing trained.

DTML's network *is* the model: these recipes default to the ``identity`` backbone (flattened
inputs, no learned layers) and size a :class:`~kdml.models.dtml.DTMLNetwork` by its
``feature_size``, the input size of the data.

:class:`~kdml.training.domain_adapted.DomainAdaptedMethod` adds the same domain MMD to any
other recipe's method.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from kdml.checks import check_params
from kdml.config import OptimConfig, RunConfig, check_fields
from kdml.distributed import gather
from kdml.errors import KdmlError
from kdml.kernels import FLOAT32_SETTING_RANGE, GaussianMixtureKernel
from kdml.losses.dtml_objective import DTMLObjective
from kdml.losses.pairwise_logistic import PairwiseLogisticLoss
from kdml.models.backbones import feature_size_of
from kdml.models.dtml import ACTIVATIONS, INITS, DTMLNetwork
from kdml.models.method import Method, StepOutput, detached
from kdml.regularizers.domain import DomainMMD
from kdml.seeding import StepRandom
from kdml.training.recipes.base import Recipe

MMD_KERNELS = ("linear", "gaussian")

_log = logging.getLogger(__name__)


@dataclass
class NetworkParams:
    """The :class:`~kdml.models.dtml.DTMLNetwork` settings shared by the DTML family."""

    # p^(1)..p^(M), the widths after the input (its width is added: the paper's face network,
    # 500-400-300 on 500-d input, is [400, 300]); empty = [d, d // 2]: two layers, the layout
    # of the paper's re-id network (200-200-100) scaled to the input.
    layer_sizes: list[int] = field(default_factory=list)
    activation: str = "tanh"
    init: str = "identity"  # ones on the diagonal, zero bias (the authors'); or "standard"

    def validate(self) -> None:
        check_fields(self)  # types, NaN and infinity, before the range checks compare
        if any(size < 1 for size in self.layer_sizes):
            raise KdmlError(f"method.layer_sizes must be positive, got {self.layer_sizes}")
        if self.activation not in ACTIVATIONS:
            raise KdmlError(f"method.activation must be one of {', '.join(ACTIVATIONS)}, "
                            f"got {self.activation!r}")
        if self.init not in INITS:
            raise KdmlError(f"method.init must be one of {', '.join(INITS)}, got {self.init!r}")

    def network_sizes(self, input_size: int) -> list[int]:
        """:math:`[d, p^{(1)}, \\dots, p^{(M)}]` for inputs of size :math:`d`."""
        hidden = self.layer_sizes or [input_size, max(1, input_size // 2)]
        return [input_size, *hidden]

    def network(self, input_size: int, memory: int | None = None) -> DTMLNetwork:
        """The network for inputs of ``input_size`` features, refused in one line where its
        float32 weights alone would exceed half of ``memory`` (the machine's by default):
        ddml-logistic on image files fed whole (3 x 224 x 224 = 150,528 features, a first
        layer of d x d) had failed as "out of memory (tried to allocate 84.4 GiB); lower
        data.batch_size", which does not size it."""
        sizes = self.network_sizes(input_size)
        needed = NETWORK_BYTES_PER_WEIGHT * sum(
            (inputs + 1) * outputs for inputs, outputs in itertools.pairwise(sizes))
        if _over_half(needed, memory):
            raise KdmlError(f"a network of layer sizes {sizes} would hold "
                            f"{needed / 2**30:,.1f} GiB of weights, more than half the "
                            "machine's memory; DTML's networks are for feature vectors: train "
                            "on a domain pair or npz features, give image files a much smaller "
                            "data.resize and data.image_size, or set method.layer_sizes")
        return DTMLNetwork(sizes, self.activation, self.init)


@dataclass
class DTMLParams(NetworkParams):
    alpha: float = 0.1  # weight of the inter-class separability S_b
    beta: float = 10.0  # weight of the domain discrepancy D_ts
    gamma: float = 0.1  # weight decay inside the objective (keep optim.weight_decay at 0)
    k1: int = 5  # same-class neighbours (3 for re-id in the paper)
    k2: int = 10  # different-class neighbours
    mmd_kernel: str = "linear"  # linear = Eq. 6; gaussian = multi-kernel MMD (self-adaptive)
    mmd_num_kernels: int = 3  # Gaussians in the mixture when mmd_kernel = gaussian
    omega: float = 0.0  # DSTML weight of every hidden layer's hinge; 0 = DTML
    tau: float = 0.0  # DSTML threshold of the hinge

    def validate(self) -> None:
        super().validate()
        for name in ("alpha", "beta", "gamma", "omega"):
            if getattr(self, name) < 0:
                raise KdmlError(f"method.{name} must be >= 0, got {getattr(self, name)}")
        if self.k1 < 1 or self.k2 < 1:
            raise KdmlError(f"method.k1 and method.k2 must be >= 1, got {self.k1}, {self.k2}")
        if self.mmd_kernel not in MMD_KERNELS:
            raise KdmlError(f"method.mmd_kernel must be one of {', '.join(MMD_KERNELS)}, "
                            f"got {self.mmd_kernel!r}")
        if self.mmd_num_kernels < 1:
            raise KdmlError("method.mmd_num_kernels must be at least 1")

    def unread_settings(self, default: DTMLParams) -> list[tuple[str, str]]:
        """The settings given other values than ``default``'s that this objective never
        reads, each with why (for the trainer's warning): the MMD's kernel settings without
        a domain term (which measure only the logged train/d_ts), its count of kernels with
        the linear MMD, and the hinge's threshold without the hinge."""
        def changed(name: str) -> bool:
            return bool(getattr(self, name) != getattr(default, name))

        unread = []
        # at beta = 0 the objective still measures D_ts with the kernel, for train/d_ts alone:
        # said, as comparing ddml's train/d_ts with a Gaussian dtml's needs the same kernel
        logged_only = ("method.beta=0 adds no domain term to the loss (it changes only the "
                       "logged train/d_ts)")
        if self.beta == 0 and changed("mmd_kernel"):
            unread.append(("method.mmd_kernel", logged_only))
        if changed("mmd_num_kernels") and self.mmd_kernel != "gaussian":
            unread.append(("method.mmd_num_kernels", f"method.mmd_kernel={self.mmd_kernel} is "
                           "one kernel (mmd_kernel=gaussian mixes several)"))
        elif changed("mmd_num_kernels") and self.beta == 0:
            unread.append(("method.mmd_num_kernels", logged_only))
        if changed("tau") and self.omega == 0:
            unread.append(("method.tau", "method.omega=0 adds no hinge on the hidden layers"))
        return unread

    def domain_mmd(self) -> DomainMMD:
        if self.mmd_kernel == "gaussian":
            return DomainMMD(GaussianMixtureKernel(num_kernels=self.mmd_num_kernels))
        return DomainMMD()


@dataclass
class DDMLLogisticParams(NetworkParams):
    """DDML (Hu, Lu & Tan, CVPR 2014). The paper's text was not at hand when this was written:
    the objective is the paper's as quoted by later work; the values below could not be checked
    against its experiment section (see the comments)."""

    # tau: positive pairs pushed below tau - 1, negative pairs above tau + 1. 3 is the
    # value we recall from the paper's face experiments: NOT confirmed against its text. With
    # tanh outputs d2 <= 4 p^(M), so tau must be set relative to the top layer's size.
    threshold: float = 3.0
    # beta of g(z) = log(1 + exp(beta z)) / beta (named so as not to clash with DTML's domain
    # weight `beta`). 2 is recalled, NOT confirmed against the paper's text.
    sharpness: float = 2.0
    # lambda of lambda/2 * sum_m ||W||_F^2 + ||b||^2, *inside* the objective (DTML's gamma
    # mechanism; keep optim.weight_decay at 0). 1e-2 is recalled, NOT confirmed. The data term
    # is the mean over pairs, so this is its weight against one pair's loss, as in the paper's
    # per-pair stochastic gradient steps.
    weight_decay: float = 1e-2
    # The paper's learning rate (mu, plain SGD over single pairs) is not set here: like the
    # other DTML recipes this one uses the trainer's optimiser (optim.*).

    def validate(self) -> None:
        super().validate()  # types, NaN and infinity first (check_fields): the threshold too
        if not self.sharpness > 0:
            raise KdmlError(f"method.sharpness (DDML's beta) must be > 0, got {self.sharpness}")
        low, high = FLOAT32_SETTING_RANGE  # as the loss checks it, named as the setting here
        if not low <= self.sharpness <= high:
            raise KdmlError(f"method.sharpness (DDML's beta) must be in [{low:.3g}, {high:.3g}] "
                            f"(it and its reciprocal normal float32 numbers), got "
                            f"{self.sharpness}")
        if not self.weight_decay >= 0:
            raise KdmlError(f"method.weight_decay (DDML's lambda) must be >= 0, got "
                            f"{self.weight_decay}")


@dataclass
class PCAParams:
    pca_dim: int = 0  # output size; 0 = d (all components: plain Euclidean distance)

    def validate(self) -> None:
        check_fields(self)  # types before the range check compares
        if self.pca_dim < 0:
            raise KdmlError(f"method.pca_dim must be >= 0 (0 = all components), "
                            f"got {self.pca_dim}")


class DTMLMethod(Method):
    r""":class:`~kdml.models.dtml.DTMLNetwork` trained with the DTML / DSTML objective.

    ``forward(inputs, labels, target_inputs)`` runs the labelled source batch and the
    unlabelled target batch through the network and returns
    :class:`~kdml.losses.dtml_objective.DTMLObjective`'s total; the embedding is the top layer.
    ``uses_target`` is True for the whole family: with ``beta = 0`` (DDML) the target batch is
    not trained on but :math:`D_{ts}` is still logged, to compare the discrepancies.

    Args:
        params: :class:`DTMLParams`.
        input_size: :math:`d`, the size of the (flattened) inputs.
    """

    uses_target = True
    backbone: DTMLNetwork

    def __init__(self, params: DTMLParams, input_size: int) -> None:
        # built from a config it is checked already; directly, here
        check_params("DTMLMethod", params, DTMLParams)
        super().__init__()
        # the network is the whole model; named `backbone` as the Method interface expects
        self.backbone = params.network(input_size)
        self.objective = DTMLObjective(params.alpha, params.beta, params.gamma, params.k1,
                                       params.k2, params.domain_mmd(), params.omega, params.tau)

    @property
    def batch_needs(self) -> tuple[int, int, str]:
        # S_c sums over pairs of one class, S_b (weighed by alpha) over pairs of different
        # classes: one sample a class, or one class a batch, leaves one of them 0 at every step
        if self.objective.fisher.alpha == 0:
            return 2, 1, "marginal Fisher compactness S_c (pairs of one class)"
        return 2, 2, ("marginal Fisher criterion (S_c: pairs of one class, S_b: pairs of "
                      "different classes)")

    def forward(self, inputs: Tensor, labels: Tensor, target_inputs: Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        source_layers = self.backbone(inputs)
        target_layers = None if target_inputs is None else [
            gather(layer) for layer in self.backbone(target_inputs)]
        # the global batch under torchrun: neighbour graphs and MMD over every rank's samples
        total, terms = self.objective([gather(layer) for layer in source_layers], gather(labels),
                                      target_layers, self.backbone)
        return StepOutput(total, detached(loss=total, **terms), source_layers[-1])

    def embed(self, inputs: Tensor) -> Tensor:
        return self.backbone(inputs)[-1]


class DDMLLogisticMethod(Method):
    r"""DDML (Hu, Lu & Tan, CVPR 2014): a :class:`~kdml.models.dtml.DTMLNetwork` trained with
    the pairwise generalized logistic loss, the DTML paper's "DDML" row.

    .. math::
        J = \frac{1}{P} \sum_{i < j} g\left(1 - l_{ij} (\tau - d^2_{ij})\right)
            + \frac{\lambda}{2} \sum_m \left(\|W^{(m)}\|_F^2 + \|b^{(m)}\|_2^2\right)

    over the :math:`P = N (N - 1) / 2` pairs of the batch
    (:func:`~kdml.losses.pairwise_logistic.pairwise_logistic_loss`, which explains the pairs
    and the mean), on the top layer's outputs. Under torchrun the loss sees the global batch:
    the embeddings and labels are gathered (with the gradient) as in :class:`DTMLMethod`, and
    the weight penalty, the same on every rank, gets DDP's average of identical gradients.

    It trains on the labelled source only (``uses_target = False``): on a domain pair the
    target is only evaluated on, and no :math:`D_{ts}` is computed. ``domain.beta`` adds the
    domain MMD to it as to any recipe.

    Args:
        params: :class:`DDMLLogisticParams`.
        input_size: :math:`d`, the size of the (flattened) inputs.
    """

    backbone: DTMLNetwork

    def __init__(self, params: DDMLLogisticParams, input_size: int) -> None:
        check_params("DDMLLogisticMethod", params, DDMLLogisticParams)
        super().__init__()
        self.backbone = params.network(input_size)
        self.loss = PairwiseLogisticLoss(params.threshold, params.sharpness)
        self.weight_decay = float(params.weight_decay)

    @property
    def batch_needs(self) -> tuple[int, int, str]:
        # similar pairs (l = 1) pull together, dissimilar ones (l = -1) push apart: one sample
        # a class, or one class a batch, leaves the loss one kind of pair at every step
        return 2, 2, ("pairwise logistic loss (similar pairs: of one class, dissimilar pairs: "
                      "of different classes)")

    def forward(self, inputs: Tensor, labels: Tensor, target_inputs: Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        embeddings = self.embed(inputs)
        # the global batch under torchrun: every pair across the ranks' samples
        pair_loss = self.loss(gather(embeddings), gather(labels))
        total, terms = pair_loss, {"pair_loss": pair_loss}
        if self.weight_decay > 0:
            penalty = self.backbone.weight_penalty()
            total = total + 0.5 * self.weight_decay * penalty
            terms["weight_penalty"] = penalty
        return StepOutput(total, detached(loss=total, **terms), embeddings)

    def embed(self, inputs: Tensor) -> Tensor:
        return self.backbone(inputs)[-1]


class PCAMethod(Method):
    r"""The Euclidean baseline: :math:`f(x) = V^\top (x - \mu)` with the PCA of the source.

    Nothing is trained: the method has no parameters, only buffers (the source mean
    :math:`\mu` and the top ``dim`` principal directions :math:`V`, saved in checkpoints), and
    ``needs_fit = True`` tells a trainer to call :meth:`fit` once on the source inputs
    instead of running an optimiser. ``forward`` returns a constant zero loss (no gradient) and
    the embeddings, so code that logs a forward pass still works; calling ``backward`` on it is
    an error.

    Args:
        input_size: :math:`d`.
        dim: output size (1..d); ``d`` keeps every component, i.e. the plain Euclidean distance.
    """

    needs_fit = True

    def __init__(self, input_size: int, dim: int) -> None:
        super().__init__()
        if not 1 <= dim <= input_size:
            raise KdmlError(f"PCA dim must be from 1 to input_size={input_size}, got {dim}")
        # only the buffers below: a trained run loaded for eval (load_run) is not fitted, and
        # fit() checks its own, larger matrices (check_fit)
        check_pca_buffers(input_size, dim)
        self.backbone = nn.Identity()
        self.mean: Tensor
        self.components: Tensor
        self.fitted: Tensor
        self.register_buffer("mean", torch.zeros(input_size))
        self.register_buffer("components", torch.zeros(dim, input_size))
        self.register_buffer("fitted", torch.tensor(False))

    @torch.no_grad()
    def fit(self, batches: Iterable[Tensor] | Tensor) -> None:
        """Fit the mean and principal directions on the source inputs, given as one tensor
        [Ns, d] or batch by batch.

        The batches are reduced to the sum and the scatter matrix in float64, so memory does
        not grow with the number of samples; the directions are the top eigenvectors of the
        covariance (the right singular vectors of the centred data), each signed so that its
        largest-magnitude entry is positive. ``dim`` directions need ``dim`` samples, except
        all ``d`` of them (a rotation: the plain Euclidean distance), which any number takes.
        """
        self.check_fit()  # before the d x d matrices below are allocated
        if isinstance(batches, Tensor):
            batches = [batches]
        dim, input_size = self.components.shape
        count = 0
        total = torch.zeros(input_size, dtype=torch.float64)
        scatter = torch.zeros(input_size, input_size, dtype=torch.float64)
        for batch in batches:
            x = batch.flatten(1).double().cpu()
            if x.shape[1] != input_size:
                raise KdmlError(f"PCA expects {input_size} input features, got {x.shape[1]}")
            count += len(x)
            total += x.sum(dim=0)
            scatter += x.T @ x
        self._check_count(count)
        mean = total / count
        covariance = scatter / count - torch.outer(mean, mean)
        _, vectors = torch.linalg.eigh(covariance)  # ascending eigenvalues
        directions = vectors.flip(1)[:, :dim].T
        signs = directions.gather(1, directions.abs().argmax(dim=1, keepdim=True)).sign()
        self.mean.copy_(mean)
        self.components.copy_(directions * signs)
        self.fitted.fill_(True)

    def check_fit(self, count: int | None = None) -> None:
        """Refuse, in one line, a :meth:`fit` whose d x d matrices this machine cannot hold
        (:func:`check_pca_input_size`), or, given the ``count`` of source samples it will
        read, one they cannot give ``dim`` directions: :meth:`fit` calls it first, and a
        trainer before it makes a run folder (the count had been refused only in :meth:`fit`,
        after it)."""
        check_pca_input_size(self.components.shape[1])
        if count is not None:
            self._check_count(count)

    def _check_count(self, count: int) -> None:
        """Refuse a source of ``count`` samples, too few for ``dim`` of the ``d`` directions
        (or none)."""
        dim, input_size = self.components.shape
        # all d directions (dim = d, the plain Euclidean distance) are a rotation whatever
        # the count: a source of fewer samples than features had been refused for them
        if count == 0 or count < dim < input_size:
            raise KdmlError(f"PCA to {dim} of {input_size} dimensions needs at least {dim} "
                            f"source samples, got {count}; lower method.pca_dim to at most "
                            f"{count}, or set it to 0 (all {input_size}: the plain Euclidean "
                            "distance)" if count else "PCA needs source samples, got none")

    def embed(self, inputs: Tensor) -> Tensor:
        if not bool(self.fitted):
            raise KdmlError("the pca method must be fitted on the source inputs first (fit())")
        return (inputs.flatten(1) - self.mean.to(inputs.dtype)) @ self.components.to(
            inputs.dtype).T

    def forward(self, inputs: Tensor, labels: Tensor, target_inputs: Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        embeddings = self.embed(inputs)
        zero = embeddings.new_zeros(())
        return StepOutput(zero, {"loss": zero}, embeddings)

    def param_groups(self, optim: OptimConfig) -> list[dict]:
        return []  # nothing to optimise


# ----------------------------------------------------------------------------- builders
# build(config, backbone, num_classes): the backbone and the class count are not used; the
# network is sized by the backbone's feature_size (the identity backbone: the input size).


def _check_identity_backbone(config: RunConfig) -> None:
    """Refuse another backbone: the network is the whole model, fed the flattened inputs (any
    other backbone was built for its feature size and dropped, and the first step failed as
    'DTMLNetwork expects 128 input features, got 64', after the run folder was made)."""
    if config.model.backbone != "identity":
        raise KdmlError(f"{config.recipe}'s network is the whole model, fed the flattened "
                        f"inputs: model.backbone must be identity, got "
                        f"{config.model.backbone!r}; drop the setting")


def _build_dtml(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    _check_identity_backbone(config)
    params, input_size = config.method, feature_size_of(backbone)
    if params.omega > 0 and len(params.network_sizes(input_size)) < 3:
        # dstml's defining term has no layer to weigh: the run trains dtml, bit for bit
        _log.warning("method.omega=%g weighs the hidden layers' criteria, and "
                     "method.layer_sizes=%s leaves the network no hidden layer: %s trains as "
                     "dtml; give two layer sizes or more", params.omega, params.layer_sizes,
                     config.recipe)
    return DTMLMethod(params, input_size)


def _build_ddml_logistic(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    _check_identity_backbone(config)
    return DDMLLogisticMethod(config.method, feature_size_of(backbone))


# PCAMethod.fit holds a d x d float64 scatter matrix, and eigh works on two more d x d matrices
# (the covariance and its eigenvectors): 24 * d^2 bytes. Image files fed whole (3 x 224 x 224 =
# 150,528 features) would need about 500 GiB, which torch only finds out when it allocates,
# with a raw traceback. A fit is refused where that exceeds half of the machine's memory, or
# where d exceeds PCA_MAX_INPUT: a fixed cap, so that a machine with terabytes does not start
# an eigh of cubic time that runs for hours (16,384 takes 6 GiB, and is far above feature
# vectors' usual 64 to 4,096). The trainer checks it before it makes the run folder
# (PCAMethod.check_fit), fit() again before it allocates. The method itself holds only its
# float32 mean and dim x d components, all that evaluating a trained run needs: building it
# checks those only, so a run fitted on a large machine is evaluated on a smaller one.
PCA_MAX_INPUT = 16_384
PCA_BYTES_PER_ENTRY = 3 * 8  # fit's scatter, covariance and eigenvectors, all float64
PCA_BUFFER_BYTES_PER_ENTRY = 4  # the method's mean and components, float32
NETWORK_BYTES_PER_WEIGHT = 4  # a DTML network's weights and biases, float32


def _physical_memory() -> int | None:
    """The machine's memory in bytes, or ``None`` where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None


def _over_half(needed: int, memory: int | None) -> bool:
    """Whether ``needed`` bytes exceed half of ``memory`` (by default the machine's, asked of
    the system; unknown: never)."""
    memory = _physical_memory() if memory is None else memory
    return memory is not None and needed > memory // 2


def check_pca_input_size(input_size: int, memory: int | None = None) -> None:
    """Refuse, in one line, a PCA fit whose d x d matrices would not fit (see PCA_MAX_INPUT);
    ``memory`` is the machine's (by default asked of the system)."""
    needed = PCA_BYTES_PER_ENTRY * input_size ** 2
    if input_size > PCA_MAX_INPUT or _over_half(needed, memory):
        raise KdmlError(f"the pca recipe's inputs have {input_size} features, too many: "
                        f"its fit's {input_size} x {input_size} float64 matrices would need "
                        f"{needed / 2**30:,.1f} GiB (it takes at most {PCA_MAX_INPUT} features "
                        "and half the machine's memory); PCA is for feature vectors: train it "
                        "on a domain pair or npz features, or give image files a much smaller "
                        "data.resize and data.image_size")


def check_pca_buffers(input_size: int, dim: int, memory: int | None = None) -> None:
    """Refuse, in one line, a PCAMethod whose own buffers (the mean and ``dim`` x d
    components) would exceed half of ``memory``, or whose d exceeds PCA_MAX_INPUT, which no fit
    can have reached (so no trained run is refused for it)."""
    if input_size > PCA_MAX_INPUT:
        check_pca_input_size(input_size, memory)  # its words: too wide for any fit
    needed = PCA_BUFFER_BYTES_PER_ENTRY * input_size * (dim + 1)
    if _over_half(needed, memory):
        raise KdmlError(f"a pca method of {dim} components of {input_size} features would "
                        f"need {needed / 2**30:,.1f} GiB for them, more than half the "
                        "machine's memory; lower method.pca_dim, or use a machine with more")


def _build_pca(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    _check_identity_backbone(config)
    input_size = feature_size_of(backbone)
    if config.method.pca_dim > input_size:
        raise KdmlError(f"method.pca_dim={config.method.pca_dim} exceeds the input size "
                        f"{input_size}")
    return PCAMethod(input_size, config.method.pca_dim or input_size)


# DTML learns a Euclidean metric; its network is the whole model (no backbone layers). Batches
# hold 8 samples of each of 10 classes so that every sample has its k1 = 5 same-class
# neighbours. The optimiser is Adam at lr 1e-3 (OptimConfig's), not the paper's gradient
# descent (rate 0.2 decayed by 0.95 per step, stopped when |J_k - J_(k-1)| < epsilon): a plain
# step's size depends on the scale of the features (the paper's PCA'd LBP, not these digits),
# while Adam's does not, and the paper gives no epsilon. The paper's procedure is
# configs/dtml-paper.yaml, with an epsilon and step count of ours.
DTML_SIZES = "method.layer_sizes"  # the network's widths: the last is the embedding's
# The family's default data is a domain pair (DTML and DSTML need a target; the baselines are
# compared with them on the same pair): MNIST digits to scikit-learn's 8x8 digits, offline.
DTML_DEFAULTS = {"eval": {"metric": "euclidean"}, "model": {"backbone": "identity"},
                 "data": {"dataset": "mnist5k->digits", "batch_size": 80, "samples_per_class": 8}}

RECIPES = (
    Recipe("dtml", "DTML: marginal Fisher + beta * domain MMD on the top layer (Eq. 7)",
           DTMLParams, _build_dtml, DTML_DEFAULTS, DTML_SIZES,
           check_backbone=_check_identity_backbone, needs_target=True),
    Recipe("dstml", "DSTML: DTML plus hinged criteria on the hidden layers (omega=1, tau=0)",
           DTMLParams, _build_dtml, {**DTML_DEFAULTS, "method": {"omega": 1.0, "tau": 0.0}},
           DTML_SIZES, check_backbone=_check_identity_backbone, needs_target=True),
    Recipe("ddml", "No-transfer baseline: DTML with beta = 0", DTMLParams, _build_dtml,
           {**DTML_DEFAULTS, "method": {"beta": 0.0}}, DTML_SIZES,
           check_backbone=_check_identity_backbone, needs_target=True),
    Recipe("ddml-logistic", "DDML (CVPR 2014): pairwise generalized logistic loss, source only",
           DDMLLogisticParams, _build_ddml_logistic, DTML_DEFAULTS, DTML_SIZES,
           check_backbone=_check_identity_backbone),
    Recipe("pca", "Euclidean baseline: PCA fitted on the source, no training", PCAParams,
           _build_pca, DTML_DEFAULTS, "method.pca_dim", draws_batches=False,
           check_backbone=_check_identity_backbone),
)
