"""Build what a run trains from its config: the method (backbone, recipe, domain term), the
input pipeline, the embedder, the optimiser and its schedule, and the device."""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

from kdml.config import OptimConfig, RunConfig, device_name_problem
from kdml.data.sample_spec import Samples
from kdml.data.splits import DataSplits
from kdml.data.transforms import InputPipeline, Normalization
from kdml.errors import KdmlError
from kdml.evaluation.evaluator import Embedder
from kdml.kernels import GaussianMixtureKernel
from kdml.models.backbones import build_backbone
from kdml.models.method import Method
from kdml.models.weights import load_weights
from kdml.precision import embedding_precision
from kdml.regularizers.domain import DomainMMD
from kdml.seeding import with_cpu_seed
from kdml.training.domain_adapted import DomainAdaptedMethod
from kdml.training.recipes import get_recipe

# Backbones made for RGB images (BN-Inception) get grayscale images as three equal channels.
RGB_ONLY = ("bninception",)


def model_input_shape(config: RunConfig, samples: Samples) -> tuple[int, ...]:
    """What the backbone takes: the crop of file-decoded images, else the sample itself;
    three channels for a grayscale image into an RGB-only backbone."""
    shape = samples.sample_shape
    if samples.is_file_backed:
        shape = (shape[0], config.data.image_size, config.data.image_size)
    if len(shape) == 3 and shape[0] == 1 and config.model.backbone in RGB_ONLY:
        shape = (3, *shape[1:])
    return shape


def build_method(config: RunConfig, splits: DataSplits, pretrained: bool = True,
                 echo: Callable[[str], None] = print) -> Method:
    """The recipe's method for ``splits``, its initial weights drawn from ``train.seed``, and
    the backbone's from ``model.weights`` when ``pretrained``."""
    if config.domain.beta > 0 and splits.target is None:
        raise KdmlError("domain.beta > 0 needs a domain pair as data.dataset, "
                        "e.g. mnist5k->digits")
    return build_method_for(config, splits.train, len(splits.train_classes), pretrained, echo)


def build_method_for(config: RunConfig, samples: Samples, train_classes: int,
                     pretrained: bool = True, echo: Callable[[str], None] = print) -> Method:
    """:func:`build_method` for training samples like ``samples`` (a dataset, or the
    :class:`~kdml.data.sample_spec.SampleSpec` a run folder records) of ``train_classes``
    classes."""

    def build() -> Method:
        model = config.model
        backbone = build_backbone(model.backbone, model_input_shape(config, samples),
                                  samples.default_backbone, model.pooling, model.small_input)
        if pretrained and model.weights:
            load_weights(backbone, model.weights, report=echo)
        return get_recipe(config.recipe).build(config, backbone, train_classes)

    method = with_cpu_seed(config.train.seed, build)
    if config.domain.beta > 0:
        kernel = GaussianMixtureKernel() if config.domain.kernel == "gaussian" else None
        method = DomainAdaptedMethod(method, config.domain.beta, DomainMMD(kernel))
    return method


def build_pipeline(config: RunConfig, samples: Samples, method: Method) -> InputPipeline:
    """The input pipeline of samples like ``samples`` (the training part, or its record):
    crops for file-decoded images, the backbone's channels and normalisation (for methods that
    augment their inputs themselves, training batches get the test batches' centre crop and
    neither augmentation nor normalisation)."""
    normalization = getattr(method.backbone, "normalization", None) or Normalization()
    crop = config.data.image_size if samples.is_file_backed else None
    channels = model_input_shape(config, samples)[0]
    return InputPipeline(crop, normalization, channels=channels,
                         method_augments=method.augments_inputs)


def build_embedder(config: RunConfig, pipeline: InputPipeline, device: torch.device,
                   progress: bool | None = None, precision: str | None = None) -> Embedder:
    """The embedder of ``config``'s test batches on ``device``, under ``precision`` (``None``:
    :func:`~kdml.precision.embedding_precision` of ``train.precision``)."""
    return Embedder(pipeline.test, device, config.eval.embed_batch_size, config.data.num_workers,
                    config.data.on_bad_image,
                    precision or embedding_precision(config.train.precision, device), progress)


Schedule = torch.optim.lr_scheduler.LRScheduler


def build_optimizer(method: Method, config: RunConfig
                    ) -> tuple[torch.optim.Optimizer | None, Schedule | None]:
    """Adam, RMSProp or plain gradient steps over the method's parameter groups, with step decay
    (``lr_step`` or ``lr_milestones``, ``lr_gamma``; Sec. 5.1 of Chu et al.) and per-epoch decay
    (``lr_decay``; DTML's lambda <- 0.95 lambda). ``(None, None)`` for a method with nothing to
    train."""
    groups = [group for group in method.param_groups(config.optim) if group["params"]]
    if not groups:
        return None, None
    optim = config.optim
    if optim.name == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(groups, eps=optim.adam_eps)
    elif optim.name == "rmsprop":
        optimizer = torch.optim.RMSprop(groups)
    else:
        optimizer = torch.optim.SGD(groups, lr=optim.lr)

    def factor(epoch: int) -> float:  # a function, which LambdaLR keeps out of its state
        return schedule_factor(optim, epoch)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def schedule_factor(optim: OptimConfig, epoch: int) -> float:
    """The factor every learning rate is multiplied by after ``epoch`` epochs (0-based: the
    epochs finished so far): ``lr_gamma`` per step (``lr_step`` or ``lr_milestones``) times
    ``lr_decay`` per epoch."""
    if optim.lr_milestones:
        steps = bisect.bisect_right(optim.lr_milestones, epoch)
    else:
        steps = epoch // optim.lr_step if optim.lr_step else 0
    return optim.lr_gamma ** steps * optim.lr_decay ** epoch


def resolve_device(name: str, option: str | None = None) -> torch.device:
    """``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``. A device
    not on this machine is refused in one line naming where ``name`` came from: ``option``
    (a command-line option such as ``--device``), else the ``train.device`` setting."""
    problem = device_name_problem(name, option or "the device")
    if problem:
        raise KdmlError(problem)
    given, remedy = ((f"{option} {name}", f"give {option} cpu or auto") if option
                     else (f"train.device={name}", "use cpu or auto"))
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise KdmlError(f"{given} but no CUDA device is available here; {remedy}")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:  # torch's own error would come later, as a traceback
            names = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            raise KdmlError(f"{given} but this machine has {count} CUDA device"
                            f"{'' if count == 1 else 's'} ({names}); {remedy}")
    return device


def run_device(requested: str | None, trained_on: str) -> torch.device:
    """Where a command that reads a trained run (``kdml eval``, ``embed``, ``index``,
    ``search``, ``plot``, ``analyze``) runs its model: ``requested`` (``--device``) where
    given, else where the run trained (``trained_on``: its ``train.device``) where that device
    is on this machine, else ``auto``: a run trained on a GPU is evaluated on this machine's
    GPU, or its CPU, and one pinned to the CPU stays there."""
    if requested is not None:
        return resolve_device(requested, "--device")
    try:
        return resolve_device(trained_on)
    except KdmlError:  # trained on a GPU this machine does not have
        return resolve_device("auto")
