r"""The Atlas family (Korman, "Atlas Based Representation and Metric Learning on Manifolds").

- ``mtriplet``: MTriplet (Sec. 3.2): :class:`~kdml.models.atlas_heads.AtlasHead`, batch-all
  triplet loss on the manifold distance of Eq. 7, plus
  :math:`\lambda_1 \ell_{\mathcal{Z}} + \lambda_2 \ell_{\mathcal{J}}` (Eq. 6).
- ``triplet``: its baseline, normalized batch-all triplet training in :math:`\mathbb{R}^{d+1}`.
- ``msimclr``: MSimCLR (Sec. 3.1): NT-Xent on the membership-weighted projections of two
  augmented views, plus the same regularizer.
- ``simclr``: its baseline, SimCLR with one projection head on :math:`f(x) \in \mathbb{R}^d`.

The Atlas methods expose ``chart_codes(inputs)``, the compressed code of Eq. 3, for
:func:`~kdml.evaluation.charts.chart_retrieval_metrics` and
:func:`~kdml.evaluation.charts.piecewise_linear_accuracy`.

MSimCLR and SimCLR follow Appendix A.1 and the authors' code (github.com/ekorman/neurve) by
default: a ResNet-18 with a small-input stem, its features mapped to 2048-d, per-chart
projection heads d -> d -> 64 without bias, random resized crops to 32 with colour jitter 0.5
(p 0.8) and grayscale (p 0.2), coordinates clamped to [-10, 10] before the MMD, the MMD averaged
over the two views, Adam 1e-4 with weight decay 2e-6, batch 128, 100 epochs (CIFAR-10: ResNet-50,
1,000 epochs, tau 0.5: configs/msimclr-cifar10.yaml). The backbone sees the augmented [0, 1]
images without normalisation, as in the authors' code (see :func:`_unnormalized`).

MTriplet's and the triplet baseline's paper settings that differ from the defaults here, which
serve the offline small-CNN demo: batches of 8 classes x 4 images (the offline datasets have
only 5 training classes, so the default is 5 x 4), RMSProp at 1e-5 for 300 epochs with an
ImageNet-pretrained GoogLeNet (BN-Inception in the configs: kdml has no GoogLeNet), random
resized crops of 227 (configs/mtriplet-cub.yaml,
configs/triplet-cub.yaml). The recipe-by-recipe comparison with the paper and the authors' code
is docs/recipes.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kdml.atlas import (
    DISTANCE_VARIANTS,
    ChartOutputs,
    compressed_code,
    manifold_distance,
    safe_sqrt,
)
from kdml.checks import check_labels, check_params, is_positive_int
from kdml.config import RunConfig, check_fields
from kdml.data.augment import SimCLRAugment
from kdml.data.transforms import Normalization
from kdml.distributed import gather, mean_over_ranks
from kdml.errors import KdmlError
from kdml.losses.nt_xent import MIN_TEMPERATURE, nt_xent_loss
from kdml.models.atlas_heads import PROJECTION_INPUTS, AtlasHead, ProjectionHeads
from kdml.models.backbones import feature_size_of, pooled_features
from kdml.models.heads import EmbeddingHead
from kdml.models.method import Method, StepOutput, detached
from kdml.precision import full_precision, upcast
from kdml.regularizers.manifold import ChartMembershipLoss, ManifoldMMD
from kdml.seeding import StepRandom
from kdml.training.recipes.base import Recipe

TRIPLET_REDUCTIONS = ("all", "nonzero")


# ----------------------------------------------------------------------------- the loss


@full_precision
def batch_all_triplet_loss(distances: Tensor, labels: Tensor, margin: float = 0.2,
                           reduction: str = "all") -> tuple[Tensor, dict[str, Tensor]]:
    r"""Batch-all triplet loss on a given distance matrix (Schroff et al. 2015; Atlas Sec. 3.2).

    .. math::
        \ell = \operatorname{mean}_{(a, p, n)} \left[ D_{ap} - D_{an} + m \right]_+

    over every triplet of the batch with :math:`y_a = y_p`, :math:`a \ne p`,
    :math:`y_n \ne y_a`. Written here rather than with a PML miner because the manifold
    distance is a precomputed matrix that may hold :math:`+\infty` (points sharing no chart),
    which must not become NaN:

    - :math:`D_{an} = \infty`: the negative is infinitely far, the triplet is satisfied
      (loss 0, no gradient);
    - :math:`D_{ap} = \infty`: the loss would be :math:`\infty` with no usable gradient, so
      the triplet is left out and counted in ``infinite_positives`` (``inf - inf`` is never
      formed).

    ``reduction="all"`` averages over all counted triplets (the authors' code);
    ``"nonzero"`` over those with a positive loss (Hermans et al.; PML's default reducer).
    A batch without any triplet gives a zero loss that is still part of the graph.

    Args:
        distances: :math:`(B, B)` distances, :math:`+\infty` allowed (NaN gives a NaN loss).
        labels: :math:`(B,)` integer labels.
        margin: :math:`m`. Default: 0.2.
        reduction: ``"all"`` or ``"nonzero"``.

    Returns:
        The loss (scalar) and ``{"active_triplets": fraction with a positive loss,
        "infinite_positives": number of left-out triplets}`` (scalar tensors).
    """
    if reduction not in TRIPLET_REDUCTIONS:
        raise KdmlError(f"reduction must be one of {', '.join(TRIPLET_REDUCTIONS)}, "
                        f"got {reduction!r}")
    if (not isinstance(labels, Tensor) or labels.ndim != 1 or labels.is_floating_point()
            or labels.is_complex()):
        shown = (f"a {labels.dtype} tensor of shape {tuple(labels.shape)}"
                 if isinstance(labels, Tensor) else type(labels).__name__)
        # a [B, 1] column broadcast into a [B, B, B] "same class" mask: another number
        raise KdmlError(f"batch_all_triplet_loss needs labels as a [B] integer tensor, got "
                        f"{shown}")
    if distances.ndim != 2 or distances.shape != (len(labels), len(labels)):
        raise KdmlError(f"distances must be [B, B] for B = {len(labels)} labels, got "
                        f"{tuple(distances.shape)}")
    same = labels[:, None] == labels[None, :]
    itself = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    # +inf alone is "no shared chart": a NaN (a diverged encoder's) stays in the loss and
    # makes it NaN, for the trainer's check to stop on, instead of a finite 0
    finite_positive = ~torch.isinf(distances) & same & ~itself  # [a, p]
    infinite_positive = torch.isinf(distances) & same & ~itself
    positive_distance = torch.where(finite_positive, distances, 0.0)
    # D_an = +inf gives -inf here and relu(-inf) = 0, with a zero gradient.
    violation = torch.relu(positive_distance[:, :, None] - distances[:, None, :] + margin)
    counted = finite_positive[:, :, None] & ~same[:, None, :]  # [a, p, n]
    losses = torch.where(counted, violation, 0.0)
    active = losses > 0
    # Counts stay tensors: no host sync inside a training step.
    num_counted, num_active = counted.sum(), active.sum()
    denominator = num_counted if reduction == "all" else num_active
    loss = losses.sum() / denominator.clamp(min=1)
    num_infinite = (infinite_positive[:, :, None] & ~same[:, None, :]).sum()
    stats = {"active_triplets": num_active / num_counted.clamp(min=1),
             "infinite_positives": num_infinite.to(distances.dtype)}
    return loss, stats


# ----------------------------------------------------------------------------- parameters


def _check_positive_int(params: object, name: str) -> None:
    value = getattr(params, name)
    if not is_positive_int(value):
        raise KdmlError(f"method.{name} must be a positive integer, got {value!r}")


def _check_int_or_zero(params: object, name: str, zero: str = "") -> None:
    """A size of which 0 means a default (``zero`` names it); its type was checked by
    :func:`~kdml.config.check_fields`, which refuses floats, strings and booleans."""
    value = getattr(params, name)
    if not value >= 0:
        meaning = f" (0 = {zero})" if zero else ""
        raise KdmlError(f"method.{name} must be >= 0{meaning}, got {value!r}")


def _check_non_negative(name: str, value: float) -> None:
    if not value >= 0:
        raise KdmlError(f"method.{name} must be >= 0, got {value}")


def _one_chart_unread(params: MTripletParams | MSimCLRParams,
                      default: MTripletParams | MSimCLRParams) -> list[tuple[str, str]]:
    """``method.lambda2`` given another value than ``default``'s where ``n_charts`` is 1 (for
    the trainer's warning of settings a run never reads): one chart's membership is q = 1 for
    every input, where the chart loss and its gradient are 0, so a grid over lambda2 trained
    the same run in every cell, without a word."""
    if params.n_charts == 1 and params.lambda2 != default.lambda2:
        return [("method.lambda2", "with method.n_charts=1 every point is in the one chart "
                 "(q = 1), where the chart loss is 0")]
    return []


@dataclass
class TripletParams:
    dim: int = 2  # d: the embedding is L2-normalized in R^(d+1), a d-sphere
    margin: float = 0.2
    triplet_reduction: str = "all"  # all (authors' code) | nonzero (PML / Hermans et al.)

    def validate(self) -> None:
        check_fields(self)  # types, NaN and infinity, before the range checks compare
        _check_positive_int(self, "dim")
        _check_non_negative("margin", self.margin)
        if self.triplet_reduction not in TRIPLET_REDUCTIONS:
            raise KdmlError(f"method.triplet_reduction must be one of "
                            f"{', '.join(TRIPLET_REDUCTIONS)}, got {self.triplet_reduction!r}")


@dataclass
class NormalizedTripletParams(TripletParams):
    # the loss on squared distances ||a - b||^2, as the authors' code (neurve/metric_learning/
    # loss.py: TripletLoss on distance.pdist, which is squared) and Schroff et al. 2015, whom the
    # paper cites for "standard" triplet training; the default ||a - b|| is MTriplet's d0
    # (Sec. 3.2), so that the two recipes differ only in geometry. configs/triplet-*.yaml: true
    squared_distance: bool = False


@dataclass
class MTripletParams(TripletParams):
    n_charts: int = 16  # n (the paper tunes at d = 2, n = 16)
    lambda1: float = 1.0  # weight of the manifold MMD (Sec. 3.2.1)
    lambda2: float = 0.1  # weight of the chart membership loss
    distance: str = "paper"  # manifold distance of Eq. 7: paper | code (authors' code)

    def validate(self) -> None:
        super().validate()
        _check_positive_int(self, "n_charts")
        _check_non_negative("lambda1", self.lambda1)
        _check_non_negative("lambda2", self.lambda2)
        if self.distance not in DISTANCE_VARIANTS:
            raise KdmlError(f"method.distance must be one of {', '.join(DISTANCE_VARIANTS)}, "
                            f"got {self.distance!r}")

    def unread_settings(self, default: MTripletParams) -> list[tuple[str, str]]:
        """The settings given other values than ``default``'s that this objective never
        reads, each with why (for the trainer's warning): see :func:`_one_chart_unread`."""
        return _one_chart_unread(self, default)


@dataclass
class SimCLRParams:
    dim: int = 2  # d: the representation f(x) in R^d
    tau: float = 1.0  # NT-Xent temperature (1 for MNIST / FashionMNIST, 0.5 for CIFAR-10)
    proj_dim: int = 64  # projection heads d -> d -> proj_dim, no bias (the authors' runs)
    # the heads' hidden width; 0 = d, as in the authors' code (SimCLR's own head is as wide as
    # its 2048-d representation). At d = 2 a bias-free ReLU layer two units wide can die on
    # every input (docs/reproduction-mnist5k-head-cnn.md); kdml's ablation sets it wider
    proj_hidden: int = 0
    crop_size: int = 32  # side of the random resized crops (the authors' code: 32, also for
    # 28-pixel MNIST); 0 = the input's own size
    crop_scale_min: float = 0.08  # smallest crop area fraction of the random resized crop
    horizontal_flip: bool = False  # off for digits
    # the authors' code forwards the two views one after the other, so BatchNorm normalises
    # one view at a time (the paper does not say); true: both views as one batch of 2B, as
    # SimCLR's own code does (and kdml did before: the earlier docs/reproduction.md's runs)
    joint_views: bool = False

    def validate(self) -> None:
        check_fields(self)  # types, NaN and infinity, before the range checks compare
        _check_positive_int(self, "dim")
        _check_positive_int(self, "proj_dim")
        _check_int_or_zero(self, "proj_hidden", "dim")
        _check_int_or_zero(self, "crop_size", "the input size")
        if not (math.isfinite(self.tau) and self.tau >= MIN_TEMPERATURE):
            raise KdmlError(f"method.tau must be at least {MIN_TEMPERATURE:.1e} (the NT-Xent "
                            f"logits are cosines / tau in float32), got {self.tau}")
        if not 0 < self.crop_scale_min <= 1:
            raise KdmlError(f"method.crop_scale_min must be in (0, 1], got {self.crop_scale_min}")


@dataclass
class MSimCLRParams(SimCLRParams):
    n_charts: int = 16
    lambda1: float = 20.0  # Sec. A.1
    lambda2: float = 0.1
    proj_input: str = "sigmoid"  # h_i(phi_i(x)) as in Table 1 | pre-sigmoid
    # the authors' code maps the backbone's features to 2048-d before the chart heads and q
    # (0 = the heads read the backbone's features directly)
    feature_dim: int = 2048
    # pre-sigmoid chart coordinates are clamped to [-c, c] before the MMD and the projection,
    # as in the authors' code (the paper does not say); 0 = no clamp
    coordinate_clamp: float = 10.0

    def validate(self) -> None:
        super().validate()
        _check_positive_int(self, "n_charts")
        _check_non_negative("coordinate_clamp", self.coordinate_clamp)
        _check_int_or_zero(self, "feature_dim")
        _check_non_negative("lambda1", self.lambda1)
        _check_non_negative("lambda2", self.lambda2)
        if self.proj_input not in PROJECTION_INPUTS:
            raise KdmlError(f"method.proj_input must be one of {', '.join(PROJECTION_INPUTS)}, "
                            f"got {self.proj_input!r}")

    def unread_settings(self, default: MSimCLRParams) -> list[tuple[str, str]]:
        """The settings given other values than ``default``'s that this objective never
        reads, each with why (for the trainer's warning): see :func:`_one_chart_unread`."""
        return _one_chart_unread(self, default)


# ----------------------------------------------------------------------------- methods


def atlas_embedding(outputs: ChartOutputs) -> Tensor:
    r"""A vector for the plain (Euclidean) retrieval path: :math:`[\phi_i(x),
    \sqrt{d}\, e_i]` with :math:`i` the argmax chart and :math:`e_i` its one-hot vector.

    Under the Euclidean metric two points of one chart are at
    :math:`\|\phi_i(x) - \phi_i(y)\| \le \sqrt{d}` and points of different charts at
    :math:`\ge \sqrt{2d} > \sqrt{d}`, so a chart's points always rank before other charts'
    (a finite stand-in for the infinite distance of Eq. 7, on sigmoid coordinates). Shape
    :math:`(B, d + n)`. The faithful evaluation is ``chart_codes`` with
    :func:`~kdml.evaluation.charts.chart_retrieval_metrics`.
    """
    chart_coords, chart_index = compressed_code(outputs)
    n_charts, dim = outputs.coords.shape[1:]
    one_hot = F.one_hot(chart_index, n_charts).to(chart_coords.dtype)
    return torch.cat([torch.sigmoid(chart_coords), math.sqrt(dim) * one_hot], dim=1)


class _AtlasMethod(Method):
    """Shared parts of MTriplet and MSimCLR: backbone -> AtlasHead, regularizers, codes."""

    has_charts = True

    def __init__(self, backbone: nn.Module, dim: int, n_charts: int, lambda1: float,
                 lambda2: float, feature_dim: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        # an optional linear map of the backbone's features (MSimCLR: to 2048-d, as the
        # authors' code) before the chart heads and the membership head
        self.features = (nn.Linear(feature_size_of(backbone), feature_dim) if feature_dim
                         else nn.Identity())
        self.head = AtlasHead(feature_dim or feature_size_of(backbone), dim, n_charts)
        self.mmd = ManifoldMMD(dim, n_charts)  # prior drawn from the step's generator
        self.chart_loss = ChartMembershipLoss()
        self.lambda1, self.lambda2 = lambda1, lambda2

    def charts(self, inputs: Tensor) -> ChartOutputs:
        return self.head(self.features(pooled_features(self.backbone, inputs)))

    def embed(self, inputs: Tensor) -> Tensor:
        """:func:`atlas_embedding` of the inputs, shape [B, d + n]."""
        return atlas_embedding(self.charts(inputs))

    def chart_codes(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        """The compressed code of Eq. 3: pre-sigmoid coordinates [B, d] of the argmax chart
        and its index [B]. Call in eval mode (as the evaluator does for ``embed``)."""
        return compressed_code(self.charts(inputs))

    def prior_generator(self, rng: StepRandom | None, like: Tensor) -> torch.Generator | None:
        """The step's generator on ``like``'s device for the prior samples (``None``: torch's
        global generator)."""
        return None if rng is None else rng.generator(like.device)


class MTripletMethod(_AtlasMethod):
    r"""MTriplet: :math:`\ell_{triplet}(d_{\mathcal{M}}) + \lambda_1 \ell_{\mathcal{Z}} +
    \lambda_2 \ell_{\mathcal{J}}` (Atlas, Sec. 3.2).

    The manifold distance is computed from the head's ``log_q`` (``q_is_log=True``): same
    values as from ``q``, but it stays finite and NaN-free when float32 memberships underflow.
    """

    @property
    def batch_needs(self) -> tuple[int, int, str]:
        # batch-all triplets: an anchor, a positive of its class and a negative of another
        return 2, 2, "triplet loss (an anchor, a positive of its class, a negative of another)"

    def __init__(self, backbone: nn.Module, params: MTripletParams) -> None:
        # built from a config it is checked already; directly, here
        check_params("MTripletMethod", params, MTripletParams)
        super().__init__(backbone, params.dim, params.n_charts, params.lambda1, params.lambda2)
        self.params = params

    def forward(self, inputs: Tensor, labels: Tensor, target_inputs: Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        # from a PML loop, labels left on another device had failed inside the triplet loss
        # with torch's words (types, dtypes and devices: no host sync)
        check_labels("MTripletMethod", labels, [inputs], "inputs", "inputs")
        outputs = self.charts(inputs)
        # the global batch under torchrun (kdml.distributed.gather); the local one otherwise
        coords, q = gather(outputs.coords), gather(outputs.q)
        # the log-memberships when the head gives them (finite where q underflows), else q
        memberships = q if outputs.log_q is None else gather(outputs.log_q)
        distances = manifold_distance(memberships, coords, memberships, coords,
                                      variant=self.params.distance,
                                      q_is_log=outputs.log_q is not None)
        triplet, stats = batch_all_triplet_loss(distances, gather(labels), self.params.margin,
                                                self.params.triplet_reduction)
        mmd = self.mmd(coords, q, generator=self.prior_generator(rng, coords))
        chart = self.chart_loss(q)
        loss = triplet + self.lambda1 * mmd + self.lambda2 * chart
        terms = detached(loss=loss, triplet=triplet, mmd=mmd, chart=chart,
                         q_max=upcast(q.max(dim=1).values).mean(), **stats)
        return StepOutput(loss, terms, atlas_embedding(outputs))


class TripletMethod(Method):
    r"""Baseline: backbone -> ``Linear(D, d + 1)`` -> L2 normalisation, batch-all triplet loss
    on Euclidean distances (Atlas, Sec. 3.2.1: the unit sphere in :math:`\mathbb{R}^{d+1}` is
    :math:`d`-dimensional, a fair comparison with :math:`d`-dimensional charts). Uses the same
    :func:`batch_all_triplet_loss` as MTriplet, so by default only the geometry differs;
    ``squared_distance=true`` (the paper configs', as the authors' code) puts the loss on
    squared distances instead."""

    @property
    def batch_needs(self) -> tuple[int, int, str]:
        # batch-all triplets: an anchor, a positive of its class and a negative of another
        return 2, 2, "triplet loss (an anchor, a positive of its class, a negative of another)"

    def __init__(self, backbone: nn.Module,
                 params: NormalizedTripletParams | TripletParams) -> None:
        check_params("TripletMethod", params, (NormalizedTripletParams, TripletParams))
        super().__init__()
        self.backbone = backbone
        self.head = EmbeddingHead(feature_size_of(backbone), params.dim + 1)
        self.params = params
        # plain TripletParams (no squared_distance field): Euclidean distances
        self.squared = getattr(params, "squared_distance", False)

    def forward(self, inputs: Tensor, labels: Tensor, target_inputs: Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        check_labels("TripletMethod", labels, [inputs], "inputs", "inputs")  # as MTriplet
        embeddings = self.embed(inputs)
        distances = _triplet_distances(gather(embeddings), self.squared)
        loss, stats = batch_all_triplet_loss(distances, gather(labels), self.params.margin,
                                             self.params.triplet_reduction)
        return StepOutput(loss, detached(loss=loss, **stats), embeddings)

    def embed(self, inputs: Tensor) -> Tensor:
        return self.head(pooled_features(self.backbone, inputs))


@full_precision  # in float32 under autocast: bf16 differences were ~50 times as far off
def _triplet_distances(batch: Tensor, squared: bool) -> Tensor:
    """:math:`(B, B)` Euclidean (or squared) distances of :math:`(B, d)` embeddings."""
    # explicit differences: exact zeros on the diagonal, safe_sqrt keeps their gradient 0
    squares = (batch[:, None] - batch[None, :]).pow(2).sum(dim=-1)
    return squares if squared else safe_sqrt(squares)


def _two_views(augment: SimCLRAugment, inputs: Tensor, rng: StepRandom | None,
               backbone: nn.Module) -> tuple[Tensor, int]:
    """Two augmented views of the unnormalised batch, then the backbone's normalisation (the
    trainer leaves it to these methods: ``augments_inputs``), as one batch [view 1; view 2].
    """
    if inputs.ndim != 4:
        raise KdmlError("the SimCLR recipes augment images [B, C, H, W]; this dataset has "
                        f"inputs of shape {tuple(inputs.shape[1:])}")
    if len(inputs) < 2:
        raise KdmlError("the SimCLR recipes need batches of at least 2 images (negatives)")
    generator = None if rng is None else rng.generator("cpu")
    view1, view2 = augment(inputs, generator, None if rng is None else rng.share)
    normalization = getattr(backbone, "normalization", None) or Normalization()
    return normalization(torch.cat([view1, view2])), len(inputs)


_Output = TypeVar("_Output", Tensor, ChartOutputs)


def _per_view(function: Callable[[Tensor], _Output], views: Tensor,
              batch_size: int) -> _Output:
    """``function`` of each view's images on their own, the outputs stacked as the views are
    ([view 1; view 2]): the authors' code forwards the two views one after the other
    (neurve/contrastive/trainer.py), so BatchNorm layers normalise one view's B images at a
    time, and update their running statistics twice a step. The paper does not say; one
    batch of 2B, as SimCLR's own code has it, would mix the views' statistics."""
    first, second = function(views[:batch_size]), function(views[batch_size:])
    if isinstance(first, Tensor) and isinstance(second, Tensor):
        return cast(_Output, torch.cat([first, second]))
    charts1, charts2 = cast(ChartOutputs, first), cast(ChartOutputs, second)
    log_q = (None if charts1.log_q is None or charts2.log_q is None
             else torch.cat([charts1.log_q, charts2.log_q]))
    return cast(_Output, ChartOutputs(torch.cat([charts1.coords, charts2.coords]),
                                      torch.cat([charts1.q, charts2.q]), log_q))


def _global_views(local: Tensor, batch_size: int) -> tuple[Tensor, Tensor]:
    """The two views' rows of ``local`` ([view 1; view 2] of this rank's images), each
    gathered over the ranks: the layout of a single process's global batch."""
    return gather(local[:batch_size]), gather(local[batch_size:])


class MSimCLRMethod(_AtlasMethod):
    r"""MSimCLR: :math:`\ell_{NT\text{-}Xent}(\sum_i q_i h_i(\phi_i)) + \lambda_1
    \ell_{\mathcal{Z}} + \lambda_2 \ell_{\mathcal{J}}` (Atlas, Sec. 3.1, Table 1).

    Two views of every image are made inside :meth:`forward` with
    :class:`~kdml.data.augment.SimCLRAugment` (labels are unused). The backbone sees one view
    at a time, as in the authors' code (``joint_views=true``: both as one batch, as SimCLR's
    code does); the MMD is the mean of the two views' MMDs (each view is a sample of the
    data distribution; the pooled 2B points would hold correlated pairs), as in the authors'
    code, and the chart loss is averaged over all 2B views.
    """

    augments_inputs = True

    def __init__(self, backbone: nn.Module, params: MSimCLRParams) -> None:
        check_params("MSimCLRMethod", params, MSimCLRParams)
        super().__init__(backbone, params.dim, params.n_charts, params.lambda1, params.lambda2,
                         params.feature_dim)
        self.projection = ProjectionHeads(params.dim, params.n_charts, params.proj_dim,
                                          hidden=params.proj_hidden or None,
                                          head_input=params.proj_input)
        self.augment = SimCLRAugment(crop_scale=(params.crop_scale_min, 1.0),
                                     horizontal_flip=params.horizontal_flip,
                                     size=params.crop_size or None)
        self.tau = params.tau
        self.clamp = params.coordinate_clamp
        self.joint_views = params.joint_views

    def forward(self, inputs: Tensor, labels: Tensor, target_inputs: Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        views, batch_size = _two_views(self.augment, inputs, rng, self.backbone)
        outputs = (self.charts(views) if self.joint_views
                   else _per_view(self.charts, views, batch_size))
        coords = outputs.coords.clamp(-self.clamp, self.clamp) if self.clamp else outputs.coords
        projected, head_active = self.projection.project(coords, outputs.q)
        head_active = mean_over_ranks(head_active)  # of this rank's rows: the global batch's
        projections = torch.cat(_global_views(projected, batch_size))
        nt_xent = nt_xent_loss(projections, self.tau)
        coords1, coords2 = _global_views(coords, batch_size)
        q1, q2 = _global_views(outputs.q, batch_size)
        generator = self.prior_generator(rng, coords1)
        mmd = 0.5 * (self.mmd(coords1, q1, generator=generator)
                     + self.mmd(coords2, q2, generator=generator))
        q = torch.cat([q1, q2])
        chart = self.chart_loss(q)
        loss = nt_xent + self.lambda1 * mmd + self.lambda2 * chart
        terms = detached(loss=loss, nt_xent=nt_xent, mmd=mmd, chart=chart,
                         q_max=upcast(q.max(dim=1).values).mean(),
                         head_active=head_active)
        return StepOutput(loss, terms, None)  # the views are not the batch: no embeddings


class SimCLRMethod(Method):
    r"""Baseline SimCLR: :math:`f(x) = W\,\mathrm{backbone}(x) + b \in \mathbb{R}^d`, projection
    :math:`h(f(x))` (the MLP of :class:`~kdml.models.atlas_heads.ProjectionHeads` with one
    chart, on :math:`f(x)` directly) and NT-Xent on two augmented views. ``embed`` is
    :math:`f(x)`; its linear probe is ``piecewise_linear_accuracy(..., sigmoid=False)`` with
    every chart index 0."""

    augments_inputs = True

    def __init__(self, backbone: nn.Module, params: SimCLRParams) -> None:
        check_params("SimCLRMethod", params, SimCLRParams)
        super().__init__()
        self.backbone = backbone
        self.encoder_head = nn.Linear(feature_size_of(backbone), params.dim)
        self.projection = ProjectionHeads(params.dim, 1, params.proj_dim,
                                          hidden=params.proj_hidden or None,
                                          head_input="pre-sigmoid")
        self.augment = SimCLRAugment(crop_scale=(params.crop_scale_min, 1.0),
                                     horizontal_flip=params.horizontal_flip,
                                     size=params.crop_size or None)
        self.tau = params.tau
        self.joint_views = params.joint_views

    def forward(self, inputs: Tensor, labels: Tensor, target_inputs: Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        views, batch_size = _two_views(self.augment, inputs, rng, self.backbone)
        representation = (self.embed(views) if self.joint_views
                          else _per_view(self.embed, views, batch_size))
        projected, head_active = self.projection.project(
            representation[:, None, :], representation.new_ones(len(representation), 1))
        head_active = mean_over_ranks(head_active)  # of this rank's rows: the global batch's
        projections = torch.cat(_global_views(projected, batch_size))
        loss = nt_xent_loss(projections, self.tau)
        return StepOutput(loss, detached(loss=loss, head_active=head_active), None)

    def embed(self, inputs: Tensor) -> Tensor:
        return self.encoder_head(pooled_features(self.backbone, inputs))


# ----------------------------------------------------------------------------- recipes


def _build_mtriplet(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    return MTripletMethod(backbone, config.method)


def _build_triplet(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    return TripletMethod(backbone, config.method)


def _unnormalized(config: RunConfig, backbone: nn.Module) -> nn.Module:
    """The SimCLR recipes feed a from-scratch backbone the augmented [0, 1] images as they
    are, as the authors' code does for its ResNets (neurve/contrastive/dataset.py: ``ToTensor``
    and no ``Normalize``; App. A.1 names no normalisation). Pretrained weights
    (``model.weights``) keep their backbone's normalisation, which the methods apply after
    their augmentation (``augments_inputs``)."""
    if not config.model.weights:
        # a plain attribute; nn.Module's __setattr__ is typed for tensors and modules only
        backbone.normalization = Normalization()  # type: ignore[assignment]
    return backbone


def _build_msimclr(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    return MSimCLRMethod(_unnormalized(config, backbone), config.method)


def _build_simclr(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    return SimCLRMethod(_unnormalized(config, backbone), config.method)


# The triplet recipes keep the generic optimiser defaults (Adam 1e-3, 10 epochs: a small CNN
# from scratch on CPU); the paper's RMSProp 1e-5 for 300 epochs fine-tunes a pretrained
# network, and configs/mtriplet-*.yaml and triplet-*.yaml set it (docs/recipes.md).
# Class-balanced batches of 4 images per class: the paper's 8 classes x 4 (batch 32) need 8
# training classes; the offline datasets' class-disjoint split has 5, so 5 x 4 = 20.
TRIPLET_BATCHES = {"batch_size": 20, "samples_per_class": 4}
# Sec. A.1: batch 128. The split departs from A.1, which trains and tests on the files'
# train/test split (data.split=standard, as configs/msimclr-*.yaml set): seen-holdout (a fifth
# of each class held out) works on every dataset, also those without a split of their own
# (mnist5k, folders), where standard would fall back to class-disjoint, which the
# piecewise-linear probe of seen classes cannot score.
SIMCLR_DATA = {"split": "seen-holdout", "batch_size": 128}
# App. A.1: ResNet-18 with SimCLR's small-input stem (ResNet-50 for CIFAR-10), Adam 1e-4,
# 100 epochs; weight decay 2e-6 as in the authors' runs. `model.backbone=cnn
# model.small_input=false` is a quick CPU setting, much weaker
# (docs/reproduction-mnist5k-table2-cnn.md).
SIMCLR_MODEL = {"backbone": "torchvision:resnet18", "small_input": True}
SIMCLR_OPTIM = {"lr": 1e-4, "weight_decay": 2e-6}
SIMCLR_TRAIN = {"epochs": 100}

RECIPES = (
    Recipe("mtriplet", "MTriplet (Atlas): batch-all triplet on the manifold distance + MMD + "
           "chart loss", MTripletParams, _build_mtriplet,
           {"data": dict(TRIPLET_BATCHES), "eval": {"metric": "euclidean"}}, "method.dim",
           has_charts=True),
    Recipe("triplet", "Normalized batch-all triplet baseline in R^(d+1) (Atlas Sec. 3.2)",
           NormalizedTripletParams, _build_triplet, {"data": dict(TRIPLET_BATCHES)},
           "method.dim"),
    Recipe("msimclr", "MSimCLR (Atlas): NT-Xent on chart-weighted projections + MMD + chart "
           "loss", MSimCLRParams, _build_msimclr,
           {"data": dict(SIMCLR_DATA), "eval": {"metric": "euclidean"},
            "model": dict(SIMCLR_MODEL), "optim": dict(SIMCLR_OPTIM),
            "train": dict(SIMCLR_TRAIN)}, "method.dim", pretrained=False,
           inputs_follow_weights=True, augments_images=True, has_charts=True),
    Recipe("simclr", "SimCLR baseline in R^d (Atlas Sec. 3.1)", SimCLRParams, _build_simclr,
           {"data": dict(SIMCLR_DATA), "model": dict(SIMCLR_MODEL),
            "optim": dict(SIMCLR_OPTIM), "train": dict(SIMCLR_TRAIN)}, "method.dim",
           pretrained=False, inputs_follow_weights=True, augments_images=True),
)
