"""The one training loop. Recipes only assemble parts; the evaluator computes the metrics."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from kdml.config import RunConfig, load_config_file, resolve_config, save_config
from kdml.data import (
    ArrayDataset,
    class_balanced_batches,
    class_disjoint_split,
    load_dataset,
    seen_holdout_split,
)
from kdml.data.domains import fit_source_pca, is_domain_dataset, load_domain_data
from kdml.data.sampling import check_batching
from kdml.data.splits import DataSplits
from kdml.errors import KdmlError
from kdml.evaluation.evaluator import evaluate_method
from kdml.kernels import GaussianMixtureKernel
from kdml.models.backbones import build_backbone, freeze_batchnorm
from kdml.regularizers.domain import DomainMMD
from kdml.training.checkpoint import load_checkpoint, save_checkpoint
from kdml.training.domain_adapted import DomainAdaptedMethod
from kdml.training.method import Method
from kdml.training.recipes import get_recipe
from kdml.training.run_folder import RunFolder, file_logger
from kdml.viz import plot_training


def prepare_data(config: RunConfig) -> DataSplits:
    """Split the configured dataset (or domain pair) as ``config.data`` asks."""
    data = config.data
    if is_domain_dataset(data.dataset):
        pair = load_domain_data(data.dataset)
        if data.pca_dim:
            pair = fit_source_pca(pair, data.pca_dim)
        train, classes = _remap_labels(pair.source)
        return DataSplits(train, pair.target, classes, target=pair.target, kind="domain")
    if data.pca_dim:
        raise KdmlError("data.pca_dim applies to domain pairs (SOURCE->TARGET) only")
    dataset = load_dataset(data.dataset)
    if data.split == "seen-holdout":
        train_idx, test_idx = seen_holdout_split(dataset.y, data.holdout_fraction, seed=0)
    else:
        train_idx, test_idx = class_disjoint_split(dataset.y, data.train_classes)
    train, classes = _remap_labels(dataset.subset(train_idx, f"{dataset.name}/train"))
    return DataSplits(train, dataset.subset(test_idx, f"{dataset.name}/test"), classes,
                      kind=data.split)


def _remap_labels(dataset: ArrayDataset) -> tuple[ArrayDataset, list[int]]:
    classes, dataset.y = torch.unique(dataset.y, return_inverse=True)
    return dataset, classes.tolist()


def build_method(config: RunConfig, splits: DataSplits) -> Method:
    torch.manual_seed(config.train.seed)
    backbone = build_backbone(config.model.backbone, splits.train.input_shape,
                              splits.train.default_backbone)
    method = get_recipe(config.recipe).build(config, backbone, len(splits.train_classes))
    if config.domain.beta > 0:
        if splits.target is None:
            raise KdmlError("domain.beta > 0 needs a domain pair as data.dataset, "
                            "e.g. mnist5k->digits")
        kernel = GaussianMixtureKernel() if config.domain.kernel == "gaussian" else None
        method = DomainAdaptedMethod(method, config.domain.beta, DomainMMD(kernel))
    return method


Schedule = torch.optim.lr_scheduler.LRScheduler


def build_optimizer(method: Method, config: RunConfig
                    ) -> tuple[torch.optim.Optimizer | None, Schedule | None]:
    """Adam or plain gradient steps over the method's parameter groups, with step decay
    (``lr_step``, ``lr_gamma``; Sec. 5.1 of Chu et al.) and per-epoch decay (``lr_decay``;
    DTML's lambda <- 0.95 lambda). ``(None, None)`` for a method with nothing to train."""
    groups = [group for group in method.param_groups(config.optim) if group["params"]]
    if not groups:
        return None, None
    optim = config.optim
    optimizer = (torch.optim.Adam(groups) if optim.name == "adam"
                 else torch.optim.SGD(groups, lr=optim.lr))

    def factor(epoch: int) -> float:
        steps = epoch // optim.lr_step if optim.lr_step else 0
        return optim.lr_gamma ** steps * optim.lr_decay ** epoch

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class TrainedRun:
    run: RunFolder
    config: RunConfig
    splits: DataSplits
    method: Method
    epoch: int


def load_run(run_dir: Path) -> TrainedRun:
    """Rebuild a run's method from its config and load its last checkpoint (on the CPU)."""
    run = RunFolder.existing(run_dir)
    file_values = load_config_file(run.config)
    recipe = get_recipe(str(file_values.get("recipe")))
    config = resolve_config(recipe.name, recipe.params, file_values=file_values)
    state = load_checkpoint(run.checkpoint)
    splits = prepare_data(config)
    method = build_method(config, splits)
    try:
        method.load_state_dict(state["method"])
    except RuntimeError:
        raise KdmlError(f"checkpoint {run.checkpoint} does not match the run's config") from None
    return TrainedRun(run, config, splits, method, state["epoch"])


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise KdmlError(f"train.device={name} but no CUDA device is available; use cpu or auto")
    return torch.device(name)


def train(config: RunConfig, run_dir: Path, resume: bool = False,
          progress: bool | None = None, echo: Callable[[str], None] = print) -> dict[str, float]:
    """Train ``config`` into ``run_dir`` and return the final test metrics.

    With ``resume=True`` the run continues from ``checkpoints/last.pt``; epochs are seeded from
    (seed, epoch), so a resumed run ends where an uninterrupted one would (same seed, CPU).
    ``progress=None`` shows progress bars only on a terminal.
    """
    device = resolve_device(config.train.device)
    splits = prepare_data(config)
    check_batching(splits.train.y, config.data.samples_per_class, config.data.batch_size)
    method = build_method(config, splits).to(device)
    optimizer, scheduler = build_optimizer(method, config)
    run = RunFolder(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    if not resume:
        save_config(config, run.config)
    log = file_logger(run.log)
    history: list[dict[str, Any]] = []
    start_epoch = 1
    if resume:
        state = load_checkpoint(run.checkpoint)
        method.load_state_dict(state["method"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        history, start_epoch = state["history"], state["epoch"] + 1
        if state.get("finished"):  # stopped early by the tolerance rule: nothing left to do
            start_epoch = config.train.epochs + 1
        echo(f"resuming {run.root} after epoch {state['epoch']} of {config.train.epochs}")
    log.info("start epoch %d of %d, device %s, %d train / %d test samples", start_epoch,
             config.train.epochs, device, len(splits.train), len(splits.test))

    from torch.utils.tensorboard import SummaryWriter  # slow import: only when training

    with SummaryWriter(str(run.tensorboard)) as writer:
        epochs = tqdm(range(start_epoch, config.train.epochs + 1), desc="epochs",
                      initial=start_epoch - 1, total=config.train.epochs, disable=_no_bar(progress))
        for epoch in epochs:
            row: dict[str, Any] = {"epoch": epoch}
            if optimizer is None:  # e.g. PCA: fitted once on the training inputs, no steps
                method.fit(splits.train.x.to(device))
            else:
                row["lr"] = optimizer.param_groups[0]["lr"]
                terms = train_one_epoch(method, optimizer, splits, config, epoch, device,
                                        progress)
                row.update({f"train/{name}": value for name, value in terms.items()})
                scheduler.step()
            converged = _converged(history, row, config.train.tolerance) or optimizer is None
            if (epoch % config.train.eval_every == 0 or epoch == config.train.epochs
                    or converged):
                metrics = evaluate_method(method, splits, config.eval, device)
                row.update({f"test/{name}": value for name, value in metrics.items()})
            history.append(row)
            for key, value in row.items():
                if key != "epoch":
                    writer.add_scalar(key, value, epoch)
            log.info("epoch %d: %s", epoch, _format_row(row))
            epochs.set_postfix({k[6:]: f"{v:.3f}" for k, v in row.items()
                                if k.startswith("test/recall@1") or k == "train/loss"})
            save_checkpoint({"epoch": epoch, "method": method.state_dict(),
                             "optimizer": optimizer.state_dict() if optimizer else None,
                             "scheduler": scheduler.state_dict() if scheduler else None,
                             "history": history, "config": config.to_dict(),
                             "finished": converged or epoch == config.train.epochs},
                            run.checkpoint)
            run.write_metrics(history, None)
            plot_training(history, run.plots)
            if converged:
                log.info("stopping after epoch %d: converged or nothing to train", epoch)
                break
    final = {key[5:]: value for key, value in history[-1].items() if key.startswith("test/")}
    run.write_metrics(history, final)
    log.info("final test metrics: %s", final)
    return final


def train_one_epoch(method: Method, optimizer: torch.optim.Optimizer, splits: DataSplits,
                    config: RunConfig, epoch: int, device: torch.device,
                    progress: bool | None) -> dict[str, float]:
    """One pass over the training split; returns each loss term's mean over the batches.

    Methods that use a target domain get a random target batch of the same size with each
    source batch (the target labels are never passed on)."""
    _seed_epoch(config.train.seed, epoch)
    method.train()
    if config.model.freeze_bn:
        freeze_batchnorm(method)
    train_set = splits.train
    sums: dict[str, float] = defaultdict(float)
    batches = list(_batches(train_set, config))
    target_batches = (_target_batches(splits.target, [len(b) for b in batches])
                      if method.uses_target else [None] * len(batches))
    for indices, target_indices in tqdm(list(zip(batches, target_batches, strict=True)),
                                        desc=f"epoch {epoch}", leave=False,
                                        disable=_no_bar(progress)):
        inputs, labels = train_set.x[indices].to(device), train_set.y[indices].to(device)
        if target_indices is None:
            output = method(inputs, labels)
        else:
            target_inputs = splits.target.x[target_indices].to(device)
            output = method(inputs, labels, target_inputs=target_inputs)
        if not torch.isfinite(output.loss):
            raise KdmlError(f"the loss became {output.loss.item()} at epoch {epoch}; "
                            "lower the learning rates or the regularizer weight")
        optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        optimizer.step()
        for name, value in output.terms.items():
            sums[name] += value
    return {name: total / len(batches) for name, total in sums.items()}


def _batches(train_set: ArrayDataset, config: RunConfig) -> list[torch.Tensor]:
    batch_size = config.data.batch_size or len(train_set)  # 0 = full batch
    if config.data.samples_per_class:
        return [torch.as_tensor(batch) for batch in class_balanced_batches(
            train_set.y, config.data.samples_per_class, batch_size)]
    order = torch.randperm(len(train_set))
    return [order[start:start + batch_size]
            for start in range(0, len(order) - batch_size + 1, batch_size)]


def _target_batches(target: ArrayDataset | None, sizes: list[int]) -> list[torch.Tensor]:
    if target is None:
        raise KdmlError("this recipe needs a target domain: set data.dataset to a domain pair "
                        "such as mnist5k->digits")
    return [torch.randperm(len(target))[:size] for size in sizes]


def _converged(history: list[dict[str, Any]], row: dict[str, Any], tolerance: float) -> bool:
    """DTML's stopping rule: |J_k - J_(k-1)| < tolerance on the epoch-mean training loss."""
    if tolerance <= 0 or not history or "train/loss" not in row:
        return False
    return abs(row["train/loss"] - history[-1]["train/loss"]) < tolerance


def _seed_epoch(seed: int, epoch: int) -> None:
    """Seed every generator from (seed, epoch) so an epoch is the same whether or not the run
    was interrupted before it."""
    epoch_seed = seed * 100_003 + epoch
    torch.manual_seed(epoch_seed)
    np.random.seed(epoch_seed % 2**32)  # PML's samplers draw from NumPy's global generator


def _no_bar(progress: bool | None) -> bool | None:
    return None if progress is None else not progress


def _format_row(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k}={v}"
                     for k, v in row.items() if k != "epoch")
